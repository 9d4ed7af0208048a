"""Migration swept: random histories of a group mixing classic workers (``sessioned`` and
``default``, driven as Kafka Connect's worker drives its assignment) and new-protocol workers
(their heartbeats, the real incremental cooperative assignor computing when chosen), joining,
leaving, crashing, rolling from one protocol to the other, with connectors changing and time
passing. After every step: the state machine's invariants, log replay (the harness), and what
the workers actually run: no item on two workers, every running item owned by its worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connect_wire.assignors import (
    IncrementalCooperativeAssignor,
    group_from_prepare,
    install_request,
)
from connect_wire.errors import ErrorCode as E
from connect_wire.items import Item
from coordinator.group.config import GroupCoordinatorConfig
from tests.group_harness import names
from tests.test_classic_members import Classic

REJOIN = {E.UNKNOWN_MEMBER_ID, E.FENCED_MEMBER_EPOCH, E.ILLEGAL_GENERATION}


@dataclass
class New:
    """A new-protocol worker: it runs what its latest assignment says."""

    member_id: str
    epoch: int = 0
    runs: frozenset[Item] = field(default_factory=frozenset)


class Sweep(Classic):
    def __init__(self, policy: str) -> None:
        super().__init__(GroupCoordinatorConfig(classic_max_delay_ms=0, migration_policy=policy))
        self.new: dict[str, New] = {}
        self.classic: dict[str, str] = {}  # member id -> protocols offered ("sessioned"/"default")
        self.serial = 0

    # -- new-protocol workers -------------------------------------------------------------------
    def add_new(self) -> None:
        self.serial += 1
        mid = f"n{self.serial}"
        r = self.join(mid)
        if r.error_code == 0:
            self.new[mid] = New(mid, r.member_epoch)
            self._absorb(self.new[mid], r)

    def _absorb(self, w: New, r: Any) -> None:
        if r.error_code in REJOIN:
            w.runs, w.epoch = frozenset(), 0  # (fenced: it stops everything, then rejoins)
            return
        assert r.error_code == 0, r
        w.epoch = r.member_epoch
        if r.assignment is not None:
            w.runs = frozenset(Item.parse(n) for n in [
                *r.assignment.connectors, *(f"{t.connector}/{t.task}" for t in r.assignment.tasks)])
        if r.should_compute_assignment:
            self.compute_for(w)

    def compute_for(self, w: New) -> None:
        prepared = self.prepare(w.member_id, w.epoch)
        if prepared.error_code:
            return
        result = IncrementalCooperativeAssignor(max_delay_ms=0).assign(group_from_prepare(prepared))
        req = install_request("g", w.member_id, w.epoch, prepared.group_epoch, result)
        self.apply(self.coordinator.install_assignment(req, self.now))

    def step_new(self, w: New) -> None:
        owned = names(w.runs)
        r = (self.join(w.member_id, owned=owned) if w.epoch == 0
             else self.heartbeat(w.member_id, w.epoch, owned=owned))
        self._absorb(w, r)

    # -- classic workers ------------------------------------------------------------------------
    def add_classic(self, mode: str) -> None:
        protocols = ("default",) if mode == "default" else ("sessioned", "compatible", "default")
        r = self.cjoin("", protocols, requires_member_id=False)
        if r["error_code"] == 0:
            mid = r["member_id"]
            self.classic[mid] = mode
            self.csync(mid)

    def step_classic(self, mid: str) -> None:
        protocols = (("default",) if self.classic[mid] == "default"
                     else ("sessioned", "compatible", "default"))
        code = self.cbeat(mid)
        if code in REJOIN:  # lost: it stops everything and joins again with a new id
            self.runs.pop(mid, None)
            del self.classic[mid]
            return
        if code == E.REBALANCE_IN_PROGRESS:
            r = self.cjoin(mid, protocols)
            assert r["error_code"] == 0, r
            s = self.csync(mid)
            assert s["error_code"] in (0, E.REBALANCE_IN_PROGRESS), s

    # -- checks ---------------------------------------------------------------------------------
    def check_runs(self) -> None:
        g = self.group()
        seen: dict[Item, str] = {}
        running = {**{m: w.runs for m, w in self.new.items()}, **self.runs}
        for mid, items in running.items():
            for i in items:
                assert i not in seen, f"{i} runs on {seen[i]} and {mid}"
                seen[i] = mid
                assert g is not None and g.owner.get(i) == mid, (
                    f"{mid} runs {i}, owned by {g.owner.get(i) if g else None}")


ops = st.one_of(
    st.tuples(st.just("add_classic"), st.sampled_from(["sessioned", "default"])),
    st.tuples(st.just("add_new"), st.just(0)),
    st.tuples(st.just("step"), st.integers(0, 9)),
    st.tuples(st.just("step_all"), st.just(0)),
    st.tuples(st.just("leave"), st.integers(0, 9)),
    st.tuples(st.just("crash"), st.integers(0, 9)),
    st.tuples(st.just("advance"), st.integers(100, 3_000)),
    st.tuples(st.just("connectors"), st.integers(0, 4)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["bidirectional", "upgrade", "downgrade"]),
       st.lists(ops, min_size=5, max_size=60))
def test_mixed_histories_never_run_an_item_twice(policy: str, history: list[Any]) -> None:
    h = Sweep(policy)
    h.alter({"A": 3, "B": 2})
    for op, arg in history:
        workers = sorted([*h.classic, *h.new])
        if op == "add_classic":
            h.add_classic(arg)
        elif op == "add_new":
            h.add_new()
        elif op in ("step", "leave", "crash") and workers:
            mid = workers[arg % len(workers)]
            if op == "step":
                h.step_classic(mid) if mid in h.classic else h.step_new(h.new[mid])
            elif op == "leave":
                if mid in h.classic:
                    h.runs.pop(mid, None)  # (Connect stops its work, then leaves)
                    h.cleave((mid, None))
                    del h.classic[mid]
                else:
                    h.new.pop(mid)
                    h.heartbeat(mid, -1)
            else:  # the process dies: its work with it; the coordinator fences it later
                h.runs.pop(mid, None)
                h.classic.pop(mid, None)
                h.new.pop(mid, None)
        elif op == "step_all":
            for mid in workers:
                if mid in h.classic:
                    h.step_classic(mid)
                elif mid in h.new:
                    h.step_new(h.new[mid])
        elif op == "advance":
            # (short: a live worker heartbeats well within its session; the dead ones expire)
            h.advance(arg)
            for mid in workers:
                if mid in h.classic:
                    h.step_classic(mid)
                elif mid in h.new:
                    h.step_new(h.new[mid])
        elif op == "connectors":
            h.alter({"A": arg, "C": 4 - arg} if arg else {}, deletes=() if arg else ("C",))
        h.check_runs()
    # then everybody converges: every item runs exactly once
    for _ in range(60):
        h.advance(1_000)
        for mid in sorted([*h.classic, *h.new]):
            if mid in h.classic:
                h.step_classic(mid)
            elif mid in h.new:
                h.step_new(h.new[mid])
        h.check_runs()
    g = h.group()
    if h.classic or h.new:
        running = set().union(*h.runs.values(), *(w.runs for w in h.new.values()))
        assert running == g.configured, (sorted(map(str, g.configured - running)), g.state)
