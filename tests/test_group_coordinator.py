"""Unit tests of the connect group coordinator's rules (docs/protocol.md, seed 000, KIP-848).

Each test drives the pure state machine through the harness, which checks the invariants and
that a replay of the whole log gives the same state after every step.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from connect_wire.errors import ErrorCode as E
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from connect_wire.records import (
    CurrentMemberAssignmentKey,
    GroupMemberKey,
    GroupMetadataKey,
    TargetAssignmentMemberKey,
)
from coordinator.group.config import GROUP_HEARTBEAT_INTERVAL as HEARTBEAT_INTERVAL
from coordinator.group.config import GROUP_SESSION_TIMEOUT as SESSION_TIMEOUT
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator, RequestContext
from coordinator.group.invariants import epochs as invariant_epochs
from coordinator.group.model import HELD_EPOCH, CurrentAssignment, MemberState
from coordinator.group.state import CoordinatorState
from tests.group_harness import Harness, assignor, item, items, names, response_items

ALL = ["A", "A/0", "A/1", "B", "B/0"]


# == helpers ===========================================================================================


def wire_assignors(h: Harness, member_id: str) -> tuple[Any, ...]:
    return tuple(
        assignor(a.name, a.minimum_version, a.maximum_version, a.metadata_version, a.reason,
                 a.metadata_bytes)
        for a in h.group().members[member_id].assignors
    )


def hb(h: Harness, member_id: str, owned: list[str] | None = None, group_id: str = "g",
       **fields: Any) -> Any:
    """A heartbeat at the member's current epoch (full join fields at epoch 0)."""
    cur = h.group(group_id).current[member_id]
    if cur.epoch == 0:
        timeout = h.group(group_id).members[member_id].rebalance_timeout_ms
        r = h.join(member_id, group_id=group_id, owned=owned or [],
                   assignors=wire_assignors(h, member_id), rebalance_timeout_ms=timeout, **fields)
    else:
        r = h.heartbeat(member_id, cur.epoch, group_id=group_id, owned=owned, **fields)
    assert r.error_code == 0, r
    return r


def one_worker(h: Harness, rebalance_timeout_ms: int = 30_000) -> None:
    """Connectors A (2 tasks) and B (1 task); W1 runs all five items at epoch 1."""
    assert h.alter({"A": 2, "B": 1}).error_code == 0
    assert h.join("W1", rebalance_timeout_ms=rebalance_timeout_ms).error_code == 0
    h.compute({"W1": ALL})
    assert hb(h, "W1").member_epoch == 1


def two_workers(h: Harness, rebalance_timeout_ms: int = 30_000) -> None:
    """W1 runs A, A/0, A/1 and W2 runs B, B/0, both Stable at epoch 2."""
    one_worker(h, rebalance_timeout_ms)
    assert h.join("W2", rebalance_timeout_ms=rebalance_timeout_ms).error_code == 0
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    hb(h, "W2", owned=[])
    assert h.current("W1") == (2, ["A", "A/0", "A/1"]) and h.current("W2") == (2, ["B", "B/0"])
    assert h.group().state.value == "Stable"


def keep_alive(h: Harness, ms: int, alive: tuple[str, ...], step: int = 1_000) -> None:
    """Let ``ms`` pass; the ``alive`` members heartbeat (reporting what they run) every step."""
    for _ in range(ms // step):
        h.advance(step)
        for mid in alive:
            if mid in h.group().members:
                hb(h, mid, owned=h.current(mid)[1])


def last_values(h: Harness) -> dict[Any, Any]:
    """Every key in the log with its last value (None: tombstone) — the compacted log."""
    out: dict[Any, Any] = {}
    for key, value in h.log:
        out[key] = value
    return out


# == heartbeat request validation ======================================================================

VALID_JOIN: dict[str, Any] = dict(
    group_id="g", member_id="m", member_epoch=0, rebalance_timeout_ms=1_000,
    client_assignors=(assignor(),), owned_connectors=(), owned_tasks=(),
)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"group_id": ""}, "GroupId must be non-empty"),
        ({"member_epoch": -3}, "MemberEpoch must be >= -2"),
        ({"member_epoch": 1, "member_id": ""}, "MemberId must be non-empty unless MemberEpoch is 0"),
        ({"member_epoch": -1, "member_id": ""}, "MemberId must be non-empty unless MemberEpoch is 0"),
        ({"instance_id": ""}, "InstanceId, if provided, must be non-empty"),
        ({"member_epoch": -2}, "MemberEpoch -2 (a static member leaving for a while) requires an InstanceId"),
        ({"member_epoch": 1, "rebalance_timeout_ms": 0}, "RebalanceTimeoutMs must be -1 (unchanged)"),
        ({"member_epoch": 1, "rebalance_timeout_ms": -7}, "RebalanceTimeoutMs must be -1 (unchanged)"),
        ({"max_wait_ms": -1}, "MaxWaitMs must be >= 0"),
        ({"rebalance_timeout_ms": -1}, "RebalanceTimeoutMs must be larger than zero in the first heartbeat"),
        ({"client_assignors": None}, "ClientAssignors must be non-empty in the first heartbeat"),
        ({"client_assignors": ()}, "ClientAssignors must be non-empty in the first heartbeat"),
        ({"owned_connectors": None}, "OwnedConnectors and OwnedTasks must be non-null in the first"),
        ({"owned_tasks": None}, "OwnedConnectors and OwnedTasks must be non-null in the first"),
        ({"member_epoch": 1, "client_assignors": ()}, "ClientAssignors, if provided, must be non-empty"),
        ({"client_assignors": (assignor(name=""),)}, "Assignor.Name must be non-empty"),
        ({"client_assignors": (assignor("x"), assignor("x"))}, "Assignor.Name 'x' is listed twice"),
        ({"client_assignors": (assignor(low=-2, high=1, version=0),)}, "MinimumVersion must be >= -1"),
        ({"client_assignors": (assignor(low=-1, high=-1, version=-1),)},
         "MaximumVersion must be >= 0 and >= MinimumVersion"),
        ({"client_assignors": (assignor(low=3, high=2, version=2),)},
         "MaximumVersion must be >= 0 and >= MinimumVersion"),
        ({"client_assignors": (assignor(low=0, high=1, version=2),)},
         "MetadataVersion must be within [MinimumVersion, MaximumVersion]"),
        ({"owned_connectors": ("",)}, "OwnedConnectors must not contain an empty name"),
        ({"owned_tasks": (_hb.TaskId(connector="", task=0),)},
         "OwnedTasks must not contain an empty connector name"),
        ({"owned_tasks": (_hb.TaskId(connector="A", task=-1),)},
         "OwnedTasks must not contain a negative task id (A/-1)"),
    ],
)
def test_heartbeat_validation_rules(changes: dict[str, Any], message: str) -> None:
    h = Harness()
    req = ConnectGroupHeartbeatRequest(**{**VALID_JOIN, **changes})
    result = h.coordinator.heartbeat(req, 0)
    r = h.apply(result)
    assert r.error_code == E.INVALID_REQUEST
    assert message in r.error_message
    assert result.records == [] and h.state.groups == {}
    # The request without the change is accepted.
    ok = h.apply(h.coordinator.heartbeat(ConnectGroupHeartbeatRequest(**VALID_JOIN), 0))
    assert ok.error_code == 0 and ok.member_id == "m"


def test_heartbeat_validation_order_group_id_first() -> None:
    h = Harness()
    req = ConnectGroupHeartbeatRequest(group_id="", member_id="", member_epoch=-5)
    r = h.apply(h.coordinator.heartbeat(req, 0))
    assert r.error_code == E.INVALID_REQUEST and "GroupId must be non-empty" in r.error_message


# == join, unknown member, fencing, lost responses, leave ===============================================


def test_join_with_empty_member_id_gets_a_generated_id() -> None:
    h = Harness()
    r1 = h.join("")
    r2 = h.join("")
    assert (r1.error_code, r2.error_code) == (0, 0)
    assert (r1.member_id, r2.member_id) == ("generated-1", "generated-2")
    assert sorted(h.group().members) == ["generated-1", "generated-2"]
    # The daemon's default: a random UUID.
    c = GroupCoordinator()
    req = ConnectGroupHeartbeatRequest(**{**VALID_JOIN, "member_id": ""})
    r = c.heartbeat(req, 0).response
    assert r.error_code == 0 and str(uuid.UUID(r.member_id)) == r.member_id
    assert r.member_id in c.group("g").members


def test_join_with_a_client_chosen_member_id() -> None:
    h = Harness()
    r = h.join("worker-7", worker_url="http://w7:8083")
    assert r.error_code == 0 and r.member_id == "worker-7" and r.member_epoch == 0
    g = h.group()
    m = g.members["worker-7"]
    assert (m.worker_url, m.client_id, m.client_host, m.rebalance_timeout_ms) == (
        "http://w7:8083", "client-worker-7", "127.0.0.1", 30_000)
    assert g.epoch == 1 and h.current("worker-7") == (0, [])


def test_steady_heartbeat_after_join_omits_the_member_id() -> None:
    h = Harness()
    one_worker(h)
    r = h.heartbeat("W1", 1)
    assert r.error_code == 0 and r.member_id is None and r.member_epoch == 1


def test_steady_heartbeat_fast_path_only_when_nothing_can_change() -> None:
    """GroupCoordinator.steady_heartbeat answers only a heartbeat that changes nothing; the
    harness checks on every heartbeat that its answer equals the full handler's."""
    h = Harness()
    two_workers(h)
    hits = h.steady_hits
    steady = ConnectGroupHeartbeatRequest(group_id="g", member_id="W1", member_epoch=2)
    assert h.coordinator.steady_heartbeat(steady, h.now) is not None
    h.heartbeat("W1", 2)
    h.heartbeat("W2", 2, max_wait_ms=500)
    assert h.steady_hits == hits + 2
    c = h.coordinator
    for changes in ({"member_epoch": 1}, {"member_id": "ghost"}, {"group_id": "other"},
                    {"owned_tasks": ()}, {"rebalance_timeout_ms": 5}, {"worker_url": "http://x"},
                    {"instance_id": "i-unknown"}, {"instance_id": ""}, {"member_epoch": -1}):
        req = ConnectGroupHeartbeatRequest(**{"group_id": "g", "member_id": "W1",
                                              "member_epoch": 2, **changes})
        assert c.steady_heartbeat(req, h.now) is None, changes
    # A new client id would be written (member record): not steady.
    assert c.steady_heartbeat(steady, h.now, RequestContext(client_id="someone-else")) is None
    # A change the member must hear about: a new connector bumps the group epoch.
    assert h.alter({"C": 1}).error_code == 0
    assert c.steady_heartbeat(steady, h.now) is None
    assert h.heartbeat("W1", 2).error_code == 0
    assert h.steady_hits == hits + 2


def test_must_revoke_names_the_members_whose_target_dropped_items() -> None:
    """The shard wakes these first after an install (their acknowledgements free the rest)."""
    h = Harness()
    two_workers(h)
    c = h.coordinator
    assert not any(c.must_revoke("g", m) for m in ("W1", "W2", "ghost"))
    assert h.join("W3").error_code == 0
    h.compute({"W1": ["A", "A/0"], "W2": ["B", "B/0"], "W3": ["A/1"]})
    assert [m for m in ("W1", "W2", "W3") if c.must_revoke("g", m)] == ["W1"]
    assert not c.must_revoke("other", "W1")


def test_unknown_member_id() -> None:
    h = Harness()
    one_worker(h)
    before = len(h.log)
    for epoch in (1, 5, -1):
        r = h.heartbeat("ghost", epoch)
        assert r.error_code == E.UNKNOWN_MEMBER_ID and "ghost" in r.error_message
    # Unknown group (not epoch 0): also UNKNOWN_MEMBER_ID (seed 000 lists no GROUP_ID_NOT_FOUND).
    r = h.heartbeat("W1", 1, group_id="other")
    assert r.error_code == E.UNKNOWN_MEMBER_ID and "other" not in h.state.groups
    assert len(h.log) == before and h.group().epoch == 1


@pytest.mark.parametrize("wrong", [3, 9])
def test_fenced_member_epoch_removes_the_member(wrong: int) -> None:
    """An epoch ahead of the member's: FENCED_MEMBER_EPOCH, the member is removed. (Epoch 0 is
    a rejoin, always accepted: tests/test_group_regressions.py, KAFKA-19233.)"""
    h = Harness()
    two_workers(h)
    g = h.group()
    assert g.current["W2"].epoch == 2
    tokens = dict(g.current["W2"].tokens)
    r = h.heartbeat("W2", wrong, owned=["B", "B/0"])
    assert r.error_code == E.FENCED_MEMBER_EPOCH
    assert f"MemberEpoch {wrong} does not match the member's epoch 2" in r.error_message
    assert "W2" not in g.members and g.epoch == 3 and "W2" not in g.target
    # W2 learns of the fence now and may take its stop budget (half its rebalance timeout)
    # to stop B and B/0 -- or it learns it at its session deadline, if this answer is lost.
    # Until then its items are held: nobody else may start them.
    session_deadline = h.now + 10_000  # W2 last heartbeated at h.now (in two_workers)
    assert g.current["W2"] == CurrentAssignment(
        HELD_EPOCH, 25_000, MemberState.UNREVOKED_ITEMS, frozenset(), frozenset({item("B"), item("B/0")}),
        tokens=tokens)  # (the hold keeps the fenced member's tokens)
    assert g.owner[item("B")] == "W2" and h.timers[("hold", "g", "W2")] == session_deadline + 15_000
    r = h.heartbeat("W2", 2)
    assert r.error_code == E.UNKNOWN_MEMBER_ID
    h.advance(24_999)
    assert g.owner[item("B")] == "W2"
    h.advance(1)
    assert item("B") not in g.owner and "W2" not in g.current and not g.soft.hold_deadline


def test_fenced_member_epoch_for_an_older_epoch_that_is_not_the_previous_one() -> None:
    h = Harness()
    two_workers(h)
    g = h.group()
    assert (g.current["W1"].epoch, g.current["W1"].previous_epoch) == (2, 1)
    r = h.heartbeat("W1", 1, owned=["A"])  # the previous epoch with a subset: accepted
    assert r.error_code == 0 and r.member_epoch == 2
    # Move W1 on to epoch 3 (previous epoch 2): epoch 1 is then neither current nor previous.
    h.join("W3")
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"], "W3": []})
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    assert (g.current["W1"].epoch, g.current["W1"].previous_epoch) == (3, 2)
    r = h.heartbeat("W1", 1, owned=["A"])  # older than the previous epoch: fenced
    assert r.error_code == E.FENCED_MEMBER_EPOCH and "W1" not in g.members


def _lost_response_setup(h: Harness) -> None:
    """W1 moved from epoch 1 to 2 (it revoked B, B/0); the response saying so is "lost"."""
    one_worker(h)
    h.join("W2")
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)
    r = hb(h, "W1", owned=["A", "A/0", "A/1"])
    assert r.member_epoch == 2  # this response is lost: the worker still believes it is at 1
    g = h.group()
    assert (g.current["W1"].epoch, g.current["W1"].previous_epoch) == (2, 1)


def test_lost_response_retry_with_previous_epoch_and_full_owned_subset_is_moved_forward() -> None:
    h = Harness()
    _lost_response_setup(h)
    g = h.group()
    epoch = g.epoch
    r = h.heartbeat("W1", 1, owned=["A", "A/0"])  # a subset of its assignment: accepted
    assert r.error_code == 0 and r.member_epoch == 2
    assert "W1" in g.members and g.epoch == epoch
    assert h.current("W1") == (2, ["A", "A/0", "A/1"])
    r = h.heartbeat("W1", 1, owned=["A", "A/0", "A/1"])  # the full assignment: accepted too
    assert r.error_code == 0 and r.member_epoch == 2


def test_lost_response_that_granted_items_full_retry_gets_the_assignment() -> None:
    """The lost response moved W2 to epoch 2 *and* gave it B, B/0. Seed 000: after an error the
    worker sends all the fields; it is moved forward and the response carries its assignment."""
    h = Harness()
    _lost_response_setup(h)
    r = hb(h, "W2", owned=[])
    assert (r.member_epoch, response_items(r)) == (2, ["B", "B/0"])  # lost
    g = h.group()
    assert (g.current["W2"].epoch, g.current["W2"].previous_epoch) == (2, 1)
    r = h.heartbeat("W2", 1, owned=[], rebalance_timeout_ms=30_000, client_assignors=(assignor(),))
    assert r.error_code == 0 and r.member_epoch == 2
    assert response_items(r) == ["B", "B/0"]
    assert "W2" in g.members and g.epoch == 2


@pytest.mark.parametrize(
    "fields",
    [
        {},  # no owned lists at all
        {"owned_connectors": ("A",)},  # only one list: not a full report
        {"owned": ["A", "A/0", "A/1", "B"]},  # B is not in its assignment any more
    ],
)
def test_lost_response_retry_without_full_subset_owned_lists_is_fenced(fields: dict[str, Any]) -> None:
    h = Harness()
    _lost_response_setup(h)
    g = h.group()
    epoch = g.epoch
    r = h.heartbeat("W1", 1, **fields)
    assert r.error_code == E.FENCED_MEMBER_EPOCH
    assert "W1" not in g.members and g.epoch == epoch + 1


def test_leave_removes_the_member_with_tombstones_and_bumps_the_epoch() -> None:
    h = Harness()
    two_workers(h)
    g = h.group()
    start = len(h.log)
    r = h.heartbeat("W2", -1)
    assert r.error_code == 0 and r.member_epoch == -1 and r.member_id == "W2"
    assert "W2" not in g.members and "W2" not in g.current and "W2" not in g.target
    assert g.epoch == 3 and item("B") not in g.owner
    written = h.log[start:]
    # Kafka's order: current assignment, target, member metadata tombstones; then the bump.
    assert [type(k) for k, _ in written] == [
        CurrentMemberAssignmentKey, TargetAssignmentMemberKey, GroupMemberKey, GroupMetadataKey]
    assert [v is None for _, v in written] == [True, True, True, False]
    assert written[-1][1].epoch == 3
    assert ("session", "g", "W2") not in h.timers
    # W1 is chosen for the new computation.
    assert h.assigner() == "W1"


# == static membership ================================================================================


def _static_setup(h: Harness) -> None:
    """S (instance "i-1") runs B, B/0; W1 runs A, A/0, A/1; both Stable at epoch 2."""
    one_worker(h)
    assert h.join("S", instance_id="i-1").error_code == 0
    h.compute({"W1": ["A", "A/0", "A/1"], "S": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    hb(h, "S", owned=[])
    assert h.current("S") == (2, ["B", "B/0"]) and h.group().static_members == {"i-1": "S"}


def test_static_leave_keeps_work_held_until_session_expiry() -> None:
    h = Harness()
    _static_setup(h)
    g = h.group()
    left_at = h.now
    r = h.heartbeat("S", -2, instance_id="i-1")
    assert r.error_code == 0 and r.member_epoch == -2
    assert g.epoch == 2  # no rebalance
    assert g.current["S"].epoch == -2 and names(g.current["S"].assigned) == ["B", "B/0"]
    assert g.owner[item("B")] == "S" and h.target("S") == ["B", "B/0"]
    assert h.timers[("session", "g", "S")] == left_at + 10_000  # not rescheduled
    # Nobody else may get B meanwhile; W1 keeps heartbeating.
    keep_alive(h, 9_000, alive=("W1",))
    assert "S" in g.members and g.owner[item("B")] == "S" and g.epoch == 2
    # The session expires: S is fenced and removed, the group epoch bumped.
    keep_alive(h, 2_000, alive=("W1",))
    assert "S" not in g.members and g.static_members == {}
    assert g.epoch == 3 and item("B") not in g.owner
    assert g.state.value == "Assigning" and h.assigner() == "W1"


@pytest.mark.parametrize("new_id", ["S-new", "S"])
def test_static_rejoin_with_same_instance_takes_over_at_once(new_id: str) -> None:
    h = Harness()
    _static_setup(h)
    g = h.group()
    assert h.heartbeat("S", -2, instance_id="i-1").error_code == 0
    h.advance(2_000)
    r = h.join(new_id, instance_id="i-1", owned=[])
    assert r.error_code == 0 and r.member_id == new_id
    # Its old work at once, at the assignment epoch; no rebalance.
    assert r.member_epoch == 2 and response_items(r) == ["B", "B/0"]
    assert g.epoch == 2 and g.state.value == "Stable"
    assert g.static_members == {"i-1": new_id}
    assert sorted(g.members) == sorted({"W1", new_id})
    assert h.target(new_id) == ["B", "B/0"] and g.owner[item("B")] == new_id
    # The old member's session timer no longer removes anything.
    keep_alive(h, 15_000, alive=("W1", new_id))
    assert new_id in g.members and g.epoch == 2


def test_unreleased_instance_id_while_the_old_holder_is_still_in() -> None:
    h = Harness()
    _static_setup(h)
    before = len(h.log)
    r = h.join("S-new", instance_id="i-1")
    assert r.error_code == E.UNRELEASED_INSTANCE_ID
    assert "i-1" in r.error_message and "still held by member S" in r.error_message
    assert len(h.log) == before and "S-new" not in h.group().members


def test_fenced_instance_id_when_the_instance_belongs_to_another_member() -> None:
    h = Harness()
    _static_setup(h)
    g = h.group()
    r = h.heartbeat("W1", 2, instance_id="i-1")
    assert r.error_code == E.FENCED_INSTANCE_ID and "belongs to member S" in r.error_message
    r = h.heartbeat("W1", -1, instance_id="i-1")  # nor may it leave as that instance
    assert r.error_code == E.FENCED_INSTANCE_ID
    r = h.heartbeat("S", 2, instance_id="i-unknown")
    assert r.error_code == E.UNKNOWN_MEMBER_ID and "i-unknown" in r.error_message
    assert sorted(g.members) == ["S", "W1"] and g.epoch == 2


def test_a_member_already_in_the_group_cannot_take_over_another_members_instance() -> None:
    """W1 (in the group, running A, A/0, A/1) rejoins with epoch 0 claiming S's instance id
    while S is away (-2). Taking it over would overwrite W1's own records (its work would vanish
    from the bookkeeping while it still runs it): FENCED_INSTANCE_ID, nothing changes."""
    h = Harness()
    _static_setup(h)
    g = h.group()
    assert h.heartbeat("S", -2, instance_id="i-1").error_code == 0
    before = len(h.log)
    snapshot = h.state.snapshot()
    r = h.join("W1", instance_id="i-1", owned=["A", "A/0", "A/1"])
    assert r.error_code == E.FENCED_INSTANCE_ID and "cannot take it over" in r.error_message
    assert len(h.log) == before and h.state.snapshot() == snapshot
    assert g.owner[item("A")] == "W1" and g.owner[item("B")] == "S"
    assert g.static_members == {"i-1": "S"}
    # A new member id may take it over.
    r = h.join("S-new", instance_id="i-1", owned=[])
    assert r.error_code == 0 and response_items(r) == ["B", "B/0"]


def test_static_member_leaving_with_minus_one_is_removed() -> None:
    h = Harness()
    _static_setup(h)
    g = h.group()
    r = h.heartbeat("S", -1, instance_id="i-1")
    assert r.error_code == 0 and r.member_epoch == -1
    assert "S" not in g.members and g.static_members == {} and g.epoch == 3
    # The instance id is free again: a new member may take it (a fresh member).
    r = h.join("S2", instance_id="i-1")
    assert r.error_code == 0 and g.static_members == {"i-1": "S2"} and g.epoch == 4


# == group size, assignment deltas, heartbeat interval and session timeout ==============================


def test_group_max_size_reached() -> None:
    h = Harness(GroupCoordinatorConfig(max_size=2))
    assert h.join("W1").error_code == 0
    assert h.join("W2").error_code == 0
    before = len(h.log)
    r = h.join("W3")
    assert r.error_code == E.GROUP_MAX_SIZE_REACHED and "maximum size (2 members)" in r.error_message
    assert len(h.log) == before and sorted(h.group().members) == ["W1", "W2"]
    assert h.join("W1").error_code == 0  # a member already in may rejoin
    assert h.heartbeat("W2", -1).error_code == 0
    assert h.join("W3").error_code == 0


def test_assignment_sent_only_when_it_changed() -> None:
    h = Harness()
    two_workers(h)
    before = len(h.log)
    for _ in range(3):
        r = h.heartbeat("W2", 2)
        assert r.error_code == 0 and r.member_epoch == 2 and r.assignment is None
        r = h.heartbeat("W2", 2, owned=["B", "B/0"])
        assert r.assignment is None
    assert len(h.log) == before  # a steady heartbeat writes nothing
    # A full request (as after a client-side error) gets the assignment again.
    r = h.heartbeat("W2", 2, owned=["B", "B/0"], rebalance_timeout_ms=30_000,
                    client_assignors=(assignor(),))
    assert response_items(r) == ["B", "B/0"]
    assert len(h.log) == before


def test_heartbeat_interval_and_session_timeout_from_config() -> None:
    config = GroupCoordinatorConfig(session_timeout_ms=5_000, heartbeat_interval_ms=1_000)
    h = Harness(config)
    r = h.join("W1")
    assert r.heartbeat_interval_ms == 1_000
    assert h.timers[("session", "g", "W1")] == 5_000
    h.advance(4_999)
    assert "W1" in h.group().members
    h.advance(1)
    assert "W1" not in h.group().members
    # Errors carry the interval too.
    assert h.heartbeat("W1", 1).heartbeat_interval_ms == 1_000


def test_per_group_overrides_of_interval_and_session_timeout() -> None:
    h = Harness()
    assert h.join("W1").heartbeat_interval_ms == 3_000
    code, message = h.apply(h.coordinator.alter_group_config(
        "g", {HEARTBEAT_INTERVAL: "500", SESSION_TIMEOUT: "2000"}, h.now))
    assert (code, message) == (0, None)
    assert h.group().configs == {HEARTBEAT_INTERVAL: "500", SESSION_TIMEOUT: "2000"}
    r = h.join("W1")
    assert r.heartbeat_interval_ms == 500
    assert h.timers[("session", "g", "W1")] == h.now + 2_000
    # Another group keeps the defaults.
    assert h.join("X", group_id="other").heartbeat_interval_ms == 3_000
    # Removing an override (None) restores the default.
    # The whole resulting set is checked: the default interval (3 s) with the 2 s override
    # of the session timeout is refused, nothing written.
    before = len(h.log)
    code, text = h.apply(h.coordinator.alter_group_config("g", {HEARTBEAT_INTERVAL: None}, h.now))
    assert code == E.INVALID_CONFIG and "(2000) must be greater than" in text
    assert len(h.log) == before and h.group().configs == {HEARTBEAT_INTERVAL: "500",
                                                          SESSION_TIMEOUT: "2000"}
    code, _ = h.apply(h.coordinator.alter_group_config(
        "g", {HEARTBEAT_INTERVAL: None, SESSION_TIMEOUT: " 4000 "}, h.now))
    assert code == 0 and h.group().configs == {SESSION_TIMEOUT: "4000"}
    r = h.join("W1")
    assert r.heartbeat_interval_ms == 3_000 and h.timers[("session", "g", "W1")] == h.now + 4_000
    h.advance(4_000)
    assert "W1" not in h.group().members
    # validate_only: checked, not written.
    before = len(h.log)
    assert h.apply(h.coordinator.alter_group_config(
        "g", {SESSION_TIMEOUT: "6000"}, h.now, validate_only=True)) == (0, None)
    assert len(h.log) == before and h.group().configs == {SESSION_TIMEOUT: "4000"}
    # A SET creates a group that does not exist yet; a DELETE there writes nothing.
    assert h.apply(h.coordinator.alter_group_config("new", {SESSION_TIMEOUT: None}, h.now)) == (0, None)
    assert "new" not in h.state.groups
    assert h.apply(h.coordinator.alter_group_config("new", {SESSION_TIMEOUT: "6000"}, h.now)) == (0, None)
    assert h.coordinator.group_configs("new") == {SESSION_TIMEOUT: "6000"}
    assert h.coordinator.group_configs("absent") == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"connect.unknown": "1"}, "Unknown group config name: connect.unknown"),
        ({SESSION_TIMEOUT: "soon"}, "Invalid value soon for configuration "
                                    "connect.session.timeout.ms: Not a number of type INT"),
        ({SESSION_TIMEOUT: "1_000"}, "Not a number of type INT"),
        ({SESSION_TIMEOUT: "10"}, "connect.session.timeout.ms must be greater than or equal to "
                                  "group.connect.min.session.timeout.ms (1000)"),
        ({HEARTBEAT_INTERVAL: "99999999"}, "connect.heartbeat.interval.ms must be less than or "
                                           "equal to group.connect.max.heartbeat.interval.ms "
                                           "(60000)"),
        # >= the default session 10 s
        ({HEARTBEAT_INTERVAL: "20000"}, "connect.session.timeout.ms (10000) must be greater than "
                                        "connect.heartbeat.interval.ms (20000)"),
        ({SESSION_TIMEOUT: "3000"}, "must be greater than connect.heartbeat.interval.ms (3000)"),
        # Kafka's INT is 32 bits: beyond it, a parse error whatever the bounds (a daemon maximum
        # set above it let 2147483648 through, which no heartbeat answer could carry)
        ({SESSION_TIMEOUT: "2147483648"}, "Invalid value 2147483648 for configuration "
                                          "connect.session.timeout.ms: Not a number of type INT"),
        ({HEARTBEAT_INTERVAL: "-2147483649"}, "Not a number of type INT"),
    ],
)
def test_invalid_group_config_override(overrides: dict[str, str], message: str) -> None:
    h = Harness(GroupCoordinatorConfig(max_session_timeout_ms=2**32))
    h.join("W1")
    before = len(h.log)
    code, text = h.apply(h.coordinator.alter_group_config("g", overrides, h.now))
    assert code == E.INVALID_CONFIG and message in text
    assert len(h.log) == before and h.group().configs == {}


def test_overrides_clamped_by_narrowed_bounds_never_leave_session_at_or_below_interval() -> None:
    # Stored overrides session 5 s / interval 4 s; the daemon restarts with
    # group.connect.max.session.timeout.ms = 3 s. Clamping the session alone would give members a
    # 3 s session and a 4 s interval: each fenced between two heartbeats, forever. The group gets
    # the daemon's interval instead (it is below the clamped session).
    h = Harness()
    h.join("W1")
    assert h.apply(h.coordinator.alter_group_config(
        "g", {SESSION_TIMEOUT: "5000", HEARTBEAT_INTERVAL: "4000"}, h.now)) == (0, None)
    narrowed = GroupCoordinatorConfig(session_timeout_ms=2_000, max_session_timeout_ms=3_000,
                                      heartbeat_interval_ms=500)
    assert narrowed.for_group(h.group().configs) == (3_000, 500)
    restarted = Harness(narrowed)
    restarted.coordinator = GroupCoordinator(narrowed, strict=True)
    for record in h.log:
        restarted.coordinator.replay(record)
    restarted.log = list(h.log)
    restarted.now = h.now
    restarted._epochs = invariant_epochs(restarted.state)
    restarted.apply(restarted.coordinator.on_loaded(restarted.now))
    assert restarted.timers[("session", "g", "W1")] == h.now + 3_000
    assert restarted.heartbeat("W1", 1).heartbeat_interval_ms == 500
    # The daemon's interval is not below the clamped session either (session override 1.5 s,
    # interval override 1 s, then group.connect.min.heartbeat.interval.ms = 2 s): the daemon's
    # own pair, which its checks keep consistent.
    tight = GroupCoordinatorConfig(min_heartbeat_interval_ms=2_000)
    assert tight.for_group({SESSION_TIMEOUT: "1500", HEARTBEAT_INTERVAL: "1000"}) == (10_000,
                                                                                      3_000)
    # A consistent pair within the bounds is kept as it is.
    assert tight.for_group({SESSION_TIMEOUT: "7000", HEARTBEAT_INTERVAL: "2000"}) == (7_000,
                                                                                      2_000)


def test_a_group_id_too_long_for_the_records_is_refused_before_anything_is_written() -> None:
    # The records carry a group id as a string of at most 32,767 UTF-8 bytes: a longer one made
    # the write fail in the store and came back as COORDINATOR_NOT_AVAILABLE, which clients
    # retry until their timeout. It is INVALID_GROUP_ID, from a SET of a config and a join alike.
    h = Harness()
    longest = "é" * (32_767 // 2) + "x"  # 32,767 bytes
    too_long = longest + "x"
    code, text = h.apply(h.coordinator.alter_group_config(too_long, {SESSION_TIMEOUT: "5000"},
                                                          h.now))
    assert code == E.INVALID_GROUP_ID and "32,768 bytes" in text and "32,767" in text
    r = h.join("W1", group_id=too_long)
    assert r.error_code == E.INVALID_GROUP_ID
    assert h.log == [] and h.state.groups == {}
    # ValidateOnly answers what the change would get (it answered OK).
    code, _ = h.apply(h.coordinator.alter_group_config(too_long, {SESSION_TIMEOUT: "5000"},
                                                       h.now, validate_only=True))
    assert code == E.INVALID_GROUP_ID
    # Creating connectors in it, ValidateOnly or not, alike.
    assert h.alter({"c": 1}, group_id=too_long, validate_only=True).error_code == E.INVALID_GROUP_ID
    assert h.alter({"c": 1}, group_id=too_long).error_code == E.INVALID_GROUP_ID
    assert h.apply(h.coordinator.alter_group_config(longest, {SESSION_TIMEOUT: "5000"},
                                                    h.now)) == (0, None)
    assert h.join("W1", group_id=longest).error_code == 0
    h.check_records_encode()



def test_validate_only_on_a_new_group_beyond_group_max_groups_is_refused_as_the_change() -> None:
    h = Harness(GroupCoordinatorConfig(max_groups=1))
    h.join("W1")
    change = {SESSION_TIMEOUT: "5000"}
    refused = h.apply(h.coordinator.alter_group_config("other", change, h.now))
    assert refused[0] == E.INVALID_REQUEST and "group.max.groups is 1" in refused[1]
    assert h.apply(h.coordinator.alter_group_config("other", change, h.now,
                                                    validate_only=True)) == refused
    # The group that exists: validated and answered OK, nothing written.
    before = len(h.log)
    assert h.apply(h.coordinator.alter_group_config("g", change, h.now,
                                                    validate_only=True)) == (0, None)
    assert len(h.log) == before

def test_group_config_needs_a_group_id() -> None:
    h = Harness()
    code, text = h.apply(h.coordinator.alter_group_config("", {SESSION_TIMEOUT: "2000"}, 0))
    assert code == E.INVALID_REQUEST and "Default group resources are not allowed." in text


# == assignor selection and the chosen worker ==========================================================


def _names(*names_: str, low: int = 0, high: int = 1) -> tuple[Any, ...]:
    return tuple(assignor(n, low, high) for n in names_)


@pytest.mark.parametrize(
    ("lists", "expected"),
    [
        ([("coop", "eager"), ("coop", "eager")], "coop"),
        ([("eager", "coop"), ("eager", "coop")], "eager"),
        ([("eager", "coop"), ("coop",)], "coop"),  # the only common one
        ([("x", "y"), ("x", "y"), ("y", "x")], "x"),  # precedence of the majority
    ],
)
def test_assignor_selection_common_assignor_in_precedence_order(
    lists: list[tuple[str, ...]], expected: str
) -> None:
    h = Harness()
    h.alter({"A": 0})
    for i, assignors in enumerate(lists):
        assert h.join(f"M{i}", assignors=_names(*assignors)).error_code == 0
    prepared = h.prepare(h.assigner())
    assert prepared.error_code == 0 and prepared.assignor_name == expected
    assert h.describe().groups[0].assignor_name == expected


def test_unsupported_assignor_when_no_common_assignor() -> None:
    h = Harness()
    h.join("M1", assignors=_names("coop"))
    before = len(h.log)
    r = h.join("M2", assignors=_names("eager"))
    assert r.error_code == E.UNSUPPORTED_ASSIGNOR
    assert "None of the member's ClientAssignors" in r.error_message
    assert len(h.log) == before and sorted(h.group().members) == ["M1"]
    # A member changing its assignors to an unsupported set is refused too (and kept as it was).
    h.join("M2", assignors=_names("coop", "eager"))
    r = h.join("M2", assignors=_names("eager"))
    assert r.error_code == E.UNSUPPORTED_ASSIGNOR
    assert [a.name for a in h.group().members["M2"].assignors] == ["coop", "eager"]


def test_unsupported_assignor_for_a_non_overlapping_version_range() -> None:
    h = Harness()
    h.join("M1", assignors=(assignor("coop", 0, 1),))
    r = h.join("M2", assignors=(assignor("coop", 2, 3),))
    assert r.error_code == E.UNSUPPORTED_ASSIGNOR
    assert "version range [2, 3] does not overlap member M1's [0, 1]" in r.error_message
    assert "M2" not in h.group().members
    assert h.join("M2", assignors=(assignor("coop", 1, 3),)).error_code == 0  # overlaps at 1


@pytest.mark.parametrize("order", [("A", "B", "C"), ("B", "C", "A"), ("C", "A", "B")])
def test_chosen_worker_covers_every_version_range(order: tuple[str, ...]) -> None:
    """Seed 000 "Worker Selection": A [1-5], B [3-4], C [2-4] -> A is chosen."""
    ranges = {"A": (1, 5), "B": (3, 4), "C": (2, 4)}
    h = Harness()
    h.alter({"A": 1})
    for mid in order:
        low, high = ranges[mid]
        assert h.join(mid, assignors=(assignor("coop", low, high),)).error_code == 0
    assert h.assigner() == "A"
    assert h.describe().groups[0].assigning_member_id == "A"
    assert hb(h, "B").should_compute_assignment is False
    assert hb(h, "C").should_compute_assignment is False
    assert hb(h, "A").should_compute_assignment is True
    assert h.prepare("B").error_code == E.UNKNOWN_MEMBER_ID
    prepared = h.prepare("A")
    assert prepared.error_code == 0 and prepared.group_epoch == 3
    assert {m.member_id: m.metadata_version for m in prepared.members} == {"A": 5, "B": 4, "C": 4}


def test_no_assignor_covers_group_is_surfaced_in_describe() -> None:
    h = Harness()
    h.alter({"A": 1})
    h.join("A", assignors=(assignor("coop", 1, 3),))
    assert h.assigner() == "A"
    h.join("B", assignors=(assignor("coop", 2, 4),))  # overlaps A's range, neither covers both
    g = h.group()
    assert h.assigner() is None
    d = h.describe().groups[0]
    assert d.error_code == E.NO_ASSIGNOR_COVERS_GROUP and "version range covers" in d.error_message
    assert d.group_state == "Assigning" and d.assigning_member_id is None
    assert hb(h, "A").should_compute_assignment is False
    assert hb(h, "B").should_compute_assignment is False
    assert h.prepare("A").error_code == E.UNKNOWN_MEMBER_ID
    assert g.assignment_epoch == 0
    # A worker covering everyone joins: it computes, the error is gone.
    h.join("C", assignors=(assignor("coop", 1, 4),))
    assert h.assigner() == "C"
    h.compute({"C": ["A", "A/0"]})
    d = h.describe().groups[0]
    assert d.error_code == 0 and d.error_message is None and d.assignment_epoch == 3


def test_chosen_worker_is_sticky_while_eligible() -> None:
    h = Harness()
    h.alter({"A": 1})
    h.join("Z")
    assert h.assigner() == "Z"
    h.compute({"Z": ["A", "A/0"]})
    h.join("M")  # "M" sorts before "Z": stickiness, not the order, keeps Z
    assert h.assigner() == "Z"
    hb(h, "Z", owned=[])
    h.compute({"Z": ["A"], "M": ["A/0"]})
    h.join("N")
    assert h.assigner() == "Z"
    # A member with a wider range joins: Z no longer covers the group, so the wider one computes.
    h.join("W", assignors=(assignor(low=0, high=2),))
    assert h.assigner() == "W"
    assert hb(h, "Z").should_compute_assignment is False
    h.compute({"Z": ["A"], "M": ["A/0"], "N": [], "W": []})
    # W stays chosen (sticky) for the next rebalance; when it leaves, an eligible one takes over.
    h.join("V")
    assert h.assigner() == "W"
    r = h.heartbeat("W", -1)
    assert r.error_code == 0 and h.assigner() == "M"  # all others eligible again: the first


# == PrepareAssignment / InstallAssignment =============================================================


def _prepare(h: Harness, group_id: str, member_id: str, epoch: int) -> Any:
    req = ConnectGroupPrepareAssignmentRequest(group_id=group_id, member_id=member_id,
                                               member_epoch=epoch)
    return h.apply(h.coordinator.prepare_assignment(req, h.now))


def _install(h: Harness, group_id: str, member_id: str, epoch: int, group_epoch: int = 0,
             members: tuple[Any, ...] = (), delay: int = -1) -> Any:
    req = ConnectGroupInstallAssignmentRequest(
        group_id=group_id, member_id=member_id, member_epoch=epoch, group_epoch=group_epoch,
        error=0, assignor_state=b"", scheduled_rebalance_delay_ms=delay, members=members)
    return h.apply(h.coordinator.install_assignment(req, h.now))


def _with_chosen_w1(h: Harness) -> None:
    """W1 at epoch 1 runs everything; W2 joined (epoch 2), W1 is chosen."""
    one_worker(h)
    h.join("W2")
    assert h.assigner() == "W1" and h.current("W1")[0] == 1 and h.current("W2")[0] == 1


@pytest.mark.parametrize("call", ["prepare", "install"])
@pytest.mark.parametrize(
    ("group_id", "member_id", "epoch", "code", "message"),
    [
        ("", "W1", 1, E.INVALID_REQUEST, "GroupId must be non-empty"),
        ("", "", -1, E.INVALID_REQUEST, "GroupId must be non-empty"),
        ("g", "", 1, E.INVALID_REQUEST, "MemberId must be non-empty"),
        ("g", "W1", -1, E.INVALID_REQUEST, "MemberEpoch must be >= 0"),
        ("nope", "W1", 1, E.GROUP_ID_NOT_FOUND, "Group nope does not exist"),
        ("nope", "ghost", 7, E.GROUP_ID_NOT_FOUND, "Group nope does not exist"),
        ("g", "ghost", 1, E.UNKNOWN_MEMBER_ID, "Member ghost is not in group g"),
        ("g", "ghost", 9, E.UNKNOWN_MEMBER_ID, "Member ghost is not in group g"),
        ("g", "W1", 2, E.FENCED_MEMBER_EPOCH, "MemberEpoch 2 does not match the member's epoch 1"),
        ("g", "W2", 5, E.FENCED_MEMBER_EPOCH, "MemberEpoch 5 does not match the member's epoch 1"),
        ("g", "W2", 1, E.UNKNOWN_MEMBER_ID, "not the member chosen to compute"),
    ],
)
def test_prepare_and_install_error_rules_in_seed_order(
    call: str, group_id: str, member_id: str, epoch: int, code: int, message: str
) -> None:
    h = Harness()
    _with_chosen_w1(h)
    g = h.group()
    before = (len(h.log), g.epoch, sorted(g.members))
    if call == "prepare":
        r = _prepare(h, group_id, member_id, epoch)
    else:
        r = _install(h, group_id, member_id, epoch, group_epoch=2)
    assert r.error_code == code and message in r.error_message
    # Nothing changed: an epoch mismatch on Prepare/Install does not remove the member.
    assert (len(h.log), g.epoch, sorted(g.members)) == before
    assert h.assigner() == "W1"


def _member(mid: str, texts: list[str], dup: bool = False) -> Any:
    its = sorted(items(texts))
    connectors = [i.connector for i in its if i.task == -1]
    tasks = [_inst.TaskId(connector=i.connector, task=i.task) for i in its if i.task != -1]
    if dup:
        connectors = connectors + connectors[:1]
    return _inst.MemberAssignment(member_id=mid, connectors=tuple(connectors), tasks=tuple(tasks),
                                  metadata_version=0, metadata_bytes=b"")


@pytest.mark.parametrize(
    ("members", "code", "message"),
    [
        ((_member("W1", ["A", "A/0", "A/1"]), _member("W2", ["B"])), E.INVALID_ASSIGNMENT,
         "1 connectors/tasks are not assigned: B/0"),
        ((_member("W1", ["A", "A/0", "A/1", "B"]), _member("W2", ["B", "B/0"])), E.INVALID_ASSIGNMENT,
         "B is assigned to both W1 and W2"),
        ((_member("W1", ["A", "A/0", "A/1"], dup=True), _member("W2", ["B", "B/0"])), E.INVALID_ASSIGNMENT,
         "Member W1 is assigned the same item twice"),
        ((_member("W1", ["A", "A/0", "A/1", "A/2"]), _member("W2", ["B", "B/0"])), E.INVALID_ASSIGNMENT,
         "Unknown connectors/tasks assigned: A/2"),
        ((_member("W1", ["A", "A/0", "A/1", "C"]), _member("W2", ["B", "B/0"])), E.INVALID_ASSIGNMENT,
         "Unknown connectors/tasks assigned: C"),
        ((_member("W1", ["A", "A/0", "A/1"]), _member("ghost", ["B", "B/0"])), E.INVALID_ASSIGNMENT,
         "Member ghost was not a member of the group at epoch 2"),
        ((_member("", ["A", "A/0", "A/1", "B", "B/0"]),), E.INVALID_REQUEST,
         "Members[].MemberId must be non-empty"),
        ((_member("W1", ["A"]), _member("W1", ["A/0", "A/1", "B", "B/0"])), E.INVALID_REQUEST,
         "Member W1 is listed twice"),
    ],
)
def test_install_assignment_validation(members: tuple[Any, ...], code: int, message: str) -> None:
    h = Harness()
    _with_chosen_w1(h)
    g = h.group()
    prepared = h.prepare("W1")
    assert prepared.group_epoch == 2
    r = _install(h, "g", "W1", 1, group_epoch=2, members=members)
    assert r.error_code == code and message in r.error_message
    assert g.assignment_epoch == 1 and h.target("W1") == ALL and h.target("W2") == []
    # The computation is still W1's: a valid install goes through afterwards.
    ok = _install(h, "g", "W1", 1, group_epoch=2, members=(
        _member("W1", ["A", "A/0", "A/1"]), _member("W2", ["B", "B/0"])))
    assert ok.error_code == 0 and g.assignment_epoch == 2


def test_install_needs_the_prepared_group_epoch() -> None:
    h = Harness()
    _with_chosen_w1(h)
    full = (_member("W1", ALL),)
    r = _install(h, "g", "W1", 1, group_epoch=2, members=full)  # no PrepareAssignment yet
    assert r.error_code == E.INVALID_ASSIGNMENT and "call PrepareAssignment again" in r.error_message
    h.prepare("W1")
    r = _install(h, "g", "W1", 1, group_epoch=1, members=full)
    assert r.error_code == E.INVALID_ASSIGNMENT and "GroupEpoch 1 is not the epoch" in r.error_message
    r = _install(h, "g", "W1", 1, group_epoch=2, members=full, delay=-2)
    assert r.error_code == E.INVALID_REQUEST and "ScheduledRebalanceDelayMs must be >= -1" in r.error_message
    assert _install(h, "g", "W1", 1, group_epoch=2, members=full).error_code == 0


def test_prepare_returns_the_group_metadata() -> None:
    h = Harness()
    h.alter({"A": 2, "B": 1}, configs={"A": {"connector.class": "FileSource"}})
    h.join("W1", instance_id="i-1", worker_url="http://w1", assignors=(
        assignor("coop", 0, 2, version=2, reason=4, metadata=b"meta"),))
    h.compute({"W1": ALL}, assignor_state=b"state-1")
    hb(h, "W1")
    h.join("W2", assignors=(assignor("coop", 0, 2, version=1),))
    h.advance(1234)
    p = h.prepare("W1")
    assert p.error_code == 0
    assert (p.group_epoch, p.assignment_epoch, p.assignor_name) == (2, 1, "coop")
    assert (p.coordinator_time_ms, p.assignor_state) == (1234, b"state-1")
    assert [(c.name, c.task_count, [(e.name, e.value) for e in c.config]) for c in p.connectors] == [
        ("A", 2, [("connector.class", "FileSource")]), ("B", 1, [])]
    m = {x.member_id: x for x in p.members}
    assert sorted(m) == ["W1", "W2"]
    w1 = m["W1"]
    assert (w1.member_epoch, w1.instance_id, w1.worker_url, w1.reason, w1.metadata_version,
            w1.metadata_bytes) == (1, "i-1", "http://w1", 4, 2, b"meta")
    assert sorted(w1.target_connectors) == ["A", "B"] and len(w1.target_tasks) == 3
    assert sorted(w1.owned_connectors) == ["A", "B"] and len(w1.owned_tasks) == 3
    assert (m["W2"].metadata_version, m["W2"].target_connectors, m["W2"].owned_tasks) == (1, (), ())


def test_install_accepted_after_the_group_epoch_moved_on() -> None:
    h = Harness()
    _with_chosen_w1(h)
    g = h.group()
    prepared = h.prepare("W1")
    assert prepared.group_epoch == 2
    h.join("W3")  # epoch 3 while W1 computes for epoch 2
    assert g.epoch == 3
    r = h.install("W1", {"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}, 2)
    assert r.error_code == 0
    assert g.assignment_epoch == 2 and g.state.value == "Assigning"
    assert h.target("W2") == ["B", "B/0"] and h.target("W3") == []
    # A new computation starts right away: the chosen member is told on its next heartbeat.
    assert h.assigner() == "W1"
    r = h.heartbeat("W1", 1)
    assert r.should_compute_assignment is True
    h.compute({"W1": ["A", "A/0"], "W2": ["B", "B/0"], "W3": ["A/1"]})
    assert g.assignment_epoch == 3


def test_install_for_an_epoch_whose_member_left_meanwhile() -> None:
    h = Harness()
    _with_chosen_w1(h)
    g = h.group()
    h.prepare("W1")
    assert h.heartbeat("W2", -1).error_code == 0  # W2 leaves during the computation
    r = h.install("W1", {"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}, 2)
    assert r.error_code == 0
    # Installed for today's members only: B and B/0 are in no target until the next one.
    assert g.assignment_epoch == 2 and sorted(g.target) == ["W1"]
    assert item("B") not in g.target_owner
    assert g.epoch == 3 and h.assigner() == "W1"
    assert h.heartbeat("W1", 1).should_compute_assignment is True


def test_one_computation_in_flight() -> None:
    h = Harness()
    _with_chosen_w1(h)
    r = h.prepare("W2")
    assert r.error_code == E.UNKNOWN_MEMBER_ID and "not the member chosen" in r.error_message
    assert h.prepare("W1").error_code == 0
    r = h.prepare("W2")
    assert r.error_code == E.UNKNOWN_MEMBER_ID
    r = h.install("W2", {"W1": ALL}, 2)
    assert r.error_code == E.UNKNOWN_MEMBER_ID
    # While W1 computes, its heartbeats no longer ask it to compute.
    assert h.heartbeat("W1", 1).should_compute_assignment is False


@pytest.mark.parametrize("prepared", [False, True])
def test_computation_timeout_chooses_another_worker_without_fencing(prepared: bool) -> None:
    h = Harness()
    one_worker(h, rebalance_timeout_ms=5_000)
    h.join("W2", rebalance_timeout_ms=5_000)
    g = h.group()
    assert h.assigner() == "W1"
    told = h.heartbeat("W1", 1)
    assert told.should_compute_assignment is True
    told_at = h.now
    if prepared:
        assert h.prepare("W1").group_epoch == 2
    assert h.timers[("compute", "g", "")] == told_at + 5_000
    keep_alive(h, 4_000, alive=("W1", "W2"))
    assert h.assigner() == "W1"
    keep_alive(h, 2_000, alive=("W1", "W2"))
    # W1 did not install in its rebalance timeout: W2 is chosen; W1 is still a member, same epoch.
    assert h.assigner() == "W2"
    assert "W1" in g.members and h.current("W1") == (1, ALL) and g.epoch == 2
    assert h.heartbeat("W2", 1).should_compute_assignment is True
    assert h.install("W1", {"W1": ALL}, 2).error_code == E.UNKNOWN_MEMBER_ID
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    assert g.assignment_epoch == 2


def test_assignor_error_keeps_the_target_but_advances_the_assignment_epoch() -> None:
    h = Harness()
    _with_chosen_w1(h)
    g = h.group()
    h.compute({}, error=3, assignor_state=b"ignored")
    assert (g.epoch, g.assignment_epoch, g.assignment_error) == (2, 2, 3)
    assert h.target("W1") == ALL and h.target("W2") == []
    assert g.assignor_state == b""  # the failed assignor's state is not kept
    r = h.heartbeat("W1", 1)
    assert r.member_epoch == 2 and response_items(r) == ALL and r.assignment.error == 3
    r = h.heartbeat("W2", 1, owned=[])
    assert r.member_epoch == 2 and response_items(r) == [] and r.assignment.error == 3
    assert g.state.value == "Stable" and h.assigner() is None
    # A later successful install clears the error.
    h.join("W3")
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"], "W3": []})
    assert g.assignment_error == 0


def test_scheduled_rebalance_delay_starts_a_new_computation() -> None:
    h = Harness()
    _with_chosen_w1(h)
    g = h.group()
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}, delay_ms=5_000)
    at = h.now + 5_000
    assert g.scheduled_rebalance_at_ms == at and h.timers[("scheduled", "g", "")] == at
    assert h.assigner() is None
    keep_alive(h, 4_000, alive=("W1", "W2"))
    assert g.epoch == 2
    keep_alive(h, 1_000, alive=("W1", "W2"))
    assert g.epoch == 3 and g.assignment_epoch == 2 and h.assigner() == "W1"
    assert hb(h, "W1", owned=h.current("W1")[1]).should_compute_assignment is True


def test_scheduled_rebalance_survives_a_restart() -> None:
    h = Harness()
    _with_chosen_w1(h)
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}, delay_ms=5_000)
    at = h.now + 5_000
    h.advance(1_000)
    # The coordinator restarts: a new one loads the log.
    restarted = Harness()
    restarted.coordinator = GroupCoordinator(h.coordinator.config, strict=True)
    for record in h.log:
        restarted.coordinator.replay(record)
    restarted.log = list(h.log)
    restarted.now = h.now
    restarted._epochs = invariant_epochs(restarted.state)
    assert restarted.state.snapshot() == h.state.snapshot()
    loaded = restarted.coordinator.on_loaded(restarted.now)
    restarted.apply(loaded)
    g = restarted.group()
    assert g.scheduled_rebalance_at_ms == at
    assert restarted.timers[("scheduled", "g", "")] == at
    assert restarted.timers[("session", "g", "W1")] == h.now + 10_000
    keep_alive(restarted, 3_000, alive=("W1", "W2"))
    assert g.epoch == 2
    keep_alive(restarted, 1_000, alive=("W1", "W2"))
    assert g.epoch == 3 and restarted.assigner() in ("W1", "W2")


def test_session_timeout_fences_and_removes() -> None:
    h = Harness()
    two_workers(h)
    g = h.group()
    last = h.now
    keep_alive(h, 9_000, alive=("W1",))
    assert "W2" in g.members
    keep_alive(h, 2_000, alive=("W1",))
    assert "W2" not in g.members and g.epoch == 3 and "W2" not in g.target
    assert ("session", "g", "W2") not in h.timers
    assert last + 10_000 <= h.now
    # Held until W2's stop budget (half its rebalance timeout) after its session deadline.
    assert g.owner[item("B")] == "W2" and h.timers[("hold", "g", "W2")] == last + 10_000 + 15_000
    h.compute({"W1": ALL})  # handed on at once (as eager does)
    keep_alive(h, 13_000, alive=("W1",))
    assert g.owner[item("B")] == "W2" and h.current("W1") == (3, ["A", "A/0", "A/1"])
    assert g.current["W1"].state == MemberState.UNRELEASED_ITEMS
    keep_alive(h, 1_000, alive=("W1",))
    assert g.owner[item("B")] == "W1" and h.current("W1") == (3, ALL)
    # A lone member whose session expires leaves an Empty group, epochs caught up.
    keep_alive(h, 11_000, alive=())
    assert g.members == {} and g.state.value == "Empty" and g.assignment_epoch == g.epoch == 4


def test_a_hold_survives_a_restart_and_ends_no_earlier() -> None:
    h = Harness()
    two_workers(h)
    last = h.now
    keep_alive(h, 11_000, alive=("W1",))  # W2's session expires at last + 10 s
    assert "W2" not in h.group().members and h.timers[("hold", "g", "W2")] == last + 25_000
    h.advance(5_000)
    # The coordinator restarts: a new one loads the log (the hold is a record, epoch -3).
    restarted = Harness()
    restarted.coordinator = GroupCoordinator(h.coordinator.config, strict=True)
    for record in h.log:
        restarted.coordinator.replay(record)
    restarted.log = list(h.log)
    restarted.now = h.now
    restarted.apply(restarted.coordinator.on_loaded(restarted.now))
    g = restarted.group()
    assert g.current["W2"].epoch == HELD_EPOCH and g.owner[item("B")] == "W2"
    # Held its whole length again from the load: later than before, never earlier.
    assert restarted.timers[("hold", "g", "W2")] == restarted.now + 15_000
    restarted.compute({"W1": ALL})
    keep_alive(restarted, 14_000, alive=("W1",))
    assert g.owner[item("B")] == "W2" and restarted.current("W1")[1] == ["A", "A/0", "A/1"]
    keep_alive(restarted, 1_000, alive=("W1",))
    assert "W2" not in g.current and restarted.current("W1")[1] == ALL


def test_a_member_that_leaves_is_not_held() -> None:
    # Leaving (-1) says its work is stopped: nothing is held (a static -2 member whose session
    # expires neither: test_static_leave_keeps_work_held_until_session_expiry).
    h = Harness()
    two_workers(h)
    g = h.group()
    assert h.heartbeat("W2", -1).member_epoch == -1
    assert "W2" not in g.current and item("B") not in g.owner
    assert not [k for k in h.timers if k[0] == "hold"]


def test_a_fenced_member_rejoining_keeps_what_it_still_runs_of_its_hold() -> None:
    h = Harness()
    two_workers(h)
    g = h.group()
    assert h.heartbeat("W2", 9, owned=["B", "B/0"]).error_code == E.FENCED_MEMBER_EPOCH
    ends = h.timers[("hold", "g", "W2")]
    h.advance(100)
    r = h.join("W2", owned=["B/0"])  # B stopped; B/0 still stopping
    assert r.error_code == 0 and r.member_id == "W2"
    cur = g.current["W2"]
    assert (cur.epoch, cur.state, names(cur.assigned), names(cur.revoking)) == (
        0, MemberState.UNREVOKED_ITEMS, [], ["B/0"])
    assert g.owner[item("B/0")] == "W2" and item("B") not in g.owner
    assert "W2" not in g.soft.hold_deadline
    # The old hold's timer changes nothing now: W2 is a member again.
    result = h.coordinator.on_timer(("hold", "g", "W2"), ends)
    assert not result.records and g.owner[item("B/0")] == "W2"


def test_rebalance_timeout_while_revoking_fences() -> None:
    h = Harness()
    one_worker(h, rebalance_timeout_ms=5_000)
    h.join("W2", rebalance_timeout_ms=5_000)
    g = h.group()
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)  # asked to revoke B, B/0
    armed_at = h.now
    assert h.timers[("rebalance", "g", "W1")] == armed_at + 5_000
    keep_alive(h, 4_000, alive=("W2",))
    for _ in range(4):  # W1 keeps heartbeating but never stops B
        h.heartbeat("W1", 1, owned=ALL)
    last = h.now
    assert "W1" in g.members
    keep_alive(h, 1_000, alive=("W2",))
    assert "W1" not in g.members and g.epoch == 3
    # W1 may still be stopping B and B/0 (it never said it stopped them): held until its
    # session deadline (its last heartbeat + 10 s) + its stop budget (2.5 s). Only then W2,
    # heartbeating in keep_alive, gets them.
    assert h.timers[("hold", "g", "W1")] == last + 10_000 + 2_500
    keep_alive(h, 11_000, alive=("W2",))
    assert h.current("W2") == (2, []) and g.owner[item("B")] == "W1"
    keep_alive(h, 1_000, alive=("W2",))
    assert h.current("W2") == (2, ["B", "B/0"]) and g.owner[item("B")] == "W2"


def test_rebalance_timer_cancelled_once_the_revocation_is_acknowledged() -> None:
    h = Harness()
    one_worker(h, rebalance_timeout_ms=5_000)
    h.join("W2", rebalance_timeout_ms=5_000)
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)
    assert ("rebalance", "g", "W1") in h.timers
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    assert ("rebalance", "g", "W1") not in h.timers
    keep_alive(h, 8_000, alive=("W1", "W2"))
    assert sorted(h.group().members) == ["W1", "W2"]


# == group states, Dead, connectors =====================================================================


def test_group_states() -> None:
    h = Harness()
    h.alter({"A": 1})
    state = lambda: h.describe().groups[0].group_state  # noqa: E731
    assert state() == "Empty" and h.coordinator.list_groups() == [("g", "Empty")]
    h.join("W1")
    assert state() == "Assigning"
    h.compute({"W1": ["A", "A/0"]})
    assert state() == "Reconciling"
    hb(h, "W1")
    assert state() == "Stable" and h.coordinator.list_groups() == [("g", "Stable")]
    h.alter({"A": 2})  # a connector change with members: epoch bump
    assert state() == "Assigning"
    h.compute({"W1": ["A", "A/0", "A/1"]})
    assert state() == "Reconciling"
    hb(h, "W1", owned=["A", "A/0"])
    assert state() == "Stable"
    h.heartbeat("W1", -1)
    assert state() == "Empty"


def test_empty_group_without_connectors_is_deleted_after_retention() -> None:
    h = Harness(GroupCoordinatorConfig(empty_group_retention_ms=60_000))
    h.join("W1")
    h.advance(1_000)
    assert h.heartbeat("W1", -1).error_code == 0
    left = h.now
    assert h.timers[("expire", "g", "")] == left + 60_000
    h.advance(59_999)
    assert "g" in h.state.groups and h.describe().groups[0].group_state == "Empty"
    h.advance(1)
    assert "g" not in h.state.groups
    d = h.describe().groups[0]
    assert (d.error_code, d.group_state) == (E.GROUP_ID_NOT_FOUND, "Dead")
    assert "does not exist" in d.error_message
    assert h.coordinator.list_groups() == []
    # Every key the group ever wrote ends with a tombstone (nothing is left after compaction).
    assert {type(k).__name__: v for k, v in last_values(h).items() if v is not None} == {}


def test_an_empty_group_with_config_overrides_is_kept_until_they_are_deleted() -> None:
    # As Kafka keeps a group's configs apart from the group: an override set before the
    # workers start, or while they are all away, stays.
    h = Harness(GroupCoordinatorConfig(empty_group_retention_ms=60_000))
    h.join("W1")
    h.apply(h.coordinator.alter_group_config("g", {SESSION_TIMEOUT: "20000"}, h.now))
    assert h.heartbeat("W1", -1).error_code == 0
    h.advance(10 * 60_000)
    assert "g" in h.state.groups and h.coordinator.group_configs("g") == {SESSION_TIMEOUT: "20000"}
    assert h.apply(h.coordinator.alter_group_config("g", {SESSION_TIMEOUT: None}, h.now)) == (0, None)
    assert h.timers[("expire", "g", "")] == h.now + 60_000  # a full retention from the deletion
    h.advance(59_999)
    assert "g" in h.state.groups
    h.advance(1)
    assert "g" not in h.state.groups
    assert {type(k).__name__: v for k, v in last_values(h).items() if v is not None} == {}
    # A group created by a SET alone is kept as well.
    h.apply(h.coordinator.alter_group_config("fresh", {SESSION_TIMEOUT: "20000"}, h.now))
    h.advance(10 * 60_000)
    assert h.coordinator.group_configs("fresh") == {SESSION_TIMEOUT: "20000"}


def test_empty_group_whose_connectors_were_all_deleted_leaves_nothing_behind() -> None:
    h = Harness(GroupCoordinatorConfig(empty_group_retention_ms=60_000))
    h.alter({"A": 1})
    h.alter(deletes=["A"])
    h.advance(60_000)
    assert "g" not in h.state.groups
    assert [type(k).__name__ for k, v in last_values(h).items() if v is not None] == []
    # A reload of the compacted log (only the last record of each key, tombstones dropped) has
    # no trace of the group.
    fresh = CoordinatorState()
    for key, value in last_values(h).items():
        if value is not None:
            fresh.replay((key, value))  # type: ignore[arg-type]
    assert fresh.groups == {}


def test_group_with_connectors_or_a_returning_member_is_not_deleted() -> None:
    h = Harness(GroupCoordinatorConfig(empty_group_retention_ms=60_000))
    h.alter({"A": 1}, group_id="kept")
    h.join("W1")
    h.heartbeat("W1", -1)
    h.advance(30_000)
    h.join("W1")  # back before the retention ends
    keep_alive(h, 40_000, alive=("W1",), step=3_000)  # past the first retention deadline
    assert "g" in h.state.groups and "W1" in h.group().members
    assert h.heartbeat("W1", -1).error_code == 0
    h.advance(59_000)
    assert "g" in h.state.groups
    h.advance(1_000)
    assert "g" not in h.state.groups
    assert "kept" in h.state.groups and h.describe("kept").groups[0].group_state == "Empty"


def test_describe_unknown_and_invalid_group_ids() -> None:
    h = Harness()
    d = h.describe("nope", "").groups
    assert [(x.group_id, x.error_code, x.group_state) for x in d] == [
        ("nope", E.GROUP_ID_NOT_FOUND, "Dead"), ("", E.INVALID_GROUP_ID, "Dead")]


def test_alter_connectors_creates_the_group() -> None:
    h = Harness()
    r = h.alter({"A": 2, "B": 0}, group_id="new", configs={"A": {"k": "v", "n": None}})
    assert r.error_code == 0 and r.group_epoch == 0
    g = h.group("new")
    assert g is not None and g.epoch == 0 and g.state.value == "Empty"
    assert {c.name: (c.task_count, c.config) for c in g.connectors.values()} == {
        "A": (2, (("k", "v"), ("n", None))), "B": (0, ())}
    assert names(g.configured) == ["A", "A/0", "A/1", "B"]
    assert ("new", "Empty") in h.coordinator.list_groups()
    # A no-op request on a new group creates it, writing nothing else.
    r = h.alter({}, group_id="bare")
    assert r.error_code == 0 and h.group("bare").connectors == {}


def test_alter_connectors_update_and_delete_with_members() -> None:
    h = Harness()
    two_workers(h)
    g = h.group()
    # Same spec again: nothing written, no bump.
    before = len(h.log)
    r = h.alter({"A": 2})
    assert r.error_code == 0 and r.group_epoch == 2 and len(h.log) == before
    # A task count change bumps the group epoch.
    r = h.alter({"A": 3})
    assert r.error_code == 0 and r.group_epoch == 3 and g.epoch == 3
    assert item("A/2") in g.configured and h.assigner() == "W1"
    # A config change does too.
    r = h.alter({"A": 3}, configs={"A": {"connector.class": "X"}})
    assert r.group_epoch == 4
    # Deleting B strips it from W2's target at once; W2 must give it up on its next heartbeat.
    r = h.alter(deletes=["B"])
    assert r.error_code == 0 and r.group_epoch == 5
    assert "B" not in g.connectors and h.target("W2") == []
    assert item("B") not in g.target_owner and item("B/0") not in g.target_owner
    assert g.owner[item("B")] == "W2"  # still running it
    r = h.heartbeat("W2", 2, owned=["B", "B/0"])
    assert r.member_epoch == 2 and response_items(r) == []
    assert names(g.current["W2"].revoking) == ["B", "B/0"]
    r = h.heartbeat("W2", 2, owned=[])
    assert r.member_epoch == 2 and item("B") not in g.owner
    assert g.current["W2"].state.label == "Stable"
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["A/2"]})
    assert h.heartbeat("W2", 2, owned=[]).member_epoch == 5


def test_alter_connectors_validate_only_writes_nothing() -> None:
    h = Harness()
    r = h.alter({"A": 1}, group_id="new", validate_only=True)
    assert r.error_code == 0 and h.log == [] and "new" not in h.state.groups
    one_worker(h)
    before = len(h.log)
    r = h.alter({"A": 5, "C": 1}, deletes=["B"], validate_only=True)
    assert r.error_code == 0 and r.group_epoch == 1 and len(h.log) == before
    assert sorted(h.group().connectors) == ["A", "B"] and h.group().connectors["A"].task_count == 2
    r = h.alter(deletes=["nope"], validate_only=True)  # validation still runs
    assert r.error_code == E.INVALID_REQUEST


def _alter_request(upserts: tuple[Any, ...] = (), deletes: tuple[str, ...] = (),
                   group_id: str = "g") -> ConnectGroupAlterConnectorsRequest:
    return ConnectGroupAlterConnectorsRequest(group_id=group_id, upserts=upserts, deletes=deletes,
                                              validate_only=False)


def _spec(name: str, count: int = 1, config: tuple[tuple[str, str | None], ...] = ()) -> Any:
    return _alter.ConnectorSpec(name=name, task_count=count, config=tuple(
        _alter.ConfigEntry(name=k, value=v) for k, v in config))


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (_alter_request((_spec("A"),), group_id=""), "GroupId must be non-empty"),
        (_alter_request((_spec(""),)), "Upserts[].Name must be non-empty"),
        (_alter_request((_spec("a/b"),)), "must not contain '/'"),
        (_alter_request((_spec("A"), _spec("A", 2))), "Connector A is listed twice"),
        (_alter_request((_spec("A", -1),)), "Connector A: TaskCount must be >= 0"),
        (_alter_request((_spec("A", 2**31 - 1),)), "group.connect.max.tasks is 100000"),
        (_alter_request((_spec("A", 1, (("", "v"),)),)), "config names must be non-empty and unique"),
        (_alter_request((_spec("A", 1, (("k", "1"), ("k", "2"))),)),
         "config names must be non-empty and unique"),
        (_alter_request(deletes=("Z",)), "Connector Z does not exist in group g"),
        (_alter_request((_spec("B"),), ("B",)), "Connector B is both upserted and deleted"),
    ],
)
def test_alter_connectors_bad_input(req: ConnectGroupAlterConnectorsRequest, message: str) -> None:
    h = Harness()
    one_worker(h)
    before = (len(h.log), dict(h.group().connectors))
    r = h.apply(h.coordinator.alter_connectors(req, h.now))
    assert r.error_code == E.INVALID_REQUEST and message in r.error_message
    assert (len(h.log), dict(h.group().connectors)) == before


def test_alter_connectors_max_tasks() -> None:
    # Items are connectors plus their tasks; only a change that grows a group past the limit
    # is refused (a group above a lowered limit may still shrink or change its configs).
    h = Harness(GroupCoordinatorConfig(max_tasks=10))
    assert h.alter({"A": 4, "B": 4}).error_code == 0  # 2 + 8 = 10 items
    r = h.apply(h.coordinator.alter_connectors(_alter_request((_spec("C", 0),)), h.now))
    assert r.error_code == E.INVALID_REQUEST
    assert r.error_message == (
        "Group g would have 11 items (connectors plus tasks); group.connect.max.tasks is 10.")
    assert sorted(h.group().connectors) == ["A", "B"]
    r = h.apply(h.coordinator.alter_connectors(_alter_request((_spec("A", 3), _spec("C", 0))), h.now))
    assert r.error_code == 0 and sorted(h.group().connectors) == ["A", "B", "C"]  # 10 again
    h.coordinator.config = GroupCoordinatorConfig(max_tasks=5)  # restarted with a lower limit
    before = len(h.log)
    r = h.apply(h.coordinator.alter_connectors(_alter_request((_spec("A", 3, (("k", "v"),)),)), h.now))
    assert r.error_code == 0 and len(h.log) > before  # configs only: same items
    r = h.apply(h.coordinator.alter_connectors(_alter_request(deletes=("C",)), h.now))
    assert r.error_code == 0  # 9 items: still above 5, but fewer
    r = h.apply(h.coordinator.alter_connectors(_alter_request((_spec("B", 5),)), h.now))
    assert r.error_code == E.INVALID_REQUEST and "group.connect.max.tasks is 5" in r.error_message
    assert {n: c.task_count for n, c in h.group().connectors.items()} == {"A": 3, "B": 4}


def test_describe_and_list_groups() -> None:
    h = Harness()
    h.alter({"A": 2, "B": 1}, configs={"B": {"topics": "t"}})
    h.join("W1", instance_id="i-1", worker_url="http://w1")
    h.compute({"W1": ALL})
    hb(h, "W1")
    h.join("W2")
    hb(h, "W1", owned=ALL)
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)  # W1 revoking B, B/0
    h.alter({"X": 0}, group_id="other")
    resp = h.describe("g", "other")
    d, o = resp.groups
    assert (d.error_code, d.group_id, d.group_state, d.group_epoch, d.assignment_epoch) == (
        0, "g", "Reconciling", 2, 2)
    assert (d.assignor_name, d.assigning_member_id) == ("incremental", None)
    assert [(c.name, c.task_count, [(e.name, e.value) for e in c.config]) for c in d.connectors] == [
        ("A", 2, []), ("B", 1, [("topics", "t")])]
    m = {x.member_id: x for x in d.members}

    def as_items(a: Any) -> list[str]:
        return sorted([*a.connectors, *(f"{t.connector}/{t.task}" for t in a.tasks)])

    w1, w2 = m["W1"], m["W2"]
    assert (w1.instance_id, w1.worker_url, w1.client_id, w1.client_host) == (
        "i-1", "http://w1", "client-W1", "127.0.0.1")
    assert (w1.member_epoch, w1.member_state) == (1, "UnrevokedItems")
    assert as_items(w1.assignment) == ["A", "A/0", "A/1"]
    assert as_items(w1.target_assignment) == ["A", "A/0", "A/1"]
    assert (w2.instance_id, w2.member_epoch, w2.member_state) == (None, 1, "Stable")
    assert as_items(w2.assignment) == [] and as_items(w2.target_assignment) == ["B", "B/0"]
    assert (o.group_id, o.group_state, o.members) == ("other", "Empty", ())
    assert sorted(h.coordinator.list_groups()) == [("g", "Reconciling"), ("other", "Empty")]
    hb(h, "W2", owned=[])
    assert {x.member_id: x.member_state for x in h.describe().groups[0].members}["W2"] == (
        "UnreleasedItems")


# == rollback, replay, records ==========================================================================


def _rollback_cases(h: Harness) -> dict[str, Any]:
    c = h.coordinator
    return {
        "join": lambda: c.heartbeat(ConnectGroupHeartbeatRequest(**{**VALID_JOIN, "member_id": "W3"}),
                                    h.now, RequestContext("c", "h")),
        "leave": lambda: c.heartbeat(ConnectGroupHeartbeatRequest(
            group_id="g", member_id="W2", member_epoch=-1), h.now),
        "revoke": lambda: c.heartbeat(ConnectGroupHeartbeatRequest(
            group_id="g", member_id="W1", member_epoch=2, owned_connectors=("A",),
            owned_tasks=(_hb.TaskId(connector="A", task=0), _hb.TaskId(connector="A", task=1))),
            h.now),
        "alter": lambda: c.alter_connectors(_alter_request((_spec("A", 5), _spec("C", 2)), ("B",)),
                                            h.now),
        "session": lambda: c.on_timer(("session", "g", "W2"), h.now + 60_000),
        "config": lambda: c.alter_group_config("g", {SESSION_TIMEOUT: "20000"}, h.now),
    }


@pytest.mark.parametrize("case", ["join", "leave", "revoke", "alter", "session", "config"])
def test_rollback_restores_the_state(case: str) -> None:
    h = Harness()
    two_workers(h)
    if case == "revoke":
        h.join("W3")
        hb(h, "W1", owned=["A", "A/0", "A/1"])
        h.compute({"W1": ["A"], "W2": ["B", "B/0"], "W3": ["A/0", "A/1"]})
    before = h.state.snapshot()
    result = _rollback_cases(h)[case]()
    assert result.records, "the operation must write something to undo"
    assert h.state.snapshot() != before
    h.coordinator.rollback(result)
    assert h.state.snapshot() == before
    h.check()  # and the state still equals a replay of the (unchanged) log


def test_rollback_of_a_join_does_not_leave_a_stale_chosen_worker() -> None:
    """A join that chose the joining worker (the only one covering the group) is rolled back;
    another worker then joins, reaching the same group epoch. The coordinator must choose among
    the actual members (it used to keep choosing the rolled-back worker: nobody computed)."""
    h = Harness()
    h.alter({"A": 1})
    h.join("W1")
    h.compute({"W1": ["A", "A/0"]})
    hb(h, "W1")
    req = ConnectGroupHeartbeatRequest(**{**VALID_JOIN, "member_id": "W3", "client_assignors": (
        assignor(low=0, high=2),)})
    result = h.coordinator.heartbeat(req, h.now)
    assert result.response.error_code == 0 and h.assigner() == "W3"
    h.coordinator.rollback(result)
    h.check()
    g = h.group()
    assert sorted(g.members) == ["W1"] and g.epoch == 1
    h.join("W4")
    assert g.epoch == 2 and h.assigner() in g.members
    assert h.assigner() == "W1"
    assert hb(h, "W1", owned=["A", "A/0"]).should_compute_assignment is True
    h.compute({"W1": ["A"], "W4": ["A/0"]})
    assert g.assignment_epoch == 2


def test_internal_error_rolls_back_and_answers_unknown_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness()
    one_worker(h)
    c = GroupCoordinator(h.coordinator.config)  # not strict: the daemon's mode
    for record in h.log:
        c.replay(record)
    before = c.state.snapshot()

    def boom(*args: Any, **kwargs: Any) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(c, "_reconcile", boom)  # fails after the join wrote its records
    req = ConnectGroupHeartbeatRequest(**{**VALID_JOIN, "member_id": "W2"})
    result = c.heartbeat(req, 0)
    assert result.response.error_code == E.UNKNOWN_SERVER_ERROR and "boom" in result.response.error_message
    assert result.records == [] and c.state.snapshot() == before


def test_every_logged_record_encodes_and_decodes() -> None:
    h = Harness()
    two_workers(h)
    h.join("S", instance_id="i-1", worker_url="http://s", assignors=(
        assignor("incremental", 0, 1, reason=2, metadata=b"\x00\xffmeta"),))
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    h.compute({"W1": ["A"], "W2": ["B", "B/0"], "S": ["A/0", "A/1"]}, assignor_state=b"st",
              delay_ms=50_000)
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    h.apply(h.coordinator.alter_group_config("g", {HEARTBEAT_INTERVAL: "1000"}, h.now))
    h.alter({"Z": 3}, configs={"Z": {"k": None, "kk": "vv"}})
    h.heartbeat("S", -2, instance_id="i-1")
    h.heartbeat("W2", -1)
    h.join("T", group_id="t")
    h.heartbeat("T", -1, group_id="t")
    h.advance(8 * 24 * 3600 * 1000)
    kinds = {type(k).__name__ for k, _ in h.log}
    assert kinds == {
        "GroupMetadataKey", "GroupConnectorsKey", "GroupMemberKey", "TargetAssignmentMemberKey",
        "TargetAssignmentMetadataKey", "CurrentMemberAssignmentKey", "GroupConfigurationKey"}
    assert any(v is None for _, v in h.log)
    h.check_records_encode()


def test_install_may_hold_items_unassigned_only_with_a_scheduled_rebalance() -> None:
    # An assignor waiting for a departed worker leaves its work unassigned; the coordinator
    # accepts that only together with ScheduledRebalanceDelayMs, so nothing is held forever.
    h = Harness()
    h.alter({"A": 1, "B": 1})
    h.join("W1")
    chosen = h.assigner()
    prepared = h.prepare(chosen)
    held = {"W1": ["A", "A/0"]}
    rejected = h.install(chosen, held, prepared.group_epoch)
    assert rejected.error_code == E.INVALID_ASSIGNMENT
    assert "2 connectors/tasks are not assigned: B, B/0" in rejected.error_message
    accepted = h.install(chosen, held, prepared.group_epoch, delay_ms=5_000)
    assert accepted.error_code == 0
    g = h.group()
    assert (g.assignment_epoch, h.target("W1")) == (prepared.group_epoch, ["A", "A/0"])
    assert g.target_owner.get(item("B")) is None and g.target_owner.get(item("B/0")) is None
    assert h.timers[("scheduled", "g", "")] == h.now + 5_000
    # When the delay passes, the group epoch is bumped and a computation starts.
    h.advance(5_000)
    assert g.epoch == prepared.group_epoch + 1 and h.assigner() == "W1"


# == instance states (Status) ============================================================


def _states(*entries: tuple[str, str] | tuple[str, str, str, str]) -> tuple[Any, ...]:
    out = []
    for e in entries:
        name, state = e[0], e[1]
        connector, _, task = name.partition("/")
        out.append(_hb.InstanceState(connector=connector, task=int(task) if task else -1,
                                     state=state, error_message=e[2] if len(e) > 2 else None,
                                     trace=e[3] if len(e) > 3 else None))
    return tuple(out)


def _described_states(h: Harness, member_id: str) -> dict[str, tuple[str, str | None, str | None]]:
    (g,) = h.describe().groups
    (m,) = [m for m in g.members if m.member_id == member_id]
    return {(s.connector if s.task < 0 else f"{s.connector}/{s.task}"): (s.state, s.error_message, s.trace)
            for s in m.instance_states}


def test_instance_states_are_kept_in_memory_replaced_by_each_report_and_shown_for_owned_items() -> None:
    h = Harness()
    two_workers(h)
    start = len(h.log)
    trace = "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n"
    hb(h, "W1", instance_states=_states(("A", "RUNNING"), ("A/0", "FAILED", "RuntimeError('boom')", trace),
                                        ("A/1", "RESTARTING", "RuntimeError('x')")))
    assert _described_states(h, "W1") == {"A": ("RUNNING", None, None),
                                           "A/0": ("FAILED", "RuntimeError('boom')", trace),
                                           "A/1": ("RESTARTING", "RuntimeError('x')", None)}
    assert _described_states(h, "W2") == {}  # nothing reported
    assert h.log[start:] == []  # memory only: no record
    # An absent report (the steady heartbeat) keeps them; a new one replaces them all.
    hb(h, "W1")
    assert _described_states(h, "W1")["A/0"][0] == "FAILED"
    hb(h, "W1", instance_states=_states(("A", "RUNNING"), ("A/0", "RUNNING"), ("A/1", "RUNNING")))
    assert {k: v[0] for k, v in _described_states(h, "W1").items()} == {
        "A": "RUNNING", "A/0": "RUNNING", "A/1": "RUNNING"}
    # A state of an item the member does not own is not shown.
    hb(h, "W2", instance_states=_states(("B", "RUNNING"), ("A/0", "FAILED")))
    assert _described_states(h, "W2") == {"B": ("RUNNING", None, None)}
    # A trace longer than 8 KiB is cut.
    hb(h, "W2", instance_states=_states(("B", "FAILED", "e", "x" * 20_000)))
    assert len(_described_states(h, "W2")["B"][2] or "") == 8192
    assert h.log[start:] == []


def test_instance_states_go_with_the_member_and_a_rejoin_starts_from_nothing() -> None:
    h = Harness()
    two_workers(h)
    hb(h, "W1", instance_states=_states(("A", "FAILED", "e")))
    hb(h, "W2", instance_states=_states(("B", "FAILED", "e")))
    g = h.group()
    assert set(g.soft.instance_states) == {"W1", "W2"}
    r = h.heartbeat("W2", -1)  # leaves
    assert r.error_code == 0
    assert set(g.soft.instance_states) == {"W1"}
    (desc,) = h.describe().groups
    assert [m.member_id for m in desc.members] == ["W1"]
    # A rejoin (epoch 0, as after a fence) forgets the old report; the join's own report counts.
    r = h.join("W1", owned=["A", "A/0", "A/1"], assignors=wire_assignors(h, "W1"))
    assert r.error_code == 0
    assert "W1" not in g.soft.instance_states
    r = h.join("W1", owned=["A", "A/0", "A/1"], assignors=wire_assignors(h, "W1"),
               instance_states=_states(("A", "RUNNING")))
    assert r.error_code == 0
    assert g.soft.instance_states["W1"] == {item("A"): ("RUNNING", None, None)}


def test_instance_states_go_when_the_session_expires() -> None:
    h = Harness()
    two_workers(h)
    hb(h, "W2", instance_states=_states(("B", "FAILED", "e")))
    keep_alive(h, 60_000, alive=("W1",))
    g = h.group()
    assert "W2" not in g.members and "W2" not in g.soft.instance_states


def test_a_state_report_is_not_answered_by_the_steady_fast_path() -> None:
    h = Harness()
    two_workers(h)
    cur = h.group().current["W1"]
    req = ConnectGroupHeartbeatRequest(group_id="g", member_id="W1", member_epoch=cur.epoch,
                                       instance_states=_states(("A", "FAILED", "e")))
    assert h.coordinator.steady_heartbeat(req, h.now, RequestContext(client_id="client-W1",
                                                                      client_host="127.0.0.1")) is None
    plain = ConnectGroupHeartbeatRequest(group_id="g", member_id="W1", member_epoch=cur.epoch)
    assert h.coordinator.steady_heartbeat(plain, h.now, RequestContext(client_id="client-W1",
                                                                        client_host="127.0.0.1")) is not None


# == what one member may make the coordinator keep ================================================


def test_reports_longer_than_the_group_and_the_member_can_hold_are_refused_or_ignored() -> None:
    h = Harness()
    two_workers(h)  # 5 items; W1 owns 3
    g = h.group()
    hb(h, "W1", instance_states=_states(("A", "FAILED", "e")))
    start = len(h.log)
    cur = g.current["W1"]
    kept = (g.soft.reported_owned["W1"], g.soft.instance_states["W1"])
    # 5 + 3 entries: still what a worker may name (e.g. a rejoin racing deletes)
    r = h.heartbeat("W1", cur.epoch, owned=["A", "A/0", "A/1"] + [f"X/{i}" for i in range(5)])
    assert r.error_code == 0
    # More: a member's report is no evidence (as if it carried nothing), never refused: an
    # honest worker can name more (test_a_worker_racing_the_delete_of_what_it_starts_...).
    r = h.heartbeat("W1", cur.epoch, owned=["A", "A/0"] + [f"X/{i}" for i in range(7)],
                    instance_states=_states(*((f"X/{i}", "RUNNING") for i in range(9))))
    assert r.error_code == 0
    r = h.heartbeat("W1", cur.epoch, instance_states=_states(*((f"X/{i}", "RUNNING") for i in range(9))))
    assert r.error_code == 0
    assert (g.soft.reported_owned["W1"], g.soft.instance_states["W1"]) == kept
    # A join (no worker names anything it runs then beyond what its instance held) is refused.
    r = h.join("W8", owned=[f"X/{i}" for i in range(6)])
    assert r.error_code == E.INVALID_REQUEST
    assert r.error_message == ("OwnedConnectors and OwnedTasks name 6 items; group g configures 5 "
                               "and the member owns 0.")
    r = h.join("W8", instance_states=_states(*((f"X/{i}", "RUNNING") for i in range(6))))
    assert r.error_code == E.INVALID_REQUEST
    assert r.error_message == ("InstanceStates has 6 entries; group g configures 5 items and the "
                               "member owns 0.")
    # A new member of a group it does not know yet may name nothing it runs.
    r = h.join("W9", group_id="other", owned=["A"])
    assert (r.error_code, h.group("other")) == (E.INVALID_REQUEST, None)
    assert h.log[start:] == [] and h.current("W1") == (2, ["A", "A/0", "A/1"])
    assert "W1" in g.members and "W8" not in g.members  # not fenced
    # A member the group no longer knows is told so (it rejoins), whatever it reports.
    r = h.heartbeat("W7", 3, owned=[f"X/{i}" for i in range(20)])
    assert r.error_code == E.UNKNOWN_MEMBER_ID


def test_only_the_members_own_items_are_kept_of_its_reports() -> None:
    h = Harness()
    two_workers(h)
    g = h.group()
    # W2 names W1's items and items of no connector: only its own are kept.
    hb(h, "W2", owned=["B", "B/0", "A/0", "Z", "Z/3"],
       instance_states=_states(("B", "RUNNING"), ("A/0", "FAILED", "e"), ("Z/3", "FAILED", "e")))
    assert g.soft.reported_owned["W2"] == (frozenset(items(["B"])), frozenset(items(["B/0"])))
    assert g.soft.instance_states["W2"] == {item("B"): ("RUNNING", None, None)}
    assert h.current("W1") == (2, ["A", "A/0", "A/1"])


def test_a_worker_still_reporting_a_task_just_deleted_is_not_fenced() -> None:
    h = Harness()
    two_workers(h)
    assert h.alter({"A": 1}).error_code == 0  # A/1 is gone while W1 still runs it
    cur = h.group().current["W1"]
    r = h.heartbeat("W1", cur.epoch, owned=["A", "A/0", "A/1"],
                    instance_states=_states(("A", "RUNNING"), ("A/1", "RUNNING")))
    assert r.error_code == 0 and "W1" in h.group().members
    r = h.heartbeat("W1", r.member_epoch, owned=["A", "A/0"])
    assert r.error_code == 0
    assert h.group().soft.reported_owned["W1"] == (frozenset(items(["A"])), frozenset(items(["A/0"])))


@pytest.mark.parametrize("entry, message", [
    (("A", "UNASSIGNED"), "InstanceStates A: State 'UNASSIGNED' is not one of FAILED, PAUSED, "
                          "RESTARTING, RUNNING, STOPPED."),
    (("A", ""), "InstanceStates A: State '' is not one of FAILED, PAUSED, RESTARTING, RUNNING, "
                "STOPPED."),
    (("/0", "RUNNING"), "InstanceStates must not contain an empty connector name."),
    (("A/-2", "RUNNING"), "InstanceStates must not contain a negative task id (A/-2)."),
])
def test_an_instance_state_the_protocol_does_not_define_is_refused(entry: Any, message: str) -> None:
    h = Harness()
    two_workers(h)
    start = len(h.log)
    r = h.heartbeat("W1", h.group().current["W1"].epoch, instance_states=_states(entry))
    assert (r.error_code, r.error_message) == (E.INVALID_REQUEST, message)
    assert "W1" not in h.group().soft.instance_states and h.log[start:] == []


def test_error_and_trace_keep_their_last_8_kib_of_utf8_on_a_character_boundary() -> None:
    h = Harness()
    two_workers(h)
    trace = "Traceback (most recent call last):\n" + "\u00e9\u20ac" * 5_000 + "\nRuntimeError: the end\n"
    error = "\U0001f600" * 3_000 + "last words"
    hb(h, "W2", instance_states=_states(("B", "FAILED", error, trace)))
    _, kept_error, kept_trace = _described_states(h, "W2")["B"]
    for kept, whole in ((kept_error, error), (kept_trace, trace)):
        assert kept is not None and len(kept.encode()) <= 8192
        assert kept.startswith("...(truncated)\n")
        body = kept[len("...(truncated)\n"):]
        assert whole.endswith(body) and len(body.encode()) > 8192 - 20
    assert kept_trace.endswith("RuntimeError: the end\n")
    # 2,100 characters of 4 bytes: within 8 KiB of characters, 8,400 bytes: cut.
    hb(h, "W2", instance_states=_states(("B", "FAILED", "\U0001f600" * 2_100)))
    assert len(_described_states(h, "W2")["B"][1].encode()) <= 8192


def test_a_member_describing_itself_with_more_than_16_kib_is_refused() -> None:
    h = Harness()
    h.alter({"A": 1})
    big = (assignor(metadata=b"x" * 16_384),)
    r = h.join("W1", assignors=big)
    assert r.error_code == E.INVALID_REQUEST
    assert r.error_message.startswith("ClientAssignors, WorkerUrl and InstanceId take 16,")
    assert h.join("W1", assignors=(assignor(metadata=b"x" * 8_000),),
                  worker_url="http://w1:8083").error_code == 0
    for url in ("http://" + "w" * 17_000,
                "http://" + "\u00e9" * 8_200):  # 8,207 characters, 16,407 bytes
        r = h.join("W1", worker_url=url)
        assert r.error_code == E.INVALID_REQUEST, r
        assert r.error_message.startswith("ClientAssignors, WorkerUrl and InstanceId take ")
        assert h.group().members["W1"].worker_url == "http://w1:8083"
    assert h.join("W1", worker_url="http://" + "\u00e9" * 8_000).error_code == 0


def test_the_default_group_size_is_finite_with_kafkas_error_past_it() -> None:
    assert GroupCoordinatorConfig().max_size == 1_000
    h = Harness(GroupCoordinatorConfig(max_size=3))
    for m in ("W1", "W2", "W3"):
        assert h.join(m).error_code == 0
    r = h.join("W4")
    assert (r.error_code, r.error_message) == (
        E.GROUP_MAX_SIZE_REACHED, "Group g has reached its maximum size (3 members).")
    assert h.join("W1").error_code == 0  # a member already in the group may rejoin


def test_a_worker_racing_the_delete_of_what_it_starts_is_never_refused() -> None:
    """The worker's own state machine (worker_client.membership) against the coordinator, with
    the worker's messages exactly as it sends them. It starts its assignment of connector A
    (1 + 40 tasks); meanwhile a heartbeat fails (a timeout, a reconnect), so its next one is a
    full report, of what runs so far: nothing. A is deleted before that report arrives, so the
    coordinator takes it as the worker having dropped A already and hands it no revocation.
    When the report's answer comes, A runs: the worker revokes it, reporting the 41 items (and
    their states) it still runs meanwhile. That report names more than the group configures (0)
    plus what the coordinator thinks the member owns (0), but it is honest: refusing it ended the
    worker (INVALID_REQUEST is fatal to it: exit 1)."""
    from worker_client.membership import Assign, AssignorAd, Compute, Fatal, Membership, Revoke

    h = Harness()
    assert h.alter({"A": 40}).error_code == 0
    m = Membership(group_id="g", assignors=(AssignorAd("incremental", 0, 1),))
    m.join(h.now)

    def beat(**kw: Any) -> list[Any]:
        m.instance_states = {i: ("RUNNING", None, None) for i in running}
        req = m.heartbeat_request(h.now, **kw)
        return m.on_response(h.apply(h.coordinator.heartbeat(req, h.now)), h.now)

    running: frozenset[Any] = frozenset()
    assert any(isinstance(a, Compute) for a in beat())
    everything = names(h.group().configured)
    h.compute({m.member_id: everything})
    (assign,) = beat()
    assert isinstance(assign, Assign) and len(assign.items) == 41
    # The worker starts A (its instances exist now); a keepalive meanwhile gets no answer.
    running = assign.items
    m.on_failure(h.now, 100)
    h.advance(100)
    assert h.alter(deletes=["A"]).error_code == 0  # the administrator deletes A meanwhile
    req = m.heartbeat_request(h.now, keepalive=True)  # full: owned [] (A not started yet)
    answer = h.apply(h.coordinator.heartbeat(req, h.now))
    assert answer.error_code == 0 and h.current(m.member_id)[1] == []
    m.assigned_started(assign.items, h.now)  # ...the start completes before the answer arrives
    actions = m.on_response(answer, h.now)
    assert Revoke(assign.items) in actions
    # While it stops A, it reports what runs.
    actions = beat(keepalive=True)
    assert not any(isinstance(a, Fatal) for a in actions), actions
    assert m.member_id in h.group().members
    m.revoked(assign.items, h.now)
    running = frozenset()
    assert not any(isinstance(a, Fatal) for a in beat())
    assert m.member_id in h.group().members and m.owned == frozenset()


def test_a_join_that_could_not_be_logged_leaves_no_soft_state_behind() -> None:
    """The runtime undoes a handler's records when its log write fails (a full disk, a record
    that cannot be encoded); the soft state the join kept of its member went too: every such
    join of a new member id used to stay in memory (its session, owned lists and states)."""
    h = Harness()
    two_workers(h)
    g = h.group()
    before = {k: dict(v) if isinstance(v, dict) else v for k, v in vars(g.soft).items()
              if k in ("session_deadline", "reported_owned", "instance_states", "dirty")}
    for i in range(3):
        req = ConnectGroupHeartbeatRequest(
            group_id="g", member_id=f"ghost-{i}", member_epoch=0, rebalance_timeout_ms=30_000,
            client_assignors=(assignor(),), owned_connectors=(), owned_tasks=(),
            instance_states=_states(("A", "RUNNING")))
        result = h.coordinator.heartbeat(req, h.now)
        assert result.response.error_code == 0 and result.records
        h.coordinator.rollback(result)  # (what the runtime does when the append fails)
    after = {k: v for k, v in vars(g.soft).items() if k in before}
    assert after == before
    assert set(g.members) == {"W1", "W2"}
    hb(h, "W1", owned=["A", "A/0", "A/1"])  # the members go on


def test_a_long_client_id_is_kept_cut_and_the_fast_path_still_serves_it() -> None:
    """A request header's ClientId may take 32 KiB; a member record (and its events) keeps at
    most MAX_CLIENT_ID_BYTES of it, cut on a character boundary, and a steady member sending
    the same long id stays on the fast path (the cut equals what was stored)."""
    from coordinator.group.validation import MAX_CLIENT_ID_BYTES

    h = Harness()
    two_workers(h)
    long_id = "é" * 16_000  # 32,000 bytes of UTF-8
    assert h.heartbeat("W1", 2, client_id=long_id).error_code == 0
    kept = h.coordinator.state.groups["g"].members["W1"].client_id
    assert kept == "é" * (MAX_CLIENT_ID_BYTES // 2)
    hits = h.steady_hits
    assert h.heartbeat("W1", 2, client_id=long_id).error_code == 0
    assert h.steady_hits == hits + 1
    assert h.heartbeat("W1", 2, client_id="short").error_code == 0
    assert h.coordinator.state.groups["g"].members["W1"].client_id == "short"
