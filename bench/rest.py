"""Kafka Connect's REST API on a worker that runs tasks: requests/s and latency of its reads,
and its heartbeats while it is flooded with them.

``python -m bench rest [--workers N] [--connectors C] [--tasks T] [--clients 1,64]
[--workloads root,status,expand] [--duration S] [--warmup S] [--repeat N] [--session-ms MS]
[--interval-ms MS] [--output PATH]``

Setup: a real coordinator daemon (its session timeout and heartbeat interval set by
``--session-ms``/``--interval-ms``) and ``--workers`` real ``connect-worker run`` processes of
one group, each with ``--rest-listen`` and ``--metrics-listen``; ``--connectors`` connectors of
``--tasks`` tasks each, created through the REST API, of the bundled ``CounterConnector``
(one partition per task: each task counts every 200 ms, writes each number to SQLite and commits its
offsets through the coordinator): the workers are busy. The benchmark waits until every
connector and task is RUNNING.

The load: ``bench/_rest_load.py``, a process of its own, ``clients`` concurrent aiohttp clients
in closed loops (one request in flight each, keep-alive), all against the first worker (w1).
Workloads: ``root`` is ``GET /`` (answered by the worker alone: the ceiling of its HTTP
server), ``status`` is ``GET /connectors/{c}/status`` round the connectors, ``expand`` is ``GET
/connectors?expand=status`` (both one ConnectGroupDescribe through the coordinator per
request), and ``idle`` is no REST request at all (the same worker, the same tasks). The runs
alternate, the order reversed on every other repetition; the table shows medians over
``--repeat`` (but the largest heartbeat gap and the fences over all of them).

Heartbeats: w1's ``connect_worker_heartbeat_gap_seconds`` (the time between the sends of two
consecutive answered heartbeats: each renews the session lease) is scraped every 100 ms during
each window; a gap is taken from ``connect_worker_heartbeat_last_gap_seconds`` whenever the
histogram's count moved (gaps shorter than the scrape period can be missed; the histogram's
bucket of the largest one is kept as a check). "max gap / session" is the largest gap over the
session timeout: at 1 the coordinator would fence the member. Fences are counted on both sides:
the coordinator's ``connect_coordinator_member_fences_total`` and
``connect_coordinator_session_expiries_total`` (every reason, every member) and w1's
``connect_worker_lost_total``; any fence fails the run (exit 1) after the table is printed.
The CPU seconds of w1 and of the daemon per request come from ``/proc``, the Describes per
request from the daemon's ``connect_coordinator_requests_total{api="ConnectGroupDescribe"}``
(concurrent reads share one in flight: worker_client/rest.py). Rates, latencies and CPU per
request count the 2xx answers; "not 2xx" the others (a worker serves 256 connections at once,
and answers 503 past them). The last line is the headline, at the most clients answered 2xx
throughout. Rows are written to ``bench/results/rest.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import RESULTS, ROOT, BenchError, Process, child_env, machine, sizes_arg, start_daemon
from bench.cluster import cpu_seconds
from bench.commits import scrape
from bench.convergence import metrics_url
from bench.peers import _free_port

GROUP = "bench-rest"
PLUGIN = "worker_client.examples.counter:CounterConnector"
WORKLOADS = ("root", "status", "expand")
SCRAPE_S = 0.1
WORKER_GAP = "connect_worker_heartbeat_gap_seconds"
WORKER_COUNTERS = {"gaps": f"{WORKER_GAP}_count", "last_gap": "connect_worker_heartbeat_last_gap_seconds",
                   "lost": "connect_worker_lost_total"}
DAEMON_COUNTERS = {"fences": "connect_coordinator_member_fences_total",
                   "expiries": "connect_coordinator_session_expiries_total"}
DESCRIBES = re.compile(r'^connect_coordinator_requests_total\{api="ConnectGroupDescribe",[^}]*\} (\S+)$',
                       re.M)
BUCKET = re.compile(rf'^{WORKER_GAP}_bucket\{{le="([^"]+)"\}} (\S+)$', re.M)


def http(method: str, url: str, body: Any = None, timeout_s: float = 30.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    return status, json.loads(text) if text else None


def buckets(url: str) -> dict[float, float]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {float(le): float(v) for le, v in BUCKET.findall(text)}


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    metrics: str
    log: Path


class Cluster:
    """The daemon, the workers and the connectors."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        env = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": str(args.session_ms),
               "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": str(args.interval_ms)}
        self.daemon: Process = start_daemon(workdir / "data", extra_env=env, timeout_s=60)[0]
        url = metrics_url(self.daemon)
        if url is None:
            raise BenchError("the daemon serves no metrics")
        self.daemon_metrics = url
        self.workers: list[Worker] = []

    def spawn(self, name: str) -> Worker:
        rest, metrics = _free_port(), _free_port()
        log = self.workdir / f"worker-{name}.log"
        cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap",
               f"{self.daemon.host}:{self.daemon.port}", "--group", GROUP, "--instance-id", name,
               "--session-timeout-ms", str(self.args.session_ms), "--max-delay-ms", "0",
               "--rest-listen", f"127.0.0.1:{rest}", "--metrics-listen", f"127.0.0.1:{metrics}",
               "--log-level", "warning"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=child_env(), cwd=ROOT)
        w = Worker(name, proc, f"http://127.0.0.1:{rest}", f"http://127.0.0.1:{metrics}/metrics", log)
        self.workers.append(w)
        return w

    def check(self) -> None:
        if self.daemon.proc.poll() is not None:
            raise BenchError(f"the daemon exited:\n{self.daemon.stderr()[-3000:]}")
        for w in self.workers:
            if w.proc.poll() is not None:
                raise BenchError(f"worker {w.name} exited with {w.proc.returncode}:\n"
                                 + w.log.read_text(errors="replace")[-3000:])

    def until(self, check: Any, what: str, timeout_s: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            try:
                got = check()
            except (urllib.error.URLError, OSError):
                got = None
            if got:
                return got
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: not within {timeout_s:.0f} s")
            time.sleep(0.2)

    def start(self) -> None:
        for i in range(self.args.workers):
            self.spawn(f"w{i + 1}")
        for w in self.workers:
            self.until(lambda w=w: http("GET", w.url + "/health", timeout_s=5)[0] == 200,
                       f"{w.name} healthy")
        first = self.workers[0].url
        for i in range(self.args.connectors):
            status, body = http("POST", first + "/connectors", {"name": f"c{i}", "config": {
                "connector.class": PLUGIN, "tasks.max": str(self.args.tasks),
                "sqlite.file": str(self.workdir / "counts.db"), "partitions": str(self.args.tasks),
                "interval.ms": "200"}})
            if status != 201:
                raise BenchError(f"POST /connectors c{i}: {status} {body}")

        seen: list[Any] = []

        def running() -> bool:
            _, listed = http("GET", first + "/connectors?expand=status")
            seen[:] = [listed]
            return len(listed) == self.args.connectors and all(
                e["status"]["connector"]["state"] == "RUNNING"
                and [t["state"] for t in e["status"]["tasks"]] == ["RUNNING"] * self.args.tasks
                for e in listed.values())

        try:
            self.until(running, "every connector and task RUNNING")
        except BenchError as exc:
            raise BenchError(f"{exc}; last seen: {json.dumps(seen)[:3000]}") from None

    def owned_by_first(self) -> int:
        """Instances (connectors and tasks) w1 runs."""
        _, listed = http("GET", self.workers[0].url + "/connectors?expand=status")
        me = self.workers[0].url.removeprefix("http://")
        return sum((e["status"]["connector"]["worker_id"] == me)
                   + sum(t["worker_id"] == me for t in e["status"]["tasks"]) for e in listed.values())

    def close(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(30)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self.daemon.stop()


class GapSampler:
    """Scrapes w1's metrics every SCRAPE_S in a thread: the heartbeat gaps that ended in the
    window, the fences on both sides, the CPU of w1 and of the daemon."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.worker = cluster.workers[0]
        self.gaps: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors = 0

    def _sample(self) -> dict[str, float]:
        out = scrape(self.worker.metrics, WORKER_COUNTERS)
        out.update(scrape(self.cluster.daemon_metrics, DAEMON_COUNTERS))
        with urllib.request.urlopen(self.cluster.daemon_metrics, timeout=30) as resp:
            out["describes"] = sum(float(v) for v in DESCRIBES.findall(resp.read().decode()))
        out["cpu_worker"] = cpu_seconds(self.worker.proc.pid)
        out["cpu_daemon"] = cpu_seconds(self.cluster.daemon.pid)
        return out

    def open(self) -> None:
        self.before = self._sample()
        self.buckets_before = buckets(self.worker.metrics)
        self._count = self.before["gaps"]
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_S):
            try:
                s = scrape(self.worker.metrics, WORKER_COUNTERS)
            except (urllib.error.URLError, OSError):
                self.errors += 1
                continue
            if s["gaps"] != self._count:
                self._count = s["gaps"]
                self.gaps.append(s["last_gap"])

    def close(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        after = self._sample()
        grown = {le: n - self.buckets_before.get(le, 0.0)
                 for le, n in buckets(self.worker.metrics).items()}
        # the bucket of the largest gap in the window: the lowest bound holding every new one
        total = after["gaps"] - self.before["gaps"]
        bound = min((le for le, n in grown.items() if n >= total), default=None) if total else None
        return {"window": {k: after[k] - self.before[k] for k in after if k != "last_gap"},
                "gaps": self.gaps, "gap_bucket_s": bound, "scrape_errors": self.errors}


def run_load(cluster: Cluster, workload: str, clients: int, args: argparse.Namespace,
             sampler: GapSampler) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the load generator's result, the sampler's over its measured window)"""
    base = cluster.workers[0].url
    if workload == "root":
        urls = [base + "/"]
    elif workload == "status":
        urls = [f"{base}/connectors/c{i}/status" for i in range(args.connectors)]
    else:
        urls = [base + "/connectors?expand=status"]
    spec = {"urls": urls, "clients": clients, "duration": args.duration, "warmup": args.warmup,
            "timeout_s": 30.0}
    path = cluster.workdir / "rest-load.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "bench._rest_load", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None and proc.stderr is not None
    last = ""
    got: dict[str, Any] = {}
    for line in proc.stdout:
        line = line.strip()
        if line == "measuring":
            sampler.open()
        elif line == "measured":
            got = sampler.close()
        elif line:
            last = line
    stderr = proc.stderr.read()
    if proc.wait() != 0 or not last or not got:
        raise BenchError(f"the REST load generator failed:\n{stderr[-3000:]}")
    return json.loads(last), got


def run_once(cluster: Cluster, workload: str, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    cluster.check()
    sampler = GapSampler(cluster)
    if workload == "idle":
        time.sleep(args.warmup)
        sampler.open()
        time.sleep(args.duration)
        load: dict[str, Any] = {"requests": 0, "per_second": None, "p50_ms": None, "p99_ms": None,
                                "statuses": {}, "no_answer": {}}
        got = sampler.close()
    else:
        load, got = run_load(cluster, workload, clients, args, sampler)
    cluster.check()
    w = got["window"]
    requests = load["requests"]
    gaps = got["gaps"]
    return {
        "workload": workload, "clients": clients, "per_second": load["per_second"],
        "p50_ms": load["p50_ms"], "p99_ms": load["p99_ms"], "requests": requests,
        "not_ok": sum(n for s, n in load["statuses"].items() if not s.startswith("2"))
        + sum(load["no_answer"].values()),
        "statuses": load["statuses"], "no_answer": load["no_answer"],
        "worker_cpu_us": round(w["cpu_worker"] / requests * 1e6, 1) if requests else None,
        "daemon_cpu_us": round(w["cpu_daemon"] / requests * 1e6, 1) if requests else None,
        "describes_per_request": round(w["describes"] / requests, 3) if requests else None,
        "worker_cpu_share": round(w["cpu_worker"] / args.duration, 3),
        "heartbeats": int(w["gaps"]), "gaps_s": [round(g, 3) for g in gaps],
        "max_gap_s": round(max(gaps), 3) if gaps else None, "gap_bucket_s": got["gap_bucket_s"],
        "fences": int(w["fences"] + w["expiries"]), "lost": int(w["lost"]),
    }


def phases(args: argparse.Namespace) -> list[tuple[str, int]]:
    return [("idle", 0)] + [(wl, c) for c in args.clients for wl in args.workloads]


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    session_s = args.session_ms / 1000
    for workload, clients in phases(args):
        rs = [r for r in runs if (r["workload"], r["clients"]) == (workload, clients)]

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float | None:
            values = [r[key] for r in rs if r[key] is not None]
            return round(statistics.median(values), 3) if values else None

        gaps = [g for r in rs for g in r["gaps_s"]]
        max_gap = max(gaps) if gaps else None
        rows.append({
            "workload": workload, "clients": clients, "per_second": med("per_second"),
            "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"), "not_ok": sum(r["not_ok"] for r in rs),
            "worker_cpu_us": med("worker_cpu_us"), "daemon_cpu_us": med("daemon_cpu_us"),
            "describes_per_request": med("describes_per_request"),
            "worker_cpu_share": med("worker_cpu_share"),
            "heartbeats": sum(r["heartbeats"] for r in rs), "max_gap_s": max_gap,
            "max_gap_over_session": round(max_gap / session_s, 3) if max_gap is not None else None,
            "gap_bucket_s": max((r["gap_bucket_s"] for r in rs if r["gap_bucket_s"] is not None),
                                default=None),
            "fences": sum(r["fences"] for r in rs), "lost": sum(r["lost"] for r in rs),
            "runs": rs,
        })
    return rows


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | clients | req/s | p50 ms | p99 ms | not 2xx | w1 CPU µs/req | daemon CPU µs/req "
             "| Describes/req | w1 CPU share | heartbeats | max gap s | max gap / session | fenced |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['clients']} | {_fmt(r['per_second'], 0)} | {_fmt(r['p50_ms'], 2)} "
            f"| {_fmt(r['p99_ms'], 2)} | {r['not_ok']} | {_fmt(r['worker_cpu_us'], 0)} "
            f"| {_fmt(r['daemon_cpu_us'], 0)} | {_fmt(r['describes_per_request'], 2)} "
            f"| {_fmt(r['worker_cpu_share'], 2)} | {r['heartbeats']} "
            f"| {_fmt(r['max_gap_s'], 2)} | {_fmt(r['max_gap_over_session'], 2)} "
            f"| {r['fences'] + r['lost']} |")
    return "\n".join(lines)


def headline(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    by = {(r["workload"], r["clients"]): r for r in rows}
    # the most clients every request of which was answered 2xx (past the connections a worker
    # serves at once, the others are refused 503 at once: not a read's cost)
    first = "status" if "status" in args.workloads else args.workloads[0]
    top = max((c for c in args.clients if not by[(first, c)]["not_ok"]), default=max(args.clients))
    status = by[(first, top)]
    root = by.get(("root", top))
    flood = [r for r in rows if r["workload"] != "idle" and r["max_gap_s"] is not None]
    idle = by[("idle", 0)]
    worst = max(flood, key=lambda r: r["max_gap_s"]) if flood else None
    ratio = (status["per_second"] / root["per_second"]
             if root is not None and root["per_second"] and status["per_second"] else None)
    return {
        "workload": status["workload"], "clients": top, "per_second": status["per_second"],
        "p50_ms": status["p50_ms"], "p99_ms": status["p99_ms"],
        "over_root": round(ratio, 3) if ratio is not None else None,
        "max_gap_over_session_flood": worst["max_gap_over_session"] if worst else None,
        "max_gap_over_session_idle": idle["max_gap_over_session"],
        "fenced": sum(r["fences"] + r["lost"] for r in rows),
    }


def measure(args: argparse.Namespace, workdir: Path) -> tuple[list[dict[str, Any]], int]:
    cluster = Cluster(args, workdir)
    try:
        cluster.start()
        owned = cluster.owned_by_first()
        runs = []
        for rep in range(args.repeat):
            order = phases(args)
            for workload, clients in (order if rep % 2 == 0 else order[::-1]):
                runs.append(run_once(cluster, workload, clients, args))
        return summarize(runs, args), owned
    finally:
        cluster.close()


def _workloads(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in chosen if s not in WORKLOADS]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {','.join(WORKLOADS)}: {text!r}")
    return list(dict.fromkeys(chosen))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench rest", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--connectors", type=int, default=3, help="connectors (default 3)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per connector (default 4)")
    parser.add_argument("--clients", type=sizes_arg, default=[1, 64],
                        help="concurrent HTTP clients, comma-separated (default 1,64)")
    parser.add_argument("--workloads", type=_workloads, default=list(WORKLOADS),
                        help=f"comma-separated, from {','.join(WORKLOADS)} (default all; idle always runs)")
    parser.add_argument("--duration", type=float, default=12.0,
                        help="measured seconds per run (default 12: several heartbeat intervals)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each window (default 1)")
    parser.add_argument("--repeat", type=int, default=2, help="repetitions (median; default 2)")
    parser.add_argument("--session-ms", type=int, default=10_000,
                        help="the group's session timeout (default 10000, the product's)")
    parser.add_argument("--interval-ms", type=int, default=3_000,
                        help="the group's heartbeat interval (default 3000, the product's)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the logs here (default: a temporary directory)")
    parser.add_argument("--output", type=Path, default=RESULTS / "rest.json",
                        help="where to write the rows (default bench/results/rest.json)")
    args = parser.parse_args(argv)
    if min(args.workers, args.connectors, args.tasks, args.repeat) < 1 or args.duration <= 0:
        parser.error("--workers, --connectors, --tasks, --repeat must be >= 1 and --duration > 0")
    if not 0 < args.interval_ms < args.session_ms:
        parser.error("need 0 < --interval-ms < --session-ms")
    started = time.perf_counter()
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            rows, owned = measure(args, Path(tempfile.mkdtemp(prefix="bench-rest-", dir=args.workdir)))
        else:
            with tempfile.TemporaryDirectory(prefix="bench-rest-") as tmp:
                rows, owned = measure(args, Path(tmp))
    except BenchError as exc:
        print(f"bench rest: {exc}", file=sys.stderr)
        return 1
    head = headline(rows, args)
    result = {
        "benchmark": "rest",
        "unit": "requests/s, ms; heartbeat gaps in s; medians over repetitions (largest gap and "
                "fences over all)",
        "machine": machine(),
        "settings": {"workers": args.workers, "connectors": args.connectors, "tasks": args.tasks,
                     "clients": args.clients, "workloads": args.workloads, "duration": args.duration,
                     "warmup": args.warmup, "repeat": args.repeat, "session_ms": args.session_ms,
                     "interval_ms": args.interval_ms, "w1_instances": owned},
        "rows": rows,
        "headline": head,
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print()
    print(f"({args.workers} workers, {args.connectors} connectors x {args.tasks} tasks of {PLUGIN}, "
          f"w1 runs {owned} of them and takes every request; session {args.session_ms} ms, heartbeat "
          f"interval {args.interval_ms} ms; {args.duration:g} s windows, median of {args.repeat}; "
          f"rows written to {args.output})")
    ratio = head["over_root"]
    print(f"headline: GET {head['workload']} at {head['clients']} clients: {_fmt(head['per_second'], 0)} "
          f"req/s (p50 {_fmt(head['p50_ms'], 1)} ms, p99 {_fmt(head['p99_ms'], 1)} ms), "
          f"{'n/a' if ratio is None else f'{ratio:.2f}'} of GET /; max heartbeat gap / session "
          f"flooded {_fmt(head['max_gap_over_session_flood'], 2)} vs idle "
          f"{_fmt(head['max_gap_over_session_idle'], 2)}; fenced {head['fenced']}")
    if head["fenced"]:
        print(f"bench rest: a member was fenced during the runs ({head['fenced']})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
