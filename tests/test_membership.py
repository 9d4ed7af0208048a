"""The worker's membership state machine, unit by unit and against the real coordinator core.

Both are pure, so a whole group runs in-process with a virtual clock: each worker asks its
Membership what to send, the core answers, the worker carries out the actions (revoke first)
and reports back. After every step no item may be run by two workers.
"""

from __future__ import annotations

import itertools
from typing import Any

from connect_wire.assignors.api import GroupAssignment, MemberTarget, group_from_prepare, install_request
from connect_wire.errors import ErrorCode as E
from connect_wire.items import Item, connector_items
from connect_wire.messages import (
    ConnectGroupHeartbeatResponse,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_heartbeat_response_v0 as _hb
from coordinator.group.coordinator import GroupCoordinator
from coordinator.group.invariants import check_invariants
from worker_client.membership import (
    Assign,
    AssignorAd,
    Compute,
    Fatal,
    Lost,
    Membership,
    Revoke,
    State,
)

ADS = (AssignorAd("round-robin", 0, 1, metadata_version=1),)


def items(*texts: str) -> frozenset[Item]:
    return frozenset(Item.parse(t) for t in texts)


def response(epoch: int, assigned: tuple[str, ...] | None = None, *, error: int = 0,
             compute: bool = False, member_id: str | None = None) -> ConnectGroupHeartbeatResponse:
    assignment = None
    if assigned is not None:
        its = sorted(items(*assigned))
        assignment = _hb.Assignment(
            error=0, connectors=tuple(i.connector for i in its if i.is_connector),
            tasks=tuple(_hb.TaskId(connector=i.connector, task=i.task) for i in its if not i.is_connector),
            metadata_version=0, metadata_bytes=b"")
    return ConnectGroupHeartbeatResponse(
        error_code=error, member_id=member_id, member_epoch=epoch, heartbeat_interval_ms=1000,
        should_compute_assignment=compute, assignment=assignment)


# -- unit behaviour --------------------------------------------------------------------------


def test_join_sends_everything_then_only_changes() -> None:
    m = Membership("g", ADS, rebalance_timeout_ms=5000, worker_url="http://w1")
    m.join(0)
    first = m.heartbeat_request(0)
    assert first.member_epoch == 0 and first.member_id == ""
    assert first.rebalance_timeout_ms == 5000 and first.client_assignors is not None
    assert first.owned_connectors == () and first.owned_tasks == () and first.worker_url == "http://w1"
    m.on_response(response(1, (), member_id="m-1"), 10)
    assert m.member_id == "m-1" and m.member_epoch == 1 and m.state == State.STABLE
    steady = m.heartbeat_request(20, max_wait_ms=500)
    assert (steady.member_id, steady.member_epoch) == ("m-1", 1)
    assert steady.client_assignors is None and steady.owned_connectors is None
    assert steady.owned_tasks is None and steady.rebalance_timeout_ms == -1 and steady.worker_url is None
    assert steady.max_wait_ms == 500


def test_revoke_before_assign_and_ack_at_once() -> None:
    m = Membership("g", ADS)
    m.join(0)
    m.heartbeat_request(0)
    actions = m.on_response(response(1, ("A", "A/0", "A/1"), member_id="m"), 0)
    assert actions == [Assign(items("A", "A/0", "A/1"))]
    m.assigned_started(items("A", "A/0", "A/1"), 1)
    assert m.state == State.STABLE
    report = m.heartbeat_request(1)
    assert sorted(report.owned_connectors) == ["A"] and len(report.owned_tasks) == 2
    m.on_response(response(1), 2)
    # A response that takes A/1 away and (unusually) adds B: revoke comes first.
    actions = m.on_response(response(2, ("A", "A/0", "B")), 1000)
    assert actions == [Revoke(items("A/1")), Assign(items("B"))]
    m.revoked(items("A/1"), 1001)
    assert m.heartbeat_due(1001), "a revocation is acknowledged at once"
    ack = m.heartbeat_request(1001)
    assert [f"{t.connector}/{t.task}" for t in ack.owned_tasks] == ["A/0"]


def test_fenced_stops_everything_then_rejoins_with_same_id() -> None:
    m = Membership("g", ADS)
    m.join(0)
    m.heartbeat_request(0)
    m.on_response(response(3, ("A", "A/0"), member_id="m"), 0)
    m.assigned_started(items("A", "A/0"), 0)
    m.heartbeat_request(100)
    actions = m.on_response(response(3, error=E.FENCED_MEMBER_EPOCH), 100)
    assert len(actions) == 1 and isinstance(actions[0], Lost)
    assert actions[0].items == items("A", "A/0") and "FENCED_MEMBER_EPOCH" in actions[0].reason
    assert not m.heartbeat_due(10_000), "no rejoin before the lost work is stopped"
    m.revoked(actions[0].items, 200)
    rejoin = m.heartbeat_request(200)
    assert (rejoin.member_id, rejoin.member_epoch) == ("m", 0)
    assert rejoin.owned_connectors == () and rejoin.owned_tasks == () and rejoin.client_assignors


def test_self_fencing_when_the_coordinator_is_unreachable() -> None:
    m = Membership("g", ADS, session_timeout_ms=5000)
    m.join(0)
    m.heartbeat_request(0)
    m.on_response(response(1, ("A",), member_id="m"), 0)
    m.assigned_started(items("A"), 0)
    m.heartbeat_request(1000)
    m.on_failure(1000, backoff_ms=100)
    assert m.check_session(4999) is None
    lost = m.check_session(5000)
    assert lost is not None and lost.items == items("A")


def test_an_assignment_not_yet_started_is_stale_after_the_lease() -> None:
    """Found by the simulator ("zombie-starts-stale-assignment"): a worker frozen past its
    session handled a buffered assignment on waking and started it, although the coordinator
    had handed the items on. Past the lease nothing starts, and the watchdog fences even a
    member that owns nothing yet."""
    m = Membership("g", ADS, session_timeout_ms=5000)
    m.join(0)
    m.heartbeat_request(0)
    m.on_response(response(1, ("A", "A/0"), member_id="m"), 0)  # assigned, nothing started
    assert not m.owned and m.assigned
    assert not m.lease_expired(4999) and m.check_session(4999) is None
    assert m.lease_expired(5000)
    lost = m.check_session(5000)
    assert lost is not None and lost.items == frozenset()
    assert not m.assigned and m.member_epoch == 0  # rejoins, same id, nothing to start


def test_lost_response_resends_everything() -> None:
    m = Membership("g", ADS)
    m.join(0)
    m.heartbeat_request(0)
    m.on_response(response(1, (), member_id="m"), 0)
    m.heartbeat_request(10)
    m.on_failure(10, backoff_ms=50)
    assert not m.heartbeat_due(59) and m.heartbeat_due(60)
    again = m.heartbeat_request(60)
    assert again.client_assignors is not None and again.owned_connectors == () and again.member_epoch == 1


def test_retriable_errors_retry_and_fatal_errors_stop() -> None:
    m = Membership("g", ADS)
    m.join(0)
    m.heartbeat_request(0)
    assert m.on_response(response(0, error=E.COORDINATOR_LOAD_IN_PROGRESS), 0) == []
    assert m.resend_all and m.state == State.JOINING
    m.heartbeat_request(1000)
    actions = m.on_response(response(0, error=E.UNSUPPORTED_ASSIGNOR), 1000)
    assert isinstance(actions[0], Fatal) and m.state == State.FAILED and not m.heartbeat_due(10**9)


def test_leave_requests() -> None:
    m = Membership("g", ADS, instance_id="w-1")
    m.member_id = "m"
    assert m.leave_request().member_epoch == -1
    static = m.leave_request(static=True)
    assert (static.member_epoch, static.instance_id) == (-2, "w-1")
    dynamic = Membership("g", ADS)
    try:
        dynamic.leave_request(static=True)
    except ValueError as exc:
        assert "static" in str(exc)
    else:
        raise AssertionError("a dynamic member cannot leave with -2")


def test_compute_is_signalled() -> None:
    m = Membership("g", ADS)
    m.join(0)
    m.heartbeat_request(0)
    assert m.on_response(response(0, (), member_id="m", compute=True), 0) == [Compute(0)]


# -- a whole group against the real coordinator core ------------------------------------------


def round_robin(group: Any) -> GroupAssignment:
    members = sorted(group.members)
    work = sorted(group.all_items())
    targets: dict[str, set[Item]] = {m: set() for m in members}
    for i, item in enumerate(work):
        targets[members[i % len(members)]].add(item)
    return GroupAssignment({m: MemberTarget(frozenset(t)) for m, t in targets.items()})


class World:
    def __init__(self, connectors: dict[str, int]) -> None:
        ids = itertools.count(1)
        self.core = GroupCoordinator(member_id_factory=lambda: f"m{next(ids)}", strict=True)
        self.now = 0
        self.workers: dict[str, Membership] = {}
        from connect_wire.messages import ConnectGroupAlterConnectorsRequest
        from connect_wire.messages import connect_group_alter_connectors_request_v0 as _a
        self.core.alter_connectors(ConnectGroupAlterConnectorsRequest(
            group_id="g", validate_only=False,
            upserts=tuple(_a.ConnectorSpec(name=n, task_count=c) for n, c in connectors.items()),
        ), 0)
        self.configured = {i for n, c in connectors.items() for i in connector_items(n, c)}

    def add(self, name: str) -> Membership:
        m = Membership("g", ADS, rebalance_timeout_ms=10_000)
        m.join(self.now)
        self.workers[name] = m
        return m

    def step(self) -> None:
        for m in list(self.workers.values()):
            if not m.heartbeat_due(self.now):
                continue
            resp = self.core.heartbeat(m.heartbeat_request(self.now), self.now).response
            for action in m.on_response(resp, self.now):
                if isinstance(action, Revoke | Lost):
                    m.revoked(action.items, self.now)
                elif isinstance(action, Assign):
                    m.assigned_started(action.items, self.now)
                elif isinstance(action, Compute):
                    prep = self.core.prepare_assignment(ConnectGroupPrepareAssignmentRequest(
                        group_id="g", member_id=m.member_id, member_epoch=m.member_epoch), self.now).response
                    assert prep.error_code == 0, prep
                    req = install_request("g", m.member_id, m.member_epoch, prep.group_epoch,
                                          round_robin(group_from_prepare(prep)))
                    assert self.core.install_assignment(req, self.now).response.error_code == 0
            self.check()
        self.now += 100

    def check(self) -> None:
        check_invariants(self.core.state)
        seen: dict[Item, str] = {}
        for name, m in self.workers.items():
            for item in m.owned:
                assert item not in seen, f"{item} run by {seen[item]} and {name}"
                seen[item] = name

    def settle(self, steps: int = 200) -> None:
        for _ in range(steps):
            self.step()
            g = self.core.group("g")
            owned = [i for m in self.workers.values() for i in m.owned]
            if (g is not None and g.state.value == "Stable" and len(owned) == len(self.configured)
                    and set(owned) == self.configured
                    and all(m.owned == m.assigned for m in self.workers.values())):
                return
        raise AssertionError(f"did not converge: {self.core.group('g').state}")


def test_group_converges_and_never_double_runs() -> None:
    w = World({"A": 4, "B": 3})
    w.add("w1")
    w.settle()
    assert len(w.workers["w1"].owned) == 9
    w.add("w2")
    w.settle()
    w.add("w3")
    w.settle()
    sizes = sorted(len(m.owned) for m in w.workers.values())
    assert sizes == [3, 3, 3]
    # w2 leaves cleanly: it stops its work, then sends -1.
    m2 = w.workers.pop("w2")
    m2.revoked(m2.owned, w.now)
    w.core.heartbeat(m2.leave_request(), w.now)
    w.settle()
    assert sorted(len(m.owned) for m in w.workers.values()) == [4, 5]
