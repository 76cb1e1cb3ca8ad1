"""Zig-zag varint / varlong codec: known vectors, bounds, corrupt input, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.util import decode_varint as kafka_decode_varint
from kafka.record.util import encode_varint as kafka_encode_varint

from tiered.errors import CorruptSegmentError
from tiered.kafka.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
    size_of_varint,
)

# (value, encoding) pairs worked out by hand from zigzag + base-128, as Kafka's ByteUtils writes
KNOWN_VARINTS = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (300, "d804"),
    (INT32_MAX, "feffffff0f"),
    (INT32_MIN, "ffffffff0f"),
]


@pytest.mark.parametrize(("value", "hex_bytes"), KNOWN_VARINTS)
def test_known_varint_encodings(value: int, hex_bytes: str) -> None:
    assert encode_varint(value).hex() == hex_bytes
    assert decode_varint(bytes.fromhex(hex_bytes)) == (value, len(hex_bytes) // 2)


def test_varlong_extremes_take_ten_bytes() -> None:
    assert encode_varlong(INT64_MAX).hex() == "fe" + "ff" * 8 + "01"
    assert encode_varlong(INT64_MIN).hex() == "ff" * 9 + "01"
    assert decode_varlong(encode_varlong(INT64_MIN)) == (INT64_MIN, 10)


def test_decode_starts_at_position_and_returns_next() -> None:
    buf = b"\xaa\xbb" + encode_varint(-65) + encode_varint(7)
    value, pos = decode_varint(buf, 2)
    assert (value, pos) == (-65, 4)
    assert decode_varint(buf, pos) == (7, 5)


def test_decode_works_on_memoryview_and_bytearray() -> None:
    data = encode_varlong(-123456789012)
    assert decode_varlong(memoryview(data)) == (-123456789012, len(data))
    assert decode_varlong(bytearray(data)) == (-123456789012, len(data))


def test_non_minimal_encoding_is_accepted_like_kafka() -> None:
    assert decode_varint(b"\x80\x00") == (0, 2)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x80", b"\xff\xff", b"\xff\xff\xff\xff"],
    ids=["empty", "one-continuation", "two", "four"],
)
def test_truncated_varint_is_corrupt_at_its_start(data: bytes) -> None:
    buf = b"\x00\x00\x00" + data
    with pytest.raises(CorruptSegmentError, match="truncated varint") as info:
        decode_varint(buf, 3)
    assert info.value.position == 3


def test_varint_longer_than_five_bytes_is_corrupt() -> None:
    with pytest.raises(CorruptSegmentError, match="longer than 5 bytes") as info:
        decode_varint(b"\x00\x80\x80\x80\x80\x80\x00", 1)
    assert info.value.position == 1


def test_varint_with_bits_beyond_32_is_corrupt() -> None:
    # five bytes, but the fifth sets bit 32 and up
    with pytest.raises(CorruptSegmentError, match="exceeds 32 bits"):
        decode_varint(b"\xff\xff\xff\xff\x1f")


def test_varlong_longer_than_ten_bytes_is_corrupt() -> None:
    with pytest.raises(CorruptSegmentError, match="longer than 10 bytes"):
        decode_varlong(b"\x80" * 10 + b"\x00")


def test_varlong_with_bits_beyond_64_is_corrupt() -> None:
    with pytest.raises(CorruptSegmentError, match="exceeds 64 bits"):
        decode_varlong(b"\xff" * 9 + b"\x03")


@pytest.mark.parametrize("value", [INT32_MAX + 1, INT32_MIN - 1])
def test_encode_varint_refuses_values_outside_int32(value: int) -> None:
    with pytest.raises(ValueError, match="32-bit"):
        encode_varint(value)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1])
def test_encode_varlong_refuses_values_outside_int64(value: int) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        encode_varlong(value)


@given(st.integers(INT32_MIN, INT32_MAX))
def test_varint_round_trip(value: int) -> None:
    data = encode_varint(value)
    assert len(data) == size_of_varint(value) <= 5
    assert decode_varint(data) == (value, len(data))
    assert decode_varlong(data) == (value, len(data))


@given(st.integers(INT64_MIN, INT64_MAX))
def test_varlong_round_trip_and_matches_kafka_python(value: int) -> None:
    data = encode_varlong(value)
    assert len(data) == size_of_varint(value) <= 10
    assert decode_varlong(data) == (value, len(data))
    theirs = bytearray()
    kafka_encode_varint(value, theirs.append)
    assert bytes(theirs) == data
    assert kafka_decode_varint(data, 0) == (value, len(data))
