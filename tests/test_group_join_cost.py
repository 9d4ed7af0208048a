"""A join costs the same work in a group of 100 members as in one of 3,000 (O(1) amortised).

Counted in operations, not time: the lines of ``coordinator/group`` each join executes (a line
trace). Joining 500/1,000/2,000/3,000 members used to take 0.6/2.2/7.3/14.1 s: each join scanned
every member several times (the assignor selection, the version range checks, the reconciled
index on every group epoch bump).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from connect_wire.messages import ConnectGroupHeartbeatRequest
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from coordinator.group import coordinator as _coordinator_module
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import GroupCoordinator

GROUP_DIR = os.path.dirname(_coordinator_module.__file__)
BIG = GroupCoordinatorConfig(max_size=10_000)  # (group.connect.max.size allows 1,000 by default)
ASSIGNORS = (_hb.Assignor(name="incremental", minimum_version=1, maximum_version=1, reason=0,
                          metadata_version=1, metadata_bytes=b""),)


def _join(core: GroupCoordinator, member_id: str, now_ms: int) -> Any:
    response = core.heartbeat(ConnectGroupHeartbeatRequest(
        group_id="g", member_id=member_id, member_epoch=0, rebalance_timeout_ms=10_000,
        client_assignors=ASSIGNORS, owned_connectors=(), owned_tasks=()), now_ms).response
    assert response.error_code == 0, response
    return response


def _lines(action: Any) -> int:
    """Lines of coordinator/group that ``action()`` runs."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if not frame.f_code.co_filename.startswith(GROUP_DIR):
            return None
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        action()
    finally:
        sys.settrace(None)
    return count


def _lines_per_join(members: int, joins: int = 20) -> float:
    """Lines of coordinator/group run per join, once the group has ``members`` members."""
    core = GroupCoordinator(BIG)
    for i in range(members):
        _join(core, f"member-{i}", i)

    def newcomers() -> None:
        for i in range(joins):
            _join(core, f"newcomer-{i}", members + i)
    return _lines(newcomers) / joins


def test_a_join_costs_the_same_in_small_and_large_groups() -> None:
    small = _lines_per_join(100)
    large = _lines_per_join(3_000)
    assert large < small * 1.2, (small, large)


def test_joins_with_many_assignor_versions_stay_constant() -> None:
    """Members declaring many different version ranges (each newcomer the widest, so the only
    one eligible to compute): the range checks stay O(log members)."""
    def ranged(core: GroupCoordinator, i: int) -> None:
        low = i % 50
        response = core.heartbeat(ConnectGroupHeartbeatRequest(
            group_id="g", member_id=f"m-{i}", member_epoch=0, rebalance_timeout_ms=10_000,
            client_assignors=(_hb.Assignor(name="incremental", minimum_version=low,
                                           maximum_version=100 + i, reason=0,
                                           metadata_version=low, metadata_bytes=b""),),
            owned_connectors=(), owned_tasks=()), i).response
        assert response.error_code == 0, response

    counts = []
    for size in (100, 2_000):
        core = GroupCoordinator(BIG)
        for i in range(size):
            ranged(core, i)
        counts.append(_lines(lambda c=core, n=size: [ranged(c, i) for i in range(n, n + 20)]))
        g = core.group("g")
        assert g is not None and len(g.members) == size + 20
    assert counts[1] < counts[0] * 1.2, counts
