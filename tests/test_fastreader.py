"""The compiled readers (connect_wire.fastreader) against the schema walker they replace on the
hot path: the same entity (or both refuse) for valid encodings, encodings with unknown tagged
fields at any depth, and truncated, mutated or random bytes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connect_wire import codec, fastreader, messages, records
from tests.strategies import entities
from tests.test_codec import ref_encode, unknown_tags

CLASSES = [*messages.REQUESTS.values(), *messages.RESPONSES.values(),
           *records.RECORD_KEYS.values(), *records.RECORD_VALUES.values()]
FLEXIBLE = [c for c in CLASSES if c.__flexible__]
each = pytest.mark.parametrize("cls", FLEXIBLE, ids=[c.__name__ for c in FLEXIBLE])
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _outcome(read: Any, data: bytes) -> tuple[str, Any]:
    try:
        value, end = read(data, 0)
    except Exception as exc:  # noqa: BLE001 - compared below
        return "error", type(exc).__name__
    return "ok", (value, end)


def _agree(cls: type, data: bytes) -> None:
    fast = _outcome(fastreader.compile_reader(cls), data)
    walked = _outcome(codec._walker(cls), data)
    assert fast[0] == walked[0], (data, fast, walked)
    if fast[0] == "ok":
        assert fast == walked
    # And through the public entry point: only ever DecodeError.
    try:
        codec.decode(cls, data)
    except codec.DecodeError:
        assert fast[0] == "error"


@each
def test_every_flexible_class_compiles(cls: type) -> None:
    assert fastreader.compile_reader(cls) is not None


@each
@FUZZ
@given(data=st.data())
def test_valid_encodings_read_the_same(cls: type, data: st.DataObject) -> None:
    value = data.draw(entities(cls))
    encoded = ref_encode(value, unknown_tags(data))
    read = fastreader.compile_reader(cls)
    assert read(encoded, 0) == (value, len(encoded))
    _agree(cls, encoded)


@each
@FUZZ
@given(data=st.data())
def test_damaged_encodings_are_refused_alike(cls: type, data: st.DataObject) -> None:
    value = data.draw(entities(cls))
    encoded = bytearray(codec.encode(value))
    if data.draw(st.booleans()):
        del encoded[data.draw(st.integers(0, len(encoded) - 1)):]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            encoded[data.draw(st.integers(0, len(encoded) - 1))] = data.draw(st.integers(0, 255))
    _agree(cls, bytes(encoded))


@each
@FUZZ
@given(data=st.binary(max_size=64))
def test_random_bytes_are_refused_alike(cls: type, data: bytes) -> None:
    _agree(cls, data)


def test_huge_declared_lengths_are_refused_before_allocating() -> None:
    # Heartbeat request: group "g", member "m", epoch, nulls, then ClientAssignors declaring
    # 2**32 - 2 items in a 20-byte message.
    frame = b"\x02g\x02m\x00\x00\x00\x01\x00\xff\xff\xff\xff\x00\xff\xff\xff\xff\x0f"
    with pytest.raises(fastreader.FastDecodeError, match="declares more items"):
        fastreader.compile_reader(messages.ConnectGroupHeartbeatRequest)(frame, 0)
    with pytest.raises(codec.DecodeError):
        codec.decode(messages.ConnectGroupHeartbeatRequest, frame)


def test_varints_longer_than_five_bytes_are_refused() -> None:
    with pytest.raises(fastreader.FastDecodeError):
        fastreader.uvarint(b"\xff\xff\xff\xff\xff\x01", 0)
    assert fastreader.uvarint(b"\xff\xff\xff\xff\x0f", 0) == (2**32 - 1, 5)


def test_a_bool_byte_other_than_0_or_1_is_refused() -> None:
    """Found by the damaged-encodings test: struct's "?" reads 2 as True; kio refuses it."""
    frame = b"\x01\x01\x02\x01\x02\x00"  # ValidateOnly = 2
    with pytest.raises(codec.DecodeError):
        codec.decode(messages.ConnectGroupAlterConnectorsRequest, frame)
    assert codec.decode(messages.ConnectGroupAlterConnectorsRequest, b"\x01\x01\x02\x01\x01\x00")[0] \
        .validate_only is True


def test_known_tagged_fields_default_repeat_and_unknown_neighbours() -> None:
    """ConnectGroupDescribeResponse's tagged fields: absent = the default, present =
    read from their own bytes, a repeated tag keeps the last, unknown tags around them skipped;
    both readers agree, and the compiled writer writes what kio writes."""
    from connect_wire.messages import connect_group_describe_response_v0 as d

    task = d.TaskId(connector="B", task=2)
    member = d.Member(member_id="m", instance_id=None, worker_url=None, client_id="c",
                      client_host="h", member_epoch=3, member_state="Stable",
                      assignment=d.Assignment(), target_assignment=d.Assignment(),
                      revoking_connectors=("B",), revoking_tasks=(task,))
    plain = d.Member(member_id="m", instance_id=None, worker_url=None, client_id="c",
                     client_host="h", member_epoch=3, member_state="Stable",
                     assignment=d.Assignment(), target_assignment=d.Assignment())
    for value in (member, plain):
        assert codec.encode(value) == codec.kio_encode(value)
        assert fastreader.compile_reader(d.Member)(codec.encode(value), 0)[0] == value
        spliced = ref_encode(value, lambda s, top=value: [(7, b"junk"), (300, b"")]
                             if s is top else [])
        assert fastreader.compile_reader(d.Member)(spliced, 0) == (value, len(spliced))
        _agree(d.Member, spliced)
    # Tag 0 twice: the last one counts, as the walker reads it. (Tag 0's bytes: a compact
    # array of one compact string, 02 02 'A'.)
    body = codec.encode(plain)[:-1]  # without its (empty) tagged fields section
    twice = body + b"\x02" + b"\x00\x03\x02\x02A" + b"\x00\x03\x02\x02B"
    value, end = fastreader.compile_reader(d.Member)(twice, 0)
    assert value.revoking_connectors == ("B",) and end == len(twice)
    _agree(d.Member, twice)
