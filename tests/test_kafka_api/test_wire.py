"""Framing: a Fetch answer encoded by hand, its record bytes where they lie, is byte for byte
what kio encodes with the records in place (every version served, lengths of every varint
size); requests parse as kio wrote them or are refused as malformed; `build` makes
any version of a message from one set of fields."""

from __future__ import annotations

import datetime
import io
import os
import random
import struct
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from cache.fetched_bytes import FilePiece, Pieces
from tiered.app.kafka_api.catalog import topic_id_of
from tiered.app.kafka_api.fetch_response import (
    PartitionAnswer,
    TopicAnswer,
    encode_fetch_response,
)
from tiered.app.kafka_api.messages import build, nested, request_class, response_class
from tiered.app.kafka_api.wire import MalformedRequest, Reply, parse_request
from tiered.kafka.checkpoints import topic_id_to_str


def _kio_fetch_response(version: int, topics: list[TopicAnswer], records: dict[int, bytes],
                        error_code: ErrorCode) -> Any:
    """The same answer as kio's entities (records as bytes, by partition index)."""
    cls = response_class(1, version)
    entries = []
    for t in topics:
        parts = tuple(build(
            nested(cls, "PartitionData"), partition_index=p.index,
            error_code=ErrorCode(p.error_code), high_watermark=p.high_watermark,
            last_stable_offset=p.high_watermark, log_start_offset=p.log_start_offset,
            aborted_transactions=None if p.aborted is None else tuple(
                build(nested(cls, "AbortedTransaction"), producer_id=pid, first_offset=first)
                for pid, first in p.aborted),
            preferred_read_replica=-1, records=records.get(p.index, b""))
            for p in t.partitions)
        ident = {"topic_id": t.topic_id} if version >= 13 else {"topic": t.name}
        entries.append(build(nested(cls, "FetchableTopicResponse"), partitions=parts, **ident))
    return build(cls, throttle_time=datetime.timedelta(0), error_code=error_code, session_id=0,
                 responses=tuple(entries))


@pytest.mark.parametrize("version", range(4, 19))
def test_fetch_answers_equal_kios_encoding(version: int, tmp_path: Any) -> None:
    """Every version, names and ids, nulls and empties, record lengths of every varint size,
    chunk-file ranges among the record pieces: the hand encoding is kio's, byte for byte."""
    rng = random.Random(version)
    sizes = (0, 5, 200, 20_000, 70_000, 2_100_000)
    records = {i: rng.randbytes(n) for i, n in enumerate(sizes)}
    data_file = tmp_path / "chunk"
    data_file.write_bytes(b"xx" + records[4] + b"yy")
    fd = os.open(data_file, os.O_RDONLY)
    answers = []
    for i, r in records.items():
        pieces = None
        if r:
            pieces = Pieces()
            if i == 4:  # a range of an open file, as a chunk of the read cache
                pieces.add(FilePiece(fd, 2, len(r)))
            else:
                pieces.add(r[:3])
                pieces.add(r[3:])
        aborted = (None, (), ((7, 100), (-1, 2**40)))[i % 3]
        answers.append(PartitionAnswer(i, (0, 1, 6)[i % 3], 10**i, i - 1, aborted, pieces))
    topics = [TopicAnswer("orders", uuid.UUID(int=7), answers[:4]),
              TopicAnswer("ü" * 70, uuid.UUID(int=8), answers[4:]),
              TopicAnswer("e", uuid.UUID(int=9), [])]
    try:
        for error in (ErrorCode.none, ErrorCode.fetch_session_id_not_found):
            for chosen in (topics, []):
                parts = encode_fetch_response(version, 9, chosen, error_code=error.value)
                sent = b"".join(p.read() if isinstance(p, Pieces) else p for p in parts)
                expected = Reply.of(9, _kio_fetch_response(
                    version, chosen, records, error)).parts[0]
                if version < 7:  # no top-level error code before v7
                    expected = Reply.of(9, _kio_fetch_response(
                        version, chosen, records, ErrorCode.none)).parts[0]
                assert sent == expected
                assert Reply(parts).size == len(sent)
    finally:
        os.close(fd)


def _encoded(entity: Any, correlation_id: int = 3) -> bytes:
    cls = type(entity)
    header = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header)(buf, header(request_api_key=cls.__api_key__,
                                      request_api_version=cls.__version__,
                                      correlation_id=correlation_id, client_id="c"))
    entity_writer(cls)(buf, entity)
    return buf.getvalue()


def test_requests_parse_as_kio_wrote_them() -> None:
    for version in (0, 9, 12):
        cls = request_class(3, version)
        topic = build(nested(cls, "MetadataRequestTopic"), name="orders", topic_id=None)
        frame = _encoded(build(cls, topics=(topic,)), correlation_id=41)
        req = parse_request(frame)
        assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (
            3, version, 41, "c")
        assert req.body.topics[0].name == "orders"
        # bytes past the last field stay unread, as a broker leaves them
        assert parse_request(frame + b"\x00").body == parse_request(frame).body
        with pytest.raises(MalformedRequest, match="does not parse"):
            parse_request(frame[:-3])


def test_build_drops_fields_a_version_lacks_and_defaults_the_rest() -> None:
    v0 = build(response_class(11, 0), error_code=ErrorCode.none, throttle_time=None,
               protocol_type="consumer", generation_id=3, leader="a", member_id="a")
    assert not hasattr(v0, "throttle_time") and v0.protocol_name == "" and v0.members == ()
    v9 = build(response_class(11, 9), error_code=ErrorCode.none,
               throttle_time=datetime.timedelta(0), generation_id=3, leader="a",
               member_id="a")
    assert v9.protocol_type is None and v9.skip_assignment is False


def test_topic_ids_of_bucket_revisions() -> None:
    tid = uuid.uuid4()
    assert topic_id_of("t", topic_id_to_str(tid)) == tid  # a Kafka topic id is itself
    assert topic_id_of("t", "0") == topic_id_of("t", "0") != topic_id_of("u", "0")


def test_frames_are_size_prefixed() -> None:
    reply = Reply.of(5, build(response_class(18, 0), error_code=ErrorCode.none, api_keys=()))
    (frame,) = reply.parts
    assert isinstance(frame, bytes)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    assert frame[4:8] == b"\x00\x00\x00\x05"
