"""Group coordinator settings the state machine needs (KIP-848's names, adapted to connect)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

SESSION_TIMEOUT = "group.connect.session.timeout.ms"
HEARTBEAT_INTERVAL = "group.connect.heartbeat.interval.ms"
GROUP_SESSION_TIMEOUT = "connect.session.timeout.ms"
GROUP_HEARTBEAT_INTERVAL = "connect.heartbeat.interval.ms"
GROUP_OVERRIDES = (GROUP_SESSION_TIMEOUT, GROUP_HEARTBEAT_INTERVAL)
"""The dynamic group configs (DescribeConfigs / IncrementalAlterConfigs on resource type GROUP),
named as Kafka's consumer group configs (``consumer.session.timeout.ms``) with ``connect.``; the
daemon's setting of the same name with ``group.`` in front is each one's default."""
GROUP_CONFIG_DEFAULTS = {GROUP_SESSION_TIMEOUT: SESSION_TIMEOUT,
                         GROUP_HEARTBEAT_INTERVAL: HEARTBEAT_INTERVAL}
"""Each group config -> the daemon setting that is its default (its synonym)."""
GROUP_CONFIG_DOCS = {
    GROUP_SESSION_TIMEOUT: "The timeout to detect worker failures of this group: a member that "
                           "does not heartbeat within it is removed.",
    GROUP_HEARTBEAT_INTERVAL: "The heartbeat interval given to the members of this group.",
}
MAX_TASKS = "group.connect.max.tasks"
MAX_REBALANCE_TIMEOUT = "group.connect.max.rebalance.timeout.ms"
MAX_ASSIGNMENT_TIMEOUT = "group.connect.max.assignment.timeout.ms"
MAX_GROUPS = "group.max.groups"
MAX_COMMIT_BYTES = "group.connect.offsets.max.commit.bytes"
MAX_PARTITIONS = "group.connect.offsets.max.partitions"
MAX_OFFSET_BYTES = "group.connect.offsets.max.bytes"
MIGRATION_POLICY = "group.connect.migration.policy"
MIGRATION_POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")
CLASSIC_MAX_DELAY = "group.connect.classic.max.delay.ms"
DEFAULT_MAX_BATCH_BYTES = 8 * 1024 * 1024
"""The partition log's batch limit (``coordinator.runtime.log.DEFAULT_MAX_BATCH_BYTES``, which a
test keeps equal): no handler's records may take more, whatever the request."""
MAX_TASKS_CEILING = 1_000_000
"""The most items (connectors plus tasks) ``group.connect.max.tasks`` may allow a group. A log
record configuring more is refused on replay: no coordinator can have written it, and building
its items would take the memory of a corrupt length (2**31 tasks) before anything could check it."""


class ConfigError(ValueError):
    """A setting is out of its bounds or inconsistent with another."""


@dataclass(frozen=True)
class GroupCoordinatorConfig:
    session_timeout_ms: int = 10_000
    min_session_timeout_ms: int = 1_000
    max_session_timeout_ms: int = 300_000
    heartbeat_interval_ms: int = 3_000
    min_heartbeat_interval_ms: int = 100
    max_heartbeat_interval_ms: int = 60_000
    max_size: int = 1_000
    """``group.connect.max.size``: members per group; a join beyond it gets
    GROUP_MAX_SIZE_REACHED. Kafka leaves its consumer groups' bound unlimited; here every member
    costs memory for as long as it stays, and anyone allowed to READ a group may join it, so the
    default is finite: well above any Connect cluster's workers (hundreds), small enough that
    a full group of members describing themselves at the limit stays within tens of MB."""
    max_tasks: int = 100_000
    """``group.connect.max.tasks``: items (connectors plus their tasks) a group may configure."""
    empty_group_retention_ms: int = 7 * 24 * 3600 * 1000
    """A group with no members and no connectors is deleted after this long."""
    assignment_timeout_floor_ms: int = 1_000
    """The least time a chosen worker gets to compute an assignment."""
    max_rebalance_timeout_ms: int = 300_000
    """``group.connect.max.rebalance.timeout.ms``: the largest RebalanceTimeoutMs a member may
    declare (a larger one gets INVALID_REQUEST). It bounds how long a member's revocation is
    waited for and how long its items are held after it is fenced."""
    max_assignment_timeout_ms: int = 30_000
    """``group.connect.max.assignment.timeout.ms``: the longest a chosen member may take to
    compute a target assignment (its rebalance timeout, at most this); then it is not chosen
    again while it stays in the group, and another member is."""
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    """The log's batch limit: AlterConnectors refuses a group whose connectors record plus one
    assignment of all its items would not fit one batch (every later write of the group's
    items would fail)."""
    max_groups: int = 10_000
    """``group.max.groups``: groups the whole daemon may host (all partitions together)."""
    max_offset_commit_bytes: int = 1024 * 1024
    """``group.connect.offsets.max.commit.bytes``: the most bytes of partitions and offsets (their
    JSON text, UTF-8) one ConnectGroupCommitOffsets or ConnectGroupAlterOffsets may carry."""
    max_offset_bytes: int = 32 * 1024 * 1024
    """``group.connect.offsets.max.bytes``: the most bytes (UTF-8 of the canonical JSON) of source
    partitions and offsets one connector may keep; a commit that would keep more is refused."""
    max_offset_partitions: int = 100_000
    """``group.connect.offsets.max.partitions``: the most source partitions one connector may
    have offsets for; a commit that would add more is refused."""
    max_batch_records: int | None = None
    """The most records one write may carry (the etcd store's ``etcd.max.txn.ops``; None: no
    such bound, the file store's batch byte limit only). Offsets of deleted connectors are
    tombstoned in batches of at most this many (and at most ``OFFSET_DELETE_BATCH``)."""
    migration_policy: str = "bidirectional"
    """``group.connect.migration.policy``: which classic <-> new protocol moves of a non-empty
    group are allowed (``bidirectional``, ``upgrade``, ``downgrade``, ``disabled``; as Kafka's
    ``group.consumer.migration.policy``). An empty group takes members of either protocol."""
    classic_max_delay_ms: int = 300_000
    """``group.connect.classic.max.delay.ms``: when only classic members are in a group the
    coordinator computes its target itself with Kafka Connect's incremental cooperative
    assignor; this is that assignor's ``scheduled.rebalance.max.delay.ms`` (how long the work
    of a departed worker waits for it to come back)."""
    group_count: Callable[[], int] | None = field(default=None, compare=False, repr=False)
    """How many groups the daemon hosts now, all partitions together (the runtime passes a
    function summing its shards' group tables; every shard runs on one event loop and a
    handler runs without yielding, so the count cannot change between a check and the
    creation it allows). None: this coordinator's own groups only."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def bounded(name: str, value: int, low: int, high: int) -> None:
            if not low <= value <= high:
                raise ConfigError(f"{name}={value} must be within [{low}, {high}]")

        if self.min_session_timeout_ms <= 0 or self.min_heartbeat_interval_ms <= 0:
            raise ConfigError("minimum session timeout and heartbeat interval must be > 0")
        bounded(SESSION_TIMEOUT, self.session_timeout_ms,
                self.min_session_timeout_ms, self.max_session_timeout_ms)
        bounded(HEARTBEAT_INTERVAL, self.heartbeat_interval_ms,
                self.min_heartbeat_interval_ms, self.max_heartbeat_interval_ms)
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                f"{HEARTBEAT_INTERVAL}={self.heartbeat_interval_ms} must be smaller than "
                f"{SESSION_TIMEOUT}={self.session_timeout_ms}"
            )
        if self.max_rebalance_timeout_ms < 1:
            raise ConfigError(f"{MAX_REBALANCE_TIMEOUT} must be >= 1")
        if self.max_assignment_timeout_ms < self.assignment_timeout_floor_ms:
            raise ConfigError(f"{MAX_ASSIGNMENT_TIMEOUT} must be >= "
                              f"{self.assignment_timeout_floor_ms}")
        if self.max_size < 1:
            raise ConfigError("group.connect.max.size must be >= 1")
        bounded(MAX_TASKS, self.max_tasks, 1, MAX_TASKS_CEILING)
        if self.max_groups < 1:
            raise ConfigError(f"{MAX_GROUPS} must be >= 1")
        if self.max_batch_bytes < 1024:
            raise ConfigError("max_batch_bytes must be >= 1024")
        if self.max_offset_commit_bytes < 1:
            raise ConfigError(f"{MAX_COMMIT_BYTES} must be >= 1")
        if self.max_offset_partitions < 1:
            raise ConfigError(f"{MAX_PARTITIONS} must be >= 1")
        if self.max_batch_records is not None and self.max_batch_records < 2:
            raise ConfigError("max_batch_records must be >= 2")
        if self.migration_policy not in MIGRATION_POLICIES:
            raise ConfigError(f"{MIGRATION_POLICY}={self.migration_policy!r} must be one of "
                              f"{', '.join(MIGRATION_POLICIES)}")
        if self.classic_max_delay_ms < 0:
            raise ConfigError(f"{CLASSIC_MAX_DELAY} must be >= 0")
        if self.empty_group_retention_ms < 0:
            raise ConfigError("empty group retention must be >= 0")

    def for_group(self, overrides: dict[str, str | None]) -> tuple[int, int]:
        """(session timeout, heartbeat interval) for a group, overrides clamped to bounds (the
        daemon's bounds may have narrowed since an override was stored). Clamping may leave the
        session at or below the interval (a 5 s / 4 s pair under a 3 s maximum session), which
        would fence every member between two heartbeats: then the group gets the daemon's
        interval, or the daemon's own pair if its interval is not below that session either."""
        session, heartbeat = self._clamped(overrides)
        if session > heartbeat:
            return session, heartbeat
        if self.heartbeat_interval_ms < session:
            return session, self.heartbeat_interval_ms
        return self.session_timeout_ms, self.heartbeat_interval_ms

    def _clamped(self, overrides: dict[str, str | None]) -> tuple[int, int]:
        session = _int(overrides.get(GROUP_SESSION_TIMEOUT), self.session_timeout_ms)
        heartbeat = _int(overrides.get(GROUP_HEARTBEAT_INTERVAL), self.heartbeat_interval_ms)
        session = min(max(session, self.min_session_timeout_ms), self.max_session_timeout_ms)
        heartbeat = min(max(heartbeat, self.min_heartbeat_interval_ms),
                        self.max_heartbeat_interval_ms)
        return session, heartbeat

    def group_defaults(self) -> dict[str, int]:
        """Each group config's default: the daemon's setting."""
        return {GROUP_SESSION_TIMEOUT: self.session_timeout_ms,
                GROUP_HEARTBEAT_INTERVAL: self.heartbeat_interval_ms}

    def validate_overrides(self, overrides: dict[str, str | None],
                           current: dict[str, str | None] | None = None) -> str | None:
        """An error message if setting ``overrides`` (a value of None: back to the default) on
        a group whose overrides are ``current`` is invalid, else None. Kafka's checks and
        messages (``GroupConfig.validate``): a known name, an INT within the daemon's [min, max]
        (for the names set now: an override the daemon's bounds left behind is clamped where it
        is used, and does not block changing the other), the session timeout greater than the
        heartbeat interval as the group would have them."""
        for name, value in overrides.items():
            if name not in GROUP_OVERRIDES:
                return f"Unknown group config name: {name}"
            if value is None:
                continue
            if not _INT.fullmatch(value):
                return f"Invalid value {value} for configuration {name}: Not a number of type INT"
            number = int(value)
            if not -2**31 <= number < 2**31:  # (Kafka's INT: a Java int)
                return f"Invalid value {value} for configuration {name}: Not a number of type INT"
            low, high, setting = (
                (self.min_session_timeout_ms, self.max_session_timeout_ms, "session.timeout.ms")
                if name == GROUP_SESSION_TIMEOUT
                else (self.min_heartbeat_interval_ms, self.max_heartbeat_interval_ms,
                      "heartbeat.interval.ms"))
            if number < low:
                return (f"{name} must be greater than or equal to "
                        f"group.connect.min.{setting} ({low})")
            if number > high:
                return (f"{name} must be less than or equal to "
                        f"group.connect.max.{setting} ({high})")
        session, heartbeat = self._clamped({**(current or {}), **overrides})
        if session <= heartbeat:
            return (f"{GROUP_SESSION_TIMEOUT} ({session}) must be greater than "
                    f"{GROUP_HEARTBEAT_INTERVAL} ({heartbeat})")
        return None


_INT = re.compile(r"\s*[+-]?[0-9]{1,18}\s*")
"""An INT as Kafka's ConfigDef parses one (trimmed; no ``1_000`` as Python's int() takes)."""


def _int(value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        return default
