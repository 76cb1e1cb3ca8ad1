"""Framing: a Fetch answer with its record bytes spliced in after kio encoded the rest is byte
for byte what kio encodes with the records in place (legacy and flexible versions, lengths of
every varint size); requests parse as kio wrote them or are refused as malformed; `build` makes
any version of a message from one set of fields."""

from __future__ import annotations

import datetime
import io
import os
import struct
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from cache.fetched_bytes import FilePiece, Pieces
from tiered.app.kafka_api.catalog import topic_id_of
from tiered.app.kafka_api.messages import build, nested, request_class, response_class
from tiered.app.kafka_api.wire import MalformedRequest, Reply, new_marker, parse_request
from tiered.kafka.checkpoints import topic_id_to_str


def _fetch_response(version: int, records: list[bytes]) -> Any:
    cls = response_class(1, version)
    parts = tuple(build(nested(cls, "PartitionData"), partition_index=i,
                        error_code=ErrorCode.none, high_watermark=100, records=r)
                  for i, r in enumerate(records))
    ident = {"topic_id": uuid.UUID(int=7)} if version >= 13 else {"topic": "t"}
    return build(cls, throttle_time=datetime.timedelta(0), responses=(
        build(nested(cls, "FetchableTopicResponse"), partitions=parts, **ident),))


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16])
def test_spliced_fetch_answers_equal_kios_encoding(version: int, tmp_path: Any) -> None:
    records = [os.urandom(n) for n in (0, 5, 200, 20_000, 70_000)]
    data_file = tmp_path / "chunk"
    data_file.write_bytes(b"xx" + records[4] + b"yy")
    fd = os.open(data_file, os.O_RDONLY)
    markers: dict[bytes, Pieces] = {}
    with_markers = []
    for i, r in enumerate(records):
        if not r:
            with_markers.append(b"")
            continue
        pieces = Pieces()
        if i == 4:  # a range of an open file, as a chunk of the read cache
            pieces.add(FilePiece(fd, 2, len(r)))
        else:
            pieces.add(r[:3])
            pieces.add(r[3:])
        marker = new_marker()
        markers[marker] = pieces
        with_markers.append(marker)
    flexible = version >= 12
    reply = Reply.spliced(9, _fetch_response(version, with_markers), markers, flexible)
    whole = Reply.of(9, _fetch_response(version, records))
    try:
        sent = b"".join(p.read() if isinstance(p, Pieces) else p for p in reply.parts)
        assert sent == whole.parts[0]
        assert reply.size == len(sent)
    finally:
        reply.close()
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
