import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KioErrorCode

from connect_wire.errors import (
    FIRST_CUSTOM_CODE,
    ErrorCode,
    ProtocolError,
    check_error,
    error_name,
    is_retriable,
)

# docs/protocol.md, "Errors": every code listed there, with its number.
PROTOCOL_CODES = {
    "UNKNOWN_SERVER_ERROR": -1,
    "NONE": 0,
    "CORRUPT_MESSAGE": 2,
    "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "COORDINATOR_NOT_AVAILABLE": 15,
    "NOT_COORDINATOR": 16,
    "INVALID_GROUP_ID": 24,
    "UNKNOWN_MEMBER_ID": 25,
    "GROUP_AUTHORIZATION_FAILED": 30,
    "UNSUPPORTED_VERSION": 35,
    "INVALID_REQUEST": 42,
    "GROUP_ID_NOT_FOUND": 69,
    "GROUP_MAX_SIZE_REACHED": 81,
    "FENCED_INSTANCE_ID": 82,
    "FENCED_MEMBER_EPOCH": 110,
    "UNRELEASED_INSTANCE_ID": 111,
    "UNSUPPORTED_ASSIGNOR": 112,
    "STALE_MEMBER_EPOCH": 113,
    "INVALID_ASSIGNMENT": 10000,
    "NO_ASSIGNOR_COVERS_GROUP": 10001,
    "ITEM_NOT_OWNED": 10002,
}

KAFKA_MEMBERS = [m for m in ErrorCode if m.value < FIRST_CUSTOM_CODE]
CUSTOM_MEMBERS = [m for m in ErrorCode if m.value >= FIRST_CUSTOM_CODE]


@pytest.mark.parametrize(("name", "number"), sorted(PROTOCOL_CODES.items()))
def test_protocol_md_codes_present_with_their_numbers(name: str, number: int) -> None:
    assert ErrorCode[name].value == number
    assert ErrorCode.from_int(number) is ErrorCode[name]


@pytest.mark.parametrize("member", KAFKA_MEMBERS, ids=lambda m: m.name)
def test_kafka_codes_match_kio_number_and_retriable(member: ErrorCode) -> None:
    kio_member = KioErrorCode[member.name.lower()]
    assert int(kio_member.value) == member.value
    assert kio_member.retriable is member.retriable


def test_handy_kafka_codes_have_kafkas_numbers() -> None:
    assert ErrorCode.REQUEST_TIMED_OUT == 7
    assert ErrorCode.NETWORK_EXCEPTION == 13
    assert ErrorCode.ILLEGAL_GENERATION == 22
    assert ErrorCode.INCONSISTENT_GROUP_PROTOCOL == 23
    assert ErrorCode.INVALID_SESSION_TIMEOUT == 26
    assert ErrorCode.REBALANCE_IN_PROGRESS == 27
    assert ErrorCode.INVALID_CONFIG == 40


def test_retriable_flags_spot_check() -> None:
    retriable = {m.name for m in ErrorCode if m.retriable}
    assert {
        "CORRUPT_MESSAGE",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_COORDINATOR",
    } <= retriable
    assert "UNKNOWN_MEMBER_ID" not in retriable
    assert "FENCED_MEMBER_EPOCH" not in retriable
    assert "UNSUPPORTED_VERSION" not in retriable


def test_custom_codes() -> None:
    assert [m.name for m in CUSTOM_MEMBERS] == ["INVALID_ASSIGNMENT", "NO_ASSIGNOR_COVERS_GROUP",
                                            "ITEM_NOT_OWNED"]
    assert ErrorCode.INVALID_ASSIGNMENT == 10000
    assert ErrorCode.NO_ASSIGNOR_COVERS_GROUP == 10001
    assert not ErrorCode.NO_ASSIGNOR_COVERS_GROUP.retriable
    assert not ErrorCode.INVALID_ASSIGNMENT.retriable
    # Our own numbers must not collide with anything Kafka defines.
    kafka_numbers = {int(m.value) for m in KioErrorCode}
    assert all(m.value not in kafka_numbers for m in CUSTOM_MEMBERS)


def test_table_shape() -> None:
    # No aliases (two names with one number), every code fits an int16, every one described.
    assert len(ErrorCode.__members__) == len(list(ErrorCode))
    for member in ErrorCode:
        assert -(2**15) <= member.value < 2**15
        assert isinstance(member.retriable, bool)
        assert member.description and member.description.endswith(".")
        assert member.name.isupper()


def test_int_behaviour() -> None:
    assert ErrorCode.NONE == 0
    assert ErrorCode(16) is ErrorCode.NOT_COORDINATOR
    assert int(ErrorCode.STALE_MEMBER_EPOCH) == 113
    assert ErrorCode.from_int(12345) is None
    assert ErrorCode.from_int(-2) is None
    assert ErrorCode.from_int([1, 2]) is None  # type: ignore[arg-type]


def test_error_name() -> None:
    assert error_name(16) == "NOT_COORDINATOR"
    assert error_name(-1) == "UNKNOWN_SERVER_ERROR"
    assert error_name(0) == "NONE"
    assert error_name(10001) == "NO_ASSIGNOR_COVERS_GROUP"
    assert error_name(12345) == "UNKNOWN_ERROR_CODE(12345)"
    assert error_name(-7) == "UNKNOWN_ERROR_CODE(-7)"


def test_is_retriable() -> None:
    assert is_retriable(15) is True
    assert is_retriable(ErrorCode.NOT_COORDINATOR) is True
    assert is_retriable(25) is False
    assert is_retriable(0) is False
    assert is_retriable(12345) is False


@given(st.integers())
def test_lookups_never_raise(code: int) -> None:
    name = error_name(code)
    member = ErrorCode.from_int(code)
    if member is None:
        assert name == f"UNKNOWN_ERROR_CODE({code})"
        assert is_retriable(code) is False
    else:
        assert name == member.name
        assert is_retriable(code) is member.retriable


def test_protocol_error_with_message() -> None:
    err = ProtocolError(25, "member m-1 is gone")
    assert err.code == 25
    assert err.message == "member m-1 is gone"
    assert err.name == "UNKNOWN_MEMBER_ID"
    assert err.error_code is ErrorCode.UNKNOWN_MEMBER_ID
    assert err.retriable is False
    assert str(err) == "UNKNOWN_MEMBER_ID: member m-1 is gone"


def test_protocol_error_without_message() -> None:
    err = ProtocolError(ErrorCode.NOT_COORDINATOR)
    assert err.message is None
    assert type(err.code) is int and err.code == 16
    assert err.retriable is True
    assert str(err) == "NOT_COORDINATOR: " + ErrorCode.NOT_COORDINATOR.description


def test_protocol_error_unknown_code() -> None:
    err = ProtocolError(4242)
    assert err.error_code is None
    assert err.retriable is False
    assert str(err) == "UNKNOWN_ERROR_CODE(4242)"
    assert str(ProtocolError(4242, "x")) == "UNKNOWN_ERROR_CODE(4242): x"


def test_protocol_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(ProtocolError(113, "stale")))
    assert isinstance(err, ProtocolError)
    assert (err.code, err.message) == (113, "stale")


def test_check_error() -> None:
    check_error(0)
    check_error(ErrorCode.NONE, "ignored")
    with pytest.raises(ProtocolError) as info:
        check_error(110, "fenced")
    assert info.value.code == 110
    assert str(info.value) == "FENCED_MEMBER_EPOCH: fenced"
