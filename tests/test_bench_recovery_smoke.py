"""Smoke test of ``python -m bench recovery``: it writes tiny logs, replays them in-process and
restarts a real daemon on them, and writes rows of the expected shape. Only the structure is
checked, never the timings."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {
    "records", "groups", "log_bytes", "write_seconds", "replay_seconds", "replay_per_second",
    "daemon_load_seconds", "daemon_load_per_second", "daemon_answer_seconds",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=180)


def test_bench_recovery_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "recovery.json"
    result = _run("recovery", "--sizes", "200,600", "--groups", "5", "--members", "3", "--repeat", "1",
                  "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "recovery"
    assert (data["repeat"], data["groups"], data["members"]) == (1, 5, 3)
    assert [row["records"] for row in data["rows"]] == [200, 600]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert row["groups"] == 5
        assert row["log_bytes"] > 0
        for key in ("replay_seconds", "replay_per_second", "daemon_answer_seconds"):
            assert isinstance(row[key], int | float)
    assert data["headline"]["records"] == 600
    lines = result.stdout.strip().splitlines()
    assert "replay rec/s" in lines[0]
    assert lines[-1].startswith("headline: ") and "records/s replayed at 600 records" in lines[-1]


def test_bench_recovery_rejects_bad_sizes(tmp_path: Path) -> None:
    result = _run("recovery", "--sizes", "ten", "--output", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert not (tmp_path / "x.json").exists()
