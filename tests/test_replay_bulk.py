"""The bulk load (``serde.replay_log``) gives exactly what record-by-record replay gives.

``replay_log`` is what a partition load uses; ``CoordinatorState.replay(serde.decode_record(...))``
is the reference (and what the live coordinator's writes go through). Checked here:

* random logs over a small key space (so keys are overwritten, values repeat, items move
  between members, instance ids are shared, groups are deleted and created again), with
  tombstones, unknown record types, corrupt records and random batch boundaries: the same
  state, and the same error (type) at the same record;
* logs written by the real coordinator (the property-test machine of test_group_property):
  the bulk load of its log equals the live state after every step;
* each specialised decoder against the generic decoder, on valid encodings and on random
  corruptions of them (a fast path must never accept what the generic one would not, or
  decode it differently);
* the bulk log reader (``PartitionLog.read_batches``) against ``read``, and the records
  recovery passes to a sink (``PartitionLog.open(sink=...)``, what a load replays) against what
  the log holds after recovery, for logs corrupted at random.
"""

from __future__ import annotations

import contextlib
import random
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis.stateful import invariant

from connect_wire import codec
from connect_wire.records import GroupMetadataKey
from coordinator.group import records as rec
from coordinator.group.config import MAX_TASKS_CEILING
from coordinator.group.model import (
    AssignorSpec,
    ConnectorSpec,
    CurrentAssignment,
    Item,
    KeptFor,
    MemberMetadata,
    MemberState,
    TargetMember,
    TaskConfigs,
)
from coordinator.group.state import CoordinatorState, ReplayError
from coordinator.group.validation import validate_current_epoch, validate_item_set
from coordinator.runtime import serde
from coordinator.runtime.log import PartitionLog
from tests.test_group_property import ConnectGroupMachine
from tests.test_log import _mutate, build_log, segment_files

LONG = "x" * 130  # a length above 127 takes a two-byte varint
GROUPS = ["g1", "g2", "gé" + LONG]
MEMBERS = ["m1", "m2", "m3" + LONG]
CONNECTORS = ["A", "B", "ç" + LONG]

items = st.builds(Item, st.sampled_from(CONNECTORS), st.integers(-1, 2))
any_items = st.frozensets(items, max_size=4)


def item_sets(member_id: str, shared: int) -> st.SearchStrategy[frozenset[Item]]:
    """Items of the member's own share (so that logs seldom give an item two owners and go on
    long enough), or any items once in ``shared`` times."""
    tasks = [t for t in (-1, 0, 1, 2, 3, 4) if t % 3 == MEMBERS.index(member_id)]
    share = st.frozensets(st.builds(Item, st.sampled_from(CONNECTORS), st.sampled_from(tasks)), max_size=3)
    return st.integers(1, shared).flatmap(lambda n: any_items if n == 1 else share)
small = st.integers(-3, 3) | st.sampled_from([2**31 - 1, -(2**31)])
blobs = st.sampled_from([b"", b"m", b"\x00\x01", bytes(range(200))])
member_states = st.sampled_from([*MemberState, 5, -1])  # unknown states too (raw int8 values)


tokens = st.integers(0, 3) | st.sampled_from([2**63 - 1, 1_700_000_000_000_000])


@st.composite
def current_assignments(draw: st.DrawFn, member_id: str, shared: int) -> CurrentAssignment:
    assigned = draw(item_sets(member_id, shared))
    revoking = draw(item_sets(member_id, shared))
    owned = sorted(assigned | revoking)
    # fencing tokens: usually one per owned item, sometimes none or some
    given = draw(st.sampled_from([owned, owned, [], owned[:1]]))
    return CurrentAssignment(
        draw(small), draw(small), draw(member_states), assigned, revoking,
        draw(st.integers(-1, 2)), draw(blobs), {i: draw(tokens) for i in given})


assignors = st.builds(
    AssignorSpec, st.sampled_from(["incremental", "x" + LONG]), st.integers(-1, 2), st.integers(-1, 2),
    st.integers(-1, 1), st.integers(0, 2), blobs)


@st.composite
def member_values(draw: st.DrawFn, member_id: str) -> MemberMetadata:
    return MemberMetadata(
        member_id=member_id,
        instance_id=draw(st.sampled_from([None, "i1", "i2"])),
        worker_url=draw(st.sampled_from([None, "http://w:8083", "é" + LONG])),
        client_id=draw(st.sampled_from(["c", ""])),
        client_host=draw(st.sampled_from(["h", "10.0.0.1"])),
        rebalance_timeout_ms=draw(small),
        assignors=tuple(draw(st.lists(assignors, max_size=2))),
    )


connector_specs = st.builds(
    ConnectorSpec, st.sampled_from(CONNECTORS), st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from(["k", "topics"]), st.sampled_from([None, "v"])), max_size=2)
    .map(tuple), st.integers(0, 2))  # (incarnations: offsets of another one are garbage)
task_config_values = st.builds(
    TaskConfigs, st.integers(0, 2),
    st.lists(st.lists(st.tuples(st.sampled_from(["k", "task"]), st.sampled_from([None, "v"])),
                      max_size=2, unique_by=lambda e: e[0]).map(tuple), max_size=4).map(tuple))


@st.composite
def records(
    draw: st.DrawFn, corrupt: int = 40, shared: int = 12, delete_groups: bool = True
) -> tuple[bytes, bytes | None]:
    """One record of a log (its key and value bytes): a corrupt one once in ``corrupt`` times
    (never if 0), an item set not from the member's share once in ``shared`` times, no group
    metadata tombstone unless ``delete_groups``."""
    gid = draw(st.sampled_from(GROUPS))
    mid = draw(st.sampled_from(MEMBERS))
    kind = draw(st.sampled_from(
        ["metadata", "connectors", "member", "target", "target_metadata", "current", "current",
         "configuration", "offset", "task_configs", "unknown"]))
    if kind == "metadata":
        record = rec.group_metadata(gid, draw(small), draw(st.sampled_from([0, 0, 5, 2**40])))
    elif kind == "task_configs":
        record = rec.task_configs(gid, draw(st.sampled_from(CONNECTORS)), draw(task_config_values))
    elif kind == "connectors":
        specs = {c.name: c for c in draw(st.lists(connector_specs, max_size=3))}
        record = rec.group_connectors(gid, draw(small), specs.values())
    elif kind == "member":
        record = rec.group_member(gid, draw(member_values(mid)))
    elif kind == "target":
        target = TargetMember(draw(item_sets(mid, shared)), draw(st.integers(0, 2)), draw(blobs))
        record = rec.target_member(gid, mid, target)
    elif kind == "target_metadata":
        kept = draw(st.lists(st.builds(KeptFor, st.sampled_from(MEMBERS), st.sampled_from([None, "i"]),
                                       item_sets(mid, shared)), max_size=2))
        record = rec.target_metadata(gid, draw(small), draw(st.integers(-1, 1)), draw(blobs), draw(small),
                                     kept)
    elif kind == "current":
        record = rec.current_assignment(gid, mid, draw(current_assignments(mid, shared)))
    elif kind == "configuration":
        record = rec.group_configuration(gid, dict(draw(st.lists(
            st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([None, "1"])), max_size=2))))
    elif kind == "offset":
        record = rec.connector_offset(
            gid, draw(st.sampled_from(CONNECTORS)), draw(st.sampled_from(['{"f":1}', '{"f":"é"}'])),
            draw(st.integers(0, 2)), draw(st.sampled_from(['{"o":1}', '{"o":2}'])))
    else:  # a record type this build does not know: both paths skip it
        return struct.pack(">hh", 99, 0) + b"anything", draw(st.sampled_from([None, b"\x00\x00"]))
    key, value = serde.encode_record(record)
    if draw(st.integers(0, 9)) < 3 and (delete_groups or kind != "metadata"):
        value = None  # a tombstone
    elif corrupt and draw(st.integers(1, corrupt)) == 1:  # a corrupt key or value
        if value is not None and draw(st.booleans()):
            value = draw(_corrupted(value))
        else:
            key = draw(_corrupted(key))
    return key, value


@st.composite
def logs(draw: st.DrawFn, min_size: int, max_size: int, **kwargs: Any) -> list[tuple[bytes, bytes | None]]:
    """Records, and now and then the deletion of a group as the coordinator writes it: a
    tombstone for every key of the group, then for its metadata (and later records may create
    it again)."""
    log: list[tuple[bytes, bytes | None]] = []
    for _ in range(draw(st.integers(min_size, max_size))):
        if draw(st.integers(0, 30)):
            log.append(draw(records(**kwargs)))
            continue
        gid = draw(st.sampled_from(GROUPS))
        tombstones = [rec.group_connectors(gid, 0, ()), rec.target_metadata(gid, 0, 0, b"", -1),
                      rec.group_configuration(gid, {"a": "1"})]
        for mid in MEMBERS:
            nothing = CurrentAssignment(0, 0, MemberState.STABLE, frozenset(), frozenset())
            tombstones += [rec.current_assignment(gid, mid, nothing),
                           rec.target_member(gid, mid, TargetMember(frozenset())),
                           rec.group_member(gid, MemberMetadata(mid, None, None, "c", "h", 0, ()))]
        tombstones = draw(st.permutations(tombstones)) + [rec.group_metadata(gid, 0)]
        log += [(serde.encode_record(r)[0], None) for r in tombstones]
    return log


def _corrupted(data: bytes) -> st.SearchStrategy[bytes]:
    @st.composite
    def corrupt(draw: st.DrawFn) -> bytes:
        how = draw(st.sampled_from(["flip", "truncate", "append", "insert"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "flip" and data:
            return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1:]
        if how == "truncate":
            return data[:at]
        if how == "append":
            return data + draw(st.binary(min_size=1, max_size=3))
        return data[:at] + draw(st.binary(min_size=1, max_size=2)) + data[at:]

    return corrupt()


@contextlib.contextmanager
def careful_decoding() -> Iterator[None]:
    """Corrupt bytes must not reach kio's native reader (``codec.decode_trusted``, for our own
    CRC-checked log): a corrupt array length can make it abort the process (see codec.py).
    Tests that corrupt records decode the generic way with the careful walker instead."""
    with mock.patch.object(codec, "decode_trusted", codec.decode):
        yield


def record_by_record(log: list[tuple[bytes, bytes | None]]) -> tuple[CoordinatorState, Exception | None]:
    """The reference: decode each record and replay it (what a load did before replay_log)."""
    state = CoordinatorState()
    for key, value in log:
        try:
            record = serde.decode_record(key, value)
        except serde.UnknownRecordType:
            continue
        except serde.CorruptRecord as exc:
            return state, exc
        try:
            state.replay(record)
        except ReplayError as exc:
            return state, exc
    return state, None


def bulk(log: list[tuple[bytes, bytes | None]], cuts: list[int]) -> tuple[CoordinatorState, Exception | None]:
    state = CoordinatorState()
    bounds = sorted({0, len(log), *(c % (len(log) + 1) for c in cuts)})
    batches = [log[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    skipped: list[serde.UnknownRecordType] = []
    try:
        stats = serde.replay_log(state, batches, on_unknown=skipped.append)
    except (serde.CorruptRecord, ReplayError) as exc:
        return state, exc
    assert stats.records == len(log)
    assert stats.skipped == len(skipped) == sum(1 for k, _ in log if _unknown(k))
    assert stats.applied == len(log) - stats.skipped
    return state, None


def _unknown(key: bytes) -> bool:
    try:
        serde.decode_key(key)
    except serde.UnknownRecordType:
        return True
    except serde.CorruptRecord:
        pass
    return False


def _same(log: list[tuple[bytes, bytes | None]], cuts: list[int]) -> Exception | None:
    expected, expected_error = record_by_record(log)
    actual, actual_error = bulk(log, cuts)
    assert type(actual_error) is type(expected_error), (actual_error, expected_error)
    assert actual.snapshot() == expected.snapshot()
    return expected_error


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(0, 60), st.lists(st.integers(0, 100), max_size=4))
def test_bulk_load_equals_record_by_record_replay(
    log: list[tuple[bytes, bytes | None]], cuts: list[int]
) -> None:
    with careful_decoding():
        error = _same(log, cuts)
    event(f"stopped by {type(error).__name__}" if error else "whole log replayed")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(100, 250, corrupt=0, shared=200, delete_groups=False), st.lists(st.integers(0, 300), max_size=8))
def test_bulk_load_equals_record_by_record_replay_long_logs(
    log: list[tuple[bytes, bytes | None]], cuts: list[int]
) -> None:
    error = _same(log, cuts)
    event(f"stopped by {type(error).__name__}" if error else "whole log replayed")


def test_rounds_of_a_steady_group() -> None:
    # The shape of bench/recovery.py: the same items rewritten at every epoch (the caches hit).
    log = []
    items_of = {m: frozenset({Item("A", t) for t in range(i, 6, 3)}) for i, m in enumerate(MEMBERS)}
    for g in GROUPS:
        log.append(rec.group_metadata(g, 1))
        log.append(rec.group_connectors(g, 1, [ConnectorSpec("A", 6)]))
        for m in MEMBERS:
            log.append(rec.group_member(g, MemberMetadata(m, None, None, "c", "h", 1, ())))
    for epoch in range(2, 6):
        for g in GROUPS:
            log.append(rec.group_metadata(g, epoch))
            for m in MEMBERS:
                log.append(rec.target_member(g, m, TargetMember(items_of[m])))
            log.append(rec.target_metadata(g, epoch, 0, b"", -1))
            for m in MEMBERS:
                log.append(rec.current_assignment(g, m, CurrentAssignment(
                    epoch, epoch - 1, MemberState.STABLE, items_of[m], frozenset())))
    encoded = [serde.encode_record(r) for r in log]
    _same(encoded, [7, 20])
    state, _ = bulk(encoded, [])
    assert {g: len(state.groups[g].owner) for g in GROUPS} == dict.fromkeys(GROUPS, 6)


def test_a_refused_record_stops_both_at_the_same_place() -> None:
    log = [
        rec.group_metadata("g", 1),
        rec.current_assignment("g", "a", CurrentAssignment(1, 0, MemberState.STABLE,
                                                           frozenset({Item("A", 0)}), frozenset())),
        rec.current_assignment("g", "b", CurrentAssignment(1, 0, MemberState.STABLE,
                                                           frozenset({Item("A", 0)}), frozenset())),
        rec.group_metadata("g", 2),
    ]
    encoded = [serde.encode_record(r) for r in log]
    expected, error = record_by_record(encoded)
    actual, bulk_error = bulk(encoded, [])
    assert isinstance(error, ReplayError) and isinstance(bulk_error, ReplayError)
    assert actual.snapshot() == expected.snapshot()
    assert actual.groups["g"].epoch == 1


def test_a_connectors_record_beyond_any_limit_is_refused_before_its_items_are_built() -> None:
    # A corrupt task count (a bit flipped high in the int32) would otherwise build up to 2**31
    # items; no coordinator can have written more than MAX_TASKS_CEILING.
    fits = rec.group_connectors("g", 1, [ConnectorSpec("A", 10), ConnectorSpec("B", 5)])
    beyond = rec.group_connectors("g", 2, [ConnectorSpec("A", 10), ConnectorSpec("B", MAX_TASKS_CEILING)])
    encoded = [serde.encode_record(r) for r in (rec.group_metadata("g", 1), fits, beyond)]
    expected, error = record_by_record(encoded)
    actual, bulk_error = bulk(encoded, [])
    assert isinstance(error, ReplayError) and isinstance(bulk_error, ReplayError)
    assert "more than any coordinator allows" in str(error)
    assert actual.snapshot() == expected.snapshot()
    assert len(actual.groups["g"].configured) == 2 + 15


# -- the coordinator's own logs ---------------------------------------------------------------------


class BulkLoadMachine(ConnectGroupMachine):
    """The group property machine; after every step, loading its log in bulk gives the live state."""

    @invariant()
    def bulk_load_gives_the_live_state(self) -> None:
        log = [serde.encode_record(r) for r in self.h.log]
        loaded = CoordinatorState()
        serde.replay_log(loaded, [log[i:i + 7] for i in range(0, len(log), 7)])
        assert loaded.snapshot() == self.h.state.snapshot()


BulkLoadMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBulkLoadMachine = BulkLoadMachine.TestCase


# -- the specialised decoders against the generic one -------------------------------------------------


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return "error", type(exc)


def _check_decoders(key: bytes, value: bytes | None) -> None:
    loader = serde._Loader(CoordinatorState(), None)
    info = _outcome(lambda: loader.key(key))
    reference = _outcome(lambda: serde.decode_key(key))
    if reference == ("error", serde.UnknownRecordType):  # skipped by both
        assert info[0] == "ok" and info[1][0] == 0 and type(info[1][1]) is serde.UnknownRecordType
        return
    if reference[0] == "error":
        assert info == reference
        return
    if isinstance(reference[1], Exception):  # pragma: no cover - decode_key raises, not returns
        raise AssertionError(reference)
    k = reference[1]
    # (the key's second part: a member id, a connector, or an offset's (connector, partition))
    third = ((k.connector, k.partition) if hasattr(k, "partition")
             else getattr(k, "connector", None) or getattr(k, "member_id", None))
    assert info == ("ok", (serde._KIND[type(k)], k.group_id, third))
    if value is None:
        return
    kind = info[1][0]
    generic = {
        1: lambda: (lambda v: (v.epoch, v.fencing_token_ceiling))(serde.decode_value(1, value)),
        3: lambda: rec.member_from(k.member_id, serde.decode_value(3, value)),
        4: lambda: rec.target_from(serde.decode_value(4, value)),
        5: lambda: (lambda v: (v.assignment_epoch, v.error, v.assignor_state,
                               v.scheduled_rebalance_at_ms, rec.kept_from(v.kept_for)))(
            serde.decode_value(5, value)),
        6: lambda: (lambda c: (c, c.owned))(rec.current_from(serde.decode_value(6, value))),
    }.get(kind)
    fast = {
        1: lambda: loader.epoch(value),
        3: lambda: loader.member(k.member_id, value),
        4: lambda: loader.target(value),
        5: lambda: loader.target_metadata(value),
        6: lambda: loader.current(value),
    }.get(kind)
    if generic is None or fast is None:
        return
    expected = _outcome(generic)
    assert _outcome(fast) == expected
    assert _outcome(fast) == expected  # again, from the caches
    if kind == 6 and expected[0] == "ok":  # the loop's cached path: same rest, another head
        c = expected[1][0]
        if validate_current_epoch(c.epoch) or validate_item_set(c.owned, "items"):
            # content the API refuses: replay refuses it too, both ways
            with pytest.raises(ReplayError):
                serde.replay_log(CoordinatorState(), [[(key, value)]])
            with pytest.raises(ReplayError):
                CoordinatorState().replay(serde.decode_record(key, value))
            return
        state = CoordinatorState()
        serde.replay_log(state, [[(key, value)]])
        head = struct.pack(">hiib", 0, 7, 6, 1)
        serde.replay_log(state, [[(key, value), (key, head + value[11:])]])
        assert state.groups[k.group_id].current[k.member_id] == rec.current_from(
            serde.decode_value(6, head + value[11:]))


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.data())
def test_specialised_decoders_match_the_generic_decoder(record: tuple[bytes, bytes | None],
                                                         data: st.DataObject) -> None:
    key, value = record
    with careful_decoding():  # the record may be corrupt already
        _check_decoders(key, value)
        if value is not None:
            _check_decoders(key, data.draw(_corrupted(value)))
        _check_decoders(data.draw(_corrupted(key)), value)


def test_every_hot_record_type_has_its_specialised_decoder() -> None:
    # A schema change that alters a layout turns its fast path off (still correct, but slow):
    # this says so, rather than a benchmark.
    assert serde._FAST_VALUES == {(1, 0), (3, 0), (4, 0), (5, 0), (6, 0)}
    assert {kind for kind, _ in serde._FAST_KEYS.values()} == set(range(1, 8))
    c = CurrentAssignment(1, 0, MemberState.STABLE, frozenset(), frozenset())
    made = serde._new_current(1, 0, MemberState.STABLE, frozenset(), frozenset(), 0, b"", {})
    assert made == c and type(made) is CurrentAssignment and hash(made) == hash(c)


def test_varints_and_long_values() -> None:
    rnd = random.Random(7)
    big = frozenset(Item(f"connector-{n:03d}", t) for n in range(70) for t in (-1, rnd.randrange(300)))
    for r in (
        rec.target_member("g" * 300, "m" * 200, TargetMember(big, 3, bytes(range(256)) * 3)),
        rec.current_assignment("g", "m", CurrentAssignment(9, 8, MemberState.UNREVOKED_ITEMS, big,
                                                           frozenset({Item("z", 1)}), 1, b"x" * 500)),
        rec.current_assignment("g", "m", CurrentAssignment(
            9, 8, MemberState.UNREVOKED_ITEMS, big, frozenset({Item("z", 1)}), 1, b"x" * 500,
            {item: 1_700_000_000_000_000 + n for n, item in enumerate(sorted(big))})),
        rec.group_metadata("g", 7, 2**62),
        rec.group_member("g", MemberMetadata("m", "i" * 200, "u" * 128, "c" * 127, "h", 5,
                                             (AssignorSpec("a" * 300, 0, 1, 0, 1, b"y" * 1000),) * 3)),
        rec.target_metadata("g", 4, 0, b"s" * 20_000, 123456789012),
    ):
        _check_decoders(*serde.encode_record(r))


def test_unknown_key_class_is_refused_like_replay() -> None:
    # A key of a known type whose record the state cannot apply does not exist today; an
    # unknown record type is skipped, and reported once per record.
    seen: list[serde.UnknownRecordType] = []
    key = struct.pack(">hh", 42, 3)
    stats = serde.replay_log(CoordinatorState(), [[(key, None), (key, b"v")]], on_unknown=seen.append)
    assert (stats.records, stats.applied, stats.skipped) == (2, 0, 2)
    assert [(e.record_type, e.version) for e in seen] == [(42, 3), (42, 3)]
    assert serde.replay_log(CoordinatorState(), []).records == 0
    assert isinstance(serde.decode_key(serde.encode_record(rec.group_metadata("g", 1))[0]), GroupMetadataKey)


def test_gc_is_paused_during_a_load_and_restored() -> None:
    import gc

    seen = []

    def batches() -> Any:
        seen.append(gc.isenabled())
        yield []

    assert gc.isenabled()
    serde.replay_log(CoordinatorState(), batches())
    assert seen == [False] and gc.isenabled() and gc.get_freeze_count() == 0
    with serde.BulkLoader(CoordinatorState()) as first:  # loads in two threads share the pause
        with serde.BulkLoader(CoordinatorState()):
            assert not gc.isenabled()
        assert not gc.isenabled()
        first.add([])
    assert gc.isenabled()
    gc.disable()
    try:
        serde.replay_log(CoordinatorState(), batches())
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()


# -- the log's bulk reader ------------------------------------------------------------------------


def test_read_batches_yields_what_read_yields(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path / "p", segment_bytes=2_000)
    try:
        rnd = random.Random(3)
        for n in range(60):
            log.append([(f"k{rnd.randrange(9)}".encode(), None if rnd.random() < 0.2 else b"v" * n)
                        for _ in range(rnd.randrange(1, 6))])
        log.sync()
        assert len(log.segments) > 3
        flat = [(k, v) for batch in log.read_batches() for k, v in batch]
        assert flat == [(k, v) for _, k, v in log.read()]
        log.compact(now_ms=0, tombstone_grace_ms=0)
        flat = [(k, v) for batch in log.read_batches() for k, v in batch]
        assert flat == [(k, v) for _, k, v in log.read()]
    finally:
        log.close()


def _log_of(directory: Path, records: list[tuple[bytes, bytes | None]], segment_bytes: int) -> None:
    log, _ = PartitionLog.open(directory, segment_bytes=segment_bytes, fsync_fn=lambda fd: None)
    try:
        for i in range(0, len(records), 3):
            log.append(records[i:i + 3])
        log.sync()
    finally:
        log.close()


def test_load_from_the_recovery_sink_equals_record_by_record_replay(tmp_path: Path) -> None:
    rnd = random.Random(5)
    records = [serde.encode_record(rec.group_metadata(f"g{rnd.randrange(3)}", n)) for n in range(40)]
    members = [MemberMetadata(f"m{n}", None, None, "c", "h", 1, ()) for n in range(10)]
    records += [serde.encode_record(rec.group_member("g1", m)) for m in members]
    _log_of(tmp_path / "p", records, segment_bytes=400)
    state = CoordinatorState()
    with serde.BulkLoader(state) as loader:
        log, report = PartitionLog.open(tmp_path / "p", sink=loader.add)
    log.close()
    assert report.clean and len(log.segments) > 3
    assert (loader.stats.records, loader.stats.applied, loader.stats.skipped) == (50, 50, 0)
    expected, error = record_by_record(records)
    assert error is None and state.snapshot() == expected.snapshot()


def test_a_failing_sink_leaves_the_log_as_it_was(tmp_path: Path) -> None:
    records = [serde.encode_record(rec.group_metadata("g", n)) for n in range(20)]
    _log_of(tmp_path / "p", records, segment_bytes=200)
    seen: list[Any] = []

    def sink(batch: Any) -> None:
        seen.append(batch)
        if len(seen) == 3:
            raise ReplayError("refused")

    with contextlib.suppress(ReplayError):
        PartitionLog.open(tmp_path / "p", sink=sink)
    assert len(seen) == 3
    log, report = PartitionLog.open(tmp_path / "p")
    try:
        assert report.clean and [(k, v) for _, k, v in log.read()] == records
    finally:
        log.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.integers(1, 25),
    segment_bytes=st.integers(60, 800),
    compact=st.booleans(),
    mutations=st.lists(st.tuples(st.sampled_from(["flip", "truncate", "zeros", "insert", "append"]),
                                 st.floats(0, 1), st.floats(0, 1), st.integers(1, 40)), max_size=3),
    seed=st.integers(0, 2**32),
)
def test_the_recovery_sink_sees_exactly_what_the_log_keeps(
    batches: int, segment_bytes: int, compact: bool, mutations: list[Any], seed: int
) -> None:
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        log, _ = build_log(directory, batches, segment_bytes=segment_bytes)
        if compact:
            log.compact(now_ms=10**6, tombstone_grace_ms=0)
        log.close()
        for kind, which, where, length in mutations:
            files = segment_files(directory)
            path = files[min(int(which * len(files)), len(files) - 1)]
            path.write_bytes(_mutate(path.read_bytes(), kind, where, length, rnd))
        passed: list[tuple[bytes, bytes | None]] = []
        log, report = PartitionLog.open(directory, segment_bytes=segment_bytes, fsync_fn=lambda fd: None,
                                        sink=passed.extend)
        try:
            assert passed == [(k, v) for _, k, v in log.read()]
            assert passed == [r for batch in log.read_batches() for r in batch]
            assert len(passed) == report.records
        finally:
            log.close()
