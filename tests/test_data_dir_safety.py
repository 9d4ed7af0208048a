"""The data dir against an unlucky operator, with real daemons.

1. A second ``serve`` on a data dir another daemon holds refuses to start: exit 2, one line
   naming the data dir and the holder's pid (``data.dir/.lock``, fcntl.flock).
2. A partition whose log falls short of its recovery point (the last segment or the whole
   ``partition-N/`` deleted while the daemon was stopped) is FAILED loudly: NOT_COORDINATOR,
   an error log line, ``connect_coordinator_log_corruptions_total``; the other partitions serve,
   nothing is served rolled back and nothing is deleted. Removing the partition's line from
   ``recovery-point-offset-checkpoint`` accepts the loss. A torn tail after SIGKILL (bytes
   beyond the last durable batch) is not a loss: it is cut and the partition serves.
10. A daemon whose every partition fails to load exits non-zero with the reason, no banner.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from connect_wire.errors import ErrorCode
from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.admin import AdminClient
from coordinator.runtime.log import partition_dir
from coordinator.runtime.partitioner import partition_for
from tests.daemon_fixture import Daemon, DaemonPool, run_serve, stderr_events

PARTITIONS = 2
ARGS = ["--partitions", str(PARTITIONS)]


@pytest.fixture
def pool(tmp_path: Path):  # type: ignore[no-untyped-def]
    with DaemonPool(tmp_path) as p:
        yield p


def group_in(partition: int, prefix: str = "g") -> str:
    n = 0
    while partition_for(f"{prefix}-{n}", PARTITIONS) != partition:
        n += 1
    return f"{prefix}-{n}"


def create(d: Daemon, gid: str, name: str, tasks: int) -> int:
    with AdminClient(d.host, d.port, timeout_s=15) as c:
        resp = c.call(ConnectGroupAlterConnectorsRequest(
            group_id=gid, upserts=(_alter.ConnectorSpec(name=name, task_count=tasks, config=()),),
            deletes=(), validate_only=False))
    return resp.error_code


def describe(d: Daemon, gid: str) -> tuple[int, dict[str, int]]:
    with AdminClient(d.host, d.port, timeout_s=15) as c:
        (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(gid,))).groups
    return g.error_code, {c.name: c.task_count for c in (g.connectors or ())}


def metric(d: Daemon, name: str, labels: dict[str, str]) -> float | None:
    assert d.metrics_url is not None
    with urllib.request.urlopen(d.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def events(d: Daemon) -> list[dict[str, object]]:
    out = []
    for line in d.stderr().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def log_end(directory: Path) -> int:
    """The offset after the last record of a partition log (format: coordinator/runtime/log.py)."""
    end = 0
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos + 29 <= len(data):
            _magic, length, _crc = struct.unpack_from(">BII", data, pos)
            base, _stamp, count = struct.unpack_from(">QQI", data, pos + 9)
            end = max(end, base + count)
            pos += 9 + length
    return end


def checkpoint_of(path: Path) -> dict[int, int]:
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    return {int(a): int(b) for a, b in (line.split() for line in lines[2:])}


# == 1. the lock ==================================================================================


def test_second_daemon_on_the_same_data_dir_refuses_to_start(pool: DaemonPool, tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = pool.start(data, extra_args=ARGS)
    gid = group_in(0)
    assert create(first, gid, "kept", 2) == 0
    try:
        second = run_serve(data, ARGS, timeout_s=20)
    except subprocess.TimeoutExpired:
        pytest.fail("a second daemon started on a data dir another daemon holds")
    assert second.returncode == 2, (second.returncode, second.stdout, second.stderr)
    assert "listening" not in second.stdout
    lines = [e for e in stderr_events(second.stderr) if e.startswith("connect-coordinator:")]
    assert len(lines) == 1, second.stderr  # one line saying why (besides the other log lines)
    assert str(data) in lines[0] and f"pid {first.proc.pid}" in lines[0], lines[0]
    # The holder is untouched and keeps serving its writes.
    assert first.alive()
    assert describe(first, gid) == (0, {"kept": 2})
    assert create(first, gid, "after", 1) == 0
    first.stop()
    # Once the holder is gone, the data dir is free again.
    again = pool.start(data, extra_args=ARGS)
    assert describe(again, gid) == (0, {"after": 1, "kept": 2})


# == 2. the recovery point ========================================================================


def build(pool: DaemonPool, data: Path) -> dict[int, str]:
    """A stopped daemon's data dir with one group (several records) per partition."""
    d = pool.start(data, extra_args=ARGS)
    gids = {p: group_in(p) for p in range(PARTITIONS)}
    for gid in gids.values():
        for i in range(5):
            assert create(d, gid, f"c{i}", i + 1) == 0
    d.stop()
    return gids


def assert_failed_loudly(d: Daemon, bad: int, gids: dict[int, str]) -> None:
    code, _ = describe(d, gids[bad])
    assert code == ErrorCode.NOT_COORDINATOR, code
    assert create(d, gids[bad], "new", 1) == ErrorCode.NOT_COORDINATOR
    errors = [e for e in events(d) if e.get("level") == "error" and e.get("partition") == bad]
    assert errors and "recovery point" in json.dumps(errors), d.stderr()[-3000:]
    assert metric(d, "connect_coordinator_log_corruptions_total", {"partition": str(bad)}) == 1.0
    good = 1 - bad
    assert describe(d, gids[good]) == (0, {f"c{i}": i + 1 for i in range(5)})
    assert not metric(d, "connect_coordinator_log_corruptions_total", {"partition": str(good)})


def test_deleted_last_segment_fails_the_partition_loudly(pool: DaemonPool, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"CONNECT_COORDINATOR_LOG_SEGMENT_BYTES": "200"}  # a segment per write
    d = pool.start(data, extra_args=ARGS, extra_env=env)
    gids = {p: group_in(p) for p in range(PARTITIONS)}
    for gid in gids.values():
        for i in range(5):
            assert create(d, gid, f"c{i}", i + 1) == 0
    d.stop()
    bad = 0
    segments = sorted(partition_dir(data, bad).glob("*.log"))
    assert len(segments) >= 3, segments
    last = [s for s in segments if s.stat().st_size > 0][-1]
    removed = last.read_bytes()
    last.unlink()
    for s in segments:  # an empty active segment after the last one goes too
        if s.name > last.name:
            s.unlink()
    d = pool.start(data, extra_args=ARGS, extra_env=env)
    assert_failed_loudly(d, bad, gids)
    d.stop()
    # Nothing was cut or moved while the partition was failed.
    assert not (partition_dir(data, bad) / "corrupt").exists()
    # Accepting the loss: drop the partition's line from the checkpoint, restart.
    last.write_bytes(removed)  # (or not: here the operator found the file again)
    d = pool.start(data, extra_args=ARGS, extra_env=env)
    assert describe(d, gids[bad]) == (0, {f"c{i}": i + 1 for i in range(5)})


def test_deleted_partition_dir_fails_the_partition_loudly(pool: DaemonPool, tmp_path: Path) -> None:
    data = tmp_path / "data"
    gids = build(pool, data)
    bad = 1
    for path in sorted(partition_dir(data, bad).rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    partition_dir(data, bad).rmdir()
    d = pool.start(data, extra_args=ARGS)
    assert_failed_loudly(d, bad, gids)
    assert not partition_dir(data, bad).exists(), "a failed partition creates nothing"
    d.stop()
    # The operator accepts the loss: the partition's line goes, the partition starts empty.
    checkpoint = data / "recovery-point-offset-checkpoint"
    lines = checkpoint.read_text().splitlines()
    kept = [line for line in lines[2:] if line.split()[0] != str(bad)]
    checkpoint.write_text("\n".join([lines[0], str(len(kept)), *kept]) + "\n")
    d = pool.start(data, extra_args=ARGS)
    assert describe(d, gids[bad]) == (ErrorCode.GROUP_ID_NOT_FOUND, {})
    assert create(d, gids[bad], "fresh", 1) == 0
    assert describe(d, gids[1 - bad]) == (0, {f"c{i}": i + 1 for i in range(5)})


def test_torn_tail_after_sigkill_is_cut_not_failed(pool: DaemonPool, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"CONNECT_COORDINATOR_LOG_RECOVERY_POINT_INTERVAL_MS": "50"}
    d = pool.start(data, extra_args=ARGS, extra_env=env)
    gid = group_in(0)
    for i in range(5):
        assert create(d, gid, f"c{i}", i + 1) == 0
    checkpoint = data / "recovery-point-offset-checkpoint"
    end = log_end(partition_dir(data, 0))
    # Let the periodic checkpoint catch up with everything written (it claims durable offsets).
    deadline = time.monotonic() + 15
    while checkpoint_of(checkpoint).get(0) != end:
        assert time.monotonic() < deadline, checkpoint.read_text() if checkpoint.exists() else None
        time.sleep(0.02)
    d.kill()
    (segment,) = [s for s in sorted(partition_dir(data, 0).glob("*.log")) if s.stat().st_size]
    with open(segment, "ab") as f:  # half a batch: a write the kill tore
        f.write(segment.read_bytes()[:40])
    d = pool.start(data, extra_args=ARGS, extra_env=env)
    assert describe(d, gid) == (0, {f"c{i}": i + 1 for i in range(5)})
    assert not [e for e in events(d) if e.get("level") == "error"], d.stderr()[-3000:]


# == 10. every partition failed ===================================================================


def test_every_partition_failing_to_load_exits_with_the_reason(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "partitions").write_text(f"{PARTITIONS}\n")
    for p in range(PARTITIONS):
        partition_dir(data, p).write_text("not a directory")  # every partition fails to open
    try:
        result = run_serve(data, ARGS, timeout_s=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon stayed up with no partition loaded")
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "listening" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert "cannot start" in last and "partition" in last and "partition-0" in last, last
    assert os.path.isfile(partition_dir(data, 0))


def test_a_checkpoint_cut_short_is_refused_not_read_as_an_earlier_point(tmp_path: Path) -> None:
    """Found by review: "0\\n1\\n0 4" (the file cut inside "0 42") read as recovery point 4, and a
    log short of 42 was served. Every line the writer writes ends with a newline."""
    from coordinator.runtime.datadir import CHECKPOINT_FILE, BadCheckpoint, read_checkpoint, write_checkpoint

    write_checkpoint(tmp_path, {0: 42}, fsync=False)
    assert read_checkpoint(tmp_path) == {0: 42}
    whole = (tmp_path / CHECKPOINT_FILE).read_text()
    (tmp_path / CHECKPOINT_FILE).write_text(whole[:-2])  # "...0 4"
    with pytest.raises(BadCheckpoint, match="cut short"):
        read_checkpoint(tmp_path)
