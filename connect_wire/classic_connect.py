"""Kafka Connect's embedded group protocol (what a classic Connect worker puts in JoinGroup's
protocol metadata and finds in SyncGroup's assignment), byte for byte as Kafka's
``ConnectProtocol`` (version 0, protocol ``default``, eager) and
``IncrementalCooperativeConnectProtocol`` (version 1 ``compatible``, version 2 ``sessioned``)
write it.

Encodings are the classic (non-flexible) ones: int16/int32/int64 big-endian; a string is an
int16 length (never negative) and UTF-8; an array an int32 count (-1: null, where nullable)
and its elements; nullable bytes an int32 length (-1: null) and the bytes.

Worker metadata (JoinGroup ``protocols[].metadata``)::

    Version int16, Url string, ConfigOffset int64          (version 0)
    ... , Allocation nullable bytes                        (version 1, 2)

``Allocation`` is the worker's whole current assignment, itself encoded as an assignment of
version 1 or 2, or null when it has none.

Assignment (SyncGroup ``assignment``)::

    Version int16, Error int16, Leader string, LeaderUrl string, ConfigOffset int64,
    Assignment [Connector string, Tasks [int32]]           (version 0; task -1 = the connector)
    ... , Revoked nullable [...], ScheduledDelay int32      (version 1, 2; Assignment nullable)

Versions 1 and 2 are incremental: the worker keeps what it runs, stops ``Revoked`` and starts
``Assignment``. Decoding is strict for the versions known here: a truncated field, a negative
length, a null where none may be, bytes left over or text that is not UTF-8 raise
:class:`ConnectProtocolError` (the coordinator answers INCONSISTENT_GROUP_PROTOCOL). As Kafka's
readers, a version above 2 is read as version 2 and what follows is ignored, and the
Allocation (and, in an assignment, Revoked and ScheduledDelay) may be missing at the end of a
version 1 or 2 value (their defaults: null, null, 0).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from connect_wire.items import CONNECTOR, EMPTY, Item

PROTOCOL_TYPE = "connect"
EAGER, COMPATIBLE, SESSIONED = "default", "compatible", "sessioned"
PROTOCOL_VERSIONS = {EAGER: 0, COMPATIBLE: 1, SESSIONED: 2}
"""Protocol name -> the metadata/assignment version it uses."""
PREFERENCE = (SESSIONED, COMPATIBLE, EAGER)
"""The names in Kafka Connect's order of preference (``connect.protocol=sessioned`` offers all
three in this order)."""
NO_ERROR, CONFIG_MISMATCH = 0, 1

Entries = tuple[tuple[str, tuple[int, ...]], ...]
"""Connector assignments as on the wire: (connector, task ids; -1 = the connector itself)."""

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class ConnectProtocolError(ValueError):
    """Bytes that are not a valid Connect worker metadata or assignment (the message says
    which field and why)."""


@dataclass(frozen=True, slots=True)
class WorkerMetadata:
    version: int
    url: str
    config_offset: int
    allocation: bytes | None = None
    """Version 1 and 2: the worker's current assignment (an encoded :class:`Assignment`), or
    None. Always None for version 0."""


@dataclass(frozen=True, slots=True)
class Assignment:
    version: int
    error: int
    leader: str
    leader_url: str
    config_offset: int
    assigned: Entries | None
    revoked: Entries | None = None
    delay_ms: int = 0

    def assigned_items(self) -> frozenset[Item]:
        return items_of(self.assigned)

    def revoked_items(self) -> frozenset[Item]:
        return items_of(self.revoked)


def items_of(entries: Entries | None) -> frozenset[Item]:
    if not entries:
        return EMPTY
    return frozenset(Item(c, t) for c, tasks in entries for t in tasks)


def entries_of(items: Iterable[Item]) -> Entries:
    """``items`` as Connect's serializer groups them: connectors sorted by name, each with -1
    first (when the connector itself is included), then its task ids in order."""
    by: dict[str, list[int]] = {}
    for item in sorted(items, key=lambda i: (i.connector, i.task)):
        by.setdefault(item.connector, []).append(item.task)
    return tuple((c, tuple(ts)) for c, ts in by.items())


# -- writing -------------------------------------------------------------------------------------
def _string(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0x7FFF:
        raise ConnectProtocolError(f"string of {len(raw)} bytes is longer than 32767")
    return _I16.pack(len(raw)) + raw


def _entries(entries: Entries | None) -> bytes:
    if entries is None:
        return _I32.pack(-1)
    out = [_I32.pack(len(entries))]
    for connector, tasks in entries:
        out.append(_string(connector))
        out.append(_I32.pack(len(tasks)))
        out.extend(_I32.pack(t) for t in tasks)
    return b"".join(out)


def encode_metadata(m: WorkerMetadata) -> bytes:
    head = _I16.pack(m.version) + _string(m.url) + _I64.pack(m.config_offset)
    if m.version == 0:
        return head
    if m.allocation is None:
        return head + _I32.pack(-1)
    return head + _I32.pack(len(m.allocation)) + m.allocation


def encode_assignment(a: Assignment) -> bytes:
    if a.version == 0 and a.assigned is None:
        raise ConnectProtocolError("a version 0 assignment cannot be null")
    head = (_I16.pack(a.version) + _I16.pack(a.error) + _string(a.leader)
            + _string(a.leader_url) + _I64.pack(a.config_offset) + _entries(a.assigned))
    if a.version == 0:
        return head
    return head + _entries(a.revoked) + _I32.pack(a.delay_ms)


# -- reading -------------------------------------------------------------------------------------
class _Reader:
    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = memoryview(bytes(data))
        self.pos = 0
        self.what = what

    def left(self) -> int:
        return len(self.data) - self.pos

    def _take(self, n: int, field: str) -> memoryview:
        if self.left() < n:
            raise ConnectProtocolError(
                f"{self.what}: {field} needs {n} bytes at offset {self.pos}, "
                f"{self.left()} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def i16(self, field: str) -> int:
        return int(_I16.unpack(self._take(2, field))[0])

    def i32(self, field: str) -> int:
        return int(_I32.unpack(self._take(4, field))[0])

    def i64(self, field: str) -> int:
        return int(_I64.unpack(self._take(8, field))[0])

    def string(self, field: str) -> str:
        n = self.i16(f"{field}'s length")
        if n < 0:
            raise ConnectProtocolError(f"{self.what}: {field} has length {n}: it cannot be null")
        raw = self._take(n, field)
        try:
            return bytes(raw).decode()
        except UnicodeDecodeError as exc:
            raise ConnectProtocolError(f"{self.what}: {field} is not UTF-8 ({exc.reason})") from None

    def nullable_bytes(self, field: str) -> bytes | None:
        n = self.i32(f"{field}'s length")
        if n == -1:
            return None
        if n < 0:
            raise ConnectProtocolError(f"{self.what}: {field} has length {n}")
        return bytes(self._take(n, field))

    def entries(self, field: str, nullable: bool) -> Entries | None:
        n = self.i32(f"{field}'s count")
        if n == -1 and nullable:
            return None
        if n < 0:
            raise ConnectProtocolError(f"{self.what}: {field} has count {n}"
                                       + ("" if nullable else ": it cannot be null"))
        if n > self.left() // 6:  # each entry takes at least 6 bytes
            raise ConnectProtocolError(f"{self.what}: {field} claims {n} entries, "
                                       f"{self.left()} bytes left")
        out = []
        for _ in range(n):
            connector = self.string(f"{field}[].Connector")
            count = self.i32(f"{field}[].Tasks' count")
            if count < 0:
                raise ConnectProtocolError(
                    f"{self.what}: {field}[].Tasks of {connector!r} has count {count}: "
                    "it cannot be null")
            if count > self.left() // 4:
                raise ConnectProtocolError(
                    f"{self.what}: {field}[].Tasks of {connector!r} claims {count} ids, "
                    f"{self.left()} bytes left")
            tasks = tuple(self.i32(f"{field}[].Tasks[]") for _ in range(count))
            if any(t < CONNECTOR for t in tasks):
                raise ConnectProtocolError(
                    f"{self.what}: {field}[].Tasks of {connector!r} holds a task id below -1")
            out.append((connector, tasks))
        return tuple(out)

    def version(self) -> int:
        v = self.i16("Version")
        if v < 0:
            raise ConnectProtocolError(f"{self.what}: Version {v} is negative")
        return v

    def end(self, version: int) -> None:
        if version <= 2 and self.left():
            raise ConnectProtocolError(
                f"{self.what}: {self.left()} bytes left over after a version {version} value")


def decode_metadata(data: bytes) -> WorkerMetadata:
    r = _Reader(data, "worker metadata")
    version = r.version()
    url = r.string("Url")
    offset = r.i64("ConfigOffset")
    allocation = None
    if version >= 1 and r.left():
        allocation = r.nullable_bytes("Allocation")
    r.end(version)
    if allocation is not None:
        decode_assignment(allocation)  # (an allocation that is not an assignment is garbage)
    return WorkerMetadata(min(version, 2), url, offset, allocation)


def decode_assignment(data: bytes) -> Assignment:
    r = _Reader(data, "assignment")
    version = r.version()
    error = r.i16("Error")
    leader = r.string("Leader")
    leader_url = r.string("LeaderUrl")
    offset = r.i64("ConfigOffset")
    assigned = r.entries("Assignment", nullable=version >= 1)
    revoked, delay = None, 0
    if version >= 1:
        if r.left():
            revoked = r.entries("Revoked", nullable=True)
        if r.left():
            delay = r.i32("ScheduledDelay")
    r.end(version)
    return Assignment(min(version, 2), error, leader, leader_url, offset, assigned, revoked,
                      delay)


def allocation_items(m: WorkerMetadata) -> frozenset[Item]:
    """What a worker says it runs: its Allocation's assigned items (none for version 0: an
    eager worker stops everything before it rejoins)."""
    if m.version == 0 or m.allocation is None:
        return EMPTY
    return decode_assignment(m.allocation).assigned_items()
