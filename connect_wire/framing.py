"""KRPC framing: size-prefixed frames and the request/response headers inside them.

Theory of operation
-------------------
This module owns the bytes *around* a message body; it knows nothing about API bodies.

* **Frames.** On the wire every frame is a 4-byte big-endian signed int32 size followed by that
  many bytes. :class:`FrameDecoder` turns a byte stream, fed in arbitrary chunks (as
  ``asyncio.Protocol.data_received`` or a socket gives it), into complete frame payloads
  (``bytes``, without the size prefix). The declared size is checked against
  ``max_frame_size`` the moment its 4 bytes are known, *before* any of the body is buffered
  (and nothing is pre-allocated from a declared size), so a peer cannot make us hold more
  than ``max_frame_size + 4`` bytes for a partial frame. A bad size (too large or negative)
  raises one :class:`FramingError` and kills the decoder: every later call raises the same
  error, and the caller closes the connection (docs/protocol.md, "Transport"). Frames completed
  earlier in the same ``feed()`` call are dropped with the connection. The decoder never keeps
  a reference to the caller's buffer, so a reused ``memoryview`` is safe to pass.

* **Headers.** A frame payload starts with a header; the message body follows at the offset
  the parse functions return. Request header v2 (flexible) is api_key int16, api_version
  int16, correlation_id int32, client_id (nullable *legacy* int16-length string, even in v2)
  and tagged fields; v1 (for non-flexible request versions) is the same without tagged fields.
  Response header v1 is correlation_id and tagged fields; v0 is correlation_id alone (Kafka
  uses v0 for non-flexible responses and for *every* ApiVersions response). Encoding and
  decoding use kio's header classes. kio's native reader raises ``KeyError`` on a tagged field
  it does not know, but Kafka's rule (and docs/protocol.md) is to skip unknown tags, and the
  headers define no tags at all, so on ``KeyError`` the header is re-read without its tagged
  section (the v1 / v0 layout) and the tagged section is skipped with kio's varint reader.

* **Which header version.** Flexibility depends on the API key and version, which the header
  parser cannot know; :func:`peek_request_api` reads the first 8 bytes (the same in every
  request header version) so the server can pick the version — and still answer
  UNSUPPORTED_VERSION with the right correlation id when the rest is garbage.
  :func:`request_header_version` and :func:`response_header_version` encode Kafka's rule.

* **Errors.** The only exceptions that can escape :class:`FrameDecoder` and the ``parse_*``
  functions, on any input bytes, are :class:`FramingError` subclasses: :class:`FrameTooLarge`,
  :class:`NegativeFrameSize`, :class:`MalformedHeader` and :class:`TruncatedFrame`. The
  ``encode_*`` functions raise ``ValueError`` for values that do not fit the wire types.

No asyncio here: the same code serves the asyncio server, the worker client and plain tests.
"""

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.request_header.v1.header import RequestHeader as _RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as _RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as _ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as _ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import read_unsigned_varint
from kio.static.primitive import i16, i32

__all__ = (
    "API_VERSIONS_API_KEY",
    "DEFAULT_MAX_FRAME_SIZE",
    "FrameDecoder",
    "FrameTooLarge",
    "FramingError",
    "MalformedHeader",
    "NegativeFrameSize",
    "RequestHeaderValue",
    "TruncatedFrame",
    "encode_frame",
    "encode_request_frame",
    "encode_request_header",
    "encode_response_frame",
    "encode_response_header",
    "parse_request_header",
    "parse_response_header",
    "peek_request_api",
    "request_client_id",
    "request_header_version",
    "response_header_version",
)

DEFAULT_MAX_FRAME_SIZE: Final = 1024 * 1024
"""Default limit on a frame's declared size (the 4-byte prefix not included)."""

API_VERSIONS_API_KEY: Final = 18
"""ApiVersions responses use response header v0 in every version (Kafka's rule)."""

_SIZE = struct.Struct(">i")
_PEEK = struct.Struct(">hhi")
_INT32_MAX: Final = 2**31 - 1

Buffer = bytes | bytearray | memoryview


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class FramingError(Exception):
    """Base of every error this module raises on bad input; the connection should be closed."""


class FrameTooLarge(FramingError):
    """A frame declared a size above the configured maximum."""

    def __init__(self, declared: int, limit: int) -> None:
        self.declared = declared
        self.limit = limit
        super().__init__(f"frame size {declared} exceeds the maximum of {limit} bytes")

    def __reduce__(self) -> tuple[type["FrameTooLarge"], tuple[int, int]]:
        return (type(self), (self.declared, self.limit))


class NegativeFrameSize(FramingError):
    """A frame declared a negative size."""

    def __init__(self, declared: int) -> None:
        self.declared = declared
        super().__init__(f"negative frame size {declared}")

    def __reduce__(self) -> tuple[type["NegativeFrameSize"], tuple[int]]:
        return (type(self), (self.declared,))


class MalformedHeader(FramingError):
    """A request or response header could not be parsed (truncated, bad string, bad tags...)."""


class TruncatedFrame(FramingError):
    """The stream ended in the middle of a frame (see :meth:`FrameDecoder.at_eof`)."""

    def __init__(self, pending: int, declared: int | None) -> None:
        self.pending = pending
        self.declared = declared
        if declared is None:
            text = f"stream ended inside a frame's size prefix ({pending} of 4 bytes)"
        else:
            text = (
                f"stream ended inside a frame: {pending - 4} of {declared} body bytes received"
            )
        super().__init__(text)

    def __reduce__(self) -> tuple[type["TruncatedFrame"], tuple[int, int | None]]:
        return (type(self), (self.pending, self.declared))


# --------------------------------------------------------------------------------------------
# Frame decoder
# --------------------------------------------------------------------------------------------


class FrameDecoder:
    """Incremental decoder of size-prefixed frames; see the module docstring.

    ``feed()`` copies each byte at most twice (into the partial-frame buffer, then out as the
    frame's ``bytes``) and complete frames inside one chunk only once, so feeding a large
    frame in small chunks is linear.
    """

    __slots__ = ("_body", "_error", "_header", "_max", "_need")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if not 0 <= max_frame_size <= _INT32_MAX:
            raise ValueError(f"max_frame_size must be in [0, {_INT32_MAX}]: {max_frame_size}")
        self._max = max_frame_size
        self._header = bytearray()  # the size prefix while it is incomplete (< 4 bytes)
        self._body = bytearray()  # the partial body once the size is known
        self._need = -1  # declared size of the current frame, -1 while unknown
        self._error: FramingError | None = None

    @property
    def max_frame_size(self) -> int:
        return self._max

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        """A new limit for the frames whose size is not read yet (e.g. a smaller one until a
        connection is authenticated)."""
        if not 0 <= value <= _INT32_MAX:
            raise ValueError(f"max_frame_size must be in [0, {_INT32_MAX}]: {value}")
        self._max = value

    @property
    def buffered(self) -> int:
        """Bytes of the current partial frame held (size prefix included); <= max + 4."""
        if self._need >= 0:
            return 4 + len(self._body)
        return len(self._header)

    @property
    def error(self) -> FramingError | None:
        """The error that killed this decoder, if any."""
        return self._error

    @property
    def dead(self) -> bool:
        return self._error is not None

    def _fail(self, error: FramingError) -> FramingError:
        self._error = error
        self._header = bytearray()
        self._body = bytearray()
        self._need = -1
        return error

    def _check_size(self, size: int) -> None:
        if size < 0:
            raise self._fail(NegativeFrameSize(size))
        if size > self._max:
            raise self._fail(FrameTooLarge(size, self._max))

    def feed(self, data: Buffer) -> list[bytes]:
        """Consume ``data``; return every frame payload it completes, in order.

        Raises the decoder's :class:`FramingError` (the same one on every call once dead).
        """
        if self._error is not None:
            raise self._error.with_traceback(None)
        frames: list[bytes] = []
        with memoryview(data) as raw, raw.cast("B") as mv:
            end = len(mv)
            pos = 0
            while pos < end:
                need = self._need
                if need < 0:
                    header = self._header
                    if not header and end - pos >= 4:
                        (size,) = _SIZE.unpack_from(mv, pos)
                        pos += 4
                    else:
                        take = min(4 - len(header), end - pos)
                        header += mv[pos : pos + take]
                        pos += take
                        if len(header) < 4:
                            break
                        (size,) = _SIZE.unpack(header)
                        header.clear()
                    self._check_size(size)
                    need = self._need = size
                body = self._body
                if not body and end - pos >= need:
                    # Whole payload inside this chunk: one copy, straight out.
                    frames.append(bytes(mv[pos : pos + need]))
                    pos += need
                    self._need = -1
                    continue
                take = min(need - len(body), end - pos)
                body += mv[pos : pos + take]
                pos += take
                if len(body) < need:
                    break
                frames.append(bytes(body))
                body.clear()
                self._need = -1
        return frames

    def at_eof(self) -> None:
        """Call when the peer closed the stream: raise if a partial frame is pending."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        pending = self.buffered
        if pending:
            declared = self._need if self._need >= 0 else None
            raise self._fail(TruncatedFrame(pending, declared))


# --------------------------------------------------------------------------------------------
# Headers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestHeaderValue:
    """A parsed request header (v1 or v2); tagged fields, all unknown, are dropped."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int


def request_header_version(flexible: bool) -> int:
    """Kafka's rule: header v2 for flexible request versions, v1 otherwise."""
    return 2 if flexible else 1


def response_header_version(api_key: int, flexible: bool) -> int:
    """Kafka's rule: v1 for flexible responses, v0 otherwise and for every ApiVersions."""
    if api_key == API_VERSIONS_API_KEY:
        return 0
    return 1 if flexible else 0


_read_request_v1 = entity_reader(_RequestHeaderV1)
_read_request_v2 = entity_reader(_RequestHeaderV2)
_read_response_v0 = entity_reader(_ResponseHeaderV0)
_read_response_v1 = entity_reader(_ResponseHeaderV1)
_write_request_v1 = entity_writer(_RequestHeaderV1)
_write_request_v2 = entity_writer(_RequestHeaderV2)
_write_response_v0 = entity_writer(_ResponseHeaderV0)
_write_response_v1 = entity_writer(_ResponseHeaderV1)


def _readable(frame: Buffer) -> bytes | memoryview:
    # kio's native readers refuse writable buffers (ValueError), so hand them a read-only view.
    if isinstance(frame, bytes):
        return frame
    if isinstance(frame, bytearray):
        return memoryview(frame).toreadonly()
    if isinstance(frame, memoryview):
        view = frame if frame.format == "B" and frame.ndim == 1 else frame.cast("B")
        return view if view.readonly else view.toreadonly()
    raise TypeError(f"expected bytes, bytearray or memoryview, got {type(frame).__name__}")


def _skip_tagged_fields(buf: bytes | memoryview, offset: int) -> int:
    """Skip a tagged-field section at ``offset``; return the offset just past it."""
    end = len(buf)
    count, n = read_unsigned_varint(buf, offset)
    offset += n
    if count > (end - offset) // 2:  # every tagged field takes at least 2 bytes
        raise MalformedHeader(f"tagged field count {count} exceeds the remaining bytes")
    for _ in range(count):
        _tag, n = read_unsigned_varint(buf, offset)
        offset += n
        size, n = read_unsigned_varint(buf, offset)
        offset += n
        if size > end - offset:
            raise MalformedHeader(f"tagged field size {size} exceeds the remaining bytes")
        offset += size
    return offset


def _with_tags_skipped(
    flexible_reader: Callable[[Any, int], tuple[Any, int]],
    plain_reader: Callable[[Any, int], tuple[Any, int]],
    buf: bytes | memoryview,
) -> tuple[Any, int]:
    try:
        return flexible_reader(buf, 0)
    except KeyError:
        # An (unknown) tagged field: read the fixed part, then skip the tagged section.
        header, n = plain_reader(buf, 0)
        return header, _skip_tagged_fields(buf, n)


def peek_request_api(frame: Buffer) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` from a request frame's first 8 bytes."""
    try:
        return _PEEK.unpack_from(frame, 0)
    except (struct.error, TypeError, ValueError) as exc:
        raise MalformedHeader(f"request header shorter than 8 bytes ({len(frame)})") from exc


def parse_request_header(frame: Buffer, flexible: bool = True) -> tuple[RequestHeaderValue, int]:
    """Parse a request header v2 (``flexible``) or v1; return it and the body's offset."""
    buf = _readable(frame)
    try:
        if flexible:
            header, offset = _with_tags_skipped(_read_request_v2, _read_request_v1, buf)
        else:
            header, offset = _read_request_v1(buf, 0)
    except MalformedHeader:
        raise
    except Exception as exc:
        raise MalformedHeader(f"bad request header: {type(exc).__name__}: {exc}") from exc
    return (
        RequestHeaderValue(
            api_key=int(header.request_api_key),
            api_version=int(header.request_api_version),
            correlation_id=int(header.correlation_id),
            client_id=header.client_id,
            header_version=2 if flexible else 1,
        ),
        offset,
    )


_INT16 = struct.Struct(">h")


def request_client_id(frame: bytes, flexible: bool = True) -> tuple[str | None, int]:
    """``(client_id, body offset)`` of a request frame: the part of the header
    :func:`peek_request_api` does not give. The common case (no tagged header fields) is read
    inline; anything else goes through :func:`parse_request_header`, so the result and the
    errors (:class:`MalformedHeader`) are the same."""
    try:
        (size,) = _INT16.unpack_from(frame, 8)
        if size >= 0:
            end = 10 + size
            if end <= len(frame) and (not flexible or (end < len(frame) and frame[end] == 0)):
                return frame[10:end].decode(), end + 1 if flexible else end
        elif size == -1 and (not flexible or (len(frame) > 10 and frame[10] == 0)):
            return None, 11 if flexible else 10
    except (struct.error, TypeError, UnicodeDecodeError):
        pass
    header, offset = parse_request_header(frame, flexible)
    return header.client_id, offset


def parse_response_header(frame: Buffer, header_version: int) -> tuple[int, int]:
    """Parse a response header v0 or v1; return ``(correlation_id, body_offset)``."""
    if header_version not in (0, 1):
        raise ValueError(f"response header version must be 0 or 1, not {header_version}")
    buf = _readable(frame)
    try:
        if header_version == 1:
            header, offset = _with_tags_skipped(_read_response_v1, _read_response_v0, buf)
        else:
            header, offset = _read_response_v0(buf, 0)
    except MalformedHeader:
        raise
    except Exception as exc:
        raise MalformedHeader(f"bad response header: {type(exc).__name__}: {exc}") from exc
    return int(header.correlation_id), offset


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def encode_frame(payload: Buffer) -> bytes:
    """Size prefix + ``payload``."""
    if len(payload) > _INT32_MAX:
        raise ValueError(f"frame payload of {len(payload)} bytes does not fit an int32 size")
    return _SIZE.pack(len(payload)) + payload


def _frame(header: bytes, body: Buffer) -> bytes:
    size = len(header) + len(body)
    if size > _INT32_MAX:
        raise ValueError(f"frame payload of {size} bytes does not fit an int32 size")
    return b"".join((_SIZE.pack(size), header, body))


def encode_request_header(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
    header_version: int = 2,
) -> bytes:
    """The bytes of a request header v2 or v1 (no size prefix)."""
    if header_version == 2:
        cls, write = _RequestHeaderV2, _write_request_v2
    elif header_version == 1:
        cls, write = _RequestHeaderV1, _write_request_v1
    else:
        raise ValueError(f"request header version must be 1 or 2, not {header_version}")
    out = io.BytesIO()
    try:
        header = cls(
            request_api_key=i16(api_key),
            request_api_version=i16(api_version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        )
        write(out, header)
    except Exception as exc:  # i16/i32 range, kio's OutOfBoundValue (client id too long)...
        raise ValueError(f"cannot encode request header: {exc}") from exc
    return out.getvalue()


_RESPONSE_HEADER = {0: struct.Struct(">i"), 1: struct.Struct(">i")}
_NO_TAGS = {0: b"", 1: b"\x00"}


def encode_response_header(correlation_id: int, header_version: int = 1) -> bytes:
    """The bytes of a response header v1 or v0 (no size prefix)."""
    # Byte-identical to kio's writers for ResponseHeader v0/v1 (a test checks it), without
    # building an entity and a BytesIO per response: v0 is the int32 correlation id, v1 adds
    # an empty tagged-field section.
    if header_version not in (0, 1):
        raise ValueError(f"response header version must be 0 or 1, not {header_version}")
    try:
        return _RESPONSE_HEADER[header_version].pack(correlation_id) + _NO_TAGS[header_version]
    except struct.error as exc:
        raise ValueError(f"cannot encode response header: {exc}") from exc


def encode_request_frame(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
    body: Buffer,
    header_version: int = 2,
) -> bytes:
    """Size prefix + request header (v2 or v1) + ``body``."""
    header = encode_request_header(api_key, api_version, correlation_id, client_id, header_version)
    return _frame(header, body)


_RESPONSE_PREFIX = (struct.Struct(">ii"), struct.Struct(">iiB"))  # size, correlation id[, no tags]


def encode_response_frame(correlation_id: int, body: Buffer, header_version: int = 1) -> bytes:
    """Size prefix + response header (v1 or v0) + ``body``: one struct.pack for the first two
    (a response per request is the daemon's hot path), the same bytes as :func:`_frame` of
    :func:`encode_response_header`."""
    if header_version not in (0, 1):
        raise ValueError(f"response header version must be 0 or 1, not {header_version}")
    size = 4 + header_version + len(body)
    if size > _INT32_MAX:
        raise ValueError(f"frame payload of {size} bytes does not fit an int32 size")
    try:
        prefix = _RESPONSE_PREFIX[header_version].pack(size, correlation_id, 0) if header_version \
            else _RESPONSE_PREFIX[0].pack(size, correlation_id)
    except struct.error as exc:
        raise ValueError(f"cannot encode response header: {exc}") from exc
    return prefix + body if type(body) is bytes else b"".join((prefix, body))
