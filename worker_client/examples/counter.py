"""The bundled example of offsets and fencing: a source that counts, a sink that stores the counts.

``CounterConnector`` is a *source-style* connector: it has ``partitions`` source partitions
(``0`` ... ``N-1``), spread over its tasks by ``task_configs``. Each task counts ``1, 2, 3, ...``
in each of its partitions, one number per partition every ``interval.ms``, and keeps its
position as the connector's offsets (``{"partition": 3}`` -> ``{"seq": 41}``, "41 is written"):
a task that starts, on this worker or another one after a move or a crash, resumes from
``await self.context.offset(partition)``, and commits its position with
``await self.context.commit_offsets(...)`` after each write and once more from ``stop()``.

Its output goes to a *sink-style* writer, :class:`SqliteCounts`: one row per number in the table
``counts`` of the SQLite file ``sqlite.file``, written through
:class:`worker_client.fencing.SqliteFence` under the task's ``context.fencing_token``, so a
task that lost its item (its process was frozen, its token is older than the new owner's)
cannot write any more: the fence raises ``StaleTokenError`` and nothing is written.

Delivery is at least once, made exactly once in the table: the write comes first, then the
commit, so a task that dies between the two leaves a row whose offset was not committed; the
next owner writes it again, and the row's key ``(connector, partition, seq)`` makes that an
update, not a duplicate.

Use it as ``connector.class=worker_client.examples.counter:CounterConnector``, e.g.::

    connect-coordinator connectors create --group demo counts --tasks 2 \\
      --config connector.class=worker_client.examples.counter:CounterConnector \\
      --config sqlite.file=/tmp/counts.db --config partitions=4

Config: ``sqlite.file`` (required), ``partitions`` (default 4), ``interval.ms`` (default 100),
``events.file`` (optional: one JSON line per resume, acknowledged commit and refusal, for
tests and demos; nothing a real plugin needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time

from worker_client import FencedError
from worker_client.fencing import SqliteFence, StaleTokenError


class SqliteCounts:
    """The sink: rows ``(connector, partition, seq, token, worker)`` in the table ``counts``,
    each batch written in one transaction fenced by the writer's token on ``resource``.

    SQLite calls block: call :meth:`write` in a thread (``asyncio.to_thread``). Each call opens
    its own connection, so a write still running when its task was cancelled cannot share a
    connection with the next one."""

    def __init__(self, path: str, resource: str) -> None:
        self.path, self.resource = path, resource

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    def create(self) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")  # (several worker processes share the file)
            conn.execute("CREATE TABLE IF NOT EXISTS counts (connector TEXT, partition INTEGER,"
                         " seq INTEGER, token INTEGER, worker TEXT,"
                         " PRIMARY KEY (connector, partition, seq))")
            conn.commit()

    def write(self, token: int, rows: list[tuple[str, int, int, str]]) -> None:
        """Write ``(connector, partition, seq, worker)`` rows with ``token``, or nothing: raises
        ``StaleTokenError`` if a newer holder of the resource has written already."""
        with contextlib.closing(self._connect()) as conn:
            with SqliteFence(conn, self.resource).transaction(token) as cur:
                cur.executemany(
                    "INSERT INTO counts (connector, partition, seq, token, worker)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (connector, partition, seq)"
                    " DO UPDATE SET token = excluded.token, worker = excluded.worker",
                    [(c, p, s, token, w) for c, p, s, w in rows])


def _note(path: str | None, **fields: object) -> None:
    """One JSON line appended to ``events.file`` (one ``write`` on O_APPEND: processes share it)."""
    if path:
        line = json.dumps({"ts": time.time(), "pid": os.getpid(), **fields}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class CounterTask:
    """The source: counts in its partitions, writes each number to the sink, commits its offsets."""

    async def start(self, config: dict[str, str | None]) -> None:
        self.connector = str(config["connector.name"])
        self.worker = str(config["worker.id"])
        self.events = config.get("events.file")
        self.item = f"{self.connector}/{config['task.id']}"
        self.interval = int(config.get("interval.ms") or 100) / 1000
        # Its share of the partitions, from its own task config (CounterConnector.task_configs).
        self.partitions = [int(p) for p in str(config["partitions"]).split(",") if p]
        # One fence per task: its token orders the writes of its successive holders.
        self.sink = SqliteCounts(str(config["sqlite.file"]), self.item)
        await asyncio.to_thread(self.sink.create)
        self.written: dict[int, int] = {}  # partition -> the last seq written (in the sink)
        for p in self.partitions:
            offset = await self.context.offset({"partition": p})
            self.written[p] = 0 if offset is None else int(offset["seq"])
        self._note("resume", positions=self.written)

    async def run(self) -> None:
        while True:
            batch = {p: seq + 1 for p, seq in self.written.items()}
            await asyncio.to_thread(self.write, self.context.fencing_token, batch)
            self.written.update(batch)
            await self.commit()
            await asyncio.sleep(self.interval)

    def write(self, token: int, batch: dict[int, int]) -> None:
        """The batch into the sink (in a thread: it may outlive a cancelled run())."""
        try:
            self.sink.write(token, [(self.connector, p, seq, self.worker) for p, seq in batch.items()])
        except StaleTokenError as exc:
            # Another process holds this task now: this one must not write any more.
            self._note("write-refused", token=token, positions=batch, error=str(exc))
            raise

    async def commit(self) -> None:
        """Commit the position of what is written (durable at the coordinator when it returns)."""
        pairs = [({"partition": p}, {"seq": seq}) for p, seq in self.written.items()]
        try:
            await self.context.commit_offsets(pairs)
        except FencedError as exc:  # not the owner any more: the next one resumes from before
            self._note("commit-refused", positions=dict(self.written), error=exc.name)
            raise
        self._note("commit", positions=dict(self.written))

    async def stop(self) -> None:
        # run() has ended (cancelled, or failed): commit the position of its last write. Refused
        # if this process no longer holds the task: the next holder resumes from the last one.
        if getattr(self, "written", None):
            with contextlib.suppress(FencedError):
                await self.commit()

    def _note(self, event: str, **fields: object) -> None:
        _note(self.events, event=event, item=self.item, worker=self.worker,
              token=fields.pop("token", self.context.fencing_token), **fields)


class CounterConnector:
    """The connector instance: decides each task's share of the partitions."""

    task_class = CounterTask
    type = "source"  # (it commits source offsets: the REST API's connector type)

    async def start(self, config: dict[str, str | None]) -> None:
        self.partitions = int(config.get("partitions") or 4)

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        """Partitions round-robin over at most ``max_tasks`` tasks (no task without work)."""
        tasks = min(max_tasks, self.partitions)
        return [{"partitions": ",".join(str(p) for p in range(t, self.partitions, tasks))}
                for t in range(tasks)]

    async def stop(self) -> None:
        pass

    @staticmethod
    def validate(config: dict[str, str | None]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        if not config.get("sqlite.file"):
            errors["sqlite.file"] = ["is required: the SQLite file the counts are written to"]
        for key, least in (("partitions", 1), ("interval.ms", 0)):
            value = config.get(key)
            if value is not None and not (value.isascii() and value.isdigit() and int(value) >= least):
                errors[key] = [f"must be a whole number, at least {least}, not {value!r}"]
        return errors
