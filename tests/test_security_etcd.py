"""The etcd security store (coordinator/security/store.py) against a REAL etcd: two stores (two
nodes) on one prefix converge on what etcd holds; the node that writes decides with its write at
once; last writer wins per key; a request too big for one transaction is refused whole."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator

import pytest
from etcd3aio import Etcd3Client

from coordinator.security.model import AclBinding, AclBindingFilter
from coordinator.security.scram import credential_from_password
from coordinator.security.state import SecurityState, credential_record
from coordinator.security.store import (
    INVALID_REQUEST,
    EtcdSecurityStore,
    SecurityStoreError,
    etcd_security_prefix,
)
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)

BOUND_S = 30.0
_prefixes = itertools.count()


@pytest.fixture
def prefix() -> str:
    return f"/security-{os.getpid()}-{next(_prefixes)}"


@pytest.fixture
async def client(etcd_endpoint: str) -> AsyncIterator[Etcd3Client]:  # noqa: F811
    async with Etcd3Client([etcd_endpoint]) as c:
        yield c


async def test_two_stores_converge(client: Etcd3Client, prefix: str) -> None:
    a_state, b_state = SecurityState(), SecurityState()
    a = EtcdSecurityStore(client, prefix, a_state, node_id="1")
    b = EtcdSecurityStore(client, prefix, b_state, node_id="2", max_txn_ops=4)
    changes: list[int] = []
    b.on_change.append(lambda records: changes.append(len(records)))
    await a.load()
    await b.load()
    try:
        _, records = a_state.create_acls([AclBinding.of("GROUP", "g", "User:x", "READ")])
        records.append(credential_record("alice", credential_from_password("SCRAM-SHA-256", "p")))
        await a.apply(records)
        assert a_state.scram_credential("alice", "SCRAM-SHA-256") is not None  # at once
        await b.watcher.wait_for(lambda _v: b_state.users == ["alice"], BOUND_S)
        assert b_state.records() == a_state.records() and changes == [2]

        # last writer wins per key, whichever node wrote
        newer = credential_from_password("SCRAM-SHA-256", "other")
        await b.apply([credential_record("alice", newer)])
        await a.watcher.wait_for(
            lambda _v: a_state.scram_credential("alice", "SCRAM-SHA-256") == newer, BOUND_S)
        _, records = b_state.delete_acls([AclBindingFilter()])
        await b.apply(records)
        await a.watcher.wait_for(lambda _v: a_state.acls == [], BOUND_S)

        # etcd holds one key per live record, under the prefix
        base = etcd_security_prefix(prefix)
        keys = [kv.key for kv in (await client.kv.get(base, base + b"\xff")).kvs]
        assert sorted(k[len(base):].split(b"/")[0] for k in keys) == [b"r", b"written"]

        # more keys than one transaction takes (max_txn_ops=4: 3 records + the marker)
        too_many = [credential_record(f"u{i}", newer) for i in range(4)]
        with pytest.raises(SecurityStoreError) as refused:
            await b.apply(too_many)
        assert refused.value.code == INVALID_REQUEST
        assert b_state.users == ["alice"]
        await b.apply(too_many[:3])
        assert b_state.users == ["alice", "u0", "u1", "u2"]

        # a third node loads the same state
        c_state = SecurityState()
        c = EtcdSecurityStore(client, prefix, c_state)
        await c.load()
        await c.close()
        await a.watcher.wait_for(lambda _v: len(a_state.users) == 4, BOUND_S)
        assert c_state.records() == a_state.records() == b_state.records()
    finally:
        await a.close()
        await b.close()
