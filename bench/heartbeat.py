"""Steady-state heartbeat benchmark: the cost of one heartbeat from a stable member vs group size.

``python -m bench heartbeat [--sizes 100,1000,10000] [--repeat N] [--number N] [--seed S]
[--output PATH]``

For each size it builds one connect group with that many members, Stable: the membership is
loaded the way a coordinator loads a partition (``GroupMember``, ``CurrentMemberAssignment`` and
``GroupMetadata`` records replayed, then ``on_loaded``; joining one by one through heartbeats
costs O(members) per join, so building 10,000 members that way would take minutes); then the
chosen member computes through the real API (PrepareAssignment, then InstallAssignment of one
assignment giving every member two tasks, plus the connectors spread round-robin), and every
member heartbeats once to reconcile to the assignment epoch. Before timing it checks that the
group is Stable and that a steady heartbeat writes no record and gets no ``Assignment``.

The timed call is ``GroupCoordinator.heartbeat`` for a steady heartbeat (MemberEpoch = the
member's epoch, every optional field null) of a random member, called directly (no harness, no
invariant checks, no codec). Each repetition times ``--number`` heartbeats per size, sizes
interleaved (order reversed on every other repetition) with the garbage collector off, as
``timeit`` does; the table shows the median over ``--repeat`` repetitions in microseconds per
heartbeat. A second column times heartbeats of one and the same member (its data stays in the
CPU caches): the difference to the first is memory locality, not work done. The last line is
the headline: time per heartbeat at the largest size / at the
smallest (about 1.0 when a steady heartbeat is O(1) in the group size). Rows are written to
``bench/results/heartbeat.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from connect_wire.messages import (
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from coordinator.group import records as rec
from coordinator.group.coordinator import GroupCoordinator
from coordinator.group.model import (
    NEW_MEMBER_ASSIGNMENT,
    AssignorSpec,
    ConnectorSpec,
    GroupState,
    MemberMetadata,
)
from coordinator.group.state import CoordinatorState

RESULTS = Path(__file__).resolve().parent / "results"
GROUP = "bench-group"
TASKS_PER_MEMBER = 2
TASKS_PER_CONNECTOR = 20
REBALANCE_TIMEOUT_MS = 60_000
ASSIGNOR = AssignorSpec("incremental", 0, 2, 0, 2, b"")


class BenchError(RuntimeError):
    """The group did not reach the state the benchmark needs."""


def _member_id(i: int) -> str:
    return f"worker-{i:06d}-0000-0000-0000-000000000000"


def _check(response: Any, what: str) -> Any:
    if response.error_code != 0:
        raise BenchError(f"{what}: error {response.error_code} ({response.error_message})")
    return response


def build_group(size: int, now_ms: int = 0) -> tuple[GroupCoordinator, list[str], int]:
    """A coordinator holding one Stable group of ``size`` members; (coordinator, member ids,
    member epoch)."""
    members = [_member_id(i) for i in range(size)]
    connector_count = max(1, -(-size * TASKS_PER_MEMBER // TASKS_PER_CONNECTOR))
    connectors = [ConnectorSpec(f"connector-{c:05d}", TASKS_PER_CONNECTOR,
                                (("connector.class", "org.example.BenchConnector"),))
                  for c in range(connector_count)]
    # Load the membership as a partition load does: records replayed, then on_loaded.
    state = CoordinatorState()
    state.replay(rec.group_metadata(GROUP, 0))
    state.replay(rec.group_connectors(GROUP, 0, connectors))
    for i, mid in enumerate(members):
        state.replay(rec.group_member(GROUP, MemberMetadata(
            member_id=mid, instance_id=None, worker_url=f"http://worker-{i}:8083",
            client_id=f"worker-{i}", client_host="10.0.0.1",
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, assignors=(ASSIGNOR,),
        )))
        state.replay(rec.current_assignment(GROUP, mid, NEW_MEMBER_ASSIGNMENT))
    state.replay(rec.group_metadata(GROUP, 1))  # the members joined: a new assignment is due
    coordinator = GroupCoordinator(state=state)
    coordinator.on_loaded(now_ms)
    g = coordinator.group(GROUP)
    if g is None or g.soft.computation is None:
        raise BenchError("no member was chosen to compute the assignment")
    chosen = g.soft.computation.member_id

    # The chosen member computes through the API: Prepare, then Install.
    prepared = _check(coordinator.prepare_assignment(ConnectGroupPrepareAssignmentRequest(
        group_id=GROUP, member_id=chosen, member_epoch=0), now_ms).response, "prepare")
    items: list[tuple[str, int]] = [
        (c.name, t) for c in prepared.connectors for t in range(c.task_count)
    ]
    per_member: list[tuple[list[str], list[Any]]] = [([], []) for _ in members]
    for k, (name, task) in enumerate(items):
        per_member[k % size][1].append(_inst.TaskId(connector=name, task=task))
    for k, c in enumerate(prepared.connectors):
        per_member[k % size][0].append(c.name)
    _check(coordinator.install_assignment(ConnectGroupInstallAssignmentRequest(
        group_id=GROUP, member_id=chosen, member_epoch=0, group_epoch=prepared.group_epoch,
        error=0, assignor_state=b"", scheduled_rebalance_delay_ms=-1,
        members=tuple(
            _inst.MemberAssignment(member_id=mid, connectors=tuple(conns), tasks=tuple(tasks),
                                   metadata_version=2, metadata_bytes=b"")
            for mid, (conns, tasks) in zip(members, per_member, strict=True)
        ),
    ), now_ms).response, "install")

    # Every member (at epoch 0) heartbeats with its join fields and reconciles: nothing is
    # owned by anyone yet, so one heartbeat each reaches the assignment epoch.
    assignors = (_hb.Assignor(name=ASSIGNOR.name, minimum_version=ASSIGNOR.minimum_version,
                              maximum_version=ASSIGNOR.maximum_version, reason=ASSIGNOR.reason,
                              metadata_version=ASSIGNOR.metadata_version, metadata_bytes=b""),)
    for mid in members:
        _check(coordinator.heartbeat(ConnectGroupHeartbeatRequest(
            group_id=GROUP, member_id=mid, member_epoch=0,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, client_assignors=assignors,
            owned_connectors=(), owned_tasks=(),
        ), now_ms).response, f"reconcile {mid}")
    g = coordinator.group(GROUP)
    assert g is not None
    if g.state != GroupState.STABLE:
        raise BenchError(f"group of {size} is {g.state.value}, not Stable")
    epoch = g.assignment_epoch
    if any(g.current[m].epoch != epoch for m in members):
        raise BenchError("a member is not at the assignment epoch")
    # A steady heartbeat: writes nothing, changes nothing, carries no Assignment.
    probe = coordinator.heartbeat(ConnectGroupHeartbeatRequest(
        group_id=GROUP, member_id=members[0], member_epoch=epoch), now_ms)
    _check(probe.response, "steady heartbeat")
    if probe.records or probe.response.assignment is not None:
        raise BenchError("a steady heartbeat wrote records or returned an assignment")
    return coordinator, members, epoch


def _time(coordinator: GroupCoordinator, requests: list[Any], now_ms: int) -> float:
    """Seconds per heartbeat over ``requests``."""
    heartbeat = coordinator.heartbeat
    clock = time.perf_counter
    start = clock()
    for req in requests:
        heartbeat(req, now_ms)
    return (clock() - start) / len(requests)


def measure(sizes: list[int], repeat: int, number: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    groups = []
    for size in sizes:
        started = time.perf_counter()
        coordinator, members, epoch = build_group(size)
        build_s = time.perf_counter() - started
        requests = [
            ConnectGroupHeartbeatRequest(group_id=GROUP, member_id=rnd.choice(members),
                                         member_epoch=epoch)
            for _ in range(number)
        ]
        # The same member over and over: its data stays in the CPU caches, so this isolates
        # the algorithmic cost from the memory-locality cost of touching random members.
        hot = [ConnectGroupHeartbeatRequest(group_id=GROUP, member_id=members[0],
                                            member_epoch=epoch)] * number
        groups.append((size, coordinator, requests, hot, build_s))
    now_ms = 1_000  # within every session: no timer ever fires here
    for _, coordinator, requests, hot, _ in groups:  # warm up
        _time(coordinator, requests[: max(1, number // 10)], now_ms)
        _time(coordinator, hot[: max(1, number // 10)], now_ms)
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    hot_samples: dict[int, list[float]] = {size: [] for size in sizes}
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for rep in range(repeat):
            order = groups if rep % 2 == 0 else list(reversed(groups))
            for size, coordinator, requests, hot, _ in order:
                samples[size].append(_time(coordinator, requests, now_ms))
                hot_samples[size].append(_time(coordinator, hot, now_ms))
    finally:
        if enabled:
            gc.enable()
    rows = []
    for size, coordinator, _, _, build_s in groups:
        g = coordinator.group(GROUP)
        assert g is not None
        us = [s * 1e6 for s in samples[size]]
        rows.append({
            "members": size,
            "connectors": len(g.connectors),
            "tasks": sum(c.task_count for c in g.connectors.values()),
            "state": g.state.value,
            "build_seconds": round(build_s, 3),
            "heartbeat_us": round(statistics.median(us), 3),
            "min_us": round(min(us), 3),
            "max_us": round(max(us), 3),
            "one_member_us": round(statistics.median(hot_samples[size]) * 1e6, 3),
        })
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    header = f"{'members':>8} {'connectors':>10} {'tasks':>7} {'build s':>8} " \
             f"{'us/heartbeat':>12} {'min us':>8} {'max us':>8} {'one member us':>13}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['members']:>8} {r['connectors']:>10} {r['tasks']:>7} {r['build_seconds']:>8.2f} "
            f"{r['heartbeat_us']:>12.2f} {r['min_us']:>8.2f} {r['max_us']:>8.2f} "
            f"{r['one_member_us']:>13.2f}"
        )
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes must be comma-separated integers: {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError("--sizes must list group sizes >= 1")
    return sorted(set(sizes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench heartbeat",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_sizes, default=[100, 1_000, 10_000],
                        help="group sizes, comma-separated (default 100,1000,10000)")
    parser.add_argument("--repeat", type=int, default=7, help="repetitions (median; default 7)")
    parser.add_argument("--number", type=int, default=5_000,
                        help="heartbeats per timing (default 5000)")
    parser.add_argument("--seed", type=int, default=1, help="seed for choosing members")
    parser.add_argument("--output", type=Path, default=RESULTS / "heartbeat.json",
                        help="where to write the rows (default bench/results/heartbeat.json)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.number < 1:
        parser.error("--repeat and --number must be >= 1")
    started = time.perf_counter()
    try:
        rows = measure(args.sizes, args.repeat, args.number, args.seed)
    except BenchError as exc:
        print(f"bench heartbeat: {exc}", file=sys.stderr)
        return 1
    small, large = rows[0], rows[-1]
    ratio = large["heartbeat_us"] / small["heartbeat_us"] if small["heartbeat_us"] else float("nan")
    hot_ratio = (large["one_member_us"] / small["one_member_us"] if small["one_member_us"]
                 else float("nan"))
    result = {
        "benchmark": "heartbeat",
        "unit": "microseconds per steady-state heartbeat (median)",
        "repeat": args.repeat,
        "number": args.number,
        "seed": args.seed,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "rows": rows,
        "headline": {
            "metric": "time per heartbeat at the largest group / at the smallest",
            "sizes": [small["members"], large["members"]],
            "ratio": round(ratio, 3),
            "one_member_ratio": round(hot_ratio, 3),
        },
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print(f"(median of {args.repeat} x {args.number} heartbeats of random members; 'one member': "
          f"the same member each time, its data hot in the CPU caches; ratio "
          f"{large['members']}/{small['members']} members: {hot_ratio:.2f}x)")
    print(f"(rows written to {args.output})")
    print(f"headline: time per heartbeat at {large['members']} members / at {small['members']} "
          f"members: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
