"""Fault injection: what each kind of :class:`~simulation.scenarios.Fault` does to the run.

The scenario (simulation/scenarios.py) says when and what; :meth:`Faults.inject` does it:
worker crashes, bounces, leaves, pauses, partitions, dropped connections, slow or misbehaving
stops, connector changes, a coordinator restart, and the node faults (a partition move, an
owner's failover, a deposed owner's late write, a node restart, etcd losing its leader),
whose mechanics live in :mod:`simulation.nodes`.
"""

from __future__ import annotations

from typing import Any

from .classic_worker import ClassicWorker
from .scenarios import DEPOSED_ARM_MS, PAUSE_ARM_MS, Fault
from .worker_model import SimWorker


class Faults:
    """The part of :class:`~simulation.engine.Simulation` that carries out a scenario's
    faults (:meth:`inject`) on the workers, the coordinator and the nodes."""

    # -- workers ------------------------------------------------------------------------------------
    def worker(self, slot: int) -> SimWorker:
        while slot >= len(self.workers):
            self.workers.append(self.new_worker(len(self.workers)))
        return self.workers[slot]

    def new_worker(self, slot: int) -> SimWorker:
        """The worker of ``slot``: a classic-capable one when the scenario has classic workers."""
        sc = self.scenario
        if not sc.classic:
            return SimWorker(self, slot)
        w = ClassicWorker(self, slot, self.classic_protocol(slot) if (
            sc.classic == "all" or (sc.classic == "half" and slot % 2 == 0)) else None)
        if sc.migrate == "to_new":
            w.switch_to = None
        elif sc.migrate == "to_classic":
            w.switch_to = self.classic_protocol(slot)
        return w

    def classic_protocol(self, slot: int) -> str:
        p = self.scenario.classic_protocol
        if p == "auto":
            return "default" if self.assignor == "eager" else "sessioned"
        if p == "mixed":
            return ("sessioned", "default", "compatible")[slot % 3]
        return p

    def restart_worker(self, w: SimWorker) -> None:
        if not w.alive and not self.stopped:
            w.start()

    def inject(self, fault: Fault) -> None:
        kind = fault.kind
        self.faults_injected += 1
        self.trace("fault", self.workers[fault.slot].name if 0 <= fault.slot < len(self.workers) else "",
                   detail=f"{kind} {fault.duration_ms} ms {fault.detail}".strip())
        if kind == "coordinator_restart":
            if self.coord.up:
                self.coord.crash()
                self.at(self.now + fault.duration_ms, self._coordinator_back)
            return
        if kind == "connectors":
            self._change_connectors(fault.detail)
            return
        if kind == "etcd_leader_loss":
            if self.multi:
                self._etcd_leader_loss(fault.duration_ms, fault.detail == "revoke")
            return
        if kind in ("partition_move", "owner_failover", "deposed_late_write", "node_restart"):
            self._node_fault(fault)
            return
        w = self.worker(fault.slot)
        if kind == "join":
            if not w.alive:
                w.start()
            return
        if not w.alive:
            return
        if kind == "crash":
            w.crash()
            if fault.duration_ms >= 0:
                self.at(self.now + fault.duration_ms, self.restart_worker, w)
        elif kind == "bounce":
            w.graceful_stop(restart_after=fault.duration_ms)
        elif kind == "slow_bounce":
            w.slow_until = self.now + 10 * self.scenario.rebalance_timeout_ms
            w.stop_mode = "long"
            w.graceful_stop(restart_after=fault.duration_ms)
        elif kind == "leave":
            w.graceful_stop(restart_after=None)
        elif kind == "pause" and fault.detail == "mid_write":  # at its next write's beginning
            w.pause_on_write = fault.duration_ms
            self.at(self.now + PAUSE_ARM_MS, w.pause_anyway)
        elif kind == "pause":
            w.pause(fault.duration_ms)
        elif kind == "partition":
            w.part_start = self.now
            w.part_end = self.now + fault.duration_ms
        elif kind == "drop":
            for conn in list(w.conns.values()):
                if conn is not None:
                    self.reset_conn(conn, "connection dropped")
        elif kind == "slow_revocation":
            w.slow_until = self.now + fault.duration_ms
            w.stop_mode = "slow"
        elif kind == "bad_stops":  # a plugin that misbehaves on stop (STOP_MODES), for a while
            w.slow_until = self.now + fault.duration_ms
            w.stop_mode = fault.detail


    # -- coordinator nodes (several nodes; the mechanics are in simulation.nodes) -------------------
    def _node_fault(self, fault: Any) -> None:
        kind = fault.kind
        c = self.coord
        if not self.multi:
            return
        if kind == "node_restart":  # SIGTERM: the owner hands over first, then the process exits
            name, _, how = fault.detail.partition(" ")
            takes = how == "takes"
            if not self.node_alive[name]:
                return
            if c.node == name and c.hand_over(lambda: (self._exit_node(name, fault.duration_ms, takes),
                                                       self._next_owner(None, name))):
                return
            self._exit_node(name, fault.duration_ms, takes)
            return
        if not c.up or not c.owner or c.frozen:
            self.trace("fault_skipped", detail=f"{kind}: the partition has no serving owner now")
            return
        if kind == "partition_move":
            c.hand_over(lambda: self._next_owner(None, c.node))
        elif kind == "owner_failover" and fault.detail == "host":
            self._lose_host(c.node, fault.duration_ms + self.rng_nodes.randint(1_000, 5_000))
        elif kind == "owner_failover" and fault.detail == "etcd":
            self.trace("etcd_cut", detail=f"{c.node} cannot reach etcd for {fault.duration_ms} ms")
            self.node_etcd_cut_until[c.node] = self.now + fault.duration_ms
            self.node_quiet[c.node] = (c.lease_sent, self.now + fault.duration_ms)
        elif kind == "owner_failover":
            self._exit_node(c.node, fault.duration_ms + self.rng_nodes.randint(1_000, 5_000))
        elif kind == "deposed_late_write":
            if fault.detail == "write":
                c.freeze_armed = fault.duration_ms
                self.at(self.now + DEPOSED_ARM_MS, self._freeze_anyway, c)
            else:
                self.trace("owner_frozen", detail=f"{c.node} for {fault.duration_ms} ms (idle)")
                self.freeze_node(c.node, self.now + fault.duration_ms)

    # -- the coordinator (one node) -----------------------------------------------------------------
    def _coordinator_back(self) -> None:
        self.trace("coordinator_restart")
        self.coord.restart()

