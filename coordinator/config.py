"""The daemon's configuration: one table of settings, read from a TOML file, the environment
and command-line flags (in that order of precedence: flags win), validated at start.

Each setting has a dotted name (KIP-848's names adapted to ``group.connect.*``), a type, a
default and a description. The same table renders the configuration reference
(``python -m coordinator.config`` prints it as Markdown; docs/configuration.md is that output).

* TOML: top-level keys are the dotted names, quoted (``"group.connect.session.timeout.ms" =
  10000``), or nested tables (``[group.connect] session.timeout.ms = 10000``) — both work.
* Environment: ``CONNECT_COORDINATOR_`` + the name upper-cased with dots and dashes as
  underscores, e.g. ``CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS=10000``.
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.group.config import MAX_TASKS_CEILING, ConfigError, GroupCoordinatorConfig
from coordinator.runtime.log import DEFAULT_MAX_BATCH_BYTES, FsyncPolicy
from coordinator.security import listeners, tls

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

ENV_PREFIX = "CONNECT_COORDINATOR_"


def parse_hostport(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9092"`` -> (host, port); ``[::1]:9092`` for IPv6."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{text!r} is not HOST:PORT")
    number = int(port)
    if not 0 <= number <= 65535:
        raise ConfigError(f"port {number} is out of range")
    return host, number


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper().replace(".", "_").replace("-", "_")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: type
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None
    aliases: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return _env(self.name)

    @property
    def envs(self) -> tuple[str, ...]:
        return (self.env, *(_env(a) for a in self.aliases))

    def convert(self, value: Any, source: str) -> Any:
        try:
            if self.kind is bool:
                if isinstance(value, bool):
                    return value
                text = str(value).strip().lower()
                if text in ("1", "true", "yes", "on"):
                    return True
                if text in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if self.kind is int:
                if isinstance(value, bool):
                    raise ValueError(value)
                return int(value)
            return str(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{self.name} (from {source}) must be {self.kind.__name__}, got {value!r}"
            ) from None


def _positive(v: int) -> str | None:
    return None if v > 0 else "must be > 0"


def _positive_int32(v: int) -> str | None:
    """A time a member is told in an INT32 field (a heartbeat answer's interval) or given as a
    group config (Kafka's INT): beyond 2**31 - 1 none could be written."""
    return None if 1 <= v <= 2**31 - 1 else "must be within [1, 2147483647]"


def _non_negative(v: int) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _hostport(v: str) -> str | None:
    try:
        parse_hostport(v)
    except ConfigError as exc:
        return str(exc)
    return None


def _optional_hostport(v: str) -> str | None:
    return None if v in ("", "none", "off") else _hostport(v)


def _fsync(v: str) -> str | None:
    try:
        FsyncPolicy.parse(v)
    except ValueError as exc:
        return str(exc)
    return None


def _group_list(v: str) -> str | None:
    return None if all(part.strip() for part in v.split(",")) or not v.strip() else (
        "must be comma-separated non-empty group ids")


def _endpoint_list(v: str) -> str | None:
    for part in v.split(","):
        if not part.strip():
            if v.strip():
                return "must be comma-separated HOST:PORT entries"
            continue
        try:
            parse_hostport(part)
        except ConfigError as exc:
            return str(exc)
    return None


def _etcd_prefix(v: str) -> str | None:
    if not v.startswith("/") or v.rstrip("/") == "" or "\x00" in v:
        return "must be a key path starting with '/', e.g. /connect-coordinator"
    return None


def _one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _syntax(parse: Callable[[str], Any], empty: str | None = None) -> Callable[[str], str | None]:
    """A check from a parser raising ConfigError("<setting>: <problem>")."""
    def check(v: str) -> str | None:
        try:
            parsed = parse(v)
        except ConfigError as exc:
            return str(exc).split(": ", 1)[-1]
        return empty if empty is not None and not parsed else None
    return check


_listeners = _syntax(lambda v: listeners.entries(v, "listeners"), "at least one listener is needed")
_protocol_map = _syntax(listeners.parse_protocol_map)
_advertised = _syntax(lambda v: listeners.entries(v, "advertised.listener"))
_DEFAULT_PROTOCOL_MAP = listeners.DEFAULT_PROTOCOL_MAP


def _mechanisms(v: str) -> str | None:
    names = [m.strip() for m in v.split(",") if m.strip()]
    bad = [m for m in names if m not in SASL_MECHANISMS]
    if bad:
        return f"{', '.join(bad)}: not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
    return None if names else "must name at least one mechanism"


def _principals(v: str) -> str | None:
    for part in v.split(";"):
        part = part.strip()
        if part and (":" not in part or not part.split(":", 1)[1]):
            return f"{part!r} is not a principal TYPE:NAME (e.g. User:admin; several separated by ;)"
    return None


_G = GroupCoordinatorConfig()

SETTINGS: tuple[Setting, ...] = (
    Setting("listeners", str, "127.0.0.1:9092",
            "Comma-separated listeners, Kafka's form NAME://HOST:PORT (e.g. "
            "'PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094'); NAME's security protocol "
            "(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) comes from "
            "listener.security.protocol.map. A bare HOST:PORT is the PLAINTEXT listener; port 0: "
            "any free port (docs/security.md).", _listeners),
    Setting("listener.security.protocol.map", str, _DEFAULT_PROTOCOL_MAP,
            "Listener name -> security protocol, NAME:PROTOCOL,... (Kafka's setting; e.g. "
            "'INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL' to name the listeners INTERNAL and "
            "EXTERNAL).", _protocol_map),
    Setting("advertised.listener", str, "",
            "Addresses clients are told to connect to (Metadata, FindCoordinator), per listener: "
            "NAME://HOST:PORT,... (alias advertised.listeners, Kafka's name); a request is "
            "answered with the address of the listener it came in on. A bare HOST:PORT with a "
            "single listener. A listener not named: its bound address.", _advertised,
            aliases=("advertised.listeners",)),
    Setting("metrics.listener", str, "127.0.0.1:9464",
            "HOST:PORT of the Prometheus /metrics endpoint; 'none' disables it.",
            _optional_hostport),
    Setting("metrics.groups", str, "",
            "Comma-separated group ids that get per-group series "
            "(connect_coordinator_group_members{group}); empty: none. Every other group is only "
            "counted in aggregates, so the number of series never grows with the number of "
            "groups.", _group_list),
    Setting("data.dir", str, "./data", "Directory of the partition logs (created if missing)."),
    Setting("partitions", int, 8,
            "Number of log partitions (shards); a group lives in abs(hash(group)) % partitions. "
            "Fixed once data exists.", _positive),
    Setting("log.fsync", str, "always",
            "'always' (fsync before any response that depends on the records), "
            "'interval:MS' (fsync at most every MS ms), 'never' (the OS decides).", _fsync),
    Setting("log.segment.bytes", int, 64 * 1024 * 1024,
            "A segment rolls when it would exceed this size.", _positive),
    Setting("log.compaction.interval.ms", int, 60_000,
            "How often closed segments are compacted (latest record per key).", _positive),
    Setting("log.tombstone.retention.ms", int, 24 * 3600 * 1000,
            "Tombstones are kept this long by compaction before they are dropped.",
            _non_negative),
    Setting("log.recovery.point.interval.ms", int, 5_000,
            "How often each partition's durable log end is written to "
            "data.dir/recovery-point-offset-checkpoint (also after loading and at a clean stop); "
            "a log found shorter than its recovery point fails its partition.", _positive),
    Setting("log.roll.min.bytes", int, 1024 * 1024,
            "A compaction that finds the active segment at least this big and at least "
            "log.roll.dirty.percent superseded rolls it and compacts again, so the log (and the "
            "restart time) follows the live state, not the number of writes.", _positive),
    Setting("log.roll.dirty.percent", int, 50,
            "Share (%) of superseded records in the active segment that makes compaction roll it "
            "(see log.roll.min.bytes).",
            lambda v: None if 1 <= v <= 100 else "must be within [1, 100]"),
    Setting("group.connect.session.timeout.ms", int, _G.session_timeout_ms,
            "A member that does not heartbeat within this is removed.", _positive_int32),
    Setting("group.connect.min.session.timeout.ms", int, _G.min_session_timeout_ms,
            "Lower bound of the session timeout (also for per-group overrides).", _positive_int32),
    Setting("group.connect.max.session.timeout.ms", int, _G.max_session_timeout_ms,
            "Upper bound of the session timeout.", _positive_int32),
    Setting("group.connect.heartbeat.interval.ms", int, _G.heartbeat_interval_ms,
            "How often members heartbeat (told in every response).", _positive_int32),
    Setting("group.connect.min.heartbeat.interval.ms", int, _G.min_heartbeat_interval_ms,
            "Lower bound of the heartbeat interval.", _positive_int32),
    Setting("group.connect.max.heartbeat.interval.ms", int, _G.max_heartbeat_interval_ms,
            "Upper bound of the heartbeat interval.", _positive_int32),
    Setting("group.connect.max.rebalance.timeout.ms", int, _G.max_rebalance_timeout_ms,
            "Largest RebalanceTimeoutMs a member may declare (INVALID_REQUEST beyond): bounds "
            "how long a revocation is waited for and a fenced member's items are held.",
            _positive),
    Setting("group.connect.max.assignment.timeout.ms", int, _G.max_assignment_timeout_ms,
            "Longest a chosen member may take to compute a target assignment (its rebalance "
            "timeout, at most this); then another member is chosen and it is not chosen again "
            "while it stays in the group.", _positive),
    Setting("group.connect.migration.policy", str, _G.migration_policy,
            "Which moves of a non-empty group between the classic protocol (JoinGroup, "
            "SyncGroup, Heartbeat, LeaveGroup) and the new one are allowed, as Kafka's "
            "group.consumer.migration.policy: 'bidirectional', 'upgrade' (classic -> new only), "
            "'downgrade' (new -> classic only), 'disabled'. An empty group takes either "
            "(docs/migration.md).", _one_of("bidirectional", "upgrade", "downgrade", "disabled")),
    Setting("group.connect.classic.max.delay.ms", int, _G.classic_max_delay_ms,
            "A group with only classic members gets its target from the coordinator, which runs "
            "Kafka Connect's incremental cooperative assignor itself: its "
            "scheduled.rebalance.max.delay.ms (how long a departed worker's work waits for it).",
            _non_negative),
    Setting("group.connect.max.size", int, _G.max_size,
            "Maximum members per group; a member joining beyond it gets GROUP_MAX_SIZE_REACHED "
            "(Kafka's error; finite here: every member costs memory while it stays, "
            "docs/security.md).", _positive),
    Setting("group.connect.max.tasks", int, _G.max_tasks,
            f"Most items (connectors plus their tasks) one group may configure; "
            f"ConnectGroupAlterConnectors beyond it gets INVALID_REQUEST. At most {MAX_TASKS_CEILING:,}.",
            lambda v: None if 1 <= v <= MAX_TASKS_CEILING else f"must be within [1, {MAX_TASKS_CEILING}]"),
    Setting("group.max.groups", int, _G.max_groups,
            "Most groups this coordinator hosts, all partitions together; a heartbeat join or "
            "ConnectGroupAlterConnectors that would create one more gets INVALID_REQUEST. Groups "
            "already in the log load regardless.", _positive),
    Setting("group.connect.offsets.max.commit.bytes", int, _G.max_offset_commit_bytes,
            "Most bytes of source partitions and offsets (canonical JSON, UTF-8) one "
            "ConnectGroupCommitOffsets or ConnectGroupAlterOffsets may carry; more gets "
            "INVALID_REQUEST and nothing is stored. At most half the log's batch limit.",
            lambda v: None if 1024 <= v <= DEFAULT_MAX_BATCH_BYTES // 2
            else f"must be within [1024, {DEFAULT_MAX_BATCH_BYTES // 2}]"),
    Setting("group.connect.offsets.max.bytes", int, _G.max_offset_bytes,
            "Most bytes (UTF-8, canonical JSON) of source partitions and offsets one connector "
            "may keep, all its partitions together; a commit or alter that would keep more gets "
            "INVALID_REQUEST and nothing is stored. Bounds the daemon's memory per connector; "
            "keep it below request.max.response.bytes so that one fetch can return them all.",
            _positive),
    Setting("group.connect.offsets.max.partitions", int, _G.max_offset_partitions,
            "Most source partitions one connector may have offsets for; a commit or alter "
            "adding more gets INVALID_REQUEST and nothing is stored.", _positive),
    Setting("group.connect.empty.group.retention.ms", int, _G.empty_group_retention_ms,
            "A group with no members, no connectors and no config overrides is deleted after "
            "this long.",
            _non_negative),
    Setting("socket.max.frame.bytes", int, 1024 * 1024,
            "Largest request frame accepted; a larger declared size closes the connection "
            "before the body is read.", _positive),
    Setting("request.max.items", int, 10_000,
            "Most items one request may name (Metadata topics, FindCoordinator keys, "
            "DescribeGroups and ConnectGroupDescribe group ids); a request naming more is "
            "answered INVALID_REQUEST on every item, nothing looked up.", _positive),
    Setting("request.max.response.bytes", int, 64 * 1024 * 1024,
            "Largest answer to one ConnectGroupDescribe or DescribeGroups: groups are described "
            "in order, each whole, and those after the answer passed this are answered "
            "INVALID_REQUEST ('describe fewer groups at a time'). A ConnectGroupFetchOffsets "
            "answer past it is refused whole (INVALID_REQUEST: 'fetch fewer partitions').",
            _positive),
    Setting("socket.max.inflight.requests", int, 128,
            "Requests one connection may have in flight (received, not yet answered); past it "
            "the connection is not read, and requests it already sent wait, until half are "
            "answered.", _positive),
    Setting("socket.max.inflight.bytes", int, 4 * 1024 * 1024,
            "Bytes one connection may have in flight: its requests, and their answers until "
            "the transport takes them; past it the connection is not read until half are "
            "answered.", _positive),
    Setting("socket.write.buffer.bytes", int, 1024 * 1024,
            "Unsent response bytes one connection may hold (a client not reading its answers); "
            "past it the connection is not read, and requests it already sent wait, until a "
            "quarter is left.", _positive),
    Setting("queued.max.request.bytes", int, 100 * 1024 * 1024,
            "Bytes of partial request frames and of requests received but not yet answered, "
            "all connections together (Kafka's setting); past it the connections holding "
            "some are not read until the total is back under 3/4 of it.", _positive),
    Setting("socket.max.connections", int, 10_000,
            "Connections beyond this are closed at accept.", _positive),
    Setting("socket.idle.timeout.ms", int, 600_000,
            "A connection with no complete request for this long is closed "
            "(also ends slow-loris senders).", _positive),
    # -- security (docs/security.md) ----------------------------------------------------
    Setting("ssl.certfile", str, "",
            "PEM file of the server's certificate chain for the SSL and SASL_SSL listeners "
            "(Kafka's ssl.keystore.location with ssl.keystore.type=PEM).", None),
    Setting("ssl.keyfile", str, "",
            "PEM file of the private key of ssl.certfile; empty: the key is in ssl.certfile.", None),
    Setting("ssl.key.password", str, "",
            "Password of an encrypted ssl.keyfile (Kafka's name).", None),
    Setting("ssl.cafile", str, "",
            "PEM file of the CA certificates trusted for client certificates (Kafka's "
            "truststore); needed by ssl.client.auth requested/required.", None),
    Setting("ssl.client.auth", str, "none",
            "Client certificates on the SSL and SASL_SSL listeners: 'none', 'requested' "
            "(verified when presented) or 'required'. On an SSL listener a verified certificate "
            "gives the principal User:<subject DN> (RFC 2253, as Kafka).",
            _one_of(*tls.CLIENT_AUTH)),
    Setting("ssl.enabled.protocols", str, "TLSv1.2,TLSv1.3",
            "TLS versions accepted (Kafka's setting): TLSv1.2 and/or TLSv1.3.", tls.check_protocols),
    Setting("ssl.handshake.timeout.ms", int, 10_000,
            "A TLS handshake (SSL and SASL_SSL listeners) not done by then closes the connection "
            "(a connection in its handshake does not count in socket.max.connections yet).",
            _positive),
    Setting("sasl.enabled.mechanisms", str, "SCRAM-SHA-256,SCRAM-SHA-512",
            "SASL mechanisms of the SASL_PLAINTEXT and SASL_SSL listeners: SCRAM-SHA-256, "
            "SCRAM-SHA-512, PLAIN (PLAIN checks the password against the user's stored SCRAM "
            "credential). PLAIN is refused on SASL_PLAINTEXT unless sasl.plain.allow.insecure.",
            _mechanisms),
    Setting("sasl.plain.allow.insecure", bool, False,
            "Offer PLAIN on SASL_PLAINTEXT listeners too, where the password crosses the network "
            "in clear text (not a Kafka setting: Kafka allows it silently).", None),
    Setting("sasl.server.max.receive.size", int, 524_288,
            "Largest request frame accepted on a SASL listener before authentication (Kafka's "
            "setting); socket.max.frame.bytes after.", _positive),
    Setting("connections.max.reauth.ms", int, 0,
            "SASL session lifetime (KIP-368): told to clients in SaslAuthenticate v1+; a client "
            "that has not re-authenticated by then is disconnected at its next request. "
            "0: sessions do not expire.", _non_negative),
    Setting("connection.failed.authentication.delay.ms", int, 100,
            "How long a failed SASL authentication waits before its answer, after which the "
            "connection is closed (Kafka's setting).", _non_negative),
    Setting("sasl.authentication.timeout.ms", int, 10_000,
            "A connection to a SASL listener not authenticated this long after it was accepted "
            "(after its TLS handshake on SASL_SSL) is closed (not a Kafka setting).", _positive),
    Setting("authorizer", str, "none",
            "'none': every request is allowed (as Kafka without authorizer.class.name); 'acl': "
            "requests are checked against the ACLs (Kafka's StandardAuthorizer), super.users and "
            "allow.everyone.if.no.acl.found (docs/security.md, 'What each API needs').",
            _one_of("none", "acl")),
    Setting("authorizer.assign.operation", str, "READ",
            "With authorizer=acl, the operation on a group a member's principal needs to compute "
            "the group's assignment (ConnectGroupPrepareAssignment and "
            "ConnectGroupInstallAssignment): READ (every member may, the default), WRITE or "
            "ALTER (only members allowed it are chosen; the others just run what they are given). "
            "docs/security.md, 'Who computes a group's assignment'.",
            _one_of("READ", "WRITE", "ALTER")),
    Setting("super.users", str, "",
            "Principals allowed everything, separated by ';' (Kafka's form: "
            "'User:admin;User:CN=ops,O=Example').", _principals),
    Setting("allow.everyone.if.no.acl.found", bool, False,
            "authorizer=acl: allow an action on a resource no ACL matches (Kafka's setting; "
            "default false: denied).", None),
    Setting("store", str, "file",
            "Where the partitions live: 'file' (the partition logs in data.dir; one node) or "
            "'etcd' (in etcd, shared by several coordinator nodes: etcd.endpoints, node.id; "
            "docs/etcd.md).", _one_of("file", "etcd")),
    Setting("etcd.endpoints", str, "",
            "store=etcd: comma-separated HOST:PORT of the etcd cluster's client URLs "
            "(plain http).", _endpoint_list),
    Setting("etcd.prefix", str, "/connect-coordinator",
            "store=etcd: key namespace of this coordinator cluster in etcd (several clusters can "
            "share one etcd with different prefixes).", _etcd_prefix),
    Setting("node.id", int, -1,
            "store=etcd: this node's id, unique among live nodes (Kafka's broker.id: 0 to "
            "2147483647; the node listed in Metadata and FindCoordinator). -1: unset.",
            lambda v: None if -1 <= v <= 2**31 - 1 else "must be within [0, 2147483647]"),
    Setting("etcd.lease.ttl.ms", int, 2_000,
            "store=etcd: TTL of the node's etcd lease (whole seconds): a node that dies is "
            "replaced after about this long. Must stay well under the workers' session timeout.",
            lambda v: None if v >= 1000 and v % 1000 == 0 else
            "must be a whole number of seconds (a multiple of 1000), at least 1000"),
    Setting("etcd.lease.margin.ms", int, 500,
            "store=etcd: the node stops answering for its partitions once its lease is no "
            "longer certainly valid for this long (the lease counted from the send time of its "
            "last renewal).", _positive),
    Setting("etcd.request.timeout.ms", int, 2_000,
            "store=etcd: timeout of one etcd write (a commit whose answer does not come in "
            "time has an unknown outcome: the partition is reloaded).", _positive),
    Setting("etcd.max.txn.ops", int, 128,
            "store=etcd: etcd's --max-txn-ops (operations per transaction); must not exceed the "
            "servers' value. One request's records must fit in one transaction.", _positive),
    Setting("etcd.max.request.bytes", int, 1536 * 1024,
            "store=etcd: etcd's --max-request-bytes; must not exceed the servers' value. At most "
            "3.5 MiB: a record must also fit in one answer the etcd client can receive (4 MiB).",
            lambda v: None if 4096 < v <= 3584 * 1024 else "must be within (4096, 3670016]"),
    Setting("log.format", str, "json", "'json' (JSON lines) or 'console'.", _one_of("json", "console")),
    Setting("log.level", str, "info", "debug, info, warning or error.",
            _one_of("debug", "info", "warning", "error")),
)
BY_NAME = {s.name: s for s in SETTINGS}
_BY_ANY_NAME = {**BY_NAME, **{a: s for s in SETTINGS for a in s.aliases}}


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class ServerConfig:
    values: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def listeners(self) -> list[listeners.Listener]:
        """Every listener of ``listeners`` (coordinator.security.listeners)."""
        return listeners.parse_listeners(self["listeners"], self["listener.security.protocol.map"])

    @property
    def advertised(self) -> dict[str, tuple[str, int]]:
        """{listener name: advertised (host, port)} of the listeners advertised.listener names."""
        return listeners.parse_advertised(self["advertised.listener"], self.listeners)

    @property
    def listen(self) -> tuple[str, int]:
        """The first listener's (host, port)."""
        first = self.listeners[0]
        return first.host, first.port

    @property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self["sasl.enabled.mechanisms"].split(",") if m.strip())

    @property
    def super_users(self) -> frozenset[str]:
        """``super.users``: principals allowed everything (authorizer=acl)."""
        return frozenset(p.strip() for p in self["super.users"].split(";") if p.strip())

    @property
    def metrics_listen(self) -> tuple[str, int] | None:
        v = self["metrics.listener"]
        return None if v in ("", "none", "off") else parse_hostport(v)

    @property
    def fsync(self) -> FsyncPolicy:
        return FsyncPolicy.parse(self["log.fsync"])

    def group_config(self) -> GroupCoordinatorConfig:
        return GroupCoordinatorConfig(
            session_timeout_ms=self["group.connect.session.timeout.ms"],
            min_session_timeout_ms=self["group.connect.min.session.timeout.ms"],
            max_session_timeout_ms=self["group.connect.max.session.timeout.ms"],
            heartbeat_interval_ms=self["group.connect.heartbeat.interval.ms"],
            min_heartbeat_interval_ms=self["group.connect.min.heartbeat.interval.ms"],
            max_heartbeat_interval_ms=self["group.connect.max.heartbeat.interval.ms"],
            max_size=self["group.connect.max.size"],
            migration_policy=self["group.connect.migration.policy"],
            classic_max_delay_ms=self["group.connect.classic.max.delay.ms"],
            max_rebalance_timeout_ms=self["group.connect.max.rebalance.timeout.ms"],
            max_assignment_timeout_ms=self["group.connect.max.assignment.timeout.ms"],
            max_tasks=self["group.connect.max.tasks"],
            empty_group_retention_ms=self["group.connect.empty.group.retention.ms"],
            max_groups=self["group.max.groups"],
            max_batch_bytes=DEFAULT_MAX_BATCH_BYTES,
            max_offset_commit_bytes=self["group.connect.offsets.max.commit.bytes"],
            max_offset_partitions=self["group.connect.offsets.max.partitions"],
            max_offset_bytes=self["group.connect.offsets.max.bytes"],
            max_batch_records=self["etcd.max.txn.ops"] if self["store"] == "etcd" else None,
        )

    @property
    def metrics_groups(self) -> frozenset[str]:
        """Groups with per-group metric series (``metrics.groups``)."""
        return frozenset(p.strip() for p in self["metrics.groups"].split(",") if p.strip())

    @property
    def etcd_endpoints(self) -> list[str]:
        return [p.strip() for p in self["etcd.endpoints"].split(",") if p.strip()]


def load(
    file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Defaults < TOML ``file`` < environment < ``overrides`` (flags). Raises ConfigError with a
    message naming the setting and where its value came from."""
    values = {s.name: s.default for s in SETTINGS}
    if file is not None:
        path = Path(file)
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        seen: dict[str, str] = {}
        for name, value in _flatten(table).items():
            setting = _BY_ANY_NAME.get(name)
            if setting is None:
                raise ConfigError(f"unknown setting {name!r} in {path} (see docs/configuration.md)")
            if setting.name in seen:
                raise ConfigError(f"{seen[setting.name]} and {name} in {path} are the same setting: "
                                  "give one")
            seen[setting.name] = name
            values[setting.name] = setting.convert(value, str(path))
    env = os.environ if environ is None else environ
    for setting in SETTINGS:
        given = [e for e in setting.envs if e in env]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)} are the same setting: give one")
        if given:
            values[setting.name] = setting.convert(env[given[0]], given[0])
    known_env = {e for s in SETTINGS for e in s.envs}
    unknown_env = [k for k in env if k.startswith(ENV_PREFIX) and k not in known_env]
    if unknown_env:
        raise ConfigError(f"unknown environment setting(s): {', '.join(sorted(unknown_env))}")
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        setting = _BY_ANY_NAME.get(name)
        if setting is None:
            raise ConfigError(f"unknown setting {name!r}")
        values[setting.name] = setting.convert(value, "the command line")
    for setting in SETTINGS:
        if setting.check is not None:
            problem = setting.check(values[setting.name])
            if problem:
                raise ConfigError(f"{setting.name}={values[setting.name]!r}: {problem}")
    config = ServerConfig(values)
    config.group_config()  # cross-checks (bounds, heartbeat < session); raises ConfigError
    if values["queued.max.request.bytes"] < values["socket.max.frame.bytes"] + 4:
        # One frame of the largest size would stop its own connection's reads for good.
        raise ConfigError(
            f"queued.max.request.bytes={values['queued.max.request.bytes']} must hold at least "
            f"one frame of socket.max.frame.bytes={values['socket.max.frame.bytes']} (+4)")
    _check_security(config)
    if values["store"] == "etcd":
        if not values["etcd.endpoints"].strip():
            raise ConfigError("store=etcd needs etcd.endpoints (--etcd-endpoints HOST:PORT,...)")
        if values["node.id"] < 0:
            raise ConfigError("store=etcd needs node.id (--node-id N), unique among the nodes")
        advertised = config.advertised
        for ln in config.listeners:
            if ln.host in listeners.WILDCARDS and ln.name not in advertised:
                # As Kafka: the other nodes and the clients cannot connect to a wildcard address.
                raise ConfigError(
                    f"store=etcd with listeners={values['listeners']!r} needs advertised.listener "
                    f"(--advertised-listener HOST:PORT) for {ln.name}: the address the clients "
                    "and the other nodes reach this node at")
        if values["etcd.lease.margin.ms"] * 2 > values["etcd.lease.ttl.ms"]:
            raise ConfigError(
                f"etcd.lease.margin.ms={values['etcd.lease.margin.ms']} must be at most half of "
                f"etcd.lease.ttl.ms={values['etcd.lease.ttl.ms']}")
    return config


def _check_security(config: ServerConfig) -> None:
    """Listeners, advertised addresses and TLS files, checked at start (ConfigError naming the
    setting: exit 2)."""
    found = config.listeners  # parse errors name listeners / the protocol map
    _ = config.advertised  # ... and advertised.listener
    if any(ln.tls for ln in found):
        tls.server_context(config.values)  # a missing or unusable file names its setting
    elif config["ssl.client.auth"] != "none":
        raise ConfigError(f"ssl.client.auth={config['ssl.client.auth']} without an SSL or SASL_SSL "
                          "listener")


def reference_markdown() -> str:
    lines = [
        "| setting | environment variable | default | meaning |",
        "|---|---|---|---|",
    ]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default != "" else "(empty)"
        lines.append(f"| `{s.name}` | `{s.env}` | {default} | {s.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(reference_markdown())
