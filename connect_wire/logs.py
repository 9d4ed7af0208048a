"""Structured logs (structlog; JSON lines or console), shared by the worker and the daemon.

It lives in ``connect_wire``, the layer both build on: the worker client must not depend on the
coordinator, nor the coordinator on the worker client (issue 14). ``worker_client.logs`` and
``coordinator.logs`` re-export it."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


FORMAT = "json"
"""The format :func:`configure` set (for lines written without structlog: :func:`emergency`)."""


def emergency(event: str, level: str = "critical", **fields: object) -> None:
    """Write one log line straight to fd 2 with one non-blocking ``os.write``: for a process
    about to end itself, which must not wait on a logger's lock or a full stderr pipe. Best
    effort: a line that cannot be written at once is dropped. The context bound by
    :func:`configure` is passed in ``fields`` by the caller (another thread does not see it)."""
    import datetime
    import fcntl
    import os

    now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    if FORMAT == "console":
        rest = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                        for k, v in sorted(fields.items()))
        line = f"{now[:19].replace('T', ' ')} [{level:<9}] {event} {rest}\n".encode()
    else:
        line = orjson.dumps({**fields, "event": event, "level": level, "timestamp": now}) + b"\n"
    try:
        flags = fcntl.fcntl(2, fcntl.F_GETFL)
        fcntl.fcntl(2, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        os.write(2, line)
    except Exception:  # noqa: BLE001 - best effort
        pass


def configure(format: str = "json", level: str = "info", **context: str) -> None:
    global FORMAT
    FORMAT = format
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if format == "console":
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        factory: structlog.types.WrappedLogger = structlog.PrintLoggerFactory(sys.stderr)
    else:
        processors.append(structlog.processors.JSONRenderer(serializer=orjson.dumps))
        factory = structlog.BytesLoggerFactory(sys.stderr.buffer)
    structlog.configure(processors=processors,
                        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
                        logger_factory=factory, cache_logger_on_first_use=True)
    structlog.contextvars.bind_contextvars(**context)


def get(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
