"""A shard: one partition's group coordinator, its store, its event queue and its timers.

Theory of operation
-------------------
* **One queue, one consumer.** Every event of the partition — a request, a timer expiry, a
  long-poll re-evaluation, a read — goes through the shard's own queue and is handled by the
  shard's single consumer task, so events of one partition never interleave, while other
  partitions' shards proceed (CPython runs them on one event loop; a shard awaiting its fsync
  does not hold up the others).
* **The store.** The shard is given a :class:`~coordinator.store.base.PartitionStore` (the
  file log, or etcd) and knows it only through that interface: load (replay), append, commit,
  close, and the typed outcomes of a commit (coordinator/store/base.py maps each to what the
  clients get). Whether the shard may answer at all is its owner's call (``serving``, given by
  the cluster node on etcd; always on the file store).
* **Write before respond.** A write event runs the pure handler (``GroupCoordinator``), whose
  records are applied to the in-memory state at once and appended to the store. The
  consumer drains what is queued, then commits the whole batch at once (one fsync, one etcd
  transaction: group commit; Kafka's "adaptive linger"), and only then releases the responses,
  applies timer changes and wakes parked heartbeats. A failed append or commit rolls the state
  back (in reverse order) and the affected requests get COORDINATOR_NOT_AVAILABLE; nothing was
  acknowledged.
* **Reads see committed state only.** A read event first commits whatever is pending.
* **Joins and timer expiries take their own lane.** A join (MemberEpoch 0 from a member not
  in the group) and a timer's expiry wait in a separate queue; one marker event in the main
  queue stands for it, and each time the consumer reaches the marker it handles at most
  ``LANE_SLICE`` of them, then puts the marker back at the end of the queue (after
  committing). So a flood of joins, and the flood of session expiries that follows when those
  members go silent, never holds up the heartbeats, leaves and assignment calls of the members
  already in a group: each waits at most for what was queued before it plus one slice of the
  lane, never for thousands of joins (its session must not run out because others are
  joining). A delayed expiry only happens later: each re-checks its deadline, so a member
  whose heartbeat got through first is not expired (the coordinator's own slowness does not
  cost it its session). A member's own requests keep their order (a member waits for its
  join's answer before it sends anything else).
* **Long-polled heartbeats.** A heartbeat whose answer would tell the member nothing new
  (no error, same epoch, no assignment, nothing to compute) and that asked for ``MaxWaitMs`` is
  parked. Whenever a committed result names the member in its ``wake`` set, the shard
  re-evaluates it (a heartbeat with all optional fields null) and answers as soon as something
  changed; otherwise the parked answer goes out when MaxWaitMs (capped below the session
  timeout) elapses.
* **Group events.** The core returns what happened to a group (joins, leaves, fences with
  their reason, epoch bumps, assignment computations and installs, holds, completed
  rebalances) as values in its Result; the shard logs each at info, with the partition, once
  the Result's records are durable (a rolled-back write logs nothing), and counts fences,
  session expiries and epoch bumps from them. The steady heartbeat returns none.
* **Clock.** The core gets wall-clock milliseconds (persisted deadlines such as a scheduled
  rebalance must survive a restart); timers run on the loop's monotonic clock and re-check
  the wall clock when they fire.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connect_wire.errors import ErrorCode
from connect_wire.items import items_from_wire
from connect_wire.messages import ConnectGroupHeartbeatRequest
from coordinator import logs
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import (
    GroupCoordinator,
    GroupEvent,
    RequestContext,
    Result,
    TimerKey,
)
from coordinator.group.model import is_hold
from coordinator.metrics import Metrics
from coordinator.runtime import serde
from coordinator.runtime.log import BatchTooLarge
from coordinator.store.base import (
    LOAD_CONTENT_ERRORS,
    CommitRefused,
    Deposed,
    Feed,
    GaveUp,
    OutcomeUnknown,
    PartitionStore,
)

log = logs.get("coordinator.shard")
events_log = logs.get("coordinator.group")
"""Group events (docs/daemon.md "Group events")."""

LOADING, ACTIVE, FAILED, CLOSED = "loading", "active", "failed", "closed"
UNOWNED = "unowned"
"""Several nodes (store=etcd): this node does not own the partition (not acquired, handed
over, or deposed): NOT_COORDINATOR."""
MAX_DRAIN = 512
LANE_SLICE = 256
"""Joins and timer expiries handled per turn of the lane (see "Joins and timer expiries take
their own lane")."""
TIMER_RETRY_MS = 500


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ShardUnavailable(Exception):
    """The shard cannot take the event (loading, failed or closed)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Event:
    kind: str  # "write" | "read" | "roll" | "lane" (the lane's marker)
    fn: Callable[..., Any]
    future: asyncio.Future[Any] | None
    error: Callable[[int, str], Any] | None = None
    on_commit: Callable[[Result], None] | None = None
    queued: float = 0.0
    """When it was queued (time.monotonic()): for the event queue time."""


@dataclass
class _Parked:
    future: asyncio.Future[Any]
    response: Any
    request: ConnectGroupHeartbeatRequest
    ctx: RequestContext
    handle: asyncio.TimerHandle | None = None
    refreshing: bool = False
    expired: bool = False
    """MaxWaitMs passed while a wake-up probe was in flight: the probe's result answers."""


class _Timer:
    """An armed timer. ``deadline`` may move later without re-arming the loop handle: the handle
    fires at ``fires_at`` and, if the deadline moved on meanwhile, re-arms itself for the rest
    (a steady heartbeat extends the session deadline; cancelling and re-creating a loop timer
    on every one of them was ~6% of the daemon's time under load)."""

    __slots__ = ("deadline", "fires_at", "handle")

    def __init__(self, deadline: int) -> None:
        self.deadline = deadline
        self.fires_at = deadline
        self.handle: asyncio.TimerHandle | None = None


@dataclass
class ShardStats:
    busy_s: float = 0.0
    started: float = field(default_factory=time.monotonic)


class Shard:
    heartbeat_error: Callable[[Any, int, str], Any] | None = None
    """Builds a heartbeat's error response (set by the server); a parked heartbeat answered
    after the node stopped serving the partition gets one (store=etcd)."""

    def __init__(
        self,
        partition: int,
        store: PartitionStore,
        group_config: GroupCoordinatorConfig,
        metrics: Metrics,
        *,
        serving: Callable[[], bool] | None = None,
        on_lost: Callable[[Shard, str], None] | None = None,
    ) -> None:
        """``serving``: whether this node may answer for the partition right now (the cluster
        node's call: while its lease is certainly valid); None: always. ``on_lost``: told when
        the partition is lost (deposed, or given up by the store)."""
        self.partition = partition
        self.store = store
        self.core = GroupCoordinator(group_config)
        self.metrics = metrics
        self._serving = serving
        self.on_lost = on_lost
        self._reload_reason: str | None = None
        """A commit's outcome is unknown: reload the partition from the store."""
        self.state = LOADING
        self.failure: str | None = None
        self.queue: asyncio.Queue[_Event] = asyncio.Queue()
        self._timers: dict[TimerKey, _Timer] = {}
        self._busy = False
        """The consumer is handling a batch: results may be applied but not yet committed."""
        self._parked: dict[tuple[str, str], _Parked] = {}
        self._lane: collections.deque[_Event] = collections.deque()
        """Joins (heartbeats with MemberEpoch 0) and timer expiries, waiting for the marker's
        turn."""
        self._lane_marked = False
        """The lane's marker event is in the main queue."""
        self._consumer: asyncio.Task[None] | None = None
        self._compactor: asyncio.Task[None] | None = None
        self.stats = ShardStats()
        self._queue_gauge = metrics.event_queue_size.labels(str(partition))
        self._idle_gauge = metrics.thread_idle_ratio.labels(str(partition))
        self._bytes_gauge = metrics.log_bytes.labels(str(partition))
        self._queue_time = metrics.event_queue_time.observe
        self._processing_time = metrics.event_processing_time.observe
        self._held = 0
        metrics.held_items.labels(str(partition)).set_function(self.held_item_count)
        self.loaded_records = 0
        self.skipped_records = 0

    # -- lifecycle ------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load the partition from the store (replay), then start serving."""
        started = time.monotonic()
        try:
            await self._load_store()
        except Deposed as exc:
            self.lose(f"deposed while loading: {exc}")
            return
        except GaveUp as exc:
            self.lose(str(exc))
            return
        except Exception as exc:  # a shard that cannot load fails alone; others keep serving
            self._load_failed(exc)
            return
        self.metrics.partition_load_seconds.observe(time.monotonic() - started)
        repaired = self.store.repaired()
        if repaired is not None:
            self.metrics.log_corruptions.labels(str(self.partition)).inc()
            log.warning("partition log recovered with truncation", partition=self.partition,
                        report=repaired)
        self.state = ACTIVE
        self._consumer = asyncio.create_task(self._run(), name=f"shard-{self.partition}")
        if self.store.compaction_interval_ms is not None:
            self._compactor = asyncio.create_task(self._compact_loop(),
                                                  name=f"compact-{self.partition}")
        # Fresh session timeouts, re-armed timers, restarted computations (as Kafka's new
        # coordinator does when it loads a partition).
        self._submit(_Event("write", lambda core, now: core.on_loaded(now), None))
        log.info("partition loaded", partition=self.partition, records=self.loaded_records,
                 groups=len(self.core.state.groups), **self.store.describe(),
                 seconds=round(time.monotonic() - started, 3))

    def _load_failed(self, exc: Exception) -> None:
        self.state = FAILED
        self.failure = f"{type(exc).__name__}: {exc}"
        self.store.discard()
        self.core = GroupCoordinator(self.core.config)  # never serve a partial replay
        if isinstance(exc, LOAD_CONTENT_ERRORS):
            self.metrics.log_corruptions.labels(str(self.partition)).inc()
            log.error("partition failed to load: its log is missing records or holds a record "
                      "the coordinator would refuse; not serving it", partition=self.partition,
                      error=self.failure)
        else:
            log.error("partition failed to load", partition=self.partition, error=self.failure)

    @property
    def durable_offset(self) -> int | None:
        """The store's durable offset (the recovery-point checkpoint), or None when there is
        none or no usable store (not loaded, failed)."""
        if self.state in (LOADING, FAILED):
            return None
        return self.store.durable_offset

    async def _load_store(self, *, again: bool = False) -> None:
        """Replay what the store holds into the core (a fresh one when ``again``)."""
        if again:
            self.core = GroupCoordinator(self.core.config)
        self.loaded_records = 0
        state = self.core.state

        def skip(exc: serde.UnknownRecordType) -> None:
            log.warning("skipping unknown record type", partition=self.partition, error=str(exc))

        def replay(feed: Feed) -> serde.LoadStats:
            # Each batch is replayed as the store reads it (serde.BulkLoader:
            # tests/test_replay_bulk.py checks it against record-by-record replay).
            with serde.BulkLoader(state, on_unknown=skip) as loader:
                feed(loader.add)
            return loader.stats

        stats = await self.store.load(replay)
        self.loaded_records = stats.applied
        self.skipped_records += stats.skipped
        self._bytes_gauge.set(self.store.size_bytes)

    async def close(self) -> None:
        """Graceful stop: answer what is queued, commit, answer parked heartbeats, then close
        the store (a file log syncs and closes; etcd commits and releases the owner key so the
        next owner can load at once)."""
        if self.state != ACTIVE:
            if self.state in (CLOSED, UNOWNED):
                return
            self.state = CLOSED
            await self.store.close(graceful=False)
            return
        self.state = CLOSED  # no new events
        if self._compactor is not None:
            self._compactor.cancel()
        done = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Event("read", lambda core: None, done))
        await done
        if self._consumer is not None:
            self._consumer.cancel()
        self._fail_lane(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is shutting down")
        for key in list(self._parked):
            self._release_parked(key)
        self._cancel_timers()
        await self.store.close(graceful=True)

    def lose(self, why: str) -> None:
        """The partition is no longer ours (deposed, lease lost): answer everything
        NOT_COORDINATOR, stop timers and the consumer, tell the owner (``on_lost``)."""
        if self.state == UNOWNED:
            return
        was = self.state
        self.state = UNOWNED
        log.warning("partition lost", partition=self.partition, reason=why, was=was)
        message = f"this node no longer owns partition {self.partition}"
        while not self.queue.empty():
            self._fail_event(self.queue.get_nowait(), ErrorCode.NOT_COORDINATOR, message)
        self._fail_lane(ErrorCode.NOT_COORDINATOR, message)
        for key in list(self._parked):
            self._release_parked(key)  # answered NOT_COORDINATOR (serving() or UNOWNED below)
        self._cancel_timers()
        self.core = GroupCoordinator(self.core.config)
        if self._consumer is not None and self._consumer is not asyncio.current_task():
            self._consumer.cancel()
        self.store.lost()
        if self.on_lost is not None:
            self.on_lost(self, why)

    # -- submitting events ------------------------------------------------------------------------
    def serving(self) -> bool:
        """Whether this node may answer for the partition right now (always, on the file store;
        on etcd: while the node's lease is certainly valid for more than its margin)."""
        return self._serving is None or self._serving()

    def check_available(self) -> None:
        if not self.serving():
            raise ShardUnavailable(ErrorCode.NOT_COORDINATOR,
                                   f"this node no longer serves partition {self.partition}")
        if self.state == LOADING:
            raise ShardUnavailable(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                   f"partition {self.partition} is loading")
        if self.state == FAILED:
            raise ShardUnavailable(ErrorCode.NOT_COORDINATOR,
                                   f"partition {self.partition} failed to load: {self.failure}")
        if self.state == CLOSED:
            raise ShardUnavailable(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                   "the coordinator is shutting down")
        if self.state == UNOWNED:
            raise ShardUnavailable(ErrorCode.NOT_COORDINATOR,
                                   f"this node does not own partition {self.partition}")

    def _submit(self, event: _Event) -> None:
        event.queued = time.monotonic()
        self.queue.put_nowait(event)
        self._queue_gauge.set(self.queue.qsize())

    def write(
        self, fn: Callable[[GroupCoordinator, int], Result], error: Callable[[int, str], Any]
    ) -> asyncio.Future[Any]:
        """Run a write handler; the future gets its response once its records are durable."""
        self.check_available()
        future = asyncio.get_running_loop().create_future()
        self._submit(_Event("write", fn, future, error))
        return future

    def read(self, fn: Callable[[GroupCoordinator], Any]) -> asyncio.Future[Any]:
        """Run a read against committed state."""
        self.check_available()
        future = asyncio.get_running_loop().create_future()
        self._submit(_Event("read", fn, future))
        return future

    def try_steady_heartbeat(self, req: ConnectGroupHeartbeatRequest, ctx: RequestContext) -> Any:
        """Answer a heartbeat that changes nothing without queueing it, or return None.

        Only while nothing is queued or uncommitted: the state the core answers from is then
        exactly the committed state, and no earlier event of this partition is still waiting,
        so answering now keeps both "reads see committed state" and the partition's event
        order. Returns the response, or a future if the heartbeat was parked (long poll).
        """
        if self._busy or self.state != ACTIVE or self.queue.qsize() or not self.serving():
            return None
        steady = self.core.steady_heartbeat(req, now_ms(), ctx)
        if steady is None:
            return None
        response, op = steady
        self._set_timer(op.key, op.deadline_ms)
        return self._settle_heartbeat(req, ctx, response, None)

    def heartbeat(
        self, req: ConnectGroupHeartbeatRequest, ctx: RequestContext,
        error: Callable[[int, str], Any],
    ) -> asyncio.Future[Any]:
        self.check_available()
        future = asyncio.get_running_loop().create_future()

        def committed(result: Result) -> None:
            self._heartbeat_committed(req, ctx, result, future)

        event = _Event("write", lambda core, now: core.heartbeat(req, now, ctx), future, error,
                       on_commit=committed)
        if req.member_epoch == 0 and not self._is_member(req.group_id, req.member_id):
            self._to_lane(event)  # a join (a member's epoch-0 heartbeats go first: it is in)
        else:
            self._submit(event)
        return future

    def _is_member(self, group_id: str, member_id: str) -> bool:
        g = self.core.group(group_id)
        return g is not None and member_id in g.members

    def _to_lane(self, event: _Event) -> None:
        event.queued = time.monotonic()
        self._lane.append(event)
        self._mark_lane()

    def _mark_lane(self) -> None:
        """Put the lane's marker in the main queue (unless it is there already)."""
        if self._lane and not self._lane_marked:
            self._lane_marked = True
            self._submit(_Event("lane", lambda core, now: None, None, error=self._fail_lane))

    def _fail_lane(self, code: int, message: str) -> None:
        """Fail every event waiting in the lane with ``code`` (the marker was failed: the
        partition is lost, reloading or closing): joins are answered, timers retry."""
        self._lane_marked = False
        lane, self._lane = self._lane, collections.deque()
        for ev in lane:
            self._fail_event(ev, code, message)

    # -- the consumer -----------------------------------------------------------------------------
    async def _run(self) -> None:
        queue = self.queue
        while True:
            event = await queue.get()
            self._busy = True
            started = time.monotonic()
            batch = [event]
            while len(batch) < MAX_DRAIN and not queue.empty():
                batch.append(queue.get_nowait())
            self._queue_gauge.set(queue.qsize())
            pending: list[tuple[_Event, Result]] = []
            for ev in batch:
                if ev.kind == "roll":
                    await self._commit(pending)
                    pending = []
                    await self._roll_log(ev)
                    continue
                if ev.kind == "read":
                    await self._commit(pending)
                    pending = []
                    begun = time.monotonic()
                    self._queue_time(begun - ev.queued)
                    self._resolve_read(ev)
                    self._processing_time(time.monotonic() - begun)
                    continue
                if ev.kind == "lane":
                    self._lane_marked = False
                    lane = self._lane
                    for _ in range(min(LANE_SLICE, len(lane))):
                        self._write_event(lane.popleft(), pending)
                    continue
                self._write_event(ev, pending)
            await self._commit(pending)
            self._mark_lane()  # the rest of the lane: after what was queued meanwhile
            if self._storage_failed():
                await self._reload()
                if self.state in (FAILED, UNOWNED):
                    return
            self._busy = False
            self.stats.busy_s += time.monotonic() - started
            elapsed = time.monotonic() - self.stats.started
            if elapsed > 0:
                self._idle_gauge.set(max(0.0, 1.0 - self.stats.busy_s / elapsed))

    def _write_event(self, ev: _Event, pending: list[tuple[_Event, Result]]) -> None:
        begun = time.monotonic()
        self._queue_time(begun - ev.queued)
        result = self._apply(ev)
        self._processing_time(time.monotonic() - begun)
        if result is not None:
            pending.append((ev, result))

    def _storage_failed(self) -> bool:
        """The store's state is unknown after a failed write: reload before serving again."""
        return (self._reload_reason is not None or self.store.failed is not None
                or self.state == UNOWNED)

    async def _reload(self) -> None:
        """A commit's outcome is unknown, or the store could not restore a consistent state
        after a failed write (a log that could not cut itself back): rebuild the state from what
        the store holds, retrying while it refuses; meanwhile events are answered
        COORDINATOR_LOAD_IN_PROGRESS (retriable)."""
        if self.state == UNOWNED or (self.state == CLOSED and self._reload_reason is not None):
            return  # deposed (the consumer ends), or handing over: the next owner loads it
        reason = self._reload_reason or self.store.failed
        self._reload_reason = None
        log.error(self.store.reload_event, partition=self.partition, reason=reason)
        self.metrics.partition_reloads.labels(str(self.partition)).inc()
        self.state = LOADING
        for key in list(self._parked):
            self._release_parked(key)
        self._cancel_timers()
        delay = 0.1
        while True:
            try:
                await self._load_store(again=True)
                break
            except Deposed as exc:
                self.lose(f"deposed while reloading: {exc}")
                return
            except LOAD_CONTENT_ERRORS as exc:  # retrying cannot help: fail the partition
                self._load_failed(exc)
                while not self.queue.empty():
                    self._fail_event(self.queue.get_nowait(), ErrorCode.NOT_COORDINATOR,
                                     f"partition {self.partition} failed: {self.failure}")
                return
            except Exception as exc:
                log.error("partition reload failed; retrying", partition=self.partition,
                          error=repr(exc), retry_in_s=delay)
            while not self.queue.empty():
                self._fail_event(self.queue.get_nowait(), ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                 f"partition {self.partition} is reloading {self.store.reloading}")
            if self.state == UNOWNED:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.store.reload_backoff_max_s)
        self.state = ACTIVE
        self._submit(_Event("write", lambda core, now: core.on_loaded(now), None))
        log.info("partition reloaded", partition=self.partition, records=self.loaded_records)

    def _resolve_read(self, ev: _Event) -> None:
        if self.state == ACTIVE and not self.serving():
            # Several nodes: accepted while the lease was certainly valid, run once it is in
            # doubt (it waited behind a slow commit): answered from nothing, as writes are.
            self._fail_event(ev, ErrorCode.NOT_COORDINATOR,
                             f"this node no longer serves partition {self.partition}")
            return
        try:
            value = ev.fn(self.core)
        except Exception as exc:  # never let a bad read kill the shard
            log.error("read failed", partition=self.partition, error=repr(exc))
            if ev.future is not None and not ev.future.done():
                ev.future.set_exception(exc)
            return
        if ev.future is not None and not ev.future.done():
            ev.future.set_result(value)

    OVERSIZE_WARNING_INTERVAL_S = 10.0
    _oversize_warned_at = float("-inf")
    _oversize_unlogged = 0

    def _refuse_oversize(self, ev: _Event, exc: BatchTooLarge) -> None:
        """A batch that alone exceeds the store's batch limit can never be written: answer a
        non-retriable INVALID_REQUEST naming the limit (not COORDINATOR_NOT_AVAILABLE, which a
        client retries forever), with one warning per interval at most. The core refuses what
        it can foresee (AlterConnectors); this catches the rest."""
        warning, fields, message = self.store.oversize(exc)
        now = time.monotonic()
        if now - self._oversize_warned_at >= self.OVERSIZE_WARNING_INTERVAL_S:
            log.warning(warning, partition=self.partition, **fields,
                        refused_since_last_warning=self._oversize_unlogged)
            self._oversize_warned_at = now
            self._oversize_unlogged = 0
        else:
            self._oversize_unlogged += 1
        self._fail_event(ev, ErrorCode.INVALID_REQUEST, message)

    def _apply(self, ev: _Event) -> Result | None:
        now = now_ms()
        try:
            result: Result = ev.fn(self.core, now)
        except Exception as exc:  # the core answers errors itself; this is a bug: contain it
            log.error("handler failed", partition=self.partition, error=repr(exc))
            self._fail_event(ev, ErrorCode.UNKNOWN_SERVER_ERROR, f"internal error: {exc!r}")
            return None
        if result.records:
            started = time.monotonic()
            try:
                self._append([serde.encode_record(r) for r in result.records], now)
            except BatchTooLarge as exc:  # nothing was written; retrying cannot help
                self.core.rollback(result)
                self._refuse_oversize(ev, exc)
                return None
            except Exception as exc:
                self.core.rollback(result)
                log.error("log append failed", partition=self.partition, error=repr(exc))
                self._fail_event(ev, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                 f"could not write the coordinator log: {exc}")
                return None
            self.metrics.log_append_seconds.observe(time.monotonic() - started)
        return result

    def _append(self, records: list[tuple[bytes, bytes | None]], now: int) -> None:
        """Write one request's records (atomic) to the store, not yet durable."""
        self.store.append(records, now)

    def _fail_event(self, ev: _Event, code: int, message: str) -> None:
        if ev.future is None:
            if ev.error is not None:
                ev.error(code, message)  # e.g. a timer's retry
            return
        if ev.future.done():
            return
        if ev.error is not None:
            ev.future.set_result(ev.error(code, message))
        else:
            ev.future.set_exception(ShardUnavailable(code, message))

    async def _commit(self, pending: list[tuple[_Event, Result]]) -> None:
        if not pending:
            return
        wrote = any(result.records for _, result in pending)
        if wrote and not await self._make_durable(pending):
            return
        # Several nodes: the lease may have run short while the commit was in flight (an etcd
        # election, a frozen node): the results are applied (timers armed, parked heartbeats
        # refreshed -- a renewal of the same lease serves this state again) but nothing is
        # answered from it; if the lease is gone instead, the partition is dropped with them.
        serving = self.serving()
        wake: set[tuple[str, str]] = set()
        for ev, result in pending:
            self._apply_timers(result)
            wake |= result.wake
            if result.events:
                self._log_events(result.events)
            if not serving:
                self._fail_event(ev, ErrorCode.NOT_COORDINATOR,
                                 f"this node no longer serves partition {self.partition}")
            elif ev.on_commit is not None:
                ev.on_commit(result)
            elif ev.future is not None and not ev.future.done():
                ev.future.set_result(result.response)
        if len(wake) > 1:
            # Members that must give items up first: their acknowledgements release what the
            # others wait for, so the revoke -> release -> assign chain overlaps the rest of the
            # wave (found by the convergence benchmark: the revoker was answered last).
            must_revoke = self.core.must_revoke
            wake = sorted(wake, key=lambda key: (not must_revoke(*key), key))  # type: ignore[assignment]
        for key in wake:
            self._refresh_parked(key)

    def _log_events(self, events: list[GroupEvent]) -> None:
        """Committed group events: one info line each, and the counters that follow them."""
        metrics = self.metrics
        for event in events:
            fields = event.fields
            name = event.event
            if name == "group epoch bumped":
                metrics.rebalances.inc()
            elif name == "member fenced":
                reason = fields.get("reason")
                if reason in metrics.fences:
                    metrics.fences[reason].inc()
                if reason == "session_expired":
                    metrics.session_expiries[
                        "static_leave" if fields.get("static_leave") else "no_heartbeat"].inc()
            events_log.info(name, group=event.group, partition=self.partition, **fields)

    def held_item_count(self) -> int:
        """Items held for fenced members now (the held-items gauge, read when scraped from the
        metrics thread: it copies what it walks, and keeps its last answer should a dict change
        size under it)."""
        if self.state != ACTIVE:
            return 0
        try:
            held = 0
            for g in list(self.core.state.groups.values()):
                if not g.soft.hold_deadline:
                    continue
                for member_id in list(g.soft.hold_deadline):
                    cur = g.current.get(member_id)
                    if cur is not None and is_hold(cur) and member_id not in g.members:
                        held += len(cur.revoking)
            self._held = held
        except RuntimeError:  # changed while walked: the last answer
            pass
        return self._held

    async def _make_durable(self, pending: list[tuple[_Event, Result]]) -> bool:
        """Commit the appended records to the store; False: they are not durable, every
        pending result was rolled back and its event answered (coordinator/store/base.py)."""
        started = time.monotonic()
        try:
            timed = await self.store.commit()
        except Deposed as exc:
            for ev, result in reversed(pending):
                self.core.rollback(result)
                self._fail_event(ev, ErrorCode.NOT_COORDINATOR,
                                 f"this node no longer owns partition {self.partition}")
            self.lose(f"deposed: {exc}")
            return False
        except CommitRefused as exc:
            self._roll_back(pending, ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc))
            return False
        except OutcomeUnknown as exc:
            # Never guessed: the clients retry; the state is rebuilt from what the store holds.
            self._roll_back(pending, ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc))
            self._reload_reason = exc.reason
            return False
        except Exception as exc:  # noqa: BLE001 (a store bug): treated as an unknown outcome
            log.error("commit failed: reloading the partition", partition=self.partition,
                      error=repr(exc))
            self._roll_back(pending, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            f"the outcome of the write is unknown ({exc!r}); retry")
            self._reload_reason = repr(exc)
            return False
        if timed:
            self.metrics.log_fsync_seconds.observe(time.monotonic() - started)
        self._bytes_gauge.set(self.store.size_bytes)
        return True

    def _roll_back(self, pending: list[tuple[_Event, Result]], code: int, message: str) -> None:
        for ev, result in reversed(pending):
            self.core.rollback(result)
            self._fail_event(ev, code, message)

    # -- timers -----------------------------------------------------------------------------------
    def _apply_timers(self, result: Result) -> None:
        for op in result.timers:
            self._set_timer(op.key, op.deadline_ms)

    def _set_timer(self, key: TimerKey, deadline: int | None) -> None:
        """Set (or with None cancel) the timer ``key``."""
        timer = self._timers.get(key)
        if deadline is None:
            if timer is not None:
                del self._timers[key]
                if timer.handle is not None:
                    timer.handle.cancel()
            return
        if timer is not None:
            if deadline >= timer.fires_at:  # later: the armed handle re-arms when it fires
                timer.deadline = deadline
                return
            if timer.handle is not None:
                timer.handle.cancel()
        timer = self._timers[key] = _Timer(deadline)
        self._arm(key, timer, deadline)

    def _arm(self, key: TimerKey, timer: _Timer, at_ms: int) -> None:
        timer.fires_at = at_ms
        timer.handle = asyncio.get_running_loop().call_later(
            max(0.0, (at_ms - now_ms()) / 1000), self._fire, key, timer)

    def _cancel_timers(self) -> None:
        for timer in self._timers.values():
            if timer.handle is not None:
                timer.handle.cancel()
        self._timers.clear()

    def _fire(self, key: TimerKey, timer: _Timer) -> None:
        if self._timers.get(key) is not timer or self.state != ACTIVE:
            return
        deadline = timer.deadline
        if deadline > now_ms():  # moved later meanwhile (or the clocks drifted): wait the rest
            self._arm(key, timer, deadline)
            return
        if not self.serving():
            # Several nodes, the lease in doubt (an etcd election): a write now could only time
            # out and reload the partition. Fire once the lease is renewed (or the partition is
            # dropped with it).
            self._arm(key, timer, now_ms() + TIMER_RETRY_MS)
            return
        del self._timers[key]

        def retry(code: int, message: str) -> None:
            # The expiry's records could not be written: try again shortly (Kafka's timers
            # retry after 500 ms too), unless something re-armed the timer meanwhile.
            if key not in self._timers and self.state == ACTIVE:
                self._set_timer(key, now_ms() + TIMER_RETRY_MS)

        self._to_lane(_Event("write", lambda core, now: core.on_timer(key, now), None, error=retry))

    def timer_deadlines(self) -> dict[TimerKey, int]:
        return {k: t.deadline for k, t in self._timers.items()}

    # -- long poll --------------------------------------------------------------------------------
    @staticmethod
    def _quiet(req: ConnectGroupHeartbeatRequest, resp: Any) -> bool:
        """Would this answer tell the member nothing new? (Then it may be parked.)"""
        if (resp.error_code or resp.should_compute_assignment or not req.member_id
                or resp.member_epoch != req.member_epoch or req.member_epoch < 0):
            return False
        a = resp.assignment
        if a is None:
            return req.member_epoch > 0
        # An assignment equal to what the member just reported running is nothing new (a
        # member at epoch 0 always sends its full join, whose answer always carries one).
        if req.owned_connectors is None or req.owned_tasks is None:
            return False
        return items_from_wire(a.connectors, a.tasks) == items_from_wire(
            req.owned_connectors, req.owned_tasks)

    def _heartbeat_committed(
        self, req: ConnectGroupHeartbeatRequest, ctx: RequestContext, result: Result,
        future: asyncio.Future[Any],
    ) -> None:
        if future.done():
            self._release_parked((req.group_id, req.member_id))
            return
        answer = self._settle_heartbeat(req, ctx, result.response, future)
        if answer is not future:
            future.set_result(answer)

    def _settle_heartbeat(
        self, req: ConnectGroupHeartbeatRequest, ctx: RequestContext, resp: Any,
        future: asyncio.Future[Any] | None,
    ) -> Any:
        """A committed heartbeat answer: the response itself, or a (given or new) future if
        the answer tells the member nothing new and it asked to wait (parked)."""
        key = (req.group_id, req.member_id)
        if self._parked:
            # A newer heartbeat from the same member supersedes a parked one.
            self._release_parked(key)
        wait_ms = req.max_wait_ms
        if wait_ms <= 0 or not self._quiet(req, resp):
            return resp
        g = self.core.group(req.group_id)
        session_ms, interval_ms = self.core.config.for_group(g.configs if g else {})
        wait_ms = min(wait_ms, max(0, session_ms - interval_ms))
        if wait_ms <= 0:
            return resp
        if future is None:
            future = asyncio.get_running_loop().create_future()
        parked = _Parked(future, resp, req, ctx)
        parked.handle = asyncio.get_running_loop().call_later(
            wait_ms / 1000, self._parked_timeout, key)
        self._parked[key] = parked
        self.metrics.parked.inc()
        return future

    def _answer(self, parked: _Parked, response: Any) -> None:
        if parked.handle is not None:
            parked.handle.cancel()
        self.metrics.parked.dec()
        if self.state == UNOWNED and self.heartbeat_error is not None:
            response = self.heartbeat_error(parked.request, ErrorCode.NOT_COORDINATOR,
                                            f"this node no longer owns partition {self.partition}")
        if not self.serving() and self.heartbeat_error is not None:
            # Several nodes: a node whose lease ran short answers nothing from its state.
            response = self.heartbeat_error(parked.request, ErrorCode.NOT_COORDINATOR,
                                            f"this node no longer serves partition {self.partition}")
        if not parked.future.done():
            parked.future.set_result(response)

    def _release_parked(self, key: tuple[str, str]) -> None:
        parked = self._parked.pop(key, None)
        if parked is not None:
            self._answer(parked, parked.response)

    def _parked_timeout(self, key: tuple[str, str]) -> None:
        # Fix: MaxWaitMs used to release the parked answer even while its wake-up probe was
        # being committed; the probe's committed effect (an epoch bump, a new assignment marked
        # as sent) was then dropped and the member's next heartbeat, at the old epoch, fenced
        # it (seen in e2e: a bystander worker lost all its work when another one died). Now
        # the probe, once committed, answers instead (or the stale answer goes if it failed).
        parked = self._parked.get(key)
        if parked is not None and parked.refreshing:
            parked.expired = True
            return
        self._release_parked(key)

    def _refresh_parked(self, key: tuple[str, str]) -> None:
        parked = self._parked.get(key)
        if parked is None or parked.refreshing or self.state != ACTIVE:
            return
        parked.refreshing = True
        req = parked.request
        # At epoch 0 the only valid heartbeat is the full join, which is idempotent for a
        # member already in the group; otherwise a heartbeat with every optional field null.
        probe = req if req.member_epoch == 0 else ConnectGroupHeartbeatRequest(
            group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch,
        )

        def committed(result: Result) -> None:
            parked.refreshing = False
            if self._parked.get(key) is not parked:
                return
            if parked.expired or not self._quiet(probe, result.response):
                del self._parked[key]
                self._answer(parked, result.response)

        def failed(code: int, message: str) -> None:  # rolled back: the parked answer stands
            parked.refreshing = False
            if parked.expired and self._parked.get(key) is parked:
                self._release_parked(key)

        def run(core: GroupCoordinator, now: int) -> Result:
            # Fix: a probe whose parked heartbeat was superseded (or released) before it ran
            # must not run: at the old epoch it could fence a member that moved on meanwhile.
            if self._parked.get(key) is not parked:
                return Result()
            return core.heartbeat(probe, now, parked.ctx)

        # A future only so that a failed probe reaches ``failed`` (see _fail_event).
        self._submit(_Event("write", run, asyncio.get_running_loop().create_future(), failed,
                            on_commit=committed))

    @property
    def parked_count(self) -> int:
        return len(self._parked)

    # -- compaction -------------------------------------------------------------------------------
    async def _roll_log(self, ev: _Event) -> None:
        """A "roll" event: the consumer is the store's only writer, so it rolls (in a thread)."""
        try:
            rolled = await asyncio.to_thread(self.store.roll)
        except Exception as exc:
            log.error("rolling the active segment failed", partition=self.partition,
                      error=repr(exc))
            rolled = False
        if ev.future is not None and not ev.future.done():
            ev.future.set_result(rolled)

    async def _compact_loop(self) -> None:
        """Compact the store every ``compaction_interval_ms`` (a store that keeps history)."""
        assert self.store.compaction_interval_ms is not None
        interval_s = self.store.compaction_interval_ms / 1000
        again = False
        while True:
            if not again:
                await asyncio.sleep(interval_s)
            again = False
            if self.state != ACTIVE:
                continue
            try:
                report = await asyncio.to_thread(self.store.compact, now_ms())
            except Exception as exc:
                log.error("compaction failed", partition=self.partition, error=repr(exc))
                continue
            log.debug("compacted", partition=self.partition, report=str(report))
            self._bytes_gauge.set(self.store.size_bytes)
            # The active segment is never compacted: when it is mostly superseded records, roll
            # it (by the consumer, the log's writer) and compact again at once, so the log and
            # the restart time follow the live state, not the history.
            if self.state == ACTIVE and self.store.should_roll(report):
                future = asyncio.get_running_loop().create_future()
                self._submit(_Event("roll", lambda core: None, future))
                try:
                    again = bool(await future)
                except ShardUnavailable:  # dropped by a reload: try at the next interval
                    continue
                log.info("rolled a mostly superseded active segment for compaction",
                         partition=self.partition, active_bytes=report.active_bytes,
                         superseded_bytes=report.active_dirty_bytes)


class UnownedShard:
    """The slot of a partition this node does not own (several nodes): everything is answered
    NOT_COORDINATOR, and it holds no groups."""

    state = UNOWNED
    durable_offset = None
    parked_count = 0

    def __init__(self, partition: int, group_config: GroupCoordinatorConfig) -> None:
        self.partition = partition
        self.core = GroupCoordinator(group_config)

    def serving(self) -> bool:
        return False

    def check_available(self) -> None:
        raise ShardUnavailable(ErrorCode.NOT_COORDINATOR,
                               f"this node does not own partition {self.partition}")

    def try_steady_heartbeat(self, req: Any, ctx: Any) -> None:
        return None

    def write(self, fn: Any, error: Any) -> Any:
        self.check_available()

    def read(self, fn: Any) -> Any:
        self.check_available()

    def heartbeat(self, req: Any, ctx: Any, error: Any) -> Any:
        self.check_available()

    def timer_deadlines(self) -> dict[Any, int]:
        return {}

    async def load(self) -> None:
        return

    async def close(self) -> None:
        return
