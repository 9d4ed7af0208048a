"""Log records of the coordinator: builders from the model and converters back.

A record is a (key, value) pair of generated classes (``connect_wire.records``); a ``None``
value is a tombstone. These are the only values the group state machine emits to change
state, and exactly what the runtime writes to a partition's log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from connect_wire import codec
from connect_wire.records import (
    ConnectorOffsetKey,
    ConnectorOffsetValue,
    ConnectorTaskConfigsKey,
    ConnectorTaskConfigsValue,
    CurrentMemberAssignmentKey,
    CurrentMemberAssignmentValue,
    GroupConfigurationKey,
    GroupConfigurationValue,
    GroupConnectorsKey,
    GroupConnectorsValue,
    GroupMemberKey,
    GroupMemberValue,
    GroupMetadataKey,
    GroupMetadataValue,
    TargetAssignmentMemberKey,
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataKey,
    TargetAssignmentMetadataValue,
)
from connect_wire.records import connector_task_configs_value_v0 as _tcv
from connect_wire.records import current_member_assignment_value_v0 as _cma
from connect_wire.records import group_configuration_value_v0 as _gcfg
from connect_wire.records import group_connectors_value_v0 as _gc
from connect_wire.records import group_member_value_v0 as _gm
from connect_wire.records import target_assignment_member_value_v0 as _tam
from connect_wire.records import target_assignment_metadata_value_v0 as _tmeta

from .model import (
    AssignorSpec,
    ClassicMember,
    ConnectorSpec,
    CurrentAssignment,
    Item,
    KeptFor,
    MemberMetadata,
    MemberState,
    TargetMember,
    TaskConfigs,
    items_from_wire,
    split_items,
)


class Record(NamedTuple):
    key: Any
    value: Any  # None: tombstone

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


def _tasks(cls: type, items: Iterable[Item]) -> tuple[Any, ...]:
    return tuple(cls(connector=i.connector, task=i.task) for i in items)


# -- builders -------------------------------------------------------------------------------


def group_metadata(group_id: str, epoch: int, token_ceiling: int = 0) -> Record:
    """Every GroupMetadata record carries the group's fencing token ceiling: a record without
    it would lower the ceiling a load starts the token counter from."""
    return Record(GroupMetadataKey(group_id=group_id),
                  GroupMetadataValue(epoch=epoch, fencing_token_ceiling=token_ceiling))


def group_connectors(group_id: str, epoch: int, connectors: Iterable[ConnectorSpec]) -> Record:
    specs = tuple(
        _gc.ConnectorSpec(
            name=c.name,
            task_count=c.task_count,
            config=tuple(_gc.ConfigEntry(name=k, value=v) for k, v in c.config),
            incarnation=c.incarnation,
        )
        for c in sorted(connectors, key=lambda c: c.name)
    )
    return Record(
        GroupConnectorsKey(group_id=group_id), GroupConnectorsValue(epoch=epoch, connectors=specs)
    )


def group_member(group_id: str, m: MemberMetadata) -> Record:
    return Record(
        GroupMemberKey(group_id=group_id, member_id=m.member_id),
        GroupMemberValue(
            instance_id=m.instance_id,
            worker_url=m.worker_url,
            client_id=m.client_id,
            client_host=m.client_host,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            client_assignors=tuple(
                _gm.Assignor(
                    name=a.name,
                    minimum_version=a.minimum_version,
                    maximum_version=a.maximum_version,
                    reason=a.reason,
                    metadata_version=a.metadata_version,
                    metadata_bytes=a.metadata_bytes,
                )
                for a in m.assignors
            ),
            classic_session_timeout_ms=-1 if m.classic is None else m.classic.session_timeout_ms,
            classic_protocols=() if m.classic is None else tuple(
                _gm.ClassicProtocol(name=n, metadata=b) for n, b in m.classic.protocols),
        ),
    )


def target_member(group_id: str, member_id: str, t: TargetMember) -> Record:
    connectors, tasks = split_items(t.items)
    return Record(
        TargetAssignmentMemberKey(group_id=group_id, member_id=member_id),
        TargetAssignmentMemberValue(
            connectors=tuple(connectors),
            tasks=_tasks(_tam.TaskId, tasks),
            metadata_version=t.metadata_version,
            metadata_bytes=t.metadata_bytes,
        ),
    )


def target_metadata(
    group_id: str, assignment_epoch: int, error: int, assignor_state: bytes, scheduled_at_ms: int,
    kept_for: Iterable[KeptFor] = (),
) -> Record:
    kept = []
    for k in kept_for:
        connectors, tasks = split_items(k.items)
        kept.append(_tmeta.KeptItems(member_id=k.member_id, instance_id=k.instance_id,
                                     connectors=tuple(connectors),
                                     tasks=_tasks(_tmeta.TaskId, tasks)))
    return Record(
        TargetAssignmentMetadataKey(group_id=group_id),
        TargetAssignmentMetadataValue(
            assignment_epoch=assignment_epoch,
            error=error,
            assignor_state=assignor_state,
            scheduled_rebalance_at_ms=scheduled_at_ms,
            kept_for=tuple(kept),
        ),
    )


def kept_from(entries: Iterable[Any]) -> tuple[KeptFor, ...]:
    """``KeptFor`` values of wire ``KeptItems`` entries (a record's or an install's)."""
    return tuple(KeptFor(k.member_id, k.instance_id, items_from_wire(k.connectors, k.tasks))
                 for k in entries)


def item_tokens(cls: type, tokens: Any) -> tuple[Any, ...]:
    """``ItemToken`` structs of ``cls`` for an item -> token mapping, in item order."""
    return tuple(cls(connector=i.connector, task=i.task, token=tokens[i]) for i in sorted(tokens))


def current_assignment(group_id: str, member_id: str, c: CurrentAssignment) -> Record:
    connectors, tasks = split_items(c.assigned)
    revoking_connectors, revoking_tasks = split_items(c.revoking)
    return Record(
        CurrentMemberAssignmentKey(group_id=group_id, member_id=member_id),
        CurrentMemberAssignmentValue(
            member_epoch=c.epoch,
            previous_member_epoch=c.previous_epoch,
            state=int(c.state),
            connectors=tuple(connectors),
            tasks=_tasks(_cma.TaskId, tasks),
            revoking_connectors=tuple(revoking_connectors),
            revoking_tasks=_tasks(_cma.TaskId, revoking_tasks),
            metadata_version=c.metadata_version,
            metadata_bytes=c.metadata_bytes,
            fencing_tokens=item_tokens(_cma.ItemToken, c.tokens),
        ),
    )


def task_configs(group_id: str, connector: str, t: TaskConfigs) -> Record:
    return Record(
        ConnectorTaskConfigsKey(group_id=group_id, connector=connector),
        ConnectorTaskConfigsValue(incarnation=t.incarnation, task_configs=tuple(
            _tcv.TaskConfig(config=tuple(_tcv.ConfigEntry(name=k, value=v) for k, v in config))
            for config in t.configs)),
    )


def group_configuration(group_id: str, configs: dict[str, str | None]) -> Record:
    return Record(
        GroupConfigurationKey(group_id=group_id),
        GroupConfigurationValue(
            configs=tuple(_gcfg.Config(name=k, value=v) for k, v in sorted(configs.items()))
        ),
    )


def connector_offset(
    group_id: str, connector: str, partition: str, incarnation: int, offset: str
) -> Record:
    return Record(
        ConnectorOffsetKey(group_id=group_id, connector=connector, partition=partition),
        ConnectorOffsetValue(incarnation=incarnation, offset=offset),
    )


def connector_offset_key(group_id: str, connector: str, partition: str) -> ConnectorOffsetKey:
    return ConnectorOffsetKey(group_id=group_id, connector=connector, partition=partition)


def tombstone(key: Any) -> Record:
    return Record(key, None)


# -- sizes in the log -------------------------------------------------------------------------
# What a batch of records takes in a partition log, computed here so that the core can refuse a
# write that could never fit the log's batch limit when it is asked for. The
# layout is the runtime's (coordinator/runtime/serde.py: a 4-byte header before a key, 2 before
# a value; coordinator/runtime/log.py: a 29-byte batch header, 8 length bytes per record);
# tests/test_limits.py checks these sizes equal the bytes the log writes.
BATCH_HEADER_BYTES = 29
RECORD_OVERHEAD_BYTES = 8 + 4 + 2


def batch_bytes(records: Iterable[Record]) -> int:
    """The exact size of ``records`` written as one log batch."""
    total = BATCH_HEADER_BYTES
    for key, value in records:
        total += RECORD_OVERHEAD_BYTES + len(codec.encode(key))
        if value is not None:
            total += len(codec.encode(value))
        else:
            total -= 2  # a tombstone has no value header
    return total


def _uvarint_bytes(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def connectors_log_bytes(group_id: str, connectors: Iterable[ConnectorSpec]) -> int:
    """The exact size of the group's connectors record written alone as one log batch."""
    return batch_bytes([group_connectors(group_id, 0, connectors)])


TOKENS_FRAMING_BYTES = 12
"""At most what the fencing tokens' tagged field adds to a current assignment record besides
its ItemTokens: the tagged-field count, the tag, the field's size and the array's length."""


def assignment_bytes(connectors: Iterable[ConnectorSpec]) -> int:
    """At most what every item of ``connectors`` takes in an assignment record, a current one
    (a target's takes less): a connector as a compact string, each of its tasks as a TaskId
    struct (the connector's name again, an int32 and the struct's tagged-field byte), and each
    item's fencing token as an ItemToken (the name again, an int32, an int64, a tagged-field
    byte). Computed without building the items."""
    total = TOKENS_FRAMING_BYTES
    for c in connectors:
        n = len(c.name.encode("utf-8", "surrogatepass"))
        name = _uvarint_bytes(n + 1) + n
        tasks = max(c.task_count, 0)
        total += name + tasks * (name + 5) + (1 + tasks) * (name + 13)
    return total


# -- converters back to the model -------------------------------------------------------------


def connectors_from(value: GroupConnectorsValue) -> dict[str, ConnectorSpec]:
    return {
        c.name: ConnectorSpec(
            name=c.name,
            task_count=c.task_count,
            config=tuple((e.name, e.value) for e in c.config),
            incarnation=c.incarnation,
        )
        for c in value.connectors
    }


def member_from(member_id: str, value: GroupMemberValue) -> MemberMetadata:
    return MemberMetadata(
        member_id=member_id,
        instance_id=value.instance_id,
        worker_url=value.worker_url,
        client_id=value.client_id,
        client_host=value.client_host,
        rebalance_timeout_ms=value.rebalance_timeout_ms,
        assignors=tuple(
            AssignorSpec(
                name=a.name,
                minimum_version=a.minimum_version,
                maximum_version=a.maximum_version,
                reason=a.reason,
                metadata_version=a.metadata_version,
                metadata_bytes=a.metadata_bytes,
            )
            for a in value.client_assignors
        ),
        classic=None if value.classic_session_timeout_ms < 0 or not value.classic_protocols
        else ClassicMember(value.classic_session_timeout_ms,
                           tuple((p.name, p.metadata) for p in value.classic_protocols)),
    )


def target_from(value: TargetAssignmentMemberValue) -> TargetMember:
    return TargetMember(
        items=items_from_wire(value.connectors, value.tasks),
        metadata_version=value.metadata_version,
        metadata_bytes=value.metadata_bytes,
    )


def current_from(value: CurrentMemberAssignmentValue) -> CurrentAssignment:
    try:
        state = MemberState(value.state)
    except ValueError:
        state = MemberState.UNREVOKED_ITEMS  # unknown future state: treat as still owning
    return CurrentAssignment(
        epoch=value.member_epoch,
        previous_epoch=value.previous_member_epoch,
        state=state,
        assigned=items_from_wire(value.connectors, value.tasks),
        revoking=items_from_wire(value.revoking_connectors, value.revoking_tasks),
        metadata_version=value.metadata_version,
        metadata_bytes=value.metadata_bytes,
        tokens={Item(t.connector, t.task): t.token for t in value.fencing_tokens},
    )


def task_configs_from(value: ConnectorTaskConfigsValue) -> TaskConfigs:
    return TaskConfigs(value.incarnation, tuple(
        tuple((e.name, e.value) for e in t.config) for t in value.task_configs))
