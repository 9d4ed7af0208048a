"""Fuzzing the frame decoder and the dispatcher together, through the real Connection and
Router of a real (in-process) server over TCP.

Each example opens a connection and sends a stream of frames: valid requests of every API key
and version the daemon answers (bodies drawn from the schema, tests/strategies.py), the same
with bytes flipped, cut or appended, random headers, unknown keys and versions, and sometimes a
stream-level fault at the end (a negative or oversized size, a partial frame and end of
stream). Then an ApiVersions request as a sentinel. What the daemon must do is predicted from
the bytes with the same decoders it uses, and checked (docs/daemon.md, "Connections"):

* a frame whose header or size is malformed, or whose body does not decode for a Kafka API or
  ConnectGroupDescribe, closes the connection: the answers read before are a prefix of the
  expected ones, nothing after it is answered, and the connection ends;
* an unknown key or version gets an ApiVersionsResponse v0 with UNSUPPORTED_VERSION;
* an undecodable body of the other connect APIs gets INVALID_REQUEST in that API's response;
* everything else gets its API's response, in request order, every error code one of the
  table's (connect_wire.errors) and never UNKNOWN_SERVER_ERROR (a handler that raised or a
  response that could not be encoded);
* no exception reaches the event loop, and after every example a new client is served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.framing import (
    MalformedHeader,
    encode_request_frame,
    parse_response_header,
    peek_request_api,
    request_client_id,
)
from coordinator import config
from coordinator.server.app import CoordinatorServer
from tests.strategies import entities

MAX_FRAME = 64 * 1024
SUPPORTED = sorted((a.key, v) for a in APIS.values() for v in range(a.min_version, a.max_version + 1))
_KAFKA_APIS = {a.key for a in APIS.values() if a.kio_module is not None}  # (kio's classes)
_CLOSES_ON_BAD_BODY = _KAFKA_APIS | {int(ApiKey.CONNECT_GROUP_DESCRIBE)}


# == the daemon: a real server on its own event loop thread ===========================================


class Running:
    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda loop, context: self.errors.append(context))
        cfg = config.load(None, {
            "data.dir": str(tmp / "data"), "partitions": 2, "listeners": "127.0.0.1:0",
            "metrics.listener": "none", "log.fsync": "never", "socket.max.frame.bytes": MAX_FRAME,
            "group.connect.session.timeout.ms": 1000, "group.connect.heartbeat.interval.ms": 100,
            "log.level": "error"}, environ={})
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._run(self._start(cfg))

    async def _start(self, cfg: config.ServerConfig) -> CoordinatorServer:
        server = CoordinatorServer(cfg)
        await server.start()
        return server

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def stop(self) -> None:
        self._run(self.server.stop(grace_s=1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = Running(tmp_path_factory.mktemp("fuzz"))
    yield running
    running.stop()
    assert running.errors == []


# == the stream ========================================================================================


@st.composite
def valid_request(draw: st.DrawFn) -> tuple[int, int, bytes, int]:
    """(api key, version, payload, request header version) of a request the schema allows."""
    key, version = draw(st.sampled_from(SUPPORTED))
    api = APIS[key]
    request = draw(entities(api.request_class(version)))
    if hasattr(request, "max_wait_ms"):  # a parked heartbeat would hold the stream back
        request = dataclasses.replace(request, max_wait_ms=0)
    header_version = api.request_header_version(version)
    client_id = draw(st.one_of(st.none(), st.text(max_size=20)))
    frame = encode_request_frame(key, version, 0, client_id, codec.encode(request), header_version)
    return key, version, frame[4:], header_version


@st.composite
def mutated(draw: st.DrawFn, payload: bytes, body_at: int) -> bytes:
    """``payload`` with a few bytes flipped, cut, appended or inserted: mostly in the body
    (from ``body_at``), sometimes in the header."""
    data = bytearray(payload)
    start = draw(st.sampled_from([body_at] * 5 + [0]))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "append", "insert"]))
        at = draw(st.integers(min(start, len(data)), len(data)))
        if kind == "flip" and data:
            at = min(at, len(data) - 1)
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "append":
            data += draw(st.binary(min_size=1, max_size=16))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    choice = draw(st.sampled_from(["valid"] * 3 + ["mutated"] * 4 + ["garbage", "unknown"]))
    if choice == "garbage":
        return draw(st.binary(max_size=24))
    if choice == "unknown":
        key = draw(st.integers(-(2**15), 2**15 - 1))
        version = draw(st.integers(-(2**15), 2**15 - 1))
        if APIS.get(key) is not None and APIS[key].supports(version):
            version = APIS[key].max_version + 1
        return struct.pack(">hhih", key, version, 0, -1) + draw(st.binary(max_size=16))
    key, version, payload, header_version = draw(valid_request())
    if choice == "valid":
        return payload
    return draw(mutated(payload, request_client_id(payload, header_version == 2)[1]))


def with_correlation_id(payload: bytes, correlation_id: int) -> bytes:
    if len(payload) < 8:
        return payload
    return payload[:4] + struct.pack(">i", correlation_id) + payload[8:]


def expectation(payload: bytes) -> tuple[str, int, int]:
    """("close" | "unsupported" | "invalid" | "answer", key, version) as the daemon decides."""
    try:
        key, version, _ = peek_request_api(payload)
    except MalformedHeader:
        return "close", 0, 0
    api = APIS.get(key)
    if api is None or not api.supports(version):
        return "unsupported", key, version
    try:
        _, offset = request_client_id(payload, api.request_header_version(version) == 2)
    except MalformedHeader:
        return "close", key, version
    try:
        codec.decode(api.request_class(version), payload, offset)
    except codec.DecodeError:
        return ("close" if key in _CLOSES_ON_BAD_BODY else "invalid"), key, version
    return "answer", key, version


# == reading ===========================================================================================


def read_frame(sock: socket.socket) -> bytes | None:
    """One response payload, or None when the daemon closed the connection."""
    def exactly(n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                chunk = sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf
    size = exactly(4)
    if size is None:
        return None
    return exactly(struct.unpack(">i", size)[0])


def error_codes(value: Any) -> Iterator[int]:
    """Every error code in a response (top level and in its entries, one level down)."""
    code = getattr(value, "error_code", None)
    if code is not None:
        yield int(code)
    for field in dataclasses.fields(value):
        items = getattr(value, field.name)
        if isinstance(items, tuple):
            for item in items:
                if dataclasses.is_dataclass(item) and getattr(item, "error_code", None) is not None:
                    yield int(item.error_code)


def check_answer(body: bytes, kind: str, key: int, version: int) -> None:
    if kind == "unsupported":
        _, offset = parse_response_header(body, 0)
        r = codec.decode(APIS[ApiKey.API_VERSIONS].response_class(0), body, offset)[0]
        assert int(r.error_code) == ErrorCode.UNSUPPORTED_VERSION
        return
    api = APIS[key]
    _, offset = parse_response_header(body, api.response_header_version(version))
    r = codec.decode(api.response_class(version), body, offset)[0]
    codes = list(error_codes(r))
    if kind == "invalid":
        assert codes[:1] == [ErrorCode.INVALID_REQUEST], r
    for code in codes:
        assert ErrorCode.from_int(code) is not None, (code, r)
        assert code != ErrorCode.UNKNOWN_SERVER_ERROR, r


def served(d: Running) -> None:
    """A new client is answered (ApiVersions v3) on a fresh connection."""
    with socket.create_connection(d.server.bound, timeout=10) as s:
        req = APIS[ApiKey.API_VERSIONS].request_class(3)(client_software_name="fuzz",
                                                         client_software_version="1")
        s.sendall(encode_request_frame(18, 3, 1, "fuzz", codec.encode(req), 2))
        body = read_frame(s)
        assert body is not None
        _, offset = parse_response_header(body, 0)
        assert int(codec.decode(APIS[18].response_class(3), body, offset)[0].error_code) == 0


SENTINEL = APIS[ApiKey.API_VERSIONS].request_class(3)(client_software_name="s", client_software_version="1")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(payloads(), max_size=6),
       st.sampled_from(["none", "none", "negative", "oversized", "partial"]),
       st.lists(st.integers(1, 64), max_size=6))
def test_fuzzed_streams_are_answered_or_closed_as_documented(
        daemon: Running, items: list[bytes], fault: str, cuts: list[int]) -> None:
    stream = b""
    expected: list[tuple[int, str, int, int]] = []  # (correlation id, kind, key, version)
    closes = False
    for corr, item in enumerate(items, start=1):
        payload = with_correlation_id(item, corr)
        stream += struct.pack(">i", len(payload)) + payload
        kind, key, version = expectation(payload)
        if kind == "close":
            closes = True
            break
        expected.append((corr, kind, key, version))
    half_close = False
    if not closes:
        if fault == "negative":
            stream += struct.pack(">i", -5)
            closes = True
        elif fault == "oversized":
            stream += struct.pack(">i", MAX_FRAME + 1)
            closes = True
        elif fault == "partial":
            stream += struct.pack(">i", 100) + b"\0" * 10
            half_close = True
        else:
            sentinel = encode_request_frame(18, 3, 1000, "s", codec.encode(SENTINEL), 2)
            stream += sentinel
            expected.append((1000, "answer", 18, 3))

    with socket.create_connection(daemon.server.bound, timeout=10) as s:
        # Sent in pieces: frames straddle reads.
        at = 0
        for cut in cuts:
            s.sendall(stream[at:at + cut])
            at += cut
        s.sendall(stream[at:])
        if half_close:
            s.shutdown(socket.SHUT_WR)
        got = []
        while len(got) < len(expected):
            body = read_frame(s)
            if body is None:
                break
            got.append(body)
        event("closed" if closes else "served")
        if closes:
            # Answers before the bad frame may be lost with the connection, never reordered.
            assert len(got) <= len(expected)
            assert read_frame(s) is None, "the connection must close after a malformed frame"
        else:
            assert len(got) == len(expected), (len(got), expected)
            if half_close:
                assert read_frame(s) is None, "end of stream: closed once answered"
        for body, (corr, kind, key, version) in zip(got, expected, strict=False):
            event(f"answered: {kind}")
            assert struct.unpack_from(">i", body)[0] == corr
            check_answer(body, kind, key, version)
    assert daemon.errors == []
    served(daemon)


def _exchange(d: Running, frames: bytes, n: int) -> list[bytes | None]:
    with socket.create_connection(d.server.bound, timeout=10) as s:
        s.sendall(frames)
        return [read_frame(s) for _ in range(n)]


@pytest.mark.parametrize(("key", "version"), SUPPORTED)
def test_every_api_and_version_answers_any_valid_request(daemon: Running, key: int, version: int) -> None:
    """Schema-valid requests of one API key and version at a time (every one the daemon
    answers), each followed on its connection by the sentinel: both answered, in order, with
    known error codes, never UNKNOWN_SERVER_ERROR (Metadata v10/v11 with a null topic name took
    the connection down)."""
    api = APIS[key]
    header_version = api.request_header_version(version)

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(entities(api.request_class(version)))
    def run(request: Any) -> None:
        if hasattr(request, "max_wait_ms"):
            request = dataclasses.replace(request, max_wait_ms=0)
        frames = (encode_request_frame(key, version, 1, "fuzz", codec.encode(request), header_version)
                  + encode_request_frame(18, 3, 2, "s", codec.encode(SENTINEL), 2))
        first, second = _exchange(daemon, frames, 2)
        assert first is not None and second is not None, "the connection was closed"
        assert struct.unpack_from(">i", first)[0] == 1 and struct.unpack_from(">i", second)[0] == 2
        check_answer(first, "answer", key, version)
        assert daemon.errors == []

    run()
