"""The coordinator runtime: durable partition logs, record serialisation and shard plumbing.

* :mod:`coordinator.runtime.serde` turns a :class:`coordinator.group.records.Record` into the
  key and value bytes stored in a log, and back.
* :mod:`coordinator.runtime.log` is the durable, append-only, compacted log of one partition
  (plain synchronous file I/O; the runtime calls it from its shard task or a worker thread).
"""
