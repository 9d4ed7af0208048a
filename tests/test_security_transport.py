"""The daemon's listeners, TLS and SASL as Kafka's SaslServerAuthenticator (issue 13 items 1-2),
step by step over real sockets against an in-process server (tests/secure_server.py), and the
authorization of every group API (item 4's enforcement).

Real Kafka clients against a real daemon process: tests/test_security_clients.py.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindV3
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest as FindV4
from kio.schema.list_groups.v4.request import ListGroupsRequest
from kio.schema.metadata.v12.request import MetadataRequest

from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from coordinator import config
from coordinator.group.config import ConfigError
from coordinator.security import tls
from tests.secure_server import Closed, InProcess, MemorySecurity, Raw
from tests.tls_fixture import TlsFiles, make_ca, tls_ca  # noqa: F401 (the fixture)

ALICE = ("alice", "alice-secret")


def _security() -> MemorySecurity:
    s = MemorySecurity(super_users=["User:admin"])
    s.add_user(*ALICE)
    s.add_user("bob", "bob-secret", mechanisms=["SCRAM-SHA-512"])
    s.add_user("admin", "admin-secret")
    return s


def _tls_settings(files: TlsFiles, client_auth: str = "none") -> dict[str, str]:
    return {"ssl.certfile": str(files.server.cert), "ssl.keyfile": str(files.server.key),
            "ssl.cafile": str(files.ca.cert), "ssl.client.auth": client_auth}


def _client_tls(files: TlsFiles, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(files.ca.cert))
    if cert:
        ctx.load_cert_chain(files.client.cert, files.client.key)
    return ctx


@pytest.fixture
def sasl(tmp_path: Path) -> Iterator[InProcess]:
    with InProcess(tmp_path, {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "connection.failed.authentication.delay.ms": 150}, _security()) as d:
        yield d


def _list_groups(c: Raw) -> object:
    return c.call(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=()))


# == listeners and their settings ======================================================================


def test_a_bare_listener_is_plaintext_and_the_quick_start_is_unchanged() -> None:
    c = config.load(None, {"listeners": "127.0.0.1:9092"}, environ={})
    assert [(ln.name, ln.protocol) for ln in c.listeners] == [("PLAINTEXT", "PLAINTEXT")]
    assert c.listen == ("127.0.0.1", 9092)
    assert config.load(environ={})["authorizer"] == "none"


def test_several_listeners_and_advertised_addresses_per_listener() -> None:
    c = config.load(None, {
        "listeners": "INTERNAL://127.0.0.1:9092,EXTERNAL://:9094",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
        "advertised.listeners": "EXTERNAL://coordinator.example:19094"}, environ={})
    assert [(ln.name, ln.protocol, ln.host, ln.port) for ln in c.listeners] == [
        ("INTERNAL", "PLAINTEXT", "127.0.0.1", 9092), ("EXTERNAL", "SASL_PLAINTEXT", "0.0.0.0", 9094)]
    assert c.advertised == {"EXTERNAL": ("coordinator.example", 19094)}
    # The old single-listener form of advertised.listener keeps working.
    c = config.load(None, {"listeners": "0.0.0.0:9092", "advertised.listener": "h:9092"}, environ={})
    assert c.advertised == {"PLAINTEXT": ("h", 9092)}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"listeners": "TLS://h:1"}, "listener TLS has no security protocol"),
    ({"listeners": "SSL://h:1,SASL_SSL://h:1"}, "port 1 is used by two listeners"),
    ({"listeners": "PLAINTEXT://h:1,SASL_PLAINTEXT://h:2", "advertised.listener": "x:1"},
     "a bare HOST:PORT (x:1) is only allowed with one listener"),
    ({"listeners": "h:1", "advertised.listener": "PLAINTEXT://0.0.0.0:1"}, "wildcard"),
    ({"listener.security.protocol.map": "A:KERBEROS"}, "'KERBEROS' (for A) is not one of"),
    ({"listeners": "SSL://h:1"}, "needs ssl.certfile"),
    ({"listeners": "SSL://h:1", "ssl.certfile": "/nonexistent.pem"},
     "ssl.certfile='/nonexistent.pem': no such file"),
    ({"ssl.client.auth": "required"}, "without an SSL or SASL_SSL listener"),
    ({"ssl.client.auth": "always"}, "ssl.client.auth='always': must be one of none, requested, required"),
    ({"sasl.enabled.mechanisms": "GSSAPI,PLAIN"}, "GSSAPI: not supported"),
    ({"super.users": "admin"}, "'admin' is not a principal TYPE:NAME"),
    ({"authorizer": "kafka"}, "authorizer='kafka': must be one of none, acl"),
    ({"ssl.enabled.protocols": "TLSv1.1"}, "ssl.enabled.protocols"),
])
def test_bad_security_settings_name_the_setting(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(None, overrides, environ={})
    assert message in str(info.value)


def test_unusable_tls_files_name_the_setting(tmp_path: Path, tls_ca: TlsFiles) -> None:  # noqa: F811
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    base = {"listeners": "SASL_SSL://127.0.0.1:0", **_tls_settings(tls_ca)}
    for setting, message in (("ssl.certfile", "cannot load the certificate"),
                             ("ssl.cafile", "ssl.cafile=")):
        with pytest.raises(ConfigError, match=message):
            config.load(None, {**base, setting: str(garbage)}, environ={})
    other = make_ca(tmp_path / "other").issue("x")
    with pytest.raises(ConfigError, match="cannot load the certificate and its key"):
        config.load(None, {**base, "ssl.keyfile": str(other.key)}, environ={})
    with pytest.raises(ConfigError, match="needs ssl.cafile"):
        config.load(None, {**base, "ssl.cafile": "", "ssl.client.auth": "requested"}, environ={})


def test_metadata_and_find_coordinator_answer_the_listener_the_request_came_in_on(
        tmp_path: Path) -> None:
    with InProcess(tmp_path, {
            "listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
            "advertised.listeners": "EXTERNAL://coordinator.example:19094"}) as d:
        internal = d.address("INTERNAL")
        assert d.server.banner().startswith(
            f"connect-coordinator listening on INTERNAL://127.0.0.1:{internal[1]}, "
            f"EXTERNAL://127.0.0.1:{d.address('EXTERNAL')[1]} (metrics off")
        for name, expected in (("INTERNAL", internal), ("EXTERNAL", ("coordinator.example", 19094))):
            with Raw(d.address(name)) as c:
                meta = c.call(ApiKey.METADATA, 12, MetadataRequest(
                    topics=(), allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False))
                assert [(b.host, b.port) for b in meta.brokers] == [expected]
                found = c.call(ApiKey.FIND_COORDINATOR, 3, FindV3(key="g", key_type=0))
                assert (found.host, found.port) == expected


# == SASL ==============================================================================================


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("version", [0, 1, 2])
def test_scram_authenticates_and_then_serves(sasl: InProcess, mechanism: str, version: int) -> None:
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        assert not c.api_versions().error_code
        done = c.scram(*ALICE, mechanism=mechanism, version=version)
        assert not done.error_code, done
        assert not _list_groups(c).error_code
    assert sasl.metric("connect_coordinator_authentications_total", mechanism=mechanism,
                       result="success", reauth="false") == 1


def test_api_versions_lists_the_sasl_apis(sasl: InProcess) -> None:
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        listed = {int(a.api_key): (int(a.min_version), int(a.max_version))
                  for a in c.api_versions().api_keys}
    assert listed[17] == (1, 1) and listed[36] == (0, 2)


@pytest.mark.parametrize(("user", "password", "mechanism"), [
    ("alice", "wrong", "SCRAM-SHA-256"), ("alice", "wrong", "SCRAM-SHA-512"),
    ("nobody", "x", "SCRAM-SHA-256"),  # an unknown user fails like a wrong password
    ("bob", "bob-secret", "SCRAM-SHA-256"),  # bob has a SCRAM-SHA-512 credential only
])
def test_bad_credentials_fail_after_the_delay_and_close(sasl: InProcess, user: str, password: str,
                                                        mechanism: str) -> None:
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        assert not c.handshake(mechanism).error_code
        started = time.monotonic()
        failed = c.scram(user, password, mechanism=mechanism, handshake=False)
        took = time.monotonic() - started
        assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert failed.error_message == ("Authentication failed during authentication due to "
                                        f"invalid credentials with SASL mechanism {mechanism}")
        assert took >= 0.14  # connection.failed.authentication.delay.ms=150
        assert c.closed()
    assert sasl.metric("connect_coordinator_authentications_total", mechanism=mechanism,
                       result="failure", reauth="false") == 1


def test_an_unsupported_mechanism_is_refused_with_the_enabled_list(sasl: InProcess) -> None:
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        refused = c.handshake("GSSAPI")
        assert refused.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert refused.mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
        assert c.closed()
    assert sasl.metric("connect_coordinator_authentications_total", mechanism="unknown",
                       result="failure", reauth="false") == 1


def test_only_api_versions_and_handshake_before_authentication(sasl: InProcess) -> None:
    # Anything else before SaslHandshake: closed unanswered (Kafka).
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        c.send(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=()))
        assert c.closed()
    # After SaslHandshake only SaslAuthenticate: anything else gets ILLEGAL_SASL_STATE, closed.
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        assert not c.handshake("SCRAM-SHA-256").error_code
        assert _list_groups(c).error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert c.closed()
    # A heartbeat (the worker's API) before authentication: closed too, no group touched.
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        c.send(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("g"))
        assert c.closed()
    assert sasl.server.group_count() == 0


def test_a_v0_handshake_gets_a_clear_error(sasl: InProcess) -> None:
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        refused = c.handshake("SCRAM-SHA-256", version=0)
        assert refused.error_code == ErrorCode.UNSUPPORTED_VERSION
        assert c.closed()


def test_sasl_apis_on_a_plaintext_listener_or_after_authentication_are_illegal(sasl: InProcess) -> None:
    with Raw(sasl.address("PLAINTEXT")) as c:
        assert c.handshake("SCRAM-SHA-256").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert c.authenticate(b"x").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert not _list_groups(c).error_code  # still served
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        assert not c.scram(*ALICE).error_code
        assert c.authenticate(b"x").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert not _list_groups(c).error_code


def test_frames_before_authentication_are_limited(tmp_path: Path) -> None:
    with InProcess(tmp_path, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                              "sasl.server.max.receive.size": 1024}, _security()) as d:
        with Raw(d.address()) as c:
            c.send_raw(b"\0" * 2000)
            assert c.closed()
        with Raw(d.address()) as c:  # after authentication: socket.max.frame.bytes
            assert not c.scram(*ALICE).error_code
            big = ConnectGroupDescribeRequest(group_ids=tuple(f"g{i}" for i in range(300)))
            described = c.call(ApiKey.CONNECT_GROUP_DESCRIBE, 0, big)
            assert len(described.groups) == 300


def test_plain_is_refused_without_tls_unless_allowed(tmp_path: Path, tls_ca: TlsFiles) -> None:  # noqa: F811
    overrides = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                 "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256", **_tls_settings(tls_ca)}
    with InProcess(tmp_path / "a", overrides, _security()) as d:
        with Raw(d.address("SASL_PLAINTEXT")) as c:
            refused = c.plain(*ALICE)
            assert refused.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
            assert refused.mechanisms == ("SCRAM-SHA-256",)
        with Raw(d.address("SASL_SSL"), tls=_client_tls(tls_ca)) as c:
            assert not c.plain(*ALICE).error_code
            assert not _list_groups(c).error_code
        with Raw(d.address("SASL_SSL"), tls=_client_tls(tls_ca)) as c:
            failed = c.plain("alice", "wrong")
            assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert c.closed()
        with Raw(d.address("SASL_SSL"), tls=_client_tls(tls_ca)) as c:  # bob: SHA-512 only
            assert not c.plain("bob", "bob-secret").error_code
    with InProcess(tmp_path / "b", {**overrides, "sasl.plain.allow.insecure": True}, _security()) as d:
        with Raw(d.address("SASL_PLAINTEXT")) as c:
            assert not c.plain(*ALICE).error_code
            assert not _list_groups(c).error_code


def test_plain_refuses_an_authorization_id_of_someone_else(tmp_path: Path) -> None:
    with InProcess(tmp_path, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                              "sasl.enabled.mechanisms": "PLAIN", "sasl.plain.allow.insecure": True},
                   _security()) as d, Raw(d.address()) as c:
        assert not c.handshake("PLAIN").error_code
        failed = c.authenticate(b"admin\0alice\0alice-secret")
        assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "authorization id" in failed.error_message


# == re-authentication (KIP-368) ========================================================================


@pytest.fixture
def reauth(tmp_path: Path) -> Iterator[InProcess]:
    with InProcess(tmp_path, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                              "connections.max.reauth.ms": 700}, _security()) as d:
        yield d


def test_a_session_that_is_not_renewed_is_closed_at_the_next_request(reauth: InProcess) -> None:
    with Raw(reauth.address()) as c:
        assert not c.scram(*ALICE).error_code
        assert c.session_lifetime_ms == 700
        assert not _list_groups(c).error_code
        time.sleep(0.8)
        c.send(ApiKey.LIST_GROUPS, 4, ListGroupsRequest(states_filter=()))
        assert c.closed()
    assert reauth.metric("connect_coordinator_sasl_sessions_expired_total") == 1


def test_re_authentication_on_the_same_connection_renews_the_session(reauth: InProcess) -> None:
    with Raw(reauth.address()) as c:
        assert not c.scram(*ALICE).error_code
        for _ in range(3):
            time.sleep(0.45)
            assert not c.scram(*ALICE).error_code  # before the 700 ms end
            assert c.session_lifetime_ms == 700
            assert not _list_groups(c).error_code
        time.sleep(0.45)  # 0.45 s after the last renewal: still within the session
        assert not _list_groups(c).error_code
    assert reauth.metric("connect_coordinator_authentications_total", mechanism="SCRAM-SHA-256",
                         result="success", reauth="true") == 3


def test_a_late_re_authentication_is_still_accepted(reauth: InProcess) -> None:
    """After the session ended, SaslHandshake (and only it) is still served: the client may
    re-authenticate late (Kafka's rule: only a request other than SaslHandshake closes)."""
    with Raw(reauth.address()) as c:
        assert not c.scram(*ALICE).error_code
        time.sleep(0.8)
        assert not c.scram(*ALICE).error_code
        assert not _list_groups(c).error_code


def test_re_authentication_cannot_change_the_principal_or_the_mechanism(reauth: InProcess) -> None:
    with Raw(reauth.address()) as c:
        assert not c.scram(*ALICE, mechanism="SCRAM-SHA-512").error_code
        failed = c.scram("admin", "admin-secret", mechanism="SCRAM-SHA-512")
        assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "Cannot change principals during re-authentication" in failed.error_message
        assert c.closed()
    with Raw(reauth.address()) as c:
        assert not c.scram(*ALICE, mechanism="SCRAM-SHA-512").error_code
        assert c.handshake("SCRAM-SHA-256").error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert c.closed()
    with Raw(reauth.address()) as c:  # a wrong password on re-authentication closes too
        assert not c.scram(*ALICE).error_code
        assert c.scram("alice", "wrong").error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert c.closed()


# == TLS and the certificate principal ================================================================


def test_mutual_tls_principal_is_the_subject_as_kafka_writes_it(tmp_path: Path,
                                                                tls_ca: TlsFiles) -> None:  # noqa: F811
    security = _security()
    security.allow("User:OU=ops,CN=worker-1", "READ", "GROUP", "g")
    with InProcess(tmp_path, {"listeners": "SSL://127.0.0.1:0", "authorizer": "acl",
                              **_tls_settings(tls_ca, "requested")}, security) as d:
        with Raw(d.address(), tls=_client_tls(tls_ca, cert=True)) as c:
            assert not c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("g")).error_code
        with Raw(d.address(), tls=_client_tls(tls_ca)) as c:  # no certificate: ANONYMOUS
            refused = c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("g"))
            assert refused.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    principals = {call[0] for call in security.calls}
    assert principals == {"User:OU=ops,CN=worker-1", "User:ANONYMOUS"}
    # The same string as RFC 4514 (Java's X500Principal.getName() writes RFC 2253 alike).
    cert = x509.load_pem_x509_certificate(tls_ca.client.cert.read_bytes())
    assert cert.subject.rfc4514_string() == "OU=ops,CN=worker-1"


def test_required_client_certificates_refuse_a_client_without_one(tmp_path: Path,
                                                                  tls_ca: TlsFiles) -> None:  # noqa: F811
    with InProcess(tmp_path, {"listeners": "SSL://127.0.0.1:0",
                              **_tls_settings(tls_ca, "required")}, _security()) as d:
        with pytest.raises((ssl.SSLError, Closed, ConnectionResetError, BrokenPipeError)):  # noqa: PT012
            with Raw(d.address(), tls=_client_tls(tls_ca)) as c:
                c.api_versions()
        with Raw(d.address(), tls=_client_tls(tls_ca, cert=True)) as c:
            assert not c.api_versions().error_code
        other = make_ca(tmp_path / "other")
        stranger = other.issue("stranger", client=True)
        ctx = _client_tls(tls_ca)
        ctx.load_cert_chain(stranger.cert, stranger.key)
        with pytest.raises((ssl.SSLError, Closed, ConnectionResetError, BrokenPipeError)):  # noqa: PT012
            with Raw(d.address(), tls=ctx) as c:
                c.api_versions()
        assert d.errors == []


def test_plaintext_bytes_on_a_tls_listener_do_not_hurt(tmp_path: Path, tls_ca: TlsFiles) -> None:  # noqa: F811
    with InProcess(tmp_path, {"listeners": "SASL_SSL://127.0.0.1:0", **_tls_settings(tls_ca)},
                   _security()) as d:
        with socket.create_connection(d.address(), timeout=5) as s, \
                contextlib.suppress(OSError):
            s.sendall(b"\0\0\0\x10" + b"\0" * 16)
            s.recv(100)
        with Raw(d.address(), tls=_client_tls(tls_ca)) as c:
            assert not c.scram(*ALICE).error_code
        assert d.errors == []


def test_rfc2253_formatting() -> None:
    subject = ((("countryName", "US"),), (("organizationName", "Example, Inc."),),
               (("organizationalUnitName", "ops"), ("commonName", "#w+1")),
               (("emailAddress", "a@b"),))
    assert tls.rfc2253(subject) == (
        "1.2.840.113549.1.9.1=#1603614062,OU=ops+CN=\\#w\\+1,O=Example\\, Inc.,C=US")


# == authorization (authorizer=acl) ====================================================================


def _heartbeat(group: str) -> ConnectGroupHeartbeatRequest:
    return ConnectGroupHeartbeatRequest(
        group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=1000, max_wait_ms=0,
        client_assignors=(_hb.Assignor(name="eager", minimum_version=0, maximum_version=0,
                                       reason=0, metadata_version=0, metadata_bytes=b""),),
        owned_connectors=(), owned_tasks=())


def _alter_connectors(group: str) -> ConnectGroupAlterConnectorsRequest:
    return ConnectGroupAlterConnectorsRequest(
        group_id=group, validate_only=False,
        upserts=(_alter.ConnectorSpec(name="c", task_count=1, config=()),), deletes=())


@pytest.fixture
def acl(tmp_path: Path) -> Iterator[tuple[InProcess, MemorySecurity]]:
    security = _security()
    security.allow("User:alice", "READ", "GROUP", "mine")
    security.allow("User:alice", "ALTER", "GROUP", "altered")
    with InProcess(tmp_path, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizer": "acl"},
                   security) as d:
        with Raw(d.address()) as admin:  # groups for the listing
            assert not admin.scram("admin", "admin-secret").error_code
            for g in ("mine", "theirs", "altered"):
                assert not admin.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0,
                                      _alter_connectors(g)).error_code
        yield d, security


def test_group_apis_need_their_acl(acl: tuple[InProcess, MemorySecurity]) -> None:
    d, _ = acl
    with Raw(d.address()) as c:
        assert not c.scram(*ALICE).error_code
        joined = c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("mine"))
        assert not joined.error_code
        refused = c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("theirs"))
        assert refused.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert refused.error_message.startswith(
            "Principal User:alice is not authorized to READ group 'theirs'")
        # ALTER for AlterConnectors: READ is not enough, ALTER is.
        altered = c.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0, _alter_connectors("mine"))
        assert altered.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert not c.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0,
                          _alter_connectors("altered")).error_code
        # Prepare and Install need READ.
        for key in (ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT, ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT):
            cls = APIS[key].request_class(0)
            fields = {"group_id": "theirs", "member_id": "m", "member_epoch": 1}
            if key == ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT:
                fields |= {"group_epoch": 1, "error": 0, "assignor_state": b""}
            request = cls(**fields)
            assert c.call(key, 0, request).error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        # Describe APIs need DESCRIBE (implied by READ and ALTER), per group.
        described = c.call(ApiKey.CONNECT_GROUP_DESCRIBE, 0, ConnectGroupDescribeRequest(
            group_ids=("mine", "theirs", "altered")))
        assert [g.error_code for g in described.groups] == [
            0, ErrorCode.GROUP_AUTHORIZATION_FAILED, 0]
        cls = APIS[ApiKey.DESCRIBE_GROUPS].request_class(5)
        groups = c.call(ApiKey.DESCRIBE_GROUPS, 5, cls(groups=("mine", "theirs"),
                                                       include_authorized_operations=False))
        assert [g.error_code for g in groups.groups] == [0, ErrorCode.GROUP_AUTHORIZATION_FAILED]
        found = c.call(ApiKey.FIND_COORDINATOR, 4, FindV4(key_type=0, coordinator_keys=(
            "mine", "theirs")))
        assert [k.error_code for k in found.coordinators] == [
            0, ErrorCode.GROUP_AUTHORIZATION_FAILED]
        single = c.call(ApiKey.FIND_COORDINATOR, 3, FindV3(key="theirs", key_type=0))
        assert single.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        # ListGroups: only the groups alice may describe (no CLUSTER DESCRIBE).
        assert sorted(g.group_id for g in _list_groups(c).groups) == ["altered", "mine"]
    assert d.metric("connect_coordinator_authorization_denied_total",
                    api="ConnectGroupHeartbeat", resource_type="GROUP") == 1
    assert d.metric("connect_coordinator_authorization_denied_total",
                    api="FindCoordinator", resource_type="GROUP") == 2


def test_cluster_describe_lists_every_group(acl: tuple[InProcess, MemorySecurity]) -> None:
    d, security = acl
    security.allow("User:alice", "DESCRIBE", "CLUSTER", "kafka-cluster")
    with Raw(d.address()) as c:
        assert not c.scram(*ALICE).error_code
        assert sorted(g.group_id for g in _list_groups(c).groups) == ["altered", "mine", "theirs"]


def test_no_authorizer_allows_everything_and_asks_nothing(sasl: InProcess) -> None:
    with Raw(sasl.address("SASL_PLAINTEXT")) as c:
        assert not c.scram(*ALICE).error_code
        assert not c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("any")).error_code
    security = sasl.server.security
    assert getattr(security, "calls", []) == []


def test_decisions_are_cached_until_the_acls_change(tmp_path: Path) -> None:
    """With the daemon's own security state: a heartbeat refused, an ACL added through the
    store, the same heartbeat on the same connection allowed (the router's cache of decisions
    follows the state's version), the ACL deleted, refused again."""
    from coordinator.security.model import ALL_ACLS, AclBinding
    from coordinator.security.scram import credential_from_password
    from coordinator.security.state import credential_record
    from coordinator.security.store import append_offline

    append_offline(tmp_path / "data", [credential_record(
        "alice", credential_from_password("SCRAM-SHA-256", ALICE[1]))])
    with InProcess(tmp_path, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                              "authorizer": "acl"}) as d, Raw(d.address()) as c:
        service = d.server.security_service
        binding = AclBinding.of("GROUP", "g", "User:alice", "READ")

        async def change(create: bool) -> None:
            if create:
                _, records = service.state.create_acls([binding])
            else:
                _, records = service.state.delete_acls([ALL_ACLS])
            await service.store.apply(records)
        assert not c.scram(*ALICE).error_code
        for _ in range(2):
            assert c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("g")).error_code \
                == ErrorCode.GROUP_AUTHORIZATION_FAILED
        d.run(change(True))
        assert not c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("g")).error_code
        d.run(change(False))
        assert c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, _heartbeat("g")).error_code \
            == ErrorCode.GROUP_AUTHORIZATION_FAILED


def test_serve_exits_2_naming_a_bad_security_setting(tmp_path: Path, tls_ca: TlsFiles) -> None:  # noqa: F811
    from tests.daemon_fixture import run_serve
    done = run_serve(tmp_path / "data", ["--listen", "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"],
                     extra_env={"CONNECT_COORDINATOR_SSL_CERTFILE": str(tmp_path / "missing.pem")})
    assert done.returncode == 2, done.stderr
    assert "configuration error: ssl.certfile=" in done.stderr and "no such file" in done.stderr
    done = run_serve(tmp_path / "data", ["--listen", "SSL://127.0.0.1:0"], extra_env={
        "CONNECT_COORDINATOR_SSL_CERTFILE": str(tls_ca.server.cert),
        "CONNECT_COORDINATOR_SSL_KEYFILE": str(tls_ca.client.key)})  # not this certificate's key
    assert done.returncode == 2, done.stderr
    assert "cannot load the certificate and its key" in done.stderr
