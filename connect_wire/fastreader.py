"""Specialised readers: one straight-line Python function per entity class.

The counterpart of :mod:`connect_wire.fastwriter` for untrusted input. ``codec``'s schema walker
calls a reader closure per field and builds every entity from a dict of values; on the hot path
(a steady heartbeat) that was a fifth of the daemon's time. ``compile_reader`` reads the same
dataclass field metadata once and generates a function that reads the fields in order: runs
of fixed-width fields in one precompiled ``struct.Struct.unpack_from``, varints and compact
strings inline, nested entities and arrays through their own compiled readers.

It keeps every rule of the walker (see ``codec``): known tagged fields are read from their
own bytes (their default when absent), unknown ones are skipped at any depth, a null is
refused where the schema does not allow one, and every declared array or string length is
checked against the bytes left before anything is allocated. Anything it
does not know how to compile (legacy encodings, types other than the ones our schemas use)
makes ``compile_reader`` return None and the walker is used. The tests check that both readers
agree on every message and record, on valid and on random or mutated input.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from typing import Any, get_args, get_origin

from connect_wire.fastwriter import FIXED as _WRITER_FIXED
from connect_wire.fastwriter import _optional

# The writer's struct codes, except bool: read as an unsigned byte, then checked to be 0 or 1
# (kio refuses other bytes too; struct's "?" would read 2 as True).
FIXED = {**_WRITER_FIXED, "bool": "B"}

Read = Callable[[bytes, int], tuple[Any, int]]


class FastDecodeError(ValueError):
    """Malformed input (``codec`` turns it into its DecodeError)."""


def uvarint(data: bytes, offset: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (a uint32, as Kafka's readers): (value, end)."""
    result = 0
    shift = 0
    while True:
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, offset
        shift += 7
        if shift > 28:
            raise FastDecodeError("varint longer than 5 bytes")


def _length(var: str, nullable: bool, what: str, indent: str, lines: list[str]) -> None:
    """Read a compact length (N+1, 0 = null) into ``var``; -1 means null."""
    lines.append(f"{indent}{var} = data[o]")
    lines.append(f"{indent}if {var} < 0x80:")
    lines.append(f"{indent}    o += 1")
    lines.append(f"{indent}else:")
    lines.append(f"{indent}    {var}, o = uvarint(data, o)")
    lines.append(f"{indent}{var} -= 1")
    if not nullable:
        lines.append(f"{indent}if {var} < 0:")
        lines.append(f"{indent}    raise FastDecodeError({what + ' is null but not nullable'!r})")


def _string(var: str, kafka_type: str, nullable: bool, what: str, indent: str,
            lines: list[str]) -> None:
    _length("n", nullable, what, indent, lines)
    body = "data[o:e].decode()" if kafka_type == "string" else "data[o:e]"
    if nullable:
        lines.append(f"{indent}if n < 0:")
        lines.append(f"{indent}    {var} = None")
        lines.append(f"{indent}else:")
        indent += "    "
    lines.append(f"{indent}e = o + n")
    lines.append(f"{indent}if e > len(data):")
    lines.append(f"{indent}    raise FastDecodeError({what + ' is truncated'!r})")
    lines.append(f"{indent}{var} = {body}")
    lines.append(f"{indent}o = e")


@cache
def compile_reader(cls: type) -> Read | None:
    """A reader ``(data, offset) -> (entity, end offset)`` for ``cls``, or None (use the walker)."""
    if not getattr(cls, "__flexible__", False):
        return None  # legacy encodings: the walker
    namespace: dict[str, Any] = {"uvarint": uvarint, "FastDecodeError": FastDecodeError,
                                 "cls": cls, "_BOOL": (False, True)}  # a bool byte > 1: IndexError
    plain = [f for f in fields(cls) if "tag" not in f.metadata]
    tagged = [f for f in fields(cls) if "tag" in f.metadata]
    lines = ["def read(data, o):"]
    if not _emit_fields(cls, plain, namespace, lines, "body"):
        return None
    # Tagged fields (KIP-482), as the walker reads them: a known tag's value is read from its
    # own bytes (what it declares), its default when absent, the last one kept when repeated;
    # an unknown tag (a newer peer's) is skipped.
    known: list[tuple[int, str]] = []
    for f in tagged:
        if f.default is MISSING:
            return None  # (the walker then fails on it too: no default to fall back on)
        tag = int(f.metadata["tag"])
        sub = [f"def read_tag_{tag}(data, o):"]
        if not _emit_fields(cls, [f], namespace, sub, f"tag{tag}"):
            return None
        sub.append(f"    return v_{f.name}, o")
        exec(compile("\n".join(sub) + "\n", f"<fastreader {cls.__qualname__} tag {tag}>", "exec"),
             namespace)
        namespace[f"_d_{f.name}"] = f.default
        lines.append(f"    v_{f.name} = _d_{f.name}")
        known.append((tag, f.name))
    lines.append("    count = data[o]")
    lines.append("    if count < 0x80:")
    lines.append("        o += 1")
    lines.append("    else:")
    lines.append("        count, o = uvarint(data, o)")
    lines.append("    for _ in range(count):")
    lines.append("        tag, o = uvarint(data, o)")
    lines.append("        size, o = uvarint(data, o)")
    lines.append("        e = o + size")
    lines.append("        if e > len(data):")
    lines.append(f"            raise FastDecodeError('a tagged field of {cls.__name__} is truncated')")
    for i, (tag, name) in enumerate(known):
        lines.append(f"        {'if' if i == 0 else 'elif'} tag == {tag}:")
        lines.append(f"            v_{name}, _ = read_tag_{tag}(bytes(data[o:e]), 0)")
    lines.append("        o = e")
    names = [f.name for f in plain] + [name for _, name in known]
    slots = [cls.__dict__.get(name) for name in names]
    if all(type(slot).__name__ == "member_descriptor" for slot in slots):
        # A frozen dataclass's __init__ sets each field through object.__setattr__; the slots'
        # own descriptors give the same object in about a third of the time (no __post_init__
        # in generated classes; equality, hash and repr only read the fields).
        namespace["_new"] = object.__new__
        lines.append("    r = _new(cls)")
        for name, slot in zip(names, slots, strict=True):
            namespace[f"_set_{name}"] = slot.__set__  # type: ignore[union-attr]
            lines.append(f"    _set_{name}(r, v_{name})")
        lines.append("    return r, o")
    else:
        args = ", ".join(f"{name}=v_{name}" for name in names)
        lines.append(f"    return cls({args}), o")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<fastreader {cls.__module__}.{cls.__qualname__}>", "exec"), namespace)
    read = namespace["read"]
    read.__doc__ = f"Specialised reader of {cls.__qualname__}.\n\n{source}"
    return read  # type: ignore[no-any-return]


def _emit_fields(cls: type, fields_: list[Any], namespace: dict[str, Any], lines: list[str],
                 prefix: str) -> bool:
    """Append the code reading ``fields_`` (in order) into ``v_<name>`` variables to ``lines``;
    False when one of them is of a kind left to the walker. ``prefix`` keeps the names this adds
    to ``namespace`` apart."""
    pending: list[tuple[str, str]] = []  # (struct code, variable)
    pending_types: list[tuple[str, str]] = []  # (kafka type, variable)
    counter = 0

    def flush() -> None:
        nonlocal counter
        if not pending:
            return
        counter += 1
        packer = struct.Struct(">" + "".join(code for code, _ in pending))
        namespace[f"_s_{prefix}_{counter}"] = packer
        targets = ", ".join(var for _, var in pending)
        lines.append(f"    ({targets},) = _s_{prefix}_{counter}.unpack_from(data, o)")
        lines.append(f"    o += {packer.size}")
        for kafka_type, var in pending_types:
            if kafka_type == "bool":
                lines.append(f"    {var} = _BOOL[{var}]")
        pending.clear()
        pending_types.clear()

    for f in fields_:
        tp, nullable = _optional(f.type)
        if "tag" in f.metadata:
            nullable = False  # a tagged field's presence is its tag (the walker's rule)
        kafka_type = f.metadata.get("kafka_type")
        var = f"v_{f.name}"
        what = f"field {f.name} of {cls.__name__}"
        if get_origin(tp) is tuple:
            flush()
            inner = get_args(tp)[0]
            _length("n", nullable, what, "    ", lines)
            indent = "    "
            if nullable:
                lines.append("    if n < 0:")
                lines.append(f"        {var} = None")
                lines.append("    else:")
                indent = "        "
            # Each item takes at least one byte: refuse a length the message cannot hold.
            lines.append(f"{indent}if n > len(data) - o:")
            too_many = f"{what} declares more items than the message holds"
            lines.append(f"{indent}    raise FastDecodeError({too_many!r})")
            lines.append(f"{indent}a = []")
            lines.append(f"{indent}for _ in range(n):")
            if is_dataclass(inner):
                sub = compile_reader(inner)
                if sub is None:
                    return False
                namespace[f"_r_{f.name}"] = sub
                lines.append(f"{indent}    x, o = _r_{f.name}(data, o)")
            elif kafka_type in FIXED:
                packer = struct.Struct(">" + FIXED[kafka_type])
                namespace[f"_p_{f.name}"] = packer
                lines.append(f"{indent}    (x,) = _p_{f.name}.unpack_from(data, o)")
                if kafka_type == "bool":
                    lines.append(f"{indent}    x = _BOOL[x]")
                lines.append(f"{indent}    o += {packer.size}")
            elif kafka_type in ("string", "bytes"):
                _string("x", kafka_type, False, what, indent + "    ", lines)
            else:
                return False
            lines.append(f"{indent}    a.append(x)")
            lines.append(f"{indent}{var} = tuple(a)")
        elif is_dataclass(tp):
            flush()
            sub = compile_reader(tp)
            if sub is None:
                return False
            namespace[f"_r_{f.name}"] = sub
            if nullable:
                lines.append("    if data[o] >= 0x80:")  # int8 -1: null
                lines.append(f"        {var} = None")
                lines.append("        o += 1")
                lines.append("    else:")
                lines.append(f"        {var}, o = _r_{f.name}(data, o + 1)")
            else:
                lines.append(f"    {var}, o = _r_{f.name}(data, o)")
        elif kafka_type in FIXED and not nullable:
            pending.append((FIXED[kafka_type], var))
            pending_types.append((kafka_type, var))
        elif kafka_type in ("string", "bytes"):
            flush()
            _string(var, kafka_type, nullable, what, "    ", lines)
        else:
            return False  # uuid, ...: the walker
    flush()
    return True
