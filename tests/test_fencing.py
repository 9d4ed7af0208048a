"""The fencing helpers a sink author uses (worker_client/fencing.py), on a real SQLite file and a
real PostgreSQL (tests/postgres_fixture.py): a lower token is refused and nothing of it written,
equal and higher tokens are accepted; concurrent writers never leave a lower token's write after
a higher one's; a process frozen (SIGSTOP) inside a fenced transaction neither blocks the new
holder for ever (PostgreSQL ends its session) nor lands its write after the new holder's; a
process killed mid-transaction writes nothing.

Every data table below has a ``seq`` counter row the fenced transaction bumps (a row lock held to
commit): the ``n`` it gets orders the accepted writes as they committed, so "tokens never go
down in commit order" is checked from the resource's contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.postgres_fixture import PostgresServer, postgres_dsn, postgres_server  # noqa: F401
from worker_client.fencing import AsyncPostgresFence, PostgresFence, SqliteFence, StaleTokenError

RESOURCE = "orders-sink"
REPO = Path(__file__).resolve().parent.parent

SQLITE_SCHEMA = ("CREATE TABLE IF NOT EXISTS writes (n INTEGER PRIMARY KEY, token INTEGER NOT NULL, "
                 "who TEXT NOT NULL)",
                 "CREATE TABLE IF NOT EXISTS seq (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
                 "INSERT OR IGNORE INTO seq VALUES (1, 0)")
PG_SCHEMA = ("CREATE TABLE IF NOT EXISTS writes (n BIGINT PRIMARY KEY, token BIGINT NOT NULL, "
             "who TEXT NOT NULL)",
             "CREATE TABLE IF NOT EXISTS seq (id INT PRIMARY KEY, n BIGINT NOT NULL)",
             "INSERT INTO seq VALUES (1, 0) ON CONFLICT DO NOTHING")
SQLITE_WRITE = ("UPDATE seq SET n = n + 1 WHERE id = 1 RETURNING n",
                "INSERT INTO writes (n, token, who) VALUES (?, ?, ?)")
PG_WRITE = ("UPDATE seq SET n = n + 1 WHERE id = 1 RETURNING n",
            "INSERT INTO writes (n, token, who) VALUES (%s, %s, %s)")

# A writer process: one fenced transaction that writes, says "written", then stalls reading
# stdin (the test SIGSTOPs it there, or SIGKILLs it); told to go on it commits and prints the
# outcome; told again, it tries one more transaction with the same token.
WRITER = r"""
import asyncio, os, signal, sqlite3, sys
import psycopg
from worker_client.fencing import AsyncPostgresFence, PostgresFence, SqliteFence, StaleTokenError
kind, target, token, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
bump, write = "UPDATE seq SET n = n + 1 WHERE id = 1 RETURNING n", "INSERT INTO writes VALUES (%s, %s, %s)"
def outcome(exc):
    if isinstance(exc, StaleTokenError):
        print("refused", exc.recorded, flush=True)
    else:
        print("failed", type(exc).__name__, flush=True)
def stall():
    if sys.stdin.readline().strip() == "die":
        os.kill(os.getpid(), signal.SIGKILL)
def attempt(fence, label):
    try:
        with fence.transaction(token) as cur:
            n = cur.execute(bump).fetchone()[0]
            cur.execute(write.replace("%s", "?") if kind == "sqlite" else write, (n, token, label))
            print("written", flush=True)
            stall()
        print("committed", flush=True)
    except Exception as exc:
        outcome(exc)
async def attempt_async(fence, label):
    try:
        async with fence.transaction(token) as cur:
            await cur.execute(bump)
            n = (await cur.fetchone())[0]
            await cur.execute(write, (n, token, label))
            print("written", flush=True)
            stall()
        print("committed", flush=True)
    except Exception as exc:
        outcome(exc)
async def main_async():
    conn = await psycopg.AsyncConnection.connect(target)
    fence = AsyncPostgresFence(conn, "orders-sink", idle_in_transaction_timeout=timeout)
    await attempt_async(fence, "stale")
    sys.stdin.readline()
    await attempt_async(fence, "stale-again")
if kind == "postgres-async":
    asyncio.run(main_async())
else:
    if kind == "sqlite":
        fence = SqliteFence(sqlite3.connect(target, timeout=timeout), "orders-sink")
    else:
        fence = PostgresFence(psycopg.connect(target), "orders-sink", idle_in_transaction_timeout=timeout)
    attempt(fence, "stale")
    sys.stdin.readline()
    attempt(fence, "stale-again")
"""


def spawn_writer(kind: str, target: str, token: int, timeout: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, kind, target, str(token), str(timeout)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def expect_line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith(prefix), f"expected {prefix!r} from the writer, got {line!r}"
    return line


def _check_monotonic(rows: list[tuple[int, int, str]]) -> None:
    """rows (n, token, who) of accepted writes: tokens never go down in commit order."""
    tokens = [token for _, token, _ in sorted(rows)]
    for i in range(1, len(tokens)):
        assert tokens[i] >= tokens[i - 1], (
            f"write #{i + 1} carries token {tokens[i]} after token {tokens[i - 1]} was written: "
            f"{tokens[max(0, i - 5):i + 5]}")


WRITERS, WRITES_EACH = 6, 25


def race_in_threads(open_fence: Callable[[], Any], write: Callable[..., None]) -> list[int]:
    """WRITERS threads, each with its own connection (``open_fence()``), make WRITES_EACH fenced
    writes, taking each token from one counter as grants would and racing with the others (a
    random pause before, the sink's work held inside): the tokens refused."""
    tokens = iter(range(1, 10**6))
    lock = threading.Lock()
    refused: list[int] = []
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        rng = random.Random(name)
        try:
            fence = open_fence()
            with contextlib.closing(fence.conn):
                for _ in range(WRITES_EACH):
                    with lock:
                        token = next(tokens)
                    time.sleep(rng.random() / 1000)
                    try:
                        write(fence, token, name, hold_s=rng.random() / 500)
                    except StaleTokenError:
                        refused.append(token)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return refused


# ------------------------------------------------------------------------------------- SQLite


def sqlite_db(path: Path, timeout: float = 30.0) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=timeout, check_same_thread=False)
    for statement in SQLITE_SCHEMA:
        conn.execute(statement)
    conn.commit()
    return conn


def sqlite_write(fence: SqliteFence, token: int, who: str, hold_s: float = 0.0) -> None:
    """One fenced write; ``hold_s``: the sink's work inside the transaction (others then wait)."""
    with fence.transaction(token) as cur:
        n = cur.execute(SQLITE_WRITE[0]).fetchone()[0]
        time.sleep(hold_s)
        cur.execute(SQLITE_WRITE[1], (n, token, who))


def sqlite_rows(path: Path) -> list[tuple[int, int, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT n, token, who FROM writes ORDER BY n").fetchall()


def test_sqlite_lower_refused_equal_and_higher_accepted(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    fence = SqliteFence(sqlite_db(db), RESOURCE)
    assert fence.recorded() is None
    sqlite_write(fence, 5, "a")
    sqlite_write(fence, 5, "a-again")  # the same holder writing again
    sqlite_write(fence, 7, "b")
    with pytest.raises(StaleTokenError) as refused:
        sqlite_write(fence, 6, "stale")
    assert (refused.value.resource, refused.value.token, refused.value.recorded) == (RESOURCE, 6, 7)
    assert "6" in str(refused.value) and "7" in str(refused.value)
    assert [(t, w) for _, t, w in sqlite_rows(db)] == [(5, "a"), (5, "a-again"), (7, "b")]
    assert fence.recorded() == 7
    assert not fence.conn.in_transaction


def test_sqlite_exception_rolls_back_writes_and_token(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    fence = SqliteFence(sqlite_db(db), RESOURCE)
    sqlite_write(fence, 5, "a")
    with pytest.raises(ZeroDivisionError):
        with fence.transaction(9) as cur:
            cur.execute(SQLITE_WRITE[1], (100, 9, "doomed"))
            raise ZeroDivisionError
    assert fence.recorded() == 5  # 9 was never recorded: a token between is still accepted
    sqlite_write(fence, 6, "b")
    assert [(t, w) for _, t, w in sqlite_rows(db)] == [(5, "a"), (6, "b")]


def test_sqlite_resources_apart_custom_table_and_bad_use(tmp_path: Path) -> None:
    conn = sqlite_db(tmp_path / "sink.db")
    high, low = SqliteFence(conn, "a", table="my_fences"), SqliteFence(conn, "b", table="my_fences")
    sqlite_write(high, 100, "a")
    sqlite_write(low, 1, "b")  # another resource: its own token
    assert conn.execute("SELECT resource, token FROM my_fences ORDER BY resource").fetchall() == [
        ("a", 100), ("b", 1)]
    with pytest.raises(ValueError, match="identifier"):
        SqliteFence(conn, "a", table="x; DROP TABLE writes")
    with pytest.raises(ValueError, match="non-empty"):
        SqliteFence(conn, "")
    with pytest.raises(TypeError, match="int"):
        with high.transaction("100"):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match="int64"):
        with high.transaction(2**63):
            pass
    conn.execute("INSERT INTO writes VALUES (1000, 0, 'open')")  # the caller's open transaction
    with pytest.raises(RuntimeError, match="already in a transaction"):
        with high.transaction(100):
            pass
    conn.rollback()
    with pytest.raises(RuntimeError, match="inside its block"):
        with high.transaction(100):
            conn.commit()


@pytest.mark.parametrize("journal_mode", ["DELETE", "WAL"])
def test_sqlite_concurrent_writers_never_write_a_lower_token_after_a_higher(
        tmp_path: Path, journal_mode: str) -> None:
    db = tmp_path / "sink.db"
    with sqlite_db(db) as conn:
        assert conn.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()[0].upper() == journal_mode
    conn.close()
    refused = race_in_threads(lambda: SqliteFence(sqlite_db(db), RESOURCE), sqlite_write)
    rows = sqlite_rows(db)
    assert len(rows) + len(refused) == WRITERS * WRITES_EACH
    _check_monotonic(rows)
    assert SqliteFence(sqlite3.connect(db), RESOURCE).recorded() == max(t for _, t, _ in rows)


def test_sqlite_writer_frozen_in_transaction_commits_before_the_new_holder(tmp_path: Path) -> None:
    """SQLite has no server to end a frozen writer: it keeps the write lock, the new holder's
    write fails as "locked" (nothing written) until it wakes; its commit then lands before the
    new holder's first write, and its next write is refused."""
    db = tmp_path / "sink.db"
    new = SqliteFence(sqlite_db(db, timeout=0.2), RESOURCE)
    stale = spawn_writer("sqlite", str(db), 5, 30.0)
    try:
        expect_line(stale, "written")
        os.kill(stale.pid, signal.SIGSTOP)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            sqlite_write(new, 6, "new")
        assert sqlite_rows(db) == []
        os.kill(stale.pid, signal.SIGCONT)
        assert stale.stdin is not None
        stale.stdin.write("\n")
        stale.stdin.flush()
        expect_line(stale, "committed")
        sqlite_write(new, 6, "new")
        stale.stdin.write("\n")  # the second attempt: refused before it writes
        stale.stdin.close()
        assert expect_line(stale, "refused") == "refused 6"
    finally:
        os.kill(stale.pid, signal.SIGCONT)
        stale.kill()
        stale.wait()
    assert [(t, w) for _, t, w in sqlite_rows(db)] == [(5, "stale"), (6, "new")]


def test_sqlite_writer_killed_mid_transaction_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    sqlite_db(db).close()
    writer = spawn_writer("sqlite", str(db), 9, 30.0)
    expect_line(writer, "written")
    assert writer.stdin is not None
    writer.stdin.write("die\n")
    writer.stdin.flush()
    assert writer.wait() == -signal.SIGKILL
    fence = SqliteFence(sqlite_db(db), RESOURCE)  # opening it rolls the hot journal back
    assert fence.recorded() is None
    sqlite_write(fence, 1, "after")  # 9 was never recorded
    assert [(t, w) for _, t, w in sqlite_rows(db)] == [(1, "after")]


# --------------------------------------------------------------------------------- PostgreSQL


def pg_connect(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn)
    with conn.transaction():
        for statement in PG_SCHEMA:
            conn.execute(statement)  # type: ignore[arg-type]
    return conn


def pg_write(fence: PostgresFence, token: int, who: str, hold_s: float = 0.0) -> None:
    with fence.transaction(token) as cur:
        n = cur.execute(PG_WRITE[0]).fetchone()[0]  # type: ignore[index]
        time.sleep(hold_s)
        cur.execute(PG_WRITE[1], (n, token, who))


def pg_rows(dsn: str) -> list[tuple[int, int, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT n, token, who FROM writes ORDER BY n").fetchall()


def test_postgres_lower_refused_equal_and_higher_accepted(postgres_dsn: str) -> None:  # noqa: F811
    with pg_connect(postgres_dsn) as conn:
        fence = PostgresFence(conn, RESOURCE)
        assert fence.recorded() is None
        pg_write(fence, 5, "a")
        pg_write(fence, 5, "a-again")
        pg_write(fence, 7, "b")
        with pytest.raises(StaleTokenError) as refused:
            pg_write(fence, 6, "stale")
        assert (refused.value.resource, refused.value.token, refused.value.recorded) == (RESOURCE, 6, 7)
        assert fence.recorded() == 7
        with pytest.raises(ZeroDivisionError):
            with fence.transaction(9) as cur:
                cur.execute(PG_WRITE[1], (100, 9, "doomed"))
                raise ZeroDivisionError
        assert fence.recorded() == 7  # the failed 9 was rolled back with its write
        pg_write(fence, 8, "c")
        with pytest.raises(psycopg.ProgrammingError):  # the fence, not the block, commits
            with fence.transaction(8):
                conn.commit()
        conn.execute("SELECT 1")  # the caller's open transaction
        with pytest.raises(RuntimeError, match="already in a transaction"):
            with fence.transaction(8):
                pass
        conn.rollback()
    assert [(t, w) for _, t, w in pg_rows(postgres_dsn)] == [(5, "a"), (5, "a-again"), (7, "b"), (8, "c")]


def test_postgres_resources_apart_and_custom_table(postgres_dsn: str) -> None:  # noqa: F811
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # the fence begins its own
        conn.execute("CREATE SCHEMA sink")
        a = PostgresFence(conn, "a", table="sink.fences")
        b = PostgresFence(conn, "b", table="sink.fences")
        with a.transaction(100):
            pass
        with b.transaction(1):
            pass
        assert conn.execute("SELECT resource, token FROM sink.fences ORDER BY 1").fetchall() == [
            ("a", 100), ("b", 1)]
        with pytest.raises(StaleTokenError):
            with a.transaction(99):
                pass
        with pytest.raises(ValueError, match="identifier"):
            PostgresFence(conn, "a", table='x"; DROP TABLE y; --')
        with pytest.raises(ValueError, match="positive"):
            PostgresFence(conn, "a", idle_in_transaction_timeout=0)


def test_postgres_concurrent_writers_never_write_a_lower_token_after_a_higher(
        postgres_dsn: str) -> None:  # noqa: F811
    pg_connect(postgres_dsn).close()
    refused = race_in_threads(lambda: PostgresFence(pg_connect(postgres_dsn), RESOURCE), pg_write)
    rows = pg_rows(postgres_dsn)
    assert len(rows) + len(refused) == WRITERS * WRITES_EACH
    _check_monotonic(rows)
    with psycopg.connect(postgres_dsn) as conn:
        assert PostgresFence(conn, RESOURCE).recorded() == max(t for _, t, _ in rows)


def start_blocked_writer(dsn: str, write: Callable[[], None]) -> tuple[threading.Thread, list[Any]]:
    """Run ``write`` in a thread and return once its session waits on a lock (it must: another
    session holds the fence row); ``outcome`` gets None or the exception when it is done."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            write()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not outcome and not conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'").fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the writer never waited on the fence row"
            time.sleep(0.01)
    assert not outcome, f"the writer went through while another held the fence row: {outcome}"
    return thread, outcome


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def test_postgres_writer_waiting_on_the_fence_row_sees_the_newer_token(
        postgres_dsn: str, isolation: str) -> None:  # noqa: F811
    """A lower token waits on the row lock the higher one holds; once that commits it is refused:
    READ COMMITTED re-reads the row (StaleTokenError), the snapshot levels raise a serialization
    failure instead. Either way nothing of it is written."""
    pg_connect(postgres_dsn).close()

    def lower() -> None:
        with pg_connect(postgres_dsn) as conn:
            conn.isolation_level = getattr(psycopg.IsolationLevel, isolation.replace(" ", "_"))
            pg_write(PostgresFence(conn, RESOURCE), 5, "lower")

    with pg_connect(postgres_dsn) as conn:
        pg_write(PostgresFence(conn, RESOURCE), 4, "first")  # the fence row exists
        with PostgresFence(conn, RESOURCE).transaction(6) as cur:
            cur.execute(PG_WRITE[1], (1000, 6, "higher"))
            thread, outcome = start_blocked_writer(postgres_dsn, lower)
        thread.join(60)
    expected = StaleTokenError if isolation == "READ COMMITTED" else psycopg.errors.SerializationFailure
    assert len(outcome) == 1 and isinstance(outcome[0], expected), outcome
    assert [(t, w) for _, t, w in pg_rows(postgres_dsn)] == [(4, "first"), (6, "higher")]


@pytest.mark.parametrize("kind", ["postgres", "postgres-async"])
def test_postgres_writer_frozen_in_transaction_is_ended_and_its_write_never_lands(
        postgres_dsn: str, postgres_server: PostgresServer, kind: str) -> None:  # noqa: F811
    """Kleppmann's scenario: the old holder froze (SIGSTOP) inside a fenced transaction holding the
    fence row; the new holder waits on that row until PostgreSQL ends the frozen session
    (idle_in_transaction_timeout), then writes; the old holder wakes, its commit fails, and
    nothing of it is in the resource."""
    pg_connect(postgres_dsn).close()
    stale = spawn_writer(kind, postgres_dsn, 5, 1.0)  # PostgresFence / AsyncPostgresFence
    try:
        expect_line(stale, "written")
        os.kill(stale.pid, signal.SIGSTOP)

        def new_holder() -> None:
            with pg_connect(postgres_dsn) as conn:
                pg_write(PostgresFence(conn, RESOURCE, idle_in_transaction_timeout=1.0), 6, "new")

        thread, outcome = start_blocked_writer(postgres_dsn, new_holder)  # on the frozen one's row
        thread.join(60)
        assert outcome == [None], outcome or "the new holder is still blocked by the frozen writer"
        os.kill(stale.pid, signal.SIGCONT)
        assert stale.stdin is not None
        stale.stdin.write("\n")
        stale.stdin.flush()
        assert expect_line(stale, "failed") == "failed IdleInTransactionSessionTimeout"  # its commit
    finally:
        os.kill(stale.pid, signal.SIGCONT)
        stale.kill()
        stale.wait()
    assert [(t, w) for _, t, w in pg_rows(postgres_dsn)] == [(6, "new")]
    assert "terminating connection due to idle-in-transaction timeout" in postgres_server.log_tail(200)


@pytest.mark.parametrize("kind", ["postgres", "postgres-async"])
def test_postgres_writer_killed_mid_transaction_writes_nothing(postgres_dsn: str, kind: str) -> None:  # noqa: F811
    pg_connect(postgres_dsn).close()
    writer = spawn_writer(kind, postgres_dsn, 9, 10.0)
    expect_line(writer, "written")
    assert writer.stdin is not None
    writer.stdin.write("die\n")
    writer.stdin.flush()
    assert writer.wait() == -signal.SIGKILL
    with pg_connect(postgres_dsn) as conn:
        fence = PostgresFence(conn, RESOURCE)
        pg_write(fence, 1, "after")  # waits for the dead session's rollback; 9 was never recorded
        assert fence.recorded() == 1
    assert [(t, w) for _, t, w in pg_rows(postgres_dsn)] == [(1, "after")]


# --------------------------------------------------------------------------- PostgreSQL, async


async def apg_connect(dsn: str) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(dsn)
    async with conn.transaction():
        for statement in PG_SCHEMA:
            await conn.execute(statement)  # type: ignore[arg-type]
    return conn


async def apg_write(fence: AsyncPostgresFence, token: int, who: str, hold_s: float = 0.0) -> None:
    async with fence.transaction(token) as cur:
        await cur.execute(PG_WRITE[0])
        n = (await cur.fetchone())[0]  # type: ignore[index]
        await asyncio.sleep(hold_s)
        await cur.execute(PG_WRITE[1], (n, token, who))


async def test_async_postgres_lower_refused_equal_and_higher_accepted(postgres_dsn: str) -> None:  # noqa: F811
    conn = await apg_connect(postgres_dsn)
    async with conn:
        fence = AsyncPostgresFence(conn, RESOURCE)
        assert await fence.recorded() is None
        await apg_write(fence, 5, "a")
        await apg_write(fence, 5, "a-again")
        await apg_write(fence, 7, "b")
        with pytest.raises(StaleTokenError) as refused:
            await apg_write(fence, 6, "stale")
        assert (refused.value.token, refused.value.recorded) == (6, 7)
        with pytest.raises(ZeroDivisionError):
            async with fence.transaction(9) as cur:
                await cur.execute(PG_WRITE[1], (100, 9, "doomed"))
                raise ZeroDivisionError
        assert await fence.recorded() == 7
    assert [(t, w) for _, t, w in pg_rows(postgres_dsn)] == [(5, "a"), (5, "a-again"), (7, "b")]


async def test_async_postgres_concurrent_tasks_never_write_a_lower_token_after_a_higher(
        postgres_dsn: str) -> None:  # noqa: F811
    await (await apg_connect(postgres_dsn)).close()
    tokens = iter(range(1, 10**6))
    refused: list[int] = []

    async def writer(name: str) -> None:
        rng = random.Random(name)
        async with await apg_connect(postgres_dsn) as conn:
            fence = AsyncPostgresFence(conn, RESOURCE)
            for _ in range(WRITES_EACH):
                token = next(tokens)
                await asyncio.sleep(rng.random() / 1000)
                try:
                    await apg_write(fence, token, name, hold_s=rng.random() / 500)
                except StaleTokenError:
                    refused.append(token)

    await asyncio.gather(*(writer(f"t{i}") for i in range(WRITERS)))
    rows = pg_rows(postgres_dsn)
    assert len(rows) + len(refused) == WRITERS * WRITES_EACH
    _check_monotonic(rows)
