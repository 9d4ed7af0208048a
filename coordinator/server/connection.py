"""One client connection: frames in, responses out, in request order (Kafka's rule).

An ``asyncio.Protocol`` (not streams: measured faster) feeding a :class:`FrameDecoder`. Each
complete frame becomes a *slot* in the connection's response queue; a slot is filled when its
request is answered (at once, or when the shard commits it, or when a parked long-poll heartbeat
returns), and responses are written strictly in slot order, so a parked heartbeat holds back the
requests behind it on the same connection, as PROTOCOL.md says.

Malformed frames (bad size, oversized, unparseable header) close the connection; nothing else
about one connection can affect another.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from connect_wire import codec
from connect_wire.apis import APIS
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
from coordinator.server.kafka_apis import Encoded

if TYPE_CHECKING:
    from coordinator.server.app import CoordinatorServer

log = logs.get("coordinator.connection")
MAX_PENDING = 1024

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
                 "request")

    def __init__(self, correlation_id: int, header_version: int, api: str, started: float) -> None:
        self.correlation_id = correlation_id
        self.header_version = header_version
        self.api = api
        self.started = started
        self.frame: bytes | None = None
        self.error_code = 0
        self.request: Any = None  # the decoded request (for an error response in its stead)


class Connection(asyncio.Protocol):
    def __init__(self, server: CoordinatorServer) -> None:
        self.server = server
        self.decoder = FrameDecoder(server.max_frame_bytes)
        self.pending: deque[_Slot] = deque()
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.last_request = time.monotonic()
        self.closed = False
        self._paused = False
        self._flush_scheduled = False
        self._eof = False  # the peer half-closed: close after the pending responses
        self._ctx = RequestContext()  # the last request's context (client id, peer): reused

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else str(peer)
        if not self.server.register(self):
            log.warning("connection limit reached: closing", peer=self.peer)
            self.closed = True
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.unregister(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except FramingError as exc:
            log.info("closing connection: bad frame", peer=self.peer, error=str(exc))
            self.close()
            return
        if not frames:
            return
        now = self.last_request = time.monotonic()
        for frame in frames:
            # A frame that closed the connection (malformed header, ...) ends it: the frames
            # after it in the same chunk must not be executed (they were, writes included).
            if self.closed:
                return
            self._handle(frame, now)

    def eof_received(self) -> bool | None:
        # Close once we answered what we got. Returning None closed the transport at once,
        # dropping the responses to requests still in flight (a client that half-closes after
        # sending got nothing); keep the write side open until they are written (_flush).
        if not self.pending:
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
            log.info("closing connection: malformed header", peer=self.peer, error=str(exc))
            self.close()
            return
        route = _route(api_key, version)
        if route is None:
            api = APIS.get(api_key)
            # UNSUPPORTED_VERSION, answered as Kafka answers an ApiVersions it cannot serve: an
            # ApiVersionsResponse v0 listing what we support (header v0).
            # One "Unknown" label for every unknown key (the metrics' api label): a label per
            # key let a client create up to 65536 request-count series.
            name = api.name if api is not None else "Unknown"
            slot = _Slot(correlation_id, 0, name, started)
            self.pending.append(slot)
            self._fill(slot, self.server.router.api_versions(0, ErrorCode.UNSUPPORTED_VERSION),
                       ErrorCode.UNSUPPORTED_VERSION)
            return
        api, request_class, flexible_header, response_header = route
        try:
            client_id, offset = request_client_id(frame, flexible_header)
        except MalformedHeader as exc:
            log.info("closing connection: malformed header", peer=self.peer, error=str(exc))
            self.close()
            return
        slot = _Slot(correlation_id, response_header, api.name, started)
        self.pending.append(slot)
        if len(self.pending) >= MAX_PENDING and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        try:
            request = codec.decode(request_class, frame, offset)[0]
        except codec.DecodeError as exc:
            response = self.server.router.malformed(api_key, version, str(exc))
            if response is None:  # a Kafka API: Kafka closes the connection too
                log.info("closing connection: malformed request", peer=self.peer, api=api.name,
                         error=str(exc))
                self.pending.remove(slot)
                self.close()
                return
            self._fill(slot, response, ErrorCode.INVALID_REQUEST)
            return
        slot.request = request
        ctx = self._ctx
        if ctx.client_id != (client_id or "") or ctx.client_host != self.peer:
            ctx = self._ctx = RequestContext(client_id=client_id or "", client_host=self.peer)
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
        self.pending.remove(slot)
        self.close()

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
                    self.pending.remove(slot)
                    self.close()
                    return
                self._fill_error(slot, ErrorCode.UNKNOWN_SERVER_ERROR,
                                 f"the response could not be encoded: {exc}")
                return
            _LAST.response, _LAST.body = response, body
        slot.frame = encode_response_frame(slot.correlation_id, body, slot.header_version)
        slot.error_code = int(error_code)
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
        while self.pending and self.pending[0].frame is not None:
            slot = self.pending.popleft()
            ready.append(slot.frame)  # type: ignore[arg-type]
            metrics.request_done(slot.api, slot.error_code, now - slot.started)
        if ready and not self.closed and self.transport is not None:
            # One write (one send syscall) for every response ready in order, not one each.
            self.transport.write(ready[0] if len(ready) == 1 else b"".join(ready))
            # Idleness counts from the last request *or response*: a long-polled heartbeat
            # longer than socket.idle.timeout.ms got its connection reaped right after
            # its answer, before the client could send the next heartbeat.
            self.last_request = now
        if self._eof and not self.pending:
            self.close()
            return
        if self._paused and len(self.pending) < MAX_PENDING // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    @property
    def idle_for(self) -> float:
        return time.monotonic() - self.last_request if not self.pending else 0.0
