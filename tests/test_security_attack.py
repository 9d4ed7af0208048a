"""A hostile client against the SASL transport and the authorizer: what held.

An in-process daemon (tests/secure_server.py) with its *real* security state (the file store:
credentials appended offline before start, ACLs through the store as CreateAcls makes them),
``authorizer=acl``, a PLAINTEXT listener whose ANONYMOUS principal is the super user and a
SASL_PLAINTEXT one (``connections.max.reauth.ms`` short, so sessions end in a test):

* no request is served before or during authentication: pipelined right after SaslHandshake or
  in the middle of a SCRAM exchange it is answered ILLEGAL_SASL_STATE and the connection closed;
* a replayed SCRAM client-final, a tampered nonce and PLAIN with another authorization id fail;
* re-authentication cannot change the principal or the mechanism (the connection is closed); a
  session that ended is closed at its next request;
* a principal without DESCRIBE gets the same answer for a group that exists and one that does
  not (DescribeGroups, ConnectGroupDescribe, FindCoordinator), and ListGroups hides it;
* an ACL change is applied to the router's cached decisions at once (allow, then a PREFIXED
  DENY, then the DENY deleted);
* deleting a user's credential leaves its live session working until it re-authenticates (as
  Kafka), and the re-authentication then fails.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.list_groups.v4.request import ListGroupsRequest
from scramp import ScramClient

from connect_wire import client_security as cs
from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.framing import encode_request_frame
from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.security import sasl
from coordinator.security.model import AclBinding, AclBindingFilter, Authorizer
from coordinator.security.scram import credential_from_password
from coordinator.security.state import credential_record, credential_tombstone
from coordinator.security.store import append_offline
from coordinator.server import connection
from tests.daemon_fixture import ROOT, daemon_env, run_cli
from tests.secure_server import Closed, InProcess, Raw
from tests.tls_fixture import TlsFiles, tls_ca  # noqa: F401 (the fixture)

USERS = {"alice": "alice-pw", "bob": "bob-pw"}
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
REAUTH_MS = 1500


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcess]:
    append_offline(tmp_path / "data", [
        credential_record(u, credential_from_password(m, pw)) for u, pw in USERS.items()
        for m in MECHANISMS])
    with InProcess(tmp_path, {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "authorizer": "acl", "super.users": "User:ANONYMOUS",
            "connections.max.reauth.ms": REAUTH_MS}) as d:
        with Raw(d.address("PLAINTEXT")) as admin:
            for group in ("secret", "orders"):
                assert not admin.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0,
                                      ConnectGroupAlterConnectorsRequest(
                                          group_id=group, validate_only=False, deletes=(),
                                          upserts=(_alter.ConnectorSpec(
                                              name="c", task_count=1, config=()),))).error_code
        yield d


def _change(d: InProcess, create: list[AclBinding] = (), delete: list[AclBindingFilter] = (),
            records: list = ()) -> None:
    """A change through the real store, as CreateAcls / DeleteAcls / AlterUserScramCredentials."""
    state = d.server.security
    out = list(records)
    if create:
        out += state.create_acls(list(create))[1]
    if delete:
        out += state.delete_acls(list(delete))[1]

    async def apply() -> None:
        await d.server.security_service.store.apply(out)
    d.run(apply())


def _sasl(d: InProcess) -> Raw:
    return Raw(d.address("SASL_PLAINTEXT"))


def _frame(api_key: int, version: int, correlation: int, request: object) -> bytes:
    header = APIS[api_key].request_header_version(version)
    return encode_request_frame(api_key, version, correlation, "x", codec.encode(request), header)


def _describe_groups(c: Raw, *groups: str) -> dict[str, int]:
    r = c.call(ApiKey.DESCRIBE_GROUPS, 5, DescribeGroupsRequest(
        groups=groups, include_authorized_operations=False))
    return {g.group_id: int(g.error_code) for g in r.groups}


# == before and during authentication ===============================================================


def test_a_request_pipelined_after_sasl_handshake_is_refused_and_closes(daemon: InProcess) -> None:
    handshake = APIS[ApiKey.SASL_HANDSHAKE].request_class(1)(mechanism="SCRAM-SHA-256")
    with _sasl(daemon) as c:
        c.sock.sendall(_frame(ApiKey.SASL_HANDSHAKE, 1, 1, handshake)
                       + _frame(ApiKey.LIST_GROUPS, 4, 2, ListGroupsRequest(states_filter=())))
        assert not c.receive(ApiKey.SASL_HANDSHAKE, 1, 1).error_code
        refused = c.receive(ApiKey.LIST_GROUPS, 4, 2)
        assert refused.error_code == ErrorCode.ILLEGAL_SASL_STATE and not refused.groups
        assert c.closed()
    with _sasl(daemon) as c:  # before SaslHandshake: closed without an answer
        c.send(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=()))
        assert c.closed()


def test_a_request_in_the_middle_of_a_scram_exchange_is_refused(daemon: InProcess) -> None:
    with _sasl(daemon) as c:
        assert not c.handshake("SCRAM-SHA-256").error_code
        client = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
        assert not c.authenticate(client.get_client_first().encode()).error_code
        r = c.call(ApiKey.DESCRIBE_GROUPS, 5, DescribeGroupsRequest(
            groups=("secret",), include_authorized_operations=False))
        assert r.groups[0].error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert c.closed()


def test_a_replayed_client_final_and_a_tampered_nonce_fail(daemon: InProcess) -> None:
    with _sasl(daemon) as c:
        c.handshake("SCRAM-SHA-256")
        client = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
        first = client.get_client_first()
        client.set_server_first(c.authenticate(first.encode()).auth_bytes.decode())
        final = client.get_client_final()
        assert not c.authenticate(final.encode()).error_code
    with _sasl(daemon) as c:  # the same two messages on a new connection: a new server nonce
        c.handshake("SCRAM-SHA-256")
        assert not c.authenticate(first.encode()).error_code
        assert c.authenticate(final.encode()).error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert c.closed()
    with _sasl(daemon) as c:
        c.handshake("SCRAM-SHA-256")
        client = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
        client.set_server_first(c.authenticate(client.get_client_first().encode())
                                .auth_bytes.decode())
        parts = client.get_client_final().split(",")
        parts[1] = parts[1][:-2] + ("AA" if not parts[1].endswith("AA") else "BB")
        assert c.authenticate(",".join(parts).encode()).error_code == \
            ErrorCode.SASL_AUTHENTICATION_FAILED


def test_re_authentication_cannot_change_principal_or_mechanism(daemon: InProcess) -> None:
    with _sasl(daemon) as c:
        assert not c.scram("alice", "alice-pw").error_code
        assert c.session_lifetime_ms == REAUTH_MS
        r = c.scram("bob", "bob-pw")
        assert r.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "Cannot change principals" in r.error_message
        assert c.closed()
    with _sasl(daemon) as c:
        assert not c.scram("alice", "alice-pw").error_code
        r = c.handshake("SCRAM-SHA-512")
        assert r.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert list(r.mechanisms) == ["SCRAM-SHA-256"]
        assert c.closed()
    with _sasl(daemon) as c:  # the same principal and mechanism: the connection goes on
        assert not c.scram("alice", "alice-pw").error_code
        assert not c.scram("alice", "alice-pw").error_code
        assert not c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=())).error_code


def test_a_request_after_the_session_ended_closes_the_connection(daemon: InProcess) -> None:
    with _sasl(daemon) as c:
        assert not c.scram("alice", "alice-pw").error_code
        time.sleep(REAUTH_MS / 1000 + 0.2)
        with pytest.raises(Closed):
            c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=()))
    assert daemon.metric("connect_coordinator_sasl_sessions_expired_total") >= 1


# == authorization ================================================================================


def test_no_describe_reveals_nothing_about_which_groups_exist(daemon: InProcess) -> None:
    with _sasl(daemon) as c:
        assert not c.scram("bob", "bob-pw").error_code
        assert _describe_groups(c, "secret", "no-such-group") == {
            "secret": ErrorCode.GROUP_AUTHORIZATION_FAILED,
            "no-such-group": ErrorCode.GROUP_AUTHORIZATION_FAILED}
        described = c.call(ApiKey.CONNECT_GROUP_DESCRIBE, 0, ConnectGroupDescribeRequest(
            group_ids=("secret", "no-such-group")))
        answers = {g.group_id: (int(g.error_code), g.group_state, g.group_epoch)
                   for g in described.groups}
        assert answers["secret"][1:] == answers["no-such-group"][1:] == ("Dead", -1)
        assert {code for code, _, _ in answers.values()} == {ErrorCode.GROUP_AUTHORIZATION_FAILED}
        found = c.call(ApiKey.FIND_COORDINATOR, 4, FindCoordinatorRequest(
            key_type=0, coordinator_keys=("secret", "no-such-group")))
        assert [(int(k.error_code), k.node_id, k.host) for k in found.coordinators] == \
            [(ErrorCode.GROUP_AUTHORIZATION_FAILED, -1, "")] * 2
        listed = c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=()))
        assert not listed.error_code and not listed.groups


# ConnectGroupDescribe answered connector configs verbatim (password=...) to any principal that
# may DESCRIBE the group. Who may only look now sees secret-looking values as [hidden]; the
# group's workers (READ) and admins (ALTER) see them as written.
def test_secret_config_values_are_hidden_from_describe_only_principals(daemon: InProcess) -> None:
    config = (("connector.class", "x.Y"), ("connection.password", "hunter2"),
              ("sasl.jaas.config", "... password=\"p\";"), ("api.key", "k-123"),
              ("db.password", "${file:/run/secrets/db.properties:password}"),
              ("topic", "orders"))
    with Raw(daemon.address("PLAINTEXT")) as admin:
        assert not admin.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0,
                              ConnectGroupAlterConnectorsRequest(
                                  group_id="vault", validate_only=False, deletes=(),
                                  upserts=(_alter.ConnectorSpec(name="c", task_count=1, config=tuple(
                                      _alter.ConfigEntry(name=k, value=v) for k, v in config)),)
                              )).error_code

        # A member running the connector writes task configs: masked the same way.
        _write_task_configs(admin, "vault", "c", [dict(config)])

    def seen_by(user: str | None) -> dict[str, str | None]:
        with (_sasl(daemon) if user else Raw(daemon.address("PLAINTEXT"))) as c:
            if user:
                assert not c.scram(user, USERS[user]).error_code
            (g,) = c.call(ApiKey.CONNECT_GROUP_DESCRIBE, 0, ConnectGroupDescribeRequest(
                group_ids=("vault",))).groups
            assert not g.error_code, g.error_message
            (conn,) = g.connectors
            (task,) = conn.task_configs
            seen = {e.name: e.value for e in conn.config}
            assert {e.name: e.value for e in task.config} == seen
            return seen
    _change(daemon, create=[AclBinding.of("GROUP", "vault", "User:bob", "DESCRIBE"),
                            AclBinding.of("GROUP", "vault", "User:alice", "READ")])
    assert seen_by("bob") == {**dict(config), "connection.password": "[hidden]",
                              "sasl.jaas.config": "[hidden]", "api.key": "[hidden]"}
    assert seen_by("alice") == dict(config)  # a worker of the group runs the connector
    assert seen_by(None) == dict(config)  # the super user


def _write_task_configs(c: Raw, group: str, connector: str,
                        configs: list[dict[str, str | None]]) -> None:
    """Join ``group`` as its only member, take every item, write the connector's task configs."""
    from connect_wire.messages import (
        ConnectGroupHeartbeatRequest,
        ConnectGroupInstallAssignmentRequest,
        ConnectGroupPrepareAssignmentRequest,
        ConnectGroupWriteTaskConfigsRequest,
    )
    from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
    from connect_wire.messages import connect_group_write_task_configs_request_v0 as _wtc
    from tests.group_harness import assignor

    def join() -> Any:
        return c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, ConnectGroupHeartbeatRequest(
            group_id=group, member_id="m", member_epoch=0, rebalance_timeout_ms=10_000,
            client_assignors=(assignor(),), owned_connectors=(), owned_tasks=()))
    assert join().should_compute_assignment
    p = c.call(ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT, 0, ConnectGroupPrepareAssignmentRequest(
        group_id=group, member_id="m", member_epoch=0))
    assert not c.call(ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT, 0, ConnectGroupInstallAssignmentRequest(
        group_id=group, member_id="m", member_epoch=0, group_epoch=p.group_epoch, error=0,
        assignor_state=b"", scheduled_rebalance_delay_ms=-1, members=(_inst.MemberAssignment(
            member_id="m", connectors=tuple(s.name for s in p.connectors), tasks=tuple(
                _inst.TaskId(connector=s.name, task=t) for s in p.connectors
                for t in range(s.task_count)), metadata_version=0, metadata_bytes=b""),))).error_code
    r = join()
    assert connector in r.assignment.connectors, r
    done = c.call(ApiKey.CONNECT_GROUP_WRITE_TASK_CONFIGS, 0, ConnectGroupWriteTaskConfigsRequest(
        group_id=group, member_id="m", member_epoch=r.member_epoch, connector=connector,
        task_configs=tuple(_wtc.TaskConfig(config=tuple(
            _wtc.ConfigEntry(name=k, value=v) for k, v in t.items())) for t in configs)))
    assert (done.error_code, done.changed) == (0, True), done


def test_acl_changes_reach_cached_decisions_at_once(daemon: InProcess) -> None:
    allow = AclBinding.of("GROUP", "orders", "User:alice", "READ")
    deny = AclBinding.of("GROUP", "ord", "User:*", "ALL", "DENY", pattern_type="PREFIXED")
    with _sasl(daemon) as c:
        assert not c.scram("alice", "alice-pw").error_code
        assert _describe_groups(c, "orders") == {"orders": ErrorCode.GROUP_AUTHORIZATION_FAILED}
        _change(daemon, create=[allow])  # READ implies DESCRIBE
        assert _describe_groups(c, "orders") == {"orders": 0}
        assert _describe_groups(c, "orders") == {"orders": 0}  # (now cached)
        _change(daemon, create=[deny])  # a PREFIXED DENY for everyone wins
        assert _describe_groups(c, "orders") == {"orders": ErrorCode.GROUP_AUTHORIZATION_FAILED}
        _change(daemon, delete=[AclBindingFilter()])
        _change(daemon, create=[allow])
        assert _describe_groups(c, "orders") == {"orders": 0}


def test_a_deleted_credential_ends_the_session_only_at_re_authentication(
        daemon: InProcess) -> None:
    """As Kafka: deleting a credential does not close live connections; the next
    re-authentication (KIP-368) fails and closes it."""
    with _sasl(daemon) as c:
        assert not c.scram("bob", "bob-pw").error_code
        _change(daemon, records=[credential_tombstone("bob", m) for m in MECHANISMS])
        assert not c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=())).error_code
        r = c.scram("bob", "bob-pw")
        assert r.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert c.closed()


# -- found by the issue 13 review, fixed --------------------------------------------------------
@pytest.fixture
def plain_daemon(tmp_path: Path) -> Iterator[InProcess]:
    append_offline(tmp_path / "data", [
        credential_record("alice", credential_from_password(m, "alice-pw")) for m in MECHANISMS])
    with InProcess(tmp_path, {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,PLAIN", "sasl.plain.allow.insecure": True,
            "log.fsync": "always"}) as d:
        yield d


# PLAIN's PBKDF2 ran on the loop's default executor, shared with every partition's fsync
# (shard.py: asyncio.to_thread(self.log.sync)), unbounded, and a job whose client had gone was
# still run (reading is paused while it waits, so the FIN is not seen). Unauthenticated clients
# that send SaslHandshake(PLAIN) + SaslAuthenticate and close at once delayed every group write.
# (The derivation is made slow here to keep the test short and deterministic.)
def test_plain_derivations_of_gone_clients_do_not_hold_up_group_writes(
        plain_daemon: InProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[float] = []
    real_finish = sasl.PlainServer.finish

    def slow_finish(self: sasl.PlainServer) -> bytes:
        ran.append(time.monotonic())
        time.sleep(0.5)  # a 16384-iteration SHA-512 derivation on a busy machine, x25
        return real_finish(self)
    monkeypatch.setattr(sasl.PlainServer, "finish", slow_finish)
    hs = APIS[ApiKey.SASL_HANDSHAKE].request_class(1)(mechanism="PLAIN")
    au = APIS[ApiKey.SASL_AUTHENTICATE].request_class(2)(auth_bytes=b"\0nobody\0x")
    burst = (encode_request_frame(ApiKey.SASL_HANDSHAKE, 1, 1, "x", codec.encode(hs), 1)
             + encode_request_frame(ApiKey.SASL_AUTHENTICATE, 2, 2, "x", codec.encode(au), 2))
    for _ in range(40):  # 40 hostile clients, each gone right after sending
        s = socket.create_connection(plain_daemon.address("SASL_PLAINTEXT"))
        s.sendall(burst)
        s.close()
    time.sleep(0.2)
    started = time.monotonic()
    with Raw(plain_daemon.address("PLAINTEXT"), timeout=60) as c:
        r = c.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0, ConnectGroupAlterConnectorsRequest(
            group_id="g", validate_only=False, deletes=(),
            upserts=(_alter.ConnectorSpec(name="c", task_count=1, config=()),)))
    took = time.monotonic() - started
    assert not r.error_code
    assert took < 1.0, f"a group write took {took:.1f} s behind the PLAIN derivations"
    time.sleep(1.0)
    assert len(ran) < 40, "every gone client's derivation still ran"


def _server_first(d: InProcess, user: str) -> dict[str, str]:
    with Raw(d.address("SASL_PLAINTEXT")) as c:
        c.handshake("SCRAM-SHA-256")
        r = c.authenticate(ScramClient(["SCRAM-SHA-256"], user, "x").get_client_first().encode())
        return dict(p.split("=", 1) for p in r.auth_bytes.decode().split(","))


# The made-up credential of an unknown user had a 16-byte salt, a real one (users add, online
# or offline) 32 bytes: the server-first message told which user names exist.
def test_server_first_does_not_tell_which_users_exist(plain_daemon: InProcess) -> None:
    known, unknown = _server_first(plain_daemon, "alice"), _server_first(plain_daemon, "mallory")
    assert len(base64.b64decode(known["s"])) == len(base64.b64decode(unknown["s"]))
    assert known["i"] == unknown["i"]
    assert unknown == {**_server_first(plain_daemon, "mallory"), "r": unknown["r"]}  # stable


# Host ACLs matched the client's address by string; Python writes ::1, Kafka (Java's
# getHostAddress) 0:0:0:0:0:0:0:1. A DENY written as Kafka writes it never applied.
def test_an_ipv6_host_acl_matches_whatever_the_spelling() -> None:
    a = Authorizer(acls=[
        AclBinding.of("GROUP", "g", "User:*", "READ"),
        AclBinding.of("GROUP", "g", "User:bob", "ALL", "DENY", host="0:0:0:0:0:0:0:1"),
        AclBinding.of("GROUP", "g", "User:carol", "ALL", "DENY", host="10.0.0.1")])
    assert not a.authorize("User:bob", "::1", "READ", "GROUP", "g")
    assert a.authorize("User:bob", "127.0.0.1", "READ", "GROUP", "g")
    assert not a.authorize("User:carol", "::ffff:10.0.0.1", "READ", "GROUP", "g")
    assert a.authorize("User:carol", "10.0.0.2", "READ", "GROUP", "g")


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


# Connections that never finished their TLS handshake, or never authenticated, were held until
# socket.idle.timeout.ms (10 min): ssl.handshake.timeout.ms and sasl.authentication.timeout.ms.
def test_silent_tls_and_unauthenticated_sasl_connections_are_closed(
        tmp_path: Path, tls_ca: TlsFiles) -> None:  # noqa: F811
    append_offline(tmp_path / "data", [
        credential_record("alice", credential_from_password("SCRAM-SHA-256", "alice-pw"))])
    with InProcess(tmp_path, {
            "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "ssl.certfile": str(tls_ca.server.cert), "ssl.keyfile": str(tls_ca.server.key),
            "ssl.handshake.timeout.ms": 300, "sasl.authentication.timeout.ms": 300}) as d:
        plain = socket.create_connection(d.address("PLAINTEXT"))
        tls = socket.create_connection(d.address("SSL"))
        sasl_ = socket.create_connection(d.address("SASL_PLAINTEXT"))
        authenticated = _scram_login(d)
        try:
            assert _closed_within(tls, 5.0)
            assert _closed_within(sasl_, 5.0)
            assert not _closed_within(plain, 0.3)
            assert authenticated.api_versions().error_code == 0
        finally:
            for s in (plain, tls, sasl_):
                s.close()
            authenticated.close()


def _scram_login(d: InProcess) -> Raw:
    c = Raw(d.address("SASL_PLAINTEXT"))
    c.handshake("SCRAM-SHA-256")
    client = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
    r = c.authenticate(client.get_client_first().encode())
    client.set_server_first(r.auth_bytes.decode())
    r = c.authenticate(client.get_client_final().encode())
    client.set_server_final(r.auth_bytes.decode())
    time.sleep(0.6)  # past sasl.authentication.timeout.ms: authenticated, kept
    return c


# -- found by the issue 19 trial, fixed ---------------------------------------------------------
def _slow_plain_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str,
                       seconds: float, ran: list[str], overrides: dict[str, object]) -> InProcess:
    """A daemon offering PLAIN only, ``user``'s password ``<user>-pw``, whose password
    derivations take ``seconds`` longer (their users appended to ``ran``)."""
    real_finish = sasl.PlainServer.finish

    def slow_finish(self: sasl.PlainServer) -> bytes:
        ran.append(self.user or "")
        time.sleep(seconds)
        return real_finish(self)
    monkeypatch.setattr(sasl.PlainServer, "finish", slow_finish)
    append_offline(tmp_path / "data", [
        credential_record(user, credential_from_password(m, f"{user}-pw")) for m in MECHANISMS])
    return InProcess(tmp_path, {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN", "sasl.plain.allow.insecure": True, **overrides})


def _plain_burst(token: bytes) -> bytes:
    """SaslHandshake(PLAIN) and SaslAuthenticate(token) in one write, as a flooding client."""
    hs = APIS[ApiKey.SASL_HANDSHAKE].request_class(1)(mechanism="PLAIN")
    au = APIS[ApiKey.SASL_AUTHENTICATE].request_class(2)(auth_bytes=token)
    return (encode_request_frame(ApiKey.SASL_HANDSHAKE, 1, 1, "x", codec.encode(hs), 1)
            + encode_request_frame(ApiKey.SASL_AUTHENTICATE, 2, 2, "x", codec.encode(au), 2))


def _flood(address: tuple[str, int], stop: threading.Event, seen: list[str]) -> None:
    """One unauthenticated client: PLAIN with a made-up user, again and again until ``stop``."""
    burst = _plain_burst(b"\0mallory\0guess")
    while not stop.is_set():
        try:
            with socket.create_connection(address, timeout=10) as s:
                s.sendall(burst)
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
                frames, at = 0, 0
                while at + 4 <= len(got):
                    frames += 1
                    at += 4 + int.from_bytes(got[at:at + 4], "big")
                # The handshake is always answered; a throttled authentication is not.
                seen.append("too many" if b"too many" in got else
                            "answered" if frames == 2 else "closed")
        except OSError:
            seen.append("error")


# A flood of unauthenticated PLAIN clients kept the 16-slot derivation queue full: legitimate
# logins were answered SASL_AUTHENTICATION_FAILED ("too many PLAIN authentications in
# progress"), which clients take as a wrong password: connect-worker exited 4 (do not restart),
# the admin CLI exited 1. A busy server now closes the connection unanswered (after the failed
# authentication delay, as Kafka throttles) and both clients connect again with backoff.
def test_a_plain_flood_does_not_lock_out_a_real_worker_or_the_cli(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (a busy machine: the queue fills with fewer attackers)
    with _slow_plain_daemon(tmp_path, monkeypatch, "worker", 0.05, [], {
            "connection.failed.authentication.delay.ms": 50,
            "group.connect.session.timeout.ms": 10_000}) as d:
        sasl_at = "{}:{}".format(*d.address("SASL_PLAINTEXT"))
        plain_at = "{}:{}".format(*d.address("PLAINTEXT"))
        stop, seen = threading.Event(), []
        flooders = [threading.Thread(target=_flood, args=(d.address("SASL_PLAINTEXT"), stop, seen),
                                     daemon=True) for _ in range(32)]
        for t in flooders:
            t.start()
        creds = ("--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN",
                 "--sasl-username", "worker")
        log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", sasl_at, "--group",
             "g", "--instance-id", "w1", *creds],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, text=True,
            env={**daemon_env(), cs.PASSWORD_ENV: "worker-pw"}, cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            while d.metric("connect_coordinator_sasl_plain_refused_total") < 10:
                assert time.monotonic() < deadline, Counter(seen)
                time.sleep(0.05)  # the flood is on: the queue is full
            # The admin CLI gets in (the flood still on).
            listed = subprocess.run(
                [sys.executable, "-m", "coordinator.cli", "groups", "list", "--bootstrap",
                 sasl_at, *creds], capture_output=True, text=True, timeout=60, cwd=ROOT,
                env={**daemon_env(), cs.PASSWORD_ENV: "worker-pw"})
            assert listed.returncode == 0, listed.stderr
            # The worker gets in and joins (the flood still on).
            deadline = time.monotonic() + 60
            while True:
                described = run_cli("groups", "describe", "g", "--json", "--bootstrap", plain_at)
                if described.returncode == 0 and [
                        m["instance_id"] for g in json.loads(described.stdout)
                        for m in g["members"]] == ["w1"]:
                    break
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-2000:]
                time.sleep(0.2)
            refused_during = d.metric("connect_coordinator_sasl_plain_refused_total")
        finally:
            stop.set()
            for t in flooders:
                t.join(15)
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(30)
            log.close()
        assert code == 0, (tmp_path / "worker.log").read_text()[-2000:]
        assert refused_during >= 10
        # The flood's clients were throttled (closed unanswered), never told a wrong password
        # for a busy server; their own bad password is answered as such.
        assert "too many" not in seen and {"closed", "answered"} <= set(seen), Counter(seen)
        # No asyncio error (a "Future exception was never retrieved" of a gone client's step).
        gc.collect()
        d.run(asyncio.sleep(0.1))
        assert d.errors == []


# PLAIN derivations still waiting when sasl.authentication.timeout.ms closed their connections
# (a flood keeps the queue long): each one then ran, raised (the gone-client check, or the wrong
# password), and its future's exception was never retrieved since the connection was lost:
# asyncio logged a multi-line traceback per client. And the gone-client check on a socket
# asyncio had closed (fd -1) raised (ValueError 'negative file descriptor' on some Pythons, an
# OSError here) instead of saying "gone", so the derivation ran for nobody.
def test_plain_steps_of_timed_out_connections_leave_no_asyncio_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    with _slow_plain_daemon(tmp_path, monkeypatch, "alice", 0.3, ran,
                            {"sasl.authentication.timeout.ms": 200}) as d:
        burst = _plain_burst(b"\0alice\0wrong")
        clients = [socket.create_connection(d.address("SASL_PLAINTEXT")) for _ in range(10)]
        for s in clients:
            s.sendall(burst)
        deadline = time.monotonic() + 20
        while (d.server.plain_pending or not ran) and time.monotonic() < deadline:
            time.sleep(0.05)
        for s in clients:
            s.close()
        time.sleep(0.2)
        gc.collect()
        d.run(asyncio.sleep(0.1))
        assert [c.get("message") for c in d.errors] == []
        # The connections timed out while their derivations waited: those were not run.
        assert len(ran) < 10, ran
    closed = socket.socket()
    closed.close()
    assert connection._peer_gone(closed)


# 45,000 ACLs and one DeleteAcls of 300 filters naming groups without ACLs (5.6 KB) held the
# event loop 18 s (every filter against every ACL): another group's member lost its session.
# Measured here as the loop's lag while the request runs (a ticker on the daemon's loop).
def test_a_small_delete_acls_does_not_freeze_the_daemon(daemon: InProcess) -> None:
    state = daemon.server.security
    records = state.create_acls([AclBinding.of("GROUP", f"g{i}", f"User:u{i % 97}", "READ")
                                 for i in range(45_000)])[1]

    async def load() -> None:
        await daemon.server.security_service.store.apply(records)
    daemon.run(load(), timeout=120)
    assert len(state.authorizer) == 45_000
    lags: list[float] = []
    done = threading.Event()

    async def ticker() -> None:
        while not done.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)
    ticking = asyncio.run_coroutine_threadsafe(ticker(), daemon.loop)
    request_cls = APIS[ApiKey.DELETE_ACLS].request_class(3)
    import importlib
    f = importlib.import_module(request_cls.__module__).DeleteAclsFilter
    filters = tuple(f(resource_type_filter=3, resource_name_filter=f"none-{i:05d}",
                      pattern_type_filter=3, principal_filter=None, host_filter=None,
                      operation=1, permission_type=1) for i in range(300))
    try:
        with Raw(daemon.address("PLAINTEXT"), timeout=120) as admin:
            time.sleep(0.1)
            r = admin.call(ApiKey.DELETE_ACLS, 3, request_cls(filters=filters))
            time.sleep(0.1)
    finally:
        done.set()
        ticking.result(10)
    assert [(int(x.error_code), list(x.matching_acls)) for x in r.filter_results] == \
        [(0, [])] * 300
    assert len(state.authorizer) == 45_000
    # Before: one lag of ~18 s. A session (10 s by default) is never in danger now.
    assert max(lags) < 1.0, max(lags)
