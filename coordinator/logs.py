"""Structured logs of the daemon: the same structlog setup as the worker's (JSON lines by
default, a console renderer on request), written once in :mod:`worker_client.logs`.

Context (group, member, partition, connection) is bound per event by the callers; nothing is
logged at info level per heartbeat.
"""

from worker_client.logs import LEVELS, configure, get

__all__ = ["LEVELS", "configure", "get"]
