"""One coordinator node of several sharing the partitions through etcd (``store = "etcd"``).

    node = ClusterNode(server, config)
    await node.start()        # lease, registration, watches, the placement loop
    ...
    await node.stop()         # graceful: leave, hand every partition over, revoke the lease

* **Liveness** is the node's etcd lease (:class:`~coordinator.runtime.etcd_store.NodeLease`,
  ``etcd.lease.ttl.ms``), renewed every third of its TTL. The node registers
  ``{prefix}/nodes/{node.id}`` on it (:mod:`coordinator.cluster.registry`; a live node with the
  same id makes the start fail).
* **Placement.** Every node watches the registered nodes and the owner keys
  (``{prefix}/owners/{N}``) and computes the same balanced, sticky target
  (:func:`coordinator.cluster.placement.place`). A partition placed here and owned by nobody is
  acquired (the owner key created under ``create_revision == 0``) and loaded; a partition owned
  here and placed elsewhere is handed over: its shard answers what is queued, commits, answers
  its parked heartbeats and deletes the owner key, and the target node, which sees the delete
  through its watch, acquires and loads it at once. The placement is advisory: owning is the
  owner key, so two nodes with different views delay a move and never share a partition.
* **Lease trouble.** A shard serves only while the lease is certainly valid for more than
  ``etcd.lease.margin.ms`` (:meth:`ClusterNode.serving`, given to each shard). A lease whose
  renewals fail (an etcd leader election, etcd out of reach) is *in doubt*: nothing is answered
  or taken on, but the partitions stay loaded while the keep-alive keeps trying the same lease. A renewal that
  succeeds proves the lease and every owner key on it alive (nobody else can have written a
  partition: a write needs its owner key), so the same partitions serve again without a reload;
  a write whose outcome was unknown meanwhile reloads its partition as always. When etcd says
  the lease is gone (a keep-alive answered TTL 0) every partition is dropped at once -- nothing
  is written or answered from it -- and the node grants a new lease, registers again and takes
  its share anew.
* **etcd version.** At start the node asks the members it reaches for their version and warns
  when one may revoke live leases after a leader stall (etcd before 3.4.31 / 3.5.13).
* **Partition count.** ``{prefix}/config`` holds the cluster's partition count, written by the
  first node; a node started with another ``--partitions`` refuses to start (groups would move).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from coordinator import logs
from coordinator.cluster import registry
from coordinator.cluster.placement import node_order, place
from coordinator.group.config import ConfigError
from coordinator.runtime import etcd_store
from coordinator.runtime.shard import ACTIVE, FAILED, LOADING, UNOWNED, Shard, UnownedShard
from coordinator.store.etcd import EtcdStore

if TYPE_CHECKING:
    from coordinator.config import ServerConfig
    from coordinator.server.app import CoordinatorServer

log = logs.get("coordinator.cluster")

RECONCILE_TICK_S = 1.0
"""The placement is recomputed on every watch event and at least this often."""


class ClusterNode:
    def __init__(self, server: CoordinatorServer, config: ServerConfig) -> None:
        self.server = server
        self.node_id = str(config["node.id"])
        self.prefix = config["etcd.prefix"].rstrip("/")
        self.endpoints = config.etcd_endpoints
        self.ttl_s = config["etcd.lease.ttl.ms"] // 1000
        self.margin_s = config["etcd.lease.margin.ms"] / 1000
        self.timeout_s = config["etcd.request.timeout.ms"] / 1000
        self.max_txn_ops = config["etcd.max.txn.ops"]
        self.max_request_bytes = config["etcd.max.request.bytes"]
        self.partitions = config["partitions"]
        self.client: Any = None
        self.lease: etcd_store.NodeLease | None = None
        self.registration: registry.Registration | None = None
        self.nodes: registry.NodeWatcher | None = None
        self.owners: registry.PrefixWatcher | None = None
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._busy: set[int] = set()
        """Partitions being acquired/loaded or handed over right now."""
        self._loop: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- what the server asks ---------------------------------------------------------------------
    def lease_remaining(self) -> float:
        lease = self.lease
        return lease.remaining() if lease is not None else 0.0

    def serving(self) -> bool:
        """Whether this node's shards may answer now: its lease is certainly valid for more
        than the margin (a shard below it answers nothing from its state)."""
        return self.lease_remaining() > self.margin_s

    def live_nodes(self, listener: str | None = None) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every registered node, by id (Metadata's brokers), at its
        address for ``listener`` (a node without that listener is left out, as Kafka)."""
        view = self.nodes.view if self.nodes is not None else {}
        out = []
        for n, info in view.items():
            address = info.address(listener)
            if n.isdigit() and address is not None:
                out.append((int(n), *address))
        return sorted(out)

    def locate(self, partition: int, listener: str | None = None) -> tuple[int, str, int] | None:
        """The node that owns ``partition`` now (FindCoordinator), or None if nobody does (or
        its address for ``listener`` is not known)."""
        if self.owners is None or self.nodes is None:
            return None
        if self.lease_remaining() <= self.margin_s:
            # Our lease is in doubt: we may be cut off from etcd, and then our view of every
            # owner is stale too. COORDINATOR_NOT_AVAILABLE sends the client to another node.
            return None
        owner = self.owners.view.get(str(partition))
        if owner is None:
            return None
        info = self.nodes.view.get(owner)
        if info is None or not owner.isdigit():
            return None
        address = info.address(listener)
        if address is None:
            return None
        return int(owner), *address

    def served_elsewhere(self, partition: int) -> bool:
        """Whether another live node owns ``partition`` now (so that node lists its groups)."""
        owner = self.locate(partition)
        return owner is not None and str(owner[0]) != self.node_id

    def controller_id(self) -> int:
        nodes = self.live_nodes()
        return nodes[0][0] if nodes else int(self.node_id)

    # -- start / stop -----------------------------------------------------------------------------
    async def start(self) -> None:
        from coordinator.server.app import StartupError
        where = ",".join(self.endpoints)
        try:
            self.client = await etcd_store.connect(self.endpoints)
            await self._check_partition_count()
            await self._join()
        except (ConfigError, registry.NodeIdTaken):
            raise
        except Exception as exc:  # noqa: BLE001 (unreachable, refused, timed out...)
            raise StartupError(f"cannot use etcd at {where}: "
                               f"{etcd_store.describe_error(exc)}") from None
        self.nodes = registry.NodeWatcher(self.client, self.prefix, timeout_s=self.timeout_s)
        self.nodes.on_change = lambda _view: self._wake.set()
        await self.nodes.start()
        self.owners = registry.PrefixWatcher(self.client, etcd_store.owners_prefix(self.prefix),
                                             _decode_owner, timeout_s=self.timeout_s,
                                             name="etcd-owner-watch")
        self.owners.on_change = lambda _view: self._wake.set()
        await self.owners.start()
        self.server.metrics.etcd_lease_remaining.set_function(
            lambda: max(0.0, self.lease_remaining()))
        self._warn_if_failover_outlasts_sessions()
        await self._warn_if_etcd_revokes_live_leases()
        self._loop = asyncio.create_task(self._reconcile_loop(), name="etcd-placement")
        log.info("node joined", node_id=self.node_id, prefix=self.prefix,
                 endpoints=",".join(self.endpoints), lease_ttl_s=self.ttl_s,
                 nodes=[n for n, _, _ in self.live_nodes()])

    def _warn_if_failover_outlasts_sessions(self) -> None:
        """A worker's lease runs from the send of its last answered heartbeat, and its long
        polls last up to min(heartbeat interval, session / 3): when a node dies, a worker may
        have only session - 2 x that left. Taking over a dead node's partitions takes up to the
        lease TTL, plus etcd's expiry check (up to 0.5 s), the load and the worker's retry
        (about 1 s). If that does not fit, a worker can stop its work on a failover."""
        g = self.server.group_config
        poll_ms = min(g.heartbeat_interval_ms, g.session_timeout_ms // 3)
        budget_ms = g.session_timeout_ms - 2 * poll_ms
        failover_ms = self.ttl_s * 1000 + 1500
        if failover_ms > budget_ms:
            log.warning("a failover may outlast the workers' sessions: lower etcd.lease.ttl.ms "
                        "or group.connect.heartbeat.interval.ms, or raise the session timeout",
                        lease_ttl_ms=self.ttl_s * 1000, failover_up_to_ms=failover_ms,
                        session_ms=g.session_timeout_ms, heartbeat_interval_ms=g.heartbeat_interval_ms,
                        worker_budget_ms=budget_ms)

    async def _warn_if_etcd_revokes_live_leases(self) -> None:
        versions = await etcd_store.server_versions(self.client, len(self.endpoints),
                                                    timeout_s=self.timeout_s)
        for version in sorted(versions):
            why = etcd_store.unsafe_lease_version(version)
            if why is not None:
                log.warning("this etcd version may revoke live node leases", etcd_version=version,
                            problem=why, endpoints=",".join(self.endpoints))

    async def _check_partition_count(self) -> None:
        key = f"{self.prefix}/config".encode()
        value = json.dumps({"partitions": self.partitions}).encode()
        from etcd3aio.kv import KVService
        resp = await self.client.kv.txn(
            [KVService.txn_compare_create_revision(key, 0)], [KVService.txn_op_put(key, value)],
            [KVService.txn_op_get(key)], timeout=self.timeout_s, max_attempts=1)
        if resp.succeeded:
            return
        kvs = resp.responses[0].response_range.kvs
        try:
            have = int(json.loads(kvs[0].value)["partitions"])
        except (IndexError, ValueError, KeyError, TypeError):
            raise ConfigError(f"etcd key {key.decode()} is not a partition count; delete it "
                              "only if no coordinator data is under the prefix") from None
        if have != self.partitions:
            raise ConfigError(
                f"the coordinator cluster under etcd prefix {self.prefix!r} has {have} "
                f"partitions; --partitions {self.partitions} would move groups to other "
                f"partitions. Use {have}.")

    async def _join(self) -> None:
        """Grant a lease and register this node on it."""
        self.lease = await etcd_store.NodeLease.grant(self.client, self.ttl_s,
                                                      request_timeout_s=self.timeout_s)
        host, port = self.server.advertised
        try:
            self.registration = await registry.register(
                self.client, self.prefix, self.node_id, host, port, self.lease,
                timeout_s=self.timeout_s, listeners=self.server.advertised_listeners())
        except BaseException:
            await self.lease.close()
            self.lease = None
            raise
        self._lease_task = asyncio.create_task(self._watch_lease(self.lease), name="etcd-lease-lost")

    async def stop(self) -> None:
        """Graceful: leave the registry (the others stop placing partitions here), hand every
        partition over (commit, answer, release), stop the watches, revoke the lease."""
        self._stopping = True
        for task in (self._loop, self._lease_task):
            if task is not None:
                task.cancel()
        if self.registration is not None:
            with contextlib.suppress(Exception):
                await self.registration.close()
        # Wait for acquisitions in flight so that nothing is loaded after the handover.
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shards = [s for s in self.server.shards if isinstance(s, Shard)]
        started = time.monotonic()
        await asyncio.gather(*(self._handover(s) for s in shards), return_exceptions=True)
        if shards:
            log.info("partitions handed over", node_id=self.node_id,
                     partitions=[s.partition for s in shards],
                     seconds=round(time.monotonic() - started, 3))
        for watcher in (self.nodes, self.owners):
            if watcher is not None:
                await watcher.close()
        if self.lease is not None:
            await self.lease.close()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()

    # -- the lease --------------------------------------------------------------------------------
    async def _watch_lease(self, lease: etcd_store.NodeLease) -> None:
        await lease.lost.wait()
        if self._stopping:
            return
        log.error("node lease lost: dropping every partition and joining again",
                  node_id=self.node_id, lease=f"{lease.id:x}")
        self.registration = None
        for shard in list(self.server.shards):
            if isinstance(shard, Shard):
                shard.lose("the node's etcd lease was lost")
        with contextlib.suppress(Exception):
            # Revoke, in case etcd still holds it (only our renewals failed): frees our old
            # registration and owner keys now instead of at the TTL.
            await lease.close(even_if_lost=True)
        delay = 0.1
        while not self._stopping:
            try:
                await self._join()
                self._wake.set()
                log.info("node joined again", node_id=self.node_id, lease=f"{self.lease.id:x}"
                         if self.lease else None)
                return
            except registry.NodeIdTaken as exc:  # our old registration until its lease ends
                log.warning("re-registering: the old registration is still there",
                            node_id=self.node_id, error=str(exc), retry_in_s=delay)
            except Exception as exc:  # noqa: BLE001 (etcd unreachable: keep trying)
                log.warning("re-joining failed", node_id=self.node_id, error=repr(exc),
                            retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- placement --------------------------------------------------------------------------------
    async def _reconcile_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                self._reconcile()
            except Exception as exc:  # noqa: BLE001 (never let the loop die)
                log.error("placement failed", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RECONCILE_TICK_S)

    def target(self) -> dict[int, str]:
        assert self.nodes is not None and self.owners is not None
        live = set(self.nodes.view)
        if self.registration is not None:
            live.add(self.node_id)
        else:
            live.discard(self.node_id)
        owners = {int(p): owner for p, owner in self.owners.view.items() if p.isdigit()}
        return place(sorted(live, key=node_order), self.partitions, owners)

    def _reconcile(self) -> None:
        if self._stopping or self.lease is None or self.registration is None:
            return
        if self.lease_remaining() <= self.margin_s:
            return  # not serving: take nothing new
        assert self.owners is not None
        target = self.target()
        shards = self.server.shards
        for p in range(self.partitions):
            if p in self._busy:
                continue
            shard = shards[p]
            mine = isinstance(shard, Shard) and shard.state in (LOADING, ACTIVE, FAILED)
            wanted = target.get(p) == self.node_id
            owner = self.owners.view.get(str(p))
            if wanted and not mine and owner in (None, self.node_id):
                self._spawn(p, self._acquire(p))
            elif mine and not wanted and isinstance(shard, Shard):
                self._spawn(p, self._handover(shard))
            elif not mine and not wanted and owner == self.node_id:
                # Our owner key with nothing loaded behind it: a release that failed (timed
                # out) during a handover, or an acquire that raced a lost lease. Nobody else
                # can take the partition while the key lives: delete it (if still ours).
                self._spawn(p, self._release_stale(p))
        self.server.partition_states()

    def _spawn(self, partition: int, coro: Any) -> None:
        self._busy.add(partition)
        task = asyncio.create_task(coro, name=f"partition-move-{partition}")
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            self._busy.discard(partition)
            self._wake.set()
        task.add_done_callback(done)

    async def _acquire(self, partition: int) -> None:
        lease = self.lease
        if lease is None:
            return
        try:
            store = await EtcdStore.acquire(
                self.client, self.prefix, partition, self.node_id, lease,
                max_txn_ops=self.max_txn_ops, max_request_bytes=self.max_request_bytes,
                commit_timeout_s=self.timeout_s)
        except etcd_store.NotOwner:
            return  # another node still holds it: its delete wakes us
        except Exception as exc:  # noqa: BLE001 (unknown outcome: the next round retries;
            # a key created with our lease is accepted as ours then)
            log.warning("acquiring a partition failed", partition=partition, error=repr(exc))
            return
        if lease is not self.lease or lease.lost.is_set():  # lost while acquiring
            await store.close(graceful=False)
            return
        shard = Shard(partition, store, self.server.group_config, self.server.metrics,
                      serving=self.serving, on_lost=self._on_lost)
        shard.heartbeat_error = self.server.heartbeat_error
        self.server.shards[partition] = shard
        self.server.partition_states()
        await shard.load()
        if lease is not self.lease or lease.lost.is_set():
            # The lease was lost while loading: _watch_lease dropped every shard before this
            # one was in place; drop it too (its owner key went with the revoked lease).
            shard.lose("the node's etcd lease was lost while loading")
        if shard.state == ACTIVE:
            self.server.metrics.partition_moves.labels("acquired").inc()
        elif shard.state == UNOWNED:
            self._unload(shard)
        self.server.partition_states()

    async def _release_stale(self, partition: int) -> None:
        lease = self.lease
        if lease is None:
            return
        try:
            released = await etcd_store.release_owner_key(
                self.client, self.prefix, partition, lease.id, timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 (the next round tries again)
            log.warning("releasing a partition left owned failed; retrying",
                        partition=partition, error=repr(exc))
            return
        if released:
            log.info("released a partition left owned after a failed handover",
                     partition=partition, node_id=self.node_id)

    async def _handover(self, shard: Shard) -> None:
        partition = shard.partition
        started = time.monotonic()
        await shard.close()
        self._unload(shard)
        self.server.metrics.partition_moves.labels("released").inc()
        self.server.partition_states()
        log.info("partition handed over", partition=partition, node_id=self.node_id,
                 seconds=round(time.monotonic() - started, 3))

    def _unload(self, shard: Shard) -> None:
        """The partition's slot back to unowned, its gauge series gone (unless a newer shard
        of that partition is in place already)."""
        if self.server.shards[shard.partition] is shard:
            self.server.shards[shard.partition] = UnownedShard(shard.partition,
                                                               self.server.group_config)
            self.server.metrics.drop_partition(shard.partition)

    def _on_lost(self, shard: Shard, why: str) -> None:
        self._unload(shard)
        self.server.metrics.partition_moves.labels("lost").inc()
        self.server.partition_states()
        self._wake.set()


def _decode_owner(value: bytes) -> str | None:
    try:
        return str(json.loads(value)["node"])
    except (ValueError, KeyError, TypeError):
        return None

