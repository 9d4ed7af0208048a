"""Smoke test of ``python -m bench throughput``: it runs with tiny sizes against a real daemon and
the echo server and writes rows of the expected shape. Only the structure is checked, never the
rates or latencies."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {"server", "connections", "members", "in_flight", "per_second", "p50_us", "p99_us", "runs",
            "checked"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=180)


def test_bench_throughput_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "throughput.json"
    result = _run("throughput", "--members", "6", "--connections", "1,3", "--repeat", "1",
                  "--duration", "0.2", "--warmup", "0.05", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "throughput"
    assert (data["repeat"], data["members"]) == (1, 6)
    assert [(r["server"], r["connections"]) for r in data["rows"]] == [
        ("coordinator", 1), ("echo", 1), ("coordinator", 3), ("echo", 3)]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert row["members"] == 6 and len(row["runs"]) == 1
        for key in ("per_second", "p50_us", "p99_us"):
            assert isinstance(row[key], int | float)
    assert all(r["checked"] > 0 for r in data["rows"] if r["server"] == "coordinator")
    assert data["headline"]["connections"] == 3
    assert isinstance(data["headline"]["ratio"], int | float)
    lines = result.stdout.strip().splitlines()
    assert "req/s" in lines[0]
    assert lines[-1].startswith("headline: coordinator / ceiling at 3 connections: ")


def test_bench_throughput_is_listed() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "throughput" in listed.stdout.split()
