"""Under ``--log-format json`` every stderr line of a real worker is one JSON object, also the
lines a plugin causes that the worker does not write itself: the plugin's own ``logging``, a
Python warning (``warnings.warn``) and an exception that ends a thread the plugin started.
Those were written by Python as plain text (``path:line: UserWarning: ...`` and multi-line
``Exception in thread ...`` tracebacks), which a JSON log pipeline cannot parse."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.daemon_fixture import ROOT, DaemonPool, daemon_env, run_cli

PLUGIN = textwrap.dedent('''
    import asyncio, logging, threading, warnings

    class NoisyTask:
        async def start(self, config):
            logging.getLogger("noisy").warning("plugin stdlib line")
            warnings.warn("plugin user warning")
            threading.Thread(target=self.boom, name="plugin-thread").start()
            try:
                1 / 0
            except ZeroDivisionError:
                logging.getLogger("noisy").exception("plugin exception")

        def boom(self):
            raise RuntimeError("plugin thread died")

        async def run(self):
            await asyncio.sleep(3600)

        async def stop(self):
            pass

    class NoisyConnector(NoisyTask):
        task_class = NoisyTask
''')


def test_every_worker_stderr_line_is_json_including_a_plugins_warnings_and_thread_errors(
        tmp_path: Path) -> None:
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "noisy_plugin.py").write_text(PLUGIN)
    with DaemonPool(tmp_path) as pool:
        d = pool.start(tmp_path / "data")
        r = run_cli("connectors", "create", "--group", "g", "n", "--tasks", "1", "--config",
                    "connector.class=noisy_plugin:NoisyConnector", "--bootstrap", d.bootstrap)
        assert r.returncode == 0, r.stderr
        env = daemon_env()
        env["PYTHONPATH"] += f":{tmp_path / 'plug'}"
        err_path = tmp_path / "worker.err"
        with open(err_path, "wb") as err:
            w = subprocess.Popen(
                [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", d.bootstrap,
                 "--group", "g", "--instance-id", "w1", "--log-format", "json"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            # the connector and its task each: a warning line, a thread's error
            while err_path.read_text().count("plugin thread died") < 2:
                assert w.poll() is None, err_path.read_text()[-3000:]
                assert time.monotonic() < deadline, err_path.read_text()[-3000:]
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            w.send_signal(signal.SIGTERM)
            code = w.wait(30)
    text = err_path.read_text()
    assert code == 0, text[-3000:]
    lines = text.splitlines()
    not_json = []
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            not_json.append(line)
    assert not_json == [], "\n".join(not_json[:20])
    events = " ".join(json.dumps(p) for p in parsed)
    # Nothing was lost on the way: each is there, with its details.
    for said in ("plugin stdlib line", "plugin user warning", "plugin thread died",
                 "plugin-thread", "ZeroDivisionError"):
        assert said in events, (said, text[-3000:])


def _exit_lines(stderr: str) -> list[str]:
    """Every line of ``stderr`` parsed as JSON (one that is not fails the test): their events."""
    return [json.loads(line)["event"] for line in stderr.splitlines()]


# The last line of a worker or a daemon that ends (a refused setting or credentials, a port in
# use) was plain text ("connect-worker: ...") after the JSON lines, under the JSON format too.
def test_the_line_saying_why_a_worker_or_a_daemon_ends_is_json_too(tmp_path: Path) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", "127.0.0.1:9",
         "--group", "g", "--config-providers", "vault"],
        capture_output=True, text=True, env=daemon_env(), cwd=ROOT, timeout=60)
    assert bad.returncode == 2
    assert _exit_lines(bad.stderr) == [
        "connect-worker: --config-providers: unknown config provider vault (one of file, "
        "directory, env)"], bad.stderr
    console = subprocess.run(
        [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", "127.0.0.1:9",
         "--group", "g", "--config-providers", "vault", "--log-format", "console"],
        capture_output=True, text=True, env=daemon_env(), cwd=ROOT, timeout=60)
    assert console.stderr.startswith("connect-worker: --config-providers: unknown"), console.stderr
    with DaemonPool(tmp_path) as pool:
        d = pool.start(tmp_path / "data")
        taken = subprocess.run(
            [sys.executable, "-m", "coordinator.cli", "serve", "--listen", d.bootstrap,
             "--metrics-listen", "off", "--data-dir", str(tmp_path / "other")],
            capture_output=True, text=True, env=daemon_env(), cwd=ROOT, timeout=60)
    assert taken.returncode == 1, taken.stderr
    events = _exit_lines(taken.stderr)
    assert events[-1].startswith(f"connect-coordinator: cannot start: cannot listen on "
                                 f"{d.bootstrap}"), taken.stderr
