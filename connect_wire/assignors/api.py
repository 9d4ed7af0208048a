"""The client-side assignor interface (seed 000 "Client side API", in Python), and the
conversions between the wire (PrepareAssignment / InstallAssignment) and its plain values.

An assignor is pure: :meth:`Assignor.assign` takes a :class:`GroupSpec` — what
PrepareAssignment returned: every member with its current target and owned items, every
connector and its task count, the assignor state saved by the last install, the coordinator's
clock — and returns a :class:`GroupAssignment`: a target per member, an error, the new assignor
state (persisted by the coordinator, so it survives a change of the computing worker) and an
optional delay after which the coordinator starts a new computation. No I/O, no clock: time is
``GroupSpec.coordinator_time_ms``.

Items may be left unassigned only together with ``scheduled_rebalance_delay_ms >= 0`` (the
coordinator rejects anything else with INVALID_ASSIGNMENT): that is how work is held for a
departed worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from connect_wire.items import EMPTY, Item, connector_items, items_from_wire, split_items
from connect_wire.messages import (
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst


@dataclass(frozen=True)
class AssignorMetadata:
    """What a worker advertises for an assignor in its heartbeat (``Assignor`` on the wire)."""

    reason: int = 0
    version: int = 0
    data: bytes = b""


@dataclass(frozen=True)
class MemberSpec:
    member_id: str
    member_epoch: int = 0
    instance_id: str | None = None
    worker_url: str | None = None
    reason: int = 0
    metadata_version: int = 0
    metadata: bytes = b""
    target: frozenset[Item] = EMPTY
    owned: frozenset[Item] = EMPTY


@dataclass(frozen=True)
class GroupSpec:
    group_epoch: int
    assignment_epoch: int
    coordinator_time_ms: int
    connectors: Mapping[str, int]  # name -> task count
    members: Mapping[str, MemberSpec]
    assignor_state: bytes = b""
    connector_configs: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)

    def all_items(self) -> frozenset[Item]:
        return frozenset(i for name, n in self.connectors.items() for i in connector_items(name, n))


@dataclass(frozen=True)
class MemberTarget:
    items: frozenset[Item] = EMPTY
    metadata_version: int = 0
    metadata: bytes = b""


@dataclass(frozen=True)
class GroupAssignment:
    members: Mapping[str, MemberTarget]
    error: int = 0
    assignor_state: bytes = b""
    scheduled_rebalance_delay_ms: int = -1
    kept_for: Mapping[str, tuple[str | None, frozenset[Item]]] = field(default_factory=dict)
    """Departed member id -> (its instance id, the items left unassigned for it until the
    scheduled rebalance): shown to operators (``groups describe``, ``connectors status``)."""


@dataclass(frozen=True)
class MemberAssignmentInfo:
    """What a member was given, for :meth:`Assignor.on_assignment`."""

    member_epoch: int
    items: frozenset[Item]
    error: int = 0
    metadata_version: int = 0
    metadata: bytes = b""


@runtime_checkable
class Assignor(Protocol):
    name: str
    minimum_version: int
    maximum_version: int

    def metadata(self) -> AssignorMetadata: ...

    def assign(self, group: GroupSpec) -> GroupAssignment: ...

    def on_assignment(self, assignment: MemberAssignmentInfo) -> None: ...


def group_from_prepare(resp: ConnectGroupPrepareAssignmentResponse) -> GroupSpec:
    """The assignor's input from a PrepareAssignment response."""
    members = {
        m.member_id: MemberSpec(
            member_id=m.member_id, member_epoch=m.member_epoch, instance_id=m.instance_id,
            worker_url=m.worker_url, reason=m.reason, metadata_version=m.metadata_version,
            metadata=m.metadata_bytes,
            target=items_from_wire(m.target_connectors, m.target_tasks),
            owned=items_from_wire(m.owned_connectors, m.owned_tasks),
        )
        for m in resp.members
    }
    return GroupSpec(
        group_epoch=resp.group_epoch, assignment_epoch=resp.assignment_epoch,
        coordinator_time_ms=resp.coordinator_time_ms,
        connectors={c.name: c.task_count for c in resp.connectors},
        members=members, assignor_state=resp.assignor_state,
        connector_configs={c.name: {e.name: e.value for e in c.config} for c in resp.connectors},
    )


def install_request(
    group_id: str, member_id: str, member_epoch: int, group_epoch: int, result: GroupAssignment
) -> ConnectGroupInstallAssignmentRequest:
    """The InstallAssignment request carrying an assignor's result."""
    members: list[Any] = []
    for mid, target in sorted(result.members.items()):
        connectors, tasks = split_items(target.items)
        members.append(_inst.MemberAssignment(
            member_id=mid, connectors=tuple(connectors),
            tasks=tuple(_inst.TaskId(connector=t.connector, task=t.task) for t in tasks),
            metadata_version=target.metadata_version, metadata_bytes=target.metadata,
        ))
    kept: list[Any] = []
    for mid, (instance_id, items) in sorted(result.kept_for.items()):
        connectors, tasks = split_items(items)
        kept.append(_inst.KeptItems(
            member_id=mid, instance_id=instance_id, connectors=tuple(connectors),
            tasks=tuple(_inst.TaskId(connector=t.connector, task=t.task) for t in tasks)))
    return ConnectGroupInstallAssignmentRequest(
        group_id=group_id, member_id=member_id, member_epoch=member_epoch,
        group_epoch=group_epoch, error=result.error, assignor_state=result.assignor_state,
        scheduled_rebalance_delay_ms=result.scheduled_rebalance_delay_ms, members=tuple(members),
        kept_for=tuple(kept),
    )
