"""DescribeAcls answers what `tiered acl list` shows (the bucket's ACLs, to a principal with
DESCRIBE on the cluster); CreateAcls and DeleteAcls are refused: ACLs change only through the
bucket (`tiered acl`), so every sidecar holds one set (docs/security.md, "The CLI").
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from manifests.security import Acl, Operation, PatternType, Permission, ResourceType
from tiered.app.kafka_api.messages import build, nested, response_class
from tiered.app.kafka_api.wire import Reply, Request

if TYPE_CHECKING:
    from tiered.app.kafka_api.context import Connection, Services

__all__ = ["handle_create_acls", "handle_delete_acls", "handle_describe_acls"]

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
ZERO = datetime.timedelta(0)
MANAGED = ("ACLs are managed in the bucket with `tiered acl add|remove`; the Kafka endpoint "
           "only describes them")
# Kafka's codes (org.apache.kafka.common.resource / acl)
ANY, MATCH = 1, 2
_RESOURCE = {ResourceType.TOPIC: 2, ResourceType.GROUP: 3, ResourceType.CLUSTER: 4}
_PATTERN = {PatternType.LITERAL: 3, PatternType.PREFIXED: 4}
_OPERATION = {Operation.ALL: 2, Operation.READ: 3, Operation.DELETE: 6, Operation.DESCRIBE: 8}
_PERMISSION = {Permission.DENY: 2, Permission.ALLOW: 3}


def _matches(acl: Acl, f: Any) -> bool:
    """Kafka's AclBindingFilter: null and ANY match everything; MATCH is every pattern that
    applies to the named resource."""
    if f.resource_type_filter != ANY and _RESOURCE[acl.resource_type] != f.resource_type_filter:
        return False
    name = f.resource_name_filter
    if f.pattern_type_filter == MATCH:
        if name is not None and not (
                acl.resource_name in (name, "*") if acl.pattern_type is PatternType.LITERAL
                else name.startswith(acl.resource_name)):
            return False
    else:
        if f.pattern_type_filter != ANY and _PATTERN[acl.pattern_type] != f.pattern_type_filter:
            return False
        if name is not None and acl.resource_name != name:
            return False
    return ((f.principal_filter is None or f.principal_filter == acl.principal)
            and (f.host_filter is None or f.host_filter == acl.host)
            and (f.operation == ANY or _OPERATION[acl.operation] == f.operation)
            and (f.permission_type == ANY or _PERMISSION[acl.permission] == f.permission_type))


def handle_describe_acls(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(DESCRIBE_ACLS, req.api_version)
    guard = svc.guard
    if not guard.enabled or guard.view is None:
        return Reply.of(req.correlation_id, build(
            cls, throttle_time=ZERO, error_code=ErrorCode.security_disabled,
            error_message="no authentication is configured ([kafka] sasl_mechanisms, "
                          "tls_client_ca): nothing is enforced", resources=()))
    if not guard.cluster(conn, Operation.DESCRIBE):
        return Reply.of(req.correlation_id, build(
            cls, throttle_time=ZERO, error_code=ErrorCode.cluster_authorization_failed,
            error_message="DescribeAcls needs DESCRIBE on the cluster", resources=()))
    by_resource: dict[tuple[ResourceType, str, PatternType], list[Acl]] = {}
    for acl in guard.view.snapshot.acls:
        if _matches(acl, req.body):
            by_resource.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type),
                                   []).append(acl)
    resource_cls = nested(cls, "DescribeAclsResource")
    acl_cls = nested(cls, "AclDescription")
    resources = tuple(build(
        resource_cls, resource_type=_RESOURCE[kind], resource_name=name,
        pattern_type=_PATTERN[pattern], acls=tuple(
            build(acl_cls, principal=a.principal, host=a.host,
                  operation=_OPERATION[a.operation], permission_type=_PERMISSION[a.permission])
            for a in acls))
        for (kind, name, pattern), acls in sorted(by_resource.items()))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, error_code=ErrorCode.none,
                                              error_message=None, resources=resources))


def handle_create_acls(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(CREATE_ACLS, req.api_version)
    result = nested(cls, "AclCreationResult")
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, results=tuple(
        build(result, error_code=ErrorCode.cluster_authorization_failed, error_message=MANAGED)
        for _ in req.body.creations)))


def handle_delete_acls(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(DELETE_ACLS, req.api_version)
    result = nested(cls, "DeleteAclsFilterResult")
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, filter_results=tuple(
        build(result, error_code=ErrorCode.cluster_authorization_failed, error_message=MANAGED,
              matching_acls=()) for _ in req.body.filters)))
