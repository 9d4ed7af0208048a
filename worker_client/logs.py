"""The worker's structured logs: the setup shared with the daemon, :mod:`connect_wire.logs`
(the layer below both; the worker client does not depend on the coordinator, nor the
coordinator on the worker client)."""

from connect_wire.logs import LEVELS, configure, emergency, exit_line, get

__all__ = ["LEVELS", "configure", "emergency", "exit_line", "get"]
