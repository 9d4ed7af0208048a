"""Smoke test of ``python -m bench security``: it runs with tiny sizes and writes rows of the
expected shape. Only the structure is checked, never the timings."""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

HANDSHAKES = ["PLAINTEXT", "SSL (TLS)", "SASL_PLAINTEXT SCRAM-SHA-256", "SASL_SSL SCRAM-SHA-256",
              "SASL_SSL SCRAM-SHA-512"]
HEARTBEATS = ["PLAINTEXT", "SSL (TLS)", "SASL_SSL SCRAM-SHA-256", "PLAINTEXT, authorizer=acl"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=300)


def test_bench_security_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "security.json"
    result = _run("security", "--members", "10", "--connections", "2", "--workers", "2",
                  "--repeat", "1", "--duration", "0.3", "--warmup", "0.1", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "security"
    assert [r["listener"] for r in data["handshakes"]] == HANDSHAKES
    assert [r["listener"] for r in data["heartbeats"]] == HEARTBEATS
    for row in data["handshakes"]:
        assert row["per_second"] > 0 and len(row["runs"]) == 1
        for key in ("p50_ms", "p99_ms", "server_cpu_us"):
            assert isinstance(row[key], int | float)
    for row in data["heartbeats"]:
        assert row["per_second"] > 0 and row["checked"] > 0
        assert row["connections"] == 2 and row["members"] == 10
    headline = data["headline"]
    assert set(headline) == {"connections_tls_scram_over_plaintext", "heartbeats_tls_over_plaintext"}
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("headline: TLS + SCRAM-SHA-256 / plaintext connections per second: ")


def test_bench_security_rejects_bad_arguments(tmp_path: Path) -> None:
    result = _run("security", "--workers", "0", "--output", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert "--workers" in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_bench_security_is_listed() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "security" in listed.stdout.split()
