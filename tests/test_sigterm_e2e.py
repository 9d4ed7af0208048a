"""SIGTERM is quick: it took 1-3 s for a worker with nothing to stop and about 2 s
for the coordinator with workers connected.

Where the time went: the worker queued its shutdown's drain (a revocation of everything, carried
out by its main loop so that heartbeats go on meanwhile) while the loop waited for its parked
long poll, which the coordinator answers after up to the heartbeat interval (3 s): the drain
began only then. Now the loop starts it at once (``Worker._await_inflight``). The coordinator
waited for its metrics HTTP server's ``shutdown()``, which returns at the server thread's next
poll, up to 0.5 s later; it now closes the socket and lets the daemon thread go.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from coordinator import config
from coordinator.server.app import CoordinatorServer
from tests.daemon_fixture import ROOT, DaemonPool, daemon_env, run_cli

PLUGIN = "worker_client.examples.recording:RecordingConnector"


def test_workers_and_the_coordinator_stop_at_once_on_sigterm(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    with DaemonPool(tmp_path) as pool:
        d = pool.start(short_timeouts=False)  # the defaults: long polls of 3 s
        r = run_cli("connectors", "create", "--bootstrap", d.bootstrap, "--group", "g", "c",
                    "--tasks", "2", "--config", f"connector.class={PLUGIN}",
                    "--config", f"record.file={records}")
        assert r.returncode == 0, r.stderr
        procs = {}
        for name in ("w1", "w2", "w3", "w4", "w5"):  # 3 items: two workers have nothing to run
            with open(tmp_path / f"{name}.log", "wb") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", d.bootstrap,
                     "--group", "g", "--instance-id", name], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=log, env=daemon_env(), cwd=ROOT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lines = [json.loads(x) for x in records.read_text().splitlines()] if records.exists() else []
            if len({e["item"] for e in lines if e["event"] == "start"}) == 3:
                break
            time.sleep(0.1)
        time.sleep(4.0)  # every worker parked in a long poll
        took = {}
        for name, proc in procs.items():
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(15)
            took[name] = round(time.monotonic() - t0, 3)
            assert code == 0, (tmp_path / f"{name}.log").read_text()[-2000:]
            time.sleep(0.3)
        print("\nworker SIGTERM to exit (s):", json.dumps(took))
        # Was up to the heartbeat interval (3 s): what was left of the parked long poll.
        assert max(took.values()) < 1.0, took
        events = [json.loads(x) for x in records.read_text().splitlines()]
        assert sum(e["event"] == "stop" for e in events) == sum(e["event"] == "start" for e in events)

        # The coordinator, with workers connected and parked.
        for name in ("w1", "w2"):
            with open(tmp_path / f"{name}.log", "ab") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", d.bootstrap,
                     "--group", "g", "--instance-id", name], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=log, env=daemon_env(), cwd=ROOT)
        time.sleep(5.0)
        t0 = time.monotonic()
        d.stop()
        took_daemon = round(time.monotonic() - t0, 3)
        print("coordinator SIGTERM to exit (s):", took_daemon)
        assert took_daemon < 1.5, took_daemon
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(15)


def test_the_coordinator_does_not_wait_for_its_metrics_thread(tmp_path: Path) -> None:
    async def once(n: int) -> float:
        cfg = config.load(None, {"data.dir": str(tmp_path / f"data{n}"), "partitions": 1,
                                 "listeners": "127.0.0.1:0", "metrics.listener": "127.0.0.1:0"},
                          environ={})
        server = CoordinatorServer(cfg)
        await server.start()
        await asyncio.sleep(0.1)  # (the metrics thread's serve_forever polls every 0.5 s)
        t0 = time.monotonic()
        await server.stop()
        return time.monotonic() - t0

    took = [asyncio.run(once(n)) for n in range(2)]
    assert max(took) < 0.1, took  # was up to 0.5 s (0.4 s here) waiting for the next poll
