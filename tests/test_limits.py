"""Limits of issue 11: writes that can never fit the log's batch limit (item 7), the number of
groups a daemon hosts and the cardinality of its metrics (item 12).

The core's rules are tested on the pure state machine (the harness checks invariants and
replay equality after every step); the runtime's backstop on a real shard and log; what a
client sees over TCP on the real daemon.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connect_wire.errors import ErrorCode as E
from connect_wire.errors import is_retriable
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.admin import AdminClient
from coordinator.group import records as rec
from coordinator.group.config import ConfigError, GroupCoordinatorConfig
from coordinator.group.model import ConnectorSpec
from coordinator.metrics import Metrics
from coordinator.runtime import serde
from coordinator.runtime.log import DEFAULT_MAX_BATCH_BYTES, FsyncPolicy, _encode_batch
from coordinator.runtime.shard import Shard
from coordinator.store.file import FileStore
from tests.daemon_fixture import Daemon, DaemonPool
from tests.group_harness import Harness, assignor

MiB = 1024 * 1024


@pytest.fixture
def pool(tmp_path: Path) -> Iterable[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def alter_request(group_id: str, upserts: dict[str, tuple[int, dict[str, str]]] | None = None,
                  deletes: Iterable[str] = (), validate_only: bool = False) -> Any:
    return ConnectGroupAlterConnectorsRequest(
        group_id=group_id,
        upserts=tuple(
            _alter.ConnectorSpec(name=name, task_count=tasks, config=tuple(
                _alter.ConfigEntry(name=k, value=v) for k, v in config.items()))
            for name, (tasks, config) in (upserts or {}).items()),
        deletes=tuple(deletes), validate_only=validate_only)


def join_request(group_id: str, member_id: str = "") -> Any:
    return ConnectGroupHeartbeatRequest(
        group_id=group_id, member_id=member_id, member_epoch=0, rebalance_timeout_ms=30_000,
        client_assignors=(assignor(),), owned_connectors=(), owned_tasks=())


# == item 7: the batch limit, in the core ==============================================================


def test_batch_bytes_is_the_logs_exact_size() -> None:
    """The core's size of a batch of records equals what the log writes for it (serde + log
    framing), for every record type the core emits."""
    h = Harness()
    h.alter({"A": 3, "Bé": 1}, configs={"A": {"topics": "t" * 300, "x": None}})
    h.join("W1", worker_url="http://w1")
    h.compute({"W1": ["A", "A/0", "A/1", "A/2", "Bé", "Bé/0"]})
    h.join("W2")
    h.advance(60_000)  # sessions expire: tombstones, holds
    records = list(h.log)
    assert len(records) > 10 and any(r.value is None for r in records)
    for chunk in (records[:1], records[:7], records):
        encoded = _encode_batch(0, 0, [serde.encode_record(r) for r in chunk])
        assert rec.batch_bytes(chunk) == len(encoded)
    specs = list(h.group().connectors.values())
    record = rec.group_connectors("g", 3, specs)
    assert rec.connectors_log_bytes("g", specs) == rec.batch_bytes([record])


def test_alter_connectors_configs_beyond_the_batch_limit_are_refused() -> None:
    """A connectors record that could never be written is refused when it is asked for, with a
    non-retriable error saying which limit and by how much; nothing is written."""
    h = Harness(GroupCoordinatorConfig(max_batch_bytes=64 * 1024))
    assert h.alter({"A": 1}, configs={"A": {"big": "x" * 30_000}}).error_code == 0
    before = (len(h.log), dict(h.group().connectors))
    r = h.alter({"B": 1}, configs={"B": {"big": "y" * 40_000}})
    assert r.error_code == E.INVALID_REQUEST and not is_retriable(r.error_code)
    assert "batch limit of 65,536 bytes" in r.error_message, r.error_message
    # (B would get an incarnation: a tagged int64 in the record)
    wanted = [*h.group().connectors.values(),
              ConnectorSpec("B", 1, (("big", "y" * 40_000),), incarnation=1)]
    items = rec.assignment_bytes(wanted)
    over = max(rec.connectors_log_bytes("g", wanted) + items, 2 * items) - 65_536
    assert f"{over:,} bytes over" in r.error_message, r.error_message
    assert (len(h.log), dict(h.group().connectors)) == before
    # validate_only reports the same; a new group is refused the same way (and not created).
    r = h.apply(h.coordinator.alter_connectors(
        alter_request("g", {"B": (1, {"big": "y" * 40_000})}, validate_only=True), h.now))
    assert r.error_code == E.INVALID_REQUEST and "batch limit" in r.error_message
    r = h.apply(h.coordinator.alter_connectors(
        alter_request("new", {"C": (0, {"big": "z" * 70_000})}), h.now))
    assert r.error_code == E.INVALID_REQUEST and "batch limit" in r.error_message
    assert h.group("new") is None
    # What fits is accepted, and a group above a lowered limit may still shrink.
    assert h.alter({"B": 1}, configs={"B": {"big": "y" * 20_000}}).error_code == 0
    h.coordinator.config = GroupCoordinatorConfig(max_batch_bytes=16 * 1024)  # a restart
    assert h.alter(deletes=["A"]).error_code == 0
    r = h.alter({"B": 2}, configs={"B": {"big": "y" * 20_000}})  # no smaller: refused
    assert r.error_code == E.INVALID_REQUEST and "batch limit of 16,384 bytes" in r.error_message


def test_alter_connectors_items_beyond_the_batch_limit_are_refused() -> None:
    """A connector's tasks each carry its name in every assignment record: a long name times
    many tasks makes assignments that could never be written (the connectors record alone is
    small). Refused at AlterConnectors, so no heartbeat or install ever meets it."""
    h = Harness(GroupCoordinatorConfig(max_batch_bytes=64 * 1024))
    name = "n" * 1000
    r = h.alter({name: 70})
    assert r.error_code == E.INVALID_REQUEST, r
    assert "assignment" in r.error_message and "batch limit of 65,536 bytes" in r.error_message
    assert h.group() is None
    # Two assignments of every item must fit one batch (a rejoin writes a member's current
    # assignment, then its reconciliation writes it again; each item there carries its fencing
    # token too): 20 tasks pass the first bound only.
    r = h.alter({name: 20})
    assert r.error_code == E.INVALID_REQUEST and "an assignment twice" in r.error_message
    assert h.alter({name: 14}).error_code == 0
    # The worst batch of that group fits: a static member holding every item leaves with -2
    # and rejoins, which writes its current assignment twice in one batch.
    h.join("W1", instance_id="i1")
    all_items = [name, *(f"{name}/{t}" for t in range(14))]
    h.compute({"W1": all_items})
    r = h.join("W1", instance_id="i1")
    assert r.error_code == 0 and len(r.assignment.tasks) == 14
    h.heartbeat("W1", r.member_epoch, instance_id="i1", owned=all_items)
    assert h.heartbeat("W1", -2, instance_id="i1").error_code == 0
    start = len(h.log)
    assert h.join("W1", instance_id="i1", owned=all_items).error_code == 0
    batch = h.log[start:]
    assert [type(k).__name__ for k, _ in batch].count("CurrentMemberAssignmentKey") == 2
    assert rec.batch_bytes(batch) > rec.assignment_bytes(h.group().connectors.values()) * 2
    assert rec.batch_bytes(batch) <= 64 * 1024


# == item 7: the runtime's backstop ====================================================================


async def test_shard_answers_a_batch_that_can_never_fit_with_a_non_retriable_error(tmp_path: Path) -> None:
    """Whatever slips past the core's bound (here: the core was given a larger limit than the
    log's) gets a non-retriable error naming the limit, not COORDINATOR_NOT_AVAILABLE forever."""
    big = GroupCoordinatorConfig(max_batch_bytes=64 * MiB)
    store = FileStore(tmp_path, 0, fsync=FsyncPolicy(), segment_bytes=64 * MiB,
                      compaction_interval_ms=3_600_000, tombstone_retention_ms=0)
    shard = Shard(0, store, big, Metrics())
    await shard.load()
    try:
        def error(code: int, message: str) -> Any:
            return ("error", code, message)

        value = "v" * (DEFAULT_MAX_BATCH_BYTES + 1024)
        req = alter_request("g", {"A": (1, {"big": value})})
        for _ in range(2):  # the same answer each time: nothing half-written, nothing retried
            resp = await shard.write(lambda core, now: core.alter_connectors(req, now), error)
            assert isinstance(resp, tuple) and resp[1] == E.INVALID_REQUEST, resp[:2]
            assert f"batch limit of {DEFAULT_MAX_BATCH_BYTES:,} bytes" in resp[2], resp[2]
        assert shard.core.group("g") is None
        ok = await shard.write(lambda core, now: core.alter_connectors(
            alter_request("g", {"A": (1, {"small": "v"})}), now), error)
        assert ok.error_code == 0
    finally:
        await shard.close()


# == item 12: the group cap, in the core ===============================================================


def test_group_cap_refuses_new_groups_from_join_and_alter() -> None:
    """group.max.groups counts every group of the daemon (the callable stands for the other
    shards); a new group beyond it is refused with a non-retriable error naming the limit, from
    a join and from AlterConnectors; existing groups are untouched by it."""
    elsewhere = [1]
    state = []
    h = Harness(GroupCoordinatorConfig(
        max_groups=3, group_count=lambda: len(state[0].groups) + elsewhere[0]))
    state.append(h.state)
    assert h.alter({"A": 1}).error_code == 0
    assert h.join("W1", group_id="second").error_code == 0  # 3 groups now
    r = h.join("W2", group_id="third")
    assert r.error_code == E.INVALID_REQUEST and not is_retriable(r.error_code)
    assert r.error_message == ("Group third cannot be created: this coordinator hosts 3 groups, "
                               "group.max.groups is 3.")
    r = h.alter({"X": 0}, group_id="third")
    assert r.error_code == E.INVALID_REQUEST and "group.max.groups is 3" in r.error_message
    r = h.alter({"X": 0}, group_id="third", validate_only=True)
    assert r.error_code == E.INVALID_REQUEST and "group.max.groups is 3" in r.error_message
    assert h.alter(group_id="third").error_code == E.INVALID_REQUEST  # an empty group too
    assert h.group("third") is None
    # Existing groups go on: more connectors, more members.
    assert h.alter({"B": 1}).error_code == 0
    assert h.join("W3").error_code == 0
    assert h.join("W4", group_id="second").error_code == 0
    # Once a group goes (here: another shard's), a new one may be created.
    elsewhere[0] = 0
    assert h.join("W2", group_id="third").error_code == 0


def test_group_cap_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        GroupCoordinatorConfig(max_groups=0)


# == over TCP: the real daemon =========================================================================


def _call(d: Daemon, request: Any) -> Any:
    with AdminClient(d.host, d.port, timeout_s=30) as c:
        return c.call(request)


def _error_lines(d: Daemon) -> list[dict[str, Any]]:
    out = []
    for line in d.stderr().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") in ("error", "critical"):
            out.append(entry)
    return out


def test_daemon_refuses_connector_configs_beyond_the_batch_limit(pool: DaemonPool) -> None:
    """Connector configs that would grow the group's connectors record past the log's batch
    limit: each ~0.9 MiB request fits a frame, the eighth would make the record too large to
    ever write. It is refused non-retriably (before the fix: COORDINATOR_NOT_AVAILABLE every
    time, with an error line each time), and the group goes on working."""
    d = pool.start(extra_args=["--fsync", "never"])
    value = "c" * (900 * 1024)
    with AdminClient(d.host, d.port, timeout_s=30) as c:
        accepted = 0
        for n in range(20):
            r = c.call(alter_request("big", {f"conn-{n}": (1, {"blob": value})}))
            if r.error_code != 0:
                break
            accepted += 1
        assert 5 <= accepted < 20
        assert r.error_code == E.INVALID_REQUEST, r
        assert "batch limit of 8,388,608 bytes" in r.error_message and "bytes over" in r.error_message
        again = c.call(alter_request("big", {f"conn-{accepted}": (1, {"blob": value})}))
        assert (again.error_code, again.error_message) == (r.error_code, r.error_message)
        ok = c.call(alter_request("big", {"conn-0": (2, {"blob": value})}))
        assert ok.error_code == 0, ok
        (g,) = c.call(ConnectGroupDescribeRequest(group_ids=("big",))).groups
        assert g.error_code == 0 and len(g.connectors) == accepted
    assert _error_lines(d) == []


def _scrape_text(d: Daemon) -> str:
    assert d.metrics_url is not None
    with urllib.request.urlopen(d.metrics_url, timeout=10) as resp:
        return resp.read().decode()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_daemon_metrics_stay_bounded_with_many_groups(pool: DaemonPool) -> None:
    """Thousands of groups do not add series: per-group series exist only for the groups the
    operator lists (metrics.groups); aggregates count everything. The exposition parses."""
    d = pool.start(extra_args=["--fsync", "never", "--partitions", "4"],
                   extra_env={"CONNECT_COORDINATOR_METRICS_GROUPS": "watched,absent"})
    with AdminClient(d.host, d.port, timeout_s=30) as c:
        assert c.call(alter_request("watched", {"A": (1, {})})).error_code == 0
        r = c.call(join_request("watched"))
        assert r.error_code == 0, r
        assert c.call(join_request("other")).error_code == 0
        before = _scrape_text(d)
        for n in range(2000):
            assert c.call(alter_request(f"empty-{n}")).error_code == 0
    after = _scrape_text(d)
    m = _samples(after)
    assert m[("connect_coordinator_groups", frozenset({("type", "connect")}))] == 2002
    assert m[("connect_coordinator_connect_groups", frozenset({("state", "Empty")}))] == 2000
    assert m[("connect_coordinator_members", frozenset())] == 2
    assert m[("connect_coordinator_group_members", frozenset({("group", "watched")}))] == 1
    assert not any(n == "connect_coordinator_group_members" and ("group", "other") in labels
                   for n, labels in m)
    assert not any(("group", "absent") in labels for _, labels in m)
    # Bounded: 2,000 more groups change numbers, not series.
    assert len(_samples(before)) == len(m)
    assert len(after) < len(before) + 500, (len(before), len(after))


def test_daemon_caps_the_number_of_groups_across_partitions(pool: DaemonPool) -> None:
    """group.max.groups counts the groups of every partition; past it, a new group is refused
    from a join and from AlterConnectors with INVALID_REQUEST naming the limit; existing groups
    work; after a restart the loaded groups count."""
    env = {"CONNECT_COORDINATOR_GROUP_MAX_GROUPS": "5"}
    d = pool.start(extra_args=["--fsync", "never", "--partitions", "3"], extra_env=env)
    groups = [f"grp-{n}" for n in range(5)]
    for gid in groups[:3]:
        assert _call(d, alter_request(gid, {"A": (1, {})})).error_code == 0
    for gid in groups[3:]:
        assert _call(d, join_request(gid)).error_code == 0

    def refused(d: Daemon) -> None:
        r = _call(d, alter_request("one-too-many", {"A": (1, {})}))
        assert r.error_code == E.INVALID_REQUEST, r
        assert "group.max.groups is 5" in r.error_message, r.error_message
        r = _call(d, join_request("one-too-many"))
        assert r.error_code == E.INVALID_REQUEST and "group.max.groups is 5" in r.error_message, r
        (g,) = _call(d, ConnectGroupDescribeRequest(group_ids=("one-too-many",))).groups
        assert g.error_code == E.GROUP_ID_NOT_FOUND
        assert _call(d, alter_request(groups[0], {"B": (2, {})})).error_code == 0
        assert _call(d, join_request(groups[3])).error_code == 0

    refused(d)
    assert _error_lines(d) == []
    d.stop()
    d = pool.start(extra_args=["--fsync", "never", "--partitions", "3"], extra_env=env)
    refused(d)



def test_limit_settings_from_toml_environment_and_defaults(tmp_path: Path) -> None:
    from coordinator import config
    from coordinator.group import config as group_config
    from coordinator.runtime import log

    assert group_config.DEFAULT_MAX_BATCH_BYTES == log.DEFAULT_MAX_BATCH_BYTES
    defaults = config.load(environ={})
    assert defaults.group_config().max_groups == 10_000
    assert defaults.group_config().max_batch_bytes == log.DEFAULT_MAX_BATCH_BYTES
    assert defaults.metrics_groups == frozenset()
    toml = tmp_path / "c.toml"
    toml.write_text('"group.max.groups" = 7\n[metrics]\ngroups = "a, b"\n')
    loaded = config.load(toml, environ={})
    assert loaded.group_config().max_groups == 7 and loaded.metrics_groups == {"a", "b"}
    env = config.load(toml, environ={"CONNECT_COORDINATOR_GROUP_MAX_GROUPS": "9",
                                     "CONNECT_COORDINATOR_METRICS_GROUPS": "c"})
    assert env.group_config().max_groups == 9 and env.metrics_groups == {"c"}
    with pytest.raises(ConfigError, match="group.max.groups"):
        config.load(environ={"CONNECT_COORDINATOR_GROUP_MAX_GROUPS": "0"})
    with pytest.raises(ConfigError, match="metrics.groups"):
        config.load(environ={"CONNECT_COORDINATOR_METRICS_GROUPS": "a,,b"})
