"""Specialised writers: one straight-line Python function per entity class.

kio's ``entity_writer`` walks a per-field dict on every call and serialises tagged fields into a
temporary ``BytesIO`` even when there are none. For our hot messages (heartbeat request and
response) that generic loop dominates. ``compile_writer`` reads the same dataclass field
metadata once and generates a function that writes the fields in order, fusing consecutive
fixed-width fields into one precompiled ``struct.Struct.pack``. Compact strings and compact
array lengths are written inline (a length below 128 is one precomputed byte; kio's own
writers validate every length through its phantom types, which cost more than the write);
legacy strings use kio's writers.

The output is byte-identical to kio's writer; the tests check that for every message, and
``python -m bench codec`` measures both side by side. Tagged fields (KIP-482) are written as
kio writes them: after the other fields, the count of those whose value is not their default,
then each one's tag, size and bytes in tag order (each one's bytes by a compiled writer of its
own, through a temporary buffer; a fixed-width number's packed at once). Anything else it does
not know makes ``compile_writer`` return None, and kio's writer is used.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

from kio.serial import writers as kw

FIXED = {
    "bool": "?",
    "int8": "b",
    "int16": "h",
    "int32": "i",
    "int64": "q",
    "uint8": "B",
    "uint16": "H",
    "uint32": "I",
    "uint64": "Q",
    "float64": "d",
}


_BYTE = tuple(bytes((i,)) for i in range(128))


def uvarint_bytes(value: int) -> bytes:
    """An unsigned varint (7 bits per byte, least significant first), as kio writes it."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_line(expr: str, indent: str) -> str:
    return f"{indent}n = {expr}; w(_B[n] if n < 128 else _uv(n))"


def _compact_string_lines(expr: str, nullable: bool, indent: str) -> list[str]:
    """Write ``expr`` (str or bytes) as a compact string: length + 1, then the bytes."""
    lines = [f"{indent}s = {expr}", f"{indent}if s is None:"]
    if nullable:
        lines.append(f"{indent}    w(b'\\x00')")
    else:  # kio's message for the same mistake
        lines.append(f"{indent}    raise TypeError('Unexpectedly received None value')")
    lines += [
        f"{indent}else:",
        f"{indent}    if type(s) is str:",
        f"{indent}        s = s.encode()",
        _length_line("len(s) + 1", indent + "    "),
        f"{indent}    w(s)",
    ]
    return lines


def _optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) is UnionType:
        return next(a for a in get_args(tp) if a is not NoneType), True
    return tp, False


def _string_writer(kafka_type: str, flexible: bool, nullable: bool) -> str:
    if kafka_type not in ("string", "bytes"):
        raise NotImplementedError(kafka_type)
    if flexible:
        return "kw.write_nullable_compact_string" if nullable else "kw.write_compact_string"
    if kafka_type == "string":
        return "kw.write_nullable_legacy_string" if nullable else "kw.write_legacy_string"
    return "kw.write_nullable_legacy_bytes" if nullable else "kw.write_legacy_bytes"


@cache
def compile_writer(cls: type) -> Callable[[Any, Any], None] | None:
    """A writer ``(buffer, entity) -> None`` for ``cls``, or None to use kio's writer."""
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
    namespace: dict[str, Any] = {"kw": kw, "struct": struct, "_B": _BYTE, "_uv": uvarint_bytes,
                                 "_BytesIO": io.BytesIO}
    plain = [f for f in fields(cls) if "tag" not in f.metadata]
    tagged = sorted((f for f in fields(cls) if "tag" in f.metadata),
                    key=lambda f: int(f.metadata["tag"]))
    if tagged and not flexible:
        return None
    lines = ["def write(buffer, v):", "    w = buffer.write"]
    if not _emit_fields(plain, flexible, namespace, lines, "body"):
        return None
    if not flexible:
        pass  # no tagged fields section
    elif not tagged:
        lines.append("    w(b'\\x00')")  # no tagged fields
    else:
        # Tagged fields (KIP-482), as kio writes them: in tag order, each one whose value
        # differs from its default as its tag, its size and its bytes; their count first.
        lines.append("    t = []")
        for f in tagged:
            tag = int(f.metadata["tag"])
            if f.default is MISSING:  # (kio compares with an implicit default: leave it to kio)
                return None
            namespace[f"_d{tag}"] = f.default
            fixed = FIXED.get(f.metadata.get("kafka_type", ""))
            if fixed is not None and get_origin(_optional(f.type)[0]) is not tuple:
                # A fixed-width number: its tag, size and bytes in one go (no buffer of its own).
                pack = struct.Struct(">" + fixed)
                namespace[f"_p{tag}"] = pack.pack
                namespace[f"_h{tag}"] = uvarint_bytes(tag) + uvarint_bytes(pack.size)
                lines += [f"    if v.{f.name} != _d{tag}:",
                          f"        t.append(_h{tag} + _p{tag}(v.{f.name}))"]
                continue
            sub = [f"def write_tag_{tag}(buffer, v):", "    w = buffer.write"]
            if not _emit_fields([f], flexible, namespace, sub, f"tag{tag}"):
                return None
            exec(compile("\n".join(sub) + "\n", f"<fastwriter {cls.__qualname__} tag {tag}>",
                         "exec"), namespace)
            namespace[f"_t{tag}"] = uvarint_bytes(tag)
            lines += [
                f"    if v.{f.name} != _d{tag}:",
                "        b = _BytesIO()",
                f"        write_tag_{tag}(b, v)",
                "        p = b.getvalue()",
                f"        t.append(_t{tag} + _uv(len(p)) + p)",
            ]
        lines += [
            _length_line("len(t)", "    "),
            "    for p in t:",
            "        w(p)",
        ]
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<fastwriter {cls.__module__}.{cls.__qualname__}>", "exec"), namespace)
    write = namespace["write"]
    write.__doc__ = f"Specialised writer of {cls.__qualname__}.\n\n{source}"
    return write  # type: ignore[no-any-return]


def _emit_fields(fields_: list[Any], flexible: bool, namespace: dict[str, Any], lines: list[str],
                 prefix: str) -> bool:
    """Append the code writing ``fields_`` of ``v`` (in order) to ``lines``; False when one of
    them is of a kind left to kio. ``prefix`` keeps the names this adds to ``namespace`` apart."""
    pending: list[tuple[str, str]] = []  # (struct code, attribute)
    counter = 0

    def flush() -> None:
        nonlocal counter
        if not pending:
            return
        counter += 1
        name = f"_s_{prefix}_{counter}"
        namespace[name] = struct.Struct(">" + "".join(code for code, _ in pending))
        args = ", ".join(f"v.{attr}" for _, attr in pending)
        lines.append(f"    w({name}.pack({args}))")
        pending.clear()

    for f in fields_:
        tp, nullable = _optional(f.type)
        if "tag" in f.metadata:
            nullable = False  # a tagged field's presence is its tag (kio's rule)
        kafka_type = f.metadata.get("kafka_type")
        attr = f.name
        if get_origin(tp) is tuple:
            flush()
            inner = get_args(tp)[0]
            if not flexible:
                return False  # legacy arrays: leave to kio
            lines.append(f"    a = v.{attr}")
            if nullable:
                lines.append("    if a is None:")
                lines.append("        w(b'\\x00')")
                lines.append("    else:")
                indent = "        "
            else:
                indent = "    "
            lines.append(_length_line("len(a) + 1", indent))
            if is_dataclass(inner):
                sub = compile_writer(inner)
                if sub is None:
                    return False
                namespace[f"_w_{attr}"] = sub
                lines.append(f"{indent}for x in a:")
                lines.append(f"{indent}    _w_{attr}(buffer, x)")
            elif kafka_type in FIXED:
                namespace[f"_p_{attr}"] = struct.Struct(">" + FIXED[kafka_type]).pack
                lines.append(f"{indent}for x in a:")
                lines.append(f"{indent}    w(_p_{attr}(x))")
            elif kafka_type in ("string", "bytes"):
                lines.append(f"{indent}for x in a:")
                lines += _compact_string_lines("x", False, indent + "    ")
            else:
                return False
        elif is_dataclass(tp):
            flush()
            sub = compile_writer(tp)
            if sub is None:
                return False
            namespace[f"_w_{attr}"] = sub
            if nullable:
                lines.append(f"    if v.{attr} is None:")
                lines.append("        w(b'\\xff')")
                lines.append("    else:")
                lines.append("        w(b'\\x01')")
                lines.append(f"        _w_{attr}(buffer, v.{attr})")
            else:
                lines.append(f"    _w_{attr}(buffer, v.{attr})")
        elif kafka_type in FIXED and not nullable:
            pending.append((FIXED[kafka_type], attr))
        elif kafka_type in ("string", "bytes"):
            flush()
            if flexible:
                lines += _compact_string_lines(f"v.{attr}", nullable, "    ")
            else:
                lines.append(f"    {_string_writer(kafka_type, flexible, nullable)}(buffer, v.{attr})")
        else:
            return False  # uuid, timedelta, ...: kio handles them
    flush()
    return True
