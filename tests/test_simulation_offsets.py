"""The simulator's ledger of ownership, fencing tokens and acknowledged offsets
(``simulation.invariants.Ledger``): each check on hand-made traces of what a coordinator made
durable, applied and answered -- it stays quiet on a correct trace and catches the violation it
is for on a wrong one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from connect_wire.items import Item
from connect_wire.records import (
    CurrentMemberAssignmentKey,
    CurrentMemberAssignmentValue,
    GroupConnectorsKey,
    GroupConnectorsValue,
    GroupMemberKey,
)
from connect_wire.records import current_member_assignment_value_v0 as _cma
from connect_wire.records import group_connectors_value_v0 as _gc
from coordinator.group.coordinator import GroupCoordinator
from coordinator.group.records import Record
from simulation import ASSIGNORS, SCENARIOS, run
from simulation.engine import Simulation
from simulation.invariants import Ledger, canonical, partition_key

G = "g"
C0, C1 = Item("c", 0), Item("c", 1)
P0 = partition_key(C0)


def member(mid: str, present: bool = True) -> Record:
    return Record(GroupMemberKey(group_id=G, member_id=mid), object() if present else None)


def owns(mid: str, epoch: int, tokens: dict[Item, int], revoking: dict[Item, int] | None = None,
         with_tokens: bool = True) -> Record:
    revoking = revoking or {}

    def tasks(items: dict[Item, int]) -> tuple[_cma.TaskId, ...]:
        return tuple(_cma.TaskId(connector=i.connector, task=i.task) for i in sorted(items))

    every = {**tokens, **revoking}
    return Record(CurrentMemberAssignmentKey(group_id=G, member_id=mid), CurrentMemberAssignmentValue(
        member_epoch=epoch, previous_member_epoch=epoch - 1, state=0, connectors=(), tasks=tasks(tokens),
        revoking_connectors=(), revoking_tasks=tasks(revoking), metadata_version=0, metadata_bytes=b"",
        fencing_tokens=tuple(_cma.ItemToken(connector=i.connector, task=i.task, token=t)
                             for i, t in sorted(every.items())) if with_tokens else ()))


def gone(mid: str) -> Record:
    return Record(CurrentMemberAssignmentKey(group_id=G, member_id=mid), None)


def connectors(**incarnations: int) -> Record:
    return Record(GroupConnectorsKey(group_id=G), GroupConnectorsValue(epoch=1, connectors=tuple(
        _gc.ConnectorSpec(name=n, task_count=2, config=(), incarnation=i) for n, i in incarnations.items())))


def pos(n: int) -> str:
    return canonical({"pos": n})


def test_the_owners_commits_and_a_later_fetch_are_quiet() -> None:
    ledger = Ledger()
    assert ledger.records([connectors(c=5), member("w1"), owns("w1", 3, {C0: 10})], 100) == []
    assert ledger.commit("w1", 3, C0, [(P0, pos(1))], 200) == []
    # a revoking item still counts (stop() commits its last position)
    assert ledger.records([owns("w1", 4, {}, revoking={C0: 10})], 300) == []
    assert ledger.commit("w1", 4, C0, [(P0, pos(2))], 310) == []
    assert ledger.fetched("c", [(P0, pos(2))], 400) == []
    assert ledger.counts["commits_accepted"] == 2 and ledger.counts["grants"] == 1


def test_an_accepted_commit_from_a_member_that_does_not_own_the_item_is_caught() -> None:
    ledger = Ledger()
    ledger.records([member("w1"), owns("w1", 3, {C0: 10}), member("w2"), owns("w2", 3, {C1: 11})], 100)
    found = ledger.commit("w2", 3, C0, [(P0, pos(7))], 200)
    assert len(found) == 1 and "by w2" in found[0] and "w1 owns it" in found[0]


def test_an_accepted_commit_at_a_stale_epoch_or_from_a_fenced_member_is_caught() -> None:
    ledger = Ledger()
    ledger.records([member("w1"), owns("w1", 3, {C0: 10})], 100)
    assert "its epoch is 3" in ledger.commit("w1", 2, C0, [(P0, pos(1))], 200)[0]
    # fenced: its member record is gone, its items held (epoch -3) until its stops must be over
    ledger.records([member("w1", present=False), owns("w1", -3, {}, revoking={C0: 10})], 300)
    assert "not a member" in ledger.commit("w1", 3, C0, [(P0, pos(1))], 400)[0]


def test_a_token_that_does_not_increase_across_grants_is_caught() -> None:
    ledger = Ledger()
    ledger.records([member("w1"), owns("w1", 3, {C0: 10})], 100)
    assert ledger.records([owns("w1", 4, {C0: 10})], 150) == []  # still owned: the same grant
    # the item moves: the next holder's token must be higher (a reload that restarted the counter
    # would give it 10 again, or less)
    found = ledger.records([owns("w1", 5, {}), member("w2"), owns("w2", 5, {C0: 10})], 200)
    assert len(found) == 1 and "did not increase" in found[0] and "w2 was granted 10" in found[0]
    assert ledger.records([owns("w2", 6, {}), owns("w1", 6, {C0: 12})], 300) == []
    # a revocation and a later return to the same member is a new grant, so a new token
    found = ledger.records([owns("w1", 7, {}), owns("w1", 8, {C0: 12})], 400)
    assert len(found) == 1 and "w1 was granted 12" in found[0]


def test_an_owned_item_without_a_token_is_caught() -> None:
    found = Ledger().records([member("w1"), owns("w1", 3, {C0: 0}, with_tokens=False)], 100)
    assert found == ["w1 owns c/0 without a fencing token (t=100)"]
    assert Ledger(tokens=False).records([owns("w1", 3, {C0: 0}, with_tokens=False)], 100) == []


def test_the_resource_refuses_an_older_grants_late_write() -> None:
    ledger = Ledger()
    ledger.records([member("w1"), owns("w1", 3, {C0: 10})], 100)
    assert ledger.write(C0, 10, "w1", 150) == (True, [])
    ledger.records([owns("w1", 4, {}), member("w2"), owns("w2", 4, {C0: 11})], 200)
    assert ledger.write(C0, 10, "w1", 250) == (True, [])  # before the new holder's first write
    assert ledger.write(C0, 11, "w2", 300) == (True, [])
    assert ledger.write(C0, 10, "w1", 350) == (False, [])  # a frozen zombie's write, refused
    assert ledger.counts["writes_refused"] == 1 and ledger.counts["writes_accepted"] == 3


def test_a_resource_accepting_an_older_grants_write_after_a_newer_ones_is_caught() -> None:
    ledger = Ledger()
    ledger.records([member("w1"), owns("w1", 3, {C0: 10})], 100)
    # a coordinator that gave the next holder a lower token (the grant check reports it too)
    assert ledger.records([owns("w1", 4, {}), member("w2"), owns("w2", 4, {C0: 9})], 200)
    assert ledger.write(C0, 9, "w2", 300) == (True, [])
    ok, found = ledger.write(C0, 10, "w1", 350)
    assert ok and len(found) == 1 and "older grant (w1, token 10" in found[0]
    assert "no grant" in ledger.write(C0, 99, "w3", 400)[1][0]


def test_a_lost_acknowledged_commit_is_caught() -> None:
    ledger = Ledger()
    ledger.records([connectors(c=5), member("w1"), owns("w1", 3, {C0: 10})], 100)
    ledger.commit("w1", 3, C0, [(P0, pos(4))], 200)
    ledger.commit("w1", 3, C0, [(P0, pos(5))], 300)
    found = ledger.fetched("c", [(P0, pos(4))], 400, "the fetch after the restart")
    assert found == ["acknowledged commit lost: the fetch after the restart of c {\"task\":0} at t=400 "
                     "returned {\"pos\":4}, the coordinator acknowledged {\"pos\":5}"]
    assert len(ledger.fetched("c", [(P0, None)], 400)) == 1
    assert ledger.expected() == {"c": [P0]}


def test_deleting_the_connector_takes_its_acknowledged_offsets_with_it() -> None:
    ledger = Ledger()
    ledger.records([connectors(c=5), member("w1"), owns("w1", 3, {C0: 10})], 100)
    ledger.commit("w1", 3, C0, [(P0, pos(4))], 200)
    ledger.records([connectors(c=5, d=6)], 250)  # another connector changes nothing
    assert ledger.fetched("c", [(P0, pos(4))], 260) == []
    ledger.records([connectors(c=7)], 300)  # deleted and created again: a new incarnation
    assert ledger.fetched("c", [(P0, None)], 400) == []
    assert ledger.expected() == {}
    # a commit with a null offset removes the partition
    ledger.commit("w1", 3, C0, [(P0, pos(1))], 500)
    ledger.commit("w1", 3, C0, [(P0, None)], 600)
    assert ledger.fetched("c", [(P0, None)], 700) == []


# == the model against the real coordinator ========================================================

FAULTS = ("coordinator-restart", "coordinator-failover", "gc-pause", "long-partition",
          "rolling-bounce-static")


@pytest.mark.parametrize("scenario", FAULTS)
@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_commits_and_tokens_hold_through_restarts_failovers_freezes_and_replacements(
        scenario: str, assignor: str) -> None:
    result = run(scenario, assignor, 3, 12, 0)
    m, x = result.metrics, result.extra
    assert m["violation"] == "" and m["converged"], m["violation"]
    assert x["commits_accepted"] > 50 and x["grants"] >= 15 and x["writes_accepted"] > 50
    assert x["fetches_checked"] >= 15  # every instance resumed from a fetched offset


def _owner(core: GroupCoordinator, req: Any) -> tuple[str, int] | None:
    g = core.group(req.group_id)
    owner = g.owner.get(Item(req.connector, req.task)) if g is not None else None
    if owner is None or owner not in g.members:  # (type: g is set when owner is)
        return None
    return owner, g.current[owner].epoch


def test_a_coordinator_that_accepts_commits_from_a_member_not_owning_the_item_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A core that fences commits against the wrong member (here: the item's owner, whoever
    sent the commit) accepts a frozen zombie's late commits: the ledger sees who sent them."""
    commit = GroupCoordinator.commit_offsets

    def trusting(self: GroupCoordinator, req: Any, now_ms: int) -> Any:
        owner = _owner(self, req)
        if owner is not None:
            req = replace(req, member_id=owner[0], member_epoch=owner[1])
        return commit(self, req, now_ms)

    monkeypatch.setattr(GroupCoordinator, "commit_offsets", trusting)
    caught = [run(s, "eager", 3, 12, seed).metrics["violation"]
              for s in ("gc-pause", "long-partition") for seed in range(4)]
    assert any("was accepted" in v for v in caught), caught


def test_a_coordinator_that_acknowledges_commits_it_did_not_make_durable_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A core whose commits change its state but write no record answers fetches right until it
    restarts: the fetch after the restart returns an older offset than it acknowledged."""
    commit = GroupCoordinator.commit_offsets

    def volatile(self: GroupCoordinator, req: Any, now_ms: int) -> Any:
        result = commit(self, req, now_ms)
        result.records = []
        return result

    monkeypatch.setattr(GroupCoordinator, "commit_offsets", volatile)
    violation = run("coordinator-restart", "incremental", 3, 12, 0).metrics["violation"]
    assert violation.startswith("acknowledged commit lost: the fetch after the restart"), violation


def test_a_coordinator_whose_token_counter_is_not_durable_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A core that keeps its fencing token counter in memory only (no ceiling written, none read
    at a load) starts again from 1 after a restart: the next grant's token is not above the
    tokens given before."""

    def forgetful(self: GroupCoordinator, txn: Any, g: Any, now_ms: int) -> int:
        g.token_counter = (g.token_counter or 0) + 1
        return int(g.token_counter)

    monkeypatch.setattr(GroupCoordinator, "_next_token", forgetful)
    violation = run("coordinator-restart", "eager", 3, 12, 0).metrics["violation"]
    assert "did not increase" in violation, violation


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_a_frozen_writers_late_write_is_refused_by_its_token(assignor: str) -> None:
    """frozen-writer, seed 0: a worker frozen in the middle of a write, longer than its session,
    the hold and the delay; its items go to others, which resume from its last committed offsets
    and write with higher tokens. When it wakes, its write commits after the new holder's: the
    resource refuses it (the lease backstop then ends the process, so nothing else of it runs)."""
    sim = Simulation(SCENARIOS["frozen-writer"], assignor, 3, 12, 0, trace=True)
    result = sim.run()
    assert result.metrics["violation"] == "" and result.metrics["converged"]
    frozen = next(e["worker"] for e in result.events if e["kind"] == "worker_pause")
    refused = [e for e in result.events if e["kind"] == "write_refused"]
    assert len(refused) == 1 and refused[0]["worker"] == frozen
    item = Item.parse(str(refused[0]["item"]))
    stale = int(str(refused[0]["detail"]).split()[1])  # "token N is lower than the resource's"
    token, last = sim.ledger.resources[item]
    assert token == last.token > stale and last.seq > sim.ledger.grants[(item, stale)].seq
    assert result.extra["writes_refused"] == 1


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_the_late_commits_of_a_worker_cut_off_past_its_session_are_fenced(assignor: str) -> None:
    """long-partition, seed 0: the cut-off worker fences itself; its instances' stop() commits
    reach the coordinator when the partition heals, after it expired the member: refused
    UNKNOWN_MEMBER_ID (FencedError in the task), nothing stored."""
    result = run("long-partition", assignor, 3, 12, 0, trace=True)
    assert result.metrics["violation"] == "" and result.metrics["converged"]
    fenced = [e for e in result.events if e["kind"] == "commit_fenced"]
    cut = next(e["worker"] for e in result.events if e["kind"] == "fault")
    assert fenced and {(e["worker"], e["detail"]) for e in fenced} == {(cut, "UNKNOWN_MEMBER_ID")}
    assert result.extra["commits_refused"] >= len(fenced)
