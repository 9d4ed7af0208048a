"""``connect-coordinator groups list`` asks every coordinator node and merges.

A node's ListGroups lists only the groups of the partitions it owns (as Kafka), so the CLI
(``AdminSession.list_groups``) sends Metadata to the first bootstrap address that answers, then
ListGroups to every node listed, and merges: each group once, sorted by id; a node that cannot be
reached or answers an error is named on stderr after the others' groups are printed, exit 1.

A single daemon's Metadata lists only itself, so several nodes are made with
:class:`MetadataNode` — a KRPC node on a real socket whose Metadata lists two real daemons (and,
when asked to, itself, with ListGroups answers from a script) — as the bootstrap address.
"""

from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire import codec
from connect_wire.addresses import parse_bootstrap
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode as E
from connect_wire.framing import encode_response_frame, parse_request_header
from connect_wire.messages import ConnectGroupAlterConnectorsRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.admin import AdminClient, AdminSession
from coordinator.server.kafka_apis import build
from tests.daemon_fixture import Daemon, DaemonPool, run_cli
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


class MetadataNode(socketserver.ThreadingTCPServer):
    """Metadata lists ``brokers`` ((node id, host, port); ``None`` as the host: this node
    itself). ListGroups answers ``listings`` in turn ((error code, [(group, state)])), the last
    one from then on. ``seen`` records the API names asked, in order."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, brokers: list[tuple[int, str | None, int]],
                 listings: list[tuple[int, list[tuple[str, str]]]] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.brokers = brokers
        self.listings = listings or [(0, [])]
        self.seen: list[str] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def answer(self, api_key: int, version: int) -> Any:
        cls = APIS[api_key].response_class(version)
        with self.lock:
            self.seen.append(APIS[api_key].name)
            if api_key == ApiKey.METADATA:
                return build(cls, {
                    "throttle_time": 0, "cluster_id": "test", "controller_id": 0, "topics": [],
                    "cluster_authorized_operations": -2147483648,
                    "brokers": [{"node_id": i, "host": host or "127.0.0.1",
                                 "port": self.port if host is None else port, "rack": None}
                                for i, host, port in self.brokers]})
            assert api_key == ApiKey.LIST_GROUPS, APIS[api_key].name
            code, groups = self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]
            return build(cls, {"throttle_time": 0, "error_code": code, "groups": [
                {"group_id": g, "protocol_type": "connect", "group_state": s, "group_type": "connect"}
                for g, s in groups]})


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: MetadataNode = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        while True:
            size = _recv(sock, 4)
            if size is None:
                return
            frame = _recv(sock, struct.unpack(">i", size)[0])
            assert frame is not None
            api_key, version = struct.unpack_from(">hh", frame)
            api = APIS[api_key]
            header, offset = parse_request_header(frame, api.request_header_version(version) == 2)
            codec.decode(api.request_class(version), frame, offset)
            body = codec.encode(server.answer(api_key, version))
            sock.sendall(encode_response_frame(header.correlation_id, body,
                                               api.response_header_version(version)))


def _recv(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


@pytest.fixture
def nodes() -> Iterator[list[MetadataNode]]:
    made: list[MetadataNode] = []
    yield made
    for n in made:
        n.shutdown()
        n.server_close()


def create_groups(d: Daemon, *groups: str) -> None:
    """One connector in each group, on daemon ``d`` (its own coordinator)."""
    with AdminSession(parse_bootstrap(d.bootstrap)) as s:
        for g in groups:
            spec = _alter.ConnectorSpec(name="c", task_count=1, config=())
            req = ConnectGroupAlterConnectorsRequest(group_id=g, upserts=(spec,), validate_only=False)
            resp = s.group_call(g, req)
            assert int(resp.error_code) == 0, resp


def groups_list(*args: str, code: int = 0) -> tuple[str, str]:
    r = run_cli("groups", "list", *args)
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout, r.stderr


def test_groups_list_asks_every_node_and_merges(pool: DaemonPool, tmp_path: Path,
                                                nodes: list[MetadataNode]) -> None:
    d1 = pool.start(tmp_path / "one")
    d2 = pool.start(tmp_path / "two")
    create_groups(d1, "alpha", "moving")
    create_groups(d2, "beta", "moving")  # also on d2: as if listed by both during a move
    node = MetadataNode([(1, d1.host, d1.port), (2, d2.host, d2.port)])
    nodes.append(node)
    # Each daemon alone lists only its own groups ...
    for d, own in ((d1, ["alpha", "moving"]), (d2, ["beta", "moving"])):
        assert [g["group"] for g in json.loads(groups_list("--json", "--bootstrap", d.bootstrap)[0])] == own
    # ... and through a bootstrap whose Metadata lists both, the CLI asks both and merges.
    out, err = groups_list("--json", "--bootstrap", node.bootstrap)
    assert json.loads(out) == [{"group": "alpha", "state": "Empty"}, {"group": "beta", "state": "Empty"},
                               {"group": "moving", "state": "Empty"}], out
    assert err == ""
    assert node.seen == ["Metadata"]  # not listed in its own Metadata: not asked for groups
    text, _ = groups_list("--bootstrap", node.bootstrap)
    assert [line.split() for line in text.splitlines()] == [
        ["GROUP", "STATE"], ["alpha", "Empty"], ["beta", "Empty"], ["moving", "Empty"]]
    # A dead bootstrap entry first: Metadata comes from the next one that answers.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    out, _ = groups_list("--json", "--bootstrap", f"{dead},{node.bootstrap}")
    assert [g["group"] for g in json.loads(out)] == ["alpha", "beta", "moving"]

    # One node dead: the other's groups are printed, the dead one is named, exit 1.
    d2.kill()
    t0 = time.monotonic()
    out, err = groups_list("--json", "--bootstrap", node.bootstrap, code=1)
    took = time.monotonic() - t0
    assert json.loads(out) == [{"group": "alpha", "state": "Empty"}, {"group": "moving", "state": "Empty"}]
    assert "groups list is incomplete: 1 of 2 node(s) failed" in err, err
    assert f"node 2 at {d2.bootstrap}: cannot connect to {d2.bootstrap}" in err, err
    assert f"node 1 at {d1.bootstrap}" not in err, err
    assert took < 5, took  # reported at once, not retried until --timeout
    text, err = groups_list("--bootstrap", node.bootstrap, code=1)
    assert [line.split() for line in text.splitlines()] == [
        ["GROUP", "STATE"], ["alpha", "Empty"], ["moving", "Empty"]]
    assert f"node 2 at {d2.bootstrap}" in err
    # Both dead: nothing listed, both named.
    d1.kill()
    out, err = groups_list("--json", "--bootstrap", node.bootstrap, code=1)
    assert json.loads(out) == []
    assert "2 of 2 node(s) failed" in err and f"node 1 at {d1.bootstrap}" in err, err


def test_groups_list_retries_a_loading_node_and_reports_an_error_answer(
        pool: DaemonPool, nodes: list[MetadataNode]) -> None:
    d = pool.start()
    create_groups(d, "alpha", "shared")
    # Node 0 (the fake itself) is loading at first, then lists "shared" as Stable and one of
    # its own; the daemon (node 5) lists "shared" as Empty: node 0's state wins (lowest id).
    node = MetadataNode([(5, d.host, d.port), (0, None, 0)], listings=[
        (E.COORDINATOR_LOAD_IN_PROGRESS, []), (E.COORDINATOR_NOT_AVAILABLE, []),
        (0, [("shared", "Stable"), ("zeta", "Reconciling")])])
    nodes.append(node)
    with AdminSession(parse_bootstrap(node.bootstrap), timeout_s=5) as s:
        slept: list[float] = []
        s.sleep = lambda t: (slept.append(t), time.sleep(t))  # type: ignore[func-returns-value]
        listing = s.list_groups()
    assert [(n.node_id, n.port) for n in listing.nodes] == [(0, node.port), (5, d.port)]
    assert listing.groups == [("alpha", "Empty"), ("shared", "Stable"), ("zeta", "Reconciling")]
    assert listing.failures == []
    assert node.seen == ["Metadata", "ListGroups", "ListGroups", "ListGroups"]
    assert len(slept) == 2 and max(slept) <= 1.0

    # An error answer (a partition that failed): its groups still count, the node is named.
    node.listings = [(E.NOT_COORDINATOR, [("zeta", "Stable")])]
    out, err = groups_list("--json", "--bootstrap", node.bootstrap, code=1)
    assert json.loads(out) == [{"group": "alpha", "state": "Empty"}, {"group": "shared", "state": "Empty"},
                               {"group": "zeta", "state": "Stable"}]
    assert f"node 0 at {node.bootstrap}: NOT_COORDINATOR: some partitions did not answer" in err, err
    # Still loading after --timeout: reported with what it listed.
    node.listings = [(E.COORDINATOR_LOAD_IN_PROGRESS, [])]
    out, err = groups_list("--json", "--timeout", "1", "--bootstrap", node.bootstrap, code=1)
    assert [g["group"] for g in json.loads(out)] == ["alpha", "shared"]
    assert "COORDINATOR_LOAD_IN_PROGRESS: some of its partitions were still loading after 1s" in err


def test_groups_list_on_one_node_asks_the_node_that_answered(pool: DaemonPool, tmp_path: Path) -> None:
    """A single node's Metadata lists only itself: it is asked on the connection Metadata came
    on, even when its advertised listener is elsewhere (as before merging existed)."""
    b = pool.start(tmp_path / "b")
    a = pool.start(tmp_path / "a", extra_args=["--advertised-listener", b.bootstrap])
    create_groups(b, "on-b")
    with AdminClient(a.host, a.port) as c:  # directly at A (FindCoordinator at A names B)
        spec = _alter.ConnectorSpec(name="c", task_count=1, config=())
        r = c.call(ConnectGroupAlterConnectorsRequest(group_id="on-a", upserts=(spec,),
                                                      validate_only=False))
        assert int(r.error_code) == 0
    out, err = groups_list("--json", "--bootstrap", a.bootstrap)
    assert json.loads(out) == [{"group": "on-a", "state": "Empty"}] and err == ""


def test_a_partition_no_live_node_serves_makes_the_listing_fail_naming_the_node(
        pool: DaemonPool, tmp_path: Path, etcd_endpoint: str) -> None:  # noqa: F811
    """A node on etcd lists the partitions it serves; a partition another live node owns is
    that node's to list, but one that no live node serves (its owner key held by a node that
    is gone: a failover not done yet, as under a frozen node or etcd leader) made the answer
    partial without a word (exit 0, 9-12 of 15 groups in the HA soak). It answers
    COORDINATOR_NOT_AVAILABLE with the groups it has; the CLI retries, then prints them and
    names the node on stderr, exit 1."""
    import asyncio

    from etcd3aio import Etcd3Client

    from coordinator.runtime.etcd_store import owner_key
    from coordinator.runtime.partitioner import partition_for

    prefix = f"/groups-list-{time.time_ns()}"

    async def hold_partition_0() -> None:  # as a node 99 that froze and is no longer registered
        async with Etcd3Client([etcd_endpoint]) as c:
            await c.kv.put(owner_key(prefix, 0), json.dumps({"node": "99"}).encode())
    asyncio.run(hold_partition_0())
    d = pool.start(tmp_path / "node1", extra_args=[
        "--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", prefix,
        "--node-id", "1", "--partitions", "3"])
    served = [g for g in (f"g{k}" for k in range(40)) if partition_for(g, 3) != 0][:4]
    deadline = time.monotonic() + 60
    while True:  # partitions 1 and 2 are acquired after the start
        try:
            create_groups(d, *served)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    out, err = groups_list("--bootstrap", d.bootstrap, "--timeout", "2", code=1)
    assert sorted(line.split()[0] for line in out.splitlines()[1:]) == sorted(served), out
    assert "node 1 at" in err and "COORDINATOR_NOT_AVAILABLE" in err, err
    assert "no live node serving them" in err, err
