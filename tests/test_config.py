"""The daemon's configuration: precedence, validation messages, and the generated reference."""

from pathlib import Path

import pytest

from coordinator import config
from coordinator.group.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_defaults() -> None:
    c = config.load(environ={})
    assert c.listen == ("127.0.0.1", 9092)
    assert c.metrics_listen == ("127.0.0.1", 9464)
    assert c["partitions"] == 8
    assert str(c.fsync) == "always"


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('partitions = 3\n[group.connect]\n"session.timeout.ms" = 20000\n[log]\nfsync = "never"\n')
    c = config.load(f, environ={})
    assert (c["partitions"], c["group.connect.session.timeout.ms"], str(c.fsync)) == (3, 20000, "never")
    c = config.load(f, environ={"CONNECT_COORDINATOR_PARTITIONS": "5"})
    assert c["partitions"] == 5
    c = config.load(f, {"partitions": 7}, environ={"CONNECT_COORDINATOR_PARTITIONS": "5"})
    assert c["partitions"] == 7


@pytest.mark.parametrize(
    ("overrides", "environ", "message"),
    [
        ({"partitions": 0}, {}, "partitions=0: must be > 0"),
        ({"partitions": "x"}, {}, "partitions (from the command line) must be int"),
        ({"listeners": "nohost"}, {}, "is not HOST:PORT"),
        ({"log.fsync": "sometimes"}, {}, "log.fsync"),
        ({}, {"CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "20000"},
         "must be smaller than group.connect.session.timeout.ms"),
        ({}, {"CONNECT_COORDINATOR_NO_SUCH_THING": "1"}, "unknown environment setting"),
        ({"no.such": 1}, {}, "unknown setting 'no.such'"),
        # (every heartbeat answer carries the interval as an INT32: beyond it, none could be
        # written, and a group config up to the maximum would be allowed)
        ({"group.connect.max.heartbeat.interval.ms": 2**31}, {},
         "group.connect.max.heartbeat.interval.ms=2147483648: must be within [1, 2147483647]"),
        ({"group.connect.max.session.timeout.ms": 2**31}, {}, "must be within [1, 2147483647]"),
    ],
)
def test_invalid_values_name_the_setting(overrides: dict, environ: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        config.load(None, overrides, environ)
    assert message in str(info.value)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "missing.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("partitions = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(bad, environ={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("colour = 'blue'\n")
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        config.load(unknown, environ={})


def test_reference_doc_is_current() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert config.reference_markdown() in doc, "stale: python -m coordinator.config"
