"""A real headless Chromium driven over the Chrome DevTools Protocol (CDP), for the worker's
status page (tests/test_status_page_e2e.py, tools/screenshot_status_page.py).

Chromium is started with ``--remote-debugging-port=0`` and a throw-away ``--user-data-dir``; the
port it picked is read from the ``DevToolsActivePort`` file it writes there. The protocol is
JSON over the browser's websocket (aiohttp's client): one page target is created and attached
to (flat sessions), and everything else (navigate, evaluate, screenshot) goes to it. Every
call is bounded; the browser's process group is killed when the context ends, whatever
happened.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 30.0
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--no-default-browser-check", "--disable-extensions",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--mute-audio", "--hide-scrollbars", "--password-store=basic",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0")


class CdpError(AssertionError):
    """An error answer from the browser, or no answer in time."""


class Chromium:
    """``async with Chromium(path) as page:`` a blank page of a fresh headless browser."""

    def __init__(self, binary: str, width: int = 1200, height: int = 800) -> None:
        self.binary, self.width, self.height = binary, width, height
        self._dir = tempfile.TemporaryDirectory(prefix="chromium-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self.session: str | None = None
        self.console: list[str] = []  # the page's console messages and uncaught exceptions

    @property
    def log(self) -> str:
        """Chromium's own stderr (for a failure message)."""
        path = Path(self._dir.name) / "chromium.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def __aenter__(self) -> Chromium:
        try:
            await self._start()
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _start(self) -> None:
        profile = Path(self._dir.name) / "profile"
        with open(Path(self._dir.name) / "chromium.log", "wb") as log:
            self._proc = subprocess.Popen(
                [self.binary, *FLAGS, f"--user-data-dir={profile}",
                 f"--window-size={self.width},{self.height}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (active.exists() and len(active.read_text().splitlines()) >= 2):
            if self._proc.poll() is not None:
                raise CdpError(f"chromium exited ({self._proc.returncode}) before listening:\n{self.log}")
            if time.monotonic() > deadline:
                raise CdpError(f"chromium did not listen within {START_TIMEOUT_S} s:\n{self.log}")
            await asyncio.sleep(0.05)
        port, path = active.read_text().splitlines()[:2]
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0,
                                               timeout=aiohttp.ClientWSTimeout(ws_close=5))
        self._reader = asyncio.create_task(self._read())
        target = (await self.call("Target.createTarget", {"url": "about:blank"}, browser=True))["targetId"]
        self.session = (await self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                        browser=True))["sessionId"]
        await self.call("Runtime.enable")
        await self.call("Page.enable")
        await self.call("Emulation.setDeviceMetricsOverride", {
            "width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            fut = self._pending.pop(data.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(data)
            elif data.get("method") == "Runtime.consoleAPICalled":
                args = data["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif data.get("method") == "Runtime.exceptionThrown":
                self.console.append(json.dumps(data["params"]["exceptionDetails"])[:1000])
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(CdpError("the browser closed its DevTools connection"))

    async def call(self, method: str, params: dict[str, Any] | None = None, *,
                   browser: bool = False) -> Any:
        """One CDP command (to the page, or to the browser with ``browser``): its result."""
        assert self._ws is not None
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if not browser:
            message["sessionId"] = self.session
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send_str(json.dumps(message))
        try:
            answer = await asyncio.wait_for(fut, CALL_TIMEOUT_S)
        except TimeoutError:
            raise CdpError(f"{method}: no answer within {CALL_TIMEOUT_S} s") from None
        finally:
            self._pending.pop(msg_id, None)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = await self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                      "awaitPromise": True})
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def navigate(self, url: str, headers: dict[str, str] | None = None) -> None:
        if headers:
            await self.call("Network.enable")
            await self.call("Network.setExtraHTTPHeaders", {"headers": headers})
        result = await self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CdpError(f"navigate {url}: {result['errorText']}")

    async def screenshot(self) -> bytes:
        """The viewport as PNG."""
        data = await self.call("Page.captureScreenshot", {"format": "png"})
        return base64.b64decode(data["data"])

    async def _close(self) -> None:
        if self._ws is not None and not self._ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.call("Browser.close", browser=True), 5)
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 5)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            if self._proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)  # (its own group: started here)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(10)
            with contextlib.suppress(ProcessLookupError):  # renderers left behind, if any
                os.killpg(self._proc.pid, signal.SIGKILL)
        self._dir.cleanup()
