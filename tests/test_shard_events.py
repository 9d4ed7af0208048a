"""The shard logs the core's group events once committed, never a rolled-back one, and counts
fences, session expiries and epoch bumps from them; the event queue and processing times and
the held items are measured. A real Shard on a real partition log in a temp dir."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pytest

from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import RequestContext
from coordinator.metrics import Metrics
from coordinator.runtime import shard as shard_module
from coordinator.runtime.log import FsyncPolicy
from coordinator.runtime.shard import Shard
from coordinator.store.file import FileStore
from tests.test_limits import alter_request, join_request

CTX = RequestContext(client_id="test", client_host="127.0.0.1")


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    def names(self) -> list[str]:
        return [e for e, _ in self.lines]

    def of(self, name: str) -> list[dict[str, Any]]:
        return [f for e, f in self.lines if e == name]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    r = Recorder()
    monkeypatch.setattr(shard_module, "events_log", r)
    return r


async def _shard(tmp_path: Path, metrics: Metrics, session_ms: int = 60_000) -> Shard:
    config = GroupCoordinatorConfig(session_timeout_ms=session_ms, heartbeat_interval_ms=100)
    store = FileStore(tmp_path, 3, fsync=FsyncPolicy(), segment_bytes=1 << 20,
                      compaction_interval_ms=3_600_000, tombstone_retention_ms=0)
    shard = Shard(3, store, config, metrics)
    await shard.load()
    return shard


def _error(code: int, message: str) -> Any:
    return ("error", code, message)


def _code(resp: Any) -> int:
    return resp[1] if isinstance(resp, tuple) else resp.error_code


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_committed_events_are_logged_with_the_partition_and_counted(
        tmp_path: Path, recorder: Recorder) -> None:
    metrics = Metrics()
    shard = await _shard(tmp_path, metrics)
    try:
        resp = await shard.write(lambda core, now: core.alter_connectors(
            alter_request("g", {"A": (1, {})}), now), _error)
        assert _code(resp) == 0
        resp = await shard.heartbeat(join_request("g", "m1"), CTX, _error)
        assert _code(resp) == 0
        assert recorder.names() == ["member joined", "group epoch bumped", "assigner chosen"]
        joined = recorder.of("member joined")[0]
        assert (joined["group"], joined["partition"], joined["member_id"], joined["member_epoch"]) == (
            "g", 3, "m1", 0)
        assert _sample(metrics, "connect_coordinator_rebalance_total") == 1
        # A stale epoch: fenced (committed with the error answer), counted by reason.
        stale = ConnectGroupHeartbeatRequest(group_id="g", member_id="m1", member_epoch=7)
        assert _code(await shard.heartbeat(stale, CTX, _error)) == ErrorCode.FENCED_MEMBER_EPOCH
        fenced = recorder.of("member fenced")[0]
        assert fenced["reason"] == "stale_member_epoch" and fenced["partition"] == 3
        assert _sample(metrics, "connect_coordinator_member_fences_total",
                       reason="stale_member_epoch") == 1
        assert _sample(metrics, "connect_coordinator_member_fences_total",
                       reason="session_expired") == 0
        assert _sample(metrics, "connect_coordinator_rebalance_total") == 2
        # Every event went through the queue: its waiting and its processing are measured.
        queued = _sample(metrics, "connect_coordinator_event_queue_time_seconds_count")
        processed = _sample(metrics, "connect_coordinator_event_processing_time_seconds_count")
        assert queued >= 4 and processed == queued
    finally:
        await shard.close()


async def test_a_rolled_back_write_logs_nothing(tmp_path: Path, recorder: Recorder,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = Metrics()
    shard = await _shard(tmp_path, metrics)
    try:
        assert shard.store.log is not None

        def broken_sync() -> None:
            raise OSError(errno.EIO, "injected fsync failure")

        with monkeypatch.context() as patch:
            patch.setattr(shard.store.log, "sync", broken_sync)
            resp = await shard.heartbeat(join_request("g", "m1"), CTX, _error)
        assert _code(resp) == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert recorder.lines == []
        assert _sample(metrics, "connect_coordinator_rebalance_total") == 0

        def broken_append(records: Any, now: int) -> None:
            raise OSError(errno.ENOSPC, "injected write failure")

        with monkeypatch.context() as patch:
            patch.setattr(shard, "_append", broken_append)
            resp = await shard.heartbeat(join_request("g", "m1"), CTX, _error)
        assert _code(resp) == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert recorder.lines == []
        if shard.state != "active":  # the log may have asked for a reload
            return
        resp = await shard.heartbeat(join_request("g", "m1"), CTX, _error)
        assert _code(resp) == 0 and recorder.names()[0] == "member joined"
    finally:
        await shard.close()


async def test_session_expiry_and_held_items(tmp_path: Path, recorder: Recorder) -> None:
    metrics = Metrics()
    shard = await _shard(tmp_path, metrics, session_ms=1_000)
    try:
        assert _code(await shard.write(lambda core, now: core.alter_connectors(
            alter_request("g", {"A": (2, {})}), now), _error)) == 0
        resp = await shard.heartbeat(join_request("g", "m1"), CTX, _error)
        assert resp.should_compute_assignment
        prep = await shard.write(lambda core, now: core.prepare_assignment(
            ConnectGroupPrepareAssignmentRequest(group_id="g", member_id="m1", member_epoch=0),
            now), _error)
        assert prep.error_code == 0
        install = ConnectGroupInstallAssignmentRequest(
            group_id="g", member_id="m1", member_epoch=0, group_epoch=prep.group_epoch, error=0,
            assignor_state=b"", scheduled_rebalance_delay_ms=-1, members=(_inst.MemberAssignment(
                member_id="m1", connectors=("A",), tasks=(_inst.TaskId(connector="A", task=0),
                                                          _inst.TaskId(connector="A", task=1)),
                metadata_version=0, metadata_bytes=b""),))
        assert (await shard.write(lambda core, now: core.install_assignment(install, now),
                                  _error)).error_code == 0
        resp = await shard.heartbeat(ConnectGroupHeartbeatRequest(
            group_id="g", member_id="m1", member_epoch=0, rebalance_timeout_ms=30_000,
            client_assignors=join_request("g").client_assignors, owned_connectors=(),
            owned_tasks=()), CTX, _error)
        assert resp.member_epoch == 1 and len(resp.assignment.tasks) == 2
        assert shard.held_item_count() == 0
        # m1 goes silent: its session (1 s) expires, its 3 items are held for it.
        for _ in range(100):
            await asyncio.sleep(0.05)
            if recorder.of("hold started"):
                break
        await shard.read(lambda core: None)
        fenced = recorder.of("member fenced")[0]
        assert fenced["reason"] == "session_expired" and fenced["static_leave"] is False
        assert recorder.of("hold started")[0]["items"] == 3
        assert shard.held_item_count() == 3
        assert _sample(metrics, "connect_coordinator_held_items", partition="3") == 3
        assert _sample(metrics, "connect_coordinator_session_expiries_total",
                       reason="no_heartbeat") == 1
        assert _sample(metrics, "connect_coordinator_member_fences_total",
                       reason="session_expired") == 1
    finally:
        await shard.close()
