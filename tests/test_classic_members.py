"""Classic members (JoinGroup/SyncGroup/Heartbeat/LeaveGroup with Kafka Connect's embedded
protocol) in a connect group, through the sans-IO core: each rule, with the harness checking
the invariants (no item owned twice, epochs never back) and log replay after every step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from connect_wire import classic_connect as cc
from connect_wire.errors import ErrorCode as E
from coordinator.group import classic as cl
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import CLASSIC_JOIN, CLASSIC_SYNC
from coordinator.group.model import MemberState
from coordinator.group.state import CoordinatorState
from coordinator.runtime import serde
from tests.group_harness import Harness, items, names

SESSION_MS = 10_000
REBALANCE_MS = 20_000


class Classic(Harness):
    """The harness plus the classic APIs; each classic worker's belief (what it runs) is kept
    here as a Connect worker keeps it (WorkerCoordinator's merged assignment)."""

    def __init__(self, config: GroupCoordinatorConfig | None = None) -> None:
        super().__init__(config or GroupCoordinatorConfig(classic_max_delay_ms=0))
        self.runs: dict[str, frozenset[Any]] = {}
        self.generation: dict[str, int] = {}
        self.protocol: dict[str, str] = {}

    def cjoin(self, member_id: str = "", protocols: Iterable[str] = ("sessioned", "compatible",
              "default"), instance_id: str | None = None, protocol_type: str = "connect",
              raw: tuple[tuple[str, bytes], ...] | None = None, group_id: str = "g",
              session_ms: int = SESSION_MS, url: str | None = None,
              requires_member_id: bool = True) -> dict[str, Any]:
        protocols = tuple(protocols)
        running = self.runs.get(member_id, frozenset())
        if raw is None:
            first = protocols[0] if protocols else "default"
            if cc.PROTOCOL_VERSIONS.get(first) == 0:
                running = frozenset()  # eager: everything stopped before rejoining
                if member_id:
                    self.runs[member_id] = running
            allocation = cc.encode_assignment(cc.Assignment(
                2, 0, "", "", 0, cc.entries_of(running), ())) if running else None
            raw = tuple((p, cc.encode_metadata(cc.WorkerMetadata(
                cc.PROTOCOL_VERSIONS[p], url or f"http://{member_id or 'new'}:8083", 0,
                allocation if cc.PROTOCOL_VERSIONS[p] else None))) for p in protocols)
        r = self.apply(self.coordinator.classic_join(cl.Join(
            group_id, member_id, instance_id, session_ms, REBALANCE_MS, protocol_type, raw,
            requires_member_id), self.now))
        if r["error_code"] == 0:
            mid = r["member_id"]
            self.generation[mid] = r["generation_id"]
            self.protocol[mid] = r["protocol_name"]
            self.runs.setdefault(mid, running)
        return r

    def join_classic(self, protocols: Iterable[str] = ("sessioned", "compatible", "default"),
                     **kw: Any) -> str:
        r = self.cjoin("", protocols, **kw)
        if kw.get("instance_id") is None:  # (KIP-394: static members get an id at once)
            assert r["error_code"] == E.MEMBER_ID_REQUIRED, r
            r = self.cjoin(r["member_id"], protocols, **kw)
        assert r["error_code"] == 0, r
        return str(r["member_id"])

    def csync(self, mid: str, generation: int | None = None, **kw: Any) -> dict[str, Any]:
        gen = self.generation[mid] if generation is None else generation
        r = self.apply(self.coordinator.classic_sync(
            cl.Sync("g", gen, mid, kw.pop("instance_id", None), **kw), self.now))
        if r["error_code"] == 0:
            a = cc.decode_assignment(r["assignment"])
            assert a.version == cc.PROTOCOL_VERSIONS[self.protocol[mid]]
            if a.version == 0:
                self.runs[mid] = a.assigned_items()
            else:
                self.runs[mid] = (self.runs[mid] - a.revoked_items()) | a.assigned_items()
            self.check_nothing_runs_twice()
        return r

    def cbeat(self, mid: str, generation: int | None = None,
              instance_id: str | None = None) -> int:
        gen = self.generation[mid] if generation is None else generation
        return int(self.apply(self.coordinator.classic_heartbeat(
            cl.Beat("g", gen, mid, instance_id), self.now))["error_code"])

    def cleave(self, *members: tuple[str, str | None]) -> dict[str, Any]:
        r = self.apply(self.coordinator.classic_leave(cl.Leave("g", members), self.now))
        for mid, m in zip(members, r["members"], strict=True):
            if m["error_code"] == 0:
                self.runs.pop(mid[0], None)
        return r

    def settle(self, *mids: str, rounds: int = 6) -> None:
        """Each classic worker does what Connect's does: heartbeat, rejoin when told, sync."""
        for _ in range(rounds):
            quiet = True
            for mid in mids:
                if mid not in self.group().members:
                    continue
                code = self.cbeat(mid)
                if code == E.REBALANCE_IN_PROGRESS:
                    quiet = False
                    assert self.cjoin(mid, [self.protocol[mid]])["error_code"] == 0
                    assert self.csync(mid)["error_code"] == 0
                else:
                    assert code == 0, code
            if quiet:
                return
        raise AssertionError("the classic members did not settle")

    def check_nothing_runs_twice(self) -> None:
        seen: dict[Any, str] = {}
        for mid, running in self.runs.items():
            for i in running:
                assert i not in seen, f"{i} runs on {seen[i]} and {mid}"
                seen[i] = mid
                g = self.group()
                assert g.owner.get(i) == mid, f"{mid} runs {i} owned by {g.owner.get(i)}"


def test_join_member_id_required_then_generation_is_the_member_epoch() -> None:
    h = Classic()
    h.alter({"A": 2})
    r = h.cjoin("")
    assert r["error_code"] == E.MEMBER_ID_REQUIRED and r["member_id"]
    assert h.group() is None or not h.group().members  # nothing changed
    mid = r["member_id"]
    r = h.cjoin(mid)
    g = h.group()
    assert r["error_code"] == 0 and r["protocol_name"] == "sessioned" and r["leader"] == ""
    assert r["members"] == [] and r["generation_id"] == g.current[mid].epoch == g.assignment_epoch
    # the coordinator computed the target itself (classic members only): all items here
    s = h.csync(mid)
    a = cc.decode_assignment(s["assignment"])
    assert a.version == 2 and names(a.assigned_items()) == ["A", "A/0", "A/1"]
    assert a.revoked == () and a.leader == mid and a.leader_url == f"http://{mid}:8083"
    assert h.cbeat(mid) == 0
    # JoinGroup v0-v3 (no MEMBER_ID_REQUIRED): a member id at once
    r = h.cjoin("", requires_member_id=False)
    assert r["error_code"] == 0 and r["member_id"]


def test_protocol_name_is_the_members_own_first_known_one() -> None:
    h = Classic()
    mid = h.join_classic(("compatible", "default"))
    assert h.protocol[mid] == "compatible"
    raw = (("future-proto", b"\x00"), ("default", cc.encode_metadata(
        cc.WorkerMetadata(0, "http://x", 0))))
    r = h.cjoin("", raw=raw, requires_member_id=False)
    assert r["error_code"] == 0 and r["protocol_name"] == "default"


@pytest.mark.parametrize("kw, words", [
    ({"protocol_type": "consumer"}, "ProtocolType 'consumer' is not served"),
    ({"raw": (("range", b"\x00\x01"),)}, "No protocol this coordinator serves"),
    ({"raw": (("sessioned", b"\x00\x02garbage"),)}, "Protocol 'sessioned': worker metadata"),
    ({"raw": (("sessioned", b"\x00\x02\x00\x00" + bytes(8) + b"\x00\x00\x00\x03abc"),)},
     "assignment"),
])
def test_bad_joins_get_inconsistent_group_protocol_and_leave_the_group_unharmed(
        kw: dict[str, Any], words: str) -> None:
    h = Classic()
    h.alter({"A": 1})
    mid = h.join_classic()
    h.csync(mid)
    before = h.state.snapshot()
    r = h.cjoin(mid, **kw)
    assert r["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL and words in r["error_message"]
    assert h.state.snapshot() == before
    r = h.cjoin("", **kw)
    assert r["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.state.snapshot() == before
    assert h.cbeat(mid) == 0


def test_session_timeout_out_of_bounds() -> None:
    h = Classic()
    r = h.cjoin("", session_ms=100)
    assert r["error_code"] == E.INVALID_SESSION_TIMEOUT and h.group() is None


def test_generation_from_the_past_is_illegal_and_harmless() -> None:
    h = Classic()
    h.alter({"A": 1})
    mid = h.join_classic()
    h.csync(mid)
    before = h.state.snapshot()
    gen = h.generation[mid]
    assert h.cbeat(mid, generation=gen - 1) == E.ILLEGAL_GENERATION
    assert h.csync(mid, generation=gen - 1)["error_code"] == E.ILLEGAL_GENERATION
    assert h.csync(mid, protocol_name="default")["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.csync(mid, protocol_type="consumer")["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.state.snapshot() == before
    r = h.apply(h.coordinator.classic_heartbeat(cl.Beat("g", 1, "nobody", None), h.now))
    assert r["error_code"] == E.UNKNOWN_MEMBER_ID


def test_cooperative_members_revoke_then_the_other_gets_what_was_released() -> None:
    h = Classic()
    h.alter({"A": 3, "B": 3})
    w1 = h.join_classic()
    h.csync(w1)
    assert len(h.runs[w1]) == 8
    w2 = h.join_classic()
    assert h.generation[w2] == h.group().assignment_epoch
    assert h.csync(w2)["error_code"] == 0
    assert h.runs[w2] == frozenset()  # everything is still w1's: nothing released yet
    assert h.cbeat(w2) == E.REBALANCE_IN_PROGRESS or h.group().current[w2].state == \
        MemberState.UNRELEASED_ITEMS
    # w1 is told to rejoin; its join reports what it runs: it must revoke half
    assert h.cbeat(w1) == E.REBALANCE_IN_PROGRESS
    gen = h.generation[w1]
    h.cjoin(w1)
    assert h.group().current[w1].state == MemberState.UNREVOKED_ITEMS
    assert h.generation[w1] == gen  # the epoch does not move while revoking
    s = cc.decode_assignment(h.csync(w1)["assignment"])
    assert len(s.revoked_items()) == 4 and s.assigned == ()
    assert h.cbeat(w1) == E.REBALANCE_IN_PROGRESS  # rejoin to say it stopped them
    h.settle(w1, w2)
    assert len(h.runs[w1]) == len(h.runs[w2]) == 4
    assert h.runs[w1] | h.runs[w2] == items(["A", "A/0", "A/1", "A/2", "B", "B/0", "B/1", "B/2"])
    assert h.group().state.value == "Stable"


def test_eager_members_own_nothing_when_they_rejoin_and_get_the_whole_set() -> None:
    h = Classic()
    h.alter({"A": 3})
    w1 = h.join_classic(("default",))
    h.csync(w1)
    w2 = h.join_classic(("default",))
    h.csync(w2)
    h.settle(w1, w2)
    assert len(h.runs[w1]) == len(h.runs[w2]) == 2
    # the v0 answer is the whole assignment, never a delta
    r = h.csync(w1)
    a = cc.decode_assignment(r["assignment"])
    assert a.version == 0 and a.assigned_items() == h.runs[w1]


def test_mixed_group_new_protocol_member_computes_for_the_classic_one() -> None:
    h = Classic()
    h.alter({"A": 2})
    w = h.join_classic()
    h.csync(w)
    r = h.join()  # a member of the new protocol
    new = r.member_id
    assert h.assigner() == new  # it computes: the classic member cannot
    prepared = h.prepare(new)
    assert {m.member_id for m in prepared.members} == {w, new}
    h.install(new, {w: ["A", "A/0"], new: ["A/1"]}, prepared.group_epoch)
    assert h.cbeat(w) == E.REBALANCE_IN_PROGRESS
    h.cjoin(w)
    h.csync(w)
    h.settle(w)
    h.heartbeat(new, h.group().current[new].epoch, owned=[])
    assert names(h.runs[w]) == ["A", "A/0"]
    assert h.current(new)[1] == ["A/1"]
    # the new-protocol member leaves: the coordinator computes for the classic one alone
    h.heartbeat(new, h.group().current[new].epoch, owned=[])
    h.heartbeat(new, -1)
    assert h.group().epoch == h.group().assignment_epoch
    h.settle(w)
    assert names(h.runs[w]) == ["A", "A/0", "A/1"]


def test_classic_member_fenced_at_its_own_session_timeout() -> None:
    h = Classic(GroupCoordinatorConfig(classic_max_delay_ms=0, session_timeout_ms=45_000))
    h.alter({"A": 1})
    w = h.join_classic(session_ms=6_000)
    h.csync(w)
    h.advance(5_000)
    assert h.cbeat(w) == 0
    h.advance(6_001)
    assert w not in h.group().members
    assert any(e.event == "member fenced" and e.fields.get("reason") == "session_expired"
               for e in h.events)


def test_no_rejoin_within_the_rebalance_timeout_is_fenced() -> None:
    h = Classic()
    h.alter({"A": 3})
    w1 = h.join_classic()
    h.csync(w1)
    w2 = h.join_classic()
    h.csync(w2)
    assert h.cbeat(w1) == E.REBALANCE_IN_PROGRESS
    assert (CLASSIC_JOIN, "g", w1) in h.timers
    for _ in range(REBALANCE_MS // 3_000):  # it heartbeats but never rejoins
        h.advance(3_000)
        h.cbeat(w1)
        h.cbeat(w2)
    h.advance(3_000)
    assert w1 not in h.group().members
    assert any(e.fields.get("reason") == "classic_join_timeout" for e in h.events)


def test_no_sync_within_the_rebalance_timeout_is_fenced() -> None:
    h = Classic()
    w = h.join_classic()
    assert (CLASSIC_SYNC, "g", w) in h.timers
    for _ in range(REBALANCE_MS // 3_000 + 1):
        h.advance(3_000)
        h.cbeat(w)
    assert w not in h.group().members
    assert any(e.fields.get("reason") == "classic_sync_timeout" for e in h.events)


def test_leave_batch_and_static_by_instance_id() -> None:
    h = Classic()
    h.alter({"A": 3})
    w1 = h.join_classic()
    w2 = h.join_classic(instance_id="i2")
    w3 = h.join_classic(instance_id="i3")
    for w in (w1, w2, w3):
        h.csync(w)
    new = h.join().member_id
    r = h.cleave((w1, None), ("", "i2"), ("someone-else", "i3"), ("ghost", None),
                 ("", "nope"), (new, None))
    codes = [m["error_code"] for m in r["members"]]
    assert codes == [0, 0, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID,
                     E.UNKNOWN_MEMBER_ID]
    assert set(h.group().members) == {w3, new}
    r = h.apply(h.coordinator.classic_leave(cl.Leave("nogroup", ((w3, None),)), h.now))
    assert r["error_code"] == E.UNKNOWN_MEMBER_ID


def test_static_member_replaced_by_a_new_process_of_either_protocol() -> None:
    h = Classic()
    h.alter({"A": 1})
    w = h.join_classic(instance_id="i1")
    h.csync(w)
    held = h.current(w)[1]
    # a new classic process of the instance (member id "") replaces it and takes its work
    r = h.cjoin("", instance_id="i1")
    assert r["error_code"] == 0 and r["member_id"] != w
    w2 = r["member_id"]
    h.runs.pop(w)
    assert w not in h.group().members and h.current(w2)[1] == held
    # a known member id of another instance: fenced
    assert h.cjoin(w, instance_id="i1")["error_code"] in (E.UNKNOWN_MEMBER_ID,
                                                          E.FENCED_INSTANCE_ID)
    # a new-protocol process of the instance replaces the classic one (no leave needed)
    r = h.join(instance_id="i1")
    assert r.error_code == 0 and w2 not in h.group().members
    assert h.current(r.member_id)[1] == held
    assert not h.group().classic_members


@pytest.mark.parametrize("policy, classic_into_new, new_into_classic", [
    ("bidirectional", True, True), ("upgrade", False, True), ("downgrade", True, False),
    ("disabled", False, False)])
def test_migration_policy(policy: str, classic_into_new: bool, new_into_classic: bool) -> None:
    h = Classic(GroupCoordinatorConfig(migration_policy=policy, classic_max_delay_ms=0))
    h.join(group_id="g")  # a group of the new protocol
    r = h.cjoin("", requires_member_id=False)
    assert (r["error_code"] == 0) == classic_into_new, r
    if not classic_into_new:
        assert r["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL and policy in r["error_message"]
    h2 = Classic(GroupCoordinatorConfig(migration_policy=policy, classic_max_delay_ms=0))
    h2.cjoin("", requires_member_id=False)  # a group of classic members
    r2 = h2.join()
    assert (r2.error_code == 0) == new_into_classic, r2
    if not new_into_classic:
        assert r2.error_code == E.GROUP_ID_NOT_FOUND
    # an empty group takes either
    h3 = Classic(GroupCoordinatorConfig(migration_policy=policy, classic_max_delay_ms=0))
    assert h3.cjoin("", requires_member_id=False)["error_code"] == 0


def test_new_protocol_heartbeat_for_a_classic_member_is_refused_without_fencing() -> None:
    h = Classic()
    w = h.join_classic()
    h.csync(w)
    before = h.state.snapshot()
    r = h.heartbeat(w, h.generation[w])  # (an epoch of 0 would be a join: a switch)
    assert r.error_code == E.UNKNOWN_MEMBER_ID and h.state.snapshot() == before


def test_classic_members_survive_a_reload_through_the_fast_loader() -> None:
    h = Classic()
    h.alter({"A": 2})
    w = h.join_classic()
    h.csync(w)
    fresh = CoordinatorState()
    serde.replay_log(fresh, [[serde.encode_record(r) for r in h.log]])
    assert fresh.snapshot() == h.state.snapshot()
    m = fresh.groups["g"].members[w]
    assert m.classic is not None and m.classic.protocol == "sessioned"
    assert m.classic.session_timeout_ms == SESSION_MS
    assert w in fresh.groups["g"].classic_members
    # a reloaded coordinator re-arms the classic member's own session timeout
    from coordinator.group.coordinator import GroupCoordinator
    core = GroupCoordinator(state=fresh)
    res = core.on_loaded(1_000)
    assert any(t.key == ("session", "g", w) and t.deadline_ms == 1_000 + SESSION_MS
               for t in res.timers)


def test_classic_process_replacing_a_live_new_protocol_static_member_waits_for_its_hold() -> None:
    h = Classic()
    h.alter({"A": 1})
    r = h.join(instance_id="i1")
    old = r.member_id
    h.compute({old: ["A", "A/0"]})
    h.join(old, instance_id="i1")  # (still at epoch 0: a join's full fields)
    h.heartbeat(old, h.group().current[old].epoch, owned=["A", "A/0"])
    assert h.current(old)[1] == ["A", "A/0"]
    # a classic process of the instance joins while the old worker still runs A and A/0
    r2 = h.cjoin("", instance_id="i1")
    assert r2["error_code"] == 0
    new = r2["member_id"]
    g = h.group()
    assert old not in g.members and g.current[old].epoch == -3  # a hold: nobody runs them yet
    assert h.target(new) == ["A", "A/0"] and h.current(new)[1] == []
    assert any(e.event == "member fenced" and e.fields["reason"] == "replaced" for e in h.events)
    h.csync(new)
    assert h.runs[new] == frozenset()
    for _ in range(40):  # the hold ends (the old worker's session plus its stop budget)
        h.advance(1_000)
        h.cbeat(new)
        if old not in h.group().current:
            break
    assert old not in h.group().current
    h.settle(new)
    assert names(h.runs[new]) == ["A", "A/0"]


def test_classic_members_never_wait_for_a_new_protocol_member_that_cannot_compute() -> None:
    h = Classic()
    h.alter({"A": 1})
    w = h.join_classic()
    h.csync(w)
    new = h.join(instance_id="n").member_id  # it is chosen to compute ...
    assert h.assigner() == new
    assert h.heartbeat(new, -2, instance_id="n").error_code == 0  # ... and leaves (-2) first
    h.alter({"A": 1, "B": 1})
    g = h.group()
    assert g.epoch == g.assignment_epoch  # the coordinator computed itself
    # (the static member's share waits for it until its session ends, then moves)
    for _ in range(12):
        h.advance(1_000)
        h.settle(w)
    assert new not in h.group().members
    assert names(h.runs[w]) == ["A", "A/0", "B", "B/0"]


def test_rebalance_timeout_above_the_bound_is_cut_not_refused() -> None:
    h = Classic(GroupCoordinatorConfig(classic_max_delay_ms=0, max_rebalance_timeout_ms=15_000))
    w = h.join_classic()  # (REBALANCE_MS = 20000)
    assert h.group().members[w].rebalance_timeout_ms == 15_000
    assert h.timers[(CLASSIC_SYNC, "g", w)] == h.now + 15_000


def test_classic_members_heartbeat_age_in_describe() -> None:
    """A classic member's JoinGroup, SyncGroup and Heartbeat each count as its last heartbeat in
    the describe (operators see its age as they see a new-protocol member's)."""
    h = Classic()
    h.alter({"A": 1})
    w = h.join_classic()
    h.csync(w)

    def age() -> int:
        (g,) = h.describe().groups
        (m,) = [m for m in g.members if m.member_id == w]
        return int(m.last_heartbeat_ms_ago)

    h.advance(1_500)
    assert age() == 1_500
    assert h.cbeat(w) == 0
    h.advance(400)
    assert age() == 400
