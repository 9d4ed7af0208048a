"""The simulator's small interfaces: each ``typing.Protocol`` a lower module declares for a higher
module's object (instead of importing it, which would close an import cycle) lists exactly what
that module uses of the object, and the real objects have all of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from simulation.engine import Simulation
from simulation.invariants import CheckedNode, WatchedWorker
from simulation.network import NetNode, NetWorker
from simulation.nodes import NodeHost
from simulation.scenarios import SCENARIOS
from simulation.worker_model import WorkerHost

SIMULATION = Path(__file__).resolve().parent.parent / "simulation"

# (protocol, its module, the expressions that module reaches the described object through)
USES = [
    (NodeHost, "nodes.py", {"sim", "self.sim"}),
    (WorkerHost, "worker_model.py", {"sim", "self.sim"}),
    (NetWorker, "network.py", {"w", "conn.worker", "find.conn.worker"}),
    (NetNode, "network.py", {"conn.node"}),
    (WatchedWorker, "invariants.py", {"w", "ow", "blocker", "run.worker", "old.worker",
                                      "new.worker", "ov.new.worker"}),
    (CheckedNode, "invariants.py", {"node"}),
]


def members(tree: ast.Module, protocol: str) -> set[str]:
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == protocol).body
    return ({n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            | {n.name for n in body if isinstance(n, ast.FunctionDef)})


def used(tree: ast.Module, through: set[str]) -> set[str]:
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and ast.unparse(n.value) in through}


@pytest.mark.parametrize(("protocol", "module", "through"), USES,
                         ids=[protocol.__name__ for protocol, _, _ in USES])
def test_each_interface_lists_exactly_what_its_module_uses(protocol: type, module: str,
                                                           through: set[str]) -> None:
    tree = ast.parse((SIMULATION / module).read_text())
    declared, needed = members(tree, protocol.__name__), used(tree, through)
    assert not needed - declared, f"{module} uses more than {protocol.__name__} declares"
    assert not declared - needed, f"{protocol.__name__} declares what {module} does not use"


def test_the_real_objects_have_every_member() -> None:
    sim = Simulation(SCENARIOS["rolling-bounce"], "incremental", 3, 12, 0)
    sim.run()
    worker, node = sim.workers[0], sim.coord
    assert isinstance(sim, NodeHost) and isinstance(sim, WorkerHost)
    assert isinstance(worker, NetWorker) and isinstance(worker, WatchedWorker)
    assert isinstance(node, NetNode) and isinstance(node, CheckedNode)
