"""The wire codec: round trips, byte equality with two independent encoders, Kafka's
skip-unknown-tags rule, error codes outside kio's enum, malformed input, and the generator.

Every generated class is covered: the request and response of the five connect APIs and every
record key and value. The independent oracle is kafka-python 3.x loading OUR schemas/ at runtime
(see tests/kafka_python_oracle.py).
"""


import dataclasses
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, ClassVar, get_args, get_origin

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import writers as kw
from kio.serial._serialize import get_writer
from kio.static.constants import EntityType

import tools.codegen as codegen
from connect_wire import apis, codec, messages, records
from connect_wire.messages import connect_group_heartbeat_response_v0 as hb_response
from tests.kafka_python_oracle import Oracle
from tests.strategies import entities

ROOT = Path(__file__).resolve().parent.parent

MESSAGE_CLASSES = [*messages.REQUESTS.values(), *messages.RESPONSES.values()]
RECORD_CLASSES = [*records.RECORD_KEYS.values(), *records.RECORD_VALUES.values()]
ALL_CLASSES = MESSAGE_CLASSES + RECORD_CLASSES
RESPONSE_CLASSES = list(messages.RESPONSES.values())
TAGGABLE_CLASSES = [c for c in ALL_CLASSES if c.__flexible__]


def _ids(classes: list[type]) -> list[str]:
    return [c.__name__ for c in classes]


every_class = pytest.mark.parametrize("cls", ALL_CLASSES, ids=_ids(ALL_CLASSES))

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_every_schema_has_a_class() -> None:
    assert len(messages.REQUESTS) == len(messages.RESPONSES) == 9
    assert sorted(k for k, _ in messages.REQUESTS) == list(range(10000, 10009))
    assert sorted(messages.RESPONSES) == sorted(messages.REQUESTS)
    assert sorted(records.RECORD_KEYS) == sorted(records.RECORD_VALUES)
    schema_files = list((ROOT / "schemas").glob("*.json"))
    record_files = list((ROOT / "schemas" / "records").glob("*.json"))
    assert len(MESSAGE_CLASSES) == len(schema_files) == 18
    assert len(RECORD_CLASSES) == len(record_files) == 22


# -- round trips ------------------------------------------------------------------------------


@every_class
@PROPERTY
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    value = data.draw(entities(cls))
    encoded = codec.encode(value)
    assert isinstance(encoded, bytes)
    decoded, end = codec.decode(cls, encoded)
    assert end == len(encoded)
    assert decoded == value
    assert type(decoded) is cls
    # decoding at an offset returns the absolute end offset
    prefix = data.draw(st.binary(max_size=8))
    decoded, end = codec.decode(cls, prefix + encoded + b"trailing", offset=len(prefix))
    assert (decoded, end) == (value, len(prefix) + len(encoded))
    buffer = io.BytesIO(b"xy")
    buffer.seek(2)
    codec.encode_into(buffer, value)
    assert buffer.getvalue() == b"xy" + encoded


@every_class
@PROPERTY
@given(data=st.data())
def test_specialised_writer_matches_kio(cls: type, data: st.DataObject) -> None:
    value = data.draw(entities(cls))
    assert codec.encode(value) == codec.kio_encode(value)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=_ids(ALL_CLASSES))
def test_specialised_writer_is_used(cls: type) -> None:
    """Every generated class gets a compiled writer, tagged fields included (issue 14 added the
    first ones: ConnectGroupDescribeResponse's Members[].RevokingConnectors/RevokingTasks and
    Holds)."""
    from connect_wire import fastwriter

    assert fastwriter.compile_writer(cls) is not None


def test_large_arrays_and_long_strings() -> None:
    """Array and string lengths that need multi-byte varints, deterministically."""
    r = messages.ConnectGroupHeartbeatRequest
    mod = sys.modules[r.__module__]
    value = r(
        group_id="g" * 300,
        member_id="\U0001f600" * 70,  # 280 UTF-8 bytes, non-BMP
        member_epoch=2**31 - 1,
        instance_id="",
        rebalance_timeout_ms=-(2**31),
        worker_url="http://w:8083",
        client_assignors=tuple(
            mod.Assignor(
                name=f"a{i}", minimum_version=-(2**15), maximum_version=2**15 - 1,
                reason=-128, metadata_version=i, metadata_bytes=bytes(range(256)) * 3,
            )
            for i in range(130)
        ),
        owned_connectors=tuple(f"c{i}" for i in range(20_000)),
        owned_tasks=tuple(mod.TaskId(connector=f"c{i % 7}", task=i) for i in range(17_000)),
        max_wait_ms=0,
    )
    encoded = codec.encode(value)
    assert encoded == codec.kio_encode(value)
    assert codec.decode(r, encoded) == (value, len(encoded))


def test_golden_bytes() -> None:
    """One heartbeat response spelled out byte by byte from docs/protocol.md and Kafka's rules."""
    value = messages.ConnectGroupHeartbeatResponse(
        throttle_time_ms=0, error_code=10001, error_message=None, member_id="m",
        member_epoch=3, heartbeat_interval_ms=5, should_compute_assignment=True,
        assignment=hb_response.Assignment(
            error=1, connectors=("x",),
            tasks=(hb_response.TaskId(connector="c", task=3),),
            metadata_version=2, metadata_bytes=b"ab",
        ),
    )
    golden = bytes.fromhex(
        "00000000"  # ThrottleTimeMs
        "2711"  # ErrorCode 10001
        "00"  # ErrorMessage null (compact nullable string)
        "026d"  # MemberId "m"
        "00000003"  # MemberEpoch
        "00000005"  # HeartbeatIntervalMs
        "01"  # ShouldComputeAssignment
        "01"  # Assignment present (KIP-893 marker)
        "01"  # .Error
        "02" "0278"  # .Connectors ["x"]
        "02" "0263" "00000003" "00"  # .Tasks [{"c", 3}], TaskId's empty tagged fields
        "0002"  # .MetadataVersion
        "036162"  # .MetadataBytes b"ab"
        "00"  # Assignment's tagged fields
        "00"  # top-level tagged fields
    )
    assert codec.encode(value) == golden
    assert codec.decode(messages.ConnectGroupHeartbeatResponse, golden) == (value, len(golden))
    no_assignment = dataclasses.replace(value, assignment=None)
    assert codec.encode(no_assignment) == golden[:18] + b"\xff\x00"


# -- kafka-python as an independent encoder ----------------------------------------------------


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Oracle:
    return Oracle(tmp_path_factory.mktemp("kafka_python_schemas"))


def test_oracle_loaded_every_schema(oracle: Oracle) -> None:
    assert set(oracle.classes) == {c.__name__ for c in ALL_CLASSES}
    for cls in MESSAGE_CLASSES:
        assert oracle.classes[cls.__name__].API_KEY == cls.__api_key__


def test_oracle_golden(oracle: Oracle) -> None:
    """The oracle is not vacuous: it produces the hand-computed bytes, and different bytes for a
    different value."""
    value = messages.ConnectGroupPrepareAssignmentRequest(
        group_id="g", member_id="\u00e9", member_epoch=-2
    )
    assert oracle.encode(value) == bytes.fromhex("0267" "03c3a9" "fffffffe" "00")
    other = dataclasses.replace(value, member_epoch=-3)
    assert oracle.encode(other) != oracle.encode(value)


@every_class
@PROPERTY
@given(data=st.data())
def test_kafka_python_encodes_the_same_bytes(
    oracle: Oracle, cls: type, data: st.DataObject
) -> None:
    value = data.draw(entities(cls))
    ours = codec.encode(value)
    theirs = oracle.encode(value)
    assert theirs == ours
    # and each side decodes the other's bytes to the same value
    assert codec.decode(cls, theirs) == (value, len(theirs))
    assert oracle.decode(cls, ours) == value


# -- unknown tagged fields ---------------------------------------------------------------------

TagSource = Callable[[Any], list[tuple[int, bytes]]]


def _no_tags(_: Any) -> list[tuple[int, bytes]]:
    return []


def _optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) is UnionType:
        return next(a for a in get_args(tp) if a is not NoneType), True
    return tp, False


def ref_encode(entity: Any, extra_tags: TagSource = _no_tags) -> bytes:
    """A reference writer (kio's primitive writers, our own struct walk) that can add extra
    tagged fields to any struct instance: ``extra_tags(struct) -> [(tag, payload), ...]``."""
    buffer = io.BytesIO()
    _write_entity(buffer, entity, extra_tags)
    return buffer.getvalue()


def _write_entity(buffer: io.BytesIO, entity: Any, extra_tags: TagSource) -> None:
    flexible = type(entity).__flexible__
    tagged: list[tuple[int, bytes]] = []
    for f in fields(entity):
        value = getattr(entity, f.name)
        tag = f.metadata.get("tag")
        if tag is None:
            _write_field(buffer, f, value, flexible, extra_tags, as_tag=False)
        elif value != f.default:  # Kafka writes a tagged field only when not at its default
            payload = io.BytesIO()
            _write_field(payload, f, value, flexible, extra_tags, as_tag=True)
            tagged.append((int(tag), payload.getvalue()))
    if not flexible:
        return
    tagged.extend(extra_tags(entity))
    tagged.sort()
    kw.write_unsigned_varint(buffer, len(tagged))
    for tag, payload in tagged:
        kw.write_unsigned_varint(buffer, tag)
        kw.write_unsigned_varint(buffer, len(payload))
        buffer.write(payload)


def _write_field(
    buffer: io.BytesIO, f: Any, value: Any, flexible: bool, extra_tags: TagSource, as_tag: bool
) -> None:
    tp, nullable = _optional(f.type)
    nullable = nullable and not as_tag
    kafka_type = f.metadata.get("kafka_type")
    if get_origin(tp) is tuple:
        inner = get_args(tp)[0]
        if value is None:
            assert nullable
            if flexible:
                kw.write_unsigned_varint(buffer, 0)
            else:
                kw.write_int32(buffer, -1)
            return
        if flexible:
            kw.write_unsigned_varint(buffer, len(value) + 1)
        else:
            kw.write_int32(buffer, len(value))
        for item in value:
            if is_dataclass(inner):
                _write_entity(buffer, item, extra_tags)
            else:
                get_writer(kafka_type, flexible, False)(buffer, item)
    elif is_dataclass(tp):
        if nullable:
            if value is None:
                buffer.write(b"\xff")
                return
            buffer.write(b"\x01")
        _write_entity(buffer, value, extra_tags)
    else:
        get_writer(kafka_type, flexible, nullable)(buffer, value)


_tag_numbers = st.one_of(st.integers(0, 20), st.integers(0, 2**31 - 1))
_tag_lists = st.lists(
    st.tuples(_tag_numbers, st.binary(max_size=12)), max_size=3, unique_by=lambda t: t[0]
)


def _structs_in_tagged_fields(cls: type) -> bool:
    """Does ``cls`` (or a struct under it) have a tagged field holding structs?"""
    for f in fields(cls):
        tp, _ = _optional(f.type)
        inner = get_args(tp)[0] if get_origin(tp) is tuple else tp
        if is_dataclass(inner):
            if "tag" in f.metadata or _structs_in_tagged_fields(inner):
                return True
    return False


def unknown_tags(data: st.DataObject) -> TagSource:
    """Extra tagged fields for any struct, drawn from ``_tag_lists`` less the struct's own tags
    (a known tag's bytes are that field's value, not an unknown field to skip)."""

    def extra(struct: Any) -> list[tuple[int, bytes]]:
        known = {int(f.metadata["tag"]) for f in fields(struct) if "tag" in f.metadata}
        return [(tag, payload) for tag, payload in data.draw(_tag_lists) if tag not in known]

    return extra


@every_class
@PROPERTY
@given(data=st.data())
def test_reference_writer_agrees(cls: type, data: st.DataObject) -> None:
    value = data.draw(entities(cls))
    assert ref_encode(value) == codec.encode(value)


@pytest.mark.parametrize("cls", TAGGABLE_CLASSES, ids=_ids(TAGGABLE_CLASSES))
@PROPERTY
@given(data=st.data())
def test_unknown_tags_are_skipped_everywhere(
    oracle: Oracle, cls: type, data: st.DataObject
) -> None:
    value = data.draw(entities(cls))
    spliced = ref_encode(value, unknown_tags(data))
    assert codec.decode(cls, spliced) == (value, len(spliced))
    assert codec.decode(cls, b"\x00" + spliced, offset=1) == (value, 1 + len(spliced))
    if not _structs_in_tagged_fields(cls):
        # kafka-python skips them too, except in a struct inside a tagged field: its
        # TaggedFields.decode asserts such a struct has no tagged fields of its own (a quirk of
        # kafka-python 3.x; Kafka writes the section, and our readers read it, as above).
        assert oracle.decode(cls, spliced) == value


def test_unknown_tag_in_top_level_and_nested_task_id() -> None:
    """The brief's example: tags in the heartbeat response and in a TaskId of its assignment."""
    cls = messages.ConnectGroupHeartbeatResponse
    value = cls(
        member_epoch=7, heartbeat_interval_ms=1000, should_compute_assignment=False,
        assignment=hb_response.Assignment(
            error=0, connectors=("c1",),
            tasks=(hb_response.TaskId(connector="c1", task=0),
                   hb_response.TaskId(connector="c1", task=1)),
            metadata_version=1, metadata_bytes=b"",
        ),
    )
    plain = codec.encode(value)

    def tags(struct: Any) -> list[tuple[int, bytes]]:
        if isinstance(struct, hb_response.TaskId) and struct.task == 1:
            return [(0, b"\x01\x02\x03"), (300, b"")]
        if isinstance(struct, cls):
            return [(5, b"future" * 30)]  # 180-byte payload: two-byte length varint
        return []

    spliced = ref_encode(value, tags)
    assert len(spliced) == len(plain) + (1 + 1 + 3) + (2 + 1) + (1 + 2 + 180)
    assert spliced != plain
    assert codec.decode(cls, spliced) == (value, len(spliced))


# A newer version of the heartbeat response, as a peer built from a later schema would have it:
# one tagged field added at the top level, one in Assignment, one in TaskId.


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTaskId:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[int] = 0
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = 10000
    __header_schema__: ClassVar[type | None] = ResponseHeader
    connector: str = field(metadata={"kafka_type": "string"})
    task: int = field(metadata={"kafka_type": "int32"})
    weight: int = field(metadata={"kafka_type": "int32", "tag": 0}, default=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewAssignment:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[int] = 0
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = 10000
    __header_schema__: ClassVar[type | None] = ResponseHeader
    error: int = field(metadata={"kafka_type": "int8"})
    connectors: tuple[str, ...] = field(metadata={"kafka_type": "string"}, default=())
    tasks: tuple[NewTaskId, ...] = field(default=())
    metadata_version: int = field(metadata={"kafka_type": "int16"})
    metadata_bytes: bytes = field(metadata={"kafka_type": "bytes"})
    lease_ms: int = field(metadata={"kafka_type": "int64", "tag": 2}, default=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewHeartbeatResponse:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[int] = 0
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = 10000
    __header_schema__: ClassVar[type | None] = ResponseHeader
    throttle_time_ms: int = field(metadata={"kafka_type": "int32"}, default=0)
    error_code: int = field(metadata={"kafka_type": "int16"}, default=0)
    error_message: str | None = field(metadata={"kafka_type": "string"}, default=None)
    member_id: str | None = field(metadata={"kafka_type": "string"}, default=None)
    member_epoch: int = field(metadata={"kafka_type": "int32"})
    heartbeat_interval_ms: int = field(metadata={"kafka_type": "int32"})
    should_compute_assignment: bool = field(metadata={"kafka_type": "bool"})
    assignment: NewAssignment | None = field(default=None)
    coordinator_rack: str | None = field(metadata={"kafka_type": "string", "tag": 0}, default=None)
    session_timeout_ms: int = field(metadata={"kafka_type": "int32", "tag": 7}, default=0)


def _to_old(new: NewHeartbeatResponse) -> Any:
    a = new.assignment
    return messages.ConnectGroupHeartbeatResponse(
        throttle_time_ms=new.throttle_time_ms, error_code=new.error_code,
        error_message=new.error_message, member_id=new.member_id,
        member_epoch=new.member_epoch, heartbeat_interval_ms=new.heartbeat_interval_ms,
        should_compute_assignment=new.should_compute_assignment,
        assignment=None if a is None else hb_response.Assignment(
            error=a.error, connectors=a.connectors,
            tasks=tuple(hb_response.TaskId(connector=t.connector, task=t.task) for t in a.tasks),
            metadata_version=a.metadata_version, metadata_bytes=a.metadata_bytes,
        ),
    )


@PROPERTY
@given(data=st.data())
def test_newer_schema_decoded_by_older_class(data: st.DataObject) -> None:
    new = data.draw(entities(NewHeartbeatResponse))
    encoded = codec.encode(new)  # tagged fields: kio's writer
    assert encoded == ref_encode(new)
    old = _to_old(new)
    assert codec.decode(messages.ConnectGroupHeartbeatResponse, encoded) == (old, len(encoded))
    # and the newer class reads the older bytes, with its defaults for the new fields
    old_bytes = codec.encode(old)
    decoded, end = codec.decode(NewHeartbeatResponse, old_bytes)
    assert end == len(old_bytes)
    assert _to_old(decoded) == old
    assert decoded.coordinator_rack is None and decoded.session_timeout_ms == 0
    # known tags next to unknown ones: the fallback decoder must still read the known ones
    spliced = ref_encode(new, lambda _struct: [(1, b"?"), (9, b"")])
    assert codec.decode(NewHeartbeatResponse, spliced) == (new, len(spliced))


def test_newer_schema_example() -> None:
    new = NewHeartbeatResponse(
        member_epoch=1, heartbeat_interval_ms=2, should_compute_assignment=True,
        assignment=NewAssignment(
            error=0, tasks=(NewTaskId(connector="c", task=0, weight=9),),
            metadata_version=0, metadata_bytes=b"", lease_ms=2**40,
        ),
        coordinator_rack="rack-a", session_timeout_ms=45_000,
    )
    encoded = codec.encode(new)
    assert len(encoded) > len(codec.encode(_to_old(new)))
    assert codec.decode(messages.ConnectGroupHeartbeatResponse, encoded)[0] == _to_old(new)
    assert codec.decode(NewHeartbeatResponse, encoded)[0] == new


# -- error codes outside kio's ErrorCode enum --------------------------------------------------


def _minimal(cls: type, error_code: int) -> Any:
    """The smallest value of ``cls``, with ``error_code`` in every struct that has one (arrays
    of such structs get one item)."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        tp, nullable = _optional(f.type)
        if f.name == "error_code":
            values[f.name] = error_code
        elif get_origin(tp) is tuple:
            inner = get_args(tp)[0]
            if is_dataclass(inner) and _has_error_code(inner):
                values[f.name] = (_minimal(inner, error_code),)
            else:
                values[f.name] = ()
        elif is_dataclass(tp):
            values[f.name] = _minimal(tp, error_code)
        elif nullable:
            values[f.name] = None
        else:
            values[f.name] = {"string": "", "bytes": b"", "bool": False}.get(
                f.metadata["kafka_type"], 0
            )
    return cls(**values)


def _has_error_code(cls: type) -> bool:
    for f in fields(cls):
        tp, _ = _optional(f.type)
        if f.name == "error_code":
            return True
        if get_origin(tp) is tuple:
            tp = get_args(tp)[0]
        if is_dataclass(tp) and _has_error_code(tp):
            return True
    return False


def _error_codes(value: Any) -> list[int]:
    found = []
    for f in fields(value):
        v = getattr(value, f.name)
        if f.name == "error_code":
            found.append(v)
        for item in v if isinstance(v, tuple) else (v,):
            if is_dataclass(item):
                found.extend(_error_codes(item))
    return found


@pytest.mark.parametrize("code", [10000, 10001, 2**15 - 1, -1, -(2**15), 35])
@pytest.mark.parametrize("cls", RESPONSE_CLASSES, ids=_ids(RESPONSE_CLASSES))
def test_error_codes_beyond_kios_enum(oracle: Oracle, cls: type, code: int) -> None:
    assert _has_error_code(cls)
    value = _minimal(cls, code)
    encoded = codec.encode(value)
    decoded, end = codec.decode(cls, encoded)
    assert (decoded, end) == (value, len(encoded))
    assert _error_codes(decoded) == [code]
    assert type(_error_codes(decoded)[0]) is int
    assert oracle.encode(value) == encoded


def test_error_code_field_is_int16() -> None:
    with pytest.raises(struct.error):
        codec.encode(_minimal(messages.ConnectGroupHeartbeatResponse, 2**15))


# -- malformed input ---------------------------------------------------------------------------

def _decode_or_decode_error(cls: type, data: bytes, offset: int = 0) -> Any:
    try:
        value, end = codec.decode(cls, data, offset)
    except codec.DecodeError:
        return None
    except BaseException as exc:  # noqa: BLE001 - that is the point of the test
        pytest.fail(f"decode raised {type(exc).__name__}: {exc!r}, not DecodeError")
    assert offset <= end <= len(data)
    assert isinstance(value, cls)
    return value


@every_class
@FUZZ
@given(data=st.binary(max_size=200))
@example(data=b"")
@example(data=b"\xff" * 3)
def test_random_bytes_only_raise_decode_error(cls: type, data: bytes) -> None:
    _decode_or_decode_error(cls, data)


@every_class
@FUZZ
@given(data=st.data())
def test_truncations_raise_decode_error(cls: type, data: st.DataObject) -> None:
    value = data.draw(entities(cls))
    tagged = cls in TAGGABLE_CLASSES and data.draw(st.booleans())
    encoded = ref_encode(value, lambda _s: data.draw(_tag_lists)) if tagged else codec.encode(value)
    cuts = range(len(encoded)) if len(encoded) <= 200 else sorted(
        data.draw(st.sets(st.integers(0, len(encoded) - 1), min_size=1, max_size=100))
    )
    for cut in cuts:
        with pytest.raises(codec.DecodeError):
            codec.decode(cls, encoded[:cut])


@every_class
@FUZZ
@given(data=st.data())
def test_mutations_only_raise_decode_error(cls: type, data: st.DataObject) -> None:
    value = data.draw(entities(cls))
    tagged = cls in TAGGABLE_CLASSES and data.draw(st.booleans())
    encoded = bytearray(
        ref_encode(value, lambda _s: data.draw(_tag_lists)) if tagged else codec.encode(value)
    )
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(encoded) - 1))
        encoded[position] = data.draw(st.integers(0, 255))
    _decode_or_decode_error(cls, bytes(encoded))


def test_walker_rejects_null_for_non_nullable_array() -> None:
    """The fallback decoder (taken when unknown tags are present) refuses a null array where
    the schema does not allow one."""
    # GroupIds = null (0x00), then a tagged-field section with one unknown tag 5 (empty).
    with pytest.raises(codec.DecodeError):
        codec.decode(messages.ConnectGroupDescribeRequest, b"\x00\x01\x05\x00")


# -- bugs the tests found (kept as regressions) ------------------------------------------------


def test_native_path_rejects_null_for_non_nullable_array() -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode(messages.ConnectGroupDescribeRequest, b"\x00\x00")


def test_decode_accepts_any_buffer() -> None:
    """bytes, bytearray and memoryviews of either (kio's native reader alone refuses writable
    buffers), also on the fallback path that skips unknown tags."""
    value = messages.ConnectGroupPrepareAssignmentRequest(group_id="g", member_id="m",
                                                          member_epoch=1)
    for encoded in (codec.encode(value), ref_encode(value, lambda _s: [(3, b"x")])):
        data = b"\x00\x00" + encoded
        for buffer in (data, bytearray(data), memoryview(data), memoryview(bytearray(data))):
            assert codec.decode(type(value), buffer, 2) == (value, len(data))


def test_walker_reads_non_nullable_nested_struct() -> None:
    d = sys.modules[messages.ConnectGroupDescribeResponse.__module__]
    member = d.Member(
        member_id="m", instance_id=None, worker_url=None, client_id="c", client_host="h",
        member_epoch=1, member_state="Stable", assignment=d.Assignment(),
        target_assignment=d.Assignment(),
    )
    group = d.DescribedGroup(
        error_code=0, error_message=None, group_id="g", group_state="Stable", group_epoch=1,
        assignment_epoch=1, assignor_name=None, assigning_member_id=None, members=(member,),
    )
    value = messages.ConnectGroupDescribeResponse(groups=(group,))
    plain = codec.encode(value)
    assert plain[-1:] == b"\x00"
    spliced = plain[:-1] + b"\x01\x05\x00"  # one unknown, empty tag 5 at the top level
    assert codec.decode(type(value), spliced) == (value, len(spliced))


_HUGE_ARRAY_CHILD = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # 2 GiB: deterministic failure
    from connect_wire import codec, messages
    data = bytes.fromhex(sys.argv[1])
    try:
        codec.decode(messages.ConnectGroupHeartbeatRequest, data)
    except codec.DecodeError:
        print("DecodeError")
    """
)


def test_huge_array_length_is_a_decode_error() -> None:
    data = (
        b"\x02g" b"\x02m" b"\x00\x00\x00\x01"  # GroupId, MemberId, MemberEpoch
        b"\x00" b"\xff\xff\xff\xff" b"\x00"  # InstanceId null, RebalanceTimeoutMs, WorkerUrl null
        b"\xff\xff\xff\xff\x0f"  # ClientAssignors: compact length 2**32 - 1
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", _HUGE_ARRAY_CHILD, data.hex()],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False,
    )
    assert child.returncode == 0, f"child died ({child.returncode}): {child.stderr[:300]}"
    assert child.stdout.strip() == "DecodeError"


# -- the generator -----------------------------------------------------------------------------


def test_codegen_is_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    status = codegen.main(["--check"])
    out = capsys.readouterr()
    assert status == 0, out.out + out.err


def test_codegen_check_detects_a_changed_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(ROOT / "schemas", tmp_path / "schemas")
    for target in codegen.TARGETS.values():
        rel = target.relative_to(ROOT)
        shutil.copytree(target, tmp_path / rel, ignore=shutil.ignore_patterns("__pycache__"))
    schemas = tmp_path / "schemas"
    monkeypatch.setattr(codegen, "ROOT", tmp_path)
    monkeypatch.setattr(codegen, "SCHEMAS", schemas)
    monkeypatch.setattr(codegen, "TARGETS", {
        schemas: tmp_path / "connect_wire" / "messages",
        schemas / "records": tmp_path / "connect_wire" / "records",
    })
    assert codegen.main(["--check"]) == 0  # the copy is as fresh as the original
    path = schemas / "ConnectGroupDescribeRequest.json"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('"about": "', '"about": "Changed. ', 1), encoding="utf-8")
    capsys.readouterr()
    assert codegen.main(["--check"]) == 1
    assert "connect_group_describe_request_v0.py" in capsys.readouterr().out
    changed = {
        p.relative_to(tmp_path): t for p, t in codegen.generate().items()
        if p.read_text(encoding="utf-8") != t
    }
    assert list(changed) == [Path("connect_wire/messages/connect_group_describe_request_v0.py")]
    assert "Changed. " in next(iter(changed.values()))


def _schema_files() -> list[Path]:
    return sorted((ROOT / "schemas").glob("*.json")) + sorted(
        (ROOT / "schemas" / "records").glob("*.json")
    )


@pytest.mark.parametrize("path", _schema_files(), ids=lambda p: p.name)
def test_module_docstring_names_its_schema(path: Path) -> None:
    schema = codegen.load_schema(path)
    package = "messages" if path.parent.name == "schemas" else "records"
    rel = path.relative_to(ROOT).as_posix()
    for version in codegen.Versions.parse(schema["validVersions"]).all():
        module = sys.modules.get(f"connect_wire.{package}.{codegen.module_name(schema['name'], version)}")
        assert module is not None, f"no module for {rel} v{version}"
        assert module.__doc__ is not None and f"``{rel}``" in module.__doc__
        assert f"(version {version})" in module.__doc__
        assert getattr(module, schema["name"]).__version__ == version


def _walk_fields(fields_json: list[dict], where: str) -> list[tuple[str, dict]]:
    out = []
    for f in fields_json:
        out.append((f"{where}.{f.get('name')}", f))
        out.extend(_walk_fields(f.get("fields", []), f"{where}.{f.get('name')}"))
    return out


@pytest.mark.parametrize("path", _schema_files(), ids=lambda p: p.name)
def test_every_field_has_an_about(path: Path) -> None:
    schema = codegen.load_schema(path)
    found = _walk_fields(schema["fields"], schema["name"])
    for common in schema.get("commonStructs", []):
        found.extend(_walk_fields(common["fields"], common["name"]))
    assert found
    missing = [name for name, f in found if not str(f.get("about", "")).strip()]
    assert not missing, f"fields without an about: {missing}"


def test_schemas_are_json_with_line_comments_only() -> None:
    for path in _schema_files():
        schema = codegen.load_schema(path)
        assert schema["name"] == path.stem
        json.dumps(schema)


# -- the API table -----------------------------------------------------------------------------


def _api_versions() -> list[tuple[int, int]]:
    return [(a.key, v) for a in apis.APIS.values() for v in range(a.min_version, a.max_version + 1)]


@pytest.mark.parametrize("key,version", _api_versions())
def test_api_classes_resolve(key: int, version: int) -> None:
    api = apis.api(key)
    assert api is not None and api.supports(version)
    request, response = api.request_class(version), api.response_class(version)
    assert request is apis.request_class(key, version)
    assert response is apis.response_class(key, version)
    for cls, kind in ((request, EntityType.request), (response, EntityType.response)):
        assert is_dataclass(cls)
        assert cls.__type__ is kind
        assert cls.__api_key__ == key
        assert cls.__version__ == version
    assert api.request_header_version(version) == (2 if request.__flexible__ else 1)
    if key == apis.ApiKey.API_VERSIONS:
        assert api.response_header_version(version) == 0
    else:
        assert api.response_header_version(version) == (1 if response.__flexible__ else 0)
    if key >= 10000:
        assert request is messages.REQUESTS[(key, version)]
        assert response is messages.RESPONSES[(key, version)]


def test_api_table_matches_protocol() -> None:
    expected = {3: (0, 12), 10: (0, 6), 15: (0, 5), 16: (0, 5), 18: (0, 3)}
    # Kafka's SASL: SaslHandshake v1 only (v0's raw tokens are refused, as Kafka 4.0),
    # SaslAuthenticate v0-v2.
    expected |= {17: (1, 1), 36: (0, 2)}
    # Credentials and ACLs: the versions kio 0.6.5 has.
    expected |= {29: (1, 3), 30: (1, 3), 31: (1, 3), 50: (0, 0), 51: (0, 0)}
    # Group configs: DescribeConfigs v1-4 (Kafka 4 removed v0), IncrementalAlterConfigs v0-1.
    expected |= {32: (1, 4), 44: (0, 1)}
    expected |= {k: (0, 0) for k in range(10000, 10009)}
    # The classic group APIs (classic Kafka Connect workers): the versions Kafka 4.0 serves.
    expected |= {11: (2, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5)}
    assert {k: (a.min_version, a.max_version) for k, a in apis.APIS.items()} == expected
    assert all(apis.response_class(18, v).__flexible__ == (v >= 3) for v in range(4))


@pytest.mark.parametrize("key,version", [(18, 4), (18, -1), (10000, 1), (3, 13), (9999, 0),
                                         (10009, 0), (69, 0)])
def test_unsupported_versions_raise_lookup_error(key: int, version: int) -> None:
    with pytest.raises(LookupError):
        apis.request_class(key, version)
    with pytest.raises(LookupError):
        apis.response_class(key, version)
    api = apis.api(key)
    assert api is None or not api.supports(version)


KIO_CLASSES = sorted(
    {apis.request_class(k, v) for k, v in _api_versions() if k < 10000}
    | {apis.response_class(k, v) for k, v in _api_versions() if k < 10000},
    key=lambda c: (c.__api_key__, c.__version__, c.__type__.name),
)


@pytest.mark.parametrize(
    "cls", KIO_CLASSES, ids=[f"{c.__name__}_v{c.__version__}" for c in KIO_CLASSES]
)
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_kio_classes_round_trip(cls: type, data: st.DataObject) -> None:
    """The strategies also build kio's own entities; the codec round-trips the Kafka APIs the
    coordinator answers."""
    value = data.draw(entities(cls))
    encoded = codec.encode(value)
    assert encoded == codec.kio_encode(value)
    assert codec.decode(cls, encoded) == (value, len(encoded))
