"""Whether a principal may do an operation on a resource: Kafka's authorizer decision
(`AclAuthorizer` / `StandardAuthorizer`), pure, over the ACLs in the bucket (docs/security.md,
"How a request is decided").

In order:

1. a super user may do anything;
2. the ACLs that apply to the resource are those whose pattern matches its name: LITERAL with
   the same name or the wildcard `*`, PREFIXED whose name begins the resource's;
3. with none applying, the answer is `allow_everyone_if_no_acl`;
4. a DENY matching the principal (or `User:*`), the host (or `*`) and the operation (or ALL)
   refuses, whatever allows it;
5. otherwise an ALLOW matching the same way permits; DESCRIBE is also permitted by an ALLOW
   of READ (Kafka: READ, WRITE, DELETE and ALTER imply DESCRIBE), and DELETE only by ALL.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from manifests.security import (
    CLUSTER_NAME,
    Acl,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

__all__ = ["ANONYMOUS", "WILDCARD_PRINCIPAL", "Policy", "Resource", "authorize"]

#: the principal of a connection that did not authenticate
ANONYMOUS = "User:ANONYMOUS"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_RESOURCE = "*"
WILDCARD_HOST = "*"


@dataclass(frozen=True)
class Resource:
    type: ResourceType
    name: str

    @classmethod
    def topic(cls, name: str) -> Resource:
        return cls(ResourceType.TOPIC, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        return cls(ResourceType.GROUP, name)

    @classmethod
    def cluster(cls) -> Resource:
        return cls(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True)
class Policy:
    """The settings the decision depends on besides the ACLs ([kafka] super_users,
    allow_everyone_if_no_acl)."""

    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl: bool = False


def _applies(acl: Acl, resource: Resource) -> bool:
    if acl.resource_type is not resource.type:
        return False
    if acl.pattern_type is PatternType.PREFIXED:
        return resource.name.startswith(acl.resource_name)
    return acl.resource_name in (resource.name, WILDCARD_RESOURCE)


def _grants(acl_operation: Operation, wanted: Operation, permission: Permission) -> bool:
    if acl_operation in (wanted, Operation.ALL):
        return True
    # an ALLOW of READ implies DESCRIBE; a DENY of READ denies only READ
    return (permission is Permission.ALLOW and wanted is Operation.DESCRIBE
            and acl_operation is Operation.READ)


def authorize(acls: Iterable[Acl], policy: Policy, principal: str, host: str,
              operation: Operation, resource: Resource) -> bool:
    """Whether `principal` connected from `host` may do `operation` on `resource`."""
    if principal in policy.super_users:
        return True
    applying = [a for a in acls if _applies(a, resource)]
    if not applying:
        return policy.allow_everyone_if_no_acl
    allowed = False
    for acl in applying:
        if acl.principal not in (principal, WILDCARD_PRINCIPAL):
            continue
        if acl.host not in (host, WILDCARD_HOST):
            continue
        if not _grants(acl.operation, operation, acl.permission):
            continue
        if acl.permission is Permission.DENY:
            return False
        allowed = True
    return allowed


def visible(acls: Collection[Acl], policy: Policy, principal: str, host: str,
            operation: Operation, names: Iterable[str], type_: ResourceType) -> list[str]:
    """The `names` of resources of `type_` the principal may do `operation` on."""
    return [n for n in names
            if authorize(acls, policy, principal, host, operation, Resource(type_, n))]
