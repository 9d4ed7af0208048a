"""Scenarios as data: what happens to a group during one simulated run.

A :class:`Scenario` holds the group's settings, the environment (latencies, start and stop
durations, log and network failure rates) and the fault schedule's parameters. The schedule
itself is drawn from the run's seed by :meth:`Scenario.schedule`: times are offsets from the
moment the initial group has formed and converged ("the fault phase"); every fault has ended by
the returned ``faults_end`` offset, after which the group must converge within
``convergence_bound_ms``.

Counts of faulted workers are capped at ``max_faulted`` (and never take the whole group down),
so that a scenario stays a few dozen rebalances at 500 workers: a rolling bounce of all 500
workers would be 1,000 rebalances, hours of real time, and tells nothing the first ten do not.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

Range = tuple[int, int]

PAUSE_ARM_MS = 5_000
"""A ``pause`` of a ``pause_mid_write`` scenario waits at most this long for a write to begin."""
DEPOSED_ARM_MS = 2_000
"""A ``deposed_late_write`` with a write in flight freezes the owner at its next batch that
writes, waiting at most this long (then it freezes it anyway)."""


@dataclass(frozen=True)
class Fault:
    """One fault: at ``at_ms`` (offset from the start of the fault phase) do ``kind`` to ``slot``
    (a worker slot index, or -1 for the coordinator / the admin) for ``duration_ms``."""

    at_ms: int
    kind: str
    slot: int = -1
    duration_ms: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    # -- the group ----------------------------------------------------------------------------------
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    rebalance_timeout_ms: int = 15_000
    max_delay_ms: int = 15_000
    """The incremental assignor's scheduled.rebalance.max.delay.ms (Connect: 300 s; shorter
    here so that a run is minutes of virtual time, not hours)."""
    long_poll: bool = True
    identity: str = "member_id"
    """How a worker identifies itself across restarts: ``member_id`` (a member id of its own,
    the same after a restart), ``static`` (an instance id; the coordinator generates member ids;
    a graceful stop leaves with -2) or ``generated`` (a new coordinator-generated id per process)."""
    tasks_per_connector: int = 10
    # -- environment ----------------------------------------------------------------------------------
    latency_ms: Range = (1, 6)
    start_ms: Range = (5, 300)
    stop_ms: Range = (5, 300)
    compute_ms: Range = (2, 10)
    """Time the chosen worker takes to run the assignor, plus 1 ms per 1,000 items."""
    fsync_ms: Range = (1, 5)
    load_ms: Range = (50, 500)
    request_timeout_ms: int = 30_000
    client_max_backoff_ms: int = 1_000  # CoordinatorClient's reconnect backoff ceiling (was 5 s)
    heartbeat_timeout_ms: int = 0
    """How long a heartbeat waits for its answer beyond its MaxWaitMs before the worker gives up
    the connection (and finds the coordinator again). 0: the worker's (since 72dc392), a tenth of
    the session, 1 s to the request timeout; from ff1e79c to 72dc392 a fifth (what-if: 2_000 with
    the default session), before ff1e79c the request timeout (30 s)."""
    find_timeout_ms: int = 2_000
    """How long FindCoordinator waits for one bootstrap node's answer (CoordinatorClient's
    discovery timeout since ff1e79c; it was the request timeout, 30 s)."""
    find_parallel: bool = True
    """FindCoordinator asks every bootstrap node at once and the first answer naming a coordinator
    wins (CoordinatorClient since 72dc392); it fails when every node has failed or answered an
    error. False (what-if: the worker before 72dc392, modelled as then): one node after another
    in random order, each given ``find_timeout_ms``, the owner taken from the store when the
    connection to it is made."""
    find_error_wait_ms: int = 100
    """Once a node has answered FindCoordinator with an error (nobody owns the partition now),
    wait at most this long for another node's answer naming one, then fail (and retry after the
    backoff): CoordinatorClient since 6fac78c (FIND_GRACE_S). -1 (what-if: the worker of 72dc392):
    wait for every ask to end (a frozen node's ask then holds the failure for its whole discovery
    timeout)."""
    retry_within_lease: bool = True
    """The worker retries a failed heartbeat (or a retriable error) after at most a quarter of
    what is left of its lease (Worker._retry_delay_ms, ff1e79c); False: the plain backoff, as
    before (what-if)."""
    offset_commits: bool = True
    """The instances do work (the worker model's ``_tick``): each, once up, fetches its partition's
    committed offset, then every ``work_ms`` advances its position, writes to its item's resource
    with its fencing token and commits the position through the coordinator; its stop() commits
    its last position. Off: instances only run (the model before offsets)."""
    work_ms: Range = (1_000, 4_000)
    write_ms: Range = (5, 250)
    """How long a write to a resource takes (a transaction: the token is checked and recorded
    when it commits, at its end; a process frozen meanwhile commits it when it wakes)."""
    # -- faults -----------------------------------------------------------------------------------------
    window_ms: int = 30_000
    """Faults start within [0, window_ms) of the fault phase (a rolling bounce runs until done)."""
    crashes: int = 0
    crash_restart_ms: Range | None = None
    """Downtime before a crashed worker's process restarts; None: it never comes back."""
    bounces: int = 0
    bounce_down_ms: Range = (1_000, 5_000)
    rolling: bool = False
    """Bounce the workers one after another (each when the previous one is back)."""
    rolling_gap_ms: Range = (2_000, 6_000)
    joins: int = 0
    leaves: int = 0
    """Graceful leaves (stop all work, leave with -1); the worker does not come back."""
    scale_fraction: float = 0.0
    """Scale up by this fraction of the group (at least one worker), then down by as many."""
    pauses: int = 0
    pause_ms: Range = (12_000, 20_000)
    pause_mid_write: bool = False
    """A pause begins as one of the worker's instances begins a write to its resource (within
    ``PAUSE_ARM_MS``; then anyway): the write commits when the process wakes."""
    partitions: int = 0
    partition_ms: Range = (2_000, 20_000)
    conn_drops: int = 0
    coordinator_restarts: int = 0
    coordinator_down_ms: Range = (200, 3_000)
    slow_revocations: int = 0
    """A worker whose revocations take 1-2x the rebalance timeout for ``window_ms``: past its
    stop budget (half the rebalance timeout), so the worker fail-stops (its process ends at the
    budget's end and its supervisor restarts it)."""
    slow_bounces: int = 0
    """A worker bounced (stopped gracefully) while its stops take 2/3 to all of its stop budget
    (longer than the session timeout when the budget is)."""
    bad_stops: int = 0
    """Workers whose plugins misbehave on stop (``bad_stop``) for ``window_ms``."""
    bad_stop: str = ""
    """How: ``slow_stop`` (stops take 0.9-1.3x the budget: most overrun it, some just make it),
    ``hanging_stop`` (stop() never returns), ``raising_stop`` (stop() raises at once: that counts
    as stopped), ``ignores_cancel`` (stop() returns but run() ignores the cancellation and never
    ends). An instance not stopped within the budget fail-stops the worker."""
    connector_changes: int = 0
    loss: float = 0.0
    """Probability that a message is lost during the fault phase (its connection resets)."""
    append_fail: float = 0.0
    fsync_fail: float = 0.0
    # -- several coordinator nodes (partition ownership through etcd leases) ------------
    nodes: int = 1
    """Coordinator nodes. 1: the embedded file store (one daemon, ``coordinator_restart``). More:
    the group's partition is owned by one node at a time through an etcd lease; its records live
    in etcd, written fenced on the ownership; the owner moves between nodes (the faults below)."""
    lease_ttl_ms: int = 5_000
    """The node lease's TTL: renewed every third of it; a killed or frozen owner's lease expires
    (counted by etcd from its last renewal's arrival) before another node can take over."""
    lease_margin_ms: int = 500
    """The owner answers only while its lease is certainly valid by more than this (the TTL
    counted from the last successful renewal's *send*, NodeLease.remaining())."""
    handover_ms: Range = (5, 100)
    """From an owner releasing (or its lease expiring) to the next owner's acquire: the watch
    event and the acquire transaction."""
    partition_moves: int = 0
    """Graceful handovers (placement moves the partition, or its owner is stopped with SIGTERM):
    the owner answers NOT_COORDINATOR to what it has not handled and to its parked long polls,
    lets the write in flight commit, releases; the next owner loads at once."""
    owner_failovers: int = 0
    """The owner node is killed (kill -9): its connections reset, nothing answers until its lease
    expires (``lease_ttl_ms`` after its last renewal) and another node acquires and loads."""
    owner_hosts_lost: int = 0
    """The owner's host becomes unreachable (power lost, cut off the network): no RST, so the
    workers' connections to it hang until their requests time out; connecting to it times out
    (2 s); its lease expires and another node loads. It comes back (restarted) later."""
    owner_etcd_cuts: int = 0
    """The owner is cut off from etcd (not from the workers) for ``etcd_cut_ms``: its renewals
    fail, so it must stop answering before its lease can expire; a write waits for etcd and is
    then fenced."""
    etcd_cut_ms: Range = (2_000, 12_000)
    deposed_writes: int = 0
    """The owner node is frozen (SIGSTOP) for ``deposed_freeze_ms``, past its lease, with a write
    in flight (a worker joins at that instant to make one; the freeze waits for its batch, at most
    ``DEPOSED_ARM_MS``): another node takes over; when it wakes it tries to commit that write and
    to answer what waited in its sockets."""
    deposed_idle: int = 0
    """The same, the owner frozen whatever it is doing (often idle: steady heartbeats only)."""
    deposed_freeze_ms: Range = (6_000, 25_000)
    etcd_leader_losses: int = 0
    """etcd loses its leader for an election (``etcd_election_ms``): no renewal, write or acquire
    gets through meanwhile and no lease expires; the new leader extends every lease by its TTL.
    An owner whose lease went in doubt answers nothing meanwhile and, renewed on the same lease,
    serves the same state again (no reload)."""
    etcd_election_ms: Range = (1_000, 2_500)
    etcd_lease_revokes: int = 0
    """etcd unreachable for ``etcd_revoke_ms`` while its leader keeps its role: renewals do not
    get through and leases past their TTL are revoked; once etcd answers again the owner learns
    its lease is gone (a renewal answered TTL 0) and another node acquires."""
    etcd_revoke_ms: Range = (2_500, 5_000)
    doubt_drops: bool = False
    """TEST ONLY / what-if (on: the behaviour before, an owner whose lease is in doubt drops the
    partition at once instead of waiting for etcd's answer)."""
    node_restarts: int = 0
    """Rounds of rolling restarts of every coordinator node (SIGTERM, down ``node_down_ms``,
    started again), one node after another: the owner's stop is a graceful handover, and a node
    that comes back takes the partition (a handover to it) with probability 1/nodes (the
    placement gives a joining node its share)."""
    node_down_ms: Range = (1_000, 5_000)
    fenced_writes: bool = True
    """TEST ONLY (off: a deposed owner's write is applied; tests/test_simulation.py shows the
    invariants catch it)."""
    lease_checked: bool = True
    """TEST ONLY (off: the owner neither checks its lease before answering nor gives the partition
    up when it cannot renew it; it learns it was deposed only from a refused write)."""
    # -- classic workers (Kafka Connect's worker: JoinGroup/SyncGroup/Heartbeat/LeaveGroup) --------
    classic: str = ""
    """Which worker slots run classic workers (simulation/classic_worker.py): ``""`` none and
    no classic model at all (the scenarios before it), ``"none"`` none at first (a migration
    makes them), ``"all"``, ``"half"`` (the even slots)."""
    classic_protocol: str = "auto"
    """Their ``connect.protocol``: ``sessioned``, ``compatible``, ``default`` (eager), ``auto``
    (``default`` with the eager assignor, else ``sessioned``) or ``mixed`` (by slot: sessioned,
    default, compatible)."""
    migrate: str = ""
    """A worker stopped gracefully and restarted (a bounce) comes back speaking the other
    protocol: ``to_new`` (classic -> new) or ``to_classic`` (new -> classic)."""
    max_faulted: int = 10
    convergence_bound_ms: int = 60_000
    """After the last fault ends, the group must converge within this long."""
    tags: tuple[str, ...] = field(default=())

    def with_(self, **changes: object) -> Scenario:
        return replace(self, **changes)  # type: ignore[arg-type]

    # -- the schedule ----------------------------------------------------------------------------------
    def schedule(self, rng: random.Random, workers: int) -> tuple[list[Fault], int]:
        """The faults of one run and the offset by which they have all ended."""
        faults: list[Fault] = []
        cap = max(0, min(self.max_faulted, workers - 1))
        slots = list(range(workers))
        rng.shuffle(slots)
        pool = iter(slots)

        def pick() -> int:
            try:
                return next(pool)
            except StopIteration:
                return rng.randrange(workers)

        def t() -> int:
            return rng.randrange(max(1, self.window_ms))

        def d(r: Range) -> int:
            return rng.randint(r[0], r[1])

        used = 0

        def take(n: int) -> int:
            nonlocal used
            n = max(0, min(n, cap - used))
            used += n
            return n

        for _ in range(take(self.crashes)):
            restart = d(self.crash_restart_ms) if self.crash_restart_ms is not None else -1
            faults.append(Fault(t(), "crash", pick(), restart))
        if self.rolling:
            at = rng.randrange(1_000, 3_000)
            for _ in range(take(self.bounces if self.bounces else workers)):
                down = d(self.bounce_down_ms)
                faults.append(Fault(at, "bounce", pick(), down))
                at += down + d(self.rolling_gap_ms)
        else:
            for _ in range(take(self.bounces)):
                faults.append(Fault(t(), "bounce", pick(), d(self.bounce_down_ms)))
        for _ in range(take(self.slow_bounces)):
            faults.append(Fault(t(), "slow_bounce", pick(), d(self.bounce_down_ms)))
        for _ in range(take(self.leaves)):
            faults.append(Fault(t(), "leave", pick()))
        for _ in range(self.pauses):
            faults.append(Fault(t(), "pause", pick(), d(self.pause_ms),
                                "mid_write" if self.pause_mid_write else ""))
        for _ in range(self.partitions):
            faults.append(Fault(t(), "partition", pick(), d(self.partition_ms)))
        for _ in range(self.conn_drops):
            faults.append(Fault(t(), "drop", rng.randrange(workers)))
        for _ in range(self.slow_revocations):
            faults.append(Fault(t(), "slow_revocation", rng.randrange(workers), self.window_ms))
        for _ in range(self.bad_stops):
            faults.append(Fault(t(), "bad_stops", rng.randrange(workers), self.window_ms, self.bad_stop))
        for _ in range(self.coordinator_restarts):
            faults.append(Fault(t(), "coordinator_restart", -1, d(self.coordinator_down_ms)))
        for k in range(self.connector_changes):
            faults.append(Fault(t(), "connectors", -1, 0, ("add", "delete", "resize")[k % 3]))
        new_slot = workers
        for _ in range(self.partition_moves):
            faults.append(Fault(t(), "partition_move", -1))
        for _ in range(self.owner_failovers):
            faults.append(Fault(t(), "owner_failover", -1, self.lease_ttl_ms, "kill"))
        for _ in range(self.owner_hosts_lost):
            faults.append(Fault(t(), "owner_failover", -1, self.lease_ttl_ms, "host"))
        for _ in range(self.owner_etcd_cuts):
            faults.append(Fault(t(), "owner_failover", -1, d(self.etcd_cut_ms), "etcd"))
        for _ in range(self.deposed_writes):
            at = t()
            faults.append(Fault(at, "deposed_late_write", -1, d(self.deposed_freeze_ms), "write"))
            faults.append(Fault(at, "join", new_slot))  # the write: a worker joins then
            new_slot += 1
        for _ in range(self.deposed_idle):
            faults.append(Fault(t(), "deposed_late_write", -1, d(self.deposed_freeze_ms), "idle"))
        for _ in range(self.etcd_leader_losses if self.nodes > 1 else 0):
            faults.append(Fault(t(), "etcd_leader_loss", -1, d(self.etcd_election_ms), "election"))
        for _ in range(self.etcd_lease_revokes if self.nodes > 1 else 0):
            faults.append(Fault(t(), "etcd_leader_loss", -1, d(self.etcd_revoke_ms), "revoke"))
        at = rng.randrange(1_000, 3_000) if self.node_restarts and self.nodes > 1 else 0
        for _ in range(self.node_restarts if self.nodes > 1 else 0):
            order = list(range(self.nodes))
            rng.shuffle(order)
            for node in order:
                down = d(self.node_down_ms)
                takes = rng.randrange(self.nodes) == 0
                how = " takes" if takes else ""
                faults.append(Fault(at, "node_restart", -1, down, f"n{node + 1}{how}"))
                at += down + d(self.rolling_gap_ms)
        for _ in range(self.joins):
            faults.append(Fault(t(), "join", new_slot))
            new_slot += 1
        if self.scale_fraction > 0:
            n = max(1, min(self.max_faulted, int(workers * self.scale_fraction)))
            up = rng.randrange(0, max(1, self.window_ms // 4))
            for _ in range(n):
                faults.append(Fault(up + rng.randrange(0, 1_000), "join", new_slot))
                new_slot += 1
            down = self.window_ms // 2 + rng.randrange(0, max(1, self.window_ms // 4))
            everyone = list(range(new_slot))
            rng.shuffle(everyone)
            for slot in everyone[:n]:
                faults.append(Fault(down + rng.randrange(0, 1_000), "leave", slot))
        faults.sort(key=lambda f: (f.at_ms, f.kind, f.slot))
        end = 0
        for f in faults:
            end = max(end, f.at_ms + max(0, f.duration_ms if f.kind != "slow_revocation" else 0))
            if f.kind == "deposed_late_write":  # it waits up to DEPOSED_ARM_MS for a write
                end = max(end, f.at_ms + DEPOSED_ARM_MS + f.duration_ms)
            if f.detail == "mid_write":  # it waits up to PAUSE_ARM_MS for a write
                end = max(end, f.at_ms + PAUSE_ARM_MS + f.duration_ms)
            # (a bad_stops window counts: the faults end when the plugin behaves again)
        if self.loss or self.append_fail or self.fsync_fail:
            end = max(end, self.window_ms)
        return faults, end


_BASE = Scenario(name="base", description="")
_HOLD = _BASE.session_timeout_ms + _BASE.max_delay_ms + _BASE.rebalance_timeout_ms


def _s(name: str, description: str, **kw: object) -> Scenario:
    return _BASE.with_(name=name, description=description, **kw)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # -- seed 003's use cases ------------------------------------------------------------------
        _s("process-death-quick-restart",
           "Seed 003 'Kubernetes process death': a worker process dies (no leave) and its "
           "orchestrator restarts it within a few seconds with the same member id.",
           crashes=1, crash_restart_ms=(500, 5_000), convergence_bound_ms=_HOLD + 30_000),
        _s("rolling-bounce",
           "Seed 003 'Rolling bounce': every worker (up to max_faulted) is stopped gracefully "
           "(stop work, leave with -1) and restarted with the same member id, one after another.",
           rolling=True, bounce_down_ms=(1_000, 4_000), max_faulted=5, convergence_bound_ms=_HOLD + 30_000),
        _s("rolling-bounce-static",
           "Rolling bounce with static membership: each worker leaves with -2 and its instance id "
           "takes its work back under a new member id.",
           rolling=True, identity="static", bounce_down_ms=(1_000, 4_000), max_faulted=5,
           convergence_bound_ms=_HOLD + 30_000),
        _s("scale-up-down",
           "Seed 003 'Scale up/down': a third of the group (at least one worker) joins, later as "
           "many workers leave gracefully for good.",
           scale_fraction=1 / 3, window_ms=60_000, convergence_bound_ms=_HOLD + 30_000),
        # -- seed 000's case studies ------------------------------------------------------------------
        _s("worker-joins",
           "Seed 000 'W2 joins the Group': one new worker joins a stable group.",
           joins=1, window_ms=5_000, convergence_bound_ms=30_000),
        _s("worker-leaves",
           "Seed 000 'Worker Leaving the Group': a worker stops heartbeating for good; it is "
           "removed at its session timeout and its work is reassigned (after the delay).",
           crashes=1, crash_restart_ms=None, window_ms=5_000, convergence_bound_ms=_HOLD + 30_000),
        _s("worker-bounces",
           "Seed 000 'Worker Bounces': a worker becomes unresponsive, is removed at its session "
           "timeout and comes back with the same member id before the delay expires.",
           crashes=1, crash_restart_ms=(12_000, 20_000), window_ms=5_000,
           convergence_bound_ms=_HOLD + 30_000),
        # -- single faults -------------------------------------------------------------------------
        _s("gc-pause",
           "A worker stops the world longer than the session timeout (a GC pause): it is removed "
           "while its tasks are frozen, and must fence itself when it wakes up.",
           pauses=1, pause_ms=(12_000, 20_000), window_ms=10_000,
           convergence_bound_ms=_HOLD + 30_000),
        _s("frozen-writer",
           "A worker is frozen (SIGSTOP) in the middle of a write to a task's resource, longer "
           "than its session, the hold and the incremental assignor's delay: another worker "
           "takes its items and writes with higher fencing tokens; when it wakes its write "
           "commits late and is refused by the token, its commits are fenced.",
           pauses=1, pause_ms=(35_000, 45_000), pause_mid_write=True, window_ms=10_000,
           convergence_bound_ms=_HOLD + 30_000),
        _s("network-partition",
           "A worker is cut off from the coordinator for 2-8 s (shorter than the session timeout): "
           "its messages are delayed until the partition heals.",
           partitions=2, partition_ms=(2_000, 8_000), window_ms=20_000,
           convergence_bound_ms=_HOLD + 60_000),
        _s("long-partition",
           "A worker is cut off from the coordinator for longer than the session timeout: it "
           "fences itself, the coordinator expires it, then it rejoins.",
           partitions=1, partition_ms=(12_000, 25_000), window_ms=10_000,
           convergence_bound_ms=_HOLD + 60_000),
        _s("coordinator-restart",
           "The coordinator process restarts (twice): uncommitted writes are lost, the state is "
           "rebuilt by replaying its log, every member gets a fresh session.",
           coordinator_restarts=2, bounces=1, window_ms=30_000, convergence_bound_ms=_HOLD + 60_000),
        # -- several coordinator nodes --------------------------------------------------
        _s("coordinator-handover",
           "Three coordinator nodes on etcd: the group's partition moves to another node three "
           "times (graceful handover: NOT_COORDINATOR, rediscovery, the next owner loads the "
           "records at once and restarts every session clock) while a worker bounces.",
           nodes=3, partition_moves=3, bounces=1, window_ms=30_000,
           convergence_bound_ms=_HOLD + 60_000, tags=("nodes",)),
        _s("coordinator-failover",
           "Three coordinator nodes: the owner is killed (kill -9) twice; nothing answers until its "
           "5 s lease expires, then another node loads the partition; a worker joins meanwhile.",
           nodes=3, owner_failovers=2, joins=1, window_ms=40_000,
           convergence_bound_ms=_HOLD + 60_000, tags=("nodes",)),
        _s("coordinator-isolated",
           "Three coordinator nodes: the owner's host becomes unreachable (no RST: the workers' "
           "connections hang until their requests time out), and later the owner of the day is cut "
           "off from etcd for 2-12 s (it must stop answering before its lease can expire; its "
           "writes wait for etcd and are then fenced); a worker joins meanwhile.",
           nodes=3, owner_hosts_lost=1, owner_etcd_cuts=1, joins=1, window_ms=40_000,
           convergence_bound_ms=_HOLD + 60_000, tags=("nodes",)),
        _s("deposed-owner",
           "Three coordinator nodes: the owner is frozen (SIGSTOP) for 6-25 s, past its 5 s lease, "
           "with a write in flight (a worker joins then); another node takes over; when it wakes "
           "its write is refused by the fence and it answers nothing for the partition. Later the "
           "owner of the day is frozen while idle; connections drop and the partition moves once "
           "meanwhile.",
           nodes=3, deposed_writes=1, deposed_idle=1, conn_drops=3, partition_moves=1, window_ms=40_000,
           convergence_bound_ms=_HOLD + 60_000, tags=("nodes",)),
        _s("deposed-owner-short",
           "Three coordinator nodes: the owner is frozen (SIGSTOP) while idle for 6-8 s, just past "
           "its 5 s lease and shorter than the workers' sessions: they must give up its hanging "
           "connections and find the new owner in time; when it wakes it must answer "
           "NOT_COORDINATOR (its lease is no longer certain), not from its stale state; a worker "
           "joins meanwhile.",
           nodes=3, deposed_idle=1, deposed_freeze_ms=(6_000, 8_000), joins=1, window_ms=40_000,
           convergence_bound_ms=_HOLD + 60_000, tags=("nodes",)),
        _s("etcd-leader-loss",
           "Three coordinator nodes, 2 s leases: etcd loses its leader three times for an "
           "election of 1-2.5 s (the owner's lease goes in doubt: it answers nothing, then serves "
           "the same state again once the new leader renews the same lease), and once etcd is "
           "unreachable for 2.5-5 s while its leader keeps its role (the lease is revoked: the "
           "owner learns it and another node loads the partition); a worker joins meanwhile.",
           nodes=3, lease_ttl_ms=2_000, etcd_leader_losses=3, etcd_lease_revokes=1, joins=1,
           window_ms=40_000, convergence_bound_ms=_HOLD + 60_000, tags=("nodes",)),
        _s("coordinator-upgrade",
           "Two rounds of restarts of the three coordinator nodes (SIGTERM, back 1-5 s later, one "
           "after another): the owner hands the partition over as it stops, a node that comes "
           "back may take it (a handover to it): several handovers in a row.",
           nodes=3, node_restarts=2, convergence_bound_ms=_HOLD + 60_000, tags=("nodes",)),
        _s("lossy-network",
           "1% of the messages are lost (their connection resets) and connections drop: lost "
           "responses, resent full heartbeats, reconnects with backoff.",
           loss=0.01, conn_drops=5, joins=1, window_ms=30_000, convergence_bound_ms=_HOLD + 60_000),
        _s("log-failures",
           "The coordinator's log fails 5% of appends and fsyncs: handlers are rolled back and the "
           "requests answered COORDINATOR_NOT_AVAILABLE.",
           append_fail=0.05, fsync_fail=0.05, bounces=1, joins=1, window_ms=30_000,
           convergence_bound_ms=_HOLD + 60_000),
        _s("slow-revocation",
           "A worker's revocations take longer than the rebalance timeout (past its stop budget: "
           "it fail-stops and is restarted) while a worker joins.",
           slow_revocations=1, joins=1, rebalance_timeout_ms=30_000, window_ms=20_000,
           convergence_bound_ms=_HOLD + 60_000),
        _s("connector-changes",
           "Connectors are added, deleted and resized during rebalances (a worker joins and one "
           "bounces meanwhile).",
           connector_changes=6, joins=1, bounces=1, window_ms=20_000,
           convergence_bound_ms=_HOLD + 30_000),
        _s("slow-shutdown",
           "A worker is bounced while stopping its work takes longer than the session timeout "
           "(stops take 2/3 to all of the stop budget, half the rebalance timeout: 10-15 s).",
           slow_bounces=1, rebalance_timeout_ms=30_000, window_ms=10_000,
           convergence_bound_ms=_HOLD + 60_000),
        # -- plugins that misbehave on stop (the fail-stop rule) -----------------------
        *(_s(name,
             f"A worker's plugins misbehave on stop for 20 s: {how}. Meanwhile a worker joins, "
             "one bounces and one is cut off for 2-15 s (self-fencing with stops that misbehave).",
             bad_stops=1, bad_stop=mode, joins=1, bounces=1, partitions=1,
             partition_ms=(2_000, 15_000), window_ms=20_000, convergence_bound_ms=_HOLD + 60_000,
             tags=("bad-stop",))
          for name, mode, how in (
              ("slow-stop", "slow_stop", "stops take 0.9-1.3x the stop budget; one past it "
               "ends the process (fail-stop), which its supervisor restarts 1-5 s later"),
              ("hanging-stop", "hanging_stop", "stop() never returns: the process ends at the "
               "stop budget (fail-stop) and is restarted"),
              ("raising-stop", "raising_stop", "stop() raises at once, which counts as stopped "
               "(the plugin's contract): no fail-stop"),
              ("stop-ignores-cancel", "ignores_cancel", "stop() returns but run() ignores the "
               "cancellation: the instance never ends, so the process does at the budget"),
          )),
        # -- soak ---------------------------------------------------------------------------------------
        _s("random-faults",
           "Soak: a random mix of crashes (quick and slow restarts), bounces, GC pauses, short "
           "partitions, dropped connections, lost messages, log failures, coordinator restarts, "
           "slow revocations, joins and connector changes.",
           crashes=1, crash_restart_ms=(500, 25_000), bounces=2, pauses=1, pause_ms=(2_000, 20_000),
           partitions=1, partition_ms=(1_000, 8_000), conn_drops=3, coordinator_restarts=1,
           slow_revocations=1, connector_changes=2, joins=1, loss=0.002, append_fail=0.01,
           fsync_fail=0.01, window_ms=60_000, convergence_bound_ms=_HOLD + 60_000,
           tags=("soak",)),
    )
}
SCENARIOS.update({
    s.name: s for s in (
        SCENARIOS["random-faults"].with_(
            name="random-faults-static", identity="static",
            description="The soak with static members (instance ids, -2 on a graceful stop)."),
        SCENARIOS["random-faults"].with_(
            name="random-faults-generated", identity="generated",
            description="The soak with member ids generated by the coordinator (a new one per process)."),
        SCENARIOS["random-faults"].with_(
            name="random-faults-nodes", nodes=3, coordinator_restarts=0, partition_moves=1,
            owner_failovers=1, deposed_writes=1, etcd_leader_losses=1, tags=("soak", "nodes"),
            description="The soak on three coordinator nodes: a handover, an owner killed, an "
                        "owner frozen past its lease with a write in flight and an etcd leader "
                        "election instead of the coordinator restart."),
    )
})
SCENARIOS.update({
    s.name: s for s in (
        # -- classic workers (Kafka Connect's worker protocol) and online migration -----------------
        _s("classic-group",
           "A group of classic workers only (Kafka Connect's JoinGroup/SyncGroup protocol; the "
           "coordinator computes the target itself): crashes, a bounce, a worker joining, "
           "connector changes.",
           classic="all", crashes=1, crash_restart_ms=(500, 5_000), bounces=1, joins=1,
           connector_changes=2, convergence_bound_ms=_HOLD + 30_000, tags=("classic",)),
        _s("classic-long-partition",
           "Classic workers only, one cut off for 12-25 s (longer than its session): it must stop "
           "its work by its session's end plus half its rebalance timeout, when the coordinator "
           "hands its items on.",
           classic="all", partitions=1, partition_ms=(12_000, 25_000),
           convergence_bound_ms=_HOLD + 30_000, tags=("classic",)),
        _s("classic-mixed",
           "Half the workers classic, half new-protocol (the new-protocol ones compute): "
           "crashes, a partition, a pause, dropped connections, a coordinator restart, a join "
           "and a leave, connector changes.",
           classic="half", crashes=1, crash_restart_ms=(500, 5_000), partitions=1,
           partition_ms=(2_000, 20_000), pauses=1, conn_drops=2, coordinator_restarts=1,
           joins=1, leaves=1, connector_changes=2, window_ms=40_000,
           convergence_bound_ms=_HOLD + 60_000, tags=("classic",)),
        _s("classic-mixed-protocols",
           "Classic workers only, their connect.protocol by slot (sessioned, default, "
           "compatible): a rolling bounce, a partition, connector changes.",
           classic="all", classic_protocol="mixed", rolling=True, bounce_down_ms=(1_000, 4_000),
           max_faulted=5, partitions=1, connector_changes=2,
           convergence_bound_ms=_HOLD + 60_000, tags=("classic",)),
        _s("migrate-to-new",
           "Online migration classic -> new: every classic worker (up to max_faulted) is stopped "
           "gracefully (stop, LeaveGroup) and replaced by a new-protocol worker, one at a time, "
           "under load (connector changes).",
           classic="all", migrate="to_new", rolling=True, bounce_down_ms=(1_000, 4_000),
           max_faulted=5, connector_changes=2, convergence_bound_ms=_HOLD + 30_000,
           tags=("classic",)),
        _s("migrate-to-classic",
           "Online migration new -> classic, one worker at a time, under load.",
           classic="none", migrate="to_classic", rolling=True, bounce_down_ms=(1_000, 4_000),
           max_faulted=5, connector_changes=2, convergence_bound_ms=_HOLD + 30_000,
           tags=("classic",)),
        _s("migrate-to-new-static",
           "Classic -> new with static members: each classic worker stops (no LeaveGroup) and "
           "a new-protocol process with its instance id replaces it.",
           classic="all", migrate="to_new", identity="static", rolling=True,
           bounce_down_ms=(1_000, 4_000), max_faulted=5, connector_changes=1,
           convergence_bound_ms=_HOLD + 30_000, tags=("classic",)),
        _s("migrate-to-classic-static",
           "New -> classic with static members: each new-protocol worker leaves with -2 and a "
           "classic process with its instance id replaces it.",
           classic="none", migrate="to_classic", identity="static", rolling=True,
           bounce_down_ms=(1_000, 4_000), max_faulted=5, connector_changes=1,
           convergence_bound_ms=_HOLD + 30_000, tags=("classic",)),
        _s("migrate-faults",
           "Classic -> new one worker at a time while workers crash, one is cut off, one pauses, "
           "connections drop and the coordinator restarts.",
           classic="all", migrate="to_new", rolling=True, bounce_down_ms=(1_000, 4_000),
           max_faulted=6, crashes=1, crash_restart_ms=(500, 5_000), partitions=1,
           partition_ms=(2_000, 20_000), pauses=1, conn_drops=2, coordinator_restarts=1,
           connector_changes=1, convergence_bound_ms=_HOLD + 60_000, tags=("classic",)),
        _s("migrate-back-faults",
           "New -> classic one worker at a time with the same faults.",
           classic="none", migrate="to_classic", rolling=True, bounce_down_ms=(1_000, 4_000),
           max_faulted=6, crashes=1, crash_restart_ms=(500, 5_000), partitions=1,
           partition_ms=(2_000, 20_000), pauses=1, conn_drops=2, coordinator_restarts=1,
           connector_changes=1, convergence_bound_ms=_HOLD + 60_000, tags=("classic",)),
        _s("migrate-nodes",
           "Classic -> new on three coordinator nodes: a handover and an owner killed "
           "mid-migration.",
           classic="all", migrate="to_new", rolling=True, bounce_down_ms=(1_000, 4_000),
           max_faulted=5, nodes=3, partition_moves=1, owner_failovers=1,
           convergence_bound_ms=_HOLD + 60_000, tags=("classic", "nodes")),
    )
})
