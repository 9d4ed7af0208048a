"""The worker: a model of ``worker_client/worker.py`` around the real
:class:`~worker_client.membership.Membership` and assignors.

A main loop sends each heartbeat the membership asks for and carries out its actions in order
(revoke = stop the items, sampled stop durations, then ``revoked``; assign = start them, then
``assigned_started``; lost = stop everything), a watchdog (``check_session`` every 100 ms), the
chosen worker's Prepare -> ``assign`` -> Install task on a second connection, and ``stop()``,
which drains the work through the loop (heartbeats go on) before it leaves. The fail-stop
rule: an instance not stopped within the stop budget of its stop's beginning, or anything
still running or stopping at the lease's end plus the budget, ends the process, which is
restarted 1-5 s later.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from connect_wire.assignors import (
    EagerAssignor,
    IncrementalCooperativeAssignor,
    group_from_prepare,
    install_request,
)
from connect_wire.errors import ErrorCode as E
from connect_wire.items import Item
from connect_wire.messages import (
    ConnectGroupCommitOffsetsRequest,
    ConnectGroupFetchOffsetsRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_commit_offsets_request_v0 as _commit
from worker_client.membership import RETRY as MEMBERSHIP_RETRY
from worker_client.membership import Assign, AssignorAd, Compute, Fatal, Lost, Membership, Revoke, State

from .common import GROUP, INF, WATCHDOG_MS
from .invariants import Run, canonical, partition_key
from .network import Conn, Pending
from .scenarios import Scenario

RETRY_COORDINATOR = (E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE)
LEAVE_RETRY = (E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR)
STOP_POLL_MS = 20
"""worker.stop() polls every 20 ms for the drain to finish."""
FENCED = (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID, E.ITEM_NOT_OWNED)
"""A commit refused with these raises FencedError in the task (so does a STALE_MEMBER_EPOCH the
worker's own epoch does not overtake while it still owns the item)."""
STALE_POLL_MS = 100
"""A commit refused STALE_MEMBER_EPOCH waits for the worker's heartbeat to bring a newer epoch:
looked at this often, for at most a session."""


@runtime_checkable
class WorkerHost(Protocol):
    """What a worker process uses of the simulation (:class:`~simulation.engine.Simulation` is
    one): the clock, the event queue and the workers' random streams, the trace and the
    violations; the network; the supervisor's restart; the bookkeeping of runs and the checks."""

    now: int
    scenario: Scenario
    assignor: str
    configured: set[Item]
    rng_work: random.Random
    rng_client: random.Random
    rng_supervisor: random.Random
    rng_offsets: random.Random
    commit_counts: dict[str, int]
    computations: int
    fail_stops: int
    self_fences: int

    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None: ...
    def sample(self, rng: random.Random, r: tuple[int, int]) -> int: ...
    def trace(self, kind: str, worker: str = "", item: str = "", epoch: int = -1,
              detail: str = "") -> None: ...
    def violate(self, message: str) -> None: ...
    def latency(self) -> int: ...
    def connect(self, w: SimWorker, kind: str) -> Conn: ...
    def net_request(self, conn: Conn, pend: Pending) -> None: ...
    def reset_conn(self, conn: Conn, why: str, notify: bool = True,
                   delay: int | None = None) -> None: ...
    def restart_worker(self, w: SimWorker) -> None: ...
    def run_started(self, run: Run) -> None: ...
    def run_stopped(self, run: Run, stop_begin: int, end: int) -> None: ...
    def after_resume(self, w: SimWorker) -> None: ...
    def resource_write(self, run: Run, member: str) -> bool: ...
    def worker_settled(self, w: SimWorker) -> None: ...


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
    * The fail-stop rule, with B the stop budget (:attr:`stop_deadline`, half the
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

    def __init__(self, sim: WorkerHost, slot: int) -> None:
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
        self.pause_on_write: int | None = None
        """A pause that begins with this process's next write (``pause_mid_write``): its length."""
        self.tokens: dict[Item, int] = {}
        """The fencing token of each item, from the heartbeat answers' assignments (the context's
        ``fencing_token``)."""

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
    def _new_process(self) -> None:
        """A new incarnation's process state, whichever protocol it speaks: alive, nothing
        pending, queued, running or known yet."""
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
        self.tokens = {}
        self.pause_on_write = None

    def start(self) -> None:
        sim, sc = self.sim, self.sim.scenario
        self._new_process()
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
        """The fail-stop rule: an instance that is not stopped within the stop budget
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
        if resp.error_code == 0 and resp.assignment is not None:
            for t in resp.assignment.fencing_tokens:
                self.tokens[Item(t.connector, t.task)] = t.token
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
            run = Run(item, self, now, now + lo + int(span * rng.random() ** 2),
                      self.tokens.get(item), self.m.member_id)
            self.runs[item] = run
            sim.run_started(run)
            if sim.scenario.offset_commits:
                self.at(run.up_at, self._work_begin, run)
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
            if run.ready and not run.fenced:  # the plugin's stop() commits its last position
                self._commit(run, run.pos, False)
        if abandoned:
            why = {"hanging_stop": "stop() did not return", "ignores_cancel":
                   "run() ignored the cancellation"}.get(mode, "stop() overran the budget")
            more = f" (+{len(abandoned) - 1} more)" if len(abandoned) > 1 else ""
            self.at(now + deadline, self._fail_stop,
                    f"{abandoned[0]}{more} not stopped within {deadline} ms of its stop "
                    f"(t={now}): {why}")
        return done

    # -- the instances' work: offsets and the resource ---------------------------------------------
    # Each instance, once up, fetches its partition's committed offset and resumes from it; then,
    # every ``work_ms``, it advances its position, writes to its item's resource with its fencing
    # token (the write lands ``write_ms`` later, whatever happens to the process meanwhile: a
    # write in flight) and commits the position (awaited: one commit in flight); its stop()
    # commits its last position. A FencedError (or a write refused by the token) ends its loop.
    def _working(self, run: Run) -> bool:
        return self.runs.get(run.item) is run and not run.fenced

    def _work_retry(self, run: Run, fn: Callable[[Run], None]) -> None:
        if self._working(run):
            self.at(self.sim.now + int(self.sim.rng_offsets.uniform(50, 1_000)), fn, run)

    def _work_begin(self, run: Run) -> None:
        if not self._working(run):
            return
        item = run.item
        req = ConnectGroupFetchOffsetsRequest(group_id=GROUP, connector=item.connector,
                                              partitions=(partition_key(item),))
        self.send("ctl", req, lambda resp: self._fetched(run, resp),
                  lambda why: self._work_retry(run, self._work_begin))

    def _fetched(self, run: Run, resp: Any) -> None:
        if not self._working(run):
            return
        sim = self.sim
        if resp.error_code:
            if resp.error_code in RETRY_COORDINATOR:
                self.invalidate()
            self._work_retry(run, self._work_begin)
            return
        offset = resp.offsets[0].offset if resp.offsets else None
        run.pos = run.committed = json.loads(offset)["pos"] if offset else 0
        run.ready = True
        sim.trace("offset_fetched", self.name, str(run.item), detail=f"resumes at {run.pos}")
        self.at(sim.now + sim.sample(sim.rng_offsets, sim.scenario.work_ms), self._tick, run)

    def _tick(self, run: Run) -> None:
        if not self._working(run):
            return
        sim = self.sim
        run.pos += 1
        if run.item in self.m.assigned:  # context.fencing_token is live: a new grant, a new token
            run.token = self.tokens.get(run.item, run.token)
        self.at(sim.now + sim.sample(sim.rng_offsets, sim.scenario.write_ms), self._write_lands, run)
        self._commit(run, run.pos, True)
        if self.pause_on_write is not None:  # frozen mid-write (and with this commit in flight)
            self.pause_anyway()

    def pause_anyway(self) -> None:
        """A ``pause_mid_write`` fault: now (a write began, or none came in time)."""
        if self.pause_on_write is not None:
            duration, self.pause_on_write = self.pause_on_write, None
            self.pause(duration)

    def _write_lands(self, run: Run) -> None:
        """The write's transaction commits (fencing.py: the token checked and recorded with the
        rows, in one transaction): a process event, so a process frozen mid-write commits it when
        it wakes, whatever happened meanwhile (even after its instance was stopped); one that
        died never does (the transaction is rolled back)."""
        if not self.sim.resource_write(run, run.member):
            run.fenced = True  # StaleTokenError: the task's loop ends

    def _commit(self, run: Run, pos: int, loop: bool) -> None:
        """context.commit_offsets: with the member id and epoch the worker has now. ``loop``: the
        task's loop awaits it (the next tick after it); else stop()'s last commit."""
        sim, m, item = self.sim, self.m, run.item
        req = ConnectGroupCommitOffsetsRequest(
            group_id=GROUP, member_id=m.member_id, member_epoch=m.member_epoch,
            connector=item.connector, task=item.task,
            offsets=(_commit.PartitionOffset(partition=partition_key(item),
                                              offset=canonical({"pos": pos})),))
        sim.commit_counts["sent"] += 1
        self.send("ctl", req, lambda resp: self._committed(run, pos, loop, req, resp),
                  lambda why: self._commit_again(run, pos, loop))

    def _commit_live(self, run: Run, loop: bool) -> bool:
        if run.fenced:
            return False
        if loop:
            return self.runs.get(run.item) is run
        return run.end is not None and run.end > self.sim.now  # stop() still awaits it

    def _commit_again(self, run: Run, pos: int, loop: bool) -> None:
        if self._commit_live(run, loop):
            self.sim.commit_counts["retried"] += 1
            self.at(self.sim.now + int(self.sim.rng_offsets.uniform(50, 1_000)), self._commit, run, pos, loop)

    def _committed(self, run: Run, pos: int, loop: bool, req: Any, resp: Any) -> None:
        sim = self.sim
        code = resp.error_code
        if code == 0:
            sim.commit_counts["acknowledged"] += 1
            run.committed = max(run.committed, pos)
            if loop and self._working(run):
                self.at(sim.now + sim.sample(sim.rng_offsets, sim.scenario.work_ms), self._tick, run)
        elif code == E.STALE_MEMBER_EPOCH:
            self._stale(run, pos, loop, req.member_epoch, sim.now)
        elif code in FENCED:
            self._fenced(run, code)
        else:
            if code in RETRY_COORDINATOR:
                self.invalidate()
            self._commit_again(run, pos, loop)

    def _stale(self, run: Run, pos: int, loop: bool, sent: int, since: int) -> None:
        """STALE_MEMBER_EPOCH: retried once the heartbeat brought a newer epoch while the worker
        still owns the item (an epoch bump elsewhere must not fail a legit owner's commit); a
        FencedError if it no longer owns it, or its epoch does not move on within a session."""
        if not self._commit_live(run, loop):
            return
        m, now = self.m, self.sim.now
        owns = run.item in m.owned or run.item in m.assigned
        if owns and m.member_epoch > sent:
            self.sim.commit_counts["retried_stale"] += 1
            self._commit(run, pos, loop)
        elif not owns or m.member_epoch <= 0 or now - since > self.sim.scenario.session_timeout_ms:
            self._fenced(run, E.STALE_MEMBER_EPOCH)
        else:
            self.at(now + STALE_POLL_MS, self._stale, run, pos, loop, sent, since)

    def _fenced(self, run: Run, code: int) -> None:
        """FencedError in the task: its loop ends (the worker stops the instance soon)."""
        run.fenced = True
        name = E(code).name
        self.sim.commit_counts[f"fenced_{name}"] = self.sim.commit_counts.get(f"fenced_{name}", 0) + 1
        self.sim.trace("commit_fenced", self.name, str(run.item), detail=name)

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

