"""What a plugin gets from its worker, the pure parts (worker_client.context,
worker_client.membership, connect_wire.verbs): the fencing tokens the membership keeps from its
heartbeat answers, when it refuses a fenced write before sending it, the canonical JSON of
partitions and offsets, the check of ``task_configs``' answer, the config a task starts with,
and which instances a change of task configs restarts. The runtime against a real coordinator:
tests/test_worker_context_e2e.py."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

import worker_client
from connect_wire import verbs
from connect_wire.errors import ErrorCode as E
from connect_wire.errors import ProtocolError
from connect_wire.items import Item
from connect_wire.messages import ConnectGroupHeartbeatResponse
from connect_wire.messages import connect_group_heartbeat_response_v0 as _hb
from worker_client.context import (
    Context,
    FencedError,
    canonical_json,
    check_task_configs,
    instance_config,
    offset_pairs,
)
from worker_client.membership import AssignorAd, Membership

C, T0, T1 = Item("c", -1), Item("c", 0), Item("c", 1)


def answer(epoch: int, items: dict[Item, int | None], error: int = 0) -> ConnectGroupHeartbeatResponse:
    """A heartbeat answer assigning ``items`` with their tokens (None: no token sent)."""
    its = sorted(items)
    return ConnectGroupHeartbeatResponse(
        error_code=error, member_id="m1", member_epoch=epoch, heartbeat_interval_ms=200,
        should_compute_assignment=False, assignment=_hb.Assignment(
            error=0, connectors=tuple(i.connector for i in its if i.is_connector),
            tasks=tuple(_hb.TaskId(connector=i.connector, task=i.task) for i in its if not i.is_connector),
            metadata_version=0, metadata_bytes=b"",
            fencing_tokens=tuple(_hb.ItemToken(connector=i.connector, task=i.task, token=t)
                                 for i, t in items.items() if t is not None)))


def member() -> Membership:
    m = Membership(group_id="g", assignors=[AssignorAd("incremental", 0, 1)])
    m.join(0)
    return m


def test_membership_keeps_each_items_token_while_it_holds_the_item() -> None:
    m = member()
    m.heartbeat_request(0)
    m.on_response(answer(5, {C: 100, T0: 101, T1: None}), 10)
    assert m.tokens == {C: 100, T0: 101}, "an item sent without a token has none"
    m.assigned_started(frozenset({C, T0, T1}), 10)
    # T0 moves away: revoking, its stop() may still write with its token until it is released.
    m.heartbeat_request(20)
    m.on_response(answer(6, {C: 100, T1: 102}), 30)
    assert m.tokens == {C: 100, T0: 101, T1: 102}
    assert m.holds(T0) and m.write_refusal(T0) is None
    m.revoked(frozenset({T0}), 40)
    assert m.tokens == {C: 100, T1: 102} and not m.holds(T0)
    assert m.write_refusal(T0) == (E.ITEM_NOT_OWNED, "this worker no longer holds c/0")
    # Given back later: the token of the new grant.
    m.heartbeat_request(50)
    m.on_response(answer(7, {C: 100, T0: 205, T1: 102}), 60)
    assert m.tokens[T0] == 205
    # Fenced: nothing may be written (epoch 0) though the stops are still under way, and the
    # tokens go with the items once they are reported stopped.
    m.assigned_started(frozenset({T0}), 60)
    m.heartbeat_request(70)
    (lost,) = m.on_response(answer(7, {}, error=E.FENCED_MEMBER_EPOCH), 80)
    assert m.member_epoch == 0 and m.tokens == {C: 100, T0: 205, T1: 102}
    code, message = m.write_refusal(C)  # type: ignore[misc]
    assert code == E.UNKNOWN_MEMBER_ID and "not a member of group g" in message
    m.revoked(lost.items, 90)  # type: ignore[union-attr]
    assert m.tokens == {}


def test_canonical_json_and_offset_pairs_refuse_what_is_not_a_json_object() -> None:
    assert canonical_json({"b": 1, "a": ["é", None, 1.5, True]}) == '{"a":["é",null,1.5,true],"b":1}'
    pairs = offset_pairs([({"f": "x", "d": 1}, {"pos": 3}), ({"g": 1}, None),
                          ({"d": 1, "f": "x"}, {"pos": 4})])
    assert pairs == [('{"g":1}', None), ('{"d":1,"f":"x"}', '{"pos":4}')], \
        "a partition given twice keeps its last offset (partitions compare by canonical JSON)"
    with pytest.raises(TypeError, match="partition of pair 0 must be a dict"):
        offset_pairs([(["f"], {"pos": 1})])
    with pytest.raises(TypeError, match="offset of pair 1 must be a dict"):
        offset_pairs([({"f": 1}, {"pos": 1}), ({"f": 2}, 7)])
    with pytest.raises(TypeError, match=r"has the key 1: JSON object keys are strings"):
        offset_pairs([({1: "x"}, {})])
    with pytest.raises(TypeError, match=r"is a set"):
        offset_pairs([({"f": {1, 2}}, {})])
    with pytest.raises(TypeError, match=r"is a bytes"):
        offset_pairs([({"f": 1}, {"raw": b"\x00"})])
    with pytest.raises(ValueError, match="NaN or infinity"):
        offset_pairs([({"f": 1}, {"pos": math.nan})])
    with pytest.raises(TypeError, match="each must be"):
        offset_pairs([({"f": 1},)])
    with pytest.raises(TypeError, match="not a dict"):
        offset_pairs({"f": 1})  # type: ignore[arg-type]


def test_task_configs_answer_is_checked() -> None:
    ok = check_task_configs([{"shard": "a"}, {}], 3, "C.task_configs")
    assert ok == [{"shard": "a"}, {}]
    for bad, says in (
            ({"shard": "a"}, "C.task_configs returned dict, not a list of task configs"),
            ([{}, {}, {}, {}], "returned 4 task configs; at most max_tasks=3"),
            (["shard=a"], "returned str as task config 0, not a dict"),
            ([{"n": 1}], "task config 0 has 'n': 1; keys and values must be str"),
            ([{}, {"x": None}], "task config 1 has 'x': None"),
            ([{verbs.TARGET_STATE: "PAUSED"}], "reserved for Connect's verbs")):
        with pytest.raises(ValueError, match=".") as info:
            check_task_configs(bad, 3, "C.task_configs")
        assert says in str(info.value), (bad, str(info.value))


def test_a_task_starts_with_its_connectors_config_overlaid_with_its_own() -> None:
    base = {"connector.class": "m:C", "topic": "t", "shard": "all"}
    config = instance_config(base, T1, "w1", {"shard": "b", "task.id": "9", "worker.id": "x"})
    assert config == {"connector.class": "m:C", "topic": "t", "shard": "b",
                      "connector.name": "c", "task.id": "1", "worker.id": "w1"}
    assert instance_config(base, C, "w1") == {**base, "connector.name": "c", "worker.id": "w1"}
    assert instance_config(base, T0, "w1") == {**base, "connector.name": "c", "task.id": "0",
                                                "worker.id": "w1"}


def test_only_the_task_whose_own_config_changed_restarts() -> None:
    base = {"connector.class": "m:C", "topic": "t"}
    old = [{"shard": "a"}, {"shard": "b"}]
    new = [{"shard": "a"}, {"shard": "B"}]
    assert verbs.identity(T0, base, old[0]) == verbs.identity(T0, base, new[0])
    assert verbs.identity(T1, base, old[1]) != verbs.identity(T1, base, new[1])
    assert verbs.identity(T1, base, None) != verbs.identity(T1, base, {}), \
        "a config stored for the first time restarts the task (no config is not an empty one)"
    assert verbs.identity(C, base) == verbs.identity(C, base, None)  # the connector: as before


class Runtime:
    """The worker's side of a Context, recording what would be sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.member_epoch = 7
        self.tokens: dict[Item, int] = {T0: 42}

    def fencing_token(self, item: Item) -> int | None:
        return self.tokens.get(item)

    async def commit_offsets(self, item: Item, offsets: list[tuple[str, str | None]]) -> None:
        self.sent.append(("commit", item, offsets))

    async def fetch_offset(self, connector: str, partition: str) -> str | None:
        self.sent.append(("fetch", connector, partition))
        return '{"pos":3}'

    def request_task_reconfiguration(self, item: Item) -> None:
        self.sent.append(("reconfigure", item))


def test_context_checks_before_sending_and_is_closed_after_stop() -> None:
    runtime = Runtime()
    task, conn = Context(T0, "w1", runtime), Context(C, "w1", runtime)  # type: ignore[arg-type]
    assert (task.connector, task.task_id, task.worker_id, task.member_epoch, task.fencing_token) == \
        ("c", 0, "w1", 7, 42)
    assert (conn.task_id, conn.fencing_token) == (None, None)
    runtime.member_epoch = 8
    assert task.member_epoch == 8, "live"

    async def go() -> None:
        with pytest.raises(TypeError):
            await task.commit_offsets([({"f": 1}, {"pos": object()})])
        assert runtime.sent == [], "nothing sent for a bad pair"
        await task.commit_offsets([])
        assert runtime.sent == []
        await task.commit_offsets([({"f": 1}, {"pos": 3})])
        assert await task.offset({"f": 1}) == {"pos": 3}
        with pytest.raises(RuntimeError, match="for the connector instance"):
            task.request_task_reconfiguration()
        conn.request_task_reconfiguration()
        task._close()
        with pytest.raises(FencedError) as info:
            await task.commit_offsets([({"f": 1}, {"pos": 4})])
        assert info.value.code == E.ITEM_NOT_OWNED and info.value.name == "ITEM_NOT_OWNED"
        assert repr(info.value).startswith("FencedError(ITEM_NOT_OWNED, 'the instance c/0 was stopped")

    asyncio.run(go())
    assert runtime.sent == [("commit", T0, [('{"f":1}', '{"pos":3}')]), ("fetch", "c", '{"f":1}'),
                            ("reconfigure", C)]
    assert worker_client.FencedError is FencedError and issubclass(FencedError, ProtocolError)
    assert json.loads(canonical_json({"z": 1, "a": 2})) == {"a": 2, "z": 1}


def test_an_instance_of_an_earlier_grant_keeps_its_token_and_may_not_commit() -> None:
    """The item granted to this worker again while it kept it (its connector deleted and created
    again between two heartbeats): the running instance belongs to the earlier grant. Its token
    stays the one it started with, its commits are refused before anything is sent, and the
    worker sees it (``stale_grant``) and restarts it; a new instance gets the new token."""
    runtime = Runtime()
    old = Context(T0, "w1", runtime)  # type: ignore[arg-type]
    assert old.fencing_token == 42 and old.stale_grant() is None
    runtime.tokens[T0] = 57  # the heartbeat brought the item's new grant
    assert old.fencing_token == 42, "fixed for the instance's life"
    assert old.stale_grant() == 57

    async def go() -> None:
        with pytest.raises(FencedError) as info:
            await old.commit_offsets([({"f": 1}, {"pos": 9})])
        assert info.value.code == E.ITEM_NOT_OWNED and "granted again (token 57)" in str(info.value)

    asyncio.run(go())
    assert runtime.sent == [], "nothing sent"
    new = Context(T0, "w1", runtime)  # type: ignore[arg-type]
    assert new.fencing_token == 57 and new.stale_grant() is None
