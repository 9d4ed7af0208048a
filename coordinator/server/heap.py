"""Giving the C heap's free pages back to the system after TLS connections end.

Every TLS connection allocates outside Python: uvloop's SSLProtocol a 256 KiB read buffer,
OpenSSL its connection state and record buffers (the stdlib loop's SSL transport does the same,
with its buffer zero-filled). glibc's malloc frees them into its heap but does not give the
pages back (they are not at the top of the heap), and the next connections touch other free
pages: waves of TLS connections ratcheted the daemon's RSS (measured: 52 -> 180 MB over ten
waves of 2,000 handshakes) with nothing live. ``malloc_trim(0)`` returns every free page (the
RSS went back to the baseline); it walks the heap (11 ms on a 170 MB heap here), so it runs at
most every ``interval_s``, and only while TLS connections were opened or closed recently.

Without glibc (musl, macOS) there is no ``malloc_trim``: :class:`HeapTrimmer` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


class HeapTrimmer:
    """``churn(now)`` when a TLS connection is accepted or lost; ``maybe_trim(now)`` (a timer)
    trims when ``interval_s`` passed since the last trim and there was churn after
    ``settle_s`` before it (a connection accepted then may have been closed by its handshake
    timeout since, without a ``churn`` of its own). Time is passed in."""

    def __init__(self, interval_s: float, settle_s: float,
                 trim: Callable[[int], int] | None = None) -> None:
        self.interval_s = interval_s
        self.settle_s = settle_s
        self._trim = trim if trim is not None else _malloc_trim()
        self._churn_at: float | None = None
        self._trimmed_at = float("-inf")
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def churn(self, now: float) -> None:
        self._churn_at = now

    def maybe_trim(self, now: float) -> bool:
        if self._trim is None or self._churn_at is None:
            return False
        if now - self._trimmed_at < self.interval_s:
            return False
        if self._churn_at + self.settle_s < self._trimmed_at:
            return False  # nothing opened or closed since the last trim could have freed
        self._trim(0)
        self._trimmed_at = now
        self.trims += 1
        return True
