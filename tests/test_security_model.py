"""The authorizer and the ACL filters against brute-force readings of Kafka's rules
(StandardAuthorizerData.authorize, ResourcePatternFilter / AccessControlEntryFilter.matches),
plus the cases the issue names."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.security.model import (
    ALL_ACLS,
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    parse_super_users,
)

PROPERTY = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Small alphabets so that names, prefixes, principals and hosts collide often.
NAMES = st.sampled_from(["", "a", "ab", "abc", "b", "ba", "*", "*a"])
RESOURCE_NAMES = NAMES.filter(bool)
PRINCIPALS = st.sampled_from(["User:alice", "User:bob", "User:*", "User:ANONYMOUS", "Group:x"])
REQUESTERS = st.sampled_from(["User:alice", "User:bob", "User:ANONYMOUS", "Group:x", "User:*"])
HOSTS = st.sampled_from(["*", "10.0.0.1", "10.0.0.2"])
REQUEST_HOSTS = st.sampled_from(["10.0.0.1", "10.0.0.2", "*"])
RESOURCE_TYPES = st.sampled_from([ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TOPIC])
# Biased towards the operations the rules treat specially (ALL, the implied ones).
_SPECIAL = [Operation.ALL, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER,
            Operation.DESCRIBE, Operation.ALTER_CONFIGS, Operation.DESCRIBE_CONFIGS]
CONCRETE_OPS = st.sampled_from(_SPECIAL) | st.sampled_from([op for op in Operation if op.value >= 2])
REQUEST_OPS = (st.sampled_from([Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.READ])
               | st.sampled_from([op for op in Operation if op.value >= 3]))
PERMISSIONS = st.sampled_from([Permission.ALLOW, Permission.DENY])
PATTERN_TYPES = st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED])

acls = st.builds(
    lambda rtype, name, ptype, principal, host, op, perm: AclBinding(
        ResourcePattern(rtype, name, ptype), AccessControlEntry(principal, host, op, perm)),
    RESOURCE_TYPES, RESOURCE_NAMES, PATTERN_TYPES, PRINCIPALS, HOSTS, CONCRETE_OPS, PERMISSIONS)


def reference_authorize(bindings: list[AclBinding], super_users: frozenset[str],
                        allow_everyone: bool, principal: str, host: str, op: Operation,
                        rtype: ResourceType, name: str) -> bool:
    """Kafka's decision, read literally, over every ACL (no index)."""
    if principal in super_users:
        return True

    def on_resource(b: AclBinding) -> bool:
        p = b.pattern
        if p.resource_type != rtype:
            return False
        if p.pattern_type == PatternType.LITERAL:
            return p.name == name or p.name == "*"
        return name.startswith(p.name)

    def applies(b: AclBinding) -> bool:
        return (b.entry.principal in (principal, "User:*")
                and b.entry.host in ("*", host))

    matching = [b for b in bindings if on_resource(b)]
    if not matching:
        return allow_everyone
    for b in matching:
        if (applies(b) and b.entry.permission == Permission.DENY
                and b.entry.operation in (Operation.ALL, op)):
            return False
    implied = {
        Operation.DESCRIBE: {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER},
        Operation.DESCRIBE_CONFIGS: {Operation.ALTER_CONFIGS},
    }.get(op, set())
    return any(applies(b) and b.entry.permission == Permission.ALLOW
               and (b.entry.operation in (Operation.ALL, op) or b.entry.operation in implied)
               for b in matching)


@PROPERTY
@given(bindings=st.lists(acls, max_size=12), super_users=st.frozensets(PRINCIPALS, max_size=2),
       allow_everyone=st.booleans(), principal=REQUESTERS, host=REQUEST_HOSTS, op=REQUEST_OPS,
       rtype=RESOURCE_TYPES, name=RESOURCE_NAMES)
def test_authorizer_matches_the_reference(bindings: list[AclBinding], super_users: frozenset[str],
                                          allow_everyone: bool, principal: str, host: str,
                                          op: Operation, rtype: ResourceType, name: str) -> None:
    authorizer = Authorizer(super_users, allow_everyone, bindings)
    expected = reference_authorize(bindings, super_users, allow_everyone, principal, host, op,
                                   rtype, name)
    assert authorizer.authorize(principal, host, op, rtype, name) is expected
    # by name, as the transport asks (Security.authorize takes strings)
    assert authorizer.authorize(principal, host, op.name, rtype.name, name) is expected


@PROPERTY
@given(data=st.data(), principal=REQUESTERS, host=REQUEST_HOSTS, op=REQUEST_OPS,
       name=RESOURCE_NAMES, allow_everyone=st.booleans())
def test_authorizer_on_one_resource(data: st.DataObject, principal: str, host: str,
                                    op: Operation, name: str, allow_everyone: bool) -> None:
    """ACLs drawn around the request (its name, a prefix of it or *; its principal or User:*;
    its host or *), so that ALLOWs and DENYs that apply meet often."""
    names = st.sampled_from(["*", name, *(name[:i] for i in range(1, len(name)))])
    bindings = data.draw(st.lists(st.builds(
        lambda n, ptype, who, where, acl_op, perm: AclBinding(
            ResourcePattern(ResourceType.GROUP, n, ptype),
            AccessControlEntry(who, where, acl_op, perm)),
        names, PATTERN_TYPES, st.sampled_from([principal, "User:*", "User:other"]),
        st.sampled_from([host, "*", "10.9.9.9"]), CONCRETE_OPS, PERMISSIONS), max_size=6))
    expected = reference_authorize(bindings, frozenset(), allow_everyone, principal, host, op,
                                   ResourceType.GROUP, name)
    assert Authorizer((), allow_everyone, bindings).authorize(
        principal, host, op, ResourceType.GROUP, name) is expected


@PROPERTY
@given(bindings=st.lists(acls, max_size=12), removed=st.lists(st.integers(0, 11), max_size=6),
       principal=REQUESTERS, host=REQUEST_HOSTS, op=REQUEST_OPS, rtype=RESOURCE_TYPES,
       name=RESOURCE_NAMES)
def test_removing_acls_keeps_the_index_right(bindings: list[AclBinding], removed: list[int],
                                             principal: str, host: str, op: Operation,
                                             rtype: ResourceType, name: str) -> None:
    authorizer = Authorizer(acls=bindings)
    left = list(dict.fromkeys(bindings))
    for i in removed:
        if i < len(bindings):
            authorizer.remove(bindings[i])
            if bindings[i] in left:
                left.remove(bindings[i])
    assert sorted(authorizer) == sorted(left)
    assert len(authorizer) == len(left)
    assert authorizer.authorize(principal, host, op, rtype, name) is reference_authorize(
        left, frozenset(), False, principal, host, op, rtype, name)


# -- filters ----------------------------------------------------------------------------------

pattern_filters = st.builds(
    ResourcePatternFilter,
    st.sampled_from([ResourceType.ANY, ResourceType.GROUP, ResourceType.CLUSTER,
                     ResourceType.TOPIC]),
    st.none() | RESOURCE_NAMES,
    st.sampled_from([PatternType.ANY, PatternType.MATCH, PatternType.LITERAL,
                     PatternType.PREFIXED]))
entry_filters = st.builds(
    AccessControlEntryFilter, st.none() | PRINCIPALS, st.none() | HOSTS,
    st.sampled_from([Operation.ANY, *[op for op in Operation if op.value >= 2]]),
    st.sampled_from([Permission.ANY, Permission.ALLOW, Permission.DENY]))


def reference_filter(f: AclBindingFilter, b: AclBinding) -> bool:
    pf, ef, p, e = f.pattern, f.entry, b.pattern, b.entry
    if pf.resource_type != ResourceType.ANY and pf.resource_type != p.resource_type:
        return False
    if pf.name is not None:
        if pf.pattern_type == PatternType.MATCH:
            ok = (p.name in (pf.name, "*") if p.pattern_type == PatternType.LITERAL
                  else pf.name.startswith(p.name))
        elif pf.pattern_type == PatternType.ANY:
            ok = pf.name == p.name
        else:
            ok = pf.pattern_type == p.pattern_type and pf.name == p.name
        if not ok:
            return False
    elif pf.pattern_type not in (PatternType.ANY, PatternType.MATCH) and pf.pattern_type != p.pattern_type:
        return False
    return ((ef.principal is None or ef.principal == e.principal)
            and (ef.host is None or ef.host == e.host)
            and (ef.operation == Operation.ANY or ef.operation == e.operation)
            and (ef.permission == Permission.ANY or ef.permission == e.permission))


@PROPERTY
@given(f=st.builds(AclBindingFilter, pattern_filters, entry_filters), binding=acls)
def test_filter_matches_the_reference(f: AclBindingFilter, binding: AclBinding) -> None:
    assert f.matches(binding) is reference_filter(f, binding)


def test_match_filter_finds_the_acls_that_apply_to_a_resource() -> None:
    bindings = [
        AclBinding.of("GROUP", "orders", "User:a", "READ"),
        AclBinding.of("GROUP", "*", "User:a", "READ"),
        AclBinding.of("GROUP", "ord", "User:a", "READ", pattern_type="PREFIXED"),
        AclBinding.of("GROUP", "pay", "User:a", "READ", pattern_type="PREFIXED"),
        AclBinding.of("GROUP", "order", "User:a", "READ"),
    ]
    authorizer = Authorizer(acls=bindings)
    f = AclBindingFilter(ResourcePatternFilter(ResourceType.GROUP, "orders", PatternType.MATCH))
    assert authorizer.matching(f) == sorted(bindings[:3])
    assert authorizer.matching(ALL_ACLS) == sorted(bindings)


# -- the rules one by one -----------------------------------------------------------------------

G = ResourceType.GROUP


def test_no_acl_denies_unless_allow_everyone() -> None:
    assert not Authorizer().authorize("User:a", "h", "READ", G, "g")
    assert Authorizer(allow_everyone_if_no_acl_found=True).authorize("User:a", "h", "READ", G, "g")
    # an ACL on the resource for someone else: no longer "no acl found"
    a = Authorizer(allow_everyone_if_no_acl_found=True,
                   acls=[AclBinding.of(G, "g", "User:b", "READ")])
    assert not a.authorize("User:a", "h", "READ", G, "g")
    assert a.authorize("User:a", "h", "READ", G, "other")


def test_super_users() -> None:
    assert parse_super_users("User:a; User:b;;") == {"User:a", "User:b"}
    a = Authorizer("User:admin", acls=[AclBinding.of(G, "*", "User:admin", "ALL", "DENY")])
    assert a.authorize("User:admin", "h", "ALTER", "CLUSTER", "kafka-cluster")
    assert a.authorize("User:admin", "h", "READ", G, "g")  # even over a DENY


def test_deny_wins_and_wildcards() -> None:
    a = Authorizer(acls=[
        AclBinding.of(G, "g", "User:*", "READ"),
        AclBinding.of(G, "g", "User:bad", "READ", "DENY", host="10.0.0.9"),
    ])
    assert a.authorize("User:x", "10.0.0.1", "READ", G, "g")
    assert a.authorize("User:bad", "10.0.0.1", "READ", G, "g")
    assert not a.authorize("User:bad", "10.0.0.9", "READ", G, "g")
    d = a.decide("User:bad", "10.0.0.9", "READ", G, "g")
    assert d.reason == "denied by acl" and d.acl is not None and d.acl.entry.permission == Permission.DENY


def test_implied_operations() -> None:
    for op in ("READ", "WRITE", "DELETE", "ALTER"):
        a = Authorizer(acls=[AclBinding.of(G, "g", "User:a", op)])
        assert a.authorize("User:a", "h", "DESCRIBE", G, "g"), op
        assert not a.authorize("User:a", "h", "CREATE", G, "g")
    a = Authorizer(acls=[AclBinding.of(G, "g", "User:a", "ALTER_CONFIGS")])
    assert a.authorize("User:a", "h", "DESCRIBE_CONFIGS", G, "g")
    assert not a.authorize("User:a", "h", "DESCRIBE", G, "g")
    # a DENY of READ does not deny DESCRIBE; a DENY of ALL does
    a = Authorizer(acls=[AclBinding.of(G, "g", "User:a", "ALL"),
                         AclBinding.of(G, "g", "User:a", "READ", "DENY")])
    assert a.authorize("User:a", "h", "DESCRIBE", G, "g")
    assert not a.authorize("User:a", "h", "READ", G, "g")


def test_prefixed_patterns() -> None:
    a = Authorizer(acls=[AclBinding.of(G, "team-a-", "User:a", "READ", pattern_type="PREFIXED")])
    assert a.authorize("User:a", "h", "READ", G, "team-a-orders")
    assert a.authorize("User:a", "h", "READ", G, "team-a-")
    assert not a.authorize("User:a", "h", "READ", G, "team-b-orders")
    assert not a.authorize("User:a", "h", "READ", G, "team-a")


@pytest.mark.parametrize(("acl", "problem"), [
    (AclBinding.of("CLUSTER", "other", "User:a", "ALTER"), "kafka-cluster"),
    (AclBinding.of(G, "", "User:a", "READ"), "empty"),
    (AclBinding.of(G, "g", "alice", "READ"), "colon"),
    (AclBinding.of(G, "g", "User:a", "ANY"), "operation"),
    (AclBinding.of(G, "g", "User:a", "READ", "ANY"), "permissionType"),
    (AclBinding.of(G, "g", "User:a", "READ", pattern_type="MATCH"), "patternType"),
    (AclBinding.of("ANY", "g", "User:a", "READ"), "resourceType"),
])
def test_invalid_acls(acl: AclBinding, problem: str) -> None:
    reason = acl.invalid()
    assert reason is not None and problem in reason


def test_parse_names_and_codes() -> None:
    assert Operation.parse("describe-configs") is Operation.DESCRIBE_CONFIGS
    # kafka-acls.sh's own spelling
    assert Operation.parse("DescribeConfigs") is Operation.DESCRIBE_CONFIGS
    assert Operation.parse("ClusterAction") is Operation.CLUSTER_ACTION
    assert Operation.parse(3) is Operation.READ
    assert Operation.from_code(99) is Operation.UNKNOWN
    with pytest.raises(ValueError, match="unknown Operation"):
        Operation.parse("Reed")
