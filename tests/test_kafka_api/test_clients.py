"""Real Kafka clients consume archived history through `tiered run`'s Kafka endpoint: records
written to a Kafka log, archived to the bucket (moto's S3 server) and deleted locally come back
byte for byte (offset, timestamp, key, value, headers) across the bucket-to-local boundary, to
kafka-python, confluent-kafka (librdkafka) and kcat, reading by assignment from the beginning and
in a consumer group that commits, stops, and resumes where it left off after the sidecar
restarted (its committed offsets are in the bucket)."""

from __future__ import annotations

import collections
import logging
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import confluent_kafka
import confluent_kafka.admin
import kafka
import pytest
from kafka.structs import OffsetAndMetadata
from support.daemons import running
from support.kafka_endpoint import (
    KCAT_FORMAT,
    TOPIC,
    History,
    Rec,
    bootstrap,
    kcat_records,
)

from manifests import keys
from manifests.group_offsets import load_group_offsets
from tiered.app.daemon import Daemon

#: real Kafka clients against a daemon: the slow tier
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

PARTITIONS = (0, 1)
#: a loop waiting for a client gives up after this long (a bound, never an assertion)
PATIENCE_S = 120.0
#: kafka-python's metadata refresh period here. Its default (5 min) is how long a consumer
#: stays without partitions when its request for a subscribed topic's metadata is lost (its
#: cluster state clears a pending update when an earlier request's answer lands); a short
#: period makes the client ask again within the test's patience.
KP_METADATA_MAX_AGE_MS = 2_000
#: log records of the clients and the daemon kept for a failure's message
TRACE_RECORDS = 400


class _Trace(logging.Handler):
    """The last log records, at DEBUG, of the Kafka clients and the daemon: what a test that
    waited in vain says about where the client stopped."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[str] = collections.deque(maxlen=TRACE_RECORDS)
        self.setFormatter(logging.Formatter("%(relativeCreated)9.0f %(threadName)s "
                                            "%(name)s %(levelname)s %(message)s"))

        #: the message of the last record kept, and how often it came again since
        self._last: str | None = None
        self._repeats = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("kafka.metrics"):
            return  # a line per sensor made, nothing about progress
        message = record.getMessage()
        if message == self._last:  # a client spinning: one line, not the whole window
            self._repeats += 1
            return
        if self._repeats:
            self.lines.append(f"{'':9} (the line above {self._repeats} more times)")
        self._last, self._repeats = message, 0
        self.lines.append(self.format(record)[:500])

    def clear(self) -> None:
        self.lines.clear()
        self._last, self._repeats = None, 0

    def text(self) -> str:
        tail = [f"{'':9} (the line above {self._repeats} more times)"] if self._repeats else []
        return "\n".join([*self.lines, *tail])


_TRACE = _Trace()


@pytest.fixture(autouse=True)
def _traced() -> Iterator[None]:
    """Each test's trace: the clients' and the daemon's loggers at DEBUG into `_TRACE`."""
    _TRACE.clear()
    loggers = [logging.getLogger(name) for name in ("kafka", "tiered.app.kafka_api")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(_TRACE)
        lg.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(_TRACE)
            lg.setLevel(level)


def _ends(history: History) -> dict[int, int]:
    return {p: history.records[(TOPIC, p)][-1].offset + 1 for p in PARTITIONS}


def _kp_rec(m: object) -> Rec:
    return Rec(m.offset, m.timestamp, m.key, m.value,  # type: ignore[attr-defined]
               tuple((k, v) for k, v in m.headers))  # type: ignore[attr-defined]


def _ck_rec(m: confluent_kafka.Message) -> Rec:
    return Rec(m.offset(), m.timestamp()[1], m.key(), m.value(),
               tuple((k, v) for k, v in (m.headers() or [])))


def _until(done: Callable[[], bool], step: Callable[[], None],
           state: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not done():
        if time.monotonic() >= deadline:
            try:
                where = state()
            except Exception as exc:  # a stuck client may fail this too: the trace still helps
                where = f"(its state could not be read: {exc!r})"
            trace = _TRACE.text()
            pytest.fail(f"the client stopped making progress: {where}\n"
                        f"the last log records:\n{trace}")
        step()


def _crosses_the_boundary(history: History) -> None:
    for p in PARTITIONS:  # the data really is in two places
        records = history.records[(TOPIC, p)]
        assert records[0].offset < history.local_start[(TOPIC, p)] <= records[-1].offset


# --- kafka-python ---------------------------------------------------------------------------------


def _kp_consumer(daemon: Daemon, **kw: object) -> kafka.KafkaConsumer:
    return kafka.KafkaConsumer(bootstrap_servers=bootstrap(daemon), client_id="kp-test",
                               request_timeout_ms=60_000,
                               metadata_max_age_ms=KP_METADATA_MAX_AGE_MS, **kw)


def _kp_subscribe(consumer: kafka.KafkaConsumer) -> None:
    """Subscribe once the client knows the topic's partitions. kafka-python (3.0) joins the
    group without waiting for the topic's metadata, as the Java client does: a leader that
    assigns before the metadata lands assigns nothing, and the rebalance it then starts is
    dropped when a short `poll` times out during it (the leader's own assignment already
    matches the metadata), leaving the consumer with no partitions for good."""
    assert consumer.partitions_for_topic(TOPIC) == set(PARTITIONS)
    consumer.subscribe([TOPIC])


def _kp_read(consumer: kafka.KafkaConsumer, stop: Callable[[dict[int, list[Rec]]], bool]
             ) -> dict[int, list[Rec]]:
    got: dict[int, list[Rec]] = {p: [] for p in PARTITIONS}

    def step() -> None:
        for tp, messages in consumer.poll(timeout_ms=500, max_records=50).items():
            got[tp.partition].extend(_kp_rec(m) for m in messages)

    def state() -> str:
        assigned = consumer.assignment()
        return (f"assigned {sorted(assigned)}, positions "
                f"{ {tp.partition: consumer.position(tp, timeout_ms=1000) for tp in assigned} }, "
                f"records got {({p: len(r) for p, r in got.items()})}")

    _until(lambda: stop(got), step, state)
    return got


def test_kafka_python_assign_and_seek_to_beginning(history: History, daemon: Daemon) -> None:
    _crosses_the_boundary(history)
    ends = _ends(history)
    consumer = _kp_consumer(daemon, enable_auto_commit=False)
    try:
        tps = [kafka.TopicPartition(TOPIC, p) for p in PARTITIONS]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got = _kp_read(consumer, lambda g: all(g[p] and g[p][-1].offset >= ends[p] - 1
                                              for p in PARTITIONS))
        assert consumer.end_offsets(tps) == {tp: ends[tp.partition] for tp in tps}
    finally:
        consumer.close()
    for p in PARTITIONS:
        assert got[p] == history.records[(TOPIC, p)], p


def _group_offsets(history: History, group: str) -> dict[tuple[str, int], int]:
    with history.store() as store:
        stored, etag = load_group_offsets(store, group)
        assert etag is not None, f"nothing at {keys.group_offsets_key(group)}"
    return {tp: c.offset for tp, c in stored.offsets.items()}


def test_kafka_python_group_commits_and_resumes_after_a_restart(history: History) -> None:
    group = f"kp-{uuid.uuid4().hex[:8]}"
    half = {p: len(history.records[(TOPIC, p)]) // 2 for p in PARTITIONS}
    config = history.config(cache="cache-kp-group")
    with running(config) as first:
        consumer = _kp_consumer(first, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", session_timeout_ms=10_000)
        _kp_subscribe(consumer)
        got = _kp_read(consumer, lambda g: all(len(g[p]) >= half[p] for p in PARTITIONS))
        seen = {p: got[p][:half[p]] for p in PARTITIONS}
        consumer.commit({kafka.TopicPartition(TOPIC, p): OffsetAndMetadata(
            seen[p][-1].offset + 1, "", -1) for p in PARTITIONS})
        consumer.close(autocommit=False)
    assert _group_offsets(history, group) == {(TOPIC, p): seen[p][-1].offset + 1
                                              for p in PARTITIONS}
    ends = _ends(history)
    with running(config) as second:  # a restarted sidecar: the offsets come from the bucket
        consumer = _kp_consumer(second, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", session_timeout_ms=10_000)
        _kp_subscribe(consumer)
        rest = _kp_read(consumer, lambda g: all(g[p] and g[p][-1].offset >= ends[p] - 1
                                                for p in PARTITIONS))
        consumer.close(autocommit=False)
    for p in PARTITIONS:
        assert seen[p] + rest[p] == history.records[(TOPIC, p)], p


# --- confluent-kafka (librdkafka) -----------------------------------------------------------------


def _ck_consumer(daemon: Daemon, **kw: object) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer({"bootstrap.servers": bootstrap(daemon),
                                     "enable.auto.commit": False, **kw})


def _ck_read(consumer: confluent_kafka.Consumer, stop: Callable[[dict[int, list[Rec]]], bool]
             ) -> dict[int, list[Rec]]:
    got: dict[int, list[Rec]] = {p: [] for p in PARTITIONS}

    def step() -> None:
        for m in consumer.consume(num_messages=50, timeout=0.5):
            assert m.error() is None, m.error()
            got[m.partition()].append(_ck_rec(m))

    def state() -> str:
        positions = consumer.position(consumer.assignment())
        return (f"positions {[(tp.partition, tp.offset) for tp in positions]}, "
                f"records got {({p: len(r) for p, r in got.items()})}")

    _until(lambda: stop(got), step, state)
    return got


def test_confluent_assign_from_the_beginning(history: History, daemon: Daemon) -> None:
    ends = _ends(history)
    consumer = _ck_consumer(daemon, **{"group.id": "unused-assign"})
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in PARTITIONS])
        got = _ck_read(consumer, lambda g: all(g[p] and g[p][-1].offset >= ends[p] - 1
                                              for p in PARTITIONS))
        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(TOPIC, 0),
                                                   timeout=30)
        assert (low, high) == (0, ends[0])  # the earliest offset is in the bucket
    finally:
        consumer.close()
    for p in PARTITIONS:
        assert got[p] == history.records[(TOPIC, p)], p


def test_confluent_lists_every_topic(history: History, daemon: Daemon,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka's Metadata for every topic (v13, three bytes past its last field) is
    answered, not taken for a malformed request."""
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap(daemon)})
    with caplog.at_level(logging.DEBUG, logger="tiered.app.kafka_api"):
        listed = admin.list_topics(timeout=30)
    assert TOPIC in listed.topics and len(listed.topics[TOPIC].partitions) == len(PARTITIONS)
    assert not any("closing the connection" in r.getMessage() for r in caplog.records)


def test_confluent_group_commits_and_resumes_after_a_restart(history: History) -> None:
    group = f"ck-{uuid.uuid4().hex[:8]}"
    half = {p: len(history.records[(TOPIC, p)]) // 2 for p in PARTITIONS}
    settings = {"group.id": group, "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000}
    config = history.config(cache="cache-ck-group")
    with running(config) as first:
        consumer = _ck_consumer(first, **settings)
        consumer.subscribe([TOPIC])
        got = _ck_read(consumer, lambda g: all(len(g[p]) >= half[p] for p in PARTITIONS))
        seen = {p: got[p][:half[p]] for p in PARTITIONS}
        consumer.commit(offsets=[confluent_kafka.TopicPartition(TOPIC, p, seen[p][-1].offset + 1)
                                 for p in PARTITIONS], asynchronous=False)
        consumer.close()
    assert _group_offsets(history, group) == {(TOPIC, p): seen[p][-1].offset + 1
                                              for p in PARTITIONS}
    ends = _ends(history)
    with running(config) as second:
        consumer = _ck_consumer(second, **settings)
        consumer.subscribe([TOPIC])
        committed = consumer.committed([confluent_kafka.TopicPartition(TOPIC, p)
                                        for p in PARTITIONS], timeout=30)
        assert [c.offset for c in committed] == [seen[p][-1].offset + 1 for p in PARTITIONS]
        rest = _ck_read(consumer, lambda g: all(g[p] and g[p][-1].offset >= ends[p] - 1
                                                for p in PARTITIONS))
        consumer.close()
    for p in PARTITIONS:
        assert seen[p] + rest[p] == history.records[(TOPIC, p)], p


# --- kcat ------------------------------------------------------------------------------------


def test_kcat_lists_metadata_and_consumes_each_partition(history: History, daemon: Daemon,
                                                         kcat: str) -> None:
    listing = subprocess.run([kcat, "-b", bootstrap(daemon), "-L"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    assert f'topic "{TOPIC}" with 2 partitions' in listing
    assert "partition 1, leader 0, replicas: 0, isrs: 0" in listing
    for p in PARTITIONS:
        proc = subprocess.run([kcat, "-b", bootstrap(daemon), "-C", "-t", TOPIC, "-p", str(p),
                               "-o", "beginning", "-e", "-f", KCAT_FORMAT],
                              capture_output=True, timeout=120, check=True)
        assert kcat_records(proc.stdout) == history.records[(TOPIC, p)], p
        assert b"Reached end of topic" in proc.stderr
