"""What the admin CLI and the worker's REST API both make of a ConnectGroupDescribe answer and
of Connect's verbs and offsets (no I/O): a group as ``groups describe --json`` prints it (the
worker's status page serves the same), a connector's status, its running task count, a verb's
config change, source offsets in canonical JSON.

``Describe`` values are the generated message objects (``ConnectGroupDescribeResponse``'s
groups, connectors and members), read by attribute.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from typing import Any

from connect_wire import verbs
from connect_wire.errors import error_name


class UnknownConnector(LookupError):
    """The group has no connector of that name."""


class UnknownTask(LookupError):
    """The connector has no task of that number."""


class BadOffsets(ValueError):
    """An offsets document that is not ``{"offsets": [{"partition": {...}, "offset": ...}]}``."""


def items(a: Any) -> list[str]:
    """An assignment's items as text (``A``, ``A/2``)."""
    return [*a.connectors, *(f"{t.connector}/{t.task}" for t in a.tasks)]


def item_name(connector: str, task: int) -> str:
    return connector if task < 0 else f"{connector}/{task}"


def running_tasks(c: Any) -> int:
    """A connector's running task count: as many as the task configs its connector instance
    wrote (at most the configured count), or the configured count before it wrote any."""
    return c.task_count if c.task_configs is None else min(len(c.task_configs), c.task_count)


def tokens(m: Any) -> dict[str, int]:
    """A member's fencing token per owned item."""
    return {item_name(t.connector, t.task): t.token for t in m.fencing_tokens}


HEARTBEAT_MARGIN_MS = 1_000
"""How late past its heartbeat interval a member's heartbeat may be before it counts as
overdue: a round trip and a busy event loop on either side stay well below it."""


def last_heartbeat_ms_ago(m: Any) -> int | None:
    """How long before the describe the coordinator last heard from member ``m`` (None:
    unknown, e.g. the coordinator loaded the group since and has not heard from it yet)."""
    return m.last_heartbeat_ms_ago if m.last_heartbeat_ms_ago >= 0 else None


def heartbeat_overdue(g: Any, m: Any) -> bool:
    """Has member ``m`` of described group ``g`` missed its heartbeats: none for more than
    the group's heartbeat interval plus :data:`HEARTBEAT_MARGIN_MS`? (It stays a member, its
    work shown as running, until its session timeout ends.)"""
    ago = last_heartbeat_ms_ago(m)
    return ago is not None and g.heartbeat_interval_ms >= 0 and (
        ago > g.heartbeat_interval_ms + HEARTBEAT_MARGIN_MS)


def kept_for(g: Any) -> dict[str, Any]:
    """Item -> its ``KeptFor`` entry: left unassigned for a departed member until the
    scheduled rebalance."""
    return {item: k for k in g.kept_for for item in items(k.items)}


def find(g: Any, name: str) -> Any:
    """Connector ``name`` of described group ``g`` (UnknownConnector if it has none)."""
    spec = next((c for c in g.connectors if c.name == name), None)
    if spec is None:
        raise UnknownConnector(f"connector {name} does not exist in group {g.group_id}")
    return spec


def config_of(c: Any) -> dict[str, str | None]:
    """A described connector's stored config (the verbs' reserved keys included)."""
    return {e.name: e.value for e in c.config}


def utc(ms: int) -> str | None:
    """Wall-clock milliseconds as ISO 8601 UTC to the millisecond (None for -1: unknown)."""
    if ms < 0:
        return None
    at = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def group_dict(g: Any) -> dict[str, Any]:
    """A described group as ``connect-coordinator groups describe --json`` prints it (and the
    worker's status page feed serves it)."""
    return {
        "group": g.group_id, "state": g.group_state,
        "error": error_name(g.error_code) if g.error_code else None,
        "error_message": g.error_message, "group_epoch": g.group_epoch,
        "assignment_epoch": g.assignment_epoch, "assignor": g.assignor_name,
        "assigning_member": g.assigning_member_id,
        "connectors": [{"name": c.name, "tasks": c.task_count, "running_tasks": running_tasks(c),
                        "config": {e.name: e.value for e in c.config},
                        # (as the connector instance wrote them; null: never written)
                        "task_configs": None if c.task_configs is None else [
                            {e.name: e.value for e in t.config} for t in c.task_configs]}
                       for c in g.connectors],
        "heartbeat_interval_ms": g.heartbeat_interval_ms if g.heartbeat_interval_ms >= 0 else None,
        "session_timeout_ms": g.session_timeout_ms if g.session_timeout_ms >= 0 else None,
        "members": [{"member_id": m.member_id, "instance_id": m.instance_id,
                     # which protocol the member speaks: "classic" (JoinGroup/SyncGroup/
                     # Heartbeat, with the Connect protocol it uses) or "new"
                     "protocol": "new" if m.classic_protocol is None else "classic",
                     "classic_protocol": m.classic_protocol,
                     "last_heartbeat_ms_ago": last_heartbeat_ms_ago(m),
                     "heartbeat_overdue": heartbeat_overdue(g, m),
                     "worker_url": m.worker_url, "client_id": m.client_id,
                     "client_host": m.client_host, "epoch": m.member_epoch, "state": m.member_state,
                     "assignment": items(m.assignment), "revoking": [*m.revoking_connectors,
                                                             *(f"{t.connector}/{t.task}"
                                                               for t in m.revoking_tasks)],
                     "target": items(m.target_assignment),
                     "fencing_tokens": tokens(m),
                     # (Status) as the worker last reported them, of what it owns
                     "instances": [{"item": item_name(s.connector, s.task), "state": s.state,
                                    "error": s.error_message, "trace": s.trace}
                                   for s in m.instance_states]}
                    for m in g.members],
        # Items held for fenced members: nobody runs them until the hold ends.
        "holds": [{"member_id": h.member_id, "instance_id": h.instance_id,
                   "until_ms": h.held_until_ms if h.held_until_ms >= 0 else None,
                   "until": utc(h.held_until_ms), "items": items(h.items)}
                  for h in g.holds],
        # Items the assignor leaves unassigned for departed members until the scheduled
        # rebalance (after a fenced member's hold, or a member that left).
        "kept_for": [{"member_id": k.member_id, "instance_id": k.instance_id,
                      "until_ms": k.until_ms if k.until_ms >= 0 else None,
                      "until": utc(k.until_ms), "items": items(k.items)}
                     for k in g.kept_for],
    }


def status(g: Any, name: str) -> dict[str, Any]:
    """Each instance of connector ``name`` (the connector, then its running tasks: as many as
    the task configs its connector instance wrote, else the configured count) with the member
    that owns it, the item's fencing token there, and the state that member's worker reported:
    RUNNING, FAILED or RESTARTING (with the last error and its trace); PAUSED or STOPPED when
    owned and the connector's target state is that (nothing runs); ASSIGNED when owned with no
    state reported yet (starting, or the coordinator restarted and the worker has not reported
    again); HELD while held for a fenced member; UNASSIGNED when nobody owns it.

    ``worker_heartbeat_overdue``: the owner missed its heartbeats (a dead worker's instances
    still show its last report until its session ends), ``worker_last_heartbeat_ms_ago`` how
    long ago the coordinator heard from it. ``kept_for``: ``{member_id, instance_id,
    until_ms}`` of the departed member the assignor keeps the item for until the scheduled
    rebalance (coordinator wall-clock ms), else None."""
    spec = find(g, name)
    target = verbs.target_state(config_of(spec))
    # A PAUSED or STOPPED connector's items stay owned with no instance running (nothing is
    # reported for them): shown as the target state, as Kafka Connect's status does.
    idle = "ASSIGNED" if target == verbs.RUNNING else target
    owners: dict[str, Any] = {}
    states: dict[str, Any] = {}
    fencing: dict[str, int] = {}
    for m in g.members:
        fencing.update(tokens(m))
        for item in (*items(m.assignment), *m.revoking_connectors,
                     *(f"{t.connector}/{t.task}" for t in m.revoking_tasks)):
            owners[item] = m
        for s in m.instance_states:
            states[item_name(s.connector, s.task)] = s
    held = {item: h for h in g.holds for item in items(h.items)}
    kept = kept_for(g)

    def one(item: str) -> dict[str, Any]:
        m = owners.get(item)
        s = states.get(item) if m is not None else None
        k = kept.get(item) if m is None else None
        seen = {"worker_heartbeat_overdue": m is not None and heartbeat_overdue(g, m),
                "worker_last_heartbeat_ms_ago": None if m is None else last_heartbeat_ms_ago(m),
                "kept_for": None if k is None else {
                    "member_id": k.member_id, "instance_id": k.instance_id,
                    "until_ms": k.until_ms if k.until_ms >= 0 else None}}
        if m is None:
            h = held.get(item)
            return {"state": "HELD" if h is not None else "UNASSIGNED",
                    "member_id": h.member_id if h is not None else None,
                    "instance_id": h.instance_id if h is not None else None,
                    "worker_url": None, "fencing_token": None, "error": None, "trace": None,
                    **seen}
        if target != verbs.RUNNING:
            s = None  # paused or stopped: nothing runs, whatever was reported before
        return {"state": s.state if s is not None else idle, "member_id": m.member_id,
                "instance_id": m.instance_id, "worker_url": m.worker_url,
                "fencing_token": fencing.get(item),
                "error": s.error_message if s is not None else None,
                "trace": s.trace if s is not None else None, **seen}

    running = running_tasks(spec)
    return {"group": g.group_id, "connector": name, "target_state": target,
            "running_tasks": running, "configured_tasks": spec.task_count, **one(name),
            "tasks": [{"task": t, **one(f"{name}/{t}")} for t in range(running)]}


def restart_config(config: Mapping[str, str | None], task_count: int, *, connector: bool = False,
                   tasks: tuple[int, ...] = (), everything: bool = False) -> dict[str, str | None]:
    """The config after a restart (read-modify-write of the stored one): ``everything`` bumps
    the restart generation (the connector and all its tasks), ``connector`` the connector
    instance's own counter, ``tasks`` each task's counter (UnknownTask for one the connector
    does not have)."""
    out = dict(config)
    keys = [verbs.RESTART_GENERATION] if everything else []
    if connector:
        keys.append(verbs.RESTART_CONNECTOR)
    for task in tasks:
        if not 0 <= task < task_count:
            raise UnknownTask(f"it has {task_count} task(s), numbered from 0")
        keys.append(verbs.restart_task_key(task))
    for key in keys:
        out[key] = str(verbs.counter(out, key) + 1)
    return out


def state_config(config: Mapping[str, str | None], verb: str) -> dict[str, str | None]:
    """The config after ``pause``, ``resume`` or ``stop``."""
    return {**config, verbs.TARGET_STATE: {"pause": verbs.PAUSED, "resume": verbs.RUNNING,
                                           "stop": verbs.STOPPED}[verb]}


def canonical(obj: Any) -> str:
    """JSON in the canonical form the coordinator stores offsets in (sorted keys, no spaces)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def offset_pairs(doc: Any, where: str,
                 to_text: Callable[[Any, str], str] = lambda obj, _what: canonical(obj)
                 ) -> list[tuple[str, str | None]]:
    """(partition, offset or None) pairs, canonical JSON, of Kafka Connect's offsets document
    ``{"offsets": [{"partition": {...}, "offset": {...} or null}]}`` (BadOffsets naming
    ``where`` for anything else, an empty list included). ``to_text(obj, what)`` makes each
    object's text (the admin CLI checks it as the coordinator will, naming ``what``)."""
    entries = doc.get("offsets") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise BadOffsets(f'{where} must be a JSON object with an "offsets" list: '
                         '{"offsets": [{"partition": {...}, "offset": {...}}]}')
    if not entries:
        raise BadOffsets(f'{where}: "offsets" is empty: nothing to alter')
    pairs: list[tuple[str, str | None]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("partition"), dict):
            raise BadOffsets(f'{where}: offsets[{i}] must be an object with a "partition" object')
        if "offset" not in entry or not (entry["offset"] is None or isinstance(entry["offset"], dict)):
            raise BadOffsets(f'{where}: offsets[{i}] must have an "offset": an object, or null to '
                             "remove the partition")
        offset = entry["offset"]
        pairs.append((to_text(entry["partition"], f"{where}: offsets[{i}].partition"),
                      None if offset is None else to_text(offset, f"{where}: offsets[{i}].offset")))
    return pairs


def offset_entries(offsets: Any) -> list[dict[str, Any]]:
    """FetchOffsets' pairs as Kafka Connect's ``offsets`` list."""
    return [{"partition": json.loads(p.partition),
             "offset": None if p.offset is None else json.loads(p.offset)} for p in offsets]
