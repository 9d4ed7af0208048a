"""Several bootstrap addresses: parsing, dead entries skipped, the group's
coordinator found with FindCoordinator and followed, retries on NOT_COORDINATOR /
COORDINATOR_NOT_AVAILABLE, for the admin CLI and the worker.

Real daemons throughout. A single daemon always answers for itself, so "another node owns the
group" is made two ways: a real daemon whose advertised listener is a *second* real daemon
(FindCoordinator at the first names the second), and, for the error codes no single daemon gives
today, :class:`MovingNode` — a KRPC node on a real socket that says the coordinator is not
available, then names itself and answers NOT_COORDINATOR, then names the real daemon.
"""

from __future__ import annotations

import asyncio
import json
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire import codec
from connect_wire.addresses import format_addresses, parse_bootstrap
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode as E
from connect_wire.framing import encode_response_frame, parse_request_header
from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient, AdminError, AdminSession
from coordinator.server.kafka_apis import build
from tests.daemon_fixture import ROOT, DaemonPool, daemon_env, run_cli
from worker_client.client import CoordinatorClient


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def dead_ports(n: int) -> list[str]:
    """Addresses nobody listens on (bound, then closed: connection refused)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for s in socks:
            s.close()


def cli(*args: str, code: int = 0) -> str:
    r = run_cli(*args)
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    return r.stdout if code == 0 else r.stderr


def connectors_at(host: str, port: int, group: str) -> list[str]:
    with AdminClient(host, port, timeout_s=10) as c:
        (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(group,))).groups
        return [x.name for x in g.connectors]


# == parsing ========================================================================================


def test_parse_bootstrap() -> None:
    assert parse_bootstrap("a:1,b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap(["a:1, b:2", "c:3", "a:1"]) == [("a", 1), ("b", 2), ("c", 3)]
    assert parse_bootstrap("[::1]:9092,h:1") == [("::1", 9092), ("h", 1)]
    assert format_addresses([("::1", 9092), ("h", 1)]) == "[::1]:9092, h:1"
    for text, named in (("a:1,nonsense", "'nonsense'"), ("a:1,b:0", "'b:0'"), ("a:1,b:x", "'b:x'"),
                        ("a:1,", "empty address"), ("::1:9092", "IPv6"), ("a:70000", "out of range")):
        with pytest.raises(ValueError, match=named):
            parse_bootstrap(text)


def test_cli_usage_errors_name_the_bad_entry() -> None:
    for bad, named in (("127.0.0.1:9092,nonsense", "'nonsense'"), ("127.0.0.1:9092,", "empty address"),
                       ("h:99999", "out of range")):
        err = cli("groups", "list", "--bootstrap", bad, code=2)
        assert "argument --bootstrap: " in err and named in err, err
        err = cli("connectors", "list", "--group", "g", "--bootstrap", "127.0.0.1:1",
                  "--bootstrap", bad, code=2)
        assert named in err, err
        r = subprocess.run([sys.executable, "-m", "worker_client.cli", "run", "--group", "g",
                            "--bootstrap", bad], capture_output=True, text=True, env=daemon_env(),
                           cwd=ROOT, timeout=30, check=False)
        assert r.returncode == 2 and "argument --bootstrap: " in r.stderr and named in r.stderr, r


# == admin CLI against real daemons =================================================================


def test_admin_cli_skips_dead_bootstrap_entries(pool: DaemonPool) -> None:
    d = pool.start()
    dead = dead_ports(2)
    listed = ",".join([*dead, d.bootstrap])
    out = cli("connectors", "create", "--group", "g", "src", "--tasks", "2", "--config",
              "connector.class=pkg:Source", "--bootstrap", listed)
    assert out.strip() == "ok: group g at epoch 0"
    # Repeated flags, comma-separated or not, are one list in order.
    both = ["--bootstrap", dead[0], "--bootstrap", f"{dead[1]},{d.bootstrap}"]
    assert [c["name"] for c in json.loads(cli("connectors", "list", "--group", "g", "--json", *both))] == [
        "src"]
    (g,) = json.loads(cli("groups", "describe", "g", "--json", *both))
    assert g["group"] == "g" and [c["name"] for c in g["connectors"]] == ["src"]
    assert json.loads(cli("groups", "list", "--json", *both)) == [{"group": "g", "state": "Empty"}]
    cli("connectors", "delete", "--group", "g", "src", *both)
    assert connectors_at(d.host, d.port, "g") == []


def test_admin_cli_all_dead_names_every_address() -> None:
    dead = dead_ports(3)
    for args in (["groups", "list"], ["groups", "describe", "g"],
                 ["connectors", "create", "--group", "g", "x", "--tasks", "1",
                  "--config", "connector.class=p:C"]):
        err = cli(*args, "--bootstrap", ",".join(dead), code=1)
        assert "no coordinator answered at " + ", ".join(dead) in err, err
        assert all(f"cannot connect to {a}" in err for a in dead), err
        assert "Traceback" not in err


def test_admin_cli_follows_find_coordinator_to_another_node(pool: DaemonPool, tmp_path: Path) -> None:
    # B coordinates; A's advertised listener is B, so FindCoordinator at A names B.
    b = pool.start(tmp_path / "b")
    a = pool.start(tmp_path / "a", extra_args=["--advertised-listener", b.bootstrap])
    out = cli("connectors", "create", "--group", "g", "src", "--tasks", "1", "--config",
              "connector.class=pkg:Source", "--bootstrap", a.bootstrap)
    assert out.startswith("ok: group g")
    assert connectors_at(b.host, b.port, "g") == ["src"]
    assert connectors_at(a.host, a.port, "g") == []  # A itself was never asked to change it
    (g,) = json.loads(cli("groups", "describe", "g", "--json", "--bootstrap", a.bootstrap))
    assert [c["name"] for c in g["connectors"]] == ["src"]


# == a node that is not (yet) the coordinator =======================================================


class MovingNode(socketserver.ThreadingTCPServer):
    """A KRPC node on a real socket. FindCoordinator answers, in turn: COORDINATOR_NOT_AVAILABLE,
    this node, then ``target`` from then on. Group requests (Describe, AlterConnectors) are
    answered NOT_COORDINATOR. ``seen`` records (api name, answer) in order."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.target = target
        self.finds = 0
        self.drop_alter = False  # close the connection on AlterConnectors instead of answering
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def answer(self, api_key: int, version: int, request: Any) -> Any:
        cls = APIS[api_key].response_class(version)
        with self.lock:
            if api_key == ApiKey.FIND_COORDINATOR:
                self.finds += 1
                if self.finds == 1:
                    c = {"error_code": E.COORDINATOR_NOT_AVAILABLE, "node_id": -1, "host": "",
                         "port": -1, "error_message": "no owner yet"}
                    what = "COORDINATOR_NOT_AVAILABLE"
                elif self.finds == 2:
                    c = {"error_code": 0, "node_id": 7, "host": "127.0.0.1",
                         "port": self.server_address[1], "error_message": None}
                    what = "self"
                else:
                    c = {"error_code": 0, "node_id": 0, "host": self.target[0],
                         "port": self.target[1], "error_message": None}
                    what = "target"
                self.seen.append(("FindCoordinator", what))
                keys = request.coordinator_keys
                return build(cls, {"coordinators": [{"key": k, **c} for k in keys]})
            self.seen.append((APIS[api_key].name, "NOT_COORDINATOR"))
            if api_key == ApiKey.CONNECT_GROUP_DESCRIBE:
                return build(cls, {"groups": [{"group_id": g, "error_code": E.NOT_COORDINATOR,
                                               "error_message": "moved"} for g in request.group_ids]})
            return build(cls, {"error_code": E.NOT_COORDINATOR, "error_message": "moved"})


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: MovingNode = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        while True:
            size_bytes = _recv(sock, 4)
            if size_bytes is None:
                return
            frame = _recv(sock, struct.unpack(">i", size_bytes)[0])
            assert frame is not None
            api_key, version = struct.unpack_from(">hh", frame)
            api = APIS[api_key]
            header, offset = parse_request_header(frame, api.request_header_version(version) == 2)
            request = codec.decode(api.request_class(version), frame, offset)[0]
            if server.drop_alter and api_key == ApiKey.CONNECT_GROUP_ALTER_CONNECTORS:
                with server.lock:
                    server.seen.append((api.name, "dropped"))
                return  # the connection closes with the request unanswered
            body = codec.encode(server.answer(api_key, version, request))
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
def moving(pool: DaemonPool) -> Iterator[tuple[MovingNode, Any]]:
    d = pool.start()
    node = MovingNode((d.host, d.port))
    try:
        yield node, d
    finally:
        node.shutdown()
        node.server_close()


def test_admin_retries_until_the_coordinator_answers(moving: tuple[MovingNode, Any]) -> None:
    node, d = moving
    out = cli("connectors", "create", "--group", "g", "src", "--tasks", "1", "--config",
              "connector.class=pkg:Source", "--bootstrap", node.bootstrap)
    assert out.startswith("ok: group g")
    assert connectors_at(d.host, d.port, "g") == ["src"]
    # Not available -> back off, ask again; named itself -> NOT_COORDINATOR -> ask again; then
    # the daemon, which answered the describe (create checks first) and the change.
    assert node.seen[:4] == [("FindCoordinator", "COORDINATOR_NOT_AVAILABLE"), ("FindCoordinator", "self"),
                             ("ConnectGroupDescribe", "NOT_COORDINATOR"), ("FindCoordinator", "target")]
    assert node.seen[4:] == [("FindCoordinator", "target")]  # the change: found at once


def test_admin_session_gives_up_after_its_timeout(pool: DaemonPool) -> None:
    d = pool.start()
    node = MovingNode((d.host, d.port))
    node.finds = 1  # it names itself once, then the target: make the target never answer
    node.target = ("127.0.0.1", node.server_address[1])
    try:
        slept: list[float] = []

        def sleep(t: float) -> None:
            slept.append(t)
            time.sleep(t)

        with AdminSession(parse_bootstrap(node.bootstrap), timeout_s=2.0) as s:
            s.sleep = sleep
            with pytest.raises(AdminError, match="within 2s .*NOT_COORDINATOR: moved"):
                s.group_call("g", ConnectGroupDescribeRequest(group_ids=("g",)))
        assert slept and max(slept) <= 1.0  # the backoff is capped
        assert sum(slept) <= 2.0
    finally:
        node.shutdown()
        node.server_close()


def test_admin_change_lost_in_flight_is_not_resent(moving: tuple[MovingNode, Any]) -> None:
    node, d = moving
    node.finds = 1  # it names itself from now on ...
    node.target = ("127.0.0.1", node.server_address[1])
    node.drop_alter = True  # ... and drops the change's connection
    err = cli("connectors", "delete", "--group", "g", "src", "--bootstrap", node.bootstrap, code=1)
    assert "may or may not have been applied" in err, err
    assert [s for s in node.seen if s[0] == "ConnectGroupAlterConnectors"] == [
        ("ConnectGroupAlterConnectors", "dropped")]  # sent once, never resent


# == the worker client ==============================================================================


def test_worker_client_rediscovers_after_describe_not_coordinator(moving: tuple[MovingNode, Any]) -> None:
    node, d = moving
    node.finds = 1  # next FindCoordinator names the node itself

    async def scenario() -> None:
        client = CoordinatorClient(parse_bootstrap(node.bootstrap), "g", request_timeout_ms=10_000)
        try:
            req = ConnectGroupDescribeRequest(group_ids=("g",))
            (g,) = (await client.send(req)).groups
            assert g.error_code == E.NOT_COORDINATOR
            assert client.coordinator is None  # forgotten: the group's error is the answer's
            (g,) = (await client.send(req)).groups
            assert g.error_code == E.GROUP_ID_NOT_FOUND  # the real daemon answered
            assert client.coordinator == (d.host, d.port)
        finally:
            await client.close()

    asyncio.run(scenario())


def test_worker_client_backoff_is_capped() -> None:
    client = CoordinatorClient([("127.0.0.1", 1)], "g")
    client._failures = 30
    assert max(client.backoff_s() for _ in range(2000)) <= 1.0


def test_worker_joins_through_dead_bootstrap_entries(pool: DaemonPool, tmp_path: Path) -> None:
    d = pool.start()
    dead = dead_ports(2)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker_client.cli", "run", "--group", "g", "--instance-id", "w1",
             "--bootstrap", f"{dead[0]},{dead[1]}", "--bootstrap", d.bootstrap],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=daemon_env(), cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            g = _describe_or_none(d)
            if g is not None and [m["instance_id"] for m in g["members"]] == ["w1"]:
                break
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log.read_text()


def _describe_or_none(d: Any) -> dict[str, Any] | None:
    with AdminClient(d.host, d.port, timeout_s=10) as c:
        (g,) = c.call(ConnectGroupDescribeRequest(group_ids=("g",))).groups
    if g.error_code:
        return None
    return {"members": [{"instance_id": m.instance_id} for m in g.members]}
