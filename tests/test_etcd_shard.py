"""A shard on the etcd store against a real etcd: what the shard does with each commit outcome.

* etcd frozen (SIGSTOP) during a commit: the outcome is unknown. The request gets
  COORDINATOR_NOT_AVAILABLE (never a guess), the partition is reloaded from etcd once etcd is
  back, and the state it serves is exactly what etcd holds.
* another node takes the partition over (its owner key deleted and re-created by another
  lease): the next write is fenced (nothing written), answered NOT_COORDINATOR, the shard is
  UNOWNED and the node is told.
* the node's lease no longer certainly valid: nothing is answered from the state, the
  steady-heartbeat fast path included.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from etcd3aio import Etcd3Client

from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterConnectorsResponse,
    ConnectGroupDescribeRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.state import CoordinatorState
from coordinator.metrics import Metrics
from coordinator.runtime import serde
from coordinator.runtime.etcd_store import EtcdPartitionStore, NodeLease, connect
from coordinator.runtime.shard import ACTIVE, UNOWNED, Shard, ShardUnavailable
from coordinator.store.etcd import EtcdStore
from tests.etcd_fixture import EtcdServer, start_etcd

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdServer]:
    server = start_etcd(tmp_path / "etcd")  # our own: the test freezes it
    try:
        yield server
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def alter(name: str, tasks: int = 1) -> ConnectGroupAlterConnectorsRequest:
    return ConnectGroupAlterConnectorsRequest(
        group_id="g", upserts=(_alter.ConnectorSpec(name=name, task_count=tasks, config=()),),
        deletes=(), validate_only=False)


def error(code: int, message: str) -> Any:
    return ConnectGroupAlterConnectorsResponse(error_code=code, error_message=message, group_epoch=-1)


async def write(shard: Shard, name: str) -> Any:
    return await shard.write(lambda core, now: core.alter_connectors(alter(name), now), error)


async def connectors(shard: Shard) -> list[str]:
    resp = await shard.read(lambda core: core.describe(ConnectGroupDescribeRequest(group_ids=("g",))))
    return sorted(c.name for c in resp.groups[0].connectors)


def replayed(records: list[tuple[bytes, bytes]]) -> list[str]:
    state = CoordinatorState()
    for key, value in records:
        state.replay(serde.decode_record(key, value))
    g = state.groups.get("g")
    return sorted(g.connectors) if g is not None else []


async def make_shard(client: Etcd3Client, lease: NodeLease, remaining: list[float],
                     lost: list[str]) -> Shard:
    store = await EtcdPartitionStore.acquire(client, "/shard-test", 0, "1", lease,
                                             commit_timeout_s=0.5)
    shard = Shard(0, EtcdStore(store), GroupCoordinatorConfig(), Metrics(),
                  serving=lambda: remaining[0] > 0.5, on_lost=lambda s, why: lost.append(why))
    await shard.load()
    assert shard.state == ACTIVE
    return shard


async def until(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_unknown_outcome_is_answered_retriable_and_the_partition_reloaded(
        etcd: EtcdServer) -> None:
    client = await connect([etcd.endpoint])
    lease = await NodeLease.grant(client, 60)
    remaining, lost = [100.0], []
    shard = await make_shard(client, lease, remaining, lost)
    try:
        assert (await write(shard, "a")).error_code == 0
        os.kill(etcd.proc.pid, signal.SIGSTOP)
        try:
            resp = await write(shard, "b")  # the commit times out: outcome unknown
            assert resp.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE, resp
            assert "unknown" in resp.error_message
            # Meanwhile: loading (retriable), never an answer from a guessed state.
            with pytest.raises(ShardUnavailable) as refused:
                await write(shard, "c")
            assert refused.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        finally:
            os.kill(etcd.proc.pid, signal.SIGCONT)
        await until(lambda: shard.state == ACTIVE, "the reload")
        in_etcd = replayed(await shard.store.etcd.load())
        assert await connectors(shard) == in_etcd
        assert "a" in in_etcd
        assert (await write(shard, "d")).error_code == 0
        assert await connectors(shard) == sorted({*in_etcd, "d"})
        assert not lost
    finally:
        await shard.close()
        await lease.close()
        await client.close()


async def test_a_deposed_owner_writes_nothing_and_gives_the_partition_up(
        etcd: EtcdServer) -> None:
    client = await connect([etcd.endpoint])
    lease = await NodeLease.grant(client, 60)
    other = await NodeLease.grant(client, 60)
    remaining, lost = [100.0], []
    shard = await make_shard(client, lease, remaining, lost)
    try:
        assert (await write(shard, "a")).error_code == 0
        # Another node takes the partition over (as after our lease expired).
        owner = shard.store.etcd.owner_key
        await client.kv.delete(owner)
        successor = await EtcdPartitionStore.acquire(client, "/shard-test", 0, "2", other)
        resp = await write(shard, "b")
        assert resp.error_code == ErrorCode.NOT_COORDINATOR, resp
        assert shard.state == UNOWNED and lost and "deposed" in lost[0]
        assert replayed(await successor.load()) == ["a"]  # b was never written
        with pytest.raises(ShardUnavailable) as refused:
            await write(shard, "c")
        assert refused.value.code == ErrorCode.NOT_COORDINATOR
        assert (await client.kv.get(owner)).kvs[0].lease == other.id  # not released by us
    finally:
        await shard.close()
        await lease.close()
        await other.close()
        await client.close()


async def test_without_a_certainly_valid_lease_nothing_is_answered(etcd: EtcdServer) -> None:
    client = await connect([etcd.endpoint])
    lease = await NodeLease.grant(client, 60)
    remaining, lost = [100.0], []
    shard = await make_shard(client, lease, remaining, lost)
    try:
        assert (await write(shard, "a")).error_code == 0
        remaining[0] = 0.4  # below the 0.5 s margin
        with pytest.raises(ShardUnavailable) as refused:
            await connectors(shard)
        assert refused.value.code == ErrorCode.NOT_COORDINATOR
        from connect_wire.messages import ConnectGroupHeartbeatRequest
        from coordinator.group.coordinator import RequestContext
        hb = ConnectGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3)
        assert shard.try_steady_heartbeat(hb, RequestContext()) is None
        remaining[0] = 100.0  # renewed: serving again
        assert await connectors(shard) == ["a"]
    finally:
        await shard.close()
        await lease.close()
        await client.close()


async def test_a_read_queued_before_the_lease_went_in_doubt_is_not_answered(
        etcd: EtcdServer) -> None:
    """A describe accepted while the lease was certainly valid but run once it is in doubt (it
    waited behind a commit: an etcd election makes that commit slow) gets NOT_COORDINATOR, as
    the writes queued with it do: nothing is answered from the state while the lease may be
    gone (another node may own the partition and have changed the group by then)."""
    client = await connect([etcd.endpoint])
    lease = await NodeLease.grant(client, 60)
    remaining, lost = [100.0], []
    shard = await make_shard(client, lease, remaining, lost)
    try:
        assert (await write(shard, "a")).error_code == 0
        queued_write = asyncio.ensure_future(write(shard, "b"))
        queued_read = asyncio.ensure_future(connectors(shard))
        await asyncio.sleep(0)  # both accepted (the lease certainly valid)...
        remaining[0] = 0.0  # ...then the lease goes in doubt before the consumer runs them
        assert (await queued_write).error_code == ErrorCode.NOT_COORDINATOR
        with pytest.raises(ShardUnavailable) as refused:
            await queued_read
        assert refused.value.code == ErrorCode.NOT_COORDINATOR
        remaining[0] = 100.0  # renewed: the same state serves again (b was committed)
        assert await connectors(shard) == ["a", "b"]
        assert not lost
    finally:
        await shard.close()
        await lease.close()
        await client.close()
