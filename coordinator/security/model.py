"""ACLs and the authorizer, as Kafka's StandardAuthorizer decides (pure: no I/O, no clock).

Vocabulary (Kafka's codes, which are also the wire codes of the ACL APIs):

* :class:`ResourceType`, :class:`PatternType`, :class:`Operation`, :class:`Permission`;
* :class:`ResourcePattern` (type, name, LITERAL or PREFIXED) + :class:`AccessControlEntry`
  (principal, host, operation, ALLOW or DENY) = :class:`AclBinding`, one ACL;
* :class:`AclBindingFilter` (Kafka's AclBindingFilter: ANY / MATCH pattern types, None for any
  name, principal or host, ANY operation and permission) selects ACLs for DescribeAcls and
  DeleteAcls.

:class:`Authorizer` holds the ACLs and decides one action as StandardAuthorizer does
(``StandardAuthorizerData.authorize``):

1. a principal listed in ``super.users`` is allowed everything;
2. the ACLs *on the resource* are those of its type whose pattern matches its name: LITERAL
   with the same name, LITERAL ``*`` (any name), PREFIXED with a prefix of the name;
3. none at all: allowed only with ``allow.everyone.if.no.acl.found`` (default false);
4. an ACL *applies* when its principal is the requester's or ``User:*`` and its host is the
   requester's or ``*``. A DENY that applies, for the operation or ALL, denies (DENY wins);
5. else an ALLOW that applies, for the operation, ALL, or an operation that implies it (READ,
   WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS), allows;
6. else denied.

Principals are Kafka's strings (``User:alice``; see :mod:`coordinator.security`); hosts are the
client's IP address, compared with an ACL's host as IP addresses when both are one
(``0:0:0:0:0:0:0:1`` is ``::1``, ``::ffff:10.0.0.1`` is ``10.0.0.1``), else as strings.
tests/test_security_model.py checks the authorizer against a brute-force reading of these rules.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple, Self

from coordinator.security import CLUSTER_NAME

__all__ = [
    "ALL_ACLS",
    "AccessControlEntry",
    "AccessControlEntryFilter",
    "AclBinding",
    "AclBindingFilter",
    "Authorizer",
    "Decision",
    "Operation",
    "PatternType",
    "Permission",
    "ResourcePattern",
    "ResourcePatternFilter",
    "ResourceType",
    "WILDCARD_HOST",
    "WILDCARD_PRINCIPAL",
    "WILDCARD_RESOURCE",
    "parse_super_users",
]

WILDCARD_RESOURCE = "*"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"


@functools.lru_cache(maxsize=4096)
def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 one as its IPv4 address); None when it
    is not one (a name: compared as a string)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _same_host(acl_host: str, host: str) -> bool:
    """An ACL's host and a client's address are compared as IP addresses when both are one:
    Kafka writes ``0:0:0:0:0:0:0:1`` (Java's getHostAddress), Python ``::1``; a client on an
    IPv6 socket is ``::ffff:10.0.0.1`` for the ACL ``10.0.0.1``."""
    a = _address(acl_host)
    return a is not None and a == _address(host)


_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")


class _Named(IntEnum):
    """An enum with Kafka's codes, parsed from a code, a member or a name in any case
    (``"read"``, ``"Read"``, ``"DESCRIBE_CONFIGS"``, ``"describe-configs"``,
    ``"DescribeConfigs"``)."""

    @classmethod
    def parse(cls, value: int | str | _Named) -> Self:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            # (CamelCase as kafka-acls.sh writes it: DescribeConfigs, ClusterAction)
            name = _CAMEL.sub("_", value.strip()).upper().replace("-", "_")
            try:
                return cls[name]
            except KeyError:
                raise ValueError(f"unknown {cls.__name__} {value!r} (one of "
                                 f"{', '.join(m.name for m in cls if m.value > 1)})") from None
        return cls.from_code(int(value))

    @classmethod
    def from_code(cls, code: int) -> Self:
        """The member with this code; UNKNOWN for a code this build does not know (as Kafka's
        ``fromCode``)."""
        try:
            return cls(code)
        except ValueError:
            return cls(0)


class ResourceType(_Named):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_Named):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(_Named):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(_Named):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE,
                              Operation.DELETE, Operation.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})


# -- bindings ---------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __str__(self) -> str:
        return f"{self.resource_type.name}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, order=True)
class AccessControlEntry:
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def __str__(self) -> str:
        return (f"{self.permission.name} {self.principal} {self.operation.name} from "
                f"{self.host}")


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL: an entry on a resource pattern."""

    pattern: ResourcePattern
    entry: AccessControlEntry

    @classmethod
    def of(cls, resource_type: ResourceType | str | int, name: str, principal: str,
           operation: Operation | str | int, permission: Permission | str | int = Permission.ALLOW,
           *, host: str = WILDCARD_HOST,
           pattern_type: PatternType | str | int = PatternType.LITERAL) -> AclBinding:
        return cls(
            ResourcePattern(ResourceType.parse(resource_type), name,
                            PatternType.parse(pattern_type)),
            AccessControlEntry(principal, host, Operation.parse(operation),
                               Permission.parse(permission)))

    def invalid(self) -> str | None:
        """Why this ACL cannot be created (Kafka's ``AclControlManager.validateNewAcl`` and
        AclApis' checks), or None."""
        p, e = self.pattern, self.entry
        if p.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            return f"Invalid resourceType {p.resource_type.name}"
        if p.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"Invalid patternType {p.pattern_type.name}"
        if e.operation in (Operation.UNKNOWN, Operation.ANY):
            return f"Invalid operation {e.operation.name}"
        if e.permission not in (Permission.ALLOW, Permission.DENY):
            return f"Invalid permissionType {e.permission.name}"
        if not p.name:
            return "Resource name should not be empty"
        if p.resource_type is ResourceType.CLUSTER and p.name != CLUSTER_NAME:
            return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        if ":" not in e.principal:
            return (f"Could not parse principal from `{e.principal}` (no colon is present "
                    "separating the principal type from the principal name)")
        if not e.host:
            return "Host should not be empty (use * for any host)"
        return None

    def __str__(self) -> str:
        return f"{self.entry} on {self.pattern}"


# -- filters ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourcePatternFilter:
    """Kafka's ResourcePatternFilter: ``resource_type`` ANY matches every type; ``name`` None
    every name; ``pattern_type`` ANY matches both pattern types by name, MATCH matches the
    patterns that would apply to a resource called ``name`` (LITERAL equal or ``*``, PREFIXED
    whose prefix starts ``name``)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY

    def is_unknown(self) -> bool:
        return (self.resource_type is ResourceType.UNKNOWN
                or self.pattern_type is PatternType.UNKNOWN)

    def matches(self, pattern: ResourcePattern) -> bool:
        if self.resource_type is not ResourceType.ANY and self.resource_type != pattern.resource_type:
            return False
        if (self.pattern_type not in (PatternType.ANY, PatternType.MATCH)
                and self.pattern_type != pattern.pattern_type):
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        # MATCH
        if pattern.pattern_type is PatternType.LITERAL:
            return self.name == pattern.name or pattern.name == WILDCARD_RESOURCE
        if pattern.pattern_type is PatternType.PREFIXED:
            return self.name.startswith(pattern.name)
        return False


@dataclass(frozen=True)
class AccessControlEntryFilter:
    """Kafka's AccessControlEntryFilter: None matches any principal / host, ANY any operation /
    permission; anything else must be equal (``User:*`` and ``*`` are not wildcards here)."""

    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def is_unknown(self) -> bool:
        return (self.operation is Operation.UNKNOWN
                or self.permission is Permission.UNKNOWN)

    def matches(self, entry: AccessControlEntry) -> bool:
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation is not Operation.ANY and self.operation != entry.operation:
            return False
        return self.permission is Permission.ANY or self.permission == entry.permission


@dataclass(frozen=True)
class AclBindingFilter:
    pattern: ResourcePatternFilter = field(default_factory=ResourcePatternFilter)
    entry: AccessControlEntryFilter = field(default_factory=AccessControlEntryFilter)

    def is_unknown(self) -> bool:
        return self.pattern.is_unknown() or self.entry.is_unknown()

    def unknown_reason(self) -> str | None:
        """Why Kafka refuses this filter (an UNKNOWN element), or None."""
        if self.pattern.is_unknown():
            return "Unknown patternFilter."
        if self.entry.is_unknown():
            return "Unknown entryFilter."
        return None

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern.matches(binding.pattern) and self.entry.matches(binding.entry)


ALL_ACLS = AclBindingFilter()
"""The filter matching every ACL."""


# -- the authorizer ---------------------------------------------------------------------------


class Decision(NamedTuple):
    """An authorization decision and why (for the log and the error message)."""

    allowed: bool
    reason: str  # "super user", "acl", "no acl: allow.everyone.if.no.acl.found", "no acl", "denied"
    acl: AclBinding | None = None

    def __bool__(self) -> bool:
        return self.allowed


def parse_super_users(text: str | Iterable[str]) -> frozenset[str]:
    """Kafka's ``super.users``: principals separated by ``;`` (``User:admin;User:ops``)."""
    parts = text.split(";") if isinstance(text, str) else list(text)
    return frozenset(p.strip() for p in parts if p.strip())


class Authorizer:
    """The ACLs and Kafka's authorization decision over them (see the module doc).

    ACLs are indexed by (resource type, name) for LITERAL patterns and by resource type then
    prefix for PREFIXED ones, so a decision looks at the ACLs on its resource only: one dict
    look-up per literal name (the name, ``*``) and one per length that a PREFIXED name of the type
    has. A filter naming a resource finds its candidates the same way (DeleteAcls, DescribeAcls)."""

    def __init__(self, super_users: str | Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False,
                 acls: Iterable[AclBinding] = ()) -> None:
        self.super_users = parse_super_users(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._acls: set[AclBinding] = set()
        self._literal: dict[tuple[ResourceType, str], set[AclBinding]] = {}
        self._prefixed: dict[ResourceType, dict[str, set[AclBinding]]] = {}
        # The lengths of the PREFIXED names of each type (length -> how many names): a name is
        # looked up at these lengths only, not at each of its own.
        self._prefix_lengths: dict[ResourceType, Counter[int]] = {}
        for acl in acls:
            self.add(acl)

    # -- the ACL set --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._acls)

    def __contains__(self, acl: object) -> bool:
        return acl in self._acls

    def __iter__(self) -> Iterator[AclBinding]:
        return iter(sorted(self._acls))

    def add(self, acl: AclBinding) -> bool:
        """Add one ACL; False if it was there already."""
        if acl in self._acls:
            return False
        self._acls.add(acl)
        p = acl.pattern
        if p.pattern_type is PatternType.PREFIXED:
            by_prefix = self._prefixed.setdefault(p.resource_type, {})
            if p.name not in by_prefix:
                self._prefix_lengths.setdefault(p.resource_type, Counter())[len(p.name)] += 1
            by_prefix.setdefault(p.name, set()).add(acl)
        else:
            self._literal.setdefault((p.resource_type, p.name), set()).add(acl)
        return True

    def remove(self, acl: AclBinding) -> bool:
        """Remove one ACL; False if it was not there."""
        if acl not in self._acls:
            return False
        self._acls.discard(acl)
        p = acl.pattern
        if p.pattern_type is PatternType.PREFIXED:
            by_prefix = self._prefixed[p.resource_type]
            by_prefix[p.name].discard(acl)
            if not by_prefix[p.name]:
                del by_prefix[p.name]
                lengths = self._prefix_lengths[p.resource_type]
                lengths[len(p.name)] -= 1
                if not lengths[len(p.name)]:
                    del lengths[len(p.name)]
                if not by_prefix:
                    del self._prefixed[p.resource_type]
                    del self._prefix_lengths[p.resource_type]
        else:
            bucket = self._literal[(p.resource_type, p.name)]
            bucket.discard(acl)
            if not bucket:
                del self._literal[(p.resource_type, p.name)]
        return True

    def clear(self) -> None:
        self._acls.clear()
        self._literal.clear()
        self._prefixed.clear()
        self._prefix_lengths.clear()

    def matching(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """Every ACL ``acl_filter`` matches, sorted. A filter naming a resource looks at the
        ACLs on that name only (the index); one without a name looks at every ACL."""
        candidates = self.candidates(acl_filter)
        return sorted(a for a in (self._acls if candidates is None else candidates)
                      if acl_filter.matches(a))

    def candidates(self, acl_filter: AclBindingFilter) -> list[AclBinding] | None:
        """The ACLs ``acl_filter`` may match, from the index (a superset of its matches);
        None when it names no resource (every ACL is a candidate)."""
        p = acl_filter.pattern
        if p.name is None:
            return None
        types = ([p.resource_type] if p.resource_type is not ResourceType.ANY
                 else list(ResourceType)[2:])
        out: list[AclBinding] = []
        for rtype in types:
            if p.pattern_type is PatternType.MATCH:
                out.extend(self.on_resource(rtype, p.name))
                continue
            if p.pattern_type in (PatternType.ANY, PatternType.LITERAL):
                out.extend(self._literal.get((rtype, p.name), ()))
            if p.pattern_type in (PatternType.ANY, PatternType.PREFIXED):
                out.extend(self._prefixed.get(rtype, {}).get(p.name, ()))
        return out

    def work(self, acl_filter: AclBindingFilter) -> int:
        """How many ACLs :meth:`matching` looks at for ``acl_filter`` (index look-ups
        counted as one each)."""
        candidates = self.candidates(acl_filter)
        return len(self._acls) if candidates is None else len(candidates) + 1

    def on_resource(self, resource_type: ResourceType, name: str) -> Iterator[AclBinding]:
        """The ACLs whose pattern matches the resource (step 2 of the module doc)."""
        literal = self._literal
        yield from literal.get((resource_type, name), ())
        if name != WILDCARD_RESOURCE:
            yield from literal.get((resource_type, WILDCARD_RESOURCE), ())
        by_prefix = self._prefixed.get(resource_type)
        if by_prefix:
            for end in self._prefix_lengths[resource_type]:
                if end <= len(name):
                    bucket = by_prefix.get(name[:end])
                    if bucket:
                        yield from bucket

    # -- decisions --------------------------------------------------------------------------------
    def decide(self, principal: str, host: str, operation: Operation | str | int,
               resource_type: ResourceType | str | int, name: str) -> Decision:
        """Kafka's decision for ``principal`` at ``host`` doing ``operation`` on the resource."""
        if principal in self.super_users:
            return Decision(True, "super user")
        op = Operation.parse(operation)
        rtype = ResourceType.parse(resource_type)
        found = False
        allow: AclBinding | None = None
        for acl in self.on_resource(rtype, name):
            found = True
            e = acl.entry
            if e.principal != principal and e.principal != WILDCARD_PRINCIPAL:
                continue
            if e.host != WILDCARD_HOST and e.host != host and not _same_host(e.host, host):
                continue
            if e.permission is Permission.DENY:
                if e.operation is Operation.ALL or e.operation == op:
                    return Decision(False, "denied by acl", acl)
                continue
            if allow is None and _allow_covers(e.operation, op):
                allow = acl
        if allow is not None:
            return Decision(True, "acl", allow)
        if not found:
            if self.allow_everyone_if_no_acl_found:
                return Decision(True, "no acl on the resource (allow.everyone.if.no.acl.found)")
            return Decision(False, "no acl on the resource")
        return Decision(False, "no acl allows it")

    def authorize(self, principal: str, host: str, operation: Operation | str | int,
                  resource_type: ResourceType | str | int, name: str) -> bool:
        return self.decide(principal, host, operation, resource_type, name).allowed


def _allow_covers(acl_op: Operation, op: Operation) -> bool:
    if acl_op is Operation.ALL or acl_op == op:
        return True
    if op is Operation.DESCRIBE:
        return acl_op in IMPLIES_DESCRIBE
    if op is Operation.DESCRIBE_CONFIGS:
        return acl_op in IMPLIES_DESCRIBE_CONFIGS
    return False
