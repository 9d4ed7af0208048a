"""Structured logs (structlog; JSON lines or console), shared by the worker and the daemon.

It lives in ``connect_wire``, the layer both build on: the worker client must not depend on the
coordinator, nor the coordinator on the worker client. ``worker_client.logs`` and
``coordinator.logs`` re-export it."""

from __future__ import annotations

import logging
import sys
import threading

import orjson
import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


FORMAT = "json"
"""The format :func:`configure` set (for lines written without structlog: :func:`emergency`)."""
_configured = False


def exit_line(text: str) -> None:
    """A process's last word, why it ends (refused credentials, a configuration error, a port
    in use): the text as is under the console format (or before :func:`configure`), one JSON
    line (``event`` the text, level error) under the JSON format, so that a log pipeline reading
    the process's stderr parses every line of it."""
    if _configured and FORMAT == "json":
        structlog.get_logger("exit").error(text)
    else:
        print(text, file=sys.stderr, flush=True)


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
    global FORMAT, _configured
    FORMAT = format
    _configured = True
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    processors = [*shared, structlog.processors.format_exc_info]
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
    _route_stdlib(format, level, shared)


class _StdlibHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root logger's one handler (:func:`configure` replaces it when called again)."""


def _route_stdlib(format: str, level: str, shared: list[structlog.types.Processor]) -> None:
    """Lines of the standard library's ``logging`` (libraries such as etcd3aio and grpc, and
    the modules that log through it) go through the same processors and renderer as
    structlog's own, so every line is JSON under the JSON format (the lease's "keep-alive
    failed" lines were plain text). The logger's name is kept as ``logger``."""
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer(colors=False) if format == "console"
        else structlog.processors.JSONRenderer(
            serializer=lambda obj, **_: orjson.dumps(obj, default=repr).decode()))
    handler = _StdlibHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer]))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    # Python's own plain-text writers: warnings (``path:line: UserWarning: ...``) go to the
    # "py.warnings" logger, and an exception that ends a thread (a plugin's, a library's) or
    # that nothing can raise (``__del__``, a callback) becomes one line with its traceback.
    logging.captureWarnings(True)
    threading.excepthook = _thread_exception
    sys.unraisablehook = _unraisable


def _thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # as Python's own hook: a thread's sys.exit() is quiet
        return
    thread = args.thread.name if args.thread is not None else None
    structlog.get_logger("threading").error(
        "uncaught exception in a thread", thread=thread,
        exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback))


def _unraisable(args: object) -> None:
    exc_type = getattr(args, "exc_type", None)
    value = getattr(args, "exc_value", None)
    info = (exc_type, value or exc_type(), getattr(args, "exc_traceback", None)) \
        if exc_type is not None else None
    structlog.get_logger("unraisable").error(
        "exception ignored", message=getattr(args, "err_msg", None) or "Exception ignored in",
        object=repr(getattr(args, "object", None))[:200], exc_info=info)


def get(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
