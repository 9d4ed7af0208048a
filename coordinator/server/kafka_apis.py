"""Answers to the Kafka APIs the daemon speaks so that Kafka tooling and clients can bootstrap:
ApiVersions, Metadata (this node as the only broker, no topics), FindCoordinator (v0-v3 single
key, v4+ batched ``CoordinatorKeys``; key type 0 = group), ListGroups (v5 ``TypesFilter``) and
DescribeGroups. The classes are kio's own, per version; :func:`build` fills a response of any
version from one dict of values, dropping what that version does not have.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import MISSING, fields, is_dataclass
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

from kio.schema.errors import ErrorCode as KioErrorCode
from kio.static.primitive import i32Timedelta, i64Timedelta

from connect_wire import classic_connect, codec
from connect_wire.apis import APIS
from connect_wire.errors import ErrorCode
from connect_wire.items import Item

CLUSTER_ID = "connect-coordinator"
NODE_ID = 0
DENIED = ("denied",)  # find_coordinator: a key the authorizer refused (spliced answers)


def _kio_error(code: int) -> KioErrorCode:
    try:
        return KioErrorCode(code)
    except ValueError:
        return KioErrorCode.unknown_server_error


def _convert(tp: Any, kafka_type: str | None, value: Any) -> Any:
    origin = get_origin(tp)
    if origin is UnionType:
        if value is None:
            return None
        tp = next(a for a in get_args(tp) if a is not NoneType)
        origin = get_origin(tp)
    if origin is tuple:
        inner = get_args(tp)[0]
        return tuple(_convert(inner, kafka_type, v) for v in value)
    if is_dataclass(tp):
        return value if isinstance(value, tp) else build(tp, value)  # type: ignore[arg-type]
    if kafka_type == "error_code":
        return _kio_error(int(value))
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(datetime.timedelta(milliseconds=int(value)))
    if kafka_type == "timedelta_i64":
        return i64Timedelta.parse(datetime.timedelta(milliseconds=int(value)))
    return value


def _implicit(tp: Any, kafka_type: str | None) -> Any:
    origin = get_origin(tp)
    if origin is UnionType:
        return None
    if origin is tuple:
        return ()
    if is_dataclass(tp):
        return build(tp, {})  # type: ignore[arg-type]
    return {
        "error_code": KioErrorCode.none,
        "timedelta_i32": i32Timedelta.parse(datetime.timedelta(0)),
        "timedelta_i64": i64Timedelta.parse(datetime.timedelta(0)),
        "string": "",
        "bytes": b"",
        "bool": False,
        "uuid": uuid.UUID(int=0),
    }.get(kafka_type or "", 0)


def build(cls: type, values: dict[str, Any]) -> Any:
    """An instance of kio class ``cls`` from ``values`` (missing fields: their defaults)."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        if f.name in values:
            kwargs[f.name] = _convert(f.type, kafka_type, values[f.name])
        elif f.default is MISSING and f.default_factory is MISSING:
            kwargs[f.name] = _implicit(f.type, kafka_type)
    return cls(**kwargs)


@functools.lru_cache(maxsize=64)
def api_versions(version: int, error: int = 0) -> Any:
    """The ApiVersionsResponse (immutable, so built once per version and error: building it by
    reflection took ~110 µs, more than a heartbeat round trip)."""
    cls = APIS[18].response_class(min(version, 3) if error == 0 else 0)
    return build(cls, {
        "error_code": error,
        "api_keys": [
            {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
            for a in sorted(APIS.values(), key=lambda a: a.key)
        ],
        "throttle_time": 0,
    })


Node = tuple[int, str, int]
"""(node id, host, port) of a coordinator node."""


def metadata(cls: type, request: Any, brokers: list[Node], controller_id: int = NODE_ID) -> Any:
    """Every live coordinator node as a broker (one on the file store)."""
    requested = getattr(request, "topics", None) or ()
    version = cls.__version__
    # Kafka (KafkaApis.handleTopicMetadataRequest): topic names cannot be null before v12 (the
    # response's name is not nullable there; a null name made the encoder raise and the
    # connection drop) -> INVALID_REQUEST for every requested topic, a null name answered as
    # "" (MetadataRequest.getErrorResponse). From v12 a null name is a lookup by topic id.
    invalid = version < 12 and any(getattr(t, "name", "") is None for t in requested)
    topics = []
    for t in requested:
        name = getattr(t, "name", None)
        topic_id = getattr(t, "topic_id", None) or uuid.UUID(int=0)
        if invalid:
            code, name = ErrorCode.INVALID_REQUEST, name or ""
        elif name is None:
            code = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        topics.append({"error_code": code, "name": name, "topic_id": topic_id,
                       "is_internal": False, "partitions": []})
    return build(cls, {
        "throttle_time": 0,
        "brokers": [{"node_id": n, "host": h, "port": p, "rack": None} for n, h, p in brokers],
        "cluster_id": CLUSTER_ID,
        "controller_id": controller_id,
        "topics": topics,
        "cluster_authorized_operations": -2147483648,
    })


def find_coordinator(cls: type, request: Any, version: int,
                     locate: Callable[[str], Node | None],
                     denied: Callable[[str], str | None] | None = None) -> Any:
    """``locate(group_id)``: the node coordinating the group now, None while nobody does
    (COORDINATOR_NOT_AVAILABLE, retriable: a partition moving between nodes). ``denied(key)``
    (authorizer=acl): None when the key may be described, else the message of its
    GROUP_AUTHORIZATION_FAILED (checked first, as Kafka)."""
    def unavailable(key: str) -> dict[str, Any]:
        return {"key": key, "node_id": -1, "host": "", "port": -1,
                "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "error_message": "no coordinator node owns this group's partition right now"}

    def answer(key: str, key_type: int, empty: bool | None = None,
               node: Node | None | bool = True) -> dict[str, Any]:
        if key_type != 0:
            return {"key": key, "node_id": -1, "host": "", "port": -1,
                    "error_code": ErrorCode.INVALID_REQUEST,
                    "error_message": f"only group coordinators (key type 0) are served, not {key_type}"}
        if node is DENIED:
            return {"key": key, "node_id": -1, "host": "", "port": -1,
                    "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED,
                    "error_message": "Not authorized to access group"}
        if denied is not None and node is True and empty is None:
            message = denied(key)
            if message is not None:
                return {"key": key, "node_id": -1, "host": "", "port": -1,
                        "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED,
                        "error_message": message}
        if (not key) if empty is None else empty:
            return {"key": key, "node_id": -1, "host": "", "port": -1,
                    "error_code": ErrorCode.INVALID_GROUP_ID, "error_message": "empty group id"}
        if node is True:
            node = locate(key)
        if node is None or node is False:
            return unavailable(key)
        node_id, host, port = node
        return {"key": key, "node_id": node_id, "host": host, "port": port,
                "error_code": 0, "error_message": None}

    key_type = getattr(request, "key_type", 0)
    if version >= 4:
        keys = request.coordinator_keys
        if len(keys) > SPLICE_MIN:
            # Many keys: spliced, a chunk per event-loop turn (a coroutine; building 10,000
            # entries took 0.1-0.3 s in one callback).
            def make(key: str, empty: bool | None = None, node: Any = True) -> Any:
                return build(cls, {"throttle_time": 0,
                                   "coordinators": [answer(key, key_type, empty, node)]})
            if key_type != 0:
                return refuse_items_async(make, "coordinators", keys, 0)

            def pick(key: str) -> Any:  # (non-empty, the node), one entry shape per pair
                if denied is not None and denied(key) is not None:
                    return (True, DENIED)
                return (False, None) if not key else (True, locate(key))
            return refuse_items_async(make, "coordinators", keys, 0, variants=_Lazy(
                lambda tag: lambda k: make(k, not tag[0], tag[1] if tag[0] else None)),
                pick=pick)
        return build(cls, {"throttle_time": 0, "coordinators": [
            answer(k, key_type) for k in keys]})
    one = answer(request.key, key_type)
    return build(cls, {"throttle_time": 0, **one})


def list_groups(cls: type, request: Any, groups: list[tuple[str, str]], error: int = 0) -> Any:
    """``error``: a partition that did not answer (loading, failed); the groups of the others
    are listed with it, as Kafka lists what the coordinators that answered hold."""
    states = {s.lower() for s in getattr(request, "states_filter", None) or ()}
    types = {t.lower() for t in getattr(request, "types_filter", None) or ()}
    listed = []
    if not types or "connect" in types:
        for group_id, state in sorted(groups):
            if states and state.lower() not in states:
                continue
            listed.append({"group_id": group_id, "protocol_type": "connect",
                           "group_state": state, "group_type": "connect"})
    return build(cls, {"throttle_time": 0, "error_code": error, "groups": listed})


def error_response(cls: type, request: Any | None, code: int, message: str) -> Any:
    """A response of ``cls`` that carries ``code`` as Kafka's ``getErrorResponse`` builds it:
    the top-level error where the version has one, else the error on every item the request
    named (topics, coordinator keys, groups). ``request`` None: no items. The credentials and
    ACL APIs have their own items: coordinator.security.apis.error_response."""
    values: dict[str, Any] = {"throttle_time": 0, "error_code": code, "error_message": message,
                              "node_id": -1, "host": "", "port": -1, "controller_id": -1}
    if request is not None:
        v12 = cls.__version__ >= 12 if cls.__api_key__ == 3 else True
        values["topics"] = [
            {"error_code": code, "name": t.name if (t.name is not None or v12) else "",
             "topic_id": getattr(t, "topic_id", None) or uuid.UUID(int=0), "is_internal": False,
             "partitions": []}
            for t in getattr(request, "topics", None) or ()]
        values["coordinators"] = [
            {"key": k, "node_id": -1, "host": "", "port": -1, "error_code": code,
             "error_message": message} for k in getattr(request, "coordinator_keys", None) or ()]
        if cls.__api_key__ in (32, 44):  # DescribeConfigs, IncrementalAlterConfigs
            values["results" if cls.__api_key__ == 32 else "responses"] = [
                {"error_code": code, "error_message": message, "resource_type": r.resource_type,
                 "resource_name": r.resource_name, "configs": []} for r in request.resources]
        if cls.__api_key__ == 15:  # DescribeGroups: one entry per requested group
            values["groups"] = [
                {"error_code": code, "group_id": g, "group_state": "", "protocol_type": "",
                 "protocol_data": "", "members": [], "authorized_operations": -2147483648}
                for g in request.groups]
    return build(cls, values)


class Encoded:
    """A response already encoded: the connection writes ``body`` as it is."""

    __slots__ = ("body", "error_code")

    def __init__(self, body: bytes, error_code: int) -> None:
        self.body = body
        self.error_code = error_code


_SENTINEL = "\x01connect-coordinator-item\x01"


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    raw = value.encode()
    if not flexible:
        return len(raw).to_bytes(2, "big") + raw
    n, out = len(raw) + 1, bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + raw


def _splice(make: Callable[[str], Any], items_field: str) -> tuple[bytes, bytes, bytes, bytes, bool]:
    """(response before the array, entry before its key, entry after its key, response after
    the array, flexible) of ``make(key)``, a response with one entry keyed by ``key``."""
    template = make(_SENTINEL)
    whole = codec.encode(template)
    item = getattr(template, items_field)[0]
    one = codec.encode(item)
    flexible = bool(getattr(type(item), "__flexible__", False))
    at = whole.index(one)
    count_len = 1 if flexible else 4  # the one-entry array's length: varint 2 or int32 1
    sentinel = _SENTINEL.encode()
    cut = one.index(sentinel)
    return (whole[: at - count_len], one[: cut - (1 if flexible else 2)],
            one[cut + len(sentinel):], whole[at + len(one):], flexible)


def _count(n: int, flexible: bool) -> bytes:
    """An array's length: compact (varint n + 1) or int32."""
    if not flexible:
        return n.to_bytes(4, "big")
    n += 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def assemble(make: Callable[[str], Any], items_field: str, entries: list[bytes],
             error_code: int = 0) -> Encoded:
    """The response ``make`` builds (see :func:`refuse_items_async`) with ``entries``, each an entry
    already encoded, as its array: a large answer encoded an entry at a time."""
    before, _, _, after, flexible = _splice(make, items_field)
    return Encoded(b"".join((before, _count(len(entries), flexible), *entries, after)),
                   error_code)


SPLICE_MIN = 1_000
"""FindCoordinator answers with more keys than this are spliced (:func:`refuse_items_async`)."""
REFUSE_CHUNK = 20_000
"""Keys spliced per event-loop turn by :func:`refuse_items_async` (~10 ms)."""


class _Lazy(dict):  # type: ignore[type-arg]
    """A dict whose missing entries are made by ``make(key)`` (and kept)."""

    def __init__(self, make: Callable[[Any], Any]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key: Any) -> Any:
        value = self[key] = self._make(key)
        return value


async def refuse_items_async(make: Callable[[str], Any], items_field: str, keys: Any, code: int,
                             make_first: Callable[[str], Any] | None = None,
                             variants: dict[Any, Callable[[str], Any]] | None = None,
                             pick: Callable[[str], Any] | None = None) -> Encoded:
    """A response with one error entry per key (Kafka's getErrorResponse for a list request),
    encoded without building an entity per key: ``make(key)`` is a response with one entry
    keyed by ``key``; it is encoded once around a sentinel key and each key's bytes are spliced
    in (~0.5 µs a key; building and encoding an entity took ~10 µs, 5 s for the 500,000 keys a
    1 MiB frame can name). ``make_first``: the first entry's maker (an error message said
    once, not 500,000 times). A chunk of keys per event-loop turn: all 500,000 at once took
    0.3 s in one callback, which every other client waited for. ``variants`` and ``pick``:
    entries of several kinds (``variants[pick(key)]`` makes a key's entry; ``make`` the rest of
    the response)."""
    before, head, tail, after, flexible = _splice(make, items_field)
    if variants is not None and pick is not None:
        cuts: dict[Any, tuple[bytes, bytes]] = {}  # a variant's cut, made when first needed
        keys = list(keys)
        parts = [before, _count(len(keys), flexible)]
        for at in range(0, len(keys), REFUSE_CHUNK):
            chunk = []
            for k in keys[at:at + REFUSE_CHUNK]:
                tag = pick(k)
                cut = cuts.get(tag)
                if cut is None:
                    cut = cuts[tag] = _splice(variants[tag], items_field)[1:3]
                h, t = cut
                chunk.append(h + _string(k, flexible) + t)
            parts.append(b"".join(chunk))
            await asyncio.sleep(0)
        parts.append(after)
        return Encoded(b"".join(parts), code)
    keys = list(keys)
    parts = [before, _count(len(keys), flexible)]
    start = 0
    if make_first is not None and keys:
        _, head1, tail1, _, _ = _splice(make_first, items_field)
        parts.append(head1 + _string(keys[0], flexible) + tail1)
        start = 1
    for at in range(start, len(keys), REFUSE_CHUNK):
        parts.append(b"".join([head + _string(k, flexible) + tail
                               for k in keys[at:at + REFUSE_CHUNK]]))
        await asyncio.sleep(0)
    parts.append(after)
    return Encoded(b"".join(parts), code)


def too_many_items(cls: type, request: Any, limit: int) -> Coroutine[Any, Any, Encoded] | None:
    """Kafka's APIs: None when ``request`` names at most ``limit`` items, else its refusal (a
    coroutine, see :func:`refuse_items_async`): INVALID_REQUEST on every item it names, nothing
    looked up."""
    api_key = cls.__api_key__
    if api_key == 3:
        items, field, key = request.topics or (), "topics", "name"
    elif api_key == 10:
        items, field, key = getattr(request, "coordinator_keys", None) or (), "coordinators", "key"
    elif api_key == 15:
        items, field, key = request.groups, "groups", "group_id"
    else:
        return None
    if len(items) <= limit:
        return None
    code = ErrorCode.INVALID_REQUEST
    message = f"{len(items)} {field} in one request, more than request.max.items={limit}"
    if api_key == 3:
        top = {"throttle_time": 0, "brokers": [], "cluster_id": CLUSTER_ID, "controller_id": -1,
               "cluster_authorized_operations": -2147483648}
        entry = {"error_code": code, "is_internal": False, "partitions": []}
        v12 = cls.__version__ >= 12
        keys = [t.name if (t.name is not None or v12) else "" for t in items]
    elif api_key == 10:
        top = {"throttle_time": 0}
        entry = {"node_id": -1, "host": "", "port": -1, "error_code": code, "error_message": None}
        keys = list(items)
    else:
        top = {"throttle_time": 0}
        entry = {"error_code": code, "group_state": "", "protocol_type": "", "protocol_data": "",
                 "members": [], "authorized_operations": -2147483648}
        keys = list(items)

    def make(k: str, extra: dict[str, Any] | None = None) -> Any:
        return build(cls, {**top, field: [{**entry, key: k, **(extra or {})}]})
    first = (lambda k: make(k, {"error_message": message})) if api_key == 10 else None
    return refuse_items_async(make, field, keys, code, first)


def described_group(cls: type, group_id: str, d: Any) -> bytes:
    """One DescribeGroups entry of ``cls``, encoded (see :func:`describe_groups`)."""
    return codec.encode(describe_groups(cls, [(group_id, d)]).groups[0])


def describe_groups_refused(cls: type) -> Callable[[str], Any]:
    """The maker of a DescribeGroups response with one entry refused (INVALID_REQUEST; the
    entries carry no message)."""
    return lambda g: build(cls, {"throttle_time": 0, "groups": [
        {"error_code": ErrorCode.INVALID_REQUEST, "group_id": g, "group_state": "",
         "protocol_type": "", "protocol_data": "", "members": [],
         "authorized_operations": -2147483648}]})


def _classic_member(m: Any) -> dict[str, bytes]:
    """A classic member's metadata (its worker metadata for the Connect protocol it uses) and
    assignment (its whole current assignment in that protocol's version), as Kafka describes a
    classic member; empty for a member of the new protocol."""
    protocol = getattr(m, "classic_protocol", None)
    if protocol is None:
        return {"member_metadata": b"", "member_assignment": b""}
    version = classic_connect.PROTOCOL_VERSIONS.get(protocol, 0)
    items = frozenset(Item(c, -1) for c in m.assignment.connectors) | frozenset(
        Item(t.connector, t.task) for t in m.assignment.tasks)
    assignment = classic_connect.Assignment(
        version, classic_connect.NO_ERROR, "", "", 0, classic_connect.entries_of(items),
        () if version else None)
    return {"member_metadata": m.classic_metadata or b"",
            "member_assignment": classic_connect.encode_assignment(assignment)}


def describe_groups(cls: type, described: list[Any]) -> Any:
    """``described``: ConnectGroupDescribeResponse.DescribedGroup values (or None: unknown)."""
    groups = []
    for group_id, d in described:
        if d is None or d.error_code == ErrorCode.GROUP_ID_NOT_FOUND:
            groups.append({"error_code": 0, "group_id": group_id, "group_state": "Dead",
                           "protocol_type": "", "protocol_data": "", "members": [],
                           "authorized_operations": -2147483648})
            continue
        if d.error_code not in (0, ErrorCode.NO_ASSIGNOR_COVERS_GROUP):
            # INVALID_GROUP_ID, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, ...: reported as
            # the group's error (as Kafka does), so clients see it and retry; it was answered
            # as error 0 with state "Dead", i.e. "no such group" while the group existed.
            groups.append({"error_code": d.error_code, "group_id": group_id, "group_state": "",
                           "protocol_type": "", "protocol_data": "", "members": [],
                           "authorized_operations": -2147483648})
            continue
        groups.append({
            "error_code": 0, "group_id": group_id, "group_state": d.group_state,
            "protocol_type": "connect", "protocol_data": d.assignor_name or "",
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.instance_id,
                 "client_id": m.client_id, "client_host": m.client_host,
                 **_classic_member(m)}
                for m in d.members
            ],
            "authorized_operations": -2147483648,
        })
    return build(cls, {"throttle_time": 0, "groups": groups})
