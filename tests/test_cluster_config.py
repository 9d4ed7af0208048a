"""store=etcd: what an operator gets wrong is refused at start with one clear line (real etcd,
real daemon processes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import DaemonPool, run_serve
from tests.etcd_fixture import etcd_endpoint, etcd_server  # noqa: F401 (fixtures)


def etcd_args(endpoint: str, prefix: str, node: int, *more: str) -> list[str]:
    return ["--store", "etcd", "--etcd-endpoints", endpoint, "--etcd-prefix", prefix,
            "--node-id", str(node), *more]


@pytest.mark.parametrize(("args", "message"), [
    (["--store", "etcd", "--node-id", "1"], "store=etcd needs etcd.endpoints"),
    (["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"], "store=etcd needs node.id"),
    (["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379", "--node-id", "1",
      "--listen", "0.0.0.0:0"], "needs advertised.listener"),
    (["--store", "etcd", "--etcd-endpoints", "nohostport", "--node-id", "1"], "etcd.endpoints"),
    (["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379", "--node-id", "-5"], "node.id"),
    (["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379", "--node-id", "1",
      "--etcd-prefix", "relative"], "etcd.prefix"),
    (["--store", "zookeeper"], "invalid choice"),
])
def test_bad_etcd_settings_exit_2_naming_the_setting(tmp_path: Path, args: list[str],
                                                     message: str) -> None:
    r = run_serve(tmp_path / "data", args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_unreachable_etcd_exits_1_naming_the_endpoints(tmp_path: Path) -> None:
    r = run_serve(tmp_path / "data", etcd_args("127.0.0.1:1", "/x", 1))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "cannot use etcd at 127.0.0.1:1" in r.stderr and "Traceback" not in r.stderr


def test_a_live_node_id_and_another_partition_count_are_refused(
        tmp_path: Path, etcd_endpoint: str) -> None:  # noqa: F811
    prefix = f"/config-{time.time_ns()}"
    with DaemonPool(tmp_path) as pool:
        first = pool.start(tmp_path / "n1", extra_args=etcd_args(etcd_endpoint, prefix, 1,
                                                                 "--partitions", "4"))
        again = run_serve(tmp_path / "n1b", etcd_args(etcd_endpoint, prefix, 1, "--partitions", "4"))
        assert again.returncode == 2, again.stderr
        assert "node id '1' is already registered by a live node" in again.stderr
        assert f"{first.host}:{first.port}" in again.stderr
        other = run_serve(tmp_path / "n2", etcd_args(etcd_endpoint, prefix, 2, "--partitions", "8"))
        assert other.returncode == 2, other.stderr
        assert "has 4 partitions; --partitions 8 would move groups" in other.stderr
    # The first node stopped (SIGTERM): its id is free at once (its registration was deleted).
    with DaemonPool(tmp_path) as pool:
        pool.start(tmp_path / "n1c", extra_args=etcd_args(etcd_endpoint, prefix, 1, "--partitions", "4"))


def test_etcd_endpoint_names_are_resolved_to_ipv4_and_ipv6_is_refused() -> None:
    from coordinator.runtime.etcd_store import EtcdStoreError, resolve_endpoints

    assert resolve_endpoints(["localhost:2379", "127.0.0.1:2379", "10.0.0.1:2380"]) == [
        "127.0.0.1:2379", "10.0.0.1:2380"]
    with pytest.raises(EtcdStoreError, match="IPv6 is not supported"):
        resolve_endpoints(["[::1]:2379"])
    with pytest.raises(EtcdStoreError, match="cannot resolve 'no-such-host.invalid'"):
        resolve_endpoints(["no-such-host.invalid:2379"])


def test_a_node_given_etcd_by_host_name_starts_and_serves(
        tmp_path: Path, etcd_server: Any) -> None:  # noqa: F811
    with DaemonPool(tmp_path) as pool:
        d = pool.start(tmp_path / "n", extra_args=etcd_args(
            f"localhost:{etcd_server.client_port}", f"/byname-{time.time_ns()}", 1))
        assert "localhost" in d.banner
