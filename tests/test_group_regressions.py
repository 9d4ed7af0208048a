"""Regression tests for failure modes Apache Kafka's KIP-848 group coordinator hit in production
or review (notes/kafka-group-coordinator.md, sections 2 and 10), replayed on the connect group.

Each test names the Kafka issue. The harness checks the invariants (an item is owned by at
most one member, epochs never go back, indexes equal a recomputation, an empty group has its
assignment epoch caught up) and that a replay of the log gives the same state after every step.
"""

from __future__ import annotations

from typing import Any

import pytest

from connect_wire.errors import ErrorCode as E
from coordinator.group.invariants import InvariantViolation, check_invariants
from coordinator.group.model import CurrentAssignment, MemberState
from coordinator.group.records import current_assignment
from coordinator.group.state import ReplayError
from tests.group_harness import Harness, assignor, item, items, names, response_items


def wire_assignors(h: Harness, member_id: str) -> tuple[Any, ...]:
    return tuple(
        assignor(a.name, a.minimum_version, a.maximum_version, a.metadata_version, a.reason,
                 a.metadata_bytes)
        for a in h.group().members[member_id].assignors
    )


def hb(h: Harness, member_id: str, owned: list[str] | None = None, **fields: Any) -> Any:
    """A heartbeat at the member's current epoch (full join fields at epoch 0)."""
    cur = h.group().current[member_id]
    if cur.epoch == 0:
        r = h.join(member_id, owned=owned or [], assignors=wire_assignors(h, member_id),
                   rebalance_timeout_ms=h.group().members[member_id].rebalance_timeout_ms)
    else:
        r = h.heartbeat(member_id, cur.epoch, owned=owned, **fields)
    assert r.error_code == 0, r
    return r


def state_of(h: Harness, member_id: str) -> tuple[int, str, list[str], list[str]]:
    """(member epoch, state, assigned, revoking)."""
    cur = h.group().current[member_id]
    return cur.epoch, cur.state.label, names(cur.assigned), names(cur.revoking)


def bump(h: Harness, member_id: str) -> None:
    """Raise the group epoch by one: the member updates its assignor's reason."""
    spec = h.group().members[member_id].assignors[0]
    new = (assignor(spec.name, spec.minimum_version, spec.maximum_version, spec.metadata_version,
                    spec.reason + 1),)
    before = h.group().epoch
    cur = h.group().current[member_id]
    r = (h.join(member_id, assignors=new, owned=names(cur.assigned)) if cur.epoch == 0
         else h.heartbeat(member_id, cur.epoch, client_assignors=new))
    assert r.error_code == 0 and h.group().epoch == before + 1


def m1_runs_everything(h: Harness) -> None:
    """Connector A with tasks A/0, A/1; M1 runs all three at epoch 1; M2 joins (epoch 2)."""
    assert h.alter({"A": 2}).error_code == 0
    h.join("M1")
    h.compute({"M1": ["A", "A/0", "A/1"]})
    assert hb(h, "M1").member_epoch == 1
    h.join("M2")
    assert (h.group().epoch, h.group().assignment_epoch) == (2, 1)
    assert h.assigner() == "M1"


# -- KAFKA-16147 ---------------------------------------------------------------------------------------


def test_kafka_16147_item_pending_revocation_given_back_to_the_same_member_stays_owned() -> None:
    """KAFKA-16147: a partition got assigned to two members because the partition-epoch
    bookkeeping lost the owner when a partition pending revocation was re-assigned to the same
    member. Here: A/0 is being revoked from M1 for M2, then a newer target gives it back to M1.
    Throughout, g.owner[A/0] must stay M1 and M2 must never get it."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    h.compute({"M1": ["A", "A/1"], "M2": ["A/0"]})  # epoch 2: A/0 moves to M2
    hb(h, "M1", owned=["A", "A/0", "A/1"])
    assert state_of(h, "M1") == (1, "UnrevokedItems", ["A", "A/1"], ["A/0"])
    assert g.owner[item("A/0")] == "M1"
    hb(h, "M2", owned=[])
    assert state_of(h, "M2") == (2, "UnreleasedItems", [], [])

    # A newer target (epoch 3) gives A/0 back to M1 while M1 is still revoking it.
    bump(h, "M2")
    assert hb(h, "M1", owned=["A", "A/0", "A/1"]).should_compute_assignment is True
    h.compute({"M1": ["A", "A/0", "A/1"], "M2": []})
    assert (g.epoch, g.assignment_epoch) == (3, 3)
    assert g.target_owner[item("A/0")] == "M1"

    # M1 still runs A/0: it keeps revoking it (its epoch does not move) and keeps owning it.
    r = hb(h, "M1", owned=["A", "A/0", "A/1"])
    assert r.member_epoch == 1
    assert state_of(h, "M1") == (1, "UnrevokedItems", ["A", "A/1"], ["A/0"])
    assert g.owner[item("A/0")] == "M1"
    # M2 reconciles to epoch 3 with its (now empty) target: it must not get A/0.
    r = hb(h, "M2", owned=[])
    assert (r.member_epoch, response_items(r)) == (3, [])
    assert state_of(h, "M2") == (3, "Stable", [], [])
    assert g.owner[item("A/0")] == "M1"
    # M1 stops A/0 and acknowledges: A/0 comes back to it in the same step (it is its own item).
    r = hb(h, "M1", owned=["A", "A/1"])
    assert (r.member_epoch, response_items(r)) == (3, ["A", "A/0", "A/1"])
    assert state_of(h, "M1") == (3, "Stable", ["A", "A/0", "A/1"], [])
    assert {i: g.owner[i] for i in items(["A", "A/0", "A/1"])} == dict.fromkeys(
        items(["A", "A/0", "A/1"]), "M1")
    assert g.state.value == "Stable"
    check_invariants(h.state)


def test_kafka_16147_replay_and_invariants_refuse_a_double_owner() -> None:
    """KAFKA-16147's root cause was bookkeeping that let a second owner in silently. Here both
    guards must fire: replay refuses a record that makes a second member own an item, and the
    invariant check reports an item in two members' owned sets."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    stolen = CurrentAssignment(2, 0, MemberState.STABLE, items(["A/0"]), frozenset())
    with pytest.raises(ReplayError, match="owned by M1 and M2"):
        h.state.replay(current_assignment("g", "M2", stolen))
    # The refused record changed nothing (replay checks before it mutates).
    assert g.owner[item("A/0")] == "M1" and "M2" in g.current
    assert names(g.current["M2"].owned) == [] and g.current["M2"].epoch == 1
    # Bypass replay: the invariant check must catch it.
    g.current["M2"] = stolen
    with pytest.raises(InvariantViolation, match="owned by both"):
        check_invariants(h.state)


# -- KAFKA-19974 ---------------------------------------------------------------------------------------


def test_kafka_19974_epoch_not_bumped_while_still_revoking() -> None:
    """KAFKA-19974: a member in UNREVOKED_PARTITIONS was moved to epoch + 1 when a newer target
    arrived, so an item could be owned at one epoch by two members. A member in UnrevokedItems
    keeps its epoch across newer targets until it acknowledges the revocation."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    h.compute({"M1": ["A", "A/1"], "M2": ["A/0"]})  # epoch 2
    hb(h, "M1", owned=["A", "A/0", "A/1"])
    assert state_of(h, "M1") == (1, "UnrevokedItems", ["A", "A/1"], ["A/0"])

    # A newer target (epoch 3) that also takes A/1 away from M1.
    bump(h, "M2")
    assert hb(h, "M1", owned=["A", "A/0", "A/1"]).should_compute_assignment is True
    h.compute({"M1": ["A"], "M2": ["A/0", "A/1"]})
    assert g.assignment_epoch == 3
    # Heartbeats that do not acknowledge (no owned lists, or still running A/0): epoch 1 stays.
    for owned in (None, ["A", "A/0", "A/1"], ["A", "A/0"]):
        r = hb(h, "M1", owned=owned)
        assert r.member_epoch == 1
        assert state_of(h, "M1") == (1, "UnrevokedItems", ["A", "A/1"], ["A/0"])
    # It stops A/0 but still runs A/1: now A/1 must be revoked — still at epoch 1, never 2.
    r = hb(h, "M1", owned=["A", "A/1"])
    assert (r.member_epoch, response_items(r)) == (1, ["A"])
    assert state_of(h, "M1") == (1, "UnrevokedItems", ["A"], ["A/1"])
    assert g.owner[item("A/1")] == "M1" and item("A/0") not in g.owner
    # M2 meanwhile gets A/0 (released) but not A/1 (still M1's).
    r = hb(h, "M2", owned=[])
    assert (r.member_epoch, response_items(r)) == (3, ["A/0"])
    assert state_of(h, "M2") == (3, "UnreleasedItems", ["A/0"], [])
    # Acknowledged: M1 moves straight to the target epoch 3.
    r = hb(h, "M1", owned=["A"])
    assert (r.member_epoch, response_items(r)) == (3, ["A"])
    assert state_of(h, "M1") == (3, "Stable", ["A"], [])
    r = hb(h, "M2", owned=["A/0"])
    assert (r.member_epoch, response_items(r)) == (3, ["A/0", "A/1"])
    assert g.state.value == "Stable"


def test_kafka_19974_revocation_timer_fences_at_the_epoch_it_was_armed_for() -> None:
    """The rebalance (revocation) timeout fences a member that never acknowledged, also across a
    newer target (its epoch did not move, so the timer still applies)."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    h.compute({"M1": ["A", "A/1"], "M2": ["A/0"]})
    hb(h, "M1", owned=["A", "A/0", "A/1"])
    assert ("rebalance", "g", "M1") in h.timers
    bump(h, "M2")
    # M1 keeps heartbeating (its session stays alive) but never stops A/0.
    for _ in range(11):
        h.advance(3_000)
        if "M1" in g.members:
            hb(h, "M1", owned=["A", "A/0", "A/1"])
        hb(h, "M2", owned=[])
    assert "M1" not in g.members  # fenced by the revocation timeout (30 s)
    assert g.epoch == 4  # 3 (the bump) + 1 (the fencing)
    # M1 may still be stopping A/0 (and stops A, A/1 now): held for M1 until its session
    # deadline plus its stop budget; only then does M2, still at its epoch-2 target, get A/0.
    assert g.owner[item("A/0")] == "M1" and state_of(h, "M2")[2] == []
    while "M1" in g.current:
        h.advance(3_000)
        hb(h, "M2", owned=state_of(h, "M2")[2])
    hb(h, "M2", owned=state_of(h, "M2")[2])
    assert g.owner[item("A/0")] == "M2" and state_of(h, "M2")[2] == ["A/0"]


# -- KAFKA-19449 ---------------------------------------------------------------------------------------


def test_kafka_19449_own_pending_revocation_is_not_unreleased() -> None:
    """KAFKA-19449: an item the same member is revoking that comes back in its new target must
    not be counted as "unreleased" (held by someone else): the member gets it in the same step
    it acknowledges, Stable, without a further heartbeat round."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    h.compute({"M1": ["A"], "M2": ["A/0", "A/1"]})  # epoch 2
    hb(h, "M1", owned=["A", "A/0", "A/1"])
    assert state_of(h, "M1") == (1, "UnrevokedItems", ["A"], ["A/0", "A/1"])
    # Epoch 3 gives A/1 back to M1.
    bump(h, "M2")
    hb(h, "M1", owned=["A", "A/0", "A/1"])
    h.compute({"M1": ["A", "A/1"], "M2": ["A/0"]})
    # M1 acknowledges (stopped both): A/1 is its own pending revocation, so it is not unreleased.
    r = hb(h, "M1", owned=["A"])
    assert (r.member_epoch, response_items(r)) == (3, ["A", "A/1"])
    assert state_of(h, "M1") == (3, "Stable", ["A", "A/1"], [])
    assert g.owner[item("A/1")] == "M1"
    r = hb(h, "M2", owned=[])
    assert (r.member_epoch, response_items(r)) == (3, ["A/0"])
    assert state_of(h, "M2") == (3, "Stable", ["A/0"], [])
    assert g.state.value == "Stable"


# -- KAFKA-19233 ---------------------------------------------------------------------------------------


def test_kafka_19233_fenced_member_rejoins_with_epoch_zero_and_same_id() -> None:
    """KAFKA-19233: a fenced member could not rejoin with epoch 0 while the server still held it
    at a higher epoch. FENCED_MEMBER_EPOCH removes the member; it then rejoins with epoch 0 and
    the same member id and is accepted."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    h.compute({"M1": ["A", "A/0"], "M2": ["A/1"]})
    hb(h, "M1", owned=["A", "A/0", "A/1"])
    hb(h, "M1", owned=["A", "A/0"])
    hb(h, "M2", owned=[])
    assert state_of(h, "M2") == (2, "Stable", ["A/1"], [])
    before = g.epoch
    r = h.heartbeat("M2", 7, owned=["A/1"])  # an epoch it never had
    assert r.error_code == E.FENCED_MEMBER_EPOCH
    assert "M2" not in g.members and g.epoch == before + 1
    assert g.owner[item("A/1")] == "M2"  # held: M2 may still be stopping it
    r = h.join("M2", owned=[])
    assert r.error_code == 0 and r.member_id == "M2"
    assert item("A/1") not in g.owner  # M2's own report: it runs nothing any more
    assert "M2" in g.members and g.epoch == before + 2
    # Its old target went with it; it waits for the next computation at the assignment epoch.
    assert r.member_epoch == g.assignment_epoch and response_items(r) == []


@pytest.mark.parametrize("member_state", ["Stable", "UnrevokedItems", "UnreleasedItems"])
def test_kafka_19233_member_still_in_the_group_rejoins_with_epoch_zero(member_state: str) -> None:
    """KAFKA-19233: a member the coordinator still holds (in any reconciliation state) rejoining
    with epoch 0 is accepted; no group epoch bump, it keeps its target, and no item ends up owned
    twice."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    h.compute({"M1": ["A", "A/1"], "M2": ["A/0"]})
    if member_state == "Stable":
        mid, owned = "M1", ["A", "A/1"]
        hb(h, "M1", owned=["A", "A/0", "A/1"])
        hb(h, "M1", owned=["A", "A/1"])
    elif member_state == "UnrevokedItems":
        mid, owned = "M1", ["A", "A/0", "A/1"]
        hb(h, "M1", owned=["A", "A/0", "A/1"])
    else:
        mid, owned = "M2", []
        hb(h, "M2", owned=[])
    assert g.current[mid].state.label == member_state
    epoch_before, member_epoch = g.epoch, g.current[mid].epoch
    r = h.join(mid, owned=owned)
    assert r.error_code == 0 and r.member_id == mid
    assert g.epoch == epoch_before  # nothing about the group changed
    assert h.target(mid) == (["A", "A/1"] if mid == "M1" else ["A/0"])
    cur = g.current[mid]
    if member_state == "Stable":
        assert (r.member_epoch, response_items(r)) == (2, ["A", "A/1"])
        assert state_of(h, mid) == (2, "Stable", ["A", "A/1"], [])
    elif member_state == "UnrevokedItems":
        # It still runs A/0, which it must give up: it is asked again to revoke it, at epoch 0.
        assert r.member_epoch == 0 and response_items(r) == ["A", "A/1"]
        assert cur.state == MemberState.UNREVOKED_ITEMS and names(cur.revoking) == ["A/0"]
        assert g.owner[item("A/0")] == "M1"
        r = h.join(mid, owned=["A", "A/1"])  # it stops A/0 (still at epoch 0: full fields)
        assert (r.member_epoch, response_items(r)) == (2, ["A", "A/1"])
    else:
        assert (r.member_epoch, response_items(r)) == (member_epoch, [])
        assert state_of(h, mid) == (2, "UnreleasedItems", [], [])
    check_invariants(h.state)


# -- KAFKA-20442 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["leave", "session-expiry"])
def test_kafka_20442_assignment_epoch_catches_up_when_the_group_empties(how: str) -> None:
    """KAFKA-20442: when the last member left, the assignment epoch stayed behind the group
    epoch. The group must end Empty with assignment epoch == group epoch — here even from
    Assigning (a member left first and no new target was computed)."""
    h = Harness()
    m1_runs_everything(h)
    g = h.group()
    assert g.state.value == "Assigning"
    assert hb(h, "M2", owned=[]).error_code == 0
    r = h.heartbeat("M1", -1)
    assert r.error_code == 0 and r.member_epoch == -1
    assert sorted(g.members) == ["M2"] and g.epoch == 3 and g.assignment_epoch == 1
    if how == "leave":
        r = h.heartbeat("M2", -1)
        assert r.error_code == 0 and r.member_epoch == -1
    else:
        h.advance(h.coordinator.config.session_timeout_ms + 1)
    assert g.members == {} and g.target == {} and g.owner == {}
    assert g.epoch == 4
    assert g.assignment_epoch == g.epoch
    assert g.state.value == "Empty"
    d = h.describe().groups[0]
    assert (d.group_state, d.group_epoch, d.assignment_epoch) == ("Empty", 4, 4)
    assert h.assigner() is None and ("compute", "g", "") not in h.timers
    # A new member joining afterwards starts a normal rebalance from there.
    r = h.join("M3")
    assert r.should_compute_assignment is True and (g.epoch, g.assignment_epoch) == (5, 4)
    h.compute({"M3": ["A", "A/0", "A/1"]})
    assert hb(h, "M3").member_epoch == 5
    assert g.state.value == "Stable"
