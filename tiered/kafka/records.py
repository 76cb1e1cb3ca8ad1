"""Kafka record batch v2 (magic 2): the unit a `.log` segment is made of.

A segment is a sequence of batches. Each is a 61-byte header (`BATCH_HEADER`, one comment per
field) followed by `recordsCount` records, compressed as one blob when the codec bits of the
attributes are not 0 (`tiered.kafka.compression`):

    Record =>
      Length => Varint               bytes after this field to the end of the record
      Attributes => Int8             unused, kept as read
      TimestampDelta => Varlong      relative to the header's firstTimestamp
      OffsetDelta => Varint          relative to the header's baseOffset
      Key => Varint length + bytes   length -1 is null
      Value => Varint length + bytes length -1 is null (a tombstone)
      Headers => Varint count, then [Varint length + UTF-8 key, Varint length + bytes value]

The CRC-32C covers the batch from `attributes` to its end; it leaves out baseOffset,
batchLength and partitionLeaderEpoch so a broker can assign them without re-checksumming. Two
reading speeds: `iter_batch_headers` walks and CRC-checks a whole segment without touching
records (upload, scrub, index rebuild); `iter_batches` decodes every record. Error positions
are byte offsets within the buffer given, pointing at the start of the offending batch.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

from tiered.errors import CorruptSegmentError
from tiered.kafka.compression import CODECS_BY_ID, codec_by_id
from tiered.kafka.varint import decode_varint, decode_varlong

#: a segment or part of one: bytes, a bytearray being built, a memoryview or an mmap of the file
Buffer = bytes | bytearray | memoryview | mmap.mmap

BATCH_HEADER = struct.Struct(
    ">"
    "q"  # baseOffset: offset of the batch's first record
    "i"  # batchLength: bytes from partitionLeaderEpoch to the end of the batch
    "i"  # partitionLeaderEpoch: leader epoch of the broker that appended the batch
    "b"  # magic: record format version, 2
    "I"  # crc: CRC-32C from attributes to the end of the batch
    "h"  # attributes: codec, timestamp type, transactional, control, delete horizon bits
    "i"  # lastOffsetDelta: last record's offset minus baseOffset (kept after compaction)
    "q"  # firstTimestamp: base for record timestamp deltas, ms since the epoch
    "q"  # maxTimestamp: largest record timestamp, or the log-append time
    "q"  # producerId: -1 when not idempotent
    "h"  # producerEpoch: -1 when not idempotent
    "i"  # baseSequence: sequence number of the first record, -1 when not idempotent
    "i"  # recordsCount: number of records that follow
)
#: bytes every batch has before the length-counted part: baseOffset + batchLength
LOG_OVERHEAD = struct.calcsize(">qi")
LENGTH_OFFSET = struct.calcsize(">q")
MAGIC_OFFSET = struct.calcsize(">qii")
CRC_OFFSET = struct.calcsize(">qiib")
#: the CRC covers the batch from here to its end
ATTRIBUTES_OFFSET = struct.calcsize(">qiibI")
#: smallest legal batchLength: a header with no records
MIN_BATCH_LENGTH = BATCH_HEADER.size - LOG_OVERHEAD
_BATCH_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")

MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

#: timestamp type names by the value of the attributes' timestamp bit
TIMESTAMP_TYPES: dict[int, str] = {0: "create", TIMESTAMP_TYPE_MASK: "log_append"}
_TIMESTAMP_TYPE_BITS = {name: bits for bits, name in TIMESTAMP_TYPES.items()}

#: control record key: version int16, type int16; value of commit/abort: version, coordinatorEpoch
CONTROL_KEY = struct.Struct(">hh")
CONTROL_VALUE = struct.Struct(">hi")
#: Kafka's ControlRecordType ids (0 and 1 are transaction markers, the rest KRaft metadata)
CONTROL_TYPES: dict[int, str] = {
    0: "abort",
    1: "commit",
    2: "leader_change",
    3: "snapshot_header",
    4: "snapshot_footer",
    5: "kraft_version",
    6: "kraft_voters",
}
_CONTROL_TYPE_IDS = {name: type_id for type_id, name in CONTROL_TYPES.items()}


class TruncatedBatchError(CorruptSegmentError):
    """The buffer ends inside a batch: what a crash leaves at the tail of an active segment.

    Anywhere but the tail it is as corrupt as any other error, hence the subclass."""


class BatchHeader(NamedTuple):
    """The 61-byte header of one batch, plus where it sits in its buffer.

    A named tuple rather than a dataclass: the parsers build one per batch on the hot paths,
    and a tuple is built in one C call where a frozen dataclass sets each field in Python.
    `header._replace(position=...)` moves it to another buffer."""

    #: byte position of the batch's first byte (its baseOffset) in the buffer or file
    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def end_position(self) -> int:
        """Byte position just past the batch: where the next one starts."""
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> str:
        return codec_by_id(self.attributes & COMPRESSION_MASK).name

    @property
    def timestamp_type(self) -> str:
        """ "create" (producer's clock) or "log_append" (broker's clock, in max_timestamp)."""
        return TIMESTAMP_TYPES[self.attributes & TIMESTAMP_TYPE_MASK]

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When compaction may drop this batch's tombstones (KIP-534), or None if not set."""
        return self.first_timestamp if self.attributes & DELETE_HORIZON_MASK else None


class Header(NamedTuple):
    key: str
    value: bytes | None


class Record(NamedTuple):
    """One record with absolute offset and timestamp (ms since the epoch); a named tuple for
    the same reason as `BatchHeader`."""

    offset: int
    timestamp: int
    key: bytes | None
    #: None is a tombstone
    value: bytes | None
    headers: tuple[Header, ...] = ()
    #: the record's own attribute byte (0..255), unused by Kafka so far
    attributes: int = 0


@dataclass(frozen=True)
class RecordBatch:
    header: BatchHeader
    records: tuple[Record, ...]

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    @property
    def next_offset(self) -> int:
        return self.header.next_offset

    @property
    def control_type(self) -> str | None:
        """For a control batch, what its marker is ("commit", "abort", ...; "unknown" for a
        type this code does not know); None for a data batch or an empty (compacted) one."""
        if not self.header.is_control or not self.records:
            return None
        key = self.records[0].key
        if key is None or len(key) < CONTROL_KEY.size:  # decode_batch refuses these
            return "unknown"
        _version, type_id = CONTROL_KEY.unpack_from(key)
        return CONTROL_TYPES.get(type_id, "unknown")


#: builds a named tuple from a ready tuple in one C call, skipping the generated `__new__`'s
#: Python frame: the parsers make one per batch and per record
_new_tuple = tuple.__new__


def _read_header(view: memoryview, pos: int, path: str | None, verify_crc: bool) -> BatchHeader:
    available = len(view) - pos
    length = None
    if available >= LOG_OVERHEAD:
        (length,) = _BATCH_LENGTH.unpack_from(view, pos + LENGTH_OFFSET)
        if length < MIN_BATCH_LENGTH:
            raise CorruptSegmentError(
                f"batch length {length} is below the minimum {MIN_BATCH_LENGTH}",
                path=path,
                position=pos,
            )
    if length is None or length + LOG_OVERHEAD > available:
        needs = LOG_OVERHEAD if length is None else length + LOG_OVERHEAD
        raise TruncatedBatchError(
            f"truncated batch: needs {needs} bytes, the buffer has {available} left",
            path=path,
            position=pos,
        )
    header = _new_tuple(BatchHeader, (pos, *BATCH_HEADER.unpack_from(view, pos)))
    problem = _header_problem(header, view, pos + LOG_OVERHEAD + length, verify_crc)
    if problem is not None:
        raise CorruptSegmentError(problem, path=path, position=pos)
    return header


def _header_problem(
    header: BatchHeader, view: memoryview, end: int, verify_crc: bool
) -> str | None:
    """What is wrong with a header whose batch lies fully inside `view` up to `end`, or None."""
    if header.magic != MAGIC_V2:
        return f"unsupported magic {header.magic}: only record batch v2 (magic 2) is read"
    if verify_crc:
        # holding the interpreter lock: a batch's CRC takes microseconds, less than handing
        # the lock to another thread and taking it back
        actual = crc32c.crc32c(view[header.position + ATTRIBUTES_OFFSET : end],
                               gil_release_mode=0)
        if actual != header.crc:
            return (
                f"CRC-32C mismatch: expected 0x{header.crc:08x} (stored), "
                f"actual 0x{actual:08x} (computed)"
            )
    if header.attributes & COMPRESSION_MASK not in CODECS_BY_ID:
        return f"unknown compression codec id {header.attributes & COMPRESSION_MASK}"
    if header.records_count < 0 or header.last_offset_delta < 0:
        return (
            f"negative recordsCount {header.records_count} or lastOffsetDelta "
            f"{header.last_offset_delta}"
        )
    return None


def read_batch_header(
    buf: Buffer, pos: int = 0, *, path: str | None = None, verify_crc: bool = True
) -> BatchHeader:
    """Parse and check the batch at byte `pos` of `buf`: bounds, magic, CRC-32C, codec id.

    Raises TruncatedBatchError (a CorruptSegmentError) if the batch runs past the buffer, and
    CorruptSegmentError for anything else wrong, with `path` and the batch's `position`."""
    if not 0 <= pos <= len(buf):
        raise ValueError(f"position {pos} is outside the {len(buf)}-byte buffer")
    with memoryview(buf) as view:
        return _read_header(view, pos, path, verify_crc)


def iter_batch_headers(
    buf: Buffer,
    start: int = 0,
    *,
    path: str | None = None,
    verify_crc: bool = True,
    allow_truncated_tail: bool = False,
) -> Iterator[BatchHeader]:
    """Walk batch headers from byte `start` to the end of `buf`, checking each batch's CRC but
    decompressing nothing: O(1) Python work per batch plus a C CRC pass over its bytes.

    With `allow_truncated_tail` a partial batch at the end (a crash mid-append) ends the walk
    quietly; the last header's `end_position` is then where the valid data stops."""
    if not 0 <= start <= len(buf):
        raise ValueError(f"start {start} is outside the {len(buf)}-byte buffer")
    # One view for the whole walk, released when the generator finishes or is closed, so an
    # mmap can be closed afterwards.
    with memoryview(buf) as view:
        end = len(view)
        pos = start
        while pos < end:
            try:
                header = _read_header(view, pos, path, verify_crc)
            except TruncatedBatchError:
                if allow_truncated_tail:
                    return
                raise
            yield header
            pos += header.batch_length + LOG_OVERHEAD


#: batchLength, magic and attributes of a batch at its first byte, in one unpack: the lean
#: walks below make no object per batch
_LENGTH_MAGIC_ATTRIBUTES = struct.Struct(">8xi4xb4xh")


def whole_batches_end(buf: Buffer, start: int = 0, end: int | None = None) -> int:
    """Where the whole batches of `buf[start:end]` (from a batch boundary) end: the rest is
    the start of a batch still to come. A lean walk for bytes arriving in pieces: lengths and
    magic only, no CRC and no object per batch (check what it covers with
    `iter_batch_headers`). CorruptSegmentError (`position` in `buf`) when a length is below a
    header's or a whole batch's magic is not 2; a batch running past `end`, or a tail too
    short to hold its length, ends the run there."""
    with memoryview(buf) as view:
        end = _bounded(view, start, end)
        unpack, pos = _LENGTH_MAGIC_ATTRIBUTES.unpack_from, start
        while end - pos >= LOG_OVERHEAD:
            if end - pos >= _LENGTH_MAGIC_ATTRIBUTES.size:
                length, magic, _attributes = unpack(view, pos)
            else:  # a tail with its length but not its magic: a batch still to come
                (length,), magic = _BATCH_LENGTH.unpack_from(view, pos + LENGTH_OFFSET), MAGIC_V2
            if length < MIN_BATCH_LENGTH:
                raise CorruptSegmentError(
                    f"batch length {length} is below the minimum {MIN_BATCH_LENGTH}",
                    position=pos)
            after = pos + LOG_OVERHEAD + length
            if after > end:
                break
            if magic != MAGIC_V2:
                raise CorruptSegmentError(
                    f"unsupported magic {magic}: only record batch v2 (magic 2) is read",
                    position=pos)
            pos = after
        return pos


def any_batch_has(buf: Buffer, mask: int, start: int = 0, end: int | None = None) -> bool:
    """Whether a batch of `buf[start:end]` (whole batches) has one of the attribute bits of
    `mask` (`TRANSACTIONAL_MASK`, `CONTROL_MASK`): one pass over the headers where they lie,
    no object per batch, every length checked against the range before it is followed.
    CorruptSegmentError (`position` in `buf`) when the range is not whole batches."""
    with memoryview(buf) as view:
        end = _bounded(view, start, end)
        unpack, pos = _LENGTH_MAGIC_ATTRIBUTES.unpack_from, start
        while pos < end:
            if end - pos < BATCH_HEADER.size:
                raise TruncatedBatchError(
                    f"truncated batch: {end - pos} bytes left, a header needs "
                    f"{BATCH_HEADER.size}", position=pos)
            length, magic, attributes = unpack(view, pos)
            if length < MIN_BATCH_LENGTH or magic != MAGIC_V2:
                raise CorruptSegmentError(
                    f"bad batch header (magic {magic}, length {length})", position=pos)
            if pos + LOG_OVERHEAD + length > end:
                raise TruncatedBatchError(
                    f"truncated batch: needs {LOG_OVERHEAD + length} bytes, "
                    f"{end - pos} left", position=pos)
            if attributes & mask:
                return True
            pos += LOG_OVERHEAD + length
        return False


def _bounded(view: memoryview, start: int, end: int | None) -> int:
    """`end` (default: the buffer's end) once [start, end) is checked to lie in `view`."""
    end = len(view) if end is None else end
    if not 0 <= start <= end <= len(view):
        raise ValueError(f"range [{start}, {end}) is outside the {len(view)}-byte buffer")
    return end


def _decode_records(data: bytes, header: BatchHeader) -> tuple[Record, ...]:
    """Parse `header.records_count` records from the (decompressed) records area `data`.

    Raises CorruptSegmentError with a position relative to `data` (the caller re-anchors it
    to the batch)."""
    records: list[Record] = []
    pos = 0
    prev_delta = -1
    for index in range(header.records_count):
        try:
            record, pos = _decode_record(data, pos, header, prev_delta)
        except CorruptSegmentError as err:
            raise CorruptSegmentError(
                f"record {index}: {err.reason}", position=err.position
            ) from None
        except (IndexError, UnicodeDecodeError) as err:
            raise CorruptSegmentError(f"record {index}: malformed: {err}", position=pos) from None
        prev_delta = record.offset - header.base_offset
        records.append(record)
    if pos != len(data):
        raise CorruptSegmentError(
            f"{len(data) - pos} bytes left after the {header.records_count} records the header "
            "counts",
            position=pos,
        )
    return tuple(records)


def _decode_record(
    data: bytes, pos: int, header: BatchHeader, prev_delta: int
) -> tuple[Record, int]:
    length, pos = decode_varint(data, pos)
    end = pos + length
    if length < 0 or end > len(data):
        raise CorruptSegmentError(
            f"length {length} runs past the {len(data)}-byte records area", position=pos
        )
    attributes = data[pos]
    ts_delta, pos = decode_varlong(data, pos + 1)
    offset_delta, pos = decode_varint(data, pos)
    if not prev_delta < offset_delta <= header.last_offset_delta:
        raise CorruptSegmentError(
            f"offset delta {offset_delta} is not above the previous ({prev_delta}) and within "
            f"lastOffsetDelta {header.last_offset_delta}",
            position=pos,
        )
    key, pos = _read_nullable(data, pos, end, "key")
    value, pos = _read_nullable(data, pos, end, "value")
    header_count, pos = decode_varint(data, pos)
    if header_count < 0:
        raise CorruptSegmentError(f"negative header count {header_count}", position=pos)
    headers = []
    for _ in range(header_count):
        raw_key, pos = _read_nullable(data, pos, end, "header key")
        if raw_key is None:
            raise CorruptSegmentError("null header key", position=pos)
        header_value, pos = _read_nullable(data, pos, end, "header value")
        headers.append(Header(raw_key.decode("utf-8"), header_value))
    if pos != end:
        raise CorruptSegmentError(f"fields end at byte {pos}, its length says {end}", position=pos)
    if header.attributes & TIMESTAMP_TYPE_MASK:  # log-append time: the broker's, for all
        timestamp = header.max_timestamp
    else:
        timestamp = header.first_timestamp + ts_delta
    record = _new_tuple(Record, (
        header.base_offset + offset_delta, timestamp, key, value, tuple(headers), attributes
    ))
    return record, pos


def _read_nullable(data: bytes, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    size = data[pos]  # one-byte lengths (< 64 bytes, and null) skip the varint call
    if size < 0x80:
        size = (size >> 1) ^ -(size & 1)
        pos += 1
    else:
        size, pos = decode_varint(data, pos)
    if size == -1:
        return None, pos
    if size < 0 or pos + size > end:
        raise CorruptSegmentError(f"{what} length {size} does not fit the record", position=pos)
    return data[pos : pos + size], pos + size


def decode_batch(buf: Buffer, pos: int = 0, *, path: str | None = None) -> RecordBatch:
    """Fully decode (CRC check, decompression, every record) the batch at byte `pos`."""
    header = read_batch_header(buf, pos, path=path)
    with memoryview(buf) as view:
        return _decode_body(view, header, path)


def iter_batches(buf: Buffer, start: int = 0, *, path: str | None = None) -> Iterator[RecordBatch]:
    """Fully decode every batch from byte `start` to the end of `buf`."""
    with memoryview(buf) as view:
        for header in iter_batch_headers(view, start, path=path):
            yield _decode_body(view, header, path)


def _decode_body(view: memoryview, header: BatchHeader, path: str | None) -> RecordBatch:
    body = view[header.position + BATCH_HEADER.size : header.end_position]
    try:
        codec = codec_by_id(header.attributes & COMPRESSION_MASK)
        # One copy (or the decompressor's output) as bytes: indexing and slicing bytes is
        # cheaper than a memoryview in the per-field loop.
        data = codec.decompress(body)
        records = _decode_records(data, header)
        if header.is_control:
            for record in records:
                if record.key is None or len(record.key) < CONTROL_KEY.size:
                    raise CorruptSegmentError(
                        f"control record at offset {record.offset} has a key shorter than "
                        f"{CONTROL_KEY.size} bytes"
                    )
    # IndexError & co are a backstop for a codec library failing outside its documented error
    except (CorruptSegmentError, IndexError, struct.error, UnicodeDecodeError, ValueError) as err:
        if isinstance(err, CorruptSegmentError):
            where = "" if err.position is None else f" (byte {err.position} of the records)"
            reason = f"{err.reason}{where}"
        else:
            reason = f"malformed records: {err}"
        raise CorruptSegmentError(
            f"batch at offset {header.base_offset}: {reason}", path=path, position=header.position
        ) from None
    return RecordBatch(header, records)
