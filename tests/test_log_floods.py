"""Lines a client can cause at will are bounded (coordinator.logs.LogLimiter): a flood of
garbage connections, or of requests naming random groups it may not describe, wrote a line
each (2,500 "bad frame" lines; 15 MB of denials in 1.3 s). Real daemons over real TCP; the
limiter's own rules with a clock passed in. No assertion on wall-clock time: counts of lines
against the bound, which the test's own duration can only raise (one window per 10 s)."""

from __future__ import annotations

import json
import math
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from connect_wire.apis import APIS, ApiKey
from coordinator.admin import AdminClient
from coordinator.logs import LogLimiter
from coordinator.server.app import DENIAL_LOG_INTERVAL_S, LOG_LINES_PER_INTERVAL
from tests.daemon_fixture import Daemon, DaemonPool


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def lines(d: Daemon, event: str) -> list[dict[str, object]]:
    parsed = [json.loads(line) for line in d.stderr().splitlines() if line.startswith("{")]
    return [p for p in parsed if p["event"] == event]


def windows(started: float) -> int:
    """The limiter windows the test may have spanned."""
    return 1 + math.ceil((time.monotonic() - started) / DENIAL_LOG_INTERVAL_S)


def test_limiter_one_line_per_key_per_interval_and_a_bound_over_all_keys() -> None:
    now = [0.0]
    limiter = LogLimiter(10.0, max_lines=3, max_keys=100, clock=lambda: now[0])
    assert limiter.admit("a") == {"suppressed": 0}
    assert limiter.admit("a") is None  # same key within the interval
    assert limiter.admit("b") == {"suppressed": 0}
    assert limiter.admit("c") == {"suppressed": 0}
    assert [limiter.admit(k) for k in "defg"] == [None] * 4  # over all keys: 3 lines
    now[0] = 10.0
    assert limiter.admit("a") == {"suppressed": 1, "suppressed_overall": 4}
    assert limiter.admit("h") == {"suppressed": 0}
    many = LogLimiter(10.0, max_lines=10_000, max_keys=5, clock=lambda: now[0])
    for k in range(12):
        assert many.admit(k) == {"suppressed": 0}
    assert len(many._keys) <= 5  # bounded: forgotten all at once past max_keys


def test_garbage_connections_log_one_bad_frame_line_per_peer(pool: DaemonPool) -> None:
    d = pool.start()
    started = time.monotonic()
    for _ in range(60):
        with socket.create_connection((d.host, d.port), timeout=5) as s:
            s.sendall(b"\x7f\xff\xff\xff garbage")  # a frame size past socket.max.frame.bytes
            assert s.recv(1) == b""  # closed by the daemon
    with AdminClient(d.host, d.port, timeout_s=5) as c:  # still serving
        assert c.call(APIS[ApiKey.API_VERSIONS].request_class(3)(
            client_software_name="t", client_software_version="1")).error_code == 0
    bad = lines(d, "closing connection: bad frame")
    assert 1 <= len(bad) <= windows(started), len(bad)
    assert bad[0]["peer"] == "127.0.0.1"


def test_denials_of_random_group_names_are_bounded_over_all_names(pool: DaemonPool,
                                                                   tmp_path: Path) -> None:
    d = pool.start(tmp_path / "d", extra_env={"CONNECT_COORDINATOR_AUTHORIZER": "acl"})
    names = tuple(f"random-{uuid.uuid4().hex}" for _ in range(300))
    started = time.monotonic()
    with AdminClient(d.host, d.port, timeout_s=10) as c:
        resp = c.call(APIS[ApiKey.DESCRIBE_GROUPS].request_class(5)(
            groups=names, include_authorized_operations=False))
    assert {g.error_code for g in resp.groups} == {30}  # GROUP_AUTHORIZATION_FAILED, each
    denied = lines(d, "authorization failed")
    assert 1 <= len(denied) <= LOG_LINES_PER_INTERVAL * windows(started), len(denied)
