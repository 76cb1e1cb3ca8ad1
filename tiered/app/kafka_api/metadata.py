"""Metadata, FindCoordinator and ListOffsets: where the partitions are (here, every one of
them), who coordinates groups (this node) and which offsets a partition holds
(docs/kafka-api.md)."""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from manifests.security import Operation
from tiered.app.kafka_api.catalog import LocalTopics, Topic
from tiered.app.kafka_api.context import READ_ONLY, Connection, Services, error_code_of, log
from tiered.app.kafka_api.messages import build, nested, response_class
from tiered.app.kafka_api.wire import Reply, Request
from tiered.errors import TieredError
from tiered.kafka.index import NO_TIMESTAMP

__all__ = ["handle_find_coordinator", "handle_list_offsets", "handle_metadata"]

METADATA, LIST_OFFSETS, FIND_COORDINATOR = 3, 2, 10
#: "not computed": what Kafka sends for authorized operations nobody asked for
NO_OPERATIONS = -(2**31)
#: ListOffsets' special timestamps
LATEST, EARLIEST = -1, -2
ZERO = datetime.timedelta(0)


def handle_metadata(svc: Services, conn: Connection, req: Request) -> Reply:
    """Every requested topic with all its partitions led by this node; all topics when the
    request names none (null, or an empty list in v0)."""
    v = req.api_version
    cls = response_class(METADATA, v)
    wanted = req.body.topics
    topics: list[Any] = []
    if wanted is None or (v == 0 and not wanted):
        topics = [_topic_entry(cls, svc, t) for t in svc.catalog.topics()
                  if svc.guard.topic(conn, Operation.DESCRIBE, t.name)]
    else:
        local = svc.catalog.local_topics()  # once per request, not once per name
        for asked in wanted:
            name = asked.name
            topic_id = getattr(asked, "topic_id", None)
            if name is None and topic_id is not None:
                name = svc.catalog.name_of(topic_id)
            if name is not None and not svc.guard.topic(conn, Operation.DESCRIBE, name):
                topics.append(_denied(cls, name, topic_id))
                continue
            topics.append(_lookup(cls, svc, name, topic_id, local))
    node = svc.node
    broker = build(nested(cls, "MetadataResponseBroker"), node_id=node.node_id, host=node.host,
                   port=node.port, rack=None)
    return Reply.of(req.correlation_id, build(
        cls, throttle_time=ZERO, brokers=(broker,), cluster_id=svc.cluster_id,
        controller_id=node.node_id, topics=tuple(topics),
        cluster_authorized_operations=NO_OPERATIONS))


def _denied(cls: type[Any], name: str, topic_id: Any) -> Any:
    """A topic the principal may not describe: Kafka's answer, whether it exists or not."""
    fields = {} if topic_id is None else {"topic_id": topic_id}
    return build(nested(cls, "MetadataResponseTopic"),
                 error_code=ErrorCode.topic_authorization_failed, name=name,
                 topic_authorized_operations=NO_OPERATIONS, **fields)


def _lookup(cls: type[Any], svc: Services, name: str | None, topic_id: Any,
            local: LocalTopics) -> Any:
    entry = nested(cls, "MetadataResponseTopic")
    if name is None:
        return build(entry, error_code=ErrorCode.unknown_topic_id, name=None, topic_id=topic_id,
                     topic_authorized_operations=NO_OPERATIONS)
    try:
        topic = svc.catalog.topic(name, local)
    except TieredError as exc:  # the bucket was never read; the catalog logged why, once
        log.debug("metadata of %s: %s", name, exc)
        return build(entry, error_code=ErrorCode.leader_not_available, name=name,
                     topic_authorized_operations=NO_OPERATIONS)
    if topic is None:
        return build(entry, error_code=ErrorCode.unknown_topic_or_partition, name=name,
                     topic_authorized_operations=NO_OPERATIONS)
    return _topic_entry(cls, svc, topic)


def _topic_entry(cls: type[Any], svc: Services, topic: Topic) -> Any:
    me = svc.node.node_id
    part = nested(cls, "MetadataResponsePartition")
    # leader epoch -1: clients then skip epoch validation (OffsetForLeaderEpoch), which this
    # node cannot answer for history
    partitions = tuple(
        build(part, error_code=ErrorCode.none, partition_index=p, leader_id=me, leader_epoch=-1,
              replica_nodes=(me,), isr_nodes=(me,), offline_replicas=())
        for p in range(topic.partitions))
    return build(nested(cls, "MetadataResponseTopic"), error_code=ErrorCode.none,
                 name=topic.name, topic_id=topic.topic_id, is_internal=False,
                 partitions=partitions, topic_authorized_operations=NO_OPERATIONS)


def handle_find_coordinator(svc: Services, conn: Connection, req: Request) -> Reply:
    """Groups are coordinated here; transactions are not (the endpoint is read-only)."""
    body, v = req.body, req.api_version
    cls = response_class(FIND_COORDINATOR, v)
    node = svc.node
    key_type = getattr(body, "key_type", 0)

    def answer(key: str) -> dict[str, Any]:
        if key_type != 0:
            log.info("refused a coordinator lookup for transaction %r: %s", key, READ_ONLY)
            return {"error_code": ErrorCode.transactional_id_authorization_failed,
                    "error_message": READ_ONLY, "node_id": -1, "host": "", "port": -1}
        if not key:
            return {"error_code": ErrorCode.invalid_group_id,
                    "error_message": "the group id is empty", "node_id": -1, "host": "",
                    "port": -1}
        return {"error_code": ErrorCode.none, "error_message": None, "node_id": node.node_id,
                "host": node.host, "port": node.port}

    if v >= 4:
        coordinators = tuple(build(nested(cls, "Coordinator"), key=key, **answer(key))
                             for key in body.coordinator_keys)
        return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO,
                                                  coordinators=coordinators))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, **answer(body.key)))


def handle_list_offsets(svc: Services, conn: Connection, req: Request) -> Reply:
    """Earliest (-2: bucket included), latest (-1: the high watermark) or the first offset
    at or after a timestamp, per partition. A topic or partition the catalog does not hold
    is UNKNOWN_TOPIC_OR_PARTITION without a store request."""
    cls = response_class(LIST_OFFSETS, req.api_version)
    topic_cls = nested(cls, "ListOffsetsTopicResponse")
    part_cls = nested(cls, "ListOffsetsPartitionResponse")
    reader = svc.reader
    local = svc.catalog.local_topics()  # once per request, not once per name
    topics = []
    for t in req.body.topics:
        parts = []
        allowed = svc.guard.topic(conn, Operation.READ, t.name)
        unknown: ErrorCode | None = None
        count = 0
        if allowed:  # a topic the principal may not read is not looked up (nor revealed)
            try:
                topic = svc.catalog.topic(t.name, local)
            except TieredError as exc:  # the bucket was never read: retriable, and the
                log.debug("list offsets of %s: %s", t.name, exc)  # catalog logged the cause
                unknown = ErrorCode.leader_not_available
            else:
                if topic is None:
                    unknown = ErrorCode.unknown_topic_or_partition
                else:
                    count = topic.partitions
        for p in t.partitions:
            fields: dict[str, Any] = {"partition_index": p.partition_index,
                                      "error_code": ErrorCode.none, "timestamp": NO_TIMESTAMP,
                                      "offset": -1, "leader_epoch": -1}
            if not allowed:
                fields["error_code"] = ErrorCode.topic_authorization_failed
                parts.append(build(part_cls, **fields))
                continue
            if unknown is not None or not 0 <= p.partition_index < count:
                fields["error_code"] = (ErrorCode.unknown_topic_or_partition if unknown is None
                                        else unknown)
                parts.append(build(part_cls, **fields))
                continue
            try:
                if p.timestamp == EARLIEST:
                    fields["offset"] = reader.earliest_offset(t.name, p.partition_index)
                elif p.timestamp == LATEST:
                    fields["offset"] = reader.latest_offset(t.name, p.partition_index)
                elif p.timestamp < 0:
                    fields["error_code"] = ErrorCode.invalid_request
                else:
                    found = reader.offset_for_timestamp(t.name, p.partition_index, p.timestamp)
                    if found is not None:
                        fields["timestamp"], fields["offset"] = found.timestamp, found.offset
                        if found.leader_epoch is not None:
                            fields["leader_epoch"] = found.leader_epoch
            except TieredError as exc:
                fields["error_code"] = error_code_of(exc, f"{t.name}-{p.partition_index}")
            parts.append(build(part_cls, **fields))
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, topics=tuple(topics)))
