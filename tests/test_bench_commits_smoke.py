"""Smoke test of ``python -m bench commits``: it runs with tiny sizes against a real daemon on
the file store and a real etcd node, every commit and heartbeat accepted, and writes rows of the
expected shape. Only the structure and the counts are checked, never the rates or latencies."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

ROW_KEYS = {"store", "phase", "kind", "in_flight", "per_second", "p50_us", "p99_us",
            "daemon_cpu_us", "runs", "accepted", "appends", "fsyncs", "fsyncs_per_second",
            "commits_per_fsync", "fsync_ms"}
ETCD_KEYS = {"etcd_cpu_us", "etcd_writes", "etcd_writes_per_second", "etcd_wal_fsyncs",
             "commits_per_etcd_write", "commits_per_etcd_wal_fsync"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=300)


def test_bench_commits_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "commits.json"
    result = _run("commits", "--members", "6", "--connections", "3", "--repeat", "1",
                  "--duration", "0.2", "--warmup", "0.05", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "commits"
    assert (data["repeat"], data["members"], data["stores"]) == (1, 6, ["file", "etcd"])
    assert [(r["store"], r["phase"], r["kind"]) for r in data["rows"]] == [
        (store, phase, kind) for store in ("file", "etcd") for phase in ("one", "all")
        for kind in ("heartbeat", "commit")]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS | (ETCD_KEYS if row["store"] == "etcd" else set())
        assert len(row["runs"]) == 1
        assert row["in_flight"] == (1 if row["phase"] == "one" else 6)
        assert row["accepted"] > 0  # every response had error 0, or the run failed
        for key in ("per_second", "p50_us", "p99_us", "daemon_cpu_us"):
            assert isinstance(row[key], int | float)
    for row in (r for r in data["rows"] if r["kind"] == "commit"):
        # every accepted commit wrote records, made durable by store commits (fsyncs)
        assert row["appends"] > 0 and row["fsyncs"] > 0
        assert row["commits_per_fsync"] > 0
        if row["store"] == "etcd":
            assert row["etcd_writes"] > 0 and row["commits_per_etcd_write"] > 0
    assert set(data["commit_over_heartbeat"]) == {"file_one", "file_all", "etcd_one", "etcd_all"}
    assert set(data["headline"]["per_store"]) == {"file", "etcd"}
    lines = result.stdout.strip().splitlines()
    assert "req/s" in lines[0] and "per fsync" in lines[0]
    assert lines[-1].startswith("headline: commits per fsync, 6 tasks committing at once: file ")


def test_bench_commits_is_listed() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "commits" in listed.stdout.split()
