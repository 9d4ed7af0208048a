"""The deterministic simulation's event loop and its run: the real coordinator core and the real
worker membership state machines and assignors, driven by a virtual clock, with a simulated
network, log and faults.

Theory of operation
-------------------
* **One event queue, one clock** (this module). Everything that happens is an event
  ``(time, sequence, fn)`` in one heap; time is virtual milliseconds. Every random choice comes
  from a ``random.Random`` seeded from the run's seed (one stream per concern: network, work
  durations, faults, coordinator, client backoff), nothing iterates a set in hash order and no
  wall clock is read, so one seed is one run, in any process. A run forms the group, injects
  the scenario's faults, then waits for it to converge again.
* **The coordinator** (:mod:`simulation.nodes`): a model of ``coordinator/runtime/shard.py``
  around the real :class:`~coordinator.group.coordinator.GroupCoordinator`, its store and,
  with several nodes, etcd's leases and the nodes' processes.
* **Workers** (:mod:`simulation.worker_model`): a model of ``worker_client/worker.py`` around
  the real :class:`~worker_client.membership.Membership`, with the fail-stop rule.
* **The network** (:mod:`simulation.network`) keeps per-connection FIFO order; latencies are
  sampled per message, so messages on different connections reorder; loss resets a connection;
  a partition delays a worker's messages until it heals. A paused worker (stop-the-world)
  handles nothing until it wakes, then its buffered input first, then its due timers
  (asyncio's order).
* **Faults** (:mod:`simulation.faults`): what each fault of a scenario
  (:mod:`simulation.scenarios`) does.
* **Invariants** (:mod:`simulation.invariants`) are checked as the run goes (see
  docs/simulation.md); the first violation stops the run.

:class:`Simulation` is this module's event loop with the network, the nodes' cluster, the
invariants and the faults mixed in (each from its module), so that every part reaches the
others' state through one object, as one process would.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connect_wire.errors import ErrorCode as E
from connect_wire.items import CONNECTOR, Item
from connect_wire.messages import ConnectGroupAlterConnectorsRequest
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from coordinator.group.coordinator import GroupCoordinator
from coordinator.group.model import CurrentAssignment

from .common import GROUP, INF, WATCHDOG_MS
from .faults import Faults
from .invariants import Invariants, ItemStat, Ledger, Overlap, Run
from .network import Conn, Network, Pending
from .nodes import Cluster, CoordinatorNode, Store
from .scenarios import Fault, Scenario
from .worker_model import RETRY_COORDINATOR, SimWorker

FORMATION_BOUND_MS = 120_000


@dataclass
class RunResult:
    metrics: dict[str, object]
    events: list[dict[str, object]] = field(default_factory=list)
    extra: dict[str, object] = field(default_factory=dict)
    """Numbers outside the metrics contract: zombie_ms (double running excused because the old
    holder was frozen, see docs/simulation.md), heartbeats, computations, coordinator batches."""


class Simulation(Network, Cluster, Invariants, Faults):
    """One run: the event queue and the clock, the actors (coordinator nodes, workers, the
    admin), the phases (formation, faults, converging) and the result. Its other parts are
    mixed in: :class:`~simulation.network.Network`, :class:`~simulation.nodes.Cluster`,
    :class:`~simulation.invariants.Invariants`, :class:`~simulation.faults.Faults`."""

    def __init__(self, scenario: Scenario, assignor: str, workers: int, tasks: int, seed: int,
                 trace: bool = False) -> None:
        if assignor not in ("eager", "incremental"):
            raise ValueError(f"unknown assignor {assignor!r} (eager, incremental)")
        if workers < 1 or tasks < 0:
            raise ValueError("workers must be >= 1 and tasks >= 0")
        self.scenario = scenario
        self.assignor = assignor
        self.n_workers = workers
        self.n_tasks = tasks
        self.seed = seed
        self.tracing = trace
        self.events: list[dict[str, object]] = []
        self.now = 0
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.rng_net = random.Random(f"{seed}/net")
        self.rng_work = random.Random(f"{seed}/work")
        self.rng_fault = random.Random(f"{seed}/faults")
        self.rng_coord = random.Random(f"{seed}/coordinator")
        self.rng_client = random.Random(f"{seed}/client")
        self.rng_supervisor = random.Random(f"{seed}/supervisor")
        """Restart delays of fail-stopped processes: a stream of its own, so that a fail-stop
        reshuffles nothing else."""
        self.rng_nodes = random.Random(f"{seed}/nodes")
        """Several coordinator nodes: etcd latencies, the next owner, the bootstrap order."""
        self.rng_offsets = random.Random(f"{seed}/offsets")
        """The instances' work: intervals, writes in flight, commit retries."""
        if scenario.offset_commits and not hasattr(GroupCoordinator, "commit_offsets"):
            self.scenario = scenario = scenario.with_(offset_commits=False)  # (a core without offsets)
        self.ledger = Ledger(tokens=hasattr(CurrentAssignment, "tokens"))
        """Ownership, fencing tokens and acknowledged offsets, as the simulator sees them."""
        self.commit_counts: dict[str, int] = dict.fromkeys(
            ("sent", "acknowledged", "retried", "retried_stale"), 0)
        """The workers' side of their commits (``fenced_<ERROR>``: FencedError raised)."""
        self.fail_stops = 0
        self.self_fences = 0
        self.faults_injected = 0
        self._ids = 0
        self._cids = 0
        self.violation = ""
        self.stopped = False
        # items
        self.configured: set[Item] = set()
        self.stats: dict[Item, ItemStat] = {}
        self.holders: dict[Item, list[Run]] = {}
        self.last_slot: dict[Item, int] = {}
        self.initial_slot: dict[Item, int] = {}
        self.overlaps: list[Overlap] = []
        # phases
        self.phase = "formation"
        self.phase_start = 0
        self.faults_end = INF
        self.deadline = FORMATION_BOUND_MS
        self.converged_at: int | None = None
        self.initial_epoch = 0
        # metrics
        self.messages = 0
        self.moved = 0
        self.downtime = 0
        self.longest = 0
        self.heartbeats = 0
        self.computations = 0
        self._blocker: SimWorker | None = None
        self._check_every = 1 if workers + tasks <= 2_000 else (workers + tasks) // 50
        self._writes = 0
        # coordinator nodes and the store
        self.multi = scenario.nodes > 1
        self.node_names = [f"n{i + 1}" for i in range(max(1, scenario.nodes))]
        self.node_alive = dict.fromkeys(self.node_names, True)
        self.node_frozen_until = dict.fromkeys(self.node_names, 0)
        self.node_host_lost = dict.fromkeys(self.node_names, False)
        self.node_etcd_cut_until = dict.fromkeys(self.node_names, 0)
        self.etcd_down_until = 0
        self.node_quiet: dict[str, tuple[int, int]] = {}
        """Per node, its last stretch without lease renewals (frozen or cut off from etcd): the
        last renewal's send before it and its end (FindCoordinator's answers, _lease_in_doubt)."""
        self.store = Store()
        self.acked: dict[Any, Any] = {}
        """With several nodes: what the owners committed (the store must hold exactly this)."""
        token = self.store.acquire(0, scenario.lease_ttl_ms)
        # actors
        self.coord = CoordinatorNode(self, self.node_names[0], token)
        self.instances = [self.coord]
        if self.multi:
            self.coord.start_lease()
            self.at(self.store.expires, self._lease_expiry, token, self.store.expires)
        self.workers: list[SimWorker] = [self.new_worker(i) for i in range(workers)]
        self.admin: SimWorker | None = None
        self.zombie_grace = WATCHDOG_MS + 2 * scenario.latency_ms[1] + 1
        """A frozen worker must begin stopping what it may no longer run this soon after it
        wakes: one watchdog period plus a round trip (the stale answer it finds first)."""

    # -- event queue ----------------------------------------------------------------------------------
    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        if t < self.now:
            raise AssertionError(f"an event scheduled in the past (t={t} < now={self.now}): {fn}")
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def sample(self, rng: random.Random, r: tuple[int, int]) -> int:
        return r[0] + int((r[1] - r[0]) * rng.random() ** 2)

    def generated_id(self) -> str:
        self._ids += 1
        return f"gen-{self._ids:05d}"

    def faulty(self) -> bool:
        return self.phase == "faults"

    def trace(self, kind: str, worker: str = "", item: str = "", epoch: int = -1, detail: str = "") -> None:
        if self.tracing:
            self.events.append({"t_ms": self.now, "kind": kind, "worker": worker, "item": item,
                                "epoch": epoch, "detail": detail})

    def violate(self, message: str) -> None:
        if not self.violation:
            self.violation = message
            self.trace("violation", detail=message)
        self.stopped = True

    # -- the admin (connectors) ----------------------------------------------------------------------
    def _connectors_request(self, upserts: dict[str, int], deletes: tuple[str, ...] = ()) -> Any:
        return ConnectGroupAlterConnectorsRequest(
            group_id=GROUP, validate_only=False, deletes=deletes,
            upserts=tuple(_alter.ConnectorSpec(name=n, task_count=c, config=())
                          for n, c in sorted(upserts.items())))

    def _admin_send(self, req: Any, attempt: int = 0) -> None:
        if self.stopped:
            return
        admin = self.admin
        if admin is None:
            admin = self.admin = SimWorker(self, 9_999)
            admin.name = "admin"
            admin.alive = True
            admin.inc = 1

        def ok(resp: Any) -> None:
            if self.multi and resp.error_code in RETRY_COORDINATOR:
                admin.invalidate()  # AdminSession finds the coordinator again
            if resp.error_code in (E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
                                   E.NOT_COORDINATOR):
                retry("retriable error")
            elif resp.error_code:
                self.trace("connectors_refused", "admin", detail=str(resp.error_code))

        def retry(why: str) -> None:
            self.at(self.now + 500, self._admin_send, req, attempt + 1)

        admin.send("ctl", req, ok, retry)

    def _change_connectors(self, what: str) -> None:
        g = self.coord.core.group(GROUP) if self.coord.core is not None else None
        names = sorted(g.connectors) if g is not None else []
        rng = self.rng_fault
        if what == "add" or not names:
            name = f"x{rng.randrange(10**6):06d}"
            count = rng.randint(1, self.scenario.tasks_per_connector)
            self._admin_send(self._connectors_request({name: count}))
        elif what == "delete":
            self._admin_send(self._connectors_request({}, (rng.choice(names),)))
        else:
            name = rng.choice(names)
            assert g is not None
            count = max(0, g.connectors[name].task_count + rng.choice((-3, -1, 1, 4)))
            self._admin_send(self._connectors_request({name: count}))

    # -- the run ----------------------------------------------------------------------------------------
    def _initial_connectors(self) -> dict[str, int]:
        per = max(1, self.scenario.tasks_per_connector)
        n = max(1, -(-self.n_tasks // per))
        out = {}
        left = self.n_tasks
        for i in range(n):
            out[f"c{i:05d}"] = min(per, left)
            left -= out[f"c{i:05d}"]
        return out

    def _loop(self, until: int) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap and not self.stopped:
            if heap[0][0] > until:
                break
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            if self.converged_at is not None and self.phase != "faults":
                break
        if not self.stopped and self.converged_at is None:
            self.now = max(self.now, until)

    def run(self) -> RunResult:
        started = time.perf_counter()
        sc = self.scenario
        self._admin_send(self._connectors_request(self._initial_connectors()))
        for w in self.workers:
            self.at(self.rng_fault.randrange(0, 100), w.start)
        # 1. formation: the group forms and converges.
        self._loop(FORMATION_BOUND_MS)
        if not self.stopped and self.converged_at is None:
            self.violate(f"the initial group did not converge within {FORMATION_BOUND_MS} ms")
        if not self.stopped:
            self._start_faults()
            self._loop(INF)
            if not self.stopped and self.converged_at is None:
                self.violate(f"did not converge within {sc.convergence_bound_ms} ms after the faults ended")
        if not self.violation:
            self.check_store("at the end of the run")
        return self._result(time.perf_counter() - started)

    def _start_faults(self) -> None:
        sc = self.scenario
        g = self.coord.core.group(GROUP)
        self.phase = "faults"
        self.phase_start = self.now
        self.initial_epoch = g.epoch if g is not None else 0
        self.converged_at = None
        self.messages = 0
        self.heartbeats = 0
        self.computations = 0
        self.initial_slot = dict(self.last_slot)
        for stat in self.stats.values():
            if stat.down_since is not None:
                stat.down_since = self.now
        faults, end = sc.schedule(self.rng_fault, self.n_workers)
        for f in faults:
            self.at(self.now + f.at_ms, self.inject, f)
        self.faults_end = self.now + end
        self.at(self.faults_end, self._faults_over)
        self.at(self.faults_end + sc.convergence_bound_ms, self._give_up)
        self.trace("faults_begin", detail=f"{len(faults)} faults, last ends at +{end} ms")

    def _faults_over(self) -> None:
        self.phase = "converging"
        self.trace("faults_end")
        c = self.coord
        # Not while a batch waits for etcd (a lease in doubt): its state is not committed yet
        # and may never be (refused if the lease is gone), so it is no baseline for the epochs.
        if c.up and not c.loading and c.owner and not c.frozen and not c.busy and not c.in_doubt:
            self._check_core(c)
        self.maybe_converged()

    def _give_up(self) -> None:
        if self.converged_at is None:
            self.violate(f"did not converge within {self.scenario.convergence_bound_ms} ms after the "
                         "faults ended")
        self.stopped = True

    # -- results ----------------------------------------------------------------------------------------
    def _moved_min(self) -> int:
        """The fewest moves from the placement when the faults began to any placement over the
        workers alive at the end that balances connectors and tasks (each floor or ceil)."""
        final = sorted(w.slot for w in self.workers if w.alive and not w.leaving)
        if not final:
            return 0
        total = 0
        alive = set(final)
        for want_connectors in (True, False):
            counts = dict.fromkeys(final, 0)
            n = 0
            for item in self.configured:
                if (item.task == CONNECTOR) != want_connectors:
                    continue
                n += 1
                slot = self.initial_slot.get(item)
                if slot is None:
                    continue
                if slot in alive:
                    counts[slot] += 1
                else:
                    total += 1  # its worker is gone: it must move
            q, r = divmod(n, len(final))
            ordered = sorted(counts.values(), reverse=True)
            for k, c in enumerate(ordered):
                cap = q + 1 if k < r else q
                total += max(0, c - cap)
        return total

    def _result(self, wall_s: float) -> RunResult:
        now = self.now
        end_time = now
        for stat in self.stats.values():
            self._settle(stat, end_time)
            if stat.down_since is not None:
                self._outage(stat.down_since, end_time)
                stat.down_since = end_time
        double = 0
        zombie = 0
        for ov in self.overlaps:
            if ov.excused:
                zombie += ov.length(now)
            else:
                double += max(1, ov.length(now))
        g = self.coord.core.group(GROUP) if self.coord.core is not None else None
        converged = self.converged_at is not None and not self.violation
        metrics: dict[str, object] = {
            "scenario": self.scenario.name,
            "assignor": self.assignor,
            "workers": self.n_workers,
            "tasks": self.n_tasks,
            "seed": self.seed,
            "converged": converged,
            "convergence_ms": (max(0, self.converged_at - self.faults_end)
                               if converged and self.converged_at is not None else -1),
            "rebalances": (g.epoch - self.initial_epoch
                           if g is not None and self.phase != "formation" else 0),
            "moved": self.moved,
            "moved_min": self._moved_min() if self.phase != "formation" else 0,
            "downtime_ms": self.downtime,
            "longest_outage_ms": self.longest,
            "double_running_ms": double,
            "messages": self.messages,
            "violation": self.violation,
            "sim_ms": now,
            "wall_ms": round(wall_s * 1000, 3),
        }
        extra: dict[str, object] = {
            "zombie_ms": zombie, "fail_stops": self.fail_stops, "self_fences": self.self_fences,
            "heartbeats": self.heartbeats,
            "computations": self.computations,
            "coordinator_batches": sum(c.batches for c in self.instances),
            "phase_start_ms": self.phase_start,
            "faults_end_ms": self.faults_end if self.faults_end < INF else -1,
            "faults": self.faults_injected,
            **self.ledger.counts,
            **{f"commits_{k}": v for k, v in sorted(self.commit_counts.items())},
        }
        return RunResult(metrics, self.events, extra)


__all__ = [
    "FORMATION_BOUND_MS", "Conn", "CoordinatorNode", "Fault", "ItemStat", "Overlap", "Pending", "Run",
    "RunResult", "Scenario", "SimWorker", "Simulation", "Store",
]
