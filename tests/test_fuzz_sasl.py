"""Fuzzing the SASL exchange: garbage, truncated and out-of-order SaslHandshake
/ SaslAuthenticate sequences against a real server over TCP (in process, tests/secure_server.py,
so that an exception reaching the event loop is seen), checked against Kafka's
SaslServerAuthenticator rules (docs/security.md, "SASL"):

* a step is sent, then its answer read (or the end of the connection): before SaslHandshake only
  ApiVersions is answered (anything else closes unanswered); a handshake for a mechanism that
  is not enabled is answered UNSUPPORTED_SASL_MECHANISM and the connection closes; after the
  handshake only SaslAuthenticate (another request: ILLEGAL_SASL_STATE, closed); a token that
  is not the exchange's next valid one: SASL_AUTHENTICATION_FAILED, closed;
* nothing is served (no ListGroups answered without error) unless a complete, genuine SCRAM
  exchange happened on the connection (the server's final signature checked by the client);
* pipelined garbage (many frames at once, cut anywhere) never gets past authentication either;
* no exception reaches the event loop, and after every example a new client authenticates and
  is served.

A last pass runs raw garbage against a daemon *process* (uvloop, TLS) and checks it still serves.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kio.schema.list_groups.v4.request import ListGroupsRequest
from scramp import ScramClient

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.framing import encode_request_frame
from tests.secure_server import Closed, InProcess, MemorySecurity, Raw
from tests.tls_fixture import TlsFiles, tls_ca  # noqa: F401 (the fixture)

USER, PASSWORD = "alice", "alice-secret"
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    security = MemorySecurity()
    security.add_user(USER, PASSWORD)
    with InProcess(tmp_path_factory.mktemp("fuzz-sasl"), {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "connection.failed.authentication.delay.ms": 0,
            "sasl.server.max.receive.size": 4096}, security) as d:
        yield d
        assert d.errors == []


def served(d: InProcess) -> None:
    with Raw(d.address()) as c:
        assert not c.scram(USER, PASSWORD, mechanism="SCRAM-SHA-512").error_code
        assert not c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=())).error_code


# == one step at a time ================================================================================

STEPS = st.sampled_from([
    "api_versions", "handshake_ok", "handshake_other", "handshake_bad", "handshake_v0",
    "next_token", "next_token", "next_token", "garbage_token", "truncated_token",
    "wrong_proof", "list_groups", "heartbeat", "garbage_frame", "authenticate_v0",
])


class Model:
    """What the client knows: the SASL state it drove the server into."""

    def __init__(self) -> None:
        self.state = "handshake"  # handshake | authenticate | authenticated
        self.mechanism = ""
        self.client: ScramClient | None = None
        self.stage = 0  # 0: client-first next, 1: client-final next
        self.authenticated = False  # a genuine exchange completed on this connection
        self.garbled = False  # a token that was not the exchange's own was accepted


def _expect_closed(c: Raw) -> None:
    try:
        frame = c.receive_frame()
    except Closed:
        return
    raise AssertionError(f"answered {frame[:40]!r} where the connection should close")


def _step(c: Raw, m: Model, step: str, data: st.DataObject) -> bool:
    """Run one step and check the answer; False once the connection is (rightly) closed."""
    if step == "api_versions":
        if m.state == "authenticate":
            c.send(ApiKey.API_VERSIONS, 3, _api_versions())
            r = c.receive(ApiKey.API_VERSIONS, 3, c.correlation)
            assert r.error_code == ErrorCode.ILLEGAL_SASL_STATE
            return False
        assert not c.api_versions().error_code
        return True
    if step.startswith("handshake"):
        if m.state == "authenticate":
            c.send(ApiKey.SASL_HANDSHAKE, 1, _handshake("SCRAM-SHA-256"))
            r = c.receive(ApiKey.SASL_HANDSHAKE, 1, c.correlation)
            assert r.error_code == ErrorCode.ILLEGAL_SASL_STATE
            return False
        if step == "handshake_v0":
            assert c.handshake("SCRAM-SHA-256", version=0).error_code == ErrorCode.UNSUPPORTED_VERSION
            return False
        if step == "handshake_bad":
            name = data.draw(st.sampled_from(["GSSAPI", "PLAIN", "", "scram-sha-256",
                                              "SCRAM-SHA-1", "OAUTHBEARER", "x" * 200, "\u00e9"]))
            assert c.handshake(name).error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
            return False
        if m.state == "authenticated":  # re-authentication: the session's mechanism only
            mechanism = m.mechanism if step == "handshake_ok" else _other(m.mechanism)
        else:
            mechanism = data.draw(st.sampled_from(MECHANISMS))
        r = c.handshake(mechanism)
        if step == "handshake_other" and m.state == "authenticated":
            assert r.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
            return False
        assert not r.error_code, r
        m.state, m.mechanism, m.stage = "authenticate", mechanism, 0
        m.client = ScramClient([mechanism], USER, PASSWORD)
        m.garbled = False
        return True
    if step in ("next_token", "garbage_token", "truncated_token", "wrong_proof",
                "authenticate_v0"):
        if m.state == "handshake":
            c.send(ApiKey.SASL_AUTHENTICATE, 2, _authenticate(b"x"))
            _expect_closed(c)
            return False
        if m.state == "authenticated":
            r = c.authenticate(b"x")
            assert r.error_code == ErrorCode.ILLEGAL_SASL_STATE
            return True
        assert m.client is not None
        if step in ("next_token", "authenticate_v0") and not m.garbled:
            version = 0 if step == "authenticate_v0" else data.draw(st.sampled_from([1, 2]))
            token = (m.client.get_client_first() if m.stage == 0 else m.client.get_client_final())
            r = c.authenticate(token.encode(), version)
            assert not r.error_code, r
            if m.stage == 0:
                m.client.set_server_first(r.auth_bytes.decode())
                m.stage = 1
            else:
                m.client.set_server_final(r.auth_bytes.decode())  # the server's proof checked
                m.state, m.authenticated = "authenticated", True
            return True
        if step == "wrong_proof" and m.stage == 1 and not m.garbled:
            wrong = ScramClient([m.mechanism], USER, "not-" + PASSWORD)
            wrong.get_client_first()
            # The right nonce, the wrong proof: rebuild the final with the other password.
            final = m.client.get_client_final()
            head, _, _ = final.rpartition(",p=")
            token = (head + ",p=" + _fake_proof(len(final) - len(head) - 3)).encode()
        elif step == "truncated_token":
            valid = (m.client.get_client_first() if m.stage == 0 else
                     m.client.get_client_final() if not m.garbled else "n,,n=alice,r=x")
            token = valid.encode()[: data.draw(st.integers(0, max(0, len(valid) - 1)))]
        else:
            token = data.draw(st.binary(max_size=200))
        r = c.authenticate(token)
        if r.error_code:
            assert r.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED, r
            return False
        # A token that happens to be a well-formed client-first (another nonce or user): the
        # exchange goes on with it, and can only fail from here.
        assert m.stage == 0, f"a bad client-final was accepted: {token!r}"
        event("a fuzzed client-first was accepted")
        m.stage, m.garbled = 1, True
        return True
    if step in ("list_groups", "heartbeat"):
        key = ApiKey.LIST_GROUPS if step == "list_groups" else ApiKey.CONNECT_GROUP_HEARTBEAT
        request = (ListGroupsRequest(states_filter=()) if step == "list_groups" else _heartbeat())
        version = 4 if step == "list_groups" else 0
        c.send(key, version, request)
        if m.state == "handshake":
            _expect_closed(c)
            return False
        r = c.receive(key, version, c.correlation)
        if m.state == "authenticate":
            assert r.error_code == ErrorCode.ILLEGAL_SASL_STATE
            return False
        assert m.authenticated
        assert not r.error_code or step == "heartbeat", r
        return True
    assert step == "garbage_frame"
    payload = data.draw(st.binary(min_size=0, max_size=7))  # shorter than any request header
    c.send_raw(payload)
    _expect_closed(c)
    return False


def _other(mechanism: str) -> str:
    return MECHANISMS[1 - MECHANISMS.index(mechanism)] if mechanism in MECHANISMS else MECHANISMS[0]


def _fake_proof(n: int) -> str:
    import base64
    import os
    return base64.b64encode(os.urandom(max(1, n * 3 // 4))).decode()[:max(4, n)]


def _api_versions() -> Any:
    return APIS[ApiKey.API_VERSIONS].request_class(3)(client_software_name="f",
                                                      client_software_version="1")


def _handshake(mechanism: str) -> Any:
    return APIS[ApiKey.SASL_HANDSHAKE].request_class(1)(mechanism=mechanism)


def _authenticate(token: bytes) -> Any:
    return APIS[ApiKey.SASL_AUTHENTICATE].request_class(2)(auth_bytes=token)


def _heartbeat() -> Any:
    from tests.test_security_transport import _heartbeat as make
    return make("fuzz")


VALID_START = st.sampled_from([
    [], ["api_versions"], ["handshake_ok"], ["handshake_ok", "next_token"],
    ["api_versions", "handshake_ok", "next_token", "next_token"],
    ["handshake_ok", "next_token", "next_token"]])
SEQUENCES = st.tuples(VALID_START, st.lists(STEPS, min_size=1, max_size=8)).map(
    lambda t: [*t[0], *t[1]])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(SEQUENCES, st.data())
def test_sasl_step_sequences_follow_kafkas_rules(daemon: InProcess, steps: list[str],
                                                 data: st.DataObject) -> None:
    m = Model()
    with Raw(daemon.address(), timeout=10) as c:
        for step in steps:
            if not _step(c, m, step, data):
                event(f"closed after {step}")
                break
        else:
            event("served" if m.authenticated else "still authenticating")
    assert daemon.errors == []
    served(daemon)


# == pipelined garbage ==================================================================================


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["handshake", "authenticate", "list_groups", "garbage", "api"]))
    corr = draw(st.integers(0, 2**31 - 1))
    if kind == "garbage":
        body = draw(st.binary(max_size=64))
        return struct.pack(">i", len(body)) + body
    if kind == "handshake":
        key, version = ApiKey.SASL_HANDSHAKE, draw(st.sampled_from([0, 1, 2]))
        body = codec.encode(_handshake(draw(st.sampled_from([*MECHANISMS, "PLAIN", "", "x" * 50]))))
    elif kind == "authenticate":
        key, version = ApiKey.SASL_AUTHENTICATE, draw(st.sampled_from([0, 1, 2, 3]))
        version_for_body = min(version, 2)
        body = codec.encode(APIS[key].request_class(version_for_body)(
            auth_bytes=draw(st.one_of(st.binary(max_size=100),
                                      st.just(b"n,,n=alice,r=abcdefgh"),
                                      st.just(b"\0alice\0alice-secret")))))
    elif kind == "list_groups":
        key, version = ApiKey.LIST_GROUPS, 4
        body = codec.encode(ListGroupsRequest(states_filter=()))
    else:
        key, version = ApiKey.API_VERSIONS, 3
        body = codec.encode(_api_versions())
    header = 2 if key == ApiKey.SASL_AUTHENTICATE and version >= 2 else (
        2 if key == ApiKey.API_VERSIONS else 1)
    frame = encode_request_frame(key, version, corr, "fuzz", body, header)
    if draw(st.booleans()):  # flip a byte past the size
        at = draw(st.integers(4, len(frame) - 1))
        frame = frame[:at] + bytes([frame[at] ^ draw(st.integers(1, 255))]) + frame[at + 1:]
    return frame


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(frames(), min_size=1, max_size=8), st.integers(0, 64), st.booleans())
def test_pipelined_garbage_never_gets_past_authentication(daemon: InProcess, items: list[bytes],
                                                          cut: int, half_close: bool) -> None:
    stream = b"".join(items)
    if cut:
        stream = stream[: max(0, len(stream) - cut)]  # truncated: a partial frame at the end
    with socket.create_connection(daemon.address(), timeout=10) as s:
        s.sendall(stream + encode_request_frame(ApiKey.LIST_GROUPS, 4, 999_999, "s",
                                                codec.encode(ListGroupsRequest(states_filter=())), 1))
        if half_close:
            s.shutdown(socket.SHUT_WR)
        s.settimeout(3)
        received = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    # No ListGroups answered without an error: ours (correlation 999999) never answered 0.
    at = 0
    while at + 8 <= len(received):
        size, corr = struct.unpack_from(">ii", received, at)
        body = received[at + 8: at + 4 + size]
        if corr == 999_999:
            assert body[:2] != b"\0\0", "ListGroups served without authentication"
        at += 4 + size
    assert daemon.errors == []
    served(daemon)


# == a daemon process ===================================================================================


def test_garbage_against_a_daemon_process_over_tls(tmp_path: Path, tls_ca: TlsFiles) -> None:  # noqa: F811
    """The same kinds of bytes against a real daemon (uvloop, TLS): it keeps serving."""
    import random

    from tests.daemon_fixture import run_cli, start
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    assert run_cli("users", "add", "--data-dir", str(tmp_path / "data"), USER,
                   "--mechanism", "SCRAM-SHA-512", "--password-file", str(pw)).returncode == 0
    d = start(tmp_path / "data", extra_env={
        "CONNECT_COORDINATOR_SSL_CERTFILE": str(tls_ca.server.cert),
        "CONNECT_COORDINATOR_SSL_KEYFILE": str(tls_ca.server.key),
        "CONNECT_COORDINATOR_CONNECTION_FAILED_AUTHENTICATION_DELAY_MS": "0"},
        extra_args=["--listen", "SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"])
    rng = random.Random(13)
    tls = ssl.create_default_context(cafile=str(tls_ca.ca.cert))
    try:
        for i in range(150):
            name = "SASL_SSL" if i % 2 else "SASL_PLAINTEXT"
            host, port = d.listeners[name]
            raw = socket.create_connection((host, port), timeout=5)
            sock = tls.wrap_socket(raw, server_hostname=host) if name == "SASL_SSL" and i % 3 else raw
            with sock:
                if i % 5 == 0:  # a valid handshake, then a garbage token
                    sock.sendall(encode_request_frame(17, 1, 1, "g", codec.encode(
                        _handshake("SCRAM-SHA-512")), 1))
                junk = rng.randbytes(rng.randrange(0, 300))
                if i % 4 == 0:
                    junk = struct.pack(">i", rng.randrange(-5, 1 << 20)) + junk
                try:
                    sock.sendall(junk)
                    sock.settimeout(0.5)
                    sock.recv(4096)
                except (OSError, ssl.SSLError):
                    pass
        with Raw(d.listeners["SASL_SSL"], tls=tls) as c:
            assert not c.scram(USER, PASSWORD, mechanism="SCRAM-SHA-512").error_code
            assert not c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=())).error_code
        assert d.alive()
        assert "Traceback" not in d.stderr() and '"level":"error"' not in d.stderr()
    finally:
        d.stop()
