"""Replay checks meaning, not just bytes.

A record with a valid CRC whose content the API would refuse (TaskCount -3, a negative epoch, a
member without assignors, a negative task id...) must not be served: both the record-by-record
replay (``CoordinatorState.replay(decode_record(...))``) and the bulk loader raise ReplayError,
and a real daemon fails that partition loudly (NOT_COORDINATOR, an error log line, the
corruption metric) while the other partitions serve.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from connect_wire.errors import ErrorCode
from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient
from coordinator.group import records as rec
from coordinator.group.model import (
    CONNECTOR,
    AssignorSpec,
    ConnectorSpec,
    CurrentAssignment,
    Item,
    MemberMetadata,
    MemberState,
    TargetMember,
)
from coordinator.group.state import CoordinatorState, ReplayError
from coordinator.runtime import serde
from coordinator.runtime.log import PartitionLog, partition_dir
from coordinator.runtime.partitioner import partition_for
from tests.daemon_fixture import DaemonPool

GID = "bad-group"
ASSIGNOR = AssignorSpec("incremental", 1, 1, 0, 1, b"")
MEMBER = MemberMetadata("m1", None, None, "client", "host", 60_000, (ASSIGNOR,))
ITEMS = frozenset({Item("c", CONNECTOR), Item("c", 0)})


def good_prefix() -> list[rec.Record]:
    return [
        rec.group_metadata(GID, 1),
        rec.group_connectors(GID, 1, [ConnectorSpec("c", 1, (("k", "v"),))]),
        rec.group_member(GID, MEMBER),
        rec.target_member(GID, "m1", TargetMember(ITEMS, 1, b"")),
        rec.target_metadata(GID, 1, 0, b"", -1),
        rec.current_assignment(GID, "m1", CurrentAssignment(1, 0, MemberState.STABLE, ITEMS,
                                                            frozenset(), 1, b"")),
    ]


BAD = {
    "negative-task-count": rec.group_connectors(GID, 2, [ConnectorSpec("c", -3, ())]),
    "empty-connector-name": rec.group_connectors(GID, 2, [ConnectorSpec("", 1, ())]),
    "slash-in-connector-name": rec.group_connectors(GID, 2, [ConnectorSpec("a/b", 1, ())]),
    "duplicate-config-name": rec.group_connectors(GID, 2, [ConnectorSpec("c", 1, (("k", "1"), ("k", "2")))]),
    "negative-connectors-epoch": rec.group_connectors(GID, -5, [ConnectorSpec("c", 1, ())]),
    "negative-group-epoch": rec.group_metadata(GID, -7),
    "member-empty-instance-id": rec.group_member(GID, MemberMetadata(
        "m1", "", None, "client", "host", 60_000, (ASSIGNOR,))),
    "member-negative-rebalance-timeout": rec.group_member(GID, MemberMetadata(
        "m1", None, None, "client", "host", -5, (ASSIGNOR,))),
    "member-bad-assignor-versions": rec.group_member(GID, MemberMetadata(
        "m1", None, None, "client", "host", 60_000, (AssignorSpec("x", 3, 1, 0, 2, b""),))),
    "target-negative-task-id": rec.target_member(GID, "m1", TargetMember(
        frozenset({Item("c", -4)}), 1, b"")),
    "target-metadata-negative-epoch": rec.target_metadata(GID, -2, 0, b"", -1),
    "current-impossible-epoch": rec.current_assignment(GID, "m1", CurrentAssignment(
        -9, 0, MemberState.STABLE, ITEMS, frozenset(), 1, b"")),
    "current-negative-task-id": rec.current_assignment(GID, "m1", CurrentAssignment(
        1, 0, MemberState.STABLE, frozenset({Item("c", -4)}), frozenset(), 1, b"")),
}


def encoded(records: list[rec.Record]) -> list[tuple[bytes, bytes | None]]:
    return [serde.encode_record(r) for r in records]


@pytest.mark.parametrize("case", sorted(BAD))
def test_record_by_record_replay_refuses(case: str) -> None:
    state = CoordinatorState()
    for key, value in encoded(good_prefix()):
        state.replay(serde.decode_record(key, value))
    key, value = serde.encode_record(BAD[case])
    with pytest.raises(ReplayError):
        state.replay(serde.decode_record(key, value))


@pytest.mark.parametrize("case", sorted(BAD))
def test_bulk_loader_refuses(case: str) -> None:
    batches = [encoded(good_prefix()), encoded([BAD[case]])]
    with pytest.raises(ReplayError):
        serde.replay_log(CoordinatorState(), batches)


def test_valid_prefix_loads_both_ways() -> None:
    """The checks refuse nothing the coordinator writes (the good prefix)."""
    one = CoordinatorState()
    for key, value in encoded(good_prefix()):
        one.replay(serde.decode_record(key, value))
    bulk = CoordinatorState()
    serde.replay_log(bulk, [encoded(good_prefix())])
    assert one.snapshot() == bulk.snapshot() and GID in one.groups


def test_daemon_fails_the_partition_with_a_refused_record(tmp_path: Path) -> None:
    partitions = 2
    data = tmp_path / "data"
    data.mkdir()
    (data / "partitions").write_text(f"{partitions}\n")
    bad = partition_for(GID, partitions)
    log, _ = PartitionLog.open(partition_dir(data, bad))
    log.append(encoded(good_prefix()))
    log.append(encoded([BAD["negative-task-count"]]))  # a valid CRC around TaskCount -3
    log.sync()
    log.close()
    with DaemonPool(tmp_path) as pool:
        d = pool.start(data, extra_args=["--partitions", str(partitions)])
        with AdminClient(d.host, d.port, timeout_s=15) as c:
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(GID,))).groups
            assert g.error_code == ErrorCode.NOT_COORDINATOR, g
            other = next(f"ok-{n}" for n in range(100) if partition_for(f"ok-{n}", partitions) != bad)
            (o,) = c.call(ConnectGroupDescribeRequest(group_ids=(other,))).groups
            assert o.error_code == ErrorCode.GROUP_ID_NOT_FOUND, o
        errors = [json.loads(line) for line in d.stderr().splitlines()
                  if line.startswith("{") and '"level":"error"' in line]
        assert [e["partition"] for e in errors] == [bad], d.stderr()[-3000:]
        assert "ReplayError" in errors[0]["error"] and "TaskCount" in errors[0]["error"], errors[0]
        assert d.metrics_url is not None
        with urllib.request.urlopen(d.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        assert f'connect_coordinator_log_corruptions_total{{partition="{bad}"}} 1.0' in text
