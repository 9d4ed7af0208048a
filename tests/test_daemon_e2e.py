"""End-to-end: the daemon as a subprocess, driven over real TCP.

* Seed 000's case studies (empty group, W1 joins, W2 joins, worker leaving, worker bounces) as
  tests/test_group_case_studies.py drives them in-process, here with one KRPC connection per
  simulated worker (responses are in order per connection) and a real clock: session expiry
  and the scheduled rebalance delay really elapse (short timeouts).
* Abuse: malformed, oversized and garbage frames, unknown API keys and versions, slow-loris
  senders, the connection limit; after each, the daemon is still running and a fresh client
  is served.
* Metrics over HTTP, long-poll wake-up latency, Kafka client interop (kafka-python's admin
  client), the CLI, graceful shutdown and restart.

Items are strings: "A" is connector A, "A/0" its task 0 (seed 000: AC0 = A, AT1 = A/0,
AT2 = A/1, BC0 = B, BT1 = B/0).
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode as E
from connect_wire.framing import encode_request_frame, parse_response_header
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from coordinator.admin import AdminClient, AdminError
from tests.daemon_fixture import Daemon, DaemonPool, run_cli, run_serve

SEED000_ITEMS = ["A", "A/0", "A/1", "B", "B/0"]
REBALANCE_TIMEOUT_MS = 30_000


@pytest.fixture
def pool(tmp_path: Path) -> Iterable[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


# == helpers ==========================================================================================


def wire_lists(texts: Iterable[str], task_cls: type) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    connectors, tasks = [], []
    for t in sorted(texts):
        if "/" in t:
            c, n = t.rsplit("/", 1)
            tasks.append(task_cls(connector=c, task=int(n)))
        else:
            connectors.append(t)
    return tuple(connectors), tuple(tasks)


def names(a: Any) -> list[str] | None:
    """The items of an assignment struct (heartbeat or describe), None when absent."""
    if a is None:
        return None
    return sorted([*a.connectors, *(f"{t.connector}/{t.task}" for t in a.tasks)])


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(step_s)


class Admin:
    """An admin connection: alter connectors, describe."""

    def __init__(self, d: Daemon, group: str = "g") -> None:
        self.client = AdminClient(d.host, d.port, client_id="e2e-admin")
        self.group = group

    def close(self) -> None:
        self.client.close()

    def alter(self, upserts: dict[str, int] | None = None, deletes: Iterable[str] = ()) -> Any:
        req = ConnectGroupAlterConnectorsRequest(
            group_id=self.group,
            upserts=tuple(_alter.ConnectorSpec(name=n, task_count=c, config=())
                          for n, c in (upserts or {}).items()),
            deletes=tuple(deletes), validate_only=False)
        return self.client.call(req)

    def describe(self) -> Any:
        (g,) = self.client.call(ConnectGroupDescribeRequest(group_ids=(self.group,))).groups
        return g

    def epochs(self) -> tuple[int, int]:
        g = self.describe()
        return g.group_epoch, g.assignment_epoch

    def members(self) -> dict[str, tuple[int, list[str] | None]]:
        return {m.member_id: (m.member_epoch, names(m.assignment)) for m in self.describe().members}

    def targets(self) -> dict[str, list[str] | None]:
        """Target assignment per member (members with an empty target left out)."""
        return {m.member_id: names(m.target_assignment) for m in self.describe().members
                if names(m.target_assignment)}

    def state(self) -> str:
        return str(self.describe().group_state)


class Worker:
    """One simulated worker: its own connection, its member id and epoch, what it runs."""

    def __init__(self, d: Daemon, member_id: str, group: str = "g", low: int = 0, high: int = 1,
                 instance_id: str | None = None, rebalance_timeout_ms: int = REBALANCE_TIMEOUT_MS) -> None:
        self.client = AdminClient(d.host, d.port, client_id=f"worker-{member_id or 'new'}")
        self.member_id = member_id
        self.group = group
        self.low, self.high = low, high
        self.reason = 0
        self.instance_id = instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.epoch = 0
        self.running: list[str] = []

    def close(self) -> None:
        self.client.close()

    def assignors(self) -> tuple[Any, ...]:
        return (_hb.Assignor(name="incremental", minimum_version=self.low, maximum_version=self.high,
                             reason=self.reason, metadata_version=self.high, metadata_bytes=b""),)

    def request(self, owned: Iterable[str] | None = None, epoch: int | None = None,
                max_wait_ms: int = 0, **fields: Any) -> ConnectGroupHeartbeatRequest:
        epoch = self.epoch if epoch is None else epoch
        if epoch == 0:  # a member at epoch 0 sends the full join fields (docs/protocol.md)
            fields.setdefault("client_assignors", self.assignors())
            fields.setdefault("rebalance_timeout_ms", self.rebalance_timeout_ms)
            fields.setdefault("instance_id", self.instance_id)
            owned = list(owned or [])
        if owned is not None:
            fields["owned_connectors"], fields["owned_tasks"] = wire_lists(owned, _hb.TaskId)
        return ConnectGroupHeartbeatRequest(group_id=self.group, member_id=self.member_id,
                                            member_epoch=epoch, max_wait_ms=max_wait_ms, **fields)

    def absorb(self, r: Any) -> Any:
        if r.error_code == 0:
            if r.member_id:
                self.member_id = r.member_id
            self.epoch = r.member_epoch
            if r.assignment is not None:
                self.running = names(r.assignment) or []
        return r

    def hb(self, owned: Iterable[str] | None = None, **kw: Any) -> Any:
        return self.absorb(self.client.call(self.request(owned, **kw)))

    def ok(self, owned: Iterable[str] | None = None, **kw: Any) -> Any:
        r = self.hb(owned, **kw)
        assert r.error_code == 0, r
        return r

    def bump_reason(self) -> Any:
        """Update the assignor's reason: a seed 000 rebalance trigger."""
        self.reason += 1
        if self.epoch == 0:
            return self.ok()
        return self.ok(client_assignors=self.assignors())

    def prepare(self) -> Any:
        return self.client.call(ConnectGroupPrepareAssignmentRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch))

    def install(self, assignment: dict[str, Iterable[str]], group_epoch: int,
                delay_ms: int = -1) -> Any:
        members = []
        for mid, its in assignment.items():
            connectors, tasks = wire_lists(its, _inst.TaskId)
            members.append(_inst.MemberAssignment(member_id=mid, connectors=connectors, tasks=tasks,
                                                  metadata_version=0, metadata_bytes=b""))
        return self.client.call(ConnectGroupInstallAssignmentRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch,
            group_epoch=group_epoch, error=0, assignor_state=b"",
            scheduled_rebalance_delay_ms=delay_ms, members=tuple(members)))

    def compute(self, assignment: dict[str, Iterable[str]], delay_ms: int = -1) -> Any:
        prepared = self.prepare()
        assert prepared.error_code == 0, prepared
        installed = self.install(assignment, prepared.group_epoch, delay_ms)
        assert installed.error_code == 0, installed
        return prepared


def live(workers: Iterable[Worker], until: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Keep ``workers`` heartbeating (every ~150 ms, reporting what they run) until ``until()``."""
    workers = list(workers)
    deadline = time.monotonic() + timeout_s
    next_beat = 0.0
    while True:
        now = time.monotonic()
        if now >= next_beat:
            for w in workers:
                w.ok(owned=w.running)
            next_beat = now + 0.15
        value = until()
        if value:
            return value
        if now > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.03)


def scrape(d: Daemon) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    assert d.metrics_url is not None
    with urllib.request.urlopen(d.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(d: Daemon, name: str, **labels: str) -> float | None:
    return scrape(d).get((name, frozenset(labels.items())))


def assert_healthy(d: Daemon) -> None:
    """The daemon runs and a fresh client is answered."""
    assert d.proc.poll() is None, f"daemon exited with {d.proc.returncode}:\n{d.stderr()[-3000:]}"
    with AdminClient(d.host, d.port, timeout_s=5) as c:
        r = c.call(APIS[ApiKey.API_VERSIONS].request_class(3)(
            client_software_name="e2e", client_software_version="1"))
        assert int(r.error_code) == 0
        (g,) = c.call(ConnectGroupDescribeRequest(group_ids=("health",))).groups
        assert g.error_code == E.GROUP_ID_NOT_FOUND


# == seed 000 case studies over TCP ===================================================================


def test_seed000_empty_group_w1_joins_w2_joins(pool: DaemonPool) -> None:
    d = pool.start()
    admin = Admin(d)
    # Empty Group: connectors AC0, AT1, AT2, BC0, BT1; no members: epochs (0, 0).
    r = admin.alter({"A": 2, "B": 1})
    assert r.error_code == 0 and r.group_epoch == 0
    assert admin.epochs() == (0, 0) and admin.members() == {} and admin.state() == "Empty"
    assert [(c.name, c.task_count) for c in admin.describe().connectors] == [("A", 2), ("B", 1)]

    # W1 joins: group epoch 1; W1 at epoch 0 with nothing; chosen to compute in this response.
    w1 = Worker(d, "W1")
    r = w1.ok()
    assert r.member_id == "W1" and r.member_epoch == 0 and names(r.assignment) == []
    assert r.should_compute_assignment is True and r.heartbeat_interval_ms == 200
    assert admin.epochs() == (1, 0) and admin.members() == {"W1": (0, [])} and admin.targets() == {}
    g = admin.describe()
    assert g.group_state == "Assigning" and g.assigning_member_id == "W1"
    assert g.assignor_name == "incremental"

    # W1 assigns everything to itself: target epoch 1, W1 still at epoch 0.
    prepared = w1.compute({"W1": SEED000_ITEMS})
    assert (prepared.group_epoch, prepared.assignment_epoch) == (1, 0)
    assert [m.member_id for m in prepared.members] == ["W1"]
    assert admin.epochs() == (1, 1) and admin.targets() == {"W1": SEED000_ITEMS}
    assert admin.members() == {"W1": (0, [])} and admin.state() == "Reconciling"

    # W1 heartbeats: epoch 1 with everything.
    r = w1.ok()
    assert r.member_epoch == 1 and names(r.assignment) == SEED000_ITEMS
    assert r.should_compute_assignment is False
    assert admin.members() == {"W1": (1, SEED000_ITEMS)} and admin.state() == "Stable"

    # W2 joins: group epoch 2; W2 reconciled to the assignment epoch (1), nothing for it yet.
    w2 = Worker(d, "W2")
    r = w2.ok()
    assert r.should_compute_assignment is False
    assert r.member_epoch == 1 and names(r.assignment) == []
    assert admin.epochs() == (2, 1)
    assert admin.members() == {"W1": (1, SEED000_ITEMS), "W2": (1, [])}
    # W1 (sticky) is told to compute on its next heartbeat; its assignment is unchanged.
    r = w1.ok(owned=SEED000_ITEMS)
    assert r.should_compute_assignment is True and r.member_epoch == 1 and r.assignment is None
    w1.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    assert admin.epochs() == (2, 2)
    assert admin.targets() == {"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}
    assert admin.members() == {"W1": (1, SEED000_ITEMS), "W2": (1, [])}

    # Revoke before assign. W2 heartbeats first: it moves to epoch 2 but gets nothing, BC0 and
    # BT1 are still W1's.
    r = w2.ok(owned=[])
    assert r.member_epoch == 2 and not names(r.assignment)
    assert {m.member_id: m.member_state for m in admin.describe().members}["W2"] == "UnreleasedItems"
    # W1 heartbeats: asked to revoke BC0 and BT1 (same epoch, may run only AC0, AT1, AT2).
    r = w1.ok(owned=SEED000_ITEMS)
    assert r.member_epoch == 1 and names(r.assignment) == ["A", "A/0", "A/1"]
    assert {m.member_id: m.member_state for m in admin.describe().members}["W1"] == "UnrevokedItems"
    # W2 heartbeats meanwhile: still nothing.
    r = w2.ok(owned=[])
    assert r.member_epoch == 2 and r.assignment is None
    # W1 acknowledges: epoch 2.
    r = w1.ok(owned=["A", "A/0", "A/1"])
    assert r.member_epoch == 2 and names(r.assignment) == ["A", "A/0", "A/1"]
    # W2 heartbeats: now it gets BC0 and BT1.
    r = w2.ok(owned=[])
    assert r.member_epoch == 2 and names(r.assignment) == ["B", "B/0"]
    assert admin.members() == {"W1": (2, ["A", "A/0", "A/1"]), "W2": (2, ["B", "B/0"])}
    assert admin.state() == "Stable"
    # A steady heartbeat: nothing new.
    r = w2.ok()
    assert r.member_epoch == 2 and r.assignment is None and r.should_compute_assignment is False
    for c in (admin, w1, w2):
        c.close()


def _three_workers_at_35(d: Daemon, admin: Admin, w2_instance: str | None = None
                         ) -> tuple[Worker, Worker, Worker]:
    """Seed 000's start of "Worker Leaving"/"Worker Bounces": W1 [A, A/0], W2 [B, B/0], W3 [A/1]
    at epoch 35. W3's assignor range [0-2] covers W1's and W2's [0-1], so W3 is chosen; W1
    raises the group epoch to 35 by updating its assignor's reason."""
    assert admin.alter({"A": 2, "B": 1}).error_code == 0
    # W2's rebalance timeout of 1 s: once fenced, its items are held 0.5 s past its session.
    w1, w2 = Worker(d, "W1"), Worker(d, "W2", instance_id=w2_instance, rebalance_timeout_ms=1_000)
    w3 = Worker(d, "W3", high=2)
    w1.ok()
    w2.ok()
    assert w3.ok().should_compute_assignment is True
    assert admin.epochs() == (3, 0) and admin.describe().assigning_member_id == "W3"
    while admin.epochs()[0] < 35:
        before = admin.epochs()[0]
        w1.bump_reason()
        assert admin.epochs()[0] == before + 1
        if before % 8 == 0:  # W2 and W3 keep their (2 s) sessions on a slow machine
            w2.ok()
            assert w3.ok().should_compute_assignment is True
    assert admin.describe().assigning_member_id == "W3"
    w3.compute({"W1": ["A", "A/0"], "W2": ["B", "B/0"], "W3": ["A/1"]})
    for w in (w1, w2, w3):
        assert w.ok().member_epoch == 35
    assert admin.epochs() == (35, 35)
    assert admin.targets() == {"W1": ["A", "A/0"], "W2": ["B", "B/0"], "W3": ["A/1"]}
    assert admin.members() == {"W1": (35, ["A", "A/0"]), "W2": (35, ["B", "B/0"]), "W3": (35, ["A/1"])}
    assert admin.state() == "Stable"
    return w1, w2, w3


def _w2_kicked_out_and_w3_holds(admin: Admin, w1: Worker, w3: Worker, delay_ms: int) -> None:
    """W2 stops heartbeating; the real session timeout (2 s) removes it: epoch 36. W3 keeps the
    assignment, holding W2's work for it for ``delay_ms``."""
    started = time.monotonic()
    live([w1, w3], lambda: "W2" not in admin.members(), 10.0, "W2's session to expire")
    expired_after = time.monotonic() - started
    assert expired_after >= 1.5, f"W2 removed after {expired_after:.2f}s, before its session timeout"
    assert admin.epochs() == (36, 35)
    assert admin.targets() == {"W1": ["A", "A/0"], "W3": ["A/1"]}
    assert admin.members() == {"W1": (35, ["A", "A/0"]), "W3": (35, ["A/1"])}
    g = admin.describe()
    assert g.group_state == "Assigning" and g.assigning_member_id == "W3"

    assert w3.ok(owned=["A/1"]).should_compute_assignment is True
    prepared = w3.prepare()
    assert prepared.error_code == 0 and prepared.group_epoch == 36
    # Leaving BC0, BT1 unassigned without a scheduled follow-up is refused ...
    bad = w3.install({"W1": ["A", "A/0"], "W3": ["A/1"]}, prepared.group_epoch)
    assert bad.error_code == E.INVALID_ASSIGNMENT and "not assigned" in bad.error_message
    assert admin.epochs() == (36, 35)
    # ... with the delay it is installed at 36, W2's work held for it.
    ok = w3.install({"W1": ["A", "A/0"], "W3": ["A/1"]}, prepared.group_epoch, delay_ms=delay_ms)
    assert ok.error_code == 0
    assert admin.epochs() == (36, 36)
    assert admin.targets() == {"W1": ["A", "A/0"], "W3": ["A/1"]}
    r1, r3 = w1.ok(owned=["A", "A/0"]), w3.ok(owned=["A/1"])
    assert (r1.member_epoch, names(r1.assignment)) == (36, ["A", "A/0"])
    assert (r3.member_epoch, names(r3.assignment)) == (36, ["A/1"])
    assert admin.members() == {"W1": (36, ["A", "A/0"]), "W3": (36, ["A/1"])}
    assert admin.state() == "Stable"


def test_seed000_worker_leaving_the_group(pool: DaemonPool) -> None:
    d = pool.start()
    admin = Admin(d)
    w1, w2, w3 = _three_workers_at_35(d, admin)
    delay_ms = 1500
    _w2_kicked_out_and_w3_holds(admin, w1, w3, delay_ms)
    installed = time.monotonic()
    # Nobody comes back: when the delay elapses the coordinator starts a computation (epoch 37).
    live([w1, w3], lambda: admin.epochs() == (37, 36), 10.0, "the scheduled rebalance")
    assert time.monotonic() - installed >= delay_ms / 1000 * 0.8
    assert admin.describe().assigning_member_id == "W3"
    assert w3.ok(owned=["A/1"]).should_compute_assignment is True
    w3.compute({"W1": ["A", "A/0", "B"], "W3": ["A/1", "B/0"]})
    assert admin.epochs() == (37, 37)
    assert admin.targets() == {"W1": ["A", "A/0", "B"], "W3": ["A/1", "B/0"]}
    r1, r3 = w1.ok(owned=["A", "A/0"]), w3.ok(owned=["A/1"])
    assert (r1.member_epoch, names(r1.assignment)) == (37, ["A", "A/0", "B"])
    assert (r3.member_epoch, names(r3.assignment)) == (37, ["A/1", "B/0"])
    assert admin.members() == {"W1": (37, ["A", "A/0", "B"]), "W3": (37, ["A/1", "B/0"])}
    assert admin.state() == "Stable"
    for c in (admin, w1, w2, w3):
        c.close()


@pytest.mark.parametrize("rejoin", ["same-member-id", "static-instance-id"])
def test_seed000_worker_bounces(pool: DaemonPool, rejoin: str) -> None:
    d = pool.start()
    admin = Admin(d)
    static = rejoin == "static-instance-id"
    w1, w2, w3 = _three_workers_at_35(d, admin, w2_instance="worker-2" if static else None)
    _w2_kicked_out_and_w3_holds(admin, w1, w3, delay_ms=60_000)

    # W2 comes back with its old epoch: it was removed -> UNKNOWN_MEMBER_ID; it rejoins with 0.
    r = w2.hb(owned=["B", "B/0"])
    assert r.error_code == E.UNKNOWN_MEMBER_ID
    assert admin.epochs() == (36, 36)
    w2.epoch, w2.running = 0, []
    if static:  # a new process: a new member id, the same instance id
        w2.close()
        w2 = Worker(d, "W2-again", instance_id="worker-2")
    r = w2.ok(owned=[])
    new_id = w2.member_id
    assert r.member_id == new_id
    assert admin.epochs() == (37, 36)
    assert sorted(admin.members()) == sorted(["W1", new_id, "W3"])
    assert r.member_epoch == 36 and names(r.assignment) == []
    assert admin.state() == "Assigning"

    # W3, chosen, re-assigns the original assignment.
    assert admin.describe().assigning_member_id == "W3"
    assert w3.ok(owned=["A/1"]).should_compute_assignment is True
    w3.compute({"W1": ["A", "A/0"], new_id: ["B", "B/0"], "W3": ["A/1"]})
    assert admin.epochs() == (37, 37)
    assert admin.targets() == {"W1": ["A", "A/0"], new_id: ["B", "B/0"], "W3": ["A/1"]}
    if static:
        # A new process: the old one may still be stopping B, B/0, held for W2 until its session
        # deadline plus its stop budget (0.5 s); then W2-again gets them.
        live([w1, w2, w3], lambda: admin.members().get(new_id) == (37, ["B", "B/0"]), 10.0,
             "W2's hold to end")
    else:  # W2 itself, reporting it runs nothing: its hold was released at its join
        r2, r1, r3 = w2.ok(owned=[]), w1.ok(owned=["A", "A/0"]), w3.ok(owned=["A/1"])
        assert (r2.member_epoch, names(r2.assignment)) == (37, ["B", "B/0"])
        assert (r1.member_epoch, names(r1.assignment)) == (37, ["A", "A/0"])
        assert (r3.member_epoch, names(r3.assignment)) == (37, ["A/1"])
    assert admin.members() == {"W1": (37, ["A", "A/0"]), new_id: (37, ["B", "B/0"]),
                               "W3": (37, ["A/1"])}
    assert admin.state() == "Stable"
    if static:
        assert {m.member_id: m.instance_id for m in admin.describe().members}[new_id] == "worker-2"
    for c in (admin, w1, w2, w3):
        c.close()


# == abuse: frames, versions, slow-loris, connection limit ============================================


def raw(d: Daemon) -> socket.socket:
    return socket.create_connection((d.host, d.port), timeout=5)


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf
    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    """True when the daemon closes ``sock`` within ``timeout_s`` (EOF or reset)."""
    sock.settimeout(timeout_s)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def frame(api_key: int, version: int, correlation_id: int, body: bytes, header_version: int = 2) -> bytes:
    return encode_request_frame(api_key, version, correlation_id, "abuser", body,
                                header_version=header_version)


def unsupported_answer(sock: socket.socket, correlation_id: int) -> Any:
    """Read an ApiVersionsResponse v0 (header v0) and check its correlation id."""
    body = read_frame(sock)
    got, offset = parse_response_header(body, 0)
    assert got == correlation_id
    return codec.decode(APIS[ApiKey.API_VERSIONS].response_class(0), body, offset)[0]


def test_malformed_frames_unknown_apis_and_garbage_bodies(pool: DaemonPool) -> None:
    d = pool.start()
    assert_healthy(d)

    # A negative size, a frame too short for a header, a header with a string running past the
    # end: each closes that connection, nothing else.
    for junk in (b"\xff\xff\xff\xff", b"\0\0\0\0", struct.pack(">i", 3) + b"abc",
                 struct.pack(">i", 12) + struct.pack(">hhih", 18, 3, 1, 200) + b"xx"):
        with raw(d) as s:
            s.sendall(junk)
            assert closed_by_peer(s, 5.0), junk
        assert_healthy(d)

    # A declared size above the maximum (1 MiB) closes the connection at once, without the
    # daemon waiting for (or reading) the body: only the 4 size bytes are sent.
    for size in (1024 * 1024 + 1, 2**31 - 1):
        with raw(d) as s:
            s.sendall(struct.pack(">i", size))
            started = time.monotonic()
            assert closed_by_peer(s, 5.0)
            assert time.monotonic() - started < 2.0
        assert_healthy(d)
    # Exactly the maximum is a size the daemon accepts (and waits for): not closed.
    with raw(d) as s:
        s.sendall(struct.pack(">i", 1024 * 1024) + b"\0" * 16)
        assert not closed_by_peer(s, 0.5)
    assert_healthy(d)

    # Unknown API key, unknown version of known keys: an ApiVersionsResponse v0 with
    # UNSUPPORTED_VERSION (35), the same correlation id; the connection stays usable.
    with raw(d) as s:
        for corr, (key, version) in enumerate([(999, 0), (ApiKey.CONNECT_GROUP_HEARTBEAT, 5),
                                               (ApiKey.API_VERSIONS, 4), (-1, 0),
                                               (ApiKey.METADATA, 13)], start=100):
            s.sendall(frame(key, version, corr, b"\x00garbage"))
            r = unsupported_answer(s, corr)
            assert int(r.error_code) == E.UNSUPPORTED_VERSION, (key, version)
            listed = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in r.api_keys}
            assert listed[ApiKey.CONNECT_GROUP_HEARTBEAT] == (0, 0) and listed[ApiKey.API_VERSIONS] == (0, 3)
        # Still usable: a real ApiVersions v3 on the same connection.
        req = APIS[ApiKey.API_VERSIONS].request_class(3)(client_software_name="x",
                                                         client_software_version="1")
        s.sendall(frame(ApiKey.API_VERSIONS, 3, 7, codec.encode(req)))
        body = read_frame(s)
        got, offset = parse_response_header(body, 0)
        assert got == 7
        assert int(codec.decode(APIS[ApiKey.API_VERSIONS].response_class(3), body, offset)[0].error_code) == 0
    assert_healthy(d)

    # Unknown API keys are counted under one "api" label (bounded metric cardinality).
    assert metric(d, "connect_coordinator_requests_total", api="Unknown", error="UNSUPPORTED_VERSION") == 2
    assert metric(d, "connect_coordinator_requests_total", api="ConnectGroupHeartbeat",
                  error="UNSUPPORTED_VERSION") == 1

    # Connect APIs with a garbage body: INVALID_REQUEST in the API's own response.
    with raw(d) as s:
        for corr, key in enumerate([ApiKey.CONNECT_GROUP_HEARTBEAT, ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT,
                                    ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT,
                                    ApiKey.CONNECT_GROUP_ALTER_CONNECTORS], start=1):
            s.sendall(frame(key, 0, corr, b"\xff\xff\xff\xff\xff\xff\xff\xff\x07garbage"))
            body = read_frame(s)
            got, offset = parse_response_header(body, 1)
            assert got == corr
            resp = codec.decode(APIS[key].response_class(0), body, offset)[0]
            assert resp.error_code == E.INVALID_REQUEST, (key, resp)
            assert "malformed" in (resp.error_message or "")
        # An empty body, and a body with trailing bytes missing (truncated mid-field).
        s.sendall(frame(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, 50, b""))
        body = read_frame(s)
        got, offset = parse_response_header(body, 1)
        assert got == 50
        resp = codec.decode(APIS[ApiKey.CONNECT_GROUP_HEARTBEAT].response_class(0), body, offset)[0]
        assert resp.error_code == E.INVALID_REQUEST
        good = codec.encode(ConnectGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3))
        s.sendall(frame(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, 51, good[:-3]))
        body = read_frame(s)
        got, offset = parse_response_header(body, 1)
        resp = codec.decode(APIS[ApiKey.CONNECT_GROUP_HEARTBEAT].response_class(0), body, offset)[0]
        assert got == 51 and resp.error_code == E.INVALID_REQUEST
    assert_healthy(d)
    # ConnectGroupDescribe has no response-level error code: a garbage body closes the
    # connection, as for a Kafka API (Kafka's behaviour).
    with raw(d) as s:
        s.sendall(frame(ApiKey.CONNECT_GROUP_DESCRIBE, 0, 1, b"\xff\xff\xff\xff\xff"))
        assert closed_by_peer(s, 5.0)
    assert_healthy(d)
    # A Kafka API with a garbage body: the connection is closed (Kafka's behaviour).
    with raw(d) as s:
        s.sendall(frame(ApiKey.METADATA, 12, 1, b"\xff\xff\xff\xff\xff"))
        assert closed_by_peer(s, 5.0)
    assert_healthy(d)
    assert d.proc.poll() is None


def test_connection_order_half_close_and_close_after_bad_frame(pool: DaemonPool) -> None:
    d = pool.start(extra_args=["--partitions", "4"])
    describe = codec.encode(ConnectGroupDescribeRequest(group_ids=("g",)))
    versions = codec.encode(APIS[ApiKey.API_VERSIONS].request_class(3)(
        client_software_name="x", client_software_version="1"))

    # Pipelining: 3000 requests on one connection, answered in request order although describes
    # (served by the shards of several groups) and ApiVersions (answered at once) interleave and
    # the daemon pauses reading past socket.max.inflight.requests (128) in flight.
    n = 3000
    with raw(d) as s:
        got: list[int] = []

        def reader() -> None:
            for _ in range(n):
                body = read_frame(s)
                got.append(struct.unpack_from(">i", body)[0])

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        frames = []
        for corr in range(1, n + 1):
            if corr % 3:
                req = codec.encode(ConnectGroupDescribeRequest(group_ids=(f"g{corr % 7}",)))
                frames.append(frame(ApiKey.CONNECT_GROUP_DESCRIBE, 0, corr, req))
            else:
                frames.append(frame(ApiKey.API_VERSIONS, 3, corr, versions))
        s.sendall(b"".join(frames))
        t.join(30)
        assert not t.is_alive() and got == list(range(1, n + 1))

    # A client that half-closes after sending still gets its answers, then the daemon closes;
    # here the first request is a heartbeat parked for 300 ms, so it is surely still in flight
    # when the end of stream arrives.
    w1 = Worker(d, "W1")
    w1.ok()
    w1.compute({"W1": []})
    w1.ok()
    parked = codec.encode(w1.request(max_wait_ms=300))
    with raw(d) as s:
        s.sendall(frame(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, 1, parked)
                  + frame(ApiKey.API_VERSIONS, 3, 2, versions)
                  + frame(ApiKey.CONNECT_GROUP_DESCRIBE, 0, 3, describe))
        s.shutdown(socket.SHUT_WR)
        assert [struct.unpack_from(">i", read_frame(s))[0] for _ in range(3)] == [1, 2, 3]
        assert closed_by_peer(s, 5.0)
    w1.close()

    # A malformed frame closes the connection and ends it: a request after it in the same
    # packet is not executed.
    alter = ConnectGroupAlterConnectorsRequest(
        group_id="evil", upserts=(_alter.ConnectorSpec(name="E", task_count=1, config=()),),
        deletes=(), validate_only=False)
    with raw(d) as s:
        s.sendall(struct.pack(">i", 3) + b"abc"
                  + frame(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0, 9, codec.encode(alter)))
        assert closed_by_peer(s, 5.0)
    assert Admin(d, "evil").describe().error_code == E.GROUP_ID_NOT_FOUND
    assert_healthy(d)


def test_slow_loris_and_idle_connections(pool: DaemonPool) -> None:
    d = pool.start(extra_env={"CONNECT_COORDINATOR_SOCKET_IDLE_TIMEOUT_MS": "1000"})
    # A partial frame (size says 100, 10 bytes sent) held open; another trickles a byte at a time.
    loris = raw(d)
    loris.sendall(struct.pack(">i", 100) + b"\0" * 10)
    trickle = raw(d)
    trickle.sendall(struct.pack(">i", 200))
    started = time.monotonic()
    # Meanwhile the daemon answers other clients normally (and quickly).
    for _ in range(3):
        t0 = time.monotonic()
        assert_healthy(d)
        assert time.monotonic() - t0 < 1.0
    # Both are closed by the idle timeout (1 s; the reaper looks every 250 ms), although the
    # trickler keeps sending bytes: only a complete request counts as activity.
    closed = {"loris": False, "trickle": False}
    deadline = time.monotonic() + 6.0
    while not all(closed.values()) and time.monotonic() < deadline:
        if not closed["trickle"]:
            try:
                trickle.sendall(b"\0")
            except (BrokenPipeError, ConnectionResetError):
                closed["trickle"] = True
            else:
                closed["trickle"] = closed_by_peer(trickle, 0.2)
        if not closed["loris"]:
            closed["loris"] = closed_by_peer(loris, 0.05)
    elapsed = time.monotonic() - started
    assert closed == {"loris": True, "trickle": True}, elapsed
    assert elapsed >= 0.9, f"closed after {elapsed:.2f}s, before the idle timeout"
    loris.close()
    trickle.close()
    assert_healthy(d)
    # A long-polled heartbeat that outlasts the idle timeout: its connection is busy, not idle,
    # and idleness counts from the response, so the next request 0.5 s later is served.
    w1 = Worker(d, "W1")
    w1.ok()
    w1.compute({"W1": []})
    w1.ok()
    p = Parked(w1, 1200)
    r = p.result()
    assert r.error_code == 0 and p.returned is not None and p.returned - p.sent >= 1.0
    time.sleep(0.5)  # idle, but for less than the idle timeout
    (g,) = w1.client.call(ConnectGroupDescribeRequest(group_ids=("g",))).groups
    assert [m.member_id for m in g.members] == ["W1"]
    w1.close()
    # An idle client that does send complete requests is not reaped while it is active.
    with AdminClient(d.host, d.port) as c:
        for _ in range(6):
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=("nothing",))).groups
            assert g.error_code == E.GROUP_ID_NOT_FOUND
            time.sleep(0.3)
    assert_healthy(d)


def test_connection_limit(pool: DaemonPool) -> None:
    d = pool.start(extra_env={"CONNECT_COORDINATOR_SOCKET_MAX_CONNECTIONS": "3"})
    clients = [AdminClient(d.host, d.port, timeout_s=5) for _ in range(3)]
    for c in clients:
        (g,) = c.call(ConnectGroupDescribeRequest(group_ids=("g",))).groups
        assert g.error_code == E.GROUP_ID_NOT_FOUND
    # The fourth is closed at accept; the three keep being served.
    for _ in range(3):
        with pytest.raises(AdminError), AdminClient(d.host, d.port, timeout_s=5) as extra:
            extra.call(ConnectGroupDescribeRequest(group_ids=("g",)))
        for c in clients:
            assert c.call(ConnectGroupDescribeRequest(group_ids=("g",))).groups[0].group_id == "g"
    assert d.proc.poll() is None
    # A slot frees up when a client leaves.
    clients.pop().close()

    def fresh_client_served() -> bool:
        try:
            with AdminClient(d.host, d.port, timeout_s=5) as c:
                c.call(ConnectGroupDescribeRequest(group_ids=("g",)))
            return True
        except AdminError:
            return False

    wait_until(fresh_client_served, 5.0, "a freed connection slot")
    for c in clients:
        c.close()
    wait_until(lambda: metric(d, "connect_coordinator_connections") == 0, 5.0, "connections to close")
    assert_healthy(d)


def test_admin_client_survives_a_bad_peer() -> None:
    """The CLI's client reports a peer's bad frame sizes as AdminError (exit 1), never by
    allocating a declared size or raising something else."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        host, port = server.getsockname()
        for reply in (b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff" + b"\0" * 10):
            def serve(reply: bytes = reply) -> None:
                conn, _ = server.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(reply)
            t = threading.Thread(target=serve, daemon=True)
            t.start()
            with AdminClient(host, port, timeout_s=5) as c, pytest.raises(AdminError):
                c.call(ConnectGroupDescribeRequest(group_ids=("g",)))
            t.join(5)


# == metrics ==========================================================================================


def test_metrics_over_http(pool: DaemonPool) -> None:
    # Per-group series only for the groups named in metrics.groups (tests/test_limits.py).
    d = pool.start(extra_args=["--partitions", "3"],
                   extra_env={"CONNECT_COORDINATOR_METRICS_GROUPS": "g,other"})
    assert d.partitions == 3
    m = scrape(d)
    assert m[("connect_coordinator_partitions", frozenset({("state", "active")}))] == 3
    assert m[("connect_coordinator_partitions", frozenset({("state", "loading")}))] == 0
    assert m[("connect_coordinator_partitions", frozenset({("state", "failed")}))] == 0
    assert m[("connect_coordinator_groups", frozenset({("type", "connect")}))] == 0

    def hb_count(error: str = "NONE") -> float:
        return metric(d, "connect_coordinator_requests_total", api="ConnectGroupHeartbeat", error=error) or 0

    admin = Admin(d)
    assert admin.alter({"A": 1}).error_code == 0
    w1 = Worker(d, "W1")
    assert w1.ok().should_compute_assignment is True
    assert metric(d, "connect_coordinator_connect_groups", state="Assigning") == 1
    w1.compute({"W1": ["A", "A/0"]})
    assert metric(d, "connect_coordinator_connect_groups", state="Reconciling") == 1
    w1.ok()
    assert admin.state() == "Stable"
    m = scrape(d)
    assert m[("connect_coordinator_groups", frozenset({("type", "connect")}))] == 1
    assert m[("connect_coordinator_connect_groups", frozenset({("state", "Stable")}))] == 1
    assert m[("connect_coordinator_connect_groups", frozenset({("state", "Assigning")}))] == 0
    assert m[("connect_coordinator_group_members", frozenset({("group", "g")}))] == 1
    assert m[("connect_coordinator_members", frozenset())] == 1
    assert m[("connect_coordinator_rebalance_total", frozenset())] >= 1
    assert m[("connect_coordinator_heartbeat_parked", frozenset())] == 0
    assert m[("connect_coordinator_connections", frozenset())] == 2

    # Request counts per API and error, counted exactly.
    before = hb_count()
    for _ in range(5):
        w1.ok()
    assert hb_count() == before + 5
    w2 = Worker(d, "W2")
    w2.ok()
    assert metric(d, "connect_coordinator_group_members", group="g") == 2
    unknown_before = hb_count("UNKNOWN_MEMBER_ID")
    stranger = w2.client.call(ConnectGroupHeartbeatRequest(group_id="g", member_id="nobody", member_epoch=4))
    assert stranger.error_code == E.UNKNOWN_MEMBER_ID
    assert hb_count("UNKNOWN_MEMBER_ID") == unknown_before + 1
    assert (metric(d, "connect_coordinator_requests_total", api="ConnectGroupAlterConnectors", error="NONE")
            == 1)
    assert (metric(d, "connect_coordinator_requests_total", api="ConnectGroupPrepareAssignment",
                   error="NONE") == 1)
    assert (metric(d, "connect_coordinator_requests_total", api="ConnectGroupInstallAssignment",
                   error="NONE") == 1)
    assert (metric(d, "connect_coordinator_request_latency_seconds_count", api="ConnectGroupHeartbeat")
            == sum(v for (n, labels), v in scrape(d).items()
                   if n == "connect_coordinator_requests_total"
                   and ("api", "ConnectGroupHeartbeat") in labels))
    # A second group in another state is counted too.
    assert Admin(d, "other").alter({"X": 0}).error_code == 0
    m = scrape(d)
    assert m[("connect_coordinator_groups", frozenset({("type", "connect")}))] == 2
    assert m[("connect_coordinator_connect_groups", frozenset({("state", "Empty")}))] == 1
    assert m[("connect_coordinator_group_members", frozenset({("group", "other")}))] == 0
    for c in (admin, w1, w2):
        c.close()


# == long poll ========================================================================================


class Parked:
    """A heartbeat sent on its own thread; records when its answer arrived."""

    def __init__(self, worker: Worker, max_wait_ms: int, owned: Iterable[str] | None = None) -> None:
        self.worker = worker
        self.response: Any = None
        self.error: BaseException | None = None
        self.sent = time.monotonic()
        self.returned: float | None = None
        req = worker.request(owned, max_wait_ms=max_wait_ms)
        self.thread = threading.Thread(target=self._run, args=(req,), daemon=True)
        self.thread.start()

    def _run(self, req: Any) -> None:
        try:
            self.response = self.worker.client.call(req)
        except BaseException as exc:  # surfaced by result()
            self.error = exc
        self.returned = time.monotonic()

    def result(self, timeout_s: float = 15.0) -> Any:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the parked heartbeat never returned"
        if self.error is not None:
            raise self.error
        return self.worker.absorb(self.response)


def parked_now(d: Daemon) -> float:
    return metric(d, "connect_coordinator_heartbeat_parked") or 0


def park(d: Daemon, w: Worker, max_wait_ms: int, owned: Iterable[str] | None = None) -> Parked:
    before = parked_now(d)
    p = Parked(w, max_wait_ms, owned)
    wait_until(lambda: parked_now(d) >= before + 1, 5.0, f"{w.member_id}'s heartbeat to park")
    assert p.returned is None
    return p


def woken(record: Callable[[str, object], None], name: str, p: Parked, change_sent: float,
          change_answered: float, max_wait_ms: int) -> Any:
    """Assert the parked heartbeat returned because of the change: after it was sent, within 1 s
    of its answer, well before MaxWaitMs. Records (pytest's record_property: the JUnit XML) and
    prints the latency."""
    r = p.result()
    assert p.returned is not None
    assert p.returned >= change_sent, f"{name}: returned before the change was even sent"
    latency = p.returned - change_answered
    assert latency < 1.0, f"{name}: returned {latency:.3f}s after the change"
    assert p.returned - p.sent < max_wait_ms / 1000 * 0.9
    record(f"long-poll wake-up ms: {name}", round(latency * 1000, 3))
    print(f"\nlong-poll wake-up {name}: {latency * 1000:.2f} ms after the change was answered "
          f"({(p.returned - change_sent) * 1000:.2f} ms after it was sent)")
    return r


def timed(call: Callable[[], Any]) -> tuple[Any, float, float]:
    sent = time.monotonic()
    r = call()
    return r, sent, time.monotonic()


def test_long_poll_wakes_on_change(pool: DaemonPool, record_property: Any) -> None:
    # A session timeout of 10 s so that MaxWaitMs 5000 is not capped (the cap is session - interval).
    d = pool.start(extra_env={"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "10000"})
    admin = Admin(d)
    assert admin.alter({"A": 2, "B": 1}).error_code == 0
    w1, w2 = Worker(d, "W1"), Worker(d, "W2")
    w1.ok()
    w1.compute({"W1": SEED000_ITEMS})
    assert w1.ok().member_epoch == 1 and w1.running == SEED000_ITEMS

    # 1. W1 parked; W2 joins, W1 is (again) the one to compute: W1's heartbeat returns at once.
    p = park(d, w1, 5000)
    r2, sent, answered = timed(w2.ok)
    assert r2.member_epoch == 1
    r = woken(record_property, "W2 joins -> W1 told to compute", p, sent, answered, 5000)
    assert r.error_code == 0 and r.should_compute_assignment is True and r.member_epoch == 1

    # 2. W2 parked (epoch 1, nothing); W1 installs a target giving W2 BC0 and BT1: W2 moves to
    #    epoch 2 (its items still W1's): answered at once.
    p = park(d, w2, 5000, owned=[])
    prepared = w1.prepare()
    assert prepared.error_code == 0
    installed, sent, answered = timed(
        lambda: w1.install({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]}, prepared.group_epoch))
    assert installed.error_code == 0
    r = woken(record_property, "install -> W2 moves to the new epoch", p, sent, answered, 5000)
    assert r.error_code == 0 and r.member_epoch == 2 and not names(r.assignment)

    # 3. W2 parked again, waiting for BC0, BT1; W1 is told to revoke them, then acknowledges:
    #    the release wakes W2 with its items.
    p = park(d, w2, 5000)
    r = w1.ok(owned=SEED000_ITEMS)
    assert r.member_epoch == 1 and names(r.assignment) == ["A", "A/0", "A/1"]
    # (the revocation request alone gives W2 nothing: it is still parked)
    assert parked_now(d) == 1 and p.returned is None
    ack, sent, answered = timed(lambda: w1.ok(owned=["A", "A/0", "A/1"]))
    assert ack.member_epoch == 2
    r = woken(record_property, "W1 releases -> W2 gets its items", p, sent, answered, 5000)
    assert r.error_code == 0 and r.member_epoch == 2 and names(r.assignment) == ["B", "B/0"]

    # 4. A parked W1 is told to compute when connectors change (a new group epoch).
    p = park(d, w1, 5000, owned=["A", "A/0", "A/1"])
    altered, sent, answered = timed(lambda: admin.alter({"C": 1}))
    assert altered.error_code == 0 and altered.group_epoch == 3
    r = woken(record_property, "connector added -> W1 told to compute", p, sent, answered, 5000)
    assert r.should_compute_assignment is True and r.member_epoch == 2

    # A newer heartbeat of the same member (another connection) supersedes the parked one,
    # which is answered at once.
    p = park(d, w2, 5000)
    with AdminClient(d.host, d.port) as other:
        newer, sent, answered = timed(lambda: other.call(w2.request(["B", "B/0"])))
    assert newer.error_code == 0 and newer.member_epoch == 2
    r = woken(record_property, "superseded by a newer heartbeat", p, sent, answered, 5000)
    assert r.error_code == 0 and r.member_epoch == 2

    # No change: a parked heartbeat comes back after about MaxWaitMs, same epoch, nothing new.
    w1.compute({"W1": ["A", "A/0", "A/1", "C", "C/0"], "W2": ["B", "B/0"]})
    w1.ok(owned=["A", "A/0", "A/1"])
    w2.ok(owned=["B", "B/0"])
    assert admin.state() == "Stable"
    p = Parked(w2, 1500)
    r = p.result()
    assert p.returned is not None
    waited = p.returned - p.sent
    assert waited >= 1.5 * 0.9, f"returned after {waited:.3f}s"
    assert waited < 5.0
    assert r.error_code == 0 and r.member_epoch == 3 and r.assignment is None
    assert r.should_compute_assignment is False
    print(f"\nlong-poll without change: answered after {waited * 1000:.0f} ms (MaxWaitMs 1500)")
    for c in (admin, w1, w2):
        c.close()


def test_long_poll_capped_below_session_timeout(pool: DaemonPool) -> None:
    """MaxWaitMs above the session timeout is capped (session 2000 - interval 200 = 1800 ms),
    so a parked member never loses its session while it waits."""
    d = pool.start()
    w1 = Worker(d, "W1")
    w1.ok()
    w1.compute({"W1": []})
    w1.ok()
    for _ in range(2):  # twice in a row: the member's session is kept by the parked heartbeats
        p = Parked(w1, 5000)
        r = p.result()
        assert p.returned is not None
        waited = p.returned - p.sent
        assert 1.8 * 0.9 <= waited < 4.5, waited
        assert r.error_code == 0 and r.member_epoch == 1
    assert Admin(d).members() == {"W1": (1, [])}
    w1.close()


# == Kafka client interop =============================================================================


def test_kafka_python_admin_client(pool: DaemonPool) -> None:
    from kafka import KafkaAdminClient

    d = pool.start()
    admin = Admin(d)
    assert admin.alter({"A": 1}).error_code == 0
    assert Admin(d, "idle-group").alter({"X": 0}).error_code == 0
    w1 = Worker(d, "W1")
    w1.ok(worker_url="http://w1:8083")
    w1.compute({"W1": ["A", "A/0"]})
    w1.ok()
    assert admin.state() == "Stable"

    kafka = KafkaAdminClient(bootstrap_servers=d.bootstrap, client_id="kafka-python-e2e",
                             request_timeout_ms=5000)
    try:
        listed = sorted(kafka.list_groups(), key=lambda g: g["group_id"])
        assert [(g["group_id"], g["protocol_type"], g["group_state"]) for g in listed] == [
            ("g", "connect", "Stable"), ("idle-group", "connect", "Empty")]
        stable = kafka.list_groups(states_filter=["Stable"])
        assert [g["group_id"] for g in stable] == ["g"]
        described = kafka.describe_groups(["g", "idle-group", "no-such-group"])
        g = described["g"]
        assert g["error"] is None and g["group_state"] == "Stable"
        assert g["protocol_type"] == "connect" and g["protocol_data"] == "incremental"
        assert [(m["member_id"], m["client_id"], m["client_host"]) for m in g["members"]] == [
            ("W1", "worker-W1", "127.0.0.1")]
        assert described["idle-group"]["group_state"] == "Empty"
        assert described["idle-group"]["members"] == []
        assert described["no-such-group"]["group_state"] == "Dead"
    finally:
        kafka.close()
    # Kafka's DescribeGroups over our own client: an invalid (empty) group id is that group's
    # error, not a "Dead" group without error.
    with AdminClient(d.host, d.port) as c:
        resp = c.call(APIS[ApiKey.DESCRIBE_GROUPS].request_class(5)(
            groups=("", "g"), include_authorized_operations=False))
        assert [(g.group_id, int(g.error_code), g.group_state) for g in resp.groups] == [
            ("", E.INVALID_GROUP_ID, ""), ("g", 0, "Stable")]
    assert_healthy(d)
    for c in (admin, w1):
        c.close()


# == CLI ==============================================================================================


def test_cli_admin_commands(pool: DaemonPool) -> None:
    # Each CLI run is a new Python process (~0.5 s): a long session keeps the idle member W1.
    d = pool.start(extra_env={"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "60000"})
    b = ["--bootstrap", d.bootstrap]

    def cli(*args: str, code: int = 0) -> str:
        r = run_cli(*args)
        assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
        return r.stdout if code == 0 else r.stderr

    out = cli("connectors", "create", "--group", "g", "src", "--tasks", "2",
              "--config", "connector.class=pkg:Source", *b)
    assert out.strip() == "ok: group g at epoch 0"
    cli("connectors", "create", "--group", "g", "sink", "--tasks", "1",
        "--config", "connector.class=pkg:Sink", *b)
    cli("connectors", "update", "--group", "g", "src", "--tasks", "3", "--config", "topic=t1", *b)
    listed = json.loads(cli("connectors", "list", "--group", "g", "--json", *b))
    # (no worker: the target state is RUNNING, nothing runs)
    assert listed == [{"name": "sink", "tasks": 1, "config": {"connector.class": "pkg:Sink"},
                       "state": "RUNNING", "running_instances": 0, "instances": 2,
                       "overdue_instances": 0},
                      {"name": "src", "tasks": 3, "config": {"connector.class": "pkg:Source", "topic": "t1"},
                       "state": "RUNNING", "running_instances": 0, "instances": 4,
                       "overdue_instances": 0}]
    human = cli("connectors", "list", "--group", "g", *b).splitlines()
    assert human[0].split() == ["CONNECTOR", "TASKS", "TARGET", "RUNNING", "CONFIG"]
    assert human[2].split() == ["src", "3", "RUNNING", "0/4", "connector.class=pkg:Source,", "topic=t1"]
    # Connect's verbs: reserved config keys, read-modify-write through AlterConnectors.
    assert "reserved" in cli("connectors", "update", "--group", "g", "src", "--config",
                             "connect.target.state=PAUSED", *b, code=2)
    cli("connectors", "pause", "--group", "g", "src", *b)
    cli("connectors", "restart", "--group", "g", "src", "--task", "2", *b)
    cli("connectors", "restart", "--group", "g", "src", *b)
    desc = json.loads(cli("connectors", "describe", "--group", "g", "src", "--json", *b))
    assert (desc["state"], desc["restart_generation"], desc["task_restarts"]) == ("PAUSED", 1, {"2": 1})
    assert desc["plugin_config"] == {"connector.class": "pkg:Source", "topic": "t1"}
    text = cli("connectors", "describe", "--group", "g", "src", *b)
    assert "state: PAUSED" in text and "task 2: restart counter 1" in text
    cli("connectors", "stop", "--group", "g", "src", *b)
    assert "STOPPED" in cli("connectors", "list", "--group", "g", *b).splitlines()[2]
    cli("connectors", "resume", "--group", "g", "src", *b)
    listed = cli("connectors", "list", "--group", "g", *b).splitlines()
    assert listed[2].split()[:4] == ["src", "3", "RUNNING", "0/4"]
    assert "does not exist" in cli("connectors", "stop", "--group", "g", "nope", *b, code=1)
    assert "no task 3" in cli("connectors", "restart", "--group", "g", "src", "--task", "3", *b, code=1)
    # --validate-only changes nothing.
    assert cli("connectors", "delete", "--group", "g", "sink", "--validate-only", *b).startswith("valid:")
    assert len(json.loads(cli("connectors", "list", "--group", "g", "--json", *b))) == 2
    cli("connectors", "delete", "--group", "g", "sink", *b)
    assert [c["name"] for c in json.loads(cli("connectors", "list", "--group", "g", "--json", *b))] == ["src"]

    # A member, so that describe has something to show.
    w1 = Worker(d, "W1")
    w1.ok()
    w1.compute({"W1": ["src", "src/0", "src/1", "src/2"]})
    w1.ok()
    assert json.loads(cli("groups", "list", "--json", *b)) == [{"group": "g", "state": "Stable"}]
    assert cli("groups", "list", *b).splitlines()[1].split() == ["g", "Stable"]
    (g,) = json.loads(cli("groups", "describe", "g", "--json", *b))
    assert (g["group"], g["state"], g["group_epoch"], g["assignment_epoch"], g["assignor"]) == (
        "g", "Stable", 1, 1, "incremental")
    (m,) = g["members"]
    assert (m["member_id"], m["epoch"], m["state"], m["assignment"], m["target"]) == (
        "W1", 1, "Stable", ["src", "src/0", "src/1", "src/2"], ["src", "src/0", "src/1", "src/2"])
    assert g["coordinator"]["host"] == d.host and g["coordinator"]["port"] == d.port
    text = cli("groups", "describe", "g", *b)
    assert "GROUP g  state=Stable  epoch=1  assignment-epoch=1  assignor=incremental" in text
    assert f"coordinator: node {g['coordinator']['node_id']} at {d.host}:{d.port}" in text
    assert any(line.split()[:5] == ["W1", "-", "new", "1", "Stable"] for line in text.splitlines())

    # Errors from the coordinator: the protocol error name, exit 1.
    err = cli("connectors", "create", "--group", "g", "bad/name", "--tasks", "1",
              "--config", "connector.class=pkg:C", *b, code=1)  # (--tasks -1: the CLI's, exit 2)
    assert "INVALID_REQUEST" in err
    err = cli("groups", "describe", "nope", *b, code=1)
    assert "GROUP_ID_NOT_FOUND" in err
    err = cli("connectors", "update", "--group", "g", "missing", "--tasks", "1", *b, code=1)
    assert "does not exist" in err
    # Unreachable coordinator: exit 1 with a message; a usage error exits 2.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    err = cli("groups", "list", "--bootstrap", f"127.0.0.1:{free}", code=1)
    assert "cannot connect" in err
    assert "'nonsense' is not HOST:PORT" in cli("groups", "list", "--bootstrap", "nonsense", code=2)
    cli("connectors", "create", "--group", "g", "x", *b, code=2)  # --tasks is required
    # No connector.class: refused by the CLI (as Kafka Connect's REST API, 400), nothing created.
    for extra in ((), ("--validate-only",)):
        err = cli("connectors", "create", "--group", "g", "x", "--tasks", "1", *extra, *b, code=2)
        assert "needs --config connector.class=" in err, err
    assert "x" not in {c["name"] for c in json.loads(cli("connectors", "list", "--group", "g", "--json", *b))}
    assert_healthy(d)
    w1.close()


def test_serve_refuses_bad_settings(tmp_path: Path) -> None:
    data = tmp_path / "data"
    r = run_serve(data, ["--partitions", "0"])
    assert r.returncode == 2, r
    assert "configuration error" in r.stderr and "partitions" in r.stderr and "must be > 0" in r.stderr
    assert r.stdout == ""
    bad = tmp_path / "bad.toml"
    bad.write_text("partitions = [unclosed\n")
    r = run_serve(data, ["--config", str(bad)])
    assert r.returncode == 2 and "not valid TOML" in r.stderr, r
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('"no.such.setting" = 1\n')
    r = run_serve(data, ["--config", str(unknown)])
    assert r.returncode == 2 and "unknown setting 'no.such.setting'" in r.stderr, r
    r = run_serve(data, [], extra_env={"CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "5000"})
    assert r.returncode == 2 and "must be smaller than" in r.stderr, r
    r = run_serve(data, [], extra_env={"CONNECT_COORDINATOR_PARTITIONS": "many"})
    assert r.returncode == 2 and "CONNECT_COORDINATOR_PARTITIONS" in r.stderr, r
    # A listener address in use: cannot start, exit 1.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = run_serve(data, ["--listen", f"127.0.0.1:{busy.getsockname()[1]}"])
    assert r.returncode == 1 and "cannot start" in r.stderr, r


def test_restart_with_other_partition_count_is_refused(pool: DaemonPool) -> None:
    data = pool.base / "data"
    d = pool.start(data, extra_args=["--partitions", "4"])
    admin = Admin(d)
    assert admin.alter({"A": 1}).error_code == 0
    admin.close()
    d.stop()
    r = run_serve(data, ["--partitions", "5"])
    assert r.returncode == 2, r
    assert "4 partitions" in r.stderr and "Use 4" in r.stderr, r.stderr
    # The data is untouched: the right count starts and still has the connector.
    d = pool.start(data, extra_args=["--partitions", "4"])
    assert [c.name for c in Admin(d).describe().connectors] == ["A"]


# == shutdown and restart =============================================================================


def test_sigterm_answers_parked_heartbeat_and_data_survives_restart(pool: DaemonPool) -> None:
    env = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "10000"}
    data = pool.base / "data"
    d = pool.start(data, extra_env=env)
    admin = Admin(d)
    assert admin.alter({"A": 2, "B": 1}).error_code == 0
    w1, w2 = Worker(d, "W1"), Worker(d, "W2")
    w1.ok()
    w2.ok()
    w1.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    w1.ok()
    w2.ok()
    before = admin.describe()
    assert before.group_state == "Stable"
    admin.close()

    p = park(d, w1, 5000)
    sigterm = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    r = p.result()
    assert p.returned is not None and p.returned - sigterm < 3.0
    assert r.error_code == 0 and r.member_epoch == 2
    assert d.stop() == 0  # exit code 0
    with pytest.raises(AdminError):
        w1.hb()

    # Restart on the same data: connectors, members, epochs and assignments are all there.
    d = pool.start(data, extra_env=env)
    admin = Admin(d)
    after = admin.describe()
    assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
    assert [(c.name, c.task_count) for c in after.connectors] == [("A", 2), ("B", 1)]
    assert admin.members() == {"W1": (2, ["A", "A/0", "A/1"]), "W2": (2, ["B", "B/0"])}
    assert after.group_state == "Stable"
    # The members carry on with their epochs on new connections.
    w1 = Worker(d, "W1")
    w1.epoch = 2
    r = w1.ok(owned=["A", "A/0", "A/1"])
    assert r.member_epoch == 2
    # A crash (SIGKILL) loses nothing that was acknowledged (fsync before respond).
    assert admin.alter({"C": 1}).error_code == 0
    admin.close()
    w1.close()
    d.kill()
    d = pool.start(data, extra_env=env)
    admin = Admin(d)
    assert [c.name for c in admin.describe().connectors] == ["A", "B", "C"]
    assert sorted(admin.members()) == ["W1", "W2"]
    admin.close()
