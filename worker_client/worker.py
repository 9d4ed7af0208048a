"""The worker runtime: joins a group, runs the connectors and tasks it is given, gives them up
cleanly, and computes the group's assignment when chosen.

Theory of operation
-------------------
The protocol logic is :class:`worker_client.membership.Membership` (pure). This module is the
I/O around it:

* the **main loop** sends each heartbeat Membership asks for (long-polled on the heartbeat
  connection), feeds the response back, and carries out the actions in order: *revoke* (stop the
  instances within the stop budget, call ``on_revoked``, report at
  once), *assign* (fetch the connectors' configs, start the instances, call ``on_assigned``),
  *reconfigure* (after the member epoch moved: fetch the configs again and restart, stop then
  start, only the instances whose connector's config changed), *lost* (stop everything, call
  ``on_lost``, rejoin with the same member id), *compute*
  (PrepareAssignment → assignor → InstallAssignment on the control connection, in the
  background). Revocations and assignments run one at a time in a task of their own while the
  loop keeps heartbeating (plain, not long-polled), so a stop that takes longer than the session
  timeout (it may take the stop budget) does not cost the worker its membership;
  *lost* is carried out at once;
* a **watchdog** fences the worker itself when it has not had a successful heartbeat for the
  session timeout: it stops all work, since the coordinator may already have handed it to
  others;
* each running instance with a ``run()`` coroutine is supervised: a crash is logged, counted
  and the instance restarted with exponential backoff while it stays assigned (it keeps being
  reported as owned: never silently dropped);
* **fail-stop** (:mod:`worker_client.failstop`): an instance is reported stopped only once its
  ``run()`` ended and its ``stop()`` returned within the stop budget; one that does not stop in
  time ends the process (exit status 3), and so does anything still running at the lease's end
  plus the stop budget, checked by a thread that does not need the event loop. The coordinator
  holds a fenced member's items until its session deadline plus the same budget, so nothing
  runs on two workers at once even when a plugin does not stop.

Embedding: ``await Worker(...).run()`` until ``stop()``; hooks via a
:class:`WorkerRebalanceListener`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import itertools
import os
import random
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from connect_wire import verbs
from connect_wire.assignors import (
    Assignor,
    EagerAssignor,
    IncrementalCooperativeAssignor,
    MemberAssignmentInfo,
    group_from_prepare,
    install_request,
)
from connect_wire.client_security import SECURITY_CODES, ClientSecurity, SecurityError
from connect_wire.errors import ErrorCode, ProtocolError, error_name
from connect_wire.instance_states import (
    FAILED,
    RESTARTING,
    RUNNING,
    TEXT_LIMIT_BYTES,
    encodable,
    utf8_tail,
)
from connect_wire.items import Item
from connect_wire.messages import (
    ConnectGroupCommitOffsetsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupFetchOffsetsRequest,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupWriteTaskConfigsRequest,
)
from connect_wire.messages import connect_group_commit_offsets_request_v0 as _commit
from connect_wire.messages import connect_group_write_task_configs_request_v0 as _write
from worker_client import logs
from worker_client.client import ConnectionFailed, CoordinatorClient
from worker_client.config_providers import ConfigProviders
from worker_client.context import (
    FENCED_CODES,
    Context,
    FencedError,
    check_task_configs,
    instance_config,
)
from worker_client.failstop import FAIL_STOP_EXIT, FailStopGuard, exit_process
from worker_client.membership import (
    RETRY,
    Assign,
    AssignorAd,
    Compute,
    Fatal,
    Lost,
    Membership,
    Revoke,
    State,
)
from worker_client.metrics import WorkerMetrics
from worker_client.plugins import (
    InvalidConfig,
    PluginError,
    connector_class,
    error_lines,
    task_class,
    validate,
)

log = logs.get("worker")


class MemberLog:
    """The worker's log, every line with the member's id, instance id and epoch as they are
    when it is written, the names ``groups describe`` and the coordinator's group events use
    (``group``, ``member_id``, ``instance_id``, ``member_epoch``). Read from the
    membership at each call: the id and epoch change as the worker (re)joins, and the instances'
    tasks, started earlier, would keep a stale context bound in a context variable."""

    __slots__ = ("_group", "_instance_id", "_membership")

    def __init__(self, membership: Membership, group: str, instance_id: str | None) -> None:
        self._membership = membership
        self._group = group
        self._instance_id = instance_id

    def context(self) -> dict[str, Any]:
        m = self._membership
        return {"group": self._group, "member_id": m.member_id or None,
                "instance_id": self._instance_id, "member_epoch": m.member_epoch}

    def debug(self, event: str, **fields: Any) -> None:
        log.debug(event, **self.context(), **fields)

    def info(self, event: str, **fields: Any) -> None:
        log.info(event, **self.context(), **fields)

    def warning(self, event: str, **fields: Any) -> None:
        log.warning(event, **self.context(), **fields)

    def error(self, event: str, **fields: Any) -> None:
        log.error(event, **self.context(), **fields)

    def critical(self, event: str, **fields: Any) -> None:
        log.critical(event, **self.context(), **fields)


def now_ms() -> int:
    """The worker's clock for its lease, deadlines and timers: monotonic (a lease is a local
    duration; a wall-clock step must not stretch it)."""
    return time.monotonic_ns() // 1_000_000


class WorkerFailed(Exception):
    """The coordinator refused this worker for good (e.g. UNSUPPORTED_ASSIGNOR)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class WorkerSecurityFailed(WorkerFailed):
    """The coordinator refused this worker's credentials or permissions: TLS or SASL
    authentication failed, or GROUP_AUTHORIZATION_FAILED. Retrying cannot fix it: the worker
    stopped its work and ``run()`` raised this (``connect-worker`` exits with status 4)."""


class WorkerFailStopped(WorkerFailed):
    """An instance could not be stopped within its budget (the fail-stop rule): only raised when
    ``WorkerConfig.fail_stop`` is set and returned instead of ending the process."""

    def __init__(self, reason: str) -> None:
        super().__init__(-1, f"fail-stop: {reason}")
        self.reason = reason


class _FailStopped(Exception):
    """Unwinds an action after a fail-stop: nothing it stopped may be reported."""


class WorkerRebalanceListener:
    """Hooks for embedders (Kafka Connect's ``WorkerRebalanceListener``); may be async."""

    def on_assigned(self, items: frozenset[Item]) -> Any: ...

    def on_revoked(self, items: frozenset[Item]) -> Any: ...

    def on_lost(self, items: frozenset[Item]) -> Any: ...


TRACE_LIMIT = TEXT_LIMIT_BYTES
"""At most this many UTF-8 bytes of a failure's traceback are kept, reported and logged (the
end of it: the innermost frames and the error), what the coordinator keeps."""
ERROR_LIMIT = 1024
"""At most this many UTF-8 bytes of a failure's ``repr`` (its start: the type and message)."""


def failure_trace(exc: BaseException, limit: int = TRACE_LIMIT) -> str:
    """The traceback's last ``limit`` bytes of UTF-8 (what UTF-8 cannot encode escaped: a
    heartbeat carrying it could not be sent, which ended the worker)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return utf8_tail(encodable(text), limit)


def failure_error(exc: BaseException, text: Callable[[BaseException], str] = repr,
                  limit: int = ERROR_LIMIT) -> str:
    return encodable(text(exc)).encode("utf-8")[:limit].decode("utf-8", "ignore")


@dataclass
class _Instance:
    item: Item
    plugin: Any
    config: dict[str, str | None]
    run_task: asyncio.Task[None] | None = None
    supervisor: asyncio.Task[None] | None = None
    restarts: int = 0
    stopping: bool = False
    started: bool = False
    """start() was called and stop() not since: the plugin needs exactly one stop()."""
    counted: bool = False
    """Counted in the running-instances gauge."""
    base: dict[str, str | None] | None = None
    """The connector's config as fetched for the last start (without the worker's additions):
    compared with a fresh fetch to find a config change (:class:`_Reconfigure`)."""
    task_config: dict[str, str] | None = None
    """The task's own config (written by its connector instance) it was last started with."""
    context: Context | None = None
    max_tasks: int = 0
    """Connector instance with ``task_configs``: the configured task count it is called with."""
    reconfigure: asyncio.Event | None = None
    """Connector instance with ``task_configs``: set to have it called again (coalesced)."""
    stopping_crashed: bool = False
    """The supervisor is stopping an instance whose run() failed."""
    state: str = RUNNING
    """What the worker reports (Status): RUNNING; FAILED from a failure of start() or
    run() until the next attempt; RESTARTING while that attempt starts the plugin again."""
    error: str | None = None
    """The last failure: its error and traceback (bounded), reported with FAILED/RESTARTING."""
    trace: str | None = None

    def report(self) -> tuple[str, str | None, str | None]:
        return (self.state, self.error, self.trace) if self.state != RUNNING else (RUNNING, None, None)


@dataclass(frozen=True)
class _Spec:
    """A connector as Describe shows it: its config, configured task count, and the task
    configs its connector instance wrote (None: none written)."""

    config: dict[str, str | None]
    task_count: int = 0
    task_configs: tuple[dict[str, str], ...] | None = None

    def task_config(self, task: int) -> dict[str, str] | None:
        configs = self.task_configs
        return configs[task] if configs is not None and 0 <= task < len(configs) else None


def _defines_task_configs(config: dict[str, str | None]) -> bool:
    """The connector's class defines ``task_configs`` (False when it cannot be loaded here:
    starting the instance reports that)."""
    try:
        return callable(getattr(connector_class(config), "task_configs", None))
    except PluginError:
        return False


@dataclass(frozen=True)
class _Reconfigure:
    """The member epoch moved (a change of the group's connectors bumps the group epoch, and so
    every member's epoch once the new target is installed): re-fetch the configs and restart the
    instances whose connector's config changed. Queued behind the revocations and assignments
    (one action at a time), so a restart never races a stop or start of the same item."""

    member_epoch: int


@dataclass
class WorkerConfig:
    bootstrap: Sequence[tuple[str, int]]
    group_id: str
    member_id: str = ""
    instance_id: str | None = None
    worker_url: str | None = None
    rebalance_timeout_ms: int | None = None
    """Deprecated way to set the stop budget (half of it, at least 100 ms), as in the first releases;
    the worker announces twice its stop budget as its rebalance timeout either way."""
    session_timeout_ms: int = 10_000
    long_poll: bool = True
    max_delay_ms: int = 300_000
    assignors: Sequence[str] = ("incremental", "eager")
    request_timeout_ms: int = 30_000
    client_id: str = field(default_factory=lambda: f"connect-worker-{os.getpid()}")
    stop_budget_ms: int | None = None
    """The stop budget: how long stopping one instance may take (``stop()`` and the end of its
    ``run()``), Kafka Connect's ``task.shutdown.graceful.timeout.ms``. Default
    :data:`DEFAULT_STOP_BUDGET_MS` (5 s), or half ``rebalance_timeout_ms`` when only that is
    given. The worker announces twice it as its rebalance timeout, from which the coordinator
    computes the same budget for the hold of a fenced member's items (the fail-stop rule)."""
    config_providers: ConfigProviders | None = None
    """Kafka's config providers (``${file:...}``, ``${env:...}``): resolved here when an
    instance starts, so secrets never reach the coordinator (:mod:`worker_client.config_providers`).
    None: references are passed to the plugin as written."""
    security: ClientSecurity | None = None
    """Kafka's client security (TLS, SASL: :mod:`connect_wire.client_security`); None =
    PLAINTEXT. Credentials refused end ``run()`` with :class:`WorkerSecurityFailed`."""
    fail_stop: Callable[[str], None] | None = None
    """What to do when an instance cannot be stopped within its budget (the fail-stop rule,
    :mod:`worker_client.failstop`). Default (None): log and end the process at once with exit
    status 3. Replace it only with something that ends the work as surely (e.g. a supervisor
    that kills the process); if it returns, the worker stops heartbeating and ``run()`` raises
    :class:`WorkerFailStopped`, leaving the coordinator to expire the member."""


UNREACHABLE_MAX_BACKOFF_MS = 5_000
"""The longest wait between two attempts to reach a coordinator while holding no lease."""
UNREACHABLE_WARN_EVERY_S = 30.0
"""An unreachable coordinator is said at warning at the first failure, then this often."""
DEFAULT_STOP_BUDGET_MS = 5_000
"""The default stop budget: Kafka Connect's ``task.shutdown.graceful.timeout.ms`` default."""
MIN_STOP_BUDGET_MS = 100
"""The coordinator's floor of the budget it computes (``max(100, rebalance timeout / 2)``)."""
MAX_STOP_BUDGET_MS = (2**31 - 1) // 2
"""Twice it must fit the protocol's int32 RebalanceTimeoutMs."""


def stop_budget_ms(config: WorkerConfig) -> int:
    """The worker's stop budget B (validated: ValueError naming the setting). The worker
    announces ``2 * B`` as its rebalance timeout, so the coordinator's ``max(100, timeout // 2)``
    is B exactly (and so is the simulator's model of it)."""
    budget, timeout = config.stop_budget_ms, config.rebalance_timeout_ms
    if budget is not None:
        if not MIN_STOP_BUDGET_MS <= budget <= MAX_STOP_BUDGET_MS:
            raise ValueError(f"the stop budget (task.shutdown.graceful.timeout.ms) must be "
                             f"{MIN_STOP_BUDGET_MS}-{MAX_STOP_BUDGET_MS} ms, not {budget}")
        if timeout is not None and timeout != 2 * budget:
            raise ValueError(f"rebalance timeout {timeout} ms and stop budget {budget} ms disagree: "
                             "the rebalance timeout is twice the stop budget (give only the budget)")
        return budget
    if timeout is not None:
        if not 0 < timeout <= 2 * MAX_STOP_BUDGET_MS:
            raise ValueError(f"the rebalance timeout must be 1-{2 * MAX_STOP_BUDGET_MS} ms, not {timeout}")
        return max(MIN_STOP_BUDGET_MS, timeout // 2)
    return DEFAULT_STOP_BUDGET_MS


def build_assignors(names: Sequence[str], max_delay_ms: int) -> list[Assignor]:
    out: list[Assignor] = []
    for name in names:
        if name == "incremental":
            out.append(IncrementalCooperativeAssignor(max_delay_ms=max_delay_ms))
        elif name == "eager":
            out.append(EagerAssignor())
        else:
            raise ValueError(f"unknown assignor {name!r} (known: incremental, eager)")
    return out


class Worker:
    def __init__(
        self, config: WorkerConfig, listener: WorkerRebalanceListener | None = None,
        assignors: Sequence[Assignor] | None = None, metrics: WorkerMetrics | None = None,
    ) -> None:
        self.config = config
        self._stop_budget_ms = stop_budget_ms(config)
        self.listener = listener or WorkerRebalanceListener()
        self.assignors = list(assignors) if assignors is not None else build_assignors(
            config.assignors, config.max_delay_ms)
        self.metrics = metrics or WorkerMetrics()
        self.client = CoordinatorClient(config.bootstrap, config.group_id, config.client_id,
                                        request_timeout_ms=config.request_timeout_ms,
                                        security=config.security)
        self.membership = Membership(
            group_id=config.group_id,
            assignors=[AssignorAd(a.name, a.minimum_version, a.maximum_version,
                                  a.metadata().reason, a.metadata().version, a.metadata().data)
                       for a in self.assignors],
            rebalance_timeout_ms=2 * self._stop_budget_ms, member_id=config.member_id,
            instance_id=config.instance_id, worker_url=config.worker_url,
            session_timeout_ms=config.session_timeout_ms, long_poll=config.long_poll,
        )
        self.log = MemberLog(self.membership, config.group_id, config.instance_id)
        self.instances: dict[Item, _Instance] = {}
        self._stopping: dict[Item, asyncio.Future[None]] = {}  # stops in progress
        self._targets: dict[str, str] = {}  # connector -> target state, as last fetched
        self._targets_epoch = -1  # the member epoch that fetch was sent at
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._kick = asyncio.Event()  # stop() queued the drain: start it without the heartbeat
        self._inflight: asyncio.Task[Any] | None = None
        self._lost_gen = 0  # bumped by the watchdog: an answer to an older request is stale
        self._compute: asyncio.Task[None] | None = None
        self._acting: asyncio.Task[None] | None = None
        self._draining = False
        self._pending: deque[Revoke | Assign | _Reconfigure] = deque()
        self._running = False
        self._rebalance_started: float | None = None
        self._security_failure: SecurityError | None = None
        self._unreachable_since: float | None = None  # heartbeats failing without a lease
        self._unreachable_attempts = 0
        self._unreachable_warned: float | None = None
        self._news: asyncio.Future[None] | None = None  # resolved after each heartbeat answer
        self._waiting: set[Item] = set()  # tasks waiting for their task config (logged once)
        self.stopped = asyncio.Event()
        # Fail-stop: per-stop deadlines (token -> (deadline ms, why)), read by the guard thread.
        self._stop_deadlines: dict[int, tuple[int, str]] = {}
        self._tokens = itertools.count()
        self._failed_stop: str | None = None
        self._fail_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard = FailStopGuard(self._fail_stop_probe, self._fail_stop, now_ms)
        # The context bound to every log line (group, instance): the guard thread does not see
        # the main thread's context variables.
        self._log_context = dict(structlog.contextvars.get_contextvars())

    # -- identity -----------------------------------------------------------------------------
    @property
    def worker_id(self) -> str:
        return self.config.instance_id or self.membership.member_id or self.config.client_id

    @property
    def stop_budget_ms(self) -> int:
        """How long stopping one instance may take (``WorkerConfig.stop_budget_ms``, default
        5 s). The worker announces twice it as its rebalance timeout (the other half is for the
        acknowledgement to reach the coordinator); the coordinator computes this same number
        from it and holds a fenced member's items that long past its session deadline."""
        return self._stop_budget_ms

    @property
    def heartbeat_answer_budget_s(self) -> float:
        """How long a heartbeat's answer may take beyond its MaxWaitMs before the connection is
        given up and the coordinator looked up again: a tenth of the session timeout (1-30 s).
        A coordinator node that stops answering without closing the connection (frozen, or
        cut off) used to hold the heartbeat for the whole request timeout (30 s), past the
        session; a fifth of the session was still too long with the defaults (the simulator:
        a frozen owner made workers fence themselves in half the runs)."""
        return min(self.config.request_timeout_ms, max(1000, self.config.session_timeout_ms // 10)) / 1000

    @property
    def stop_deadline_s(self) -> float:
        return self.stop_budget_ms / 1000

    @property
    def fail_stop_margin_ms(self) -> int:
        """The lease backstop fires this much before the coordinator's hold can end, for the
        exit itself to complete (at most 100 ms, a tenth of the budget)."""
        return min(100, self.stop_budget_ms // 10)

    def _retry_delay_ms(self, delay_ms: int) -> int:
        """The wait before the next heartbeat after a failed one (``delay_ms``: the client's
        backoff, or Membership's retry after a retriable error), but never more than a quarter
        of what is left of the session lease (nor less than half the client's base backoff):
        retries get denser as the lease runs out, so a coordinator back just before it ends is
        reached in time. Fix: a long poll's lease runs from the send time of the
        heartbeat answered before it, so a coordinator killed just before answering one left
        the worker 10 - 2 x 3 = 4 s of lease with the defaults; a 3 s restart (3.3 s down with
        start-up) plus a retry scheduled up to 1 s out self-fenced the worker (about 1 time in
        10 in the worst phase by the backoff's distribution; every time with 4 s down)."""
        m = self.membership
        if m.last_success_ms is None:
            return delay_ms
        left = m.last_success_ms + m.session_timeout_ms - now_ms()
        if left <= 0:
            return delay_ms  # the lease is over (the watchdog fences): the plain backoff
        return min(delay_ms, max(left // 4, self.client.backoff_ms // 2))

    @property
    def failed_stop(self) -> str | None:
        """Why the fail-stop rule fired, if it did (only seen when ``config.fail_stop`` returns)."""
        return self._failed_stop

    # -- main loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Join and work until :meth:`stop` (or a fatal error: raises WorkerFailed)."""
        m = self.membership
        m.join(now_ms())
        self._running = True
        self._loop = asyncio.get_running_loop()
        self._guard.start()
        watchdog = asyncio.create_task(self._watchdog())
        self.log.info("joining", security=(self.config.security.describe()
                                           if self.config.security is not None else "PLAINTEXT"))
        try:
            while not self._stop.is_set():
                if self._failed_stop is not None:
                    raise WorkerFailStopped(self._failed_stop)
                if m.state == State.FAILED:
                    assert m.failure is not None
                    await self._settle_acting()
                    try:
                        await self._stop_all(lost=True)
                    except _FailStopped:
                        continue
                    if self._security_failure is not None or m.failure.code in SECURITY_CODES:
                        raise WorkerSecurityFailed(m.failure.code, self._security_message(m.failure.message))
                    raise WorkerFailed(m.failure.code, m.failure.message)
                acting = self._acting
                if acting is not None and acting.done():
                    self._acting = None
                    acting.result()  # a bug in an action is not swallowed
                    if self._failed_stop is not None:
                        continue
                    with contextlib.suppress(_FailStopped):
                        await self._sweep()
                if self._acting is None and self._pending:
                    self._acting = asyncio.create_task(self._act(self._pending.popleft()))
                # Fix: heartbeats used to stop while work was being stopped or started (the
                # loop awaited each action), so a stop longer than the session timeout got the
                # worker fenced and all its work lost. Now they go on meanwhile, plain and at the
                # heartbeat interval (keepalive).
                busy = self._acting is not None
                now = now_ms()
                if not m.heartbeat_due(now, keepalive=busy):
                    self._wake.clear()
                    wait = 0.05 if m.stopping_lost else max(0.0, (m.next_due_ms(busy) - now) / 1000)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), min(wait, 1.0))
                    continue
                m.instance_states = {item: inst.report() for item, inst in self.instances.items()}
                m.instance_states.update(self._held_states())
                req = m.heartbeat_request(now, keepalive=busy)
                gen = self._lost_gen
                self._inflight = asyncio.create_task(self.client.send(
                    req, "heartbeat", extra_timeout_s=req.max_wait_ms / 1000,
                    timeout_s=self.heartbeat_answer_budget_s))
                try:
                    resp = await self._await_inflight(self._inflight)
                except SecurityError as exc:
                    self._refused(exc)
                    continue
                except (ConnectionFailed, asyncio.CancelledError) as exc:
                    task = asyncio.current_task()
                    if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
                        raise  # Fix: run() itself was cancelled; this used to be swallowed
                    if self._stop.is_set() or self._failed_stop is not None:
                        continue
                    if m.last_success_ms is not None and not m.lease_expired(now_ms()):
                        # Riding through (a coordinator restart shorter than the lease): the
                        # retries get denser as the lease runs out; nothing to warn about yet.
                        backoff_ms = self._retry_delay_ms(int(self.client.backoff_s() * 1000))
                        self.log.info("heartbeat failed; retrying", error=str(exc) or "cancelled",
                                      retry_in_ms=backoff_ms)
                    else:
                        backoff_ms = self._unreachable(str(exc) or "cancelled")
                    m.on_failure(now_ms(), backoff_ms)
                    continue
                finally:
                    self._inflight = None
                self._reachable()
                if gen != self._lost_gen:
                    # The watchdog fenced us while this answer was on its way (its task done, so
                    # the cancel missed it): it predates the Lost and must not undo it.
                    m.on_failure(now_ms(), int(self.client.backoff_s() * 1000))
                    continue
                if resp.error_code:
                    self.log.info("heartbeat error", error=error_name(resp.error_code),
                                  message=resp.error_message)
                epoch, renewed = m.member_epoch, m.last_success_ms
                actions = m.on_response(resp, now_ms())
                if renewed is not None and m.last_success_ms is not None \
                        and m.last_success_ms != renewed:
                    self.metrics.heartbeat_answered((m.last_success_ms - renewed) / 1000)
                self._notify_news()
                for action in actions:
                    if isinstance(action, Revoke | Assign):
                        self._pending.append(action)  # in order, one at a time (above)
                    else:
                        await self._act(action)  # Lost (at once), Compute (background), Fatal
                if m.member_epoch > epoch > 0 and (self.instances or m.owned) \
                        and not self._draining and m.state != State.FAILED:
                    # (a config change did nothing to running work; a paused
                    # connector's items are owned with no instance.)
                    self._pending.append(_Reconfigure(m.member_epoch))
                if resp.error_code in RETRY:  # (retried after min(interval, 1 s)): within the lease
                    now = now_ms()
                    m.next_heartbeat_ms = now + self._retry_delay_ms(max(0, m.next_heartbeat_ms - now))
                self._observe()
        finally:
            watchdog.cancel()
            if self._compute is not None:
                self._compute.cancel()
            if self._failed_stop is None:
                await self._settle_acting()
            self._running = False
            self.stopped.set()
        if self._failed_stop is not None:
            raise WorkerFailStopped(self._failed_stop)

    async def _await_inflight(self, inflight: asyncio.Task[Any]) -> Any:
        """The heartbeat's answer. Meanwhile, a drain that :meth:`stop` queued starts at once:
        it used to wait for the parked long poll to be answered, so SIGTERM took up to the
        heartbeat interval (3 s) even for a worker with nothing to stop."""
        while True:
            self._kick.clear()
            kick = asyncio.ensure_future(self._kick.wait())
            try:
                await asyncio.wait({inflight, kick}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                inflight.cancel()  # (as awaiting it did: run() itself is cancelled)
                raise
            finally:
                kick.cancel()
            if inflight.done():
                return inflight.result()
            acting = self._acting
            if acting is not None and acting.done():
                self._acting = None
                acting.result()  # (as the loop does: a bug in an action is not swallowed)
            if self._acting is None and self._pending:
                self._acting = asyncio.create_task(self._act(self._pending.popleft()))

    def _unreachable(self, error: str) -> int:
        """A heartbeat failed while the worker holds no lease (it never joined, or its lease
        ran out): say so at warning, naming the bootstrap addresses, at the first failure and
        then every :data:`UNREACHABLE_WARN_EVERY_S` (debug in between), and back off
        exponentially up to :data:`UNREACHABLE_MAX_BACKOFF_MS` (there is no lease to keep).
        It used to retry two or three times a second forever, each at info.
        Returns the delay before the next attempt, in ms."""
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since, self._unreachable_attempts = now, 0
        self._unreachable_attempts += 1
        ceiling = min(UNREACHABLE_MAX_BACKOFF_MS,
                      self.client.backoff_ms * 2 ** min(self._unreachable_attempts - 1, 16))
        backoff_ms = int(random.uniform(ceiling / 2, ceiling))
        fields = {"bootstrap": ",".join(_address(h, p) for h, p in self.config.bootstrap),
                  "error": error, "attempts": self._unreachable_attempts,
                  "for_s": round(now - self._unreachable_since, 1), "retry_in_ms": backoff_ms}
        if self._unreachable_warned is None or now - self._unreachable_warned >= UNREACHABLE_WARN_EVERY_S:
            self._unreachable_warned = now
            self.log.warning("cannot reach the coordinator; retrying", **fields)
        else:
            self.log.debug("heartbeat failed; retrying", **fields)
        return backoff_ms

    def _reachable(self) -> None:
        """A heartbeat was answered: the end of an unreachable spell, if there was one."""
        if self._unreachable_since is None:
            return
        if self._unreachable_warned is not None:
            self.log.info("reached the coordinator", coordinator=(
                _address(*self.client.coordinator) if self.client.coordinator else None),
                attempts=self._unreachable_attempts,
                after_s=round(time.monotonic() - self._unreachable_since, 1))
        self._unreachable_since = self._unreachable_warned = None
        self._unreachable_attempts = 0

    def _refused(self, exc: SecurityError) -> None:
        """The coordinator refused this worker's credentials (TLS, SASL) or permissions: stop
        all work and end ``run()`` with :class:`WorkerSecurityFailed` (the loop does it on its
        next turn). Not retried: it would be refused again, forever."""
        m = self.membership
        if m.state != State.FAILED:
            self.log.error("the coordinator refused this worker's credentials; stopping", error=str(exc))
            self._security_failure = exc
            m.fail(exc.code if exc.code is not None else 0, str(exc))
        self._wake.set()

    def _security_message(self, message: str) -> str:
        if message.startswith("GROUP_AUTHORIZATION_FAILED") and "needs" not in message:
            return (f"{message} (the principal needs READ on group {self.config.group_id})")
        return message

    async def _settle_acting(self) -> None:
        """Let a start or stop in progress finish (bounded by the stop deadline)."""
        acting = self._acting
        if acting is not None and not acting.done() and acting is not asyncio.current_task():
            await asyncio.wait({acting}, timeout=self.stop_deadline_s * 2 + 1)

    async def _sweep(self) -> None:
        """Stop instances that are neither owned nor assigned: started by an assignment that
        completed after a Lost had stopped everything."""
        m = self.membership
        strays = frozenset(self.instances) - m.owned - m.assigned
        if strays:
            self.log.warning("stopping instances no longer assigned", items=_names(strays))
            await self._stop_items(strays)

    async def _watchdog(self) -> None:
        m = self.membership
        while True:
            # Fix: wake at the session deadline itself (it used to be checked every 100 ms, so
            # the worker could fence itself up to 100 ms after the coordinator expired it).
            wait = 0.1
            if m.last_success_ms is not None:
                remaining = (m.last_success_ms + m.session_timeout_ms - now_ms()) / 1000
                if remaining > 0:
                    wait = min(wait, remaining)
            await asyncio.sleep(wait)
            lost = m.check_session(now_ms())
            if lost is not None:
                self.log.warning("no heartbeat within the session timeout: stopping all work",
                            items=len(lost.items))
                self._lost_gen += 1
                if self._inflight is not None:
                    self._inflight.cancel()
                await self._act(lost)

    async def _act(self, action: Any) -> None:
        m = self.membership
        try:
            if isinstance(action, Revoke):
                # What is still owned: a Lost may have stopped everything while this waited
                # (when draining for shutdown: everything that runs, owned or still starting).
                items = action.items & (m.owned | frozenset(self.instances)) if self._draining \
                    else action.items & m.owned
                self._waiting -= action.items
                if items:
                    self._rebalance_started = self._rebalance_started or time.monotonic()
                    await self._stop_items(items)
                    await _call(self.listener.on_revoked, items)
                    m.revoked(items, now_ms())
                    self.log.info("revoked", items=_names(items))
            elif isinstance(action, Assign) and self._draining:
                pass  # shutting down: nothing new starts; the leave releases it
            elif isinstance(action, Assign):
                # What is still assigned and not yet run (a Lost, or a newer assignment, may
                # have come meanwhile).
                items = action.items & m.assigned - m.owned
                if items and m.lease_expired(now_ms()):
                    # A stale answer handled late (e.g. after a stop-the-world pause longer
                    # than the session): the coordinator may have given these items away. The
                    # watchdog fences and rejoins; nothing starts.
                    self.log.warning("not starting an assignment: the session lease expired",
                                     items=_names(items))
                    items = frozenset()
                for a in self.assignors:
                    a.on_assignment(MemberAssignmentInfo(m.member_epoch, m.assigned, action.error,
                                                         action.metadata_version, action.metadata))
                if items:
                    self._rebalance_started = self._rebalance_started or time.monotonic()
                    started = await self._start_items(items)
                    await _call(self.listener.on_assigned, started)
                    m.assigned_started(started, now_ms())
                    self.log.info("assigned", items=_names(started))
            elif isinstance(action, _Reconfigure):
                if not self._draining:
                    await self._reconfigure()
            elif isinstance(action, Lost):
                self.metrics.lost.inc()
                self._pending.clear()  # stale: the rejoin brings a fresh assignment
                # Everything that runs, not only what was reported (an instance may be starting).
                await self._stop_items(frozenset(self.instances) | action.items)
                acting = self._acting
                if acting is not None and not acting.done() and acting is not asyncio.current_task():
                    await self._settle_acting()  # a start or stop in progress finishes...
                    await self._stop_items(frozenset(self.instances))  # ...what it started stops
                await _call(self.listener.on_lost, action.items)
                m.revoked(action.items, now_ms())
                self.log.warning("lost all work; rejoining", reason=action.reason, items=len(action.items))
            elif isinstance(action, Compute):
                if not self._draining and (self._compute is None or self._compute.done()):
                    self._compute = asyncio.create_task(self._compute_assignment())
            elif isinstance(action, Fatal):
                self.log.error("the coordinator refused this worker", error=action.message)
        except _FailStopped:
            pass  # nothing of this action is reported: the worker is as good as dead
        finally:
            self._observe()
            self._notify_news()
            self._wake.set()

    def _observe(self) -> None:
        m = self.membership
        self.metrics.observe(m.state.value, m.member_epoch, m.owned)
        if m.state == State.STABLE and self._rebalance_started is not None:
            self.metrics.rebalance_seconds.observe(time.monotonic() - self._rebalance_started)
            self._rebalance_started = None

    # -- running work -------------------------------------------------------------------------
    async def _reconfigure(self) -> None:
        """Apply the connectors' configs to the owned items: restart the instances
        whose config changed (Kafka Connect restarts a connector and its tasks on a config
        change) or whose restart counter was bumped (``connect.restart.generation``: the
        connector and its tasks; ``connect.restart.task.N``: that task only), stop the instances
        of a connector whose target state is PAUSED or STOPPED (its items stay owned: nothing is
        reported), and start the owned items of a connector RUNNING again (connect_wire.verbs).
        Each stop is within the stop budget (the fail-stop rule, as a revocation). The items
        stay owned throughout (no other worker may run them meanwhile); instances of unchanged
        connectors are not touched. A connector that is gone is left to its revocation."""
        m = self.membership
        if not self.instances and not m.owned:
            return
        gen = self._lost_gen
        try:
            configs = await self._configs()
        except SecurityError as exc:
            self._refused(exc)
            return
        except ConnectionFailed as exc:
            # (the next epoch change, or a crash restart, fetches again)
            self.log.warning("cannot fetch connector configs to look for changes", error=str(exc))
            return
        if gen != self._lost_gen or m.lease_expired(now_ms()) or self._draining:
            return
        restart: set[Item] = set()
        pause: set[Item] = set()
        resume: set[Item] = set()
        wants: dict[str, bool] = {}  # connector -> its class defines task_configs
        for item in m.owned & m.assigned:  # (owned, not assigned: a revocation is queued)
            spec = configs.get(item.connector)
            if spec is None or item in self._stopping:
                continue
            new = spec.config
            running = verbs.target_state(new) == verbs.RUNNING
            inst = self.instances.get(item)
            if inst is None:
                if running and not self._awaits_task_config(item, spec):
                    resume.add(item)
            elif inst.stopping:
                continue
            elif not running:
                pause.add(item)
            elif inst.base is not None:
                own = None
                if not item.is_connector:
                    if item.connector not in wants:
                        wants[item.connector] = _defines_task_configs(new)
                    own = spec.task_config(item.task) if wants[item.connector] else None
                if verbs.identity(item, new, own) != verbs.identity(item, inst.base, inst.task_config):
                    restart.add(item)
                elif inst.context is not None and inst.context.stale_grant() is not None:
                    restart.add(item)  # granted again while kept: a new instance, a new token
                elif inst.reconfigure is not None and inst.max_tasks != spec.task_count:
                    inst.max_tasks = spec.task_count  # (the connector's task count changed)
                    inst.reconfigure.set()
        if not (restart or pause or resume):
            return
        if pause:
            self.log.info("connector paused or stopped; stopping its instances (the items stay "
                          "assigned)", connectors=sorted({i.connector for i in pause}),
                          items=_names(frozenset(pause)))
        if restart:
            self.log.info("connector config changed or restart requested; restarting instances",
                          connectors=sorted({i.connector for i in restart}),
                          items=_names(frozenset(restart)))
        if resume:
            self.log.info("connector running again; starting its instances",
                          connectors=sorted({i.connector for i in resume}),
                          items=_names(frozenset(resume)))
        # (_FailStopped: the action ends, nothing restarts)
        await self._stop_items(frozenset(restart | pause))
        if gen != self._lost_gen or m.lease_expired(now_ms()) or self._draining:
            return  # the watchdog's Lost (or the drain) reports them stopped
        for item in sorted((restart | resume) & m.owned & m.assigned):
            await self._start(item, configs.get(item.connector))

    def _held_states(self) -> dict[Item, tuple[str, str | None, str | None]]:
        """PAUSED or STOPPED for each owned item of a paused or stopped connector that has no
        instance here and none stopping: nothing of it runs (a stop that ended has committed
        its last offsets; the coordinator lets an offsets change in only once every owner
        says so). Only from configs fetched at the current member epoch or later (an older
        fetch may predate a resume and stop the coordinator has since seen)."""
        m = self.membership
        if self._targets_epoch < m.member_epoch:
            return {}
        return {item: (target, None, None) for item in m.owned
                if item not in self.instances and item not in self._stopping
                and (target := self._targets.get(item.connector)) in (verbs.PAUSED, verbs.STOPPED)}

    async def _configs(self) -> dict[str, _Spec]:
        epoch = self.membership.member_epoch  # (the fetch sees every change stored before it)
        resp = await self.client.send(ConnectGroupDescribeRequest(group_ids=(self.config.group_id,)))
        (g,) = resp.groups
        if g.error_code and g.error_code != ErrorCode.NO_ASSIGNOR_COVERS_GROUP:
            raise ConnectionFailed(f"describe failed: {error_name(g.error_code)}: {g.error_message}")
        if epoch >= self._targets_epoch:
            self._targets = {c.name: verbs.target_state({e.name: e.value for e in c.config})
                             for c in g.connectors}
            self._targets_epoch = epoch
        return {c.name: _Spec(
            {e.name: e.value for e in c.config}, c.task_count,
            None if c.task_configs is None else tuple(
                {e.name: e.value or "" for e in t.config} for t in c.task_configs))
            for c in g.connectors}

    async def _start_items(self, items: frozenset[Item]) -> frozenset[Item]:
        """Start what can be started; the rest is retried by supervisors. Returns the items the
        worker now holds (all of them: a failed start is restarted, never dropped)."""
        configs: dict[str, _Spec] = {}
        gen = self._lost_gen
        for attempt in range(3):
            try:
                configs = await self._configs()
                break
            except SecurityError as exc:
                self._refused(exc)
                return frozenset()
            except ConnectionFailed as exc:
                self.log.warning("cannot fetch connector configs", error=str(exc), attempt=attempt)
                await asyncio.sleep(self.client.backoff_s())
        m = self.membership
        if gen != self._lost_gen or m.lease_expired(now_ms()):
            # The configs came back after the session lease ended (found by review: a fetch
            # answered late started work the coordinator had given away): start nothing.
            self.log.warning("not starting an assignment: the session lease ended while its "
                             "configs were fetched", items=_names(items))
            return frozenset()
        items = items & m.assigned
        await asyncio.gather(*(self._start(item, configs.get(item.connector)) for item in sorted(items)))
        return items

    def _awaits_task_config(self, item: Item, spec: _Spec) -> bool:
        """A task of a connector whose class defines ``task_configs`` starts only once its own
        task config is stored; until then it is held, not run (said once in the log), and
        looked at again at the next epoch change (a write of task configs bumps the epoch)."""
        if item.is_connector or spec.task_config(item.task) is not None \
                or not _defines_task_configs(spec.config):
            self._waiting.discard(item)
            return False
        if item not in self._waiting:
            self._waiting.add(item)
            self.log.info("not starting: waiting for the connector instance to write this task's "
                          "config (task_configs)", item=str(item))
        return True

    async def _start(self, item: Item, spec: _Spec | None) -> None:
        if item in self.instances:
            return
        if spec is not None and (state := verbs.target_state(spec.config)) != verbs.RUNNING:
            # Held, not run: started when the connector is resumed (_reconfigure).
            self.log.info("not starting: the connector's target state is " + state, item=str(item))
            return
        if spec is not None and self._awaits_task_config(item, spec):
            return
        inst = _Instance(item, None, {})
        self.instances[item] = inst
        self._guard.poke()  # the lease backstop now watches this instance too
        inst.supervisor = asyncio.create_task(self._supervise(inst, spec))

    async def _supervise(self, inst: _Instance, spec: _Spec | None) -> None:
        """Start the instance and keep it running while assigned, restarting with backoff."""
        delay = 0.1
        while not inst.stopping:
            try:
                if spec is None:
                    spec = (await self._configs()).get(inst.item.connector)
                    if spec is None:
                        raise PluginError(f"connector {inst.item.connector} has no config (deleted?)")
                base = spec.config
                if verbs.target_state(base) != verbs.RUNNING or self._awaits_task_config(inst.item, spec):
                    # (re-read after a failure: paused meanwhile, or its task config is gone;
                    # _reconfigure stops this)
                    spec = None
                    await asyncio.sleep(1.0)
                    continue
                inst.base = base
                own = None if inst.item.is_connector else spec.task_config(inst.item.task)
                if own is not None and not _defines_task_configs(base):
                    own = None  # (a class without task_configs: as before, stored ones aside)
                inst.task_config = own
                # The plugin never sees the verbs' reserved keys (connect_wire.verbs).
                plugin_config = verbs.plugin_config(base)
                if self.config.config_providers is not None:
                    plugin_config = self.config.config_providers.resolve(plugin_config)
                config = instance_config(plugin_config, inst.item, self.worker_id, own)
                if self.membership.lease_expired(now_ms()):
                    # (a restart whose config fetch outlived the lease: the watchdog stops it)
                    await asyncio.sleep(0.05)
                    continue
                # Every instance of a connector whose config fails its class's validate() is
                # FAILED with the messages, and none starts (retried like a failed start: an
                # update of the config restarts it at once).
                errors = await asyncio.wait_for(validate(connector_class(config), {
                    **plugin_config, "connector.name": inst.item.connector}), self.stop_deadline_s * 2)
                if errors:
                    raise InvalidConfig(errors)
                if inst.stopping:  # (a cancellation wait_for swallowed: see after start())
                    raise asyncio.CancelledError
                cls = connector_class(config) if inst.item.is_connector else task_class(config)
                inst.plugin = cls()
                inst.config = config
                inst.context = self._give_context(inst)
                inst.started = True
                if inst.error is not None:
                    inst.state = RESTARTING
                await asyncio.wait_for(inst.plugin.start(config), self.stop_deadline_s * 2)
                if inst.stopping:
                    # A stop that came as start() ended: Python 3.11's wait_for then returns the
                    # result and swallows the cancellation, and run() would start and ignore the
                    # stop until the stop budget ran out (a fail-stop, seen in CI).
                    raise asyncio.CancelledError
                inst.state = RUNNING
                self.metrics.running.inc()
                inst.counted = True
                run = getattr(inst.plugin, "run", None)
                if inst.item.is_connector and callable(getattr(inst.plugin, "task_configs", None)):
                    inst.max_tasks = spec.task_count
                    inst.reconfigure = asyncio.Event()
                    await self._run_with_task_configs(
                        inst, run, self._task_configs_job(inst, spec.task_configs))
                    return
                if run is None:
                    return
                inst.run_task = asyncio.create_task(run())
                await inst.run_task
                raise RuntimeError("run() returned")
            except asyncio.CancelledError:
                raise
            except SecurityError as exc:  # (fetching the config again)
                self._refused(exc)
                return
            except Exception as exc:
                if inst.stopping:
                    return
                inst.restarts += 1
                self.metrics.failures.inc()
                inst.state = FAILED
                if isinstance(exc, InvalidConfig):  # (no code failed: the messages, no traceback)
                    inst.error = failure_error(exc, str)
                    inst.trace = utf8_tail(encodable("\n".join(error_lines(exc.errors))), TRACE_LIMIT)
                else:
                    inst.error = failure_error(exc)
                    inst.trace = failure_trace(exc)
                self.log.error("instance failed; restarting", item=str(inst.item), error=inst.error,
                               restarts=inst.restarts, retry_in_s=round(delay, 2), trace=inst.trace)
                if inst.started:
                    # Fix: the crashed instance is stopped here, once; _stop_one used to stop it
                    # a second time (and decrement the running gauge twice) when the item was
                    # revoked during the backoff.
                    inst.started = False
                    inst.stopping_crashed = True
                    token = self._arm_stop(inst.item)
                    try:
                        await self._call_stop(inst, asyncio.get_running_loop().time()
                                              + self.stop_deadline_s)
                    except _FailStopped:
                        return
                    finally:
                        self._stop_deadlines.pop(token, None)
                        inst.stopping_crashed = False
                        self._uncount(inst)
                inst.plugin = None
                inst.run_task = None
                inst.reconfigure = None
                if inst.stopping:
                    return
                spec = None  # re-read the config: it may have changed
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _give_context(self, inst: _Instance) -> Context:
        """Set ``inst.plugin.context`` before ``start``. A plugin that cannot take the attribute
        (``__slots__`` without it, a read-only property) still runs: it is not told, and the
        worker says so once in the log (debug)."""
        context = Context(inst.item, self.worker_id, self)
        try:
            inst.plugin.context = context
        except (AttributeError, TypeError) as exc:
            self.log.debug("the plugin object cannot take a context attribute; started without",
                           item=str(inst.item), error=repr(exc))
        return context

    async def _run_with_task_configs(self, inst: _Instance, run: Any, job: Any) -> None:
        """A connector instance's ``run()`` (if any) alongside its task-configs job: the first
        failure of either (or ``run()`` returning) fails the instance; the job ending quietly
        (the connector no longer held) leaves ``run()`` alone. Cancelling this cancels both
        and waits for them to end (as cancelling a plain ``run()`` does)."""
        job_task = asyncio.ensure_future(job)
        tasks: set[asyncio.Future[None]] = {job_task}
        if run is not None:
            inst.run_task = asyncio.create_task(run())
            tasks.add(inst.run_task)
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                if inst.run_task is not None and inst.run_task in done:
                    inst.run_task.result()
                    raise RuntimeError("run() returned")
                job_task.result()  # (raises the job's failure)
                tasks.discard(job_task)
        finally:
            pending = [t for t in tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending)
            if job_task.done() and not job_task.cancelled():
                job_task.exception()  # (retrieved: a run() failure is the one reported)

    def _uncount(self, inst: _Instance) -> None:
        if inst.counted:
            inst.counted = False
            self.metrics.running.dec()

    async def _stop_items(self, items: frozenset[Item], hard: bool = False) -> None:
        """Stop what of ``items`` runs, in parallel; also wait for the stops of ``items`` already
        in progress (a Lost's, when stop() drains meanwhile): an item is reported stopped only
        once its stop ended (found by the simulator: "revoked-while-stopping")."""
        own = []
        others = []
        for i in items:
            inst = self.instances.pop(i, None)
            if inst is not None:
                task = asyncio.ensure_future(self._stop_one(inst))
                self._stopping[i] = task
                task.add_done_callback(functools.partial(self._stopped, i))
                own.append(task)
            elif (task := self._stopping.get(i)) is not None:
                others.append(task)
        if own:
            # Not gather: cancelling this wait (run() ending while its watchdog stops work) must
            # not cancel the stops, or their deadlines would vanish from the fail-stop guard.
            await asyncio.wait(own)
            errors = [exc for task in own if not task.cancelled()
                      and (exc := task.exception()) is not None]  # (each one retrieved)
            if errors:
                raise errors[0]
        if others:
            await asyncio.wait(others)  # (cancelling this wait does not cancel their stops)

    def _stopped(self, item: Item, task: asyncio.Future[None]) -> None:
        if self._stopping.get(item) is task:
            del self._stopping[item]

    async def _stop_one(self, inst: _Instance) -> None:
        """Stop one instance within the stop budget, or fail-stop (raises _FailStopped when the
        fail action returns): the item is reported revoked only after this returns."""
        inst.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_deadline_s  # for all of it: revocations are timed
        token = self._arm_stop(inst.item)
        try:
            sup = inst.supervisor
            if sup is not None and not sup.done():
                if not inst.stopping_crashed:
                    sup.cancel()  # starting (start() is then stopped below), running, or backing off
                await asyncio.wait({sup}, timeout=max(0.0, deadline - loop.time()))
                if not sup.done():
                    self._overrun(inst, "its start() or run() did not end when cancelled")
            if not inst.started or inst.plugin is None:
                return
            inst.started = False
            await self._call_stop(inst, deadline)
            self._uncount(inst)
        finally:
            self._stop_deadlines.pop(token, None)

    async def _call_stop(self, inst: _Instance, deadline: float) -> None:
        """``plugin.stop()`` by ``deadline`` (loop time). A stop() that raises has ended (logged
        with its traceback, counted); one that has not ended by then is a fail-stop. Not
        ``wait_for``: it would wait for a stop() that ignores its cancellation."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(inst.plugin.stop())
        await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        if not task.done():
            task.cancel()
            self._overrun(inst, "its stop() did not return")
        if inst.context is not None:
            inst.context._close()
        exc = task.exception()
        if exc is not None:
            self.log.error("stop() raised; the instance counts as stopped", item=str(inst.item),
                      error=repr(exc), exc_info=exc)
            self.metrics.failures.inc()

    def _arm_stop(self, item: Item) -> int:
        """Register a stop's deadline with the fail-stop guard (a thread: it fires even when a
        plugin blocks the event loop)."""
        token = next(self._tokens)
        self._stop_deadlines[token] = (
            now_ms() + self.stop_budget_ms,
            f"the instance {item} did not stop within the stop budget of {self.stop_budget_ms} ms")
        self._guard.poke()
        return token

    def _overrun(self, inst: _Instance, why: str) -> None:
        self._fail_stop(f"the instance {inst.item} did not stop within the stop budget of "
                        f"{self.stop_budget_ms} ms: {why}")
        raise _FailStopped

    def _fail_stop_probe(self) -> tuple[int, str] | None:
        """The earliest fail-stop deadline (called by the guard thread: reads only)."""
        best = None
        for entry in list(self._stop_deadlines.values()):
            if best is None or entry[0] < best[0]:
                best = entry
        m = self.membership
        last = m.last_success_ms
        if last is not None and (self.instances or self._stopping):
            at = last + m.session_timeout_ms + self.stop_budget_ms - self.fail_stop_margin_ms
            if best is None or at < best[0]:
                best = (at, f"{len(self.instances) + len(self._stopping)} instance(s) still "
                        f"running or stopping at the session lease's end plus the stop budget "
                        f"({self.stop_budget_ms} ms), after which the coordinator may hand "
                        "them to another worker")
        return best

    def _fail_stop(self, reason: str) -> None:
        """End the process (or the configured action): from the loop or the guard thread."""
        with self._fail_lock:
            if self._failed_stop is not None:
                return
            self._failed_stop = reason
        event = "fail-stop: ending the process so that no work can run on two workers"
        fields = {"reason": reason, "exit_status": FAIL_STOP_EXIT}
        action = self.config.fail_stop
        if action is None:
            # The exit must not depend on the logger: a full pipe on stderr, a dead log reader
            # or a logger's lock held by a blocked loop held it up (found by review). One
            # non-blocking write of the line, then a timer ends the process should the flush
            # of the exit block.
            logs.emergency(event, **{**self._log_context, **self.log.context(), **fields})
            timer = threading.Timer(max(0.005, self.fail_stop_margin_ms / 2000), os._exit,
                                    (FAIL_STOP_EXIT,))  # (no flush: that may be what blocks)
            timer.daemon = True
            timer.start()
            exit_process(reason)  # (does not return)
            return
        try:  # an embedder's action (tests): the ordinary logger
            self.log.critical(event, **fields)
        except BaseException:  # noqa: BLE001 - the action below must run whatever the log does
            pass
        action(reason)
        # Only reached when a configured action returned: behave like a process that died
        # (no more heartbeats, no leave, nothing reported).
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._after_fail_stop)

    def _after_fail_stop(self) -> None:
        self._stop.set()
        if self._inflight is not None:
            self._inflight.cancel()
        self._wake.set()

    async def _stop_all(self, lost: bool = False) -> None:
        items = frozenset(self.instances)
        await self._stop_items(items, hard=lost)
        if items:
            self.membership.revoked(items, now_ms())

    # -- what a plugin's context asks (worker_client.context) -----------------------------------
    @property
    def member_epoch(self) -> int:
        return self.membership.member_epoch

    def fencing_token(self, item: Item) -> int | None:
        return self.membership.tokens.get(item)

    @property
    def write_retry_s(self) -> float:
        """How long a commit, a fetch or a task-config write keeps retrying what may pass
        (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, a lost
        connection, a STALE_MEMBER_EPOCH waiting for the heartbeat's newer epoch): the request
        timeout (30 s by default). A fenced write ends sooner: the session lease (10 s) runs out
        first and the worker fences itself (:class:`FencedError`)."""
        return self.config.request_timeout_ms / 1000

    def _notify_news(self) -> None:
        """Wake the writes waiting for a newer member epoch (a heartbeat answer, a Lost)."""
        news, self._news = self._news, None
        if news is not None and not news.done():
            news.set_result(None)

    async def _wait_news(self, timeout_s: float) -> None:
        if self._news is None:
            self._news = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._news), max(0.0, timeout_s))

    async def _fenced_send(self, item: Item, build: Callable[[str, int], Any], what: str) -> Any:
        """Send a write fenced by this member's id and epoch for ``item`` (``build(member_id,
        epoch)`` makes the request). A STALE_MEMBER_EPOCH (the coordinator moved this member's
        epoch and the answer telling it is on its way) is sent again once a heartbeat brought a
        newer epoch, if the item is still held; errors that may pass and lost connections are
        retried with the client's backoff, all within :attr:`write_retry_s`. Raises
        :class:`FencedError` when the member does not hold the item at a current epoch,
        :class:`ProtocolError` for another error or one that did not pass, ConnectionFailed for
        a coordinator not reached in time."""
        deadline = asyncio.get_running_loop().time() + self.write_retry_s
        try:
            return await self._fenced_attempts(item, build, what, deadline)
        except FencedError:
            self.metrics.fenced_writes.inc()
            raise

    async def _fenced_attempts(self, item: Item, build: Callable[[str, int], Any], what: str,
                               deadline: float) -> Any:
        loop = asyncio.get_running_loop()
        m = self.membership
        last: Exception | None = None
        attempts = 0
        while True:
            refusal = m.write_refusal(item)
            if refusal is not None:
                raise FencedError(*refusal)
            epoch = m.member_epoch
            left = deadline - loop.time()
            if left <= 0:
                break
            attempts += 1
            try:
                resp = await self.client.send(build(m.member_id, epoch), timeout_s=left)
            except ConnectionFailed as exc:
                last = exc
                await asyncio.sleep(min(self.client.backoff_s(), max(0.0, deadline - loop.time())))
                continue
            code = resp.error_code
            if code == 0:
                return resp
            message = f"{what} for {item}: {resp.error_message or error_name(code)}"
            if code == ErrorCode.STALE_MEMBER_EPOCH:
                while m.member_epoch == epoch and m.write_refusal(item) is None \
                        and loop.time() < deadline:
                    await self._wait_news(deadline - loop.time())
                if m.member_epoch > epoch and m.write_refusal(item) is None:
                    self.metrics.stale_resends.inc()
                    continue  # the newer epoch came and the item is still ours: again
                raise FencedError(code, message)
            if code in FENCED_CODES:
                raise FencedError(code, message)
            if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.REQUEST_TIMED_OUT):
                last = ProtocolError(code, message)
                await asyncio.sleep(min(self.client.backoff_s(), max(0.0, deadline - loop.time())))
                continue
            raise ProtocolError(code, message)
        why = f"{what} for {item} gave up after {attempts} attempt(s) in {self.write_retry_s:.1f} s"
        if isinstance(last, ProtocolError):
            raise ProtocolError(last.code, f"{why}: {last.message}")
        raise ConnectionFailed(f"{why}: {last}")

    async def commit_offsets(self, item: Item, offsets: list[tuple[str, str | None]]) -> None:
        """Commit canonical JSON (partition, offset) pairs for ``item`` (Context.commit_offsets)."""
        entries = tuple(_commit.PartitionOffset(partition=p, offset=o) for p, o in offsets)
        await self._fenced_send(item, lambda member_id, epoch: ConnectGroupCommitOffsetsRequest(
            group_id=self.config.group_id, member_id=member_id, member_epoch=epoch,
            connector=item.connector, task=item.task, offsets=entries), "commit_offsets")
        self.metrics.commits.inc()

    async def fetch_offset(self, connector: str, partition: str) -> str | None:
        """The committed offset (canonical JSON) of ``partition``, or None (Context.offset).
        Not fenced; retried as :meth:`_fenced_send` retries."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.write_retry_s
        request = ConnectGroupFetchOffsetsRequest(group_id=self.config.group_id, connector=connector,
                                                  partitions=(partition,))
        last: Exception | None = None
        while (left := deadline - loop.time()) > 0:
            try:
                resp = await self.client.send(request, timeout_s=left)
            except ConnectionFailed as exc:
                last = exc
            else:
                code = resp.error_code
                if code == 0:
                    return next((o.offset for o in resp.offsets if o.partition == partition), None)
                last = ProtocolError(code, f"offset() of connector {connector}: "
                                           f"{resp.error_message or error_name(code)}")
                if code not in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.REQUEST_TIMED_OUT):
                    raise last
            await asyncio.sleep(min(self.client.backoff_s(), max(0.0, deadline - loop.time())))
        if isinstance(last, ProtocolError):
            raise ProtocolError(last.code, f"gave up after {self.write_retry_s:.1f} s: {last.message}")
        raise ConnectionFailed(f"offset() of connector {connector} gave up after "
                               f"{self.write_retry_s:.1f} s: {last}")

    def request_task_reconfiguration(self, item: Item) -> None:
        """Have the connector instance's ``task_configs`` called again (from any thread)."""
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is not None and here is not loop:
            loop.call_soon_threadsafe(self._reconfigure_tasks, item)
        else:
            self._reconfigure_tasks(item)

    def _reconfigure_tasks(self, item: Item) -> None:
        inst = self.instances.get(item)
        if inst is not None and inst.reconfigure is not None and not inst.stopping:
            inst.reconfigure.set()

    async def _task_configs_job(self, inst: _Instance, stored: tuple[dict[str, str], ...] | None) -> None:
        """A connector instance's task configs: call its ``task_configs(max_tasks)`` (after
        ``start``, and again on each request), check the answer, and write it through the
        coordinator when it differs from what is stored. Raises (the connector instance FAILED)
        for an answer that is not task configs; returns (giving up quietly) when this worker no
        longer holds the connector."""
        assert inst.reconfigure is not None
        cls = type(inst.plugin)
        where = f"{cls.__module__}.{cls.__qualname__}.task_configs"
        last = None if stored is None else list(stored)
        while True:
            inst.reconfigure.clear()  # (requests from now on get one more call)
            max_tasks = inst.max_tasks
            result = inst.plugin.task_configs(max_tasks)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, self.stop_deadline_s * 2)
            configs = check_task_configs(result, max_tasks, where)
            if inst.context is not None and inst.context.stale_grant() is not None:
                self.log.info("task configs not written: the connector was granted to this "
                              "worker again; its instance restarts", connector=inst.item.connector)
                return
            if configs != last:
                request = ConnectGroupWriteTaskConfigsRequest(
                    group_id=self.config.group_id, member_id="", member_epoch=0,
                    connector=inst.item.connector, task_configs=tuple(
                        _write.TaskConfig(config=tuple(_write.ConfigEntry(name=k, value=v)
                                                       for k, v in sorted(c.items())))
                        for c in configs))
                try:
                    resp = await self._fenced_send(
                        inst.item, functools.partial(_fenced_request, request), "task configs")
                except FencedError as exc:
                    self.log.info("task configs not written: this worker no longer holds the "
                                  "connector", connector=inst.item.connector, error=str(exc))
                    return
                self.log.info("task configs written", connector=inst.item.connector,
                              tasks=len(configs), changed=resp.changed, group_epoch=resp.group_epoch)
                last = configs
            await inst.reconfigure.wait()

    # -- computing the assignment ---------------------------------------------------------------
    async def _compute_assignment(self) -> None:
        m = self.membership
        try:
            prep = await self.client.send(ConnectGroupPrepareAssignmentRequest(
                group_id=self.config.group_id, member_id=m.member_id, member_epoch=m.member_epoch))
            if prep.error_code:
                self.log.info("prepare assignment refused", error=error_name(prep.error_code),
                         message=prep.error_message)
                return
            assignor = next((a for a in self.assignors if a.name == prep.assignor_name), None)
            if assignor is None:
                self.log.error("the group's assignor is not one of ours", assignor=prep.assignor_name)
                return
            group = group_from_prepare(prep)
            started = time.monotonic()
            result = await asyncio.to_thread(assignor.assign, group)
            self.metrics.assign_seconds.observe(time.monotonic() - started)
            for attempt in range(3):
                resp = await self.client.send(install_request(
                    self.config.group_id, m.member_id, m.member_epoch, prep.group_epoch, result))
                stale = resp.error_code in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.STALE_MEMBER_EPOCH)
                if stale and attempt < 2:
                    await asyncio.sleep(m.heartbeat_interval_ms / 1000)  # our epoch moves on
                    continue
                break
            if resp.error_code:
                self.log.warning("install assignment refused", error=error_name(resp.error_code),
                            message=resp.error_message)
            else:
                self.log.info("installed assignment", group_epoch=prep.group_epoch,
                         members=len(result.members), delay_ms=result.scheduled_rebalance_delay_ms)
                # Our own new target is waiting: poll now rather than after the interval.
                m.next_heartbeat_ms = now_ms()
                self._wake.set()
        except ConnectionFailed as exc:
            self.log.info("assignment computation abandoned", error=str(exc))
        except SecurityError as exc:
            self._refused(exc)

    # -- shutdown -------------------------------------------------------------------------------
    async def stop(self, static: bool | None = None) -> None:
        """Stop all work, then leave the group (-1; -2 for a static member's planned restart,
        which keeps its work held for it until its session expires)."""
        static = self.config.instance_id is not None if static is None else static
        if self._failed_stop is not None:
            await self._close_after_fail_stop()
            return
        # Fix (found by the simulator, "stop-without-session"): stop the work *through the
        # loop*, as a revocation of everything, so heartbeats go on while the instances stop.
        # Stopping them after the loop had ended sent no heartbeat, and a shutdown longer than
        # the session timeout let the coordinator hand the items on while they still ran.
        # While draining, new assignments are not started.
        if self._running and not self._stop.is_set():
            self._draining = True
            self._pending.append(Revoke(frozenset(self.instances) | self.membership.owned))
            self._wake.set()
            self._kick.set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.stop_deadline_s * 2 + 2

            def acting() -> bool:  # (a finished action counts as done: the loop may be parked)
                return self._acting is not None and not self._acting.done()

            while self._running and loop.time() < deadline and (
                    self.instances or self._pending or acting()):
                if self.instances and not self._pending and not acting():
                    # Fix (found by the simulator, "stop-during-assign"): an assignment that
                    # was still fetching its configs when the Revoke above was queued started
                    # its instances afterwards; drain those too, through the loop.
                    self._pending.append(Revoke(frozenset(self.instances) | self.membership.owned))
                    self._wake.set()
                    self._kick.set()
                await asyncio.sleep(0.02)
        self._stop.set()
        if self._inflight is not None:
            self._inflight.cancel()
        self._wake.set()
        # Fix: let the loop end first (it finishes a start or stop in progress); an assignment
        # completing after the snapshot below used to leave its instances running after we left.
        if self._running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), self.stop_deadline_s * 2 + 2)
        items = frozenset(self.instances)
        try:
            await self._stop_items(items)
        except _FailStopped:
            pass
        if self._failed_stop is not None:
            await self._close_after_fail_stop()
            return
        if items:
            await _call(self.listener.on_revoked, items)
        if self.membership.member_id:
            # A leave the coordinator could not write (COORDINATOR_NOT_AVAILABLE, loading, a
            # broken connection) is retried a few times; otherwise the session expiry removes us.
            for attempt in range(4):
                try:
                    resp = await self.client.send(self.membership.leave_request(static=static))
                except (ConnectionFailed, SecurityError):
                    resp = None
                if resp is not None and resp.error_code not in (
                        ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                        ErrorCode.NOT_COORDINATOR):
                    self.log.info("left the group", static=static, error=error_name(resp.error_code))
                    break
                if attempt < 3:
                    await asyncio.sleep(self.client.backoff_s())
        self.membership.left()
        await self.client.close()
        self._guard.close()

    async def _close_after_fail_stop(self) -> None:
        """A fail-stop whose configured action returned: like a dead process, no leave."""
        self._stop.set()
        self._wake.set()
        if self._running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), 5)
        await self.client.close()
        self._guard.close()


async def _call(hook: Any, items: frozenset[Item]) -> None:
    if not items:
        return
    try:
        result = hook(items)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:  # a listener bug must not break the protocol
        log.error("rebalance listener failed", hook=getattr(hook, "__name__", "?"), error=repr(exc))


def _fenced_request(request: Any, member_id: str, epoch: int) -> Any:
    return dataclasses.replace(request, member_id=member_id, member_epoch=epoch)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _names(items: frozenset[Item]) -> list[str]:
    return sorted(str(i) for i in items)
