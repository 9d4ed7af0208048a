"""Connector and task plugins: what a worker runs.

A connector's config names its plugin: ``connector.class`` is ``module:Class`` (or the name of
an entry point in the ``connect_coordinator.plugins`` group). Its tasks use ``task.class`` when
given, else the connector class's ``task_class`` attribute, else the connector class itself.

A plugin class is instantiated once per connector or task instance and offers::

    async def start(self, config: dict[str, str | None]) -> None   # required
    async def stop(self) -> None                                   # required
    async def run(self) -> None                                    # optional: the work itself

``start`` gets the connector's config (for a task of a connector whose class defines
``task_configs(max_tasks)``, overlaid with that task's own config) plus ``connector.name``,
``task.id`` (tasks only) and ``worker.id``; before it, the worker sets the object's ``context``
(:mod:`worker_client.context`: member epoch, fencing token, offsets, task reconfiguration).

If ``run`` exists the worker runs it as a task; when it raises, the instance is reported as
failed and restarted with backoff (stop, then start again) while it stays assigned; a ``run``
that returns counts as a failure too.

A connector class may define ``validate(config)`` (classmethod or staticmethod, plain or async)
returning ``{key: [messages]}``: the worker runs it before starting any of the connector's
instances, and the admin CLI before writing the connector (:mod:`connect_wire.plugins`).
The author's guide is docs/plugins.md.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from connect_wire.plugins import (
    ENTRY_POINT_GROUP,
    InvalidConfig,
    PluginError,
    ValidatorFailed,
    error_lines,
    load_class,
    validate,
)

__all__ = ["ENTRY_POINT_GROUP", "InvalidConfig", "Plugin", "PluginError", "ValidatorFailed",
           "connector_class", "error_lines", "load_class", "task_class", "validate"]


@runtime_checkable
class Plugin(Protocol):
    async def start(self, config: dict[str, str | None]) -> None: ...

    async def stop(self) -> None: ...


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
