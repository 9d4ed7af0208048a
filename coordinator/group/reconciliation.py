"""Member reconciliation: how one member's current assignment moves toward its target.

Theory of operation (seed 000 "Member Epoch", KIP-848 ``CurrentAssignmentBuilder``):

* **Revoke before assign.** Items the member holds that are not in its target are revoked
  first: the member keeps its epoch, its assignment shrinks to ``assigned ∩ target`` and the
  rest is ``revoking`` (state UnrevokedItems) until the member reports (owned lists) that it no
  longer runs them. Only then does the member move to the target epoch.
* **Assign only what is free.** At the target epoch the member receives its target minus the
  items another member still owns (assigned or revoking); those arrive on a later heartbeat as
  their owners release them (state UnreleasedItems). Items being revoked *by this same member*
  are not counted as unreleased (KAFKA-19449).
* A response never revokes and assigns in one step; the epoch never moves while revoking
  (KAFKA-19974); a member that already dropped what it must revoke (a lost response) skips the
  revocation step.

The function is pure: the current value, the target, what the member reports and who owns what
in; the next current value out.
"""

from __future__ import annotations

from collections.abc import Callable

from .model import CurrentAssignment, Item, MemberState, TargetMember


def next_assignment(
    member_id: str,
    current: CurrentAssignment,
    target_epoch: int,
    target: TargetMember,
    owned: frozenset[Item] | None,
    owner_of: Callable[[Item], str | None],
    force: bool = False,
) -> CurrentAssignment:
    """The member's next current assignment.

    ``owned`` is what the member reports running (None: unknown this time). ``owner_of`` maps
    an item to the member owning it now. ``force`` recomputes a Stable member at the target
    epoch (used when items it holds were deleted).
    """
    state = current.state
    if state == MemberState.STABLE:
        if current.epoch == target_epoch and not force:
            return current
        return _compute(member_id, current, current.epoch, target_epoch, target, owned, owner_of)
    if state == MemberState.UNREVOKED_ITEMS:
        if owned is None or owned & current.revoking:
            return current  # still running something it must give up
        return _compute(member_id, current, current.epoch, target_epoch, target, owned, owner_of)
    # UNRELEASED_ITEMS: check whether what it waits for is free now.
    return _compute(member_id, current, current.epoch, target_epoch, target, owned, owner_of)


def _compute(
    member_id: str,
    current: CurrentAssignment,
    epoch: int,
    target_epoch: int,
    target: TargetMember,
    owned: frozenset[Item] | None,
    owner_of: Callable[[Item], str | None],
) -> CurrentAssignment:
    kept = current.assigned & target.items
    revoke = current.assigned - kept
    to_assign: set[Item] = set()
    unreleased = False
    for item in target.items - kept:
        holder = owner_of(item)
        if holder is None or holder == member_id:
            to_assign.add(item)
        else:
            unreleased = True

    if revoke and (owned is None or owned & revoke):
        # Step 1: revoke. Same epoch, nothing new.
        return CurrentAssignment(
            epoch=epoch,
            previous_epoch=current.previous_epoch,
            state=MemberState.UNREVOKED_ITEMS,
            assigned=kept,
            revoking=revoke,
            metadata_version=current.metadata_version,
            metadata_bytes=current.metadata_bytes,
        )
    # Steps 2 and 3: move to the target epoch and take what is free.
    new_epoch = target_epoch
    return CurrentAssignment(
        epoch=new_epoch,
        previous_epoch=epoch if new_epoch != epoch else current.previous_epoch,
        state=MemberState.UNRELEASED_ITEMS if unreleased else MemberState.STABLE,
        assigned=kept | frozenset(to_assign),
        revoking=frozenset(),
        metadata_version=target.metadata_version,
        metadata_bytes=target.metadata_bytes,
    )
