"""SecurityState (records in, records out; Kafka's per-user and per-ACL semantics), the SCRAM
formulas against scramp, and the file store (durable, replayed, offline appends)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from pathlib import Path

import pytest
import scramp

from coordinator.group.records import Record
from coordinator.runtime import datadir, serde
from coordinator.security import SCRAM_MECHANISMS
from coordinator.security.model import (
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    Authorizer,
    Operation,
    PatternType,
    ResourcePatternFilter,
    ResourceType,
)
from coordinator.security.scram import (
    credential_from_password,
    credential_from_salted_password,
    salted_password,
)
from coordinator.security.state import (
    DUPLICATE_RESOURCE,
    INVALID_REQUEST,
    RESOURCE_NOT_FOUND,
    UNACCEPTABLE_CREDENTIAL,
    UNSUPPORTED_SASL_MECHANISM,
    ScramUpsertion,
    SecurityState,
    acl_record,
    credential_record,
)
from coordinator.security.store import FileSecurityStore, append_offline, read_offline

SHA256, SHA512 = 1, 2


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_credentials_are_what_scramp_makes(mechanism: str) -> None:
    salt = os.urandom(24)
    mine = credential_from_password(mechanism, "pa55 word!", 4096, salt)
    theirs = scramp.ScramMechanism(mechanism).make_auth_info("pa55 word!", iteration_count=4096,
                                                             salt=salt)
    assert (mine.salt, mine.stored_key, mine.server_key, mine.iterations) == theirs


def test_salted_password_is_kafka_pythons() -> None:
    # kafka-python's UserScramCredentialUpsertion salts exactly so (kafka-configs too).
    salt = b"s" * 16
    assert salted_password("SCRAM-SHA-512", "pw", salt, 4096) == hashlib.pbkdf2_hmac(
        "sha512", b"pw", salt, 4096)


def upsert(user: str, mechanism: int = SHA256, iterations: int = 4096, password: str = "pw"
           ) -> ScramUpsertion:
    name = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}.get(mechanism, "SCRAM-SHA-256")
    salt = os.urandom(16)
    return ScramUpsertion(user, mechanism, iterations, salt,
                          salted_password(name, password, salt, max(iterations, 1)))


def alter(state: SecurityState, deletions=(), upsertions=()):  # type: ignore[no-untyped-def]
    results, records = state.alter_scram_credentials(list(deletions), list(upsertions))
    state.replay(records)
    return {r.user: r.code for r in results}, records


def test_alter_and_describe_credentials() -> None:
    s = SecurityState()
    codes, records = alter(s, upsertions=[upsert("alice"), upsert("bob", SHA512, 8192)])
    assert codes == {"alice": 0, "bob": 0} and len(records) == 2
    assert all(r.value is not None and r.value.iterations in (4096, 8192) for r in records)
    c = s.scram_credential("bob", "SCRAM-SHA-512")
    assert c is not None and c.iterations == 8192
    assert s.scram_credential("bob", "SCRAM-SHA-256") is None
    alter(s, upsertions=[upsert("alice", SHA512)])
    assert {d.user: d.credentials for d in s.describe_scram_credentials(None)} == {
        "alice": ((SHA256, 4096), (SHA512, 4096)), "bob": ((SHA512, 8192),)}
    described = s.describe_scram_credentials(["bob", "nobody", "alice", "alice"])
    assert [(d.user, d.code) for d in described] == [
        ("bob", 0), ("nobody", RESOURCE_NOT_FOUND), ("alice", DUPLICATE_RESOURCE)]
    codes, records = alter(s, deletions=[("alice", SHA256)])
    assert codes == {"alice": 0} and records[0].value is None
    assert s.credentials_of("alice").keys() == {"SCRAM-SHA-512"}


def test_alter_errors_are_per_user_and_the_rest_is_done() -> None:
    s = SecurityState()
    alter(s, upsertions=[upsert("carol")])
    codes, records = alter(s, deletions=[("nobody", SHA256), ("carol", 7), ("dave", SHA256)],
                           upsertions=[upsert("erin", iterations=1000),
                                       upsert("frank", iterations=20000),
                                       upsert("gina", mechanism=9), upsert(""),
                                       upsert("dave"), upsert("ok"), upsert("twice"),
                                       upsert("twice")])
    assert codes == {
        "nobody": RESOURCE_NOT_FOUND, "carol": UNSUPPORTED_SASL_MECHANISM,
        "dave": RESOURCE_NOT_FOUND, "erin": UNACCEPTABLE_CREDENTIAL,
        "frank": UNACCEPTABLE_CREDENTIAL, "gina": UNSUPPORTED_SASL_MECHANISM,
        "": UNACCEPTABLE_CREDENTIAL, "ok": 0, "twice": DUPLICATE_RESOURCE}
    assert [r.key.name for r in records] == ["ok"]
    # a user deleted and upserted in one request: DUPLICATE_RESOURCE, nothing done for it
    codes, records = alter(s, deletions=[("carol", SHA256)], upsertions=[upsert("carol", SHA512)])
    assert codes == {"carol": DUPLICATE_RESOURCE} and records == []


def test_upsertion_is_computed_as_kafka_does() -> None:
    s = SecurityState()
    up = upsert("alice", SHA512, 4096, password="secret")
    alter(s, upsertions=[up])
    expected = credential_from_salted_password("SCRAM-SHA-512", up.salt, up.salted_password, 4096)
    assert s.scram_credential("alice", "SCRAM-SHA-512") == expected
    assert expected == credential_from_password("SCRAM-SHA-512", "secret", 4096, up.salt)


def test_acl_create_describe_delete() -> None:
    s = SecurityState(Authorizer(allow_everyone_if_no_acl_found=False))
    read = AclBinding.of("GROUP", "orders", "User:a", "READ")
    prefixed = AclBinding.of("GROUP", "team-", "User:b", "ALTER", pattern_type="PREFIXED")
    bad = AclBinding.of("CLUSTER", "x", "User:a", "ALTER")
    results, records = s.create_acls([read, prefixed, bad, read], now_ms=5)
    assert [r.code for r in results] == [0, 0, INVALID_REQUEST, 0]
    assert len(records) == 2 and records[0].value.created_at_ms == 5
    s.replay(records)
    assert s.authorize("User:a", "h", "DESCRIBE", "GROUP", "orders")
    assert s.authorize_group("User:b", "h", Operation.ALTER, "team-x")
    assert not s.authorize("User:b", "h", "READ", "GROUP", "team-x")
    # creating it again writes nothing
    results, records = s.create_acls([read])
    assert [r.code for r in results] == [0] and records == []
    result, found = s.describe_acls(AclBindingFilter(
        ResourcePatternFilter(ResourceType.GROUP, "team-orders", PatternType.MATCH)))
    assert result.code == 0 and found == [prefixed]
    result, found = s.describe_acls(AclBindingFilter(
        ResourcePatternFilter(ResourceType.UNKNOWN)))
    assert result.code == INVALID_REQUEST
    everything = AclBindingFilter()
    results, records = s.delete_acls([everything, AclBindingFilter(
        ResourcePatternFilter(ResourceType.GROUP, "orders", PatternType.LITERAL))])
    assert [sorted(r.deleted) for r in results] == [sorted([read, prefixed]), [read]]
    assert len(records) == 2 and all(r.value is None for r in records)
    s.replay(records)
    assert s.acls == []


def test_visible_groups() -> None:
    s = SecurityState()
    s.replay([acl_record(AclBinding.of("GROUP", "a", "User:x", "READ")),
              acl_record(AclBinding.of("GROUP", "b", "User:x", "READ", "DENY"))])
    assert s.visible_groups("User:x", "h", ["a", "b", "c"]) == ["a"]
    s.apply(acl_record(AclBinding.of("CLUSTER", "kafka-cluster", "User:x", "DESCRIBE")))
    assert s.visible_groups("User:x", "h", ["a", "b", "c"]) == ["a", "b", "c"]


def test_records_round_trip_through_serde_and_replay() -> None:
    s = SecurityState()
    s.apply(credential_record("u", credential_from_password("SCRAM-SHA-256", "p")))
    s.apply(acl_record(AclBinding.of("GROUP", "g", "User:u", "READ"), 7))
    copy = SecurityState()
    copy.replay(serde.decode_record(*serde.encode_record(r)) for r in s.records())
    assert copy.records() == s.records()
    with pytest.raises(ValueError, match="not a security record"):
        s.apply(Record(serde.decode_key(serde.encode_key(
            __import__("connect_wire.records", fromlist=["GroupMetadataKey"]).GroupMetadataKey(
                group_id="g"))), None))


# -- the file store -----------------------------------------------------------------------------


def test_file_store_is_durable_and_replayed(tmp_path: Path) -> None:
    async def run() -> None:
        state = SecurityState()
        store = FileSecurityStore(tmp_path, state)
        seen: list[int] = []
        store.on_change.append(lambda records: seen.append(len(records)))
        await store.load()
        results, records = state.alter_scram_credentials([], [upsert("alice")])
        await store.apply(records)
        _, records = state.create_acls([AclBinding.of("GROUP", "g", "User:alice", "READ")])
        await store.apply(records)
        assert seen == [1, 1]
        assert state.scram_credential("alice", "SCRAM-SHA-256") is not None
        await store.close()

        again = SecurityState()
        store = FileSecurityStore(tmp_path, again)
        await store.load()
        assert again.records() == state.records()
        _, records = again.delete_acls([AclBindingFilter()])
        await store.apply(records)
        await store.close()
        assert read_offline(tmp_path).acls == []
        assert read_offline(tmp_path).users == ["alice"]
    asyncio.run(run())


def test_offline_append_refuses_a_locked_data_dir(tmp_path: Path) -> None:
    record = credential_record("admin", credential_from_password("SCRAM-SHA-512", "pw"))
    state = append_offline(tmp_path, [record])
    assert state.users == ["admin"]
    assert read_offline(tmp_path).scram_credential("admin", "SCRAM-SHA-512") is not None
    lock = datadir.lock_data_dir(tmp_path)
    try:
        with pytest.raises(datadir.DataDirLocked):
            append_offline(tmp_path, [record])
    finally:
        lock.release()


# -- DeleteAcls against many ACLs (found by the issue 19 trial, fixed) ---------------------------
def _many_acls(n: int) -> SecurityState:
    state = SecurityState()
    state.replay(acl_record(AclBinding.of("GROUP", f"g{i}", f"User:u{i % 97}", "READ"))
                 for i in range(n))
    return state


class _Counted:
    """Counts AclBindingFilter.matches calls: the work a request makes the loop do."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = AclBindingFilter.matches

        def counted(f: AclBindingFilter, binding: AclBinding) -> bool:
            self.calls += 1
            return real(f, binding)
        monkeypatch.setattr(AclBindingFilter, "matches", counted)


# 45,000 ACLs and one DeleteAcls of 300 filters naming groups without ACLs: every filter was
# matched against every ACL (13.5 M matches, 18 s on the event loop; 3,000 filters ~220 s).
# A filter naming a resource now looks at that name's ACLs only.
@pytest.mark.parametrize("filters", [300, 3000])
def test_delete_acls_by_name_looks_at_that_names_acls_only(
        monkeypatch: pytest.MonkeyPatch, filters: int) -> None:
    state = _many_acls(45_000)
    counted = _Counted(monkeypatch)
    batch = [AclBindingFilter(ResourcePatternFilter(ResourceType.GROUP, f"none-{i}",
                                                    PatternType.LITERAL)) for i in range(filters)]
    batch.append(AclBindingFilter(ResourcePatternFilter(ResourceType.ANY, "g7", PatternType.ANY)))
    results, records = state.delete_acls(batch)
    assert [r.deleted for r in results[:-1]] == [()] * filters
    assert [str(a) for a in results[-1].deleted] == ["ALLOW User:u7 READ from * on GROUP:LITERAL:g7"]
    assert len(records) == 1
    assert counted.calls == 1  # g7's one ACL


# Filters without a resource name look at every ACL: past MAX_DELETE_WORK ACLs examined in one
# request (or every ACL once, if more) it is refused with a precise error and nothing deleted.
def test_delete_acls_refuses_a_request_that_would_examine_too_many_acls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = _many_acls(45_000)
    counted = _Counted(monkeypatch)
    by_principal = [AclBindingFilter(entry=AccessControlEntryFilter(principal=f"User:x{i}"))
                    for i in range(300)]
    results, records = state.delete_acls(by_principal)
    assert records == [] and counted.calls == 0
    assert {(r.code, r.message) for r in results} == {(INVALID_REQUEST, (
        "DeleteAcls would examine 13500000 ACLs (300 filters, 300 of them without a resource "
        "name, each examining all 45000 ACLs), more than 200000 per request: send fewer "
        "filters per request or name the resource in each"))}
    # Within the bound: done (every ACL of one principal, by scanning).
    results, records = state.delete_acls(by_principal[:1] + [AclBindingFilter(
        entry=AccessControlEntryFilter(principal="User:u3"))])
    assert results[0].deleted == () and len(results[1].deleted) == len(records) == 464
    # One whole scan is always allowed, however many ACLs there are.
    assert state.delete_acls(by_principal[:1], max_work=10)[0][0].code == 0
    assert state.delete_acls(by_principal[:2], max_work=10)[0][0].code == INVALID_REQUEST


# The index answers exactly what a scan of every ACL answers, for every kind of filter.
def test_indexed_acl_matching_equals_a_scan() -> None:
    rng = random.Random(7)
    names = ["a", "ab", "abc", "b", "*", "abd", "x"]
    authorizer = Authorizer(acls={AclBinding.of(
        rng.choice(["GROUP", "TOPIC", "CLUSTER"]), rng.choice(names), f"User:{rng.choice('pq')}",
        rng.choice(["READ", "ALTER"]), pattern_type=rng.choice(["LITERAL", "PREFIXED"]))
        for _ in range(300)})
    for rtype in (ResourceType.ANY, ResourceType.GROUP, ResourceType.TOPIC):
        for ptype in (PatternType.ANY, PatternType.MATCH, PatternType.LITERAL,
                      PatternType.PREFIXED):
            for name in [None, *names, "abcd", "zz"]:
                f = AclBindingFilter(ResourcePatternFilter(rtype, name, ptype))
                assert authorizer.matching(f) == sorted(
                    a for a in authorizer._acls if f.matches(a)), f
    for acl in list(authorizer)[::2]:
        authorizer.remove(acl)
    f = AclBindingFilter(ResourcePatternFilter(ResourceType.GROUP, "abcd", PatternType.MATCH))
    assert authorizer.matching(f) == sorted(a for a in authorizer._acls if f.matches(a))
