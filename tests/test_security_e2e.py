"""Issue 13 items 3-4 end to end: real daemons, the ``users`` / ``acls`` CLI, Kafka's admin
client (kafka-python) on the five APIs, the file store across restarts and a crash, two nodes on
etcd sharing credentials and ACLs, CLUSTER ALTER / DESCRIBE with ``authorizer=acl``.

A PLAINTEXT listener without an authorizer (the default, ``authorizer=none``) lets anyone
manage users and ACLs, as a Kafka broker without ``authorizer.class.name`` lets anyone do
anything; with ``authorizer=acl`` the ANONYMOUS principal of a PLAINTEXT listener needs
``super.users=User:ANONYMOUS``, ``allow.everyone.if.no.acl.found`` (while the cluster has no
ACL) or an ACL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.security.scram import credential_from_password
from coordinator.security.store import read_offline
from tests.daemon_fixture import Daemon, DaemonPool, run_cli
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def cli(*args: str, ok: bool = True) -> str:
    done = run_cli(*args)
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout
    assert done.returncode != 0, done.stdout
    return done.stderr


def users(d: Daemon) -> dict[str, list[tuple[str, int]]]:
    rows = json.loads(cli("users", "list", "--bootstrap", d.bootstrap, "--json"))
    return {r["user"]: [(c["mechanism"], c["iterations"]) for c in r["credentials"]] for r in rows}


def acls(d: Daemon, *extra: str) -> list[tuple[str, ...]]:
    rows = json.loads(cli("acls", "list", "--bootstrap", d.bootstrap, "--json", *extra))
    return sorted((r["resource_type"], r["pattern_type"], r["name"], r["principal"], r["host"],
                   r["operation"], r["permission"]) for r in rows)


def test_offline_bootstrap_online_cli_and_restarts(tmp_path: Path, pool: DaemonPool) -> None:
    data = tmp_path / "data"
    pw = tmp_path / "pw"
    pw.write_text("s3cret pass\n")
    out = cli("users", "add", "--data-dir", str(data), "admin", "--mechanism", "SCRAM-SHA-512",
              "--password-file", str(pw), "--iterations", "8192")
    assert "admin" in out and "added" in out
    d = pool.start(data)
    # the daemon holds the data dir: the offline path refuses, naming it
    err = cli("users", "add", "--data-dir", str(data), "late", "--password-file", str(pw), ok=False)
    assert "in use by another connect-coordinator" in err and "--bootstrap" in err
    assert users(d) == {"admin": [("SCRAM-SHA-512", 8192)]}

    # online: salted here, StoredKey/ServerKey computed by the daemon
    cli("users", "add", "--bootstrap", d.bootstrap, "bob", "--password-file", str(pw))
    cli("users", "add", "--bootstrap", d.bootstrap, "bob", "--mechanism", "SCRAM-SHA-512",
        "--password-file", str(pw))
    cli("users", "delete", "--bootstrap", d.bootstrap, "bob", "--mechanism", "SCRAM-SHA-256")
    err = cli("users", "delete", "--bootstrap", d.bootstrap, "bob", "--mechanism", "SCRAM-SHA-256",
              ok=False)
    assert "RESOURCE_NOT_FOUND" in err
    err = cli("users", "list", "--bootstrap", d.bootstrap, "nobody", ok=False)
    assert "RESOURCE_NOT_FOUND" in err
    assert users(d) == {"admin": [("SCRAM-SHA-512", 8192)], "bob": [("SCRAM-SHA-512", 4096)]}

    out = cli("acls", "add", "--bootstrap", d.bootstrap, "--allow-principal", "User:w",
              "--operation", "Read", "--operation", "Describe", "--group", "orders")
    assert out.count("added:") == 2
    cli("acls", "add", "--bootstrap", d.bootstrap, "--allow-principal", "User:ops",
        "--operation", "Alter", "--group", "team-", "--resource-pattern-type", "prefixed")
    cli("acls", "add", "--bootstrap", d.bootstrap, "--deny-principal", "User:w",
        "--deny-host", "10.0.0.9", "--operation", "All", "--group", "orders")
    err = cli("acls", "add", "--bootstrap", d.bootstrap, "--allow-principal", "User:x",
              "--operation", "Read", "--group", "", ok=False)
    assert "INVALID_REQUEST" in err and "empty" in err
    expected = [
        ("GROUP", "LITERAL", "orders", "User:w", "*", "DESCRIBE", "ALLOW"),
        ("GROUP", "LITERAL", "orders", "User:w", "*", "READ", "ALLOW"),
        ("GROUP", "LITERAL", "orders", "User:w", "10.0.0.9", "ALL", "DENY"),
        ("GROUP", "PREFIXED", "team-", "User:ops", "*", "ALTER", "ALLOW"),
    ]
    assert acls(d) == expected
    assert acls(d, "--group", "team-orders", "--resource-pattern-type", "match") == expected[3:]
    assert acls(d, "--principal", "User:ops") == expected[3:]
    out = cli("acls", "delete", "--bootstrap", d.bootstrap, "--group", "orders",
              "--allow-principal", "User:w", "--operation", "Describe")
    assert out.count("deleted:") == 1
    expected.pop(0)
    assert acls(d) == expected

    # a clean restart, then a crash right after a change: everything acknowledged is there
    d.stop()
    d = pool.start(data)
    assert acls(d) == expected
    assert set(users(d)) == {"admin", "bob"}
    cli("acls", "add", "--bootstrap", d.bootstrap, "--allow-principal", "User:admin",
        "--operation", "Alter", "--cluster")
    d.kill()
    d = pool.start(data)
    assert ("CLUSTER", "LITERAL", "kafka-cluster", "User:admin", "*", "ALTER", "ALLOW") in acls(d)
    d.stop()

    # what is stored is salt, StoredKey, ServerKey and iterations, computed as Kafka does
    state = read_offline(data)
    bob = state.scram_credential("bob", "SCRAM-SHA-512")
    assert bob is not None
    assert bob == credential_from_password("SCRAM-SHA-512", "s3cret pass", 4096, bob.salt)
    assert b"s3cret" not in b"".join(p.read_bytes() for p in (data / "security").glob("*.log"))


def test_kafka_python_admin_client(pool: DaemonPool) -> None:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.admin._users import (
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )
    from kafka.errors import NoError

    d = pool.start()
    admin = KafkaAdminClient(bootstrap_servers=d.bootstrap, request_timeout_ms=10_000)
    try:
        read = ACL("User:worker", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                   ResourcePattern(ResourceType.GROUP, "orders"))
        alter = ACL("User:ops", "*", ACLOperation.ALTER, ACLPermissionType.ALLOW,
                    ResourcePattern(ResourceType.GROUP, "team-", ACLResourcePatternType.PREFIXED))
        created = admin.create_acls([read, alter])
        assert created["succeeded"] == [read, alter] and not created["failed"]
        everything = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                               ResourcePatternFilter(ResourceType.ANY, None,
                                                     ACLResourcePatternType.ANY))
        found, error = admin.describe_acls(everything)
        assert error is NoError
        assert sorted(found, key=repr) == sorted([read, alter], key=repr)
        matching, _ = admin.describe_acls(ACLFilter(
            None, None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(ResourceType.GROUP, "team-x", ACLResourcePatternType.MATCH)))
        assert matching == [alter]
        [(_, deleted, err)] = admin.delete_acls([ACLFilter(
            "User:worker", None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(ResourceType.GROUP, "orders", ACLResourcePatternType.LITERAL))])
        assert deleted == [read]
        assert admin.describe_acls(everything)[0] == [alter]

        result = admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion("alice", ScramMechanism.SCRAM_SHA_256, "pw"),
            UserScramCredentialUpsertion("carol", ScramMechanism.SCRAM_SHA_512, "pw",
                                         iterations=100),
        ])
        assert result["alice"] is None and "iterations" in result["carol"]
        described = admin.describe_user_scram_credentials()
        assert list(described) == ["alice"]
        assert described["alice"]["credential_infos"] == [
            {"mechanism": ScramMechanism.SCRAM_SHA_256, "iterations": 4096}]
        result = admin.alter_user_scram_credentials([
            UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_256)])
        assert result == {"alice": None}
        assert admin.describe_user_scram_credentials() == {}
    finally:
        admin.close()


def test_cluster_permission_with_authorizer_acl(tmp_path: Path, pool: DaemonPool) -> None:
    env = {"CONNECT_COORDINATOR_AUTHORIZER": "acl"}
    d = pool.start(tmp_path / "a", extra_env=env)
    for args in (("acls", "list"), ("users", "list"),
                 ("acls", "add", "--allow-principal", "User:x", "--operation", "Read",
                  "--group", "g")):
        err = cli(*args, "--bootstrap", d.bootstrap, ok=False)
        assert "CLUSTER_AUTHORIZATION_FAILED" in err and "User:ANONYMOUS" in err, err
    d.stop()
    # a super user may; so may everyone while no ACL is on the cluster (allow.everyone...)
    d = pool.start(tmp_path / "a", extra_env={
        **env, "CONNECT_COORDINATOR_SUPER_USERS": "User:admin;User:ANONYMOUS"})
    assert acls(d) == []
    d.stop()
    d = pool.start(tmp_path / "a", extra_env={
        **env, "CONNECT_COORDINATOR_ALLOW_EVERYONE_IF_NO_ACL_FOUND": "true"})
    cli("acls", "add", "--bootstrap", d.bootstrap, "--allow-principal", "User:admin",
        "--operation", "Alter", "--cluster")
    # now an ACL is on the cluster, and none allows ANONYMOUS to describe it
    err = cli("acls", "list", "--bootstrap", d.bootstrap, ok=False)
    assert "CLUSTER_AUTHORIZATION_FAILED" in err


def test_two_nodes_on_etcd_share_users_and_acls(tmp_path: Path, pool: DaemonPool,
                                                etcd_endpoint: str) -> None:  # noqa: F811
    prefix = f"/sec-{time.monotonic_ns()}"
    pw = tmp_path / "pw"
    pw.write_text("pw")
    # offline, into etcd, before any node runs
    cli("users", "add", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", prefix, "boot",
        "--password-file", str(pw))

    def node(i: int) -> Daemon:
        return pool.start(tmp_path / f"node{i}", extra_args=[
            "--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", prefix,
            "--node-id", str(i), "--partitions", "2"])

    a, b = node(1), node(2)
    assert users(a) == users(b) == {"boot": [("SCRAM-SHA-256", 4096)]}
    cli("users", "add", "--bootstrap", a.bootstrap, "alice", "--mechanism", "SCRAM-SHA-512",
        "--password-file", str(pw))
    cli("acls", "add", "--bootstrap", b.bootstrap, "--allow-principal", "User:alice",
        "--operation", "Read", "--group", "g")

    def both(check: object, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                assert check()  # type: ignore[operator]
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # each change shows at the other node through its watch (the answering one at once)
    assert "alice" in users(a)
    both(lambda: "alice" in users(b))
    acl = ("GROUP", "LITERAL", "g", "User:alice", "*", "READ", "ALLOW")
    assert acls(b) == [acl]
    both(lambda: acls(a) == [acl])
    cli("users", "delete", "--bootstrap", b.bootstrap, "boot", "--mechanism", "SCRAM-SHA-256")
    both(lambda: "boot" not in users(a))
    # a node started later loads what etcd holds
    a.stop()
    a = node(1)
    assert set(users(a)) == {"alice"} and acls(a) == [acl]


def test_users_authenticate_with_scram_and_acls_decide(tmp_path: Path) -> None:
    """The credentials and ACLs of this state behind the transport's SASL: an administrator
    added offline authenticates with SCRAM-SHA-512 (kafka-python) and, as a super user, adds a
    user and ACLs online; that user authenticates with SCRAM-SHA-256 and is refused the
    cluster's management (CLUSTER_AUTHORIZATION_FAILED) until an ACL allows it."""
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.admin._users import ScramMechanism, UserScramCredentialUpsertion
    from kafka.errors import ClusterAuthorizationFailedError

    from coordinator.security.state import credential_record as record
    from coordinator.security.store import append_offline
    from tests.secure_server import InProcess

    data = tmp_path / "data"
    append_offline(data, [record("admin", credential_from_password("SCRAM-SHA-512", "adm"))])
    overrides = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizer": "acl",
                 "super.users": "User:admin"}

    def admin_as(address: tuple[str, int], user: str, password: str,
                 mechanism: str) -> KafkaAdminClient:
        return KafkaAdminClient(
            bootstrap_servers=f"{address[0]}:{address[1]}", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password,
            request_timeout_ms=10_000)

    with InProcess(tmp_path, overrides) as d:
        address = d.address()
        admin = admin_as(address, "admin", "adm", "SCRAM-SHA-512")
        try:
            assert admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                "bob", ScramMechanism.SCRAM_SHA_256, "bob-pw")]) == {"bob": None}
            read = ACL("User:bob", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                       ResourcePattern(ResourceType.GROUP, "g"))
            assert admin.create_acls([read])["succeeded"] == [read]
        finally:
            admin.close()
        bob = admin_as(address, "bob", "bob-pw", "SCRAM-SHA-256")
        try:
            everything = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                   ResourcePatternFilter(ResourceType.ANY, None,
                                                         ACLResourcePatternType.ANY))
            with pytest.raises(ClusterAuthorizationFailedError, match="User:bob"):
                bob.describe_acls(everything)
            assert bob.create_acls([read])["failed"] == [ClusterAuthorizationFailedError]
            for api in ("DescribeAcls", "CreateAcls"):  # counted
                assert d.metric("connect_coordinator_authorization_denied_total", api=api,
                                resource_type="CLUSTER") == 1
            d.run(_allow_describe(d))  # an ACL made through the store, as the API makes it
            described = ACL("User:bob", "*", ACLOperation.DESCRIBE, ACLPermissionType.ALLOW,
                            ResourcePattern(ResourceType.CLUSTER, "kafka-cluster"))
            found, _ = bob.describe_acls(everything)
            assert sorted(found, key=repr) == sorted([read, described], key=repr)
            # DESCRIBE is not ALTER
            assert bob.create_acls([read])["failed"] == [ClusterAuthorizationFailedError]
        finally:
            bob.close()


async def _allow_describe(d: object) -> None:
    from coordinator.security.model import AclBinding

    service = d.server.security_service  # type: ignore[attr-defined]
    _, records = service.state.create_acls(
        [AclBinding.of("CLUSTER", "kafka-cluster", "User:bob", "DESCRIBE")])
    await service.store.apply(records)
