"""Simulated workers for the wire benchmarks: each member is a coroutine driving the real
``worker_client.membership.Membership`` state machine over ``KrpcConnection``s, with no task
work (a revoke is acknowledged at once, an assignment "started" at once). A member chosen to
compute runs PrepareAssignment, the real assignor, then InstallAssignment on the group's shared
control connection. Private: used by ``throughput`` (setup) and ``convergence``.

For timing, every member records when its visible state (state, epoch, owned items) last
changed (``SimMember.changed_at``, ``time.perf_counter``) and when it last sent a heartbeat
(``sent_at``); the group counts the heartbeats sent (``heartbeats``) and the assignor's
computations (``assign_seconds``). ``SimGroup.set_long_poll`` switches every member between
long-polled and plain heartbeats in place."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from connect_wire.assignors import EagerAssignor, IncrementalCooperativeAssignor
from connect_wire.assignors.api import group_from_prepare, install_request
from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alt
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


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def close_connection(conn: KrpcConnection) -> None:
    """Close ``conn``. A cancelled member leaves its (shielded) request future behind, e.g. a
    parked long poll: closing fails it, and nobody will look: mark it retrieved."""
    for *_, future in list(conn._pending):
        future.add_done_callback(_retrieved)
    conn.close()


class SimGroup:
    """Members of one group; ``changed`` is set whenever any member's state may have moved."""

    def __init__(self, host: str, port: int, group: str, assignor: str = "incremental",
                 long_poll: bool = False, shared_connections: int = 0,
                 rebalance_timeout_ms: int = 60_000) -> None:
        self.host, self.port, self.group = host, port, group
        self.rebalance_timeout_ms = rebalance_timeout_ms
        """The members' rebalance timeout: half of it is a fenced member's hold past its session."""
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
        self.heartbeats = 0
        """Heartbeat requests sent by all members so far."""
        self.computed_at = 0.0
        """``perf_counter`` when the last computation (Prepare, assign, Install) finished."""

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
        member = await self.new_member()
        self.start(member)
        return member

    async def new_member(self) -> SimMember:
        """A member with its connection open, not yet joining (``start`` it)."""
        index = len(self.members)
        member = SimMember(self, index, await self.connection(index))
        self.members.append(member)
        return member

    def start(self, member: SimMember) -> None:
        member.task = asyncio.create_task(member.run())

    def set_long_poll(self, long_poll: bool) -> None:
        """Switch every member between long-polled and plain heartbeats. A member going to long
        polls heartbeats at once; one going to plain finishes its parked heartbeat first."""
        self.long_poll = long_poll
        now = now_ms()
        for member in self.live():
            member.m.long_poll = long_poll
            if long_poll:
                member.m.next_heartbeat_ms = min(member.m.next_heartbeat_ms, now)
                member.wake()

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
        stable = State.STABLE
        for member in live:  # cheap checks first: this runs after every state change
            if member.m.state != stable or member.m.member_epoch != epoch or member.computing:
                return False
        owned: set[Any] = set()
        total = 0
        for member in live:
            owned |= member.m.owned
            total += len(member.m.owned)
        return total == len(owned) == item_count

    def settled_at(self) -> float:
        """``perf_counter`` of the last change of any live member's state, or of the end of
        the last computation: once ``converged`` holds, the moment the group got there."""
        return max([self.computed_at, *(m.changed_at for m in self.live())])

    def describe(self) -> str:
        """Who is not Stable at the group's epoch (for error messages)."""
        live = self.live()
        epoch = self.epoch()
        behind = [m for m in live if m.m.state != State.STABLE or m.m.member_epoch != epoch
                  or m.computing]
        sample = ", ".join(f"#{m.index} {m.m.state.value} epoch {m.m.member_epoch} owns "
                           f"{len(m.m.owned)}{' computing' if m.computing else ''}"
                           for m in behind[:5])
        owned = sum(len(m.m.owned) for m in live)
        return (f"{len(live)} live members, max epoch {epoch}, {owned} items owned, "
                f"{len(behind)} not Stable at that epoch ({sample})")

    def epoch(self) -> int:
        live = self.live()
        return max((m.m.member_epoch for m in live), default=0)

    async def wait(self, predicate: Callable[[], bool], timeout_s: float,
                   min_interval_s: float = 0.0) -> float:
        """Seconds until ``predicate()`` holds (checked after member state changes, at most once
        per ``min_interval_s``: checking a large group after each of its members' responses
        costs this process more than the members themselves; use ``settled_at`` for when the
        group got there)."""
        started = time.perf_counter()
        deadline = started + timeout_s
        while not predicate():
            self.changed.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.05))
            if min_interval_s > 0:
                await asyncio.sleep(min_interval_s)
        return time.perf_counter() - started

    async def settled(self) -> bool:
        """Whether the coordinator agrees the group is done: Stable, its assignment computed for
        its current epoch, every member at that epoch as the simulated members see it. The
        members alone cannot tell: those that joined after an assignment was computed are Stable
        at its epoch owning nothing until the next one is installed (joins are fast enough for
        hundreds to land while one is computed), and a load generator that replays their epochs
        after the group moved on is fenced (FENCED_MEMBER_EPOCH, then UNKNOWN_MEMBER_ID)."""
        assert self.control is not None
        resp = await self.control.request(ConnectGroupDescribeRequest(group_ids=[self.group]),
                                          TIMEOUT_S)
        g = resp.groups[0]
        live = self.live()
        return (g.error_code == 0 and g.group_state == "Stable"
                and g.group_epoch == g.assignment_epoch and len(g.members) == len(live)
                and {m.m.member_epoch for m in live} == {g.group_epoch}
                and all(m.member_epoch == g.group_epoch for m in g.members))

    async def wait_settled(self, item_count: int, count: int, timeout_s: float) -> None:
        """Until ``count`` live members have ``converged`` and the group is ``settled``, or a
        member failed (the caller looks at ``error``); TimeoutError after ``timeout_s``."""
        deadline = time.perf_counter() + timeout_s
        while True:
            await self.wait(lambda: self.converged(1, item_count) and len(self.live()) == count
                            or any(m.error for m in self.members), deadline - time.perf_counter())
            if any(m.error for m in self.members) or await self.settled():
                return
            if time.perf_counter() > deadline:
                raise TimeoutError
            await asyncio.sleep(0.05)  # the members move on with their next heartbeats

    async def close(self) -> None:
        for member in self.members:
            member.stop()
        for member in self.members:
            if member.task is not None:
                with contextlib.suppress(BaseException):
                    await member.task
        for c in [*self._pool, *(m.conn for m in self.members), self.control]:
            if c is not None:
                close_connection(c)


class SimMember:
    def __init__(self, group: SimGroup, index: int, conn: KrpcConnection) -> None:
        self.group = group
        self.index = index
        self.conn = conn
        self.assignor = make_assignor(group.assignor_name)
        self.m = Membership(
            group_id=group.group, rebalance_timeout_ms=group.rebalance_timeout_ms, long_poll=group.long_poll,
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
        self.changed_at = time.perf_counter()
        """When this member's (state, epoch, owned items) last changed."""
        self.sent_at = 0.0
        """When this member last sent a heartbeat (``perf_counter``)."""

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self.crashed = True
        if self.task is not None:
            self.task.cancel()

    def crash(self, close: bool = False) -> None:
        """Stop heartbeating at once (the coordinator notices at the session timeout).
        ``close``: also close the member's own connection, as the death of its process would
        (not for a shared connection)."""
        self.stop()
        if close and not self.group.shared:
            close_connection(self.conn)
        self.group.changed.set()

    def _note_change(self, before: tuple[Any, ...]) -> None:
        m = self.m
        if before != (m.state, m.member_epoch, m.owned):
            self.changed_at = time.perf_counter()

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
                self.group.heartbeats += 1
                self.sent_at = time.perf_counter()
                try:
                    resp = await self.conn.request(req, TIMEOUT_S + req.max_wait_ms / 1000)
                except ConnectionFailed:
                    before = (m.state, m.member_epoch, m.owned)
                    m.on_failure(now_ms(), 200)
                    self._note_change(before)
                    self.conn = await self.group.connection(self.index)
                    continue
                before = (m.state, m.member_epoch, m.owned)
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
                self._note_change(before)
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
            self.group.computed_at = time.perf_counter()
            self._wake.set()
            self.group.changed.set()
