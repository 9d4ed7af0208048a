"""Kafka's classic group APIs for classic Kafka Connect workers: JoinGroup (v2-9), SyncGroup
(v0-5), Heartbeat (v0-4) and LeaveGroup (v0-5), protocol type ``connect``. Each request becomes
a plain value for the group core (coordinator.group.classic), which answers plain field values;
the answer is built as the request's version of Kafka's response (kio's classes).

Authorization (``authorizer=acl``): READ on the group, as Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode
from coordinator.group import classic as cl
from coordinator.group.coordinator import RequestContext
from coordinator.runtime.shard import ShardUnavailable
from coordinator.server import kafka_apis

API_KEYS = frozenset({ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
                      ApiKey.SYNC_GROUP})


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000)


def _request(api_key: int, version: int, req: Any) -> Any:
    if api_key == ApiKey.JOIN_GROUP:
        instance_id = getattr(req, "group_instance_id", None) if version >= 5 else None
        return cl.Join(
            group_id=req.group_id, member_id=req.member_id, instance_id=instance_id,
            session_timeout_ms=_ms(req.session_timeout),
            rebalance_timeout_ms=_ms(req.rebalance_timeout),
            protocol_type=req.protocol_type,
            protocols=tuple((p.name, p.metadata) for p in req.protocols),
            requires_member_id=version >= 4)
    if api_key == ApiKey.SYNC_GROUP:
        return cl.Sync(req.group_id, req.generation_id, req.member_id,
                       getattr(req, "group_instance_id", None),
                       getattr(req, "protocol_type", None), getattr(req, "protocol_name", None))
    if api_key == ApiKey.HEARTBEAT:
        return cl.Beat(req.group_id, req.generation_id, req.member_id,
                       getattr(req, "group_instance_id", None))
    if version < 3:
        return cl.Leave(req.group_id, ((req.member_id, None),))
    return cl.Leave(req.group_id, tuple((m.member_id, m.group_instance_id)
                                        for m in req.members))


def _error_values(api_key: int, request: Any, code: int, message: str) -> dict[str, Any]:
    if api_key == ApiKey.JOIN_GROUP:
        return {"error_code": code, "error_message": message, "generation_id": -1,
                "protocol_type": None, "protocol_name": None, "leader": "",
                "member_id": getattr(request, "member_id", ""), "members": []}
    if api_key == ApiKey.SYNC_GROUP:
        return {"error_code": code, "error_message": message, "assignment": b""}
    if api_key == ApiKey.LEAVE_GROUP:
        return {"error_code": code, "error_message": message, "members": []}
    return {"error_code": code, "error_message": message}


def _finish(api_key: int, version: int, values: dict[str, Any]) -> Any:
    cls = APIS[api_key].response_class(version)
    values = dict(values)
    if api_key == ApiKey.JOIN_GROUP and version < 7 and values.get("protocol_name") is None:
        values["protocol_name"] = ""  # (nullable from version 7 only)
    if api_key == ApiKey.LEAVE_GROUP and version < 3:
        members = values.get("members") or []
        if not values.get("error_code") and members:
            values["error_code"] = members[0]["error_code"]
    return kafka_apis.build(cls, {"throttle_time": 0, **values})


def handle(router: Any, api_key: int, version: int, req: Any, ctx: RequestContext) -> Any:
    """The answer to a classic group request (a response, or a future of one)."""
    name = APIS[api_key].name
    group_id = req.group_id
    if router.acl:
        refused = router.denied(ctx, name, "READ", "GROUP", group_id)
        if refused is not None:
            return _finish(api_key, version, _error_values(
                api_key, req, ErrorCode.GROUP_AUTHORIZATION_FAILED, refused))
    value = _request(api_key, version, req)
    fn: Callable[[Any, int], Any]
    if api_key == ApiKey.JOIN_GROUP:
        fn = lambda core, now: core.classic_join(value, now, ctx)  # noqa: E731
    elif api_key == ApiKey.SYNC_GROUP:
        fn = lambda core, now: core.classic_sync(value, now)  # noqa: E731
    elif api_key == ApiKey.HEARTBEAT:
        fn = lambda core, now: core.classic_heartbeat(value, now)  # noqa: E731
    else:
        fn = lambda core, now: core.classic_leave(value, now)  # noqa: E731

    def error(code: int, message: str) -> dict[str, Any]:
        return _error_values(api_key, req, code, message)

    try:
        pending = router.shard_of(group_id).write(fn, error)
    except ShardUnavailable as exc:
        return _finish(api_key, version, error(exc.code, exc.message))

    async def answer() -> Any:
        try:
            values = await pending
        except ShardUnavailable as exc:
            values = error(exc.code, exc.message)
        return _finish(api_key, version, values)
    return asyncio.ensure_future(answer())
