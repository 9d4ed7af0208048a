"""The worker runtime in-process (``worker_client.worker.Worker``) against a real daemon process.

Rebalance hooks (revoke before assign, on_lost when fenced), supervised plugin instances (a
crashing ``run()`` is restarted with backoff and stays owned; a ``stop()`` past its deadline is
reported and the revocation still acknowledged; a slow but timely ``stop()`` does not cost the
worker its session), and self-fencing when the coordinator stalls (SIGSTOP) followed by a rejoin
(SIGCONT). Plugins are the bundled recording example; its records are analysed with the e2e
analyzer. A few pure Membership cases complete tests/test_membership.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from connect_wire.errors import ErrorCode as E
from connect_wire.items import Item
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatResponse,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_response_v0 as _hb
from coordinator.admin import AdminClient
from tests.daemon_fixture import SHORT_TIMEOUTS, Daemon, DaemonPool
from tests.test_worker_e2e import Timeline, analyze
from worker_client.membership import AssignorAd, Lost, Membership
from worker_client.worker import Worker, WorkerConfig, WorkerFailStopped, WorkerRebalanceListener

GROUP = "inproc"
SESSION_MS = int(SHORT_TIMEOUTS["CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS"])
INTERVAL_MS = int(SHORT_TIMEOUTS["CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS"])
PLUGIN = "worker_client.examples.recording:RecordingConnector"


# == helpers =======================================================================================


class Recorder(WorkerRebalanceListener):
    """Hook calls of one or more workers, in the order they happened (one event loop)."""

    def __init__(self, calls: list[tuple[str, str, frozenset[str]]], name: str) -> None:
        self.calls, self.name = calls, name

    def _add(self, hook: str, items: frozenset[Item]) -> None:
        self.calls.append((self.name, hook, frozenset(str(i) for i in items)))

    def on_assigned(self, items: frozenset[Item]) -> None:
        self._add("assigned", items)

    async def on_revoked(self, items: frozenset[Item]) -> None:  # hooks may be async
        await asyncio.sleep(0)
        self._add("revoked", items)

    def on_lost(self, items: frozenset[Item]) -> None:
        self._add("lost", items)


class Env:
    def __init__(self, daemon: Daemon, base: Path) -> None:
        self.daemon = daemon
        self.records = base / "records.jsonl"
        self.records.touch()
        self.workers: list[tuple[Worker, asyncio.Task[None]]] = []
        self.unexpected_fail_stops: list[str] = []

    def alter(self, upserts: Mapping[str, tuple[int, Mapping[str, str]]] = {},
              deletes: tuple[str, ...] = ()) -> None:
        specs = tuple(
            _alter.ConnectorSpec(name=name, task_count=n, config=tuple(
                _alter.ConfigEntry(name=k, value=v)
                for k, v in sorted({"connector.class": PLUGIN, "record.file": str(self.records),
                                    **config}.items())))
            for name, (n, config) in sorted(upserts.items()))
        with AdminClient(self.daemon.host, self.daemon.port, timeout_s=5) as c:
            resp = c.call(ConnectGroupAlterConnectorsRequest(group_id=GROUP, upserts=specs, deletes=deletes,
                                                             validate_only=False))
        assert resp.error_code == 0, resp

    def describe(self) -> Any:
        with AdminClient(self.daemon.host, self.daemon.port, timeout_s=5) as c:
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(GROUP,))).groups
        return g

    def timeline(self) -> Timeline:
        lines = self.records.read_text().splitlines()
        return analyze([json.loads(line) for line in lines if line.strip()])

    def start(self, name: str, listener: WorkerRebalanceListener | None = None, **kw: Any) -> Worker:
        config = dict(bootstrap=[(self.daemon.host, self.daemon.port)], group_id=GROUP,
                      session_timeout_ms=SESSION_MS, rebalance_timeout_ms=4000, max_delay_ms=0,
                      request_timeout_ms=5000, client_id=name)
        config.update(kw)
        # The default fail-stop action ends the process (pytest with it): record instead; the
        # fixture fails a test whose worker fail-stopped without the test expecting it.
        config.setdefault("fail_stop", self.unexpected_fail_stops.append)
        w = Worker(WorkerConfig(**config), listener=listener)  # type: ignore[arg-type]
        self.workers.append((w, asyncio.create_task(w.run())))
        return w

    async def stop_all(self) -> None:
        for w, task in self.workers:
            if not task.done():
                await w.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)


def items(*texts: str) -> frozenset[str]:
    return frozenset(texts)


def of(w: Worker) -> frozenset[str]:
    return frozenset(str(i) for i in w.membership.owned)


def running(t: Timeline, worker: str) -> frozenset[str]:
    return frozenset(i for i, ivs in t.running().items() if any(iv.worker == worker for iv in ivs))


async def until(cond: Callable[[], Any], what: str, timeout_s: float = 15.0) -> float:
    """Poll ``cond`` (every 20 ms) until true; returns the seconds it took."""
    started = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


def stable(env: Env, expect: Mapping[Worker, frozenset[str]]) -> Callable[[], bool]:
    """The group is Stable, each worker owns exactly what is expected, and the records agree."""
    def check() -> bool:
        g = env.describe()
        if g.group_state != "Stable" or any(m.member_state != "Stable" for m in g.members):
            return False
        t = env.timeline()
        return all(of(w) == its and running(t, w.worker_id) == its for w, its in expect.items())
    return check


def failures(w: Worker) -> float:
    return w.metrics.registry.get_sample_value("connect_worker_instance_failures_total") or 0.0


def lost(w: Worker) -> float:
    return w.metrics.registry.get_sample_value("connect_worker_lost_total") or 0.0


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with DaemonPool(tmp_path) as pool:
        yield pool.start()


@pytest.fixture
async def env(daemon: Daemon, tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(daemon, tmp_path)
    try:
        yield e
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.proc.pid, signal.SIGCONT)
        await e.stop_all()
    assert not e.unexpected_fail_stops, e.unexpected_fail_stops


# == rebalance hooks ===============================================================================


async def test_hooks_revoke_before_assign(env: Env) -> None:
    calls: list[tuple[str, str, frozenset[str]]] = []
    env.alter({"alpha": (2, {})})
    a = env.start("a", Recorder(calls, "a"), instance_id="a")
    alpha = items("alpha", "alpha/0", "alpha/1")
    await until(stable(env, {a: alpha}), "a runs alpha")
    assert calls == [("a", "assigned", alpha)]

    # One change that takes alpha away and brings gamma: revoked first, then assigned.
    calls.clear()
    env.alter({"gamma": (2, {})}, deletes=("alpha",))
    gamma = items("gamma", "gamma/0", "gamma/1")
    await until(stable(env, {a: gamma}), "a runs gamma")
    assert calls == [("a", "revoked", alpha), ("a", "assigned", gamma)]

    # A second worker: what moves is revoked from a before b is given it.
    calls.clear()
    b = env.start("b", Recorder(calls, "b"), instance_id="b")
    await until(lambda: of(b) and stable(env, {a: of(a), b: of(b)})(), "a and b share gamma")
    moved = gamma - of(a)
    assert moved and of(b) == moved
    assert calls == [("a", "revoked", moved), ("b", "assigned", moved)]

    # A graceful stop: a's work stopped (on_revoked), a leaves, b takes it (max delay 0).
    calls.clear()
    rest = of(a)
    await a.stop(static=False)
    await until(stable(env, {b: gamma}), "b runs everything")
    assert calls == [("a", "revoked", rest), ("b", "assigned", rest)]
    assert [m.instance_id for m in env.describe().members] == ["b"]
    t = env.timeline()
    assert not t.problems and not t.overlaps(), (t.problems, t.overlaps())
    assert lost(a) == lost(b) == 0


async def test_on_lost_when_the_coordinator_fences_the_worker(env: Env) -> None:
    calls: list[tuple[str, str, frozenset[str]]] = []
    env.alter({"alpha": (1, {})})
    # The worker believes in a long session, so it does not fence itself: the coordinator's
    # 2 s session expires first and the next heartbeat is refused.
    w = env.start("a", Recorder(calls, "a"), session_timeout_ms=60_000)
    everything = items("alpha", "alpha/0")
    await until(stable(env, {w: everything}), "a runs alpha")
    member_id = w.membership.member_id
    paused = asyncio.Event()
    real_send = w.client.send

    async def send(req: Any, which: str = "control", extra_timeout_s: float = 0.0,
                   **kw: Any) -> Any:
        if which == "heartbeat" and paused.is_set():
            while paused.is_set():
                await asyncio.sleep(0.01)
        return await real_send(req, which, extra_timeout_s, **kw)

    w.client.send = send  # type: ignore[method-assign]
    paused.set()
    await until(lambda: not env.describe().members, "the coordinator to expire the member",
                timeout_s=SESSION_MS / 1000 + 5)
    paused.clear()
    await until(stable(env, {w: everything}), "a rejoins and runs alpha again")
    assert [c[1] for c in calls] == ["assigned", "lost", "assigned"], calls
    assert calls[1] == ("a", "lost", everything)
    assert lost(w) == 1
    assert w.membership.member_id == member_id, "a fenced member rejoins with the same id"
    t = env.timeline()
    assert not t.problems
    # The lost work was stopped (one complete interval per item) before the rejoin restarted it.
    assert sorted(iv.item for iv in t.intervals if iv.end == "stop") == sorted(everything)


async def test_self_fencing_while_the_coordinator_stalls_then_rejoin(env: Env) -> None:
    calls: list[tuple[str, str, frozenset[str]]] = []
    env.alter({"alpha": (2, {}), "beta": (1, {})})
    w = env.start("a", Recorder(calls, "a"))
    everything = items("alpha", "alpha/0", "alpha/1", "beta", "beta/0")
    await until(stable(env, {w: everything}), "a runs everything")
    pid = env.daemon.proc.pid
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        await until(lambda: not running(env.timeline(), w.worker_id), "the worker stops its work itself",
                    timeout_s=SESSION_MS / 1000 + 3)
        self_fenced = time.time() - stopped_at
        await asyncio.sleep(0.5)  # the coordinator stays stalled past the session timeout
    finally:
        os.kill(pid, signal.SIGCONT)
    t = env.timeline()
    last_stop = max(iv.stop for iv in t.intervals if iv.stop is not None) - stopped_at
    # The coordinator counts the session from the last heartbeat it handled (at most a long-poll
    # interval before the stall); the worker must have stopped everything by then (+0.1 s slack
    # for scheduling; tests/test_worker.py::test_self_fencing_counts_from... pins the rule).
    assert (SESSION_MS - 2 * INTERVAL_MS) / 1000 <= last_stop <= SESSION_MS / 1000 + 0.1, (
        last_stop, self_fenced)
    assert ("a", "lost", everything) in calls and lost(w) == 1
    await until(stable(env, {w: everything}), "the worker rejoins and gets its work back")
    assert not env.timeline().problems


async def test_stop_during_a_self_fence_waits_for_the_stops_in_progress(env: Env) -> None:
    """Found by the simulator ("revoked-while-stopping"): a worker self-fenced (its stops in
    progress) and then told to stop: stop()'s drain found the items no longer among its
    instances, took them as stopped and reported them released while they were still stopping
    (the coordinator could then have handed them on)."""
    env.alter({"slow": (1, {"stop.delay.ms": "1500"})})
    w = env.start("a", rebalance_timeout_ms=10_000)  # 5 s per stop
    slow = items("slow", "slow/0")
    await until(stable(env, {w: slow}), "a runs everything")
    pid = env.daemon.proc.pid
    os.kill(pid, signal.SIGSTOP)
    early: set[str] = set()
    try:
        await until(lambda: w.membership.stopping_lost, "a fences itself", timeout_s=SESSION_MS / 1000 + 3)
        stopping = asyncio.create_task(w.stop())
        while not stopping.done() and not early:
            stopped = {e["item"] for e in env.timeline().events if e["event"] == "stop"}
            if stopped >= slow:
                break
            early |= slow - of(w) - stopped  # reported released, not stopped yet
            await asyncio.sleep(0.01)
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.wait_for(stopping, 20)
    assert not early, early
    assert {e["item"] for e in env.timeline().events if e["event"] == "stop"} == slow


# == supervised instances ==========================================================================


async def test_crashing_task_is_restarted_with_backoff_and_stays_owned(env: Env) -> None:
    env.alter({"crashy": (1, {"fail.after.ms": "50"}), "calm": (1, {})})
    w = env.start("a")
    everything = items("crashy", "crashy/0", "calm", "calm/0")

    def crashed() -> int:
        return sum(1 for iv in env.timeline().intervals if iv.item == "crashy/0" and iv.end == "stop")

    # Five crashes: it is now backing off for 1.6 s.
    await until(lambda: crashed() >= 5, "crashy/0 crashed five times", timeout_s=10)
    # Still owned and reported all along: the coordinator sees it on this worker.
    assert of(w) == everything
    (m,) = env.describe().members
    assert {*m.assignment.connectors, *(f"{x.connector}/{x.task}" for x in m.assignment.tasks)} == everything
    assert failures(w) >= 4
    t = env.timeline()
    crashes = sorted((iv for iv in t.intervals if iv.item == "crashy/0"), key=lambda iv: iv.start)
    gaps = [b.start - a.stop for a, b in zip(crashes, crashes[1:], strict=False) if a.stop is not None]
    assert len(gaps) >= 4, crashes
    # Exponential backoff: 0.1 s, 0.2 s, 0.4 s, ...
    assert gaps[0] >= 0.08, gaps
    assert all(later >= 1.6 * earlier for earlier, later in zip(gaps, gaps[1:4], strict=False)), gaps
    # The others never restarted.
    assert [iv.item for iv in t.intervals if iv.item != "crashy/0"].count("calm/0") == 1
    # Revoked while backing off: stopped once (never a second stop of a crashed instance).
    env.alter(deletes=("crashy",))
    await until(stable(env, {w: items("calm", "calm/0")}), "crashy revoked")
    t = env.timeline()
    assert not t.problems, t.problems
    assert w.metrics.registry.get_sample_value("connect_worker_running_instances") == 2


class ReturningTask:
    """A task whose run() returns at once (docs/plugins.md: that counts as a failure)."""

    objects: list[ReturningTask] = []

    def __init__(self) -> None:
        ReturningTask.objects.append(self)
        self.events: list[str] = []

    async def start(self, config: dict[str, str | None]) -> None:
        self.events.append("start")

    async def run(self) -> None:
        self.events.append("run")

    async def stop(self) -> None:
        self.events.append("stop")


class ReturningConnector:
    task_class = ReturningTask

    async def start(self, config: dict[str, str | None]) -> None:
        pass

    async def stop(self) -> None:
        pass


async def test_a_run_that_returns_is_a_failure_restarted_on_a_new_object(env: Env) -> None:
    ReturningTask.objects.clear()
    env.alter({"returns": (1, {"connector.class": f"{__name__}:ReturningConnector"})})
    w = env.start("a")
    await until(lambda: len(ReturningTask.objects) >= 3, "three attempts", timeout_s=10)
    # Each attempt: a new object, started, run, then stopped; reported FAILED with why.
    for obj in ReturningTask.objects[:2]:
        assert obj.events == ["start", "run", "stop"], obj.events
    inst = w.instances[Item.parse("returns/0")]
    assert inst.error == "RuntimeError('run() returned')" and "run() returned" in (inst.trace or "")
    assert inst.restarts >= 2 and failures(w) >= 2
    assert of(w) == items("returns", "returns/0")  # still owned: never dropped


async def test_stop_past_its_deadline_fail_stops_and_never_reports_the_item_released(env: Env) -> None:
    """Issue 15: a stop() that outlives the stop budget used to be abandoned and its item
    reported released while the plugin still ran. Now the worker fail-stops (here the action
    records instead of ending the test process): it reports nothing released, does not leave,
    and stops heartbeating, so the coordinator expires it (and then holds its items for the
    budget: tests/test_group_coordinator.py). Real processes: tests/test_worker_failstop_e2e.py."""
    env.alter({"slow": (1, {"stop.delay.ms": "5000"}), "calm": (1, {})})
    fired: list[str] = []
    # Rebalance timeout 1000 ms: each stop gets 500 ms.
    a = env.start("a", rebalance_timeout_ms=1000, fail_stop=fired.append)
    task = env.workers[-1][1]
    everything = items("slow", "slow/0", "calm", "calm/0")
    await until(stable(env, {a: everything}), "a runs everything")
    started = time.monotonic()
    await asyncio.wait_for(a.stop(), 5)  # drains a's work: slow's stops overrun; no leave
    took = time.monotonic() - started
    assert len(fired) == 1 and "did not stop within the stop budget of 500 ms" in fired[0], fired
    assert "slow" in fired[0]
    assert took >= 0.45, took  # not before the budget ran out
    with pytest.raises(WorkerFailStopped, match="slow"):
        await asyncio.wait_for(task, 5)
    assert a.failed_stop == fired[0]
    assert {"slow", "slow/0"} <= of(a), "what a could not stop was never reported released"
    (m,) = env.describe().members
    assert m.member_id == a.membership.member_id, "still a member: it did not leave"
    assignment = {*m.assignment.connectors, *(f"{t.connector}/{t.task}" for t in m.assignment.tasks)}
    assert {"slow", "slow/0"} <= assignment
    assert not [e for e in env.timeline().events if e["event"] == "stop" and e["item"].startswith("slow")]
    # It stopped heartbeating: the coordinator expires it.
    await until(lambda: not env.describe().members, "the member expired", timeout_s=10)


async def test_stop_that_raises_counts_as_stopped(env: Env) -> None:
    env.alter({"bad": (1, {"stop.mode": "raise"}), "calm": (1, {})})
    fired: list[str] = []
    w = env.start("a", rebalance_timeout_ms=1000, fail_stop=fired.append)
    await until(stable(env, {w: items("bad", "bad/0", "calm", "calm/0")}), "a runs everything")
    env.alter(deletes=("bad",))
    await until(stable(env, {w: items("calm", "calm/0")}), "bad revoked")
    assert not fired
    assert failures(w) == 2, "both raising stops are counted"
    stops = {e["item"] for e in env.timeline().events if e["event"] == "stop"}
    assert stops == {"bad", "bad/0"}


async def test_slow_stop_within_the_deadline_keeps_the_session(env: Env) -> None:
    env.alter({"slow": (1, {"stop.delay.ms": "3000"}), "calm": (2, {})})
    # A 10 s rebalance timeout gives each stop 5 s: longer than the 2 s session timeout, so the
    # worker must keep heartbeating while it stops work.
    w = env.start("a", rebalance_timeout_ms=10_000)
    calm = items("calm", "calm/0", "calm/1")
    await until(stable(env, {w: calm | items("slow", "slow/0")}), "a runs everything")
    member_id = w.membership.member_id
    env.alter(deletes=("slow",))
    took = await until(stable(env, {w: calm}), "slow stopped and the revocation acknowledged",
                       timeout_s=10)
    assert took >= 2.9, took
    assert lost(w) == 0 and failures(w) == 0
    (m,) = env.describe().members
    assert m.member_id == member_id
    t = env.timeline()
    assert not t.problems
    assert {e["item"] for e in t.events if e["event"] == "stop"} == items("slow", "slow/0")


# == membership: cases tests/test_membership.py does not cover =====================================


ADS = (AssignorAd("incremental", 0, 1),)


def _response(epoch: int, assigned: tuple[str, ...] | None = None, error: int = 0,
              member_id: str | None = None) -> ConnectGroupHeartbeatResponse:
    assignment = None
    if assigned is not None:
        its = sorted(Item.parse(t) for t in assigned)
        assignment = _hb.Assignment(
            error=0, connectors=tuple(i.connector for i in its if i.is_connector),
            tasks=tuple(_hb.TaskId(connector=i.connector, task=i.task) for i in its if not i.is_connector),
            metadata_version=0, metadata_bytes=b"")
    return ConnectGroupHeartbeatResponse(error_code=error, member_id=member_id, member_epoch=epoch,
                                         heartbeat_interval_ms=200, should_compute_assignment=False,
                                         assignment=assignment)


def test_unknown_member_id_is_lost_like_fenced() -> None:
    m = Membership("g", ADS)
    m.join(0)
    m.heartbeat_request(0)
    m.on_response(_response(1, ("A", "A/0"), member_id="m"), 0)
    m.assigned_started(frozenset({Item.parse("A"), Item.parse("A/0")}), 0)
    m.heartbeat_request(10)
    (action,) = m.on_response(_response(1, error=E.UNKNOWN_MEMBER_ID), 10)
    assert isinstance(action, Lost) and len(action.items) == 2
    m.revoked(action.items, 20)
    rejoin = m.heartbeat_request(20)
    assert (rejoin.member_id, rejoin.member_epoch, rejoin.max_wait_ms) == ("m", 0, 0)


def test_self_fencing_counts_from_when_the_last_good_heartbeat_was_sent() -> None:
    """The coordinator's session runs from when it handled the heartbeat, which is before its
    (long-polled) answer arrives: the worker must not count from the answer."""
    m = Membership("g", ADS, session_timeout_ms=2000, long_poll=True)
    m.join(0)
    m.heartbeat_request(0)
    m.on_response(_response(1, ("A",), member_id="m"), 0)
    m.assigned_started(frozenset({Item.parse("A")}), 0)
    m.heartbeat_request(1000)  # long-polled: held by the coordinator
    m.on_response(_response(1), 1200)
    assert m.check_session(2999) is None
    assert m.check_session(3000) is not None


def test_retriable_error_keeps_the_work_and_resends_everything() -> None:
    m = Membership("g", ADS)
    m.join(0)
    m.heartbeat_request(0)
    m.on_response(_response(1, ("A",), member_id="m"), 0)
    m.assigned_started(frozenset({Item.parse("A")}), 0)
    m.heartbeat_request(5)
    m.on_response(_response(1), 5)
    m.heartbeat_request(10)
    assert m.on_response(_response(1, error=E.COORDINATOR_NOT_AVAILABLE), 10) == []
    assert m.owned == frozenset({Item.parse("A")})
    again = m.heartbeat_request(1000)
    assert again.member_epoch == 1 and again.owned_connectors == ("A",) and again.max_wait_ms == 0


# == a coordinator regression these tests found ====================================================


async def test_parked_heartbeat_expiring_during_its_wake_up_probe_gets_the_probe_answer(
        tmp_path: Path) -> None:
    """coordinator/runtime/shard.py: a parked heartbeat whose MaxWaitMs ran out while its wake-up
    probe was being committed used to be answered with the stale parked answer, dropping what
    the probe committed (here the member's epoch bump); the member's next heartbeat, at the old
    epoch, was then fenced (seen end to end: a bystander worker lost all its work when another
    worker died). The probe's commit is made slow so that the timer fires during it."""
    from connect_wire.messages import (
        ConnectGroupHeartbeatRequest,
        ConnectGroupInstallAssignmentRequest,
        ConnectGroupPrepareAssignmentRequest,
    )
    from connect_wire.messages import connect_group_heartbeat_request_v0 as _hbreq
    from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
    from coordinator.group.config import GroupCoordinatorConfig
    from coordinator.group.coordinator import RequestContext
    from coordinator.metrics import Metrics
    from coordinator.runtime.log import FsyncPolicy
    from coordinator.runtime.shard import Shard
    from coordinator.store.file import FileStore

    store = FileStore(tmp_path, 0, fsync=FsyncPolicy(), segment_bytes=1 << 20,
                      compaction_interval_ms=3_600_000, tombstone_retention_ms=0)
    shard = Shard(0, store, GroupCoordinatorConfig(session_timeout_ms=60_000), Metrics())
    await shard.load()
    ctx = RequestContext(client_id="t", client_host="127.0.0.1")

    def error(code: int, message: str) -> Any:
        raise AssertionError(f"{code}: {message}")

    def hb(epoch: int, owned: tuple[str, ...] | None = None, wait: int = 0, **kw: Any) -> Any:
        tasks = None if owned is None else tuple(
            _hbreq.TaskId(connector=i.split("/")[0], task=int(i.split("/")[1])) for i in owned if "/" in i)
        connectors = None if owned is None else tuple(i for i in owned if "/" not in i)
        return shard.heartbeat(ConnectGroupHeartbeatRequest(
            group_id="g", member_id="m", member_epoch=epoch, owned_connectors=connectors,
            owned_tasks=tasks, max_wait_ms=wait, **kw), ctx, error)

    async def prepare(epoch: int) -> Any:
        req = ConnectGroupPrepareAssignmentRequest(group_id="g", member_id="m", member_epoch=epoch)
        prep = await shard.write(lambda core, now: core.prepare_assignment(req, now), error)
        assert prep.error_code == 0, prep
        return prep

    async def install(prep: Any, epoch: int, target: tuple[str, ...]) -> None:
        req = ConnectGroupInstallAssignmentRequest(
            group_id="g", member_id="m", member_epoch=epoch, group_epoch=prep.group_epoch, error=0,
            assignor_state=b"", members=(_inst.MemberAssignment(
                member_id="m", connectors=tuple(i for i in target if "/" not in i),
                tasks=tuple(_inst.TaskId(connector=i.split("/")[0], task=int(i.split("/")[1]))
                            for i in target if "/" in i), metadata_version=0, metadata_bytes=b""),))
        resp = await shard.write(lambda core, now: core.install_assignment(req, now), error)
        assert resp.error_code == 0, resp

    try:
        with_a = ("a", "a/0")
        specs = (_alter.ConnectorSpec(name="a", task_count=1, config=()),)
        await shard.write(lambda core, now: core.alter_connectors(ConnectGroupAlterConnectorsRequest(
            group_id="g", upserts=specs, deletes=(), validate_only=False), now), error)
        join = dict(rebalance_timeout_ms=60_000, client_assignors=(_hbreq.Assignor(
            name="incremental", minimum_version=0, maximum_version=1, reason=0, metadata_version=0,
            metadata_bytes=b""),))
        joined = await hb(0, (), **join)
        assert joined.should_compute_assignment
        await install(await prepare(joined.member_epoch), joined.member_epoch, with_a)
        resp = await hb(0, (), **join)  # still joining: the full request again
        epoch = resp.member_epoch
        assert epoch > 0 and resp.assignment is not None, resp
        assert (await hb(epoch, with_a)).error_code == 0
        # A new connector: the member computes, then parks a heartbeat while the target that
        # gives it b is installed.
        specs = (_alter.ConnectorSpec(name="b", task_count=0, config=()),)
        await shard.write(lambda core, now: core.alter_connectors(ConnectGroupAlterConnectorsRequest(
            group_id="g", upserts=specs, deletes=(), validate_only=False), now), error)
        assert (await hb(epoch)).should_compute_assignment
        prep = await prepare(epoch)
        parked = hb(epoch, wait=300)
        await until(lambda: shard.parked_count == 1, "the heartbeat to park", timeout_s=2)
        assert shard.store.log is not None
        slow = {"armed": False}
        real_heartbeat, real_sync = shard.core.heartbeat, shard.store.log.sync

        def heartbeat(req: Any, now: int, c: Any) -> Any:
            result = real_heartbeat(req, now, c)
            if req.owned_connectors is None and req.client_assignors is None and result.records:
                slow["armed"] = True  # the probe: its commit takes longer than MaxWaitMs
            return result

        def sync() -> None:
            if slow["armed"]:
                slow["armed"] = False
                time.sleep(0.5)
            real_sync()

        shard.core.heartbeat = heartbeat  # type: ignore[method-assign]
        shard.store.log.sync = sync  # type: ignore[method-assign]
        await install(prep, epoch, ("a", "a/0", "b"))
        answer = await parked
        current = shard.core.group("g").current["m"].epoch
        assert answer.member_epoch == current > epoch, (answer.member_epoch, current)
        nxt = await shard.heartbeat(ConnectGroupHeartbeatRequest(
            group_id="g", member_id="m", member_epoch=answer.member_epoch), ctx, lambda c, m: (c, m))
        assert nxt.error_code == 0, nxt
    finally:
        await shard.close()


async def test_shutdown_longer_than_the_session_keeps_heartbeating(env: Env) -> None:
    """Found by the simulator ("stop-without-session"): stop() used to end the heartbeat loop
    before stopping the instances; a shutdown whose stops outlast the session timeout let the
    coordinator expire the worker and hand its items to another one while they still ran."""
    env.alter({"slow": (1, {"stop.delay.ms": "3000"})})
    a = env.start("a", rebalance_timeout_ms=10_000)  # 5 s per stop: longer than the session
    await until(stable(env, {a: items("slow", "slow/0")}), "a runs everything")
    b = env.start("b", rebalance_timeout_ms=10_000)
    await until(lambda: len(env.describe().members) == 2, "b joined")
    a_id = a.membership.member_id
    stopping = asyncio.create_task(a.stop())
    # Two seconds in (the session timeout), a is still a member: it kept heartbeating.
    await asyncio.sleep(SESSION_MS / 1000 + 0.3)
    assert a_id in {m.member_id for m in env.describe().members}
    await asyncio.wait_for(stopping, 15)
    await until(stable(env, {b: items("slow", "slow/0")}), "b runs everything after a left")
    t = env.timeline()
    assert not t.problems, t.problems  # no item ran on a and b at once
    assert lost(a) == 0


def test_instance_states_sent_on_join_and_only_when_they_change() -> None:
    """Issue 14, Status: the states ride the heartbeat only when they changed since the last
    answered one (the steady heartbeat stays small), in full on (re)join, again after a
    failed heartbeat."""
    a, a0 = Item.parse("A"), Item.parse("A/0")
    m = Membership("g", ADS)
    m.join(0)
    m.instance_states = {}
    assert m.heartbeat_request(0).instance_states == ()
    m.on_response(_response(1, ("A", "A/0"), member_id="m"), 0)
    m.assigned_started(frozenset({a, a0}), 0)
    m.instance_states = {a: ("RUNNING", None, None), a0: ("FAILED", "RuntimeError('x')", "Traceback...")}
    sent = m.heartbeat_request(10).instance_states
    assert [(s.connector, s.task, s.state, s.error_message, s.trace) for s in sent] == [
        ("A", -1, "RUNNING", None, None), ("A", 0, "FAILED", "RuntimeError('x')", "Traceback...")]
    m.on_response(_response(1), 10)
    assert m.heartbeat_request(20).instance_states == ()  # unchanged: not sent
    m.on_response(_response(1), 20)
    m.instance_states = {a: ("RUNNING", None, None), a0: ("RESTARTING", "RuntimeError('x')", "Traceback...")}
    assert [s.state for s in m.heartbeat_request(30).instance_states] == ["RUNNING", "RESTARTING"]
    assert m.on_response(_response(1, error=E.COORDINATOR_NOT_AVAILABLE), 30) == []
    assert len(m.heartbeat_request(1000).instance_states) == 2  # not answered: sent again
    m.on_response(_response(1), 1000)
    assert m.heartbeat_request(1010).instance_states == ()
    (action,) = m.on_response(_response(1, error=E.FENCED_MEMBER_EPOCH), 1010)
    m.revoked(action.items, 1020)
    m.instance_states = {a: ("RUNNING", None, None), a0: ("RESTARTING", "RuntimeError('x')", "Traceback...")}
    rejoin = m.heartbeat_request(1030)
    assert rejoin.member_epoch == 0 and len(rejoin.instance_states) == 2  # in full on a rejoin


def test_instance_states_are_sent_again_at_each_new_member_epoch() -> None:
    """The coordinator forgets the states reported for a connector whose target state changed
    (a STOPPED one from before a resume and a stop must not let an offsets change in), so
    unchanged states are sent again once the member epoch moved."""
    a, a0 = Item.parse("A"), Item.parse("A/0")
    m = Membership("g", ADS)
    m.join(0)
    m.on_response(_response(1, ("A", "A/0"), member_id="m"), 0)
    m.assigned_started(frozenset({a, a0}), 0)
    m.instance_states = {a: ("STOPPED", None, None), a0: ("STOPPED", None, None)}
    assert len(m.heartbeat_request(10).instance_states) == 2
    m.on_response(_response(1), 10)
    assert m.heartbeat_request(20).instance_states == ()  # unchanged, same epoch: not sent
    m.on_response(_response(2, ("A", "A/0")), 20)
    assert m.member_epoch == 2
    assert [s.state for s in m.heartbeat_request(30).instance_states] == ["STOPPED", "STOPPED"]
    m.on_response(_response(2), 30)
    assert m.heartbeat_request(40).instance_states == ()


def test_failure_error_and_trace_stay_within_the_coordinators_bounds_in_utf8_bytes() -> None:
    from connect_wire.instance_states import TEXT_LIMIT_BYTES
    from worker_client.worker import failure_error, failure_trace

    try:
        raise RuntimeError("\u20ac" * 4_000 + " the end")  # 4,000 characters, 12,000 bytes
    except RuntimeError as exc:
        trace, error = failure_trace(exc), failure_error(exc)
    assert len(trace.encode()) <= TEXT_LIMIT_BYTES and trace.rstrip().endswith("the end")
    assert len(error.encode()) <= 1024 and error.startswith("RuntimeError('\u20ac")


def test_failure_trace_is_bounded_and_keeps_the_error() -> None:
    from worker_client.worker import TRACE_LIMIT, failure_trace

    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("the error at the bottom")
        deep(n - 1)

    try:
        raise RuntimeError("long " * 4000 + "end of the error")
    except RuntimeError as exc:
        trace = failure_trace(exc)
    assert len(trace) <= TRACE_LIMIT
    assert trace.startswith("...(truncated)\n")
    assert trace.rstrip().endswith("end of the error")
    try:
        deep(1)
    except RuntimeError as exc:
        short = failure_trace(exc)
    assert short.startswith("Traceback (most recent call last):") and "in deep" in short
