"""``connect-coordinator``: run the daemon, and admin commands that talk KRPC to a running one.

    connect-coordinator serve --data-dir ./data
    connect-coordinator connectors create --group G NAME --tasks N --config connector.class=C [...]
    connect-coordinator connectors update --group G NAME [--tasks N] [--config KEY=VALUE ...]
    connect-coordinator connectors delete --group G NAME [NAME ...]
    connect-coordinator connectors list --group G [--json]
    connect-coordinator connectors status --group G NAME [--json]
    connect-coordinator connectors describe --group G NAME [--json]
    connect-coordinator connectors restart --group G NAME [--task N]
    connect-coordinator connectors pause|resume|stop --group G NAME
    connect-coordinator connectors offsets get --group G NAME [--json]
    connect-coordinator connectors offsets alter --group G NAME --file F [--validate-only]
    connect-coordinator connectors offsets reset --group G NAME [--validate-only]
    connect-coordinator groups list [--json]
    connect-coordinator groups describe G [G ...] [--json]
    connect-coordinator groups configs --group G [--set NAME=VALUE ...] [--delete NAME ...] [--json]
    connect-coordinator users list|add|delete ...      SCRAM users (coordinator/security/cli.py)
    connect-coordinator acls list|add|delete ...       ACLs

Admin commands take ``--bootstrap HOST:PORT[,HOST:PORT...]`` (repeatable; default
127.0.0.1:9092): the addresses are tried in turn, and a group's requests go to the node
FindCoordinator names for it. An error from the coordinator prints its protocol name and message
and exits 1, as does no address answering; a usage error (a bad address included) exits 2.

They also take Kafka's client security settings: ``--command-config FILE`` (a
properties or TOML file, as Kafka's tools) and ``--security-protocol``, ``--sasl-mechanism``,
``--sasl-username``, ``--sasl-password-file`` (or ``$CONNECT_SASL_PASSWORD``), ``--ssl-cafile``,
``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-check-hostname`` (connect_wire.client_security,
docs/security.md). Credentials refused print one line and exit 1; bad settings exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from connect_wire import client_security, plugins, verbs
from connect_wire import connectors as shared
from connect_wire.addresses import Address, format_addresses, parse_bootstrap
from connect_wire.apis import APIS, ApiKey
from connect_wire.cliutil import StrictParser, add_version
from connect_wire.connectors import group_dict as _group_dict
from connect_wire.connectors import utc as _utc
from connect_wire.errors import ErrorCode, error_name
from connect_wire.messages import (
    ConnectGroupAlterConnectorsRequest,
    ConnectGroupAlterOffsetsRequest,
    ConnectGroupDescribeRequest,
    ConnectGroupFetchOffsetsRequest,
)
from connect_wire.messages import connect_group_alter_connectors_request_v0 as _alter
from connect_wire.messages import connect_group_alter_offsets_request_v0 as _alter_offsets
from coordinator.admin import AdminError, AdminSession
from coordinator.group.config import ConfigError
from coordinator.group.offsets import OffsetError, canonical_object
from coordinator.server import kafka_apis

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


class CliError(Exception):
    pass


def _kv(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _task_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tasks") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: a connector has 0 or more tasks")
    return value


def _task_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a task number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: tasks are numbered from 0")
    return value


def _bootstrap(text: str) -> list[Address]:
    try:
        return parse_bootstrap(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="connect-coordinator",
        description="A KIP-848 'connect' group coordinator: assigns connectors and tasks to "
        "worker processes, moving work incrementally (revoke before assign).",
    )
    add_version(p, "connect-coordinator")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=StrictParser)

    serve = sub.add_parser("serve", help="run the coordinator daemon",
                           description="Run the coordinator: by default one node with its "
                           "embedded file store; with --store etcd one of several nodes. "
                           "Settings: defaults < --config FILE < CONNECT_COORDINATOR_* "
                           "environment < flags (see docs/configuration.md).")
    serve.add_argument("--config", metavar="FILE", help="TOML configuration file")
    serve.add_argument("--listen", metavar="HOST:PORT",
                       help="KRPC listener (default 127.0.0.1:9092; port 0 = any free port)")
    serve.add_argument("--advertised-listener", metavar="HOST:PORT",
                       help="address clients are told to use (default: the bound listener)")
    serve.add_argument("--data-dir", metavar="DIR", help="partition logs directory (default ./data)")
    serve.add_argument("--metrics-listen", metavar="HOST:PORT",
                       help="Prometheus /metrics listener (default 127.0.0.1:9464; 'none' disables)")
    serve.add_argument("--partitions", metavar="N", type=int,
                       help="log partitions / shards (default 8; fixed once data exists)")
    serve.add_argument("--fsync", metavar="POLICY",
                       help="always (default) | interval:MS | never")
    serve.add_argument("--log-format", choices=("json", "console"), help="log format (default json)")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    several = serve.add_argument_group(
        "several nodes on etcd",
        "Run several coordinator nodes sharing the partitions through etcd (docs/etcd.md): "
        "every node gets --store etcd, the same --etcd-endpoints, --etcd-prefix and "
        "--partitions, its own --node-id and an --advertised-listener the workers and the "
        "other nodes can reach. No data dir is used.")
    several.add_argument("--store", choices=("file", "etcd"),
                         help="file (default: the partition logs in --data-dir, one node) | etcd")
    several.add_argument("--etcd-endpoints", metavar="HOST:PORT[,HOST:PORT...]",
                         help="the etcd cluster's client addresses")
    several.add_argument("--etcd-prefix", metavar="PATH",
                         help="key namespace in etcd (default /connect-coordinator)")
    several.add_argument("--node-id", metavar="N", type=int,
                         help="this node's id, 0-2147483647, unique among the live nodes")

    def admin(parent: Any, name: str, help: str) -> argparse.ArgumentParser:
        a: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
        a.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT...]", type=_bootstrap,
                       action="append",
                       help="coordinator nodes to ask, comma-separated and/or repeated; tried in "
                       "turn, and a group's requests go to the node that coordinates it "
                       f"(default {DEFAULT_BOOTSTRAP})")
        a.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                       help="bound on the whole command: finding the nodes, every connection, "
                       "answer and retry (default 10)")
        client_security.add_arguments(a, "--command-config")
        return a

    conn = sub.add_parser("connectors", help="create, update, delete or list connectors")
    csub = conn.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("create", "create a connector (fails if it exists)"),
                         ("update", "change a connector's task count or config (must exist)")):
        c = admin(csub, action, text)
        c.add_argument("--group", required=True, help="the worker group")
        c.add_argument("name", help="connector name")
        c.add_argument("--tasks", type=_task_count, required=action == "create", metavar="N",
                       help="number of tasks")
        c.add_argument("--config", type=_kv, action="append", default=[], metavar="KEY=VALUE",
                       help="connector config entry, e.g. connector.class=module:Class (repeatable)")
        c.add_argument("--validate-only", action="store_true",
                       help="check (the plugin's own validate(config) where it can be imported "
                       "here, then the coordinator), change nothing")
    d = admin(csub, "delete", "delete connectors")
    d.add_argument("--group", required=True)
    d.add_argument("names", nargs="+", metavar="NAME")
    d.add_argument("--validate-only", action="store_true")
    ls = admin(csub, "list", "list a group's connectors: each one's target state (RUNNING, "
               "PAUSED, STOPPED) and apart from it how many of its instances a worker reports "
               "running, of how many (those whose worker has missed its heartbeats since: "
               "overdue)")
    ls.add_argument("--group", required=True)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    st = admin(csub, "status", "a connector's and its tasks' states as their workers report "
                               "them (RUNNING, FAILED with the error and trace, RESTARTING; "
                               "PAUSED or STOPPED as asked) or as the assignment has them "
                               "(ASSIGNED: not reported yet, HELD for a fenced worker, "
                               "UNASSIGNED), with each one's worker; marked when that worker "
                               "missed heartbeats, or when the item is kept for a departed "
                               "worker until the scheduled rebalance")
    st.add_argument("--group", required=True)
    st.add_argument("name", help="connector name")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    de = admin(csub, "describe", "one connector: task count, target state, restart counters, config")
    de.add_argument("--group", required=True)
    de.add_argument("name", help="connector name")
    de.add_argument("--json", action="store_true", help="machine-readable output")
    # Connect's verbs: durable, as reserved config keys (connect_wire.verbs).
    for action, text in (
            ("restart", "restart a connector and all its tasks (--task N: only that task) where "
                        "they run"),
            ("pause", "pause a connector: its instances stop, its items stay assigned"),
            ("resume", "resume a paused or stopped connector: its instances start again"),
            ("stop", "stop a connector (Kafka Connect's STOPPED): its instances stop, its items "
                     "stay assigned")):
        v = admin(csub, action, text)
        v.add_argument("--group", required=True, help="the worker group")
        v.add_argument("name", help="connector name")
        if action == "restart":
            v.add_argument("--task", type=_task_id, metavar="N", help="restart only task N")

    # Source offsets (Kafka Connect's GET/PATCH/DELETE /connectors/{c}/offsets).
    off = csub.add_parser(
        "offsets", help="get, alter or reset a connector's source offsets",
        description="A connector's source offsets: pairs of a source partition and an offset, "
        "both JSON objects, in Kafka Connect's JSON shape "
        '{"offsets": [{"partition": {...}, "offset": {...}}]}. alter and reset need the '
        "connector STOPPED first ('connectors stop'), and ALTER on the group when ACLs are on.")
    osub = off.add_subparsers(dest="offsets_action", required=True, metavar="ACTION")
    og = admin(osub, "get", "print a connector's committed offsets (needs DESCRIBE on the group)")
    og.add_argument("--group", required=True, help="the worker group")
    og.add_argument("name", help="connector name")
    og.add_argument("--json", action="store_true",
                    help='Kafka Connect\'s shape: {"offsets": [{"partition": ..., "offset": ...}]}')
    oa = admin(osub, "alter", "set or remove offsets of a STOPPED connector from a JSON file "
               "(merged as Kafka Connect's PATCH: the partitions given are set, an offset of "
               "null removes its partition, the others stay)")
    oa.add_argument("--group", required=True, help="the worker group")
    oa.add_argument("name", help="connector name")
    oa.add_argument("--file", required=True, metavar="F",
                    help='JSON file ("-": standard input): {"offsets": [{"partition": {...}, '
                    '"offset": {...} or null}, ...]}, as \'offsets get --json\' prints')
    oa.add_argument("--validate-only", action="store_true",
                    help="check the file and the connector's state, change nothing")
    oa.add_argument("--json", action="store_true",
                    help='Kafka Connect\'s answer: {"message": ...}')
    orr = admin(osub, "reset", "remove every offset of a STOPPED connector (its tasks start "
                "from nothing when it is resumed)")
    orr.add_argument("--group", required=True, help="the worker group")
    orr.add_argument("name", help="connector name")
    orr.add_argument("--validate-only", action="store_true",
                     help="check the connector's state, change nothing")
    orr.add_argument("--json", action="store_true",
                     help='Kafka Connect\'s answer: {"message": ...}')

    # The connectors command's help names every action, read from its parser (so that it cannot
    # fall behind when an action is added).
    summary = "connectors: " + ", ".join(csub.choices)
    for choice in sub._choices_actions:  # (argparse keeps a sub-command's help there)
        if choice.dest == "connectors":
            choice.help = summary
    conn.description = summary

    groups = sub.add_parser("groups", help="list or describe groups, or their dynamic configs")
    gsub = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    gl = admin(gsub, "list", "list connect groups and their states (every node asked; a node "
               "that fails is named on stderr, exit 1)")
    gl.add_argument("--json", action="store_true")
    gd = admin(gsub, "describe", "groups: the coordinating node, members with their epochs, "
               "last heartbeat and assignments, instance states, and the work held for fenced "
               "members or kept for departed members until the scheduled rebalance")
    gd.add_argument("groups", nargs="+", metavar="GROUP")
    gd.add_argument("--json", action="store_true")
    gc = admin(gsub, "configs", "a group's dynamic configs (connect.session.timeout.ms, "
               "connect.heartbeat.interval.ms): describe them, or change them with --set and "
               "--delete (back to the daemon's default); DescribeConfigs and "
               "IncrementalAlterConfigs on the group, as Kafka's kafka-configs.sh")
    gc.add_argument("--group", required=True, metavar="GROUP")
    gc.add_argument("--set", type=_kv, action="append", default=[], metavar="NAME=VALUE",
                    help="set a config of the group (repeatable)")
    gc.add_argument("--delete", action="append", default=[], metavar="NAME",
                    help="remove a config's override: the daemon's default applies (repeatable)")
    gc.add_argument("--validate-only", action="store_true",
                    help="check the change, write nothing")
    gc.add_argument("--json", action="store_true")
    from coordinator.security.cli import add_commands
    add_commands(sub, admin)  # users, acls
    return p


def _session(args: argparse.Namespace) -> AdminSession:
    chosen = args.bootstrap or [parse_bootstrap(DEFAULT_BOOTSTRAP)]
    addresses = list(dict.fromkeys(a for group in chosen for a in group))
    return AdminSession(addresses, timeout_s=args.timeout,
                        security=client_security.from_args(args),
                        deadline=time.monotonic() + args.timeout)


def _check(code: int, message: str | None) -> None:
    if code:
        raise CliError(f"{error_name(code)}: {message or 'no message'}")


def _describe(session: AdminSession, group_ids: list[str]) -> Any:
    """Each group from its own coordinator (groups may live on different nodes): the node that
    answered is in ``session.coordinators``."""
    return [g for group_id in group_ids for g in session.group_call(
        group_id, ConnectGroupDescribeRequest(group_ids=(group_id,))).groups]


def _until(ms: int, now_ms: int, brackets: bool = True) -> str:
    """When a hold ends, for a human: the UTC time and how far away (by this machine's clock),
    that in brackets or after a comma."""
    at = _utc(ms)
    if at is None:
        return "unknown"
    left = (ms - now_ms) / 1000
    away = f"in {left:.1f} s" if left > 0 else "ending now"
    return f"{at[:19]}Z ({away})" if brackets else f"{at[:19]}Z, {away}"


def _connector_dict(c: Any) -> dict[str, Any]:
    """A connector as stored (``config``: every key, the verbs' reserved ones too) and its
    verbs' state (connect_wire.verbs): the target state, the restart counters, and
    the config its plugins get."""
    config = {e.name: e.value for e in c.config}
    return {"name": c.name, "tasks": c.task_count, "config": config,
            "state": verbs.target_state(config),
            "restart_generation": verbs.counter(config, verbs.RESTART_GENERATION),
            "task_restarts": {k[len(verbs.RESTART_TASK_PREFIX):]: verbs.counter(config, k)
                              for k in sorted(config) if k.startswith(verbs.RESTART_TASK_PREFIX)},
            "plugin_config": verbs.plugin_config(config)}


def _running_count(g: Any, name: str) -> dict[str, int]:
    """How many of a connector's instances (the connector and its running tasks) a worker
    reports RUNNING, and how many there are: the target state says what the operator asked
    for, this what the workers do."""
    st = shared.status(g, name)
    xs = [st, *st["tasks"]]
    running = [x for x in xs if x["state"] == "RUNNING"]
    # (reported RUNNING by a worker that has since missed its heartbeats: killed or frozen,
    # perhaps; its session has not ended yet)
    return {"running_instances": len(running), "instances": len(xs),
            "overdue_instances": sum(bool(x["worker_heartbeat_overdue"]) for x in running)}


def _heartbeat_text(ago_ms: int | None, overdue: bool) -> str:
    """A member's last heartbeat, for a human: ``0.4 s ago``, ``5.2 s ago (overdue)``, ``-``."""
    if ago_ms is None:
        return "-"
    return f"{ago_ms / 1000:.1f} s ago{' (overdue)' if overdue else ''}"


def _state_text(x: dict[str, Any], now_ms: int) -> str:
    """An instance's state in ``connectors status``, marked when its worker missed its
    heartbeats or when it is kept for a departed member until the scheduled rebalance."""
    state = x["state"]
    ago = x["worker_last_heartbeat_ms_ago"]
    if x["worker_heartbeat_overdue"] and ago is not None:
        state += f" (worker missed heartbeats {ago / 1000:.1f} s)"
    k = x["kept_for"]
    if k is not None:
        until = k["until_ms"] if k["until_ms"] is not None else -1
        state += (f" (kept for {k['instance_id'] or k['member_id']} until "
                  f"{_until(until, now_ms, brackets=False)})")
    return state


def _status_text(st: dict[str, Any]) -> str:
    def text(value: Any) -> str:
        return "-" if value is None or value == "" else str(value)

    now_ms = time.time_ns() // 1_000_000
    rows = [[x["item"], _state_text(x, now_ms), text(x["instance_id"]), text(x["member_id"]),
             text(x["worker_url"]), text(x["fencing_token"]), text(x["error"])]
            for x in [{"item": st["connector"], **st}, *({"item": f"{st['connector']}/{t['task']}", **t}
                                                        for t in st["tasks"])]]
    lines = [_table(rows, ["INSTANCE", "STATE", "WORKER", "MEMBER", "URL", "TOKEN", "ERROR"])]
    if st["running_tasks"] != st["configured_tasks"]:  # (its instance wrote fewer task configs)
        lines.insert(0, f"CONNECTOR {st['connector']}  tasks="
                        f"{_tasks_text(st['running_tasks'], st['configured_tasks'])}")
    for x in [{"item": st["connector"], **st},
              *({"item": f"{st['connector']}/{t['task']}", **t} for t in st["tasks"])]:
        if x["trace"]:
            lines += [f"\nTRACE {x['item']} ({x['state']}):", x["trace"].rstrip("\n")]
    return "\n".join(lines) + "\n"


def _tasks_text(running: int, configured: int) -> str:
    """A running task count, with the configured one when they differ (the connector instance
    wrote fewer task configs)."""
    return str(running) if running == configured else f"{running} (of {configured} configured)"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), *(fmt.format(*map(str, r)) for r in rows)])


def _verb_config(args: argparse.Namespace, old: Any) -> dict[str, str | None]:
    """The connector's config after a verb (read-modify-write of the stored one)."""
    config = shared.config_of(old)
    if args.action != "restart":
        return shared.state_config(config, args.action)
    try:
        return shared.restart_config(config, old.task_count, everything=args.task is None,
                                     tasks=() if args.task is None else (args.task,))
    except shared.UnknownTask:
        raise CliError(f"connector {args.name} has no task {args.task} "
                       f"(it has {old.task_count} task(s))") from None


def _describe_text(c: dict[str, Any]) -> str:
    tasks = [f"  task {t}: restart counter {c['task_restarts'][str(t)]}"
             for t in range(c["tasks"]) if c["task_restarts"].get(str(t))]
    return "\n".join([f"CONNECTOR {c['name']}", f"  state: {c['state']}", f"  tasks: {c['tasks']}",
                      f"  restart generation: {c['restart_generation']}", *tasks,
                      "  config:", *(f"    {k}={v}" for k, v in c["plugin_config"].items())]) + "\n"


def _offsets_file(path: str) -> list[tuple[str, str | None]]:
    """(partition, offset or None) pairs of an ``offsets alter --file``, as canonical JSON."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8: {exc}") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise CliError(f"{path} is nested too deeply to be read") from None
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None
    try:
        return shared.offset_pairs(doc, path, _canonical)
    except shared.BadOffsets as exc:
        raise CliError(str(exc) + ("" if "empty" not in str(exc) else
                                   " (to remove every offset, use 'connectors offsets reset')")) from None


def _canonical(obj: Any, what: str) -> str:
    """``obj``'s canonical JSON, checked as the coordinator checks it (NaN, a number beyond a
    float's range, a lone surrogate, too deep: a message naming ``what``)."""
    try:
        return canonical_object(json.dumps(obj), what)[0]
    except RecursionError:
        raise CliError(f"{what} is nested too deeply.") from None
    except OffsetError as exc:
        raise CliError(str(exc)) from None


def cmd_offsets(args: argparse.Namespace, out: Any) -> None:
    action = args.offsets_action
    pairs = _offsets_file(args.file) if action == "alter" else []
    with _session(args) as client:
        if action == "get":
            resp = client.group_call(args.group, ConnectGroupFetchOffsetsRequest(
                group_id=args.group, connector=args.name, partitions=None))
            _check(resp.error_code, resp.error_message)
            entries = shared.offset_entries(resp.offsets)
            if args.json:
                out.write(json.dumps({"offsets": entries}, indent=2, ensure_ascii=False) + "\n")
            elif not entries:
                out.write(f"connector {args.name} has no committed offsets\n")
            else:
                rows = [[p.partition, p.offset or ""] for p in resp.offsets]
                out.write(_table(rows, ["PARTITION", "OFFSET"]) + "\n")
            return
        req = ConnectGroupAlterOffsetsRequest(
            group_id=args.group, connector=args.name, reset=action == "reset",
            offsets=tuple(_alter_offsets.PartitionOffset(partition=p, offset=o) for p, o in pairs),
            validate_only=args.validate_only)
        # REBALANCE_IN_PROGRESS: the stopped connector's instances are still stopping (a
        # task's stop() may commit): asked again until --timeout.
        resp = client.group_call(args.group, req,
                                 retry=frozenset({int(ErrorCode.REBALANCE_IN_PROGRESS)}))
        _check(resp.error_code, resp.error_message)
        if args.validate_only:
            message = (f"valid: the offsets of connector {args.name} can be "
                       f"{'reset' if action == 'reset' else 'altered'}")
        elif action == "reset":
            message = f"The offsets for connector {args.name} have been reset successfully."
        else:
            removed = sum(o is None for _, o in pairs)
            message = (f"The offsets for connector {args.name} have been altered successfully "
                       f"({len(pairs) - removed} set, {removed} removed).")
        out.write((json.dumps({"message": message}) if args.json else message) + "\n")


def cmd_connectors(args: argparse.Namespace, out: Any) -> None:
    if args.action == "offsets":
        cmd_offsets(args, out)
        return
    with _session(args) as client:
        if args.action == "status":  # (Status)
            (g,) = _describe(client, [args.group])
            _check(g.error_code if g.error_code != 10001 else 0, g.error_message)
            try:
                st = shared.status(g, args.name)
            except shared.UnknownConnector as exc:
                raise CliError(str(exc)) from None
            out.write(json.dumps(st, indent=2) + "\n" if args.json else _status_text(st))
            return
        if args.action in ("list", "describe"):
            (g,) = _describe(client, [args.group])
            _check(g.error_code if g.error_code != 10001 else 0, g.error_message)
            connectors = [_connector_dict(c) for c in g.connectors]
            if args.action == "describe":
                found = [c for c in connectors if c["name"] == args.name]
                if not found:
                    raise CliError(f"connector {args.name} does not exist in group {args.group}")
                out.write(json.dumps(found[0], indent=2) + "\n" if args.json
                          else _describe_text(found[0]))
            else:
                listed = [{**{k: c[k] for k in ("name", "tasks", "config", "state")},
                           **_running_count(g, c["name"])} for c in connectors]
                if args.json:
                    out.write(json.dumps(listed, indent=2) + "\n")
                else:
                    rows = [[c["name"], c["tasks"], c["state"],
                             f"{c['running_instances']}/{c['instances']}" + (
                                 f" ({c['overdue_instances']} overdue)"
                                 if c["overdue_instances"] else ""),
                             ", ".join(f"{k}={v}" for k, v in c["config"].items())]
                            for c in listed]
                    out.write(_table(rows, ["CONNECTOR", "TASKS", "TARGET", "RUNNING",
                                            "CONFIG"]) + "\n")
            return
        if args.action == "delete":
            req = ConnectGroupAlterConnectorsRequest(group_id=args.group, deletes=tuple(args.names),
                                                     validate_only=args.validate_only)
        elif args.action in ("restart", "pause", "resume", "stop"):
            # Read-modify-write through AlterConnectors (durable: stored and replayed like any
            # config change). Not atomic: an update of the same connector between the read and
            # the write is overwritten (the wire has no conditional alter).
            (g,) = _describe(client, [args.group])
            existing = {c.name: c for c in g.connectors} if g.error_code in (0, 10001) else {}
            old = existing.get(args.name)
            if old is None:
                if g.error_code not in (0, 10001):
                    _check(g.error_code, g.error_message)
                raise CliError(f"connector {args.name} does not exist in group {args.group}")
            config = _verb_config(args, old)
            spec = _alter.ConnectorSpec(
                name=args.name, task_count=old.task_count,
                config=tuple(_alter.ConfigEntry(name=k, value=v) for k, v in sorted(config.items())))
            req = ConnectGroupAlterConnectorsRequest(group_id=args.group, upserts=(spec,),
                                                     validate_only=False)
        else:
            (g,) = _describe(client, [args.group])
            existing = {c.name: c for c in g.connectors} if g.error_code in (0, 10001) else {}
            if args.action == "create" and args.name in existing:
                raise CliError(f"connector {args.name} already exists in group {args.group} "
                               "(use 'connectors update')")
            if args.action == "update" and args.name not in existing:
                raise CliError(f"connector {args.name} does not exist in group {args.group} "
                               "(use 'connectors create')")
            old = existing.get(args.name)
            tasks = args.tasks if args.tasks is not None else old.task_count
            config = {e.name: e.value for e in old.config} if old is not None else {}
            config.update(dict(args.config))
            _validate_with_plugin(args.name, config)
            spec = _alter.ConnectorSpec(
                name=args.name, task_count=tasks,
                config=tuple(_alter.ConfigEntry(name=k, value=v) for k, v in sorted(config.items())))
            req = ConnectGroupAlterConnectorsRequest(group_id=args.group, upserts=(spec,),
                                                     validate_only=args.validate_only)
        resp = client.group_call(args.group, req, resend_if_lost=False)
        _check(resp.error_code, resp.error_message)
        verb = "valid" if req.validate_only else "ok"
        out.write(f"{verb}: group {args.group} at epoch {resp.group_epoch}\n")


def _validate_with_plugin(name: str, config: dict[str, str | None]) -> None:
    """Run the connector class's ``validate(config)`` (connect_wire.plugins) on the config as it
    would be stored (an update's merged with the stored one), as the plugin would see it: a
    config it finds invalid is refused, each ``key: message`` on stderr (exit 1), nothing
    written. Where the plugin cannot be imported here, say so and go on: the workers validate
    it again before starting anything."""
    spec = config.get("connector.class") or ""
    try:
        cls = plugins.load_class(spec)
    except Exception as exc:  # noqa: BLE001 - PluginError, or the plugin's module failing to load
        print(f"connect-coordinator: could not validate connector {name}'s config here: {exc} "
              "(its workers validate it before starting it)", file=sys.stderr)
        return
    try:
        errors = plugins.validate_sync(cls, {**verbs.plugin_config(config), "connector.name": name})
    except plugins.ValidatorFailed as exc:
        raise CliError(f"connector {name}: the config's validator itself failed, nothing "
                       f"written: {exc}") from None
    if errors:
        raise CliError(f"connector {name}: invalid config ({spec}.validate), nothing written:\n"
                       + "\n".join(plugins.error_lines(errors)))


def cmd_groups(args: argparse.Namespace, out: Any) -> None:
    with _session(args) as client:
        if args.action == "list":
            # Every node (from Metadata) asked and merged; a node that failed is named on
            # stderr (exit 1) after the others' groups are printed.
            listing = client.list_groups()
            groups = [{"group": group_id, "state": state} for group_id, state in listing.groups]
            if args.json:
                out.write(json.dumps(groups, indent=2) + "\n")
            else:
                out.write(_table([[g["group"], g["state"]] for g in groups], ["GROUP", "STATE"]) + "\n")
            if listing.failures:
                raise CliError("\n".join(
                    [f"groups list is incomplete: {len(listing.failures)} of {len(listing.nodes)} "
                     "node(s) failed (shown: what the nodes answered):"]
                    + [f"  {node}: {what}" for node, what in listing.failures]))
            return
        if args.action == "configs":
            _group_configs(client, args, out)
            return
        described = _describe(client, args.groups)
        dicts = [_group_dict(g) for g in described]
        for g in dicts:  # (the node that answered for it: FindCoordinator's)
            node = client.coordinators.get(g["group"])
            g["coordinator"] = None if node is None else {
                "node_id": node.node_id, "host": node.host, "port": node.port}
        if args.json:
            out.write(json.dumps(dicts, indent=2) + "\n")
        else:
            for g in dicts:
                _write_group(out, g)
        for g in described:
            if g.error_code and g.error_code != 10001:
                raise CliError(f"{error_name(g.error_code)}: {g.error_message}")


_SOURCES = {5: "DEFAULT_CONFIG", 8: "GROUP_CONFIG"}


def _group_configs(client: AdminSession, args: argparse.Namespace, out: Any) -> None:
    """``groups configs``: IncrementalAlterConfigs (SET, DELETE) when asked to change, then
    DescribeConfigs of the group (resource type GROUP, 32), at the node coordinating it (the
    nodes asked in turn: no FindCoordinator, which would need DESCRIBE on the group)."""
    group = args.group
    if not group:
        raise CliError("--group must not be empty")
    names = [k for k, _ in args.set] + list(args.delete)
    if len(set(names)) != len(names):
        raise CliError(f"a config named twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    if names:
        ops = [{"name": k, "config_operation": 0, "value": v} for k, v in args.set] + [
            {"name": k, "config_operation": 1, "value": None} for k in args.delete]
        alter = kafka_apis.build(APIS[ApiKey.INCREMENTAL_ALTER_CONFIGS].request_class(1), {
            "resources": [{"resource_type": 32, "resource_name": group, "configs": ops}],
            "validate_only": args.validate_only})
        resp = client.owner_call(alter)  # (resent if lost: SET and DELETE are idempotent)
        r = resp.responses[0]
        _check(r.error_code, r.error_message)
    describe = kafka_apis.build(APIS[ApiKey.DESCRIBE_CONFIGS].request_class(4), {
        "resources": [{"resource_type": 32, "resource_name": group, "configuration_keys": None}],
        "include_synonyms": True, "include_documentation": False})
    result = client.owner_call(describe).results[0]
    if result.error_code and names:
        # The change went through; only showing the configs after it failed (e.g. a principal
        # allowed ALTER_CONFIGS and denied DESCRIBE_CONFIGS): say what was done, exit 0.
        what = "valid (validate-only: nothing written)" if args.validate_only else "applied"
        print(f"connect-coordinator: {what}; could not describe the group's configs "
              f"afterwards: {error_name(result.error_code)}: {result.error_message}",
              file=sys.stderr)
        done = [{"name": k, "operation": "SET", "value": v} for k, v in args.set] + [
            {"name": k, "operation": "DELETE", "value": None} for k in args.delete]
        if args.json:
            out.write(json.dumps({"group": group, "validate_only": args.validate_only,
                                  "configs": None, "applied": done}, indent=2) + "\n")
        else:
            out.write(f"{what.split(' ')[0]}: " + ", ".join(
                f"{c['name']}={c['value']}" if c["operation"] == "SET"
                else f"{c['name']} (deleted)" for c in done) + f" to group {group}\n")
        return
    _check(result.error_code, result.error_message)
    configs = [{"name": c.name, "value": c.value, "source": _SOURCES.get(c.config_source,
                                                                         str(c.config_source)),
                "default": next((s.value for s in c.synonyms if s.source == 5), None)}
               for c in result.configs]
    if args.json:
        out.write(json.dumps({"group": group, "validate_only": args.validate_only,
                              "configs": configs}, indent=2) + "\n")
        return
    if names and args.validate_only:
        out.write("valid (validate-only: nothing written); the group's configs now:\n")
    out.write(_table([[c["name"], c["value"], c["source"], c["default"]] for c in configs],
                     ["NAME", "VALUE", "SOURCE", "DEFAULT"]) + "\n")


def _write_group(out: Any, g: dict[str, Any]) -> None:
    """``groups describe``'s human form. ASSIGNED is what the coordinator gave the member and it
    still owns (not whether its plugin runs: a worker restarts a failing instance and keeps it),
    REVOKING what it must give up and has not reported stopped yet, LAST HEARTBEAT how long
    ago the coordinator heard from it (``(overdue)`` once it missed its heartbeats). Items held
    for fenced members follow, with the member and when the hold ends, then items kept for
    departed members until the scheduled rebalance. No value prints as Python's None: absent
    is ``-``."""
    def text(value: Any) -> str:
        return "-" if value is None or value == "" else str(value)

    out.write(f"GROUP {g['group']}  state={g['state']}  epoch={g['group_epoch']}  "
              f"assignment-epoch={g['assignment_epoch']}  assignor={text(g['assignor'])}  "
              f"computing={text(g['assigning_member'])}\n")
    if g.get("coordinator") is not None:
        c = g["coordinator"]
        out.write(f"  coordinator: node {c['node_id']} at "
                  f"{format_addresses([(c['host'], c['port'])])}\n")
    if g["error"]:
        out.write(f"  {g['error']}: {text(g['error_message'])}\n")
    if g["connectors"]:
        out.write(_table([[c["name"], _tasks_text(c["running_tasks"], c["tasks"])]
                          for c in g["connectors"]], ["CONNECTOR", "TASKS"]) + "\n")
    if g["members"]:
        out.write(_table([[m["member_id"], text(m["instance_id"]),
                           "new" if m["protocol"] == "new" else f"classic:{m['classic_protocol']}",
                           m["epoch"], m["state"],
                           _heartbeat_text(m["last_heartbeat_ms_ago"], m["heartbeat_overdue"]),
                           " ".join(m["assignment"]) or "-", " ".join(m["revoking"]) or "-",
                           " ".join(m["target"]) or "-"] for m in g["members"]],
                         ["MEMBER", "INSTANCE", "PROTOCOL", "EPOCH", "STATE", "LAST HEARTBEAT",
                          "ASSIGNED", "REVOKING", "TARGET"]) + "\n")
    else:
        out.write("  no members\n")
    tokens = [[m["member_id"], item, token] for m in g["members"]
              for item, token in m["fencing_tokens"].items()]
    if tokens:  # (a sink refuses writes carrying a lower token than it saw for the item)
        out.write("FENCING TOKENS (per owned item):\n")
        out.write(_table(tokens, ["MEMBER", "ITEM", "TOKEN"]) + "\n")
    states = [[m["member_id"], text(m["instance_id"]), i["item"], i["state"], text(i["error"])]
              for m in g["members"] for i in m["instances"]]
    if states:  # (as the workers report them; traces in 'connectors status')
        out.write("INSTANCE STATES (as the workers report them):\n")
        out.write(_table(states, ["MEMBER", "WORKER", "ITEM", "STATE", "ERROR"]) + "\n")
    if g["holds"]:
        now_ms = time.time_ns() // 1_000_000
        out.write("HELD FOR FENCED MEMBERS (nobody runs these until the hold ends):\n")
        out.write(_table([[h["member_id"], text(h["instance_id"]),
                           _until(h["until_ms"] if h["until_ms"] is not None else -1, now_ms),
                           " ".join(h["items"]) or "-"] for h in g["holds"]],
                         ["FENCED MEMBER", "INSTANCE", "HELD UNTIL", "ITEMS"]) + "\n")
    if g["kept_for"]:
        now_ms = time.time_ns() // 1_000_000
        out.write("KEPT FOR DEPARTED MEMBERS (unassigned until the scheduled rebalance):\n")
        out.write(_table([[k["member_id"], text(k["instance_id"]),
                           _until(k["until_ms"] if k["until_ms"] is not None else -1, now_ms),
                           " ".join(k["items"]) or "-"] for k in g["kept_for"]],
                         ["DEPARTED MEMBER", "INSTANCE", "KEPT UNTIL", "ITEMS"]) + "\n")
    out.write("\n")


def cmd_serve(args: argparse.Namespace) -> int:
    from coordinator import config as cfg
    from coordinator.daemon import main_serve

    overrides = {
        "listeners": args.listen, "advertised.listener": args.advertised_listener,
        "data.dir": args.data_dir, "metrics.listener": args.metrics_listen,
        "partitions": args.partitions, "log.fsync": args.fsync,
        "log.format": args.log_format, "log.level": args.log_level,
        "store": args.store, "etcd.endpoints": args.etcd_endpoints,
        "etcd.prefix": args.etcd_prefix, "node.id": args.node_id,
    }
    try:
        config = cfg.load(args.config, overrides)
    except ConfigError as exc:
        print(f"connect-coordinator: configuration error: {exc}", file=sys.stderr)
        return 2
    return main_serve(config)


def _connector_class_problem(args: argparse.Namespace) -> str | None:
    """Kafka Connect refuses a connector config without ``connector.class`` (400); so does
    ``connectors create`` (``--validate-only`` too), before connecting: a usage error (exit 2).
    An update may leave it out (the stored value stays) but not set it empty. The check is the
    CLI's, not the coordinator's: the wire contract leaves ``Config`` to the workers (the
    coordinator stores it and validates only names), and logs with such connectors replay."""
    if args.command != "connectors" or args.action not in ("create", "update"):
        return None
    given = dict(args.config)
    reserved = sorted(k for k in given if verbs.is_reserved(k))
    if reserved:
        return (f"{', '.join(reserved)}: reserved for Connect's verbs (use 'connectors restart', "
                "'pause', 'resume' or 'stop')")
    if args.action == "create" and "connector.class" not in given:
        return ("a connector needs --config connector.class=module:Class (or a plugin's entry "
                "point name): the class a worker runs")
    if "connector.class" in given and not given["connector.class"].strip():
        return "connector.class must not be empty"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problem = _connector_class_problem(args)
    if problem is not None:
        print(f"connect-coordinator connectors {args.action}: error: {problem}", file=sys.stderr)
        return 2
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "connectors":
            cmd_connectors(args, sys.stdout)
        elif args.command in ("users", "acls"):
            from coordinator.security.cli import main as security_main
            return security_main(args, sys.stdout, _session)
        else:
            cmd_groups(args, sys.stdout)
    except client_security.SecurityConfigError as exc:
        print(f"connect-coordinator: configuration error: {exc}", file=sys.stderr)
        return 2
    except client_security.SecurityError as exc:
        what = "not authorized" if isinstance(exc, client_security.AuthorizationFailed) \
            else "authentication failed"
        print(f"connect-coordinator: {what}: {exc}", file=sys.stderr)
        return 1
    except (CliError, AdminError) as exc:
        print(f"connect-coordinator: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
