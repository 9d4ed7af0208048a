"""An in-process coordinator with listeners of every security protocol, for the transport's
security tests, and a blocking KRPC client that speaks its SASL by hand.

    security = MemorySecurity()
    security.add_user("alice", "secret")                 # SCRAM-SHA-256 and -512 credentials
    with InProcess(tmp_path, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0"}, security) as d:
        with Raw(d.address("SASL_PLAINTEXT")) as c:
            c.scram("alice", "secret")                   # ApiVersions, SaslHandshake, SaslAuthenticate
            c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(...))

``MemorySecurity`` implements :class:`coordinator.security.Security` in memory: credentials made
by scramp (never the password), and a small authorizer (super users; ALLOW entries of
(principal, operation, resource type, name or ``*``); READ, ALTER, DELETE and WRITE imply
DESCRIBE; ``calls`` records every decision asked). The daemon's real security state
(coordinator.security.state) is tested against the real daemon in tests/test_security_clients.py;
this one keeps the transport's tests independent of it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scramp import ScramClient, ScramMechanism

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.framing import encode_request_frame, parse_response_header
from coordinator import config
from coordinator.security import SCRAM_MECHANISMS, ScramCredential
from coordinator.server.app import CoordinatorServer


class MemorySecurity:
    def __init__(self, super_users: Iterable[str] = (), allow_if_no_acl: bool = False) -> None:
        self.credentials: dict[tuple[str, str], ScramCredential] = {}
        self.allowed: set[tuple[str, str, str, str]] = set()
        self.super_users = set(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self.calls: list[tuple[str, str, str, str, str]] = []

    def add_user(self, name: str, password: str, mechanisms: Iterable[str] = SCRAM_MECHANISMS,
                 iterations: int = 4096) -> None:
        for m in mechanisms:
            salt, stored, server, i = ScramMechanism(m).make_auth_info(password, iterations)
            self.credentials[(name, m)] = ScramCredential(m, salt, stored, server, i)

    def allow(self, principal: str, operation: str, resource_type: str, name: str) -> None:
        self.allowed.add((principal, operation, resource_type, name))

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.credentials.get((user, mechanism))

    def authorize(self, principal: str, host: str, operation: str, resource_type: str,
                  name: str) -> bool:
        self.calls.append((principal, host, operation, resource_type, name))
        if principal in self.super_users:
            return True
        ops = {operation}
        if operation == "DESCRIBE":
            ops |= {"READ", "ALTER", "DELETE", "WRITE"}
        for p, op, rt, n in self.allowed:
            if p in (principal, "User:*") and rt == resource_type and n in (name, "*") \
                    and (op in ops or op == "ALL"):
                return True
        if self.allow_if_no_acl and not any(rt == resource_type and n in (name, "*")
                                            for _, _, rt, n in self.allowed):
            return True
        return False


class InProcess:
    """A CoordinatorServer on its own event-loop thread, ``overrides`` on top of test defaults,
    ``security`` as its security state."""

    def __init__(self, tmp: Path, overrides: dict[str, Any] | None = None,
                 security: Any = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda loop, context: self.errors.append(context))
        values = {"data.dir": str(tmp / "data"), "partitions": 2, "listeners": "127.0.0.1:0",
                  "metrics.listener": "none", "log.fsync": "never",
                  "group.connect.session.timeout.ms": 2000,
                  "group.connect.heartbeat.interval.ms": 200, "log.level": "error",
                  "connection.failed.authentication.delay.ms": 0}
        values.update(overrides or {})
        self.config = config.load(None, values, environ={})
        self.security = security
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: CoordinatorServer = self.run(self._start())

    async def _start(self) -> CoordinatorServer:
        server = CoordinatorServer(self.config)
        if self.security is not None:
            server.security = self.security  # type: ignore[attr-defined]
        await server.start()
        return server

    def run(self, coroutine: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def address(self, listener: str | None = None) -> tuple[str, int]:
        bound = self.server.bound_listeners
        host, port = bound[listener] if listener else next(iter(bound.values()))
        return ("127.0.0.1" if host == "0.0.0.0" else host), port

    def metric(self, name: str, **labels: str) -> float:
        value = self.server.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    def stop(self) -> None:
        self.run(self.server.stop(grace_s=1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Closed(Exception):
    """The server closed the connection."""


class Raw:
    """A blocking KRPC connection that does SASL by hand (tests see every step)."""

    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext | None = None,
                 timeout: float = 10.0) -> None:
        sock = socket.create_connection(address, timeout=timeout)
        self.sock: socket.socket = (tls.wrap_socket(sock, server_hostname=address[0])
                                    if tls is not None else sock)
        self.correlation = 0
        self.session_lifetime_ms: int | None = None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, api_key: int, version: int, request: Any, client_id: str = "test") -> int:
        self.correlation += 1
        api = APIS[api_key]
        header = api.request_header_version(version) if api.supports(version) else 1
        self.sock.sendall(encode_request_frame(api_key, version, self.correlation, client_id,
                                               codec.encode(request), header))
        return self.correlation

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def _read_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise Closed(f"connection closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def receive_frame(self) -> bytes:
        try:
            size = struct.unpack(">i", self._read_exact(4))[0]
        except (ConnectionResetError, ssl.SSLError) as exc:
            raise Closed(repr(exc)) from None
        return self._read_exact(size)

    def receive(self, api_key: int, version: int, correlation: int,
                response_class: type | None = None) -> Any:
        frame = self.receive_frame()
        api = APIS[api_key]
        cls = response_class or api.response_class(version)
        header = api.response_header_version(version) if api.supports(version) else 0
        got, offset = parse_response_header(frame, header)
        assert got == correlation, (got, correlation)
        return codec.decode(cls, frame, offset)[0]

    def call(self, api_key: int, version: int, request: Any, **kw: Any) -> Any:
        return self.receive(api_key, version, self.send(api_key, version, request, **kw))

    def closed(self, timeout: float = 5.0) -> bool:
        """Whether the server closes the connection (EOF) within ``timeout`` (bytes sent
        meanwhile are an error)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1)
        except (ConnectionResetError, ssl.SSLError, ssl.SSLEOFError):
            return True
        except TimeoutError:
            return False
        assert data == b"", f"unexpected bytes {data!r}"
        return True

    # -- SASL steps ----------------------------------------------------------------------------
    def api_versions(self) -> Any:
        from kio.schema.api_versions.v3.request import ApiVersionsRequest
        return self.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest(
            client_software_name="test", client_software_version="1"))

    def handshake(self, mechanism: str, version: int = 1) -> Any:
        cls = (APIS[ApiKey.SASL_HANDSHAKE].request_class(version) if version >= 1 else
               _handshake_v0())
        correlation = self.send(ApiKey.SASL_HANDSHAKE, version, cls(mechanism=mechanism))
        if version == 0:
            from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse
            return self.receive(ApiKey.SASL_HANDSHAKE, 0, correlation, SaslHandshakeResponse)
        return self.receive(ApiKey.SASL_HANDSHAKE, version, correlation)

    def authenticate(self, token: bytes, version: int = 2) -> Any:
        cls = APIS[ApiKey.SASL_AUTHENTICATE].request_class(version)
        response = self.call(ApiKey.SASL_AUTHENTICATE, version, cls(auth_bytes=token))
        lifetime = getattr(response, "session_lifetime", None)
        if lifetime is not None and not response.error_code:
            self.session_lifetime_ms = int(lifetime.total_seconds() * 1000)
        return response

    def scram(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256",
              version: int = 2, handshake: bool = True) -> Any:
        """The whole exchange; the last SaslAuthenticate response (or the first error)."""
        if handshake:
            shook = self.handshake(mechanism)
            if shook.error_code:
                return shook
        client = ScramClient([mechanism], user, password)
        first = self.authenticate(client.get_client_first().encode(), version)
        if first.error_code:
            return first
        client.set_server_first(first.auth_bytes.decode())
        final = self.authenticate(client.get_client_final().encode(), version)
        if not final.error_code:
            client.set_server_final(final.auth_bytes.decode())
        return final

    def plain(self, user: str, password: str, version: int = 2) -> Any:
        shook = self.handshake("PLAIN")
        if shook.error_code:
            return shook
        return self.authenticate(b"\0" + user.encode() + b"\0" + password.encode(), version)


def _handshake_v0() -> type:
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest
    return SaslHandshakeRequest
