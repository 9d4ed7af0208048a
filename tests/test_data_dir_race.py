"""SIGKILL loop with two daemons racing for one data dir ("and keep it so").

Each cycle starts two real daemons on the same data dir at the same instant: exactly one must
come up, the other must exit 2 naming the data dir and the winner's pid. Writers then create
connectors through the winner (every acknowledged one is recorded); a third daemon started
mid-load also exits 2; then the winner is SIGKILLed at a seeded random instant. After every
restart, every acknowledged connector is there and no partition failed (the recovery point,
written every 20 ms here, never claims the torn tail a kill leaves). ``RACE_CYCLES=N`` runs
more cycles, ``RACE_SEED=N`` replays the kill instants.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from connect_wire.messages import ConnectGroupAlterConnectorsRequest, ConnectGroupDescribeRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.admin import AdminClient, AdminError
from coordinator.runtime.partitioner import partition_for
from tests.daemon_fixture import BANNER, daemon_env, serve_command, stderr_events

PARTITIONS = 2
ENV = {"CONNECT_COORDINATOR_LOG_RECOVERY_POINT_INTERVAL_MS": "20",
       "CONNECT_COORDINATOR_LOG_SEGMENT_BYTES": "8192",
       "CONNECT_COORDINATOR_LOG_COMPACTION_INTERVAL_MS": "200"}
ROOT = Path(__file__).resolve().parent.parent


class Proc:
    def __init__(self, data: Path, tag: str) -> None:
        self.out = data.parent / f"race-{tag}.stdout"
        self.err = data.parent / f"race-{tag}.stderr"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                serve_command(data, ["--partitions", str(PARTITIONS)]), stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, env=daemon_env(ENV), cwd=ROOT)

    def banner(self) -> re.Match[str] | None:
        text = self.out.read_text(errors="replace")
        return BANNER.fullmatch(text.split("\n", 1)[0].strip()) if "\n" in text else None

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


def race(data: Path, tag: str) -> tuple[Proc, re.Match[str]]:
    """Start two daemons at once; return the one that came up (the other exited 2)."""
    a, b = Proc(data, f"{tag}-a"), Proc(data, f"{tag}-b")
    deadline = time.monotonic() + 30
    while True:
        up = [(p, m) for p in (a, b) if (m := p.banner()) is not None]
        exited = [p for p in (a, b) if p.proc.poll() is not None]
        if up and exited:
            break
        assert len(up) < 2, "both daemons of a race came up on one data dir"
        assert len(exited) < 2, f"both exited:\n{a.stderr()[-2000:]}\n{b.stderr()[-2000:]}"
        assert time.monotonic() < deadline, f"race {tag} undecided:\n{a.stderr()[-2000:]}"
        time.sleep(0.01)
    (winner, match), (loser,) = up[0], exited
    assert loser is not winner
    assert_refused(loser, data, winner)
    return winner, match


def assert_refused(loser: Proc, data: Path, winner: Proc) -> None:
    assert loser.proc.wait(10) == 2, loser.stderr()[-2000:]
    assert loser.banner() is None
    (line,) = [x for x in stderr_events(loser.stderr()) if x.startswith("connect-coordinator:")]
    assert str(data) in line and f"pid {winner.proc.pid}" in line, line


def groups() -> list[str]:
    chosen: dict[int, str] = {}
    n = 0
    while len(chosen) < PARTITIONS:
        chosen.setdefault(partition_for(f"race-{n}", PARTITIONS), f"race-{n}")
        n += 1
    return sorted(chosen.values())


def writer(addr: tuple[str, int], gid: str, prefix: str, acked: set[str], stop: threading.Event) -> None:
    n = 0
    try:
        with AdminClient(*addr, timeout_s=5) as c:
            while not stop.is_set():
                name = f"{prefix}-{n}"
                n += 1
                resp = c.call(ConnectGroupAlterConnectorsRequest(
                    group_id=gid, upserts=(_alter.ConnectorSpec(name=name, task_count=1, config=()),),
                    deletes=(), validate_only=False))
                if resp.error_code == 0:
                    acked.add(name)
    except (AdminError, OSError, EOFError, ConnectionError):
        return  # the daemon was killed: whatever was in flight is not acknowledged


def test_sigkill_loop_with_two_daemons_racing_for_one_data_dir(tmp_path: Path) -> None:
    cycles = int(os.environ.get("RACE_CYCLES", "5"))
    seed = int(os.environ.get("RACE_SEED", str(random.randrange(1 << 31))))
    rng = random.Random(seed)
    context = f"RACE_SEED={seed} RACE_CYCLES={cycles}"
    data = tmp_path / "data"
    gids = groups()
    acked: dict[str, set[str]] = {g: set() for g in gids}
    for cycle in range(cycles + 1):
        winner, match = race(data, f"c{cycle}")
        addr = (match["host"], int(match["port"]))
        try:
            with AdminClient(*addr, timeout_s=15) as c:
                for gid in gids:
                    (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(gid,))).groups
                    have = {x.name for x in (g.connectors or ())}
                    assert g.error_code in (0, 69) and acked[gid] <= have, (
                        context, cycle, gid, g.error_code, sorted(acked[gid] - have))
            errors = [x for x in winner.stderr().splitlines() if '"level":"error"' in x]
            assert not errors, (context, errors[:5])
            if cycle == cycles:
                break
            stop = threading.Event()
            threads = [threading.Thread(target=writer, args=(addr, gid, f"c{cycle}", acked[gid], stop))
                       for gid in gids]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.1, 0.3))
            late = Proc(data, f"c{cycle}-late")  # a third daemon mid-load: refused too
            assert_refused(late, data, winner)
            time.sleep(rng.uniform(0.0, 0.5))
            winner.proc.send_signal(signal.SIGKILL)
            winner.proc.wait(10)
            stop.set()
            for t in threads:
                t.join(20)
        finally:
            if winner.proc.poll() is None and cycle == cycles:
                winner.proc.send_signal(signal.SIGTERM)
                assert winner.proc.wait(20) == 0
            elif winner.proc.poll() is None:
                winner.proc.kill()
                winner.proc.wait()
    total = sum(len(v) for v in acked.values())
    print(f"{context}: {total} acknowledged connectors survived {cycles} kills")
    assert total >= 2 * cycles, (context, total)  # the load did real work
    # The clean stop claimed where every log ends: both partitions hold records.
    version, count, *entries = (data / "recovery-point-offset-checkpoint").read_text().splitlines()
    assert (version, count) == ("0", str(PARTITIONS))
    assert all(int(e.split()[1]) > 0 for e in entries), entries
