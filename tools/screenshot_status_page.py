"""Makes docs/img/status-page.png: the worker's status page (``GET /ui``) in headless Chromium,
against a real coordinator daemon and three real workers running two connectors, one of them
with a FAILED task (its trace unfolded).

    python -m tools.screenshot_status_page [--out docs/img/status-page.png] [--chromium PATH]

Needs the test extra (it reuses the test harness: tests/daemon_fixture.py, tests/chromium.py)
and Debian's ``chromium``. Everything runs on 127.0.0.1 in a temporary directory and is stopped
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.chromium import Chromium
from tests.daemon_fixture import DaemonPool
from tests.test_rest_e2e import Workers, healthy, http, until

PLUGIN = "worker_client.examples.recording:RecordingConnector"
ROOT = Path(__file__).resolve().parent.parent


def build_group(w: Workers) -> None:
    """Two connectors: ``orders`` (3 tasks, source offsets for 4 partitions) and
    ``audit-export`` (its one task fails at start)."""
    for name in ("w1", "w2", "w3"):
        w.spawn(name)
    until(lambda: all(healthy(u) for u in w.urls.values()), "three workers healthy", w)
    base = w.urls["w1"]
    config = {"connector.class": PLUGIN, "record.file": str(w.records)}
    status, _, body = http("POST", f"{base}/connectors", {
        "name": "orders", "config": {**config, "tasks.max": "3"}, "initial_state": "STOPPED"})
    assert status == 201, body
    offsets = [{"partition": {"table": "orders", "shard": n}, "offset": {"lsn": 48210 + 977 * n}}
               for n in range(4)]
    status, _, body = http("PATCH", f"{base}/connectors/orders/offsets", {"offsets": offsets})
    assert status == 200, body
    assert http("PUT", f"{base}/connectors/orders/resume")[0] == 202
    status, _, body = http("POST", f"{base}/connectors", {
        "name": "audit-export", "config": {**config, "tasks.max": "1", "fail.mode": "start"}})
    assert status == 201, body

    def ready() -> bool:
        orders = http("GET", f"{base}/connectors/orders/status")[2]
        audit = http("GET", f"{base}/connectors/audit-export/status")[2]
        return ([orders["connector"]["state"], *(t["state"] for t in orders["tasks"])] == ["RUNNING"] * 4
                and [t["state"] for t in audit["tasks"]] == ["FAILED"])

    until(ready, "orders RUNNING, audit-export's task FAILED", w)


async def capture(chromium: str, url: str) -> bytes:
    async with Chromium(chromium, width=1200, height=800) as page:
        await page.navigate(url)
        for _ in range(150):
            shown: Any = await page.evaluate(
                "document.querySelectorAll('#connectors details').length")
            if shown:
                break
            await asyncio.sleep(0.2)
        else:
            raise SystemExit(f"the page did not show the FAILED task's trace: {page.console}")
        await page.evaluate("document.querySelector('#connectors details').open = true")
        await asyncio.sleep(2.5)  # (one refresh more: the age of the data shows "0 s ago")
        return await page.screenshot()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs/img/status-page.png"))
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="status-page-") as tmp, DaemonPool(Path(tmp)) as pool:
        w = Workers(Path(tmp), pool.start(), group="connect-prod")
        try:
            build_group(w)
            png = asyncio.run(capture(args.chromium, w.urls["w1"] + "/ui"))
        finally:
            w.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_bytes(png)
    print(f"{args.out}: {len(png)} bytes")


if __name__ == "__main__":
    main()
