"""coordinator.cluster.placement: balance, minimal movement, determinism, live owners only.

The minimum number of moves is computed here independently, by trying every choice of which
nodes get the extra partition (small clusters), not from the module's own reasoning.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.cluster.placement import moves, node_order, place

NODES = [str(i) for i in range(1, 8)] + ["a", "node-b"]

node_sets = st.sets(st.sampled_from(NODES), min_size=1, max_size=6)
counts = st.integers(min_value=0, max_value=40)


@st.composite
def situations(draw: st.DrawFn) -> tuple[set[str], int, dict[int, str]]:
    """Live nodes, a partition count, and any current owners: live or dead nodes, some
    partitions unowned, some out of range."""
    live = draw(node_sets)
    partitions = draw(counts)
    owners = st.sampled_from(sorted(live | set(NODES[:3]) | {"dead"}))
    current = draw(st.dictionaries(st.integers(min_value=-2, max_value=partitions + 2), owners))
    return live, partitions, current


def min_moves(live: set[str], partitions: int, current: dict[int, str]) -> int:
    """Fewest partitions whose owner must change to reach a balanced placement (brute force
    over which nodes get base + 1)."""
    base, extra = divmod(partitions, len(live))
    held = {n: sum(1 for p, o in current.items() if o == n and 0 <= p < partitions) for n in live}
    best = max(sum(min(held[n], base + (n in plus)) for n in live)
               for plus in map(set, itertools.combinations(sorted(live), extra)))
    return partitions - best


def check_basic(live: set[str], partitions: int, target: dict[int, str]) -> None:
    assert sorted(target) == list(range(partitions))  # every partition owned, by ...
    assert set(target.values()) <= live  # ... a live node
    loads = [sum(1 for o in target.values() if o == n) for n in live]
    base = partitions // len(live)
    assert all(base <= x <= base + 1 for x in loads), loads
    assert sum(1 for x in loads if x == base + 1) == partitions % len(live)


@settings(max_examples=400, deadline=None)
@given(situations())
def test_balanced_minimal_and_live(s: tuple[set[str], int, dict[int, str]]) -> None:
    live, partitions, current = s
    target = place(live, partitions, current)
    check_basic(live, partitions, target)
    valid = {p: o for p, o in current.items() if 0 <= p < partitions}
    assert len(moves(valid, target)) == min_moves(live, partitions, current)


@settings(max_examples=300, deadline=None)
@given(situations(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(s: tuple[set[str], int, dict[int, str]],
                                                rnd: random.Random) -> None:
    live, partitions, current = s
    nodes = sorted(live)
    rnd.shuffle(nodes)
    items = list(current.items())
    rnd.shuffle(items)
    assert place(nodes, partitions, dict(items)) == place(sorted(live), partitions, current)
    assert place(nodes + nodes, partitions, dict(items)) == place(live, partitions, current)


@settings(max_examples=300, deadline=None)
@given(node_sets, st.sampled_from(NODES), counts)
def test_a_joining_node_takes_only_its_share(live: set[str], joiner: str, partitions: int) -> None:
    if joiner in live:
        return
    before = place(live, partitions)
    after = place(live | {joiner}, partitions, before)
    moved = moves(before, after)
    assert all(new == joiner for _, new in moved.values())  # nothing moves between old nodes
    assert len(moved) == sum(1 for o in after.values() if o == joiner)
    assert len(moved) in (partitions // (len(live) + 1), partitions // (len(live) + 1) + 1)


@settings(max_examples=300, deadline=None)
@given(node_sets, counts, st.data())
def test_a_leaving_node_moves_only_its_partitions(live: set[str], partitions: int,
                                                  data: st.DataObject) -> None:
    if len(live) < 2:
        return
    leaver = data.draw(st.sampled_from(sorted(live)))
    before = place(live, partitions)
    after = place(live - {leaver}, partitions, before)
    moved = moves(before, after)
    assert {p for p, (old, _) in moved.items()} == {p for p, o in before.items() if o == leaver}
    check_basic(live - {leaver}, partitions, after)


def test_examples() -> None:
    assert place([], 8) == {}
    assert place(["1"], 0) == {}
    assert place(["2", "10", "1"], 8) == {0: "1", 1: "1", 2: "1", 3: "2", 4: "2", 5: "2", 6: "10", 7: "10"}
    assert sorted(["10", "2", "b", "a"], key=node_order) == ["2", "10", "a", "b"]
    # Node 3 joins three nodes holding 8 partitions: it takes 2, one from each node over 2.
    before = {0: "1", 1: "1", 2: "1", 3: "2", 4: "2", 5: "2", 6: "10", 7: "10"}
    after = place(["1", "2", "10", "3"], 8, before)
    assert moves(before, after) == {2: ("1", "3"), 5: ("2", "3")}
    # Stable: placing again from the result moves nothing.
    assert place(["1", "2", "10", "3"], 8, after) == after
