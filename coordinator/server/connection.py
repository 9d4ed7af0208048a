"""One client connection: frames in, responses out, in request order (Kafka's rule).

An ``asyncio.Protocol`` (not streams: measured faster) feeding a :class:`FrameDecoder`. Each
complete frame becomes a *slot* in the connection's response queue; a slot is filled when its
request is answered (at once, or when the shard commits it, or when a parked long-poll heartbeat
returns), and responses are written strictly in slot order, so a parked heartbeat holds back the
requests behind it on the same connection, as docs/protocol.md says.

Malformed frames (bad size, oversized, unparseable header) close the connection; nothing else
about one connection can affect another.

Security (docs/security.md). A connection belongs to one listener (:class:`Served`):
on SSL and SASL_SSL listeners asyncio has done the TLS handshake before ``connection_made``
(an SSL listener's verified client certificate gives the principal); on SASL_PLAINTEXT and
SASL_SSL listeners the connection speaks Kafka's SaslServerAuthenticator before anything else:

* before authentication only ApiVersions and SaslHandshake v1 are served; any other request
  closes the connection unanswered (as Kafka). SaslHandshake v0 (raw SASL tokens after it) is
  answered UNSUPPORTED_VERSION in a SaslHandshakeResponse v0 and the connection closed;
* after SaslHandshake only SaslAuthenticate is (another request is answered ILLEGAL_SASL_STATE
  and the connection closed); the mechanism (coordinator.security.sasl) runs one token per
  SaslAuthenticate, PLAIN's password derivation in a thread (reading stops meanwhile);
* a failure (UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE) is
  answered after ``connection.failed.authentication.delay.ms``, then the connection is closed;
* success sets the principal (``User:<name>``) and, with ``connections.max.reauth.ms``, the
  session's end (told in SaslAuthenticate v1+'s SessionLifetimeMs). A SaslHandshake on an
  authenticated connection starts a re-authentication (KIP-368: same mechanism, same principal,
  or the connection is closed); a request other than SaslHandshake received after the session
  ended closes the connection (as Kafka).

Until authenticated, frames are limited to ``sasl.server.max.receive.size``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as _HandshakeV0

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.framing import (
    FrameDecoder,
    FramingError,
    MalformedHeader,
    encode_response_frame,
    peek_request_api,
    request_client_id,
)
from coordinator import logs
from coordinator.group.coordinator import RequestContext
from coordinator.metrics import Metrics
from coordinator.security import ANONYMOUS, Security
from coordinator.security import sasl as mechanisms
from coordinator.security.tls import peer_principal
from coordinator.server.kafka_apis import Encoded, build

log = logs.get("coordinator.connection")

# Why a connection is not read (Connection._pause, a bit set). INFLIGHT and WRITE also stop
# running the requests already received (they wait in the backlog); BUDGET only stops reading.
INFLIGHT = 1  # socket.max.inflight.requests / socket.max.inflight.bytes reached
WRITE = 2  # unsent responses above socket.write.buffer.bytes (the transport's pause_writing)
BUDGET = 4  # queued.max.request.bytes reached, and this connection holds some of it
HEAVY = 8  # a request whose answer grows with the state (not the request) is in flight
AUTH = 16  # a SASL step runs off the loop, or a failed authentication waits for its answer
_RUN_STOP = INFLIGHT | WRITE | HEAVY | AUTH
# APIs whose answer's size depends on what the daemon holds, not on the request: one at a time
# per connection (found by review: ten pipelined ConnectGroupDescribe of one big group, never
# read, built ten 61 MB answers at once; a backlog of 10,000-topic Metadata ran for seconds in
# one callback). Workers never pipeline these; heartbeats are not among them.
_HEAVY_KEYS = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_GROUPS,
                         ApiKey.LIST_GROUPS, ApiKey.CONNECT_GROUP_DESCRIBE,
                         ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT,
                         ApiKey.CONNECT_GROUP_FETCH_OFFSETS})
_DRAIN_SLICE_S = 0.005  # a backlog drain yields to the loop after this long
_PEER_CLOSED = (7, 8)  # Linux TCP states CLOSE and CLOSE_WAIT (tcp_info.tcpi_state)



def _peer_gone(sock: Any) -> bool:
    """The peer closed (Linux TCP_INFO: CLOSE or CLOSE_WAIT); False when it cannot be told."""
    if sock is None:
        return False
    try:
        if sock.fileno() < 0:  # the connection was closed meanwhile (asyncio's socket is -1)
            return True
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in _PEER_CLOSED
    except (AttributeError, OSError, ValueError):
        return False


_Route = tuple[Any, type, bool, int]  # (API, request class, flexible request header, response header)
_ROUTES: dict[tuple[int, int], _Route] = {}


def _route(api_key: int, version: int) -> _Route | None:
    """What a request of ``api_key``/``version`` needs, looked up once per pair (None:
    unsupported)."""
    route = _ROUTES.get((api_key, version))
    if route is None:
        known = APIS.get(api_key)
        if known is None or not known.supports(version):
            return None
        route = _ROUTES[(api_key, version)] = (
            known, known.request_class(version), known.request_header_version(version) == 2,
            known.response_header_version(version))
    return route


@dataclass(frozen=True)
class Served:
    """A listener as its connections see it."""

    name: str = "PLAINTEXT"
    protocol: str = "PLAINTEXT"
    mechanisms: tuple[str, ...] = ()
    """SASL mechanisms offered here (PLAIN only on TLS unless sasl.plain.allow.insecure)."""
    ssl: ssl.SSLContext | None = None

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


PLAINTEXT = Served()


class Router(Protocol):
    """What a connection asks of the request router (coordinator.server.app.Router)."""

    def api_versions(self, version: int, error: int = 0) -> Any: ...

    def malformed(self, api_key: int, version: int, message: str) -> Any | None: ...

    def dispatch(self, api_key: int, version: int, req: Any, ctx: RequestContext) -> Any: ...

    def error_response(self, request: Any, code: int, message: str, items: bool = True) -> Any: ...


class Host(Protocol):
    """What a connection asks of the server that accepted it (coordinator.server.app's
    CoordinatorServer, which imports this module): its limits, the byte budget every
    connection shares, the router, the security state, PLAIN's thread pool, the metrics and the
    rate-limited log lines."""

    max_frame_bytes: int
    max_inflight_requests: int
    max_inflight_bytes: int
    write_buffer_bytes: int
    max_held_bytes: int
    held_bytes: int
    over_budget: bool
    sasl_max_receive_bytes: int
    max_reauth_ms: int
    auth_timeout_s: float
    auth_failure_delay_s: float
    plain_executor: Executor
    plain_pending: int
    plain_max_pending: int
    router: Router
    security: Security
    metrics: Metrics

    def register(self, conn: Connection) -> bool: ...

    def unregister(self, conn: Connection) -> None: ...

    def enter_budget(self) -> None: ...

    def check_budget(self) -> None: ...

    def plain_refused(self, peer: str, listener: str) -> None: ...

    def auth_failure_logged(self, peer: str, listener: str, mechanism: str, user: str | None,
                            reason: str, reauth: bool) -> None: ...

    def closing_logged(self, peer: str, reason: str, level: str = "info",
                       **details: Any) -> None: ...

# SASL states of a connection on a SASL listener (Kafka's SaslServerAuthenticator.SaslState).
HANDSHAKE = 0  # before SaslHandshake: ApiVersions and SaslHandshake only
AUTHENTICATE = 1  # after SaslHandshake: SaslAuthenticate only
BUSY = 2  # a mechanism step runs in a thread (reading stopped)
AUTHENTICATED = 3
FAILED = 4  # the failure's answer is waiting for the delay; then the connection is closed
LINGER_S = 1.0  # a connection whose authentication failed is closed by then at the latest
_SASL_HANDSHAKE = int(ApiKey.SASL_HANDSHAKE)
_SASL_AUTHENTICATE = int(ApiKey.SASL_AUTHENTICATE)
_API_VERSIONS = int(ApiKey.API_VERSIONS)


class _Sasl:
    """A SASL connection's authentication state."""

    __slots__ = ("state", "server", "mechanism", "expires", "reauth", "user")

    def __init__(self) -> None:
        self.state = HANDSHAKE
        self.server: mechanisms.MechanismServer | None = None
        self.mechanism = ""  # of the current session (or the one being negotiated)
        self.expires: float | None = None  # monotonic end of the session (KIP-368)
        self.reauth = False  # the exchange in progress re-authenticates a session
        self.user: str | None = None


class _LastBody:
    """The last response encoded and its bytes: steady heartbeats share one immutable response
    object per (epoch, interval), so consecutive answers usually encode the same object."""

    __slots__ = ("response", "body")

    def __init__(self) -> None:
        self.response: Any = None
        self.body = b""


_LAST = _LastBody()


class _Slot:
    """One request's place in the connection's response order."""

    __slots__ = ("correlation_id", "header_version", "api", "started", "frame", "error_code",
                 "request", "size", "heavy")

    def __init__(self, correlation_id: int, header_version: int, api: str, started: float,
                 size: int) -> None:
        self.correlation_id = correlation_id
        self.header_version = header_version
        self.api = api
        self.started = started
        self.size = size  # the request frame's bytes, held (in flight) until answered
        self.frame: bytes | None = None
        self.error_code = 0
        self.request: Any = None  # the decoded request (for an error response in its stead)
        self.heavy = False  # one of _HEAVY_KEYS: counted in Connection._heavy until written


class Connection(asyncio.Protocol):
    def __init__(self, server: Host, listener: Served = PLAINTEXT) -> None:
        self.server = server
        self.listener = listener
        self.principal = ANONYMOUS
        self._sasl: _Sasl | None = None
        self._closing = False  # close once the pending answers are written (auth failure)
        self._lingering = False  # ... written: input is discarded until the peer or a timer closes
        self.decoder = FrameDecoder(server.max_frame_bytes)
        self.pending: deque[_Slot] = deque()
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.last_request = time.monotonic()
        self.closed = False
        self._pause = 0  # INFLIGHT | WRITE | BUDGET: reading is paused while non-zero
        self._backlog: deque[bytes] = deque()  # received, not yet run (INFLIGHT or WRITE)
        # Bytes this connection holds, all in server.held_bytes (queued.max.request.bytes):
        self._partial = 0  # of the partial frame in the decoder
        self._queued = 0  # of the frames in the backlog
        self._inflight = 0  # of the requests run and not yet answered (their slots)
        self._max_inflight = server.max_inflight_requests
        self._max_inflight_bytes = server.max_inflight_bytes
        self._flush_scheduled = False
        self._drain_scheduled = False
        self._heavy = 0  # requests of _HEAVY_KEYS run and not yet written
        self._lost = False  # connection_lost ran: slots filled later are not counted
        self._peer_closed = False  # seen in CLOSE_WAIT while paused for the budget
        self._eof = False  # the peer half-closed: close after the pending responses
        self._ctx = RequestContext(listener=listener.name)  # the last request's context: reused
        self._auth_timer: asyncio.TimerHandle | None = None  # sasl.authentication.timeout.ms

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # pause_writing() past this many unsent response bytes, resume_writing() at a quarter.
        high = self.server.write_buffer_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else str(peer)
        listener = self.listener
        if listener.protocol == "SSL":  # (on SASL_SSL the SASL user is the principal)
            self.principal = peer_principal(transport.get_extra_info("ssl_object")) or ANONYMOUS
        elif listener.sasl:
            self._sasl = _Sasl()
            self.decoder.max_frame_size = self.server.sasl_max_receive_bytes
            # sasl.authentication.timeout.ms: not authenticated by then, closed.
            self._auth_timer = asyncio.get_running_loop().call_later(
                self.server.auth_timeout_s, self._auth_timed_out)
        self._ctx = RequestContext(client_host=self.peer, principal=self.principal,
                                   listener=listener.name)
        if not self.server.register(self):
            self.server.closing_logged(self.peer, "connection limit reached", level="warning")
            self.closed = True
            transport.abort()

    def _auth_timed_out(self) -> None:
        self._auth_timer = None
        sasl = self._sasl
        if self.closed or sasl is None or self.principal != ANONYMOUS:
            return
        self.server.auth_failure_logged(
            self.peer, self.listener.name, sasl.mechanism, sasl.user,
            "not authenticated within sasl.authentication.timeout.ms: closing", False)
        self._count_auth(sasl.mechanism, False, False)
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._lost = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        server = self.server
        server.held_bytes -= self._partial + self._queued + self._inflight
        self._partial = self._queued = self._inflight = self._heavy = 0
        self._backlog.clear()
        # Answers still to come have nowhere to go; their bytes were given back just above
        # (a later _flush or _forget must not give them back twice).
        self.pending.clear()
        server.unregister(self)
        if self.listener.ssl is not None:
            server.heap.churn(time.monotonic())
        if server.over_budget:
            server.check_budget()

    def pause_writing(self) -> None:  # the transport holds more than socket.write.buffer.bytes
        self._stop(WRITE)

    def resume_writing(self) -> None:  # ... and is down to a quarter of it
        self._go(WRITE)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        decoder = self.decoder
        try:
            frames = decoder.feed(data)
        except FramingError as exc:
            self.server.closing_logged(self.peer, "bad frame", error=str(exc))
            self.close()
            return
        server = self.server
        partial = decoder.buffered
        if partial != self._partial:
            server.held_bytes += partial - self._partial
            self._partial = partial
        if frames:
            now = self.last_request = time.monotonic()
            if self._pause & _RUN_STOP or self._backlog:
                self._enqueue(frames, 0)
            else:
                handle = self._handle
                for i, frame in enumerate(frames):
                    # A frame that closed the connection (malformed header, ...) ends it: the
                    # frames after it in the same chunk must not be executed (they were,
                    # writes included).
                    if self.closed:
                        return
                    handle(frame, now)
                    if self._pause & _RUN_STOP:  # in-flight limits or a full write buffer
                        self._enqueue(frames, i + 1)
                        break
        if server.held_bytes > server.max_held_bytes and (self._partial or self._queued) \
                and not self._peer_closed:
            if not server.over_budget:
                server.enter_budget()
            self._stop(BUDGET)

    def _enqueue(self, frames: list[bytes], start: int) -> None:
        """Keep ``frames[start:]`` for later (_drain): they were read but may not run yet."""
        added = 0
        for frame in frames[start:]:
            self._backlog.append(frame)
            added += len(frame)
        self._queued += added
        self.server.held_bytes += added

    def _drain(self) -> None:
        """Run backlogged requests until a limit stops it again (or none is left), yielding to
        the loop every few milliseconds (a backlog must not hold everyone else up)."""
        self._drain_scheduled = False
        backlog = self._backlog
        now = time.monotonic()
        until = now + _DRAIN_SLICE_S
        while backlog and not self._pause & _RUN_STOP and not self.closed:
            frame = backlog.popleft()
            self._queued -= len(frame)
            self.server.held_bytes -= len(frame)
            self._handle(frame, now)
            if backlog and time.monotonic() > until:
                if not self._drain_scheduled:
                    self._drain_scheduled = True
                    asyncio.get_running_loop().call_soon(self._drain)
                return

    @property
    def holds_input(self) -> bool:
        return bool(self._partial or self._queued)

    @property
    def read_paused(self) -> bool:
        return bool(self._pause)

    def pause_for_budget(self) -> None:
        if not self._peer_closed:
            self._stop(BUDGET)

    def check_peer_closed(self) -> None:
        """A connection not read for the budget does not see its peer go away (nobody polls
        it); the reaper asks the kernel (Linux TCP_INFO: CLOSE_WAIT = the peer sent FIN) and a
        closed peer's connection is read again: what it sent is bounded by the socket's
        receive buffer, and its end of stream closes it, giving its bytes back to the budget."""
        if not self._pause & BUDGET or self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        except (AttributeError, OSError):
            return
        if state in _PEER_CLOSED:
            self._peer_closed = True
            self._go(BUDGET)

    def resume_after_budget(self) -> None:
        self._go(BUDGET)

    def _stop(self, reason: int) -> None:
        if not self._pause and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._pause |= reason

    def _go(self, reason: int) -> None:
        if not self._pause & reason:
            return
        self._pause &= ~reason
        if reason & _RUN_STOP and not self._pause & _RUN_STOP:
            self._drain()
        if not self._pause and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        if self._lingering:
            return None
        # Close once we answered what we got. Returning None closed the transport at once,
        # dropping the responses to requests still in flight (a client that half-closes after
        # sending got nothing); keep the write side open until they are written (_flush).
        if not self.pending and not self._backlog:
            return None
        self._eof = True
        return True

    # -- requests ------------------------------------------------------------------------------
    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def _handle(self, frame: bytes, started: float) -> None:
        try:
            api_key, version, correlation_id = peek_request_api(frame)
        except MalformedHeader as exc:
            self.server.closing_logged(self.peer, "malformed header", error=str(exc))
            self.close()
            return
        sasl = self._sasl
        if sasl is not None and (sasl.state != AUTHENTICATED or api_key == _SASL_HANDSHAKE
                                 or (sasl.expires is not None and started >= sasl.expires)):
            if self._sasl_gate(sasl, api_key, version, correlation_id, frame, started):
                return
        route = _route(api_key, version)
        if route is None:
            api = APIS.get(api_key)
            # UNSUPPORTED_VERSION, answered as Kafka answers an ApiVersions it cannot serve: an
            # ApiVersionsResponse v0 listing what we support (header v0).
            # One "Unknown" label for every unknown key (the metrics' api label): a label per
            # key let a client create up to 65536 request-count series.
            name = api.name if api is not None else "Unknown"
            slot = self._slot(correlation_id, 0, name, started, len(frame))
            self._fill(slot, self.server.router.api_versions(0, ErrorCode.UNSUPPORTED_VERSION),
                       ErrorCode.UNSUPPORTED_VERSION)
            return
        api, request_class, flexible_header, response_header = route
        heavy = api_key in _HEAVY_KEYS
        if heavy and self._heavy:
            # One at a time: back to the head of the backlog until the one in flight is written.
            self._backlog.appendleft(frame)
            self._queued += len(frame)
            self.server.held_bytes += len(frame)
            self._stop(HEAVY)
            return
        try:
            client_id, offset = request_client_id(frame, flexible_header)
        except MalformedHeader as exc:
            self.server.closing_logged(self.peer, "malformed header", error=str(exc))
            self.close()
            return
        # self._slot(), inlined (the per-request path).
        size = len(frame)
        slot = _Slot(correlation_id, response_header, api.name, started, size)
        if heavy:
            slot.heavy = True
            self._heavy += 1
        pending = self.pending
        pending.append(slot)
        self._inflight += size
        self.server.held_bytes += size
        if len(pending) >= self._max_inflight or self._inflight >= self._max_inflight_bytes:
            self._stop(INFLIGHT)
        try:
            request = codec.decode(request_class, frame, offset)[0]
        except codec.DecodeError as exc:
            response = self.server.router.malformed(api_key, version, str(exc))
            if response is None:  # a Kafka API: Kafka closes the connection too
                self.server.closing_logged(self.peer, "malformed request", api=api.name,
                                           error=str(exc))
                self._forget(slot)
                self.close()
                return
            self._fill(slot, response, ErrorCode.INVALID_REQUEST)
            return
        slot.request = request
        ctx = self._ctx
        if ctx.client_id != (client_id or "") or ctx.client_host != self.peer:
            ctx = self._ctx = RequestContext(client_id=client_id or "", client_host=self.peer,
                                             principal=self.principal,
                                             listener=self.listener.name)
        try:
            answer = self.server.router.dispatch(api_key, version, request, ctx)
        except Exception as exc:  # a bug must not take the daemon (or this connection) down
            self._failed(slot, exc)
            return
        if isinstance(answer, asyncio.Future):
            answer.add_done_callback(lambda f: self._done(slot, f))
        else:
            self._fill(slot, answer, getattr(answer, "error_code", 0))

    def _done(self, slot: _Slot, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self.close()
            return
        exc = future.exception()
        if exc is not None:
            self._failed(slot, exc)
            return
        response = future.result()
        self._fill(slot, response, int(getattr(response, "error_code", 0) or 0))

    def _failed(self, slot: _Slot, exc: BaseException) -> None:
        """A handler raised (a bug): answer UNKNOWN_SERVER_ERROR, as Kafka answers an
        unexpected exception, and keep serving (the requests behind it were lost with the
        connection)."""
        log.error("request failed", api=slot.api, error=repr(exc), peer=self.peer)
        self._fill_error(slot, ErrorCode.UNKNOWN_SERVER_ERROR, f"internal error: {exc!r}")

    def _fill_error(self, slot: _Slot, code: int, message: str) -> None:
        router = self.server.router
        for items in (True, False):  # the last resort: no per-item entries
            try:
                body = codec.encode(router.error_response(slot.request, code, message, items))
            except Exception as exc:
                log.error("cannot encode an error response", api=slot.api, error=repr(exc))
                continue
            self._fill(slot, None, code, body)
            return
        self._forget(slot)
        self.close()

    def _slot(self, correlation_id: int, header_version: int, api: str, started: float,
              size: int) -> _Slot:
        """A request's place in the response order; it counts as in flight until written."""
        slot = _Slot(correlation_id, header_version, api, started, size)
        pending = self.pending
        pending.append(slot)
        self._inflight += size
        self.server.held_bytes += size
        if len(pending) >= self._max_inflight or self._inflight >= self._max_inflight_bytes:
            self._stop(INFLIGHT)
        return slot

    def _forget(self, slot: _Slot) -> None:
        try:
            self.pending.remove(slot)
        except ValueError:  # the connection was lost meanwhile (connection_lost cleared it)
            return
        self._inflight -= slot.size
        self.server.held_bytes -= slot.size
        if slot.heavy:
            self._heavy -= 1
            if not self._heavy and self._pause & HEAVY:
                asyncio.get_running_loop().call_soon(self._go, HEAVY)

    def _fill(self, slot: _Slot, response: Any, error_code: int, body: bytes | None = None) -> None:
        if body is not None:
            pass
        elif response is _LAST.response:
            body = _LAST.body
        elif type(response) is Encoded:  # a refusal built as bytes (kafka_apis.refuse_items)
            body = response.body
        else:
            try:
                body = codec.encode(response)
            except Exception as exc:  # no encoder failure may take the connection down
                log.error("cannot encode a response", api=slot.api, error=repr(exc), peer=self.peer)
                if slot.request is None:  # unsupported version / malformed: nothing to answer
                    self._forget(slot)
                    self.close()
                    return
                self._fill_error(slot, ErrorCode.UNKNOWN_SERVER_ERROR,
                                 f"the response could not be encoded: {exc}")
                return
            _LAST.response, _LAST.body = response, body
        frame = slot.frame = encode_response_frame(slot.correlation_id, body, slot.header_version)
        slot.error_code = int(error_code)
        if not self._lost:
            # The answer counts in the connection's in-flight bytes and the global budget until
            # it is handed to the transport (whose own buffer is bounded by pause_writing).
            extra = len(frame)
            slot.size += extra
            self._inflight += extra
            self.server.held_bytes += extra
            if self._inflight >= self._max_inflight_bytes:
                self._stop(INFLIGHT)
        # Flush once at the end of this loop turn: every response a shard commit resolved in
        # the same turn goes out in one write.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        metrics = self.server.metrics
        ready: list[bytes] = []
        now = time.monotonic()
        pending = self.pending
        freed = 0
        heavy_done = False
        while pending and pending[0].frame is not None:
            slot = pending.popleft()
            ready.append(slot.frame)  # type: ignore[arg-type]
            freed += slot.size
            if slot.heavy:
                self._heavy -= 1
                heavy_done = True
            metrics.request_done(slot.api, slot.error_code, now - slot.started)
        if freed:
            self._inflight -= freed
            server = self.server
            server.held_bytes -= freed
            if server.over_budget:
                server.check_budget()
        if ready and not self.closed and self.transport is not None:
            # One write (one send syscall) for every response ready in order, not one each.
            self.transport.write(ready[0] if len(ready) == 1 else b"".join(ready))
            # Idleness counts from the last request *or response*: a long-polled heartbeat
            # longer than socket.idle.timeout.ms got its connection reaped right after
            # its answer, before the client could send the next heartbeat.
            self.last_request = now
        if self._pause & INFLIGHT and len(pending) <= self._max_inflight // 2 \
                and self._inflight <= self._max_inflight_bytes // 2:
            self._go(INFLIGHT)
        if heavy_done and not self._heavy and self._pause & HEAVY:
            self._go(HEAVY)
        if self._eof and not pending and not self._backlog:
            self.close()
        elif self._closing and not pending and not self._lingering:
            self._linger()

    @property
    def idle_for(self) -> float:
        return time.monotonic() - self.last_request if not (self.pending or self._backlog) else 0.0

    def _linger(self) -> None:
        """The last answer (an authentication failure) is written: close when the peer does, or
        after LINGER_S, reading and discarding meanwhile. Closing at once sent our FIN with the
        answer, and kafka-python 3.0.12 drops data that arrives with the end of stream (it saw
        "socket disconnected", never SASL_AUTHENTICATION_FAILED, and retried for ever);
        unread input at close would also turn the FIN into a reset that can discard the answer."""
        self._lingering = True
        self._backlog.clear()
        self.server.held_bytes -= self._queued + self._partial
        self._queued = self._partial = 0
        self._pause = 0
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
            asyncio.get_running_loop().call_later(LINGER_S, self.close)

    # -- SASL (Kafka's SaslServerAuthenticator; see the module docstring) --------------------------
    def _sasl_gate(self, sasl: _Sasl, api_key: int, version: int, correlation_id: int,
                   frame: bytes, started: float) -> bool:
        """A request on a SASL connection that is not authenticated, or a SaslHandshake, or a
        request after the session ended. True: handled here (else: served as usual)."""
        state = sasl.state
        if state == AUTHENTICATED:
            if api_key == _SASL_HANDSHAKE:  # KIP-368: re-authentication on this connection
                self._sasl_handshake(sasl, version, correlation_id, frame, started, reauth=True)
                return True
            # The session ended and the client did not re-authenticate: as Kafka, close.
            log.info("closing connection: SASL session expired", peer=self.peer,
                     principal=self.principal, listener=self.listener.name)
            self.server.metrics.sessions_expired.inc()
            self.close()
            return True
        if state == HANDSHAKE:
            if api_key == _API_VERSIONS:
                return False
            if api_key == _SASL_HANDSHAKE:
                self._sasl_handshake(sasl, version, correlation_id, frame, started, reauth=False)
                return True
            name = APIS[api_key].name if api_key in APIS else f"API {api_key}"
            self.server.closing_logged(self.peer, "request before SASL authentication",
                                       listener=self.listener.name, api=name)
            self._count_auth("", False, False)
            self.close()
            return True
        if state == AUTHENTICATE and api_key == _SASL_AUTHENTICATE:
            self._sasl_authenticate(sasl, version, correlation_id, frame, started)
            return True
        if state == AUTHENTICATE:
            # Kafka answers the request with ILLEGAL_SASL_STATE and closes.
            route = _route(api_key, version)
            request = None
            if route is not None:
                try:
                    offset = request_client_id(frame, route[2])[1]
                    request = codec.decode(route[1], frame, offset)[0]
                except (MalformedHeader, codec.DecodeError):
                    request = None
            name = route[0].name if route is not None else "Unknown"
            if request is None:
                self._count_auth(sasl.mechanism, False, sasl.reauth)
                self.close()
                return True
            slot = self._slot(correlation_id, route[3], name, started, len(frame))  # type: ignore[index]
            slot.request = request
            message = f"Unexpected Kafka request of type {name} during SASL authentication."
            try:
                response = self.server.router.error_response(request, ErrorCode.ILLEGAL_SASL_STATE,
                                                             message)
            except Exception:  # noqa: BLE001 (nothing to answer with: just close)
                self._forget(slot)
                self.close()
                return True
            self._sasl_fail(sasl, slot, response, ErrorCode.ILLEGAL_SASL_STATE, message)
            return True
        # BUSY / FAILED: reading is stopped; nothing more is served on this connection.
        self.close()
        return True

    def _sasl_handshake(self, sasl: _Sasl, version: int, correlation_id: int, frame: bytes,
                        started: float, reauth: bool) -> None:
        offered = self.listener.mechanisms
        if version == 0:
            # Raw SASL tokens would follow a v0 handshake: not served (Kafka 4.0 removed it).
            slot = self._slot(correlation_id, 0, "SaslHandshake", started, len(frame))
            message = ("SaslHandshake v0 (SASL tokens without SaslAuthenticate framing) is not "
                       "supported: use SaslHandshake v1 and SaslAuthenticate")
            response = _HandshakeV0(error_code=ErrorCode.UNSUPPORTED_VERSION,  # type: ignore[arg-type]
                                    mechanisms=offered)
            self._sasl_fail(sasl, slot, response, ErrorCode.UNSUPPORTED_VERSION, message)
            return
        route = _route(_SASL_HANDSHAKE, version)
        if route is None:  # a version we do not know: the generic UNSUPPORTED_VERSION answer
            slot = self._slot(correlation_id, 0, "SaslHandshake", started, len(frame))
            self._fill(slot, self.server.router.api_versions(0, ErrorCode.UNSUPPORTED_VERSION),
                       ErrorCode.UNSUPPORTED_VERSION)
            self._closing = True
            self._stop(AUTH)
            return
        api, request_class, flexible, header = route
        try:
            offset = request_client_id(frame, flexible)[1]
            request = codec.decode(request_class, frame, offset)[0]
        except (MalformedHeader, codec.DecodeError) as exc:
            self.server.closing_logged(self.peer, "malformed SaslHandshake", error=str(exc))
            self._count_auth("", False, reauth)
            self.close()
            return
        slot = self._slot(correlation_id, header, api.name, started, len(frame))
        slot.request = request
        cls = api.response_class(version)
        wanted = request.mechanism
        sasl.reauth = reauth
        if reauth and wanted != sasl.mechanism:
            message = (f"re-authentication must use the session's mechanism {sasl.mechanism}, "
                       f"not {wanted}")
            self._sasl_fail(sasl, slot, build(cls, {
                "error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                "mechanisms": [sasl.mechanism]}), ErrorCode.UNSUPPORTED_SASL_MECHANISM, message)
            return
        if wanted not in offered:
            message = (f"Unsupported SASL mechanism {wanted!r} on listener {self.listener.name} "
                       f"(enabled: {', '.join(offered)})")
            sasl.mechanism = wanted
            self._sasl_fail(sasl, slot, build(cls, {
                "error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(offered)}),
                ErrorCode.UNSUPPORTED_SASL_MECHANISM, message)
            return
        sasl.server = mechanisms.new_server(wanted, self.server.security.scram_credential)
        sasl.mechanism = wanted
        sasl.state = AUTHENTICATE
        self._fill(slot, build(cls, {"error_code": 0, "mechanisms": list(offered)}), 0)

    def _sasl_authenticate(self, sasl: _Sasl, version: int, correlation_id: int, frame: bytes,
                           started: float) -> None:
        route = _route(_SASL_AUTHENTICATE, version)
        if route is None:
            self.server.closing_logged(self.peer, "unsupported SaslAuthenticate version",
                                       version=version)
            self._count_auth(sasl.mechanism, False, sasl.reauth)
            self.close()
            return
        api, request_class, flexible, header = route
        try:
            offset = request_client_id(frame, flexible)[1]
            request = codec.decode(request_class, frame, offset)[0]
        except (MalformedHeader, codec.DecodeError) as exc:
            self.server.closing_logged(self.peer, "malformed SaslAuthenticate", error=str(exc))
            self._count_auth(sasl.mechanism, False, sasl.reauth)
            self.close()
            return
        slot = self._slot(correlation_id, header, api.name, started, len(frame))
        slot.request = request
        cls = api.response_class(version)
        server = sasl.server
        assert server is not None
        token = bytes(request.auth_bytes)
        if not server.blocking:
            try:
                result: bytes | mechanisms.SaslFailure = server.step(token)
            except mechanisms.SaslFailure as exc:
                result = exc
            self._sasl_stepped(sasl, slot, cls, result)
            return
        # PLAIN: parse and look the credential up here, derive the password in a thread.
        try:
            server.prepare(token)  # type: ignore[attr-defined]
        except mechanisms.SaslFailure as exc:
            self._sasl_stepped(sasl, slot, cls, exc)
            return
        # On its own small pool (the default executor runs every partition's fsync), with a
        # bound on the derivations waiting. Past it the server is busy, which is not a wrong
        # password: no SASL_AUTHENTICATION_FAILED (clients treat that as fatal); the connection
        # is closed unanswered after connection.failed.authentication.delay.ms, as Kafka's
        # connection throttling does, and clients reconnect with backoff (docs/security.md).
        daemon = self.server
        if daemon.plain_pending >= daemon.plain_max_pending:
            daemon.plain_refused(self.peer, self.listener.name)
            self._sasl_busy(sasl)
            return
        sasl.state = BUSY
        self._stop(AUTH)
        daemon.plain_pending += 1
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        finish = server.finish  # type: ignore[attr-defined]

        def derive() -> bytes:
            # Reading is paused meanwhile, so the loop does not see a client that has gone: ask
            # the kernel before the costly part (a gone client's derivation is not run).
            if _peer_gone(sock):
                raise mechanisms.SaslFailure("Authentication failed: the client has gone")
            result: bytes = finish()
            return result
        future = asyncio.get_running_loop().run_in_executor(daemon.plain_executor, derive)

        def stepped(f: asyncio.Future[bytes]) -> None:
            daemon.plain_pending -= 1
            # Retrieved before anything else: a client gone meanwhile left an exception that
            # asyncio would otherwise log as a multi-line "never retrieved" traceback.
            exc = f.exception() if not f.cancelled() else mechanisms.SaslFailure("cancelled")
            if self._lost:
                return
            outcome: bytes | mechanisms.SaslFailure
            if exc is None:
                outcome = f.result()
            elif isinstance(exc, mechanisms.SaslFailure):
                outcome = exc
            else:
                log.error("SASL step failed", error=repr(exc), peer=self.peer)
                outcome = mechanisms.SaslFailure("Authentication failed: internal error")
            sasl.state = AUTHENTICATE
            self._sasl_stepped(sasl, slot, cls, outcome)
            if sasl.state != FAILED:
                self._go(AUTH)
        future.add_done_callback(stepped)

    def _sasl_busy(self, sasl: _Sasl) -> None:
        """Too many PLAIN derivations in progress: nothing more is read; the connection is
        closed unanswered after connection.failed.authentication.delay.ms (not counted as an
        authentication failure: the client may retry)."""
        sasl.state = FAILED
        sasl.server = None
        self._stop(AUTH)
        delay = self.server.auth_failure_delay_s
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self.close)
        else:
            self.close()

    def _sasl_stepped(self, sasl: _Sasl, slot: _Slot, cls: type,
                      outcome: bytes | mechanisms.SaslFailure) -> None:
        server = sasl.server
        assert server is not None
        if isinstance(outcome, mechanisms.SaslFailure):
            sasl.user = server.user
            self._sasl_fail(sasl, slot, build(cls, {
                "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": str(outcome),
                "auth_bytes": b""}), ErrorCode.SASL_AUTHENTICATION_FAILED, str(outcome))
            return
        if not server.done:
            self._fill(slot, build(cls, {"error_code": 0, "error_message": None,
                                         "auth_bytes": outcome}), 0)
            return
        principal = f"User:{server.user}"
        if sasl.reauth and principal != self.principal:
            sasl.user = server.user
            message = ("Cannot change principals during re-authentication from "
                       f"{self.principal}: {principal}")
            self._sasl_fail(sasl, slot, build(cls, {
                "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": message,
                "auth_bytes": b""}), ErrorCode.SASL_AUTHENTICATION_FAILED, message)
            return
        lifetime_ms = self.server.max_reauth_ms
        sasl.state = AUTHENTICATED
        sasl.server = None
        sasl.user = server.user
        sasl.expires = time.monotonic() + lifetime_ms / 1000 if lifetime_ms > 0 else None
        self._count_auth(sasl.mechanism, True, sasl.reauth)
        if not sasl.reauth:
            self.principal = principal
            self.decoder.max_frame_size = self.server.max_frame_bytes
            self._ctx = RequestContext(client_host=self.peer, principal=principal,
                                       listener=self.listener.name)
            log.debug("authenticated", peer=self.peer, principal=principal,
                      mechanism=sasl.mechanism, listener=self.listener.name)
        self._fill(slot, build(cls, {"error_code": 0, "error_message": None, "auth_bytes": outcome,
                                     "session_lifetime": lifetime_ms}), 0)

    def _sasl_fail(self, sasl: _Sasl, slot: _Slot, response: Any, code: int, reason: str) -> None:
        """Authentication failed: nothing more is read or run; ``response`` is answered after
        connection.failed.authentication.delay.ms, then the connection is closed."""
        sasl.state = FAILED
        sasl.server = None
        self._stop(AUTH)
        self._count_auth(sasl.mechanism, False, sasl.reauth)
        self.server.auth_failure_logged(self.peer, self.listener.name, sasl.mechanism, sasl.user,
                                        reason, sasl.reauth)

        def answer() -> None:
            if self._lost:
                return
            self._closing = True
            self._fill(slot, response, code)
        delay = self.server.auth_failure_delay_s
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, answer)
        else:
            answer()

    def _count_auth(self, mechanism: str, ok: bool, reauth: bool) -> None:
        label = mechanism if mechanism in mechanisms.MECHANISMS else ("none" if not mechanism
                                                                      else "unknown")
        self.server.metrics.authentications.labels(
            label, "success" if ok else "failure", "true" if reauth else "false").inc()
