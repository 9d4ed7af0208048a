"""What a run checks and measures as it goes.

* **Items**: :class:`Run` (one item on one worker process), :class:`Overlap` (two runs of one
  item at once: a violation unless the old holder was a frozen zombie, docs/simulation.md) and
  :class:`ItemStat` (an item's downtime), fed by the workers (``run_started``,
  ``run_stopped``) and by the committed records (``on_records``: the configured items).
* **Invariants**: the coordinator core's (``check_invariants`` after writes), the store's
  (``check_store``: exactly what the owners committed), a woken worker's fencing
  (``after_resume``), and convergence (``maybe_converged``). The first violation stops the
  run (``Simulation.violate``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol, runtime_checkable

from connect_wire.items import Item
from connect_wire.records import GroupConnectorsKey
from coordinator.group.coordinator import GroupCoordinator
from coordinator.group.invariants import InvariantViolation, check_invariants, epochs
from coordinator.group.model import GroupState
from worker_client.membership import Membership, State

from .common import GROUP


@runtime_checkable
class WatchedWorker(Protocol):
    """A worker process as the checks see it (:class:`~simulation.worker_model.SimWorker` is
    one): what it runs, its membership, its loop's state and its pauses."""

    name: str
    slot: int
    inc: int
    alive: bool
    leaving: bool
    blocked: bool
    m: Membership
    runs: dict[Item, Run]
    pending: deque[Any]
    acting: Any
    acting_done: bool
    pause_began: int
    pause_lease_expired: bool
    resumed_at: int
    zombie_limit: int

    @property
    def paused(self) -> bool: ...
    @property
    def stop_deadline(self) -> int: ...


@runtime_checkable
class CheckedNode(Protocol):
    """A coordinator node as the checks see it (:class:`~simulation.nodes.CoordinatorNode` is
    one): its core and the epochs its invariants were last checked against."""

    core: GroupCoordinator
    epochs: dict[str, Any]


# == bookkeeping of running items ====================================================================


class Run:
    """One item on one worker process: running from ``start`` (its start began) until ``end``
    (its stop completed); *up* (doing work) from ``up_at`` until ``stop_begin``."""

    __slots__ = ("item", "worker", "start", "up_at", "stop_begin", "end")

    def __init__(self, item: Item, worker: WatchedWorker, start: int, up_at: int) -> None:
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


# == the checks, as a part of Simulation ========================================================


class Invariants:
    """The part of :class:`~simulation.engine.Simulation` that watches items and the
    coordinator: who runs what (double running, moves, downtime), what the store holds, the
    coordinator core's invariants, a woken worker's fencing and convergence."""

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
    def check_coordinator(self, node: CheckedNode, wrote: bool) -> None:
        if wrote:
            self._writes += 1
            if self._writes % self._check_every == 0:
                self._check_core(node)
        self.maybe_converged()

    def _check_core(self, node: CheckedNode) -> None:
        try:
            check_invariants(node.core.state, node.epochs)
        except InvariantViolation as exc:
            self.violate(f"coordinator invariants: {exc}")
            return
        node.epochs = epochs(node.core.state)

    def after_resume(self, w: WatchedWorker) -> None:
        """A frozen worker woke up: it must stop what it may no longer run within one watchdog
        period (plus a round trip: the stale answer it finds in its socket first)."""
        self.at(self.now + self.zombie_grace, self._zombie_check, w, w.inc)
        # The fail-stop rule bounds the excuse: whatever the woken worker still runs ends by its
        # lease end + budget (the lease backstop), or as it wakes if that has passed.
        last = w.m.last_success_ms
        lease_end = last + self.scenario.session_timeout_ms if last is not None else self.now
        w.zombie_limit = max(self.now, lease_end + w.stop_deadline)
        self.at(w.zombie_limit + 1, self._zombie_limit_check, w, w.zombie_limit)

    def _zombie_limit_check(self, w: WatchedWorker, limit: int) -> None:
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

    def _zombie_check(self, w: WatchedWorker, inc: int) -> None:
        for ov in self.overlaps:
            if ov.excused and ov.old.worker is w and ov.old.stop_begin is None and inc == w.inc and w.alive:
                if w.paused:
                    continue
                self.violate(f"{w.name} woke from a pause and still runs {ov.item}, which "
                             f"{ov.new.worker.name} runs since t={ov.at}: it did not fence itself")
                return

    def worker_settled(self, w: WatchedWorker) -> None:
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

    def _worker_ready(self, w: WatchedWorker, g: Any) -> bool:
        m = w.m
        return (w.alive and not w.leaving and not w.blocked and (w.acting is None or w.acting_done)
                and not w.pending and not w.paused and m.state is State.STABLE
                and m.member_epoch == g.epoch and m.member_id in g.members)


