"""A live view of the keys under one etcd prefix (:class:`PrefixWatcher`): read the range, then
watch it from the read's revision, and read it again whenever the watch is cancelled or fails.
The node registry (coordinator.cluster.registry), the partitions' owner keys
(coordinator.cluster.node) and the security keys (coordinator.security.store) are watched with
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from etcd3aio import Etcd3Client
from etcd3aio.kv import prefix_range_end

from coordinator.runtime.etcd_store import EtcdStoreError

log = logging.getLogger("coordinator.registry")

_PUT = 0  # etcd's mvccpb.Event.EventType (1 is DELETE)


def key_suffix(key: bytes, skip: int) -> str:
    """The part of ``key`` after its ``skip``-byte prefix, as text (a node id, a partition)."""
    return key[skip:].decode(errors="replace")


class PrefixWatcher:
    """A live view of the keys under one etcd prefix: ``view`` (key suffix -> decoded value;
    values that do not decode are left out), ``revision`` (the etcd revision the view is at)
    and :meth:`changes`. ``await start()`` reads the range and starts the watch; ``await
    close()`` stops it.

    The watch starts at the read's revision + 1, so no change between the read and the watch is
    missed. If etcd cancels the watch (it was compacted past, e.g. after a long disconnection)
    or the watch fails in a way etcd3aio does not retry, the range is read again and the watch
    restarted from there (``relists`` counts these)."""

    def __init__(self, client: Etcd3Client, start: bytes, decode: Callable[[bytes], Any],
                 *, timeout_s: float = 5.0, retry_s: float = 0.25, name: str = "etcd-watch") -> None:
        self.client = client
        self.start_key = start
        self.decode = decode
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.name = name
        self.view: dict[str, Any] = {}
        self.revision = 0
        self.relists = 0
        self._changed = asyncio.Condition()
        self._version = 0
        self._task: asyncio.Task[None] | None = None
        self.on_change: Callable[[dict[str, Any]], None] | None = None

    async def read(self) -> tuple[dict[str, Any], int]:
        """The keys under the prefix now (decoded) and the revision of the read."""
        resp = await self.client.kv.get(self.start_key, prefix_range_end(self.start_key),
                                        timeout=self.timeout_s)
        view = {}
        skip = len(self.start_key)
        for kv in resp.kvs:
            value = self.decode(kv.value)
            if value is not None:
                view[key_suffix(kv.key, skip)] = value
        return view, resp.header.revision

    async def start(self) -> None:
        view, revision = await self.read()
        await self._publish(view, revision)
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _publish(self, view: dict[str, Any], revision: int) -> None:
        self.revision = max(self.revision, revision)
        if view == self.view and self._version:
            return
        self.view = dict(view)
        self._version += 1
        if self.on_change is not None:
            self.on_change(dict(view))
        async with self._changed:
            self._changed.notify_all()

    async def changes(self) -> AsyncIterator[dict[str, Any]]:
        """The current view, then every new one (views between two reads may be skipped)."""
        seen = [0]
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self._version != seen[0])
                seen[0] = self._version
                view = dict(self.view)
            yield view

    async def wait_for(self, condition: Callable[[dict[str, Any]], bool],
                       timeout_s: float) -> dict[str, Any]:
        """Wait until the view satisfies ``condition`` (TimeoutError after ``timeout_s``)."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: condition(self.view))
            return dict(self.view)

    async def _run(self) -> None:
        start = self.start_key
        skip = len(start)
        while True:
            try:
                view = dict(self.view)
                async for resp in self.client.watch.watch(start, prefix_range_end(start),
                                                          start_revision=self.revision + 1):
                    if resp.canceled or resp.compact_revision:
                        raise EtcdStoreError(f"watch cancelled (compacted to "
                                             f"{resp.compact_revision}): {resp.cancel_reason}")
                    for ev in resp.events:
                        name = key_suffix(ev.kv.key, skip)
                        value = self.decode(ev.kv.value) if ev.type == _PUT else None
                        if value is None:
                            view.pop(name, None)
                        else:
                            view[name] = value
                    await self._publish(view, resp.header.revision)
                raise EtcdStoreError("watch stream ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (relist and watch again)
                log.warning("%s interrupted (%r); reading the range again", self.name, exc)
                await asyncio.sleep(self.retry_s)
                with contextlib.suppress(Exception):
                    view, revision = await self.read()
                    self.relists += 1
                    await self._publish(view, revision)
                    self.revision = revision  # the watch restarts right after this read
