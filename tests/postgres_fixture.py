"""A real PostgreSQL for tests on 127.0.0.1: a private cluster in a temporary directory.

    server = start_postgres()                    # initdb + postgres; waits until it accepts
    server.dsn()                                 # "postgresql://postgres@127.0.0.1:<port>/postgres"
    dsn = server.create_database()               # a fresh, empty database: its DSN
    server.stop()                                # fast shutdown, then the directory is removed

The server is Debian's ``postgresql`` package (PostgreSQL 15 on bookworm): its binaries live in
``/usr/lib/postgresql/<version>/bin`` (the highest version found is used); when missing and this
is root (CI's container) the package is installed with apt-get, as the Prometheus and etcd-server
tests do (tests/apt_tools.py); ``CONNECT_COORDINATOR_TEST_PG_BIN`` names another bin directory.

initdb refuses to run as root: as root, the cluster belongs to the package's ``postgres`` user
(initdb and the server run as it; the temporary directory is made its own), else to the
current user. The server listens on 127.0.0.1 at a free port (its unix socket in the temporary
directory, never /var/run), trusts local connections as the superuser ``postgres``, and runs
with ``fsync=off`` (a test database need not survive a power cut). Its log is
``<directory>/postgres.log``. Starting it takes about 1.1 s on an idle machine (initdb most of
it; 2-3 s with the suite's load), a fresh database about 0.04 s, dropping it 0.02 s, the
shutdown 0.04 s.

Pytest fixtures (import them into the test module)::

    from tests.postgres_fixture import postgres_dsn, postgres_server  # noqa: F401 (fixtures)

``postgres_server`` is one server per test session (started on first use, stopped at the end);
``postgres_dsn`` is a fresh database per test on it (dropped after, its connections ended).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import apt_tools
from tests.etcd_fixture import free_port

BIN_ENV = "CONNECT_COORDINATOR_TEST_PG_BIN"
PACKAGE = "postgresql"
SUPERUSER = "postgres"


def _installed_bin_dir() -> str | None:
    found = [d for d in glob.glob("/usr/lib/postgresql/*/bin") if os.access(f"{d}/initdb", os.X_OK)]
    return max(found, key=lambda d: int(d.split("/")[-2]), default=None) if found else None


def bin_dir() -> str:
    """The directory of ``initdb`` and ``postgres`` (installed with apt-get if missing, as root)."""
    override = os.environ.get(BIN_ENV)
    if override:
        return override
    return apt_tools.ensure(PACKAGE, _installed_bin_dir, what="PostgreSQL (initdb)")


def _run_as() -> dict[str, str]:
    """subprocess arguments running a command as the cluster's owner (``postgres`` when root)."""
    return {"user": SUPERUSER, "group": SUPERUSER} if os.geteuid() == 0 else {}


@dataclass
class PostgresServer:
    base_dir: Path
    port: int
    process: subprocess.Popen[bytes]
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def log_path(self) -> Path:
        return self.base_dir / "postgres.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def admin(self, statement: str) -> None:
        """Run one statement as the superuser, outside a transaction (CREATE/DROP DATABASE)."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]  # a test's own literal SQL

    def create_database(self, name: str | None = None) -> str:
        """A new empty database (``name`` or the next ``test_<n>``): its DSN."""
        name = name or f"test_{next(self._names)}"
        self.admin(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Fast shutdown (SIGINT: sessions ended, transactions rolled back), SIGKILL after
        ``grace_s``; the directory is removed."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
                try:
                    self.process.wait(grace_s)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            return self.process.returncode
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def start_postgres(*, ready_timeout_s: float = 60.0) -> PostgresServer:
    """initdb a cluster in a new temporary directory and start its server (module doc)."""
    import psycopg

    bindir = bin_dir()
    base = Path(tempfile.mkdtemp(prefix="connect-pg-"))
    as_owner = _run_as()
    if as_owner:
        shutil.chown(base, SUPERUSER, SUPERUSER)
    data, sockets = base / "data", base / "sockets"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    try:
        done = subprocess.run(
            [f"{bindir}/initdb", "-D", str(data), "-U", SUPERUSER, "--auth=trust",
             "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
            capture_output=True, text=True, env=env, cwd=base, check=False, **as_owner)  # type: ignore[call-overload]
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        subprocess.run(["mkdir", str(sockets)], check=True, cwd=base, **as_owner)  # type: ignore[call-overload]
        port = free_port()
        with open(base / "postgres.log", "ab") as log:
            process = subprocess.Popen(
                [f"{bindir}/postgres", "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
                 "-k", str(sockets), "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=200"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=base,
                start_new_session=True, **as_owner)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    server = PostgresServer(base, port, process)
    deadline = time.monotonic() + ready_timeout_s
    while True:
        if process.poll() is not None:
            tail = server.log_tail()
            server.stop()
            raise RuntimeError(f"postgres exited ({process.returncode}) before accepting:\n{tail}")
        try:
            with psycopg.connect(server.dsn(), connect_timeout=2):
                return server
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                tail = server.log_tail()
                server.stop()
                raise RuntimeError(f"postgres did not accept within {ready_timeout_s} s:\n{tail}") from None
            time.sleep(0.05)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database on the session's server, dropped after the test."""
    name = f"test_{next(postgres_server._names)}"
    dsn = postgres_server.create_database(name)
    try:
        yield dsn
    finally:
        postgres_server.drop_database(name)
