"""Every API that would write topic data (Produce, topic and config admin, transactions) is
answered, never dropped: each topic, partition or resource it names gets POLICY_VIOLATION, with
a message saying the endpoint is read-only wherever the response has a message field
(docs/kafka-api.md, "Writes").

Transactional producers fail earlier, at FindCoordinator (`metadata.handle_find_coordinator`);
an idempotent producer's InitProducerId gets POLICY_VIOLATION too, which clients report as a
fatal producer error.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from tiered.app.kafka_api.context import READ_ONLY, Connection, Services, log
from tiered.app.kafka_api.messages import build, nested, response_class
from tiered.app.kafka_api.wire import Reply, Request

__all__ = ["READ_ONLY_APIS"]

REFUSED = ErrorCode.policy_violation
ZERO = datetime.timedelta(0)
_ERR = {"error_code": REFUSED, "error_message": READ_ONLY}


def _produce(cls: type[Any], body: Any) -> Any:
    part_cls = nested(cls, "PartitionProduceResponse")
    topics = []
    for t in body.topic_data:
        parts = tuple(build(part_cls, index=p.index, base_offset=-1, log_append_time=None,
                            log_start_offset=-1, **_ERR) for p in t.partition_data)
        ident = {"topic_id": t.topic_id} if hasattr(t, "topic_id") else {"name": t.name}
        topics.append(build(nested(cls, "TopicProduceResponse"), partition_responses=parts,
                            **ident))
    return build(cls, responses=tuple(topics), throttle_time=ZERO)


def _create_topics(cls: type[Any], body: Any) -> Any:
    result = nested(cls, "CreatableTopicResult")
    return build(cls, throttle_time=ZERO, topics=tuple(
        build(result, name=t.name, topic_id=None, num_partitions=-1, replication_factor=-1,
              configs=None, **_ERR) for t in body.topics))


def _delete_topics(cls: type[Any], body: Any) -> Any:
    result = nested(cls, "DeletableTopicResult")
    if hasattr(body, "topic_names"):  # v1-v5 name topics in a list of strings
        named = [(name, None) for name in body.topic_names]
    else:
        named = [(t.name, t.topic_id) for t in body.topics]
    return build(cls, throttle_time=ZERO, responses=tuple(
        build(result, name=name, topic_id=tid, **_ERR) for name, tid in named))


def _delete_records(cls: type[Any], body: Any) -> Any:
    part_cls = nested(cls, "DeleteRecordsPartitionResult")
    return build(cls, throttle_time=ZERO, topics=tuple(
        build(nested(cls, "DeleteRecordsTopicResult"), name=t.name, partitions=tuple(
            build(part_cls, partition_index=p.partition_index, low_watermark=-1,
                  error_code=REFUSED) for p in t.partitions)) for t in body.topics))


def _init_producer_id(cls: type[Any], body: Any) -> Any:
    return build(cls, throttle_time=ZERO, error_code=REFUSED, producer_id=-1, producer_epoch=-1,
                 ongoing_txn_producer_id=-1, ongoing_txn_producer_epoch=-1)


def _add_partitions_to_txn(cls: type[Any], body: Any) -> Any:
    part_cls = nested(cls, "AddPartitionsToTxnPartitionResult")
    topic_cls = nested(cls, "AddPartitionsToTxnTopicResult")

    def topics(named: Any) -> tuple[Any, ...]:
        return tuple(build(topic_cls, name=t.name, results_by_partition=tuple(
            build(part_cls, partition_index=p, partition_error_code=REFUSED)
            for p in t.partitions)) for t in named)

    if hasattr(body, "transactions"):  # v4+: batched by transaction
        return build(cls, throttle_time=ZERO, error_code=REFUSED, results_by_transaction=tuple(
            build(nested(cls, "AddPartitionsToTxnResult"),
                  transactional_id=txn.transactional_id, topic_results=topics(txn.topics))
            for txn in body.transactions))
    return build(cls, throttle_time=ZERO,
                 results_by_topic_v3_and_below=topics(body.v3_and_below_topics))


def _error_only(cls: type[Any], body: Any) -> Any:
    return build(cls, throttle_time=ZERO, error_code=REFUSED, producer_id=-1, producer_epoch=-1)


def _txn_offset_commit(cls: type[Any], body: Any) -> Any:
    part_cls = nested(cls, "TxnOffsetCommitResponsePartition")
    return build(cls, throttle_time=ZERO, topics=tuple(
        build(nested(cls, "TxnOffsetCommitResponseTopic"), name=t.name, partitions=tuple(
            build(part_cls, partition_index=p.partition_index, error_code=REFUSED)
            for p in t.partitions)) for t in body.topics))


def _alter_configs(cls: type[Any], body: Any) -> Any:
    result = nested(cls, "AlterConfigsResourceResponse")
    return build(cls, throttle_time=ZERO, responses=tuple(
        build(result, resource_type=r.resource_type, resource_name=r.resource_name, **_ERR)
        for r in body.resources))


def _create_partitions(cls: type[Any], body: Any) -> Any:
    result = nested(cls, "CreatePartitionsTopicResult")
    return build(cls, throttle_time=ZERO, results=tuple(
        build(result, name=t.name, **_ERR) for t in body.topics))


def _refuse(builder: Callable[[type[Any], Any], Any]) -> Callable[
        [Services, Connection, Request], Reply]:
    def handle(svc: Services, conn: Connection, req: Request) -> Reply:
        cls = response_class(req.api_key, req.api_version)
        log.info("refused %s v%d from %s (client %r): the endpoint is read-only",
                 cls.__name__.removesuffix("Response"), req.api_version, conn.peer_host,
                 req.client_id)
        return Reply.of(req.correlation_id, builder(cls, req.body))

    return handle


#: api key -> handler of every write API the endpoint advertises and refuses
READ_ONLY_APIS: dict[int, Callable[[Services, Connection, Request], Reply]] = {
    0: _refuse(_produce),
    19: _refuse(_create_topics),
    20: _refuse(_delete_topics),
    21: _refuse(_delete_records),
    22: _refuse(_init_producer_id),
    24: _refuse(_add_partitions_to_txn),
    25: _refuse(_error_only),  # AddOffsetsToTxn
    26: _refuse(_error_only),  # EndTxn
    28: _refuse(_txn_offset_commit),
    33: _refuse(_alter_configs),
    37: _refuse(_create_partitions),
    44: _refuse(_alter_configs),  # IncrementalAlterConfigs
}
