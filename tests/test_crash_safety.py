"""Crash safety of the daemon: no acknowledged state is ever lost (write before respond).

1. ``test_sigkill_under_load_loses_no_acknowledged_state``: a real daemon (a subprocess) under a
   concurrent load of joins, heartbeats (with revocation acks), leaves, assignment computations
   (PrepareAssignment + a valid InstallAssignment by the chosen worker) and AlterConnectors is
   killed with SIGKILL at random (seeded) instants and restarted on the same data dir, several
   times. Every response a client received is recorded in a ledger of facts; after each restart
   the facts are checked against ConnectGroupDescribe, and the partition logs left by the killed
   daemon are loaded offline (a copy of the data dir: PartitionLog.open + serde + replay into a
   fresh CoordinatorState) and checked with ``check_invariants`` and against Describe.
   Small segments and a 200 ms compaction interval put rolls and compactions under the kills too.
   8 cycles by default (~12 s); ``CRASH_CYCLES=50`` runs more, ``CRASH_SEED=N`` replays a seed
   (the kill instants derive from it; the thread interleaving does not).
2. ``test_torn_tail_then_flipped_byte_are_truncated_reported_and_served``: a data dir made by
   the daemon, then (a) the last segment of the group's partition cut by a few bytes and (b) a
   byte flipped in the middle of an earlier batch: the daemon starts, loads the good prefix,
   reports the truncation (a structured stderr line and the corruption metric over HTTP), keeps
   the cut bytes under ``partition-N/corrupt/`` and serves requests. Both cuts lose records
   that were durable (below the recovery point written at the clean stop), so each is first
   refused (the partition fails loudly, no file changes) until the operator accepts the loss by
   removing the partition's line from ``recovery-point-offset-checkpoint``.
3. ``test_failed_*``: at the shard level (in-process, a real log in a tmp dir), a failed fsync
   or write answers COORDINATOR_NOT_AVAILABLE, rolls the in-memory state back exactly, and the
   next request after the failure clears succeeds and is durable (including an fsync failure
   that also hits the fsync of the log's cut back to its durable offset: that used to fail the
   log for good, see the FIX in coordinator/runtime/log.py ``_rollback_unsynced``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import math
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter_msg
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb_msg
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst_msg
from coordinator.admin import AdminClient, AdminError
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import RequestContext
from coordinator.group.invariants import check_invariants
from coordinator.group.state import CoordinatorState
from coordinator.metrics import Metrics
from coordinator.runtime import serde
from coordinator.runtime.log import FsyncPolicy, PartitionLog, RecoveryReport, partition_dir
from coordinator.runtime.partitioner import partition_for
from coordinator.runtime.shard import Shard
from coordinator.store.file import FileStore

REPO = Path(__file__).resolve().parent.parent
E = ErrorCode
OK = 0
REBALANCE_TIMEOUT_MS = 60_000
BANNER = re.compile(
    r"connect-coordinator listening on (?P<host>[^ ]+):(?P<port>\d+) "
    r"\(metrics http://(?P<mhost>[^ ]+):(?P<mport>\d+)/metrics, data (?P<data>.+), "
    r"(?P<partitions>\d+) partitions\)"
)


# == a minimal daemon launcher ====================================================================


class Daemon:
    """``python -m coordinator.cli serve`` on free ports; stdout/stderr go to files."""

    def __init__(self, data_dir: Path, partitions: int, env: dict[str, str], tag: str) -> None:
        self.data_dir = data_dir
        self.out_path = data_dir.parent / f"{data_dir.name}.{tag}.stdout"
        self.err_path = data_dir.parent / f"{data_dir.name}.{tag}.stderr"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECT_COORDINATOR_")}
        full_env.update(env)
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "coordinator.cli", "serve", "--listen", "127.0.0.1:0",
                 "--metrics-listen", "127.0.0.1:0", "--data-dir", str(data_dir),
                 "--partitions", str(partitions)],
                cwd=REPO, env=full_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while True:
            text = self.out_path.read_text(errors="replace")
            match = BANNER.search(text)
            if match:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"no banner (exit {self.proc.returncode}); stdout {text!r}; "
                    f"stderr tail: {self.stderr()[-3000:]}")
            time.sleep(0.01)
        self.banner = match.group(0)
        self.addr = (match["host"], int(match["port"]))
        self.metrics_addr = (match["mhost"], int(match["mport"]))
        assert Path(match["data"]) == data_dir, self.banner
        assert int(match["partitions"]) == partitions, self.banner

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.stderr().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the daemon did not stop within 20 s of SIGTERM") from None

    def metric(self, name: str, labels: dict[str, str]) -> float | None:
        host, port = self.metrics_addr
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            if line.startswith(f"{name}{{{want}}} "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def client(self) -> AdminClient:
        return AdminClient(*self.addr, timeout_s=15)


# == wire helpers =================================================================================


def item_strings(connectors: Any, tasks: Any) -> frozenset[str]:
    return frozenset([*connectors, *(f"{t.connector}/{t.task}" for t in tasks)])


def wire_items(items: frozenset[str], task_cls: type) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    connectors, tasks = [], []
    for text in sorted(items):
        if "/" in text:
            name, task = text.rsplit("/", 1)
            tasks.append(task_cls(connector=name, task=int(task)))
        else:
            connectors.append(text)
    return tuple(connectors), tuple(tasks)


def str_items(items: Any) -> frozenset[str]:
    return frozenset(str(i) for i in items)


ConnectorView = dict[str, tuple[int, tuple[tuple[str, str | None], ...]]]


def described_connectors(group: Any) -> ConnectorView:
    return {c.name: (c.task_count, tuple((e.name, e.value) for e in c.config)) for c in group.connectors}


def describe(client: AdminClient, group_ids: list[str]) -> dict[str, Any]:
    resp = client.call(ConnectGroupDescribeRequest(group_ids=tuple(group_ids)))
    return {g.group_id: g for g in resp.groups}


ASSIGNORS = (_hb_msg.Assignor(name="incremental", minimum_version=0, maximum_version=1, reason=0,
                          metadata_version=1, metadata_bytes=b""),)


def join_request(group_id: str, member_id: str, owned: frozenset[str] = frozenset()) -> Any:
    connectors, tasks = wire_items(owned, _hb_msg.TaskId)
    return ConnectGroupHeartbeatRequest(
        group_id=group_id, member_id=member_id, member_epoch=0,
        rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, worker_url=f"http://{member_id}:8083",
        client_assignors=ASSIGNORS, owned_connectors=connectors, owned_tasks=tasks,
    )


def alter_request(group_id: str, upserts: ConnectorView, deletes: list[str] = ()) -> Any:  # type: ignore[assignment]
    return ConnectGroupAlterConnectorsRequest(
        group_id=group_id,
        upserts=tuple(
            _alter_msg.ConnectorSpec(name=name, task_count=count,
                                 config=tuple(_alter_msg.ConfigEntry(name=k, value=v) for k, v in config))
            for name, (count, config) in sorted(upserts.items())
        ),
        deletes=tuple(deletes), validate_only=False,
    )


# == offline loading ==============================================================================


def load_offline(data_dir: Path, partitions: int) -> tuple[CoordinatorState, list[RecoveryReport]]:
    """Replay every partition log of ``data_dir`` (recovering it: pass a copy of a live dir)."""
    state = CoordinatorState()
    reports = []
    for p in range(partitions):
        directory = partition_dir(data_dir, p)
        if not directory.exists():
            continue
        log, report = PartitionLog.open(directory)
        reports.append(report)
        try:
            part = CoordinatorState()
            for _offset, key, value in log.read():
                part.replay(serde.decode_record(key, value))  # an unknown type raises: none expected
        finally:
            log.close()
        for gid, g in part.groups.items():
            assert gid not in state.groups, f"group {gid} found in two partitions"
            assert partition_for(gid, partitions) == p, f"group {gid} in the wrong partition {p}"
            state.groups[gid] = g
    return state, reports


def compare_with_state(described: dict[str, Any], state: CoordinatorState) -> list[str]:
    """Describe (the daemon's loaded state) against an offline replay, field by field."""
    problems = []
    for gid, d in described.items():
        g = state.groups.get(gid)
        if g is None:
            if d.error_code != E.GROUP_ID_NOT_FOUND:
                problems.append(f"{gid}: offline state has no group, Describe shows epoch {d.group_epoch}")
            continue
        if d.error_code not in (OK, E.NO_ASSIGNOR_COVERS_GROUP):
            problems.append(f"{gid}: Describe error {d.error_code} {d.error_message}")
            continue
        mine = {
            "group_epoch": g.epoch, "assignment_epoch": g.assignment_epoch, "state": g.state.value,
            "connectors": {c.name: (c.task_count, tuple(c.config)) for c in g.connectors.values()},
            "members": {
                mid: (m.instance_id, m.worker_url, m.client_id, g.current[mid].epoch,
                      g.current[mid].state.label, str_items(g.current[mid].assigned),
                      str_items(g.target_items(mid)))
                for mid, m in g.members.items()
            },
        }
        theirs = {
            "group_epoch": d.group_epoch, "assignment_epoch": d.assignment_epoch,
            "state": d.group_state, "connectors": described_connectors(d),
            "members": {
                m.member_id: (m.instance_id, m.worker_url, m.client_id, m.member_epoch, m.member_state,
                              item_strings(m.assignment.connectors, m.assignment.tasks),
                              item_strings(m.target_assignment.connectors, m.target_assignment.tasks))
                for m in d.members
            },
        }
        for key in ("group_epoch", "assignment_epoch", "state", "connectors"):
            if mine[key] != theirs[key]:
                problems.append(f"{gid}: {key} offline {mine[key]} != Describe {theirs[key]}")
        ours, other = mine["members"], theirs["members"]
        if set(ours) != set(other):
            problems.append(f"{gid}: members offline {sorted(ours)} != Describe {sorted(other)}")
        for mid in sorted(set(ours) & set(other)):
            if ours[mid] != other[mid]:
                problems.append(f"{gid}: member {mid} offline {ours[mid]} != Describe {other[mid]}")
    return problems


# == the ledger of acknowledged facts =============================================================


@dataclass
class MemberFact:
    present: bool  # the last acknowledged response left it a member
    epoch: int = 0
    assignment: frozenset[str] = frozenset()
    inflight: str | None = None  # a request sent without a response: "join", "hb", "leave", ...


@dataclass
class GroupFacts:
    members: dict[str, MemberFact] = field(default_factory=dict)
    min_group_epoch: int = 0
    min_assignment_epoch: int = 0
    connectors: ConnectorView | None = None  # after the last acknowledged AlterConnectors
    alter_inflight: ConnectorView | None = None
    installs: dict[int, dict[str, frozenset[str]]] = field(default_factory=dict)


class Ledger:
    def __init__(self, group_ids: list[str]) -> None:
        self.lock = threading.Lock()
        self.groups = {gid: GroupFacts() for gid in group_ids}
        self.acks: dict[str, int] = {}
        self.unexpected: list[str] = []
        self.checked = 0
        self.inflight_at_kill = 0  # requests sent, not answered when the daemon was killed
        self.inflight_visible = 0  # ... whose effect is visible after the restart

    def ack(self, kind: str) -> None:
        self.acks[kind] = self.acks.get(kind, 0) + 1

    def note(self, problem: str) -> None:
        with self.lock:
            self.unexpected.append(problem)

    def begin(self, gid: str, mid: str, kind: str) -> None:
        with self.lock:
            fact = self.groups[gid].members.setdefault(mid, MemberFact(present=False))
            fact.inflight = kind

    def member_acked(self, gid: str, mid: str, kind: str, present: bool, epoch: int = 0,
                     assignment: frozenset[str] = frozenset()) -> None:
        with self.lock:
            self.groups[gid].members[mid] = MemberFact(present, epoch, assignment)
            self.ack(kind)

    def verify(self, described: dict[str, Any]) -> list[str]:
        """Every acknowledged fact against Describe right after a restart."""
        problems: list[str] = []
        with self.lock:
            for gid, facts in self.groups.items():
                d = described[gid]
                if d.error_code not in (OK, E.NO_ASSIGNOR_COVERS_GROUP):
                    if facts.connectors is not None or any(f.present for f in facts.members.values()):
                        problems.append(f"{gid}: acknowledged state but Describe says {d.error_code}")
                    continue
                dm = {m.member_id: m for m in d.members}
                self.checked += 2
                if d.group_epoch < facts.min_group_epoch:
                    problems.append(f"{gid}: group epoch {d.group_epoch} < acknowledged "
                                    f"{facts.min_group_epoch}")
                if d.assignment_epoch < facts.min_assignment_epoch:
                    problems.append(f"{gid}: assignment epoch {d.assignment_epoch} < acknowledged "
                                    f"{facts.min_assignment_epoch}")
                have = described_connectors(d)
                allowed = [facts.connectors if facts.connectors is not None else {}]
                if facts.alter_inflight is not None:
                    allowed.append(facts.alter_inflight)
                self.checked += 1
                if facts.alter_inflight is not None:
                    self.inflight_at_kill += 1
                    self.inflight_visible += have == facts.alter_inflight != allowed[0]
                if have not in allowed:
                    problems.append(f"{gid}: connectors {have} are neither the acknowledged "
                                    f"{allowed[0]} nor the in-flight {allowed[1:]}")
                installed = facts.installs.get(d.assignment_epoch)
                if installed is not None:
                    for m in d.members:
                        self.checked += 1
                        target = item_strings(m.target_assignment.connectors, m.target_assignment.tasks)
                        if not target <= installed.get(m.member_id, frozenset()):
                            problems.append(
                                f"{gid}: {m.member_id} target {sorted(target)} not within the "
                                f"acknowledged install at epoch {d.assignment_epoch}: "
                                f"{sorted(installed.get(m.member_id, ()))}")
                for mid, fact in facts.members.items():
                    self.checked += 1
                    if fact.inflight is not None:
                        self.inflight_at_kill += 1
                        m = dm.get(mid)
                        now = None if m is None else (
                            m.member_epoch, item_strings(m.assignment.connectors, m.assignment.tasks))
                        acked = (fact.epoch, fact.assignment) if fact.present else None
                        self.inflight_visible += now != acked
                    problems += [f"{gid}: {mid}: {p}" for p in _member_problems(fact, dm.get(mid))]
                for mid in dm:
                    if mid not in facts.members:
                        problems.append(f"{gid}: member {mid} that no client ever joined")
        return problems

    def resync(self, described: dict[str, Any]) -> None:
        """After a verified restart the daemon's state is the new baseline (in-flight requests
        were applied or not; either is allowed, and Describe tells which)."""
        with self.lock:
            for gid, facts in self.groups.items():
                d = described[gid]
                dm = {m.member_id: m for m in d.members}
                for mid in list(facts.members):
                    if mid not in dm:
                        facts.members[mid] = MemberFact(present=False)
                for mid, m in dm.items():
                    facts.members[mid] = MemberFact(
                        True, m.member_epoch, item_strings(m.assignment.connectors, m.assignment.tasks))
                if d.error_code in (OK, E.NO_ASSIGNOR_COVERS_GROUP):
                    facts.min_group_epoch = d.group_epoch
                    facts.min_assignment_epoch = d.assignment_epoch
                    facts.connectors = described_connectors(d)
                facts.alter_inflight = None


def _member_problems(fact: MemberFact, d: Any) -> list[str]:
    got = None if d is None else (d.member_epoch, item_strings(d.assignment.connectors, d.assignment.tasks))
    kind = fact.inflight
    if kind in (None, "prepare", "install"):
        # Only the member's own heartbeats change its current assignment: exactly as acknowledged.
        if not fact.present:
            return [] if d is None else [f"left/fenced (acknowledged) but still a member: {got}"]
        if d is None:
            return [f"acknowledged epoch {fact.epoch} {sorted(fact.assignment)}, now not a member"]
        if got != (fact.epoch, fact.assignment):
            return [f"acknowledged epoch {fact.epoch} {sorted(fact.assignment)}, now "
                    f"{got[0]} {sorted(got[1])}"]
        return []
    if kind == "hb":
        if d is None:
            return [f"acknowledged epoch {fact.epoch}, heartbeat in flight, now not a member"]
        if d.member_epoch < fact.epoch:
            return [f"epoch went back from acknowledged {fact.epoch} to {d.member_epoch}"]
        return []
    if kind == "join":
        if fact.present and d is None:
            return [f"acknowledged epoch {fact.epoch}, rejoin in flight, now not a member"]
        return []
    if kind == "leave":
        if d is not None and d.member_epoch < fact.epoch:
            return [f"epoch went back from acknowledged {fact.epoch} to {d.member_epoch}"]
        return []
    return [f"unknown in-flight kind {kind}"]


# == load generators ==============================================================================


class Worker:
    """A well-behaved worker: runs exactly its assignment, reports it, computes when chosen."""

    def __init__(self, group_id: str, index: int, ledger: Ledger, rng: random.Random) -> None:
        self.group_id = group_id
        self.name = f"{group_id}-w{index}"
        self.ledger = ledger
        self.rng = rng
        self.generation = 0
        self.member_id = f"{self.name}-g0"
        self.joined = False
        self.epoch = 0
        self.running: frozenset[str] = frozenset()
        self.full = True  # the next heartbeat carries every field (after a new connection)
        self.pending_leave: int | None = None  # a leave whose outcome is unknown: retry it
        self.pause = 0  # steps to sit out after leaving

    def connection_lost(self) -> None:
        self.full = True

    def step(self, client: AdminClient) -> None:
        if self.pending_leave is not None:
            self._leave(client, self.pending_leave)
            return
        if self.pause > 0:
            self.pause -= 1
            return
        if self.joined and self.epoch > 0 and self.rng.random() < 0.01:
            self._leave(client, self.epoch)
            return
        self._heartbeat(client)

    def _leave(self, client: AdminClient, epoch: int) -> None:
        self.pending_leave = epoch
        self.ledger.begin(self.group_id, self.member_id, "leave")
        resp = client.call(ConnectGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=-1))
        if resp.error_code not in (OK, E.UNKNOWN_MEMBER_ID):
            self.ledger.note(f"{self.member_id}: leave answered {resp.error_code} {resp.error_message}")
        self.ledger.member_acked(self.group_id, self.member_id, "leave", present=False)
        self.pending_leave = None
        self.joined = False
        self.running = frozenset()
        self.epoch = 0
        self.generation += 1
        self.member_id = f"{self.name}-g{self.generation}"
        self.pause = self.rng.randint(1, 20)

    def _heartbeat(self, client: AdminClient) -> None:
        joining = not self.joined or self.epoch == 0
        connectors, tasks = wire_items(self.running, _hb_msg.TaskId)
        if joining:
            req = join_request(self.group_id, self.member_id, self.running)
        elif self.full:
            req = ConnectGroupHeartbeatRequest(
                group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch,
                rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, client_assignors=ASSIGNORS,
                owned_connectors=connectors, owned_tasks=tasks)
        else:
            req = ConnectGroupHeartbeatRequest(
                group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch,
                owned_connectors=connectors, owned_tasks=tasks)
        kind = "join" if joining else "hb"
        self.ledger.begin(self.group_id, self.member_id, kind)
        resp = client.call(req)
        code = resp.error_code
        if code in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
            # The member is gone (durably: the fence's records were written before the answer).
            self.ledger.member_acked(self.group_id, self.member_id, "fenced", present=False)
            self.ledger.note(f"{self.member_id} at epoch {self.epoch} ({kind}, full={self.full}) "
                             f"answered {code} {resp.error_message}")
            self.joined = False
            self.epoch = 0
            self.running = frozenset()
            return
        if code != OK:
            self.ledger.note(f"{self.member_id}: {kind} answered {code} {resp.error_message}")
            with self.ledger.lock:
                self.ledger.groups[self.group_id].members[self.member_id].inflight = None
            return
        if resp.assignment is not None:
            # Revocations are done at once: the worker runs exactly what it may run now, and its
            # next heartbeat's owned lists acknowledge them.
            new = item_strings(resp.assignment.connectors, resp.assignment.tasks)
            if self.running - new:
                with self.ledger.lock:
                    self.ledger.ack("revoked")
            self.running = new
        self.joined = True
        self.full = False
        self.epoch = resp.member_epoch
        self.ledger.member_acked(self.group_id, self.member_id, kind, True, self.epoch, self.running)
        if resp.should_compute_assignment:
            self._compute(client)

    def _compute(self, client: AdminClient) -> None:
        self.ledger.begin(self.group_id, self.member_id, "prepare")
        prep = client.call(ConnectGroupPrepareAssignmentRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch))
        with self.ledger.lock:
            facts = self.ledger.groups[self.group_id]
            facts.members[self.member_id].inflight = None
            if prep.error_code == OK:
                facts.min_group_epoch = max(facts.min_group_epoch, prep.group_epoch)
                facts.min_assignment_epoch = max(facts.min_assignment_epoch, prep.assignment_epoch)
                self.ledger.ack("prepare")
        if prep.error_code != OK:
            if prep.error_code not in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
                self.ledger.note(f"{self.member_id}: prepare answered {prep.error_code}")
            return
        items = sorted(
            text for c in prep.connectors
            for text in (c.name, *(f"{c.name}/{t}" for t in range(c.task_count)))
        )
        members = sorted(m.member_id for m in prep.members)
        assign: dict[str, set[str]] = {m: set() for m in members}
        quota = math.ceil(len(items) / len(members)) if members else 0
        sticky = self.rng.random() < 0.7
        owner = {text: m.member_id for m in prep.members
                 for text in item_strings(m.target_connectors, m.target_tasks)}
        rest = []
        for text in items:
            o = owner.get(text)
            if sticky and o in assign and len(assign[o]) < quota:
                assign[o].add(text)
            else:
                rest.append(text)
        shift = self.rng.randrange(len(members)) if members else 0
        for i, text in enumerate(rest):
            if sticky:
                m = min(members, key=lambda m: (len(assign[m]), m))
            else:
                m = members[(i + shift) % len(members)]
            assign[m].add(text)
        assignments = []
        for m in members:
            connectors, tasks = wire_items(frozenset(assign[m]), _inst_msg.TaskId)
            assignments.append(_inst_msg.MemberAssignment(
                member_id=m, connectors=connectors, tasks=tasks, metadata_version=0, metadata_bytes=b""))
        self.ledger.begin(self.group_id, self.member_id, "install")
        resp = client.call(ConnectGroupInstallAssignmentRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch,
            group_epoch=prep.group_epoch, error=0, assignor_state=b"", members=tuple(assignments)))
        with self.ledger.lock:
            facts = self.ledger.groups[self.group_id]
            facts.members[self.member_id].inflight = None
            if resp.error_code == OK:
                facts.min_assignment_epoch = max(facts.min_assignment_epoch, prep.group_epoch)
                facts.installs[prep.group_epoch] = {m: frozenset(s) for m, s in assign.items()}
                self.ledger.ack("install")
        if resp.error_code not in (OK, E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
            self.ledger.note(f"{self.member_id}: install answered {resp.error_code} {resp.error_message}")


class Admin:
    """Changes a group's connectors: creates, resizes, reconfigures and deletes them."""

    def __init__(self, group_id: str, ledger: Ledger, rng: random.Random) -> None:
        self.group_id = group_id
        self.ledger = ledger
        self.rng = rng
        self.view: ConnectorView = {}
        self.counter = 0

    def connection_lost(self) -> None:
        pass

    def step(self, client: AdminClient) -> None:
        rng = self.rng
        upserts: ConnectorView = {}
        deletes: list[str] = []
        r = rng.random()
        if len(self.view) < 2 or (r < 0.4 and len(self.view) < 6):
            self.counter += 1
            name = f"c{self.counter}-{rng.randrange(1 << 16):04x}"
            upserts[name] = (rng.randint(0, 3), (("connector.class", "demo.Source"), ("rev", "0")))
        elif r < 0.75:
            name = rng.choice(sorted(self.view))
            count, config = self.view[name]
            if rng.random() < 0.5:
                count = rng.randint(0, 4)
            else:
                config = (("connector.class", "demo.Source"), ("rev", str(rng.randrange(1000))))
            upserts[name] = (count, config)
        else:
            deletes.append(rng.choice(sorted(self.view)))
            if rng.random() < 0.5:
                self.counter += 1
                upserts[f"c{self.counter}-{rng.randrange(1 << 16):04x}"] = (rng.randint(1, 3), ())
        wanted = {k: v for k, v in self.view.items() if k not in deletes}
        wanted.update(upserts)
        with self.ledger.lock:
            self.ledger.groups[self.group_id].alter_inflight = wanted
        resp = client.call(alter_request(self.group_id, upserts, deletes))
        with self.ledger.lock:
            facts = self.ledger.groups[self.group_id]
            facts.alter_inflight = None
            if resp.error_code == OK:
                facts.connectors = wanted
                facts.min_group_epoch = max(facts.min_group_epoch, resp.group_epoch)
                self.ledger.ack("alter")
        if resp.error_code == OK:
            self.view = wanted
        else:
            self.ledger.note(f"{self.group_id}: alter answered {resp.error_code} {resp.error_message}")


class Load:
    """Client threads, each with its own connection, gated so that they can be parked."""

    def __init__(self, actors: list[Any], ledger: Ledger, seed: int) -> None:
        self.actors = actors
        self.ledger = ledger
        self.addr: tuple[str, int] = ("", 0)
        self.gate = threading.Event()
        self.finished = False
        self.cond = threading.Condition()
        self.parked = 0
        self.threads = [
            threading.Thread(target=self._run, args=(a, random.Random(seed * 1000 + i)), daemon=True)
            for i, a in enumerate(actors)
        ]

    def start(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        for t in self.threads:
            t.start()
        self.gate.set()

    def resume(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self.gate.set()

    def pause(self) -> None:
        """Stop issuing requests (then the caller may kill); see wait_parked."""
        self.gate.clear()

    def wait_parked(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.parked < len(self.threads):
                left = deadline - time.monotonic()
                assert left > 0, f"only {self.parked}/{len(self.threads)} client threads parked"
                self.cond.wait(left)

    def finish(self) -> None:
        self.finished = True
        self.gate.set()
        for t in self.threads:
            t.join(10)

    def _park(self) -> None:
        with self.cond:
            self.parked += 1
            self.cond.notify_all()
        self.gate.wait()
        with self.cond:
            self.parked -= 1

    def _run(self, actor: Any, rng: random.Random) -> None:
        client: AdminClient | None = None
        while not self.finished:
            if not self.gate.is_set():
                if client is not None:
                    client.close()
                    client = None
                    actor.connection_lost()
                self._park()
                continue
            try:
                if client is None:
                    client = AdminClient(*self.addr, timeout_s=20)
                actor.step(client)
            except AdminError as exc:
                if client is not None:
                    client.close()
                client = None
                actor.connection_lost()
                if self.gate.is_set():
                    self.ledger.note(f"connection failed while the daemon should be up: {exc}")
                    time.sleep(0.05)
                continue
            except Exception as exc:  # a bug in the test itself: make it visible
                self.ledger.note(f"client thread crashed: {exc!r}")
                raise
            delay = 0.06 if isinstance(actor, Admin) else 0.008
            time.sleep(rng.uniform(0, delay))
        if client is not None:
            client.close()


def pick_groups(count: int, partitions: int) -> list[str]:
    """Group ids in distinct partitions."""
    chosen: dict[int, str] = {}
    n = 0
    while len(chosen) < count:
        gid = f"crash-{n}"
        chosen.setdefault(partition_for(gid, partitions), gid)
        n += 1
    return sorted(chosen.values())


# == 1. SIGKILL under load ========================================================================


def test_sigkill_under_load_loses_no_acknowledged_state(tmp_path: Path) -> None:
    cycles = int(os.environ.get("CRASH_CYCLES", "8"))
    seed = int(os.environ.get("CRASH_SEED", str(random.randrange(1 << 31))))
    rng = random.Random(seed)
    kill_after = [round(rng.uniform(0.15, 1.2), 3) for _ in range(cycles)]
    context = f"CRASH_SEED={seed} CRASH_CYCLES={cycles} kill instants (s after resume) {kill_after}"
    print(context)
    partitions = 4
    env = {
        "CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "60000",
        # Small segments and frequent compaction: rolls and compactions are killed too.
        "CONNECT_COORDINATOR_LOG_SEGMENT_BYTES": "16384",
        "CONNECT_COORDINATOR_LOG_COMPACTION_INTERVAL_MS": "200",
        "CONNECT_COORDINATOR_LOG_TOMBSTONE_RETENTION_MS": "0",
    }
    group_ids = pick_groups(3, partitions)
    ledger = Ledger(group_ids)
    actors: list[Any] = []
    for gid in group_ids:
        actors += [Worker(gid, i, ledger, random.Random(rng.random())) for i in range(3)]
        actors.append(Admin(gid, ledger, random.Random(rng.random())))
    data = tmp_path / "data"
    started = time.monotonic()
    daemon = Daemon(data, partitions, env, "start0")
    load = Load(actors, ledger, seed)
    truncations = 0
    try:
        load.start(daemon.addr)
        for cycle in range(cycles):
            where = f"{context}; cycle {cycle}"
            time.sleep(kill_after[cycle])
            assert daemon.alive, f"{where}: the daemon died by itself:\n{daemon.stderr()[-3000:]}"
            load.pause()
            daemon.kill()
            load.wait_parked()
            # Offline: what the killed daemon left (on a copy: recovery edits the files).
            copy = tmp_path / f"copy-{cycle}"
            shutil.copytree(data, copy)
            offline, reports = load_offline(copy, partitions)
            truncations += sum(r.truncated for r in reports)
            check_invariants(offline)
            daemon = Daemon(data, partitions, env, f"start{cycle + 1}")
            with daemon.client() as admin:
                described = describe(admin, group_ids)
            problems = ledger.verify(described) + compare_with_state(described, offline)
            assert not problems, f"{where} (data in {tmp_path}):\n" + "\n".join(problems)
            shutil.rmtree(copy)
            ledger.resync(described)
            for actor in actors:
                if isinstance(actor, Admin):
                    actor.view = described_connectors(described[actor.group_id])
            load.resume(daemon.addr)
        # A last stretch of load, then a clean stop: everything is acknowledged or not sent.
        time.sleep(0.5)
        load.pause()
        load.wait_parked()
        with daemon.client() as admin:
            described = describe(admin, group_ids)
        problems = ledger.verify(described)
        with ledger.lock:
            assert all(f.inflight is None for g in ledger.groups.values() for f in g.members.values())
        assert daemon.stop() == 0, daemon.stderr()[-3000:]
        offline, reports = load_offline(data, partitions)
        assert not any(r.truncated for r in reports), [r.summary() for r in reports if r.truncated]
        kept, offsets = sum(r.records for r in reports), sum(r.next_offset for r in reports)
        check_invariants(offline)
        problems += compare_with_state(described, offline)
        assert not problems, f"{context}; after the clean stop:\n" + "\n".join(problems)
    finally:
        load.finish()
        if daemon.alive:
            daemon.kill()
    acks = dict(ledger.acks)
    revoked = acks.pop("revoked", 0)  # heartbeat responses that revoked something (in "hb")
    print(f"{cycles} kill/restart cycles in {time.monotonic() - started:.1f} s; acknowledged "
          f"responses {sum(acks.values())} {acks} ({revoked} revoking); facts checked "
          f"{ledger.checked}; requests in "
          f"flight at a kill {ledger.inflight_at_kill} (effect visible after restart: "
          f"{ledger.inflight_visible}); logs with a torn tail {truncations}; records kept by "
          f"compaction {kept} of {offsets} offsets; notes {len(ledger.unexpected)}")
    for note in ledger.unexpected[:20]:
        print("  note:", note)
    # No daemon logged an error (a contained handler bug, a failed compaction, a failed read...).
    errors = [line for path in sorted(tmp_path.glob("data.*.stderr"))
              for line in path.read_text(errors="replace").splitlines() if '"level":"error"' in line]
    assert not errors, f"{context}:\n" + "\n".join(errors[:20])
    # The load must have done real work, or the test proves nothing.
    assert acks.get("alter", 0) >= cycles and acks.get("install", 0) >= cycles, (context, acks)
    assert acks.get("hb", 0) >= 10 * cycles and revoked >= cycles, (context, acks, revoked)
    # A well-behaved worker is never fenced, even across a crash (full heartbeat after
    # reconnecting, the lost-response rule), and no request fails otherwise.
    assert not ledger.unexpected, f"{context}:\n" + "\n".join(ledger.unexpected[:50])


# == 2. torn tail, flipped byte ===================================================================


@dataclass
class Batch:
    segment: Path
    position: int
    raw: bytes
    records: list[tuple[bytes, bytes | None]]


def read_batches(segment: Path) -> list[Batch]:
    """The batches of one segment, per the format documented in coordinator/runtime/log.py."""
    data = segment.read_bytes()
    batches = []
    pos = 0
    while pos < len(data):
        magic, length, _crc = struct.unpack_from(">BII", data, pos)
        assert magic == 1
        body = data[pos + 9: pos + 9 + length]
        _base, _stamp, count = struct.unpack_from(">QQI", body)
        at = 20
        records = []
        for _ in range(count):
            (klen,) = struct.unpack_from(">I", body, at)
            key = body[at + 4: at + 4 + klen]
            at += 4 + klen
            (vlen,) = struct.unpack_from(">i", body, at)
            at += 4
            value = None if vlen == -1 else body[at: at + vlen]
            at += max(vlen, 0)
            records.append((key, value))
        batches.append(Batch(segment, pos, data[pos: pos + 9 + length], records))
        pos += 9 + length
    return batches


def segments_of(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def replay_batches(batches: list[Batch]) -> CoordinatorState:
    state = CoordinatorState()
    for batch in batches:
        for key, value in batch.records:
            state.replay(serde.decode_record(key, value))
    check_invariants(state)
    return state


def drive_group(daemon: Daemon, gid: str, rounds: int, seed: int) -> None:
    """Sequential load: workers join, compute, reconcile; connectors change."""
    ledger = Ledger([gid])
    rng = random.Random(seed)
    workers = [Worker(gid, i, ledger, random.Random(rng.random())) for i in range(3)]
    admin = Admin(gid, ledger, random.Random(rng.random()))
    clients = [daemon.client() for _ in range(4)]
    try:
        for r in range(rounds):
            if r % 4 == 0:
                admin.step(clients[3])
            for w, c in zip(workers, clients, strict=False):
                w.step(c)
    finally:
        for c in clients:
            c.close()
    assert not ledger.unexpected, ledger.unexpected


def corruption_reported(daemon: Daemon, partition: int) -> None:
    events = [e for e in daemon.log_events()
              if e.get("event") == "partition log recovered with truncation"]
    assert [e["partition"] for e in events] == [partition], daemon.stderr()[-3000:]
    assert events[0]["level"] == "warning"
    assert "TRUNCATED" in events[0]["report"], events[0]
    assert daemon.metric("connect_coordinator_log_corruptions_total", {"partition": str(partition)}) == 1.0
    for p in range(2):
        if p != partition:
            assert not daemon.metric("connect_coordinator_log_corruptions_total", {"partition": str(p)})


def joins_and_serves(daemon: Daemon, gid: str, member_id: str) -> None:
    with daemon.client() as client:
        resp = client.call(join_request(gid, member_id))
        assert resp.error_code == OK, resp
        assert resp.member_id == member_id
        group = describe(client, [gid])[gid]
        assert member_id in {m.member_id for m in group.members}
        check_ok = client.call(alter_request(gid, {"after-recovery": (1, ())}))
        assert check_ok.error_code == OK, check_ok
    assert daemon.alive


def refused_until_accepted(data: Path, partitions: int, env: dict[str, str], p: int, gid: str,
                           tag: str) -> None:
    """The log of partition ``p`` was cut below its recovery point (acknowledged records are
    gone): the daemon fails the partition loudly and changes no file; then the operator accepts
    the loss by removing the partition's line from the checkpoint."""
    pdir = partition_dir(data, p)
    files = {f: f.read_bytes() for f in sorted(pdir.rglob("*")) if f.is_file()}
    daemon = Daemon(data, partitions, env, tag)
    try:
        with daemon.client() as client:
            (g,) = client.call(ConnectGroupDescribeRequest(group_ids=(gid,))).groups
        assert g.error_code == E.NOT_COORDINATOR, g
        failed = [e for e in daemon.log_events() if e.get("level") == "error"]
        assert [e.get("partition") for e in failed] == [p], daemon.stderr()[-3000:]
        assert "BehindRecoveryPoint" in failed[0]["error"], failed[0]
        assert daemon.metric("connect_coordinator_log_corruptions_total", {"partition": str(p)}) == 1.0
    finally:
        assert daemon.stop() == 0
    assert {f: f.read_bytes() for f in sorted(pdir.rglob("*")) if f.is_file()} == files
    checkpoint = data / "recovery-point-offset-checkpoint"
    version, _count, *entries = checkpoint.read_text().splitlines()
    kept = [e for e in entries if e.split()[0] != str(p)]
    checkpoint.write_text("\n".join([version, str(len(kept)), *kept]) + "\n")


def assert_describes(daemon: Daemon, gid: str, expected: CoordinatorState) -> None:
    with daemon.client() as client:
        described = describe(client, [gid])
    problems = compare_with_state(described, expected)
    assert not problems, "\n".join(problems)
    assert described[gid].members, "the prefix should hold members"


def test_torn_tail_then_flipped_byte_are_truncated_reported_and_served(tmp_path: Path) -> None:
    partitions = 2
    env = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "60000",
           "CONNECT_COORDINATOR_LOG_SEGMENT_BYTES": "4096"}
    gid = "torn-group"
    p = partition_for(gid, partitions)
    data = tmp_path / "data"
    pdir = partition_dir(data, p)
    corrupt = pdir / "corrupt"

    daemon = Daemon(data, partitions, env, "build")
    try:
        drive_group(daemon, gid, rounds=60, seed=7)
    finally:
        assert daemon.stop() == 0
    segments = segments_of(pdir)
    assert len(segments) >= 3, f"want several segments, got {segments}"
    batches = [b for s in segments for b in read_batches(s)]
    assert len(batches) >= 20

    # (a) A torn final batch: the last 3 bytes of the last segment are gone.
    last = batches[-1]
    assert last.segment == segments[-1]
    with open(last.segment, "r+b") as f:
        f.truncate(last.position + len(last.raw) - 3)
    expected = replay_batches(batches[:-1])
    print(f"partition {p}: {len(segments)} segments, {len(batches)} batches; cut the last 3 bytes "
          f"of {last.segment.name}")
    # After a clean stop every batch was durable: the cut is a loss, refused until accepted.
    refused_until_accepted(data, partitions, env, p, gid, "torn-refused")
    daemon = Daemon(data, partitions, env, "torn")
    try:
        corruption_reported(daemon, p)
        assert_describes(daemon, gid, expected)
        (kept,) = corrupt.iterdir()
        assert kept.read_bytes() == last.raw[:-3], "the cut bytes are kept under corrupt/"
        # (a cut batch that began its segment leaves it empty: recovery may remove it)
        assert (last.segment.stat().st_size >= last.position if last.segment.exists()
                else last.position == 0), (last.segment, last.position)
        joins_and_serves(daemon, gid, "joined-after-torn-tail")
    finally:
        assert daemon.stop() == 0

    # (b) A flipped byte in the middle of a batch of the first segment: the log ends before it.
    segments = segments_of(pdir)
    batches = [b for s in segments for b in read_batches(s)]
    first = [b for b in batches if b.segment == segments[0]]
    bad = first[len(first) // 2]
    index = batches.index(bad)
    assert index > 0 and segments[1:], "the flipped batch is an earlier one, later segments exist"
    original_tail = segments[0].read_bytes()[bad.position:]
    later = {s.name: s.read_bytes() for s in segments[1:]}
    flip_at = bad.position + len(bad.raw) // 2
    with open(segments[0], "r+b") as f:
        f.seek(flip_at)
        byte = f.read(1)[0]
        f.seek(flip_at)
        f.write(bytes([byte ^ 0x5A]))
    expected = replay_batches(batches[:index])
    print(f"partition {p}: {len(segments)} segments, {len(batches)} batches; flipped a byte of batch "
          f"{index} (byte {bad.position} of {segments[0].name}); prefix: epoch "
          f"{expected.groups[gid].epoch}, {len(expected.groups[gid].members)} members")
    refused_until_accepted(data, partitions, env, p, gid, "flipped-refused")
    before = set(corrupt.iterdir())
    daemon = Daemon(data, partitions, env, "flipped")
    try:
        corruption_reported(daemon, p)
        assert_describes(daemon, gid, expected)
        new = sorted(set(corrupt.iterdir()) - before)
        contents = {f.name: f.read_bytes() for f in new}
        cut = [n for n in contents if n.startswith(f"{segments[0].name}.cut-at-{bad.position}.")]
        assert len(cut) == 1, sorted(contents)
        flipped_tail = bytearray(original_tail)
        flipped_tail[flip_at - bad.position] ^= 0x5A
        assert contents[cut[0]] == bytes(flipped_tail), "the cut bytes (with the flip) are kept"
        for name, raw in later.items():
            moved = [n for n in contents if n.startswith(name + ".")]
            assert len(moved) == 1 and contents[moved[0]] == raw, f"segment {name} moved whole"
        assert [s.name for s in segments_of(pdir)] == [segments[0].name]
        assert segments[0].read_bytes()[: bad.position] == b"".join(b.raw for b in first[: first.index(bad)])
        joins_and_serves(daemon, gid, "joined-after-flipped-byte")
        time.sleep(0.2)
        assert daemon.alive
    finally:
        assert daemon.stop() == 0
    # What the recovered daemon wrote is durable and consistent.
    offline, _ = load_offline(data, partitions)
    check_invariants(offline)
    g = offline.groups[gid]
    assert "joined-after-flipped-byte" in g.members and "joined-after-torn-tail" not in g.members


# == 3. a failed fsync or write is never acknowledged ============================================


class Fault:
    """A real fsync/write, except while armed: then it fails (a write first writes a part)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.failures_left = 0  # -1: until cleared
        self.failed = 0

    def arm(self, times: int = -1) -> None:
        self.failures_left = times

    def clear(self) -> None:
        self.failures_left = 0

    def _failing(self) -> bool:
        if self.failures_left == 0:
            return False
        if self.failures_left > 0:
            self.failures_left -= 1
        self.failed += 1
        return True

    def fsync(self, fd: int) -> None:
        if self._failing():
            raise OSError(errno.EIO, "injected fsync failure")
        self.real(fd)

    def write(self, fd: int, data: memoryview) -> int:
        if self._failing():
            self.real(fd, data[: max(1, len(data) // 2)])
            raise OSError(errno.ENOSPC, "injected write failure (after a partial write)")
        return int(self.real(fd, data))


CTX = RequestContext(client_id="test", client_host="127.0.0.1")


async def _shard(tmp_path: Path) -> Shard:
    store = FileStore(tmp_path, 0, fsync=FsyncPolicy(), segment_bytes=1 << 20,
                      compaction_interval_ms=3_600_000, tombstone_retention_ms=0)
    shard = Shard(0, store, GroupCoordinatorConfig(session_timeout_ms=60_000), Metrics())
    await shard.load()
    assert shard.state == "active"
    return shard


def _hb_error(code: int, message: str) -> Any:
    return ("hb-error", code, message)


def _alter_error(code: int, message: str) -> Any:
    return ("alter-error", code, message)


def _code(resp: Any) -> int:
    return resp[1] if isinstance(resp, tuple) else resp.error_code


def _alter_on(shard: Shard, gid: str, upserts: ConnectorView, deletes: list[str] = ()) -> Any:  # type: ignore[assignment]
    req = alter_request(gid, upserts, deletes)
    return shard.write(lambda core, now: core.alter_connectors(req, now), _alter_error)


def _join(shard: Shard, gid: str, member_id: str) -> Any:
    return shard.heartbeat(join_request(gid, member_id), CTX, _hb_error)


def _leave(shard: Shard, gid: str, member_id: str, epoch: int) -> Any:
    req = ConnectGroupHeartbeatRequest(group_id=gid, member_id=member_id, member_epoch=-1)
    return shard.heartbeat(req, CTX, _hb_error)


async def _settle(shard: Shard) -> None:
    """Wait until the shard has committed everything queued (a read commits first)."""
    await shard.read(lambda core: None)


def _durable_state(directory: Path) -> CoordinatorState:
    log, report = PartitionLog.open(directory)
    try:
        assert not report.truncated, report.summary()
        state = CoordinatorState()
        for _offset, key, value in log.read():
            state.replay(serde.decode_record(key, value))
    finally:
        log.close()
    check_invariants(state)
    return state


async def _committed_group(shard: Shard) -> tuple[str, str, int]:
    """A group with a member at epoch > 0 holding work: (group, member, epoch)."""
    gid = "fsync-group"
    resp = await _alter_on(shard, gid, {"a": (2, ()), "b": (1, ())})
    assert resp.error_code == OK, resp
    resp = await _join(shard, gid, "w1")
    assert resp.error_code == OK and resp.should_compute_assignment, resp
    epoch = resp.member_epoch
    prep = await shard.write(lambda core, now: core.prepare_assignment(
        ConnectGroupPrepareAssignmentRequest(group_id=gid, member_id="w1", member_epoch=epoch), now),
        _alter_error)
    assert prep.error_code == OK, prep
    connectors, tasks = wire_items(frozenset({"a", "a/0", "a/1", "b", "b/0"}), _inst_msg.TaskId)
    install = ConnectGroupInstallAssignmentRequest(
        group_id=gid, member_id="w1", member_epoch=epoch, group_epoch=prep.group_epoch, error=0,
        assignor_state=b"", members=(_inst_msg.MemberAssignment(
            member_id="w1", connectors=connectors, tasks=tasks, metadata_version=0, metadata_bytes=b""),))
    resp = await shard.write(lambda core, now: core.install_assignment(install, now), _alter_error)
    assert resp.error_code == OK, resp
    resp = await shard.heartbeat(join_request(gid, "w1"), CTX, _hb_error)  # still at epoch 0
    assert resp.error_code == OK and resp.member_epoch == prep.group_epoch, resp
    assert resp.assignment is not None
    return gid, "w1", resp.member_epoch


async def _assert_unavailable_and_rolled_back(shard: Shard, gid: str, epoch: int) -> None:
    """Requests whose records cannot be made durable: nothing acknowledged, nothing changed."""
    assert shard.store.log is not None
    before = shard.core.state.snapshot()
    offset = shard.store.log.next_offset
    size = shard.store.log.size_bytes
    # One alone, then several in one group commit (they fail together).
    resp = await _join(shard, gid, "w2")
    assert _code(resp) == E.COORDINATOR_NOT_AVAILABLE, resp
    assert shard.core.state.snapshot() == before
    futures = [
        _alter_on(shard, gid, {"c": (3, ())}),
        _join(shard, gid, "w3"),
        _leave(shard, gid, "w1", epoch),
        _alter_on(shard, gid, {}, ["b"]),
    ]
    results = await asyncio.gather(*futures)
    assert [_code(r) for r in results] == [E.COORDINATOR_NOT_AVAILABLE] * len(futures), results
    assert shard.core.state.snapshot() == before
    assert (shard.store.log.next_offset, shard.store.log.size_bytes) == (offset, size)
    check_invariants(shard.core.state)


async def _assert_recovers_and_durable(shard: Shard, gid: str, directory: Path) -> None:
    resp = await _alter_on(shard, gid, {"c": (3, ())})
    assert resp.error_code == OK, resp
    resp = await _join(shard, gid, "w2")
    assert resp.error_code == OK and resp.member_epoch >= 0, resp
    await _settle(shard)
    live = shard.core.state.snapshot()
    assert "c" in live[gid]["connectors"] and "w2" in live[gid]["members"]
    check_invariants(shard.core.state)
    await shard.close()
    durable = _durable_state(directory)
    assert durable.snapshot() == live, "what was acknowledged is exactly what is durable"
    assert "w3" not in durable.groups[gid].members and "b" in durable.groups[gid].connectors


async def test_failed_fsync_is_not_acknowledged_and_rolled_back(tmp_path: Path) -> None:
    shard = await _shard(tmp_path)
    gid, _member, epoch = await _committed_group(shard)
    assert shard.store.log is not None
    fault = Fault(shard.store.log._fsync_fn)
    shard.store.log._fsync_fn = fault.fsync
    # A one-shot fsync failure per group commit (the truncation back to the durable offset is
    # fsynced fine): each commit below hits one failure.
    fault.arm(1)
    resp = await _join(shard, gid, "w2")
    assert _code(resp) == E.COORDINATOR_NOT_AVAILABLE, resp
    fault.arm(1)
    before = shard.core.state.snapshot()
    results = await asyncio.gather(_alter_on(shard, gid, {"c": (3, ())}), _join(shard, gid, "w3"),
                                   _alter_on(shard, gid, {}, ["b"]))
    assert [_code(r) for r in results] == [E.COORDINATOR_NOT_AVAILABLE] * 3, results
    assert shard.core.state.snapshot() == before
    assert fault.failed == 2
    await _assert_recovers_and_durable(shard, gid, partition_dir(tmp_path, 0))


async def test_failed_write_is_not_acknowledged_and_rolled_back(tmp_path: Path) -> None:
    shard = await _shard(tmp_path)
    gid, _member, epoch = await _committed_group(shard)
    assert shard.store.log is not None
    fault = Fault(shard.store.log._write_fn)
    shard.store.log._write_fn = fault.write
    fault.arm()
    await _assert_unavailable_and_rolled_back(shard, gid, epoch)
    assert fault.failed == 5
    fault.clear()
    await _assert_recovers_and_durable(shard, gid, partition_dir(tmp_path, 0))


async def test_failed_fsync_until_cleared_is_not_acknowledged_then_recovers(tmp_path: Path) -> None:
    """An fsync that keeps failing for a while (a disk hiccup), including the fsync of the
    truncation back to the durable offset; once the disk is fine again, writes succeed."""
    shard = await _shard(tmp_path)
    gid, _member, epoch = await _committed_group(shard)
    assert shard.store.log is not None
    fault = Fault(shard.store.log._fsync_fn)
    shard.store.log._fsync_fn = fault.fsync
    fault.arm()
    await _assert_unavailable_and_rolled_back(shard, gid, epoch)
    fault.clear()
    await _assert_recovers_and_durable(shard, gid, partition_dir(tmp_path, 0))


def test_log_cut_whose_fsync_fails_keeps_the_log_usable(tmp_path: Path) -> None:
    """The log-level side of the test above: sync() fails, and so does the fsync of the cut back
    to the durable offset. The cut itself succeeded, so the log is not failed; the next sync()
    fsyncs the cut even with nothing appended; later writes are durable."""
    from coordinator.group import records as rec

    calls = {"fail": 0, "fsyncs": 0}

    def fsync(fd: int) -> None:
        calls["fsyncs"] += 1
        if calls["fail"]:
            calls["fail"] -= 1
            raise OSError(errno.EIO, "injected fsync failure")
        os.fsync(fd)

    def record(epoch: int) -> tuple[bytes, bytes | None]:
        return serde.encode_record(rec.group_metadata("g", epoch))

    log, _ = PartitionLog.open(tmp_path, fsync_fn=fsync)
    log.append([record(1)])
    log.sync()
    size = log.size_bytes
    log.append([record(2)])
    calls["fail"] = 2
    with pytest.raises(OSError, match="injected"):
        log.sync()
    assert log.failed is None
    assert (log.next_offset, log.durable_offset, log.size_bytes) == (1, 1, size)
    assert log.segments[-1].path.stat().st_size == size
    before = calls["fsyncs"]
    log.sync()  # nothing appended, but the cut is not known to be durable yet
    assert calls["fsyncs"] == before + 1
    log.sync()
    assert calls["fsyncs"] == before + 1
    log.append([record(3)])
    log.sync()
    log.close()
    log, report = PartitionLog.open(tmp_path)
    try:
        assert report.clean
        assert [serde.decode_record(k, v).value.epoch for _, k, v in log.read()] == [1, 3]
    finally:
        log.close()


async def test_failed_log_is_reopened_and_the_partition_reloaded(tmp_path: Path, monkeypatch: Any) -> None:
    """A write fails and so does the truncation back: the log's end on disk is unknown and the
    log refuses writes. The shard must reopen it (recovery validates the bytes) and rebuild its
    state by replay instead of answering COORDINATOR_NOT_AVAILABLE until a restart."""
    shard = await _shard(tmp_path)
    gid, _member, _epoch = await _committed_group(shard)
    assert shard.store.log is not None
    failing_log = shard.store.log

    def half_write(fd: int, data: memoryview) -> int:
        os.write(fd, data[:10])
        raise OSError(errno.ENOSPC, "injected write failure")

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "injected truncate failure")

    failing_log._write_fn = half_write
    monkeypatch.setattr(os, "ftruncate", no_truncate)
    resp = await _alter_on(shard, gid, {"c": (3, ())})
    assert _code(resp) == E.COORDINATOR_NOT_AVAILABLE, resp
    assert failing_log.failed is not None
    monkeypatch.undo()
    # The partition reloads by itself; requests then succeed.
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        try:
            resp = await _alter_on(shard, gid, {"d": (1, ())})
        except Exception:  # loading: the shard refuses new events meanwhile
            resp = None
        if resp is not None and _code(resp) == OK:
            break
        assert asyncio.get_running_loop().time() < deadline, f"partition never recovered: {resp}"
        await asyncio.sleep(0.05)
    assert shard.store.log is not failing_log and shard.store.log.failed is None
    recovery = shard.store.recovery
    assert recovery is not None and recovery.truncated, "the torn batch was cut at reopen"
    # Logged (error level) and counted.
    assert shard.metrics.registry.get_sample_value(
        "connect_coordinator_partition_reloads_total", {"partition": "0"}) == 1.0
    await _settle(shard)
    live = shard.core.state.snapshot()
    assert "d" in live[gid]["connectors"] and "c" not in live[gid]["connectors"]
    check_invariants(shard.core.state)
    await shard.close()
    assert _durable_state_allow_truncation(partition_dir(tmp_path, 0)).snapshot() == live


def _durable_state_allow_truncation(directory: Path) -> CoordinatorState:
    log, _report = PartitionLog.open(directory)
    try:
        state = CoordinatorState()
        for _offset, key, value in log.read():
            state.replay(serde.decode_record(key, value))
    finally:
        log.close()
    return state
