"""Convergence: time from a member joining / crashing / a connector being added until the group is Stable.

``python -m bench convergence [--sizes 10,100,1000] [--modes long,plain]
[--events join,crash,connector] [--repeat N] [--session-timeout-ms MS] [--fsync POLICY]
[--output PATH]``

For each group size a fresh real daemon is started (``connect-coordinator serve``, a subprocess,
default fsync policy, heartbeat interval 1 s, session timeout ``--session-timeout-ms``, 3 s by
default) and one group of N simulated members is set up through the wire (``bench/_sim.py``:
the real ``Membership`` state machine per member over its own ``KrpcConnection``, the real
IncrementalCooperativeAssignor run by the member the coordinator chooses, no task work: a revoke
is acknowledged and an assignment "started" at once). The group has 2 tasks per member in
connectors of 20 tasks. Then, for every repetition, each mode in turn (order reversed on every
other repetition; the same members switch mode in place), each event in turn:

* ``join``: one more member opens its connection, then joins; from its join until every member
  (N + 1) is Stable at a newer epoch with every item owned exactly once (Stable as the members'
  own state machines see it: the moment the last one would run its new work);
* ``crash``: the member that joined last stops heartbeating and closes its connection. The
  coordinator only notices at the session timeout, fences it (the survivors move to a new
  epoch) and holds its items for its stop budget (half its rebalance timeout, 0.5 s here: it
  cannot tell a crash from a partitioned worker still stopping them). So this is timed from the
  end of the hold: the member's last heartbeat sent + the session timeout + 0.5 s (the daemon
  arms the deadline when it handles that heartbeat, a fraction of a round trip later, in whole
  ms: about +-1 ms); the time from the crash is in the JSON (``from_crash_ms``), and the CPU
  columns count from the end of the hold too;
* ``connector``: AlterConnectors adds a connector of 20 tasks; from sending it.

Modes: ``long``: long-polled heartbeats (MaxWaitMs = the heartbeat interval, as the real worker
sends; a parked heartbeat is answered as soon as something concerns the member); ``plain``: a
heartbeat every second with MaxWaitMs = 0.

Before each event the round trip is measured against the same daemon: the median of 100
sequential steady heartbeats (MaxWaitMs 0, nothing changed) of the only member of a separate
one-member group, through ``KrpcConnection`` on a connection of their own: one protocol round
trip, encoding, decoding and the daemon's shard included. For reference the JSON also holds the
median ApiVersions round trip and the floor, a pre-encoded frame bounced off ``bench/_echo.py``
(loopback and two event loops, nothing decoded). Convergence is reported in ms, in round trips
(time / heartbeat round trip) and without the assignor's time (the time the chosen member spent
in ``assign()``, summed over the event's computations), with the daemon's fsyncs during the
event (from its metrics). The table shows medians over ``--repeat``.
The simulation's own CPU share and the daemon's during each event are reported: all members
share one Python process (and the 2 CPUs with the daemon), so at 1,000 members the simulation
itself is part of what is measured. The last line is the headline: a join at 100 members (or the
largest size run), long-polled, in round trips + the assignor's time; target < 20 round trips
plus the assignor's time. Rows go to ``bench/results/convergence.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench._common import BANNER, RESULTS, BenchError, Process, machine, sizes_arg, start_daemon, start_echo
from bench._sim import TIMEOUT_S, SimGroup, SimMember, alter_connectors
from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.framing import encode_request_frame
from connect_wire.messages import ConnectGroupHeartbeatRequest
from worker_client.client import KrpcConnection

GROUP = "bench-convergence"
TASKS_PER_MEMBER = 2
TASKS_PER_CONNECTOR = 20
INTERVAL_MS = 1_000
EVENTS = ("join", "crash", "connector")
REBALANCE_TIMEOUT_MS = 1_000
"""The simulated members' rebalance timeout (they run no tasks, so stop at once): a crashed
member's items are held 0.5 s (half of it) past its session expiry."""
MODES = ("long", "plain")
RTT_SAMPLES = 100
SETTLE_S = 0.3
"""Quiet time after each event before the next one."""
EVENT_TIMEOUT_S = 120.0
CHECK_INTERVAL_S = 0.002
"""The group's state is checked at most this often: checking it after each member's response
cost the simulation O(members) per response. The time reported is that of the last member's
state change (``SimGroup.settled_at``), not that of the check."""
TARGET_RTTS = 20
FSYNC = re.compile(r"^connect_coordinator_log_fsync_seconds_(count|sum)(?:\{[^}]*\})? (\S+)$", re.M)


def choices_arg(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        picked = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in picked if s not in allowed]
        if not picked or bad:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}: {text!r}")
        return [a for a in allowed if a in picked]
    return parse


def sched(pid: int | str) -> tuple[float, float]:
    """Seconds a process's main thread (its event loop) ran on a CPU, and waited for one while
    runnable (``/proc/PID/schedstat``, ns; zeros where the kernel does not keep it)."""
    try:
        on_cpu, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(on_cpu) / 1e9, int(waited) / 1e9


def fsyncs(metrics_url: str | None) -> tuple[int, float]:
    """The daemon's log fsyncs so far, over all partitions: (count, seconds)."""
    if metrics_url is None:
        return 0, 0.0
    with urllib.request.urlopen(metrics_url, timeout=30) as resp:
        text = resp.read().decode()
    count, total = 0.0, 0.0
    for kind, value in FSYNC.findall(text):
        if kind == "count":
            count += float(value)
        else:
            total += float(value)
    return int(count), total


def metrics_url(daemon: Process) -> str | None:
    match = BANNER.search(daemon.stdout_path.read_text(errors="replace").split("\n", 1)[0])
    if match is None or not match["metrics"].startswith("http"):
        return None  # metrics disabled
    return match["metrics"]


async def round_trip_s(conn: KrpcConnection, request: Any, count: int = RTT_SAMPLES) -> float:
    """Median of ``count`` sequential round trips of ``request`` (after a few warm-up ones)."""
    times = []
    for k in range(count + 5):
        started = time.perf_counter()
        resp = await conn.request(request, TIMEOUT_S)
        if k >= 5:
            times.append(time.perf_counter() - started)
        if getattr(resp, "error_code", 0):
            raise BenchError(f"{type(request).__name__} for the round trip: error {resp.error_code}")
    return statistics.median(times)


async def raw_round_trip_s(host: str, port: int, count: int = RTT_SAMPLES) -> float:
    """The same with an ApiVersions frame encoded once, sent over a bare socket and read back as
    bytes: against the echo server, the floor (two event loops and the loopback)."""
    api = APIS[ApiKey.API_VERSIONS]
    body = codec.encode(api.request_class(3)(client_software_name="bench-convergence",
                                             client_software_version="1"))
    frame = encode_request_frame(api.key, 3, 1, "bench-rtt-raw", body, api.request_header_version(3))
    reader, writer = await asyncio.open_connection(host, port)
    try:
        times = []
        for k in range(count + 5):
            started = time.perf_counter()
            writer.write(frame)
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size)
            if k >= 5:
                times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        writer.close()


class Run:
    """One group of ``size`` members on one daemon, through every repetition."""

    def __init__(self, host: str, port: int, daemon_pid: int, size: int,
                 args: argparse.Namespace, metrics: str | None = None,
                 echo: tuple[str, int] | None = None) -> None:
        self.host, self.port, self.daemon_pid, self.size, self.args = host, port, daemon_pid, size, args
        self.metrics = metrics
        self.echo = echo
        # The round-trip unit: steady heartbeats (MaxWaitMs 0, nothing changed) of the only
        # member of a group of its own, on a connection of their own.
        self.probe = SimGroup(host, port, f"{GROUP}-rtt", assignor="incremental", long_poll=False)
        self.session_s = args.session_timeout_ms / 1000
        self.group = SimGroup(host, port, GROUP, assignor="incremental", long_poll=True,
                              rebalance_timeout_ms=REBALANCE_TIMEOUT_MS)
        self.hold_s = max(100, REBALANCE_TIMEOUT_MS // 2) / 1000
        self.items = 0
        self.connectors = 0
        self.expected_members = size
        self.rtt_conn = KrpcConnection(host, port, "bench-rtt")
        self.samples: list[dict[str, Any]] = []

    async def wait_converged(self, min_epoch: int, what: str) -> None:
        group = self.group
        try:
            await group.wait(lambda: (group.converged(min_epoch, self.items)
                                      and len(group.live()) == self.expected_members)
                             or any(m.error for m in group.members), EVENT_TIMEOUT_S,
                             min_interval_s=CHECK_INTERVAL_S)
        except TimeoutError:
            raise BenchError(f"{what}: not converged within {EVENT_TIMEOUT_S:g} s: "
                             f"{group.describe()}") from None
        failed = [m.error for m in group.members if m.error]
        if failed:
            raise BenchError(f"{what}: a member failed: {failed[0]!r}")

    async def setup(self) -> float:
        started = time.perf_counter()
        await self.rtt_conn.open(TIMEOUT_S)
        await self.probe.open()
        await self.probe.add_member()
        try:
            await self.probe.wait(lambda: self.probe.converged(1, 0), EVENT_TIMEOUT_S)
        except TimeoutError:
            raise BenchError(f"the round-trip probe did not join: {self.probe.describe()}") from None
        await self.group.open()
        tasks = self.size * TASKS_PER_MEMBER
        specs = [(f"connector-{c:05d}", min(TASKS_PER_CONNECTOR, tasks - c * TASKS_PER_CONNECTOR))
                 for c in range(-(-tasks // TASKS_PER_CONNECTOR))]
        assert self.group.control is not None
        await alter_connectors(self.group.control, GROUP, specs)
        self.connectors = len(specs)
        self.items = len(specs) + tasks
        members = [await self.group.new_member() for _ in range(self.size)]
        for member in members:
            self.group.start(member)
        await self.wait_converged(1, f"setting up {self.size} members")
        return time.perf_counter() - started

    async def switch(self, mode: str) -> None:
        """Every member to ``mode``; wait until the parked heartbeats of long polls came back."""
        if self.group.long_poll != (mode == "long"):
            self.group.set_long_poll(mode == "long")
            await asyncio.sleep(INTERVAL_MS / 1000 + 0.2)
        await self.wait_converged(1, f"switching to {mode}")

    async def event(self, kind: str, mode: str, rep: int) -> dict[str, Any]:
        group = self.group
        await asyncio.sleep(SETTLE_S)
        probe = self.probe.members[0].m
        rtt = await round_trip_s(self.rtt_conn, ConnectGroupHeartbeatRequest(
            group_id=probe.group_id, member_id=probe.member_id, member_epoch=probe.member_epoch))
        versions_rtt = await round_trip_s(self.rtt_conn, APIS[ApiKey.API_VERSIONS].request_class(3)(
            client_software_name="bench-convergence", client_software_version="1"))
        echo_rtt = await raw_round_trip_s(*self.echo) if self.echo else float("nan")
        epoch = group.epoch()
        computations = len(group.assign_seconds)
        syncs = await asyncio.to_thread(fsyncs, self.metrics)
        from_crash: float | None = None
        if kind == "join":
            member = await group.new_member()  # its connection is open: time the join only
            self.expected_members += 1
            baseline = self.baseline()
            origin = time.perf_counter()
            group.start(member)
        elif kind == "crash":
            if len(group.live()) < 2:
                raise BenchError("a crash needs a group of 2 members or more")
            victim: SimMember = group.live()[-1]
            self.expected_members -= 1
            crashed = time.perf_counter()
            victim.crash(close=True)
            # The session expiry, as the daemon arms it: when it handles the last heartbeat;
            # then the crashed member's items are held for its stop budget (the coordinator
            # cannot tell a crash from a partitioned worker still stopping them).
            origin = victim.sent_at + self.session_s + self.hold_s
            from_crash = origin - crashed
            await asyncio.sleep(max(0.0, origin - time.perf_counter()))
            baseline = self.baseline()  # nothing can happen before the expiry
        else:
            self.connectors += 1
            self.items += 1 + TASKS_PER_CONNECTOR
            baseline = self.baseline()
            origin = time.perf_counter()
            assert group.control is not None
            await alter_connectors(group.control, GROUP,
                                   [(f"added-{self.connectors:05d}", TASKS_PER_CONNECTOR)])
        await self.wait_converged(epoch + 1, f"{kind} ({mode}, {self.size} members)")
        wall = time.perf_counter() - baseline[0]
        heartbeats = group.heartbeats - baseline[1]
        sim = [a - b for a, b in zip(sched("self"), baseline[2], strict=True)]
        daemon = [a - b for a, b in zip(sched(self.daemon_pid), baseline[3], strict=True)]
        settled = group.settled_at()
        syncs_after = await asyncio.to_thread(fsyncs, self.metrics)
        elapsed = settled - origin
        assign = sum(group.assign_seconds[computations:])
        return {
            "size": self.size, "mode": mode, "event": kind, "rep": rep,
            "ms": elapsed * 1000,
            "from_crash_ms": None if from_crash is None else (elapsed + from_crash) * 1000,
            "rtt_us": rtt * 1e6, "apiversions_rtt_us": versions_rtt * 1e6,
            "echo_rtt_us": echo_rtt * 1e6,
            "rtts": elapsed / rtt, "echo_rtts": elapsed / echo_rtt,
            "assign_ms": assign * 1000,
            "rtts_without_assignor": (elapsed - assign) / rtt,
            "computations": len(group.assign_seconds) - computations,
            "epochs": group.epoch() - epoch,
            "heartbeats": heartbeats,
            "fsyncs": syncs_after[0] - syncs[0],
            "fsync_ms": (syncs_after[1] - syncs[1]) * 1000,
            "sim_cpu": sim[0] / wall, "sim_cpu_wait": sim[1] / wall,
            "daemon_cpu": daemon[0] / wall, "daemon_cpu_wait": daemon[1] / wall,
        }

    async def replace_crashed(self) -> None:
        """Without join events, a new member (untimed) takes the crashed one's place: the group
        keeps its size."""
        epoch = self.group.epoch()
        await self.group.add_member()
        self.expected_members += 1
        await self.wait_converged(epoch + 1, "replacing the crashed member")

    def baseline(self) -> tuple[float, int, tuple[float, float], tuple[float, float]]:
        """(now, heartbeats sent, this process's and the daemon's ``sched``)."""
        return (time.perf_counter(), self.group.heartbeats, sched("self"), sched(self.daemon_pid))

    async def run(self) -> float:
        try:
            setup_s = await self.setup()
            for rep in range(self.args.repeat):
                order = self.args.modes if rep % 2 == 0 else self.args.modes[::-1]
                for mode in order:
                    await self.switch(mode)
                    for kind in self.args.events:
                        self.samples.append(await self.event(kind, mode, rep))
                        if kind == "crash" and "join" not in self.args.events:
                            await self.replace_crashed()
            return setup_s
        finally:
            await self.group.close()
            await self.probe.close()
            self.rtt_conn.close()


def run_loop(main: Coroutine[Any, Any, float]) -> float:
    """The daemon runs uvloop; so do the simulated members, when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def measure(args: argparse.Namespace, workdir: Path) -> tuple[list[dict[str, Any]], dict[int, float]]:
    env = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": str(args.session_timeout_ms),
           "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": str(INTERVAL_MS),
           "CONNECT_COORDINATOR_GROUP_CONNECT_MAX_SIZE": "1000000"}  # (any group size measured)
    if args.fsync:
        env["CONNECT_COORDINATOR_LOG_FSYNC"] = args.fsync
    samples: list[dict[str, Any]] = []
    setups: dict[int, float] = {}
    echo = start_echo(workdir / "echo-logs")
    try:
        for size in args.sizes:
            daemon, _ = start_daemon(workdir / f"data-{size}", extra_env=env)
            try:
                run = Run(daemon.host, daemon.port, daemon.pid, size, args, metrics_url(daemon),
                          (echo.host, echo.port))
                setups[size] = run_loop(run.run())
                samples += run.samples
                if daemon.proc.poll() is not None:
                    raise BenchError(f"the daemon exited:\n{daemon.stderr()[-3000:]}")
            finally:
                daemon.stop()
    finally:
        echo.stop()
    return samples, setups


def aggregate(samples: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for size in args.sizes:
        for kind in args.events:
            for mode in args.modes:
                s = [x for x in samples if (x["size"], x["event"], x["mode"]) == (size, kind, mode)]

                def med(key: str, digits: int = 3, s: list[dict[str, Any]] = s) -> float:
                    return round(statistics.median(x[key] for x in s), digits)

                rows.append({
                    "members": size, "event": kind, "mode": mode,
                    "ms": med("ms"), "rtt_us": med("rtt_us", 1),
                    "apiversions_rtt_us": med("apiversions_rtt_us", 1),
                    "echo_rtt_us": med("echo_rtt_us", 1),
                    "rtts": med("rtts", 1), "echo_rtts": med("echo_rtts", 1),
                    "assign_ms": med("assign_ms"),
                    "rtts_without_assignor": med("rtts_without_assignor", 1),
                    "from_crash_ms": med("from_crash_ms") if kind == "crash" else None,
                    "computations": med("computations", 1), "epochs": med("epochs", 1),
                    "heartbeats": med("heartbeats", 1),
                    "fsyncs": med("fsyncs", 1), "fsync_ms": med("fsync_ms"),
                    "sim_cpu": med("sim_cpu"), "sim_cpu_wait": med("sim_cpu_wait"),
                    "daemon_cpu": med("daemon_cpu"), "daemon_cpu_wait": med("daemon_cpu_wait"),
                    "runs_ms": [round(x["ms"], 3) for x in s],
                })
    return rows


def _pair(a: float, b: float) -> str:
    return f"{a * 100:.0f}/{b * 100:.0f}%"


def render(rows: list[dict[str, Any]]) -> str:
    header = (f"{'members':>7} {'event':>9} {'mode':>5} {'ms':>9} {'RTT us':>7} {'RTTs':>8} "
              f"{'assignor ms':>11} {'RTTs - assignor':>15} {'heartbeats':>10} {'fsyncs':>6} "
              f"{'fsync ms':>8} {'CPU sim/daemon':>14} {'waiting for CPU':>15}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['members']:>7} {r['event']:>9} {r['mode']:>5} {r['ms']:>9.1f} {r['rtt_us']:>7.0f} "
            f"{r['rtts']:>8,.0f} {r['assign_ms']:>11.2f} {r['rtts_without_assignor']:>15,.0f} "
            f"{r['heartbeats']:>10,.0f} {r['fsyncs']:>6,.0f} {r['fsync_ms']:>8.1f} "
            f"{_pair(r['sim_cpu'], r['daemon_cpu']):>14} "
            f"{_pair(r['sim_cpu_wait'], r['daemon_cpu_wait']):>15}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench convergence",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default=[10, 100, 1_000],
                        help="group sizes, comma-separated (default 10,100,1000)")
    parser.add_argument("--modes", type=choices_arg(MODES), default=list(MODES),
                        help="heartbeat modes: long (long-polled), plain (every 1 s); default both")
    parser.add_argument("--events", type=choices_arg(EVENTS), default=list(EVENTS),
                        help="events: join, crash, connector (default all)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median; default 3)")
    parser.add_argument("--session-timeout-ms", type=int, default=3_000,
                        help="the daemon's session timeout (default 3000; > 1000, the heartbeat "
                             "interval): a crash is noticed after it")
    parser.add_argument("--fsync", metavar="POLICY", default=None,
                        help="the daemon's log.fsync policy (default: the daemon's default, always)")
    parser.add_argument("--output", type=Path, default=RESULTS / "convergence.json",
                        help="where to write the rows (default bench/results/convergence.json)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.session_timeout_ms <= INTERVAL_MS:
        parser.error(f"--repeat must be >= 1, --session-timeout-ms > {INTERVAL_MS}")
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-convergence-") as tmp:
            samples, setups = measure(args, Path(tmp))
    except BenchError as exc:
        print(f"bench convergence: {exc}", file=sys.stderr)
        return 1
    rows = aggregate(samples, args)
    size = 100 if 100 in args.sizes else max(args.sizes)
    kind = "join" if "join" in args.events else args.events[0]
    mode = "long" if "long" in args.modes else args.modes[0]
    head = next(r for r in rows if (r["members"], r["event"], r["mode"]) == (size, kind, mode))
    met = head["rtts_without_assignor"] < TARGET_RTTS
    result = {
        "benchmark": "convergence",
        "unit": "ms from the event until every member is Stable at a newer epoch (median); "
                "round trips = ms / median steady-heartbeat round trip measured before the event",
        "repeat": args.repeat, "sizes": args.sizes, "modes": args.modes, "events": args.events,
        "session_timeout_ms": args.session_timeout_ms, "heartbeat_interval_ms": INTERVAL_MS,
        "fsync": args.fsync or "default (always)",
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "tasks_per_member": TASKS_PER_MEMBER, "tasks_per_connector": TASKS_PER_CONNECTOR,
        **machine(),
        "setup_seconds": {str(k): round(v, 3) for k, v in setups.items()},
        "rows": rows,
        "samples": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in x.items()}
                    for x in samples],
        "headline": {"metric": "convergence in round trips, without the assignor's time",
                     "members": size, "event": kind, "mode": mode,
                     "rtts_without_assignor": head["rtts_without_assignor"],
                     "assign_ms": head["assign_ms"], "ms": head["ms"], "rtt_us": head["rtt_us"],
                     "target_rtts": TARGET_RTTS, "met": met},
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(rows))
    print(f"(median of {args.repeat}; session timeout {args.session_timeout_ms} ms, heartbeat interval "
          f"{INTERVAL_MS} ms, fsync {args.fsync or 'default'}; "
          "crash timed from the end of the hold (session expiry + 0.5 s); "
          "members set up in " + ", ".join(f"{v:.1f} s ({k})" for k, v in setups.items())
          + f"; load average {result['loadavg_before'][0]:.2f} before, "
          f"{result['loadavg_after'][0]:.2f} after)")
    print(f"(rows written to {args.output})")
    print(f"headline: {kind} at {size} members, {'long-polled' if mode == 'long' else 'plain'}: "
          f"{head['rtts_without_assignor']:,.0f} RTT + assignor {head['assign_ms']:.1f} ms "
          f"({head['ms']:.1f} ms; RTT {head['rtt_us']:.0f} us); target < {TARGET_RTTS} RTT + "
          f"assignor: {'met' if met else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
