"""The simulation pipeline through real Spark: sweep -> Parquet -> report, and analyze on real logs.

One SparkSession (``local[2]``) for the whole module: it takes ~5-10 s to start. These tests are
never skipped: without PySpark (or Java) they fail, as the pipeline would.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simulation
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from coordinator.admin import AdminClient
from coordinator.group import records as rec
from coordinator.group.model import (
    ConnectorSpec,
    CurrentAssignment,
    Item,
    MemberMetadata,
    MemberState,
    TargetMember,
)
from coordinator.runtime import serde
from coordinator.runtime.log import PartitionLog, partition_dir
from simulation import analyze, report, sweep
from simulation.spark import session
from tests.daemon_fixture import DaemonPool

# PySpark 4.x with pandas 3 (see simulation/spark.py's quiet_pandas_warning).
pytestmark = [
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
    pytest.mark.filterwarnings("ignore:.*PySpark does not yet fully support pandas"),
]

# Two of seed 003's use cases, both assignors, one tiny size.
SCENARIOS = ("process-death-quick-restart", "rolling-bounce")
SIZES = ((3, 6),)
SEEDS = 60
TRACE_SAMPLE = 2


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    s = session("local[2]")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def swept(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[sweep.SweepConfig, Any, Path]:
    out = tmp_path_factory.mktemp("sweep")
    config = sweep.SweepConfig(scenarios=SCENARIOS, assignors=tuple(simulation.ASSIGNORS), sizes=SIZES,
                               seeds=SEEDS, seed_start=100, batch_size=30, trace_sample=TRACE_SAMPLE)
    summary = sweep.run_sweep(spark, config, out, progress=True, progress_interval_s=0.5)
    return config, summary, out


def _results(out: Path) -> pd.DataFrame:
    return report.load(out).results


# == sweep ============================================================================================


def test_scenarios_used_here_exist() -> None:
    for name in SCENARIOS:
        assert name in simulation.SCENARIOS
    assert tuple(simulation.ASSIGNORS) == ("eager", "incremental")


def test_sweep_writes_partitioned_parquet(swept: Any) -> None:
    config, summary, out = swept
    total = len(SCENARIOS) * 2 * len(SIZES) * SEEDS
    assert summary.runs == config.total_runs == total
    for scenario in SCENARIOS:
        for assignor in simulation.ASSIGNORS:
            part = out / "results" / f"scenario={scenario}" / f"assignor={assignor}"
            assert list(part.glob("*.parquet")), part
    results = _results(out)
    assert len(results) == total
    expected = {name for name, _ in sweep.METRIC_COLUMNS + sweep.EXTRA_COLUMNS}
    assert set(results.columns) == expected
    per_combo = results.groupby(["scenario", "assignor", "workers", "tasks"])["seed"]
    assert (per_combo.nunique() == SEEDS).all()
    assert (per_combo.min() == 100).all() and (per_combo.max() == 100 + SEEDS - 1).all()
    assert (results["error"] == "").all(), results.loc[results["error"] != "", "error"].tolist()
    # Traced: the first TRACE_SAMPLE seeds of every combination (and any violation), and the
    # traced rerun reproduced the metrics.
    sampled = results[results["seed"] < 100 + TRACE_SAMPLE]
    assert sampled["traced"].all()
    traced = results[results["traced"]]
    assert traced["trace_consistent"].astype(bool).all()
    assert (results.loc[~results["traced"], "trace_events"].isna()).all()
    events = report.load(out).events
    assert events is not None and len(events) == summary.events > 0
    keys = set(map(tuple, traced[list(sweep.KEY_COLUMNS)].to_numpy().tolist()))
    assert set(map(tuple, events[list(sweep.KEY_COLUMNS)].drop_duplicates().to_numpy().tolist())) <= keys
    assert {"t_ms", "kind", "worker", "item", "epoch", "detail", "seq"} <= set(events.columns)
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["runs"] == total and manifest["master"] == "local[2]"
    assert manifest["runs_per_s"] > 0


def test_sweep_matches_simulation_run(swept: Any) -> None:
    """The rows are exactly what simulation.run gives in this process (deterministic per seed)."""
    _, _, out = swept
    results = _results(out).set_index(list(sweep.KEY_COLUMNS))
    checks = [(SCENARIOS[0], "eager", 101), (SCENARIOS[1], "incremental", 100 + SEEDS - 1)]
    for scenario, assignor, seed in checks:
        metrics = simulation.run(scenario, assignor, 3, 6, seed).metrics
        row = results.loc[(scenario, assignor, 3, 6, seed)]
        for name, _ in sweep.METRIC_COLUMNS:
            if name in sweep.KEY_COLUMNS or name == "wall_ms":
                continue
            assert row[name] == metrics[name], (name, row[name], metrics[name])


def test_aggregates_are_consistent_with_the_rows(swept: Any) -> None:
    _, summary, out = swept
    data = report.load(out)
    results, aggregates = data.results, data.aggregates
    assert len(aggregates) == len(SCENARIOS) * 2 * len(SIZES)
    for agg in aggregates.to_dict("records"):
        rows = results[(results["scenario"] == agg["scenario"]) & (results["assignor"] == agg["assignor"])
                       & (results["workers"] == agg["workers"]) & (results["tasks"] == agg["tasks"])]
        assert agg["runs"] == agg["seeds"] == len(rows) == SEEDS
        converged = rows[rows["converged"]]
        assert agg["converged_runs"] == len(converged)
        assert agg["converged_ratio"] == pytest.approx(len(converged) / SEEDS)
        if len(converged):
            conv = converged["convergence_ms"].to_numpy()
            assert agg["convergence_p50"] == pytest.approx(np.percentile(conv, 50))
            assert agg["convergence_p95"] == pytest.approx(np.percentile(conv, 95))
            assert agg["convergence_max"] == conv.max()
        assert agg["downtime_mean"] == pytest.approx(rows["downtime_ms"].mean())
        assert agg["downtime_p95"] == pytest.approx(np.percentile(rows["downtime_ms"], 95))
        assert agg["moved_total"] == rows["moved"].sum()
        assert agg["moved_min_total"] == rows["moved_min"].sum()
        assert agg["rebalances_max"] == rows["rebalances"].max()
        assert agg["double_running_max"] == rows["double_running_ms"].max()
        assert agg["violations"] == (rows["violation"] != "").sum()
        bad = sorted(rows.loc[rows["violation"] != "", "seed"])[:20]
        assert list(agg["violation_seeds"]) == bad
    assert aggregates["violations"].sum() == summary.violations


def test_sweep_cli_in_process(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m simulation sweep`` arguments end to end, on the module's session (not stopped)."""
    out = tmp_path / "cli"
    code = sweep.main(["--seeds", "4", "--out", str(out), "--scenarios", SCENARIOS[0], "--assignors",
                       "eager,incremental", "--sizes", "2:4", "--batch-size", "3", "--master", "local[2]"])
    assert code == 0
    err = capsys.readouterr().err
    assert "8/8 runs done" in err and "sweep: 8 runs in" in err
    assert len(_results(out)) == 8
    assert not spark.sparkContext._jsc.sc().isStopped()
    with pytest.raises(SystemExit):
        sweep.main(["--seeds", "1", "--out", str(out), "--scenarios", "no-such-scenario"])


def test_config_and_sizes_validation() -> None:
    assert sweep.parse_sizes("3:12, 5:40,3:12") == ((3, 12), (5, 40))
    for bad in ("3", "a:b", ""):
        with pytest.raises(ValueError):
            sweep.parse_sizes(bad)
    with pytest.raises(ValueError):
        sweep.SweepConfig(scenarios=("x",), assignors=("eager",), sizes=((0, 1),), seeds=1)
    config = sweep.SweepConfig(scenarios=("a", "b"), assignors=("eager",), sizes=((1, 2), (3, 4)), seeds=5)
    assert config.total_runs == 20 and config.combinations()[1] == ("a", "eager", 3, 4)


def test_a_crashing_run_is_a_row_not_the_end_of_the_sweep() -> None:
    class Result:
        def __init__(self, seed: int, trace: bool) -> None:
            self.metrics = {name: 0 for name, _ in sweep.METRIC_COLUMNS}
            self.metrics.update(seed=seed, violation="boom" if seed == 2 else "", converged=True, wall_ms=1.5)
            self.events = [{"t_ms": i, "kind": "k", "worker": "w", "item": "", "epoch": 1, "detail": ""}
                           for i in range(10)] if trace else []

    def fake_run(scenario: str, assignor: str, workers: int, tasks: int, seed: int,
                 trace: bool = False) -> Any:
        if seed == 1:
            raise RuntimeError("simulator bug")
        return Result(seed, trace)

    config = sweep.SweepConfig(scenarios=("s",), assignors=("eager",), sizes=((2, 2),), seeds=4,
                               trace_sample=1, max_trace_events=4)
    rows = pd.DataFrame({"scenario": ["s"] * 4, "assignor": ["eager"] * 4, "workers": [2] * 4,
                         "tasks": [2] * 4, "seed": [0, 1, 2, 3]})
    out, done = sweep.simulate_rows(rows, config, run_fn=fake_run)
    assert done == 4
    by_seed = {r["seed"]: r for r in out}
    assert by_seed[1]["error"] == "RuntimeError: simulator bug" and by_seed[1]["downtime_ms"] is None
    assert by_seed[1]["traced"] and by_seed[1]["trace_consistent"]  # the rerun crashed the same way
    assert by_seed[0]["traced"] and not by_seed[3]["traced"]  # sampled; plain
    assert by_seed[2]["traced"] and by_seed[2]["trace_events"] == 10
    assert [e["seq"] for e in by_seed[2]["events"]] == [0, 1, 8, 9]  # head and tail kept
    frame = sweep._frame(out)
    assert str(frame["downtime_ms"].dtype) == "Int64" and frame["downtime_ms"].isna().sum() == 1


def test_a_hanging_run_times_out() -> None:
    def slow_run(scenario: str, assignor: str, workers: int, tasks: int, seed: int,
                 trace: bool = False) -> Any:
        time.sleep(5)

    config = sweep.SweepConfig(scenarios=("s",), assignors=("eager",), sizes=((2, 2),), seeds=1,
                               trace_sample=0, trace_violations=0, run_timeout_s=0.2)
    rows = pd.DataFrame({"scenario": ["s"], "assignor": ["eager"], "workers": [2], "tasks": [2], "seed": [7]})
    started = time.monotonic()
    (row,), _ = sweep.simulate_rows(rows, config, run_fn=slow_run)
    assert time.monotonic() - started < 2
    assert row["error"] == "simulation.sweep.RunTimeout: the run took more than 0.2 s (wall clock)"


def test_progress_lines() -> None:
    class Counter:
        value = 0

    counter, stream = Counter(), io.StringIO()
    with sweep.Progress(counter, 10, interval_s=0.05, stream=stream):
        time.sleep(0.12)
        counter.value = 4
        time.sleep(0.12)
        counter.value = 10
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("sweep: 0/10 runs done")
    assert any(line.startswith("sweep: 4/10 runs done (40%)") for line in lines)
    assert lines[-1].startswith("sweep: 10/10 runs done (100%)")


# == report ===========================================================================================


def test_report_from_the_sweep_parquet(swept: Any, tmp_path: Path) -> None:
    _, _, out = swept
    index = report.write_report(out, tmp_path / "report")
    assert index == tmp_path / "report" / "index.html"
    for name, _ in report.FIGURES:
        png = tmp_path / "report" / name
        assert png.exists() and png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = index.read_text()
    md = (tmp_path / "report" / "report.md").read_text()
    for text in (page, md):
        for scenario in SCENARIOS:
            assert scenario in text
        assert "Seed 003" in text and "Kubernetes process death" in text and "Rolling bounce" in text
        assert "IncrementalCooperative" in text and "Eager" in text
        assert "Invariant violations" in text
    for name, _ in report.FIGURES:
        assert f'src="{name}"' in page and f"]({name})" in md
    # The characterisation table: an Eager and an IncrementalCooperative row per scenario of a
    # seed 003 use case, with numbers, and a verdict on the incremental row.
    results = _results(out)
    table = report.characterisation(results)
    assert table.headers == report.CHARACTERISATION_HEADERS
    measured = {(row[1], row[2]): row for row in table.rows}
    for scenario in SCENARIOS:
        for assignor in ("Eager", "IncrementalCooperative"):
            row = measured[(scenario, assignor)]
            assert len(row) == len(table.headers)
            rows = results[(results["scenario"] == scenario)
                           & (results["assignor"] == assignor.lower().replace("cooperative", ""))]
            assert row[4] == f"{rows['rebalances'].mean():.1f}"
            assert row[11] == str((rows["violation"] != "").sum())
        verdict = measured[(scenario, "IncrementalCooperative")][12]
        assert verdict.split(":")[0] in ("YES", "NO", "SIMILAR")
    assert "Scale up/down" in page  # listed, as not in this sweep
    violations = results[results["violation"] != ""]
    for r in violations.head(5).itertuples():
        assert html_escape(report.replay_command(r.scenario, r.assignor, r.workers, r.tasks, r.seed)) in page


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


def test_report_lists_violations_with_replay_commands(tmp_path: Path) -> None:
    """A sweep output with a violating run (written by hand: the simulator should have none)."""
    rows = []
    for assignor in ("eager", "incremental"):
        for seed in range(5):
            row = {name: 1 for name, _ in sweep.METRIC_COLUMNS}
            row.update(scenario="scale-up-down", assignor=assignor, workers=3, tasks=6, seed=seed,
                       converged=True, convergence_ms=100 * seed, violation="", wall_ms=1.0,
                       downtime_ms=10 * (seed + 1), error="", traced=False, trace_events=None,
                       trace_consistent=None)
            if assignor == "incremental" and seed == 3:
                row["violation"] = "A/0 runs on two workers"
            rows.append(row)
    frame = pd.DataFrame(rows)
    (tmp_path / "in" / "results").mkdir(parents=True)
    frame.to_parquet(tmp_path / "in" / "results" / "part-0.parquet")
    report.write_report(tmp_path / "in", tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "A/0 runs on two workers" in page
    assert ("python -m simulation replay 3 --scenario scale-up-down --assignor incremental --workers 3 "
            "--tasks 6") in page
    assert report.use_case_of("scale-up-down").title == "Scale up/down"
    assert report.use_case_of("rolling-bounce-static").key == "rolling_bounce"
    assert report.use_case_of("worker-joins") is None


# == analyze ==========================================================================================

T0 = 1_700_000_000_000
ITEMS = ["A", "A/0", "A/1", "B", "B/0"]


def _items(texts: list[str]) -> frozenset[Item]:
    return frozenset(Item.parse(t) for t in texts)


def _member(mid: str) -> rec.Record:
    return rec.group_member("g", MemberMetadata(mid, None, None, f"client-{mid}", "127.0.0.1", 30_000, ()))


def _current(mid: str, epoch: int, prev: int, state: MemberState, assigned: list[str],
             revoking: tuple[str, ...] | list[str] = ()) -> rec.Record:
    return rec.current_assignment("g", mid, CurrentAssignment(epoch, prev, state, _items(assigned),
                                                              _items(list(revoking))))


def _write_log(data_dir: Path) -> None:
    """A group's life written with PartitionLog, as the daemon's shard would (partition 3)."""
    log, _ = PartitionLog.open(partition_dir(data_dir, 3))
    PartitionLog.open(partition_dir(data_dir, 0))[0].close()  # an empty partition
    batches: list[tuple[int, list[rec.Record]]] = [
        (0, [rec.group_metadata("g", 0),
             rec.group_connectors("g", 0, [ConnectorSpec("A", 2), ConnectorSpec("B", 1)]),
             rec.target_metadata("g", 0, 0, b"", -1)]),
        (1000, [_member("W1"), _current("W1", 0, 0, MemberState.STABLE, []), rec.group_metadata("g", 1)]),
        (1100, [rec.target_member("g", "W1", TargetMember(_items(ITEMS))),
                rec.target_metadata("g", 1, 0, b"", -1)]),
        (1150, [_current("W1", 1, 0, MemberState.STABLE, ITEMS)]),
        (3000, [_member("W2"), _current("W2", 0, 0, MemberState.STABLE, []), rec.group_metadata("g", 2),
                _current("W2", 1, 0, MemberState.STABLE, [])]),
        (3050, [rec.target_member("g", "W1", TargetMember(_items(["A", "A/0", "A/1"]))),
                rec.target_member("g", "W2", TargetMember(_items(["B", "B/0"]))),
                rec.target_metadata("g", 2, 0, b"", -1)]),
        (3060, [_current("W2", 2, 1, MemberState.UNRELEASED_ITEMS, [])]),
        (3070, [_current("W1", 1, 0, MemberState.UNREVOKED_ITEMS, ["A", "A/0", "A/1"], ["B", "B/0"])]),
        (3200, [_current("W1", 2, 1, MemberState.STABLE, ["A", "A/0", "A/1"])]),
        (3300, [_current("W2", 2, 1, MemberState.STABLE, ["B", "B/0"])]),
        # W2 leaves: epoch 3 holds its work for a scheduled rebalance (at +20 s), nobody moves yet.
        (5000, [rec.tombstone(_current("W2", 0, 0, MemberState.STABLE, []).key),
                rec.tombstone(rec.target_member("g", "W2", TargetMember(frozenset())).key),
                rec.tombstone(_member("W2").key), rec.group_metadata("g", 3)]),
        (5100, [rec.target_metadata("g", 3, 0, b"", T0 + 20_000)]),
        (5150, [_current("W1", 3, 2, MemberState.STABLE, ["A", "A/0", "A/1"])]),
    ]
    for at, records in batches:
        log.append([serde.encode_record(r) for r in records], timestamp_ms=T0 + at)
    log.sync()
    log.close()


def test_read_partition_is_read_only_and_stops_at_a_torn_tail(tmp_path: Path) -> None:
    _write_log(tmp_path / "data")
    directory = partition_dir(tmp_path / "data", 3)
    segment = next(directory.glob("*.log"))
    clean = analyze.read_partition(directory)
    assert len(clean.batches) == 13 and clean.notes == []
    with open(segment, "ab") as f:  # a batch being written by a running daemon
        f.write(b"\x01\x00\x00\x01\x00")
    size = segment.stat().st_size
    torn = analyze.read_partition(directory)
    assert len(torn.batches) == 13 and len(torn.notes) == 1 and "stopped at byte" in torn.notes[0]
    assert segment.stat().st_size == size and not (directory / "corrupt").exists()


def test_analyze_a_log_written_with_partition_log(spark: Any, tmp_path: Path) -> None:
    _write_log(tmp_path / "data")
    result = analyze.analyze(spark, tmp_path / "data", tmp_path / "out")
    ev = result.events
    assert len(ev) == 26  # records written
    assert set(ev["partition"]) == {3} and result.partitions == 2
    assert list(ev.loc[ev["kind"] == "group_epoch", "epoch"]) == [0, 1, 2, 3]
    assert list(ev.loc[ev["kind"] == "target_epoch", "epoch"]) == [0, 1, 2, 3]
    assert ev.loc[ev["kind"] == "member_epoch", "t_ms"].min() == T0 + 1000
    assert set(ev["kind"]) >= {"member_joined", "member_left", "target", "target_removed",
                               "member_epoch_removed", "connectors"}
    tl = result.timeline.set_index("group_epoch")
    assert list(tl.index) == [0, 1, 2, 3]
    assert tl.loc[0, "status"] == "created" and tl.loc[0, "cause"] == "connectors A:2 B:1"
    assert tl.loc[1, "cause"] == "W1 joined"
    assert tl.loc[1, "compute_ms"] == 100 and tl.loc[1, "duration_ms"] == 150
    assert tl.loc[1, "assigned_new"] == 5 and tl.loc[1, "moved"] == 0
    assert tl.loc[2, "cause"] == "W2 joined" and tl.loc[2, "compute_ms"] == 50
    assert tl.loc[2, "duration_ms"] == 300 and tl.loc[2, "status"] == "reconciled"
    assert tl.loc[2, "moved"] == 2 and tl.loc[2, "moved_items"] == "B: W1->W2, B/0: W1->W2"
    assert tl.loc[2, "revocations"] == 1
    assert tl.loc[3, "cause"] == "W2 left" and tl.loc[3, "moved"] == 0 and tl.loc[3, "unassigned"] == 2
    assert tl.loc[3, "scheduled_rebalance_at_ms"] == T0 + 20_000 and tl.loc[3, "duration_ms"] == 150
    # Parquet and Markdown.
    assert len(pd.read_parquet(tmp_path / "out" / "events")) == 26
    assert len(pd.read_parquet(tmp_path / "out" / "timeline")) == 4
    text = analyze.render_markdown(result, tmp_path / "data")
    assert "## Group `g`" in text and "epoch 2 moved: B: W1->W2, B/0: W1->W2" in text
    assert "| 2 | +3,000 | W2 joined | 2 | 50 | 300 | 2 | 0 | 1 | reconciled |" in text
    assert "a rebalance was scheduled for +20,000 ms" in text


class _Worker:
    """A worker over KRPC, the minimum of tests/test_daemon_e2e.py's."""

    def __init__(self, port: int, member_id: str) -> None:
        self.client = AdminClient("127.0.0.1", port, client_id=f"worker-{member_id}")
        self.member_id, self.epoch = member_id, 0

    def hb(self, owned: list[str] | None = None, epoch: int | None = None) -> Any:
        epoch = self.epoch if epoch is None else epoch
        fields: dict[str, Any] = {}
        if epoch == 0:
            assignor = _hb.Assignor(name="incremental", minimum_version=0, maximum_version=1, reason=0,
                                    metadata_version=1, metadata_bytes=b"")
            fields.update(client_assignors=(assignor,), rebalance_timeout_ms=30_000, instance_id=None)
            owned = owned or []
        if owned is not None:
            items = [Item.parse(t) for t in sorted(owned)]
            fields["owned_connectors"] = tuple(i.connector for i in items if i.is_connector)
            fields["owned_tasks"] = tuple(_hb.TaskId(connector=i.connector, task=i.task) for i in items
                                          if not i.is_connector)
        r = self.client.call(ConnectGroupHeartbeatRequest(group_id="g", member_id=self.member_id,
                                                          member_epoch=epoch, max_wait_ms=0, **fields))
        assert r.error_code == 0, r
        self.epoch = r.member_epoch
        return r

    def compute(self, assignment: dict[str, list[str]]) -> None:
        prepared = self.client.call(ConnectGroupPrepareAssignmentRequest(
            group_id="g", member_id=self.member_id, member_epoch=self.epoch))
        assert prepared.error_code == 0, prepared
        members = []
        for mid, texts in assignment.items():
            items = [Item.parse(t) for t in sorted(texts)]
            members.append(_inst.MemberAssignment(
                member_id=mid, connectors=tuple(i.connector for i in items if i.is_connector),
                tasks=tuple(_inst.TaskId(connector=i.connector, task=i.task)
                            for i in items if not i.is_connector),
                metadata_version=0, metadata_bytes=b""))
        installed = self.client.call(ConnectGroupInstallAssignmentRequest(
            group_id="g", member_id=self.member_id, member_epoch=self.epoch, group_epoch=prepared.group_epoch,
            error=0, assignor_state=b"", scheduled_rebalance_delay_ms=-1, members=tuple(members)))
        assert installed.error_code == 0, installed


def test_analyze_the_real_daemons_log(spark: Any, tmp_path: Path) -> None:
    """Drive seed 000's W1 joins / W2 joins / W2 leaves through a real daemon, then analyze the
    log it wrote, once while it runs and once after it stopped."""
    with DaemonPool(tmp_path) as pool:
        # Sessions long enough that nobody expires while Spark reads the log (seconds, on a busy
        # machine): every epoch in the log is one this test caused.
        d = pool.start(extra_env={"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "120000",
                                  "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "5000"})
        with AdminClient(d.host, d.port) as admin:
            r = admin.call(ConnectGroupAlterConnectorsRequest(
                group_id="g", upserts=(_alter.ConnectorSpec(name="A", task_count=2, config=()),
                                       _alter.ConnectorSpec(name="B", task_count=1, config=())),
                deletes=(), validate_only=False))
            assert r.error_code == 0
        w1, w2 = _Worker(d.port, "W1"), _Worker(d.port, "W2")
        w1.hb()
        w1.compute({"W1": ITEMS})
        w1.hb()
        w2.hb()
        assert w1.hb(owned=ITEMS).should_compute_assignment
        w1.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
        w2.hb(owned=[])
        w1.hb(owned=ITEMS)
        w1.hb(owned=["A", "A/0", "A/1"])
        w2.hb(owned=[])
        running = analyze.analyze(spark, d.data_dir)  # read only, while the daemon runs
        assert list(running.timeline["group_epoch"]) == [0, 1, 2]
        w2.hb(epoch=-1)  # leaves
        w2.client.close()
        w1.hb(owned=["A", "A/0", "A/1"])
        w1.compute({"W1": ITEMS})
        w1.hb(owned=["A", "A/0", "A/1"])
        w1.client.close()
        d.stop()
    result = analyze.analyze(spark, d.data_dir, tmp_path / "analysis")
    tl = result.timeline.set_index("group_epoch")
    assert list(tl.index) == [0, 1, 2, 3]
    assert list(tl["status"]) == ["created", "reconciled", "reconciled", "reconciled"]
    assert list(tl["cause"])[1:] == ["W1 joined", "W2 joined", "W2 left"]
    assert tl.loc[2, "moved_items"] == "B: W1->W2, B/0: W1->W2"
    assert tl.loc[3, "moved_items"] == "B: W2->W1, B/0: W2->W1"
    assert (tl.loc[1:, "duration_ms"] >= tl.loc[1:, "compute_ms"]).all()
    ev = result.events
    assert list(ev.loc[ev["kind"] == "group_epoch", "epoch"]) == [0, 1, 2, 3]
    assert set(ev.loc[ev["kind"] == "member_epoch", "worker"]) == {"W1", "W2"}
    assert (tmp_path / "analysis" / "timeline").is_dir()


def test_analyze_cli_in_process(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_log(tmp_path / "data")
    assert analyze.main(["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "# Rebalance timeline of" in out and "W2 left" in out
    assert (tmp_path / "out" / "timeline.md").read_text().strip() == out.strip()
    assert analyze.main(["--data-dir", str(tmp_path / "nope")]) == 2
