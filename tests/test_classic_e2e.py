"""Classic Kafka Connect workers (kafka-python 3.x's BaseCoordinator, tests/classic_worker.py)
in a connect group, against a real daemon, in both ``sessioned`` and ``default`` modes, mixed
with real ``connect-worker`` processes, and rolling migrations classic -> new -> classic. Every
worker records each start and stop with a timestamp in one file (the recording plugin's
format); the analyzer of tests/test_worker_e2e.py proves no item ever ran on two workers at
once, and the group is checked to converge: every item running exactly once, where the
coordinator says."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire import classic_connect as cc
from tests.daemon_fixture import ROOT, DaemonPool, daemon_env, run_cli
from tests.test_worker_e2e import Cluster, configured_items

SESSION_MS = 4000
CONVERGE_S = 40.0


class Mixed(Cluster):
    """The cluster of tests/test_worker_e2e.py plus classic workers (dynamic members)."""

    def spawn_classic(self, name: str, mode: str,
                      instance_id: str | None = None) -> subprocess.Popen[bytes]:
        self.spawned += 1
        cmd = [sys.executable, "-m", "tests.classic_worker", "--bootstrap", self.daemon.bootstrap,
               "--group", "e2e", "--name", name, "--mode", mode, "--record", str(self.records),
               "--session-timeout-ms", str(SESSION_MS), "--heartbeat-interval-ms", "300",
               "--rebalance-timeout-ms", "10000", "--status", str(self.base / f"{name}.json"),
               *(["--instance-id", instance_id] if instance_id else [])]
        log = self.base / f"worker-{name}-{self.spawned}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    env=daemon_env(), cwd=ROOT)
        self.procs[name] = proc
        return proc

    def name_of(self, m: Any) -> str:
        if m.instance_id:
            return str(m.instance_id)
        # a classic worker's URL is http://<name>:8083 (its worker metadata)
        return str(m.worker_url).split("//", 1)[1].split(":", 1)[0]

    expected: set[str] | None = None
    """The configured items (default: those of tests/test_worker_e2e.py's connectors)."""

    def converge(self, workers: set[str], what: str) -> dict[str, str]:
        """Stable with exactly ``workers``; every item in one assignment; the records show each
        item running on exactly the process of the worker the coordinator names."""
        deadline = time.monotonic() + CONVERGE_S
        expected = self.expected or configured_items()
        why = "not polled"
        while True:
            g = self.describe()
            owner: dict[str, str] = {}
            dupes = set()
            for m in g.members:
                for i in {*m.assignment.connectors,
                          *(f"{t.connector}/{t.task}" for t in m.assignment.tasks)}:
                    if i in owner:
                        dupes.add(i)
                    owner[i] = self.name_of(m)
            names = {self.name_of(m) for m in g.members}
            running = self.timeline().running()
            if g.group_state != "Stable":
                why = f"group {g.group_state}"
            elif names != workers:
                why = f"members {sorted(names)}"
            elif dupes or set(owner) != expected:
                why = f"dupes {dupes} missing {sorted(expected - set(owner))}"
            elif set(running) != expected:
                why = f"not running per the records: {sorted(expected - set(running))}"
            elif bad := {i: [(iv.worker, iv.pid) for iv in ivs] for i, ivs in running.items()
                         if [iv.pid for iv in ivs] != [self.pid(owner[i])]}:
                why = f"records disagree with the coordinator: {bad}"
            else:
                return owner
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: no convergence within {CONVERGE_S}s: {why}\n"
                                     f"{self.logs(tail=2000)}")
            time.sleep(0.1)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args[:2], "--bootstrap", self.daemon.bootstrap, *args[2:])

    def status(self, name: str) -> dict[str, Any]:
        return dict(json.loads((self.base / f"{name}.json").read_text()))


@pytest.fixture
def mixed(tmp_path: Path) -> Iterator[Mixed]:
    env = {"CONNECT_COORDINATOR_GROUP_CONNECT_CLASSIC_MAX_DELAY_MS": "0"}
    with DaemonPool(tmp_path) as pool:
        c = Mixed(tmp_path, pool.start(extra_env=env))
        try:
            c.create_connectors()
            yield c
        finally:
            c.close()


def test_classic_workers_sessioned_and_default_share_the_work(mixed: Mixed) -> None:
    mixed.spawn_classic("c1", "sessioned")
    owner = mixed.converge({"c1"}, "one classic worker")
    assert set(owner.values()) == {"c1"}
    s = mixed.status("c1")
    assert s["protocol"] == "sessioned" and s["version"] == 2 and s["leader"] == s["member_id"]
    mixed.spawn_classic("c2", "default")
    owner = mixed.converge({"c1", "c2"}, "two classic workers")
    counts = sorted(list(owner.values()).count(w) for w in ("c1", "c2"))
    assert counts[1] - counts[0] <= 1, owner
    assert mixed.status("c2")["protocol"] == "default" and mixed.status("c2")["version"] == 0
    g = mixed.describe()
    assert g.assignor_name == "incremental"  # computed by the coordinator: classic members only
    # c1 leaves (SIGTERM: stops its work, LeaveGroup): c2 gets everything at once
    mixed.terminate("c1")
    owner = mixed.converge({"c2"}, "c1 left")
    assert set(owner.values()) == {"c2"}
    mixed.assert_safe()


def test_classic_and_new_protocol_workers_mixed_then_rolling_migration(mixed: Mixed) -> None:
    mixed.spawn_classic("c1", "sessioned")
    mixed.spawn_classic("c2", "default")
    mixed.converge({"c1", "c2"}, "classic group")
    # classic -> new, one worker at a time: a connect-worker joins, a classic one leaves
    mixed.spawn("n1")
    owner = mixed.converge({"c1", "c2", "n1"}, "mixed group")
    assert {"c1", "c2", "n1"} == set(owner.values())
    mixed.terminate("c2")
    mixed.converge({"c1", "n1"}, "c2 gone")
    mixed.spawn("n2")
    mixed.converge({"c1", "n1", "n2"}, "n2 joined")
    t0 = time.time()
    mixed.terminate("c1")
    owner = mixed.converge({"n1", "n2"}, "classic -> new done")
    # only c1's items moved: nothing the new workers ran was stopped
    stopped = {e["item"] for e in mixed.timeline().between(t0, event="stop")
               if e["worker"] in ("n1", "n2")}
    assert not stopped, stopped
    # new -> classic, one worker at a time
    mixed.spawn_classic("c3", "sessioned")
    mixed.converge({"n1", "n2", "c3"}, "c3 joined")
    mixed.terminate("n1")
    mixed.converge({"n2", "c3"}, "n1 gone")
    mixed.spawn_classic("c4", "default")
    mixed.converge({"n2", "c3", "c4"}, "c4 joined")
    mixed.terminate("n2")
    owner = mixed.converge({"c3", "c4"}, "new -> classic done")
    assert set(owner.values()) == {"c3", "c4"}
    mixed.assert_safe()


def test_describe_groups_and_list_groups_show_classic_members(mixed: Mixed) -> None:
    from kafka import KafkaAdminClient
    from kio.schema.describe_groups.v5.request import DescribeGroupsRequest

    from coordinator.admin import AdminClient

    mixed.spawn_classic("c1", "sessioned")
    mixed.spawn("n1")
    owner = mixed.converge({"c1", "n1"}, "mixed")
    admin = KafkaAdminClient(bootstrap_servers=mixed.daemon.bootstrap, request_timeout_ms=5000)
    try:
        listed = {g["group_id"]: (g["protocol_type"], g["group_state"])
                  for g in admin.list_groups()}
    finally:
        admin.close()
    # (kafka-python's describe_groups decodes every member's metadata as the consumer
    # protocol's and fails on Connect's, as it would against Kafka: the raw answer here)
    with AdminClient(mixed.daemon.host, mixed.daemon.port, timeout_s=5) as c:
        (g,) = c.call(DescribeGroupsRequest(groups=("e2e",),
                                            include_authorized_operations=False)).groups
    described = {"protocol_type": g.protocol_type, "group_state": g.group_state,
                 "members": [{"client_id": m.client_id, "member_metadata": m.member_metadata,
                              "member_assignment": m.member_assignment} for m in g.members]}
    assert listed == {"e2e": ("connect", "Stable")}
    assert described["protocol_type"] == "connect" and described["group_state"] == "Stable"
    members = {m["client_id"]: m for m in described["members"]}
    classic = members["c1"]  # (the classic worker's client id is its name)
    meta = cc.decode_metadata(bytes(classic["member_metadata"]))
    assert meta.url == "http://c1:8083" and meta.version == 2
    runs = {i for i, w in owner.items() if w == "c1"}
    assignment = cc.decode_assignment(bytes(classic["member_assignment"]))
    assert {str(i) for i in assignment.assigned_items()} == runs
    new = next(m for cid, m in members.items() if cid != "c1")
    assert not new["member_metadata"] and not new["member_assignment"]
    # the operator's CLI marks each member's protocol
    r = mixed.cli("groups", "describe", "e2e", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (group,) = doc
    protocols = sorted((m["protocol"], m["classic_protocol"]) for m in group["members"])
    assert protocols == [("classic", "sessioned"), ("new", None)]
    text = mixed.cli("groups", "describe", "e2e").stdout
    assert "classic:sessioned" in text and " new " in text


def test_sigkill_of_a_classic_worker_hands_its_work_over_after_the_hold(mixed: Mixed) -> None:
    mixed.spawn_classic("c1", "sessioned")
    mixed.spawn("n1")
    mixed.converge({"c1", "n1"}, "mixed")
    had = {i for i, ivs in mixed.timeline().running().items() for iv in ivs if iv.worker == "c1"}
    assert had
    killed = mixed.kill("c1")
    owner = mixed.converge({"n1"}, "c1 fenced")
    assert set(owner.values()) == {"n1"}
    t = mixed.assert_safe()  # (c1's intervals end at its kill)
    # what c1 ran started on n1 only after c1 was dead (and its session and hold ran out)
    moved = [iv for iv in t.intervals if iv.worker == "n1" and iv.item in had]
    assert {iv.item for iv in moved} == had and all(iv.start >= killed for iv in moved)


def test_sigterm_is_clean(mixed: Mixed) -> None:
    proc = mixed.spawn_classic("c1", "default")
    mixed.converge({"c1"}, "one")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_classic_members_survive_a_coordinator_restart(tmp_path: Path) -> None:
    from tests.test_worker_e2e import _free_port

    port = _free_port()
    env = {"CONNECT_COORDINATOR_GROUP_CONNECT_CLASSIC_MAX_DELAY_MS": "0"}
    args = ["--listen", f"127.0.0.1:{port}"]
    with DaemonPool(tmp_path) as pool:
        c = Mixed(tmp_path, pool.start(tmp_path / "data", extra_env=env, extra_args=args))
        try:
            c.create_connectors()
            c.spawn_classic("c1", "sessioned")
            c.spawn_classic("c2", "default")
            owner = c.converge({"c1", "c2"}, "classic group")
            before = {m.member_id: (m.member_epoch, m.classic_protocol) for m in c.describe().members}
            t0 = time.time()
            assert c.daemon.stop() == 0
            c.daemon = pool.start(tmp_path / "data", extra_env=env, extra_args=args)
            after = c.converge({"c1", "c2"}, "after the restart")
            # the same members, epochs and protocols: nobody had to rejoin, nothing moved
            assert {m.member_id: (m.member_epoch, m.classic_protocol)
                    for m in c.describe().members} == before
            assert after == owner
            # and they go on heartbeating to the new process past their session timeout
            time.sleep(SESSION_MS / 1000 * 1.5)
            assert c.converge({"c1", "c2"}, "a session later") == owner
            assert {m.member_id: (m.member_epoch, m.classic_protocol)
                    for m in c.describe().members} == before
            assert not c.timeline().between(t0, event="stop")
            c.assert_safe()
        finally:
            c.close()


def test_static_members_replaced_across_protocols(mixed: Mixed) -> None:
    """A new process with a static member's instance id replaces it, whatever protocol either
    speaks: classic -> new (the classic one was killed: classic static members never leave)
    and new -> classic (the connect-worker left statically with SIGTERM)."""
    mixed.spawn_classic("s1", "sessioned", instance_id="s1")
    mixed.spawn("s2")
    owner = mixed.converge({"s1", "s2"}, "two static members")
    classic_items = {i for i, w in owner.items() if w == "s1"}
    killed = mixed.kill("s1")
    mixed.spawn("s1")  # a connect-worker with the instance id: replaces the classic member
    owner = mixed.converge({"s1", "s2"}, "s1 replaced by a new-protocol process")
    g = mixed.describe()
    assert {m.instance_id: m.classic_protocol for m in g.members} == {"s1": None, "s2": None}
    assert {i for i, w in owner.items() if w == "s1"} == classic_items  # it took over the work
    t = mixed.assert_safe()
    assert all(iv.start >= killed for iv in t.intervals
               if iv.item in classic_items and iv.pid == mixed.pid("s1"))
    mixed.terminate("s2")  # a static leave: s2's items wait for its instance
    mixed.spawn_classic("s2", "default", instance_id="s2")
    owner = mixed.converge({"s1", "s2"}, "s2 replaced by a classic process")
    g = mixed.describe()
    assert {m.instance_id: m.classic_protocol for m in g.members} == {"s1": None, "s2": "default"}
    mixed.assert_safe()


def test_rolling_migration_both_ways_under_load(tmp_path: Path) -> None:
    """30 tasks, four workers; each step replaces one worker by one of the other protocol
    while the others keep running: after each step, what an untouched worker of an incremental
    protocol runs ran on through the step without a stop, and nothing ever ran twice."""
    load = {"alpha": 12, "beta": 10, "gamma": 8}
    env = {"CONNECT_COORDINATOR_GROUP_CONNECT_CLASSIC_MAX_DELAY_MS": "0"}
    with DaemonPool(tmp_path) as pool:
        c = Mixed(tmp_path, pool.start(extra_env=env))
        c.expected = configured_items(load)
        try:
            c.create_connectors(load)
            workers = {"c1": "sessioned", "c2": "default", "c3": "sessioned", "c4": "sessioned"}
            for name, mode in workers.items():
                c.spawn_classic(name, mode)
            c.converge(set(workers), "four classic workers")
            live = set(workers)
            steps = [("c1", "n1"), ("c2", "n2"), ("c3", "n3"), ("c4", "n4"),  # classic -> new
                     ("n1", "k1"), ("n2", "k2"), ("n3", "k3"), ("n4", "k4")]  # new -> classic
            for old, new in steps:
                t0 = time.time()
                c.terminate(old)
                live.discard(old)
                if new.startswith("n"):
                    c.spawn(new)
                else:
                    c.spawn_classic(new, "default" if new == "k2" else "sessioned")
                live.add(new)
                after = c.converge(set(live), f"{old} -> {new}")
                # an untouched worker of an incremental protocol stopped only what moved
                for w in live - {new}:
                    if w in ("c2", "k2"):
                        continue  # (eager: it restarts everything at every rebalance)
                    # (what it runs after the step ran on without a stop; the departing
                    # worker's items may pass through it before the newcomer's join)
                    stopped = {e["item"] for e in c.timeline().between(t0, event="stop")
                               if e["worker"] == w}
                    assert not (stopped & {i for i, x in after.items() if x == w}), (w, stopped)
            c.assert_safe()
        finally:
            c.close()
