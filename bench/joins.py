"""Join cost: N members join one group, in the core alone and against a real daemon.

``python -m bench joins [--sizes 500,1000,2000,3000] [--connections 8] [--no-daemon]``

* **core**: the sans-IO coordinator alone: N joins into one group (each a full first
  heartbeat), seconds in all and microseconds per join.
* **daemon**: a real ``connect-coordinator serve`` (file store, fsync always, one partition);
  the N joins are pipelined over ``--connections`` connections while a *steady member* (it
  joined first and computes the group's assignments, as a worker would) heartbeats at the
  group's interval. Reported: seconds until every join was answered, per join, the steady
  member's slowest heartbeat round trip, and whether it lost its session (an error answer).

Joining used to cost O(members) per join (each join rescanned the members' assignors; every
epoch bump rebuilt the reconciled index), so N joins took O(N^2): numbers before and after are
in docs/group-coordinator.md ("Join cost").
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connect_wire import codec
from connect_wire.apis import APIS
from connect_wire.framing import encode_request_frame, parse_response_header
from connect_wire.messages import (
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb

from ._common import BenchError, sizes_arg, start_daemon

GROUP = "join-bench"
ASSIGNORS = (_hb.Assignor(name="incremental", minimum_version=1, maximum_version=1, reason=0,
                          metadata_version=1, metadata_bytes=b""),)
REBALANCE_TIMEOUT_MS = 10_000


def join_request(member_id: str, group: str = GROUP) -> ConnectGroupHeartbeatRequest:
    return ConnectGroupHeartbeatRequest(
        group_id=group, member_id=member_id, member_epoch=0,
        rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, client_assignors=ASSIGNORS,
        owned_connectors=(), owned_tasks=(), max_wait_ms=0)


def _frame(request: Any, correlation: int) -> bytes:
    api = APIS[type(request).__api_key__]
    version = type(request).__version__
    return encode_request_frame(api.key, version, correlation, "bench-joins",
                                codec.encode(request), api.request_header_version(version))


def _decode(frame: bytes, response_class: type) -> Any:
    api = APIS[response_class.__api_key__]
    _, offset = parse_response_header(frame, api.response_header_version(
        response_class.__version__))
    return codec.decode(response_class, frame, offset)[0]


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


MAX_SIZE = 100_000
"""``group.connect.max.size`` for the benchmark (the default, 1,000, would refuse most joins)."""


def measure_core(size: int) -> float:
    """Seconds for ``size`` joins into one group, in the sans-IO core alone."""
    from coordinator.group.config import GroupCoordinatorConfig
    from coordinator.group.coordinator import GroupCoordinator

    core = GroupCoordinator(GroupCoordinatorConfig(max_size=MAX_SIZE))
    started = time.perf_counter()
    for i in range(size):
        response = core.heartbeat(join_request(f"member-{i:06d}"), i).response
        if response.error_code:
            raise BenchError(f"join {i}: {response.error_message}")
    return time.perf_counter() - started


@dataclass
class SteadyMember:
    """A member that joined first and stays: heartbeats every interval, computes the group's
    assignments when told to (no connectors: every member gets nothing), and records its round
    trips and any error (a lost session)."""

    host: str
    port: int
    group: str = GROUP
    member_id: str = "steady-member"
    epoch: int = 0
    interval_s: float = 0.2
    session_ms: int | None = None
    """The group's session timeout: a worker's lease runs from the send time of its last
    answered heartbeat for that long (worker_client/failstop.py); a longer wait for the next
    answer is a lapse, after which a real worker stops its work."""
    round_trips: list[float] = field(default_factory=list)
    lapses: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    computed: int = 0
    _correlation: int = 0
    _computing: asyncio.Task[None] | None = None

    async def _call(self, reader: Any, writer: Any, request: Any, response_class: type) -> Any:
        self._correlation += 1
        writer.write(_frame(request, self._correlation))
        await writer.drain()
        return _decode(await _read_frame(reader), response_class)

    async def run(self, stop: asyncio.Event, joined: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            request: Any = join_request(self.member_id, self.group)
            lease_from: float | None = None
            while True:
                started = time.perf_counter()
                r = await self._call(reader, writer, request, ConnectGroupHeartbeatResponse)
                answered = time.perf_counter()
                self.round_trips.append(answered - started)
                if (lease_from is not None and self.session_ms is not None
                        and answered - lease_from > self.session_ms / 1000):
                    self.lapses.append(answered - lease_from)
                lease_from = started
                if r.error_code:
                    self.errors.append(f"{r.error_code}: {r.error_message}")
                    return
                self.epoch = r.member_epoch
                self.interval_s = r.heartbeat_interval_ms / 1000
                joined.set()
                if r.should_compute_assignment and (
                        self._computing is None or self._computing.done()):
                    # (on a connection of its own, beside the heartbeats, as a worker does)
                    self._computing = asyncio.create_task(self._compute())
                # (at epoch 0 a member still sends its join fields, as a worker does)
                request = join_request(self.member_id, self.group) if self.epoch == 0 else \
                    ConnectGroupHeartbeatRequest(group_id=self.group, member_id=self.member_id,
                                                 member_epoch=self.epoch, max_wait_ms=0)
                try:
                    await asyncio.wait_for(stop.wait(), self.interval_s)
                    return
                except TimeoutError:
                    pass
        finally:
            writer.close()
            if self._computing is not None:
                await self._computing

    async def _compute(self) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            await self._prepare_install(reader, writer)
        finally:
            writer.close()

    async def _prepare_install(self, reader: Any, writer: Any) -> None:
        prepared = await self._call(reader, writer, ConnectGroupPrepareAssignmentRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch),
            ConnectGroupPrepareAssignmentResponse)
        if prepared.error_code:
            return  # (another epoch meanwhile: the next heartbeat says)
        installed = await self._call(reader, writer, ConnectGroupInstallAssignmentRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch,
            group_epoch=prepared.group_epoch, error=0, assignor_state=b"",
            scheduled_rebalance_delay_ms=-1, members=()), ConnectGroupInstallAssignmentResponse)
        self.computed += installed.error_code == 0


async def flood(host: str, port: int, size: int, connections: int, group: str = GROUP,
                prefix: str = "member") -> tuple[float, int]:
    """``size`` joins pipelined over ``connections`` connections; (seconds until every one was
    answered, how many were answered with an error)."""
    errors = 0

    async def one(c: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        ids = range(c, size, connections)
        frames = [_frame(join_request(f"{prefix}-{i:06d}", group), k + 1)
                  for k, i in enumerate(ids)]

        async def send() -> None:
            for f in frames:
                writer.write(f)
                await writer.drain()

        sender = asyncio.create_task(send())
        for _ in frames:
            r = _decode(await _read_frame(reader), ConnectGroupHeartbeatResponse)
            errors += r.error_code != 0
        await sender
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(connections)))
    return time.perf_counter() - started, errors


async def _daemon_run(host: str, port: int, size: int, connections: int,
                      session_ms: int) -> dict[str, Any]:
    group = f"{GROUP}-{size}"
    steady = SteadyMember(host, port, group, session_ms=session_ms)
    stop, joined = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(steady.run(stop, joined))
    await asyncio.wait_for(joined.wait(), 30)
    seconds, errors = await flood(host, port, size, connections, group)
    await asyncio.sleep(2 * steady.interval_s)  # the steady member heartbeats after the flood
    stop.set()
    await task
    return {"seconds": seconds, "errors": errors,
            "steady_max_rtt_ms": max(steady.round_trips) * 1000,
            "steady_heartbeats": len(steady.round_trips), "steady_computed": steady.computed,
            "steady_lost": "; ".join(steady.errors) or (
                f"its lease lapsed {len(steady.lapses)} times" if steady.lapses else None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench joins", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default=[500, 1000, 2000, 3000])
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--no-daemon", action="store_true", help="the core alone")
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    args = parser.parse_args(argv)
    print("core (sans-IO): N joins into one group")
    print(f"{'members':>8} {'seconds':>9} {'us/join':>9}")
    for size in args.sizes:
        seconds = measure_core(size)
        print(f"{size:>8} {seconds:>9.3f} {seconds / size * 1e6:>9.1f}", flush=True)
    if args.no_daemon:
        return 0
    print(f"daemon: N joins pipelined over {args.connections} connections while a steady member "
          "heartbeats")
    print(f"{'members':>8} {'seconds':>9} {'us/join':>9} {'errors':>7} {'steady max rtt ms':>18} "
          f"{'computed':>9} steady member")
    for size in args.sizes:  # a fresh daemon each: no earlier flood's sessions expiring
        with tempfile.TemporaryDirectory(prefix="bench-joins-") as tmp:
            process, _ = start_daemon(Path(tmp) / "data", extra_env={
                "CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS":
                    str(args.session_timeout_ms),
                "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "500",
                "CONNECT_COORDINATOR_GROUP_CONNECT_MAX_SIZE": str(MAX_SIZE),
            }, extra_args=["--partitions", "1"])
            try:
                row = asyncio.run(_daemon_run(process.host, process.port, size,
                                              args.connections, args.session_timeout_ms))
            finally:
                process.stop()
        print(f"{size:>8} {row['seconds']:>9.3f} {row['seconds'] / size * 1e6:>9.1f} "
              f"{row['errors']:>7} {row['steady_max_rtt_ms']:>18.1f} "
              f"{row['steady_computed']:>9} {row['steady_lost'] or 'kept its session'}",
              flush=True)
    return 0
