"""The counter example's pure parts: how the connector spreads its partitions over its tasks,
and what its ``validate`` refuses (its behaviour under failures: tests/test_counter_e2e.py)."""

from __future__ import annotations

import asyncio

import pytest

from worker_client.examples.counter import CounterConnector


def spread(partitions: int, max_tasks: int) -> list[dict[str, str]]:
    connector = CounterConnector()
    asyncio.run(connector.start({"partitions": str(partitions)}))
    return connector.task_configs(max_tasks)


@pytest.mark.parametrize(("partitions", "max_tasks"), [(4, 2), (5, 2), (3, 8), (1, 1), (7, 3)])
def test_every_partition_goes_to_exactly_one_task_and_no_task_is_idle(partitions: int,
                                                                      max_tasks: int) -> None:
    configs = spread(partitions, max_tasks)
    assert len(configs) == min(partitions, max_tasks)
    shares = [[int(p) for p in c["partitions"].split(",")] for c in configs]
    assert all(shares)
    assert sorted(p for share in shares for p in share) == list(range(partitions))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_validate_names_each_bad_key() -> None:
    assert CounterConnector.validate({"sqlite.file": "/tmp/c.db", "partitions": "4",
                                      "interval.ms": "0"}) == {}
    errors = CounterConnector.validate({"partitions": "0", "interval.ms": "fast"})
    assert set(errors) == {"sqlite.file", "partitions", "interval.ms"}, errors
    assert CounterConnector.validate({"sqlite.file": "x", "partitions": "-1"}) == {
        "partitions": ["must be a whole number, at least 1, not '-1'"]}


def test_the_rest_api_calls_it_a_source_connector() -> None:
    """It commits source offsets: Kafka Connect's REST API (status, ``?expand=info``) calls
    such a connector ``source``, from its class's ``type`` (``unknown`` without one)."""
    from worker_client.rest import RestApi

    assert RestApi._type({"connector.class": "worker_client.examples.counter:CounterConnector"}) \
        == "source"
