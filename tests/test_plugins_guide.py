"""docs/plugins.md, as written there, with real processes: its plugin becomes ``greeter.py``, its
pytest example runs (pytest in a subprocess), its pyproject.toml's entry point is installed as
a distribution's metadata on the path (what ``pip install`` leaves: a ``.dist-info`` with
``entry_points.txt``), and its shell lines run against a test daemon: the CLI finds the plugin
by the entry point's name and refuses a config its ``validate`` finds invalid, the worker runs
the connector and its tasks, which greet."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tests.daemon_fixture import ROOT, DaemonPool, daemon_env

GUIDE = ROOT / "docs" / "plugins.md"
WAIT_S = 60.0  # a deadline for waiting on a loaded machine, not a measurement


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)


def install(tmp_path: Path) -> dict[str, str]:
    """greeter.py, its test and its distribution's entry points, on PYTHONPATH."""
    plugin, test = blocks("python")
    (tmp_path / "greeter.py").write_text(plugin, encoding="utf-8")
    (tmp_path / "test_greeter.py").write_text(test, encoding="utf-8")
    (project,) = blocks("toml")
    meta = tomllib.loads(project)["project"]
    dist = tmp_path / f"{meta['name']}-{meta['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\n"
                                   f"Version: {meta['version']}\n")
    lines = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
             for group, eps in meta["entry-points"].items()]
    (dist / "entry_points.txt").write_text("\n".join(lines))
    env = daemon_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    return env


def test_the_guides_pytest_example_passes(tmp_path: Path) -> None:
    env = install(tmp_path)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "test_greeter.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr


def test_the_guides_plugin_runs_by_its_entry_point_name(tmp_path: Path) -> None:
    env = install(tmp_path)
    (shell,) = blocks("sh")
    lines = [line.strip() for line in shell.replace("\\\n", " ").splitlines() if line.strip()]
    with DaemonPool(tmp_path) as pool:
        daemon = pool.start(tmp_path / "data")

        def cmd(line: str) -> list[str]:
            words = [w for w in shlex.split(line.replace("127.0.0.1:9092", daemon.bootstrap))
                     if w != "&"]
            program = {"connect-coordinator": "coordinator.cli", "connect-worker": "worker_client.cli"}
            extra = ["--bootstrap", daemon.bootstrap] if words[0] == "connect-coordinator" else []
            return [sys.executable, "-m", program[words[0]], *words[1:], *extra]

        def run(line: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(cmd(line), cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=30, check=False)

        assert lines[0].startswith("connect-coordinator serve")  # (the pool's daemon instead)
        create, start_worker, status = lines[1:]
        # The entry point's name is found, and validate refuses what it finds wrong.
        bad = run(create.replace("greeting=hi", "interval.s=0"))
        assert bad.returncode == 1, bad
        assert bad.stderr.splitlines()[1:] == ["greeting: is required",
                                               "interval.s: must be more than 0"], bad.stderr
        ok = run(create)
        assert ok.returncode == 0 and ok.stderr == "", ok
        with open(tmp_path / "w1.out", "wb") as out:
            worker = subprocess.Popen(cmd(start_worker), cwd=tmp_path, env=env, stdout=out,
                                      stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + WAIT_S
            while True:
                r = run(status + " --json")
                st = json.loads(r.stdout) if r.returncode == 0 else None
                greeted = (tmp_path / "w1.out").read_text()
                if st and {t["state"] for t in (st, *st["tasks"])} == {"RUNNING"} and \
                        len(st["tasks"]) == 2 and all(f"hi from greeter/{i}" in greeted for i in (0, 1)):
                    break
                assert time.monotonic() < deadline, (r, greeted)
                time.sleep(0.2)
        finally:
            worker.terminate()
            assert worker.wait(15) == 0
        assert "greeter/0 stopped after" in (tmp_path / "w1.out").read_text()
