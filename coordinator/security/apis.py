"""The five admin APIs of credentials and ACLs, as a Kafka broker answers them.

=====================================  ====  ========  ======================================
API                                    key   versions  needs
=====================================  ====  ========  ======================================
DescribeAcls                           29    1-3       DESCRIBE on the cluster
CreateAcls                             30    1-3       ALTER on the cluster
DeleteAcls                             31    1-3       ALTER on the cluster
DescribeUserScramCredentials           50    0         DESCRIBE on the cluster
AlterUserScramCredentials              51    0         ALTER on the cluster
=====================================  ====  ========  ======================================

(kio 0.6.5 has these versions; Kafka 4 dropped the ACL APIs' v0 as well.)

A request that is not authorized is answered CLUSTER_AUTHORIZATION_FAILED with a message naming
the principal (Kafka's ``getErrorResponse``: the top-level error where the response has one,
else the error on every item), logged with the principal and host. The semantics of each API
are :class:`coordinator.security.state.SecurityState`'s; a change is answered only once the
store has made it durable (:class:`coordinator.security.store.SecurityStore`). Changes are
serialised on a node (one at a time), so each is checked against the state the previous ones
left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from connect_wire.apis import APIS
from coordinator import logs
from coordinator.logs import LogLimiter
from coordinator.security import ANONYMOUS, CLUSTER_NAME
from coordinator.security.model import (
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from coordinator.security.state import ScramUpsertion, SecurityState
from coordinator.security.store import SecurityStore, SecurityStoreError
from coordinator.server.kafka_apis import build as _build

log = logs.get("coordinator.security")

DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51
API_KEYS = frozenset({DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS, DESCRIBE_USER_SCRAM_CREDENTIALS,
                      ALTER_USER_SCRAM_CREDENTIALS})
"""The API keys this module answers."""

CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
UNKNOWN_SERVER_ERROR = -1
_NEEDS = {
    DESCRIBE_ACLS: Operation.DESCRIBE,
    CREATE_ACLS: Operation.ALTER,
    DELETE_ACLS: Operation.ALTER,
    DESCRIBE_USER_SCRAM_CREDENTIALS: Operation.DESCRIBE,
    ALTER_USER_SCRAM_CREDENTIALS: Operation.ALTER,
}


def _alter_users(request: Any) -> list[str]:
    """The distinct users an AlterUserScramCredentials request names, in order."""
    names = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    return list(dict.fromkeys(names))


def error_response(cls: type, request: Any | None, code: int, message: str) -> Any:
    """A response of ``cls`` (one of the five APIs) carrying ``code`` as Kafka's
    ``getErrorResponse`` does: top-level where the response has an error, and on every item
    the request named (``request`` None: no items)."""
    api_key = cls.__api_key__
    values: dict[str, Any] = {"throttle_time": 0}
    if api_key == DESCRIBE_ACLS:
        values.update(error_code=code, error_message=message, resources=[])
    elif api_key == CREATE_ACLS:
        values["results"] = [{"error_code": code, "error_message": message}
                             for _ in (request.creations if request is not None else ())]
    elif api_key == DELETE_ACLS:
        values["filter_results"] = [
            {"error_code": code, "error_message": message, "matching_acls": []}
            for _ in (request.filters if request is not None else ())]
    elif api_key == DESCRIBE_USER_SCRAM_CREDENTIALS:
        users = list(dict.fromkeys(u.name for u in (request.users or ()))) if request else []
        values.update(error_code=code, error_message=message, results=[
            {"user": u, "error_code": code, "error_message": message, "credential_infos": []}
            for u in users])
    elif api_key == ALTER_USER_SCRAM_CREDENTIALS:
        values["results"] = [{"user": u, "error_code": code, "error_message": message}
                             for u in (_alter_users(request) if request is not None else ())]
    else:
        raise KeyError(api_key)
    return _build(cls, values)


def _items(api_key: int, request: Any) -> int:
    if api_key == CREATE_ACLS:
        return len(request.creations)
    if api_key == DELETE_ACLS:
        return len(request.filters)
    if api_key == DESCRIBE_USER_SCRAM_CREDENTIALS:
        return len(request.users or ())
    if api_key == ALTER_USER_SCRAM_CREDENTIALS:
        return len(request.deletions) + len(request.upsertions)
    return 1


def binding_of(creation: Any) -> AclBinding:
    """An AclCreation of CreateAcls as a binding (unknown codes become UNKNOWN)."""
    return AclBinding(
        ResourcePattern(ResourceType.from_code(creation.resource_type), creation.resource_name,
                        PatternType.from_code(creation.resource_pattern_type)),
        AccessControlEntry(creation.principal, creation.host,
                           Operation.from_code(creation.operation),
                           Permission.from_code(creation.permission_type)))


def filter_of(f: Any) -> AclBindingFilter:
    """A DescribeAcls request or a DeleteAclsFilter as Kafka's AclBindingFilter."""
    return AclBindingFilter(
        ResourcePatternFilter(ResourceType.from_code(f.resource_type_filter),
                              f.resource_name_filter,
                              PatternType.from_code(f.pattern_type_filter)),
        AccessControlEntryFilter(f.principal_filter, f.host_filter,
                                 Operation.from_code(f.operation),
                                 Permission.from_code(f.permission_type)))


def _acl_dict(acl: AclBinding) -> dict[str, Any]:
    return {"principal": acl.entry.principal, "host": acl.entry.host,
            "operation": int(acl.entry.operation), "permission_type": int(acl.entry.permission)}


class SecurityApis:
    """Answers the five APIs from ``state``, changing it through ``store``.

    ``handle(api_key, version, request, principal, host)`` returns a coroutine of the response.
    ``max_items``: a request naming more users, ACLs or filters is refused (INVALID_REQUEST on
    each), as ``request.max.items`` does for Kafka's other APIs. ``on_denied(principal, host,
    api name)`` is called for each denial (metrics); a denial is logged at most once per 10 s
    per principal, host and API, 20 lines per 10 s in all.
    """

    def __init__(self, state: SecurityState, store: SecurityStore | None = None, *,
                 enforce: bool = True, max_items: int = 10_000,
                 on_denied: Callable[[str, str, str], None] | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 ready_timeout_s: float = 10.0) -> None:
        self.state = state
        self.store = store
        self.enforce = enforce
        """False (``authorizer=none``): every request is allowed, as Kafka without an
        authorizer (which answers these APIs SECURITY_DISABLED; here they work, so that ACLs
        can be set up before the authorizer is turned on)."""
        self.max_items = max_items
        self.on_denied = on_denied
        self._denials_logged = LogLimiter(10.0)
        self.clock_ms = clock_ms
        self.ready_timeout_s = ready_timeout_s
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()
        if store is not None:
            self.attach(store)

    def attach(self, store: SecurityStore) -> None:
        """The store, once built (requests wait for it and for its load, at most
        ``ready_timeout_s``)."""
        self.store = store
        self._ready.set()

    async def _loaded(self) -> SecurityStore | None:
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                await self._ready.wait()
                assert self.store is not None
                await self.store.loaded.wait()
        except TimeoutError:
            return None
        return self.store

    async def handle(self, api_key: int, version: int, request: Any,
                     principal: str = ANONYMOUS, host: str = "") -> Any:
        cls = APIS[api_key].response_class(version)
        name = APIS[api_key].name
        operation = _NEEDS[api_key]
        store = await self._loaded()
        if store is None:
            return error_response(cls, request, UNKNOWN_SERVER_ERROR,
                                  "the security state is not loaded yet; try again")
        decision = self.state.decide(principal, host, operation, ResourceType.CLUSTER,
                                     CLUSTER_NAME)
        if self.enforce and not decision.allowed:
            fields = self._denials_logged.admit((principal, host, name))
            if fields is not None:
                log.warning("authorization failed", principal=principal, host=host, api=name,
                            operation=operation.name, resource=f"CLUSTER:{CLUSTER_NAME}",
                            reason=decision.reason, **fields)
            if self.on_denied is not None:
                self.on_denied(principal, host, name)
            return error_response(
                cls, request, CLUSTER_AUTHORIZATION_FAILED,
                f"Principal {principal} (host {host or 'unknown'}) is not authorized to "
                f"{operation.name} the cluster ({name} needs {operation.name} on CLUSTER "
                f"{CLUSTER_NAME})")
        items = _items(api_key, request)
        if items > self.max_items:
            return error_response(cls, request, INVALID_REQUEST,
                                  f"{items} items in one request, more than "
                                  f"request.max.items={self.max_items}")
        if api_key == DESCRIBE_ACLS:
            return self.describe_acls(cls, request)
        if api_key == DESCRIBE_USER_SCRAM_CREDENTIALS:
            return self.describe_users(cls, request)
        async with self._lock:
            try:
                if api_key == CREATE_ACLS:
                    return await self.create_acls(cls, request, principal, store)
                if api_key == DELETE_ACLS:
                    return await self.delete_acls(cls, request, principal, store)
                return await self.alter_users(cls, request, principal, store)
            except SecurityStoreError as exc:
                log.error("security change not stored", api=name, principal=principal,
                          error=str(exc))
                return error_response(cls, request, exc.code, str(exc))

    # -- reads ------------------------------------------------------------------------------------
    def describe_acls(self, cls: type, request: Any) -> Any:
        result, acls = self.state.describe_acls(filter_of(request))
        if result.code:
            return _build(cls, {"throttle_time": 0, "error_code": result.code,
                                "error_message": result.message, "resources": []})
        by_pattern: dict[ResourcePattern, list[AclBinding]] = {}
        for acl in acls:
            by_pattern.setdefault(acl.pattern, []).append(acl)
        return _build(cls, {"throttle_time": 0, "error_code": 0, "error_message": None,
                            "resources": [
                                {"resource_type": int(p.resource_type), "resource_name": p.name,
                                 "pattern_type": int(p.pattern_type),
                                 "acls": [_acl_dict(a) for a in group]}
                                for p, group in by_pattern.items()]})

    def describe_users(self, cls: type, request: Any) -> Any:
        users = None if request.users is None else [u.name for u in request.users]
        described = self.state.describe_scram_credentials(users)
        return _build(cls, {"throttle_time": 0, "error_code": 0, "error_message": None,
                            "results": [
                                {"user": d.user, "error_code": d.code, "error_message": d.message,
                                 "credential_infos": [{"mechanism": m, "iterations": i}
                                                      for m, i in d.credentials]}
                                for d in described]})

    # -- changes ----------------------------------------------------------------------------------
    async def create_acls(self, cls: type, request: Any, principal: str,
                         store: SecurityStore) -> Any:
        acls = [binding_of(c) for c in request.creations]
        results, records = self.state.create_acls(acls, self.clock_ms())
        if records:
            await store.apply(records)
            log.info("acls created", principal=principal,
                     acls=[str(a) for a, r in zip(acls, results, strict=True) if not r.code])
        return _build(cls, {"throttle_time": 0, "results": [
            {"error_code": r.code, "error_message": r.message} for r in results]})

    async def delete_acls(self, cls: type, request: Any, principal: str,
                         store: SecurityStore) -> Any:
        results, records = self.state.delete_acls([filter_of(f) for f in request.filters])
        if records:
            await store.apply(records)
            log.info("acls deleted", principal=principal,
                     acls=sorted({str(a) for r in results for a in r.deleted}))
        return _build(cls, {"throttle_time": 0, "filter_results": [
            {"error_code": r.code, "error_message": r.message, "matching_acls": [
                {"error_code": 0, "error_message": None,
                 "resource_type": int(a.pattern.resource_type), "resource_name": a.pattern.name,
                 "pattern_type": int(a.pattern.pattern_type), **_acl_dict(a)}
                for a in r.deleted]}
            for r in results]})

    async def alter_users(self, cls: type, request: Any, principal: str,
                         store: SecurityStore) -> Any:
        results, records = self.state.alter_scram_credentials(
            [(d.name, int(d.mechanism)) for d in request.deletions],
            [ScramUpsertion(u.name, int(u.mechanism), int(u.iterations), bytes(u.salt),
                            bytes(u.salted_password)) for u in request.upsertions])
        if records:
            await store.apply(records)
            log.info("scram credentials altered", principal=principal,
                     deleted=[d.name for d in request.deletions],
                     upserted=[u.name for u in request.upsertions],
                     refused=[r.user for r in results if r.code])
        return _build(cls, {"throttle_time": 0, "results": [
            {"user": r.user, "error_code": r.code, "error_message": r.message}
            for r in results]})
