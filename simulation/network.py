"""The simulated network: TCP connections between worker processes and coordinator nodes.

It keeps per-connection FIFO order; latencies are sampled per message (``rng_net``), so
messages on different connections reorder. A lost message resets its connection; a partition
delays a worker's messages until it heals (TCP retransmits) or its requests time out. With
several coordinator nodes a worker first finds the owner (FindCoordinator: every bootstrap
node asked at once, or one after another), as ``CoordinatorClient`` does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from connect_wire.messages import ConnectGroupHeartbeatRequest


@runtime_checkable
class NetWorker(Protocol):
    """A worker process as the network sees it (:class:`~simulation.worker_model.SimWorker` is
    one): its incarnation and connections, its partition, its process events and what it is told
    of its connections."""

    name: str
    inc: int
    alive: bool
    coordinator_known: bool
    part_start: int
    part_end: int
    conns: dict[str, Conn | None]

    def at(self, t: int, fn: Callable[..., None], *args: Any, io: bool = False) -> None: ...
    def fail_conn(self, conn: Conn, why: str) -> None: ...
    def deliver(self, conn: Conn, pend: Pending, resp: Any) -> None: ...
    def timeout(self, conn: Conn, pend: Pending) -> None: ...


@runtime_checkable
class NetNode(Protocol):
    """A coordinator node as the network sees it (:class:`~simulation.nodes.CoordinatorNode` is
    one): its incarnation and the requests it receives."""

    inc: int

    def receive(self, conn: Conn, pending: Pending) -> None: ...


class Pending:
    """A request in flight from a worker: its callbacks and deadline."""

    __slots__ = ("request", "on_ok", "on_fail", "deadline", "timeout", "done", "ignore")

    def __init__(self, request: Any, on_ok: Callable[[Any], None], on_fail: Callable[[str], None],
                 deadline: int, timeout: int = 0) -> None:
        self.request = request
        self.on_ok = on_ok
        self.on_fail = on_fail
        self.deadline = deadline
        self.timeout = timeout
        self.done = False
        self.ignore = False  # the caller stopped waiting (cancelled): drop the answer


class Conn:
    """One TCP connection between a worker process and the coordinator process."""

    __slots__ = ("cid", "worker", "inc", "kind", "state", "node", "coord_inc", "up_last", "down_last",
                 "inflight", "queued")

    def __init__(self, cid: int, worker: NetWorker, kind: str, node: NetNode) -> None:
        self.cid = cid
        self.worker = worker
        self.inc = worker.inc
        self.kind = kind
        self.state = "connecting"
        self.node = node  # the coordinator node (its partition instance) it is connected to
        self.coord_inc = node.inc
        self.up_last = 0
        self.down_last = 0
        self.inflight: deque[Pending] = deque()
        self.queued: list[Pending] = []

    @property
    def open(self) -> bool:
        return self.state == "open"


class Find:
    """One FindCoordinator of a worker's client (CoordinatorClient._find_coordinator since
    72dc392): every bootstrap node asked at once for the connection ``conn``; ``left`` are the
    nodes whose ask has not ended yet (failed, or answered an error)."""

    __slots__ = ("conn", "begun", "left", "done")

    def __init__(self, conn: Conn, begun: int, nodes: list[str]) -> None:
        self.conn = conn
        self.begun = begun
        self.left = list(nodes)
        self.done = False


CONNECT_TIMEOUT_MS = 2_000
"""CoordinatorClient's TCP connect timeout."""


# == the network, as a part of Simulation ==========================================================


class Network:
    """The part of :class:`~simulation.engine.Simulation` that carries messages between the
    workers and the coordinator nodes: connections, latencies, loss, partitions, resets, and
    FindCoordinator over several nodes."""

    def latency(self) -> int:
        return self.sample(self.rng_net, self.scenario.latency_ms)

    def all_conns(self) -> list[Conn]:
        out = []
        for w in [*self.workers, *([self.admin] if self.admin is not None else [])]:
            for kind in ("hb", "ctl"):
                conn = w.conns.get(kind)
                if conn is not None and conn.state != "closed":
                    out.append(conn)
        return out

    def connect(self, w: NetWorker, kind: str) -> Conn:
        self._cids += 1
        conn = Conn(self._cids, w, kind, self.coord)
        if self.multi and not w.coordinator_known and self.scenario.find_parallel and w is not self.admin:
            self._find_parallel(w, conn)
            return conn
        rtt = self.latency() + self.latency()
        if not w.coordinator_known:  # FindCoordinator first
            rtt += self._find_coordinator_ms() if self.multi else self.latency() + self.latency()
        t = self.now + rtt
        if w.part_start <= self.now < w.part_end:
            heal = w.part_end + rtt
            t = heal if heal <= self.now + self.scenario.request_timeout_ms else -1
        if t < 0:
            w.at(self.now + self.scenario.request_timeout_ms, self._connect_done, conn, False)
        else:
            w.at(t, self._connect_done, conn, True)
        return conn

    def _connect_done(self, conn: Conn, ok: bool) -> None:
        w = conn.worker
        if conn.state != "connecting":
            return
        coord = self.coord  # (with several nodes: the owner FindCoordinator named, if any)
        if ok and self.multi and self.node_host_lost[coord.node]:
            # its host is unreachable: the TCP connect times out (CoordinatorClient: 2 s)
            w.at(self.now + CONNECT_TIMEOUT_MS, self._connect_done, conn, False)
            return
        if not ok or not coord.up or not coord.owner:
            w.fail_conn(conn, "cannot connect to the coordinator")
            return
        conn.state = "open"
        conn.node = coord
        conn.coord_inc = coord.inc
        w.coordinator_known = True
        queued, conn.queued = conn.queued, []
        for pend in queued:
            if not pend.done:
                self.net_request(conn, pend)

    def _arrival(self, conn: Conn, up: bool) -> int:
        w = conn.worker
        t = self.now + self.latency()
        if w.part_start <= self.now < w.part_end:
            t = max(t, w.part_end + self.latency())
        if up:
            t = max(t, conn.up_last)
            conn.up_last = t
        else:
            t = max(t, conn.down_last)
            conn.down_last = t
        return t

    def _lost(self) -> bool:
        loss = self.scenario.loss
        return self.phase == "faults" and loss > 0 and self.rng_net.random() < loss

    def net_request(self, conn: Conn, pend: Pending) -> None:
        self.messages += 1
        if isinstance(pend.request, ConnectGroupHeartbeatRequest):
            self.heartbeats += 1
        conn.inflight.append(pend)
        pend.deadline = self.now + pend.timeout  # (the client's timeout runs from the write)
        conn.worker.at(pend.deadline, conn.worker.timeout, conn, pend)
        if self._lost():
            self.trace("message_lost", conn.worker.name, detail=type(pend.request).__name__)
            self.reset_conn(conn, "connection reset")
            return
        self.at(self._arrival(conn, True), self._to_coordinator, conn, pend)

    def _to_coordinator(self, conn: Conn, pend: Pending) -> None:
        w = conn.worker
        if conn.state != "open":
            return
        if w.part_start <= self.now < w.part_end:  # a partition began meanwhile: retransmitted later
            t = max(w.part_end + self.latency(), conn.up_last)
            conn.up_last = t
            self.at(t, self._to_coordinator, conn, pend)
            return
        conn.node.receive(conn, pend)

    def net_response(self, conn: Conn, pend: Pending, resp: Any) -> None:
        if conn.state != "open" or conn.coord_inc != conn.node.inc:
            return
        self.messages += 1
        if self._lost():
            self.trace("message_lost", conn.worker.name, detail=type(resp).__name__)
            self.reset_conn(conn, "connection reset")
            return
        conn.worker.at(self._arrival(conn, False), self._to_worker, conn, pend, resp, io=True)

    def _to_worker(self, conn: Conn, pend: Pending, resp: Any) -> None:
        w = conn.worker
        if conn.state != "open":
            return
        if w.part_start <= self.now < w.part_end:
            t = max(w.part_end + self.latency(), conn.down_last)
            conn.down_last = t
            w.at(t, self._to_worker, conn, pend, resp, io=True)
            return
        w.deliver(conn, pend, resp)

    def reset_conn(self, conn: Conn, why: str, notify: bool = True, delay: int | None = None) -> None:
        """The connection breaks: both ends learn it (the worker after ``delay``, default one
        latency: an RST); whatever is in flight on it is lost."""
        if conn.state == "closed":
            return
        w = conn.worker
        if notify and w.alive and conn.inc == w.inc:
            conn.state = "closing"
            if delay == 0:
                self._reset_seen(conn, why)
            else:
                w.at(self.now + (self.latency() if delay is None else delay), self._reset_seen, conn, why)
        else:
            conn.state = "closed"

    def _reset_seen(self, conn: Conn, why: str) -> None:
        if conn.state != "closed":
            conn.worker.fail_conn(conn, why)

    # -- FindCoordinator (several nodes) ---------------------------------------------------------------
    def _find_parallel(self, w: NetWorker, conn: Conn) -> None:
        """CoordinatorClient._find_coordinator since 72dc392, then the connect: every bootstrap
        node is asked at once (:meth:`_find_begin`). A partitioned worker's asks wait for the heal
        (TCP retransmits), within the request timeout, as its other connects do."""
        sc = self.scenario
        if w.part_start <= self.now < w.part_end:
            if w.part_end > self.now + sc.request_timeout_ms:
                w.at(self.now + sc.request_timeout_ms, self._connect_done, conn, False)
            else:
                w.at(w.part_end, self._find_begin, conn)
            return
        self._find_begin(conn)

    def _find_begin(self, conn: Conn) -> None:
        """Each node's ask (``_ask_coordinator``): connect, FindCoordinator, within the discovery
        timeout. An unreachable host fails at the connect timeout, a dead node refuses at once, a
        frozen one (its kernel accepts the connection) handles the request when it wakes; a live
        one answers the owner the store has (:meth:`_find_reaches`). The first answer naming one
        wins and the worker connects there (one more round trip, :meth:`_connect_done`); when
        every ask has failed or answered an error, the connection fails (ConnectionFailed) at
        the last one's end."""
        if conn.state != "connecting":
            return
        sc = self.scenario
        w = conn.worker
        order = list(self.node_names)
        self.rng_nodes.shuffle(order)  # (random.sample of the bootstrap list: the asks' order)
        find = Find(conn, self.now, order)
        timeout = min(sc.find_timeout_ms, sc.request_timeout_ms)
        for node in order:
            if self.node_host_lost[node]:  # no RST: the TCP connect times out
                w.at(self.now + min(CONNECT_TIMEOUT_MS, sc.request_timeout_ms), self._find_failed, find, node)
            elif not self.node_alive[node]:  # refused
                w.at(self.now + self.latency(), self._find_failed, find, node, io=True)
            else:
                w.at(self.now + timeout, self._find_failed, find, node)  # the discovery timeout
                self.at(self.now + self.latency(), self._find_reaches, find, node)

    def _find_reaches(self, find: Find, node: str) -> None:
        """The FindCoordinator request reaches ``node``: handled now, or when it wakes if frozen
        (its socket buffers it; its input comes before its timers, so before the renewal that
        waited); nothing comes back from a node killed or cut off meanwhile."""
        if find.done or node not in find.left:
            return
        if self.node_host_lost[node]:
            return  # the discovery timeout ends it
        if not self.node_alive[node]:
            find.conn.worker.at(self.now + self.latency(), self._find_failed, find, node, io=True)
            return
        if self.node_frozen_until[node] > self.now:
            self.at(self.node_frozen_until[node], self._find_reaches, find, node)
            return
        names = self.store.token != 0 and not self._lease_in_doubt(node)
        find.conn.worker.at(self.now + self.latency(), self._find_answered, find, node, names, io=True)


    def _find_answered(self, find: Find, node: str, names: bool) -> None:
        if find.done or node not in find.left:
            return
        if not names:  # COORDINATOR_NOT_AVAILABLE (nobody owns the partition now): wait for the others
            wait = self.scenario.find_error_wait_ms
            if wait >= 0 and len(find.left) > 1:  # (what-if: give the others only that long)
                find.conn.worker.at(self.now + wait, self._find_give_up, find)
            self._find_failed(find, node)
            return
        find.done = True
        conn = find.conn
        if conn.state != "connecting":
            return
        conn.worker.at(self.now + self.latency() + self.latency(), self._connect_done, conn, True)

    def _find_give_up(self, find: Find) -> None:
        if not find.done:
            find.left.clear()
            self._find_no_coordinator(find)

    def _find_failed(self, find: Find, node: str) -> None:
        if find.done or node not in find.left:
            return
        find.left.remove(node)
        if not find.left:
            self._find_no_coordinator(find)

    def _find_no_coordinator(self, find: Find) -> None:
        """Every ask failed or answered an error: ConnectionFailed("no coordinator found via ...");
        the worker retries after its backoff (at most a quarter of what is left of its lease)."""
        find.done = True
        if find.conn.state == "connecting":
            find.conn.worker.fail_conn(find.conn, "no coordinator found")

    def _find_coordinator_ms(self) -> int:
        """CoordinatorClient._find_coordinator before 72dc392 (``find_parallel=False``) and
        AdminSession.find_coordinator: over the bootstrap list one node after another (in random
        order): a dead node refuses at once; a frozen one accepts the connection (its kernel
        does) and answers when it wakes, or the request times out and the next is asked."""
        order = list(self.node_names)
        self.rng_nodes.shuffle(order)
        timeout = min(self.scenario.find_timeout_ms, self.scenario.request_timeout_ms)
        t = 0
        for node in order:
            if self.node_host_lost[node]:
                t += CONNECT_TIMEOUT_MS
                continue
            if not self.node_alive[node]:
                t += self.latency()
                continue
            wakes = self.node_frozen_until[node] - (self.now + t)
            if wakes > 0:
                if wakes >= timeout:
                    t += timeout
                    continue
                t += wakes
            return t + self.latency() + self.latency()
        return t

