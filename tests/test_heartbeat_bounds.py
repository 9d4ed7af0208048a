"""What one member may make the daemon keep, against a real secured daemon process.

The attacker is ``User:alice`` over SASL_PLAINTEXT (SCRAM) with nothing but READ on group
``g1`` (which has one connector with 8 tasks, made by the super user): enough to join the group
and heartbeat. Every heartbeat here is one a worker could never send (owned lists or instance
states far longer than the group's items, a member describing itself with ~900 KB), sent as new
members in waves; the daemon's RSS is read after each wave. Before the bounds each wave kept
what it sent (about 45 MB a wave here, growing without end); now each such heartbeat is refused
INVALID_REQUEST in O(1) and nothing of it is kept. Then 1,000 members describing themselves at
the limit fill ``g1`` to the default ``group.connect.max.size``; more waves of joins get
GROUP_MAX_SIZE_REACHED and add nothing. No assertion is on time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire.apis import ApiKey
from connect_wire.errors import ErrorCode as E
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from coordinator.admin import AdminClient
from coordinator.group.validation import MAX_MEMBER_METADATA_BYTES
from tests.daemon_fixture import Daemon, DaemonPool, run_cli
from tests.secure_server import Raw
from tests.test_hostile_input import rss_bytes

GROUP = "g1"
MB = 1024 * 1024


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    data = tmp_path / "data"
    (tmp_path / "alice.pw").write_text("alice-secret\n")
    added = run_cli("users", "add", "--data-dir", str(data), "alice", "--mechanism",
                    "SCRAM-SHA-256", "--password-file", str(tmp_path / "alice.pw"))
    assert added.returncode == 0, added.stderr
    conf = tmp_path / "coordinator.toml"
    conf.write_text('authorizer = "acl"\nsuper.users = "User:ANONYMOUS"\n'
                    'sasl.enabled.mechanisms = "SCRAM-SHA-256"\nlog.fsync = "never"\n')
    with DaemonPool(tmp_path) as pool:
        d = pool.start(data, extra_args=[
            "--config", str(conf), "--listen", "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"],
            # (members stay for the whole test without heartbeating again)
            extra_env={"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "300000",
                       "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "3000"})
        acl = run_cli("acls", "add", "--bootstrap", d.address("PLAINTEXT"), "--allow-principal",
                      "User:alice", "--operation", "Read", "--group", GROUP)
        assert acl.returncode == 0, acl.stderr
        with AdminClient(d.host, d.port) as admin:
            r = admin.call(ConnectGroupAlterConnectorsRequest(
                group_id=GROUP, upserts=(_alter.ConnectorSpec(name="c", task_count=8, config=()),),
                deletes=(), validate_only=False))
            assert r.error_code == 0, r
        yield d


def alice(d: Daemon) -> Raw:
    host, port = d.listeners["SASL_PLAINTEXT"]
    c = Raw((host, port), timeout=60)
    assert c.scram("alice", "alice-secret").error_code == 0
    return c


def join(member_id: str, metadata: bytes = b"", **fields: Any) -> ConnectGroupHeartbeatRequest:
    return ConnectGroupHeartbeatRequest(
        group_id=GROUP, member_id=member_id, member_epoch=0, instance_id=None,
        rebalance_timeout_ms=60_000, worker_url=None,
        client_assignors=(_hb.Assignor(name="incremental", minimum_version=1, maximum_version=1,
                                       reason=0, metadata_version=1, metadata_bytes=metadata),),
        owned_connectors=fields.pop("owned_connectors", ()), owned_tasks=fields.pop("owned_tasks", ()),
        max_wait_ms=0, **fields)


def heartbeat(c: Raw, req: ConnectGroupHeartbeatRequest, client_id: str = "test") -> Any:
    return c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, req, client_id=client_id)


def member_at_an_epoch(c: Raw, member_id: str) -> int:
    """Join ``member_id``, compute the group's assignment as it (all items to it), take it;
    returns its member epoch."""
    r = heartbeat(c, join(member_id))
    assert r.error_code == 0 and r.should_compute_assignment, r
    p = c.call(ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT, 0, ConnectGroupPrepareAssignmentRequest(
        group_id=GROUP, member_id=member_id, member_epoch=r.member_epoch))
    assert p.error_code == 0, p
    i = c.call(ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT, 0, ConnectGroupInstallAssignmentRequest(
        group_id=GROUP, member_id=member_id, member_epoch=r.member_epoch, group_epoch=p.group_epoch,
        error=0, assignor_state=b"", scheduled_rebalance_delay_ms=-1,
        members=(_inst.MemberAssignment(
            member_id=member_id, connectors=("c",),
            tasks=tuple(_inst.TaskId(connector="c", task=t) for t in range(8)),
            metadata_version=0, metadata_bytes=b""),)))
    assert i.error_code == 0, i
    r = heartbeat(c, join(member_id))  # (the same member, its join resent)
    assert r.error_code == 0 and r.member_epoch > 0, r
    return r.member_epoch


def members(d: Daemon) -> int:
    with AdminClient(d.host, d.port) as admin:
        (g,) = admin.call(ConnectGroupDescribeRequest(group_ids=(GROUP,))).groups
    return len(g.members)


def test_a_read_only_principal_cannot_grow_the_daemon_with_oversized_reports(daemon: Daemon) -> None:
    d = daemon
    # ~110k owned tasks (~0.8 MB), ~55k instance states (~0.9 MB), one assignor's ~900 KB metadata:
    # what the attacker found the coordinator kept (9 MB, 13 MB and 0.9 MB a member).
    many_tasks = tuple(_hb.TaskId(connector="c", task=i) for i in range(110_000))
    many_states = tuple(_hb.InstanceState(connector="c", task=i, state="RUNNING",
                                          error_message=None, trace=None) for i in range(55_000))
    attacks = (
        ("tasks", dict(owned_tasks=many_tasks), "OwnedConnectors and OwnedTasks name 110,000 items"),
        ("states", dict(instance_states=many_states), "InstanceStates has 55,000 entries"),
        ("meta", dict(metadata=b"m" * 900_000), "ClientAssignors, WorkerUrl and InstanceId take"),
    )
    with alice(d) as c:
        epoch = member_at_an_epoch(c, "legit")
        rss = []
        answers = []
        ignored = []
        for wave in range(4):
            for name, fields, message in attacks:
                for i in range(2):
                    r = heartbeat(c, join(f"{name}-{wave}-{i}", **fields))
                    answers.append((r.error_code, message in (r.error_message or "")))
            # A member's own heartbeats naming as much: no evidence (an honest worker racing a
            # delete can name more than the bounds), answered, and nothing of them kept.
            for fields in (dict(owned_connectors=(), owned_tasks=many_tasks),
                           dict(instance_states=many_states)):
                r = heartbeat(c, ConnectGroupHeartbeatRequest(
                    group_id=GROUP, member_id="legit", member_epoch=epoch, **fields))
                ignored.append(r.error_code)
            rss.append(rss_bytes(d))
        assert ignored == [0] * 8
        # The first wave may warm the allocator up (the request buffers are freed, not
        # returned); the next three keep nothing (before the bounds: 141 MB over these three).
        assert rss[-1] - rss[0] < 24 * MB, [r // MB for r in rss]
        assert answers == [(E.INVALID_REQUEST, True)] * 24
        # Only the legitimate member is in the group; the connection still serves.
        assert members(d) == 1
        assert heartbeat(c, join("legit-2")).error_code == 0


def test_members_stop_at_the_default_max_size_and_cost_a_bounded_memory_each(daemon: Daemon) -> None:
    d = daemon
    # Each member describes itself at the limits: its assignor metadata as long as allowed, and
    # the longest client id a request header can carry (kept in its member record).
    meta = b"m" * (MAX_MEMBER_METADATA_BYTES - 64)
    client_id = "c" * 31_990
    rss = [rss_bytes(d)]
    joined = refused = 0
    with alice(d) as c:
        for wave in range(6):  # 250 a wave: four fill the group, two more are refused
            for i in range(250):
                r = heartbeat(c, join(f"w{wave}-{i}", metadata=meta),
                              client_id=f"{wave}-{i}-{client_id}")
                if r.error_code == 0:
                    joined += 1
                else:
                    assert r.error_code == E.GROUP_MAX_SIZE_REACHED, r
                    assert "maximum size (1000 members)" in (r.error_message or "")
                    refused += 1
            rss.append(rss_bytes(d))
    assert (joined, refused) == (1000, 500)
    assert members(d) == 1000
    # The two refused waves keep nothing; the 1,000 members took what docs/security.md says
    # a full group of members at the limits costs (measured 62 MB: ~64 KB a member).
    assert rss[6] - rss[4] < 8 * MB, [r // MB for r in rss]
    assert rss[4] - rss[0] < 80 * MB, [r // MB for r in rss]


def test_a_read_only_principal_cannot_grow_the_daemon_with_long_member_ids(daemon: Daemon) -> None:
    # A joining worker may choose its MemberId, and every record and index of the member repeats
    # it. Unbounded, a 900 KB id could not be logged (COORDINATOR_NOT_AVAILABLE, which a client
    # retries) and each such join left its soft state behind: +35 MB a wave of 40 here, without
    # end; a 30 KB id was taken, outside the member's 16 KiB.
    d = daemon
    rss = []
    answers = []
    with alice(d) as c:
        assert heartbeat(c, join("legit")).error_code == 0
        for wave in range(4):
            for i in range(40):
                for size in (900_000, 30_000):
                    r = heartbeat(c, join(f"{wave}-{i}-" + "x" * size))
                    answers.append((r.error_code, "MemberId takes" in (r.error_message or "")))
            rss.append(rss_bytes(d))
        assert answers == [(E.INVALID_REQUEST, True)] * 320, sorted(set(answers))
        # (the first wave may warm the allocator up)
        assert rss[-1] - rss[0] < 16 * MB, [r // MB for r in rss]
        assert members(d) == 1
        assert heartbeat(c, join("x" * 255)).error_code == 0  # the longest id allowed
        assert members(d) == 2
