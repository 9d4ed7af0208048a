"""kafka-python 3.x as an independent encoder/decoder of OUR schemas (a test oracle).

How kafka-python loads Kafka-format JSON at runtime (kafka/protocol/api_message.py, api_data.py,
schemas/load_json.py): a class statement ``class X(ApiMessage, load_json=pkg)`` makes its
metaclass call ``load_json("X", package=pkg)``, which reads the package resource ``X.json``
with ``importlib.resources.read_text`` (so the class name must equal the file name and the file
must live in an importable package), strips whole-line ``//`` comments, inlines
``commonStructs`` and builds a ``StructField`` tree. ``ApiMessage`` accepts only the types
"request"/"response"; record schemas go through ``ApiData``, which asserts type "data".

Field names are kafka-python's ``underscore_name`` of the JSON names (``MemberId`` ->
``member_id``), nested structs get a data class per field (``StructField.data_class``), arrays
are lists. ``Msg(version=0, **fields).encode()`` returns the body (a bytearray) and
``Msg.decode(data, version=0)`` parses one.

This module copies ``schemas/*.json`` and ``schemas/records/*.json`` into a temporary package and
builds one kafka-python class per file. The record schemas' types ``coordinator-key`` and
``coordinator-value`` are rewritten to ``data`` in the copy, because kafka-python's ``ApiData``
refuses any other type; nothing else changes (the wire format of a "data" schema is the same).
"""

from __future__ import annotations

import importlib
import io
import re
import sys
import types
import warnings
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

with warnings.catch_warnings():  # kafka-python loads its bundled JSON with a deprecated API
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.api_data import ApiData
    from kafka.protocol.api_message import ApiMessage

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"

_RECORD_TYPE = re.compile(r'"type"\s*:\s*"coordinator-(?:key|value)"')


class Oracle:
    """kafka-python classes for every schema file, keyed by the schema's name."""

    def __init__(self, workdir: Path, package: str = "kp_oracle_schemas") -> None:
        pkg_dir = workdir / package
        pkg_dir.mkdir(parents=True, exist_ok=True)
        (pkg_dir / "__init__.py").write_text("", encoding="utf-8")
        self.kinds: dict[str, str] = {}
        for path in sorted(SCHEMAS.glob("*.json")):
            (pkg_dir / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
            self.kinds[path.stem] = "message"
        for path in sorted((SCHEMAS / "records").glob("*.json")):
            text, n = _RECORD_TYPE.subn('"type": "data"', path.read_text(encoding="utf-8"))
            assert n == 1, f"{path}: expected one coordinator-key/value type, found {n}"
            (pkg_dir / path.name).write_text(text, encoding="utf-8")
            self.kinds[path.stem] = "record"
        sys.path.insert(0, str(workdir))
        importlib.invalidate_caches()
        try:
            module = importlib.import_module(package)
        finally:
            sys.path.remove(str(workdir))
        self.classes: dict[str, type] = {}
        with warnings.catch_warnings():  # load_json uses importlib.resources.read_text
            warnings.simplefilter("ignore", DeprecationWarning)
            for name, kind in self.kinds.items():
                base = ApiMessage if kind == "message" else ApiData
                self.classes[name] = types.new_class(name, (base,), {"load_json": module})

    # -- conversion ---------------------------------------------------------------------------

    def to_kp(self, entity: Any) -> Any:
        """Our dataclass value -> the kafka-python data object of the same schema."""
        kp_cls = self.classes[type(entity).__name__]
        return kp_cls(version=entity.__version__, **self._kp_fields(entity, kp_cls._struct))

    def _kp_fields(self, entity: Any, struct: Any) -> dict[str, Any]:
        ours = [f.name for f in fields(entity)]
        theirs = list(struct.fields)
        assert ours == theirs, f"{type(entity).__name__}: field names {ours} != {theirs}"
        out: dict[str, Any] = {}
        for name, kp_field in struct.fields.items():
            value = getattr(entity, name)
            out[name] = self._kp_value(value, kp_field, entity.__version__)
        return out

    def _kp_value(self, value: Any, kp_field: Any, version: int) -> Any:
        if value is None:
            return None
        if kp_field.is_struct():
            return kp_field.data_class(version=version, **self._kp_fields(value, kp_field))
        if kp_field.is_struct_array():
            return [
                kp_field.data_class(version=version, **self._kp_fields(item, kp_field))
                for item in value
            ]
        if isinstance(value, tuple):
            return list(value)
        return value

    def from_kp(self, kp_obj: Any, cls: type) -> Any:
        """A kafka-python data object -> our dataclass ``cls``."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = getattr(kp_obj, f.name)
            values[f.name] = self._our_value(raw, cls, f)
        return cls(**values)

    def _our_value(self, raw: Any, cls: type, f: Any) -> Any:
        if raw is None:
            return None
        tp = _non_none(f.type)
        if is_dataclass(tp):
            return self.from_kp(raw, tp)
        if getattr(tp, "__origin__", None) is tuple:
            inner = tp.__args__[0]
            if is_dataclass(inner):
                return tuple(self.from_kp(item, inner) for item in raw)
            return tuple(raw)
        if isinstance(raw, bytearray | memoryview):
            return bytes(raw)
        return raw

    # -- encode / decode ----------------------------------------------------------------------

    def encode(self, entity: Any) -> bytes:
        kp_obj = self.to_kp(entity)
        if self.kinds[type(entity).__name__] == "message":
            return bytes(kp_obj.encode())
        return bytes(kp_obj.encode(version=entity.__version__, header=False))

    def decode(self, cls: type, data: bytes) -> Any:
        kp_cls = self.classes[cls.__name__]
        version = cls.__version__  # type: ignore[attr-defined]
        if self.kinds[cls.__name__] == "message":
            kp_obj = kp_cls.decode(data, version=version)
        else:
            kp_obj = kp_cls.decode(io.BytesIO(data), version=version, header=False)
        return self.from_kp(kp_obj, cls)


def _non_none(tp: Any) -> Any:
    args = getattr(tp, "__args__", None)
    if args is not None and type(None) in args and getattr(tp, "__origin__", None) is not tuple:
        return next(a for a in args if a is not type(None))
    return tp
