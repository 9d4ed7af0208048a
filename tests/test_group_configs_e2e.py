"""A group's dynamic configs through Kafka's own clients, against the real daemon.

DescribeConfigs and IncrementalAlterConfigs on resource type GROUP (32), as Kafka 4 serves its
consumer groups': kafka-python 3.x (``KafkaAdminClient.describe_configs`` / ``alter_configs`` /
``reset_configs`` with ``ConfigResourceType.GROUP``) and confluent-kafka (``ResourceType.GROUP``,
which librdkafka sends as 32; ``describe_configs``, ``incremental_alter_configs``). Every bad
input gets Kafka's error and leaves the group's configs as they were; the overrides survive a
restart (file store and etcd); a real ``connect-worker``'s heartbeats follow the interval; with
``authorizer = "acl"`` describing needs DESCRIBE_CONFIGS and altering ALTER_CONFIGS on the group;
``connect-coordinator groups configs`` does both.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire.errors import ErrorCode as E
from connect_wire.messages import ConnectGroupHeartbeatRequest
from coordinator.admin import AdminClient
from coordinator.server.group_configs import FORWARD_CLIENT_ID
from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env, run_cli, start_with_acls
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)
from tests.secure_server import Raw

SESSION = "connect.session.timeout.ms"
INTERVAL = "connect.heartbeat.interval.ms"


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = run_cli(*args)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def kp_admin(d: Daemon) -> Any:
    from kafka import KafkaAdminClient
    return KafkaAdminClient(bootstrap_servers=d.bootstrap, request_timeout_ms=10000)


def kp_configs(admin: Any, group: str, config_filter: str = "all") -> dict[str, dict[str, Any]]:
    from kafka.admin import ConfigResource, ConfigResourceType
    got = admin.describe_configs([ConfigResource(ConfigResourceType.GROUP, group)],
                                 include_synonyms=True, config_filter=config_filter)
    return got.get("group", {}).get(group, {})


def kp_alter(admin: Any, group: str, configs: dict[str, Any], **kw: Any) -> str:
    from kafka.admin import ConfigResource, ConfigResourceType
    got = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group, configs=configs)],
                              raise_on_unknown=kw.pop("raise_on_unknown", False), **kw)
    return got["group"][group]


def test_kafka_python_describes_alters_resets_and_the_overrides_survive_a_restart(
        tmp_path: Path, pool: DaemonPool) -> None:
    import kafka
    from kafka.admin import ConfigResource, ConfigResourceType

    assert kafka.__version__.startswith("3.")
    d = pool.start(tmp_path / "data")
    admin = kp_admin(d)
    # A group that does not exist describes the defaults (the daemon's settings, here the test
    # fixture's 2000/200): every config, DEFAULT_CONFIG, not read-only, INT, the daemon setting
    # as synonym; the default filter ('modified') shows none.
    got = kp_configs(admin, "orders")
    assert {k: (v["value"], v["config_source"], v["read_only"], v["config_type"])
            for k, v in got.items()} == {
        SESSION: ("2000", "DEFAULT_CONFIG", False, "INT"),
        INTERVAL: ("200", "DEFAULT_CONFIG", False, "INT")}
    assert got[SESSION]["synonyms"] == [{"name": "group.connect.session.timeout.ms",
                                         "value": "2000", "source": "DEFAULT_CONFIG"}]
    assert kp_configs(admin, "orders", "modified") == {}
    # SET (IncrementalAlterConfigs: the daemon advertises it): both, in one request.
    assert kp_alter(admin, "orders", {SESSION: "3000", INTERVAL: "150"}) == "OK"
    got = kp_configs(admin, "orders", "modified")
    assert {k: (v["value"], v["config_source"]) for k, v in got.items()} == {
        SESSION: ("3000", "DYNAMIC_GROUP_CONFIG"), INTERVAL: ("150", "DYNAMIC_GROUP_CONFIG")}
    assert [s["source"] for s in got[SESSION]["synonyms"]] == ["DYNAMIC_GROUP_CONFIG",
                                                              "DEFAULT_CONFIG"]
    # validate_only: checked, nothing written.
    assert kp_alter(admin, "orders", {SESSION: "4000"}, validate_only=True) == "OK"
    assert kp_alter(admin, "orders", {SESSION: "5"}, validate_only=True).startswith("[Error 40]")
    # Every bad input: Kafka's error, the configs untouched.
    expected = {SESSION: "3000", INTERVAL: "150"}
    for configs, error in [
        ({INTERVAL: "5"}, "[Error 40] InvalidConfigurationError: connect.heartbeat.interval.ms "
                          "must be greater than or equal to group.connect.min.heartbeat"
                          ".interval.ms (100)"),
        ({SESSION: "999999999"}, "[Error 40] InvalidConfigurationError: connect.session.timeout"
                                 ".ms must be less than or equal to group.connect.max.session"
                                 ".timeout.ms (300000)"),
        ({INTERVAL: "3000"}, "[Error 40] InvalidConfigurationError: connect.session.timeout.ms "
                             "(3000) must be greater than connect.heartbeat.interval.ms (3000)"),
        ({SESSION: "soon"}, "[Error 40] InvalidConfigurationError: Invalid value soon for "
                            "configuration connect.session.timeout.ms: Not a number of type INT"),
        ({"connect.unknown.ms": "1"}, "[Error 40] InvalidConfigurationError: Unknown group "
                                      "config name: connect.unknown.ms"),
        ({SESSION: ("APPEND", "1")}, "[Error 40] InvalidConfigurationError: Can't APPEND to key "
                                     "connect.session.timeout.ms because its type is not LIST."),
        ({SESSION: ("SUBTRACT", "1")}, "[Error 40] InvalidConfigurationError: Can't SUBTRACT"),
    ]:
        assert kp_alter(admin, "orders", configs).startswith(error), configs
        got = kp_configs(admin, "orders", "modified")
        assert {k: v["value"] for k, v in got.items()} == expected, configs
    # kafka-python's own check (a describe first) refuses an unknown name before sending.
    with pytest.raises(ValueError, match="Unrecognized configs"):
        kp_alter(admin, "orders", {"connect.unknown.ms": "1"}, raise_on_unknown=True)
    # Resources are answered one by one: an empty group name (INVALID_REQUEST) and a topic
    # (this daemon has none) do not fail the group's change in the same request.
    got = admin.alter_configs([
        ConfigResource(ConfigResourceType.GROUP, "", configs={SESSION: "3000"}),
        ConfigResource(ConfigResourceType.TOPIC, "t", configs={"retention.ms": "1"}),
        ConfigResource(ConfigResourceType.GROUP, "payments", configs={SESSION: "6000"}),
    ], raise_on_unknown=False)
    assert got["group"][""] == ("[Error 42] InvalidRequestError: Default group resources are "
                                "not allowed.")
    assert got["topic"]["t"].startswith("[Error 3] UnknownTopicOrPartitionError")
    assert got["group"]["payments"] == "OK"
    # DELETE (reset_configs): back to the default.
    got = admin.reset_configs([ConfigResource(ConfigResourceType.GROUP, "orders",
                                              configs=[INTERVAL])])
    assert got == {"group": {"orders": "OK"}}
    got = kp_configs(admin, "orders")
    assert {k: (v["value"], v["config_source"]) for k, v in got.items()} == {
        SESSION: ("3000", "DYNAMIC_GROUP_CONFIG"), INTERVAL: ("200", "DEFAULT_CONFIG")}
    admin.close()
    # The overrides are records of the groups' partitions: a restart replays them.
    d.stop()
    d = pool.start(tmp_path / "data")
    admin = kp_admin(d)
    assert {k: v["value"] for k, v in kp_configs(admin, "orders", "modified").items()} == {
        SESSION: "3000"}
    assert {k: v["value"] for k, v in kp_configs(admin, "payments", "modified").items()} == {
        SESSION: "6000"}
    admin.close()


def test_confluent_kafka_describe_and_incremental_alter(pool: DaemonPool) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
        ResourceType,
    )

    d = pool.start()
    admin = AdminClient({"bootstrap.servers": d.bootstrap})

    def describe(group: str) -> dict[str, Any]:
        (future,) = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
        return future.result(timeout=20)

    def alter(group: str, *ops: tuple[str, str | None, Any], validate_only: bool = False) -> Any:
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops])
        (future,) = admin.incremental_alter_configs(
            [resource], validate_only=validate_only).values()
        return future.result(timeout=20)

    got = describe("billing")
    assert {k: (v.value, v.source, v.is_read_only, v.is_default) for k, v in got.items()} == {
        SESSION: ("2000", ConfigSource.DEFAULT_CONFIG.value, False, True),
        INTERVAL: ("200", ConfigSource.DEFAULT_CONFIG.value, False, True)}
    assert alter("billing", (INTERVAL, "300", AlterConfigOpType.SET),
                 (SESSION, "4000", AlterConfigOpType.SET)) is None
    got = describe("billing")
    assert {k: (v.value, v.source) for k, v in got.items()} == {
        SESSION: ("4000", ConfigSource.GROUP_CONFIG.value),
        INTERVAL: ("300", ConfigSource.GROUP_CONFIG.value)}
    alter("billing", (INTERVAL, "500", AlterConfigOpType.SET), validate_only=True)
    assert describe("billing")[INTERVAL].value == "300"
    for ops, code, text in [
        (((SESSION, "100", AlterConfigOpType.SET),), 40, "greater than or equal to"),
        (((INTERVAL, "4000", AlterConfigOpType.SET),), 40, "must be greater than"),
        ((("connect.nope", "1", AlterConfigOpType.SET),), 40, "Unknown group config name"),
        (((SESSION, "1", AlterConfigOpType.APPEND),), 40, "Can't APPEND"),
    ]:
        with pytest.raises(KafkaException) as raised:
            alter("billing", *ops)
        error = raised.value.args[0]
        assert (error.code(), text in error.str()) == (code, True), error
        assert {k: v.value for k, v in describe("billing").items()} == {SESSION: "4000",
                                                                        INTERVAL: "300"}
    # DELETE: back to the default.
    alter("billing", (INTERVAL, None, AlterConfigOpType.DELETE))
    got = describe("billing")
    assert (got[INTERVAL].value, got[INTERVAL].source) == ("200",
                                                           ConfigSource.DEFAULT_CONFIG.value)


def _heartbeats(d: Daemon) -> float:
    assert d.metrics_url is not None
    text = urllib.request.urlopen(f"{d.metrics_url}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'connect_coordinator_requests_total\{api="ConnectGroupHeartbeat"[^}]*\} (\S+)', text))


def test_a_real_worker_heartbeats_at_the_group_interval(tmp_path: Path, pool: DaemonPool) -> None:
    d = pool.start(tmp_path / "data")
    cli("connectors", "create", "--bootstrap", d.bootstrap, "--group", "demo", "c", "--tasks",
        "1", "--config", "connector.class=worker_client.examples.recording:RecordingConnector")
    w = subprocess.Popen([sys.executable, "-m", "worker_client.cli", "run", "--bootstrap",
                          d.bootstrap, "--group", "demo", "--instance-id", "w1"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=daemon_env(), cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while "Stable" not in cli("groups", "list", "--bootstrap", d.bootstrap).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.2)

        def counted(seconds: float) -> float:
            start = _heartbeats(d)
            time.sleep(seconds)
            return _heartbeats(d) - start

        fast = counted(3)  # at the daemon's 200 ms
        out = cli("groups", "configs", "--bootstrap", d.bootstrap, "--group", "demo",
                  "--set", f"{INTERVAL}=1500", "--set", f"{SESSION}=6000", "--json").stdout
        assert {c["name"]: (c["value"], c["source"]) for c in json.loads(out)["configs"]} == {
            SESSION: ("6000", "GROUP_CONFIG"), INTERVAL: ("1500", "GROUP_CONFIG")}
        time.sleep(2)  # (the worker's next heartbeat brings it the new interval)
        slow = counted(3)
        # The group's every heartbeat answer carries it (an error answer too)...
        with Raw((d.host, d.port), timeout=30) as raw:
            r = raw.call(10000, 0, ConnectGroupHeartbeatRequest(
                group_id="demo", member_id="nobody", member_epoch=3))
            assert (r.error_code, r.heartbeat_interval_ms) == (E.UNKNOWN_MEMBER_ID, 1500)
        # ... and the worker follows it: about 15 heartbeats in 3 s before, 2 after (a ratio of
        # 7.5; asserted with room for a loaded machine).
        assert fast >= 3 * max(slow, 1), (fast, slow)
        assert "Stable" in cli("groups", "list", "--bootstrap", d.bootstrap).stdout
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(15)


def test_the_cli_and_the_acls(tmp_path: Path) -> None:
    with DaemonPool(tmp_path) as pool:
        d = start_with_acls(pool, tmp_path)
        plain = ("--bootstrap", d.address("PLAINTEXT"), "--group", "g")
        sasl = ("--bootstrap", d.address("SASL_PLAINTEXT"), "--security-protocol",
                "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "ops",
                "--sasl-password-file", str(tmp_path / "ops.pw"), "--group", "g")
        # The CLI: describe (a table), set, delete, errors with a non-zero exit.
        out = cli("groups", "configs", *plain).stdout
        assert re.search(rf"{re.escape(SESSION)}\s+2000\s+DEFAULT_CONFIG\s+2000", out), out
        cli("groups", "configs", *plain, "--set", f"{SESSION}=5000", "--set", f"{INTERVAL}=400")
        out = cli("groups", "configs", *plain, "--delete", INTERVAL).stdout
        assert re.search(rf"{re.escape(SESSION)}\s+5000\s+GROUP_CONFIG\s+2000", out), out
        assert re.search(rf"{re.escape(INTERVAL)}\s+200\s+DEFAULT_CONFIG\s+200", out), out
        bad = cli("groups", "configs", *plain, "--set", f"{INTERVAL}=9000", ok=False)
        assert bad.returncode == 1
        assert bad.stderr.strip() == (
            "connect-coordinator: INVALID_CONFIG: connect.session.timeout.ms (5000) must be "
            "greater than connect.heartbeat.interval.ms (9000)")
        bad = cli("groups", "configs", *plain, "--set", "nonsense", ok=False)
        assert bad.returncode == 2 and "'nonsense' is not KEY=VALUE" in bad.stderr
        bad = cli("groups", "configs", *plain, "--set", f"{SESSION}=1", "--delete", SESSION,
                  ok=False)
        assert bad.returncode == 1 and "named twice" in bad.stderr
        out = cli("groups", "configs", *plain, "--set", f"{SESSION}=7000", "--validate-only",
                  "--json").stdout
        assert {c["name"]: c["value"] for c in json.loads(out)["configs"]}[SESSION] == "5000"
        # ACLs: describing needs DESCRIBE_CONFIGS on the group, altering ALTER_CONFIGS.
        denied = cli("groups", "configs", *sasl, ok=False)
        assert denied.returncode == 1 and "GROUP_AUTHORIZATION_FAILED" in denied.stderr
        assert "User:ops" in denied.stderr and "DESCRIBE_CONFIGS" in denied.stderr
        cli("acls", "add", *plain[:2], "--allow-principal", "User:ops", "--operation",
            "DescribeConfigs", "--group", "g")
        assert "5000" in cli("groups", "configs", *sasl).stdout
        denied = cli("groups", "configs", *sasl, "--set", f"{SESSION}=6000", ok=False)
        assert denied.returncode == 1 and "ALTER_CONFIGS" in denied.stderr
        cli("acls", "add", *plain[:2], "--allow-principal", "User:ops", "--operation",
            "AlterConfigs", "--group", "g")
        out = cli("groups", "configs", *sasl, "--set", f"{SESSION}=6000", "--json").stdout
        assert {c["name"]: c["value"] for c in json.loads(out)["configs"]}[SESSION] == "6000"
        # (ALTER_CONFIGS implies DESCRIBE_CONFIGS, as Kafka's authorizer; another group: no)
        denied = cli("groups", "configs", *sasl[:-1], "other", ok=False)
        assert denied.returncode == 1 and "GROUP_AUTHORIZATION_FAILED" in denied.stderr
        # Allowed to alter but denied describing (a DENY wins over what ALTER_CONFIGS implies):
        # the change is made, and the CLI says so (it exited 1 naming only the describe's
        # refusal, as if nothing had been written).
        cli("acls", "add", *plain[:2], "--deny-principal", "User:ops", "--operation",
            "DescribeConfigs", "--group", "g")
        r = cli("groups", "configs", *sasl, "--set", f"{SESSION}=6500")
        assert r.stdout.startswith(f"applied: {SESSION}=6500 to group g\n"), r.stdout
        assert "could not describe" in r.stderr and "DESCRIBE_CONFIGS" in r.stderr, r.stderr
        out = cli("groups", "configs", *plain, "--json").stdout
        assert {c["name"]: c["value"] for c in json.loads(out)["configs"]}[SESSION] == "6500"
        r = cli("groups", "configs", *sasl, "--delete", SESSION, "--json")
        assert json.loads(r.stdout) == {"group": "g", "validate_only": False, "configs": None,
                                        "applied": [{"name": SESSION, "operation": "DELETE",
                                                     "value": None}]}
        assert "could not describe" in r.stderr


def test_overrides_on_etcd_survive_a_restart(tmp_path: Path, pool: DaemonPool,
                                             etcd_endpoint: str) -> None:  # noqa: F811
    args = ["--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix",
            f"/groupcfg-{time.time_ns()}", "--node-id", "1", "--partitions", "2"]
    d = pool.start(tmp_path / "n1", extra_args=args)
    base = ("groups", "configs", "--bootstrap", d.bootstrap, "--group", "g", "--json",
            "--timeout", "30")
    cli(*base, "--set", f"{SESSION}=4000")
    d.stop()
    d = pool.start(tmp_path / "n1", extra_args=args)
    base = ("groups", "configs", "--bootstrap", d.bootstrap, "--group", "g", "--json",
            "--timeout", "30")
    got = {c["name"]: (c["value"], c["source"])
           for c in json.loads(cli(*base).stdout)["configs"]}
    assert got == {SESSION: ("4000", "GROUP_CONFIG"), INTERVAL: ("200", "DEFAULT_CONFIG")}


def _describe_request(version: int, resources: list[dict[str, Any]], **kw: Any) -> Any:
    from connect_wire.apis import APIS
    from coordinator.server.kafka_apis import build
    return build(APIS[32].request_class(version), {"resources": resources, **kw})


def _alter_request(version: int, resources: list[dict[str, Any]], validate_only: bool = False) -> Any:
    from connect_wire.apis import APIS
    from coordinator.server.kafka_apis import build
    return build(APIS[44].request_class(version), {"resources": resources,
                                                   "validate_only": validate_only})


def test_every_version_and_each_bad_resource_on_the_wire(pool: DaemonPool) -> None:
    d = pool.start(extra_env={"CONNECT_COORDINATOR_REQUEST_MAX_ITEMS": "3"})
    group = {"resource_type": 32, "resource_name": "g"}
    with Raw((d.host, d.port), timeout=30) as raw:
        # ApiVersions advertises DescribeConfigs v1-4 (Kafka 4 has no v0) and
        # IncrementalAlterConfigs v0-1.
        from kio.schema.api_versions.v3.request import ApiVersionsRequest
        versions = {a.api_key: (a.min_version, a.max_version) for a in raw.call(
            18, 3, ApiVersionsRequest(client_software_name="t",
                                      client_software_version="1")).api_keys}
        assert (versions[32], versions[44]) == ((1, 4), (0, 1))
        for version in (0, 1):
            r = raw.call(44, version, _alter_request(version, [{**group, "configs": [
                {"name": SESSION, "config_operation": 0, "value": str(3000 + version)}]}]))
            assert [(x.error_code, x.resource_name) for x in r.responses] == [(0, "g")]
        for version in (1, 2, 3, 4):
            r = raw.call(32, version, _describe_request(
                version, [{**group, "configuration_keys": [SESSION, "connect.nothing"]}],
                include_synonyms=True, include_documentation=True))
            (result,) = r.results
            assert result.error_code == 0
            (c,) = result.configs  # (the keys asked for; an unknown one is left out, as Kafka)
            assert (c.name, c.value, c.read_only, c.config_source) == (SESSION, "3001", False, 8)
            assert [(s.name, s.value, s.source) for s in c.synonyms] == [
                (SESSION, "3001", 8), ("group.connect.session.timeout.ms", "2000", 5)]
            if version >= 3:
                assert c.config_type == 3 and c.documentation
        # An empty key list asks for none (Kafka's protocol: null asks for all).
        r = raw.call(32, 4, _describe_request(4, [{**group, "configuration_keys": []}]))
        assert r.results[0].configs == ()
        # Each bad resource gets its error; the good one in the same request is applied.
        r = raw.call(44, 1, _alter_request(1, [
            {"resource_type": 4, "resource_name": "0", "configs": []},
            {"resource_type": 32, "resource_name": "dup", "configs": []},
            {"resource_type": 32, "resource_name": "dup", "configs": []},
        ]))
        assert [(x.error_code, x.error_message) for x in r.responses] == [
            (E.INVALID_REQUEST, "Unexpected resource type BROKER (4): connect-coordinator serves "
                                "the configs of groups only (resource type GROUP, 32)."),
            (E.INVALID_REQUEST, "Each resource must appear at most once."),
            (E.INVALID_REQUEST, "Each resource must appear at most once.")]
        r = raw.call(44, 1, _alter_request(1, [
            {**group, "configs": [{"name": SESSION, "config_operation": 0, "value": "4000"},
                                  {"name": SESSION, "config_operation": 1, "value": None}]},
            {"resource_type": 32, "resource_name": "h", "configs": [
                {"name": SESSION, "config_operation": 7, "value": "1"}]},
            {"resource_type": 32, "resource_name": "k", "configs": [
                {"name": SESSION, "config_operation": 0, "value": None}]},
        ]))
        assert [(x.error_code, x.error_message) for x in r.responses] == [
            (E.INVALID_REQUEST, "Error due to duplicate config keys"),
            (E.INVALID_REQUEST, f"Unknown alter config operation 7 for key {SESSION}"),
            (E.INVALID_CONFIG, "Null value not supported for group configs")]
        # A group id longer than its records can carry: INVALID_GROUP_ID, not the store's
        # failure (COORDINATOR_NOT_AVAILABLE, which clients retry).
        r = raw.call(44, 1, _alter_request(1, [{"resource_type": 32, "resource_name": "x" * 40_000,
                                                "configs": [{"name": SESSION,
                                                             "config_operation": 0,
                                                             "value": "4000"}]}]))
        assert [(x.error_code, x.error_message) for x in r.responses] == [
            (E.INVALID_GROUP_ID, "GroupId takes 40,000 bytes, more than the 32,767 a group's "
                                 "records can carry.")]
        r = raw.call(32, 4, _describe_request(4, [
            {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
            {"resource_type": 32, "resource_name": "", "configuration_keys": None},
            {**group, "configuration_keys": None}]))
        assert [(x.error_code, x.error_message) for x in r.results[:2]] == [
            (E.UNKNOWN_TOPIC_OR_PARTITION,
             "The topic 't' does not exist: connect-coordinator hosts no topics."),
            (E.INVALID_REQUEST, "Group name must not be empty")]
        assert {c.name: c.value for c in r.results[2].configs} == {SESSION: "3001",
                                                                   INTERVAL: "200"}
        # More resources than request.max.items: INVALID_REQUEST on each, nothing looked up.
        r = raw.call(44, 1, _alter_request(1, [
            {"resource_type": t, "resource_name": f"g{i}", "configs": [
                {"name": SESSION, "config_operation": 0, "value": "5000"}]}
            for i, t in enumerate((32, 2, 32, 32))]))
        assert [(x.error_code, x.resource_type, x.resource_name) for x in r.responses] == [
            (E.INVALID_REQUEST, t, f"g{i}") for i, t in enumerate((32, 2, 32, 32))]
        assert "more than request.max.items=3" in r.responses[0].error_message
        r = raw.call(32, 1, _describe_request(1, [
            {**group, "configuration_keys": None}] * 4))
        assert {x.error_code for x in r.results} == {E.INVALID_REQUEST}
        # The group is as it was.
        r = raw.call(32, 4, _describe_request(4, [{**group, "configuration_keys": None}]))
        assert {c.name: (c.value, c.config_source) for c in r.results[0].configs} == {
            SESSION: ("3001", 8), INTERVAL: ("200", 5)}


def test_on_several_nodes_any_node_answers_and_a_failover_keeps_the_overrides(
        tmp_path: Path, etcd_endpoint: str) -> None:  # noqa: F811
    from tests.test_cluster_e2e import Cluster
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool, etcd_endpoint, f"/groupcfg-cluster-{time.time_ns()}",
                    nodes=2, partitions=4)
        try:
            c.start(1)
            c.start(2)
            c.wait(lambda: c.owned_everywhere(), "every partition owned by a live node")
            group = c.group_owned_by(2)
            # The CLI finds the owner among the nodes (bootstrap: both).
            r = c.cli("groups", "configs", "--group", group, "--set", f"{SESSION}=20000",
                      "--json", "--timeout", "30")
            assert r.returncode == 0, r.stderr
            # Both nodes answer the override: node 1 forwards the resource to the owner.
            request = _describe_request(4, [{"resource_type": 32, "resource_name": group,
                                             "configuration_keys": [SESSION]}])
            (other,) = c.call(1, request).results
            (owner,) = c.call(2, request).results
            assert other == owner and (owner.error_code, owner.configs[0].value) == (0, "20000")
            # A forwarded request is never forwarded again (its client id says what it is).
            with AdminClient("127.0.0.1", c.ports[1], timeout_s=3,
                             client_id=FORWARD_CLIENT_ID) as raw:
                (again,) = raw.call(request).results
            assert again.error_code == E.NOT_COORDINATOR, again
            # The owner stops answering (SIGSTOP): node 1's forward gives up after its timeout,
            # and that resource is COORDINATOR_NOT_AVAILABLE (retriable), saying why.
            c.nodes[2].proc.send_signal(signal.SIGSTOP)
            with AdminClient("127.0.0.1", c.ports[1], timeout_s=30) as raw:
                (stalled,) = raw.call(request).results
            assert stalled.error_code == E.COORDINATOR_NOT_AVAILABLE, stalled
            assert "forwarding this request to it failed" in stalled.error_message, stalled
            # kill -9 of the owner: node 1 takes the partition over, with the override.
            c.nodes[2].kill()
            c.wait(lambda: c.coordinator_of(group) == 1, "node 1 to take the group")

            def moved() -> bool:
                (x,) = c.call(1, request).results
                return x.error_code == 0 and x.configs[0].value == "20000"
            c.wait(moved, "the override on node 1")
        finally:
            c.close()


def _forwards(d: Daemon) -> dict[str, float]:
    assert d.metrics_url is not None
    text = urllib.request.urlopen(f"{d.metrics_url}/metrics", timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(
        r'^connect_coordinator_group_config_forwards_total\{outcome="(\w+)"\} (\S+)$', text, re.M)}


def test_kafka_clients_bootstrapped_to_a_node_that_does_not_own_the_group(
        tmp_path: Path, etcd_endpoint: str) -> None:  # noqa: F811
    """Kafka's admin clients send GROUP config requests to any broker (the least loaded one)
    and do not retry NOT_COORDINATOR for them: every node must answer."""
    from confluent_kafka.admin import AdminClient as CkAdmin
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    from kafka import KafkaAdminClient

    from tests.test_cluster_e2e import Cluster
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool, etcd_endpoint, f"/groupcfg-forward-{time.time_ns()}",
                    nodes=2, partitions=4)
        try:
            c.start(1)
            c.start(2)
            c.wait(lambda: c.owned_everywhere(), "every partition owned by a live node")
            group = c.group_owned_by(2)
            # Node 1 only: whatever node the client picks, it is node 1 (until it reads
            # Metadata, which lists both: then either).
            for k, bootstrap in enumerate([f"127.0.0.1:{c.ports[1]}", c.bootstrap]):
                admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
                for n in range(4):
                    value = str(300 + 10 * n + 100 * k)
                    assert kp_alter(admin, group, {INTERVAL: value}) == "OK"
                    got = kp_configs(admin, group)
                    assert (got[INTERVAL]["value"], got[INTERVAL]["config_source"]) == (
                        value, "DYNAMIC_GROUP_CONFIG")
                admin.close()
            for k, bootstrap in enumerate([f"127.0.0.1:{c.ports[1]}", c.bootstrap]):
                ck = CkAdmin({"bootstrap.servers": bootstrap})
                for n in range(4):
                    value = str(2500 + 100 * n + 1000 * k)
                    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
                        ConfigEntry(SESSION, value, incremental_operation=AlterConfigOpType.SET)])
                    (done,) = ck.incremental_alter_configs([resource]).values()
                    assert done.result(timeout=20) is None
                    (described,) = ck.describe_configs(
                        [ConfigResource(ResourceType.GROUP, group)]).values()
                    got = described.result(timeout=20)
                    assert (got[SESSION].value, got[SESSION].source) == (value, 8)
            # Node 1 forwarded (at least the requests of the clients bootstrapped to it alone);
            # the owner had nothing to forward.
            assert _forwards(c.nodes[1]).get("ok", 0) >= 8, _forwards(c.nodes[1])
            assert _forwards(c.nodes[1]).get("failed", 0) == 0
            assert _forwards(c.nodes[2]).get("ok", 0) == 0
            # Errors found by the owner come back as they are (INVALID_CONFIG, its message).
            bad = _alter_request(1, [{"resource_type": 32, "resource_name": group, "configs": [
                {"name": INTERVAL, "config_operation": 0, "value": "9000"}]}])
            (r,) = c.call(1, bad).responses
            assert (r.error_code, "must be greater than" in (r.error_message or "")) == (
                E.INVALID_CONFIG, True), r
        finally:
            c.close()


def test_a_forward_is_authorized_on_both_nodes(tmp_path: Path, etcd_endpoint: str) -> None:  # noqa: F811
    """The node a client asks checks the client's principal; the owner checks the forwarding
    connection's (User:ANONYMOUS on the PLAINTEXT listener): a forward allows no more than both."""
    from connect_wire.client_security import ClientSecurity
    from tests.test_cluster_e2e import Cluster

    prefix = f"/groupcfg-forward-acl-{time.time_ns()}"
    for user in ("admin", "ops"):
        (tmp_path / f"{user}.pw").write_text(f"{user}-secret\n")
        r = run_cli("users", "add", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", prefix,
                    user, "--mechanism", "SCRAM-SHA-256", "--password-file",
                    str(tmp_path / f"{user}.pw"))
        assert r.returncode == 0, r.stderr
    conf = tmp_path / "coordinator.toml"
    conf.write_text('authorizer = "acl"\nsuper.users = "User:admin"\n'
                    'sasl.enabled.mechanisms = "SCRAM-SHA-256"\n')

    class SaslCluster(Cluster):
        def start(self, i: int) -> Daemon:
            d = self.pool.start(self.base / f"node{i}", extra_env=self.env, extra_args=[
                "--config", str(conf), "--listen",
                f"PLAINTEXT://127.0.0.1:{self.ports[i]},SASL_PLAINTEXT://127.0.0.1:0",
                "--store", "etcd", "--etcd-endpoints", self.endpoint, "--etcd-prefix",
                self.prefix, "--node-id", str(i), "--partitions", str(self.partitions)])
            self.nodes[i] = d
            return d

        def call(self, i: int, request: Any) -> Any:  # (FindCoordinator: as the admin)
            return call(i, "admin", request)

    def sasl(user: str) -> ClientSecurity:
        return ClientSecurity("SASL_PLAINTEXT", "SCRAM-SHA-256", user, f"{user}-secret")

    def call(i: int, user: str, request: Any) -> Any:
        host, port = c.nodes[i].listeners["SASL_PLAINTEXT"]
        with AdminClient(host, port, timeout_s=10, security=sasl(user)) as client:
            return client.call(request)

    def allow(principal: str, operation: str) -> None:
        r = run_cli("acls", "add", "--bootstrap", c.nodes[1].address("SASL_PLAINTEXT"),
                    "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism",
                    "SCRAM-SHA-256", "--sasl-username", "admin", "--sasl-password-file",
                    str(tmp_path / "admin.pw"), "--allow-principal", principal,
                    "--operation", operation, "--group", group)
        assert r.returncode == 0, r.stderr

    with DaemonPool(tmp_path) as pool:
        c = SaslCluster(tmp_path, pool, etcd_endpoint, prefix, nodes=2, partitions=4)
        try:
            c.start(1)
            c.start(2)
            c.wait(lambda: c.owned_everywhere(), "every partition owned by a live node")
            group = c.group_owned_by(2)
            describe = _describe_request(4, [{"resource_type": 32, "resource_name": group,
                                              "configuration_keys": None}])
            alter = _alter_request(1, [{"resource_type": 32, "resource_name": group, "configs": [
                {"name": SESSION, "config_operation": 0, "value": "7000"}]}])
            # ops may not describe: refused by node 1 itself, nothing forwarded.
            (r,) = call(1, "ops", describe).results
            assert r.error_code == E.GROUP_AUTHORIZATION_FAILED and "User:ops" in r.error_message
            assert _forwards(c.nodes[1]) == {}
            # ops may; the forwarding connection (ANONYMOUS) may not: the owner refuses it.
            allow("User:ops", "DescribeConfigs")
            (r,) = call(1, "ops", describe).results
            assert r.error_code == E.GROUP_AUTHORIZATION_FAILED, r
            assert "node 2, which refused this node's forwarding connection (listener " \
                   "PLAINTEXT)" in r.error_message and "User:ANONYMOUS" in r.error_message, r
            # Both may describe; only the forwarding connection may alter: ops may not.
            allow("User:ANONYMOUS", "AlterConfigs")
            (r,) = call(1, "ops", describe).results
            assert (r.error_code, {x.name: x.value for x in r.configs}[SESSION]) == (0, "10000")
            (r,) = call(1, "ops", alter).responses
            assert r.error_code == E.GROUP_AUTHORIZATION_FAILED and "User:ops" in r.error_message
            assert "ALTER_CONFIGS" in r.error_message
            # An admin's alter through node 1: forwarded and applied.
            (r,) = call(1, "admin", alter).responses
            assert r.error_code == 0, r
            (r,) = call(2, "ops", describe).results
            assert {x.name: x.value for x in r.configs}[SESSION] == "7000"
            assert _forwards(c.nodes[1]) == {"ok": 3.0}  # (not the alter refused by node 1)
        finally:
            c.close()


def test_the_client_examples_in_kafka_clients_md_run(pool: DaemonPool) -> None:
    # docs/kafka-clients.md's Group configs snippet, run as written against the daemon (its
    # confluent-kafka line indexed the futures by the group's name: a KeyError).
    text = (ROOT / "docs" / "kafka-clients.md").read_text()
    section = text[text.index("## Group configs"):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("\n```", start)]
    assert "incremental_alter_configs" in code and "KafkaAdminClient" in code
    d = pool.start()
    exec(compile(code.replace("127.0.0.1:9092", d.bootstrap), "kafka-clients.md", "exec"), {})
    got = json.loads(cli("groups", "configs", "--bootstrap", d.bootstrap, "--group", "orders",
                         "--json").stdout)
    assert {c["name"]: (c["value"], c["source"]) for c in got["configs"]} == {
        SESSION: ("30000", "GROUP_CONFIG"), INTERVAL: ("200", "DEFAULT_CONFIG")}
