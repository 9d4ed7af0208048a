"""Start the coordinator daemon as a real subprocess for end-to-end tests.

    daemon = start(tmp_path / "data")            # waits for the banner line
    with AdminClient(daemon.host, daemon.port) as c: ...
    daemon.stop()                                  # SIGTERM; asserts exit code 0

``start`` runs ``sys.executable -m coordinator.cli serve`` on 127.0.0.1 with port 0 (and a
metrics port 0), a short session timeout and heartbeat interval (``SHORT_TIMEOUTS``), any
``CONNECT_COORDINATOR_*`` variables of the calling environment removed (an unknown one would be
refused by the daemon). It waits for the one banner line on stdout (stdout and stderr go to
files next to the data dir, so the daemon can never block on a full pipe) and parses the
addresses from it. ``DaemonPool`` (a context manager; ``daemon_pool`` is a pytest fixture built
on it) stops whatever is still running at teardown and asserts each exit code was 0.

To use the fixture without ruff's F811 (a parameter redefining an imported name), wrap the
pool in a local fixture::

    @pytest.fixture
    def pool(tmp_path):
        with DaemonPool(tmp_path) as p:
            yield p

    def test_something(pool):
        d = pool.start(extra_env={...}, extra_args=["--partitions", "2"])

``run_serve`` runs ``serve`` expecting it to exit (bad settings); ``run_cli`` runs an admin
command. Each daemon's stdout/stderr are in ``<data dir>-logs/`` (``Daemon.stderr()``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "CONNECT_COORDINATOR_"
BANNER = re.compile(
    r"connect-coordinator listening on (?P<listeners>(?:[A-Za-z0-9_]+://)?(?P<host>[^\s:,]+)"
    r":(?P<port>\d+)(?:, [^(]+?)?) "
    r"\(metrics (?P<metrics>\S+), data (?P<data>.+), (?P<partitions>\d+) partitions\)"
)
LISTENER = re.compile(r"(?:(?P<name>[A-Za-z0-9_]+)://)?(?P<host>[^\s:]+):(?P<port>\d+)")


def parse_listeners(text: str) -> dict[str, tuple[str, int]]:
    """The banner's listeners: ``HOST:PORT`` (PLAINTEXT) or ``NAME://HOST:PORT``, comma-separated
   , in order."""
    out: dict[str, tuple[str, int]] = {}
    for part in text.split(", "):
        m = LISTENER.fullmatch(part.strip())
        if m is None:
            raise DaemonFailed(f"unexpected listener {part!r} in the banner")
        out[m["name"] or "PLAINTEXT"] = (m["host"], int(m["port"]))
    return out
# Short enough that session expiry is seen in a test; the heartbeat interval must stay below
# the session timeout (the daemon checks).
SHORT_TIMEOUTS = {
    "CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "2000",
    "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "200",
}
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0


class DaemonFailed(AssertionError):
    pass


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    metrics_url: str | None
    partitions: int
    data_dir: Path
    stdout_path: Path
    stderr_path: Path
    banner: str
    exit_code: int | None = field(default=None)
    listeners: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Every listener of the banner by name (``host``/``port``: the first one)."""

    def address(self, listener: str) -> str:
        host, port = self.listeners[listener]
        return f"{host}:{port}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, expect: int | None = 0) -> int:
        """SIGTERM, wait; asserts the exit code is ``expect`` (None: no check)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise DaemonFailed(f"daemon did not stop within {timeout_s}s of SIGTERM:\n"
                                   + self.stderr()[-4000:]) from None
        code = self.proc.returncode
        self.exit_code = code
        if expect is not None and code != expect:
            raise DaemonFailed(f"daemon exited with {code}, expected {expect}:\n" + self.stderr()[-4000:])
        return code

    def kill(self) -> int:
        """SIGKILL (a crash: nothing is flushed beyond what was fsynced)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.exit_code = self.proc.wait()
        return self.exit_code


def daemon_env(extra_env: Mapping[str, str] | None = None, short_timeouts: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    if short_timeouts:
        env.update(SHORT_TIMEOUTS)
    env.update(extra_env or {})
    return env


def serve_command(data_dir: Path, extra_args: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "coordinator.cli", "serve", "--listen", "127.0.0.1:0",
            "--metrics-listen", "127.0.0.1:0", "--data-dir", str(data_dir), *extra_args]


def start(
    data_dir: Path | str,
    extra_env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = START_TIMEOUT_S,
    short_timeouts: bool = True,
) -> Daemon:
    """Start the daemon and wait (at most ``timeout_s``) for its banner line."""
    data_dir = Path(data_dir)
    logs = data_dir.parent / f"{data_dir.name}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    n = len(list(logs.glob("stdout-*.txt")))
    stdout_path, stderr_path = logs / f"stdout-{n}.txt", logs / f"stderr-{n}.txt"
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            serve_command(data_dir, extra_args), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            env=daemon_env(extra_env, short_timeouts), cwd=ROOT,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        text = stdout_path.read_text(errors="replace")
        if "\n" in text:
            line = text.split("\n", 1)[0]
            m = BANNER.fullmatch(line.strip())
            if m is None:
                proc.kill()
                proc.wait()
                raise DaemonFailed(f"unexpected first stdout line: {line!r}")
            metrics = m["metrics"]
            listeners = parse_listeners(m["listeners"])
            host, port = next(iter(listeners.values()))
            return Daemon(proc=proc, host=host, port=port,
                          metrics_url=None if metrics == "off" else metrics,
                          partitions=int(m["partitions"]), data_dir=data_dir,
                          stdout_path=stdout_path, stderr_path=stderr_path, banner=line.strip(),
                          listeners=listeners)
        if proc.poll() is not None:
            raise DaemonFailed(f"daemon exited with {proc.returncode} before its banner:\n"
                               + stderr_path.read_text(errors="replace")[-4000:])
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise DaemonFailed(f"no banner within {timeout_s}s:\n"
                               + stderr_path.read_text(errors="replace")[-4000:])
        time.sleep(0.02)


def run_serve(data_dir: Path | str, extra_args: Sequence[str] = (),
              extra_env: Mapping[str, str] | None = None, timeout_s: float = 30.0
              ) -> subprocess.CompletedProcess[str]:
    """Run ``serve`` expecting it to exit by itself (bad settings): its exit code and output."""
    return subprocess.run(serve_command(Path(data_dir), extra_args), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=daemon_env(extra_env), cwd=ROOT,
                          timeout=timeout_s, check=False)


def stderr_events(text: str) -> list[str]:
    """The ``event`` of each stderr line of a process logging JSON (each line must parse: a
    worker's or daemon's last line, why it ends, is JSON too)."""
    import json
    return [json.loads(line)["event"] for line in text.strip().splitlines()]


def run_cli(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``connect-coordinator ARGS`` as a subprocess (admin commands)."""
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=daemon_env(), cwd=ROOT,
                          timeout=timeout_s, check=False)


class DaemonPool:
    """Daemons started through it are stopped at exit (SIGTERM), each asserted to exit 0."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.daemons: list[Daemon] = []

    def start(self, data_dir: Path | str | None = None, **kw: Any) -> Daemon:
        d = start(data_dir if data_dir is not None else self.base / "data", **kw)
        self.daemons.append(d)
        return d

    def __enter__(self) -> DaemonPool:
        return self

    def __exit__(self, *exc: object) -> None:
        problems = []
        for d in self.daemons:
            if d.exit_code is not None:  # stopped or killed by the test itself
                continue
            try:
                d.stop()
            except DaemonFailed as e:
                problems.append(str(e))
        if problems and exc[0] is None:
            raise DaemonFailed("\n".join(problems))


def start_with_acls(pool: DaemonPool, tmp_path: Path) -> Daemon:
    """A daemon with ``authorizer = "acl"``, a PLAINTEXT listener for ANONYMOUS (a super user,
    to grant ACLs) and a SASL_PLAINTEXT one where user ``ops`` (SCRAM-SHA-256, password
    ``ops-secret``) has only what the test grants it. Its data in ``tmp_path/data``."""
    data = tmp_path / "data"
    (tmp_path / "ops.pw").write_text("ops-secret\n")
    assert run_cli("users", "add", "--data-dir", str(data), "ops", "--mechanism", "SCRAM-SHA-256",
                   "--password-file", str(tmp_path / "ops.pw")).returncode == 0
    conf = tmp_path / "coordinator.toml"
    conf.write_text('authorizer = "acl"\nsuper.users = "User:ANONYMOUS"\n'
                    'sasl.enabled.mechanisms = "SCRAM-SHA-256"\n')
    return pool.start(data, extra_args=[
        "--config", str(conf),
        "--listen", "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"])


@pytest.fixture
def daemon_pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as pool:
        yield pool
