"""Cross-check the record batch codec against kafka-python, an independent implementation.

Both directions: batches kafka-python builds (every codec) decode through ours field for field,
and batches we encode parse through kafka-python's `DefaultRecordBatch` with a valid CRC.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from tiered.errors import CorruptSegmentError
from tiered.kafka.builder import control_record, encode_batch
from tiered.kafka.compression import CODECS
from tiered.kafka.records import (
    BatchHeader,
    Header,
    Record,
    decode_batch,
    iter_batch_headers,
    iter_batches,
)

_AVAILABLE = {
    "none": lambda: True,
    "gzip": kafka_codec.has_gzip,
    "snappy": kafka_codec.has_snappy,
    "lz4": kafka_codec.has_lz4,
    "zstd": kafka_codec.has_zstd,
}
CODEC_PARAMS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            not _AVAILABLE[name](), reason=f"kafka-python has no {name} library installed here"
        ),
    )
    for name in CODECS
]

BATCH_SIZE = 16 * 1024 * 1024  # large enough that the builder never refuses a record


def _sample_rows(n: int = 50) -> list[tuple[int, bytes | None, bytes | None, list]]:
    """(timestamp, key, value, headers) rows with nulls, empties, headers and repetition (so
    kafka-python's builder keeps the compressed form rather than falling back to none)."""
    rows = []
    for i in range(n):
        key = None if i % 5 == 0 else b"key-%d" % (i % 3)
        value = None if i % 7 == 3 else b"value %d " % i * (i % 4 + 1)
        headers = [("h", b"x" * (i % 3)), ("null", None)] if i % 2 else []
        rows.append((1_700_000_000_000 + i * 3 - (i % 4), key, value, headers))
    return rows


def _kafka_build(compression: str, rows: list, *, offset: int = 0, **producer: object) -> bytes:
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=CODECS[compression].codec_id,
        batch_size=BATCH_SIZE,
        offset=offset,
        **producer,
    )
    for timestamp, key, value, headers in rows:
        assert builder.append(timestamp, key, value, headers) is not None
    builder.close()
    return bytes(builder.buffer())


def _as_kafka_tuples(records: tuple[Record, ...]) -> list[tuple]:
    return [
        (r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
        for r in records
    ]


def _kafka_records(batch: DefaultRecordBatch) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


def _assert_same_header(ours: BatchHeader, theirs: DefaultRecordBatch) -> None:
    assert ours.base_offset == theirs.base_offset
    assert ours.size == theirs.size_in_bytes
    assert ours.partition_leader_epoch == theirs.leader_epoch
    assert ours.magic == theirs.magic == 2
    assert ours.crc == theirs.crc
    assert ours.attributes == theirs.attributes
    assert ours.last_offset_delta == theirs.last_offset_delta
    assert ours.last_offset == theirs.last_offset
    assert ours.next_offset == theirs.next_offset
    assert ours.first_timestamp == theirs.first_timestamp
    assert ours.max_timestamp == theirs.max_timestamp
    assert ours.producer_id == theirs.producer_id
    assert ours.producer_epoch == theirs.producer_epoch
    assert ours.base_sequence == theirs.base_sequence
    assert ours.records_count == theirs.records_count
    assert CODECS[ours.compression].codec_id == theirs.compression_type
    assert (ours.timestamp_type == "log_append") == bool(theirs.timestamp_type)
    assert ours.is_transactional == theirs.is_transactional
    assert ours.is_control == theirs.is_control_batch


# --- kafka-python writes, we read ----------------------------------------------------------


@pytest.mark.parametrize("compression", CODEC_PARAMS)
def test_batches_built_by_kafka_python_decode_identically(compression: str) -> None:
    rows = _sample_rows()
    data = _kafka_build(compression, rows, offset=1000)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()

    ours = decode_batch(data, path="kafka-python")
    assert ours.header.compression == compression
    _assert_same_header(ours.header, theirs)
    assert _as_kafka_tuples(ours.records) == _kafka_records(DefaultRecordBatch(data))
    # and the rows we fed in are what we read back
    assert [(r.timestamp, r.key, r.value) for r in ours.records] == [
        (ts, key, value) for ts, key, value, _ in rows
    ]
    assert [r.offset for r in ours.records] == list(range(1000, 1000 + len(rows)))


def test_transactional_producer_state_from_kafka_python_is_read() -> None:
    data = _kafka_build(
        "zstd",
        _sample_rows(5),
        transactional=True,
        producer_id=4242,
        producer_epoch=7,
        base_sequence=99,
    )
    header = decode_batch(data).header
    _assert_same_header(header, DefaultRecordBatch(data))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4242, 7, 99)
    assert header.is_transactional


def test_segment_of_kafka_python_batches_walks_like_memory_records() -> None:
    parts = [
        _kafka_build(name, _sample_rows(10 + i), offset=100 * i)
        for i, name in enumerate(n for n in CODECS if _AVAILABLE[n]())
    ]
    segment = b"".join(parts)
    theirs = list(MemoryRecords(segment))
    headers = list(iter_batch_headers(segment))
    assert len(headers) == len(theirs) == len(parts)
    for ours, batch in zip(headers, theirs, strict=True):
        _assert_same_header(ours, batch)
    assert [h.size for h in headers] == [len(p) for p in parts]
    decoded = list(iter_batches(segment))
    for ours_batch, their_batch in zip(decoded, MemoryRecords(segment), strict=True):
        assert _as_kafka_tuples(ours_batch.records) == _kafka_records(their_batch)


# --- we write, kafka-python reads ----------------------------------------------------------


@pytest.mark.parametrize("compression", CODEC_PARAMS)
def test_our_batches_parse_in_kafka_python_with_valid_crc(compression: str) -> None:
    records = [
        Record(
            2000 + 2 * i,  # gaps, as after compaction
            1_700_000_000_000 + (i * 37) % 11,
            None if i % 4 == 0 else b"k%d" % i,
            None if i % 9 == 4 else b"some value %d" % i * 3,
            (Header("trace", b"t%d" % i), Header("none", None)) if i % 3 else (),
        )
        for i in range(60)
    ]
    data = encode_batch(
        records,
        base_offset=1990,
        compression=compression,
        partition_leader_epoch=4,
        producer_id=77,
        producer_epoch=2,
        base_sequence=1234,
    )
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    ours = decode_batch(data).header
    _assert_same_header(ours, theirs)
    assert ours.compression == compression
    assert _kafka_records(DefaultRecordBatch(data)) == _as_kafka_tuples(tuple(records))


def test_our_log_append_batch_reads_the_same_timestamps_in_kafka_python() -> None:
    records = [Record(i, 1000 + i, None, b"v") for i in range(5)]
    data = encode_batch(records, base_offset=0, timestamp_type="log_append", max_timestamp=5000)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc() and theirs.timestamp_type == 1
    assert [r.timestamp for r in theirs] == [r.timestamp for r in decode_batch(data).records]


@pytest.mark.parametrize("kind", ["commit", "abort"])
def test_our_control_batch_is_a_kafka_python_control_record(kind: str) -> None:
    data = encode_batch(
        [control_record(kind, coordinator_epoch=3, offset=10, timestamp=99)],
        base_offset=10,
        control=True,
        transactional=True,
        producer_id=5,
        producer_epoch=0,
    )
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    assert theirs.is_control_batch and theirs.is_transactional
    (marker,) = list(theirs)
    assert marker.commit == (kind == "commit") and marker.abort == (kind == "abort")
    assert decode_batch(data).control_type == kind


def test_a_flipped_byte_fails_both_crc_checks() -> None:
    data = bytearray(encode_batch([Record(0, 0, b"k", b"value")], base_offset=0))
    data[-2] ^= 0x40
    assert not DefaultRecordBatch(bytes(data)).validate_crc()
    with pytest.raises(CorruptSegmentError, match="CRC-32C mismatch"):
        decode_batch(data)


# --- property: whatever we encode, kafka-python reads the same -----------------------------

_nullable = st.none() | st.binary(max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(1, 50),
            st.integers(-(2**40), 2**40),
            _nullable,
            _nullable,
            st.lists(st.tuples(st.text(max_size=8), _nullable), max_size=3),
        ),
        min_size=1,
        max_size=25,
    ),
    compression=st.sampled_from([n for n in CODECS if _AVAILABLE[n]()]),
    base_offset=st.integers(0, 2**40),
)
def test_random_batches_agree_with_kafka_python(
    rows: list[tuple], compression: str, base_offset: int
) -> None:
    records, offset = [], base_offset
    for gap, ts, key, value, headers in rows:
        records.append(
            Record(offset, 1_600_000_000_000 + ts, key, value, tuple(Header(*h) for h in headers))
        )
        offset += gap
    data = encode_batch(records, base_offset=base_offset, compression=compression)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    _assert_same_header(decode_batch(data).header, theirs)
    assert _kafka_records(DefaultRecordBatch(data)) == _as_kafka_tuples(tuple(records))
