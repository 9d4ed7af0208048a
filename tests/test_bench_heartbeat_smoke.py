"""Smoke test of ``python -m bench heartbeat``: it runs with tiny sizes and writes rows of the
expected shape. Only the structure is checked, never the timings."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {
    "members", "connectors", "tasks", "state", "build_seconds", "heartbeat_us", "min_us", "max_us",
    "one_member_us",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=120)


def test_bench_heartbeat_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "heartbeat.json"
    result = _run("heartbeat", "--sizes", "10,50", "--repeat", "1", "--number", "20",
                  "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "heartbeat"
    assert (data["repeat"], data["number"]) == (1, 20)
    assert [row["members"] for row in data["rows"]] == [10, 50]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert row["state"] == "Stable"
        assert isinstance(row["connectors"], int) and row["connectors"] >= 1
        assert row["tasks"] >= 2 * row["members"]
        for key in ("build_seconds", "heartbeat_us", "min_us", "max_us", "one_member_us"):
            assert isinstance(row[key], int | float)
    headline = data["headline"]
    assert headline["sizes"] == [10, 50]
    assert isinstance(headline["ratio"], int | float)
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("headline: time per heartbeat at 50 members / at 10 members: ")
    assert "us/heartbeat" in lines[0]


def test_bench_heartbeat_rejects_bad_sizes(tmp_path: Path) -> None:
    result = _run("heartbeat", "--sizes", "ten", "--output", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert "--sizes" in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_bench_heartbeat_is_listed() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "heartbeat" in listed.stdout.split()
