"""The vocabulary of instance states (a worker's report of each connector and task it runs),
shared by the worker that sends them and the coordinator that keeps them.

``State`` is one of :data:`STATES`. ``ErrorMessage`` and ``Trace`` are at most
:data:`TEXT_LIMIT_BYTES` bytes of UTF-8 each: a longer text is cut by :func:`utf8_tail`, which
keeps its end (a traceback's innermost frames and the error itself) behind :data:`CUT_MARK`.
A text UTF-8 cannot encode (lone surrogates: a file name the OS gave back undecodable) is made
encodable first by :func:`encodable`.
"""

from __future__ import annotations

from typing import Final

RUNNING: Final = "RUNNING"
FAILED: Final = "FAILED"
RESTARTING: Final = "RESTARTING"
PAUSED: Final = "PAUSED"
STOPPED: Final = "STOPPED"
"""PAUSED and STOPPED: the worker owns the item of a paused or stopped connector and runs no
instance of it (any instance it ran has stopped: its last commit is stored)."""
STATES: Final = frozenset((RUNNING, FAILED, RESTARTING, PAUSED, STOPPED))

TEXT_LIMIT_BYTES: Final = 8192
"""The most UTF-8 bytes of one ErrorMessage or Trace that is sent and kept."""
CUT_MARK: Final = "...(truncated)\n"
"""What a cut text starts with (counted in its limit)."""


def encodable(text: str) -> str:
    """``text`` with any lone surrogate (``os.fsdecode`` of undecodable bytes, ``\\udcff``) written
    as its escape, so that it can be sent: a string field is UTF-8 on the wire."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def utf8_tail(text: str, limit: int = TEXT_LIMIT_BYTES, mark: str = CUT_MARK) -> str:
    """``text`` if its UTF-8 takes at most ``limit`` bytes, else ``mark`` followed by the longest
    end of ``text`` that fits ``limit`` bytes together with it, cut on a character boundary."""
    if len(text) * 4 <= limit:  # (no character takes more than 4 bytes: nothing to count)
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    head = mark.encode("utf-8")
    tail = data[len(data) - max(limit - len(head), 0):]
    start = 0
    while start < len(tail) and tail[start] & 0xC0 == 0x80:  # a continuation byte
        start += 1
    return mark + tail[start:].decode("utf-8", "surrogatepass")
