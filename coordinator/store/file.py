"""The file store (``store = "file"``, the default): a partition's records in a local log.

The log itself -- segments, batches with CRCs, recovery that truncates a torn tail, the
recovery point, compaction and rolling -- is :class:`coordinator.runtime.log.PartitionLog`;
this is what the shard sees of it (:class:`coordinator.store.base.PartitionStore`):

* ``load``: open the log (recovery checks every batch and cuts a torn tail; a log that ends
  below the data dir's recovery point fails with ``BehindRecoveryPoint``), each batch replayed
  as recovery reads it, in a worker thread. A reload closes the log first and reopens it.
* ``append``: written to the active segment (the page cache), not yet durable.
* ``commit``: the fsync policy (``log.fsync``): ``always`` syncs before any response is
  released; ``interval:N`` syncs when N ms passed since the last sync; ``never`` leaves it to
  the OS. A failed fsync cuts the log back to its durable offset (:class:`CommitRefused`); a
  log that could not even do that marks itself failed (:attr:`failed`) and the shard reloads.
* compaction: every ``log.compaction.interval.ms`` the closed segments are compacted, and an
  active segment that is mostly superseded records is rolled so it can be compacted too.
* ``close(graceful=True)``: sync, then close. No ownership: one daemon owns its data dir
  (coordinator.runtime.datadir locks it), so nothing here is ever :class:`Deposed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from coordinator import logs
from coordinator.runtime.log import (
    BatchTooLarge,
    CompactionReport,
    FsyncPolicy,
    PartitionLog,
    RecoveryReport,
    partition_dir,
)
from coordinator.store.base import CommitRefused, Feed, PartitionStore, Record, Sink

log = logs.get("coordinator.shard")
T = TypeVar("T")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class FileStore(PartitionStore):
    name = "file"
    reloading = "after a log failure"
    reload_event = "partition log failed: reloading the partition"
    reload_backoff_max_s = 5.0

    def __init__(
        self,
        data_dir: Path,
        partition: int,
        *,
        fsync: FsyncPolicy,
        segment_bytes: int,
        compaction_interval_ms: int,
        tombstone_retention_ms: int,
        roll_min_bytes: int = 1024 * 1024,
        roll_dirty_percent: int = 50,
    ) -> None:
        self.partition = partition
        self.directory = partition_dir(data_dir, partition)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.compaction_interval_ms = compaction_interval_ms
        self.tombstone_retention_ms = tombstone_retention_ms
        self.roll_min_bytes = roll_min_bytes
        self.roll_dirty_percent = roll_dirty_percent
        self.log: PartitionLog | None = None
        self.recovery: RecoveryReport | None = None
        self.recovery_point = 0
        """Every record below this offset was durable (the data dir's checkpoint): a log that
        ends below it fails the load (coordinator.runtime.datadir)."""
        self._last_sync_ms = 0

    # -- loading ----------------------------------------------------------------------------------
    async def load(self, replay: Callable[[Feed], T]) -> T:
        if self.log is not None:  # a reload: the log's end on disk is unknown; reopen it
            with contextlib.suppress(Exception):
                self.log.close()

        def feed(sink: Sink) -> None:
            self.log, self.recovery = PartitionLog.open(
                self.directory, segment_bytes=self.segment_bytes, sink=sink,
                recovery_point=self.recovery_point,
            )

        # Each batch is replayed as recovery reads and checks it: the log is read once.
        return await asyncio.to_thread(replay, feed)

    def repaired(self) -> str | None:
        if self.recovery is not None and not self.recovery.clean:
            return self.recovery.summary()
        return None

    def discard(self) -> None:
        if self.log is not None:
            with contextlib.suppress(Exception):
                self.log.close()
        self.log = None

    # -- writing ----------------------------------------------------------------------------------
    def append(self, records: list[Record], now_ms: int) -> None:
        assert self.log is not None
        self.log.append(records, now_ms)

    async def commit(self) -> bool:
        if self.log is None:
            return False
        now = _now_ms()
        if not (self.fsync.sync_before_release or self.fsync.sync_due(now, self._last_sync_ms)):
            return False
        try:
            await asyncio.to_thread(self.log.sync)
        except Exception as exc:
            # The log cut itself back to its durable offset: the shard undoes every pending result.
            log.error("log fsync failed", partition=self.partition, error=repr(exc))
            raise CommitRefused(f"could not sync the coordinator log: {exc}") from exc
        self._last_sync_ms = now
        return True

    def oversize(self, exc: BatchTooLarge) -> tuple[str, dict[str, Any], str]:
        over = exc.size - exc.limit
        message = (f"the records this request would write take {exc.size:,} bytes, {over:,} "
                   f"bytes over the coordinator log's batch limit of {exc.limit:,} bytes; "
                   "it can never be written")
        return ("refused a write larger than the log's batch limit",
                {"bytes": exc.size, "limit": exc.limit}, message)

    async def close(self, *, graceful: bool) -> None:
        if self.log is None:
            return
        if not graceful:
            self.log.close()
            return
        try:
            self.log.sync()
        finally:
            self.log.close()

    # -- facts ------------------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return self.log.size_bytes if self.log is not None else 0

    @property
    def durable_offset(self) -> int | None:
        if self.log is None or self.log.failed is not None:
            return None
        return self.log.durable_offset

    @property
    def failed(self) -> str | None:
        return self.log.failed if self.log is not None else None

    # -- compaction -------------------------------------------------------------------------------
    def compact(self, now_ms: int) -> CompactionReport:
        assert self.log is not None
        return self.log.compact(now_ms, self.tombstone_retention_ms)

    def should_roll(self, report: CompactionReport) -> bool:
        return report.active_mostly_garbage(self.roll_min_bytes, self.roll_dirty_percent)

    def roll(self) -> bool:
        assert self.log is not None
        return self.log.roll()
