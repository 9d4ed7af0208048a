"""Deterministic simulation of the connect group: the real coordinator core, the real worker
membership state machines and assignors, a simulated network, log and faults, one seed per run.

    >>> from simulation import run
    >>> result = run("worker-joins", "incremental", workers=3, tasks=10, seed=1)
    >>> result.metrics["double_running_ms"]
    0

``run(...)`` is deterministic: the same arguments give the same ``events`` and the same
``metrics`` (except ``wall_ms``), in any process. docs/simulation.md explains the model, the
faults, the invariants, the scenarios and the metrics.
"""

from __future__ import annotations

from .engine import RunResult, Simulation
from .scenarios import SCENARIOS, Fault, Scenario

ASSIGNORS = ("eager", "incremental")

METRIC_KEYS = (
    "scenario", "assignor", "workers", "tasks", "seed", "converged", "convergence_ms", "rebalances",
    "moved", "moved_min", "downtime_ms", "longest_outage_ms", "double_running_ms", "messages",
    "violation", "sim_ms", "wall_ms",
)
EVENT_KEYS = ("t_ms", "kind", "worker", "item", "epoch", "detail")


def run(scenario: str | Scenario, assignor: str, workers: int, tasks: int, seed: int,
        trace: bool = False) -> RunResult:
    """Simulate one run of ``scenario`` (a name in :data:`SCENARIOS`, or a Scenario) with
    ``workers`` workers using ``assignor`` ("eager" or "incremental") and ``tasks`` tasks.

    ``trace=True`` records the event trace in ``RunResult.events``."""
    if isinstance(scenario, str):
        try:
            scenario = SCENARIOS[scenario]
        except KeyError:
            raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})") from None
    return Simulation(scenario, assignor, workers, tasks, seed, trace).run()


__all__ = ["ASSIGNORS", "EVENT_KEYS", "METRIC_KEYS", "SCENARIOS", "Fault", "RunResult", "Scenario", "run"]
