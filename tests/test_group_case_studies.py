"""The case studies of the seeds, step by step, on the group state machine.

Seed 000 (the Connect design, "Case Studies"): Empty Group, W1 joins, W2 joins, Worker Leaving
the Group, Worker Bounces. Seed 002 (KIP-848, "Case Studies"): Basic, Incremental Revocation &
Assignment, Member Failure, adapted to connectors and tasks.

Seed 000's names: AC0 = connector "A", AT1 = "A/0", AT2 = "A/1", BC0 = "B", BT1 = "B/0" (five
items: connector A with two tasks, connector B with one). Seed 002's partitions foo-0 .. foo-5
are the items of one connector "foo": foo-0 = "foo" (the connector), foo-k = "foo/{k-1}".

The chosen worker plays the client-side assignor (PrepareAssignment + InstallAssignment with
the assignment the seed writes). A member's *current* assignment only changes on its own
heartbeat: where a seed's table shows a member's new assignment before the member heartbeats,
the test heartbeats first and says so.

The harness checks the invariants (no item owned twice, epochs never go back, ...) and that a
replay of the whole log gives the same state after every single step.
"""

from __future__ import annotations

from typing import Any

import pytest

from connect_wire.errors import ErrorCode as E
from tests.group_harness import Harness, assignor, items, names, response_items

SEED000_ITEMS = ["A", "A/0", "A/1", "B", "B/0"]  # AC0, AT1, AT2, BC0, BT1


def foo(*partitions: int) -> list[str]:
    """Seed 002's foo-k partitions as items of connector "foo"."""
    return sorted("foo" if p == 0 else f"foo/{p - 1}" for p in partitions)


def wire_assignors(h: Harness, member_id: str) -> tuple[Any, ...]:
    """The member's stored assignors, as a heartbeat sends them (so a rejoin changes nothing)."""
    return tuple(
        assignor(a.name, a.minimum_version, a.maximum_version, a.metadata_version, a.reason,
                 a.metadata_bytes)
        for a in h.group().members[member_id].assignors
    )


def hb(h: Harness, member_id: str, owned: list[str] | None = None, **fields: Any) -> Any:
    """One heartbeat of a worker at its current member epoch, reporting what it runs.

    A member at epoch 0 must send the full join fields (docs/protocol.md), so it "joins" again with
    its unchanged assignors.
    """
    cur = h.group().current[member_id]
    if cur.epoch == 0:
        r = h.join(member_id, owned=owned or [], assignors=wire_assignors(h, member_id),
                   rebalance_timeout_ms=h.group().members[member_id].rebalance_timeout_ms)
    else:
        r = h.heartbeat(member_id, cur.epoch, owned=owned, **fields)
    assert r.error_code == 0, r
    return r


def epochs(h: Harness) -> tuple[int, int]:
    g = h.group()
    return g.epoch, g.assignment_epoch


def members(h: Harness) -> dict[str, tuple[int, list[str]]]:
    """Member assignment table: member -> (member epoch, items it may run)."""
    return {mid: h.current(mid) for mid in sorted(h.group().members)}


def targets(h: Harness) -> dict[str, list[str]]:
    return {mid: h.target(mid) for mid in sorted(h.group().target)}


def bump_group_epoch_to(h: Harness, epoch: int, member_id: str) -> None:
    """Drive the group epoch up to ``epoch`` the way seed 000 lists as a rebalance trigger:
    the worker ``member_id`` updates its assignor's reason, once per bump."""
    spec = h.group().members[member_id].assignors[0]
    reason = spec.reason
    while h.group().epoch < epoch:
        reason += 1
        before = h.group().epoch
        new = (assignor(spec.name, spec.minimum_version, spec.maximum_version,
                        spec.metadata_version, reason),)
        cur = h.group().current[member_id]
        if cur.epoch == 0:
            r = h.join(member_id, assignors=new)
        else:
            r = h.heartbeat(member_id, cur.epoch, client_assignors=new)
        assert r.error_code == 0, r
        assert h.group().epoch == before + 1
    assert h.group().epoch == epoch


# == seed 000 =========================================================================================


def test_seed000_empty_group_w1_joins_w2_joins() -> None:
    h = Harness()
    # The config topic holds AC0, AT1, AT2, BC0, BT1. Connector changes in a group without
    # members do not bump the group epoch, so the group starts as the seed's "Empty Group".
    assert h.alter({"A": 2, "B": 1}).error_code == 0
    g = h.group()
    # Empty Group: group epoch 0, target epoch 0, no members.
    assert epochs(h) == (0, 0)
    assert g.members == {} and targets(h) == {}
    assert h.describe().groups[0].group_state == "Empty"

    # -- W1 joins: group epoch 1, W1 at epoch 0 with nothing; the target is still epoch 0.
    r = h.join("W1")
    assert r.error_code == 0 and r.member_id == "W1" and r.member_epoch == 0
    assert response_items(r) == []
    assert epochs(h) == (1, 0)
    assert members(h) == {"W1": (0, [])}
    assert targets(h) == {}
    # W1 is selected to run the client assignor (told in this very response).
    assert r.should_compute_assignment is True
    assert h.assigner() == "W1"
    assert h.describe().groups[0].group_state == "Assigning"

    # W1 assigns everything to itself and installs it: target epoch 1; W1 still at epoch 0.
    prepared = h.compute({"W1": SEED000_ITEMS})
    assert prepared.group_epoch == 1 and prepared.assignment_epoch == 0
    assert epochs(h) == (1, 1)
    assert targets(h) == {"W1": SEED000_ITEMS}
    assert members(h) == {"W1": (0, [])}
    assert h.describe().groups[0].group_state == "Reconciling"

    # W1 heartbeats: nothing to revoke, so it moves straight to epoch 1 with everything.
    r = hb(h, "W1")
    assert r.member_epoch == 1 and response_items(r) == SEED000_ITEMS
    assert r.should_compute_assignment is False
    assert members(h) == {"W1": (1, SEED000_ITEMS)}
    assert h.describe().groups[0].group_state == "Stable"
    # "Since this is the first member in the group, there won't be any rebalances based on
    # scheduled.rebalance.max.delay.ms": no scheduled rebalance is pending.
    assert g.scheduled_rebalance_at_ms == -1 and ("scheduled", "g", "") not in h.timers

    # -- W2 joins: group epoch 2.
    r = h.join("W2")
    assert r.error_code == 0 and r.should_compute_assignment is False
    assert epochs(h) == (2, 1)
    # Reading (the seed contradicts itself on W2's epoch): its table right after the join shows
    # "W2 - epoch=0", its table after the install "W2 - epoch=1" although W2 did not heartbeat
    # in between. We take epoch 1 from the join on: the coordinator reconciles the joining
    # member in the same heartbeat to the current assignment epoch (1), where its target is
    # empty, so there is nothing to wait for (KIP-848's computeNextAssignment).
    assert r.member_epoch == 1 and response_items(r) == []
    assert members(h) == {"W1": (1, SEED000_ITEMS), "W2": (1, [])}
    assert targets(h) == {"W1": SEED000_ITEMS}

    # W1 is chosen again (the chosen worker is sticky), learns it on its next heartbeat.
    assert h.assigner() == "W1"
    r = hb(h, "W1", owned=SEED000_ITEMS)
    assert r.should_compute_assignment is True and r.member_epoch == 1
    assert r.assignment is None  # unchanged since its last response
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    assert epochs(h) == (2, 2)
    assert targets(h) == {"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}
    # The seed's table: W1 still epoch 1 with everything, W2 epoch 1 with nothing.
    assert members(h) == {"W1": (1, SEED000_ITEMS), "W2": (1, [])}

    # W1 heartbeats: asked to revoke BC0 and BT1 (it may run only AC0, AT1, AT2; same epoch).
    r = hb(h, "W1", owned=SEED000_ITEMS)
    assert r.member_epoch == 1 and response_items(r) == ["A", "A/0", "A/1"]
    cur = g.current["W1"]
    assert cur.state.label == "UnrevokedItems" and names(cur.revoking) == ["B", "B/0"]
    # BC0 and BT1 are still owned by W1 until it acknowledges.
    assert g.owner[next(iter(cur.revoking))] == "W1"
    # W1 acknowledges (it no longer runs BC0 and BT1): it moves to epoch 2.
    r = hb(h, "W1", owned=["A", "A/0", "A/1"])
    assert r.member_epoch == 2 and response_items(r) == ["A", "A/0", "A/1"]
    assert members(h) == {"W1": (2, ["A", "A/0", "A/1"]), "W2": (1, [])}

    # W2 heartbeats: it gets its assignment and is bumped to epoch 2.
    r = hb(h, "W2", owned=[])
    assert r.member_epoch == 2 and response_items(r) == ["B", "B/0"]
    assert members(h) == {"W1": (2, ["A", "A/0", "A/1"]), "W2": (2, ["B", "B/0"])}
    assert targets(h) == {"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}
    assert h.describe().groups[0].group_state == "Stable"
    # A steady heartbeat afterwards: nothing changes, no Assignment, no record.
    logged = len(h.log)
    r = hb(h, "W2")
    assert r.member_epoch == 2 and r.assignment is None and len(h.log) == logged
    h.check_records_encode()


def _three_workers_at_35(h: Harness, w2_instance: str | None = None) -> None:
    """Seed 000's start state of "Worker Leaving"/"Worker Bounces", built by driving the machine.

    W1 and W2 run the assignor at versions [0-1], W3 at [0-2]: only W3's range covers every
    member's, so W3 is the chosen worker, as in the seed ("W3 is chosen"). The group epoch is
    then driven to 35 by W1 updating its assignor's reason 32 times (a seed 000 rebalance
    trigger), and W3 installs the seed's assignment at epoch 35; each worker heartbeats once.
    """
    assert h.alter({"A": 2, "B": 1}).error_code == 0
    assert h.join("W1").error_code == 0
    assert h.join("W2", instance_id=w2_instance).error_code == 0
    r = h.join("W3", assignors=(assignor(low=0, high=2),))
    assert r.error_code == 0 and r.should_compute_assignment is True
    assert h.assigner() == "W3"
    assert epochs(h) == (3, 0)
    bump_group_epoch_to(h, 35, "W1")
    assert h.assigner() == "W3"
    h.compute({"W1": ["A", "A/0"], "W2": ["B", "B/0"], "W3": ["A/1"]})
    for mid in ("W1", "W2", "W3"):
        hb(h, mid)
    # Seed: Group (epoch=35) W1 W2 W3; Target (epoch=35); Member Assignment all at 35.
    assert epochs(h) == (35, 35)
    assert targets(h) == {"W1": ["A", "A/0"], "W2": ["B", "B/0"], "W3": ["A/1"]}
    assert members(h) == {"W1": (35, ["A", "A/0"]), "W2": (35, ["B", "B/0"]), "W3": (35, ["A/1"])}
    assert h.describe().groups[0].group_state == "Stable"


def _live(h: Harness, ms: int, alive: tuple[str, ...]) -> None:
    """Let ``ms`` pass in heartbeat-interval steps; only the ``alive`` workers heartbeat."""
    step = h.coordinator.config.heartbeat_interval_ms
    for _ in range(ms // step):
        h.advance(step)
        for mid in alive:
            if mid in h.group().members:
                hb(h, mid, owned=h.current(mid)[1])


def _w2_kicked_out_and_w3_holds(h: Harness, delay_ms: int) -> None:
    """Seed 000: W2 stops heartbeating and is removed after its session timeout (epoch 36); W3,
    chosen, keeps the assignment unchanged to give W2 a chance to come back (delay δ)."""
    session = h.coordinator.config.session_timeout_ms
    _live(h, session + 3_000, alive=("W1", "W3"))
    g = h.group()
    # Reading: the seed's table after the removal lists "Group (epoch=36) W1 W2" — W2 is the
    # member that was removed, so the group is W1 and W3 (as its member table says). It also
    # still shows W2's target at epoch 35: our coordinator tombstones a removed member's
    # target with its other records (Kafka's order), so BC0 and BT1 are in no target now.
    assert sorted(g.members) == ["W1", "W3"]
    assert epochs(h) == (36, 35)
    assert targets(h) == {"W1": ["A", "A/0"], "W3": ["A/1"]}
    assert members(h) == {"W1": (35, ["A", "A/0"]), "W3": (35, ["A/1"])}
    # W2's work: held for W2 (fenced, it may still be stopping it) until its session deadline
    # plus its stop budget (half its rebalance timeout); then nobody's.
    assert [g.owner.get(i) for i in items(["B", "B/0"])] == ["W2", "W2"]
    assert ("hold", "g", "W2") in h.timers and "W2" not in g.members
    assert h.describe().groups[0].group_state == "Assigning"

    assert h.assigner() == "W3"
    r = hb(h, "W3", owned=["A/1"])
    assert r.should_compute_assignment is True
    prepared = h.prepare("W3")
    assert prepared.group_epoch == 36
    # Reading: "it won't change any assignments" leaves BC0 and BT1 unassigned, while the
    # seed's own "Assignment Validation" requires every connector and task to be assigned. We
    # take: an assignment may hold items unassigned only if it schedules the follow-up
    # computation (ScheduledRebalanceDelayMs, docs/protocol.md's form of the seed's "updating the
    # reason field"); without one it is INVALID_ASSIGNMENT ...
    bad = h.install("W3", {"W1": ["A", "A/0"], "W3": ["A/1"]}, prepared.group_epoch)
    assert bad.error_code == E.INVALID_ASSIGNMENT and "not assigned" in bad.error_message
    assert epochs(h) == (36, 35)
    # ... and with the delay δ it is installed at epoch 36, W2's work held for it.
    ok = h.install("W3", {"W1": ["A", "A/0"], "W3": ["A/1"]}, prepared.group_epoch, delay_ms=delay_ms)
    assert ok.error_code == 0
    assert epochs(h) == (36, 36)
    assert targets(h) == {"W1": ["A", "A/0"], "W3": ["A/1"]}
    assert members(h) == {"W1": (35, ["A", "A/0"]), "W3": (35, ["A/1"])}
    assert g.scheduled_rebalance_at_ms == h.now + delay_ms

    # W1 and W3 heartbeat: epoch 36, the same assignments.
    r1 = hb(h, "W1", owned=["A", "A/0"])
    r3 = hb(h, "W3", owned=["A/1"])
    assert (r1.member_epoch, response_items(r1)) == (36, ["A", "A/0"])
    assert (r3.member_epoch, response_items(r3)) == (36, ["A/1"])
    assert members(h) == {"W1": (36, ["A", "A/0"]), "W3": (36, ["A/1"])}
    assert h.describe().groups[0].group_state == "Stable"


def test_seed000_worker_leaving_the_group() -> None:
    h = Harness()
    _three_workers_at_35(h)
    delay = 20_000
    _w2_kicked_out_and_w3_holds(h, delay)
    g = h.group()

    # No one comes back; the delay elapses and the coordinator starts a new computation: the
    # group epoch goes to 37 (the workers keep heartbeating meanwhile).
    _live(h, delay + 3_000, alive=("W1", "W3"))
    assert epochs(h) == (37, 36)
    # Reading: the seed's epoch-37 table lists "W2 - epoch=36, [AT2]": AT2 is W3's, so W3.
    assert members(h) == {"W1": (36, ["A", "A/0"]), "W3": (36, ["A/1"])}
    assert h.assigner() == "W3"
    r = hb(h, "W3", owned=["A/1"])
    assert r.should_compute_assignment is True
    # Reading: the seed writes "BC1" for W3; the group has no BC1 — it is BT1 (B/0), the one
    # item left besides BC0.
    h.compute({"W1": ["A", "A/0", "B"], "W3": ["B/0", "A/1"]})
    assert epochs(h) == (37, 37)
    assert targets(h) == {"W1": ["A", "A/0", "B"], "W3": ["A/1", "B/0"]}
    assert members(h) == {"W1": (36, ["A", "A/0"]), "W3": (36, ["A/1"])}
    assert g.scheduled_rebalance_at_ms == -1

    # W1 and W3 heartbeat and receive their assignments: the rebalance is done.
    r1 = hb(h, "W1", owned=["A", "A/0"])
    r3 = hb(h, "W3", owned=["A/1"])
    assert (r1.member_epoch, response_items(r1)) == (37, ["A", "A/0", "B"])
    assert (r3.member_epoch, response_items(r3)) == (37, ["A/1", "B/0"])
    assert members(h) == {"W1": (37, ["A", "A/0", "B"]), "W3": (37, ["A/1", "B/0"])}
    assert h.describe().groups[0].group_state == "Stable"
    h.check_records_encode()


@pytest.mark.parametrize("rejoin", ["same-member-id", "static-instance-id"])
def test_seed000_worker_bounces(rejoin: str) -> None:
    h = Harness()
    _three_workers_at_35(h, w2_instance="worker-2" if rejoin == "static-instance-id" else None)
    delay = 60_000  # Δ: W2 comes back well before it
    _w2_kicked_out_and_w3_holds(h, delay)
    g = h.group()

    # W2 comes back before Δ. "Let's say it joins with epoch 35": it was removed, so that is
    # UNKNOWN_MEMBER_ID; the worker drops its work and rejoins with epoch 0 (docs/protocol.md) —
    # with its old member id, or, in the static variant (W2 has instance id "worker-2" and
    # vanished without leaving, so its session expired), with its instance id and a new id.
    r = h.heartbeat("W2", 35, owned=["B", "B/0"])
    assert r.error_code == E.UNKNOWN_MEMBER_ID
    assert epochs(h) == (36, 36)
    if rejoin == "same-member-id":
        new_id = "W2"
        r = h.join("W2", owned=[])
    else:
        new_id = "W2-again"
        r = h.join(new_id, owned=[], instance_id="worker-2")
    assert r.error_code == 0 and r.member_id == new_id
    # Reading: the seed says the coordinator updates the group epoch to 37 but its next table
    # shows "Group (epoch=36)" with W1 W2 W3; a join bumps the group epoch: 37.
    assert epochs(h) == (37, 36)
    assert sorted(g.members) == sorted(["W1", new_id, "W3"])
    assert r.member_epoch == 36 and response_items(r) == []  # nothing for it yet
    assert h.describe().groups[0].group_state == "Assigning"

    # W3, chosen, notices the pending delay and re-assigns the original assignment.
    assert h.assigner() == "W3"
    assert hb(h, "W3", owned=["A/1"]).should_compute_assignment is True
    h.compute({"W1": ["A", "A/0"], new_id: ["B", "B/0"], "W3": ["A/1"]})
    assert epochs(h) == (37, 37)
    assert targets(h) == {"W1": ["A", "A/0"], new_id: ["B", "B/0"], "W3": ["A/1"]}
    assert g.scheduled_rebalance_at_ms == -1  # the delayed rebalance is no longer needed
    assert ("scheduled", "g", "") not in h.timers

    if rejoin == "static-instance-id":
        # Not in the seed: the new member id may be another process than the vanished one,
        # which may still be stopping B and B/0: they stay held for W2 until its session
        # deadline plus its stop budget. (With its own member id, W2's report that it runs
        # nothing released them at its join.)
        r2 = hb(h, new_id, owned=[])
        assert (r2.member_epoch, response_items(r2)) == (37, [])
        assert g.current[new_id].state.label == "UnreleasedItems"
        step = h.coordinator.config.heartbeat_interval_ms
        _live(h, h.timers[("hold", "g", "W2")] - h.now + step, alive=("W1", new_id, "W3"))
        assert "W2" not in g.current and epochs(h) == (37, 37)
        assert h.current(new_id) == (37, ["B", "B/0"])  # given in a heartbeat of _live
    else:
        r2 = hb(h, new_id, owned=[])
        r1 = hb(h, "W1", owned=["A", "A/0"])
        r3 = hb(h, "W3", owned=["A/1"])
        assert (r2.member_epoch, response_items(r2)) == (37, ["B", "B/0"])
        assert (r1.member_epoch, response_items(r1)) == (37, ["A", "A/0"])
        assert (r3.member_epoch, response_items(r3)) == (37, ["A/1"])
    # Final state. Reading: the seed's last member table omits W3; W3 is at 37 with AT2 too.
    assert members(h) == {"W1": (37, ["A", "A/0"]), new_id: (37, ["B", "B/0"]), "W3": (37, ["A/1"])}
    assert h.describe().groups[0].group_state == "Stable"
    # Δ passing later starts nothing: the scheduled rebalance was cleared by the install.
    _live(h, delay + 3_000, alive=("W1", new_id, "W3"))
    assert epochs(h) == (37, 37)
    h.check_records_encode()


# == seed 002 (KIP-848), adapted ======================================================================


def test_kip848_basic() -> None:
    h = Harness()
    assert h.alter({"foo": 2}).error_code == 0  # foo-0, foo-1, foo-2
    g = h.group()
    assert epochs(h) == (0, 0) and g.members == {}

    # A joins: epoch 1, A at epoch 0 with nothing, target still epoch 0 (empty).
    r = h.join("A")
    assert r.member_epoch == 0 and response_items(r) == []
    assert epochs(h) == (1, 0) and members(h) == {"A": (0, [])} and targets(h) == {}
    # A computes and installs: everything to A.
    assert r.should_compute_assignment is True
    h.compute({"A": foo(0, 1, 2)})
    assert epochs(h) == (1, 1) and targets(h) == {"A": foo(0, 1, 2)}
    assert members(h) == {"A": (0, [])}
    # A heartbeats: epoch 1 with all the partitions.
    r = hb(h, "A")
    assert (r.member_epoch, response_items(r)) == (1, foo(0, 1, 2))

    # B joins: epoch 2. Reading: the seed's table shows "B - epoch=0"; the join heartbeat
    # already reconciles B to the assignment epoch then (1), where its target is empty.
    r = h.join("B")
    assert epochs(h) == (2, 1)
    assert r.member_epoch == 1 and response_items(r) == []
    assert members(h) == {"A": (1, foo(0, 1, 2)), "B": (1, [])}
    assert hb(h, "A", owned=foo(0, 1, 2)).should_compute_assignment is True
    h.compute({"A": foo(0, 1), "B": foo(2)})
    assert epochs(h) == (2, 2) and targets(h) == {"A": foo(0, 1), "B": foo(2)}
    # B transitions to epoch 2 but cannot get foo-2 until A revokes it (pending).
    r = hb(h, "B", owned=[])
    assert (r.member_epoch, response_items(r)) == (2, [])
    assert g.current["B"].state.label == "UnreleasedItems"
    # A heartbeats: revoke foo-2 (same epoch).
    r = hb(h, "A", owned=foo(0, 1, 2))
    assert (r.member_epoch, response_items(r)) == (1, foo(0, 1))
    assert names(g.current["A"].revoking) == foo(2)
    # B heartbeats meanwhile: still waiting, nothing changes (no Assignment in the response).
    r = hb(h, "B", owned=[])
    assert r.member_epoch == 2 and r.assignment is None
    # A acknowledges: epoch 2, foo-2 released.
    r = hb(h, "A", owned=foo(0, 1))
    assert (r.member_epoch, response_items(r)) == (2, foo(0, 1))
    assert members(h) == {"A": (2, foo(0, 1)), "B": (2, [])}
    # B heartbeats: now it gets foo-2.
    r = hb(h, "B", owned=[])
    assert (r.member_epoch, response_items(r)) == (2, foo(2))
    assert members(h) == {"A": (2, foo(0, 1)), "B": (2, foo(2))}
    assert h.describe().groups[0].group_state == "Stable"

    # C joins: epoch 3 (C reconciled to epoch 2 with nothing, as B above).
    r = h.join("C")
    assert epochs(h) == (3, 2) and r.member_epoch == 2
    assert hb(h, "A", owned=foo(0, 1)).should_compute_assignment is True
    h.compute({"A": foo(0), "B": foo(2), "C": foo(1)})
    assert epochs(h) == (3, 3)
    assert targets(h) == {"A": foo(0), "B": foo(2), "C": foo(1)}
    assert members(h) == {"A": (2, foo(0, 1)), "B": (2, foo(2)), "C": (2, [])}
    # B heartbeats: nothing to revoke, epoch 3.
    r = hb(h, "B", owned=foo(2))
    assert (r.member_epoch, response_items(r)) == (3, foo(2))
    # C heartbeats: epoch 3, foo-1 pending.
    r = hb(h, "C", owned=[])
    assert (r.member_epoch, response_items(r)) == (3, [])
    assert g.current["C"].state.label == "UnreleasedItems"
    # A heartbeats: revoke foo-1; then acknowledges: epoch 3.
    r = hb(h, "A", owned=foo(0, 1))
    assert (r.member_epoch, response_items(r)) == (2, foo(0))
    r = hb(h, "A", owned=foo(0))
    assert (r.member_epoch, response_items(r)) == (3, foo(0))
    # C heartbeats and gets foo-1.
    r = hb(h, "C", owned=[])
    assert (r.member_epoch, response_items(r)) == (3, foo(1))
    # Reading: the seed's last table has "B - epoch=3, partitions=[foo-1]", a typo: B's target
    # is foo-2 and C has foo-1 (one partition is never owned twice).
    assert members(h) == {"A": (3, foo(0)), "B": (3, foo(2)), "C": (3, foo(1))}
    assert h.describe().groups[0].group_state == "Stable"


def _two_members_at_21(h: Harness) -> None:
    """Seed 002 "Incremental": A and B at epoch 21 with three partitions each. Built by
    driving the machine: A and B join, A raises the group epoch to 21 by updating its
    assignor's reason, then installs the seed's assignment."""
    assert h.alter({"foo": 5}).error_code == 0  # foo-0 .. foo-5
    h.join("A")
    h.join("B")
    bump_group_epoch_to(h, 21, "A")
    h.compute({"A": foo(0, 1, 2), "B": foo(3, 4, 5)})
    hb(h, "A")
    hb(h, "B")
    assert epochs(h) == (21, 21)
    assert members(h) == {"A": (21, foo(0, 1, 2)), "B": (21, foo(3, 4, 5))}


def test_kip848_incremental_revocation_and_assignment() -> None:
    h = Harness()
    _two_members_at_21(h)
    g = h.group()
    # C joins; A (chosen) computes and installs the seed's target at epoch 22.
    r = h.join("C")
    assert epochs(h) == (22, 21) and r.member_epoch == 21
    assert hb(h, "A", owned=foo(0, 1, 2)).should_compute_assignment is True
    h.compute({"A": foo(0, 1), "B": foo(3, 4), "C": foo(2, 5)})
    assert epochs(h) == (22, 22)
    assert targets(h) == {"A": foo(0, 1), "B": foo(3, 4), "C": foo(2, 5)}
    assert members(h) == {"A": (21, foo(0, 1, 2)), "B": (21, foo(3, 4, 5)), "C": (21, [])}

    # C heartbeats: epoch 22, nothing yet (foo-2 and foo-5 not revoked).
    r = hb(h, "C", owned=[])
    assert (r.member_epoch, response_items(r)) == (22, [])
    # A heartbeats: revoke foo-2. B heartbeats: revoke foo-5. C: no change.
    r = hb(h, "A", owned=foo(0, 1, 2))
    assert (r.member_epoch, response_items(r)) == (21, foo(0, 1))
    r = hb(h, "B", owned=foo(3, 4, 5))
    assert (r.member_epoch, response_items(r)) == (21, foo(3, 4))
    r = hb(h, "C", owned=[])
    assert r.member_epoch == 22 and r.assignment is None
    # A acknowledges: epoch 22, foo-2 released.
    r = hb(h, "A", owned=foo(0, 1))
    assert (r.member_epoch, response_items(r)) == (22, foo(0, 1))
    # The seed's table shows C with foo-2 already; C's assignment changes on its heartbeat:
    # C heartbeats and gets foo-2, which is free now, but not foo-5.
    r = hb(h, "C", owned=[])
    assert (r.member_epoch, response_items(r)) == (22, foo(2))
    assert g.current["C"].state.label == "UnreleasedItems"
    assert members(h) == {"A": (22, foo(0, 1)), "B": (21, foo(3, 4)), "C": (22, foo(2))}
    assert g.owner[next(iter(g.current["B"].revoking))] == "B"  # foo-5 still B's
    # B acknowledges: epoch 22, foo-5 released.
    r = hb(h, "B", owned=foo(3, 4))
    assert (r.member_epoch, response_items(r)) == (22, foo(3, 4))
    # C heartbeats and gets foo-2 and foo-5.
    r = hb(h, "C", owned=foo(2))
    assert (r.member_epoch, response_items(r)) == (22, foo(2, 5))
    assert members(h) == {"A": (22, foo(0, 1)), "B": (22, foo(3, 4)), "C": (22, foo(2, 5))}
    assert h.describe().groups[0].group_state == "Stable"


def test_kip848_member_failure() -> None:
    h = Harness()
    _two_members_at_21(h)
    # Reach the seed's start: A, B, C at epoch 22 (the end of the previous case study).
    h.join("C")
    hb(h, "A", owned=foo(0, 1, 2))
    h.compute({"A": foo(0, 1), "B": foo(3, 4), "C": foo(2, 5)})
    for mid, owned in (("A", foo(0, 1, 2)), ("B", foo(3, 4, 5)), ("C", []),
                       ("A", foo(0, 1)), ("B", foo(3, 4)), ("C", [])):
        hb(h, mid, owned=owned)
    assert epochs(h) == (22, 22)
    assert members(h) == {"A": (22, foo(0, 1)), "B": (22, foo(3, 4)), "C": (22, foo(2, 5))}
    g = h.group()

    # A fails to heartbeat: removed after the session timeout, group epoch 23.
    _live(h, h.coordinator.config.session_timeout_ms + 3_000, alive=("B", "C"))
    assert sorted(g.members) == ["B", "C"]
    assert epochs(h) == (23, 22)
    assert members(h) == {"B": (22, foo(3, 4)), "C": (22, foo(2, 5))}
    assert h.describe().groups[0].group_state == "Assigning"
    # A was the chosen worker; it is gone, so another eligible member computes the new target
    # (all are eligible: the first by member id).
    assert h.assigner() == "B"
    assert hb(h, "B", owned=foo(3, 4)).should_compute_assignment is True
    h.compute({"B": foo(3, 4, 0), "C": foo(2, 5, 1)})
    assert epochs(h) == (23, 23)
    assert targets(h) == {"B": foo(0, 3, 4), "C": foo(1, 2, 5)}
    # B and C heartbeat and transition to epoch 23 with their new partitions -- but where the
    # KIP's table hands foo-0 and foo-1 over at once, ours holds them for A until A's session
    # deadline plus its stop budget (half its rebalance timeout): a partitioned A only then
    # has certainly stopped them ("fence-stop-tail", found by the simulator).
    rb = hb(h, "B", owned=foo(3, 4))
    rc = hb(h, "C", owned=foo(2, 5))
    assert (rb.member_epoch, response_items(rb)) == (23, foo(3, 4))
    assert (rc.member_epoch, response_items(rc)) == (23, foo(2, 5))
    assert [g.owner[i] for i in items(foo(0, 1))] == ["A", "A"]
    assert h.describe().groups[0].group_state == "Reconciling"  # B and C: UnreleasedItems
    step = h.coordinator.config.heartbeat_interval_ms
    _live(h, h.timers[("hold", "g", "A")] - h.now + step, alive=("B", "C"))
    assert "A" not in g.current
    assert members(h) == {"B": (23, foo(0, 3, 4)), "C": (23, foo(1, 2, 5))}
    assert h.describe().groups[0].group_state == "Stable"
    h.check_records_encode()
