"""Kafka Connect's EagerAssignor (protocol ``default``, version 0), as a pure client-side assignor.

Connect's rule (``EagerAssignor.performTaskAssignment``), reproduced exactly:

1. members sorted by member id (plain string order: ``"w10" < "w2"``);
2. connectors sorted by name; each connector goes to the next member of **one** circular
   iterator over the members;
3. then, for each connector in sorted order, each of its tasks in task order goes to the next
   member of the **same** iterator — the tasks continue where the connectors stopped, they do
   not restart at the first member (Connect does this so that single-task connectors do not end
   up as "connectors on even workers, tasks on odd workers").

Current ownership is ignored completely, there is no assignor state and never a delay: every
computation is a fresh round robin. Connectors and tasks are each balanced (max - min <= 1),
and so is their sum, because the whole sequence is one round robin.
"""

from __future__ import annotations

from connect_wire.items import CONNECTOR, Item

from ._gc import gc_paused
from .api import AssignorMetadata, GroupAssignment, GroupSpec, MemberAssignmentInfo, MemberTarget

_new_item = tuple.__new__


class EagerAssignor:
    """Round robin over sorted members: sorted connectors first, then their tasks."""

    name = "eager"
    minimum_version = 0
    maximum_version = 0

    def __init__(self) -> None:
        self.last_assignment: MemberAssignmentInfo | None = None

    def metadata(self) -> AssignorMetadata:
        return AssignorMetadata(reason=0, version=self.maximum_version, data=b"")

    def on_assignment(self, assignment: MemberAssignmentInfo) -> None:
        self.last_assignment = assignment

    def assign(self, group: GroupSpec) -> GroupAssignment:
        with gc_paused():
            return self._assign(group)

    def _assign(self, group: GroupSpec) -> GroupAssignment:
        members = sorted(group.members)
        n = len(members)
        if n == 0:
            return GroupAssignment(members={})
        out: list[list[Item]] = [[] for _ in range(n)]
        names = sorted(group.connectors)
        for k, name in enumerate(names):
            out[k % n].append(_new_item(Item, (name, CONNECTOR)))
        pos = len(names)
        for name in names:
            count = group.connectors[name]
            # Task t of this connector goes to member (pos + t) mod n: deal it in n strides.
            for j in range(min(n, count)):
                out[(pos + j) % n].extend(_new_item(Item, (name, t)) for t in range(j, count, n))
            pos += count
        return GroupAssignment(
            members={m: MemberTarget(frozenset(out[i])) for i, m in enumerate(members)}
        )
