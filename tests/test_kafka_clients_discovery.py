"""Which of Kafka's Python clients see the coordinator's groups (the README's table).

One daemon, a group ``demo`` with a connector and a real ``connect-worker`` member, a second
group ``idle`` with none. The group type is ``connect``, so clients whose group calls are the
*consumer*-group calls see them only partly:

* kafka-python 3.x: ``list_groups`` and ``describe_groups`` fully (members, state, type);
* aiokafka 0.14: ``list_consumer_groups`` and ``describe_consumer_groups`` fully, one group per
  call (aiokafka 0.14.0 decodes DescribeGroups v3 answers with the v2 schema, which misreads an
  answer of several groups from any broker);
* confluent-kafka (librdkafka): the deprecated ``AdminClient.list_groups`` fully;
  ``list_consumer_groups`` lists no connect group and ``describe_consumer_groups`` refuses one
  ("is not a consumer group (connect)"), both by librdkafka's own filtering of our answers.

kafka-python 2.x (2.0.2 and 2.2.15 measured by hand, in a virtual environment of their own: the
test environment has 3.x) lists them with ``list_consumer_groups`` but its
``describe_consumer_groups`` raises ``TypeError: Expected 5 arguments, got 0`` for a group that
has members (it decodes only the members of consumer groups).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env, run_cli


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with DaemonPool(tmp_path) as pool:
        d = pool.start()
        for group, tasks in (("demo", "1"), ("idle", "0")):
            r = run_cli("connectors", "create", "--bootstrap", d.bootstrap, "--group", group, "c",
                        "--tasks", tasks, "--config",
                        "connector.class=worker_client.examples.recording:RecordingConnector")
            assert r.returncode == 0, r.stderr
        w = subprocess.Popen([sys.executable, "-m", "worker_client.cli", "run", "--bootstrap",
                              d.bootstrap, "--group", "demo", "--instance-id", "w1"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=daemon_env(), cwd=ROOT)
        try:
            deadline = time.monotonic() + 20
            while "Stable" not in run_cli("groups", "list", "--bootstrap", d.bootstrap).stdout:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            yield d
        finally:
            w.send_signal(signal.SIGTERM)
            w.wait(15)


def test_kafka_python_3(daemon: Daemon) -> None:
    import kafka
    from kafka import KafkaAdminClient

    assert kafka.__version__.startswith("3.")
    admin = KafkaAdminClient(bootstrap_servers=daemon.bootstrap, request_timeout_ms=5000)
    try:
        listed = {g["group_id"]: (g["protocol_type"], g["group_state"]) for g in admin.list_groups()}
        assert listed == {"demo": ("connect", "Stable"), "idle": ("connect", "Empty")}
        described = admin.describe_groups(["demo", "idle"])
        assert described["demo"]["group_state"] == "Stable"
        assert [m["client_id"].startswith("connect-worker-") for m in described["demo"]["members"]] == [True]
        assert described["idle"]["members"] == []
    finally:
        admin.close()


def test_aiokafka_0_14_one_group_per_describe(daemon: Daemon) -> None:
    import aiokafka
    from aiokafka.admin import AIOKafkaAdminClient

    assert aiokafka.__version__.startswith("0.14")

    async def run() -> tuple[dict[str, str], dict[str, Any]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=daemon.bootstrap, request_timeout_ms=5000)
        await admin.start()
        try:
            listed = {g[0]: g[1] for g in await admin.list_consumer_groups()}
            described = {}
            for group in ("demo", "idle"):
                for r in await admin.describe_consumer_groups([group]):
                    for g in r.groups:
                        described[g[1]] = g
            return listed, described
        finally:
            await admin.close()

    listed, described = asyncio.run(run())
    assert listed == {"demo": "connect", "idle": "connect"}
    # (error, group id, state, protocol type, protocol, members)
    assert (described["demo"][0], described["demo"][2], described["demo"][3]) == (0, "Stable", "connect")
    assert len(described["demo"][5]) == 1 and described["idle"][5] == []


def test_confluent_kafka_list_groups_only(daemon: Daemon) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": daemon.bootstrap})
    with pytest.warns(DeprecationWarning, match="list_groups"):
        listed = admin.list_groups(timeout=10)
    groups = {g.id: (g.protocol_type, g.state, len(g.members)) for g in listed}
    assert groups == {"demo": ("connect", "Stable", 1), "idle": ("connect", "Empty", 0)}
    # The consumer-group calls: librdkafka keeps only consumer groups of our answers.
    assert admin.list_consumer_groups(request_timeout=10).result().valid == []
    with pytest.raises(KafkaException, match="GroupId demo is not a consumer group \\(connect\\)"):
        admin.describe_consumer_groups(["demo"], request_timeout=10)["demo"].result()
