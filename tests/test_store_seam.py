"""The store seam: the one Shard runs on any PartitionStore, here a third one on a SQL database
(sqlite3) written as docs/architecture.md "A third store" outlines it -- records as rows, every
commit one transaction fenced by a compare on the partition's ownership row. Nothing outside
this file changes for it, which is the point of the seam:

* what a shard committed is what a new shard on the same database loads;
* a node whose ownership was taken over (another node bumped the row's epoch) writes nothing:
  its next write is answered NOT_COORDINATOR and the shard gives the partition up, as on etcd.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterConnectorsResponse,
    ConnectGroupDescribeRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.state import CoordinatorState
from coordinator.metrics import Metrics
from coordinator.runtime import serde
from coordinator.runtime.shard import ACTIVE, UNOWNED, Shard
from coordinator.store.base import Deposed, Feed, PartitionStore, Record

pytestmark = pytest.mark.asyncio
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS partition_owner (partition INTEGER PRIMARY KEY, owner TEXT,
                                            epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (partition INTEGER, key BLOB, value BLOB, seq INTEGER,
                                    PRIMARY KEY (partition, key));
"""


class SqlStore(PartitionStore):
    name = "sql"
    reloading = "from the database"

    def __init__(self, db: Path, partition: int, node: str) -> None:
        self.db = sqlite3.connect(db, isolation_level=None)
        self.db.executescript(SCHEMA)
        self.partition = partition
        self.node = node
        self.epoch = self._acquire()
        self._pending: list[list[Record]] = []

    def _acquire(self) -> int:
        # Takes the partition over (a test shortcut: no liveness check of the previous owner).
        db, p = self.db, self.partition
        db.execute("INSERT OR IGNORE INTO partition_owner VALUES (?, NULL, 0)", (p,))
        db.execute("UPDATE partition_owner SET owner = ?, epoch = epoch + 1 WHERE partition = ?",
                   (self.node, p))
        (epoch,) = db.execute("SELECT epoch FROM partition_owner WHERE partition = ?",
                              (p,)).fetchone()
        return int(epoch)

    async def load(self, replay: Callable[[Feed], T]) -> T:
        rows = self.db.execute("SELECT key, value FROM records WHERE partition = ? ORDER BY seq",
                               (self.partition,)).fetchall()
        return replay(lambda sink: sink(rows) if rows else None)

    def append(self, records: list[Record], now_ms: int) -> None:
        self._pending.append(records)

    async def commit(self) -> bool:
        batches, self._pending = self._pending, []
        db, p = self.db, self.partition
        db.execute("BEGIN IMMEDIATE")
        fenced = db.execute("UPDATE partition_owner SET epoch = epoch WHERE partition = ? "
                            "AND owner = ? AND epoch = ?", (p, self.node, self.epoch))
        if fenced.rowcount != 1:
            db.execute("ROLLBACK")
            raise Deposed(f"partition {p}: the ownership row is no longer at epoch {self.epoch}")
        for records in batches:
            for key, value in records:
                if value is None:
                    db.execute("DELETE FROM records WHERE partition = ? AND key = ?", (p, key))
                else:
                    db.execute(
                        "INSERT INTO records VALUES (?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 "
                        "FROM records)) ON CONFLICT (partition, key) DO UPDATE SET "
                        "value = excluded.value, seq = excluded.seq", (p, key, value))
        db.execute("COMMIT")
        return True

    async def close(self, *, graceful: bool) -> None:
        if graceful:
            await self.commit()
        self.db.execute("UPDATE partition_owner SET owner = NULL WHERE partition = ? "
                        "AND owner = ? AND epoch = ?", (self.partition, self.node, self.epoch))
        self.db.close()


def alter(name: str) -> ConnectGroupAlterConnectorsRequest:
    return ConnectGroupAlterConnectorsRequest(
        group_id="g", upserts=(_alter.ConnectorSpec(name=name, task_count=1, config=()),),
        deletes=(), validate_only=False)


def error(code: int, message: str) -> Any:
    return ConnectGroupAlterConnectorsResponse(error_code=code, error_message=message,
                                               group_epoch=-1)


def in_database(db: Path) -> list[str]:
    """The group's connectors as the database holds them (replayed from its rows)."""
    state = CoordinatorState()
    rows = sqlite3.connect(db).execute("SELECT key, value FROM records ORDER BY seq").fetchall()
    for key, value in rows:
        state.replay(serde.decode_record(key, value))
    g = state.groups.get("g")
    return sorted(g.connectors) if g is not None else []


async def write(shard: Shard, name: str) -> Any:
    return await shard.write(lambda core, now: core.alter_connectors(alter(name), now), error)


async def connectors(shard: Shard) -> list[str]:
    resp = await shard.read(
        lambda core: core.describe(ConnectGroupDescribeRequest(group_ids=("g",))))
    return sorted(c.name for c in resp.groups[0].connectors)


async def test_what_a_shard_on_a_sql_store_committed_is_what_the_next_one_loads(
        tmp_path: Path) -> None:
    db = tmp_path / "coordinator.db"
    first = Shard(0, SqlStore(db, 0, "a"), GroupCoordinatorConfig(), Metrics())
    await first.load()
    assert first.state == ACTIVE
    for name in ("x", "y", "z"):
        assert (await write(first, name)).error_code == 0
    await first.close()

    second = Shard(0, SqlStore(db, 0, "b"), GroupCoordinatorConfig(), Metrics())
    await second.load()
    try:
        assert second.state == ACTIVE
        assert await connectors(second) == ["x", "y", "z"]
        assert second.loaded_records > 0
    finally:
        await second.close()


async def test_a_deposed_sql_owner_writes_nothing_and_gives_the_partition_up(
        tmp_path: Path) -> None:
    db = tmp_path / "coordinator.db"
    lost: list[str] = []
    old = Shard(0, SqlStore(db, 0, "a"), GroupCoordinatorConfig(), Metrics(),
                on_lost=lambda shard, why: lost.append(why))
    await old.load()
    assert (await write(old, "kept")).error_code == 0

    new = Shard(0, SqlStore(db, 0, "b"), GroupCoordinatorConfig(), Metrics())  # takes over
    await new.load()
    try:
        resp = await write(old, "lost")
        assert resp.error_code == ErrorCode.NOT_COORDINATOR, resp
        assert old.state == UNOWNED
        assert len(lost) == 1 and "epoch" in lost[0]
        # Nothing of the fenced write reached the database; the new owner serves what it loaded.
        assert in_database(db) == ["kept"]
        assert await connectors(new) == ["kept"]
        assert (await write(new, "next")).error_code == 0
        assert await connectors(new) == ["kept", "next"]
    finally:
        await new.close()
        await old.close()
