"""A test driver for the sans-IO group coordinator.

It plays the runtime: keeps the log of every record written, the timers, a virtual clock; and
after every step it checks the invariants and that replaying the whole log into a fresh state
gives an equal state (and that every record survives the wire codec).

Items are written as strings: ``"A"`` is connector A, ``"A/0"`` its task 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from connect_wire import codec
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator, RequestContext, Result, TimerKey
from coordinator.group.invariants import check_invariants, epochs
from coordinator.group.model import CONNECTOR, Item
from coordinator.group.state import CoordinatorState

REBALANCE_TIMEOUT = 30_000


def item(text: str) -> Item:
    if "/" in text:
        connector, task = text.rsplit("/", 1)
        return Item(connector, int(task))
    return Item(text, CONNECTOR)


def items(texts: Iterable[str]) -> frozenset[Item]:
    return frozenset(item(t) for t in texts)


def names(its: Iterable[Item]) -> list[str]:
    return sorted(str(i) for i in its)


def wire_lists(texts: Iterable[str], task_cls: type) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    its = sorted(items(texts))
    connectors = tuple(i.connector for i in its if i.task == CONNECTOR)
    tasks = tuple(task_cls(connector=i.connector, task=i.task) for i in its if i.task != CONNECTOR)
    return connectors, tasks


def assignor(
    name: str = "incremental", low: int = 0, high: int = 1, version: int | None = None,
    reason: int = 0, metadata: bytes = b"",
) -> Any:
    return _hb.Assignor(
        name=name, minimum_version=low, maximum_version=high, reason=reason,
        metadata_version=high if version is None else version, metadata_bytes=metadata,
    )


def response_items(response: Any) -> list[str] | None:
    """The items of a heartbeat response's Assignment (None when absent)."""
    a = response.assignment
    if a is None:
        return None
    return sorted([*a.connectors, *(f"{t.connector}/{t.task}" for t in a.tasks)])


class Harness:
    def __init__(self, config: GroupCoordinatorConfig | None = None, check: bool = True) -> None:
        counter = itertools.count(1)
        self.coordinator = GroupCoordinator(
            config, member_id_factory=lambda: f"generated-{next(counter)}", strict=True
        )
        self.log: list[Any] = []
        self.now = 0
        self.timers: dict[TimerKey, int] = {}
        self.wakes: list[set[tuple[str, str]]] = []
        self.events: list[Any] = []
        """Every GroupEvent the results carried, in order (what the daemon would log)."""
        self.check_each_step = check
        self.steady_hits = 0
        """Heartbeats the fast path (GroupCoordinator.steady_heartbeat) would have answered."""
        self._epochs = epochs(self.coordinator.state)

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def state(self) -> CoordinatorState:
        return self.coordinator.state

    def group(self, group_id: str = "g") -> Any:
        return self.coordinator.group(group_id)

    def apply(self, result: Result) -> Any:
        self.log.extend(result.records)
        for op in result.timers:
            if op.deadline_ms is None:
                self.timers.pop(op.key, None)
            else:
                self.timers[op.key] = op.deadline_ms
        self.wakes.append(set(result.wake))
        self.events.extend(result.events)
        if self.check_each_step:
            self.check()
        return result.response

    def check(self) -> None:
        check_invariants(self.state, self._epochs)
        self._epochs = epochs(self.state)
        fresh = CoordinatorState()
        for record in self.log:
            fresh.replay(record)
        assert fresh.snapshot() == self.state.snapshot(), "replaying the log gives another state"

    def check_records_encode(self) -> None:
        for key, value in self.log:
            assert codec.decode(type(key), codec.encode(key))[0] == key
            if value is not None:
                assert codec.decode(type(value), codec.encode(value))[0] == value

    def advance(self, ms: int) -> None:
        """Move the clock, firing due timers in deadline order."""
        end = self.now + ms
        while True:
            due = sorted((d, k) for k, d in self.timers.items() if d <= end)
            if not due:
                break
            deadline, key = due[0]
            self.now = max(self.now, deadline)
            del self.timers[key]
            self.apply(self.coordinator.on_timer(key, self.now))
        self.now = end

    # -- requests ---------------------------------------------------------------------------
    def heartbeat(self, member_id: str, epoch: int, group_id: str = "g", **fields: Any) -> Any:
        owned = fields.pop("owned", None)
        principal = fields.pop("principal", None)  # who the member authenticated as
        may_assign = fields.pop("may_assign", True)  # its principal may compute (ACL)
        client_id = fields.pop("client_id", f"client-{member_id}")  # the request header's
        if owned is not None:
            fields["owned_connectors"], fields["owned_tasks"] = wire_lists(owned, _hb.TaskId)
        req = ConnectGroupHeartbeatRequest(
            group_id=group_id, member_id=member_id, member_epoch=epoch, **fields
        )
        ctx = RequestContext(client_id=client_id, client_host="127.0.0.1",
                             may_assign=may_assign,
                             **({"principal": principal} if principal else {}))
        # The daemon answers "steady" heartbeats on a fast path: whenever it would, its answer
        # must be exactly the full handler's, which must write nothing and set the same timer.
        steady = self.coordinator.steady_heartbeat(req, self.now, ctx)
        result = self.coordinator.heartbeat(req, self.now, ctx)
        if steady is not None:
            self.steady_hits += 1
            response, timer = steady
            assert response == result.response, (response, result.response)
            assert not result.records, result.records
            assert [t for t in result.timers if t != timer] == [], (timer, result.timers)
            assert timer in result.timers
            assert not result.wake
            assert not result.events, result.events  # the steady heartbeat stays silent
        return self.apply(result)

    def join(
        self, member_id: str = "", group_id: str = "g", owned: Iterable[str] = (),
        assignors: tuple[Any, ...] | None = None, instance_id: str | None = None,
        rebalance_timeout_ms: int = REBALANCE_TIMEOUT, **fields: Any,
    ) -> Any:
        return self.heartbeat(
            member_id, 0, group_id, owned=list(owned),
            client_assignors=assignors if assignors is not None else (assignor(),),
            instance_id=instance_id, rebalance_timeout_ms=rebalance_timeout_ms, **fields,
        )

    def alter(
        self, upserts: dict[str, int] | None = None, deletes: Iterable[str] = (),
        group_id: str = "g", validate_only: bool = False,
        configs: dict[str, dict[str, str | None]] | None = None,
    ) -> Any:
        req = ConnectGroupAlterConnectorsRequest(
            group_id=group_id,
            upserts=tuple(
                _alter.ConnectorSpec(
                    name=name, task_count=count,
                    config=tuple(
                        _alter.ConfigEntry(name=k, value=v)
                        for k, v in (configs or {}).get(name, {}).items()
                    ),
                )
                for name, count in (upserts or {}).items()
            ),
            deletes=tuple(deletes), validate_only=validate_only,
        )
        return self.apply(self.coordinator.alter_connectors(req, self.now))

    def prepare(self, member_id: str, epoch: int | None = None, group_id: str = "g") -> Any:
        if epoch is None:
            epoch = self.group(group_id).current[member_id].epoch
        req = ConnectGroupPrepareAssignmentRequest(
            group_id=group_id, member_id=member_id, member_epoch=epoch
        )
        return self.apply(self.coordinator.prepare_assignment(req, self.now))

    def install(
        self, member_id: str, assignment: dict[str, Iterable[str]], group_epoch: int,
        epoch: int | None = None, group_id: str = "g", error: int = 0,
        assignor_state: bytes = b"", delay_ms: int = -1,
        kept_for: dict[str, tuple[str | None, Iterable[str]]] | None = None,
    ) -> Any:
        if epoch is None:
            epoch = self.group(group_id).current[member_id].epoch
        members = []
        for mid, its in assignment.items():
            connectors, tasks = wire_lists(its, _inst.TaskId)
            members.append(_inst.MemberAssignment(
                member_id=mid, connectors=connectors, tasks=tasks,
                metadata_version=0, metadata_bytes=b"",
            ))
        kept = []
        for mid, (instance_id, its) in (kept_for or {}).items():
            connectors, tasks = wire_lists(its, _inst.TaskId)
            kept.append(_inst.KeptItems(member_id=mid, instance_id=instance_id,
                                        connectors=connectors, tasks=tasks))
        req = ConnectGroupInstallAssignmentRequest(
            group_id=group_id, member_id=member_id, member_epoch=epoch, group_epoch=group_epoch,
            error=error, assignor_state=assignor_state, scheduled_rebalance_delay_ms=delay_ms,
            members=tuple(members), kept_for=tuple(kept),
        )
        return self.apply(self.coordinator.install_assignment(req, self.now))

    def assigner(self, group_id: str = "g") -> str | None:
        comp = self.group(group_id).soft.computation
        return comp.member_id if comp is not None else None

    def compute(
        self, assignment: dict[str, Iterable[str]], group_id: str = "g", **kw: Any
    ) -> Any:
        """The chosen member prepares and installs ``assignment``."""
        chosen = self.assigner(group_id)
        assert chosen is not None, "no member is chosen to compute the assignment"
        prepared = self.prepare(chosen, group_id=group_id)
        assert prepared.error_code == 0, prepared
        response = self.install(chosen, assignment, prepared.group_epoch, group_id=group_id, **kw)
        assert response.error_code == 0, response
        return prepared

    def describe(self, *group_ids: str, now_ms: int | None = None) -> Any:
        """Describe at ``now_ms`` (the harness clock unless given)."""
        return self.coordinator.describe(ConnectGroupDescribeRequest(group_ids=group_ids or ("g",)),
                                         self.now if now_ms is None else now_ms)

    # -- views ------------------------------------------------------------------------------
    def current(self, member_id: str, group_id: str = "g") -> tuple[int, list[str]]:
        cur = self.group(group_id).current[member_id]
        return cur.epoch, names(cur.assigned)

    def target(self, member_id: str, group_id: str = "g") -> list[str]:
        return names(self.group(group_id).target_items(member_id))
