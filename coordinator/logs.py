"""Structured logs of the daemon: the structlog setup shared with the worker (JSON lines by
default, a console renderer on request), written once in :mod:`connect_wire.logs`, the layer
below both (it used to live in the worker client, which the daemon then imported).

Context (group, member, partition, connection) is bound per event by the callers; nothing is
logged at info level per steady heartbeat. Group events (joins, fences, epoch bumps, ...) are
logged by the shard once committed (coordinator.runtime.shard, docs/daemon.md "Group events").

Lines a client can cause at will (a refused authorization, a failed authentication, a
connection closed for garbage) go through a :class:`LogLimiter`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from connect_wire.logs import LEVELS, configure, exit_line, get

__all__ = ["LEVELS", "LogLimiter", "configure", "exit_line", "get"]


class LogLimiter:
    """Which lines of a kind to write: at most one per key (e.g. peer host, or principal and
    resource) per ``interval_s``, and at most ``max_lines`` per ``interval_s`` over all keys
    (random resource names or many peers are new keys each). At most ``max_keys`` keys are
    remembered (forgotten all at once past it). What was left out is counted and reported on
    the next line written: ``suppressed`` (that key's), ``suppressed_overall`` (every key's,
    by the overall bound)."""

    def __init__(self, interval_s: float, max_lines: int = 20, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.max_lines = max_lines
        self.max_keys = max_keys
        self.clock = clock
        self._keys: dict[Hashable, list[float]] = {}  # key -> [last line's time, left out]
        self._window = (float("-inf"), 0)  # (start, lines written in it)
        self._dropped = 0

    def admit(self, key: Hashable) -> dict[str, int] | None:
        """The fields to add to the line for ``key``, or None: leave it out."""
        now = self.clock()
        seen = self._keys.get(key)
        if seen is not None and now - seen[0] < self.interval_s:
            seen[1] += 1
            return None
        start, lines = self._window
        if now - start >= self.interval_s:
            start, lines = now, 0
        if lines >= self.max_lines:
            self._dropped += 1
            return None
        self._window = (start, lines + 1)
        if seen is None and len(self._keys) >= self.max_keys:
            self._keys.clear()
        fields = {"suppressed": int(seen[1]) if seen is not None else 0}
        if self._dropped:
            fields["suppressed_overall"], self._dropped = self._dropped, 0
        self._keys[key] = [now, 0]
        return fields
