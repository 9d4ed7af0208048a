"""What a running plugin instance is told, and what it may ask: its ``context``.

Before ``start``, the worker sets ``instance.context`` to a :class:`Context`: who the instance
is (``connector``, ``task_id``, ``worker_id``), where its member stands (``member_epoch``, the
item's ``fencing_token``: both read live), and the calls that go through the coordinator
(``commit_offsets``, ``offset``, ``request_task_reconfiguration``). The author's guide is
docs/plugins.md.

Also here, pure (no I/O): the canonical JSON of a source partition or offset, the check of what a
connector's ``task_configs(max_tasks)`` returned, and the config a task instance starts with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from connect_wire import verbs
from connect_wire.errors import ErrorCode
from connect_wire.items import Item
from worker_client import FencedError

__all__ = ["Context", "FencedError", "canonical_json", "check_task_configs", "instance_config",
           "offset_pairs"]


FENCED_CODES = frozenset({ErrorCode.STALE_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID,
                          ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.ITEM_NOT_OWNED})


def _check_json(value: Any, path: str) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path} is {value!r}: JSON has no NaN or infinity")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path} has the key {key!r}: JSON object keys are strings")
            _check_json(item, f"{path}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]")
        return
    raise TypeError(f"{path} is a {type(value).__name__} ({value!r}), not a JSON value")


def canonical_json(obj: Any, what: str = "value") -> str:
    """``obj`` (a dict) as canonical JSON: sorted keys, no spaces, UTF-8 kept as is. Partitions
    compare by this string. TypeError for what is not a dict or not JSON (a non-string key, a
    set, bytes, ...), ValueError for NaN or infinity."""
    if not isinstance(obj, Mapping):
        raise TypeError(f"the {what} must be a dict (a JSON object), not {type(obj).__name__} "
                        f"({obj!r})")
    _check_json(obj, what)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def offset_pairs(pairs: Iterable[Any]) -> list[tuple[str, str | None]]:
    """``[(partition, offset), ...]`` as canonical JSON, checked: each partition a dict, each
    offset a dict or None (None removes the partition). A partition given twice keeps its last
    offset."""
    if isinstance(pairs, (str, bytes, Mapping)):
        raise TypeError("commit_offsets takes a list of (partition, offset) pairs, not a "
                        f"{type(pairs).__name__}")
    out: dict[str, str | None] = {}
    for n, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"pair {n} is {pair!r}: each must be (partition, offset)")
        partition, offset = pair
        key = canonical_json(partition, f"partition of pair {n}")
        out.pop(key, None)  # (the last one given counts, in its place)
        out[key] = None if offset is None else canonical_json(offset, f"offset of pair {n}")
    return list(out.items())


def check_task_configs(result: Any, max_tasks: int, where: str) -> list[dict[str, str]]:
    """What ``task_configs(max_tasks)`` returned, checked: a list of at most ``max_tasks``
    dicts of str to str, without the keys reserved for Connect's verbs. Raises ValueError with
    a message naming ``where`` (the method) otherwise."""
    if not isinstance(result, (list, tuple)):
        raise ValueError(f"{where} returned {type(result).__name__}, not a list of task configs "
                         "(dicts of str to str)")
    if len(result) > max_tasks:
        raise ValueError(f"{where} returned {len(result)} task configs; at most max_tasks="
                         f"{max_tasks} (the connector's configured task count)")
    out = []
    for n, config in enumerate(result):
        if not isinstance(config, Mapping):
            raise ValueError(f"{where} returned {type(config).__name__} as task config {n}, "
                             "not a dict of str to str")
        for key, value in config.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"{where}: task config {n} has {key!r}: {value!r}; keys and "
                                 "values must be str")
            if verbs.is_reserved(key):
                raise ValueError(f"{where}: task config {n} sets {key!r}, a key reserved for "
                                 "Connect's verbs")
        out.append(dict(config))
    return out


def instance_config(plugin_config: Mapping[str, str | None], item: Item, worker_id: str,
                    task_config: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The config an instance starts with: its connector's (as a plugin sees it), overlaid with
    the task's own config when its connector instance wrote one, plus ``connector.name``,
    ``task.id`` (tasks) and ``worker.id``, which nothing overrides."""
    config: dict[str, str | None] = {**plugin_config, **(task_config or {}),
                                     "connector.name": item.connector, "worker.id": worker_id}
    if not item.is_connector:
        config["task.id"] = str(item.task)
    return config


class Runtime(Protocol):
    """What a :class:`Context` asks of the worker that runs its instance."""

    @property
    def member_epoch(self) -> int: ...

    def fencing_token(self, item: Item) -> int | None: ...

    async def commit_offsets(self, item: Item, offsets: list[tuple[str, str | None]]) -> None: ...

    async def fetch_offset(self, connector: str, partition: str) -> str | None: ...

    def request_task_reconfiguration(self, item: Item) -> None: ...


class Context:
    """An instance's view of its worker (``instance.context``, set before ``start``).

    ``connector`` (name), ``task_id`` (int, ``None`` for the connector instance) and
    ``worker_id`` are fixed; ``member_epoch`` and ``fencing_token`` are read live. Once the
    instance's ``stop()`` returned the context is closed: a commit through it raises
    :class:`FencedError` (a new instance of the item gets a new context)."""

    __slots__ = ("_closed", "_item", "_runtime", "_token", "connector", "task_id", "worker_id")

    def __init__(self, item: Item, worker_id: str, runtime: Runtime) -> None:
        self._item = item
        self._runtime = runtime
        self._closed = False
        # The token of the grant this instance was started under: if the item is granted to
        # this worker again while it keeps it (e.g. its connector was deleted and created
        # again), the instance belongs to the earlier grant and the worker restarts it.
        self._token = runtime.fencing_token(item)
        self.connector = item.connector
        self.task_id: int | None = None if item.is_connector else item.task
        self.worker_id = worker_id

    def __repr__(self) -> str:
        return (f"Context(connector={self.connector!r}, task_id={self.task_id!r}, "
                f"worker_id={self.worker_id!r}, member_epoch={self.member_epoch})")

    @property
    def member_epoch(self) -> int:
        """The worker's current member epoch (0 while it is not a member: fenced or joining)."""
        return self._runtime.member_epoch

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of this grant of the item to this worker: higher than any token an
        earlier holder of the item was given. Pass it to the resource the instance writes, which
        refuses a lower one (worker_client.fencing). ``None`` if the coordinator sent none.
        Fixed for the instance's life (the grant it was started under)."""
        return self._token if self._token is not None else self._runtime.fencing_token(self._item)

    def stale_grant(self) -> int | None:
        """The item's current token if it differs from the one this instance started under (the
        item was granted to this worker again: this instance must not write), else None."""
        live = self._runtime.fencing_token(self._item)
        return live if self._token is not None and live is not None and live != self._token else None

    async def commit_offsets(self, pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
                             ) -> None:
        """Store ``[(partition, offset), ...]`` for the connector (both JSON objects; an offset
        of ``None`` removes its partition). Returns once the coordinator has them durably.
        Raises TypeError/ValueError (nothing sent) for what is not a dict of JSON values,
        :class:`FencedError` when this worker no longer holds the item at a current epoch."""
        offsets = offset_pairs(pairs)
        if self._closed:
            raise FencedError(ErrorCode.ITEM_NOT_OWNED,
                              f"the instance {self._item} was stopped: its context is closed")
        if (live := self.stale_grant()) is not None:
            raise FencedError(ErrorCode.ITEM_NOT_OWNED,
                              f"the instance {self._item} was started under fencing token "
                              f"{self._token}; the item was granted again (token {live}): "
                              "this instance is being restarted, nothing was stored")
        if offsets:
            await self._runtime.commit_offsets(self._item, offsets)

    async def offset(self, partition: Mapping[str, Any]) -> dict[str, Any] | None:
        """The last committed offset of ``partition`` (a dict), or None."""
        raw = await self._runtime.fetch_offset(self.connector, canonical_json(partition, "partition"))
        return None if raw is None else json.loads(raw)  # type: ignore[no-any-return]

    def request_task_reconfiguration(self) -> None:
        """Ask the worker to call the connector's ``task_configs`` again and store the result if
        it changed (requests made meanwhile are coalesced into one more call). Only for the
        connector instance; may be called from any thread."""
        if self.task_id is not None:
            raise RuntimeError("request_task_reconfiguration() is for the connector instance; "
                               f"{self._item} is a task")
        if not self._closed:
            self._runtime.request_task_reconfiguration(self._item)

    def _close(self) -> None:
        self._closed = True
