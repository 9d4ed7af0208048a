"""Smoke test of ``python -m bench convergence``: it runs with a tiny group against a real daemon
(both modes, all three events, one repetition) and writes rows of the expected shape. Only the
structure is checked, never the timings."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {
    "members", "event", "mode", "ms", "rtt_us", "apiversions_rtt_us", "echo_rtt_us", "rtts",
    "echo_rtts", "assign_ms", "rtts_without_assignor", "from_crash_ms", "computations", "epochs",
    "heartbeats", "fsyncs", "fsync_ms", "sim_cpu", "sim_cpu_wait", "daemon_cpu", "daemon_cpu_wait",
    "runs_ms",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=180)


def test_bench_convergence_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "convergence.json"
    result = _run("convergence", "--sizes", "3", "--repeat", "1", "--session-timeout-ms", "2000",
                  "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "convergence"
    assert (data["repeat"], data["sizes"], data["session_timeout_ms"]) == (1, [3], 2000)
    assert "machine" in data and "cpus" in data
    assert [(r["members"], r["event"], r["mode"]) for r in data["rows"]] == [
        (3, event, mode) for event in ("join", "crash", "connector") for mode in ("long", "plain")]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert len(row["runs_ms"]) == 1
        for key in ("ms", "rtt_us", "rtts", "assign_ms", "rtts_without_assignor", "heartbeats"):
            assert isinstance(row[key], int | float)
        assert row["computations"] >= 1 and row["epochs"] >= 1
        assert (row["from_crash_ms"] is None) == (row["event"] != "crash")
    assert len(data["samples"]) == 6
    headline = data["headline"]
    assert (headline["members"], headline["event"], headline["mode"]) == (3, "join", "long")
    assert isinstance(headline["met"], bool)
    lines = result.stdout.strip().splitlines()
    assert "RTTs" in lines[0] and "assignor ms" in lines[0]
    assert lines[-1].startswith("headline: join at 3 members, long-polled: ")
    assert "RTT + assignor" in lines[-1]


def test_bench_convergence_options() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "convergence" in listed.stdout.split()
    helped = _run("convergence", "--help")
    assert helped.returncode == 0
    for option in ("--sizes", "--modes", "--events", "--repeat", "--session-timeout-ms", "--output"):
        assert option in helped.stdout
    bad = _run("convergence", "--modes", "sometimes")
    assert bad.returncode == 2
