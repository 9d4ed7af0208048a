"""Smoke test of ``python -m bench cluster --quick``: a real etcd and real ``serve --store etcd``
nodes at tiny sizes (one kill -9 and one SIGTERM of a 3-node cluster, the two stores' commits,
1 node vs 2 nodes under steady heartbeats, a 1-partition load). Only the structure and sane
values are checked, never the timings."""

import json
import math
import subprocess
from pathlib import Path

from tests.bench_run import run_bench


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=600)


def test_bench_cluster_smoke(tmp_path: Path) -> None:
    output = tmp_path / "results" / "cluster.json"
    result = _run("cluster", "--quick", "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["benchmark"] == "cluster" and data["quick"] is True
    assert data["phases"] == ["failover", "commit", "heartbeats", "load", "leader-loss"]

    fo = data["failover"]
    assert (fo["nodes"], fo["groups"], fo["members"]) == (3, 6, 2)
    assert fo["goal_s"] == fo["lease_ttl_s"] + 1
    assert [r["event"] for r in fo["rows"]] == ["kill -9", "SIGTERM"]
    for r in fo["rows"]:
        assert r["partitions"] and r["groups"] >= 1
        assert 0 < r["min_s"] <= r["p50_s"] <= r["max_s"]
    kill, term = fo["rows"]
    assert len(kill["times_s"]) == kill["groups"]
    assert kill["load_began_after_s"] > 0
    assert term["window_max_s"] >= term["window_p50_s"] > 0
    assert fo["kill"]["groups_measured"] == kill["groups"]
    assert isinstance(fo["kill"]["met"], bool)

    cm = data["commit"]
    assert {(r["store"], r["clients"]) for r in cm["rows"]} == {
        ("file", 1), ("etcd", 1), ("file", 4), ("etcd", 4)}
    for r in cm["rows"]:
        assert r["per_second"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["cpu_daemon"] > 0
    assert set(cm["ratios_etcd_over_file"]) == {
        "p50_latency_1_client", "p99_latency_1_client", "writes_per_second_4_clients"}
    assert all(v > 0 for v in cm["ratios_etcd_over_file"].values())

    hb = data["heartbeats"]
    assert [r["nodes"] for r in hb["rows"]] == [1, 2]
    for r in hb["rows"]:
        assert r["members"] == 16 and r["per_second"] > 0 and r["checked"] > 0
        assert r["p50_us"] <= r["p99_us"] and r["cpu_nodes"] > 0 and r["cpu_loadgen"] > 0
    assert hb["ratio_2_over_1"] > 0

    ld = data["load"]
    assert [r["event"] for r in ld["rows"]] == ["start", "kill -9", "SIGTERM"]
    for r in ld["rows"]:
        assert r["loaded_groups"] == 20 and r["records"] == ld["live_records"] > 0
        assert r["load_s"] >= 0
    assert ld["in_process"]["groups"] == 20 and ld["in_process"]["records"] == ld["live_records"]

    ll = data["leader-loss"]
    assert [r["event"] for r in ll["rows"]] == ["kill -9", "SIGSTOP", "kill -9, no quorum 3 s"]
    for r in ll["rows"]:
        assert r["groups"] == 6 and len(r["gaps_s"]) == 6 and r["election_s"] > 0
        assert 0 <= r["gap_p50_s"] <= r["gap_max_s"]
        assert r["leases_given_up"] == 0  # a lease in doubt is renewed, not given up
    # Three seconds without quorum put every node's 2 s lease in doubt; each was renewed.
    assert ll["rows"][2]["leases_in_doubt"] == 3

    assert isinstance(data["node_log_problems"], list)
    for p in data["node_log_problems"]:
        assert {"phase", "level", "event", "count", "example"} <= set(p)
    assert not math.isnan(kill["max_s"])

    lines = result.stdout.strip().splitlines()
    for title in ("failover: 3 nodes", "commit: ", "heartbeats: ", "load: one partition",
                  "leader-loss: 3-member etcd"):
        assert any(line.startswith(title) for line in lines), title
    assert lines[-1].startswith("headline: failover after kill -9: max ")
    assert "2 nodes / 1 node heartbeats/s" in lines[-1]


def test_bench_cluster_rejects_an_unknown_phase(tmp_path: Path) -> None:
    result = _run("cluster", "--phases", "failover,nope", "--output", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert not (tmp_path / "x.json").exists()
