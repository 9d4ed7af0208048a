"""What a plugin gets from its worker, against a real coordinator daemon: its ``context``, the
connector's task configs (``task_configs``, ``request_task_reconfiguration``) and offsets
(``commit_offsets``, ``offset``, ``FencedError``). Workers run in-process
(``worker_client.worker.Worker``, as tests/test_worker.py) or as ``connect-worker`` processes
(for ``kill -9``); the plugins are tests/context_plugins.py, whose records (JSON lines) are what
the tests look at."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from connect_wire.items import Item
from connect_wire.messages import ConnectGroupFetchOffsetsRequest
from coordinator.admin import AdminClient
from tests import test_worker
from tests.daemon_fixture import ROOT, SHORT_TIMEOUTS, Daemon, daemon_env
from tests.test_worker import GROUP, Env, until

SESSION_MS = int(SHORT_TIMEOUTS["CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS"])
P = "tests.context_plugins"


def events(env: Env, event: str | None = None, item: str | None = None) -> list[dict[str, Any]]:
    out = []
    for line in env.records.read_text(encoding="utf-8").splitlines():
        if line.strip():
            e = json.loads(line)
            if (event is None or e["event"] == event) and (item is None or e["item"] == item):
                out.append(e)
    return out


def assigned(env: Env) -> set[str]:
    g = env.describe()
    return {f"{t.connector}/{t.task}" for m in g.members for t in m.assignment.tasks} | {
        c for m in g.members for c in m.assignment.connectors}


def offsets(daemon: Daemon, connector: str) -> dict[str, Any]:
    with AdminClient(daemon.host, daemon.port, timeout_s=5) as c:
        resp = c.call(ConnectGroupFetchOffsetsRequest(group_id=GROUP, connector=connector, partitions=None))
    assert resp.error_code == 0, resp
    return {o.partition: None if o.offset is None else json.loads(o.offset) for o in resp.offsets}


# The daemon (a real process, 2 s session) and the in-process workers' Env of tests/test_worker.py.
daemon = test_worker.daemon
env = test_worker.env


# == the context ===================================================================================


async def test_start_gets_a_context_and_a_slotted_plugin_runs_without_one(env: Env) -> None:
    env.alter({"ctx": (1, {"connector.class": f"{P}:ContextConnector"}),
               "slots": (1, {"connector.class": f"{P}:SlottedConnector"})})
    w = env.start("a")
    await until(lambda: len(events(env, "start")) == 4, "the four instances started")
    started = {e["item"]: e for e in events(env, "start")}
    assert set(started) == {"ctx", "ctx/0", "slots", "slots/0"}
    for item, task_id in (("ctx", None), ("ctx/0", 0)):
        ctx = started[item]["context"]
        assert (ctx["connector"], ctx["task_id"], ctx["worker_id"]) == ("ctx", task_id, w.worker_id)
        assert 0 < ctx["member_epoch"] <= w.membership.member_epoch
    assert started["slots/0"]["context"] == "absent" and started["slots/0"]["config"]["task.id"] == "0"
    inst = next(i for item, i in w.instances.items() if str(item) == "ctx/0")
    assert inst.plugin.context.member_epoch == w.membership.member_epoch, "live"
    assert inst.plugin.context.fencing_token == w.membership.tokens.get(inst.item)
    tokens = {item: started[item]["context"]["fencing_token"] for item in ("ctx", "ctx/0")}
    assert all(isinstance(t, int) and t > 0 for t in tokens.values()), tokens
    assert tokens["ctx/0"] == inst.plugin.context.fencing_token
    assert all(i.state == "RUNNING" for i in w.instances.values())


# == task configs ==================================================================================


async def test_task_configs_decide_how_many_tasks_run_and_their_configs(env: Env, tmp_path: Path) -> None:
    source = tmp_path / "source.json"
    source.write_text(json.dumps([{"shard": "a"}, {"shard": "b", "topic": "own"}]))
    env.alter({"split": (3, {"connector.class": f"{P}:SplitConnector", "source.file": str(source),
                             "topic": "shared"})})
    env.start("a")
    env.start("b")
    await until(lambda: {e["item"] for e in events(env, "start")} >= {"split", "split/0", "split/1"},
                "the connector and the two tasks it configured started", timeout_s=30)
    await until(lambda: assigned(env) == {"split", "split/0", "split/1"},
                "the coordinator runs the two tasks written", timeout_s=30)
    (call, *_) = events(env, "task_configs")
    assert call["max_tasks"] == 3
    configs = {e["item"]: e["config"] for e in events(env, "start")}
    assert configs["split/0"]["shard"] == "a" and configs["split/0"]["topic"] == "shared"
    assert configs["split/1"]["shard"] == "b" and configs["split/1"]["topic"] == "own"
    assert configs["split/1"]["task.id"] == "1" and configs["split/1"]["connector.name"] == "split"
    assert not events(env, "start", "split/2"), "task 2 has no config: it never starts"
    g = env.describe()
    (spec,) = g.connectors
    assert spec.task_count == 3 and [dict((c.name, c.value) for c in t.config) for t in spec.task_configs] \
        == [{"shard": "a"}, {"shard": "b", "topic": "own"}]

    # The source changes task 1 only: the connector asks for a reconfiguration, and only task 1
    # restarts, with its new config.
    source.write_text(json.dumps([{"shard": "a"}, {"shard": "B2"}]))
    await until(lambda: any(e["config"]["shard"] == "B2" for e in events(env, "start", "split/1")),
                "task 1 restarted with its new config", timeout_s=30)
    await asyncio.sleep(1.0)  # (time for a wrong restart of the others to show)
    assert len(events(env, "start", "split/0")) == 1 and not events(env, "stop", "split/0")
    assert len(events(env, "start", "split")) == 1 and not events(env, "stop", "split")
    assert len(events(env, "start", "split/1")) == 2 and len(events(env, "stop", "split/1")) == 1
    assert "topic" not in [e for e in events(env, "start", "split/1")][-1]["config"] or \
        events(env, "start", "split/1")[-1]["config"]["topic"] == "shared"


async def test_a_connector_answering_too_many_task_configs_fails_and_no_task_starts(
        env: Env, tmp_path: Path) -> None:
    source = tmp_path / "source.json"
    source.write_text("[]")
    env.alter({"many": (2, {"connector.class": f"{P}:TooManyConnector", "source.file": str(source)})})
    w = env.start("a")
    conn = Item("many", -1)
    await until(lambda: conn in w.instances and w.instances[conn].restarts >= 2,
                "the connector instance failed twice")
    inst = w.instances[conn]
    assert inst.error is not None and ("returned 3 task configs; at most max_tasks=2 (the "
                                       "connector's configured task count)") in inst.error, inst.error
    assert "TooManyConnector.task_configs" in inst.error
    assert {str(i) for i in w.instances} == {"many"}, "no task starts without its config"
    assert not [e for e in events(env, "start") if e["item"] != "many"]
    (spec,) = env.describe().connectors
    assert spec.task_configs is None, "nothing written"


# == offsets =======================================================================================


def spawn_worker(daemon: Daemon, name: str, base: Path, session_ms: int = SESSION_MS,
                 ) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", daemon.bootstrap,
           "--group", GROUP, "--instance-id", name, "--session-timeout-ms", str(session_ms),
           "--max-delay-ms", "0", "--rebalance-timeout-ms", "2000"]
    with open(base / f"worker-{name}.log", "ab") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=daemon_env(), cwd=ROOT)


async def test_commit_then_kill_9_the_new_owner_resumes_from_the_last_commit(
        env: Env, daemon: Daemon, tmp_path: Path) -> None:
    env.alter({"off": (1, {"connector.class": f"{P}:OffsetConnector", "commit.ms": "20"})})
    a = spawn_worker(daemon, "a", tmp_path)
    b: subprocess.Popen[bytes] | None = None
    try:
        await until(lambda: len(events(env, "committed", "off/0")) >= 20, "a committed 20 times",
                    timeout_s=30)
        a.kill()
        a.wait(10)
        committed = max(e["n"] for e in events(env, "committed", "off/0"))
        committing = max(e["n"] for e in events(env, "committing", "off/0"))
        b = spawn_worker(daemon, "b", tmp_path)
        await until(lambda: any(e["worker"] == "b" for e in events(env, "resume", "off/0")),
                    "b's task resumed", timeout_s=30)
        (first, resumed) = events(env, "resume", "off/0")
        assert first["offset"] is None and first["worker"] == "a"
        # What a had committed (answered) is there; at most the one in flight at the kill more.
        assert resumed["offset"] is not None, resumed
        assert committed <= resumed["offset"]["n"] <= committing, (committed, committing, resumed)
        assert resumed["context"]["fencing_token"] > first["context"]["fencing_token"], (first, resumed)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(10)


async def test_epoch_bumps_elsewhere_never_fail_a_holders_commits(env: Env, daemon: Daemon) -> None:
    """Commits every 5 ms while the group's epoch moves (connectors created and deleted) until
    a commit met STALE_MEMBER_EPOCH (the coordinator bumped the member's epoch, the heartbeat
    answer saying so still on its way): it is sent again with the newer epoch, never raised to
    the task."""
    env.alter({"off": (1, {"connector.class": f"{P}:OffsetConnector", "commit.ms": "5"})})
    a = env.start("a")
    await until(lambda: events(env, "committed", "off/0"), "a commits")
    first_epoch = a.membership.member_epoch

    def resends() -> float:
        return a.metrics.registry.get_sample_value("connect_worker_stale_epoch_resends_total") or 0.0

    bumps = 0
    while resends() < 3 and bumps < 60:
        env.alter({f"x{bumps}": (0, {"connector.class": f"{P}:ContextConnector"})})
        await asyncio.sleep(0.1)
        env.alter(deletes=(f"x{bumps}",))
        await asyncio.sleep(0.1)
        bumps += 1
    before = len(events(env, "committed", "off/0"))
    await until(lambda: len(events(env, "committed", "off/0")) > before + 5, "a still commits")
    commits = a.metrics.registry.get_sample_value("connect_worker_offset_commits_total")
    print(f"measured: {bumps} x 2 epoch bumps, {commits} commits, {resends()} sent again after "
          "STALE_MEMBER_EPOCH")
    assert a.membership.member_epoch >= first_epoch + bumps
    assert resends() >= 3, "the group's epoch moved under the commits"
    assert not events(env, "fenced"), events(env, "fenced")


async def test_stop_commits_its_last_position_before_the_item_is_released(env: Env, daemon: Daemon) -> None:
    env.alter({"off": (1, {"connector.class": f"{P}:OffsetConnector", "commit.ms": "100000",
                           "commit.on.stop": "true"})})
    a = env.start("a")
    await until(lambda: events(env, "committed", "off/0"), "a committed once")
    await a.stop()  # revokes everything, reports it released only after each stop() returned
    (done,) = events(env, "stop-commit", "off/0")
    assert "error" not in done, done
    (value,) = offsets(daemon, "off").values()
    assert value == {"n": 1, "by": a.worker_id, "final": True}


async def test_a_worker_whose_item_moved_away_gets_fenced_error(env: Env, daemon: Daemon,
                                                                tmp_path: Path) -> None:
    """Worker a is frozen (SIGSTOP) past the coordinator's session: the coordinator expires it
    and gives its task to b. a was told a 60 s session (so that neither its own lease nor its
    fail-stop guard ends it first, as for a process frozen that long), so when it runs again
    it still believes it holds the task: its commits are refused with FencedError — from the
    coordinator, or, once its heartbeat learnt it was fenced, before sending, in the stop()
    that follows — and only b's commits are stored."""
    env.alter({"off": (1, {"connector.class": f"{P}:OffsetConnector", "commit.ms": "20",
                           "commit.on.stop": "true"})})
    a = spawn_worker(daemon, "a", tmp_path, session_ms=60_000)
    b: subprocess.Popen[bytes] | None = None
    try:
        await until(lambda: len(events(env, "committed", "off/0")) >= 3, "a commits", timeout_s=30)
        a.send_signal(signal.SIGSTOP)
        frozen_at = time.time()
        b = spawn_worker(daemon, "b", tmp_path)
        await until(lambda: len([e for e in events(env, "committed", "off/0") if e["worker"] == "b"]) >= 3,
                    "b runs the task and commits", timeout_s=30)
        a.send_signal(signal.SIGCONT)
        await until(lambda: [e for e in events(env) if e["worker"] == "a" and "FencedError" in
                             (e.get("error") or "")], "a's commit refused", timeout_s=30)
        refused = [e for e in events(env) if e["worker"] == "a" and "FencedError" in (e.get("error") or "")]
        assert refused[0]["event"] in ("fenced", "stop-commit"), refused
        after = [e for e in events(env, "committed", "off/0") if e["worker"] == "a" and e["ts"] > frozen_at]
        assert not after, f"a commit of a's was accepted after the task moved: {after}"
        await until(lambda: any(e["worker"] == "a" for e in events(env, "stop", "off/0")),
                    "a stopped its task")
        stored = offsets(daemon, "off")
        (value,) = stored.values()
        assert value["by"] == "b", stored
        assert value["n"] >= max(e["n"] for e in events(env, "committed", "off/0") if e["worker"] == "b")
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
                p.wait(10)


async def test_a_stop_that_comes_as_start_returns_is_not_lost(env: Env) -> None:
    """A task's stop that comes in the loop turn its start() ends in: Python 3.11's
    asyncio.wait_for then returns start()'s result and swallows the cancellation, so the
    supervisor went on to run() and ignored the stop until the stop budget ran out, and the
    worker fail-stopped (seen once in CI with the counter example, whose start() fetches its
    offsets). The hook makes that turn certain: the stop is scheduled from inside start()."""
    from tests import context_plugins

    a = env.start("a")
    stops: list[asyncio.Future[None]] = []

    def hook(item: str) -> None:
        if item == "hook/0" and not stops:
            stops.append(asyncio.ensure_future(a._stop_items(frozenset({Item("hook", 0)}))))

    context_plugins.START_HOOK = hook
    try:
        env.alter({"hook": (1, {"connector.class": f"{P}:HookConnector"})})
        await until(lambda: stops, "the task's start() ran")
        await asyncio.wait_for(stops[0], 15)
    finally:
        context_plugins.START_HOOK = None
    assert not env.unexpected_fail_stops, env.unexpected_fail_stops
    assert not events(env, "run", "hook/0"), "run() started although the task was being stopped"
    assert [e["event"] for e in events(env, item="hook/0")] == ["stop"]
    env.unexpected_fail_stops.clear()

