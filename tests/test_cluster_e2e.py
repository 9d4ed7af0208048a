"""Issue 12 end to end: several coordinator nodes on a real etcd, real worker processes.

Every test runs real ``connect-coordinator serve --store etcd`` processes (three nodes, their
own ports kept across restarts) against the real etcd of ``tests/etcd_fixture.py`` (each test
under its own ``etcd.prefix``), and two real ``connect-worker`` processes running the recording
plugin (ticking every 50 ms), bootstrapped with every node's address. What is checked comes
from the plugin's records: no item ever ran on two workers at once, and no instance was stopped
or started again during the coordinator's trouble (the workers ride through it). Lease TTL 2 s,
the workers' session 10 s (the coordinator's default).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
)
from coordinator.admin import AdminClient
from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env, run_cli
from tests.etcd_fixture import (  # noqa: F401 (fixtures)
    EtcdCluster,
    etcd_cluster,
    etcd_endpoint,
    etcd_server,
    free_port,
)
from tests.tcp_proxy import TcpProxy
from tests.test_worker_e2e import Timeline, analyze

PLUGIN = "worker_client.examples.recording:RecordingConnector"
GROUP = "busy"
SESSION_MS = 10_000
DEFAULTS_ENV = {  # the README's defaults: session 10 s, heartbeat 3 s, lease TTL 3 s
    "CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": str(SESSION_MS),
}
NODE_ENV = {
    "CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": str(SESSION_MS),
    "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "500",
    "CONNECT_COORDINATOR_ETCD_LEASE_TTL_MS": "2000",
    "CONNECT_COORDINATOR_ETCD_LEASE_MARGIN_MS": "500",
}


class Cluster:
    """Three coordinator nodes (ids 1-3) on one etcd prefix, workers, the plugin's records."""

    def __init__(self, base: Path, pool: DaemonPool, endpoint: str, prefix: str,
                 nodes: int = 3, partitions: int = 6) -> None:
        self.base, self.pool, self.endpoint, self.prefix = base, pool, endpoint, prefix
        self.partitions = partitions
        self.ports = {i: free_port() for i in range(1, nodes + 1)}
        self.nodes: dict[int, Daemon] = {}
        self.via: dict[int, str] = {}
        """Node -> the etcd address it is given (a TcpProxy's, to cut it off)."""
        self.records = base / "records.jsonl"
        self.records.touch()
        self.env = NODE_ENV
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.ended: dict[int, tuple[float, str]] = {}

    # -- coordinator nodes ----------------------------------------------------------------------
    def start(self, i: int) -> Daemon:
        d = self.pool.start(self.base / f"node{i}", extra_env=self.env, extra_args=[
            "--listen", f"127.0.0.1:{self.ports[i]}", "--store", "etcd",
            "--etcd-endpoints", self.via.get(i, self.endpoint), "--etcd-prefix", self.prefix,
            "--node-id", str(i), "--partitions", str(self.partitions)])
        self.nodes[i] = d
        return d

    def start_all(self) -> None:
        for i in self.ports:
            self.start(i)
        self.wait(lambda: self.owned_everywhere(), "every partition owned by a live node")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def live(self) -> list[int]:
        return [i for i, d in self.nodes.items() if d.alive()]

    def call(self, i: int, request: Any) -> Any:
        with AdminClient("127.0.0.1", self.ports[i], timeout_s=3) as c:
            return c.call(request)

    def coordinator_of(self, group: str, ask: int | None = None) -> int | None:
        """The node id FindCoordinator names for ``group`` (asked of a live node), or None."""
        from connect_wire.apis import APIS, ApiKey
        req = APIS[ApiKey.FIND_COORDINATOR].request_class(4)(key_type=0, coordinator_keys=(group,))
        for i in ([ask] if ask else self.live()):
            try:
                (c,) = self.call(i, req).coordinators
            except Exception:  # noqa: BLE001 (a node going away: ask another)
                continue
            if c.error_code == 0:
                return int(c.node_id)
            # COORDINATOR_NOT_AVAILABLE: that node does not know (moving, or it is cut off
            # from etcd): ask another one, as the clients do.
        return None

    def owned_everywhere(self) -> bool:
        """Every live node names a live owner for every partition's groups, and agrees."""
        groups = [f"probe-{k}" for k in range(40)]
        live = set(self.live())
        for i in live:
            for g in groups:
                owner = self.coordinator_of(g, ask=i)
                if owner not in live:
                    return False
        return True

    def describe(self, group: str) -> Any:
        node = self.coordinator_of(group)
        if node is None:
            return None
        (g,) = self.call(node, ConnectGroupDescribeRequest(group_ids=(group,))).groups
        return g if g.error_code == 0 else None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args[:2], "--bootstrap", self.bootstrap, *args[2:])

    # -- workers --------------------------------------------------------------------------------
    def group_owned_by(self, node: int) -> str:
        """A group name whose partition ``node`` owns now."""
        for k in range(10_000):
            if self.coordinator_of(f"{GROUP}-{k}") == node:
                return f"{GROUP}-{k}"
        raise AssertionError(f"node {node} owns no partition")

    def create(self, name: str, tasks: int, group: str = GROUP) -> None:
        r = self.cli("connectors", "create", "--group", group, name, "--tasks", str(tasks),
                     "--config", f"connector.class={PLUGIN}", "--config",
                     f"record.file={self.records}", "--config", "tick.ms=50")
        assert r.returncode == 0, r.stderr

    def spawn(self, name: str, group: str = GROUP) -> None:
        cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", self.bootstrap,
               "--group", group, "--instance-id", name, "--session-timeout-ms", str(SESSION_MS),
               "--rebalance-timeout-ms", "4000", "--max-delay-ms", "0"]
        with open(self.base / f"worker-{name}.log", "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    env=daemon_env(), cwd=ROOT)
        self.workers[name] = proc

        def watch() -> None:
            code = proc.wait()
            self.ended[proc.pid] = (time.time(), "exit" if code == 0 else "kill")
        threading.Thread(target=watch, daemon=True).start()

    def timeline(self) -> Timeline:
        lines = self.records.read_text().splitlines()
        return analyze([json.loads(line) for line in lines if line.strip()], dict(self.ended))

    def steady(self, items: int, group: str = GROUP) -> bool:
        """Every item runs on exactly one live worker and the group shows it as assigned."""
        g = self.describe(group)
        if g is None or len(g.members) != len(self.workers):
            return False
        assigned = [x for m in g.members for x in (*m.assignment.connectors,
                                                   *(f"{t.connector}/{t.task}" for t in m.assignment.tasks))]
        if len(assigned) != items or len(set(assigned)) != items:
            return False
        running = self.timeline().running()
        return len(running) == items and all(len(ivs) == 1 for ivs in running.values())

    def log(self, name: str) -> str:
        return (self.base / f"worker-{name}.log").read_text(errors="replace")

    def wait(self, cond: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- worker {n}\n{self.log(n)[-2500:]}" for n in self.workers)
                nodes = "\n".join(f"--- node {i}\n{d.stderr()[-2500:]}" for i, d in self.nodes.items())
                raise AssertionError(f"timed out waiting for {what}\n{logs}\n{nodes}")
            time.sleep(0.1)

    def assert_rode_through(self, since: float) -> None:
        """No overlap ever; no instance stopped or started since ``since``; workers alive."""
        t = self.timeline()
        assert not t.problems, t.problems
        assert not t.overlaps(), t.overlaps()
        moved = [e for e in t.between(since) if e.get("event") in ("start", "stop")
                 and not str(e.get("item", "")).startswith("post")]
        assert not moved, f"instances stopped or started during the coordinator's trouble: {moved}"
        for name, proc in self.workers.items():
            assert proc.poll() is None, f"worker {name} exited:\n{self.log(name)[-3000:]}"

    def close(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for d in self.nodes.values():
            if d.alive():
                with_sigcont(d)


def with_sigcont(d: Daemon) -> None:
    try:
        d.proc.send_signal(signal.SIGCONT)
    except ProcessLookupError:
        pass


_counter = iter(range(1_000_000))


@pytest.fixture
def cluster(tmp_path: Path, etcd_endpoint: str) -> Iterator[Cluster]:  # noqa: F811
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool, etcd_endpoint, f"/cluster-e2e-{next(_counter)}-{time.time_ns()}")
        try:
            yield c
        finally:
            c.close()


def busy_group(c: Cluster, tasks: int = 6) -> float:
    """Start the nodes, one connector with ``tasks`` tasks and two workers; wait for steady.
    Returns the instant (time.time()) from which nothing may stop or start."""
    c.start_all()
    c.create("rec", tasks)
    c.spawn("w1")
    c.spawn("w2")
    c.wait(lambda: c.steady(tasks + 1), "the group to settle")
    time.sleep(1.0)  # a few heartbeats at the settled epoch
    return time.time()


def test_discovery_lists_every_node_and_names_the_owner(cluster: Cluster) -> None:
    """Metadata lists every live node; FindCoordinator names the partition's owner on every
    node; the others answer NOT_COORDINATOR for that group; ListGroups per node lists only its
    own groups while ``groups list`` merges all of them."""
    c = cluster
    c.start_all()
    from connect_wire.apis import APIS, ApiKey
    meta = c.call(1, APIS[ApiKey.METADATA].request_class(1)(topics=()))
    assert sorted((b.node_id, b.port) for b in meta.brokers) == sorted(
        (i, p) for i, p in c.ports.items())
    groups = [f"g{k}" for k in range(12)]
    for g in groups:
        r = c.cli("connectors", "create", "--group", g, "c", "--tasks", "1",
                  "--config", "connector.class=pkg:Source")
        assert r.returncode == 0, r.stderr
    owners = {g: c.coordinator_of(g, ask=1) for g in groups}
    assert {c.coordinator_of(g, ask=i) for g in groups for i in (2, 3)} <= set(c.ports)
    assert all(c.coordinator_of(g, ask=i) == owners[g] for g in groups for i in (2, 3))
    assert len(set(owners.values())) > 1, owners  # spread over the nodes
    for g, owner in owners.items():
        other = next(i for i in c.ports if i != owner)
        (d,) = c.call(other, ConnectGroupDescribeRequest(group_ids=(g,))).groups
        assert d.error_code == ErrorCode.NOT_COORDINATOR, (g, owner, other, d)
        (d,) = c.call(owner, ConnectGroupDescribeRequest(group_ids=(g,))).groups
        assert d.error_code == 0 and [x.name for x in d.connectors] == ["c"]
    per_node = {}
    for i in c.ports:
        resp = c.call(i, APIS[ApiKey.LIST_GROUPS].request_class(4)(states_filter=()))
        assert resp.error_code == 0
        per_node[i] = {g.group_id for g in resp.groups}
    for i, listed in per_node.items():
        assert listed == {g for g, o in owners.items() if o == i}
    r = c.cli("groups", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert {g["group"] if "group" in g else g["group_id"] for g in json.loads(r.stdout)} >= set(groups)
    # groups describe names each group's coordinating node (asked through one bootstrap node).
    r = c.cli("groups", "describe", *groups, "--json")
    assert r.returncode == 0, r.stderr
    assert {d["group"]: d["coordinator"] for d in json.loads(r.stdout)} == {
        g: {"node_id": o, "host": "127.0.0.1", "port": c.ports[o]} for g, o in owners.items()}
    r = c.cli("groups", "describe", *groups)
    for g, o in owners.items():
        assert f"GROUP {g} " in r.stdout and f"coordinator: node {o} at 127.0.0.1:{c.ports[o]}" \
            in r.stdout.split(f"GROUP {g} ")[1].split("GROUP ")[0], r.stdout


@pytest.mark.parametrize("defaults", [False, True], ids=["short-timeouts", "defaults"])
def test_kill_9_of_the_owner_moves_the_group_and_stops_nothing(cluster: Cluster,
                                                                defaults: bool) -> None:
    """``kill -9`` of the node that owns a busy group: the group answers on another node after
    the lease TTL, no task runs twice, no worker stops a task, and a change acknowledged just
    before the kill is there afterwards. Also with every default (heartbeat interval 3 s,
    lease TTL 3 s): the failover fits in what the worker's lease leaves."""
    c = cluster
    if defaults:
        c.env = DEFAULTS_ENV
    busy_group(c)
    owner = c.coordinator_of(GROUP)
    assert owner is not None
    c.create("acked", 1, group=GROUP)  # acknowledged: must survive the owner's death
    c.wait(lambda: c.steady(6 + 1 + 2), "the acknowledged connector to run")
    since = time.time()
    c.nodes[owner].kill()
    c.wait(lambda: c.coordinator_of(GROUP) not in (None, owner), "another node to take the group")
    new_owner = c.coordinator_of(GROUP)
    # The workers reach the new owner: a connector created there starts on one of them.
    c.create("post", 1)
    c.wait(lambda: c.steady(6 + 1 + 2 + 2), "the workers to run what the new owner assigns")
    time.sleep(2.0)
    c.assert_rode_through(since)
    g = c.describe(GROUP)
    assert sorted(x.name for x in g.connectors) == ["acked", "post", "rec"]
    assert new_owner != owner


def test_sigterm_rolling_restart_of_every_node_moves_no_task(cluster: Cluster) -> None:
    """Graceful restarts of all three nodes in turn (SIGTERM: hand over, then start again with
    the same id and port): no instance stops or starts, nothing runs twice."""
    c = cluster
    since = busy_group(c)
    for i in list(c.ports):
        c.nodes[i].stop()
        c.wait(lambda: c.steady(7), f"the group to be served without node {i}")
        c.start(i)
        c.wait(lambda: c.owned_everywhere() and len(c.live()) == 3, f"node {i} back")
        c.wait(lambda: c.steady(7), f"the group to be served after node {i} came back")
    time.sleep(1.0)
    c.assert_rode_through(since)


@pytest.mark.parametrize("defaults", [False, True], ids=["short-timeouts", "defaults"])
def test_a_frozen_node_answers_nothing_for_the_partitions_it_lost(cluster: Cluster,
                                                                  defaults: bool) -> None:
    """SIGSTOP the owner past its lease: another node takes the group over; woken with SIGCONT,
    the old owner answers nothing from its old state for that group (NOT_COORDINATOR, or it
    names the new owner) -- and nothing ran twice, nothing stopped meanwhile: the workers give
    up the silent node's connection and find the new owner (also with every default)."""
    c = cluster
    if defaults:
        c.env = DEFAULTS_ENV
    since = busy_group(c)
    owner = c.coordinator_of(GROUP)
    assert owner is not None
    frozen = c.nodes[owner]
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        c.wait(lambda: c.coordinator_of(GROUP, ask=next(i for i in c.live() if i != owner))
               not in (None, owner), "another node to take the group")
        # The workers reach the new owner: a connector created there starts on one of them.
        c.create("post", 1)
        c.wait(lambda: c.steady(9), "the workers to reach the new owner")
        member = c.describe(GROUP).members[0]
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    # At once after waking: a heartbeat as a member would send it, and a describe.
    hb = c.call(owner, ConnectGroupHeartbeatRequest(
        group_id=GROUP, member_id=member.member_id, member_epoch=member.member_epoch))
    assert hb.error_code == ErrorCode.NOT_COORDINATOR, hb
    (d,) = c.call(owner, ConnectGroupDescribeRequest(group_ids=(GROUP,))).groups
    assert d.error_code == ErrorCode.NOT_COORDINATOR, d
    c.wait(lambda: "partition lost" in frozen.stderr() or "lease lost" in frozen.stderr(),
           "the woken node to log the loss", timeout_s=20)
    time.sleep(1.0)
    c.assert_rode_through(since)


def test_a_node_cut_off_from_etcd_stops_answering_before_another_can_own_its_groups(
        cluster: Cluster, etcd_server: Any) -> None:  # noqa: F811
    """Node 1 reaches etcd through a proxy that the test cuts (a network partition: the
    workers still reach node 1, node 1 cannot renew its lease). Node 1 must stop answering
    for its groups before another node can own them: polled every 20 ms, its last answer with
    the group's state came before any other node named a new owner. The workers ride
    through: nothing stops or starts, nothing runs twice."""
    c = cluster
    proxy = TcpProxy("127.0.0.1", etcd_server.client_port)
    try:
        c.via[1] = proxy.address
        c.start_all()
        group = c.group_owned_by(1)
        c.create("rec", 4, group=group)
        for w in ("w1", "w2"):
            c.spawn(w, group=group)
        c.wait(lambda: c.steady(5, group), "the group to settle")
        time.sleep(1.0)
        since = time.time()
        answers: list[tuple[float, int]] = []  # node 1's describe answers
        named: list[tuple[float, int | None]] = []  # node 2's FindCoordinator answers
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                try:
                    (d,) = c.call(1, ConnectGroupDescribeRequest(group_ids=(group,))).groups
                    answers.append((time.monotonic(), d.error_code))
                except Exception:  # noqa: BLE001 (a timeout counts as no answer)
                    pass
                named.append((time.monotonic(), c.coordinator_of(group, ask=2)))
                time.sleep(0.02)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        proxy.cut()
        c.wait(lambda: any(n not in (None, 1) for _, n in named), "another node to own the group")
        c.create("post", 1, group=group)
        c.wait(lambda: c.steady(7, group), "the workers to reach the new owner")
        proxy.heal()
        time.sleep(1.0)
        stop.set()
        poller.join(10)
        taken = min(t for t, n in named if n not in (None, 1))
        served = [t for t, code in answers if code == 0]
        refused = [t for t, code in answers if code == ErrorCode.NOT_COORDINATOR]
        assert served and refused, (len(served), len(refused))
        # Node 1 kept answering while its lease was certainly valid, then stopped -- before
        # any other node owned the group (and it never served it again afterwards).
        first_refusal = min(refused)
        assert max(t for t in served if t < taken) < first_refusal < taken
        assert not [t for t in served if t > first_refusal and t < taken]
        c.assert_rode_through(since)
    finally:
        proxy.close()


def test_the_etcd_leader_killed_under_a_busy_cluster_writes_resume(
        tmp_path: Path, etcd_cluster: EtcdCluster) -> None:  # noqa: F811
    """Two coordinator nodes on a 3-member etcd cluster (every node given every member); the
    etcd leader is SIGKILLed while the workers run: writes resume (a connector created after
    the kill is stored and starts on a worker), nothing stops or runs twice, and the killed
    member rejoins."""
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool, ",".join(etcd_cluster.endpoints),
                    f"/cluster-e2e-leader-{time.time_ns()}", nodes=2)
        try:
            since = busy_group(c)
            leader = etcd_cluster.leader()
            assert leader is not None
            etcd_cluster.kill(leader)
            c.create("post", 1)  # a write after the kill: acknowledged once etcd took it
            c.wait(lambda: c.steady(6 + 1 + 2), "the new connector to run")
            etcd_cluster.restart(leader)
            c.create("post2", 1)
            c.wait(lambda: c.steady(6 + 1 + 4), "the second new connector to run")
            time.sleep(1.0)
            c.assert_rode_through(since)
            g = c.describe(GROUP)
            assert sorted(x.name for x in g.connectors) == ["post", "post2", "rec"]
        finally:
            c.close()


def test_kafka_admin_clients_find_every_group_across_the_nodes(cluster: Cluster) -> None:
    """Kafka's own admin clients against three nodes, bootstrapped with ONE node's address:
    kafka-python's ``list_groups`` (it asks every broker Metadata lists) and
    ``describe_groups`` (FindCoordinator per group), and aiokafka's
    ``list_consumer_groups`` / ``describe_consumer_groups``, see the groups of every node."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from kafka import KafkaAdminClient

    c = cluster
    c.start_all()
    groups = [f"k{k}" for k in range(9)]
    for g in groups:
        r = c.cli("connectors", "create", "--group", g, "c", "--tasks", "1",
                  "--config", "connector.class=pkg:Source")
        assert r.returncode == 0, r.stderr
    owners = {c.coordinator_of(g) for g in groups}
    assert len(owners) > 1, owners
    first = f"127.0.0.1:{c.ports[1]}"
    kafka = KafkaAdminClient(bootstrap_servers=first, client_id="kp-cluster", request_timeout_ms=5000)
    try:
        assert {g["group_id"] for g in kafka.list_groups()} == set(groups)
        described = kafka.describe_groups(groups)
        assert all(described[g]["error"] is None and described[g]["group_state"] == "Empty"
                   for g in groups), described
    finally:
        kafka.close()

    async def aio() -> tuple[set[str], dict[str, int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=first, request_timeout_ms=5000)
        await admin.start()
        try:
            listed = {g[0] for g in await admin.list_consumer_groups()}
            # One group per call: aiokafka 0.14.0 decodes DescribeGroups v3 answers with the
            # v2 schema (DescribeGroupsRequest_v3.RESPONSE_TYPE), which misreads an answer of
            # two or more groups from any broker, Kafka's included (v3 adds a field per group).
            errors = {}
            for g in groups:
                for r in await admin.describe_consumer_groups([g]):
                    errors.update({d[1]: int(d[0]) for d in r.groups})
            return listed, errors
        finally:
            await admin.close()
    listed, errors = asyncio.run(aio())
    assert listed == set(groups)
    assert errors == {g: 0 for g in groups}


def _gauges(d: Daemon, name: str) -> dict[str, float]:
    """A node's gauge series: labels (joined) -> value, scraped from its /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    assert d.metrics_url is not None
    with urllib.request.urlopen(d.metrics_url, timeout=5) as r:
        text = r.read().decode()
    return {",".join(s.labels.values()): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_a_partition_handed_over_leaves_no_gauge_series_behind(cluster: Cluster) -> None:
    """connect_coordinator_log_bytes (and the other per-partition gauges) kept the series of
    partitions a node had handed over (12/8/4 series while each node owned 4), so their sum
    over the nodes, as checked against etcd's quota, counted partitions twice."""
    c = cluster
    c.start(1)
    c.wait(lambda: len(_gauges(c.nodes[1], "connect_coordinator_log_bytes")) == c.partitions,
           "node 1 owns every partition")
    c.start(2)
    c.start(3)
    c.wait(lambda: c.owned_everywhere() and all(
        _gauges(c.nodes[i], "connect_coordinator_partitions")["active"] == 2 for i in c.ports),
        "each node owns two partitions")
    for name in ("connect_coordinator_log_bytes", "connect_coordinator_event_queue_size",
                 "connect_coordinator_held_items", "connect_coordinator_thread_idle_ratio"):
        series = {i: set(_gauges(c.nodes[i], name)) for i in c.ports}
        assert all(len(s) == 2 for s in series.values()), (name, series)
        assert set().union(*series.values()) == {str(p) for p in range(c.partitions)}, series


def test_every_line_a_node_logs_is_json_the_lease_lines_too(cluster: Cluster,
                                                             etcd_server: Any) -> None:  # noqa: F811
    """Under the JSON log format (the default) a node cut off from etcd logs its lease's
    trouble ("keep-alive failed", "lost: no renewal within its TTL"), written by modules and
    libraries logging through the standard library: they were plain text lines among the
    JSON ones. Every line parses as JSON now, the lease's among them, naming its logger."""
    c = cluster
    proxy = TcpProxy("127.0.0.1", etcd_server.client_port)
    try:
        c.via[1] = proxy.address
        c.start(1)
        c.wait(c.owned_everywhere, "node 1 owns every partition")
        proxy.cut()
        c.wait(lambda: "keep-alive failed" in c.nodes[1].stderr(), "the lease's keep-alive to fail")
        proxy.heal()
        c.wait(c.owned_everywhere, "node 1 back")
    finally:
        proxy.close()
    lines = [line for line in c.nodes[1].stderr().splitlines() if line.strip()]
    plain = []
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            plain.append(line)
    assert not plain, plain[:5]
    lease = [p for p in parsed if "keep-alive failed" in p["event"]]
    assert lease and all(p["logger"] == "coordinator.etcd_store" and p["level"] == "warning"
                         for p in lease), lease


def test_fencing_tokens_and_task_configs_survive_a_node_failover(cluster: Cluster) -> None:
    """``kill -9`` of the node owning a group (etcd store): the group's task configs are there
    on the new owner, the tokens held go on, and an item moved afterwards gets a token above
    every token given before (the new owner's counter starts at the ceiling in etcd)."""
    from tests.test_task_configs_e2e import (
        RawMember,
        alter,
        describe,
        described_tokens,
        settle,
        task_configs_of,
    )
    c = cluster
    c.start(1)
    c.start(2)
    c.wait(lambda: c.owned_everywhere(), "every partition owned by a live node")
    group = c.group_owned_by(1)

    def call(request: Any) -> Any:
        return c.call(c.coordinator_of(group) or 1, request)

    alter(call, group, {"src": 2})
    w1 = RawMember(call, group, "w1")
    w1.heartbeat(join=True)
    w1.compute({"w1": ["src", "src/0", "src/1"]})
    settle([w1], {"w1": ["src", "src/0", "src/1"]})
    first = dict(w1.tokens)
    r = w1.write_task_configs("src", [{"table": "a"}, {"table": "b"}])
    assert (r.error_code, r.changed) == (0, True), r
    c.nodes[1].kill()
    c.wait(lambda: c.coordinator_of(group) == 2, "node 2 to take the group")
    c.wait(lambda: c.describe(group) is not None, "the group to answer on node 2")
    g = describe(call, group)
    assert task_configs_of(g, "src") == [{"table": "a"}, {"table": "b"}]
    assert described_tokens(g) == {"w1": first}
    w1.heartbeat()
    w2 = RawMember(call, group, "w2")
    w2.heartbeat(join=True)
    w1.heartbeat()
    w1.compute({"w1": ["src", "src/0"], "w2": ["src/1"]})
    settle([w1, w2], {"w1": ["src", "src/0"], "w2": ["src/1"]})
    assert w2.tokens["src/1"] > max(first.values())
    assert w1.tokens == {"src": first["src"], "src/0": first["src/0"]}
