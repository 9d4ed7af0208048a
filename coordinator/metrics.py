"""Prometheus metrics of the daemon (prometheus-client), on their own registry.

KIP-848's coordinator metrics adapted (groups by type, partitions by state, event queue size,
event queue time and processing time, connect groups by state, rebalance rate/count, partition
load time, thread idle ratio) plus request count and latency per API and error, parked long-poll
heartbeats, log append/fsync latency and bytes, corruptions found at load, fences and session
expiries by reason, items held for fenced members, and members (in all, and per group for the
groups named in ``metrics.groups`` only: the number of series never grows with the number of
groups clients create).

Names pass ``promtool check metrics`` (tests/test_metrics_promtool.py): no gauge ends in
``_count`` (a histogram's or summary's suffix); the three that did were renamed
(docs/metrics.md, "Renamed").

Label children are bound once and cached (``labels()`` costs ~1.5 µs, a bound child's
``observe`` ~1 µs), so the hot path never formats labels. The per-request count and latency,
touched on every request, are plain integers in a dict and a bucket list, turned into a counter
and a histogram when Prometheus scrapes (prometheus-client's ``inc``/``observe`` take a lock
each: 4% of the daemon's time under a heartbeat load). Gauges that describe groups are
computed at scrape time too, not updated per heartbeat.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from connect_wire.errors import error_name
from coordinator.group.coordinator import FENCE_REASONS

NS = "connect_coordinator"
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GROUP_STATES = ("Empty", "Assigning", "Reconciling", "Stable", "Dead")


class GroupCollector(Collector):
    """Scrape-time gauges over the shards' groups.

    Cardinality is bounded whatever the number of groups (50,000 empty
    groups grew /metrics from 8 KB to 3 MB when every group had its own series): groups are
    counted by state and their members summed; per-group series exist only for the groups the
    operator names (``metrics.groups``), so the number of series is fixed by the configuration,
    never by what clients create.
    """

    def __init__(self, groups: Callable[[], Iterable[tuple[str, str, int]]],
                 watched: Iterable[str] = ()) -> None:
        self._groups = groups  # () -> (group id, state name, members)
        self._watched = frozenset(watched)

    def collect(self) -> Iterator[Any]:
        by_state = dict.fromkeys(GROUP_STATES, 0)
        watched = self._watched
        per_group = GaugeMetricFamily(
            f"{NS}_group_members", "Members of each group named in metrics.groups",
            labels=["group"])
        total = members = 0
        for group_id, state, count in self._groups():
            total += 1
            members += count
            by_state[state] = by_state.get(state, 0) + 1
            if group_id in watched:
                per_group.add_metric([group_id], count)
        groups = GaugeMetricFamily(f"{NS}_groups", "Groups by type", labels=["type"])
        groups.add_metric(["connect"], total)
        states = GaugeMetricFamily(f"{NS}_connect_groups", "Connect groups by state",
                                   labels=["state"])
        for state, count in by_state.items():
            states.add_metric([state], count)
        yield groups
        yield states
        yield GaugeMetricFamily(f"{NS}_members", "Members of all groups", value=members)
        if watched:
            yield per_group


class RequestCollector(Collector):
    """Requests answered (by API and error) and their latency (by API), kept as plain numbers
    by the event loop and exposed as ``connect_coordinator_requests_total`` and the histogram
    ``connect_coordinator_request_latency_seconds`` at scrape time."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        self.buckets: dict[str, list[int]] = {}  # per API: counts per bucket, then +Inf
        self.sums: dict[str, float] = {}

    def observe(self, api: str, error_code: int, seconds: float) -> None:
        key = (api, error_code)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        buckets = self.buckets.get(api)
        if buckets is None:
            buckets = self.buckets[api] = [0] * (len(LATENCY_BUCKETS) + 1)
            self.sums[api] = 0.0
        buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sums[api] += seconds

    def collect(self) -> Iterator[Any]:
        # Called from the metrics HTTP thread: copy first (list() of a dict runs in C, under
        # the GIL, so it never sees a dict changing size).
        requests = CounterMetricFamily(f"{NS}_requests", "Requests answered", labels=["api", "error"])
        for (api, code), n in list(self.counts.items()):
            requests.add_metric([api, error_name(code)], n)
        latency = HistogramMetricFamily(
            f"{NS}_request_latency_seconds", "Request latency (frame received to response written)",
            labels=["api"])
        sums = dict(self.sums)
        for api, per_bucket in list(self.buckets.items()):
            cumulative, total = [], 0
            for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), list(per_bucket), strict=True):
                total += n
                cumulative.append((bound, total))
            latency.add_metric([api], cumulative, sums.get(api, 0.0))
        yield requests
        yield latency


EVENT_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Event queue and processing times: most events take microseconds."""
SESSION_EXPIRY_REASONS = ("no_heartbeat", "static_leave")
"""Why a session expired: the member went silent, or it left as a static member (MemberEpoch
-2) and did not come back within its session timeout."""


class FastHistogram(Collector):
    """A histogram kept as plain numbers by the event loop (one ``bisect`` and two additions per
    observation, no lock) and exposed when scraped, as :class:`RequestCollector` does."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)  # per bucket, then +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def collect(self) -> Iterator[Any]:
        family = HistogramMetricFamily(self.name, self.documentation)
        cumulative, total = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), list(self.counts), strict=True):
            total += n
            cumulative.append((bound, total))
        family.add_metric([], cumulative, self.sum)
        yield family


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # (the attribute keeps its name; the series was connect_coordinator_partition_count)
        self.partition_count = Gauge(f"{NS}_partitions", "Partitions by state",
                                     ["state"], registry=r)
        self.event_queue_size = Gauge(f"{NS}_event_queue_size", "Events queued per partition",
                                      ["partition"], registry=r)
        # KIP-848's event-queue-time-ms and event-processing-time-ms, in seconds.
        self.event_queue_time = FastHistogram(
            f"{NS}_event_queue_time_seconds",
            "How long an event (request, timer expiry, long-poll re-check) waited in its "
            "partition's queue before it was processed", EVENT_BUCKETS)
        self.event_processing_time = FastHistogram(
            f"{NS}_event_processing_time_seconds",
            "How long processing an event took (the group state machine and the log append; "
            "the commit's fsync is connect_coordinator_log_fsync_seconds)", EVENT_BUCKETS)
        r.register(self.event_queue_time)
        r.register(self.event_processing_time)
        # Group events, counted as the shard logs them, once committed.
        fences = Counter(f"{NS}_member_fences",
                         "Members the coordinator removed, by reason (session_expired, "
                         "stale_member_epoch, rebalance_timeout); a member leaving is not one",
                         ["reason"], registry=r)
        self.fences = {reason: fences.labels(reason) for reason in FENCE_REASONS}
        expiries = Counter(f"{NS}_session_expiries",
                           "Member sessions that expired, by reason (no_heartbeat: the member "
                           "went silent; static_leave: a static member left with epoch -2 and "
                           "did not return in time)", ["reason"], registry=r)
        self.session_expiries = {reason: expiries.labels(reason)
                                 for reason in SESSION_EXPIRY_REASONS}
        self.held_items = Gauge(
            f"{NS}_held_items",
            "Connectors and tasks held for fenced members: owned by no live member, given to "
            "nobody until the hold ends", ["partition"], registry=r)
        self.rebalances = Counter(f"{NS}_rebalance", "Group epoch bumps (rebalances)",
                                  registry=r)
        self.partition_load_seconds = Histogram(
            f"{NS}_partition_load_seconds", "Time to load (replay) a partition",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300), registry=r)
        self.thread_idle_ratio = Gauge(f"{NS}_thread_idle_ratio",
                                       "Share of time a partition's event loop waited for events",
                                       ["partition"], registry=r)
        self.request_stats = RequestCollector()
        r.register(self.request_stats)
        self.request_done = self.request_stats.observe
        self.parked = Gauge(f"{NS}_heartbeat_parked", "Long-polled heartbeats parked now",
                            registry=r)
        self.log_append_seconds = Histogram(f"{NS}_log_append_seconds", "Log append latency",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.log_fsync_seconds = Histogram(f"{NS}_log_fsync_seconds", "Log fsync latency",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.log_bytes = Gauge(f"{NS}_log_bytes", "Bytes in the partition log", ["partition"],
                               registry=r)
        self.log_corruptions = Counter(f"{NS}_log_corruptions",
                                       "Corrupt or torn log tails truncated at load, and "
                                       "partitions failed at load (records missing below the "
                                       "recovery point, or refused by replay)",
                                       ["partition"], registry=r)
        self.partition_reloads = Counter(f"{NS}_partition_reloads",
                                         "Partition reloads after its log failed at run time",
                                         ["partition"], registry=r)
        self.per_partition = (self.event_queue_size, self.thread_idle_ratio, self.held_items,
                              self.log_bytes)
        """The gauges with a series per loaded partition (dropped with it: drop_partition)."""
        self.connections = Gauge(f"{NS}_connections", "Open client connections", registry=r)
        # Several nodes (store=etcd).
        self.partition_moves = Counter(
            f"{NS}_partition_moves",
            "Partitions this node acquired (loaded), released (graceful handover) or lost "
            "(deposed, lease lost)", ["kind"], registry=r)
        self.group_config_forwards = Counter(
            f"{NS}_group_config_forwards",
            "Group config resources (DescribeConfigs, IncrementalAlterConfigs) this node "
            "forwarded to the node owning the group: answered by it (ok) or not (failed)",
            ["outcome"], registry=r)
        self.etcd_lease_remaining = Gauge(
            f"{NS}_etcd_lease_remaining_seconds",
            "How long this node's etcd lease is certainly still valid (store=etcd; 0 without "
            "a lease)", registry=r)
        # Flow control; both computed when scraped.
        self.queued_request_bytes = Gauge(
            f"{NS}_queued_request_bytes",
            "Bytes of partial request frames and of requests received and not yet answered, "
            "all connections (bounded by queued.max.request.bytes)", registry=r)
        self.connections_read_paused = Gauge(
            f"{NS}_connections_read_paused",
            "Connections not being read now (in-flight limits, full write buffer or the "
            "queued.max.request.bytes budget)", registry=r)
        # The event loop's lag: how late a periodic probe's sleep returned.
        self.loop_lag = Gauge(f"{NS}_event_loop_lag_seconds",
                              "How late the event loop woke the last lag probe", registry=r)
        self.loop_lag_observed = Histogram(
            f"{NS}_event_loop_lag_observed_seconds", "Event loop lag, every probe",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r)
        # Security: SASL authentications and authorization denials.
        self.authentications = Counter(
            f"{NS}_authentications",
            "SASL authentications by mechanism and result (success | failure), "
            "re-authentications (KIP-368) counted with reauth=true", ["mechanism", "result", "reauth"],
            registry=r)
        self.sessions_expired = Counter(
            f"{NS}_sasl_sessions_expired",
            "Connections closed because their SASL session (connections.max.reauth.ms) ended "
            "without a re-authentication", registry=r)
        self.sasl_plain_refused = Counter(
            f"{NS}_sasl_plain_refused",
            "PLAIN authentications not attempted because too many password derivations were "
            "in progress (running or waiting): the connection was closed unanswered, for the "
            "client to retry", registry=r)
        self.authorization_denied = Counter(
            f"{NS}_authorization_denied",
            "Requests (or items of a request) refused by the authorizer, by API and resource type",
            ["api", "resource_type"], registry=r)
        for state in ("loading", "active", "failed", "unowned"):
            self.partition_count.labels(state).set(0)

    def drop_partition(self, partition: int) -> None:
        """Remove a partition's per-partition gauge series: the node no longer holds it (a sum
        over the nodes, e.g. of log bytes against etcd's quota, counts each partition once)."""
        for gauge in self.per_partition:
            with contextlib.suppress(KeyError):
                gauge.remove(str(partition))

    def register_groups(self, groups: Callable[[], Iterable[tuple[str, str, int]]],
                        watched: Iterable[str] = ()) -> None:
        """Group gauges computed at scrape time; per-group series only for ``watched``."""
        self.registry.register(GroupCollector(groups, watched))

    # request_done(api, error_code, seconds): bound to RequestCollector.observe in __init__.
