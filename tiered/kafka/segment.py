"""One Kafka log segment: `{base offset:020d}.log` and its `.index` / `.timeindex` beside it.

Segments reach `segment.bytes` (1 GiB), so nothing here reads a whole `.log` to answer a
question about one offset: lookups go through the sparse indexes to a byte position and scan
forward from there with ranged reads (`os.pread` in windows of `READ_WINDOW_BYTES`). The `.log`
is deliberately not mmapped: the broker may truncate a segment under us (leader change), and a
mapped page past the new end would kill the process with SIGBUS, where a read just comes back
short and shows up as a truncated batch.

The *active* segment (the newest) is still being written: its indexes are preallocated and
full of zeros past the last entry, its tail may hold half a batch, and with
`log.preallocate=true` its `.log` ends in zeros. `Segment(active=True)` reads all that as the
end of the data instead of corruption. Every method takes its own snapshot of the file size.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeVar

import crc32c

from tiered.errors import CorruptSegmentError
from tiered.kafka.index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    INT32_MAX,
    NO_TIMESTAMP,
    OFFSET_INDEX_ENTRY,
    IndexBuilder,
    OffsetIndex,
    TimeIndex,
)
from tiered.kafka.records import (
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    BatchHeader,
    Buffer,
    RecordBatch,
    TruncatedBatchError,
    decode_batch,
    iter_batch_headers,
    read_batch_header,
)

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TXNINDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
#: digits of the base offset in a segment file name (Long.MAX_VALUE has 19)
OFFSET_DIGITS = 20
_LONG_MAX = (1 << 63) - 1
_NAME_RE = re.compile(r"(\d{20})(\.[a-z]+)")
#: bytes fetched per read while scanning a `.log` (a batch larger than this is read whole)
READ_WINDOW_BYTES = 1 << 20
_LOG_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength: enough to size a batch
_Index = TypeVar("_Index", OffsetIndex, TimeIndex)


def segment_file_name(base_offset: int, suffix: str = LOG_SUFFIX) -> str:
    """`00000000000005242880.log`-style name of a segment file."""
    if not 0 <= base_offset <= _LONG_MAX:
        raise ValueError(f"base offset {base_offset} is outside 0..{_LONG_MAX}")
    return f"{base_offset:0{OFFSET_DIGITS}d}{suffix}"


def parse_segment_file_name(name: str, suffix: str = LOG_SUFFIX) -> int | None:
    """The base offset in a segment file name ending in `suffix`, or None if `name` is not one
    (`.log.deleted`, `.log.swap`, `leader-epoch-checkpoint`, ...)."""
    match = _NAME_RE.fullmatch(name)
    if match is None or match.group(2) != suffix:
        return None
    value = int(match.group(1))
    return value if value <= _LONG_MAX else None


class TimestampAndOffset(NamedTuple):
    """Answer to a time lookup, as Kafka's ListOffsets returns it."""

    timestamp: int
    offset: int
    #: leader epoch of the batch holding the record, None if the batch has none (-1)
    leader_epoch: int | None


@dataclass(frozen=True)
class SegmentSummary:
    """What a full CRC walk of a segment found (`Segment.verify`)."""

    base_offset: int
    #: offsets of the first and last record, None for an empty segment
    first_offset: int | None
    last_offset: int | None
    batches: int
    records: int
    #: bytes of whole, valid batches (below the file size only for an active segment's tail)
    size: int
    #: first batch's first timestamp and the largest batch max timestamp, ms; None if unknown
    first_timestamp: int | None
    max_timestamp: int | None
    #: CRC-32C of the whole file (its size when the walk began), taken from the windows the
    #: walk read; None when the walk ended before reading them all (an active segment's
    #: zero-filled tail). It covers bytes past `size` when a torn tail was read.
    checksum: int | None = None


class RunningChecksum:
    """CRC-32C of a file's bytes from 0 (or `start`), fed the windows a batch walk reads
    anyway.

    The walk's windows only move forward and each starts inside (or at the end of) the one
    before, so feeding each the bytes past what is already covered checksums every byte once:
    the archiver gets the object's checksum from its verification pass instead of reading the
    segment a second time."""

    def __init__(self, start: int = 0) -> None:
        self.value = 0
        #: bytes [start, end) are in `value` (`start`: where the checksummed range begins)
        self.end = start

    def feed(self, buf: bytes, start: int) -> None:
        """Take the window `buf` read at file position `start`."""
        if start > self.end:
            raise ValueError(f"checksum window at {start} leaves a gap after {self.end}")
        skip = self.end - start
        if skip < len(buf):
            self.value = crc32c.crc32c(memoryview(buf)[skip:], self.value)
            self.end = start + len(buf)


class LogFile:
    """Ranged reads of one `.log` through one descriptor, with a file-size snapshot."""

    def __init__(self, path: Path, *, active: bool) -> None:
        self.path = path
        self.active = active
        self._fd = os.open(path, os.O_RDONLY)
        try:
            self.size = os.fstat(self._fd).st_size
        except OSError:
            os.close(self._fd)
            raise

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> LogFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, position: int, length: int) -> bytes:
        """Up to `length` bytes from `position` (fewer only at the end of the file)."""
        chunks = []
        while length > 0:
            chunk = os.pread(self._fd, length, position)
            if not chunk:
                break
            chunks.append(chunk)
            position += len(chunk)
            length -= len(chunk)
        return b"".join(chunks)

    def headers(
        self, start: int = 0, *, verify_crc: bool = True, checksum: RunningChecksum | None = None
    ) -> Iterator[BatchHeader]:
        """Batch headers from byte `start` (a batch boundary) to the end of the size snapshot,
        positions in the file. An active segment's torn or zero-filled tail ends the walk;
        anywhere else it is a CorruptSegmentError naming the file and byte. `checksum` is fed
        every window read (see `RunningChecksum`)."""
        end = self.size
        where = str(self.path)
        buf = b""
        buf_start = start
        pos = start

        def window(at: int, length: int) -> bytes:
            data = self.read(at, length)
            if checksum is not None:
                checksum.feed(data, at)
            return data

        while pos < end:
            rel = pos - buf_start
            if rel + LOG_OVERHEAD > len(buf):
                buf = window(pos, min(READ_WINDOW_BYTES, end - pos))
                buf_start, rel = pos, 0
            if len(buf) - rel >= LOG_OVERHEAD:
                base, length = _LOG_PREFIX.unpack_from(buf, rel)
                if self.active and base == 0 and length == 0:
                    return  # zeros of a preallocated .log: the data ends here
                need = length + LOG_OVERHEAD
                if length >= MIN_BATCH_LENGTH and pos + need > end:
                    if self.active:
                        return
                    raise TruncatedBatchError(
                        f"truncated batch: length {length} runs past the end of the file "
                        f"({end - pos} bytes left)",
                        path=where,
                        position=pos,
                    )
                if rel + need > len(buf) and length >= MIN_BATCH_LENGTH:
                    buf = window(pos, max(need, min(READ_WINDOW_BYTES, end - pos)))
                    buf_start, rel = pos, 0
            try:
                header = read_batch_header(buf, rel, path=where, verify_crc=verify_crc)
            except TruncatedBatchError as err:
                if self.active:
                    return
                raise TruncatedBatchError(err.reason, path=where, position=pos) from None
            except CorruptSegmentError as err:
                raise err.at(path=where, base_position=buf_start) from None
            yield header._replace(position=pos)
            pos += header.size

    def decode(self, header: BatchHeader) -> RecordBatch:
        """Fully decode the batch `header` describes (CRC, decompression, every record)."""
        data = self.read(header.position, header.size)
        try:
            batch = decode_batch(data, 0, path=str(self.path))
        except CorruptSegmentError as err:
            raise err.at(path=str(self.path), base_position=header.position) from None
        return RecordBatch(header, batch.records)


#: (inode, size, mtime ns, last batch) of the `.log` files whose tail this process found,
#: by path: see `Segment.last_batch`
_Tail = tuple[int, int, int, "BatchHeader | None"]
_TAILS: OrderedDict[str, _Tail] = OrderedDict()
_TAILS_LOCK = threading.Lock()
_TAILS_MAX = 4096


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _remember_tail(path: str, identity: tuple[int, int, int], header: BatchHeader | None
                   ) -> None:
    with _TAILS_LOCK:
        _TAILS[path] = (*identity, header)
        _TAILS.move_to_end(path)
        while len(_TAILS) > _TAILS_MAX:
            _TAILS.popitem(last=False)


@dataclass(frozen=True, order=True)
class Segment:
    """A segment by its base offset and `.log` path; segments sort by base offset.

    Holds no open file: each call opens, reads what it needs and closes, so a partition with
    thousands of segments costs no descriptors."""

    base_offset: int
    log_path: Path = field(compare=False)
    #: the newest segment of its partition, still written by the broker
    active: bool = field(default=False, compare=False)

    @classmethod
    def from_log_path(cls, path: str | os.PathLike[str], *, active: bool = False) -> Segment:
        path = Path(path)
        base = parse_segment_file_name(path.name)
        if base is None:
            raise ValueError(f"{path} is not named like a segment: <20 digits>{LOG_SUFFIX}")
        return cls(base, path, active)

    @classmethod
    def in_dir(
        cls, directory: str | os.PathLike[str], base_offset: int, *, active: bool = False
    ) -> Segment:
        return cls(base_offset, Path(directory) / segment_file_name(base_offset), active)

    @property
    def directory(self) -> Path:
        return self.log_path.parent

    def _sibling(self, suffix: str) -> Path:
        return self.log_path.with_name(segment_file_name(self.base_offset, suffix))

    @property
    def index_path(self) -> Path:
        return self._sibling(INDEX_SUFFIX)

    @property
    def timeindex_path(self) -> Path:
        return self._sibling(TIMEINDEX_SUFFIX)

    @property
    def txnindex_path(self) -> Path:
        return self._sibling(TXNINDEX_SUFFIX)

    def size(self) -> int:
        """Current size of the `.log` in bytes."""
        return self.log_path.stat().st_size

    def open_log(self) -> LogFile:
        """The `.log` opened for ranged reads (a context manager)."""
        return LogFile(self.log_path, active=self.active)

    # --- indexes -----------------------------------------------------------------------------

    def offset_index(self) -> OffsetIndex:
        """The `.index`; empty if the file is missing (Kafka rebuilds it, so may we). A live
        segment's index that does not parse (caught mid-write) is ignored with a debug line:
        the `.log` is the truth and a scan from 0 is only slower."""
        return self._read_index(OffsetIndex, self.index_path)

    def time_index(self) -> TimeIndex:
        """The `.timeindex`, with the same missing / live-segment rules as `offset_index`."""
        return self._read_index(TimeIndex, self.timeindex_path)

    def _read_index(self, kind: type[_Index], path: Path) -> _Index:
        try:
            return kind.read(path, base_offset=self.base_offset, preallocated=self.active)
        except FileNotFoundError:
            log.debug("%s: missing, scanning the log instead", path)
        except CorruptSegmentError as err:
            if not self.active:
                raise
            log.debug("%s: unreadable while the segment is live (%s); ignoring it", path, err)
        return kind(self.base_offset, path=str(path))

    def rebuild_indexes(
        self, *, index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    ) -> tuple[bytes, bytes]:
        """`.index` and `.timeindex` bytes rebuilt from the `.log` as Kafka's recovery would."""
        with self.open_log() as f:
            builder = _build(f.headers(), self.base_offset, index_interval_bytes, str(f.path))
        return builder.offset_index().to_bytes(), builder.time_index().to_bytes()

    # --- reading -----------------------------------------------------------------------------

    def iter_batch_headers(
        self, start_position: int = 0, *, verify_crc: bool = True
    ) -> Iterator[BatchHeader]:
        """Batch headers from byte `start_position` (a batch boundary) to the end."""
        with self.open_log() as f:
            yield from f.headers(start_position, verify_crc=verify_crc)

    def iter_batches(self, start_position: int = 0) -> Iterator[RecordBatch]:
        """Fully decoded batches from byte `start_position` to the end."""
        with self.open_log() as f:
            for header in f.headers(start_position):
                yield f.decode(header)

    def find_offset(self, offset: int) -> BatchHeader | None:
        """The first batch whose last offset is >= `offset`: the batch holding it, or after
        compaction the next one (Kafka's translateOffset). None past the segment's end."""
        index = self.offset_index()
        with self.open_log() as f:
            start = index.lookup(offset, max_position=f.size).position
            for header in f.headers(start):
                if header.last_offset >= offset:
                    return header
        return None

    def offset_for_timestamp(
        self, timestamp: int, *, starting_offset: int | None = None
    ) -> TimestampAndOffset | None:
        """The first record at or above `starting_offset` whose timestamp is >= `timestamp`
        (ms), as Kafka's LogSegment.findOffsetByTimestamp: time index -> offset index ->
        scan batch headers, decoding only the batch whose max timestamp qualifies."""
        starting = self.base_offset if starting_offset is None else starting_offset
        time_entry = self.time_index().lookup(timestamp)
        index = self.offset_index()
        with self.open_log() as f:
            start = index.lookup(max(time_entry.offset, starting), max_position=f.size).position
            for header in f.headers(start):
                if header.max_timestamp < timestamp or header.last_offset < starting:
                    continue
                for record in f.decode(header).records:
                    if record.timestamp >= timestamp and record.offset >= starting:
                        epoch = header.partition_leader_epoch
                        return TimestampAndOffset(
                            record.timestamp, record.offset, epoch if epoch >= 0 else None
                        )
        return None

    def read_range(self, position: int, max_bytes: int, *, min_one_batch: bool = True) -> bytes:
        """Whole, CRC-checked batches from byte `position` (a batch boundary) adding up to at
        most `max_bytes`; with `min_one_batch` the first batch comes whatever its size (a
        fetch must make progress, as KIP-74 says)."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, not {max_bytes}")
        with self.open_log() as f:
            end = position
            for header in f.headers(position):
                if header.end_position - position > max_bytes and not (
                    min_one_batch and end == position
                ):
                    break
                end = header.end_position
            return f.read(position, end - position)

    def read_from_offset(
        self, offset: int, max_bytes: int, *, min_one_batch: bool = True
    ) -> bytes:
        """`read_range` from the batch holding `offset` (empty past the segment's end)."""
        header = self.find_offset(offset)
        if header is None:
            return b""
        return self.read_range(header.position, max_bytes, min_one_batch=min_one_batch)

    def last_batch(self) -> BatchHeader | None:
        """The last whole batch, found by scanning from the last index entry only, or, for a
        file this process looked at before, from the last batch it found there: an active
        segment only grows, so a reader asking for the log end on every fetch walks only what
        was appended since (and a file that changed otherwise is scanned afresh)."""
        try:
            st = os.stat(self.log_path)
        except OSError:
            st = None
        with _TAILS_LOCK:
            known = _TAILS.get(str(self.log_path)) if st is not None else None
        if known is not None and st is not None and known[:3] == _identity(st):
            return known[3]
        with self.open_log() as f:
            header = None
            start = self._resume_position(f, known, st)
            if start is None:
                index = self.offset_index()
                last = index.last_entry
                start = 0 if last is None else index.lookup(
                    last.offset, max_position=f.size).position
            for header in f.headers(start):  # noqa: B007 - the last one is the answer
                pass
        if st is not None:
            _remember_tail(str(self.log_path), _identity(st), header)
        return header

    @staticmethod
    def _resume_position(f: LogFile, known: _Tail | None, st: os.stat_result | None
                         ) -> int | None:
        """Where to resume the walk: the remembered last batch, if the same file only grew
        and that batch still reads back the same (base offset and CRC) at its position."""
        if known is None or st is None:
            return None
        ino, size, _, header = known
        if header is None or st.st_ino != ino or st.st_size < size:
            return None
        try:
            again = next(iter(f.headers(header.position)), None)
        except CorruptSegmentError:
            return None
        if again is None or (again.base_offset, again.crc) != (header.base_offset, header.crc):
            return None
        return header.position

    def last_offset(self) -> int | None:
        """Offset of the last record, None for an empty segment."""
        header = self.last_batch()
        return None if header is None else header.last_offset

    def next_offset(self) -> int:
        """The offset the next record appended to this segment would get."""
        last = self.last_offset()
        return self.base_offset if last is None else last + 1

    def max_timestamp(self) -> int | None:
        """Largest batch max timestamp in the segment (ms), None if there is none.

        When the offset index got its last entry, the time index got the max timestamp of
        everything up to that batch; so the answer is the larger of the time index's last
        timestamp and the batches from that last offset-index position on."""
        offsets = self.offset_index()
        times = self.time_index()
        best = NO_TIMESTAMP
        with self.open_log() as f:
            last = offsets.last_entry
            start = 0 if last is None else offsets.lookup(last.offset, max_position=f.size).position
            last_offset = None
            for header in f.headers(start):
                best = max(best, header.max_timestamp)
                last_offset = header.last_offset
        if last_offset is not None:
            for slot in reversed(range(len(times))):
                # a live segment's time index may already name batches past our snapshot
                if times[slot].offset <= last_offset:
                    best = max(best, times[slot].timestamp)
                    break
        return best if best > NO_TIMESTAMP else None

    def verify(self, *, check_indexes: bool = True) -> SegmentSummary:
        """Walk every batch with its CRC; check offsets increase from the base offset and fit
        the indexes' 32-bit relative offsets, and (with `check_indexes`) that every `.index`
        entry points at a batch boundary and an offset in that batch or later. Raises
        CorruptSegmentError at the first problem, naming the file and byte position."""
        index = list(self.offset_index()) if check_indexes else []
        where = str(self.log_path)

        def bad_entry(slot: int, problem: str) -> CorruptSegmentError:
            entry = index[slot]
            return CorruptSegmentError(
                f"index entry {slot} (offset {entry.offset}, position {entry.position}) "
                f"{problem}",
                path=str(self.index_path),
                position=slot * OFFSET_INDEX_ENTRY.size,
            )

        batches = records = 0
        first_offset = last_offset = first_ts = None
        max_ts = NO_TIMESTAMP
        valid_end = 0
        slot = 0
        crc = RunningChecksum()
        with self.open_log() as f:
            file_size = f.size
            for header in f.headers(checksum=crc):
                floor = self.base_offset if last_offset is None else last_offset + 1
                if header.base_offset < floor:
                    raise CorruptSegmentError(
                        f"batch base offset {header.base_offset} is below {floor}, the "
                        + ("segment's base offset" if last_offset is None
                           else "previous batch's next offset"),
                        path=where,
                        position=header.position,
                    )
                if header.last_offset - self.base_offset > INT32_MAX:
                    raise CorruptSegmentError(
                        f"offset {header.last_offset} overflows a 32-bit relative offset from "
                        f"{self.base_offset}",
                        path=where,
                        position=header.position,
                    )
                while slot < len(index) and index[slot].position <= header.position:
                    entry = index[slot]
                    if entry.position != header.position or entry.offset < header.base_offset:
                        raise bad_entry(slot, "does not point at the batch holding its offset")
                    slot += 1
                if first_offset is None:
                    first_offset, first_ts = header.base_offset, header.first_timestamp
                last_offset = header.last_offset
                max_ts = max(max_ts, header.max_timestamp)
                batches += 1
                records += header.records_count
                valid_end = header.end_position
        if slot < len(index) and not self.active:
            raise bad_entry(slot, "points past the last batch")
        return SegmentSummary(
            base_offset=self.base_offset,
            first_offset=first_offset,
            last_offset=last_offset,
            batches=batches,
            records=records,
            size=valid_end,
            first_timestamp=first_ts,
            max_timestamp=max_ts if max_ts > NO_TIMESTAMP else None,
            checksum=crc.value if crc.end == file_size else None,
        )


def _build(
    headers: Iterable[BatchHeader], base_offset: int, index_interval_bytes: int,
    path: str | None,
) -> IndexBuilder:
    builder = IndexBuilder(base_offset, index_interval_bytes=index_interval_bytes, path=path)
    for h in headers:
        builder.add(
            position=h.position, size=h.size, last_offset=h.last_offset,
            max_timestamp=h.max_timestamp,
        )
    builder.close()
    return builder


def indexes_of(
    headers: Iterable[BatchHeader], *, base_offset: int, index_interval_bytes: int,
    path: str | None = None,
) -> tuple[bytes, bytes]:
    """`.index` and `.timeindex` bytes for batches already walked (positions from the start
    of the object they will index), as `build_indexes` makes them from the bytes."""
    builder = _build(headers, base_offset, index_interval_bytes, path)
    return builder.offset_index().to_bytes(), builder.time_index().to_bytes()


def build_indexes(
    log_bytes: Buffer,
    *,
    base_offset: int,
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    path: str | None = None,
) -> tuple[bytes, bytes]:
    """`.index` and `.timeindex` bytes for a closed segment whose `.log` is `log_bytes` (bytes
    or an mmap), exactly as Kafka's LogSegment.recover plus close would write them. Every batch
    is CRC-checked; corrupt input raises CorruptSegmentError rather than indexing a prefix."""
    builder = _build(iter_batch_headers(log_bytes, path=path), base_offset,
                     index_interval_bytes, path)
    return builder.offset_index().to_bytes(), builder.time_index().to_bytes()
