"""kafka-python and confluent-kafka log in with PLAIN while a flood keeps the daemon's PLAIN
queue full: the busy server closes unanswered, and both clients connect again."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.test_security_attack import _flood, _slow_plain_daemon


def test_kafka_clients_get_in_through_a_plain_flood(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient
    with _slow_plain_daemon(tmp_path, monkeypatch, "worker", 0.05, [], {
            "connection.failed.authentication.delay.ms": 50}) as d:
        host, port = d.address("SASL_PLAINTEXT")
        stop, seen = threading.Event(), []
        flooders = [threading.Thread(target=_flood, args=((host, port), stop, seen), daemon=True)
                    for _ in range(32)]
        for t in flooders:
            t.start()
        try:
            deadline = time.monotonic() + 60
            while d.metric("connect_coordinator_sasl_plain_refused_total") < 10:
                assert time.monotonic() < deadline, Counter(seen)
                time.sleep(0.05)
            before = d.metric("connect_coordinator_sasl_plain_refused_total")
            results = []
            for _ in range(3):
                a = KafkaAdminClient(bootstrap_servers=f"{host}:{port}",
                                     security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                     sasl_plain_username="worker", sasl_plain_password="worker-pw",
                                     request_timeout_ms=30_000)
                results.append(("kafka-python", a.list_groups()))
                a.close()
                c = AdminClient({"bootstrap.servers": f"{host}:{port}",
                                 "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                 "sasl.username": "worker", "sasl.password": "worker-pw"})
                results.append(("confluent", c.list_consumer_groups(request_timeout=30).result()))
            during = d.metric("connect_coordinator_sasl_plain_refused_total") - before
        finally:
            stop.set()
            for t in flooders:
                t.join(15)
        assert len(results) == 6
        assert during > 0, "the queue was not full meanwhile"
        print("refused during the clients' logins", during, Counter(seen))
