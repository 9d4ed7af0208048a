"""DescribeConfigs (API 32, v1-4) and IncrementalAlterConfigs (API 44, v0-1) for resource type
GROUP (32): a group's dynamic configs, as Kafka 4 serves its consumer groups' (KIP-848).

The configs are ``connect.session.timeout.ms`` and ``connect.heartbeat.interval.ms``
(coordinator.group.config): each resource goes to its group's partition (the shard), which
validates the change and stores it as a GroupConfiguration record of the group. A group that does
not exist describes the defaults; a SET on it creates it.

Any node answers, as any Kafka broker does (Kafka's admin clients send these requests to any
broker and do not retry NOT_COORDINATOR for them). With several nodes (``store = "etcd"``) a
resource whose partition another node owns is checked here first (ACL on the client's principal,
the request's own errors) and then forwarded, alone, to the owner over a PLAINTEXT listener (the
one the request came in on, else the first PLAINTEXT listener): the owner's answer for that
resource is the answer. The owner authorizes the forwarded request again, as the forwarding
connection's principal (``User:ANONYMOUS``), so a forward never allows more than a direct
request would. A forward is never forwarded again (its client id says it is one), is bounded by
:data:`FORWARD_TIMEOUT_S`, and when it cannot be made (no owner now, no PLAINTEXT listener, the
owner unreachable) that resource is NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE with a message
saying why.

Every resource is answered on its own, never the whole request failed:

* DescribeConfigs: DESCRIBE_CONFIGS on the group (else GROUP_AUTHORIZATION_FAILED); an empty
  group name is INVALID_REQUEST ("Group name must not be empty"); every group config, the
  overrides with source GROUP_CONFIG (8), the rest DEFAULT_CONFIG (5), read-only false, type INT
  (v3+), synonyms when asked (the override, then the daemon setting it defaults to), the
  documentation when asked.
* IncrementalAlterConfigs: ALTER_CONFIGS on the group; a resource named twice or a key named
  twice in one resource is INVALID_REQUEST (Kafka's messages); SET and DELETE (back to the
  default); APPEND and SUBTRACT INVALID_CONFIG (no group config is a LIST); a null SET
  INVALID_CONFIG; an unknown name or a value out of the daemon's bounds INVALID_CONFIG; an empty
  group name INVALID_REQUEST ("Default group resources are not allowed."); ``ValidateOnly``
  checks and writes nothing.
* Other resource types: this daemon hosts no topics (TOPIC: UNKNOWN_TOPIC_OR_PARTITION, as a
  broker answers a topic it does not have) and has no broker configs to serve (any other type:
  INVALID_REQUEST saying so).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from connect_wire.krpc import KrpcConnection
from coordinator.group.config import GROUP_CONFIG_DEFAULTS, GROUP_CONFIG_DOCS, GROUP_OVERRIDES
from coordinator.runtime.partitioner import partition_for
from coordinator.runtime.shard import ShardUnavailable
from coordinator.server import kafka_apis

API_KEYS = frozenset({ApiKey.DESCRIBE_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS})

TOPIC, BROKER, GROUP = 2, 4, 32
TYPE_NAMES = {0: "UNKNOWN", 2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER", 16: "CLIENT_METRICS",
              32: "GROUP"}
DEFAULT_CONFIG, GROUP_CONFIG = 5, 8  # DescribeConfigsResponse.ConfigSource
INT = 3  # DescribeConfigsResponse.ConfigType
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # AlterConfigOp.OpType

FORWARD_CLIENT_ID = "connect-coordinator-forward"
"""The client id of a request one node forwards to the owner of a group (never forwarded again)."""
FORWARD_TIMEOUT_S = 5.0
"""The most a forward may take, connecting included (the owner then answers from memory or after
one etcd commit: milliseconds)."""


def _not_served(resource_type: int, name: str) -> tuple[int, str]:
    if resource_type == TOPIC:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, \
            f"The topic '{name}' does not exist: connect-coordinator hosts no topics."
    kind = TYPE_NAMES.get(resource_type, "UNKNOWN")
    return ErrorCode.INVALID_REQUEST, (
        f"Unexpected resource type {kind} ({resource_type}): connect-coordinator serves the "
        "configs of groups only (resource type GROUP, 32).")


async def handle(router: Any, api_key: int, version: int, req: Any, ctx: Any) -> Any:
    cls = APIS[api_key].response_class(version)
    limit = router.server.max_request_items
    if len(req.resources) > limit:
        message = (f"{len(req.resources)} resources in one request, more than "
                   f"request.max.items={limit}")
        return await _refused(cls, req.resources, message)
    if api_key == ApiKey.DESCRIBE_CONFIGS:
        results = await asyncio.gather(*(_describe(router, r, req, ctx) for r in req.resources))
        return kafka_apis.build(cls, {"throttle_time": 0, "results": results})
    named = Counter((r.resource_type, r.resource_name) for r in req.resources)

    async def answer(r: Any) -> dict[str, Any]:
        code: int
        message: str | None
        if named[(r.resource_type, r.resource_name)] > 1:
            code, message = ErrorCode.INVALID_REQUEST, "Each resource must appear at most once."
        else:
            code, message = await _alter(router, r, req, ctx)
        return {"error_code": code, "error_message": message,
                "resource_type": r.resource_type, "resource_name": r.resource_name}
    responses = await asyncio.gather(*(answer(r) for r in req.resources))
    return kafka_apis.build(cls, {"throttle_time": 0, "responses": responses})


def _refused(cls: type, resources: Any, message: str) -> Any:
    """Every resource INVALID_REQUEST (request.max.items), encoded a key at a time."""
    field = "results" if cls.__api_key__ == ApiKey.DESCRIBE_CONFIGS else "responses"
    types = iter([r.resource_type for r in resources])

    def variant(resource_type: int) -> Any:
        return lambda name: kafka_apis.build(cls, {"throttle_time": 0, field: [{
            "error_code": ErrorCode.INVALID_REQUEST, "error_message": message,
            "resource_type": resource_type, "resource_name": name, "configs": []}]})
    variants = {t: variant(t) for t in {r.resource_type for r in resources}}
    return kafka_apis.refuse_items_async(
        variant(GROUP), field, [r.resource_name for r in resources], ErrorCode.INVALID_REQUEST,
        variants=variants, pick=lambda _name: next(types))


async def _describe(router: Any, r: Any, req: Any, ctx: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"error_code": 0, "error_message": None,
                             "resource_type": r.resource_type, "resource_name": r.resource_name,
                             "configs": []}
    if r.resource_type != GROUP:
        entry["error_code"], entry["error_message"] = _not_served(r.resource_type,
                                                                  r.resource_name)
        return entry
    name = r.resource_name
    refused = router.denied(ctx, "DescribeConfigs", "DESCRIBE_CONFIGS", "GROUP", name) \
        if router.acl else None
    if refused is not None:
        entry["error_code"], entry["error_message"] = ErrorCode.GROUP_AUTHORIZATION_FAILED, refused
        return entry
    if not name:
        entry["error_code"], entry["error_message"] = (ErrorCode.INVALID_REQUEST,
                                                       "Group name must not be empty")
        return entry
    try:
        try:
            overrides, defaults = await router.shard_of(name).read(
                lambda core: (core.group_configs(name), core.config.group_defaults()))
        except ShardUnavailable as exc:
            # (the same version's entity: encoded as the owner gave it)
            return await _forward(router, req, r, ctx, exc)  # type: ignore[no-any-return]
    except ShardUnavailable as exc:
        entry["error_code"], entry["error_message"] = exc.code, exc.message
        return entry
    keys = r.configuration_keys
    configs = []
    for key in GROUP_OVERRIDES:
        if keys is not None and key not in keys:  # (null: every config)
            continue
        default = str(defaults[key])
        value = overrides.get(key)
        synonyms = []
        if getattr(req, "include_synonyms", False):
            if value is not None:
                synonyms.append({"name": key, "value": value, "source": GROUP_CONFIG})
            synonyms.append({"name": GROUP_CONFIG_DEFAULTS[key], "value": default,
                             "source": DEFAULT_CONFIG})
        configs.append({
            "name": key, "value": default if value is None else value, "read_only": False,
            "config_source": DEFAULT_CONFIG if value is None else GROUP_CONFIG,
            "is_default": value is None, "is_sensitive": False, "synonyms": synonyms,
            "config_type": INT,
            "documentation": GROUP_CONFIG_DOCS[key]
            if getattr(req, "include_documentation", False) else None,
        })
    entry["configs"] = configs
    return entry


async def _alter(router: Any, r: Any, req: Any, ctx: Any) -> tuple[int, str | None]:
    if r.resource_type != GROUP:
        return _not_served(r.resource_type, r.resource_name)
    if len({c.name for c in r.configs}) != len(r.configs):
        return ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys"
    name = r.resource_name
    refused = router.denied(ctx, "IncrementalAlterConfigs", "ALTER_CONFIGS", "GROUP", name) \
        if router.acl else None
    if refused is not None:
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, refused
    changes: dict[str, str | None] = {}
    for c in r.configs:
        op = c.config_operation
        if op in (APPEND, SUBTRACT):
            return ErrorCode.INVALID_CONFIG, (
                f"Can't {'APPEND' if op == APPEND else 'SUBTRACT'} to key {c.name} because its "
                "type is not LIST.")
        if op == SET:
            if c.value is None:
                return ErrorCode.INVALID_CONFIG, "Null value not supported for group configs"
            changes[c.name] = c.value
        elif op == DELETE:
            changes[c.name] = None
        else:
            return ErrorCode.INVALID_REQUEST, f"Unknown alter config operation {op} for key {c.name}"
    if not name:  # (checked by the core as well; answered here without a shard)
        return ErrorCode.INVALID_REQUEST, "Default group resources are not allowed."

    def error(code: int, message: str) -> tuple[int, str]:
        return code, message
    validate_only = req.validate_only
    try:
        try:
            code, message = await router.shard_of(name).write(
                lambda core, now: core.alter_group_config(name, changes, now, validate_only),
                error)
            return code, message
        except ShardUnavailable as exc:
            result = await _forward(router, req, r, ctx, exc)
            return int(result.error_code), result.error_message
    except ShardUnavailable as exc:
        return exc.code, exc.message


def _forward_listener(server: Any, ctx: Any) -> str | None:
    """The listener a forward goes to: the request's own if it is PLAINTEXT, else the first
    PLAINTEXT one (None: there is none, and this node has no credentials of its own)."""
    plain = [ln.name for ln in server.listener_specs if ln.protocol == "PLAINTEXT"]
    if ctx.listener in plain:
        return str(ctx.listener)
    return plain[0] if plain else None


async def _forward(router: Any, req: Any, r: Any, ctx: Any, unavailable: ShardUnavailable) -> Any:
    """The owner's answer for the resource ``r`` (whose partition this node does not own) of
    ``req``, sent to it alone; raises ShardUnavailable (``unavailable`` itself when there is
    nowhere to forward)."""
    server = router.server
    cluster = server.cluster
    if (cluster is None or unavailable.code != ErrorCode.NOT_COORDINATOR
            or ctx.client_id == FORWARD_CLIENT_ID):
        raise unavailable
    listener = _forward_listener(server, ctx)
    if listener is None:
        raise ShardUnavailable(unavailable.code, (
            f"{unavailable.message}; requests for it are forwarded to its owner over a PLAINTEXT "
            "listener and this node has none: send this request to the group's coordinator "
            "(FindCoordinator)"))
    owner = cluster.locate(partition_for(r.resource_name, len(server.shards)), listener)
    if owner is None or str(owner[0]) == cluster.node_id:
        raise ShardUnavailable(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               f"{unavailable.message}, and no other node owns it now (it is "
                               "moving): retry")
    node, host, port = owner
    if (host, port) == server.advertised_for(listener):
        raise ShardUnavailable(unavailable.code, (
            f"{unavailable.message}; its owner, node {node}, advertises the same address as "
            f"this node for listener {listener} ({host}:{port}), so it cannot be forwarded "
            "there: set advertised.listeners, or send this request to the group's coordinator"))
    conn = KrpcConnection(host, port, FORWARD_CLIENT_ID)
    try:
        async with asyncio.timeout(FORWARD_TIMEOUT_S):
            await conn.open(FORWARD_TIMEOUT_S)
            answer = await conn.request(dataclasses.replace(req, resources=(r,)),
                                        FORWARD_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 (unreachable, timed out, refused, unreadable)
        server.metrics.group_config_forwards.labels("failed").inc()
        raise ShardUnavailable(ErrorCode.COORDINATOR_NOT_AVAILABLE, (
            f"the group's coordinator is node {node} ({host}:{port}) and forwarding this "
            f"request to it failed: {exc}; retry")) from None
    finally:
        conn.close()
    server.metrics.group_config_forwards.labels("ok").inc()
    (item,) = answer.results if req.__api_key__ == ApiKey.DESCRIBE_CONFIGS else answer.responses
    if item.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED:
        item = dataclasses.replace(item, error_message=(
            f"forwarded to the group's coordinator, node {node}, which refused this node's "
            f"forwarding connection (listener {listener}): {item.error_message}"))
    return item
