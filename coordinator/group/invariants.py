"""The invariants of the connect group state, as one function.

The tests call it after every step, and so does the simulation. It scans everything (O(state)),
so the daemon never calls it on a hot path.
"""

from __future__ import annotations

from typing import Any

from .model import (
    HELD_EPOCH,
    Group,
    GroupState,
    Item,
    MemberState,
    connector_items,
    is_hold,
    running_task_count,
)
from .state import CoordinatorState


class InvariantViolation(AssertionError):
    """The state broke a rule that must always hold."""


def check_invariants(state: CoordinatorState, previous: dict[str, Any] | None = None) -> None:
    """Raise :class:`InvariantViolation` listing every broken rule.

    ``previous`` is an earlier :func:`epochs` of the same state, to check that epochs never go
    backwards.
    """
    problems: list[str] = []
    for gid, g in state.groups.items():
        problems += [f"group {gid}: {p}" for p in _group_problems(g)]
    if previous is not None:
        problems += _epoch_problems(previous, epochs(state))
    if problems:
        raise InvariantViolation("\n".join(problems))


def _group_problems(g: Group) -> list[str]:
    out: list[str] = []
    # 1. No connector or task in two members' owned sets.
    owner: dict[Item, str] = {}
    for mid, cur in g.current.items():
        if cur.assigned & cur.revoking:
            out.append(f"{mid} both runs and revokes {sorted(map(str, cur.assigned & cur.revoking))}")
        for item in cur.owned:
            if item in owner:
                out.append(f"{item} owned by both {owner[item]} and {mid}")
            owner[item] = mid
    # 2. Targets only contain configured items, none twice.
    # (each connector's running task count: its task configs' number, if written)
    configured = {i for c in g.connectors.values()
                  for i in connector_items(c.name, running_task_count(c, g.task_configs.get(c.name)))}
    in_target: dict[Item, str] = {}
    for mid, t in g.target.items():
        extra = t.items - configured
        if extra:
            out.append(f"target of {mid} holds unconfigured {sorted(map(str, extra))[:5]}")
        for item in t.items:
            if item in in_target:
                out.append(f"{item} in the targets of both {in_target[item]} and {mid}")
            in_target[item] = mid
    # 3. Epochs: assignment <= group; a member's epoch never exceeds the assignment epoch.
    if g.assignment_epoch > g.epoch:
        out.append(f"assignment epoch {g.assignment_epoch} > group epoch {g.epoch}")
    for mid, cur in g.current.items():
        if cur.epoch > g.assignment_epoch:
            out.append(f"{mid} epoch {cur.epoch} > assignment epoch {g.assignment_epoch}")
        if cur.epoch < -2 and not (mid not in g.members and is_hold(cur)):
            out.append(f"{mid} has impossible epoch {cur.epoch}")
        # Member state matches its sets.
        if cur.state == MemberState.UNREVOKED_ITEMS and not cur.revoking:
            out.append(f"{mid} is UnrevokedItems with nothing to revoke")
        if cur.state != MemberState.UNREVOKED_ITEMS and cur.revoking:
            out.append(f"{mid} revokes {len(cur.revoking)} items in state {cur.state.label}")
    # 4. Members, current and target assignments describe the same members; a non-member's
    #    current assignment is a hold (a fenced member's items, revoking, nothing assigned).
    if not set(g.members) <= set(g.current):
        out.append(f"members {sorted(g.members)} vs current assignments {sorted(g.current)}")
    for mid in set(g.current) - set(g.members):
        cur = g.current[mid]
        if not is_hold(cur) or cur.assigned or not cur.revoking:
            out.append(f"current assignment of non-member {mid} is not a hold: {cur}")
    if not set(g.target) <= set(g.members):
        out.append(f"targets for non-members {sorted(set(g.target) - set(g.members))}")
    # 5. Derived indexes equal a recomputation.
    if owner != g.owner:
        out.append("owner index differs from the current assignments")
    if in_target != g.target_owner:
        out.append("target owner index differs from the targets")
    if configured != g.configured:
        out.append("configured index differs from the connectors")
    statics = {m.instance_id: mid for mid, m in g.members.items() if m.instance_id is not None}
    if statics != g.static_members:
        out.append("static member index differs from the members")
    if len(statics) != sum(1 for m in g.members.values() if m.instance_id is not None):
        out.append("two members share an instance id")
    # 6. The group state matches the members.
    unreconciled = {m for m in g.members if not g.is_reconciled(m)}
    if unreconciled != g.unreconciled:
        out.append(f"unreconciled index {sorted(g.unreconciled)} != {sorted(unreconciled)}")
    expected = (
        GroupState.EMPTY if not g.members
        else GroupState.ASSIGNING if g.epoch > g.assignment_epoch
        else GroupState.RECONCILING if unreconciled
        else GroupState.STABLE
    )
    if g.state != expected:
        out.append(f"state {g.state.value} != {expected.value}")
    if not g.members and g.has_target_metadata and g.assignment_epoch != g.epoch:
        out.append(f"empty group with assignment epoch {g.assignment_epoch} != {g.epoch}")
    # 7. The assignor index chooses what a scan of the members chooses.
    from .coordinator import eligible_assigners, select_assignor

    members = list(g.members.values())
    name = select_assignor(members)
    indexed = g.assignors.select(len(members), members[0] if members else None)
    if indexed != name:
        out.append(f"assignor index selects {indexed!r}, the members {name!r}")
    elif name is not None and sorted(g.assignors.eligible(name)) != eligible_assigners(members, name):
        out.append(f"assignor index's eligible members differ from the members' for {name}")
    return out


def epochs(state: CoordinatorState) -> dict[str, Any]:
    """The epochs of every group and member, for :func:`check_invariants`'s ``previous``."""
    return {
        gid: (g.epoch, g.assignment_epoch, {m: c.epoch for m, c in g.current.items()})
        for gid, g in state.groups.items()
    }


def _epoch_problems(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    for gid, (epoch, assignment_epoch, members) in before.items():
        if gid not in after:
            continue
        new_epoch, new_assignment_epoch, new_members = after[gid]
        if new_epoch < epoch:
            out.append(f"group {gid}: group epoch went back {epoch} -> {new_epoch}")
        if new_assignment_epoch < assignment_epoch:
            out.append(f"group {gid}: assignment epoch went back {assignment_epoch} -> "
                       f"{new_assignment_epoch}")
        for mid, e in members.items():
            n = new_members.get(mid)
            # A member may restart at 0 (rejoin), park at -2 (static leave) or leave a hold
            # behind (-3, fenced); otherwise its epoch only moves forward.
            if n is not None and n not in (0, -2, HELD_EPOCH) and e >= 0 and n < e:
                out.append(f"group {gid}: member {mid} epoch went back {e} -> {n}")
    return out
