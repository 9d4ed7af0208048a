"""Record <-> bytes: the key and value bytes the partition log stores.

Layout (all integers big-endian, like every Kafka record)::

    key bytes   = int16 record type id (the key class's __api_key__)
                  int16 key version    (the key class's __version__)
                  codec.encode(key)
    value bytes = int16 value version  (the value class's __version__)
                  codec.encode(value)
                  -- or no value at all (None) for a tombstone

The record type id plus key version select the key class in ``RECORD_KEYS``; the record type id
plus value version select the value class in ``RECORD_VALUES``.

Errors, so that the loader can choose what to do:

* :class:`UnknownRecordType`: the (record type id, key version) is not known by this build. Kafka's
  loader skips such records with a warning so that a downgrade after a newer version wrote a new
  record type still loads; the runtime does the same.
* :class:`CorruptRecord`: the bytes are not a valid encoding (or carry trailing bytes). The log's
  CRC already guards against disk corruption, so this means a bug or a foreign writer: loading
  must not silently go on with a partial state.
* :class:`UnsupportedValueVersion` (a :class:`CorruptRecord`): a known record type whose value
  version this build cannot read. Skipping it would silently lose state, so it is not skipped.
"""

from __future__ import annotations

import gc
import struct
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, get_args

from kio.serial.readers import read_unsigned_varint

from connect_wire import codec
from connect_wire.records import (
    RECORD_KEYS,
    RECORD_VALUES,
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
from coordinator.group import records as rec
from coordinator.group.model import (
    CONNECTOR,
    EMPTY,
    AssignorSpec,
    CurrentAssignment,
    Item,
    MemberMetadata,
    MemberState,
    TargetMember,
)
from coordinator.group.records import Record
from coordinator.group.state import CoordinatorState, ReplayError

__all__ = [
    "CorruptRecord",
    "BulkLoader",
    "LoadStats",
    "RecordSerdeError",
    "UnknownRecordType",
    "UnsupportedValueVersion",
    "decode_key",
    "decode_record",
    "decode_value",
    "encode_key",
    "encode_record",
    "encode_value",
    "record_type_of",
    "replay_log",
]

_KEY_HEADER = struct.Struct(">hh")
_VALUE_HEADER = struct.Struct(">h")


class RecordSerdeError(ValueError):
    """Base class of the errors raised when record bytes cannot be turned into a Record."""


class UnknownRecordType(RecordSerdeError):
    """The key's (record type id, key version) is unknown to this build; the loader skips it."""

    def __init__(self, record_type: int, version: int) -> None:
        super().__init__(f"unknown record type {record_type} (key version {version})")
        self.record_type = record_type
        self.version = version


class CorruptRecord(RecordSerdeError):
    """The key or value bytes are malformed."""


class UnsupportedValueVersion(CorruptRecord):
    """A known record type with a value version this build cannot read."""

    def __init__(self, record_type: int, version: int) -> None:
        super().__init__(f"record type {record_type}: unsupported value version {version}")
        self.record_type = record_type
        self.version = version


def _ids(entity: Any, what: str) -> tuple[int, int]:
    cls = type(entity)
    try:
        return cls.__api_key__, cls.__version__
    except AttributeError:
        raise TypeError(f"record {what} must be a generated record class, got {cls.__name__}") from None


def encode_key(key: Any) -> bytes:
    """``>h`` record type id + ``>h`` key version + the encoded key."""
    record_type, version = _ids(key, "key")
    return _KEY_HEADER.pack(record_type, version) + codec.encode(key)


def encode_value(value: Any) -> bytes:
    """``>h`` value version + the encoded value."""
    _, version = _ids(value, "value")
    return _VALUE_HEADER.pack(version) + codec.encode(value)


def encode_record(record: Record) -> tuple[bytes, bytes | None]:
    """The (key bytes, value bytes or None for a tombstone) stored in the log for ``record``."""
    key_bytes = encode_key(record.key)
    if record.value is None:
        return key_bytes, None
    key_type, _ = _ids(record.key, "key")
    value_type, _ = _ids(record.value, "value")
    if key_type != value_type:
        raise ValueError(
            f"record key {type(record.key).__name__} (type {key_type}) does not match "
            f"value {type(record.value).__name__} (type {value_type})"
        )
    return key_bytes, encode_value(record.value)


def record_type_of(key_bytes: bytes) -> tuple[int, int]:
    """(record type id, key version) of encoded key bytes; :class:`CorruptRecord` if too short."""
    if len(key_bytes) < _KEY_HEADER.size:
        raise CorruptRecord(f"record key of {len(key_bytes)} bytes is shorter than its 4-byte header")
    return _KEY_HEADER.unpack_from(key_bytes)


def _decode_exact(cls: type, data: bytes, offset: int, what: str) -> Any:
    try:
        entity, end = codec.decode_trusted(cls, data, offset)  # our own CRC-checked log
    except codec.DecodeError as exc:
        raise CorruptRecord(f"{what}: {exc}") from None
    if end != len(data):
        raise CorruptRecord(f"{what}: {len(data) - end} trailing bytes after {cls.__name__}")
    return entity


def decode_key(key_bytes: bytes) -> Any:
    """Decode key bytes alone (raises :class:`UnknownRecordType` or :class:`CorruptRecord`)."""
    record_type, version = record_type_of(key_bytes)
    key_cls = RECORD_KEYS.get((record_type, version))
    if key_cls is None:
        raise UnknownRecordType(record_type, version)
    return _decode_exact(key_cls, key_bytes, _KEY_HEADER.size, f"record type {record_type} key")


def decode_value(record_type: int, value_bytes: bytes) -> Any:
    """Decode the value bytes of a record of type ``record_type`` (not a tombstone)."""
    if len(value_bytes) < _VALUE_HEADER.size:
        raise CorruptRecord(f"record type {record_type}: value of {len(value_bytes)} bytes has no version")
    (version,) = _VALUE_HEADER.unpack_from(value_bytes)
    value_cls = RECORD_VALUES.get((record_type, version))
    if value_cls is None:
        raise UnsupportedValueVersion(record_type, version)
    return _decode_exact(value_cls, value_bytes, _VALUE_HEADER.size, f"record type {record_type} value")


def decode_record(key_bytes: bytes, value_bytes: bytes | None) -> Record:
    """The :class:`Record` stored as ``key_bytes`` / ``value_bytes`` (None: a tombstone)."""
    key = decode_key(key_bytes)
    if value_bytes is None:
        return Record(key, None)
    return Record(key, decode_value(type(key).__api_key__, value_bytes))


# -- bulk load ------------------------------------------------------------------------------------

OnUnknown = Callable[[UnknownRecordType], None]


@dataclass(slots=True)
class LoadStats:
    """What a :class:`BulkLoader` did (so far)."""

    records: int = 0  # records read from the log
    applied: int = 0  # replayed into the state
    skipped: int = 0  # unknown record types (see UnknownRecordType)


def replay_log(
    state: CoordinatorState,
    batches: Iterable[Sequence[tuple[bytes, bytes | None]]],
    on_unknown: OnUnknown | None = None,
) -> LoadStats:
    """Replay a whole log into ``state``: what ``state.replay(decode_record(key, value))`` does
    for every record, in the same order and with the same result, several times faster.

    ``batches`` yields the (key bytes, value bytes or None) of the records in log order, in
    lists (e.g. :meth:`coordinator.runtime.log.PartitionLog.read_batches`); see
    :class:`BulkLoader`, which this is a shortcut for.
    """
    with BulkLoader(state, on_unknown) as loader:
        for batch in batches:
            loader.add(batch)
    return loader.stats


class BulkLoader:
    """Replays a log into ``state``, batch by batch as they come: what
    ``state.replay(decode_record(key, value))`` does for every record, in the same order and with
    the same result, several times faster. A partition load::

        with BulkLoader(state, on_unknown) as loader:
            log, report = PartitionLog.open(directory, sink=loader.add)

    replays each batch as recovery reads and validates it (the log is read once), or
    ``replay_log(state, log.read_batches())`` after the open.

    :meth:`add` takes one batch: a list of (key bytes, value bytes or None) in log order.
    Records of an unknown type are skipped (``on_unknown`` is called with the error for each,
    and :attr:`stats` counts them); a malformed record raises :class:`CorruptRecord` and one
    that cannot apply raises ReplayError, like :meth:`CoordinatorState.replay` -- the records
    before it stay applied, and the loader is done.

    Why it is faster:

    * It decodes straight to the model values that ``CoordinatorState.apply_*`` take (the very
      functions ``replay`` ends in), without building the generated record classes first. The
      hot record types (keys, current and target assignments, members, group and target
      metadata) have specialised decoders (below) that handle the canonical encoding of the
      current version and hand anything else (another version, tagged fields, a null, a bad
      length...) to the generic decoder, which decodes it or raises the right error.
    * The bytes of our own log repeat a lot: a key is written again and again, a target is
      rewritten unchanged at every epoch, a current assignment changes its epochs but seldom
      its items. So the decoded key, the target, the item sets of a current assignment and a
      member's assignors are cached per distinct bytes for the life of the loader (equal bytes
      decode to equal values; the cached values are immutable), and the state handlers skip
      the index updates when a member's item set did not change.
    * Inside ``with``, the cyclic garbage collector is paused (see :func:`_gc_pause`).
    """

    def __init__(self, state: CoordinatorState, on_unknown: OnUnknown | None = None) -> None:
        loader = _Loader(state, on_unknown)
        self.stats = loader.stats
        consumer = loader.consume()
        next(consumer)
        self.add: Callable[[Sequence[tuple[bytes, bytes | None]]], None] = consumer.send

    def __enter__(self) -> BulkLoader:
        _gc_pause()
        return self

    def __exit__(self, *exc: object) -> None:
        _gc_resume()


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


def _gc_pause() -> None:
    """Pause the cyclic garbage collector while a load builds its state: the state is millions
    of new, long-lived objects, and the collections they trigger (each older generation's
    scanning every object built so far) cost about a fifth of a load. Loads in several threads
    share one pause; the collector runs again (if it ran before) when the last one ends
    (:func:`_gc_resume`). Reference counting goes on: only cyclic garbage waits."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1


def _gc_resume() -> None:
    global _gc_pausers
    with _gc_lock:
        _gc_pausers -= 1
        if _gc_pausers == 0 and _gc_was_enabled:
            # Everything built during the pause is still in the youngest generation, and the
            # first allocation after gc.enable() would scan it all (some 6 % of a load).
            # freeze() + unfreeze() moves every object to the oldest generation without scanning
            # it (and resets the young count): the next full collection, which would scan the
            # state anyway, is the first to see it.
            if gc.get_freeze_count() == 0:  # (never unfreeze what someone else froze)
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _fast_constructor(cls: type, names: tuple[str, ...]) -> Callable[..., Any]:
    """A constructor of the frozen, slotted dataclass ``cls`` taking its fields positionally,
    about 3x faster than its ``__init__`` (which sets each field through object.__setattr__):
    it sets the slots directly (the object is the same). Falls back to ``cls`` itself unless
    ``cls`` has exactly the fields ``names``, in slots, and no __post_init__."""
    slots = [getattr(cls, name, None) for name in names]
    if (
        tuple(f.name for f in fields(cls)) != names
        or hasattr(cls, "__post_init__")
        or not all(type(slot).__name__ == "member_descriptor" for slot in slots)
    ):
        return cls
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    args = ", ".join(f"a{i}" for i in range(len(names)))
    lines = [f"def make({args}):", "    x = new(cls)"]
    for i, slot in enumerate(slots):
        namespace[f"s{i}"] = slot.__set__  # type: ignore[union-attr]
        lines.append(f"    s{i}(x, a{i})")
    lines.append("    return x")
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from the field names above
    make: Callable[..., Any] = namespace["make"]
    return make


_new_current = _fast_constructor(CurrentAssignment, (
    "epoch", "previous_epoch", "state", "assigned", "revoking", "metadata_version", "metadata_bytes",
    "tokens"))
_new_target = _fast_constructor(TargetMember, ("items", "metadata_version", "metadata_bytes"))
_new_member = _fast_constructor(MemberMetadata, (
    "member_id", "instance_id", "worker_url", "client_id", "client_host", "rebalance_timeout_ms",
    "assignors", "classic"))
_new_tuple = tuple.__new__


# The specialised decoders read the layout of these versions; a schema change that alters it
# turns them off (the generic decoder then does all the work) instead of misreading.
def _layout(cls: type) -> tuple[Any, ...]:
    out: list[Any] = [cls.__flexible__]  # type: ignore[attr-defined]
    for f in fields(cls):
        if f.metadata.get("tag") is not None:
            out.append(("tagged", f.name))
            continue
        inner = get_args(f.type)
        if inner and is_dataclass(inner[0]):
            out.append((f.name, _layout(inner[0])))
        else:
            name = f.type.__name__ if isinstance(f.type, type) else str(f.type)
            out.append((f.name, f.metadata.get("kafka_type"), name))
    return tuple(out)


_TASK = (True, ("connector", "string", "str"), ("task", "int32", "int"))
_ITEMS = (("connectors", "string", "tuple[str, ...]"), ("tasks", _TASK))
_EXPECTED = {
    (1, 0): (True, ("epoch", "int32", "int"), ("tagged", "fencing_token_ceiling")),
    (3, 0): (
        True,
        ("instance_id", "string", "str | None"),
        ("worker_url", "string", "str | None"),
        ("client_id", "string", "str"),
        ("client_host", "string", "str"),
        ("rebalance_timeout_ms", "int32", "int"),
        ("client_assignors", (
            True,
            ("name", "string", "str"),
            ("minimum_version", "int16", "int"),
            ("maximum_version", "int16", "int"),
            ("reason", "int8", "int"),
            ("metadata_version", "int16", "int"),
            ("metadata_bytes", "bytes", "bytes"),
        )),
        ("tagged", "classic_session_timeout_ms"),
        ("tagged", "classic_protocols"),
    ),
    (4, 0): (True, *_ITEMS, ("metadata_version", "int16", "int"), ("metadata_bytes", "bytes", "bytes")),
    (5, 0): (
        True,
        ("assignment_epoch", "int32", "int"),
        ("error", "int8", "int"),
        ("assignor_state", "bytes", "bytes"),
        ("scheduled_rebalance_at_ms", "int64", "int"),
        ("tagged", "kept_for"),  # (decoded by the generic path when present)
    ),
    (6, 0): (
        True,
        ("member_epoch", "int32", "int"),
        ("previous_member_epoch", "int32", "int"),
        ("state", "int8", "int"),
        *_ITEMS,
        ("revoking_connectors", "string", "tuple[str, ...]"),
        ("revoking_tasks", _TASK),
        ("metadata_version", "int16", "int"),
        ("metadata_bytes", "bytes", "bytes"),
        ("tagged", "fencing_tokens"),
    ),
}
_FAST_VALUES = frozenset(
    kv for kv, layout in _EXPECTED.items()
    if kv in RECORD_VALUES and _layout(RECORD_VALUES[kv]) == layout
)
_KIND = {  # key class -> the kind the loader dispatches on
    GroupMetadataKey: 1,
    GroupConnectorsKey: 2,
    GroupMemberKey: 3,
    TargetAssignmentMemberKey: 4,
    TargetAssignmentMetadataKey: 5,
    CurrentMemberAssignmentKey: 6,
    GroupConfigurationKey: 7,
    ConnectorOffsetKey: 8,
    ConnectorTaskConfigsKey: 10,
}
_GROUP_KEY = (False, ("group_id", "string", "str"))
_MEMBER_KEY = (*_GROUP_KEY, ("member_id", "string", "str"))
_FAST_KEYS: dict[tuple[int, int], tuple[int, bool]] = {  # (type, version) -> (kind, has member id)
    kv: (_KIND[cls], _layout(cls) == _MEMBER_KEY)
    for kv, cls in RECORD_KEYS.items()
    if cls in _KIND and _layout(cls) in (_GROUP_KEY, _MEMBER_KEY)
}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_TARGET_META = struct.Struct(">hib")  # value version, assignment epoch, error
_I64 = struct.Struct(">q")
_TASK_TOKEN = struct.Struct(">iq")  # an ItemToken's task and token
_CURRENT_HEAD = struct.Struct(">hiib")  # value version, member epoch, previous epoch, state
_CURRENT_HEAD_SIZE = _CURRENT_HEAD.size  # 11: the rest is cached per distinct bytes
_ASSIGNOR_FIXED = struct.Struct(">hhbh")  # minimum, maximum version, reason, metadata version
_STATES = {int(s): s for s in MemberState}
_UNKNOWN_STATE = MemberState.UNREVOKED_ITEMS  # as records.current_from


class _Slow(Exception):
    """A specialised decoder met what it does not handle: decode the generic way."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint at ``pos`` (its first byte already known to be >= 0x80)."""
    value, size = read_unsigned_varint(data, pos)
    return value, pos + size


def _items(data: bytes, pos: int) -> tuple[frozenset[Item], int]:
    """A ``[]string`` of connectors then a ``[]TaskId`` (compact arrays), as one set of items
    (as items_from_wire builds it); and the position after them."""
    if data[pos] == 1 and data[pos + 1] == 1:  # both empty (a member revoking nothing)
        return EMPTY, pos + 2
    end = len(data)
    n = data[pos]
    pos += 1
    if n >= 0x80:
        n, pos = _varint(data, pos - 1)
    if n == 0:
        raise _Slow  # null
    out = []
    append = out.append
    for _ in range(n - 1):
        size = data[pos]
        pos += 1
        if size >= 0x80:
            size, pos = _varint(data, pos - 1)
        stop = pos + size - 1
        if size == 0 or stop > end:
            raise _Slow
        append(_new_tuple(Item, (data[pos:stop].decode(), CONNECTOR)))
        pos = stop
    n = data[pos]
    pos += 1
    if n >= 0x80:
        n, pos = _varint(data, pos - 1)
    if n == 0:
        raise _Slow
    unpack_i32 = _I32.unpack_from
    for _ in range(n - 1):
        size = data[pos]
        pos += 1
        if size >= 0x80:
            size, pos = _varint(data, pos - 1)
        stop = pos + size - 1
        if size == 0 or stop > end:
            raise _Slow
        connector = data[pos:stop].decode()
        (task,) = unpack_i32(data, stop)
        if data[stop + 4]:
            raise _Slow  # tagged fields in a TaskId
        pos = stop + 5
        append(_new_tuple(Item, (connector, task)))
    return frozenset(out), pos


def _bytes_end(data: bytes, pos: int) -> tuple[bytes, int]:
    """Compact (non-null) bytes at ``pos`` that must be followed by the value's empty tagged
    fields and the end of the value."""
    size = data[pos]
    pos += 1
    if size >= 0x80:
        size, pos = _varint(data, pos - 1)
    stop = pos + size - 1
    if size == 0 or stop + 1 != len(data) or data[stop]:
        raise _Slow  # null, wrong length, tagged fields
    return data[pos:stop], stop


def _bytes_tokens_end(data: bytes, pos: int) -> tuple[bytes, dict[Item, int]]:
    """Compact (non-null) bytes at ``pos``, then the value's tagged fields: none, or only tag 0,
    the fencing tokens (a compact ``[]ItemToken``), up to the end of the value."""
    size = data[pos]
    pos += 1
    if size >= 0x80:
        size, pos = _varint(data, pos - 1)
    stop = pos + size - 1
    end = len(data)
    if size == 0 or stop >= end:
        raise _Slow
    metadata = data[pos:stop]
    if not data[stop]:
        if stop + 1 != end:
            raise _Slow
        return metadata, {}
    if data[stop] != 1 or data[stop + 1] != 0:
        raise _Slow  # another tag
    pos = stop + 2
    size = data[pos]
    pos += 1
    if size >= 0x80:
        size, pos = _varint(data, pos - 1)
    if pos + size != end:
        raise _Slow
    n = data[pos]
    pos += 1
    if n >= 0x80:
        n, pos = _varint(data, pos - 1)
    if n == 0:
        raise _Slow  # null
    tokens = {}
    unpack = _TASK_TOKEN.unpack_from
    for _ in range(n - 1):
        size = data[pos]
        pos += 1
        if size >= 0x80:
            size, pos = _varint(data, pos - 1)
        stop = pos + size - 1
        if size == 0 or stop + 13 > end or data[stop + 12]:
            raise _Slow  # null, overrun, tagged fields in an ItemToken
        task, token = unpack(data, stop)
        tokens[_new_tuple(Item, (data[pos:stop].decode(), task))] = token
        pos = stop + 13
    if pos != end:
        raise _Slow
    return metadata, tokens


def _string(data: bytes, pos: int) -> tuple[str | None, int]:
    """A compact, nullable string (None: null)."""
    size = data[pos]
    pos += 1
    if size >= 0x80:
        size, pos = _varint(data, pos - 1)
    if size == 0:
        return None, pos
    stop = pos + size - 1
    if stop > len(data):
        raise _Slow
    return data[pos:stop].decode(), stop


def _assignors(data: bytes, pos: int) -> tuple[AssignorSpec, ...]:
    """A member's ``[]Assignor`` at ``pos``, up to the end of the value."""
    n = data[pos]
    pos += 1
    if n >= 0x80:
        n, pos = _varint(data, pos - 1)
    if n == 0:
        raise _Slow
    out = []
    for _ in range(n - 1):
        name, pos = _string(data, pos)
        if name is None:
            raise _Slow
        minimum, maximum, reason, metadata_version = _ASSIGNOR_FIXED.unpack_from(data, pos)
        pos += _ASSIGNOR_FIXED.size
        size = data[pos]
        pos += 1
        if size >= 0x80:
            size, pos = _varint(data, pos - 1)
        stop = pos + size - 1
        if size == 0 or stop >= len(data) or data[stop]:
            raise _Slow  # null, overrun, tagged fields
        out.append(AssignorSpec(name, minimum, maximum, reason, metadata_version, data[pos:stop]))
        pos = stop + 1
    if pos + 1 != len(data) or data[pos]:
        raise _Slow
    return tuple(out)


class _Loader:
    __slots__ = (
        "state", "on_unknown", "stats", "keys", "member_ids", "group_ids_of", "group_ids", "currents",
        "targets", "epochs", "assignors",
    )

    def __init__(self, state: CoordinatorState, on_unknown: OnUnknown | None) -> None:
        self.state = state
        self.on_unknown = on_unknown
        # key bytes -> (kind, group id, member id or None); kind 0: an unknown type (then the error)
        self.keys: dict[bytes, tuple[int, Any, str | None]] = {}
        # key bytes after the header -> (group id, member id or None), for keys with and without
        # a member id
        self.member_ids: dict[bytes, tuple[str, str | None]] = {}
        self.group_ids_of: dict[bytes, tuple[str, str | None]] = {}
        self.group_ids: dict[str, str] = {}  # one string object per group id
        # current assignment value bytes after the head -> (assigned, revoking, owned, version,
        # bytes, tokens)
        self.currents: dict[bytes, tuple[frozenset[Item], frozenset[Item], frozenset[Item], int, bytes,
                                         dict[Item, int]]] = {}
        self.targets: dict[bytes, TargetMember] = {}  # target member value bytes -> its value
        self.epochs: dict[bytes, tuple[int, int]] = {}  # group metadata value -> (epoch, ceiling)
        self.assignors: dict[bytes, tuple[AssignorSpec, ...]] = {}  # member value tail -> assignors
        self.stats = LoadStats()

    # -- decoding (each caches what it decoded) -------------------------------------------------
    def key(self, key_bytes: bytes) -> tuple[int, Any, str | None]:
        info: tuple[int, Any, str | None] | None = None
        try:
            kind, has_member = _FAST_KEYS[_KEY_HEADER.unpack_from(key_bytes)]
            # A member's member, target and current keys differ only in their header.
            body = key_bytes[_KEY_HEADER.size:]
            cache = self.member_ids if has_member else self.group_ids_of
            ids = cache.get(body)
            if ids is None:
                ids = cache[body] = self._key_ids(body, has_member)
            info = (kind, ids[0], ids[1])
        except Exception:  # anything unusual: the generic decoder decides
            pass
        if info is None:
            try:
                key = decode_key(key_bytes)
            except UnknownRecordType as exc:
                info = (0, exc, None)
            else:
                kind_of = _KIND.get(type(key))
                if kind_of is None:
                    raise ReplayError(f"unknown record key type {type(key).__name__}")
                group_id = self.group_ids.setdefault(key.group_id, key.group_id)
                if kind_of == 8:  # (connector, partition) in the member id's place
                    info = (kind_of, group_id, (key.connector, key.partition))
                elif kind_of == 10:  # a connector's name in the member id's place
                    info = (kind_of, group_id, key.connector)
                else:
                    info = (kind_of, group_id, getattr(key, "member_id", None))
        self.keys[key_bytes] = info
        return info

    def _key_ids(self, body: bytes, has_member: bool) -> tuple[str, str | None]:
        """(group id, member id or None) of a key's body: one or two (legacy) strings."""
        (size,) = _I16.unpack_from(body)
        stop = 2 + size
        if size < 0 or stop > len(body):
            raise _Slow
        group_id = body[2:stop].decode()
        group_id = self.group_ids.setdefault(group_id, group_id)
        if not has_member:
            if stop != len(body):
                raise _Slow
            return group_id, None
        (size,) = _I16.unpack_from(body, stop)
        start = stop + 2
        stop = start + size
        if size < 0 or stop != len(body):
            raise _Slow
        return group_id, body[start:stop].decode()

    def current(self, value: bytes) -> tuple[CurrentAssignment, frozenset[Item]]:
        """A current assignment whose head (version, epochs, state) is not version 0 or whose
        rest is not cached yet."""
        try:
            version, epoch, previous, state = _CURRENT_HEAD.unpack_from(value)
            if version != 0 or (6, 0) not in _FAST_VALUES:
                raise _Slow
            assigned, pos = _items(value, _CURRENT_HEAD_SIZE)
            revoking, pos = _items(value, pos)
            (metadata_version,) = _I16.unpack_from(value, pos)
            metadata_bytes, tokens = _bytes_tokens_end(value, pos + 2)
        except Exception:
            c = rec.current_from(decode_value(6, value))
            return c, (c.assigned | c.revoking if c.revoking else c.assigned)
        owned = assigned | revoking if revoking else assigned
        self.currents[value[_CURRENT_HEAD_SIZE:]] = (
            assigned, revoking, owned, metadata_version, metadata_bytes, tokens)
        c = _new_current(epoch, previous, _STATES.get(state, _UNKNOWN_STATE), assigned, revoking,
                         metadata_version, metadata_bytes, tokens)
        return c, owned

    def target(self, value: bytes) -> TargetMember:
        try:
            if value[0] or value[1] or (4, 0) not in _FAST_VALUES:
                raise _Slow
            items, pos = _items(value, 2)
            (metadata_version,) = _I16.unpack_from(value, pos)
            metadata_bytes, _ = _bytes_end(value, pos + 2)
            t = _new_target(items, metadata_version, metadata_bytes)
        except Exception:
            return rec.target_from(decode_value(4, value))
        self.targets[value] = t
        return t

    def epoch(self, value: bytes) -> tuple[int, int]:
        """(group epoch, fencing token ceiling) of a group metadata value."""
        size = len(value)
        if size >= 7 and not value[0] and not value[1] and (1, 0) in _FAST_VALUES and (
            (size == 7 and not value[6])
            # the ceiling alone as its tagged field: one field, tag 0, 8 bytes
            or (size == 17 and value[6] == 1 and not value[7] and value[8] == 8)
        ):
            (epoch,) = _I32.unpack_from(value, 2)
            ceiling = _I64.unpack_from(value, 9)[0] if size == 17 else 0
            out = (epoch, ceiling)
        else:
            v = decode_value(1, value)
            out = (v.epoch, v.fencing_token_ceiling)
        self.epochs[value] = out
        return out

    def member(self, member_id: str, value: bytes) -> MemberMetadata:
        try:
            if value[0] or value[1] or (3, 0) not in _FAST_VALUES:
                raise _Slow
            instance_id, pos = _string(value, 2)
            worker_url, pos = _string(value, pos)
            client_id, pos = _string(value, pos)
            client_host, pos = _string(value, pos)
            if client_id is None or client_host is None:
                raise _Slow
            (timeout,) = _I32.unpack_from(value, pos)
            pos += 4
            tail = value[pos:]
            assignors = self.assignors.get(tail)
            if assignors is None:
                assignors = self.assignors[tail] = _assignors(value, pos)
        except Exception:
            return rec.member_from(member_id, decode_value(3, value))
        return _new_member(member_id, instance_id, worker_url, client_id, client_host, timeout,
                           assignors, None)

    @staticmethod
    def target_metadata(value: bytes) -> tuple[int, int, bytes, int, tuple[Any, ...]]:
        try:
            version, epoch, error = _TARGET_META.unpack_from(value)
            if version != 0 or (5, 0) not in _FAST_VALUES:
                raise _Slow
            pos = _TARGET_META.size
            size = value[pos]
            pos += 1
            if size >= 0x80:
                size, pos = _varint(value, pos - 1)
            stop = pos + size - 1
            if size == 0 or stop + 9 != len(value) or value[stop + 8]:
                raise _Slow
            (scheduled,) = _I64.unpack_from(value, stop)
            return epoch, error, value[pos:stop], scheduled, ()
        except Exception:
            v = decode_value(5, value)
            return (v.assignment_epoch, v.error, v.assignor_state, v.scheduled_rebalance_at_ms,
                    rec.kept_from(v.kept_for))

    # -- the loop ---------------------------------------------------------------------------------
    def consume(self) -> Generator[None, Sequence[tuple[bytes, bytes | None]], None]:
        """A generator that replays each batch sent to it (its locals live across batches)."""
        state = self.state
        keys = self.keys
        currents = self.currents
        targets = self.targets
        epochs = self.epochs
        apply_current = state.apply_current
        apply_target = state.apply_target_member
        apply_metadata = state.apply_group_metadata
        head = _CURRENT_HEAD.unpack_from
        states = _STATES
        unknown_state = _UNKNOWN_STATE
        new_current = _new_current
        stats = self.stats
        while True:
            batch = yield
            applied = 0
            try:
                for key, value in batch:
                    info = keys.get(key)
                    if info is None:
                        info = self.key(key)
                    kind, group_id, member_id = info
                    if kind == 6:
                        if value is None:
                            apply_current(group_id, member_id, None, EMPTY)
                        else:
                            hit = currents.get(value[_CURRENT_HEAD_SIZE:])
                            if hit is None:
                                c, owned = self.current(value)
                            else:
                                # the rest decoded before: the head is a fixed-width version
                                # 0 head (a cached rest follows only such heads)
                                version, epoch, previous, member_state = head(value)
                                if version != 0:
                                    c, owned = self.current(value)
                                else:
                                    owned = hit[2]
                                    c = new_current(
                                        epoch, previous, states.get(member_state, unknown_state),
                                        hit[0], hit[1], hit[3], hit[4], hit[5])
                            apply_current(group_id, member_id, c, owned)
                    elif kind == 4:
                        if value is None:
                            apply_target(group_id, member_id, None)
                        else:
                            t = targets.get(value)
                            apply_target(group_id, member_id, self.target(value) if t is None else t)
                    elif kind == 1:
                        if value is None:
                            apply_metadata(group_id, None)
                        else:
                            e = epochs.get(value)
                            apply_metadata(group_id, *(self.epoch(value) if e is None else e))
                    elif kind == 0:
                        stats.skipped += 1
                        if self.on_unknown is not None:
                            self.on_unknown(group_id)
                        continue
                    else:
                        self.other(kind, group_id, member_id, value)
                    applied += 1
            finally:
                stats.applied += applied
                stats.records = stats.applied + stats.skipped

    def other(self, kind: int, group_id: str, member_id: Any, value: bytes | None) -> None:
        state = self.state
        if kind == 3:
            state.apply_member(group_id, member_id, None if value is None else self.member(member_id, value))
        elif kind == 5:
            state.apply_target_metadata(group_id, None if value is None else self.target_metadata(value))
        elif kind == 2:
            if value is None:
                state.apply_connectors(group_id, 0, None)
            else:
                v = decode_value(2, value)
                state.apply_connectors(group_id, v.epoch, rec.connectors_from(v))
        elif kind == 8:
            connector, partition = member_id
            if value is None:
                state.apply_offset(group_id, connector, partition, None)
            else:
                v = decode_value(11, value)
                state.apply_offset(group_id, connector, partition, (v.incarnation, v.offset))
        elif kind == 10:
            state.apply_task_configs(group_id, member_id, None if value is None
                                     else rec.task_configs_from(decode_value(10, value)))
        else:  # 7
            configs = None if value is None else {c.name: c.value for c in decode_value(7, value).configs}
            state.apply_configuration(group_id, configs)
