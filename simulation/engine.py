"""The deterministic simulation: the real coordinator core and the real worker membership state
machines and assignors, driven by a virtual clock, with a simulated network, log and faults.

Theory of operation
-------------------
* **One event queue, one clock.** Everything that happens is an event ``(time, sequence, fn)``
  in one heap; time is virtual milliseconds. Every random choice comes from a
  ``random.Random`` seeded from the run's seed (one stream per concern: network, work
  durations, faults, coordinator, client backoff), nothing iterates a set in hash order and no
  wall clock is read, so one seed is one run, in any process.
* **The coordinator** (:class:`CoordinatorNode`) is a model of ``coordinator/runtime/shard.py``
  around the real :class:`~coordinator.group.coordinator.GroupCoordinator`: it drains its
  queue, runs each handler, then "fsyncs" the batch (a sampled latency; it may fail, and then
  every result of the batch is rolled back in reverse with ``rollback`` and answered
  COORDINATOR_NOT_AVAILABLE), and only then releases responses, sets timers and re-evaluates
  parked long-poll heartbeats. Its durable log is a compacted ``key -> record`` map; a restart
  replays it into a new core and calls ``on_loaded``.
* **Workers** (:class:`SimWorker`) are a model of ``worker_client/worker.py`` around the real
  :class:`~worker_client.membership.Membership`: a main loop that sends each heartbeat the
  membership asks for and carries out its actions in order (revoke = stop the items, sampled
  stop durations, then ``revoked``; assign = start them, then ``assigned_started``; lost = stop
  everything), a watchdog (``check_session`` every 100 ms), the chosen worker's
  Prepare -> ``assign`` -> Install task on a second connection, and ``stop()``, which drains the
  work through the loop (heartbeats go on) before it leaves. The fail-stop rule: an instance
  not stopped within the stop budget of its stop's beginning, or anything still running or
  stopping at the lease's end plus the budget, ends the process, which is restarted 1-5 s later.
* **The network** keeps per-connection FIFO order; latencies are sampled per message, so
  messages on different connections reorder. A lost message resets its connection; a
  partition delays a worker's messages until it heals (TCP retransmits) or its requests time
  out; a paused worker (stop-the-world) handles nothing until it wakes, then its buffered input
  first, then its due timers (asyncio's order).
* **Invariants** are checked as the run goes (see :mod:`simulation` and docs/simulation.md);
  the first violation stops the run.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connect_wire.errors import ErrorCode as E
from connect_wire.items import CONNECTOR, Item
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterConnectorsResponse,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.records import GroupConnectorsKey
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator, Result
from coordinator.group.invariants import InvariantViolation, check_invariants, epochs
from coordinator.group.model import GroupState
from coordinator.runtime.shard import MAX_DRAIN, Shard
from worker_client.assignors import (
    EagerAssignor,
    IncrementalCooperativeAssignor,
    group_from_prepare,
    install_request,
)
from worker_client.membership import RETRY as MEMBERSHIP_RETRY
from worker_client.membership import Assign, AssignorAd, Compute, Fatal, Lost, Membership, Revoke, State

from .scenarios import DEPOSED_ARM_MS, Fault, Scenario

GROUP = "g"
WATCHDOG_MS = 100
"""The real worker's watchdog checks ``check_session`` every 100 ms."""
FORMATION_BOUND_MS = 120_000
INF = 1 << 62

_quiet = Shard._quiet  # the daemon's "would this answer tell the member nothing new?"


# == bookkeeping of running items ====================================================================


class Run:
    """One item on one worker process: running from ``start`` (its start began) until ``end``
    (its stop completed); *up* (doing work) from ``up_at`` until ``stop_begin``."""

    __slots__ = ("item", "worker", "start", "up_at", "stop_begin", "end")

    def __init__(self, item: Item, worker: SimWorker, start: int, up_at: int) -> None:
        self.item = item
        self.worker = worker
        self.start = start
        self.up_at = up_at
        self.stop_begin: int | None = None
        self.end: int | None = None


class Overlap:
    __slots__ = ("item", "old", "new", "at", "excused")

    def __init__(self, item: Item, old: Run, new: Run, at: int, excused: bool) -> None:
        self.item, self.old, self.new, self.at, self.excused = item, old, new, at, excused

    def length(self, now: int) -> int:
        a = self.old.end if self.old.end is not None else now
        b = self.new.end if self.new.end is not None else now
        return max(0, min(a, b, now) - self.at)  # (an abandoned stop's end is INF until it ends)


class ItemStat:
    """Downtime bookkeeping of one configured item: down since ``down_since`` (None: up)."""

    __slots__ = ("down_since", "ups")

    def __init__(self, down_since: int | None) -> None:
        self.down_since = down_since
        self.ups: list[Run] = []


# == network ============================================================================================


class Pending:
    """A request in flight from a worker: its callbacks and deadline."""

    __slots__ = ("request", "on_ok", "on_fail", "deadline", "timeout", "done", "ignore")

    def __init__(self, request: Any, on_ok: Callable[[Any], None], on_fail: Callable[[str], None],
                 deadline: int, timeout: int = 0) -> None:
        self.request = request
        self.on_ok = on_ok
        self.on_fail = on_fail
        self.deadline = deadline
        self.timeout = timeout
        self.done = False
        self.ignore = False  # the caller stopped waiting (cancelled): drop the answer


class Conn:
    """One TCP connection between a worker process and the coordinator process."""

    __slots__ = ("cid", "worker", "inc", "kind", "state", "node", "coord_inc", "up_last", "down_last",
                 "inflight", "queued")

    def __init__(self, cid: int, worker: SimWorker, kind: str, node: CoordinatorNode) -> None:
        self.cid = cid
        self.worker = worker
        self.inc = worker.inc
        self.kind = kind
        self.state = "connecting"
        self.node = node  # the coordinator node (its partition instance) it is connected to
        self.coord_inc = node.inc
        self.up_last = 0
        self.down_last = 0
        self.inflight: deque[Pending] = deque()
        self.queued: list[Pending] = []

    @property
    def open(self) -> bool:
        return self.state == "open"


class Find:
    """One FindCoordinator of a worker's client (CoordinatorClient._find_coordinator since
    72dc392): every bootstrap node asked at once for the connection ``conn``; ``left`` are the
    nodes whose ask has not ended yet (failed, or answered an error)."""

    __slots__ = ("conn", "begun", "left", "done")

    def __init__(self, conn: Conn, begun: int, nodes: list[str]) -> None:
        self.conn = conn
        self.begun = begun
        self.left = list(nodes)
        self.done = False


# == the coordinator ======================================================================================


@dataclass
class Parked:
    conn: Conn
    pending: Pending
    request: ConnectGroupHeartbeatRequest
    response: Any
    refreshing: bool = False
    expired: bool = False


class Store:
    """The partition's durable records and, with several nodes, who owns it.

    ``log`` is compacted (key -> latest record, in order of last write): what the file log's
    compaction keeps, and what etcd holds with records as keys. With several nodes the owner
    key's create revision is the ownership's ``token``: :meth:`write` compares it in the same
    transaction (etcd's compare), so a deposed owner's write applies nothing (unless the test-only
    ``fenced=False``); ``expires`` is when etcd expires the owner's lease (the arrival of its last
    renewal + TTL), after which nobody owns the partition (``token`` 0) until a node acquires it."""

    def __init__(self) -> None:
        self.log: dict[Any, Any] = {}
        self.token = 0
        self._tokens = 0
        self.expires = INF

    def acquire(self, now: int, ttl: int) -> int:
        self._tokens += 1
        self.token = self._tokens
        self.expires = now + ttl
        return self.token

    def release(self, token: int) -> None:
        if self.token == token:
            self.token = 0
            self.expires = INF

    def write(self, token: int, records: list[Any], fenced: bool = True) -> bool:
        if fenced and token != self.token:
            return False
        for record in records:
            self.log.pop(record.key, None)
            self.log[record.key] = record
        return True


class CoordinatorNode:
    """A model of the daemon's shard around the real GroupCoordinator: the group's partition as
    loaded on one coordinator node (``node``), for one ownership (``token``).

    With one node (the file store) it is the only one and a ``coordinator_restart`` reloads it in
    place. With several (issue 12), each acquisition of the partition is a new instance on the
    acquiring node: it loads the store's records, answers COORDINATOR_LOAD_IN_PROGRESS meanwhile,
    then runs ``on_loaded`` (fresh session clocks); it renews its lease every third of the TTL and
    answers only while the lease is certainly valid (``lease_ok``: the TTL counted from its last
    successful renewal's send, minus a margin), else it unloads: from then on every request on its
    connections is answered NOT_COORDINATOR. A graceful handover answers NOT_COORDINATOR to what it
    has not handled and to its parked long polls, lets the batch in flight commit, then releases.
    A frozen node (SIGSTOP) handles nothing: its input waits in its sockets, its timers and the
    batch it was about to commit wait; when it wakes, its input comes first, then its timers."""

    def __init__(self, sim: Simulation, node: str = "n1", token: int = 1,
                 previous: dict[str, Any] | None = None) -> None:
        self.sim = sim
        self.node = node
        self.token = token
        self.inc = 0
        self.up = True
        self.loading = False
        self.owner = True
        """It serves the partition; False once unloaded (handed over, deposed, lease lost)."""
        self.handing_over = False
        self._then: Callable[[], None] | None = None
        self.core = self._new_core()
        self.queue: deque[tuple[Any, ...]] = deque()
        self.busy = False
        self.timers: dict[Any, int] = {}
        self.parked: dict[tuple[str, str], Parked] = {}
        self.batches = 0
        self.epochs: dict[str, Any] = previous if previous is not None else epochs(self.core.state)
        self.frozen_until = 0
        self.deferred: list[tuple[int, Callable[..., None], tuple[Any, ...]]] = []
        self.lease_sent = sim.now
        """Send time of the last successful lease renewal (NodeLease: valid until it + TTL)."""
        self.in_doubt = False
        """Its lease is no longer certainly valid: it answers nothing but keeps the state, and
        serves it again once a renewal of the same lease succeeds (etcd's answer decides)."""
        self.freeze_armed: int | None = None
        """A deposed_late_write waits for a batch that writes: freeze that long when one comes."""

    def _new_core(self) -> GroupCoordinator:
        sc = self.sim.scenario
        config = GroupCoordinatorConfig(
            session_timeout_ms=sc.session_timeout_ms, heartbeat_interval_ms=sc.heartbeat_interval_ms,
            min_session_timeout_ms=min(1_000, sc.session_timeout_ms),
            min_heartbeat_interval_ms=min(100, sc.heartbeat_interval_ms),
        )
        return GroupCoordinator(config, member_id_factory=self.sim.generated_id, strict=True)

    # -- events of this node's process: deferred while it is frozen ------------------------------------
    def at(self, t: int, fn: Callable[..., None], *args: Any, io: bool = False) -> None:
        self.sim.at(t, self._event, io, fn, args)

    def _event(self, io: bool, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.sim.now < self.frozen_until:
            self.deferred.append((0 if io else 1, fn, args))
            return
        fn(*args)

    @property
    def frozen(self) -> bool:
        return self.sim.now < self.frozen_until

    def freeze(self, until: int) -> None:
        if not self.up:
            return
        self.frozen_until = max(self.frozen_until, until)
        self.sim.at(self.frozen_until, self._thaw, self.inc)

    def _thaw(self, inc: int) -> None:
        if inc != self.inc or self.sim.now < self.frozen_until:
            return
        deferred = sorted(self.deferred, key=lambda d: d[0])  # its sockets' input first, then timers
        self.deferred = []
        for _, fn, args in deferred:
            if inc != self.inc or self.sim.stopped:
                return
            fn(*args)

    # -- the lease (several nodes) ----------------------------------------------------------------------
    def lease_ok(self) -> bool:
        """NodeLease.remaining() > margin: else the lease is in doubt and the node answers
        nothing (queued requests and parked long polls get NOT_COORDINATOR) but keeps its state
        and timers until etcd renews the lease or says it is gone (``doubt_drops``: the
        behaviour before, it unloads at once)."""
        sim = self.sim
        sc = sim.scenario
        if not sim.multi or not sc.lease_checked or not self.owner:
            return True
        if sim.now < self.lease_sent + sc.lease_ttl_ms - sc.lease_margin_ms:
            return True
        if sc.doubt_drops:
            self.unload(f"its lease may have expired (last renewal sent at t={self.lease_sent})")
            return False
        if not self.in_doubt:
            self.in_doubt = True
            sim.trace("lease_in_doubt", detail=f"{self.node}: last renewal sent at t={self.lease_sent}")
            queued, self.queue = self.queue, deque()
            for ev in queued:
                if ev[0] == "req":
                    self.sim.net_response(ev[1], ev[2], error_response(
                        ev[2].request, E.NOT_COORDINATOR, sim.now))
                else:  # timers and probes wait for the lease
                    self.queue.append(ev)
            parked, self.parked = self.parked, {}
            for key in sorted(parked):
                pk = parked[key]
                self.sim.net_response(pk.conn, pk.pending, error_response(
                    pk.request, E.NOT_COORDINATOR, sim.now))
        return False

    def start_lease(self) -> None:
        self.lease_sent = self.sim.now
        self._arm_lease_check()
        self.at(self.sim.now + self.sim.scenario.lease_ttl_ms // 3, self._renew, self.inc)

    def _arm_lease_check(self) -> None:
        """When the lease can no longer be proven valid (no renewal since), unload at once: the
        parked long polls are answered NOT_COORDINATOR then, not when they time out."""
        sc = self.sim.scenario
        due = max(self.sim.now, self.lease_sent + sc.lease_ttl_ms - sc.lease_margin_ms)
        self.at(due, self._lease_check, self.inc, self.lease_sent)

    def _lease_check(self, inc: int, sent: int) -> None:
        if inc == self.inc and self.up and self.lease_sent == sent:
            self.lease_ok()

    def _renew(self, inc: int) -> None:
        sim = self.sim
        if inc != self.inc or not self.up or not self.owner:
            return
        sim.at(sim.now + sim.etcd_latency(), sim.etcd_renew, self, sim.now)
        # In doubt, NodeLease retries every 100 ms (a hedged attempt each time).
        every = sim.scenario.lease_ttl_ms // 3
        self.at(sim.now + (min(100, every) if self.in_doubt else every), self._renew, inc)

    def renewed(self, inc: int, sent: int, ok: bool) -> None:
        if inc != self.inc or not self.up or not self.owner:
            return
        if ok:
            if sent > self.lease_sent:
                self.lease_sent = sent
                self._arm_lease_check()
                sc = self.sim.scenario
                if self.in_doubt and self.sim.now < sent + sc.lease_ttl_ms - sc.lease_margin_ms:
                    self.in_doubt = False
                    self.sim.trace("lease_renewed_again", detail=f"{self.node}: the same state serves again")
                    self.kick()
        elif self.sim.scenario.lease_checked:
            self.unload("etcd says its lease expired")

    # -- input -----------------------------------------------------------------------------------------
    def receive(self, conn: Conn, pending: Pending) -> None:
        if not self.up or conn.coord_inc != self.inc or conn.state != "open":
            return
        if self.frozen:  # in its socket until it wakes
            self.deferred.append((0, self.receive, (conn, pending)))
            return
        if not self.owner or self.handing_over or not self.lease_ok():
            self.respond(conn, pending, error_response(pending.request, E.NOT_COORDINATOR, self.sim.now))
            return
        self.queue.append(("req", conn, pending))
        self.kick()

    def kick(self) -> None:
        if not self.busy and self.queue and self.up:
            self.busy = True
            self.at(self.sim.now, self._drain, self.inc)

    # -- the batch: handlers, fsync, release --------------------------------------------------------------
    def _drain(self, inc: int) -> None:
        if inc != self.inc or not self.up:
            return
        if not self.owner or not self.lease_ok():
            self.busy = False
            return
        sim = self.sim
        batch = [self.queue.popleft() for _ in range(min(MAX_DRAIN, len(self.queue)))]
        pending: list[tuple[tuple[Any, ...], Result]] = []
        for ev in batch:
            result = self._apply(ev)
            if result is not None:
                pending.append((ev, result))
        if any(r.records for _, r in pending):
            if self.freeze_armed is not None:  # deposed_late_write: frozen before the commit is sent
                duration, self.freeze_armed = self.freeze_armed, None
                sim.trace("owner_frozen", detail=f"{self.node} for {duration} ms with a write of "
                          f"{sum(len(r.records) for _, r in pending)} records in flight")
                sim.freeze_node(self.node, sim.now + duration)
            self.at(sim.now + sim.sample(sim.rng_coord, sim.scenario.fsync_ms), self._commit, inc, pending)
        else:
            self._commit(inc, pending)

    def _apply(self, ev: tuple[Any, ...]) -> Result | None:
        sim = self.sim
        kind = ev[0]
        now = sim.now
        try:
            if kind == "req":
                conn, pend = ev[1], ev[2]
                req = pend.request
                if self.loading:
                    self.respond(conn, pend, error_response(req, E.COORDINATOR_LOAD_IN_PROGRESS, now))
                    return None
                if isinstance(req, ConnectGroupHeartbeatRequest):
                    result = self.core.heartbeat(req, now)
                elif isinstance(req, ConnectGroupPrepareAssignmentRequest):
                    result = self.core.prepare_assignment(req, now)
                elif isinstance(req, ConnectGroupInstallAssignmentRequest):
                    result = self.core.install_assignment(req, now)
                elif isinstance(req, ConnectGroupAlterConnectorsRequest):
                    result = self.core.alter_connectors(req, now)
                else:  # pragma: no cover - the simulation sends nothing else
                    raise AssertionError(f"unexpected request {type(req).__name__}")
            elif kind == "timer":
                result = self.core.on_timer(ev[1], now)
            elif kind == "probe":
                key, parked, probe = ev[1], ev[2], ev[3]
                result = Result() if self.parked.get(key) is not parked else self.core.heartbeat(probe, now)
            elif kind == "loaded":
                result = self.core.on_loaded(now)
            else:  # pragma: no cover
                raise AssertionError(kind)
        except Exception as exc:  # strict core: an internal error is a bug
            sim.violate(f"coordinator raised {exc!r} handling {kind}")
            return None
        if result.records and sim.faulty() and sim.rng_coord.random() < sim.scenario.append_fail:
            self.core.rollback(result)
            sim.trace("log_append_failed", detail=f"{kind}: {len(result.records)} records rolled back")
            self._failed(ev)
            return None
        return result

    def _failed(self, ev: tuple[Any, ...], code: int = E.COORDINATOR_NOT_AVAILABLE) -> None:
        kind = ev[0]
        if kind == "req":
            self.respond(ev[1], ev[2], error_response(ev[2].request, code, self.sim.now))
        elif kind == "probe":
            parked = ev[2]
            parked.refreshing = False
            if parked.expired and self.parked.get(ev[1]) is parked:
                self._release(ev[1])
        elif kind == "timer" and self.owner:
            # As the shard does (and Kafka's retry=true timers): a timer whose write failed is
            # tried again shortly, unless something re-armed it meanwhile.
            key = ev[1]
            if key not in self.timers:
                deadline = self.sim.now + TIMER_RETRY_MS
                self.timers[key] = deadline
                self.at(deadline, self._fire, self.inc, key, deadline)

    def _commit(self, inc: int, pending: list[tuple[tuple[Any, ...], Result]]) -> None:
        if inc != self.inc or not self.up:
            return
        sim = self.sim
        wrote = any(r.records for _, r in pending)
        if wrote and sim.faulty() and sim.rng_coord.random() < sim.scenario.fsync_fail:
            sim.trace("log_fsync_failed", detail=f"{len(pending)} results rolled back")
            for _, result in reversed(pending):
                self.core.rollback(result)
            for ev, _ in pending:
                self._failed(ev)
            self._after_batch(wrote)
            return
        if wrote and sim.multi and sim.etcd_cut(self):
            # Cut off from etcd: the transaction goes out when the connection is back (etcd3aio
            # reconnects), then is fenced like any other.
            self.at(sim.etcd_cut(self) + sim.etcd_latency(), self._commit, inc, pending)
            return
        if wrote:
            records = [record for _, result in pending for record in result.records]
            if not sim.store_write(self, records):
                # Deposed: etcd refused the transaction (the owner key's revision changed) and
                # applied none of it. Unload; nothing of the batch is answered but NOT_COORDINATOR.
                sim.trace("write_refused", detail=f"{self.node}: {len(records)} records, fenced "
                          f"(token {self.token}, the owner's is {sim.store.token})")
                self.unload("deposed: its write was refused")
                for ev, _ in pending:
                    self._failed(ev, E.NOT_COORDINATOR)
                self._after_batch(False)
                return
        serving = self.owner and not self.handing_over
        answering = serving and not self.in_doubt  # in doubt: applied, answered NOT_COORDINATOR
        wake: set[tuple[str, str]] = set()
        for ev, result in pending:
            if serving:
                for op in result.timers:
                    if op.deadline_ms is None:
                        self.timers.pop(op.key, None)
                    else:
                        self.timers[op.key] = op.deadline_ms
                        self.at(max(sim.now, op.deadline_ms), self._fire, self.inc, op.key, op.deadline_ms)
                wake |= result.wake
            if result.records and self is sim.coord:
                sim.on_records(result.records)
            kind = ev[0]
            if kind == "req":
                req = ev[2].request
                if isinstance(req, ConnectGroupHeartbeatRequest) and answering:
                    self._heartbeat_committed(ev[1], ev[2], result.response)
                else:
                    self.respond(ev[1], ev[2], result.response)
            elif kind == "probe":
                key, parked, probe = ev[1], ev[2], ev[3]
                parked.refreshing = False
                if self.parked.get(key) is parked and (
                        parked.expired or not _quiet(probe, result.response)):
                    del self.parked[key]
                    self.respond(parked.conn, parked.pending, result.response)
        for key in sorted(wake):
            self._refresh(key)
        self._after_batch(wrote)

    def _after_batch(self, wrote: bool) -> None:
        self.batches += 1
        self.sim.check_coordinator(self, wrote)
        self.busy = False
        if self.handing_over:
            self._release_ownership()
            return
        self.kick()

    # -- timers ---------------------------------------------------------------------------------------
    def _fire(self, inc: int, key: Any, deadline: int) -> None:
        if inc != self.inc or not self.up or self.timers.get(key) != deadline:
            return
        del self.timers[key]
        self.queue.append(("timer", key))
        self.kick()

    # -- long poll (shard._heartbeat_committed and friends) ----------------------------------------------
    def _heartbeat_committed(self, conn: Conn, pend: Pending, resp: Any) -> None:
        req = pend.request
        key = (req.group_id, req.member_id)
        previous = self.parked.pop(key, None)
        if previous is not None:
            self.respond(previous.conn, previous.pending, previous.response)
        wait = req.max_wait_ms
        if wait <= 0 or not _quiet(req, resp):
            self.respond(conn, pend, resp)
            return
        g = self.core.group(req.group_id)
        session_ms, interval_ms = self.core.config.for_group(g.configs if g else {})
        wait = min(wait, max(0, session_ms - interval_ms))
        if wait <= 0:
            self.respond(conn, pend, resp)
            return
        parked = Parked(conn, pend, req, resp)
        self.parked[key] = parked
        self.at(self.sim.now + wait, self._parked_timeout, self.inc, key, parked)

    def _release(self, key: tuple[str, str]) -> None:
        parked = self.parked.pop(key, None)
        if parked is not None:
            self.respond(parked.conn, parked.pending, parked.response)

    def _parked_timeout(self, inc: int, key: tuple[str, str], parked: Parked) -> None:
        if inc != self.inc or self.parked.get(key) is not parked:
            return
        if parked.refreshing:
            parked.expired = True
            return
        self._release(key)

    def _refresh(self, key: tuple[str, str]) -> None:
        parked = self.parked.get(key)
        if parked is None or parked.refreshing or self.loading:
            return
        parked.refreshing = True
        req = parked.request
        probe = req if req.member_epoch == 0 else ConnectGroupHeartbeatRequest(
            group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch)
        self.queue.append(("probe", key, parked, probe))
        self.kick()

    # -- output -----------------------------------------------------------------------------------------
    def respond(self, conn: Conn, pend: Pending, resp: Any) -> None:
        """The answer leaves the node, unless it is no longer the owner (or its lease may have
        expired): then it answers NOT_COORDINATOR instead (errors go out as they are)."""
        if resp.error_code == 0 and (not self.owner or not self.lease_ok()):
            resp = error_response(pend.request, E.NOT_COORDINATOR, self.sim.now)
        self.sim.net_response(conn, pend, resp)

    # -- unloading, handover -----------------------------------------------------------------------
    def _refuse_pending(self, code: int) -> None:
        """Answer ``code`` to every request not handled yet and to every parked long poll; drop the
        timers and probes (a batch in flight still commits or fails on its own)."""
        queued, self.queue = self.queue, deque()
        for ev in queued:
            if ev[0] == "req":
                self.sim.net_response(ev[1], ev[2], error_response(ev[2].request, code, self.sim.now))
        parked, self.parked = self.parked, {}
        for key in sorted(parked):
            p = parked[key]
            self.sim.net_response(p.conn, p.pending, error_response(p.request, code, self.sim.now))
        self.timers.clear()

    def unload(self, why: str) -> None:
        """No longer the owner (deposed, lease lost): NOT_COORDINATOR to everything from now on."""
        if not self.owner:
            return
        self.owner = False
        self.sim.trace("coordinator_unload", detail=f"{self.node}: {why}")
        self._refuse_pending(E.NOT_COORDINATOR)
        if self.handing_over:
            self.handing_over = False
            then, self._then = self._then, None
            if then is not None:
                then()

    def hand_over(self, then: Callable[[], None]) -> bool:
        """Graceful handover: NOT_COORDINATOR to what is not handled yet and to the parked long
        polls, the batch in flight commits (its answers go out), then the ownership is released
        and ``then`` runs (the next owner acquires)."""
        if not self.up or not self.owner or self.handing_over:
            return False
        self.handing_over = True
        self._then = then
        self.sim.trace("handover_begin", detail=f"{self.node}")
        self._refuse_pending(E.NOT_COORDINATOR)
        if not self.busy:
            self._release_ownership()
        return True

    def _release_ownership(self) -> None:
        self.handing_over = False
        self.owner = False
        self.sim.store.release(self.token)
        self.sim.trace("ownership_released", detail=f"{self.node}")
        then, self._then = self._then, None
        if then is not None:
            then()

    # -- crash and restart ------------------------------------------------------------------------------
    def crash(self) -> None:
        sim = self.sim
        self.up = False
        self.owner = False
        self.handing_over = False
        self._then = None
        self.inc += 1
        self.queue.clear()
        self.parked.clear()
        self.timers.clear()
        self.deferred = []
        self.frozen_until = 0
        self.busy = False
        self.core = None  # type: ignore[assignment]
        for conn in sim.all_conns():
            if conn.node is self:
                sim.reset_conn(conn, "coordinator crashed")

    def restart(self) -> None:
        """The same node again (the file store): everything uncommitted is lost; load the log."""
        self.up = True
        self.owner = True
        self.load()

    def load(self) -> None:
        sim = self.sim
        self.loading = True
        self.core = self._new_core()
        try:
            for record in sim.store.log.values():
                self.core.replay(record)
            check_invariants(self.core.state, self.epochs)
        except Exception as exc:  # InvariantViolation, or a ReplayError (the records contradict)
            sim.violate(f"state replayed from the log breaks invariants: {exc}")
            return
        sim.check_store(f"{self.node} loading")
        self.epochs = epochs(self.core.state)
        sim.trace("coordinator_loading", detail=(f"{self.node}: " if sim.multi else "")
                  + f"{len(sim.store.log)} records")
        self.at(sim.now + sim.sample(sim.rng_coord, sim.scenario.load_ms), self._loaded, self.inc)

    def _loaded(self, inc: int) -> None:
        if inc != self.inc or not self.owner:
            return
        self.loading = False
        self.queue.appendleft(("loaded",))
        self.sim.trace("coordinator_loaded", detail=self.node if self.sim.multi else "")
        self.kick()


def error_response(req: Any, code: int, now: int) -> Any:
    """What the daemon answers a request it cannot handle (retriable errors)."""
    if isinstance(req, ConnectGroupHeartbeatRequest):
        return ConnectGroupHeartbeatResponse(
            error_code=code, error_message=None, member_id=None, member_epoch=req.member_epoch,
            heartbeat_interval_ms=0, should_compute_assignment=False)
    if isinstance(req, ConnectGroupPrepareAssignmentRequest):
        return ConnectGroupPrepareAssignmentResponse(
            error_code=code, error_message=None, group_epoch=-1, assignment_epoch=-1,
            assignor_name="", coordinator_time_ms=now, assignor_state=b"")
    if isinstance(req, ConnectGroupInstallAssignmentRequest):
        return ConnectGroupInstallAssignmentResponse(error_code=code, error_message=None)
    return ConnectGroupAlterConnectorsResponse(error_code=code, error_message=None, group_epoch=-1)


# == workers ================================================================================================

RETRY_COORDINATOR = (E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE)
LEAVE_RETRY = (E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR)
STOP_POLL_MS = 20
"""worker.stop() polls every 20 ms for the drain to finish."""
TIMER_RETRY_MS = 500
CONNECT_TIMEOUT_MS = 2_000
"""CoordinatorClient's TCP connect timeout."""


class SimWorker:
    """A model of worker_client/worker.py (its structure, step by step) around the real
    Membership and assignor.

    * The main loop sends the heartbeat Membership asks for; Revoke and Assign actions queue
      (``pending``) and run one at a time as the *acting* task while the loop keeps sending
      plain keepalive heartbeats; a Lost is carried out by the loop itself (it waits); Compute
      runs in the background.
    * Revoke stops the items (each a sampled stop, in parallel) and then reports them; Assign
      fetches the configs (one round trip), creates the instances (they run from then on and
      are *up* after a sampled start) and reports them started.
    * The fail-stop rule (issue 15), with B the stop budget (:attr:`stop_deadline`, half the
      rebalance timeout, at least 100 ms): an instance counts as stopped only when its run has
      ended and its stop() returned or raised within B of its stop's beginning. One that is not
      (a stop that overruns or hangs, a run() that ignores cancellation) ends the *process* at
      its stop's beginning + B (:meth:`_fail_stop`): everything it ran stops then, and nothing
      waiting for that stop ever reports the item released. The *lease backstop*, a guard thread
      in the real worker, ends the process at ``last_success_ms + session + B`` if an instance
      still runs or stops then; it is a process event here (frozen with a paused process, fired
      when it wakes if overdue). A fail-stopped process is started again by its supervisor after
      1-5 s (``rng_supervisor``); one being stopped for good stays down, one being bounced comes
      back after the bounce's downtime.
    * The watchdog fires at exactly ``last_success_ms + session timeout`` (``check_session``).
    * A graceful stop is ``worker.stop()`` (:meth:`graceful_stop`): a Revoke of everything,
      carried out by the loop while it keeps heartbeating, then the loop ends and the worker
      leaves.
    """

    def __init__(self, sim: Simulation, slot: int) -> None:
        self.sim = sim
        self.slot = slot
        self.name = f"w{slot:03d}"
        self.inc = 0
        self.alive = False
        self.leaving = False
        self.failed = False
        self.m: Membership = None  # type: ignore[assignment]
        self.runs: dict[Item, Run] = {}  # the instances (worker.instances)
        self.stopping: dict[Item, Run] = {}
        self.conns: dict[str, Conn | None] = {"hb": None, "ctl": None}
        self.failures = 0
        self.coordinator_known = False
        self.pending: deque[Any] = deque()
        self.acting: Any = None  # the Revoke/Assign in progress
        self.acting_done = False
        self.acting_until = 0  # when it will be done (known when it starts)
        self.blocked = False  # the loop awaits a Lost or a sweep
        self.leave_restart: int | None = None
        self.leave_started = False
        self.draining = False  # stop() called: its revocation of everything drains through the loop
        self.drain_deadline = 0
        self.stop_set = False  # stop() set worker._stop: the loop ends (no more heartbeats)
        self.loop_exited = False  # the loop left its while: watchdog and computation cancelled
        self.queue: deque[Any] = deque()  # actions of the last response still to handle
        self.hb: Pending | None = None
        self.computing = False
        self.step_at: int | None = None
        self.wd_at: int | None = None
        self.paused_until = 0
        self.deferred: list[tuple[int, Callable[..., None], tuple[Any, ...]]] = []
        self.pause_began = -1
        self.pause_lease_expired = False
        self.resumed_at = -1
        self.part_start = 0
        self.part_end = 0
        self.slow_until = 0
        self.stop_mode = "slow"
        """How stops misbehave until ``slow_until``: ``slow`` (a slow_revocation: 1-2x the
        rebalance timeout, past the budget), ``long`` (a slow_bounce: 2/3 to all of the budget)
        or a bad_stops fault's plugin behaviour (``slow_stop``, ``hanging_stop``,
        ``raising_stop``, ``ignores_cancel``: see _stop_items)."""
        self.backstop_at: int | None = None
        self.zombie_limit = INF  # after a pause: the excuse of its overlaps ends here
        self.lost_gen = 0  # worker._lost_gen: bumped when the watchdog fences; a fetch begun before is stale

    # -- events of this process: dropped after it ends, deferred while it is paused ----------------------
    def at(self, t: int, fn: Callable[..., None], *args: Any, io: bool = False) -> None:
        self.sim.at(t, self._event, self.inc, io, fn, args)

    def _event(self, inc: int, io: bool, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if inc != self.inc or not self.alive:
            return
        if self.sim.now < self.paused_until:
            self.deferred.append((0 if io else 1, fn, args))
            return
        fn(*args)

    @property
    def paused(self) -> bool:
        return self.sim.now < self.paused_until

    @property
    def stop_deadline(self) -> int:
        return max(100, self.sim.scenario.rebalance_timeout_ms // 2)

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        sim, sc = self.sim, self.sim.scenario
        self.inc += 1
        self.alive = True
        self.leaving = False
        self.draining = False
        self.stop_set = False
        self.loop_exited = False
        self.pending.clear()
        self.queue.clear()
        self.acting = None
        self.acting_done = False
        self.blocked = False
        self.hb = None
        self.computing = False
        self.step_at = None
        self.wd_at = None
        self.failures = 0
        self.coordinator_known = False
        self.conns = {"hb": None, "ctl": None}
        self.paused_until = 0
        self.deferred = []
        self.pause_began = -1
        self.pause_lease_expired = False
        self.backstop_at = None
        self.assignor = (EagerAssignor() if sim.assignor == "eager"
                         else IncrementalCooperativeAssignor(max_delay_ms=sc.max_delay_ms))
        meta = self.assignor.metadata()
        self.m = Membership(
            group_id=GROUP,
            assignors=[AssignorAd(self.assignor.name, self.assignor.minimum_version,
                                  self.assignor.maximum_version, meta.reason, meta.version, meta.data)],
            rebalance_timeout_ms=sc.rebalance_timeout_ms,
            member_id=self.name if sc.identity == "member_id" else "",
            instance_id=self.name if sc.identity == "static" else None,
            long_poll=sc.long_poll, session_timeout_ms=sc.session_timeout_ms,
        )
        self.m.join(sim.now)
        sim.trace("worker_start", self.name, detail=f"incarnation {self.inc}")
        self.wake()

    def crash(self) -> None:
        """The process dies: everything it ran stops now; its connections reset."""
        if not self.alive:
            return
        self.sim.trace("worker_crash", self.name, detail=f"{len(self.runs)} items")
        self._shutdown()

    def _shutdown(self) -> None:
        now = self.sim.now
        for item in sorted(self.runs):  # the process ends: whatever still runs stops with it
            self.sim.run_stopped(self.runs[item], now, now)
        self.runs = {}
        for run in self.stopping.values():  # ... including instances still stopping
            if run.end is not None and run.end > now:
                run.end = now
        self.stopping = {}
        self.alive = False
        self.inc += 1
        for conn in list(self.conns.values()):
            if conn is not None:
                self.sim.reset_conn(conn, "worker process ended", notify=False)
        self.conns = {"hb": None, "ctl": None}

    def _fail_stop(self, reason: str) -> None:
        """The fail-stop rule (issue 15): an instance that is not stopped within the stop budget
        of its stop's beginning, or anything still running or stopping at the lease's end plus the
        budget, ends the *process* (a critical log line, exit status 3): everything it ran stops
        at this instant and no such item is ever reported released. Its supervisor (systemd,
        Kubernetes) starts it again after 1-5 s; a process that was being stopped for good (a
        leave) stays down, one being bounced comes back after the bounce's downtime."""
        sim = self.sim
        sim.fail_stops += 1
        sim.trace("fail_stop", self.name, detail=f"{reason}; {len(self.runs)} items still run, "
                  f"{sum(1 for r in self.stopping.values() if r.end is not None and r.end > sim.now)}"
                  " stopping")
        leaving, restart_after = self.leaving, self.leave_restart
        self._shutdown()
        if leaving:
            if restart_after is not None:
                sim.at(sim.now + restart_after, sim.restart_worker, self)
        else:
            sim.at(sim.now + sim.rng_supervisor.randint(1_000, 5_000), sim.restart_worker, self)

    # -- the lease backstop: the fail-stop guard thread ----------------------------------------------
    def arm_backstop(self) -> None:
        """The guard ends the process at ``last_success_ms + session + budget`` if an instance
        still runs or stops then. A thread, so a blocked event loop does not delay it, but frozen
        with the process: a process event (deferred while paused, fired on resume if overdue)."""
        last = self.m.last_success_ms
        if last is None:
            return
        due = last + self.sim.scenario.session_timeout_ms + self.stop_deadline
        if self.backstop_at is not None and self.backstop_at <= due:
            return  # that one looks again (the lease moved on)
        self.backstop_at = due
        self.at(max(due, self.sim.now), self._backstop, due)  # (overdue: a heartbeat sent long ago)

    def _backstop(self, due: int) -> None:
        if self.backstop_at != due:
            return
        self.backstop_at = None
        self._check_backstop()

    def _check_backstop(self) -> None:
        last = self.m.last_success_ms
        if last is None:
            return
        now = self.sim.now
        lease_end = last + self.sim.scenario.session_timeout_ms
        due = lease_end + self.stop_deadline
        if due > now:
            if self.backstop_at is None or self.backstop_at > due:
                self.backstop_at = due
                self.at(due, self._backstop, due)
            return
        if self.runs or any(r.end is not None and r.end > now for r in self.stopping.values()):
            self._fail_stop(f"lease backstop: lease ended at t={lease_end}, budget "
                            f"{self.stop_deadline} ms")

    def graceful_stop(self, restart_after: int | None) -> None:
        """worker.stop(), as fixed in 3be3f0b ("stop-without-session"): the work is stopped *through
        the loop*, which keeps heartbeating (and the watchdog keeps watching) meanwhile:

        1. drain: ``_draining``; a Revoke of everything that runs or is owned is queued behind
           what is pending and carried out by the loop as its acting task (stopping whatever
           runs then, owned or still starting); Assigns are ignored and no computation starts
           meanwhile. stop() polls every 20 ms until nothing runs, nothing is pending and
           nothing is acting, or twice the stop deadline plus 2 s have passed;
        2. ``_stop.set()``: the heartbeat in flight is cancelled and the loop ends (it finishes a
           Lost or a sweep first, then cancels the watchdog and the computation and lets a start
           or stop in progress finish); stop() waits for that at most twice the stop deadline
           plus 2 s;
        3. whatever still runs is stopped (no heartbeats any more);
        4. leave (-2 for a static member, else -1), retried up to 3 times after a backoff when
           the connection failed or the answer was COORDINATOR_NOT_AVAILABLE,
           COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR; then the process exits.

        A paused (stop-the-world) process begins this when it wakes."""
        if not self.alive or self.leaving:
            return
        self.leaving = True
        self.leave_restart = restart_after
        self.leave_started = False
        if self.paused:
            self.deferred.append((1, self._begin_stop, ()))
        else:
            self._begin_stop()

    def _begin_stop(self) -> None:
        sim = self.sim
        sim.trace("worker_stop", self.name, detail=f"{len(self.runs)} items")
        self.draining = True
        self.pending.append(Revoke(frozenset(self.runs) | self.m.owned))
        self.drain_deadline = sim.now + 2 * self.stop_deadline + 2_000
        self.at(sim.now + STOP_POLL_MS, self._drain_poll)
        self.wake()

    def _drain_poll(self) -> None:
        """stop()'s ``while ... await asyncio.sleep(0.02)``."""
        if self.stop_set:
            return
        if self.sim.now < self.drain_deadline and (
                self.runs or self.pending or self.acting is not None):
            if self.runs and not self.pending and self.acting is None:
                # worker.stop(): what started after the first Revoke (an Assign that was
                # fetching its configs) is drained by another one ("stop-during-assign").
                self.pending.append(Revoke(frozenset(self.runs) | self.m.owned))
                self.wake()
            self.at(self.sim.now + STOP_POLL_MS, self._drain_poll)
            return
        self.stop_set = True
        if self.hb is not None:  # the heartbeat in flight is cancelled
            self.hb.ignore = True
            self.hb = None
        self.sim.trace("worker_stop_loop", self.name,
                       detail=f"{len(self.runs)} items still run" if self.runs else "drained")
        self.at(self.sim.now + 2 * self.stop_deadline + 2_000, self._loop_ended, True)
        self._loop_ended()

    def _loop_ended(self, timed_out: bool = False) -> None:
        """The loop ends once a Lost or a sweep it awaits is done: it cancels the watchdog and the
        computation, then lets a start or stop in progress finish; stop() waits for all that at
        most twice the stop deadline plus 2 s (``timed_out``), then stops what still runs."""
        if not self.stop_set or self.leave_started:
            return
        if not timed_out and self.blocked:
            return  # the loop finishes that first
        if not self.loop_exited:
            self.loop_exited = True
            self.wd_at = None  # watchdog.cancel()
            self.computing = False  # self._compute.cancel()
        if not timed_out and self.acting is not None and not self.acting_done:
            return  # _settle_acting
        self.leave_started = True
        self._stop_all_and_leave(self.leave_restart)

    def _stop_all_and_leave(self, restart_after: int | None) -> None:
        done = self._stop_items(frozenset(self.runs), slow_ok=True)
        self.at(done, self._leave, restart_after, 0)

    def _leave(self, restart_after: int | None, attempt: int) -> None:
        m = self.m
        if not m.member_id:
            self._exit(restart_after)
            return
        req = m.leave_request(static=m.instance_id is not None)

        def ok(resp: Any) -> None:
            if resp.error_code in RETRY_COORDINATOR:
                self.invalidate()  # the client does, on any answer with these codes
            if resp.error_code in LEAVE_RETRY:
                retry(f"error {resp.error_code}")
            else:
                self._exit(restart_after)

        def retry(why: str) -> None:
            self.sim.trace("leave_failed", self.name, detail=f"attempt {attempt + 1}: {why}")
            if attempt < 3:
                self.at(self.sim.now + self.backoff(), self._leave, restart_after, attempt + 1)
            else:
                self._exit(restart_after)

        self.send("ctl", req, ok, retry)

    def _exit(self, restart_after: int | None) -> None:
        self.m.left()
        self.sim.trace("worker_left", self.name)
        self._shutdown()
        if restart_after is not None:
            self.sim.at(self.sim.now + restart_after, self.sim.restart_worker, self)

    def pause(self, duration: int) -> None:
        sim = self.sim
        if not self.alive:
            return
        if not self.paused:
            self.pause_began = sim.now
        self.paused_until = max(self.paused_until, sim.now + duration)
        sim.trace("worker_pause", self.name, detail=f"{duration} ms")
        sim.at(self.paused_until, self._resume, self.inc)

    def _resume(self, inc: int) -> None:
        sim = self.sim
        if inc != self.inc or not self.alive or sim.now < self.paused_until:
            return
        sim.trace("worker_resume", self.name)
        last = self.m.last_success_ms
        self.pause_lease_expired = last is None or last + sim.scenario.session_timeout_ms <= sim.now
        self.resumed_at = sim.now
        deferred = sorted(self.deferred, key=lambda d: d[0])  # buffered input first, then timers
        self.deferred = []
        for _, fn, args in deferred:
            if inc != self.inc or not self.alive:
                return
            fn(*args)
        sim.after_resume(self)

    # -- the main loop -----------------------------------------------------------------------------------
    def wake(self) -> None:
        self.schedule_step(self.sim.now)

    def schedule_step(self, t: int) -> None:
        if self.step_at is not None and self.step_at <= t:
            return
        self.step_at = t
        self.at(t, self._step, t)

    def _step(self, t: int) -> None:
        if self.step_at != t:
            return
        self.step_at = None
        if self.blocked or self.hb is not None or self.stop_set or self.failed or self.queue:
            return
        m = self.m
        sim = self.sim
        now = sim.now
        if m.state == State.FAILED:
            self.failed = True
            sim.violate(f"{self.name} failed: {m.failure}")
            return
        if self.acting is not None and self.acting_done:
            self.acting = None
            self.acting_done = False
            strays = frozenset(self.runs) - m.owned - m.assigned
            if strays:  # _sweep: instances started after a Lost had stopped everything
                sim.trace("sweep", self.name, detail=_items_detail(strays))
                self._block_until(self._stop_items(strays))
                return
        if self.acting is None and self.pending:
            self._begin_acting(self.pending.popleft())
        busy = self.acting is not None
        if not m.heartbeat_due(now, keepalive=busy):
            if not m.stopping_lost and m.state in (State.JOINING, State.RECONCILING, State.STABLE):
                self.schedule_step(max(now + 1, m.next_due_ms(busy)))
            return
        req = m.heartbeat_request(now, keepalive=busy)
        sim.trace("heartbeat", self.name, epoch=req.member_epoch,
                  detail=("full" if req.client_assignors is not None else "")
                  + (" keepalive" if busy else ""))
        timeout = self.heartbeat_answer_budget + req.max_wait_ms
        self.hb = self.send("hb", req, self._on_heartbeat, self._on_heartbeat_failed, timeout)

    def _block_until(self, t: int) -> None:
        self.blocked = True
        self.at(t, self._unblock)

    def _unblock(self) -> None:
        self.blocked = False
        if self.stop_set:
            self._loop_ended()
            return
        self._handle_queue()

    def _on_heartbeat(self, resp: Any) -> None:
        sim = self.sim
        self.hb = None
        m = self.m
        before = m.member_epoch
        actions = m.on_response(resp, sim.now)
        if resp.error_code == 0:
            self.arm_watchdog()
            self.arm_backstop()
            if 0 < m.member_epoch < before:
                sim.violate(f"{self.name}: member epoch went back {before} -> {m.member_epoch}")
        sim.trace("heartbeat_response", self.name, epoch=m.member_epoch,
                  detail=_response_detail(resp, actions))
        if resp.error_code in RETRY_COORDINATOR:
            self.invalidate()
        if resp.error_code in MEMBERSHIP_RETRY:  # (retried after min(interval, 1 s)): within the lease
            m.next_heartbeat_ms = sim.now + self.retry_delay(max(0, m.next_heartbeat_ms - sim.now))
        self.queue.extend(actions)
        self._handle_queue()

    def _handle_queue(self) -> None:
        """The loop's ``for action in m.on_response(...)``: queue Revoke/Assign, do the rest."""
        sim = self.sim
        while self.queue and not self.blocked:
            action = self.queue.popleft()
            if isinstance(action, Revoke | Assign):
                self.pending.append(action)
            elif isinstance(action, Lost):
                sim.trace("lost", self.name, detail=f"{action.reason}; {_items_detail(action.items)}")
                self._lose(action, block=True)
            elif isinstance(action, Compute):
                if not self.computing and not self.draining:  # no computation while stopping
                    self._compute()
            elif isinstance(action, Fatal):
                sim.trace("fatal", self.name, detail=action.message)
        if not self.blocked:
            sim.worker_settled(self)
            self.wake()

    def _on_heartbeat_failed(self, why: str) -> None:
        self.hb = None
        self.m.on_failure(self.sim.now, self.retry_delay(self.backoff()))
        self.sim.trace("heartbeat_failed", self.name, detail=why)
        self.wake()

    # -- the acting task: one Revoke or Assign at a time ---------------------------------------------
    def _begin_acting(self, action: Any) -> None:
        sim = self.sim
        m = self.m
        self.acting = action
        self.acting_done = False
        if isinstance(action, Revoke):
            # What is still owned (when draining for stop(): everything that runs, owned or
            # still starting).
            items = action.items & (m.owned | frozenset(self.runs) if self.draining else m.owned)
            sim.trace("revoke", self.name, epoch=m.member_epoch,
                      detail=_items_detail(items) + (" (stopping)" if self.draining else ""))
            done = self._stop_items(items) if items else sim.now
            self.acting_until = done
            self.at(done, self._acting_finished, action, items)
        elif self.draining:  # stop() in progress: nothing new starts; the leave releases it
            sim.trace("assign_ignored", self.name, epoch=m.member_epoch,
                      detail=_items_detail(action.items))
            self.acting_until = sim.now
            self.at(sim.now, self._acting_finished, action, frozenset())
        else:
            items = action.items & m.assigned - m.owned
            if items and m.lease_expired(sim.now):  # worker._act: a stale assignment never starts
                sim.trace("assign_lease_expired", self.name, epoch=m.member_epoch,
                          detail=_items_detail(items))
                items = frozenset()
            sim.trace("assign", self.name, epoch=m.member_epoch, detail=_items_detail(items))
            # _start_items: the connectors' configs first (Describe, one round trip), then the
            # instances are created; their plugins start in the background.
            done = sim.now + (sim.latency() + sim.latency() if items else 0)
            self.acting_until = done
            self.at(done, self._assign_configs_fetched, action, items, self.lost_gen)

    def _assign_configs_fetched(self, action: Any, items: frozenset[Item], gen: int) -> None:
        m = self.m
        if items and (gen != self.lost_gen or m.lease_expired(self.sim.now)):
            # worker._start_items (2c5adb5): configs that come back after the session lease
            # ended (or after a Lost) start nothing (found by the sweep too: a worker frozen
            # during the fetch woke past its lease and started items given away meanwhile).
            self.sim.trace("assign_lease_expired", self.name, epoch=m.member_epoch,
                           detail="configs fetched after the lease ended: " + _items_detail(items))
            items = frozenset()
        items &= m.assigned
        self._start_items(items)
        self._acting_finished(action, items)

    def _acting_finished(self, action: Any, items: frozenset[Item]) -> None:
        now = self.sim.now
        if items:
            if isinstance(action, Revoke):
                self.m.revoked(items, now)
            else:
                self.m.assigned_started(items, now)
        self.acting_done = True
        if self.stop_set:
            self._loop_ended()
            return
        self.sim.worker_settled(self)
        self.wake()

    # -- lost: everything stops -----------------------------------------------------------------------
    def _lose(self, lost: Lost, block: bool) -> None:
        """worker._act(Lost): stop every instance and what was reported; if a start or stop is in
        progress, let it finish (bounded) and stop what it started; then report. ``block``: the
        loop awaits this (a fenced response), else the watchdog runs it beside the loop."""
        self.pending.clear()
        now = self.sim.now
        if block:
            self.blocked = True
        done = self._stop_items(frozenset(self.runs) | lost.items)
        if self.acting is not None and not self.acting_done:
            settle = min(self.acting_until, now + 2 * self.stop_deadline + 1_000)
            self.at(max(done, settle), self._lose_settled, lost, block)
        else:
            self.at(done, self._lost_done, lost, block)

    def _lose_settled(self, lost: Lost, block: bool) -> None:
        if not block and self.loop_exited:
            return  # the watchdog (which carries this out) was cancelled when the loop ended
        self.at(self._stop_items(frozenset(self.runs)), self._lost_done, lost, block)

    def _lost_done(self, lost: Lost, block: bool) -> None:
        if not block and self.loop_exited:
            return  # the watchdog (which carries this out) was cancelled when the loop ended
        self.m.revoked(lost.items, self.sim.now)
        if self.stop_set:
            if block:
                self.blocked = False
            self._loop_ended()
            return
        if block:
            self._unblock()
        else:
            self.wake()

    # -- watchdog ------------------------------------------------------------------------------------------
    def arm_watchdog(self) -> None:
        last = self.m.last_success_ms
        if last is None or self.loop_exited:
            return
        due = max(self.sim.now, last + self.sim.scenario.session_timeout_ms)
        if self.wd_at is not None and self.wd_at <= due:
            return
        self.wd_at = due
        self.at(due, self._watchdog, due)

    def _watchdog(self, due: int) -> None:
        if self.wd_at != due or self.loop_exited:  # run() cancels the watchdog when its loop ends
            return
        self.wd_at = None
        sim = self.sim
        m = self.m
        lost = m.check_session(sim.now)
        if lost is None:
            last = m.last_success_ms
            if last is not None:
                nxt = last + sim.scenario.session_timeout_ms
                self.wd_at = nxt if nxt > sim.now else sim.now + WATCHDOG_MS
                self.at(self.wd_at, self._watchdog, self.wd_at)
            return
        sim.trace("self_fenced", self.name, detail=_items_detail(lost.items))
        sim.self_fences += 1
        self.lost_gen += 1
        if self.hb is not None:  # the watchdog cancels the heartbeat in flight
            self.hb.ignore = True
            self.hb = None
            self.m.on_failure(sim.now, self.backoff())
        self._lose(lost, block=False)

    # -- running work ------------------------------------------------------------------------------------
    def _start_items(self, items: frozenset[Item]) -> None:
        sim = self.sim
        now = sim.now
        rng = sim.rng_work
        lo, hi = sim.scenario.start_ms
        span = hi - lo
        for item in sorted(items):
            if item in self.runs:
                continue
            run = Run(item, self, now, now + lo + int(span * rng.random() ** 2))
            self.runs[item] = run
            sim.run_started(run)
        if items and self.backstop_at is None:
            self._check_backstop()  # the guard watches whatever runs, even started late

    def _stop_items(self, items: frozenset[Item], slow_ok: bool = True) -> int:
        """Stop what of ``items`` runs, in parallel; returns when the last stop completes. An
        instance counts as stopped only when its run has ended and its stop() returned (or
        raised) within the stop budget of its stop's beginning; one that is not (a stop that is
        slow or hangs, a run() that ignores cancellation) ends the process at the budget's end
        (the fail-stop rule): its Run ends only then (``end`` stays INF until the process ends),
        and whatever awaits this stop never sees it done (the fail-stop comes first)."""
        sim = self.sim
        now = sim.now
        rng = sim.rng_work
        lo, hi = sim.scenario.stop_ms
        span = hi - lo
        rebalance = sim.scenario.rebalance_timeout_ms
        deadline = self.stop_deadline
        mode = self.stop_mode if now < self.slow_until and slow_ok else ""
        done = now
        abandoned: list[str] = []
        for item in sorted(items):
            run = self.runs.pop(item, None)
            if run is None:
                # worker._stop_items: a stop already in progress (a Lost's, while stop() drains)
                # is awaited, not taken as done ("revoked-while-stopping"); an abandoned one
                # is never done: the process ends at its budget's end.
                stopping = self.stopping.get(item)
                if stopping is not None and stopping.end is not None and stopping.end > done:
                    assert stopping.stop_begin is not None
                    # (max: never earlier than another item's stop, nor than now: a stop whose
                    # budget ran out while the process was frozen is over, one way or the other;
                    # before, ``done`` could go back, even into the past: an event before now)
                    done = max(done, min(stopping.end, stopping.stop_begin + deadline))
                continue
            r = rng.random()
            if mode == "slow":  # a slow_revocation: 1-2x the rebalance timeout
                d: int | None = rebalance + int(rebalance * r)
            elif mode == "long":  # a slow_bounce: 2/3 to all of the budget
                d = deadline * 2 // 3 + int(deadline / 3 * r)
            elif mode == "slow_stop":  # a bit past the budget, some just within it
                d = int(deadline * (0.9 + 0.4 * r))
            elif mode == "raising_stop":  # stop() raises at once: counts as stopped
                d = int(5 * r)
            elif mode in ("hanging_stop", "ignores_cancel"):
                d = None  # stop() never returns / returns, but run() never ends
            else:
                d = lo + int(span * r ** 2)
            if d is not None and d <= deadline:
                end = now + d
                if end > done:
                    done = end
            else:
                end = INF
                abandoned.append(str(item))
                if now + deadline > done:
                    done = now + deadline
            sim.run_stopped(run, now, end)
            self.stopping[item] = run
        if abandoned:
            why = {"hanging_stop": "stop() did not return", "ignores_cancel":
                   "run() ignored the cancellation"}.get(mode, "stop() overran the budget")
            more = f" (+{len(abandoned) - 1} more)" if len(abandoned) > 1 else ""
            self.at(now + deadline, self._fail_stop,
                    f"{abandoned[0]}{more} not stopped within {deadline} ms of its stop "
                    f"(t={now}): {why}")
        return done

    # -- computing the assignment --------------------------------------------------------------------------
    def _compute(self) -> None:
        m = self.m
        self.computing = True
        self.sim.trace("prepare", self.name, epoch=m.member_epoch)
        self.send("ctl", ConnectGroupPrepareAssignmentRequest(
            group_id=GROUP, member_id=m.member_id, member_epoch=m.member_epoch),
            self._on_prepare, self._compute_failed)

    def _compute_failed(self, why: str) -> None:
        if self.loop_exited:
            return  # cancelled when the loop ended
        self.computing = False
        self.sim.trace("compute_abandoned", self.name, detail=why)

    def _on_prepare(self, prep: Any) -> None:
        sim = self.sim
        if self.loop_exited:
            return  # cancelled when the loop ended
        if prep.error_code:
            self.computing = False
            sim.trace("prepare_refused", self.name, detail=str(prep.error_code))
            if prep.error_code in RETRY_COORDINATOR:
                self.invalidate()
            return
        if prep.assignor_name != self.assignor.name:
            self.computing = False
            sim.violate(f"{self.name}: the group's assignor {prep.assignor_name!r} is not ours")
            return
        spec = group_from_prepare(prep)
        result = self.assignor.assign(spec)
        sim.computations += 1
        duration = sim.sample(sim.rng_work, sim.scenario.compute_ms) + len(sim.configured) // 1000
        self.at(sim.now + duration, self._install, prep, result, 0)

    def _install(self, prep: Any, result: Any, attempt: int) -> None:
        m = self.m
        if self.loop_exited:
            return  # cancelled when the loop ended
        req = install_request(GROUP, m.member_id, m.member_epoch, prep.group_epoch, result)
        self.sim.trace("install", self.name, epoch=prep.group_epoch,
                       detail=f"delay={result.scheduled_rebalance_delay_ms}")
        self.send("ctl", req, lambda resp: self._on_install(resp, prep, result, attempt),
                  self._compute_failed)

    def _on_install(self, resp: Any, prep: Any, result: Any, attempt: int) -> None:
        sim = self.sim
        if self.loop_exited:
            return  # cancelled when the loop ended
        stale = resp.error_code in (E.FENCED_MEMBER_EPOCH, E.STALE_MEMBER_EPOCH)
        if stale and attempt < 2:
            self.at(sim.now + self.m.heartbeat_interval_ms, self._install, prep, result, attempt + 1)
            return
        self.computing = False
        sim.trace("install_response", self.name, detail=str(resp.error_code))
        if resp.error_code in RETRY_COORDINATOR:
            self.invalidate()
        if resp.error_code == 0:
            self.m.next_heartbeat_ms = sim.now
            self.wake()

    # -- the client: two connections, reconnect with backoff -------------------------------------------
    @property
    def heartbeat_answer_budget(self) -> int:
        """Worker.heartbeat_answer_budget_s (72dc392): a heartbeat's answer may take this long
        beyond its MaxWaitMs, then the connection is given up and the coordinator looked up
        again: a tenth of the session (1 s to the request timeout). It was the request timeout
        (30 s) before ff1e79c, and a frozen or unreachable coordinator node held the worker past
        its session; a fifth of the session from ff1e79c to 72dc392."""
        sc = self.sim.scenario
        if sc.heartbeat_timeout_ms:
            return sc.heartbeat_timeout_ms
        return min(sc.request_timeout_ms, max(1_000, sc.session_timeout_ms // 10))

    def retry_delay(self, delay: int) -> int:
        """Worker._retry_delay_ms (ff1e79c): the wait before the next heartbeat after a failed one
        or a retriable error, never more than a quarter of what is left of the lease (nor less
        than half the client's base backoff, 50 ms)."""
        last = self.m.last_success_ms
        if last is None or self.sim.scenario.retry_within_lease is False:
            return delay
        left = last + self.sim.scenario.session_timeout_ms - self.sim.now
        if left <= 0:
            return delay
        return min(delay, max(left // 4, 50))

    def backoff(self) -> int:
        ceiling = min(self.sim.scenario.client_max_backoff_ms, 100 * (2 ** min(self.failures, 16)))
        return int(self.sim.rng_client.uniform(50, max(100, ceiling)))

    def send(self, kind: str, request: Any, on_ok: Callable[[Any], None], on_fail: Callable[[str], None],
             timeout: int | None = None) -> Pending:
        sim = self.sim
        timeout = timeout if timeout is not None else sim.scenario.request_timeout_ms
        pend = Pending(request, on_ok, on_fail, sim.now + timeout, timeout)
        conn = self.conns[kind]
        if conn is None or conn.state not in ("open", "connecting"):
            conn = sim.connect(self, kind)
            self.conns[kind] = conn
        if conn.state == "connecting":
            conn.queued.append(pend)
        else:
            sim.net_request(conn, pend)
        return pend

    def invalidate(self) -> None:
        """CoordinatorClient.invalidate(): forget the coordinator, close both connections."""
        self.coordinator_known = False
        for conn in list(self.conns.values()):
            if conn is not None and conn.state != "closed":
                self.sim.reset_conn(conn, "connection closed", notify=True, delay=0)

    def fail_conn(self, conn: Conn, why: str) -> None:
        """Every request still waiting on ``conn`` fails (ConnectionFailed)."""
        conn.state = "closed"
        if self.conns.get(conn.kind) is conn:
            self.conns[conn.kind] = None
        waiting = list(conn.queued) + list(conn.inflight)
        conn.queued.clear()
        conn.inflight.clear()
        for pend in waiting:
            if pend.done:
                continue
            pend.done = True
            self.failures += 1
            self.coordinator_known = False
            if not pend.ignore:
                pend.on_fail(why)

    def deliver(self, conn: Conn, pend: Pending, resp: Any) -> None:
        if pend.done or conn.state != "open":
            return
        pend.done = True
        if conn.inflight and conn.inflight[0] is pend:
            conn.inflight.popleft()
        else:
            try:
                conn.inflight.remove(pend)
            except ValueError:
                pass
        self.failures = 0
        if not pend.ignore:
            pend.on_ok(resp)

    def timeout(self, conn: Conn, pend: Pending) -> None:
        if pend.done or conn.state == "closed":
            return
        self.fail_conn(conn, f"{type(pend.request).__name__} timed out")


# == the simulation ==========================================================================================


@dataclass
class RunResult:
    metrics: dict[str, object]
    events: list[dict[str, object]] = field(default_factory=list)
    extra: dict[str, object] = field(default_factory=dict)
    """Numbers outside the metrics contract: zombie_ms (double running excused because the old
    holder was frozen, see docs/simulation.md), heartbeats, computations, coordinator batches."""


class Simulation:
    def __init__(self, scenario: Scenario, assignor: str, workers: int, tasks: int, seed: int,
                 trace: bool = False) -> None:
        if assignor not in ("eager", "incremental"):
            raise ValueError(f"unknown assignor {assignor!r} (eager, incremental)")
        if workers < 1 or tasks < 0:
            raise ValueError("workers must be >= 1 and tasks >= 0")
        self.scenario = scenario
        self.assignor = assignor
        self.n_workers = workers
        self.n_tasks = tasks
        self.seed = seed
        self.tracing = trace
        self.events: list[dict[str, object]] = []
        self.now = 0
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.rng_net = random.Random(f"{seed}/net")
        self.rng_work = random.Random(f"{seed}/work")
        self.rng_fault = random.Random(f"{seed}/faults")
        self.rng_coord = random.Random(f"{seed}/coordinator")
        self.rng_client = random.Random(f"{seed}/client")
        self.rng_supervisor = random.Random(f"{seed}/supervisor")
        """Restart delays of fail-stopped processes: a stream of its own, so that a fail-stop
        reshuffles nothing else."""
        self.rng_nodes = random.Random(f"{seed}/nodes")
        """Several coordinator nodes: etcd latencies, the next owner, the bootstrap order."""
        self.fail_stops = 0
        self.self_fences = 0
        self._ids = 0
        self._cids = 0
        self.violation = ""
        self.stopped = False
        # items
        self.configured: set[Item] = set()
        self.stats: dict[Item, ItemStat] = {}
        self.holders: dict[Item, list[Run]] = {}
        self.last_slot: dict[Item, int] = {}
        self.initial_slot: dict[Item, int] = {}
        self.overlaps: list[Overlap] = []
        # phases
        self.phase = "formation"
        self.phase_start = 0
        self.faults_end = INF
        self.deadline = FORMATION_BOUND_MS
        self.converged_at: int | None = None
        self.initial_epoch = 0
        # metrics
        self.messages = 0
        self.moved = 0
        self.downtime = 0
        self.longest = 0
        self.heartbeats = 0
        self.computations = 0
        self._blocker: SimWorker | None = None
        self._check_every = 1 if workers + tasks <= 2_000 else (workers + tasks) // 50
        self._writes = 0
        # coordinator nodes and the store
        self.multi = scenario.nodes > 1
        self.node_names = [f"n{i + 1}" for i in range(max(1, scenario.nodes))]
        self.node_alive = dict.fromkeys(self.node_names, True)
        self.node_frozen_until = dict.fromkeys(self.node_names, 0)
        self.node_host_lost = dict.fromkeys(self.node_names, False)
        self.node_etcd_cut_until = dict.fromkeys(self.node_names, 0)
        self.etcd_down_until = 0
        self.node_quiet: dict[str, tuple[int, int]] = {}
        """Per node, its last stretch without lease renewals (frozen or cut off from etcd): the
        last renewal's send before it and its end (FindCoordinator's answers, _lease_in_doubt)."""
        self.store = Store()
        self.acked: dict[Any, Any] = {}
        """With several nodes: what the owners committed (the store must hold exactly this)."""
        token = self.store.acquire(0, scenario.lease_ttl_ms)
        # actors
        self.coord = CoordinatorNode(self, self.node_names[0], token)
        self.instances = [self.coord]
        if self.multi:
            self.coord.start_lease()
            self.at(self.store.expires, self._lease_expiry, token, self.store.expires)
        self.workers: list[SimWorker] = [SimWorker(self, i) for i in range(workers)]
        self.admin: SimWorker | None = None
        self.zombie_grace = WATCHDOG_MS + 2 * scenario.latency_ms[1] + 1
        """A frozen worker must begin stopping what it may no longer run this soon after it
        wakes: one watchdog period plus a round trip (the stale answer it finds first)."""

    # -- event queue ----------------------------------------------------------------------------------
    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        if t < self.now:
            raise AssertionError(f"an event scheduled in the past (t={t} < now={self.now}): {fn}")
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def sample(self, rng: random.Random, r: tuple[int, int]) -> int:
        return r[0] + int((r[1] - r[0]) * rng.random() ** 2)

    def generated_id(self) -> str:
        self._ids += 1
        return f"gen-{self._ids:05d}"

    def faulty(self) -> bool:
        return self.phase == "faults"

    def trace(self, kind: str, worker: str = "", item: str = "", epoch: int = -1, detail: str = "") -> None:
        if self.tracing:
            self.events.append({"t_ms": self.now, "kind": kind, "worker": worker, "item": item,
                                "epoch": epoch, "detail": detail})

    def violate(self, message: str) -> None:
        if not self.violation:
            self.violation = message
            self.trace("violation", detail=message)
        self.stopped = True

    # -- network ------------------------------------------------------------------------------------------
    def latency(self) -> int:
        return self.sample(self.rng_net, self.scenario.latency_ms)

    def all_conns(self) -> list[Conn]:
        out = []
        for w in [*self.workers, *([self.admin] if self.admin is not None else [])]:
            for kind in ("hb", "ctl"):
                conn = w.conns.get(kind)
                if conn is not None and conn.state != "closed":
                    out.append(conn)
        return out

    def connect(self, w: SimWorker, kind: str) -> Conn:
        self._cids += 1
        conn = Conn(self._cids, w, kind, self.coord)
        if self.multi and not w.coordinator_known and self.scenario.find_parallel and w is not self.admin:
            self._find_parallel(w, conn)
            return conn
        rtt = self.latency() + self.latency()
        if not w.coordinator_known:  # FindCoordinator first
            rtt += self._find_coordinator_ms() if self.multi else self.latency() + self.latency()
        t = self.now + rtt
        if w.part_start <= self.now < w.part_end:
            heal = w.part_end + rtt
            t = heal if heal <= self.now + self.scenario.request_timeout_ms else -1
        if t < 0:
            w.at(self.now + self.scenario.request_timeout_ms, self._connect_done, conn, False)
        else:
            w.at(t, self._connect_done, conn, True)
        return conn

    def _connect_done(self, conn: Conn, ok: bool) -> None:
        w = conn.worker
        if conn.state != "connecting":
            return
        coord = self.coord  # (with several nodes: the owner FindCoordinator named, if any)
        if ok and self.multi and self.node_host_lost[coord.node]:
            # its host is unreachable: the TCP connect times out (CoordinatorClient: 2 s)
            w.at(self.now + CONNECT_TIMEOUT_MS, self._connect_done, conn, False)
            return
        if not ok or not coord.up or not coord.owner:
            w.fail_conn(conn, "cannot connect to the coordinator")
            return
        conn.state = "open"
        conn.node = coord
        conn.coord_inc = coord.inc
        w.coordinator_known = True
        queued, conn.queued = conn.queued, []
        for pend in queued:
            if not pend.done:
                self.net_request(conn, pend)

    def _arrival(self, conn: Conn, up: bool) -> int:
        w = conn.worker
        t = self.now + self.latency()
        if w.part_start <= self.now < w.part_end:
            t = max(t, w.part_end + self.latency())
        if up:
            t = max(t, conn.up_last)
            conn.up_last = t
        else:
            t = max(t, conn.down_last)
            conn.down_last = t
        return t

    def _lost(self) -> bool:
        loss = self.scenario.loss
        return self.phase == "faults" and loss > 0 and self.rng_net.random() < loss

    def net_request(self, conn: Conn, pend: Pending) -> None:
        self.messages += 1
        if isinstance(pend.request, ConnectGroupHeartbeatRequest):
            self.heartbeats += 1
        conn.inflight.append(pend)
        pend.deadline = self.now + pend.timeout  # (the client's timeout runs from the write)
        conn.worker.at(pend.deadline, conn.worker.timeout, conn, pend)
        if self._lost():
            self.trace("message_lost", conn.worker.name, detail=type(pend.request).__name__)
            self.reset_conn(conn, "connection reset")
            return
        self.at(self._arrival(conn, True), self._to_coordinator, conn, pend)

    def _to_coordinator(self, conn: Conn, pend: Pending) -> None:
        w = conn.worker
        if conn.state != "open":
            return
        if w.part_start <= self.now < w.part_end:  # a partition began meanwhile: retransmitted later
            t = max(w.part_end + self.latency(), conn.up_last)
            conn.up_last = t
            self.at(t, self._to_coordinator, conn, pend)
            return
        conn.node.receive(conn, pend)

    def net_response(self, conn: Conn, pend: Pending, resp: Any) -> None:
        if conn.state != "open" or conn.coord_inc != conn.node.inc:
            return
        self.messages += 1
        if self._lost():
            self.trace("message_lost", conn.worker.name, detail=type(resp).__name__)
            self.reset_conn(conn, "connection reset")
            return
        conn.worker.at(self._arrival(conn, False), self._to_worker, conn, pend, resp, io=True)

    def _to_worker(self, conn: Conn, pend: Pending, resp: Any) -> None:
        w = conn.worker
        if conn.state != "open":
            return
        if w.part_start <= self.now < w.part_end:
            t = max(w.part_end + self.latency(), conn.down_last)
            conn.down_last = t
            w.at(t, self._to_worker, conn, pend, resp, io=True)
            return
        w.deliver(conn, pend, resp)

    def reset_conn(self, conn: Conn, why: str, notify: bool = True, delay: int | None = None) -> None:
        """The connection breaks: both ends learn it (the worker after ``delay``, default one
        latency: an RST); whatever is in flight on it is lost."""
        if conn.state == "closed":
            return
        w = conn.worker
        if notify and w.alive and conn.inc == w.inc:
            conn.state = "closing"
            if delay == 0:
                self._reset_seen(conn, why)
            else:
                w.at(self.now + (self.latency() if delay is None else delay), self._reset_seen, conn, why)
        else:
            conn.state = "closed"

    def _reset_seen(self, conn: Conn, why: str) -> None:
        if conn.state != "closed":
            conn.worker.fail_conn(conn, why)

    # -- items ----------------------------------------------------------------------------------------------
    def run_started(self, run: Run) -> None:
        item = run.item
        now = self.now
        runs = self.holders.get(item)
        if runs is None:
            self.holders[item] = [run]
        else:
            runs[:] = [r for r in runs if r.end is None or r.end > now]
            for other in runs:
                if other.worker is run.worker:
                    continue
                self._overlap(item, other, run)
            runs.append(run)
        slot = run.worker.slot
        last = self.last_slot.get(item)
        if last is not None and last != slot and self.phase != "formation":
            self.moved += 1
        self.last_slot[item] = slot
        stat = self.stats.get(item)
        if stat is not None:
            stat.ups.append(run)

    def _overlap(self, item: Item, old: Run, new: Run) -> None:
        excused = self._frozen_zombie(old)
        ow = old.worker
        ov = Overlap(item, old, new, self.now, excused)
        self.overlaps.append(ov)
        self.trace("double_run", new.worker.name, str(item),
                   detail=f"also on {ow.name} ({'frozen zombie' if excused else 'running'})")
        if not excused:
            self.violate(f"{item} runs on {ow.name} and {new.worker.name} at once (t={self.now})")

    def _frozen_zombie(self, old: Run) -> bool:
        """Is ``old`` the run of a worker that was frozen (stop-the-world) when the coordinator
        took the item away? Excused while it is frozen and, once it wakes, if it began stopping
        the item within the grace period: nothing can do better (docs/simulation.md)."""
        ow = old.worker
        if not ow.alive or ow.pause_began < 0 or old.start > ow.pause_began:
            return False
        if ow.paused:
            return True
        return (ow.pause_lease_expired and old.stop_begin is not None
                and old.stop_begin <= ow.resumed_at + self.zombie_grace
                and self.now <= ow.zombie_limit)

    def run_stopped(self, run: Run, stop_begin: int, end: int) -> None:
        run.stop_begin = stop_begin
        run.end = end
        stat = self.stats.get(run.item)
        if stat is None:
            return
        self._settle(stat, stop_begin)
        try:
            stat.ups.remove(run)
        except ValueError:
            pass
        if stat.down_since is None and not any(r.up_at <= stop_begin for r in stat.ups):
            stat.down_since = stop_begin

    def _settle(self, stat: ItemStat, t: int) -> None:
        if stat.down_since is None or not stat.ups:
            return
        first = min(r.up_at for r in stat.ups)
        if first <= t:
            self._outage(stat.down_since, first)
            stat.down_since = None

    def _outage(self, since: int, until: int) -> None:
        if self.phase == "formation":
            return
        since = max(since, self.phase_start)
        if until > since:
            self.downtime += until - since
            if until - since > self.longest:
                self.longest = until - since

    def store_write(self, node: CoordinatorNode, records: list[Any]) -> bool:
        """The commit of ``node``'s batch: fenced on its ownership (etcd's compare). What a
        legitimate owner commits is also kept in ``acked``, what the store must hold."""
        store = self.store
        legit = node.token == store.token
        ok = store.write(node.token, records, fenced=self.scenario.fenced_writes)
        if ok and self.multi:
            if legit:
                acked = self.acked
                for record in records:
                    acked.pop(record.key, None)
                    acked[record.key] = record
            else:
                self.trace("stale_write_applied", detail=f"{node.node}: {len(records)} records written "
                           f"by a deposed owner (token {node.token}; the fence is off)")
                self.check_store(f"{node.node}'s late write")
        return ok

    def check_store(self, where: str) -> None:
        """The store holds exactly what the partition's owners committed (and acknowledged):
        nothing overwritten or added by anyone else (a deposed owner's late write)."""
        if not self.multi or self.store.log == self.acked:
            return
        log, acked = self.store.log, self.acked
        differ = [k for k, r in acked.items() if log.get(k) != r]
        extra = [k for k in log if k not in acked]
        example = (differ or extra)[0]
        self.violate(f"acknowledged state lost ({where}): the store differs from what the owners "
                     f"committed in {len(differ)} records, and holds {len(extra)} no owner wrote "
                     f"(e.g. {type(example).__name__} {getattr(example, 'member_id', '')})")

    def on_records(self, records: list[Any]) -> None:
        if not any(type(r.key) is GroupConnectorsKey for r in records):
            return
        g = self.coord.core.group(GROUP)
        if g is None or g.configured == self.configured:
            return
        now = self.now
        for item in sorted(g.configured - self.configured):
            stat = ItemStat(now)
            self.stats[item] = stat
        for item in sorted(self.configured - g.configured):
            stat = self.stats.pop(item)
            self._settle(stat, now)
            if stat.down_since is not None:
                self._outage(stat.down_since, now)
        self.configured = set(g.configured)

    # -- invariants -----------------------------------------------------------------------------------------
    def check_coordinator(self, node: CoordinatorNode, wrote: bool) -> None:
        if wrote:
            self._writes += 1
            if self._writes % self._check_every == 0:
                self._check_core(node)
        self.maybe_converged()

    def _check_core(self, node: CoordinatorNode) -> None:
        try:
            check_invariants(node.core.state, node.epochs)
        except InvariantViolation as exc:
            self.violate(f"coordinator invariants: {exc}")
            return
        node.epochs = epochs(node.core.state)

    def after_resume(self, w: SimWorker) -> None:
        """A frozen worker woke up: it must stop what it may no longer run within one watchdog
        period (plus a round trip: the stale answer it finds in its socket first)."""
        self.at(self.now + self.zombie_grace, self._zombie_check, w, w.inc)
        # The fail-stop rule bounds the excuse: whatever the woken worker still runs ends by its
        # lease end + budget (the lease backstop), or as it wakes if that has passed.
        last = w.m.last_success_ms
        lease_end = last + self.scenario.session_timeout_ms if last is not None else self.now
        w.zombie_limit = max(self.now, lease_end + w.stop_deadline)
        self.at(w.zombie_limit + 1, self._zombie_limit_check, w, w.zombie_limit)

    def _zombie_limit_check(self, w: SimWorker, limit: int) -> None:
        if w.paused or w.zombie_limit != limit:
            return  # frozen again: its next wake-up sets the limit anew
        for ov in self.overlaps:
            old = ov.old
            if ov.excused and old.worker is w and (old.end is None or old.end > limit) \
                    and old.start <= limit:
                self.violate(f"{w.name} woke from a pause and still runs {ov.item} past its lease "
                             f"end + stop budget (t={limit}), which {ov.new.worker.name} runs since "
                             f"t={ov.at}")
                return

    def _zombie_check(self, w: SimWorker, inc: int) -> None:
        for ov in self.overlaps:
            if ov.excused and ov.old.worker is w and ov.old.stop_begin is None and inc == w.inc and w.alive:
                if w.paused:
                    continue
                self.violate(f"{w.name} woke from a pause and still runs {ov.item}, which "
                             f"{ov.new.worker.name} runs since t={ov.at}: it did not fence itself")
                return

    def worker_settled(self, w: SimWorker) -> None:
        if self.now >= self.faults_end or self.phase == "formation":
            self.maybe_converged()

    def maybe_converged(self) -> None:
        if self.converged_at is not None or self.stopped:
            return
        if self.phase == "faults" and self.now < self.faults_end:
            return
        coord = self.coord
        core = coord.core
        if core is None or not coord.up or coord.loading or not coord.owner or coord.frozen:
            return
        g = core.group(GROUP)
        if g is None or g.state is not GroupState.STABLE:
            return
        blocker = self._blocker
        if blocker is not None and blocker.alive and not self._worker_ready(blocker, g):
            return
        live = [w for w in self.workers if w.alive and not w.leaving]
        if len(live) != len(g.members):
            return
        for w in live:
            if not self._worker_ready(w, g):
                self._blocker = w
                return
        now = self.now
        total = 0
        for w in live:
            cur = g.current[w.m.member_id]
            if len(w.runs) != len(cur.assigned):
                return
            latest = max((run.up_at for run in w.runs.values()), default=0)
            if latest > now:  # still starting: look again when it is up
                self.at(latest, self.maybe_converged)
                return
            total += len(w.runs)
            if w.m.owned != cur.assigned or frozenset(w.runs) != cur.assigned:
                return
        if total != len(g.configured) or total != len(self.configured):
            return
        for item, runs in self.holders.items():
            active = [r for r in runs if r.end is None or r.end > now]
            if len(active) > 1 or (active and item not in self.configured):
                return
        self.converged_at = now
        self.trace("converged", epoch=g.epoch, detail=f"{len(live)} workers, {total} items")

    def _worker_ready(self, w: SimWorker, g: Any) -> bool:
        m = w.m
        return (w.alive and not w.leaving and not w.blocked and (w.acting is None or w.acting_done)
                and not w.pending and not w.paused and m.state is State.STABLE
                and m.member_epoch == g.epoch and m.member_id in g.members)

    # -- faults -------------------------------------------------------------------------------------------
    def worker(self, slot: int) -> SimWorker:
        while slot >= len(self.workers):
            self.workers.append(SimWorker(self, len(self.workers)))
        return self.workers[slot]

    def restart_worker(self, w: SimWorker) -> None:
        if not w.alive and not self.stopped:
            w.start()

    def inject(self, fault: Fault) -> None:
        kind = fault.kind
        self.trace("fault", self.workers[fault.slot].name if 0 <= fault.slot < len(self.workers) else "",
                   detail=f"{kind} {fault.duration_ms} ms {fault.detail}".strip())
        if kind == "coordinator_restart":
            if self.coord.up:
                self.coord.crash()
                self.at(self.now + fault.duration_ms, self._coordinator_back)
            return
        if kind == "connectors":
            self._change_connectors(fault.detail)
            return
        if kind == "etcd_leader_loss":
            if self.multi:
                self._etcd_leader_loss(fault.duration_ms, fault.detail == "revoke")
            return
        if kind in ("partition_move", "owner_failover", "deposed_late_write", "node_restart"):
            self._node_fault(fault)
            return
        w = self.worker(fault.slot)
        if kind == "join":
            if not w.alive:
                w.start()
            return
        if not w.alive:
            return
        if kind == "crash":
            w.crash()
            if fault.duration_ms >= 0:
                self.at(self.now + fault.duration_ms, self.restart_worker, w)
        elif kind == "bounce":
            w.graceful_stop(restart_after=fault.duration_ms)
        elif kind == "slow_bounce":
            w.slow_until = self.now + 10 * self.scenario.rebalance_timeout_ms
            w.stop_mode = "long"
            w.graceful_stop(restart_after=fault.duration_ms)
        elif kind == "leave":
            w.graceful_stop(restart_after=None)
        elif kind == "pause":
            w.pause(fault.duration_ms)
        elif kind == "partition":
            w.part_start = self.now
            w.part_end = self.now + fault.duration_ms
        elif kind == "drop":
            for conn in list(w.conns.values()):
                if conn is not None:
                    self.reset_conn(conn, "connection dropped")
        elif kind == "slow_revocation":
            w.slow_until = self.now + fault.duration_ms
            w.stop_mode = "slow"
        elif kind == "bad_stops":  # a plugin that misbehaves on stop (STOP_MODES), for a while
            w.slow_until = self.now + fault.duration_ms
            w.stop_mode = fault.detail

    # -- several coordinator nodes ----------------------------------------------------------------------
    def etcd_latency(self) -> int:
        return self.sample(self.rng_nodes, self.scenario.latency_ms)

    def etcd_cut(self, node: CoordinatorNode) -> int:
        """Until when ``node`` cannot reach etcd (0: it can): cut off, or etcd has no leader."""
        until = max(self.node_etcd_cut_until[node.node], self.etcd_down_until)
        return until if until > self.now else 0

    def _etcd_leader_loss(self, duration: int, revoke: bool) -> None:
        """No renewal, write or acquire gets through for ``duration``. ``revoke`` False: an
        election -- nothing expires meanwhile and the new leader extends every lease by its
        TTL (etcd's lessor promotion). True: the leader keeps its role but is unreachable, so
        leases past their TTL are revoked as always."""
        end = self.now + duration
        self.trace("etcd_leader_lost", detail=f"{duration} ms, " + (
            "the leader keeps its role: leases past their TTL are revoked" if revoke
            else "an election: the new leader extends every lease"))
        self.etcd_down_until = max(self.etcd_down_until, end)
        sc = self.scenario
        for node in self.node_names:
            quiet = self.node_quiet.get(node)
            if quiet is not None and quiet[1] > self.now:
                continue
            c = self.coord
            renewed = (c.lease_sent if c.node == node and c.up and c.owner
                       else self.now - self.rng_nodes.randrange(sc.lease_ttl_ms // 3 + 1))
            self.node_quiet[node] = (renewed, end)
        if not revoke and self.store.token != 0:
            self.store.expires = INF  # no leader: nothing expires
            self.at(end, self._etcd_leader_elected, self.store.token)

    def _etcd_leader_elected(self, token: int) -> None:
        store = self.store
        if store.token != token or self.now < self.etcd_down_until:
            if store.token == token:  # a longer outage began meanwhile
                self.at(self.etcd_down_until, self._etcd_leader_elected, token)
            return
        store.expires = self.now + self.scenario.lease_ttl_ms
        self.at(store.expires, self._lease_expiry, token, store.expires)
        self.trace("etcd_leader_elected", detail="every lease extended by its TTL")

    def etcd_renew(self, node: CoordinatorNode, sent: int) -> None:
        """A lease renewal reaches etcd: it extends the lease (from now) if it has not expired.
        Cut off from etcd, it never arrives (NodeLease's renewal times out; it tries again)."""
        if self.etcd_cut(node):
            return
        store = self.store
        ok = store.token == node.token and self.now < store.expires
        if ok:
            store.expires = self.now + self.scenario.lease_ttl_ms
            self.at(store.expires, self._lease_expiry, node.token, store.expires)
        node.at(self.now + self.etcd_latency(), node.renewed, node.inc, sent, ok, io=True)

    def _lease_expiry(self, token: int, expires: int) -> None:
        store = self.store
        if store.token != token or store.expires != expires:
            return
        store.release(token)
        owner = next((c.node for c in self.instances if c.token == token), "?")
        self.trace("lease_expired", detail=f"{owner}: nobody owns the partition")
        self._next_owner(None, owner)

    def _next_owner(self, target: str | None, previous: str) -> None:
        """The next owner acquires after the watch event and its acquire transaction."""
        delay = self.sample(self.rng_nodes, self.scenario.handover_ms)
        self.at(self.now + delay, self._elect, target, previous)

    def _elect(self, target: str | None, previous: str) -> None:
        if self.stopped or self.store.token != 0:
            return
        now = self.now
        if now < self.etcd_down_until:  # the acquire waits for etcd
            self.at(self.etcd_down_until, self._elect, target, previous)
            return
        free = [n for n in self.node_names if self.node_alive[n] and self.node_frozen_until[n] <= now]
        if target is not None and target in free:
            node = target
        else:
            pool = [n for n in free if n != previous] or free
            if not pool:  # every node is down or frozen: the first one back takes it
                self.at(now + 100, self._elect, target, previous)
                return
            node = pool[self.rng_nodes.randrange(len(pool))]
        token = self.store.acquire(now, self.scenario.lease_ttl_ms)
        self.at(self.store.expires, self._lease_expiry, token, self.store.expires)
        inst = CoordinatorNode(self, node, token, self.coord.epochs)
        self.coord = inst
        self.instances.append(inst)
        self.trace("owner_acquired", detail=f"{node} (token {token})")
        inst.start_lease()
        inst.load()

    def freeze_node(self, node: str, until: int) -> None:
        """SIGSTOP: the node's process handles nothing until ``until`` (its sockets buffer)."""
        if self.node_frozen_until[node] <= self.now:  # its lease was last renewed before this
            c = self.coord
            renewed = c.lease_sent if c.node == node and c.up and c.owner else self.now
        else:
            renewed = self.node_quiet[node][0]
        self.node_frozen_until[node] = max(self.node_frozen_until[node], until)
        self.node_quiet[node] = (renewed, self.node_frozen_until[node])
        self.at(until, self._node_woke, node, until)
        for inst in self.instances:
            if inst.node == node and inst.up:
                inst.freeze(until)

    def _node_woke(self, node: str, until: int) -> None:
        if self.node_frozen_until[node] == until:
            self.trace("node_woke", detail=node)

    def _freeze_anyway(self, inst: CoordinatorNode) -> None:
        if inst.freeze_armed is not None:
            duration, inst.freeze_armed = inst.freeze_armed, None
            self.trace("owner_frozen", detail=f"{inst.node} for {duration} ms (no write came)")
            self.freeze_node(inst.node, self.now + duration)

    def _exit_node(self, node: str, down: int | None, takes: bool = False) -> None:
        """The node's process ends (killed, or exiting after SIGTERM): its connections reset."""
        if not self.node_alive[node]:
            return
        self.node_alive[node] = False
        self.node_frozen_until[node] = 0
        self.node_quiet.pop(node, None)  # (back, a new process with a new lease)
        self.trace("node_down", detail=node)
        for inst in self.instances:
            if inst.node == node and inst.up:
                inst.crash()
        if down is not None:
            self.at(self.now + down, self._node_back, node, takes)

    def _lose_host(self, node: str, down: int) -> None:
        """The node's host becomes unreachable (power lost, cut off the network): nothing comes
        back on its connections (no RST: they hang until the client gives up), connecting to it
        times out; when it is back, its process has restarted (its old connections reset)."""
        self.trace("host_lost", detail=node)
        self.node_alive[node] = False
        self.node_host_lost[node] = True
        for inst in self.instances:
            if inst.node == node and inst.up:
                inst.freeze(INF)
        self.at(self.now + down, self._host_back, node)

    def _host_back(self, node: str) -> None:
        self.node_host_lost[node] = False
        for inst in self.instances:
            if inst.node == node and inst.up:
                inst.crash()
        self._node_back(node, False)

    def _node_back(self, node: str, takes: bool) -> None:
        if self.stopped:
            return
        self.node_alive[node] = True
        self.trace("node_up", detail=node + (" (placement gives it the partition)" if takes else ""))
        c = self.coord
        if takes and c.node != node:
            c.hand_over(lambda: self._next_owner(node, c.node))

    def _node_fault(self, fault: Any) -> None:
        kind = fault.kind
        c = self.coord
        if not self.multi:
            return
        if kind == "node_restart":  # SIGTERM: the owner hands over first, then the process exits
            name, _, how = fault.detail.partition(" ")
            takes = how == "takes"
            if not self.node_alive[name]:
                return
            if c.node == name and c.hand_over(lambda: (self._exit_node(name, fault.duration_ms, takes),
                                                       self._next_owner(None, name))):
                return
            self._exit_node(name, fault.duration_ms, takes)
            return
        if not c.up or not c.owner or c.frozen:
            self.trace("fault_skipped", detail=f"{kind}: the partition has no serving owner now")
            return
        if kind == "partition_move":
            c.hand_over(lambda: self._next_owner(None, c.node))
        elif kind == "owner_failover" and fault.detail == "host":
            self._lose_host(c.node, fault.duration_ms + self.rng_nodes.randint(1_000, 5_000))
        elif kind == "owner_failover" and fault.detail == "etcd":
            self.trace("etcd_cut", detail=f"{c.node} cannot reach etcd for {fault.duration_ms} ms")
            self.node_etcd_cut_until[c.node] = self.now + fault.duration_ms
            self.node_quiet[c.node] = (c.lease_sent, self.now + fault.duration_ms)
        elif kind == "owner_failover":
            self._exit_node(c.node, fault.duration_ms + self.rng_nodes.randint(1_000, 5_000))
        elif kind == "deposed_late_write":
            if fault.detail == "write":
                c.freeze_armed = fault.duration_ms
                self.at(self.now + DEPOSED_ARM_MS, self._freeze_anyway, c)
            else:
                self.trace("owner_frozen", detail=f"{c.node} for {fault.duration_ms} ms (idle)")
                self.freeze_node(c.node, self.now + fault.duration_ms)

    # -- FindCoordinator (several nodes) ---------------------------------------------------------------
    def _find_parallel(self, w: SimWorker, conn: Conn) -> None:
        """CoordinatorClient._find_coordinator since 72dc392, then the connect: every bootstrap
        node is asked at once (:meth:`_find_begin`). A partitioned worker's asks wait for the heal
        (TCP retransmits), within the request timeout, as its other connects do."""
        sc = self.scenario
        if w.part_start <= self.now < w.part_end:
            if w.part_end > self.now + sc.request_timeout_ms:
                w.at(self.now + sc.request_timeout_ms, self._connect_done, conn, False)
            else:
                w.at(w.part_end, self._find_begin, conn)
            return
        self._find_begin(conn)

    def _find_begin(self, conn: Conn) -> None:
        """Each node's ask (``_ask_coordinator``): connect, FindCoordinator, within the discovery
        timeout. An unreachable host fails at the connect timeout, a dead node refuses at once, a
        frozen one (its kernel accepts the connection) handles the request when it wakes; a live
        one answers the owner the store has (:meth:`_find_reaches`). The first answer naming one
        wins and the worker connects there (one more round trip, :meth:`_connect_done`); when
        every ask has failed or answered an error, the connection fails (ConnectionFailed) at
        the last one's end."""
        if conn.state != "connecting":
            return
        sc = self.scenario
        w = conn.worker
        order = list(self.node_names)
        self.rng_nodes.shuffle(order)  # (random.sample of the bootstrap list: the asks' order)
        find = Find(conn, self.now, order)
        timeout = min(sc.find_timeout_ms, sc.request_timeout_ms)
        for node in order:
            if self.node_host_lost[node]:  # no RST: the TCP connect times out
                w.at(self.now + min(CONNECT_TIMEOUT_MS, sc.request_timeout_ms), self._find_failed, find, node)
            elif not self.node_alive[node]:  # refused
                w.at(self.now + self.latency(), self._find_failed, find, node, io=True)
            else:
                w.at(self.now + timeout, self._find_failed, find, node)  # the discovery timeout
                self.at(self.now + self.latency(), self._find_reaches, find, node)

    def _find_reaches(self, find: Find, node: str) -> None:
        """The FindCoordinator request reaches ``node``: handled now, or when it wakes if frozen
        (its socket buffers it; its input comes before its timers, so before the renewal that
        waited); nothing comes back from a node killed or cut off meanwhile."""
        if find.done or node not in find.left:
            return
        if self.node_host_lost[node]:
            return  # the discovery timeout ends it
        if not self.node_alive[node]:
            find.conn.worker.at(self.now + self.latency(), self._find_failed, find, node, io=True)
            return
        if self.node_frozen_until[node] > self.now:
            self.at(self.node_frozen_until[node], self._find_reaches, find, node)
            return
        names = self.store.token != 0 and not self._lease_in_doubt(node)
        find.conn.worker.at(self.now + self.latency(), self._find_answered, find, node, names, io=True)

    def _lease_in_doubt(self, node: str) -> bool:
        """ClusterNode.locate: a node whose own lease is in doubt (remaining <= the margin: it has
        not renewed for TTL - margin, frozen or cut off from etcd) names nobody (its view of the
        owners may be stale): COORDINATOR_NOT_AVAILABLE."""
        quiet = self.node_quiet.get(node)
        if quiet is None or not self.scenario.lease_checked:
            return False
        renewed, until = quiet
        sc = self.scenario
        return renewed + sc.lease_ttl_ms - sc.lease_margin_ms <= self.now <= until

    def _find_answered(self, find: Find, node: str, names: bool) -> None:
        if find.done or node not in find.left:
            return
        if not names:  # COORDINATOR_NOT_AVAILABLE (nobody owns the partition now): wait for the others
            wait = self.scenario.find_error_wait_ms
            if wait >= 0 and len(find.left) > 1:  # (what-if: give the others only that long)
                find.conn.worker.at(self.now + wait, self._find_give_up, find)
            self._find_failed(find, node)
            return
        find.done = True
        conn = find.conn
        if conn.state != "connecting":
            return
        conn.worker.at(self.now + self.latency() + self.latency(), self._connect_done, conn, True)

    def _find_give_up(self, find: Find) -> None:
        if not find.done:
            find.left.clear()
            self._find_no_coordinator(find)

    def _find_failed(self, find: Find, node: str) -> None:
        if find.done or node not in find.left:
            return
        find.left.remove(node)
        if not find.left:
            self._find_no_coordinator(find)

    def _find_no_coordinator(self, find: Find) -> None:
        """Every ask failed or answered an error: ConnectionFailed("no coordinator found via ...");
        the worker retries after its backoff (at most a quarter of what is left of its lease)."""
        find.done = True
        if find.conn.state == "connecting":
            find.conn.worker.fail_conn(find.conn, "no coordinator found")

    def _find_coordinator_ms(self) -> int:
        """CoordinatorClient._find_coordinator before 72dc392 (``find_parallel=False``) and
        AdminSession.find_coordinator: over the bootstrap list one node after another (in random
        order): a dead node refuses at once; a frozen one accepts the connection (its kernel
        does) and answers when it wakes, or the request times out and the next is asked."""
        order = list(self.node_names)
        self.rng_nodes.shuffle(order)
        timeout = min(self.scenario.find_timeout_ms, self.scenario.request_timeout_ms)
        t = 0
        for node in order:
            if self.node_host_lost[node]:
                t += CONNECT_TIMEOUT_MS
                continue
            if not self.node_alive[node]:
                t += self.latency()
                continue
            wakes = self.node_frozen_until[node] - (self.now + t)
            if wakes > 0:
                if wakes >= timeout:
                    t += timeout
                    continue
                t += wakes
            return t + self.latency() + self.latency()
        return t

    def _coordinator_back(self) -> None:
        self.trace("coordinator_restart")
        self.coord.restart()

    # -- the admin (connectors) ----------------------------------------------------------------------
    def _connectors_request(self, upserts: dict[str, int], deletes: tuple[str, ...] = ()) -> Any:
        return ConnectGroupAlterConnectorsRequest(
            group_id=GROUP, validate_only=False, deletes=deletes,
            upserts=tuple(_alter.ConnectorSpec(name=n, task_count=c, config=())
                          for n, c in sorted(upserts.items())))

    def _admin_send(self, req: Any, attempt: int = 0) -> None:
        if self.stopped:
            return
        admin = self.admin
        if admin is None:
            admin = self.admin = SimWorker(self, 9_999)
            admin.name = "admin"
            admin.alive = True
            admin.inc = 1

        def ok(resp: Any) -> None:
            if self.multi and resp.error_code in RETRY_COORDINATOR:
                admin.invalidate()  # AdminSession finds the coordinator again
            if resp.error_code in (E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
                                   E.NOT_COORDINATOR):
                retry("retriable error")
            elif resp.error_code:
                self.trace("connectors_refused", "admin", detail=str(resp.error_code))

        def retry(why: str) -> None:
            self.at(self.now + 500, self._admin_send, req, attempt + 1)

        admin.send("ctl", req, ok, retry)

    def _change_connectors(self, what: str) -> None:
        g = self.coord.core.group(GROUP) if self.coord.core is not None else None
        names = sorted(g.connectors) if g is not None else []
        rng = self.rng_fault
        if what == "add" or not names:
            name = f"x{rng.randrange(10**6):06d}"
            count = rng.randint(1, self.scenario.tasks_per_connector)
            self._admin_send(self._connectors_request({name: count}))
        elif what == "delete":
            self._admin_send(self._connectors_request({}, (rng.choice(names),)))
        else:
            name = rng.choice(names)
            assert g is not None
            count = max(0, g.connectors[name].task_count + rng.choice((-3, -1, 1, 4)))
            self._admin_send(self._connectors_request({name: count}))

    # -- the run ----------------------------------------------------------------------------------------
    def _initial_connectors(self) -> dict[str, int]:
        per = max(1, self.scenario.tasks_per_connector)
        n = max(1, -(-self.n_tasks // per))
        out = {}
        left = self.n_tasks
        for i in range(n):
            out[f"c{i:05d}"] = min(per, left)
            left -= out[f"c{i:05d}"]
        return out

    def _loop(self, until: int) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap and not self.stopped:
            if heap[0][0] > until:
                break
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            if self.converged_at is not None and self.phase != "faults":
                break
        if not self.stopped and self.converged_at is None:
            self.now = max(self.now, until)

    def run(self) -> RunResult:
        started = time.perf_counter()
        sc = self.scenario
        self._admin_send(self._connectors_request(self._initial_connectors()))
        for w in self.workers:
            self.at(self.rng_fault.randrange(0, 100), w.start)
        # 1. formation: the group forms and converges.
        self._loop(FORMATION_BOUND_MS)
        if not self.stopped and self.converged_at is None:
            self.violate(f"the initial group did not converge within {FORMATION_BOUND_MS} ms")
        if not self.stopped:
            self._start_faults()
            self._loop(INF)
            if not self.stopped and self.converged_at is None:
                self.violate(f"did not converge within {sc.convergence_bound_ms} ms after the faults ended")
        if not self.violation:
            self.check_store("at the end of the run")
        return self._result(time.perf_counter() - started)

    def _start_faults(self) -> None:
        sc = self.scenario
        g = self.coord.core.group(GROUP)
        self.phase = "faults"
        self.phase_start = self.now
        self.initial_epoch = g.epoch if g is not None else 0
        self.converged_at = None
        self.messages = 0
        self.heartbeats = 0
        self.computations = 0
        self.initial_slot = dict(self.last_slot)
        for stat in self.stats.values():
            if stat.down_since is not None:
                stat.down_since = self.now
        faults, end = sc.schedule(self.rng_fault, self.n_workers)
        for f in faults:
            self.at(self.now + f.at_ms, self.inject, f)
        self.faults_end = self.now + end
        self.at(self.faults_end, self._faults_over)
        self.at(self.faults_end + sc.convergence_bound_ms, self._give_up)
        self.trace("faults_begin", detail=f"{len(faults)} faults, last ends at +{end} ms")

    def _faults_over(self) -> None:
        self.phase = "converging"
        self.trace("faults_end")
        c = self.coord
        # Not while a batch waits for etcd (a lease in doubt): its state is not committed yet
        # and may never be (refused if the lease is gone), so it is no baseline for the epochs.
        if c.up and not c.loading and c.owner and not c.frozen and not c.busy and not c.in_doubt:
            self._check_core(c)
        self.maybe_converged()

    def _give_up(self) -> None:
        if self.converged_at is None:
            self.violate(f"did not converge within {self.scenario.convergence_bound_ms} ms after the "
                         "faults ended")
        self.stopped = True

    # -- results ----------------------------------------------------------------------------------------
    def _moved_min(self) -> int:
        """The fewest moves from the placement when the faults began to any placement over the
        workers alive at the end that balances connectors and tasks (each floor or ceil)."""
        final = sorted(w.slot for w in self.workers if w.alive and not w.leaving)
        if not final:
            return 0
        total = 0
        alive = set(final)
        for want_connectors in (True, False):
            counts = dict.fromkeys(final, 0)
            n = 0
            for item in self.configured:
                if (item.task == CONNECTOR) != want_connectors:
                    continue
                n += 1
                slot = self.initial_slot.get(item)
                if slot is None:
                    continue
                if slot in alive:
                    counts[slot] += 1
                else:
                    total += 1  # its worker is gone: it must move
            q, r = divmod(n, len(final))
            ordered = sorted(counts.values(), reverse=True)
            for k, c in enumerate(ordered):
                cap = q + 1 if k < r else q
                total += max(0, c - cap)
        return total

    def _result(self, wall_s: float) -> RunResult:
        now = self.now
        end_time = now
        for stat in self.stats.values():
            self._settle(stat, end_time)
            if stat.down_since is not None:
                self._outage(stat.down_since, end_time)
                stat.down_since = end_time
        double = 0
        zombie = 0
        for ov in self.overlaps:
            if ov.excused:
                zombie += ov.length(now)
            else:
                double += max(1, ov.length(now))
        g = self.coord.core.group(GROUP) if self.coord.core is not None else None
        converged = self.converged_at is not None and not self.violation
        metrics: dict[str, object] = {
            "scenario": self.scenario.name,
            "assignor": self.assignor,
            "workers": self.n_workers,
            "tasks": self.n_tasks,
            "seed": self.seed,
            "converged": converged,
            "convergence_ms": (max(0, self.converged_at - self.faults_end)
                               if converged and self.converged_at is not None else -1),
            "rebalances": (g.epoch - self.initial_epoch
                           if g is not None and self.phase != "formation" else 0),
            "moved": self.moved,
            "moved_min": self._moved_min() if self.phase != "formation" else 0,
            "downtime_ms": self.downtime,
            "longest_outage_ms": self.longest,
            "double_running_ms": double,
            "messages": self.messages,
            "violation": self.violation,
            "sim_ms": now,
            "wall_ms": round(wall_s * 1000, 3),
        }
        extra: dict[str, object] = {
            "zombie_ms": zombie, "fail_stops": self.fail_stops, "self_fences": self.self_fences,
            "heartbeats": self.heartbeats,
            "computations": self.computations,
            "coordinator_batches": sum(c.batches for c in self.instances),
            "phase_start_ms": self.phase_start,
            "faults_end_ms": self.faults_end if self.faults_end < INF else -1,
        }
        return RunResult(metrics, self.events, extra)


def _items_detail(items: frozenset[Item]) -> str:
    names = sorted(items)
    shown = ", ".join(str(i) for i in names[:6])
    return f"{len(names)} [{shown}{', ...' if len(names) > 6 else ''}]"


def _response_detail(resp: Any, actions: list[Any]) -> str:
    if resp.error_code:
        return f"error {resp.error_code}"
    parts = [type(a).__name__ for a in actions]
    if resp.assignment is not None:
        parts.append(f"assignment {len(resp.assignment.connectors) + len(resp.assignment.tasks)}")
    return " ".join(parts)
