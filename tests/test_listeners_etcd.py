"""Several listeners on several nodes (store=etcd): every node records each of
its listeners' advertised address in the registry, and a node answers Metadata and
FindCoordinator with the other nodes' addresses *for the listener the request came in on*, as
Kafka's brokers do (real etcd, real daemon processes).

Nodes 1 and 2 have the listeners INTERNAL and EXTERNAL, node 3 INTERNAL only: asked on
EXTERNAL, node 1 lists nodes 1 and 2 (at their EXTERNAL addresses) and answers
COORDINATOR_NOT_AVAILABLE for the groups node 3 owns; asked on INTERNAL it lists all three.
"""

from __future__ import annotations

import time
from pathlib import Path

from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest

from connect_wire.apis import ApiKey
from connect_wire.errors import ErrorCode
from coordinator.cluster.registry import NodeInfo
from tests.daemon_fixture import Daemon, DaemonPool
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)
from tests.secure_server import Raw

MAP = "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT"
GROUPS = tuple(f"group-{i}" for i in range(24))


def test_node_info_keeps_every_listener_and_reads_old_registrations() -> None:
    info = NodeInfo("10.0.0.1", 9092, (("EXTERNAL", "node1.example", 9094),
                                       ("INTERNAL", "10.0.0.1", 9092)))
    assert NodeInfo.decode(info.encode()) == info
    assert info.address("EXTERNAL") == ("node1.example", 9094)
    assert info.address("OTHER") is None
    assert info.address(None) == ("10.0.0.1", 9092)
    old = NodeInfo.decode(b'{"host": "10.0.0.2", "port": 9092}')
    assert old == NodeInfo("10.0.0.2", 9092)
    assert old is not None and old.address("EXTERNAL") == ("10.0.0.2", 9092)


def _metadata(address: tuple[str, int]) -> list[tuple[int, str, int]]:
    with Raw(address) as c:
        r = c.call(ApiKey.METADATA, 12, MetadataRequest(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    return sorted((int(b.node_id), b.host, int(b.port)) for b in r.brokers)


def _coordinators(address: tuple[str, int]) -> dict[str, tuple[int, int, str, int]]:
    with Raw(address) as c:
        r = c.call(ApiKey.FIND_COORDINATOR, 4, FindCoordinatorRequest(
            key_type=0, coordinator_keys=GROUPS))
    return {k.key: (int(k.error_code), int(k.node_id), k.host, int(k.port)) for k in r.coordinators}


def test_metadata_and_find_coordinator_per_listener_on_etcd(tmp_path: Path,
                                                            etcd_endpoint: str) -> None:  # noqa: F811
    prefix = f"/listeners-{time.time_ns()}"

    def node(pool: DaemonPool, n: int, listen: str) -> Daemon:
        return pool.start(tmp_path / f"n{n}", extra_env={
            "CONNECT_COORDINATOR_LISTENER_SECURITY_PROTOCOL_MAP": MAP}, extra_args=[
            "--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", prefix,
            "--node-id", str(n), "--partitions", "6", "--listen", listen])

    with DaemonPool(tmp_path) as pool:
        both = "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0"
        nodes = {1: node(pool, 1, both), 2: node(pool, 2, both),
                 3: node(pool, 3, "INTERNAL://127.0.0.1:0")}
        internal = {n: d.listeners["INTERNAL"] for n, d in nodes.items()}
        external = {n: d.listeners["EXTERNAL"] for n, d in nodes.items() if n != 3}
        asked_internal, asked_external = internal[1], external[1]
        deadline = time.monotonic() + 30
        previous: dict[str, tuple[int, int, str, int]] = {}
        while True:  # until the three nodes own every partition and the placement is settled
            found = _coordinators(asked_internal)
            if (len(_metadata(asked_internal)) == 3
                    and all(code == 0 for code, *_ in found.values())
                    and {n for _, n, _, _ in found.values()} == {1, 2, 3}
                    and found == previous):
                break
            previous = found
            assert time.monotonic() < deadline, found
            time.sleep(0.5)
        assert _metadata(asked_internal) == [(n, *internal[n]) for n in (1, 2, 3)]
        assert _metadata(asked_external) == [(n, *external[n]) for n in (1, 2)]
        owners = {g: n for g, (_, n, _, _) in found.items()}
        assert found == {g: (0, n, *internal[n]) for g, n in owners.items()}
        on_external = _coordinators(asked_external)
        for group, owner in owners.items():
            if owner == 3:  # no EXTERNAL listener: nobody to send an EXTERNAL client to
                assert on_external[group][0] == ErrorCode.COORDINATOR_NOT_AVAILABLE
            else:
                assert on_external[group] == (0, owner, *external[owner])
        # The same from node 3 (it has no EXTERNAL listener itself: INTERNAL answers only).
        assert _metadata(internal[3]) == [(n, *internal[n]) for n in (1, 2, 3)]
