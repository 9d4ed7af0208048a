"""The etcd partition store (coordinator/runtime/etcd_store.py) on a REAL 3-member etcd cluster.

The cluster (tests/etcd_fixture.py: ``etcd_cluster``, 3 members on 127.0.0.1, fast elections)
is shared by the module; each test works under its own key prefix, and a member a test kills is
started again (on its data dir) before the next test. No mocks: every outcome is etcd's and
etcd3aio's own. No duration is asserted: waits are for conditions, each bounded generously
(BOUND_S) so a broken cluster fails the test instead of hanging it.

What etcd3aio does with several endpoints (read in its source, etcd3aio 0.3.0): ONE gRPC
channel to ``ipv4:a,b,c`` with the ``round_robin`` policy. The endpoints' order does not matter:
every call goes to the next subchannel that is READY. A SIGKILLed member's connections are
closed by its kernel, so its subchannel leaves the rotation at once: a call in flight TO it fails
with UNAVAILABLE (the store: ``OutcomeUnknown``), later calls go to the others, and a new client
whose first endpoint is dead never calls it. A write a FOLLOWER had forwarded to the leader when
it died is lost with the leader's log, and etcd answers it only after its own request timeout
(5 s + 2 election timeouts: 5.2 s here): the store's commit timeout (5 s) comes first, so that
commit is ``OutcomeUnknown`` (a ``TimeoutError``) after 5 s; the partition reloads and goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from coordinator.runtime import etcd_store
from coordinator.runtime.etcd_store import (
    CommitRefused,
    EtcdPartitionStore,
    NodeLease,
    OutcomeUnknown,
    ReloadRequired,
)
from tests.etcd_fixture import EtcdCluster, EtcdMember, etcd_cluster  # noqa: F401 (fixture)

BOUND_S = 60.0  # a generous bound on waiting for a condition: only a broken cluster reaches it
LEASE_TTL_S = 5
_prefixes = itertools.count()

Model = dict[bytes, bytes]


@pytest.fixture
def prefix() -> str:
    return f"/cluster-{os.getpid()}-{next(_prefixes)}"


@pytest.fixture
def cluster(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:  # noqa: F811
    """The module's cluster, every member running again after the test (even a failed one)."""
    etcd_cluster.wait_healthy(BOUND_S)
    yield etcd_cluster
    for member in etcd_cluster.members:
        if not member.running:
            etcd_cluster.restart(member, BOUND_S)


async def wait_for(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + BOUND_S
    while not await condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        await asyncio.sleep(0.05)


def batch(partition: int, i: int) -> list[tuple[bytes, bytes | None]]:
    """The records of the i-th write of a partition: a new key, an overwrite of a key every
    write touches and, every fourth write, the deletion of an earlier key (a tombstone)."""
    records: list[tuple[bytes, bytes | None]] = [
        (f"rec-{i:05d}".encode(), f"p{partition}-w{i}".encode() * 4),
        (b"hot", f"p{partition}-w{i}".encode()),
    ]
    if i % 4 == 3:
        records.append((f"rec-{i - 2:05d}".encode(), None))
    return records


def applied(model: Model, records: list[tuple[bytes, bytes | None]]) -> Model:
    out = dict(model)
    for key, value in records:
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


class Writer:
    """One partition's writer as the shard will drive the store: append ONE request's records,
    commit, and on OutcomeUnknown / ReloadRequired reload before writing again. ``model`` is what
    etcd must hold: every acknowledged write applied, nothing else."""

    def __init__(self, store: EtcdPartitionStore) -> None:
        self.store = store
        self.model: Model = {}
        self.acked = 0
        self.writes = 0
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.resolved_unknown: Counter[str] = Counter()  # an unknown write found applied or not
        self.acked_at: list[float] = []

    async def reload(self, pending: list[tuple[bytes, bytes | None]] | None) -> None:
        """Reload until etcd answers (an election may be going on). The write whose outcome was
        unknown must be in etcd wholly or not at all: the loaded state is the model, or the
        model with that write applied -- which then becomes the model."""
        deadline = time.monotonic() + BOUND_S
        while True:
            try:
                loaded = dict(await self.store.reload())
                break
            except etcd_store.EtcdStoreError:  # Deposed: the lease must not have been lost
                raise
            except Exception as exc:  # the cluster is electing: etcd3aio/gRPC errors, timeouts
                self.outcomes[f"reload: {type(exc).__name__}"] += 1
                assert time.monotonic() < deadline, f"reload never succeeded: {exc!r}"
                await asyncio.sleep(0.05)
        if loaded == self.model:
            self.resolved_unknown["not applied"] += 1
        else:
            assert pending is not None, "etcd holds a state no write of ours produced"
            assert loaded == applied(self.model, pending), (
                "after an unknown outcome etcd holds neither the acknowledged state nor the "
                "acknowledged state plus the whole unknown write")
            self.model = loaded
            self.resolved_unknown["applied"] += 1

    async def write_one(self) -> None:
        records = batch(self.store.partition, self.writes)
        self.writes += 1
        self.store.append(records)
        try:
            await self.store.commit()
        except CommitRefused as exc:  # nothing written: the model stays as it is
            self.outcomes["CommitRefused"] += 1
            self.errors.append(str(exc))
        except OutcomeUnknown as exc:
            self.outcomes["OutcomeUnknown"] += 1
            self.errors.append(str(exc))
            await self.reload(records)
        except ReloadRequired as exc:  # a definite refusal after an applied transaction
            self.outcomes["ReloadRequired"] += 1
            self.errors.append(str(exc))
            await self.reload(records)
        else:
            self.outcomes["committed"] += 1
            self.model = applied(self.model, records)
            self.acked += 1
            self.acked_at.append(time.monotonic())

    async def run_until(self, done: asyncio.Event) -> None:
        while not done.is_set():
            await self.write_one()


async def member_view(member: EtcdMember, prefix: str, partition: int, lease: NodeLease) -> Model:
    """The partition's live records as ``member`` alone serves them: a client with only its
    endpoint, the store's own load (a linearizable read: the member answers from its own copy
    once it has applied everything committed before the read)."""
    client = await etcd_store.connect([member.endpoint])
    try:
        # Our own lease holds the owner key: acquire keeps it as it is and writes nothing.
        view = await EtcdPartitionStore.acquire(client, prefix, partition, "node-1", lease)
        return dict(await view.load())
    finally:
        await client.close()


async def wait_for_acks(writers: list[Writer], more: int, what: str) -> None:
    targets = [w.acked + more for w in writers]

    async def reached() -> bool:
        return all(w.acked >= t for w, t in zip(writers, targets, strict=True))
    await wait_for(reached, what)


async def test_the_cluster_fixture_has_one_leader_that_every_member_follows(
        cluster: EtcdCluster) -> None:
    leader = cluster.wait_for_leader(BOUND_S)
    statuses = [m.status() for m in cluster.members]
    assert all(s is not None for s in statuses)
    assert {s["leader"] for s in statuses if s} == {leader.member_id}
    assert len({m.member_id for m in cluster.members}) == len(cluster.members) == 3
    assert len(set(cluster.endpoints)) == 3


async def test_commits_resume_after_the_etcd_leader_is_killed(
        cluster: EtcdCluster, prefix: str) -> None:
    """A node owning three partitions through ONE client connected to all three members (the
    leader's endpoint first) writes without pause; the etcd leader is SIGKILLed while commits
    are in flight. Commits resume on every partition (after OutcomeUnknown + reload where a
    commit was caught by the kill); the 5 s lease is never lost; the old leader, restarted on
    its data dir, rejoins and serves every acknowledged record; nothing acknowledged is lost
    and no write is half applied."""
    old_leader = cluster.wait_for_leader(BOUND_S)
    others = [m for m in cluster.members if m is not old_leader]
    client = await etcd_store.connect([old_leader.endpoint, *(m.endpoint for m in others)])
    lease = await NodeLease.grant(client, LEASE_TTL_S)
    writers: list[Writer] = []
    done = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        for partition in range(3):
            store = await EtcdPartitionStore.acquire(client, prefix, partition, "node-1", lease)
            assert await store.load() == []
            writers.append(Writer(store))
        tasks = [asyncio.create_task(w.run_until(done)) for w in writers]
        await wait_for_acks(writers, 20, "20 commits on every partition before the kill")

        renewals_before = lease.renewals
        killed_at = time.monotonic()
        cluster.kill(old_leader)  # the writers' next commits are on their way
        new_leader = await asyncio.to_thread(cluster.wait_for_leader, BOUND_S, old_leader)
        assert new_leader is not old_leader
        await wait_for_acks(writers, 20, "20 commits on every partition after the kill")
        assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
        assert not any(w.store.deposed for w in writers)

        async def renewed_twice() -> bool:  # the lease is renewed through the new leader
            return lease.renewals >= renewals_before + 2 or lease.lost.is_set()
        await wait_for(renewed_twice, "two lease renewals after the kill")
        assert not lease.lost.is_set() and lease.remaining() > 0

        await asyncio.to_thread(cluster.restart, old_leader, BOUND_S)

        def rejoined() -> bool:  # it follows the cluster's leader (or leads it)
            leader, status = cluster.leader(), old_leader.status()
            return leader is not None and status is not None and (
                status["leader"] == leader.member_id)

        async def rejoined_async() -> bool:
            return await asyncio.to_thread(rejoined)
        await wait_for(rejoined_async, "the restarted old leader to follow the leader")
        await wait_for_acks(writers, 20, "20 commits on every partition after the restart")
        done.set()
        await asyncio.gather(*tasks)

        assert not lease.lost.is_set() and lease.remaining() > 0
        for w in writers:
            # Every acknowledged write, nothing else: through the store's client ...
            assert dict(await w.store.load()) == w.model, w.outcomes
            # ... and from each member on its own, the restarted old leader included.
            for member in cluster.members:
                view = await member_view(member, prefix, w.store.partition, lease)
                assert view == w.model, f"{member.name} (old leader: {member is old_leader})"
        # For the record (-s), not asserted: each partition's longest time without an ack.
        stalls = [max(b - a for a, b in itertools.pairwise(w.acked_at)) for w in writers]
        print(f"\nleader {old_leader.name} killed {time.monotonic() - killed_at:.1f} s ago; "
              f"new leader {new_leader.name}; longest time without a commit per partition: "
              + ", ".join(f"{s:.2f} s" for s in stalls)
              + f"; outcomes {sum((w.outcomes for w in writers), Counter())}; unknown writes "
              f"resolved {sum((w.resolved_unknown for w in writers), Counter())}; "
              f"errors {[e for w in writers for e in w.errors]}")
    finally:
        done.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await lease.close()
        await client.close()


async def test_a_client_whose_first_endpoint_is_dead_works(
        cluster: EtcdCluster, prefix: str) -> None:
    """A member (the leader: the worst case) is SIGKILLed; a NEW client listing it first grants
    a lease, acquires a partition, commits and loads with every call answered the first time
    (the store's writes are not retried: round-robin never sends them to the dead member); a
    client made BEFORE the kill with the dead member first does the same."""
    dead = cluster.wait_for_leader(BOUND_S)
    alive = [m.endpoint for m in cluster.members if m is not dead]
    early = await etcd_store.connect([dead.endpoint, *alive])
    try:
        assert (await early.kv.get(b"/nothing")).kvs == []  # connected while all were up
        cluster.kill(dead)
        await asyncio.to_thread(cluster.wait_for_leader, BOUND_S, dead)
        late = await etcd_store.connect([dead.endpoint, *alive])
        try:
            for n, client in enumerate((late, early)):
                lease = await NodeLease.grant(client, LEASE_TTL_S, keep_alive=False)
                store = await EtcdPartitionStore.acquire(client, prefix, n, f"node-{n}", lease)
                model: Model = {}
                for i in range(10):
                    store.append(batch(n, i))
                    await store.commit()
                    model = applied(model, batch(n, i))
                assert dict(await store.load()) == model
                assert await store.owns()
                await lease.close()
        finally:
            await late.close()
    finally:
        await early.close()
