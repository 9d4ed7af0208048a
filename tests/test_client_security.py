"""Our clients speak Kafka's client security: the settings, TLS and SASL
(PLAIN, SCRAM-SHA-256/512) with re-authentication (KIP-368) in the worker's asyncio client and
the admin CLI's blocking client, and what a refusal does (the worker exits 4 and says why in one
line; an admin command prints one line and exits 1).

Against :class:`tests.sasl_server.SaslNode`: a KRPC node on a real socket, with real TLS from a
test CA (tests/tls_fixture.py), speaking SaslHandshake / SaslAuthenticate with scramp's server
the way a Kafka broker does. The daemon's own listener is tested end to end in
tests/test_security_worker_e2e.py.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.list_groups.v5.request import ListGroupsRequest

from connect_wire import client_security as cs
from connect_wire.client_security import (
    AuthenticationFailed,
    ClientSecurity,
    SecurityConfigError,
    parse_properties,
    reauth_delay_s,
    resolve,
)
from coordinator.admin import AdminClient, AdminSession
from coordinator.server.kafka_apis import build
from tests.daemon_fixture import ROOT, daemon_env, stderr_events
from tests.sasl_server import SaslNode
from tests.tls_fixture import TlsFiles, make_ca, tls_ca  # noqa: F401 - the fixture
from worker_client.client import ConnectionFailed, CoordinatorClient, KrpcConnection
from worker_client.worker import Worker, WorkerConfig, WorkerSecurityFailed

USERS = {"alice": "alice-secret", "bob": "bob secret with spaces",
         "carol,=": "\ufb01\u00b2 p\u00e4ss"}  # (a name SCRAM escapes; a password SASLprep changes)
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
FIND = FindCoordinatorRequest(key_type=0, coordinator_keys=("g",))
LIST = ListGroupsRequest(states_filter=(), types_filter=())


@pytest.fixture
def nodes() -> Iterator[list[SaslNode]]:
    made: list[SaslNode] = []
    yield made
    for n in made:
        n.stop()


def node(nodes: list[SaslNode], **kw: Any) -> SaslNode:
    n = SaslNode(users=USERS, **kw)
    nodes.append(n)
    return n


def sasl(mechanism: str = "SCRAM-SHA-512", user: str = "alice", password: str | None = None,
         tls: TlsFiles | None = None, **kw: Any) -> ClientSecurity:
    return ClientSecurity(protocol="SASL_SSL" if tls else "SASL_PLAINTEXT", mechanism=mechanism,
                          username=user, password=USERS[user] if password is None else password,
                          cafile=str(tls.ca.cert) if tls else None, **kw)


# == settings ======================================================================================


def test_properties_files_as_java_reads_them() -> None:
    text = ("# comment\n! another\n  security.protocol = SASL_SSL\nsasl.mechanism:SCRAM-SHA-512\n"
            "sasl.username alice\nssl.cafile=/etc/a\\\n   b.pem\nempty=\nkey\\=with\\:seps=v\\u00e9\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
            '    username="alice" password="p\\\\\\"w";\n')
    props = parse_properties(text)
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert props["sasl.username"] == "alice"
    assert props["ssl.cafile"] == "/etc/ab.pem"
    assert props["empty"] == ""
    assert props["key=with:seps"] == "vé"
    sec = resolve(props, environ={})
    assert (sec.protocol, sec.mechanism, sec.username) == ("SASL_SSL", "SCRAM-SHA-512", "alice")
    assert sec.password == 'p"w'


def test_settings_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    flag_pw = tmp_path / "flag-pw"
    flag_pw.write_text("from-flag\r\n")
    conf = tmp_path / "client.properties"
    conf.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=a\n"
                    f"sasl.password.file={pw}\nbootstrap.servers=ignored:9092\n")
    settings = cs.load_config_file(conf)
    assert resolve(settings, environ={}).password == "from-file"
    assert resolve(settings, environ={cs.PASSWORD_ENV: "from-env"}).password == "from-env"
    got = resolve(settings, {"sasl.password.file": str(flag_pw), "sasl.username": "b",
                             "sasl.mechanism": "SCRAM-SHA-256"}, {cs.PASSWORD_ENV: "from-env"})
    assert (got.password, got.username, got.mechanism) == ("from-flag", "b", "SCRAM-SHA-256")
    assert "from-flag" not in repr(got)  # never in a log line
    # TOML: the same names as keys (dotted keys are nested tables)
    toml = tmp_path / "client.toml"
    toml.write_text('security.protocol = "SASL_SSL"\nsasl.mechanism = "SCRAM-SHA-512"\n'
                    f'sasl.username = "a"\nsasl.password.file = "{pw}"\n'
                    'ssl.cafile = "/ca.pem"\nssl.check.hostname = false\n')
    got = resolve(cs.load_config_file(toml), environ={})
    assert (got.protocol, got.cafile, got.check_hostname, got.password) == \
        ("SASL_SSL", "/ca.pem", False, "from-file")


def test_kafka_and_librdkafka_names() -> None:
    got = resolve({"security.protocol": "ssl", "ssl.truststore.type": "PEM",
                   "ssl.truststore.location": "/t.pem", "ssl.keystore.type": "PEM",
                   "ssl.keystore.location": "/k.pem",
                   "ssl.endpoint.identification.algorithm": ""}, environ={})
    assert (got.cafile, got.certfile, got.keyfile, got.check_hostname) == \
        ("/t.pem", "/k.pem", "/k.pem", False)
    got = resolve({"security.protocol": "SASL_SSL", "sasl.mechanisms": "scram-sha-256",
                   "sasl.username": "u", "sasl.password": "p", "ssl.ca.location": "/c"}, environ={})
    assert (got.mechanism, got.password, got.cafile, got.check_hostname) == \
        ("SCRAM-SHA-256", "p", "/c", True)


@pytest.mark.parametrize("settings, flags, says", [
    ({"security.protocol": "SASL_SSL"}, {}, "needs sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, {}, "GSSAPI is not supported"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, {}, "needs sasl.username"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"}, {},
     "CONNECT_SASL_PASSWORD"),
    ({}, {"sasl.username": "u"}, "sasl.username given but security.protocol is PLAINTEXT"),
    ({"security.protocol": "SASL_PLAINTEXT"}, {"ssl.cafile": "/c"}, "TLS needs SSL or SASL_SSL"),
    ({"security.protocol": "TLS"}, {}, "security.protocol must be one of"),
    ({"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"}, {}, "JKS"),
    ({"security.protocol": "SSL", "ssl.check.hostname": "maybe"}, {}, "expected true or false"),
    ({"security.protocol": "SSL", "ssl.keyfile": "/k"}, {}, "without ssl.certfile"),
])
def test_bad_settings_are_named(settings: dict[str, str], flags: dict[str, str], says: str) -> None:
    with pytest.raises(SecurityConfigError, match=says):
        resolve(settings, flags, environ={})


def test_a_password_in_the_environment_alone_does_not_make_plaintext_an_error() -> None:
    assert resolve({}, environ={cs.PASSWORD_ENV: "x"}) == ClientSecurity()


def test_unloadable_tls_files_are_configuration_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(SecurityConfigError, match="ssl.cafile"):
        ClientSecurity("SSL", cafile=str(bad)).ssl_context()
    with pytest.raises(SecurityConfigError, match="ssl.certfile"):
        ClientSecurity("SSL", certfile=str(bad)).ssl_context()


def test_reauthentication_time_is_85_to_95_percent_of_the_lifetime() -> None:
    delays = [reauth_delay_s(10_000) for _ in range(500)]
    assert 8.5 <= min(delays) and max(delays) <= 9.5 and max(delays) - min(delays) > 0.5


# == the asyncio client (worker) ===================================================================


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("tls", [False, True], ids=["SASL_PLAINTEXT", "SASL_SSL"])
async def test_worker_connection_authenticates(nodes: list[SaslNode], tls_ca: TlsFiles,  # noqa: F811
                                               mechanism: str, tls: bool) -> None:
    n = node(nodes, ssl_context=tls_ca.server.server_context() if tls else None)
    conn = KrpcConnection("127.0.0.1", n.port, "t", sasl(mechanism, "bob", tls=tls_ca if tls else None))
    await conn.open(5)
    try:
        resp = await conn.request(FIND, 5)
        assert resp.coordinators[0].port == n.port
    finally:
        conn.close()
    anonymous = "User:ANONYMOUS"
    steps = 1 if mechanism == "PLAIN" else 2
    assert n.stats.log == [(1, "ApiVersions", 3, anonymous), (1, "SaslHandshake", 1, anonymous),
                           *[(1, "SaslAuthenticate", 2, anonymous)] * steps,
                           (1, "FindCoordinator", 4, "User:bob")]


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_names_and_passwords_as_kafka_takes_them(nodes: list[SaslNode], mechanism: str) -> None:
    """No SASLprep (Kafka's clients and broker use the password's UTF-8 bytes; SASLprep would
    turn the ligature and the superscript into "fi2"), SCRAM's escaping of ',' and '='."""
    n = node(nodes)
    conn = KrpcConnection("127.0.0.1", n.port, "t", sasl(mechanism, "carol,="))
    await conn.open(5)
    await conn.request(FIND, 5)
    conn.close()
    assert n.stats.log[-1][3] == "User:carol,="


@pytest.mark.parametrize("offered, used", [(2, 2), (1, 1), (0, 0)])
async def test_sasl_authenticate_version_follows_api_versions(nodes: list[SaslNode], offered: int,
                                                               used: int) -> None:
    n = node(nodes, authenticate_max=offered, session_lifetime_ms=60_000)
    conn = KrpcConnection("127.0.0.1", n.port, "t", sasl())
    await conn.open(5)
    conn.close()
    assert {v for _, name, v, _ in n.stats.log if name == "SaslAuthenticate"} == {used}
    assert conn.session is not None
    assert conn.session.lifetime_ms == (60_000 if used else 0)  # v0 has no SessionLifetimeMs


async def test_refusals_are_security_errors_not_connection_failures(nodes: list[SaslNode]) -> None:
    n = node(nodes, mechanisms=("SCRAM-SHA-256",), failure_delay_s=0.1)
    with pytest.raises(AuthenticationFailed, match="SASL_AUTHENTICATION_FAILED: .*invalid credentials "
                       r"with SASL mechanism SCRAM-SHA-256 \(check sasl.username") as e:
        await KrpcConnection("127.0.0.1", n.port, "t", sasl("SCRAM-SHA-256", password="wrong")).open(5)
    assert e.value.code == 58
    with pytest.raises(AuthenticationFailed, match="SASL_AUTHENTICATION_FAILED") as e:
        await KrpcConnection("127.0.0.1", n.port, "t", sasl("SCRAM-SHA-256", user="mallory",
                                                            password="x")).open(5)
    with pytest.raises(AuthenticationFailed, match=r"UNSUPPORTED_SASL_MECHANISM: .* does not enable "
                       r"sasl.mechanism SCRAM-SHA-512 \(it enables: SCRAM-SHA-256\)") as e:
        await KrpcConnection("127.0.0.1", n.port, "t", sasl("SCRAM-SHA-512")).open(5)
    assert e.value.code == 33
    plain = node(nodes, sasl=False)
    with pytest.raises(AuthenticationFailed, match="does not offer SASL"):
        await KrpcConnection("127.0.0.1", plain.port, "t", sasl()).open(5)
    assert [ok for *_, ok in n.stats.auths] == [False, False]


async def test_a_scram_server_that_does_not_know_the_password_is_refused(nodes: list[SaslNode]) -> None:
    """The client checks the server's final message (mutual authentication): a node that
    accepts any proof but cannot sign with the real credential is refused."""
    n = node(nodes)

    def fake(req: Any, conn: Any) -> Any:
        if conn.step == 1:  # the client's final message: say yes with a wrong signature
            cls = cs.wire_types(type(req))[3]
            conn.authenticated = True
            return build(cls, {"error_code": 0, "auth_bytes": b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                               "session_lifetime": 0})
        return None

    n.on[36] = fake
    with pytest.raises(AuthenticationFailed, match="the server's SCRAM answer is wrong"):
        await KrpcConnection("127.0.0.1", n.port, "t", sasl()).open(5)


async def test_tls_verification_failures_are_refusals(nodes: list[SaslNode], tls_ca: TlsFiles,  # noqa: F811
                                                      tmp_path: Path) -> None:
    other = make_ca(tmp_path / "other")
    n = node(nodes, ssl_context=tls_ca.server.server_context())
    wrong_ca = sasl(tls=tls_ca)
    wrong_ca = ClientSecurity(**{**wrong_ca.__dict__, "cafile": str(other.cert)})
    with pytest.raises(AuthenticationFailed, match="certificate did not verify.*check ssl.cafile"):
        await KrpcConnection("127.0.0.1", n.port, "t", wrong_ca).open(5)
    # A certificate that does not name the host connected to
    named = tls_ca.ca.issue("elsewhere", dns=("elsewhere.invalid",), ips=())
    m = node(nodes, ssl_context=named.server_context())
    with pytest.raises(AuthenticationFailed, match="ssl.check.hostname=false"):
        await KrpcConnection("127.0.0.1", m.port, "t", sasl(tls=tls_ca)).open(5)
    relaxed = ClientSecurity(**{**sasl(tls=tls_ca).__dict__, "check_hostname": False})
    conn = KrpcConnection("127.0.0.1", m.port, "t", relaxed)
    await conn.open(5)
    conn.close()


async def test_mutual_tls(nodes: list[SaslNode], tls_ca: TlsFiles) -> None:  # noqa: F811
    n = node(nodes, sasl=False, ssl_context=tls_ca.server.server_context(client_ca=tls_ca.ca))
    with_cert = ClientSecurity("SSL", cafile=str(tls_ca.ca.cert), certfile=str(tls_ca.client.cert),
                               keyfile=str(tls_ca.client.key))
    conn = KrpcConnection("127.0.0.1", n.port, "t", with_cert)
    await conn.open(5)
    await conn.request(FIND, 5)
    conn.close()
    assert n.stats.log == [(1, "ApiVersions", 3, "User:CN=worker-1,OU=ops"),
                           (1, "FindCoordinator", 4, "User:CN=worker-1,OU=ops")]
    # Without a client certificate: TLS 1.3 lets the handshake finish, the server's alert
    # comes with the first answer; either way it is a refusal.
    without = ClientSecurity("SSL", cafile=str(tls_ca.ca.cert))
    with pytest.raises(AuthenticationFailed, match="TLS: .*(CERTIFICATE_REQUIRED|ALERT)"):
        await KrpcConnection("127.0.0.1", n.port, "t", without).open(5)
    with pytest.raises(AuthenticationFailed, match="TLS: .*(CERTIFICATE_REQUIRED|ALERT)"):
        AdminClient("127.0.0.1", n.port, 5, security=without)


async def test_reauthenticates_on_the_same_connection_before_the_session_ends(
        nodes: list[SaslNode], tls_ca: TlsFiles) -> None:  # noqa: F811
    """KIP-368: with a 600 ms session, 2.5 s of requests (some held 250 ms by the node, as a
    long-polled heartbeat) go through one connection that re-authenticates about every
    510-570 ms, after the held answer; the node never sees a request past the session."""
    n = node(nodes, session_lifetime_ms=600, ssl_context=tls_ca.server.server_context())

    def slow(req: Any, conn: Any) -> Any:
        time.sleep(0.25)
        return None

    n.on[16] = slow  # ListGroups: held like a parked heartbeat
    conn = KrpcConnection("127.0.0.1", n.port, "t", sasl(tls=tls_ca))
    await conn.open(5)
    started = time.monotonic()
    try:
        while time.monotonic() - started < 2.5:
            held = asyncio.ensure_future(conn.request(LIST, 5))
            await conn.request(FIND, 5)
            await held
    finally:
        conn.close()
    assert n.stats.connections == 1 and n.stats.expired == 0
    assert 3 <= conn.reauthentications == n.stats.reauths <= 5
    assert [ok for *_, ok in n.stats.auths] == [True] * (1 + n.stats.reauths)
    names = n.apis_seen()
    assert names.count("ApiVersions") == 1  # a re-authentication is Handshake + Authenticate only
    assert names.count("SaslHandshake") == 1 + n.stats.reauths


async def test_a_refused_reauthentication_fails_the_connection_for_good(nodes: list[SaslNode]) -> None:
    n = node(nodes, session_lifetime_ms=400)
    conn = KrpcConnection("127.0.0.1", n.port, "t", sasl("PLAIN"))
    await conn.open(5)
    n.users["alice"] = "changed"  # the password was changed meanwhile
    await asyncio.sleep(0.45)
    with pytest.raises(AuthenticationFailed, match="SASL_AUTHENTICATION_FAILED"):
        await conn.request(FIND, 5)
    conn.close()


# == the blocking client (admin CLI) ===============================================================


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_admin_session_authenticates_every_connection(nodes: list[SaslNode], tls_ca: TlsFiles,  # noqa: F811
                                                     mechanism: str) -> None:
    n = node(nodes, ssl_context=tls_ca.server.server_context(), groups=("a", "b"))
    with AdminSession([("127.0.0.1", n.port)], timeout_s=5, security=sasl(mechanism, tls=tls_ca)) as s:
        assert s.list_groups().groups == [("a", "Stable"), ("b", "Stable")]
        s.group_call("a", FIND)
    assert {p for _, name, _, p in n.stats.log if name not in ("ApiVersions", "SaslHandshake",
                                                                 "SaslAuthenticate")} == {"User:alice"}


def test_admin_client_reauthenticates_and_the_node_enforces_the_session(nodes: list[SaslNode]) -> None:
    n = node(nodes, session_lifetime_ms=300)
    with AdminClient("127.0.0.1", n.port, 5, security=sasl()) as c:
        c.call(FIND)
        time.sleep(0.35)
        c.call(FIND)
        assert c.reauthentications == 1
    # Without re-authentication the node closes the connection (what the client avoids).
    with AdminClient("127.0.0.1", n.port, 5, security=sasl()) as c:
        c._reauth_at = None
        time.sleep(0.35)
        with pytest.raises(Exception, match="closed the connection"):
            c.call(FIND)
    assert n.stats.expired == 1


def test_admin_refusal_is_not_an_admin_error(nodes: list[SaslNode]) -> None:
    """The next bootstrap address is not tried after a refusal (Kafka: fatal)."""
    n = node(nodes)
    good = node(nodes)
    with AdminSession([("127.0.0.1", n.port), ("127.0.0.1", good.port)], timeout_s=5,
                      security=sasl(password="wrong")) as s, pytest.raises(AuthenticationFailed):
        s.list_groups()
    assert good.stats.connections == 0


# == the worker ===================================================================================


def worker(n: SaslNode, security: ClientSecurity, **kw: Any) -> Worker:
    return Worker(WorkerConfig(bootstrap=[("127.0.0.1", n.port)], group_id="g",
                               security=security, session_timeout_ms=3000, **kw))


async def run_until(w: Worker, cond: Any, timeout_s: float = 10.0) -> asyncio.Task[None]:
    task = asyncio.create_task(w.run())
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert not task.done(), task.exception()
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
    return task


async def test_worker_authenticates_its_find_coordinator_and_group_connections(
        nodes: list[SaslNode], tls_ca: TlsFiles) -> None:  # noqa: F811
    n = node(nodes, ssl_context=tls_ca.server.server_context())
    w = worker(n, sasl("SCRAM-SHA-512", tls=tls_ca))
    task = await run_until(w, lambda: w.membership.member_epoch == 1)
    await w.stop()
    await task
    per_conn: dict[int, list[tuple[str, str]]] = {}
    for number, name, _, principal in n.stats.log:
        per_conn.setdefault(number, []).append((name, principal))
    assert len(per_conn) >= 3  # FindCoordinator's own, the heartbeat one and the control one
    for calls in per_conn.values():
        assert [c[0] for c in calls[:4]] == ["ApiVersions", "SaslHandshake", "SaslAuthenticate",
                                             "SaslAuthenticate"]
        assert {p for _, p in calls[4:]} == {"User:alice"}
    assert any(c[0] == "FindCoordinator" for calls in per_conn.values() for c in calls)


@pytest.mark.parametrize("case", ["wrong-password", "mechanism", "tls", "group-acl", "find-acl"])
async def test_worker_refused_stops_at_once(nodes: list[SaslNode], tls_ca: TlsFiles,  # noqa: F811
                                            tmp_path: Path, case: str) -> None:
    security = sasl()
    kw: dict[str, Any] = {}
    if case == "mechanism":
        kw["mechanisms"] = ("PLAIN",)
    if case == "tls":
        kw["ssl_context"] = tls_ca.server.server_context()
        security = ClientSecurity(**{**sasl(tls=tls_ca).__dict__,
                                     "cafile": str(make_ca(tmp_path / "other").cert)})
    if case == "wrong-password":
        security = sasl(password="wrong")
    if case == "group-acl":
        kw["heartbeat_error"] = 30
    n = node(nodes, **kw)
    if case == "find-acl":
        def deny(req: Any, conn: Any) -> Any:
            cls = cs.wire_types(type(req))[3]
            return build(cls, {"throttle_time": 0, "coordinators": [
                {"key": "g", "node_id": -1, "host": "", "port": -1, "error_code": 30,
                 "error_message": "Not authorized"}]})
        n.on[10] = deny
    w = worker(n, security)
    started = time.monotonic()
    with pytest.raises(WorkerSecurityFailed) as e:
        await asyncio.wait_for(w.run(), 10)
    assert time.monotonic() - started < 3  # no retrying
    expect = {"wrong-password": (58, "SASL_AUTHENTICATION_FAILED"),
              "mechanism": (33, "UNSUPPORTED_SASL_MECHANISM"), "tls": (0, "did not verify"),
              "group-acl": (30, "GROUP_AUTHORIZATION_FAILED: Not authorized: User:alice (the "
                            "principal needs READ on group g)"),
              "find-acl": (30, "GROUP_AUTHORIZATION_FAILED")}[case]
    assert e.value.code == expect[0]
    assert expect[1] in str(e.value) and "\n" not in str(e.value)


async def test_worker_retries_a_connection_failure_but_not_a_refusal(nodes: list[SaslNode]) -> None:
    """A dead bootstrap address is skipped and retried as before; a live node then refusing
    the credentials ends the worker."""
    n = node(nodes)
    client = CoordinatorClient([("127.0.0.1", 1)], "g", security=sasl())
    with pytest.raises(ConnectionFailed):
        await client.send(FIND)
    client = CoordinatorClient([("127.0.0.1", 1), ("127.0.0.1", n.port)], "g",
                               security=sasl(password="wrong"))
    with pytest.raises(AuthenticationFailed):
        for _ in range(5):  # the dead address may be tried first: that one is retried
            with pytest.raises(ConnectionFailed):
                await client.send(FIND)


# == the command lines ============================================================================


def cli_env(**extra: str) -> dict[str, str]:
    env = daemon_env()
    env.pop(cs.PASSWORD_ENV, None)
    env.update(extra)
    return env


def test_connect_worker_exits_4_with_one_line(nodes: list[SaslNode], tls_ca: TlsFiles,  # noqa: F811
                                              tmp_path: Path) -> None:
    n = node(nodes, ssl_context=tls_ca.server.server_context())
    conf = tmp_path / "worker.properties"
    conf.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                    f"sasl.username=alice\nssl.cafile={tls_ca.ca.cert}\n")
    cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", n.bootstrap,
           "--group", "g", "--client-config", str(conf)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=cli_env(**{cs.PASSWORD_ENV: "wrong"}))
    assert proc.returncode == 4, proc.stderr
    last = stderr_events(proc.stderr)[-1]
    assert last.startswith("connect-worker: authentication failed: SASL_AUTHENTICATION_FAILED: "
                           f"127.0.0.1:{n.port}: Authentication failed"), last
    # The right password (from the environment): it joins and stops cleanly on SIGTERM.
    worker_proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=ROOT, env=cli_env(**{cs.PASSWORD_ENV: USERS["alice"]}))
    try:
        deadline = time.monotonic() + 30
        while "ConnectGroupHeartbeat" not in n.apis_seen():
            assert worker_proc.poll() is None and time.monotonic() < deadline, worker_proc.stderr.read()
            time.sleep(0.05)
    finally:
        worker_proc.send_signal(signal.SIGTERM)
        assert worker_proc.wait(30) == 0
    # A bad setting: exit 2
    bad = subprocess.run([*cmd[:-2], "--security-protocol", "SASL_SSL"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=cli_env())
    assert bad.returncode == 2
    assert stderr_events(bad.stderr) == ["connect-worker: configuration error: security.protocol "
                                  "SASL_SSL needs sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"]


def test_connect_worker_without_the_client_certificate_exits_4(nodes: list[SaslNode],
                                                              tls_ca: TlsFiles) -> None:  # noqa: F811
    """Mutual TLS refused (under uvloop, as the command runs)."""
    n = node(nodes, sasl=False, ssl_context=tls_ca.server.server_context(client_ca=tls_ca.ca))
    proc = subprocess.run(
        [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", n.bootstrap, "--group", "g",
         "--security-protocol", "SSL", "--ssl-cafile", str(tls_ca.ca.cert)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=cli_env())
    assert proc.returncode == 4, proc.stderr
    assert stderr_events(proc.stderr)[-1].startswith(
        f"connect-worker: authentication failed: TLS: 127.0.0.1:{n.port}: ")


def test_connect_worker_not_authorized_exits_4(nodes: list[SaslNode], tmp_path: Path) -> None:
    n = node(nodes, heartbeat_error=30)
    pw = tmp_path / "pw"
    pw.write_text(USERS["bob"] + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", n.bootstrap, "--group", "g",
         "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-256",
         "--sasl-username", "bob", "--sasl-password-file", str(pw)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=cli_env())
    assert proc.returncode == 4, proc.stderr
    assert stderr_events(proc.stderr)[-1] == (
        "connect-worker: not authorized: GROUP_AUTHORIZATION_FAILED: Not authorized: User:bob "
        "(the principal needs READ on group g)")


def test_admin_cli_with_command_config(nodes: list[SaslNode], tls_ca: TlsFiles,  # noqa: F811
                                       tmp_path: Path) -> None:
    n = node(nodes, ssl_context=tls_ca.server.server_context(), groups=("blue",))
    conf = tmp_path / "admin.toml"
    conf.write_text('security.protocol = "SASL_SSL"\nsasl.mechanism = "SCRAM-SHA-256"\n'
                    f'sasl.username = "alice"\nssl.cafile = "{tls_ca.ca.cert}"\n')
    cmd = [sys.executable, "-m", "coordinator.cli", "groups", "list", "--bootstrap", n.bootstrap,
           "--command-config", str(conf)]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                        env=cli_env(**{cs.PASSWORD_ENV: USERS["alice"]}))
    assert ok.returncode == 0, ok.stderr
    assert "blue" in ok.stdout
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env=cli_env(**{cs.PASSWORD_ENV: "nope"}))
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("connect-coordinator: authentication failed: "
                                     "SASL_AUTHENTICATION_FAILED: ")
    missing = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=cli_env())
    assert missing.returncode == 2 and "needs a password" in missing.stderr
