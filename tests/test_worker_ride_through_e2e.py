"""Workers ride through a coordinator restart shorter than their session.

Real processes with the defaults of the README: a coordinator (file store, session timeout
10 s, heartbeat interval 3 s) and two ``connect-worker`` processes (session timeout 10 s)
running the recording plugin (``tick.ms``: a running instance records a tick every 100 ms).
Once the group is steady, the coordinator is stopped (``kill -9``, or SIGTERM: a graceful stop)
at the worst moment for a worker — just before its parked heartbeat is answered, when its lease
(from the send time of the heartbeat answered before) has the least left, 10 - 2 x 3 = 4 s —
and started again on the same port and data dir, unavailable 3 s in all (down, then start-up).
From the records alone: no instance was stopped or started on either worker from before the
restart to the end (every item ran the whole time on the one worker it ran on, and ticked
meanwhile), and no item ran on two workers. The group comes back steady: both members, the same
member epochs, group epoch and assignment, still there a whole session timeout after the
restart (so both heartbeat the new process: a silent member would have been expired).

Measured (``-s`` prints it; docs/worker.md, "A coordinator restart shorter than the session"):
how long the coordinator was unavailable, when each worker got back (its last failed heartbeat
plus the retry it scheduled), its failed attempts and retries, and the longest tick gap. The
retries are capped at 1 s and at a quarter of the lease left (``Worker._retry_delay_ms``):
with the 1 s cap alone a retry could land after the lease's end (about 1 time in 10 here).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient
from coordinator.group.config import GroupCoordinatorConfig
from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env, run_cli
from tests.test_worker_e2e import Timeline, analyze, configured_items
from worker_client.worker import Worker, WorkerConfig, now_ms

GROUP = "ride"
CONNECTORS = {"orders": 4, "payments": 3}  # 2 connectors + 7 tasks
PLUGIN = "worker_client.examples.recording:RecordingConnector"
SESSION_S = GroupCoordinatorConfig().session_timeout_ms / 1000  # the default, 10 s
DOWN_S = 3.0
WORKERS = ("w1", "w2")


def _items(a: Any) -> set[str]:
    return {*a.connectors, *(f"{t.connector}/{t.task}" for t in a.tasks)}


class Ride:
    def __init__(self, base: Path, daemon: Daemon) -> None:
        self.base, self.daemon = base, daemon
        self.records = base / "records.jsonl"
        self.records.touch()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def create_connectors(self) -> None:
        for name, tasks in CONNECTORS.items():
            r = run_cli("connectors", "create", "--bootstrap", self.daemon.bootstrap, "--group", GROUP,
                        name, "--tasks", str(tasks), "--config", f"connector.class={PLUGIN}",
                        "--config", f"record.file={self.records}", "--config", "tick.ms=100")
            assert r.returncode == 0, r.stderr

    def spawn(self, name: str) -> None:
        # Only the defaults: session timeout 10 s (= the coordinator's), rebalance timeout 60 s.
        cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", self.daemon.bootstrap,
               "--group", GROUP, "--instance-id", name]
        with open(self.log_path(name), "wb") as err:
            self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                                env=daemon_env(), cwd=ROOT)

    def log_path(self, name: str) -> Path:
        return self.base / f"worker-{name}.log"

    def events(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path(name).read_text(errors="replace").splitlines()
                if line.startswith("{")]

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log_path(n).read_text(errors='replace')[-3000:]}"
                         for n in self.procs)

    def timeline(self) -> Timeline:
        lines = self.records.read_text().splitlines()
        return analyze([json.loads(line) for line in lines if line.strip()])

    def describe(self) -> Any:
        with AdminClient(self.daemon.host, self.daemon.port, timeout_s=5) as c:
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(GROUP,))).groups
        return g

    def steady(self) -> tuple[dict[str, Any], str]:
        """The group's picture when it is steady (else None and why): Stable, both members
        Stable on their target, every item assigned once, and the records agree (each item runs
        exactly once, on the process of the member the coordinator says)."""
        g = self.describe()
        owner: dict[str, str] = {}
        for m in g.members:
            for i in _items(m.assignment):
                if i in owner:
                    return {}, f"{i} assigned twice"
                owner[i] = m.instance_id
        running = self.timeline().running()
        if g.group_state != "Stable":
            return {}, f"group {g.group_state}"
        if {m.instance_id for m in g.members} != set(WORKERS):
            return {}, f"members {sorted(m.instance_id for m in g.members)}"
        if any(m.member_state != "Stable" or _items(m.assignment) != _items(m.target_assignment)
               for m in g.members):
            return {}, "a member is reconciling"
        if set(owner) != configured_items(CONNECTORS):
            return {}, f"assigned {sorted(owner)}"
        pids = {name: p.pid for name, p in self.procs.items()}
        if {i: [iv.pid for iv in ivs] for i, ivs in running.items()} != {
                i: [pids[w]] for i, w in owner.items()}:
            return {}, "the records disagree with the coordinator"
        return {"owner": owner, "group_epoch": g.group_epoch, "assignment_epoch": g.assignment_epoch,
                "epochs": {m.instance_id: m.member_epoch for m in g.members}}, ""

    def wait(self, cond: Callable[[], tuple[dict[str, Any], str]], what: str,
             timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            got, why = cond()
            if got:
                return got
            for name, p in self.procs.items():
                assert p.poll() is None, f"{name} exited with {p.returncode}\n{self.logs()}"
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {why}\n{self.logs()}")
            time.sleep(0.1)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(70)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _heartbeats_answered(daemon: Daemon) -> float:
    assert daemon.metrics_url is not None
    with urllib.request.urlopen(daemon.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "connect_coordinator_requests_total"
               and s.labels.get("api") == "ConnectGroupHeartbeat" and s.labels.get("error") == "NONE")


def _ts(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_retries_get_denser_as_the_lease_runs_out() -> None:
    """The wait before a heartbeat retry is at most a quarter of the lease left (at least
    50 ms), and the plain backoff when no lease runs (never answered, or already over)."""
    w = Worker(WorkerConfig(bootstrap=[("127.0.0.1", 1)], group_id="g"))
    m = w.membership
    assert w._retry_delay_ms(1000) == 1000  # no answered heartbeat yet
    for left_ms, delay_ms, expected in ((9000, 1000, 1000), (4000, 1000, 1000), (2000, 1000, 500),
                                        (400, 1000, 100), (100, 1000, 50), (1000, 30, 30)):
        m.last_success_ms = now_ms() - m.session_timeout_ms + left_ms
        got = w._retry_delay_ms(delay_ms)
        assert expected - 5 <= got <= expected, (left_ms, delay_ms, got)
    m.last_success_ms = now_ms() - m.session_timeout_ms - 1  # over: the watchdog fences
    assert w._retry_delay_ms(1000) == 1000


@pytest.mark.parametrize("how", ["kill-9", "sigterm"])
def test_workers_ride_through_a_coordinator_restart_shorter_than_their_session(
        tmp_path: Path, how: str) -> None:
    measured: dict[str, Any] = {}
    with DaemonPool(tmp_path) as pool:
        data = tmp_path / "data"
        started = time.time()
        daemon = pool.start(data, short_timeouts=False)  # session 10 s, interval 3 s (defaults)
        startup_s = time.time() - started
        ride = Ride(tmp_path, daemon)
        try:
            ride.create_connectors()
            for name in WORKERS:
                ride.spawn(name)
            before = ride.wait(ride.steady, "the group to be steady")
            pids = {name: p.pid for name, p in ride.procs.items()}
            # Let both settle into their long polls (one heartbeat interval).
            time.sleep(3.5)
            again, why = ride.steady()
            assert again == before, why
            # The worst moment: just before a worker's parked heartbeat is answered. Its lease
            # runs from the send time of the heartbeat answered before it, so it has the least
            # left: the session less two long polls (10 - 2 x 3 = 4 s with the defaults). A
            # heartbeat answered now (the counter moves) was held its 3 s and the worker sent
            # the next at once, to be answered 3 s from now: the coordinator goes 0.1 s before.
            count = _heartbeats_answered(daemon)
            while _heartbeats_answered(daemon) == count:
                time.sleep(0.005)
            answered_at = time.time()
            time.sleep(max(0.0, answered_at + 2.9 - time.time()))
            t0 = time.time()
            lease_end = answered_at - 3.0 + SESSION_S  # that worker's (at most 10 ms later)
            if how == "kill-9":
                daemon.kill()
            else:
                daemon.stop()  # SIGTERM: answers what is in flight, fsyncs, exits 0
            # Unavailable for DOWN_S in all: down, then the start-up the first start took.
            time.sleep(max(0.0, t0 + DOWN_S - startup_s - time.time()))
            restarted = pool.start(data, short_timeouts=False,
                                   extra_args=["--listen", f"127.0.0.1:{daemon.port}"])
            up_at = time.time()
            ride.daemon = restarted
            assert restarted.port == daemon.port
            measured["unavailable_s"] = round(up_at - t0, 3)
            measured["worst_lease_left_at_kill_s"] = round(lease_end - t0, 3)
            # The first heartbeats the new process answers (each worker's first one after a
            # failure resends everything and is answered at once).
            deadline = time.monotonic() + SESSION_S
            while _heartbeats_answered(restarted) < len(WORKERS) and time.monotonic() < deadline:
                time.sleep(0.02)
            measured["both_heartbeats_answered_after_kill_s"] = round(time.time() - t0, 3)
            after = ride.wait(ride.steady, "the group to be steady after the restart")
            assert after == before, (before, after)
            # Past a whole session after the restart: had either worker stopped heartbeating,
            # the new process would have expired it by now.
            time.sleep(max(0.0, up_at + SESSION_S + 1.0 - time.time()))
            final = ride.wait(ride.steady, "the group to be steady a session after the restart")
            assert final == before, (before, final)
            assert {name: p.pid for name, p in ride.procs.items()} == pids
            t_end = time.time()

            # From the records: nothing stopped or started since before the restart, no item
            # on two workers, every item ticking on its one worker throughout.
            t = ride.timeline()
            assert not t.problems, t.problems
            assert not t.overlaps(), t.overlaps()
            changed = [e for e in t.between(t0) if e["event"] in ("start", "stop")]
            assert not changed, changed
            running = t.running()
            owner = before["owner"]
            assert {i: [(iv.pid, iv.worker) for iv in ivs] for i, ivs in running.items()} == {
                i: [(pids[w], w)] for i, w in owner.items()}
            assert all(iv.start < t0 for ivs in running.values() for iv in ivs)
            gaps = []
            for item, w in owner.items():
                window = [e for e in t.events if e["item"] == item and e["event"] == "tick"
                          and t0 - 1 <= e["ts"] <= t_end]
                assert window and {e["pid"] for e in window} == {pids[w]}, item
                ticks = sorted(e["ts"] for e in window)
                gaps.append(max(b - a for a, b in zip([t0 - 1, *ticks], [*ticks, t_end], strict=True)))
            measured["longest_tick_gap_s"] = round(max(gaps), 3)
            assert max(gaps) < 3.0, gaps  # (a 100 ms ticker; only a starved machine is slower)

            # From the workers' logs: how long each was without a coordinator, and nothing lost.
            for name in WORKERS:
                events = ride.events(name)
                assert not [e for e in events if e["event"].startswith(("lost all work", "no heartbeat"))
                            or e["level"] in ("warning", "error", "critical")], events
                failed = [e for e in events if e["event"] == "heartbeat failed; retrying"
                          and _ts(e) >= t0 - 1]
                assert failed, f"{name} never noticed the restart"
                first, back = _ts(failed[0]), _ts(failed[-1]) + failed[-1]["retry_in_ms"] / 1000
                measured[f"{name}.first_failure_after_kill_s"] = round(first - t0, 3)
                measured[f"{name}.back_after_kill_s"] = round(back - t0, 3)
                measured[f"{name}.back_after_up_s"] = round(back - up_at, 3)
                measured[f"{name}.failed_attempts"] = len(failed)
                measured[f"{name}.retry_in_ms"] = [e["retry_in_ms"] for e in failed]
                assert max(e["retry_in_ms"] for e in failed) <= 1000
                assert back - up_at <= 1.5, (name, back - up_at)  # back within ~a backoff
            for name, p in ride.procs.items():
                assert p.poll() is None, name
        finally:
            ride.close()
        for name, p in ride.procs.items():
            assert p.returncode == 0, (name, p.returncode, ride.logs())
    print(f"\nmeasured ({how}):", json.dumps(measured, sort_keys=True))
