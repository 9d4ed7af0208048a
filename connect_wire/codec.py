"""Encode and decode message bodies: the one codec both sides use.

Theory of operation
-------------------
Every message, record key and record value is a kio-style entity (a frozen dataclass whose
fields carry ``kafka_type``/``tag`` metadata; see ``tools/codegen.py``). kio serialises them:

* **Decoding** walks the entity's schema (its dataclass field metadata) in Python and reads
  every value with kio's native (Rust) *primitive* readers. kio's whole-entity native reader is
  not used for untrusted bytes, for three reasons found by the tests: it raises ``KeyError`` on
  a tagged field it does not know (Kafka's rule, and docs/protocol.md's, is to skip it, so that a
  newer peer never breaks an older one); it returns None for a null array in a non-nullable
  field; and it reserves memory for a declared array length before reading any item, so a
  22-byte frame declaring 2**32-1 items aborts the whole process. The walker skips unknown
  tags, rejects nulls where the schema forbids them, and checks every declared array length
  against the bytes left (each item takes at least one byte) before anything is read. The
  same rules are compiled into straight-line code per class (``connect_wire.fastreader``),
  which ``decode`` uses when it can be built; tests check it agrees with the walker.
* **Encoding** uses a writer compiled once per entity class from the same field metadata
  (``connect_wire.fastwriter``) when one can be built, else kio's generic ``entity_writer``.
  Both produce identical bytes; see the tests and the benchmark in ``bench/``.

Any malformed input raises :class:`DecodeError` (and nothing else); the caller answers with
CORRUPT_MESSAGE / INVALID_REQUEST or closes the connection.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import MISSING, Field, fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Any, TypeVar, get_args, get_origin

from kio.serial import entity_reader, entity_writer
from kio.serial._parse import get_reader as _primitive_reader
from kio.serial.readers import (
    compact_array_reader,
    legacy_array_reader,
    read_compact_array_length,
    read_int8,
    read_legacy_array_length,
    read_unsigned_varint,
)

__all__ = ["DecodeError", "decode", "decode_trusted", "encode", "encode_into"]

T = TypeVar("T")

Reader = Callable[[Any, int], tuple[Any, int]]


class DecodeError(ValueError):
    """The bytes are not a valid encoding of the expected entity."""


# -- encoding ---------------------------------------------------------------------------------


@cache
def _writer(cls: type) -> Callable[[Any, Any], None]:
    from connect_wire import fastwriter  # local: avoids an import cycle

    return fastwriter.compile_writer(cls) or entity_writer(cls)


def encode(entity: Any) -> bytes:
    """The body bytes of ``entity`` (no size prefix, no header)."""
    buffer = io.BytesIO()
    _writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def encode_into(buffer: io.BytesIO, entity: Any) -> None:
    """Append the body bytes of ``entity`` to ``buffer``."""
    _writer(type(entity))(buffer, entity)


def kio_encode(entity: Any) -> bytes:
    """Encode with kio's generic writer only (reference path, used by tests and bench)."""
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


# -- decoding ---------------------------------------------------------------------------------


def decode(cls: type[T], data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[T, int]:
    """Decode one ``cls`` from ``data`` at ``offset``; return it and the offset after it.

    Unknown tagged fields are skipped. Raises :class:`DecodeError` on malformed input.
    """
    if not isinstance(data, bytes):
        data = bytes(data)  # kio's native readers refuse writable buffers
    if offset < 0 or offset > len(data):
        raise DecodeError(f"cannot decode {cls.__name__}: offset {offset} outside the data")
    try:
        return (_compiled(cls) or _walker(cls))(data, offset)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"cannot decode {cls.__name__}: {exc!r}") from None


@cache
def _compiled(cls: type) -> Callable[[Any, int], tuple[Any, int]] | None:
    """The compiled reader of ``cls`` (``connect_wire.fastreader``: same rules as the walker,
    straight-line code), or None when it cannot be built (the walker is used)."""
    from connect_wire import fastreader  # local: mirrors _writer

    return fastreader.compile_reader(cls)


def decode_trusted(cls: type[T], data: bytes, offset: int = 0) -> tuple[T, int]:
    """Decode bytes this program wrote itself and a checksum vouched for (the coordinator's own
    CRC-checked log): kio's native whole-entity reader, about 5x faster than the walker, which
    still runs when the native reader meets an unknown tagged field (a newer version's record).
    Never use this for bytes from the network."""
    try:
        value, size = entity_reader(cls)(data, offset)
        return value, offset + size
    except KeyError:
        return decode(cls, data, offset)
    except Exception as exc:
        raise DecodeError(f"cannot decode {cls.__name__}: {exc!r}") from None


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) is UnionType:
        args = [a for a in get_args(tp) if a is not NoneType]
        return args[0], True
    return tp, False


def _field_reader(f: Field[Any], flexible: bool, tagged: bool) -> Reader:
    tp, optional = _unwrap_optional(f.type)
    if tagged:
        optional = False  # a tagged field's presence is its tag (kio's rule as well)
    kafka_type = f.metadata.get("kafka_type")
    if get_origin(tp) is tuple:
        (inner,) = get_args(tp)[:1]
        if is_dataclass(inner):
            return _entity_array_reader(inner, flexible, optional)
        item = _primitive_reader(kafka_type, flexible, False)
        array = compact_array_reader(item) if flexible else legacy_array_reader(item)
        return _bounded_array(array, flexible, optional, f.name)
    if is_dataclass(tp):
        return _nullable_entity(_walker(tp)) if optional else _sized(_walker(tp))
    return _primitive_reader(kafka_type, flexible, optional)


def _sized(walk: Callable[[Any, int], tuple[Any, int]]) -> Reader:
    """Adapt a walker (which returns the end offset) to a reader (which returns the size)."""

    def read(data: Any, offset: int) -> tuple[Any, int]:
        value, end = walk(data, offset)
        return value, end - offset

    return read


def _bounded_array(array: Reader, flexible: bool, optional: bool, name: str) -> Reader:
    """kio's native array reader, called only once the declared length is known to fit."""
    read_length = read_compact_array_length if flexible else read_legacy_array_length

    def read(data: Any, offset: int) -> tuple[Any, int]:
        length, size = read_length(data, offset)
        if length is None or length < 0:
            if not optional:
                raise DecodeError(f"field {name} is null but not nullable")
            return array(data, offset)
        if length > len(data) - offset - size:  # each item takes at least one byte
            raise DecodeError(f"field {name} declares {length} items, more than the message holds")
        return array(data, offset)

    return read


def _nullable_entity(walk: Callable[[Any, int], tuple[Any, int]]) -> Reader:
    def read(data: Any, offset: int) -> tuple[Any, int]:
        marker, size = read_int8(data, offset)
        if marker < 0:
            return None, size
        value, end = walk(data, offset + size)
        return value, end - offset

    return read


def _entity_array_reader(cls: type, flexible: bool, optional: bool) -> Reader:
    walk = _walker(cls)
    read_length = read_compact_array_length if flexible else read_legacy_array_length

    def read(data: Any, offset: int) -> tuple[Any, int]:
        length, size = read_length(data, offset)
        if length is None or length < 0:
            if not optional:
                raise DecodeError(f"array of {cls.__name__} is null but not nullable")
            return None, size
        position = offset + size
        if length > len(data) - position:  # each item takes at least one byte
            raise DecodeError(f"array of {length} {cls.__name__} exceeds the message")
        items = []
        for _ in range(length):
            item, position = walk(data, position)
            items.append(item)
        return tuple(items), position - offset

    return read


@cache
def _walker(cls: type) -> Callable[[Any, int], tuple[Any, int]]:
    """A pure-Python decoder of ``cls`` that skips unknown tagged fields.

    Returns (value, end offset) — note: the end offset, not the size.
    """
    flexible: bool = cls.__flexible__  # type: ignore[attr-defined]
    plain: list[tuple[str, Reader]] = []
    tagged: dict[int, tuple[str, Reader]] = {}
    defaults: dict[str, Any] = {}
    for f in fields(cls):
        tag = f.metadata.get("tag")
        if tag is None:
            plain.append((f.name, _field_reader(f, flexible, False)))
        else:
            tagged[int(tag)] = (f.name, _field_reader(f, flexible, True))
            if f.default is not MISSING:
                defaults[f.name] = f.default

    def walk(data: Any, offset: int) -> tuple[Any, int]:
        values: dict[str, Any] = dict(defaults)
        for name, reader in plain:
            values[name], size = reader(data, offset)
            offset += size
        if flexible:
            count, size = read_unsigned_varint(data, offset)
            offset += size
            for _ in range(count):
                tag, size = read_unsigned_varint(data, offset)
                offset += size
                length, size = read_unsigned_varint(data, offset)
                offset += size
                end = offset + length
                if end > len(data):
                    raise DecodeError(f"tagged field {tag} of {cls.__name__} is truncated")
                known = tagged.get(tag)
                if known is not None:
                    name, reader = known
                    values[name], _ = reader(bytes(data[offset:end]), 0)
                offset = end
        return cls(**values), offset

    return walk
