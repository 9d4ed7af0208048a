"""A classic worker: a model of Kafka Connect's distributed worker (``WorkerCoordinator`` on
``AbstractCoordinator``, driven by ``DistributedHerder``) in a connect group, through the
coordinator's classic entry points (JoinGroup, SyncGroup, Heartbeat, LeaveGroup).

:class:`ClassicWorker` is a :class:`~simulation.worker_model.SimWorker` whose process speaks
either protocol, one per incarnation: while :attr:`protocols` is None it is the new-protocol
worker unchanged; else it offers those Connect protocols (``sessioned``, ``compatible``,
``default``) and behaves as Connect does:

* **join**: JoinGroup (MEMBER_ID_REQUIRED: again with the id it got), its metadata naming what it
  runs (``allocation``, versions 1/2); then SyncGroup. An eager (``default``) worker stops
  everything before it rejoins (``onJoinPrepare``) and owns nothing when it joins.
* **assignment**: version 0 is the whole set (start it); versions 1/2 are incremental: stop what
  is revoked, start what is assigned, keep the rest; a worker told to revoke rejoins once its
  stops are done; a ``delay`` schedules a rejoin then.
* **heartbeat** every heartbeat interval (the heartbeat thread: it goes on while the herder
  stops or starts work); REBALANCE_IN_PROGRESS: rejoin; ILLEGAL_GENERATION: rejoin with its
  member id; UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID: the membership is gone: stop everything,
  join afresh.
* **session loss**: a worker that has not completed a heartbeat (nor a join or sync) within
  its session timeout of sending it stops all its work, each stop taking up to half its
  rebalance timeout (``task.shutdown.graceful.timeout.ms``), then joins afresh: what a worker
  must do for the coordinator's hold of a fenced member (session deadline plus half its
  rebalance timeout) to keep its items from running twice.
* **stop** (a graceful shutdown): stop all work, then LeaveGroup (a static member does not
  leave: its next process, of either protocol, replaces it by its instance id); the process
  exits.

What it does not have of the new-protocol worker: offsets and fencing tokens (its instances do
no work through the coordinator), the lease backstop and the fail-stop rule (a real Connect
worker abandons a task that does not stop in time and keeps running: the scenarios with
misbehaving stops are not given to classic workers, docs/simulation.md).
"""

from __future__ import annotations

from typing import Any

from connect_wire import classic_connect as cc
from connect_wire.errors import ErrorCode as E
from connect_wire.items import Item
from coordinator.group import classic as cl
from worker_client.membership import State

from .common import GROUP
from .worker_model import RETRY_COORDINATOR, SimWorker, WorkerHost, _items_detail

CLASSIC_PROTOCOLS = {
    "sessioned": (cc.SESSIONED, cc.COMPATIBLE, cc.EAGER),
    "compatible": (cc.COMPATIBLE, cc.EAGER),
    "default": (cc.EAGER,),
}
"""What a Connect worker offers by its ``connect.protocol`` setting, in preference order."""
GONE = (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID)
RETRIABLE = (*RETRY_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS)


class ClassicView:
    """What the checks read of a worker's membership (``w.m``), for a classic worker: its
    member id, its generation as its epoch, STABLE once synced with nothing left to do, what
    it runs as owned, and the send time of its last request the coordinator answered."""

    def __init__(self, w: ClassicWorker) -> None:
        self.w = w
        self.member_id = ""
        self.instance_id: str | None = None
        self.member_epoch = -1
        self.last_success_ms: int | None = None
        self.heartbeat_interval_ms = 0

    @property
    def state(self) -> State:
        w = self.w
        if w.phase == "stable" and not w.rejoin and not w.busy:
            return State.STABLE
        return State.JOINING

    @property
    def owned(self) -> frozenset[Item]:
        return frozenset(self.w.runs)

    assigned = owned

    def lease_expired(self, now_ms: int) -> bool:
        last = self.last_success_ms
        return last is not None and now_ms - last >= self.w.sim.scenario.session_timeout_ms

    def left(self) -> None:
        self.member_id = ""
        self.member_epoch = -1


class ClassicWorker(SimWorker):
    """A worker slot whose process speaks the classic protocol when :attr:`protocols` is set
    (see the module's docstring); the new protocol (SimWorker) otherwise."""

    def __init__(self, sim: WorkerHost, slot: int, protocol: str | None = None) -> None:
        super().__init__(sim, slot)
        self.protocol = protocol
        """The Connect protocol setting this slot's next process uses, or None: new protocol."""
        self.switch_to: str | None | bool = False
        """A migration: the protocol of the process after this one's graceful stop (False: the
        same)."""
        self.protocols: tuple[str, ...] | None = None
        self.phase = "joining"
        self.rejoin = False
        self.busy = 0
        self.joining = False
        self.beat_at: int | None = None
        self.generation = -1
        self.chosen = ""
        self.era = 0
        """Bumped when the worker loses its membership: answers to what it sent before are
        ignored."""

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.protocol is None:
            self.protocols = None
            super().start()
            return
        sim, sc = self.sim, self.sim.scenario
        self.protocols = CLASSIC_PROTOCOLS[self.protocol]
        self._new_process()
        self.phase = "joining"
        self.rejoin = False
        self.busy = 0
        self.joining = False
        self.beat_at = None
        self.generation = -1
        self.chosen = ""
        self.era = 0
        m = self.m = ClassicView(self)  # type: ignore[assignment]
        m.instance_id = self.name if sc.identity == "static" else None
        m.heartbeat_interval_ms = sc.heartbeat_interval_ms
        sim.trace("worker_start", self.name, detail=f"incarnation {self.inc}, classic {self.protocol}")
        self.at(sim.now, self._join)

    @property
    def classic(self) -> bool:
        return self.protocols is not None

    def graceful_stop(self, restart_after: int | None) -> None:
        if self.switch_to is not False and restart_after is not None:
            self.protocol = self.switch_to  # type: ignore[assignment]  # (the next process's)
            self.switch_to = False
        if not self.classic:
            super().graceful_stop(restart_after)
            return
        if not self.alive or self.leaving:
            return
        self.leaving = True
        self.leave_restart = restart_after
        if self.paused:
            self.deferred.append((1, self._c_begin_stop, ()))
        else:
            self._c_begin_stop()

    def _c_begin_stop(self) -> None:
        """DistributedHerder.halt(): stop every connector and task, then the member stops
        (LeaveGroup for a dynamic member) and the process exits."""
        sim = self.sim
        sim.trace("worker_stop", self.name, detail=f"{len(self.runs)} items")
        self.beat_at = None  # the heartbeat thread ends with the member
        if self.hb is not None:
            self.hb.ignore = True
            self.hb = None
        done = self._stop_items(frozenset(self.runs))
        self.at(done, self._c_leave, 0)

    def _c_leave(self, attempt: int) -> None:
        m = self.m
        if not m.member_id or m.instance_id is not None:
            self._c_exit()
            return
        req = cl.Leave(GROUP, ((m.member_id, None),))

        def ok(resp: Any) -> None:
            if resp.error_code in RETRIABLE and attempt < 3:
                self.invalidate()
                self.at(self.sim.now + self.backoff(), self._c_leave, attempt + 1)
            else:
                self._c_exit()

        def failed(why: str) -> None:
            if attempt < 3:
                self.at(self.sim.now + self.backoff(), self._c_leave, attempt + 1)
            else:
                self._c_exit()

        self.send("ctl", req, ok, failed, self.heartbeat_answer_budget)

    def _c_exit(self) -> None:
        restart_after = self.leave_restart
        self.m.left()
        self.sim.trace("worker_left", self.name)
        self._shutdown()
        if restart_after is not None:
            self.sim.at(self.sim.now + restart_after, self.sim.restart_worker, self)

    # -- the new protocol's pieces a classic worker does not have ------------------------------------
    def _check_backstop(self) -> None:
        if not self.classic:
            super()._check_backstop()

    def _work_begin(self, run: Any) -> None:
        if not self.classic:
            super()._work_begin(run)

    # -- join and sync ----------------------------------------------------------------------------------
    def _metadata(self) -> tuple[tuple[str, bytes], ...]:
        assert self.protocols is not None
        running = self._reported()
        allocation = cc.encode_assignment(cc.Assignment(
            2, 0, "", "", 0, cc.entries_of(running), ())) if running else None
        url = f"http://{self.name}:8083"
        return tuple((p, cc.encode_metadata(cc.WorkerMetadata(
            cc.PROTOCOL_VERSIONS[p], url, 0, allocation if cc.PROTOCOL_VERSIONS[p] else None)))
            for p in self.protocols)

    def _join(self) -> None:
        """AbstractCoordinator.ensureActiveGroup, once the herder is not busy stopping work."""
        if self.leaving or self.busy or self.joining:
            return
        if self.protocols == (cc.EAGER,) and self.runs:
            # onJoinPrepare (eager): every connector and task stops before the rejoin
            self.sim.trace("revoke", self.name, epoch=self.generation,
                           detail=_items_detail(frozenset(self.runs)) + " (eager rejoin)")
            self._c_stop(frozenset(self.runs), self._join)
            return
        self.joining = True
        self.phase = "joining"
        self.rejoin = False
        sc, m = self.sim.scenario, self.m
        req = cl.Join(GROUP, m.member_id, m.instance_id, sc.session_timeout_ms,
                      sc.rebalance_timeout_ms, cc.PROTOCOL_TYPE, self._metadata())
        self.sim.trace("join_group", self.name, epoch=self.generation,
                       detail=f"{m.member_id or '(new)'} runs {len(self.runs)}")
        sent, era = self.sim.now, self.era
        self.send("ctl", req, lambda r: self._on_join(r, sent, era), self._join_failed,
                  self.heartbeat_answer_budget)

    def _join_failed(self, why: str) -> None:
        self.joining = False
        self.sim.trace("join_failed", self.name, detail=why)
        self.at(self.sim.now + self.backoff(), self._join)

    def _on_join(self, r: Any, sent: int, era: int) -> None:
        sim, m = self.sim, self.m
        if era != self.era:
            return  # (answered after the worker lost its membership: it joins afresh)
        self.joining = False
        code = r.error_code
        sim.trace("join_response", self.name, epoch=r.get("generation_id", -1), detail=f"error {code}")
        if self.leaving:
            return
        if code == E.MEMBER_ID_REQUIRED:
            m.member_id = r["member_id"]
            self._join()
        elif code == 0:
            m.member_id = r["member_id"]
            self.generation = m.member_epoch = r["generation_id"]
            self.chosen = r["protocol_name"]
            self._renewed(sent)
            self._sync()
        elif code in GONE:
            self._gone(code)
        else:
            if code in RETRY_COORDINATOR:
                self.invalidate()
            if code not in RETRIABLE:
                sim.trace("join_refused", self.name, detail=str(code))
            self.at(sim.now + self.backoff(), self._join)

    def _sync(self) -> None:
        self.phase = "syncing"
        m = self.m
        req = cl.Sync(GROUP, self.generation, m.member_id, m.instance_id, cc.PROTOCOL_TYPE,
                      self.chosen)
        sent, gen = self.sim.now, self.generation
        self.send("ctl", req, lambda r: self._on_sync(r, sent, gen), self._sync_failed,
                  self.heartbeat_answer_budget)

    def _sync_failed(self, why: str) -> None:
        self.sim.trace("sync_failed", self.name, detail=why)
        self.at(self.sim.now + self.backoff(), self._join)

    def _on_sync(self, r: Any, sent: int, gen: int) -> None:
        sim = self.sim
        code = r.error_code
        if self.leaving or gen != self.generation or self.phase != "syncing":
            return
        if code in GONE:
            self._gone(code)
            return
        if code:
            sim.trace("sync_response", self.name, epoch=gen, detail=f"error {code}")
            if code in RETRY_COORDINATOR:
                self.invalidate()
            delay = self.backoff() if code in RETRIABLE else 0
            self.at(sim.now + delay, self._join)
            return
        self._renewed(sent)
        a = cc.decode_assignment(r["assignment"])
        assigned = a.assigned_items()
        if a.version == 0:
            revoked = frozenset(self.runs) - assigned
        else:
            revoked = a.revoked_items() & frozenset(self.runs)
        start = assigned - frozenset(self.runs)
        sim.trace("sync_response", self.name, epoch=gen,
                  detail=f"v{a.version} assigned {_items_detail(assigned)} revoked "
                  f"{_items_detail(a.revoked_items())} delay {a.delay_ms}")
        self.phase = "stable"
        self._arm_heartbeat(sim.now + sim.scenario.heartbeat_interval_ms)
        self.arm_watchdog()
        if a.delay_ms > 0:  # the scheduled rebalance: Connect rejoins when the delay is over
            self.at(sim.now + a.delay_ms, self._scheduled_rejoin, gen)

        def then() -> None:
            if self.generation != gen or self.phase != "stable" or self.leaving:
                return
            if start:
                sim.trace("assign", self.name, epoch=gen, detail=_items_detail(start))
                self._start_items(start)
            if revoked or a.version and a.revoked_items():
                self.rejoin = True  # (Connect: told to revoke, it rejoins)
                self._join()
            else:
                sim.worker_settled(self)

        if revoked:
            sim.trace("revoke", self.name, epoch=gen, detail=_items_detail(revoked))
            self._revoke(revoked, then)
        else:
            then()

    def _reported(self) -> frozenset[Item]:
        """What its JoinGroup's allocation names: what it runs."""
        return frozenset(self.runs)

    def _revoke(self, items: frozenset[Item], then: Any) -> None:
        """An incremental assignment's revocation: the herder stops those items."""
        self._c_stop(items, then)

    def _scheduled_rejoin(self, gen: int) -> None:
        if self.generation == gen and self.phase == "stable" and not self.leaving:
            self.rejoin = True
            self._join()

    def _c_stop(self, items: frozenset[Item], then: Any) -> None:
        """The herder stops ``items`` (in parallel, each within the stop budget), then ``then``;
        a worker that must rejoin does once no stop is in progress."""
        self.busy += 1
        done = self._stop_items(items)

        def finished() -> None:
            self.busy -= 1
            then()
            if not self.busy and self.phase == "joining" and self.rejoin:
                self._join()

        self.at(done, finished)

    # -- heartbeats (the heartbeat thread) -------------------------------------------------------------
    def _arm_heartbeat(self, t: int) -> None:
        self.beat_at = t
        self.at(t, self._beat, t)

    def _beat(self, t: int) -> None:
        if self.beat_at != t or self.leaving:
            return
        self.beat_at = None
        if self.phase != "stable" or self.hb is not None:
            return
        m = self.m
        req = cl.Beat(GROUP, self.generation, m.member_id, m.instance_id)
        sent, gen = self.sim.now, self.generation
        self.sim.trace("heartbeat", self.name, epoch=gen, detail="classic")
        self.hb = self.send("hb", req, lambda r: self._on_beat(r, sent, gen), self._beat_failed,
                            self.heartbeat_answer_budget)

    def _beat_failed(self, why: str) -> None:
        self.hb = None
        self.sim.trace("heartbeat_failed", self.name, detail=why)
        if self.phase == "stable":
            self._arm_heartbeat(self.sim.now + self.retry_delay(self.backoff()))

    def _on_beat(self, r: Any, sent: int, gen: int) -> None:
        sim = self.sim
        self.hb = None
        code = r.error_code
        sim.trace("heartbeat_response", self.name, epoch=gen, detail=f"error {code}" if code else "")
        if self.leaving or gen != self.generation or self.phase != "stable":
            return
        if code in (0, E.REBALANCE_IN_PROGRESS):
            self._renewed(sent)  # (the coordinator counted it: the session goes on)
        if code == 0:
            self._arm_heartbeat(sim.now + sim.scenario.heartbeat_interval_ms)
        elif code in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION):
            self.rejoin = True
            self._arm_heartbeat(sim.now + sim.scenario.heartbeat_interval_ms)
            self._join()
        elif code in GONE:
            self._gone(code)
        else:
            if code in RETRY_COORDINATOR:
                self.invalidate()
            self._arm_heartbeat(sim.now + self.retry_delay(self.backoff()))

    def _renewed(self, sent: int) -> None:
        m = self.m
        if m.last_success_ms is None or sent > m.last_success_ms:
            m.last_success_ms = sent
        self.arm_watchdog()

    def _gone(self, code: int) -> None:
        """The coordinator no longer knows this member (fenced, or its instance taken): stop
        everything, then join afresh."""
        self.sim.trace("lost", self.name, detail=f"error {code}; {_items_detail(frozenset(self.runs))}")
        self._lose_all(fresh=True)

    def _lose_all(self, fresh: bool) -> None:
        m = self.m
        self.phase = "joining"
        self.beat_at = None
        if self.hb is not None:
            self.hb.ignore = True
            self.hb = None
        self.era += 1
        self.joining = False
        if fresh and m.instance_id is None:
            m.member_id = ""
        self.generation = m.member_epoch = -1
        self.rejoin = True
        # (whatever runs stops now, beside a stop already in progress)
        self._c_stop(frozenset(self.runs), self._join)

    # -- session loss (the classic worker's own rule) ---------------------------------------------------
    def _watchdog(self, due: int) -> None:
        if not self.classic:
            super()._watchdog(due)
            return
        if self.wd_at != due or self.leaving:
            return
        self.wd_at = None
        sim, m = self.sim, self.m
        last = m.last_success_ms
        if last is None:
            return
        end = last + sim.scenario.session_timeout_ms
        if end > sim.now:
            self.wd_at = end
            self.at(end, self._watchdog, end)
            return
        if not self.runs and self.phase == "joining":
            return
        sim.trace("self_fenced", self.name, detail=_items_detail(frozenset(self.runs)))
        sim.self_fences += 1
        m.last_success_ms = None
        self._lose_all(fresh=True)
