"""What an operator sees ("Operators are blind"), against real processes: the daemon
(``connect-coordinator serve``), real ``connect-worker`` processes running the bundled recording
plugin, the admin CLI, Debian's promtool and a real Prometheus.

* the daemon logs each group event once, at info, as a JSON line with the group, the member's
  id, instance id and epochs (a worker killed with -9: its session expiry as a fence with its
  reason, the hold of its work and its end, the epoch bumps, who computed the new target with
  which assignor, the install, the rebalance completing and how long it took); a steady group
  writes nothing;
* the workers' log lines carry their member id and epoch, the ones ``groups describe`` shows;
* ``groups describe`` shows the killed worker's held work and until when, never ``None``;
* the metrics: promtool accepts the coordinator's and the worker's expositions, the fences and
  session expiries are counted by reason, the held items gauge follows the hold, and a real
  Prometheus scrapes the daemon.
"""

from __future__ import annotations

import datetime
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon_fixture import Daemon, DaemonPool, run_cli
from tests.prometheus_tools import prometheus, promtool_check
from tests.test_daemon_e2e import Admin, Worker
from tests.test_worker_e2e import GROUP, Cluster, configured_items

EVENTS = {"member joined", "member rejoined", "member left", "member fenced", "group epoch bumped",
          "assigner chosen", "assignment computing", "assignment computation timed out",
          "target assignment installed", "assignor failed", "hold started", "hold ended",
          "rebalance completed", "group deleted"}


def json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def group_events(d: Daemon) -> list[dict[str, Any]]:
    return [e for e in json_lines(d.stderr()) if e.get("event") in EVENTS]


def exposition(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with DaemonPool(tmp_path) as pool:
        c = Cluster(tmp_path, pool.start())
        try:
            c.create_connectors()
            yield c
        finally:
            c.close()


def _describe(c: Cluster, human: bool = False) -> Any:
    args = ["groups", "describe", GROUP, "--bootstrap", c.daemon.bootstrap]
    r = run_cli(*args, *([] if human else ["--json"]))
    assert r.returncode == 0, r.stderr
    return r.stdout if human else json.loads(r.stdout)[0]


def test_a_killed_worker_as_the_operator_sees_it(cluster: Cluster) -> None:
    c = cluster
    d = c.daemon
    c.spawn("w1", metrics=True)
    # w2's hold (half its rebalance timeout past its session) lasts 6 s: long enough for the
    # CLI calls below to see it on a loaded machine, where each takes about a second.
    c.spawn("w2", rebalance_ms=12_000)
    c.wait_converged({"w1", "w2"}, "converged")
    before = _describe(c)
    members = {m["instance_id"]: m for m in before["members"]}
    w1, w2 = members["w1"], members["w2"]
    assert "None" not in _describe(c, human=True)

    # Both joins were logged, each with its member id, instance id and epochs.
    joined = {e["instance_id"]: e for e in group_events(d) if e["event"] == "member joined"}
    assert joined["w1"]["member_id"] == w1["member_id"] and joined["w2"]["member_id"] == w2["member_id"]
    for e in joined.values():
        assert e["level"] == "info" and e["group"] == GROUP and e["member_epoch"] == 0
        assert {"group_epoch", "assignment_epoch", "partition", "timestamp"} <= set(e)
    assert any(e["event"] == "target assignment installed" and e["assignor"] == "incremental"
               for e in group_events(d))

    # A steady group is silent: no line at all while the workers heartbeat (200 ms interval).
    quiet_from = len(d.stderr().splitlines())
    time.sleep(1.5)
    assert d.stderr().splitlines()[quiet_from:] == []

    # The workers' lines carry the member id and epoch describe shows.
    w1_lines = [e for e in json_lines(c.logs("w1", tail=10**9)) if e.get("member_id")]
    assert w1_lines and all(e["member_id"] == w1["member_id"] for e in w1_lines)
    assigned = [e for e in w1_lines if e["event"] == "assigned"]
    assert assigned and all(e["instance_id"] == "w1" for e in assigned)
    # Each line carries the epoch the worker had then: never past what describe shows, never
    # going back. (Whether the last line shows describe's epoch depends on the order of the
    # joins: a worker that only revoked reaches its new epoch without a line.)
    epochs = [e["member_epoch"] for e in w1_lines if "member_epoch" in e]
    assert epochs == sorted(epochs) and 0 <= epochs[-1] <= w1["epoch"]
    last_change = [e for e in w1_lines if e["event"] in ("assigned", "revoked")][-1]
    assert last_change["member_epoch"] == w1["epoch"] or last_change["event"] == "revoked"

    # kill -9 w2: its session expires, its work is held for it, then given to w1.
    killed_at = c.kill("w2")
    deadline = time.monotonic() + 15
    held: dict[str, Any] | None = None
    held_gauge = 0.0
    while held is None:
        assert time.monotonic() < deadline, "no hold shown by groups describe"
        g = _describe(c)
        if g["holds"]:
            held = g["holds"][0]
            human = _describe(c, human=True)
            # The gauge is read by the metrics thread from a copy of the state: it may show the
            # hold a scrape later than describe does.
            gauge_until = time.monotonic() + 2
            while True:
                metrics = samples(exposition(d.metrics_url))
                held_gauge = sum(v for (n, _), v in metrics.items()
                                 if n == "connect_coordinator_held_items")
                if held_gauge == len(w2["assignment"]) or time.monotonic() > gauge_until:
                    break
                time.sleep(0.05)
        time.sleep(0.05)
    assert held["member_id"] == w2["member_id"] and held["instance_id"] == "w2"
    assert sorted(held["items"]) == sorted(w2["assignment"])
    assert held["until_ms"] > killed_at * 1000 and held["until"].endswith("Z")
    assert "HELD FOR FENCED MEMBERS" in human and w2["member_id"] in human
    assert "None" not in human
    assert held_gauge == len(w2["assignment"])
    c.wait_converged({"w1"}, "moved")

    events = [e for e in group_events(d) if e["timestamp"] >= _iso(killed_at)]
    names = [e["event"] for e in events]
    fenced = next(e for e in events if e["event"] == "member fenced")
    assert (fenced["reason"], fenced["member_id"], fenced["instance_id"], fenced["member_epoch"]) == (
        "session_expired", w2["member_id"], "w2", w2["epoch"])
    hold = next(e for e in events if e["event"] == "hold started")
    assert hold["member_id"] == w2["member_id"] and hold["until_ms"] == held["until_ms"]
    assert hold["items"] == len(w2["assignment"])
    bump = next(e for e in events if e["event"] == "group epoch bumped")
    assert (bump["reason"], bump["member_id"]) == ("member_fenced", w2["member_id"])
    assert bump["group_epoch"] == bump["previous_group_epoch"] + 1
    ended = next(e for e in events if e["event"] == "hold ended")
    assert ended["reason"] == "expired" and ended["instance_id"] == "w2"
    done = [e for e in events if e["event"] == "rebalance completed"]
    assert done and done[-1]["duration_ms"] > 0 and done[-1]["members"] == 1
    assert names.index("member fenced") < names.index("hold started") < names.index("hold ended")
    installs = [e for e in events if e["event"] == "target assignment installed"]
    assert installs and all(e["member_id"] == w1["member_id"] and e["compute_ms"] is not None
                            for e in installs)

    # w1's lines now carry the epoch it runs w2's old work at, as describe says.
    after = {m["instance_id"]: m for m in _describe(c)["members"]}
    w1_lines = [e for e in json_lines(c.logs("w1", tail=10**9)) if e.get("member_id")]
    assert [e for e in w1_lines if e["event"] == "assigned"][-1]["member_epoch"] == after["w1"]["epoch"]

    # Counted by reason; promtool accepts the coordinator's and the worker's expositions.
    text = exposition(d.metrics_url)
    m = samples(text)
    assert m[("connect_coordinator_member_fences_total", frozenset({("reason", "session_expired")}))] == 1
    assert m[("connect_coordinator_member_fences_total",
              frozenset({("reason", "stale_member_epoch")}))] == 0
    assert m[("connect_coordinator_session_expiries_total", frozenset({("reason", "no_heartbeat")}))] == 1
    assert sum(v for (n, _), v in m.items() if n == "connect_coordinator_held_items") == 0
    assert m[("connect_coordinator_event_queue_time_seconds_count", frozenset())] > 0
    assert m[("connect_coordinator_event_processing_time_seconds_count", frozenset())] > 0
    assert m[("connect_coordinator_groups", frozenset({("type", "connect")}))] == 1
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    worker = promtool_check(exposition(f"http://127.0.0.1:{c.metrics_port['w1']}/metrics"))
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert set(configured_items()) == {i for mm in after.values() for i in mm["assignment"]}


def _iso(t: float) -> str:
    """An instant as the daemon's log timestamps write it (ISO 8601, UTC), for comparisons."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


def test_promtool_refuses_a_count_suffixed_gauge() -> None:
    """The check can fail: the names issue 14 replaced are refused."""
    old = ("# HELP connect_coordinator_group_count Groups by type\n"
           "# TYPE connect_coordinator_group_count gauge\n"
           'connect_coordinator_group_count{type="connect"} 1.0\n')
    checked = promtool_check(old)
    assert checked.returncode != 0 and "_count" in checked.stdout + checked.stderr


def test_a_real_prometheus_scrapes_the_coordinator(tmp_path: Path) -> None:
    with DaemonPool(tmp_path) as pool:
        d = pool.start()
        admin = Admin(d)
        assert admin.alter({"A": 1}).error_code == 0
        w = Worker(d, "W1")
        assert w.ok().should_compute_assignment
        w.compute({"W1": ["A", "A/0"]})
        w.ok()
        assert admin.state() == "Stable"
        assert d.metrics_url is not None
        target = d.metrics_url.removeprefix("http://").removesuffix("/metrics")
        with prometheus(tmp_path / "prometheus", target) as server:
            (series,) = server.wait_for('connect_coordinator_groups{type="connect"}')
            assert series["metric"]["job"] == "connect-coordinator"
            assert float(series["value"][1]) == 1
            # (the member's session may expire meanwhile: the group is counted in some state)
            (total,) = server.wait_for("sum(connect_coordinator_connect_groups)")
            assert float(total["value"][1]) == 1
            assert server.wait_for('connect_coordinator_requests_total{api="ConnectGroupHeartbeat"}')
            assert server.wait_for("connect_coordinator_event_queue_time_seconds_count")
            (up,) = server.wait_for('up{job="connect-coordinator"}')
            assert float(up["value"][1]) == 1
        w.close()
        admin.close()


def test_describe_text_shows_holds_and_never_none() -> None:
    """``groups describe``'s text from a described group with nothing optional set (no assignor,
    nobody computing, a dynamic member, an error without a message) and a hold: ``-`` where
    there is no value, the hold's member, instance, end and items; ASSIGNED, not RUNNING."""
    import io

    from connect_wire.messages import connect_group_describe_response_v0 as d
    from coordinator.cli import _group_dict, _write_group

    items = d.Assignment(connectors=("orders",), tasks=(d.TaskId(connector="orders", task=1),))
    member = d.Member(member_id="m-1", instance_id=None, worker_url=None, client_id="c",
                      client_host="h", member_epoch=4, member_state="UnrevokedItems",
                      assignment=d.Assignment(connectors=("orders",)), target_assignment=d.Assignment(),
                      revoking_tasks=(d.TaskId(connector="orders", task=0),))
    until = int(time.time() * 1000) + 12_000
    group = d.DescribedGroup(error_code=10001, error_message=None, group_id="g",
                             group_state="Reconciling", group_epoch=5, assignment_epoch=5,
                             assignor_name=None, assigning_member_id=None, members=(member,),
                             holds=(d.Hold(member_id="m-2", instance_id="w2", held_until_ms=until,
                                           items=items),))
    out = io.StringIO()
    _write_group(out, {**_group_dict(group), "error": "NO_ASSIGNOR_COVERS_GROUP"})
    text = out.getvalue()
    assert "None" not in text and "RUNNING" not in text
    assert "assignor=-  computing=-" in text and "NO_ASSIGNOR_COVERS_GROUP: -" in text
    header, row = text.splitlines()[2:4]
    assert header.split() == ["MEMBER", "INSTANCE", "PROTOCOL", "EPOCH", "STATE", "LAST",
                              "HEARTBEAT", "ASSIGNED", "REVOKING", "TARGET"]
    assert row.split() == ["m-1", "-", "new", "4", "UnrevokedItems", "-", "orders", "orders/0",
                           "-"]
    held = text.splitlines()[text.splitlines().index(
        "HELD FOR FENCED MEMBERS (nobody runs these until the hold ends):") + 2]
    assert held.split()[:2] == ["m-2", "w2"] and held.split()[-2:] == ["orders", "orders/1"]
    assert _iso(until / 1000)[:19] in held and "(in 1" in held
    (hold,) = _group_dict(group)["holds"]
    assert (hold["member_id"], hold["instance_id"], hold["until_ms"], hold["items"]) == (
        "m-2", "w2", until, ["orders", "orders/1"])
    assert hold["until"].startswith(_iso(until / 1000)[:19]) and hold["until"].endswith("Z")
