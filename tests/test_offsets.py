"""Connector offsets in the sans-IO coordinator: fenced commits, fetch, operators' alter/reset,
limits, deletion in bounded batches, and replay (record by record and the bulk loader) giving
the same state."""

from __future__ import annotations

import json
from typing import Any

from connect_wire.errors import ErrorCode as E
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterOffsetsRequest,
    ConnectGroupCommitOffsetsRequest,
    ConnectGroupFetchOffsetsRequest,
)
from connect_wire.messages import connect_group_alter_offsets_request_v0 as _alt
from connect_wire.messages import connect_group_commit_offsets_request_v0 as _com
from connect_wire.records import ConnectorOffsetKey
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import OFFSETS
from coordinator.group.state import CoordinatorState
from coordinator.runtime import serde
from tests.group_harness import Harness
from tests.test_group_coordinator import ALL, _states, hb, one_worker, two_workers


def P(n: int) -> str:
    return json.dumps({"file": f"f{n}"})


def OFF(n: int) -> str:
    return json.dumps({"position": n})


def commit(h: Harness, member: str, connector: str = "A", task: int = 0,
           pairs: list[tuple[str, str | None]] | None = None, epoch: int | None = None) -> Any:
    if epoch is None:
        epoch = h.group().current[member].epoch if member in h.group().current else 1
    req = ConnectGroupCommitOffsetsRequest(
        group_id="g", member_id=member, member_epoch=epoch, connector=connector, task=task,
        offsets=tuple(_com.PartitionOffset(partition=p, offset=o)
                      for p, o in (pairs if pairs is not None else [(P(1), OFF(1))])))
    return h.apply(h.coordinator.commit_offsets(req, h.now))


def fetch(h: Harness, connector: str = "A", partitions: list[str] | None = None) -> Any:
    return h.coordinator.fetch_offsets(ConnectGroupFetchOffsetsRequest(
        group_id="g", connector=connector, partitions=partitions))


def offsets(h: Harness, connector: str = "A") -> dict[str, str | None]:
    r = fetch(h, connector)
    assert r.error_code == 0, r
    return {p.partition: p.offset for p in r.offsets}


def alter(h: Harness, pairs: list[tuple[str, str | None]] = (), reset: bool = False,
          validate_only: bool = False, connector: str = "A") -> Any:
    req = ConnectGroupAlterOffsetsRequest(
        group_id="g", connector=connector, reset=reset, validate_only=validate_only,
        offsets=tuple(_alt.PartitionOffset(partition=p, offset=o) for p, o in pairs))
    return h.apply(h.coordinator.alter_offsets(req, h.now))


def stop(h: Harness, connector: str = "A", tasks: int = 2, report: bool = True) -> None:
    """Stop ``connector``; with ``report`` every owner of its items then reports them STOPPED
    (its instances have stopped), as a worker does once their stop() returned."""
    assert h.alter({connector: tasks},
                   configs={connector: {"connect.target.state": "STOPPED"}}).error_code == 0
    if report:
        for member in list(h.group().current):
            report_states(h, member, "STOPPED")


def report_states(h: Harness, member: str, state: str, **per_item: str) -> None:
    """``member`` reports each item it owns in ``state`` (``per_item``: ``A_1="RUNNING"`` for
    A/1), on a heartbeat at its current epoch."""
    owned = sorted(str(i) for i in h.group().current[member].owned)
    if owned:
        hb(h, member, instance_states=_states(
            *((i, per_item.get(i.replace("/", "_"), state)) for i in owned)))


def bulk_equal(h: Harness) -> None:
    """The bulk loader (bytes straight to model values) gives the state replay gives."""
    fresh = CoordinatorState()
    serde.replay_log(fresh, [[serde.encode_record(r) for r in h.log]])
    assert fresh.snapshot() == h.state.snapshot()


def c(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


# == commit: fencing ===============================================================================


def test_commit_by_the_owner_is_stored_and_fetched_in_canonical_form() -> None:
    h = Harness()
    one_worker(h)
    r = commit(h, "W1", pairs=[('{ "b": 2, "a": "é" }', '{"pos": 1}'), (P(2), OFF(2))])
    assert r.error_code == 0, r
    assert offsets(h) == {'{"a":"é","b":2}': '{"pos":1}', c(P(2)): c(OFF(2))}
    # a partition asked for in another spelling is the same partition; unknown ones: null
    got = fetch(h, partitions=['{"a": "é", "b": 2}', P(9)])
    assert [(p.partition, p.offset) for p in got.offsets] == [
        ('{"a":"é","b":2}', '{"pos":1}'), (c(P(9)), None)]
    assert h.describe().groups[0].connectors[0].offset_count == 2
    bulk_equal(h)


def test_commit_from_a_stale_epoch_is_refused_and_nothing_stored() -> None:
    h = Harness()
    two_workers(h)  # W1 at epoch 2
    r = commit(h, "W1", epoch=1)
    assert r.error_code == E.STALE_MEMBER_EPOCH
    assert "older than member W1's current epoch 2" in r.error_message
    r = commit(h, "W1", epoch=3)
    assert r.error_code == E.FENCED_MEMBER_EPOCH and "newer" in r.error_message
    assert offsets(h) == {}
    assert not [k for k, _ in h.log if isinstance(k, ConnectorOffsetKey)]


def test_commit_from_an_unknown_member_or_a_non_owner_is_refused() -> None:
    h = Harness()
    two_workers(h)  # W1: A, A/0, A/1; W2: B, B/0
    r = commit(h, "nobody", epoch=2)
    assert r.error_code == E.UNKNOWN_MEMBER_ID and "not a member of group g" in r.error_message
    r = commit(h, "W2", connector="A", task=0)
    assert r.error_code == E.ITEM_NOT_OWNED and "does not own A/0" in r.error_message
    r = commit(h, "W1", connector="Z", task=0)
    assert r.error_code == E.RESOURCE_NOT_FOUND and "Connector 'Z' does not exist" in r.error_message
    assert commit(h, "W2", connector="B", task=-1).error_code == 0  # its connector instance
    assert offsets(h) == {} and offsets(h, "B") == {c(P(1)): c(OFF(1))}


def test_a_revoking_item_still_commits_until_released() -> None:
    h = Harness()
    one_worker(h)  # W1 owns everything at epoch 1
    assert h.join("W2").error_code == 0
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=ALL)  # W1 must revoke B, B/0: still owned (revoking)
    cur = h.group().current["W1"]
    assert any(i.connector == "B" for i in cur.revoking), cur
    r = commit(h, "W1", connector="B", task=0)
    assert r.error_code == 0, r  # stop() may commit its last position
    hb(h, "W1", owned=["A", "A/0", "A/1"])  # released
    r = commit(h, "W1", connector="B", task=0)
    assert r.error_code == E.ITEM_NOT_OWNED, r
    assert offsets(h, "B") == {c(P(1)): c(OFF(1))}


def test_null_offset_removes_the_partition() -> None:
    h = Harness()
    one_worker(h)
    assert commit(h, "W1", pairs=[(P(1), OFF(1)), (P(2), OFF(2))]).error_code == 0
    assert commit(h, "W1", pairs=[(P(1), None), (P(3), None)]).error_code == 0
    assert offsets(h) == {c(P(2)): c(OFF(2))}
    bulk_equal(h)


# == commit: bad input and limits ==================================================================


def test_non_json_and_non_object_values_are_refused_nothing_stored() -> None:
    h = Harness()
    one_worker(h)
    cases = [
        ([("not json", OFF(1))], "Offsets[0].Partition is not JSON"),
        ([(P(1), "[1, 2]")], "Offsets[0].Offset must be a JSON object, got an array"),
        ([(P(1), OFF(1)), ('"text"', OFF(1))], "Offsets[1].Partition must be a JSON object, got a string"),
        ([(P(1), '{"x": NaN}')], "Offsets[0].Offset is not JSON"),
        ([('{"x": "\\ud800"}', OFF(1))], "lone surrogate"),
        ([("[" * 100_000, OFF(1))], "Offsets[0].Partition"),
    ]
    for pairs, message in cases:
        r = commit(h, "W1", pairs=pairs)
        assert r.error_code == E.INVALID_REQUEST and message in r.error_message, (pairs[0][0][:20], r)
        assert "Nothing was stored" in r.error_message
    assert offsets(h) == {}


def test_numbers_out_of_float_range_are_refused_not_stored_as_infinity() -> None:
    """JSON's grammar allows 1e999, which parses to a float infinity: its canonical text would
    be ``Infinity``, not JSON (and 1e400 and 1e999 would become the same partition)."""
    h = Harness()
    one_worker(h)
    for pairs, message in [
        ([(P(1), '{"x": 1e999}')], "Offsets[0].Offset"),
        ([(P(1), '{"x": [-1e999]}')], "Offsets[0].Offset"),
        ([('{"p": 1e400}', OFF(1))], "Offsets[0].Partition"),
    ]:
        r = commit(h, "W1", pairs=pairs)
        assert r.error_code == E.INVALID_REQUEST and message in r.error_message, r
        assert "out of range" in r.error_message and "Nothing was stored" in r.error_message, r
    r = fetch(h, partitions=['{"p": 1e999}'])
    assert r.error_code == E.INVALID_REQUEST and "out of range" in r.error_message, r
    assert offsets(h) == {}


def test_commit_byte_limit_and_partition_limit() -> None:
    h = Harness(GroupCoordinatorConfig(max_offset_commit_bytes=2048, max_offset_partitions=3))
    one_worker(h)
    big = json.dumps({"blob": "x" * 3000})
    r = commit(h, "W1", pairs=[(P(1), big)])
    assert r.error_code == E.INVALID_REQUEST
    assert "group.connect.offsets.max.commit.bytes is 2,048" in r.error_message
    assert commit(h, "W1", pairs=[(P(i), OFF(i)) for i in range(3)]).error_code == 0
    r = commit(h, "W1", pairs=[(P(7), OFF(7))])
    assert r.error_code == E.INVALID_REQUEST
    assert "would have offsets for 4 source partitions" in r.error_message
    assert "group.connect.offsets.max.partitions is 3" in r.error_message
    # replacing one and removing one at the limit is fine
    assert commit(h, "W1", pairs=[(P(0), None), (P(7), OFF(7)), (P(1), OFF(9))]).error_code == 0
    assert len(offsets(h)) == 3


def test_a_connectors_offsets_are_bounded_in_bytes_all_partitions_together() -> None:
    """Without a total, a principal that may commit (READ) could keep 100,000 partitions of up
    to the commit limit each in the daemon's memory: group.connect.offsets.max.bytes bounds what
    one connector keeps. The total is kept by replay (both paths), so a rolled-back delete, a
    delete and a reload all count it right."""
    h = Harness(GroupCoordinatorConfig(max_offset_bytes=600))
    one_worker(h)
    blob = json.dumps({"blob": "x" * 100})  # 113 bytes canonical
    entry = len(c(P(0))) + len(c(blob))
    fits = 600 // entry
    assert commit(h, "W1", pairs=[(P(i), blob) for i in range(fits)]).error_code == 0
    assert h.group().offset_bytes["A"] == fits * entry
    r = commit(h, "W1", pairs=[(P(fits), blob)])
    assert r.error_code == E.INVALID_REQUEST, r
    assert "group.connect.offsets.max.bytes is 600" in r.error_message
    assert "Nothing was stored" in r.error_message and len(offsets(h)) == fits
    # Smaller offsets, or a partition removed, make room again; replacing keeps the total right.
    assert commit(h, "W1", pairs=[(P(0), OFF(0)), (P(fits), blob)]).error_code == 0
    assert h.group().offset_bytes["A"] == sum(len(p) + len(o) for p, o in offsets(h).items())
    r = alter(h, [(P(fits + 1), blob)], connector="A")  # (refused: RUNNING; the limit too below)
    assert r.error_code == E.INVALID_REQUEST
    stop(h, tasks=1)
    r = alter(h, [(P(fits + 1), blob)])
    assert r.error_code == E.INVALID_REQUEST and "max.bytes" in r.error_message, r
    bulk_equal(h)
    fresh = CoordinatorState()
    for record in h.log:
        fresh.replay(record)
    assert fresh.groups["g"].offset_bytes == h.group().offset_bytes
    assert h.alter(deletes=["A"]).error_code == 0
    assert "A" not in h.group().offset_bytes
    bulk_equal(h)


def test_a_store_bounding_records_per_write_refuses_a_larger_commit() -> None:
    h = Harness(GroupCoordinatorConfig(max_batch_records=4))
    one_worker(h)
    r = commit(h, "W1", pairs=[(P(i), OFF(i)) for i in range(5)])
    assert r.error_code == E.INVALID_REQUEST and "etcd.max.txn.ops" in r.error_message
    assert offsets(h) == {}


# == alter / reset =================================================================================


def test_alter_and_reset_are_refused_unless_stopped() -> None:
    h = Harness()
    one_worker(h)
    assert commit(h, "W1").error_code == 0
    for kwargs in ({"pairs": [(P(1), OFF(5))]}, {"reset": True}):
        r = alter(h, **kwargs)
        assert r.error_code == E.INVALID_REQUEST
        assert ("Connectors must be in the STOPPED state before their offsets can be modified"
                in r.error_message)
        assert "connect-coordinator connectors stop --group g A" in r.error_message
    assert offsets(h) == {c(P(1)): c(OFF(1))}


def test_alter_is_refused_retriably_until_every_owner_reports_the_stopped_instances_stopped() -> None:
    """A task's stop() commits its last offsets: an alter stored before that commit would be
    overwritten by it. So while a member owns an item of the stopped connector that it has
    not reported STOPPED, AlterOffsets is refused with a retriable error naming the member."""
    h = Harness()
    two_workers(h)  # W1 owns A, A/0, A/1; W2 owns B, B/0
    report_states(h, "W1", "RUNNING")
    assert commit(h, "W1", task=0).error_code == 0
    stop(h, report=False)
    for kwargs in ({"pairs": [(P(1), OFF(5))]}, {"reset": True},
                   {"pairs": [(P(1), OFF(5))], "validate_only": True}):
        r = alter(h, **kwargs)
        assert r.error_code == E.REBALANCE_IN_PROGRESS, r
        assert "Connector 'A''s instances are still stopping on member(s) W1" in r.error_message
    # The stopping task commits its last position (it still owns its item: stored) ...
    assert commit(h, "W1", task=0, pairs=[(P(1), OFF(2))]).error_code == 0
    # ... and one instance still runs: refused.
    report_states(h, "W1", "STOPPED", A_1="RUNNING")
    assert alter(h, [(P(1), OFF(5))]).error_code == E.REBALANCE_IN_PROGRESS
    # W2 owns nothing of A: only W1's report counts.
    report_states(h, "W1", "STOPPED")
    assert alter(h, [(P(1), OFF(5))]).error_code == 0
    assert offsets(h) == {c(P(1)): c(OFF(5))}
    # Resumed and stopped again: the STOPPED reports are of before (an instance resumed
    # meanwhile may be stopping), so refused until reported again.
    assert h.alter({"A": 2}, configs={"A": {"connect.target.state": "RUNNING"}}).error_code == 0
    stop(h, report=False)
    assert alter(h, reset=True).error_code == E.REBALANCE_IN_PROGRESS
    report_states(h, "W1", "STOPPED")
    assert alter(h, reset=True).error_code == 0 and offsets(h) == {}


def test_alter_is_accepted_once_the_owner_released_the_stopped_connectors_items() -> None:
    h = Harness()
    two_workers(h)
    stop(h, report=False)
    assert alter(h, [(P(1), OFF(5))]).error_code == E.REBALANCE_IN_PROGRESS
    # W1 leaves (after stopping its work): nobody owns A's items any more.
    assert h.heartbeat("W1", -1).error_code == 0
    assert not any(i.connector == "A" for cur in h.group().current.values() for i in cur.owned)
    assert alter(h, [(P(1), OFF(5))]).error_code == 0
    assert offsets(h) == {c(P(1)): c(OFF(5))}


def test_alter_merges_and_reset_removes_everything_in_batches() -> None:
    h = Harness(GroupCoordinatorConfig(max_batch_records=8))
    one_worker(h)
    assert commit(h, "W1", pairs=[(P(i), OFF(i)) for i in range(3)]).error_code == 0
    stop(h)
    assert alter(h, [(P(0), OFF(100)), (P(1), None), (P(5), OFF(5))]).error_code == 0
    assert offsets(h) == {c(P(0)): c(OFF(100)), c(P(2)): c(OFF(2)), c(P(5)): c(OFF(5))}
    assert alter(h, [(P(9), OFF(9))], validate_only=True).error_code == 0
    assert c(P(9)) not in offsets(h)
    assert alter(h, [(P(9), "oops")], validate_only=True).error_code == E.INVALID_REQUEST
    assert alter(h, [(P(1), OFF(1))], reset=True).error_code == E.INVALID_REQUEST
    for i in range(20):
        assert alter(h, [(P(100 + i), OFF(i))]).error_code == 0
    rounds = 0
    while h.coordinator.offset_count("g", "A"):
        before = len(h.log)
        assert alter(h, reset=True).error_code == 0
        assert len(h.log) - before <= 8
        rounds += 1
    assert rounds == 3 and offsets(h) == {}
    bulk_equal(h)


# == deletion ======================================================================================


def test_deleting_a_connector_tombstones_its_offsets_in_bounded_batches() -> None:
    h = Harness(GroupCoordinatorConfig(max_batch_records=8))
    one_worker(h)
    for start in range(0, 30, 6):
        assert commit(h, "W1", pairs=[(P(i), OFF(i)) for i in range(start, start + 6)]).error_code == 0
    assert h.alter(deletes=["A"]).error_code == 0
    assert fetch(h).error_code == E.RESOURCE_NOT_FOUND
    assert len(h.group().offset_garbage["A"]) == 30
    bulk_equal(h)
    sizes = []
    while (OFFSETS, "g", "") in h.timers:
        del h.timers[(OFFSETS, "g", "")]
        result = h.coordinator.on_timer((OFFSETS, "g", ""), h.now)  # one write each
        sizes.append(len(result.records))
        h.apply(result)
    assert sizes == [8, 8, 8, 6] and not h.group().offset_garbage
    live = {k for k, v in _compacted(h).items() if isinstance(k, ConnectorOffsetKey) and v}
    assert live == set()


def _compacted(h: Harness) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in h.log:
        out[key] = value
    return out


def test_delete_then_recreate_never_shows_old_offsets_even_before_the_tombstones() -> None:
    h = Harness()
    one_worker(h)
    assert commit(h, "W1", pairs=[(P(1), OFF(1)), (P(2), OFF(2))]).error_code == 0
    old = h.group().connectors["A"].incarnation
    assert h.alter(deletes=["A"]).error_code == 0
    h.timers.pop((OFFSETS, "g", ""))  # a crash before any tombstone
    h.advance(1)
    assert h.alter({"A": 2}).error_code == 0
    assert h.group().connectors["A"].incarnation > old
    assert offsets(h) == {}
    assert h.describe().groups[0].connectors[0].offset_count == 0
    # a reload finds the leftovers garbage and tombstones them
    fresh = CoordinatorState()
    for record in h.log:
        fresh.replay(record)
    assert fresh.groups["g"].offset_garbage and not fresh.groups["g"].offsets.get("A")
    bulk_equal(h)
    result = h.coordinator.on_loaded(h.now)
    assert (OFFSETS, "g", "") in [t.key for t in result.timers]
    h.apply(result)
    h.advance(0)
    assert not h.group().offset_garbage


def test_a_rolled_back_delete_serves_the_offsets_again() -> None:
    h = Harness()
    one_worker(h)
    assert commit(h, "W1", pairs=[(P(1), OFF(1))]).error_code == 0

    result = h.coordinator.alter_connectors(
        ConnectGroupAlterConnectorsRequest(group_id="g", upserts=(), deletes=("A",),
                                           validate_only=False), h.now)
    assert h.group().offset_garbage
    h.coordinator.rollback(result)  # the write failed
    assert offsets(h) == {c(P(1)): c(OFF(1))} and not h.group().offset_garbage


def test_a_group_with_garbage_offsets_expires_only_after_they_are_tombstoned() -> None:
    h = Harness(GroupCoordinatorConfig(empty_group_retention_ms=0, max_batch_records=4))
    assert h.alter({"A": 1}).error_code == 0
    assert h.join("W1").error_code == 0
    h.compute({"W1": ["A", "A/0"]})
    hb(h, "W1")
    assert commit(h, "W1", pairs=[(P(i), OFF(i)) for i in range(4)]).error_code == 0
    assert commit(h, "W1", pairs=[(P(i), OFF(i)) for i in range(4, 10)][:4]).error_code == 0
    assert h.heartbeat("W1", -1).error_code == 0  # leaves
    assert h.alter(deletes=["A"]).error_code == 0
    h.advance(10)
    assert "g" not in h.state.groups
    assert not {k for k, v in _compacted(h).items() if isinstance(k, ConnectorOffsetKey) and v}


def test_a_fenced_members_hold_refuses_alter_naming_its_instance() -> None:
    """A static worker killed right after ``stop``: fenced once its session ends, its items
    held (it may still be stopping them) until the hold ends. The retriable refusal meanwhile
    names its instance id, as while it was a member, and says it was fenced, so that an
    operator sees which worker it waits for and why it cannot report."""
    h = Harness()
    assert h.alter({"A": 2, "B": 1}).error_code == 0
    assert h.join("W1", instance_id="w1").error_code == 0
    h.compute({"W1": ALL})
    assert hb(h, "W1").member_epoch == 1
    report_states(h, "W1", "RUNNING")
    stop(h, report=False)
    r = alter(h, [(P(1), OFF(5))])
    assert r.error_code == E.REBALANCE_IN_PROGRESS and "member(s) W1 (w1)" in r.error_message, r
    h.advance(10_001)  # (the default session timeout, W1 silent)
    assert "W1" not in h.group().members and h.group().current["W1"].epoch < 0  # (held)
    r = alter(h, [(P(1), OFF(5))])
    assert r.error_code == E.REBALANCE_IN_PROGRESS, r
    assert "member(s) W1 (w1, fenced: held)" in r.error_message, r.error_message
