"""The APIs the endpoint serves, the versions it advertises in ApiVersions, and their handlers
(docs/kafka-api.md, "APIs and versions").

Versions are kio's range for each API (Kafka 4's supported versions), capped where a newer
version needs something this endpoint does not have: ListOffsets at 6 (v7+ add lookups by max
timestamp and of tiered offsets), OffsetCommit and OffsetFetch at 8 (v9+ are for KIP-848
consumer groups and topic ids).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from tiered.app.kafka_api.acls import (
    handle_create_acls,
    handle_delete_acls,
    handle_describe_acls,
)
from tiered.app.kafka_api.context import Connection, Services
from tiered.app.kafka_api.fetch import handle_fetch
from tiered.app.kafka_api.groups import (
    handle_delete_groups,
    handle_describe_groups,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_list_groups,
    handle_offset_commit,
    handle_offset_delete,
    handle_offset_fetch,
    handle_sync_group,
)
from tiered.app.kafka_api.messages import build, nested, response_class
from tiered.app.kafka_api.metadata import (
    handle_find_coordinator,
    handle_list_offsets,
    handle_metadata,
)
from tiered.app.kafka_api.readonly import READ_ONLY_APIS
from tiered.app.kafka_api.sasl import handle_sasl_authenticate, handle_sasl_handshake
from tiered.app.kafka_api.wire import Reply, Request, encode_response

__all__ = ["API_VERSIONS", "APIS", "Api", "unsupported_api_versions"]

Handler = Callable[[Services, Connection, Request], Reply]
API_VERSIONS = 18


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler


def _handle_api_versions(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(API_VERSIONS, req.api_version)
    return Reply.of(req.correlation_id, _api_versions(cls, ErrorCode.none))


def _api_versions(cls: type, error: ErrorCode) -> object:
    entry = nested(cls, "ApiVersion")
    keys = tuple(build(entry, api_key=a.key, min_version=a.min_version,
                       max_version=a.max_version) for a in APIS.values())
    return build(cls, error_code=error, api_keys=keys, throttle_time=datetime.timedelta(0),
                 finalized_features_epoch=-1)


def unsupported_api_versions(correlation_id: int) -> bytes:
    """Kafka's answer to an ApiVersions request of a version it does not know: version 0 of
    the response, UNSUPPORTED_VERSION and the versions served, so the client retries with one
    of them."""
    cls = response_class(API_VERSIONS, 0)
    return encode_response(correlation_id, _api_versions(cls, ErrorCode.unsupported_version))


#: api key -> what is served; write APIs are answered with the read-only error
APIS: dict[int, Api] = {a.key: a for a in (
    Api(0, "Produce", 3, 13, READ_ONLY_APIS[0]),
    Api(1, "Fetch", 4, 18, handle_fetch),
    Api(2, "ListOffsets", 1, 6, handle_list_offsets),
    Api(3, "Metadata", 0, 13, handle_metadata),
    Api(8, "OffsetCommit", 2, 8, handle_offset_commit),
    Api(9, "OffsetFetch", 1, 8, handle_offset_fetch),
    Api(10, "FindCoordinator", 0, 6, handle_find_coordinator),
    Api(11, "JoinGroup", 0, 9, handle_join_group),
    Api(12, "Heartbeat", 0, 4, handle_heartbeat),
    Api(13, "LeaveGroup", 0, 5, handle_leave_group),
    Api(14, "SyncGroup", 0, 5, handle_sync_group),
    Api(15, "DescribeGroups", 0, 6, handle_describe_groups),
    Api(16, "ListGroups", 0, 5, handle_list_groups),
    Api(17, "SaslHandshake", 0, 1, handle_sasl_handshake),
    Api(18, "ApiVersions", 0, 4, _handle_api_versions),
    Api(19, "CreateTopics", 2, 7, READ_ONLY_APIS[19]),
    Api(20, "DeleteTopics", 1, 6, READ_ONLY_APIS[20]),
    Api(21, "DeleteRecords", 0, 2, READ_ONLY_APIS[21]),
    Api(22, "InitProducerId", 0, 6, READ_ONLY_APIS[22]),
    Api(24, "AddPartitionsToTxn", 0, 5, READ_ONLY_APIS[24]),
    Api(25, "AddOffsetsToTxn", 0, 4, READ_ONLY_APIS[25]),
    Api(26, "EndTxn", 0, 5, READ_ONLY_APIS[26]),
    Api(28, "TxnOffsetCommit", 0, 5, READ_ONLY_APIS[28]),
    Api(29, "DescribeAcls", 1, 3, handle_describe_acls),
    Api(30, "CreateAcls", 1, 3, handle_create_acls),
    Api(31, "DeleteAcls", 1, 3, handle_delete_acls),
    Api(33, "AlterConfigs", 0, 2, READ_ONLY_APIS[33]),
    Api(36, "SaslAuthenticate", 0, 2, handle_sasl_authenticate),
    Api(37, "CreatePartitions", 0, 3, READ_ONLY_APIS[37]),
    Api(42, "DeleteGroups", 0, 2, handle_delete_groups),
    Api(44, "IncrementalAlterConfigs", 0, 1, READ_ONLY_APIS[44]),
    Api(47, "OffsetDelete", 0, 0, handle_offset_delete),
)}
