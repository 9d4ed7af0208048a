"""Simulated workers for the wire benchmarks: each member is a coroutine driving the real
``worker_client.membership.Membership`` state machine over ``KrpcConnection``s, with no task
work (a revoke is acknowledged at once, an assignment "started" at once). A member chosen to
compute runs PrepareAssignment, the real assignor, then InstallAssignment on the group's shared
control connection. Private: used by ``throughput`` (setup) and ``convergence``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alt
from worker_client.assignors import EagerAssignor, IncrementalCooperativeAssignor
from worker_client.assignors.api import group_from_prepare, install_request
from worker_client.client import ConnectionFailed, KrpcConnection
from worker_client.membership import (
    Assign,
    AssignorAd,
    Compute,
    Fatal,
    Lost,
    Membership,
    Revoke,
    State,
)

TIMEOUT_S = 60.0


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def make_assignor(name: str) -> Any:
    if name == "eager":
        return EagerAssignor()
    if name == "incremental":
        return IncrementalCooperativeAssignor(max_delay_ms=0)
    raise ValueError(f"unknown assignor {name!r}")


async def alter_connectors(conn: KrpcConnection, group: str, specs: list[tuple[str, int]]) -> None:
    resp = await conn.request(ConnectGroupAlterConnectorsRequest(
        group_id=group, validate_only=False,
        upserts=tuple(_alt.ConnectorSpec(name=n, task_count=t, config=(
            _alt.ConfigEntry(name="connector.class", value="org.example.BenchConnector"),))
            for n, t in specs)), TIMEOUT_S)
    if resp.error_code:
        raise RuntimeError(f"AlterConnectors: error {resp.error_code} ({resp.error_message})")


class SimGroup:
    """Members of one group; ``changed`` is set whenever any member's state may have moved."""

    def __init__(self, host: str, port: int, group: str, assignor: str = "incremental",
                 long_poll: bool = False, shared_connections: int = 0) -> None:
        self.host, self.port, self.group = host, port, group
        self.assignor_name = assignor
        self.long_poll = long_poll
        # 0: every member its own heartbeat connection (needed for long polls: a parked
        # heartbeat holds back whatever follows it on its connection); N: N shared ones.
        self.shared = shared_connections
        self._pool: list[KrpcConnection] = []
        self.control: KrpcConnection | None = None
        self.members: list[SimMember] = []
        self.changed = asyncio.Event()
        self.assign_seconds: list[float] = []

    async def connection(self, index: int) -> KrpcConnection:
        if self.shared:
            while len(self._pool) < self.shared:
                c = KrpcConnection(self.host, self.port, f"bench-{len(self._pool)}")
                await c.open(TIMEOUT_S)
                self._pool.append(c)
            return self._pool[index % self.shared]
        c = KrpcConnection(self.host, self.port, f"bench-member-{index}")
        await c.open(TIMEOUT_S)
        return c

    async def open(self) -> None:
        self.control = KrpcConnection(self.host, self.port, "bench-control")
        await self.control.open(TIMEOUT_S)

    async def add_member(self) -> SimMember:
        index = len(self.members)
        member = SimMember(self, index, await self.connection(index))
        self.members.append(member)
        member.task = asyncio.create_task(member.run())
        return member

    def live(self) -> list[SimMember]:
        return [m for m in self.members if not m.crashed]

    def converged(self, min_epoch: int, item_count: int) -> bool:
        """Every live member Stable at one epoch >= ``min_epoch``; the items owned exactly once."""
        live = self.live()
        if not live:
            return False
        epoch = live[0].m.member_epoch
        if epoch < min_epoch:
            return False
        owned: set[Any] = set()
        total = 0
        for member in live:
            if member.m.state != State.STABLE or member.m.member_epoch != epoch or member.computing:
                return False
            owned |= member.m.owned
            total += len(member.m.owned)
        return total == len(owned) == item_count

    def epoch(self) -> int:
        live = self.live()
        return max((m.m.member_epoch for m in live), default=0)

    async def wait(self, predicate: Callable[[], bool], timeout_s: float) -> float:
        """Seconds until ``predicate()`` holds (checked after every member state change)."""
        started = time.perf_counter()
        deadline = started + timeout_s
        while not predicate():
            self.changed.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.05))
        return time.perf_counter() - started

    async def close(self) -> None:
        for member in self.members:
            member.stop()
        for member in self.members:
            if member.task is not None:
                with contextlib.suppress(BaseException):
                    await member.task
        for c in [*self._pool, *(m.conn for m in self.members), self.control]:
            if c is not None:
                c.close()


class SimMember:
    def __init__(self, group: SimGroup, index: int, conn: KrpcConnection) -> None:
        self.group = group
        self.index = index
        self.conn = conn
        self.assignor = make_assignor(group.assignor_name)
        self.m = Membership(
            group_id=group.group, rebalance_timeout_ms=60_000, long_poll=group.long_poll,
            assignors=[AssignorAd(self.assignor.name, self.assignor.minimum_version,
                                  self.assignor.maximum_version,
                                  metadata_version=self.assignor.metadata().version)],
            worker_url=f"http://sim-{index}:8083", session_timeout_ms=300_000,
        )
        self.task: asyncio.Task[None] | None = None
        self.crashed = False
        self.computing = False
        self._wake = asyncio.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self.crashed = True
        if self.task is not None:
            self.task.cancel()

    def crash(self) -> None:
        """Stop heartbeating at once (the coordinator notices at the session timeout)."""
        self.stop()
        self.group.changed.set()

    async def run(self) -> None:
        m = self.m
        m.join(now_ms())
        try:
            while not self.crashed:
                now = now_ms()
                if not m.heartbeat_due(now):
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(),
                                               max(0.001, (m.next_due_ms() - now) / 1000))
                    continue
                req = m.heartbeat_request(now)
                try:
                    resp = await self.conn.request(req, TIMEOUT_S + req.max_wait_ms / 1000)
                except ConnectionFailed:
                    m.on_failure(now_ms(), 200)
                    self.conn = await self.group.connection(self.index)
                    continue
                for action in m.on_response(resp, now_ms()):
                    if isinstance(action, Revoke | Lost):
                        m.revoked(action.items, now_ms())
                    elif isinstance(action, Assign):
                        m.assigned_started(action.items, now_ms())
                    elif isinstance(action, Compute):
                        if not self.computing:
                            self.computing = True
                            asyncio.create_task(self.compute())
                    elif isinstance(action, Fatal):
                        raise RuntimeError(f"member {self.index}: {action.message}")
                self.group.changed.set()
        except asyncio.CancelledError:
            pass
        except BaseException as exc:
            self.error = exc
            self.group.changed.set()
            raise

    async def compute(self) -> None:
        m, control = self.m, self.group.control
        assert control is not None
        try:
            prep = await control.request(ConnectGroupPrepareAssignmentRequest(
                group_id=self.group.group, member_id=m.member_id, member_epoch=m.member_epoch),
                TIMEOUT_S)
            if prep.error_code:
                return
            started = time.perf_counter()
            result = self.assignor.assign(group_from_prepare(prep))
            self.group.assign_seconds.append(time.perf_counter() - started)
            for _ in range(3):
                resp = await control.request(install_request(
                    self.group.group, m.member_id, m.member_epoch, prep.group_epoch, result),
                    TIMEOUT_S)
                if resp.error_code in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.STALE_MEMBER_EPOCH):
                    await asyncio.sleep(0.01)
                    continue
                break
            m.next_heartbeat_ms = now_ms()
        finally:
            self.computing = False
            self._wake.set()
            self.group.changed.set()
