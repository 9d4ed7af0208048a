"""Kafka's config providers in the worker: ``${file:...}``, ``${directory:...}``, ``${env:...}``
resolved when an instance starts, so a connector's secrets never reach the coordinator.

* the resolver (pure): each provider, a reference to a provider not enabled left as written, a
  reference that cannot be resolved an error naming the reference (never a value), files outside
  the allowed paths refused, unknown provider names refused;
* end to end: a real ``connect-worker --config-providers env,file`` runs a connector whose
  config holds only references: the plugin gets the values, the coordinator's describe answer
  and its data directory only the references.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connect_wire.apis import ApiKey
from connect_wire.messages import ConnectGroupAlterConnectorsRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from tests.daemon_fixture import ROOT, daemon_env, run_cli, stderr_events
from tests.secure_server import InProcess, Raw
from worker_client.config_providers import ConfigProviderError, ConfigProviders

PLUGIN = "worker_client.examples.recording:RecordingConnector"


def test_each_provider_resolves_and_others_are_left_as_written(tmp_path: Path) -> None:
    (tmp_path / "db.properties").write_text("user=app\npassword=s3cr3t:x\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text("t0k3n")
    p = ConfigProviders(["file", "directory", "env"], environ={"API_KEY": "k-1"})
    assert p.resolve({
        "a": f"${{file:{tmp_path}/db.properties:password}}",
        "b": f"jdbc://${{file:{tmp_path}/db.properties:user}}@h/${{env:API_KEY}}",
        "c": f"${{directory:{tmp_path}/secrets:token}}",
        "d": "${vault:secret/x:y}",  # not enabled: as written (Kafka's ConfigTransformer)
        "e": None, "f": "plain"}) == {
        "a": "s3cr3t:x", "b": "jdbc://app@h/k-1", "c": "t0k3n", "d": "${vault:secret/x:y}",
        "e": None, "f": "plain"}
    only_env = ConfigProviders(["env"], environ={"X": "1"})
    assert only_env.resolve({"a": "${env:X}", "b": "${file:/etc/passwd:root}"}) == {
        "a": "1", "b": "${file:/etc/passwd:root}"}
    assert ConfigProviders([""]).resolve({"a": "${env:HOME}"}) == {"a": "${env:HOME}"}


@pytest.mark.parametrize(("value", "says"), [
    ("${env:NOPE}", "db.password: ${env:NOPE}: no environment variable NOPE"),
    ("${file:{d}/db.properties:nokey}", "db.password: ${file:{d}/db.properties:nokey}: no key "
                                         "nokey in {d}/db.properties"),
    ("${file:{d}/missing:k}", "db.password: ${file:{d}/missing:k}: cannot read {d}/missing: "
                              "No such file or directory"),
    ("${directory:{d}:../x}", "db.password: ${directory:{d}:../x}: '../x' is not a file name "
                              "in {d}"),
    ("${file:/etc/hostname:k}", "db.password: ${file:/etc/hostname:k}: /etc/hostname is "
                                "outside the allowed paths ({d})"),
])
def test_unresolvable_references_are_errors_naming_the_reference(
        tmp_path: Path, value: str, says: str) -> None:
    (tmp_path / "db.properties").write_text("password=s3cr3t\n")
    d = str(tmp_path.resolve())
    p = ConfigProviders(["file", "directory", "env"], [d], environ={})
    with pytest.raises(ConfigProviderError) as err:
        p.resolve({"db.password": value.replace("{d}", d)})
    assert str(err.value) == says.replace("{d}", d)
    assert "s3cr3t" not in str(err.value)


def test_unknown_provider_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown config provider vault"):
        ConfigProviders(["env", "vault"])
    bad = subprocess.run([sys.executable, "-m", "worker_client.cli", "run", "--bootstrap",
                          "127.0.0.1:1", "--group", "g", "--config-providers", "vault"],
                         capture_output=True, text=True, cwd=ROOT, env=daemon_env(), timeout=60)
    assert bad.returncode == 2
    assert stderr_events(bad.stderr) == ["connect-worker: --config-providers: unknown config "
                                         "provider vault (one of file, directory, env)"]


def test_a_worker_resolves_secrets_the_coordinator_never_sees(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "db.properties").write_text("password=db-s3cr3t\n")
    records = tmp_path / "records.jsonl"
    config = {"connector.class": PLUGIN, "record.file": str(records),
              "record.tag": f"${{file:{secrets}/db.properties:password}}/${{env:API_TOKEN}}"}
    with InProcess(tmp_path) as d:
        at = "{}:{}".format(*d.address())
        with Raw(d.address()) as admin:
            assert not admin.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0,
                                  ConnectGroupAlterConnectorsRequest(
                                      group_id="g", validate_only=False, deletes=(),
                                      upserts=(_alter.ConnectorSpec(
                                          name="c", task_count=1, config=tuple(
                                              _alter.ConfigEntry(name=k, value=v)
                                              for k, v in config.items())),))).error_code
        log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", at, "--group", "g",
             "--instance-id", "w1", "--config-providers", "file,env",
             "--config-providers-allowed-paths", str(secrets)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, text=True, cwd=ROOT,
            env={**daemon_env(), "API_TOKEN": "tok-42"})
        try:
            deadline = time.monotonic() + 60
            while True:
                started = ([json.loads(line) for line in records.read_text().splitlines()]
                           if records.exists() else [])
                tags = {e["item"]: e.get("tag") for e in started if e["event"] == "start"}
                if set(tags) == {"c", "c/0"}:
                    break
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-2000:]
                time.sleep(0.2)
            assert tags == {"c": "db-s3cr3t/tok-42", "c/0": "db-s3cr3t/tok-42"}
            described = run_cli("connectors", "describe", "--group", "g", "c", "--json",
                                "--bootstrap", at)
            assert described.returncode == 0, described.stderr
            assert config["record.tag"] in described.stdout
        finally:
            worker.terminate()
            worker.wait(30)
            log.close()
    for f in (tmp_path / "data").rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert b"db-s3cr3t" not in data and b"tok-42" not in data, f
