"""Wire throughput: steady heartbeats per second against the real daemon vs an echo ceiling.

``python -m bench throughput [--members N] [--connections 1,100] [--depth D] [--repeat N]
[--duration S] [--warmup S] [--output PATH]``

Starts the real daemon (``connect-coordinator serve``, a subprocess, fsync policy default,
session timeout 300 s so the members stay while the echo server is measured, heartbeat
interval 200 ms so the set-up converges quickly; it changes nothing in a steady heartbeat) and a bare uvloop
server using the same framing that decodes nothing and echoes each frame (``bench/_echo.py``,
the ceiling for Python here). ``--members`` simulated workers are set up first through the wire
(``bench/_sim.py``: join, the real IncrementalCooperativeAssignor computes, every member
reconciles until the group is Stable with every task owned once and the coordinator's describe
shows every member at the group's epoch, which the load replays; two tasks per member). Then a
load generator, a separate process (``bench/_loadgen.py``), sends steady heartbeats of those
members (MaxWaitMs = 0, pipelined: up to ``--depth`` in flight per connection, one per member)
over 1 and over 100 connections for ``--duration`` seconds after ``--warmup``, and reports
requests per second and client-side p50/p99 latency. Daemon and echo runs alternate (order
reversed on every other repetition); the table shows medians over ``--repeat`` repetitions. A
sample of the daemon's responses is decoded: every one must be error-free. The last line is the
headline: coordinator / ceiling requests per second at the largest connection count. Rows are
written to ``bench/results/throughput.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import RESULTS, BenchError, child_env, machine, sizes_arg, start_daemon, start_echo
from bench._sim import SimGroup, alter_connectors
from connect_wire.items import Item

GROUP = "bench-throughput"
TASKS_PER_MEMBER = 2
TASKS_PER_CONNECTOR = 20
DAEMON_ENV = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "300000",
              "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "200",
              "CONNECT_COORDINATOR_GROUP_CONNECT_MAX_SIZE": "1000000"}  # quick setup; any scale


async def setup_members(host: str, port: int, count: int, timeout_s: float = 300.0
                        ) -> list[tuple[str, int]]:
    """``count`` members joined and Stable; returns their (member id, epoch)."""
    return [(member_id, epoch) for member_id, epoch, _ in
            await setup_group(host, port, count, timeout_s)]


async def setup_group(host: str, port: int, count: int, timeout_s: float = 300.0, *,
                      group_id: str = GROUP, tasks_per_member: int = TASKS_PER_MEMBER
                      ) -> list[tuple[str, int, frozenset[Item]]]:
    """``count`` members of ``group_id`` joined and Stable, ``tasks_per_member`` tasks each in
    connectors of ``TASKS_PER_CONNECTOR``; returns their (member id, epoch, items owned)."""
    group = SimGroup(host, port, group_id, assignor="incremental", long_poll=False,
                     shared_connections=min(count, 20))
    await group.open()
    tasks = count * tasks_per_member
    specs = [(f"connector-{c:05d}", min(TASKS_PER_CONNECTOR, tasks - c * TASKS_PER_CONNECTOR))
             for c in range(-(-tasks // TASKS_PER_CONNECTOR))]
    assert group.control is not None
    await alter_connectors(group.control, group_id, specs)
    items = len(specs) + tasks
    try:
        for _ in range(count):
            await group.add_member()
        try:
            await group.wait_settled(items, count, timeout_s)
        except TimeoutError:
            raise BenchError(f"{count} members not Stable within {timeout_s}s") from None
        failed = [m.error for m in group.members if m.error]
        if failed:
            raise BenchError(f"a member failed: {failed[0]!r}")
        return [(m.m.member_id, m.m.member_epoch, m.m.owned) for m in group.members]
    finally:
        await group.close()


def load(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    path = workdir / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    timeout = spec["warmup_s"] + spec["duration_s"] + 120
    done = subprocess.run([sys.executable, "-m", "bench._loadgen", str(path)], capture_output=True,
                          text=True, env=child_env(), timeout=timeout, check=False)
    if done.returncode != 0:
        raise BenchError(f"load generator failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, workdir: Path) -> tuple[list[dict[str, Any]], float]:
    daemon, _ = start_daemon(workdir / "data", extra_env=DAEMON_ENV)
    echo = start_echo(workdir / "echo-logs")
    try:
        started = time.perf_counter()
        members = asyncio.run(setup_members(daemon.host, daemon.port, args.members))
        setup_s = time.perf_counter() - started
        targets = [("coordinator", daemon), ("echo", echo)]
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rep in range(args.repeat):
            order = targets if rep % 2 == 0 else targets[::-1]
            for conns in args.connections:
                for name, proc in order:
                    spec = {"host": proc.host, "port": proc.port, "group": GROUP, "members": members,
                            "connections": conns, "depth": args.depth, "warmup_s": args.warmup,
                            "duration_s": args.duration, "check": name == "coordinator"}
                    result = load(spec, workdir)
                    if result["errors"]:
                        raise BenchError(f"{result['errors']} of {result['checked']} sampled "
                                         f"heartbeat responses carried an error: {result['error_codes']}")
                    if proc.proc.poll() is not None:
                        raise BenchError(f"{name} exited:\n{proc.stderr()[-3000:]}")
                    runs.setdefault((name, conns), []).append(result)
    finally:
        daemon.stop()
        echo.stop()
    rows = []
    for conns in args.connections:
        for name, _ in (("coordinator", None), ("echo", None)):
            rs = runs[(name, conns)]
            rows.append({
                "server": name, "connections": conns, "members": args.members,
                "in_flight": rs[0]["in_flight"],
                "per_second": round(statistics.median(r["per_second"] for r in rs), 1),
                "p50_us": round(statistics.median(r["p50_us"] for r in rs), 1),
                "p99_us": round(statistics.median(r["p99_us"] for r in rs), 1),
                "runs": [round(r["per_second"], 1) for r in rs],
                "checked": sum(r["checked"] for r in rs),
            })
    return rows, setup_s


def render(rows: list[dict[str, Any]]) -> str:
    header = (f"{'server':>12} {'conns':>6} {'members':>8} {'in flight':>9} {'req/s':>10} "
              f"{'p50 us':>9} {'p99 us':>9}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['server']:>12} {r['connections']:>6} {r['members']:>8} {r['in_flight']:>9} "
                     f"{r['per_second']:>10.0f} {r['p50_us']:>9.0f} {r['p99_us']:>9.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench throughput",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=1_000, help="simulated members (default 1000)")
    parser.add_argument("--connections", type=sizes_arg, default=[1, 100],
                        help="connection counts, comma-separated (default 1,100)")
    parser.add_argument("--depth", type=int, default=128,
                        help="max requests in flight per connection (default 128)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median; default 5)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--output", type=Path, default=RESULTS / "throughput.json",
                        help="where to write the rows (default bench/results/throughput.json)")
    args = parser.parse_args(argv)
    if args.members < 1 or args.depth < 1 or args.repeat < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--members, --depth, --repeat must be >= 1, --duration > 0, --warmup >= 0")
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
            rows, setup_s = measure(args, Path(tmp))
    except BenchError as exc:
        print(f"bench throughput: {exc}", file=sys.stderr)
        return 1
    conns = max(args.connections)
    coord = next(r for r in rows if r["server"] == "coordinator" and r["connections"] == conns)
    echo = next(r for r in rows if r["server"] == "echo" and r["connections"] == conns)
    ratio = coord["per_second"] / echo["per_second"] if echo["per_second"] else float("nan")
    result = {
        "benchmark": "throughput",
        "unit": "steady heartbeats per second (median), latency at the client in microseconds",
        "repeat": args.repeat, "duration_s": args.duration, "warmup_s": args.warmup,
        "members": args.members, "depth": args.depth, **machine(),
        "setup_seconds": round(setup_s, 3),
        "rows": rows,
        "headline": {"metric": "coordinator / echo ceiling, requests per second",
                     "connections": conns, "ratio": round(ratio, 3), "target": 0.40},
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print(f"(median of {args.repeat} runs of {args.duration:g} s; {args.members} Stable members set "
          f"up in {setup_s:.1f} s; load generator in its own process on {machine()['cpus']} CPUs)")
    print(f"(rows written to {args.output})")
    print(f"headline: coordinator / ceiling at {conns} connections: {ratio:.2f} "
          f"({coord['per_second']:.0f} / {echo['per_second']:.0f} heartbeats/s; target >= 0.40)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
