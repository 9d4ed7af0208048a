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
    # connectors list: the target state and how many instances the workers run, apart (bad's
    # target is RUNNING, but only its connector instance runs).
    r = run_cli("connectors", "list", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP,
                "--json")
    listed = {c["name"]: (c["state"], c["running_instances"], c["instances"])
              for c in json.loads(r.stdout)}
    assert listed == {"bad": ("RUNNING", 1, 3), "good": ("RUNNING", 3, 3)}, r.stdout
    r = run_cli("connectors", "list", "--bootstrap", cluster.daemon.bootstrap, "--group", GROUP)
    rows = [line.split()[:4] for line in r.stdout.splitlines()]
    assert rows[:3] == [["CONNECTOR", "TASKS", "TARGET", "RUNNING"], ["bad", "2", "RUNNING", "1/3"],
                        ["good", "2", "RUNNING", "3/3"]], r.stdout
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


STRICT_SOURCE = '''
from worker_client.examples.recording import RecordingConnector


class StrictConnector(RecordingConnector):
    @classmethod
    def validate(cls, config):
        if config.get("explode"):
            raise ValueError("the validator broke")
        errors = super().validate(config)
        if not config.get("url"):
            errors["url"] = ["is required", "names the database"]
        return errors
'''


def test_a_connector_whose_config_fails_validation_is_failed_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker runs the connector class's validate() before starting any instance of it:
    an invalid config leaves the connector and each task FAILED with the messages and nothing
    started (the recording plugin records no start), a validator that raises FAILED with its
    exception; an update that makes the config valid starts them."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "strict_plugin.py").write_text(STRICT_SOURCE)
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool.start())
        try:
            # Created by a CLI that cannot import the plugin: it says so and writes them.
            for name, extra in (("strict", ["--config", "tick.ms=soon"]),
                                ("broken", ["--config", "explode=1"]), ("good", [])):
                cls = PLUGIN if name == "good" else "strict_plugin:StrictConnector"
                r = run_cli("connectors", "create", "--bootstrap", c.daemon.bootstrap, "--group",
                            GROUP, name, "--tasks", "2", "--config", f"connector.class={cls}",
                            "--config", f"record.file={c.records}", *extra)
                assert r.returncode == 0, r.stderr
                assert ("could not validate" in r.stderr) == (name != "good"), r.stderr
            monkeypatch.setenv("PYTHONPATH", f"{plugins}:{ROOT}")  # the workers can import it
            for name in ("w1", "w2"):
                c.spawn(name)
            deadline = time.monotonic() + 30
            want = {**{i: "RUNNING" for i in ("good", "good/0", "good/1")},
                    **{i: "FAILED" for i in ("strict", "strict/0", "strict/1",
                                             "broken", "broken/0", "broken/1")}}
            while True:
                sts = {name: _status(c, name) for name in ("good", "strict", "broken")}
                states = {k: v for st in sts.values() for k, v in _states(st).items()}
                if states == want:
                    break
                assert time.monotonic() < deadline, (states, c.logs(tail=2000))
                time.sleep(0.2)
            invalid = ("invalid config: tick.ms: must be a whole number of milliseconds (0 or "
                       "more), not 'soon'; url: is required; url: names the database")
            for inst in (sts["strict"], *sts["strict"]["tasks"]):
                assert inst["error"] == invalid, inst
                assert inst["trace"] == invalid.removeprefix("invalid config: ").replace("; ", "\n")
            for inst in (sts["broken"], *sts["broken"]["tasks"]):
                assert inst["error"].startswith("ValidatorFailed(\"strict_plugin.StrictConnector."
                                                "validate raised ValueError('the validator broke')"), inst
                assert "ValueError: the validator broke" in inst["trace"], inst
            records = [json.loads(line) for line in c.records.read_text().splitlines()]
            started = {r["item"] for r in records if r["event"] == "start"}
            assert started == {"good", "good/0", "good/1"}, started

            # Made valid (the CLI, now able to import the plugin, validates the merged config).
            r = run_cli("connectors", "update", "--bootstrap", c.daemon.bootstrap, "--group", GROUP,
                        "strict", "--config", "url=sqlite:///x")
            assert r.returncode == 1 and r.stderr.splitlines()[1:] == [
                "tick.ms: must be a whole number of milliseconds (0 or more), not 'soon'"], r.stderr
            r = run_cli("connectors", "update", "--bootstrap", c.daemon.bootstrap, "--group", GROUP,
                        "strict", "--config", "url=sqlite:///x", "--config", "tick.ms=1000")
            assert r.returncode == 0 and r.stderr == "", r.stderr
            deadline = time.monotonic() + 30
            while set(_states(st := _status(c, "strict")).values()) != {"RUNNING"}:
                assert time.monotonic() < deadline, (_states(st), c.logs(tail=2000))
                time.sleep(0.2)
            records = [json.loads(line) for line in c.records.read_text().splitlines()]
            assert {r["item"] for r in records if r["event"] == "start"} >= {
                "strict", "strict/0", "strict/1"}
            assert not any(r["item"].startswith("broken") for r in records)
        finally:
            c.close()
