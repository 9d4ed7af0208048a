"""The fail-stop guard (worker_client/failstop.py) and the deadlines the worker gives it."""

from __future__ import annotations

import threading

from connect_wire.items import Item
from worker_client.failstop import FailStopGuard
from worker_client.worker import Worker, WorkerConfig, _Instance, now_ms


def _guard(probe, idle_wait_s: float = 10.0):  # type: ignore[no-untyped-def]
    fired: list[tuple[str, int]] = []
    done = threading.Event()

    def fail(reason: str) -> None:
        fired.append((reason, now_ms()))
        done.set()
    return FailStopGuard(probe, fail, now_ms, idle_wait_s=idle_wait_s), fired, done


def test_fires_once_at_the_deadline_not_before() -> None:
    deadline = now_ms() + 80
    g, fired, done = _guard(lambda: (deadline, "late"))
    g.start()
    assert done.wait(10)
    g.close()
    assert len(fired) == 1 and fired[0][0] == "late"
    assert fired[0][1] >= deadline
    assert g.fired == "late"


def test_a_deadline_withdrawn_in_time_never_fires_and_poke_brings_an_earlier_one() -> None:
    state: dict[str, tuple[int, str] | None] = {"d": (now_ms() + 60_000, "far")}
    g, fired, done = _guard(lambda: state["d"], idle_wait_s=30.0)
    g.start()
    assert g.check() is None
    state["d"] = None  # the stop ended
    g.poke()
    assert not done.wait(0.2) and not fired
    state["d"] = (now_ms() + 30, "soon")  # a new stop, earlier than the guard's idle wait
    g.poke()
    assert done.wait(10), "poke made the guard re-read the probe"
    g.close()
    assert [r for r, _ in fired] == ["soon"]


def test_close_stops_the_thread() -> None:
    g, fired, _ = _guard(lambda: None)
    g.start()
    g.close()
    assert g._thread is None and not fired


def test_worker_deadlines_per_stop_and_lease_backstop() -> None:
    w = Worker(WorkerConfig(bootstrap=[("127.0.0.1", 1)], group_id="g", rebalance_timeout_ms=4000,
                            session_timeout_ms=3000, fail_stop=lambda r: None))
    assert (w.stop_budget_ms, w.fail_stop_margin_ms) == (2000, 100)
    assert w._fail_stop_probe() is None  # nothing runs, no lease
    w.membership.last_success_ms = 1_000_000
    assert w._fail_stop_probe() is None  # a lease but nothing runs
    item = Item("c", 0)
    w.instances[item] = _Instance(item, None, {})
    assert w._fail_stop_probe()[0] == 1_000_000 + 3000 + 2000 - 100  # lease end + budget - margin
    w.membership.last_success_ms = now_ms()  # a fresh lease: the stop's deadline comes first
    before = now_ms()
    token = w._arm_stop(item)
    at, why = w._fail_stop_probe()
    assert before + 2000 <= at <= now_ms() + 2000 and "c/0" in why and "2000 ms" in why
    w._stop_deadlines.pop(token)
    w._guard.close()
    # A tiny rebalance timeout still gives stops 100 ms (the coordinator's floor too).
    tiny = Worker(WorkerConfig(bootstrap=[("h", 1)], group_id="g", rebalance_timeout_ms=50))
    assert tiny.stop_budget_ms == 100


def test_the_fail_stop_action_runs_even_when_the_log_line_cannot_be_written(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Found by review: a log call that raised (a closed stderr) or blocked (a full pipe) came
    before the exit, so the process never ended while its plugin ran on."""
    import worker_client.worker as worker_mod

    def broken(*a: object, **k: object) -> None:
        raise BrokenPipeError("stderr is gone")
    monkeypatch.setattr(worker_mod.log, "critical", broken)
    fired: list[str] = []
    w = Worker(WorkerConfig(bootstrap=[("127.0.0.1", 1)], group_id="g", fail_stop=fired.append))
    w._fail_stop("the instance c/0 did not stop")
    w._fail_stop("again")  # once only
    assert fired == ["the instance c/0 did not stop"] and w.failed_stop == fired[0]


def test_long_polls_stay_within_a_third_of_the_session() -> None:
    """Found by review: with the coordinator's interval at half its session, two parked polls
    back to back outlasted the lease (counted from the send time of the last answered one) and
    a healthy worker fenced itself, then fail-stopped."""
    from worker_client.membership import AssignorAd, Membership
    m = Membership(group_id="g", assignors=[AssignorAd("eager", 0, 0)], session_timeout_ms=2000,
                   long_poll=True)
    m.member_id, m.heartbeat_interval_ms, m.resend_all = "m1", 1000, False
    assert m.heartbeat_request(0).max_wait_ms == 666
    m.heartbeat_interval_ms = 200
    assert m.heartbeat_request(0).max_wait_ms == 200


def test_the_stop_budget_is_the_workers_own_and_the_coordinator_holds_exactly_it() -> None:
    """Issue 14: the stop budget is a setting of its own (Kafka Connect's
    task.shutdown.graceful.timeout.ms, 5 s by default), not half of an unrelated 60 s timeout.
    The worker announces twice it as its rebalance timeout, and the coordinator's hold of a
    fenced member's items is then its session deadline plus exactly that budget."""
    from tests.group_harness import Harness
    from tests.test_group_coordinator import ALL, hb, one_worker
    from worker_client.worker import DEFAULT_STOP_BUDGET_MS

    def worker(**kw: object) -> Worker:
        return Worker(WorkerConfig(bootstrap=[("h", 1)], group_id="g", **kw))  # type: ignore[arg-type]

    assert DEFAULT_STOP_BUDGET_MS == 5_000
    for kw, budget in (({}, 5_000), ({"stop_budget_ms": 1_234}, 1_234), ({"stop_budget_ms": 100}, 100),
                       ({"rebalance_timeout_ms": 60_000}, 30_000),  # the deprecated way
                       ({"rebalance_timeout_ms": 50}, 100),
                       ({"stop_budget_ms": 700, "rebalance_timeout_ms": 1_400}, 700)):
        w = worker(**kw)
        join = w.membership.heartbeat_request(now_ms())
        assert (w.stop_budget_ms, join.rebalance_timeout_ms) == (budget, 2 * budget), kw
        w._guard.close()
        # What the coordinator makes of it: max(100, timeout // 2) is the budget exactly.
        h = Harness()
        one_worker(h, rebalance_timeout_ms=join.rebalance_timeout_ms)  # W1 runs A, B and tasks
        hb(h, "W1", owned=ALL)
        deadline = h.group().soft.session_deadline["W1"]
        h.advance(deadline - h.now + 1)  # the session expires: fenced, its items held
        assert "W1" not in h.group().members
        assert h.timers[("hold", "g", "W1")] == deadline + budget, kw
    for bad in ({"stop_budget_ms": 99}, {"stop_budget_ms": 2**30}, {"stop_budget_ms": 500,
                                                                    "rebalance_timeout_ms": 2_000},
                {"rebalance_timeout_ms": 0}):
        try:
            worker(**bad)
        except ValueError as exc:
            assert "ms" in str(exc), exc
        else:
            raise AssertionError(f"{bad} accepted")
