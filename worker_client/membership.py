"""The worker side of the connect group protocol, as a pure state machine.

Theory of operation (seed 000 "Rebalance Process", KIP-848 "Response Handling")
--------------------------------------------------------------------------------
The async worker loop asks :meth:`Membership.heartbeat_request` what to send, sends it, and
feeds the answer to :meth:`Membership.on_response`, which returns *actions* for the loop to
carry out, in order:

* :class:`Revoke` — stop these connectors/tasks, call ``on_revoked``, then call
  :meth:`Membership.revoked` and heartbeat **at once** with the new owned lists (the coordinator
  gives the member nothing new until it acknowledged).
* :class:`Assign` — start these, call ``on_assigned``, then :meth:`Membership.assigned`.
* :class:`Lost` — fenced (FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID): stop everything at once,
  call ``on_lost``, then :meth:`Membership.revoked`; only then does the member rejoin, with
  epoch 0 and the **same member id**. The same happens on the worker's own initiative when it
  has not had a successful heartbeat for its session timeout (:meth:`Membership.check_session`):
  by then the coordinator has removed it and may have given its work to others, so a zombie
  stops rather than run a task twice.
* :class:`Compute` — this member was chosen to compute the group's assignment.
* :class:`Fatal` — an error retrying cannot fix (e.g. UNSUPPORTED_ASSIGNOR): stop the worker.

Revocations always come first: if one response both removes and adds items (the coordinator
never does that, but an old member's state might), the loop gets ``Revoke`` then ``Assign``.

Requests: the join (epoch 0) carries every field; afterwards only what changed since the last
request the coordinator is known to have processed (owned lists, assignors, URL). After an
error, a timeout or a reconnect the next request carries everything again, since the previous
one may or may not have been applied. Leaving: -1 after stopping all work, -2 for a static
member's planned restart (its work stays held for it until its session expires).

Fencing: each item's fencing token (``Assignment.FencingTokens``) is kept in ``tokens`` while
the member holds the item (assigned, or owned until reported released);
:meth:`Membership.write_refusal` says whether a write fenced by the member epoch (offsets,
task configs) may be sent for an item now.

No I/O, no clock: times are passed in (``now_ms``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from connect_wire.errors import ErrorCode, error_name
from connect_wire.items import EMPTY, Item, items_from_wire, split_items
from connect_wire.messages import ConnectGroupHeartbeatRequest, ConnectGroupHeartbeatResponse
from connect_wire.messages import connect_group_heartbeat_request_v0 as _hb

E = ErrorCode


class State(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"
    RECONCILING = "reconciling"
    STABLE = "stable"
    LEAVING = "leaving"
    LEFT = "left"
    FAILED = "failed"


@dataclass(frozen=True)
class AssignorAd:
    """An assignor as advertised in the heartbeat."""

    name: str
    minimum_version: int
    maximum_version: int
    reason: int = 0
    metadata_version: int = 0
    metadata: bytes = b""


@dataclass(frozen=True)
class Revoke:
    items: frozenset[Item]


@dataclass(frozen=True)
class Assign:
    items: frozenset[Item]
    error: int = 0
    metadata_version: int = 0
    metadata: bytes = b""


@dataclass(frozen=True)
class Lost:
    items: frozenset[Item]
    reason: str


@dataclass(frozen=True)
class Compute:
    member_epoch: int


@dataclass(frozen=True)
class Fatal:
    code: int
    message: str


Action = Revoke | Assign | Lost | Compute | Fatal

# Errors after which retrying (with the next heartbeat, everything resent) is right.
RETRY = {
    E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS,
    E.REQUEST_TIMED_OUT, E.NETWORK_EXCEPTION, E.UNKNOWN_SERVER_ERROR,
    E.UNRELEASED_INSTANCE_ID,  # our previous incarnation still holds the instance: wait
}
FENCED = {E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID}


@dataclass
class Membership:
    group_id: str
    assignors: Sequence[AssignorAd]
    rebalance_timeout_ms: int = 60_000
    member_id: str = ""
    instance_id: str | None = None
    worker_url: str | None = None
    long_poll: bool = False
    """Long-poll: ask the coordinator to hold each heartbeat up to the heartbeat interval and
    answer as soon as something changes; poll again right after each answer. A rebalance then
    completes in round trips instead of heartbeat intervals."""
    session_timeout_ms: int = 10_000
    """The coordinator's session timeout: with no successful heartbeat for this long the
    worker stops its work by itself."""

    state: State = State.UNJOINED
    member_epoch: int = 0
    owned: frozenset[Item] = EMPTY
    """What this worker runs now (what it reports)."""
    assigned: frozenset[Item] = EMPTY
    """What the coordinator last said this worker may run."""
    heartbeat_interval_ms: int = 3_000
    next_heartbeat_ms: int = 0
    resend_all: bool = True
    _sent_owned: frozenset[Item] | None = None
    _sent_assignors: tuple[AssignorAd, ...] | None = None
    _sent_url: str | None = None
    tokens: dict[Item, int] = field(default_factory=dict)
    """The fencing token of each item this member holds (assigned, or owned until reported
    released), as the latest heartbeat assignment carried it (``Assignment.FencingTokens``).
    An item the coordinator sent no token for has none (a coordinator that does not send them)."""
    instance_states: dict[Item, tuple[str, str | None, str | None]] = field(default_factory=dict)
    """The worker's instances' states (item -> (state, error, trace)), set by the worker before
    each heartbeat (Status): sent only when they changed, in full on join."""
    _sent_states: dict[Item, tuple[str, str | None, str | None]] | None = None
    _sent_states_epoch: int | None = None
    _in_flight_states_epoch: int | None = None
    _in_flight_states: dict[Item, tuple[str, str | None, str | None]] | None = None
    _in_flight: ConnectGroupHeartbeatRequest | None = field(default=None, repr=False)
    _sent_at_ms: int = 0
    failure: Fatal | None = None
    last_success_ms: int | None = None
    stopping_lost: bool = False
    """Work was lost: no heartbeat until the loop reports it stopped (``revoked``)."""
    _keepalive: bool = False

    # -- requests ------------------------------------------------------------------------------
    def join(self, now_ms: int = 0) -> None:
        """Start (or restart) joining: the next heartbeat is a full epoch-0 request."""
        self.state = State.JOINING
        self.member_epoch = 0
        self.resend_all = True
        self.next_heartbeat_ms = now_ms

    def heartbeat_due(self, now_ms: int, keepalive: bool = False) -> bool:
        """``keepalive``: the worker is busy stopping or starting work, so a heartbeat only keeps
        the session: due once an interval has passed since the last request."""
        return (
            self.state in (State.JOINING, State.RECONCILING, State.STABLE)
            and not self.stopping_lost
            and now_ms >= self.next_due_ms(keepalive)
        )

    def next_due_ms(self, keepalive: bool = False) -> int:
        if keepalive:
            return max(self.next_heartbeat_ms, self._sent_at_ms + self.heartbeat_interval_ms)
        return self.next_heartbeat_ms

    def check_session(self, now_ms: int) -> Lost | None:
        """Self-fencing: no successful heartbeat for the session timeout -> stop everything
        (also when nothing runs yet but an assignment is waiting to start: it is stale)."""
        if self.last_success_ms is None or self.stopping_lost or not (self.owned or self.assigned):
            return None
        if not self.lease_expired(now_ms):
            return None
        return self._lose(now_ms, "no successful heartbeat within the session timeout")

    def lease_expired(self, now_ms: int) -> bool:
        """The session lease (send time of the last successful heartbeat + session timeout) has
        passed: the coordinator may have handed this member's work to others. Nothing may be
        started then (found by the simulator: "zombie-starts-stale-assignment")."""
        return (self.last_success_ms is not None
                and now_ms - self.last_success_ms >= self.session_timeout_ms)

    def _lose(self, now_ms: int, reason: str) -> Lost:
        lost = self.owned
        self.assigned = EMPTY
        self.tokens = {item: tok for item, tok in self.tokens.items() if item in lost}
        self._sent_owned = None
        self.join(now_ms)  # same member id, epoch 0, once the work is stopped
        self.stopping_lost = bool(lost)
        return Lost(lost, reason)

    def heartbeat_request(self, now_ms: int, max_wait_ms: int | None = None,
                          keepalive: bool = False) -> ConnectGroupHeartbeatRequest:
        """The next heartbeat to send (full on join and after any doubt; else only changes).

        ``keepalive``: the worker is busy stopping or starting work and only keeps its session:
        the request is not long-polled (so the acknowledgement that follows is not stuck behind
        a parked heartbeat) and the next one is due after the interval, not at once."""
        if keepalive:
            max_wait_ms = 0
        self._keepalive = keepalive
        full = self.resend_all or self.member_epoch == 0
        owned_connectors = owned_tasks = None
        if full or self._sent_owned != self.owned:
            connectors, tasks = split_items(self.owned)
            owned_connectors = tuple(connectors)
            owned_tasks = tuple(_hb.TaskId(connector=t.connector, task=t.task) for t in tasks)
        assignors = tuple(self.assignors)
        states = self._in_flight_states = None
        if self.instance_states and (full or self._sent_states != self.instance_states
                                     or self._sent_states_epoch != self.member_epoch):
            # (absent means unchanged: a report with no instance is never needed, as the
            # coordinator shows states only of what the member owns. Sent again at each new
            # epoch: the coordinator forgets the states of a connector whose target state
            # changed, and takes a STOPPED one as the proof that its stop has ended)
            states = self._in_flight_states = dict(self.instance_states)
            self._in_flight_states_epoch = self.member_epoch
        if max_wait_ms is None:
            # At most a third of the session: the lease runs from the send time of the last
            # answered heartbeat, so two long polls back to back must end well within it (a
            # coordinator whose interval is half its session made the worker fence itself).
            max_wait_ms = min(self.heartbeat_interval_ms, self.session_timeout_ms // 3) \
                if self.long_poll else 0
        wait = max_wait_ms
        req = ConnectGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.member_epoch,
            instance_id=self.instance_id if full else None,
            rebalance_timeout_ms=self.rebalance_timeout_ms if full else -1,
            worker_url=self.worker_url if (full or self._sent_url != self.worker_url) else None,
            client_assignors=(
                tuple(_ad(a) for a in assignors) if (full or self._sent_assignors != assignors) else None
            ),
            owned_connectors=owned_connectors,
            owned_tasks=owned_tasks,
            # Long-poll once the coordinator knows us (a first join, or anything sent after a
            # doubt, is answered at once); also at epoch 0 and while waiting for released items.
            max_wait_ms=wait if (self.member_id and not self.resend_all and not self.stopping_lost) else 0,
            instance_states=() if states is None else tuple(
                _hb.InstanceState(connector=item.connector, task=item.task, state=st,
                                  error_message=err, trace=trace)
                for item, (st, err, trace) in sorted(states.items())
            ),
        )
        self._in_flight = req
        self._sent_at_ms = now_ms
        return req

    def leave_request(self, static: bool = False) -> ConnectGroupHeartbeatRequest:
        """-1 (leave; call after stopping all work) or -2 (static member, planned restart)."""
        if static and self.instance_id is None:
            raise ValueError("only a static member (with an instance id) can leave with -2")
        self.state = State.LEAVING
        return ConnectGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id,
            member_epoch=-2 if static else -1, instance_id=self.instance_id if static else None,
        )

    def left(self) -> None:
        self.state = State.LEFT
        self.member_epoch = 0
        self.assigned = EMPTY
        self.tokens = {}

    # -- responses -----------------------------------------------------------------------------
    def on_failure(self, now_ms: int, backoff_ms: int) -> None:
        """The request failed or timed out (no response): resend everything after a backoff."""
        self.resend_all = True
        self._in_flight = None
        self.next_heartbeat_ms = now_ms + backoff_ms

    def on_response(self, resp: ConnectGroupHeartbeatResponse, now_ms: int) -> list[Action]:
        sent = self._in_flight
        self._in_flight = None
        code = resp.error_code
        if code != 0:
            return self._on_error(code, resp.error_message, now_ms)
        if sent is not None:
            self.resend_all = False
            if sent.owned_connectors is not None:
                self._sent_owned = items_from_wire(sent.owned_connectors, sent.owned_tasks)
            if sent.client_assignors is not None:
                self._sent_assignors = tuple(self.assignors)
            if sent.worker_url is not None:
                self._sent_url = sent.worker_url
            if self._in_flight_states is not None:
                self._sent_states = self._in_flight_states
                self._sent_states_epoch = self._in_flight_states_epoch
        # Fix: the coordinator counts the session from when it handled the request, which is
        # before its (possibly long-polled) answer arrives; counting from the answer made the
        # self-fencing in check_session fire after the coordinator could already have expired
        # the member (measured: 2.03 s after a stall with a 2 s session).
        self.last_success_ms = self._sent_at_ms if sent is not None else now_ms
        if resp.member_id:
            self.member_id = resp.member_id
        if resp.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = resp.heartbeat_interval_ms
        news = resp.member_epoch != self.member_epoch
        self.member_epoch = resp.member_epoch
        actions: list[Action] = []
        a = resp.assignment
        if a is not None:
            new = items_from_wire(a.connectors, a.tasks)
            self.assigned = new
            # A revoking item keeps its token until it is reported released (its stop() may
            # still write); an item given again gets the token of this grant.
            tokens = {item: tok for item, tok in self.tokens.items() if item in self.owned}
            for t in a.fencing_tokens:
                item = Item(t.connector, t.task)
                if item in new:
                    tokens[item] = t.token
            self.tokens = tokens
            revoke = self.owned - new
            add = new - self.owned
            if revoke:
                actions.append(Revoke(frozenset(revoke)))
            if add:
                actions.append(Assign(frozenset(add), a.error, a.metadata_version, a.metadata_bytes))
        news = news or bool(actions)
        self.next_heartbeat_ms = now_ms + self.heartbeat_interval_ms
        if self.long_poll and sent is not None and not self._keepalive:
            # Poll again at once after news, after a request that could not be held (a first
            # join, a resend) or after a held one; an answer that came back at once with
            # nothing new (e.g. "compute" while computing) waits the interval: never spin.
            held = sent.max_wait_ms > 0 and now_ms - self._sent_at_ms >= sent.max_wait_ms // 2
            if news or sent.max_wait_ms == 0 or held:
                self.next_heartbeat_ms = now_ms
        if sent is not None and self.owned != self._sent_owned:
            self.next_heartbeat_ms = now_ms  # work stopped or started meanwhile: report it now
        self._settle_state()
        if resp.should_compute_assignment:
            actions.append(Compute(self.member_epoch))
        return actions

    def fail(self, code: int, message: str) -> Fatal:
        """Give up for a reason no heartbeat answer carried (the coordinator refused this
        worker's credentials): FAILED, as after a fatal error code."""
        self.state = State.FAILED
        self.failure = Fatal(code, message)
        return self.failure

    def _on_error(self, code: int, message: str | None, now_ms: int) -> list[Action]:
        text = f"{error_name(code)}: {message or ''}".rstrip(": ")
        if code in FENCED:
            return [self._lose(now_ms, text)]
        if code in RETRY:
            self.resend_all = True
            self.next_heartbeat_ms = now_ms + min(self.heartbeat_interval_ms, 1_000)
            return []
        # UNSUPPORTED_ASSIGNOR, GROUP_MAX_SIZE_REACHED, FENCED_INSTANCE_ID, INVALID_REQUEST, ...
        self.state = State.FAILED
        self.failure = Fatal(code, text)
        return [self.failure]

    def _settle_state(self) -> None:
        if self.state in (State.LEAVING, State.LEFT, State.FAILED):
            return
        if self.member_epoch == 0:
            self.state = State.JOINING
        elif self.owned != self.assigned:
            self.state = State.RECONCILING
        else:
            self.state = State.STABLE

    # -- the loop reports what it did ------------------------------------------------------------
    def revoked(self, items: frozenset[Item], now_ms: int) -> None:
        """These items are stopped (after a Revoke or a Lost): report at once."""
        self.owned = self.owned - items
        for item in items - self.assigned:
            self.tokens.pop(item, None)
        self.next_heartbeat_ms = now_ms
        if not self.owned:
            self.stopping_lost = False
        self._settle_state()

    def holds(self, item: Item) -> bool:
        """The coordinator counts ``item`` as this member's: assigned to it, or owned and not yet
        reported released (a revoking item's ``stop()`` may still commit)."""
        return item in self.assigned or item in self.owned

    def write_refusal(self, item: Item) -> tuple[int, str] | None:
        """Why a write fenced by this member's epoch (an offsets commit, task configs) for
        ``item`` cannot be accepted now, as (error code, message), or None if it may be sent:
        a member that lost its membership (epoch 0: fenced, or rejoining) writes nothing, nor
        does one that no longer holds the item."""
        if self.state in (State.LEAVING, State.LEFT, State.FAILED) or not self.member_id \
                or self.member_epoch <= 0:
            return (E.UNKNOWN_MEMBER_ID, f"this worker is not a member of group {self.group_id} "
                    "now (fenced, rejoining or gone): the item may run elsewhere")
        if not self.holds(item):
            return (E.ITEM_NOT_OWNED, f"this worker no longer holds {item}")
        return None

    def assigned_started(self, items: frozenset[Item], now_ms: int) -> None:
        """These items run now (or are being restarted by the runtime): report on the next beat."""
        self.owned = self.owned | (items & self.assigned)
        if self.owned != self._sent_owned:
            self.next_heartbeat_ms = min(self.next_heartbeat_ms, now_ms)
        self._settle_state()



def _ad(a: AssignorAd) -> _hb.Assignor:
    return _hb.Assignor(
        name=a.name, minimum_version=a.minimum_version, maximum_version=a.maximum_version,
        reason=a.reason, metadata_version=a.metadata_version, metadata_bytes=a.metadata,
    )
