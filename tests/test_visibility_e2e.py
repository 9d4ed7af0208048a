"""What an operator sees of a worker that died, end to end with real processes: a coordinator
daemon and two static `connect-worker` processes (w1 serving the REST API), the recording
plugin running one connector and three tasks.

After `kill -9 w2`, its instances still show RUNNING until its session ends (the coordinator
cannot know better): `connectors status --json`, REST status and `groups describe --json` mark
them as belonging to a worker that missed its heartbeats. Once its session has ended and the
hold of its items is over, the incremental assignor keeps them unassigned for w2 until the
scheduled rebalance: they show UNASSIGNED with `kept_for` naming w2 and until when.

Timeouts: session 6 s, heartbeat interval 200 ms (overdue past 1.2 s), the workers' stop
budget 0.5 s (the hold), their `--max-delay-ms` 30 s (the test ends long before it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env, run_cli
from tests.test_rest_e2e import healthy, http
from tests.test_worker_e2e import PLUGIN, _free_port

GROUP = "vis"
SESSION_MS = 6_000
INTERVAL_MS = 200
DELAY_MS = 30_000
CONVERGE_S = 30.0
ENV = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": str(SESSION_MS),
       "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": str(INTERVAL_MS)}


class Workers:
    def __init__(self, base: Path, daemon: Daemon) -> None:
        self.base, self.daemon = base, daemon
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.rest = ""
        self.records = base / "records.jsonl"
        self.records.touch()

    def spawn(self, name: str, rest: bool = False) -> None:
        cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", self.daemon.bootstrap,
               "--group", GROUP, "--instance-id", name, "--session-timeout-ms", str(SESSION_MS),
               "--max-delay-ms", str(DELAY_MS), "--task-shutdown-graceful-timeout-ms", "500"]
        if rest:
            port = _free_port()
            self.rest = f"http://127.0.0.1:{port}"
            cmd += ["--rest-listen", f"127.0.0.1:{port}"]
        with open(self.base / f"worker-{name}.log", "wb") as err:
            self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                                env=daemon_env(ENV), cwd=ROOT)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.base.glob("worker-*.log")))

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        r = run_cli(*args, "--bootstrap", self.daemon.bootstrap, "--group", GROUP)
        assert r.returncode == 0, r.stderr
        return r

    def status(self) -> dict[str, Any]:
        return json.loads(self.cli("connectors", "status", "c", "--json").stdout)

    def group(self) -> dict[str, Any]:
        r = run_cli("groups", "describe", GROUP, "--bootstrap", self.daemon.bootstrap, "--json")
        assert r.returncode == 0, r.stderr
        (g,) = json.loads(r.stdout)
        return g


def instances(st: dict[str, Any]) -> list[dict[str, Any]]:
    return [st, *st["tasks"]]


def until(check: Callable[[], Any], what: str, w: Workers, timeout_s: float = CONVERGE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        last = check()
        if last:
            return last
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s\n{w.logs()}"
        time.sleep(0.1)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with DaemonPool(tmp_path) as pool:
        w = Workers(tmp_path, pool.start(extra_env=ENV))
        try:
            yield w
        finally:
            w.close()


def test_a_killed_workers_instances_are_marked_then_kept_for_it(workers: Workers) -> None:
    w = workers
    w.cli("connectors", "create", "c", "--tasks", "3", "--config", f"connector.class={PLUGIN}",
          "--config", f"record.file={w.records}")
    w.spawn("w1", rest=True)
    w.spawn("w2")

    def running_on_both() -> dict[str, Any] | None:
        st = w.status()
        xs = instances(st)
        ok = (all(x["state"] == "RUNNING" for x in xs)
              and {x["instance_id"] for x in xs} == {"w1", "w2"})
        return st if ok else None
    until(lambda: healthy(w.rest), "w1's REST API up", w)
    st = until(running_on_both, "c and its 3 tasks RUNNING on w1 and w2", w)
    assert not any(x["worker_heartbeat_overdue"] for x in instances(st))
    assert all(x["kept_for"] is None for x in instances(st))
    on_w2 = {x.get("task", -1) for x in instances(st) if x["instance_id"] == "w2"}
    w2_member = next(x["member_id"] for x in instances(st) if x["instance_id"] == "w2")

    w.procs["w2"].kill()  # kill -9: w2 says nothing; it stays a member until its session ends
    w.procs["w2"].wait(10)
    killed_ms = time.time_ns() // 1_000_000

    def w2_marked() -> dict[str, Any] | None:
        st = w.status()
        mine = [x for x in instances(st) if x["instance_id"] == "w2"]
        others = [x for x in instances(st) if x["instance_id"] == "w1"]
        ok = (len(mine) == len(on_w2) and all(x["state"] == "RUNNING" for x in mine)
              and all(x["worker_heartbeat_overdue"] for x in mine)
              and not any(x["worker_heartbeat_overdue"] for x in others))
        return st if ok else None
    st = until(w2_marked, "w2's instances still RUNNING and marked overdue", w,
               timeout_s=SESSION_MS / 1000)
    marked_ms = time.time_ns() // 1_000_000
    for x in instances(st):
        if x["instance_id"] == "w2":
            assert x["worker_last_heartbeat_ms_ago"] > INTERVAL_MS
    # The same in REST status (w1's API), and the member in groups describe.
    code, _, rest = http("GET", f"{w.rest}/connectors/c/status")
    assert code == 200
    marked = [x for x in [rest["connector"], *rest["tasks"]] if x.get("worker_heartbeat_overdue")]
    assert marked and all(x["state"] == "RUNNING" for x in marked)
    g = w.group()
    members = {m["instance_id"]: m for m in g["members"]}
    if "w2" in members:  # (unless its session ended meanwhile)
        assert members["w1"]["heartbeat_overdue"] is False
        assert isinstance(members["w1"]["last_heartbeat_ms_ago"], int)
    # (text: polled, as the CLI is a process each time; w2's session lasts 6 s)
    until(lambda: "RUNNING (worker missed heartbeats" in w.cli("connectors", "status", "c").stdout,
          "the text status marks w2's instances", w, timeout_s=SESSION_MS / 1000)
    # connectors list: every instance still reported RUNNING, w2's counted apart as overdue.
    listed = until(lambda: [c for c in json.loads(w.cli("connectors", "list", "--json").stdout)
                            if c["overdue_instances"]],
                   "connectors list counts w2's instances overdue", w, timeout_s=SESSION_MS / 1000)
    assert [(c["name"], c["running_instances"], c["instances"], c["overdue_instances"])
            for c in listed] == [("c", 4, 4, len(on_w2))], listed

    # Its session ends, its hold (0.5 s stop budget) ends: kept for w2 until the delay's end.
    def kept() -> dict[str, Any] | None:
        st = w.status()
        xs = [x for x in instances(st) if x.get("task", -1) in on_w2]
        ok = all(x["state"] == "UNASSIGNED" and x["kept_for"] is not None for x in xs)
        return st if ok else None
    st = until(kept, "w2's items UNASSIGNED, kept for it", w)
    seen_ms = time.time_ns() // 1_000_000
    print(f"\nkill -9 w2: marked overdue in status --json after {marked_ms - killed_ms} ms, "
          f"shown kept for it after {seen_ms - killed_ms} ms (session {SESSION_MS} ms)")
    for x in instances(st):
        if x.get("task", -1) in on_w2:
            k = x["kept_for"]
            assert (k["member_id"], k["instance_id"]) == (w2_member, "w2")
            # Until the scheduled rebalance: the delay counted from the install, which came
            # after the kill and before this answer.
            assert killed_ms + DELAY_MS <= k["until_ms"] <= seen_ms + DELAY_MS
        else:
            assert x["instance_id"] == "w1" and x["kept_for"] is None
    code, _, rest = http("GET", f"{w.rest}/connectors/c/status")
    kept_rest = [x for x in [rest["connector"], *rest["tasks"]] if "kept_for" in x]
    assert len(kept_rest) == len(on_w2)
    assert all(x["state"] == "UNASSIGNED" and x["kept_for"]["instance_id"] == "w2"
               for x in kept_rest)
    g = w.group()
    (entry,) = g["kept_for"]
    assert (entry["member_id"], entry["instance_id"]) == (w2_member, "w2")
    assert entry["until_ms"] == k["until_ms"] and len(entry["items"]) == len(on_w2)
    assert [m["instance_id"] for m in g["members"]] == ["w1"]
    text = w.cli("connectors", "status", "c").stdout
    assert "UNASSIGNED (kept for w2 until" in text, text
    text = run_cli("groups", "describe", GROUP, "--bootstrap", w.daemon.bootstrap).stdout
    assert "KEPT FOR DEPARTED MEMBERS" in text and "w2" in text, text
