"""Who may compute a group's assignment on a secured daemon (client-side assignment's trust
model; docs/security.md, "Who computes a group's assignment").

A principal with only READ on a group could take its assignment over: join declaring the
assignor range [0, 32767] (then it is the only member whose range covers everybody's, so the
only one chosen) and an unbounded rebalance timeout, then stall every rebalance or install an
assignment giving itself everything. With ``authorizer.assign.operation = "WRITE"`` only
principals allowed WRITE on the group compute (PrepareAssignment/InstallAssignment need it, and
the coordinator never chooses a member whose principal lacks it); READ-only members still join
and run what they are given. The rebalance timeout is bounded either way.

A real in-process daemon (tests/secure_server.py) with its real security state, SASL/SCRAM
users and ACLs made through the store as CreateAcls makes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire.apis import ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb
from connect_wire.messages import connect_group_install_assignment_request_v0 as _inst
from coordinator.security.model import AclBinding
from coordinator.security.scram import credential_from_password
from coordinator.security.state import credential_record
from coordinator.security.store import append_offline
from tests.secure_server import InProcess, Raw
from tests.test_security_attack import MECHANISMS, USERS, _change

GROUP = "orders"


def _assignors(low: int, high: int) -> tuple[Any, ...]:
    return (_hb.Assignor(name="incremental", minimum_version=low, maximum_version=high,
                         reason=0, metadata_version=high if high < 100 else low,
                         metadata_bytes=b""),)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcess]:
    append_offline(tmp_path / "data", [
        credential_record(u, credential_from_password(m, pw)) for u, pw in USERS.items()
        for m in MECHANISMS])
    with InProcess(tmp_path, {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "authorizer": "acl", "super.users": "User:ANONYMOUS",
            "authorizer.assign.operation": "WRITE",
            "group.connect.session.timeout.ms": 30_000}) as d:
        with Raw(d.address("PLAINTEXT")) as admin:
            assert not admin.call(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, 0,
                                  ConnectGroupAlterConnectorsRequest(
                                      group_id=GROUP, validate_only=False, deletes=(),
                                      upserts=(_alter.ConnectorSpec(
                                          name="c", task_count=1, config=()),))).error_code
        # bob runs the group's workers and may compute; alice may only READ (join and run)
        _change(d, create=[AclBinding.of("GROUP", GROUP, "User:bob", "READ"),
                           AclBinding.of("GROUP", GROUP, "User:bob", "WRITE"),
                           AclBinding.of("GROUP", GROUP, "User:alice", "READ")])
        yield d


def _login(d: InProcess, user: str) -> Raw:
    c = Raw(d.address("SASL_PLAINTEXT"))
    assert not c.scram(user, USERS[user]).error_code
    return c


def _join(c: Raw, member_id: str, low: int, high: int, timeout_ms: int = 10_000) -> Any:
    return c.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, ConnectGroupHeartbeatRequest(
        group_id=GROUP, member_id=member_id, member_epoch=0, rebalance_timeout_ms=timeout_ms,
        client_assignors=_assignors(low, high), owned_connectors=(), owned_tasks=()))


def _prepare(c: Raw, member_id: str, epoch: int) -> Any:
    return c.call(ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT, 0, ConnectGroupPrepareAssignmentRequest(
        group_id=GROUP, member_id=member_id, member_epoch=epoch))


def test_a_read_only_member_cannot_take_over_the_assignment(daemon: InProcess) -> None:
    with _login(daemon, "bob") as bob, _login(daemon, "alice") as alice:
        r = _join(bob, "worker", 1, 1)
        assert r.error_code == 0 and r.should_compute_assignment
        # An unbounded rebalance timeout is refused (group.connect.max.rebalance.timeout.ms).
        r = _join(alice, "attacker", 0, 32767, timeout_ms=2**31 - 1)
        assert r.error_code == ErrorCode.INVALID_REQUEST
        assert "group.connect.max.rebalance.timeout.ms" in r.error_message
        # The widest range is accepted, but alice may not compute: bob stays the assigner.
        r = _join(alice, "attacker", 0, 32767, timeout_ms=300_000)
        assert r.error_code == 0 and not r.should_compute_assignment
        refused = _prepare(alice, "attacker", 0)
        assert refused.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert "not authorized to WRITE group 'orders'" in refused.error_message
        r = _join(bob, "worker", 1, 1)  # (still at epoch 0: its join fields again)
        assert r.error_code == 0 and r.should_compute_assignment
        prepared = _prepare(bob, "worker", 0)
        assert prepared.error_code == 0
        assert {m.member_id for m in prepared.members} == {"worker", "attacker"}
        installed = bob.call(ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT, 0,
                             ConnectGroupInstallAssignmentRequest(
            group_id=GROUP, member_id="worker", member_epoch=0,
            group_epoch=prepared.group_epoch, error=0, assignor_state=b"",
            scheduled_rebalance_delay_ms=-1, members=(
                _inst.MemberAssignment(member_id="worker", connectors=("c",),
                                       tasks=(_inst.TaskId(connector="c", task=0),),
                                       metadata_version=0, metadata_bytes=b""),)))
        assert installed.error_code == 0
        r = _join(bob, "worker", 1, 1)
        assert r.error_code == 0 and sorted(r.assignment.connectors) == ["c"]
        # alice, READ only, still runs what she is given (nothing here) and stays a member.
        r = alice.call(ApiKey.CONNECT_GROUP_HEARTBEAT, 0, ConnectGroupHeartbeatRequest(
            group_id=GROUP, member_id="attacker", member_epoch=0, rebalance_timeout_ms=300_000,
            client_assignors=_assignors(0, 32767), owned_connectors=(), owned_tasks=()))
        assert r.error_code == 0 and not r.should_compute_assignment


def test_task_configs_need_read_on_the_group_not_the_assign_operation(daemon: InProcess) -> None:
    """ConnectGroupWriteTaskConfigs is a worker's call, as the heartbeat: READ on the group
    suffices (alice may not compute here, yet writes the task configs of the connector she
    runs); without READ on a group it is refused before anything is looked at."""
    from connect_wire.messages import ConnectGroupWriteTaskConfigsRequest
    from connect_wire.messages import connect_group_write_task_configs_request_v0 as _wtc

    def write(c: Raw, group: str, member_id: str, epoch: int) -> Any:
        return c.call(ApiKey.CONNECT_GROUP_WRITE_TASK_CONFIGS, 0, ConnectGroupWriteTaskConfigsRequest(
            group_id=group, member_id=member_id, member_epoch=epoch, connector="c",
            task_configs=(_wtc.TaskConfig(config=(_wtc.ConfigEntry(name="k", value="v"),)),)))

    with _login(daemon, "bob") as bob, _login(daemon, "alice") as alice:
        assert _join(bob, "worker", 1, 1).should_compute_assignment
        assert _join(alice, "runner", 1, 1).error_code == 0
        r = _join(bob, "worker", 1, 1)
        prepared = _prepare(bob, "worker", 0)
        assert prepared.error_code == 0, prepared
        installed = bob.call(ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT, 0,
                             ConnectGroupInstallAssignmentRequest(
            group_id=GROUP, member_id="worker", member_epoch=0,
            group_epoch=prepared.group_epoch, error=0, assignor_state=b"",
            scheduled_rebalance_delay_ms=-1, members=(
                _inst.MemberAssignment(member_id="runner", connectors=("c",),
                                       tasks=(_inst.TaskId(connector="c", task=0),),
                                       metadata_version=0, metadata_bytes=b""),)))
        assert installed.error_code == 0
        r = _join(alice, "runner", 1, 1)
        assert r.error_code == 0 and r.assignment.connectors == ("c",)
        assert [t.connector for t in r.assignment.fencing_tokens] == ["c", "c"]
        done = write(alice, GROUP, "runner", r.member_epoch)
        assert (done.error_code, done.changed) == (0, True), done
        refused = write(alice, "elsewhere", "runner", r.member_epoch)
        assert refused.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert ("not authorized to READ group 'elsewhere' (ConnectGroupWriteTaskConfigs)"
                in refused.error_message), refused.error_message
