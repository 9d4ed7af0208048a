"""The one direction of the arrows: every module of the project sits in a layer, and imports only
modules of its own layer or of layers below it, with no cycle between modules.

The imports are read from each module's syntax tree (``ast``): module-level ones, those inside
functions, and those under ``TYPE_CHECKING`` alike (a deferred import is the same circle, only
later). ``tests/`` are not checked. The layers, lowest first (:data:`LAYERS`; a module belongs to
the longest name in the table that is it or its package):

======  ==================  =============================================================
layer   name                modules
======  ==================  =============================================================
0       wire                ``connect_wire`` (codec, framing, messages, records, logs setup)
1       pure cores          ``coordinator.group``, ``worker_client.membership``,
                            ``connect_wire.assignors``: values in, values out, time passed in
2       security model      ``coordinator.security`` (principals, the ``Security`` interface),
                            ``.model``, ``.scram``, ``.state``, ``.sasl``: sans-IO as well
3       runtime and store   ``coordinator.runtime``, ``coordinator.store``, ``coordinator.config``
                            (the settings, which the stores read too), ``coordinator.logs``,
                            ``coordinator.metrics``, ``coordinator.security.store/.listeners/
                            .tls``; ``worker_client.client`` and the worker's helpers (logs,
                            metrics, failstop, config providers, plugins, fencing, context)
4       server              ``coordinator.server``, ``coordinator.security.apis/.service``;
                            ``worker_client.worker``, ``worker_client.rest`` (its REST API)
5       cluster             ``coordinator.cluster``
6       entry points        ``coordinator.cli``, ``coordinator.daemon``, ``coordinator.admin``,
                            ``coordinator.security.cli``; ``worker_client.cli``, its examples
7       above everything    ``simulation``, ``bench``, ``tools``
======  ==================  =============================================================

Besides, the daemon (``coordinator``) and the worker client (``worker_client``) never import each
other, whatever their layers: what both need lives in ``connect_wire``. That is also checked in
fresh interpreters below: importing each side's entry points loads nothing of the other.

A failure names each offending import as ``file:line`` and each cycle with the lines that make it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("connect_wire", "coordinator", "worker_client", "simulation", "bench", "tools")

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("wire", ("connect_wire", "=coordinator", "=worker_client")),
    ("pure cores", ("coordinator.group", "worker_client.membership", "connect_wire.assignors")),
    ("security model", ("coordinator.security", "coordinator.security.model",
                        "coordinator.security.scram", "coordinator.security.state",
                        "coordinator.security.sasl")),
    ("runtime and store", ("coordinator.runtime", "coordinator.store", "coordinator.config",
                           "coordinator.logs", "coordinator.metrics",
                           "coordinator.security.store", "coordinator.security.listeners",
                           "coordinator.security.tls",
                           "worker_client.client", "worker_client.logs", "worker_client.metrics",
                           "worker_client.failstop", "worker_client.config_providers",
                           "worker_client.plugins", "worker_client.fencing", "worker_client.context")),
    ("server", ("coordinator.server", "coordinator.security.apis",
                "coordinator.security.service", "worker_client.worker", "worker_client.rest")),
    ("cluster", ("coordinator.cluster",)),
    ("entry points", ("coordinator.cli", "coordinator.daemon", "coordinator.admin",
                      "coordinator.security.cli", "worker_client.cli", "worker_client.examples")),
    ("above everything", ("simulation", "bench", "tools")),
]
"""Lowest first. An entry names a module and the modules under it; ``=name`` the module alone (a
top-level package whose ``__init__`` must stay empty of project imports)."""

NEVER = [("coordinator", "worker_client"), ("worker_client", "coordinator")]
"""(importer, imported) top-level packages that never import each other."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = project_modules()


def imports(module: str, source: str, is_package: bool = False) -> Iterator[tuple[str, int]]:
    """(imported project module, line) for every import statement in ``module``'s ``source``,
    wherever it is in the file. ``from pkg import name`` is an import of ``pkg.name`` when that
    is a module, else of ``pkg``."""
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin
                       for alias in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            if target.split(".")[0] in PACKAGES:
                while target not in MODULES and "." in target:  # `import a.b.C`-like: a.b
                    target = target.rpartition(".")[0]
                yield target, node.lineno


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the matching entry, layer)
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            exact = entry.startswith("=")
            name = entry.lstrip("=")
            if module == name or (not exact and module.startswith(name + ".")):
                if best is None or len(name) > best[0]:
                    best = (len(name), rank)
    return None if best is None else best[1]


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def graph() -> dict[str, dict[str, list[int]]]:
    """module -> imported module -> the lines importing it."""
    edges: dict[str, dict[str, list[int]]] = {}
    for module, path in MODULES.items():
        out = edges.setdefault(module, {})
        for target, line in imports(module, path.read_text(), path.name == "__init__.py"):
            if target != module:
                out.setdefault(target, []).append(line)
    return edges


def cycles(edges: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def shortest_cycle(start: str, component: set[str],
                   edges: dict[str, dict[str, list[int]]]) -> list[str]:
    """A shortest import path from ``start`` back to itself, inside ``component``."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in edges[v]:
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in component and w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{start} is in no cycle")


def upward(edges: dict[str, dict[str, list[int]]]) -> list[str]:
    """``file:line: ...`` for each import of a higher layer or of the other side."""
    bad = []
    for module, targets in sorted(edges.items()):
        mine = layer_of(module)
        if mine is None:
            continue
        for target, lines in sorted(targets.items()):
            theirs = layer_of(target)
            sides = (module.split(".")[0], target.split(".")[0])
            if sides in NEVER:
                why = f"{sides[0]} never imports {sides[1]}"
            elif theirs is not None and theirs > mine:
                why = f"layer {LAYERS[mine][0]!r} imports layer {LAYERS[theirs][0]!r}"
            else:
                continue
            bad += [f"{where(module, line)}: {module} imports {target} ({why})" for line in lines]
    return bad


def cycle_report(edges: dict[str, dict[str, list[int]]]) -> list[str]:
    """Each cycle (a shortest one through each module of a strongly connected component), then
    ``file:line`` of every import between the component's modules."""
    report = []
    for component in cycles(edges):
        members = set(component)
        loops: list[list[str]] = []
        for module in component:
            loop = shortest_cycle(module, members, edges)
            turn = loop.index(min(loop[:-1]))
            loop = loop[turn:-1] + loop[:turn + 1]
            if loop not in loops:
                loops.append(loop)
        report += ["cycle: " + " -> ".join(loop) for loop in loops]
        for module in component:
            for target, lines in sorted(edges[module].items()):
                if target in members:
                    report += [f"  {where(module, line)}: {module} imports {target}"
                               for line in lines]
    return report


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, "modules in no layer (place them in LAYERS): " + ", ".join(missing)


def test_no_import_reaches_up() -> None:
    bad = upward(graph())
    assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    report = cycle_report(graph())
    assert not report, "import cycles between modules:\n" + "\n".join(report)


def test_the_checker_names_each_offending_line() -> None:
    """On a made-up graph: an upward import, an import of the other side and a cycle, each
    named by file and line."""
    edges = {
        "coordinator.group.model": {"coordinator.server.app": [7], "connect_wire.items": [3]},
        "coordinator.server.app": {"coordinator.server.connection": [52]},
        "coordinator.server.connection": {"coordinator.server.app": [65, 90]},
        "worker_client.worker": {"coordinator.logs": [12]},
    }
    assert upward(edges) == [
        "coordinator/group/model.py:7: coordinator.group.model imports coordinator.server.app "
        "(layer 'pure cores' imports layer 'server')",
        "worker_client/worker.py:12: worker_client.worker imports coordinator.logs "
        "(worker_client never imports coordinator)",
    ]
    assert cycle_report(edges) == [
        "cycle: coordinator.server.app -> coordinator.server.connection -> coordinator.server.app",
        "  coordinator/server/app.py:52: coordinator.server.app imports coordinator.server.connection",
        "  coordinator/server/connection.py:65: coordinator.server.connection imports "
        "coordinator.server.app",
        "  coordinator/server/connection.py:90: coordinator.server.connection imports "
        "coordinator.server.app",
    ]


def test_the_checker_sees_every_kind_of_import() -> None:
    """Function-level, ``TYPE_CHECKING`` and relative imports are read, with their lines."""
    source = ("from typing import TYPE_CHECKING\n"
              "from . import model\n"
              "if TYPE_CHECKING:\n"
              "    from coordinator.server.app import CoordinatorServer\n"
              "def f():\n"
              "    import coordinator.cluster.node\n"
              "    from coordinator.security import ANONYMOUS\n")
    found = sorted(imports("coordinator.group.example", source), key=lambda found: found[1])
    assert found == [("coordinator.group.model", 2), ("coordinator.server.app", 4),
                     ("coordinator.cluster.node", 6), ("coordinator.security", 7)]
    assert layer_of("coordinator.group.example") < layer_of("coordinator.security")


CHECK = """
import sys
for module in {modules!r}:
    __import__(module)
bad = sorted(m for m in sys.modules if m == {forbidden!r} or m.startswith({forbidden!r} + "."))
print(",".join(bad))
"""


@pytest.mark.parametrize(("modules", "forbidden"), [
    (["coordinator.cli", "coordinator.server.app", "coordinator.runtime.shard",
      "coordinator.logs"], "worker_client"),
    (["worker_client.cli", "worker_client.worker", "worker_client.logs"], "coordinator"),
])
def test_one_side_never_imports_the_other(modules: list[str], forbidden: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK.format(modules=modules, forbidden=forbidden)],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "", f"{modules} imported {done.stdout.strip()}"


def test_both_logs_are_the_shared_setup() -> None:
    import connect_wire.logs
    import coordinator.logs
    import worker_client.logs

    assert coordinator.logs.configure is connect_wire.logs.configure
    assert worker_client.logs.configure is connect_wire.logs.configure
    assert worker_client.logs.emergency is connect_wire.logs.emergency
