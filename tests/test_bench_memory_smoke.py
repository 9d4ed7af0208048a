"""Smoke test of ``python -m bench memory``: with tiny groups it writes logs, starts real daemons on
them (and forms a tiny group through the wire), and writes rows of the expected shape. Only the
structure is checked, never the sizes: at a few members the RSS differences are noise."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {
    "source", "members", "tasks_per_member", "tasks", "items", "rss_kib", "delta_kib",
    "per_member_bytes", "traced_bytes", "hwm_kib", "runs_kib", "checked", "log_bytes",
    "formed_seconds", "in_process",
}
DERIVED_KEYS = {
    "source", "members", "tasks_low", "tasks_high", "per_member_gross_bytes", "per_task_bytes",
    "per_member_fixed_bytes", "traced_per_task_bytes", "traced_per_member_fixed_bytes",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=180)


def test_bench_memory_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "memory.json"
    result = _run("memory", "--members", "8,16", "--tasks-per-member", "1,3", "--wire-members", "4",
                  "--repeat", "1", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "memory"
    assert isinstance(data["machine"], dict) and data["machine"]["cpus"]
    assert (data["repeat"], data["members"], data["tasks_per_member"], data["wire_members"]) == (
        1, [8, 16], [1, 3], 4)
    shapes = [(r["source"], r["members"], r["tasks_per_member"]) for r in data["rows"]]
    assert shapes == [
        ("baseline", 0, 0),
        ("log", 8, 1), ("log", 8, 3), ("log", 16, 1), ("log", 16, 3),
        ("log+heartbeats", 8, 1), ("log+heartbeats", 8, 3),
        ("log+heartbeats", 16, 1), ("log+heartbeats", 16, 3),
        ("wire-reload", 4, 1), ("wire", 4, 1),
    ]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert isinstance(row["rss_kib"], int) and row["rss_kib"] > 0
        assert len(row["runs_kib"]) == 1
        if row["source"] == "baseline":
            assert row["checked"] is None and row["per_member_bytes"] is None
            continue
        # Every measured group was described and found as built: the daemon had loaded it.
        assert row["checked"] == {"error_code": 0, "members": row["members"], "state": "Stable",
                                  "items": row["items"], "distinct_items": row["items"]}
        assert isinstance(row["per_member_bytes"], int)
        if row["source"].startswith("log"):
            assert row["log_bytes"] > 0 and row["traced_bytes"] > 0
    profiled = [r for r in data["rows"] if r["in_process"]]
    assert [r["source"] for r in profiled] == ["log+heartbeats"] * 4
    for row in profiled:
        parts = row["in_process"]["parts_bytes"]
        assert {"members", "current", "target", "indexes", "soft"} <= set(parts)
        assert row["in_process"]["top_sites"]
    assert [(d["source"], d["members"]) for d in data["derived"]] == [
        ("log", 8), ("log", 16), ("log+heartbeats", 8), ("log+heartbeats", 16)]
    for d in data["derived"]:
        assert set(d) == DERIVED_KEYS
        assert isinstance(d["per_task_bytes"], int) and isinstance(d["traced_per_task_bytes"], int)
    assert data["headline"]["members"] == 16 and data["headline"]["wire_members"] == 4
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("| source | members |")
    assert lines[-1].startswith("headline: ") and "16 members x 1 tasks" in lines[-1]
    assert "4 members joined through the wire" in lines[-1]


def test_bench_memory_rejects_bad_arguments(tmp_path: Path) -> None:
    result = _run("memory", "--members", "ten", "--output", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert not (tmp_path / "x.json").exists()


def test_bench_memory_help_and_listed() -> None:
    helped = _run("memory", "--help")
    assert helped.returncode == 0 and "--tasks-per-member" in helped.stdout
    listed = _run("list")
    assert listed.returncode == 0 and "memory" in listed.stdout.split()
