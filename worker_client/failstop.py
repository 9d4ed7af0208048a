"""Fail-stop: the worker's promise that nothing it started runs past a deadline, kept by a
thread of its own.

The rule (docs/worker.md, "Stopping and the fail-stop rule"), with B the stop budget:

1. An instance counts as stopped only when its ``start()``/``run()`` has ended and its
   ``stop()`` returned (or raised), all within B of the moment its stop began. Only then is its
   item reported revoked to the coordinator.
2. An instance that is not stopped by then cannot be vouched for (a ``stop()`` that blocks or
   ignores cancellation, a thread that ignores the plugin's stop flag): the worker *process
   ends*, so the work ends with it. It never reports such an item released; the coordinator
   expires the member and holds its items until its session deadline plus B.
3. Whatever happens to the event loop (a plugin blocking it, stops begun late after a pause),
   nothing of this worker may run past its *lease end* (send time of its last successful
   heartbeat plus the session timeout; never later than the coordinator's session deadline)
   plus B, less a small margin for the exit itself: if an instance still runs or stops then,
   the process ends.

(2) and (3) are enforced by :class:`FailStopGuard`, a daemon thread that does not need the
event loop: it computes the earliest deadline from a probe of the worker's state and calls the
fail action at that instant. The loop also detects (2) itself (an ``asyncio`` timeout) and calls
the same action; whichever comes first acts, once.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

FAIL_STOP_EXIT = 3
"""The exit status of a worker process that ended itself by the fail-stop rule."""

Probe = Callable[[], "tuple[int, str] | None"]
"""Returns the earliest deadline (ms, the worker's clock) and why, or None for none."""


def exit_process(reason: str) -> None:
    """The default fail action: end the process at once (no cleanup: a plugin that does not stop
    must not get another chance to run)."""
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - exiting regardless
            pass
    os._exit(FAIL_STOP_EXIT)


class FailStopGuard:
    """A daemon thread that calls ``fail(reason)`` once, when the probe's deadline has passed."""

    def __init__(self, probe: Probe, fail: Callable[[str], None], clock: Callable[[], int],
                 idle_wait_s: float = 1.0) -> None:
        self._probe = probe
        self._fail = fail
        self._clock = clock
        self._idle = idle_wait_s
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.fired: str | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="connect-worker-fail-stop",
                                            daemon=True)
            self._thread.start()

    def poke(self) -> None:
        """A deadline may have come earlier: re-read the probe now."""
        with self._cv:
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2)
        self._thread = None

    def check(self) -> str | None:
        """One evaluation: the reason if the deadline has passed (also used by tests)."""
        found = self._probe()
        if found is not None and self._clock() >= found[0]:
            return found[1]
        return None

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._closed:
                    return
                found = self._probe()
                now = self._clock()
                if found is None or now < found[0]:
                    wait = self._idle if found is None else min(self._idle, (found[0] - now) / 1000)
                    self._cv.wait(max(0.0, wait))
                    continue
            # Re-check outside the lock (the loop may have stopped the instance meanwhile).
            reason = self.check()
            if reason is None:
                continue
            self.fired = reason
            self._fail(reason)
            return
