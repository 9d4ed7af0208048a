"""Fencing tokens, connector incarnations and task configs in the group core (sans-IO).

A fencing token is given to an item each time it enters a member's owned set (a grant): it
strictly increases per item across moves, returns to the same member, a static member's new
process, a rejoin after a fence, a connector deleted and created again, and a coordinator
restart (a load starts the counter at the durable ceiling). Checked after every step of every
scenario here (:class:`TokenHarness`): every owned item has a token; a new grant's token is
above every token the item had before; every token (and incarnation) in the records is at most
the ceiling the records carry; replaying the records only, one by one and in bulk, gives the
same state.

Task configs (ConnectGroupWriteTaskConfigs): fenced by the member epoch and the connector
item's ownership; the running task count and the group's items follow them.
"""

from __future__ import annotations

from typing import Any

import pytest

from connect_wire.errors import ErrorCode as E
from connect_wire.messages import ConnectGroupWriteTaskConfigsRequest
from connect_wire.messages import connect_group_write_task_configs_request_v0 as _wtc
from connect_wire.records import ConnectorTaskConfigsKey, GroupMetadataKey
from coordinator.group import records as rec
from coordinator.group.config import GroupCoordinatorConfig
from coordinator.group.coordinator import TOKEN_BLOCK, GroupCoordinator
from coordinator.group.model import Item, TaskConfigs
from coordinator.group.state import CoordinatorState
from coordinator.runtime import serde
from tests.group_harness import Harness, item, names
from tests.test_group_coordinator import ALL, hb, one_worker, two_workers


class TokenHarness(Harness):
    """A harness that checks the token rules after every step."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.grants: dict[tuple[str, Item], list[tuple[str, int]]] = {}
        """(group, item) -> every (member, token) grant seen, in order."""
        super().__init__(*args, **kw)

    def check(self) -> None:
        super().check()
        for gid, g in self.state.groups.items():
            assert g.token_counter is None or g.token_counter <= g.token_ceiling
            for mid, cur in g.current.items():
                assert set(cur.tokens) == set(cur.owned), (mid, cur)
                for it, token in cur.tokens.items():
                    seen = self.grants.setdefault((gid, it), [])
                    if (mid, token) in seen:
                        continue
                    assert all(token > t for _, t in seen), (it, mid, token, seen)
                    seen.append((mid, token))
            for spec in g.connectors.values():
                assert spec.incarnation <= g.token_ceiling
        # Durability: replaying the records only, every token and incarnation is at most the
        # ceiling the records carry (a load would start above them all), and a bulk load of
        # the encoded log gives the very same state.
        fresh = CoordinatorState()
        for record in self.log:
            fresh.replay(record)
        for g in fresh.groups.values():
            given = [t for c in g.current.values() for t in c.tokens.values()]
            given += [c.incarnation for c in g.connectors.values()]
            assert max(given, default=0) <= g.token_ceiling, (given, g.token_ceiling)
        bulk = CoordinatorState()
        serde.replay_log(bulk, [[serde.encode_record(r) for r in self.log]])
        assert bulk.snapshot() == fresh.snapshot()

    def token(self, member_id: str, text: str, group_id: str = "g") -> int:
        return self.group(group_id).current[member_id].tokens[item(text)]

    def write_task_configs(self, member_id: str, connector: str, configs: list[dict[str, str | None]],
                           epoch: int | None = None, group_id: str = "g") -> Any:
        if epoch is None:
            epoch = self.group(group_id).current[member_id].epoch
        req = ConnectGroupWriteTaskConfigsRequest(
            group_id=group_id, member_id=member_id, member_epoch=epoch, connector=connector,
            task_configs=tuple(_wtc.TaskConfig(config=tuple(
                _wtc.ConfigEntry(name=k, value=v) for k, v in c.items())) for c in configs))
        return self.apply(self.coordinator.write_task_configs(req, self.now))

    def restart(self) -> None:
        """A new coordinator loads the log (records only) and takes over."""
        state = CoordinatorState()
        for record in self.log:
            state.replay(record)
        self.coordinator = GroupCoordinator(self.coordinator.config, strict=True, state=state)
        self.timers.clear()
        self.apply(self.coordinator.on_loaded(self.now))


def rebalance(h: TokenHarness) -> None:
    """Start a new assignment: a config change of connector A bumps the group epoch."""
    g = h.group()
    h.alter({c.name: c.task_count for c in g.connectors.values()},
            configs={"A": {"n": str(g.epoch)}})


def hb_token(h: TokenHarness, r: Any) -> dict[str, int]:
    """The heartbeat answer's tokens, by item text."""
    return {(t.connector if t.task < 0 else f"{t.connector}/{t.task}"): t.token
            for t in r.assignment.fencing_tokens}


# == tokens ============================================================================================


def test_tokens_are_given_per_grant_and_sent_with_the_assignment() -> None:
    h = TokenHarness()
    h.now = 1_000
    one_worker(h)
    g = h.group()
    cur = g.current["W1"]
    assert set(cur.tokens) == {item(i) for i in ALL}
    # a new group's counter starts at now_ms * 1000
    assert min(cur.tokens.values()) > 1_000 * 1000 and len(set(cur.tokens.values())) == len(ALL)
    r = h.join("W1", owned=ALL)  # a full answer carries the assignment and its tokens
    assert hb_token(h, r) == {i: h.token("W1", i) for i in ALL}
    members = h.describe().groups[0].members
    assert {(t.connector, t.task): t.token for t in members[0].fencing_tokens} == {
        (i.connector, i.task): tok for i, tok in g.current["W1"].tokens.items()}


def test_a_move_and_a_return_give_higher_tokens() -> None:
    h = TokenHarness()
    two_workers(h)
    a0_w1 = h.token("W1", "A/0")
    kept = h.token("W1", "A")
    # A/0 moves to W2: revoked from W1 first (its token kept while revoking), then W2 gets it.
    rebalance(h)
    h.compute({"W1": ["A", "A/1"], "W2": ["B", "B/0", "A/0"]})
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    assert h.token("W1", "A/0") == a0_w1  # still owned (revoking): same grant
    hb(h, "W1", owned=["A", "A/1"])
    r = hb(h, "W2", owned=["B", "B/0"])
    assert "A/0" in names(h.group().current["W2"].assigned)
    a0_w2 = h.token("W2", "A/0")
    assert a0_w2 > a0_w1 and hb_token(h, r)["A/0"] == a0_w2
    assert h.token("W1", "A") == kept  # what stays keeps its token
    # ... and returns to W1: higher again.
    rebalance(h)
    h.compute({"W1": ["A", "A/1", "A/0"], "W2": ["B", "B/0"]})
    hb(h, "W2", owned=["B", "B/0", "A/0"])
    hb(h, "W2", owned=["B", "B/0"])
    hb(h, "W1", owned=["A", "A/1"])
    assert h.token("W1", "A/0") > a0_w2


def test_an_item_revoked_and_given_back_to_the_same_member_gets_a_new_token() -> None:
    h = TokenHarness()
    two_workers(h)
    before = h.token("W1", "A/1")
    # A/1 is left unassigned for a moment (a rebalance scheduled): W1 releases it ...
    rebalance(h)
    h.compute({"W1": ["A", "A/0"], "W2": ["B", "B/0"]}, delay_ms=1)
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    hb(h, "W1", owned=["A", "A/0"])
    assert item("A/1") not in h.group().current["W1"].tokens
    h.advance(1)  # ... and gets it back
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=["A", "A/0"])
    assert h.token("W1", "A/1") > before


def test_a_static_members_new_process_gets_new_tokens() -> None:
    h = TokenHarness()
    h.alter({"A": 1})
    assert h.join("W1", instance_id="i1").error_code == 0
    h.compute({"W1": ["A", "A/0"]})
    hb(h, "W1", owned=[], instance_id="i1")
    old = dict(h.group().current["W1"].tokens)
    assert h.heartbeat("W1", -2, instance_id="i1").error_code == 0
    assert h.group().current["W1"].tokens == old  # left for a while: still holds them
    r = h.join("W1b", instance_id="i1")  # the new process, a new member id
    assert r.error_code == 0 and "W1" not in h.group().current
    new = h.group().current["W1b"].tokens
    assert set(new) == set(old) and all(new[i] > old[i] for i in old)
    assert hb_token(h, r) == {"A": new[item("A")], "A/0": new[item("A/0")]}
    # The same member id coming back from -2 (it may be a new process too): new tokens again.
    hb(h, "W1b", owned=["A", "A/0"], instance_id="i1")
    before = dict(h.group().current["W1b"].tokens)
    assert h.heartbeat("W1b", -2, instance_id="i1").error_code == 0
    r = h.join("W1b", instance_id="i1", owned=["A", "A/0"])
    after = h.group().current["W1b"].tokens
    assert r.error_code == 0 and all(after[i] > before[i] for i in before)


def test_a_fenced_member_that_rejoins_gets_higher_tokens() -> None:
    h = TokenHarness()
    two_workers(h)
    old = dict(h.group().current["W2"].tokens)
    r = h.heartbeat("W2", 7, owned=["B", "B/0"])  # a wrong epoch: fenced, its items held
    assert r.error_code == E.FENCED_MEMBER_EPOCH
    assert h.group().current["W2"].tokens == old  # the hold keeps them
    assert h.join("W2", owned=[]).error_code == 0
    h.compute({"W1": ["A", "A/0", "A/1"], "W2": ["B", "B/0"]})
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    hb(h, "W2", owned=[])
    new = h.group().current["W2"].tokens
    assert names(new) == ["B", "B/0"] and all(new[i] > old[i] for i in old)


def test_a_connector_deleted_and_created_again_gets_higher_tokens_and_a_new_incarnation() -> None:
    h = TokenHarness()
    one_worker(h)
    g = h.group()
    first = g.connectors["B"].incarnation
    old = h.token("W1", "B/0")
    assert first > 0
    h.alter({"A": 2}, deletes=["B"])
    h.alter({"A": 2, "B": 1})  # an update of A keeps its incarnation
    assert g.connectors["B"].incarnation > first
    assert g.connectors["A"].incarnation < first  # (created before B, kept since)
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    h.compute({"W1": ALL})
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    assert h.token("W1", "B/0") > old


def test_tokens_keep_increasing_across_restarts() -> None:
    """A restart loads the records only: the counter starts at the ceiling they carry, above
    every token given before (some of a reserved block went unused: never reused)."""
    h = TokenHarness()
    two_workers(h)
    g = h.group()
    highest = max(t for c in g.current.values() for t in c.tokens.values())
    assert g.token_counter is not None and g.token_counter < g.token_ceiling  # partly used
    h.restart()
    g = h.group()
    assert g.token_counter is None
    h.alter({"A": 2, "B": 1, "C": 0})  # a change: a new assignment
    h.compute({"W1": ["A", "A/1", "C"], "W2": ["B", "B/0", "A/0"]})
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    hb(h, "W1", owned=["A", "A/1"])
    hb(h, "W2", owned=["B", "B/0"])
    assert h.token("W2", "A/0") > highest
    # twice more, as a worker keeps joining and leaving
    assert h.token("W1", "C") > highest
    for _ in range(2):
        h.restart()
        top = max(t for c in h.group().current.values() for t in c.tokens.values())
        h.heartbeat("W2", -1)  # leaves: its items go to W1
        h.compute({"W1": [*ALL, "C"]})
        hb(h, "W1", owned=["A", "A/1", "C"])
        assert h.token("W1", "B") > top and h.token("W1", "A/0") > top
        assert h.join("W2").error_code == 0
        h.compute({"W1": ["A", "A/1", "C"], "W2": ["B", "B/0", "A/0"]})
        hb(h, "W1", owned=[*ALL, "C"])
        hb(h, "W1", owned=["A", "A/1", "C"])
        hb(h, "W2", owned=[])


def test_tokens_are_reserved_in_blocks_and_every_metadata_record_carries_the_ceiling() -> None:
    h = TokenHarness(check=False)
    h.alter({"A": 1})
    h.join("W1")
    h.compute({"W1": ["A", "A/0"]})
    hb(h, "W1")
    grants = 2
    start = len(h.log)
    while grants < TOKEN_BLOCK + 30:  # W1 leaves and joins again: two grants each time
        h.heartbeat("W1", -1)
        h.join("W1")
        h.compute({"W1": ["A", "A/0"]})
        hb(h, "W1")
        grants += 2
        if grants > 300 and grants < TOKEN_BLOCK - 10:  # skip ahead (the counter alone)
            h.group().token_counter = h.group().token_ceiling - 20
            grants = TOKEN_BLOCK - 10
    metadata = [v for k, v in h.log[start:] if isinstance(k, GroupMetadataKey)]
    ceilings = [v.fencing_token_ceiling for v in metadata]
    assert all(c > 0 for c in ceilings) and ceilings == sorted(ceilings)
    assert len(set(ceilings)) == 2  # one block more: one raise, carried by every later record
    h.check()


# == task configs ======================================================================================


def test_task_configs_set_the_running_task_count() -> None:
    h = TokenHarness()
    h.alter({"A": 3, "B": 1})
    assert h.describe().groups[0].connectors[0].task_configs is None
    h.join("W1")
    h.join("W2")
    h.compute({"W1": ["A", "A/0", "A/1", "A/2"], "W2": ["B", "B/0"]})
    hb(h, "W1")
    hb(h, "W2")
    epoch = h.group().epoch
    r = h.write_task_configs("W1", "A", [{"topic": "t0"}, {"topic": "t1"}])
    assert r.error_code == 0 and r.changed and r.group_epoch == epoch + 1
    g = h.group()
    assert g.task_configs["A"] == TaskConfigs(g.connectors["A"].incarnation,
                                              ((("topic", "t0"),), (("topic", "t1"),)))
    assert item("A/2") not in g.configured and item("A/2") not in g.target_items("W1")
    spec = h.describe().groups[0].connectors[0]
    assert spec.task_count == 3 and [[(e.name, e.value) for e in t.config]
                                     for t in spec.task_configs] == [[("topic", "t0")], [("topic", "t1")]]
    assert [c.task_count for c in h.prepare(h.assigner()).connectors] == [2, 1]
    # The same again: nothing changes, nothing written.
    before = len(h.log)
    r = h.write_task_configs("W1", "A", [{"topic": "t0"}, {"topic": "t1"}])
    assert r.error_code == 0 and not r.changed and len(h.log) == before
    # Back to three: the count can grow back up to the configured one.
    assert h.write_task_configs("W1", "A", [{}, {}, {"x": None}]).changed
    assert item("A/2") in h.group().configured
    # An update of the connector keeps them (and its incarnation); a lower task count caps them.
    h.alter({"A": 2, "B": 1})
    assert len(h.group().task_configs["A"].configs) == 3 and item("A/2") not in h.group().configured
    # Deleting the connector deletes them; created again, it starts without.
    h.alter({"B": 1}, deletes=["A"])
    assert "A" not in h.group().task_configs
    assert (ConnectorTaskConfigsKey(group_id="g", connector="A"), None) in h.log
    h.alter({"A": 3, "B": 1})
    assert h.describe().groups[0].connectors[0].task_configs is None
    assert {item(f"A/{t}") for t in range(3)} <= h.group().configured


def test_task_configs_from_a_revoking_owner_are_accepted() -> None:
    h = TokenHarness()
    two_workers(h)
    rebalance(h)
    h.compute({"W1": ["A/0", "A/1"], "W2": ["B", "B/0", "A"]})
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    assert item("A") in h.group().current["W1"].revoking
    assert h.write_task_configs("W1", "A", [{}]).error_code == 0


@pytest.mark.parametrize("case", [
    "unknown-member", "unknown-group", "stale-epoch", "fenced-epoch", "not-owner",
    "unknown-connector", "too-many", "empty-name", "duplicate-name", "too-big", "no-connector",
])
def test_bad_task_configs_are_refused_and_nothing_is_stored(case: str) -> None:
    h = TokenHarness(GroupCoordinatorConfig(max_batch_bytes=16 * 1024))
    two_workers(h)
    hb(h, "W1", owned=["A", "A/0", "A/1"])
    g = h.group()
    epoch = g.current["W1"].epoch
    args: dict[str, Any] = {"member_id": "W1", "connector": "A", "configs": [{}], "epoch": epoch}
    expected: tuple[int, str] = (0, "")
    if case == "unknown-member":
        args["member_id"], expected = "ghost", (E.UNKNOWN_MEMBER_ID, "ghost is not a member")
    elif case == "unknown-group":
        args["group_id"], expected = "other", (E.UNKNOWN_MEMBER_ID, "of group other")
    elif case == "stale-epoch":
        args["epoch"], expected = epoch - 1, (E.STALE_MEMBER_EPOCH, f"older than the member's epoch {epoch}")
    elif case == "fenced-epoch":
        args["epoch"], expected = epoch + 1, (E.FENCED_MEMBER_EPOCH, "newer")
    elif case == "not-owner":
        args["connector"], expected = "B", (E.ITEM_NOT_OWNED, "does not own B")
    elif case == "unknown-connector":
        args["connector"], expected = "Z", (E.INVALID_REQUEST, "Connector Z does not exist")
    elif case == "too-many":
        args["configs"] = [{}, {}, {}]
        expected = (E.INVALID_REQUEST, "3 task configs for connector A, which has 2")
    elif case == "empty-name":
        args["configs"], expected = [{"": "x"}], (E.INVALID_REQUEST, "TaskConfigs[0]")
    elif case == "duplicate-name":
        req = ConnectGroupWriteTaskConfigsRequest(
            group_id="g", member_id="W1", member_epoch=epoch, connector="A",
            task_configs=(_wtc.TaskConfig(config=(_wtc.ConfigEntry(name="k", value="1"),
                                                  _wtc.ConfigEntry(name="k", value="2"))),))
        before = (len(h.log), h.state.snapshot())
        r = h.apply(h.coordinator.write_task_configs(req, h.now))
        assert r.error_code == E.INVALID_REQUEST and "unique" in r.error_message
        assert (len(h.log), h.state.snapshot()) == before
        return
    elif case == "too-big":
        args["configs"] = [{"k": "x" * 20_000}]
        expected = (E.INVALID_REQUEST, "over its limit of 16,384 bytes")
    elif case == "no-connector":
        args["connector"], expected = "", (E.INVALID_REQUEST, "Connector must be non-empty")
    before = (len(h.log), h.state.snapshot())
    r = h.write_task_configs(**args)
    assert (r.error_code, r.changed) == (expected[0], False), r
    assert expected[1] in r.error_message, r.error_message
    assert (len(h.log), h.state.snapshot()) == before
    # The group is unharmed: the owner's write goes through.
    assert h.write_task_configs("W1", "A", [{"k": "v"}]).changed


def test_task_configs_replay_with_another_incarnation_is_ignored() -> None:
    """A task-configs record of an earlier connector of the same name changes nothing."""
    state = CoordinatorState()
    state.replay(rec.group_metadata("g", 1, 100))
    state.replay(rec.task_configs("g", "A", TaskConfigs(5, ((), ()))))
    from coordinator.group.model import ConnectorSpec
    state.replay(rec.group_connectors("g", 1, [ConnectorSpec("A", 3, (), 7)]))
    assert len(state.groups["g"].configured) == 4
    state.replay(rec.task_configs("g", "A", TaskConfigs(7, ((),))))
    assert len(state.groups["g"].configured) == 2
    state.replay(rec.tombstone(ConnectorTaskConfigsKey(group_id="g", connector="A")))
    assert len(state.groups["g"].configured) == 4
