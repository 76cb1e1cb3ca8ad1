"""Reading whole record batches out of segments: local `.log` files and segment objects in
the bucket (through the chunked cache), with one span rule for both.

`RemoteSegments` keeps, per segment object, its offset index (the `.index` object beside it,
downloaded once), the chunk plan made from the index positions and the cache handle, in a small
LRU. A read positions itself with the index (a lower bound), walks batch headers from there in
windows ending on the cache's checksum blocks (headers only), picks whole batches with
`take_batches` and reads them through the cache, which verified every batch when it downloaded
the chunk and checks the chunk file's block CRC-32Cs on every read (local pieces are checked
with `check_batches`).

Chunk boundaries (`cache.chunks.plan_chunks` over the index positions): with Kafka's default
`log.index.interval.bytes` (4 KiB) the index is dense enough for any chunk size. When it is
sparse, missing or corrupt, chunks can only end at the boundaries known, so they grow past
`cloud_storage_cache_chunk_size` (no index at all: one chunk, the whole segment, checked against
the manifest's CRC-32C of the object); the header walk still finds the batch, it reads more.

The span logic (`take_batches`, `check_batches`) is shared by `LocalSegments.read` (a local
segment through its `.index` and `LogFile`) and `RemoteSegments.read`, so both serve exactly
the same batches; `cache.reader` chains them across segments.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Generic, NamedTuple, TypeVar

import crc32c

from cache.chunk_cache import ChunkCache, ChunkFile, ReaderId, SegmentHandle
from cache.chunks import plan_chunks
from cache.disk import BLOCK
from cache.download import Verifier
from cache.fetched_bytes import FilePiece, Pieces
from manifests import segment_indexes
from manifests.manifest import PartitionManifest
from manifests.model import INDEX_BUNDLE, SegmentMeta
from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.index import OffsetIndex, TimeIndex
from tiered.kafka.local_log import PartitionLog
from tiered.kafka.records import (
    BATCH_HEADER,
    LOG_OVERHEAD,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    BatchHeader,
    Buffer,
    decode_batch,
    iter_batch_headers,
)
from tiered.kafka.segment import Segment, TimestampAndOffset
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound

__all__ = [
    "LocalSegments",
    "Lru",
    "RemoteSegments",
    "Span",
    "check_batches",
    "chunk_verifier",
    "intact_prefix",
    "local_log_end",
    "local_offset_for_timestamp",
    "take_batches",
]

log = logging.getLogger(__name__)

#: segments whose (index, chunk plan, cache handle) stay in memory; an index is at most
#: 10 MiB (`log.index.size.max.bytes`) and usually a few KiB
INDEX_LRU_ENTRIES = 128
#: consumer sessions whose position in a remote segment is remembered
RESUME_ENTRIES = 4096
#: bytes past a fetch's budget read from the store before damage in a chunk: the distance
#: from the index's lower bound to the batch wanted, and a first batch larger than the budget
_PREFIX_SLACK = 1 << 20

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
IndexT = TypeVar("IndexT", OffsetIndex, TimeIndex)


class Lru(Generic[K, V]):
    """A small thread-safe LRU bounded by entries."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._entries:
                self._data.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._data.pop(key, None)


@dataclass(frozen=True)
class Span:
    """Batches taken from one segment: bytes [begin, end) of it, and the next offset."""

    begin: int | None
    end: int
    next_offset: int
    #: the segment ran out (more may follow in the next one), not the budget or the limit
    exhausted: bool


class BatchSpan(NamedTuple):
    """What choosing batches needs of one (`take_batches`; a `BatchHeader` has the same)."""

    position: int
    last_offset: int
    end_position: int


#: base_offset, batch_length, magic, last_offset_delta: the fields of a batch header
#: `ChunkFiles.spans` reads (epoch, CRC and attributes skipped)
_SPAN = struct.Struct(">qi4xb6xi")


def take_batches(
    headers: Iterable[BatchSpan | BatchHeader], offset: int, budget: int, first: bool,
    limit: int | None
) -> Span:
    """Choose batches from a header walk: skip those ending before `offset`, then take whole
    batches while they fit `budget` bytes (the very first of the fetch regardless, when
    `first`: KIP-74), stopping before a batch reaching offset `limit` (the high watermark).
    A walk that meets damage (CorruptSegmentError) after taking batches stops before it."""
    begin: int | None = None
    end = 0
    next_offset = offset
    walk = iter(headers)
    while True:
        try:
            h = next(walk, None)
        except CorruptSegmentError:
            if begin is None:
                raise  # the read starts at the damage: it fails, naming file and byte
            # the batches before the damage are served; the next read starts at it and fails
            # (docs/remote-read.md, "Corrupt data")
            return Span(begin, end, next_offset, False)
        if h is None:
            return Span(begin, end, next_offset, True)
        if h.last_offset < offset:
            continue
        if limit is not None and h.last_offset >= limit:
            return Span(begin, end, next_offset, False)
        taken = 0 if begin is None else end - begin
        if taken + h.end_position - h.position > budget and not (first and begin is None):
            return Span(begin, end, next_offset, False)
        if begin is None:
            begin = h.position
        end, next_offset = h.end_position, h.last_offset + 1


def check_batches(data: Buffer, where: str, base_position: int, low: int, high: int) -> None:
    """CRC-32C and structure of every batch in `data` (whole batches read from byte
    `base_position` of `where`), offsets within [low, high]; CorruptSegmentError otherwise."""
    _intact, _next, err = intact_prefix(data, where, base_position, low, high)
    if err is not None:
        raise err


def intact_prefix(data: Buffer, where: str, base_position: int, low: int, high: int
                  ) -> tuple[int, int | None, CorruptSegmentError | None]:
    """How many leading bytes of `data` (whole batches read from byte `base_position` of
    `where`) are intact batches, as `check_batches` checks them; the offset after the last of
    them (None: none is); and the damage that ends them (None: every batch is intact), its
    position in `where`."""
    intact, next_offset = 0, None
    try:
        for h in iter_batch_headers(data, path=where):
            if h.base_offset < low or h.last_offset > high:
                raise CorruptSegmentError(
                    f"batch offsets {h.base_offset}..{h.last_offset} are outside the "
                    f"expected {low}..{high}",
                    path=where,
                    position=h.position,
                )
            intact, next_offset = h.end_position, h.last_offset + 1
    except CorruptSegmentError as err:
        return intact, next_offset, err.at(path=where, base_position=base_position)
    return intact, next_offset, None


def chunk_verifier(key: str, seg: SegmentMeta) -> Verifier:
    """What the cache runs on every downloaded chunk before it is stored or served: every
    batch's CRC-32C and offsets, plus the object's CRC-32C from the manifest when the chunk is
    the whole segment. Raises CorruptSegmentError naming the key and byte."""

    def verify(data: Buffer, begin: int) -> None:
        check_batches(data, key, begin, seg.base_offset, seg.last_offset)
        if begin == 0 and len(data) == seg.size_bytes:
            actual = crc32c.crc32c(data)
            if actual != seg.checksum:
                raise CorruptSegmentError(
                    f"object CRC-32C {actual:08x} differs from the manifest's "
                    f"{seg.checksum:08x}", path=key)

    return verify


class Window:
    """Forward-only reads of one segment object in contiguous windows, keeping the bytes from
    a moving start: every chunk is read once, while the cache still holds it for this reader
    (the eager strategy lets a chunk go as soon as its reader moves past it)."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, pos: int,
                 starts: Sequence[int], where: str) -> None:
        self._read = read
        self.size = size
        self.where = where
        self._starts = starts
        self._buf = bytearray()
        self._buf_start = pos

    def _window_end(self, at: int) -> int:
        """Reads stop inside the chunk holding `at` (at the end of a checksum block), so a read
        never downloads a chunk beyond the one it is in. They stop one byte short of the
        chunk's end: a read ending exactly there tells the cache this reader is done with the
        chunk, which eager eviction then drops, although the next fetch usually starts in it
        (the batch that did not fit). The last byte is read when it is really needed."""
        i = bisect.bisect_right(self._starts, at)
        chunk_end = self._starts[i] if i < len(self._starts) else self.size
        if chunk_end - at > 1:
            chunk_end -= 1
        # end on a checksum block of the chunk file: the cache reads and checks whole blocks,
        # so a window ending inside one would have the next window read and check it again
        chunk_start = self._starts[i - 1] if i > 0 else 0
        block_end = chunk_start + ((at - chunk_start) // BLOCK + 1) * BLOCK
        return min(self.size, chunk_end, block_end)

    def ensure(self, end: int) -> None:
        """Make bytes up to `end` (exclusive, <= size) available."""
        while (at := self._buf_start + len(self._buf)) < end:
            got = self._read(at, self._window_end(at))
            if not got:
                raise CorruptSegmentError("segment object is shorter than the manifest says",
                                          path=self.where, position=at)
            self._buf += got

    def discard_before(self, pos: int) -> None:
        if pos > self._buf_start:
            del self._buf[: pos - self._buf_start]
            self._buf_start = pos

    def slice(self, begin: int, end: int) -> bytes:
        self.ensure(end)
        return bytes(self._buf[begin - self._buf_start: end - self._buf_start])

    def headers(self, pos: int, offset: int) -> Iterator[BatchHeader]:
        """Batch headers from byte `pos` (a batch boundary) to the end, positions absolute;
        bytes of batches ending before `offset` are dropped as the walk passes them. CRCs are
        checked later, on what is served."""
        size, where = self.size, self.where
        while pos < size:
            if size - pos < BATCH_HEADER.size:
                raise CorruptSegmentError(
                    f"truncated batch: {size - pos} bytes left, a header needs "
                    f"{BATCH_HEADER.size}", path=where, position=pos)
            self.ensure(pos + BATCH_HEADER.size)
            h = BatchHeader(pos, *BATCH_HEADER.unpack_from(self._buf, pos - self._buf_start))
            if h.magic != MAGIC_V2 or h.batch_length < MIN_BATCH_LENGTH or h.end_position > size:
                raise CorruptSegmentError(
                    f"bad batch header (magic {h.magic}, length {h.batch_length}, "
                    f"{size - pos} bytes left)", path=where, position=pos)
            if h.last_offset < offset:
                self.discard_before(h.end_position)
            yield h
            pos = h.end_position


class ChunkFiles:
    """One fetch's view of a segment object as open chunk files: batch headers come from the
    cache's read-only mapping of each (a batch never spans two chunks: chunks start at batch
    boundaries), the batches themselves as file ranges carrying that mapping. Chunks are
    opened through the cache in walk order, so the reader's position and read-ahead move as
    with byte reads."""

    def __init__(self, handle: SegmentHandle, reader: ReaderId | None, size: int,
                 where: str, *, session: bool, max_files: int | None = None) -> None:
        self._handle = handle
        self._reader = reader
        self._session = session
        self.size = size
        self.where = where
        #: the header walk ends before opening more chunk files than this (None: no bound)
        self._max_files = max_files
        #: whether it ended so, short of the segment's end
        self.stopped = False
        #: the chunks opened, each a share of its file's mapping for the caller to release
        #: (`Pieces.adopt`) once the fetch is sent
        self.files: list[ChunkFile] = []

    def _file(self, pos: int) -> ChunkFile:
        for opened in reversed(self.files):
            if opened.begin <= pos < opened.end:
                return opened
        # read up to one byte short of the chunk's end: see Window._window_end
        i = bisect.bisect_right(self._handle.chunk_starts, pos)
        starts = self._handle.chunk_starts
        chunk_end = starts[i] if i < len(starts) else self.size
        # chunk files are never changed in place, and `f.end` is within what is written and
        # verified, so every byte read through the mapping below it is there
        f = self._handle.open_chunk(pos, max(pos + 1, chunk_end - 1), reader=self._reader,
                                    session=self._session)
        self.files.append(f)
        return f

    def spans(self, pos: int) -> Iterator[BatchSpan]:
        """From byte `pos` (a batch boundary) to the segment's end, what choosing batches
        needs of each (`take_batches`): where it starts, its last offset and where it ends,
        positions absolute; the magic and length checked. One 27-byte unpack per batch, not
        the whole 61-byte header: a consumer's every fetch walks these."""
        size, where = self.size, self.where
        begin, end, mapping = 0, 0, None
        unpack = _SPAN.unpack_from
        while pos < size:
            if size - pos < BATCH_HEADER.size:
                raise CorruptSegmentError(
                    f"truncated batch: {size - pos} bytes left, a header needs "
                    f"{BATCH_HEADER.size}", path=where, position=pos)
            if mapping is None or not begin <= pos < end:
                if self._max_files is not None and len(self.files) >= self._max_files:
                    self.stopped = True
                    return
                f = self._file(pos)
                begin, end, mapping = f.begin, f.end, f.mapping
                if end - pos < BATCH_HEADER.size:
                    raise CorruptSegmentError("cached chunk is shorter than the segment",
                                              path=where, position=pos)
            base_offset, length, magic, delta = unpack(mapping, pos - begin)
            after = pos + LOG_OVERHEAD + length
            if magic != MAGIC_V2 or length < MIN_BATCH_LENGTH or after > size:
                raise CorruptSegmentError(
                    f"bad batch header (magic {magic}, length {length}, "
                    f"{size - pos} bytes left)", path=where, position=pos)
            yield BatchSpan(pos, base_offset + delta, after)
            pos = after

    def pieces(self, begin: int, end: int) -> Iterator[FilePiece]:
        """Bytes [begin, end) as ranges of the chunk files holding them."""
        while begin < end:
            f = self._file(begin)
            stop = min(end, f.end)
            yield FilePiece(f.fd, begin - f.begin, stop - begin, f.mapping)
            begin = stop


@dataclass(frozen=True)
class _Opened:
    key: str
    meta: SegmentMeta
    index: OffsetIndex
    handle: SegmentHandle


class RemoteSegments:
    """Segment objects of the bucket, read through `cache` (thread-safe)."""

    def __init__(self, store: ObjectStore, cache: ChunkCache, chunk_size: int) -> None:
        self.store = store
        self.cache = cache
        self.chunk_size = chunk_size
        self._opened: Lru[str, _Opened] = Lru(INDEX_LRU_ENTRIES)
        self._time_indexes: Lru[str, TimeIndex] = Lru(INDEX_LRU_ENTRIES)
        #: (reader, segment key) -> (next offset, its byte position) of consumer sessions
        self._resume: Lru[tuple[ReaderId | None, str], tuple[int, int]] = Lru(RESUME_ENTRIES)
        #: (reader, segment key) whose next segment is already being read ahead
        self._ahead: Lru[tuple[ReaderId | None, str], bool] = Lru(RESUME_ENTRIES)
        self._lock = threading.Lock()
        #: `.index` / `.timeindex` objects downloaded; segments read without a usable one
        self.index_downloads = 0
        self.index_fallbacks = 0

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def _open(self, m: PartitionManifest, seg: SegmentMeta) -> _Opened:
        key = m.segment_key(seg)
        hit = self._opened.get(key)
        if hit is not None and hit.meta == seg:
            return hit
        if seg.size_bytes == 0:
            raise CorruptSegmentError("the manifest lists an empty segment object", path=key)
        index = self._index(m, seg, OffsetIndex, "index")
        try:
            starts = plan_chunks([e.position for e in index], seg.size_bytes, self.chunk_size)
        except CorruptSegmentError as err:
            log.warning("%s: index does not fit the segment (%s); reading it whole", key,
                        err.reason)
            self._count("index_fallbacks")
            index, starts = OffsetIndex(seg.base_offset), [0]
        handle = self.cache.open_segment(key, seg.size_bytes, starts, chunk_verifier(key, seg))
        opened = _Opened(key, seg, index, handle)
        self._opened.put(key, opened)
        return opened

    def _index(self, m: PartitionManifest, seg: SegmentMeta, cls: type[IndexT],
               kind: str) -> IndexT:
        """The segment's offset (`index`) or time (`timeindex`) index; empty (a scan from
        byte 0) when it is missing or corrupt, which costs speed, never correctness. A bundle
        brings both in one GET: reading the offset index keeps the time index too."""
        key = m.segment_key(seg)
        where = f"{key} ({kind})"
        both = seg.index_layout == INDEX_BUNDLE
        try:
            got = segment_indexes.read_indexes(
                self.store, m.data_prefix, seg.object_name, seg.index_layout,
                ("index", "timeindex") if both else (kind,), segment_bytes=seg.size_bytes)
            self._count("index_downloads")
            data = got[kind]
            if data is None:
                raise ObjectNotFound(where)
            index = cls.from_bytes(data, base_offset=seg.base_offset, path=where)
        except (ObjectNotFound, CorruptSegmentError) as err:
            log.warning("%s: index unusable (%s); scanning the segment instead", where, err)
            self._count("index_fallbacks")
            return cls(seg.base_offset, path=where)
        times = got.get("timeindex")
        if kind == "index" and times is not None:
            try:
                self._time_indexes.put(key, TimeIndex.from_bytes(
                    times, base_offset=seg.base_offset, path=f"{key} (timeindex)"))
            except CorruptSegmentError as err:  # read again, and fall back, if it is needed
                log.warning("%s (timeindex): unusable (%s)", key, err)
        return index

    def read(
        self, m: PartitionManifest, seg: SegmentMeta, offset: int, budget: int, first: bool,
        reader: ReaderId | None, out: Pieces, *, session: bool = False,
        following: Callable[[], SegmentMeta | None] | None = None,
        max_files: int | None = None,
    ) -> Span:
        """Whole batches of `seg` from the one holding `offset` within `budget` bytes (see
        `take_batches`), added to `out` as ranges of the cache's chunk files (which holds a
        share of each file's mapping until it is sent); an exhausted span's next offset is the
        segment's end. Batch headers are read from those mappings; the batches themselves are not
        read here at all: the cache verified every one when it downloaded the chunk.

        With `session` (a named consumer), where the read stopped is remembered, and a read
        asking for exactly that offset next starts there instead of at the index's lower bound:
        an index entry names the batch *before* the one wanted, which may sit in a chunk the
        consumer has already left (and eager eviction dropped), so resuming from the index
        would download that chunk again at every chunk boundary.

        `following` gives the segment after `seg`: when a session's read comes within its
        read-ahead window (`cache.readahead`) of `seg`'s end, that segment's first chunk is read
        ahead (on a thread of its own, it downloads the segment's index first), so a consumer
        crossing the boundary does not wait.

        `max_files`: the read holds at most this many chunk files (the walk stops before
        opening another: the span then ends short of the segment)."""
        if session and offset <= seg.base_offset and (
                self._opened.get(m.segment_key(seg)) is None):
            # a consumer starting on a segment not opened yet: its bytes from byte 0 are
            # asked for while its index comes
            self.cache.request_early(m.segment_key(seg), seg.size_bytes)
        rs = self._open(m, seg)
        resume = self._resume.get((reader, rs.key)) if session else None
        if resume is not None and resume[0] == offset:
            start = resume[1]
        else:
            start = rs.index.lookup(offset, max_position=seg.size_bytes).position
        files = ChunkFiles(rs.handle, reader, seg.size_bytes, rs.key, session=session,
                           max_files=max_files)
        try:
            try:
                span = take_batches(files.spans(start), offset, budget, first, None)
            except CorruptSegmentError as err:
                span = self._intact_before(rs, start, offset, budget, first, err, out)
            else:
                if span.begin is not None:
                    for piece in files.pieces(span.begin, span.end):
                        out.add(piece)
        finally:
            out.adopt(f.file for f in files.files)
        if span.begin is not None and session:
            self._resume.put((reader, rs.key), (span.next_offset, span.end))
            starts, ahead = rs.handle.chunk_starts, self.cache.read_ahead_window(reader)
            if following is not None and ahead > 0 and (
                    span.end >= starts[max(0, len(starts) - ahead)]):
                self._read_ahead_next(m, following, reader, rs.key)
        if files.stopped:  # not the segment's end: the chunk files the answer may hold are
            span = replace(span, exhausted=False)
        elif span.exhausted:
            span = replace(span, next_offset=seg.next_offset)
        return span

    def _intact_before(self, rs: _Opened, start: int, offset: int, budget: int, first: bool,
                       err: CorruptSegmentError, out: Pieces) -> Span:
        """The batches from `offset` that lie before the damage `err` found in the chunk the
        read needed, read straight from the store (the cache serves no chunk that failed its
        check, and the intact batches before the damage are the answer: docs/remote-read.md,
        "Corrupt data"); re-raises `err` when the read starts at the damage. Reads as far as
        the budget needs, then (for a first batch larger than that) up to the damage."""
        bad = err.position
        if err.path != rs.key or bad is None or bad <= start:
            raise err
        for stop in dict.fromkeys((min(bad, start + budget + _PREFIX_SLACK), bad)):
            data = self.store.read_range(rs.key, start, stop)
            intact, _after, _damage = intact_prefix(data, rs.key, start, rs.meta.base_offset,
                                                    rs.meta.last_offset)
            walk = iter_batch_headers(memoryview(data)[:intact], verify_crc=False)
            span = take_batches((h._replace(position=h.position + start) for h in walk),
                                offset, budget, first, None)
            if span.begin is not None:
                log.warning("%s; serving the intact batches before it (bytes %d..%d)", err,
                            span.begin, span.end - 1)
                out.add(bytes(data[span.begin - start:span.end - start]))
                return replace(span, exhausted=False)
        raise err

    def _read_ahead_next(self, m: PartitionManifest,
                         following: Callable[[], SegmentMeta | None],
                         reader: ReaderId | None, current: str) -> None:
        if reader is None or not self.cache.read_ahead.enabled:
            return
        nxt = following()
        if nxt is None or self._ahead.get((reader, current)) is not None:
            return
        self._ahead.put((reader, current), True)

        def run() -> None:
            try:
                self._open(m, nxt).handle.read_ahead(reader, after=current)
            except TieredError as err:  # the reader's own read reports it, if it comes
                log.debug("read-ahead into %s failed: %s", m.segment_key(nxt), err)

        self.cache.run_in_background(run, "cache-next-segment")

    def offset_for_timestamp(
        self, m: PartitionManifest, seg: SegmentMeta, timestamp: int, starting: int,
        reader: ReaderId | None = None,
    ) -> TimestampAndOffset | None:
        """The first record of `seg` at or above offset `starting` whose timestamp is >=
        `timestamp` (ms), as Kafka's LogSegment.findOffsetByTimestamp: time index -> offset
        index -> header walk, decoding (and CRC-checking) only a batch that qualifies."""
        rs = self._open(m, seg)
        times = self._time_indexes.get(rs.key)
        if times is None:
            times = self._index(m, seg, TimeIndex, "timeindex")
            self._time_indexes.put(rs.key, times)
        entry = times.lookup(timestamp)
        start = rs.index.lookup(max(entry.offset, starting), max_position=seg.size_bytes)

        def read(begin: int, end: int) -> bytes:
            return rs.handle.read(begin, end, reader=reader, session=False)

        window = Window(read, seg.size_bytes, start.position, rs.handle.chunk_starts, rs.key)
        for h in window.headers(start.position, starting):
            if h.max_timestamp < timestamp or h.last_offset < starting:
                window.discard_before(h.end_position)
                continue
            try:
                batch = decode_batch(window.slice(h.position, h.end_position), path=rs.key)
            except CorruptSegmentError as err:
                raise err.at(path=rs.key, base_position=h.position) from None
            for r in batch.records:
                if r.timestamp >= timestamp and r.offset >= starting:
                    epoch = h.partition_leader_epoch
                    return TimestampAndOffset(r.timestamp, r.offset, epoch if epoch >= 0 else None)
        return None



# -- local segments ------------------------------------------------------------------------------


class LocalSegments:
    """Reads of local segments, keeping parsed `.index` files of closed segments (immutable
    until deleted; keyed by path, size and mtime) so a local hit does not re-parse the index
    every fetch."""

    def __init__(self, entries: int = INDEX_LRU_ENTRIES) -> None:
        self._indexes: Lru[tuple[str, int, int], OffsetIndex] = Lru(entries)

    def _offset_index(self, seg: Segment) -> OffsetIndex:
        if seg.active:
            return seg.offset_index()
        try:
            st = os.stat(seg.index_path)
        except FileNotFoundError:
            return seg.offset_index()  # missing: an empty index, the scan starts at 0
        key = (str(seg.index_path), st.st_size, st.st_mtime_ns)
        index = self._indexes.get(key)
        if index is None:
            try:
                index = seg.offset_index()
            except CorruptSegmentError as err:
                # a bad local index costs speed, never correctness: the `.log` is the truth,
                # walked from its first batch (archiving rebuilds the index the same way)
                log.warning("%s: unusable (%s); reading the segment from its start",
                            seg.index_path, err)
                index = OffsetIndex(seg.base_offset)
            self._indexes.put(key, index)
        return index

    def read(
        self, part: PartitionLog, offset: int, budget: int, first: bool, limit: int
    ) -> tuple[bytes, Span] | None:
        """Whole batches from the local segment holding `offset` (see `take_batches`; `limit`
        is the high watermark), CRC-checked; None when no segment holds it. An exhausted
        span's next offset is the next segment's base; at the end of the local log the span is
        not exhausted. A segment deleted or truncated under the read raises
        FileNotFoundError."""
        bases = [s.base_offset for s in part.segments]
        i = bisect.bisect_right(bases, offset) - 1
        if i < 0:
            return None
        seg: Segment = part.segments[i]
        index = self._offset_index(seg)
        with seg.open_log() as f:
            start = index.lookup(offset, max_position=f.size).position
            # CRCs are checked below, on the batches served only: one damaged batch before
            # `offset` must not fail reads after it
            span = take_batches(f.headers(start, verify_crc=False), offset, budget, first,
                                limit)
            data = b"" if span.begin is None else f.read(span.begin, span.end - span.begin)
        if span.begin is not None:
            if len(data) != span.end - span.begin:
                raise FileNotFoundError(f"{seg.log_path} shrank while being read")
            intact, after, err = intact_prefix(data, str(seg.log_path), span.begin,
                                               seg.base_offset, limit)
            if err is not None:
                if after is None:
                    raise err  # the read starts at the damage
                # serve the intact batches before it: the next read starts at the damage
                # and fails there, naming the file and byte (docs/remote-read.md)
                log.warning("%s; serving the %d intact bytes before it", err, intact)
                data = data[:intact]
                return data, Span(span.begin, span.begin + intact, after, False)
        if i + 1 < len(part.segments) and span.exhausted:
            span = replace(span, next_offset=max(span.next_offset,
                                                 part.segments[i + 1].base_offset))
        elif span.exhausted:
            span = replace(span, exhausted=False)  # the end of the local log
        return data, span


def local_log_end(part: PartitionLog) -> int | None:
    """`part.log_end_offset()`, found from batch headers alone when the active segment's tail
    fails its checks: where batches end does not depend on their CRC-32Cs, and a fetch must
    still reach the intact batches before damaged ones (it stops at the damage itself:
    docs/remote-read.md, "Corrupt data"). A damaged header ends the walk there."""
    try:
        return part.log_end_offset()
    except CorruptSegmentError as err:
        active = part.active_segment
        if active is None:
            raise
        log.debug("%s; finding the log end from batch headers alone", err)
    try:
        last = active.offset_index().last_entry
    except CorruptSegmentError:
        last = None
    with active.open_log() as f:
        starts = [0] if last is None else [
            active.offset_index().lookup(last.offset, max_position=f.size).position, 0]
        for start in dict.fromkeys(starts):
            end: int | None = None
            try:
                for h in f.headers(start, verify_crc=False):
                    end = h.last_offset + 1
            except CorruptSegmentError:
                pass
            if end is not None:
                return end
    return active.base_offset


def local_offset_for_timestamp(
    part: PartitionLog, timestamp: int, lo: int, hi: int
) -> TimestampAndOffset | None:
    """The first local record in offsets [lo, hi) whose timestamp is >= `timestamp` (ms),
    skipping segments whose max timestamp is older."""
    for seg in part.segments:
        if seg.base_offset >= hi:
            break
        top = seg.max_timestamp()
        if top is None or top < timestamp:
            continue
        found = seg.offset_for_timestamp(timestamp, starting_offset=max(lo, seg.base_offset))
        if found is not None and found.offset < hi:
            return found
    return None
