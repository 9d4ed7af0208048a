"""Generate Python message classes from the Kafka-format JSON schemas in ``schemas/``.

Run from the repository root::

    python -m tools.codegen           # (re)write connect_wire/messages/ and connect_wire/records/
    python -m tools.codegen --check   # exit 1 if regenerating would change a file

Each schema file and each of its valid versions becomes one module holding kio-style entities:
frozen, slotted, keyword-only dataclasses whose fields carry ``kafka_type`` (and ``tag``)
metadata, so that kio's writer and its native reader serialise them. The rules follow Apache
Kafka's message generator: a field exists in a version when its ``versions`` covers it, is
nullable when ``nullableVersions`` covers it, is tagged when it has a ``tag``; nested and common
structs become classes of their own.

Deliberate differences from kio's own generated classes:
- every ``int16`` ``ErrorCode`` field stays a plain ``int16`` (kio maps it to a closed enum that
  cannot decode our error codes from 10000 up);
- integers, strings and bytes are annotated with plain ``int``/``str``/``bytes``.

Only whole-line ``//`` comments are allowed in the JSON (Kafka's files use nothing else).
"""

from __future__ import annotations

import argparse
import json
import keyword
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"
TARGETS = {
    SCHEMAS: ROOT / "connect_wire" / "messages",
    SCHEMAS / "records": ROOT / "connect_wire" / "records",
}

PRIMITIVES = {
    "bool": "bool",
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "int",
    "uint16": "int",
    "uint32": "int",
    "float64": "float",
    "string": "str",
    "bytes": "bytes",
    "uuid": "uuid.UUID",
}
IMPLICIT_DEFAULTS = {
    "bool": "False",
    "int8": "0",
    "int16": "0",
    "int32": "0",
    "int64": "0",
    "uint16": "0",
    "uint32": "0",
    "float64": "0.0",
    "string": '""',
    "bytes": 'b""',
    "uuid": "uuid.UUID(int=0)",
}
ENTITY_TYPES = {
    "request": "EntityType.request",
    "response": "EntityType.response",
    "coordinator-key": "EntityType.data",
    "coordinator-value": "EntityType.data",
    "data": "EntityType.data",
}


class SchemaError(ValueError):
    """A schema file breaks a rule of the format."""


@dataclass(frozen=True)
class Versions:
    low: int
    high: int | None  # None: open ended ("3+")

    @classmethod
    def parse(cls, text: str | None) -> Versions:
        if text is None or text == "none":
            return cls(1, 0)  # empty
        text = text.strip()
        if text.endswith("+"):
            return cls(int(text[:-1]), None)
        if "-" in text:
            low, high = text.split("-")
            return cls(int(low), int(high))
        return cls(int(text), int(text))

    def __contains__(self, version: int) -> bool:
        return self.low <= version and (self.high is None or version <= self.high)

    def all(self) -> range:
        if self.high is None:
            raise SchemaError("validVersions must be bounded")
        return range(self.low, self.high + 1)


def load_schema(path: Path) -> dict:
    lines = [
        line for line in path.read_text(encoding="utf-8").splitlines()
        if not line.lstrip().startswith("//")
    ]
    try:
        return json.loads("\n".join(lines))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: not valid JSON: {exc}") from exc


def snake(name: str) -> str:
    out = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    return out + "_" if keyword.iskeyword(out) else out


def module_name(schema_name: str, version: int) -> str:
    return f"{snake(schema_name)}_v{version}"


class Generator:
    def __init__(self, schema: dict, source: str, version: int) -> None:
        self.schema = schema
        self.source = source
        self.version = version
        self.kind = schema["type"]
        if self.kind not in ENTITY_TYPES:
            raise SchemaError(f"{source}: unknown type {self.kind!r}")
        self.flexible = version in Versions.parse(schema.get("flexibleVersions"))
        self.common = {s["name"]: s for s in schema.get("commonStructs", [])}
        self.classes: list[str] = []
        self.emitted: set[str] = set()
        self.uses_uuid = False

    # -- fields -----------------------------------------------------------------------------
    def present(self, field: dict) -> bool:
        return self.version in Versions.parse(field["versions"])

    def struct_fields(self, type_name: str, inline: list | None) -> list[dict]:
        if inline is not None:
            return inline
        if type_name in self.common:
            return self.common[type_name]["fields"]
        raise SchemaError(f"{self.source}: struct {type_name!r} has no fields and no commonStruct")

    def emit_struct(self, type_name: str, fields: list[dict]) -> None:
        if type_name in self.emitted:
            return
        self.emitted.add(type_name)
        self.classes.append(self.render_class(type_name, fields, "EntityType.nested"))

    def field_line(self, field: dict) -> tuple[str, str]:
        """Return (annotation/default source line, docstring) of one field."""
        for key in ("name", "type", "versions", "about"):
            if key not in field:
                raise SchemaError(f"{self.source}: field {field.get('name')!r} lacks {key!r}")
        name = snake(field["name"])
        ftype: str = field["type"]
        nullable = self.version in Versions.parse(field.get("nullableVersions"))
        tag = field.get("tag")
        if tag is not None and self.version not in Versions.parse(field.get("taggedVersions")):
            tag = None
        if tag is not None and not self.flexible:
            raise SchemaError(f"{self.source}: tagged field {field['name']} in a non-flexible version")
        default = field.get("default")
        is_array = ftype.startswith("[]")
        inner = ftype[2:] if is_array else ftype
        meta: dict[str, object] = {}
        if inner in PRIMITIVES:
            py = PRIMITIVES[inner]
            if inner == "uuid":
                self.uses_uuid = True
            meta["kafka_type"] = inner
        else:
            py = inner
            self.emit_struct(inner, self.struct_fields(inner, field.get("fields")))
        if tag is not None:
            meta["tag"] = int(tag)
        annotation = f"tuple[{py}, ...]" if is_array else py
        if nullable:
            annotation += " | None"
        default_src: str | None
        if default is not None:
            default_src = self.default_source(field, inner, is_array, nullable, str(default))
        elif is_array and not nullable:
            default_src = "()"
        elif tag is not None:
            if nullable:
                default_src = "None"
            elif is_array:
                default_src = "()"
            elif inner in IMPLICIT_DEFAULTS:
                default_src = IMPLICIT_DEFAULTS[inner]
            else:
                raise SchemaError(f"{self.source}: tagged struct {field['name']} needs a default")
        else:
            default_src = None
        args = []
        if meta:
            args.append(f"metadata={meta!r}")
        if default_src is not None:
            args.append(f"default={default_src}")
        line = f"    {name}: {annotation} = field({', '.join(args)})"
        return line, field["about"]

    def default_source(
        self, field: dict, inner: str, is_array: bool, nullable: bool, default: str
    ) -> str:
        if default == "null":
            if not nullable:
                raise SchemaError(f"{self.source}: {field['name']} defaults to null but is not nullable")
            return "None"
        if is_array:
            raise SchemaError(f"{self.source}: array {field['name']} may only default to null")
        if inner in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
            return str(int(default, 0))
        if inner == "float64":
            return repr(float(default))
        if inner == "bool":
            if default not in ("true", "false"):
                raise SchemaError(f"{self.source}: bad bool default for {field['name']}")
            return "True" if default == "true" else "False"
        if inner == "string":
            return repr(default)
        raise SchemaError(f"{self.source}: cannot default field {field['name']} of type {inner}")

    # -- classes ----------------------------------------------------------------------------
    def render_class(self, class_name: str, fields: list[dict], entity_type: str) -> str:
        lines = [
            "@dataclass(frozen=True, slots=True, kw_only=True)",
            f"class {class_name}:",
            f"    __type__: ClassVar = {entity_type}",
            f"    __version__: ClassVar[int] = {self.version}",
            f"    __flexible__: ClassVar[bool] = {self.flexible}",
            f"    __api_key__: ClassVar[int] = {int(self.schema['apiKey'])}",
            f"    __header_schema__: ClassVar[type | None] = {self.header()}",
        ]
        for field in fields:
            if not self.present(field):
                continue
            line, about = self.field_line(field)
            lines.append(line)
            lines.append(f"    {json.dumps(about, ensure_ascii=False)}")
        return "\n".join(lines)

    def header(self) -> str:
        if self.kind == "request":
            return "RequestHeader"
        if self.kind == "response":
            return "ResponseHeader"
        return "None"

    def render(self) -> str:
        top = self.render_class(self.schema["name"], self.schema["fields"], ENTITY_TYPES[self.kind])
        body = "\n\n\n".join([*self.classes, top])
        imports = []
        if self.uses_uuid:
            imports.append("import uuid")
        imports += [
            "from dataclasses import dataclass, field",
            "from typing import ClassVar",
            "",
        ]
        if self.kind == "request":
            version = "v2" if self.flexible else "v1"
            imports.append(
                f"from kio.schema.request_header.{version}.header import RequestHeader"
            )
        elif self.kind == "response":
            version = "v1" if self.flexible else "v0"
            imports.append(
                f"from kio.schema.response_header.{version}.header import ResponseHeader"
            )
        imports.append("from kio.static.constants import EntityType")
        head = (
            f'"""\nGenerated by tools/codegen.py from ``{self.source}`` (version {self.version}).\n'
            'Do not edit: change the schema and run ``python -m tools.codegen``.\n"""\n\n'
        )
        return head + "\n".join(imports) + "\n\n\n" + body + "\n"


def render_index(entries: list[tuple[str, dict, int]], package: str) -> str:
    """An __init__ naming every generated class and indexing them by (key, kind, version)."""
    lines = [
        '"""',
        f"Generated by tools/codegen.py: index of the classes in {package}.",
        'Do not edit: change the schemas and run ``python -m tools.codegen``.',
        '"""',
        "",
    ]
    for mod, schema, _version in entries:
        lines.append(f"from .{mod} import {schema['name']} as {schema['name']}_{mod.rsplit('_', 1)[1]}")
    lines.append("")
    by_kind: dict[str, list[str]] = {}
    for mod, schema, version in entries:
        alias = f"{schema['name']}_{mod.rsplit('_', 1)[1]}"
        by_kind.setdefault(schema["type"], []).append(
            f"    ({int(schema['apiKey'])}, {version}): {alias},"
        )
    names = {
        "request": "REQUESTS",
        "response": "RESPONSES",
        "coordinator-key": "RECORD_KEYS",
        "coordinator-value": "RECORD_VALUES",
    }
    for kind, var in names.items():
        if kind in by_kind:
            lines.append(f"{var}: dict[tuple[int, int], type] = {{")
            lines += sorted(by_kind[kind])
            lines.append("}")
            lines.append('"""(api key or record type id, version) -> generated class."""')
            lines.append("")
    latest: list[str] = []
    for mod, schema, _version in entries:
        alias = f"{schema['name']}_{mod.rsplit('_', 1)[1]}"
        latest.append((schema["name"], alias))  # type: ignore[arg-type]
    # The newest version of each message is also importable under its plain name.
    newest: dict[str, str] = {}
    for name, alias in sorted(latest):
        newest[name] = alias
    for name, alias in newest.items():
        lines.append(f"{name} = {alias}")
    lines.append("")
    return "\n".join(lines)


def generate() -> dict[Path, str]:
    """Render every output file in memory: {path: text}."""
    out: dict[Path, str] = {}
    for source_dir, target_dir in TARGETS.items():
        entries: list[tuple[str, dict, int]] = []
        for path in sorted(source_dir.glob("*.json")):
            schema = load_schema(path)
            for key in ("apiKey", "type", "name", "validVersions", "fields"):
                if key not in schema:
                    raise SchemaError(f"{path}: lacks {key!r}")
            for version in Versions.parse(schema["validVersions"]).all():
                mod = module_name(schema["name"], version)
                source = path.relative_to(ROOT).as_posix()
                out[target_dir / f"{mod}.py"] = Generator(schema, source, version).render()
                entries.append((mod, schema, version))
        package = target_dir.relative_to(ROOT).as_posix()
        out[target_dir / "__init__.py"] = render_index(entries, package)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.codegen",
        description="Generate connect_wire/messages and connect_wire/records from schemas/.",
    )
    parser.add_argument(
        "--check", action="store_true",
        help="write nothing; exit 1 and list the files that regenerating would change",
    )
    args = parser.parse_args(argv)
    try:
        files = generate()
    except SchemaError as exc:
        print(f"codegen: {exc}", file=sys.stderr)
        return 2
    stale = []
    for target_dir in TARGETS.values():
        for existing in target_dir.glob("*.py"):
            if existing not in files:
                stale.append(existing)
                if not args.check:
                    existing.unlink()
    for path, text in files.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)}")
        return 1 if stale else 0
    print(f"codegen: {len(files)} files, {len(stale)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
