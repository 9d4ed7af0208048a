"""Replay: the one way the coordinator's state changes.

:meth:`CoordinatorState.replay` applies one record; loading a partition is replaying its log,
and a handler's records are applied with the very same call. Each record replaces the whole
value of its key (full state per key, never a delta), so the inverse of applying a record is
applying the key's previous value: :meth:`CoordinatorState.current_record` returns it, which is
how a failed write is rolled back.

Derived indexes (who owns an item now, who owns it in the target, static instance ids, which
members are not reconciled) are updated here, incrementally, so no handler scans a group.

Each record type has an ``apply_*`` method taking the record's model values (None for a
tombstone); :meth:`CoordinatorState.replay` converts a decoded record and calls it, and a bulk
load (:func:`coordinator.runtime.serde.replay_log`) decodes log bytes straight to model values
and calls the same methods, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

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

from . import records as rec
from .config import MAX_TASKS_CEILING
from .model import (
    EMPTY,
    ConnectorSpec,
    CurrentAssignment,
    Group,
    Item,
    KeptFor,
    MemberMetadata,
    MemberState,
    TargetMember,
    TaskConfigs,
    connector_items,
    item_count,
    running_task_count,
)
from .validation import (
    validate_connector,
    validate_current_epoch,
    validate_item_set,
    validate_member,
)

_STABLE = MemberState.STABLE


class ReplayError(ValueError):
    """A record that cannot apply to the current state (a corrupt or foreign log), or whose
    content the API would have refused (``coordinator.group.validation``): loading fails."""


def _refuse(group_id: str, what: str, problem: str) -> None:
    raise ReplayError(f"group {group_id!r}: {what} record refused: {problem}")


class CoordinatorState:
    """All groups of one partition (one shard)."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}

    # -- replay ---------------------------------------------------------------------------------
    def replay(self, record: rec.Record) -> None:
        key, value = record
        handler = _REPLAY.get(type(key))
        if handler is None:
            raise ReplayError(f"unknown record key type {type(key).__name__}")
        handler(self, key, value)

    def _group(self, group_id: str) -> Group:
        g = self.groups.get(group_id)
        if g is None:
            g = Group(group_id)
            self.groups[group_id] = g
        return g

    # Each ``_replay_*`` turns the record's wire value into model values and calls the matching
    # ``apply_*``; a bulk load (coordinator.runtime.serde.replay_log) decodes straight to model
    # values and calls the same ``apply_*``, so both paths change the state in the same way.

    def _replay_group_metadata(self, key: Any, value: Any) -> None:
        if value is None:
            self.apply_group_metadata(key.group_id, None)
        else:
            self.apply_group_metadata(key.group_id, value.epoch, value.fencing_token_ceiling)

    def _replay_connectors(self, key: Any, value: Any) -> None:
        if value is None:
            self.apply_connectors(key.group_id, 0, None)
        else:
            self.apply_connectors(key.group_id, value.epoch, rec.connectors_from(value))

    def _replay_member(self, key: Any, value: Any) -> None:
        member = None if value is None else rec.member_from(key.member_id, value)
        self.apply_member(key.group_id, key.member_id, member)

    def _replay_target_member(self, key: Any, value: Any) -> None:
        target = None if value is None else rec.target_from(value)
        self.apply_target_member(key.group_id, key.member_id, target)

    def _replay_target_metadata(self, key: Any, value: Any) -> None:
        if value is None:
            self.apply_target_metadata(key.group_id, None)
        else:
            self.apply_target_metadata(key.group_id, (
                value.assignment_epoch, value.error, value.assignor_state,
                value.scheduled_rebalance_at_ms, rec.kept_from(value.kept_for)))

    def _replay_current(self, key: Any, value: Any) -> None:
        if value is None:
            self.apply_current(key.group_id, key.member_id, None, EMPTY)
        else:
            c = rec.current_from(value)
            self.apply_current(key.group_id, key.member_id, c, _owned(c))

    def _replay_task_configs(self, key: Any, value: Any) -> None:
        self.apply_task_configs(key.group_id, key.connector,
                                None if value is None else rec.task_configs_from(value))

    def _replay_configuration(self, key: Any, value: Any) -> None:
        configs = None if value is None else {c.name: c.value for c in value.configs}
        self.apply_configuration(key.group_id, configs)

    def _replay_offset(self, key: Any, value: Any) -> None:
        self.apply_offset(key.group_id, key.connector, key.partition,
                          None if value is None else (value.incarnation, value.offset))

    # -- apply: one record's model values (None: a tombstone) --------------------------------
    def apply_group_metadata(self, group_id: str, epoch: int | None, token_ceiling: int = 0) -> None:
        if epoch is None:
            g = self.groups.get(group_id)
            if g is None:
                return
            if g.members or g.current or g.target:
                raise ReplayError(f"group {group_id} deleted while it still has members")
            del self.groups[group_id]
            return
        if epoch < 0:
            _refuse(group_id, "group metadata", f"GroupEpoch {epoch} is negative.")
        if token_ceiling < 0:
            _refuse(group_id, "group metadata", f"FencingTokenCeiling {token_ceiling} is negative.")
        g = self._group(group_id)
        g.epoch = epoch
        g.has_metadata = True
        g.token_ceiling = token_ceiling
        # (whether a member is reconciled depends on the assignment epoch, not on this one: a
        # bump touches no member, so a join costs O(1), not O(members))

    def apply_connectors(
        self, group_id: str, epoch: int, connectors: dict[str, ConnectorSpec] | None
    ) -> None:
        if connectors is None:
            g = self.groups.get(group_id)
            if g is not None:
                _move_offsets(g, {})
                g.connectors = {}
                g.configured = set()
                g.connectors_epoch = 0
            return
        total = item_count(connectors.values())
        if total > MAX_TASKS_CEILING:  # checked before a single item is built
            raise ReplayError(
                f"group {group_id!r}: connectors record with {total} items (more than any "
                f"coordinator allows: {MAX_TASKS_CEILING})"
            )
        if epoch < 0:
            _refuse(group_id, "connectors", f"Epoch {epoch} is negative.")
        for name, spec in connectors.items():
            problem = validate_connector(spec.name, spec.task_count, [k for k, _ in spec.config])
            if problem is None and name != spec.name:
                problem = f"connector {spec.name!r} stored under {name!r}"
            if problem is not None:
                _refuse(group_id, "connectors", problem)
        g = self._group(group_id)
        _move_offsets(g, connectors)
        g.connectors = connectors
        g.connectors_epoch = epoch
        written = g.task_configs
        g.configured = {
            i for c in connectors.values()
            for i in connector_items(c.name, running_task_count(c, written.get(c.name)))
        }

    def apply_task_configs(self, group_id: str, connector: str, t: TaskConfigs | None) -> None:
        """A connector's task configs (None: deleted). The connector's running task count, and
        so the group's configured items, follow them (``model.running_task_count``); a record
        of another incarnation than the live connector's changes nothing."""
        if t is not None:
            if not connector or t.incarnation < 0:
                _refuse(group_id, "task configs",
                        f"connector {connector!r}, incarnation {t.incarnation}")
            for config in t.configs:
                keys = [k for k, _ in config]
                if any(not k for k in keys) or len(set(keys)) != len(keys):
                    _refuse(group_id, "task configs",
                            f"connector {connector}: config names must be non-empty and unique.")
        g = self.groups.get(group_id) if t is None else self._group(group_id)
        if g is None:
            return
        spec = g.connectors.get(connector)
        before = running_task_count(spec, g.task_configs.get(connector)) if spec else 0
        if t is None:
            g.task_configs.pop(connector, None)
        else:
            g.task_configs[connector] = t
        if spec is None:
            return
        after = running_task_count(spec, t)
        if after == before:
            return
        configured = g.configured
        for i in connector_items(connector, max(before, after))[1 + min(before, after):]:
            if after > before:
                configured.add(i)
            else:
                configured.discard(i)

    def apply_member(self, group_id: str, member_id: str, m: MemberMetadata | None) -> None:
        if m is not None:
            problem = validate_member(member_id, m.instance_id, m.rebalance_timeout_ms, m.assignors)
            if problem is None and m.member_id != member_id:
                problem = f"member {m.member_id!r} stored under {member_id!r}"
            if problem is not None:
                _refuse(group_id, "member", problem)
        g = self.groups.get(group_id) if m is None else self._group(group_id)
        if g is None:
            return
        # The assignor selection and the eligible computing members are cached per group epoch;
        # a member record can change them without an epoch bump (a static member replaced by a
        # new member id) and a rollback replays member records too: drop the cache.
        g.soft.selection_epoch = -1
        old = g.members.get(member_id)
        if old is not None:
            g.assignors.remove(old)
            if old.instance_id is not None and g.static_members.get(old.instance_id) == member_id:
                del g.static_members[old.instance_id]
        if m is None:
            g.members.pop(member_id, None)
            g.classic_members.pop(member_id, None)
            g.unreconciled.discard(member_id)
            return
        g.members[member_id] = m
        if m.classic is not None:
            g.classic_members[member_id] = None
        else:
            g.classic_members.pop(member_id, None)
        g.assignors.add(m)
        if m.instance_id is not None:
            g.static_members[m.instance_id] = member_id
        self._refresh_reconciled(g, member_id)

    def apply_target_member(self, group_id: str, member_id: str, t: TargetMember | None) -> None:
        g = self.groups.get(group_id)
        if g is None:
            if t is None:
                return
            g = self._group(group_id)
        target_owner = g.target_owner
        if t is not None:
            prior = g.target.get(member_id)
            if prior is None or (prior.items is not t.items and prior.items != t.items):
                problem = validate_item_set(t.items, "Target items")
                if problem is not None:
                    _refuse(group_id, "target assignment", problem)
        old = g.target.pop(member_id, None)
        if old is not None and (t is None or (old.items is not t.items and old.items != t.items)):
            for item in old.items:
                if target_owner.get(item) == member_id:
                    del target_owner[item]
        # (the same items: the loop below maps each of them to member_id again, as deleting
        # them first would)
        if t is None:
            return
        g.target[member_id] = t
        for item in t.items:
            target_owner[item] = member_id

    def apply_target_metadata(
        self, group_id: str, value: tuple[int, int, bytes, int, tuple[KeptFor, ...]] | None
    ) -> None:
        """``value``: (assignment epoch, error, assignor state, scheduled rebalance at ms, items
        kept for departed members)."""
        g = self.groups.get(group_id) if value is None else self._group(group_id)
        if g is None:
            return
        if value is None:
            g.assignment_epoch = 0
            g.assignment_error = 0
            g.assignor_state = b""
            g.scheduled_rebalance_at_ms = -1
            g.kept_for = ()
            g.has_target_metadata = False
        else:
            if value[0] < 0 or value[3] < -1:
                _refuse(group_id, "target assignment metadata",
                        f"AssignmentEpoch {value[0]} must be >= 0 and ScheduledRebalanceAtMs "
                        f"{value[3]} >= -1.")
            (g.assignment_epoch, g.assignment_error, g.assignor_state,
             g.scheduled_rebalance_at_ms, g.kept_for) = value
            g.has_target_metadata = True
        self._refresh_reconciled_all(g)

    def apply_current(
        self, group_id: str, member_id: str, c: CurrentAssignment | None, owned: frozenset[Item]
    ) -> None:
        """``owned`` must equal ``c.owned`` (EMPTY for a tombstone): callers that know it already
        (a bulk load caches it per distinct assignment) save building it again."""
        if c is not None and c.epoch < -2:
            problem = validate_current_epoch(c.epoch)
            if problem is not None:
                _refuse(group_id, "current assignment", problem)
        g = self.groups.get(group_id)
        if g is None:
            if c is None:
                return
            g = self._group(group_id)
        current = g.current
        old = current.get(member_id)
        # The owner index always maps exactly the items of every member's owned set to that
        # member (the check below refuses a second owner), so a record that keeps the member's
        # owned items (most do: an epoch or state change) leaves the index as it is.
        if old is None:
            old_owned = EMPTY
        else:
            old_owned = old.assigned | old.revoking if old.revoking else old.assigned
        if owned is not old_owned and owned != old_owned:
            owner = g.owner
            problem = validate_item_set(owned, "Current items")
            if problem is not None:
                _refuse(group_id, "current assignment", problem)
            # FIX (tests): refuse a double owner *before* touching the state. The check used to
            # run after the member's old assignment had been removed, so a refused record left
            # the member without its current assignment (and the coordinator's rollback, which
            # only undoes completed writes, could not restore it).
            for item in owned:
                holder = owner.get(item)
                if holder is not None and holder != member_id:
                    raise ReplayError(f"group {group_id}: {item} owned by {holder} and {member_id}")
            for item in old_owned:
                if owner.get(item) == member_id:
                    del owner[item]
            for item in owned:
                owner[item] = member_id
        if old is not None:
            del current[member_id]  # re-inserted last, as replay always did
        if c is None:
            g.unreconciled.discard(member_id)
            return
        current[member_id] = c
        # _refresh_reconciled, inlined (Group.is_reconciled of c)
        if member_id in g.members and not (c.state == _STABLE and c.epoch == g.assignment_epoch):
            g.unreconciled.add(member_id)
        else:
            g.unreconciled.discard(member_id)

    def apply_offset(
        self, group_id: str, connector: str, partition: str, value: tuple[int, str] | None
    ) -> None:
        """One partition's offset (``value``: (incarnation, offset); None: a tombstone). An
        offset of the connector's live incarnation is served; any other is garbage, kept apart
        until it is tombstoned. O(1)."""
        g = self.groups.get(group_id) if value is None else self._group(group_id)
        if g is None:
            return
        live = g.offsets.get(connector)
        garbage = g.offset_garbage.get(connector)
        if live is not None and partition in live:
            _count_bytes(g, connector, -offset_entry_bytes(partition, live.pop(partition)))
            if not live:
                del g.offsets[connector]
                live = None
        if garbage is not None and partition in garbage:
            del garbage[partition]
            if not garbage:
                del g.offset_garbage[connector]
                garbage = None
        if value is None:
            return
        incarnation, offset = value
        spec = g.connectors.get(connector)
        if spec is not None and spec.incarnation == incarnation:
            if live is None:
                live = g.offsets[connector] = {}
            live[partition] = offset
            _count_bytes(g, connector, offset_entry_bytes(partition, offset))
        else:
            if garbage is None:
                garbage = g.offset_garbage[connector] = {}
            garbage[partition] = value

    def apply_configuration(self, group_id: str, configs: dict[str, str | None] | None) -> None:
        g = self.groups.get(group_id) if configs is None else self._group(group_id)
        if g is None:
            return
        g.configs = {} if configs is None else configs

    # -- indexes ----------------------------------------------------------------------------------
    @staticmethod
    def _refresh_reconciled(g: Group, member_id: str) -> None:
        if member_id in g.members and not g.is_reconciled(member_id):
            g.unreconciled.add(member_id)
        else:
            g.unreconciled.discard(member_id)

    @staticmethod
    def _refresh_reconciled_all(g: Group) -> None:
        # Runs when an epoch changes: O(members), never on a steady heartbeat.
        # (Group.is_reconciled, inlined)
        current = g.current.get
        epoch = g.assignment_epoch
        g.unreconciled = {
            m for m in g.members
            if (c := current(m)) is None or c.state != _STABLE or c.epoch != epoch
        }

    # -- undo -------------------------------------------------------------------------------------
    def current_record(self, key: Any) -> rec.Record:
        """The record that would recreate ``key``'s current value (a tombstone if absent)."""
        g = self.groups.get(key.group_id)
        t = type(key)
        if g is None:
            return rec.tombstone(key)
        if t is GroupMetadataKey:
            if not g.has_metadata:
                return rec.tombstone(key)
            return rec.group_metadata(g.group_id, g.epoch, g.token_ceiling)
        if t is GroupConnectorsKey:
            if not g.connectors and g.connectors_epoch == 0:
                return rec.tombstone(key)
            return rec.group_connectors(g.group_id, g.connectors_epoch, g.connectors.values())
        if t is GroupMemberKey:
            m = g.members.get(key.member_id)
            return rec.group_member(g.group_id, m) if m else rec.tombstone(key)
        if t is TargetAssignmentMemberKey:
            tm = g.target.get(key.member_id)
            return rec.target_member(g.group_id, key.member_id, tm) if tm else rec.tombstone(key)
        if t is TargetAssignmentMetadataKey:
            if not g.has_target_metadata:
                return rec.tombstone(key)
            return rec.target_metadata(
                g.group_id, g.assignment_epoch, g.assignment_error, g.assignor_state,
                g.scheduled_rebalance_at_ms, g.kept_for,
            )
        if t is CurrentMemberAssignmentKey:
            c = g.current.get(key.member_id)
            return rec.current_assignment(g.group_id, key.member_id, c) if c else rec.tombstone(key)
        if t is GroupConfigurationKey:
            return rec.group_configuration(g.group_id, g.configs) if g.configs else rec.tombstone(key)
        if t is ConnectorOffsetKey:
            live = g.offsets.get(key.connector)
            if live is not None and key.partition in live:
                incarnation = g.connectors[key.connector].incarnation
                return rec.connector_offset(g.group_id, key.connector, key.partition, incarnation,
                                            live[key.partition])
            garbage = g.offset_garbage.get(key.connector)
            if garbage is not None and key.partition in garbage:
                incarnation, offset = garbage[key.partition]
                return rec.connector_offset(g.group_id, key.connector, key.partition, incarnation,
                                            offset)
            return rec.tombstone(key)
        if t is ConnectorTaskConfigsKey:
            tc = g.task_configs.get(key.connector)
            return rec.task_configs(g.group_id, key.connector, tc) if tc else rec.tombstone(key)
        raise ReplayError(f"unknown record key type {t.__name__}")

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The durable state of every group, for equality checks."""
        return {gid: g.durable() for gid, g in self.groups.items()}


def offset_entry_bytes(partition: str, offset: str) -> int:
    """What one stored offset counts against ``group.connect.offsets.max.bytes``: the UTF-8
    bytes of its partition and offset (canonical JSON)."""
    return len(partition.encode()) + len(offset.encode())


def _count_bytes(g: Group, connector: str, delta: int) -> None:
    total = g.offset_bytes.get(connector, 0) + delta
    if total > 0:
        g.offset_bytes[connector] = total
    else:
        g.offset_bytes.pop(connector, None)


def _move_offsets(g: Group, connectors: dict[str, ConnectorSpec]) -> None:
    """A connectors record replaces ``g.connectors`` by ``connectors``: the offsets of a
    connector gone (or of an incarnation replaced) become garbage; those of a connector (back)
    at an incarnation they carry are served again (a rolled-back delete). O(connectors) plus
    the offsets moved."""
    old = g.connectors
    for name, spec in old.items():
        new = connectors.get(name)
        if (new is None or new.incarnation != spec.incarnation) and name in g.offsets:
            garbage = g.offset_garbage.setdefault(name, {})
            incarnation = spec.incarnation
            g.offset_bytes.pop(name, None)
            for partition, offset in g.offsets.pop(name).items():
                garbage[partition] = (incarnation, offset)
    if not g.offset_garbage:
        return
    for name, spec in connectors.items():
        prev = old.get(name)
        leftover = g.offset_garbage.get(name)
        if leftover is None or (prev is not None and prev.incarnation == spec.incarnation):
            continue
        incarnation = spec.incarnation
        back = {p: o for p, (i, o) in leftover.items() if i == incarnation}
        if back:
            for partition in back:
                del leftover[partition]
            if not leftover:
                del g.offset_garbage[name]
            g.offsets.setdefault(name, {}).update(back)
            _count_bytes(g, name, sum(offset_entry_bytes(p, o) for p, o in back.items()))


def _owned(c: CurrentAssignment) -> frozenset[Item]:
    """``c.owned``, without building a new set when nothing is being revoked."""
    return c.assigned | c.revoking if c.revoking else c.assigned


def owned_items(g: Group, member_id: str) -> frozenset[Item]:
    c = g.current.get(member_id)
    return c.owned if c is not None else frozenset()


_REPLAY = {
    GroupMetadataKey: CoordinatorState._replay_group_metadata,
    GroupConnectorsKey: CoordinatorState._replay_connectors,
    GroupMemberKey: CoordinatorState._replay_member,
    TargetAssignmentMemberKey: CoordinatorState._replay_target_member,
    TargetAssignmentMetadataKey: CoordinatorState._replay_target_metadata,
    CurrentMemberAssignmentKey: CoordinatorState._replay_current,
    GroupConfigurationKey: CoordinatorState._replay_configuration,
    ConnectorOffsetKey: CoordinatorState._replay_offset,
    ConnectorTaskConfigsKey: CoordinatorState._replay_task_configs,
}
