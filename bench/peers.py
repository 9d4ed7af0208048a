"""Peers: the same job on this product and on tooz + Redis, under a kill, a join and a pause.

``python -m bench peers [--workers N] [--tasks M] [--scenarios kill,add,pause] [--repeat R]
[--session-ms S] [--interval-ms H] [--max-delay-ms D] [--pause-s P] [--quiet-s Q] [--output PATH]``

Both systems run N real worker processes and M tasks, and both record every start and stop of
a task as one JSON line (same format, one shared file per run), so one analysis
(``bench/_records.py``) measures both:

* **ours**: the real daemon (``connect-coordinator serve``: session timeout S, heartbeat
  interval H) and N ``connect-worker run`` processes (static members ``w1..wN``, ``--max-delay-ms
  D``) running the bundled recording plugin; one connector ``job`` with M tasks, created with
  the admin CLI. Only the M tasks are measured (the connector instance is not: tooz has none).
* **tooz**: a Redis server started by the benchmark (Debian's ``redis-server`` on 127.0.0.1, no
  persistence; installed with ``apt-get`` when missing and running as root) and N
  ``bench/_tooz_worker.py`` processes: ``join_partitioned_group``, tooz's heart thread,
  ``run_watchers()`` every H, own the tasks the consistent hash ring gives them. The Redis
  driver's ``membership_timeout`` is S: a member whose key is S old is removed.

Each run starts from a stable state (every task running exactly once, nothing changing for Q
seconds), then one event:

* ``kill``: SIGKILL the worker that runs the most tasks;
* ``add``: start worker N+1;
* ``pause``: SIGSTOP the worker that runs the most tasks for P seconds (longer than the session
  timeout), then SIGCONT. Ours, woken past its lease's end plus its stop budget, ends itself
  (the fail-stop rule, exit status 3) and is restarted as a supervisor would (``fail_stops``).

The run ends when, after the event (and after the SIGCONT), every task has run exactly once for
Q seconds. Measured from the records over [event, end]: time until full coverage (every task
owned exactly once and running, for good), tasks moved (started on another worker than the one
that ran them last) vs the fewest any system must move, task-seconds owned by two workers at
once, task-seconds not running anywhere. A paused process owns its tasks until it records their
stops after it resumes (it cannot record anything while stopped, and when it resumes it goes on
with them until it notices); a paused process runs nothing, so its tasks count as down meanwhile.

Runs alternate ours / tooz within each scenario, the order reversed on every other repetition;
the table shows medians over ``--repeat`` repetitions (the double ownership also its maximum).
The last line is the headline: double-ownership seconds (sum over scenarios of the medians) and
the ratio of task downtime ours / tooz. Rows go to ``bench/results/peers.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import _records
from bench._common import RESULTS, ROOT, BenchError, Process, child_env, machine, start_daemon
from worker_client.failstop import FAIL_STOP_EXIT

SCENARIOS = ("kill", "add", "pause")
VARIANTS = ("ours", "tooz")
CONNECTOR = "job"
PLUGIN = "worker_client.examples.recording:RecordingConnector"
POLL_S = 0.05
REDIS_CANDIDATES = ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server")


class Unavailable(BenchError):
    """A prerequisite (redis-server, tooz) is missing and cannot be installed: exit 2."""


# == the backends ==================================================================================


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _find_redis() -> str | None:
    return shutil.which("redis-server") or next(
        (p for p in REDIS_CANDIDATES if os.access(p, os.X_OK)), None)


def redis_binary() -> str:
    """Debian's redis-server; installed with apt-get when it is missing and we are root."""
    found = _find_redis()
    if found:
        return found
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise Unavailable("redis-server is not installed and this is not root: install it "
                          "(`sudo apt-get install -y redis-server`) and run again")
    # On stderr: stdout is the table (the smoke test reads it from its first line).
    print("bench peers: redis-server not found; running apt-get install -y redis-server",
          file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "redis-server"]
    done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env, check=False)
        done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    found = _find_redis()
    if done.returncode != 0 or not found:
        raise Unavailable(f"apt-get install redis-server failed ({done.returncode}):\n"
                          f"{(done.stdout + done.stderr)[-2000:]}")
    return found


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``redis-server`` on a free port of 127.0.0.1, no persistence; waits until it answers."""
    import redis

    binary = redis_binary()
    port = _free_port()
    log = workdir / "redis.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--daemonize", "no"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while True:
        try:
            if redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping():
                return proc, port
        except redis.RedisError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise BenchError(f"redis-server did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


class Ours:
    """The daemon (shared by every run, one group per run) and `connect-worker run` processes."""

    name = "ours"

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        env = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": str(args.session_ms),
               "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": str(args.interval_ms)}
        self.daemon: Process = start_daemon(workdir / "data", extra_env=env, timeout_s=60)[0]
        self.bootstrap = f"{self.daemon.host}:{self.daemon.port}"

    def prepare(self, group: str, records: Path) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "coordinator.cli", "connectors", "create", "--bootstrap", self.bootstrap,
             "--group", group, CONNECTOR, "--tasks", str(self.args.tasks),
             "--config", f"connector.class={PLUGIN}", "--config", f"record.file={records}"],
            capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60, check=False)
        if done.returncode != 0:
            raise BenchError(f"connectors create failed:\n{done.stdout}{done.stderr}")

    def command(self, name: str, group: str, records: Path, tag: str) -> list[str]:
        a = self.args
        return [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", self.bootstrap,
                "--group", group, "--instance-id", name, "--session-timeout-ms", str(a.session_ms),
                "--max-delay-ms", str(a.max_delay_ms), "--rebalance-timeout-ms", str(a.rebalance_timeout_ms),
                "--log-level", "warning"]

    def check(self) -> None:
        if self.daemon.proc.poll() is not None:
            raise BenchError(f"the daemon exited:\n{self.daemon.stderr()[-3000:]}")

    def close(self) -> None:
        self.daemon.stop()


class Tooz:
    """A Redis server (shared by every run, one tooz group per run) and tooz peer processes."""

    name = "tooz"

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.redis, port = start_redis(workdir)
        # membership_timeout: a member whose key was not refreshed for this long is removed
        # (tooz's heart refreshes it every membership_timeout / 2).
        self.url = f"redis://127.0.0.1:{port}?membership_timeout={args.session_ms / 1000:g}"

    def prepare(self, group: str, records: Path) -> None:
        pass  # the first member creates the group (join_partitioned_group)

    def command(self, name: str, group: str, records: Path, tag: str) -> list[str]:
        a = self.args
        return [sys.executable, "-m", "bench._tooz_worker", "--url", self.url, "--group", group,
                "--member-id", f"{name}-{tag}", "--name", name, "--tasks", str(a.tasks),
                "--prefix", CONNECTOR, "--poll", f"{a.interval_ms / 1000:g}", "--record", str(records)]

    def check(self) -> None:
        if self.redis.poll() is not None:
            raise BenchError("redis-server exited")

    def close(self) -> None:
        if self.redis.poll() is None:
            self.redis.terminate()
            try:
                self.redis.wait(10)
            except subprocess.TimeoutExpired:
                self.redis.kill()
                self.redis.wait()


# == one run =======================================================================================


class Run:
    """N worker processes of one variant in a fresh group, their shared record file, and what
    the benchmark did to them (kills, pauses)."""

    def __init__(self, variant: Ours | Tooz, args: argparse.Namespace, base: Path, tag: str) -> None:
        self.variant = variant
        self.args = args
        self.base = base
        self.tag = tag
        self.group = f"peers-{tag}"
        self.records = base / "records.jsonl"
        self.records.touch()
        self.tasks = [f"{CONNECTOR}/{i}" for i in range(args.tasks)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ended: dict[int, tuple[float, str]] = {}
        self.pauses: dict[int, list[tuple[float, float | None]]] = {}
        self.fail_stops = 0
        variant.prepare(self.group, self.records)

    def spawn(self, name: str) -> None:
        log = self.base / f"worker-{name}.log"
        with open(log, "ab") as out:  # (appended: a restarted worker keeps its predecessor's log)
            self.procs[name] = subprocess.Popen(
                self.variant.command(name, self.group, self.records, self.tag), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)

    def timeline(self) -> _records.Timeline:
        return _records.timeline(_records.read(self.records), self.ended)

    def good(self, tl: _records.Timeline, now: float) -> bool:
        """Every task owned exactly once, by a process that is not paused."""
        owners = tl.owners_at(now, self.pauses)
        return all(len(owners.get(t, ())) == 1 and owners[t][0][1] for t in self.tasks)

    def wait_quiet(self, what: str, timeout_s: float, not_before: float = 0.0,
                   also: Callable[[_records.Timeline], bool] = lambda tl: True) -> bool:
        """Until every task has been owned exactly once (and nothing was recorded) for the quiet
        period, at or after ``not_before``, and ``also`` holds. False on timeout."""
        deadline = time.monotonic() + timeout_s
        good_since: float | None = None
        seen = -1
        while True:
            self.variant.check()
            for name, proc in list(self.procs.items()):
                if proc.pid not in self.ended and proc.poll() is not None:
                    if proc.returncode == FAIL_STOP_EXIT and self.variant.name == "ours":
                        # The fail-stop rule (docs/worker.md): a worker that wakes from a pause
                        # past its lease's end plus its stop budget ends itself, its work with
                        # it (its records end here, like a kill); a supervisor restarts it.
                        self.ended[proc.pid] = (time.time(), "kill")
                        self.fail_stops += 1
                        self.spawn(name)
                        continue
                    raise BenchError(f"{self.variant.name} worker {name} exited with {proc.returncode} "
                                     f"during {what}:\n{self.logs(name)}")
            now = time.time()
            size = self.records.stat().st_size
            tl = self.timeline()
            if size != seen or not self.good(tl, now) or not also(tl):
                good_since = None
                seen = size
            elif good_since is None:
                good_since = now
            if good_since is not None and now - good_since >= self.args.quiet_s and now >= not_before:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)

    def joined(self, name: str, tl: _records.Timeline) -> bool:
        """The worker has started something, or (a tooz peer, which may own nothing) said it
        joined its group."""
        pid = self.procs[name].pid
        if any(iv.pid == pid for iv in tl.intervals):
            return True
        path = self.base / f"worker-{name}.log"
        return path.exists() and any(line.startswith("joined ") for line in
                                     path.read_text(errors="replace").splitlines())

    def wait_joined(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.joined(name, self.timeline()):
            proc = self.procs[name]
            if proc.poll() is not None:
                raise BenchError(f"{self.variant.name} worker {name} exited with {proc.returncode}:\n"
                                 f"{self.logs(name)}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.variant.name} worker {name} did not join within {timeout_s}s:\n"
                                 f"{self.logs(name)}")
            time.sleep(POLL_S)

    def holders(self) -> dict[str, str]:
        held = self.timeline().holders(time.time())
        return {t: held[t] for t in self.tasks if t in held}

    def logs(self, name: str, tail: int = 2000) -> str:
        path = self.base / f"worker-{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def close(self) -> None:
        for pid, windows in self.pauses.items():  # never leave a stopped process behind
            if windows and windows[-1][1] is None:
                os.kill(pid, signal.SIGCONT)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_once(variant: Ours | Tooz, scenario: str, args: argparse.Namespace, base: Path,
             rep: int) -> dict[str, Any]:
    """One run: N workers until stable, the event, until stable again; what the records say.
    The victim of a kill or a pause is ``w1``, ``w2``, ... in turn by repetition (any worker,
    not the busiest: a hash ring is not balanced, and picking its busiest would load the dice)."""
    tag = f"{scenario}-{variant.name}-r{rep}"
    base.mkdir(parents=True)
    run = Run(variant, args, base, tag)
    names = [f"w{i + 1}" for i in range(args.workers)]
    try:
        # One at a time: tooz's Partitioner has a race when members join at the same time (a
        # member joining between the two reads a new Partitioner makes of the group is never
        # added to its ring, for good). Both systems start the same way.
        for name in names:
            run.spawn(name)
            run.wait_joined(name, 30)
        if not run.wait_quiet("setup", 90):
            raise BenchError(f"{variant.name}: no stable state with {args.workers} workers within 90 s")
        before = run.holders()
        after_workers = set(names)
        not_before = 0.0
        resumed: float | None = None
        joined_by: float | None = None  # add: wait for the new worker's first start (or this)
        victim = ""
        paused_pid = 0
        t0 = time.time()
        if scenario == "kill":
            victim = names[rep % len(names)]
            proc = run.procs[victim]
            t0 = time.time()
            proc.kill()
            proc.wait(10)
            run.ended[proc.pid] = (time.time(), "kill")
            after_workers.discard(victim)
        elif scenario == "add":
            victim = f"w{args.workers + 1}"
            t0 = time.time()
            run.spawn(victim)
            after_workers.add(victim)
            joined_by = time.monotonic() + 20
        elif scenario == "pause":
            victim = names[rep % len(names)]
            pid = paused_pid = run.procs[victim].pid
            t0 = time.time()
            os.kill(pid, signal.SIGSTOP)
            run.pauses[pid] = [(t0, None)]
            time.sleep(args.pause_s)
            resumed = time.time()
            run.pauses[pid] = [(t0, resumed)]
            os.kill(pid, signal.SIGCONT)
            not_before = resumed
        else:
            raise BenchError(f"unknown scenario {scenario!r}")

        def also(tl: _records.Timeline) -> bool:
            return joined_by is None or time.monotonic() > joined_by or run.joined(victim, tl)

        limit = args.session_ms / 1000 + args.max_delay_ms / 1000 + args.pause_s + 60
        converged = run.wait_quiet(scenario, limit, not_before=not_before, also=also)
        t1 = time.time()
        tl = run.timeline()
        w = tl.window(run.tasks, t0, t1, run.pauses)
        need = _records.min_moves(before, names, after_workers)
        stopped_after_resume = None  # pause: how long the resumed worker still owned its tasks
        if resumed is not None:
            pid = paused_pid
            stops = [iv.stop for iv in tl.intervals if iv.pid == pid and iv.start < t0
                     and iv.item in before and iv.stop is not None and iv.stop >= resumed]
            stopped_after_resume = round(max(stops) - resumed, 3) if stops else None
        return {
            "variant": variant.name, "scenario": scenario, "tag": tag, "victim": victim,
            "victim_tasks": sum(1 for owner in before.values() if owner == victim),
            "event_ts": round(t0, 6), "stopped_after_resume_s": stopped_after_resume,
            "fail_stops": run.fail_stops,
            "converged": converged,
            "covered_after_s": None if w.covered_after_s is None else round(w.covered_after_s, 3),
            "moves": w.moves, "min_moves": need,
            "double_owned_s": round(w.double_owned_s, 3), "double_owned_tasks": w.double_owned_items,
            "max_double_owned_at_once": w.max_double_owned,
            "downtime_s": round(w.downtime_s, 3), "window_s": round(t1 - t0, 3),
            "problems": tl.problems,
        }
    finally:
        run.close()


# == the benchmark =================================================================================


def measure(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    variants: dict[str, Ours | Tooz] = {}
    try:
        variants["tooz"] = Tooz(args, workdir)
        variants["ours"] = Ours(args, workdir)
        runs: list[dict[str, Any]] = []
        for rep in range(args.repeat):
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for scenario in args.scenarios:
                for name in order:
                    tag = f"{scenario}-{name}-r{rep}"
                    result = run_once(variants[name], scenario, args, workdir / tag, rep)
                    runs.append(result)
                    print(f"  {tag}: coverage {result['covered_after_s']} s, moved {result['moves']} "
                          f"(min {result['min_moves']}), double-owned {result['double_owned_s']} s, "
                          f"downtime {result['downtime_s']} s", file=sys.stderr, flush=True)
    finally:
        for v in variants.values():
            v.close()
    return summarize(runs, args)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for scenario in args.scenarios:
        for name in VARIANTS:
            rs = [r for r in runs if r["scenario"] == scenario and r["variant"] == name]
            rows.append({
                "scenario": scenario, "system": name, "workers": args.workers, "tasks": args.tasks,
                "covered_after_s": _median([r["covered_after_s"] for r in rs]),
                "not_converged": sum(1 for r in rs if not r["converged"] or r["covered_after_s"] is None),
                "moves": _median([r["moves"] for r in rs]),
                "min_moves": _median([r["min_moves"] for r in rs]),
                "double_owned_s": _median([r["double_owned_s"] for r in rs]),
                "double_owned_s_max": max(r["double_owned_s"] for r in rs),
                "double_owned_tasks": _median([r["double_owned_tasks"] for r in rs]),
                "downtime_s": _median([r["downtime_s"] for r in rs]),
                "stopped_after_resume_s": _median([r["stopped_after_resume_s"] for r in rs]),
                "runs": rs,
            })
    return rows


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| scenario | system | full coverage after s | moved (min) | double-owned task-s (max) "
             "| tasks double-owned | downtime task-s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        coverage = _fmt(r["covered_after_s"])
        if r["not_converged"]:
            coverage += f" ({r['not_converged']} not converged)"
        lines.append(f"| {r['scenario']} | {r['system']} | {coverage} | {_fmt(r['moves'], 0)} "
                     f"({_fmt(r['min_moves'], 0)}) | {_fmt(r['double_owned_s'])} "
                     f"({_fmt(r['double_owned_s_max'])}) | {_fmt(r['double_owned_tasks'], 0)} "
                     f"| {_fmt(r['downtime_s'])} |")
    return "\n".join(lines)


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def total(system: str, key: str) -> float:
        return sum(r[key] or 0.0 for r in rows if r["system"] == system)

    down_ours, down_tooz = total("ours", "downtime_s"), total("tooz", "downtime_s")
    return {
        "metric": "double-owned task-seconds (sum over scenarios of the medians); "
                  "task downtime ours / tooz (sums of the medians)",
        "double_owned_s": {"ours": round(total("ours", "double_owned_s"), 3),
                           "tooz": round(total("tooz", "double_owned_s"), 3)},
        "double_owned_s_worst_run": {
            s: max((r["double_owned_s_max"] for r in rows if r["system"] == s), default=0.0)
            for s in VARIANTS},
        "downtime_s": {"ours": round(down_ours, 3), "tooz": round(down_tooz, 3)},
        "downtime_ratio": round(down_ours / down_tooz, 3) if down_tooz else None,
    }


def _scenarios(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in chosen if s not in SCENARIOS]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {','.join(SCENARIOS)}: {text!r}")
    return list(dict.fromkeys(chosen))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes N (default 4)")
    parser.add_argument("--tasks", type=int, default=16, help="tasks M (default 16)")
    parser.add_argument("--scenarios", type=_scenarios, default=list(SCENARIOS),
                        help="comma-separated, from kill,add,pause (default all three)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median; default 3)")
    parser.add_argument("--session-ms", type=int, default=3000,
                        help="our session timeout = tooz's membership_timeout (default 3000)")
    parser.add_argument("--interval-ms", type=int, default=1000,
                        help="our heartbeat interval = tooz's run_watchers period (default 1000)")
    parser.add_argument("--max-delay-ms", type=int, default=None,
                        help="ours: how long a departed worker's work is held "
                        "(scheduled.rebalance.max.delay.ms; default = --session-ms)")
    parser.add_argument("--rebalance-timeout-ms", type=int, default=None,
                        help="ours: half of it is each stop's budget, and how long past its session a "
                        "fenced worker's work is held (default 2 x --max-delay-ms, at least 1000)")
    parser.add_argument("--pause-s", type=float, default=None,
                        help="how long the paused worker stays stopped (default 1.5 x the session timeout)")
    parser.add_argument("--quiet-s", type=float, default=None,
                        help="a state is stable after this long without a change "
                        "(default 3 x the heartbeat interval)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep every run's records and logs here (default: a temporary directory)")
    parser.add_argument("--output", type=Path, default=RESULTS / "peers.json",
                        help="where to write the rows (default bench/results/peers.json)")
    args = parser.parse_args(argv)
    if args.max_delay_ms is None:
        args.max_delay_ms = args.session_ms
    if args.rebalance_timeout_ms is None:
        args.rebalance_timeout_ms = max(1000, 2 * args.max_delay_ms)
    if args.pause_s is None:
        args.pause_s = 1.5 * args.session_ms / 1000
    if args.quiet_s is None:
        args.quiet_s = 3 * args.interval_ms / 1000
    if args.workers < 1 or args.tasks < 1 or args.repeat < 1 or args.max_delay_ms < 0:
        parser.error("--workers, --tasks, --repeat must be >= 1 and --max-delay-ms >= 0")
    if args.rebalance_timeout_ms < 200:
        parser.error("--rebalance-timeout-ms must be >= 200")
    if not 0 < args.interval_ms < args.session_ms or args.session_ms < 1000:
        parser.error("need 0 < --interval-ms < --session-ms and --session-ms >= 1000")
    if args.pause_s * 1000 <= args.session_ms or args.quiet_s <= 0:
        parser.error("--pause-s must outlast the session timeout and --quiet-s must be > 0")
    missing = [m for m in ("tooz", "redis") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"bench peers: {' and '.join(missing)} not installed: pip install "
              f"'connect-coordinator[bench]' (or pip install tooz redis)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            rows = measure(args, Path(tempfile.mkdtemp(prefix="bench-peers-", dir=args.workdir)))
        else:
            with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
                rows = measure(args, Path(tmp))
    except Unavailable as exc:
        print(f"bench peers: {exc}", file=sys.stderr)
        return 2
    except BenchError as exc:
        print(f"bench peers: {exc}", file=sys.stderr)
        return 1
    head = headline(rows)
    result = {
        "benchmark": "peers",
        "unit": "seconds; task-seconds summed over tasks; medians over repetitions",
        "machine": machine(),
        "settings": {"workers": args.workers, "tasks": args.tasks, "scenarios": args.scenarios,
                     "repeat": args.repeat, "session_ms": args.session_ms, "interval_ms": args.interval_ms,
                     "max_delay_ms": args.max_delay_ms, "rebalance_timeout_ms": args.rebalance_timeout_ms,
                     "pause_s": args.pause_s, "quiet_s": args.quiet_s},
        "rows": rows,
        "headline": head,
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print()
    print(f"({args.workers} workers, {args.tasks} tasks; session / membership timeout {args.session_ms} ms, "
          f"heartbeat / watcher poll {args.interval_ms} ms, ours --max-delay-ms {args.max_delay_ms} "
          f"--rebalance-timeout-ms {args.rebalance_timeout_ms}, "
          f"pause {args.pause_s:g} s; median of {args.repeat}; rows written to {args.output})")
    resumed = {r["system"]: r["stopped_after_resume_s"] for r in rows if r["scenario"] == "pause"}
    if resumed:
        print("(pause: the resumed worker stopped its tasks " + ", ".join(
            f"{name} {_fmt(resumed.get(name), 3)} s" for name in VARIANTS) + " after SIGCONT)")
    ratio = head["downtime_ratio"]
    print(f"headline: double-ownership s ours {head['double_owned_s']['ours']:.2f} vs tooz "
          f"{head['double_owned_s']['tooz']:.2f}; downtime ours/tooz = "
          f"{'n/a' if ratio is None else f'{ratio:.2f}'} "
          f"({head['downtime_s']['ours']:.1f} / {head['downtime_s']['tooz']:.1f} task-s; worst run "
          f"double-owned: ours {head['double_owned_s_worst_run']['ours']:.2f} s, tooz "
          f"{head['double_owned_s_worst_run']['tooz']:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
