"""The durable partition log (coordinator.runtime.log) and record serde, on real files.

No mocks of files: every test writes a real directory. Failures are injected through the log's
``write_fn``/``fsync_fn`` hooks (a real write of part of the data, then an OSError) and
compaction crashes through its step hook (an exception that leaves the files as a crash would).
Property tests use a no-op fsync only to stay fast: process-crash durability does not depend on
fsync (the page cache survives the process), and reopening is what the tests check.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connect_wire.records import RECORD_KEYS, RECORD_VALUES
from coordinator.group import records as rec
from coordinator.group.model import (
    AssignorSpec,
    ConnectorSpec,
    CurrentAssignment,
    Item,
    MemberMetadata,
    MemberState,
    TargetMember,
)
from coordinator.runtime import serde
from coordinator.runtime.log import (
    HEADER_SIZE,
    BatchTooLarge,
    Corruption,
    FsyncMode,
    FsyncPolicy,
    LogFailedError,
    PartitionLog,
    partition_dir,
    segment_name,
)
from tests.strategies import entities

FAST = {"fsync_fn": lambda fd: None}
# LOG_TEST_EXAMPLES=2000 for a long soak; the default keeps the file well under 30 s.
PROPERTY = settings(
    max_examples=int(os.environ.get("LOG_TEST_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- helpers ------------------------------------------------------------------------------------


def sample_records() -> list[rec.Record]:
    member = MemberMetadata(
        member_id="m1",
        instance_id="i1",
        worker_url="http://w1:8083",
        client_id="c",
        client_host="/10.0.0.1",
        rebalance_timeout_ms=60000,
        assignors=(AssignorSpec("a", 0, 1, 0, 1, b"\x01\x02"),),
    )
    items = frozenset({Item("conn", -1), Item("conn", 0), Item("conn", 1)})
    return [
        rec.group_metadata("g", 3),
        rec.group_connectors("g", 3, [ConnectorSpec("conn", 2, (("k", "v"), ("n", None)))]),
        rec.group_member("g", member),
        rec.target_member("g", "m1", TargetMember(items, 1, b"meta")),
        rec.target_metadata("g", 3, 0, b"state", -1),
        rec.current_assignment(
            "g", "m1", CurrentAssignment(3, 2, MemberState.STABLE, items, frozenset(), 1, b"x")
        ),
        rec.group_configuration("g", {"session.timeout.ms": "45000", "x": None}),
        rec.tombstone(rec.group_metadata("gone", 0).key),
    ]


def meta(group: str, epoch: int) -> tuple[bytes, bytes | None]:
    return serde.encode_record(rec.group_metadata(group, epoch))


def gone(group: str) -> tuple[bytes, bytes | None]:
    return serde.encode_record(rec.tombstone(rec.group_metadata(group, 0).key))


def replay_map(log: PartitionLog) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for _, key, value in log.read():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def offsets(log: PartitionLog) -> list[int]:
    return [o for o, _, _ in log.read()]


def segment_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".log"))


def corrupt_bytes(directory: Path) -> int:
    corrupt = directory / "corrupt"
    return sum(p.stat().st_size for p in corrupt.iterdir()) if corrupt.exists() else 0


def batch_positions(path: Path) -> list[tuple[int, int]]:
    """(position, size) of every batch of a valid segment file."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos + 1)
        out.append((pos, 9 + length))
        pos += 9 + length
    return out


def build_log(directory: Path, batches: int, *, segment_bytes: int = 1 << 20, groups: int = 4):
    log, _ = PartitionLog.open(directory, segment_bytes=segment_bytes, **FAST)
    written = []
    for i in range(batches):
        records = [meta(f"g{(i + j) % groups}", i) for j in range(1 + i % 3)]
        log.append(records, timestamp_ms=1000 + i)
        written.extend(records)
    log.sync()
    return log, written


# -- serde --------------------------------------------------------------------------------------


def test_serde_round_trip_of_every_builder() -> None:
    for record in sample_records():
        key_bytes, value_bytes = serde.encode_record(record)
        assert struct.unpack_from(">hh", key_bytes) == (type(record.key).__api_key__, 0)
        assert (value_bytes is None) == record.is_tombstone
        assert serde.decode_record(key_bytes, value_bytes) == record


@PROPERTY
@given(st.data())
def test_serde_round_trip_of_any_record(data: st.DataObject) -> None:
    (record_type, version) = data.draw(st.sampled_from(sorted(RECORD_KEYS)))
    key = data.draw(entities(RECORD_KEYS[(record_type, version)]))
    value = data.draw(st.none() | entities(RECORD_VALUES[(record_type, version)]))
    record = rec.Record(key, value)
    assert serde.decode_record(*serde.encode_record(record)) == record


def test_serde_errors() -> None:
    key_bytes, value_bytes = serde.encode_record(rec.group_metadata("g", 1))
    assert value_bytes is not None
    with pytest.raises(serde.UnknownRecordType) as unknown:
        serde.decode_record(struct.pack(">hh", 99, 0) + key_bytes[4:], value_bytes)
    assert (unknown.value.record_type, unknown.value.version) == (99, 0)
    with pytest.raises(serde.UnknownRecordType):
        serde.decode_record(struct.pack(">hh", 1, 7) + key_bytes[4:], value_bytes)
    with pytest.raises(serde.UnsupportedValueVersion):
        serde.decode_record(key_bytes, struct.pack(">h", 9) + value_bytes[2:])
    for bad_key, bad_value in [
        (b"\x00", value_bytes),  # shorter than the key header
        (key_bytes[:-1], value_bytes),  # truncated key
        (key_bytes + b"\x00", value_bytes),  # trailing bytes
        (key_bytes, b"\x00"),  # value without a version
        (key_bytes, value_bytes[:-2]),
        (key_bytes, value_bytes + b"\x00\x00"),
    ]:
        with pytest.raises(serde.CorruptRecord):
            serde.decode_record(bad_key, bad_value)
    with pytest.raises(ValueError, match="does not match"):
        serde.encode_record(
            rec.Record(rec.group_metadata("g", 1).key, rec.target_metadata("g", 1, 0, b"", 0).value)
        )
    with pytest.raises(TypeError):
        serde.encode_record(rec.Record("not a key", None))


# -- append, read, reopen, roll -----------------------------------------------------------------


def test_append_read_round_trip_and_reopen(tmp_path: Path) -> None:
    directory = partition_dir(tmp_path, 7)
    assert directory.name == "partition-7"
    log, report = PartitionLog.open(directory)
    assert report.clean and report.next_offset == 0 and log.next_offset == 0
    records = sample_records()
    assert log.append([serde.encode_record(r) for r in records[:3]], timestamp_ms=1) == 2
    assert log.append([serde.encode_record(r) for r in records[3:]], timestamp_ms=2) == len(records) - 1
    log.sync()
    assert log.durable_offset == log.next_offset == len(records)
    assert [(o, r) for o, r in log.read_records()] == list(enumerate(records))
    assert [o for o, _, _ in log.read(5)] == [5, 6, 7]
    size = log.size_bytes
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.append([meta("g", 1)])

    log, report = PartitionLog.open(directory)
    assert report.clean and report.batches == 2 and report.records == len(records)
    assert report.next_offset == log.next_offset == len(records) and log.size_bytes == size
    assert [r for _, r in log.read_records()] == records
    assert log.append([meta("g", 4)]) == len(records)
    log.close()
    assert [p.name for p in segment_files(directory)] == [segment_name(0)]


def test_append_validation(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, max_batch_bytes=200)
    with pytest.raises(ValueError):
        log.append([])
    with pytest.raises(BatchTooLarge):
        log.append([(b"k", b"v" * 200)])
    with pytest.raises(TypeError):
        log.append([("k", b"v")])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        log.append([(b"k", b"v")], timestamp_ms=-1)
    assert log.next_offset == 0 and log.size_bytes == 0
    log.append([(b"k", b"v"), (b"k", None), (b"", b"")], timestamp_ms=5)
    assert list(log.read()) == [(0, b"k", b"v"), (1, b"k", None), (2, b"", b"")]
    log.close()


def test_segment_roll(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=300)
    expected = []
    for i in range(30):
        batch = [meta(f"g{i}", i), meta("x", i)]
        log.append(batch, timestamp_ms=i)
        expected.extend(batch)
    log.sync()
    segments = log.segments
    assert len(segments) > 5
    assert all(s.size_bytes <= 300 for s in segments)
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(s.base_offset) for s in segments]
    assert [s.base_offset for s in segments] == sorted({s.base_offset for s in segments})
    assert [(k, v) for _, k, v in log.read()] == expected
    middle = segments[3].base_offset + 1
    assert offsets_from(log, middle) == list(range(middle, 60))
    log.close()
    log, report = PartitionLog.open(tmp_path, segment_bytes=300)
    assert report.clean and report.segments == len(segments) and log.next_offset == 60
    assert [(k, v) for _, k, v in log.read()] == expected
    # A batch larger than a segment still goes in, alone in its own segment.
    log.append([(b"big", b"x" * 1000)])
    assert log.segments[-1].size_bytes > 300 and log.segments[-1].base_offset == 60
    log.close()


def offsets_from(log: PartitionLog, start: int) -> list[int]:
    return [o for o, _, _ in log.read(start)]


def test_read_records_skips_unknown_record_types(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log, _ = PartitionLog.open(tmp_path)
    log.append([meta("a", 1), (struct.pack(">hh", 99, 0) + b"future", b"\x00\x00"), meta("b", 2)])
    with caplog.at_level("WARNING"):
        assert [(o, r.key.group_id) for o, r in log.read_records()] == [(0, "a"), (2, "b")]
    assert "unknown record type 99" in caplog.text
    log.close()


# -- recovery -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 5, 8, 9, 10, 20, 28, 29, 30, 40])
def test_torn_final_batch(tmp_path: Path, cut: int) -> None:
    log, written = build_log(tmp_path, 6)
    last_batch_records = 1 + 5 % 3
    log.close()
    path = segment_files(tmp_path)[0]
    original = path.read_bytes()
    last_pos, last_size = batch_positions(path)[-1]
    assert cut < last_size
    path.write_bytes(original[:-cut])

    log, report = PartitionLog.open(tmp_path)
    assert report.truncated and not report.clean
    remaining = last_size - cut
    expected_kind = Corruption.TORN_HEADER if remaining < 9 else Corruption.TORN_BATCH
    assert report.corruption is expected_kind
    assert report.truncated_file == path.name and report.truncated_position == last_pos
    assert report.truncated_offset == len(written) - last_batch_records == log.next_offset
    assert report.truncated_bytes == remaining
    assert path.name in report.reason and str(last_pos) in report.reason
    assert path.read_bytes() == original[:last_pos]
    [cut_file] = (tmp_path / "corrupt").iterdir()
    assert cut_file.read_bytes() == original[last_pos:-cut]
    assert [(k, v) for _, k, v in log.read()] == written[:-last_batch_records]
    # The log is usable and the next open is clean.
    log.append([meta("after", 1)])
    log.close()
    log, report = PartitionLog.open(tmp_path)
    assert report.clean and log.next_offset == len(written) - last_batch_records + 1
    log.close()


def test_flipped_byte_in_an_earlier_batch(tmp_path: Path) -> None:
    log, written = build_log(tmp_path, 40, segment_bytes=400)
    log.close()
    files = segment_files(tmp_path)
    assert len(files) >= 4
    victim = files[1]
    positions = batch_positions(victim)
    bad_pos, bad_size = positions[1]
    data = bytearray(victim.read_bytes())
    data[bad_pos + HEADER_SIZE + 3] ^= 0x40  # inside the records of the second batch
    victim.write_bytes(bytes(data))
    later = {p.name: p.read_bytes() for p in files[2:]}
    before_total = sum(p.stat().st_size for p in files)

    log, report = PartitionLog.open(tmp_path)
    assert report.truncated and report.corruption is Corruption.CRC_MISMATCH
    assert "crc mismatch" in report.reason
    assert report.truncated_file == victim.name and report.truncated_position == bad_pos
    assert [p.name for p in segment_files(tmp_path)] == [files[0].name, victim.name]
    assert victim.stat().st_size == bad_pos
    # Nothing was destroyed: the cut tail and the later segments are in corrupt/.
    moved = {p.name.split(".")[0] + ".log": p.read_bytes() for p in (tmp_path / "corrupt").iterdir()}
    for name, content in later.items():
        assert moved[name] == content
    assert report.truncated_bytes == before_total - log.size_bytes == corrupt_bytes(tmp_path)
    survivors = [(k, v) for _, k, v in log.read()]
    assert survivors == written[: len(survivors)] and log.next_offset == len(survivors)
    assert log.next_offset == report.truncated_offset
    log.close()


@pytest.mark.parametrize(
    ("garbage", "kind"),
    [
        (b"\x00" * 4096, Corruption.BAD_MAGIC),
        (b"\x01\x00\x00\x00\x05" + b"\x00" * 40, Corruption.BAD_LENGTH),
        (b"\x01\x7f\xff\xff\xff" + b"\x00" * 40, Corruption.BAD_LENGTH),
        (b"\x01\x00\x00\x01\x00" + b"\x00" * 40, Corruption.TORN_BATCH),
        (b"\x01\x00\x00\x00\x1c" + b"\x00" * 32, Corruption.CRC_MISMATCH),
        (b"\x01", Corruption.TORN_HEADER),
    ],
)
def test_garbage_after_the_last_batch(tmp_path: Path, garbage: bytes, kind: Corruption) -> None:
    log, written = build_log(tmp_path, 5)
    log.close()
    path = segment_files(tmp_path)[0]
    good = path.read_bytes()
    path.write_bytes(good + garbage)
    log, report = PartitionLog.open(tmp_path)
    assert report.truncated and report.corruption is kind
    assert report.truncated_position == len(good) and report.truncated_bytes == len(garbage)
    assert [(k, v) for _, k, v in log.read()] == written
    assert path.read_bytes() == good and corrupt_bytes(tmp_path) == len(garbage)
    log.close()


def _batch_with(base: int, count: int, records_blob: bytes) -> bytes:
    body = struct.pack(">QQI", base, 0, count) + records_blob
    return struct.pack(">BII", 1, len(body), crc32c.crc32c(body)) + body


def test_crc_valid_but_invalid_batches_are_cut(tmp_path: Path) -> None:
    record = struct.pack(">I", 1) + b"k" + struct.pack(">i", -1)
    cases = [
        (_batch_with(6, 2, record), Corruption.BAD_FRAMING),  # count says 2, one record
        (_batch_with(6, 1, record + b"\x00"), Corruption.BAD_FRAMING),  # trailing byte
        (_batch_with(6, 1, struct.pack(">I", 99) + b"k" + struct.pack(">i", -1)), Corruption.BAD_FRAMING),
        (_batch_with(6, 1, struct.pack(">I", 1) + b"k" + struct.pack(">i", -2)), Corruption.BAD_FRAMING),
        (_batch_with(6, 0, record), Corruption.BAD_FRAMING),  # an end marker with records after it
        (_batch_with(2, 1, record), Corruption.BAD_OFFSET),  # overlaps offsets 0..5 already written
    ]
    for i, (batch, kind) in enumerate(cases):
        directory = tmp_path / str(i)
        log, written = build_log(directory, 3)  # offsets 0..5
        log.close()
        path = segment_files(directory)[0]
        good = path.read_bytes()
        path.write_bytes(good + batch)
        log, report = PartitionLog.open(directory)
        assert report.corruption is kind, (i, report.reason)
        assert [(k, v) for _, k, v in log.read()] == written
        log.close()


def test_segments_must_cover_the_offsets_without_gaps_or_overlaps(tmp_path: Path) -> None:
    log, written = build_log(tmp_path, 20, segment_bytes=300)
    log.close()
    files = segment_files(tmp_path)
    assert len(files) >= 4
    survivors_until = int(files[2].name[:20])

    # A stray copy of a segment named inside the previous one's range: offsets overlap.
    stray = tmp_path / segment_name(int(files[1].name[:20]) + 1)
    shutil.copy(files[1], stray)
    log, report = PartitionLog.open(tmp_path)
    assert report.corruption is Corruption.BAD_OFFSET and report.truncated_file == stray.name
    assert [(k, v) for _, k, v in log.read()] == written[:survivors_until]
    assert log.next_offset == survivors_until and not stray.exists()
    log.close()


def test_closed_segment_cut_at_a_batch_boundary_is_detected(tmp_path: Path) -> None:
    log, written = build_log(tmp_path, 20, segment_bytes=300)
    log.close()
    files = segment_files(tmp_path)
    last_pos, _ = batch_positions(files[1])[-1]
    with open(files[1], "r+b") as f:
        f.truncate(last_pos)  # every remaining batch is valid, the CRCs cannot tell
    log, report = PartitionLog.open(tmp_path)
    assert report.truncated and report.corruption is Corruption.OFFSET_GAP
    assert report.truncated_file == files[2].name and "missing" in report.reason
    assert [p.name for p in segment_files(tmp_path)] == [f.name for f in files[:2]]
    survivors = [(k, v) for _, k, v in log.read()]
    assert survivors == written[: len(survivors)] and log.next_offset == len(survivors)
    log.close()


def test_missing_first_segment_empties_the_log(tmp_path: Path) -> None:
    log, written = build_log(tmp_path, 20, segment_bytes=300)
    log.close()
    files = segment_files(tmp_path)
    files[0].unlink()
    log, report = PartitionLog.open(tmp_path)
    assert report.corruption is Corruption.OFFSET_GAP and report.truncated_offset == 0
    assert list(log.read()) == [] and log.next_offset == 0
    assert len(list((tmp_path / "corrupt").iterdir())) == len(files) - 1
    log.close()


def test_bad_first_batch_of_a_later_segment_moves_that_segment(tmp_path: Path) -> None:
    log, written = build_log(tmp_path, 30, segment_bytes=300)
    log.close()
    files = segment_files(tmp_path)
    data = bytearray(files[2].read_bytes())
    data[0] = 7  # bad magic at position 0
    files[2].write_bytes(bytes(data))
    log, report = PartitionLog.open(tmp_path)
    assert report.corruption is Corruption.BAD_MAGIC and report.truncated_position == 0
    assert [p.name for p in segment_files(tmp_path)] == [f.name for f in files[:2]]
    assert log.next_offset == int(files[2].name[:20])
    survivors = [(k, v) for _, k, v in log.read()]
    assert survivors == written[: len(survivors)]
    # Appends continue at the right offset, in the previous segment.
    assert log.append([meta("new", 1)]) == int(files[2].name[:20])
    log.close()


def _mutate(data: bytes, kind: str, position: float, length: int, rnd: random.Random) -> bytes:
    if not data:
        return bytes(rnd.randrange(256) for _ in range(length))
    pos = min(int(position * len(data)), len(data) - 1)
    if kind == "flip":
        out = bytearray(data)
        out[pos] ^= 1 << rnd.randrange(8)
        return bytes(out)
    if kind == "truncate":
        return data[:pos]
    if kind == "zeros":
        return data[:pos] + b"\x00" * length + data[pos + length :]
    if kind == "insert":
        return data[:pos] + bytes(rnd.randrange(256) for _ in range(length)) + data[pos:]
    return data + bytes(rnd.randrange(256) for _ in range(length))  # append


@PROPERTY
@given(
    batches=st.integers(1, 25),
    segment_bytes=st.integers(60, 800),
    mutations=st.lists(
        st.tuples(
            st.sampled_from(["flip", "truncate", "zeros", "insert", "append"]),
            st.floats(0, 1),  # which segment
            st.floats(0, 1),  # where in it
            st.integers(1, 40),
        ),
        min_size=1,
        max_size=3,
    ),
    seed=st.integers(0, 2**32),
)
def test_open_survives_any_corruption_of_a_valid_log(batches, segment_bytes, mutations, seed) -> None:
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        log, written = build_log(directory, batches, segment_bytes=segment_bytes)
        log.close()
        for kind, which, where, length in mutations:
            files = segment_files(directory)
            path = files[min(int(which * len(files)), len(files) - 1)]
            path.write_bytes(_mutate(path.read_bytes(), kind, where, length, rnd))
        total = sum(p.stat().st_size for p in segment_files(directory))

        log, report = PartitionLog.open(directory, segment_bytes=segment_bytes, **FAST)
        survivors = [(k, v) for _, k, v in log.read()]
        # Truncation only: what is left is a prefix of what was written, nothing else.
        assert survivors == written[: len(survivors)]
        assert log.next_offset == len(survivors) == report.records
        assert log.size_bytes + report.truncated_bytes == total
        assert corrupt_bytes(directory) == report.truncated_bytes
        log.append([meta("after", 1)])
        log.close()
        log, again = PartitionLog.open(directory, segment_bytes=segment_bytes, **FAST)
        assert again.clean
        assert [(k, v) for _, k, v in log.read()] == [*survivors, meta("after", 1)]
        log.close()


@PROPERTY
@given(
    files=st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=300)), min_size=1, max_size=4),
    temp=st.sampled_from([None, ".log.cleaned", ".swap"]),
)
def test_open_survives_random_bytes(files, temp) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for base, content in files:
            (directory / segment_name(base)).write_bytes(content)
        if temp == ".swap":
            (directory / f"{files[0][0]:020d}-{files[0][0] + 1000:020d}.swap").write_bytes(files[-1][1])
        elif temp is not None:
            (directory / f"{files[0][0]:020d}{temp}").write_bytes(files[-1][1])
        log, report = PartitionLog.open(directory, **FAST)
        assert report.summary()
        survivors = list(log.read())
        assert log.next_offset >= (survivors[-1][0] + 1 if survivors else 0)
        log.append([meta("after", 1)])
        log.close()
        log, again = PartitionLog.open(directory, **FAST)
        assert again.clean and list(log.read())[-1][1:] == meta("after", 1)
        log.close()


# -- write failures -----------------------------------------------------------------------------


class FailingWriter:
    """Writes part of the data for real, then fails, when armed."""

    def __init__(self, partial: int) -> None:
        self.partial = partial
        self.armed = False

    def __call__(self, fd: int, data: memoryview) -> int:
        if not self.armed:
            return os.write(fd, data)
        self.armed = False
        if self.partial:
            os.write(fd, data[: self.partial])
        raise OSError(errno.ENOSPC, "No space left on device (injected)")


@pytest.mark.parametrize("partial", [0, 1, 13, 40])
def test_write_failure_leaves_the_log_consistent(tmp_path: Path, partial: int) -> None:
    writer = FailingWriter(partial)
    log, _ = PartitionLog.open(tmp_path, write_fn=writer)
    log.append([meta("a", 1), meta("b", 1)], timestamp_ms=1)
    path = segment_files(tmp_path)[0]
    size = path.stat().st_size
    writer.armed = True
    with pytest.raises(OSError, match="injected"):
        log.append([meta("c", 1), meta("d", 1)], timestamp_ms=2)
    assert path.stat().st_size == size == log.size_bytes
    assert log.next_offset == 2 and log.failed is None
    assert log.append([meta("e", 1)], timestamp_ms=3) == 2
    log.sync()
    assert [(k, v) for _, k, v in log.read()] == [meta("a", 1), meta("b", 1), meta("e", 1)]
    log.close()
    log, report = PartitionLog.open(tmp_path)
    assert report.clean and log.next_offset == 3
    log.close()


def test_fsync_failure_rolls_back_to_the_durable_offset(tmp_path: Path) -> None:
    fail = {"next": False}

    def fsync(fd: int) -> None:
        if fail["next"]:
            fail["next"] = False
            raise OSError(errno.EIO, "fsync failed (injected)")
        os.fsync(fd)

    log, _ = PartitionLog.open(tmp_path, fsync_fn=fsync)
    log.append([meta("a", 1)])
    log.sync()
    assert log.durable_offset == 1
    log.append([meta("b", 1)])
    log.append([meta("c", 1)])
    fail["next"] = True
    with pytest.raises(OSError, match="injected"):
        log.sync()
    assert log.next_offset == log.durable_offset == 1 and log.failed is None
    assert [(k, v) for _, k, v in log.read()] == [meta("a", 1)]
    log.append([meta("d", 1)])
    log.sync()
    log.close()
    log, report = PartitionLog.open(tmp_path)
    assert report.clean and [(k, v) for _, k, v in log.read()] == [meta("a", 1), meta("d", 1)]
    log.close()


def test_fsync_failure_at_roll(tmp_path: Path) -> None:
    fail = {"next": False}

    def fsync(fd: int) -> None:
        if fail["next"]:
            fail["next"] = False
            raise OSError(errno.EIO, "fsync failed (injected)")

    log, _ = PartitionLog.open(tmp_path, segment_bytes=120, fsync_fn=fsync)
    log.append([meta("a", 1)])
    log.sync()
    log.append([meta("b", 1)])  # unsynced
    fail["next"] = True
    with pytest.raises(OSError, match="injected"):
        log.append([meta("c", 1)] * 3)  # needs a roll: the roll's fsync fails
    assert log.next_offset == 1 and len(log.segments) == 1
    log.append([meta("c", 1)] * 3)
    assert len(log.segments) == 2 and log.next_offset == 4
    log.close()


def test_failed_rollback_marks_the_log_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = FailingWriter(20)
    log, _ = PartitionLog.open(tmp_path, write_fn=writer)
    log.append([meta("a", 1)])

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "ftruncate failed (injected)")

    monkeypatch.setattr(os, "ftruncate", no_truncate)
    writer.armed = True
    with pytest.raises(OSError, match="No space"):
        log.append([meta("b", 1)])
    assert log.failed is not None
    with pytest.raises(LogFailedError):
        log.append([meta("c", 1)])
    with pytest.raises(LogFailedError):
        log.sync()
    monkeypatch.undo()
    log.close()
    log, report = PartitionLog.open(tmp_path)  # recovery cuts the half batch
    assert report.truncated and report.corruption is Corruption.TORN_BATCH
    assert [(k, v) for _, k, v in log.read()] == [meta("a", 1)]
    log.close()


# -- compaction ---------------------------------------------------------------------------------


def test_compaction_keeps_the_latest_value_per_key(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=250)
    now = 10_000
    for i in range(40):
        log.append([meta(f"g{i % 4}", i)], timestamp_ms=now)
    log.append([gone("g0")], timestamp_ms=now)  # old by the time we compact
    log.append([gone("g1")], timestamp_ms=now + 9_000)  # young
    for i in range(12):
        log.append([meta(f"h{i}", i)], timestamp_ms=now + 9_000)
    log.sync()
    before = replay_map(log)
    active = log.segments[-1]
    active_bytes = active.path.read_bytes()
    closed_before = log.segments[:-1]

    report = log.compact(now_ms=now + 10_000, tombstone_grace_ms=5_000)
    assert report.segments_in == len(closed_before)
    assert report.superseded_dropped > 0 and report.tombstones_dropped == 1
    assert report.tombstones_retained == 1
    assert report.records_out == report.records_in - report.superseded_dropped - report.tombstones_dropped
    assert report.bytes_out < report.bytes_in and report.segments_out < report.segments_in
    assert log.segments[-1] == active and active.path.read_bytes() == active_bytes
    assert replay_map(log) == before
    kept = [(k, v) for _, k, v in log.read()]
    assert gone("g0") not in kept and gone("g1") in kept
    assert len({k for k, _ in kept}) == len(kept)  # one record per key once all are closed
    offs = offsets(log)
    assert offs == sorted(set(offs))  # order kept, offsets unique
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))

    log.close()
    log, report = PartitionLog.open(tmp_path, segment_bytes=250)
    assert report.clean and replay_map(log) == before and offsets(log) == offs
    # Later, the young tombstone is old enough too; compaction again is idempotent otherwise.
    log.append([meta("z", 1)] * 5)  # roll, so the tombstone's segment is closed
    log.append([meta("z", 2)] * 5)
    log.sync()
    report = log.compact(now_ms=now + 100_000, tombstone_grace_ms=5_000)
    assert report.tombstones_dropped >= 1
    assert gone("g1") not in [(k, v) for _, k, v in log.read()]
    log.close()


def test_compaction_ignores_records_that_are_not_durable(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=100, **FAST)
    log.append([meta("a", 1), meta("b", 1)])
    log.append([meta("c", 1), meta("d", 1)])  # rolls: segment 0 is closed and durable
    log.append([meta("a", 2)])  # supersedes a=1, but only in the page cache
    assert log.durable_offset < log.next_offset
    report = log.compact(now_ms=0, tombstone_grace_ms=0)
    assert report.superseded_dropped == 0
    assert meta("a", 1) in [(k, v) for _, k, v in log.read()]
    log.sync()
    report = log.compact(now_ms=0, tombstone_grace_ms=0)
    assert report.superseded_dropped == 1
    assert meta("a", 1) not in [(k, v) for _, k, v in log.read()]
    log.close()


def test_compaction_with_nothing_to_do(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path)
    assert log.compact(0, 0).segments_in == 0
    log.append([meta("a", 1)])
    assert log.compact(0, 0).segments_rewritten == 0
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.compact(0, 0)


def test_compaction_removes_segments_that_become_empty(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=100, **FAST)
    for i in range(10):
        log.append([meta("a", i)], timestamp_ms=0)
    log.append([gone("a")], timestamp_ms=0)
    log.append([meta("b", 1)], timestamp_ms=0)
    log.append([meta("b", 2)] * 3, timestamp_ms=0)  # rolls after the tombstone
    log.sync()
    log.compact(now_ms=100, tombstone_grace_ms=10)
    assert replay_map(log) == {meta("b", 2)[0]: meta("b", 2)[1]}
    assert all(k != meta("a", 0)[0] for _, k, _ in log.read())
    next_offset = log.next_offset
    log.close()
    log, report = PartitionLog.open(tmp_path, segment_bytes=100, **FAST)
    assert report.clean and log.next_offset == next_offset
    log.close()


op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5), st.integers(0, 1000)),
    st.tuples(st.just("del"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("batch"), st.integers(0, 5), st.integers(2, 4)),
    st.tuples(st.just("sync"), st.just(0), st.just(0)),
    st.tuples(st.just("compact"), st.integers(0, 200), st.integers(0, 100)),
    st.tuples(st.just("reopen"), st.just(0), st.just(0)),
)


@PROPERTY
@given(segment_bytes=st.integers(40, 600), ops=st.lists(op, max_size=60))
def test_compaction_preserves_the_final_map(segment_bytes: int, ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        log, _ = PartitionLog.open(directory, segment_bytes=segment_bytes, **FAST)
        model: dict[bytes, bytes] = {}
        clock = 0

        def put(records: list[tuple[bytes, bytes | None]]) -> None:
            log.append(records, timestamp_ms=clock)
            for key, value in records:
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value

        for kind, a, b in ops:
            clock += 7
            if kind == "put":
                put([meta(f"k{a}", b)])
            elif kind == "del":
                put([gone(f"k{a}")])
            elif kind == "batch":
                put([meta(f"k{(a + i) % 6}", i) if i % 3 else gone(f"k{(a + i) % 6}") for i in range(b)])
            elif kind == "sync":
                log.sync()
            elif kind == "compact":
                before = replay_map(log)
                before_records = set(log.read())
                active = log.segments[-1]
                active_bytes = active.path.read_bytes()[: active.size_bytes]
                log.compact(now_ms=clock, tombstone_grace_ms=a)
                assert replay_map(log) == before
                assert set(log.read()) <= before_records  # same offsets, keys and values
                assert log.segments[-1].path.read_bytes()[: active.size_bytes] == active_bytes
                offs = offsets(log)
                assert offs == sorted(set(offs))
            else:
                log.close()
                log, report = PartitionLog.open(directory, segment_bytes=segment_bytes, **FAST)
                assert report.clean
            assert replay_map(log) == model
        log.sync()
        log.compact(now_ms=clock + 1000, tombstone_grace_ms=0)
        assert replay_map(log) == model
        log.close()
        log, report = PartitionLog.open(directory, segment_bytes=segment_bytes, **FAST)
        assert report.clean and replay_map(log) == model
        log.close()


@pytest.mark.parametrize("step", ["cleaned", "swap", "unlinked", "installed"])
def test_crash_during_compaction(tmp_path: Path, step: str) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=120, **FAST)
    for i in range(30):
        log.append([meta(f"g{i % 3}", i)], timestamp_ms=0)
        if i == 20:
            log.append([gone("g0")], timestamp_ms=0)
    log.sync()
    expected = replay_map(log)
    written = list(log.read())

    class Crash(Exception):
        pass

    def hook(at: str) -> None:
        if at == step:
            raise Crash(at)

    log._compaction_hook = hook
    with pytest.raises(Crash):
        log.compact(now_ms=10, tombstone_grace_ms=0)
    log.close()  # the process "dies": files stay as the crash left them
    log, report = PartitionLog.open(tmp_path, segment_bytes=120, **FAST)
    assert not report.truncated and not report.warnings
    if step == "cleaned":
        assert report.removed_temp_files
    elif step in ("swap", "unlinked"):
        assert report.completed_compactions
    assert replay_map(log) == expected
    records = list(log.read())
    assert [o for o, _, _ in records] == sorted({o for o, _, _ in records})
    assert set(records) <= set(written)  # never both old and new: no duplicate offsets above
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    log.compact(now_ms=10, tombstone_grace_ms=0)
    assert replay_map(log) == expected
    log.close()


def test_leftover_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    log, written = build_log(tmp_path, 4)
    log.close()
    leftover = tmp_path / f"{segment_name(0)}.cleaned"
    leftover.write_bytes(b"half written compaction output")
    unrelated = tmp_path / "README"
    unrelated.write_text("not ours")
    log, report = PartitionLog.open(tmp_path)
    assert report.removed_temp_files == [leftover.name] and not report.truncated
    assert not leftover.exists() and unrelated.exists()
    assert [(k, v) for _, k, v in log.read()] == written
    log.close()


def test_invalid_swap_is_set_aside(tmp_path: Path) -> None:
    log, written = build_log(tmp_path, 4)
    log.close()
    swap = tmp_path / f"{0:020d}-{3:020d}.swap"
    swap.write_bytes(b"\x01garbage")
    log, report = PartitionLog.open(tmp_path)
    assert report.warnings and not report.clean and not swap.exists()
    assert any(name.startswith("corrupt/" + swap.name) for name in report.corrupt_files)
    assert [(k, v) for _, k, v in log.read()] == written
    log.close()


def test_compaction_concurrent_with_appends(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=2_000, **FAST)
    model: dict[bytes, bytes] = {}
    done = threading.Event()
    errors: list[BaseException] = []
    reports = []

    def appender() -> None:
        try:
            for i in range(3_000):
                records = [meta(f"g{(i * 7 + j) % 50}", i) for j in range(1 + i % 3)]
                if i % 11 == 0:
                    records.append(gone(f"g{i % 50}"))
                log.append(records, timestamp_ms=i)
                for key, value in records:
                    if value is None:
                        model.pop(key, None)
                    else:
                        model[key] = value
                if i % 5 == 0:
                    log.sync()
            log.sync()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def compactor() -> None:
        try:
            while not done.is_set():
                reports.append(log.compact(now_ms=3_000, tombstone_grace_ms=500))
                offs = offsets(log)
                assert offs == sorted(set(offs))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=appender), threading.Thread(target=compactor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sum(r.segments_rewritten for r in reports) > 0
    assert replay_map(log) == model
    log.compact(now_ms=10**9, tombstone_grace_ms=0)
    assert replay_map(log) == model
    log.close()
    log, report = PartitionLog.open(tmp_path, segment_bytes=2_000)
    assert report.clean and replay_map(log) == model
    log.close()


CRASHING_WRITER = """
import sys, threading
from coordinator.runtime.log import PartitionLog

log, _ = PartitionLog.open(sys.argv[1], segment_bytes=1500)

def compactor():
    while True:
        log.compact(now_ms=10**12, tombstone_grace_ms=0)

threading.Thread(target=compactor, daemon=True).start()
i = 0
while True:
    last = log.append([(b"k%d" % (i % 20), b"%d" % i), (b"x", b"%d" % i)], timestamp_ms=i)
    log.sync()
    print(i, last, flush=True)  # acknowledged
    i += 1
"""


@pytest.mark.parametrize("acks", [150, 400])
def test_no_acknowledged_record_is_lost_on_kill(tmp_path: Path, acks: int) -> None:
    """SIGKILL a real process appending, syncing and compacting: every acknowledged write is there."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
    )
    assert child.stdout is not None
    acked = [tuple(map(int, child.stdout.readline().split())) for _ in range(acks)]
    child.kill()
    child.wait()
    log, report = PartitionLog.open(tmp_path)
    assert report.corruption in (None, Corruption.TORN_BATCH, Corruption.TORN_HEADER), report.summary()
    state = {k: int(v) for k, v in replay_map(log).items()}
    last_i = acked[-1][0]
    assert state[b"x"] >= last_i and log.next_offset > acked[-1][1]
    for key in {b"k%d" % (i % 20) for i in range(last_i + 1)}:
        latest_acked = max(i for i in range(last_i + 1) if b"k%d" % (i % 20) == key)
        assert state[key] >= latest_acked
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    log.close()


def test_read_snapshot_survives_compaction(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=150, **FAST)
    for i in range(30):
        log.append([meta("same", i)], timestamp_ms=0)
    log.sync()
    everything = list(log.read())
    reader = log.read()
    first = next(reader)
    log.compact(now_ms=0, tombstone_grace_ms=0)  # deletes the segments the reader has open
    assert [first, *reader] == everything
    assert len(list(log.read())) < len(everything)
    log.close()


def test_close_stops_a_running_compaction(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path, segment_bytes=150, **FAST)
    for i in range(30):
        log.append([meta("same", i)], timestamp_ms=0)
    log.sync()
    log._stop.set()  # what close() does before waiting for the compaction lock
    report = log.compact(now_ms=0, tombstone_grace_ms=0)
    assert report.aborted and report.segments_rewritten == 0
    log.close()
    log, report = PartitionLog.open(tmp_path)
    assert report.clean and len(list(log.read())) == 30
    log.close()


# -- fsync policy -------------------------------------------------------------------------------


def test_fsync_policy_parsing() -> None:
    assert FsyncPolicy.parse("always") == FsyncPolicy() == FsyncPolicy(FsyncMode.ALWAYS)
    assert FsyncPolicy.parse(" NEVER ") == FsyncPolicy(FsyncMode.NEVER)
    policy = FsyncPolicy.parse("interval:50")
    assert policy == FsyncPolicy(FsyncMode.INTERVAL, 50) and str(policy) == "interval:50"
    assert FsyncPolicy.parse(str(policy)) == policy and str(FsyncPolicy()) == "always"
    assert FsyncPolicy().sync_before_release and not policy.sync_before_release
    assert policy.sync_due(now_ms=150, last_sync_ms=100) and not policy.sync_due(now_ms=149, last_sync_ms=100)
    assert not FsyncPolicy.parse("never").sync_due(10**9, 0) and FsyncPolicy().sync_due(0, 0)
    for text, message in [
        ("interval", "needs a period"),
        ("interval:", "needs a period"),
        ("interval:abc", "not an integer"),
        ("interval:0", "must be > 0"),
        ("interval:-5", "must be > 0"),
        ("sometimes", "unknown fsync policy"),
        ("", "unknown fsync policy"),
    ]:
        with pytest.raises(ValueError, match=message):
            FsyncPolicy.parse(text)
    with pytest.raises(ValueError):
        FsyncPolicy(FsyncMode.INTERVAL, 0)
    with pytest.raises(ValueError):
        FsyncPolicy(FsyncMode.NEVER, 5)
