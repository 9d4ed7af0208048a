"""The classic group APIs over TCP against a real daemon, every version served: JoinGroup v2-9,
SyncGroup v0-5, Heartbeat v0-4, LeaveGroup v0-5 (kio's request classes), bad input answered
with Kafka's error codes and the group unharmed; ApiVersions lists them."""

from __future__ import annotations

import datetime
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connect_wire import classic_connect as cc
from connect_wire.apis import APIS, ApiKey
from connect_wire.errors import ErrorCode as E
from coordinator.admin import AdminClient
from tests.daemon_fixture import Daemon, DaemonPool


def kio(module: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{module}.v{version}.{kind}")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with DaemonPool(tmp_path) as pool:
        yield pool.start()


def meta(url: str = "http://w:8083") -> bytes:
    return cc.encode_metadata(cc.WorkerMetadata(2, url, 0, None))


def join(c: AdminClient, version: int, member_id: str = "", protocol_type: str = "connect",
         protocols: tuple[tuple[str, bytes], ...] | None = None, group: str = "g",
         instance_id: str | None = None) -> Any:
    m = kio("join_group", version)
    fields: dict[str, Any] = dict(
        group_id=group, session_timeout=datetime.timedelta(seconds=6),
        rebalance_timeout=datetime.timedelta(seconds=10), member_id=member_id,
        protocol_type=protocol_type,
        protocols=tuple(m.JoinGroupRequestProtocol(name=n, metadata=b)
                        for n, b in (protocols or (("sessioned", meta()),))))
    if version >= 5:
        fields["group_instance_id"] = instance_id
    return c.call(m.JoinGroupRequest(**fields))


def test_every_version_served(daemon: Daemon) -> None:
    with AdminClient(daemon.host, daemon.port, timeout_s=5) as c:
        listed = {int(a.api_key): (int(a.min_version), int(a.max_version))
                  for a in c.call(APIS[ApiKey.API_VERSIONS].request_class(3)(
                      client_software_name="t", client_software_version="1")).api_keys}
        assert listed[11] == (2, 9) and listed[12] == (0, 4) and listed[13] == (0, 5) \
            and listed[14] == (0, 5)
        for version in range(2, 10):
            r = join(c, version, group=f"g{version}")
            if version >= 4:
                assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id
                r = join(c, version, r.member_id, group=f"g{version}")
            assert r.error_code == 0, (version, r)
            assert r.protocol_name == "sessioned" and r.leader == "" and not r.members
            mid, gen = r.member_id, r.generation_id
            sync_v = min(version - 2, 5) if version < 7 else 5
            s = kio("sync_group", sync_v)
            sreq: dict[str, Any] = dict(group_id=f"g{version}", generation_id=gen,
                                        member_id=mid, assignments=())
            if sync_v >= 3:
                sreq["group_instance_id"] = None
            sr = c.call(s.SyncGroupRequest(**sreq))
            assert sr.error_code == 0, sr
            assert cc.decode_assignment(sr.assignment).version == 2
            hb_v = min(version - 2, 4)
            h = kio("heartbeat", hb_v)
            hreq: dict[str, Any] = dict(group_id=f"g{version}", generation_id=gen, member_id=mid)
            if hb_v >= 3:
                hreq["group_instance_id"] = None
            assert c.call(h.HeartbeatRequest(**hreq)).error_code == 0
            assert c.call(h.HeartbeatRequest(**{**hreq, "generation_id": gen - 1})).error_code \
                == E.ILLEGAL_GENERATION
            leave_v = min(version - 4, 5) if version >= 4 else version - 2
            lg = kio("leave_group", leave_v)
            if leave_v < 3:
                lr = c.call(lg.LeaveGroupRequest(group_id=f"g{version}", member_id=mid))
                assert lr.error_code == 0, lr
            else:
                ident: dict[str, Any] = dict(member_id=mid, group_instance_id=None)
                lr = c.call(lg.LeaveGroupRequest(group_id=f"g{version}", members=(
                    lg.MemberIdentity(**ident), lg.MemberIdentity(member_id="ghost",
                                                                  group_instance_id=None))))
                assert lr.error_code == 0
                assert [int(m.error_code) for m in lr.members] == [0, E.UNKNOWN_MEMBER_ID]
            assert c.call(h.HeartbeatRequest(**hreq)).error_code == E.UNKNOWN_MEMBER_ID


def test_bad_input_gets_kafkas_errors_and_the_group_is_unharmed(daemon: Daemon) -> None:
    with AdminClient(daemon.host, daemon.port, timeout_s=5) as c:
        r = join(c, 9, instance_id="i1")
        assert r.error_code == 0
        mid, gen = r.member_id, r.generation_id
        for kw in ({"protocol_type": "consumer"},
                   {"protocols": (("range", b"\x00\x01"),)},
                   {"protocols": (("sessioned", b"\x00\x02garbage"),)},
                   {"protocols": (("default", meta() + b"trailing"),)}):
            bad = join(c, 9, member_id=mid, instance_id="i1", **kw)
            assert bad.error_code == E.INCONSISTENT_GROUP_PROTOCOL, (kw, bad)
        assert join(c, 9, member_id="someone", instance_id="i1").error_code in (
            E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID)
        bad = join(c, 9, group="")
        assert bad.error_code == E.INVALID_GROUP_ID
        h = kio("heartbeat", 4)
        assert c.call(h.HeartbeatRequest(group_id="g", generation_id=gen, member_id=mid,
                                         group_instance_id="i1")).error_code == 0
        assert c.call(h.HeartbeatRequest(group_id="g", generation_id=gen, member_id=mid,
                                         group_instance_id="other")).error_code \
            == E.UNKNOWN_MEMBER_ID
        s = kio("sync_group", 5)
        sr = c.call(s.SyncGroupRequest(group_id="g", generation_id=gen, member_id=mid,
                                       group_instance_id="i1", protocol_type="consumer",
                                       protocol_name="range", assignments=()))
        assert sr.error_code == E.INCONSISTENT_GROUP_PROTOCOL
        sr = c.call(s.SyncGroupRequest(group_id="g", generation_id=gen, member_id=mid,
                                       group_instance_id="i1", protocol_type="connect",
                                       protocol_name="sessioned", assignments=()))
        assert sr.error_code == 0 and sr.protocol_name == "sessioned"
    assert daemon.alive()
