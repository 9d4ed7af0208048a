"""Attacks on the etcd cluster with real processes that held up (review of the
several-nodes change): acknowledged admin writes survive owners being killed and stopped under
concurrent writers, and a cluster SIGTERMed all at once restarts with its state intact.

Three real ``connect-coordinator serve --store etcd`` nodes on a real etcd (tests/etcd_fixture),
the harness of tests/test_cluster_e2e.py.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
from coordinator.admin import AdminError, AdminSession, OutcomeUnknown
from coordinator.cli import _alter
from tests.daemon_fixture import DaemonFailed
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)
from tests.test_cluster_e2e import Cluster, cluster  # noqa: F401 (fixture)


def _start(c: Cluster, i: int) -> None:
    """Start node ``i``; after a kill -9 its old registration lingers up to the lease TTL."""
    deadline = time.monotonic() + 20
    while True:
        try:
            c.start(i)
            return
        except DaemonFailed as exc:
            if "already registered" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _session(c: Cluster, timeout_s: float = 15) -> AdminSession:
    return AdminSession([("127.0.0.1", p) for p in c.ports.values()], timeout_s=timeout_s)


def _connectors(c: Cluster, group: str) -> dict[str, tuple[int, tuple[tuple[str, str], ...]]]:
    with _session(c) as s:
        (d,) = s.group_call(group, ConnectGroupDescribeRequest(group_ids=(group,))).groups
    assert d.error_code in (0, 69), d  # 69: GROUP_ID_NOT_FOUND
    return {x.name: (x.task_count, tuple((e.name, e.value) for e in x.config)) for x in d.connectors}


def test_acknowledged_creates_survive_owners_killed_and_stopped_under_load(cluster: Cluster) -> None:  # noqa: F811
    """One writer per node's group creates connectors back to back (each acknowledged one
    recorded) while node 1 is SIGKILLed, node 2 SIGTERMed, both restarted, then node 3
    SIGKILLed and restarted: every acknowledged create is there afterwards, nothing answered
    with an error is there, and nothing else is there but creates of unknown outcome."""
    c = cluster
    c.partitions = 8
    c.start_all()
    groups = [c.group_owned_by(i) for i in (1, 2, 3)]
    stop = threading.Event()
    results: dict[str, dict[str, list[Any]]] = {}

    def writer(group: str) -> None:
        res = results[group] = {"acked": [], "unknown": [], "error": []}
        n = 0
        while not stop.is_set():
            name = f"c{n}"
            n += 1
            spec = _alter.ConnectorSpec(name=name, task_count=1, config=())
            req = ConnectGroupAlterConnectorsRequest(group_id=group, upserts=(spec,),
                                                     validate_only=False)
            try:
                with _session(c) as s:
                    r = s.group_call(group, req, resend_if_lost=False)
                (res["acked"] if r.error_code == 0 else res["error"]).append(name)
            except (OutcomeUnknown, AdminError):  # broken connection, or gave up: unknown
                res["unknown"].append(name)

    threads = [threading.Thread(target=writer, args=(g,), daemon=True) for g in groups]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)
        c.nodes[1].kill()
        time.sleep(1.0)
        c.nodes[2].proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)
        _start(c, 1)
        c.nodes[2].proc.wait(20)
        _start(c, 2)
        time.sleep(1.0)
        c.nodes[3].kill()
        time.sleep(2.0)
        _start(c, 3)
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    for g in groups:
        present = set(_connectors(c, g))
        r = results[g]
        assert len(r["acked"]) > 50, (g, {k: len(v) for k, v in r.items()})
        assert not [n for n in r["acked"] if n not in present], g
        assert not [n for n in r["error"] if n in present], (g, r["error"])
        assert present <= set(r["acked"]) | set(r["unknown"]), g


def test_every_node_sigtermed_at_once_then_restarted_keeps_every_group(cluster: Cluster,  # noqa: F811
                                                                        etcd_endpoint: str  # noqa: F811
                                                                        ) -> None:
    """200 groups over 8 partitions; the owner of the most partitions is SIGKILLed (every one
    of its groups answers again elsewhere, unchanged), then all nodes get SIGTERM at the same
    moment (a cluster shutdown: each exits 0, nothing is left owned in etcd), and all start
    again: every group is exactly as before."""
    c = cluster
    c.partitions = 8
    c.start_all()
    groups = [f"grp-{k}" for k in range(200)]
    with _session(c) as s:
        for k, g in enumerate(groups):
            specs = tuple(_alter.ConnectorSpec(
                name=f"c{j}", task_count=j + 1,
                config=(_alter.ConfigEntry(name="k", value=str(k)),)) for j in range(3))
            r = s.group_call(g, ConnectGroupAlterConnectorsRequest(
                group_id=g, upserts=specs, validate_only=False), resend_if_lost=False)
            assert r.error_code == 0, r
    before = {g: _connectors(c, g) for g in groups}
    owners = [c.coordinator_of(g) for g in groups]
    victim = max(set(owners), key=owners.count)
    c.nodes[victim].kill()
    assert {g: _connectors(c, g) for g in groups} == before
    for d in c.nodes.values():
        if d.alive():
            d.proc.send_signal(signal.SIGTERM)
    for i, d in c.nodes.items():
        if i != victim:
            assert d.proc.wait(30) == 0, d.stderr()[-3000:]
    for i in c.ports:
        _start(c, i)
    c.wait(lambda: c.owned_everywhere(), "every partition owned again")
    assert {g: _connectors(c, g) for g in groups} == before
    for d in c.nodes.values():
        text = d.stderr()
        assert "Traceback" not in text, text[-3000:]
