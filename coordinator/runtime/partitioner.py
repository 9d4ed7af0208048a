"""Which log partition (shard) a group lives in: Kafka's own ``partitionFor`` rule.

``abs(String.hashCode(groupId)) % partitions`` with Java's ``String.hashCode`` (31-based, over
UTF-16 code units, 32-bit overflow) and Kafka's ``Utils.abs`` (``n & 0x7fffffff``), so Kafka
tooling computes the same partition for a group.
"""

from __future__ import annotations

from functools import lru_cache


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` of ``text`` as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def partition_for(group_id: str, partitions: int) -> int:
    """The partition of ``group_id`` among ``partitions``."""
    if partitions <= 0:
        raise ValueError("partitions must be > 0")
    return (java_string_hash(group_id) & 0x7FFFFFFF) % partitions
