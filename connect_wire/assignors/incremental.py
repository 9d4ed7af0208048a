"""Kafka Connect's IncrementalCooperativeAssignor (KIP-415), declarative, as a pure client-side
assignor. ``docs/assignors.md`` has the rules, the state format and the differences from Connect.

One computation, in short:

1. **Keep** what every member's current target holds (configured items only; an item in two
   targets stays with one of them).
2. Items in no target are **returned to their previous holder** when it is back: the member (by
   member id, or by instance id under a new member id) that held them when the last target was
   computed, or whose work is held for it. Otherwise an item a current member reports as running
   (owned) stays with it.
3. The rest of a **departed** member's work (the previous target recorded it there, the member
   left) is **held** — in nobody's target — until ``departure + max_delay_ms``; the result asks
   for a rebalance at the earliest deadline. When a deadline passes (inclusive), the held work
   goes first to the members that joined since that departure, then is spread.
   ``max_delay_ms == 0``: reassigned at once.
4. New items (and everything else unplaced) go to the least loaded member, one level at a time.
5. With nothing held, connectors and tasks are **balanced separately** (every member gets floor
   or ceil of total / members of each) moving the minimum number of items: the ceil slots go to
   the members holding the most, an over-full member gives up what is cheapest to move (items it
   does not run yet first, then its highest-sorted items). While work is held nothing that is
   assigned moves (Connect: no load-balancing revocations during a delay); new work is still
   placed.

The assignor state (opaque to the coordinator, persisted with every install) records the members
of the computation, who holds which item (so the work of a member that departs before the next
computation is known, even if several depart together) and the held work with its deadlines.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import orjson

from connect_wire.items import CONNECTOR, Item

from ._gc import gc_paused
from .api import AssignorMetadata, GroupAssignment, GroupSpec, MemberAssignmentInfo, MemberTarget

STATE_VERSION = 1
DEFAULT_MAX_DELAY_MS = 300_000  # Connect's scheduled.rebalance.max.delay.ms default (5 minutes)
COMPRESS_ABOVE = 1024  # states larger than this many JSON bytes are stored zlib-compressed

_new = tuple.__new__


def _items(name: str, tasks: Iterable[int]) -> list[Item]:
    return list(map(_new, repeat(Item), zip(repeat(name), tasks, strict=False)))


# == state ==========================================================================================


@dataclass
class HeldWork:
    """Work of a departed member, in nobody's target until ``deadline`` (or its return)."""

    member_id: str
    instance_id: str | None
    first_seen: int  # the computation that first saw the member (inherited if it comes back)
    since: int  # the computation that noticed its departure
    since_ms: int  # ... and its time
    deadline_ms: int
    items: set[Item] = field(default_factory=set)


def _kept_for(pending: Iterable[HeldWork]) -> dict[str, tuple[str | None, frozenset[Item]]]:
    """The result's ``kept_for``: the held work per departed member."""
    out: dict[str, tuple[str | None, frozenset[Item]]] = {}
    for h in pending:
        instance_id, items = out.get(h.member_id, (h.instance_id, frozenset()))
        out[h.member_id] = (instance_id, items | h.items)
    return out


@dataclass
class AssignorState:
    """The decoded assignor state (``docs/assignors.md``, "State")."""

    computation: int = 0  # computations so far (the counter of "first seen" and "since")
    members: list[tuple[str, str | None, int]] = field(default_factory=list)  # id, instance, first seen
    owners: dict[str, list[int]] = field(default_factory=dict)  # connector -> owner index per item
    held: list[HeldWork] = field(default_factory=list)


def _items_to_json(items: Iterable[Item]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for c, t in sorted(items):
        out.setdefault(c, []).append(t)
    return out


def encode_state(state: AssignorState) -> bytes:
    """Compact JSON (sorted keys), zlib-compressed when larger than ``COMPRESS_ABOVE`` bytes."""
    doc: dict[str, Any] = {
        "v": STATE_VERSION,
        "computation": state.computation,
        "members": [list(m) for m in state.members],
        "owners": state.owners,
        "held": [
            {
                "member": h.member_id, "instance": h.instance_id, "first_seen": h.first_seen,
                "since": h.since, "since_ms": h.since_ms, "deadline_ms": h.deadline_ms,
                "items": _items_to_json(h.items),
            }
            for h in state.held
        ],
    }
    raw = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    return zlib.compress(raw, 6) if len(raw) > COMPRESS_ABOVE else raw


def state_json(data: bytes) -> dict[str, Any] | None:
    """The state document of ``data`` (plain or compressed JSON); None if empty or unreadable."""
    if not data:
        return None
    try:
        raw = data if data[:1] == b"{" else zlib.decompress(data)
        doc = orjson.loads(raw)
    except (zlib.error, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("v") != STATE_VERSION:
        return None
    return doc


def decode_state(data: bytes) -> AssignorState | None:
    """The state saved by the last install; None when there is none or it cannot be read (then
    the assignor starts afresh: like a new Connect leader, it holds nothing)."""
    doc = state_json(data)
    if doc is None:
        return None
    try:
        return AssignorState(
            computation=int(doc["computation"]),
            members=[(str(m), i, int(s)) for m, i, s in doc["members"]],
            owners={str(c): list(o) for c, o in doc["owners"].items()},
            held=[
                HeldWork(
                    member_id=h["member"], instance_id=h["instance"], first_seen=int(h["first_seen"]),
                    since=int(h["since"]), since_ms=int(h["since_ms"]), deadline_ms=int(h["deadline_ms"]),
                    items={_new(Item, (c, int(t))) for c, ts in h["items"].items() for t in ts},
                )
                for h in doc["held"]
            ],
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def held_items(data: bytes) -> dict[str, frozenset[Item]]:
    """Held work recorded in an assignor state: departed member id -> items."""
    state = decode_state(data)
    return {h.member_id: frozenset(h.items) for h in state.held} if state else {}


# == placement ======================================================================================


def _fill(
    items: list[Item], members: Iterable[str], count: dict[str, int], cap: dict[str, int] | None,
    out: dict[str, list[Item]],
) -> int:
    """Deal ``items`` (in order) to the least loaded of ``members``: one item to every member at
    the lowest load, then the level rises (ties by member id), never past ``cap``. Updates
    ``count`` and ``out``; returns how many items were dealt. O(items + members log members)."""
    eligible = sorted(
        (m for m in members if cap is None or count[m] < cap[m]), key=lambda m: (count[m], m)
    )
    total, i, j = len(items), 0, 0
    if not eligible or not total:
        return 0
    active: list[str] = []
    level = count[eligible[0]]
    while i < total:
        while j < len(eligible) and count[eligible[j]] <= level:
            active.append(eligible[j])
            j += 1
        if not active:
            if j == len(eligible):
                break
            level = count[eligible[j]]
            continue
        still: list[str] = []
        for m in active:
            if i == total:
                break
            out[m].append(items[i])
            i += 1
            c = count[m] + 1
            count[m] = c
            if cap is None or c < cap[m]:
                still.append(m)
        active = still
        level += 1
    return i


class _Kind:
    """Placement of one kind of item (connectors, or tasks): counts per member and the changes."""

    def __init__(self, members: list[str], is_connector: bool, connector_items: frozenset[Item]) -> None:
        self.members = members
        self.is_connector = is_connector
        self.connector_items = connector_items  # every configured connector item
        self.count: dict[str, int] = dict.fromkeys(members, 0)
        self.pool: list[Item] = []  # to place anywhere
        self.preferred: list[tuple[list[Item], list[str]]] = []  # (items, members to prefer)
        self.added: dict[str, list[Item]] = {m: [] for m in members}

    def place(
        self, balance: bool, target: Mapping[str, frozenset[Item]], owned: Mapping[str, frozenset[Item]],
        removed: dict[str, set[Item]],
    ) -> None:
        count, added = self.count, self.added
        cap: dict[str, int] | None = None
        if balance and self.members:
            total = sum(count.values()) + len(self.pool) + sum(len(i) for i, _ in self.preferred)
            q, r = divmod(total, len(self.members))
            # Ceil slots: to the members holding the most (fewest moves); among equals, to the
            # members held work prefers (it then goes to them), then by member id.
            wanted = {m for _, prefer in self.preferred for m in prefer}
            order = sorted(self.members, key=lambda m: (-count[m], m not in wanted, m))
            cap = {m: q + 1 if k < r else q for k, m in enumerate(order)}
            for m in order:
                if count[m] <= q:
                    break  # sorted by count: nobody further down is over its cap
                excess = count[m] - cap[m]
                if excess > 0:
                    self.pool.extend(self._shed(m, excess, target[m], owned[m], removed))
                    count[m] = cap[m]
        for items, prefer in self.preferred:
            items.sort()
            dealt = _fill(items, prefer, count, cap, added)
            self.pool.extend(items[dealt:])
        if self.pool:
            self.pool.sort()
            dealt = _fill(self.pool, self.members, count, cap, added)
            assert dealt == len(self.pool), "every unplaced item has a place"

    def _shed(
        self, m: str, excess: int, target: frozenset[Item], owned: frozenset[Item],
        removed: dict[str, set[Item]],
    ) -> list[Item]:
        """Take ``excess`` items of this kind from member ``m``, the cheapest to move first:
        items it does not run yet (not in its owned list) before items it runs, items that were
        not in its target (given back this round) before targeted ones; within each, its
        highest-sorted items."""
        conns = self.connector_items
        mine = target & conns if self.is_connector else target - conns
        gone = removed.get(m)
        if gone:
            mine = mine - gone
        extra = self.added[m]
        groups: tuple[Callable[[], Iterable[Item]], ...] = (
            lambda: [i for i in extra if i not in owned], lambda: mine - owned,
            lambda: [i for i in extra if i in owned], lambda: mine & owned,
        )
        shed: list[Item] = []
        for group in groups:
            if len(shed) == excess:
                break
            shed.extend(heapq.nlargest(excess - len(shed), group()))
        drop = set(shed)
        if extra:
            self.added[m] = [i for i in extra if i not in drop]
        removed.setdefault(m, set()).update(drop)
        return shed


# == the assignor ===================================================================================


class IncrementalCooperativeAssignor:
    """KIP-415's incremental cooperative assignment, declarative, with a persisted delay."""

    name = "incremental"
    minimum_version = 1
    maximum_version = 1

    def __init__(self, max_delay_ms: int = DEFAULT_MAX_DELAY_MS) -> None:
        if max_delay_ms < 0:
            raise ValueError("max_delay_ms must be >= 0")
        self.max_delay_ms = max_delay_ms
        self.last_assignment: MemberAssignmentInfo | None = None

    def metadata(self) -> AssignorMetadata:
        return AssignorMetadata(reason=0, version=self.maximum_version, data=b"")

    def on_assignment(self, assignment: MemberAssignmentInfo) -> None:
        self.last_assignment = assignment

    def assign(self, group: GroupSpec) -> GroupAssignment:
        with gc_paused():
            return self._assign(group)

    def _assign(self, group: GroupSpec) -> GroupAssignment:
        now = group.coordinator_time_ms
        specs = group.members
        connectors = group.connectors
        members = sorted(specs)
        state = decode_state(group.assignor_state) or AssignorState()
        if not members:
            # Nobody to assign to (the coordinator does not ask then): keep the state, and keep
            # a follow-up scheduled if there is work.
            return GroupAssignment(members={}, assignor_state=group.assignor_state,
                                   scheduled_rebalance_delay_ms=0 if connectors else -1)

        # -- 1. keep what the targets hold ------------------------------------------------------
        target = {m: specs[m].target for m in members}
        owner_of: dict[Item, str] = {}
        for m in members:
            owner_of.update(dict.fromkeys(target[m], m))
        removed: dict[str, set[Item]] = {}
        if sum(len(t) for t in target.values()) != len(owner_of):
            self._resolve_duplicates(members, specs, owner_of, removed)
        connector_set = frozenset(map(_new, repeat(Item), zip(connectors, repeat(CONNECTOR))))
        conns = _Kind(members, True, connector_set)
        tasks = _Kind(members, False, connector_set)
        targeted: dict[str, int] = {}
        unknown: list[Item] = []
        conn_count, task_count = conns.count, tasks.count
        for item, m in owner_of.items():
            c, t = item
            n = connectors.get(c)
            if n is None or t >= n:
                unknown.append(item)
                continue
            targeted[c] = targeted.get(c, 0) + 1
            if t == CONNECTOR:
                conn_count[m] += 1
            else:
                task_count[m] += 1
        for item in unknown:  # deleted connectors, tasks beyond a shrunk task count
            removed.setdefault(owner_of.pop(item), set()).add(item)

        # -- 2. items in no target, in sorted order -------------------------------------------
        unplaced: list[Item] = []
        for c in sorted(connectors):
            n = connectors[c]
            if targeted.get(c, 0) == n + 1:
                continue
            unplaced.extend(_items(c, [t for t in range(CONNECTOR, n) if (c, t) not in owner_of]))

        # -- 3. who gets them back, what stays held ----------------------------------------------
        computation = state.computation + 1
        by_instance = {s.instance_id: m for m, s in specs.items() if s.instance_id is not None}
        first_seen: dict[str, int] = {}
        prev_index: dict[int, str | None] = {}  # state member index -> current member, or None
        departed: dict[int, HeldWork] = {}
        for k, (mid, inst, seen) in enumerate(state.members):
            back: str | None = (
                mid if mid in specs else by_instance.get(inst) if inst is not None else None)
            prev_index[k] = back
            if back is not None:
                first_seen.setdefault(back, seen)
            elif self.max_delay_ms > 0:
                departed[k] = HeldWork(mid, inst, seen, computation, now, now + self.max_delay_ms)
        held_of: dict[Item, HeldWork] = {}
        returning: dict[int, str] = {}
        for k, h in enumerate(state.held):
            h.deadline_ms = min(h.deadline_ms, h.since_ms + self.max_delay_ms)
            back = h.member_id if h.member_id in specs else (
                by_instance.get(h.instance_id) if h.instance_id is not None else None)
            if back is not None:
                returning[k] = back
                first_seen.setdefault(back, h.first_seen)
            for item in h.items:
                held_of[item] = h
            h.items = set()
        for m in members:
            first_seen.setdefault(m, computation)
        returning_of = {id(state.held[k]): m for k, m in returning.items()}

        owned_extra = self._owned_extra(members, specs) if unplaced else {}
        general: list[Item] = []
        if not held_of and not state.owners and not owned_extra:
            general = unplaced  # nothing to give back, nothing held: all new (a fresh start)
            unplaced = []
        for item in unplaced:
            back = None
            hold: HeldWork | None = None
            held = held_of.get(item)
            if held is not None:
                back = returning_of.get(id(held))
                hold = held
            else:
                owners = state.owners.get(item[0])
                k = owners[item[1] + 1] if owners is not None and item[1] + 1 < len(owners) else -1
                if k >= 0:
                    back = prev_index.get(k)
                    if back is None:
                        hold = departed.get(k)
            if back is None:
                back = owned_extra.get(item)
            if back is not None:
                kind = conns if item[1] == CONNECTOR else tasks
                kind.added[back].append(item)
                kind.count[back] += 1
            elif hold is not None:
                hold.items.add(item)
            else:
                general.append(item)

        # -- 4. deadlines: held on, or released (first to the members that joined since) -------
        pending: list[HeldWork] = []
        entries = [h for k, h in enumerate(state.held) if k not in returning]
        entries.extend(departed.values())
        entries.sort(key=lambda h: (h.since, h.member_id))
        for h in entries:
            if not h.items:
                continue
            if h.deadline_ms > now:
                pending.append(h)
                continue
            joined = [m for m in members if first_seen[m] >= h.since]
            for kind in (conns, tasks):
                mine = [i for i in h.items if (i[1] == CONNECTOR) == kind.is_connector]
                if mine and joined:
                    kind.preferred.append((mine, joined))
                else:
                    kind.pool.extend(mine)
        conns.pool.extend([i for i in general if i[1] == CONNECTOR])
        tasks.pool.extend([i for i in general if i[1] != CONNECTOR])

        # -- 5. place; balance only when nothing is held --------------------------------------
        balance = not pending
        owned = {m: specs[m].owned for m in members}
        conns.place(balance, target, owned, removed)
        tasks.place(balance, target, owned, removed)

        # -- 6. the result and the state ------------------------------------------------------
        result: dict[str, MemberTarget] = {}
        final: dict[str, frozenset[Item]] = {}
        for m in members:
            items = target[m]
            gone = removed.get(m)
            if gone:
                items = items - gone
            new = conns.added[m] + tasks.added[m]
            if new:
                items = items.union(new)
            final[m] = items
            result[m] = MemberTarget(items)
        owners_out = {c: [-1] * (n + 1) for c, n in connectors.items()}
        for k, m in enumerate(members):
            for c, t in final[m]:
                owners_out[c][t + 1] = k
        new_state = AssignorState(
            computation=computation,
            members=[(m, specs[m].instance_id, first_seen[m]) for m in members],
            owners=owners_out,
            held=pending,
        )
        # (capped: a coordinator clock that went back must not stretch the wait)
        delay = min(self.max_delay_ms, max(0, min(h.deadline_ms for h in pending) - now)) if pending else -1
        return GroupAssignment(
            members=result, assignor_state=encode_state(new_state), scheduled_rebalance_delay_ms=delay,
            kept_for=_kept_for(pending),
        )

    @staticmethod
    def _resolve_duplicates(
        members: list[str], specs: Mapping[str, Any], owner_of: dict[Item, str],
        removed: dict[str, set[Item]],
    ) -> None:
        """An item in several targets (never from the coordinator, which validates installs)
        stays with a holder that also runs it, else with the smallest member id."""
        holders: dict[Item, list[str]] = {}
        for m in members:
            for item in specs[m].target:
                holders.setdefault(item, []).append(m)
        for item, ms in holders.items():
            if len(ms) < 2:
                continue
            running = [m for m in ms if item in specs[m].owned]
            keep = (running or ms)[0]
            owner_of[item] = keep
            for m in ms:
                if m != keep:
                    removed.setdefault(m, set()).add(item)

    @staticmethod
    def _owned_extra(members: list[str], specs: Mapping[str, Any]) -> dict[Item, str]:
        """Items members report running that are in none of their targets; an item several
        report (a stale worker) goes with the smallest member id."""
        out: dict[Item, str] = {}
        for m in members:
            s = specs[m]
            if s.owned:
                for item in s.owned - s.target:
                    out.setdefault(item, m)
        return out
