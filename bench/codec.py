"""Codec benchmark: kio's generic writer vs our specialised writer, and decode time.

``python -m bench codec [--repeat N] [--number N] [--output PATH]``

For each case (ConnectGroupHeartbeat request and response, in the shapes the coordinator sees
most) it times, in one process and interleaved so that drift and noise hit every variant alike:

* ``kio``: ``codec.kio_encode`` — kio's generic ``entity_writer``;
* ``fast``: ``codec.encode`` — the specialised writer of ``connect_wire.fastwriter``;
* ``decode``: ``codec.decode`` — kio's native reader.

Each repetition times every (case, variant) pair for ``--number`` calls, in an order that is
reversed on every other repetition; the table shows the median over ``--repeat`` repetitions in
microseconds per call. Before timing, both writers must produce identical bytes. The last line is
the headline: kio writer time / specialised writer time for the steady-state heartbeat request.
Rows are written to ``bench/results/codec.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from connect_wire import codec
from connect_wire.messages import (
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    connect_group_heartbeat_request_v0,
    connect_group_heartbeat_response_v0,
)

RESULTS = Path(__file__).resolve().parent / "results"
HEADLINE_CASE = "hb_request_steady"
VARIANTS = ("kio", "fast", "decode")


def cases() -> dict[str, Any]:
    """The messages measured, by case name."""
    req = connect_group_heartbeat_request_v0
    resp = connect_group_heartbeat_response_v0
    group, member = "connect-cluster-1", "4f7c1f9e-3b8a-4a57-9a8c-1d2e3f4a5b6c"
    return {
        "hb_request_join": ConnectGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=0, instance_id="worker-1",
            rebalance_timeout_ms=60_000, worker_url="http://worker-1:8083",
            client_assignors=(
                req.Assignor(name="incremental", minimum_version=0, maximum_version=2, reason=0,
                             metadata_version=2, metadata_bytes=b"\x00" * 24),
                req.Assignor(name="eager", minimum_version=0, maximum_version=0, reason=0,
                             metadata_version=0, metadata_bytes=b""),
            ),
            owned_connectors=("jdbc-source", "s3-sink"),
            owned_tasks=tuple(
                req.TaskId(connector=("jdbc-source", "s3-sink")[i % 2], task=i // 2)
                for i in range(8)
            ),
            max_wait_ms=0,
        ),
        HEADLINE_CASE: ConnectGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=42,
        ),
        "hb_response_assignment": ConnectGroupHeartbeatResponse(
            member_epoch=43, heartbeat_interval_ms=3000, should_compute_assignment=False,
            assignment=resp.Assignment(
                error=0, connectors=("jdbc-source",),
                tasks=tuple(resp.TaskId(connector="jdbc-source", task=i) for i in range(4)),
                metadata_version=2, metadata_bytes=b"\x01" * 16,
            ),
        ),
        "hb_response_empty": ConnectGroupHeartbeatResponse(
            member_epoch=43, heartbeat_interval_ms=3000, should_compute_assignment=False,
        ),
    }


def _callables(value: Any) -> dict[str, Callable[[], object]]:
    cls = type(value)
    data = codec.encode(value)
    kio_encode, encode, decode = codec.kio_encode, codec.encode, codec.decode
    return {
        "kio": lambda: kio_encode(value),
        "fast": lambda: encode(value),
        "decode": lambda: decode(cls, data),
    }


def _time(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of ``fn`` over ``number`` calls."""
    clock = time.perf_counter
    start = clock()
    for _ in range(number):
        fn()
    return (clock() - start) / number


def measure(repeat: int, number: int) -> list[dict[str, Any]]:
    messages = cases()
    for name, value in messages.items():
        fast, kio = codec.encode(value), codec.kio_encode(value)
        if fast != kio:
            raise SystemExit(f"bench codec: {name}: the writers disagree ({fast!r} != {kio!r})")
        if codec.decode(type(value), fast) != (value, len(fast)):
            raise SystemExit(f"bench codec: {name}: decode does not round-trip")
    jobs = [
        (name, variant, fn)
        for name, value in messages.items()
        for variant, fn in _callables(value).items()
    ]
    for _, _, fn in jobs:  # warm up: compile writers, fill caches
        _time(fn, max(1, number // 10))
    samples: dict[tuple[str, str], list[float]] = {(n, v): [] for n, v, _ in jobs}
    for rep in range(repeat):
        order = jobs if rep % 2 == 0 else list(reversed(jobs))
        for name, variant, fn in order:
            samples[(name, variant)].append(_time(fn, number))
    rows = []
    for name, value in messages.items():
        med = {v: statistics.median(samples[(name, v)]) * 1e6 for v in VARIANTS}
        rows.append({
            "case": name,
            "message": type(value).__name__,
            "bytes": len(codec.encode(value)),
            "kio_encode_us": round(med["kio"], 3),
            "fast_encode_us": round(med["fast"], 3),
            "decode_us": round(med["decode"], 3),
            "encode_speedup": round(med["kio"] / med["fast"], 3),
        })
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    header = f"{'case':<24} {'bytes':>5} {'kio enc us':>10} {'fast enc us':>11} " \
             f"{'speedup':>7} {'decode us':>9}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['case']:<24} {r['bytes']:>5} {r['kio_encode_us']:>10.2f} "
            f"{r['fast_encode_us']:>11.2f} {r['encode_speedup']:>6.2f}x {r['decode_us']:>9.2f}"
        )
    return "\n".join(lines)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench codec", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="repetitions (median; default 7)")
    parser.add_argument("--number", type=int, default=2000,
                        help="calls per timing (default 2000)")
    parser.add_argument("--output", type=Path, default=RESULTS / "codec.json",
                        help="where to write the rows (default bench/results/codec.json)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.number < 1:
        parser.error("--repeat and --number must be >= 1")
    started = time.perf_counter()
    rows = measure(args.repeat, args.number)
    headline = next(r for r in rows if r["case"] == HEADLINE_CASE)
    result = {
        "benchmark": "codec",
        "unit": "microseconds per call (median)",
        "repeat": args.repeat,
        "number": args.number,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kio": _version("kio"),
        "machine": platform.machine(),
        "rows": rows,
        "headline": {
            "case": HEADLINE_CASE,
            "metric": "kio writer time / specialised writer time",
            "ratio": headline["encode_speedup"],
        },
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print(f"(median of {args.repeat} x {args.number} calls; rows written to {args.output})")
    print(f"headline: kio writer / specialised writer, {HEADLINE_CASE}: "
          f"{headline['encode_speedup']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
