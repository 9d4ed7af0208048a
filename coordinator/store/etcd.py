"""The etcd store (``store = "etcd"``): a partition's live records in etcd, fenced by ownership.

The etcd side -- the key layout ("records as keys"), the owner key and the fence, the paged
load, bounded transactions, each commit outcome -- is
:class:`coordinator.runtime.etcd_store.EtcdPartitionStore` (its module doc has the design);
this is what the shard sees of it (:class:`coordinator.store.base.PartitionStore`):

* ``load``: read the live records (pages), replay them in a worker thread. The first load
  that fails for a reason other than what etcd holds (etcd out of reach...) releases the owner
  key and raises :class:`GaveUp` (the node's next placement round retries). A reload first
  re-checks ownership and bumps the fence, so a write whose outcome was unknown cannot land
  behind the state it reads.
* ``append``: checks etcd's limits (``max_txn_ops``, ``max_request_bytes``) and buffers.
* ``commit``: one transaction per fitting group of appends, each comparing the owner key's
  create revision and the fence: :class:`Deposed` when they fail; :class:`CommitRefused` when
  etcd definitely refused the first one; :class:`OutcomeUnknown` for a timeout, a lost
  connection or a refusal after an earlier transaction of the same commit applied.
* ``close(graceful=True)``: commit, then delete the owner key so the next owner loads at once.
* no compaction, no recovery point: etcd holds only the live records (its own history is
  compacted by etcd).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from coordinator import logs
from coordinator.runtime import etcd_store
from coordinator.runtime.etcd_store import EtcdPartitionStore
from coordinator.runtime.log import BatchTooLarge
from coordinator.store.base import (
    LOAD_CONTENT_ERRORS,
    CommitRefused,
    Deposed,
    Feed,
    GaveUp,
    OutcomeUnknown,
    PartitionStore,
    Record,
    Sink,
)

log = logs.get("coordinator.shard")
T = TypeVar("T")


class EtcdStore(PartitionStore):
    name = "etcd"
    reloading = "from etcd"
    reload_event = "reloading the partition from etcd"
    reload_backoff_max_s = 2.0

    def __init__(self, etcd: EtcdPartitionStore) -> None:
        self.etcd = etcd
        self.partition = etcd.partition
        self._loaded = False

    @classmethod
    async def acquire(cls, *args: Any, **kwargs: Any) -> EtcdStore:
        """Take the partition's owner key (:meth:`EtcdPartitionStore.acquire`, same
        arguments; raises ``etcd_store.NotOwner`` if another live node holds it)."""
        return cls(await EtcdPartitionStore.acquire(*args, **kwargs))

    # -- loading ----------------------------------------------------------------------------------
    async def load(self, replay: Callable[[Feed], T]) -> T:
        first = not self._loaded
        try:
            records = await (self.etcd.load() if first else self.etcd.reload())

            def feed(sink: Sink) -> None:
                if records:
                    sink(records)

            # The records arrive in one batch after the (paged) read; replayed in a thread so a
            # big partition does not hold the event loop.
            result = await asyncio.to_thread(replay, feed)
        except etcd_store.Deposed as exc:
            raise Deposed(str(exc)) from exc
        except LOAD_CONTENT_ERRORS:  # what etcd holds cannot be served: the shard fails it
            raise
        except Exception as exc:
            if not first:
                raise  # a reload retries while we own the partition
            log.error("loading the partition from etcd failed; releasing it",
                      partition=self.partition, error=repr(exc))
            with contextlib.suppress(Exception):
                await self.etcd.release()
            raise GaveUp(f"load failed: {exc!r}") from exc
        self._loaded = True
        return result

    def describe(self) -> dict[str, Any]:
        return {"store": "etcd", "owner_revision": self.etcd.owner_revision}

    # -- writing ----------------------------------------------------------------------------------
    def append(self, records: list[Record], now_ms: int) -> None:
        self.etcd.append(records, now_ms)

    async def commit(self) -> bool:
        try:
            await self.etcd.commit()
        except etcd_store.Deposed as exc:
            raise Deposed(str(exc)) from exc
        except etcd_store.CommitRefused as exc:
            log.error("etcd refused a commit", partition=self.partition, error=str(exc))
            raise CommitRefused(f"could not write to etcd: {exc}") from exc
        except etcd_store.ReloadRequired as exc:
            # The outcome is unknown (or partly applied): never guessed. The clients retry;
            # the state is rebuilt from what etcd holds.
            log.error("etcd commit outcome unknown: reloading the partition",
                      partition=self.partition, error=str(exc))
            raise OutcomeUnknown(f"the outcome of the write is unknown ({exc}); retry",
                                 str(exc)) from exc
        except Exception as exc:  # e.g. a client bug: treated as an unknown outcome
            log.error("etcd commit failed: reloading the partition", partition=self.partition,
                      error=repr(exc))
            raise OutcomeUnknown(f"the outcome of the write is unknown ({exc!r}); retry",
                                 repr(exc)) from exc
        return True

    def oversize(self, exc: BatchTooLarge) -> tuple[str, dict[str, Any], str]:
        # etcd's limits are operations or bytes: the store's own message names the right one.
        return ("refused a write larger than one etcd transaction", {"error": str(exc)},
                f"it can never be written: {exc}")

    def lost(self) -> None:
        self.etcd.deposed = True

    async def close(self, *, graceful: bool) -> None:
        if not graceful:
            with contextlib.suppress(Exception):
                await self.etcd.release()
            return
        try:
            await self.etcd.commit()
        except Exception as exc:  # noqa: BLE001 (nothing more to answer: log and release)
            log.warning("final commit before handover failed", partition=self.partition,
                        error=repr(exc))
        try:
            released = await self.etcd.release()
        except Exception as exc:  # noqa: BLE001 (the node's placement round retries it)
            log.warning("releasing the partition failed; the node retries the release",
                        partition=self.partition, error=repr(exc))
            return
        log.info("partition released", partition=self.partition, still_owned=released)

    # -- facts ------------------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return self.etcd.live_bytes
