"""A flood of joins against a real daemon does not cost a steady member its session.

Joining thousands of members used to cost O(members) per join in the core, and every join
waited in the partition's one FIFO queue: at 3,000 joins a real worker's heartbeats queued
behind them past its session, and it lost its work. Now a join costs O(1) and joins wait in
their own lane (coordinator/runtime/shard.py, "Joins take their own lane"), so the heartbeats
of the members already in a group are handled between slices of joins.

The daemon runs with a 3 s session; the flood is bounded: 10,240 joins over 64 connections
(each up to socket.max.inflight.requests in flight, so thousands queue at once), into 16
groups of the daemon's one partition, while a steady member heartbeats every 200 ms and
computes its group's assignments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.joins import SteadyMember, flood
from tests.daemon_fixture import DaemonPool

JOINS = 10_240
CONNECTIONS = 64
GROUPS = 16  # 640 joins each: within group.connect.max.size (1,000)
SESSION_MS = 3_000


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def test_a_steady_member_keeps_its_session_through_a_join_flood(pool: DaemonPool) -> None:
    d = pool.start(extra_args=["--partitions", "1"], extra_env={
        "CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": str(SESSION_MS)})

    async def run() -> tuple[SteadyMember, list[tuple[float, int]]]:
        steady = SteadyMember(d.host, d.port, group="flood-0", session_ms=SESSION_MS)
        stop, joined = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(steady.run(stop, joined))
        await asyncio.wait_for(joined.wait(), 30)
        results = await asyncio.gather(*(
            flood(d.host, d.port, JOINS // GROUPS, CONNECTIONS // GROUPS, group=f"flood-{g}")
            for g in range(GROUPS)))
        await asyncio.sleep(1.0)  # and it keeps heartbeating after the flood
        stop.set()
        await asyncio.wait_for(task, 30)
        return steady, results

    steady, results = asyncio.run(run())
    assert steady.errors == [], f"the steady member lost its session: {steady.errors}"
    # A worker's lease runs from the send time of its last answered heartbeat for a session
    # timeout (worker_client/failstop.py): an answer later than that, and it stops its work.
    assert steady.lapses == [], f"the steady member's lease lapsed: {steady.lapses}"
    assert all(errors == 0 for _, errors in results), results
    assert steady.computed >= 1
    assert len(steady.round_trips) >= 3
