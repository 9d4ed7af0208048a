"""The coordinator side: the partition's store, the coordinator node and, with several nodes,
etcd's leases and the nodes' processes.

* :class:`CoordinatorNode` is a model of ``coordinator/runtime/shard.py`` around the real
  :class:`~coordinator.group.coordinator.GroupCoordinator`: it drains its queue, runs each
  handler, then "fsyncs" the batch (a sampled latency; it may fail, and then every result of
  the batch is rolled back in reverse with ``rollback`` and answered
  COORDINATOR_NOT_AVAILABLE), and only then releases responses, sets timers and re-evaluates
  parked long-poll heartbeats. A restart replays the store into a new core and calls
  ``on_loaded``.
* :class:`Store` is the durable log (a compacted ``key -> record`` map) and, with several
  nodes, who owns the partition (etcd's owner key, its lease and the fencing compare).
* :class:`Cluster` (part of ``Simulation``): the etcd lease model (renewals, expiry, the next
  owner, a lease in doubt, etcd losing its leader) and the nodes' processes (frozen, killed,
  restarted, their host lost).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from connect_wire.errors import ErrorCode as E
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterConnectorsResponse,
    ConnectGroupCommitOffsetsRequest,
    ConnectGroupCommitOffsetsResponse,
    ConnectGroupFetchOffsetsRequest,
    ConnectGroupFetchOffsetsResponse,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)
from coordinator.group import classic as cl
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator, Result
from coordinator.group.invariants import check_invariants, epochs
from coordinator.runtime.shard import MAX_DRAIN, Shard

from .common import GROUP, INF
from .network import Conn, Pending
from .scenarios import Scenario

TIMER_RETRY_MS = 500
"""A timer whose write failed is tried again this much later (as the shard does)."""

_quiet = Shard._quiet  # the daemon's "would this answer tell the member nothing new?"


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


@runtime_checkable
class NodeHost(Protocol):
    """What a coordinator node uses of the simulation (:class:`~simulation.engine.Simulation` is
    one): the clock, the event queue and the coordinator's random stream, the trace and the
    violations; the network's answers and resets; the store, etcd and the nodes' processes; the
    checks after each batch."""

    now: int
    scenario: Scenario
    rng_coord: random.Random
    multi: bool
    stopped: bool
    store: Store
    coord: CoordinatorNode

    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None: ...
    def sample(self, rng: random.Random, r: tuple[int, int]) -> int: ...
    def generated_id(self) -> str: ...
    def faulty(self) -> bool: ...
    def trace(self, kind: str, worker: str = "", item: str = "", epoch: int = -1,
              detail: str = "") -> None: ...
    def violate(self, message: str) -> None: ...
    def all_conns(self) -> list[Conn]: ...
    def net_response(self, conn: Conn, pend: Pending, resp: Any) -> None: ...
    def reset_conn(self, conn: Conn, why: str, notify: bool = True,
                   delay: int | None = None) -> None: ...
    def store_write(self, node: CoordinatorNode, records: list[Any]) -> bool: ...
    def etcd_latency(self) -> int: ...
    def etcd_cut(self, node: CoordinatorNode) -> int: ...
    def etcd_renew(self, node: CoordinatorNode, sent: int) -> None: ...
    def freeze_node(self, node: str, until: int) -> None: ...
    def check_coordinator(self, node: CoordinatorNode, wrote: bool) -> None: ...
    def check_store(self, where: str) -> None: ...
    def on_records(self, records: list[Any]) -> None: ...
    def on_commit(self, req: Any, resp: Any) -> None: ...
    def check_offsets(self, node: CoordinatorNode, where: str) -> None: ...


class CoordinatorNode:
    """A model of the daemon's shard around the real GroupCoordinator: the group's partition as
    loaded on one coordinator node (``node``), for one ownership (``token``).

    With one node (the file store) it is the only one and a ``coordinator_restart`` reloads it in
    place. With several, each acquisition of the partition is a new instance on the
    acquiring node: it loads the store's records, answers COORDINATOR_LOAD_IN_PROGRESS meanwhile,
    then runs ``on_loaded`` (fresh session clocks); it renews its lease every third of the TTL and
    answers only while the lease is certainly valid (``lease_ok``: the TTL counted from its last
    successful renewal's send, minus a margin), else it unloads: from then on every request on its
    connections is answered NOT_COORDINATOR. A graceful handover answers NOT_COORDINATOR to what it
    has not handled and to its parked long polls, lets the batch in flight commit, then releases.
    A frozen node (SIGSTOP) handles nothing: its input waits in its sockets, its timers and the
    batch it was about to commit wait; when it wakes, its input comes first, then its timers."""

    def __init__(self, sim: NodeHost, node: str = "n1", token: int = 1,
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
            classic_max_delay_ms=sc.max_delay_ms,  # (the assignor the workers run has it too)
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
                elif isinstance(req, ConnectGroupCommitOffsetsRequest):
                    result = self.core.commit_offsets(req, now)
                elif isinstance(req, ConnectGroupFetchOffsetsRequest):
                    result = _as_result(self.core.fetch_offsets(req))
                elif isinstance(req, ConnectGroupAlterConnectorsRequest):
                    result = self.core.alter_connectors(req, now)
                elif isinstance(req, CLASSIC_REQUESTS):
                    result = self._classic(req, now)
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

    def _classic(self, req: Any, now: int) -> Result:
        """A classic worker's JoinGroup, SyncGroup, Heartbeat or LeaveGroup through the core's
        classic entry points; its answer (a dict of Kafka's response fields) as a ClassicAnswer."""
        core = self.core
        handler = {cl.Join: core.classic_join, cl.Sync: core.classic_sync,
                   cl.Beat: core.classic_heartbeat, cl.Leave: core.classic_leave}[type(req)]
        result = handler(req, now)
        result.response = ClassicAnswer(result.response)
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
                if self is sim.coord and isinstance(req, OFFSET_REQUESTS):
                    sim.on_commit(req, result.response)
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
        sim.check_offsets(self, f"{self.node}'s load" if sim.multi else "the restart")
        self.epochs = epochs(self.core.state)
        sim.trace("coordinator_loading", detail=(f"{self.node}: " if sim.multi else "")
                  + f"{len(sim.store.log)} records")
        self.at(sim.now + sim.sample(sim.rng_coord, sim.scenario.load_ms), self._loaded, self.inc)

    def fetch(self, connector: str, partitions: list[str]) -> list[tuple[str, str | None]]:
        """What ConnectGroupFetchOffsets answers now for ``partitions`` of ``connector`` (a read:
        the checks ask it after a load)."""
        req = ConnectGroupFetchOffsetsRequest(group_id=GROUP, connector=connector,
                                              partitions=tuple(partitions))
        resp = _as_result(self.core.fetch_offsets(req)).response
        if resp.error_code:
            return [(p, f"<error {resp.error_code}>") for p in partitions]
        return [(o.partition, o.offset) for o in resp.offsets]

    def _loaded(self, inc: int) -> None:
        if inc != self.inc or not self.owner:
            return
        self.loading = False
        self.queue.appendleft(("loaded",))
        self.sim.trace("coordinator_loaded", detail=self.node if self.sim.multi else "")
        self.kick()


OFFSET_REQUESTS = (ConnectGroupCommitOffsetsRequest, ConnectGroupFetchOffsetsRequest)
CLASSIC_REQUESTS = (cl.Join, cl.Sync, cl.Beat, cl.Leave)


class ClassicAnswer(dict[str, Any]):
    """A classic API's answer (the core's dict of Kafka's response fields) with the
    ``error_code`` attribute the node and the network read of every answer."""

    @property
    def error_code(self) -> int:
        return int(self["error_code"])


def _as_result(answer: Any) -> Result:
    """A read handler's answer as a Result (a handler that writes nothing may return the bare
    response)."""
    return answer if isinstance(answer, Result) else Result(response=answer)


def error_response(req: Any, code: int, now: int) -> Any:
    """What the daemon answers a request it cannot handle (retriable errors)."""
    if isinstance(req, CLASSIC_REQUESTS):
        return ClassicAnswer(error_code=code, error_message=None, members=[], assignment=b"")
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
    if isinstance(req, ConnectGroupCommitOffsetsRequest):
        return ConnectGroupCommitOffsetsResponse(error_code=code, error_message=None)
    if isinstance(req, ConnectGroupFetchOffsetsRequest):
        return ConnectGroupFetchOffsetsResponse(error_code=code, error_message=None, offsets=())
    return ConnectGroupAlterConnectorsResponse(error_code=code, error_message=None, group_epoch=-1)


# == several nodes and etcd, as a part of Simulation ==============================================


class Cluster:
    """The part of :class:`~simulation.engine.Simulation` that models the coordinator nodes
    around the partition and etcd: the store's fenced commit, lease renewals and expiry, the
    next owner's election, a node's lease in doubt, etcd losing its leader, and node
    processes frozen, killed, restarted or cut off with their host."""

    # -- the store's fenced commit ------------------------------------------------------------------
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

    # -- etcd: lease renewals, expiry, the next owner, losing its leader ----------------------------
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

    # -- a node's own lease in doubt (what FindCoordinator hears from it) ---------------------------
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

    # -- the nodes' processes: frozen, killed, restarted, their host lost ---------------------------
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

