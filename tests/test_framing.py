import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.request_header.v2.header import RequestHeader as KioRequestHeaderV2
from kio.schema.response_header.v1.header import ResponseHeader as KioResponseHeaderV1
from kio.serial import entity_reader, writers
from kio.static.primitive import i16, i32

from connect_wire.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    FrameTooLarge,
    FramingError,
    MalformedHeader,
    NegativeFrameSize,
    RequestHeaderValue,
    TruncatedFrame,
    encode_frame,
    encode_request_frame,
    encode_request_header,
    encode_response_frame,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    peek_request_api,
    request_client_id,
    request_header_version,
    response_header_version,
)

int16s = st.integers(-(2**15), 2**15 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
client_ids = st.none() | st.text(max_size=40)
bodies = st.binary(max_size=64)


def size_prefix(n: int) -> bytes:
    return struct.pack(">i", n)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks, start = [], 0
    for p in points + [len(data)]:
        chunks.append(data[start:p])
        start = p
    return chunks


def reference_decode(stream: bytes, limit: int) -> tuple[list[bytes], type | None, int]:
    """Whole-stream model: (frames, error class or None, leftover bytes)."""
    frames, pos = [], 0
    while len(stream) - pos >= 4:
        (size,) = struct.unpack_from(">i", stream, pos)
        if size < 0:
            return frames, NegativeFrameSize, 0
        if size > limit:
            return frames, FrameTooLarge, 0
        if len(stream) - pos - 4 < size:
            break
        frames.append(stream[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames, None, len(stream) - pos


# --------------------------------------------------------------------------------------------
# FrameDecoder
# --------------------------------------------------------------------------------------------


def test_single_frame_and_zero_length_frame() -> None:
    dec = FrameDecoder()
    assert dec.feed(encode_frame(b"hello") + encode_frame(b"")) == [b"hello", b""]
    assert dec.buffered == 0
    dec.at_eof()


def test_one_byte_at_a_time() -> None:
    payloads = [b"a", b"", b"xyz" * 50, bytes(range(256))]
    stream = b"".join(encode_frame(p) for p in payloads)
    dec = FrameDecoder(max_frame_size=1000)
    out: list[bytes] = []
    for i in range(len(stream)):
        out += dec.feed(stream[i : i + 1])
        assert dec.buffered <= 1000 + 4
    assert out == payloads
    assert dec.buffered == 0


def test_many_frames_in_one_feed() -> None:
    payloads = [bytes([i]) * i for i in range(10)]
    dec = FrameDecoder()
    assert dec.feed(b"".join(encode_frame(p) for p in payloads)) == payloads
    assert dec.buffered == 0


def test_buffered_counts_partial_frame() -> None:
    dec = FrameDecoder()
    frame = encode_frame(b"0123456789")
    assert dec.feed(frame[:2]) == []
    assert dec.buffered == 2
    assert dec.feed(frame[2:7]) == []
    assert dec.buffered == 7
    assert dec.feed(frame[7:] + frame[:3]) == [b"0123456789"]
    assert dec.buffered == 3


def test_accepts_bytearray_and_memoryview_and_keeps_no_reference() -> None:
    dec = FrameDecoder()
    shared = bytearray(encode_frame(b"abcdef"))
    assert dec.feed(memoryview(shared)[:7]) == []
    shared[4:7] = b"XXX"  # the caller reuses its buffer: the decoder must have copied
    shared.extend(b"tail")  # would fail if the decoder still held an export of it
    assert dec.feed(bytearray(b"def")) == [b"abcdef"]


def test_frame_at_exact_limit_is_accepted() -> None:
    dec = FrameDecoder(max_frame_size=DEFAULT_MAX_FRAME_SIZE)
    payload = bytes(range(256)) * (DEFAULT_MAX_FRAME_SIZE // 256)
    stream = encode_frame(payload)
    out: list[bytes] = []
    for i in range(0, len(stream), 4093):
        out += dec.feed(stream[i : i + 4093])
        assert dec.buffered <= DEFAULT_MAX_FRAME_SIZE + 4
    assert out == [payload]
    assert dec.buffered == 0


def test_default_limit_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_FRAME_SIZE == 1048576
    assert FrameDecoder().max_frame_size == 1048576


def test_oversized_raises_right_after_size_bytes() -> None:
    limit = 1024
    dec = FrameDecoder(max_frame_size=limit)
    header = size_prefix(limit + 1)
    for b in header[:3]:
        assert dec.feed(bytes([b])) == []
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(header[3:])
    assert (info.value.declared, info.value.limit) == (limit + 1, limit)
    assert dec.dead and dec.error is info.value
    assert dec.buffered == 0
    # Dead: every later call raises the same error, and nothing is buffered.
    for _ in range(3):
        with pytest.raises(FrameTooLarge) as again:
            dec.feed(b"\x00" * 100)
        assert again.value is info.value
        assert dec.buffered == 0
    with pytest.raises(FrameTooLarge):
        dec.at_eof()


def test_huge_declared_size_does_not_buffer_body() -> None:
    dec = FrameDecoder()  # 1 MiB
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(size_prefix(2**31 - 1) + b"x" * 5000)
    assert info.value.declared == 2**31 - 1
    assert dec.buffered == 0
    # A legal but large declared size: only what arrived is held, nothing pre-allocated.
    dec2 = FrameDecoder()
    assert dec2.feed(size_prefix(DEFAULT_MAX_FRAME_SIZE) + b"x") == []
    assert dec2.buffered == 5


def test_oversized_after_valid_frames_in_same_chunk() -> None:
    dec = FrameDecoder(max_frame_size=10)
    with pytest.raises(FrameTooLarge):
        dec.feed(encode_frame(b"ok") + size_prefix(11))
    with pytest.raises(FrameTooLarge):
        dec.feed(encode_frame(b"ok"))


def test_negative_size() -> None:
    dec = FrameDecoder()
    with pytest.raises(NegativeFrameSize) as info:
        dec.feed(size_prefix(-1))
    assert info.value.declared == -1
    assert isinstance(info.value, FramingError)
    with pytest.raises(NegativeFrameSize):
        dec.feed(b"")


def test_at_eof_truncation() -> None:
    dec = FrameDecoder()
    dec.feed(size_prefix(10)[:2])
    with pytest.raises(TruncatedFrame) as info:
        dec.at_eof()
    assert (info.value.pending, info.value.declared) == (2, None)

    dec = FrameDecoder()
    dec.feed(size_prefix(10) + b"abc")
    with pytest.raises(TruncatedFrame) as info:
        dec.at_eof()
    assert (info.value.pending, info.value.declared) == (7, 10)
    assert dec.dead


def test_invalid_limit() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_size=-1)
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_size=2**31)


@given(st.lists(st.binary(max_size=300), max_size=12), st.lists(st.integers(0, 10**6)))
def test_random_splits_give_back_exactly_the_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    dec = FrameDecoder(max_frame_size=300)
    out: list[bytes] = []
    for chunk in split_at(stream, cuts):
        out += dec.feed(chunk)
        assert dec.buffered <= 300 + 4
    assert out == payloads
    assert dec.buffered == 0
    dec.at_eof()


@given(
    st.lists(st.binary(max_size=50), max_size=5),
    st.integers(51, 2**31 - 1) | st.integers(-(2**31), -1),
    st.lists(st.integers(0, 10**6)),
)
def test_bad_size_after_valid_frames(payloads: list[bytes], bad: int, cuts: list[int]) -> None:
    good = b"".join(encode_frame(p) for p in payloads)
    header = size_prefix(bad)
    stream = good + header + b"z" * 200  # the body of the bad frame (partly) follows
    expected_error = FrameTooLarge if bad > 0 else NegativeFrameSize
    dec = FrameDecoder(max_frame_size=50)
    out: list[bytes] = []
    fed = 0
    raised = None
    for chunk in split_at(stream, cuts):
        try:
            out += dec.feed(chunk)
        except FramingError as exc:
            raised = exc
            # It fires in the very chunk that completes the 4 size bytes.
            assert fed < len(good) + 4 <= fed + len(chunk)
            break
        fed += len(chunk)
        assert dec.buffered <= 50 + 4
    assert type(raised) is expected_error
    assert dec.buffered == 0
    assert out == payloads[: len(out)]  # frames of the fatal chunk are dropped, never mangled


@settings(max_examples=300)
@given(st.binary(max_size=400), st.lists(st.integers(0, 10**6)), st.integers(0, 300))
def test_garbage_gives_frames_or_one_framing_error(
    stream: bytes, cuts: list[int], limit: int
) -> None:
    exp_frames, exp_error, leftover = reference_decode(stream, limit)
    dec = FrameDecoder(max_frame_size=limit)
    out: list[bytes] = []
    errors: list[FramingError] = []
    for chunk in split_at(stream, cuts):
        try:
            out += dec.feed(chunk)
        except FramingError as exc:  # any other exception fails the test
            errors.append(exc)
        assert dec.buffered <= limit + 4
    if exp_error is None:
        assert errors == []
        assert out == exp_frames
        assert dec.buffered == leftover
    else:
        assert len({id(e) for e in errors}) == 1  # one error, re-raised while dead
        assert type(errors[0]) is exp_error
        assert out == exp_frames[: len(out)]
        assert dec.buffered == 0


# --------------------------------------------------------------------------------------------
# Headers
# --------------------------------------------------------------------------------------------


def test_request_header_v2_known_bytes() -> None:
    raw = encode_request_header(18, 3, 7, "abc", header_version=2)
    assert raw.hex() == "0012" "0003" "00000007" "0003616263" "00"
    header, offset = parse_request_header(raw + b"BODY")
    assert header == RequestHeaderValue(18, 3, 7, "abc", 2)
    assert offset == len(raw)


def test_request_header_v1_known_bytes() -> None:
    raw = encode_request_header(18, 0, -5, None, header_version=1)
    assert raw.hex() == "0012" "0000" "fffffffb" "ffff"
    header, offset = parse_request_header(raw + b"\x00\x01", flexible=False)
    assert header == RequestHeaderValue(18, 0, -5, None, 1)
    assert offset == 10  # the body's first byte is not taken for a tagged-field count


def test_response_header_known_bytes() -> None:
    assert encode_response_header(9, header_version=0).hex() == "00000009"
    assert encode_response_header(9, header_version=1).hex() == "0000000900"
    assert encode_response_frame(9, b"xy", header_version=1) == bytes.fromhex("00000007") + (
        bytes.fromhex("0000000900") + b"xy"
    )


@given(int16s, int16s, int32s, client_ids, bodies, st.sampled_from([1, 2]))
def test_request_frame_round_trip(
    api_key: int, version: int, corr: int, client_id: str | None, body: bytes, hv: int
) -> None:
    frame = encode_request_frame(api_key, version, corr, client_id, body, header_version=hv)
    dec = FrameDecoder()
    [payload] = dec.feed(frame)
    assert peek_request_api(payload) == (api_key, version, corr)
    header, offset = parse_request_header(payload, flexible=hv == 2)
    assert header == RequestHeaderValue(api_key, version, corr, client_id, hv)
    assert payload[offset:] == body


@given(int32s, bodies, st.sampled_from([0, 1]))
def test_response_frame_round_trip(corr: int, body: bytes, hv: int) -> None:
    frame = encode_response_frame(corr, body, header_version=hv)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    [payload] = FrameDecoder().feed(frame)
    assert parse_response_header(payload, hv) == (corr, 4 + hv)
    assert payload[4 + hv :] == body


def tagged_section(tags: list[tuple[int, bytes]]) -> bytes:
    buf = io.BytesIO()
    writers.write_unsigned_varint(buf, len(tags))
    for tag, value in tags:
        writers.write_tagged_field(buf, tag, writers.write_compact_string, value)
    return buf.getvalue()


def test_kio_alone_rejects_unknown_tags() -> None:
    # The reason for the workaround in framing.py (kio 0.6.5).
    fixed = encode_request_header(10000, 0, 1, "w")[:-1]
    with pytest.raises(KeyError):
        entity_reader(KioRequestHeaderV2)(fixed + tagged_section([(5, b"x")]), 0)


def test_request_header_unknown_tags_are_skipped() -> None:
    fixed = encode_request_header(10000, 0, 42, "worker-1")[:-1]  # drop the empty tag section
    tags = tagged_section([(0, b"hello"), (7, b""), (300, b"z" * 200)])
    header, offset = parse_request_header(fixed + tags + b"BODY")
    assert header == RequestHeaderValue(10000, 0, 42, "worker-1", 2)
    assert offset == len(fixed) + len(tags)


def test_response_header_unknown_tags_are_skipped() -> None:
    fixed = encode_response_header(-3, header_version=0)
    tags = tagged_section([(1, b"abc"), (2**20, b"")])
    assert parse_response_header(fixed + tags + b"B", 1) == (-3, len(fixed) + len(tags))
    # v0 has no tagged section: the body starts right after the correlation id.
    assert parse_response_header(fixed + tags, 0) == (-3, 4)
    # Sanity: kio agrees on the tag-less layout.
    assert entity_reader(KioResponseHeaderV1)(fixed + b"\x00", 0)[0].correlation_id == i32(-3)


@given(
    st.lists(st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=40)), max_size=4),
    client_ids,
    bodies,
)
def test_request_header_random_unknown_tags(
    tags: list[tuple[int, bytes]], client_id: str | None, body: bytes
) -> None:
    fixed = encode_request_header(10001, 0, 3, client_id)[:-1]
    section = tagged_section(tags)
    header, offset = parse_request_header(fixed + section + body)
    assert header.client_id == client_id
    assert header.correlation_id == 3
    assert offset == len(fixed) + len(section)


def test_bad_tagged_sections_are_malformed() -> None:
    fixed = encode_request_header(10000, 0, 1, "w")[:-1]
    good = tagged_section([(9, b"abcdef")])
    for bad in (
        good[:-1],  # value truncated
        good[:3],  # size missing
        b"\x02" + good[1:],  # promises two fields, has one
        b"\xff\xff\xff\xff\x0f",  # absurd count
        b"\x01\x09\xff\xff\xff\xff\x0f",  # absurd size
        b"\x01\xff\xff\xff\xff\xff\x01\x00",  # varint too long
    ):
        with pytest.raises(MalformedHeader):
            parse_request_header(fixed + bad)
    with pytest.raises(MalformedHeader):
        parse_response_header(b"\x00\x00\x00\x01" + good[:-2], 1)


def test_truncated_headers_are_malformed() -> None:
    raw = encode_request_header(15, 5, 99, "client")
    for n in range(len(raw)):
        with pytest.raises(MalformedHeader):
            parse_request_header(raw[:n])
    raw1 = raw[:-1]
    for n in range(len(raw1)):
        with pytest.raises(MalformedHeader):
            parse_request_header(raw1[:n], flexible=False)
    for n in range(5):
        with pytest.raises(MalformedHeader):
            parse_response_header(b"\x00\x00\x00\x01\x00"[:n], 1)
    for n in range(4):
        with pytest.raises(MalformedHeader):
            parse_response_header(b"\x00\x00\x00\x01"[:n], 0)


def test_bad_client_id_is_malformed() -> None:
    prefix = struct.pack(">hhi", 10000, 0, 1)
    with pytest.raises(MalformedHeader):
        parse_request_header(prefix + b"\x00\x02\xff\xfe\x00")  # not UTF-8
    with pytest.raises(MalformedHeader):
        parse_request_header(prefix + b"\xff\xfe\x00")  # negative length other than -1
    with pytest.raises(MalformedHeader):
        parse_request_header(prefix + b"\x00\x09ab\x00")  # longer than the frame


def test_peek_request_api() -> None:
    frame = struct.pack(">hhi", 18, 99, 1234) + b"\xff" * 3  # garbage after the fixed part
    assert peek_request_api(frame) == (18, 99, 1234)
    assert peek_request_api(bytearray(frame)) == (18, 99, 1234)
    with pytest.raises(MalformedHeader):
        parse_request_header(frame)
    for n in range(8):
        with pytest.raises(MalformedHeader):
            peek_request_api(frame[:n])


def test_parse_accepts_bytearray_and_memoryview() -> None:
    raw = encode_request_header(1, 2, 3, "c") + b"body"
    expected = (RequestHeaderValue(1, 2, 3, "c", 2), len(raw) - 4)
    assert parse_request_header(bytearray(raw)) == expected
    assert parse_request_header(memoryview(bytearray(raw))) == expected
    assert parse_request_header(memoryview(raw)) == expected
    assert parse_response_header(bytearray(b"\x00\x00\x00\x05\x00"), 1) == (5, 5)


@settings(max_examples=500)
@given(st.binary(max_size=40), st.booleans())
def test_random_bytes_give_header_or_malformed(data: bytes, flexible: bool) -> None:
    try:
        header, offset = parse_request_header(data, flexible=flexible)
    except MalformedHeader:
        return
    assert 10 <= offset <= len(data)
    assert (header.api_key, header.api_version, header.correlation_id) == peek_request_api(data)


@settings(max_examples=500)
@given(st.binary(max_size=40), st.sampled_from([0, 1]))
def test_random_bytes_give_response_header_or_malformed(data: bytes, hv: int) -> None:
    try:
        corr, offset = parse_response_header(data, hv)
    except MalformedHeader:
        return
    assert corr == struct.unpack_from(">i", data)[0]
    assert 4 + hv <= offset <= len(data)


def test_header_versions() -> None:
    assert request_header_version(True) == 2
    assert request_header_version(False) == 1
    assert response_header_version(18, True) == 0  # ApiVersions: always v0
    assert response_header_version(18, False) == 0
    assert response_header_version(10000, True) == 1
    assert response_header_version(3, False) == 0


def test_encode_rejects_out_of_range_values() -> None:
    with pytest.raises(ValueError):
        encode_request_frame(2**15, 0, 1, None, b"")
    with pytest.raises(ValueError):
        encode_request_frame(1, 0, 2**31, None, b"")
    with pytest.raises(ValueError):
        encode_request_frame(1, 0, 1, "x" * 40000, b"")
    with pytest.raises(ValueError):
        encode_request_frame(1, 0, 1, None, b"", header_version=0)
    with pytest.raises(ValueError):
        encode_response_frame(2**31, b"")
    with pytest.raises(ValueError):
        encode_response_frame(1, b"", header_version=2)
    with pytest.raises(ValueError):
        parse_response_header(b"\x00\x00\x00\x00", 2)


def test_kio_header_encoding_matches() -> None:
    # Our encoder is kio's writer: cross-check against the kio entity directly.
    kio_header = KioRequestHeaderV2(
        request_api_key=i16(10003), request_api_version=i16(0), correlation_id=i32(8), client_id=""
    )
    raw = encode_request_header(10003, 0, 8, "")
    assert entity_reader(KioRequestHeaderV2)(raw, 0) == (kio_header, len(raw))


@given(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1]))
def test_response_header_matches_kios_writer(correlation_id: int, version: int) -> None:
    """encode_response_header packs with struct; it must equal kio's entity writer's bytes."""
    import io

    from connect_wire import framing

    cls, write = {1: (framing._ResponseHeaderV1, framing._write_response_v1),
                  0: (framing._ResponseHeaderV0, framing._write_response_v0)}[version]
    buffer = io.BytesIO()
    write(buffer, cls(correlation_id=correlation_id))
    assert framing.encode_response_header(correlation_id, version) == buffer.getvalue()


def _client_id_outcome(fn, data: bytes, flexible: bool):  # type: ignore[no-untyped-def]
    try:
        return fn(data, flexible)
    except MalformedHeader:
        return "malformed"


def _via_full_parse(data: bytes, flexible: bool) -> tuple[str | None, int]:
    header, offset = parse_request_header(data, flexible)
    return header.client_id, offset


@settings(max_examples=500)
@given(st.one_of(
    st.binary(max_size=40),
    st.builds(lambda cid, tags, body, cut: (encode_request_header(10001, 0, 7, cid)[:-1]
                                           + tagged_section(tags) + body)[:cut],
              client_ids, st.lists(st.tuples(st.integers(0, 99), st.binary(max_size=8)), max_size=2),
              bodies, st.integers(0, 200)),
), st.booleans())
def test_request_client_id_agrees_with_the_full_header_parse(data: bytes, flexible: bool) -> None:
    """The connection's inline header read gives what parse_request_header gives, or both
    refuse the frame."""
    assert (_client_id_outcome(request_client_id, data, flexible)
            == _client_id_outcome(_via_full_parse, data, flexible))
