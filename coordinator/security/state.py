"""The security state: SCRAM credentials and ACLs, built by replaying their records (sans-IO).

:class:`SecurityState` implements :class:`coordinator.security.Security` (``scram_credential``,
``authorize``) for the transport, plus the helpers the request router needs for groups
(:meth:`SecurityState.authorize_group`, :meth:`SecurityState.visible_groups`). It is changed only
by :meth:`SecurityState.apply` of records, in the order a store hands them over; every record
key is independent of the others (the latest value of each key is the state), so any order
that keeps each key's own order builds the same state.

Records (``connect_wire.records``, schemas in ``schemas/records/``)::

    UserScramCredentialKey(Name, Mechanism)  -> UserScramCredentialValue(Salt, StoredKey,
                                                ServerKey, Iterations) | tombstone
    AccessControlEntryKey(ResourceType, ResourceName, PatternType, Principal, Host, Operation,
                          PermissionType)    -> AccessControlEntryValue(CreatedAtMs) | tombstone

Mutations are values in, records out: the ``alter_*``, ``create_*`` and ``delete_*`` methods
check a request as Kafka's controller does (per-user and per-ACL errors) and return the
results and the records that make the change, WITHOUT applying them; the store makes the
records durable and then applies them (:mod:`coordinator.security.store`). Reads
(``describe_*``) answer from the state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from connect_wire.records import (
    AccessControlEntryKey,
    AccessControlEntryValue,
    UserScramCredentialKey,
    UserScramCredentialValue,
)
from coordinator.group.records import Record
from coordinator.security import CLUSTER_NAME, ScramCredential
from coordinator.security.model import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    Authorizer,
    Decision,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from coordinator.security.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    credential_from_salted_password,
    mechanism_code,
    mechanism_name,
)

__all__ = [
    "MAX_DELETE_WORK",
    "AclDeleteResult",
    "ItemResult",
    "RECORD_TYPES",
    "ScramUpsertion",
    "SecurityState",
    "UserDescription",
    "acl_from_key",
    "acl_record",
    "acl_tombstone",
    "credential_record",
    "credential_tombstone",
    "is_security_record",
]

# Kafka's error codes used in per-item results (kio.schema.errors.ErrorCode numbers).
NONE = 0
INVALID_REQUEST = 42
UNSUPPORTED_SASL_MECHANISM = 33
RESOURCE_NOT_FOUND = 91
DUPLICATE_RESOURCE = 92
UNACCEPTABLE_CREDENTIAL = 93

MAX_DELETE_WORK = 200_000
"""The most ACLs one DeleteAcls request may examine, or every ACL once if there are more (a
filter without a resource name examines every ACL; one naming a resource only the ACLs on
that name): measured 1-2 us each, so a few tenths of a second of the event loop
(docs/security.md)."""

RECORD_TYPES = frozenset({UserScramCredentialKey.__api_key__, AccessControlEntryKey.__api_key__})
"""The record type ids of the security records (8, 9)."""


# -- records ----------------------------------------------------------------------------------


def credential_record(user: str, credential: ScramCredential) -> Record:
    return Record(
        UserScramCredentialKey(name=user, mechanism=mechanism_code(credential.mechanism)),
        UserScramCredentialValue(salt=credential.salt, stored_key=credential.stored_key,
                                 server_key=credential.server_key,
                                 iterations=credential.iterations))


def credential_tombstone(user: str, mechanism: str) -> Record:
    return Record(UserScramCredentialKey(name=user, mechanism=mechanism_code(mechanism)), None)


def acl_key(acl: AclBinding) -> AccessControlEntryKey:
    p, e = acl.pattern, acl.entry
    return AccessControlEntryKey(
        resource_type=int(p.resource_type), resource_name=p.name, pattern_type=int(p.pattern_type),
        principal=e.principal, host=e.host, operation=int(e.operation),
        permission_type=int(e.permission))


def acl_from_key(key: AccessControlEntryKey) -> AclBinding:
    return AclBinding(
        ResourcePattern(ResourceType.from_code(key.resource_type), key.resource_name,
                        PatternType.from_code(key.pattern_type)),
        AccessControlEntry(key.principal, key.host, Operation.from_code(key.operation),
                           Permission.from_code(key.permission_type)))


def acl_record(acl: AclBinding, now_ms: int = 0) -> Record:
    return Record(acl_key(acl), AccessControlEntryValue(created_at_ms=now_ms))


def acl_tombstone(acl: AclBinding) -> Record:
    return Record(acl_key(acl), None)


def is_security_record(record: Record) -> bool:
    return type(record.key).__api_key__ in RECORD_TYPES


# -- results ----------------------------------------------------------------------------------


class ItemResult(NamedTuple):
    """One user's or one ACL creation's outcome: Kafka's error code (0: done) and message."""

    code: int = NONE
    message: str | None = None


class UserResult(NamedTuple):
    user: str
    code: int = NONE
    message: str | None = None


@dataclass(frozen=True)
class ScramUpsertion:
    """An AlterUserScramCredentials upsertion: the client salted the password itself."""

    user: str
    mechanism: int  # Kafka's type code: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class UserDescription:
    """A DescribeUserScramCredentials result: (mechanism code, iterations) per credential."""

    user: str
    code: int = NONE
    message: str | None = None
    credentials: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class AclDeleteResult:
    """One DeleteAcls filter's outcome: its error, and the ACLs it deleted."""

    code: int = NONE
    message: str | None = None
    deleted: tuple[AclBinding, ...] = field(default=())


# -- the state --------------------------------------------------------------------------------


class SecurityState:
    """Credentials and ACLs (see the module doc). ``authorizer`` carries ``super.users`` and
    ``allow.everyone.if.no.acl.found``; its ACLs are this state's."""

    def __init__(self, authorizer: Authorizer | None = None) -> None:
        self.authorizer = authorizer if authorizer is not None else Authorizer()
        self.authorizer.clear()
        self._credentials: dict[tuple[str, str], ScramCredential] = {}
        self._created: dict[AclBinding, int] = {}
        self.version = 0
        """Bumped by every change (a cache of decisions can key on it)."""

    # -- the Security interface -------------------------------------------------------------------
    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._credentials.get((user, mechanism))

    def authorize(self, principal: str, host: str, operation: str | Operation,
                  resource_type: str | ResourceType, name: str) -> bool:
        return self.authorizer.decide(principal, host, operation, resource_type, name).allowed

    # -- helpers for the router --------------------------------------------------------------------
    def decide(self, principal: str, host: str, operation: str | Operation,
               resource_type: str | ResourceType, name: str) -> Decision:
        """:meth:`authorize` with the reason (for logs and error messages)."""
        return self.authorizer.decide(principal, host, operation, resource_type, name)

    def authorize_group(self, principal: str, host: str, operation: str | Operation,
                        group_id: str) -> bool:
        """``operation`` (READ, DESCRIBE, ALTER...) on the group ``group_id``."""
        return self.authorizer.decide(principal, host, operation, ResourceType.GROUP,
                                      group_id).allowed

    def authorize_cluster(self, principal: str, host: str, operation: str | Operation) -> bool:
        """``operation`` on the cluster resource (``kafka-cluster``)."""
        return self.authorizer.decide(principal, host, operation, ResourceType.CLUSTER,
                                      CLUSTER_NAME).allowed

    def visible_groups(self, principal: str, host: str, group_ids: Iterable[str]) -> list[str]:
        """The groups ListGroups shows ``principal``, as Kafka's KafkaApis.handleListGroups:
        every group with DESCRIBE on the cluster, else those it may DESCRIBE (in the order
        given)."""
        ids = list(group_ids)
        if self.authorize_cluster(principal, host, Operation.DESCRIBE):
            return ids
        return [g for g in ids if self.authorize_group(principal, host, Operation.DESCRIBE, g)]

    # -- reading ------------------------------------------------------------------------------------
    @property
    def users(self) -> list[str]:
        return sorted({user for user, _ in self._credentials})

    def credentials_of(self, user: str) -> dict[str, ScramCredential]:
        return {m: c for (u, m), c in self._credentials.items() if u == user}

    @property
    def acls(self) -> list[AclBinding]:
        return list(self.authorizer)

    def records(self) -> list[Record]:
        """The live state as records (what a compacted log or the etcd keys hold)."""
        out = [credential_record(user, c) for (user, _), c in sorted(self._credentials.items())]
        out += [acl_record(a, self._created.get(a, 0)) for a in self.authorizer]
        return out

    # -- replay -------------------------------------------------------------------------------------
    def apply(self, record: Record) -> None:
        """Apply one security record (a tombstone deletes). A record of another type raises
        ValueError; a credential of a mechanism this build does not know is ignored (a newer
        version's), as is an ACL with codes it does not know (it could never match)."""
        key, value = record
        if isinstance(key, UserScramCredentialKey):
            mechanism = mechanism_name(key.mechanism)
            if mechanism is None:
                return
            if value is None:
                self._credentials.pop((key.name, mechanism), None)
            else:
                self._credentials[(key.name, mechanism)] = ScramCredential(
                    mechanism, value.salt, value.stored_key, value.server_key, value.iterations)
        elif isinstance(key, AccessControlEntryKey):
            acl = acl_from_key(key)
            if value is None:
                self.authorizer.remove(acl)
                self._created.pop(acl, None)
            elif _loadable(acl):
                self.authorizer.add(acl)
                self._created[acl] = value.created_at_ms
        else:
            raise ValueError(f"not a security record: {type(key).__name__}")
        self.version += 1

    def replay(self, records: Iterable[Record]) -> None:
        for record in records:
            self.apply(record)

    def reset(self, records: Iterable[Record]) -> None:
        """Forget everything and replay ``records`` (a store's whole live state)."""
        self._credentials.clear()
        self._created.clear()
        self.authorizer.clear()
        self.replay(records)
        self.version += 1

    # -- SCRAM credentials (AlterUserScramCredentials / DescribeUserScramCredentials) ---------------
    def describe_scram_credentials(self, users: Sequence[str] | None) -> list[UserDescription]:
        """Kafka's semantics: None or empty describes every user with a credential; a user
        named twice gets DUPLICATE_RESOURCE, one without a credential RESOURCE_NOT_FOUND."""
        def described(user: str) -> UserDescription:
            infos = tuple(sorted((mechanism_code(m), c.iterations)
                                 for m, c in self.credentials_of(user).items()))
            return UserDescription(user, credentials=infos)

        if not users:
            return [described(u) for u in self.users]
        counts = Counter(users)
        out = []
        for user in dict.fromkeys(users):
            if counts[user] > 1:
                out.append(UserDescription(user, DUPLICATE_RESOURCE,
                                           "Cannot describe SCRAM credentials for the same user "
                                           f"twice in a single request: {user}"))
            elif not self.credentials_of(user):
                out.append(UserDescription(user, RESOURCE_NOT_FOUND,
                                           f"Attempt to describe a user credential that does not "
                                           f"exist: {user}"))
            else:
                out.append(described(user))
        return out

    def alter_scram_credentials(self, deletions: Sequence[tuple[str, int]],
                                upsertions: Sequence[ScramUpsertion]
                                ) -> tuple[list[UserResult], list[Record]]:
        """Kafka's ScramControlManager.alterCredentials: a user may appear once in a request
        (deletions and upsertions together; again: DUPLICATE_RESOURCE); a deletion of a
        credential that does not exist is RESOURCE_NOT_FOUND; an unknown mechanism
        UNSUPPORTED_SASL_MECHANISM; iterations outside [4096, 16384], an empty user name, salt
        or salted password UNACCEPTABLE_CREDENTIAL. The valid changes are made (their records
        returned) even when others fail. Results: deletions, upsertions, then errors."""
        deleting: dict[str, tuple[str, int]] = {}
        upserting: dict[str, ScramUpsertion] = {}
        errors: dict[str, ItemResult] = {}
        duplicate = ItemResult(DUPLICATE_RESOURCE,
                               "A user credential cannot be altered twice in the same request")
        for user, code in deletions:
            if user in errors:
                continue
            if deleting.pop(user, None) is not None:
                errors[user] = duplicate
                continue
            problem = self._deletion_problem(user, code)
            if problem is not None:
                errors[user] = problem
            else:
                deleting[user] = (user, code)
        for up in upsertions:
            if up.user in errors:
                continue
            if deleting.pop(up.user, None) is not None or upserting.pop(up.user, None) is not None:
                errors[up.user] = duplicate
                continue
            problem = _upsertion_problem(up)
            if problem is not None:
                errors[up.user] = problem
            else:
                upserting[up.user] = up
        results: list[UserResult] = []
        records: list[Record] = []
        for user, code in deleting.values():
            results.append(UserResult(user))
            records.append(credential_tombstone(user, mechanism_name(code) or ""))
        for up in upserting.values():
            mechanism = mechanism_name(up.mechanism)
            assert mechanism is not None
            results.append(UserResult(up.user))
            records.append(credential_record(up.user, credential_from_salted_password(
                mechanism, up.salt, up.salted_password, up.iterations)))
        results += [UserResult(user, r.code, r.message) for user, r in errors.items()]
        return results, records

    def _deletion_problem(self, user: str, code: int) -> ItemResult | None:
        mechanism = mechanism_name(code)
        if mechanism is None:
            return ItemResult(UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {code}")
        if (user, mechanism) not in self._credentials:
            return ItemResult(RESOURCE_NOT_FOUND,
                              "Attempt to delete a user credential that does not exist")
        return None

    # -- ACLs (CreateAcls / DescribeAcls / DeleteAcls) --------------------------------------------
    def describe_acls(self, acl_filter: AclBindingFilter) -> tuple[ItemResult, list[AclBinding]]:
        reason = acl_filter.unknown_reason()
        if reason is not None:
            return ItemResult(INVALID_REQUEST, reason), []
        return ItemResult(), self.authorizer.matching(acl_filter)

    def create_acls(self, acls: Sequence[AclBinding], now_ms: int = 0
                    ) -> tuple[list[ItemResult], list[Record]]:
        """One result per ACL, in order: INVALID_REQUEST for an ACL Kafka would refuse; an ACL
        that exists already is a success that writes nothing (as Kafka)."""
        results: list[ItemResult] = []
        records: list[Record] = []
        seen: set[AclBinding] = set()
        for acl in acls:
            problem = acl.invalid()
            if problem is not None:
                results.append(ItemResult(INVALID_REQUEST, problem))
                continue
            results.append(ItemResult())
            if acl not in self.authorizer and acl not in seen:
                seen.add(acl)
                records.append(acl_record(acl, now_ms))
        return results, records

    def delete_acls(self, filters: Sequence[AclBindingFilter],
                    max_work: int = MAX_DELETE_WORK
                    ) -> tuple[list[AclDeleteResult], list[Record]]:
        """One result per filter with the ACLs it matched (an ACL matched by several filters is
        listed by each, deleted once); a filter with an UNKNOWN element is INVALID_REQUEST.
        A filter naming a resource looks at that name's ACLs only; one without a name at
        every ACL. A request that would look at more than ``max_work`` ACLs in all (or than
        every ACL once, if there are more) is refused (INVALID_REQUEST on every filter, nothing
        deleted): it would hold the event loop for seconds."""
        work = sum(self.authorizer.work(f) for f in filters if f.unknown_reason() is None)
        max_work = max(max_work, len(self.authorizer))  # one whole scan is always allowed
        if work > max_work:
            scans = sum(1 for f in filters if f.pattern.name is None)
            message = (f"DeleteAcls would examine {work} ACLs ({len(filters)} filters, {scans} "
                       f"of them without a resource name, each examining all "
                       f"{len(self.authorizer)} ACLs), more than {max_work} per request: send "
                       "fewer filters per request or name the resource in each")
            return [AclDeleteResult(INVALID_REQUEST, message) for _ in filters], []
        results: list[AclDeleteResult] = []
        records: list[Record] = []
        gone: set[AclBinding] = set()
        for f in filters:
            reason = f.unknown_reason()
            if reason is not None:
                results.append(AclDeleteResult(INVALID_REQUEST, reason))
                continue
            matched = self.authorizer.matching(f)
            results.append(AclDeleteResult(deleted=tuple(matched)))
            for acl in matched:
                if acl not in gone:
                    gone.add(acl)
                    records.append(acl_tombstone(acl))
        return results, records

    def __repr__(self) -> str:
        return (f"SecurityState({len(self._credentials)} credentials, "
                f"{len(self.authorizer)} ACLs)")


def _loadable(acl: AclBinding) -> bool:
    """An ACL a record holds is loaded unless it has codes this build does not know."""
    p, e = acl.pattern, acl.entry
    return (p.resource_type.value > 1 and p.pattern_type.value > 2 and e.operation.value > 1
            and e.permission.value > 1)


def _upsertion_problem(up: ScramUpsertion) -> ItemResult | None:
    if mechanism_name(up.mechanism) is None:
        return ItemResult(UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {up.mechanism}")
    if not up.user:
        return ItemResult(UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    if up.iterations < MIN_ITERATIONS:
        return ItemResult(UNACCEPTABLE_CREDENTIAL,
                          f"Too few iterations: {up.iterations} (at least {MIN_ITERATIONS})")
    if up.iterations > MAX_ITERATIONS:
        return ItemResult(UNACCEPTABLE_CREDENTIAL,
                          f"Too many iterations: {up.iterations} (at most {MAX_ITERATIONS})")
    if not up.salt:
        return ItemResult(UNACCEPTABLE_CREDENTIAL, "Salt must not be empty")
    if not up.salted_password:
        return ItemResult(UNACCEPTABLE_CREDENTIAL, "Salted password must not be empty")
    return None
