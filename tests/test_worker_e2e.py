"""End to end with real processes: a coordinator daemon and `connect-worker` processes running
the bundled recording plugin (``worker_client.examples.recording``), which appends one JSON line
per start and stop of every connector and task to one shared file.

The records are the ground truth. :func:`analyze` turns them into per-item intervals
``[start, stop)`` on each worker process (a SIGKILLed process's open intervals end at the instant
the test saw it dead), and the scenarios assert, from the records alone:

* **safety** — no item ever ran on two worker processes at once (:meth:`Timeline.overlaps`);
* **liveness** — after each event every configured item runs again, exactly once, on the worker
  the coordinator says (:meth:`Cluster.wait_converged`, polled with a deadline);
* **stability** — only the work that had to move moved (:func:`moves` against
  :func:`min_moves`, the fewest changes that balance connectors and tasks separately).

Scenarios: scale up 1 -> 2 -> 3, kill -9 one worker (its work is held for the session timeout
plus the scheduled-rebalance delay, then runs elsewhere; the others' work never stops), bounce a
static worker within the delay (it gets exactly its work back, nobody else ran it), and a rolling
restart of all three static workers. The coordinator runs with a 2000 ms session timeout and a
200 ms heartbeat interval; workers with ``--max-delay-ms 1500``.
"""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient
from tests.daemon_fixture import ROOT, SHORT_TIMEOUTS, Daemon, DaemonPool, daemon_env, run_cli

GROUP = "e2e"
SESSION_MS = int(SHORT_TIMEOUTS["CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS"])
INTERVAL_MS = int(SHORT_TIMEOUTS["CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS"])
MAX_DELAY_MS = 1500
REBALANCE_MS = 4000
CONNECTORS = {"alpha": 4, "beta": 3}  # 2 connectors + 7 tasks
PLUGIN = "worker_client.examples.recording:RecordingConnector"
CONVERGE_S = 20.0
MEASURED: dict[str, Any] = {}  # numbers reported with -s (and asserted on where it matters)


def configured_items(connectors: Mapping[str, int] = CONNECTORS) -> set[str]:
    return {i for name, n in connectors.items() for i in (name, *(f"{name}/{t}" for t in range(n)))}


# == the record analyzer ===========================================================================


@dataclass
class Interval:
    item: str
    worker: str
    pid: int
    start: float
    stop: float | None = None  # None: still running
    end: str = "open"  # "stop" (recorded), "kill" (process SIGKILLed), "failstop" (the worker
    # ended itself by the fail-stop rule), "exit" (exited, no stop), "open"

    def overlaps(self, other: Interval) -> bool:
        a_end = math.inf if self.stop is None else self.stop
        b_end = math.inf if other.stop is None else other.stop
        return self.start < b_end and other.start < a_end


@dataclass
class Timeline:
    intervals: list[Interval]
    problems: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def by_item(self) -> dict[str, list[Interval]]:
        out: dict[str, list[Interval]] = {}
        for iv in self.intervals:
            out.setdefault(iv.item, []).append(iv)
        return out

    def overlaps(self) -> list[tuple[Interval, Interval]]:
        """Pairs of intervals of one item on two different workers (process and worker id: in-process
        tests run several workers in one process) that intersect."""
        found = []
        for ivs in self.by_item().values():
            ivs = sorted(ivs, key=lambda iv: iv.start)
            for i, a in enumerate(ivs):
                for b in ivs[i + 1:]:
                    if (a.pid, a.worker) != (b.pid, b.worker) and a.overlaps(b):
                        found.append((a, b))
        return found

    def running(self) -> dict[str, list[Interval]]:
        """Open intervals (what runs now), per item."""
        out: dict[str, list[Interval]] = {}
        for iv in self.intervals:
            if iv.stop is None:
                out.setdefault(iv.item, []).append(iv)
        return out

    def between(self, t0: float, t1: float = math.inf, event: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if t0 <= e["ts"] <= t1 and (event is None or e["event"] == event)]


def analyze(records: Iterable[Mapping[str, Any]], ended: Mapping[int, tuple[float, str]] = {}) -> Timeline:
    """Per item and worker process, the intervals [start, stop) from the recording plugin's lines.

    ``ended`` maps the pid of a worker process that is gone to (instant, how): ``"kill"``
    (SIGKILL: it could not record its stops, so its open intervals end at that instant),
    ``"failstop"`` (the worker ended itself because a plugin did not stop: the same) or
    ``"exit"`` (it exited by itself: an open interval is a plugin abandoned without ``stop()``,
    a problem; it is closed at that instant). A stop without a start, or a second start of an
    item by the same process before its stop, is a problem too. A ``tick`` (the plugin still
    running) must fall inside an open interval of its process: a tick after its stop (an
    abandoned plugin still running) or after its process ended is a problem.
    """
    events = sorted(records, key=lambda r: r["ts"])
    timeline = Timeline([], events=list(events))
    open_: dict[tuple[str, int, str], Interval] = {}
    for e in events:
        key = (e["item"], e["pid"], e["worker"])
        if e["event"] == "start":
            if key in open_:
                timeline.problems.append(f"{e['item']} started twice by pid {e['pid']} ({e['worker']})")
                continue
            iv = Interval(e["item"], e["worker"], e["pid"], e["ts"])
            open_[key] = iv
            timeline.intervals.append(iv)
        elif e["event"] == "stop":
            iv = open_.pop(key, None)
            if iv is None:
                timeline.problems.append(f"{e['item']} stopped by pid {e['pid']} without a start")
                continue
            iv.stop, iv.end = e["ts"], "stop"
        elif e["event"] == "block":
            pass  # the plugin blocked its event loop (run.mode=block)
        elif e["event"] == "tick":
            if key not in open_:
                timeline.problems.append(f"{e['item']} ticked in pid {e['pid']} ({e['worker']}) "
                                         f"at {e['ts']:.3f} outside a start..stop")
            elif e["pid"] in ended and e["ts"] > ended[e["pid"]][0]:
                timeline.problems.append(f"{e['item']} ticked in pid {e['pid']} after it ended")
        else:
            timeline.problems.append(f"unknown event {e!r}")
    for (item, pid, _worker), iv in open_.items():
        if pid in ended:
            at, how = ended[pid]
            iv.stop, iv.end = max(at, iv.start), how
            if how not in ("kill", "failstop"):
                timeline.problems.append(f"{item} still running when pid {pid} ({iv.worker}) exited")
    return timeline


def moves(before: Mapping[str, str], after: Mapping[str, str]) -> set[str]:
    """Items whose running worker changed."""
    return {i for i in before.keys() & after.keys() if before[i] != after[i]}


def min_moves(before: Mapping[str, str], workers: Iterable[str]) -> int:
    """The fewest items that must change worker so that connectors and tasks are each balanced
    (every worker floor or ceil of the count of its kind) over ``workers``: every item of a
    worker that is gone, plus each worker's excess over its share (the ceil shares going to the
    workers that hold the most)."""
    ws = sorted(set(workers))
    total = 0
    for is_task in (False, True):
        kind = [i for i in before if ("/" in i) == is_task]
        counts = sorted((sum(1 for i in kind if before[i] == w) for w in ws), reverse=True)
        q, r = divmod(len(kind), len(ws))
        shares = [q + 1] * r + [q] * (len(ws) - r)
        total += sum(1 for i in kind if before[i] not in ws)
        total += sum(max(0, c - s) for c, s in zip(counts, shares, strict=True))
    return total


def test_analyzer_finds_overlaps_kills_and_moves() -> None:
    recs = [
        {"ts": 1.0, "worker": "w1", "item": "a/0", "event": "start", "pid": 1},
        {"ts": 2.0, "worker": "w1", "item": "a/0", "event": "stop", "pid": 1},
        {"ts": 2.5, "worker": "w2", "item": "a/0", "event": "start", "pid": 2},  # after the stop: fine
        {"ts": 1.0, "worker": "w1", "item": "a/1", "event": "start", "pid": 1},
        {"ts": 3.0, "worker": "w2", "item": "a/1", "event": "start", "pid": 2},  # w1 never stopped it
        {"ts": 1.0, "worker": "w3", "item": "a", "event": "start", "pid": 3},  # w3 killed at 4.0
        {"ts": 4.5, "worker": "w1", "item": "a", "event": "start", "pid": 1},
    ]
    t = analyze(recs, {3: (4.0, "kill")})
    assert [(a.item, a.pid, b.pid) for a, b in t.overlaps()] == [("a/1", 1, 2)]
    killed = next(iv for iv in t.intervals if iv.pid == 3)
    assert (killed.stop, killed.end) == (4.0, "kill")
    # The same kill a second later would overlap the restart elsewhere.
    late = analyze(recs, {3: (5.0, "kill")}).overlaps()
    assert sorted((a.item, a.pid, b.pid) for a, b in late) == [("a", 3, 1), ("a/1", 1, 2)]
    assert {i: [iv.worker for iv in ivs] for i, ivs in t.running().items()} == {
        "a/0": ["w2"], "a/1": ["w1", "w2"], "a": ["w1"]}
    exited = analyze(recs[:1], {1: (1.5, "exit")})
    assert exited.problems and "still running" in exited.problems[0]
    assert analyze([recs[1]]).problems == ["a/0 stopped by pid 1 without a start"]
    assert moves({"a": "w1", "b": "w1"}, {"a": "w1", "b": "w2"}) == {"b"}
    # 2 connectors + 7 tasks on one worker -> two workers: 1 connector + 3 tasks must move.
    one = {i: "w1" for i in configured_items()}
    assert min_moves(one, ["w1", "w2"]) == 4
    assert min_moves(one, ["w2", "w3"]) == 9  # all of a departed worker's items move
    assert min_moves({"a": "w1", "a/0": "w1", "a/1": "w2"}, ["w1", "w2"]) == 0


# == the cluster ===================================================================================


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A daemon, the connectors, and named `connect-worker` processes (static members)."""

    def __init__(self, base: Path, daemon: Daemon) -> None:
        self.base = base
        self.daemon = daemon
        self.records = base / "records.jsonl"
        self.records.touch()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.metrics_port: dict[str, int] = {}
        self.ended: dict[int, tuple[float, str]] = {}
        self.spawned = 0

    # -- setup ---------------------------------------------------------------------------------
    def create_connectors(self, connectors: Mapping[str, int] = CONNECTORS) -> None:
        for name, tasks in connectors.items():
            r = run_cli("connectors", "create", "--bootstrap", self.daemon.bootstrap, "--group", GROUP,
                        name, "--tasks", str(tasks), "--config", f"connector.class={PLUGIN}",
                        "--config", f"record.file={self.records}")
            assert r.returncode == 0, r.stderr
            assert r.stdout.startswith("ok: group"), r.stdout

    def spawn(self, name: str, metrics: bool = False,
              rebalance_ms: int = REBALANCE_MS) -> subprocess.Popen[bytes]:
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} runs already"
        cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", self.daemon.bootstrap,
               "--group", GROUP, "--instance-id", name, "--session-timeout-ms", str(SESSION_MS),
               "--max-delay-ms", str(MAX_DELAY_MS), "--rebalance-timeout-ms", str(rebalance_ms)]
        if metrics:
            self.metrics_port[name] = _free_port()
            cmd += ["--metrics-listen", f"127.0.0.1:{self.metrics_port[name]}"]
        self.spawned += 1
        log = self.base / f"worker-{name}-{self.spawned}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    env=daemon_env(), cwd=ROOT)
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> float:
        """kill -9; returns the instant the process was seen dead (its intervals end there)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait(10)
        at = time.time()
        self.ended[proc.pid] = (at, "kill")
        return at

    def terminate(self, name: str) -> float:
        """SIGTERM (stop the work, leave: -2 for these static members); asserts exit code 0."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        at = time.time()
        self.ended[proc.pid] = (at, "exit")
        assert code == 0, self.logs(name)
        return at

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs(self, name: str | None = None, tail: int = 3000) -> str:
        out = []
        for path in sorted(self.base.glob(f"worker-{name or '*'}-*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    # -- observing -----------------------------------------------------------------------------
    def describe(self) -> Any:
        with AdminClient(self.daemon.host, self.daemon.port, timeout_s=5) as c:
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(GROUP,))).groups
        return g

    def timeline(self) -> Timeline:
        lines = self.records.read_text().splitlines()
        return analyze([json.loads(line) for line in lines if line.strip()], self.ended)

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def wait_converged(self, workers: set[str], what: str, timeout_s: float = CONVERGE_S,
                       since: float | None = None) -> dict[str, str]:
        """Poll until the group is Stable with exactly ``workers``, each running its target, every
        configured item in exactly one assignment, and the records agree: each item has exactly
        one open interval, on the current process of the worker the coordinator says. Returns
        item -> worker; the time taken (from ``since``, default now) goes to MEASURED[what]."""
        started = time.time() if since is None else since
        deadline = time.monotonic() + timeout_s
        expected_items = configured_items()
        why = "not polled"
        while True:
            g = self.describe()
            owner: dict[str, str] = {}
            dupes = []
            for m in g.members:
                for i in _items(m.assignment):
                    if i in owner:
                        dupes.append(i)
                    owner[i] = m.instance_id
            members = {m.instance_id for m in g.members}
            running = self.timeline().running()
            if g.group_state != "Stable":
                why = f"group {g.group_state}"
            elif members != workers:
                why = f"members {sorted(members)}"
            elif any(m.member_state != "Stable" or _items(m.assignment) != _items(m.target_assignment)
                     for m in g.members):
                why = "a member is reconciling"
            elif dupes or set(owner) != expected_items:
                why = f"assignment dupes={dupes} missing={sorted(expected_items - set(owner))}"
            elif set(running) != expected_items:
                why = f"not running per the records: {sorted(expected_items - set(running))}"
            elif bad := {i: [(iv.worker, iv.pid) for iv in ivs] for i, ivs in running.items()
                         if [iv.pid for iv in ivs] != [self.pid(owner[i])]}:
                why = f"records disagree with the coordinator: {bad}"
            else:
                MEASURED[what] = round(time.time() - started, 3)
                return owner
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: no convergence within {timeout_s}s: {why}\n"
                                     f"{self.logs(tail=1500)}")
            time.sleep(0.05)

    def assert_safe(self) -> Timeline:
        t = self.timeline()
        assert not t.problems, t.problems
        overlaps = t.overlaps()
        assert not overlaps, "items ran on two workers at once: " + "; ".join(
            f"{a.item}: {a.worker}/{a.pid} [{a.start:.3f}, {a.stop}) vs {b.worker}/{b.pid} "
            f"[{b.start:.3f}, {b.stop})" for a, b in overlaps)
        return t


def _items(a: Any) -> set[str]:
    return {*a.connectors, *(f"{t.connector}/{t.task}" for t in a.tasks)}


def _of(owner: Mapping[str, str], worker: str) -> set[str]:
    return {i for i, w in owner.items() if w == worker}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    MEASURED.clear()
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool.start())
        try:
            c.create_connectors()
            yield c
        finally:
            c.close()
    if MEASURED:
        print("\nmeasured:", json.dumps(MEASURED, sort_keys=True))


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# == scenarios =====================================================================================


def test_scale_up_moves_only_what_balance_needs(cluster: Cluster) -> None:
    everything = configured_items()
    cluster.spawn("w1")
    owner = cluster.wait_converged({"w1"}, "scale_up.first_worker_s", timeout_s=30)
    assert _of(owner, "w1") == everything
    for name, workers in (("w2", {"w1", "w2"}), ("w3", {"w1", "w2", "w3"})):
        t0 = time.time()
        cluster.spawn(name, metrics=name == "w3")
        after = cluster.wait_converged(workers, f"scale_up.add_{name}_s", since=t0)
        moved = moves(owner, after)
        need = min_moves(owner, workers)
        MEASURED[f"scale_up.add_{name}_moves"] = f"{len(moved)} (minimum {need})"
        assert len(moved) == need, (name, sorted(moved), need)
        assert all(after[i] == name for i in moved), "work moved only to the new worker"
        timeline = cluster.assert_safe()
        # Nothing else was stopped: the only stops since the join are of the moved items.
        stopped = {e["item"] for e in timeline.between(t0, event="stop")}
        assert stopped == moved, (sorted(stopped), sorted(moved))
        owner = after
    # Balanced, connectors and tasks separately.
    connector_counts = sorted(sum(1 for i in _of(owner, w) if "/" not in i) for w in ("w1", "w2", "w3"))
    task_counts = sorted(sum(1 for i in _of(owner, w) if "/" in i) for w in ("w1", "w2", "w3"))
    assert (connector_counts, task_counts) == ([0, 1, 1], [2, 2, 3]), owner

    # The CLI shows the same picture.
    r = run_cli("groups", "describe", GROUP, "--bootstrap", cluster.daemon.bootstrap, "--json")
    assert r.returncode == 0, r.stderr
    (g,) = json.loads(r.stdout)
    assert g["state"] == "Stable" and g["assignor"] == "incremental"
    assert {m["instance_id"]: set(m["assignment"]) for m in g["members"]} == {
        w: _of(owner, w) for w in ("w1", "w2", "w3")}

    # The worker's metrics endpoint: stable, its epoch, what it owns.
    port = cluster.metrics_port["w3"]
    me = next(m for m in cluster.describe().members if m.instance_id == "w3")
    tasks = sum(1 for i in _of(owner, "w3") if "/" in i)
    connectors = len(_of(owner, "w3")) - tasks
    deadline = time.monotonic() + 10
    while True:
        m = _metrics(port)
        ok = (m.get(("connect_worker_state", (("state", "stable"),))) == 1.0
              and m.get(("connect_worker_member_epoch", ())) == me.member_epoch
              and m.get(("connect_worker_owned", (("kind", "task"),))) == tasks
              and m.get(("connect_worker_owned", (("kind", "connector"),))) == connectors)
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ok, {k: v for k, v in m.items() if k[0].startswith("connect_worker_")}
    assert all(v == 0 for (name, labels), v in m.items()
               if name == "connect_worker_state" and labels != (("state", "stable"),))
    assert m[("connect_worker_running_instances", ())] == len(_of(owner, "w3"))
    assert m[("connect_worker_lost_total", ())] == 0
    assert m[("connect_worker_rebalance_seconds_count", ())] >= 1

    # Structured logs: JSON lines on stderr, with the group and instance bound to every line.
    lines = [json.loads(line) for path in cluster.base.glob("worker-w3-*.log")
             for line in path.read_text().splitlines() if line.startswith("{")]
    assigned = [e for e in lines if e["event"] == "assigned"]
    assert assigned and all(e["group"] == GROUP and e["instance"] == "w3" and e["level"] == "info"
                            and "timestamp" in e for e in lines[:1] + assigned), lines
    assert set().union(*(e["items"] for e in assigned)) == _of(owner, "w3")


def test_kill_9_holds_work_for_the_delay_then_moves_only_it(cluster: Cluster) -> None:
    for name in ("w1", "w2", "w3"):
        cluster.spawn(name)
    before = cluster.wait_converged({"w1", "w2", "w3"}, "kill.initial_s", timeout_s=30)
    victim = max(("w1", "w2", "w3"), key=lambda w: len(_of(before, w)))
    its = _of(before, victim)
    survivors = {"w1", "w2", "w3"} - {victim}
    survivor_pids = {cluster.pid(w) for w in survivors}
    killed_at = cluster.kill(victim)
    after = cluster.wait_converged(survivors, "kill.reassigned_after_s", since=killed_at,
                                   timeout_s=(SESSION_MS + MAX_DELAY_MS) / 1000 + CONVERGE_S)
    timeline = cluster.assert_safe()
    moved = moves(before, after)
    need = min_moves(before, survivors)
    MEASURED["kill.moves"] = f"{len(moved)} (minimum {need}, victim had {len(its)})"
    assert moved == its, "exactly the dead worker's work moved"
    assert len(moved) == need
    # The others' work never stopped.
    stops = [e for e in timeline.between(killed_at, event="stop") if e["pid"] in survivor_pids]
    assert not stops, stops
    # Held: not restarted elsewhere before the session expired and the delay passed. The
    # coordinator counts the session from the last heartbeat it handled, which is at most one
    # (long-polled) heartbeat interval before the kill.
    restarts = [e for e in timeline.between(killed_at, event="start") if e["item"] in its]
    first = min(e["ts"] for e in restarts) - killed_at
    MEASURED["kill.held_for_s"] = round(first, 3)
    floor = (SESSION_MS - 2 * INTERVAL_MS + MAX_DELAY_MS) / 1000
    assert first >= floor, f"the dead worker's work was reassigned after {first:.2f}s < {floor}s"
    assert first <= (SESSION_MS + MAX_DELAY_MS) / 1000 + 3.0, first


def test_static_worker_bounced_within_the_delay_gets_its_work_back(cluster: Cluster) -> None:
    for name in ("w1", "w2", "w3"):
        cluster.spawn(name)
    before = cluster.wait_converged({"w1", "w2", "w3"}, "bounce.initial_s", timeout_s=30)
    its = _of(before, "w2")
    assert its
    others = {cluster.pid("w1"), cluster.pid("w3")}
    old_pid = cluster.pid("w2")
    t0 = time.time()
    exited = cluster.terminate("w2")  # stops its work, leaves with -2: the work stays held for it
    cluster.spawn("w2")
    after = cluster.wait_converged({"w1", "w2", "w3"}, "bounce.back_s", since=t0)
    timeline = cluster.assert_safe()
    assert after == before, sorted(moves(before, after))
    new_pid = cluster.pid("w2")
    # Every item of w2 was stopped by the old process, then started by the new one; no other
    # worker ever started (or stopped) anything meanwhile.
    stops = {e["item"] for e in timeline.between(t0, event="stop") if e["pid"] == old_pid}
    starts = {e["item"] for e in timeline.between(t0, event="start") if e["pid"] == new_pid}
    assert stops == its and starts == its, (sorted(stops), sorted(starts), sorted(its))
    assert not [e for e in timeline.between(t0) if e["pid"] in others]
    back = min(e["ts"] for e in timeline.between(t0, event="start") if e["pid"] == new_pid)
    MEASURED["bounce.exit_to_restart_s"] = round(back - exited, 3)
    assert back - exited < (SESSION_MS + MAX_DELAY_MS) / 1000


def test_rolling_restart_of_all_workers(cluster: Cluster) -> None:
    workers = {"w1", "w2", "w3"}
    for name in sorted(workers):
        cluster.spawn(name)
    owner = cluster.wait_converged(workers, "rolling.initial_s", timeout_s=30)
    for name in ("w1", "w2", "w3"):
        old_pid = cluster.pid(name)
        t0 = time.time()
        cluster.terminate(name)
        cluster.spawn(name)
        after = cluster.wait_converged(workers, f"rolling.{name}_s", since=t0)
        timeline = cluster.assert_safe()
        assert not moves(owner, after), f"{name}: {sorted(moves(owner, after))}"
        mine = _of(after, name)
        restarted = {e["item"] for e in timeline.between(t0, event="start") if e["pid"] == cluster.pid(name)}
        assert restarted == mine, (name, sorted(restarted), sorted(mine))
        assert {e["item"] for e in timeline.between(t0, event="stop") if e["pid"] == old_pid} == mine
        owner = after
    # Every process of every worker: all its starts were stopped (exits) or still run.
    t = cluster.assert_safe()
    assert len({iv.pid for iv in t.intervals}) == 6


def test_config_update_restarts_only_that_connectors_instances(cluster: Cluster) -> None:
    """Issue 14: `connectors update --config` used to store the config while the running
    instances kept the old one. Now the workers that run the changed connector's items stop
    each once and start it again with the new config, where it ran; the other connector's
    instances are not touched, and nothing runs twice."""
    workers = {"w1", "w2"}
    for name in sorted(workers):
        cluster.spawn(name)
    owner = cluster.wait_converged(workers, "config_update.initial_s", timeout_s=30)
    alpha = {i for i in configured_items() if i.split("/")[0] == "alpha"}
    MEASURED["config_update.alpha_on"] = sorted({owner[i] for i in alpha})  # (usually both)
    pids = {name: cluster.pid(name) for name in workers}
    t0 = time.time()
    r = run_cli("connectors", "update", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP,
                "alpha", "--config", "record.tag=v2")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + CONVERGE_S
    while True:
        t = cluster.timeline()
        tagged = {e["item"] for e in t.between(t0, event="start") if e.get("tag") == "v2"}
        if tagged >= alpha:
            break
        assert time.monotonic() < deadline, (sorted(alpha - tagged), cluster.logs(tail=1500))
        time.sleep(0.05)
    MEASURED["config_update.restart_s"] = round(
        max(e["ts"] for e in t.between(t0, event="start")) - t0, 3)
    after = cluster.wait_converged(workers, "config_update.converged_s", since=t0)
    assert not moves(owner, after), sorted(moves(owner, after))
    assert {name: cluster.pid(name) for name in workers} == pids, "no worker restarted"
    t = cluster.assert_safe()
    since = t.between(t0)
    for item in sorted(alpha):
        mine = [(e["event"], e["pid"], e.get("tag")) for e in since if e["item"] == item]
        # Stopped once, then started once with the new config, by the same process.
        assert mine == [("stop", pids[owner[item]], None), ("start", pids[owner[item]], "v2")], (item, mine)
    untouched = [e for e in since if e["item"].split("/")[0] != "alpha"]
    assert not untouched, untouched
    # Then the other connector: only its instances restart.
    t1 = time.time()
    r = run_cli("connectors", "update", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP,
                "beta", "--config", "record.tag=b2")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + CONVERGE_S
    beta = configured_items() - alpha
    while {e["item"] for e in cluster.timeline().between(t1, event="start") if e.get("tag") == "b2"} < beta:
        assert time.monotonic() < deadline, cluster.logs(tail=1500)
        time.sleep(0.05)
    cluster.wait_converged(workers, "config_update.second_s", since=t1)
    t = cluster.assert_safe()
    assert not [e for e in t.between(t1) if e["item"] in alpha]
    # An update that changes nothing restarts nothing.
    t2 = time.time()
    r = run_cli("connectors", "update", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP,
                "beta", "--config", "record.tag=b2")
    assert r.returncode == 0, r.stderr
    time.sleep(1.0)
    assert not cluster.timeline().between(t2)


# == Connect's verbs: restart, pause, resume, stop ====================================


def _verb(cluster: Cluster, *args: str) -> None:
    r = run_cli("connectors", *args, "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: group"), r.stdout


def _wait_events(cluster: Cluster, since: float, want: Any, what: str) -> Timeline:
    deadline = time.monotonic() + CONVERGE_S
    while True:
        t = cluster.timeline()
        if want(t.between(since)):
            return t
        assert time.monotonic() < deadline, (what, t.between(since), cluster.logs(tail=1500))
        time.sleep(0.05)


def _started_stopped(events: list[dict[str, Any]], items: set[str], event: str) -> dict[str, int]:
    return {i: sum(1 for e in events if e["item"] == i and e["event"] == event) for i in items}


def test_pause_resume_restart_and_task_restart(cluster: Cluster) -> None:
    """pause: alpha's instances stop and stay stopped, beta's untouched; resume: they start;
    restart: each of alpha's instances stops and starts once; restart --task 1: only alpha/1.
    The plugin never sees the reserved keys (its recorded tag stays the same)."""
    workers = {"w1", "w2"}
    for name in sorted(workers):
        cluster.spawn(name)
    owner = cluster.wait_converged(workers, "verbs.initial_s", timeout_s=30)
    alpha = {i for i in configured_items() if i.split("/")[0] == "alpha"}
    pids = {name: cluster.pid(name) for name in workers}
    # pause
    t0 = time.time()
    _verb(cluster, "pause", "alpha")
    t = _wait_events(cluster, t0, lambda ev: set(_started_stopped(ev, alpha, "stop").values()) == {1},
                     "paused")
    MEASURED["verbs.pause_s"] = round(max(e["ts"] for e in t.between(t0)) - t0, 3)
    time.sleep(1.5)  # stays stopped (several heartbeats, epochs settled)
    t = cluster.assert_safe()
    since = t.between(t0)
    assert all(e["item"] in alpha and e["event"] == "stop" for e in since), since
    assert not set(t.running()) & alpha
    g = cluster.describe()  # the items stay assigned to the same workers
    assigned = {i: m.instance_id for m in g.members for i in _items(m.assignment)}
    assert assigned == owner
    r = run_cli("connectors", "list", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP)
    assert r.returncode == 0 and "PAUSED" in r.stdout, r
    # resume
    t1 = time.time()
    _verb(cluster, "resume", "alpha")
    cluster.wait_converged(workers, "verbs.resume_s", since=t1)
    t = cluster.assert_safe()
    since = t.between(t1)
    assert _started_stopped(since, alpha, "start") == {i: 1 for i in alpha}
    assert all(e["item"] in alpha and e["event"] == "start" for e in since), since
    assert all(e["pid"] == pids[owner[e["item"]]] for e in since)
    # restart: the connector and all its tasks, once each
    t2 = time.time()
    _verb(cluster, "restart", "alpha")
    _wait_events(cluster, t2, lambda ev: set(_started_stopped(ev, alpha, "start").values()) == {1},
                 "restarted")
    time.sleep(1.0)
    cluster.wait_converged(workers, "verbs.restart_s", since=t2)
    t = cluster.assert_safe()
    since = t.between(t2)
    for item in sorted(alpha):
        mine = [(e["event"], e["pid"]) for e in since if e["item"] == item]
        assert mine == [("stop", pids[owner[item]]), ("start", pids[owner[item]])], (item, mine)
    assert not [e for e in since if e["item"] not in alpha]
    # restart --task 1: only that task
    t3 = time.time()
    _verb(cluster, "restart", "alpha", "--task", "1")
    _wait_events(cluster, t3, lambda ev: any(e["event"] == "start" for e in ev), "task restarted")
    time.sleep(1.0)
    t = cluster.assert_safe()
    since = t.between(t3)
    assert [(e["item"], e["event"]) for e in since] == [("alpha/1", "stop"), ("alpha/1", "start")]
    assert {name: cluster.pid(name) for name in workers} == pids
    # The plugin's config never carried the reserved keys (and no tag changed).
    assert all("tag" not in e for e in t.events)
    # No such connector / task: refused, exit 1.
    r = run_cli("connectors", "pause", "nope", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP)
    assert r.returncode == 1 and "does not exist" in r.stderr, r
    r = run_cli("connectors", "restart", "alpha", "--task", "9", "--bootstrap", cluster.daemon.bootstrap,
                "--group", GROUP)
    assert r.returncode == 1 and "no task 9" in r.stderr, r


def test_paused_connector_stays_paused_across_a_coordinator_kill(cluster: Cluster) -> None:
    """The verbs are durable: stop and pause are stored through AlterConnectors; after kill -9 of
    the coordinator and a start on the same data dir, workers joining it run beta but never
    alpha; resume then starts alpha."""
    _verb(cluster, "pause", "alpha")
    _verb(cluster, "restart", "beta", "--task", "2")
    cluster.daemon.kill()
    from tests.daemon_fixture import start
    cluster.daemon = start(cluster.daemon.data_dir)
    try:
        r = run_cli("connectors", "describe", "alpha", "--json", "--bootstrap", cluster.daemon.bootstrap,
                    "--group", GROUP)
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["state"] == "PAUSED" and "connect.target.state" not in d["plugin_config"]
        r = run_cli("connectors", "describe", "beta", "--json", "--bootstrap", cluster.daemon.bootstrap,
                    "--group", GROUP)
        assert json.loads(r.stdout)["task_restarts"] == {"2": 1}
        alpha = {i for i in configured_items() if i.split("/")[0] == "alpha"}
        beta = configured_items() - alpha
        t0 = time.time()
        for name in ("w1", "w2"):
            cluster.spawn(name)
        _wait_events(cluster, t0, lambda ev: {e["item"] for e in ev if e["event"] == "start"} >= beta,
                     "beta runs")
        time.sleep(2.0)
        t = cluster.assert_safe()
        assert set(t.running()) == beta, sorted(t.running())
        assert not [e for e in t.between(t0) if e["item"] in alpha]
        g = cluster.describe()
        assert {i for m in g.members for i in _items(m.assignment)} == configured_items()
        t1 = time.time()
        _verb(cluster, "resume", "alpha")
        cluster.wait_converged({"w1", "w2"}, "verbs.resume_after_kill_s", since=t1)
    finally:
        cluster.close()
        cluster.daemon.stop()
