"""A small KRPC node that speaks Kafka's SASL the way a broker does (kio + scramp), on a real
socket with optional real TLS: the client side of issue 13 is tested against it until (and
besides) the daemon's own listener.

* ApiVersions (lists SaslHandshake v0-1 and SaslAuthenticate v0-``authenticate_max``), then on
  a SASL node SaslHandshake (UNSUPPORTED_SASL_MECHANISM for a mechanism it does not enable) and
  SaslAuthenticate: PLAIN, SCRAM-SHA-256 and -512 with salted credentials made as Kafka makes
  them (the password's UTF-8 bytes, no SASLprep; scramp's server checks the proofs;
  SASL_AUTHENTICATION_FAILED with Kafka's message for a bad password, after
  ``failure_delay_s``). Before authentication any other request closes the connection, as
  Kafka's SaslServerAuthenticator.
* ``session_lifetime_ms`` > 0: SaslAuthenticate v1+ answers it (KIP-368); a request other than
  SaslHandshake after the session ended closes the connection (counted in ``expired``), and a
  SaslHandshake on an authenticated connection starts a re-authentication (``reauths``).
* FindCoordinator and Metadata name the node itself; ListGroups lists ``groups``;
  ConnectGroupHeartbeat gives the member epoch 1 and no work (or ``heartbeat_error``);
  ConnectGroupDescribe an empty group. ``on`` maps an API key to a function (request,
  connection state) -> response to change an answer.
* ``log``: (connection number, API name, version, principal) of every request, in order.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import socketserver
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scramp import ScramException, ScramMechanism

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.client_security import _kio_request, wire_types
from connect_wire.framing import encode_response_frame, parse_request_header
from coordinator.server.kafka_apis import build

SASL_NAMES = {17: "SaslHandshake", 36: "SaslAuthenticate"}
KAFKA_SCRAM_FAILED = ("Authentication failed during authentication due to invalid credentials "
                      "with SASL mechanism {}")


def kafka_auth_info(mechanism: str, password: str, iterations: int = 4096) -> tuple[bytes, bytes, bytes, int]:
    """(salt, StoredKey, ServerKey, iterations) as Kafka's broker makes them: the password's
    UTF-8 bytes, no SASLprep (scramp's make_auth_info applies it)."""
    name = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    salt = os.urandom(32)
    salted = hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    return (salt, hashlib.new(name, client_key).digest(),
            hmac.new(salted, b"Server Key", name).digest(), iterations)


def request_class(key: int, version: int) -> type:
    if key == 17:
        return _kio_request("sasl_handshake", version)
    if key == 36:
        return _kio_request("sasl_authenticate", version)
    return APIS[key].request_class(version)


@dataclass
class Conn:
    number: int
    principal: str = "User:ANONYMOUS"
    authenticated: bool = False
    mechanism: str | None = None
    scram: Any = None
    step: int = 0
    user: str = "?"
    expires: float | None = None
    peer_cert: dict[str, Any] | None = None
    closed_because: str | None = None


@dataclass
class _Stats:
    log: list[tuple[int, str, int, str]] = field(default_factory=list)
    auths: list[tuple[int, str, str, bool]] = field(default_factory=list)  # conn, user, mech, ok
    reauths: int = 0
    expired: int = 0
    tls_failures: list[str] = field(default_factory=list)
    connections: int = 0


class SaslNode(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *, users: dict[str, str] | None = None, sasl: bool = True,
                 mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                 ssl_context: ssl.SSLContext | None = None, session_lifetime_ms: int = 0,
                 authenticate_max: int = 2, failure_delay_s: float = 0.0,
                 groups: tuple[str, ...] = (), heartbeat_error: int = 0,
                 on: dict[int, Callable[[Any, Conn], Any]] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.users = dict(users or {})
        self.sasl = sasl
        self.mechanisms = mechanisms
        self.ssl_context = ssl_context
        self.session_lifetime_ms = session_lifetime_ms
        self.authenticate_max = authenticate_max
        self.failure_delay_s = failure_delay_s
        self.groups = groups
        self.heartbeat_error = heartbeat_error
        self.on = dict(on or {})
        self.stats = _Stats()
        self.lock = threading.Lock()
        self._credentials: dict[tuple[str, str], tuple[bytes, bytes, bytes, int]] = {}
        for user, password in self.users.items():
            for m in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                self._credentials[(user, m)] = kafka_auth_info(m, password)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    # -- addresses --------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def __enter__(self) -> SaslNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def apis_seen(self) -> list[str]:
        with self.lock:
            return [name for _, name, _, _ in self.stats.log]

    # -- answers ----------------------------------------------------------------------------
    def api_versions(self, cls: type) -> Any:
        keys = [{"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
                for a in APIS.values() if a.key not in (17, 36)]
        if self.sasl:
            keys += [{"api_key": 17, "min_version": 0, "max_version": 1},
                     {"api_key": 36, "min_version": 0, "max_version": self.authenticate_max}]
        return build(cls, {"error_code": 0, "api_keys": sorted(keys, key=lambda k: k["api_key"]),
                           "throttle_time": 0})

    def answer(self, key: int, version: int, req: Any, conn: Conn) -> Any:
        cls = wire_types(type(req))[3]
        if key in self.on:
            resp = self.on[key](req, conn)
            if resp is not None:
                return resp
        if key == ApiKey.API_VERSIONS:
            return self.api_versions(cls)
        if key == 17:
            return self._handshake(cls, req, conn)
        if key == 36:
            return self._authenticate(cls, req, conn, version)
        if key == ApiKey.FIND_COORDINATOR:
            return build(cls, {"throttle_time": 0, "coordinators": [
                {"key": k, "node_id": 0, "host": "127.0.0.1", "port": self.port, "error_code": 0,
                 "error_message": None} for k in req.coordinator_keys]})
        if key == ApiKey.METADATA:
            return build(cls, {"throttle_time": 0, "cluster_id": "test", "controller_id": 0,
                               "topics": [], "cluster_authorized_operations": -2147483648,
                               "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": self.port,
                                            "rack": None}]})
        if key == ApiKey.LIST_GROUPS:
            return build(cls, {"throttle_time": 0, "error_code": 0, "groups": [
                {"group_id": g, "protocol_type": "connect", "group_state": "Stable",
                 "group_type": "connect"} for g in self.groups]})
        if key == ApiKey.CONNECT_GROUP_HEARTBEAT:
            if self.heartbeat_error:
                return build(cls, {"error_code": self.heartbeat_error,
                                   "error_message": f"Not authorized: {conn.principal}",
                                   "member_epoch": 0, "heartbeat_interval_ms": 1000})
            return build(cls, {"member_id": req.member_id or uuid.uuid4().hex, "member_epoch": 1,
                               "heartbeat_interval_ms": 300, "should_compute_assignment": False,
                               "assignment": None})
        if key == ApiKey.CONNECT_GROUP_DESCRIBE:
            return build(cls, {"groups": [{"group_id": g, "group_state": "Empty", "error_code": 0}
                                          for g in req.group_ids]})
        raise AssertionError(f"SaslNode: no answer for API {key}")

    def _handshake(self, cls: type, req: Any, conn: Conn) -> Any:
        if req.mechanism not in self.mechanisms:
            return build(cls, {"error_code": 33, "mechanisms": list(self.mechanisms)})
        if conn.authenticated:
            with self.lock:
                self.stats.reauths += 1
        conn.mechanism, conn.scram, conn.step = req.mechanism, None, 0
        return build(cls, {"error_code": 0, "mechanisms": list(self.mechanisms)})

    def _fail(self, cls: type, conn: Conn, user: str, message: str) -> Any:
        with self.lock:
            self.stats.auths.append((conn.number, user, conn.mechanism or "", False))
        time.sleep(self.failure_delay_s)
        conn.closed_because = "authentication failed"
        return build(cls, {"error_code": 58, "error_message": message, "auth_bytes": b"",
                           "session_lifetime": 0})

    def _succeed(self, cls: type, conn: Conn, user: str, auth_bytes: bytes, version: int) -> Any:
        with self.lock:
            self.stats.auths.append((conn.number, user, conn.mechanism or "", True))
        conn.authenticated = True
        conn.principal = f"User:{user}"
        life = self.session_lifetime_ms if version >= 1 else 0
        conn.expires = time.monotonic() + life / 1000 if life else None
        conn.mechanism = None
        return build(cls, {"error_code": 0, "error_message": None, "auth_bytes": auth_bytes,
                           "session_lifetime": life})

    def _authenticate(self, cls: type, req: Any, conn: Conn, version: int) -> Any:
        mech = conn.mechanism
        data = bytes(req.auth_bytes)
        if mech == "PLAIN":
            parts = data.split(b"\0")
            if len(parts) != 3:
                return self._fail(cls, conn, "?", "Invalid SASL/PLAIN response")
            user, password = parts[1].decode(), parts[2].decode()
            if self.users.get(user) != password:
                return self._fail(cls, conn, user, "Authentication failed: Invalid username or password")
            return self._succeed(cls, conn, user, b"", version)
        assert mech is not None, "SaslAuthenticate before SaslHandshake"
        if conn.step == 0:
            creds = self._credentials

            def auth_fn(username: str) -> tuple[bytes, bytes, bytes, int]:
                conn.user = username
                found = creds.get((username, mech))
                if found is None:  # an unknown user: a made-up credential, so it fails late
                    return kafka_auth_info(mech, "\0unknown")
                return found

            conn.scram = ScramMechanism(mech).make_server(auth_fn)
            try:
                conn.scram.set_client_first(data.decode())
            except ScramException as exc:
                return self._fail(cls, conn, "?", str(exc))
            conn.step = 1
            return build(cls, {"error_code": 0, "error_message": None,
                               "auth_bytes": conn.scram.get_server_first().encode(),
                               "session_lifetime": 0})
        user = conn.user
        try:
            conn.scram.set_client_final(data.decode())
        except ScramException:
            return self._fail(cls, conn, user, KAFKA_SCRAM_FAILED.format(mech))
        if user not in self.users:
            return self._fail(cls, conn, user, KAFKA_SCRAM_FAILED.format(mech))
        return self._succeed(cls, conn, user, conn.scram.get_server_final().encode(), version)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: SaslNode = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        with server.lock:
            server.stats.connections += 1
            conn = Conn(server.stats.connections)
        if server.ssl_context is not None:
            sock = server.ssl_context.wrap_socket(sock, server_side=True,
                                                  do_handshake_on_connect=False)
            try:
                sock.do_handshake()  # (wrap_socket's own would close the socket on failure)
            except (ssl.SSLError, OSError) as exc:
                with server.lock:
                    server.stats.tls_failures.append(repr(exc))
                # Close gracefully: the client's first request (sent right after its side of a
                # TLS 1.3 handshake) unread at close() would make the kernel send a reset,
                # which can overtake the alert saying why (a client then sees only an EOF).
                try:
                    sock.shutdown(socket.SHUT_WR)
                    sock.settimeout(0.5)
                    while sock.recv(65536):
                        pass
                except OSError:
                    pass
                return
            conn.peer_cert = sock.getpeercert()
            if conn.peer_cert:
                short = {"commonName": "CN", "organizationalUnitName": "OU"}
                subject = ",".join(f"{short.get(k, k)}={v}"
                                   for rdn in conn.peer_cert["subject"] for k, v in rdn)
                conn.principal = f"User:{subject}"
        try:
            self._serve(server, sock, conn)
        except (OSError, ssl.SSLError):
            pass
        finally:
            sock.close()

    def _serve(self, server: SaslNode, sock: socket.socket, conn: Conn) -> None:
        while conn.closed_because is None:
            size = _recv(sock, 4)
            if size is None:
                return
            frame = _recv(sock, struct.unpack(">i", size)[0])
            if frame is None:
                return
            key, version = struct.unpack_from(">hh", frame)
            cls = request_class(key, version)
            _, _, request_header, _, response_header = wire_types(cls)
            header, offset = parse_request_header(frame, request_header == 2)
            req = codec.decode(cls, frame, offset)[0]
            with server.lock:
                server.stats.log.append((conn.number, SASL_NAMES.get(key) or APIS[key].name,
                                         version, conn.principal))
            if server.sasl:
                if not conn.authenticated and key not in (17, 18, 36):
                    return  # Kafka: only ApiVersions and SASL before authentication
                if conn.expires is not None and time.monotonic() > conn.expires and key != 17 \
                        and conn.mechanism is None:
                    with server.lock:
                        server.stats.expired += 1
                    return  # KIP-368: the session ended without a re-authentication
            resp = server.answer(key, version, req, conn)
            sock.sendall(encode_response_frame(header.correlation_id, codec.encode(resp),
                                               response_header))


def _recv(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data
