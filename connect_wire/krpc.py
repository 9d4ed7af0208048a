"""One async KRPC connection to a coordinator node (:class:`KrpcConnection`), shared by the
worker's client (:mod:`worker_client.client`), the coordinator's own node-to-node forwards and
the benches: requests pipelined, responses matched by correlation id in order (Kafka's rule). A
request that times out poisons the connection (the order is lost), so it is closed and the
caller reconnects. With a :class:`~connect_wire.client_security.ClientSecurity` it also does TLS
and SASL, and re-authenticates before its session ends (KIP-368).
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from collections import deque
from typing import Any

from connect_wire import codec
from connect_wire.client_security import (
    HANDSHAKE_CUT,
    ClientSecurity,
    ExchangeError,
    SecurityError,
    Session,
    open_exchange,
    protocol_mismatch,
    reauth_exchange,
    tls_failure,
    wire_types,
)
from connect_wire.framing import FrameDecoder, FramingError, encode_request_frame, parse_response_header

SETTINGS = "--security-protocol or --client-config"
"""Where a worker's security protocol is set (named when it probably does not match)."""


class ConnectionFailed(Exception):
    """The coordinator could not be reached, or the connection broke or timed out."""


class KrpcConnection:
    """One connection. With ``security`` (and its ``ssl_context``, built once by the owner)
    :meth:`open` also does TLS and SASL, and the connection re-authenticates itself before its
    session ends: new requests wait meanwhile, the ones in flight are answered first."""

    def __init__(self, host: str, port: int, client_id: str,
                 security: ClientSecurity | None = None,
                 ssl_context: ssl.SSLContext | None = None, settings: str = SETTINGS) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self.settings = settings
        self.answers = 0
        """Answers read (none yet: a closed connection hints at another security protocol)."""
        self.security = security
        self.ssl_context = ssl_context
        if security is not None and security.uses_tls and ssl_context is None:
            self.ssl_context = security.ssl_context()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: deque[tuple[int, int, type, asyncio.Future[Any]]] = deque()
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task[None] | None = None
        self._reauth_task: asyncio.Task[None] | None = None
        self._gate: asyncio.Future[None] | None = None  # set while re-authenticating
        self._refused: SecurityError | None = None
        self.session: Session | None = None
        self.reauthentications = 0
        self._auth_timeout_s = 0.0
        self.closed = True

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def open(self, timeout_s: float, auth_timeout_s: float | None = None) -> None:
        """Connect (and TLS) within ``timeout_s``; then authenticate, each answer within
        ``auth_timeout_s`` (default ``timeout_s``). Raises ConnectionFailed, or
        :class:`SecurityError` when the server refuses this client."""
        tls = self.ssl_context
        self._auth_timeout_s = auth_timeout_s or timeout_s
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=tls,
                                        server_hostname=self.host if tls is not None else None,
                                        ssl_handshake_timeout=timeout_s if tls is not None else None),
                timeout_s)
        except (TimeoutError, OSError) as exc:
            refused = tls_failure(exc, self.address, self.security)
            if refused is not None:
                raise refused from None
            if tls is not None and isinstance(exc, HANDSHAKE_CUT):
                raise ConnectionFailed(
                    f"TLS handshake with {self.address} failed ({exc!r}); it does not seem to "
                    f"speak TLS: {protocol_mismatch(self.security, self.settings)}") from None
            raise ConnectionFailed(f"cannot connect to {self.address}: {exc!r}") from None
        self.closed = False
        self._read_task = asyncio.create_task(self._read_loop())
        if self.security is None or self.security.protocol == "PLAINTEXT":
            return
        try:
            self.session = await self._drive(open_exchange(self.security, self.address),
                                             self._auth_timeout_s)
        except BaseException:
            self.close()
            raise
        self._schedule_reauth()

    async def _drive(self, exchange: Any, timeout_s: float) -> Any:
        """Run a client_security exchange on this connection (bypassing the gate)."""
        try:
            request = next(exchange)
            while True:
                request = exchange.send(await self._send(request, timeout_s))
        except StopIteration as done:
            return done.value
        except ExchangeError as exc:
            self.close()
            raise ConnectionFailed(str(exc)) from None

    def _schedule_reauth(self) -> None:
        at = self.session.reauth_at() if self.session is not None else None
        if at is not None and not self.closed:
            self._reauth_task = asyncio.create_task(self._reauthenticate(at))

    async def _reauthenticate(self, at: float) -> None:
        """KIP-368: at ``at`` (monotonic), hold new requests, let those in flight be answered
        (at most half of what is left of the session), then SaslHandshake + SaslAuthenticate."""
        assert self.session is not None and self.security is not None
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self._gate = loop.create_future()
        try:
            end = self.session.started + self.session.lifetime_ms / 1000
            drain_until = time.monotonic() + max(0.0, end - time.monotonic()) / 2
            while self._pending and time.monotonic() < drain_until and not self.closed:
                await asyncio.wait({self._pending[-1][3]}, timeout=drain_until - time.monotonic())
            if self.closed:
                return
            # Behind a parked heartbeat the answer may come only after that one's (up to its
            # MaxWaitMs): the server took the handshake in time; give it the request timeout.
            timeout = max(self._auth_timeout_s, end - time.monotonic())
            self.session = await self._drive(reauth_exchange(self.security, self.session, self.address),
                                             timeout)
            self.reauthentications += 1
        except SecurityError as exc:
            self._refused = exc
            self._fail_all(exc)
            return
        except ConnectionFailed:
            self.close()
            return
        finally:
            gate, self._gate = self._gate, None
            if gate is not None and not gate.done():
                gate.set_result(None)
        self._schedule_reauth()

    async def _read_loop(self) -> None:
        assert self._reader is not None
        decoder = FrameDecoder(64 * 1024 * 1024)
        error: Exception = ConnectionFailed(f"{self.address} closed the connection")
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    if not self.answers:
                        error = ConnectionFailed(
                            f"{self.address} closed the connection before answering anything "
                            f"on it: {protocol_mismatch(self.security, self.settings)}")
                    break
                for frame in decoder.feed(data):
                    if not self._pending:
                        raise ConnectionFailed("a response nobody asked for")
                    self.answers += 1
                    correlation_id, header_version, cls, future = self._pending.popleft()
                    got, offset = parse_response_header(frame, header_version)
                    if got != correlation_id:
                        raise ConnectionFailed(f"correlation id {got}, expected {correlation_id}")
                    if not future.done():
                        future.set_result(codec.decode(cls, frame, offset)[0])
        except (OSError, FramingError, codec.DecodeError, ConnectionFailed) as exc:
            # A TLS alert after the handshake (TLS 1.3: the server refusing our certificate)
            # arrives here, on the first read.
            refused = tls_failure(exc, self.address, self.security) if isinstance(exc, OSError) else None
            if refused is not None:
                self._refused = refused
            error = refused or (exc if isinstance(exc, ConnectionFailed) else ConnectionFailed(repr(exc)))
        finally:
            self._fail_all(error)

    def _fail_all(self, error: Exception) -> None:
        self.closed = True
        while self._pending:
            future = self._pending.popleft()[3]
            if not future.done():
                future.set_exception(error)
                # A request that already gave up (its timeout) no longer awaits this future:
                # mark the exception seen, or asyncio logs "Future exception was never
                # retrieved" when the future is collected.
                future.exception()
        if self._writer is not None:
            self._writer.close()
        if self._reauth_task is not None and self._reauth_task is not asyncio.current_task():
            self._reauth_task.cancel()
        gate, self._gate = self._gate, None
        if gate is not None and not gate.done():
            gate.set_result(None)

    async def request(self, request: Any, timeout_s: float) -> Any:
        gate = self._gate
        if gate is not None:  # re-authenticating: requests wait for it (within their timeout)
            started = time.monotonic()
            try:
                await asyncio.wait_for(asyncio.shield(gate), timeout_s)
            except TimeoutError:
                raise ConnectionFailed(f"re-authentication at {self.address} took longer than "
                                       f"{timeout_s:.1f}s") from None
            timeout_s = max(0.001, timeout_s - (time.monotonic() - started))
        return await self._send(request, timeout_s)

    async def _send(self, request: Any, timeout_s: float) -> Any:
        if self._refused is not None:
            raise self._refused
        if self.closed or self._writer is None:
            raise ConnectionFailed("connection is closed")
        key, version, request_header, response_cls, response_header = wire_types(type(request))
        correlation_id = next(self._ids)
        frame = encode_request_frame(key, version, correlation_id, self.client_id,
                                     codec.encode(request), request_header)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((correlation_id, response_header, response_cls, future))
        try:
            self._writer.write(frame)
            await self._writer.drain()
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            self.close()
            raise ConnectionFailed(f"{type(request).__name__.removesuffix('Request')} timed out "
                                   f"after {timeout_s:.1f}s") from None
        except OSError as exc:
            refused = tls_failure(exc, self.address, self.security)
            read_task = self._read_task
            if refused is None and read_task is not None and not read_task.done():
                # A write can fail first on a connection the server ended with a reason the
                # read loop is about to see (a TLS alert refusing our certificate): wait for it
                # briefly, so that a refusal is not taken for a transient failure.
                await asyncio.wait({read_task}, timeout=0.5)
            refused = refused or self._refused
            self.close()
            if refused is not None:
                raise refused from None
            raise ConnectionFailed(repr(exc)) from None

    def close(self) -> None:
        if self._read_task is not None:
            self._read_task.cancel()
        self._fail_all(ConnectionFailed("connection closed"))
