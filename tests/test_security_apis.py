"""The five admin APIs' handlers (coordinator/security/apis.py) in process: what each answers
when the principal may not (Kafka's getErrorResponse shapes), refusals of too many items, every
version kio has, and the router's error responses for them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from connect_wire import codec
from connect_wire.apis import APIS
from coordinator import config
from coordinator.security.apis import API_KEYS, SecurityApis
from coordinator.security.model import Authorizer
from coordinator.security.state import SecurityState
from coordinator.security.store import FileSecurityStore
from coordinator.server import kafka_apis
from coordinator.server.app import CoordinatorServer

DENIED = 31


def requests(version: dict[int, int]) -> dict[int, Any]:
    def cls(key: int) -> type:
        return APIS[key].request_class(version.get(key, APIS[key].max_version))
    import importlib

    def mod(key: int) -> Any:
        return importlib.import_module(cls(key).__module__)
    acl = mod(30).AclCreation(resource_type=3, resource_name="g", resource_pattern_type=3,
                              principal="User:w", host="*", operation=3, permission_type=3)
    f = dict(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
             principal_filter=None, host_filter=None, operation=1, permission_type=1)
    return {
        29: cls(29)(**f),
        30: cls(30)(creations=(acl, acl)),
        31: cls(31)(filters=(mod(31).DeleteAclsFilter(**f),)),
        50: cls(50)(users=(mod(50).UserName(name="a"), mod(50).UserName(name="b"))),
        51: cls(51)(deletions=(mod(51).ScramCredentialDeletion(name="a", mechanism=1),),
                    upsertions=(mod(51).ScramCredentialUpsertion(
                        name="b", mechanism=1, iterations=4096, salt=b"s", salted_password=b"p"),)),
    }


def codes(resp: Any) -> list[int]:
    out = [int(getattr(resp, "error_code", 0) or 0)]
    for field in ("results", "filter_results"):
        out += [int(r.error_code) for r in getattr(resp, field, ())]
    return out


@pytest.mark.parametrize("version", [1, 2, 3])
def test_denied_and_allowed(tmp_path: Path, version: int) -> None:
    async def run() -> None:
        state = SecurityState(Authorizer("User:admin"))
        store = FileSecurityStore(tmp_path, state)
        await store.load()
        apis = SecurityApis(state, store, enforce=True, max_items=3)
        router = CoordinatorServer(config.load(None, {"data.dir": str(tmp_path / "data")},
                                               environ={})).router
        reqs = requests({29: version, 30: version, 31: version})
        for key, req in reqs.items():
            v = type(req).__version__
            resp = await apis.handle(key, v, req, "User:bob", "10.0.0.1")
            assert DENIED in codes(resp), (key, resp)
            # every item the request named carries the error (Kafka's getErrorResponse)
            expected = {29: 0, 30: 2, 31: 1, 50: 2, 51: 2}[key]
            items = len(getattr(resp, "results", ()) or getattr(resp, "filter_results", ()))
            assert items == expected
            codec.encode(resp)  # it encodes
            # the router's last-resort error response has the same shape
            same = router.error_response(req, 15, "x")
            assert type(same) is type(resp)
            assert codes(same) == [15 if c == DENIED else c for c in codes(resp)]
            ok = await apis.handle(key, v, req, "User:admin", "10.0.0.1")
            assert DENIED not in codes(ok)
        # 51 as the admin: a is not there (RESOURCE_NOT_FOUND), b's credential is made
        resp = await apis.handle(51, 0, reqs[51], "User:admin")
        assert {r.user: int(r.error_code) for r in resp.results} == {"a": 91, "b": 0}
        assert state.scram_credential("b", "SCRAM-SHA-256") is not None
        # too many items: INVALID_REQUEST on each
        big = type(reqs[30])(creations=reqs[30].creations * 2)
        resp = await apis.handle(30, version, big, "User:admin")
        assert codes(resp) == [0, 42, 42, 42, 42]
        await store.close()
    asyncio.run(run())


def test_not_enforced_and_not_loaded() -> None:
    async def run() -> None:
        state = SecurityState()
        apis = SecurityApis(state, enforce=False, ready_timeout_s=0.05)
        resp = await apis.handle(29, 3, requests({})[29], "User:bob")
        assert int(resp.error_code) == -1 and "not loaded" in resp.error_message
    asyncio.run(run())


def test_every_version_is_served() -> None:
    for key in API_KEYS:
        api = APIS[key]
        for v in range(api.min_version, api.max_version + 1):
            assert api.request_class(v) and api.response_class(v)
    assert kafka_apis.api_versions(3).api_keys  # listed in ApiVersions
    listed = {int(k.api_key) for k in kafka_apis.api_versions(3).api_keys}
    assert API_KEYS <= listed
