"""Structured logs of the daemon: the structlog setup shared with the worker (JSON lines by
default, a console renderer on request), written once in :mod:`connect_wire.logs`, the layer
below both (issue 14: it used to live in the worker client, which the daemon then imported).

Context (group, member, partition, connection) is bound per event by the callers; nothing is
logged at info level per steady heartbeat. Group events (joins, fences, epoch bumps, ...) are
logged by the shard once committed (coordinator.runtime.shard, docs/daemon.md "Group events").
"""

from connect_wire.logs import LEVELS, configure, get

__all__ = ["LEVELS", "configure", "get"]
