"""The coordinator's real log as input: ``python -m simulation analyze --data-dir DIR [--out DIR]``.

Reads the partition logs of a coordinator's data directory (``<data-dir>/partition-<N>/``, format
in coordinator/runtime/log.py's docstring) with Spark, one task per partition, into the event
schema of the simulator's traces (t_ms, kind, worker, item, epoch, detail, plus group_id,
partition and offset), then rebuilds each group's rebalance timeline (one row per group epoch:
what triggered it, when its target assignment was installed, when every member had reconciled,
what moved) with ``applyInPandas`` per group, and prints it as Markdown. With ``--out`` it also
writes ``events/`` and ``timeline/`` (Parquet) and ``timeline.md``.

The logs are only read, never opened for writing: :func:`read_partition` is a read-only batch
reader (it validates magic, length, CRC and record framing like ``PartitionLog.open`` but never
truncates or moves anything), so it is safe on a running daemon's directory. It stops at the
first batch that does not validate: on a running daemon that is normally a batch being written
(reported as a note, kind ``log_note``); ``.swap`` files (a compaction being installed) are also
noted. ``t_ms`` is the batch's append timestamp (the daemon's wall clock, ms since the epoch).

Event kinds, one per record (``worker`` is the member id; lists of items are in ``detail``):

=====================  =======================================================================
``group_epoch``        GroupMetadata: ``epoch`` = the group epoch (a bump = a rebalance)
``token_ceiling``      GroupMetadata at the group's epoch (no bump): the fencing token
                       ceiling raised, ``detail`` = ``ceiling=C``
``group_deleted``      GroupMetadata tombstone
``connectors``         GroupConnectors: ``epoch`` = its epoch, ``detail`` = ``A:2 B:1``
``member_joined``      GroupMember, first record of this member id in the log
``member_updated``     GroupMember, later records (metadata changed, e.g. an assignor reason)
``member_left``        GroupMember tombstone
``target``             TargetAssignmentMember: ``detail`` = the member's target items
``target_removed``     TargetAssignmentMember tombstone
``target_epoch``       TargetAssignmentMetadata: ``epoch`` = assignment epoch,
                       ``detail`` = ``error=E scheduled_at=T``
``member_epoch``       CurrentMemberAssignment: ``epoch`` = member epoch, ``detail`` =
                       ``state=S previous=P assigned=... revoking=...``
``member_epoch_removed`` CurrentMemberAssignment tombstone
``config``             GroupConfiguration: ``detail`` = ``k=v ...``
``task_configs``       ConnectorTaskConfigs: ``item`` = the connector, ``detail`` = how many
``task_configs_removed`` ConnectorTaskConfigs tombstone
``unknown``/``corrupt`` a record this build cannot decode
``log_note``           the reader stopped early or saw something to report (``group_id`` empty)
=====================  =======================================================================
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import crc32c

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

# -- read-only log reader -----------------------------------------------------------------------

_PREFIX = struct.Struct(">BII")  # magic, length, crc
_FIXED = struct.Struct(">QQI")  # base offset, timestamp, record count
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
MAGIC = 1
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
_PARTITION_RE = re.compile(r"^partition-(\d+)$")


@dataclass
class Batch:
    base_offset: int
    timestamp_ms: int
    records: list[tuple[bytes, bytes | None]]


@dataclass
class ReadResult:
    batches: list[Batch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _parse_batch(data: memoryview, pos: int) -> tuple[Batch | None, int, str | None]:
    """(batch, size, None) or (None, 0, why it is invalid) for the batch at ``pos``."""
    remaining = len(data) - pos
    if remaining < _PREFIX.size:
        return None, 0, f"{remaining} trailing bytes (a header being written?)"
    magic, length, crc = _PREFIX.unpack_from(data, pos)
    if magic != MAGIC:
        return None, 0, f"bad magic {magic}"
    if length < _FIXED.size or length > remaining - _PREFIX.size:
        return None, 0, f"batch length {length} with {remaining - _PREFIX.size} bytes left (being written?)"
    body = data[pos + _PREFIX.size : pos + _PREFIX.size + length]
    if crc32c.crc32c(body) != crc:
        return None, 0, "crc mismatch"
    base, timestamp, count = _FIXED.unpack_from(body)
    records: list[tuple[bytes, bytes | None]] = []
    at = _FIXED.size
    for i in range(count):
        if length - at < 8:
            return None, 0, f"record {i} framing"
        (key_len,) = _U32.unpack_from(body, at)
        at += 4
        if key_len > length - at - 4:
            return None, 0, f"record {i} key length"
        key = bytes(body[at : at + key_len])
        at += key_len
        (value_len,) = _I32.unpack_from(body, at)
        at += 4
        if value_len == -1:
            value = None
        elif 0 <= value_len <= length - at:
            value = bytes(body[at : at + value_len])
            at += value_len
        else:
            return None, 0, f"record {i} value length"
        records.append((key, value))
    if at != length:
        return None, 0, "trailing bytes in batch"
    return Batch(base, timestamp, records), _PREFIX.size + length, None


def read_partition(directory: str | Path) -> ReadResult:
    """Every valid batch of a partition directory, in offset order, without writing anything."""
    directory = Path(directory)
    out = ReadResult()
    if any(p.name.endswith(".swap") for p in directory.iterdir()):
        out.notes.append(f"{directory.name}: a compaction is being installed (.swap present); "
                         "records may be missing from this read")
    segments = sorted((int(m[1]), p) for p in directory.iterdir() if (m := _SEGMENT_RE.match(p.name)))
    expected = 0
    for base, path in segments:
        if base != expected:
            out.notes.append(f"{directory.name}/{path.name}: starts at offset {base}, expected {expected}; "
                             "stopped (a segment is missing or being replaced)")
            return out
        data = memoryview(path.read_bytes())
        pos = 0
        while pos < len(data):
            batch, size, why = _parse_batch(data, pos)
            if batch is None:
                out.notes.append(f"{directory.name}/{path.name}: stopped at byte {pos} "
                                 f"(offset {expected}): {why}")
                return out
            if batch.base_offset < expected:
                out.notes.append(f"{directory.name}/{path.name}: offset {batch.base_offset} below "
                                 f"{expected}; stopped")
                return out
            pos += size
            expected = batch.base_offset + len(batch.records)
            if batch.records:  # a batch of 0 records is a compaction end marker
                out.batches.append(batch)
            else:
                expected = batch.base_offset
    return out


# -- records -> events --------------------------------------------------------------------------

EVENT_DDL = ("group_id string, partition int, offset bigint, batch bigint, t_ms bigint, kind string, "
             "worker string, item string, epoch bigint, detail string")
EVENT_COLUMNS = [c.split()[0] for c in EVENT_DDL.split(", ")]


def _items(connectors: Any, tasks: Any) -> str:
    from connect_wire.items import items_from_wire

    return ",".join(str(i) for i in sorted(items_from_wire(connectors, tasks)))


def record_event(key: Any, value: Any, seen_members: set[tuple[str, str]]) -> dict[str, Any]:
    """The event of one decoded record (without group_id/partition/offset/t_ms defaults)."""
    from coordinator.group.model import MemberState

    name = type(key).__name__
    group = getattr(key, "group_id", "")
    member = getattr(key, "member_id", "")
    ev: dict[str, Any] = {"group_id": group, "worker": member, "item": "", "epoch": 0, "detail": ""}
    if name == "GroupMetadataKey":
        ev["kind"] = "group_deleted" if value is None else "group_epoch"
        ev["epoch"] = 0 if value is None else value.epoch
    elif name == "GroupConnectorsKey":
        if value is None:
            ev["kind"] = "connectors_deleted"
        else:
            ev["kind"] = "connectors"
            ev["epoch"] = value.epoch
            ev["detail"] = " ".join(f"{c.name}:{c.task_count}" for c in value.connectors)
    elif name == "GroupMemberKey":
        if value is None:
            ev["kind"] = "member_left"
            seen_members.discard((group, member))
        else:
            ev["kind"] = "member_updated" if (group, member) in seen_members else "member_joined"
            seen_members.add((group, member))
            assignors = " ".join(f"{a.name}[{a.minimum_version}..{a.maximum_version}]r{a.reason}"
                                 for a in value.client_assignors)
            ev["detail"] = (f"instance={value.instance_id or '-'} client={value.client_id} "
                            f"host={value.client_host} assignors={assignors}")
    elif name == "TargetAssignmentMemberKey":
        ev["kind"] = "target_removed" if value is None else "target"
        if value is not None:
            ev["detail"] = _items(value.connectors, value.tasks)
    elif name == "TargetAssignmentMetadataKey":
        ev["kind"] = "target_epoch_deleted" if value is None else "target_epoch"
        if value is not None:
            ev["epoch"] = value.assignment_epoch
            ev["detail"] = f"error={value.error} scheduled_at={value.scheduled_rebalance_at_ms}"
    elif name == "CurrentMemberAssignmentKey":
        if value is None:
            ev["kind"] = "member_epoch_removed"
        else:
            ev["kind"] = "member_epoch"
            ev["epoch"] = value.member_epoch
            try:
                state = MemberState(value.state).label
            except ValueError:
                state = str(value.state)
            ev["detail"] = (f"state={state} previous={value.previous_member_epoch} "
                            f"assigned={_items(value.connectors, value.tasks)} "
                            f"revoking={_items(value.revoking_connectors, value.revoking_tasks)}")
    elif name == "ConnectorTaskConfigsKey":
        ev["kind"] = "task_configs_removed" if value is None else "task_configs"
        ev["item"] = key.connector
        if value is not None:
            ev["detail"] = f"tasks={len(value.task_configs)} incarnation={value.incarnation}"
    elif name == "GroupConfigurationKey":
        ev["kind"] = "config"
        if value is not None:
            ev["detail"] = " ".join(f"{c.name}={c.value}" for c in value.configs)
    else:
        ev["kind"] = "unknown"
        ev["detail"] = name
    return ev


def _bare_event(kind: str, detail: str) -> dict[str, Any]:
    return {"group_id": "", "kind": kind, "worker": "", "item": "", "epoch": 0, "detail": detail}


def partition_events(directory: str | Path, partition: int) -> list[dict[str, Any]]:
    """The events of one partition directory, in offset order (notes as ``log_note`` events)."""
    from coordinator.runtime import serde

    read = read_partition(directory)
    events: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    epochs: dict[str, int] = {}  # group -> its last group epoch (a record at it is no bump)
    last_t = 0
    for batch in read.batches:
        last_t = batch.timestamp_ms
        for i, (key, value) in enumerate(batch.records):
            base = {"partition": partition, "offset": batch.base_offset + i, "batch": batch.base_offset,
                    "t_ms": batch.timestamp_ms}
            try:
                record = serde.decode_record(key, value)
                ev = record_event(record.key, record.value, seen)
                if ev["kind"] == "group_epoch":
                    if epochs.get(ev["group_id"]) == ev["epoch"]:
                        ev["kind"] = "token_ceiling"
                        ev["detail"] = f"ceiling={record.value.fencing_token_ceiling}"
                    epochs[ev["group_id"]] = ev["epoch"]
                elif ev["kind"] == "group_deleted":
                    epochs.pop(ev["group_id"], None)
            except serde.UnknownRecordType as exc:
                ev = _bare_event("unknown", str(exc))
            except serde.RecordSerdeError as exc:
                ev = _bare_event("corrupt", str(exc))
            events.append({**base, **ev})
    for note in read.notes:
        events.append({"group_id": "", "partition": partition, "offset": -1, "batch": -1, "t_ms": last_t,
                       "kind": "log_note",
                       "worker": "", "item": "", "epoch": 0, "detail": note})
    return events


# -- events -> timeline (pure; runs per group in applyInPandas) ---------------------------------

TIMELINE_DDL = (
    "group_id string, group_epoch bigint, started_ms bigint, cause string, members int, "
    "target_ms bigint, reconciled_ms bigint, compute_ms bigint, duration_ms bigint, "
    "moved int, moved_items string, assigned_new int, unassigned int, revocations int, "
    "scheduled_rebalance_at_ms bigint, status string"
)
TIMELINE_COLUMNS = [c.split()[0] for c in TIMELINE_DDL.split(", ")]


def _split(text: str) -> set[str]:
    return {t for t in text.split(",") if t}


def _field(detail: str, name: str) -> str:
    m = re.search(rf"(?:^| ){name}=(\S*)", detail)
    return m.group(1) if m else ""


def group_timeline(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per group epoch of ONE group's events (sorted by offset): the rebalance it started,
    when the target for it was installed, when all members had reconciled to it, what moved."""
    rows: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    group_id = events[0]["group_id"] if events else ""
    members: set[str] = set()
    target: dict[str, set[str]] = {}
    current: dict[str, tuple[int, str, set[str]]] = {}  # member -> (epoch, state, revoking)
    pending: list[str] = []  # what changed since the last group epoch record (earlier batches)
    latest_target_epoch = -1

    def row_for(epoch: int, t_ms: int) -> dict[str, Any]:
        if epoch not in rows:
            rows[epoch] = {c: None for c in TIMELINE_COLUMNS}
            rows[epoch].update(group_id=group_id, group_epoch=epoch, started_ms=t_ms, cause="", status="open",
                               revocations=0)
            order.append(epoch)
        return rows[epoch]

    def check_reconciled(t_ms: int) -> None:
        row = rows.get(latest_target_epoch)
        if row is None or row["reconciled_ms"] is not None or row["status"] == "created" or not members:
            return
        for m in members:
            epoch, state, revoking = current.get(m, (-1, "", set()))
            if epoch != latest_target_epoch or state != "Stable" or revoking:
                return
        row["reconciled_ms"] = t_ms
        row["duration_ms"] = t_ms - row["started_ms"]
        row["status"] = "reconciled"

    # A batch is one request's (or timer's) records: the changes in the batch that bumps the group
    # epoch are its cause, whether written before or after the GroupMetadata record.
    batches: list[list[dict[str, Any]]] = []
    for ev in events:
        if batches and batches[-1][0].get("batch", -1) == ev.get("batch", -2):
            batches[-1].append(ev)
        else:
            batches.append([ev])
    for batch in batches:
        changes: list[str] = []
        bumped: list[int] = []
        for ev in batch:
            kind, t, worker = ev["kind"], int(ev["t_ms"]), ev["worker"]
            if kind == "member_joined":
                members.add(worker)
                changes.append(f"{worker} joined")
            elif kind == "member_updated":
                changes.append(f"{worker} updated")
            elif kind == "member_left":
                members.discard(worker)
                current.pop(worker, None)
                changes.append(f"{worker} left")
                check_reconciled(t)
            elif kind == "connectors":
                changes.append(f"connectors {ev['detail'] or '(none)'}")
            elif kind == "connectors_deleted":
                changes.append("connectors deleted")
            elif kind == "group_epoch":
                epoch = int(ev["epoch"])
                for e in order:  # an older rebalance whose target never came is superseded
                    if e < epoch and rows[e]["status"] == "open" and rows[e]["target_ms"] is None:
                        rows[e]["status"] = "superseded"
                row_for(epoch, t)
                bumped.append(epoch)
            elif kind == "target":
                target[worker] = _split(ev["detail"])
            elif kind == "target_removed":
                target.pop(worker, None)
            elif kind == "target_epoch":
                epoch = int(ev["epoch"])
                row = row_for(epoch, t)
                previous = rows[latest_target_epoch]["_owners"] if latest_target_epoch in rows else {}
                owners = {item: m for m, its in target.items() for item in its}
                moved = sorted(i for i in owners if i in previous and previous[i] != owners[i])
                row["_owners"] = owners
                row["target_ms"] = t
                row["compute_ms"] = t - row["started_ms"]
                row["members"] = len(target)
                row["moved"] = len(moved)
                row["moved_items"] = ", ".join(f"{i}: {previous[i]}->{owners[i]}" for i in moved)
                row["assigned_new"] = sum(1 for i in owners if i not in previous)
                row["unassigned"] = sum(1 for i in previous if i not in owners)
                scheduled = int(_field(ev["detail"], "scheduled_at") or 0)
                row["scheduled_rebalance_at_ms"] = scheduled if scheduled > 0 else None
                if row["status"] == "open":
                    row["status"] = "assigned" if members or epoch > 0 else "created"
                latest_target_epoch = max(latest_target_epoch, epoch)
                check_reconciled(t)
            elif kind == "member_epoch":
                revoking = _split(_field(ev["detail"], "revoking"))
                state = _field(ev["detail"], "state")
                if revoking and not current.get(worker, (0, "", set()))[2]:
                    row = rows.get(latest_target_epoch)
                    if row is not None:
                        row["revocations"] += 1
                current[worker] = (int(ev["epoch"]), state, revoking)
                check_reconciled(t)
            elif kind == "member_epoch_removed":
                current.pop(worker, None)
                check_reconciled(t)
        if bumped:
            cause = ", ".join(dict.fromkeys(pending + changes))
            for epoch in bumped:
                rows[epoch]["cause"] = cause or ("group created" if epoch == 0 else "")
            pending = []
        else:
            pending += changes
    out = []
    for epoch in order:
        row = {c: rows[epoch][c] for c in TIMELINE_COLUMNS}
        if row["status"] == "assigned":
            row["status"] = "reconciling" if epoch == latest_target_epoch else "assigned (not reconciled)"
        elif row["status"] == "open":
            row["status"] = "awaiting assignment"
        out.append(row)
    return out


# -- Spark --------------------------------------------------------------------------------------


def partition_dirs(data_dir: str | Path) -> list[tuple[int, str]]:
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: no such directory")
    found = sorted((int(m[1]), str(p.resolve())) for p in data_dir.iterdir()
                   if p.is_dir() and (m := _PARTITION_RE.match(p.name)))
    if not found:
        raise FileNotFoundError(f"{data_dir}: no partition-<N> directories (not a coordinator data dir?)")
    return found


# The functions Spark ships to its Python workers import this module by name, so that they are
# pickled by reference even when this file runs as ``__main__``.


def _decode_batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    from simulation import analyze

    return analyze.decode_partitions(batches)


def _timeline_of(frame: pd.DataFrame) -> pd.DataFrame:
    from simulation import analyze

    return analyze.timeline_pandas(frame)


def decode_partitions(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """mapInPandas body: rows of (partition, path) -> their events."""
    import pandas as pd

    from simulation.spark import quiet_pandas_warning

    quiet_pandas_warning()
    for frame in batches:
        for partition, path in zip(frame["partition"], frame["path"], strict=True):
            events = partition_events(path, int(partition))
            if events:
                yield pd.DataFrame(events, columns=EVENT_COLUMNS)


def timeline_pandas(frame: pd.DataFrame) -> pd.DataFrame:
    """applyInPandas body: one group's events -> its timeline rows."""
    import pandas as pd

    frame = frame.sort_values("offset")
    rows = group_timeline(frame.to_dict("records"))
    out = pd.DataFrame(rows, columns=TIMELINE_COLUMNS)
    for column in ("group_epoch", "started_ms", "target_ms", "reconciled_ms", "compute_ms", "duration_ms",
                   "scheduled_rebalance_at_ms"):
        out[column] = out[column].astype("Int64")
    for column in ("members", "moved", "assigned_new", "unassigned", "revocations"):
        out[column] = out[column].astype("Int32")
    return out


def events_frame(spark: SparkSession, data_dir: str | Path) -> DataFrame:
    dirs = partition_dirs(data_dir)
    paths = spark.createDataFrame(dirs, "partition int, path string").repartition(len(dirs))
    return paths.mapInPandas(_decode_batches, EVENT_DDL)


def timeline_frame(events: DataFrame) -> DataFrame:
    groups = events.where("group_id <> '' AND kind <> 'log_note'")
    return groups.groupBy("group_id").applyInPandas(_timeline_of, TIMELINE_DDL)


@dataclass
class Analysis:
    events: pd.DataFrame
    timeline: pd.DataFrame
    notes: list[str]
    partitions: int  # partition directories read


def analyze(spark: SparkSession, data_dir: str | Path, out: str | Path | None = None) -> Analysis:
    """Read ``data_dir``'s logs with Spark; write Parquet into ``out`` (if given); return both tables."""
    events = events_frame(spark, data_dir).cache()
    try:
        timeline = timeline_frame(events)
        if out is not None:
            out = Path(out)
            out.mkdir(parents=True, exist_ok=True)
            events.coalesce(1).write.mode("overwrite").parquet(str(out / "events"))
            timeline.coalesce(1).write.mode("overwrite").parquet(str(out / "timeline"))
        events_pd = events.toPandas().sort_values(["partition", "offset"]).reset_index(drop=True)
        timeline_pd = timeline.toPandas().sort_values(["group_id", "group_epoch"]).reset_index(drop=True)
    finally:
        events.unpersist()
    notes = [str(d) for d in events_pd.loc[events_pd["kind"] == "log_note", "detail"]]
    return Analysis(events_pd, timeline_pd, notes, len(partition_dirs(data_dir)))


# -- rendering ----------------------------------------------------------------------------------


def _iso(t_ms: int) -> str:
    return datetime.fromtimestamp(t_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(value: Any) -> str:
    import pandas as pd

    if value is None or pd.isna(value):
        return "–"
    return f"{int(value):,}"


def render_markdown(analysis: Analysis, data_dir: str | Path) -> str:
    import pandas as pd

    ev, tl = analysis.events, analysis.timeline
    lines = [f"# Rebalance timeline of {data_dir}", ""]
    groups = sorted(g for g in ev["group_id"].unique() if g)
    lines.append(f"{len(ev[ev['kind'] != 'log_note'])} records in {analysis.partitions} partition(s), "
                 f"{len(groups)} group(s). Times are the log's batch timestamps; `+ms` is from the "
                 "group's first record.")
    lines.append("")
    for note in analysis.notes:
        lines += [f"- note: {note}"]
    if analysis.notes:
        lines.append("")
    for group in groups:
        g_ev = ev[ev["group_id"] == group]
        t0 = int(g_ev["t_ms"].min())
        rows = tl[tl["group_id"] == group]
        lines += [f"## Group `{group}`", "",
                  f"Partition {int(g_ev['partition'].iloc[0])}, {len(g_ev)} records (offsets "
                  f"{int(g_ev['offset'].min())}..{int(g_ev['offset'].max())}), from {_iso(t0)} to "
                  f"{_iso(int(g_ev['t_ms'].max()))}; {len(rows)} group epoch(s).", ""]
        lines += ["| epoch | started | cause | members | target after ms | reconciled after ms | moved | "
                  "new | revocations | status |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows.itertuples(index=False):
            started = int(r.started_ms) - t0
            lines.append(
                f"| {r.group_epoch} | +{started:,} | {r.cause or '–'} | {_ms(r.members)} | "
                f"{_ms(r.compute_ms)} | {_ms(r.duration_ms)} | {_ms(r.moved)} | {_ms(r.assigned_new)} | "
                f"{_ms(r.revocations)} | {r.status} |")
        moves = [(r.group_epoch, r.moved_items) for r in rows.itertuples(index=False)
                 if isinstance(r.moved_items, str) and r.moved_items]
        scheduled = [(r.group_epoch, r.scheduled_rebalance_at_ms) for r in rows.itertuples(index=False)
                     if not pd.isna(r.scheduled_rebalance_at_ms)]
        if moves or scheduled:
            lines.append("")
        for epoch, text in moves:
            lines.append(f"- epoch {epoch} moved: {text}")
        for epoch, at in scheduled:
            lines.append(f"- epoch {epoch}: a rebalance was scheduled for +{int(at) - t0:,} ms "
                         f"({_iso(int(at))})")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m simulation analyze",
        description="Rebalance timelines from a coordinator's partition logs (Spark).")
    p.add_argument("--data-dir", required=True, help="the coordinator's data directory (read only)")
    p.add_argument("--out", help="write events/ and timeline/ (Parquet) and timeline.md here")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    args = p.parse_args(argv)
    try:
        partition_dirs(args.data_dir)
    except FileNotFoundError as exc:
        print(f"analyze: {exc}", file=sys.stderr)
        return 2
    from pyspark.sql import SparkSession

    from simulation.spark import DEFAULT_MASTER, session

    existing = SparkSession.getActiveSession()  # e.g. a test's: used as is, and not stopped
    spark = session(args.master or DEFAULT_MASTER)
    try:
        analysis = analyze(spark, args.data_dir, args.out)
    finally:
        if existing is None:
            spark.stop()
    text = render_markdown(analysis, args.data_dir)
    if args.out:
        (Path(args.out) / "timeline.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
