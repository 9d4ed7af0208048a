"""Fencing tokens and task configs against the real daemon, over TCP (file store).

A raw member (:class:`RawMember`: heartbeats, PrepareAssignment and InstallAssignment by
hand) plays the workers, so each token and each answer is checked as the wire carries it:

* the heartbeat's Assignment carries a fencing token for every assigned item, Describe shows
  the same; ``kill -9`` of the daemon and a restart on its data dir: the tokens held go on,
  and an item that moves afterwards gets a token above every token given before;
* ConnectGroupWriteTaskConfigs (10005) from the connector's owner is stored (Describe shows it,
  the running task count follows) and survives the restart; each bad request gets its precise
  error, nothing is stored and the daemon goes on serving.

The etcd store's failover is in tests/test_cluster_e2e.py (its module's etcd).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire.errors import ErrorCode as E
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupWriteTaskConfigsRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from connect_wire.messages import connect_group_write_task_configs_request_v0 as _wtc
from coordinator.admin import AdminClient
from tests.daemon_fixture import Daemon, DaemonPool, run_cli
from tests.group_harness import assignor

Call = Callable[[Any], Any]
LONG_SESSION = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "60000"}
"""(the raw members heartbeat only between the test's steps, some of them CLI processes)"""


def item_text(connector: str, task: int) -> str:
    return connector if task < 0 else f"{connector}/{task}"


class RawMember:
    """One member of ``group`` driven by hand through ``call`` (a request -> its response)."""

    def __init__(self, call: Call, group: str, member_id: str) -> None:
        self.call, self.group, self.member_id = call, group, member_id
        self.epoch = 0
        self.owned: list[str] = []
        self.tokens: dict[str, int] = {}

    def heartbeat(self, join: bool = False) -> Any:
        connectors = tuple(i for i in self.owned if "/" not in i)
        tasks = tuple(_hb.TaskId(connector=i.rsplit("/", 1)[0], task=int(i.rsplit("/", 1)[1]))
                      for i in self.owned if "/" in i)
        r = self.call(ConnectGroupHeartbeatRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=0 if join else self.epoch,
            rebalance_timeout_ms=30_000, client_assignors=(assignor(),),
            owned_connectors=connectors, owned_tasks=tasks))
        assert r.error_code == 0, r
        self.epoch = r.member_epoch
        a = r.assignment
        if a is not None:
            self.owned = sorted([*a.connectors, *(item_text(t.connector, t.task) for t in a.tasks)])
            self.tokens = {item_text(t.connector, t.task): t.token for t in a.fencing_tokens}
            assert sorted(self.tokens) == self.owned, (self.tokens, self.owned)
        return r

    def compute(self, assignment: dict[str, list[str]]) -> None:
        p = self.call(ConnectGroupPrepareAssignmentRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch))
        assert p.error_code == 0, p
        members = tuple(_inst.MemberAssignment(
            member_id=mid, connectors=tuple(i for i in its if "/" not in i),
            tasks=tuple(_inst.TaskId(connector=i.rsplit("/", 1)[0], task=int(i.rsplit("/", 1)[1]))
                        for i in its if "/" in i),
            metadata_version=0, metadata_bytes=b"") for mid, its in assignment.items())
        r = self.call(ConnectGroupInstallAssignmentRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch,
            group_epoch=p.group_epoch, error=0, assignor_state=b"",
            scheduled_rebalance_delay_ms=-1, members=members))
        assert r.error_code == 0, r

    def write_task_configs(self, connector: str, configs: list[dict[str, str | None]],
                           epoch: int | None = None, member_id: str | None = None) -> Any:
        return self.call(ConnectGroupWriteTaskConfigsRequest(
            group_id=self.group, member_id=self.member_id if member_id is None else member_id,
            member_epoch=self.epoch if epoch is None else epoch, connector=connector,
            task_configs=tuple(_wtc.TaskConfig(config=tuple(
                _wtc.ConfigEntry(name=k, value=v) for k, v in c.items())) for c in configs)))


def settle(members: list[RawMember], assignment: dict[str, list[str]], rounds: int = 8) -> None:
    """Heartbeat until every member runs exactly its part of ``assignment``."""
    for _ in range(rounds):
        for m in members:
            m.heartbeat()
        if all(m.owned == sorted(assignment[m.member_id]) for m in members):
            return
    raise AssertionError({m.member_id: m.owned for m in members})


def alter(call: Call, group: str, connectors: dict[str, int]) -> None:
    r = call(ConnectGroupAlterConnectorsRequest(group_id=group, upserts=tuple(
        _alter.ConnectorSpec(name=n, task_count=t, config=(_alter.ConfigEntry(name="k", value="v"),))
        for n, t in connectors.items()), deletes=(), validate_only=False))
    assert r.error_code == 0, r


def describe(call: Call, group: str) -> Any:
    """The group's describe, each member's last heartbeat age left out (it is the time since its
    last heartbeat: two describes a moment apart differ by it)."""
    (g,) = call(ConnectGroupDescribeRequest(group_ids=(group,))).groups
    assert g.error_code == 0, g
    return dataclasses.replace(g, members=tuple(
        dataclasses.replace(m, last_heartbeat_ms_ago=-1) for m in g.members))


def described_tokens(g: Any) -> dict[str, dict[str, int]]:
    return {m.member_id: {item_text(t.connector, t.task): t.token for t in m.fencing_tokens}
            for m in g.members}


def task_configs_of(g: Any, connector: str) -> list[dict[str, str | None]] | None:
    spec = next(c for c in g.connectors if c.name == connector)
    if spec.task_configs is None:
        return None
    return [{e.name: e.value for e in t.config} for t in spec.task_configs]


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def cli(*args: str) -> str:
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def client_of(d: Daemon) -> AdminClient:
    return AdminClient(d.host, d.port, timeout_s=10)


def test_tokens_and_task_configs_over_tcp_survive_a_kill_9(pool: DaemonPool, tmp_path: Path) -> None:
    data = tmp_path / "data"
    d = pool.start(data, short_timeouts=False, extra_env=LONG_SESSION)
    with client_of(d) as c:
        alter(c.call, "g", {"src": 3})
        w1 = RawMember(c.call, "g", "w1")
        w1.heartbeat(join=True)
        w1.compute({"w1": ["src", "src/0", "src/1", "src/2"]})
        settle([w1], {"w1": ["src", "src/0", "src/1", "src/2"]})
        first = dict(w1.tokens)
        assert len(set(first.values())) == 4
        assert described_tokens(describe(c.call, "g")) == {"w1": first}
        assert task_configs_of(describe(c.call, "g"), "src") is None
        # The connector's owner writes two task configs: the running count becomes 2.
        r = w1.write_task_configs("src", [{"table": "a"}, {"table": "b"}])
        assert (r.error_code, r.changed) == (0, True), r
        assert task_configs_of(describe(c.call, "g"), "src") == [{"table": "a"}, {"table": "b"}]
        w1.heartbeat()
        w1.compute({"w1": ["src", "src/0", "src/1"]})
        settle([w1], {"w1": ["src", "src/0", "src/1"]})
        assert {i: w1.tokens[i] for i in w1.owned} == {i: first[i] for i in w1.owned}
        r = w1.write_task_configs("src", [{"table": "a"}, {"table": "b"}])  # the same again
        assert (r.error_code, r.changed) == (0, False), r
        # What the operator sees: the running and configured task counts, each item's token.
        b = ("--bootstrap", d.bootstrap)
        (g,) = json.loads(cli("groups", "describe", "g", "--json", *b))
        (spec,) = g["connectors"]
        assert (spec["tasks"], spec["running_tasks"]) == (3, 2)
        assert spec["task_configs"] == [{"table": "a"}, {"table": "b"}]
        assert g["members"][0]["fencing_tokens"] == w1.tokens
        text = cli("groups", "describe", "g", *b)
        assert any(line.split() == ["src", "2", "(of", "3", "configured)"]
                   for line in text.splitlines()), text
        assert any(line.split() == ["w1", "src/1", str(w1.tokens["src/1"])]
                   for line in text.splitlines()), text
        st = json.loads(cli("connectors", "status", "--group", "g", "src", "--json", *b))
        assert (st["running_tasks"], st["configured_tasks"]) == (2, 3)
        assert [t["task"] for t in st["tasks"]] == [0, 1]
        assert st["fencing_token"] == w1.tokens["src"]
        assert [t["fencing_token"] for t in st["tasks"]] == [w1.tokens["src/0"], w1.tokens["src/1"]]
        text = cli("connectors", "status", "--group", "g", "src", *b)
        assert text.splitlines()[0] == "CONNECTOR src  tasks=2 (of 3 configured)", text
        assert "TOKEN" in text.splitlines()[1] and str(w1.tokens["src/0"]) in text
        w1.heartbeat()
    d.kill()
    d = pool.start(data, short_timeouts=False, extra_env=LONG_SESSION)
    with client_of(d) as c:
        w1.call = c.call
        g = describe(c.call, "g")
        assert task_configs_of(g, "src") == [{"table": "a"}, {"table": "b"}]
        assert described_tokens(g) == {"w1": {i: first[i] for i in w1.owned}}  # held: kept
        w1.heartbeat()
        # A second member: src/1 moves to it, with a token above every token given before.
        w2 = RawMember(c.call, "g", "w2")
        w2.heartbeat(join=True)
        w1.heartbeat()
        w1.compute({"w1": ["src", "src/0"], "w2": ["src/1"]})
        settle([w1, w2], {"w1": ["src", "src/0"], "w2": ["src/1"]})
        assert w2.tokens["src/1"] > max(first.values())
        assert w1.tokens == {"src": first["src"], "src/0": first["src/0"]}
        # w2 does not own the connector: refused, nothing stored.
        r = w2.write_task_configs("src", [{"table": "z"}])
        assert r.error_code == E.ITEM_NOT_OWNED and "does not own src" in r.error_message
        assert task_configs_of(describe(c.call, "g"), "src") == [{"table": "a"}, {"table": "b"}]


def test_bad_task_configs_get_precise_errors_and_change_nothing(pool: DaemonPool) -> None:
    d = pool.start(short_timeouts=False, extra_env=LONG_SESSION)
    with client_of(d) as c:
        alter(c.call, "g", {"src": 2, "other": 0})
        w1 = RawMember(c.call, "g", "w1")
        w1.heartbeat(join=True)
        w1.compute({"w1": ["src", "src/0", "src/1", "other"]})
        settle([w1], {"w1": ["other", "src", "src/0", "src/1"]})
        before = describe(c.call, "g")
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({"member_id": "ghost"}, E.UNKNOWN_MEMBER_ID, "ghost is not a member"),
            ({"epoch": w1.epoch - 1}, E.STALE_MEMBER_EPOCH, "older than"),
            ({"epoch": w1.epoch + 5}, E.FENCED_MEMBER_EPOCH, "newer than"),
            ({"connector": "nope"}, E.INVALID_REQUEST, "Connector nope does not exist"),
            ({"configs": [{}, {}, {}]}, E.INVALID_REQUEST, "3 task configs for connector src"),
            ({"configs": [{"": "x"}]}, E.INVALID_REQUEST, "non-empty and unique"),
            ({"connector": ""}, E.INVALID_REQUEST, "Connector must be non-empty"),
        ]
        for overrides, code, text in cases:
            args: dict[str, Any] = {"connector": "src", "configs": [{"a": "1"}]} | overrides
            r = w1.write_task_configs(**args)
            assert (r.error_code, r.changed) == (code, False), (overrides, r)
            assert text in (r.error_message or ""), (overrides, r.error_message)
            assert describe(c.call, "g") == before
        # The daemon is unharmed: the owner's write goes through.
        r = w1.write_task_configs("src", [{"a": "1"}])
        assert (r.error_code, r.changed) == (0, True), r
    assert d.alive()
