"""Analysis of start/stop records: who ran which item when, and what that cost.

The records are the JSON lines of the worker client's recording plugin
(``worker_client.examples.recording``) and of the tooz peer (``bench/_tooz_worker.py``), one
per start or stop of an item on a worker process::

    {"ts": 1763820000.123456, "worker": "w1", "item": "job/2", "event": "start", "pid": 4242}

:func:`timeline` turns them into per-item intervals ``[start, stop)`` on each process (the same
rules as ``tests/test_worker_e2e.py``'s analyzer: a SIGKILLed process's open intervals end at the
instant it was seen dead). An item is **owned** by a process from its start record to its stop
record. A process stopped with SIGSTOP cannot write anything while it is stopped, so it keeps
owning its items until it writes their stop records after SIGCONT; that *is* the real double
ownership of a paused "zombie": when it resumes it carries on with those items until it notices
it lost them. An item is **running** at an instant if an owner of it is not paused then.

Over a window ``[t0, t1]`` and a set of items, :meth:`Timeline.window` measures:

* ``double_owned_s``: summed over items, the seconds an item had two or more owners;
* ``downtime_s``: summed over items, the seconds an item was not running anywhere;
* ``covered_after_s``: from ``t0`` until every item is owned exactly once and running, for good
  (to ``t1``); ``None`` if that is not the case at ``t1``;
* ``moves``: starts of an item on a worker (by name, not process: a restarted or resumed worker
  is the same worker) other than the one that ran it last.

:func:`min_moves` is the fewest moves an event forces on any system.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# pid -> the [stopped, continued) windows of that process (continued None: still stopped)
Pauses = Mapping[int, Sequence[tuple[float, float | None]]]


def read(path: Path) -> list[dict[str, Any]]:
    """The records of a file (a torn last line, being written, is skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


@dataclass
class Interval:
    item: str
    worker: str
    pid: int
    start: float
    stop: float | None = None  # None: still owned
    end: str = "open"  # "stop" (recorded), "kill" (SIGKILLed), "exit" (exited without a stop), "open"


@dataclass
class Window:
    """What happened to a set of items in ``[t0, t1]`` (see the module docstring)."""

    t0: float
    t1: float
    double_owned_s: float
    downtime_s: float
    covered_after_s: float | None
    moves: int
    double_owned_items: int  # items that had two owners at some instant
    max_double_owned: int  # most items double-owned at one instant


@dataclass
class Timeline:
    intervals: list[Interval]
    problems: list[str] = field(default_factory=list)

    def by_item(self) -> dict[str, list[Interval]]:
        out: dict[str, list[Interval]] = {}
        for iv in self.intervals:
            out.setdefault(iv.item, []).append(iv)
        for ivs in out.values():
            ivs.sort(key=lambda iv: iv.start)
        return out

    def owners_at(self, t: float, pauses: Pauses | None = None) -> dict[str, list[tuple[str, bool]]]:
        """Per item, its owners at ``t`` as (worker, running) pairs."""
        pauses = pauses or {}
        out: dict[str, list[tuple[str, bool]]] = {}
        for iv in self.intervals:
            if iv.start <= t < (math.inf if iv.stop is None else iv.stop):
                out.setdefault(iv.item, []).append((iv.worker, not _paused(pauses, iv.pid, t)))
        return out

    def segments(self, item_intervals: Sequence[Interval], t0: float, t1: float,
                 pauses: Pauses | None = None) -> list[tuple[float, float, int, int]]:
        """``[a, b)`` pieces of ``[t0, t1]`` with (owners, running owners) constant in each."""
        pauses = pauses or {}
        cuts = {t0, t1}
        for iv in item_intervals:
            cuts.update(t for t in (iv.start, iv.stop) if t is not None and t0 < t < t1)
            for a, b in pauses.get(iv.pid, ()):
                cuts.update(t for t in (a, b) if t is not None and t0 < t < t1)
        points = sorted(cuts)
        out = []
        for a, b in zip(points, points[1:], strict=False):
            mid = (a + b) / 2
            owners = [iv for iv in item_intervals
                      if iv.start <= mid < (math.inf if iv.stop is None else iv.stop)]
            live = sum(1 for iv in owners if not _paused(pauses, iv.pid, mid))
            out.append((a, b, len(owners), live))
        return out

    def window(self, items: Iterable[str], t0: float, t1: float, pauses: Pauses | None = None) -> Window:
        by_item = self.by_item()
        double = down = 0.0
        covered_at = t0
        complete_at_end = True
        double_items = 0
        spans: list[tuple[float, int]] = []  # (instant, +1/-1) of double ownership, for the max
        for item in items:
            segs = self.segments(by_item.get(item, []), t0, t1, pauses)
            had_double = False
            for a, b, owners, live in segs:
                if owners >= 2:
                    double += b - a
                    had_double = True
                    spans += [(a, 1), (b, -1)]
                if live == 0:
                    down += b - a
                if not (owners == 1 and live == 1):
                    covered_at = max(covered_at, b)
            double_items += had_double
            if not segs or not (segs[-1][2] == 1 and segs[-1][3] == 1):
                complete_at_end = False
        most = current = 0
        for _, step in sorted(spans, key=lambda s: (s[0], s[1])):  # ends before starts at a tie
            current += step
            most = max(most, current)
        return Window(t0=t0, t1=t1, double_owned_s=double, downtime_s=down,
                      covered_after_s=(covered_at - t0) if complete_at_end else None,
                      moves=self.moves(items, t0, t1), double_owned_items=double_items,
                      max_double_owned=most)

    def moves(self, items: Iterable[str], t0: float, t1: float) -> int:
        """Starts in ``[t0, t1]`` of an item on a worker other than the one that ran it last."""
        by_item = self.by_item()
        count = 0
        for item in items:
            last: str | None = None
            for iv in by_item.get(item, []):
                if t0 <= iv.start <= t1 and last is not None and iv.worker != last:
                    count += 1
                last = iv.worker
        return count

    def holders(self, t: float) -> dict[str, str]:
        """item -> worker for the items owned by exactly one worker at ``t``."""
        return {item: ws[0][0] for item, ws in self.owners_at(t).items() if len(ws) == 1}


def _paused(pauses: Pauses, pid: int, t: float) -> bool:
    return any(a <= t < (math.inf if b is None else b) for a, b in pauses.get(pid, ()))


def timeline(records: Iterable[Mapping[str, Any]], ended: Mapping[int, tuple[float, str]] = {}) -> Timeline:
    """Per item and worker process, the intervals [start, stop) of the records.

    ``ended`` maps the pid of a process that is gone to (instant, how): ``"kill"`` (SIGKILL: it
    could not record its stops, so its open intervals end at that instant) or ``"exit"`` (it
    exited by itself: an open interval is an item abandoned without a stop, a problem; it is
    closed at that instant). A stop without a start, or a second start of an item by the same
    process before its stop, is a problem too.
    """
    result = Timeline([])
    open_: dict[tuple[str, int, str], Interval] = {}
    for e in sorted(records, key=lambda r: r["ts"]):
        key = (e["item"], e["pid"], e["worker"])
        if e["event"] == "start":
            if key in open_:
                result.problems.append(f"{e['item']} started twice by pid {e['pid']} ({e['worker']})")
                continue
            iv = Interval(e["item"], e["worker"], e["pid"], e["ts"])
            open_[key] = iv
            result.intervals.append(iv)
        elif e["event"] == "stop":
            stopped = open_.pop(key, None)
            if stopped is None:
                result.problems.append(f"{e['item']} stopped by pid {e['pid']} without a start")
                continue
            stopped.stop, stopped.end = e["ts"], "stop"
        else:
            result.problems.append(f"unknown event {e!r}")
    for (item, pid, _worker), iv in open_.items():
        if pid in ended:
            at, how = ended[pid]
            iv.stop, iv.end = max(at, iv.start), how
            if how != "kill":
                result.problems.append(f"{item} still running when pid {pid} ({iv.worker}) exited")
    return result


def min_moves(before: Mapping[str, str], workers_before: Iterable[str], workers_after: Iterable[str]) -> int:
    """The fewest moves an event forces on any system that keeps every item running and gives
    each worker a fair share: every item of a worker that left, plus, for each worker that
    joined, the floor of its share (items / workers after). A worker that is back under its
    name (a restart, a resumed pause) forces nothing."""
    before_set, after_set = set(workers_before), set(workers_after)
    gone = before_set - after_set
    new = after_set - before_set
    total = sum(1 for w in before.values() if w in gone)
    if after_set:
        total += len(new) * (len(before) // len(after_set))
    return total
