"""Smoke test of ``python -m bench hostile_heartbeat``: it runs at a tiny scale and prints one
row per case with the answer each heartbeat got. Only the structure is checked, never timings."""

from tests.bench_run import run_bench


def test_bench_hostile_heartbeat_smoke() -> None:
    result = run_bench("hostile_heartbeat", "--scale", "0.001", "--repeat", "1", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.strip().splitlines()[1:]]
    assert [(r[0], r[-1]) for r in rows] == [
        ("tasks", "INVALID_REQUEST"), ("states", "INVALID_REQUEST"), ("meta", "NONE"), ("full", "NONE")]
    assert all(float(r[2]) >= 0 and float(r[3]) >= 0 for r in rows)
