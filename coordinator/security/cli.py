"""``connect-coordinator users ...`` and ``connect-coordinator acls ...``.

Users (SCRAM credentials)::

    # offline, before the first start (as kafka-storage format --add-scram): no daemon may hold
    # the data dir; or straight into etcd for store=etcd
    connect-coordinator users add --data-dir DIR NAME --mechanism SCRAM-SHA-256 --password-file F
    connect-coordinator users add --etcd-endpoints H:P --etcd-prefix /cc NAME --password-file F
    # online, through a running coordinator (DescribeUserScramCredentials /
    # AlterUserScramCredentials; the password is salted here, as kafka-configs does)
    connect-coordinator users list [NAME ...] [--json]
    connect-coordinator users add NAME --mechanism SCRAM-SHA-512 --password-file F [--iterations N]
    connect-coordinator users delete NAME --mechanism SCRAM-SHA-512

ACLs (DescribeAcls / CreateAcls / DeleteAcls), kafka-acls' options::

    connect-coordinator acls add --allow-principal User:w --operation Read --group orders
    connect-coordinator acls add --allow-principal User:ops --operation Alter --group team- \\
        --resource-pattern-type prefixed
    connect-coordinator acls add --allow-principal User:admin --operation Alter --cluster
    connect-coordinator acls list [--group G | --cluster ...] [--principal P] [--json]
    connect-coordinator acls delete --group orders [--allow-principal User:w] [--operation Read]

Every online command takes the admin commands' options (``--bootstrap``, ``--timeout``, the
client security settings) and talks through :class:`coordinator.admin.AdminSession`.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from connect_wire.errors import error_name
from coordinator.security import CLUSTER_NAME, SCRAM_MECHANISMS
from coordinator.security.model import (
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePatternFilter,
    ResourceType,
)
from coordinator.security.scram import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    credential_from_password,
    mechanism_code,
    mechanism_name,
    salted_password,
)
from coordinator.security.state import credential_record, credential_tombstone

__all__ = ["add_commands", "main"]

DEFAULT_ETCD_PREFIX = "/connect-coordinator"
PASSWORD_ENV = "CONNECT_USER_PASSWORD"


class CommandError(Exception):
    """Exit 1 with this message."""


class UsageError(Exception):
    """Exit 2 with this message (a setting or an option that cannot work)."""


# -- parsers ------------------------------------------------------------------------------------


def _mechanism(text: str) -> str:
    try:
        return mechanism_name(mechanism_code(text)) or text
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _operation(text: str) -> Operation:
    try:
        op = Operation.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if op in (Operation.UNKNOWN, Operation.ANY):
        raise argparse.ArgumentTypeError(f"{text!r} is not an operation an ACL can name")
    return op


def _principal(text: str) -> str:
    if ":" not in text or not text.split(":", 1)[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is not a principal TYPE:NAME, e.g. User:alice")
    return text


def add_commands(sub: Any, admin: Callable[[Any, str, str], argparse.ArgumentParser]) -> None:
    """Add ``users`` and ``acls`` to the CLI's sub-commands; ``admin(parent, name, help)`` makes
    an admin command's parser (``--bootstrap``, ``--timeout``, the client security options)."""
    users = sub.add_parser("users", help="SCRAM users: list, add, delete (online or offline)")
    usub = users.add_subparsers(dest="action", required=True, metavar="ACTION")
    ul = admin(usub, "list", "users with SCRAM credentials (all, or those named)")
    ul.add_argument("names", nargs="*", metavar="NAME")
    ul.add_argument("--json", action="store_true")
    for action, text in (("add", "add or replace a user's SCRAM credential"),
                         ("delete", "delete a user's SCRAM credential")):
        u = admin(usub, action, text + "; with --data-dir or --etcd-endpoints written to the "
                  "store directly (no coordinator may hold the data dir), else through "
                  "--bootstrap")
        u.add_argument("name", metavar="NAME", help="the user name (SASL user name)")
        u.add_argument("--mechanism", type=_mechanism, default=None if action == "delete"
                       else SCRAM_MECHANISMS[0], metavar="MECHANISM", required=action == "delete",
                       help=f"{' or '.join(SCRAM_MECHANISMS)}" + (
                           f" (default {SCRAM_MECHANISMS[0]})" if action == "add" else ""))
        if action == "add":
            u.add_argument("--password-file", metavar="FILE",
                           help="file holding the password, its final line end dropped ('-': "
                           "standard input); "
                           f"else ${PASSWORD_ENV}, else asked on the terminal")
            u.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, metavar="N",
                           help=f"PBKDF2 iterations, {MIN_ITERATIONS}-{MAX_ITERATIONS} "
                           f"(default {DEFAULT_ITERATIONS})")
        offline = u.add_argument_group("offline (no coordinator running on the store)")
        offline.add_argument("--data-dir", metavar="DIR",
                             help="store=file: write into DIR's security log")
        offline.add_argument("--etcd-endpoints", metavar="HOST:PORT[,HOST:PORT...]",
                             help="store=etcd: write into etcd")
        offline.add_argument("--etcd-prefix", metavar="PATH", default=DEFAULT_ETCD_PREFIX,
                             help=f"store=etcd: the cluster's etcd.prefix (default "
                             f"{DEFAULT_ETCD_PREFIX})")

    acls = sub.add_parser("acls", help="ACLs: list, add, delete")
    asub = acls.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("list", "ACLs matching the options (all by default)"),
                         ("add", "add ACLs: each principal x host x operation x resource"),
                         ("delete", "delete the ACLs matching the options (a resource is "
                          "required; without principals every ACL on it)")):
        a = admin(asub, action, text)
        resource = a.add_argument_group("resource")
        resource.add_argument("--group", action="append", default=[], metavar="NAME",
                              help="a group (repeatable; '*' is every group)")
        resource.add_argument("--cluster", action="store_true",
                              help=f"the cluster ({CLUSTER_NAME}): ACL and user management")
        resource.add_argument("--topic", action="append", default=[], metavar="NAME")
        resource.add_argument("--transactional-id", action="append", default=[], metavar="ID")
        resource.add_argument("--user", action="append", default=[], metavar="NAME",
                              help="a USER resource")
        choices = (("literal", "prefixed") if action == "add"
                   else ("any", "match", "literal", "prefixed"))
        default = "literal" if action != "list" else "any"
        resource.add_argument("--resource-pattern-type", choices=choices, default=default,
                              help=f"how the resource names match (default {default})")
        if action == "list":
            a.add_argument("--principal", action="append", default=[], type=_principal,
                           metavar="PRINCIPAL", help="only ACLs of this principal (repeatable)")
            a.add_argument("--json", action="store_true")
            continue
        a.add_argument("--allow-principal", action="append", default=[], type=_principal,
                       metavar="PRINCIPAL", help="e.g. User:alice, User:* (repeatable)")
        a.add_argument("--deny-principal", action="append", default=[], type=_principal,
                       metavar="PRINCIPAL")
        a.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                       help="client IP the ALLOW ACLs apply to (repeatable; default *)")
        a.add_argument("--deny-host", action="append", default=[], metavar="HOST",
                       help="client IP the DENY ACLs apply to (repeatable; default *)")
        a.add_argument("--operation", action="append", default=[], type=_operation,
                       metavar="OPERATION", required=action == "add",
                       help="Read, Write, Create, Delete, Alter, Describe, All, ... (repeatable)"
                       + ("; default: any" if action == "delete" else ""))


# -- running ----------------------------------------------------------------------------------


def main(args: argparse.Namespace, out: Any, session: Callable[[argparse.Namespace], Any]) -> int:
    """Run a ``users`` or ``acls`` command. ``session(args)``: the AdminSession of the admin
    options. Returns the exit status; raises the CLI's CliError / AdminError (exit 1) for errors
    of the coordinator or the connection."""
    try:
        if args.command == "users":
            return _users(args, out, session)
        return _acls(args, out, session)
    except UsageError as exc:
        print(f"connect-coordinator: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"connect-coordinator: {exc}", file=sys.stderr)
        return 1


def _password(args: argparse.Namespace) -> str:
    if args.password_file:
        try:
            text = (sys.stdin.read() if args.password_file == "-"
                    else Path(args.password_file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read --password-file {args.password_file}: {exc}") from None
        # the file's final line end is dropped (as --sasl-password-file)
        password = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise UsageError("the passwords differ")
    else:
        raise UsageError(f"no password: give --password-file FILE (or '-' for standard input) "
                         f"or set ${PASSWORD_ENV}")
    if not password:
        raise UsageError("the password is empty")
    return password


def _users(args: argparse.Namespace, out: Any, session: Callable[[argparse.Namespace], Any]) -> int:
    if args.action in ("add", "delete"):
        if not args.name:
            raise UsageError("the user name is empty")
        if args.action == "add" and not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
            raise UsageError(f"--iterations must be within [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")
        offline = args.data_dir is not None or args.etcd_endpoints is not None
        if offline and args.bootstrap:
            raise UsageError("give either --bootstrap (online) or --data-dir / --etcd-endpoints "
                             "(offline), not both")
        if args.data_dir is not None and args.etcd_endpoints is not None:
            raise UsageError("give --data-dir (store=file) or --etcd-endpoints (store=etcd), not both")
        if offline:
            return _users_offline(args, out)
    from kio.schema.alter_user_scram_credentials.v0 import request as alter
    from kio.schema.describe_user_scram_credentials.v0 import request as describe
    from kio.static.primitive import i8, i32

    with session(args) as client:
        if args.action == "list":
            request = describe.DescribeUserScramCredentialsRequest(
                users=tuple(describe.UserName(name=n) for n in args.names) or None)
            _, resp = client.any_call(request)
            _check(int(resp.error_code), resp.error_message)
            rows = []
            for r in resp.results:
                rows.append({"user": r.user,
                             "error": error_name(int(r.error_code)) if r.error_code else None,
                             "error_message": r.error_message,
                             "credentials": [{"mechanism": mechanism_name(int(c.mechanism))
                                              or str(int(c.mechanism)),
                                              "iterations": int(c.iterations)}
                                             for c in r.credential_infos]})
            if args.json:
                out.write(json.dumps(rows, indent=2) + "\n")
            else:
                table = [[r["user"], c["mechanism"], c["iterations"]]
                         for r in rows for c in r["credentials"]]
                out.write(_table(table, ["USER", "MECHANISM", "ITERATIONS"]) + "\n")
            failed = [r for r in rows if r["error"]]
            if failed:
                raise CommandError("; ".join(f"{r['user']}: {r['error']}: {r['error_message']}"
                                             for r in failed))
            return 0
        code = i8(mechanism_code(args.mechanism))
        if args.action == "add":
            password = _password(args)
            salt = os.urandom(32)
            request = alter.AlterUserScramCredentialsRequest(deletions=(), upsertions=(
                alter.ScramCredentialUpsertion(
                    name=args.name, mechanism=code, iterations=i32(args.iterations), salt=salt,
                    salted_password=salted_password(args.mechanism, password, salt,
                                                    args.iterations)),))
        else:
            request = alter.AlterUserScramCredentialsRequest(
                deletions=(alter.ScramCredentialDeletion(name=args.name, mechanism=code),),
                upsertions=())
        _, resp = _change(client, request)
        for r in resp.results:
            _check(int(r.error_code), r.error_message, f"user {r.user}: ")
        done = "added" if args.action == "add" else "deleted"
        out.write(f"ok: {args.mechanism} credential of user {args.name} {done}\n")
        return 0


def _change(client: Any, request: Any) -> Any:
    """A change is sent to the first bootstrap address that takes a connection; a connection
    lost after sending is not retried (the outcome is unknown, as for connectors)."""
    from coordinator.admin import AdminError, CannotConnect

    failures = []
    for address in client.bootstrap:
        try:
            return address, client._call_at(address, request)
        except CannotConnect as exc:
            failures.append(str(exc))
        except AdminError as exc:
            raise CommandError(f"{exc}; the change may or may not have been applied (check "
                               "with list)") from None
    raise CommandError("no coordinator answered: " + "; ".join(failures))


def _users_offline(args: argparse.Namespace, out: Any) -> int:
    if args.action == "add":
        record = credential_record(args.name, credential_from_password(
            args.mechanism, _password(args), args.iterations))
    else:
        record = credential_tombstone(args.name, args.mechanism)
    if args.data_dir is not None:
        from coordinator.runtime.datadir import DataDirLocked
        from coordinator.security.store import append_offline, read_offline

        if args.action == "delete" and read_offline(args.data_dir).scram_credential(
                args.name, args.mechanism) is None:
            raise CommandError(f"RESOURCE_NOT_FOUND: user {args.name} has no {args.mechanism} "
                               f"credential in {args.data_dir}")
        try:
            append_offline(args.data_dir, [record])
        except DataDirLocked as exc:
            raise CommandError(f"{exc}; stop it first, or change users online with --bootstrap") \
                from None
        except OSError as exc:
            raise CommandError(f"cannot write {args.data_dir}: {exc}") from None
        where = f"data dir {args.data_dir}"
    else:
        endpoints = [e.strip() for e in args.etcd_endpoints.split(",") if e.strip()]
        if not endpoints:
            raise UsageError("--etcd-endpoints is empty")
        if not args.etcd_prefix.startswith("/") or args.etcd_prefix.rstrip("/") == "":
            raise UsageError("--etcd-prefix must be a key path starting with '/'")
        asyncio.run(_write_etcd(endpoints, args.etcd_prefix, record, args.timeout))
        where = f"etcd {','.join(endpoints)} prefix {args.etcd_prefix}"
    done = "added" if args.action == "add" else "deleted"
    out.write(f"ok: {args.mechanism} credential of user {args.name} {done} in {where}\n")
    return 0


async def _write_etcd(endpoints: list[str], prefix: str, record: Any, timeout_s: float) -> None:
    try:
        from coordinator.runtime.etcd_store import connect, describe_error
    except ImportError as exc:
        raise UsageError(f"--etcd-endpoints needs the etcd client: pip install "
                         f"'connect-coordinator[etcd]' ({exc})") from None
    from coordinator.security.store import SecurityStoreError, write_etcd

    try:
        client = await asyncio.wait_for(connect(endpoints), timeout_s)
    except Exception as exc:  # noqa: BLE001
        raise CommandError(f"cannot use etcd at {','.join(endpoints)}: "
                           f"{describe_error(exc)}") from None
    try:
        await write_etcd(client, prefix, [record], timeout_s=timeout_s, writer="cli")
    except SecurityStoreError as exc:
        raise CommandError(str(exc)) from None
    finally:
        await client.close()


# -- ACLs -------------------------------------------------------------------------------------


def _patterns(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.GROUP, g) for g in args.group]
    out += [(ResourceType.TOPIC, t) for t in args.topic]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id]
    out += [(ResourceType.USER, u) for u in args.user]
    if args.cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return out


def _entries(args: argparse.Namespace) -> list[tuple[str, str, Permission]]:
    """(principal, host, permission) of the --allow-/--deny- options (hosts default to *)."""
    out = []
    for principals, hosts, permission in (
            (args.allow_principal, args.allow_host, Permission.ALLOW),
            (args.deny_principal, args.deny_host, Permission.DENY)):
        for p in principals:
            for h in hosts or ["*"]:
                out.append((p, h, permission))
    return out


def _acls(args: argparse.Namespace, out: Any, session: Callable[[argparse.Namespace], Any]) -> int:
    pattern_type = PatternType.parse(args.resource_pattern_type)
    patterns = _patterns(args)
    with session(args) as client:
        if args.action == "list":
            found = []
            for rtype, name in patterns or [(ResourceType.ANY, None)]:
                for principal in args.principal or [None]:
                    found += _describe(client, AclBindingFilter(
                        ResourcePatternFilter(rtype, name, pattern_type),
                        AccessControlEntryFilter(principal)))
            found = sorted(set(found))
            if args.json:
                out.write(json.dumps([_acl_json(a) for a in found], indent=2) + "\n")
            else:
                out.write(_table([[a.pattern.resource_type.name, a.pattern.pattern_type.name,
                                   a.pattern.name, a.entry.principal, a.entry.host,
                                   a.entry.operation.name, a.entry.permission.name]
                                  for a in found],
                                 ["RESOURCE_TYPE", "PATTERN", "NAME", "PRINCIPAL", "HOST",
                                  "OPERATION", "PERMISSION"]) + "\n")
            return 0
        if not patterns:
            raise UsageError("name a resource: --group NAME, --cluster, --topic NAME, "
                             "--transactional-id ID or --user NAME")
        entries = _entries(args)
        if args.action == "add":
            if not entries:
                raise UsageError("name a principal: --allow-principal or --deny-principal")
            acls = [AclBinding.of(rtype, name, principal, op, permission, host=host,
                                  pattern_type=pattern_type)
                    for rtype, name in patterns for principal, host, permission in entries
                    for op in args.operation]
            return _create(client, acls, out)
        filters = []
        ops = args.operation or [Operation.ANY]
        for rtype, name in patterns:
            resource = ResourcePatternFilter(rtype, name, pattern_type)
            if not entries:
                filters += [AclBindingFilter(resource, AccessControlEntryFilter(operation=op))
                            for op in ops]
                continue
            filters += [AclBindingFilter(resource, AccessControlEntryFilter(principal, host, op,
                                                                            permission))
                        for principal, host, permission in entries for op in ops]
        return _delete(client, filters, out)


def _acl_json(a: AclBinding) -> dict[str, str]:
    return {"resource_type": a.pattern.resource_type.name, "pattern_type": a.pattern.pattern_type.name,
            "name": a.pattern.name, "principal": a.entry.principal, "host": a.entry.host,
            "operation": a.entry.operation.name, "permission": a.entry.permission.name}


def _describe(client: Any, f: AclBindingFilter) -> list[AclBinding]:
    from kio.schema.describe_acls.v3.request import DescribeAclsRequest
    from kio.static.primitive import i8

    _, resp = client.any_call(DescribeAclsRequest(
        resource_type_filter=i8(f.pattern.resource_type), resource_name_filter=f.pattern.name,
        pattern_type_filter=i8(f.pattern.pattern_type), principal_filter=f.entry.principal,
        host_filter=f.entry.host, operation=i8(f.entry.operation),
        permission_type=i8(f.entry.permission)))
    _check(int(resp.error_code), resp.error_message)
    return [AclBinding.of(r.resource_type, r.resource_name, a.principal, a.operation,
                          a.permission_type, host=a.host, pattern_type=r.pattern_type)
            for r in resp.resources for a in r.acls]


def _create(client: Any, acls: list[AclBinding], out: Any) -> int:
    from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest
    from kio.static.primitive import i8

    _, resp = _change(client, CreateAclsRequest(creations=tuple(
        AclCreation(resource_type=i8(a.pattern.resource_type), resource_name=a.pattern.name,
                    resource_pattern_type=i8(a.pattern.pattern_type),
                    principal=a.entry.principal, host=a.entry.host,
                    operation=i8(a.entry.operation), permission_type=i8(a.entry.permission))
        for a in acls)))
    failed = []
    for acl, r in zip(acls, resp.results, strict=False):
        if int(r.error_code):
            failed.append(f"{acl}: {error_name(int(r.error_code))}: {r.error_message}")
        else:
            out.write(f"added: {acl}\n")
    if failed or len(resp.results) != len(acls):
        raise CommandError("; ".join(failed) or "the answer does not cover every ACL")
    return 0


def _delete(client: Any, filters: list[AclBindingFilter], out: Any) -> int:
    from kio.schema.delete_acls.v3.request import DeleteAclsFilter, DeleteAclsRequest
    from kio.static.primitive import i8

    _, resp = _change(client, DeleteAclsRequest(filters=tuple(
        DeleteAclsFilter(resource_type_filter=i8(f.pattern.resource_type),
                         resource_name_filter=f.pattern.name,
                         pattern_type_filter=i8(f.pattern.pattern_type),
                         principal_filter=f.entry.principal, host_filter=f.entry.host,
                         operation=i8(f.entry.operation), permission_type=i8(f.entry.permission))
        for f in filters)))
    failed, deleted = [], set()
    for r in resp.filter_results:
        if int(r.error_code):
            failed.append(f"{error_name(int(r.error_code))}: {r.error_message}")
            continue
        for a in r.matching_acls:
            deleted.add(AclBinding.of(a.resource_type, a.resource_name, a.principal, a.operation,
                                      a.permission_type, host=a.host, pattern_type=a.pattern_type))
    for acl in sorted(deleted):
        out.write(f"deleted: {acl}\n")
    if not deleted and not failed:
        out.write("no ACL matched\n")
    if failed:
        raise CommandError("; ".join(failed))
    return 0


# -- helpers ----------------------------------------------------------------------------------


def _check(code: int, message: str | None, prefix: str = "") -> None:
    if code:
        raise CommandError(f"{prefix}{error_name(code)}: {message or 'no message'}")


def _table(rows: list[list[Any]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), *(fmt.format(*map(str, r)) for r in rows)])
