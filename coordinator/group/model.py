"""The connect group data model (seed 000 "Data Model"), as plain values.

A unit of work is an *item*: ``(connector, -1)`` is the connector itself, ``(connector, i)`` is
its task ``i``. One set type for both keeps the reconciliation rules written once; the wire
keeps its two lists (``Connectors``, ``Tasks``) and :func:`items_from_wire` /
:func:`split_items` convert.

Durable state lives in :class:`Group` and only changes by replaying records
(``coordinator.group.state``). Everything a :class:`Group` holds that is not derived from
records is in :class:`SoftState` and is rebuilt (with fresh deadlines) after a load.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

# Re-exported (``X as X``): the model's vocabulary, imported from here by the group core.
from connect_wire.items import CONNECTOR as CONNECTOR
from connect_wire.items import EMPTY as EMPTY
from connect_wire.items import Item as Item
from connect_wire.items import connector_items as connector_items
from connect_wire.items import items_from_wire as items_from_wire
from connect_wire.items import split_items as split_items

ANONYMOUS = "User:ANONYMOUS"
"""The principal of a request that was not authenticated (Kafka's ``User:ANONYMOUS``): the
group records who computes assignments by principal, the transport sets it
(coordinator.security re-exports it)."""


class MemberState(enum.IntEnum):
    """A member's reconciliation state (docs/protocol.md ``MemberState``)."""

    STABLE = 0
    UNREVOKED_ITEMS = 1
    UNRELEASED_ITEMS = 2

    @property
    def label(self) -> str:
        return {0: "Stable", 1: "UnrevokedItems", 2: "UnreleasedItems"}[self.value]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class AssignorSpec:
    """One client-side assignor a worker supports (docs/protocol.md ``Assignor``)."""

    name: str
    minimum_version: int
    maximum_version: int
    reason: int
    metadata_version: int
    metadata_bytes: bytes


@dataclass(frozen=True, slots=True)
class ConnectorSpec:
    name: str
    task_count: int
    config: tuple[tuple[str, str | None], ...] = ()
    incarnation: int = 0

    def items(self) -> list[Item]:
        return connector_items(self.name, self.task_count)


TaskConfig = tuple[tuple[str, str | None], ...]
"""One task's own configuration entries, in the order the connector instance wrote them."""


@dataclass(frozen=True, slots=True)
class TaskConfigs:
    """The task configs a connector instance wrote (record ``ConnectorTaskConfigs``), for the
    connector's ``incarnation`` (a record of another incarnation is garbage: ignored)."""

    incarnation: int
    configs: tuple[TaskConfig, ...]


def running_task_count(spec: ConnectorSpec, written: TaskConfigs | None) -> int:
    """How many tasks of ``spec`` run: the length of the task configs its connector instance
    wrote for this incarnation, at most the configured count; the configured count before any
    was written."""
    if written is None or written.incarnation != spec.incarnation:
        return spec.task_count
    return min(len(written.configs), spec.task_count)


def item_count(connectors: Iterable[ConnectorSpec]) -> int:
    """How many items (each connector plus its tasks) the connectors configure, without building
    them (what ``group.connect.max.tasks`` bounds)."""
    return sum(1 + max(c.task_count, 0) for c in connectors)


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    """What a worker told the coordinator about itself (record ``GroupMember``)."""

    member_id: str
    instance_id: str | None
    worker_url: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    assignors: tuple[AssignorSpec, ...]
    classic: ClassicMember | None = None
    """A member of the classic protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup): its
    session timeout and protocols; None for a member of the new protocol."""


@dataclass(frozen=True, slots=True)
class ClassicMember:
    """What a classic member's latest JoinGroup said (record ``GroupMember``'s tagged fields)."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    """(name, worker metadata) of the Connect protocols it offered, in its order of preference
    (only the names this coordinator knows: sessioned, compatible, default)."""

    @property
    def protocol(self) -> str:
        """The protocol it uses: its most preferred one (as Kafka's consumer groups answer a
        classic member: its own first protocol, not a group-wide vote)."""
        return self.protocols[0][0]

    @property
    def metadata(self) -> bytes:
        return self.protocols[0][1]


@dataclass(frozen=True, slots=True)
class CurrentAssignment:
    """A member's current epoch and assignment (record ``CurrentMemberAssignment``).

    ``assigned`` is what the member may run now; ``revoking`` what it must give up. Both count
    as owned by the member until it reports that it released them.
    """

    epoch: int
    previous_epoch: int
    state: MemberState
    assigned: frozenset[Item]
    revoking: frozenset[Item]
    metadata_version: int = 0
    metadata_bytes: bytes = b""
    tokens: Mapping[Item, int] = field(default_factory=dict, hash=False)
    """The fencing token of each owned item (assigned and revoking): given when the item
    entered the member's owned set (a grant), kept while it stays there."""

    @property
    def owned(self) -> frozenset[Item]:
        return self.assigned | self.revoking


NEW_MEMBER_ASSIGNMENT = CurrentAssignment(0, 0, MemberState.STABLE, EMPTY, EMPTY)

HELD_EPOCH = -3
"""The epoch of a *hold*: the current assignment a fenced member leaves behind (its member
record is gone). Its items stay owned (``revoking``) until the member's stops must have ended,
so nobody else starts them while the fenced worker may still run them; ``previous_epoch`` holds
how long, in ms, from the moment the hold was written (a reload holds that long again)."""


def is_hold(cur: CurrentAssignment) -> bool:
    return cur.epoch == HELD_EPOCH


@dataclass(frozen=True, slots=True)
class TargetMember:
    """A member's target assignment (record ``TargetAssignmentMember``)."""

    items: frozenset[Item]
    metadata_version: int = 0
    metadata_bytes: bytes = b""


EMPTY_TARGET = TargetMember(EMPTY)



@dataclass(frozen=True)
class KeptFor:
    """Items an install left unassigned for a departed member until the scheduled rebalance
    (the assignor says so; the coordinator only shows it to operators)."""

    member_id: str
    instance_id: str | None
    items: frozenset[Item]

@dataclass
class Computation:
    """The assignment computation in flight (soft state: restarted after a load)."""

    member_id: str
    notified: bool = False
    deadline_ms: int | None = None
    prepared_epoch: int | None = None
    prepared_members: frozenset[str] = EMPTY  # type: ignore[assignment]
    prepared_items: frozenset[Item] = EMPTY
    chosen_at_ms: int = 0  # when the member was chosen (for the log's durations)
    prepared_at_ms: int | None = None  # when it last prepared for a new epoch


class AssignorIndex:
    """The members' client assignors, aggregated per assignor name (a derived index, kept by
    replay as member records come and go), so that choosing the group's assignor and its
    eligible computing members costs O(assignors of one member), never O(members): a join, a
    leave or an epoch bump no longer rescans the group.

    Per name: how many members list it, the sum of its positions in their lists (the
    precedence rule of :func:`coordinator.group.coordinator.select_assignor`), their minimum and
    maximum versions (sorted), and the members by exact version range (the eligible members
    are exactly those whose range is [lowest minimum, highest maximum])."""

    __slots__ = ("count", "rank", "mins", "maxs", "by_range")

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.rank: dict[str, int] = {}
        self.mins: dict[str, SortedList[int]] = {}
        self.maxs: dict[str, SortedList[int]] = {}
        self.by_range: dict[str, dict[tuple[int, int], dict[str, None]]] = {}

    def add(self, m: MemberMetadata) -> None:
        for position, a in enumerate(m.assignors):
            name = a.name
            if name in self.count:
                self.count[name] += 1
                self.rank[name] += position
                self.mins[name].add(a.minimum_version)
                self.maxs[name].add(a.maximum_version)
            else:
                self.count[name] = 1
                self.rank[name] = position
                self.mins[name] = SortedList((a.minimum_version,))
                self.maxs[name] = SortedList((a.maximum_version,))
                self.by_range[name] = {}
            self.by_range[name].setdefault(
                (a.minimum_version, a.maximum_version), {})[m.member_id] = None

    def remove(self, m: MemberMetadata) -> None:
        for position, a in enumerate(m.assignors):
            name = a.name
            if self.count[name] == 1:
                del self.count[name], self.rank[name], self.mins[name], self.maxs[name]
                del self.by_range[name]
                continue
            self.count[name] -= 1
            self.rank[name] -= position
            self.mins[name].remove(a.minimum_version)
            self.maxs[name].remove(a.maximum_version)
            key = (a.minimum_version, a.maximum_version)
            ranged = self.by_range[name][key]
            del ranged[m.member_id]
            if not ranged:
                del self.by_range[name][key]

    def select(self, members: int, some: MemberMetadata | None) -> str | None:
        """The assignor every one of ``members`` members lists, by precedence (``some``: any
        one of them: a common name is one of its names)."""
        if some is None:
            return None
        count, rank = self.count, self.rank
        common = [a.name for a in some.assignors if count.get(a.name) == members]
        return min(common, key=lambda name: (rank[name], name)) if common else None

    def eligible(self, name: str, barred: Iterable[MemberMetadata] = ()) -> dict[str, None]:
        """The members whose version range of ``name`` covers every member's range, leaving
        the ``barred`` members (and their ranges) out: O(barred)."""
        mins, maxs = self.mins.get(name), self.maxs.get(name)
        if not mins or not maxs:
            return {}
        skip_min: dict[int, int] = {}
        skip_max: dict[int, int] = {}
        out: set[str] = set()
        for m in barred:
            a = next((a for a in m.assignors if a.name == name), None)
            if a is not None:
                skip_min[a.minimum_version] = skip_min.get(a.minimum_version, 0) + 1
                skip_max[a.maximum_version] = skip_max.get(a.maximum_version, 0) + 1
                out.add(m.member_id)
        low = _first_kept(mins, skip_min, reverse=False)
        high = _first_kept(maxs, skip_max, reverse=True)
        if low is None or high is None:
            return {}
        ranged = self.by_range[name].get((low, high), {})
        return {mid: None for mid in ranged if mid not in out} if out else ranged


def _first_kept(values: SortedList[int], skip: dict[int, int], reverse: bool) -> int | None:
    """The first of ``values`` (the last with ``reverse``) once ``skip[v]`` occurrences of each
    ``v`` are left out."""
    left = dict(skip)
    for v in (reversed(values) if reverse else values):
        if left.get(v, 0) > 0:
            left[v] -= 1
            continue
        return v
    return None


@dataclass
class SoftState:
    """Per-group state that is not in the log: deadlines, caches, the computation in flight."""

    session_deadline: dict[str, int] = field(default_factory=dict)
    rebalance_deadline: dict[str, tuple[int, int]] = field(default_factory=dict)  # (epoch, at)
    reported_owned: dict[str, tuple[frozenset[Item] | None, frozenset[Item] | None]] = field(
        default_factory=dict
    )  # member -> (connectors, tasks) last reported
    computation: Computation | None = None
    last_assigner: str | None = None
    assigner_error: str | None = None  # e.g. NO_ASSIGNOR_COVERS_GROUP explanation
    selection_epoch: int = -1  # group epoch the cached selection below was computed for
    selected_assignor: str | None = None
    eligible: dict[str, None] = field(default_factory=dict)  # members able to compute
    barred_assigners: set[str] = field(default_factory=set)  # did not compute in time: not
    # chosen again while they stay members, their version ranges left out of eligibility
    barred_principals: set[str] = field(default_factory=set)  # principals of such members
    unauthorized_assigners: set[str] = field(default_factory=set)  # may not compute (their
    # principal lacks authorizer.assign.operation on the group, as of their latest full
    # heartbeat): never chosen, their version ranges left out of eligibility
    principals: dict[str, str] = field(default_factory=dict)  # member -> authenticated
    # principal (ANONYMOUS ones not kept)
    dirty: set[str] = field(default_factory=set)  # members whose assignment has stale items
    empty_since_ms: int | None = None
    hold_deadline: dict[str, int] = field(default_factory=dict)  # fenced member -> release at
    last_heartbeat: dict[str, int] = field(default_factory=dict)  # member -> wall-clock ms of
    # its latest heartbeat (for describe; unknown after a load until it heartbeats again)
    hold_instance: dict[str, str | None] = field(default_factory=dict)  # fenced member -> its
    # instance id (for describe and the log; unknown after a load)
    instance_states: dict[str, dict[Item, tuple[str, str | None, str | None]]] = field(
        default_factory=dict
    )  # member -> item -> (state, error, trace) as last reported (Status): memory only,
    # never in records (a new coordinator learns them again from the workers' full heartbeats)
    classic_join_deadline: dict[str, int] = field(default_factory=dict)
    """Classic member -> when it is fenced unless it rejoins (armed when it is told
    REBALANCE_IN_PROGRESS: its rebalance timeout)."""
    classic_sync_deadline: dict[str, int] = field(default_factory=dict)
    """Classic member -> when it is fenced unless it sends SyncGroup (armed by its JoinGroup)."""
    rebalance_started: tuple[int, int] | None = None
    """(wall-clock ms, group epoch) of the bump that started the rebalance in progress; None
    while the group is Stable or Empty (for the ``rebalance completed`` event's duration)."""


@dataclass
class Group:
    """One connect group: durable fields (from records) plus derived indexes."""

    group_id: str
    epoch: int = 0
    connectors_epoch: int = 0
    connectors: dict[str, ConnectorSpec] = field(default_factory=dict)
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    current: dict[str, CurrentAssignment] = field(default_factory=dict)
    target: dict[str, TargetMember] = field(default_factory=dict)
    assignment_epoch: int = 0
    assignment_error: int = 0
    assignor_state: bytes = b""
    scheduled_rebalance_at_ms: int = -1
    kept_for: tuple[KeptFor, ...] = ()  # (TargetAssignmentMetadata's KeptFor)
    configs: dict[str, str | None] = field(default_factory=dict)
    has_metadata: bool = False  # a GroupMetadata record exists
    has_target_metadata: bool = False
    offsets: dict[str, dict[str, str]] = field(default_factory=dict)
    """connector -> source partition -> offset (canonical JSON), of the connector's live
    incarnation (records ``ConnectorOffset``): a commit touches only its own partitions."""
    offset_garbage: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)
    """connector -> partition -> (incarnation, offset): offset records of a deleted connector
    (or an older incarnation of it) not yet tombstoned; never served, removed in batches."""
    offset_bytes: dict[str, int] = field(default_factory=dict)
    """connector -> the UTF-8 bytes of its live partitions and offsets together (a derived
    total kept by replay, what ``group.connect.offsets.max.bytes`` bounds)."""
    token_ceiling: int = 0  # fencing tokens up to this may have been given (GroupMetadata)
    task_configs: dict[str, TaskConfigs] = field(default_factory=dict)  # connector -> written
    # -- derived indexes, maintained by replay ------------------------------------------------
    owner: dict[Item, str] = field(default_factory=dict)  # item -> member owning it (current)
    target_owner: dict[Item, str] = field(default_factory=dict)  # item -> member (target)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    classic_members: dict[str, None] = field(default_factory=dict)  # members of the classic
    # protocol (JoinGroup/SyncGroup/Heartbeat)
    unreconciled: set[str] = field(default_factory=set)
    configured: set[Item] = field(default_factory=set)
    assignors: AssignorIndex = field(default_factory=AssignorIndex)
    # -- soft state -----------------------------------------------------------------------------
    token_counter: int | None = None
    """The last fencing token given (None: none given since the load; the next is above
    ``token_ceiling``). Never behind a token handed out, never above the durable ceiling."""
    soft: SoftState = field(default_factory=SoftState)

    def durable(self) -> dict[str, Any]:
        """Everything derived from records (for equality checks after replay)."""
        return {
            "group_id": self.group_id,
            "epoch": self.epoch,
            "connectors_epoch": self.connectors_epoch,
            "connectors": dict(self.connectors),
            "members": dict(self.members),
            "current": dict(self.current),
            "target": dict(self.target),
            "assignment_epoch": self.assignment_epoch,
            "assignment_error": self.assignment_error,
            "assignor_state": self.assignor_state,
            "scheduled_rebalance_at_ms": self.scheduled_rebalance_at_ms,
            "kept_for": self.kept_for,
            "configs": dict(self.configs),
            "has_metadata": self.has_metadata,
            "has_target_metadata": self.has_target_metadata,
            "offsets": {c: dict(p) for c, p in self.offsets.items()},
            "offset_garbage": {c: dict(p) for c, p in self.offset_garbage.items()},
            "offset_bytes": dict(self.offset_bytes),
            "token_ceiling": self.token_ceiling,
            "task_configs": dict(self.task_configs),
            "owner": dict(self.owner),
            "target_owner": dict(self.target_owner),
            "static_members": dict(self.static_members),
            "classic_members": dict(self.classic_members),
            "unreconciled": set(self.unreconciled),
            "configured": set(self.configured),
        }

    @property
    def state(self) -> GroupState:
        """Maintained incrementally: O(1), no scan of the members."""
        if not self.members:
            return GroupState.EMPTY
        if self.epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        if self.unreconciled:
            return GroupState.RECONCILING
        return GroupState.STABLE

    def is_reconciled(self, member_id: str) -> bool:
        cur = self.current.get(member_id)
        return (
            cur is not None
            and cur.state == MemberState.STABLE
            and cur.epoch == self.assignment_epoch
        )

    def target_items(self, member_id: str) -> frozenset[Item]:
        t = self.target.get(member_id)
        return t.items if t is not None else EMPTY
