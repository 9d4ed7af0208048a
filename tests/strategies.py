"""Hypothesis strategies that build any kio-style entity from its dataclass field metadata.

``entities(cls)`` works for our generated classes (``connect_wire.messages``/``records``) and for
kio's own classes: each field's value is drawn from its ``kafka_type`` (fixed-width integers over
their whole range, bool, unicode strings including non-BMP characters and the empty string,
bytes, uuid, kio's timedelta/datetime/error-code types), ``X | None`` fields are sometimes None,
``tuple[...]`` fields are empty, small or (rarely, and only at the top level so that the total
size stays bounded) a few hundred items long, and nested dataclasses recurse.

Strings and byte strings are occasionally long (more than 127 encoded bytes) so that two-byte
length varints are exercised as well.
"""

from __future__ import annotations

import datetime
from dataclasses import fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from hypothesis import strategies as st

__all__ = ["entities", "kafka_value", "text_values", "binary_values"]

INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}

# Unicode without surrogates (not encodable as UTF-8); includes astral (non-BMP) code points.
_ALPHABET = st.characters(codec="utf-8")
_ASTRAL = st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF, codec="utf-8")

LARGE_MIN, LARGE_MAX = 100, 300


def _weighted(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int):
    """``common`` most of the time, ``rare`` about once in ``odds`` draws."""
    # The rare branch is the largest draw, so that Hypothesis shrinks towards the common one.
    return st.integers(0, odds - 1).flatmap(lambda n: rare if n == odds - 1 else common)


def text_values(lean: bool = False) -> st.SearchStrategy[str]:
    short = st.one_of(
        st.just(""),
        st.text(_ALPHABET, max_size=12),
        st.text(_ASTRAL, min_size=1, max_size=4),
    )
    if lean:
        return short
    long = st.text(_ALPHABET, min_size=64, max_size=200)  # > 127 UTF-8 bytes most of the time
    return _weighted(short, long, 8)


def binary_values(lean: bool = False) -> st.SearchStrategy[bytes]:
    if lean:
        return st.binary(max_size=16)
    return _weighted(st.binary(max_size=16), st.binary(min_size=128, max_size=600), 8)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _error_codes() -> st.SearchStrategy[Any]:
    from kio.schema.errors import ErrorCode

    return st.sampled_from(list(ErrorCode))


def kafka_value(kafka_type: str, lean: bool = False) -> st.SearchStrategy[Any]:
    """A non-null value of one primitive ``kafka_type`` (``lean``: no long strings/bytes)."""
    if kafka_type in INT_RANGES:
        low, high = INT_RANGES[kafka_type]
        return st.integers(low, high)
    match kafka_type:
        case "bool":
            return st.booleans()
        case "string":
            return text_values(lean)
        case "bytes" | "records":
            return binary_values(lean)
        case "float64":
            return st.floats(allow_nan=False, allow_infinity=False)
        case "uuid":
            # kio reads the all-zero uuid as None: never draw it for a present value.
            return st.uuids().filter(lambda u: u.int != 0)
        case "error_code":
            return _error_codes()
        case "timedelta_i32":
            return st.integers(-(2**31), 2**31 - 1).map(
                lambda ms: datetime.timedelta(milliseconds=ms)
            )
        case "timedelta_i64":
            return st.integers(-(2**40), 2**40).map(lambda ms: datetime.timedelta(milliseconds=ms))
        case "datetime_i64":
            return st.integers(0, 2**41).map(
                lambda ms: _EPOCH + datetime.timedelta(milliseconds=ms)
            )
    raise NotImplementedError(f"no strategy for kafka_type {kafka_type!r}")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (UnionType, Union):
        args = [a for a in get_args(tp) if a is not NoneType]
        if len(args) != 1:
            raise NotImplementedError(f"unsupported union {tp!r}")
        return args[0], len(args) != len(get_args(tp))
    return tp, False


@cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return get_type_hints(cls)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        return {f.name: f.type for f in fields(cls)}


def _tuples(
    item: st.SearchStrategy[Any], lean_item: st.SearchStrategy[Any] | None, lean: bool
) -> st.SearchStrategy[tuple[Any, ...]]:
    max_small = 1 if lean else 4
    small = st.one_of(st.just(()), st.lists(item, min_size=1, max_size=max_small).map(tuple))
    if lean_item is None:
        return small
    large = st.lists(lean_item, min_size=LARGE_MIN, max_size=LARGE_MAX).map(tuple)
    return _weighted(small, large, 20)


def _field_strategy(cls: type, f: Any, depth: int, lean: bool) -> st.SearchStrategy[Any]:
    tp, nullable = _unwrap_optional(_hints(cls)[f.name])
    kafka_type = f.metadata.get("kafka_type")
    if get_origin(tp) is tuple:
        inner = get_args(tp)[0]
        if is_dataclass(inner):
            item = _entities(inner, depth + 1, lean)
            lean_item = _entities(inner, depth + 1, True)
        else:
            if kafka_type is None:
                raise NotImplementedError(f"{cls.__name__}.{f.name}: array without kafka_type")
            item = kafka_value(kafka_type, lean)
            lean_item = kafka_value(kafka_type, True)
        # Large arrays only at the top level, made of lean items: keeps the total size bounded.
        strategy = _tuples(item, lean_item if depth == 0 and not lean else None, lean)
    elif is_dataclass(tp):
        strategy = _entities(tp, depth + 1, lean)
    else:
        if kafka_type is None:
            raise NotImplementedError(f"{cls.__name__}.{f.name}: no kafka_type")
        strategy = kafka_value(kafka_type, lean)
    if nullable:
        return st.one_of(st.none(), strategy)
    return strategy


@cache
def _entities(cls: type, depth: int, lean: bool) -> st.SearchStrategy[Any]:
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass entity")
    kwargs = {f.name: _field_strategy(cls, f, depth, lean) for f in fields(cls) if f.init}
    return st.builds(cls, **kwargs)


def entities(cls: type) -> st.SearchStrategy[Any]:
    """Any valid value of the entity class ``cls`` (generated or kio's own)."""
    return _entities(cls, 0, False)
