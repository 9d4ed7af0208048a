"""connect_wire.verbs: Connect's verbs as reserved connector config keys."""

from __future__ import annotations

from connect_wire import verbs
from connect_wire.items import Item


def test_reserved_keys_state_and_identity() -> None:
    base = {"connector.class": "m:C", "topic": "t"}
    assert verbs.target_state(base) == verbs.RUNNING
    assert verbs.target_state({**base, verbs.TARGET_STATE: "paused"}) == verbs.PAUSED
    assert verbs.target_state({**base, verbs.TARGET_STATE: "bogus"}) == verbs.RUNNING
    full = {**base, verbs.TARGET_STATE: "STOPPED", verbs.RESTART_GENERATION: "2",
            verbs.restart_task_key(1): "3"}
    assert verbs.plugin_config(full) == base
    assert all(verbs.is_reserved(k) for k in set(full) - set(base))
    conn, t0, t1 = Item.parse("c"), Item("c", 0), Item("c", 1)
    bumped_task = {**full, verbs.restart_task_key(1): "4"}
    assert verbs.identity(t1, bumped_task) != verbs.identity(t1, full)
    assert verbs.identity(t0, bumped_task) == verbs.identity(t0, full)
    assert verbs.identity(conn, bumped_task) == verbs.identity(conn, full)
    bumped_all = {**full, verbs.RESTART_GENERATION: "3"}
    assert all(verbs.identity(i, bumped_all) != verbs.identity(i, full) for i in (conn, t0, t1))
    paused = {**full, verbs.TARGET_STATE: "PAUSED"}  # the state alone restarts nothing
    assert all(verbs.identity(i, paused) == verbs.identity(i, full) for i in (conn, t0, t1))
    assert verbs.counter({verbs.RESTART_GENERATION: "x"}, verbs.RESTART_GENERATION) == 0


def test_the_connector_restart_counter_restarts_only_the_connector_instance() -> None:
    """Kafka Connect's plain ``POST /connectors/{c}/restart`` restarts the connector instance
    alone: its own counter, reserved (never a plugin's key), changes only its identity."""
    full = {"connector.class": "m:C", verbs.RESTART_GENERATION: "2"}
    bumped = {**full, verbs.RESTART_CONNECTOR: "1"}
    assert verbs.is_reserved(verbs.RESTART_CONNECTOR)
    assert verbs.plugin_config(bumped) == {"connector.class": "m:C"}
    conn, t0 = Item.parse("c"), Item("c", 0)
    assert verbs.identity(conn, bumped) != verbs.identity(conn, full)
    assert verbs.identity(t0, bumped) == verbs.identity(t0, full)
