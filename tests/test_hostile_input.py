"""The daemon under hostile and faulty input.

Real daemons over real TCP (tests/daemon_fixture.py), except where a state cannot be reached
from outside on purpose (a partition still loading: an in-process server that was not started).
No assertion here is on wall-clock time: each checks what the design guarantees (an answer and
its error code, a connection still serving, a member still in its group, a bounded count or
size).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode as E
from connect_wire.framing import encode_request_frame, parse_response_header
from coordinator import config
from coordinator.admin import AdminClient
from coordinator.group.coordinator import RequestContext
from coordinator.runtime.partitioner import partition_for
from coordinator.server.app import CoordinatorServer
from tests.daemon_fixture import Daemon, DaemonPool, run_cli
from tests.test_daemon_e2e import Admin, Worker, assert_healthy, metric, read_frame, wait_until


@pytest.fixture
def pool(tmp_path: Path) -> Iterable[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def raw(d: Daemon) -> socket.socket:
    return socket.create_connection((d.host, d.port), timeout=10)


def frame(api_key: int, version: int, correlation_id: int, request: Any) -> bytes:
    api = APIS[api_key]
    return encode_request_frame(api_key, version, correlation_id, "hostile", codec.encode(request),
                                header_version=api.request_header_version(version))


def answer(sock: socket.socket, api_key: int, version: int, correlation_id: int) -> Any:
    body = read_frame(sock)
    got, offset = parse_response_header(body, APIS[api_key].response_header_version(version))
    assert got == correlation_id
    return codec.decode(APIS[api_key].response_class(version), body, offset)[0]


def versions_request() -> Any:
    return APIS[ApiKey.API_VERSIONS].request_class(3)(client_software_name="t",
                                                      client_software_version="1")


# == item 8: an encoder failure answers an error, the connection keeps serving =========================


def test_metadata_null_topic_name_is_answered_and_the_connection_keeps_serving(pool: DaemonPool) -> None:
    d = pool.start()
    topic_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    with raw(d) as s:
        out = b""
        for corr, version in enumerate((10, 11, 12), start=1):
            req_cls = APIS[ApiKey.METADATA].request_class(version)
            topic_cls = req_cls.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
            req = req_cls(topics=(topic_cls(topic_id=topic_id, name=None),
                                  topic_cls(topic_id=uuid.UUID(int=0), name="t")),
                          allow_auto_topic_creation=False, include_topic_authorized_operations=False,
                          **({"include_cluster_authorized_operations": False} if version < 11 else {}))
            out += frame(ApiKey.METADATA, version, corr, req)
        # Pipelined behind them: must be answered, in order, on the same connection.
        out += frame(ApiKey.API_VERSIONS, 3, 4, versions_request())
        s.sendall(out)
        for corr, version in enumerate((10, 11), start=1):
            r = answer(s, ApiKey.METADATA, version, corr)
            # Kafka: topic names cannot be null before v12 -> INVALID_REQUEST for the request's
            # topics (MetadataRequest.getErrorResponse: a null name is answered as "").
            assert [(t.name, int(t.error_code)) for t in r.topics] == [
                ("", E.INVALID_REQUEST), ("t", E.INVALID_REQUEST)], version
        r = answer(s, ApiKey.METADATA, 12, 3)
        # v12: a null name is a lookup by topic id (Kafka: UNKNOWN_TOPIC_ID, 100); no topics here.
        assert [(t.name, t.topic_id, int(t.error_code)) for t in r.topics] == [
            (None, topic_id, 100), ("t", None, E.UNKNOWN_TOPIC_OR_PARTITION)]  # the zero uuid reads as None
        assert int(answer(s, ApiKey.API_VERSIONS, 3, 4).error_code) == 0
    assert "Traceback" not in d.stderr() and "request failed" not in d.stderr()
    assert_healthy(d)


# == item 9: ListGroups while a partition is unavailable ===============================================


def _group_on(partition: int, partitions: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(10_000)
                if partition_for(f"{prefix}{i}", partitions) == partition)


def test_list_groups_with_a_failed_partition(pool: DaemonPool, tmp_path: Path) -> None:
    from kafka import KafkaAdminClient

    data = tmp_path / "data"
    data.mkdir()
    (data / "partitions").write_text("2\n")
    # Partition 1 cannot load: its directory is a file. Partition 0 serves.
    (data / "partition-1").write_text("not a directory\n")
    d = pool.start(data, extra_args=["--partitions", "2"])
    live = _group_on(0, 2, "live-")
    admin = Admin(d, live)
    assert admin.alter({"A": 1}).error_code == 0
    admin.close()

    with AdminClient(d.host, d.port) as c:
        for version in range(6):
            cls = APIS[ApiKey.LIST_GROUPS].request_class(version)
            kw = {"states_filter": ()} if version >= 4 else {}
            kw |= {"types_filter": ()} if version >= 5 else {}
            r = c.call(cls(**kw))
            # The failed partition's error, and the groups of the partitions that answered.
            assert int(r.error_code) == E.NOT_COORDINATOR, version
            assert [g.group_id for g in r.groups] == [live], version
        # Still serving on the same connection.
        assert int(c.call(versions_request()).error_code) == 0

    kafka = KafkaAdminClient(bootstrap_servers=d.bootstrap, client_id="kafka-python-hostile",
                             request_timeout_ms=5000)
    try:
        # kafka-python raises the response's error (it saw an answer, not a closed connection).
        with pytest.raises(Exception, match="NotCoordinator"):
            kafka.list_groups()
    finally:
        kafka.close()

    r = run_cli("groups", "list", "--json", "--bootstrap", d.bootstrap)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "NOT_COORDINATOR: some partitions did not answer" in r.stderr
    assert live in r.stdout
    assert_healthy(d)


def test_list_groups_while_a_partition_loads(tmp_path: Path) -> None:
    """The same branch while partitions are still loading (an in-process server whose
    partitions were never loaded: every shard is in its LOADING state)."""
    cfg = config.load(None, {"data.dir": str(tmp_path / "data"), "partitions": 2}, environ={})
    server = CoordinatorServer(cfg)

    async def run() -> list[Any]:
        out = []
        for version in range(6):
            cls = APIS[ApiKey.LIST_GROUPS].request_class(version)
            kw = {"states_filter": ()} if version >= 4 else {}
            kw |= {"types_filter": ()} if version >= 5 else {}
            answer = server.router.dispatch(ApiKey.LIST_GROUPS, version, cls(**kw), RequestContext())
            response = await answer
            codec.encode(response)  # encodable, as the connection will encode it
            out.append(response)
        return out

    for response in asyncio.run(run()):
        assert int(response.error_code) == E.COORDINATOR_LOAD_IN_PROGRESS
        assert response.groups == ()




async def _in_process(tmp_path: Path, **settings: Any) -> CoordinatorServer:
    cfg = config.load(None, {"data.dir": str(tmp_path / "data"), "partitions": 1,
                             "listeners": "127.0.0.1:0", "metrics.listener": "none", **settings},
                      environ={})
    server = CoordinatorServer(cfg)
    await server.start()
    return server


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int,
                version: int, corr: int, request: Any) -> Any:
    writer.write(frame(api_key, version, corr, request))
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    body = await reader.readexactly(size)
    got, offset = parse_response_header(body, APIS[api_key].response_header_version(version))
    assert got == corr
    return codec.decode(APIS[api_key].response_class(version), body, offset)[0]


def test_any_encoder_or_handler_failure_is_answered_with_an_error(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net under every response path, whatever the bug: a response that cannot be
    encoded (the Metadata bug as it was: a null name where the version forbids one) and a
    handler that raises are each answered with an error response for that request, and the
    requests pipelined behind them on the connection are answered too."""
    from coordinator.server import kafka_apis

    real_metadata = kafka_apis.metadata

    def unencodable(cls: type, request: Any, *args: Any) -> Any:
        response = real_metadata(cls, request, *args)
        topic = response.topics[0]
        return type(response)(**{**{f: getattr(response, f) for f in response.__dataclass_fields__},
                                 "topics": (type(topic)(**{**{f: getattr(topic, f) for f in
                                                              topic.__dataclass_fields__},
                                                           "name": None}),)})

    def raising(*args: Any) -> Any:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(kafka_apis, "metadata", unencodable)
    monkeypatch.setattr(kafka_apis, "find_coordinator", raising)

    async def run() -> None:
        server = await _in_process(tmp_path)
        try:
            reader, writer = await asyncio.open_connection(*server.bound)
            req_cls = APIS[ApiKey.METADATA].request_class(9)
            topic_cls = req_cls.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
            meta = req_cls(topics=(topic_cls(name="t"),), allow_auto_topic_creation=False,
                           include_cluster_authorized_operations=False,
                           include_topic_authorized_operations=False)
            r = await _call(reader, writer, ApiKey.METADATA, 9, 1, meta)
            assert [(t.name, int(t.error_code)) for t in r.topics] == [("t", E.UNKNOWN_SERVER_ERROR)]
            find = APIS[ApiKey.FIND_COORDINATOR].request_class(4)(key_type=0, coordinator_keys=("a", "b"))
            r = await _call(reader, writer, ApiKey.FIND_COORDINATOR, 4, 2, find)
            assert [(c.key, int(c.error_code)) for c in r.coordinators] == [
                ("a", E.UNKNOWN_SERVER_ERROR), ("b", E.UNKNOWN_SERVER_ERROR)]
            assert "a bug in a handler" in (r.coordinators[0].error_message or "")
            find3 = APIS[ApiKey.FIND_COORDINATOR].request_class(3)(key="a", key_type=0)
            r = await _call(reader, writer, ApiKey.FIND_COORDINATOR, 3, 3, find3)
            assert int(r.error_code) == E.UNKNOWN_SERVER_ERROR and r.node_id == -1
            r = await _call(reader, writer, ApiKey.API_VERSIONS, 3, 4, versions_request())
            assert int(r.error_code) == 0
            writer.close()
        finally:
            await server.stop(grace_s=1)

    asyncio.run(run())


# == item 6: one request must not stall everyone =======================================================


class Heartbeater:
    """A live member heartbeating on its own connection (every ~100 ms, a quarter of its
    session... the daemon's SHORT_TIMEOUTS: session 2 s) until stopped; every answer is kept."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.answers: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from coordinator.admin import AdminError
        while not self._stop.wait(0.1):
            try:
                self.answers.append(int(self.w.hb().error_code))
            except AdminError:  # no answer within the client's timeout (10 s)
                self.answers.append(-1)
                return

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(60)
        return self.answers


def _stable_member(d: Daemon) -> tuple[Admin, Worker, tuple[int, int]]:
    admin = Admin(d, "victims")
    assert admin.alter({"A": 1}).error_code == 0
    w = Worker(d, "W1", group="victims")
    w.ok()
    w.compute({"W1": ["A", "A/0"]})
    w.ok()
    w.ok(owned=w.running)
    assert admin.state() == "Stable"
    return admin, w, admin.epochs()


def read_big_frame(s: socket.socket) -> bytes:
    """A frame read into one buffer (recv_into releases the GIL and copies nothing twice:
    ``buf += chunk`` over megabytes held the GIL for seconds and starved the heartbeat thread
    of this same process, which then missed its session)."""
    def exactly(n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = s.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionError("closed")
            got += k
        return buf
    (size,) = struct.unpack(">i", exactly(4))
    return bytes(exactly(size))


def _frames_in_thread(s: socket.socket, n: int) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        for _ in range(n):
            got.append(read_big_frame(s))
    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


MAX_FRAME = 1024 * 1024


def test_oversized_requests_are_refused_and_live_members_are_not_expired(pool: DaemonPool) -> None:
    d = pool.start()

    # Three 1 MiB FindCoordinator v4 frames naming ~520,000 keys each (2 bytes a key), one
    # DescribeGroups v5 and one ConnectGroupDescribe as large, pipelined on one connection.
    n = (MAX_FRAME - 64) // 2
    keys = ("k",) * n
    find = APIS[ApiKey.FIND_COORDINATOR].request_class(4)(key_type=0, coordinator_keys=keys)
    describe = APIS[ApiKey.DESCRIBE_GROUPS].request_class(5)(groups=keys,
                                                             include_authorized_operations=False)
    from connect_wire.messages import ConnectGroupDescribeRequest
    connect_describe = ConnectGroupDescribeRequest(group_ids=keys)
    requests = [(ApiKey.FIND_COORDINATOR, 4, find)] * 3 + [
        (ApiKey.DESCRIBE_GROUPS, 5, describe), (ApiKey.CONNECT_GROUP_DESCRIBE, 0, connect_describe)]
    # Encoded before the member joins (encoding holds this process's GIL for seconds).
    frames = [frame(key, version, corr, req)
              for corr, (key, version, req) in enumerate(requests, start=1)]
    assert all(len(out) <= MAX_FRAME + 4 for out in frames)
    admin, w, epochs = _stable_member(d)
    beats = Heartbeater(w)
    with raw(d) as s:
        s.settimeout(120)
        reader, got = _frames_in_thread(s, len(requests))
        for out in frames:
            s.sendall(out)
        reader.join(120)
    answers = beats.stop()
    # The live member was never expired: every heartbeat answered without error, the group's
    # epochs did not move, and the member is still there at its epoch.
    assert answers and set(answers) == {0}, answers
    assert admin.epochs() == epochs
    assert admin.members() == {"W1": (w.epoch, ["A", "A/0"])}
    # Each oversized request was refused: INVALID_REQUEST on every key, nothing looked up.
    assert len(got) == len(requests)
    for corr, ((key, version, _), body) in enumerate(zip(requests, got, strict=True), start=1):
            cid, offset = parse_response_header(body, APIS[key].response_header_version(version))
            assert cid == corr
            r = codec.decode(APIS[key].response_class(version), body, offset)[0]
            entries = r.coordinators if key == ApiKey.FIND_COORDINATOR else r.groups
            assert len(entries) == n and {int(e.error_code) for e in entries} == {E.INVALID_REQUEST}
            if key != ApiKey.DESCRIBE_GROUPS:  # (DescribeGroups has no error message)
                assert "more than request.max.items=10000" in entries[0].error_message
    assert_healthy(d)
    # The event loop's lag is exported (gauge and histogram).
    assert metric(d, "connect_coordinator_event_loop_lag_seconds") is not None
    assert (metric(d, "connect_coordinator_event_loop_lag_observed_seconds_count") or 0) > 0
    admin.close()
    w.close()


def test_requests_at_the_item_limit_are_served(pool: DaemonPool) -> None:
    d = pool.start(extra_env={"CONNECT_COORDINATOR_REQUEST_MAX_ITEMS": "3"})
    with AdminClient(d.host, d.port) as c:
        find = APIS[ApiKey.FIND_COORDINATOR].request_class(4)
        r = c.call(find(key_type=0, coordinator_keys=("a", "b", "c")))
        assert [(e.key, int(e.error_code), e.port) for e in r.coordinators] == [
            ("a", 0, d.port), ("b", 0, d.port), ("c", 0, d.port)]
        r = c.call(find(key_type=0, coordinator_keys=("a", "b", "c", "d")))
        assert [(e.key, int(e.error_code), e.port) for e in r.coordinators] == [
            (k, E.INVALID_REQUEST, -1) for k in "abcd"]
        assert r.coordinators[0].error_message == (
            "4 coordinators in one request, more than request.max.items=3")
        meta = APIS[ApiKey.METADATA].request_class(8)
        topic = meta.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
        r = c.call(meta(topics=tuple(topic(name=n) for n in "abcd"), allow_auto_topic_creation=False,
                        include_cluster_authorized_operations=False,
                        include_topic_authorized_operations=False))
        assert [(t.name, int(t.error_code)) for t in r.topics] == [(k, E.INVALID_REQUEST) for k in "abcd"]
        r = c.call(meta(topics=tuple(topic(name=n) for n in "abc"), allow_auto_topic_creation=False,
                        include_cluster_authorized_operations=False,
                        include_topic_authorized_operations=False))
        assert [int(t.error_code) for t in r.topics] == [E.UNKNOWN_TOPIC_OR_PARTITION] * 3
        dg = APIS[ApiKey.DESCRIBE_GROUPS].request_class(0)
        assert [int(g.error_code) for g in c.call(dg(groups=("a", "b", "c"))).groups] == [0, 0, 0]
        assert [(g.group_id, int(g.error_code)) for g in c.call(dg(groups=tuple("abcd"))).groups] == [
            (k, E.INVALID_REQUEST) for k in "abcd"]
        from connect_wire.messages import ConnectGroupDescribeRequest
        r = c.call(ConnectGroupDescribeRequest(group_ids=tuple("abcd")))
        assert [(g.group_id, g.error_code) for g in r.groups] == [(k, E.INVALID_REQUEST) for k in "abcd"]
        r = c.call(ConnectGroupDescribeRequest(group_ids=tuple("abc")))
        assert [g.error_code for g in r.groups] == [E.GROUP_ID_NOT_FOUND] * 3
    assert_healthy(d)


# == items 4 and 5: flow control ======================================================================


def rss_bytes(d: Daemon) -> int:
    for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def settled(read: Any, what: str) -> Any:
    """``read()`` once it returns the same value three times in a row (0.3 s apart)."""
    values: list[Any] = []

    def same() -> bool:
        values.append(read())
        return len(values) >= 3 and values[-1] == values[-2] == values[-3]
    wait_until(same, 30.0, what, step_s=0.3)
    return values[-1]


def test_a_client_that_never_reads_its_answers_cannot_make_the_daemon_buffer_them(
        pool: DaemonPool) -> None:
    from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
    from connect_wire.messages import connect_group_alter_connectors_request_v0 as alter

    d = pool.start()
    # A group whose ConnectGroupDescribe answer is ~200 KB (10 connectors, 20 KB of config
    # each), asked for by 20-byte requests: 10,000x amplification.
    with AdminClient(d.host, d.port) as c:
        for i in range(10):
            r = c.call(ConnectGroupAlterConnectorsRequest(
                group_id="big", upserts=(alter.ConnectorSpec(
                    name=f"c{i}", task_count=1,
                    config=(alter.ConfigEntry(name="blob", value="x" * 20_000),)),),
                deletes=(), validate_only=False))
            assert r.error_code == 0, r
        one = c.call(ConnectGroupDescribeRequest(group_ids=("big",)))
        answer_size = len(codec.encode(one))
        assert answer_size > 200_000
    before = rss_bytes(d)

    n = 1500  # ~300 MB of answers for ~40 KB of requests
    describe = codec.encode(ConnectGroupDescribeRequest(group_ids=("big",)))
    frames = b"".join(encode_request_frame(ApiKey.CONNECT_GROUP_DESCRIBE, 0, corr, "greedy", describe)
                      for corr in range(1, n + 1))
    with raw(d) as s:
        s.sendall(frames)
        def answered() -> int:
            return int(metric(d, "connect_coordinator_requests_total", api="ConnectGroupDescribe",
                              error="NONE") or 0) - 1  # (one was answered above)
        wait_until(lambda: answered() >= 1, 30, "the first answers")
        # Describes run one at a time per connection, and an answer counts in the connection's
        # in-flight bytes (socket.max.inflight.bytes, 4 MiB) until the transport takes it, whose
        # buffer pauses the connection past socket.write.buffer.bytes (1 MiB): then the client's
        # unread answers stop everything behind them. (Counting requests alone let 128 run, and
        # ten pipelined describes of a 61 MB group built 600 MB: found by review.)
        ran = settled(answered, "answers")
        assert 1 <= ran <= (4 + 1) * 1024 * 1024 // answer_size + 2, ran
        assert rss_bytes(d) - before < 32 * 1024 * 1024, (rss_bytes(d), before)
        assert metric(d, "connect_coordinator_connections_read_paused") == 1
        # Other clients are served meanwhile.
        assert_healthy(d)
        # Once the client reads, every answer comes, in order: nothing was dropped.
        s.settimeout(60)
        for corr in range(1, n + 1):
            body = read_frame(s)
            assert struct.unpack_from(">i", body)[0] == corr
    assert_healthy(d)
    assert metric(d, "connect_coordinator_queued_request_bytes") == 0


def test_partial_frames_and_queued_requests_are_bounded_all_connections_together(
        pool: DaemonPool) -> None:
    budget = 2 * 1024 * 1024
    # A short idle timeout: what gives the budget back from connections that never complete
    # their frame (they are not read, so only the idle timeout or their close ends them).
    d = pool.start(extra_env={"CONNECT_COORDINATOR_QUEUED_MAX_REQUEST_BYTES": str(budget),
                              "CONNECT_COORDINATOR_SOCKET_IDLE_TIMEOUT_MS": "2000"})
    admin, w, epochs = _stable_member(d)
    admin.close()
    beats = Heartbeater(w)
    before = rss_bytes(d)

    # 40 connections each send an almost complete 1 MiB frame (a valid ApiVersions request
    # whose software name is ~1 MiB), holding back its last 10 bytes.
    attackers = 40
    versions = APIS[ApiKey.API_VERSIONS].request_class(3)(
        client_software_name="x" * (MAX_FRAME - 100), client_software_version="1")
    whole = frame(ApiKey.API_VERSIONS, 3, 1, versions)
    assert len(whole) <= MAX_FRAME + 4
    socks = [raw(d) for _ in range(attackers)]
    for s in socks:
        send_some(s, whole[:-10])
    held = settled(lambda: metric(d, "connect_coordinator_queued_request_bytes"), "held bytes")
    # Past the budget a connection holding a partial frame is not read: what is held is the
    # budget plus at most one read (256 KiB) per connection that was read after the budget
    # was reached; without the budget it was all 40 MiB.
    read_chunk = 256 * 1024
    assert held is not None and held <= budget + attackers * read_chunk, held
    assert rss_bytes(d) - before < budget + attackers * read_chunk + 16 * 1024 * 1024
    assert (metric(d, "connect_coordinator_connections_read_paused") or 0) > 0
    # Clients that hold no partial frame keep being served meanwhile.
    assert_healthy(d)

    # A client sending a whole 1 MiB request now is not read past its first bytes (it would
    # hold more), until the budget drains: here when the idle timeout ends the attackers
    # (they never complete a request; this client came later, so it is read again first).
    time.sleep(1.0)  # (not an assertion: the attackers' idle time runs out well before its)
    late = raw(d)
    late.settimeout(30)
    threading.Thread(target=late.sendall, args=(whole,), daemon=True).start()
    r = answer(late, ApiKey.API_VERSIONS, 3, 1)
    assert int(r.error_code) == 0
    late.close()
    for s in socks:
        s.close()
    wait_until(lambda: metric(d, "connect_coordinator_queued_request_bytes") == 0, 30, "budget to drain")
    assert metric(d, "connect_coordinator_connections_read_paused") == 0
    answers = beats.stop()
    assert answers and set(answers) == {0}, answers
    admin = Admin(d, "victims")
    assert admin.epochs() == epochs
    assert_healthy(d)
    admin.close()
    w.close()


def send_some(s: socket.socket, data: bytes) -> int:
    """Send what the peer takes within ~1 s (a daemon that stops reading takes less)."""
    s.settimeout(1)
    sent = 0
    try:
        while sent < len(data):
            sent += s.send(data[sent:])
    except TimeoutError:  # the daemon stopped reading this connection: as designed
        pass
    return sent


def test_describe_answers_are_bounded_by_request_max_response_bytes(pool: DaemonPool) -> None:
    """Ten thousand copies of one large group's id (within request.max.items) asked for an
    answer of gigabytes: groups are described in order, each whole, and once the answer passed
    request.max.response.bytes the rest are refused."""
    from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
    from connect_wire.messages import connect_group_alter_connectors_request_v0 as alter

    d = pool.start(extra_env={"CONNECT_COORDINATOR_REQUEST_MAX_RESPONSE_BYTES": "5000"})
    with AdminClient(d.host, d.port) as c:
        r = c.call(ConnectGroupAlterConnectorsRequest(
            group_id="big", upserts=(alter.ConnectorSpec(
                name="c", task_count=1, config=(alter.ConfigEntry(name="blob", value="x" * 2000),)),),
            deletes=(), validate_only=False))
        assert r.error_code == 0
        r = c.call(ConnectGroupDescribeRequest(group_ids=("big",) * 10 + ("nope",)))
        assert [g.error_code for g in r.groups] == [0] * 3 + [E.INVALID_REQUEST] * 8
        assert all(g.group_id == "big" and g.connectors for g in r.groups[:3])
        assert "request.max.response.bytes=5000" in r.groups[3].error_message
        # A group larger than the limit is still described (each group whole, the first always).
        r = c.call(ConnectGroupDescribeRequest(group_ids=("nope", "big")))
        assert [g.error_code for g in r.groups] == [E.GROUP_ID_NOT_FOUND, 0]
        dg = APIS[ApiKey.DESCRIBE_GROUPS].request_class(5)
        r = c.call(dg(groups=("big",) * 2000, include_authorized_operations=False))
        codes = [int(g.error_code) for g in r.groups]
        assert codes[0] == 0 and codes[-1] == E.INVALID_REQUEST and len(codes) == 2000
        assert codes == sorted(codes)  # described ones first, then the refused
    assert_healthy(d)


@pytest.mark.parametrize(("key", "version"), [(10, 4), (10, 6), (15, 0), (15, 4), (15, 5),
                                              (3, 0), (3, 8), (3, 12)])
def test_spliced_refusals_are_the_bytes_of_the_built_response(key: int, version: int) -> None:
    """The refusal encoded around a sentinel key (kafka_apis.refuse_items_async) is byte for
    byte the response built and encoded entity by entity, non-flexible versions and long keys
    (two-byte varints) and more keys than one chunk included."""
    from coordinator.server import kafka_apis as k

    cls = APIS[key].response_class(version)
    keys: list[str | None] = ["a", "", "x" * 200, "é", "k" * 40]
    keys = keys * (k.REFUSE_CHUNK // 5 + 3)
    if key == 3 and version >= 12:
        keys.append(None)
    field, name = {10: ("coordinators", "key"), 15: ("groups", "group_id"), 3: ("topics", "name")}[key]
    entry = {10: {"node_id": -1, "host": "", "port": -1, "error_code": 42, "error_message": None},
             15: {"error_code": 42, "group_state": "", "protocol_type": "", "protocol_data": "",
                  "members": [], "authorized_operations": -2147483648},
             3: {"error_code": 42, "is_internal": False, "partitions": []}}[key]
    top = {"throttle_time": 0, "brokers": [], "cluster_id": "c", "controller_id": -1,
           "cluster_authorized_operations": -2147483648}

    def make(key_value: str | None, extra: dict[str, Any] | None = None) -> Any:
        return k.build(cls, {**top, field: [{**entry, name: key_value, **(extra or {})}]})
    first = (lambda kv: make(kv, {"error_message": "m"})) if key == 10 else None
    spliced = asyncio.run(k.refuse_items_async(make, field, keys, 42, first))
    built = k.build(cls, {**top, field: [
        {**entry, name: kv, **({"error_message": "m"} if key == 10 and i == 0 else {})}
        for i, kv in enumerate(keys)]})
    assert spliced.body == codec.encode(built)
    entries = [codec.encode(e) for e in getattr(built, field)]
    assert k.assemble(make, field, entries).body == codec.encode(built)


def test_bytes_of_requests_answered_after_their_connection_is_gone_are_given_back_once(
        pool: DaemonPool) -> None:
    """A client that sends requests and resets the connection before their answers: the
    budget gets their bytes back once (it went negative, counting them twice)."""
    from connect_wire.messages import ConnectGroupDescribeRequest

    d = pool.start()
    describe = codec.encode(ConnectGroupDescribeRequest(group_ids=tuple(f"g{i}" for i in range(50))))
    for _ in range(20):
        s = raw(d)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.sendall(b"".join(encode_request_frame(ApiKey.CONNECT_GROUP_DESCRIBE, 0, corr, "rst", describe)
                           for corr in range(1, 20)))
        s.close()
    wait_until(lambda: metric(d, "connect_coordinator_connections") == 0, 30, "connections to go")
    assert settled(lambda: metric(d, "connect_coordinator_queued_request_bytes"), "held bytes") == 0
    assert_healthy(d)


def test_request_bytes_in_flight_on_one_connection_are_bounded(pool: DaemonPool) -> None:
    """socket.max.inflight.bytes: a client that never reads gets no more requests run than fit
    in it (here below socket.max.inflight.requests), the others after the ones answered."""
    from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
    from connect_wire.messages import connect_group_alter_connectors_request_v0 as alter

    limit = 1000
    d = pool.start(extra_env={"CONNECT_COORDINATOR_SOCKET_MAX_INFLIGHT_BYTES": str(limit)})
    with AdminClient(d.host, d.port) as c:
        for i in range(10):  # a ~200 KB answer: the write buffer fills at once
            assert c.call(ConnectGroupAlterConnectorsRequest(
                group_id="big", upserts=(alter.ConnectorSpec(
                    name=f"c{i}", task_count=1,
                    config=(alter.ConfigEntry(name="blob", value="x" * 20_000),)),),
                deletes=(), validate_only=False)).error_code == 0
    describe = codec.encode(ConnectGroupDescribeRequest(group_ids=("big",)))
    frames = [encode_request_frame(ApiKey.CONNECT_GROUP_DESCRIBE, 0, corr, "greedy", describe)
              for corr in range(1, 301)]
    size = len(frames[0]) - 4
    with raw(d) as s:
        s.sendall(b"".join(frames))

        def answered() -> int:
            return int(metric(d, "connect_coordinator_requests_total", api="ConnectGroupDescribe",
                              error="NONE") or 0)
        # Describes run one at a time, and each ~200 KB answer alone passes the 1,000 bytes of
        # socket.max.inflight.bytes until the transport takes it: so no more run than the
        # unread answers that fit the write buffer (socket.write.buffer.bytes, 1 MiB) and the
        # kernel's socket buffers, fewer than the ceil(limit / size) requests counting request
        # bytes alone let run at once.
        wait_until(lambda: answered() >= 1, 30, "the first answers")
        ran = settled(answered, "answers")
        assert 1 <= ran < -(-limit // size), (ran, size)
        s.settimeout(60)
        assert [struct.unpack_from(">i", read_frame(s))[0] for _ in range(300)] == list(range(1, 301))
    assert_healthy(d)


def test_the_budget_must_hold_one_largest_frame() -> None:
    from coordinator.group.config import ConfigError

    with pytest.raises(ConfigError, match="must hold at least one frame"):
        config.load(None, {"queued.max.request.bytes": 1024 * 1024}, environ={})
    assert config.load(None, {"queued.max.request.bytes": 1024 * 1024 + 4}, environ={})


@pytest.mark.parametrize("version", [4, 5, 6])
@pytest.mark.parametrize("key_type", [0, 1])
def test_many_keys_findcoordinator_answer_is_spliced_to_the_same_bytes(
        version: int, key_type: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """FindCoordinator v4+ with more than SPLICE_MIN keys is answered by splicing (a chunk per
    event-loop turn): the same bytes as the built answer, empty keys (INVALID_GROUP_ID) and
    other key types (INVALID_REQUEST) included, and with several nodes: keys owned by
    different nodes and keys nobody owns (COORDINATOR_NOT_AVAILABLE)."""
    from coordinator.server import kafka_apis as k

    def locate(key: str) -> tuple[int, str, int] | None:
        return None if key == "a" else (len(key) % 3, f"node{len(key) % 3}", 9092 + len(key) % 3)

    cls = APIS[ApiKey.FIND_COORDINATOR].response_class(version)
    keys = ("a", "", "x" * 200, "é") * (k.REFUSE_CHUNK // 4 + 2)
    req = APIS[ApiKey.FIND_COORDINATOR].request_class(version)(key_type=key_type, coordinator_keys=keys)
    spliced = k.find_coordinator(cls, req, version, locate)
    assert asyncio.iscoroutine(spliced)
    body = asyncio.run(spliced).body
    monkeypatch.setattr(k, "SPLICE_MIN", len(keys))  # the entity-by-entity path
    built = k.find_coordinator(cls, req, version, locate)
    assert body == codec.encode(built)
    if key_type == 0:  # every kind of answer is in there
        assert {c.error_code for c in built.coordinators} == {
            0, E.INVALID_GROUP_ID, E.COORDINATOR_NOT_AVAILABLE}
        assert {c.node_id for c in built.coordinators if not c.error_code} == {1, 2}
