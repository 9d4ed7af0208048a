"""The HTTP load generator of ``bench rest``: a process of its own (``python -m bench._rest_load
SPEC.json``), ``clients`` concurrent aiohttp clients, each a closed loop (one request in flight,
the next sent when the answer is read), over keep-alive connections (one per client).

SPEC: ``{"urls": [...], "clients": N, "duration": S, "warmup": S, "timeout_s": S}``; each
client goes round ``urls`` from its own offset. It prints ``measuring`` when the measured
window opens and ``measured`` when it closes, then one JSON line: the requests answered in the
window with a 2xx status, per second, their latency percentiles (ms), the answers by status and
the requests that got no answer (connection errors, timeouts).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any

import aiohttp

from bench._common import percentile


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    urls: list[str] = spec["urls"]
    clients = int(spec["clients"])
    timeout = aiohttp.ClientTimeout(total=float(spec.get("timeout_s", 30.0)))
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    failures: Counter[str] = Counter()
    measuring = False
    stop = False

    async def client(session: aiohttp.ClientSession, offset: int) -> None:
        n = offset
        while not stop:
            url = urls[n % len(urls)]
            n += 1
            started = time.perf_counter()
            try:
                async with session.get(url) as resp:
                    await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                if measuring:
                    failures[type(exc).__name__] += 1
                continue
            if measuring:
                statuses[status] += 1
                if 200 <= status < 300:  # (a refusal, e.g. 503 past the connections served, is
                    latencies.append(time.perf_counter() - started)  # counted, not timed)

    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session, i)) for i in range(clients)]
        await asyncio.sleep(float(spec.get("warmup", 0.0)))
        print("measuring", flush=True)
        measuring, opened = True, time.perf_counter()
        await asyncio.sleep(float(spec["duration"]))
        measuring, elapsed = False, time.perf_counter() - opened
        print("measured", flush=True)
        stop = True
        await asyncio.wait(tasks, timeout=float(spec.get("timeout_s", 30.0)))
        for t in tasks:
            t.cancel()
    latencies.sort()
    return {"requests": len(latencies), "seconds": round(elapsed, 3),
            "per_second": round(len(latencies) / elapsed, 1),
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 3) if latencies else None,
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3) if latencies else None,
            "max_ms": round(latencies[-1] * 1000, 3) if latencies else None,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "no_answer": dict(failures)}


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - depends on the install
        result = asyncio.run(run(spec))
    else:
        result = uvloop.run(run(spec))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
