"""The durable log of one coordinator partition: append-only segment files, recovery, compaction.

Plain, synchronous file I/O (no asyncio): the runtime calls :meth:`PartitionLog.append` and
:meth:`PartitionLog.sync` from its shard task and :meth:`PartitionLog.compact` from a worker thread.

Layout on disk
--------------
One directory per partition (``<data_dir>/partition-<N>/``) holding segment files named by the
offset of their first record, 20 digits: ``00000000000000000000.log``, ``00000000000000004096.log``...
The last segment is the *active* one (the only one written); the others are *closed* (immutable
except for compaction, which replaces them). Other names in the directory:

* ``corrupt/``: bytes cut from the log by recovery, never deleted by this code (see below);
* ``<base>.log.cleaned``: a compaction output being written (deleted on open: incomplete);
* ``<base>-<end>.swap``: a complete, fsynced compaction output that replaces every segment whose
  base offset is in ``[base, end)``; open() finishes the swap (see Compaction).

A segment is a sequence of batches. A batch is the atomic unit of a write: after a crash it is
either entirely valid or cut. All integers are big-endian::

    offset  size  field
    0       1     magic            u8   = 1
    1       4     length           u32  number of bytes after the crc field (20 + records)
    5       4     crc              u32  CRC32C (Castagnoli) of those ``length`` bytes
    9       8     base offset      u64  offset of the first record of the batch
    17      8     timestamp        u64  append time in ms (the caller's clock); tombstone age
    25      4     record count     u32  >= 1 (0 only in an end marker, see below)
    29      ...   records, ``record count`` times:
                  key length       u32
                  key              key length bytes (see coordinator.runtime.serde)
                  value length     i32  -1 = tombstone (no value bytes)
                  value            value length bytes

Offsets inside a batch are contiguous: record i has offset ``base offset + i``; the batch's *next
offset* is ``base offset + record count``. Batch base offsets never go below the previous batch's
next offset. A fresh log is contiguous; compaction leaves gaps inside segments (a compacted batch
holds one contiguous run of surviving records and keeps its original timestamp).

Segments cover the offsets from 0 without gaps or overlaps: the first segment is named 0 and each
segment is named by the end (next offset of its last batch) of the one before, as a roll does.
When compaction drops the last records of a range it ends its output with an *end marker*: a
batch of 0 records whose base offset is the end of the range (29 bytes, written only there). So
a closed segment shortened at a batch boundary, or missing, is detected, which per-batch CRCs
alone cannot do.

Recovery (:meth:`PartitionLog.open`)
------------------------------------
open() reads every segment and validates every batch: magic, a sane length that stays within the
file, the CRC, the record framing (the records consume exactly ``length`` bytes), offsets that
increase (never below the segment's name), and the coverage rule above (a segment that does not
start where the previous one ends is invalid at its first byte). At the first invalid batch the
log is TRUNCATED there: later segments are moved whole into ``corrupt/``
and the bad segment is cut at its last good batch, its cut bytes copied into ``corrupt/`` first
(timestamped names; nothing is ever deleted silently). The :class:`RecoveryReport` says what was
read and what was cut, where and why; the daemon logs it and counts it in a metric. open() never
raises because of file *content* (it raises for real I/O errors, permissions, ...) -- except
when given a ``recovery_point`` the log would end below (a missing segment or directory, a gap
or an invalid batch below it): then it raises :class:`BehindRecoveryPoint` before cutting,
moving or creating anything (see :mod:`coordinator.runtime.datadir`).

Why truncate instead of skipping the bad batch: this is what Kafka does (log recovery truncates
a segment at its first invalid batch), and the records form a state machine: replaying records
that follow a missing one could build a state that never existed (a member without its group, a
target assignment without its epoch). A torn final batch after a crash is the normal case: it was
never acknowledged (the runtime acknowledges only after sync(), by default).

Writes, durability and failures
-------------------------------
:meth:`append` encodes ONE batch and writes it with ``os.write`` on an ``O_APPEND`` descriptor
(buffered in the OS page cache, not fsynced), rolling to a new segment first when the active one
would exceed ``segment_bytes`` (the closing segment is fsynced at the roll, so closed segments are
always durable). :meth:`sync` fsyncs the active segment (and the directory after a roll). The
runtime appends every request's records and calls sync once per group commit; see
:class:`FsyncPolicy` for when.

* A failed write (OSError, e.g. ENOSPC) truncates the active file back to its size before the
  append, so a half batch is never followed by a good one, and re-raises: the runtime rolls back
  its state and answers COORDINATOR_NOT_AVAILABLE.
* A failed fsync means the records written since the last good sync are in an unknown state (the
  kernel may have dropped the dirty pages): the log truncates back to :attr:`durable_offset`
  and re-raises. After any OSError from append() or sync(), :attr:`next_offset` is where the log
  now ends; the runtime must roll back (or reload) any state built from records at or after it.
* If even that truncation fails, the log is *failed*: every later append/sync raises
  :class:`LogFailedError` until the runtime closes and reopens it (open() recovers). (A cut
  that succeeded but whose fsync failed does not fail the log: the next sync() fsyncs it.)

Compaction (:meth:`compact`)
----------------------------
Rewrites the CLOSED segments (never the active one), keeping only the latest record per key (key =
key bytes) across the whole log, and dropping tombstones whose batch timestamp is at least
``tombstone_grace_ms`` old. Only durable records (below :attr:`durable_offset` as of the start of
compaction) can supersede older ones: an unsynced record lost in a crash must not have caused its
predecessor to be dropped. Offsets are kept, so replay order is preserved. Small closed segments
are merged (up to ``segment_bytes``, named by the first base offset; an output is never empty:
at least its end marker); a lone segment with nothing to drop is left alone. Each output is
written to ``<base>.log.cleaned``, fsynced, renamed to
``<base>-<end>.swap`` (the commit point; directory fsynced), then the replaced segments are
deleted in ascending order and the swap renamed over ``<base>.log``. open() deletes ``.cleaned``
files and finishes ``.swap`` files, so after a crash either the old or the new segments are
visible, never both. Outputs are committed in ascending order, so a tombstone is never dropped
before the older values it deletes.

compaction never rewrites the active segment, so history written there stays until it rolls. Pass
1 also measures the active segment's durable part (:attr:`CompactionReport.active_bytes`,
``active_dirty_bytes``: records superseded by later ones); when it is mostly superseded
(:meth:`CompactionReport.active_mostly_garbage`) the runtime has the writer :meth:`roll` it and
compacts again, so the log follows the live state rather than the number of writes.

compact() may run in a worker thread while the shard thread keeps appending: the segment list is
swapped under a lock (also taken by a roll); reads of closed segments do not block appends.

Threading contract: one writer thread (append, sync, close), at most one compaction at a time
(serialised by a lock), any number of readers (:meth:`read` snapshots the segment list).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO, NamedTuple

import crc32c

from coordinator.group.records import Record

from . import serde

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_SEGMENT_BYTES",
    "BatchTooLarge",
    "BehindRecoveryPoint",
    "CompactionReport",
    "CorruptLogError",
    "Corruption",
    "FsyncMode",
    "FsyncPolicy",
    "LogFailedError",
    "PartitionLog",
    "RecoveryReport",
    "SegmentInfo",
    "partition_dir",
    "segment_name",
]

log = logging.getLogger(__name__)

MAGIC = 1
_PREFIX = struct.Struct(">BII")  # magic, length, crc
_FIXED = struct.Struct(">QQI")  # base offset, timestamp, record count
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_TOMBSTONE_LEN = _I32.pack(-1)
PREFIX_SIZE = _PREFIX.size  # 9
HEADER_SIZE = _PREFIX.size + _FIXED.size  # 29
MIN_LENGTH = _FIXED.size  # 20: length of a batch without records (an end marker)
MIN_RECORD_SIZE = 8  # key length + value length
MAX_BATCH_LENGTH = 1 << 30  # hard sanity limit on the length field, whatever the configuration
MAX_OFFSET = (1 << 63) - 1
_MAX_TIMESTAMP = (1 << 64) - 1

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BATCH_BYTES = 8 * 1024 * 1024

_READ_BUFFER = 256 * 1024
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
_CLEANED_RE = re.compile(r"^(\d{20})\.log\.cleaned$")
_SWAP_RE = re.compile(r"^(\d{20})-(\d{20})\.swap$")
CORRUPT_DIR = "corrupt"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

WriteFn = Callable[[int, memoryview], int]
RecordSink = Callable[[list[tuple[bytes, bytes | None]]], None]
FsyncFn = Callable[[int], None]


def segment_name(base_offset: int) -> str:
    """File name of the segment whose first offset is ``base_offset``."""
    return f"{base_offset:020d}.log"


def partition_dir(data_dir: str | os.PathLike[str], partition: int) -> Path:
    """``<data_dir>/partition-<N>``: the directory of one partition's log."""
    return Path(data_dir) / f"partition-{partition}"


# -- errors and reports -------------------------------------------------------------------------


class BatchTooLarge(ValueError):
    """The encoded batch is larger than ``max_batch_bytes`` (nothing was written)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"batch of {size} bytes exceeds max_batch_bytes={limit}")
        self.size = size
        self.limit = limit


class LogFailedError(OSError):
    """The log could not restore a consistent state after an I/O error: close and reopen it."""


class BehindRecoveryPoint(Exception):
    """The log ends below its recovery point: records known to have been durable are missing.

    Raised by :meth:`PartitionLog.open` *before* recovery cuts or creates anything (so the files
    are left as found, for the operator). ``reason`` says what recovery found (a missing
    directory, a gap, an invalid batch, or a log that simply ends early)."""

    def __init__(self, directory: Path, recovery_point: int, log_end: int, reason: str) -> None:
        super().__init__(
            f"{directory}: the log ends at offset {log_end} but its recovery point is "
            f"{recovery_point} (records up to there were durable): {reason}; nothing was changed. "
            f"To accept the loss, stop the daemon, remove the line of {directory.name} from "
            f"the data dir's recovery-point-offset-checkpoint and restart")
        self.directory = directory
        self.recovery_point = recovery_point
        self.log_end = log_end
        self.reason = reason


class CorruptLogError(Exception):
    """A segment that open() validated no longer reads back correctly (changed under us)."""


class Corruption(StrEnum):
    """Why recovery cut the log (a stable code for logs and metric labels)."""

    TORN_HEADER = "torn-header"  # fewer than 9 bytes left: a header cut by a crash
    BAD_MAGIC = "bad-magic"
    BAD_LENGTH = "bad-length"  # length field below the minimum or above the hard limit
    TORN_BATCH = "torn-batch"  # the batch extends past the end of the file
    CRC_MISMATCH = "crc-mismatch"
    BAD_FRAMING = "bad-record-framing"
    BAD_OFFSET = "offset-out-of-order"
    OFFSET_GAP = "offset-gap"  # a segment ends before the next one starts: data is missing


class _Invalid(Exception):
    def __init__(self, kind: Corruption, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class SegmentInfo(NamedTuple):
    base_offset: int
    path: Path
    size_bytes: int


@dataclass
class RecoveryReport:
    """What :meth:`PartitionLog.open` found and did. ``truncated`` is the one to alert on."""

    directory: str
    segments: int = 0  # segments in the log after recovery
    batches: int = 0  # valid batches read
    records: int = 0  # valid records read
    valid_bytes: int = 0
    next_offset: int = 0
    truncated: bool = False
    corruption: Corruption | None = None
    reason: str = ""  # human readable, with file, position and offset
    truncated_file: str | None = None  # segment in which the first invalid batch was found
    truncated_position: int | None = None  # byte position of that batch in the file
    truncated_offset: int | None = None  # the log offset at which the log now ends
    truncated_bytes: int = 0  # all bytes taken out of the log (cut tail + later segments)
    corrupt_files: list[str] = field(default_factory=list)  # what was written into corrupt/
    removed_temp_files: list[str] = field(default_factory=list)
    completed_compactions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.truncated and not self.warnings

    def summary(self) -> str:
        text = (
            f"{self.directory}: {self.segments} segment(s), {self.batches} batches, "
            f"{self.records} records, next offset {self.next_offset}"
        )
        if self.truncated:
            text += (
                f"; TRUNCATED at offset {self.truncated_offset} ({self.reason}); "
                f"{self.truncated_bytes} bytes moved to {CORRUPT_DIR}/: {', '.join(self.corrupt_files)}"
            )
        if self.completed_compactions:
            text += f"; finished compaction(s) {', '.join(self.completed_compactions)}"
        if self.removed_temp_files:
            text += f"; removed temp file(s) {', '.join(self.removed_temp_files)}"
        for warning in self.warnings:
            text += f"; WARNING {warning}"
        return text


@dataclass
class CompactionReport:
    segments_in: int = 0  # closed segments considered
    segments_out: int = 0  # closed segments after compaction
    segments_rewritten: int = 0  # input segments actually rewritten
    bytes_in: int = 0  # size of the closed segments before
    bytes_out: int = 0  # and after
    records_in: int = 0  # records in the closed segments before
    records_out: int = 0
    superseded_dropped: int = 0
    tombstones_dropped: int = 0
    tombstones_retained: int = 0  # latest-for-their-key tombstones still within the grace period
    aborted: bool = False  # the log was closed while compacting: nothing changed after that point
    duration_s: float = 0.0
    active_bytes: int = 0  # durable bytes of the active segment (read by pass 1)
    active_dirty_bytes: int = 0  # of which records superseded by later durable records

    def active_mostly_garbage(self, min_bytes: int, dirty_percent: int) -> bool:
        """Whether the active segment should be rolled so that the next compaction rewrites it:
        at least ``min_bytes`` and at least ``dirty_percent`` % superseded (see
        :meth:`PartitionLog.roll`)."""
        return (self.active_bytes >= min_bytes
                and self.active_dirty_bytes * 100 >= dirty_percent * self.active_bytes)


# -- fsync policy -------------------------------------------------------------------------------


class FsyncMode(StrEnum):
    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True)
class FsyncPolicy:
    """When the runtime calls :meth:`PartitionLog.sync` (the log itself never decides).

    * ``always`` (default): sync every group commit and release responses only after the fsync:
      an acknowledged record survives a power loss.
    * ``interval:N``: release responses after the OS write; fsync at most every N ms. A process
      crash loses nothing (the page cache survives it), a power loss up to N ms.
    * ``never``: release after the OS write and let the OS flush (segments are still fsynced when
      they are rolled).
    """

    mode: FsyncMode = FsyncMode.ALWAYS
    interval_ms: int = 0

    def __post_init__(self) -> None:
        if self.mode is FsyncMode.INTERVAL and self.interval_ms <= 0:
            raise ValueError(f"fsync interval must be a positive number of ms, got {self.interval_ms}")
        if self.mode is not FsyncMode.INTERVAL and self.interval_ms != 0:
            raise ValueError(f"fsync policy {self.mode.value!r} takes no interval")

    @classmethod
    def parse(cls, text: str) -> FsyncPolicy:
        """Parse ``"always"``, ``"never"`` or ``"interval:<ms>"`` (case and spaces ignored)."""
        spec = text.strip().lower()
        if spec == FsyncMode.ALWAYS.value:
            return cls(FsyncMode.ALWAYS)
        if spec == FsyncMode.NEVER.value:
            return cls(FsyncMode.NEVER)
        name, sep, arg = spec.partition(":")
        if name.strip() == FsyncMode.INTERVAL.value:
            arg = arg.strip()
            if not sep or not arg:
                raise ValueError(
                    f"fsync policy {text!r}: 'interval' needs a period in ms, e.g. 'interval:50'"
                )
            try:
                interval = int(arg)
            except ValueError:
                raise ValueError(
                    f"fsync policy {text!r}: interval {arg!r} is not an integer number of ms"
                ) from None
            if interval <= 0:
                raise ValueError(f"fsync policy {text!r}: interval must be > 0 ms, got {interval}")
            return cls(FsyncMode.INTERVAL, interval)
        raise ValueError(f"unknown fsync policy {text!r}: expected 'always', 'interval:<ms>' or 'never'")

    @property
    def sync_before_release(self) -> bool:
        """Responses wait for the fsync (only ``always``)."""
        return self.mode is FsyncMode.ALWAYS

    def sync_due(self, now_ms: int, last_sync_ms: int) -> bool:
        """Whether a sync is due now, for a runtime that has unsynced appends."""
        if self.mode is FsyncMode.ALWAYS:
            return True
        if self.mode is FsyncMode.NEVER:
            return False
        return now_ms - last_sync_ms >= self.interval_ms

    def __str__(self) -> str:
        if self.mode is FsyncMode.INTERVAL:
            return f"interval:{self.interval_ms}"
        return self.mode.value


# -- batch encoding and decoding ----------------------------------------------------------------


@dataclass(slots=True)
class _Batch:
    position: int
    size: int  # bytes on disk, header included
    base_offset: int
    timestamp_ms: int
    records: list[tuple[bytes, bytes | None]]  # empty when read with parse=False
    count: int  # number of records

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


def _encode_batch(
    base_offset: int, timestamp_ms: int, records: Sequence[tuple[bytes, bytes | None]]
) -> bytes:
    pack_u32 = _U32.pack
    pack_i32 = _I32.pack
    parts: list[bytes] = [b"", _FIXED.pack(base_offset, timestamp_ms, len(records))]
    append = parts.append
    for key, value in records:
        if not isinstance(key, bytes | bytearray):
            raise TypeError(f"record key must be bytes, got {type(key).__name__}")
        append(pack_u32(len(key)))
        append(key)
        if value is None:
            append(_TOMBSTONE_LEN)
        else:
            if not isinstance(value, bytes | bytearray):
                raise TypeError(f"record value must be bytes or None, got {type(value).__name__}")
            append(pack_i32(len(value)))
            append(value)
    body = b"".join(parts)
    return _PREFIX.pack(MAGIC, len(body), crc32c.crc32c(body)) + body


def _parse_records(body: bytes, count: int) -> list[tuple[bytes, bytes | None]]:
    end = len(body)
    if count * MIN_RECORD_SIZE > end - MIN_LENGTH:
        raise _Invalid(Corruption.BAD_FRAMING, f"{count} records cannot fit in {end - MIN_LENGTH} bytes")
    unpack_u32 = _U32.unpack_from
    unpack_i32 = _I32.unpack_from
    pos = MIN_LENGTH
    records: list[tuple[bytes, bytes | None]] = []
    append = records.append
    for i in range(count):
        if end - pos < MIN_RECORD_SIZE:
            raise _Invalid(Corruption.BAD_FRAMING, f"record {i} starts past the end of the batch")
        (key_len,) = unpack_u32(body, pos)
        start = pos + 4
        key_end = start + key_len
        if key_end > end - 4:
            raise _Invalid(Corruption.BAD_FRAMING, f"record {i}: key length {key_len} overruns the batch")
        (value_len,) = unpack_i32(body, key_end)
        pos = key_end + 4
        if value_len == -1:
            append((body[start:key_end], None))
        elif value_len < 0 or value_len > end - pos:
            raise _Invalid(Corruption.BAD_FRAMING, f"record {i}: bad value length {value_len}")
        else:
            value_end = pos + value_len
            append((body[start:key_end], body[pos:value_end]))
            pos = value_end
    if pos != end:
        raise _Invalid(Corruption.BAD_FRAMING, f"{end - pos} trailing bytes after {count} records")
    return records


def _check_records(body: bytes, count: int) -> None:
    """What :func:`_parse_records` checks (same errors), without building the records."""
    end = len(body)
    if count * MIN_RECORD_SIZE > end - MIN_LENGTH:
        raise _Invalid(Corruption.BAD_FRAMING, f"{count} records cannot fit in {end - MIN_LENGTH} bytes")
    unpack_u32 = _U32.unpack_from
    unpack_i32 = _I32.unpack_from
    pos = MIN_LENGTH
    for i in range(count):
        if end - pos < MIN_RECORD_SIZE:
            raise _Invalid(Corruption.BAD_FRAMING, f"record {i} starts past the end of the batch")
        (key_len,) = unpack_u32(body, pos)
        pos += 4 + key_len
        if pos > end - 4:
            raise _Invalid(Corruption.BAD_FRAMING, f"record {i}: key length {key_len} overruns the batch")
        (value_len,) = unpack_i32(body, pos)
        pos += 4
        if value_len != -1:
            if value_len < 0 or value_len > end - pos:
                raise _Invalid(Corruption.BAD_FRAMING, f"record {i}: bad value length {value_len}")
            pos += value_len
    if pos != end:
        raise _Invalid(Corruption.BAD_FRAMING, f"{end - pos} trailing bytes after {count} records")


def _read_batch(f: BinaryIO, position: int, remaining: int, parse: bool = True) -> _Batch | None:
    """Read the batch at the current position of ``f``; None at a clean end; _Invalid if bad.
    ``parse=False``: check the records but do not build them (``records`` is left empty)."""
    if remaining <= 0:
        return None
    if remaining < PREFIX_SIZE:
        raise _Invalid(Corruption.TORN_HEADER, f"{remaining} trailing bytes, less than a batch header")
    prefix = f.read(PREFIX_SIZE)
    if len(prefix) < PREFIX_SIZE:
        raise _Invalid(Corruption.TORN_HEADER, "file ended inside a batch header")
    magic, length, crc = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise _Invalid(Corruption.BAD_MAGIC, f"magic byte {magic}, expected {MAGIC}")
    if length < MIN_LENGTH or length > MAX_BATCH_LENGTH:
        raise _Invalid(Corruption.BAD_LENGTH, f"batch length {length} out of range")
    if length > remaining - PREFIX_SIZE:
        raise _Invalid(
            Corruption.TORN_BATCH,
            f"batch of {length} bytes but only {remaining - PREFIX_SIZE} left in the file",
        )
    body = f.read(length)
    if len(body) < length:
        raise _Invalid(Corruption.TORN_BATCH, "file ended inside a batch")
    actual = crc32c.crc32c(body)
    if actual != crc:
        raise _Invalid(Corruption.CRC_MISMATCH, f"crc mismatch: stored {crc:#010x}, computed {actual:#010x}")
    base_offset, timestamp_ms, count = _FIXED.unpack_from(body)
    if base_offset + count > MAX_OFFSET:
        raise _Invalid(Corruption.BAD_OFFSET, f"base offset {base_offset} out of range")
    if parse:
        records = _parse_records(body, count)
    else:
        _check_records(body, count)
        records = []
    return _Batch(position, PREFIX_SIZE + length, base_offset, timestamp_ms, records, count)


def _iter_batches(f: BinaryIO, limit: int, path: Path) -> Iterator[_Batch]:
    """The batches of an already validated segment, up to byte ``limit``."""
    position = 0
    while True:
        try:
            batch = _read_batch(f, position, limit - position)
        except _Invalid as exc:
            raise CorruptLogError(f"{path} at byte {position}: {exc.detail}") from None
        if batch is None:
            return
        position += batch.size
        yield batch


@dataclass(slots=True)
class _Scan:
    valid_size: int
    next_offset: int
    batches: int
    records: int
    error: _Invalid | None
    error_offset: int  # the offset expected at the error (= next_offset)


def _scan_segment(
    path: Path, base_offset: int, end_limit: int | None = None, sink: RecordSink | None = None
) -> _Scan:
    """Check the batches of ``path`` up to the first invalid one. ``sink``: called with the
    records of each valid batch, in order (see :meth:`PartitionLog.open`)."""
    size = os.path.getsize(path)
    expected = base_offset
    batches = records = position = 0
    parse = sink is not None
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        while True:
            try:
                batch = _read_batch(f, position, size - position, parse=parse)
                if batch is not None and batch.base_offset < expected:
                    raise _Invalid(
                        Corruption.BAD_OFFSET,
                        f"batch base offset {batch.base_offset} below the expected {expected}",
                    )
                if batch is not None and end_limit is not None and batch.next_offset > end_limit:
                    raise _Invalid(Corruption.BAD_OFFSET, f"offset {batch.next_offset - 1} >= {end_limit}")
            except _Invalid as exc:
                return _Scan(position, expected, batches, records, exc, expected)
            if batch is None:
                return _Scan(position, expected, batches, records, None, expected)
            if sink is not None:
                sink(batch.records)
            expected = batch.next_offset
            position += batch.size
            batches += 1
            records += batch.count


# -- file system helpers ------------------------------------------------------------------------


def _timestamp() -> str:
    ns = time.time_ns()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 1_000_000_000)) + f".{ns % 1_000_000_000:09d}Z"


def _unique(directory: Path, stem: str) -> Path:
    path = directory / stem
    n = 1
    while path.exists():
        path = directory / f"{stem}-{n}"
        n += 1
    return path


def _unlink_missing_ok(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Segment:
    __slots__ = ("base_offset", "path", "size")

    def __init__(self, base_offset: int, path: Path, size: int) -> None:
        self.base_offset = base_offset
        self.path = path
        self.size = size  # bytes of valid batches; the active one grows after each append

    def __repr__(self) -> str:
        return f"_Segment({self.path.name}, {self.size} bytes)"


# -- the log ------------------------------------------------------------------------------------


class PartitionLog:
    """An append-only, compacted log of one partition. Build it with :meth:`open`."""

    def __init__(
        self,
        directory: Path,
        segments: list[_Segment],
        next_offset: int,
        *,
        segment_bytes: int,
        max_batch_bytes: int,
        write_fn: WriteFn,
        fsync_fn: FsyncFn,
    ) -> None:
        self._dir = directory
        self._segments = segments
        self._next_offset = next_offset
        self._segment_bytes = segment_bytes
        self._max_batch_bytes = max_batch_bytes
        self._write_fn = write_fn
        self._fsync_fn = fsync_fn
        self._lock = threading.Lock()  # guards _segments, _fd swaps and _durable
        self._compact_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._failed: str | None = None
        self._dir_dirty = False
        self._cut_unsynced = False  # a rollback cut whose fsync failed (see _rollback_unsynced)
        self._fd = self._open_active(segments[-1].path)
        self._durable = (next_offset, segments[-1].size)  # (offset, active size) known on disk
        self._compaction_hook: Callable[[str], None] | None = None  # tests: simulate crashes

    # -- opening and recovery ---------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        write_fn: WriteFn = os.write,
        fsync_fn: FsyncFn = os.fsync,
        sink: RecordSink | None = None,
        recovery_point: int = 0,
    ) -> tuple[PartitionLog, RecoveryReport]:
        """Open (creating if needed) the log in ``directory``, recovering it first.

        ``write_fn(fd, data) -> written`` and ``fsync_fn(fd)`` default to ``os.write`` and
        ``os.fsync``; tests inject failing ones (the file system underneath stays real).
        Raises only OSError for real I/O problems, never because of the files' content.

        ``sink``, if given, is called with the (key, value) records of every batch recovery
        finds valid, in log order, as recovery reads them: exactly the records the log holds
        once open() returns (recovery cuts the log at its first invalid batch and never passes
        that batch or anything after it). A load replays them there and then, and so reads the
        log once instead of twice (open(), then :meth:`read_batches`); see
        :class:`coordinator.runtime.serde.BulkLoader`. What the sink raises propagates: the log
        is not opened, and recovery has changed nothing on disk yet but what it always does
        first (finish committed compactions, remove unfinished ones).

        ``recovery_point``: the log is known to have held every record below this offset (see
        :mod:`coordinator.runtime.datadir`). If the directory is missing, or the log would end
        below it (a missing segment, a gap, an invalid batch below it, or simply fewer records),
        :class:`BehindRecoveryPoint` is raised before anything is cut, moved or created (only
        committed compactions are finished and unfinished ones removed, as always).
        """
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be > 0, got {segment_bytes}")
        min_batch = HEADER_SIZE + MIN_RECORD_SIZE
        if not min_batch <= max_batch_bytes <= MAX_BATCH_LENGTH + PREFIX_SIZE:
            raise ValueError(
                f"max_batch_bytes must be in [{min_batch}, {MAX_BATCH_LENGTH + PREFIX_SIZE}], "
                f"got {max_batch_bytes}"
            )
        path = Path(directory)
        if recovery_point > 0 and not path.is_dir():
            raise BehindRecoveryPoint(path, recovery_point, 0, "the partition directory is missing")
        path.mkdir(parents=True, exist_ok=True)
        report = RecoveryReport(directory=str(path))
        segments, next_offset = _recover(path, report, fsync_fn, sink, recovery_point)
        self = cls(
            path,
            segments,
            next_offset,
            segment_bytes=segment_bytes,
            max_batch_bytes=max_batch_bytes,
            write_fn=write_fn,
            fsync_fn=fsync_fn,
        )
        try:
            fsync_fn(self._fd)  # whatever the page cache held before a crash is now durable
            _fsync_dir(path, fsync_fn)
        except BaseException:
            os.close(self._fd)
            raise
        report.segments = len(segments)
        report.next_offset = next_offset
        return self, report

    def _open_active(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC, 0o644)

    # -- properties -------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def next_offset(self) -> int:
        """Offset the next appended record gets."""
        return self._next_offset

    @property
    def durable_offset(self) -> int:
        """Every record below this offset is fsynced (sync(), a roll, or open())."""
        return self._durable[0]

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def segments(self) -> list[SegmentInfo]:
        with self._lock:
            return [SegmentInfo(s.base_offset, s.path, s.size) for s in self._segments]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failed(self) -> str | None:
        """Why the log needs a reopen, or None."""
        return self._failed

    # -- writing ----------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._closed:
            raise ValueError(f"partition log {self._dir} is closed")
        if self._failed is not None:
            raise LogFailedError(errno.EIO, f"partition log {self._dir} failed ({self._failed}); reopen it")

    def _fail(self, reason: str) -> None:
        self._failed = reason
        log.error("partition log %s failed: %s", self._dir, reason)

    def append(self, records: Sequence[tuple[bytes, bytes | None]], timestamp_ms: int | None = None) -> int:
        """Write ``records`` as ONE batch; return the offset of the last one.

        ``records`` are (key bytes, value bytes or None for a tombstone), e.g. from
        :func:`coordinator.runtime.serde.encode_record`. ``timestamp_ms`` is the append time
        (the runtime's clock; defaults to the wall clock): compaction ages tombstones with it.
        The batch is in the OS page cache when this returns, not yet fsynced (see :meth:`sync`).
        Raises BatchTooLarge (nothing written) or OSError (see the module doc).
        """
        self._check_writable()
        if not records:
            raise ValueError("append needs at least one record")
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        if not 0 <= timestamp_ms <= _MAX_TIMESTAMP:
            raise ValueError(f"timestamp_ms {timestamp_ms} out of range")
        base = self._next_offset
        if base + len(records) > MAX_OFFSET:
            raise ValueError("log offsets exhausted")
        batch = _encode_batch(base, timestamp_ms, records)
        if len(batch) > self._max_batch_bytes:
            raise BatchTooLarge(len(batch), self._max_batch_bytes)
        active = self._segments[-1]
        if active.size > 0 and active.size + len(batch) > self._segment_bytes:
            self._roll()
            active = self._segments[-1]
        before = active.size
        view = memoryview(batch)
        written = 0
        try:
            while written < len(batch):
                n = self._write_fn(self._fd, view[written:])
                if n <= 0:
                    raise OSError(errno.EIO, f"write returned {n}")
                written += n
        except BaseException:
            self._undo_write(before)
            raise
        active.size = before + len(batch)
        self._next_offset = base + len(records)
        return self._next_offset - 1

    def _undo_write(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            self._fail(f"cannot truncate {self._segments[-1].path.name} back to {size} bytes: {exc}")

    def _roll(self) -> None:
        old = self._segments[-1]
        try:  # closed segments are always durable, directory entry included
            self._fsync_fn(self._fd)
            if self._dir_dirty:
                _fsync_dir(self._dir, self._fsync_fn)
                self._dir_dirty = False
        except OSError:
            self._rollback_unsynced()
            raise
        self._cut_unsynced = False  # the old segment, cut included, is durable now
        with self._lock:
            self._durable = (self._next_offset, old.size)
        base = self._next_offset
        path = self._dir / segment_name(base)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        except FileExistsError:
            if os.path.getsize(path) != 0:
                raise
            fd = self._open_active(path)  # an empty file left by an earlier failed roll
        segment = _Segment(base, path, 0)
        with self._lock:
            self._segments.append(segment)
            old_fd, self._fd = self._fd, fd
            self._durable = (base, 0)
        self._dir_dirty = True
        os.close(old_fd)

    def roll(self) -> bool:
        """Close the active segment now (fsynced, like a size roll) and start a new one, so that
        compaction, which never touches the active segment, can rewrite what it holds. Writer
        thread only (like append). Returns False when the active segment is empty (nothing to
        roll). The runtime rolls when a compaction found the active segment mostly superseded
        (:meth:`CompactionReport.active_mostly_garbage`), so the log, and the time to replay it,
        follows the live state rather than the number of writes."""
        self._check_writable()
        if self._segments[-1].size == 0:
            return False
        self._roll()
        return True

    def sync(self) -> None:
        """fsync the active segment (and the directory after a roll): everything appended so far
        becomes durable. On OSError the log is truncated back to :attr:`durable_offset` (see the
        module doc) and the error re-raised."""
        self._check_writable()
        active = self._segments[-1]
        if self._durable[0] == self._next_offset and not self._dir_dirty and not self._cut_unsynced:
            return
        try:
            self._fsync_fn(self._fd)
            if self._dir_dirty:
                _fsync_dir(self._dir, self._fsync_fn)
                self._dir_dirty = False
        except OSError:
            self._rollback_unsynced()
            raise
        self._cut_unsynced = False
        with self._lock:
            self._durable = (self._next_offset, active.size)

    def _rollback_unsynced(self) -> None:
        offset, size = self._durable
        active = self._segments[-1]
        if active.size == size and self._next_offset == offset:
            return
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            self._fail(f"cannot truncate {active.path.name} back to its durable size {size}: {exc}")
            return
        # FIX (tests/test_crash_safety.py): the fsync of the cut used to sit in the try above, so
        # an fsync failure that lasts a moment (the one that made sync() fail is usually still
        # there when the cut is fsynced right after) marked the log *failed* for good: every later
        # append raised LogFailedError and, since the runtime never reopens a log, the partition
        # answered COORDINATOR_NOT_AVAILABLE to every write until the daemon was restarted.
        # Once ftruncate succeeded the file's end is known (appends go there, O_APPEND), so the
        # log stays usable; only the cut is not yet durable: the next successful sync() fsyncs
        # the file (size included) before anything is acknowledged, even with nothing appended
        # (``_cut_unsynced``). Until then a crash may bring the cut batches back, which is
        # allowed: they were never acknowledged (their requests got COORDINATOR_NOT_AVAILABLE).
        active.size = size
        self._next_offset = offset
        try:
            self._fsync_fn(self._fd)
        except OSError as exc:
            self._cut_unsynced = True
            log.warning("%s: fsync after cutting %s back to %d bytes failed (%s); the next sync "
                        "retries it", self._dir, active.path.name, size, exc)

    def close(self) -> None:
        """Close the log (no fsync: call sync() first for a clean shutdown). A compaction running
        in another thread is stopped first (it abandons its unfinished output)."""
        if self._closed:
            return
        self._stop.set()
        with self._compact_lock, self._lock:
            if not self._closed:
                os.close(self._fd)
                self._closed = True

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------------------------

    def _snapshot(self) -> list[tuple[_Segment, int, BinaryIO]]:
        with self._lock:
            if self._closed:
                raise ValueError(f"partition log {self._dir} is closed")
            opened: list[tuple[_Segment, int, BinaryIO]] = []
            try:
                for segment in self._segments:
                    f = open(segment.path, "rb", buffering=_READ_BUFFER)  # noqa: SIM115
                    opened.append((segment, segment.size, f))
            except BaseException:
                for _, _, f in opened:
                    f.close()
                raise
            return opened

    def read(self, from_offset: int = 0) -> Iterator[tuple[int, bytes, bytes | None]]:
        """(offset, key bytes, value bytes or None) of every record at or after ``from_offset``,
        in log order, as of this call (later appends are not included). Files are opened now, so
        a concurrent compaction does not disturb the iteration."""
        return self._read(self._snapshot(), from_offset)

    @staticmethod
    def _read(
        opened: list[tuple[_Segment, int, BinaryIO]], from_offset: int
    ) -> Iterator[tuple[int, bytes, bytes | None]]:
        try:
            for i, (segment, limit, f) in enumerate(opened):
                if i + 1 < len(opened) and opened[i + 1][0].base_offset <= from_offset:
                    continue
                for batch in _iter_batches(f, limit, segment.path):
                    if batch.next_offset <= from_offset:
                        continue
                    offset = batch.base_offset
                    for key, value in batch.records:
                        if offset >= from_offset:
                            yield offset, key, value
                        offset += 1
        finally:
            for _, _, f in opened:
                f.close()

    def read_batches(self) -> Iterator[list[tuple[bytes, bytes | None]]]:
        """The (key bytes, value bytes or None) of every record, one list per batch, in log
        order, as of this call: :meth:`read` from offset 0 without the offsets, for a bulk load
        (:func:`coordinator.runtime.serde.replay_log`)."""
        return self._read_batches(self._snapshot())

    @staticmethod
    def _read_batches(
        opened: list[tuple[_Segment, int, BinaryIO]],
    ) -> Iterator[list[tuple[bytes, bytes | None]]]:
        try:
            for segment, limit, f in opened:
                for batch in _iter_batches(f, limit, segment.path):
                    yield batch.records
        finally:
            for _, _, f in opened:
                f.close()

    def read_records(self, from_offset: int = 0) -> Iterator[tuple[int, Record]]:
        """Like :meth:`read`, decoded. Records of an unknown type are skipped with a warning (as
        Kafka's loader does, for downgrades); a malformed one raises serde.CorruptRecord."""
        warned: set[tuple[int, int]] = set()
        for offset, key, value in self.read(from_offset):
            try:
                record = serde.decode_record(key, value)
            except serde.UnknownRecordType as exc:
                if (exc.record_type, exc.version) not in warned:
                    warned.add((exc.record_type, exc.version))
                    log.warning("%s: skipping %s at offset %d (and any later ones)", self._dir, exc, offset)
                continue
            yield offset, record

    # -- compaction -------------------------------------------------------------------------------

    def compact(self, now_ms: int, tombstone_grace_ms: int) -> CompactionReport:
        """Rewrite the closed segments keeping the latest record per key; drop tombstones whose
        batch is at least ``tombstone_grace_ms`` old at ``now_ms``. Safe to call from a worker
        thread while another thread appends. See the module doc."""
        if tombstone_grace_ms < 0:
            raise ValueError(f"tombstone_grace_ms must be >= 0, got {tombstone_grace_ms}")
        started = time.monotonic()
        with self._compact_lock:
            if self._closed:
                raise ValueError(f"partition log {self._dir} is closed")
            report = CompactionReport()
            self._compact(now_ms, tombstone_grace_ms, report)
            report.duration_s = time.monotonic() - started
            return report

    def _compact(self, now_ms: int, grace_ms: int, report: CompactionReport) -> None:
        with self._lock:
            if self._closed:
                raise ValueError(f"partition log {self._dir} is closed")
            segments = list(self._segments)
            durable_size = self._durable[1]
        closed = segments[:-1]
        n_closed = len(closed)
        report.segments_in = report.segments_out = n_closed
        report.bytes_in = report.bytes_out = sum(s.size for s in closed)
        report.active_bytes = durable_size

        # Pass 1: the latest durable record of every key, and what each closed segment would lose.
        # key -> (offset, segment index, record bytes, tombstone batch timestamp or -1)
        latest: dict[bytes, tuple[int, int, int, int]] = {}
        dropped_bytes = [0] * n_closed
        dropped_count = [0] * n_closed
        record_bytes = [0] * n_closed
        record_count = [0] * n_closed
        for index, segment in enumerate(segments):
            limit = segment.size if index < n_closed else durable_size
            with open(segment.path, "rb", buffering=_READ_BUFFER) as f:
                for batch in _iter_batches(f, limit, segment.path):
                    if self._stop.is_set():
                        report.aborted = True
                        return
                    offset = batch.base_offset
                    stamp = batch.timestamp_ms
                    for key, value in batch.records:
                        previous = latest.get(key)
                        if previous is not None:
                            if previous[1] < n_closed:
                                dropped_bytes[previous[1]] += previous[2]
                                dropped_count[previous[1]] += 1
                            else:  # superseded inside the active segment
                                report.active_dirty_bytes += previous[2]
                        size = MIN_RECORD_SIZE + len(key) + (0 if value is None else len(value))
                        latest[key] = (offset, index, size, -1 if value is not None else stamp)
                        if index < n_closed:
                            record_bytes[index] += size
                            record_count[index] += 1
                        offset += 1
        if not closed:  # (pass 1 still measured the active segment's garbage)
            return
        for _, index, size, stamp in latest.values():
            if index < n_closed and stamp >= 0:
                if now_ms - stamp >= grace_ms:
                    dropped_bytes[index] += size
                    dropped_count[index] += 1
                else:
                    report.tombstones_retained += 1

        # Group consecutive closed segments into outputs of at most segment_bytes (estimated).
        groups: list[list[int]] = []
        current: list[int] = []
        estimate = 0
        for index, segment in enumerate(closed):
            # at worst every surviving record becomes a batch of its own
            kept = record_count[index] - dropped_count[index]
            size = min(
                segment.size - dropped_bytes[index],
                record_bytes[index] - dropped_bytes[index] + HEADER_SIZE * kept,
            )
            if current and estimate + size > self._segment_bytes:
                groups.append(current)
                current, estimate = [], 0
            current.append(index)
            estimate += size
        groups.append(current)

        def keep(key: bytes, value: bytes | None, offset: int, stamp: int) -> bool:
            if latest[key][0] != offset:
                report.superseded_dropped += 1
                return False
            if value is None and now_ms - stamp >= grace_ms:
                report.tombstones_dropped += 1
                return False
            return True

        # Pass 2: rewrite, committing outputs in ascending order.
        report.records_in = sum(record_count)
        records_out = report.records_in
        for group in groups:
            if len(group) == 1 and dropped_bytes[group[0]] == 0:
                continue
            group_segments = [closed[i] for i in group]
            end = segments[group[-1] + 1].base_offset
            kept = self._write_compacted(group_segments, end, keep, report)
            if kept is None:
                report.aborted = True
                break
            size_out, records_kept, records_read = kept
            records_out += records_kept - records_read
            report.segments_rewritten += len(group)
        report.records_out = records_out
        with self._lock:
            current_closed = [s for s in self._segments if s.base_offset < segments[-1].base_offset]
        report.segments_out = len(current_closed)
        report.bytes_out = sum(s.size for s in current_closed)

    def _write_compacted(
        self,
        group: list[_Segment],
        end: int,
        keep: Callable[[bytes, bytes | None, int, int], bool],
        report: CompactionReport,
    ) -> tuple[int, int, int] | None:
        base = group[0].base_offset
        cleaned = self._dir / f"{segment_name(base)}.cleaned"
        kept_records = read_records = 0
        written_next = base  # next offset after what was written so far
        stamp = 0
        try:
            with open(cleaned, "wb", buffering=_READ_BUFFER) as out:

                def flush(run_base: int, run: list[tuple[bytes, bytes | None]]) -> None:
                    nonlocal kept_records, written_next
                    out.write(_encode_batch(run_base, stamp, run))
                    kept_records += len(run)
                    written_next = run_base + len(run)

                for segment in group:
                    with open(segment.path, "rb", buffering=_READ_BUFFER) as f:
                        for batch in _iter_batches(f, segment.size, segment.path):
                            if self._stop.is_set():
                                raise _Abort
                            stamp = batch.timestamp_ms
                            run: list[tuple[bytes, bytes | None]] = []
                            run_base = offset = batch.base_offset
                            for key, value in batch.records:
                                read_records += 1
                                if keep(key, value, offset, stamp):
                                    if not run:
                                        run_base = offset
                                    run.append((key, value))
                                elif run:
                                    flush(run_base, run)
                                    run = []
                                offset += 1
                            if run:
                                flush(run_base, run)
                if written_next != end:  # end marker: the segment still covers [base, end)
                    out.write(_encode_batch(end, stamp, ()))
                out.flush()
                self._fsync_fn(out.fileno())
                size_out = out.tell()
        except _Abort:
            _unlink_missing_ok(cleaned)
            return None
        except OSError:
            _unlink_missing_ok(cleaned)
            raise
        self._hook("cleaned")
        swap = self._dir / f"{base:020d}-{end:020d}.swap"
        try:
            os.replace(cleaned, swap)
            _fsync_dir(self._dir, self._fsync_fn)
        except OSError:
            try:  # not known to be committed: go back to the old segments
                _unlink_missing_ok(cleaned)
                _unlink_missing_ok(swap)
            except OSError as exc:
                self._fail(f"cannot remove compaction output {swap.name} ({exc}); open() will finish it")
            raise
        self._hook("swap")  # committed: open() would finish the swap from here on
        with self._lock:
            start = next(i for i, s in enumerate(self._segments) if s is group[0])
            assert self._segments[start : start + len(group)] == group
            try:
                _finish_swap(swap, base, [s.path for s in group], self._hook)
            except OSError as exc:
                self._fail(f"compaction swap {swap.name} half done ({exc}); open() will finish it")
                raise
            self._segments[start : start + len(group)] = [
                _Segment(base, self._dir / segment_name(base), size_out)
            ]
        _fsync_dir(self._dir, self._fsync_fn)
        self._hook("installed")
        return size_out, kept_records, read_records

    def _hook(self, step: str) -> None:
        if self._compaction_hook is not None:
            self._compaction_hook(step)


class _Abort(Exception):
    pass


def _fsync_dir(directory: Path, fsync_fn: FsyncFn) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
    try:
        fsync_fn(fd)
    finally:
        os.close(fd)


def _finish_swap(
    swap: Path, base: int, old_segments: list[Path], hook: Callable[[str], None] | None = None
) -> None:
    """Replace ``old_segments`` (ascending) by the swap file: delete all but the first, in
    ascending order, then rename the swap over the first. Idempotent: open() redoes it."""
    target = swap.parent / segment_name(base)
    for path in old_segments:
        if path != target:
            _unlink_missing_ok(path)
            if hook is not None:
                hook("unlinked")
    os.replace(swap, target)


def _list(directory: Path, pattern: re.Pattern[str]) -> list[tuple[re.Match[str], Path]]:
    found = []
    for entry in os.scandir(directory):
        match = pattern.match(entry.name)
        if match and entry.is_file(follow_symlinks=False):
            found.append((match, Path(entry.path)))
    return sorted(found, key=lambda m: m[1].name)


def _move_to_corrupt(path: Path, corrupt: Path, report: RecoveryReport) -> None:
    corrupt.mkdir(exist_ok=True)
    target = _unique(corrupt, f"{path.name}.{_timestamp()}")
    size = os.path.getsize(path)
    os.rename(path, target)
    report.truncated_bytes += size
    report.corrupt_files.append(str(target.relative_to(corrupt.parent)))


def _recover(
    directory: Path, report: RecoveryReport, fsync_fn: FsyncFn, sink: RecordSink | None = None,
    recovery_point: int = 0,
) -> tuple[list[_Segment], int]:
    corrupt = directory / CORRUPT_DIR
    changed = False

    # 1. Compaction outputs that never reached their commit point.
    for _, path in _list(directory, _CLEANED_RE):
        os.unlink(path)
        report.removed_temp_files.append(path.name)
        changed = True

    # 2. Committed compactions: finish them (after checking the output reads back).
    for match, swap in _list(directory, _SWAP_RE):
        base, end = int(match[1]), int(match[2])
        scan = _scan_segment(swap, base, end_limit=end) if base < end else None
        changed = True
        if scan is None or scan.error is not None or scan.next_offset != end:
            if scan is not None and scan.error is not None:
                detail = scan.error.detail
            else:
                detail = f"does not cover offsets [{base}, {end})"
            corrupt.mkdir(exist_ok=True)
            target = _unique(corrupt, f"{swap.name}.{_timestamp()}")
            os.rename(swap, target)
            report.corrupt_files.append(str(target.relative_to(directory)))
            report.warnings.append(
                f"invalid compaction output {swap.name} ({detail}) moved to {CORRUPT_DIR}/"
            )
            continue
        old = [p for m, p in _list(directory, _SEGMENT_RE) if base <= int(m[1]) < end]
        _finish_swap(swap, base, old)
        report.completed_compactions.append(swap.name)
    if changed:
        _fsync_dir(directory, fsync_fn)

    # 3. Validate the segments; truncate at the first invalid batch.
    found = [(int(m[1]), p) for m, p in _list(directory, _SEGMENT_RE)]
    segments: list[_Segment] = []
    next_offset = 0
    for i, (base, path) in enumerate(found):
        if base != next_offset:  # segments cover the offsets from 0 without gaps or overlaps
            if base < next_offset:
                error = _Invalid(
                    Corruption.BAD_OFFSET,
                    f"segment base offset {base} below the previous segment's end {next_offset}",
                )
            else:
                error = _Invalid(
                    Corruption.OFFSET_GAP,
                    f"offsets [{next_offset}, {base}) are missing before segment {path.name}",
                )
            _check_recovery_point(directory, recovery_point, next_offset, error.detail)
            _truncate(directory, report, found, i, 0, next_offset, error, fsync_fn)
            break
        scan = _scan_segment(path, base, sink=sink)
        report.batches += scan.batches
        report.records += scan.records
        report.valid_bytes += scan.valid_size
        if scan.error is not None:
            if scan.valid_size > 0 or i == 0:  # cut this segment, it stays the last one
                segments.append(_Segment(base, path, scan.valid_size))
                next_offset = scan.next_offset
            _check_recovery_point(directory, recovery_point, next_offset,
                                  f"{scan.error.kind.value} in {path.name}: {scan.error.detail}")
            _truncate(directory, report, found, i, scan.valid_size, next_offset, scan.error, fsync_fn)
            break
        segments.append(_Segment(base, path, scan.valid_size))
        next_offset = scan.next_offset

    if not report.truncated:
        _check_recovery_point(directory, recovery_point, next_offset,
                              f"{len(found)} segment(s), the last one "
                              f"{found[-1][1].name if found else '(none)'} ends there")
    if not segments:
        path = directory / segment_name(0)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | _O_CLOEXEC, 0o644)
        os.close(fd)
        segments.append(_Segment(0, path, 0))
        next_offset = 0
    return segments, next_offset


def _check_recovery_point(directory: Path, recovery_point: int, log_end: int, reason: str) -> None:
    if log_end < recovery_point:
        raise BehindRecoveryPoint(directory, recovery_point, log_end, reason)


def _truncate(
    directory: Path,
    report: RecoveryReport,
    found: list[tuple[int, Path]],
    index: int,
    position: int,
    next_offset: int,
    error: _Invalid,
    fsync_fn: FsyncFn,
) -> None:
    """Cut the log at byte ``position`` of segment ``found[index]``; keep what is cut in corrupt/.

    Later segments are moved out first: if we crash half-way, the bad batch is still there and
    the next open() cuts again, instead of accepting later segments after a shortened one."""
    corrupt = directory / CORRUPT_DIR
    path = found[index][1]
    report.truncated = True
    report.corruption = error.kind
    report.truncated_file = path.name
    report.truncated_position = position
    report.truncated_offset = next_offset
    report.reason = (
        f"{error.kind.value} in {path.name} at byte {position} (offset {next_offset}): {error.detail}"
    )
    # Nothing valid left in it (or it does not start at offset 0): move the file itself.
    whole = position == 0 and (index > 0 or found[index][0] != 0)
    for _, later in reversed(found[index + 1 :]):
        _move_to_corrupt(later, corrupt, report)
    if whole:
        _move_to_corrupt(path, corrupt, report)
    if corrupt.exists():
        _fsync_dir(corrupt, fsync_fn)
    _fsync_dir(directory, fsync_fn)
    if whole:
        return
    size = os.path.getsize(path)
    if size > position:
        corrupt.mkdir(exist_ok=True)
        target = _unique(corrupt, f"{path.name}.cut-at-{position}.{_timestamp()}")
        with open(path, "rb") as src, open(target, "wb") as dst:
            src.seek(position)
            shutil.copyfileobj(src, dst, _READ_BUFFER)
            dst.flush()
            fsync_fn(dst.fileno())
        _fsync_dir(corrupt, fsync_fn)
        report.truncated_bytes += size - position
        report.corrupt_files.append(str(target.relative_to(directory)))
        fd = os.open(path, os.O_WRONLY | _O_CLOEXEC)
        try:
            os.ftruncate(fd, position)
            fsync_fn(fd)
        finally:
            os.close(fd)
