"""The simulator's classic workers (simulation/classic_worker.py): Kafka Connect's worker
protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) through the coordinator core's classic
entry points, in groups of classic workers only, mixed groups and rolling migrations both ways,
with faults; and the checks catch a classic worker that keeps running what it reports stopped."""

from __future__ import annotations

from typing import Any

import pytest

from connect_wire.items import Item
from simulation import SCENARIOS, run
from simulation import faults as faults_module
from simulation.classic_worker import ClassicWorker

CLASSIC = sorted(name for name, s in SCENARIOS.items() if "classic" in s.tags)


def test_the_classic_scenarios_are_there() -> None:
    assert {"classic-group", "classic-long-partition", "classic-mixed", "classic-mixed-protocols",
            "migrate-to-new", "migrate-to-classic", "migrate-to-new-static", "migrate-to-classic-static",
            "migrate-faults", "migrate-back-faults", "migrate-nodes"} <= set(CLASSIC)
    for name in CLASSIC:  # (misbehaving stops are not a classic worker's: docs/simulation.md)
        s = SCENARIOS[name]
        assert not s.bad_stops and not s.slow_revocations and not s.slow_bounces


@pytest.mark.parametrize("scenario", CLASSIC)
@pytest.mark.parametrize("assignor", ["eager", "incremental"])
def test_classic_scenarios_hold_the_invariants_and_converge(scenario: str, assignor: str) -> None:
    for seed in (2, 3):
        m = run(scenario, assignor, workers=3, tasks=12, seed=seed).metrics
        assert m["violation"] == "" and m["converged"], (scenario, assignor, seed, m)
        assert m["double_running_ms"] == 0


def protocols_over_time(scenario: str, assignor: str, seed: int) -> list[tuple[str, str]]:
    events = run(scenario, assignor, workers=3, tasks=12, seed=seed, trace=True).events
    return [(str(e["worker"]), str(e["detail"])) for e in events if e["kind"] == "worker_start"]


def test_a_rolling_migration_replaces_classic_processes_by_new_ones_one_at_a_time() -> None:
    starts = protocols_over_time("migrate-to-new", "incremental", 3)
    first = starts[:3]
    assert [d.split(", ", 1)[1] for _, d in first] == ["classic sessioned"] * 3
    later = starts[3:]
    assert later and all("classic" not in d for _, d in later)  # each came back new-protocol
    back = protocols_over_time("migrate-to-classic", "eager", 3)
    assert all("classic" not in d for _, d in back[:3])
    assert back[3:] and all(d.endswith("classic default") for _, d in back[3:])


def test_classic_workers_run_the_items_and_the_sessioned_ones_keep_theirs_in_a_migration() -> None:
    r = run("migrate-to-new", "incremental", workers=3, tasks=12, seed=3, trace=True)
    assert r.metrics["converged"] and not r.metrics["violation"]
    assigned = [e for e in r.events if e["kind"] == "sync_response" and "assigned 0" not in str(e["detail"])]
    assert assigned  # classic workers were given items through SyncGroup
    # an untouched sessioned worker never stops anything while another worker is replaced
    # (only revocations the coordinator asks for, none "eager rejoin")
    assert not [e for e in r.events if "eager rejoin" in str(e["detail"])]


class RevocationIgnored(ClassicWorker):
    """A broken classic worker: told to revoke, it keeps running the items but reports them
    stopped (its rejoin's allocation leaves them out)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.kept: set[Item] = set()

    def _revoke(self, items: frozenset[Item], then: Any) -> None:
        self.kept |= items
        then()

    def _reported(self) -> frozenset[Item]:
        return frozenset(self.runs) - self.kept


def test_the_checks_catch_a_classic_worker_that_ignores_revocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults_module, "ClassicWorker", RevocationIgnored)
    caught = []
    for seed in range(4):
        m = run("classic-group", "incremental", workers=3, tasks=12, seed=seed).metrics
        caught.append("at once" in str(m["violation"]))
    assert all(caught), caught
    monkeypatch.undo()
    for seed in range(4):  # the real one, same seeds
        assert run("classic-group", "incremental", workers=3, tasks=12, seed=seed).metrics["violation"] == ""


class NoStopOnSessionLoss(ClassicWorker):
    """A classic worker without the rule: cut off, it runs its items on past its session."""

    def _watchdog(self, due: int) -> None:
        if not self.classic:
            super()._watchdog(due)


def test_without_the_stop_on_session_loss_a_cut_off_classic_worker_runs_items_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # seeds 2 and 5: the cut-off worker holds items the coordinator hands on after its hold
    monkeypatch.setattr(faults_module, "ClassicWorker", NoStopOnSessionLoss)
    for seed in (2, 5):
        m = run("classic-long-partition", "incremental", workers=3, tasks=12, seed=seed).metrics
        assert "at once" in str(m["violation"]), (seed, m)
    monkeypatch.undo()
    for seed in (2, 5):
        m = run("classic-long-partition", "incremental", workers=3, tasks=12, seed=seed).metrics
        assert m["violation"] == "" and m["converged"], (seed, m)
