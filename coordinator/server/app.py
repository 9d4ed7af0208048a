"""The daemon: shards, the KRPC listener, the metrics endpoint, graceful shutdown.

Start-up: the listener opens first (requests for a partition still loading get
COORDINATOR_LOAD_IN_PROGRESS), every partition log is opened and replayed in parallel, then one
line with the bound addresses is printed. SIGTERM/SIGINT: stop accepting, answer what is in
flight, commit and fsync every partition, close the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from connect_wire import codec, secrets
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.messages import (
    ConnectGroupAlterConnectorsResponse,
    ConnectGroupAlterOffsetsResponse,
    ConnectGroupCommitOffsetsResponse,
    ConnectGroupDescribeRequest,
    ConnectGroupDescribeResponse,
    ConnectGroupFetchOffsetsResponse,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentResponse,
    ConnectGroupWriteTaskConfigsResponse,
)
from connect_wire.messages import connect_group_describe_response_v0 as _desc
from coordinator import logs
from coordinator.config import ServerConfig
from coordinator.group.config import ConfigError
from coordinator.group.coordinator import RequestContext
from coordinator.logs import LogLimiter
from coordinator.metrics import Metrics
from coordinator.runtime import datadir
from coordinator.runtime.partitioner import partition_for
from coordinator.runtime.shard import (
    ACTIVE,
    FAILED,
    Shard,
    ShardUnavailable,
    UnownedShard,
    now_ms,
)
from coordinator.security import ANONYMOUS, CLUSTER_NAME
from coordinator.security.apis import error_response as security_error_response
from coordinator.security.listeners import WILDCARDS, describe
from coordinator.security.service import API_KEYS as SECURITY_API_KEYS
from coordinator.security.service import SecurityService
from coordinator.security.tls import server_context
from coordinator.server import classic_apis, group_configs, kafka_apis
from coordinator.server.connection import Connection, Served
from coordinator.server.heap import HeapTrimmer
from coordinator.store import partition_store

log = logs.get("coordinator.server")


class StartupError(Exception):
    """The daemon cannot serve at all (e.g. no partition could be loaded): exit non-zero."""


_HEARTBEAT = int(ApiKey.CONNECT_GROUP_HEARTBEAT)
LOOP_LAG_PROBE_S = 0.1
HEAP_TRIM_INTERVAL_S = 2.0  # malloc_trim at most this often, while TLS connections come and go
DENIAL_LOG_INTERVAL_S = 10.0  # an authorization denial is logged once per this per principal,
DENIAL_LOG_KEYS = 10_000  # API and resource (the keys remembered: forgotten all at once past it)
LOG_LINES_PER_INTERVAL = 20  # lines of one such kind per interval, every key together
_OFFSET_RESPONSES: dict[int, type] = {
    ApiKey.CONNECT_GROUP_COMMIT_OFFSETS: ConnectGroupCommitOffsetsResponse,
    ApiKey.CONNECT_GROUP_FETCH_OFFSETS: ConnectGroupFetchOffsetsResponse,
    ApiKey.CONNECT_GROUP_ALTER_OFFSETS: ConnectGroupAlterOffsetsResponse,
}
_OFFSET_OPERATIONS = {
    ApiKey.CONNECT_GROUP_COMMIT_OFFSETS: "READ",
    ApiKey.CONNECT_GROUP_FETCH_OFFSETS: "DESCRIBE",
    ApiKey.CONNECT_GROUP_ALTER_OFFSETS: "ALTER",
}
DECISIONS_CACHED = 50_000  # authorizer decisions remembered (all forgotten at once past it)
PLAIN_THREADS = 2  # PLAIN's password derivations (PBKDF2): their own pool, not the default one
PLAIN_MAX_PENDING = 16  # derivations running or waiting; past it a PLAIN attempt fails at once
AUTH_FAILURE_LOG_INTERVAL_S = 10.0  # failed authentications: one line per peer host per this


class Router:
    """API key -> handler. Connect APIs go to the group's shard; Kafka's APIs are answered here.

    With ``authorizer=acl`` every request is checked (docs/security.md, "What each API
    needs"): READ on the group for ConnectGroupHeartbeat, ``authorizer.assign.operation`` (READ
    unless set) for PrepareAssignment and InstallAssignment, ALTER on it for
    ConnectGroupAlterConnectors, DESCRIBE for FindCoordinator (per key), DescribeGroups and
    ConnectGroupDescribe (per group); ListGroups lists every group with DESCRIBE on the cluster,
    else the groups the principal may DESCRIBE.
    A denial is GROUP_AUTHORIZATION_FAILED with a message, counted
    (connect_coordinator_authorization_denied_total{api,resource_type}) and logged with the
    principal (at most once per 10 s per principal, API and resource, and 20 lines per 10 s in
    all: each line says how many were left out).
    """

    def __init__(self, server: CoordinatorServer) -> None:
        self.server = server
        self.acl = server.config["authorizer"] == "acl"
        self._denials_logged = LogLimiter(DENIAL_LOG_INTERVAL_S, LOG_LINES_PER_INTERVAL,
                                          DENIAL_LOG_KEYS)
        self.assign_operation = server.config["authorizer.assign.operation"] if self.acl \
            else "READ"
        """The operation on a group that computing its assignment needs (Prepare/Install)."""
        self._decisions: dict[tuple[str, str, str, str, str], bool] = {}
        self._decisions_version: Any = None

    # -- authorization ----------------------------------------------------------------------------
    def allowed(self, ctx: RequestContext, operation: str, resource_type: str, name: str) -> bool:
        """The authorizer's decision (always True with authorizer=none), cached per principal,
        host, operation and resource until the security state changes (its ``version``): a
        decision walks the resource's ACLs, ~3.5 µs per heartbeat measured (bench security)."""
        if not self.acl:
            return True
        security = self.server.security
        version = getattr(security, "version", None)
        key = (ctx.principal, ctx.client_host, operation, resource_type, name)
        if version is None:
            return bool(security.authorize(*key))
        decisions = self._decisions
        if version != self._decisions_version:
            decisions.clear()
            self._decisions_version = version
        allowed = decisions.get(key)
        if allowed is None:
            if len(decisions) >= DECISIONS_CACHED:
                decisions.clear()
            allowed = decisions[key] = bool(security.authorize(*key))
        return allowed

    def denied(self, ctx: RequestContext, api: str, operation: str, resource_type: str,
               name: str) -> str | None:
        """None when allowed; else the denial's message (counted and logged)."""
        if not self.acl or self.allowed(ctx, operation, resource_type, name):
            return None
        self.server.metrics.authorization_denied.labels(api, resource_type).inc()
        fields = self._denials_logged.admit((ctx.principal, api, resource_type, name))
        if fields is not None:
            log.warning("authorization failed", principal=ctx.principal, host=ctx.client_host,
                        api=api, operation=operation, resource_type=resource_type,
                        resource=name[:256], listener=ctx.listener, **fields)
        what = "the cluster" if resource_type == "CLUSTER" else f"{resource_type.lower()} {name!r}"
        return (f"Principal {ctx.principal} is not authorized to {operation} {what} ({api}); "
                "an ACL must allow it")

    def shard_of(self, group_id: str) -> Shard:
        shards = self.server.shards
        return shards[partition_for(group_id, len(shards))]

    def api_versions(self, version: int, error: int = 0) -> Any:
        return kafka_apis.api_versions(version, error)

    # Error responses of the connect APIs (also used for malformed bodies).
    @staticmethod
    def _hb_error(req: Any, interval_ms: int) -> Callable[[int, str], Any]:
        return lambda code, msg: ConnectGroupHeartbeatResponse(
            error_code=code, error_message=msg, member_epoch=getattr(req, "member_epoch", -1),
            heartbeat_interval_ms=interval_ms, should_compute_assignment=False)

    @staticmethod
    def _error(api_key: int) -> Callable[[int, str], Any]:
        if api_key == ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT:
            return lambda code, msg: ConnectGroupPrepareAssignmentResponse(
                error_code=code, error_message=msg, group_epoch=-1, assignment_epoch=-1,
                assignor_name="", coordinator_time_ms=int(time.time() * 1000), assignor_state=b"")
        if api_key == ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT:
            return lambda code, msg: ConnectGroupInstallAssignmentResponse(
                error_code=code, error_message=msg)
        if api_key == ApiKey.CONNECT_GROUP_ALTER_CONNECTORS:
            return lambda code, msg: ConnectGroupAlterConnectorsResponse(
                error_code=code, error_message=msg, group_epoch=-1)
        if api_key == ApiKey.CONNECT_GROUP_DESCRIBE:
            return lambda code, msg: ConnectGroupDescribeResponse(groups=())
        if api_key in _OFFSET_RESPONSES:
            response = _OFFSET_RESPONSES[api_key]
            return lambda code, msg: response(error_code=code, error_message=msg)
        if api_key == ApiKey.CONNECT_GROUP_WRITE_TASK_CONFIGS:
            return lambda code, msg: ConnectGroupWriteTaskConfigsResponse(
                error_code=code, error_message=msg, changed=False, group_epoch=-1)
        raise KeyError(api_key)

    def error_response(self, request: Any, code: int, message: str, items: bool = True) -> Any:
        """``request``'s response carrying ``code`` (Kafka's ``getErrorResponse``): the
        response-level error where the API has one, else the error on every item the request
        named (``items=False``: none, the last resort when even that cannot be encoded)."""
        api_key, version = type(request).__api_key__, type(request).__version__
        if api_key == _HEARTBEAT:
            return self._hb_error(request, self.server.heartbeat_interval_ms)(code, message)
        if api_key == ApiKey.CONNECT_GROUP_DESCRIBE:
            return ConnectGroupDescribeResponse(groups=tuple(
                _desc.DescribedGroup(
                    error_code=code, error_message=message, group_id=g, group_state="Dead",
                    group_epoch=-1, assignment_epoch=-1, assignor_name=None,
                    assigning_member_id=None)
                for g in (request.group_ids if items else ())))
        if api_key >= ApiKey.CONNECT_GROUP_HEARTBEAT:
            return self._error(api_key)(code, message)
        if api_key in SECURITY_API_KEYS:  # credentials and ACLs: their own items
            return security_error_response(APIS[api_key].response_class(version),
                                           request if items else None, code, message)
        return kafka_apis.error_response(APIS[api_key].response_class(version),
                                         request if items else None, code, message)

    def malformed(self, api_key: int, version: int, message: str) -> Any | None:
        text = f"malformed request: {message}"
        if api_key == ApiKey.CONNECT_GROUP_HEARTBEAT:
            return self._hb_error(None, self.server.heartbeat_interval_ms)(ErrorCode.INVALID_REQUEST, text)
        if api_key in (ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT, ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT,
                       ApiKey.CONNECT_GROUP_ALTER_CONNECTORS,
                       ApiKey.CONNECT_GROUP_WRITE_TASK_CONFIGS, *_OFFSET_RESPONSES):
            return self._error(api_key)(ErrorCode.INVALID_REQUEST, text)
        return None

    def dispatch(self, api_key: int, version: int, req: Any, ctx: RequestContext) -> Any:
        s = self.server
        if api_key == _HEARTBEAT:  # the hot path first
            if self.acl:
                refused = self.denied(ctx, "ConnectGroupHeartbeat", "READ", "GROUP", req.group_id)
                if refused is not None:
                    return self._hb_error(req, s.heartbeat_interval_ms)(
                        ErrorCode.GROUP_AUTHORIZATION_FAILED, refused)
            shard = self.shard_of(req.group_id)
            steady = shard.try_steady_heartbeat(req, ctx)
            if steady is not None:
                return steady
            if self.assign_operation != "READ" and not self.allowed(
                    ctx, self.assign_operation, "GROUP", req.group_id):
                ctx = dataclasses.replace(ctx, may_assign=False)  # (never chosen to compute)
            error = self._hb_error(req, s.heartbeat_interval_ms)
            try:
                return shard.heartbeat(req, ctx, error)
            except ShardUnavailable as exc:
                return error(exc.code, exc.message)
        if api_key == ApiKey.API_VERSIONS:
            return self.api_versions(version)
        if api_key in SECURITY_API_KEYS:  # credentials and ACLs (coordinator/security/apis.py)
            return self._gather(s.security_service.apis.handle(
                api_key, version, req, getattr(ctx, "principal", ANONYMOUS), ctx.client_host))
        if api_key in classic_apis.API_KEYS:  # classic Kafka Connect workers
            return classic_apis.handle(self, api_key, version, req, ctx)
        if api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            # On a listener without SASL, or after authentication (the connection handles the
            # exchange itself): as Kafka's KafkaApis, ILLEGAL_SASL_STATE.
            return kafka_apis.build(APIS[api_key].response_class(version), {
                "error_code": ErrorCode.ILLEGAL_SASL_STATE,
                "error_message": "SaslAuthenticate request received after successful "
                                 "authentication" if api_key == ApiKey.SASL_AUTHENTICATE else None,
                "auth_bytes": b"", "mechanisms": []})
        if api_key < ApiKey.CONNECT_GROUP_HEARTBEAT and api_key != ApiKey.LIST_GROUPS:
            # request.max.items: a request naming more items is refused before any is looked
            # up (three 1 MiB FindCoordinator frames of 500,000 keys each held the loop 16 s).
            cls = APIS[api_key].response_class(version)
            refused = kafka_apis.too_many_items(cls, req, s.max_request_items)
            if refused is not None:
                return self._gather(refused)
        listener = ctx.listener
        if api_key == ApiKey.METADATA:
            return kafka_apis.metadata(APIS[api_key].response_class(version), req,
                                       s.brokers(listener), s.controller_id())
        if api_key == ApiKey.FIND_COORDINATOR:
            denied = None
            if self.acl:
                def denied(key: str) -> str | None:
                    return self.denied(ctx, "FindCoordinator", "DESCRIBE", "GROUP", key)
            found = kafka_apis.find_coordinator(APIS[api_key].response_class(version), req,
                                                version, lambda g: s.locate(g, listener),
                                                denied)
            return self._gather(found) if asyncio.iscoroutine(found) else found
        if api_key == ApiKey.LIST_GROUPS:
            return self._list_groups(APIS[api_key].response_class(version), req, ctx)
        if api_key == ApiKey.DESCRIBE_GROUPS:
            return self._describe_groups(APIS[api_key].response_class(version), req, ctx)
        if api_key == ApiKey.CONNECT_GROUP_DESCRIBE:
            if len(req.group_ids) > s.max_request_items:
                return self._gather(self._too_many_describe(req.group_ids, s.max_request_items))
            return self._connect_describe(req, ctx)
        if api_key in _OFFSET_RESPONSES:
            return self._offsets(api_key, req, ctx)
        if api_key in group_configs.API_KEYS:  # a group's dynamic configs
            return self._gather(group_configs.handle(self, api_key, version, req, ctx))
        shard = self.shard_of(req.group_id)
        error = self._error(api_key)
        if self.acl:
            name = APIS[api_key].name
            # (a connector's task configs are written by the worker running it: READ, as
            # ConnectGroupHeartbeat)
            operation = ("ALTER" if api_key == ApiKey.CONNECT_GROUP_ALTER_CONNECTORS
                         else "READ" if api_key == ApiKey.CONNECT_GROUP_WRITE_TASK_CONFIGS
                         else self.assign_operation)
            refused = self.denied(ctx, name, operation, "GROUP", req.group_id)
            if refused is not None:
                return error(ErrorCode.GROUP_AUTHORIZATION_FAILED, refused)
        if api_key == ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT:
            fn = lambda core, now: core.prepare_assignment(req, now)  # noqa: E731
        elif api_key == ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT:
            fn = lambda core, now: core.install_assignment(req, now)  # noqa: E731
        elif api_key == ApiKey.CONNECT_GROUP_ALTER_CONNECTORS:
            fn = lambda core, now: core.alter_connectors(req, now)  # noqa: E731
        elif api_key == ApiKey.CONNECT_GROUP_WRITE_TASK_CONFIGS:
            fn = lambda core, now: core.write_task_configs(req, now)  # noqa: E731
        else:
            raise KeyError(api_key)
        try:
            return shard.write(fn, error)
        except ShardUnavailable as exc:
            return error(exc.code, exc.message)

    def _offsets(self, api_key: int, req: Any, ctx: RequestContext) -> Any:
        """ConnectGroupCommitOffsets (READ on the group, as a heartbeat), FetchOffsets
        (DESCRIBE), AlterOffsets (ALTER), on the group's partition. A Reset removes a batch of
        partitions per write, repeated until none is left."""
        error = self._error(api_key)
        if self.acl:
            refused = self.denied(ctx, APIS[api_key].name, _OFFSET_OPERATIONS[api_key], "GROUP",
                                  req.group_id)
            if refused is not None:
                return error(ErrorCode.GROUP_AUTHORIZATION_FAILED, refused)
        shard = self.shard_of(req.group_id)
        try:
            if api_key == ApiKey.CONNECT_GROUP_COMMIT_OFFSETS:
                return shard.write(lambda core, now: core.commit_offsets(req, now), error)
            if api_key == ApiKey.CONNECT_GROUP_ALTER_OFFSETS and not (
                    req.reset and not req.validate_only):
                return shard.write(lambda core, now: core.alter_offsets(req, now), error)
        except ShardUnavailable as exc:
            return error(exc.code, exc.message)

        async def run() -> Any:
            try:
                if api_key == ApiKey.CONNECT_GROUP_FETCH_OFFSETS:
                    response = await shard.read(lambda core: core.fetch_offsets(req))
                    return self._bounded_fetch(response, error)
                # A Reset: batches until none is left. Each batch removes at least one partition,
                # so as many rounds as there were partitions (plus one) end it unless partitions
                # keep being committed meanwhile (instances of the STOPPED connector still
                # stopping): then the reset stops there, with an error saying so.
                rounds = 1 + await shard.read(
                    lambda core: core.offset_count(req.group_id, req.connector))
                while True:
                    response = await shard.write(lambda core, now: core.alter_offsets(req, now),
                                                 error)
                    if response.error_code:
                        return response
                    left = await shard.read(
                        lambda core: core.offset_count(req.group_id, req.connector))
                    if not left:
                        return response
                    rounds -= 1
                    if rounds <= 0:
                        return error(ErrorCode.INVALID_REQUEST,
                                     f"Offsets of connector {req.connector!r} kept being committed "
                                     f"while they were reset ({left:,} left): wait until its "
                                     "instances have stopped, then reset again.")
            except ShardUnavailable as exc:
                return error(exc.code, exc.message)
        return self._gather(run())

    def _bounded_fetch(self, response: Any, error: Callable[[int, str], Any]) -> Any:
        """A FetchOffsets answer within request.max.response.bytes (as a describe's): a
        connector may hold far more offsets than one answer should carry."""
        limit = self.server.max_response_bytes
        total = 0
        for p in response.offsets:
            total += len(p.partition.encode()) + (len(p.offset.encode()) if p.offset else 0)
            if total > limit:
                return error(ErrorCode.INVALID_REQUEST,
                             f"the answer would carry {len(response.offsets):,} offsets, more than "
                             f"request.max.response.bytes={limit} bytes: fetch fewer partitions "
                             "at a time (Partitions)")
        return response

    @staticmethod
    def _too_many_describe(group_ids: Any, limit: int) -> Any:
        message = f"{len(group_ids)} group ids in one request, more than request.max.items={limit}"

        def make(group_id: str, message: str | None = None) -> Any:
            return ConnectGroupDescribeResponse(groups=(_desc.DescribedGroup(
                error_code=ErrorCode.INVALID_REQUEST, error_message=message, group_id=group_id,
                group_state="Dead", group_epoch=-1, assignment_epoch=-1, assignor_name=None,
                assigning_member_id=None),))
        return kafka_apis.refuse_items_async(make, "groups", group_ids, ErrorCode.INVALID_REQUEST,
                                             lambda g: make(g, message))

    def _gather(self, coroutine: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(coroutine)

    def _connect_describe(self, req: ConnectGroupDescribeRequest,
                          ctx: RequestContext) -> asyncio.Future[Any]:
        limit = self.server.max_response_bytes

        def refused(group_id: str) -> Any:
            return _desc.DescribedGroup(
                error_code=ErrorCode.INVALID_REQUEST, group_id=group_id, group_state="Dead",
                error_message=f"the answer would exceed request.max.response.bytes={limit}: "
                              "describe fewer groups at a time",
                group_epoch=-1, assignment_epoch=-1, assignor_name=None, assigning_member_id=None)

        async def run() -> Any:
            # Encoded a group at a time (each read is a shard round trip: other callbacks run
            # in between); past request.max.response.bytes the remaining groups are refused
            # (ten thousand copies of a group of 100,000 tasks was an answer of gigabytes).
            entries, total = [], 0
            for group_id in req.group_ids:
                described = (await self._describe_one(group_id, ctx, "ConnectGroupDescribe")
                             if total <= limit else refused(group_id))
                entry = codec.encode(described)
                total += len(entry)
                entries.append(entry)
            return kafka_apis.assemble(
                lambda g: ConnectGroupDescribeResponse(groups=(refused(g),)), "groups", entries)
        return self._gather(run())

    async def _describe_one(self, group_id: str, ctx: RequestContext | None = None,
                            api: str = "") -> Any:
        def unavailable(code: int, message: str) -> Any:
            return _desc.DescribedGroup(
                error_code=code, error_message=message, group_id=group_id, group_state="Dead",
                group_epoch=-1, assignment_epoch=-1, assignor_name=None, assigning_member_id=None)
        if self.acl and ctx is not None:
            refused = self.denied(ctx, api, "DESCRIBE", "GROUP", group_id)
            if refused is not None:
                return unavailable(ErrorCode.GROUP_AUTHORIZATION_FAILED, refused)
        if not group_id:
            return unavailable(ErrorCode.INVALID_GROUP_ID, "GroupId must be non-empty.")
        shard = self.shard_of(group_id)
        try:
            response = await shard.read(
                lambda core: core.describe(ConnectGroupDescribeRequest(group_ids=(group_id,)),
                                           now_ms()))
        except ShardUnavailable as exc:
            return unavailable(exc.code, exc.message)
        described = response.groups[0]
        if (self.acl and ctx is not None and described.connectors
                and not self.allowed(ctx, "READ", "GROUP", group_id)
                and not self.allowed(ctx, "ALTER", "GROUP", group_id)):
            # Who may only look (DESCRIBE) does not see secret values; the group's workers
            # (READ) run the connectors and its admins (ALTER) write them.
            def hidden(entries: Any) -> tuple[Any, ...]:
                return tuple(dataclasses.replace(e, value=secrets.hide(e.name, e.value))
                             for e in entries)
            described = dataclasses.replace(described, connectors=tuple(
                dataclasses.replace(c, config=hidden(c.config), task_configs=None
                                    if c.task_configs is None else tuple(
                                        dataclasses.replace(t, config=hidden(t.config))
                                        for t in c.task_configs))
                for c in described.connectors))
        return described

    def _list_groups(self, cls: type, req: Any, ctx: RequestContext) -> asyncio.Future[Any]:
        # As Kafka: every group with DESCRIBE on the cluster, else those the principal may
        # DESCRIBE (not counted or logged as denials: a filter).
        everything = not self.acl or self.allowed(ctx, "DESCRIBE", "CLUSTER", CLUSTER_NAME)

        async def run() -> Any:
            # A partition another live node owns is that node's to list (as Kafka's brokers
            # do); any other partition this node cannot read makes the answer partial, and the
            # top-level error says so (the groups read are listed all the same):
            # COORDINATOR_LOAD_IN_PROGRESS while it loads, COORDINATOR_NOT_AVAILABLE while no
            # live node serves it (a failover, a node cut off from etcd; clients retry both),
            # the shard's own error when it failed to load (a client reports that at once).
            groups: list[tuple[str, str]] = []
            error = 0
            cluster = self.server.cluster
            for shard in self.server.shards:
                if cluster is not None and shard.state != ACTIVE \
                        and cluster.served_elsewhere(shard.partition):
                    continue
                try:
                    groups += await shard.read(lambda core: core.list_groups())
                except ShardUnavailable as exc:
                    if cluster is not None and cluster.served_elsewhere(shard.partition):
                        continue
                    code = exc.code
                    if code == ErrorCode.NOT_COORDINATOR and shard.state != FAILED:
                        code = ErrorCode.COORDINATOR_NOT_AVAILABLE
                    if not error or error in RETRIABLE_LISTING:
                        error = code
            if not everything:
                groups = [g for g in groups if self.allowed(ctx, "DESCRIBE", "GROUP", g[0])]
            # The error goes into the one build: rebuilding the response from its own fields
            # fed a parsed timedelta back into build() (TypeError; v0 has no throttle at all).
            return kafka_apis.list_groups(cls, req, groups, error)
        return self._gather(run())

    def _describe_groups(self, cls: type, req: Any, ctx: RequestContext) -> asyncio.Future[Any]:
        limit = self.server.max_response_bytes
        refused = kafka_apis.describe_groups_refused(cls)

        async def run() -> Any:
            # As _connect_describe: a group at a time, the rest refused past the limit.
            entries, total = [], 0
            for g in req.groups:
                if total <= limit:
                    entry = kafka_apis.described_group(
                        cls, g, await self._describe_one(g, ctx, "DescribeGroups"))
                else:
                    entry = codec.encode(refused(g).groups[0])
                total += len(entry)
                entries.append(entry)
            return kafka_apis.assemble(refused, "groups", entries)
        return self._gather(run())


RETRIABLE_LISTING = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE)
"""ListGroups errors a client asks again (a partition loading or without a live owner); any
other error in an answer wins over them (the client reports it at once)."""


ClusterFactory = Callable[["CoordinatorServer", ServerConfig], Any]
"""Makes this node's part of a cluster of nodes on ``store=etcd``: the cluster package's
ClusterNode, handed in by the daemon's entry point (coordinator.daemon) because the cluster
sits above the server (it drives the server's shards); the server never imports it."""


class CoordinatorServer:
    def __init__(self, config: ServerConfig, cluster: ClusterFactory | None = None) -> None:
        self.config = config
        self.metrics = Metrics()
        # group.max.groups counts the groups of every partition (a new group is checked, then
        # created, within one handler on this one event loop: no other shard runs in between).
        group_config = dataclasses.replace(config.group_config(), group_count=self.group_count)
        self.group_config = group_config
        self.heartbeat_interval_ms = group_config.heartbeat_interval_ms
        self.max_frame_bytes = config["socket.max.frame.bytes"]
        self.max_request_items = config["request.max.items"]
        self.max_response_bytes = config["request.max.response.bytes"]
        # Flow control (docs/daemon.md, "Connections"): per connection, and all together.
        self.max_inflight_requests = config["socket.max.inflight.requests"]
        self.max_inflight_bytes = config["socket.max.inflight.bytes"]
        self.write_buffer_bytes = config["socket.write.buffer.bytes"]
        self.max_held_bytes = config["queued.max.request.bytes"]
        self.held_bytes = 0
        """Bytes of partial request frames and of requests received and not yet answered, every
        connection together (Connection keeps it; queued.max.request.bytes bounds it)."""
        self.over_budget = False
        self.max_connections = config["socket.max.connections"]
        self.idle_timeout_s = config["socket.idle.timeout.ms"] / 1000
        # Listeners and their security (docs/security.md).
        self.listener_specs = config.listeners
        self._advertised = config.advertised
        tls = server_context(config.values) if any(ln.tls for ln in self.listener_specs) else None
        enabled = config.sasl_mechanisms
        self.served = {
            ln.name: Served(ln.name, ln.protocol,
                            tuple(m for m in enabled if m != "PLAIN" or ln.tls
                                  or config["sasl.plain.allow.insecure"]) if ln.sasl else (),
                            tls if ln.tls else None)
            for ln in self.listener_specs}
        self.sasl_max_receive_bytes = min(config["sasl.server.max.receive.size"],
                                          self.max_frame_bytes)
        self.max_reauth_ms = config["connections.max.reauth.ms"]
        self.auth_failure_delay_s = config["connection.failed.authentication.delay.ms"] / 1000
        self.auth_timeout_s = config["sasl.authentication.timeout.ms"] / 1000
        self.ssl_handshake_timeout_s = config["ssl.handshake.timeout.ms"] / 1000
        # The C heap's free pages go back to the system after TLS connections end (glibc keeps
        # what their buffers freed: waves of TLS connections ratcheted the RSS).
        self.heap = HeapTrimmer(HEAP_TRIM_INTERVAL_S, self.ssl_handshake_timeout_s)
        self._auth_failures_logged = LogLimiter(AUTH_FAILURE_LOG_INTERVAL_S,
                                                LOG_LINES_PER_INTERVAL, DENIAL_LOG_KEYS)
        self._closes_logged = LogLimiter(AUTH_FAILURE_LOG_INTERVAL_S, LOG_LINES_PER_INTERVAL,
                                         DENIAL_LOG_KEYS)
        # PLAIN derives the password (PBKDF2) off the loop: on its own bounded pool, not the
        # default executor that runs every partition's fsync.
        self.plain_executor = ThreadPoolExecutor(PLAIN_THREADS, thread_name_prefix="sasl-plain")
        self.plain_pending = 0
        self.plain_max_pending = PLAIN_MAX_PENDING
        self._plain_refused_logged = LogLimiter(AUTH_FAILURE_LOG_INTERVAL_S, 1)
        self.bound_listeners: dict[str, tuple[str, int]] = {}
        """Listener name -> bound (host, port), in the order of ``listeners``."""
        data_dir = Path(config["data.dir"])
        self.data_dir = data_dir
        self.cluster: Any = None
        """store=etcd: the ClusterNode (coordinator.cluster.node); None on the file store."""
        self.shards: list[Any]
        if config["store"] == "etcd":
            if cluster is None:
                raise ConfigError("store=etcd needs the cluster node: start the daemon with "
                                  "coordinator.daemon.main_serve")
            self.cluster = cluster(self, config)
            self.shards = [UnownedShard(p, group_config) for p in range(config["partitions"])]
        else:
            self.shards = [
                Shard(p, partition_store(config, p), group_config, self.metrics)
                for p in range(config["partitions"])
            ]
            for shard in self.shards:
                shard.heartbeat_error = self.heartbeat_error
        self.security_service = SecurityService(config, self.metrics)
        self.security = self.security_service.state
        """Credentials and ACLs (coordinator.security.state.SecurityState), loaded at start."""
        self.router = Router(self)
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._servers: list[asyncio.Server] = []
        self._metrics_server: Any = None
        self._reaper: asyncio.Task[None] | None = None
        self._lag_probe: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self.bound: tuple[str, int] = ("", 0)
        self.metrics_bound: tuple[str, int] | None = None
        self.metrics.queued_request_bytes.set_function(lambda: self.held_bytes)
        self.metrics.connections_read_paused.set_function(self._read_paused)
        self.metrics.register_groups(self._group_rows, config.metrics_groups)
        self._lock: datadir.DataDirLock | None = None
        self.recovery_points: dict[int, int] = {}
        """What the checkpoint file claims (and will claim): partition -> recovery point."""
        self._loaded = False
        self._checkpointer: asyncio.Task[None] | None = None
        self.recovery_point_interval_s = config["log.recovery.point.interval.ms"] / 1000

    @property
    def advertised(self) -> tuple[str, int]:
        """The first listener's advertised address."""
        return self.advertised_for(self.listener_specs[0].name)

    def advertised_for(self, listener: str) -> tuple[str, int]:
        """What clients that came in on ``listener`` are told to connect to: its advertised
        address, else its bound one (a wildcard host as 127.0.0.1)."""
        named = self._advertised.get(listener)
        if named is not None:
            return named
        host, port = self.bound_listeners.get(listener) or self.bound
        return ("127.0.0.1" if host in WILDCARDS else host, port)

    def advertised_listeners(self) -> dict[str, tuple[str, int]]:
        """Every listener's advertised address (the node registry on etcd records them)."""
        return {ln.name: self.advertised_for(ln.name) for ln in self.listener_specs}

    def plain_refused(self, peer: str, listener: str) -> None:
        """A PLAIN attempt refused because PLAIN_MAX_PENDING derivations are in progress:
        counted, and logged at most once per AUTH_FAILURE_LOG_INTERVAL_S."""
        self.metrics.sasl_plain_refused.inc()
        fields = self._plain_refused_logged.admit(None)
        if fields is not None:
            log.warning("PLAIN authentication throttled: too many password derivations in "
                        "progress; closing unanswered", peer=peer, listener=listener,
                        limit=self.plain_max_pending, **fields)

    def auth_failure_logged(self, peer: str, listener: str, mechanism: str, user: str | None,
                            reason: str, reauth: bool) -> None:
        """A failed SASL authentication: one info line per peer host per 10 s, 20 in all (a
        client retrying a wrong password does not flood the log; the metric counts every one)."""
        fields = self._auth_failures_logged.admit(peer)
        if fields is not None:
            log.info("authentication failed", peer=peer, listener=listener, mechanism=mechanism,
                     user=user, reason=reason, reauthentication=reauth, **fields)

    def closing_logged(self, peer: str, reason: str, level: str = "info", **details: Any) -> None:
        """A connection closed for what its client sent (a bad frame, a malformed header or
        request, a request before authentication) or refused (the connection limit): one info
        line per peer host and reason per 10 s, 20 in all (a flood of garbage connections
        does not flood the log)."""
        fields = self._closes_logged.admit((peer, reason))
        if fields is not None:
            getattr(log, level)(f"closing connection: {reason}", peer=peer, **details, **fields)

    def heartbeat_error(self, req: Any, code: int, message: str) -> Any:
        return Router._hb_error(req, self.heartbeat_interval_ms)(code, message)

    # -- discovery (Metadata, FindCoordinator) ----------------------------------------------------
    def brokers(self, listener: str = "") -> list[tuple[int, str, int]]:
        """(node id, host, port) of every live node (this one on the file store), at its
        address for ``listener`` (the one the request came in on; "": the first)."""
        listener = listener or self.listener_specs[0].name
        if self.cluster is not None:
            return self.cluster.live_nodes(listener)
        return [(kafka_apis.NODE_ID, *self.advertised_for(listener))]

    def controller_id(self) -> int:
        return self.cluster.controller_id() if self.cluster is not None else kafka_apis.NODE_ID

    def locate(self, group_id: str, listener: str = "") -> tuple[int, str, int] | None:
        """The node coordinating ``group_id``: the owner of its partition (None: nobody now),
        at its address for ``listener``."""
        listener = listener or self.listener_specs[0].name
        if self.cluster is not None:
            return self.cluster.locate(partition_for(group_id, len(self.shards)), listener)
        return (kafka_apis.NODE_ID, *self.advertised_for(listener))

    def group_count(self) -> int:
        """Groups hosted by every partition (loaded ones; ``group.max.groups`` counts these)."""
        return sum(len(shard.core.state.groups) for shard in self.shards)

    def _group_rows(self) -> Iterator[tuple[str, str, int]]:
        for shard in list(self.shards):
            if shard.state != ACTIVE:
                continue
            for group_id, g in list(shard.core.state.groups.items()):
                yield group_id, g.state.value, len(g.members)

    def partition_states(self) -> None:
        counts = {"loading": 0, "active": 0, "failed": 0, "unowned": 0}
        for shard in self.shards:
            if shard.state in counts:
                counts[shard.state] += 1
        for state, n in counts.items():
            self.metrics.partition_count.labels(state).set(n)

    # -- connections ------------------------------------------------------------------------------
    def register(self, conn: Connection) -> bool:
        if len(self.connections) >= self.max_connections or self._stopped.is_set():
            return False
        self.connections.add(conn)
        self.metrics.connections.set(len(self.connections))
        return True

    def enter_budget(self) -> None:
        """held_bytes passed queued.max.request.bytes: stop reading every connection that holds
        part of it (a partial frame or queued requests); the others keep being served."""
        self.over_budget = True
        log.warning("queued.max.request.bytes reached: pausing reads", held=self.held_bytes,
                    limit=self.max_held_bytes)
        for conn in list(self.connections):
            if conn.holds_input:
                conn.pause_for_budget()

    def check_budget(self) -> None:
        """Resume the paused connections once held_bytes is back under 3/4 of the budget."""
        if self.held_bytes > self.max_held_bytes * 3 // 4:
            return
        self.over_budget = False
        for conn in list(self.connections):
            conn.resume_after_budget()

    def _read_paused(self) -> int:
        return sum(1 for conn in list(self.connections) if conn.read_paused)

    def unregister(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.metrics.connections.set(len(self.connections))

    async def _probe_loop_lag(self) -> None:
        """The event loop's lag: how much later than asked a sleep returns (a callback holding
        the loop shows here; connect_coordinator_event_loop_lag_seconds and its histogram)."""
        loop = asyncio.get_running_loop()
        gauge, histogram = self.metrics.loop_lag, self.metrics.loop_lag_observed
        while True:
            asked = loop.time()
            await asyncio.sleep(LOOP_LAG_PROBE_S)
            lag = max(0.0, loop.time() - asked - LOOP_LAG_PROBE_S)
            gauge.set(lag)
            histogram.observe(lag)

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout_s / 4))
            self.heap.maybe_trim(time.monotonic())
            for conn in list(self.connections):
                if conn.idle_for > self.idle_timeout_s:
                    log.info("closing idle connection", peer=conn.peer)
                    conn.close()
                elif self.over_budget:
                    conn.check_peer_closed()

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.cluster is not None:
            await self._start_cluster()
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Before anything is written or recovered, and before listening: one daemon per data dir.
        self._lock = datadir.lock_data_dir(self.data_dir)
        self._check_partitions()
        try:
            self.recovery_points = datadir.read_checkpoint(self.data_dir)
        except datadir.BadCheckpoint as exc:
            raise StartupError(str(exc)) from None
        for shard in self.shards:
            shard.store.recovery_point = self.recovery_points.get(shard.partition, 0)
        try:
            await self.security_service.start_file(self.data_dir)
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot load the security log: {exc}") from None
        await self._listen()
        # Only now, listening, is the partition count fixed on disk (before any partition log
        # is written): a first start that failed (a busy port) used to fix it already.
        self._write_partitions_marker()
        self.partition_states()
        await asyncio.gather(*(shard.load() for shard in self.shards))
        self.partition_states()
        if all(shard.state == FAILED for shard in self.shards):
            reasons = "; ".join(f"partition {s.partition}: {s.failure}" for s in self.shards)
            raise StartupError(f"no partition of {self.data_dir} could be loaded: {reasons}")
        self._loaded = True
        await self._write_checkpoint()  # the recovered ends are durable (open() fsyncs them)
        self._checkpointer = asyncio.create_task(self._checkpoint_loop())
        self._reaper = asyncio.create_task(self._reap_idle())
        self._lag_probe = asyncio.create_task(self._probe_loop_lag())

    def _connection(self, served: Served) -> Connection:
        if served.ssl is not None:  # (made at accept, before the TLS handshake)
            self.heap.churn(time.monotonic())
        return Connection(self, served)

    async def _listen(self, serve: bool = True) -> None:
        """Bind every listener (and the metrics endpoint); accept connections at once, or with
        ``serve=False`` only at :meth:`_start_serving` (bound, so the address is known)."""
        loop = asyncio.get_running_loop()
        for spec in self.listener_specs:
            served = self.served[spec.name]
            try:
                server = await loop.create_server(
                    lambda served=served: self._connection(served), spec.host, spec.port,  # type: ignore[misc]
                    reuse_address=True, ssl=served.ssl, start_serving=serve,
                    **({"ssl_handshake_timeout": self.ssl_handshake_timeout_s}
                       if served.ssl is not None else {}))
            except OSError as exc:  # a busy port: name it and the listener
                raise StartupError(f"cannot listen on {_where(spec.host, spec.port)} (listener "
                                   f"{spec.name}): {_why(exc)}") from None
            self._servers.append(server)
            sock = server.sockets[0].getsockname()
            self.bound_listeners[spec.name] = (sock[0], sock[1])
            if self._server is None:
                self._server = server
                self.bound = (sock[0], sock[1])
        for name, served in self.served.items():
            if served.sasl and "PLAIN" in self.config.sasl_mechanisms \
                    and "PLAIN" not in served.mechanisms:
                log.warning("PLAIN is not offered on a listener without TLS (set "
                            "sasl.plain.allow.insecure to offer it)", listener=name)
        metrics_listen = self.config.metrics_listen
        if metrics_listen is not None:
            try:
                server, _thread = start_http_server(metrics_listen[1], metrics_listen[0],
                                                    registry=self.metrics.registry)
            except OSError as exc:  # a busy port: name it
                raise StartupError(f"cannot serve metrics on {_where(*metrics_listen)} "
                                   f"(metrics.listener): {_why(exc)}") from None
            self._metrics_server = server
            self.metrics_bound = (metrics_listen[0], server.server_port)

    async def _start_cluster(self) -> None:
        """store=etcd: no data dir; listen (partitions answer NOT_COORDINATOR until acquired),
        then join the cluster: the placement loop acquires this node's share."""
        # Bound but not accepting yet: the node registers its address, then loads the users and
        # ACLs; only then are connections accepted (before, SASL failed and the authorizer
        # denied everyone but super users for the first moments).
        await self._listen(serve=False)
        self.partition_states()
        await self.cluster.start()
        try:
            await self.security_service.start_etcd(self.cluster)
        except Exception as exc:  # noqa: BLE001 (etcd unreachable, unreadable keys)
            raise StartupError(f"cannot load the security keys from etcd: {exc!r}") from None
        for server in self._servers:
            await server.start_serving()
        self._reaper = asyncio.create_task(self._reap_idle())
        self._lag_probe = asyncio.create_task(self._probe_loop_lag())

    # -- recovery point ---------------------------------------------------------------------------
    def _checkpoint_points(self) -> dict[int, int]:
        """Each partition's durable offset; a partition without a usable log (failed, reloading)
        keeps what the file claimed. Never lower than the file's claim."""
        points = dict(self.recovery_points)
        for shard in self.shards:
            offset = shard.durable_offset
            if offset is not None:
                points[shard.partition] = max(offset, points.get(shard.partition, 0))
        return points

    async def _write_checkpoint(self) -> None:
        points = self._checkpoint_points()
        if points == self.recovery_points and (self.data_dir / datadir.CHECKPOINT_FILE).exists():
            return
        await asyncio.to_thread(datadir.write_checkpoint, self.data_dir, points)
        self.recovery_points = points

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.recovery_point_interval_s)
            try:
                await self._write_checkpoint()
            except OSError as exc:  # the logs keep working; the check just lags behind
                log.error("cannot write the recovery-point checkpoint", error=repr(exc))

    def _check_partitions(self) -> None:
        """The partition count is fixed once data exists (groups would move partition)."""
        marker = self.data_dir / "partitions"
        want = str(len(self.shards))
        if marker.exists():
            have = marker.read_text().strip()
            # A ConfigError (not SystemExit, which exited 1): main_serve reports it as the
            # configuration error it is and exits 2, like any other invalid setting.
            if have != want:
                raise ConfigError(
                    f"{self.data_dir} was created with {have} partitions; "
                    f"--partitions {want} would move groups to other partitions. Use {have}.")
        else:
            existing = sorted(self.data_dir.glob("partition-*"))
            if existing:
                raise ConfigError(
                    f"{self.data_dir} holds partition logs but no "
                    "'partitions' marker file; write the original partition count into it.")

    def _write_partitions_marker(self) -> None:
        marker = self.data_dir / "partitions"
        if marker.exists():
            return
        with open(marker, "w") as f:
            f.write(f"{len(self.shards)}\n")
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # (the entry, before any partition log exists)
        finally:
            os.close(fd)

    def listening(self) -> str:
        """The bound listeners as the banner names them: ``HOST:PORT`` for the PLAINTEXT
        listener, ``NAME://HOST:PORT`` for the others, comma-separated."""
        return ", ".join(describe(ln.name, ln.protocol, *self.bound_listeners[ln.name])
                         for ln in self.listener_specs if ln.name in self.bound_listeners)

    def banner(self) -> str:
        where = self.listening()
        metrics = (f"http://{self.metrics_bound[0]}:{self.metrics_bound[1]}/metrics"
                   if self.metrics_bound else "off")
        if self.cluster is not None:
            return (f"connect-coordinator listening on {where} (metrics {metrics}, "
                    f"data etcd {','.join(self.cluster.endpoints)} prefix {self.cluster.prefix} "
                    f"node {self.cluster.node_id}, {len(self.shards)} partitions)")
        return (f"connect-coordinator listening on {where} (metrics {metrics}, "
                f"data {self.data_dir}, {len(self.shards)} partitions)")

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self, grace_s: float = 10.0) -> None:
        self._stopped.set()
        for server in self._servers:
            server.close()
        if self._reaper is not None:
            self._reaper.cancel()
        if self._lag_probe is not None:
            self._lag_probe.cancel()
        # Let in-flight requests be answered (parked heartbeats are released by the shards).
        deadline = time.monotonic() + grace_s
        if self._checkpointer is not None:
            self._checkpointer.cancel()
        await self.security_service.stop()
        self.plain_executor.shutdown(wait=False, cancel_futures=True)
        if self.cluster is not None:
            # Leave, hand every partition over (commit, answer, release), revoke the lease.
            try:
                await self.cluster.stop()
            except Exception as exc:  # noqa: BLE001 (the lease's TTL frees what is left)
                log.error("leaving the cluster failed", error=repr(exc))
        await asyncio.gather(*(shard.close() for shard in self.shards), return_exceptions=True)
        if self._loaded:  # every log is synced and closed: claim where each one ends
            try:
                await self._write_checkpoint()
            except OSError as exc:
                log.error("cannot write the recovery-point checkpoint", error=repr(exc))
        while any(c.pending for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        if self._metrics_server is not None:
            # Not waited for: shutdown() returns only at serve_forever's next poll, up to 0.5 s
            # later (most of a SIGTERM's time). The socket closes now; the daemon
            # thread ends at that poll or with the process.
            threading.Thread(target=self._metrics_server.shutdown, daemon=True).start()
            self._metrics_server.server_close()
        if self._lock is not None:
            self._lock.release()
        log.info("stopped")


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why(exc: OSError) -> str:
    """``Address already in use`` (uvloop's message repeats the address as a Python tuple)."""
    return os.strerror(exc.errno) if exc.errno else str(exc)


def install_loop() -> str:
    """uvloop when available (1.5-2.4x for many connections here), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


async def run(config: ServerConfig, ready: Callable[[str], None] | None = None,
              cluster: ClusterFactory | None = None) -> None:
    import signal

    server = CoordinatorServer(config, cluster)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, server.request_stop)
    try:
        await server.start()
    except BaseException:
        await server.stop(grace_s=0)
        raise
    line = server.banner()
    (ready or (lambda s: print(s, flush=True)))(line)
    log.info("started", listen=server.listening(), partitions=len(server.shards))
    try:
        await server.serve_forever()
    finally:
        await server.stop()
