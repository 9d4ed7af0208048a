"""What a run checks and measures as it goes.

* **Items**: :class:`Run` (one item on one worker process), :class:`Overlap` (two runs of one
  item at once: a violation unless the old holder was a frozen zombie, docs/simulation.md) and
  :class:`ItemStat` (an item's downtime), fed by the workers (``run_started``,
  ``run_stopped``) and by the committed records (``on_records``: the configured items).
* **Invariants**: the coordinator core's (``check_invariants`` after writes), the store's
  (``check_store``: exactly what the owners committed), the offsets and fencing tokens (the
  :class:`Ledger`: ``on_records``, ``on_commit``, ``check_offsets``, ``resource_write``), a woken
  worker's fencing (``after_resume``), and convergence (``maybe_converged``). The first violation
  stops the run (``Simulation.violate``).
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, NamedTuple, Protocol, runtime_checkable

from connect_wire.items import Item, items_from_wire
from connect_wire.messages import ConnectGroupCommitOffsetsRequest, ConnectGroupFetchOffsetsRequest
from connect_wire.records import CurrentMemberAssignmentKey, GroupConnectorsKey, GroupMemberKey
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

    def fetch(self, connector: str, partitions: list[str]) -> list[tuple[str, str | None]]: ...


# == bookkeeping of running items ====================================================================


class Run:
    """One item on one worker process: running from ``start`` (its start began) until ``end``
    (its stop completed); *up* (doing work) from ``up_at`` until ``stop_begin``.

    Its work (:mod:`simulation.worker_model`): ``token`` is the fencing token the worker was
    given for the item (None: the coordinator gave none), ``pos`` the position it has reached
    (resumed from the committed offset once ``ready``), ``committed`` the last position the
    coordinator acknowledged to it; ``fenced`` once a commit raised FencedError or the resource
    refused its token (the task's loop ends)."""

    __slots__ = ("item", "worker", "start", "up_at", "stop_begin", "end", "token", "member", "pos",
                 "committed", "ready", "fenced", "committing")

    def __init__(self, item: Item, worker: WatchedWorker, start: int, up_at: int,
                 token: int | None = None, member: str = "") -> None:
        self.item = item
        self.worker = worker
        self.start = start
        self.up_at = up_at
        self.stop_begin: int | None = None
        self.end: int | None = None
        self.token = token
        self.member = member
        self.pos = 0
        self.committed = 0
        self.ready = False
        self.fenced = False
        self.committing = False


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


# == offsets and fencing tokens: the simulator's own ledger ==========================================


def partition_key(item: Item) -> str:
    """The source partition a simulated instance commits: one per item, in canonical JSON (sorted
    keys, no spaces), as the wire wants it."""
    return canonical({"task": item.task})


def canonical(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Grant(NamedTuple):
    """One grant of an item to a member (the item entered the member's owned set), in the order
    the grants became durable (``seq``), with the fencing token it carried."""

    seq: int
    member: str
    item: Item
    token: int
    at: int


class Ledger:
    """The simulator's own account of who owns what, which fencing tokens were given and which
    offsets were acknowledged, and the checks against it. Pure: fed the records the
    coordinator made durable (:meth:`records`, in the order it committed them), the commits it
    applied and the fetches it answered (:meth:`commit`, :meth:`fetched`, at their place in
    that order) and the modelled resources' writes (:meth:`write`). Each call returns the
    violations it found (an empty list: none), so it can be tested on hand-made traces.

    * **(a) An accepted commit came from the item's owner**: when the coordinator applied a
      commit, its member exists (a GroupMember record), its current assignment (the last
      CurrentMemberAssignment record, not a hold) is at the commit's epoch and owns the item
      (assigned or revoking) -- in this ledger, not in the coordinator's answer.
    * **(b) Fencing tokens strictly increase per item**: each grant's token is higher than any
      token the item was given before (another member, the same one after the item left its owned
      set, a static member's new process, after a reload or another node's load, after the
      connector was deleted and created again); a member keeps its grant's token while the item
      stays owned. And a modelled resource (one per item, refusing a token lower than the highest
      it recorded) never accepts a write of an older grant after a newer grant's write.
    * **(c) No acknowledged commit is lost**: what the coordinator applied (and made durable) is
      what a later fetch returns, unless a later applied commit, or the connector's deletion (a
      new incarnation), changed it.
    """

    def __init__(self, tokens: bool = True) -> None:
        self.tokens = tokens
        """Check that every owned item has a token (the coordinator gives them)."""
        self.members: set[str] = set()
        self.current: dict[str, tuple[int, frozenset[Item], dict[Item, int]]] = {}
        self.grants: dict[tuple[Item, int], Grant] = {}
        self.top: dict[Item, Grant] = {}
        self.seq = 0
        self.incarnations: dict[str, int] = {}
        self.offsets: dict[tuple[str, str], str] = {}
        self.resources: dict[Item, tuple[int, Grant]] = {}
        self.counts = dict.fromkeys(("grants", "commits_accepted", "commits_refused",
                                     "fetches_checked", "writes_accepted", "writes_refused"), 0)

    # -- what the coordinator made durable ---------------------------------------------------------
    def records(self, records: list[Any], now: int) -> list[str]:
        out: list[str] = []
        for record in records:
            key, value = record.key, record.value
            t = type(key)
            if t is GroupMemberKey:
                if value is None:
                    self.members.discard(key.member_id)
                else:
                    self.members.add(key.member_id)
            elif t is CurrentMemberAssignmentKey:
                self._assignment(key.member_id, value, now, out)
            elif t is GroupConnectorsKey:
                live = {} if value is None else {c.name: c.incarnation for c in value.connectors}
                gone = {c for c, inc in self.incarnations.items() if live.get(c) != inc}
                if gone:  # deleted (or created again): its offsets went with it
                    self.offsets = {k: v for k, v in self.offsets.items() if k[0] not in gone}
                self.incarnations = live
        return out

    def _assignment(self, member: str, value: Any, now: int, out: list[str]) -> None:
        if value is None:
            self.current.pop(member, None)
            return
        owned = (items_from_wire(value.connectors, value.tasks)
                 | items_from_wire(value.revoking_connectors, value.revoking_tasks))
        tokens = {Item(t.connector, t.task): t.token for t in value.fencing_tokens}
        before = self.current.get(member)
        kept = before[2] if before is not None else {}
        for item in sorted(owned):
            token = tokens.get(item)
            if token is None:
                if self.tokens:
                    out.append(f"{member} owns {item} without a fencing token (t={now})")
                continue
            if kept.get(item) == token:
                continue  # the same grant, still owned
            top = self.top.get(item)
            if top is not None and token <= top.token:
                out.append(f"fencing token of {item} did not increase: {member} was granted "
                           f"{token} at t={now}, {top.member} was granted {top.token} at t={top.at}")
            self.seq += 1
            grant = Grant(self.seq, member, item, token, now)
            self.counts["grants"] += 1
            self.grants.setdefault((item, token), grant)
            if top is None or token > top.token:
                self.top[item] = grant
        self.current[member] = (value.member_epoch, owned, {i: t for i, t in tokens.items() if i in owned})

    # -- what the coordinator applied and answered ---------------------------------------------------
    def commit(self, member: str, epoch: int, item: Item, offsets: list[tuple[str, str | None]],
               now: int) -> list[str]:
        """The coordinator applied (durably) a commit of ``offsets`` by ``member`` at ``epoch``
        for ``item``: it must own it, at that epoch, here and now."""
        out: list[str] = []
        cur = self.current.get(member)
        if member not in self.members:
            out.append(f"a commit for {item} by {member} (epoch {epoch}) was accepted at t={now}, "
                       "but it is not a member")
        elif cur is None or cur[0] != epoch:
            out.append(f"a commit for {item} by {member} at epoch {epoch} was accepted at t={now}, "
                       f"but its epoch is {cur[0] if cur is not None else 'unknown'}")
        elif item not in cur[1]:
            owner = next((m for m, c in sorted(self.current.items()) if item in c[1]), None)
            out.append(f"a commit for {item} by {member} (epoch {epoch}) was accepted at t={now}, "
                       f"but {owner or 'nobody'} owns it")
        self.counts["commits_accepted"] += 1
        for partition, offset in offsets:
            if offset is None:
                self.offsets.pop((item.connector, partition), None)
            else:
                self.offsets[(item.connector, partition)] = offset
        return out

    def fetched(self, connector: str, offsets: list[tuple[str, str | None]], now: int,
                where: str = "a fetch") -> list[str]:
        """The coordinator answered ``offsets`` of ``connector``: each must be what it
        acknowledged last."""
        out: list[str] = []
        self.counts["fetches_checked"] += 1
        for partition, offset in offsets:
            want = self.offsets.get((connector, partition))
            if offset != want:
                out.append(f"acknowledged commit lost: {where} of {connector} {partition} at t={now} "
                           f"returned {offset}, the coordinator acknowledged {want}")
        return out

    def expected(self) -> dict[str, list[str]]:
        """The partitions of each connector with an acknowledged offset (to fetch after a load)."""
        out: dict[str, list[str]] = {}
        for connector, partition in sorted(self.offsets):
            out.setdefault(connector, []).append(partition)
        return out

    # -- the modelled resources ----------------------------------------------------------------------
    def write(self, item: Item, token: int, member: str, now: int) -> tuple[bool, list[str]]:
        """A write to ``item``'s resource with ``token`` (what worker_client/fencing.py does:
        refused if a higher token was recorded, else the token is recorded with the write).
        Returns whether it was accepted, and the violations."""
        out: list[str] = []
        grant = self.grants.get((item, token))
        if grant is None:
            out.append(f"a write to {item}'s resource by {member} at t={now} carries token {token}, "
                       "which no grant of the item had")
        res = self.resources.get(item)
        if res is not None and token < res[0]:
            self.counts["writes_refused"] += 1
            return False, out
        self.counts["writes_accepted"] += 1
        if grant is not None:
            last = res[1] if res is not None else None
            if last is not None and grant.seq < last.seq:
                out.append(f"{item}'s resource accepted a write of an older grant ({grant.member}, token "
                           f"{token}, granted at t={grant.at}) at t={now}, after a write of a newer "
                           f"one ({last.member}, token {last.token}, granted at t={last.at})")
            if last is None or grant.seq > last.seq:
                last = grant
            self.resources[item] = (max(token, res[0]) if res is not None else token, last)
        return True, out


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
        for message in self.ledger.records(records, self.now):
            self.violate(message)
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


    # -- offsets and fencing tokens (the ledger) -------------------------------------------------------
    def on_commit(self, req: Any, resp: Any) -> None:
        """The coordinator made a batch durable holding this commit's or fetch's answer (in
        the order it handled them): check an applied commit's owner, a fetch's offsets."""
        if type(req) is ConnectGroupCommitOffsetsRequest:
            if resp.error_code:
                self.ledger.counts["commits_refused"] += 1
            else:
                found = self.ledger.commit(req.member_id, req.member_epoch, Item(req.connector, req.task),
                                           [(o.partition, o.offset) for o in req.offsets], self.now)
                for message in found:
                    self.violate(message)
        elif type(req) is ConnectGroupFetchOffsetsRequest and resp.error_code == 0:
            for message in self.ledger.fetched(req.connector, [(o.partition, o.offset) for o in resp.offsets],
                                               self.now):
                self.violate(message)

    def check_offsets(self, node: CheckedNode, where: str) -> None:
        """After a load: every acknowledged offset is what the loaded coordinator's fetch returns."""
        for connector, partitions in self.ledger.expected().items():
            for message in self.ledger.fetched(connector, node.fetch(connector, partitions), self.now,
                                               f"the fetch after {where}"):
                self.violate(message)
                return

    def resource_write(self, run: Run, member: str) -> bool:
        """A write of ``run`` lands at its item's resource with its token: refused if a higher
        token was recorded there. Returns whether the resource accepted it."""
        if run.token is None:
            return True
        ok, found = self.ledger.write(run.item, run.token, member, self.now)
        for message in found:
            self.violate(message)
        if not ok:
            self.trace("write_refused", run.worker.name, str(run.item),
                       detail=f"token {run.token} is lower than the resource's")
        return ok

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


