"""Finding a plugin class and running its config validator: shared by the worker, which runs
plugins, and the admin CLI, which validates a connector's config before writing it. The daemon
never imports plugins.

``connector.class`` is ``module:Class`` (``module.Class`` also works) or the name of an entry
point in the ``connect_coordinator.plugins`` group. A connector class may define
``validate(config)`` as a classmethod or staticmethod (plain or ``async``) returning
``{key: [messages]}``, empty when the config is valid.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

ENTRY_POINT_GROUP = "connect_coordinator.plugins"


class PluginError(Exception):
    """A plugin class cannot be found or used."""


class ValidatorFailed(PluginError):
    """A connector class's ``validate`` raised, or returned something other than
    ``{key: [messages]}``: the config could not be checked."""


class InvalidConfig(PluginError):
    """A connector class's ``validate`` found errors: ``errors`` is ``{key: [messages]}``."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("invalid config: " + "; ".join(error_lines(errors)))


def error_lines(errors: Mapping[str, list[str]]) -> list[str]:
    """One ``key: message`` per message, keys sorted."""
    return [f"{key}: {message}" for key in sorted(errors) for message in errors[key]]


def load_class(spec: str) -> type:
    """``module:Class`` (``module.Class`` also works) or an entry point name."""
    if not spec:
        raise PluginError("empty plugin class name")
    if ":" in spec or "." in spec:
        module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PluginError(f"cannot import {module_name!r} for plugin {spec!r}: {exc}") from None
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise PluginError(f"{module_name!r} has no {attr!r} (plugin {spec!r})")
    else:
        matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if not matches:
            raise PluginError(f"no plugin named {spec!r} (entry point group {ENTRY_POINT_GROUP!r})")
        obj = matches[0].load()
    if not isinstance(obj, type):
        raise PluginError(f"plugin {spec!r} is not a class")
    for method in ("start", "stop"):
        if not callable(getattr(obj, method, None)):
            raise PluginError(f"plugin {spec!r} has no {method}() method")
    return obj


async def validate(cls: type, config: Mapping[str, str | None]) -> dict[str, list[str]]:
    """Run ``cls.validate(config)`` (awaited when it is a coroutine function) and return its
    errors, keys without messages left out: ``{}`` when valid or when the class has no
    ``validate``. Raises :class:`ValidatorFailed` when it raises or answers something else than
    ``{str: [str, ...]}``, or is a plain (instance) method."""
    name = f"{cls.__module__}.{cls.__qualname__}.validate"
    try:
        static = inspect.getattr_static(cls, "validate")
    except AttributeError:
        return {}
    if inspect.isfunction(static):
        raise ValidatorFailed(f"{name} must be a classmethod or staticmethod")
    try:
        result = cls.validate(dict(config))  # type: ignore[attr-defined]
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        raise ValidatorFailed(f"{name} raised {exc!r}") from exc
    if not isinstance(result, Mapping):
        raise ValidatorFailed(f"{name} returned {type(result).__name__}, not a dict of "
                              "{key: [messages]}")
    errors: dict[str, list[str]] = {}
    for key, messages in result.items():
        if not isinstance(key, str) or not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, str) for m in messages):
            raise ValidatorFailed(f"{name} returned {{{key!r}: {messages!r}}}: each entry must be "
                                  "a config key and a list of messages (str)")
        if messages:
            errors[key] = list(messages)
    return errors


def validate_sync(cls: type, config: Mapping[str, str | None]) -> dict[str, list[str]]:
    """:func:`validate` outside an event loop (the admin CLI)."""
    return asyncio.run(validate(cls, config))
