"""The counter example (offsets and a fenced SQLite sink) through failures, with real processes.

One ``connect-coordinator serve`` (file store, fsync always, session 2 s, heartbeat interval
200 ms) for the module, kept on one port so that it can be killed and started again; each test
its own group, SQLite file and ``connect-worker`` processes (session 2 s, stop budget 1 s,
scheduled delay 500 ms), running ``worker_client.examples.counter`` with 2 tasks over 4 source
partitions, writing a number per partition every 50 ms and committing after each write.

1. ``kill -9`` of a worker: each task it ran resumes on the other worker at the offset the
   coordinator stored, which is at least the last commit the dead one saw acknowledged, and
   the sink shows it: rows up to that offset untouched, the next one the new holder's.
2. ``kill -9`` of the coordinator, down longer than the workers' session (they stop their
   tasks), started again on the same data dir: every task resumes at least at its last
   acknowledged commit.
3. A worker frozen (SIGSTOP) with a write in flight, for longer than the session, the hold and
   the scheduled delay, then woken (SIGCONT). Its own lease is set longer than the
   coordinator's session (as a paused VM whose clock did not see the pause), so its fail-stop
   guard does not end it when it wakes: fencing is all that protects the sink. Its in-flight
   write lands after the new holder's and is refused by the token (the rows keep the new
   holder's values); its commits raise ``FencedError`` (UNKNOWN_MEMBER_ID: the member it
   committed as is gone; the first heartbeat after waking tells the worker, which then
   refuses them itself, so the coordinator's own refusal of a stale commit is not what this
   exercises); the new holder's writes and commits go on being accepted.

Every test ends with every worker stopped (SIGTERM: each ``stop()`` commits) and checks the
sink against the stored offsets: rows 1..offset in every partition, none missing, tokens never
going back along a partition.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient
from tests.counter_harness import FENCED, TASKS, CounterRun
from tests.daemon_fixture import Daemon, DaemonPool
from tests.etcd_fixture import free_port

SESSION_S = 2.0  # the coordinator's (daemon_fixture.SHORT_TIMEOUTS) and the workers'


class Coordinator:
    """The module's daemon on a fixed port; ``kill``/``restart`` keep its data dir and port."""

    def __init__(self, pool: DaemonPool, base: Path) -> None:
        self.pool, self.data = pool, base / "data"
        self.port = free_port()
        self.daemon = self.start()

    def start(self) -> Daemon:
        return self.pool.start(self.data, extra_args=["--listen", f"127.0.0.1:{self.port}"])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> float:
        self.daemon.kill()
        return time.time()

    def restart(self) -> None:
        self.daemon = self.start()

    def describe(self, group: str) -> Any:
        try:
            with AdminClient("127.0.0.1", self.port, timeout_s=5) as c:
                (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(group,))).groups
        except OSError:
            return None
        return g if g.error_code == 0 else None


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    base = tmp_path_factory.mktemp("counter")
    with DaemonPool(base) as pool:
        yield Coordinator(pool, base)


@pytest.fixture
def run_of(coordinator: Coordinator, tmp_path: Path) -> Iterator[Any]:
    runs: list[CounterRun] = []

    def make(group: str) -> CounterRun:
        run = CounterRun(tmp_path, coordinator.bootstrap, group, coordinator.describe)
        runs.append(run)
        return run
    yield make
    for run in runs:
        run.stop_all()


def test_a_killed_workers_tasks_resume_elsewhere_from_their_last_committed_offsets(run_of) -> None:
    run = run_of("killed")
    run.create(tasks=2, partitions=4)
    run.spawn("w1")
    run.spawn("w2")
    owner = run.settle({"w1", "w2"})
    victim = owner["counts/0"]
    heir = "w2" if victim == "w1" else "w1"
    moved = [i for i in TASKS if owner[i] == victim]
    killed = run.kill(victim)
    stored = run.offsets()  # nobody holds its tasks now: nothing commits for them
    resumed = {}
    for item in moved:
        acked = run.last_acked(item)
        assert acked and all(stored.get(p, 0) >= seq for p, seq in acked.items()), (item, acked, stored)
        (event, *_) = run.wait(lambda i=item: run.events("resume", i, run.pid(heir), since=killed),
                               f"{item} to resume on {heir}", timeout_s=30)
        resumed[item] = event["positions"]
        # It resumed from the offsets the coordinator kept, exactly.
        assert resumed[item] == {p: stored.get(p, 0) for p in run.partitions_of(item)}, (resumed, stored)
    run.wait(lambda: all(run.committed(i, 3, pid=run.pid(heir), since=killed) for i in moved),
             f"{heir} to commit the moved tasks")
    for item in moved:
        run.assert_resumed_exactly(item, run.pid(heir), resumed[item], run.last_acked(item, killed))
    run.stop_all()
    final = run.assert_final()
    for item in moved:
        assert all(final[p] > seq for p, seq in resumed[item].items()), (final, resumed)


def test_a_killed_coordinator_restarted_keeps_every_acknowledged_commit(
        run_of, coordinator: Coordinator) -> None:
    run = run_of("restarted")
    run.create(tasks=2, partitions=4)
    run.spawn("w1")
    run.spawn("w2")
    run.settle({"w1", "w2"})
    killed = coordinator.kill()
    # Down longer than the workers' lease: they stop their tasks (whose last commits fail).
    time.sleep(SESSION_S + 1.5)
    restarted = time.time()
    coordinator.restart()
    acked = {i: run.last_acked(i, killed) for i in TASKS}
    assert all(acked.values()), acked
    run.settle({"w1", "w2"})
    for item in TASKS:
        # Each task stopped with the lease and started again (maybe more than once while the
        # workers rejoined): its last start, committing since.
        def resumed(i: str = item) -> dict[str, Any] | None:
            starts = run.events("resume", i, since=restarted)
            last = starts[-1] if starts else None
            return last if last and run.committed(i, 3, pid=last["pid"], since=last["ts"]) else None
        event = run.wait(resumed, f"{item} to resume and commit")
        run.assert_resumed_exactly(item, event["pid"], event["positions"], acked[item])
        for e in run.events("resume", item, since=restarted):  # every start since, too
            assert all(e["positions"][p] >= seq for p, seq in acked[item].items()), (item, e, acked)
    run.stop_all()
    run.assert_final()


def test_a_frozen_workers_late_write_and_commits_are_refused(run_of) -> None:
    run = run_of("frozen")
    run.create(tasks=2, partitions=4)
    run.spawn("w1", session_ms=60_000)  # its lease outlives the freeze: its guard stays quiet
    run.spawn("w2")
    owner = run.settle({"w1", "w2"})
    item = next(i for i in TASKS if owner[i] == "w1")
    stale = run.pid("w1")
    # Hold the SQLite write lock until w1's task is surely waiting for it (a write every 50 ms),
    # freeze w1 there, then let the others write again: w1's write is in flight.
    with contextlib.closing(sqlite3.connect(run.db, timeout=30, isolation_level=None)) as lock:
        lock.execute("BEGIN IMMEDIATE")
        time.sleep(0.5)
        run.freeze("w1")
        frozen = time.time()
        lock.execute("ROLLBACK")
    acked = run.last_acked(item)
    (event, *_) = run.wait(lambda: run.events("resume", item, run.pid("w2"), since=frozen),
                           f"{item} to resume on w2", timeout_s=30)
    heir_token = event["token"]
    run.wait(lambda: run.committed(item, 3, pid=run.pid("w2"), since=frozen), "w2 to commit it")
    thawed = time.time()
    run.thaw("w1")
    refused = run.wait(lambda: run.events("write-refused", item, stale), "w1's late write to be refused",
                       timeout_s=30)
    fenced = run.wait(lambda: run.events("commit-refused", item, stale), "w1's commit to be refused",
                      timeout_s=30)
    assert {e["error"] for e in fenced} <= FENCED, fenced
    stale_token = refused[0]["token"]
    assert stale_token < heir_token, (stale_token, heir_token)
    # The refused batch is not in the sink: those rows are the new holder's.
    rows = run.rows()
    for e in refused:
        for p, seq in e["positions"].items():
            assert rows[p].get(seq, (0,))[0] >= heir_token, (p, seq, rows[p].get(seq), "it landed")
    assert not [(p, s) for p in run.partitions_of(item) for s, (t, _) in rows[p].items()
                if t == stale_token and s > event["positions"][p]], "w1 wrote past the new holder's start"
    assert run.fence_token(item) >= heir_token
    # The holder's writes and commits go on being accepted after the stale one woke (w2's, or
    # w1's again if w1 rejoined and was given the task back: a new grant, a higher token).
    run.wait(lambda: run.committed(item, 3, since=thawed + 1.0), "the task to go on committing")
    run.assert_resumed_exactly(item, run.pid("w2"), event["positions"], acked)
    run.stop_all()
    final = run.assert_final()
    assert all(final[p] > seq for p, seq in event["positions"].items()), (final, event)
