"""Structured logs (structlog; JSON lines or console), shared by the worker and the daemon.

No server code here: the worker client must not depend on the coordinator."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def configure(format: str = "json", level: str = "info", **context: str) -> None:
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
