"""Smoke test of the benchmark harness: it runs, and writes rows of the expected shape.

Only the structure is checked, never the timings.
"""

import json
import subprocess
from pathlib import Path

from tests.bench_run import run_bench

CASES = ["hb_request_join", "hb_request_steady", "hb_response_assignment", "hb_response_empty"]
ROW_KEYS = {
    "case", "message", "bytes", "kio_encode_us", "fast_encode_us", "decode_us", "encode_speedup",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=120)


def test_bench_codec_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "codec.json"
    result = _run("codec", "--repeat", "1", "--number", "50", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "codec"
    assert (data["repeat"], data["number"]) == (1, 50)
    assert [row["case"] for row in data["rows"]] == CASES
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert row["message"] in ("ConnectGroupHeartbeatRequest", "ConnectGroupHeartbeatResponse")
        assert isinstance(row["bytes"], int) and row["bytes"] > 0
        for key in ("kio_encode_us", "fast_encode_us", "decode_us", "encode_speedup"):
            assert isinstance(row[key], int | float) and row[key] > 0
    sizes = {row["case"]: row["bytes"] for row in data["rows"]}
    assert sizes["hb_request_join"] > sizes["hb_request_steady"]
    assert sizes["hb_response_assignment"] > sizes["hb_response_empty"]
    assert data["headline"]["case"] == "hb_request_steady"
    assert isinstance(data["headline"]["ratio"], int | float)
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("headline: kio writer / specialised writer, hb_request_steady: ")
    assert all(case in result.stdout for case in CASES)


def test_bench_dispatcher() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "codec" in listed.stdout.split()
    unknown = _run("no-such-benchmark")
    assert unknown.returncode == 2
    assert "unknown benchmark 'no-such-benchmark'" in unknown.stderr
    assert _run().returncode == 2
