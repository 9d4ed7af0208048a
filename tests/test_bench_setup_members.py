"""The benches' member set-up (``bench.throughput.setup_members``) at the benches' default scale
against the real daemon: it returns only once the coordinator agrees every member is at the
group's epoch, so steady heartbeats replaying the returned epochs are all answered without an
error. (With fast joins, hundreds of members used to look Stable at an older assignment's epoch
owning nothing; the load generator's heartbeats were then fenced.)"""

import asyncio
from pathlib import Path

from bench._common import start_daemon
from bench.throughput import DAEMON_ENV, GROUP, load, setup_members
from connect_wire.messages import ConnectGroupDescribeRequest
from worker_client.client import KrpcConnection

MEMBERS = 1_000
ROUNDS = 3


async def _describe(host: str, port: int):  # type: ignore[no-untyped-def]
    conn = KrpcConnection(host, port, "test-describe")
    await conn.open(30)
    try:
        return (await conn.request(ConnectGroupDescribeRequest(group_ids=[GROUP]), 30)).groups[0]
    finally:
        conn.close()


def test_setup_members_returns_the_groups_epoch(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):  # the early-return race did not show on every set-up
        daemon, _ = start_daemon(tmp_path / f"data-{round_}", extra_env=DAEMON_ENV)
        try:
            members = asyncio.run(setup_members(daemon.host, daemon.port, MEMBERS))
            group = asyncio.run(_describe(daemon.host, daemon.port))
            assert group.group_epoch == group.assignment_epoch
            assert {epoch for _, epoch in members} == {group.group_epoch}
            assert sorted((m.member_id, m.member_epoch) for m in group.members) == sorted(members)
            result = load({"host": daemon.host, "port": daemon.port, "group": GROUP,
                           "members": members, "connections": 100, "depth": 128,
                           "warmup_s": 0.2, "duration_s": 0.5, "check": True}, tmp_path)
            assert result["checked"] > 0
            assert result["errors"] == 0, result["error_codes"]
        finally:
            daemon.stop()
