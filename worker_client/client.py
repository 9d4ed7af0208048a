"""Async KRPC connections from a worker to the coordinator.

* :class:`KrpcConnection` — one TCP connection, requests pipelined, responses matched by
  correlation id in order (Kafka's rule). A request that times out poisons the connection (the
  order is lost), so it is closed and the caller reconnects.
* :class:`CoordinatorClient` — the worker's view of the coordinator: a bootstrap list,
  FindCoordinator, reconnect with exponential backoff and jitter, and **two** connections: one
  for the long-polled heartbeat, one for every other call (PrepareAssignment, Install,
  Describe), since a parked heartbeat holds back whatever follows it on its connection.

Security (:mod:`connect_wire.client_security`): with a :class:`ClientSecurity` every
connection, the FindCoordinator ones to bootstrap nodes included, is opened with TLS when the
protocol says so and authenticated (ApiVersions, SaslHandshake, SaslAuthenticate) before its
first request, and re-authenticated on the same connection before the session lifetime the
server gave ends (KIP-368). A refusal (:class:`SecurityError`: bad credentials, a mechanism the
server does not enable, a certificate that does not verify, GROUP_AUTHORIZATION_FAILED from
FindCoordinator) is raised as such, never as :class:`ConnectionFailed`: retrying cannot fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from typing import Any

from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from connect_wire.client_security import (
    AuthorizationFailed,
    ClientSecurity,
)
from connect_wire.errors import ErrorCode, ProtocolError
from connect_wire.krpc import ConnectionFailed, KrpcConnection

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


FIND_GRACE_S = 0.1
"""After a node answers FindCoordinator with an error, how long the other asks still count."""


class CoordinatorClient:
    def __init__(
        self, bootstrap: Sequence[tuple[str, int]], group_id: str, client_id: str = "connect-worker",
        request_timeout_ms: int = 30_000, backoff_ms: int = 100, max_backoff_ms: int = 1_000,
        connect_timeout_ms: int = 2_000, discovery_timeout_ms: int = 2_000,
        security: ClientSecurity | None = None,
    ) -> None:
        # max_backoff_ms: was 5,000; a 3 s coordinator restart got a retry scheduled 4.1 s out
        # and the worker's session ran out first. 1 s (Kafka's
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
        # whole request timeout (30 s) before it asked the next address.
        self.discovery_timeout_s = min(discovery_timeout_ms, request_timeout_ms) / 1000
        # Security: every connection authenticates; the TLS context (CA and client
        # certificate files) is loaded once, here (SecurityConfigError if it cannot be).
        self.security = security
        self.ssl_context = security.ssl_context() if security is not None else None
        self.coordinator: tuple[str, int] | None = None
        # FindCoordinator's node id of each coordinator address found (one per node: bounded)
        self.node_ids: dict[tuple[str, int], int] = {}
        self._heartbeat: KrpcConnection | None = None
        self._control: KrpcConnection | None = None
        self._failures = 0
        self._lock = asyncio.Lock()

    def backoff_s(self) -> float:
        """Exponential backoff with full jitter for the next retry."""
        ceiling = min(self.max_backoff_ms, self.backoff_ms * (2 ** min(self._failures, 16)))
        return random.uniform(self.backoff_ms / 2, max(self.backoff_ms, ceiling)) / 1000

    async def _find_coordinator(self) -> tuple[str, int]:
        """Ask every bootstrap address at once; the first that names the coordinator wins.
        Asked one after another, a node that accepts connections but does not answer (frozen)
        or drops packets cost its whole timeout before the next one was asked, and with the
        defaults that was enough to end a worker's lease (found by the simulator)."""
        tasks = [asyncio.create_task(self._ask_coordinator(host, port))
                 for host, port in random.sample(self.bootstrap, len(self.bootstrap))]
        last: Exception | None = None
        pending = set(tasks)
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        try:
            while pending:
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                done, pending = await asyncio.wait(pending, timeout=timeout,
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break  # an answer said "nobody now"; the silent ones are not waited for
                for task in done:
                    try:
                        return task.result()
                    except ProtocolError as exc:
                        last = exc
                        # A live node answered that nobody owns the group right now (a
                        # partition moving): give the other asks a moment, then fail and retry
                        # after the backoff rather than wait out a silent node's timeout
                        # (the simulator: deposed-owner seed 61).
                        if deadline is None:
                            deadline = loop.time() + FIND_GRACE_S
                    except ConnectionFailed as exc:
                        last = exc
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        via = ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.bootstrap)
        raise ConnectionFailed(f"no coordinator found via {via}: {last}")

    async def _ask_coordinator(self, host: str, port: int) -> tuple[str, int]:
        conn = self._new_connection(host, port)
        try:
            await conn.open(self.connect_timeout_s, self.discovery_timeout_s)
            resp = await conn.request(
                FindCoordinatorRequest(key_type=0, coordinator_keys=(self.group_id,)),
                self.discovery_timeout_s)
        finally:
            conn.close()
        (c,) = resp.coordinators
        if int(c.error_code) == ErrorCode.GROUP_AUTHORIZATION_FAILED:
            # Kafka's clients treat this as fatal: no node will say otherwise.
            raise AuthorizationFailed(
                f"GROUP_AUTHORIZATION_FAILED: {host}:{port} refused FindCoordinator for "
                f"group {self.group_id}: {c.error_message or 'no message'} (the principal "
                "needs DESCRIBE, and to join READ, on the group)", int(c.error_code))
        if int(c.error_code) != 0:
            raise ProtocolError(int(c.error_code), c.error_message)
        self.node_ids[(c.host, int(c.port))] = int(c.node_id)
        return c.host, int(c.port)

    def _new_connection(self, host: str, port: int) -> KrpcConnection:
        return KrpcConnection(host, port, self.client_id, self.security, self.ssl_context)

    async def _connection(self, which: str) -> KrpcConnection:
        async with self._lock:
            conn = self._heartbeat if which == "heartbeat" else self._control
            if conn is not None and not conn.closed:
                return conn
            if self.coordinator is None:
                self.coordinator = await self._find_coordinator()
            conn = self._new_connection(*self.coordinator)
            await conn.open(self.connect_timeout_s, self.request_timeout_s)
            if which == "heartbeat":
                self._heartbeat = conn
            else:
                self._control = conn
            return conn

    async def send(self, request: Any, which: str = "control", extra_timeout_s: float = 0.0,
                   timeout_s: float | None = None) -> Any:
        """Send on the heartbeat or control connection. Raises ConnectionFailed (the caller
        retries after :meth:`backoff_s`) or :class:`SecurityError` (a refusal: do not retry);
        an error code in the response is the caller's.
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
