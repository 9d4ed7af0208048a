"""Group events ("Operators are blind"): the pure state machine returns what happened
to a group as GroupEvent values in its Result, with the group, the member's id, instance id and
epoch and the group's epochs; the runtime logs them once committed (tests/test_shard_events.py,
tests/test_daemon_events_e2e.py). A steady heartbeat returns none (the harness checks that on
every heartbeat the fast path would answer)."""

from __future__ import annotations

from typing import Any

from connect_wire.errors import ErrorCode as E
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import FENCE_REASONS
from tests.group_harness import Harness
from tests.test_group_coordinator import ALL, _static_setup, hb, keep_alive, one_worker, two_workers


def events(h: Harness, name: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    out = [(e.event, e.fields) for e in h.events if name is None or e.event == name]
    assert all(e.group == "g" for e in h.events)
    return out


def only(h: Harness, name: str) -> dict[str, Any]:
    found = events(h, name)
    assert len(found) == 1, (name, [e for e, _ in events(h)])
    return found[0][1]


def test_joins_bumps_computations_installs_and_completed_rebalances() -> None:
    h = Harness()
    two_workers(h)
    assert [e for e, _ in events(h)] == [
        "member joined", "group epoch bumped", "assigner chosen", "assignment computing",
        "target assignment installed", "rebalance completed",
        "member joined", "group epoch bumped", "assigner chosen", "assignment computing",
        "target assignment installed", "rebalance completed",
    ]
    joined = events(h, "member joined")[1][1]
    assert joined["member_id"] == "W2" and joined["member_epoch"] == 0
    assert joined["instance_id"] is None and joined["assignors"] == ["incremental"]
    assert joined["group_epoch"] == 1 and joined["client_id"] == "client-W2"
    bump = events(h, "group epoch bumped")[1][1]
    assert (bump["reason"], bump["previous_group_epoch"], bump["group_epoch"], bump["member_id"]) == (
        "member_joined", 1, 2, "W2")
    chosen = events(h, "assigner chosen")[1][1]
    assert (chosen["member_id"], chosen["assignor"], chosen["member_epoch"]) == ("W1", "incremental", 1)
    installed = events(h, "target assignment installed")[1][1]
    assert installed["member_id"] == "W1" and installed["assignor"] == "incremental"
    assert installed["assignment_epoch"] == 2 and installed["items"] == 5
    assert installed["changed_members"] == 2 and installed["unassigned"] == 0
    assert installed["compute_ms"] == 0 and installed["since_chosen_ms"] == 0
    done = events(h, "rebalance completed")[1][1]
    assert done["group_epoch"] == done["assignment_epoch"] == 2 and done["members"] == 2


def test_a_steady_group_is_silent() -> None:
    h = Harness()
    two_workers(h)
    h.events.clear()
    for _ in range(5):
        h.advance(1_000)
        for member in ("W1", "W2"):  # (every optional field null: the fast path's kind)
            assert h.heartbeat(member, 2).error_code == 0
    assert h.steady_hits == 10
    keep_alive(h, 5_000, alive=("W1", "W2"))  # full reports of an unchanged assignment
    assert events(h) == []


def test_durations_are_measured_on_the_coordinators_clock() -> None:
    h = Harness()
    one_worker(h)
    h.events.clear()
    assert h.join("W2").error_code == 0
    h.advance(700)
    chosen = h.assigner()
    prepared = h.prepare(chosen)
    h.advance(250)
    assert h.install(chosen, {"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]},
                     prepared.group_epoch).error_code == 0
    installed = only(h, "target assignment installed")
    assert (installed["compute_ms"], installed["since_chosen_ms"]) == (250, 950)
    assert only(h, "assignment computing")["waited_ms"] == 700
    h.advance(100)
    hb(h, "W1", owned=ALL)  # revokes B, B/0
    h.advance(100)
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    hb(h, "W2", owned=[])
    assert only(h, "rebalance completed")["duration_ms"] == 1_150



def test_a_fence_names_the_session_timeout_the_member_was_given_not_a_later_group_config() -> None:
    # W2 last heartbeat under the 10 s default; the group's session timeout is then shortened
    # to 2 s (it applies from each member's next heartbeat, so W2 keeps its 10 s). The fence
    # said session_timeout_ms=2000 and silent_ms=2000 after 10 s of silence.
    h = Harness()
    two_workers(h)
    h.events.clear()
    h.apply(h.coordinator.alter_group_config(
        "g", {"connect.session.timeout.ms": "2000", "connect.heartbeat.interval.ms": "500"},
        h.now))
    keep_alive(h, 11_000, alive=("W1",), step=500)
    fenced = only(h, "member fenced")
    assert fenced["member_id"] == "W2" and fenced["reason"] == "session_expired"
    assert (fenced["session_timeout_ms"], fenced["silent_ms"]) == (10_000, 10_000)

def test_session_expiry_fences_holds_and_the_hold_ends() -> None:
    h = Harness()
    two_workers(h)
    h.events.clear()
    last = h.now
    keep_alive(h, 11_000, alive=("W1",))
    fenced = only(h, "member fenced")
    assert fenced["reason"] == "session_expired" and fenced["member_id"] == "W2"
    assert fenced["member_epoch"] == 2 and fenced["static_leave"] is False
    assert fenced["session_timeout_ms"] == 10_000 and fenced["silent_ms"] == 10_000
    hold = only(h, "hold started")
    assert hold["member_id"] == "W2" and hold["items"] == 2 and hold["names"] == ["B", "B/0"]
    assert hold["until_ms"] == last + 10_000 + 15_000 and hold["hold_ms"] == 15_000
    bump = only(h, "group epoch bumped")
    assert (bump["reason"], bump["member_id"], bump["member_epoch"], bump["group_epoch"]) == (
        "member_fenced", "W2", 2, 3)
    names = [e for e, _ in events(h)]
    assert names.index("member fenced") < names.index("hold started") < names.index(
        "group epoch bumped")
    h.events.clear()
    h.compute({"W1": ALL})
    keep_alive(h, 15_000, alive=("W1",))
    ended = only(h, "hold ended")
    assert (ended["member_id"], ended["reason"], ended["items"]) == ("W2", "expired", 2)
    done = only(h, "rebalance completed")
    assert done["started_group_epoch"] == 3 and done["duration_ms"] == 15_000


def test_a_stale_epoch_fence_says_which_epochs() -> None:
    h = Harness()
    two_workers(h)
    h.events.clear()
    assert h.heartbeat("W2", 9, owned=["B", "B/0"]).error_code == E.FENCED_MEMBER_EPOCH
    fenced = only(h, "member fenced")
    assert (fenced["reason"], fenced["request_member_epoch"], fenced["member_epoch"]) == (
        "stale_member_epoch", 9, 2)
    assert only(h, "hold started")["items"] == 2
    h.events.clear()
    h.advance(100)
    assert h.join("W2", owned=["B/0"]).error_code == 0  # takes its hold back
    ended = only(h, "hold ended")
    assert (ended["reason"], ended["items"], ended["still_running"]) == ("member_rejoined", 2, 1)
    assert only(h, "member joined")["reports_running"] == 1


def test_a_member_that_does_not_revoke_in_time_is_fenced() -> None:
    h = Harness()
    one_worker(h, rebalance_timeout_ms=5_000)
    h.join("W2", rebalance_timeout_ms=5_000)
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)
    h.events.clear()
    for _ in range(6):
        h.advance(1_000)
        h.heartbeat("W1", 1, owned=ALL)
        hb(h, "W2", owned=[])
    fenced = only(h, "member fenced")
    assert (fenced["reason"], fenced["member_id"], fenced["revoking"],
            fenced["rebalance_timeout_ms"]) == ("rebalance_timeout", "W1", 2, 5_000)
    assert set(FENCE_REASONS) == {"session_expired", "stale_member_epoch", "rebalance_timeout",
                                  "classic_join_timeout", "classic_sync_timeout", "replaced"}


def test_leaves_dynamic_and_static() -> None:
    h = Harness()
    _static_setup(h)
    h.events.clear()
    assert h.heartbeat("S", -2, instance_id="i-1").error_code == 0
    left = only(h, "member left")
    assert (left["static"], left["member_id"], left["instance_id"], left["previous_member_epoch"],
            left["kept"]) == (True, "S", "i-1", 2, 2)
    assert events(h, "group epoch bumped") == []  # its work waits for it
    h.events.clear()
    keep_alive(h, 11_000, alive=("W1",))
    fenced = only(h, "member fenced")
    assert (fenced["reason"], fenced["static_leave"], fenced["instance_id"]) == (
        "session_expired", True, "i-1")
    assert events(h, "hold started") == []  # a static leave stopped its work first
    h.events.clear()
    assert h.heartbeat("W1", -1).error_code == 0
    left = only(h, "member left")
    assert (left["static"], left["released"], left["member_epoch"]) == (False, 3, 2)
    assert only(h, "group epoch bumped")["reason"] == "member_left"


def test_a_static_member_replaced_by_a_new_member_id() -> None:
    h = Harness()
    _static_setup(h)
    assert h.heartbeat("S", -2, instance_id="i-1").error_code == 0
    h.events.clear()
    h.advance(2_000)
    assert h.join("S-new", instance_id="i-1").error_code == 0
    joined = only(h, "member joined")
    assert (joined["member_id"], joined["instance_id"], joined["replaced_member_id"],
            joined["took_over"]) == ("S-new", "i-1", "S", 2)


def test_a_computation_that_times_out_is_given_to_another_member() -> None:
    h = Harness(GroupCoordinatorConfig())
    two_workers(h)
    h.events.clear()
    h.alter({"A": 3, "B": 1})  # a new task: a new computation
    assert only(h, "group epoch bumped")["reason"] == "connectors_changed"
    chosen = only(h, "assigner chosen")["member_id"]
    h.events.clear()
    keep_alive(h, 31_000, alive=("W1", "W2"))  # told at once, never prepares
    timed_out = only(h, "assignment computation timed out")
    assert timed_out["member_id"] == chosen and timed_out["prepared"] is False
    assert timed_out["waited_ms"] == 31_000
    again = only(h, "assigner chosen")
    assert again["previous_assigner"] == chosen and again["member_id"] != chosen


def test_an_assignor_that_fails_is_logged_with_its_error() -> None:
    h = Harness()
    one_worker(h)
    h.join("W2")
    h.events.clear()
    chosen = h.assigner()
    prepared = h.prepare(chosen)
    assert h.install(chosen, {}, prepared.group_epoch, error=E.UNKNOWN_SERVER_ERROR).error_code == 0
    failed = only(h, "assignor failed")
    assert failed["member_id"] == chosen and failed["error"] == "UNKNOWN_SERVER_ERROR"
    assert events(h, "target assignment installed") == []


def test_an_expired_empty_group_is_deleted() -> None:
    h = Harness(GroupCoordinatorConfig(empty_group_retention_ms=60_000))
    assert h.alter(group_id="g").error_code == 0
    h.advance(61_000)
    assert only(h, "group deleted")["empty_ms"] == 60_000


def test_a_rejected_request_that_changed_nothing_says_nothing() -> None:
    h = Harness()
    _static_setup(h)
    h.events.clear()
    assert h.join("S-new", instance_id="i-1").error_code == E.UNRELEASED_INSTANCE_ID
    assert h.heartbeat("nobody", 3).error_code == E.UNKNOWN_MEMBER_ID
    assert events(h) == []
