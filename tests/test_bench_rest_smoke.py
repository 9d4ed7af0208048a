"""Smoke test of ``python -m bench rest``: tiny sizes (2 workers, 1 connector of 2 tasks, 1 and 4
clients, short windows, a 2 s session with a 500 ms heartbeat interval so each window sees
heartbeats) against a real daemon and real workers. Only the structure is checked, and that
every request was answered 2xx and no member was fenced; never the rates or latencies."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {"workload", "clients", "per_second", "p50_ms", "p99_ms", "not_ok", "worker_cpu_us",
            "daemon_cpu_us", "describes_per_request", "worker_cpu_share", "heartbeats", "max_gap_s",
            "max_gap_over_session", "gap_bucket_s", "fences", "lost", "runs"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=400)


def test_bench_rest_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "rest.json"
    result = _run("rest", "--workers", "2", "--connectors", "1", "--tasks", "2", "--clients", "1,4",
                  "--duration", "1.5", "--warmup", "0.2", "--repeat", "1", "--session-ms", "2000",
                  "--interval-ms", "500", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "rest"
    assert {"python", "cpus"} <= set(data["machine"])
    assert (data["settings"]["workers"], data["settings"]["session_ms"]) == (2, 2000)
    assert [(r["workload"], r["clients"]) for r in data["rows"]] == [("idle", 0)] + [
        (workload, clients) for clients in (1, 4) for workload in ("root", "status", "expand")]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS and len(row["runs"]) == 1
        assert row["fences"] == 0 and row["lost"] == 0, row  # no member was fenced
        assert row["not_ok"] == 0, row["runs"]  # every request answered 2xx
        assert row["heartbeats"] >= 1 and 0 < row["max_gap_over_session"] < 1, row
        if row["workload"] == "idle":
            assert row["per_second"] is None
        else:
            assert row["per_second"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
            assert (row["describes_per_request"] == 0) == (row["workload"] == "root"), row
    head = data["headline"]
    assert head["fenced"] == 0 and head["clients"] == 4 and head["workload"] == "status"
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("| workload | clients | req/s |") and lines[1].startswith("|---")
    assert sum(1 for line in lines if line.startswith("| ") and not line.startswith("| workload")) == 7
    assert lines[-1].startswith("headline: GET status at 4 clients: ")
    assert "of GET /; max heartbeat gap / session flooded " in lines[-1]
    assert lines[-1].endswith("; fenced 0")


def test_bench_rest_is_listed() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "rest" in listed.stdout.split()
