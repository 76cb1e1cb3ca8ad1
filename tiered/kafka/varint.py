"""Zig-zag variable-length integers as Kafka's record format v2 writes them.

Kafka (`org.apache.kafka.common.utils.ByteUtils`) encodes the per-record fields of a v2 batch as
protobuf-style base-128 varints of the zig-zag transform of the value, so small negative numbers
(a null key's length -1) stay one byte:

    zigzag(n) = (n << 1) ^ (n >> 63)        -1 -> 1, 0 -> 0, 1 -> 2, -2 -> 3, ...

A *varint* carries a signed 32-bit value (at most 5 bytes), a *varlong* a signed 64-bit value
(at most 10 bytes). Each byte holds 7 bits, least significant group first; the top bit says
"more bytes follow".

Decoding takes any indexable byte buffer plus a position and returns `(value, next_position)`, so
a parser walks a buffer without slicing it. Bad input is a `CorruptSegmentError` whose
`position` is where the varint starts *within the buffer given*: a caller parsing a sub-range of
a file re-anchors it with `CorruptSegmentError.at`. Non-minimal encodings that still fit the
width (``0x80 0x00`` for 0) are accepted, as Kafka's Java reader accepts them; encodings longer
than the width allows, or carrying bits beyond it, are refused.
"""

from __future__ import annotations

import mmap

from tiered.errors import CorruptSegmentError

#: anything a varint can be read from: indexing yields ints 0..255
ByteBuffer = bytes | bytearray | memoryview | mmap.mmap

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

#: most bytes a 32-bit / 64-bit varint may take: ceil(32 / 7), ceil(64 / 7)
MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10


def _zigzag(value: int) -> int:
    # Python ints are unbounded, so `value >> 63` is 0 or -1 for any value in range, which is
    # exactly the sign mask the fixed-width formula relies on.
    return (value << 1) ^ (value >> 63)


def append_uvarint(out: bytearray, raw: int) -> None:
    """Append the unsigned base-128 varint of `raw` >= 0 (no zig-zag): the lengths of
    Kafka's flexible protocol versions are written so."""
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def append_varint(out: bytearray, value: int) -> None:
    """Append the zig-zag varint of a signed 32-bit `value` to `out`.

    Raises ValueError when `value` does not fit 32 bits (a caller bug, not corrupt data)."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint value {value} does not fit a signed 32-bit integer")
    append_uvarint(out, _zigzag(value))


def append_varlong(out: bytearray, value: int) -> None:
    """Append the zig-zag varlong of a signed 64-bit `value` to `out`."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong value {value} does not fit a signed 64-bit integer")
    append_uvarint(out, _zigzag(value))


def encode_varint(value: int) -> bytes:
    """The zig-zag varint bytes of a signed 32-bit `value` (1 to 5 bytes)."""
    out = bytearray()
    append_varint(out, value)
    return bytes(out)


def encode_varlong(value: int) -> bytes:
    """The zig-zag varlong bytes of a signed 64-bit `value` (1 to 10 bytes)."""
    out = bytearray()
    append_varlong(out, value)
    return bytes(out)


def size_of_varint(value: int) -> int:
    """How many bytes `encode_varint(value)` / `encode_varlong(value)` produce."""
    return max(1, (_zigzag(value).bit_length() + 6) // 7)


def _decode_multibyte(
    buf: ByteBuffer, pos: int, max_bytes: int, bits: int, kind: str
) -> tuple[int, int]:
    """The loop for values that take more than one byte; `decode_varint` inlines the rest."""
    start = pos
    raw = 0
    shift = 0
    try:
        while True:
            byte = buf[pos]
            pos += 1
            raw |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift >= 7 * max_bytes:
                raise CorruptSegmentError(f"{kind} longer than {max_bytes} bytes", position=start)
    except IndexError:
        raise CorruptSegmentError(
            f"truncated {kind}: buffer ends after {pos - start} byte(s)", position=start
        ) from None
    if raw >> bits:
        raise CorruptSegmentError(f"{kind} value exceeds {bits} bits", position=start)
    return (raw >> 1) ^ -(raw & 1), pos


# decode_varint / decode_varlong run several times per record on the full-decode path: the
# one- and two-byte cases (most lengths and deltas) are handled inline; anything longer, and
# every error, goes through `_decode_multibyte`.


def decode_varint(buf: ByteBuffer, pos: int = 0) -> tuple[int, int]:
    """Read a zig-zag varint (signed 32-bit) at `pos` (>= 0); return `(value, position after)`."""
    try:
        byte = buf[pos]
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1), pos + 1
        raw = (byte & 0x7F) | (buf[pos + 1] << 7)
        if raw < 0x4000:  # the second byte has no continuation bit
            return (raw >> 1) ^ -(raw & 1), pos + 2
    except IndexError:
        pass  # reported, with how much was there, by the general path
    return _decode_multibyte(buf, pos, MAX_VARINT_BYTES, 32, "varint")


def decode_varlong(buf: ByteBuffer, pos: int = 0) -> tuple[int, int]:
    """Read a zig-zag varlong (signed 64-bit) at `pos` (>= 0); return `(value, position after)`."""
    try:
        byte = buf[pos]
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1), pos + 1
        raw = (byte & 0x7F) | (buf[pos + 1] << 7)
        if raw < 0x4000:
            return (raw >> 1) ^ -(raw & 1), pos + 2
    except IndexError:
        pass
    return _decode_multibyte(buf, pos, MAX_VARLONG_BYTES, 64, "varlong")
