"""Kafka Connect's embedded protocol codec (connect_wire.classic_connect): fixed byte vectors
written out by hand from ConnectProtocol / IncrementalCooperativeConnectProtocol's schemas,
round trips, and strict refusals of garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connect_wire import classic_connect as cc
from connect_wire.items import Item

# Version 0 metadata: Version 0, Url "http://w1:8083" (14 bytes), ConfigOffset 7.
META_V0 = bytes.fromhex("0000" "000e") + b"http://w1:8083" + bytes.fromhex("0000000000000007")

# Version 1 assignment: error 0, leader "L", leaderUrl "u", offset 5,
# Assignment [("a", [-1, 0, 1])], Revoked [("b", [2])], ScheduledDelay 1000.
ASSIGN_V1 = bytes.fromhex(
    "0001" "0000" "0001") + b"L" + bytes.fromhex("0001") + b"u" + bytes.fromhex(
    "0000000000000005"
    "00000001" "0001") + b"a" + bytes.fromhex(
    "00000003" "ffffffff" "00000000" "00000001"
    "00000001" "0001") + b"b" + bytes.fromhex(
    "00000001" "00000002"
    "000003e8")

# Version 2 metadata with that assignment as its allocation.
META_V2 = (bytes.fromhex("0002" "000e") + b"http://w1:8083" + bytes.fromhex("0000000000000007")
           + len(ASSIGN_V1).to_bytes(4, "big") + ASSIGN_V1)

# Version 0 assignment: error 1 (CONFIG_MISMATCH), leader "", leaderUrl "", offset -1, no entries.
ASSIGN_V0 = bytes.fromhex("0000" "0001" "0000" "0000" "ffffffffffffffff" "00000000")


def test_fixed_vectors_decode_and_encode_byte_for_byte() -> None:
    m = cc.decode_metadata(META_V0)
    assert m == cc.WorkerMetadata(0, "http://w1:8083", 7, None)
    assert cc.encode_metadata(m) == META_V0

    a = cc.decode_assignment(ASSIGN_V1)
    assert a == cc.Assignment(1, 0, "L", "u", 5, (("a", (-1, 0, 1)),), (("b", (2,)),), 1000)
    assert cc.encode_assignment(a) == ASSIGN_V1
    assert a.assigned_items() == {Item("a", -1), Item("a", 0), Item("a", 1)}
    assert a.revoked_items() == {Item("b", 2)}

    m2 = cc.decode_metadata(META_V2)
    assert m2.version == 2 and m2.allocation == ASSIGN_V1
    assert cc.encode_metadata(m2) == META_V2
    assert cc.allocation_items(m2) == a.assigned_items()

    z = cc.decode_assignment(ASSIGN_V0)
    assert z == cc.Assignment(0, cc.CONFIG_MISMATCH, "", "", -1, ())
    assert cc.encode_assignment(z) == ASSIGN_V0


def test_null_allocation_and_missing_tail_fields_as_kafka_reads_them() -> None:
    null_alloc = META_V0[:2].replace(b"\x00\x00", b"\x00\x01") + META_V0[2:] + b"\xff\xff\xff\xff"
    assert cc.decode_metadata(null_alloc) == cc.WorkerMetadata(1, "http://w1:8083", 7, None)
    # a version 1 value without its Allocation (TOLERATE_MISSING_FIELDS_WITH_DEFAULTS)
    assert cc.decode_metadata(b"\x00\x01" + META_V0[2:]).allocation is None
    # a version 1 assignment cut after Assignment: Revoked null, delay 0
    cut = ASSIGN_V1[: ASSIGN_V1.index(b"\x00\x00\x00\x01\x00\x01b")]
    a = cc.decode_assignment(cut)
    assert a.revoked is None and a.delay_ms == 0
    # a null Assignment in version 1
    null_assigned = b"\x00\x01" + ASSIGN_V0[2:-4] + b"\xff\xff\xff\xff"
    assert cc.decode_assignment(null_assigned).assigned is None
    # a newer version is read as version 2, what follows ignored
    assert cc.decode_metadata(b"\x00\x07" + META_V2[2:] + b"future").version == 2


@pytest.mark.parametrize("data, words", [
    (b"", "Version needs 2 bytes"),
    (b"\xff\xff", "Version -1 is negative"),
    (META_V0[:5], "Url needs 14 bytes"),
    (b"\x00\x00\xff\xff", "Url has length -1"),
    (META_V0 + b"x", "1 bytes left over"),
    (b"\x00\x00\x00\x01\xff" + META_V0[-8:], "Url is not UTF-8"),
    (b"\x00\x01" + META_V0[2:] + b"\xff\xff\xff\xfe", "Allocation has length -2"),
    (b"\x00\x01" + META_V0[2:] + b"\x00\x00\x00\x02zz", "assignment"),
])
def test_garbage_metadata_refused_precisely(data: bytes, words: str) -> None:
    with pytest.raises(cc.ConnectProtocolError, match=words):
        cc.decode_metadata(data)


@pytest.mark.parametrize("data, words", [
    (ASSIGN_V0[:-4] + b"\xff\xff\xff\xff", "Assignment has count -1: it cannot be null"),
    (ASSIGN_V0[:-4] + b"\x7f\xff\xff\xff", "claims 2147483647 entries"),
    (ASSIGN_V1[:-3], "ScheduledDelay needs 4 bytes"),
    (ASSIGN_V0[:-4] + b"\x00\x00\x00\x01\x00\x01a\xff\xff\xff\xff",
     "Tasks of 'a' has count -1"),
    (ASSIGN_V0[:-4] + b"\x00\x00\x00\x01\x00\x01a\x00\x00\x00\x01\xff\xff\xff\xfe",
     "task id below -1"),
])
def test_garbage_assignment_refused_precisely(data: bytes, words: str) -> None:
    with pytest.raises(cc.ConnectProtocolError, match=words):
        cc.decode_assignment(data)


names = st.text(min_size=0, max_size=12)
entries = st.lists(st.tuples(names, st.lists(st.integers(-1, 2**31 - 1), max_size=5)
                             .map(tuple)), max_size=5).map(tuple)


@given(st.integers(0, 2), names, st.integers(-2**63, 2**63 - 1), entries,
       st.none() | entries, st.integers(-2**31, 2**31 - 1), st.integers(-2**15, 2**15 - 1),
       names, names, st.booleans())
def test_round_trip(version: int, url: str, offset: int, assigned: cc.Entries,
                    revoked: cc.Entries | None, delay: int, error: int, leader: str,
                    leader_url: str, null_assigned: bool) -> None:
    a = cc.Assignment(version, error, leader, leader_url, offset,
                      None if (null_assigned and version) else assigned,
                      revoked if version else None, delay if version else 0)
    raw = cc.encode_assignment(a)
    assert cc.decode_assignment(raw) == a
    allocation = raw if version else None
    m = cc.WorkerMetadata(version, url, offset, allocation)
    assert cc.decode_metadata(cc.encode_metadata(m)) == m


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_the_codec_error(data: bytes) -> None:
    for decode in (cc.decode_metadata, cc.decode_assignment):
        try:
            decode(data)
        except cc.ConnectProtocolError:
            pass


def test_entries_of_groups_as_connects_serializer() -> None:
    items = {Item("b", 1), Item("a", 0), Item("a", -1), Item("b", 0)}
    assert cc.entries_of(items) == (("a", (-1, 0)), ("b", (0, 1)))
    assert cc.items_of(cc.entries_of(items)) == items
