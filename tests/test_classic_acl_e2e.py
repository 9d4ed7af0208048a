"""The classic group APIs under ``authorizer=acl``: JoinGroup/SyncGroup/Heartbeat/LeaveGroup
need READ on the group (as Kafka). A kafka-python BaseCoordinator classic worker over SASL_SSL
(the secured daemon of tests/test_security_clients.py): alice (READ on orders) joins and runs
the group's work, bob (no ACL) gets GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.classic_worker import ClassicConnectWorker
from tests.test_security_clients import USERS, daemon, metric  # noqa: F401 (the fixture)
from tests.tls_fixture import TlsFiles, tls_ca  # noqa: F401 (the fixture)


def worker(d: Any, files: TlsFiles, user: str, record: Path) -> tuple[Any, Any]:
    from kafka.net.compat import KafkaNetClient
    client = KafkaNetClient(
        bootstrap_servers=d.address("SASL_SSL"), client_id=f"classic-{user}",
        security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=user,
        sasl_plain_password=USERS[user], ssl_cafile=str(files.ca.cert),
        ssl_certfile=str(files.client.cert), ssl_keyfile=str(files.client.key))
    client._net.start()
    client._manager.bootstrap(10000)
    w = ClassicConnectWorker(client, user, "sessioned", str(record), group_id="orders",
                             session_timeout_ms=6000, heartbeat_interval_ms=500,
                             max_poll_interval_ms=10000,
                             api_version=client._manager.broker_version)
    return client, w


def test_classic_members_need_read_on_the_group(daemon: Any, tls_ca: TlsFiles,  # noqa: F811
                                                tmp_path: Path) -> None:
    from kafka.errors import GroupAuthorizationFailedError

    record = tmp_path / "records.jsonl"
    client, bob = worker(daemon, tls_ca, "bob", record)
    try:
        with pytest.raises(GroupAuthorizationFailedError):  # (FindCoordinator: DESCRIBE)
            bob.ensure_active_group(timeout_ms=10000)
        # straight to the one node, as if bob knew it: JoinGroup itself needs READ
        bob.coordinator_id = next(iter(client.cluster.brokers())).node_id
        with pytest.raises(GroupAuthorizationFailedError):
            bob.ensure_active_group(timeout_ms=10000)
    finally:
        client.close()
    assert metric(daemon, "connect_coordinator_authorization_denied_total",
                  api="JoinGroup", resource_type="GROUP") >= 1
    client, alice = worker(daemon, tls_ca, "alice", record)
    try:
        assert alice.ensure_active_group(timeout_ms=10000)
        assert alice.last["protocol"] == "sessioned" and alice.last["member_id"]
        alice.close(timeout_ms=5000)  # LeaveGroup, allowed too
    finally:
        client.close()
