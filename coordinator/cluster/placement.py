"""Which live node should own each partition: balanced, sticky, deterministic (sans-IO).

    target = place(live_nodes, partition_count, current_owners)

* **Balanced**: every live node gets ``P // N`` or ``P // N + 1`` partitions (exactly
  ``P % N`` nodes get the extra one).
* **Sticky, minimal movement**: as many partitions as possible stay with their current owner.
  Given balance, the most that can stay is ``sum(min(held_i, P // N))`` plus one per node
  chosen for an extra partition that holds more than ``P // N`` (up to ``P % N`` of them), and
  that is what stays. So a node that joins a balanced cluster takes only its share (from the
  nodes that had more than their new quota), and when a node leaves only its partitions move.
* **Deterministic**: the answer depends only on the *set* of live nodes, the partition count
  and the current owners — not on the order they are given in, the host or the time — so every
  node computing it from the same etcd view gets the same target without talking to the others.
  Ties are broken by node id (:func:`node_order`) and partition number.

Owners that are not live, and partitions outside ``range(P)``, in ``current`` are ignored: their
partitions are free. With no live node nothing is owned (an empty answer).

Agreement is not needed for safety: ownership itself is taken in etcd (``create_revision == 0``
on the owner key, :mod:`coordinator.runtime.etcd_store`), so two nodes that briefly compute
different targets from different etcd revisions delay a handover, never share a partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

NodeId = str


def node_order(node: NodeId) -> tuple[int, int, str]:
    """Sort key: numeric ids by value (``2`` before ``10``), then the others by text."""
    return (0, int(node), node) if node.isdigit() else (1, 0, node)


def place(nodes: Iterable[NodeId], partitions: int,
          current: Mapping[int, NodeId] | None = None) -> dict[int, NodeId]:
    """The target owner of every partition in ``range(partitions)`` (see the module doc)."""
    if partitions < 0:
        raise ValueError(f"partition count {partitions} < 0")
    live = sorted(set(nodes), key=node_order)
    if not live:
        return {}
    held: dict[NodeId, list[int]] = {n: [] for n in live}
    for p, owner in sorted((current or {}).items()):
        if 0 <= p < partitions and owner in held:
            held[owner].append(p)
    base, extra = divmod(partitions, len(live))
    # The extra partitions go first to nodes that already hold more than the base (each such
    # choice keeps one more partition in place), the most-loaded first, then by node order.
    by_claim = sorted(live, key=lambda n: (-min(len(held[n]), base + 1), node_order(n)))
    quota = {n: base + (1 if i < extra else 0) for i, n in enumerate(by_claim)}
    target: dict[int, NodeId] = {}
    for n in live:
        for p in held[n][:quota[n]]:  # a node over its quota keeps its lowest partitions
            target[p] = n
    free = iter(p for p in range(partitions) if p not in target)
    for n in live:
        for _ in range(quota[n] - sum(1 for _ in held[n][:quota[n]])):
            target[next(free)] = n
    return dict(sorted(target.items()))


def moves(before: Mapping[int, NodeId],
          after: Mapping[int, NodeId]) -> dict[int, tuple[NodeId | None, NodeId]]:
    """Partitions whose owner changes: partition -> (old owner or None, new owner)."""
    return {p: (before.get(p), n) for p, n in after.items() if before.get(p) != n}
