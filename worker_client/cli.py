"""``connect-worker run``: a worker process that joins a group and runs its connectors and tasks.

    connect-worker run --bootstrap 127.0.0.1:9092 --group my-cluster
    connect-worker run --bootstrap node1:9092,node2:9092,node3:9092 --group my-cluster

SIGTERM or SIGINT stop the work and leave the group (-1; with --instance-id, -2: a planned
restart keeps the work held for this instance until its session expires; --leave forces -1).

With --rest-listen HOST:PORT the worker also serves Kafka Connect's REST API for its group
(worker_client.rest, docs/rest.md).

Security: Kafka's client settings (security.protocol, sasl.mechanism,
sasl.username, the password from --sasl-password-file or $CONNECT_SASL_PASSWORD, ssl.cafile,
ssl.certfile/ssl.keyfile, ssl.check.hostname) from --client-config FILE (.properties or .toml)
and flags; see connect_wire.client_security and docs/security.md.

Exit status: 0 after a clean stop, 1 when the coordinator refused the worker, 2 for a usage or
configuration error (a --metrics-listen address that cannot be bound included), 3 for a
fail-stop (a plugin did not stop within the stop budget, so the process ended itself rather
than let its work run on two workers; see docs/worker.md), 4 when the coordinator refused its
credentials or permissions (TLS or SASL authentication failed, UNSUPPORTED_SASL_MECHANISM,
GROUP_AUTHORIZATION_FAILED): not retried, fix the settings or ACLs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import Any

from connect_wire import client_security
from connect_wire.addresses import Address, parse_bootstrap
from connect_wire.cliutil import StrictParser, add_version
from worker_client import logs

SECURITY_EXIT = 4
"""Exit status when the coordinator refused the worker's credentials or permissions."""
EXIT_STATUS = ("Exit status: 0 stopped cleanly, 1 refused by the coordinator (e.g. "
               "UNSUPPORTED_ASSIGNOR), 2 usage or configuration error (a --metrics-listen address that "
               "cannot be bound included), 3 fail-stop (a plugin did "
               "not stop within its stop budget; restart the worker), 4 credentials or "
               "permissions refused (TLS or SASL authentication failed, UNSUPPORTED_SASL_MECHANISM, "
               "GROUP_AUTHORIZATION_FAILED; not retried: fix the security settings or the ACLs). "
               "A connection that cannot be made or breaks is retried, never an exit.")


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _ms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of milliseconds")
    return value


def _bootstrap(text: str) -> list[Address]:
    try:
        return parse_bootstrap(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="connect-worker",
                                description="A worker of a connect group: runs the connectors and "
                                "tasks the coordinator assigns it.",
                                epilog=EXIT_STATUS)
    add_version(p, "connect-worker")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=StrictParser)
    r = sub.add_parser("run", help="join a group and work until stopped",
                       description="Join a group and work until stopped (SIGTERM/SIGINT).",
                       epilog=EXIT_STATUS)
    r.add_argument("--bootstrap", type=_bootstrap, action="append", required=True,
                   metavar="HOST:PORT[,HOST:PORT...]",
                   help="coordinator nodes, comma-separated and/or repeated: any that answers "
                   "tells the worker which node coordinates its group, and the worker finds it "
                   "again when it moves")
    r.add_argument("--group", required=True, help="the worker group (cluster) to join")
    r.add_argument("--member-id", default="", help="member id to use (default: the coordinator "
                   "picks). Never give two processes the same one: the coordinator takes them for "
                   "one member and both run its work; use --instance-id for a stable identity")
    r.add_argument("--instance-id", help="static membership id: a restart within the session "
                   "timeout gets the same work back")
    r.add_argument("--worker-url", help="this worker's URL, shown by `groups describe --json` "
                   "(worker_url) and `connectors status` (URL)")
    r.add_argument("--assignors", default="incremental,eager",
                   help="client-side assignors in preference order (default incremental,eager)")
    r.add_argument("--max-delay-ms", type=int, default=300_000,
                   help="scheduled.rebalance.max.delay.ms: how long a departed worker's work is kept "
                   "unassigned for it, in case it comes back, before the scheduled rebalance gives "
                   "it to the others (incremental assignor; default 300000, 0 = reassign at once)")
    r.add_argument("--task-shutdown-graceful-timeout-ms", dest="stop_budget_ms", type=_ms,
                   metavar="MS",
                   help="the stop budget (Kafka Connect's task.shutdown.graceful.timeout.ms; "
                   "default 5000, at least 100): how long stopping a connector or task may take. "
                   "The coordinator holds a fenced or crashed worker's work this long past its "
                   "session before anyone else may start it (the worker announces twice that as its "
                   "rebalance timeout). A plugin that has not stopped within it ends this process "
                   "(exit status 3)")
    r.add_argument("--rebalance-timeout-ms", type=_ms, metavar="MS",
                   help="deprecated: sets the stop budget to half of it (the default was 60000, "
                   "a 30 s budget); use --task-shutdown-graceful-timeout-ms")
    r.add_argument("--session-timeout-ms", type=int, default=10_000,
                   help="the coordinator's session timeout: without a heartbeat this long the worker "
                   "stops its work itself (default 10000, the coordinator's default). It must not "
                   "exceed the coordinator's group.connect.session.timeout.ms: the protocol does not "
                   "tell the worker that value, and a longer lease lets work run on after the "
                   "coordinator has handed it on")
    r.add_argument("--no-long-poll", action="store_true", help="plain heartbeats (no MaxWaitMs)")
    r.add_argument("--leave", action="store_true", help="on stop, always leave with -1")
    r.add_argument("--metrics-listen", type=_hostport, metavar="HOST:PORT",
                   help="serve Prometheus metrics (default: off)")
    r.add_argument("--log-format", choices=("json", "console"), default="json")
    r.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    r.add_argument("--config-providers", default="", metavar="NAME[,NAME...]",
                   help="Kafka's config providers to resolve in connector configs when starting "
                   "an instance, so secrets stay on the workers: file (${file:PATH:KEY} of a "
                   ".properties file), directory (${directory:DIR:FILE}), env (${env:NAME}); "
                   "default none")
    r.add_argument("--config-providers-allowed-paths", default="", metavar="DIR[,DIR...]",
                   help="the directories file and directory references may read (Kafka's "
                   "allowed.paths); default any file this process can read")
    rest = r.add_argument_group(
        "REST API", "Kafka Connect's REST API for the worker's group, answered through the "
        "coordinator (docs/rest.md). Off unless --rest-listen is given.")
    rest.add_argument("--rest-listen", type=_hostport, metavar="HOST:PORT",
                      help="serve the REST API here (e.g. 127.0.0.1:8083; 0.0.0.0 to accept "
                      "other hosts' requests); default: off")
    rest.add_argument("--rest-advertised-url", metavar="URL",
                      help="this worker's REST URL as others reach it (default: the listener's "
                      "http://HOST:PORT); also the worker URL the group shows unless --worker-url "
                      "is given, and its host:port is the worker_id in statuses")
    rest.add_argument("--rest-ssl-certfile", metavar="FILE",
                      help="serve HTTPS with this PEM certificate (chain) and --rest-ssl-keyfile "
                      "(the listener's own certificate, not the client one of --ssl-certfile)")
    rest.add_argument("--rest-ssl-keyfile", metavar="FILE",
                      help="the PEM key of --rest-ssl-certfile (an encrypted key's password: "
                      "$CONNECT_REST_SSL_KEY_PASSWORD)")
    rest.add_argument("--rest-basic-auth-file", metavar="FILE",
                      help="require HTTP basic authentication on every path: a file of "
                      "user=password lines (Kafka's PropertyFileLoginModule format)")
    rest.add_argument("--rest-request-timeout-ms", type=_ms, default=30_000, metavar="MS",
                      help="how long a request waits for the group's coordinator (retrying while "
                      "it moves or is unreachable) before answering 409, and for a request's "
                      "body before answering 408 (default 30000)")
    client_security.add_arguments(r, "--client-config")
    return p


def _rest_url(args: argparse.Namespace) -> str | None:
    if args.rest_advertised_url:
        return str(args.rest_advertised_url)
    if args.rest_listen:
        host, port = args.rest_listen
        scheme = "https" if args.rest_ssl_certfile else "http"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
    return None


async def _run(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from worker_client.worker import Worker, WorkerConfig

    try:
        security = client_security.from_args(args)
    except client_security.SecurityConfigError as exc:
        logs.exit_line(f"connect-worker: configuration error: {exc}")
        return 2
    from worker_client.config_providers import ConfigProviders
    try:
        providers = ConfigProviders(args.config_providers.split(","),
                                    args.config_providers_allowed_paths.split(","))
    except ValueError as exc:
        logs.exit_line(f"connect-worker: --config-providers: {exc}")
        return 2
    config = WorkerConfig(
        bootstrap=list(dict.fromkeys(a for group in args.bootstrap for a in group)),
        group_id=args.group, member_id=args.member_id,
        instance_id=args.instance_id, worker_url=args.worker_url or _rest_url(args),
        rebalance_timeout_ms=args.rebalance_timeout_ms, stop_budget_ms=args.stop_budget_ms,
        session_timeout_ms=args.session_timeout_ms,
        long_poll=not args.no_long_poll, max_delay_ms=args.max_delay_ms,
        assignors=[a.strip() for a in args.assignors.split(",") if a.strip()],
        security=security, config_providers=providers if providers.enabled else None,
    )
    try:
        worker = Worker(config)
    except ValueError as exc:
        logs.exit_line(f"connect-worker: {exc}")
        return 2
    if args.metrics_listen:
        host, port = args.metrics_listen
        try:
            start_http_server(port, host, registry=worker.metrics.registry)
        except OSError as exc:  # a busy port: one line naming it, not a traceback
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            logs.exit_line(f"connect-worker: cannot serve metrics on {where} (--metrics-listen): "
                           f"{exc.strerror or exc}")
            return 2
    rest = None
    if args.rest_advertised_url and not args.rest_listen:
        logs.exit_line("connect-worker: --rest-advertised-url needs --rest-listen")
        return 2
    if args.rest_listen:
        from worker_client.rest import RestServer, load_users
        users = None
        if args.rest_basic_auth_file:
            try:
                users = load_users(args.rest_basic_auth_file)
            except (OSError, ValueError) as exc:
                logs.exit_line(f"connect-worker: --rest-basic-auth-file: {exc}")
                return 2
        context = None
        if bool(args.rest_ssl_certfile) != bool(args.rest_ssl_keyfile):
            logs.exit_line("connect-worker: --rest-ssl-certfile and --rest-ssl-keyfile go together")
            return 2
        if args.rest_ssl_certfile:
            import ssl
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                context.load_cert_chain(args.rest_ssl_certfile, args.rest_ssl_keyfile,
                                        password=os.environ.get("CONNECT_REST_SSL_KEY_PASSWORD"))
            except (OSError, ssl.SSLError) as exc:
                logs.exit_line(f"connect-worker: --rest-ssl-certfile/--rest-ssl-keyfile: {exc}")
                return 2
        host, port = args.rest_listen
        rest = RestServer(worker, host, port, users=users, ssl_context=context,
                          request_timeout_s=args.rest_request_timeout_ms / 1000)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stopping.set)
    if rest is not None:
        # Bound before the worker joins (a busy port ends it with nothing joined); /health
        # answers 503 until the membership has joined.
        try:
            await rest.start()
        except OSError as exc:  # a busy port: one line naming it, not a traceback
            host, port = args.rest_listen
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            logs.exit_line(f"connect-worker: cannot serve the REST API on {where} (--rest-listen): "
                           f"{exc.strerror or exc}")
            return 2
    runner = asyncio.create_task(worker.run())
    try:
        return await _work(args, worker, runner, stopping)
    finally:
        if rest is not None:
            await rest.stop()


async def _work(args: argparse.Namespace, worker: Any, runner: asyncio.Task[None],
                stopping: asyncio.Event) -> int:
    from worker_client.failstop import FAIL_STOP_EXIT
    from worker_client.worker import WorkerFailed, WorkerFailStopped, WorkerSecurityFailed

    stopper = asyncio.create_task(stopping.wait())
    done, _ = await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if runner in done:
        stopper.cancel()
        try:
            runner.result()
        except WorkerFailStopped as exc:  # (the fail-stop action ends the process first)
            logs.exit_line(f"connect-worker: {exc}")
            os._exit(FAIL_STOP_EXIT)
        except WorkerSecurityFailed as exc:
            what = ("not authorized" if exc.code in (30, 31) else "authentication failed")
            logs.exit_line(f"connect-worker: {what}: {exc}")
            return SECURITY_EXIT
        except WorkerFailed as exc:
            logs.exit_line(f"connect-worker: {exc}")
            return 1
        return 0
    await worker.stop(static=False if args.leave else None)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(runner, 5)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure(args.log_format, args.log_level, group=args.group,
                   instance=args.instance_id or "")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(_run(args))


if __name__ == "__main__":
    sys.exit(main())
