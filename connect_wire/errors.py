"""The one table of error codes spoken by the coordinator and the worker client.

Kafka's errors keep Kafka's numbers and Kafka's "retriable" flags (the test suite cross-checks
every code below 10000 against kio's copy of Kafka's table). Errors Kafka lacks take numbers
from 10000 up and are documented here and in docs/protocol.md, nowhere else.

On the wire an error code is a plain int16. Decoders must keep it as an ``int`` (a peer may send
a code this table does not know); use :func:`error_name`, :func:`is_retriable` and
:meth:`ErrorCode.from_int`, which accept any int and never raise.

Stdlib only: both sides import this without pulling in anything else.
"""

from enum import IntEnum

__all__ = (
    "FIRST_CUSTOM_CODE",
    "ErrorCode",
    "ProtocolError",
    "check_error",
    "error_name",
    "is_retriable",
)

FIRST_CUSTOM_CODE = 10000
"""Codes at or above this number are ours; codes below it are Kafka's."""


class ErrorCode(IntEnum):
    """An error code with Kafka's number, its retriable flag and a description."""

    retriable: bool
    description: str

    def __new__(cls, value: int, retriable: bool, description: str) -> "ErrorCode":
        obj = int.__new__(cls, value)
        obj._value_ = value
        obj.retriable = retriable
        obj.description = description
        return obj

    @classmethod
    def from_int(cls, code: int) -> "ErrorCode | None":
        """The member for ``code``, or ``None`` if this table does not know it. Never raises."""
        try:
            return cls._value2member_map_.get(code)  # type: ignore[return-value]
        except TypeError:  # unhashable argument
            return None

    # --- Kafka's errors (Kafka's numbers, Kafka's retriable flags) --------------------------
    UNKNOWN_SERVER_ERROR = (
        -1,
        False,
        "The server experienced an unexpected error when processing the request.",
    )
    NONE = 0, False, "No error."
    CORRUPT_MESSAGE = (
        2,
        True,
        "This message has failed its CRC checksum, exceeds the valid size, has a null key for "
        "a compacted topic, or is otherwise corrupt.",
    )
    UNKNOWN_TOPIC_OR_PARTITION = 3, True, "This server does not host this topic-partition."
    REQUEST_TIMED_OUT = 7, True, "The request timed out."
    BROKER_NOT_AVAILABLE = 8, False, "The broker is not available."
    MESSAGE_TOO_LARGE = (
        10,
        False,
        "The request included a message larger than the max message size the server will "
        "accept.",
    )
    NETWORK_EXCEPTION = 13, True, "The server disconnected before a response was received."
    COORDINATOR_LOAD_IN_PROGRESS = (
        14,
        True,
        "The coordinator is loading and hence can't process requests.",
    )
    COORDINATOR_NOT_AVAILABLE = 15, True, "The coordinator is not available."
    NOT_COORDINATOR = 16, True, "This is not the correct coordinator."
    RECORD_LIST_TOO_LARGE = (
        18,
        False,
        "The request included message batch larger than the configured segment size on the "
        "server.",
    )
    ILLEGAL_GENERATION = 22, False, "Specified group generation id is not valid."
    INCONSISTENT_GROUP_PROTOCOL = (
        23,
        False,
        "The group member's supported protocols are incompatible with those of existing "
        "members or first group member tried to join with empty protocol type or empty "
        "protocol list.",
    )
    INVALID_GROUP_ID = 24, False, "The group id is invalid."
    UNKNOWN_MEMBER_ID = 25, False, "The coordinator is not aware of this member."
    INVALID_SESSION_TIMEOUT = (
        26,
        False,
        "The session timeout is not within the range allowed by the broker.",
    )
    REBALANCE_IN_PROGRESS = 27, False, "The group is rebalancing, so a rejoin is needed."
    GROUP_AUTHORIZATION_FAILED = 30, False, "Group authorization failed."
    CLUSTER_AUTHORIZATION_FAILED = 31, False, "Cluster authorization failed."
    UNSUPPORTED_SASL_MECHANISM = 33, False, "The broker does not support the requested SASL mechanism."
    ILLEGAL_SASL_STATE = 34, False, "Request is not valid given the current SASL state."
    UNSUPPORTED_VERSION = 35, False, "The version of API is not supported."
    INVALID_CONFIG = 40, False, "Configuration is invalid."
    INVALID_REQUEST = (
        42,
        False,
        "This most likely occurs because of a request being malformed by the client library "
        "or the message was sent to an incompatible broker.",
    )
    POLICY_VIOLATION = 44, False, "Request parameters do not satisfy the configured policy."
    KAFKA_STORAGE_ERROR = 56, True, "Disk error when trying to access log file on the disk."
    SASL_AUTHENTICATION_FAILED = 58, False, "SASL Authentication failed."
    NON_EMPTY_GROUP = 68, False, "The group is not empty."
    GROUP_ID_NOT_FOUND = 69, False, "The group id does not exist."
    MEMBER_ID_REQUIRED = (
        79,
        False,
        "The group member needs to have a valid member id before actually entering a group.",
    )
    GROUP_MAX_SIZE_REACHED = 81, False, "The group has reached its maximum size."
    FENCED_INSTANCE_ID = (
        82,
        False,
        "Another member with the same instance id has registered with a different member id.",
    )
    THROTTLING_QUOTA_EXCEEDED = 89, True, "The throttling quota has been exceeded."
    RESOURCE_NOT_FOUND = 91, False, "A request illegally referred to a resource that does not exist."
    DUPLICATE_RESOURCE = 92, False, "A request illegally referred to the same resource twice."
    UNACCEPTABLE_CREDENTIAL = 93, False, "Requested credential would not meet criteria for acceptability."
    UNKNOWN_TOPIC_ID = 100, True, "This server does not host this topic ID."
    FENCED_MEMBER_EPOCH = (
        110,
        False,
        "The member epoch is fenced by the group coordinator. The member must abandon all its "
        "work and rejoin.",
    )
    UNRELEASED_INSTANCE_ID = (
        111,
        False,
        "The instance ID is still used by another member in the group. That member must leave "
        "first.",
    )
    UNSUPPORTED_ASSIGNOR = (
        112,
        False,
        "The assignor or its version range is not supported by the group.",
    )
    STALE_MEMBER_EPOCH = (
        113,
        False,
        "The member epoch is stale. The member must retry after receiving its updated member "
        "epoch via the heartbeat API.",
    )

    # --- Our own errors (10000 and up; Kafka has no equivalent) ------------------------------
    INVALID_ASSIGNMENT = (
        10000,
        False,
        "The assignment installed by the assigning worker is invalid (for example an item "
        "assigned twice, or an unknown member, connector or task).",
    )
    NO_ASSIGNOR_COVERS_GROUP = (
        10001,
        False,
        "No member's assignor version range covers all the other members of the group.",
    )
    ITEM_NOT_OWNED = (
        10002,
        False,
        "The member does not own the item it writes for (it was never given it, or it already "
        "reported it released).",
    )


def error_name(code: int) -> str:
    """``"NOT_COORDINATOR"`` for 16; ``"UNKNOWN_ERROR_CODE(12345)"`` for unknown codes.

    Never raises.
    """
    member = ErrorCode.from_int(code)
    if member is not None:
        return member.name
    try:
        return f"UNKNOWN_ERROR_CODE({int(code)})"
    except Exception:
        return f"UNKNOWN_ERROR_CODE({code!r})"


def is_retriable(code: int) -> bool:
    """Kafka's retriable flag for ``code``; ``False`` for codes this table does not know."""
    member = ErrorCode.from_int(code)
    return member is not None and member.retriable


class ProtocolError(Exception):
    """An error code (with its optional message) received in, or destined for, a response.

    ``str()`` gives ``"NAME: message"``; without a message, the description of a known code
    stands in for it, and an unknown code shows its name alone.
    """

    code: int
    message: str | None

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = int(code)
        self.message = message
        super().__init__(self.code, message)

    @property
    def name(self) -> str:
        return error_name(self.code)

    @property
    def error_code(self) -> ErrorCode | None:
        """The table's member for :attr:`code`, ``None`` if unknown."""
        return ErrorCode.from_int(self.code)

    @property
    def retriable(self) -> bool:
        return is_retriable(self.code)

    def __str__(self) -> str:
        text = self.message
        if text is None:
            member = ErrorCode.from_int(self.code)
            text = member.description if member is not None else None
        return self.name if text is None else f"{self.name}: {text}"

    def __repr__(self) -> str:
        return f"ProtocolError({self.name}, {self.message!r})"

    def __reduce__(self) -> tuple[type["ProtocolError"], tuple[int, str | None]]:
        return (type(self), (self.code, self.message))


def check_error(code: int, message: str | None = None) -> None:
    """Raise :class:`ProtocolError` unless ``code`` is ``NONE`` (0)."""
    if code != ErrorCode.NONE:
        raise ProtocolError(code, message)
