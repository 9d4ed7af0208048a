"""Which coordinator nodes are alive: one etcd key per node, on the node's lease.

    {prefix}/nodes/{node_id} = {"host": <advertised host>, "port": <advertised port>,
                                "listeners": {<listener name>: [<host>, <port>], ...}}

``host``/``port`` are the first listener's advertised address; ``listeners`` every listener's:
a node answers Metadata and FindCoordinator with the other nodes' addresses for
the listener the request came in on, as Kafka. A registration without ``listeners`` (a node of
an older version) has its one address for every listener name.

With ``store = "etcd"`` every node registers at start (:mod:`coordinator.cluster.node`) and
feeds :class:`NodeWatcher`'s view to the partition placement (:mod:`coordinator.cluster.placement`)
and to Metadata. It is a :class:`~coordinator.runtime.etcd_watch.PrefixWatcher`, the generic
watch that also follows the partitions' owner keys and the security keys.

* :func:`register` creates the key with the node's :class:`~coordinator.runtime.etcd_store.NodeLease`
  in a transaction comparing ``create_revision == 0``, so two processes given the same node id
  cannot both run: the second gets :class:`NodeIdTaken` naming the holder's address and lease.
  Because the key lives on a lease, its existence means the holder's lease is alive: when the
  holder dies (SIGKILL, a lost machine) the key goes when etcd expires the lease (its TTL), and
  the id can be registered again. Registering again with the SAME lease is accepted (an answer
  lost to a timeout is retried safely).
* :meth:`Registration.close` deletes the key at once (a graceful stop), under a compare on the
  key's create revision so it never deletes a successor's registration.
* :func:`live_nodes` reads the current view; :class:`NodeWatcher` keeps one up to date with an
  etcd watch from the revision of its read, and reads the range again whenever the watch is
  cancelled (etcd compacted past it) or fails. Watch, not polling, because a change shows in
  milliseconds instead of a poll interval, and with the relist it loses nothing (docs/etcd.md,
  "Node registry", has the measurement).

The view is advisory: ownership of partitions is decided by the owner keys in etcd
(:mod:`coordinator.runtime.etcd_store`), so a stale view delays a handover and never lets two
nodes own one partition.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService, prefix_range_end

from coordinator.runtime.etcd_store import EtcdStoreError, NodeLease
from coordinator.runtime.etcd_watch import PrefixWatcher, key_suffix

log = logging.getLogger("coordinator.registry")

NODE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class NodeIdTaken(EtcdStoreError):
    """Another live lease holds this node id: two processes were given the same ``node.id``."""

    def __init__(self, node_id: str, holder: NodeInfo | None, lease: int) -> None:
        where = f"{holder.host}:{holder.port}" if holder else "an unreadable registration"
        super().__init__(
            f"node id {node_id!r} is already registered by a live node ({where}, etcd lease "
            f"{lease:x}); give this node another node.id, or wait for that node's lease to end "
            "if it is gone")
        self.node_id = node_id
        self.holder = holder
        self.lease = lease


@dataclass(frozen=True)
class NodeInfo:
    host: str
    port: int
    listeners: tuple[tuple[str, str, int], ...] = ()
    """(listener name, advertised host, port) of every listener; () from an older node."""

    def encode(self) -> bytes:
        d: dict[str, Any] = {"host": self.host, "port": self.port}
        if self.listeners:
            d["listeners"] = {name: [host, port] for name, host, port in self.listeners}
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> NodeInfo | None:
        try:
            d = json.loads(value)
            listeners = tuple(sorted((str(n), str(a[0]), int(a[1]))
                                     for n, a in (d.get("listeners") or {}).items()))
            return cls(str(d["host"]), int(d["port"]), listeners)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None

    def address(self, listener: str | None) -> tuple[str, int] | None:
        """The node's advertised address for ``listener`` (None: it has no such listener)."""
        if listener is None or not self.listeners:
            return self.host, self.port
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return None


def nodes_prefix(prefix: str) -> bytes:
    return f"{prefix.rstrip('/')}/nodes/".encode()


def node_key(prefix: str, node_id: str) -> bytes:
    if not NODE_ID.fullmatch(node_id):
        raise ValueError(f"node id {node_id!r}: 1-64 characters of A-Z a-z 0-9 . _ -")
    return nodes_prefix(prefix) + node_id.encode()


@dataclass
class Registration:
    """This node's key in the registry; :meth:`close` removes it at once."""

    client: Etcd3Client
    node_id: str
    key: bytes
    info: NodeInfo
    lease_id: int
    create_revision: int
    timeout_s: float

    async def registered(self) -> bool:
        """Whether our key is still there (False once our lease ended)."""
        resp = await self.client.kv.get(self.key, timeout=self.timeout_s)
        return bool(resp.kvs) and resp.kvs[0].create_revision == self.create_revision

    async def close(self) -> bool:
        """Delete our key if it is still ours; True if it was."""
        resp = await self.client.kv.txn(
            [KVService.txn_compare_create_revision(self.key, self.create_revision)],
            [KVService.txn_op_delete(self.key)], [],
            timeout=self.timeout_s, max_attempts=1)
        return bool(resp.succeeded)


async def register(client: Etcd3Client, prefix: str, node_id: str, host: str, port: int,
                   lease: NodeLease | int, *, timeout_s: float = 5.0, attempts: int = 3,
                   listeners: dict[str, tuple[str, int]] | None = None) -> Registration:
    """Register ``node_id`` at ``host:port`` on ``lease``; :class:`NodeIdTaken` if another live
    lease holds the id. A timeout is retried (up to ``attempts``): a first attempt that was
    applied makes the retry find our own lease, which is accepted."""
    key = node_key(prefix, node_id)
    info = NodeInfo(host, port, tuple(sorted((n, h, p) for n, (h, p) in (listeners or {}).items())))
    lease_id = lease.id if isinstance(lease, NodeLease) else lease
    for attempt in range(attempts):
        try:
            resp = await client.kv.txn(
                [KVService.txn_compare_create_revision(key, 0)],
                [KVService.txn_op_put(key, info.encode(), lease=lease_id)],
                [KVService.txn_op_get(key)],
                timeout=timeout_s, max_attempts=1)
            break
        except Exception as exc:  # noqa: BLE001 (grpc / etcd3aio errors: unknown outcome)
            if attempt == attempts - 1:
                raise EtcdStoreError(f"registering node {node_id!r} failed: {exc!r}") from exc
            await asyncio.sleep(0.1 * 2 ** attempt)
    if resp.succeeded:
        revision = resp.header.revision
    else:
        kvs = resp.responses[0].response_range.kvs
        if not kvs:  # cannot happen within one transaction
            raise EtcdStoreError(f"node {node_id!r}: registration key vanished during register")
        kv = kvs[0]
        if kv.lease != lease_id:
            raise NodeIdTaken(node_id, NodeInfo.decode(kv.value), kv.lease)
        if NodeInfo.decode(kv.value) != info:  # ours, from an earlier call: same lease, new address
            await client.kv.put(key, info.encode(), lease=lease_id, timeout=timeout_s)
        revision = kv.create_revision
    log.info("registered node %s at %s:%d (lease %x)", node_id, host, port, lease_id)
    return Registration(client, node_id, key, info, lease_id, revision, timeout_s)


async def live_nodes(client: Etcd3Client, prefix: str, *, timeout_s: float = 5.0
                     ) -> tuple[dict[str, NodeInfo], int]:
    """The registered nodes (an unreadable value is skipped) and the revision of the read."""
    start = nodes_prefix(prefix)
    resp = await client.kv.get(start, prefix_range_end(start), timeout=timeout_s)
    nodes = {}
    for kv in resp.kvs:
        info = NodeInfo.decode(kv.value)
        if info is not None:
            nodes[key_suffix(kv.key, len(start))] = info
    return nodes, resp.header.revision


class NodeWatcher(PrefixWatcher):
    """A live view of the registered nodes: ``nodes`` (node id -> address); see
    :class:`PrefixWatcher`."""

    def __init__(self, client: Etcd3Client, prefix: str, *, timeout_s: float = 5.0,
                 retry_s: float = 0.25) -> None:
        super().__init__(client, nodes_prefix(prefix), NodeInfo.decode, timeout_s=timeout_s,
                         retry_s=retry_s, name="etcd-node-watch")
        self.prefix = prefix

    @property
    def nodes(self) -> dict[str, NodeInfo]:
        return self.view
