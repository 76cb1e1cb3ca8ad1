"""Record-batch compression codecs, chosen by Kafka's attribute id or by name.

The low three bits of a v2 batch's `attributes` name the codec that compressed everything after
the 61-byte batch header (`tiered.kafka.records`). Each codec here is a small stateless object with
`compress(bytes) -> bytes` and `decompress(bytes) -> bytes`, registered under its Kafka id and
its `compression.type` name:

    id  name     wire format (what the Java client writes)
    0   none     records as they are
    1   gzip     RFC 1952 gzip stream (stdlib `gzip`; several members are accepted)
    2   snappy   xerial "snappy-java" block framing; raw snappy is accepted on read
    3   lz4      LZ4 *frame* format (KIP-57; not the broken pre-0.10 framing of magic 0/1)
    4   zstd     zstd frame(s) (KIP-110)

snappy, lz4 and zstd run in `cramjam` (Rust), gzip in zlib (C): no codec loops in Python.

Decompression failures are `CorruptSegmentError` without a position: the codec only sees the
compressed payload, and `tiered.kafka.records` re-anchors the error at the batch that carried it.

Decompression is bounded: a payload that would expand past `limit` bytes (default
`MAX_DECOMPRESSED_BYTES`) is refused as corrupt once that many bytes are out, so a damaged or
hostile batch (a few KiB of zstd can claim gigabytes) costs at most `limit` bytes of memory and
the time to write them. Kafka's default `max.message.bytes` is 1 MiB of *compressed* batch, so
the default leaves legitimate batches a 64:1 ratio.
"""

from __future__ import annotations

import gzip
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import cramjam

from tiered.errors import CorruptSegmentError

#: what a codec reads: any contiguous bytes-like object (a memoryview of a mapped segment works)
Payload = bytes | bytearray | memoryview

#: the most bytes one batch's records may decompress to (see the module docstring)
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
#: output buffers up to this size stay with their thread for its next batch; bigger ones are
#: dropped after use, so a rare large batch does not pin its memory
_KEPT_BUFFER_BYTES = 8 * 1024 * 1024
#: the first output buffer is this many times the payload (at least `_FIRST_BUFFER_BYTES`);
#: each retry after a full buffer quadruples it, up to the limit
_FIRST_RATIO = 8
_FIRST_BUFFER_BYTES = 1024 * 1024
_GROWTH = 4
#: what cramjam says when the output buffer filled before the payload ended
_FULL_BUFFER = "failed to write whole buffer"

_buffers = threading.local()


def _too_big(codec: str, limit: int) -> CorruptSegmentError:
    return CorruptSegmentError(f"{codec} payload decompresses to more than {limit} bytes")


def _decompress_bounded(
    codec: str, into: Callable[[Payload, bytearray], int], data: Payload, limit: int
) -> bytes:
    """`into(data, buffer)`'s output as bytes, into a buffer that grows up to `limit` bytes.

    cramjam's `decompress_into` stops with an error when the buffer is full, so the work and
    memory for a bomb end at `limit`. The buffer is reused by the thread's next call (no zero
    fill per batch); only a full buffer makes a retry, each at four times the size.
    """
    size = min(limit, max(_FIRST_BUFFER_BYTES, _FIRST_RATIO * len(data)))
    while True:
        buffer: bytearray | None = getattr(_buffers, "buffer", None)
        if buffer is None or len(buffer) < size:
            buffer = _buffers.buffer = None  # the smaller one goes before the bigger one comes
            buffer = bytearray(size)
        try:
            n = into(data, buffer)
        except cramjam.DecompressionError as err:
            if _FULL_BUFFER not in str(err):
                raise
            if len(buffer) >= limit:
                raise _too_big(codec, limit) from None
            size = min(limit, len(buffer) * _GROWTH)
            continue
        finally:
            _buffers.buffer = buffer if len(buffer) <= _KEPT_BUFFER_BYTES else None
        if n > limit:
            raise _too_big(codec, limit)
        return bytes(memoryview(buffer)[:n])


@dataclass(frozen=True)
class Codec:
    """One compression type: a pure bytes -> bytes transform, safe to share between threads."""

    #: Kafka's `compression.type` value
    name: ClassVar[str] = "none"
    #: the value in the batch attributes' low three bits
    codec_id: ClassVar[int] = 0

    def compress(self, data: Payload) -> bytes:
        return bytes(data)

    def decompress(self, data: Payload, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
        """`data`'s records, at most `limit` bytes of them (more is `CorruptSegmentError`)."""
        return bytes(data)


@dataclass(frozen=True)
class GzipCodec(Codec):
    name: ClassVar[str] = "gzip"
    codec_id: ClassVar[int] = 1

    #: Java's GZIPOutputStream uses zlib's default level (6), a better speed/size point than
    #: the stdlib default 9 for data that is written once and read many times
    level: int = 6

    def compress(self, data: Payload) -> bytes:
        # mtime=0: equal input gives equal bytes, so re-encoding a batch is reproducible
        return gzip.compress(data, compresslevel=self.level, mtime=0)

    def decompress(self, data: Payload, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
        # zlib checks each member's CRC and length (wbits 16+); members follow one another
        out = bytearray()
        rest = memoryview(data)
        try:
            while True:
                member = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out += member.decompress(rest, limit + 1 - len(out))
                if len(out) > limit:
                    raise _too_big(self.name, limit)
                if not member.eof:
                    raise CorruptSegmentError("gzip payload does not decompress: truncated")
                rest = memoryview(member.unused_data)
                if not rest:
                    return bytes(out)
        except zlib.error as err:
            raise CorruptSegmentError(f"gzip payload does not decompress: {err}") from None


#: xerial header: 0x82 "SNAPPY" 0x00, then format version and minimum compatible version.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(
    ">"
    "8s"  # magic: _XERIAL_MAGIC
    "i"  # version: 1
    "i"  # minimum compatible version: 1
)
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")  # compressed length of the block that follows


@dataclass(frozen=True)
class SnappyCodec(Codec):
    """Snappy in snappy-java's block framing, which Kafka's Java client writes.

    Layout: the 16-byte `_XERIAL_HEADER`, then blocks of `[int32 length][raw snappy block]`,
    each block compressing at most `block_size` bytes of input. Readers ignore the two version
    fields (some writers, e.g. Redpanda, put them little-endian) and key only on the magic.
    """

    name: ClassVar[str] = "snappy"
    codec_id: ClassVar[int] = 2

    #: uncompressed bytes per block; 32 KiB is snappy-java's default
    block_size: int = 32 * 1024

    def compress(self, data: Payload) -> bytes:
        view = memoryview(data)
        out = bytearray(_XERIAL_HEADER.pack(_XERIAL_MAGIC, 1, 1))
        for start in range(0, len(view), self.block_size):
            block = cramjam.snappy.compress_raw(view[start : start + self.block_size])
            out += _XERIAL_BLOCK_LENGTH.pack(len(block))
            out += block
        return bytes(out)

    def decompress(self, data: Payload, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
        view = memoryview(data)
        try:
            if bytes(view[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
                return bytes(cramjam.snappy.decompress_raw(self._checked(view, limit)))
            return self._decompress_xerial(view, limit)
        except cramjam.DecompressionError as err:
            raise CorruptSegmentError(f"snappy payload does not decompress: {err}") from None

    @classmethod
    def _checked(cls, block: memoryview, limit: int, before: int = 0) -> memoryview:
        """`block` once the length it declares up front, after `before` bytes already out, is
        within `limit`."""
        if before + cramjam.snappy.decompress_raw_len(block) > limit:
            raise _too_big(cls.name, limit)
        return block

    @classmethod
    def _decompress_xerial(cls, view: memoryview, limit: int) -> bytes:
        if len(view) < _XERIAL_HEADER.size:
            raise CorruptSegmentError(
                f"snappy xerial header truncated: {len(view)} of {_XERIAL_HEADER.size} bytes"
            )
        out = bytearray()
        pos = _XERIAL_HEADER.size
        while pos < len(view):
            if pos + _XERIAL_BLOCK_LENGTH.size > len(view):
                raise CorruptSegmentError(f"snappy xerial block length truncated at byte {pos}")
            (length,) = _XERIAL_BLOCK_LENGTH.unpack_from(view, pos)
            pos += _XERIAL_BLOCK_LENGTH.size
            if length < 0 or pos + length > len(view):
                raise CorruptSegmentError(
                    f"snappy xerial block of {length} bytes at byte {pos} runs past the "
                    f"payload's {len(view)} bytes"
                )
            out += cramjam.snappy.decompress_raw(
                cls._checked(view[pos : pos + length], limit, len(out))
            )
            pos += length
        return bytes(out)


@dataclass(frozen=True)
class Lz4Codec(Codec):
    """LZ4 frames with *independent* blocks and no content checksum.

    Kafka's Java reader (`Lz4BlockInputStream`) decompresses each block on its own and refuses
    frames whose FLG byte does not set block independence, which cramjam's default (linked
    blocks) would not; so the frame options are set explicitly here."""

    name: ClassVar[str] = "lz4"
    codec_id: ClassVar[int] = 3

    def compress(self, data: Payload) -> bytes:
        compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())

    def decompress(self, data: Payload, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
        try:
            return _decompress_bounded(self.name, cramjam.lz4.decompress_into, data, limit)
        except cramjam.DecompressionError as err:
            raise CorruptSegmentError(f"lz4 payload does not decompress: {err}") from None


@dataclass(frozen=True)
class ZstdCodec(Codec):
    name: ClassVar[str] = "zstd"
    codec_id: ClassVar[int] = 4

    #: Kafka's default `compression.zstd.level`
    level: int = 3

    def compress(self, data: Payload) -> bytes:
        return bytes(cramjam.zstd.compress(data, level=self.level))

    def decompress(self, data: Payload, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
        try:
            return _decompress_bounded(self.name, cramjam.zstd.decompress_into, data, limit)
        except cramjam.DecompressionError as err:
            raise CorruptSegmentError(f"zstd payload does not decompress: {err}") from None


#: every codec, by Kafka `compression.type` name
CODECS: dict[str, Codec] = {
    codec.name: codec for codec in (Codec(), GzipCodec(), SnappyCodec(), Lz4Codec(), ZstdCodec())
}
#: the same codecs by attribute id (0..4)
CODECS_BY_ID: dict[int, Codec] = {codec.codec_id: codec for codec in CODECS.values()}


def codec_by_id(codec_id: int) -> Codec:
    """The codec a batch's attributes name; an id Kafka never assigned means corrupt data."""
    try:
        return CODECS_BY_ID[codec_id]
    except KeyError:
        raise CorruptSegmentError(
            f"unknown compression codec id {codec_id} (known: {sorted(CODECS_BY_ID)})"
        ) from None


def codec_by_name(name: str) -> Codec:
    """The codec for a `compression.type` name; an unknown name is the caller's error."""
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown compression {name!r} (known: {', '.join(CODECS)})") from None
