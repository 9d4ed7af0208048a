"""Who computes a group's assignment, and for how long (client-side assignment's trust model).

A member with READ on a group could take over the group's assignment: declare the assignor
version range [0, 32767], which makes it the only member covering everybody's (so the only one
eligible to compute), and an unbounded rebalance timeout, then never compute: every rebalance
of the group stalled. These tests pin the bounds: the rebalance timeout a member may declare
(``group.connect.max.rebalance.timeout.ms``), the time a chosen member gets to compute
(``group.connect.max.assignment.timeout.ms``), and that a member that did not compute in time is
not chosen again (nor its principal's other members), so the group's other members compute.
"""

from __future__ import annotations

from connect_wire.errors import ErrorCode as E
from coordinator.group.config import GroupCoordinatorConfig
from tests.group_harness import Harness, assignor
from tests.test_group_coordinator import hb

WIDE = (assignor("incremental", 0, 32767, version=1),)
HONEST = (assignor("incremental", 1, 1),)
LONG_SESSIONS = GroupCoordinatorConfig(session_timeout_ms=120_000)
"""(so that the clock can pass the default 30 s group.connect.max.assignment.timeout.ms)"""


def _hb(h: Harness, member_id: str, **fields):
    return hb(h, member_id, **fields)


def test_an_unbounded_rebalance_timeout_is_refused() -> None:
    h = Harness()
    r = h.join("attacker", assignors=WIDE, rebalance_timeout_ms=2**31 - 1)
    assert r.error_code == E.INVALID_REQUEST
    assert "group.connect.max.rebalance.timeout.ms=300000" in r.error_message
    assert h.group() is None  # nothing was written
    assert h.join("worker", assignors=HONEST, rebalance_timeout_ms=300_000).error_code == 0
    r = h.heartbeat("worker", 1, rebalance_timeout_ms=300_001)  # on a later heartbeat too
    assert r.error_code == E.INVALID_REQUEST
    assert h.group().members["worker"].rebalance_timeout_ms == 300_000


def test_a_member_that_does_not_compute_is_replaced_within_the_bound() -> None:
    h = Harness(LONG_SESSIONS)
    h.alter({"A": 2})
    assert h.join("worker", assignors=HONEST).error_code == 0
    h.compute({"worker": ["A", "A/0", "A/1"]})
    # The attacker joins: its range covers the worker's, not the reverse, so it is the only
    # eligible member; it is told to compute and never does.
    assert h.join("attacker", assignors=WIDE, rebalance_timeout_ms=300_000).error_code == 0
    assert h.assigner() == "attacker"
    assert _hb(h, "attacker").should_compute_assignment is True
    h.advance(29_999)
    assert h.assigner() == "attacker"
    _hb(h, "worker")
    h.advance(1)  # the bound, not the attacker's 300 s rebalance timeout
    assert h.assigner() == "worker"
    assert any(e.event == "assignment computation timed out" for e in h.events)
    assert _hb(h, "worker").should_compute_assignment is True
    prepared = h.compute({"worker": ["A", "A/0"], "attacker": ["A/1"]})
    assert h.group().assignment_epoch == prepared.group_epoch
    # The next rebalance (a connector added) is computed by the worker at once: the attacker
    # stays barred while it is a member.
    h.alter({"A": 2, "B": 1})
    assert h.assigner() == "worker"
    assert _hb(h, "worker", owned=["A", "A/0", "A/1"]).should_compute_assignment is True


def test_a_barred_principal_rejoining_under_a_new_member_id_is_not_chosen() -> None:
    h = Harness(LONG_SESSIONS)
    h.alter({"A": 1})
    h.join("worker", assignors=HONEST, principal="User:worker")
    h.compute({"worker": ["A", "A/0"]})
    h.join("attacker-1", assignors=WIDE, principal="User:mallory")
    assert h.assigner() == "attacker-1"
    _hb(h, "attacker-1", principal="User:mallory")
    h.advance(30_000)
    assert h.assigner() == "worker"
    # The same principal leaves and joins again under a fresh member id: not chosen again.
    assert h.heartbeat("attacker-1", -1).error_code == 0
    assert h.join("attacker-2", assignors=WIDE, principal="User:mallory").error_code == 0
    assert h.assigner() == "worker"
    assert _hb(h, "worker").should_compute_assignment is True


def test_the_only_member_able_to_compute_gets_another_try() -> None:
    h = Harness(LONG_SESSIONS)
    h.alter({"A": 1})
    h.join("slow", assignors=HONEST)
    assert _hb(h, "slow").should_compute_assignment is True
    h.advance(30_000)
    assert h.assigner() == "slow"  # nobody else: it is chosen again (bounded each time)
    assert _hb(h, "slow").should_compute_assignment is True
    h.compute({"slow": ["A", "A/0"]})
    assert h.group().assignment_epoch == h.group().epoch


def test_a_member_not_allowed_to_compute_is_never_chosen() -> None:
    """``RequestContext.may_assign`` (the runtime's authorizer.assign.operation check): such a
    member's range does not decide eligibility; losing the permission mid-rebalance hands the
    computation to another member at its next full heartbeat."""
    h = Harness(LONG_SESSIONS)
    h.alter({"A": 1})
    h.join("worker", assignors=HONEST)
    h.compute({"worker": ["A", "A/0"]})
    assert h.join("reader", assignors=WIDE, may_assign=False).error_code == 0
    assert h.assigner() == "worker"
    assert _hb(h, "worker", owned=["A", "A/0"]).should_compute_assignment is True
    # The worker's permission is revoked (an ACL deleted), the reader's granted: at their next
    # full heartbeats the computation moves.
    assert _hb(h, "reader", may_assign=True).error_code == 0
    r = _hb(h, "worker", owned=["A", "A/0"], may_assign=False)
    assert r.should_compute_assignment is False
    assert h.assigner() == "reader"
    # Nobody allowed: nobody computes, and describe says why.
    assert _hb(h, "reader", may_assign=False).should_compute_assignment is False
    assert h.assigner() is None
    d = h.describe().groups[0]
    assert d.error_code == E.NO_ASSIGNOR_COVERS_GROUP and "authorizer.assign.operation" in \
        d.error_message
