"""A shard whose partition lives in etcd (``store = "etcd"``, issue 12).

Everything a :class:`~coordinator.runtime.shard.Shard` does -- one queue, one consumer, group
commit, write before respond, long-polled heartbeats, timers -- with the partition's records in
an :class:`~coordinator.runtime.etcd_store.EtcdPartitionStore` instead of a file log. The node
(:mod:`coordinator.cluster.node`) acquires the partition's owner key first and builds the shard
with the store; the shard then loads, serves, and on a graceful handover commits, answers what
is parked and releases the owner key.

What changes against the file store:

* **Durability** is etcd's commit (``await store.commit()``) instead of the fsync; its outcomes
  (etcd_store's module doc) map to: :class:`Deposed` -> the partition is lost (every pending
  and queued event answered NOT_COORDINATOR, the shard UNOWNED, the node told);
  :class:`CommitRefused` -> the pending results rolled back, COORDINATOR_NOT_AVAILABLE (as a
  failed fsync); :class:`ReloadRequired` / :class:`OutcomeUnknown` -> the pending events get
  COORDINATOR_NOT_AVAILABLE (their outcome is not guessed) and the partition is reloaded from
  etcd (COORDINATOR_LOAD_IN_PROGRESS meanwhile).
* **Serving needs the lease.** :meth:`serving` is true only while the node's lease is certainly
  valid for more than ``margin_s`` (``NodeLease.remaining()``, counted from the send time of
  the last renewal). Below it the shard answers nothing from its state: requests, the
  steady-heartbeat fast path, committed results and parked heartbeats all get NOT_COORDINATOR,
  so a node frozen or cut off past its lease never answers for a partition another node may
  own by then. Its writes are fenced by etcd anyway (the owner compare).
* No compaction, no segments, no recovery point: etcd holds only the live records.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from connect_wire.errors import ErrorCode
from coordinator import logs
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator, Result
from coordinator.metrics import Metrics
from coordinator.runtime import serde
from coordinator.runtime.etcd_store import (
    CommitRefused,
    Deposed,
    EtcdPartitionStore,
    ReloadRequired,
)
from coordinator.runtime.log import BatchTooLarge, FsyncPolicy
from coordinator.runtime.shard import (
    ACTIVE,
    CLOSED,
    FAILED,
    LOAD_CONTENT_ERRORS,
    LOADING,
    UNOWNED,
    Shard,
    ShardUnavailable,
    _Event,
)

log = logs.get("coordinator.shard")


class EtcdShard(Shard):
    def __init__(
        self,
        partition: int,
        store: EtcdPartitionStore,
        group_config: GroupCoordinatorConfig,
        metrics: Metrics,
        *,
        lease_remaining: Callable[[], float],
        margin_s: float,
        on_lost: Callable[[EtcdShard, str], None] | None = None,
    ) -> None:
        super().__init__(partition, Path(), group_config, metrics, fsync=FsyncPolicy.parse("always"),
                         segment_bytes=1, compaction_interval_ms=1, tombstone_retention_ms=0)
        self.store = store
        self.lease_remaining = lease_remaining
        self.margin_s = margin_s
        self.on_lost = on_lost
        self._reload_reason: str | None = None

    # -- serving ----------------------------------------------------------------------------------
    def serving(self) -> bool:
        return self.lease_remaining() > self.margin_s

    @property
    def durable_offset(self) -> int | None:
        return None  # no recovery-point checkpoint: etcd is the record

    # -- lifecycle --------------------------------------------------------------------------------
    async def load(self) -> None:
        started = time.monotonic()
        try:
            await self._load_from_etcd()
        except Deposed as exc:
            self.lose(f"deposed while loading: {exc}")
            return
        except LOAD_CONTENT_ERRORS as exc:  # what etcd holds cannot be served: fail it here
            self._load_failed(exc)
            return
        except Exception as exc:  # noqa: BLE001 (etcd unreachable...): give it up, retry later
            log.error("loading the partition from etcd failed; releasing it",
                      partition=self.partition, error=repr(exc))
            with contextlib.suppress(Exception):
                await self.store.release()
            self.lose(f"load failed: {exc!r}")
            return
        self.metrics.partition_load_seconds.observe(time.monotonic() - started)
        self.state = ACTIVE
        self._consumer = asyncio.create_task(self._run(), name=f"shard-{self.partition}")
        # Fresh session timeouts, re-armed timers, restarted computations (as Kafka's new
        # coordinator does when it loads a partition).
        self._submit(_Event("write", lambda core, now: core.on_loaded(now), None))
        log.info("partition loaded", partition=self.partition, records=self.loaded_records,
                 groups=len(self.core.state.groups), store="etcd",
                 owner_revision=self.store.owner_revision,
                 seconds=round(time.monotonic() - started, 3))

    async def _load_from_etcd(self, *, again: bool = False) -> None:
        self.core = GroupCoordinator(self.core.config)
        self.loaded_records = 0

        def skip(exc: serde.UnknownRecordType) -> None:
            log.warning("skipping unknown record type", partition=self.partition, error=str(exc))

        records = await (self.store.reload() if again else self.store.load())

        def replay() -> serde.BulkLoader:
            with serde.BulkLoader(self.core.state, on_unknown=skip) as loader:
                if records:
                    loader.add(records)
            return loader

        # The records arrive in one batch after the (paged) read; replayed in a thread so a big
        # partition does not hold the event loop.
        loader = await asyncio.to_thread(replay)
        self.loaded_records = loader.stats.applied
        self.skipped_records += loader.stats.skipped
        self._bytes_gauge.set(self.store.live_bytes)

    async def close(self) -> None:
        """Graceful handover: answer what is queued, commit, answer parked heartbeats, then
        release the owner key so the next owner can load at once."""
        if self.state == ACTIVE:
            await super().close()  # ends with _close_storage: the release
            return
        if self.state in (CLOSED, UNOWNED):
            return
        self.state = CLOSED
        with contextlib.suppress(Exception):
            await self.store.release()

    async def _close_storage(self) -> None:
        try:
            await self.store.commit()
        except Exception as exc:  # noqa: BLE001 (nothing more to answer: log and release)
            log.warning("final commit before handover failed", partition=self.partition,
                        error=repr(exc))
        try:
            released = await self.store.release()
        except Exception as exc:  # noqa: BLE001 (the node's placement round retries it)
            log.warning("releasing the partition failed; the node retries the release",
                        partition=self.partition, error=repr(exc))
            return
        log.info("partition released", partition=self.partition, still_owned=released)

    def lose(self, why: str) -> None:
        """The partition is no longer ours (deposed, lease lost): answer everything
        NOT_COORDINATOR, stop timers and the consumer, tell the node."""
        if self.state == UNOWNED:
            return
        was = self.state
        self.state = UNOWNED
        log.warning("partition lost", partition=self.partition, reason=why, was=was)
        message = f"this node no longer owns partition {self.partition}"
        while not self.queue.empty():
            self._fail_event(self.queue.get_nowait(), ErrorCode.NOT_COORDINATOR, message)
        self._fail_lane(ErrorCode.NOT_COORDINATOR, message)
        for key in list(self._parked):
            self._release_parked(key)  # answered NOT_COORDINATOR (serving() or UNOWNED below)
        self._cancel_timers()
        self.core = GroupCoordinator(self.core.config)
        if self._consumer is not None and self._consumer is not asyncio.current_task():
            self._consumer.cancel()
        self.store.deposed = True
        if self.on_lost is not None:
            self.on_lost(self, why)

    def _answer(self, parked: Any, response: Any) -> None:
        if self.state == UNOWNED and self.heartbeat_error is not None:
            response = self.heartbeat_error(parked.request, ErrorCode.NOT_COORDINATOR,
                                            f"this node no longer owns partition {self.partition}")
        super()._answer(parked, response)

    # -- writing ----------------------------------------------------------------------------------
    def _append(self, records: list[tuple[bytes, bytes | None]], now: int) -> None:
        self.store.append(records, now)

    def _refuse_oversize(self, ev: _Event, exc: BatchTooLarge) -> None:
        # etcd's limits are operations or bytes: the store's own message names the right one.
        now = time.monotonic()
        if now - self._oversize_warned_at >= self.OVERSIZE_WARNING_INTERVAL_S:
            log.warning("refused a write larger than one etcd transaction",
                        partition=self.partition, error=str(exc),
                        refused_since_last_warning=self._oversize_unlogged)
            self._oversize_warned_at = now
            self._oversize_unlogged = 0
        else:
            self._oversize_unlogged += 1
        self._fail_event(ev, ErrorCode.INVALID_REQUEST, f"it can never be written: {exc}")

    async def _make_durable(self, pending: list[tuple[_Event, Result]]) -> bool:
        started = time.monotonic()
        try:
            await self.store.commit()
        except Deposed as exc:
            for ev, result in reversed(pending):
                self.core.rollback(result)
                self._fail_event(ev, ErrorCode.NOT_COORDINATOR,
                                 f"this node no longer owns partition {self.partition}")
            self.lose(f"deposed: {exc}")
            return False
        except CommitRefused as exc:
            log.error("etcd refused a commit", partition=self.partition, error=str(exc))
            self._roll_back(pending, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            f"could not write to etcd: {exc}")
            return False
        except ReloadRequired as exc:
            # The outcome is unknown (or partly applied): never guessed. The clients retry;
            # the state is rebuilt from what etcd holds.
            log.error("etcd commit outcome unknown: reloading the partition",
                      partition=self.partition, error=str(exc))
            self._roll_back(pending, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            f"the outcome of the write is unknown ({exc}); retry")
            self._reload_reason = str(exc)
            return False
        except Exception as exc:  # noqa: BLE001 (e.g. a client bug): treat as unknown outcome
            log.error("etcd commit failed: reloading the partition", partition=self.partition,
                      error=repr(exc))
            self._roll_back(pending, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            f"the outcome of the write is unknown ({exc!r}); retry")
            self._reload_reason = repr(exc)
            return False
        self.metrics.log_fsync_seconds.observe(time.monotonic() - started)
        self._bytes_gauge.set(self.store.live_bytes)
        return True

    def _storage_failed(self) -> bool:
        return self._reload_reason is not None or self.state == UNOWNED

    async def _reload(self) -> None:
        if self.state in (UNOWNED, CLOSED):  # deposed (the consumer ends), or handing over:
            return  # the release follows; the next owner loads what etcd holds
        reason, self._reload_reason = self._reload_reason, None
        log.error("reloading the partition from etcd", partition=self.partition, reason=reason)
        self.metrics.partition_reloads.labels(str(self.partition)).inc()
        self.state = LOADING
        for key in list(self._parked):
            self._release_parked(key)
        self._cancel_timers()
        delay = 0.1
        while True:
            try:
                await self._load_from_etcd(again=True)
                break
            except Deposed as exc:
                self.lose(f"deposed while reloading: {exc}")
                return
            except LOAD_CONTENT_ERRORS as exc:
                self._load_failed(exc)
                while not self.queue.empty():
                    self._fail_event(self.queue.get_nowait(), ErrorCode.NOT_COORDINATOR,
                                     f"partition {self.partition} failed: {self.failure}")
                return
            except Exception as exc:  # noqa: BLE001 (etcd unreachable: retry while we own it)
                log.error("partition reload failed; retrying", partition=self.partition,
                          error=repr(exc), retry_in_s=delay)
            while not self.queue.empty():
                self._fail_event(self.queue.get_nowait(), ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                 f"partition {self.partition} is reloading from etcd")
            if self.state == UNOWNED:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        self.state = ACTIVE
        self._submit(_Event("write", lambda core, now: core.on_loaded(now), None))
        log.info("partition reloaded", partition=self.partition, records=self.loaded_records)

    async def _compact_loop(self) -> None:  # etcd keeps only the live keys
        return

    async def _roll_log(self, ev: _Event) -> None:
        if ev.future is not None and not ev.future.done():
            ev.future.set_result(False)


class UnownedShard:
    """The slot of a partition this node does not own (store=etcd): everything is answered
    NOT_COORDINATOR, and it holds no groups."""

    state = UNOWNED
    durable_offset = None
    recovery_point = 0
    parked_count = 0

    def __init__(self, partition: int, group_config: GroupCoordinatorConfig) -> None:
        self.partition = partition
        self.core = GroupCoordinator(group_config)

    def serving(self) -> bool:
        return False

    def check_available(self) -> None:
        raise ShardUnavailable(ErrorCode.NOT_COORDINATOR,
                               f"this node does not own partition {self.partition}")

    def try_steady_heartbeat(self, req: Any, ctx: Any) -> None:
        return None

    def write(self, fn: Any, error: Any) -> Any:
        self.check_available()

    def read(self, fn: Any) -> Any:
        self.check_available()

    def heartbeat(self, req: Any, ctx: Any, error: Any) -> Any:
        self.check_available()

    def timer_deadlines(self) -> dict[Any, int]:
        return {}

    async def load(self) -> None:
        return

    async def close(self) -> None:
        return


__all__ = ["FAILED", "EtcdShard", "UnownedShard"]
