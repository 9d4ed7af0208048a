"""Connect's verbs (restart, pause, resume, stop) as reserved keys of a connector's config.

The verbs are written with ConnectGroupAlterConnectors like any config change (so they are
durable: stored, replayed after a coordinator restart, no wire change) and read by the workers
from ConnectGroupDescribe. Reserved keys (never passed to a plugin; ``connectors create/update
--config`` refuses them):

``connect.target.state``
    ``RUNNING`` (also when absent), ``PAUSED`` or ``STOPPED`` — Kafka Connect's target states.
    A connector that is not RUNNING has none of its instances running on any worker; its items
    stay assigned (as Kafka Connect's paused tasks keep their assignment).
``connect.restart.generation``
    A decimal counter (absent = 0). Each bump restarts the connector and all its tasks once.
``connect.restart.connector``
    A decimal counter (absent = 0). Each bump restarts only the connector instance once (Kafka
    Connect's plain ``POST /connectors/{c}/restart``).
``connect.restart.task.N``
    A decimal counter for task N (absent = 0). Each bump restarts only task N once.

A worker restarts an instance when the part of the config it depends on changes: the plugin's
config (the config without these keys: the connector and all its tasks), the restart generation
(all of them), the connector's or the task's own counter (that instance), or the task's own
config written by its connector instance (that task).
"""

from __future__ import annotations

from collections.abc import Mapping

from connect_wire.items import Item

TARGET_STATE = "connect.target.state"
RESTART_GENERATION = "connect.restart.generation"
RESTART_CONNECTOR = "connect.restart.connector"
RESTART_TASK_PREFIX = "connect.restart.task."
RUNNING, PAUSED, STOPPED = "RUNNING", "PAUSED", "STOPPED"
STATES = (RUNNING, PAUSED, STOPPED)


def restart_task_key(task: int) -> str:
    return f"{RESTART_TASK_PREFIX}{task}"


def is_reserved(key: str) -> bool:
    return key in (TARGET_STATE, RESTART_GENERATION, RESTART_CONNECTOR) \
        or key.startswith(RESTART_TASK_PREFIX)


def plugin_config(config: Mapping[str, str | None]) -> dict[str, str | None]:
    """What a plugin sees of a connector's config: without the reserved keys."""
    return {k: v for k, v in config.items() if not is_reserved(k)}


def target_state(config: Mapping[str, str | None]) -> str:
    """RUNNING, PAUSED or STOPPED; an absent or unknown value counts as RUNNING."""
    value = (config.get(TARGET_STATE) or RUNNING).strip().upper()
    return value if value in STATES else RUNNING


def counter(config: Mapping[str, str | None], key: str) -> int:
    try:
        return int(config.get(key) or 0)
    except ValueError:
        return 0


def identity(item: Item, config: Mapping[str, str | None],
             task_config: Mapping[str, str | None] | None = None) -> tuple[object, ...]:
    """What an instance of ``item`` was started from: when it changes, the instance restarts
    (the plugin's config, the restart generation, its own restart counter, and the
    task's own config when its connector instance wrote task configs)."""
    own = counter(config, RESTART_CONNECTOR if item.is_connector else restart_task_key(item.task))
    return (sorted(plugin_config(config).items(), key=lambda kv: kv[0]),
            counter(config, RESTART_GENERATION), own,
            None if task_config is None else sorted(task_config.items(), key=lambda kv: kv[0]))
