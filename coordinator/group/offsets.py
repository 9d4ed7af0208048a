"""Connector offsets as values: canonical JSON and the checks of a commit or an alter.

A source partition and its offset are JSON objects (Kafka Connect's maps). The coordinator
stores and compares them in one canonical text: ``json.dumps(obj, sort_keys=True,
separators=(",", ":"), ensure_ascii=False)``. A request may send any JSON object text; it is
canonicalised before it is compared or stored, so ``{"b": 1, "a": 2}`` and ``{"a":2,"b":1}``
are the same partition.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


class OffsetError(ValueError):
    """A partition or offset that is not a JSON object (or cannot be stored)."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def canonical_object(text: str, what: str) -> tuple[str, int]:
    """``text`` (a JSON object) in canonical form, and its size in UTF-8 bytes; raises
    :class:`OffsetError` naming ``what`` otherwise (not JSON, NaN/Infinity, a number beyond a
    float's range, not an object, a lone surrogate that UTF-8 cannot carry, nested too deep)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise OffsetError(f"{what} is nested too deeply.") from None
    except ValueError as exc:
        raise OffsetError(f"{what} is not JSON ({exc}): {_excerpt(text)}") from None
    if not isinstance(value, dict):
        raise OffsetError(
            f"{what} must be a JSON object, got {_kind(value)}: {_excerpt(text)}")
    try:
        # (allow_nan=False: a number beyond a float's range, e.g. 1e999, parses to infinity,
        # whose text would be ``Infinity``: not JSON)
        out = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                         allow_nan=False)
        size = len(out.encode("utf-8"))
    except RecursionError:
        raise OffsetError(f"{what} is nested too deeply.") from None
    except UnicodeEncodeError:
        raise OffsetError(f"{what} holds a lone surrogate (\\ud800-\\udfff), which UTF-8 "
                          "cannot carry.") from None
    except ValueError:
        raise OffsetError(f"{what} holds a number out of range of a 64-bit float (such as "
                          f"1e999): {_excerpt(text)}") from None
    return out, size


def canonical(obj: dict[str, Any]) -> str:
    """The canonical text of a JSON object (clients build partitions with it)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array"}.get(type(value), type(value).__name__)


def _excerpt(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def changes_from(pairs: Iterable[Any], max_bytes: int, setting: str) -> dict[str, str | None]:
    """The canonical partition -> offset (None: remove) of a request's ``PartitionOffset``
    list, in order (a partition given twice: the last wins). Raises :class:`OffsetError` for
    a value that is not a JSON object, or once the canonical texts exceed ``max_bytes``."""
    changes: dict[str, str | None] = {}
    total = 0
    for i, po in enumerate(pairs):
        partition, size = canonical_object(po.partition, f"Offsets[{i}].Partition")
        total += size
        offset = None
        if po.offset is not None:
            offset, size = canonical_object(po.offset, f"Offsets[{i}].Offset")
            total += size
        if total > max_bytes:
            raise OffsetError(
                f"The offsets carry more than {max_bytes:,} bytes of partitions and offsets "
                f"(canonical JSON, UTF-8; over the limit at Offsets[{i}]); {setting} is "
                f"{max_bytes:,}. Nothing was stored: commit fewer partitions at a time.")
        changes[partition] = offset
    return changes


__all__ = ["OffsetError", "canonical", "canonical_object", "changes_from"]
