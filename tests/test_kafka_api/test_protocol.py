"""The Kafka endpoint at the protocol level, with requests encoded by kio over plain sockets:
Fetch answers carry the stored batches byte for byte within the byte budgets (every Fetch
version family: names, topic ids), a fetch at the log end waits for data and gets it, offsets
and errors are Kafka's, and malformed, oversized or unserved requests close only their own
connection while the daemon goes on serving."""

from __future__ import annotations

import datetime
import logging
import threading
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from prometheus_client.parser import text_string_to_metric_families
from support.kafka_endpoint import (
    T0_MS,
    TOPIC,
    History,
    RawClient,
    append_local,
    bootstrap,
    request_class,
    write_history,
)
from support.waiting import wait_until

from tiered.app.daemon import Daemon
from tiered.app.kafka_api.messages import build, nested

pytestmark = pytest.mark.timeout(300)

FETCH, LIST_OFFSETS, METADATA, API_VERSIONS = 1, 2, 3, 18


def _fetch(client: RawClient, version: int, partitions: list[tuple[int, int, int]], *,
           topic: str = TOPIC, topic_id: uuid.UUID | None = None, max_bytes: int = 1 << 30,
           max_wait_ms: int = 0, min_bytes: int = 0, isolation: int = 0) -> Any:
    """Fetch (partition, offset, partition_max_bytes) of one topic."""
    cls = request_class(FETCH, version)
    part_cls, topic_cls = nested(cls, "FetchPartition"), nested(cls, "FetchTopic")
    parts = tuple(build(part_cls, partition=p, fetch_offset=o, partition_max_bytes=m,
                        current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
                  for p, o, m in partitions)
    ident = {"topic_id": topic_id} if version >= 13 else {"topic": topic}
    # v15+ say who fetches in a struct instead of replica_id
    replica_state = build(nested(cls, "ReplicaState"), replica_id=-1,
                          replica_epoch=-1) if version >= 15 else None
    return client.request(build(
        cls, replica_id=-1, replica_state=replica_state,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=min_bytes,
        max_bytes=max_bytes, isolation_level=isolation, session_id=0, session_epoch=-1,
        topics=(build(topic_cls, partitions=parts, **ident),), forgotten_topics_data=(),
        rack_id=""))


def _topic_id(client: RawClient, topic: str) -> uuid.UUID:
    cls = request_class(METADATA, 12)
    got = client.request(build(cls, topics=(build(nested(cls, "MetadataRequestTopic"),
                                                  name=topic, topic_id=None),)))
    (entry,) = got.topics
    assert entry.error_code == ErrorCode.none and entry.name == topic
    return entry.topic_id


@pytest.fixture
def client(daemon: Daemon) -> Any:
    assert daemon.kafka is not None
    c = RawClient(daemon.kafka.port)
    yield c
    c.close()


@pytest.mark.parametrize("version", [4, 7, 11, 12, 13, 16, 18])
def test_fetch_answers_stored_batches_byte_for_byte(history: History, client: RawClient,
                                                    version: int) -> None:
    topic_id = _topic_id(client, TOPIC) if version >= 13 else None
    start = history.local_start[(TOPIC, 0)]
    end = history.records[(TOPIC, 0)][-1].offset + 1
    for offset in (0, 5, start - 1, start, history.archived_end[(TOPIC, 0)], end - 1):
        got = _fetch(client, version, [(0, offset, 3000)], topic_id=topic_id)
        (topic,) = got.responses
        (part,) = topic.partitions
        assert part.error_code == ErrorCode.none
        assert part.high_watermark == end
        assert part.records == history.expected_bytes(TOPIC, 0, offset, 3000), offset
        assert part.aborted_transactions is None  # read_uncommitted


def test_max_bytes_bounds_the_whole_answer(history: History, client: RawClient) -> None:
    got = _fetch(client, 12, [(0, 0, 2500), (1, 0, 2500)], max_bytes=3000)
    first, second = got.responses[0].partitions
    want = history.expected_bytes(TOPIC, 0, 0, 2500)
    assert first.records == want
    # the second partition gets whole batches within what is left, never a first batch that
    # does not fit (only the answer's very first batch may exceed the budget)
    assert second.records == history.expected_bytes(TOPIC, 1, 0, 3000 - len(want), first=False)
    assert len(first.records) + len(second.records) <= 3000
    tiny = _fetch(client, 12, [(0, 0, 1)], max_bytes=1)
    # KIP-74: the first batch comes whatever the budget
    assert tiny.responses[0].partitions[0].records == history.batches[(TOPIC, 0)][0][2]


def test_errors_are_kafkas(history: History, client: RawClient) -> None:
    end = history.records[(TOPIC, 1)][-1].offset + 1
    at_end = _fetch(client, 12, [(1, end, 1000)], max_wait_ms=10)
    part = at_end.responses[0].partitions[0]
    assert (part.error_code, part.records, part.high_watermark) == (ErrorCode.none, b"", end)
    past = _fetch(client, 12, [(1, end + 1, 1000)]).responses[0].partitions[0]
    assert past.error_code == ErrorCode.offset_out_of_range and past.high_watermark == end
    unknown = _fetch(client, 12, [(0, 0, 1000)], topic="no-such-topic")
    assert unknown.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    no_id = _fetch(client, 13, [(0, 0, 1000)], topic_id=uuid.uuid4())
    assert no_id.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id
    missing = _fetch(client, 12, [(7, 0, 1000)]).responses[0].partitions[0]
    assert missing.error_code == ErrorCode.unknown_topic_or_partition


def test_list_offsets_earliest_latest_and_by_time(history: History, client: RawClient) -> None:
    cls = request_class(LIST_OFFSETS, 6)
    records = history.records[(TOPIC, 0)]
    local = history.local_start[(TOPIC, 0)]
    wanted = [-2, -1, T0_MS, T0_MS + 3 * (local // 2), T0_MS + 3 * (local + 3),
              T0_MS + 3 * records[-1].offset + 1]
    parts = tuple(build(nested(cls, "ListOffsetsPartition"), partition_index=0,
                        current_leader_epoch=-1, timestamp=ts) for ts in wanted)
    got = client.request(build(cls, replica_id=-1, isolation_level=0, topics=(
        build(nested(cls, "ListOffsetsTopic"), name=TOPIC, partitions=parts),)))
    answers = [(p.error_code, p.offset) for p in got.topics[0].partitions]

    def first_at(ts: int) -> int:
        return next((r.offset for r in records if r.timestamp >= ts), -1)

    assert answers == [(ErrorCode.none, 0), (ErrorCode.none, records[-1].offset + 1)] + [
        (ErrorCode.none, first_at(ts)) for ts in wanted[2:]]


def test_a_fetch_at_the_log_end_waits_for_new_data(history: History, daemon: Daemon) -> None:
    """min_bytes / max_wait: a fetch at the end is held until data arrives, then answered
    with it (had it not looked again, it would answer empty when max_wait ran out)."""
    end = write_history(history.log_dir, "live", 0, batches=3, seed=9)
    assert daemon.kafka is not None
    c = RawClient(daemon.kafka.port, timeout=120)
    results: list[Any] = []
    try:
        # the daemon notices a new topic within a second
        wait_until(lambda: _fetch(c, 12, [(0, end, 1)], topic="live").responses[0].partitions[
            0].error_code == ErrorCode.none, "the new topic to appear", timeout_s=60)
        waiter = threading.Thread(target=lambda: results.append(
            _fetch(c, 12, [(0, end, 1 << 20)], topic="live", max_wait_ms=60_000, min_bytes=1)))
        waiter.start()
        new_end = append_local(history.log_dir, "live", 0, batches=2, seed=10)
        waiter.join(timeout=120)
        assert not waiter.is_alive()
    finally:
        c.close()
    part = results[0].responses[0].partitions[0]
    assert part.error_code == ErrorCode.none
    assert part.records, "the waiting fetch did not see the appended batches"
    assert part.high_watermark == new_end


def test_api_versions_lists_reads_and_refused_writes(client: RawClient) -> None:
    got = client.request(build(request_class(API_VERSIONS, 3), client_software_name="t",
                               client_software_version="1"))
    served = {k.api_key: (k.min_version, k.max_version) for k in got.api_keys}
    assert served[FETCH] == (4, 18) and served[METADATA] == (0, 13) and 0 in served


def test_an_unknown_api_versions_version_gets_unsupported_version(client: RawClient) -> None:
    # api key 18, version 99, correlation id 5, client id null
    client.send_frame(b"\x00\x12\x00\x63\x00\x00\x00\x05\xff\xff")
    frame = client.read_frame()
    assert frame[:4] == b"\x00\x00\x00\x05"  # correlation id; a v0 header has nothing else
    assert frame[4:6] == (35).to_bytes(2, "big")  # UNSUPPORTED_VERSION
    # the connection stays: the client retries with a version it finds in the answer
    got = client.request(build(request_class(API_VERSIONS, 0)))
    assert got.error_code == ErrorCode.none


@pytest.mark.parametrize(("frame", "logged"), [
    (b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x01x\x00\xff\xff\xff", "does not parse"),
    (b"\x00\x37\x00\x00\x00\x00\x00\x01\x00\x00", "API key 55 is not served"),
    (b"\x00\x01\x00\x03\x00\x00\x00\x01\x00\x00", "Fetch v3 is not served"),
    (b"\x00\x00", "requests must be 8.."),
])
def test_bad_requests_close_only_their_connection(daemon: Daemon, caplog: pytest.LogCaptureFixture,
                                                  frame: bytes, logged: str) -> None:
    assert daemon.kafka is not None
    port = daemon.kafka.port
    bystander = RawClient(port)
    bad = RawClient(port)
    try:
        # bad requests from one address are logged once a minute, the rest at debug level
        with caplog.at_level(logging.DEBUG, logger="tiered.app.kafka_api"):
            bad.send_frame(frame)
            assert bad.closed_by_server()
        assert any(logged in r.getMessage() for r in caplog.records), caplog.text
        # the connection opened before, and a new one, are served as if nothing happened
        for c in (bystander, RawClient(port)):
            assert _topic_id(c, TOPIC) is not None
    finally:
        bystander.close()
        bad.close()


def test_an_oversized_request_closes_its_connection(daemon: Daemon,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    assert daemon.kafka is not None
    bad = RawClient(daemon.kafka.port)
    try:
        with caplog.at_level(logging.DEBUG, logger="tiered.app.kafka_api"):
            bad.sock.sendall((1 << 30).to_bytes(4, "big"))  # 1 GiB announced: never read
            assert bad.closed_by_server()
        assert "max_request_bytes" in caplog.text
    finally:
        bad.close()
    assert _topic_id(RawClient(daemon.kafka.port), TOPIC) is not None


def test_a_clients_bad_requests_are_logged_once_a_minute_and_all_counted(
        daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    assert daemon.kafka is not None
    before = daemon.kafka.stats()["closed_bad_requests"]
    with caplog.at_level(logging.DEBUG, logger="tiered.app.kafka_api"):
        for _ in range(3):
            bad = RawClient(daemon.kafka.port)
            try:
                bad.send_frame(b"\x00\x37\x00\x00\x00\x00\x00\x01\x00\x00")  # API key 55
                assert bad.closed_by_server()
            finally:
                bad.close()
    closing = [r for r in caplog.records if "closing the connection from 127.0.0.1" in
               r.getMessage()]
    assert len(closing) == 3
    # one WARNING at most (none when an earlier test's bad request was logged this minute)
    assert sum(r.levelno == logging.WARNING for r in closing) <= 1
    assert sum(r.levelno == logging.DEBUG for r in closing) >= 2
    assert daemon.kafka.stats()["closed_bad_requests"] == before + 3

def test_slow_and_stuck_clients_do_not_stall_others(history: History, daemon: Daemon) -> None:
    """One client sends half a request header and stops; another pipelines fetches and never
    reads the answers (its connection's thread blocks writing once the socket buffers are
    full); a third reads the whole partition meanwhile."""
    assert daemon.kafka is not None
    port = daemon.kafka.port
    stalled, hoarder, reader = RawClient(port), RawClient(port), RawClient(port)
    try:
        stalled.sock.sendall(b"\x00\x00")
        cls = request_class(FETCH, 12)
        one = b"".join(_encoded_fetches(cls, 200))
        hoarder.sock.settimeout(5)
        hoarder.sock.sendall(one)  # 200 answers of every byte of partition 0, never read
        end = history.records[(TOPIC, 0)][-1].offset + 1
        offset, data = 0, b""
        while offset < end:
            part = _fetch(reader, 12, [(0, offset, 1 << 20)]).responses[0].partitions[0]
            assert part.error_code == ErrorCode.none and part.records
            data += part.records
            offset = _next(history, data)
        assert data == b"".join(b[2] for b in history.batches[(TOPIC, 0)])
    finally:
        for c in (stalled, hoarder, reader):
            c.close()


def _next(history: History, data: bytes) -> int:
    """The offset after the batches `data` holds (answers end on batch boundaries)."""
    size = 0
    for _base, last, batch in history.batches[(TOPIC, 0)]:
        size += len(batch)
        if size == len(data):
            return last + 1
    raise AssertionError("an answer ended inside a batch")


def _encoded_fetches(cls: type[Any], count: int) -> list[bytes]:
    import io
    import struct

    from kio.serial import entity_writer

    part = build(nested(cls, "FetchPartition"), partition=0, fetch_offset=0,
                 partition_max_bytes=1 << 30, current_leader_epoch=-1, last_fetched_epoch=-1,
                 log_start_offset=-1)
    body = build(cls, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
                 max_bytes=1 << 30, isolation_level=0, session_id=0, session_epoch=-1,
                 topics=(build(nested(cls, "FetchTopic"), topic=TOPIC, partitions=(part,)),),
                 forgotten_topics_data=(), rack_id="")
    out = []
    for i in range(count):
        buf = io.BytesIO()
        header = cls.__header_schema__
        entity_writer(header)(buf, header(request_api_key=1, request_api_version=12,
                                          correlation_id=i, client_id="hoarder"))
        entity_writer(cls)(buf, body)
        out.append(struct.pack(">i", len(buf.getvalue())) + buf.getvalue())
    return out


def test_metrics_count_the_endpoints_work(daemon: Daemon, client: RawClient) -> None:
    _topic_id(client, TOPIC)
    import urllib.request

    with urllib.request.urlopen(f"{daemon.server.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("tiered_kafka_requests_total", (("api", "Metadata"),))] >= 1
    assert samples[("tiered_kafka_connections", ())] >= 1
    assert samples[("tiered_kafka_sent_bytes_total", ())] > 0
    assert bootstrap(daemon).endswith(str(daemon.kafka.port))  # type: ignore[union-attr]
