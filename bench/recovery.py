"""Recovery: records replayed per second on restart, and the time until a restarted daemon answers.

``python -m bench recovery [--sizes 10000,100000,1000000] [--huge] [--groups 1000]
[--members 10] [--repeat N] [--output PATH]``

Partition logs are written directly (``PartitionLog`` + ``serde``) with realistic records from
``coordinator/group/records.py``: ``--groups`` groups of ``--members`` members and two
connectors of 10 tasks each; each group gets its metadata, connectors and members, then
rebalance rounds (new group epoch, a target per member, the target metadata, a current
assignment per member at the new epoch; the spread of items stays the same, since a replay
refuses an item with two current owners) until the log holds the requested number of records. Groups are
interleaved as a live coordinator would interleave them.

Per size, two measurements, sizes interleaved (order reversed on every other repetition):

* ``replay``: in this process, what a partition load does: ``PartitionLog.open`` (recovery reads
  and checks every batch) with a ``serde.BulkLoader`` as its sink (which decodes and applies the
  records of each valid batch as it is read), timed; records per second.
* ``daemon``: the real daemon restarted on that log (``--partitions 1``): seconds from spawn until
  it answers a ConnectGroupDescribe without COORDINATOR_LOAD_IN_PROGRESS (Python start-up
  included), and the load time the daemon logs itself ("partition loaded", seconds).

Then ``churn``: the same live state (``--groups`` groups of ``--members``) written with
``--churn-rounds`` rebalance rounds and with 10x as many, each log maintained as the daemon
does (every ``MAINTAIN_EVERY`` records, standing in for ``log.compaction.interval.ms``, and
once at the end: compact; if the active segment is mostly superseded, roll it and compact
again), then replayed as above: restart time must follow the live state, not the history.
Printed side by side with the ratios 10x/1x.

The last line is the headline: records replayed per second (in-process) at the largest size
(target >= 300,000/s), and the daemon's time to answer at the size holding ``--groups`` groups.
``--huge`` adds 10^7 records. Rows go to ``bench/results/recovery.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._common import RESULTS, BenchError, machine, sizes_arg, start_daemon
from connect_wire.errors import ErrorCode
from connect_wire.items import CONNECTOR, Item
from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient, AdminError
from coordinator.group import records as rec
from coordinator.group.model import (
    AssignorSpec,
    ConnectorSpec,
    CurrentAssignment,
    MemberMetadata,
    MemberState,
    TargetMember,
)
from coordinator.group.state import CoordinatorState
from coordinator.runtime import serde
from coordinator.runtime.log import PartitionLog, partition_dir

ASSIGNOR = AssignorSpec("incremental", 1, 1, 0, 1, b"")
CONNECTORS = 2
TASKS = 10
BATCH = 500


def group_id(g: int) -> str:
    return f"recovery-group-{g:05d}"


def _records(groups: int, members: int) -> Iterator[rec.Record]:
    """An endless, realistic stream: set-up records per group, then rebalance rounds."""
    names = [[f"g{g}-connector-{c}" for c in range(CONNECTORS)] for g in range(groups)]
    for g in range(groups):
        gid = group_id(g)
        yield rec.group_metadata(gid, 1)
        yield rec.group_connectors(gid, 1, [
            ConnectorSpec(n, TASKS, (("connector.class", "org.example.BenchConnector"),
                                     ("topics", "orders,payments"))) for n in names[g]])
        for m in range(members):
            yield rec.group_member(gid, MemberMetadata(
                member_id=f"{gid}-member-{m:04d}-0000-0000-000000000000", instance_id=None,
                worker_url=f"http://worker-{m}.example:8083", client_id=f"connect-worker-{m}",
                client_host="10.1.2.3", rebalance_timeout_ms=60_000, assignors=(ASSIGNOR,)))
    epoch = 1
    while True:
        epoch += 1
        for g in range(groups):
            gid = group_id(g)
            items = [Item(n, CONNECTOR) for n in names[g]] + [
                Item(n, t) for n in names[g] for t in range(TASKS)]
            # The same spread every round: the replay refuses two current owners of an item,
            # which moving items between members one record at a time would create.
            per: list[list[Item]] = [[] for _ in range(members)]
            for k, item in enumerate(items):
                per[k % members].append(item)
            yield rec.group_metadata(gid, epoch)
            for m in range(members):
                yield rec.target_member(gid, f"{gid}-member-{m:04d}-0000-0000-000000000000",
                                        TargetMember(frozenset(per[m]), 1, b""))
            yield rec.target_metadata(gid, epoch, 0, b'{"v":1,"members":[]}', -1)
            for m in range(members):
                yield rec.current_assignment(
                    gid, f"{gid}-member-{m:04d}-0000-0000-000000000000",
                    CurrentAssignment(epoch, epoch - 1, MemberState.STABLE, frozenset(per[m]),
                                      frozenset(), 1, b""))


MAINTAIN_EVERY = 20_000
ROLL_MIN_BYTES = 1024 * 1024  # the daemon's defaults (log.roll.min.bytes, log.roll.dirty.percent)
ROLL_DIRTY_PERCENT = 50


def maintain(log: PartitionLog, roll: bool = True) -> None:
    """What the daemon's compaction loop does: compact; roll a mostly superseded active segment
    and compact again (``roll=False``: compaction alone, as before active segments were rolled)."""
    report = log.compact(time.time_ns() // 1_000_000, 24 * 3600 * 1000)
    if roll and report.active_mostly_garbage(ROLL_MIN_BYTES, ROLL_DIRTY_PERCENT) and log.roll():
        log.compact(time.time_ns() // 1_000_000, 24 * 3600 * 1000)


def _write(data_dir: Path, count: int, groups: int, members: int,
           roll: bool | None = None) -> int:
    """A partition-0 log of the first ``count`` records; with ``roll`` not None, maintained as
    the daemon would every MAINTAIN_EVERY records and at the end. Returns its size in bytes."""
    log, _ = PartitionLog.open(partition_dir(data_dir, 0))
    try:
        batch: list[tuple[bytes, bytes | None]] = []
        for n, record in enumerate(_records(groups, members)):
            if n == count:
                break
            batch.append(serde.encode_record(record))
            if len(batch) == BATCH:
                log.append(batch)
                batch = []
            if roll is not None and n % MAINTAIN_EVERY == MAINTAIN_EVERY - 1:
                log.sync()
                maintain(log, roll)
        if batch:
            log.append(batch)
        log.sync()
        if roll is not None:
            maintain(log, roll)
        (data_dir / "partitions").write_text("1\n")  # the daemon's partition-count marker
        return log.size_bytes
    finally:
        log.close()


def write_log(data_dir: Path, count: int, groups: int, members: int) -> int:
    """A partition-0 log of ``count`` records; returns its size in bytes."""
    return _write(data_dir, count, groups, members)


def write_churned_log(data_dir: Path, groups: int, members: int, rounds: int,
                      roll: bool = True) -> tuple[int, int]:
    """Set-up records plus ``rounds`` rebalance rounds, maintained as the daemon would;
    (records written, log bytes after)."""
    count = groups * (2 + members) + rounds * groups * (2 + 2 * members)
    return count, _write(data_dir, count, groups, members, roll)


CHURN_MODES = (("roll+compact", True), ("compaction only", False))


def churn(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The same live state with 1x and 10x the writes, maintained with the active segment's roll
    (the daemon now) and without it (before); replays interleaved, medians."""
    logs = []
    for mode, roll in CHURN_MODES:
        for factor in (1, 10):
            data = workdir / f"churn-{factor}x-{'roll' if roll else 'noroll'}"
            written, nbytes = write_churned_log(data, args.groups, args.members,
                                                factor * args.churn_rounds, roll)
            logs.append((mode, factor, data, written, nbytes))
    samples: dict[Path, list[float]] = {data: [] for _, _, data, _, _ in logs}
    kept: dict[Path, tuple[int, int]] = {}
    for rep in range(max(args.repeat, 3)):
        for _, _, data, _, _ in (logs if rep % 2 == 0 else logs[::-1]):
            seconds, records, ngroups = replay(data)
            samples[data].append(seconds)
            kept[data] = (records, ngroups)
    rows = [{"mode": mode, "factor": factor, "records_written": written, "log_bytes": nbytes,
             "records_kept": kept[data][0], "groups": kept[data][1],
             "replay_seconds": round(statistics.median(samples[data]), 4)}
            for mode, factor, data, written, nbytes in logs]
    ratios = {}
    for mode, _ in CHURN_MODES:
        one, ten = [r for r in rows if r["mode"] == mode]
        ratios[mode] = {"records_written": round(ten["records_written"] / one["records_written"], 2),
                        "log_bytes": round(ten["log_bytes"] / one["log_bytes"], 2),
                        "replay_seconds": round(ten["replay_seconds"] / one["replay_seconds"], 2)}
    return {"rows": rows, "ratios_10x_over_1x": ratios}


def render_churn(c: dict[str, Any]) -> str:
    lines = ["churn: the same live state written with 1x and 10x the writes, maintained as the "
             "daemon does (roll+compact) and as it did before (compaction only)",
             f"{'mode':>15} {'churn':>5} {'records written':>15} {'records kept':>12} "
             f"{'log MiB':>8} {'groups':>6} {'replay s':>9}"]
    for r in c["rows"]:
        lines.append(f"{r['mode']:>15} {str(r['factor']) + 'x':>5} {r['records_written']:>15,} "
                     f"{r['records_kept']:>12,} {r['log_bytes'] / 2**20:>8.2f} {r['groups']:>6} "
                     f"{r['replay_seconds']:>9.3f}")
    for mode, ratio in c["ratios_10x_over_1x"].items():
        lines.append(f"ratio 10x/1x, {mode}: records written {ratio['records_written']}, log bytes "
                     f"{ratio['log_bytes']}, restart (replay) time {ratio['replay_seconds']}")
    return "\n".join(lines)


def replay(data_dir: Path) -> tuple[float, int, int]:
    """What a partition load does: open the log with a ``serde.BulkLoader`` as the recovery
    sink (each batch is replayed as recovery reads and checks it); (seconds, records, groups)."""
    started = time.perf_counter()
    state = CoordinatorState()
    with serde.BulkLoader(state) as loader:
        log, _ = PartitionLog.open(partition_dir(data_dir, 0), sink=loader.add)
    log.close()
    return time.perf_counter() - started, loader.stats.records, len(state.groups)


def daemon_restart(data_dir: Path, probe: str, timeout_s: float) -> tuple[float, float | None]:
    """(seconds from spawn until the daemon answers, the load seconds it logged)."""
    started = time.perf_counter()
    daemon, _ = start_daemon(data_dir, extra_args=["--partitions", "1", "--log-level", "info"])
    try:
        deadline = started + timeout_s
        answered = None
        with AdminClient(daemon.host, daemon.port, timeout_s=timeout_s) as client:
            while time.perf_counter() < deadline:
                try:
                    resp = client.call(ConnectGroupDescribeRequest(group_ids=(probe,)))
                except AdminError as exc:
                    raise BenchError(f"describe failed: {exc}") from None
                codes = {g.error_code for g in resp.groups}
                if ErrorCode.COORDINATOR_LOAD_IN_PROGRESS not in codes:
                    answered = time.perf_counter() - started
                    break
                time.sleep(0.002)
        if answered is None:
            raise BenchError(f"daemon did not answer within {timeout_s}s")
        load_s = None
        deadline = time.perf_counter() + 5
        while load_s is None and time.perf_counter() < deadline:
            for line in daemon.stderr().splitlines():
                if "partition loaded" in line:
                    try:
                        load_s = float(json.loads(line).get("seconds"))
                    except (ValueError, TypeError):
                        pass
            if load_s is None:
                time.sleep(0.02)
        return answered, load_s
    finally:
        daemon.stop()


def measure(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    logs = []
    for size in args.sizes:
        data = workdir / f"data-{size}"
        started = time.perf_counter()
        nbytes = write_log(data, size, args.groups, args.members)
        logs.append((size, data, nbytes, time.perf_counter() - started))
    samples: dict[int, dict[str, list[float]]] = {
        size: {"replay": [], "answer": [], "load": []} for size in args.sizes}
    groups_seen: dict[int, int] = {}
    for rep in range(args.repeat):
        order = logs if rep % 2 == 0 else logs[::-1]
        for size, data, _, _ in order:
            seconds, n, ngroups = replay(data)
            if n != size:
                raise BenchError(f"replayed {n} records, wrote {size}")
            groups_seen[size] = ngroups
            samples[size]["replay"].append(seconds)
            answered, load_s = daemon_restart(data, group_id(0), args.timeout)
            samples[size]["answer"].append(answered)
            if load_s is not None:
                samples[size]["load"].append(load_s)
    rows = []
    for size, _, nbytes, write_s in logs:
        s = samples[size]
        replay_s = statistics.median(s["replay"])
        load_s = statistics.median(s["load"]) if s["load"] else None
        rows.append({
            "records": size, "groups": groups_seen[size], "log_bytes": nbytes,
            "write_seconds": round(write_s, 3),
            "replay_seconds": round(replay_s, 4),
            "replay_per_second": round(size / replay_s),
            "daemon_load_seconds": None if load_s is None else round(load_s, 4),
            "daemon_load_per_second": None if not load_s else round(size / load_s),
            "daemon_answer_seconds": round(statistics.median(s["answer"]), 4),
        })
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    header = (f"{'records':>9} {'groups':>6} {'MiB':>7} {'replay s':>9} {'replay rec/s':>12} "
              f"{'daemon load s':>13} {'daemon rec/s':>12} {'answers after s':>15}")
    lines = [header, "-" * len(header)]
    for r in rows:
        load = "-" if r["daemon_load_seconds"] is None else f"{r['daemon_load_seconds']:.3f}"
        rate = "-" if r["daemon_load_per_second"] is None else f"{r['daemon_load_per_second']:,}"
        lines.append(
            f"{r['records']:>9} {r['groups']:>6} {r['log_bytes'] / 2**20:>7.1f} "
            f"{r['replay_seconds']:>9.3f} {r['replay_per_second']:>12,} {load:>13} {rate:>12} "
            f"{r['daemon_answer_seconds']:>15.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench recovery",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default=[10_000, 100_000, 1_000_000],
                        help="records per log, comma-separated (default 10000,100000,1000000)")
    parser.add_argument("--huge", action="store_true", help="also 10,000,000 records")
    parser.add_argument("--groups", type=int, default=1_000, help="groups in each log (default 1000)")
    parser.add_argument("--members", type=int, default=10, help="members per group (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median; default 3)")
    parser.add_argument("--churn-rounds", type=int, default=5,
                        help="rebalance rounds of the 1x churn log (default 5; the other has 10x)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a daemon")
    parser.add_argument("--output", type=Path, default=RESULTS / "recovery.json",
                        help="where to write the rows (default bench/results/recovery.json)")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.members < 1 or args.repeat < 1 or args.churn_rounds < 1:
        parser.error("--groups, --members, --repeat and --churn-rounds must be >= 1")
    if args.huge:
        args.sizes = sorted({*args.sizes, 10_000_000})
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
            rows = measure(args, Path(tmp))
            churned = churn(args, Path(tmp))
    except BenchError as exc:
        print(f"bench recovery: {exc}", file=sys.stderr)
        return 1
    largest = rows[-1]
    full = [r for r in rows if r["groups"] == args.groups]
    answer_row = full[0] if full else largest
    result = {
        "benchmark": "recovery",
        "unit": "records replayed per second (median); seconds",
        "repeat": args.repeat, "groups": args.groups, "members": args.members, **machine(),
        "rows": rows,
        "headline": {"metric": "records replayed per second at the largest log; seconds until a "
                               "restarted daemon answers",
                     "records": largest["records"], "replay_per_second": largest["replay_per_second"],
                     "target_per_second": 300_000,
                     "answer_records": answer_row["records"], "answer_groups": answer_row["groups"],
                     "answer_seconds": answer_row["daemon_answer_seconds"]},
        "churn": churned,
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print(render_churn(churned))
    print(f"(median of {args.repeat}; {args.groups} groups of {args.members} members; 'answers after': "
          f"spawn of the daemon to its first Describe answer, Python start-up included)")
    print(f"(rows written to {args.output})")
    print(f"headline: {largest['replay_per_second']:,} records/s replayed at {largest['records']:,} "
          f"records (target >= 300,000); a restarted daemon with {answer_row['groups']} groups "
          f"answers after {answer_row['daemon_answer_seconds']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
