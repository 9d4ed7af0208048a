"""Write the generated parts of ``docs/protocol.md`` from ``schemas/`` and ``connect_wire``.

Run from the repository root::

    python -m tools.protocol_doc           # rewrite the generated blocks of docs/protocol.md
    python -m tools.protocol_doc --check   # exit 1 if rewriting would change the file

The page is prose written by hand with blocks between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->`` lines; only the blocks are rewritten, so the field tables, the
API table, the error table and the record table cannot drift from the schemas and the code the
daemon and the worker actually run. The schemas are loaded as ``tools/codegen.py`` loads them.
"""

from __future__ import annotations

import argparse
import re
import sys

from connect_wire.apis import APIS
from connect_wire.errors import FIRST_CUSTOM_CODE, ErrorCode
from tools.codegen import ROOT, SCHEMAS, load_schema

DOC = ROOT / "docs" / "protocol.md"
BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
    re.S,
)

# Who sends each API (not in any table of the code: the one fact the doc adds by hand).
USED_BY = {
    "ApiVersions": "every client, first",
    "Metadata": "Kafka clients bootstrapping; the CLI's `groups list` (every live node)",
    "FindCoordinator": "every client: which node coordinates a group",
    "JoinGroup": "classic Kafka Connect workers ([migration.md](migration.md))",
    "SyncGroup": "classic Kafka Connect workers",
    "Heartbeat": "classic Kafka Connect workers",
    "LeaveGroup": "classic Kafka Connect workers",
    "DescribeGroups": "Kafka's admin clients",
    "ListGroups": "Kafka's admin clients; `groups list`",
    "SaslHandshake": "SASL listeners: before anything else",
    "SaslAuthenticate": "SASL listeners: the exchange, and re-authentication",
    "DescribeAcls": "`acls list`",
    "CreateAcls": "`acls add`",
    "DeleteAcls": "`acls delete`",
    "DescribeConfigs": "`groups configs`; Kafka's admin clients (resource type GROUP)",
    "IncrementalAlterConfigs": "`groups configs --set/--delete`; Kafka's admin clients (GROUP)",
    "DescribeUserScramCredentials": "`users list`",
    "AlterUserScramCredentials": "`users add` / `users delete` (online)",
    "ConnectGroupHeartbeat": "every worker, its membership and assignment",
    "ConnectGroupPrepareAssignment": "the worker chosen to compute the assignment",
    "ConnectGroupInstallAssignment": "the worker chosen to compute the assignment",
    "ConnectGroupDescribe": "`groups describe`, `connectors list/describe/status`, the verbs (read)",
    "ConnectGroupAlterConnectors": "`connectors create/update/delete`, the verbs (write)",
}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type(field: dict) -> str:
    kind = field["type"]
    notes = []
    if "nullableVersions" in field:
        notes.append("nullable")
    if "tag" in field:
        notes.append(f"tagged, tag {field['tag']}")
    if "default" in field and field["default"] != "null":
        notes.append(f"default {field['default']}")
    return f"`{kind}`" + (f" ({', '.join(notes)})" if notes else "")


def _rows(fields: list[dict], prefix: str = "") -> list[str]:
    rows = []
    for field in fields:
        array = field["type"].startswith("[]")
        name = prefix + field["name"]
        rows.append(f"| `{name}` | {_type(field)} | {_cell(field.get('about', ''))} |")
        if "fields" in field:  # a struct defined in place: its fields follow, prefixed
            rows.extend(_rows(field["fields"], name + ("[]." if array else ".")))
    return rows


def _table(fields: list[dict]) -> list[str]:
    return ["| field | type | meaning |", "|---|---|---|", *_rows(fields)]


def _schema(name: str, records: bool = False) -> dict:
    return load_schema((SCHEMAS / "records" if records else SCHEMAS) / f"{name}.json")


def render_api(api_name: str) -> str:
    """The request and response tables of one connect API, and the common structs they use."""
    out: list[str] = []
    structs: dict[str, dict] = {}
    for kind in ("Request", "Response"):
        schema = _schema(f"{api_name}{kind}")
        out += [f"**{kind}** (`{schema['name']}`, versions {schema['validVersions']}, "
                f"flexible {schema['flexibleVersions']}):", "", *_table(schema["fields"]), ""]
        for struct in schema.get("commonStructs", []):
            structs.setdefault(struct["name"], struct)
    for name in sorted(structs):
        out += [f"Struct `{name}`:", "", *_table(structs[name]["fields"]), ""]
    return "\n".join(out)


def render_apis() -> str:
    out = ["| key | API | versions | sent by |", "|---|---|---|---|"]
    for key in sorted(APIS, key=lambda k: (k >= FIRST_CUSTOM_CODE, k)):
        api = APIS[key]
        versions = (f"v{api.min_version}" if api.min_version == api.max_version
                    else f"v{api.min_version}-v{api.max_version}")
        owner = "ours" if api.kio_module is None else "Kafka's"
        out.append(f"| {key} | {api.name} ({owner}) | {versions} | {USED_BY.get(api.name, '')} |")
    return "\n".join(out) + "\n"


def render_errors() -> str:
    out = ["| code | name | retriable | meaning |", "|---|---|---|---|"]
    for code in sorted(ErrorCode, key=int):
        out.append(f"| {int(code)} | `{code.name}` | {'yes' if code.retriable else 'no'} | "
                   f"{_cell(code.description)} |")
    return "\n".join(out) + "\n"


def render_records() -> str:
    keys = {}
    values = {}
    for path in sorted((SCHEMAS / "records").glob("*.json")):
        schema = load_schema(path)
        (keys if schema["type"] == "coordinator-key" else values)[schema["apiKey"]] = schema
    out = ["| type | key | key fields | value fields |", "|---|---|---|---|"]
    for type_id in sorted(keys):
        key, value = keys[type_id], values[type_id]

        def names(fields: list[dict]) -> str:
            return ", ".join(
                f["name"] + (f" [{names(f['fields'])}]" if "fields" in f else "")
                for f in fields
            )
        out.append(f"| {type_id} | {key['name'].removesuffix('Key')} | {names(key['fields'])} | "
                   f"{names(value['fields'])} |")
    return "\n".join(out) + "\n"


def render(name: str) -> str:
    if name == "apis":
        return render_apis()
    if name == "errors":
        return render_errors()
    if name == "records":
        return render_records()
    if name.startswith("api."):
        return render_api(name.removeprefix("api."))
    raise KeyError(f"docs/protocol.md: unknown generated block {name!r}")


def regenerate(text: str) -> str:
    """``text`` with every generated block rendered afresh."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.protocol_doc",
        description="Rewrite the generated tables of docs/protocol.md from schemas/ and connect_wire.",
    )
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if docs/protocol.md is out of date")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    try:
        new = regenerate(text)
    except KeyError as exc:
        print(f"protocol_doc: {exc.args[0]}", file=sys.stderr)
        return 2
    if new == text:
        return 0
    if args.check:
        print("out of date: docs/protocol.md (run python -m tools.protocol_doc)")
        return 1
    DOC.write_text(new, encoding="utf-8")
    print("protocol_doc: docs/protocol.md rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
