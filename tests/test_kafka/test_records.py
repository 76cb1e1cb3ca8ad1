"""Record batch v2 codec: header fields, record shapes, CRC coverage, corrupt and truncated
input, and a hypothesis round trip over random batches."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.errors import CorruptSegmentError
from tiered.kafka.builder import control_record, encode_batch, make_records
from tiered.kafka.compression import CODECS, MAX_DECOMPRESSED_BYTES
from tiered.kafka.records import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    CONTROL_MASK,
    CRC_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Header,
    Record,
    TruncatedBatchError,
    any_batch_has,
    decode_batch,
    iter_batch_headers,
    iter_batches,
    read_batch_header,
    whole_batches_end,
)
from tiered.kafka.varint import encode_varint, encode_varlong

PATH = "orders-0/00000000000000000100.log"
RECORDS_COUNT_OFFSET = BATCH_HEADER.size - 4


def _sample(base: int = 100, n: int = 3) -> list[Record]:
    return make_records(
        [b"v%d" % i for i in range(n)], base_offset=base, timestamp=1_700_000_000_000
    )


def _fix_crc(batch: bytearray, pos: int = 0) -> None:
    """Recompute the CRC of the batch at `pos` after a test edited it on purpose."""
    (length,) = struct.unpack_from(">i", batch, pos + LENGTH_OFFSET)
    end = pos + LOG_OVERHEAD + length
    struct.pack_into(
        ">I", batch, pos + CRC_OFFSET, crc32c.crc32c(batch[pos + ATTRIBUTES_OFFSET : end])
    )


def _with_body(batch: bytes, body: bytes, records_count: int | None = None) -> bytes:
    """`batch` (uncompressed) with its records area replaced by `body`, length and CRC fixed."""
    out = bytearray(batch[: BATCH_HEADER.size] + body)
    struct.pack_into(">i", out, LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    if records_count is not None:
        struct.pack_into(">i", out, RECORDS_COUNT_OFFSET, records_count)
    _fix_crc(out)
    return bytes(out)


def _raw_record(offset_delta: int, key: bytes = b"k", *, length_adjust: int = 0) -> bytes:
    fields = (
        b"\x00"
        + encode_varlong(0)
        + encode_varint(offset_delta)
        + encode_varint(len(key))
        + key
        + encode_varint(1)
        + b"v"
        + encode_varint(0)
    )
    return encode_varint(len(fields) + length_adjust) + fields


# --- layout constants ----------------------------------------------------------------------


def test_layout_constants_match_the_kafka_format() -> None:
    assert BATCH_HEADER.size == 61
    assert LOG_OVERHEAD == 12
    assert (LENGTH_OFFSET, MAGIC_OFFSET, CRC_OFFSET, ATTRIBUTES_OFFSET) == (8, 16, 17, 21)


# --- round trips of fields and record shapes -----------------------------------------------


def test_every_header_field_round_trips() -> None:
    records = [
        Record(1000, 5_000, b"a", b"1"),
        Record(1002, 4_000, b"b", b"2"),  # gap (compaction) and an earlier timestamp
    ]
    data = encode_batch(
        records,
        base_offset=998,
        compression="none",
        partition_leader_epoch=7,
        producer_id=123456789012,
        producer_epoch=3,
        base_sequence=42,
        transactional=True,
        max_timestamp=9_000,
    )
    header = read_batch_header(data)
    assert header == BatchHeader(
        position=0,
        base_offset=998,
        batch_length=len(data) - LOG_OVERHEAD,
        partition_leader_epoch=7,
        magic=2,
        crc=crc32c.crc32c(data[ATTRIBUTES_OFFSET:]),
        attributes=0x10,
        last_offset_delta=4,
        first_timestamp=5_000,
        max_timestamp=9_000,
        producer_id=123456789012,
        producer_epoch=3,
        base_sequence=42,
        records_count=2,
    )
    assert header.size == len(data) == header.end_position
    assert (header.last_offset, header.next_offset) == (1002, 1003)
    assert header.compression == "none"
    assert header.timestamp_type == "create"
    assert header.is_transactional and not header.is_control
    assert header.delete_horizon_ms is None
    assert decode_batch(data).records == tuple(records)


def test_defaults_mean_no_producer_and_max_timestamp_from_records() -> None:
    records = [Record(5, 300, None, b"x"), Record(6, 900, None, b"y"), Record(7, 100, None, b"z")]
    header = read_batch_header(encode_batch(records, base_offset=5))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert (header.first_timestamp, header.max_timestamp) == (300, 900)
    assert (header.attributes, header.partition_leader_epoch) == (0, 0)


def test_log_append_time_gives_every_record_the_batch_max_timestamp() -> None:
    data = encode_batch(_sample(), base_offset=100, timestamp_type="log_append", max_timestamp=77)
    batch = decode_batch(data)
    assert batch.header.timestamp_type == "log_append"
    assert batch.header.attributes & 0x08
    assert [r.timestamp for r in batch.records] == [77, 77, 77]


def test_delete_horizon_is_the_base_timestamp_and_record_timestamps_survive() -> None:
    records = [Record(0, 1_000, b"k", None), Record(1, 1_500, b"k2", b"v")]
    data = encode_batch(records, base_offset=0, delete_horizon_ms=86_400_000)
    batch = decode_batch(data)
    assert batch.header.attributes & 0x40
    assert batch.header.delete_horizon_ms == 86_400_000 == batch.header.first_timestamp
    assert batch.records == tuple(records)


def test_null_and_empty_keys_and_values_stay_distinct() -> None:
    records = [
        Record(0, 10, None, b"null key"),
        Record(1, 11, b"", b"empty key"),
        Record(2, 12, b"tombstone", None),
        Record(3, 13, b"empty value", b""),
        Record(4, 14, None, None),
    ]
    decoded = decode_batch(encode_batch(records, base_offset=0)).records
    assert decoded == tuple(records)
    assert decoded[0].key is None and decoded[1].key == b""
    assert decoded[2].value is None and decoded[3].value == b""


def test_headers_round_trip_including_null_values_and_unicode_keys() -> None:
    headers = (
        Header("trace-id", b"abc"),
        Header("empty", b""),
        Header("null", None),
        Header("ключ", b"\x00"),
    )
    records = [Record(0, 1, b"k", b"v", headers), Record(1, 2, b"k", b"v", ())]
    assert decode_batch(encode_batch(records, base_offset=0)).records == tuple(records)


def test_record_attributes_byte_is_kept() -> None:
    records = [Record(0, 1, None, b"v", attributes=0x7F)]
    assert decode_batch(encode_batch(records, base_offset=0)).records[0].attributes == 0x7F


@pytest.mark.parametrize("compression", list(CODECS))
def test_each_compression_codec_round_trips(compression: str) -> None:
    records = make_records(
        [b"payload-%d " % i * 20 for i in range(200)],
        base_offset=5_000,
        timestamp=1_700_000_000_000,
        keys=[b"key-%d" % (i % 7) for i in range(200)],
    )
    data = encode_batch(records, base_offset=5_000, compression=compression)
    batch = decode_batch(data)
    assert batch.header.compression == compression
    assert batch.header.attributes & 0x07 == CODECS[compression].codec_id
    assert batch.records == tuple(records)
    if compression != "none":
        assert len(data) < len(encode_batch(records, base_offset=5_000)) // 2


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_a_batch_expanding_past_the_decompression_limit_is_corrupt_at_its_position(
    compression: str,
) -> None:
    # a few KiB on disk, more than MAX_DECOMPRESSED_BYTES once decompressed: refused once the
    # limit is out, never expanded whole
    records = make_records([b"\x00" * (MAX_DECOMPRESSED_BYTES + 1)], base_offset=70, timestamp=1)
    bomb = encode_batch(records, base_offset=70, compression=compression)
    assert len(bomb) < MAX_DECOMPRESSED_BYTES // 100
    data = encode_batch(_sample(0, 3), base_offset=0) + bomb
    with pytest.raises(CorruptSegmentError) as caught:
        list(iter_batches(data))
    assert caught.value.position == len(data) - len(bomb)
    assert f"batch at offset 70: {compression} payload decompresses to more than " in str(
        caught.value
    )


@pytest.mark.parametrize("kind", ["commit", "abort"])
def test_control_batch_carries_the_transaction_marker(kind: str) -> None:
    marker = control_record(kind, coordinator_epoch=9, offset=50, timestamp=123)
    assert marker.key == struct.pack(">hh", 0, 1 if kind == "commit" else 0)
    assert marker.value == struct.pack(">hi", 0, 9)
    data = encode_batch(
        [marker], base_offset=50, control=True, transactional=True, producer_id=7, producer_epoch=1
    )
    batch = decode_batch(data)
    assert batch.header.is_control and batch.header.is_transactional
    assert batch.header.attributes == 0x30
    assert batch.control_type == kind
    assert (batch.base_offset, batch.last_offset, batch.next_offset) == (50, 50, 51)


def test_data_batch_has_no_control_type() -> None:
    assert decode_batch(encode_batch(_sample(), base_offset=100)).control_type is None


def test_control_record_with_short_key_is_corrupt() -> None:
    data = encode_batch([control_record("commit", 0)], base_offset=0, control=True)
    short_key = _with_body(data, _raw_record(0, b"\x00"))
    with pytest.raises(CorruptSegmentError, match="control record at offset 0 has a key shorter"):
        decode_batch(short_key)


# --- walking several batches ---------------------------------------------------------------


def _segment() -> tuple[bytes, list[list[Record]]]:
    groups = [_sample(0, 3), _sample(3, 1), _sample(4, 5)]
    codecs = ["none", "zstd", "gzip"]
    data = b"".join(
        encode_batch(g, base_offset=g[0].offset, compression=c)
        for g, c in zip(groups, codecs, strict=True)
    )
    return data, groups


def test_iter_batch_headers_reports_positions_and_chains_offsets() -> None:
    data, groups = _segment()
    headers = list(iter_batch_headers(data, path=PATH))
    assert [h.base_offset for h in headers] == [0, 3, 4]
    assert headers[0].position == 0
    assert [h.position for h in headers[1:]] == [h.end_position for h in headers[:-1]]
    assert headers[-1].end_position == len(data)
    assert [h.compression for h in headers] == ["none", "zstd", "gzip"]


def test_iter_batches_decodes_all_and_can_start_mid_buffer() -> None:
    data, groups = _segment()
    assert [list(b.records) for b in iter_batches(data)] == groups
    second = next(iter(iter_batch_headers(data))).end_position
    assert [b.base_offset for b in iter_batches(data, second)] == [3, 4]
    assert decode_batch(data, second).records == tuple(groups[1])


def test_walks_a_memory_mapped_file_and_releases_it(tmp_path: Path) -> None:
    data, groups = _segment()
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert [h.base_offset for h in iter_batch_headers(mapped, path=str(path))] == [0, 3, 4]
        assert sum(len(b.records) for b in iter_batches(mapped)) == 9
    # leaving the `with` closed the mmap: it would raise BufferError had a view stayed exported


def test_position_outside_the_buffer_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="outside"):
        read_batch_header(b"", 1)
    with pytest.raises(ValueError, match="outside"):
        list(iter_batch_headers(b"abc", 4))


# --- CRC coverage --------------------------------------------------------------------------


def _two_batches() -> tuple[bytearray, int]:
    first = encode_batch(_sample(0, 2), base_offset=0)
    second = encode_batch(_sample(2, 2), base_offset=2)
    return bytearray(first + second), len(first)


def test_crc_covers_every_byte_from_attributes_to_the_end() -> None:
    data, second = _two_batches()
    for offset in range(second + ATTRIBUTES_OFFSET, len(data)):
        corrupt = bytearray(data)
        corrupt[offset] ^= 0x01
        with pytest.raises(CorruptSegmentError, match="CRC-32C mismatch") as info:
            list(iter_batch_headers(corrupt, path=PATH))
        assert info.value.position == second
        assert info.value.path == PATH
        assert PATH in str(info.value)


def test_crc_mismatch_names_expected_and_actual() -> None:
    data, second = _two_batches()
    data[len(data) - 1] ^= 0xFF  # last byte of the last record's value
    stored = struct.unpack_from(">I", data, second + CRC_OFFSET)[0]
    actual = crc32c.crc32c(data[second + ATTRIBUTES_OFFSET :])
    with pytest.raises(CorruptSegmentError) as info:
        decode_batch(data, second, path=PATH)
    assert f"expected 0x{stored:08x}" in str(info.value)
    assert f"actual 0x{actual:08x}" in str(info.value)
    assert str(info.value).startswith(f"{PATH}, byte {second}:")


def test_flipped_stored_crc_is_detected() -> None:
    data, _ = _two_batches()
    data[CRC_OFFSET] ^= 0x80
    with pytest.raises(CorruptSegmentError, match="CRC-32C mismatch") as info:
        read_batch_header(data, path=PATH)
    assert info.value.position == 0


def test_base_offset_and_leader_epoch_are_outside_the_crc() -> None:
    # Kafka leaves them out so the broker can assign them without re-checksumming
    data, _ = _two_batches()
    struct.pack_into(">q", data, 0, 777)
    struct.pack_into(">i", data, LENGTH_OFFSET + 4, 12)
    header = read_batch_header(data)
    assert (header.base_offset, header.partition_leader_epoch) == (777, 12)


def test_verify_crc_false_skips_the_check() -> None:
    data, _ = _two_batches()
    data[-1] ^= 0xFF
    assert len(list(iter_batch_headers(data, verify_crc=False))) == 2


# --- structurally bad batches --------------------------------------------------------------


def test_truncated_batch_names_its_position() -> None:
    data, second = _two_batches()
    cut = bytes(data[:-5])
    with pytest.raises(
        TruncatedBatchError, match="truncated batch: needs [0-9]+ bytes, the buffer has [0-9]+ left"
    ) as info:
        list(iter_batch_headers(cut, path=PATH))
    assert (info.value.position, info.value.path) == (second, PATH)
    assert isinstance(info.value, CorruptSegmentError)


@pytest.mark.parametrize("tail", [1, LOG_OVERHEAD - 1, LOG_OVERHEAD, BATCH_HEADER.size])
def test_truncated_tail_is_tolerated_when_asked(tail: int) -> None:
    data, second = _two_batches()
    cut = bytes(data[: second + tail])
    assert [h.base_offset for h in iter_batch_headers(cut, allow_truncated_tail=True)] == [0]
    with pytest.raises(TruncatedBatchError) as info:
        list(iter_batch_headers(cut))
    assert info.value.position == second


def test_truncated_tail_tolerance_does_not_hide_a_bad_crc() -> None:
    data, second = _two_batches()
    data[-1] ^= 0xFF
    with pytest.raises(CorruptSegmentError, match="CRC"):
        list(iter_batch_headers(data, allow_truncated_tail=True))


def test_bad_magic_is_corrupt() -> None:
    data, second = _two_batches()
    data[second + MAGIC_OFFSET] = 1
    with pytest.raises(CorruptSegmentError, match="unsupported magic 1") as info:
        list(iter_batch_headers(data, path=PATH))
    assert info.value.position == second


@pytest.mark.parametrize("length", [0, 48, -1, -(2**31)])
def test_batch_length_below_minimum_is_corrupt(length: int) -> None:
    data, second = _two_batches()
    struct.pack_into(">i", data, second + LENGTH_OFFSET, length)
    with pytest.raises(
        CorruptSegmentError, match=f"batch length {length} is below the minimum 49"
    ) as info:
        list(iter_batch_headers(data, allow_truncated_tail=True))
    assert info.value.position == second


def test_unknown_codec_id_in_attributes_is_corrupt() -> None:
    data = bytearray(encode_batch(_sample(), base_offset=100))
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, 5)
    _fix_crc(data)
    with pytest.raises(CorruptSegmentError, match="unknown compression codec id 5"):
        read_batch_header(data)


def test_negative_records_count_is_corrupt() -> None:
    data = bytearray(encode_batch(_sample(), base_offset=100))
    struct.pack_into(">i", data, RECORDS_COUNT_OFFSET, -1)
    _fix_crc(data)
    with pytest.raises(CorruptSegmentError, match="negative recordsCount -1"):
        read_batch_header(data)


@pytest.mark.parametrize(
    ("count", "message"),
    [(4, "record 3: .*truncated varint"), (2, "bytes left after the 2 records")],
)
def test_records_count_mismatch_is_corrupt(count: int, message: str) -> None:
    data = encode_batch(_sample(n=3), base_offset=100)
    data = _with_body(data, data[BATCH_HEADER.size :], records_count=count)
    with pytest.raises(CorruptSegmentError, match=message) as info:
        decode_batch(b"\x00" * 7 + data, 7, path=PATH)
    assert (info.value.position, info.value.path) == (7, PATH)


@pytest.mark.parametrize("adjust", [-1, 1, 1000])
def test_record_length_inconsistent_with_fields_is_corrupt(adjust: int) -> None:
    data = encode_batch(_sample(n=2), base_offset=100)
    body = _raw_record(0) + _raw_record(1, length_adjust=adjust)
    with pytest.raises(CorruptSegmentError, match="record 1:") as info:
        decode_batch(_with_body(data, body, records_count=2), path=PATH)
    assert info.value.position == 0


def test_key_length_past_the_record_is_corrupt() -> None:
    data = encode_batch(_sample(n=1), base_offset=100)
    record = bytearray(_raw_record(0, b"kk"))
    record[4] = encode_varint(50)[0]  # key length field: 2 -> 50
    with pytest.raises(CorruptSegmentError, match="record 0: key length 50 does not fit"):
        decode_batch(_with_body(data, bytes(record), records_count=1))


def test_offset_deltas_must_increase_within_last_offset_delta() -> None:
    data = encode_batch(_sample(n=2), base_offset=100)  # lastOffsetDelta 1
    for body in (_raw_record(1) + _raw_record(1), _raw_record(0) + _raw_record(2)):
        with pytest.raises(CorruptSegmentError, match="record 1: offset delta"):
            decode_batch(_with_body(data, body, records_count=2))


def test_invalid_utf8_header_key_is_corrupt_not_unicode_error() -> None:
    data = encode_batch([Record(0, 0, None, b"v", (Header("ab", b"x"),))], base_offset=0)
    broken = data.replace(b"ab", b"\xff\xfe")
    with pytest.raises(CorruptSegmentError, match="record 0: malformed: .*utf-8"):
        decode_batch(_with_body(broken, broken[BATCH_HEADER.size :]), path=PATH)


def test_corrupt_compressed_payload_with_valid_crc_names_codec_and_batch() -> None:
    data = encode_batch(_sample(), base_offset=100, compression="zstd")
    corrupt = _with_body(data, b"\x00" * 20)
    with pytest.raises(CorruptSegmentError, match="batch at offset 100: zstd payload") as info:
        list(iter_batches(corrupt, path=PATH))
    assert (info.value.position, info.value.path) == (0, PATH)


# --- encoder input checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("records", "kwargs", "message"),
    [
        ([], {}, "at least one record"),
        ([Record(5, 0, None, b""), Record(5, 0, None, b"")], {}, "not above the previous"),
        ([Record(4, 0, None, b"")], {}, "below base offset 5"),
        ([Record(5, 0, None, b"")], {"compression": "brotli"}, "unknown compression"),
        ([Record(5, 0, None, b"")], {"timestamp_type": "wall"}, "unknown timestamp type"),
        ([Record(5, 0, None, b"")], {"transactional": True}, "needs a producer id"),
        ([Record(5, 0, None, b"", attributes=256)], {}, "do not fit one byte"),
        ([Record(5, 0, None, b"")], {"producer_epoch": 40_000}, "out of range"),
        ([Record(5 + 2**31, 0, None, b"")], {}, "32-bit"),
        ([Record(5, 0, b"k", b"")], {"control": True}, "control records need"),
    ],
)
def test_encode_refuses_bad_input(records: list[Record], kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_batch(records, base_offset=5, **kwargs)


def test_make_records_needs_one_key_per_value() -> None:
    with pytest.raises(ValueError, match="1 keys for 2 values"):
        make_records([b"a", b"b"], base_offset=0, timestamp=0, keys=[b"k"])


def test_control_record_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="'commit' or 'abort'"):
        control_record("rollback", 0)


# --- property: random batches round-trip ---------------------------------------------------

_nullable_bytes = st.none() | st.binary(max_size=64)
_headers = st.lists(st.builds(Header, st.text(max_size=12), _nullable_bytes), max_size=3).map(tuple)


@st.composite
def _batches(draw: st.DrawFn) -> tuple[list[Record], dict]:
    base_offset = draw(st.integers(0, 2**62))
    n = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n))
    first_ts = draw(st.integers(0, 2**45))
    records = []
    offset = base_offset + draw(st.integers(0, 10))
    for gap in gaps:
        records.append(
            Record(
                offset,
                first_ts + draw(st.integers(-(2**40), 2**40)),
                draw(_nullable_bytes),
                draw(_nullable_bytes),
                draw(_headers),
                draw(st.integers(0, 255)),
            )
        )
        offset += gap
    kwargs = {
        "compression": draw(st.sampled_from(list(CODECS))),
        "partition_leader_epoch": draw(st.integers(-1, 2**31 - 1)),
        "producer_id": draw(st.integers(-1, 2**63 - 1)),
        "producer_epoch": draw(st.integers(-1, 2**15 - 1)),
        "base_sequence": draw(st.integers(-1, 2**31 - 1)),
    }
    return records, kwargs


@pytest.mark.slow  # a property over many batches
@settings(max_examples=150, deadline=None)
@given(batch=_batches())
def test_random_batches_round_trip(batch: tuple[list[Record], dict]) -> None:
    records, kwargs = batch
    base_offset = records[0].offset - 3 if records[0].offset >= 3 else records[0].offset
    data = encode_batch(records, base_offset=base_offset, **kwargs)
    decoded = decode_batch(data)
    assert decoded.records == tuple(records)
    header = decoded.header
    assert header.base_offset == base_offset
    assert header.last_offset == records[-1].offset
    assert header.records_count == len(records)
    assert header.compression == kwargs["compression"]
    assert header.first_timestamp == records[0].timestamp
    assert header.max_timestamp == max(r.timestamp for r in records)
    assert (header.partition_leader_epoch, header.producer_id) == (
        kwargs["partition_leader_epoch"],
        kwargs["producer_id"],
    )
    assert (header.producer_epoch, header.base_sequence) == (
        kwargs["producer_epoch"],
        kwargs["base_sequence"],
    )
    assert header.size == len(data)


def test_decoded_objects_are_frozen_and_hashable() -> None:
    batch = decode_batch(encode_batch(_sample(), base_offset=100))
    with pytest.raises(AttributeError):
        batch.records[0].offset = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        batch.header.crc = 0  # type: ignore[misc]
    assert hash(batch.records[0]) == hash(Record(100, 1_700_000_000_000, None, b"v0"))
    assert len({batch.header, read_batch_header(encode_batch(_sample(), base_offset=100))}) == 1


# ------------------------------------------------------------------ the lean header walks


def _txn_log() -> tuple[bytes, list[int]]:
    """Three batches, the middle one transactional; the batches' start positions."""
    def one(offset: int) -> list[Record]:
        return [Record(offset, 1_000, b"k", b"v")]

    batches = [encode_batch(one(0), base_offset=0),
               encode_batch(one(1), base_offset=1, transactional=True, producer_id=7),
               encode_batch(one(2), base_offset=2)]
    starts = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    return b"".join(batches), starts


def test_any_batch_has_finds_the_flag_in_the_range_it_is_given() -> None:
    data, starts = _txn_log()
    assert any_batch_has(data, TRANSACTIONAL_MASK)
    assert not any_batch_has(data, TRANSACTIONAL_MASK, 0, starts[1])
    assert any_batch_has(data, TRANSACTIONAL_MASK, starts[1], starts[2])
    assert not any_batch_has(data, TRANSACTIONAL_MASK, starts[2])
    assert not any_batch_has(data, CONTROL_MASK)
    assert not any_batch_has(data, TRANSACTIONAL_MASK, len(data))  # nothing: no batch
    with memoryview(data) as view:  # any buffer, read where it lies
        assert any_batch_has(view, TRANSACTIONAL_MASK)


def _with_length(data: bytes, at: int, length: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(">i", out, at + LENGTH_OFFSET, length)
    return bytes(out)


@pytest.mark.parametrize("case", ["negative length", "zero length", "below a header",
                                  "past the end", "truncated header", "truncated batch",
                                  "bad magic"])
def test_any_batch_has_never_follows_a_length_it_cannot_trust(case: str) -> None:
    """A hostile or damaged buffer ends the walk with CorruptSegmentError at the batch, never
    a loop, a read past the range, or an answer made from bytes that are not a batch."""
    data, starts = _txn_log()
    at = starts[0]  # the first batch is damaged; the transactional one comes after it
    hostile = {
        "negative length": _with_length(data, at, -LOG_OVERHEAD),
        "zero length": _with_length(data, at, 0),
        "below a header": _with_length(data, at, BATCH_HEADER.size - LOG_OVERHEAD - 1),
        "past the end": _with_length(data, at, len(data)),
        "truncated header": data[:BATCH_HEADER.size - 1],
        "truncated batch": data[:starts[1] - 1],
        "bad magic": data[:MAGIC_OFFSET] + b"\x01" + data[MAGIC_OFFSET + 1:],
    }[case]
    with pytest.raises(CorruptSegmentError) as err:
        any_batch_has(hostile, TRANSACTIONAL_MASK)
    assert err.value.position == at
    # a range that stops inside a batch is refused the same way
    with pytest.raises(TruncatedBatchError):
        any_batch_has(data, TRANSACTIONAL_MASK, 0, starts[1] + BATCH_HEADER.size)


def test_any_batch_has_refuses_a_range_outside_its_buffer() -> None:
    data, _starts = _txn_log()
    for start, end in ((-1, None), (0, len(data) + 1), (10, 5)):
        with pytest.raises(ValueError):
            any_batch_has(data, TRANSACTIONAL_MASK, start, end)


def test_whole_batches_end_matches_the_full_walk_on_every_cut() -> None:
    """Bytes arriving in pieces: the whole batches of every prefix, as the checked walk finds
    them."""
    data = b"".join(encode_batch([Record(i, 1, None, bytes(40 * i))], base_offset=i)
                    for i in range(6))
    for cut in range(len(data) + 1):
        expected = 0
        for h in iter_batch_headers(data[:cut], allow_truncated_tail=True):
            expected = h.end_position
        assert whole_batches_end(data[:cut]) == expected, cut
        assert whole_batches_end(data, 0, cut) == expected, cut


@pytest.mark.parametrize(("length", "keep"), [(-LOG_OVERHEAD, LOG_OVERHEAD),
                                              (0, LOG_OVERHEAD),
                                              (-1, None)])
def test_whole_batches_end_refuses_a_length_below_a_header(length: int,
                                                           keep: int | None) -> None:
    """Found as soon as the length is in, even before the rest of the header: never a
    zero or negative step, which would walk in place or backwards."""
    data, starts = _txn_log()
    hostile = _with_length(data, starts[1], length)
    if keep is not None:
        hostile = hostile[:starts[1] + keep]
    with pytest.raises(CorruptSegmentError) as err:
        whole_batches_end(hostile)
    assert err.value.position == starts[1]


def test_whole_batches_end_stops_before_a_batch_still_coming() -> None:
    data, starts = _txn_log()
    assert whole_batches_end(data[:starts[1] + LOG_OVERHEAD - 1]) == starts[1]  # no length yet
    assert whole_batches_end(_with_length(data, starts[2], len(data))) == starts[2]
    bad_magic = bytearray(data)
    bad_magic[starts[1] + MAGIC_OFFSET] = 1
    with pytest.raises(CorruptSegmentError, match="magic"):
        whole_batches_end(bytes(bad_magic))
