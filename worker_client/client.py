"""Async KRPC connections from a worker to the coordinator.

* :class:`KrpcConnection` — one TCP connection, requests pipelined, responses matched by
  correlation id in order (Kafka's rule). A request that times out poisons the connection (the
  order is lost), so it is closed and the caller reconnects.
* :class:`CoordinatorClient` — the worker's view of the coordinator: a bootstrap list,
  FindCoordinator, reconnect with exponential backoff and jitter, and **two** connections: one
  for the long-polled heartbeat, one for every other call (PrepareAssignment, Install,
  Describe), since a parked heartbeat holds back whatever follows it on its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections import deque
from collections.abc import Sequence
from typing import Any

from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from connect_wire import codec
from connect_wire.apis import APIS
from connect_wire.errors import ErrorCode, ProtocolError
from connect_wire.framing import FrameDecoder, FramingError, encode_request_frame, parse_response_header

RETRY_COORDINATOR = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE}


def coordinator_error(resp: Any) -> int:
    """The response's error code, or for a one-group answer without one (Describe) that
    group's. (Describe's NOT_COORDINATOR sits on the group: it used to leave the client on the
    old node.)"""
    code = getattr(resp, "error_code", None)
    if code is None:
        groups = getattr(resp, "groups", None) or ()
        code = groups[0].error_code if len(groups) == 1 else 0
    return int(code or 0)


class ConnectionFailed(Exception):
    """The coordinator could not be reached, or the connection broke or timed out."""


class KrpcConnection:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: deque[tuple[int, int, type, asyncio.Future[Any]]] = deque()
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task[None] | None = None
        self.closed = True

    async def open(self, timeout_s: float) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), timeout_s)
        except (TimeoutError, OSError) as exc:
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port}: {exc!r}") from None
        self.closed = False
        self._read_task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        assert self._reader is not None
        decoder = FrameDecoder(64 * 1024 * 1024)
        error: Exception = ConnectionFailed(f"{self.host}:{self.port} closed the connection")
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                for frame in decoder.feed(data):
                    if not self._pending:
                        raise ConnectionFailed("a response nobody asked for")
                    correlation_id, header_version, cls, future = self._pending.popleft()
                    got, offset = parse_response_header(frame, header_version)
                    if got != correlation_id:
                        raise ConnectionFailed(f"correlation id {got}, expected {correlation_id}")
                    if not future.done():
                        future.set_result(codec.decode(cls, frame, offset)[0])
        except (OSError, FramingError, codec.DecodeError, ConnectionFailed) as exc:
            error = exc if isinstance(exc, ConnectionFailed) else ConnectionFailed(repr(exc))
        finally:
            self._fail_all(error)

    def _fail_all(self, error: Exception) -> None:
        self.closed = True
        while self._pending:
            future = self._pending.popleft()[3]
            if not future.done():
                future.set_exception(error)
        if self._writer is not None:
            self._writer.close()

    async def request(self, request: Any, timeout_s: float) -> Any:
        if self.closed or self._writer is None:
            raise ConnectionFailed("connection is closed")
        api = APIS[type(request).__api_key__]
        version = type(request).__version__
        correlation_id = next(self._ids)
        frame = encode_request_frame(api.key, version, correlation_id, self.client_id,
                                     codec.encode(request), api.request_header_version(version))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((correlation_id, api.response_header_version(version),
                              api.response_class(version), future))
        try:
            self._writer.write(frame)
            await self._writer.drain()
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            self.close()
            raise ConnectionFailed(f"{api.name} timed out after {timeout_s:.1f}s") from None
        except OSError as exc:
            self.close()
            raise ConnectionFailed(repr(exc)) from None

    def close(self) -> None:
        if self._read_task is not None:
            self._read_task.cancel()
        self._fail_all(ConnectionFailed("connection closed"))


class CoordinatorClient:
    def __init__(
        self, bootstrap: Sequence[tuple[str, int]], group_id: str, client_id: str = "connect-worker",
        request_timeout_ms: int = 30_000, backoff_ms: int = 100, max_backoff_ms: int = 1_000,
        connect_timeout_ms: int = 2_000, discovery_timeout_ms: int = 2_000,
    ) -> None:
        # max_backoff_ms: was 5,000; a 3 s coordinator restart got a retry scheduled 4.1 s out
        # and the worker's session ran out first (issue 12). 1 s (Kafka's
        # reconnect.backoff.max.ms) keeps retries well inside the heartbeat interval.
        # connect_timeout_ms: a bootstrap address that drops packets cost a whole request
        # timeout (30 s) before the next address was tried; now a TCP connect gets 2 s.
        if not bootstrap:
            raise ValueError("at least one bootstrap address is needed")
        self.bootstrap = list(bootstrap)
        self.group_id = group_id
        self.client_id = client_id
        self.request_timeout_s = request_timeout_ms / 1000
        self.backoff_ms = backoff_ms
        self.max_backoff_ms = max_backoff_ms
        self.connect_timeout_s = min(connect_timeout_ms, request_timeout_ms) / 1000
        # discovery_timeout_ms: FindCoordinator is answered from memory at once; a node that
        # accepts connections but does not answer (frozen, SIGSTOP) held the worker for the
        # whole request timeout (30 s) before it asked the next address (issue 12).
        self.discovery_timeout_s = min(discovery_timeout_ms, request_timeout_ms) / 1000
        self.coordinator: tuple[str, int] | None = None
        self._heartbeat: KrpcConnection | None = None
        self._control: KrpcConnection | None = None
        self._failures = 0
        self._lock = asyncio.Lock()

    def backoff_s(self) -> float:
        """Exponential backoff with full jitter for the next retry."""
        ceiling = min(self.max_backoff_ms, self.backoff_ms * (2 ** min(self._failures, 16)))
        return random.uniform(self.backoff_ms / 2, max(self.backoff_ms, ceiling)) / 1000

    async def _find_coordinator(self) -> tuple[str, int]:
        last: Exception | None = None
        for host, port in random.sample(self.bootstrap, len(self.bootstrap)):
            conn = KrpcConnection(host, port, self.client_id)
            try:
                await conn.open(self.connect_timeout_s)
                resp = await conn.request(
                    FindCoordinatorRequest(key_type=0, coordinator_keys=(self.group_id,)),
                    self.discovery_timeout_s)
            except ConnectionFailed as exc:
                last = exc
                continue
            finally:
                conn.close()
            (c,) = resp.coordinators
            if int(c.error_code) != 0:
                last = ProtocolError(int(c.error_code), c.error_message)
                continue
            return c.host, int(c.port)
        raise ConnectionFailed(f"no coordinator found via {self.bootstrap}: {last}")

    async def _connection(self, which: str) -> KrpcConnection:
        async with self._lock:
            conn = self._heartbeat if which == "heartbeat" else self._control
            if conn is not None and not conn.closed:
                return conn
            if self.coordinator is None:
                self.coordinator = await self._find_coordinator()
            conn = KrpcConnection(*self.coordinator, self.client_id)
            await conn.open(self.connect_timeout_s)
            if which == "heartbeat":
                self._heartbeat = conn
            else:
                self._control = conn
            return conn

    async def send(self, request: Any, which: str = "control", extra_timeout_s: float = 0.0,
                   timeout_s: float | None = None) -> Any:
        """Send on the heartbeat or control connection. Raises ConnectionFailed (the caller
        retries after :meth:`backoff_s`); an error code in the response is the caller's.
        ``timeout_s`` (default: the request timeout) plus ``extra_timeout_s`` bounds the wait
        for the answer; a timeout closes the connection and forgets the coordinator."""
        base = self.request_timeout_s if timeout_s is None else min(timeout_s, self.request_timeout_s)
        try:
            conn = await self._connection(which)
            resp = await conn.request(request, base + extra_timeout_s)
        except ConnectionFailed:
            self._failures += 1
            self.coordinator = None  # rediscover: it may have moved
            raise
        self._failures = 0
        if coordinator_error(resp) in RETRY_COORDINATOR:
            self.invalidate()
        return resp

    def invalidate(self) -> None:
        """Forget the coordinator and drop both connections (NOT_COORDINATOR and friends)."""
        self.coordinator = None
        for conn in (self._heartbeat, self._control):
            if conn is not None:
                conn.close()

    async def close(self) -> None:
        for conn in (self._heartbeat, self._control):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
