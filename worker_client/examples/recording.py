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
slow), ``fail.after.ms`` (the task's ``run`` raises after that long, to exercise restarts),
``fail.mode=start`` (every task's ``start`` raises: the task stays FAILED, retried with backoff;
the connector instance itself runs),
``tick.ms`` (while running, record a ``tick`` event that often: evidence that the instance
still runs, even if its process is killed before it can record a stop), ``record.tag`` (copied
into every line as ``"tag"``: which config an instance runs with, e.g. after
``connectors update --config record.tag=v2``, which restarts the connector's instances).

``validate`` checks these keys: the ``.ms`` ones are whole numbers, the modes one of those
below, ``record.file`` not empty.

Misbehaving on stop, to exercise the worker's fail-stop rule (docs/worker.md):

* ``stop.mode=block``: ``stop()`` blocks the event loop (``time.sleep``) for ``stop.delay.ms``
  (default 1 hour) before recording its stop;
* ``stop.mode=hang``: ``stop()`` never returns and ignores cancellation;
* ``stop.mode=raise``: ``stop()`` records its stop, then raises (a stop that ended, badly);
* ``stop.mode=thread``: ``run()`` does its work (the ticks) in a thread that ignores the stop
  flag; ``stop()`` sets the flag and waits for the thread, forever;
* ``run.mode=ignore-cancel``: ``run()`` swallows its cancellation and keeps running;
* ``run.mode=block``: ``block.after.ms`` (default 500) into ``run()``, block the event loop for
  an hour (no heartbeats either); with ``block.once.file=PATH`` only the first instance to
  create that file does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time


def _record(config: dict[str, str | None], item: str, event: str) -> None:
    path = config.get("record.file") or os.environ.get("CONNECT_WORKER_RECORD_FILE")
    if not path:
        return
    entry = {"ts": time.time(), "worker": config.get("worker.id"), "item": item,
             "event": event, "pid": os.getpid()}
    if config.get("record.tag") is not None:
        entry["tag"] = config["record.tag"]  # which config the instance runs with
    line = json.dumps(entry) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _fail_on_purpose(item: str) -> None:
    raise RuntimeError(f"{item}: start() failed on purpose (fail.mode=start)")


def _first(path: str | None) -> bool:
    """True for the first caller to create ``path`` (always True without a path)."""
    if not path:
        return True
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


class RecordingTask:
    def __init__(self) -> None:
        self.config: dict[str, str | None] = {}
        self.item = ""
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    async def start(self, config: dict[str, str | None]) -> None:
        self.config = config
        task = config.get("task.id")
        name = str(config["connector.name"])
        self.item = f"{name}/{task}" if task is not None else name
        if self.fails and config.get("fail.mode") == "start":
            _fail_on_purpose(self.item)
        _record(config, self.item, "start")

    def _tick_s(self) -> float | None:
        tick = self.config.get("tick.ms")
        return int(tick) / 1000 if tick else None

    def _ticks_in_thread(self) -> None:
        tick = self._tick_s() or 0.05
        while True:  # ignores self._halt on purpose: stop.mode=thread
            _record(self.config, self.item, "tick")
            time.sleep(tick)

    fails = True  # fail.after.ms and fail.mode apply (tasks only)

    async def run(self) -> None:
        if self.config.get("stop.mode") == "thread":
            self._thread = threading.Thread(target=self._ticks_in_thread, daemon=True)
            self._thread.start()
        fail_after = self.config.get("fail.after.ms") if self.fails else None
        until = None if fail_after is None else time.monotonic() + int(fail_after) / 1000
        tick = self._tick_s() if self._thread is None else None
        if self.config.get("run.mode") == "block":
            await asyncio.sleep(int(self.config.get("block.after.ms") or 500) / 1000)
            if _first(self.config.get("block.once.file")):
                _record(self.config, self.item, "block")
                time.sleep(3600)  # blocks the whole event loop
        while until is None or time.monotonic() < until:
            left = 3600.0 if until is None else max(0.0, until - time.monotonic())
            try:
                await asyncio.sleep(left if tick is None else min(tick, left))
                if tick is not None:
                    _record(self.config, self.item, "tick")
            except asyncio.CancelledError:
                if self.config.get("run.mode") != "ignore-cancel":
                    raise
        raise RuntimeError(f"{self.item} failed on purpose after {fail_after} ms")

    async def stop(self) -> None:
        mode = self.config.get("stop.mode") or "normal"
        delay = self.config.get("stop.delay.ms")
        if mode == "block":
            time.sleep(int(delay or 3_600_000) / 1000)  # blocks the whole event loop
        elif mode == "hang":
            while True:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(3600)
        elif mode == "thread":
            self._halt.set()
            if self._thread is not None:
                await asyncio.to_thread(self._thread.join)  # the thread ignores the flag
        elif delay:
            await asyncio.sleep(int(delay) / 1000)
        _record(self.config, self.item, "stop")
        if mode == "raise":
            raise RuntimeError(f"{self.item}: stop() failed on purpose (after stopping)")


MODES = {"fail.mode": ("start",), "stop.mode": ("normal", "block", "hang", "raise", "thread"),
         "run.mode": ("normal", "ignore-cancel", "block")}
MILLIS = ("stop.delay.ms", "fail.after.ms", "tick.ms", "block.after.ms")


class RecordingConnector(RecordingTask):
    task_class = RecordingTask
    fails = False

    @classmethod
    def validate(cls, config: dict[str, str | None]) -> dict[str, list[str]]:
        """The config's errors, ``{key: [messages]}`` (empty: valid). Run by
        ``connect-coordinator connectors create/update`` before writing the connector, and by
        the worker before starting any of its instances."""
        errors: dict[str, list[str]] = {}
        for key in MILLIS:
            value = config.get(key)
            if value is not None and not (value.isascii() and value.isdigit()):
                errors.setdefault(key, []).append(
                    f"must be a whole number of milliseconds (0 or more), not {value!r}")
        for key, allowed in MODES.items():
            value = config.get(key)
            if value is not None and value not in allowed:
                errors.setdefault(key, []).append(f"must be one of {', '.join(allowed)}, not {value!r}")
        if config.get("record.file") == "":
            errors["record.file"] = ["must not be empty (leave it out to record nothing)"]
        return errors
