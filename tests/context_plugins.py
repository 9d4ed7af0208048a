"""Plugins for tests/test_worker_context_e2e.py: they use their ``context`` and append what they
saw to ``record.file`` as JSON lines (one ``open``/``write`` per line: several processes share
the file).

* :class:`SplitConnector` — ``task_configs(max_tasks)`` answers the list of dicts in the JSON file
  ``source.file`` (its first ``max_tasks``); its ``run()`` watches the file and calls
  ``context.request_task_reconfiguration()`` when it changes. Its tasks (:class:`SplitTask`)
  record the config they started with.
* :class:`TooManyConnector` — answers ``max_tasks + 1`` task configs (a plain method).
* :class:`OffsetConnector` — its tasks (:class:`OffsetTask`) read their offset at start
  (``resume``), then commit ``{"n": n, "by": worker id}`` for the partition ``{"connector": NAME, "task": N}``
  every ``commit.ms``, recording ``committing`` before and ``committed`` after each commit, and
  ``fenced`` (with the code) when the commit raises FencedError, after which they commit no more;
  with ``commit.on.stop=true`` their ``stop()`` commits ``{..., "final": true}`` (recorded as
  ``stop-commit``, with the error if it raised).
* :class:`ContextConnector` — it and its tasks (:class:`ContextTask`) record their context.
* :class:`SlottedConnector`, :class:`SlottedTask` — ``__slots__`` without ``context``: run as
  before, unaware of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from worker_client import FencedError
from worker_client.client import ConnectionFailed


def record(cfg: dict[str, Any], event: str, /, **fields: Any) -> None:
    path = cfg.get("record.file")
    if not path:
        return
    line = json.dumps({"ts": time.time(), "pid": os.getpid(), "event": event,
                       "worker": cfg.get("worker.id"), "item": _item(cfg), **fields})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _item(config: dict[str, Any]) -> str:
    task = config.get("task.id")
    return config["connector.name"] + ("" if task is None else f"/{task}")


def context_fields(plugin: Any) -> dict[str, Any]:
    ctx = getattr(plugin, "context", None)
    if ctx is None:
        return {"context": None}
    return {"context": {"connector": ctx.connector, "task_id": ctx.task_id,
                        "worker_id": ctx.worker_id, "member_epoch": ctx.member_epoch,
                        "fencing_token": ctx.fencing_token}}


class SplitTask:
    async def start(self, config: dict[str, Any]) -> None:
        self.config = config
        record(config, "start", config=config, **context_fields(self))

    async def stop(self) -> None:
        record(self.config, "stop")


class SplitConnector:
    task_class = SplitTask

    async def start(self, config: dict[str, Any]) -> None:
        self.config = config
        self.source = Path(config["source.file"])
        self.calls: list[int] = []
        record(config, "start", config=config, **context_fields(self))

    def _read(self) -> list[dict[str, str]]:
        return json.loads(self.source.read_text(encoding="utf-8"))  # type: ignore[no-any-return]

    async def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        configs = self._read()[:max_tasks]
        record(self.config, "task_configs", max_tasks=max_tasks, configs=configs)
        return configs

    async def run(self) -> None:
        seen = self._read()
        while True:
            await asyncio.sleep(0.05)
            now = self._read()
            if now != seen:
                seen = now
                self.context.request_task_reconfiguration()

    async def stop(self) -> None:
        record(self.config, "stop")


class TooManyConnector(SplitConnector):
    """Answers one task config more than it may."""

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:  # type: ignore[override]
        return [{"shard": str(n)} for n in range(max_tasks + 1)]


class OffsetTask:
    async def start(self, config: dict[str, Any]) -> None:
        self.config = config
        self.partition = {"connector": config["connector.name"], "task": int(config["task.id"])}
        self.every = int(config.get("commit.ms") or 50) / 1000
        self.by = config["worker.id"]
        offset = await self.context.offset(self.partition)
        self.n = 0 if offset is None else int(offset["n"])
        record(config, "resume", offset=offset, **context_fields(self))

    async def run(self) -> None:
        while True:
            self.n += 1
            record(self.config, "committing", n=self.n, epoch=self.context.member_epoch)
            try:
                await self.context.commit_offsets([(self.partition, {"n": self.n, "by": self.by})])
            except FencedError as exc:
                record(self.config, "fenced", n=self.n, code=exc.code, error=repr(exc))
                await asyncio.Event().wait()  # commits no more; the worker stops it
            except ConnectionFailed as exc:
                record(self.config, "unreachable", n=self.n, error=str(exc))
                continue
            record(self.config, "committed", n=self.n)
            await asyncio.sleep(self.every)

    async def stop(self) -> None:
        if self.config.get("commit.on.stop") == "true":
            try:  # the last position, while the item is still this worker's (being revoked)
                await self.context.commit_offsets([(self.partition, {"n": self.n, "by": self.by,
                                                                      "final": True})])
                record(self.config, "stop-commit", n=self.n)
            except Exception as exc:  # noqa: BLE001 - recorded for the test to see
                record(self.config, "stop-commit", n=self.n, error=repr(exc))
        record(self.config, "stop")


class OffsetConnector:
    task_class = OffsetTask

    async def start(self, config: dict[str, Any]) -> None:
        self.config = config

    async def stop(self) -> None:
        pass


class ContextTask:
    async def start(self, config: dict[str, Any]) -> None:
        self.config = config
        record(config, "start", config=config, **context_fields(self))

    async def stop(self) -> None:
        record(self.config, "stop")


class ContextConnector(ContextTask):
    task_class = ContextTask


class SlottedTask:
    __slots__ = ("config",)

    async def start(self, config: dict[str, Any]) -> None:
        self.config = config
        record(config, "start", config=config, context="absent")

    async def stop(self) -> None:
        record(self.config, "stop")


class SlottedConnector:
    __slots__ = ("config",)
    task_class = SlottedTask

    async def start(self, config: dict[str, Any]) -> None:
        self.config = config
        record(config, "start", config=config, context="absent")

    async def stop(self) -> None:
        pass


START_HOOK: Any = None
"""Called with the item's name as a :class:`HookTask`'s ``start()`` returns (tests set it)."""


class HookTask:
    async def start(self, config: dict[str, Any]) -> None:
        self.config = config
        if START_HOOK is not None:
            START_HOOK(_item(config))

    async def run(self) -> None:
        record(self.config, "run")
        await asyncio.Event().wait()

    async def stop(self) -> None:
        record(self.config, "stop")


class HookConnector:
    """Its tasks (:class:`HookTask`) call ``START_HOOK`` as their ``start()`` returns, and record
    ``run`` and ``stop``."""

    task_class = HookTask

    async def start(self, config: dict[str, Any]) -> None:
        pass

    async def stop(self) -> None:
        pass

