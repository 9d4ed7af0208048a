"""Memory: the coordinator's RSS per member and per task, for groups of 1,000 and 10,000 members.

``python -m bench memory [--members 1000,10000] [--tasks-per-member 2,10] [--wire-members 1000]
[--repeat 5] [--output PATH]``

What is measured is the resident set (``VmRSS`` in ``/proc/<pid>/status``) of the real daemon
(``connect-coordinator serve --partitions 1``, a subprocess), quiescent, holding one Stable group:

* ``baseline``: the daemon on an empty data directory (started, no groups).
* ``log``: for every ``--members`` N and ``--tasks-per-member`` T, one group of N members owning
  N*T tasks (connectors of 20 tasks, so N*T/20 connector items too). Joining 10,000 members through
  the wire takes long (each join re-forms the group), so the group's partition log is written
  directly (``PartitionLog`` + ``serde`` + the ``records.py`` builders, as ``bench recovery``
  does) and the daemon is started on it: the records a Stable group leaves in the log (group
  metadata, connectors, the members, a target per member, the target metadata, a current
  assignment per member). The spread and the assignor state come from the real
  IncrementalCooperativeAssignor; member ids are UUIDs as the coordinator makes them.
* ``log+heartbeats``: the same daemon after one steady heartbeat per member that reports what the
  member runs (pipelined over one connection, every answer error-free at the member's epoch). A
  running coordinator keeps each member's last reported items (soft state a load does not
  rebuild), so this is the state of a group that has been live for a while.
* ``wire`` (``--wire-members`` N, 0 disables): the same shape (T = the smallest
  ``--tasks-per-member``), but the N members really join through the wire (``bench/_sim.py``:
  the real Membership state machine and assignor) until Stable; the simulated members are then
  closed (their sessions stay: 300 s) and the daemon is measured. ``wire-reload``: a daemon
  restarted on the log that run wrote. ``wire`` compares with ``log+heartbeats`` and
  ``wire-reload`` with ``log``: they check that the synthetic log is a fair stand-in.

Every daemon runs with a 300 s session timeout (no member expires while it is measured). Before
reading RSS the benchmark waits until the daemon answers a ConnectGroupDescribe of an unknown group
(it is queued behind the post-load event that arms the members' session timers) and until RSS
stops moving. After the measurements it describes the group and checks it: N members, Stable,
every item assigned once; a group that did not load is an error, not a number. Configurations
alternate within a repetition (order reversed on every other one); the tables show medians over
``--repeat`` repetitions. The baseline moves by about 1 MiB from one start to the next: that is
the noise floor (about 1 KiB per member at 1,000 members, 0.1 KiB at 10,000).

Derived figures: ``per member`` = (RSS - baseline) / N, everything the member brings included
(its T tasks too). Per task = the slope between the smallest and largest T at the same N; per
member without tasks = the intercept ((RSS - baseline) - slope * tasks) / N. The same steps run
in this process under ``tracemalloc`` (replay into a ``GroupCoordinator``, its ``on_loaded``, one
heartbeat per member, encoded and decoded so its strings are fresh as off the wire): the traced
bytes, a deep size of each part of the ``Group`` (members, current assignments, targets, the
derived indexes, connectors, assignor state, soft state), and the allocation sites holding the
most. The shard's timers and the event loop are not in that process: RSS minus traced is them plus
the allocator's slack. The last line is the headline. Rows go to ``bench/results/memory.json`` (or
``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import gc
import json
import random
import socket
import statistics
import struct
import sys
import tempfile
import time
import tracemalloc
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import RESULTS, ROOT, BenchError, machine, sizes_arg, start_daemon
from connect_wire import codec
from connect_wire.apis import APIS
from connect_wire.assignors.api import GroupSpec, MemberSpec
from connect_wire.assignors.incremental import IncrementalCooperativeAssignor
from connect_wire.errors import ErrorCode
from connect_wire.framing import encode_request_frame, parse_response_header
from connect_wire.items import split_items
from connect_wire.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from coordinator.admin import AdminClient, AdminError
from coordinator.group import records as rec
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator
from coordinator.group.model import (
    AssignorSpec,
    ConnectorSpec,
    CurrentAssignment,
    Item,
    MemberMetadata,
    MemberState,
    TargetMember,
)
from coordinator.runtime import serde
from coordinator.runtime.log import PartitionLog, partition_dir

GROUP = "bench-memory"
WIRE_GROUP = "bench-memory-wire"
PROBE = "bench-memory-probe"  # never exists: its answer only proves the post-load event ran
TASKS_PER_CONNECTOR = 20
CONNECTOR_CONFIG = (("connector.class", "org.example.BenchConnector"),)  # what bench/_sim.py sets
ASSIGNOR = AssignorSpec("incremental", 1, 1, 0, 1, b"")
BATCH = 500  # records per log batch
WINDOW = 256  # heartbeats in flight
DAEMON_ENV = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "300000",
              "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "200",
              "CONNECT_COORDINATOR_GROUP_CONNECT_MAX_SIZE": "1000000"}  # quick setup; any scale
SETTLE_S = 0.25
SETTLE_KIB = 64
FRAMES = 4  # tracemalloc frames: enough to step out of generated __init__/__new__


# -- the group ----------------------------------------------------------------------------------


def connector_specs(tasks: int) -> list[tuple[str, int]]:
    """Connectors of ``TASKS_PER_CONNECTOR`` tasks (the last one takes the rest)."""
    return [(f"connector-{c:05d}", min(TASKS_PER_CONNECTOR, tasks - c * TASKS_PER_CONNECTOR))
            for c in range(-(-tasks // TASKS_PER_CONNECTOR))]


@dataclass
class Shape:
    members: int
    tasks_per_member: int

    @property
    def tasks(self) -> int:
        return self.members * self.tasks_per_member

    @property
    def connectors(self) -> int:
        return len(connector_specs(self.tasks))

    @property
    def items(self) -> int:
        return self.tasks + self.connectors


Owned = list[tuple[str, int, frozenset[Item]]]  # (member id, member epoch, items) per member


def group_records(group_id: str, shape: Shape, seed: int = 7) -> tuple[list[rec.Record], Owned]:
    """The records a Stable group of ``shape`` leaves in its log (latest value per key), and what
    each member owns (for its heartbeat)."""
    rng = random.Random(seed)
    n = shape.members
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
    specs = connector_specs(shape.tasks)
    result = IncrementalCooperativeAssignor(max_delay_ms=0).assign(GroupSpec(
        group_epoch=n + 1, assignment_epoch=0, coordinator_time_ms=0,
        connectors=dict(specs), members={m: MemberSpec(member_id=m, member_epoch=1) for m in ids}))
    if result.error or result.scheduled_rebalance_delay_ms >= 0:
        raise BenchError(f"the assignor did not settle: {result}")
    epoch = n + 1  # one epoch bump per join
    out = [
        rec.group_metadata(group_id, epoch),
        rec.group_connectors(group_id, 1, [ConnectorSpec(c, t, CONNECTOR_CONFIG) for c, t in specs]),
    ]
    for i, mid in enumerate(ids):
        out.append(rec.group_member(group_id, MemberMetadata(
            member_id=mid, instance_id=None, worker_url=f"http://worker-{i}.example:8083",
            client_id=f"connect-worker-{i}", client_host=f"/10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
            rebalance_timeout_ms=60_000, assignors=(ASSIGNOR,))))
    targets = {mid: TargetMember(t.items, t.metadata_version, t.metadata)
               for mid, t in result.members.items()}
    for mid in ids:
        out.append(rec.target_member(group_id, mid, targets[mid]))
    out.append(rec.target_metadata(group_id, epoch, 0, result.assignor_state, -1))
    for mid in ids:
        t = targets[mid]
        out.append(rec.current_assignment(group_id, mid, CurrentAssignment(
            epoch, epoch - 1, MemberState.STABLE, t.items, frozenset(), t.metadata_version,
            t.metadata_bytes)))
    return out, [(mid, epoch, targets[mid].items) for mid in ids]


def write_log(data_dir: Path, records: list[rec.Record]) -> int:
    """A partition-0 log holding ``records`` (the daemon started with ``--partitions 1``)."""
    log, _ = PartitionLog.open(partition_dir(data_dir, 0))
    try:
        for start in range(0, len(records), BATCH):
            log.append([serde.encode_record(r) for r in records[start:start + BATCH]])
        log.sync()
        (data_dir / "partitions").write_text("1\n")  # the daemon's partition-count marker
        return log.size_bytes
    finally:
        log.close()


def heartbeat_request(group_id: str, member_id: str, epoch: int,
                      items: frozenset[Item]) -> ConnectGroupHeartbeatRequest:
    """A steady heartbeat that reports what the member runs (as a worker does after a change)."""
    connectors, tasks = split_items(items)
    return ConnectGroupHeartbeatRequest(
        group_id=group_id, member_id=member_id, member_epoch=epoch,
        owned_connectors=tuple(connectors),
        owned_tasks=tuple(_hb.TaskId(connector=t.connector, task=t.task) for t in tasks))


# -- the daemon ---------------------------------------------------------------------------------


def _status_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(rest.split()[0])
    if "VmRSS" not in out:
        raise BenchError(f"no VmRSS for pid {pid}")
    return out


def _describe(client: AdminClient, group_id: str) -> Any:
    try:
        return client.call(ConnectGroupDescribeRequest(group_ids=(group_id,))).groups[0]
    except AdminError as exc:
        raise BenchError(f"describe {group_id} failed: {exc}") from None


def _settle(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM once RSS stops moving (two reads ``SETTLE_S`` apart; at most 10 s)."""
    last = _status_kib(pid)
    for _ in range(40):
        time.sleep(SETTLE_S)
        now = _status_kib(pid)
        if abs(now["VmRSS"] - last["VmRSS"]) <= SETTLE_KIB:
            return now
        last = now
    return last


def _wait_loaded(client: AdminClient, timeout_s: float) -> None:
    """Until the daemon answers a describe; it is queued behind the post-load event (fresh
    sessions, timers), so an answer means that event ran."""
    deadline = time.monotonic() + timeout_s
    while True:
        probe = _describe(client, PROBE)
        if probe.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"daemon still loading after {timeout_s}s")
        time.sleep(0.01)
    if probe.error_code != ErrorCode.GROUP_ID_NOT_FOUND:
        raise BenchError(f"probe describe: error {probe.error_code} ({probe.error_message})")


def _check_group(described: Any, shape: Shape) -> dict[str, Any]:
    """The described group must be the one we built: N members, Stable, each item once."""
    assigned = [(a.connectors, a.tasks) for a in (m.assignment for m in described.members)]
    items = sum(len(c) + len(t) for c, t in assigned)
    distinct = len({*(c for cs, _ in assigned for c in cs),
                    *((t.connector, t.task) for _, ts in assigned for t in ts)})
    got = {"error_code": described.error_code, "members": len(described.members),
           "state": described.group_state, "items": items, "distinct_items": distinct}
    want = {"error_code": 0, "members": shape.members, "state": "Stable", "items": shape.items,
            "distinct_items": shape.items}
    if got != want:
        raise BenchError(f"the daemon did not load the expected group: got {got}, expected {want}")
    return got


def send_heartbeats(host: str, port: int, group_id: str, owned: Owned, timeout_s: float) -> int:
    """One heartbeat per member, pipelined (``WINDOW`` in flight) on one connection; every answer
    must be error-free at the member's epoch. Returns how many were answered."""
    api = APIS[ConnectGroupHeartbeatRequest.__api_key__]
    version = ConnectGroupHeartbeatRequest.__version__
    response_cls = api.response_class(version)
    answered = 0
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            reader = sock.makefile("rb")
            for start in range(0, len(owned), WINDOW):
                chunk = owned[start:start + WINDOW]
                sock.sendall(b"".join(
                    encode_request_frame(api.key, version, start + k, "bench-memory",
                                         codec.encode(heartbeat_request(group_id, mid, epoch, items)),
                                         header_version=api.request_header_version(version))
                    for k, (mid, epoch, items) in enumerate(chunk)))
                for k, (_mid, epoch, _) in enumerate(chunk):
                    head = reader.read(4)
                    body = reader.read(struct.unpack(">i", head)[0]) if len(head) == 4 else b""
                    if not body:
                        raise BenchError("the daemon closed the connection during the heartbeats")
                    cid, offset = parse_response_header(body, api.response_header_version(version))
                    resp = codec.decode(response_cls, body, offset)[0]
                    if cid != start + k or resp.error_code or resp.member_epoch != epoch:
                        raise BenchError(f"heartbeat answered error {resp.error_code} "
                                         f"({resp.error_message}), epoch {resp.member_epoch} != {epoch}")
                    answered += 1
    except (OSError, struct.error) as exc:
        raise BenchError(f"heartbeats failed: {exc}") from None
    return answered


def run_daemon(data_dir: Path, timeout_s: float, group_id: str | None = None,
               shape: Shape | None = None, owned: Owned | None = None) -> dict[str, Any]:
    """Start the daemon on ``data_dir``: RSS once loaded; with ``owned``, RSS again after one
    heartbeat per member; then check the group (describe). Stops the daemon."""
    daemon, _ = start_daemon(data_dir, extra_env=DAEMON_ENV, extra_args=["--partitions", "1"])
    try:
        with AdminClient(daemon.host, daemon.port, timeout_s=timeout_s) as client:
            _wait_loaded(client, timeout_s)
            loaded = _settle(daemon.pid)
            out: dict[str, Any] = {"loaded": loaded}
            if owned is not None and group_id is not None:
                n = send_heartbeats(daemon.host, daemon.port, group_id, owned, timeout_s)
                out["heartbeats"] = {**_settle(daemon.pid), "answered": n}
            if group_id is not None and shape is not None:
                out["checked"] = _check_group(_describe(client, group_id), shape)
        if daemon.proc.poll() is not None:
            raise BenchError(f"daemon exited:\n{daemon.stderr()[-3000:]}")
        return out
    finally:
        daemon.stop()


async def _form_wire_group(host: str, port: int, shape: Shape, timeout_s: float) -> None:
    from bench._sim import SimGroup, alter_connectors
    from worker_client.client import ConnectionFailed

    loop = asyncio.get_running_loop()

    def quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Requests still in flight when the simulated members are closed fail with
        # ConnectionFailed; nobody awaits them any more. Anything else is reported.
        if not isinstance(context.get("exception"), ConnectionFailed):
            loop.default_exception_handler(context)

    loop.set_exception_handler(quiet)
    group = SimGroup(host, port, WIRE_GROUP, assignor="incremental", long_poll=False,
                     shared_connections=min(shape.members, 20))
    await group.open()
    assert group.control is not None
    await alter_connectors(group.control, WIRE_GROUP, connector_specs(shape.tasks))
    try:
        for _ in range(shape.members):
            await group.add_member()
        try:
            await group.wait_settled(shape.items, shape.members, timeout_s)
        except TimeoutError:
            raise BenchError(f"{shape.members} members not Stable within {timeout_s}s") from None
        failed = [m.error for m in group.members if m.error]
        if failed:
            raise BenchError(f"a simulated member failed: {failed[0]!r}")
    finally:
        await group.close()


def run_wire(data_dir: Path, shape: Shape, timeout_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the daemon whose group joined through the wire, the daemon restarted on that log)."""
    daemon, _ = start_daemon(data_dir, extra_env=DAEMON_ENV, extra_args=["--partitions", "1"])
    try:
        started = time.perf_counter()
        asyncio.run(_form_wire_group(daemon.host, daemon.port, shape, timeout_s))
        formed_s = time.perf_counter() - started
        with AdminClient(daemon.host, daemon.port, timeout_s=timeout_s) as client:
            live: dict[str, Any] = {"loaded": _settle(daemon.pid), "formed_seconds": formed_s}
            live["checked"] = _check_group(_describe(client, WIRE_GROUP), shape)
        if daemon.proc.poll() is not None:
            raise BenchError(f"daemon exited:\n{daemon.stderr()[-3000:]}")
    finally:
        daemon.stop()
    return live, run_daemon(data_dir, timeout_s, WIRE_GROUP, shape)


# -- in process: where the bytes go -------------------------------------------------------------

_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, enum.Enum)


def _deep_size(root: Any, seen: set[int]) -> int:
    """Bytes reachable from ``root`` not already in ``seen`` (shared objects counted once)."""
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED) or obj is None or isinstance(obj, bool):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


PARTS: tuple[tuple[str, Callable[[Any], list[Any]]], ...] = (
    # Order matters: an object reachable from two parts counts in the first.
    ("members", lambda g: [g.members, g.static_members]),
    ("current", lambda g: [g.current]),
    ("target", lambda g: [g.target]),
    ("indexes", lambda g: [g.owner, g.target_owner, g.configured, g.unreconciled]),
    ("connectors", lambda g: [g.connectors]),
    ("assignor_state", lambda g: [g.assignor_state]),
    ("soft", lambda g: [g.soft]),
)


def profile_in_process(data_dir: Path, group_id: str, owned: Owned, top: int = 8) -> dict[str, Any]:
    """What the daemon does, in this process under tracemalloc: replay the log into a
    GroupCoordinator, its post-load step, then one heartbeat per member (encoded and decoded, so
    its strings are fresh as off the wire). Traced bytes after the load and after the heartbeats;
    a deep size of each part of the Group; the allocation sites holding the most."""
    gc.collect()
    tracemalloc.start(FRAMES)
    before, _ = tracemalloc.get_traced_memory()
    core = GroupCoordinator(GroupCoordinatorConfig(session_timeout_ms=300_000))
    log, _ = PartitionLog.open(partition_dir(data_dir, 0))
    try:
        for _offset, key, value in log.read():
            core.replay(serde.decode_record(key, value))
    finally:
        log.close()
    now = int(time.time() * 1000)
    result = core.on_loaded(now)
    # The shard keeps a timer per key, not the TimerOps: keep just the keys alive meanwhile.
    timer_keys = [op.key for op in result.timers]
    del result
    gc.collect()
    loaded, _ = tracemalloc.get_traced_memory()
    cls = ConnectGroupHeartbeatRequest
    for mid, epoch, items in owned:
        req = codec.decode(cls, codec.encode(heartbeat_request(group_id, mid, epoch, items)))[0]
        hb = core.heartbeat(req, now)
        if hb.response.error_code:
            raise BenchError(f"in-process heartbeat: error {hb.response.error_code}")
    del hb
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    del timer_keys
    g = core.state.groups[group_id]
    seen: set[int] = set()
    parts = {name: sum(_deep_size(obj, seen) for obj in get(g)) for name, get in PARTS}
    parts["group"] = _deep_size(g, seen)  # the Group object and anything not listed above
    return {"traced_loaded_bytes": loaded - before, "traced_heartbeats_bytes": current - before,
            "traced_peak_bytes": peak - before, "parts_bytes": parts,
            "top_sites": _sites(snapshot, top)}


def _sites(snapshot: tracemalloc.Snapshot, top: int) -> list[dict[str, Any]]:
    """The allocation sites holding the most, by the innermost frame that is not generated code
    (``<string>``: a dataclass ``__init__`` or a NamedTuple ``__new__``; its caller is shown)."""
    sites: dict[str, list[int]] = {}
    for stat in snapshot.statistics("traceback"):
        frames = [f for f in reversed(stat.traceback) if f.filename != "<string>"]
        frame = frames[0] if frames else stat.traceback[-1]
        path = Path(frame.filename)
        try:
            path = path.relative_to(ROOT)
        except ValueError:
            path = Path(*path.parts[-2:])
        site = sites.setdefault(f"{path}:{frame.lineno}", [0, 0])
        site[0] += stat.size
        site[1] += stat.count
    best = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"site": k, "bytes": v[0], "count": v[1]} for k, v in best]


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Config:
    source: str  # baseline | log (also yields log+heartbeats) | wire (also yields wire-reload)
    shape: Shape | None
    data_dir: Path | None = None
    owned: Owned | None = None
    log_bytes: int = 0
    profile: dict[str, Any] | None = None


SOURCES = ("baseline", "log", "log+heartbeats", "wire-reload", "wire")


def measure(args: argparse.Namespace, workdir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    configs = [Config("baseline", None)]
    for n in args.members:
        for t in args.tasks_per_member:
            shape = Shape(n, t)
            data = workdir / f"data-{n}-{t}"
            records, owned = group_records(GROUP, shape)
            nbytes = write_log(data, records)
            del records
            configs.append(Config("log", shape, data, owned, nbytes,
                                  profile_in_process(data, GROUP, owned)))
    if args.wire_members:
        configs.append(Config("wire", Shape(args.wire_members, min(args.tasks_per_member))))
    samples: dict[tuple[str, int, int], list[dict[str, Any]]] = {}

    def add(source: str, shape: Shape | None, status: dict[str, int], **extra: Any) -> None:
        key = (source, shape.members if shape else 0, shape.tasks_per_member if shape else 0)
        samples.setdefault(key, []).append({**status, **extra})

    for rep in range(args.repeat):
        order = configs if rep % 2 == 0 else configs[::-1]
        for c in order:
            if c.source == "baseline":
                got = run_daemon(workdir / f"empty-{rep}", args.timeout)
                add("baseline", None, got["loaded"])
            elif c.source == "log":
                assert c.data_dir is not None
                got = run_daemon(c.data_dir, args.timeout, GROUP, c.shape, c.owned)
                add("log", c.shape, got["loaded"], checked=got["checked"])
                add("log+heartbeats", c.shape, got["heartbeats"], checked=got["checked"])
            else:
                assert c.shape is not None
                live, reload = run_wire(workdir / f"wire-{rep}", c.shape, args.timeout)
                add("wire", c.shape, live["loaded"], checked=live["checked"],
                    formed_seconds=live["formed_seconds"])
                add("wire-reload", c.shape, reload["loaded"], checked=reload["checked"])
    base = statistics.median(m["VmRSS"] for m in samples[("baseline", 0, 0)])
    logs = {(c.shape.members, c.shape.tasks_per_member): c for c in configs
            if c.source == "log" and c.shape}
    rows = []
    for (source, n, t), ms in samples.items():
        rss = statistics.median(m["VmRSS"] for m in ms)
        profile = logs[(n, t)].profile if source.startswith("log") else None
        traced = None
        if profile is not None:
            traced = profile["traced_loaded_bytes" if source == "log" else "traced_heartbeats_bytes"]
        rows.append({
            "source": source, "members": n, "tasks_per_member": t,
            "tasks": n * t, "items": Shape(n, t).items if n else 0,
            "rss_kib": round(rss), "delta_kib": round(rss - base),
            "per_member_bytes": round((rss - base) * 1024 / n) if n else None,
            "traced_bytes": traced,
            "hwm_kib": round(statistics.median(m["VmHWM"] for m in ms)),
            "runs_kib": [m["VmRSS"] for m in ms],
            "checked": ms[-1].get("checked"),
            "log_bytes": logs[(n, t)].log_bytes if source.startswith("log") else None,
            "formed_seconds": (round(statistics.median(m["formed_seconds"] for m in ms), 3)
                               if source == "wire" else None),
            "in_process": profile if source == "log+heartbeats" else None,
        })
    rows.sort(key=lambda r: (SOURCES.index(r["source"]), r["members"], r["tasks_per_member"]))
    return rows, slopes(rows)


def slopes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per source and N: bytes per task (the slope over T) and per member without its tasks (the
    intercept), from RSS and from tracemalloc."""
    out = []
    for source in ("log", "log+heartbeats"):
        for n in sorted({r["members"] for r in rows if r["source"] == source}):
            rs = sorted((r for r in rows if r["source"] == source and r["members"] == n),
                        key=lambda r: r["tasks"])
            lo, hi = rs[0], rs[-1]
            d: dict[str, Any] = {"source": source, "members": n, "tasks_low": lo["tasks"],
                                 "tasks_high": hi["tasks"], "per_member_gross_bytes": lo["per_member_bytes"]}
            for prefix, low, high in (("", lo["delta_kib"] * 1024, hi["delta_kib"] * 1024),
                                      ("traced_", lo["traced_bytes"], hi["traced_bytes"])):
                per_task = fixed = None
                if hi["tasks"] > lo["tasks"]:
                    per_task = (high - low) / (hi["tasks"] - lo["tasks"])
                    fixed = round((low - per_task * lo["tasks"]) / n)
                    per_task = round(per_task)
                d[f"{prefix}per_task_bytes"] = per_task
                d[f"{prefix}per_member_fixed_bytes"] = fixed
            out.append(d)
    return out


# -- output ----------------------------------------------------------------------------------------


def _b(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _kib(v: float | None) -> str:
    return "-" if v is None else f"{v / 1024:.2f}"


def render(rows: list[dict[str, Any]], derived: list[dict[str, Any]]) -> str:
    lines = ["| source | members | tasks/member | items | RSS MiB | RSS - baseline MiB | "
             "per member KiB | traced per member KiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        traced = None if r["traced_bytes"] is None else r["traced_bytes"] / r["members"]
        lines.append(f"| {r['source']} | {r['members']:,} | {r['tasks_per_member']} | {r['items']:,} | "
                     f"{r['rss_kib'] / 1024:.1f} | {r['delta_kib'] / 1024:.1f} | "
                     f"{_kib(r['per_member_bytes'])} | {_kib(traced)} |")
    lines += ["", "| source | members | per member (gross) B | per task B | per member without tasks B | "
              "traced per task B | traced per member without tasks B |",
              "|---|---|---|---|---|---|---|"]
    for d in derived:
        lines.append(f"| {d['source']} | {d['members']:,} | {_b(d['per_member_gross_bytes'])} | "
                     f"{_b(d['per_task_bytes'])} | {_b(d['per_member_fixed_bytes'])} | "
                     f"{_b(d['traced_per_task_bytes'])} | {_b(d['traced_per_member_fixed_bytes'])} |")
    profiled = [r for r in rows if r["in_process"]]
    if profiled:
        names = [name for name, _ in PARTS] + ["group"]
        lines += ["", "| members | tasks/member | " + " | ".join(f"{n} B/member" for n in names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for r in profiled:
            parts = r["in_process"]["parts_bytes"]
            lines.append(f"| {r['members']:,} | {r['tasks_per_member']} | "
                         + " | ".join(f"{parts[n] / r['members']:,.0f}" for n in names) + " |")
        big = max(profiled, key=lambda r: (r["members"], r["tasks_per_member"]))
        lines += ["", f"| allocation site, live after load + heartbeats ({big['members']:,} members x "
                      f"{big['tasks_per_member']} tasks) | MiB | objects |", "|---|---|---|"]
        for s in big["in_process"]["top_sites"]:
            lines.append(f"| {s['site']} | {s['bytes'] / 2**20:.1f} | {s['count']:,} |")
    return "\n".join(lines)


def headline(rows: list[dict[str, Any]], derived: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    live = [r for r in rows if r["source"] == "log+heartbeats"]
    n = max(r["members"] for r in live)
    t = min(r["tasks_per_member"] for r in live if r["members"] == n)
    main_row = next(r for r in live if r["members"] == n and r["tasks_per_member"] == t)
    d = next(x for x in derived if x["source"] == "log+heartbeats" and x["members"] == n)
    text = (f"headline: {main_row['per_member_bytes'] / 1024:.1f} KiB of daemon RSS per member, "
            f"{n:,} members x {t} tasks ({main_row['delta_kib'] / 1024:.1f} MiB over a "
            f"{rows[0]['rss_kib'] / 1024:.1f} MiB baseline)")
    if d["per_task_bytes"] is not None:
        text += (f"; {d['per_task_bytes']:,} B per task + {d['per_member_fixed_bytes']:,} B per "
                 f"member without tasks")
    wire = next((r for r in rows if r["source"] == "wire"), None)
    if wire is not None:
        same = next((r for r in live if (r["members"], r["tasks_per_member"])
                     == (wire["members"], wire["tasks_per_member"])), None)
        text += (f"; {wire['members']:,} members joined through the wire: "
                 f"{wire['per_member_bytes'] / 1024:.1f} KiB per member")
        if same is not None:
            text += f" (from the log: {same['per_member_bytes'] / 1024:.1f})"
    info = {"metric": "daemon RSS over the baseline after one heartbeat per member: bytes per member, "
                      "per task, per member without tasks",
            "members": n, "tasks_per_member": t, "per_member_bytes": main_row["per_member_bytes"],
            "per_task_bytes": d["per_task_bytes"], "per_member_fixed_bytes": d["per_member_fixed_bytes"],
            "wire_members": None if wire is None else wire["members"],
            "wire_per_member_bytes": None if wire is None else wire["per_member_bytes"]}
    return text, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench memory", description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=sizes_arg, default=[1_000, 10_000],
                        help="group sizes, comma-separated (default 1000,10000)")
    parser.add_argument("--tasks-per-member", type=sizes_arg, default=[2, 10],
                        help="tasks per member, comma-separated; two or more give the per-task slope "
                             "(default 2,10)")
    parser.add_argument("--wire-members", type=int, default=1_000,
                        help="also a group of this many members joined through the wire, "
                             "0: none (default 1000)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median; default 5)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a daemon")
    parser.add_argument("--output", type=Path, default=RESULTS / "memory.json",
                        help="where to write the rows (default bench/results/memory.json)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.wire_members < 0 or args.timeout <= 0:
        parser.error("--repeat must be >= 1, --wire-members >= 0, --timeout > 0")
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
            rows, derived = measure(args, Path(tmp))
    except BenchError as exc:
        print(f"bench memory: {exc}", file=sys.stderr)
        return 1
    text, info = headline(rows, derived)
    result = {
        "benchmark": "memory",
        "unit": "daemon VmRSS in KiB (median); bytes per member and per task over the baseline",
        "repeat": args.repeat, "members": args.members, "tasks_per_member": args.tasks_per_member,
        "wire_members": args.wire_members, "tasks_per_connector": TASKS_PER_CONNECTOR,
        "machine": machine(),
        "rows": rows, "derived": derived, "headline": info,
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows, derived))
    print()
    print(f"(median of {args.repeat}; RSS = VmRSS of the quiescent daemon; baseline = no group; "
          f"log+heartbeats = after one heartbeat per member reporting what it runs; traced = "
          f"tracemalloc of the same steps in this process; every group was described and checked)")
    print(f"(rows written to {args.output})")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
