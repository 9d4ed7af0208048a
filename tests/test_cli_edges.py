"""The command lines' edges a new user hits ("Clean edges"), as real processes:
versions, a sub-command's own usage, bad values refused by the CLI, busy ports named in one
line, a failed first start that leaves the partition count open, the simulation's Spark
commands without Spark, and a worker whose bootstrap cannot be reached."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from connect_wire.cliutil import version
from tests.daemon_fixture import ROOT, DaemonPool, daemon_env, run_serve, stderr_events


def _run(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, env=daemon_env(), cwd=ROOT, timeout=timeout_s, check=False)


def worker(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return _run("-m", "worker_client.cli", *args, timeout_s=timeout_s)


def coordinator(*args: str) -> subprocess.CompletedProcess[str]:
    return _run("-m", "coordinator.cli", *args)


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_version_of_both_command_lines() -> None:
    assert version() not in ("", "unknown")  # (the test environment installs the package)
    for module, prog in (("worker_client.cli", "connect-worker"), ("coordinator.cli", "connect-coordinator")):
        r = _run("-m", module, "--version")
        assert (r.returncode, r.stdout.strip()) == (0, f"{prog} {version()}"), r


def test_top_level_help_lists_every_connectors_action() -> None:
    from coordinator.cli import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    csub = next(a for a in sub.choices["connectors"]._actions
                if isinstance(a, argparse._SubParsersAction))
    actions = list(csub.choices)
    assert {"create", "update", "delete", "list", "status", "describe", "restart", "pause",
            "resume", "stop", "offsets"} <= set(actions)
    r = coordinator("--help")
    assert r.returncode == 0, r
    # (argparse wraps the help text: compare it unwrapped)
    entry = " ".join(r.stdout.split("    connectors", 1)[1].split("    groups", 1)[0].split())
    assert entry == "connectors: " + ", ".join(actions), r.stdout


@pytest.mark.parametrize(("args", "usage"), [
    (("coordinator.cli", "serve", "--bogus"), "usage: connect-coordinator serve "),
    (("coordinator.cli", "connectors", "create", "--group", "g", "c", "--tasks", "1", "--bogus"),
     "usage: connect-coordinator connectors create "),
    (("coordinator.cli", "groups", "list", "--bogus"), "usage: connect-coordinator groups list "),
    (("worker_client.cli", "run", "--bootstrap", "h:1", "--group", "g", "--bogus"),
     "usage: connect-worker run "),
])
def test_an_unknown_option_prints_the_sub_commands_usage(args: tuple[str, ...], usage: str) -> None:
    r = _run("-m", *args)
    assert r.returncode == 2, r
    assert r.stderr.startswith(usage), r.stderr  # (was the top-level usage: COMMAND ...)
    assert r.stderr.rstrip().endswith("error: unrecognized arguments: --bogus"), r.stderr


@pytest.mark.parametrize("action", ["create", "update"])
def test_a_negative_task_count_is_refused_by_the_cli(action: str) -> None:
    # No coordinator at that address: the CLI refuses it before connecting (exit 2, not 1).
    r = coordinator("connectors", action, "--bootstrap", "127.0.0.1:1", "--group", "g", "c",
                    "--tasks", "-1")
    assert r.returncode == 2, r
    assert "argument --tasks: -1: a connector has 0 or more tasks" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_worker_busy_metrics_port_is_one_line_naming_it() -> None:
    with busy_port() as port:
        r = worker("run", "--bootstrap", "127.0.0.1:1", "--group", "g",
                   "--metrics-listen", f"127.0.0.1:{port}", "--log-level", "warning")
    assert r.returncode == 2, r
    assert stderr_events(r.stderr) == [
        f"connect-worker: cannot serve metrics on 127.0.0.1:{port} (--metrics-listen): "
        "Address already in use"], r.stderr


@pytest.mark.parametrize(("flags", "says"), [
    (("--task-shutdown-graceful-timeout-ms", "99"), "must be 100-"),
    (("--task-shutdown-graceful-timeout-ms", "0"), "not a positive number"),
    (("--task-shutdown-graceful-timeout-ms", "500", "--rebalance-timeout-ms", "3000"), "disagree"),
])
def test_worker_refuses_a_bad_stop_budget(flags: tuple[str, ...], says: str) -> None:
    r = worker("run", "--bootstrap", "127.0.0.1:1", "--group", "g", *flags)
    assert r.returncode == 2 and says in r.stderr, r


def test_a_failed_first_start_does_not_fix_the_partition_count(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with busy_port() as port:
        r = run_serve(data, ["--metrics-listen", f"127.0.0.1:{port}"])  # (serve_command's is overridden)
        assert r.returncode == 1, r
        assert f"cannot start: cannot serve metrics on 127.0.0.1:{port} (metrics.listener): " \
               "Address already in use" in r.stderr, r.stderr
        assert not (data / "partitions").exists()
        r = run_serve(data, ["--listen", f"127.0.0.1:{port}", "--partitions", "4"])
        assert r.returncode == 1, r
        assert f"cannot start: cannot listen on 127.0.0.1:{port} (listener PLAINTEXT): " \
               "Address already in use" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert not (data / "partitions").exists()
    # The first start that does start decides: 3 partitions, then fixed.
    with DaemonPool(tmp_path) as pool:
        d = pool.start(data, extra_args=["--partitions", "3"])
        assert d.partitions == 3 and (data / "partitions").read_text() == "3\n"
        d.stop()
    r = run_serve(data, ["--partitions", "5"])
    assert r.returncode == 2 and "was created with 3 partitions" in r.stderr, r


@pytest.mark.parametrize("command", ["sweep", "report", "analyze"])
def test_simulation_spark_commands_without_spark_say_what_to_install(command: str, tmp_path: Path) -> None:
    (tmp_path / "partition-0").mkdir()  # (analyze checks its data dir first)
    argv = {"sweep": ["--seeds", "1", "--out", str(tmp_path / "o")],
            "report": ["--in", str(tmp_path), "--out", str(tmp_path / "r")],
            "analyze": ["--data-dir", str(tmp_path)]}[command]
    # An interpreter where PySpark and pandas cannot be imported (as after the README's install).
    code = ("import sys; sys.modules['pyspark'] = None; sys.modules['pandas'] = None; "
            "from simulation.__main__ import main; sys.exit(main(sys.argv[1:]))")
    r = _run("-c", code, command, *argv, timeout_s=120)
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().startswith(f"python -m simulation {command} needs "), r.stderr
    assert "pip install 'connect-coordinator[spark]'" in r.stderr, r.stderr


def test_worker_with_an_unreachable_bootstrap_warns_naming_it_and_backs_off(tmp_path: Path) -> None:
    with busy_port() as port:  # (closed right away: nobody listens there any more)
        pass
    log = tmp_path / "worker.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap",
             f"127.0.0.1:{port},localhost:{port}", "--group", "g"],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=daemon_env(), cwd=ROOT)
    try:
        time.sleep(8.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
    assert code == 0, log.read_text()
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    warnings = [e for e in events if e["level"] == "warning"]
    assert [e["event"] for e in warnings] == ["cannot reach the coordinator; retrying"], events
    w = warnings[0]
    assert w["bootstrap"] == f"127.0.0.1:{port},localhost:{port}" and w["attempts"] == 1
    assert f"no coordinator found via 127.0.0.1:{port}, localhost:{port}" in w["error"] \
        or f"no coordinator found via localhost:{port}, 127.0.0.1:{port}" in w["error"], w
    # Nothing at info per attempt (it was 2-3 info lines a second, forever).
    assert not [e for e in events if e["event"] == "heartbeat failed; retrying"], events


def test_worker_attempts_back_off_when_unreachable(tmp_path: Path) -> None:
    with busy_port() as port:
        pass
    log = tmp_path / "worker.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", f"127.0.0.1:{port}",
             "--group", "g", "--log-level", "debug"],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=daemon_env(), cwd=ROOT)
    try:
        time.sleep(8.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    attempts = [e for e in events if e["event"] in ("cannot reach the coordinator; retrying",
                                                     "heartbeat failed; retrying")]
    delays = [e["retry_in_ms"] for e in attempts]
    # Backing off: 50-100 ms doubling to 2.5-5 s, so at most 8 attempts in 8 s (it was 20-25).
    assert 3 <= len(attempts) <= 8, delays
    assert [e["attempts"] for e in attempts] == list(range(1, len(attempts) + 1))
    for n, d in enumerate(delays):
        ceiling = min(5000, 100 * 2**n)
        assert ceiling / 2 <= d <= ceiling, (n, delays)


@pytest.mark.parametrize(("args", "says"), [
    (("create", "--tasks", "1"), "needs --config connector.class=module:Class"),
    (("create", "--tasks", "1", "--validate-only", "--config", "topic=t"), "needs --config connector.class="),
    (("create", "--tasks", "1", "--config", "connector.class="), "connector.class must not be empty"),
    (("update", "--config", "connector.class= "), "connector.class must not be empty"),
])
def test_a_connector_without_connector_class_is_refused_by_the_cli(args: tuple[str, ...], says: str) -> None:
    # As Kafka Connect's REST API (400): a usage error, before connecting (nothing listens there).
    r = coordinator("connectors", args[0], "--bootstrap", "127.0.0.1:1", "--group", "g", "c", *args[1:])
    assert r.returncode == 2, r
    assert r.stderr.startswith(f"connect-coordinator connectors {args[0]}: error: "), r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    with DaemonPool(tmp_path) as p:
        yield p


def test_timeout_bounds_the_whole_command_not_each_address(pool: DaemonPool, tmp_path: Path) -> None:
    """``--timeout`` is one deadline for the command: discovery, every connection and request.
    It bounded each connect and read, so a bootstrap list of frozen nodes took the timeout once
    per node (2.2-2.9 s for ``--timeout 1`` against a frozen owner). Now the addresses tried in
    turn share what is left of it (a frozen first one leaves time for the next), and the
    message names how long each was waited for: together, within the timeout."""
    frozen = [pool.start(tmp_path / f"d{i}") for i in range(3)]
    for d in frozen:
        d.proc.send_signal(signal.SIGSTOP)
    try:
        r = coordinator("groups", "describe", "g", "--timeout", "1.5",
                        "--bootstrap", ",".join(d.bootstrap for d in frozen))
    finally:
        for d in frozen:
            d.proc.send_signal(signal.SIGCONT)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r
    waits = [float(w) for w in re.findall(r"no answer within ([0-9.]+)s", r.stderr)]
    assert len(waits) == 3 and all(d.bootstrap in r.stderr for d in frozen), r.stderr
    assert sum(waits) <= 1.5 + 0.01, waits  # (each rounded to 2 digits)


@pytest.mark.parametrize("command", [
    ("connectors", "create", "--group", "g", "c", "--tasks", "1", "--config", "connector.class=a:B"),
    ("groups", "list")])
def test_a_plaintext_cli_at_a_sasl_listener_says_the_protocol_probably_does_not_match(
        pool: DaemonPool, tmp_path: Path, command: tuple[str, ...]) -> None:
    """The server closes a connection whose first request it cannot take on that listener; the
    CLI said only "closed the connection" (or, for a change, "may or may not have been
    applied"), no hint at the cause."""
    d = pool.start(tmp_path / "d", extra_args=["--listen", "SASL_PLAINTEXT://127.0.0.1:0"])
    r = coordinator(*command, "--bootstrap", d.bootstrap, "--timeout", "5")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r
    assert "security protocol probably does not match this client's (PLAINTEXT; set " \
           "--security-protocol or --command-config)" in r.stderr, r.stderr


def test_status_list_and_describe_help_say_what_they_show() -> None:
    """Each sub-command's --help names what its output shows: every state `connectors status`
    prints (not only the running and failing ones), `connectors list`'s target state and
    running count, `groups describe`'s coordinating node, heartbeats and the work held or
    kept for departed workers."""
    from coordinator.cli import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))

    def helptext(group: str, action: str) -> str:
        inner = next(a for a in sub.choices[group]._actions
                     if isinstance(a, argparse._SubParsersAction))
        return " ".join(inner.choices[action].format_help().split())

    status = helptext("connectors", "status")
    for state in ("RUNNING", "FAILED", "RESTARTING", "PAUSED", "STOPPED", "ASSIGNED", "HELD",
                  "UNASSIGNED"):
        assert re.search(rf"\b{state}\b", status), (state, status)
    assert "missed heartbeats" in status and "kept for" in status, status
    listing = helptext("connectors", "list")
    assert "target state" in listing and "running" in listing.split("list a group's")[1], listing
    describe = helptext("groups", "describe")
    for what in ("coordinating node", "last heartbeat", "held for fenced", "kept for departed"):
        assert what in describe, (what, describe)


def test_worker_help_uses_the_words_groups_describe_shows() -> None:
    """connect-worker run --help: --max-delay-ms is how long a departed worker's work is KEPT
    (what `groups describe` lists under KEPT FOR DEPARTED MEMBERS), not "held" (HELD is the
    stop budget's hold of a fenced worker's items); --worker-url says where the URL shows
    (`groups describe` prints it only with --json)."""
    from worker_client.cli import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {o: " ".join((a.help or "").split()) for a in sub.choices["run"]._actions
             for o in a.option_strings}
    assert "kept" in helps["--max-delay-ms"] and "held" not in helps["--max-delay-ms"], helps
    assert "--json" in helps["--worker-url"] and "connectors status" in helps["--worker-url"], helps
