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

import struct
from typing import Any

from connect_wire import codec
from connect_wire.records import RECORD_KEYS, RECORD_VALUES
from coordinator.group.records import Record

__all__ = [
    "CorruptRecord",
    "RecordSerdeError",
    "UnknownRecordType",
    "UnsupportedValueVersion",
    "decode_key",
    "decode_record",
    "encode_key",
    "encode_record",
    "encode_value",
    "record_type_of",
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


def decode_record(key_bytes: bytes, value_bytes: bytes | None) -> Record:
    """The :class:`Record` stored as ``key_bytes`` / ``value_bytes`` (None: a tombstone)."""
    record_type, _ = record_type_of(key_bytes)
    key = decode_key(key_bytes)
    if value_bytes is None:
        return Record(key, None)
    if len(value_bytes) < _VALUE_HEADER.size:
        raise CorruptRecord(f"record type {record_type}: value of {len(value_bytes)} bytes has no version")
    (version,) = _VALUE_HEADER.unpack_from(value_bytes)
    value_cls = RECORD_VALUES.get((record_type, version))
    if value_cls is None:
        raise UnsupportedValueVersion(record_type, version)
    value = _decode_exact(value_cls, value_bytes, _VALUE_HEADER.size, f"record type {record_type} value")
    return Record(key, value)
