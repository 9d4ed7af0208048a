"""Helpers shared by the wire benchmarks: the daemon as a subprocess, the echo ceiling server,
percentiles, the machine description. Private (``_``): not a benchmark of its own."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
ENV_PREFIX = "CONNECT_COORDINATOR_"
BANNER = re.compile(
    r"connect-coordinator listening on (?P<listeners>(?:[A-Za-z0-9_]+://)?(?P<host>[^\s:,]+)"
    r":(?P<port>\d+)(?:, [^(]+?)?) "
    r"\(metrics (?P<metrics>\S+), data (?P<data>.+), (?P<partitions>\d+) partitions\)"
)
"""The daemon's banner; ``host``/``port``: its first listener, ``listeners``: every one
(``HOST:PORT`` or ``NAME://HOST:PORT``, comma-separated; :func:`listeners`)."""


def listeners(process: Process) -> dict[str, tuple[str, int]]:
    """Every listener of a daemon's banner by name (``PLAINTEXT`` for a bare HOST:PORT)."""
    line = process.stdout_path.read_text(errors="replace").split("\n", 1)[0]
    m = BANNER.search(line)
    if m is None:
        raise BenchError(f"not a banner: {line!r}")
    out = {}
    for part in m["listeners"].split(", "):
        name, sep, where = part.rpartition("://")
        host, _, port = where.rpartition(":")
        out[name if sep else "PLAINTEXT"] = (host, int(port))
    return out
LISTENING = re.compile(r"listening on (?P<host>[^\s:]+):(?P<port>\d+)")


class BenchError(RuntimeError):
    """A benchmark could not set up or measure what it needs."""


def child_env(extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env or {})
    return env


@dataclass
class Process:
    """A server subprocess whose first stdout line gave its address."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    stdout_path: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()


def _spawn(command: Sequence[str], logs: Path, pattern: re.Pattern[str],
           env: Mapping[str, str], timeout_s: float) -> tuple[Process, float]:
    """Start ``command``; wait for a first stdout line matching ``pattern``. Returns the
    process and the seconds from spawn to that line."""
    logs.mkdir(parents=True, exist_ok=True)
    n = len(list(logs.glob("stdout-*.txt")))
    stdout_path, stderr_path = logs / f"stdout-{n}.txt", logs / f"stderr-{n}.txt"
    started = time.perf_counter()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                env=dict(env), cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    while True:
        text = stdout_path.read_text(errors="replace")
        if "\n" in text:
            line = text.split("\n", 1)[0].strip()
            m = pattern.search(line)
            if m is None:
                proc.kill()
                proc.wait()
                raise BenchError(f"unexpected first stdout line: {line!r}")
            return (Process(proc, m["host"], int(m["port"]), stdout_path, stderr_path),
                    time.perf_counter() - started)
        if proc.poll() is not None:
            raise BenchError(f"{command[2:4]} exited with {proc.returncode}:\n"
                             + stderr_path.read_text(errors="replace")[-3000:])
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise BenchError(f"no banner within {timeout_s}s:\n"
                             + stderr_path.read_text(errors="replace")[-3000:])
        time.sleep(0.005)


def start_daemon(data_dir: Path, extra_env: Mapping[str, str] | None = None,
                 extra_args: Sequence[str] = (), timeout_s: float = 600.0) -> tuple[Process, float]:
    """``connect-coordinator serve`` on 127.0.0.1:0 (metrics on another free port), logging at
    warning level. Returns the process and the seconds until its banner (it listens once its
    partitions are loaded)."""
    command = [sys.executable, "-m", "coordinator.cli", "serve", "--listen", "127.0.0.1:0",
               "--metrics-listen", "127.0.0.1:0", "--data-dir", str(data_dir),
               "--log-level", "warning", *extra_args]  # a later --log-level wins
    return _spawn(command, data_dir.parent / f"{data_dir.name}-logs", BANNER,
                  child_env(extra_env), timeout_s)


def start_echo(logs: Path) -> Process:
    """The ceiling: a bare uvloop Protocol server splitting the same size-prefixed frames with
    the same FrameDecoder and echoing each frame back, decoding nothing."""
    command = [sys.executable, "-m", "bench._echo"]
    return _spawn(command, logs, LISTENING, child_env(), 30.0)[0]


def run_loadgen_sampled(spec: Mapping[str, Any], workdir: Path,
                        sample: Callable[[], dict[str, float]]) -> dict[str, Any]:
    """``bench/_loadgen.py`` as a process of its own (``announce`` on); ``sample()`` is taken
    when it opens and when it closes its measured window: the result carries the difference
    of each sampled number (``window``)."""
    path = workdir / "loadgen-spec.json"
    path.write_text(json.dumps({**spec, "announce": True}), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "bench._loadgen", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    assert proc.stdout is not None and proc.stderr is not None
    before: dict[str, float] = {}
    window: dict[str, float] = {}
    last = ""
    for line in proc.stdout:
        line = line.strip()
        if line == "measuring":
            before = sample()
        elif line == "measured":
            after = sample()
            window = {k: after[k] - before.get(k, 0.0) for k in after}
        elif line:
            last = line
    stderr = proc.stderr.read()
    if proc.wait() != 0 or not last:
        raise BenchError(f"load generator failed:\n{stderr[-3000:]}")
    result: dict[str, Any] = json.loads(last)
    result["window"] = window
    return result


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "cpu_model": cpu}


def sizes_arg(text: str) -> list[int]:
    import argparse

    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError("expected integers >= 1")
    return sorted(set(sizes))
