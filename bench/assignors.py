"""Assignor benchmark: one ``assign()`` of the Eager and IncrementalCooperative assignors.

``python -m bench assignors [--workers 10,100,1000] [--tasks 1000,10000,100000]
[--tasks-per-connector N] [--repeat N] [--output PATH]``

For every (workers, tasks) pair — ``tasks`` tasks in ``tasks / tasks-per-connector``
connectors, so connectors are items too — it times (median over ``--repeat`` calls) and measures
the peak memory (tracemalloc, in a separate call so that tracing does not distort the time) of:

* ``eager``: the round robin (it ignores ownership, so one scenario, ``full``);
* ``incremental``, four scenarios, each from the state and targets of the assignor's own previous
  computation, the way the coordinator replays them:

  - ``initial``: nothing assigned yet, everything is new;
  - ``join``: balanced over ``workers - 1`` members, one worker joins (load-balancing moves);
  - ``leave``: balanced over ``workers`` members, one departs (its work is held, delay);
  - ``expire``: the departed worker's deadline has passed (the held work is spread).

The input (a ``GroupSpec``) is built outside the timing. The last line is the headline: the
slowest incremental scenario at the largest size run (1,000 workers x 100,000 tasks by default;
target < 0.5 s). Rows are written to ``bench/results/assignors.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from connect_wire.assignors import (
    EagerAssignor,
    GroupAssignment,
    GroupSpec,
    IncrementalCooperativeAssignor,
    MemberSpec,
)

RESULTS = Path(__file__).resolve().parent / "results"
SCENARIOS = ("initial", "join", "leave", "expire")
TARGET_SECONDS = 0.5
MAX_DELAY_MS = 300_000


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise ValueError(text)
    return values


def _connectors(tasks: int, per_connector: int) -> dict[str, int]:
    count = max(1, -(-tasks // per_connector))
    out: dict[str, int] = {}
    left = tasks
    for k in range(count):
        n = min(per_connector, left)
        out[f"connector-{k:06d}"] = n
        left -= n
    return out


def _members(ids: list[str], previous: GroupAssignment | None) -> dict[str, MemberSpec]:
    """Members whose target and owned items are the previous result (converged)."""
    out = {}
    for m in ids:
        items = previous.members[m].items if previous is not None and m in previous.members else frozenset()
        out[m] = MemberSpec(member_id=m, member_epoch=1, instance_id=f"instance-{m}", target=items,
                            owned=items)
    return out


def _spec(epoch: int, now: int, connectors: dict[str, int], ids: list[str],
          previous: GroupAssignment | None) -> GroupSpec:
    return GroupSpec(
        group_epoch=epoch, assignment_epoch=epoch - 1, coordinator_time_ms=now,
        connectors=connectors, members=_members(ids, previous),
        assignor_state=previous.assignor_state if previous is not None else b"",
    )


def inputs(workers: int, tasks: int, per_connector: int) -> dict[str, tuple[Any, GroupSpec]]:
    """(assignor, input) per scenario name (``eager:full``, ``incremental:<scenario>``)."""
    connectors = _connectors(tasks, per_connector)
    ids = [f"worker-{k:05d}" for k in range(workers)]
    eager, inc = EagerAssignor(), IncrementalCooperativeAssignor(MAX_DELAY_MS)
    out: dict[str, tuple[Any, GroupSpec]] = {"eager:full": (eager, _spec(1, 0, connectors, ids, None))}
    initial = _spec(1, 1_000, connectors, ids, None)
    out["incremental:initial"] = (inc, initial)
    if workers > 1:
        before = inc.assign(_spec(1, 1_000, connectors, ids[:-1], None))
        out["incremental:join"] = (inc, _spec(2, 2_000, connectors, ids, before))
    steady = inc.assign(initial)
    leave = _spec(2, 2_000, connectors, ids[1:], steady)
    out["incremental:leave"] = (inc, leave)
    held = inc.assign(leave)
    if held.scheduled_rebalance_delay_ms < 0:
        raise SystemExit("bench assignors: the departed worker's work was not held")
    out["incremental:expire"] = (
        inc, _spec(3, 2_000 + held.scheduled_rebalance_delay_ms, connectors, ids[1:], held))
    return out


def _check(spec: GroupSpec, result: GroupAssignment, scenario: str) -> None:
    assigned = [i for t in result.members.values() for i in t.items]
    if len(assigned) != len(set(assigned)):
        raise SystemExit(f"bench assignors: {scenario}: an item is assigned twice")
    if result.scheduled_rebalance_delay_ms < 0 and set(assigned) != spec.all_items():
        raise SystemExit(f"bench assignors: {scenario}: not every item is assigned")


def _time(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _peak(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def measure(workers: list[int], tasks: list[int], per_connector: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for w in workers:
        for t in tasks:
            for name, (assignor, spec) in inputs(w, t, per_connector).items():
                kind, scenario = name.split(":")
                result = assignor.assign(spec)  # warm up, and check
                _check(spec, result, name)
                seconds = _time(lambda a=assignor, s=spec: a.assign(s), repeat)
                peak = _peak(lambda a=assignor, s=spec: a.assign(s))
                rows.append({
                    "assignor": kind, "scenario": scenario, "workers": w, "tasks": t,
                    "connectors": len(spec.connectors), "seconds": round(seconds, 6),
                    "peak_mib": round(peak / 2**20, 3),
                    "state_bytes": len(result.assignor_state),
                    "delay_ms": result.scheduled_rebalance_delay_ms,
                })
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    header = (f"{'assignor':<12} {'scenario':<8} {'workers':>7} {'tasks':>7} {'conns':>6} "
              f"{'seconds':>9} {'peak MiB':>9} {'state B':>8} {'delay ms':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['assignor']:<12} {r['scenario']:<8} {r['workers']:>7} {r['tasks']:>7} "
            f"{r['connectors']:>6} {r['seconds']:>9.4f} {r['peak_mib']:>9.2f} "
            f"{r['state_bytes']:>8} {r['delay_ms']:>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench assignors", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="10,100,1000", help="worker counts (default 10,100,1000)")
    parser.add_argument("--tasks", default="1000,10000,100000",
                        help="task counts (default 1000,10000,100000)")
    parser.add_argument("--tasks-per-connector", type=int, default=10,
                        help="tasks per connector (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per row (median; default 3)")
    parser.add_argument("--output", type=Path, default=RESULTS / "assignors.json",
                        help="where to write the rows (default bench/results/assignors.json)")
    args = parser.parse_args(argv)
    try:
        workers, tasks = _ints(args.workers), _ints(args.tasks)
    except ValueError:
        parser.error("--workers and --tasks must be comma-separated positive integers")
    if args.repeat < 1 or args.tasks_per_connector < 1:
        parser.error("--repeat and --tasks-per-connector must be >= 1")
    started = time.perf_counter()
    rows = measure(workers, tasks, args.tasks_per_connector, args.repeat)
    top_w, top_t = max(workers), max(tasks)
    slowest = max(
        (r for r in rows if r["assignor"] == "incremental" and (r["workers"], r["tasks"]) == (top_w, top_t)),
        key=lambda r: r["seconds"],
    )
    result = {
        "benchmark": "assignors",
        "unit": "seconds per assign() (median); peak MiB allocated during one assign() (tracemalloc)",
        "repeat": args.repeat,
        "tasks_per_connector": args.tasks_per_connector,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "rows": rows,
        "headline": {
            "assignor": "incremental", "workers": top_w, "tasks": top_t,
            "scenario": slowest["scenario"], "seconds": slowest["seconds"],
            "target_seconds": TARGET_SECONDS,
        },
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print(f"(median of {args.repeat} calls; rows written to {args.output})")
    print(f"headline: incremental {top_w} workers x {top_t} tasks: {slowest['seconds']:.3f} s "
          f"(slowest scenario: {slowest['scenario']}; target < {TARGET_SECONDS} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
