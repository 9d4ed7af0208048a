"""Replay: the one way the coordinator's state changes.

:meth:`CoordinatorState.replay` applies one record; loading a partition is replaying its log,
and a handler's records are applied with the very same call. Each record replaces the whole
value of its key (full state per key, never a delta), so the inverse of applying a record is
applying the key's previous value: :meth:`CoordinatorState.current_record` returns it, which is
how a failed write is rolled back.

Derived indexes (who owns an item now, who owns it in the target, static instance ids, which
members are not reconciled) are updated here, incrementally, so no handler scans a group.
"""

from __future__ import annotations

from typing import Any

from connect_wire.records import (
    CurrentMemberAssignmentKey,
    GroupConfigurationKey,
    GroupConnectorsKey,
    GroupMemberKey,
    GroupMetadataKey,
    TargetAssignmentMemberKey,
    TargetAssignmentMetadataKey,
)

from . import records as rec
from .model import Group, Item


class ReplayError(ValueError):
    """A record that cannot apply to the current state (a corrupt or foreign log)."""


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

    def _replay_group_metadata(self, key: Any, value: Any) -> None:
        if value is None:
            g = self.groups.get(key.group_id)
            if g is None:
                return
            if g.members or g.current or g.target:
                raise ReplayError(f"group {key.group_id} deleted while it still has members")
            del self.groups[key.group_id]
            return
        g = self._group(key.group_id)
        g.epoch = value.epoch
        g.has_metadata = True
        self._refresh_reconciled_all(g)

    def _replay_connectors(self, key: Any, value: Any) -> None:
        if value is None:
            g = self.groups.get(key.group_id)
            if g is not None:
                g.connectors = {}
                g.configured = set()
                g.connectors_epoch = 0
            return
        g = self._group(key.group_id)
        g.connectors = rec.connectors_from(value)
        g.connectors_epoch = value.epoch
        g.configured = {i for c in g.connectors.values() for i in c.items()}

    def _replay_member(self, key: Any, value: Any) -> None:
        g = self.groups.get(key.group_id) if value is None else self._group(key.group_id)
        if g is None:
            return
        # The assignor selection and the eligible computing members are cached per group epoch;
        # a member record can change them without an epoch bump (a static member replaced by a
        # new member id) and a rollback replays member records too: drop the cache.
        g.soft.selection_epoch = -1
        old = g.members.get(key.member_id)
        if old is not None and old.instance_id is not None:
            if g.static_members.get(old.instance_id) == key.member_id:
                del g.static_members[old.instance_id]
        if value is None:
            g.members.pop(key.member_id, None)
            g.unreconciled.discard(key.member_id)
            return
        m = rec.member_from(key.member_id, value)
        g.members[key.member_id] = m
        if m.instance_id is not None:
            g.static_members[m.instance_id] = key.member_id
        self._refresh_reconciled(g, key.member_id)

    def _replay_target_member(self, key: Any, value: Any) -> None:
        g = self.groups.get(key.group_id) if value is None else self._group(key.group_id)
        if g is None:
            return
        old = g.target.pop(key.member_id, None)
        if old is not None:
            for item in old.items:
                if g.target_owner.get(item) == key.member_id:
                    del g.target_owner[item]
        if value is None:
            return
        t = rec.target_from(value)
        g.target[key.member_id] = t
        for item in t.items:
            g.target_owner[item] = key.member_id

    def _replay_target_metadata(self, key: Any, value: Any) -> None:
        g = self.groups.get(key.group_id) if value is None else self._group(key.group_id)
        if g is None:
            return
        if value is None:
            g.assignment_epoch = 0
            g.assignment_error = 0
            g.assignor_state = b""
            g.scheduled_rebalance_at_ms = -1
            g.has_target_metadata = False
        else:
            g.assignment_epoch = value.assignment_epoch
            g.assignment_error = value.error
            g.assignor_state = value.assignor_state
            g.scheduled_rebalance_at_ms = value.scheduled_rebalance_at_ms
            g.has_target_metadata = True
        self._refresh_reconciled_all(g)

    def _replay_current(self, key: Any, value: Any) -> None:
        g = self.groups.get(key.group_id) if value is None else self._group(key.group_id)
        if g is None:
            return
        # FIX (tests): refuse a double owner *before* touching the state. The check used to run
        # after the member's old assignment had been removed, so a refused record left the
        # member without its current assignment (and the coordinator's rollback, which only
        # undoes completed writes, could not restore it).
        c = rec.current_from(value) if value is not None else None
        if c is not None:
            for item in c.owned:
                holder = g.owner.get(item)
                if holder is not None and holder != key.member_id:
                    raise ReplayError(
                        f"group {key.group_id}: {item} owned by {holder} and {key.member_id}"
                    )
        old = g.current.pop(key.member_id, None)
        if old is not None:
            for item in old.owned:
                if g.owner.get(item) == key.member_id:
                    del g.owner[item]
        if c is None:
            g.unreconciled.discard(key.member_id)
            return
        g.current[key.member_id] = c
        for item in c.owned:
            g.owner[item] = key.member_id
        self._refresh_reconciled(g, key.member_id)

    def _replay_configuration(self, key: Any, value: Any) -> None:
        g = self.groups.get(key.group_id) if value is None else self._group(key.group_id)
        if g is None:
            return
        g.configs = {} if value is None else {c.name: c.value for c in value.configs}

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
        g.unreconciled = {m for m in g.members if not g.is_reconciled(m)}

    # -- undo -------------------------------------------------------------------------------------
    def current_record(self, key: Any) -> rec.Record:
        """The record that would recreate ``key``'s current value (a tombstone if absent)."""
        g = self.groups.get(key.group_id)
        t = type(key)
        if g is None:
            return rec.tombstone(key)
        if t is GroupMetadataKey:
            return rec.group_metadata(g.group_id, g.epoch) if g.has_metadata else rec.tombstone(key)
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
                g.scheduled_rebalance_at_ms,
            )
        if t is CurrentMemberAssignmentKey:
            c = g.current.get(key.member_id)
            return rec.current_assignment(g.group_id, key.member_id, c) if c else rec.tombstone(key)
        if t is GroupConfigurationKey:
            return rec.group_configuration(g.group_id, g.configs) if g.configs else rec.tombstone(key)
        raise ReplayError(f"unknown record key type {t.__name__}")

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The durable state of every group, for equality checks."""
        return {gid: g.durable() for gid, g in self.groups.items()}


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
}
