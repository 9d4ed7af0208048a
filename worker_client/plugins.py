"""Connector and task plugins: what a worker runs.

A connector's config names its plugin: ``connector.class`` is ``module:Class`` (or the name of
an entry point in the ``connect_coordinator.plugins`` group). Its tasks use ``task.class`` when
given, else the connector class's ``task_class`` attribute, else the connector class itself.

A plugin class is instantiated once per connector or task instance and offers::

    async def start(self, config: dict[str, str | None]) -> None   # required
    async def stop(self) -> None                                   # required
    async def run(self) -> None                                    # optional: the work itself

``start`` gets the connector's config plus ``connector.name``, ``task.id`` (tasks only) and
``worker.id``. If ``run`` exists the worker runs it as a task; when it raises, the instance is
reported as failed and restarted with backoff (stop, then start again) while it stays assigned.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

ENTRY_POINT_GROUP = "connect_coordinator.plugins"


class PluginError(Exception):
    """A plugin class cannot be found or used."""


@runtime_checkable
class Plugin(Protocol):
    async def start(self, config: dict[str, str | None]) -> None: ...

    async def stop(self) -> None: ...


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


def connector_class(config: dict[str, str | None]) -> type:
    spec = config.get("connector.class")
    if not spec:
        raise PluginError("the connector has no 'connector.class' in its config")
    return load_class(spec)


def task_class(config: dict[str, str | None]) -> type:
    spec = config.get("task.class")
    if spec:
        return load_class(spec)
    cls = connector_class(config)
    task_cls = getattr(cls, "task_class", None)
    if task_cls is None:
        return cls
    if isinstance(task_cls, str):
        return load_class(task_cls)
    return task_cls  # type: ignore[no-any-return]
