"""read_committed consumers skip aborted transactions, with the aborted-transaction list coming
from the archived `.txnindex` objects (and the local files past the local log start), while
read_uncommitted consumers see every record; and the endpoint refuses writes with a Kafka error
saying it is read-only, without dropping the connection."""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import Callable

import confluent_kafka
import kafka
import kafka.errors
import pytest
from support.kafka_endpoint import (
    KCAT_FORMAT,
    TOPIC,
    TXN_TOPIC,
    History,
    Rec,
    bootstrap,
    kcat_records,
)

from tiered.app.daemon import Daemon

#: real Kafka clients against a daemon: the slow tier
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

PATIENCE_S = 120.0


def _until(done: Callable[[], bool], step: Callable[[], None]) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not done():
        assert time.monotonic() < deadline, "the client stopped making progress"
        step()


def _end(history: History) -> int:
    return max(history.txn.control_offsets | {r.offset for r in history.txn.records}) + 1


def _kafka_python(daemon: Daemon, isolation: str, history: History) -> list[Rec]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap(daemon), isolation_level=isolation,
                                   enable_auto_commit=False)
    got: list[Rec] = []
    position = [0]
    try:
        tp = kafka.TopicPartition(TXN_TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)

        def step() -> None:
            for messages in consumer.poll(timeout_ms=500).values():
                got.extend(Rec(m.offset, m.timestamp, m.key, m.value, tuple(m.headers))
                           for m in messages)
            position[0] = consumer.position(tp)

        _until(lambda: position[0] >= _end(history), step)
    finally:
        consumer.close()
    return got


def test_kafka_python_read_committed_skips_aborted_transactions(history: History,
                                                                daemon: Daemon) -> None:
    txn = history.txn
    assert txn.aborted_offsets and history.local_start[(TXN_TOPIC, 0)] > 0
    assert any(o < history.local_start[(TXN_TOPIC, 0)] for o in txn.aborted_offsets)
    assert _kafka_python(daemon, "read_committed", history) == txn.committed
    assert _kafka_python(daemon, "read_uncommitted", history) == txn.records


def _confluent(daemon: Daemon, isolation: str, history: History) -> list[Rec]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap(daemon),
                                         "group.id": "unused", "enable.auto.commit": False,
                                         "isolation.level": isolation,
                                         "enable.partition.eof": True})
    got: list[Rec] = []
    eof = [False]
    try:
        consumer.assign([confluent_kafka.TopicPartition(TXN_TOPIC, 0,
                                                        confluent_kafka.OFFSET_BEGINNING)])

        def step() -> None:
            for m in consumer.consume(num_messages=100, timeout=0.5):
                if m.error() is not None:
                    assert m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF
                    eof[0] = True
                    continue
                got.append(Rec(m.offset(), m.timestamp()[1], m.key(), m.value(),
                               tuple(m.headers() or [])))

        _until(lambda: eof[0], step)
    finally:
        consumer.close()
    return got


def test_confluent_read_committed_skips_aborted_transactions(history: History,
                                                             daemon: Daemon) -> None:
    assert _confluent(daemon, "read_committed", history) == history.txn.committed
    assert _confluent(daemon, "read_uncommitted", history) == history.txn.records


def test_kcat_read_committed_skips_aborted_transactions(history: History, daemon: Daemon,
                                                        kcat: str) -> None:
    proc = subprocess.run([kcat, "-b", bootstrap(daemon), "-X", "isolation.level=read_committed",
                           "-C", "-t", TXN_TOPIC, "-p", "0", "-o", "beginning", "-e",
                           "-f", KCAT_FORMAT], capture_output=True, timeout=120, check=True)
    assert kcat_records(proc.stdout) == history.txn.committed


# --- writes -----------------------------------------------------------------------------------


def test_kafka_python_produce_gets_the_read_only_error(daemon: Daemon) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap(daemon), retries=0,
                                   enable_idempotence=False, acks=1)
    try:
        future = producer.send(TOPIC, b"not welcome", partition=0)
        with pytest.raises(kafka.errors.PolicyViolationError) as err:
            future.get(timeout=60)
        assert "read-only" in str(err.value)
        # the connection survived: metadata still answers on it
        assert producer.partitions_for(TOPIC) == {0, 1}
    finally:
        producer.close(timeout=10)


def test_confluent_produce_gets_the_read_only_error(daemon: Daemon) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap(daemon),
                                         "message.send.max.retries": 0, "acks": 1})
    reports: list[confluent_kafka.KafkaError | None] = []
    producer.produce(TOPIC, b"not welcome", partition=0,
                     on_delivery=lambda err, _msg: reports.append(err))
    _until(lambda: bool(reports), functools.partial(producer.poll, 0.5))
    error = reports[0]
    assert error is not None
    assert error.code() == confluent_kafka.KafkaError.POLICY_VIOLATION
    # librdkafka keeps the connection: the same producer still reads metadata
    assert set(producer.list_topics(TOPIC, timeout=30).topics[TOPIC].partitions) == {0, 1}
    producer.flush(1)
    del producer  # destroyed now, not at some later collection after the daemon has stopped


def test_admin_writes_get_the_read_only_error(daemon: Daemon) -> None:
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap(daemon)})
    futures = admin.create_topics([confluent_kafka.admin.NewTopic("new-topic", 1, 1)],
                                  request_timeout=30)
    with pytest.raises(confluent_kafka.KafkaException) as err:
        futures["new-topic"].result(timeout=60)
    assert err.value.args[0].code() == confluent_kafka.KafkaError.POLICY_VIOLATION
    assert "read-only" in err.value.args[0].str()
    futures = admin.delete_topics([TOPIC], request_timeout=30)
    with pytest.raises(confluent_kafka.KafkaException) as err:
        futures[TOPIC].result(timeout=60)
    assert err.value.args[0].code() == confluent_kafka.KafkaError.POLICY_VIOLATION
