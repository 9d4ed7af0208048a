"""A client whose security protocol is not its listener's, against a real daemon with a
PLAINTEXT and an SSL listener (the test CA): a plaintext client at the TLS listener (the server
closes the connection before answering anything) and a TLS client at the plaintext one (the
server reads the ClientHello as a frame it cannot take and closes the connection mid-handshake).
Every client said only "closed the connection", "TLS handshake failed: UNEXPECTED_EOF" or
"ConnectionResetError()" and retried forever; each now names the listener and says that the
security protocol probably does not match, in both directions: the admin CLI, the worker's
async client, and the ``connect-worker run`` process (which keeps retrying)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from connect_wire.client_security import ClientSecurity
from connect_wire.messages import ConnectGroupDescribeRequest
from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env, run_cli
from tests.tls_fixture import TlsFiles, tls_ca  # noqa: F401 - the fixture
from worker_client.client import ConnectionFailed, CoordinatorClient

HINT = "the listener's security protocol probably does not match this client's ({mine}; set {how})"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tls_ca: TlsFiles) -> Iterator[Daemon]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("mismatch")
    conf = tmp / "coordinator.toml"
    conf.write_text(f'ssl.certfile = "{tls_ca.server.cert}"\nssl.keyfile = "{tls_ca.server.key}"\n')
    with DaemonPool(tmp) as pool:
        yield pool.start(tmp / "data", extra_args=[
            "--config", str(conf), "--listen", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0"])


# (client protocol, listener): the two ways round
DIRECTIONS = [("PLAINTEXT", "SSL"), ("SSL", "PLAINTEXT")]
IDS = ["plaintext-client-at-tls-listener", "tls-client-at-plaintext-listener"]


def _flags(mine: str, tls_ca: TlsFiles) -> list[str]:  # noqa: F811
    return [] if mine == "PLAINTEXT" else ["--security-protocol", "SSL",
                                           "--ssl-cafile", str(tls_ca.ca.cert)]


@pytest.mark.parametrize(("mine", "listener"), DIRECTIONS, ids=IDS)
@pytest.mark.parametrize("command", [
    ("groups", "describe", "g"),
    ("connectors", "create", "--group", "g", "c", "--tasks", "1", "--config", "connector.class=a:B")])
def test_the_cli_says_the_protocol_probably_does_not_match(
        daemon: Daemon, tls_ca: TlsFiles, mine: str, listener: str,  # noqa: F811
        command: tuple[str, ...]) -> None:
    address = daemon.address(listener)
    r = run_cli(*command, "--bootstrap", address, "--timeout", "5", *_flags(mine, tls_ca))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r
    assert HINT.format(mine=mine, how="--security-protocol or --command-config") in r.stderr, r.stderr
    assert address in r.stderr
    if mine == "SSL":
        assert "it does not seem to speak TLS" in r.stderr, r.stderr


@pytest.mark.parametrize(("mine", "listener"), DIRECTIONS, ids=IDS)
def test_the_workers_async_client_says_the_protocol_probably_does_not_match(
        daemon: Daemon, tls_ca: TlsFiles, mine: str, listener: str) -> None:  # noqa: F811
    host, port = daemon.listeners[listener]
    security = ClientSecurity(protocol=mine, cafile=str(tls_ca.ca.cert) if mine == "SSL" else None)

    async def attempt() -> list[str]:
        client = CoordinatorClient([(host, port)], "g", security=security)
        seen = []
        try:
            for _ in range(2):  # (a ConnectionFailed: retried, not a refusal)
                with pytest.raises(ConnectionFailed) as failed:
                    await client.send(ConnectGroupDescribeRequest(group_ids=("g",)))
                seen.append(str(failed.value))
        finally:
            await client.close()
        return seen

    for message in asyncio.run(attempt()):
        assert HINT.format(mine=mine, how="--security-protocol or --client-config") in message
        assert f"{host}:{port}" in message


@pytest.mark.parametrize(("mine", "listener"), DIRECTIONS, ids=IDS)
def test_a_worker_keeps_retrying_and_its_log_names_the_listener_and_the_likely_mismatch(
        daemon: Daemon, tls_ca: TlsFiles, mine: str, listener: str, tmp_path: Path) -> None:  # noqa: F811
    address = daemon.address(listener)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", address, "--group", "g",
             "--log-level", "debug", *_flags(mine, tls_ca)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=daemon_env(), cwd=ROOT)
    hint = HINT.format(mine=mine, how="--security-protocol or --client-config")
    try:
        deadline = time.monotonic() + 30
        while True:
            events = [json.loads(line) for line in log.read_text().splitlines()
                      if line.startswith("{")]
            attempts = [e for e in events if "retrying" in e["event"]]
            if len(attempts) >= 2:
                break
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()  # (still retrying)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text()
    for e in attempts:
        assert hint in e["error"] and address in e["error"], e
