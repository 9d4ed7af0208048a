"""Kafka's own clients against a real, secured daemon process: kafka-python
(3.x), aiokafka and confluent-kafka (librdkafka) authenticate with SCRAM-SHA-256 and -512 over
SASL_SSL (a test CA made here, tests/tls_fixture.py) and are refused with a wrong password;
re-authentication (KIP-368) with a short ``connections.max.reauth.ms``; the mutual-TLS
principal; PLAIN refused on SASL_PLAINTEXT; an unauthorized principal gets
GROUP_AUTHORIZATION_FAILED.

The daemon is set up the way docs/security.md describes: users added offline
(``connect-coordinator users add --data-dir``) before it starts, an internal PLAINTEXT listener
on 127.0.0.1 whose ANONYMOUS principal is a super user (it creates the groups and the ACLs,
with our CLI and with kafka-python's admin client), SASL_SSL, SASL_PLAINTEXT and SSL (client
certificates required) listeners outside, ``authorizer=acl``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import Daemon, run_cli, start
from tests.tls_fixture import TlsFiles, tls_ca  # noqa: F401 (the fixture)

USERS = {"alice": "alice-pw", "bob": "bob-pw"}  # both mechanisms each
WORKER_CERT_PRINCIPAL = "User:OU=ops,CN=worker-1"  # tls_ca's client certificate, as Kafka writes it
GROUPS = ("orders", "payments", "secret")
# alice may READ orders and payments; bob nothing; the certificate DESCRIBE orders.
ACLS = [("User:alice", "orders", "READ"), ("User:alice", "payments", "READ"),
        (WORKER_CERT_PRINCIPAL, "orders", "DESCRIBE")]
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _add_users(data: Path, tmp: Path) -> None:
    for user, password in USERS.items():
        pw = tmp / f"{user}.pw"
        pw.write_text(password + "\n")
        for mechanism in MECHANISMS:
            done = run_cli("users", "add", "--data-dir", str(data), user, "--mechanism",
                           mechanism, "--password-file", str(pw))
            assert done.returncode == 0, done.stdout + done.stderr


def _start(tmp: Path, files: TlsFiles, **extra: str) -> Daemon:
    data = tmp / "data"
    _add_users(data, tmp)
    env = {
        "CONNECT_COORDINATOR_SSL_CERTFILE": str(files.server.cert),
        "CONNECT_COORDINATOR_SSL_KEYFILE": str(files.server.key),
        "CONNECT_COORDINATOR_SSL_CAFILE": str(files.ca.cert),
        "CONNECT_COORDINATOR_SSL_CLIENT_AUTH": "required",
        "CONNECT_COORDINATOR_SASL_ENABLED_MECHANISMS": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        "CONNECT_COORDINATOR_AUTHORIZER": "acl",
        "CONNECT_COORDINATOR_SUPER_USERS": "User:ANONYMOUS",
        **{f"CONNECT_COORDINATOR_{k.upper()}": v for k, v in extra.items()},
    }
    # (ssl.client.auth=required: the SASL_SSL listener asks for a certificate too; the SASL
    # clients below present tls_ca's client certificate there, their principal is still the
    # SASL user.)
    d = start(data, extra_env=env, extra_args=[
        "--listen", "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,"
                    "SSL://127.0.0.1:0"])
    assert set(d.listeners) == {"PLAINTEXT", "SASL_SSL", "SASL_PLAINTEXT", "SSL"}
    internal = d.address("PLAINTEXT")
    for group in GROUPS:
        done = run_cli("connectors", "create", "--bootstrap", internal, "--group", group, "c",
                       "--tasks", "1", "--config", "connector.class=pkg:Source")
        assert done.returncode == 0, done.stdout + done.stderr
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        KafkaAdminClient,
        ResourcePattern,
        ResourceType,
    )
    admin = KafkaAdminClient(bootstrap_servers=internal, request_timeout_ms=10_000)
    try:
        acls = [ACL(p, "*", getattr(ACLOperation, op), ACLPermissionType.ALLOW,
                    ResourcePattern(ResourceType.GROUP, g)) for p, g, op in ACLS]
        created = admin.create_acls(acls)
        assert not created["failed"], created
    finally:
        admin.close()
    return d


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tls_ca: TlsFiles) -> Iterator[Daemon]:  # noqa: F811
    d = _start(tmp_path_factory.mktemp("secured"), tls_ca)
    yield d
    d.stop()


def metric(d: Daemon, name: str, **labels: str) -> float:
    """A sample of the daemon's /metrics (0 when absent)."""
    assert d.metrics_url is not None
    text = urllib.request.urlopen(d.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m is None or m[1] != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m[2] or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m[3])
    return total


# == the three clients ==================================================================================


def kafka_python(d: Daemon, files: TlsFiles, user: str, password: str,
                 mechanism: str = "SCRAM-SHA-256", listener: str = "SASL_SSL", **kw: Any) -> Any:
    from kafka import KafkaAdminClient
    protocol = {"SASL_SSL": "SASL_SSL", "SASL_PLAINTEXT": "SASL_PLAINTEXT"}[listener]
    tls = {"ssl_cafile": str(files.ca.cert), "ssl_certfile": str(files.client.cert),
           "ssl_keyfile": str(files.client.key)} if listener == "SASL_SSL" else {}
    return KafkaAdminClient(bootstrap_servers=d.address(listener), security_protocol=protocol,
                            sasl_mechanism=mechanism, sasl_plain_username=user,
                            sasl_plain_password=password, request_timeout_ms=10_000, **tls, **kw)


def confluent(d: Daemon, files: TlsFiles, user: str, password: str,
              mechanism: str = "SCRAM-SHA-256", **extra: Any) -> Any:
    from confluent_kafka.admin import AdminClient
    return AdminClient({
        "bootstrap.servers": d.address("SASL_SSL"), "security.protocol": "SASL_SSL",
        "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
        "ssl.ca.location": str(files.ca.cert),
        "ssl.certificate.location": str(files.client.cert),
        "ssl.key.location": str(files.client.key), **extra})


def aiokafka_run(d: Daemon, files: TlsFiles, user: str, password: str, mechanism: str,
                 body: Callable[[Any], Any]) -> Any:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.helpers import create_ssl_context

    async def main() -> Any:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=d.address("SASL_SSL"), security_protocol="SASL_SSL",
            sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password,
            ssl_context=create_ssl_context(cafile=str(files.ca.cert),
                                           certfile=str(files.client.cert),
                                           keyfile=str(files.client.key)),
            request_timeout_ms=10_000)
        await admin.start()
        try:
            return await body(admin)
        finally:
            await admin.close()
    return asyncio.run(main())


def _groups_kafka_python(d: Daemon, files: TlsFiles, mechanism: str) -> list[str]:
    admin = kafka_python(d, files, "alice", USERS["alice"], mechanism)
    try:
        return sorted(g[0] if isinstance(g, tuple) else g["group_id"] for g in admin.list_groups())
    finally:
        admin.close()


def _groups_aiokafka(d: Daemon, files: TlsFiles, mechanism: str) -> list[str]:
    async def body(admin: Any) -> list[str]:
        return sorted(g[0] for g in await admin.list_consumer_groups())
    return aiokafka_run(d, files, "alice", USERS["alice"], mechanism, body)


def _groups_confluent(d: Daemon, files: TlsFiles, mechanism: str) -> list[str]:
    """librdkafka's ListConsumerGroups keeps only groups of protocol type "consumer" (or none),
    so it lists no connect group: the groups alice may describe, by DescribeConsumerGroups (whose
    answer librdkafka then refuses itself: "GroupId orders is not a consumer group (connect)",
    after the daemon answered; GROUP_AUTHORIZATION_FAILED when the daemon refused)."""
    from confluent_kafka import KafkaException
    admin = confluent(d, files, "alice", USERS["alice"], mechanism)  # (kept while it answers)
    result = admin.list_consumer_groups(request_timeout=10).result()
    assert not result.errors and not result.valid
    described = []
    for group, future in admin.describe_consumer_groups(list(GROUPS), request_timeout=10).items():
        try:
            future.result()
        except KafkaException as exc:
            if f"GroupId {group} is not a consumer group (connect)" not in str(exc):
                assert "GROUP_AUTHORIZATION_FAILED" in str(exc), exc
                continue
        described.append(group)
    return sorted(described)


CLIENTS = {"kafka-python": _groups_kafka_python, "aiokafka": _groups_aiokafka,
           "confluent-kafka": _groups_confluent}


# == the tests ==========================================================================================


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_clients_authenticate_with_scram_over_sasl_ssl(daemon: Daemon, tls_ca: TlsFiles,  # noqa: F811
                                                       client: str, mechanism: str) -> None:
    before = metric(daemon, "connect_coordinator_authentications_total", mechanism=mechanism,
                    result="success")
    # ListGroups without CLUSTER DESCRIBE: the groups alice may describe, not "secret".
    assert CLIENTS[client](daemon, tls_ca, mechanism) == ["orders", "payments"]
    assert metric(daemon, "connect_coordinator_authentications_total", mechanism=mechanism,
                  result="success") > before


def test_kafka_python_is_refused_with_a_wrong_password(daemon: Daemon, tls_ca: TlsFiles,  # noqa: F811
                                                       caplog: pytest.LogCaptureFixture) -> None:
    from kafka.errors import KafkaError
    before = metric(daemon, "connect_coordinator_authentications_total", result="failure")
    caplog.set_level(logging.DEBUG, logger="kafka")
    with pytest.raises(KafkaError):
        kafka_python(daemon, tls_ca, "alice", "wrong", "SCRAM-SHA-512", bootstrap_timeout_ms=3000)
    assert "Authentication failed during authentication due to invalid credentials with SASL " \
           "mechanism SCRAM-SHA-512" in caplog.text
    assert metric(daemon, "connect_coordinator_authentications_total", mechanism="SCRAM-SHA-512",
                  result="failure") > before


def test_aiokafka_is_refused_with_a_wrong_password(daemon: Daemon, tls_ca: TlsFiles,  # noqa: F811
                                                   caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka.errors import KafkaConnectionError
    caplog.set_level(logging.ERROR, logger="aiokafka")

    async def body(admin: Any) -> None:
        raise AssertionError("authenticated with a wrong password")
    with pytest.raises(KafkaConnectionError):
        aiokafka_run(daemon, tls_ca, "alice", "wrong", "SCRAM-SHA-256", body)
    assert "SaslAuthenticationFailed: Authentication failed during authentication due to " \
           "invalid credentials with SASL mechanism SCRAM-SHA-256" in caplog.text


def test_confluent_kafka_is_refused_with_a_wrong_password(daemon: Daemon, tls_ca: TlsFiles) -> None:  # noqa: F811
    from confluent_kafka import KafkaException
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
    logger = logging.getLogger("test.librdkafka")
    logger.addHandler(Capture())
    admin = confluent(daemon, tls_ca, "bob", "wrong", "SCRAM-SHA-512", logger=logger)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(0)  # (log lines are handed to the logger by poll)
    assert any("SASL authentication error: Authentication failed during authentication due to "
               "invalid credentials with SASL mechanism SCRAM-SHA-512" in line for line in lines)


def test_an_unauthorized_principal_gets_group_authorization_failed(daemon: Daemon,
                                                                  tls_ca: TlsFiles) -> None:  # noqa: F811
    from confluent_kafka import KafkaException
    from kafka.errors import GroupAuthorizationFailedError
    admin = kafka_python(daemon, tls_ca, "bob", USERS["bob"], "SCRAM-SHA-512")
    try:
        with pytest.raises(GroupAuthorizationFailedError, match="User:bob is not authorized"):
            admin.describe_groups(["orders"])
        assert admin.list_groups() == []
    finally:
        admin.close()
    bob = confluent(daemon, tls_ca, "bob", USERS["bob"])
    with pytest.raises(KafkaException, match="GROUP_AUTHORIZATION_FAILED"):
        bob.describe_consumer_groups(["orders"], request_timeout=10)["orders"].result()
    # alice may describe orders (READ implies DESCRIBE), not secret
    admin = kafka_python(daemon, tls_ca, "alice", USERS["alice"])
    try:
        assert admin.describe_groups(["orders"])["orders"]["error"] is None
        with pytest.raises(GroupAuthorizationFailedError):
            admin.describe_groups(["secret"])
    finally:
        admin.close()
    assert metric(daemon, "connect_coordinator_authorization_denied_total",
                  api="FindCoordinator", resource_type="GROUP") >= 3


def test_plain_is_refused_on_sasl_plaintext_and_works_over_sasl_ssl(daemon: Daemon,
                                                                    tls_ca: TlsFiles) -> None:  # noqa: F811
    from kafka.errors import KafkaError
    with pytest.raises(KafkaError):
        kafka_python(daemon, tls_ca, "alice", USERS["alice"], "PLAIN", listener="SASL_PLAINTEXT",
                     bootstrap_timeout_ms=3000)
    assert metric(daemon, "connect_coordinator_authentications_total", mechanism="PLAIN",
                  result="failure") >= 1
    admin = kafka_python(daemon, tls_ca, "alice", USERS["alice"], "PLAIN")
    try:
        assert sorted(g[0] if isinstance(g, tuple) else g["group_id"]
                      for g in admin.list_groups()) == ["orders", "payments"]
    finally:
        admin.close()
    # SCRAM is still fine on SASL_PLAINTEXT
    admin = kafka_python(daemon, tls_ca, "alice", USERS["alice"], listener="SASL_PLAINTEXT")
    admin.close()


def test_mutual_tls_principal(daemon: Daemon, tls_ca: TlsFiles) -> None:  # noqa: F811
    from kafka import KafkaAdminClient
    from kafka.errors import GroupAuthorizationFailedError
    admin = KafkaAdminClient(bootstrap_servers=daemon.address("SSL"), security_protocol="SSL",
                             ssl_cafile=str(tls_ca.ca.cert), ssl_certfile=str(tls_ca.client.cert),
                             ssl_keyfile=str(tls_ca.client.key), request_timeout_ms=10_000)
    try:
        # An ACL for User:OU=ops,CN=worker-1 allows DESCRIBE on orders, nothing else.
        assert admin.describe_groups(["orders"])["orders"]["error"] is None
        with pytest.raises(GroupAuthorizationFailedError, match=re.escape(WORKER_CERT_PRINCIPAL)):
            admin.describe_groups(["payments"])
    finally:
        admin.close()


def test_re_authentication_with_a_short_session(tmp_path: Path, tls_ca: TlsFiles) -> None:  # noqa: F811
    """connections.max.reauth.ms=1500: kafka-python and librdkafka re-authenticate on their
    connection and keep being served for three sessions and more; aiokafka 0.14 does not
    re-authenticate: its connection is closed at its first request after the session ended."""
    from aiokafka.errors import KafkaConnectionError
    d = _start(tmp_path, tls_ca, connections_max_reauth_ms="1500")
    try:
        admin = kafka_python(d, tls_ca, "alice", USERS["alice"], "SCRAM-SHA-512")
        try:
            ends = time.monotonic() + 5
            while time.monotonic() < ends:
                assert len(admin.list_groups()) == 2
                time.sleep(0.3)
        finally:
            admin.close()
        assert metric(d, "connect_coordinator_authentications_total", mechanism="SCRAM-SHA-512",
                      result="success", reauth="true") >= 2
        ck = confluent(d, tls_ca, "alice", USERS["alice"], "SCRAM-SHA-256")
        ends = time.monotonic() + 5
        while time.monotonic() < ends:
            assert 0 in ck.list_topics(timeout=10).brokers
            time.sleep(0.3)
        assert metric(d, "connect_coordinator_authentications_total", mechanism="SCRAM-SHA-256",
                      result="success", reauth="true") >= 2
        assert metric(d, "connect_coordinator_sasl_sessions_expired_total") == 0

        async def body(admin: Any) -> None:
            assert len(await admin.list_consumer_groups()) == 2
            await asyncio.sleep(2)
            with pytest.raises(KafkaConnectionError):
                await admin.list_consumer_groups()
        aiokafka_run(d, tls_ca, "alice", USERS["alice"], "SCRAM-SHA-256", body)
        assert metric(d, "connect_coordinator_sasl_sessions_expired_total") >= 1
    finally:
        d.stop()
