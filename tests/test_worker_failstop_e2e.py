"""Issue 15 end to end: plugins that do not stop never run on two workers (real processes).

Each case runs a coordinator and two ``connect-worker`` processes with the recording plugin
ticking every 20 ms (``tick.ms``), so a plugin that keeps running leaves evidence even when its
process cannot record a stop. The fail-stop rule (docs/worker.md): an instance not stopped within
the stop budget ends its worker process (exit status 3), and so does anything still running at
the lease's end plus the budget; the coordinator holds a fenced member's items until its session
deadline plus the budget. Checked from the records alone: no item ran on two processes at once
(a fail-stopped process's intervals end at the instant the test saw it exit), no tick came from
a process after it ended, and the work runs again on the survivor.

Cases: the revocation path (eager: the second worker's join revokes everything from the first,
whose stuck instances do not stop) with a ``stop()`` that blocks the event loop, one that never
returns and ignores cancellation, a ``run()`` thread that ignores the stop flag (``stop()``
waits for it), and a ``run()`` that ignores its cancellation; and the lease backstop, a
``run()`` that blocks the event loop (no heartbeats, no watchdog: only the guard thread acts).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient
from tests.daemon_fixture import ROOT, SHORT_TIMEOUTS, Daemon, DaemonPool, daemon_env, run_cli
from tests.test_worker_e2e import Timeline, analyze
from worker_client.failstop import FAIL_STOP_EXIT

GROUP = "failstop"
SESSION_MS = int(SHORT_TIMEOUTS["CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS"])
REBALANCE_MS = 2000  # stop budget 1000 ms
PLUGIN = "worker_client.examples.recording:RecordingConnector"


class Procs:
    def __init__(self, base: Path, daemon: Daemon) -> None:
        self.base, self.daemon = base, daemon
        self.records = base / "records.jsonl"
        self.records.touch()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ended: dict[int, tuple[float, str]] = {}
        self.codes: dict[str, int] = {}

    def create(self, name: str, tasks: int, config: Mapping[str, str]) -> None:
        args = ["connectors", "create", "--bootstrap", self.daemon.bootstrap, "--group", GROUP, name,
                "--tasks", str(tasks), "--config", f"connector.class={PLUGIN}",
                "--config", f"record.file={self.records}", "--config", "tick.ms=20"]
        for k, v in config.items():
            args += ["--config", f"{k}={v}"]
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr

    def spawn(self, name: str) -> None:
        cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", self.daemon.bootstrap,
               "--group", GROUP, "--instance-id", name, "--session-timeout-ms", str(SESSION_MS),
               "--rebalance-timeout-ms", str(REBALANCE_MS), "--max-delay-ms", "0",
               "--assignors", "eager"]
        with open(self.base / f"worker-{name}.log", "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    env=daemon_env(), cwd=ROOT)
        self.procs[name] = proc

        def watch() -> None:  # the instant of the exit, as close as the test can see it
            code = proc.wait()
            at = time.time()
            self.codes[name] = code
            self.ended[proc.pid] = (at, "failstop" if code == FAIL_STOP_EXIT else "exit")
        threading.Thread(target=watch, daemon=True).start()

    def log(self, name: str) -> str:
        return (self.base / f"worker-{name}.log").read_text(errors="replace")

    def timeline(self) -> Timeline:
        lines = self.records.read_text().splitlines()
        return analyze([json.loads(line) for line in lines if line.strip()], dict(self.ended))

    def owners(self) -> dict[str, set[str]]:
        with AdminClient(self.daemon.host, self.daemon.port, timeout_s=5) as c:
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(GROUP,))).groups
        return {m.instance_id: {*m.assignment.connectors,
                                *(f"{t.connector}/{t.task}" for t in m.assignment.tasks)}
                for m in g.members}

    def wait(self, cond, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n"
                                     + "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.procs))
            time.sleep(0.05)

    def running(self, name: str) -> set[str]:
        pid = self.procs[name].pid
        return {i for i, ivs in self.timeline().running().items() if any(iv.pid == pid for iv in ivs)}

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with DaemonPool(tmp_path) as pool:
        p = Procs(tmp_path, pool.start())
        try:
            yield p
        finally:
            p.close()


def _assert_safe(t: Timeline) -> None:
    assert not t.problems, t.problems
    overlaps = t.overlaps()
    assert not overlaps, "ran on two workers at once: " + "; ".join(
        f"{a.item}: {a.worker}/{a.pid} [{a.start:.3f}, {a.stop}) vs {b.worker}/{b.pid} "
        f"[{b.start:.3f}, {b.stop})" for a, b in overlaps)


ALL = {"calm", "calm/0", "calm/1", "stuck", "stuck/0", "stuck/1"}


@pytest.mark.parametrize("misbehaviour", [
    {"stop.mode": "block"},
    {"stop.mode": "hang"},
    {"stop.mode": "thread"},
    {"run.mode": "ignore-cancel"},
], ids=["stop-blocks-the-loop", "stop-hangs", "thread-ignores-stop", "run-ignores-cancel"])
def test_a_plugin_that_does_not_stop_ends_its_worker_and_never_runs_twice(
        procs: Procs, misbehaviour: dict[str, str]) -> None:
    procs.create("calm", 2, {})
    procs.create("stuck", 2, misbehaviour)
    procs.spawn("w1")
    procs.wait(lambda: procs.running("w1") == ALL and procs.owners().get("w1") == ALL, "w1 runs everything")
    # Eager: w2's join revokes everything from w1; its stuck instances do not stop.
    procs.spawn("w2")
    procs.wait(lambda: "w1" in procs.codes, "w1 to end itself", timeout_s=20)
    assert procs.codes["w1"] == FAIL_STOP_EXIT, procs.log("w1")
    events = [json.loads(line) for line in procs.log("w1").splitlines() if line.startswith("{")]
    (fatal,) = [e for e in events if e["event"].startswith("fail-stop")]
    assert fatal["level"] == "critical", fatal
    assert "did not stop within the stop budget of 1000 ms" in fatal["reason"], fatal
    if misbehaviour != {"stop.mode": "block"}:  # (a blocked loop blocks every stop: any may be named)
        assert "stuck" in fatal["reason"], fatal
    # Liveness: everything runs on w2 once the coordinator expired w1 and its hold ended.
    procs.wait(lambda: procs.running("w2") == ALL and procs.owners() == {"w2": ALL}, "w2 runs everything")
    t = procs.timeline()
    _assert_safe(t)
    w1 = procs.procs["w1"].pid
    # The stuck items' evidence: w1 ran them until it ended; w2 started them only after that.
    exit_at = procs.ended[w1][0]
    for item in ("stuck/0", "stuck/1"):
        w2_start = min(e["ts"] for e in t.events if e["item"] == item and e["event"] == "start"
                       and e["worker"] == "w2")
        assert w2_start > exit_at, (item, w2_start, exit_at)
    assert not [e for e in t.events if e["pid"] == w1 and e["ts"] > exit_at]


def test_a_plugin_blocking_the_event_loop_is_ended_by_the_lease_backstop(
        procs: Procs, tmp_path: Path) -> None:
    procs.create("calm", 2, {})
    procs.create("blocker", 1, {"run.mode": "block", "block.after.ms": "1500",
                                "block.once.file": str(tmp_path / "blocked-once")})
    everything = {"calm", "calm/0", "calm/1", "blocker", "blocker/0"}
    procs.spawn("w1")
    procs.spawn("w2")
    # One process's loop freezes (whichever runs the blocking instance first): no heartbeat, no
    # watchdog, no stop; only the guard thread can end it, at its lease's end plus the budget.
    procs.wait(lambda: len(procs.codes) == 1, "a worker to end itself", timeout_s=30)
    ((victim, code),) = procs.codes.items()
    survivor = "w2" if victim == "w1" else "w1"
    assert code == FAIL_STOP_EXIT, procs.log(victim)
    events = [json.loads(line) for line in procs.log(victim).splitlines() if line.startswith("{")]
    (fatal,) = [e for e in events if e["event"].startswith("fail-stop")]
    assert "session lease's end plus the stop budget" in fatal["reason"], fatal
    procs.wait(lambda: procs.running(survivor) == everything
               and procs.owners() == {survivor: everything}, f"{survivor} runs everything")
    t = procs.timeline()
    _assert_safe(t)
    blocked = [e for e in t.events if e["event"] == "block"]
    assert [e["worker"] for e in blocked] == [victim], blocked
    assert procs.procs[survivor].poll() is None
    procs.procs[survivor].send_signal(signal.SIGTERM)
    assert procs.procs[survivor].wait(15) == 0
