"""Connector offsets end to end, a real daemon over TCP: fenced commits, durability across a
kill -9 (file store) and on etcd, and the operators' CLI (``connectors offsets get|alter|reset``)
with its STOPPED rule and the ALTER ACL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire import connectors as shared
from connect_wire.apis import ApiKey
from connect_wire.errors import ErrorCode as E
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterOffsetsRequest,
    ConnectGroupCommitOffsetsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupFetchOffsetsRequest,
    ConnectGroupWriteTaskConfigsRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_alter_offsets_request_v0 as _alt
from connect_wire.messages import connect_group_commit_offsets_request_v0 as _com
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_write_task_configs_request_v0 as _wtc
from tests.daemon_fixture import Daemon, DaemonPool, run_cli, start_with_acls
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)
from tests.secure_server import Raw
from tests.test_daemon_e2e import Admin, Worker

LONG_SESSIONS = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "300000",
                 "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "3000"}


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def part(n: int) -> str:
    return json.dumps({"file": f"f{n}"}, sort_keys=True, separators=(",", ":"))


def off(n: int) -> str:
    return json.dumps({"line": n}, sort_keys=True, separators=(",", ":"))


def commit(w: Worker, pairs: list[tuple[str, str | None]], connector: str = "A", task: int = 0,
           epoch: int | None = None) -> Any:
    return w.client.call(ConnectGroupCommitOffsetsRequest(
        group_id=w.group, member_id=w.member_id, member_epoch=w.epoch if epoch is None else epoch,
        connector=connector, task=task,
        offsets=tuple(_com.PartitionOffset(partition=p, offset=o) for p, o in pairs)))


def fetched(admin: Admin, connector: str = "A") -> dict[str, str | None]:
    r = admin.client.call(ConnectGroupFetchOffsetsRequest(group_id=admin.group,
                                                          connector=connector, partitions=None))
    assert r.error_code == 0, r
    return {p.partition: p.offset for p in r.offsets}


def running_worker(d: Daemon, connectors: dict[str, int]) -> tuple[Admin, Worker]:
    admin = Admin(d)
    deadline = time.monotonic() + 30
    # (a node on etcd answers before it has taken all its partitions over: asked again)
    while (r := admin.alter(connectors)).error_code == E.COORDINATOR_LOAD_IN_PROGRESS \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.error_code == 0, r
    w = Worker(d, "W1")
    w.ok()
    items = [i for name, n in connectors.items() for i in (name, *(f"{name}/{t}" for t in range(n)))]
    w.compute({"W1": items})
    w.ok()
    assert w.epoch >= 1 and sorted(w.running) == sorted(items), w.running
    return admin, w


def cli(*args: str, ok: bool = True) -> Any:
    done = run_cli(*args)
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return done


def test_commits_survive_kill_9_and_the_cli_manages_them(tmp_path: Path, pool: DaemonPool) -> None:
    data = tmp_path / "data"
    d = pool.start(data, extra_env=LONG_SESSIONS)
    admin, w = running_worker(d, {"A": 1, "B": 1})
    assert commit(w, [(part(i), off(i)) for i in range(50)]).error_code == 0
    assert commit(w, [(part(0), None), (part(1), off(100))]).error_code == 0
    # fenced: a stale epoch, an unknown member, an item it does not own; nothing stored
    r = commit(w, [(part(99), off(1))], epoch=w.epoch - 1)
    assert r.error_code == E.STALE_MEMBER_EPOCH, r
    w2 = Worker(d, "nobody")
    w2.epoch = w.epoch
    assert commit(w2, [(part(99), off(1))]).error_code == E.UNKNOWN_MEMBER_ID
    assert commit(w, [(part(99), off(1))], task=5).error_code == E.ITEM_NOT_OWNED
    r = commit(w, [(part(99), "not json")])
    assert r.error_code == E.INVALID_REQUEST and "Offsets[0].Offset is not JSON" in r.error_message
    before = fetched(admin)
    assert len(before) == 49 and before[part(1)] == off(100) and part(99) not in before
    admin.close()
    w.close()
    w2.close()

    d.kill()  # kill -9: what was answered is on disk
    d = pool.start(data, extra_env=LONG_SESSIONS)
    admin = Admin(d)
    assert fetched(admin) == before
    spec = next(c for c in admin.describe().connectors if c.name == "A")
    assert spec.offset_count == 49

    boot = ("--bootstrap", d.bootstrap, "--group", "g")
    got = json.loads(cli("connectors", "offsets", "get", *boot, "A", "--json").stdout)
    assert got["offsets"][0] == {"partition": {"file": "f1"}, "offset": {"line": 100}}
    assert len(got["offsets"]) == 49
    text = cli("connectors", "offsets", "get", *boot, "B").stdout
    assert "has no committed offsets" in text
    assert '{"file":"f1"}' in cli("connectors", "offsets", "get", *boot, "A").stdout

    # alter/reset refused while the connector runs: exit 1, Kafka Connect's message
    patch = tmp_path / "patch.json"
    patch.write_text(json.dumps({"offsets": [
        {"partition": {"file": "f1"}, "offset": {"line": 7}},
        {"partition": {"file": "f2"}, "offset": None},
        {"partition": {"file": "new"}, "offset": {"line": 1}}]}))
    for action in (["alter", "--file", str(patch)], ["reset"]):
        done = cli("connectors", "offsets", action[0], *boot, "A", *action[1:], ok=False)
        assert done.returncode == 1
        assert "Connectors must be in the STOPPED state before their offsets can be modified" \
            in done.stderr
        assert "connect-coordinator connectors stop --group g A" in done.stderr
    assert fetched(admin) == before

    cli("connectors", "stop", *boot, "A")
    # W1 (its session outlived the kill) owns A's items and has not reported them stopped: its
    # tasks may still be stopping and commit. Asked again until --timeout, then the refusal.
    for action in (["alter", "--file", str(patch)], ["reset"]):
        done = cli("connectors", "offsets", action[0], *boot, "A", *action[1:], "--timeout", "1.5",
                   ok=False)
        assert done.returncode == 1 and "REBALANCE_IN_PROGRESS" in done.stderr, done.stderr
        assert "Connector 'A''s instances are still stopping on member(s) W1" in done.stderr
        # (the coordinator answered each time: its last answer, not "no answer within")
        assert done.stderr.startswith("connect-coordinator: REBALANCE_IN_PROGRESS: "), done.stderr
    assert fetched(admin) == before
    w = Worker(d, "W1")
    w.epoch = admin.members()["W1"][0]
    w.ok(instance_states=tuple(_hb.InstanceState(connector="A", task=t, state="STOPPED")
                               for t in (-1, 0)))
    w.close()
    out = cli("connectors", "offsets", "alter", *boot, "A", "--file", str(patch)).stdout
    assert "altered successfully (2 set, 1 removed)" in out
    after = fetched(admin)
    assert after[part(1)] == off(7) and part(2) not in after
    assert after['{"file":"new"}'] == off(1) and len(after) == 49
    bad = tmp_path / "bad.json"
    bad.write_text('{"offsets": [{"partition": "f1", "offset": {}}]}')
    done = cli("connectors", "offsets", "alter", *boot, "A", "--file", str(bad), ok=False)
    assert 'offsets[0] must be an object with a "partition" object' in done.stderr
    out = cli("connectors", "offsets", "reset", *boot, "A", "--json").stdout
    assert json.loads(out) == {"message": "The offsets for connector A have been reset successfully."}
    assert fetched(admin) == {}

    # delete then re-create: never the old offsets
    w = Worker(d, "W1")
    w.epoch = admin.members()["W1"][0]
    assert commit(w, [(part(5), off(5))], connector="B").error_code == 0
    assert admin.alter(deletes=["B"]).error_code == 0
    assert admin.alter({"B": 1}).error_code == 0
    assert fetched(admin, "B") == {}
    admin.close()
    w.close()


def test_alter_needs_alter_on_the_group(tmp_path: Path) -> None:
    with DaemonPool(tmp_path) as pool:
        d = start_with_acls(pool, tmp_path)
        plain = ("--bootstrap", d.address("PLAINTEXT"))
        cli("acls", "add", *plain, "--allow-principal", "User:ops", "--operation", "Describe",
            "--group", "g")
        cli("connectors", "create", *plain, "--group", "g", "A", "--tasks", "1",
            "--config", "connector.class=no.such.module:Task")
        cli("connectors", "stop", *plain, "--group", "g", "A")
        sasl = ("--bootstrap", d.address("SASL_PLAINTEXT"), "--security-protocol",
                "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "ops",
                "--sasl-password-file", str(tmp_path / "ops.pw"), "--group", "g")
        got = json.loads(cli("connectors", "offsets", "get", *sasl, "A", "--json").stdout)
        assert got == {"offsets": []}
        # a commit needs READ (as a heartbeat): DESCRIBE is not enough
        with Raw(d.listeners["SASL_PLAINTEXT"], timeout=30) as raw:
            assert raw.scram("ops", "ops-secret").error_code == 0
            r = raw.call(ApiKey.CONNECT_GROUP_COMMIT_OFFSETS, 0, ConnectGroupCommitOffsetsRequest(
                group_id="g", member_id="m", member_epoch=1, connector="A", task=0,
                offsets=(_com.PartitionOffset(partition=part(1), offset=off(1)),)))
            assert r.error_code == E.GROUP_AUTHORIZATION_FAILED and "READ" in r.error_message, r
        done = cli("connectors", "offsets", "reset", *sasl, "A", ok=False)
        assert done.returncode == 1
        assert "GROUP_AUTHORIZATION_FAILED" in done.stderr and "User:ops" in done.stderr
        assert "ALTER" in done.stderr
        cli("acls", "add", *plain, "--allow-principal", "User:ops", "--operation", "Alter",
            "--group", "g")
        assert "reset successfully" in cli("connectors", "offsets", "reset", *sasl, "A").stdout


def test_offsets_on_etcd_replay_after_a_restart_and_deletion_tombstones_them(
        tmp_path: Path, pool: DaemonPool, etcd_endpoint: str) -> None:  # noqa: F811
    prefix = f"/offsets-{time.time_ns()}"
    args = ["--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", prefix,
            "--node-id", "1", "--partitions", "2"]
    d = pool.start(tmp_path / "n1", extra_env=LONG_SESSIONS, extra_args=args)
    admin, w = running_worker(d, {"A": 1})
    for start in range(0, 300, 100):
        r = commit(w, [(part(i), off(i)) for i in range(start, start + 100)])
        assert r.error_code == 0, r
    r = commit(w, [(part(i), off(i)) for i in range(1000, 1200)])  # one etcd txn: 128 ops at most
    assert r.error_code == E.INVALID_REQUEST and "etcd.max.txn.ops" in r.error_message, r
    before = fetched(admin)
    assert len(before) == 300
    admin.close()
    w.close()
    d.stop()
    d = pool.start(tmp_path / "n1", extra_env=LONG_SESSIONS, extra_args=args)
    admin = Admin(d)
    deadline = time.monotonic() + 30
    while True:  # (the node takes its partitions over first)
        r = admin.client.call(ConnectGroupFetchOffsetsRequest(group_id="g", connector="A",
                                                              partitions=None))
        if r.error_code == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {p.partition: p.offset for p in r.offsets} == before
    # delete: 300 tombstones in bounded transactions, then a re-created A has none
    assert admin.alter(deletes=["A"]).error_code == 0
    assert admin.alter({"A": 1}).error_code == 0
    assert fetched(admin) == {}
    admin.close()
    d.stop()
    d = pool.start(tmp_path / "n1", extra_env=LONG_SESSIONS, extra_args=args)
    admin = Admin(d)
    deadline = time.monotonic() + 30
    while True:
        r = admin.client.call(ConnectGroupFetchOffsetsRequest(group_id="g", connector="A",
                                                              partitions=None))
        if r.error_code == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.error_code == 0 and r.offsets == ()
    admin.close()


def test_a_malformed_alter_file_is_named_without_a_traceback(tmp_path: Path) -> None:
    """The file is read before anything is sent: each malformed one gets a message naming the
    file (exit 1), never a Python traceback. (No daemon: the bootstrap is never dialled.)"""
    entry = '{"offsets":[{"partition":%s,"offset":%s}]}'
    cases = {
        "deep.json": ('{"offsets":' + "[" * 100_000 + "]" * 100_000 + "}").encode(),
        "deep-partition.json": (entry % ('{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "{}")).encode(),
        "surrogate.json": (entry % ('{"a":"\\ud800"}', '{"x":1}')).encode(),
        "infinity.json": (entry % ('{"a":1}', '{"x":1e999}')).encode(),
        "nan.json": (entry % ('{"a":1}', '{"x":NaN}')).encode(),
        "latin1.json": (entry % ('{"a":"\xff"}', '{"x":1}')).encode("latin-1"),
    }
    for name, data in cases.items():
        f = tmp_path / name
        f.write_bytes(data)
        done = run_cli("connectors", "offsets", "alter", "--bootstrap", "127.0.0.1:1",
                       "--group", "g", "A", "--file", str(f))
        assert done.returncode == 1, (name, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and str(f) in done.stderr, (name, done.stderr)


def tokens(admin: Admin, member_id: str) -> dict[tuple[str, int], int]:
    (m,) = [m for m in admin.describe().members if m.member_id == member_id]
    return {(t.connector, t.task): t.token for t in m.fencing_tokens}


def test_a_holder_of_a_deleted_connector_cannot_write_into_its_new_incarnation(
        pool: DaemonPool, tmp_path: Path) -> None:
    """A connector deleted and created again under the same name before its instances' holder
    heartbeats: that member still holds the items it was granted for the old connector (the
    item names are the same), at the same epoch. What its old instances commit (a task's
    stop() commits its last position) or write as task configs must not land in the new
    connector, which starts with no offsets: refused (ITEM_NOT_OWNED), nothing stored, until
    the member is granted the items of the new incarnation (a higher fencing token)."""
    d = pool.start(tmp_path / "data", extra_env=LONG_SESSIONS)
    admin, w = running_worker(d, {"A": 1, "B": 1})
    old = tokens(admin, w.member_id)
    assert commit(w, [(part(1), off(1))], connector="B").error_code == 0
    assert admin.alter(deletes=["B"]).error_code == 0
    assert admin.alter({"A": 1, "B": 1}).error_code == 0
    for task in (0, -1):
        r = commit(w, [(part(2), off(2))], connector="B", task=task)
        assert r.error_code == E.ITEM_NOT_OWNED, r
    r = w.client.call(ConnectGroupWriteTaskConfigsRequest(
        group_id="g", member_id=w.member_id, member_epoch=w.epoch, connector="B",
        task_configs=(_wtc.TaskConfig(config=()),)))
    assert r.error_code == E.ITEM_NOT_OWNED, r
    assert fetched(admin, "B") == {}
    spec = next(c for c in admin.describe().connectors if c.name == "B")
    assert spec.task_configs is None and spec.offset_count == 0
    # an assignment of the new connector computed before the holder's next heartbeat: it
    # keeps the items, and as it reconciles they become new grants (higher tokens)
    w.compute({"W1": ["A", "A/0", "B", "B/0"]})
    w.ok()
    assert sorted(w.running) == ["A", "A/0", "B", "B/0"], w.running
    new = tokens(admin, w.member_id)
    assert new[("B", 0)] > old[("B", 0)] and new[("A", 0)] == old[("A", 0)], (old, new)
    assert commit(w, [(part(3), off(3))], connector="B").error_code == 0
    assert fetched(admin, "B") == {part(3): off(3)}
    admin.close()
    w.close()


def test_fetch_offsets_answer_is_bounded_by_the_response_limit(
        pool: DaemonPool, tmp_path: Path) -> None:
    """A connector may hold more offsets than one answer should carry (100,000 partitions of
    up to a commit's 1 MiB each): FetchOffsets stops at request.max.response.bytes, as
    ConnectGroupDescribe does, with a message saying to fetch fewer partitions; nothing is
    lost, a smaller fetch still answers."""
    limit = 200_000
    d = pool.start(tmp_path / "data", extra_env={
        **LONG_SESSIONS, "CONNECT_COORDINATOR_REQUEST_MAX_RESPONSE_BYTES": str(limit)})
    admin, w = running_worker(d, {"A": 1})
    big = json.dumps({"x": "y" * 60_000})
    for i in range(4):
        assert commit(w, [(part(i), big)]).error_code == 0
    r = admin.client.call(ConnectGroupFetchOffsetsRequest(group_id="g", connector="A",
                                                          partitions=None))
    assert r.error_code == E.INVALID_REQUEST and not r.offsets, r.error_code
    assert "request.max.response.bytes=200000" in r.error_message, r.error_message
    r = admin.client.call(ConnectGroupFetchOffsetsRequest(group_id="g", connector="A",
                                                          partitions=(part(0), part(3))))
    assert r.error_code == 0 and [p.partition for p in r.offsets] == [part(0), part(3)], r
    done = cli("connectors", "offsets", "get", "--bootstrap", d.bootstrap, "--group", "g", "A",
               ok=False)
    assert "request.max.response.bytes" in done.stderr and "Traceback" not in done.stderr
    assert d.alive()
    admin.close()
    w.close()


def test_alter_right_after_stop_is_never_overwritten_by_a_stopping_tasks_last_commit(
        tmp_path: Path, pool: DaemonPool) -> None:
    """A real worker runs the bundled counter example, whose tasks commit their position once
    more from stop(). ``stop`` then ``offsets alter`` at once (one admin session, back to back):
    the alter used to land before the tasks' stop() commits, which then overwrote it. Now the
    coordinator refuses it (retriably) until the worker has reported the instances STOPPED, and
    the session asks again until then: the operator's offsets stay."""
    from coordinator.admin import AdminSession
    from tests.counter_harness import CONNECTOR, TASKS, CounterRun

    d = pool.start(tmp_path / "data")
    run = CounterRun(tmp_path, d.bootstrap, "g", lambda group: None)
    run.create(tasks=2, partitions=4)
    run.spawn("w1")
    try:
        run.wait(lambda: all(run.committed(i, 3) for i in TASKS), "the tasks to commit")
        with AdminSession([(d.host, d.port)], timeout_s=30) as session:
            (g,) = session.group_call("g", ConnectGroupDescribeRequest(group_ids=("g",))).groups
            spec = next(c for c in g.connectors if c.name == CONNECTOR)
            config = shared.state_config(shared.config_of(spec), "stop")
            stopped_at = time.time()
            r = session.group_call("g", ConnectGroupAlterConnectorsRequest(
                group_id="g", upserts=(_alter.ConnectorSpec(
                    name=CONNECTOR, task_count=spec.task_count,
                    config=tuple(_alter.ConfigEntry(name=k, value=v)
                                 for k, v in sorted(config.items()))),), validate_only=False))
            assert r.error_code == 0, r
            wanted = {p: 100_000 + p for p in range(4)}
            r = session.group_call("g", ConnectGroupAlterOffsetsRequest(
                group_id="g", connector=CONNECTOR, reset=False, validate_only=False,
                offsets=tuple(_alt.PartitionOffset(partition=shared.canonical({"partition": p}),
                                                   offset=shared.canonical({"seq": s}))
                              for p, s in wanted.items())),
                retry=frozenset({int(E.REBALANCE_IN_PROGRESS)}))
            assert r.error_code == 0, r
        # Each task's stop() committed (now before the alter was taken; it used to be after) ...
        run.wait(lambda: all(run.committed(i, 1, since=stopped_at) for i in TASKS),
                 "the tasks' stop() commits")
        # ... and nothing overwrote the operator's offsets.
        assert run.offsets() == wanted, run.logs()
    finally:
        run.stop_all()
