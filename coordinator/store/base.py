"""What a shard needs from the place its partition's records are kept: one small interface.

A :class:`~coordinator.runtime.shard.Shard` runs a partition's group coordinator (one queue, one
consumer, group commit, write before respond, timers, long-polled heartbeats) and is given a
:class:`PartitionStore`. It never learns whether the records sit in a local file log or in a
replicated store; it only sees these calls and these outcomes:

``await load(replay)``
    Read the partition's records and hand them to ``replay``, which the store calls once
    (usually in a worker thread) with a *feed*: a function that takes a sink and passes every
    batch of records, in replay order, to it. Returns what ``replay`` returned (the replay's
    counts). Called again after a failure that left the store's content unknown (a reload):
    the store then re-reads what it durably holds.
``append(records, now_ms)``
    Buffer one request's records, atomically (all of them or none), not yet durable. Raises
    :class:`BatchTooLarge` for a batch that can never be written (non-retriable).
``await commit() -> bool``
    Make everything appended so far durable; True if it did work worth timing (an fsync, a
    transaction), False if there was nothing to do or the policy defers it. The outcomes it
    signals are typed: :class:`Deposed`, :class:`CommitRefused`, :class:`OutcomeUnknown`.
``await close(graceful=...)``
    Graceful: after the last commit, make everything durable and give the partition up (a file
    log syncs and closes; etcd commits and releases its owner key). Otherwise just let go.

plus a few read-only facts (``size_bytes`` for the log-size gauge, ``durable_offset`` for the
data dir's recovery-point checkpoint, ``failed`` when the store itself knows it must be
re-read) and optional background compaction (a file log's segments).

How the shard maps each outcome (the clients' view):

=======================  ===================================================================
raised by the store      what the shard does
=======================  ===================================================================
:class:`BatchTooLarge`   the request gets INVALID_REQUEST naming the limit (append only)
:class:`CommitRefused`   nothing of the commit was written: the pending results are rolled
                         back, their requests get COORDINATOR_NOT_AVAILABLE (retriable)
:class:`OutcomeUnknown`  the commit may or may not have been applied: rolled back, answered
                         COORDINATOR_NOT_AVAILABLE, and the partition is reloaded from the
                         store (COORDINATOR_LOAD_IN_PROGRESS meanwhile); never guessed
:class:`Deposed`         another owner holds the partition (a fenced write failed): every
                         pending and queued request gets NOT_COORDINATOR, the shard is
                         UNOWNED and its owner (the cluster node) is told
:class:`GaveUp`          (load only) the store could not load and released the partition so
                         that another owner, or a later round, can take it
=======================  ===================================================================

Anything else raised by ``commit`` is treated as :class:`OutcomeUnknown`; anything else raised
by the first ``load`` fails the partition (served NOT_COORDINATOR, the error logged), unless it
is one of :data:`LOAD_CONTENT_ERRORS`, which always do.

Ownership is not the store's business: the cluster node decides which node serves which
partition and gives the shard a ``serving()`` callable; a store that can be written by several
nodes over time must *fence* its writes (refuse a write from a node that is no longer the
owner, raising :class:`Deposed`), so that a node that lost ownership without knowing it can
never change what the new owner loaded. docs/architecture.md "Storage" has the two stores and
a worked outline of a third.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from coordinator.group.state import ReplayError
from coordinator.runtime import serde
from coordinator.runtime.log import BatchTooLarge, BehindRecoveryPoint

Record = tuple[bytes, bytes | None]
"""One record as the store keeps it: its key bytes and value bytes (None: a tombstone)."""
Sink = Callable[[Sequence[Record]], Any]
"""Takes one batch of records in replay order."""
Feed = Callable[[Sink], None]
"""Passes every record the store holds to the sink it is given."""
T = TypeVar("T")

LOAD_CONTENT_ERRORS = (BehindRecoveryPoint, ReplayError, serde.CorruptRecord)
"""What a load raises because of what the store holds (not an I/O error): the partition is
failed, the corruption counted, and nothing is served rolled back; retrying cannot help."""


class StoreError(Exception):
    """Base class of the outcomes a store signals to its shard."""


class Deposed(StoreError):
    """This node no longer owns the partition: the fenced write wrote nothing; give it up."""


class GaveUp(StoreError):
    """The store could not load the partition and released it (another owner, or a later
    round, takes it)."""


class CommitRefused(StoreError):
    """Nothing of the commit was written and the store is still usable (a failed fsync that
    cut the log back; a definite refusal). ``str()`` is the message the clients get."""


class OutcomeUnknown(StoreError):
    """The commit may or may not have been applied: the partition must be reloaded before it
    is served again. ``str()`` is the clients' message, ``reason`` what is logged."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PartitionStore:
    """One partition's records, written by one shard (its consumer task) at a time.

    Subclasses implement :meth:`load`, :meth:`append`, :meth:`commit` and :meth:`close`; the
    rest have defaults that fit a store without a local recovery point or compaction."""

    name = "store"
    """Shown in logs (``store=...``)."""
    reloading = "from the store"
    """How the message for requests refused during a reload ends ("partition N is reloading
    ...")."""
    reload_event = "reloading the partition"
    """What the shard logs when it reloads the partition after a failure."""
    reload_backoff_max_s = 2.0
    """The longest wait between two reload attempts."""
    compaction_interval_ms: int | None = None
    """How often the shard runs :meth:`compact` (None: never)."""

    async def load(self, replay: Callable[[Feed], T]) -> T:
        raise NotImplementedError

    def append(self, records: list[Record], now_ms: int) -> None:
        raise NotImplementedError

    async def commit(self) -> bool:
        raise NotImplementedError

    async def close(self, *, graceful: bool) -> None:
        raise NotImplementedError

    @property
    def size_bytes(self) -> int:
        """What the partition takes in the store (the log-size gauge)."""
        return 0

    @property
    def durable_offset(self) -> int | None:
        """The offset below which everything is durable, for the data dir's recovery-point
        checkpoint; None when the store keeps no such offset (or is not usable)."""
        return None

    @property
    def failed(self) -> str | None:
        """Why the store must be re-read before the partition is served again, or None."""
        return None

    def repaired(self) -> str | None:
        """After the first load: what recovery had to repair (counted as a corruption and
        logged), or None."""
        return None

    def describe(self) -> dict[str, Any]:
        """Extra fields of the "partition loaded" log line."""
        return {}

    def discard(self) -> None:
        """After a failed load: drop whatever the load left open."""

    def lost(self) -> None:
        """The shard gave the partition up: refuse any further write."""

    def oversize(self, exc: BatchTooLarge) -> tuple[str, dict[str, Any], str]:
        """For a batch that can never be written: the warning logged, its fields, and the
        message the client gets."""
        return ("refused a write larger than the store's batch limit", {"error": str(exc)},
                f"it can never be written: {exc}")

    # -- optional: compaction (a store whose history grows: a log) -----------------------------
    def compact(self, now_ms: int) -> Any:
        """Compact (runs in a worker thread); returns a report for :meth:`should_roll`."""
        raise NotImplementedError

    def should_roll(self, report: Any) -> bool:
        """Whether the part compaction cannot touch (a log's active segment) should be rolled
        so that it can (the roll runs on the shard's consumer, the store's only writer)."""
        return False

    def roll(self) -> bool:
        """Roll (runs in a worker thread, on behalf of the consumer); True if it rolled."""
        return False


__all__ = [
    "LOAD_CONTENT_ERRORS",
    "BatchTooLarge",
    "CommitRefused",
    "Deposed",
    "Feed",
    "GaveUp",
    "OutcomeUnknown",
    "PartitionStore",
    "Record",
    "Sink",
    "StoreError",
]
