"""Prometheus metrics of a worker: membership state, epoch, what it runs, rebalance latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from connect_wire.items import Item

NS = "connect_worker"
STATES = ("unjoined", "joining", "reconciling", "stable", "leaving", "left", "failed")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        state = Gauge(f"{NS}_state", "1 for the worker's current membership state", ["state"], registry=r)
        self._state = {s: state.labels(s) for s in STATES}
        self.epoch = Gauge(f"{NS}_member_epoch", "The worker's member epoch", registry=r)
        owned = Gauge(f"{NS}_owned", "Connectors and tasks the worker owns", ["kind"], registry=r)
        self._owned_connectors = owned.labels("connector")
        self._owned_tasks = owned.labels("task")
        self.running = Gauge(f"{NS}_running_instances", "Plugin instances started and running",
                             registry=r)
        self.rebalance_seconds = Histogram(
            f"{NS}_rebalance_seconds", "From the first revoke/assign of a rebalance to stable",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300), registry=r)
        self.assign_seconds = Histogram(f"{NS}_assignor_seconds", "Time to compute an assignment",
                                        buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5), registry=r)
        self.failures = Counter(f"{NS}_instance_failures", "Plugin instances that failed or "
                                "did not stop in time", registry=r)
        self.lost = Counter(f"{NS}_lost", "Times the worker lost all its work (fenced)", registry=r)
        self.commits = Counter(f"{NS}_offset_commits", "Offset commits the coordinator stored",
                               registry=r)
        self.stale_resends = Counter(
            f"{NS}_stale_epoch_resends", "Writes fenced by the member epoch (offsets, task "
            "configs) sent again after STALE_MEMBER_EPOCH, once a heartbeat brought the newer epoch",
            registry=r)
        self.heartbeat_gap = Histogram(
            f"{NS}_heartbeat_gap_seconds", "Time between the sends of two consecutive answered "
            "heartbeats: each renews the session lease, which ends a session timeout after the "
            "last one, so a gap near the session timeout means the worker nearly lost its work",
            buckets=(0.1, 0.5, 1, 2, 3, 3.5, 4, 5, 6, 8, 10, 15, 30, 60), registry=r)
        self.heartbeat_last_gap = Gauge(f"{NS}_heartbeat_last_gap_seconds",
                                        "The latest of connect_worker_heartbeat_gap_seconds",
                                        registry=r)
        self.fenced_writes = Counter(f"{NS}_fenced_writes", "Writes fenced by the member epoch "
                                     "refused (FencedError)", registry=r)

    def heartbeat_answered(self, gap_s: float) -> None:
        self.heartbeat_gap.observe(gap_s)
        self.heartbeat_last_gap.set(gap_s)

    def observe(self, state: str, epoch: int, owned: frozenset[Item]) -> None:
        for name, child in self._state.items():
            child.set(1 if name == state else 0)
        self.epoch.set(epoch)
        connectors = sum(1 for i in owned if i.is_connector)
        self._owned_connectors.set(connectors)
        self._owned_tasks.set(len(owned) - connectors)
