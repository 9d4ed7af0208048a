"""Where a partition's records are kept, behind one interface (:mod:`coordinator.store.base`):
the file log (:mod:`coordinator.store.file`) and etcd (:mod:`coordinator.store.etcd`, which needs
the optional etcd client). The shard (coordinator.runtime.shard) is given one of them.

:func:`partition_store` builds the store of a daemon that serves every partition itself
(``store = "file"``); etcd's stores are built by the cluster node when it acquires a partition
(owning comes first there). A new store is a module here, a branch below and its settings in
coordinator/config.py (docs/architecture.md "Storage: one seam" has a worked outline)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.store.base import PartitionStore

if TYPE_CHECKING:
    from coordinator.config import ServerConfig


def partition_store(config: ServerConfig, partition: int) -> PartitionStore:
    """The store of ``partition`` for a node that serves every partition (not store=etcd)."""
    kind = config["store"]
    if kind == "file":
        from coordinator.store.file import FileStore

        return FileStore(Path(config["data.dir"]), partition, fsync=config.fsync,
                         segment_bytes=config["log.segment.bytes"],
                         compaction_interval_ms=config["log.compaction.interval.ms"],
                         tombstone_retention_ms=config["log.tombstone.retention.ms"],
                         roll_min_bytes=config["log.roll.min.bytes"],
                         roll_dirty_percent=config["log.roll.dirty.percent"])
    raise ValueError(f"store={kind!r} has no per-partition store here (store=etcd: the cluster "
                     "node builds each partition's store when it acquires it)")
