"""What describe tells an operator that the group state alone does not: each member's last
heartbeat age (so a dead worker's instances can be told from live ones before its session
ends) and the items an install leaves unassigned for a departed member until the scheduled
rebalance (for whom, until when). Sans-IO: describe is given the wall clock."""

from __future__ import annotations

from typing import Any

from connect_wire import connectors as shared
from connect_wire.errors import ErrorCode as E
from connect_wire.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest
from coordinator.group.config import GROUP_HEARTBEAT_INTERVAL, GROUP_SESSION_TIMEOUT
from coordinator.group.coordinator import GroupCoordinator, RequestContext, Result
from coordinator.group.model import KeptFor
from coordinator.group.state import CoordinatorState
from tests.group_harness import Harness, items
from tests.test_group_coordinator import _static_setup, hb, keep_alive, one_worker


def _member(h: Harness, member_id: str, now_ms: int | None = None) -> Any:
    (g,) = h.describe(now_ms=now_ms).groups
    return next(m for m in g.members if m.member_id == member_id)


def test_describe_gives_each_members_last_heartbeat_age() -> None:
    h = Harness()
    one_worker(h)
    joined = h.now
    (g,) = h.describe().groups
    assert (g.heartbeat_interval_ms, g.session_timeout_ms) == (3_000, 10_000)  # the defaults
    assert _member(h, "W1").last_heartbeat_ms_ago == 0
    h.advance(2_500)
    assert _member(h, "W1").last_heartbeat_ms_ago == 2_500
    assert _member(h, "W1", now_ms=joined + 7_000).last_heartbeat_ms_ago == 7_000
    assert _member(h, "W1", now_ms=-1).last_heartbeat_ms_ago == -1  # no clock given: unknown
    # A steady heartbeat (the fast path the daemon answers without the full handler) counts.
    hb(h, "W1", owned=["A", "A/0", "A/1", "B", "B/0"])
    assert _member(h, "W1").last_heartbeat_ms_ago == 0
    h.advance(700)
    steady = h.coordinator.steady_heartbeat(ConnectGroupHeartbeatRequest(
        group_id="g", member_id="W1", member_epoch=1), h.now, RequestContext(
        client_id="client-W1", client_host="127.0.0.1"))
    assert steady is not None
    h.apply(Result(steady[0], [], [steady[1]], set(), [], []))
    assert _member(h, "W1").last_heartbeat_ms_ago == 0
    h.advance(4_200)
    m = _member(h, "W1")
    (g,) = h.describe().groups
    assert m.last_heartbeat_ms_ago == 4_200
    # Overdue: past the interval plus the margin (3 s + 1 s), not before.
    assert shared.heartbeat_overdue(g, m)
    assert not shared.heartbeat_overdue(g, _member(h, "W1", now_ms=h.now - 300))


def test_a_group_configured_interval_is_what_describe_gives() -> None:
    h = Harness()
    one_worker(h)
    g = h.group()
    g.configs = {GROUP_HEARTBEAT_INTERVAL: "500", GROUP_SESSION_TIMEOUT: "6000"}
    (d,) = h.describe().groups
    assert (d.heartbeat_interval_ms, d.session_timeout_ms) == (500, 6_000)


def test_after_a_load_the_age_is_unknown_until_the_member_heartbeats() -> None:
    h = Harness()
    one_worker(h)
    fresh = GroupCoordinator(strict=True)
    fresh.state = CoordinatorState()
    for record in h.log:
        fresh.state.replay(record)
    fresh.on_loaded(h.now + 1_000)
    (g,) = fresh.describe(ConnectGroupDescribeRequest(group_ids=("g",)), h.now + 1_500).groups
    (m,) = g.members
    assert m.last_heartbeat_ms_ago == -1 and not shared.heartbeat_overdue(g, m)


def test_a_departed_member_is_forgotten() -> None:
    h = Harness()
    one_worker(h)
    assert h.heartbeat("W1", -1).error_code == 0
    assert "W1" not in h.group().soft.last_heartbeat


def _fenced_static_member_kept(h: Harness, delay_ms: int) -> int:
    """S (instance i-1, running B and B/0) dies: its session expires, its items are held,
    and W1's install keeps them for S until the scheduled rebalance. Returns when that is."""
    _static_setup(h)
    keep_alive(h, 11_000, alive=("W1",))  # S is silent: fenced when its session ends
    assert "S" not in h.group().members
    chosen = h.assigner()
    assert chosen == "W1"
    prepared = h.prepare(chosen)
    r = h.install(chosen, {"W1": ["A", "A/0", "A/1"]}, prepared.group_epoch, delay_ms=delay_ms,
                  kept_for={"S": ("i-1", ["B", "B/0"])})
    assert r.error_code == 0, r
    return h.now + delay_ms


def test_items_kept_for_a_fenced_member_show_with_whom_and_until_when() -> None:
    h = Harness()
    until = _fenced_static_member_kept(h, delay_ms=60_000)
    assert h.group().kept_for == (KeptFor("S", "i-1", items(["B", "B/0"])),)
    (g,) = h.describe().groups
    (k,) = g.kept_for
    assert (k.member_id, k.instance_id, k.until_ms) == ("S", "i-1", until)
    assert shared.items(k.items) == ["B", "B/0"]
    # While its hold lasts the items are HELD for S (nobody runs them), and kept after that.
    assert [x.member_id for x in g.holds] == ["S"]
    st = shared.status(g, "B")
    assert st["state"] == "HELD" and st["member_id"] == "S"
    assert st["kept_for"] == {"member_id": "S", "instance_id": "i-1", "until_ms": until}
    hold_end = h.group().soft.hold_deadline["S"]
    assert hold_end < until
    keep_alive(h, hold_end - h.now + 1_000, alive=("W1",))
    (g,) = h.describe().groups
    assert not g.holds
    st = shared.status(g, "B")
    # The hold ended: unassigned (as Kafka Connect says), and why.
    assert st["state"] == "UNASSIGNED" and st["member_id"] is None
    assert st["kept_for"] == {"member_id": "S", "instance_id": "i-1", "until_ms": until}
    assert st["tasks"][0]["kept_for"] == st["kept_for"]
    a = shared.status(g, "A")
    assert a["kept_for"] is None and not a["worker_heartbeat_overdue"]
    # It survives a load (the target metadata record carries it).
    fresh = CoordinatorState()
    for record in h.log:
        fresh.replay(record)
    assert fresh.groups["g"].kept_for == h.group().kept_for
    # The scheduled rebalance: the next install gives them out; nothing is kept any more.
    keep_alive(h, until - h.now, alive=("W1",))
    prepared = h.prepare("W1")
    assert h.install("W1", {"W1": ["A", "A/0", "A/1", "B", "B/0"]},
                     prepared.group_epoch).error_code == 0
    (g,) = h.describe().groups
    assert g.kept_for == () and h.group().kept_for == ()


def test_a_member_that_comes_back_gets_its_kept_items_shown_as_its_own() -> None:
    h = Harness()
    _fenced_static_member_kept(h, delay_ms=60_000)
    hold_end = h.group().soft.hold_deadline["S"]
    keep_alive(h, hold_end - h.now + 1_000, alive=("W1",))
    assert h.join("S2", instance_id="i-1").error_code == 0
    prepared = h.prepare("W1")
    assert h.install("W1", {"W1": ["A", "A/0", "A/1"], "S2": ["B", "B/0"]},
                     prepared.group_epoch).error_code == 0
    (g,) = h.describe().groups
    assert g.kept_for == ()  # in a target again: no longer kept


def test_the_overdue_owner_marks_its_instances() -> None:
    h = Harness()
    _static_setup(h)
    keep_alive(h, 5_000, alive=("W1",))  # S silent 5 s: overdue, still a member
    (g,) = h.describe().groups
    st = shared.status(g, "B")
    assert st["member_id"] == "S" and st["worker_heartbeat_overdue"]
    assert st["worker_last_heartbeat_ms_ago"] == 5_000
    assert all(t["worker_heartbeat_overdue"] for t in st["tasks"])
    a = shared.status(g, "A")
    assert a["member_id"] == "W1" and not a["worker_heartbeat_overdue"]


def test_kept_for_must_name_unassigned_known_items_with_a_scheduled_rebalance() -> None:
    h = Harness()
    _static_setup(h)
    keep_alive(h, 11_000, alive=("W1",))
    prepared = h.prepare("W1")
    cases = [
        ({"W1": ["A", "A/0", "A/1"]}, -1, {"S": ("i-1", ["B", "B/0"])},
         E.INVALID_ASSIGNMENT, "2 connectors/tasks are not assigned"),
        ({"W1": ["A", "A/0", "A/1", "B"]}, 1_000, {"S": ("i-1", ["B", "B/0"])},
         E.INVALID_ASSIGNMENT, "B is kept for S but is assigned"),
        ({"W1": ["A", "A/0", "A/1"]}, 1_000, {"S": ("i-1", ["B", "B/0", "Z"])},
         E.INVALID_ASSIGNMENT, "Z is kept for S but is unknown"),
        ({"W1": ["A", "A/0", "A/1"]}, 1_000, {"S": ("i-1", ["B"]), "T": (None, ["B", "B/0"])},
         E.INVALID_ASSIGNMENT, "B is kept for both S and T"),
        ({"W1": ["A", "A/0", "A/1"]}, 1_000, {"": (None, ["B", "B/0"])},
         E.INVALID_REQUEST, "KeptFor[].MemberId must be non-empty"),
    ]
    for assignment, delay, kept, code, message in cases:
        before = len(h.log)
        r = h.install("W1", assignment, prepared.group_epoch, delay_ms=delay, kept_for=kept)
        assert r.error_code == code and message in r.error_message, (kept, r)
        assert len(h.log) == before


def test_the_cli_renders_them() -> None:
    """``groups describe`` and ``connectors status``, text and JSON, from a describe answer."""
    import io

    from coordinator import cli

    h = Harness()
    _static_setup(h)
    keep_alive(h, 5_000, alive=("W1",))  # S silent: overdue
    (g,) = h.describe().groups
    d = cli._group_dict(g)
    by_id = {m["member_id"]: m for m in d["members"]}
    assert (by_id["S"]["last_heartbeat_ms_ago"], by_id["S"]["heartbeat_overdue"]) == (5_000, True)
    assert by_id["W1"]["heartbeat_overdue"] is False
    out = io.StringIO()
    cli._write_group(out, d)
    assert "LAST HEARTBEAT" in out.getvalue() and "5.0 s ago (overdue)" in out.getvalue()
    # (ASSIGNED: the harness's S reported no instance state; a real worker's say RUNNING)
    assert "ASSIGNED (worker missed heartbeats 5.0 s)" in cli._status_text(shared.status(g, "B"))
    assert "A  " in cli._status_text(shared.status(g, "A"))
    assert "missed" not in cli._status_text(shared.status(g, "A"))

    h = Harness()
    until = _fenced_static_member_kept(h, delay_ms=60_000)
    keep_alive(h, h.group().soft.hold_deadline["S"] - h.now + 1_000, alive=("W1",))
    (g,) = h.describe().groups
    d = cli._group_dict(g)
    assert d["kept_for"] == [{"member_id": "S", "instance_id": "i-1", "until_ms": until,
                              "until": cli._utc(until), "items": ["B", "B/0"]}]
    out = io.StringIO()
    cli._write_group(out, d)
    text = out.getvalue()
    assert "KEPT FOR DEPARTED MEMBERS" in text and "i-1" in text
    assert "UNASSIGNED (kept for i-1 until" in cli._status_text(shared.status(g, "B"))
