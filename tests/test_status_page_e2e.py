"""The worker's live status page (``GET /ui`` and its feed ``GET /ui/state``) in a real browser:
Debian's headless Chromium, driven over the DevTools protocol (tests/chromium.py), against one
coordinator daemon and three ``connect-worker run --rest-listen`` processes for the whole
module (w2 behind HTTP basic authentication). The page is read as its rendered text; workers
are killed with SIGKILL and the same page (never reloaded) must show what changed."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.apt_tools import binary
from tests.chromium import Chromium
from tests.daemon_fixture import ROOT, DaemonPool, daemon_env
from tests.test_rest_e2e import PASSWORD, USER, Workers, healthy, http, until

GROUP = "ui"
CONNECTORS = {"orders": 2, "payments": 2}
PAGE_S = 30.0  # the longest a page is waited for (a kill is seen after the session timeout)
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
ROWS = """!document.getElementById("banner") ? "null" : JSON.stringify({
  connectors: [...document.querySelectorAll("#connectors tr")].map(
      (r) => [r.className, ...[...r.cells].map((c) => c.innerText.trim())]),
  members: [...document.querySelectorAll("#members tr")].map(
      (r) => [...r.cells].map((c) => c.innerText.trim())),
  banner: document.getElementById("banner").hidden ? null : document.getElementById("banner").innerText,
  fetched: document.getElementById("fetched").innerText,
  fetches: Number(document.body.dataset.fetches || 0)})"""


class Group(Workers):
    killed: set[str]

    def kill(self, name: str) -> None:
        """SIGKILL: no leave, no goodbye; the coordinator finds out at the session timeout."""
        self.killed.add(name)
        self.procs[name].kill()
        self.procs[name].wait(10)

    def worker_id(self, name: str) -> str:
        return self.urls[name].removeprefix("http://")

    def status(self, connector: str) -> dict[str, Any]:
        return http("GET", f"{self.urls['w1']}/connectors/{quote(connector, safe='')}/status")[2]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    base = tmp_path_factory.mktemp("ui")
    with DaemonPool(base) as pool:
        g = Group(base, pool.start(), group=GROUP)
        g.killed = set()
        try:
            for name in ("w1", "w2", "w3"):
                g.spawn(name, auth=name == "w2")
            until(lambda: all(healthy(u, (USER, PASSWORD) if n == "w2" else None)
                              for n, u in g.urls.items()), "three workers healthy", g)
            for name, tasks in CONNECTORS.items():
                status, _, body = http("POST", f"{g.urls['w1']}/connectors", {"name": name, "config": {
                    "connector.class": "worker_client.examples.recording:RecordingConnector",
                    "tasks.max": str(tasks), "record.file": str(g.records)}})
                assert status == 201, body
            yield g
        finally:
            codes = g.close()
        assert {n: c for n, c in codes.items() if n not in g.killed} == {
            n: 0 for n in codes if n not in g.killed}, g.logs()


@pytest.fixture(scope="module")
def chromium() -> str:
    return binary("chromium", "chromium")


def all_running(g: Group) -> dict[str, dict[str, Any]] | None:
    """Each connector's REST status once it and its tasks are all RUNNING."""
    out = {name: g.status(name) for name in CONNECTORS}
    ok = all(st["connector"]["state"] == "RUNNING" and len(st["tasks"]) == CONNECTORS[name]
             and all(t["state"] == "RUNNING" for t in st["tasks"]) for name, st in out.items())
    return out if ok else None


async def page_until(page: Chromium, check: Callable[[dict[str, Any]], Any], what: str,
                     g: Group) -> dict[str, Any]:
    """The page's rows once ``check`` holds for them (asserted within PAGE_S)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PAGE_S
    while True:
        rows = json.loads(await page.evaluate(ROWS))  # (null while the page is still loading)
        if rows is not None and check(rows):
            return rows
        assert loop.time() < deadline, (f"{what}: not on the page within {PAGE_S}s\npage: {rows}\n"
                                        f"console: {page.console}\n{g.logs()}")
        await asyncio.sleep(0.2)


def instances(rows: dict[str, Any]) -> list[dict[str, str]]:
    """The connectors table as dicts (a task row names its connector)."""
    out, connector = [], ""
    for cls, label, state, worker, member, token, offsets, error in rows["connectors"]:
        if cls == "connector":
            connector = label
        item = connector if cls == "connector" else f"{connector}/{label.removeprefix('task ')}"
        out.append({"item": item, "state": state, "worker": worker, "member": member,
                    "token": token, "offsets": offsets, "error": error})
    return out


def member_names(rows: dict[str, Any]) -> list[str]:
    return [r[0] for r in rows["members"]]


def test_feed_is_the_groups_describe_json_plus_rest_status(group: Group) -> None:
    """``/ui/state``: the group as ``groups describe --json`` prints it, each connector's REST
    status and offsets count, the worker's own id; ``/ui`` is HTML with a policy that lets only
    its own script run; both behind basic authentication like every path."""
    until(lambda: all_running(group), "orders and payments RUNNING", group)
    status, headers, _ = http("GET", group.urls["w1"] + "/ui/state")  # (JSON)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    feed = http("GET", group.urls["w1"] + "/ui/state")[2]
    cli = subprocess.run([sys.executable, "-m", "coordinator.cli", "groups", "describe", GROUP,
                          "--json", "--bootstrap", group.daemon.bootstrap],
                         capture_output=True, text=True, env=daemon_env(), cwd=ROOT, timeout=60)
    assert cli.returncode == 0, cli.stderr
    (described,) = json.loads(cli.stdout)
    # (the same keys, the coordinating node included: the one FindCoordinator named to each)
    assert set(feed["group"]) == set(described)
    assert feed["group"]["coordinator"] == described["coordinator"] == {
        "node_id": 0, "host": group.daemon.host, "port": group.daemon.port}
    assert feed["group"]["connectors"] == described["connectors"]
    def members(g: dict[str, Any]) -> list[tuple[Any, ...]]:
        return sorted((m["instance_id"], m["assignment"], m["fencing_tokens"]) for m in g["members"])

    assert members(feed["group"]) == members(described)
    assert [c["name"] for c in feed["connectors"]] == [c["name"] for c in described["connectors"]]
    for c in feed["connectors"]:
        assert c["status"] == group.status(c["name"]) and (c["offsets"], c["offsets_error"]) == (0, None)
    assert feed["worker"]["worker_id"] == group.worker_id("w1")
    assert feed["worker"]["instance_id"] == "w1" and feed["worker"]["url"] == group.urls["w1"]
    assert feed["worker"]["coordinator"] == group.daemon.bootstrap

    status, headers, _ = http_text(group.urls["w1"] + "/ui")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "script-src 'sha256-" in headers["Content-Security-Policy"]
    for path in ("/ui", "/ui/state", "/ui/"):
        assert http("GET", group.urls["w2"] + path)[0] == 401, path
        assert http_text(group.urls["w2"] + path, AUTH)[0] == 200, path


def http_text(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


async def test_group_text_is_shown_as_text_and_traces_are_folded(group: Group, chromium: str) -> None:
    """A connector named like markup, whose task fails with a trace that repeats the name: the
    page shows both as text (no element made of them) and the trace folded."""
    name = "<img src=x onerror=alert(1)><b>bold<script>x=1"  # (a connector name cannot contain '/')
    status, _, body = http("POST", f"{group.urls['w1']}/connectors", {"name": name, "config": {
        "connector.class": "worker_client.examples.recording:RecordingConnector", "tasks.max": "1",
        "fail.mode": "start", "record.file": str(group.records)}})
    assert status == 201, body
    try:
        until(lambda: [t["state"] for t in group.status(name)["tasks"]] == ["FAILED"], "its task FAILED",
              group)
        async with Chromium(chromium) as page:
            await page.navigate(group.urls["w1"] + "/ui")
            rows = await page_until(page, lambda r: any(
                x["item"] == f"{name}/0" and x["state"] == "FAILED" for x in instances(r)),
                "the markup-named connector's FAILED task", group)
            (task,) = [x for x in instances(rows) if x["item"] == f"{name}/0"]
            assert task["error"] == f"RuntimeError: {name}/0: start() failed on purpose (fail.mode=start)"
            assert name in [x["item"] for x in instances(rows)]
            folded = json.loads(await page.evaluate("""JSON.stringify({
                markup: document.querySelectorAll("main img, main b, main script").length,
                details: [...document.querySelectorAll("#connectors details")].map(
                    (d) => ({open: d.open, summary: d.querySelector("summary").textContent,
                             trace: d.querySelector("pre").textContent}))})"""))
            assert folded["markup"] == 0, folded
            (details,) = folded["details"]
            assert details["open"] is False and details["summary"] == task["error"]
            assert details["trace"].startswith("Traceback (most recent call last):")
            assert f"RuntimeError: {name}/0: start() failed on purpose" in details["trace"]
            assert page.console == []
    finally:
        assert http("DELETE", f"{group.urls['w1']}/connectors/{quote(name, safe='')}")[0] == 204


async def test_same_page_shows_a_killed_workers_tasks_moved_and_member_gone(group: Group,
                                                                           chromium: str) -> None:
    def w3_owns_some() -> dict[str, dict[str, Any]] | None:
        st = all_running(group)
        owners = st and {x["worker_id"] for s in st.values() for x in (s["connector"], *s["tasks"])}
        return st if owners and group.worker_id("w3") in owners else None

    until(w3_owns_some, "everything RUNNING, w3 running some of it", group)
    async with Chromium(chromium) as page:
        await page.navigate(group.urls["w1"] + "/ui")
        w3 = group.worker_id("w3")
        before = await page_until(page, lambda r: "w3" in member_names(r) and any(
            x["member"] == "w3" for x in instances(r)), "w3 and what it runs", group)
        mine = [x for x in instances(before) if x["member"] == "w3"]
        assert all(x["worker"] == w3 and x["state"] == "RUNNING" and x["token"].isdigit() for x in mine), mine
        assert {"orders", "orders/0", "orders/1", "payments", "payments/0", "payments/1"} <= {
            x["item"] for x in instances(before)}
        assert before["banner"] is None and "from worker " + group.worker_id("w1") in before["fetched"]
        # (the coordinator's heartbeat age when it reports one, else "?")
        assert all(re.fullmatch(r"\?|\d+(\.\d)? m?s ago( OVERDUE)?", m[5]) for m in before["members"]), before
        await page.evaluate("window.sameDocument = 'before the kill'")

        group.kill("w3")

        def moved(r: dict[str, Any]) -> bool:
            xs = [x for x in instances(r) if x["item"].split("/")[0] in CONNECTORS]
            return ("w3" not in member_names(r) and len(xs) == 6
                    and all(x["state"] == "RUNNING" and x["member"] in ("w1", "w2") for x in xs))

        after = await page_until(page, moved, "w3 gone, its instances RUNNING elsewhere", group)
        assert await page.evaluate("window.sameDocument") == "before the kill"  # (not reloaded)
        assert after["fetches"] > before["fetches"] and after["banner"] is None
        for x in instances(after):
            if x["item"] in {m["item"] for m in mine}:
                assert x["worker"] in (group.worker_id("w1"), group.worker_id("w2")), x
        assert page.console == []


async def test_a_failed_refresh_shows_a_banner_and_keeps_the_last_data(group: Group, chromium: str) -> None:
    """The page served by w2 (basic authentication: the browser sends the credentials, its
    feed requests too); w2 killed, the page says its refreshes fail and still shows the last
    data."""
    async with Chromium(chromium) as page:
        await page.navigate(group.urls["w2"] + "/ui", headers=AUTH)
        before = await page_until(page, lambda r: r["fetches"] >= 1 and len(instances(r)) >= 6,
                                  "the group through w2", group)
        assert before["banner"] is None and "w2" in member_names(before)
        group.kill("w2")
        after = await page_until(page, lambda r: r["banner"] is not None, "the error banner", group)
        assert after["banner"].startswith("Refresh failed at ") and "Showing the data of" in after["banner"]
        # (kept, not emptied)
        assert {"orders", "orders/0", "orders/1", "payments", "payments/0", "payments/1"} <= {
            x["item"] for x in instances(after)}
        assert after["fetched"].startswith("Updated ")
