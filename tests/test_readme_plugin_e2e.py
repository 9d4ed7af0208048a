"""The README's "A first plugin", as written there, against real processes: its Python block
becomes ``hello.py``, its shell lines run (``connect-coordinator`` and ``connect-worker`` as
this interpreter's modules, the README's address replaced by a test daemon's), and what the
README promises is checked: the connector and its four tasks run on the two workers, each task
prints its greeting, an update of the config restarts them with the new greeting, and SIGTERM
stops every task.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.daemon_fixture import ROOT, DaemonPool, daemon_env

README = ROOT / "README.md"
WAIT_S = 60.0  # a deadline for waiting on a loaded machine, not a measurement


def section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## A first plugin")
    return text[start:text.index("\n## ", start + 1)]


def command(line: str, bootstrap: str) -> list[str]:
    words = shlex.split(line.replace("127.0.0.1:9092", bootstrap))
    words = [w for w in words if w not in ("&",) and not w.startswith("PYTHONPATH=")]
    program = {"connect-coordinator": "coordinator.cli", "connect-worker": "worker_client.cli"}
    cmd = [sys.executable, "-m", program[words[0]], *words[1:]]
    if words[0] == "connect-coordinator":
        cmd += ["--bootstrap", bootstrap]
    return cmd


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.2)


def test_first_plugin_runs_as_the_readme_says(tmp_path: Path) -> None:
    text = section()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    shell = re.search(r"```sh\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    lines = [line.strip() for line in shell.splitlines() if line.strip()]
    update = re.search(r"`(connectors update [^`]*)`", text).group(1)
    (tmp_path / "hello.py").write_text(code, encoding="utf-8")
    env = daemon_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"  # the README's PYTHONPATH=.
    workers: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    with DaemonPool(tmp_path) as pool:
        daemon = pool.start()
        try:
            for line in lines:
                cmd = command(line, daemon.bootstrap)
                if "connect-worker" in line:
                    name = cmd[cmd.index("--instance-id") + 1]
                    out = tmp_path / f"{name}.out"
                    with open(out, "wb") as stdout, open(tmp_path / f"{name}.err", "wb") as err:
                        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=stdout,
                                                stderr=err, stdin=subprocess.DEVNULL)
                    workers[name] = (proc, out)
                    continue
                if "connectors status" in line:
                    def all_running(cmd: list[str] = cmd) -> bool:
                        status = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True,
                                                text=True)
                        rows = [r.split() for r in status.stdout.splitlines()[1:] if r.strip()]
                        return (status.returncode == 0 and len(rows) == 5
                                and all(r[1] == "RUNNING" for r in rows)
                                and {r[2] for r in rows} == set(workers))
                    wait_for(all_running, "the connector and its 4 tasks RUNNING on both workers")
                    continue
                done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
            assert set(workers) == {"a", "b"}

            def printed(pattern: str) -> set[str]:
                found = set()
                for _proc, out in workers.values():
                    found |= set(re.findall(pattern, out.read_text(errors="replace")))
                return found

            tasks = {f"greeter/{n}" for n in range(4)}
            wait_for(lambda: printed(r"bonjour from (greeter/\d)") == tasks, "every greeting")
            done = subprocess.run(command("connect-coordinator " + update, daemon.bootstrap),
                                  cwd=tmp_path, env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            wait_for(lambda: printed(r"hej from (greeter/\d)") == tasks, "the updated greeting")
        finally:
            for proc, _out in workers.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc, _out in workers.values():
                try:
                    proc.wait(WAIT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        assert all(proc.returncode == 0 for proc, _out in workers.values())
        assert printed(r"(greeter/\d) stopped") == tasks
