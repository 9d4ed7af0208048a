"""The connect group coordinator: a pure state machine, one instance per log partition (shard).

Theory of operation
-------------------
Rule 1: everything that decides what a connect group does lives in this package. The runtime
around it only moves bytes, writes records to disk and fires timers.

* **Values in, values out.** Each handler takes a request (a generated message class), the
  request's context and ``now_ms``, and returns a :class:`Result`: the response, the records
  to write, timer changes (absolute deadlines) and the members whose parked long-poll heartbeat
  should be re-evaluated. No clock, no I/O, no asyncio.
* **Records are the only way durable state changes.** A handler never mutates a group: it
  *writes* a record, which is replayed into the state at once (so later steps of the same
  handler see it) and remembered with the key's previous value. If the runtime fails to make
  the records durable it calls :meth:`GroupCoordinator.rollback`, which replays those previous
  values in reverse. Loading a partition is replaying its log through the same ``replay``.
* **Three epochs** (seed 000 "Rebalance Process"): the *group epoch* counts changes of the
  group's metadata (members joining, leaving or being fenced, their assignors, connectors and
  task counts); whenever it is ahead of the *assignment epoch*, one member is chosen to compute
  a new target assignment (``ShouldComputeAssignment``, then PrepareAssignment and
  InstallAssignment); each member then reconciles toward its target and reaches the assignment
  epoch as its *member epoch* (``reconciliation.next_assignment``: revoke first, then assign
  what is free).
* **Timers are data.** Session, rebalance (revocation), assignment-computation, scheduled
  rebalance and empty-group expiry deadlines are returned as :class:`TimerOp`; an expiry comes
  back through :meth:`GroupCoordinator.on_timer`. Each handler re-checks its own soft state, so
  a stale or duplicated expiry does nothing.
* **Events are values too.** What an operator wants to read about a group (a member joined,
  left or was fenced and why, the group epoch bumped, who computes a target with which
  assignor and how long it took, an install, a hold starting or ending, a rebalance completing)
  is returned as :class:`GroupEvent` values in the :class:`Result`, next to the records that
  make it true; the runtime logs them once those records are durable (docs/daemon.md "Group
  events"). A steady heartbeat returns none.
* **O(1) steady heartbeat.** A heartbeat from a stable member writes nothing and touches only
  that member: group state is maintained incrementally (``Group.unreconciled``), the assignor
  selection is cached per group epoch.
* **O(1) join.** A join (or leave) never scans the group: the assignor selection, the join's
  version range checks and the eligible assigners come from ``Group.assignors``
  (:class:`~coordinator.group.model.AssignorIndex`, kept by replay).
* **Who computes is bounded.** A member's rebalance timeout may not exceed
  ``group.connect.max.rebalance.timeout.ms``; a chosen member gets at most
  ``group.connect.max.assignment.timeout.ms`` to install, then is barred (with its principal)
  while it stays; a member whose principal may not compute (``RequestContext.may_assign``) is
  never chosen. Client-side assignment trusts the member that computes (docs/security.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from connect_wire import classic_connect as cc
from connect_wire.assignors import (
    EagerAssignor,
    GroupSpec,
    IncrementalCooperativeAssignor,
    MemberSpec,
)
from connect_wire.errors import ErrorCode, error_name
from connect_wire.instance_states import utf8_tail
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterConnectorsResponse,
    ConnectGroupAlterOffsetsRequest,
    ConnectGroupAlterOffsetsResponse,
    ConnectGroupCommitOffsetsRequest,
    ConnectGroupCommitOffsetsResponse,
    ConnectGroupDescribeRequest,
    ConnectGroupDescribeResponse,
    ConnectGroupFetchOffsetsRequest,
    ConnectGroupFetchOffsetsResponse,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
    ConnectGroupWriteTaskConfigsRequest,
    ConnectGroupWriteTaskConfigsResponse,
)
from connect_wire.messages import connect_group_describe_response_v0 as _desc
from connect_wire.messages import connect_group_fetch_offsets_response_v0 as _fetch
from connect_wire.messages import connect_group_heartbeat_response_v0 as _hb
from connect_wire.messages import connect_group_prepare_assignment_response_v0 as _prep
from connect_wire.records import (
    ConnectorOffsetKey,
    ConnectorTaskConfigsKey,
    CurrentMemberAssignmentKey,
    GroupConfigurationKey,
    GroupConnectorsKey,
    GroupMemberKey,
    GroupMetadataKey,
    TargetAssignmentMemberKey,
    TargetAssignmentMetadataKey,
)
from connect_wire.verbs import STOPPED, target_state

from . import classic as cl
from . import records as rec
from .config import (
    MAX_COMMIT_BYTES,
    MAX_OFFSET_BYTES,
    MAX_PARTITIONS,
    MAX_REBALANCE_TIMEOUT,
    GroupCoordinatorConfig,
)
from .model import (
    ANONYMOUS,
    CONNECTOR,
    EMPTY,
    EMPTY_TARGET,
    HELD_EPOCH,
    NEW_MEMBER_ASSIGNMENT,
    AssignorSpec,
    ClassicMember,
    Computation,
    ConnectorSpec,
    CurrentAssignment,
    Group,
    GroupState,
    Item,
    KeptFor,
    MemberMetadata,
    MemberState,
    TargetMember,
    TaskConfigs,
    is_hold,
    item_count,
    items_from_wire,
    running_task_count,
    split_items,
)
from .offsets import OffsetError, changes_from
from .offsets import canonical_object as _canonical_object
from .reconciliation import next_assignment
from .records import assignment_bytes, connectors_log_bytes
from .state import CoordinatorState, ReplayError, offset_entry_bytes
from .validation import (
    cut_client_id,
    validate_assignors,
    validate_connector,
    validate_group_id_size,
    validate_instance_states,
    validate_member_id,
    validate_member_metadata_size,
    validate_report_size,
)

E = ErrorCode

SESSION = "session"
REBALANCE = "rebalance"
COMPUTE = "compute"
SCHEDULED = "scheduled"
EXPIRE = "expire"
HOLD = "hold"
OFFSETS = "offsets"
"""Tombstone the next batch of a group's garbage offsets (deleted connectors'): group-level."""
CLASSIC_JOIN = "classic_join"
"""A classic member told to rejoin that has not: fenced at its rebalance timeout."""
CLASSIC_SYNC = "classic_sync"
"""A classic member that joined and has not sent SyncGroup: fenced at its rebalance timeout."""
OFFSET_DELETE_BATCH = 100
"""Most offset tombstones one write carries (below etcd's default of 128 operations per
transaction; ``max_batch_records`` may lower it)."""

_NEW_INCARNATION = 1 << 62
"""A created connector's incarnation until it is given one (as many bytes in its record)."""

TOKEN_BLOCK = 10_000
"""Fencing tokens reserved at a time: one GroupMetadata record (the new ceiling) per this many
grants in a group."""

TimerKey = tuple[str, str, str]
"""(kind, group id, member id or "")."""


@dataclass(frozen=True)
class TimerOp:
    """Set (``deadline_ms`` given) or cancel (None) the timer ``key``."""

    key: TimerKey
    deadline_ms: int | None


@dataclass(frozen=True)
class RequestContext:
    client_id: str = ""
    client_host: str = ""
    principal: str = ANONYMOUS
    """Who sent the request: ``User:ANONYMOUS``, ``User:<SASL user>`` or
    ``User:<certificate subject>`` (coordinator.security)."""
    listener: str = ""
    """The name of the listener the request came in on ("" outside the server)."""
    may_assign: bool = True
    """Whether the principal may compute the group's assignment (``authorizer.assign.operation``
    on the group): a member that may not is never chosen to compute."""


class GroupEvent(NamedTuple):
    """One fact about a group for the operator's log: ``event`` is its name (``member joined``,
    ``member fenced``, ``group epoch bumped``, ... docs/daemon.md "Group events"), ``fields`` its
    structured context (member id, instance id, epochs, reason, durations in ms). The runtime
    logs it at info once the records of the same :class:`Result` are durable."""

    event: str
    group: str
    fields: dict[str, Any]


FENCE_REASONS = ("session_expired", "stale_member_epoch", "rebalance_timeout",
                 "classic_join_timeout", "classic_sync_timeout", "replaced")
"""``member fenced`` events' ``reason`` (and the fence counter's label): the coordinator removed
the member. A member that leaves itself is ``member left``."""
NAMES_LOGGED = 20
"""At most this many item names in one event (``names``); ``items`` counts them all."""


@dataclass
class Result:
    response: Any = None
    records: list[rec.Record] = field(default_factory=list)
    timers: list[TimerOp] = field(default_factory=list)
    wake: set[tuple[str, str]] = field(default_factory=set)
    undo: list[rec.Record] = field(default_factory=list, repr=False)
    events: list[GroupEvent] = field(default_factory=list)
    """What happened, for the log: only to be logged once ``records`` are durable."""


class _Reject(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Txn:
    """Records written by one handler, applied as they are written, with their inverse."""

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self.records: list[rec.Record] = []
        self.undo: list[rec.Record] = []
        self.timers: list[TimerOp] = []
        self.wake: set[tuple[str, str]] = set()
        self.events: list[GroupEvent] = []
        self.touched: set[str] = set()
        """Groups this handler wrote to (a rebalance may have completed in them)."""

    def write(self, record: rec.Record) -> None:
        previous = self.state.current_record(record.key)
        self.state.replay(record)
        self.undo.append(previous)
        self.records.append(record)
        self.touched.add(record.key.group_id)

    def timer(self, kind: str, group_id: str, member_id: str, deadline_ms: int | None) -> None:
        self.timers.append(TimerOp((kind, group_id, member_id), deadline_ms))

    def rollback(self) -> None:
        for record in reversed(self.undo):
            self.state.replay(record)
        self.records.clear()
        self.undo.clear()
        self.events.clear()

    def result(self, response: Any) -> Result:
        return Result(response, self.records, self.timers, self.wake, self.undo, self.events)


def _forget_strangers(g: Group) -> None:
    """Drop the soft state of member ids that are neither members nor holds of ``g``."""
    soft = g.soft
    for per_member in (soft.session_deadline, soft.rebalance_deadline, soft.reported_owned,
                       soft.instance_states, soft.last_heartbeat, soft.classic_join_deadline,
                       soft.classic_sync_deadline):
        for mid in [m for m in per_member if m not in g.members]:
            del per_member[mid]
    soft.dirty &= set(g.members)
    for per_hold in (soft.hold_deadline, soft.hold_instance):
        for mid in [m for m in per_hold if m not in g.current]:
            del per_hold[mid]


def _uuid_member_id() -> str:
    return str(uuid.uuid4())


_validate_assignors = validate_assignors  # shared with replay (coordinator.group.validation)


def _bounded(text: str | None) -> str | None:
    """A reported error or trace: its last 8 KiB of UTF-8 (connect_wire.instance_states)."""
    return text if text is None else utf8_tail(text)


def _validate_items(connectors: Iterable[str] | None, tasks: Iterable[Any] | None, what: str) -> str | None:
    for c in connectors or ():
        if not c:
            return f"{what}Connectors must not contain an empty name."
    for t in tasks or ():
        if not t.connector:
            return f"{what}Tasks must not contain an empty connector name."
        if t.task < 0:
            return f"{what}Tasks must not contain a negative task id ({t.connector}/{t.task})."
    return None


def validate_heartbeat(req: ConnectGroupHeartbeatRequest) -> str | None:
    """The INVALID_REQUEST message for a malformed heartbeat, or None (seed 000's rules)."""
    epoch = req.member_epoch
    if not req.group_id:
        return "GroupId must be non-empty."
    if epoch < -2:
        return "MemberEpoch must be >= -2."
    if epoch != 0 and not req.member_id:
        return "MemberId must be non-empty unless MemberEpoch is 0."
    if problem := validate_member_id(req.member_id):
        return problem
    if req.instance_id is not None and not req.instance_id:
        return "InstanceId, if provided, must be non-empty."
    if epoch == -2 and req.instance_id is None:
        return "MemberEpoch -2 (a static member leaving for a while) requires an InstanceId."
    if req.rebalance_timeout_ms != -1 and req.rebalance_timeout_ms <= 0:
        return "RebalanceTimeoutMs must be -1 (unchanged) or larger than zero."
    if req.max_wait_ms < 0:
        return "MaxWaitMs must be >= 0."
    if epoch == 0:
        if req.rebalance_timeout_ms <= 0:
            return "RebalanceTimeoutMs must be larger than zero in the first heartbeat request."
        if not req.client_assignors:
            return "ClientAssignors must be non-empty in the first heartbeat request."
        if req.owned_connectors is None or req.owned_tasks is None:
            return "OwnedConnectors and OwnedTasks must be non-null in the first heartbeat request."
    if req.client_assignors is not None:
        if not req.client_assignors:
            return "ClientAssignors, if provided, must be non-empty."
        problem = _validate_assignors(req.client_assignors)
        if problem:
            return problem
    return (_validate_items(req.owned_connectors, req.owned_tasks, "Owned")
            or validate_instance_states(req.instance_states or ())
            or validate_member_metadata_size(req.client_assignors, req.worker_url, req.instance_id))


def _assignors_from(req_assignors: Iterable[Any]) -> tuple[AssignorSpec, ...]:
    return tuple(
        AssignorSpec(
            name=a.name,
            minimum_version=a.minimum_version,
            maximum_version=a.maximum_version,
            reason=a.reason,
            metadata_version=a.metadata_version,
            metadata_bytes=a.metadata_bytes,
        )
        for a in req_assignors
    )


def _ranges_overlap(a: AssignorSpec, b: AssignorSpec) -> bool:
    return a.minimum_version <= b.maximum_version and b.minimum_version <= a.maximum_version


def _without(values: Sequence[int], value: int | None, first: bool) -> int:
    """The smallest (``first``) or largest of a sorted list with one occurrence of ``value``
    (None: nothing) taken out; the list holds at least one more value."""
    end = 0 if first else -1
    if value is None or values[end] != value:
        return values[end]
    return values[1 if first else -2]


def select_assignor(members: Iterable[MemberMetadata]) -> str | None:
    """The client-side assignor every member supports, honouring the members' precedence.

    Candidates are the names every member lists; the winner has the smallest sum of positions
    in the members' lists (ties: name). With one common order this is the first common one.
    """
    members = list(members)
    if not members:
        return None
    common: set[str] | None = None
    for m in members:
        names = {a.name for a in m.assignors}
        common = names if common is None else common & names
    if not common:
        return None
    rank = {name: 0 for name in common}
    for m in members:
        for position, a in enumerate(m.assignors):
            if a.name in rank:
                rank[a.name] += position
    return min(common, key=lambda name: (rank[name], name))


def eligible_assigners(members: Iterable[MemberMetadata], assignor: str) -> list[str]:
    """Members whose [min, max] version range of ``assignor`` covers every member's range.

    Seed 000: A[1-5], B[3-4], C[2-4] -> A.
    """
    specs: dict[str, AssignorSpec] = {}
    for m in members:
        for a in m.assignors:
            if a.name == assignor:
                specs[m.member_id] = a
    if not specs:
        return []
    low = min(a.minimum_version for a in specs.values())
    high = max(a.maximum_version for a in specs.values())
    return sorted(
        mid for mid, a in specs.items() if a.minimum_version <= low and a.maximum_version >= high
    )


class GroupCoordinator:
    """The connect group state machine for the groups of one partition."""

    def __init__(
        self,
        config: GroupCoordinatorConfig | None = None,
        member_id_factory: Callable[[], str] = _uuid_member_id,
        state: CoordinatorState | None = None,
        strict: bool = False,
    ) -> None:
        self.config = config or GroupCoordinatorConfig()
        self.new_member_id = member_id_factory
        self.state = state or CoordinatorState()
        self._default_timeouts = self.config.for_group({})
        self._steady_responses: dict[tuple[int, int], Any] = {}
        self.strict = strict
        """Re-raise internal errors instead of answering UNKNOWN_SERVER_ERROR (tests)."""

    # == public API =================================================================================
    def replay(self, record: rec.Record) -> None:
        """Apply one record of the log (loading)."""
        self.state.replay(record)

    def rollback(self, result: Result) -> None:
        """Undo ``result``'s records (its write failed), and forget the soft state the handler
        kept of members its records would have made (a join that could not be logged left its
        session, owned lists and states behind, for a member that never was)."""
        for record in reversed(result.undo):
            self.state.replay(record)
        for group_id in {r.key.group_id for r in result.records}:
            g = self.state.groups.get(group_id)
            if g is not None:
                _forget_strangers(g)

    def group(self, group_id: str) -> Group | None:
        return self.state.groups.get(group_id)

    def heartbeat(
        self,
        req: ConnectGroupHeartbeatRequest,
        now_ms: int,
        ctx: RequestContext = RequestContext(),
    ) -> Result:
        problem = validate_heartbeat(req)
        if (cut := cut_client_id(ctx.client_id)) is not ctx.client_id:
            ctx = replace(ctx, client_id=cut)
        if problem is None and req.rebalance_timeout_ms > self.config.max_rebalance_timeout_ms:
            problem = (f"RebalanceTimeoutMs {req.rebalance_timeout_ms} is larger than "
                       f"{MAX_REBALANCE_TIMEOUT}={self.config.max_rebalance_timeout_ms}.")
        if problem:
            return Result(self._hb_error(E.INVALID_REQUEST, problem, req))
        return self._run(lambda txn: self._heartbeat(txn, req, now_ms, ctx),
                         lambda code, msg: self._hb_error(code, msg, req), now_ms)

    def steady_heartbeat(
        self,
        req: ConnectGroupHeartbeatRequest,
        now_ms: int,
        ctx: RequestContext = RequestContext(),
    ) -> tuple[Any, TimerOp] | None:
        """The answer to a heartbeat that changes nothing, or None if it may change something.

        The common case of a stable group: a member at the group's assignment epoch, Stable,
        sending every optional field null, in a group with nothing to compute. Such a heartbeat
        writes no record; it only extends the session. Answering it here is exactly what
        :meth:`heartbeat` would answer (tests check the two agree), without the transaction,
        the reconciliation or the response's assignment; anything else returns None and must
        go through :meth:`heartbeat`. Returns the response and the session timer to set.
        """
        if (cut := cut_client_id(ctx.client_id)) is not ctx.client_id:
            ctx = replace(ctx, client_id=cut)
        epoch = req.member_epoch
        if (epoch <= 0 or req.rebalance_timeout_ms != -1 or req.client_assignors is not None
                or req.owned_connectors is not None or req.owned_tasks is not None
                or req.worker_url is not None or req.max_wait_ms < 0 or not req.group_id
                or req.instance_states):  # (a state report: kept by the full handler)
            return None
        g = self.state.groups.get(req.group_id)
        if g is None or g.epoch > g.assignment_epoch:
            return None
        member_id = req.member_id
        m = g.members.get(member_id)
        if m is None or m.classic is not None:
            return None
        soft = g.soft
        if soft.computation is not None or member_id in soft.dirty:
            return None
        cur = g.current[member_id]
        if cur.epoch != epoch or epoch != g.assignment_epoch or cur.state != MemberState.STABLE:
            return None
        instance_id = req.instance_id
        if instance_id is not None and (not instance_id or m.instance_id != instance_id):
            return None
        # _update_member would write a member record if the client's id or address changed.
        if ((ctx.client_id and ctx.client_id != m.client_id)
                or (ctx.client_host and ctx.client_host != m.client_host)):
            return None
        session_ms, interval_ms = (
            self.config.for_group(g.configs) if g.configs else self._default_timeouts)
        deadline = now_ms + session_ms
        soft.session_deadline[member_id] = deadline
        soft.last_heartbeat[member_id] = now_ms
        # Responses are immutable and the same for every member at this epoch and interval.
        response = self._steady_responses.get((epoch, interval_ms))
        if response is None:
            if len(self._steady_responses) >= 1024:
                self._steady_responses.clear()
            response = self._steady_responses[(epoch, interval_ms)] = ConnectGroupHeartbeatResponse(
                member_id=None, member_epoch=epoch, heartbeat_interval_ms=interval_ms,
                should_compute_assignment=False, assignment=None,
            )
        return response, TimerOp((SESSION, g.group_id, member_id), deadline)

    def must_revoke(self, group_id: str, member_id: str) -> bool:
        """Does the member hold items its target no longer gives it (a revocation is due)?"""
        g = self.state.groups.get(group_id)
        cur = g.current.get(member_id) if g is not None else None
        if g is None or cur is None or not cur.assigned:
            return False
        return not cur.assigned <= g.target.get(member_id, EMPTY_TARGET).items

    def prepare_assignment(self, req: ConnectGroupPrepareAssignmentRequest, now_ms: int) -> Result:
        return self._run(
            lambda txn: self._prepare(txn, req, now_ms),
            lambda code, msg: ConnectGroupPrepareAssignmentResponse(
                error_code=code, error_message=msg, group_epoch=-1, assignment_epoch=-1,
                assignor_name="", coordinator_time_ms=now_ms, assignor_state=b"",
            ),
            now_ms,
        )

    def install_assignment(self, req: ConnectGroupInstallAssignmentRequest, now_ms: int) -> Result:
        return self._run(
            lambda txn: self._install(txn, req, now_ms),
            lambda code, msg: ConnectGroupInstallAssignmentResponse(
                error_code=code, error_message=msg
            ),
            now_ms,
        )

    def alter_connectors(self, req: ConnectGroupAlterConnectorsRequest, now_ms: int) -> Result:
        return self._run(
            lambda txn: self._alter_connectors(txn, req, now_ms),
            lambda code, msg: ConnectGroupAlterConnectorsResponse(
                error_code=code, error_message=msg, group_epoch=-1
            ),
            now_ms,
        )

    def write_task_configs(self, req: ConnectGroupWriteTaskConfigsRequest, now_ms: int) -> Result:
        return self._run(
            lambda txn: self._write_task_configs(txn, req, now_ms),
            lambda code, msg: ConnectGroupWriteTaskConfigsResponse(
                error_code=code, error_message=msg, changed=False, group_epoch=-1),
            now_ms,
        )

    def alter_group_config(
        self, group_id: str, configs: dict[str, str | None], now_ms: int,
        validate_only: bool = False,
    ) -> Result:
        """Set a group's dynamic configs (a value of None: back to the default). The whole
        resulting set is validated (an override checked with the group's other overrides);
        ``validate_only`` writes nothing. A group that does not exist yet is created by a SET
        (its overrides are records of it) and kept while it has overrides, as Kafka keeps a
        group's configs apart from the group. Response: (code, message)."""
        def run(txn: _Txn) -> tuple[int, str | None]:
            if not group_id:
                raise _Reject(E.INVALID_REQUEST, "Default group resources are not allowed.")
            g = self.state.groups.get(group_id)
            current = g.configs if g is not None else {}
            merged = dict(current)
            for name, value in configs.items():
                if value is None:
                    merged.pop(name, None)
                else:
                    merged[name] = value
            problem = self.config.validate_overrides(configs, current)
            if problem:
                raise _Reject(E.INVALID_CONFIG, problem)
            merged = {name: str(int(value)) if name in configs else value
                      for name, value in merged.items() if value is not None}
            if merged == current:
                return (0, None)
            if validate_only:
                if g is None:  # (what creating it would meet)
                    self._check_new_group(group_id)
                return (0, None)
            g = self._get_or_create_group(txn, group_id, now_ms)
            txn.write(rec.group_configuration(group_id, merged) if merged
                      else rec.tombstone(GroupConfigurationKey(group_id=group_id)))
            if not merged:  # an empty group is kept a full retention from now
                g.soft.empty_since_ms = None
                self._maybe_arm_expiry(txn, g, now_ms)
            return (0, None)

        return self._run(run, lambda code, msg: (code, msg), now_ms)

    def group_configs(self, group_id: str) -> dict[str, str]:
        """A group's dynamic config overrides (none for a group that does not exist)."""
        g = self.state.groups.get(group_id)
        return {k: v for k, v in g.configs.items() if v is not None} if g is not None else {}

    def on_timer(self, key: TimerKey, now_ms: int) -> Result:
        """A timer set earlier expired at ``now_ms``."""
        kind, group_id, member_id = key

        def run(txn: _Txn) -> None:
            g = self.state.groups.get(group_id)
            if g is None:
                return
            if kind == SESSION:
                self._on_session_expired(txn, g, member_id, now_ms)
            elif kind == REBALANCE:
                self._on_rebalance_expired(txn, g, member_id, now_ms)
            elif kind == COMPUTE:
                self._on_compute_expired(txn, g, now_ms)
            elif kind == SCHEDULED:
                self._on_scheduled(txn, g, now_ms)
            elif kind == EXPIRE:
                self._on_expire(txn, g, now_ms)
            elif kind == HOLD:
                self._on_hold_expired(txn, g, member_id, now_ms)
            elif kind == OFFSETS:
                self._on_offsets_gc(txn, g, now_ms)
            elif kind in (CLASSIC_JOIN, CLASSIC_SYNC):
                self._on_classic_expired(txn, g, kind, member_id, now_ms)
            if group_id in self.state.groups:
                self._after(txn, g, now_ms)

        return self._run(run, lambda code, msg: None, now_ms)

    def on_loaded(self, now_ms: int) -> Result:
        """After a load: fresh session timeouts, re-armed timers, computations restarted."""
        txn = _Txn(self.state)
        for g in self.state.groups.values():
            soft = g.soft
            soft.computation = None
            soft.selection_epoch = -1
            for mid, m in g.members.items():
                self._touch_session(txn, g, mid, now_ms, self._session_ms(g, m))
                cur = g.current.get(mid)
                if cur is not None and cur.state == MemberState.UNREVOKED_ITEMS:
                    self._arm_rebalance_timer(txn, g, mid, cur.epoch, now_ms)
                if cur is not None and not cur.assigned <= g.configured:
                    soft.dirty.add(mid)
            for mid, cur in g.current.items():
                if mid not in g.members and is_hold(cur):
                    # The hold started again: its end is at most one hold late, never early.
                    self._arm_hold(txn, g, mid, now_ms + max(cur.previous_epoch, 0))
            if g.scheduled_rebalance_at_ms >= 0 and g.epoch == g.assignment_epoch:
                txn.timer(SCHEDULED, g.group_id, "", g.scheduled_rebalance_at_ms)
            if g.offset_garbage:  # offsets of connectors deleted before a crash: tombstone them
                txn.timer(OFFSETS, g.group_id, "", now_ms)
            if soft.rebalance_started is None and g.members and g.state != GroupState.STABLE:
                soft.rebalance_started = (now_ms, g.epoch)  # (its duration counts from the load)
            self._after(txn, g, now_ms)
        return txn.result(None)

    def describe(self, req: ConnectGroupDescribeRequest, now_ms: int = -1) -> ConnectGroupDescribeResponse:
        """Read-only. (The runtime serves it from committed state.) ``now_ms``: the wall clock,
        for each member's last heartbeat age (-1: not given, ages unknown)."""
        return ConnectGroupDescribeResponse(
            groups=tuple(self._describe_group(gid, now_ms) for gid in req.group_ids)
        )

    def list_groups(self) -> list[tuple[str, str]]:
        """(group id, state name) of every group."""
        return [(gid, g.state.value) for gid, g in self.state.groups.items()]

    def assignment_response(self, group_id: str, member_id: str) -> Any:
        """What the member may run now, as a heartbeat ``Assignment`` (for the runtime)."""
        g = self.state.groups.get(group_id)
        if g is None or member_id not in g.current:
            return None
        return self._assignment(g, g.current[member_id])

    # == classic members (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) ==========================
    # Responses are plain dicts of the fields of Kafka's responses (the runtime builds the
    # version's message from them).
    def classic_join(self, req: cl.Join, now_ms: int,
                     ctx: RequestContext = RequestContext()) -> Result:
        if (cut := cut_client_id(ctx.client_id)) is not ctx.client_id:
            ctx = replace(ctx, client_id=cut)
        return self._run(lambda txn: self._classic_join(txn, req, now_ms, ctx),
                         lambda code, msg: _join_error(req.member_id, code, msg), now_ms)

    def classic_sync(self, req: cl.Sync, now_ms: int) -> Result:
        return self._run(lambda txn: self._classic_sync(txn, req, now_ms),
                         lambda code, msg: {"error_code": code, "error_message": msg,
                                            "protocol_type": req.protocol_type,
                                            "protocol_name": req.protocol_name,
                                            "assignment": b""}, now_ms)

    def classic_heartbeat(self, req: cl.Beat, now_ms: int) -> Result:
        return self._run(lambda txn: self._classic_heartbeat(txn, req, now_ms),
                         lambda code, msg: {"error_code": code, "error_message": msg}, now_ms)

    def classic_leave(self, req: cl.Leave, now_ms: int) -> Result:
        return self._run(lambda txn: self._classic_leave(txn, req, now_ms),
                         lambda code, msg: {"error_code": code, "error_message": msg,
                                            "members": []}, now_ms)

    def commit_offsets(self, req: ConnectGroupCommitOffsetsRequest, now_ms: int) -> Result:
        """A connector instance's offsets, fenced by its member epoch and ownership."""
        return self._run(
            lambda txn: self._commit_offsets(txn, req),
            lambda code, msg: ConnectGroupCommitOffsetsResponse(error_code=code, error_message=msg),
            now_ms,
        )

    def fetch_offsets(self, req: ConnectGroupFetchOffsetsRequest) -> ConnectGroupFetchOffsetsResponse:
        """Read-only: a connector's committed offsets (all, or the partitions asked for)."""
        try:
            return self._fetch_offsets(req)
        except _Reject as r:
            return ConnectGroupFetchOffsetsResponse(error_code=r.code, error_message=r.message,
                                                    offsets=())

    def alter_offsets(self, req: ConnectGroupAlterOffsetsRequest, now_ms: int) -> Result:
        """An operator's change of a stopped connector's offsets. A ``Reset`` removes at most
        one batch of partitions per call: the caller repeats it while
        :meth:`offset_count` is above zero."""
        return self._run(
            lambda txn: self._alter_offsets(txn, req),
            lambda code, msg: ConnectGroupAlterOffsetsResponse(error_code=code, error_message=msg),
            now_ms,
        )

    def offset_count(self, group_id: str, connector: str) -> int:
        g = self.state.groups.get(group_id)
        return len(g.offsets.get(connector, ())) if g is not None else 0

    # == plumbing =================================================================================
    def _run(self, body: Callable[[_Txn], Any], error: Callable[[int, str], Any],
             now_ms: int) -> Result:
        txn = _Txn(self.state)
        try:
            response = body(txn)
        except _Reject as r:
            response = error(r.code, r.message)  # what was written before stays (a fence)
        except (ReplayError, AssertionError, KeyError, ValueError, TypeError) as exc:
            # A bug or a corrupt state must never crash the daemon nor leave half a change.
            txn.rollback()
            if self.strict:
                raise
            return Result(error(E.UNKNOWN_SERVER_ERROR, f"internal error: {exc!r}"))
        if txn.touched:
            self._rebalances_done(txn, now_ms)
        return txn.result(response)

    # == events =====================================================================================
    def _event(self, txn: _Txn, g: Group, event: str, member_id: str | None = None,
               **fields: Any) -> None:
        """Add a :class:`GroupEvent`: the group's epochs, the member's id, instance id and epoch
        (as they are now; ``fields`` may give them for a member already removed), then
        ``fields``."""
        out: dict[str, Any] = {"group_epoch": g.epoch, "assignment_epoch": g.assignment_epoch}
        if member_id is not None:
            m = g.members.get(member_id)
            cur = g.current.get(member_id)
            out["member_id"] = member_id
            out["instance_id"] = m.instance_id if m is not None else None
            out["member_epoch"] = cur.epoch if cur is not None else None
        out.update(fields)
        txn.events.append(GroupEvent(event, g.group_id, out))

    @staticmethod
    def _names(items: Iterable[Item]) -> list[str]:
        return sorted(str(i) for i in items)[:NAMES_LOGGED]

    def _rebalances_done(self, txn: _Txn, now_ms: int) -> None:
        """A rebalance runs from the group epoch bump that started it (in a group with members)
        until the group is Stable again: every member at the assignment epoch, nothing left to
        revoke or release. Checked only in the groups this handler wrote to."""
        for group_id in txn.touched:
            g = self.state.groups.get(group_id)
            if g is None:
                continue
            started = g.soft.rebalance_started
            if started is None:
                continue
            state = g.state
            if state == GroupState.STABLE:
                g.soft.rebalance_started = None
                self._event(txn, g, "rebalance completed", members=len(g.members),
                            started_group_epoch=started[1], duration_ms=now_ms - started[0])
            elif state == GroupState.EMPTY:
                g.soft.rebalance_started = None  # nobody left to rebalance

    def _hb_error(self, code: int, message: str, req: ConnectGroupHeartbeatRequest) -> Any:
        _, interval = self._timeouts(req.group_id)
        return ConnectGroupHeartbeatResponse(
            error_code=code, error_message=message, member_id=None,
            member_epoch=req.member_epoch, heartbeat_interval_ms=interval,
            should_compute_assignment=False,
        )

    def _timeouts(self, group_id: str) -> tuple[int, int]:
        g = self.state.groups.get(group_id)
        return self.config.for_group(g.configs if g is not None else {})

    def _check_new_group(self, group_id: str) -> None:
        """A new group: its id must fit its records, and ``group.max.groups`` must allow it."""
        if problem := validate_group_id_size(group_id):
            raise _Reject(E.INVALID_GROUP_ID, problem)
        self._check_group_cap(group_id)

    def _check_group_cap(self, group_id: str) -> None:
        """``group.max.groups``: a new group beyond it is refused."""
        count = self.config.group_count
        hosted = count() if count is not None else len(self.state.groups)
        if hosted >= self.config.max_groups:
            raise _Reject(
                E.INVALID_REQUEST,
                f"Group {group_id} cannot be created: this coordinator hosts {hosted:,} groups, "
                f"group.max.groups is {self.config.max_groups:,}.",
            )

    def _get_or_create_group(self, txn: _Txn, group_id: str, now_ms: int) -> Group:
        g = self.state.groups.get(group_id)
        if g is None:
            self._check_new_group(group_id)
        if g is None or not g.has_metadata:
            # A new group's fencing tokens start at now_ms * 1000, a first block reserved at once
            # (in its first record, so the first grants need no record of their own).
            start = max(now_ms, 0) * 1000
            ceiling = g.token_ceiling if g is not None and g.token_ceiling else start + TOKEN_BLOCK
            txn.write(rec.group_metadata(group_id, g.epoch if g is not None else 0, ceiling))
            g = self.state.groups[group_id]
            if g.token_counter is None and ceiling == start + TOKEN_BLOCK:
                g.token_counter = start
            self._maybe_arm_expiry(txn, g, now_ms)
        return g

    def _bump(self, txn: _Txn, g: Group, now_ms: int, reason: str,
              member_id: str | None = None, **fields: Any) -> None:
        """Bump the group epoch (a rebalance starts, or goes on) and say why."""
        previous = g.epoch
        txn.write(rec.group_metadata(g.group_id, previous + 1, g.token_ceiling))
        if g.members and g.soft.rebalance_started is None:
            g.soft.rebalance_started = (now_ms, g.epoch)
        self._event(txn, g, "group epoch bumped", member_id, reason=reason,
                    previous_group_epoch=previous, members=len(g.members), **fields)

    # == fencing tokens =============================================================================
    def _next_token(self, txn: _Txn, g: Group, now_ms: int) -> int:
        """The group's next fencing token. Tokens are reserved in blocks: when the counter
        reaches the durable ceiling, a GroupMetadata record raises the ceiling by
        ``TOKEN_BLOCK`` (in the same write as the records carrying the new tokens); after a
        load the counter starts at the ceiling, above every token that may have been given.
        A group without a ceiling (a new one) starts at ``now_ms * 1000``, so a group deleted
        and created again gives tokens above its old ones."""
        last = g.token_counter
        if last is None:
            last = g.token_ceiling if g.token_ceiling > 0 else max(now_ms, 0) * 1000
        token = last + 1
        if token > g.token_ceiling:
            txn.write(rec.group_metadata(g.group_id, g.epoch, last + TOKEN_BLOCK))
        g.token_counter = token
        return token

    def _tokened(self, txn: _Txn, g: Group, old: CurrentAssignment | None,
                 nxt: CurrentAssignment, now_ms: int, fresh: bool = False) -> CurrentAssignment:
        """``nxt`` with the fencing token of each owned item. An item the member keeps (it
        stays assigned, or goes on being revoked, or an assigned one starts being revoked)
        keeps its token; an item that enters the member's assignment (a grant: it moved to
        the member, or returns to it after it was revoked, or the member rejoined) gets a new
        one, as does everything with ``fresh`` (a new process took over)."""
        old_tokens = old.tokens if old is not None and not fresh else {}
        old_assigned = old.assigned if old is not None else EMPTY
        tokens: dict[Item, int] = {}
        new: list[Item] = []
        connectors = g.connectors
        for item in nxt.assigned:
            t = old_tokens.get(item) if item in old_assigned else None
            # (kept since before its connector was deleted and created again: the item of
            # the new connector is a new grant; tokens and incarnations share the counter)
            if t is not None and (spec := connectors.get(item.connector)) is not None \
                    and t < spec.incarnation:
                t = None
            if t is None:
                new.append(item)
            else:
                tokens[item] = t
        for item in nxt.revoking:
            t = old_tokens.get(item)
            if t is None:
                new.append(item)
            else:
                tokens[item] = t
        for item in sorted(new):
            tokens[item] = self._next_token(txn, g, now_ms)
        if tokens == nxt.tokens:
            return nxt
        return replace(nxt, tokens=tokens)

    # == classic members ============================================================================
    def _session_ms(self, g: Group, m: MemberMetadata) -> int:
        """A member's session timeout: a classic member keeps its JoinGroup's own."""
        if m.classic is not None:
            return m.classic.session_timeout_ms
        return self.config.for_group(g.configs)[0]

    def _classic_member(self, group_id: str, member_id: str,
                        instance_id: str | None) -> tuple[Group, MemberMetadata]:
        """The classic member a SyncGroup or Heartbeat names (Kafka's checks, in its order)."""
        g = self.state.groups.get(group_id)
        m = g.members.get(member_id) if g is not None else None
        if g is None or m is None:
            raise _Reject(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group "
                          f"{group_id}: rejoin (JoinGroup).")
        if instance_id is not None:
            holder = g.static_members.get(instance_id)
            if holder is None:
                raise _Reject(E.UNKNOWN_MEMBER_ID,
                              f"Instance {instance_id} is unknown in group {group_id}.")
            if holder != member_id:
                raise _Reject(E.FENCED_INSTANCE_ID, f"Instance {instance_id} belongs to member "
                              f"{holder}, not {member_id}.")
        if m.classic is None:
            raise _Reject(E.UNKNOWN_MEMBER_ID, f"Member {member_id} of group {group_id} uses the "
                          "new protocol (ConnectGroupHeartbeat), not JoinGroup/SyncGroup.")
        return g, m

    def _arm_classic(self, txn: _Txn, g: Group, kind: str, member_id: str,
                     deadline: int | None) -> None:
        table = (g.soft.classic_join_deadline if kind == CLASSIC_JOIN
                 else g.soft.classic_sync_deadline)
        if deadline is None:
            if table.pop(member_id, None) is None:
                return
        else:
            table[member_id] = deadline
        txn.timer(kind, g.group_id, member_id, deadline)

    def _classic_join(self, txn: _Txn, req: cl.Join, now_ms: int, ctx: RequestContext) -> Any:
        config = self.config
        if not req.group_id:
            raise _Reject(E.INVALID_GROUP_ID, "GroupId must be non-empty.")
        if not config.min_session_timeout_ms <= req.session_timeout_ms <= config.max_session_timeout_ms:
            raise _Reject(E.INVALID_SESSION_TIMEOUT,
                          f"SessionTimeoutMs {req.session_timeout_ms} is outside "
                          f"[{config.min_session_timeout_ms}, {config.max_session_timeout_ms}] "
                          "(group.connect.min/max.session.timeout.ms).")
        if req.rebalance_timeout_ms <= 0:
            raise _Reject(E.INVALID_REQUEST,
                          f"RebalanceTimeoutMs {req.rebalance_timeout_ms} must be positive.")
        # A larger one is cut to the bound, not refused: a classic client cannot choose
        # another (kafka-python sends its max.poll.interval.ms, 300000 by default).
        rebalance_ms = min(req.rebalance_timeout_ms, config.max_rebalance_timeout_ms)
        try:
            protocols, metadata = cl.accept_protocols(req.protocol_type, req.protocols)
        except cl.Refused as exc:
            raise _Reject(E.INCONSISTENT_GROUP_PROTOCOL, str(exc)) from None
        problem = (validate_member_id(req.member_id)
                   or validate_member_metadata_size((), metadata.url, req.instance_id))
        if problem:
            raise _Reject(E.INVALID_REQUEST, problem)
        g = self.state.groups.get(req.group_id)
        size = sum(len(b) for _, b in protocols)
        allowed = cl.MAX_METADATA_BYTES + cl.BYTES_PER_ITEM * (len(g.configured) if g else 0)
        if size > allowed:
            raise _Reject(E.INVALID_REQUEST,
                          f"The protocols' metadata take {size:,} bytes, more than the "
                          f"{allowed:,} a member of group {req.group_id} may send.")
        if not req.member_id and req.instance_id is None and req.requires_member_id:
            return _join_error(self.new_member_id(), E.MEMBER_ID_REQUIRED,
                               "A member id is required: join again with this one.")
        member_id = req.member_id or self.new_member_id()
        try:
            owned = cc.allocation_items(metadata)
        except cc.ConnectProtocolError as exc:  # (decode_metadata checked it already)
            raise _Reject(E.INCONSISTENT_GROUP_PROTOCOL, str(exc)) from None
        classic = ClassicMember(req.session_timeout_ms, protocols)
        meta = MemberMetadata(
            member_id=member_id, instance_id=req.instance_id, worker_url=metadata.url,
            client_id=ctx.client_id, client_host=ctx.client_host,
            rebalance_timeout_ms=rebalance_ms, assignors=(), classic=classic)
        existing = g.members.get(member_id) if g is not None else None
        holder = (g.static_members.get(req.instance_id)
                  if g is not None and req.instance_id is not None else None)
        if req.instance_id is not None and req.member_id:
            # A known static member rejoining: its instance must be its own.
            if holder is None or existing is None:
                raise _Reject(E.UNKNOWN_MEMBER_ID, f"Instance {req.instance_id} is unknown in "
                              f"group {req.group_id}: join with an empty MemberId.")
            if holder != member_id:
                raise _Reject(E.FENCED_INSTANCE_ID, f"Instance {req.instance_id} belongs to "
                              f"member {holder}, not {member_id}.")
        if existing is None:
            if g is not None:
                others = g.members.keys() - {holder} if holder else g.members.keys()
                n_classic = len(g.classic_members) - (holder in g.classic_members)
                refusal = cl.policy_refusal(config.migration_policy, True, n_classic > 0,
                                            len(others) > n_classic, g.group_id)
                if refusal is not None:
                    raise _Reject(E.INCONSISTENT_GROUP_PROTOCOL, refusal)
                if holder is None and len(g.members) >= config.max_size:
                    raise _Reject(E.GROUP_MAX_SIZE_REACHED,
                                  f"Group {req.group_id} has reached its maximum size "
                                  f"({config.max_size} members).")
            if holder is not None:
                assert g is not None
                # A new process of a static member replaces the old one (whatever protocol
                # it spoke): it takes over its target and what it held.
                self._take_over(txn, g, holder, meta, now_ms)
                g.soft.empty_since_ms = None
            else:
                g = self._get_or_create_group(txn, req.group_id, now_ms)
                g.soft.hold_deadline.pop(member_id, None)
                g.soft.hold_instance.pop(member_id, None)
                txn.write(rec.group_member(g.group_id, meta))
                self._write_current(txn, g, member_id, self._joining_assignment(
                    g, member_id, EMPTY, owned, NEW_MEMBER_ASSIGNMENT), now_ms)
                self._event(txn, g, "member joined", member_id, protocol=classic.protocol,
                            rebalance_timeout_ms=rebalance_ms,
                            session_timeout_ms=req.session_timeout_ms, client_id=ctx.client_id,
                            client_host=ctx.client_host, reports_running=len(owned))
                self._bump(txn, g, now_ms, "member_joined", member_id)
                g.soft.empty_since_ms = None
        else:
            assert g is not None
            if existing.classic is None:
                self._event(txn, g, "member switched protocol", member_id,
                            protocol=classic.protocol)
            if existing != meta:
                txn.write(rec.group_member(g.group_id, meta))
            cur = g.current[member_id]
            if cur.epoch == -2:  # a static member of the new protocol that left, back classic
                self._write_current(txn, g, member_id, self._joining_assignment(
                    g, member_id, cur.assigned, owned, cur), now_ms, fresh=True)
        assert g is not None
        self._note_principal(g, member_id, ctx)
        self._after(txn, g, now_ms)
        self._reconcile(txn, g, member_id, owned, now_ms)
        self._touch_session(txn, g, member_id, now_ms, req.session_timeout_ms)
        g.soft.last_heartbeat[member_id] = now_ms
        self._arm_classic(txn, g, CLASSIC_JOIN, member_id, None)
        self._arm_classic(txn, g, CLASSIC_SYNC, member_id,
                          now_ms + self._rebalance_timeout(g.members[member_id]))
        return {"error_code": 0, "error_message": None,
                "generation_id": g.current[member_id].epoch,
                "protocol_type": cc.PROTOCOL_TYPE, "protocol_name": classic.protocol,
                "leader": "", "skip_assignment": False, "member_id": member_id,
                "members": []}

    def _take_over(self, txn: _Txn, g: Group, old_id: str, meta: MemberMetadata,
                   now_ms: int) -> None:
        """A new classic process of a static instance replaces the member holding it: the
        target moves to the new member id, at epoch 0 (new fencing tokens), and so does what
        the old member held when it cannot be running it any more: it was classic (a classic
        static member never leaves, a new process of its instance is its restart, as Kafka) or
        it left statically (-2: it stopped everything). A live member of the new protocol
        replaced so is fenced: its items are held until it must have stopped them (it learns
        of the fence at its next heartbeat), then given to the new process."""
        old_cur = g.current[old_id]
        old_target = g.target.get(old_id)
        old_meta = g.members[old_id]
        live = old_meta.classic is None and old_cur.epoch != -2
        hold_until = self._hold_for(g, old_id, now_ms) if live else None
        if live:
            self._event(txn, g, "member fenced", old_id, reason="replaced",
                        owned=len(old_cur.owned), replaced_by=meta.member_id)
        self._remove_records(txn, g, old_id, hold_until, now_ms)
        txn.write(rec.group_member(g.group_id, meta))
        if old_target is not None:
            txn.write(rec.target_member(g.group_id, meta.member_id, old_target))
        taken = EMPTY if live else old_cur.assigned
        txn.write(rec.current_assignment(g.group_id, meta.member_id, self._tokened(
            txn, g, None, CurrentAssignment(0, 0, MemberState.STABLE, taken, EMPTY,
                                            old_cur.metadata_version, old_cur.metadata_bytes),
            now_ms)))
        self._forget_member(txn, g, old_id)
        self._event(txn, g, "member joined", meta.member_id, replaced_member_id=old_id,
                    protocol=meta.classic.protocol if meta.classic else None,
                    took_over=len(taken))
        comp = g.soft.computation
        if comp is not None and comp.member_id == old_id:
            self._cancel_computation(txn, g)
        if old_meta.classic is None or (comp is not None and comp.prepared_epoch is not None):
            # (the group's assignors changed, or a computation in flight names the old id)
            self._bump(txn, g, now_ms, "static_member_replaced", meta.member_id)

    def _classic_sync(self, txn: _Txn, req: cl.Sync, now_ms: int) -> Any:
        g, m = self._classic_member(req.group_id, req.member_id, req.instance_id)
        assert m.classic is not None
        cur = g.current[req.member_id]
        if req.generation_id != cur.epoch:
            raise _Reject(E.ILLEGAL_GENERATION, f"GenerationId {req.generation_id} is not the "
                          f"member's generation {cur.epoch}: rejoin.")
        if req.protocol_type is not None and req.protocol_type != cc.PROTOCOL_TYPE:
            raise _Reject(E.INCONSISTENT_GROUP_PROTOCOL,
                          f"ProtocolType {req.protocol_type!r} is not {cc.PROTOCOL_TYPE!r}.")
        if req.protocol_name is not None and req.protocol_name != m.classic.protocol:
            raise _Reject(E.INCONSISTENT_GROUP_PROTOCOL,
                          f"ProtocolName {req.protocol_name!r} is not the member's protocol "
                          f"{m.classic.protocol!r}.")
        self._touch_session(txn, g, req.member_id, now_ms, m.classic.session_timeout_ms)
        g.soft.last_heartbeat[req.member_id] = now_ms
        self._arm_classic(txn, g, CLASSIC_SYNC, req.member_id, None)
        if cur.epoch < g.assignment_epoch and cur.state != MemberState.UNREVOKED_ITEMS:
            self._arm_join_timer(txn, g, req.member_id, now_ms)
            raise _Reject(E.REBALANCE_IN_PROGRESS, "A newer target assignment is installed: "
                          "rejoin.")
        return {"error_code": 0, "error_message": None, "protocol_type": cc.PROTOCOL_TYPE,
                "protocol_name": m.classic.protocol,
                "assignment": cl.sync_assignment(g, m, cur, now_ms)}

    def _arm_join_timer(self, txn: _Txn, g: Group, member_id: str, now_ms: int) -> None:
        if member_id not in g.soft.classic_join_deadline:
            self._arm_classic(txn, g, CLASSIC_JOIN, member_id,
                              now_ms + self._rebalance_timeout(g.members[member_id]))

    def _classic_heartbeat(self, txn: _Txn, req: cl.Beat, now_ms: int) -> Any:
        g, m = self._classic_member(req.group_id, req.member_id, req.instance_id)
        assert m.classic is not None
        cur = g.current[req.member_id]
        if req.generation_id != cur.epoch:
            raise _Reject(E.ILLEGAL_GENERATION, f"GenerationId {req.generation_id} is not the "
                          f"member's generation {cur.epoch}: rejoin.")
        self._touch_session(txn, g, req.member_id, now_ms, m.classic.session_timeout_ms)
        g.soft.last_heartbeat[req.member_id] = now_ms
        why = cl.must_rejoin(g, req.member_id, cur)
        if why is not None:
            self._arm_join_timer(txn, g, req.member_id, now_ms)
            raise _Reject(E.REBALANCE_IN_PROGRESS, f"Rejoin: {why}.")
        return {"error_code": 0, "error_message": None}

    def _classic_leave(self, txn: _Txn, req: cl.Leave, now_ms: int) -> Any:
        g = self.state.groups.get(req.group_id)
        if g is None:
            raise _Reject(E.UNKNOWN_MEMBER_ID, f"Group {req.group_id} has no members.")
        answers = []
        for member_id, instance_id in req.members:
            code = 0
            mid = member_id
            if instance_id is None:
                m = g.members.get(member_id)
                if m is None or m.classic is None:
                    code = E.UNKNOWN_MEMBER_ID
            else:
                holder = g.static_members.get(instance_id)
                if holder is None:
                    code = E.UNKNOWN_MEMBER_ID
                elif member_id and holder != member_id:
                    code = E.FENCED_INSTANCE_ID
                elif g.members[holder].classic is None:
                    code = E.UNKNOWN_MEMBER_ID
                else:
                    mid = holder
            if code == 0:
                self._fence(txn, g, mid, now_ms, "left")
            answers.append({"member_id": member_id, "group_instance_id": instance_id,
                            "error_code": code})
        self._after(txn, g, now_ms)
        return {"error_code": 0, "error_message": None, "members": answers}

    def _on_classic_expired(self, txn: _Txn, g: Group, kind: str, member_id: str,
                            now_ms: int) -> None:
        table = (g.soft.classic_join_deadline if kind == CLASSIC_JOIN
                 else g.soft.classic_sync_deadline)
        deadline = table.get(member_id)
        if deadline is None or member_id not in g.members:
            return
        if deadline > now_ms:
            txn.timer(kind, g.group_id, member_id, deadline)
            return
        del table[member_id]
        self._fence(txn, g, member_id, now_ms,
                    "classic_join_timeout" if kind == CLASSIC_JOIN else "classic_sync_timeout",
                    hold=True, rebalance_timeout_ms=g.members[member_id].rebalance_timeout_ms)

    # == heartbeat ==================================================================================
    def _heartbeat(
        self, txn: _Txn, req: ConnectGroupHeartbeatRequest, now_ms: int, ctx: RequestContext
    ) -> Any:
        epoch = req.member_epoch
        problem = self._report_size_problem(req)
        if problem and epoch == 0:
            raise _Reject(E.INVALID_REQUEST, problem)
        if problem:
            # A member's report can be honest and still name more: what it started while the
            # connector was deleted, after a full report that did not name it yet, is no longer
            # owned by it here; refusing would end the worker. Such a report is no evidence
            # (as if it carried no lists and no states), in O(1); the answer's assignment makes
            # the worker stop those items, and its next report is within the bounds again.
            req = replace(req, owned_connectors=None, owned_tasks=None, instance_states=())
        g: Group | None  # None only until the unknown-member check below
        if epoch == 0:
            g, member_id, joined = self._join(txn, req, now_ms, ctx)
        else:
            g = self.state.groups.get(req.group_id)
            member_id = req.member_id
            if g is None or member_id not in g.members:
                raise _Reject(
                    E.UNKNOWN_MEMBER_ID,
                    f"Member {member_id} is not a member of group {req.group_id}: "
                    "rejoin with MemberEpoch 0.",
                )
            if g.members[member_id].classic is not None:
                raise _Reject(
                    E.UNKNOWN_MEMBER_ID,
                    f"Member {member_id} of group {req.group_id} uses the classic protocol "
                    "(JoinGroup/SyncGroup/Heartbeat): join with MemberEpoch 0 to switch.")
            self._check_instance(g, member_id, req.instance_id)
            if epoch == -1:
                return self._leave(txn, g, member_id, now_ms)
            if epoch == -2:
                return self._static_leave(txn, g, member_id, now_ms)
            self._check_epoch(txn, g, member_id, req, now_ms)
            self._update_member(txn, g, member_id, req, ctx, now_ms)
            self._note_principal(g, member_id, ctx)
            joined = False

        owned = self._reported_owned(g, member_id, req)
        self._reported_states(g, member_id, req, joining=epoch == 0)
        before = g.current[member_id]
        self._after(txn, g, now_ms)  # a computation may be needed before reconciling
        self._reconcile(txn, g, member_id, owned, now_ms)
        session_ms, interval_ms = self.config.for_group(g.configs)
        self._touch_session(txn, g, member_id, now_ms, session_ms)
        g.soft.last_heartbeat[member_id] = now_ms
        after = g.current[member_id]

        full = (
            req.rebalance_timeout_ms != -1 and req.client_assignors is not None
            and req.owned_connectors is not None and req.owned_tasks is not None
        )
        changed = (
            after.assigned != before.assigned or after.epoch != before.epoch
            or after.metadata_bytes != before.metadata_bytes
            # The worker's view is behind (e.g. the response that moved it on was lost).
            or (epoch > 0 and epoch != after.epoch)
        )
        comp = g.soft.computation
        should_compute = (
            comp is not None and comp.member_id == member_id and comp.prepared_epoch is None
        )
        if should_compute and comp is not None:
            if not comp.notified:
                self._notify_assigner(txn, g, comp, now_ms)
            else:  # idempotent: re-arm in case the response that first armed it was rolled back
                txn.timer(COMPUTE, g.group_id, "", comp.deadline_ms)
        return ConnectGroupHeartbeatResponse(
            member_id=member_id if epoch == 0 else None,
            member_epoch=after.epoch,
            heartbeat_interval_ms=interval_ms,
            should_compute_assignment=should_compute,
            assignment=self._assignment(g, after) if (joined or full or changed) else None,
        )

    def _report_size_problem(self, req: ConnectGroupHeartbeatRequest) -> str | None:
        """Why the owned lists or states are longer than any worker of the group sends
        (validation.validate_report_size), or None: checked before anything else, in O(1)."""
        reported = len(req.owned_connectors or ()) + len(req.owned_tasks or ())
        states = len(req.instance_states or ())
        if not reported and not states:
            return None
        g = self.state.groups.get(req.group_id)
        if req.member_epoch != 0 and (g is None or req.member_id not in g.members):
            return None  # UNKNOWN_MEMBER_ID comes first: a member that lost its session rejoins
        owned = 0
        if g is not None:
            # (a static member taking over its instance gets what the instance held)
            for mid in (req.member_id, g.static_members.get(req.instance_id or "")):
                cur = g.current.get(mid) if mid else None
                owned += len(cur.assigned) + len(cur.revoking) if cur is not None else 0
        return validate_report_size(req.group_id, reported, states,
                                    len(g.configured) if g is not None else 0, owned)

    @staticmethod
    def _described_task_configs(spec: ConnectorSpec, written: TaskConfigs | None) -> Any:
        """Describe's TaskConfigs of a connector: null when its instance never wrote any."""
        live = _task_configs_of(spec, written)
        if live is None:
            return None
        return tuple(
            _desc.TaskConfig(config=tuple(_desc.ConfigEntry(name=k, value=v) for k, v in config))
            for config in live.configs)

    @staticmethod
    def _described_states(g: Group, member_id: str, owned: frozenset[Item]) -> tuple[Any, ...]:
        """The member's reported instance states, only of what it owns now (a report can be
        older than its last revocation)."""
        states = g.soft.instance_states.get(member_id)
        if not states:
            return ()
        return tuple(
            _desc.InstanceState(connector=item.connector, task=item.task, state=st,
                                error_message=err, trace=trace)
            for item, (st, err, trace) in sorted(states.items()) if item in owned
        )

    def _assignment(self, g: Group, cur: CurrentAssignment) -> Any:
        connectors, tasks = split_items(cur.assigned)
        tokens = cur.tokens
        return _hb.Assignment(
            error=g.assignment_error,
            connectors=tuple(connectors),
            tasks=tuple(_hb.TaskId(connector=t.connector, task=t.task) for t in tasks),
            metadata_version=cur.metadata_version,
            metadata_bytes=cur.metadata_bytes,
            fencing_tokens=tuple(
                _hb.ItemToken(connector=i.connector, task=i.task, token=tokens[i])
                for i in sorted(cur.assigned) if i in tokens),
        )

    def _check_instance(self, g: Group, member_id: str, instance_id: str | None) -> None:
        if instance_id is None:
            return
        holder = g.static_members.get(instance_id)
        if holder is None:
            raise _Reject(E.UNKNOWN_MEMBER_ID, f"Instance {instance_id} is unknown in group "
                          f"{g.group_id}: rejoin with MemberEpoch 0.")
        if holder != member_id:
            raise _Reject(E.FENCED_INSTANCE_ID, f"Instance {instance_id} belongs to member "
                          f"{holder}, not {member_id}.")

    def _reported_owned(
        self, g: Group, member_id: str, req: ConnectGroupHeartbeatRequest
    ) -> frozenset[Item] | None:
        """What the member runs, or None when this request does not say.

        A list left null is unchanged since the member's last heartbeat, so one list in this
        request plus the other from before is a full report. A request carrying neither list is
        no evidence at all: it never acknowledges a revocation (Kafka's rule).
        """
        last = g.soft.reported_owned.get(member_id, (None, None))
        if req.owned_connectors is None and req.owned_tasks is None:
            return None
        # Only what the member owns (a join has made what it reports running of the group's
        # items and nobody else's its own, as revoking) is ever compared with a report: an item
        # of another member, or one not in the group (a worker may still report an item just
        # deleted), is dropped here, so what is kept of reports is bounded by the group's items.
        mine = g.current[member_id].owned
        connectors = (
            items_from_wire(req.owned_connectors, None) & mine
            if req.owned_connectors is not None else last[0]
        )
        tasks = (items_from_wire(None, req.owned_tasks) & mine
                 if req.owned_tasks is not None else last[1])
        g.soft.reported_owned[member_id] = (connectors, tasks)
        if connectors is None or tasks is None:
            return None
        return connectors | tasks

    def _reported_states(
        self, g: Group, member_id: str, req: ConnectGroupHeartbeatRequest, joining: bool
    ) -> None:
        """Keep the instance states the member reports: a non-empty list replaces its previous
        report, an absent one leaves it; a join starts from nothing. Only states of items the
        member owns are kept (describe shows no other), one per item, error and trace cut to
        their last 8 KiB: what is kept of all members' reports is bounded by the group's items.
        Soft state only: a restarted or new coordinator learns them from the next full report."""
        if joining:
            g.soft.instance_states.pop(member_id, None)
        if req.instance_states:
            mine = g.current[member_id].owned
            g.soft.instance_states[member_id] = {
                item: (s.state, _bounded(s.error_message), _bounded(s.trace))
                for s in req.instance_states
                if (item := Item(s.connector, s.task)) in mine
            }

    def _check_epoch(
        self, txn: _Txn, g: Group, member_id: str, req: ConnectGroupHeartbeatRequest, now_ms: int
    ) -> None:
        cur = g.current[member_id]
        epoch = req.member_epoch
        if epoch == cur.epoch:
            return
        if epoch < cur.epoch and epoch == cur.previous_epoch and cur.epoch >= 0:
            # The response that moved the member on may have been lost: accept a full report
            # of what it owns if that is a subset of its current assignment.
            if req.owned_connectors is not None and req.owned_tasks is not None:
                owned = items_from_wire(req.owned_connectors, req.owned_tasks)
                if owned <= cur.assigned:
                    return
        self._fence(txn, g, member_id, now_ms, "stale_member_epoch", hold=True,
                    request_member_epoch=epoch)
        self._after(txn, g, now_ms)
        raise _Reject(
            E.FENCED_MEMBER_EPOCH,
            f"MemberEpoch {epoch} does not match the member's epoch {cur.epoch}: the member was "
            "removed; abandon all work and rejoin with MemberEpoch 0 and the same MemberId.",
        )

    def _check_assignors(self, g: Group, member_id: str, assignors: tuple[AssignorSpec, ...]) -> None:
        """UNSUPPORTED_ASSIGNOR unless the group can still select an assignor and every pair of
        members' version ranges of it overlap. O(the member's assignors), from the group's
        assignor index (the members' ranges always overlap pairwise, so the new range overlaps
        them all exactly when it reaches the lowest maximum and the highest minimum)."""
        index = g.assignors
        me = g.members.get(member_id)
        others = (len(g.members) - len(g.classic_members)
                  - (me is not None and me.classic is None))
        if not others:
            return
        mine_before = {a.name: a for a in me.assignors} if me is not None else {}

        def others_count(name: str) -> int:
            return index.count.get(name, 0) - (name in mine_before)

        common = [a for a in assignors if others_count(a.name) == others]
        if not common:
            raise _Reject(E.UNSUPPORTED_ASSIGNOR, "None of the member's ClientAssignors is "
                          f"supported by every member of group {g.group_id}.")
        position = {a.name: p for p, a in enumerate(assignors)}
        before = {name: p for p, name in enumerate(mine_before)}

        def rank(a: AssignorSpec) -> tuple[int, str]:
            return (index.rank[a.name] - before.get(a.name, 0) + position[a.name], a.name)

        mine = min(common, key=rank)
        name = mine.name
        old = mine_before.get(name)
        low_max = _without(index.maxs[name], old.maximum_version if old else None, first=True)
        high_min = _without(index.mins[name], old.minimum_version if old else None, first=False)
        if mine.minimum_version <= low_max and high_min <= mine.maximum_version:
            return
        for m in g.members.values():  # (only to name one: the request is refused anyway)
            theirs = next(a for a in m.assignors if a.name == name)
            if m.member_id != member_id and not _ranges_overlap(mine, theirs):
                raise _Reject(
                    E.UNSUPPORTED_ASSIGNOR,
                    f"Assignor {name} version range [{mine.minimum_version}, "
                    f"{mine.maximum_version}] does not overlap member {m.member_id}'s "
                    f"[{theirs.minimum_version}, {theirs.maximum_version}].",
                )

    def _join(
        self, txn: _Txn, req: ConnectGroupHeartbeatRequest, now_ms: int, ctx: RequestContext
    ) -> tuple[Group, str, bool]:
        member_id = req.member_id or self.new_member_id()
        g = self.state.groups.get(req.group_id)
        assignors = _assignors_from(req.client_assignors or ())
        owned = items_from_wire(req.owned_connectors, req.owned_tasks)
        if g is not None and req.instance_id is not None:
            holder = g.static_members.get(req.instance_id)
            if holder is not None and holder != member_id:
                held = g.current.get(holder)
                if (held is None or held.epoch != -2) and g.members[holder].classic is None:
                    raise _Reject(
                        E.UNRELEASED_INSTANCE_ID,
                        f"Instance {req.instance_id} is still held by member {holder}; it must "
                        "leave (or its session expire) before another member takes it.",
                    )
                if member_id in g.members:
                    # FIX (tests): the replacement overwrote an existing *other* member's
                    # records: its own work vanished from the ownership and target indexes while
                    # it still ran it (no rebalance followed, so those items stayed in no target),
                    # and its response revoked and assigned in one step. A member already in the
                    # group may not take over another member's instance id.
                    raise _Reject(
                        E.FENCED_INSTANCE_ID,
                        f"Instance {req.instance_id} belongs to member {holder}; member "
                        f"{member_id} is already in group {g.group_id} and cannot take it over.",
                    )
                if g.members[holder].classic is not None:
                    refusal = cl.policy_refusal(
                        self.config.migration_policy, False, len(g.classic_members) > 1,
                        len(g.members) > len(g.classic_members), g.group_id)
                    if refusal is not None:
                        raise _Reject(E.GROUP_ID_NOT_FOUND, refusal)
                self._check_assignors(g, holder, assignors)
                # (a new process of the instance replaces a classic one: classic static
                # members never leave, so it need not have left first; as Kafka)
                self._replace_static(txn, g, holder, member_id, req, ctx, assignors, now_ms)
                self._note_principal(g, member_id, ctx)
                return g, member_id, True
        existing = g.members.get(member_id) if g is not None else None
        if existing is None:
            if g is not None:
                refusal = cl.policy_refusal(
                    self.config.migration_policy, False, bool(g.classic_members),
                    len(g.members) > len(g.classic_members), g.group_id)
                if refusal is not None:
                    raise _Reject(E.GROUP_ID_NOT_FOUND, refusal)
            if g is not None and len(g.members) >= self.config.max_size:
                raise _Reject(E.GROUP_MAX_SIZE_REACHED,
                              f"Group {req.group_id} has reached its maximum size "
                              f"({self.config.max_size} members).")
            if g is not None:
                self._check_assignors(g, member_id, assignors)
            g = self._get_or_create_group(txn, req.group_id, now_ms)
            # The member's own hold (it was fenced and rejoins with the same id) becomes its
            # current assignment below: what it reports still running of it stays owned by it,
            # as revoking, the rest is released (its own report says it stopped it).
            g.soft.hold_deadline.pop(member_id, None)
            g.soft.hold_instance.pop(member_id, None)
            hold = g.current.get(member_id)
            txn.write(rec.group_member(g.group_id, MemberMetadata(
                member_id=member_id, instance_id=req.instance_id, worker_url=req.worker_url,
                client_id=ctx.client_id, client_host=ctx.client_host,
                rebalance_timeout_ms=req.rebalance_timeout_ms, assignors=assignors,
            )))
            if hold is not None and is_hold(hold):
                self._event(txn, g, "hold ended", member_id, reason="member_rejoined",
                            items=len(hold.owned), still_running=len(hold.owned & owned))
            self._write_current(txn, g, member_id, self._joining_assignment(
                g, member_id, EMPTY, owned, NEW_MEMBER_ASSIGNMENT), now_ms)
            self._event(txn, g, "member joined", member_id,
                        assignors=[a.name for a in assignors],
                        rebalance_timeout_ms=req.rebalance_timeout_ms, client_id=ctx.client_id,
                        client_host=ctx.client_host, reports_running=len(owned))
            self._bump(txn, g, now_ms, "member_joined", member_id)
            g.soft.empty_since_ms = None
            self._note_principal(g, member_id, ctx)
            return g, member_id, True
        assert g is not None
        self._note_principal(g, member_id, ctx)
        # A known member rejoins with epoch 0 (KAFKA-19233: always allowed). It keeps its target;
        # what it still holds is what it reports owning (a static member returning from -2
        # takes back everything it held).
        self._update_member(txn, g, member_id, req, ctx, now_ms)
        cur = g.current[member_id]
        keep = cur.assigned if cur.epoch == -2 else owned & cur.owned
        self._write_current(
            txn, g, member_id, self._joining_assignment(g, member_id, keep, owned, cur), now_ms,
            fresh=cur.epoch == -2,  # (a static member's process that left may be a new one)
        )
        if cur.epoch != 0 or keep != cur.assigned:
            # (a repeated join at epoch 0, e.g. a lost answer resent, is not news)
            self._event(txn, g, "member rejoined", member_id, previous_member_epoch=cur.epoch,
                        kept=len(keep), reports_running=len(owned))
        return g, member_id, True

    def _note_principal(self, g: Group, member_id: str, ctx: RequestContext) -> None:
        """Remember who the member authenticated as (soft: a barred principal's new members are
        not chosen to compute; see _on_compute_expired) and whether it may compute at all
        (``RequestContext.may_assign``, as of its latest full heartbeat)."""
        soft = g.soft
        if ctx.may_assign == (member_id in soft.unauthorized_assigners):
            if ctx.may_assign:
                soft.unauthorized_assigners.discard(member_id)
            else:
                soft.unauthorized_assigners.add(member_id)
            soft.selection_epoch = -1
            comp = soft.computation
            if (not ctx.may_assign and comp is not None and comp.member_id == member_id
                    and comp.prepared_epoch is None):
                self._cancel_computation_quietly(g)
        principal = ctx.principal
        if principal == ANONYMOUS:
            soft.principals.pop(member_id, None)
            return
        if soft.principals.get(member_id) != principal:
            soft.principals[member_id] = principal
        if principal in soft.barred_principals and member_id not in soft.barred_assigners:
            soft.barred_assigners.add(member_id)
            soft.selection_epoch = -1

    @staticmethod
    def _joining_assignment(
        g: Group, member_id: str, keep: frozenset[Item], owned: frozenset[Item],
        cur: CurrentAssignment,
    ) -> CurrentAssignment:
        """A (re)joining member's current assignment at epoch 0: it keeps ``keep``; whatever
        else it reports running that no other member owns is held as revoking until it says it
        stopped it, so nobody else starts it meanwhile (a stale worker never causes a double
        run the coordinator could prevent)."""
        stray = frozenset(
            i for i in owned - keep
            if i in g.configured and g.owner.get(i, member_id) == member_id
        )
        return CurrentAssignment(
            0, 0, MemberState.UNREVOKED_ITEMS if stray else MemberState.STABLE, keep, stray,
            cur.metadata_version, cur.metadata_bytes,
        )

    def _replace_static(
        self, txn: _Txn, g: Group, old_id: str, new_id: str, req: ConnectGroupHeartbeatRequest,
        ctx: RequestContext, assignors: tuple[AssignorSpec, ...], now_ms: int,
    ) -> None:
        """A new member takes over a static member that left with -2: its target and what it
        held move to the new member id."""
        old_meta = g.members[old_id]
        old_cur = g.current[old_id]
        old_target = g.target.get(old_id)
        self._remove_records(txn, g, old_id)
        txn.write(rec.group_member(g.group_id, MemberMetadata(
            member_id=new_id, instance_id=req.instance_id,
            worker_url=req.worker_url if req.worker_url is not None else old_meta.worker_url,
            client_id=ctx.client_id, client_host=ctx.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms, assignors=assignors,
        )))
        if old_target is not None:
            txn.write(rec.target_member(g.group_id, new_id, old_target))
        # The new process gets new fencing tokens for what it takes over.
        txn.write(rec.current_assignment(g.group_id, new_id, self._tokened(
            txn, g, None, CurrentAssignment(
                0, 0, MemberState.STABLE, old_cur.assigned, EMPTY,
                old_cur.metadata_version, old_cur.metadata_bytes,
            ), now_ms)))
        self._forget_member(txn, g, old_id)
        self._event(txn, g, "member joined", new_id, replaced_member_id=old_id,
                    assignors=[a.name for a in assignors],
                    rebalance_timeout_ms=req.rebalance_timeout_ms, client_id=ctx.client_id,
                    client_host=ctx.client_host, took_over=len(old_cur.assigned))
        comp = g.soft.computation
        prepared = comp is not None and comp.prepared_epoch is not None
        if comp is not None and comp.member_id == old_id:
            self._cancel_computation(txn, g)
        # A computation prepared before this replacement assigns the old member id, whose
        # items the install then drops (it keeps only current members): bump, so a new
        # computation follows it. Also bump when the assignors changed.
        if _assignor_signature(old_meta.assignors) != _assignor_signature(assignors):
            self._bump(txn, g, now_ms, "assignors_changed", new_id)
        elif prepared:
            self._bump(txn, g, now_ms, "static_member_replaced", new_id)

    def _update_member(
        self, txn: _Txn, g: Group, member_id: str, req: ConnectGroupHeartbeatRequest,
        ctx: RequestContext, now_ms: int,
    ) -> None:
        m = g.members[member_id]
        assignors = m.assignors
        if req.client_assignors is not None:
            new = _assignors_from(req.client_assignors)
            if _assignor_signature(new) != _assignor_signature(m.assignors):
                self._check_assignors(g, member_id, new)
            assignors = new
        updated = MemberMetadata(
            member_id=member_id,
            instance_id=req.instance_id if req.instance_id is not None else m.instance_id,
            worker_url=req.worker_url if req.worker_url is not None else m.worker_url,
            client_id=ctx.client_id or m.client_id,
            client_host=ctx.client_host or m.client_host,
            rebalance_timeout_ms=(
                req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0
                else m.rebalance_timeout_ms
            ),
            assignors=assignors,
        )
        if updated != m:
            txn.write(rec.group_member(g.group_id, updated))
            if _assignor_signature(assignors) != _assignor_signature(m.assignors):
                self._bump(txn, g, now_ms, "assignors_changed", member_id)

    def _reconcile(
        self, txn: _Txn, g: Group, member_id: str, owned: frozenset[Item] | None, now_ms: int
    ) -> None:
        cur = g.current[member_id]
        if cur.epoch < 0:
            return
        force = member_id in g.soft.dirty
        target = g.target.get(member_id, EMPTY_TARGET)
        owner = g.owner.get
        nxt = next_assignment(member_id, cur, g.assignment_epoch, target, owned, owner, force)
        if force and nxt.state != MemberState.UNREVOKED_ITEMS:
            g.soft.dirty.discard(member_id)
        if nxt != cur:
            self._write_current(txn, g, member_id, nxt, now_ms)

    def _write_current(
        self, txn: _Txn, g: Group, member_id: str, nxt: CurrentAssignment, now_ms: int,
        fresh: bool = False,
    ) -> None:
        """Write a member's current assignment (its items' fencing tokens: :meth:`_tokened`);
        wake whoever waits for what it released; keep the rebalance (revocation) timer in step
        with the UnrevokedItems state."""
        cur = g.current.get(member_id)
        nxt = self._tokened(txn, g, cur, nxt, now_ms, fresh)
        if cur == nxt:
            return
        released = cur.owned - nxt.owned if cur is not None else EMPTY
        txn.write(rec.current_assignment(g.group_id, member_id, nxt))
        self._wake_for(txn, g, released)
        was_revoking = cur is not None and cur.state == MemberState.UNREVOKED_ITEMS
        if nxt.state == MemberState.UNREVOKED_ITEMS:
            if not was_revoking or cur is None or cur.revoking != nxt.revoking:
                self._arm_rebalance_timer(txn, g, member_id, nxt.epoch, now_ms)
        elif was_revoking:
            g.soft.rebalance_deadline.pop(member_id, None)
            txn.timer(REBALANCE, g.group_id, member_id, None)

    def _wake_for(self, txn: _Txn, g: Group, released: Iterable[Item]) -> None:
        for item in released:
            waiter = g.target_owner.get(item)
            if waiter is not None:
                txn.wake.add((g.group_id, waiter))

    def _rebalance_timeout(self, m: MemberMetadata) -> int:
        """The member's rebalance timeout, within ``group.connect.max.rebalance.timeout.ms``
        (a member recorded before that limit was lowered gets no more than it allows)."""
        return min(m.rebalance_timeout_ms, self.config.max_rebalance_timeout_ms)

    def _arm_rebalance_timer(
        self, txn: _Txn, g: Group, member_id: str, epoch: int, now_ms: int
    ) -> None:
        deadline = now_ms + self._rebalance_timeout(g.members[member_id])
        g.soft.rebalance_deadline[member_id] = (epoch, deadline)
        txn.timer(REBALANCE, g.group_id, member_id, deadline)

    def _touch_session(
        self, txn: _Txn, g: Group, member_id: str, now_ms: int, session_ms: int
    ) -> None:
        deadline = now_ms + session_ms
        g.soft.session_deadline[member_id] = deadline
        txn.timer(SESSION, g.group_id, member_id, deadline)

    # == leaving and fencing ========================================================================
    def _leave(self, txn: _Txn, g: Group, member_id: str, now_ms: int) -> Any:
        self._fence(txn, g, member_id, now_ms, "left")
        self._after(txn, g, now_ms)
        _, interval = self.config.for_group(g.configs)
        return ConnectGroupHeartbeatResponse(
            member_id=member_id, member_epoch=-1, heartbeat_interval_ms=interval,
            should_compute_assignment=False,
        )

    def _static_leave(self, txn: _Txn, g: Group, member_id: str, now_ms: int) -> Any:
        """-2: keep the work held (no epoch bump) until the session expires or the instance
        returns. The session timer is left as it is."""
        cur = g.current[member_id]
        if cur.epoch != -2:
            self._write_current(txn, g, member_id, CurrentAssignment(
                -2, cur.epoch, MemberState.STABLE, cur.assigned, EMPTY,
                cur.metadata_version, cur.metadata_bytes,
            ), now_ms)
            self._event(txn, g, "member left", member_id, static=True,
                        previous_member_epoch=cur.epoch, kept=len(cur.assigned),
                        session_deadline_ms=g.soft.session_deadline.get(member_id))
        comp = g.soft.computation
        if comp is not None and comp.member_id == member_id:
            self._cancel_computation(txn, g)
        self._after(txn, g, now_ms)
        _, interval = self.config.for_group(g.configs)
        return ConnectGroupHeartbeatResponse(
            member_id=member_id, member_epoch=-2, heartbeat_interval_ms=interval,
            should_compute_assignment=False,
        )

    def _remove_records(self, txn: _Txn, g: Group, member_id: str, hold_until: int | None = None,
                        now_ms: int = 0) -> None:
        """Tombstones for a member's records. With ``hold_until``, its current assignment is
        replaced by a hold instead (see :meth:`_hold_for`): its items stay owned until then."""
        released = g.current[member_id].owned if member_id in g.current else EMPTY
        if hold_until is not None and released:
            self._event(txn, g, "hold started", member_id, items=len(released),
                        names=self._names(released), until_ms=hold_until,
                        hold_ms=hold_until - now_ms)
            member = g.members.get(member_id)
            g.soft.hold_instance[member_id] = member.instance_id if member is not None else None
            cur = g.current[member_id]
            txn.write(rec.current_assignment(g.group_id, member_id, CurrentAssignment(
                HELD_EPOCH, hold_until - now_ms, MemberState.UNREVOKED_ITEMS, EMPTY, released,
                tokens=cur.tokens)))
            self._arm_hold(txn, g, member_id, hold_until)
            released = EMPTY
        else:
            txn.write(rec.tombstone(CurrentMemberAssignmentKey(group_id=g.group_id, member_id=member_id)))
        if member_id in g.target:
            txn.write(rec.tombstone(
                TargetAssignmentMemberKey(group_id=g.group_id, member_id=member_id)))
        txn.write(rec.tombstone(GroupMemberKey(group_id=g.group_id, member_id=member_id)))
        self._wake_for(txn, g, released)

    def _hold_for(self, g: Group, member_id: str, now_ms: int) -> int | None:
        """Until when a fenced member's items stay held, or None (nothing to hold).

        A fenced worker stops its work when it learns of the fence: from the fencing response,
        or by itself when its session lease ends, which is no later than the session deadline
        here (the lease runs from the *send* time of its last acknowledged heartbeat). Each
        stop may take half its rebalance timeout (the worker's stop budget). Handing its items
        on before that end could start them twice (found by the simulator: "fence-stop-tail").
        The worker's side of the bargain is the fail-stop rule (worker_client/failstop.py):
        nothing of it runs past its lease's end plus that budget, or its process ends.
        A member that left statically (-2) stopped everything before it left: no hold."""
        cur = g.current.get(member_id)
        m = g.members.get(member_id)
        if cur is None or m is None or not cur.owned or cur.epoch == -2:
            return None
        learns_by = max(now_ms, g.soft.session_deadline.get(member_id, now_ms))
        return learns_by + max(100, self._rebalance_timeout(m) // 2)

    def _arm_hold(self, txn: _Txn, g: Group, member_id: str, until: int) -> None:
        g.soft.hold_deadline[member_id] = until
        txn.timer(HOLD, g.group_id, member_id, until)

    def _on_hold_expired(self, txn: _Txn, g: Group, member_id: str, now_ms: int) -> None:
        cur = g.current.get(member_id)
        if cur is None or member_id in g.members or not is_hold(cur):
            return  # released already, or the member rejoined and took it over
        until = g.soft.hold_deadline.get(member_id)
        if until is not None and until > now_ms:
            txn.timer(HOLD, g.group_id, member_id, until)
            return
        g.soft.hold_deadline.pop(member_id, None)
        txn.write(rec.tombstone(CurrentMemberAssignmentKey(group_id=g.group_id, member_id=member_id)))
        self._wake_for(txn, g, cur.owned)
        self._event(txn, g, "hold ended", member_id, reason="expired", items=len(cur.owned),
                    names=self._names(cur.owned),
                    instance_id=g.soft.hold_instance.pop(member_id, None))

    def _forget_member(self, txn: _Txn, g: Group, member_id: str) -> None:
        soft = g.soft
        soft.session_deadline.pop(member_id, None)
        soft.last_heartbeat.pop(member_id, None)
        soft.rebalance_deadline.pop(member_id, None)
        soft.reported_owned.pop(member_id, None)
        soft.instance_states.pop(member_id, None)
        soft.dirty.discard(member_id)
        soft.barred_assigners.discard(member_id)
        soft.unauthorized_assigners.discard(member_id)
        soft.principals.pop(member_id, None)
        txn.timer(SESSION, g.group_id, member_id, None)
        txn.timer(REBALANCE, g.group_id, member_id, None)
        if soft.classic_join_deadline.pop(member_id, None) is not None:
            txn.timer(CLASSIC_JOIN, g.group_id, member_id, None)
        if soft.classic_sync_deadline.pop(member_id, None) is not None:
            txn.timer(CLASSIC_SYNC, g.group_id, member_id, None)

    def _fence(self, txn: _Txn, g: Group, member_id: str, now_ms: int, reason: str,
               hold: bool = False, **detail: Any) -> None:
        """Remove a member (``reason``: ``left``, or one of FENCE_REASONS): tombstones in
        Kafka's order, then a group epoch bump. ``hold``: the member did not say it stopped
        its work (it was fenced, it did not leave): its items are held (:meth:`_hold_for`).
        ``detail``: more fields for the event."""
        m = g.members[member_id]
        cur = g.current.get(member_id)
        who = {"instance_id": m.instance_id, "member_epoch": cur.epoch if cur is not None else None}
        owned = len(cur.owned) if cur is not None else 0
        if reason == "left":
            self._event(txn, g, "member left", member_id, static=False, released=owned)
        else:
            self._event(txn, g, "member fenced", member_id, reason=reason, owned=owned, **detail)
        hold_until = self._hold_for(g, member_id, now_ms) if hold else None
        self._remove_records(txn, g, member_id, hold_until, now_ms)
        self._forget_member(txn, g, member_id)
        comp = g.soft.computation
        if comp is not None and comp.member_id == member_id:
            self._cancel_computation(txn, g)
        self._bump(txn, g, now_ms, "member_left" if reason == "left" else "member_fenced",
                   member_id, **who)
        if not g.members:
            g.soft.empty_since_ms = now_ms

    # == assignment computation =====================================================================
    def _selection(self, g: Group) -> tuple[str | None, dict[str, None]]:
        """The group's assignor and the members eligible to compute with it (their version
        range covers every member's): cached per group epoch, read from the group's assignor
        index in O(one member's assignors)."""
        soft = g.soft
        if soft.selection_epoch != g.epoch:
            index = g.assignors
            some = next(iter(g.members.values()), None)
            if some is not None and some.classic is not None:
                some = next((m for m in g.members.values() if m.classic is None), None)
            name = index.select(len(g.members) - len(g.classic_members), some)
            if g.members and some is None:  # classic members only: the coordinator computes
                name = cl.server_assignor_name(g)
            soft.selected_assignor = name
            barred = [g.members[mid] for mid in (soft.barred_assigners
                                                 | soft.unauthorized_assigners)
                      if mid in g.members]
            soft.eligible = index.eligible(name, barred) if name else {}
            soft.selection_epoch = g.epoch
            if not g.members:
                soft.assigner_error = None
            elif some is None:
                soft.assigner_error = None
            elif name is None:
                soft.assigner_error = "no client-side assignor is supported by every member"
            elif not soft.eligible:
                soft.assigner_error = (
                    f"no member's {name} version range covers every other member's"
                    if not soft.unauthorized_assigners else
                    f"no member allowed to compute the assignment (authorizer.assign.operation) "
                    f"has a {name} version range covering every other member's"
                )
            else:
                soft.assigner_error = None
        return soft.selected_assignor, soft.eligible

    def _after(self, txn: _Txn, g: Group, now_ms: int) -> None:
        """Bring the group's bookkeeping in line after a change: catch the assignment epoch up
        in an empty group (KAFKA-20442), choose a member to compute when one is needed."""
        if not g.members:
            if g.epoch > g.assignment_epoch or not g.has_target_metadata:
                txn.write(rec.target_metadata(
                    g.group_id, g.epoch, 0, g.assignor_state, g.scheduled_rebalance_at_ms,
                    g.kept_for))
            if g.soft.computation is not None:
                self._cancel_computation(txn, g)
            self._maybe_arm_expiry(txn, g, now_ms)
            return
        if g.epoch <= g.assignment_epoch:
            # Nothing to compute. A computation can outlive its need when the records that
            # bumped the epoch were rolled back (a failed write): drop it.
            if g.soft.computation is not None and g.soft.computation.prepared_epoch is None:
                self._cancel_computation(txn, g)
            return
        if len(g.classic_members) == len(g.members):
            self._compute_for_classic(txn, g, now_ms)
            return
        comp = g.soft.computation
        if comp is not None and comp.member_id in g.members:
            # FIX (tests): the chosen worker stays chosen only while it is eligible (seed 000
            # "Worker Selection": it must handle every member's version range). A member with a
            # wider range may have joined since it was chosen; unless it already prepared (it
            # is computing for an epoch it covered), choose again. Eligibility only changes with
            # the group epoch, so a selection already computed for this epoch was checked then
            # (every bump runs this before anything else reads the selection): O(1) per heartbeat.
            if comp.prepared_epoch is not None or g.soft.selection_epoch == g.epoch:
                return
            if comp.member_id in self._selection(g)[1]:
                return
            self._cancel_computation(txn, g)
        self._choose_assigner(txn, g, now_ms, exclude=None)

    def _choose_assigner(self, txn: _Txn, g: Group, now_ms: int, exclude: str | None) -> None:
        _, eligible = self._selection(g)
        if not eligible and g.soft.barred_assigners:
            # Every member able to compute failed to in time: give them all another chance
            # (a group must not stay without an assigner; each try is bounded).
            g.soft.barred_assigners.clear()
            g.soft.barred_principals.clear()
            g.soft.selection_epoch = -1
            _, eligible = self._selection(g)
        candidates = [
            m for m in eligible
            if m != exclude and g.current.get(m, NEW_MEMBER_ASSIGNMENT).epoch != -2
        ]
        if not candidates and exclude is not None and exclude in eligible:
            candidates = [exclude]  # the only one able to: let it try again
        if not candidates:
            g.soft.computation = None
            if g.classic_members:
                # No member of the new protocol can compute now: the group's classic members
                # must not wait for one.
                self._compute_for_classic(txn, g, now_ms)
            return
        last = g.soft.last_assigner
        chosen = last if last in candidates else min(candidates)
        g.soft.computation = Computation(member_id=chosen, chosen_at_ms=now_ms)
        g.soft.last_assigner = chosen
        txn.wake.add((g.group_id, chosen))
        self._event(txn, g, "assigner chosen", chosen, assignor=g.soft.selected_assignor,
                    eligible=len(eligible), previous_assigner=exclude)

    def _notify_assigner(self, txn: _Txn, g: Group, comp: Computation, now_ms: int) -> None:
        """The chosen member is told: its rebalance timeout starts now, at most
        ``group.connect.max.assignment.timeout.ms``."""
        config = self.config
        timeout = min(max(g.members[comp.member_id].rebalance_timeout_ms,
                          config.assignment_timeout_floor_ms), config.max_assignment_timeout_ms)
        comp.notified = True
        comp.deadline_ms = now_ms + timeout
        txn.timer(COMPUTE, g.group_id, "", comp.deadline_ms)

    @staticmethod
    def _cancel_computation_quietly(g: Group) -> None:
        """Drop the computation in flight; the caller's ``_after`` chooses again and re-arms
        (a stale compute timer re-checks and does nothing)."""
        g.soft.computation = None

    def _cancel_computation(self, txn: _Txn, g: Group) -> None:
        g.soft.computation = None
        txn.timer(COMPUTE, g.group_id, "", None)

    def _prepare(self, txn: _Txn, req: ConnectGroupPrepareAssignmentRequest, now_ms: int) -> Any:
        g, comp = self._check_assigner(req.group_id, req.member_id, req.member_epoch)
        name, _ = self._selection(g)
        if not comp.notified:
            self._notify_assigner(txn, g, comp, now_ms)
        else:
            txn.timer(COMPUTE, g.group_id, "", comp.deadline_ms)
        if comp.prepared_epoch != g.epoch:
            comp.prepared_at_ms = now_ms
            self._event(txn, g, "assignment computing", comp.member_id, assignor=name,
                        members=len(g.members), items=len(g.configured),
                        waited_ms=now_ms - comp.chosen_at_ms)
        comp.prepared_epoch = g.epoch
        comp.prepared_members = frozenset(g.members)
        comp.prepared_items = frozenset(g.configured)
        members = []
        for mid, m in g.members.items():
            spec = next((a for a in m.assignors if a.name == name), None)
            cur = g.current[mid]
            tc, tt = split_items(g.target_items(mid))
            oc, ot = split_items(cur.owned)
            members.append(_prep.Member(
                member_id=mid, member_epoch=cur.epoch, instance_id=m.instance_id,
                worker_url=m.worker_url,
                reason=spec.reason if spec else 0,
                metadata_version=spec.metadata_version if spec else 0,
                metadata_bytes=spec.metadata_bytes if spec else b"",
                target_connectors=tuple(tc),
                target_tasks=tuple(_prep.TaskId(connector=t.connector, task=t.task) for t in tt),
                owned_connectors=tuple(oc),
                owned_tasks=tuple(_prep.TaskId(connector=t.connector, task=t.task) for t in ot),
            ))
        return ConnectGroupPrepareAssignmentResponse(
            group_epoch=g.epoch,
            assignment_epoch=g.assignment_epoch,
            assignor_name=name or "",
            coordinator_time_ms=now_ms,
            assignor_state=g.assignor_state,
            connectors=tuple(
                _prep.ConnectorSpec(
                    name=c.name, task_count=running_task_count(c, g.task_configs.get(c.name)),
                    config=tuple(_prep.ConfigEntry(name=k, value=v) for k, v in c.config),
                )
                for c in sorted(g.connectors.values(), key=lambda c: c.name)
            ),
            members=tuple(members),
        )

    def _check_assigner(self, group_id: str, member_id: str, epoch: int) -> tuple[Group, Computation]:
        """Seed 000's checks for Prepare/InstallAssignment, in its order."""
        if not group_id:
            raise _Reject(E.INVALID_REQUEST, "GroupId must be non-empty.")
        if not member_id:
            raise _Reject(E.INVALID_REQUEST, "MemberId must be non-empty.")
        if epoch < 0:
            raise _Reject(E.INVALID_REQUEST, "MemberEpoch must be >= 0.")
        g = self.state.groups.get(group_id)
        if g is None:
            raise _Reject(E.GROUP_ID_NOT_FOUND, f"Group {group_id} does not exist.")
        cur = g.current.get(member_id)
        if member_id not in g.members or cur is None:
            raise _Reject(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not in group {group_id}.")
        if cur.epoch != epoch:
            raise _Reject(
                E.FENCED_MEMBER_EPOCH,
                f"MemberEpoch {epoch} does not match the member's epoch {cur.epoch}; retry after "
                "the next heartbeat.",
            )
        comp = g.soft.computation
        if comp is None or comp.member_id != member_id:
            raise _Reject(
                E.UNKNOWN_MEMBER_ID,
                f"Member {member_id} is not the member chosen to compute the assignment of "
                f"group {group_id}.",
            )
        return g, comp

    def _install(self, txn: _Txn, req: ConnectGroupInstallAssignmentRequest, now_ms: int) -> Any:
        if req.scheduled_rebalance_delay_ms < -1:
            raise _Reject(E.INVALID_REQUEST, "ScheduledRebalanceDelayMs must be >= -1.")
        seen: set[str] = set()
        for m in req.members:
            if not m.member_id:
                raise _Reject(E.INVALID_REQUEST, "Members[].MemberId must be non-empty.")
            if m.member_id in seen:
                raise _Reject(E.INVALID_REQUEST, f"Member {m.member_id} is listed twice.")
            seen.add(m.member_id)
            problem = _validate_items(m.connectors, m.tasks, "Members[].")
            if problem:
                raise _Reject(E.INVALID_REQUEST, problem)
        g, comp = self._check_assigner(req.group_id, req.member_id, req.member_epoch)
        if comp.prepared_epoch is None or comp.prepared_epoch != req.group_epoch:
            raise _Reject(
                E.INVALID_ASSIGNMENT,
                f"GroupEpoch {req.group_epoch} is not the epoch of the PrepareAssignment in "
                f"flight ({comp.prepared_epoch}); call PrepareAssignment again.",
            )
        if comp.prepared_epoch <= g.assignment_epoch:
            raise _Reject(E.INVALID_ASSIGNMENT,
                          f"Group epoch {comp.prepared_epoch} already has an assignment.")
        targets: dict[str, TargetMember] = {}
        kept = g.kept_for  # the assignor failed: the current target stays, and what it kept
        if req.error == 0:
            targets = self._validate_assignment(g, comp, req)
            kept = self._validate_kept(comp, req, targets)
        # Install, even if the group moved on: restricted to today's members and items.
        self._write_targets(txn, g, comp.prepared_epoch, req.error, req.assignor_state,
                            req.scheduled_rebalance_delay_ms, targets, now_ms,
                            req.member_id, comp, kept)
        self._after(txn, g, now_ms)  # a newer epoch: the next computation starts right away
        return ConnectGroupInstallAssignmentResponse()

    def _write_targets(self, txn: _Txn, g: Group, epoch: int, error: int, assignor_state: bytes,
                       delay: int, targets: dict[str, TargetMember], now_ms: int,
                       by: str | None, comp: Computation | None,
                       kept: tuple[KeptFor, ...]) -> None:
        """Install a computed target for group epoch ``epoch``: restricted to today's members
        and items (the group may have moved on since), with the items ``kept`` for departed
        members until the scheduled rebalance. ``by``: the member that computed it (None: the
        coordinator, for a group of classic members only)."""
        scheduled_at = now_ms + delay if delay >= 0 else -1
        changed = assigned = 0
        if error == 0:
            for mid in list(g.members):
                new = targets.get(mid, EMPTY_TARGET)
                new = TargetMember(new.items & g.configured, new.metadata_version,
                                   new.metadata_bytes)
                assigned += len(new.items)
                if new != g.target.get(mid, EMPTY_TARGET) or mid not in g.target:
                    changed += 1
                    txn.write(rec.target_member(g.group_id, mid, new))
            state = assignor_state
        else:
            state = g.assignor_state  # the assignor failed: the current target stays
        txn.write(rec.target_metadata(g.group_id, epoch, error, state, scheduled_at, kept))
        name = g.soft.selected_assignor
        timing: dict[str, Any] = {"compute_ms": 0, "since_chosen_ms": 0, "computed_by": "coordinator"}
        if comp is not None:
            timing = {"compute_ms": (now_ms - comp.prepared_at_ms
                                     if comp.prepared_at_ms is not None else None),
                      "since_chosen_ms": now_ms - comp.chosen_at_ms}
        if error == 0:
            self._event(txn, g, "target assignment installed", by, assignor=name,
                        members=len(g.members), changed_members=changed, items=assigned,
                        unassigned=len(g.configured) - assigned,
                        scheduled_rebalance_delay_ms=delay if delay >= 0 else None, **timing)
        else:
            self._event(txn, g, "assignor failed", by, assignor=name,
                        error=error_name(error), error_code=error,
                        scheduled_rebalance_delay_ms=delay if delay >= 0 else None, **timing)
        txn.timer(SCHEDULED, g.group_id, "", scheduled_at if scheduled_at >= 0 else None)
        self._cancel_computation(txn, g)
        for mid in g.members:
            txn.wake.add((g.group_id, mid))

    def _compute_for_classic(self, txn: _Txn, g: Group, now_ms: int) -> None:
        """A group whose members all speak the classic protocol has nobody to compute its
        target: the coordinator runs Kafka Connect's assignor itself (the same pure code the
        workers run), at once, and installs the result."""
        name = cl.server_assignor_name(g)
        assignor = (EagerAssignor() if name == "eager"
                    else IncrementalCooperativeAssignor(max_delay_ms=self.config.classic_max_delay_ms))
        g.soft.selected_assignor = name
        g.soft.assigner_error = None
        spec = GroupSpec(
            group_epoch=g.epoch, assignment_epoch=g.assignment_epoch, coordinator_time_ms=now_ms,
            connectors={c.name: running_task_count(c, g.task_configs.get(c.name))
                        for c in g.connectors.values()},
            members={mid: MemberSpec(member_id=mid, member_epoch=g.current[mid].epoch,
                                     instance_id=m.instance_id, worker_url=m.worker_url,
                                     target=g.target_items(mid), owned=g.current[mid].owned)
                     for mid, m in g.members.items()},
            assignor_state=g.assignor_state,
        )
        result = assignor.assign(spec)
        targets = {mid: TargetMember(frozenset(t.items), t.metadata_version, t.metadata)
                   for mid, t in result.members.items() if mid in g.members}
        delay = result.scheduled_rebalance_delay_ms
        assigned = {i for t in targets.values() for i in t.items}
        kept = tuple(KeptFor(mid, instance_id, frozenset(items) & g.configured - assigned)
                     for mid, (instance_id, items) in sorted(result.kept_for.items())
                     if frozenset(items) & g.configured - assigned) if delay >= 0 else ()
        self._write_targets(txn, g, g.epoch, result.error, result.assignor_state, delay,
                            targets, now_ms, None, None, kept)

    def _validate_assignment(
        self, g: Group, comp: Computation, req: ConnectGroupInstallAssignmentRequest
    ) -> dict[str, TargetMember]:
        """Seed 000 "Assignment Validation", against the metadata the assignment was computed
        from: every item assigned (unless a rebalance is scheduled, see below), none twice, no
        unknown item, every member id valid."""
        targets: dict[str, TargetMember] = {}
        where: dict[Item, str] = {}
        for m in req.members:
            if m.member_id not in comp.prepared_members:
                raise _Reject(E.INVALID_ASSIGNMENT,
                              f"Member {m.member_id} was not a member of the group at epoch "
                              f"{comp.prepared_epoch}.")
            items = items_from_wire(m.connectors, m.tasks)
            if len(items) != len(m.connectors) + len(m.tasks):
                raise _Reject(E.INVALID_ASSIGNMENT,
                              f"Member {m.member_id} is assigned the same item twice.")
            for item in items:
                if item in where:
                    raise _Reject(E.INVALID_ASSIGNMENT,
                                  f"{item} is assigned to both {where[item]} and {m.member_id}.")
                where[item] = m.member_id
            targets[m.member_id] = TargetMember(items, m.metadata_version, m.metadata_bytes)
        assigned = set(where)
        unknown = assigned - comp.prepared_items
        if unknown:
            names = ", ".join(sorted(str(i) for i in unknown)[:5])
            raise _Reject(E.INVALID_ASSIGNMENT, f"Unknown connectors/tasks assigned: {names}.")
        missing = comp.prepared_items - assigned
        if missing and req.scheduled_rebalance_delay_ms < 0:
            # Work may be held unassigned only with a follow-up computation scheduled: that is
            # how an assignor waits for a departed worker (seed 000 "Worker Leaving", KIP-415's
            # delay) without wedging items forever.
            names = ", ".join(sorted(str(i) for i in missing)[:5])
            raise _Reject(E.INVALID_ASSIGNMENT,
                          f"{len(missing)} connectors/tasks are not assigned: {names}.")
        return targets

    @staticmethod
    def _validate_kept(comp: Computation, req: ConnectGroupInstallAssignmentRequest,
                       targets: dict[str, TargetMember]) -> tuple[KeptFor, ...]:
        """The install's ``KeptFor``: items it leaves unassigned, each kept for one departed
        member, only with a scheduled rebalance (else INVALID_ASSIGNMENT). Describe shows of them
        what is still configured and in nobody's target."""
        if not req.kept_for:
            return ()
        if req.scheduled_rebalance_delay_ms < 0:
            raise _Reject(E.INVALID_ASSIGNMENT,
                          "KeptFor needs a scheduled rebalance (ScheduledRebalanceDelayMs >= 0).")
        assigned = {i for t in targets.values() for i in t.items}
        seen: dict[Item, str] = {}
        kept = []
        for k in req.kept_for:
            problem = (_validate_items(k.connectors, k.tasks, "KeptFor[].")
                       or ("KeptFor[].MemberId must be non-empty." if not k.member_id else None))
            if problem:
                raise _Reject(E.INVALID_REQUEST, problem)
            items = items_from_wire(k.connectors, k.tasks)
            for item in items:
                if item in assigned or item not in comp.prepared_items:
                    raise _Reject(E.INVALID_ASSIGNMENT,
                                  f"{item} is kept for {k.member_id} but is "
                                  f"{'assigned' if item in assigned else 'unknown'}.")
                if item in seen:
                    raise _Reject(E.INVALID_ASSIGNMENT,
                                  f"{item} is kept for both {seen[item]} and {k.member_id}.")
                seen[item] = k.member_id
            if items:
                kept.append(KeptFor(k.member_id, k.instance_id, items))
        return tuple(kept)

    # == timers =====================================================================================
    # An expiry is re-checked against the soft deadline. One that arrives early (the deadline
    # moved, e.g. by a heartbeat whose records were then rolled back along with its timer
    # change) re-arms the timer at the soft deadline, so a deadline is never lost.
    def _on_session_expired(self, txn: _Txn, g: Group, member_id: str, now_ms: int) -> None:
        deadline = g.soft.session_deadline.get(member_id)
        if member_id not in g.members:
            return
        # No soft deadline for a member: its removal was rolled back (a failed write) after
        # the soft state had been dropped. The timer that fired is its last real deadline.
        if deadline is not None and deadline > now_ms:
            txn.timer(SESSION, g.group_id, member_id, deadline)
            return
        session_ms = self._session_ms(g, g.members[member_id])
        last = g.soft.last_heartbeat.get(member_id)
        if deadline is not None and last is not None and last <= deadline:
            # (armed at that heartbeat, with the session timeout of then: a group config
            # changed since applies from the next heartbeat only)
            session_ms = deadline - last
        cur = g.current.get(member_id)
        self._fence(txn, g, member_id, now_ms, "session_expired", hold=True,
                    static_leave=cur is not None and cur.epoch == -2, session_timeout_ms=session_ms,
                    silent_ms=now_ms - deadline + session_ms if deadline is not None else None)

    def _on_rebalance_expired(self, txn: _Txn, g: Group, member_id: str, now_ms: int) -> None:
        armed = g.soft.rebalance_deadline.get(member_id)
        cur = g.current.get(member_id)
        if armed is None or cur is None:
            return
        if armed[1] > now_ms:
            txn.timer(REBALANCE, g.group_id, member_id, armed[1])
            return
        if cur.state == MemberState.UNREVOKED_ITEMS and cur.epoch == armed[0]:
            self._fence(txn, g, member_id, now_ms, "rebalance_timeout", hold=True,
                        revoking=len(cur.revoking),
                        rebalance_timeout_ms=g.members[member_id].rebalance_timeout_ms)

    def _on_compute_expired(self, txn: _Txn, g: Group, now_ms: int) -> None:
        comp = g.soft.computation
        if comp is None or comp.deadline_ms is None:
            return
        if comp.deadline_ms > now_ms:
            txn.timer(COMPUTE, g.group_id, "", comp.deadline_ms)
            return
        txn.timer(COMPUTE, g.group_id, "", None)
        self._event(txn, g, "assignment computation timed out", comp.member_id,
                    assignor=g.soft.selected_assignor, prepared=comp.prepared_epoch is not None,
                    waited_ms=now_ms - comp.chosen_at_ms)
        # A member that did not compute in time is not chosen again while it stays in the
        # group, and its version range no longer decides who is eligible: a member declaring
        # the widest range (the only one covering everybody's) cannot hold every rebalance of
        # the group by never computing. (Should every eligible member fail, the last one is
        # tried again: see _choose_assigner.)
        soft = g.soft
        if comp.member_id in g.members:
            soft.barred_assigners.add(comp.member_id)
            # Its principal's other and later members too (an authenticated principal: one
            # that rejoins under a new member id is not chosen again either).
            principal = soft.principals.get(comp.member_id, ANONYMOUS)
            if principal != ANONYMOUS:
                soft.barred_principals.add(principal)
                soft.barred_assigners.update(
                    mid for mid, p in soft.principals.items() if p == principal)
            soft.selection_epoch = -1
        self._choose_assigner(txn, g, now_ms, exclude=comp.member_id)

    def _on_scheduled(self, txn: _Txn, g: Group, now_ms: int) -> None:
        at = g.scheduled_rebalance_at_ms
        if at < 0 or at > now_ms or g.epoch != g.assignment_epoch or not g.members:
            return
        self._bump(txn, g, now_ms, "scheduled_rebalance", scheduled_at_ms=at)

    def _maybe_arm_expiry(self, txn: _Txn, g: Group, now_ms: int) -> None:
        if g.members or g.connectors or g.offset_garbage or g.configs:
            return  # (garbage offsets: their last tombstones arm it; config overrides: their
            # deletion does)
        if g.soft.empty_since_ms is None:
            g.soft.empty_since_ms = now_ms
        txn.timer(EXPIRE, g.group_id, "", g.soft.empty_since_ms + self.config.empty_group_retention_ms)

    def _on_expire(self, txn: _Txn, g: Group, now_ms: int) -> None:
        since = g.soft.empty_since_ms
        if (g.members or g.connectors or since is None or g.offsets or g.offset_garbage
                or g.configs):
            return  # (garbage offsets: their last tombstones arm the expiry again; overrides
            # keep the group until they are deleted, whose write arms it again)
        if since + self.config.empty_group_retention_ms > now_ms:
            return
        gid = g.group_id
        for mid, cur in list(g.current.items()):  # holds of fenced members (nobody could take their items)
            self._event(txn, g, "hold ended", mid, reason="group_deleted", items=len(cur.owned),
                        instance_id=g.soft.hold_instance.pop(mid, None))
            txn.write(rec.tombstone(CurrentMemberAssignmentKey(group_id=gid, member_id=mid)))
            g.soft.hold_deadline.pop(mid, None)
        self._event(txn, g, "group deleted", empty_ms=now_ms - since)
        for name in list(g.task_configs):  # (of no live connector: garbage)
            txn.write(rec.tombstone(ConnectorTaskConfigsKey(group_id=gid, connector=name)))
        if g.configs:
            txn.write(rec.tombstone(GroupConfigurationKey(group_id=gid)))
        # FIX (tests): always tombstone GroupConnectors. A connectors record written at group
        # epoch 0 (connectors created, then all deleted, in a member-less group) leaves
        # connectors_epoch == 0, and the old ``if g.connectors_epoch`` skipped its tombstone: once
        # compaction dropped the GroupMetadata tombstone, a reload recreated the deleted group
        # from that record. A tombstone for an absent key is harmless.
        txn.write(rec.tombstone(GroupConnectorsKey(group_id=gid)))
        if g.has_target_metadata:
            txn.write(rec.tombstone(TargetAssignmentMetadataKey(group_id=gid)))
        txn.write(rec.tombstone(GroupMetadataKey(group_id=gid)))

    # == admin ======================================================================================
    def _alter_connectors(
        self, txn: _Txn, req: ConnectGroupAlterConnectorsRequest, now_ms: int
    ) -> Any:
        if not req.group_id:
            raise _Reject(E.INVALID_REQUEST, "GroupId must be non-empty.")
        names: set[str] = set()
        for spec in req.upserts:
            # (the same checks refuse such a connector in a replayed log: validation.py)
            problem = validate_connector(spec.name, spec.task_count, [c.name for c in spec.config])
            if problem is None and spec.name in names:
                problem = f"Connector {spec.name} is listed twice."
            if problem is not None:
                raise _Reject(E.INVALID_REQUEST, problem)
            names.add(spec.name)
        g = self.state.groups.get(req.group_id)
        current = dict(g.connectors) if g is not None else {}
        for name in req.deletes:
            if name in names:
                raise _Reject(E.INVALID_REQUEST, f"Connector {name} is both upserted and deleted.")
            if name not in current:
                raise _Reject(E.INVALID_REQUEST,
                              f"Connector {name} does not exist in group {req.group_id}.")
        updated = dict(current)
        for name in req.deletes:
            del updated[name]
        for spec in req.upserts:
            # (an update keeps the connector's incarnation; a new connector gets one below)
            old = current.get(spec.name)
            updated[spec.name] = ConnectorSpec(
                spec.name, spec.task_count, tuple((c.name, c.value) for c in spec.config),
                old.incarnation if old is not None else _NEW_INCARNATION,
            )
        # (A group already above a lowered limit may still shrink, or change configs only.)
        total = item_count(updated.values())
        if total > self.config.max_tasks and total > item_count(current.values()):
            raise _Reject(
                E.INVALID_REQUEST,
                f"Group {req.group_id} would have {total} items (connectors plus tasks); "
                f"group.connect.max.tasks is {self.config.max_tasks}.",
            )
        if updated != current:
            self._check_log_footprint(req.group_id, current, updated)
        if g is None:
            self._check_new_group(req.group_id)
        epoch = g.epoch if g is not None else 0
        if req.validate_only or updated == current:
            if not req.validate_only and g is None:
                g = self._get_or_create_group(txn, req.group_id, now_ms)
            return ConnectGroupAlterConnectorsResponse(group_epoch=epoch)
        g = self._get_or_create_group(txn, req.group_id, now_ms)
        # A connector created gets its incarnation from the group's fencing token counter:
        # what belongs to an earlier connector of the same name (task configs, offsets) is
        # told apart by it.
        for name, created in updated.items():
            if name not in current:
                floor = self._incarnation_floor(g, name)
                if floor > (g.token_counter or 0):
                    g.token_counter = floor - 1  # (the next token: above the leftovers')
                updated[name] = replace(created, incarnation=self._next_token(txn, g, now_ms))
        # A change of connectors or task counts is a change of group metadata: bump the epoch.
        # A group without members has nothing to assign, so its epoch stays.
        bump = bool(g.members)
        before = set(g.configured)
        txn.write(rec.group_connectors(g.group_id, g.epoch + bump, updated.values()))
        for name in req.deletes:
            if name in g.task_configs:
                txn.write(rec.tombstone(ConnectorTaskConfigsKey(group_id=g.group_id,
                                                                connector=name)))
        if bump:
            self._bump(txn, g, now_ms, "connectors_changed", connectors=len(updated),
                       items=item_count(updated.values()))
        self._strip_removed(txn, g, before - g.configured)
        # A target state changed: the states reported for the connector's items are of before
        # (a STOPPED one would let an offsets change in while an instance resumed meanwhile is
        # stopping again): forgotten until the workers report again (they do on their epoch
        # change).
        moved = {name for name, spec in updated.items() if name in current and
                 target_state(dict(spec.config)) != target_state(dict(current[name].config))}
        if moved:
            for reported in g.soft.instance_states.values():
                for item in [i for i in reported if i.connector in moved]:
                    del reported[item]
        if g.connectors:
            g.soft.empty_since_ms = None
        if g.offset_garbage:  # a deleted connector's offsets: tombstoned in batches, from now
            txn.timer(OFFSETS, g.group_id, "", now_ms)
        self._after(txn, g, now_ms)
        return ConnectGroupAlterConnectorsResponse(group_epoch=g.epoch)

    def _check_owner(self, group_id: str, member_id: str, member_epoch: int,
                     item: Item) -> tuple[Group, ConnectorSpec]:
        """The fence of a write made for an item (task configs): the member exists, its epoch
        is the current one (a lower one: STALE_MEMBER_EPOCH, it may retry once its heartbeat
        brought the new one; a higher one: FENCED_MEMBER_EPOCH), the item's connector exists,
        and the member owns the item (assigned, or being revoked and not reported released).
        Returns the group and the connector."""
        g = self.state.groups.get(group_id)
        if g is None or member_id not in g.members:
            raise _Reject(E.UNKNOWN_MEMBER_ID,
                          f"Member {member_id} is not a member of group {group_id}.")
        cur = g.current.get(member_id, NEW_MEMBER_ASSIGNMENT)
        if member_epoch < cur.epoch:
            raise _Reject(E.STALE_MEMBER_EPOCH,
                          f"MemberEpoch {member_epoch} is older than the member's epoch "
                          f"{cur.epoch}; retry with the epoch of the latest heartbeat.")
        if member_epoch > cur.epoch:
            raise _Reject(E.FENCED_MEMBER_EPOCH,
                          f"MemberEpoch {member_epoch} is newer than the member's epoch "
                          f"{cur.epoch}.")
        spec = g.connectors.get(item.connector)
        if spec is None:
            raise _Reject(E.INVALID_REQUEST,
                          f"Connector {item.connector} does not exist in group {group_id}.")
        if item not in cur.assigned and item not in cur.revoking:
            raise _Reject(E.ITEM_NOT_OWNED,
                          f"Member {member_id} does not own {item} (at member epoch "
                          f"{cur.epoch}).")
        _check_grant(cur, item, spec, member_id)
        return g, spec

    def _write_task_configs(
        self, txn: _Txn, req: ConnectGroupWriteTaskConfigsRequest, now_ms: int
    ) -> Any:
        """ConnectGroupWriteTaskConfigs: the connector instance's task configs, fenced by the
        member epoch and the connector item's ownership. The running task count becomes their
        number (at most the configured count); a change bumps the group epoch, so a new target
        follows, and removed tasks leave the targets at once."""
        if not req.group_id:
            raise _Reject(E.INVALID_REQUEST, "GroupId must be non-empty.")
        if not req.member_id:
            raise _Reject(E.INVALID_REQUEST, "MemberId must be non-empty.")
        if not req.connector:
            raise _Reject(E.INVALID_REQUEST, "Connector must be non-empty.")
        configs = tuple(tuple((e.name, e.value) for e in t.config) for t in req.task_configs)
        for task, config in enumerate(configs):
            keys = [k for k, _ in config]
            if any(not k for k in keys) or len(set(keys)) != len(keys):
                raise _Reject(E.INVALID_REQUEST,
                              f"TaskConfigs[{task}]: config names must be non-empty and unique.")
        g, spec = self._check_owner(req.group_id, req.member_id, req.member_epoch,
                                    Item(req.connector, CONNECTOR))
        if len(configs) > spec.task_count:
            raise _Reject(E.INVALID_REQUEST,
                          f"{len(configs)} task configs for connector {spec.name}, which has "
                          f"{spec.task_count} tasks configured (TaskCount).")
        new = TaskConfigs(spec.incarnation, configs)
        if g.task_configs.get(spec.name) == new:
            return ConnectGroupWriteTaskConfigsResponse(changed=False, group_epoch=g.epoch)
        record = rec.task_configs(g.group_id, spec.name, new)
        limit = self.config.max_batch_bytes
        # (written with the group epoch's bump, and the targets the tasks removed leave,
        # which the connectors' footprint check keeps within the batch limit)
        size = rec.batch_bytes([record, rec.group_metadata(g.group_id, g.epoch, 1 << 62)])
        if size > limit:
            raise _Reject(
                E.INVALID_REQUEST,
                f"The task configs of connector {spec.name} need {size:,} bytes in one "
                f"coordinator log batch, over its limit of {limit:,} bytes: use smaller "
                "task configs.")
        before = set(g.configured)
        txn.write(record)
        if g.members:  # (the writer is one: always)
            self._bump(txn, g, now_ms, "task_configs_changed", req.member_id,
                       connector=spec.name, tasks=len(configs))
        self._strip_removed(txn, g, before - g.configured)
        self._after(txn, g, now_ms)
        return ConnectGroupWriteTaskConfigsResponse(changed=True, group_epoch=g.epoch)

    def _strip_removed(self, txn: _Txn, g: Group, removed: set[Item]) -> None:
        """Targets only ever hold configured items: strip what is no longer configured, now;
        whoever still holds such an item reconciles on its next heartbeat."""
        affected = {g.target_owner[i] for i in removed if i in g.target_owner}
        for mid in sorted(affected):
            t = g.target[mid]
            txn.write(rec.target_member(g.group_id, mid, TargetMember(
                t.items - removed, t.metadata_version, t.metadata_bytes)))
        for item in removed:
            holder = g.owner.get(item)
            if holder is not None:
                g.soft.dirty.add(holder)
                txn.wake.add((g.group_id, holder))

    def _check_log_footprint(
        self, group_id: str, current: dict[str, ConnectorSpec], updated: dict[str, ConnectorSpec]
    ) -> None:
        """Refuse connectors whose records could never be written.

        Every write that carries a group's items derives from its connectors: this write holds
        the connectors record and may rewrite targets (each item once at most); a heartbeat may
        write a member's current assignment twice (a rejoin, then its reconciliation), each
        holding every item at most; an install writes every item once over the members' target
        records. So the connectors record plus one assignment of all items, and two such
        assignments, must each fit one log batch; otherwise this write, or a later heartbeat or
        install of the group, would fail whenever it was retried. What else those records
        carry (assignor metadata, member ids) comes from one request, bounded by its frame. A
        group above the limit (a lowered limit) may still shrink."""
        limit = self.config.max_batch_bytes
        item_bytes = assignment_bytes(updated.values())
        # A cheap bound first (4 bytes per character, 5 per varint, 13 per config entry,
        # 64 per connector): most requests are far below the limit and are never encoded here.
        rough = item_bytes + 64 * len(updated) + 4 * len(group_id) + 128
        for c in updated.values():
            rough += 4 * len(c.name) + sum(4 * len(k) + 4 * len(v or "") + 13 for k, v in c.config)
        if max(rough, 2 * item_bytes) <= limit:
            return
        config_bytes = connectors_log_bytes(group_id, updated.values())
        need = max(config_bytes + item_bytes, 2 * item_bytes)
        if need <= limit:
            return
        had = assignment_bytes(current.values())
        if need <= max(connectors_log_bytes(group_id, current.values()) + had, 2 * had):
            return
        raise _Reject(
            E.INVALID_REQUEST,
            f"Group {group_id}'s connectors would need {need:,} bytes in one coordinator log "
            f"batch (their configuration record takes {config_bytes:,} bytes and an assignment "
            f"of their {item_count(updated.values()):,} items {item_bytes:,}; one write may "
            "carry the record and an assignment, or an assignment twice): "
            f"{need - limit:,} bytes over the log's batch limit of {limit:,} bytes. Use "
            "smaller configs, fewer tasks or shorter connector names.",
        )

    # == offsets ====================================================================================
    @staticmethod
    def _incarnation_floor(g: Group, name: str) -> int:
        """The lowest incarnation a new connector ``name`` may get: above every incarnation
        its name's leftover offsets carry, so a deleted and re-created connector never serves
        its predecessor's (the group's token counter is above them anyway, unless the group
        was deleted and created again meanwhile)."""
        garbage = g.offset_garbage.get(name)
        return 1 + max(i for i, _ in garbage.values()) if garbage else 0

    def _offsets_target(self, group_id: str, connector: str) -> tuple[Group, ConnectorSpec]:
        if not group_id:
            raise _Reject(E.INVALID_GROUP_ID, "GroupId must be non-empty.")
        g = self.state.groups.get(group_id)
        if g is None:
            raise _Reject(E.GROUP_ID_NOT_FOUND, f"Group {group_id} does not exist.")
        spec = g.connectors.get(connector)
        if spec is None:
            raise _Reject(E.RESOURCE_NOT_FOUND,
                          f"Connector {connector!r} does not exist in group {group_id}.")
        return g, spec

    def _offset_changes(self, pairs: Any) -> dict[str, str | None]:
        try:
            return changes_from(pairs, self.config.max_offset_commit_bytes, MAX_COMMIT_BYTES)
        except OffsetError as exc:
            message = str(exc)
            if "Nothing was stored" not in message:
                message += " Nothing was stored."
            raise _Reject(E.INVALID_REQUEST, message) from None

    def _write_offsets(self, txn: _Txn, g: Group, spec: ConnectorSpec,
                       changes: dict[str, str | None]) -> None:
        """Check the connector's partition limit and the store's records per write, then write
        one record per changed partition: O(partitions in ``changes``)."""
        name = spec.name
        live = g.offsets.get(name, {})
        added = removed = 0
        grown = 0  # bytes kept after the change minus before
        for partition, offset in changes.items():
            old = live.get(partition)
            if old is not None:
                removed += offset is None
                grown -= offset_entry_bytes(partition, old)
            elif offset is not None:
                added += 1
            if offset is not None:
                grown += offset_entry_bytes(partition, offset)
        after = len(live) + added - removed
        limit = self.config.max_offset_partitions
        if added and after > limit:
            raise _Reject(
                E.INVALID_REQUEST,
                f"Connector {name!r} would have offsets for {after:,} source partitions "
                f"({added:,} new); {MAX_PARTITIONS} is {limit:,}. Nothing was stored.")
        kept = g.offset_bytes.get(name, 0) + grown
        if grown > 0 and kept > self.config.max_offset_bytes:
            raise _Reject(
                E.INVALID_REQUEST,
                f"Connector {name!r} would keep {kept:,} bytes of source partitions and offsets "
                f"({grown:,} more); {MAX_OFFSET_BYTES} is {self.config.max_offset_bytes:,}. "
                "Nothing was stored: remove partitions (a null offset) or keep smaller offsets.")
        per_write = self.config.max_batch_records
        if per_write is not None and len(changes) > per_write:
            raise _Reject(
                E.INVALID_REQUEST,
                f"{len(changes):,} partitions in one write; this coordinator's store takes at "
                f"most {per_write:,} records per write (etcd.max.txn.ops). Nothing was stored: "
                "send fewer partitions at a time.")
        garbage = g.offset_garbage.get(name, {})
        gid = g.group_id
        for partition, offset in changes.items():
            if offset is None:
                if partition in live or partition in garbage:
                    txn.write(rec.tombstone(rec.connector_offset_key(gid, name, partition)))
            elif live.get(partition) != offset:
                txn.write(rec.connector_offset(gid, name, partition, spec.incarnation, offset))

    def _commit_offsets(self, txn: _Txn, req: ConnectGroupCommitOffsetsRequest) -> Any:
        gid, member_id, epoch = req.group_id, req.member_id, req.member_epoch
        if not gid:
            raise _Reject(E.INVALID_GROUP_ID, "GroupId must be non-empty.")
        g = self.state.groups.get(gid)
        if g is None:
            raise _Reject(E.GROUP_ID_NOT_FOUND, f"Group {gid} does not exist.")
        if member_id not in g.members:
            raise _Reject(E.UNKNOWN_MEMBER_ID,
                          f"Member {member_id!r} is not a member of group {gid}: its offsets "
                          "were not stored.")
        cur = g.current.get(member_id, NEW_MEMBER_ASSIGNMENT)
        if epoch != cur.epoch:
            newer = epoch > cur.epoch
            raise _Reject(
                E.FENCED_MEMBER_EPOCH if newer else E.STALE_MEMBER_EPOCH,
                f"MemberEpoch {epoch} is {'newer' if newer else 'older'} than member "
                f"{member_id}'s current epoch {cur.epoch} in group {gid}: its offsets were not "
                "stored.")
        if req.task < CONNECTOR:
            raise _Reject(E.INVALID_REQUEST,
                          f"Task {req.task} is invalid (a task index, or -1 for the connector).")
        g, spec = self._offsets_target(gid, req.connector)
        item = Item(req.connector, req.task)
        if item not in cur.assigned and item not in cur.revoking:
            raise _Reject(
                E.ITEM_NOT_OWNED,
                f"Member {member_id} does not own {item} in group {gid} at epoch {epoch} "
                "(not assigned to it, or already reported released): its offsets were not "
                "stored.")
        _check_grant(cur, item, spec, member_id)
        self._write_offsets(txn, g, spec, self._offset_changes(req.offsets))
        return ConnectGroupCommitOffsetsResponse()

    def _fetch_offsets(self, req: ConnectGroupFetchOffsetsRequest) -> ConnectGroupFetchOffsetsResponse:
        g, spec = self._offsets_target(req.group_id, req.connector)
        live = g.offsets.get(spec.name, {})
        pairs: list[tuple[str, str | None]]
        if req.partitions is None:
            pairs = list(sorted(live.items()))
        else:
            pairs = []
            for i, text in enumerate(req.partitions):
                try:
                    partition, _ = _canonical_object(text, f"Partitions[{i}]")
                except OffsetError as exc:
                    raise _Reject(E.INVALID_REQUEST, str(exc)) from None
                pairs.append((partition, live.get(partition)))
        return ConnectGroupFetchOffsetsResponse(offsets=tuple(
            _fetch.PartitionOffset(partition=p, offset=o) for p, o in pairs))

    def _alter_offsets(self, txn: _Txn, req: ConnectGroupAlterOffsetsRequest) -> Any:
        g, spec = self._offsets_target(req.group_id, req.connector)
        state = target_state(dict(spec.config))
        if state != STOPPED:
            raise _Reject(
                E.INVALID_REQUEST,
                f"Connectors must be in the STOPPED state before their offsets can be modified "
                f"(connector {spec.name!r} is {state}). This can be done for the specified "
                f"connector by running 'connect-coordinator connectors stop --group "
                f"{g.group_id} {spec.name}'.")
        stopping = self._still_stopping(g, spec.name)
        if stopping:
            # A task's stop() may commit its last offsets: a change stored before that commit
            # would be overwritten by it. Retriable: the workers report the stop soon.
            raise _Reject(
                E.REBALANCE_IN_PROGRESS,
                f"Connector {spec.name!r}'s instances are still stopping on member(s) "
                f"{', '.join(stopping)} (not reported STOPPED yet): its offsets can be modified "
                "once they have stopped. Retry.")
        if req.reset:
            if req.offsets:
                raise _Reject(E.INVALID_REQUEST,
                              "Reset removes every offset of the connector: Offsets must be empty.")
            if req.validate_only:
                return ConnectGroupAlterOffsetsResponse()
            live = g.offsets.get(spec.name, {})
            batch = self._delete_batch([(spec.name, p) for p in live], g.group_id)
            for name, partition in batch:
                txn.write(rec.tombstone(rec.connector_offset_key(g.group_id, name, partition)))
            return ConnectGroupAlterOffsetsResponse()
        changes = self._offset_changes(req.offsets)
        if req.validate_only:
            # (the same checks as the write, on a transaction thrown away)
            probe = _Txn(self.state)
            try:
                self._write_offsets(probe, g, spec, changes)
            finally:
                probe.rollback()
            return ConnectGroupAlterOffsetsResponse()
        self._write_offsets(txn, g, spec, changes)
        return ConnectGroupAlterOffsetsResponse()

    @staticmethod
    def _still_stopping(g: Group, connector: str) -> list[str]:
        """The members (``member (instance)``) that own an item of ``connector`` (assigned or
        being revoked) and have not reported it STOPPED since its target state last changed:
        its instance there may still be running, or stopping and committing. A fenced member
        whose items are held reads ``member (instance, fenced: held)``."""
        late = []
        for member_id, cur in sorted(g.current.items()):
            reported = g.soft.instance_states.get(member_id, {})
            if any(item.connector == connector and reported.get(item, ("",))[0] != STOPPED
                   for item in cur.owned):
                if member_id in g.members:
                    instance = g.members[member_id].instance_id
                    late.append(member_id if instance is None else f"{member_id} ({instance})")
                else:  # fenced, its items held (it cannot report any more: the hold must end)
                    instance = g.soft.hold_instance.get(member_id)
                    late.append(f"{member_id} ({instance + ', ' if instance else ''}fenced: held)")
        return late

    def _delete_batch(self, keys: Iterable[tuple[str, str]], group_id: str) -> list[tuple[str, str]]:
        """The first of ``keys`` (connector, partition) that one write may tombstone: at most
        ``OFFSET_DELETE_BATCH`` (and the store's records per write) and about
        ``group.connect.offsets.max.commit.bytes`` of keys, at least one."""
        most = OFFSET_DELETE_BATCH
        if self.config.max_batch_records is not None:
            most = min(most, self.config.max_batch_records)
        budget = self.config.max_offset_commit_bytes
        out: list[tuple[str, str]] = []
        used = 0
        for name, partition in keys:
            size = len(partition.encode("utf-8")) + len(name.encode("utf-8")) + len(group_id) + 32
            if out and (len(out) >= most or used + size > budget):
                break
            out.append((name, partition))
            used += size
        return out

    def _on_offsets_gc(self, txn: _Txn, g: Group, now_ms: int) -> None:
        """Tombstone one batch of the group's garbage offsets; again at once while some are
        left; then the group may expire (if it has nothing else)."""
        if not g.offset_garbage:
            return
        batch = self._delete_batch(
            ((name, p) for name, parts in g.offset_garbage.items() for p in parts), g.group_id)
        for name, partition in batch:
            txn.write(rec.tombstone(ConnectorOffsetKey(
                group_id=g.group_id, connector=name, partition=partition)))
        if g.offset_garbage:
            txn.timer(OFFSETS, g.group_id, "", now_ms)
        else:
            self._maybe_arm_expiry(txn, g, now_ms)

    def _describe_group(self, group_id: str, now_ms: int = -1) -> Any:
        g = self.state.groups.get(group_id)
        if not group_id:
            return _desc.DescribedGroup(
                error_code=E.INVALID_GROUP_ID, error_message="GroupId must be non-empty.",
                group_id=group_id, group_state=GroupState.DEAD.value, group_epoch=-1,
                assignment_epoch=-1, assignor_name=None, assigning_member_id=None,
            )
        if g is None:
            return _desc.DescribedGroup(
                error_code=E.GROUP_ID_NOT_FOUND, error_message=f"Group {group_id} does not exist.",
                group_id=group_id, group_state=GroupState.DEAD.value, group_epoch=-1,
                assignment_epoch=-1, assignor_name=None, assigning_member_id=None,
            )
        name, _ = self._selection(g)
        comp = g.soft.computation
        code, message = 0, None
        if g.soft.assigner_error and g.epoch > g.assignment_epoch:
            code, message = E.NO_ASSIGNOR_COVERS_GROUP, g.soft.assigner_error

        def assignment(items: frozenset[Item]) -> Any:
            connectors, tasks = split_items(items)
            return _desc.Assignment(
                connectors=tuple(connectors),
                tasks=tuple(_desc.TaskId(connector=t.connector, task=t.task) for t in tasks),
            )

        members = []
        heard = g.soft.last_heartbeat
        for mid, m in g.members.items():
            cur = g.current.get(mid, NEW_MEMBER_ASSIGNMENT)
            last = heard.get(mid)
            revoking = assignment(cur.revoking)
            members.append(_desc.Member(
                member_id=mid, instance_id=m.instance_id, worker_url=m.worker_url,
                client_id=m.client_id, client_host=m.client_host, member_epoch=cur.epoch,
                member_state=cur.state.label, assignment=assignment(cur.assigned),
                target_assignment=assignment(g.target_items(mid)),
                revoking_connectors=revoking.connectors, revoking_tasks=revoking.tasks,
                instance_states=self._described_states(g, mid, cur.owned),
                fencing_tokens=rec.item_tokens(_desc.ItemToken, cur.tokens),
                last_heartbeat_ms_ago=(max(0, now_ms - last)
                                       if last is not None and now_ms >= 0 else -1),
                classic_protocol=m.classic.protocol if m.classic is not None else None,
                classic_metadata=m.classic.metadata if m.classic is not None else None,
            ))
        # Holds: what fenced members (no longer members) still own until their stop budget ran
        # out (describe did not show who holds what, or until when).
        holds = tuple(
            _desc.Hold(member_id=mid, instance_id=g.soft.hold_instance.get(mid),
                       held_until_ms=g.soft.hold_deadline.get(mid, -1),
                       items=assignment(cur.owned))
            for mid, cur in g.current.items() if mid not in g.members and is_hold(cur)
        )
        session_ms, interval_ms = self.config.for_group(g.configs)
        return _desc.DescribedGroup(
            error_code=code, error_message=message, group_id=group_id,
            group_state=g.state.value, group_epoch=g.epoch,
            assignment_epoch=g.assignment_epoch, assignor_name=name,
            assigning_member_id=comp.member_id if comp is not None else None,
            connectors=tuple(
                _desc.ConnectorSpec(
                    name=c.name, task_count=c.task_count,
                    config=tuple(_desc.ConfigEntry(name=k, value=v) for k, v in c.config),
                    offset_count=len(g.offsets.get(c.name, ())),
                    task_configs=self._described_task_configs(c, g.task_configs.get(c.name)),
                )
                for c in sorted(g.connectors.values(), key=lambda c: c.name)
            ),
            members=tuple(members),
            holds=holds,
            heartbeat_interval_ms=interval_ms,
            session_timeout_ms=session_ms,
            kept_for=self._described_kept(g, assignment),
        )

    @staticmethod
    def _described_kept(g: Group, assignment: Callable[[frozenset[Item]], Any]) -> tuple[Any, ...]:
        """What the last install left unassigned for departed members, as far as it still is:
        configured and in nobody's target (a member that came back by id or instance id since
        gets its work in the next computation)."""
        out = []
        for k in g.kept_for:
            items = frozenset(i for i in k.items
                              if i in g.configured and i not in g.target_owner)
            if items:
                out.append(_desc.KeptItems(member_id=k.member_id, instance_id=k.instance_id,
                                           until_ms=g.scheduled_rebalance_at_ms,
                                           items=assignment(items)))
        return tuple(out)


def _join_error(member_id: str, code: int, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "generation_id": -1,
            "protocol_type": cc.PROTOCOL_TYPE, "protocol_name": None, "leader": "",
            "skip_assignment": False, "member_id": member_id, "members": []}


def _check_grant(cur: CurrentAssignment, item: Item, spec: ConnectorSpec, member_id: str) -> None:
    """The owner's grant of ``item`` must be of the live connector: a token below the
    connector's incarnation was given for an earlier connector of that name (deleted and
    created again while the member held the item): what that grant's instance writes must
    not land in the new connector. (Tokens and incarnations come from one counter.)"""
    token = cur.tokens.get(item)
    if token is not None and token < spec.incarnation:
        raise _Reject(
            E.ITEM_NOT_OWNED,
            f"Member {member_id} holds {item} from a connector {spec.name!r} that was deleted "
            f"and created again since (fencing token {token}, connector incarnation "
            f"{spec.incarnation}); nothing was stored. Its items of the new connector get new "
            "tokens once it reconciles to the current assignment.")


def _task_configs_of(spec: ConnectorSpec, written: TaskConfigs | None) -> TaskConfigs | None:
    """The task configs written for ``spec``'s incarnation, or None."""
    return written if written is not None and written.incarnation == spec.incarnation else None


def _assignor_signature(assignors: Iterable[AssignorSpec]) -> tuple[AssignorSpec, ...]:
    """What of a member's assignors triggers a rebalance when it changes: all of it."""
    return tuple(assignors)


__all__ = [
    "COMPUTE",
    "CONNECTOR",
    "EXPIRE",
    "FENCE_REASONS",
    "OFFSETS",
    "GroupEvent",
    "REBALANCE",
    "SCHEDULED",
    "SESSION",
    "GroupCoordinator",
    "RequestContext",
    "Result",
    "TimerKey",
    "TimerOp",
    "select_assignor",
    "eligible_assigners",
    "validate_heartbeat",
]
