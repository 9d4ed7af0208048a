"""Kafka Connect's REST API on a worker (``connect-worker run --rest-listen HOST:PORT``).

An aiohttp web server in the worker's own event loop (``AppRunner`` + ``TCPSite``: it takes no
signals; the worker's SIGTERM handling stays as it is). Every answer comes from the group's
coordinator through the worker's own :class:`~worker_client.client.CoordinatorClient` (its
control connection, never the heartbeat one): reads are one ConnectGroupDescribe or
FetchOffsets, changes one ConnectGroupAlterConnectors (Connect's verbs are reserved config
keys, :mod:`connect_wire.verbs`) or AlterOffsets. What is made of the answers is shared with
the admin CLI (:mod:`connect_wire.connectors`). docs/rest.md lists the endpoints, the status
codes and what differs from Kafka Connect.

``GET /ui`` is a live status page (worker_client/ui/status.html, package data: one HTML file
with its own style and script, nothing loaded from elsewhere) polling ``GET /ui/state``: the
group as ``connect-coordinator groups describe --json`` shows it plus each connector's REST
status and offsets count.

Config mapping: the REST config's ``tasks.max`` is the connector's task count, ``name`` its
name (neither is stored in its config), ``connector.class`` names its plugin; the reserved keys
of the verbs are never shown and never accepted.

Errors: ``{"error_code": <http status>, "message": ...}``. A coordinator that cannot be reached
or answers a retriable error (moving, loading) is asked again with backoff until the request
timeout, then 409 (Kafka Connect's answer while its group rebalances).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import entry_points
from importlib.resources import files
from typing import Any
from urllib.parse import quote, urlsplit

import javaproperties
from aiohttp import web

from connect_wire import codec, plugins, verbs
from connect_wire import connectors as shared
from connect_wire.client_security import SecurityError
from connect_wire.cliutil import version
from connect_wire.errors import ErrorCode, error_name
from connect_wire.framing import DEFAULT_MAX_FRAME_SIZE
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterOffsetsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupFetchOffsetsRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_alter_offsets_request_v0 as _alter_offsets
from worker_client import logs
from worker_client.client import ConnectionFailed, coordinator_error
from worker_client.membership import State

RETRIABLE = {int(ErrorCode.NOT_COORDINATOR), int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
             int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), int(ErrorCode.REQUEST_TIMED_OUT),
             int(ErrorCode.REBALANCE_IN_PROGRESS)}
"""Coordinator answers asked again until the request timeout (then 409). REBALANCE_IN_PROGRESS:
an offsets change of a stopped connector whose instances are still stopping."""
FORBIDDEN = {int(ErrorCode.GROUP_AUTHORIZATION_FAILED), int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)}
DEFAULT_REQUEST_TIMEOUT_S = 30.0
MAX_BODY_BYTES = DEFAULT_MAX_FRAME_SIZE
"""The largest request body read (413 beyond): the coordinator's default frame limit
(``socket.max.frame.bytes``), so nothing it would refuse by closing the connection is sent."""
MAX_CONNECTIONS = 256
"""Open connections served at once; one more is answered 503 and closed, so idle or slow
clients cannot take the worker's file descriptors (which its tasks and its coordinator
connections need)."""
IDLE_TIMEOUT_S = 30.0
"""A connection with no complete request for this long is closed (Jetty's idle timeout, as
Kafka Connect's REST server)."""
HANDSHAKE_TIMEOUT_S = 10.0
"""A TLS handshake not done by then ends the connection."""
INT32_MAX = 2**31 - 1
_INT = re.compile(r"[+-]?[0-9]+")
_BUSY_BODY = json.dumps({"error_code": 503, "message": "Too many open connections to this "
                         "worker's REST API; retry later"}).encode()
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))
TASKS_MAX = "tasks.max"
CONNECTOR_CLASS = "connector.class"
STOPPED_FOR_OFFSETS = ("Connectors must be in the STOPPED state before their offsets can be "
                       "modified. This can be done for the specified connector by issuing a 'PUT' "
                       "request to the '/connectors/{}/stop' endpoint")
log = logs.get("worker_client.rest")
STATUS_PAGE = "ui/status.html"
"""The status page (``GET /ui``), package data of :mod:`worker_client`."""


class RestError(Exception):
    """An answer other than success: ``status`` and Kafka Connect's error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error_code": status, "message": message}, status=status,
                             headers=headers)


def load_users(path: str) -> dict[str, str]:
    """The ``user=password`` file of Kafka's PropertyFileLoginModule: a java.util.Properties
    file (``=``, ``:`` or blanks separate, ``\\`` escapes, ``#``/``!`` comments), read by
    javaproperties, as UTF-8. ValueError when it names no user or a user without a password
    (Kafka would let anyone in with an empty file, and in without a password)."""
    with open(path, encoding="utf-8") as f:
        users: dict[str, str] = javaproperties.load(f)
    if not users:
        raise ValueError(f"{path}: no user=password line")
    empty = sorted(user for user, password in users.items() if not password)
    if empty:
        raise ValueError(f"{path}: no password for {', '.join(map(repr, empty))}")
    return users


def _bool(request: web.Request, name: str) -> bool:
    """A query boolean, case-insensitive as Java's ``Boolean.valueOf`` (``True`` from Python
    clients is true; anything but ``true`` is false)."""
    return request.query.get(name, "false").strip().lower() == "true"


def _worker_id(url: str | None, fallback: str | None) -> str | None:
    """Kafka Connect's ``worker_id``: the host:port of the member's worker URL."""
    if url:
        parts = urlsplit(url if "//" in url else f"//{url}")
        if parts.hostname:
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            return f"{host}:{parts.port}" if parts.port else host
        return url
    return fallback


_TOO_LARGE = (f"the limit is {MAX_BODY_BYTES} bytes (the coordinator's default "
              "socket.max.frame.bytes)")


def _json_type(content_type: str) -> bool:
    """A body Kafka Connect reads (its resources consume application/json). aiohttp gives
    ``application/octet-stream`` when no Content-Type was sent: taken as JSON too."""
    return content_type in ("application/json", "application/octet-stream") or \
        content_type.endswith("+json")


def _location(name: str) -> str:
    """``Location`` of a connector: its name percent-encoded as a path segment (as JAX-RS's
    UriBuilder.path), so a client can follow it whatever the name holds."""
    return "/connectors/" + quote(name, safe="!$&'()*+,;=:@")


def _control_chars(name: str) -> list[str]:
    """Kafka Connect's check of a connector name (ConfigDef's NonEmptyStringWithoutControlChars:
    Java's Character.isISOControl): one message, or none."""
    bad = [str(ord(ch)) for ch in name if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F]
    if not bad:
        return []
    return [f"Invalid value {name} for configuration name: String may not contain control "
            f"sequences but had the following ASCII chars: {', '.join(bad)}"]


def _tasks_max(text: str | None) -> tuple[int, list[str]]:
    """``tasks.max`` as Kafka Connect's ConfigDef reads an INT at least 1: (count, errors)."""
    if text is None:
        return 1, []  # (Kafka Connect's default)
    trimmed = text.strip()
    if not (_INT.fullmatch(trimmed) and -INT32_MAX - 1 <= int(trimmed) <= INT32_MAX):
        return -1, [f"Invalid value {text} for configuration tasks.max: Not a number of type INT"]
    if int(trimmed) < 1:
        return -1, [f"Invalid value {text} for configuration tasks.max: Value must be at least 1"]
    return int(trimmed), []


def _config_text(config: Mapping[str, Any]) -> dict[str, str | None]:
    """A REST config's values as the strings stored (400 for a value that is not a scalar)."""
    bad = [k for k, v in config.items() if not (v is None or isinstance(v, str | int | float | bool))]
    if bad:
        raise RestError(400, f"Config values must be strings: {', '.join(sorted(bad))}")
    return {k: None if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in config.items()}


def _task_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise RestError(404, f"Task {text} not found")
    return int(text)


async def _json_body(request: web.Request, timeout_s: float) -> Any:
    """The request's JSON body, read within ``timeout_s`` (408 then: a client trickling its
    body would hold a connection and its buffer for as long as it likes)."""
    try:
        async with asyncio.timeout(timeout_s):
            data = await request.read()
    except TimeoutError:
        raise RestError(408, f"The request body was not received within {timeout_s:g} s") from None
    try:
        return json.loads(data or b"null")
    except ValueError as exc:
        raise RestError(400, f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RestError(400, "The request body is nested too deeply to be read") from None


class RestApi:
    """The routes, over a running :class:`~worker_client.worker.Worker`."""

    def __init__(self, worker: Any, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 users: Mapping[str, str] | None = None) -> None:
        self.worker = worker
        self.group = worker.config.group_id
        self.request_timeout_s = request_timeout_s
        self.users = dict(users) if users else None
        self._page: tuple[bytes, str] | None = None
        self.version = version()  # (read from the installed metadata: about 1 ms, so once)
        self._waiting: asyncio.Future[Any] | None = None
        self._describing: asyncio.Task[None] | None = None

    # -- plumbing ----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=MAX_BODY_BYTES)
        add = self._route(app)
        add("/", GET=self.root)
        add("/health", GET=self.health)
        add("/connectors", GET=self.list_connectors, POST=self.create)
        add("/connectors/{c}", GET=self.info, DELETE=self.delete)
        add("/connectors/{c}/config", GET=self.get_config, PUT=self.put_config,
            PATCH=self.patch_config)
        add("/connectors/{c}/status", GET=self.status)
        add("/connectors/{c}/tasks", GET=self.tasks)
        add("/connectors/{c}/tasks/{t}/status", GET=self.task_status)
        add("/connectors/{c}/tasks/{t}/restart", POST=self.restart_task)
        add("/connectors/{c}/restart", POST=self.restart)
        add("/connectors/{c}/pause", PUT=self.pause)
        add("/connectors/{c}/resume", PUT=self.resume)
        add("/connectors/{c}/stop", PUT=self.stop)
        add("/connectors/{c}/offsets", GET=self.get_offsets, PATCH=self.alter_offsets,
            DELETE=self.reset_offsets)
        add("/connectors/{c}/topics", GET=self.topics)
        add("/connectors/{c}/topics/reset", PUT=self.topics)
        add("/connector-plugins", GET=self.connector_plugins)
        add("/connector-plugins/{p}/config/validate", PUT=self.validate)
        add("/ui", GET=self.ui)
        add("/ui/state", GET=self.ui_state)
        return app

    @staticmethod
    def _route(app: web.Application) -> Callable[..., None]:
        def add(path: str, **handlers: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
            # A trailing slash is accepted (real clients send /connector-plugins/); a name
            # never contains '/' here (a URL-encoded one is decoded after matching).
            pattern = "/" if path == "/" else path + "{_slash:/?}"
            resource = app.router.add_resource(pattern)
            for method, handler in handlers.items():
                resource.add_route(method, handler)
            if "GET" in handlers:  # (as Jersey: HEAD is GET without the body)
                resource.add_route("HEAD", handlers["GET"])
        return add

    @web.middleware
    async def _errors(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        if self.users is not None and not self._authenticated(request):
            return _error_response(401, "User cannot access the resource.",
                                   {"WWW-Authenticate": 'Basic realm="connect-worker"'})
        try:
            if (request.body_exists and request.match_info.http_exception is None
                    and not _json_type(request.content_type)):
                raise RestError(415, "HTTP 415 Unsupported Media Type")
            return await handler(request)
        except RestError as exc:
            return _error_response(exc.status, exc.message)
        except web.HTTPException as exc:  # aiohttp's own: 404 no such path, 405 wrong method
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
            text = (f"HTTP 404 Not Found: no resource {request.path}" if exc.status == 404
                    else f"HTTP 413 Request Entity Too Large: {_TOO_LARGE}" if exc.status == 413
                    else f"HTTP {exc.status} {exc.reason}")
            return _error_response(exc.status, text, headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: said, logged, never taken for a coordinator answer
            log.error("rest request failed", method=request.method, path=request.path,
                      error=repr(exc), exc_info=True)
            return _error_response(500, f"Internal error: {exc!r}")

    def _authenticated(self, request: web.Request) -> bool:
        assert self.users is not None
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).decode(
                "utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        expected = self.users.get(user)
        # (compared in constant time; an unknown user is compared too)
        ok = hmac.compare_digest(password.encode(), (expected or "\0" + password).encode())
        return bool(sep) and expected is not None and ok

    async def _call(self, request: Any) -> Any:
        """``request`` to the group's coordinator; retriable answers and lost connections asked
        again until the request timeout (409 then), authorization refusals 403, other errors
        left to the caller."""
        size = len(codec.encode(request)) + 512  # (+ the frame's header: less than that)
        if size > MAX_BODY_BYTES:
            raise RestError(413, f"The request is too large for the coordinator: about {size} "
                            f"bytes to send; {_TOO_LARGE}")
        client = self.worker.client
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        last, answered = "no answer", False
        while True:
            left = deadline - loop.time()
            if left <= 0:
                if answered:  # (it answered, retriably each time: its last answer)
                    raise RestError(409, "Cannot complete request momentarily: the group's "
                                    f"coordinator still answered {last} after "
                                    f"{self.request_timeout_s:g} s; retry later")
                raise RestError(409, "Cannot complete request momentarily: the group's coordinator "
                                f"did not answer within {self.request_timeout_s:g} s (last: {last}); "
                                "retry later")
            try:
                resp = await client.send(request, timeout_s=max(0.1, left))
            except ConnectionFailed as exc:
                last, answered = str(exc), False
            except SecurityError as exc:
                raise RestError(403, f"The coordinator refused this worker: {exc}") from None
            else:
                code = coordinator_error(resp)
                if code in FORBIDDEN:
                    raise RestError(403, f"{error_name(code)}: {message_of(resp)} (the worker's own "
                                    "principal is what the coordinator's ACLs see)")
                if code not in RETRIABLE:
                    return resp
                last, answered = f"{error_name(code)}: {message_of(resp)}", True
            await asyncio.sleep(min(client.backoff_s(), max(0.0, deadline - loop.time())))

    async def _group(self) -> Any:
        """The group as the coordinator describes it, in a ConnectGroupDescribe sent after this
        call began (a request sees every change that completed before it came in).

        Concurrent requests share it: one Describe in flight at a time; the requests that
        come in meanwhile wait for the next one, sent when it ends, which answers them all.
        A flood of REST reads then costs the coordinator one Describe per round trip, not one
        per request: each one used to be queued in the group's partition, ahead of the
        heartbeats of every member of its group (1,024 concurrent clients delayed this
        worker's heartbeats by up to 2.2 s)."""
        waiter = self._waiting
        if waiter is None:
            waiter = self._waiting = asyncio.get_running_loop().create_future()
            # (an answer nobody awaits any more, every request gone, is not logged as lost)
            waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
            if self._describing is None:
                self._describing = asyncio.create_task(self._describe_waiting())
        return await asyncio.shield(waiter)

    async def _describe_waiting(self) -> None:
        try:
            while self._waiting is not None:
                waiter, self._waiting = self._waiting, None
                try:
                    resp = await self._call(ConnectGroupDescribeRequest(group_ids=(self.group,)))
                    (g,) = resp.groups
                    if g.error_code and g.error_code != ErrorCode.NO_ASSIGNOR_COVERS_GROUP:
                        raise RestError(500, f"{error_name(g.error_code)}: {g.error_message}")
                except asyncio.CancelledError:
                    waiter.cancel()
                    raise
                except Exception as exc:  # noqa: BLE001 - every request waiting gets it
                    waiter.set_exception(exc)
                else:
                    waiter.set_result(g)
        finally:
            self._describing = None
            if self._waiting is not None:  # (cancelled: the ones still waiting too)
                self._waiting.cancel()
                self._waiting = None

    async def close(self) -> None:
        """End the shared Describe, if one is in flight (the server is stopping)."""
        task = self._describing
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _connector(self, name: str) -> tuple[Any, Any]:
        g = await self._group()
        try:
            return g, shared.find(g, name)
        except shared.UnknownConnector:
            raise RestError(404, f"Connector {name} not found") from None

    async def _alter(self, upserts: tuple[Any, ...] = (), deletes: tuple[str, ...] = ()) -> None:
        resp = await self._call(ConnectGroupAlterConnectorsRequest(
            group_id=self.group, upserts=upserts, deletes=deletes, validate_only=False))
        if resp.error_code:
            raise RestError(400, f"{error_name(resp.error_code)}: {resp.error_message}")

    @staticmethod
    def _spec(name: str, task_count: int, config: Mapping[str, str | None]) -> Any:
        return _alter.ConnectorSpec(name=name, task_count=task_count, config=tuple(
            _alter.ConfigEntry(name=k, value=v) for k, v in sorted(config.items())))

    # -- shapes ------------------------------------------------------------------------------
    @staticmethod
    def _type(config: Mapping[str, str | None]) -> str:
        """``source``, ``sink`` (a plugin class's ``type`` attribute, when it can be loaded
        here) or ``unknown``."""
        try:
            cls = plugins.load_class(config.get(CONNECTOR_CLASS) or "")
        except Exception:  # noqa: BLE001 - not loadable here: Kafka Connect's "unknown"
            return "unknown"
        kind = getattr(cls, "type", None)
        return kind if kind in ("source", "sink") else "unknown"

    @staticmethod
    def rest_config(c: Any) -> dict[str, str | None]:
        return {**verbs.plugin_config(shared.config_of(c)), "name": c.name,
                TASKS_MAX: str(c.task_count)}

    def connector_info(self, c: Any) -> dict[str, Any]:
        config = self.rest_config(c)
        return {"name": c.name, "config": config,
                "tasks": [{"connector": c.name, "task": t} for t in range(shared.running_tasks(c))],
                "type": self._type(config)}

    def connector_status(self, g: Any, name: str, restarting: frozenset[int] = frozenset(),
                         connector_restarting: bool = False) -> dict[str, Any]:
        st = shared.status(g, name)

        def one(x: dict[str, Any], restart: bool) -> dict[str, Any]:
            state = x["state"]
            if state in ("ASSIGNED", "HELD"):
                state = "UNASSIGNED"
            if restart:
                state = "RESTARTING"
            out: dict[str, Any] = {"state": state, "worker_id": _worker_id(
                x["worker_url"], x["instance_id"] or x["member_id"])}
            trace = x["trace"] or x["error"]
            if trace and not restart:
                out["trace"] = trace
            # What Kafka Connect does not say (absent otherwise): the worker missed its
            # heartbeats; the item is kept for a departed worker until the scheduled rebalance.
            if x["worker_heartbeat_overdue"]:
                out["worker_heartbeat_overdue"] = True
            if x["kept_for"] is not None:
                out["kept_for"] = x["kept_for"]
            return out

        spec = shared.find(g, name)
        tasks = [] if st["target_state"] == verbs.STOPPED else [
            {"id": t["task"], **one(t, t["task"] in restarting)} for t in st["tasks"]]
        return {"name": name, "connector": one(st, connector_restarting), "tasks": tasks,
                "type": self._type(shared.config_of(spec))}

    # -- root --------------------------------------------------------------------------------
    async def root(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version, "commit": "unknown",
                                  "kafka_cluster_id": self.group})

    async def health(self, request: web.Request) -> web.Response:
        m = self.worker.membership
        if m.member_epoch > 0 and m.state in (State.STABLE, State.RECONCILING):
            return web.json_response({"status": "healthy", "message": "Worker has completed "
                                      "startup and is ready to handle requests."})
        if m.state in (State.FAILED, State.LEFT, State.LEAVING):
            return web.json_response({"status": "unhealthy", "message": "Worker is not a member "
                                      f"of group {self.group} ({m.state.value})."}, status=503)
        return web.json_response({"status": "starting", "message": "Worker is still starting up "
                                  f"(joining group {self.group})."}, status=503)

    # -- connectors --------------------------------------------------------------------------
    async def list_connectors(self, request: web.Request) -> web.Response:
        g = await self._group()
        expand = {e.strip().lower() for e in request.query.getall("expand", [])}
        names = sorted(c.name for c in g.connectors)
        if "expand" not in request.query:  # (any expand, even an unknown one: a map, as Kafka Connect)
            return web.json_response(names)
        out: dict[str, Any] = {}
        for c in sorted(g.connectors, key=lambda c: c.name):
            entry: dict[str, Any] = {}
            if "status" in expand:
                entry["status"] = self.connector_status(g, c.name)
            if "info" in expand:
                entry["info"] = self.connector_info(c)
            out[c.name] = entry
        return web.json_response(out)

    async def _checked(self, name: str, config: Mapping[str, Any],
                       stored: Mapping[str, str | None]) -> tuple[int, dict[str, str | None]]:
        """A REST config as it would be stored: (task count, config with ``stored``'s verbs
        kept). 400 for what Kafka Connect refuses, the plugin's own ``validate`` included."""
        if not isinstance(config, Mapping):
            raise RestError(400, "The connector configuration must be a JSON object")
        text = _config_text(config)
        given = text.pop("name", None)
        if given is not None and given != name:
            raise RestError(400, f"Connector name configuration ({given}) doesn't match connector "
                            f"name in the URL ({name})")
        reserved = sorted(k for k in text if verbs.is_reserved(k))
        if reserved:
            raise RestError(400, f"{', '.join(reserved)}: reserved for Connect's verbs (use the "
                            "restart, pause, resume and stop endpoints)")
        if not (text.get(CONNECTOR_CLASS) or "").strip():
            raise RestError(400, f"Connector config {dict(config)} contains no connector type")
        errors: dict[str, list[str]] = {}
        tasks, errors[TASKS_MAX] = _tasks_max(text.pop(TASKS_MAX, None))
        errors["name"] = _control_chars(name)
        errors.update(await self._plugin_errors(name, text))
        errors = {k: v for k, v in errors.items() if v}
        if errors:
            lines = plugins.error_lines(errors)
            raise RestError(400, f"Connector configuration is invalid and contains the following "
                            f"{len(lines)} error(s):\n" + "\n".join(lines) + "\nYou can also find "
                            "the above list of errors at the endpoint "
                            "`/connector-plugins/{connectorType}/config/validate`")
        kept = {k: v for k, v in stored.items() if verbs.is_reserved(k)}
        return tasks, {**text, **kept}

    @staticmethod
    async def _plugin_errors(name: str, config: Mapping[str, str | None]) -> dict[str, list[str]]:
        """The plugin's ``validate`` of ``config`` (``connector.class`` in error when the class
        cannot be loaded here, as the worker that would run it could not either)."""
        try:
            cls = plugins.load_class(config.get(CONNECTOR_CLASS) or "")
        except Exception as exc:  # noqa: BLE001 - PluginError, or its module failing to import
            return {CONNECTOR_CLASS: [str(exc)]}
        try:
            return await plugins.validate(cls, {**config, "connector.name": name})
        except plugins.ValidatorFailed as exc:
            return {CONNECTOR_CLASS: [f"the config's validator itself failed: {exc}"]}

    async def create(self, request: web.Request) -> web.Response:
        body = await _json_body(request, self.request_timeout_s)
        if not isinstance(body, dict):
            raise RestError(400, 'The request body must be {"name": ..., "config": {...}}')
        config = body.get("config")
        if not isinstance(config, dict):
            raise RestError(400, "Connector config is missing: the body's \"config\" object")
        name = body.get("name") or config.get("name")
        if not isinstance(name, str) or not name.strip():
            raise RestError(400, "Connector name must not be empty")
        name = name.strip()  # (as Kafka Connect)
        _config_text(config)  # (its values' types, before anything is asked)
        initial = body.get("initial_state")
        if initial is not None and (not isinstance(initial, str) or initial.upper() not in verbs.STATES):
            raise RestError(400, f"Invalid initial_state {initial!r}: one of "
                            f"{', '.join(verbs.STATES)}")
        g = await self._group()
        if any(c.name == name for c in g.connectors):
            raise RestError(409, f"Connector {name} already exists")
        tasks, stored = await self._checked(name, config, {})
        if initial is not None and initial.upper() != verbs.RUNNING:
            stored[verbs.TARGET_STATE] = initial.upper()
        await self._alter(upserts=(self._spec(name, tasks, stored),))
        _, c = await self._connector(name)
        return web.json_response(self.connector_info(c), status=201,
                                 headers={"Location": _location(name)})

    async def info(self, request: web.Request) -> web.Response:
        _, c = await self._connector(request.match_info["c"])
        return web.json_response(self.connector_info(c))

    async def get_config(self, request: web.Request) -> web.Response:
        _, c = await self._connector(request.match_info["c"])
        return web.json_response(self.rest_config(c))

    async def put_config(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        config = await _json_body(request, self.request_timeout_s)
        if not isinstance(config, Mapping):
            raise RestError(400, "The connector configuration must be a JSON object")
        _config_text(config)  # (its values' types, before anything is asked)
        g = await self._group()
        old = next((c for c in g.connectors if c.name == name), None)
        stored = shared.config_of(old) if old is not None else {}
        tasks, new = await self._checked(name, config, stored)
        await self._alter(upserts=(self._spec(name, tasks, new),))
        _, c = await self._connector(name)
        headers = {"Location": _location(name)} if old is None else None
        return web.json_response(self.connector_info(c), status=201 if old is None else 200,
                                 headers=headers)

    async def patch_config(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        _, old = await self._connector(name)
        patch = await _json_body(request, self.request_timeout_s)
        if not isinstance(patch, dict):
            raise RestError(400, "The connector configuration patch must be a JSON object")
        merged: dict[str, Any] = self.rest_config(old)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        tasks, new = await self._checked(name, merged, shared.config_of(old))
        await self._alter(upserts=(self._spec(name, tasks, new),))
        _, c = await self._connector(name)
        return web.json_response(self.connector_info(c))

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        await self._connector(name)
        await self._alter(deletes=(name,))
        return web.Response(status=204)

    async def status(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        g, _ = await self._connector(name)
        return web.json_response(self.connector_status(g, name))

    async def tasks(self, request: web.Request) -> web.Response:
        """Each running task's id and config: the task config its connector instance wrote, or,
        for a connector that writes none, the connector's config (what its tasks start with)."""
        name = request.match_info["c"]
        _, c = await self._connector(name)
        base = verbs.plugin_config(shared.config_of(c))
        out = []
        for t in range(shared.running_tasks(c)):
            config = base if c.task_configs is None else {
                e.name: e.value for e in c.task_configs[t].config}
            out.append({"id": {"connector": name, "task": t}, "config": config})
        return web.json_response(out)

    async def task_status(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        g, _ = await self._connector(name)
        task = _task_number(request.match_info["t"])
        st = self.connector_status(g, name)
        found = next((t for t in st["tasks"] if t["id"] == task), None)
        if found is None:
            raise RestError(404, f"Task {name}-{task} not found")  # (Kafka Connect's task id)
        return web.json_response(found)

    # -- verbs -------------------------------------------------------------------------------
    async def restart(self, request: web.Request) -> web.Response:
        """Plain: the connector instance only (204). With ``includeTasks`` and/or
        ``onlyFailed``: the connector and (with includeTasks) its tasks, only the FAILED ones
        with onlyFailed; 202 with the status, the instances restarted shown RESTARTING."""
        name = request.match_info["c"]
        include_tasks, only_failed = _bool(request, "includeTasks"), _bool(request, "onlyFailed")
        g, c = await self._connector(name)
        config = shared.config_of(c)
        if not include_tasks and not only_failed:
            await self._alter(upserts=(self._spec(name, c.task_count,
                                                  shared.restart_config(config, c.task_count,
                                                                        connector=True)),))
            return web.Response(status=204)
        st = self.connector_status(g, name)
        connector = not only_failed or st["connector"]["state"] == "FAILED"
        tasks = tuple(t["id"] for t in st["tasks"] if include_tasks and (
            not only_failed or t["state"] == "FAILED"))
        if connector or tasks:
            everything = connector and include_tasks and not only_failed
            new = shared.restart_config(config, c.task_count, connector=connector and not everything,
                                        tasks=() if everything else tasks, everything=everything)
            await self._alter(upserts=(self._spec(name, c.task_count, new),))
        return web.json_response(self.connector_status(g, name, frozenset(tasks), connector),
                                 status=202)

    async def restart_task(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        _, c = await self._connector(name)
        task = _task_number(request.match_info["t"])
        if task >= shared.running_tasks(c):
            raise RestError(404, f"Task {name}-{task} not found")
        new = shared.restart_config(shared.config_of(c), c.task_count, tasks=(task,))
        await self._alter(upserts=(self._spec(name, c.task_count, new),))
        return web.Response(status=204)

    async def _state(self, request: web.Request, verb: str, status: int) -> web.Response:
        name = request.match_info["c"]
        _, c = await self._connector(name)
        new = shared.state_config(shared.config_of(c), verb)
        await self._alter(upserts=(self._spec(name, c.task_count, new),))
        return web.Response(status=status)

    async def pause(self, request: web.Request) -> web.Response:
        return await self._state(request, "pause", 202)

    async def resume(self, request: web.Request) -> web.Response:
        return await self._state(request, "resume", 202)

    async def stop(self, request: web.Request) -> web.Response:
        return await self._state(request, "stop", 204)

    # -- offsets -----------------------------------------------------------------------------
    async def get_offsets(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        resp = await self._call(ConnectGroupFetchOffsetsRequest(group_id=self.group, connector=name,
                                                                partitions=None))
        if resp.error_code in (ErrorCode.RESOURCE_NOT_FOUND, ErrorCode.GROUP_ID_NOT_FOUND):
            raise RestError(404, f"Connector {name} not found")
        if resp.error_code:
            raise RestError(400, f"{error_name(resp.error_code)}: {resp.error_message}")
        return web.json_response({"offsets": shared.offset_entries(resp.offsets)})

    async def _modify_offsets(self, name: str, pairs: list[tuple[str, str | None]], reset: bool) -> None:
        _, c = await self._connector(name)
        if verbs.target_state(shared.config_of(c)) != verbs.STOPPED:
            raise RestError(400, STOPPED_FOR_OFFSETS.format(name))
        resp = await self._call(ConnectGroupAlterOffsetsRequest(
            group_id=self.group, connector=name, reset=reset, validate_only=False,
            offsets=tuple(_alter_offsets.PartitionOffset(partition=p, offset=o) for p, o in pairs)))
        if resp.error_code in (ErrorCode.RESOURCE_NOT_FOUND, ErrorCode.GROUP_ID_NOT_FOUND):
            raise RestError(404, f"Connector {name} not found")
        if resp.error_code:
            message = resp.error_message or error_name(resp.error_code)
            if "STOPPED state" in message:  # (resumed between the check and the write)
                message = STOPPED_FOR_OFFSETS.format(name)
            raise RestError(400, message)

    async def alter_offsets(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        body = await _json_body(request, self.request_timeout_s)
        if isinstance(body, dict) and body.get("offsets") in (None, []):
            raise RestError(400, "Partitions / offsets need to be provided for an alter offsets "
                            "request")
        try:
            pairs = shared.offset_pairs(body, "The request body")
        except shared.BadOffsets as exc:
            raise RestError(400, str(exc)) from None
        await self._modify_offsets(name, pairs, reset=False)
        return web.json_response({"message": "The offsets for this connector have been altered "
                                  "successfully"})

    async def reset_offsets(self, request: web.Request) -> web.Response:
        name = request.match_info["c"]
        await self._modify_offsets(name, [], reset=True)
        return web.json_response({"message": "The offsets for this connector have been reset "
                                  "successfully"})

    # -- status page -------------------------------------------------------------------------
    async def ui(self, request: web.Request) -> web.Response:
        """The live status page: one HTML file (its style and script inline, nothing fetched
        from elsewhere) that polls ``/ui/state``. Its Content-Security-Policy allows only its
        own inline script and style (by hash) and requests to this origin."""
        if self._page is None:
            self._page = status_page()
        body, policy = self._page
        return web.Response(body=body, content_type="text/html", charset="utf-8", headers={
            "Content-Security-Policy": policy, "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    async def ui_state(self, request: web.Request) -> web.Response:
        """The status page's feed: this worker (with the coordinator address it talks to), the
        group as ``groups describe --json`` shows it (one element of its list), and per
        connector its REST status and how many source partitions have stored offsets (the
        describe's count: one request per refresh, however many offsets the connectors keep)."""
        g = await self._group()
        m = self.worker.membership
        config = self.worker.config
        client = self.worker.client
        coordinator = client.coordinator  # (the node it last talked to; None: unknown)
        group = shared.group_dict(g)
        # (as `groups describe --json`: the node FindCoordinator named, null when not known)
        node = None if coordinator is None else client.node_ids.get(coordinator)
        group["coordinator"] = None if node is None else {
            "node_id": node, "host": coordinator[0], "port": coordinator[1]}
        return web.json_response({
            "fetched_ms": int(time.time() * 1000),
            "worker": {"worker_id": _worker_id(config.worker_url, config.instance_id or m.member_id),
                       "url": config.worker_url, "instance_id": config.instance_id,
                       "member_id": m.member_id, "member_epoch": m.member_epoch,
                       "state": m.state.value,
                       "coordinator": None if coordinator is None else "{}:{}".format(*coordinator)},
            "group": group,
            "connectors": [{"name": c.name, "status": self.connector_status(g, c.name),
                            "offsets": c.offset_count, "offsets_error": None}
                           for c in g.connectors]},
            headers={"Cache-Control": "no-store"})

    async def topics(self, request: web.Request) -> web.Response:
        """Kafka Connect's answer with topic tracking off (``topic.tracking.enable=false``):
        connectors here write to no Kafka topics, so there is nothing to track."""
        raise RestError(403, "Topic tracking is disabled.")

    # -- plugins -----------------------------------------------------------------------------
    async def connector_plugins(self, request: web.Request) -> web.Response:
        """The plugins installed as entry points (``connect_coordinator.plugins``): the ones a
        ``connector.class`` can name by a short name. Any importable ``module:Class`` works too
        but cannot be listed."""
        out = []
        for ep in sorted(entry_points(group=plugins.ENTRY_POINT_GROUP), key=lambda e: e.name):
            try:
                cls = ep.load()
                kind = getattr(cls, "type", None)
            except Exception:  # noqa: BLE001 - listed all the same, its type unknown
                kind = None
            dist = ep.dist
            out.append({"class": ep.value, "name": ep.name,
                        "type": kind if kind in ("source", "sink") else "unknown",
                        "version": dist.version if dist is not None else "unknown"})
        return web.json_response(out)

    async def validate(self, request: web.Request) -> web.Response:
        """Kafka Connect's ``ConfigInfos`` for a config: one entry per key given (and per key
        the plugin's ``validate`` names), the plugin's messages as its errors. The plugin
        declares no config definitions, so each ``definition`` is a plain STRING key."""
        plugin = request.match_info["p"]
        config = await _json_body(request, self.request_timeout_s)
        if not isinstance(config, dict):
            raise RestError(400, "The connector configuration must be a JSON object")
        given = config.get(CONNECTOR_CLASS)
        if given is not None and given != plugin:
            raise RestError(400, f"Included connector type {given} does not match request type "
                            f"{plugin}")
        text = _config_text(config)
        text[CONNECTOR_CLASS] = plugin
        name = text.get("name") or ""
        # (what create and PUT refuse counts here too: tasks.max, the name, the verbs' keys)
        errors = await self._plugin_errors(name, {k: v for k, v in text.items()
                                                  if k not in ("name", TASKS_MAX)})
        more = {TASKS_MAX: _tasks_max(text.get(TASKS_MAX))[1], "name": _control_chars(name),
                **{k: ["reserved for Connect's verbs"] for k in text if verbs.is_reserved(k)}}
        for key, messages in more.items():
            if messages:
                errors[key] = [*errors.get(key, []), *messages]
        configs = []
        for key in sorted(set(text) | set(errors)):
            configs.append({
                "definition": {"name": key, "type": "STRING", "required": False,
                               "default_value": None, "importance": "MEDIUM", "documentation": "",
                               "group": None, "order": -1, "width": "NONE", "display_name": key,
                               "dependents": []},
                "value": {"name": key, "value": text.get(key), "recommended_values": [],
                          "errors": errors.get(key, []), "visible": True}})
        return web.json_response({"name": plugin, "error_count": sum(map(len, errors.values())),
                                  "groups": [], "configs": configs})


def status_page() -> tuple[bytes, str]:
    """The status page's bytes and its Content-Security-Policy (its inline ``<script>`` and
    ``<style>`` allowed by their SHA-256, so nothing else can run even if some text were ever
    taken for markup)."""
    text = files("worker_client").joinpath(STATUS_PAGE).read_text(encoding="utf-8")

    def hashes(tag: str) -> str:
        return " ".join(
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
            for body in re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.S))

    policy = (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
              "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'")
    return text.encode(), policy


def message_of(resp: Any) -> str:
    text = getattr(resp, "error_message", None)
    if text is None and getattr(resp, "groups", None):
        text = resp.groups[0].error_message
    return text or "no message"


class RestServer:
    """The API on ``host:port`` (TLS when ``ssl_context`` is given), in the running loop."""

    def __init__(self, worker: Any, host: str, port: int, *,
                 ssl_context: ssl.SSLContext | None = None,
                 users: Mapping[str, str] | None = None,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> None:
        self.api = RestApi(worker, request_timeout_s, users)
        self.host, self.port, self.ssl_context = host, port, ssl_context
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None

    async def start(self) -> None:
        """Bind and serve (OSError when the address cannot be bound). At most
        :data:`MAX_CONNECTIONS` connections are served at once (one more gets 503 and is
        closed) and one idle for :data:`IDLE_TIMEOUT_S` is closed: aiohttp bounds neither."""
        runner = web.AppRunner(self.api.app(), handle_signals=False, access_log=None,
                               shutdown_timeout=1.0, keepalive_timeout=IDLE_TIMEOUT_S)
        await runner.setup()
        server = runner.server
        assert server is not None
        slots = _Slots()

        def connection() -> asyncio.BaseProtocol:
            return slots.take(server) if slots.free() else _Busy()

        try:
            self._listener = await asyncio.get_running_loop().create_server(
                connection, self.host, self.port, ssl=self.ssl_context, backlog=128,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.ssl_context else None)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("rest api listening", listen=f"{self.host}:{self.port}",
                 tls=self.ssl_context is not None, basic_auth=self.api.users is not None)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if runner is not None:
            await runner.cleanup()
        if listener is not None:
            await listener.wait_closed()
        await self.api.close()


class _Slots:
    """The connections served, counted from their accept (a burst of accepts comes before any
    of their ``connection_made``) to their ``connection_lost``; one whose TLS handshake never
    completes (no ``connection_made``, no ``connection_lost``) stops counting when asyncio's
    handshake timeout has ended it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.live: set[_Counted] = set()
        self.accepted: dict[_Counted, float] = {}  # (not made yet: until when it may still be)

    def free(self) -> bool:
        now = self.loop.time()
        for late in [c for c, until in self.accepted.items() if until < now]:
            del self.accepted[late]
        return len(self.live) + len(self.accepted) < MAX_CONNECTIONS

    def take(self, server: web.Server) -> _Counted:
        counted = _Counted(server(), self)
        self.accepted[counted] = self.loop.time() + HANDSHAKE_TIMEOUT_S + 1.0
        return counted


class _Counted(asyncio.Protocol):
    """aiohttp's connection handler, counted in :class:`_Slots` while it is open."""

    def __init__(self, inner: asyncio.Protocol, slots: _Slots) -> None:
        self.inner, self.slots = inner, slots

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.slots.accepted.pop(self, None)
        self.slots.live.add(self)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.slots.live.discard(self)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class _Busy(asyncio.Protocol):
    """A connection past :data:`MAX_CONNECTIONS`: 503 in Kafka Connect's error body, then closed
    (within a second: what the client sent is read and dropped meanwhile, so closing does not
    reset the connection before the client has read the answer)."""

    def connection_made(self, transport: Any) -> None:  # (asyncio's or uvloop's transport)
        transport.write(_BUSY)
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(1.0, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # (closes it)
