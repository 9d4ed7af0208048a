"""A connector class's ``validate(config)``: what it may return (connect_wire.plugins), and
``connect-coordinator connectors create/update`` running it before writing, as real processes
against a real daemon: an invalid config is refused with each ``key: message`` (exit 1, nothing
stored), ``--validate-only`` checks and writes nothing, a validator that raises or answers
something else is named, and a plugin the CLI cannot import is said so and written anyway."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from connect_wire.plugins import InvalidConfig, ValidatorFailed, error_lines, validate_sync
from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env
from worker_client.examples.recording import RecordingConnector

PLUGIN = "worker_client.examples.recording:RecordingConnector"

PLUGINS = textwrap.dedent('''
    class Base:
        async def start(self, config): pass
        async def stop(self): pass

    class Raises(Base):
        @staticmethod
        def validate(config):
            raise ValueError("cannot reach the database")

    class NotADict(Base):
        @classmethod
        def validate(cls, config):
            return ["url: missing"]

    class NotAList(Base):
        @classmethod
        def validate(cls, config):
            return {"url": "missing"}

    class InstanceMethod(Base):
        def validate(self, config):
            return {}

    class Async(Base):
        @classmethod
        async def validate(cls, config):
            errors = {}
            if not config.get("url"):
                errors["url"] = ["is required"]
            if config.get("connector.name") != "named":
                errors["connector.name"] = ["is " + repr(config.get("connector.name"))]
            return errors
''')


def test_validate_answers_the_errors_or_says_why_it_could_not(tmp_path: Path) -> None:
    (tmp_path / "vplugins.py").write_text(PLUGINS)
    sys.path.insert(0, str(tmp_path))
    try:
        import vplugins  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    assert validate_sync(vplugins.Base, {"x": "1"}) == {}  # no validate: valid
    assert validate_sync(vplugins.Async, {"connector.name": "named"}) == {"url": ["is required"]}
    assert validate_sync(vplugins.Async, {"connector.name": "named", "url": "u"}) == {}
    for cls, says in ((vplugins.Raises, "Raises.validate raised ValueError('cannot reach the database')"),
                      (vplugins.NotADict, "NotADict.validate returned list, not a dict"),
                      (vplugins.NotAList, "NotAList.validate returned {'url': 'missing'}: each entry"),
                      (vplugins.InstanceMethod, "must be a classmethod or staticmethod")):
        with pytest.raises(ValidatorFailed, match=".*") as info:
            validate_sync(cls, {})
        assert says in str(info.value), (cls, str(info.value))
    # The bundled example: keys without messages are left out; each message is one line.
    assert validate_sync(RecordingConnector, {"tick.ms": "100", "stop.mode": "hang"}) == {}
    errors = validate_sync(RecordingConnector, {"tick.ms": "soon", "run.mode": "sprint"})
    assert error_lines(errors) == [
        "run.mode: must be one of normal, ignore-cancel, block, not 'sprint'",
        "tick.ms: must be a whole number of milliseconds (0 or more), not 'soon'"]
    assert str(InvalidConfig(errors)).startswith("invalid config: run.mode: must be one of")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("validation")
    with DaemonPool(base) as pool:
        yield pool.start()


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plugins")
    (d / "vplugins.py").write_text(PLUGINS)
    return d


def cli(daemon: Daemon, *args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = daemon_env()
    if path is not None:
        env["PYTHONPATH"] += f":{path}"
    return subprocess.run([sys.executable, "-m", "coordinator.cli", "connectors", *args,
                           "--bootstrap", daemon.bootstrap], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=30, check=False)


def stored(daemon: Daemon, group: str) -> dict[str, dict[str, str]]:
    r = cli(daemon, "list", "--group", group, "--json")
    if r.returncode == 1 and "GROUP_ID_NOT_FOUND" in r.stderr:
        return {}  # (nothing was ever written to the group)
    assert r.returncode == 0, r.stderr
    return {c["name"]: c["config"] for c in json.loads(r.stdout)}


def test_create_refuses_an_invalid_config_printing_each_error(daemon: Daemon) -> None:
    for extra in ((), ("--validate-only",)):
        r = cli(daemon, "create", "--group", "v1", "c", "--tasks", "2", *extra,
                "--config", f"connector.class={PLUGIN}", "--config", "tick.ms=soon",
                "--config", "stop.mode=later", "--config", "record.file=")
        assert r.returncode == 1, r
        lines = r.stderr.splitlines()
        assert lines[0] == (f"connect-coordinator: connector c: invalid config ({PLUGIN}.validate), "
                            "nothing written:"), r.stderr
        assert lines[1:] == [
            "record.file: must not be empty (leave it out to record nothing)",
            "stop.mode: must be one of normal, block, hang, raise, thread, not 'later'",
            "tick.ms: must be a whole number of milliseconds (0 or more), not 'soon'"], r.stderr
        assert r.stdout == ""
    assert stored(daemon, "v1") == {}


def test_update_validates_the_merged_config(daemon: Daemon) -> None:
    r = cli(daemon, "create", "--group", "v2", "c", "--tasks", "1",
            "--config", f"connector.class={PLUGIN}", "--config", "tick.ms=100")
    assert r.returncode == 0 and r.stderr == "", r
    # The stored tick.ms stays valid; the one given is checked together with it.
    r = cli(daemon, "update", "--group", "v2", "c", "--config", "fail.mode=always")
    assert r.returncode == 1, r
    assert r.stderr.splitlines()[1:] == ["fail.mode: must be one of start, not 'always'"], r.stderr
    r = cli(daemon, "update", "--group", "v2", "c", "--validate-only", "--config", "tick.ms=50")
    assert r.returncode == 0 and r.stdout.startswith("valid: group v2"), r
    assert stored(daemon, "v2")["c"]["tick.ms"] == "100"  # --validate-only wrote nothing
    r = cli(daemon, "update", "--group", "v2", "c", "--config", "tick.ms=50")
    assert r.returncode == 0 and r.stdout.startswith("ok: group v2"), r
    assert stored(daemon, "v2")["c"]["tick.ms"] == "50"


@pytest.mark.parametrize(("cls", "says"), [
    ("Raises", "the config's validator itself failed, nothing written: vplugins.Raises.validate "
               "raised ValueError('cannot reach the database')"),
    ("NotADict", "the config's validator itself failed, nothing written: vplugins.NotADict.validate "
                 "returned list, not a dict of {key: [messages]}"),
    ("InstanceMethod", "vplugins.InstanceMethod.validate must be a classmethod or staticmethod"),
])
def test_a_validator_that_fails_is_named_and_nothing_is_written(
        daemon: Daemon, plugin_dir: Path, cls: str, says: str) -> None:
    r = cli(daemon, "create", "--group", "v3", cls.lower(), "--tasks", "1",
            "--config", f"connector.class=vplugins:{cls}", path=plugin_dir)
    assert r.returncode == 1, r
    assert r.stderr == f"connect-coordinator: connector {cls.lower()}: {says}\n" or (
        says in r.stderr and len(r.stderr.splitlines()) == 1), r.stderr
    assert "Traceback" not in r.stderr
    assert cls.lower() not in stored(daemon, "v3")


def test_an_async_validator_gets_the_name_and_is_awaited(daemon: Daemon, plugin_dir: Path) -> None:
    r = cli(daemon, "create", "--group", "v4", "named", "--tasks", "1",
            "--config", "connector.class=vplugins:Async", path=plugin_dir)
    assert r.returncode == 1 and r.stderr.splitlines()[1:] == ["url: is required"], r
    r = cli(daemon, "create", "--group", "v4", "named", "--tasks", "1",
            "--config", "connector.class=vplugins:Async", "--config", "url=u", path=plugin_dir)
    assert r.returncode == 0 and r.stderr == "", r
    assert "named" in stored(daemon, "v4")


def test_a_plugin_the_cli_cannot_import_is_written_unvalidated(daemon: Daemon, plugin_dir: Path) -> None:
    # vplugins is not on this CLI's path: said once, then created as before.
    r = cli(daemon, "create", "--group", "v5", "c", "--tasks", "1",
            "--config", "connector.class=vplugins:Raises")
    assert r.returncode == 0 and r.stdout.startswith("ok: group v5"), r
    assert r.stderr == ("connect-coordinator: could not validate connector c's config here: cannot "
                        "import 'vplugins' for plugin 'vplugins:Raises': No module named 'vplugins' "
                        "(its workers validate it before starting it)\n"), r.stderr
    assert stored(daemon, "v5")["c"]["connector.class"] == "vplugins:Raises"
