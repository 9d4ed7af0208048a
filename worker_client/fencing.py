"""Fencing tokens at the resource: record a task's token and its writes in one transaction.

A task's ``context.fencing_token`` strictly increases across every grant of its item to a
process. The coordinator alone cannot stop a process that froze (GC pause, SIGSTOP, a VM
migration) while it believed it owned the item: when it wakes up, the item may have moved and
its in-flight write would land on top of the new holder's. The resource closes that gap
(Kleppmann's fencing token, Chubby's sequencer): it keeps the highest token it has seen per
resource and refuses a write carrying a lower one. These helpers do that for SQLite and
PostgreSQL::

    from worker_client.fencing import SqliteFence, StaleTokenError

    fence = SqliteFence(conn, "orders-sink")          # creates its table if missing
    try:
        with fence.transaction(self.context.fencing_token) as cur:
            cur.execute("INSERT INTO orders(id, total) VALUES (?, ?)", (order_id, total))
    except StaleTokenError:
        ...  # a newer holder wrote first: this process no longer owns the item; stop writing

    async with AsyncPostgresFence(aconn, "orders-sink").transaction(token) as cur:
        await cur.execute("INSERT INTO orders(id, total) VALUES (%s, %s)", (order_id, total))

``fence.transaction(token)`` is one database transaction: it takes the resource's fence row
first, reads the token recorded there, refuses with :class:`StaleTokenError` (rolled back,
nothing written) if a higher one is recorded, else records ``token``, runs the caller's writes
and commits them together. Any exception rolls all of it back, the token included. An equal
token is accepted: it is the same holder writing again. The fence table (default
``connect_fencing(resource TEXT PRIMARY KEY, token BIGINT)``) is created if missing; one table
serves many resources, one row each. The connection must not be inside a transaction already
(the fence must own the transaction it commits), and the caller must not commit or roll back
inside the block.

Concurrency: why the check cannot be fooled
-------------------------------------------
The check and the writes are safe only if no other writer of the same resource can commit
between them: the fence is *locked first*, then checked, then written, then committed.

- **SQLite**: ``BEGIN IMMEDIATE`` takes the database's write lock before the token is read, so
  writers serialise on it and the token read is the latest committed one (in WAL mode too). A
  deferred ``BEGIN`` (or Python's implicit transaction, which starts only at the first
  INSERT) would read the token outside the write lock: two writers could both pass the check
  and the lower token's writes commit after the higher token's. A writer that finds the lock
  held waits up to the connection's busy timeout (``sqlite3.connect(..., timeout=5.0)`` by
  default) and then raises ``sqlite3.OperationalError: database is locked``, nothing written.
  SQLite has no server that could abort a process frozen *inside* a fenced transaction: it
  keeps the lock, the new holder's writes fail as "locked" for as long as it stays frozen; the
  stale transaction commits *before* the new holder's first write — an order in which it is
  not stale (the new token was not recorded yet), so the invariant holds; its next
  transaction is refused.
- **PostgreSQL**: the first statement (after the timeout below) is ``INSERT ... ON CONFLICT
  (resource) DO UPDATE SET token = EXCLUDED.token WHERE recorded <= EXCLUDED.token``: it
  inserts the row or takes its row lock (held to the end of the transaction) and moves the
  recorded token up in one step (a higher recorded token leaves the row as it is, and the
  fence raises), so two writers of one resource serialise on that row and every check reads
  the latest committed token. Writers of different resources do not wait on each other.
  A process frozen inside a fenced transaction holds that row lock. So that it cannot block
  the new holder for ever, every fenced transaction sets its own session's
  ``idle_in_transaction_session_timeout`` (``idle_in_transaction_timeout``, 10 s by default,
  ``SET LOCAL``: this transaction only): when its process freezes between two statements,
  PostgreSQL terminates that session, rolls its transaction back — none of its
  writes ever land — and the new holder, waiting on the row lock, goes ahead. When the frozen
  process wakes up its commit fails (``psycopg.errors.IdleInTransactionSessionTimeout``, an
  ``OperationalError``; the connection is closed). Correctness does not depend
  on the timeout (without it the stale transaction simply commits first, as with SQLite);
  liveness does. Choose it longer than the longest pause between statements inside a fenced
  transaction, and short next to the item's session timeout.
- **Isolation**: READ COMMITTED (PostgreSQL's default) is all the helper needs, and the best
  fit: the row lock serialises the writers, and every statement after it sees everything the
  previous holder committed, so reads inside the block are current. REPEATABLE READ and
  SERIALIZABLE stay correct but turn the wait into an error: a transaction whose snapshot
  predates another writer's commit to the fence row fails with
  ``psycopg.errors.SerializationFailure`` (rolled back, nothing written; retry it, and a retry
  with a lower token is then refused with :class:`StaleTokenError`).

The PostgreSQL fences use psycopg 3 (``pip install 'psycopg[binary]'``), imported only when one
is used: the worker itself does not need it.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

DEFAULT_TABLE = "connect_fencing"
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT = 10.0
_INT64 = (-(2**63), 2**63 - 1)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class StaleTokenError(Exception):
    """A higher fencing token is recorded for ``resource`` than the ``token`` this write carried:
    a newer holder of the item has written; nothing of this transaction was written."""

    def __init__(self, resource: str, token: int, recorded: int) -> None:
        super().__init__(resource, token, recorded)
        self.resource = resource
        self.token = token
        self.recorded = recorded

    def __str__(self) -> str:
        return (f"fencing token {self.token} for resource {self.resource!r} is stale: "
                f"{self.recorded} is recorded")


def _check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"a fencing token is an int, not {type(token).__name__}")
    if not _INT64[0] <= token <= _INT64[1]:
        raise ValueError(f"fencing token {token} is outside the int64 range")
    return token


def _check_resource(resource: object) -> str:
    if not isinstance(resource, str) or not resource:
        raise ValueError(f"a fence's resource is a non-empty string, not {resource!r}")
    return resource


def _table_parts(table: str) -> tuple[str, ...]:
    """``table`` or ``schema.table``, each part a plain SQL identifier (quoted when used)."""
    parts = tuple(table.split(".")) if isinstance(table, str) else ()
    if not 1 <= len(parts) <= 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise ValueError(f"fence table {table!r} is not an identifier or schema.identifier "
                         "(letters, digits, underscores)")
    return parts


class SqliteFence:
    """The fence of one resource in a SQLite database (``sqlite3``), on the caller's connection.

    ``conn`` must not be in a transaction when a fenced transaction starts. Its busy timeout
    (``sqlite3.connect(..., timeout=...)``) is how long a writer waits for another writer.
    """

    def __init__(self, conn: sqlite3.Connection, resource: str, *, table: str = DEFAULT_TABLE) -> None:
        self.conn = conn
        self.resource = _check_resource(resource)
        self.table = ".".join(f'"{p}"' for p in _table_parts(table))
        was_in_transaction = conn.in_transaction
        conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} "
                     "(resource TEXT PRIMARY KEY, token INTEGER NOT NULL)")
        if conn.in_transaction and not was_in_transaction:
            conn.commit()

    def recorded(self) -> int | None:
        """The token recorded for the resource (``None``: never written)."""
        row = self.conn.execute(f"SELECT token FROM {self.table} WHERE resource = ?",
                                (self.resource,)).fetchone()
        return None if row is None else int(row[0])

    @contextmanager
    def transaction(self, token: int) -> Iterator[sqlite3.Cursor]:
        """One transaction: lock, refuse a lower token, record this one, the block's writes, commit."""
        token = _check_token(token)
        conn = self.conn
        if conn.in_transaction:
            raise RuntimeError("the connection is already in a transaction: a fenced transaction "
                               "must begin its own (commit or roll back first)")
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")  # the write lock first, then the check
            try:
                row = cur.execute(f"SELECT token FROM {self.table} WHERE resource = ?",
                                  (self.resource,)).fetchone()
                if row is not None and row[0] > token:
                    raise StaleTokenError(self.resource, token, int(row[0]))
                cur.execute(f"INSERT INTO {self.table} (resource, token) VALUES (?, ?) "
                            "ON CONFLICT (resource) DO UPDATE SET token = excluded.token",
                            (self.resource, token))
                yield cur
                if not conn.in_transaction:
                    raise RuntimeError("the fenced transaction was committed or rolled back "
                                       "inside its block: the fence must end it")
                cur.execute("COMMIT")  # SQL, not conn.commit(): the same in every sqlite3 mode
            except BaseException:
                if conn.in_transaction:
                    cur.execute("ROLLBACK")
                raise
        finally:
            cur.close()


class _PostgresStatements:
    """The SQL both PostgreSQL fences run (psycopg.sql composed, the table name quoted)."""

    def __init__(self, resource: str, table: str, idle_in_transaction_timeout: float | None) -> None:
        from psycopg import sql

        self.resource = _check_resource(resource)
        ident = sql.Identifier(*_table_parts(table))
        if idle_in_transaction_timeout is not None and not idle_in_transaction_timeout > 0:
            raise ValueError("idle_in_transaction_timeout is a positive number of seconds or None")
        self.timeout_ms = (None if idle_in_transaction_timeout is None
                           else max(1, round(idle_in_transaction_timeout * 1000)))
        self.create = sql.SQL("CREATE TABLE IF NOT EXISTS {} "
                              "(resource TEXT PRIMARY KEY, token BIGINT NOT NULL)").format(ident)
        self.set_timeout = sql.SQL(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, true)")
        # Inserts the row, or locks it and raises the token when this one is not lower; either
        # way the row stays locked to the end of the transaction. RETURNING is empty when a
        # higher token is recorded.
        self.claim = sql.SQL("INSERT INTO {t} AS f (resource, token) VALUES (%s, %s) "
                             "ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token "
                             "WHERE f.token <= EXCLUDED.token RETURNING f.token").format(t=ident)
        self.read = sql.SQL("SELECT token FROM {} WHERE resource = %s").format(ident)


def _created_concurrently(exc: Exception) -> bool:
    # Two sessions running CREATE TABLE IF NOT EXISTS at once: one fails on the catalog (its row
    # type "already exists", or pg_type's unique index); the table exists, which is all we want.
    from psycopg import errors

    return isinstance(exc, errors.DuplicateObject | errors.DuplicateTable | errors.UniqueViolation)


def _require_idle(conn: Any) -> None:
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError("the connection is already in a transaction: a fenced transaction "
                           "must begin its own (commit or roll back first)")


class PostgresFence:
    """The fence of one resource in PostgreSQL, on the caller's ``psycopg.Connection`` (sync).

    The table is created, if missing, before the first fenced transaction.
    ``idle_in_transaction_timeout`` (seconds; ``None`` keeps the server's setting) bounds how
    long a process frozen inside a fenced transaction can hold the resource (module doc).
    """

    def __init__(self, conn: psycopg.Connection[Any], resource: str, *, table: str = DEFAULT_TABLE,
                 idle_in_transaction_timeout: float | None = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT) -> None:
        self.conn = conn
        self._sql = _PostgresStatements(resource, table, idle_in_transaction_timeout)
        self.resource = self._sql.resource
        self._table_ready = False

    def _ensure_table(self) -> None:
        if self._table_ready:
            return
        try:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.execute(self._sql.create)
        except Exception as exc:
            if not _created_concurrently(exc):
                raise
        self._table_ready = True

    def recorded(self) -> int | None:
        """The token recorded for the resource (``None``: never written)."""
        _require_idle(self.conn)
        self._ensure_table()
        with self.conn.transaction(), self.conn.cursor() as cur:
            row = cur.execute(self._sql.read, (self.resource,)).fetchone()
        return None if row is None else int(row[0])

    @contextmanager
    def transaction(self, token: int) -> Iterator[psycopg.Cursor[Any]]:
        """One transaction: lock, refuse a lower token, record this one, the block's writes, commit."""
        token = _check_token(token)
        _require_idle(self.conn)
        self._ensure_table()
        with self.conn.transaction(), self.conn.cursor() as cur:
            if self._sql.timeout_ms is not None:
                cur.execute(self._sql.set_timeout, (str(self._sql.timeout_ms),))
            if cur.execute(self._sql.claim, (self.resource, token)).fetchone() is None:
                recorded = cur.execute(self._sql.read, (self.resource,)).fetchone()
                assert recorded is not None  # the claim met the row and holds its lock
                raise StaleTokenError(self.resource, token, int(recorded[0]))
            yield cur


class AsyncPostgresFence:
    """:class:`PostgresFence` on a ``psycopg.AsyncConnection``: ``async with
    fence.transaction(token) as cur`` (``cur`` an ``AsyncCursor``)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], resource: str, *,
                 table: str = DEFAULT_TABLE,
                 idle_in_transaction_timeout: float | None = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT) -> None:
        self.conn = conn
        self._sql = _PostgresStatements(resource, table, idle_in_transaction_timeout)
        self.resource = self._sql.resource
        self._table_ready = False

    async def _ensure_table(self) -> None:
        if self._table_ready:
            return
        try:
            async with self.conn.transaction(), self.conn.cursor() as cur:
                await cur.execute(self._sql.create)
        except Exception as exc:
            if not _created_concurrently(exc):
                raise
        self._table_ready = True

    async def recorded(self) -> int | None:
        """The token recorded for the resource (``None``: never written)."""
        _require_idle(self.conn)
        await self._ensure_table()
        async with self.conn.transaction(), self.conn.cursor() as cur:
            row = await (await cur.execute(self._sql.read, (self.resource,))).fetchone()
        return None if row is None else int(row[0])

    @asynccontextmanager
    async def transaction(self, token: int) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
        """One transaction: lock, refuse a lower token, record this one, the block's writes, commit."""
        token = _check_token(token)
        _require_idle(self.conn)
        await self._ensure_table()
        async with self.conn.transaction(), self.conn.cursor() as cur:
            if self._sql.timeout_ms is not None:
                await cur.execute(self._sql.set_timeout, (str(self._sql.timeout_ms),))
            await cur.execute(self._sql.claim, (self.resource, token))
            if await cur.fetchone() is None:
                await cur.execute(self._sql.read, (self.resource,))
                recorded = await cur.fetchone()
                assert recorded is not None  # the claim met the row and holds its lock
                raise StaleTokenError(self.resource, token, int(recorded[0]))
            yield cur
