"""A coordinator partition stored in etcd, owned by one node at a time and fenced.

With ``store = "etcd"`` the shard runs on this store (through
:class:`coordinator.store.etcd.EtcdStore`, the shard's store interface) and the node
(:mod:`coordinator.cluster.node`) acquires and releases partitions with it: ownership by lease,
fenced write-before-respond commits, bounded batches, and a load that reads only the live state.
docs/etcd.md has the design and the measurements behind it.

Keys (``prefix`` is ``etcd.prefix``, e.g. ``/connect-coordinator``)::

    {prefix}/owners/{N}                the owner: JSON {"node": ..., "lease": ...}, put with the
                                       owning node's lease (gone when the lease expires); apart
                                       from the records so that the nodes can watch every
                                       owner without seeing every write
    {prefix}/partitions/{N}/r/<key>    one key per live record key: <key> is the record's key
                                       bytes (coordinator.runtime.serde), the etcd value is
                                       uvarint(position in its transaction) + the record's value
                                       bytes; a tombstone DELETES the key

"Records as keys": the partition's etcd keys ARE its live state (the latest value of every
record key), so what etcd holds follows the live state, not the history, and a load reads
exactly the live records. Chosen by measurement over "batches + snapshots"
(``python -m bench etcd-layout``; numbers and reasons in docs/etcd.md).

Replay order. A load returns the live records sorted by (mod revision, position): the order of
their last writes, which is exactly what a fully compacted file log replays (compaction keeps
the latest record of each key in offset order) with its tombstones dropped. Records of one
transaction share a mod revision, hence the position prefix.

Ownership and fencing. :meth:`EtcdPartitionStore.acquire` creates the owner key with the node's
lease in a transaction that compares ``create_revision == 0`` (nobody owns it), as etcd's own
election recipe does. Every write transaction then compares the owner key's create revision with
the one we created: if the lease expired (the key is gone) or another node took it over (a new
create revision), the transaction's compare fails and NOTHING of it is applied; the store raises
:class:`Deposed` and refuses everything afterwards; the caller unloads the partition.
Every write also compares the mod revision of ``{prefix}/partitions/{N}/fence``, which the
acquire and every :meth:`EtcdPartitionStore.reload` re-write: a write whose outcome was unknown
(a timeout) and that etcd applies only after the reload read the partition fails there instead
of changing etcd behind the state just loaded.

Write-before-respond. :meth:`append` only checks and buffers a batch (like
``PartitionLog.append`` writing to the page cache); ``await commit()`` sends the buffered batches
to etcd and returns once etcd has committed them (like ``PartitionLog.sync``). The shard answers
after that, as it does after the fsync.

Atomicity and etcd's limits. The records of one append are one transaction's (all or nothing).
Several appends of a group commit share transactions while they fit; a batch that cannot fit in
ONE transaction by itself -- more than ``max_txn_ops`` distinct keys (etcd ``--max-txn-ops``,
default 128) or a request larger than ``max_request_bytes`` (``--max-request-bytes``, default
1.5 MiB) -- is refused by append() with :class:`BatchExceedsEtcdLimits` before anything is sent
(non-retriable: etcd cannot split one atomic write across transactions). The limits must match
the etcd servers' flags (a lower setting here is safe; a higher one makes etcd refuse).

Outcomes of commit():

* success: every buffered append is durable in etcd;
* :class:`Deposed`: the owner compare failed; this transaction wrote nothing, but earlier
  transactions of the same commit may have been applied: unload (the new owner loads them);
* :class:`CommitRefused`: etcd refused the FIRST transaction definitely (e.g. ``NOSPACE`` past
  the quota, a request etcd found too large): nothing was written; the buffered appends are
  dropped and the caller rolls back their state (as after a failed fsync);
* :class:`ReloadRequired` (:class:`OutcomeUnknown` for a timeout or a lost connection, whose
  transaction may or may not have been applied; or a definite refusal after an earlier
  transaction of the same commit was applied): the state in memory cannot be trusted; reload
  the partition (:meth:`reload`, then replay). Never guessed, never retried blindly.

Writes are sent with the client's retries off (``max_attempts=1``): etcd3aio retries unary calls,
Txn included, on UNAVAILABLE/DEADLINE_EXCEEDED by default, and a retried write whose first
attempt was applied would be applied twice. Reads (load) keep the client's retries.

Load. :meth:`load` reads ``{prefix}/partitions/{N}/r/`` in pages of at most ``page_keys`` keys
(gRPC's default 4 MiB receive limit, which etcd3aio does not raise; a page that still exceeds it
is halved and read again). Only the owner writes these keys, so pages read at the latest revision
while we own the partition form a consistent state; no revision is pinned, so etcd's compaction
cannot fail a long load.

etcd's history. Every overwrite leaves an old revision in etcd until etcd compacts it: the
deployment runs etcd with ``--auto-compaction-mode=revision --auto-compaction-retention=N`` (or
``periodic``), and defragments now and then to return the space to the OS (docs/etcd.md).
:meth:`EtcdPartitionStore.compact_history` lets an owner compact up to the current revision
(tests, benchmarks, or a deployment that cannot set the flags).

Mapping to ``PartitionLog`` (coordinator/store/file.py and coordinator/store/etcd.py put both
behind the shard's one store interface, coordinator/store/base.py):

===================================  =========================================================
PartitionLog / Shard                 EtcdPartitionStore
===================================  =========================================================
``PartitionLog.open(dir, sink=...)`` ``await EtcdPartitionStore.acquire(...)`` then
                                     ``await store.load(sink)``: sink gets the live records
``log.append(records, now)``         ``store.append(records, now)`` (buffers; raises
                                     :class:`BatchExceedsEtcdLimits`, a ``BatchTooLarge``)
``await to_thread(log.sync)``        ``await store.commit()`` (see outcomes above)
failed sync -> roll back pending     :class:`CommitRefused` -> roll back pending
``log.failed`` -> ``_reload``        :class:`ReloadRequired` -> ``await store.reload(sink)``
(no equivalent)                      :class:`Deposed` -> unload, NOT_COORDINATOR
``log.roll`` / ``log.compact``       nothing (etcd keeps only the live keys; see history)
``log.close()`` after ``sync()``     ``await store.commit()``, ``await store.release()``
``log.durable_offset``               ``store.committed_revision``
``log.size_bytes``                   ``store.live_bytes`` (keys + values of the live records)
===================================  =========================================================

The shard's message for a refused batch reads its ``size``/``limit`` as bytes; for a batch over
``max_txn_ops`` they are operation counts, so the wiring must show ``str(exc)`` instead.

:class:`NodeLease` is the node's liveness: one lease, kept alive, that every owner key it
creates is attached to. It knows how long it is certainly still valid (:meth:`NodeLease.remaining`:
the TTL etcd granted at the last renewal counted from when that renewal was SENT), so the serving
layer can stop answering for its partitions -- the steady-heartbeat fast path included -- before
etcd can expire it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from etcd3aio import Etcd3Client, EtcdConnectionError, EtcdTransientError
from etcd3aio._protobuf import Compare, TxnRequest
from etcd3aio.kv import KVService, prefix_range_end

from coordinator import logs
from coordinator.runtime.log import BatchTooLarge

log = logging.getLogger("coordinator.etcd_store")
events = logs.get("coordinator.etcd_lease")
"""The lease's doubt and its end, as structured log lines (alerts match on their event)."""

Records = Sequence[tuple[bytes, bytes | None]]
RecordSink = Callable[[Records], None]

DEFAULT_MAX_TXN_OPS = 128
"""etcd's ``--max-txn-ops`` default: operations per transaction (compares are counted apart)."""
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024
"""etcd's ``--max-request-bytes`` default (1.5 MiB)."""
REQUEST_OVERHEAD_BYTES = 512
"""Kept free below ``max_request_bytes`` for what etcd adds to our TxnRequest before checking it
(the raft request header: id, user name, auth revision). Measured against etcd 3.5.1: the
largest accepted transaction was 18 bytes under the limit."""
DEFAULT_PAGE_KEYS = 2000
DEFAULT_COMMIT_TIMEOUT_S = 5.0
GRPC_RECEIVE_LIMIT = 4 * 1024 * 1024

# Codes with which etcd refuses a request without applying it (a definite "no").
_DEFINITE_REFUSALS = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,   # too many ops, request too large, duplicate key, ...
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # NOSPACE (quota), too many requests
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OUT_OF_RANGE,
})


# -- errors -----------------------------------------------------------------------------------


class EtcdStoreError(Exception):
    """Base class of this module's errors."""


class NotOwner(EtcdStoreError):
    """acquire(): another live node owns the partition."""

    def __init__(self, partition: int, holder: dict[str, Any]) -> None:
        super().__init__(f"partition {partition} is owned by node {holder.get('node')!r} "
                         f"(lease {holder.get('lease')})")
        self.partition = partition
        self.holder = holder


class Deposed(EtcdStoreError):
    """The owner compare failed: this node no longer owns the partition (its lease expired or
    another node took it over). The failed transaction wrote nothing. Unload the partition."""


class CommitRefused(EtcdStoreError):
    """etcd definitely refused the commit's first transaction: nothing of the commit was
    written; the buffered appends are dropped. Roll back their state (retriable later)."""


class ReloadRequired(EtcdStoreError):
    """What etcd holds for the partition no longer matches what the caller built in memory, or
    cannot be known: reload the partition (:meth:`EtcdPartitionStore.reload`) before serving."""


class OutcomeUnknown(ReloadRequired):
    """A commit transaction timed out or lost its connection: it may or may not have been
    applied. Never guessed: reload the partition."""


class BatchExceedsEtcdLimits(BatchTooLarge):
    """One append that can never be written: it needs more operations or request bytes than one
    etcd transaction allows (etcd cannot make several transactions atomic). Non-retriable;
    nothing was sent. ``limit_name`` is the etcd server flag that would have to be raised."""

    def __init__(self, partition: int, size: int, limit: int, limit_name: str, unit: str) -> None:
        ValueError.__init__(
            self,
            f"partition {partition}: a batch of {size:,} {unit} cannot fit in one etcd "
            f"transaction (limit {limit:,} {unit}, the etcd server's --{limit_name}); the "
            f"records of one write are atomic and etcd cannot split them across transactions: "
            f"it can never be written unless etcd runs with a larger --{limit_name} (and "
            f"etcd.{limit_name.replace('-', '.')} here matches it)")
        self.size = size
        self.limit = limit
        self.limit_name = limit_name
        self.unit = unit


# -- keys and values --------------------------------------------------------------------------


def partition_prefix(prefix: str, partition: int) -> bytes:
    return f"{prefix.rstrip('/')}/partitions/{partition}/".encode()


def owners_prefix(prefix: str) -> bytes:
    return f"{prefix.rstrip('/')}/owners/".encode()


def owner_key(prefix: str, partition: int) -> bytes:
    return owners_prefix(prefix) + str(partition).encode()


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_uvarint(data: bytes) -> tuple[int, int]:
    n = shift = pos = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("malformed position prefix in an etcd record value")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def _uvarint_len(n: int) -> int:
    length = 1
    while n >= 0x80:
        n >>= 7
        length += 1
    return length


def _field_len(n: int) -> int:
    """Bytes of a length-delimited protobuf field of ``n`` bytes (field number < 16)."""
    return 1 + _uvarint_len(n) + n


@dataclass
class _Txn:
    """The (deduplicated) writes of one or more appends that go in one transaction."""

    writes: dict[bytes, bytes | None] = field(default_factory=dict)  # record key -> last value
    op_bytes: dict[bytes, int] = field(default_factory=dict)  # record key -> its op's bytes
    total: int = 0  # sum of op_bytes
    appends: int = 0


# -- the node's lease -------------------------------------------------------------------------


def lease_clock() -> float:
    """Seconds on a clock that keeps counting while the host is suspended (CLOCK_BOOTTIME on
    Linux; time.monotonic stops during a suspend, so a node woken from one would believe its
    lease still valid). Falls back to time.monotonic elsewhere."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


class NodeLease:
    """The node's etcd lease, kept alive in the background.

    ``await NodeLease.grant(client, ttl_s)``; ``remaining()`` is how long the lease is certainly
    still valid (<= 0: in doubt); ``lost`` is set only when etcd says the lease is gone (a
    keep-alive answered TTL 0: expired or revoked); ``await close()`` stops the keep-alive and
    revokes it (deleting every owner key on it).

    A lease whose renewals fail past its TTL is *in doubt*, not lost: the keep-alive goes on
    trying the same lease. An etcd leader election often outlasts a short TTL, and the new
    leader extends every lease by its TTL, so the lease usually lives on; a renewal that
    succeeds proves it (and every key on it) alive again. Whoever serves from the lease must
    stop while ``remaining()`` is at or below its margin, and may serve again once a renewal
    lifts it.
    """

    GONE_CHECK_S = 0.5
    """In doubt: how often LeaseTimeToLive is asked whether etcd still has the lease."""

    def __init__(self, client: Etcd3Client, lease_id: int, ttl_s: int, granted_at: float,
                 granted_ttl: int, *, request_timeout_s: float) -> None:
        self.client = client
        self.id = lease_id
        self.ttl_s = ttl_s
        self.request_timeout_s = request_timeout_s
        self._valid_until = granted_at + granted_ttl
        self.lost = asyncio.Event()
        self.renewals = 0
        self.doubts = 0
        """How many times renewals failed past the TTL (each followed by a renewal or the loss)."""
        self._doubt_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._gone_check: asyncio.Task[None] | None = None
        self._gone_checked_at = float("-inf")

    @classmethod
    async def grant(cls, client: Etcd3Client, ttl_s: int, *, request_timeout_s: float = 2.0,
                    keep_alive: bool = True) -> NodeLease:
        if ttl_s < 1:
            raise ValueError(f"lease TTL must be >= 1 s, got {ttl_s}")
        sent = lease_clock()
        resp = await client.lease.grant(ttl_s, timeout=request_timeout_s, max_attempts=1)
        if resp.error:
            raise EtcdStoreError(f"lease grant refused: {resp.error}")
        lease = cls(client, resp.ID, ttl_s, sent, resp.TTL, request_timeout_s=request_timeout_s)
        if keep_alive:
            lease._task = asyncio.create_task(lease._keep_alive(), name=f"etcd-lease-{resp.ID:x}")
        return lease

    def remaining(self) -> float:
        """Seconds the lease is certainly still valid (<= 0: it may have expired)."""
        if self.lost.is_set():
            return 0.0
        return self._valid_until - lease_clock()

    async def renew(self, timeout_s: float | None = None) -> bool:
        """One keep-alive round trip; True if etcd renewed the lease."""
        sent = lease_clock()
        stream = self.client.lease.keep_alive(self.id)
        try:
            async with asyncio.timeout(self.request_timeout_s if timeout_s is None else timeout_s):
                async for response in stream:
                    if response.TTL <= 0:
                        self._mark_lost("etcd says the lease expired")
                        return False
                    # max: hedged renewals may answer out of order.
                    self._valid_until = max(self._valid_until, sent + response.TTL)
                    self.renewals += 1
                    if self._doubt_since is not None and self.remaining() > 0:
                        events.warning("etcd lease renewed again: the same lease, every key on "
                                       "it kept", lease=f"{self.id:x}",
                                       in_doubt_s=round(lease_clock() - self._doubt_since, 3))
                        self._doubt_since = None
                    return True
        finally:
            stream.cancel()
        return False

    async def _renew_hedged(self) -> bool:
        """A renewal that does not wait on one slow etcd member: the client round-robins over
        the members, and a member that hangs (frozen, not dead) holds a call until its timeout.
        Each attempt may take at most half of what is left of the lease; if one has not
        answered within a sixth of the TTL another is sent (to the next member) alongside it;
        the first success wins. Found by review: one frozen member of three made every node lose
        its lease again and again (a renewal waited its whole 2 s timeout, the whole TTL)."""
        hedge_after = max(0.05, self.ttl_s / 6)
        attempts: set[asyncio.Task[bool]] = set()
        try:
            while not self.lost.is_set():
                left = self.remaining()
                # In doubt (left <= 0): each attempt may take the whole request timeout (an
                # election answers late); one round of failures returns, the caller retries.
                attempts.add(asyncio.create_task(self.renew(
                    min(self.request_timeout_s, max(0.05, left / 2)) if left > 0
                    else self.request_timeout_s)))
                done, _ = await asyncio.wait(attempts, timeout=hedge_after,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    attempts.discard(task)
                    if not task.cancelled() and task.exception() is None and task.result():
                        return True
                    if task.exception() is not None and self._doubt_since is None:
                        log.warning("etcd lease %x keep-alive failed: %r", self.id, task.exception())
                if done and left <= 0:
                    return False
                if len(attempts) >= 3:  # enough in flight: wait for one of them
                    done, _ = await asyncio.wait(attempts, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        attempts.discard(task)
                        if not task.cancelled() and task.exception() is None and task.result():
                            return True
            return False
        finally:
            for task in attempts:
                task.cancel()

    def _mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            log.error("etcd lease %x lost: %s", self.id, why)
            self.lost.set()

    async def _keep_alive(self) -> None:
        interval = max(0.1, self.ttl_s / 3)
        retry = min(interval, 0.1)  # after a failed renewal: try again soon, not a third TTL on
        delay = interval
        while not self.lost.is_set():
            await asyncio.sleep(delay)
            delay = interval
            try:
                if not await self._renew_hedged():
                    delay = retry
            except Exception as exc:  # keep trying while the lease may still be valid
                log.warning("etcd lease %x keep-alive failed: %r", self.id, exc)
                delay = retry
            if not self.lost.is_set() and self.remaining() <= 0 and self._doubt_since is None:
                # Not lost: etcd may still hold it (an election in progress). Keep renewing the
                # same lease; etcd's answer decides (renewed, or TTL 0: lost).
                self._doubt_since = lease_clock()
                self.doubts += 1
                events.warning("etcd lease in doubt: no renewal within its TTL; renewing the same "
                               "lease until etcd renews it or says it is gone",
                               lease=f"{self.id:x}")
            if self._doubt_since is not None and not self.lost.is_set():
                self._check_gone()

    def _check_gone(self) -> None:
        """In doubt, also ask LeaseTimeToLive (at most every ``GONE_CHECK_S``, in the
        background: the renewals go on meanwhile). A keep-alive of a gone lease need not answer
        TTL 0: etcd's gRPC proxy ends it with an error, so renewals only fail and the lease
        would stay in doubt for good. TTL -1 is etcd's "no such lease" -- the answer a
        keep-alive's TTL 0 gives (an expired lease not yet revoked answers >= 0)."""
        now = lease_clock()
        if (self._gone_check is not None and not self._gone_check.done()) or \
                now - self._gone_checked_at < self.GONE_CHECK_S:
            return
        self._gone_checked_at = now

        async def ask() -> None:
            with contextlib.suppress(Exception):  # unanswered: still in doubt
                resp = await self.client.lease.time_to_live(
                    self.id, timeout=self.request_timeout_s, max_attempts=1)
                if resp.TTL == -1:
                    self._mark_lost("etcd says there is no such lease (time to live)")
        self._gone_check = asyncio.create_task(ask(), name=f"etcd-lease-gone-{self.id:x}")

    async def stop_keep_alive(self) -> None:
        if self._gone_check is not None:
            self._gone_check.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self, *, revoke: bool = True, even_if_lost: bool = False) -> None:
        """Stop renewing and revoke the lease (its keys go at once). ``even_if_lost``: revoke
        a lease given up as lost too (etcd may still hold it if only our renewals failed)."""
        await self.stop_keep_alive()
        if revoke and (even_if_lost or not self.lost.is_set()):
            with contextlib.suppress(Exception):
                await self.client.lease.revoke(self.id, timeout=self.request_timeout_s)
        self.lost.set()


# -- the partition store ----------------------------------------------------------------------


class EtcdPartitionStore:
    """One partition's records in etcd, owned by this node. Build it with :meth:`acquire`.

    One writer at a time (the shard's consumer task): append() and commit() are not meant to
    be called from concurrent tasks, as ``PartitionLog.append``/``sync`` are not."""

    def __init__(
        self,
        client: Etcd3Client,
        prefix: str,
        partition: int,
        node_id: str,
        lease_id: int,
        owner_revision: int,
        *,
        max_txn_ops: int,
        max_request_bytes: int,
        commit_timeout_s: float,
        page_keys: int,
    ) -> None:
        self.client = client
        self.partition = partition
        self.node_id = node_id
        self.lease_id = lease_id
        self.owner_revision = owner_revision
        """The create revision of our owner key: every write compares it."""
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self.commit_timeout_s = commit_timeout_s
        self.page_keys = page_keys
        self._base = partition_prefix(prefix, partition)
        self.owner_key = owner_key(prefix, partition)
        self.fence_key = self._base + b"fence"
        """Re-written by every (re)load; every write compares its mod revision, so a write
        whose outcome was unknown and that etcd applies only after a reload read the partition
        fails instead of changing etcd behind the reloaded state."""
        self.fence_revision = owner_revision
        self.records_prefix = self._base + b"r/"
        self._pending: list[_Txn] = []
        self._position_width = _uvarint_len(max(0, max_txn_ops - 1))
        self._compare_bytes = self._compares_bytes()
        self._appends = 0
        self.committed_revision = owner_revision
        self.deposed = False
        self.needs_reload: str | None = None
        self._sizes: dict[bytes, int] = {}  # live record key -> len(key) + len(value)
        self.live_bytes = 0
        self.txns_sent = 0

    # -- ownership --------------------------------------------------------------------------------

    @classmethod
    async def acquire(
        cls,
        client: Etcd3Client,
        prefix: str,
        partition: int,
        node_id: str,
        lease: NodeLease | int,
        *,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        commit_timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S,
        page_keys: int = DEFAULT_PAGE_KEYS,
    ) -> EtcdPartitionStore:
        """Become the partition's owner: create its owner key with our lease if nobody owns it.

        Raises :class:`NotOwner` if another lease holds it. If our own lease already holds it
        (an acquire whose answer was lost, a reload), ownership is kept as it is.
        """
        if max_txn_ops < 1:
            raise ValueError("max_txn_ops must be >= 1")
        if max_request_bytes <= REQUEST_OVERHEAD_BYTES:
            raise ValueError(f"max_request_bytes must be > {REQUEST_OVERHEAD_BYTES}")
        lease_id = lease.id if isinstance(lease, NodeLease) else lease
        key = owner_key(prefix, partition)
        fence = partition_prefix(prefix, partition) + b"fence"
        value = json.dumps({"node": node_id, "lease": f"{lease_id:x}"}).encode()
        resp = await client.kv.txn(
            [KVService.txn_compare_create_revision(key, 0)],
            [KVService.txn_op_put(key, value, lease=lease_id), KVService.txn_op_put(fence, b"")],
            [KVService.txn_op_get(key)],
            timeout=commit_timeout_s, max_attempts=1,
        )
        if resp.succeeded:
            owner_revision = resp.header.revision
        else:
            kvs = resp.responses[0].response_range.kvs
            if not kvs:  # deleted between compare and read: cannot happen in one txn
                raise EtcdStoreError(f"partition {partition}: owner key vanished during acquire")
            kv = kvs[0]
            try:
                holder = json.loads(kv.value)
            except ValueError:
                holder = {"node": None, "lease": f"{kv.lease:x}"}
            if kv.lease != lease_id:
                raise NotOwner(partition, holder)
            owner_revision = kv.create_revision
        store = cls(client, prefix, partition, node_id, lease_id, owner_revision,
                    max_txn_ops=max_txn_ops, max_request_bytes=max_request_bytes,
                    commit_timeout_s=commit_timeout_s, page_keys=page_keys)
        if not resp.succeeded:  # ours already: a write of an earlier acquire may be in flight
            await store.bump_fence()
        log.info("acquired partition %d (owner revision %d)", partition, owner_revision)
        return store

    async def owns(self) -> bool:
        """Whether the owner key is still the one we created (a linearizable read)."""
        resp = await self.client.kv.get(self.owner_key, timeout=self.commit_timeout_s)
        return bool(resp.kvs) and resp.kvs[0].create_revision == self.owner_revision

    async def release(self) -> bool:
        """Give the partition up (graceful handover): delete our owner key if it is still ours.
        Commit first: buffered appends are dropped. Returns whether we still owned it."""
        self._pending.clear()
        resp = await self.client.kv.txn(
            [self._owner_compare()], [KVService.txn_op_delete(self.owner_key)],
            timeout=self.commit_timeout_s, max_attempts=1,
        )
        self.deposed = True  # no more writes through this object either way
        return bool(resp.succeeded)

    def _owner_compare(self) -> Any:
        return KVService.txn_compare_create_revision(self.owner_key, self.owner_revision)

    def _write_compares(self) -> list[Any]:
        """What every write compares: we still own the partition, and no reload since."""
        return [self._owner_compare(),
                Compare(result=Compare.EQUAL, target=Compare.MOD, key=self.fence_key,
                        mod_revision=self.fence_revision)]

    def _compares_bytes(self) -> int:
        return sum(_field_len(c.ByteSize()) for c in self._write_compares())

    async def bump_fence(self) -> None:
        """Re-write the fence key (under the owner compare): every write sent before this that
        etcd has not applied yet now fails its fence compare. :class:`Deposed` if the
        partition is not ours any more."""
        resp = await self.client.kv.txn(
            [self._owner_compare()], [KVService.txn_op_put(self.fence_key, b"")],
            timeout=self.commit_timeout_s, max_attempts=1)
        if not resp.succeeded:
            self.deposed = True
            raise Deposed(f"partition {self.partition}: no longer owned by this node")
        self.fence_revision = resp.header.revision
        self._compare_bytes = self._compares_bytes()

    # -- loading ----------------------------------------------------------------------------------

    async def load(self, sink: RecordSink | None = None) -> list[tuple[bytes, bytes]]:
        """Read the partition's live records; return them (and pass them to ``sink`` as one
        batch) in the order of their last writes. Resets ``needs_reload``."""
        start = self.records_prefix
        end = prefix_range_end(self.records_prefix)
        limit = self.page_keys
        rows: list[tuple[int, int, bytes, bytes]] = []
        skip = len(self.records_prefix)
        while True:
            try:
                resp = await self.client.kv.get(start, end, limit=limit,
                                                timeout=max(self.commit_timeout_s, 30.0))
            except grpc.aio.AioRpcError as exc:
                # A page over gRPC's receive limit: read fewer keys at a time.
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                    limit = max(1, limit // 2)
                    continue
                raise
            for kv in resp.kvs:
                position, at = _read_uvarint(kv.value)
                rows.append((kv.mod_revision, position, kv.key[skip:], kv.value[at:]))
            if not resp.more or not resp.kvs:
                break
            start = resp.kvs[-1].key + b"\x00"
        rows.sort(key=lambda r: (r[0], r[1]))
        records = [(key, value) for _, _, key, value in rows]
        self._sizes = {k: len(k) + len(v) for k, v in records}
        self.live_bytes = sum(self._sizes.values())
        self.committed_revision = max([self.owner_revision, *(r[0] for r in rows)])
        self._pending.clear()
        self.needs_reload = None
        if sink is not None and records:
            sink(records)
        return records

    async def reload(self, sink: RecordSink | None = None) -> list[tuple[bytes, bytes]]:
        """After :class:`ReloadRequired`: check we still own the partition (else
        :class:`Deposed`), then load it again."""
        if self.deposed:
            raise Deposed(f"partition {self.partition}: no longer owned by this node")
        # A write whose outcome was unknown may still be applied by etcd later: fence it off
        # first, so that what the load reads is what etcd keeps (found in review: only the
        # owner was compared, so such a write could land after the reload's read).
        await self.bump_fence()
        return await self.load(sink)

    # -- writing ----------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.deposed:
            raise Deposed(f"partition {self.partition}: this node no longer owns it")
        if self.needs_reload is not None:
            raise ReloadRequired(f"partition {self.partition} needs a reload: {self.needs_reload}")

    def _ops(self, writes: dict[bytes, bytes | None]) -> list[Any]:
        ops = []
        for position, (key, value) in enumerate(writes.items()):
            full = self.records_prefix + key
            if value is None:
                ops.append(KVService.txn_op_delete(full))
            else:
                ops.append(KVService.txn_op_put(full, _uvarint(position) + value))
        return ops

    def _request_bytes(self, writes: dict[bytes, bytes | None]) -> int:
        """The exact size of the TxnRequest commit() would send for ``writes`` (protobuf)."""
        return TxnRequest(compare=self._write_compares(), success=self._ops(writes)).ByteSize()

    def _op_bytes(self, key: bytes, value: bytes | None) -> int:
        """Bytes one write adds to the TxnRequest (``success`` entry), computed as protobuf
        encodes it, counting its position prefix at its widest (``max_txn_ops - 1``) so that
        the size does not depend on the order: never below the exact size."""
        full = len(self.records_prefix) + len(key)
        if value is None:  # RequestOp.request_delete_range = 4 { key = 1 }
            inner = _field_len(_field_len(full))
        else:  # RequestOp.request_put = 2 { key = 1, value = 2 }
            inner = _field_len(_field_len(full) + _field_len(self._position_width + len(value)))
        return _field_len(inner)

    def _limit_refusal(self, ops: int, request_bytes: int) -> BatchExceedsEtcdLimits | None:
        if ops > self.max_txn_ops:
            return BatchExceedsEtcdLimits(self.partition, ops, self.max_txn_ops,
                                          "max-txn-ops", "operations")
        size = request_bytes + REQUEST_OVERHEAD_BYTES
        if size > self.max_request_bytes:
            return BatchExceedsEtcdLimits(self.partition, size, self.max_request_bytes,
                                          "max-request-bytes", "bytes")
        return None

    def append(self, records: Records, timestamp_ms: int | None = None) -> int:
        """Buffer ``records`` (key bytes, value bytes or None: a tombstone) as ONE atomic batch;
        :meth:`commit` writes it. Returns the number of appends buffered so far.

        Raises :class:`BatchExceedsEtcdLimits` (nothing buffered) if the batch alone cannot fit
        in one etcd transaction. ``timestamp_ms`` is accepted for ``PartitionLog`` parity and
        not stored (a tombstone deletes its key at once). Cost: O(records)."""
        self._check_writable()
        if not records:
            raise ValueError("append needs at least one record")
        writes: dict[bytes, bytes | None] = {}
        for key, value in records:
            writes.pop(key, None)  # re-inserted last: the position of its last write
            writes[key] = value
        op_bytes = {key: self._op_bytes(key, value) for key, value in writes.items()}
        total = sum(op_bytes.values())
        refusal = self._limit_refusal(len(writes), self._compare_bytes + total)
        if refusal is not None:
            raise refusal
        current = self._pending[-1] if self._pending else None
        if current is not None:
            replaced = [k for k in writes if k in current.writes]
            merged_ops = len(current.writes) + len(writes) - len(replaced)
            merged_total = current.total + total - sum(current.op_bytes[k] for k in replaced)
            if self._limit_refusal(merged_ops, self._compare_bytes + merged_total) is None:
                for key, value in writes.items():
                    current.writes.pop(key, None)
                    current.writes[key] = value
                    current.op_bytes[key] = op_bytes[key]
                current.total = merged_total
                current.appends += 1
                self._appends += 1
                return self._appends
        self._pending.append(_Txn(writes, op_bytes, total, 1))
        self._appends += 1
        return self._appends

    @property
    def live_keys(self) -> int:
        """Live records in etcd as of the last load and the commits since."""
        return len(self._sizes)

    @property
    def pending_appends(self) -> int:
        return sum(t.appends for t in self._pending)

    def discard_pending(self) -> None:
        """Drop what append() buffered and commit() did not send (the caller rolls back)."""
        self._pending.clear()

    async def commit(self) -> int:
        """Write every buffered append to etcd and wait until etcd committed it; returns the
        revision of the last transaction (or the last committed one if nothing was buffered).
        See the module doc for the outcomes."""
        self._check_writable()
        txns, self._pending = self._pending, []
        applied = 0
        for txn in txns:
            ops = self._ops(txn.writes)
            try:
                resp = await self.client.kv.txn(self._write_compares(), ops,
                                                timeout=self.commit_timeout_s, max_attempts=1)
            except Exception as exc:
                definite = (isinstance(exc, grpc.aio.AioRpcError)
                            and exc.code() in _DEFINITE_REFUSALS)
                if definite and applied == 0:
                    raise CommitRefused(f"partition {self.partition}: etcd refused the write "
                                        f"(nothing written): {describe_error(exc)}") from exc
                if definite:
                    reason = (f"etcd refused transaction {applied + 1} of {len(txns)} after "
                              f"applying {applied}: {describe_error(exc)}")
                    self.needs_reload = reason
                    raise ReloadRequired(f"partition {self.partition}: {reason}") from exc
                reason = f"the outcome of a commit is unknown: {describe_error(exc)}"
                self.needs_reload = reason
                raise OutcomeUnknown(f"partition {self.partition}: {reason}") from exc
            self.txns_sent += 1
            if not resp.succeeded:
                self.deposed = True
                raise Deposed(f"partition {self.partition}: the owner key is no longer ours "
                              f"(created at revision {self.owner_revision}) or another store "
                              f"reloaded it (fence at {self.fence_revision}); nothing of this "
                              f"transaction was written ({applied} earlier ones of this commit "
                              "were)")
            applied += 1
            self.committed_revision = resp.header.revision
            sizes = self._sizes
            for key, value in txn.writes.items():
                old = sizes.pop(key, None)
                if old is not None:
                    self.live_bytes -= old
                if value is not None:
                    sizes[key] = len(key) + len(value)
                    self.live_bytes += sizes[key]
        return self.committed_revision

    # -- etcd history -----------------------------------------------------------------------------

    async def compact_history(self, *, physical: bool = False) -> int:
        """Compact etcd's history up to the latest revision (ALL keys of the etcd cluster, not
        only ours: etcd compaction is global). Prefer etcd's auto-compaction flags."""
        resp = await self.client.kv.get(self.owner_key, timeout=self.commit_timeout_s)
        revision = resp.header.revision
        await self.client.kv.compact(revision, physical=physical, timeout=self.commit_timeout_s)
        return revision


async def release_owner_key(client: Etcd3Client, prefix: str, partition: int, lease_id: int,
                            *, timeout_s: float) -> bool:
    """Delete the partition's owner key if it is on ``lease_id`` (a handover whose release
    failed, with no store object left to do it); True if it was deleted."""
    key = owner_key(prefix, partition)
    resp = await client.kv.get(key, timeout=timeout_s)
    if not resp.kvs or resp.kvs[0].lease != lease_id:
        return False
    deleted = await client.kv.txn(
        [KVService.txn_compare_create_revision(key, resp.kvs[0].create_revision)],
        [KVService.txn_op_delete(key)], timeout=timeout_s, max_attempts=1)
    return bool(deleted.succeeded)


def describe_error(exc: BaseException) -> str:
    """A one-line description of an etcd client error (gRPC code and details)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, EtcdTransientError | EtcdConnectionError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return repr(exc)


LEASE_REVOKE_FIX = {(3, 4): 31, (3, 5): 13}
"""The first patch release of each minor line whose leader no longer revokes live leases after
it wakes from a stall (a frozen or overloaded old leader proposed revokes of leases the new
leader had just renewed; upstream ignores an old leader's revoke request since 3.4.31 and
3.5.13, and 3.6.0 ships with it)."""


def unsafe_lease_version(version: str) -> str | None:
    """Why the etcd server ``version`` (e.g. ``"3.5.1"``) is not safe for node leases, or None
    if it is (or cannot be parsed: nothing is claimed then)."""
    try:
        major, minor, patch = (int(part) for part in version.split("-")[0].split(".")[:3])
    except ValueError:
        return None
    if (major, minor) < (3, 4):
        return f"etcd {version} is older than 3.4 (not supported)"
    first = LEASE_REVOKE_FIX.get((major, minor))
    if first is not None and patch < first:
        return (f"etcd {version} may revoke live leases when a stalled old leader wakes (fixed "
                f"in {major}.{minor}.{first}): a node is then dropped and reloads every "
                "partition; upgrade to 3.5.13+ (or 3.4.31+)")
    return None


async def server_versions(client: Etcd3Client, members: int, *, timeout_s: float) -> set[str]:
    """The etcd server versions the client's status calls meet (the client spreads its calls
    over the members: one call per member). Members that do not answer are left out."""
    versions = set()
    for _ in range(max(1, members)):
        with contextlib.suppress(Exception):
            status = await client.maintenance.status(timeout=timeout_s, max_attempts=1)
            if status.version:
                versions.add(status.version)
    return versions


def resolve_endpoints(endpoints: Sequence[str]) -> list[str]:
    """``HOST:PORT`` entries as ``IPV4:PORT``: etcd3aio dials an ``ipv4:`` gRPC target, which
    takes only IPv4 literals, so host names are resolved here (once: every IPv4 address of the
    name, in order, duplicates dropped). Raises EtcdStoreError naming an entry that cannot be
    used (an IPv6 address, a name without an IPv4 address)."""
    import ipaddress
    import socket

    out: list[str] = []
    for endpoint in endpoints:
        host, _, port = endpoint.strip().rpartition(":")
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
            except (OSError, ValueError) as exc:
                raise EtcdStoreError(f"etcd endpoint {endpoint!r}: cannot resolve {host!r} to an "
                                     f"IPv4 address ({exc})") from None
            addresses = [str(info[4][0]) for info in infos]
        else:
            if ip.version != 4:
                raise EtcdStoreError(f"etcd endpoint {endpoint!r}: IPv6 is not supported by the "
                                     "etcd client (etcd3aio dials IPv4 only); use an IPv4 "
                                     "address or a name that resolves to one")
            addresses = [host]
        for address in addresses:
            if f"{address}:{port}" not in out:
                out.append(f"{address}:{port}")
    return out


async def connect(endpoints: Sequence[str], **tls: bytes | None) -> Etcd3Client:
    """An etcd3aio client for the store: reads retry (the library's default of 3 attempts);
    every write of this module passes ``max_attempts=1`` itself. Host names are resolved to
    IPv4 addresses once, here (:func:`resolve_endpoints`)."""
    client = Etcd3Client(resolve_endpoints(endpoints), **tls)
    await client.connect()
    return client
