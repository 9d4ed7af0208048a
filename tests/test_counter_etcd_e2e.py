"""The counter example through a coordinator node failover on etcd, with real processes.

Two ``connect-coordinator serve --store etcd`` nodes on the real etcd of
``tests/etcd_fixture.py`` (lease TTL 2 s, session 3 s, heartbeat interval 300 ms) and two
``connect-worker`` processes (session 3 s) running ``worker_client.examples.counter`` (2 tasks,
4 source partitions, a write and a commit every 50 ms). At one instant the node that owns the
group's partition and the worker running ``counts/0`` are both ``kill -9``'d: the other node
loads the group and its offsets from etcd, and ``counts/0`` resumes on the other worker from
the offsets the *new* node serves, at least the last commit the dead worker saw acknowledged by
the dead node. Every task that (re)started meanwhile resumed at least at its last acknowledged
commit; the sink agrees (rows up to the offset untouched, the next one the new holder's), and
after every worker stopped, its rows are 1..offset in every partition.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.counter_harness import TASKS, CounterRun
from tests.daemon_fixture import DaemonPool
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)
from tests.test_cluster_e2e import Cluster

NODE_ENV = {
    "CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "3000",
    "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "300",
    "CONNECT_COORDINATOR_ETCD_LEASE_TTL_MS": "2000",
    "CONNECT_COORDINATOR_ETCD_LEASE_MARGIN_MS": "500",
}


@pytest.fixture
def cluster(tmp_path: Path, etcd_endpoint: str) -> Iterator[Cluster]:  # noqa: F811
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool, etcd_endpoint, f"/counter-e2e-{time.time_ns()}", nodes=2)
        c.env = NODE_ENV
        try:
            yield c
        finally:
            c.close()


def test_a_node_failover_keeps_every_acknowledged_commit(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    c.start_all()
    group = c.group_owned_by(1)
    run = CounterRun(tmp_path, c.bootstrap, group, c.describe)
    try:
        run.create(tasks=2, partitions=4)
        run.spawn("w1", session_ms=3000)
        run.spawn("w2", session_ms=3000)
        owner = run.settle({"w1", "w2"})
        victim = owner["counts/0"]
        heir = "w2" if victim == "w1" else "w1"
        moved = [i for i in TASKS if owner[i] == victim]
        c.nodes[1].kill()
        killed = run.kill(victim)
        acked = {i: run.last_acked(i, killed) for i in TASKS}
        assert all(acked.values()), acked
        c.wait(lambda: c.coordinator_of(group) == 2, "node 2 to own the group", timeout_s=30)
        stored = run.offsets()
        for item in TASKS:  # every acknowledged commit is on the new node
            assert all(stored.get(p, 0) >= seq for p, seq in acked[item].items()), (item, acked, stored)
        for item in moved:
            run.wait(lambda i=item: run.events("resume", i, run.pid(heir), since=killed),
                     f"{item} to resume on {heir}", timeout_s=30)
        run.wait(lambda: all(run.committed(i, 3, pid=run.pid(heir), since=killed) for i in TASKS),
                 f"{heir} to commit every task")
        for item in TASKS:
            # Whatever started since the kill (the moved tasks; the heir's own ones too if the
            # failover outlasted its lease) resumed at least at the last acknowledged commit.
            for e in run.events("resume", item, since=killed):
                assert all(e["positions"][p] >= seq for p, seq in acked[item].items()), (item, e, acked)
        for item in moved:
            (*_, event) = run.events("resume", item, run.pid(heir), since=killed)
            run.assert_resumed_exactly(item, run.pid(heir), event["positions"], acked[item])
        run.stop_all()
        run.assert_final()
    finally:
        run.stop_all()
