"""The data dir as a whole: its lock and its recovery-point checkpoint.

Lock (``<data dir>/.lock``)
---------------------------
One daemon per data dir, as Kafka locks each log dir: :func:`lock_data_dir` takes an exclusive
``fcntl.flock`` on ``.lock`` (created if missing) without waiting, and writes the holder's pid
into it. The lock lives as long as the descriptor (the process): a daemon that is killed
releases it with its last descriptor, so a stale ``.lock`` file never blocks a restart (the
file stays; only the flock counts). The descriptor is close-on-exec. The daemon takes the lock
before it writes or recovers anything (before the partition-count marker, before any log is
opened) and before it listens. A second daemon gets :class:`DataDirLocked`, whose message names
the data dir and, when the file already holds it, the holder's pid.

flock is advisory and per open file description: it protects against another
``connect-coordinator`` (or anything else that takes it), not against ``rm``; on NFS it may be
emulated (or not) depending on the client: keep the data dir on a local file system.

Recovery point (``<data dir>/recovery-point-offset-checkpoint``)
----------------------------------------------------------------
How far each partition's log is known to have reached, as Kafka's file of the same name::

    0            format version
    8            number of entries
    0 12345      partition, offset: the log of that partition held every record below offset
    1 0
    ...

An entry only ever claims what was durable (fsynced, directory entries included) when the file
was written: the log's ``durable_offset``. A log that, when it is opened, ends below its entry
has lost acknowledged records (a segment or the partition directory deleted, a segment cut or
corrupted below that offset): the partition fails instead of serving the older state (see
:class:`coordinator.runtime.log.BehindRecoveryPoint`). Records written after the last checkpoint
(a torn tail after a crash) are never claimed, so cutting them is not a loss.

The file is replaced atomically (written to ``.tmp``, fsynced, renamed, the directory fsynced):
after a crash it is the old or the new one, never a mix. A missing file (a data dir of an
older version, or deleted by the operator to accept a loss) claims nothing. An unreadable one
is an error: the daemon refuses to start rather than guess.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

__all__ = [
    "CHECKPOINT_FILE",
    "LOCK_FILE",
    "BadCheckpoint",
    "DataDirLock",
    "DataDirLocked",
    "lock_data_dir",
    "read_checkpoint",
    "write_checkpoint",
]

LOCK_FILE = ".lock"
CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
CHECKPOINT_VERSION = 0
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class DataDirLocked(Exception):
    """Another process holds the data dir's lock."""


class BadCheckpoint(ValueError):
    """The recovery-point checkpoint cannot be read."""


class DataDirLock:
    """An exclusive flock on ``<data dir>/.lock``, held until :meth:`release` (or exit)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _holder(fd: int, tries: int = 20) -> str:
    """The pid of the live process holding the lock, read from the lock file; "" if it does not
    show within ~1 s. The holder writes its pid right after locking: until then the file may
    be empty or still hold a dead predecessor's pid, which is not named."""
    for attempt in range(tries):
        try:
            text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        except OSError:
            return ""
        if text.isdigit():
            try:
                os.kill(int(text), 0)
                return text
            except ProcessLookupError:
                pass
            except OSError:
                return text  # alive, another user's
        if attempt + 1 < tries:
            time.sleep(0.05)
    return ""


def lock_data_dir(data_dir: Path) -> DataDirLock:
    """Lock ``data_dir`` (which must exist) for this process, or raise :class:`DataDirLocked`."""
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        try:
            holder = _holder(fd)
        finally:
            os.close(fd)
        who = f"pid {holder}" if holder else "a process that has not written its pid yet"
        raise DataDirLocked(
            f"data dir {data_dir} is in use by another connect-coordinator ({who}; lock file "
            f"{path}): one daemon per data dir") from None
    try:
        # Write first, then cut: the file never reads empty while we hold it.
        data = f"{os.getpid()}\n".encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        os.close(fd)
        raise
    return DataDirLock(path, fd)


def read_checkpoint(data_dir: Path) -> dict[int, int]:
    """partition -> recovery point; empty when there is no checkpoint file."""
    path = data_dir / CHECKPOINT_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise BadCheckpoint(f"cannot read {path}: {exc}") from None
    lines = text.splitlines()
    try:
        if not text.endswith("\n"):  # the writer ends every line: a cut file (e.g. "0 4" of
            raise ValueError("it does not end with a newline: cut short")  # "0 42") is refused
        if int(lines[0]) != CHECKPOINT_VERSION:
            raise BadCheckpoint(f"{path}: unknown format version {lines[0]!r}")
        count = int(lines[1])
        entries = [line.split() for line in lines[2:] if line.strip()]
        if count != len(entries) or any(len(e) != 2 for e in entries):
            raise ValueError("entry count or format")
        points = {int(p): int(o) for p, o in entries}
        if any(p < 0 or o < 0 for p, o in points.items()) or len(points) != count:
            raise ValueError("negative or repeated entry")
    except (IndexError, ValueError) as exc:
        raise BadCheckpoint(
            f"{path} is malformed ({exc}); fix it, or delete it to skip the recovery-point "
            "check once") from None
    return points


def write_checkpoint(data_dir: Path, points: dict[int, int], fsync: bool = True) -> None:
    """Replace the checkpoint atomically (tmp, fsync, rename, fsync of the directory)."""
    path = data_dir / CHECKPOINT_FILE
    tmp = data_dir / f"{CHECKPOINT_FILE}.tmp"
    body = f"{CHECKPOINT_VERSION}\n{len(points)}\n" + "".join(
        f"{p} {o}\n" for p, o in sorted(points.items()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
    try:
        data = body.encode("ascii")
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        dfd = os.open(data_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
