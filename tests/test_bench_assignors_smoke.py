"""Smoke test of ``python -m bench assignors``: it runs with tiny sizes and writes rows of the
expected shape. Only the structure is checked, never the timings."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {
    "assignor", "scenario", "workers", "tasks", "connectors", "seconds", "peak_mib", "state_bytes",
    "delay_ms",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=120)


def test_bench_assignors_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "assignors.json"
    result = _run("assignors", "--workers", "3,5", "--tasks", "20,40", "--tasks-per-connector", "4",
                  "--repeat", "1", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "assignors"
    assert (data["repeat"], data["tasks_per_connector"]) == (1, 4)
    rows = data["rows"]
    sizes = [(w, t) for w in (3, 5) for t in (20, 40)]
    expected = [
        ("eager", "full"), ("incremental", "initial"), ("incremental", "join"),
        ("incremental", "leave"), ("incremental", "expire"),
    ]
    assert [(r["workers"], r["tasks"], r["assignor"], r["scenario"]) for r in rows] == [
        (w, t, a, s) for w, t in sizes for a, s in expected
    ]
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["connectors"] == row["tasks"] // 4
        for key in ("seconds", "peak_mib"):
            assert isinstance(row[key], int | float) and row[key] >= 0
        assert isinstance(row["state_bytes"], int)
        # Only the departure holds work (and asks for a rebalance); eager keeps no state.
        assert (row["delay_ms"] > 0) == (row["scenario"] == "leave")
        assert (row["state_bytes"] == 0) == (row["assignor"] == "eager")
    headline = data["headline"]
    assert (headline["assignor"], headline["workers"], headline["tasks"]) == ("incremental", 5, 40)
    assert headline["scenario"] in ("initial", "join", "leave", "expire")
    assert isinstance(headline["seconds"], int | float) and headline["target_seconds"] == 0.5
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("headline: incremental 5 workers x 40 tasks: ")
    assert lines[0].split()[:2] == ["assignor", "scenario"]


def test_bench_assignors_rejects_bad_sizes(tmp_path: Path) -> None:
    result = _run("assignors", "--workers", "ten", "--output", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert "--workers" in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_bench_assignors_is_listed() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "assignors" in listed.stdout.split()
