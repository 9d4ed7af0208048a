"""Restart time follows the live state, not the history.

Compaction never rewrites the active segment; with nothing rolled, a log of small live state and
much churn stayed as big as the churn. Now a compaction that finds the active segment mostly
superseded rolls it (by the writer) and compacts again: the log shrinks to about the live state.
"""

from __future__ import annotations

import time
from pathlib import Path

from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.admin import AdminClient
from coordinator.runtime.log import PartitionLog, partition_dir
from tests.daemon_fixture import DaemonPool

KEYS = [f"key-{n:03d}".encode() for n in range(20)]


def test_churn_in_the_active_segment_is_rolled_and_compacted(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path / "p", segment_bytes=64 * 1024 * 1024)
    try:
        for round_ in range(500):
            log.append([(k, f"value {round_} of {k.decode()}".encode() * 4) for k in KEYS])
        log.sync()
        before = log.size_bytes
        assert len(log.segments) == 1  # nothing rolled: all history is in the active segment
        report = log.compact(now_ms=0, tombstone_grace_ms=0)
        assert report.active_bytes == before
        assert report.active_mostly_garbage(min_bytes=4096, dirty_percent=50)
        assert log.roll()
        log.compact(now_ms=0, tombstone_grace_ms=0)
        after = log.size_bytes
        assert after * 100 < before, (before, after)
        # Nothing live was lost, offsets and order kept; and the log keeps taking writes.
        latest = {key: value for _, key, value in log.read()}
        assert latest == {k: f"value 499 of {k.decode()}".encode() * 4 for k in KEYS}
        log.append([(KEYS[0], b"after")])
        log.sync()
    finally:
        log.close()
    log, report = PartitionLog.open(tmp_path / "p")
    try:
        assert report.clean
        assert {key: value for _, key, value in log.read()}[KEYS[0]] == b"after"
    finally:
        log.close()


def test_a_small_or_live_active_segment_is_not_rolled(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(tmp_path / "p")
    try:
        log.append([(k, b"v" * 100) for k in KEYS])  # all live
        log.sync()
        report = log.compact(now_ms=0, tombstone_grace_ms=0)
        assert report.active_dirty_bytes == 0
        assert not report.active_mostly_garbage(min_bytes=1, dirty_percent=50)
        log.append([(KEYS[0], b"w" * 100)])
        log.sync()
        report = log.compact(now_ms=0, tombstone_grace_ms=0)
        assert 0 < report.active_dirty_bytes
        assert not report.active_mostly_garbage(min_bytes=1, dirty_percent=50)  # 1 of 21
        assert not report.active_mostly_garbage(min_bytes=1 << 30, dirty_percent=1)  # too small
    finally:
        log.close()


def test_daemon_keeps_its_log_near_the_live_state(tmp_path: Path) -> None:
    env = {"CONNECT_COORDINATOR_LOG_COMPACTION_INTERVAL_MS": "100",
           "CONNECT_COORDINATOR_LOG_ROLL_MIN_BYTES": "4096"}
    data = tmp_path / "data"
    pdir = partition_dir(data, 0)
    config = tuple(_alter.ConfigEntry(name=f"setting-{n}", value="x" * 40) for n in range(10))
    with DaemonPool(tmp_path) as pool:
        d = pool.start(data, extra_args=["--partitions", "1"], extra_env=env)
        with AdminClient(d.host, d.port, timeout_s=15) as c:
            for n in range(300):  # churn: the same connector rewritten 300 times
                resp = c.call(ConnectGroupAlterConnectorsRequest(
                    group_id="churn", upserts=(_alter.ConnectorSpec(
                        name="c", task_count=1 + n % 7, config=config),), deletes=(),
                    validate_only=False))
                assert resp.error_code == 0, resp
        written = 300 * 600  # at least this many bytes of connectors records were appended
        deadline = time.monotonic() + 30
        while sum(f.stat().st_size for f in pdir.glob("*.log")) * 10 > written:
            assert time.monotonic() < deadline, sorted(
                (f.name, f.stat().st_size) for f in pdir.glob("*.log"))
            time.sleep(0.05)
        d.stop()
        d = pool.start(data, extra_args=["--partitions", "1"], extra_env=env)
        with AdminClient(d.host, d.port, timeout_s=15) as c:
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=("churn",))).groups
        assert [(x.name, x.task_count) for x in g.connectors] == [("c", 1 + 299 % 7)]
