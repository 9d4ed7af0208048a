"""Smoke test of ``python -m bench peers``: tiny sizes (2 workers, 4 tasks, 1 s session timeout,
one repetition, the kill and pause scenarios) against the real daemon and a real redis-server
that the benchmark starts itself (and installs with apt-get when it is missing and this is
root). Only the structure is checked, never the timings; the record analysis it relies on is
checked on hand-made records."""

import json
import subprocess
from pathlib import Path

from bench import _records
from tests.bench_run import run_bench

ROW_KEYS = {"scenario", "system", "workers", "tasks", "covered_after_s", "not_converged", "moves",
            "min_moves", "double_owned_s", "double_owned_s_max", "double_owned_tasks", "downtime_s",
            "stopped_after_resume_s", "runs"}
RUN_KEYS = {"variant", "scenario", "tag", "victim", "victim_tasks", "event_ts", "stopped_after_resume_s",
            "converged", "covered_after_s", "moves",
            "min_moves", "double_owned_s", "double_owned_tasks", "max_double_owned_at_once", "downtime_s",
            "window_s", "problems", "fail_stops"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=300)


def test_bench_peers_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "peers.json"
    result = _run("peers", "--workers", "2", "--tasks", "4", "--scenarios", "kill,pause", "--repeat", "1",
                  "--session-ms", "1000", "--interval-ms", "250", "--pause-s", "1.5", "--quiet-s", "0.6",
                  "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "peers"
    assert {"python", "cpus"} <= set(data["machine"])
    assert data["settings"]["workers"] == 2 and data["settings"]["tasks"] == 4
    assert data["settings"]["max_delay_ms"] == 1000  # defaults to the session timeout
    assert [(r["scenario"], r["system"]) for r in data["rows"]] == [
        ("kill", "ours"), ("kill", "tooz"), ("pause", "ours"), ("pause", "tooz")]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert (row["workers"], row["tasks"]) == (2, 4) and len(row["runs"]) == 1
        (run,) = row["runs"]
        assert set(run) == RUN_KEYS
        assert run["variant"] == row["system"] and run["victim"] == "w1"
        for key in ("double_owned_s", "downtime_s", "window_s"):
            assert isinstance(run[key], int | float) and run[key] >= 0
        assert isinstance(run["moves"], int) and isinstance(run["min_moves"], int)
        # Only ours fail-stops (a worker woken past its lease's end plus its budget ends itself).
        assert run["fail_stops"] == 0 or (run["variant"], run["scenario"]) == ("ours", "pause")
    head = data["headline"]
    assert set(head["double_owned_s"]) == {"ours", "tooz"}
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("| scenario | system |") and lines[1].startswith("|---")
    assert sum(1 for line in lines if line.startswith("| kill ") or line.startswith("| pause ")) == 4
    assert lines[-1].startswith("headline: double-ownership s ours ")
    assert " vs tooz " in lines[-1] and "; downtime ours/tooz = " in lines[-1]


def test_bench_peers_is_listed() -> None:
    listed = _run("list")
    assert listed.returncode == 0 and "peers" in listed.stdout.split()


def test_records_analysis() -> None:
    """Intervals, kills, pauses: double ownership, downtime, coverage and moves over a window."""
    recs = [
        {"ts": 0.0, "worker": "w1", "item": "t/0", "event": "start", "pid": 1},
        {"ts": 0.0, "worker": "w2", "item": "t/1", "event": "start", "pid": 2},
        # w1 is paused on [10, 14); w2 takes t/0 over at 12; w1 records its stop at 14.5
        {"ts": 12.0, "worker": "w2", "item": "t/0", "event": "start", "pid": 2},
        {"ts": 14.5, "worker": "w1", "item": "t/0", "event": "stop", "pid": 1},
        # w2 is killed at 20: t/1 runs nowhere until w1 starts it at 23
        {"ts": 23.0, "worker": "w1", "item": "t/1", "event": "start", "pid": 1},
    ]
    tl = _records.timeline(recs, {2: (20.0, "kill")})
    assert not tl.problems
    pauses = {1: [(10.0, 14.0)]}
    w = tl.window(["t/0", "t/1"], 10.0, 30.0, pauses)
    assert w.double_owned_s == 2.5  # t/0 on w1 (paused, then resumed) and w2: [12, 14.5)
    assert (w.double_owned_items, w.max_double_owned) == (1, 1)
    # t/0: down [10, 12) (only owner paused), and again from 20 (w2 killed); t/1: [20, 23)
    assert w.downtime_s == 2.0 + 10.0 + 3.0
    assert w.covered_after_s is None  # t/0 runs nowhere at the end
    assert w.moves == 2  # t/0 to w2, t/1 to w1
    assert tl.window(["t/1"], 10.0, 30.0, pauses).covered_after_s == 13.0
    assert tl.holders(5.0) == {"t/0": "w1", "t/1": "w2"}
    # A kill forces the victim's items; a join the newcomer's floor share; a comeback nothing.
    before = {"a": "w1", "b": "w1", "c": "w2", "d": "w3"}
    assert _records.min_moves(before, ["w1", "w2", "w3"], ["w2", "w3"]) == 2
    assert _records.min_moves(before, ["w1", "w2", "w3"], ["w1", "w2", "w3", "w4"]) == 1
    assert _records.min_moves(before, ["w1", "w2", "w3"], ["w1", "w2", "w3"]) == 0
    assert _records.timeline(recs[:1], {1: (1.0, "exit")}).problems
