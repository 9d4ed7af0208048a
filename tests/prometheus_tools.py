"""Debian's Prometheus for the tests: ``promtool check metrics`` on an exposition, and a
real ``prometheus`` server scraping a daemon.

Both binaries come with Debian's ``prometheus`` package. When they are missing and this is root
(CI's container), the package is installed with apt-get, as ``bench peers`` installs redis-server
(bench/peers.py); otherwise the test fails and says what to install — never skipped, so a
machine without them cannot pass the suite silently.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests import apt_tools

PACKAGE = "prometheus"


def binary(name: str) -> str:
    """``promtool`` or ``prometheus``: found, or installed (apt-get, as root), or the test fails."""
    return apt_tools.binary(name, PACKAGE)


def promtool_check(exposition: bytes | str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` reading the exposition on stdin (exit 0: no problem)."""
    text = exposition.decode() if isinstance(exposition, bytes) else exposition
    return subprocess.run([binary("promtool"), "check", "metrics"], input=text,
                          capture_output=True, text=True, timeout=60, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=promql)["result"])

    def wait_for(self, promql: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll the query until it returns a series (the first scrapes take a moment)."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            try:
                result = self.query(promql)
            except OSError:
                result = []
            if result:
                return result
            if time.monotonic() > deadline:
                targets = self.api("targets")
                raise AssertionError(f"no series for {promql} within {timeout_s}s; targets: "
                                     f"{json.dumps(targets)[:2000]}\n"
                                     f"{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.25)


@contextmanager
def prometheus(workdir: Path, target: str, interval: str = "1s") -> Iterator[Prometheus]:
    """A real Prometheus on 127.0.0.1 (a free port), scraping ``target`` (HOST:PORT, /metrics)
    every ``interval``, with its storage in ``workdir``; stopped (SIGTERM) at exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        "  - job_name: connect-coordinator\n"
        f"    scrape_interval: {interval}\n"
        "    static_configs:\n"
        f"      - targets: ['{target}']\n", encoding="utf-8")
    port = _free_port()
    log = workdir / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=workdir)
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:  # ready once its HTTP API answers
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
