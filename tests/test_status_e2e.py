"""Issue 14, Status, end to end with real processes: a coordinator daemon and two
`connect-worker` processes running the recording plugin. Connector ``bad`` is configured with
``fail.mode=start`` (every task's start() raises; its connector instance runs), ``good`` runs
normally. The workers report each instance's state on their heartbeats;
``connectors status`` shows ``bad``'s tasks FAILED with the error and its traceback, everything
else RUNNING; ``groups describe`` lists the states (no ``None``); the failing instance's log
line carries the traceback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import ROOT, DaemonPool, run_cli
from tests.test_worker_e2e import GROUP, PLUGIN, Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool.start())
        try:
            for name, tasks, extra in (("good", 2, []), ("bad", 2, ["--config", "fail.mode=start"])):
                r = run_cli("connectors", "create", "--bootstrap", c.daemon.bootstrap, "--group", GROUP,
                            name, "--tasks", str(tasks), "--config", f"connector.class={PLUGIN}",
                            "--config", f"record.file={c.records}", *extra)
                assert r.returncode == 0, r.stderr
            yield c
        finally:
            c.close()


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    r = run_cli("connectors", "status", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP,
                name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _states(st: dict[str, Any]) -> dict[str, str]:
    return {st["connector"]: st["state"],
            **{f"{st['connector']}/{t['task']}": t["state"] for t in st["tasks"]}}


def test_failing_plugin_is_reported_failed_with_its_traceback(cluster: Cluster) -> None:
    for name in ("w1", "w2"):
        cluster.spawn(name)
    deadline = time.monotonic() + 30
    while True:
        good, bad = _status(cluster, "good"), _status(cluster, "bad")
        states = {**_states(good), **_states(bad)}
        if (states == {"good": "RUNNING", "good/0": "RUNNING", "good/1": "RUNNING",
                       "bad": "RUNNING", "bad/0": "FAILED", "bad/1": "FAILED"}):
            break
        assert time.monotonic() < deadline, (states, cluster.logs(tail=2000))
        time.sleep(0.2)
    for t in bad["tasks"]:
        assert t["instance_id"] in ("w1", "w2") and t["member_id"]
        assert "start() failed on purpose (fail.mode=start)" in t["error"], t
        trace = t["trace"]
        assert trace.startswith("Traceback (most recent call last):"), trace
        assert "_fail_on_purpose" in trace and "RuntimeError" in trace, trace
        assert len(trace) <= 8192
    for st in (good, {"state": bad["state"], "error": bad["error"], "trace": bad["trace"]}):
        assert st["error"] is None and st["trace"] is None
    assert all(t["error"] is None and t["trace"] is None for t in good["tasks"])

    # Text: the table and each failed instance's trace.
    r = run_cli("connectors", "status", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP, "bad")
    assert r.returncode == 0, r.stderr
    assert "None" not in r.stdout
    assert "TRACE bad/0 (FAILED):" in r.stdout and "TRACE bad/1 (FAILED):" in r.stdout
    assert "_fail_on_purpose" in r.stdout
    # groups describe: the states per member, never None.
    r = run_cli("groups", "describe", "--bootstrap", cluster.daemon.bootstrap, GROUP)
    assert r.returncode == 0, r.stderr
    assert "INSTANCE STATES" in r.stdout and "FAILED" in r.stdout and "None" not in r.stdout, r.stdout
    r = run_cli("groups", "describe", "--bootstrap", cluster.daemon.bootstrap, GROUP, "--json")
    (g,) = json.loads(r.stdout)
    reported = {i["item"]: i["state"] for m in g["members"] for i in m["instances"]}
    assert reported["bad/0"] == "FAILED" and reported["good"] == "RUNNING"
    # The failing plugin's log line carries the traceback.
    logs = cluster.logs(tail=100_000)
    lines = [line for line in logs.splitlines() if "instance failed" in line]
    assert lines, logs[-3000:]
    assert any("Traceback (most recent call last)" in line and "_fail_on_purpose" in line
               for line in lines), lines[:3]
    # A connector that is not there.
    r = run_cli("connectors", "status", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP, "nope")
    assert r.returncode != 0 and "nope does not exist" in r.stderr
    # Paused: its items stay owned with nothing running; status says PAUSED (as Kafka
    # Connect), then RUNNING again once resumed.
    for verb, want in (("pause", "PAUSED"), ("resume", "RUNNING")):
        r = run_cli("connectors", verb, "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP, "good")
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 30
        while set(_states(st := _status(cluster, "good")).values()) != {want}:
            assert time.monotonic() < deadline, (verb, _states(st))
            time.sleep(0.2)
        assert st["target_state"] == ("PAUSED" if verb == "pause" else "RUNNING")

    # A worker leaves: its states go; the other worker takes its items and reports them.
    cluster.terminate("w2")
    deadline = time.monotonic() + 30
    while True:
        good, bad = _status(cluster, "good"), _status(cluster, "bad")
        members = {t["instance_id"] for st in (good, bad) for t in (st, *st["tasks"])}
        states = {**_states(good), **_states(bad)}
        if members == {"w1"} and states["bad/0"] == states["bad/1"] == "FAILED" \
                and states["good/0"] == "RUNNING":
            break
        assert time.monotonic() < deadline, (members, states, cluster.logs(tail=2000))
        time.sleep(0.2)


PLUGIN_SOURCE = '''
import os


class Task:
    async def start(self, config):
        # A name the file system gave back undecodable (os.fsdecode: surrogateescape), and
        # multi-byte text, in the error as a plugin would write it.
        name = os.fsdecode(b"/data/r\\xe9sum\\xe9-\\xff.csv")
        raise RuntimeError(f"cannot read {name}: \\u00e9t\\u00e9 \\u20ac \\U0001f600")

    async def stop(self):
        pass


class Connector:
    task_class = Task

    async def start(self, config):
        pass

    async def stop(self):
        pass
'''


def test_a_plugin_error_naming_an_undecodable_file_is_reported_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's error text may hold lone surrogates (a file name the OS gave back undecodable,
    os.fsdecode) that UTF-8 cannot encode: the worker's heartbeat carrying it could not be
    encoded and ended the worker (an unhandled UnicodeEncodeError), and every restart again.
    Now the text is reported with those characters escaped; the multi-byte ones stay."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "undecodable_plugin.py").write_text(PLUGIN_SOURCE)
    monkeypatch.setenv("PYTHONPATH", f"{plugins}:{ROOT}")
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool.start())
        try:
            r = run_cli("connectors", "create", "--bootstrap", c.daemon.bootstrap, "--group", GROUP,
                        "odd", "--tasks", "1", "--config", "connector.class=undecodable_plugin:Connector")
            assert r.returncode == 0, r.stderr
            proc = c.spawn("w1")
            deadline = time.monotonic() + 30
            while True:
                st = _status(c, "odd")
                if _states(st) == {"odd": "RUNNING", "odd/0": "FAILED"}:
                    break
                assert proc.poll() is None, c.logs(tail=3000)
                assert time.monotonic() < deadline, (st, c.logs(tail=2000))
                time.sleep(0.2)
            (task,) = st["tasks"]
            assert "cannot read /data/r\\udce9sum\\udce9-\\udcff.csv" in task["error"], task
            assert "\u00e9t\u00e9 \u20ac \U0001f600" in task["error"]
            assert "cannot read /data/r\\udce9sum\\udce9-\\udcff.csv" in task["trace"]
            time.sleep(1.0)  # (restarts with backoff go on being reported)
            assert proc.poll() is None, c.logs(tail=3000)
        finally:
            c.close()
