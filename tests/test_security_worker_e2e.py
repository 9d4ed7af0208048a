"""End to end: real ``connect-worker`` processes and the admin CLI against the
real daemon over SASL_SSL with SCRAM-SHA-512, users made with ``connect-coordinator users add``
(offline, into the data dir), ACLs with ``connect-coordinator acls add`` (online, as the
super user over SASL_SSL), TLS from a test CA made by the tests.

* Two workers authenticated as ``User:worker`` (one with its settings from a properties file
  and the password from ``$CONNECT_SASL_PASSWORD``, one from a TOML file with
  ``sasl.password.file``) join the group the ACL lets them READ and run its work, and keep it
  through several re-authentications (``connections.max.reauth.ms`` 1500): no session expires,
  no heartbeat fails.
* A worker with a wrong password exits 4 at once, its last line saying SASL_AUTHENTICATION_FAILED;
  one with the right password on a group no ACL lets it read exits 4 with
  GROUP_AUTHORIZATION_FAILED; one with a CA that did not sign the daemon's certificate exits 4.
* The admin CLI with a wrong password prints one line and exits 1.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connect_wire import client_security as cs
from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env, run_cli, stderr_events
from tests.tls_fixture import TlsFiles, make_ca, tls_ca  # noqa: F401 - the fixture

GROUP = "orders"
PLUGIN = "worker_client.examples.recording:RecordingConnector"
REAUTH_MS = 1500


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def env(**extra: str) -> dict[str, str]:
    e = daemon_env()
    e.pop(cs.PASSWORD_ENV, None)
    e.update(extra)
    return e


def metric(d: Daemon, name: str, **labels: str) -> float:
    assert d.metrics_url is not None
    text = urllib.request.urlopen(d.metrics_url, timeout=5).read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_workers_over_sasl_ssl_with_scram_sha_512(pool: DaemonPool, tls_ca: TlsFiles,  # noqa: F811
                                                  tmp_path: Path) -> None:
    data = tmp_path / "data"
    passwords = {"admin": "admin-secret", "worker": "worker-secret",
                 "carol": "\ufb01\u00b2 p\u00e4ss"}  # (SASLprep would change this one)
    for user, password in passwords.items():
        (tmp_path / f"{user}.pw").write_text(f"{password}\n", encoding="utf-8")
        added = run_cli("users", "add", "--data-dir", str(data), user, "--mechanism", "SCRAM-SHA-512",
                        "--password-file", str(tmp_path / f"{user}.pw"))
        assert added.returncode == 0, added.stderr
    (tmp_path / "wrong.pw").write_text("not-the-password\n")
    conf = tmp_path / "coordinator.toml"
    conf.write_text(
        f'ssl.certfile = "{tls_ca.server.cert}"\nssl.keyfile = "{tls_ca.server.key}"\n'
        'sasl.enabled.mechanisms = "SCRAM-SHA-512"\nauthorizer = "acl"\n'
        f'super.users = "User:admin"\nconnections.max.reauth.ms = {REAUTH_MS}\n')
    d = pool.start(data, extra_args=["--config", str(conf),
                                     "--listen", "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"])
    bootstrap = d.address("SASL_SSL")

    admin = tmp_path / "admin.properties"
    admin.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=admin\n"
                     f"sasl.password.file={tmp_path / 'admin.pw'}\nssl.cafile={tls_ca.ca.cert}\n")

    def cli(*args: str, config: Path = admin) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, "--bootstrap", bootstrap, "--command-config", str(config))

    for args in (("acls", "add", "--allow-principal", "User:worker", "--operation", "Read",
                  "--group", GROUP),
                 ("connectors", "create", "--group", GROUP, "c", "--tasks", "2",
                  "--config", f"connector.class={PLUGIN}",
                  "--config", f"record.file={tmp_path / 'records.jsonl'}")):
        done = cli(*args)
        assert done.returncode == 0, done.stderr

    # The admin CLI refused: one line, exit 1 (a password from the flag overrides the file's).
    refused = run_cli("groups", "list", "--bootstrap", bootstrap, "--command-config", str(admin),
                      "--sasl-password-file", str(tmp_path / "wrong.pw"))
    assert refused.returncode == 1
    assert refused.stderr == (
        f"connect-coordinator: authentication failed: SASL_AUTHENTICATION_FAILED: {bootstrap}: "
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512 (check sasl.username and the password)\n")

    # A password that SASLprep would change: sent as its UTF-8 bytes, as Kafka's clients do.
    carol = run_cli("groups", "list", "--bootstrap", bootstrap, "--security-protocol", "SASL_SSL",
                    "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "carol",
                    "--sasl-password-file", str(tmp_path / "carol.pw"),
                    "--ssl-cafile", str(tls_ca.ca.cert))
    assert carol.returncode == 0, carol.stderr

    props = tmp_path / "worker.properties"
    props.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=worker\n"
                     f"ssl.cafile={tls_ca.ca.cert}\n")
    toml = tmp_path / "worker.toml"
    toml.write_text(f'security.protocol = "SASL_SSL"\nsasl.mechanism = "SCRAM-SHA-512"\n'
                    f'sasl.username = "worker"\nsasl.password.file = "{tmp_path / "worker.pw"}"\n'
                    f'ssl.cafile = "{tls_ca.ca.cert}"\n')

    def worker(name: str, config: Path, group: str = GROUP, password: str | None = None,
               extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        extra_env = {cs.PASSWORD_ENV: password} if password is not None else {}
        return subprocess.Popen(
            [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", bootstrap, "--group",
             group, "--instance-id", name, "--client-config", str(config), *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, text=True, env=env(**extra_env),
            cwd=ROOT)

    def last_line(name: str) -> str:
        return stderr_events((tmp_path / f"{name}.log").read_text())[-1]

    w1 = worker("w1", props, password="worker-secret")
    w2 = worker("w2", toml)
    try:
        deadline = time.monotonic() + 30
        while True:
            described = cli("groups", "describe", GROUP, "--json")
            assert described.returncode == 0, described.stderr
            (g,) = json.loads(described.stdout)
            running = [i for m in g["members"] for i in m["assignment"]]
            if sorted(m["instance_id"] for m in g["members"]) == ["w1", "w2"] and \
                    sorted(running) == ["c", "c/0", "c/1"] and \
                    all(m["assignment"] == m["target"] and m["assignment"] for m in g["members"]):
                break  # both members in, every item running once, nothing moving
            assert w1.poll() is None and w2.poll() is None, (last_line("w1"), last_line("w2"))
            assert time.monotonic() < deadline, described.stdout
            time.sleep(0.2)
        # Several re-authentications of every connection later, nothing broke.
        before = metric(d, "connect_coordinator_authentications_total", reauth="true", result="success")
        time.sleep(REAUTH_MS * 2.5 / 1000)
        after = metric(d, "connect_coordinator_authentications_total", reauth="true", result="success")
        assert after - before >= 4, (before, after)  # 2 workers x (heartbeat + control) x >= 1
        assert metric(d, "connect_coordinator_sasl_sessions_expired_total") == 0
        assert metric(d, "connect_coordinator_authentications_total", result="failure") == 1  # the CLI's
        for name in ("w1", "w2"):
            text = (tmp_path / f"{name}.log").read_text()
            assert "heartbeat failed" not in text and "lost all work" not in text, text[-2000:]

        # Refused workers exit 4 at once, with one line saying why.
        cases = {
            "wrong-password": (dict(config=props, password="nope"),
                               "connect-worker: authentication failed: SASL_AUTHENTICATION_FAILED: "
                               f"{bootstrap}: Authentication failed during authentication due to "
                               "invalid credentials with SASL mechanism SCRAM-SHA-512 (check "
                               "sasl.username and the password)"),
            "no-acl": (dict(config=toml, group="payments"),
                       "connect-worker: not authorized: GROUP_AUTHORIZATION_FAILED: "
                       f"{bootstrap} refused FindCoordinator for group payments: "),
            "other-ca": (dict(config=toml, extra=("--ssl-cafile", str(make_ca(tmp_path / "o").cert))),
                         f"connect-worker: authentication failed: TLS: {bootstrap}: the server's "
                         "certificate did not verify: "),
        }
        for name, (kw, says) in cases.items():
            started = time.monotonic()
            proc = worker(name, **kw)  # type: ignore[arg-type]
            assert proc.wait(30) == 4, last_line(name)
            assert time.monotonic() - started < 15
            assert last_line(name).startswith(says), last_line(name)
    finally:
        for p in (w1, w2):
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in (w1, w2)]
    assert codes == [0, 0], (last_line("w1"), last_line("w2"))
