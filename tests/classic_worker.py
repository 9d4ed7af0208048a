"""A classic Kafka Connect worker built on a client nobody here wrote: kafka-python 3.x's
``kafka.coordinator.base.BaseCoordinator`` (JoinGroup/SyncGroup/Heartbeat/LeaveGroup), with
its own codec of Connect's embedded protocol (written from Kafka's ``ConnectProtocol`` and
``IncrementalCooperativeConnectProtocol`` schemas, independently of the product's
``connect_wire.classic_connect``).

It behaves as Kafka Connect's ``WorkerCoordinator`` + ``DistributedHerder`` do with their
assignment, and runs no real work: each item it runs is a start line and a stop line in the
recording plugin's format (``worker_client.examples.recording``), so the same analyzer proves
nothing ran on two workers at once, whichever protocol each worker spoke.

* ``--mode sessioned`` offers ``sessioned``, ``compatible``, ``default`` (Connect's default
  ``connect.protocol``): incremental; it keeps what it runs, stops ``Revoked``, starts
  ``Assignment`` and rejoins after a revocation.
* ``--mode default`` offers ``default`` only (``connect.protocol=eager``): it stops everything
  before every rejoin and runs exactly the assignment it gets.
* Lost membership (a reset generation: fenced, unknown member) stops everything first, as
  Connect does with a lost assignment.

Run: ``python -m tests.classic_worker --bootstrap H:P --group G --name w1 --mode sessioned
--record FILE``. SIGTERM: stop everything, LeaveGroup, exit 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import struct
import sys
import threading
import time
from typing import Any

from kafka.coordinator.base import BaseCoordinator
from kafka.net.compat import KafkaNetClient

# -- the test's own codec of Connect's protocol ----------------------------------------------------


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def encode_metadata(version: int, url: str, offset: int, allocation: bytes | None) -> bytes:
    out = struct.pack(">h", version) + _s(url) + struct.pack(">q", offset)
    if version >= 1:
        out += struct.pack(">i", -1) if allocation is None else (
            struct.pack(">i", len(allocation)) + allocation)
    return out


def _entries(items: set[tuple[str, int]]) -> bytes:
    by: dict[str, list[int]] = {}
    for c, t in sorted(items):
        by.setdefault(c, []).append(t)
    out = struct.pack(">i", len(by))
    for c, ts in by.items():
        out += _s(c) + struct.pack(">i", len(ts)) + b"".join(struct.pack(">i", t) for t in ts)
    return out


def encode_allocation(version: int, items: set[tuple[str, int]]) -> bytes | None:
    """What Connect's worker sends as Allocation: its whole assignment as a version 1/2
    assignment, or null when it has none."""
    if not items:
        return None
    return (struct.pack(">hh", version, 0) + _s("") + _s("") + struct.pack(">q", 0)
            + _entries(items) + struct.pack(">i", -1) + struct.pack(">i", 0))


class _R:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> Any:
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def s(self) -> str:
        n = self.take(">h")
        v = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return v

    def entries(self) -> set[tuple[str, int]] | None:
        n = self.take(">i")
        if n < 0:
            return None
        out = set()
        for _ in range(n):
            c = self.s()
            for _ in range(self.take(">i")):
                out.add((c, self.take(">i")))
        return out


def decode_assignment(data: bytes) -> dict[str, Any]:
    r = _R(data)
    version = r.take(">h")
    out: dict[str, Any] = {"version": version, "error": r.take(">h"), "leader": r.s(),
                           "leader_url": r.s(), "offset": r.take(">q"),
                           "assigned": r.entries() or set(), "revoked": set(), "delay": 0}
    if version >= 1 and r.pos < len(data):
        out["revoked"] = r.entries() or set()
        out["delay"] = r.take(">i")
    return out


def show(item: tuple[str, int]) -> str:
    return item[0] if item[1] == -1 else f"{item[0]}/{item[1]}"


# -- the worker ----------------------------------------------------------------------------------
class ClassicConnectWorker(BaseCoordinator):
    def __init__(self, client: Any, name: str, mode: str, record: str, **configs: Any) -> None:
        super().__init__(client, **configs)
        self.name, self.mode, self.record_path = name, mode, record
        self.url = f"http://{name}:8083"
        self.running: set[tuple[str, int]] = set()
        self.lock = threading.Lock()
        self.last: dict[str, Any] = {}

    def protocol_type(self) -> str:
        return "connect"

    def group_protocols(self) -> list[tuple[str, bytes]]:
        with self.lock:
            running = set(self.running)
        v0 = encode_metadata(0, self.url, 0, None)
        if self.mode == "default":
            return [("default", v0)]
        return [("sessioned", encode_metadata(2, self.url, 0, encode_allocation(2, running))),
                ("compatible", encode_metadata(1, self.url, 0, encode_allocation(1, running))),
                ("default", v0)]

    def _perform_assignment(self, leader_id: str, protocol: str, members: Any) -> dict[str, bytes]:
        raise AssertionError("a connect group's coordinator names no classic leader")

    def _emit(self, item: tuple[str, int], event: str) -> None:
        line = json.dumps({"ts": time.time(), "worker": self.name, "item": show(item),
                           "event": event, "pid": os.getpid(), "classic": self.mode}) + "\n"
        fd = os.open(self.record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def stop_items(self, items: set[tuple[str, int]]) -> None:
        with self.lock:
            for item in sorted(items & self.running):
                self.running.discard(item)
                self._emit(item, "stop")

    def start_items(self, items: set[tuple[str, int]]) -> None:
        with self.lock:
            for item in sorted(items - self.running):
                self.running.add(item)
                self._emit(item, "start")

    async def _on_join_prepare_async(self, generation: int, member_id: str,
                                     timeout_ms: int | None = None) -> None:
        if self.mode == "default" or generation < 0 or not member_id:
            # eager: everything stops before a rejoin; a lost membership: everything is lost
            self.stop_items(set(self.running))

    async def _on_join_complete_async(self, generation: int, member_id: str, protocol: str,
                                      data: bytes) -> None:
        a = decode_assignment(data)
        self.last = {"generation": generation, "member_id": member_id, "protocol": protocol,
                     **{k: v for k, v in a.items() if k not in ("assigned", "revoked")}}
        if a["version"] == 0:
            self.stop_items(self.running - a["assigned"])
            self.start_items(a["assigned"])
            return
        self.stop_items(a["revoked"])
        self.start_items(a["assigned"])
        if a["revoked"]:
            self.request_rejoin()  # (DistributedHerder: a follow-up rebalance after revoking)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--mode", choices=("sessioned", "default"), default="sessioned")
    p.add_argument("--record", required=True)
    p.add_argument("--instance-id")
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--heartbeat-interval-ms", type=int, default=500)
    p.add_argument("--rebalance-timeout-ms", type=int, default=10000)
    p.add_argument("--status", help="a file rewritten with the worker's state as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    client = KafkaNetClient(bootstrap_servers=args.bootstrap, client_id=args.name)
    client._net.start()
    client._manager.bootstrap(10000)
    w = ClassicConnectWorker(
        client, args.name, args.mode, args.record, group_id=args.group,
        group_instance_id=args.instance_id, session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_interval_ms=args.rebalance_timeout_ms,
        api_version=client._manager.broker_version)
    log = logging.getLogger("classic_worker")
    while not stopping.is_set():
        try:
            w.poll_heartbeat()
            if (w.need_rejoin() or w.coordinator_unknown()
                    or w._heartbeat_loop_future is None):
                w.ensure_active_group(timeout_ms=2000)
        except Exception as exc:  # noqa: BLE001 (as a worker does: log, back off, retry;
            # e.g. the heartbeat loop ended on a refused connection while the coordinator
            # restarted: the next ensure_active_group respawns it)
            log.warning("group membership error, retrying: %r", exc)
            stopping.wait(0.2)
            continue
        if args.status:
            status = {"member_id": w._generation.member_id,
                      "generation": w._generation.generation_id,
                      "running": sorted(show(i) for i in w.running), **w.last}
            tmp = args.status + ".tmp"
            with open(tmp, "w") as f:
                json.dump(status, f)
            os.replace(tmp, args.status)
        stopping.wait(0.1)
    w.stop_items(set(w.running))  # (Connect stops its work before it leaves)
    w.close(timeout_ms=5000)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
