"""A small blocking KRPC client for admin commands (the CLI, tests, scripts).

* :class:`AdminClient` — one request at a time over one TCP connection to one address;
  responses are matched by correlation id. Errors in responses are left to the caller (they are
  values on the wire).
* :class:`AdminSession` — what the CLI uses: a bootstrap list tried in turn, and for a group's
  requests the group's coordinator found with FindCoordinator (which may be another node than
  the one asked), with retries on NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE (rediscover) and
  COORDINATOR_LOAD_IN_PROGRESS (same node) under a bounded backoff, until the session's timeout.
  :meth:`AdminSession.list_groups` asks every node Metadata lists and merges their answers.

Security (:mod:`connect_wire.client_security`): given a :class:`ClientSecurity`, every
connection (bootstrap, FindCoordinator's node, each node of ``groups list``) is opened with TLS
when the protocol says so and authenticated (ApiVersions, SaslHandshake, SaslAuthenticate)
before its first request, and authenticated again before the session lifetime the server gave
ends (KIP-368). A refusal raises :class:`SecurityError` (not an :class:`AdminError`: the next
bootstrap address is not tried, as Kafka's clients treat it as fatal).
"""

from __future__ import annotations

import itertools
import random
import socket
import ssl
import struct
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from connect_wire import codec
from connect_wire.addresses import Address, format_addresses
from connect_wire.apis import APIS
from connect_wire.client_security import (
    HANDSHAKE_CUT,
    ClientSecurity,
    ExchangeError,
    Session,
    open_exchange,
    protocol_mismatch,
    reauth_exchange,
    tls_failure,
    wire_types,
)
from connect_wire.errors import ErrorCode, error_name
from connect_wire.framing import encode_request_frame, parse_response_header

REDISCOVER = {int(ErrorCode.NOT_COORDINATOR), int(ErrorCode.COORDINATOR_NOT_AVAILABLE)}
"""The group's coordinator is elsewhere or not known yet: FindCoordinator again."""
RETRY_SAME_NODE = {int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)}
"""The node is loading the group's partition: ask it again (as Kafka's clients do)."""
SETTINGS = "--security-protocol or --command-config"
"""Where the admin CLI's security protocol is set (named when it probably does not match)."""
RETRY_LISTING = {int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), int(ErrorCode.COORDINATOR_NOT_AVAILABLE)}
"""ListGroups answers asked again of the same node (Kafka's AdminClient.listConsumerGroups)."""


class AdminError(Exception):
    """The coordinator could not be reached or answered something unreadable."""


class CannotConnect(AdminError):
    """No TCP connection to the address (nothing was sent)."""


class _Unusable(AdminError):
    """An answer the authentication exchange cannot use."""


class AuthenticationInterrupted(CannotConnect):
    """The server closed the connection during SASL authentication without refusing it: a
    server busy with other logins does that (it throttles, as Kafka); worth retrying, unlike
    a refusal. Nothing but the authentication was sent."""


class TimeSpent(CannotConnect):
    """The command's deadline passed before this connection or request (nothing was sent)."""


def _wait_bound(timeout_s: float, deadline: float | None, what: str) -> float:
    """How long the next connect or read may block: ``timeout_s``, cut to what is left before
    ``deadline`` (TimeSpent once nothing is)."""
    if deadline is None:
        return timeout_s
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeSpent(f"{what}: not asked, the timeout was spent")
    return min(timeout_s, left)


class AdminClient:
    """One connection; with ``security`` (and its ``ssl_context``, built once by the caller)
    opened with TLS and authenticated here, re-authenticated before a call once 85-95 % of the
    session lifetime the server gave has passed. ``timeout_s`` bounds each connect and read;
    ``deadline`` (time.monotonic()), when given, bounds them all together."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0,
                 client_id: str = "connect-coordinator-cli",
                 security: ClientSecurity | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 deadline: float | None = None) -> None:
        self.address = (host, port)
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.client_id = client_id
        self.security = security
        self.session: Session | None = None
        self.reauthentications = 0
        self._reauth_at: float | None = None
        self._ids = itertools.count(1)
        self.answers = 0
        """Answers read on this connection (none yet: a closed connection hints at a listener
        of another security protocol)."""
        where = format_addresses([self.address])
        wait = _wait_bound(timeout_s, deadline, where)
        try:
            sock = socket.create_connection(self.address, timeout=wait)
        except TimeoutError:
            raise CannotConnect(f"cannot connect to {where}: no connection within "
                                f"{wait:.2g}s") from None
        except OSError as exc:
            raise CannotConnect(f"cannot connect to {where}: {exc}") from None
        if security is not None and security.uses_tls:
            context = ssl_context or security.ssl_context()
            try:
                sock = context.wrap_socket(sock, server_hostname=host)
            except OSError as exc:  # (ssl.SSLError included)
                sock.close()
                refused = tls_failure(exc, where, security)
                if refused is not None:
                    raise refused from None
                hint = (f"; it does not seem to speak TLS: {protocol_mismatch(security, SETTINGS)}"
                        if isinstance(exc, HANDSHAKE_CUT) else "")
                raise CannotConnect(f"TLS handshake with {where} failed: {exc}{hint}") from None
        self.sock = sock
        if security is not None and security.protocol != "PLAINTEXT":
            try:
                self.session = self._drive(open_exchange(security, where))
            except _Unusable:
                self.close()
                raise
            except AdminError as exc:
                self.close()
                raise AuthenticationInterrupted(
                    f"{where} closed the connection during authentication ({exc}); a server "
                    "busy with other logins does so") from None
            except BaseException:
                self.close()
                raise
            self._reauth_at = self.session.reauth_at() if self.session is not None else None

    def _drive(self, exchange: Any) -> Any:
        try:
            request = next(exchange)
            while True:
                request = exchange.send(self._exchange(request, None))
        except StopIteration as done:
            return done.value
        except ExchangeError as exc:
            raise _Unusable(str(exc)) from None

    def _reauthenticate(self) -> None:
        """KIP-368: SaslHandshake + SaslAuthenticate again on this connection."""
        assert self.security is not None and self.session is not None
        self.session = self._drive(reauth_exchange(self.security, self.session,
                                                   format_addresses([self.address])))
        self.reauthentications += 1
        self._reauth_at = self.session.reauth_at()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tls_refusal(self) -> Any:
        """After a failed send: the TLS alert the server may have sent before it closed (a
        write can fail before the alert is read), as a refusal; None if there is none."""
        try:
            self.sock.settimeout(0.5)
            self.sock.recv(1)
        except OSError as exc:
            return tls_failure(exc, format_addresses([self.address]), self.security)
        return None

    def _mismatch_hint(self) -> str:
        """For a connection the server closed before its first answer: the likely cause
        (:func:`connect_wire.client_security.protocol_mismatch`)."""
        if self.answers:
            return ""
        return f" before answering anything on it: {protocol_mismatch(self.security, SETTINGS)}"

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            # Bounded reads: recv(n) allocates n bytes, whatever size the peer declared.
            chunk = self.sock.recv(min(n, 1 << 16))
            if not chunk:
                raise AdminError(f"{self.address[0]}:{self.address[1]} closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def call(self, request: Any, version: int | None = None) -> Any:
        if self._reauth_at is not None and time.monotonic() >= self._reauth_at:
            self._reauthenticate()
        return self._exchange(request, version)

    def _exchange(self, request: Any, version: int | None) -> Any:
        if version is None:
            key, version, request_header, response_cls, response_header = wire_types(type(request))
        else:
            api = APIS[type(request).__api_key__]
            key, request_header = api.key, api.request_header_version(version)
            response_cls, response_header = (api.response_class(version),
                                             api.response_header_version(version))
        wait = _wait_bound(self.timeout_s, self.deadline, format_addresses([self.address]))
        self.sock.settimeout(wait)
        correlation_id = next(self._ids)
        frame = encode_request_frame(
            key, version, correlation_id, self.client_id, codec.encode(request),
            header_version=request_header,
        )
        try:
            self.sock.sendall(frame)
            (size,) = struct.unpack(">i", self._read_exactly(4))
            if size < 0:  # was a ValueError from recv(), escaping the AdminError contract
                raise AdminError(f"{self.address[0]}:{self.address[1]} sent a negative frame size")
            body = self._read_exactly(size)
        except AdminError as exc:
            raise AdminError(f"{exc}{self._mismatch_hint()}") from None
        except (OSError, struct.error) as exc:
            refused = tls_failure(exc, format_addresses([self.address]), self.security) \
                if isinstance(exc, OSError) else None
            if refused is None and isinstance(exc, OSError) and self.security is not None \
                    and self.security.uses_tls:
                refused = self._tls_refusal()
            if refused is not None:  # (TLS 1.3: the server refusing our certificate shows here)
                raise refused from None
            if isinstance(exc, TimeoutError):
                raise AdminError(f"request to {self.address[0]}:{self.address[1]} failed: no "
                                 f"answer within {wait:.2g}s") from None
            raise AdminError(f"request to {self.address[0]}:{self.address[1]} failed: {exc}"
                             f"{self._mismatch_hint() if isinstance(exc, ConnectionError) else ''}"
                             ) from None
        self.answers += 1
        got, offset = parse_response_header(body, response_header)
        if got != correlation_id:
            raise AdminError(f"correlation id {got} != {correlation_id}")
        try:
            return codec.decode(response_cls, body, offset)[0]
        except codec.DecodeError as exc:
            raise AdminError(f"unreadable response: {exc}") from None


class OutcomeUnknown(AdminError):
    """A change was sent and the connection broke before its answer: it may or may not have
    been applied (it is not resent blindly)."""


def _error_of(resp: Any) -> int:
    """The error that decides a retry: the response's own, else its one group's (Describe) or
    its one resource's (DescribeConfigs, IncrementalAlterConfigs)."""
    code = getattr(resp, "error_code", None)
    if code is None:
        groups = (getattr(resp, "groups", None) or getattr(resp, "results", None)
                  or getattr(resp, "responses", None) or ())
        code = groups[0].error_code if len(groups) == 1 else 0
    return int(code or 0)


@dataclass(frozen=True)
class Node:
    """A coordinator node as Metadata lists it (Kafka's broker)."""

    node_id: int
    host: str
    port: int

    @property
    def address(self) -> Address:
        return self.host, self.port

    def __str__(self) -> str:
        return f"node {self.node_id} at {format_addresses([self.address])}"


@dataclass
class GroupListing:
    """What :meth:`AdminSession.list_groups` found: ``groups`` (group id, state) sorted by id,
    each group once, from every node that answered; ``failures`` (node, what happened) for each
    node that could not be reached or answered an error (an error answer's groups are listed
    all the same: they are what the node's other partitions hold)."""

    nodes: list[Node]
    groups: list[tuple[str, str]] = field(default_factory=list)
    failures: list[tuple[Node, str]] = field(default_factory=list)


class AdminSession:
    """Admin requests against a coordinator cluster reached through a bootstrap list.

    ``timeout_s`` bounds each connect and read, and also how long :meth:`group_call` keeps
    retrying a group whose coordinator is moving or loading. ``deadline`` (time.monotonic()),
    when given, bounds everything the session does together (the CLI's ``--timeout``: Metadata,
    FindCoordinator, every connection, request and retry): past it nothing more is asked.
    Connections are cached per address and closed by :meth:`close` (or the context manager).
    """

    def __init__(self, bootstrap: Sequence[Address], timeout_s: float = 10.0,
                 client_id: str = "connect-coordinator-cli", backoff_s: float = 0.05,
                 max_backoff_s: float = 1.0, security: ClientSecurity | None = None,
                 deadline: float | None = None) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address is needed")
        self.bootstrap = list(bootstrap)
        # Security: the TLS context (CA and client certificate files) is loaded
        # once, here (SecurityConfigError if it cannot be).
        self.security = security
        self.ssl_context = security.ssl_context() if security is not None else None
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.client_id = client_id
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._clients: dict[Address, AdminClient] = {}
        self.coordinators: dict[str, Node] = {}
        """Each group's coordinator as FindCoordinator last named it (node id and address)."""
        self.sleep: Callable[[float], None] = time.sleep

    def __enter__(self) -> AdminSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _client(self, address: Address, deadline: float | None) -> AdminClient:
        client = self._clients.get(address)
        if client is None:
            client = self.connect(address, deadline)
            self._clients[address] = client
        client.deadline = deadline
        return client

    def connect(self, address: Address, deadline: float | None = None) -> AdminClient:
        """A new connection to ``address`` with the session's security (not cached), bound by
        ``deadline`` (default: the session's). An authentication the server interrupted (busy)
        is tried again, backing off as :meth:`group_call` does, until that deadline or
        ``timeout_s``."""
        bound = self.deadline if deadline is None else deadline
        retry_until = self._deadline() if bound is None else min(self._deadline(), bound)
        failures = 0
        while True:
            try:
                return AdminClient(*address, timeout_s=self.timeout_s, client_id=self.client_id,
                                   security=self.security, ssl_context=self.ssl_context,
                                   deadline=bound)
            except AuthenticationInterrupted:
                failures += 1
                pause = random.uniform(self.backoff_s / 2, min(
                    self.max_backoff_s, self.backoff_s * 2 ** min(failures, 16)))
                if time.monotonic() + pause > retry_until:
                    raise
                self.sleep(pause)

    def _share(self, ways: int) -> float | None:
        """The deadline for one of ``ways`` addresses still to try in turn: an equal share of
        what is left of the session's (a frozen first address leaves time for the others)."""
        if self.deadline is None:
            return None
        now = time.monotonic()
        return now + max(0.0, self.deadline - now) / ways

    def _deadline(self) -> float:
        """When retrying stops: ``timeout_s`` from now, or the session's deadline if sooner."""
        own = time.monotonic() + self.timeout_s
        return own if self.deadline is None else min(own, self.deadline)

    def _drop(self, address: Address) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            client.close()

    def _call_at(self, address: Address, request: Any, ways: int = 1) -> Any:
        try:
            return self._client(address, self._share(ways)).call(request)
        except AdminError:
            self._drop(address)  # the connection is unusable (its request order is lost)
            raise

    def any_call(self, request: Any) -> tuple[Address, Any]:
        """Send ``request`` to the first bootstrap address that answers it, in the order given;
        an AdminError naming every address (and what each did) if none does."""
        failures = []
        for i, address in enumerate(self.bootstrap):
            try:
                return address, self._call_at(address, request, len(self.bootstrap) - i)
            except AdminError as exc:
                failures.append(str(exc))
        raise AdminError(f"no coordinator answered at {format_addresses(self.bootstrap)}: "
                         + "; ".join(failures))

    def find_coordinator(self, group_id: str) -> Address:
        """The address of ``group_id``'s coordinator as the cluster tells it (FindCoordinator at
        the first bootstrap address that answers; the node, with its id, is kept in
        :attr:`coordinators`). Raises AdminError when no address answers,
        and :class:`CoordinatorError` for an error in the answer."""
        from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

        request = FindCoordinatorRequest(key_type=0, coordinator_keys=(group_id,))
        failures: list[str] = []
        refused: CoordinatorError | None = None
        for i, address in enumerate(self.bootstrap):
            try:
                resp = self._call_at(address, request, len(self.bootstrap) - i)
            except AdminError as exc:
                failures.append(str(exc))
                continue
            (c,) = resp.coordinators
            if int(c.error_code):
                refused = CoordinatorError(int(c.error_code), c.error_message)
                if refused.code in REDISCOVER:
                    # That node does not know the owner now (e.g. it is cut off from etcd, or
                    # the partition is moving): another node may.
                    continue
                raise refused
            self.coordinators[group_id] = Node(int(c.node_id), c.host, int(c.port))
            return c.host, int(c.port)
        if refused is not None:
            raise refused
        raise AdminError(f"no coordinator answered at {format_addresses(self.bootstrap)}: "
                         + "; ".join(failures))

    def nodes(self) -> tuple[Address, list[Node]]:
        """Every coordinator node, from Metadata at the first bootstrap address that answers it
        (and that address). AdminError when no address answers or the list is empty."""
        from kio.schema.metadata.v12.request import MetadataRequest

        address, resp = self.any_call(MetadataRequest(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        nodes = sorted({Node(int(b.node_id), b.host, int(b.port)) for b in resp.brokers},
                       key=lambda n: (n.node_id, n.host, n.port))
        if not nodes:
            raise AdminError(f"Metadata at {format_addresses([address])} listed no coordinator node")
        return address, nodes

    def list_groups(self, states_filter: Sequence[str] = (),
                    types_filter: Sequence[str] = ()) -> GroupListing:
        """ListGroups on every node and the answers merged, as Kafka's AdminClient
        ``listConsumerGroups`` does (a node lists only the groups of the partitions it owns).

        The nodes come from Metadata at the first bootstrap address that answers (no address
        answering raises AdminError). When Metadata lists a single node, that node is the one
        that answered, so it is asked on the same connection (its advertised address need not
        be reachable from here: a single daemon behaves as before). Nodes are asked in
        parallel. COORDINATOR_LOAD_IN_PROGRESS and COORDINATOR_NOT_AVAILABLE are asked again
        of the same node with the session's backoff until ``timeout_s`` (Kafka retries those);
        any other error, and a node that cannot be reached or breaks the connection, is
        reported at once in ``failures`` (Kafka retries a disconnected node until its timeout;
        a command should name the dead node now). An error answer's groups still count. A
        group listed by several nodes (its partition moving between the answers) is listed
        once, with the state given by the node with the lowest id."""
        from kio.schema.list_groups.v5.request import ListGroupsRequest

        request = ListGroupsRequest(states_filter=tuple(states_filter),
                                    types_filter=tuple(types_filter))
        answered, nodes = self.nodes()
        deadline = self._deadline()

        def ask(node: Node) -> tuple[Any, str | None]:
            # One node: the connection Metadata came on. Several: a connection per thread of
            # its own (not the session's cache, which is not shared between threads).
            own: AdminClient | None = None
            failures = 0
            try:
                while True:
                    try:
                        if len(nodes) == 1:
                            resp = self._call_at(answered, request)
                        else:
                            if own is None:
                                own = self.connect(node.address)
                            resp = own.call(request)
                    except AdminError as exc:
                        return None, str(exc)
                    code = int(resp.error_code)
                    if code not in RETRY_LISTING:
                        return resp, (f"{error_name(code)}: some partitions did not answer"
                                      if code else None)
                    failures += 1
                    pause = random.uniform(self.backoff_s / 2, min(
                        self.max_backoff_s, self.backoff_s * 2 ** min(failures, 16)))
                    if time.monotonic() + pause > deadline:
                        return resp, (f"{error_name(code)}: " + (
                            "some of its partitions were still loading"
                            if code in RETRY_SAME_NODE else
                            "some partitions had no live node serving them (a failover, or "
                            "nodes cut off from etcd)") + f" after {self.timeout_s:g}s: their "
                            "groups are missing")
                    self.sleep(pause)
            finally:
                if own is not None:
                    own.close()

        if len(nodes) == 1:
            answers = [ask(nodes[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(len(nodes), 16)) as pool:
                answers = list(pool.map(ask, nodes))
        listing = GroupListing(nodes)
        merged: dict[str, str] = {}
        for node, (resp, failure) in zip(nodes, answers, strict=True):
            if failure is not None:
                listing.failures.append((node, failure))
            for g in resp.groups if resp is not None else ():
                merged.setdefault(g.group_id, g.group_state)
        listing.groups = sorted(merged.items())
        return listing

    def owner_call(self, request: Any) -> Any:
        """Send ``request`` (about one group, without FindCoordinator) to every node Metadata
        lists, in turn, until one answers with something else than NOT_COORDINATOR,
        COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS; rounds repeated with backoff
        until ``timeout_s``. For the config APIs: Kafka's clients send them to any broker, and
        FindCoordinator needs DESCRIBE on the group, which a principal allowed only
        DESCRIBE_CONFIGS does not have."""
        deadline = self._deadline()
        failures = 0
        while True:
            _, nodes = self.nodes()
            last: Exception | None = None
            for node in nodes:
                try:
                    resp = self._call_at(node.address, request, len(nodes))
                except AdminError as exc:
                    last = exc
                    continue
                code = _error_of(resp)
                if code not in REDISCOVER and code not in RETRY_SAME_NODE:
                    return resp
                last = CoordinatorError(code, None)
            failures += 1
            pause = random.uniform(self.backoff_s / 2, min(self.max_backoff_s,
                                                           self.backoff_s * 2 ** min(failures, 16)))
            if time.monotonic() + pause > deadline:
                raise AdminError(f"no node answered as the group's coordinator within "
                                 f"{self.timeout_s:g}s (last: {last})")
            self.sleep(pause)

    def group_call(self, group_id: str, request: Any, resend_if_lost: bool = True,
                   retry: frozenset[int] = frozenset()) -> Any:
        """Send ``request`` to ``group_id``'s coordinator and return its answer.

        NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE (in the answer or from FindCoordinator),
        a coordinator that cannot be reached and a broken connection make it find the
        coordinator again and resend; COORDINATOR_LOAD_IN_PROGRESS resends to the same node.
        Retries back off exponentially with jitter from ``backoff_s`` to at most
        ``max_backoff_s`` and stop after ``timeout_s`` (the last error is raised). With
        ``resend_if_lost=False`` (a change) a connection broken after sending raises
        :class:`OutcomeUnknown` instead of resending. The codes in ``retry`` are asked again of
        the same node the same way (past ``timeout_s`` the last answer is returned). Other
        errors in the answer are returned.
        """
        deadline = self._deadline()
        failures = 0
        address: Address | None = None
        while True:
            answered: Any = None  # an answer asked again (``retry``): returned past the deadline
            try:
                if address is None:
                    address = self.find_coordinator(group_id)
                resp = self._call_at(address, request)
                code = _error_of(resp)
                answered = resp if code in retry else None
                if answered is not None:
                    if time.monotonic() + self.backoff_s > deadline:
                        return resp
                elif code not in REDISCOVER and code not in RETRY_SAME_NODE:
                    return resp
                last: Exception = CoordinatorError(code, getattr(resp, "error_message", None) or (
                    resp.groups[0].error_message if getattr(resp, "groups", None) else None))
                if code in REDISCOVER:
                    address = None
            except CoordinatorError as exc:  # from FindCoordinator
                if exc.code not in REDISCOVER:
                    raise
                last, address = exc, None
            except AdminError as exc:
                if address is None:  # no bootstrap address answered: nothing to wait for
                    raise
                if not resend_if_lost and not isinstance(exc, CannotConnect):
                    raise OutcomeUnknown(f"group {group_id}: {exc}; the change may or may not "
                                         "have been applied (check with describe)") from None
                last, address = exc, None
            failures += 1
            pause = random.uniform(self.backoff_s / 2, min(self.max_backoff_s,
                                                           self.backoff_s * 2 ** min(failures, 16)))
            if time.monotonic() + pause > deadline:
                if answered is not None:  # (the coordinator answered: its answer, not "none")
                    return answered
                raise AdminError(f"group {group_id}: no answer from its coordinator within "
                                 f"{self.timeout_s:g}s (last: {last})")
            self.sleep(pause)


class CoordinatorError(AdminError):
    """An error code in an answer that retrying did not (or cannot) fix."""

    def __init__(self, code: int, message: str | None) -> None:
        super().__init__(f"{error_name(code)}: {message or 'no message'}")
        self.code = code
