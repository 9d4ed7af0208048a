"""The bundled example plugin: it does no work, but records every start and stop.

Each event is one JSON line appended to the file named by ``record.file`` in the connector's
config (or the ``CONNECT_WORKER_RECORD_FILE`` environment variable)::

    {"ts": 1763820000.123456, "worker": "w1", "item": "orders/2", "event": "start", "pid": 4242}

``ts`` is the wall clock (seconds) when the instance *started* running or *finished* stopping,
so a start and a stop of one item on two workers can be compared on one machine: if every
``stop`` of an item precedes the next ``start`` of it, the item never ran twice. Lines are
written with one ``write`` on an ``O_APPEND`` file, so several worker processes can share it.

Use it as ``connector.class=worker_client.examples.recording:RecordingConnector``.
Optional config: ``stop.delay.ms`` (sleep before acknowledging a stop, to make revocations
slow), ``fail.after.ms`` (the task's ``run`` raises after that long, to exercise restarts).
"""

from __future__ import annotations

import asyncio
import json
import os
import time


def _record(config: dict[str, str | None], item: str, event: str) -> None:
    path = config.get("record.file") or os.environ.get("CONNECT_WORKER_RECORD_FILE")
    if not path:
        return
    line = json.dumps({"ts": time.time(), "worker": config.get("worker.id"), "item": item,
                       "event": event, "pid": os.getpid()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class RecordingTask:
    def __init__(self) -> None:
        self.config: dict[str, str | None] = {}
        self.item = ""

    async def start(self, config: dict[str, str | None]) -> None:
        self.config = config
        task = config.get("task.id")
        name = str(config["connector.name"])
        self.item = f"{name}/{task}" if task is not None else name
        _record(config, self.item, "start")

    async def run(self) -> None:
        fail_after = self.config.get("fail.after.ms")
        if fail_after is None:
            await asyncio.Event().wait()  # run until stopped
        await asyncio.sleep(int(fail_after) / 1000)
        raise RuntimeError(f"{self.item} failed on purpose after {fail_after} ms")

    async def stop(self) -> None:
        delay = self.config.get("stop.delay.ms")
        if delay:
            await asyncio.sleep(int(delay) / 1000)
        _record(self.config, self.item, "stop")


class RecordingConnector(RecordingTask):
    task_class = RecordingTask

    async def run(self) -> None:
        await asyncio.Event().wait()
