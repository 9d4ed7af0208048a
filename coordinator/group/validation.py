"""What the API refuses, as pure functions shared by the handlers and replay.

The handlers (``coordinator.group.coordinator``) answer INVALID_REQUEST with these messages;
replay (``coordinator.group.state``, both record by record and the bulk loader, which end in the
same ``apply_*`` methods) raises ReplayError with them for a record whose bytes are fine (CRC)
but whose content the API would never have accepted: a corrupt or foreign log must fail its
partition, not be served. Each returns a message, or None when valid.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from connect_wire.instance_states import STATES

from .model import CONNECTOR, HELD_EPOCH, Item

__all__ = [
    "MAX_CLIENT_ID_BYTES",
    "MAX_MEMBER_ID_BYTES",
    "cut_client_id",
    "MAX_MEMBER_METADATA_BYTES",
    "validate_assignors",
    "validate_connector",
    "validate_current_epoch",
    "validate_instance_states",
    "validate_item_set",
    "validate_member",
    "validate_member_id",
    "validate_member_metadata_size",
    "validate_report_size",
]

MAX_MEMBER_METADATA_BYTES = 16 * 1024
"""The most bytes a member may describe itself with in a heartbeat: its ClientAssignors (names
and metadata), WorkerUrl and InstanceId together. They are kept, in memory and in the log, for
as long as the member stays; the project's worker sends well under 1 KiB."""

MAX_CLIENT_ID_BYTES = 255
"""The most UTF-8 bytes of a request header's ClientId that a member record keeps (Kafka's
clients send a few dozen). The header allows 32 KiB, which every record of the member and the
"member joined" event would repeat: a longer one is cut (:func:`cut_client_id`), not refused,
since it is the client library's choice, not the worker's."""

MAX_MEMBER_ID_BYTES = 255
"""The most UTF-8 bytes of a MemberId a worker may choose (the coordinator's own are UUIDs, 36).
Every record of the member and every index of the group repeats it, and a join with a new one
is what any principal with READ may send: unbounded, one id cost as much as its frame (a join
with a 900 KB id could not even be logged and left its soft state behind)."""

MAX_GROUP_ID_BYTES = 32_767
"""The most UTF-8 bytes of a group id: every record of the group carries it as a Kafka string
(int16 length). A longer one could not be written at all."""


def validate_assignors(assignors: Iterable[Any]) -> str | None:
    """Client assignors (wire ``Assignor`` or model ``AssignorSpec``: the same fields)."""
    names: set[str] = set()
    for a in assignors:
        if not a.name:
            return "Assignor.Name must be non-empty."
        if a.name in names:
            return f"Assignor.Name {a.name!r} is listed twice."
        names.add(a.name)
        if a.minimum_version < -1:
            return f"Assignor {a.name}: MinimumVersion must be >= -1."
        if a.maximum_version < 0 or a.maximum_version < a.minimum_version:
            return f"Assignor {a.name}: MaximumVersion must be >= 0 and >= MinimumVersion."
        if not a.minimum_version <= a.metadata_version <= a.maximum_version:
            return (
                f"Assignor {a.name}: MetadataVersion must be within "
                "[MinimumVersion, MaximumVersion]."
            )
    return None


def validate_connector(name: str, task_count: int, config_names: Iterable[str]) -> str | None:
    """One connector of ConnectGroupAlterConnectors (and of a GroupConnectors record)."""
    if not name:
        return "Upserts[].Name must be non-empty."
    if "/" in name:
        return f"Connector name {name!r} must not contain '/'."
    if task_count < 0:
        return f"Connector {name}: TaskCount must be >= 0."
    keys = list(config_names)
    if any(not k for k in keys) or len(set(keys)) != len(keys):
        return f"Connector {name}: config names must be non-empty and unique."
    return None


def validate_item_set(items: Iterable[Item], what: str) -> str | None:
    """Model items (connector, task id or CONNECTOR): what ``_validate_items`` checks on the
    wire (non-empty connector names, no negative task id)."""
    for connector, task in items:
        if not connector:
            return f"{what} must not contain an empty connector name."
        if task < 0 and task != CONNECTOR:
            return f"{what} must not contain a negative task id ({connector}/{task})."
    return None


def validate_member(member_id: str, instance_id: str | None, rebalance_timeout_ms: int,
                    assignors: tuple[Any, ...]) -> str | None:
    """A member record: what a heartbeat must say of it. Looser than a first heartbeat on two
    points, which the state machine never relies on: an empty assignor list and a zero
    rebalance timeout are accepted (test fixtures and tools write such members)."""
    if not member_id:
        return "MemberId must be non-empty."
    if instance_id is not None and not instance_id:
        return "InstanceId, if provided, must be non-empty."
    if rebalance_timeout_ms < 0:
        return "RebalanceTimeoutMs must not be negative."
    return validate_assignors(assignors)


def validate_current_epoch(epoch: int) -> str | None:
    """A current assignment's member epoch: >= -2 (-1 and -2 as a leaving member sends them) or
    a hold (HELD_EPOCH)."""
    if epoch < -2 and epoch != HELD_EPOCH:
        return f"MemberEpoch {epoch} is impossible (>= -2, or {HELD_EPOCH} for a hold)."
    return None


def validate_member_metadata_size(assignors: Iterable[Any] | None, worker_url: str | None,
                                  instance_id: str | None) -> str | None:
    """What a heartbeat says of its member, bounded (:data:`MAX_MEMBER_METADATA_BYTES`):
    strings count their UTF-8 bytes, each assignor 16 more (its versions and reason)."""
    def utf8(text: str | None) -> int:
        return len(text.encode("utf-8", "surrogatepass")) if text else 0

    size = utf8(worker_url) + utf8(instance_id)
    for a in assignors or ():
        size += utf8(a.name) + len(a.metadata_bytes) + 16
    if size > MAX_MEMBER_METADATA_BYTES:
        return (f"ClientAssignors, WorkerUrl and InstanceId take {size:,} bytes, more than "
                f"the {MAX_MEMBER_METADATA_BYTES:,} a member may describe itself with.")
    return None


def cut_client_id(client_id: str) -> str:
    """``client_id``, or its first :data:`MAX_CLIENT_ID_BYTES` UTF-8 bytes on a character
    boundary when it is longer."""
    if len(client_id) * 4 <= MAX_CLIENT_ID_BYTES:  # (no character takes more than 4 bytes)
        return client_id
    raw = client_id.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_CLIENT_ID_BYTES:
        return client_id
    return raw[:MAX_CLIENT_ID_BYTES].decode("utf-8", "ignore")


def validate_member_id(member_id: str) -> str | None:
    """A heartbeat's MemberId: at most :data:`MAX_MEMBER_ID_BYTES` of UTF-8."""
    if len(member_id) * 4 <= MAX_MEMBER_ID_BYTES:  # (no character takes more than 4 bytes)
        return None
    size = len(member_id.encode("utf-8", "surrogatepass"))
    if size > MAX_MEMBER_ID_BYTES:
        return f"MemberId takes {size:,} bytes, more than the {MAX_MEMBER_ID_BYTES} allowed."
    return None


def validate_group_id_size(group_id: str) -> str | None:
    """A new group's id: at most :data:`MAX_GROUP_ID_BYTES` of UTF-8."""
    if len(group_id) * 4 <= MAX_GROUP_ID_BYTES:  # (no character takes more than 4 bytes)
        return None
    size = len(group_id.encode("utf-8", "surrogatepass"))
    if size > MAX_GROUP_ID_BYTES:
        return (f"GroupId takes {size:,} bytes, more than the {MAX_GROUP_ID_BYTES:,} a "
                "group's records can carry.")
    return None


def validate_report_size(group_id: str, reported: int, states: int, group_items: int,
                         member_items: int) -> str | None:
    """A heartbeat's OwnedConnectors plus OwnedTasks, and its InstanceStates, each name at most
    as many items as the group configures plus what the member owns (a worker runs only items
    assigned to it, and what it still runs of a deleted connector or task stays owned by it
    until it reports it stopped). Beyond that, a join is refused; a member's later report is
    ignored, not refused (what it started of a connector deleted just after a full report that
    did not name it yet is no longer its own), at no cost, where reading it would cost time in
    proportion to its length."""
    limit = group_items + member_items
    if reported > limit:
        return (f"OwnedConnectors and OwnedTasks name {reported:,} items; group {group_id} "
                f"configures {group_items:,} and the member owns {member_items:,}.")
    if states > limit:
        return (f"InstanceStates has {states:,} entries; group {group_id} configures "
                f"{group_items:,} items and the member owns {member_items:,}.")
    return None


def validate_instance_states(states: Iterable[Any]) -> str | None:
    """A heartbeat's InstanceStates: a non-empty connector name, a task id >= -1, a State the
    protocol defines (an entry the coordinator cannot show would only hide a broken client)."""
    for s in states:
        if not s.connector:
            return "InstanceStates must not contain an empty connector name."
        if s.task < CONNECTOR:
            return f"InstanceStates must not contain a negative task id ({s.connector}/{s.task})."
        if s.state not in STATES:
            return (f"InstanceStates {Item(s.connector, s.task)}: State {s.state[:64]!r} is not one "
                    f"of {', '.join(sorted(STATES))}.")
    return None
