"""docs/plugins.md's ``py`` examples stay true: the excerpts of the bundled counter example are its
own lines (``...`` marks what is left out), in order, so they change when it does; and the
PostgreSQL sink, run as written against a real PostgreSQL, refuses a lower fencing token."""

from __future__ import annotations

import asyncio
import re
import types

import psycopg
import pytest

from tests.daemon_fixture import ROOT
from tests.postgres_fixture import postgres_dsn, postgres_server  # noqa: F401
from worker_client.fencing import StaleTokenError

GUIDE = ROOT / "docs" / "plugins.md"
COUNTER = ROOT / "worker_client" / "examples" / "counter.py"


def py_blocks() -> list[str]:
    return re.findall(r"```py\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)


def counter_excerpts() -> list[str]:
    return [b for b in py_blocks() if "import psycopg" not in b]


def test_the_guide_quotes_the_counter_example_verbatim() -> None:
    source = COUNTER.read_text(encoding="utf-8").splitlines()
    excerpts = counter_excerpts()
    assert len(excerpts) == 3, excerpts  # task configs, offsets, the fenced write
    for block in excerpts:
        at = 0
        for line in block.splitlines():
            if not line.strip() or line.strip() == "...":
                continue
            try:
                at = source.index(line, at) + 1
            except ValueError:
                pytest.fail(f"docs/plugins.md quotes a line counter.py does not have (in this "
                            f"order): {line!r}")


def test_the_excerpt_check_catches_an_edited_line() -> None:
    """The check above can fail: a quoted line changed by one character is not found."""
    source = COUNTER.read_text(encoding="utf-8").splitlines()
    quoted = next(line for line in counter_excerpts()[0].splitlines() if "task_configs" in line)
    assert quoted in source
    assert quoted.replace("max_tasks", "max_task") not in source


def test_the_guides_postgres_sink_refuses_a_lower_token(postgres_dsn: str) -> None:  # noqa: F811
    (example,) = [b for b in py_blocks() if "import psycopg" in b]
    namespace: dict[str, object] = {}
    exec(compile(example, "docs/plugins.md", "exec"), namespace)
    sink_class = namespace["OrdersSink"]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")

    async def scenario() -> None:
        config = {"pg.dsn": postgres_dsn, "connector.name": "orders", "task.id": "0"}
        old, new = sink_class(), sink_class()  # type: ignore[operator]
        old.context = types.SimpleNamespace(fencing_token=41)  # what the worker sets
        new.context = types.SimpleNamespace(fencing_token=42)
        await old.start(config)
        await new.start(config)
        try:
            await old.write([(1, 10), (2, 20)])  # the first holder writes
            await new.write([(2, 21)])  # the next holder, a higher token
            with pytest.raises(StaleTokenError):
                await old.write([(1, 99), (3, 30)])  # the first one woke up: refused, all of it
            await new.write([(3, 31)])
        finally:
            await old.stop()
            await new.stop()

    asyncio.run(scenario())
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute("SELECT id, total FROM orders ORDER BY id").fetchall()
        tokens = conn.execute("SELECT resource, token FROM connect_fencing").fetchall()
    assert rows == [(1, 10), (2, 21), (3, 31)]
    assert tokens == [("orders/0", 42)]
