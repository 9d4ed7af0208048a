"""Classic members: Kafka Connect workers speaking JoinGroup/SyncGroup/Heartbeat/LeaveGroup
with Connect's embedded protocol (connect_wire.classic_connect), reconciled one by one through
the same state machine as the members of the new protocol (seed 002 "Supporting Online
Consumer Group Upgrade", Kafka's consumer-group classic path).

This module holds the pure parts: the requests as plain values, the protocol choice, the
migration policy, the rules deciding when a classic member must rejoin, and the assignment a
SyncGroup answers. The handlers are in :mod:`coordinator.group.coordinator`.

* A classic member's generation id is its member epoch. There is no leader and no member list
  in JoinGroup's answer: every classic member is a follower and sends an empty SyncGroup.
* What a classic member runs is what its latest JoinGroup said: the ``Allocation`` of its
  worker metadata (protocols ``compatible``/``sessioned``), or nothing (``default``: an eager
  worker stops everything before it rejoins). Heartbeats carry no such report, so a
  revocation is acknowledged only by a rejoin.
* SyncGroup answers, as an assignment of the member's own protocol version, what the member
  may run now (current ∩ target while it must revoke). Versions 1 and 2 are incremental:
  ``Assignment`` is what it did not report running, ``Revoked`` what it reported and may no
  longer run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from connect_wire import classic_connect as cc
from connect_wire.items import Item

from .model import ClassicMember, CurrentAssignment, Group, MemberMetadata, MemberState


@dataclass(frozen=True, slots=True)
class Join:
    group_id: str
    member_id: str
    instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    requires_member_id: bool = True
    """JoinGroup v4+ without an instance id: an empty member id is answered
    MEMBER_ID_REQUIRED with a new id (KIP-394)."""


@dataclass(frozen=True, slots=True)
class Sync:
    group_id: str
    generation_id: int
    member_id: str
    instance_id: str | None
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class Beat:
    group_id: str
    generation_id: int
    member_id: str
    instance_id: str | None


@dataclass(frozen=True, slots=True)
class Leave:
    group_id: str
    members: tuple[tuple[str, str | None], ...]
    """(member id, instance id) of each member leaving."""


MAX_METADATA_BYTES = 16 * 1024
"""What a classic member's protocols' metadata may take besides its allocation (the URL and
fixed fields of three protocols take well under 1 KiB)."""
BYTES_PER_ITEM = 3 * 64
"""And per item of the group (three protocols may each carry an allocation naming it, an entry
taking its connector's name and 4 bytes): bounded by the group's size, like a report."""


class Refused(Exception):
    """A JoinGroup's protocols cannot be accepted (INCONSISTENT_GROUP_PROTOCOL)."""


def accept_protocols(
    protocol_type: str, protocols: Iterable[tuple[str, bytes]]
) -> tuple[tuple[tuple[str, bytes], ...], cc.WorkerMetadata]:
    """The protocols of a JoinGroup this coordinator serves, in the member's order, and the
    decoded worker metadata of the first (the one it uses). Names other than Connect's are
    left out (a member may offer more); none left, a wrong protocol type, a duplicate name or
    metadata that is not Connect's: :class:`Refused` with the reason."""
    if protocol_type != cc.PROTOCOL_TYPE:
        raise Refused(f"ProtocolType {protocol_type!r} is not served: a connect group's "
                      f"members use {cc.PROTOCOL_TYPE!r}.")
    kept: list[tuple[str, bytes]] = []
    offered: list[str] = []
    first: cc.WorkerMetadata | None = None
    for name, metadata in protocols:
        offered.append(name)
        if name not in cc.PROTOCOL_VERSIONS:
            continue
        if any(name == n for n, _ in kept):
            raise Refused(f"Protocol {name!r} is offered twice.")
        try:
            decoded = cc.decode_metadata(metadata)
        except cc.ConnectProtocolError as exc:
            raise Refused(f"Protocol {name!r}: {exc}") from None
        if first is None:
            first = decoded
        kept.append((name, bytes(metadata)))
    if first is None:
        shown = ", ".join(repr(n) for n in offered[:5]) or "none"
        raise Refused(f"No protocol this coordinator serves was offered ({shown}); a Kafka "
                      f"Connect worker offers {', '.join(cc.PREFERENCE)}.")
    return tuple(kept), first


def member_metadata(classic: ClassicMember) -> cc.WorkerMetadata:
    return cc.decode_metadata(classic.metadata)


def reported(classic: ClassicMember) -> frozenset[Item]:
    """What the member said it runs at its latest JoinGroup."""
    return cc.allocation_items(member_metadata(classic))


# -- the migration policy ----------------------------------------------------------------------
def policy_refusal(policy: str, joiner_classic: bool, has_classic: bool, has_new: bool,
                   group_id: str) -> str | None:
    """Why a member new to a group may not join it, or None. ``upgrade`` is a group of classic
    members taking members of the new protocol; ``downgrade`` the other way. An empty group
    takes either; ``disabled`` admits no member of the other protocol into a non-empty group."""
    if not has_classic and not has_new:
        return None
    same = has_classic if joiner_classic else has_new
    other = has_new if joiner_classic else has_classic
    direction = "downgrade" if joiner_classic else "upgrade"
    what = "classic" if joiner_classic else "new-protocol"
    if policy == "disabled" and other:
        return (f"Group {group_id} has members of the other protocol and "
                f"group.connect.migration.policy=disabled admits no {what} member into it.")
    if not same and policy not in ("bidirectional", direction):
        return (f"Group {group_id} has only members of the other protocol and "
                f"group.connect.migration.policy={policy} does not allow the {direction} a "
                f"{what} member would start.")
    return None


# -- when a classic member must rejoin -----------------------------------------------------------
def must_rejoin(g: Group, member_id: str, cur: CurrentAssignment) -> str | None:
    """Why the member must rejoin now (its heartbeat answers REBALANCE_IN_PROGRESS), or None:
    a newer target is installed than its epoch, it must revoke (a rejoin reports what it
    stopped), items it waits for were released, or items it holds were deleted."""
    if cur.state == MemberState.UNREVOKED_ITEMS:
        return "it must revoke items"
    if cur.epoch < g.assignment_epoch:
        return "a newer target assignment is installed"
    if member_id in g.soft.dirty:
        return "items it holds were removed"
    if cur.state == MemberState.UNRELEASED_ITEMS:
        owner = g.owner.get
        if any(owner(i) is None for i in g.target_items(member_id) - cur.assigned):
            return "items it waits for were released"
    return None


# -- SyncGroup's assignment ----------------------------------------------------------------------
def leader_of(g: Group) -> tuple[str, str]:
    """(leader id, leader URL) a Connect assignment names: the member computing the group's
    target, else the smallest member id (Connect forwards REST requests to the leader)."""
    comp = g.soft.computation
    mid = comp.member_id if comp is not None and comp.member_id in g.members else min(g.members)
    return mid, g.members[mid].worker_url or ""


def sync_assignment(g: Group, m: MemberMetadata, cur: CurrentAssignment, now_ms: int) -> bytes:
    """The SyncGroup assignment of ``m``, in its protocol's version: version 0 the whole
    assignment; versions 1 and 2 what it did not report running (Assignment) and what it
    reported but may no longer run (Revoked), with the delay until a scheduled rebalance."""
    assert m.classic is not None
    version = cc.PROTOCOL_VERSIONS[m.classic.protocol]
    leader, leader_url = leader_of(g)
    offset = g.connectors_epoch
    if version == 0:
        return cc.encode_assignment(cc.Assignment(
            0, cc.NO_ERROR, leader, leader_url, offset, cc.entries_of(cur.assigned)))
    believed = reported(m.classic)
    delay = 0
    at = g.scheduled_rebalance_at_ms
    if at >= 0 and g.epoch == g.assignment_epoch:
        delay = max(0, min(at - now_ms, 2**31 - 1))
    return cc.encode_assignment(cc.Assignment(
        version, cc.NO_ERROR, leader, leader_url, offset, cc.entries_of(cur.assigned - believed),
        cc.entries_of(believed - cur.assigned), delay))


def full_assignment(protocol: str, items: frozenset[Item], leader: str = "",
                    leader_url: str = "", offset: int = 0) -> bytes:
    """A whole assignment (DescribeGroups' member assignment of a classic member)."""
    version = cc.PROTOCOL_VERSIONS.get(protocol, 0)
    return cc.encode_assignment(cc.Assignment(
        version, cc.NO_ERROR, leader, leader_url, offset, cc.entries_of(items),
        () if version else None))


SERVER_ASSIGNORS = {"incremental", "eager"}


def server_assignor_name(g: Group) -> str:
    """The assignor the coordinator runs for a group of classic members only: Connect's eager
    assignor when every member uses ``default`` (as Connect's leader would), else the
    incremental cooperative one."""
    for m in g.members.values():
        if m.classic is not None and m.classic.protocol != cc.EAGER:
            return "incremental"
    return "eager"

