"""Compression codec registry: ids and names as Kafka assigns them, round trips for every codec,
the wire formats other writers produce, and corrupt payloads refused as CorruptSegmentError."""

from __future__ import annotations

import gzip
import io
import os
import struct

import cramjam
import lz4.block
import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.codec import snappy_encode as kafka_snappy_encode

from tiered.errors import CorruptSegmentError
from tiered.kafka.compression import CODECS, CODECS_BY_ID, Codec, codec_by_id, codec_by_name

PAYLOADS = {
    "empty": b"",
    "one-byte": b"x",
    "text": b"the quick brown fox jumps over the lazy dog " * 50,
    # bigger than one snappy xerial block (32 KiB) and mixing incompressible with repetitive
    "mixed-100k": os.urandom(40_000) + b"\x00" * 60_000,
}


def test_registry_matches_kafka_attribute_ids() -> None:
    assert {name: codec.codec_id for name, codec in CODECS.items()} == {
        "none": 0,
        "gzip": 1,
        "snappy": 2,
        "lz4": 3,
        "zstd": 4,
    }
    assert all(CODECS_BY_ID[codec.codec_id] is codec for codec in CODECS.values())
    assert codec_by_name("zstd") is codec_by_id(4) is CODECS["zstd"]


@pytest.mark.parametrize("codec_id", [5, 6, 7, -1])
def test_unknown_codec_id_is_corrupt_data(codec_id: int) -> None:
    with pytest.raises(CorruptSegmentError, match=f"unknown compression codec id {codec_id}"):
        codec_by_id(codec_id)


def test_unknown_codec_name_is_a_value_error_listing_known_names() -> None:
    with pytest.raises(ValueError, match="'brotli'.*gzip, snappy, lz4, zstd"):
        codec_by_name("brotli")


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("payload", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_round_trip(name: str, payload: bytes) -> None:
    codec = CODECS[name]
    compressed = codec.compress(payload)
    assert isinstance(compressed, bytes)
    assert codec.decompress(compressed) == payload
    # a memoryview over a larger buffer (how records.py hands payloads over) works too
    framed = b"##" + compressed + b"##"
    assert codec.decompress(memoryview(framed)[2:-2]) == payload


@pytest.mark.parametrize("name", [n for n in CODECS if n != "none"])
def test_compression_shrinks_repetitive_data(name: str) -> None:
    payload = PAYLOADS["text"]
    assert len(CODECS[name].compress(payload)) < len(payload) // 4


@settings(max_examples=50)
@given(payload=st.binary(max_size=5000), name=st.sampled_from(list(CODECS)))
def test_round_trip_property(payload: bytes, name: str) -> None:
    codec: Codec = CODECS[name]
    assert codec.decompress(codec.compress(payload)) == payload


# --- wire formats -------------------------------------------------------------------------


def test_gzip_writes_a_deterministic_gzip_stream_and_reads_multiple_members() -> None:
    codec = CODECS["gzip"]
    out = codec.compress(b"abc")
    assert out[:2] == b"\x1f\x8b"
    assert out == codec.compress(b"abc")  # mtime=0, so equal input gives equal bytes
    assert codec.decompress(gzip.compress(b"one") + gzip.compress(b"two")) == b"onetwo"


def test_snappy_writes_xerial_framing_in_32k_blocks() -> None:
    payload = PAYLOADS["mixed-100k"]
    out = CODECS["snappy"].compress(payload)
    assert out[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    # walk the blocks: 100 000 bytes in 32 KiB blocks is four blocks
    pos, blocks = 16, []
    while pos < len(out):
        (length,) = struct.unpack_from(">i", out, pos)
        blocks.append(bytes(cramjam.snappy.decompress_raw(out[pos + 4 : pos + 4 + length])))
        pos += 4 + length
    assert [len(b) for b in blocks] == [32768, 32768, 32768, 1696]
    assert b"".join(blocks) == payload


def test_snappy_reads_kafka_python_xerial_and_raw_snappy() -> None:
    payload = PAYLOADS["mixed-100k"]
    codec = CODECS["snappy"]
    assert codec.decompress(kafka_snappy_encode(payload, xerial_compatible=True)) == payload
    assert codec.decompress(bytes(cramjam.snappy.compress_raw(payload))) == payload


def test_snappy_ignores_little_endian_xerial_version_fields() -> None:
    # Redpanda has been seen writing the version fields little-endian; readers key on the magic
    block = bytes(cramjam.snappy.compress_raw(b"hello"))
    data = b"\x82SNAPPY\x00" + struct.pack("<ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert CODECS["snappy"].decompress(data) == b"hello"


def test_lz4_writes_and_reads_the_lz4_frame_format() -> None:
    payload = PAYLOADS["text"]
    codec = CODECS["lz4"]
    out = codec.compress(payload)
    assert out[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic, little-endian 0x184D2204
    flg, bd = out[4], out[5]
    # what Kafka's Java Lz4BlockInputStream insists on: version 01, independent blocks,
    # reserved bits 0, block maximum size code 4..7
    assert flg >> 6 == 1
    assert flg & 0x20, "block independence must be set: Kafka refuses dependent blocks"
    assert flg & 0x03 == 0
    assert 4 <= (bd >> 4) & 0x07 <= 7 and bd & 0x8F == 0
    assert lz4.frame.decompress(out) == payload
    with_checksums = lz4.frame.compress(payload, block_checksum=True, content_checksum=True)
    assert codec.decompress(with_checksums) == payload


def test_lz4_blocks_decompress_on_their_own_like_kafkas_java_reader() -> None:
    # Java's Lz4BlockInputStream decompresses every block without the previous block as a
    # dictionary; a linked block referring back would fail there. Walk the frame the same way.
    payload = b"the same sentence, again and again. " * 10_000  # 360 kB: several 64 KiB blocks
    out = CODECS["lz4"].compress(payload)
    flg, bd = out[4], out[5]
    max_block = 1 << (2 * ((bd >> 4) & 0x07) + 8)
    pos = 7 + (8 if flg & 0x08 else 0)  # magic, FLG, BD, [content size], header checksum
    pieces = []
    while True:
        (size,) = struct.unpack_from("<I", out, pos)
        pos += 4
        if size == 0:
            break
        raw = out[pos : pos + (size & 0x7FFFFFFF)]
        pos += (size & 0x7FFFFFFF) + (4 if flg & 0x10 else 0)
        if size & 0x80000000:  # stored uncompressed
            pieces.append(raw)
        else:
            pieces.append(lz4.block.decompress(raw, uncompressed_size=max_block))
    assert len(pieces) > 1
    assert b"".join(pieces) == payload


def test_zstd_reads_streamed_frames_without_content_size_and_several_frames() -> None:
    sink = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(sink, closefd=False) as writer:
        writer.write(b"streamed ")
    two_frames = sink.getvalue() + zstandard.ZstdCompressor().compress(b"and framed")
    assert CODECS["zstd"].decompress(two_frames) == b"streamed and framed"


# --- corrupt payloads ----------------------------------------------------------------------

GARBAGE = {
    "gzip": b"definitely not gzip",
    "snappy": b"\xff\xff\xff\xff\x0fabc",  # raw snappy claiming 4 GiB, with 3 bytes of data
    "lz4": b"definitely not lz4",
    "zstd": b"definitely not zstd",
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_is_corrupt_segment_error_naming_the_codec(name: str) -> None:
    with pytest.raises(CorruptSegmentError, match=f"{name}"):
        CODECS[name].decompress(GARBAGE[name])


@pytest.mark.parametrize("name", list(GARBAGE))
def test_truncated_payload_is_corrupt(name: str) -> None:
    compressed = CODECS[name].compress(PAYLOADS["mixed-100k"])
    for cut in (len(compressed) // 2, len(compressed) - 1):
        with pytest.raises(CorruptSegmentError):
            CODECS[name].decompress(compressed[:cut])


def test_snappy_xerial_block_length_past_the_end_is_corrupt() -> None:
    data = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", 1000) + b"abc"
    with pytest.raises(CorruptSegmentError, match="block of 1000 bytes at byte 20 runs past"):
        CODECS["snappy"].decompress(data)


def test_snappy_xerial_truncated_block_length_is_corrupt() -> None:
    data = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"\x00\x00"
    with pytest.raises(CorruptSegmentError, match="block length truncated at byte 16"):
        CODECS["snappy"].decompress(data)


def test_snappy_xerial_truncated_header_is_corrupt() -> None:
    with pytest.raises(CorruptSegmentError, match="xerial header truncated"):
        CODECS["snappy"].decompress(b"\x82SNAPPY\x00\x00\x00")


# --- bounded decompression: a bomb costs at most the limit ----------------------------------

#: 64 MiB of zeros compresses to a few KiB (zstd) to a few MiB (snappy)
BOMB_BYTES = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    zeros = b"\x00" * BOMB_BYTES
    return {name: CODECS[name].compress(zeros) for name in ("gzip", "snappy", "lz4", "zstd")}


@pytest.mark.parametrize("name", ["gzip", "snappy", "lz4", "zstd"])
def test_a_payload_expanding_past_the_limit_is_corrupt_naming_the_codec(
    bombs: dict[str, bytes], name: str
) -> None:
    message = f"{name} payload decompresses to more than 1048576 bytes"
    with pytest.raises(CorruptSegmentError, match=message):
        CODECS[name].decompress(bombs[name], limit=1024 * 1024)


@pytest.mark.parametrize("name", ["gzip", "snappy", "lz4", "zstd"])
def test_the_limit_is_inclusive(name: str) -> None:
    payload = os.urandom(5000) + b"\x00" * 5000
    compressed = CODECS[name].compress(payload)
    assert CODECS[name].decompress(compressed, limit=len(payload)) == payload
    with pytest.raises(CorruptSegmentError, match="decompresses to more than 9999 bytes"):
        CODECS[name].decompress(compressed, limit=len(payload) - 1)


@pytest.mark.parametrize("name", ["gzip", "snappy", "lz4", "zstd"])
def test_a_large_legitimate_payload_grows_its_buffer_and_comes_out_whole(name: str) -> None:
    # 20 MiB from a few KiB: past the first buffer (1 MiB) and past the kept size (8 MiB)
    payload = (os.urandom(64) + b"\x00" * 4032) * 5120
    compressed = CODECS[name].compress(payload)
    for _ in range(2):  # the second call starts from whatever buffer the first one kept
        assert CODECS[name].decompress(compressed) == payload
    assert CODECS[name].decompress(CODECS[name].compress(b"small")) == b"small"


def test_a_bomb_allocates_no_more_than_the_limit(bombs: dict[str, bytes]) -> None:
    import tracemalloc

    limit = 4 * 1024 * 1024
    tracemalloc.start()
    try:
        for name in ("gzip", "snappy", "lz4", "zstd"):
            with pytest.raises(CorruptSegmentError):
                CODECS[name].decompress(bombs[name], limit=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the output buffer at the limit; zlib assembles its output from blocks, so gzip's peak is
    # the output twice
    assert peak <= 2 * limit + 1024 * 1024


def test_threads_decompress_side_by_side_with_their_own_buffers() -> None:
    from concurrent.futures import ThreadPoolExecutor

    payloads = [os.urandom(1000) * (i + 1) * 300 for i in range(8)]
    compressed = [(CODECS[name].compress(p), p) for p in payloads for name in ("lz4", "zstd")]

    def check(item: tuple[bytes, bytes]) -> bool:
        data, payload = item
        codec = CODECS["zstd"] if data[:4] == b"\x28\xb5\x2f\xfd" else CODECS["lz4"]
        return all(codec.decompress(data) == payload for _ in range(20))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(check, compressed * 3))
