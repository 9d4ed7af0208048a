"""Units of work: a connector or one of its tasks, one hashable, ordered type for both.

``Item("A", -1)`` is connector A, ``Item("A", 2)`` its task 2 (shown ``A`` and ``A/2``). The
wire keeps two lists (``Connectors``, ``Tasks``); :func:`items_from_wire` and
:func:`split_items` convert. Shared by the coordinator and the worker client.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

CONNECTOR = -1


class Item(NamedTuple):
    """A connector (``task == -1``) or one of its tasks."""

    connector: str
    task: int

    def __str__(self) -> str:
        return self.connector if self.task == CONNECTOR else f"{self.connector}/{self.task}"

    @property
    def is_connector(self) -> bool:
        return self.task == CONNECTOR

    @classmethod
    def parse(cls, text: str) -> Item:
        """``"A"`` -> connector A, ``"A/2"`` -> its task 2."""
        if "/" in text:
            connector, task = text.rsplit("/", 1)
            return cls(connector, int(task))
        return cls(text, CONNECTOR)


EMPTY: frozenset[Item] = frozenset()


_new_tuple = tuple.__new__


def items_from_wire(connectors: Iterable[str] | None, tasks: Iterable[Any] | None) -> frozenset[Item]:
    """Items from wire lists (``tasks`` holds objects with ``connector`` and ``task``)."""
    # tuple.__new__ builds the Item directly, without the Python-level Item.__new__: a log replay
    # builds millions of them.
    out = [_new_tuple(Item, (c, CONNECTOR)) for c in connectors] if connectors else []
    if tasks:
        out += [_new_tuple(Item, (t.connector, t.task)) for t in tasks]
    return frozenset(out)


def split_items(items: Iterable[Item]) -> tuple[list[str], list[Item]]:
    """(sorted connector names, sorted task items) of ``items``."""
    connectors = sorted(i.connector for i in items if i.task == CONNECTOR)
    tasks = sorted(i for i in items if i.task != CONNECTOR)
    return connectors, tasks


def connector_items(name: str, task_count: int) -> list[Item]:
    """The connector item and its tasks."""
    return [_new_tuple(Item, (name, t)) for t in range(CONNECTOR, max(task_count, 0))]
