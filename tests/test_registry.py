"""The etcd node registry (coordinator/cluster/registry.py) against a REAL etcd.

One etcd per module (tests/etcd_fixture.py, fast elections so a 2 s lease ends in ~2 s), each
test under its own prefix. The crashed node is a real process killed with SIGKILL. No duration
is asserted: waits are for conditions, bounded generously (BOUND_S).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from etcd3aio import Etcd3Client

from coordinator.cluster.registry import (
    NodeIdTaken,
    NodeInfo,
    NodeWatcher,
    live_nodes,
    node_key,
    register,
)
from coordinator.runtime.etcd_store import NodeLease
from tests.daemon_fixture import ROOT, daemon_env
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)

BOUND_S = 60.0
_prefixes = itertools.count()


@pytest.fixture
def prefix() -> str:
    return f"/registry-{os.getpid()}-{next(_prefixes)}"


@pytest.fixture
async def client(etcd_endpoint: str) -> AsyncIterator[Etcd3Client]:  # noqa: F811
    async with Etcd3Client([etcd_endpoint]) as c:
        yield c


async def test_register_list_and_watch(client: Etcd3Client, prefix: str) -> None:
    a, b = await NodeLease.grant(client, 30), await NodeLease.grant(client, 30)
    async with NodeWatcher(client, prefix) as w:
        assert w.nodes == {}
        ra = await register(client, prefix, "1", "node1.example", 9092, a)
        await w.wait_for(lambda n: "1" in n, BOUND_S)
        rb = await register(client, prefix, "2", "node2.example", 9093, b)
        view = await w.wait_for(lambda n: len(n) == 2, BOUND_S)
        assert view == {"1": NodeInfo("node1.example", 9092), "2": NodeInfo("node2.example", 9093)}
        nodes, revision = await live_nodes(client, prefix)
        assert nodes == view and revision >= ra.create_revision
        # The value is the advertised address as JSON.
        (kv,) = (await client.kv.get(node_key(prefix, "1"))).kvs
        assert kv.value == b'{"host": "node1.example", "port": 9092}' and kv.lease == a.id
        # A graceful close removes the key at once (a read right after it does not see it).
        assert await rb.close()
        assert "2" not in (await live_nodes(client, prefix))[0]
        assert not await rb.registered() and await ra.registered()
        assert await w.wait_for(lambda n: "2" not in n, BOUND_S) == {"1": NodeInfo("node1.example", 9092)}
        assert not await rb.close()  # not ours any more: nothing deleted
    await a.close()
    await b.close()


async def test_changes_yields_the_view_then_each_change(client: Etcd3Client, prefix: str) -> None:
    lease = await NodeLease.grant(client, 30)
    async with NodeWatcher(client, prefix) as w:
        seen: list[set[str]] = []

        async def follow() -> None:
            async for view in w.changes():
                seen.append(set(view))
                if len(seen) == 3:
                    return

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0)  # the follower takes the first view ({}) before the first change
        r = await register(client, prefix, "n1", "h", 1, lease)
        await w.wait_for(lambda n: "n1" in n, BOUND_S)
        await asyncio.sleep(0)
        await r.close()
        await asyncio.wait_for(follower, BOUND_S)
        assert seen == [set(), {"n1"}, set()]
    await lease.close()


async def test_a_node_id_held_by_a_live_lease_is_refused(client: Etcd3Client, prefix: str) -> None:
    a, b = await NodeLease.grant(client, 30), await NodeLease.grant(client, 30)
    first = await register(client, prefix, "7", "10.0.0.1", 9092, a)
    with pytest.raises(NodeIdTaken) as info:
        await register(client, prefix, "7", "10.0.0.2", 9092, b)
    text = str(info.value)
    assert "node id '7' is already registered by a live node (10.0.0.1:9092" in text
    assert f"{a.id:x}" in text and "another node.id" in text
    assert (await live_nodes(client, prefix))[0] == {"7": NodeInfo("10.0.0.1", 9092)}  # unchanged
    # The same lease again (an answer lost to a timeout, retried) is accepted, same key.
    again = await register(client, prefix, "7", "10.0.0.1", 9092, a)
    assert again.create_revision == first.create_revision
    # Once the holder's lease ends (revoked here), the id is free.
    await a.close()
    taken = await register(client, prefix, "7", "10.0.0.2", 9092, b)
    assert (await live_nodes(client, prefix))[0] == {"7": NodeInfo("10.0.0.2", 9092)}
    assert not await first.close()  # the old registration never deletes its successor's key
    assert await taken.registered()
    await b.close()


def test_node_ids_are_checked() -> None:
    for bad in ("", "a/b", "x" * 65, "sp ace"):
        with pytest.raises(ValueError, match="node id"):
            node_key("/p", bad)
    assert node_key("/p/", "node-1.a_b") == b"/p/nodes/node-1.a_b"


NODE_PROCESS = """
import asyncio, sys
from etcd3aio import Etcd3Client
from coordinator.cluster.registry import register
from coordinator.runtime.etcd_store import NodeLease

async def main():
    endpoint, prefix = sys.argv[1], sys.argv[2]
    async with Etcd3Client([endpoint]) as c:
        lease = await NodeLease.grant(c, 2)
        await register(c, prefix, "crash", "127.0.0.1", 9999, lease)
        print("registered", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_killed_nodes_key_goes_when_its_lease_ends(client: Etcd3Client, prefix: str,
                                                          etcd_endpoint: str) -> None:  # noqa: F811
    proc = subprocess.Popen([sys.executable, "-c", NODE_PROCESS, etcd_endpoint, prefix],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=daemon_env(), cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), BOUND_S)
        assert line.strip() == b"registered", line + proc.stdout.read()
        async with NodeWatcher(client, prefix) as w:
            assert "crash" in w.nodes
            # While the process lives (its lease kept alive past the TTL), the id is taken.
            other = await NodeLease.grant(client, 30)
            with pytest.raises(NodeIdTaken):
                await register(client, prefix, "crash", "127.0.0.1", 1, other)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            await w.wait_for(lambda n: "crash" not in n, BOUND_S)
        assert (await live_nodes(client, prefix))[0] == {}
        await register(client, prefix, "crash", "127.0.0.1", 1, other)  # the id is free again
        await other.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_watch_etcd_cancelled_reads_the_list_again(client: Etcd3Client, prefix: str) -> None:
    """A watch from a revision etcd has compacted is cancelled by etcd; the watcher reads the
    range again and watches on from there, missing no change."""
    lease = await NodeLease.grant(client, 30)
    w = NodeWatcher(client, prefix, retry_s=0.05)
    # A view "at" an old revision, as after a long disconnection: then changes, then compaction.
    old = (await live_nodes(client, prefix))[1]
    w.revision = old
    await register(client, prefix, "a", "h", 1, lease)
    r = await register(client, prefix, "b", "h", 2, lease)
    await r.close()
    now = (await live_nodes(client, prefix))[1]
    await client.kv.compact(now)
    w._task = asyncio.create_task(w._run())  # watches from old + 1: compacted
    try:
        await w.wait_for(lambda n: n == {"a": NodeInfo("h", 1)}, BOUND_S)
        assert w.relists >= 1
        await register(client, prefix, "c", "h", 3, lease)  # and the new watch sees changes
        await w.wait_for(lambda n: set(n) == {"a", "c"}, BOUND_S)
    finally:
        await w.close()
        await lease.close()
