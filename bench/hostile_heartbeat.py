"""How long the worst heartbeats hold the event loop: decode plus the state machine.

``python -m bench hostile_heartbeat [--scale 1.0] [--repeat 5]``

Each case is one ConnectGroupHeartbeat of a new member (MemberEpoch 0) into a group with one
connector of 8 tasks (9 items), of at most ``socket.max.frame.bytes`` (1 MiB) on the wire:
``tasks`` names ~110,000 OwnedTasks, ``states`` carries ~55,000 InstanceStates, ``meta`` one
assignor with ~900 KB of metadata. ``full`` is the largest heartbeat a worker may send: a
member of a group of 100,000 items reporting all of them owned (a rejoin after a fence). The
request is encoded once; each repetition decodes it (``codec.decode``, what the server does on
the event loop) and runs ``GroupCoordinator.heartbeat`` on a fresh coordinator, garbage
collector off; the table shows the median in ms of each, and the error the heartbeat got.
``--scale`` multiplies the entry counts (the smoke test uses a tiny one). Nothing is written.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

from connect_wire import codec
from connect_wire.errors import error_name
from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupHeartbeatRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator

GROUP = "g1"


def _join(**fields: Any) -> ConnectGroupHeartbeatRequest:
    meta = fields.pop("metadata", b"")
    return ConnectGroupHeartbeatRequest(
        group_id=GROUP, member_id="attacker", member_epoch=0, instance_id=None,
        rebalance_timeout_ms=60_000, worker_url=None,
        client_assignors=(_hb.Assignor(name="incremental", minimum_version=1, maximum_version=1,
                                       reason=0, metadata_version=1, metadata_bytes=meta),),
        owned_connectors=fields.pop("owned_connectors", ()),
        owned_tasks=fields.pop("owned_tasks", ()), max_wait_ms=0, **fields)


def cases(scale: float) -> list[tuple[str, int, ConnectGroupHeartbeatRequest]]:
    """(name, group tasks, request)."""
    n = max(1, int(110_000 * scale))
    s = max(1, int(55_000 * scale))
    full = max(1, int(100_000 * scale))
    return [
        ("tasks", 8, _join(owned_tasks=tuple(_hb.TaskId(connector="c", task=i) for i in range(n)))),
        ("states", 8, _join(instance_states=tuple(
            _hb.InstanceState(connector="c", task=i, state="RUNNING", error_message=None,
                              trace=None) for i in range(s)))),
        ("meta", 8, _join(metadata=b"m" * max(1, int(900_000 * scale)))),
        ("full", full - 1, _join(owned_connectors=("c",), owned_tasks=tuple(
            _hb.TaskId(connector="c", task=i) for i in range(full - 1)))),
    ]


def coordinator(tasks: int) -> GroupCoordinator:
    core = GroupCoordinator(GroupCoordinatorConfig(max_tasks=max(tasks + 1, 1)))
    r = core.alter_connectors(ConnectGroupAlterConnectorsRequest(
        group_id=GROUP, upserts=(_alter.ConnectorSpec(name="c", task_count=tasks, config=()),),
        deletes=(), validate_only=False), 0)
    assert r.response.error_code == 0, r.response
    return core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench hostile_heartbeat",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="entry counts x this (default 1)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median; default 5)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or not 0 < args.scale <= 1:
        parser.error("--repeat must be >= 1 and --scale within (0, 1]")
    print(f"{'case':8} {'bytes':>9} {'decode ms':>10} {'handler ms':>11}  answer")
    for name, tasks, req in cases(args.scale):
        data = codec.encode(req)
        decode_ms, handler_ms = [], []
        answer = ""
        for _ in range(args.repeat):
            core = coordinator(tasks)
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                decoded, _ = codec.decode(ConnectGroupHeartbeatRequest, data)
                t1 = time.perf_counter()
                result = core.heartbeat(decoded, 1_000)
                t2 = time.perf_counter()
            finally:
                gc.enable()
            decode_ms.append((t1 - t0) * 1e3)
            handler_ms.append((t2 - t1) * 1e3)
            answer = error_name(result.response.error_code) if result.response.error_code else "NONE"
        print(f"{name:8} {len(data):>9,} {statistics.median(decode_ms):>10.1f} "
              f"{statistics.median(handler_ms):>11.1f}  {answer}", flush=True)
    return 0
