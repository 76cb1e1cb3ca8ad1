"""The authorization decision, pure: Kafka's rules (super users, no ACL means
allow_everyone_if_no_acl, DENY wins, LITERAL / wildcard / PREFIXED patterns, User:*, hosts,
DESCRIBE implied by READ, DELETE only by ALL)."""

from __future__ import annotations

from manifests.security import Acl, Operation
from tiered.app.authz import Policy, Resource, authorize

READ, DESCRIBE, ALL, DELETE = Operation.READ, Operation.DESCRIBE, Operation.ALL, Operation.DELETE
T = Resource.topic
DEFAULT = Policy()


def acl(principal: str, name: str, op: str = "read", *, kind: str = "topic",
        pattern: str = "literal", permission: str = "allow", host: str = "*") -> Acl:
    return Acl(principal, kind, pattern, name, op, permission, host)  # type: ignore[arg-type]


def ok(acls: list[Acl], principal: str, op: Operation, resource: Resource, *,
       host: str = "10.0.0.1", policy: Policy = DEFAULT) -> bool:
    return authorize(acls, policy, principal, host, op, resource)


def test_no_acl_follows_allow_everyone_if_no_acl() -> None:
    assert not ok([], "User:alice", READ, T("orders"))
    assert ok([], "User:alice", READ, T("orders"), policy=Policy(allow_everyone_if_no_acl=True))
    # an ACL on the resource for someone else: the setting no longer applies
    others = [acl("User:bob", "orders")]
    assert not ok(others, "User:alice", READ, T("orders"),
                  policy=Policy(allow_everyone_if_no_acl=True))


def test_super_users_may_do_anything() -> None:
    deny = [acl("User:admin", "orders", "all", permission="deny")]
    assert ok(deny, "User:admin", DELETE, T("orders"),
              policy=Policy(super_users=frozenset({"User:admin"})))


def test_literal_wildcard_and_prefixed_patterns() -> None:
    acls = [acl("User:alice", "orders"), acl("User:bob", "*"),
            acl("User:carol", "orders.", pattern="prefixed")]
    assert ok(acls, "User:alice", READ, T("orders"))
    assert not ok(acls, "User:alice", READ, T("orders2"))
    assert ok(acls, "User:bob", READ, T("anything"))
    assert ok(acls, "User:carol", READ, T("orders.eu"))
    assert not ok(acls, "User:carol", READ, T("orders"))
    assert not ok(acls, "User:carol", READ, Resource.group("orders.eu"))


def test_deny_wins_over_allow() -> None:
    acls = [acl("User:*", "orders.", pattern="prefixed"),
            acl("User:mallory", "orders.secret", permission="deny")]
    assert ok(acls, "User:alice", READ, T("orders.secret"))
    assert not ok(acls, "User:mallory", READ, T("orders.secret"))
    assert ok(acls, "User:mallory", READ, T("orders.public"))
    all_denied = acls + [acl("User:alice", "orders.", "all", pattern="prefixed",
                             permission="deny")]
    assert not ok(all_denied, "User:alice", READ, T("orders.public"))


def test_describe_is_implied_by_read_but_deny_read_leaves_describe() -> None:
    acls = [acl("User:alice", "orders"), acl("User:bob", "orders", "describe"),
            acl("User:carol", "orders", "all"),
            acl("User:dave", "orders", "describe"), acl("User:dave", "orders", permission="deny")]
    assert ok(acls, "User:alice", DESCRIBE, T("orders"))
    assert not ok(acls, "User:bob", READ, T("orders"))
    assert ok(acls, "User:bob", DESCRIBE, T("orders"))
    assert ok(acls, "User:carol", READ, T("orders")) and ok(acls, "User:carol", DELETE,
                                                             T("orders"))
    assert not ok(acls, "User:alice", DELETE, T("orders"))
    assert ok(acls, "User:dave", DESCRIBE, T("orders"))
    assert not ok(acls, "User:dave", READ, T("orders"))


def test_hosts() -> None:
    acls = [acl("User:alice", "orders", host="10.0.0.1")]
    assert ok(acls, "User:alice", READ, T("orders"), host="10.0.0.1")
    assert not ok(acls, "User:alice", READ, T("orders"), host="10.0.0.2")


def test_cluster_resource() -> None:
    acls = [acl("User:ops", "kafka-cluster", "describe", kind="cluster")]
    assert ok(acls, "User:ops", DESCRIBE, Resource.cluster())
    assert not ok(acls, "User:alice", DESCRIBE, Resource.cluster())
