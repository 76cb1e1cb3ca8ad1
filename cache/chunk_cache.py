"""The chunked read cache: byte ranges of remote segments served from chunk files on local disk.

`ChunkCache` knows nothing about S3: it is given a range-fetch function `fetch(key, begin,
end_exclusive) -> bytes`. A read downloads only the chunks covering its range (one ranged GET
per chunk), verifies each (record CRCs through the segment's `verify`; then CRC-32Cs per MiB
block, kept so that later reads check just the blocks they serve), writes it atomically and
serves it. Concurrent readers of one chunk share one download. Before a download the cache
reserves the chunk's bytes and one object, trimming unheld chunks in the eviction strategy's
order; when everything is held it may go over its limits by one chunk at most, and past that a
read waits for room (then fails with CacheFullError).

Read-ahead (`cloud_storage_chunk_prefetch` > 0): given a `stream` function, a consumer session
that misses a chunk, or reads sequentially towards chunks not cached, gets one streamed request
from that chunk to the segment's end; its thread stores chunk after chunk as the bytes arrive,
never more than `chunk_prefetch` chunks ahead of where the reader is (it stops reading the
socket and waits), so a consumer that keeps up waits on no request after its first, and a
segment read start to end costs one GET instead of one per chunk. Each chunk is verified a run
of whole batches at a time as it arrives (`cache.staging`), and a reader that catches up with
its stream is served the verified start of the chunk (`open_chunk`) instead of waiting for all
of it. The stream ends when the reader goes away, moves elsewhere, idles, or the next chunk is
already cached; a broken stream falls back to one ranged GET per chunk.

A streamed chunk (read-ahead, or one streamed for a read that missed it) is received into a
buffer of `cache.buffers` rather than its file, checked and served from memory, and written to
its file only if the cache still keeps it once no reader holds it (write-behind): under eager
eviction a chunk one consumer read is evicted first and never written. Chunks in memory nobody
has read for a second are written, held or not, once half the buffers' budget
(`cloud_storage_cache_memory_size`) is lent; with no buffer to spare a chunk goes to its file as
it arrives; `close()` writes what is still in memory (docs/remote-read.md, "Chunks in memory").

Threads: reads may come from any thread. Without a `stream` function prefetches run on
`prefetch_executor` (a private two-thread pool when none is given and
`cloud_storage_chunk_prefetch` > 0); read-ahead streams, the write-behind and the watch over
idle chunks in memory run on their own daemon threads, which `close()` waits for. `start()`
runs the periodic check (`cloud_storage_cache_check_interval_ms`) on a daemon thread that
`close()` stops.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, TypeVar

from cache import disk
from cache.accounting import CacheSettings, plan_trim
from cache.buffers import ChunkBuffers
from cache.chunks import chunks_for_range
from cache.disk_health import DiskHealth
from cache.download import ByteStream, Fetcher, Streamer, Verifier, fetch_verified
from cache.entries import CacheEntry, SegmentInfo
from cache.errors import CacheError, CacheFullError
from cache.eviction import ChunkId, ChunkView, SegmentSnapshot, make_strategy
from cache.mapped import MappedFile
from cache.readers import ReaderId, ReaderTable
from cache.staging import BufferedChunk, StagedChunk
from tiered.errors import CorruptSegmentError, TieredError

__all__ = ["ChunkCache", "ChunkFile", "Fetcher", "ReaderId", "SegmentHandle", "Verifier"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: a stored chunk that reads back wrong is discarded and fetched again this many times per read
_READ_ATTEMPTS = 3
#: ... and one found gone (evicted by another process sharing the directory) this many times
_MISSING_ATTEMPTS = 10
#: a read-ahead stream waits this long for its reader to come near its next chunk, then lets
#: the connection go (a consumer back from a longer pause starts a new stream)
_STREAM_IDLE_S = 20.0
#: read-ahead streams open at once; past this, read-ahead falls back to one GET per chunk
_MAX_STREAMS = 32
#: an early request (`ChunkCache.request_early`) nobody took is closed at the first check this
#: long after it went out
_EARLY_TTL_S = 10.0
#: buffers of `cache.buffers` given back this long ago (seconds) are freed at the next check
_IDLE_BUFFER_S = 60.0
#: a chunk in memory nobody has read for this long (seconds) is written behind, held or not,
#: once more than half the buffers' budget is lent: memory is for the chunks being read now
_SPILL_IDLE_S = 1.0
#: stored chunks kept open and mapped between fetches (`cache.mapped`), most recently read
#: first: the chunks consumers are reading, not the whole cache (each costs two descriptors,
#: and an evicted file's space comes back only once it is unmapped)
_MAPPED_FILES = 16


class ChunkFile(NamedTuple):
    """An open chunk file whose verified segment bytes [begin, end) may be served: a share of
    its mapping (`cache.mapped`), which `close` gives back. `end` is short of the chunk's end
    when a read-ahead stream is still writing the chunk: open the chunk again for bytes past
    it."""

    file: MappedFile
    begin: int
    end: int

    @property
    def fd(self) -> int:
        """The file's descriptor, shared: read it with `os.pread`, never close it."""
        return self.file.fd

    @property
    def mapping(self) -> mmap.mmap:
        """The file mapped read-only from the chunk's first byte."""
        return self.file.mapping

    def close(self) -> None:
        self.file.release()


def _close_body(request: Future[ByteStream]) -> None:
    if request.exception() is None:
        request.result().close()


@dataclass
class _Stream:
    """A running read-ahead stream: the chunk it is at, and whether its reader closed."""

    #: the chunk it waits for, or the one after the chunk it is downloading
    next_index: int
    #: what the stream waits on for its reader (over the cache's lock): woken by that
    #: reader's reads and close only, not by every change in the cache
    wake: threading.Condition
    cancelled: bool = False
    #: the segment the reader finishes before this one (its first chunk comes meanwhile)
    after: str | None = None
    #: its reader waits for its first chunk (a stream of the segment after): go at once
    due: bool = False


class SegmentHandle:
    """One remote segment as the cache sees it; get it from `ChunkCache.open_segment`."""

    def __init__(self, cache: ChunkCache, segment: SegmentInfo) -> None:
        self._cache = cache
        self._segment = segment

    @property
    def key(self) -> str:
        return self._segment.key

    @property
    def size(self) -> int:
        return self._segment.size

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        return self._segment.starts

    def read(self, begin: int, end: int, *, reader: ReaderId | None = None,
             session: bool = True) -> bytes:
        """Bytes [begin, end) of the segment, downloading the chunks that cover them if they are
        not cached. `reader` names a consumer session so its position is held between reads,
        sequential reading is detected (read-ahead) and the predictive strategy learns its
        needs; None reads once without holding anything afterwards. `session` False: the
        reader is one fetch, not a consumer session, so nothing is read ahead for it."""
        return self._cache._read(self._segment, begin, end, reader, session)

    def open_chunk(self, position: int, end: int, *, reader: ReaderId | None = None,
                   session: bool = True) -> ChunkFile:
        """The chunk holding byte `position`, verified and open for reading (downloaded first
        when not cached), for a read of bytes [position, end) that continues past it when
        `end` is beyond the chunk. While a read-ahead stream writes the chunk, what is
        verified of it so far, once that reaches past `position` (`ChunkFile.end` then says
        where it stops). The descriptor keeps the file readable even if the cache evicts it;
        the caller closes it. `reader` as in `read`."""
        return self._cache._open_chunk(self._segment, position, end, reader, session)

    def expect(self, reader: ReaderId, begin: int, end: int) -> None:
        """Register that `reader` will read bytes [begin, end) next (predictive eviction)."""
        self._cache._expect(self._segment, reader, begin, end)

    def read_ahead(self, reader: ReaderId, *, after: str) -> bool:
        """Start streaming this segment for `reader`, which is finishing segment `after` and
        reads on into this one: its first chunk comes at once, the rest as the reader
        arrives (see `ChunkCache`'s read-ahead). False when read-ahead is off, the first chunk
        is already cached (or coming for another reader), or a stream runs. A first chunk
        already there is held for `reader` instead, until it reads in this segment: another
        reader moving past it would otherwise let eager eviction drop it, and this reader
        fetch it again (with the request's first-byte wait) when it gets there."""
        cache, seg = self._cache, self._segment
        with cache._cond:
            if not seg.starts:
                return False
            if seg.chunk_ids[0] in cache._entries:
                cache._readers.add_hold(reader, seg.chunk_ids[0])
                return False
            return cache._start_stream(seg, 0, reader, None, after=after)


class ChunkCache:
    """Chunk files of remote segments under `directory`, within the limits of `settings`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        settings: CacheSettings,
        fetch: Fetcher,
        *,
        strategy: str | None = None,
        clock: Callable[[], float] = time.time,
        prefetch_executor: Executor | None = None,
        disk_capacity: int | None = None,
        write: disk.Writer = os.write,
        download_attempts: int = 3,
        reserve_timeout_s: float = 30.0,
        reader_idle_s: float = 300.0,
        stream: Streamer | None = None,
    ) -> None:
        """`strategy` overrides `settings.eviction_strategy`; `disk_capacity` (bytes) overrides
        the cache disk's size for `cloud_storage_cache_size_percent`; `write` is the `os.write`
        used for chunk files (tests inject a full disk); a bad download is retried up to
        `download_attempts` times in all; a read waits at most `reserve_timeout_s` for room;
        readers idle for `reader_idle_s` lose their holds at the next check; `stream` opens
        one streamed request over a byte range, for read-ahead (see the module docstring)."""
        if download_attempts < 1:
            raise ValueError(f"download_attempts must be at least 1, got {download_attempts}")
        self.root = Path(directory)
        disk.ensure_writable(self.root)
        #: the latest chunk-write failure that was not a full disk (None after a success):
        #: the daemon's /health reports it as degraded
        #: the last disk write's outcome, for /health (only disk writes change it)
        self.disk_health = DiskHealth()
        self.settings = settings
        self._fetch = fetch
        self._clock = clock
        self._write = write
        self._download_attempts = download_attempts
        self._reserve_timeout_s = reserve_timeout_s
        self._reader_idle_s = reader_idle_s
        self.strategy = make_strategy(
            strategy if strategy is not None else settings.eviction_strategy,
            hydrated_ratio=settings.hydrated_chunks_per_segment_ratio,
            min_chunks=settings.min_chunks_per_segment_threshold,
        )
        if disk_capacity is None:
            disk_capacity = shutil.disk_usage(self.root).total
        self.limits = settings.limits(disk_capacity)
        self._own_executor: ThreadPoolExecutor | None = None
        if prefetch_executor is None and settings.chunk_prefetch > 0:
            self._own_executor = ThreadPoolExecutor(2, thread_name_prefix="cache-prefetch")
        self._executor: Executor | None = prefetch_executor or self._own_executor
        self._streamer = stream if settings.chunk_prefetch > 0 else None
        #: streams one missed chunk for a read that takes its verified start (`open_chunk`)
        self._chunk_streamer = stream
        #: memory streamed chunks are received into and served from until written behind
        #: (`cache.buffers`); None: straight into their files
        self._buffers = (ChunkBuffers(settings.memory_bytes, settings.chunk_size)
                         if stream is not None and settings.memory_bytes > 0 else None)
        #: the entries whose chunk is only in memory
        self._in_memory: dict[ChunkId, CacheEntry] = {}
        #: those queued for the write-behind thread (`_write_queued`), and whether it runs
        self._to_write: dict[ChunkId, CacheEntry] = {}
        self._writing = False
        #: whether the thread watching for idle chunks in memory runs (`_watch_memory`)
        self._watching = False
        #: segment key -> a request from its byte 0 sent before the segment was opened, and
        #: when (`request_early`); the read-ahead starting at its chunk 0 takes it
        self._early: dict[str, tuple[Future[ByteStream], float]] = {}
        #: (reader, segment key) -> the read-ahead stream serving it
        self._streams: dict[tuple[ReaderId, str], _Stream] = {}
        #: threads that use the store (read-ahead streams, streamed chunk downloads, early
        #: requests, `run_in_background` work): `close` waits for them
        self._threads: set[threading.Thread] = set()
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._entries: dict[ChunkId, CacheEntry] = {}
        #: the entries holding a mapping of their file, least recently read first
        self._mapped: OrderedDict[ChunkId, CacheEntry] = OrderedDict()
        self._by_segment: dict[str, set[ChunkId]] = {}
        self._segments: dict[str, SegmentInfo] = {}
        self._readers = ReaderTable()
        self._used_bytes = 0
        self._counters = dict.fromkeys(
            ("hits", "misses", "joined", "bytes_downloaded", "evictions", "prefetches",
             "download_errors", "corrupt_discarded", "overshoots", "written_behind",
             "unwritten_evictions"), 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for found in disk.load_entries(self.root):
            self._add_entry(CacheEntry(found.chunk, found.size, found.atime, found.crcs))
        with self._cond:
            self._trim(0, 0)

    # ----------------------------------------------------------------------- public API
    def open_segment(
        self,
        key: str,
        size: int,
        chunk_starts: Sequence[int],
        verify: Verifier | None = None,
    ) -> SegmentHandle:
        """A handle to read segment object `key` of `size` bytes cut at `chunk_starts` (from
        `cache.chunks.plan_chunks`; ignored when chunk reads are disabled). `verify` checks a
        chunk's bytes (record CRCs) before they are stored or served."""
        disk.check_key(key)
        if size < 0:
            raise CacheError(f"segment {key}: size must not be negative, got {size}")
        whole = self.settings.disable_chunk_reads
        starts = tuple(chunk_starts)
        if whole or size == 0:
            starts = (0,) if size > 0 else ()
        elif not starts or starts[0] != 0 or starts[-1] >= size or any(
            b <= a for a, b in zip(starts, starts[1:], strict=False)
        ):
            raise CacheError(
                f"segment {key}: chunk starts must begin at 0, increase and stay below the "
                f"segment size {size}"
            )
        segment = SegmentInfo(key, size, starts, verify, whole)
        with self._cond:
            self._segments[key] = segment
        return SegmentHandle(self, segment)

    def close_reader(self, reader: ReaderId) -> None:
        """Forget a reader (its consumer went away): its holds end at once."""
        with self._cond:
            for (owner, _segment), stream in self._streams.items():
                if owner == reader:
                    stream.cancelled = True
                    stream.wake.notify()
            self._release_holds(self._readers.close(reader))
            self._cond.notify_all()

    @property
    def write_problem(self) -> str | None:
        """The cache disk's last write problem (`DiskHealth`), None when writes go through."""
        return self.disk_health.problem

    def stats(self) -> dict[str, int]:
        """Counters and gauges for metrics: hits, misses (downloads a read started), joined
        (reads that waited on another's download), bytes_downloaded, evictions, prefetches,
        download_errors, corrupt_discarded, overshoots, written_behind (chunks written from
        memory to their files), unwritten_evictions (chunks evicted from memory before they
        were: disk writes saved); hydrated_chunks, memory_chunks (those only in memory),
        memory_bytes (the buffers' memory held), size_bytes, readers, max_bytes,
        max_objects."""
        with self._cond:
            out = dict(self._counters)
            out["hydrated_chunks"] = sum(1 for e in self._entries.values() if e.download is None)
            out["memory_chunks"] = len(self._in_memory)
            out["memory_bytes"] = 0 if self._buffers is None else self._buffers.held_bytes
            out["size_bytes"] = self._used_bytes
            out["objects"] = len(self._entries)
            out["readers"] = len(self._readers)
            out["max_bytes"] = self.limits.max_bytes
            out["max_objects"] = self.limits.max_objects
            return out

    def request_early(self, key: str, size: int) -> None:
        """Send the streamed request for segment object `key` (`size` bytes) from byte 0 now,
        before the segment is opened: a consumer's first read of a segment waits for its index
        (one request) and then for its bytes (a second one); sent together, it waits for one
        round trip instead of two. The read-ahead that then starts at the segment's chunk 0
        takes the request; one nobody took within `_EARLY_TTL_S` is closed. Nothing is sent
        without read-ahead, or when chunk 0 is cached or a stream of the segment runs."""
        if self._streamer is None or self.settings.disable_chunk_reads or size <= 0:
            return
        with self._cond:
            if (self._stop.is_set() or key in self._early or ChunkId(key, 0) in self._entries
                    or any(segment == key for _reader, segment in self._streams)):
                return
            request: Future[ByteStream] = Future()
            self._early[key] = (request, time.monotonic())
        streamer = self._streamer

        def send() -> None:
            try:
                request.set_result(streamer(key, 0, size, to_end=True))
            except BaseException as err:  # the read-ahead sends its own request then
                request.set_exception(err)

        if not self.run_in_background(send, "cache-early-request"):
            request.cancel()  # closed meanwhile: nobody takes it

    def _take_early(self, key: str) -> ByteStream | None:
        """The request `request_early` sent for `key`, once it has an answer; None when there
        is none or it failed."""
        with self._cond:
            early = self._early.pop(key, None)
        if early is None:
            return None
        try:
            return early[0].result()
        except Exception as err:
            log.debug("early request for %s failed (%s); sending it again", key, err)
            return None

    def _drop_early(self, older_than_s: float) -> None:
        """Close the early requests nobody took within `older_than_s` seconds."""
        now = time.monotonic()
        with self._cond:
            stale = [k for k, (_r, sent) in self._early.items() if now - sent >= older_than_s]
            requests = [self._early.pop(k)[0] for k in stale]
        for request in requests:
            request.add_done_callback(_close_body)

    def maintain(self) -> None:
        """The periodic check: drop idle readers' holds, trim down to the thresholds, persist
        the access-time index, close early requests nobody took. Runs every
        `check_interval_ms` after `start()`."""
        self._drop_early(_EARLY_TTL_S)
        with self._cond:
            self._release_holds(self._readers.expire(self._clock() - self._reader_idle_s))
            self._trim(0, 0)
            self._write_unheld()  # chunks let go of without a release (an idle reader's)
            entries = [
                disk.DiskEntry(e.chunk, e.size, e.last_access, e.crcs)
                for e in self._entries.values()
                if e.download is None and not e.in_memory
            ]
        if self._buffers is not None:
            self._buffers.trim(_IDLE_BUFFER_S)
        try:
            disk.save_index(self.root, entries, write=self._write)
        except CacheError as err:  # the index is an optimisation; files remain the truth
            log.warning("cache index not saved: %s", err)

    def run_in_background(self, work: Callable[[], object], name: str) -> bool:
        """Run `work` on a daemon thread of its own that `close` waits for: work that uses the
        store must not outlive the cache (the store is closed next, and a request still in
        flight would go uncounted). False, and nothing runs, once the cache is closing."""

        def run() -> None:
            try:
                work()
            finally:
                with self._cond:
                    self._threads.discard(threading.current_thread())

        with self._cond:
            if self._stop.is_set():
                return False
            thread = threading.Thread(target=run, name=name, daemon=True)
            self._threads.add(thread)
            thread.start()  # under the lock: `close` never sees a thread it cannot join
        return True

    def start(self) -> None:
        """Run `maintain()` every `cloud_storage_cache_check_interval_ms` on a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="cache-check", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the check thread, read-ahead streams, the other background work and the
        private prefetch pool, and save the index."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
            for stream in self._streams.values():
                stream.wake.notify()
            threads = list(self._threads)
        deadline = time.monotonic() + 10  # one in a slow read may not finish: it is a daemon
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._own_executor is not None:
            self._own_executor.shutdown(wait=True, cancel_futures=True)
            self._own_executor = None
            self._executor = None
        self._drop_early(0.0)
        with self._cond:  # what is cached stays cached across a restart: written now
            in_memory = list(self._in_memory.values())
        for entry in in_memory:
            self._write_behind(entry)
        with self._cond:
            for entry in list(self._mapped.values()):
                self._unmap(entry)
        self.maintain()
        if self._buffers is not None:
            self._buffers.close()

    def __enter__(self) -> ChunkCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---------------------------------------------------------------------- reading
    def _read(self, seg: SegmentInfo, begin: int, end: int, reader: ReaderId | None,
              session: bool) -> bytes:
        self._check_range(seg, begin, end)

        def piece(index: int, pinned: list[CacheEntry]) -> bytes:
            chunk_begin, chunk_end = seg.bounds(index)
            lo, hi = max(begin, chunk_begin) - chunk_begin, min(end, chunk_end) - chunk_begin
            return self._with_chunk(seg, index, pinned, reader, session, lambda entry, data, _: (
                self._load(seg, index, entry, lo, hi) if data is None else bytes(data[lo:hi])))

        return b"".join(self._visit(seg, chunks_for_range(seg.starts, begin, end), end,
                                    reader, session, piece))

    def _open_chunk(self, seg: SegmentInfo, position: int, end: int,
                    reader: ReaderId | None, session: bool) -> ChunkFile:
        self._check_range(seg, position, end)
        indices = chunks_for_range(seg.starts, position, max(end, position + 1))
        index = indices[0]
        begin, chunk_end = seg.bounds(index)

        def opened(index: int, pinned: list[CacheEntry]) -> ChunkFile:
            def use(entry: CacheEntry, _data: object, partial: ChunkFile | None) -> ChunkFile:
                if partial is not None:
                    return partial
                return ChunkFile(self._open_mapped(seg, index, entry), begin, chunk_end)

            return self._with_chunk(seg, index, pinned, reader, session, use,
                                    partial_at=position - begin)

        return self._visit(seg, range(index, index + 1), min(end, chunk_end), reader,
                           session, opened)[0]

    def _check_range(self, seg: SegmentInfo, begin: int, end: int) -> None:
        if not 0 <= begin <= end <= seg.size:
            raise CacheError(
                f"segment {seg.key}: byte range [{begin}, {end}) is outside its {seg.size} bytes"
            )

    def _visit(self, seg: SegmentInfo, indices: range, end: int, reader: ReaderId | None,
               session: bool, get: Callable[[int, list[CacheEntry]], T]) -> list[T]:
        """`get(index, pinned)` for each chunk of a read of `seg` ending at byte `end`, then
        the reader's position, holds and read-ahead updated (see `_after_read`; `session`: the
        reader is a consumer session, the only kind read-ahead serves)."""
        parts: list[T] = []
        ahead: list[int] = []
        # the last chunk read stays pinned until the reader's holds are registered, in the
        # same critical section: unpinned in between, another session's release could evict
        # the chunk this reader goes on in, and its next read would download it again. The
        # chunks before it are unpinned at once, so a read needs room for one chunk at a time
        pinned: list[CacheEntry] = []
        try:
            for index in indices:
                parts.append(get(index, pinned))
                if index != indices[-1]:
                    self._unpin(pinned.pop())
        finally:
            with self._cond:
                self._segments.setdefault(seg.key, seg)
                try:
                    if reader is not None and indices and len(parts) == len(indices):
                        ahead = self._after_read(seg, indices, end, reader, session)
                finally:  # a pin left behind would keep the chunk from ever being evicted
                    for entry in pinned:
                        self._unpin(entry)
                if indices:
                    self._apply_release(seg.key)
        executor = self._executor
        for index in ahead:  # submitted outside the lock: an inline executor fetches right here
            if executor is None:
                break
            try:
                executor.submit(self._prefetch, seg, index)
            except RuntimeError:  # the pool is shutting down with the cache
                break
        return parts

    def _after_read(
        self, seg: SegmentInfo, indices: range, end: int, reader: ReaderId, session: bool = True
    ) -> list[int]:
        """Update the reader's position and holds; the chunk indices to prefetch for it."""
        last = indices[-1]
        inside_last = end < seg.bounds(last)[1]
        outcome = self._readers.after_read(
            reader, seg.chunk_ids, indices[0], last, inside_last=inside_last,
            prefetch=self.settings.chunk_prefetch, now=self._clock(),
        )
        self._release_holds(outcome.released)
        ahead = [seg.starts.index(c.start) for c in outcome.prefetch if c not in self._entries]
        if last >= len(seg.starts) - 1:
            # the next segment's stream waits for its reader to read in this last chunk (see
            # `_next_streamed`); woken on every read it would take the lock and the
            # interpreter from the reader's own fetches for nothing
            self._wake_next(reader, seg.key)
        running = self._streams.get((reader, seg.key))
        if running is not None and running.next_index > last:
            for (owner, _segment), other in self._streams.items():
                if owner == reader and other.after != seg.key:
                    other.wake.notify()  # it waits for its reader to move on
            return []
        if not session:  # a one-off read (no consumer session) reads nothing ahead
            return []
        # no stream, or one the reader has overtaken (it ends at a chunk already cached): a
        # new one from the first chunk ahead that is missing
        if ahead and self._start_stream(seg, ahead[0], reader, None, replace=True):
            return []
        return ahead

    def _expect(self, seg: SegmentInfo, reader: ReaderId, begin: int, end: int) -> None:
        if not 0 <= begin <= end <= seg.size:
            raise CacheError(
                f"segment {seg.key}: byte range [{begin}, {end}) is outside its {seg.size} bytes"
            )
        ids = seg.chunk_ids
        with self._cond:
            self._segments.setdefault(seg.key, seg)
            chunks = [ids[i] for i in chunks_for_range(seg.starts, begin, end)]
            self._readers.expect(reader, chunks, self._clock())

    def _with_chunk(self, seg: SegmentInfo, index: int, pinned: list[CacheEntry],
                    reader: ReaderId | None, session: bool,
                    use: Callable[[CacheEntry, bytes | memoryview | None, ChunkFile | None], T],
                    *, partial_at: int | None = None) -> T:
        """`use(entry, downloaded bytes or None, partial)` on chunk `index`, cached or
        downloaded now (a stored chunk that fails its checks is dropped and fetched again).
        With `partial_at` (an offset in the chunk), a chunk a read-ahead stream is still
        writing may come as `partial`: its verified start, open, reaching past that offset
        (see `_wait_ready`). The chunk's entry stays pinned and goes into `pinned` for the
        caller to unpin once the reader's holds are in place."""
        chunk = seg.chunk_ids[index]
        if reader is not None and self._streams:
            self._await_stream(seg, index, reader)
        bad = 0
        for _ in range(_MISSING_ATTEMPTS):
            if bad >= _READ_ATTEMPTS:
                break
            entry, mine, download = self._pin(chunk, seg.bounds(index), prefetch=False)
            keep = False
            try:
                data: bytes | memoryview | None = None
                partial: ChunkFile | None = None
                if mine and session and reader is not None and (
                        self._start_stream(seg, index, reader, entry)):
                    assert download is not None  # noqa: S101 - a new entry downloads
                    # the stream's first chunk: this one
                    partial = self._wait_ready(seg, index, entry, download, partial_at)
                elif mine and partial_at is not None and self._stream_chunk(seg, index, entry):
                    assert download is not None  # noqa: S101 - a new entry downloads
                    partial = self._wait_ready(seg, index, entry, download, partial_at)
                elif mine:
                    data = self._download(seg, index, entry)
                elif download is not None:
                    # raises the downloader's error, if it failed
                    partial = self._wait_ready(seg, index, entry, download, partial_at)
                result = use(entry, data, partial)
                keep = True
                pinned.append(entry)
                return result
            except disk.MissingFile:
                # another process sharing the directory evicted it: fetch it again
                log.debug("cached chunk %s of %s is gone, fetching again", chunk.start,
                          chunk.segment)
                with self._cond:
                    if self._entries.get(chunk) is entry:
                        self._remove(entry)
            except disk.BadFile as problem:
                bad += 1
                log.warning("cached chunk %s of %s is bad, fetching again: %s",
                            chunk.start, chunk.segment, problem)
                with self._cond:
                    self._counters["corrupt_discarded"] += 1
                    if self._entries.get(chunk) is entry:
                        self._evict(entry, count=False)
            finally:
                if not keep:
                    self._unpin(entry)
        if bad < _READ_ATTEMPTS:
            raise CacheError(f"chunk at byte {seg.bounds(index)[0]} of {seg.key} kept being "
                             "removed (by other processes sharing the cache directory?)")
        raise CorruptSegmentError(
            f"chunk kept failing its checks after {_READ_ATTEMPTS} reads",
            path=seg.key, position=seg.bounds(index)[0],
        )

    def _wait_ready(self, seg: SegmentInfo, index: int, entry: CacheEntry,
                    download: Future[None], partial_at: int | None) -> ChunkFile | None:
        """Wait for `entry`'s download (raising its error). With `partial_at`, stop waiting as
        soon as the read-ahead stream writing the chunk has verified bytes past that offset:
        then a duplicate descriptor of its temporary file, covering just those bytes (the
        rest of the chunk is asked for again when the reader gets there). A consumer that
        catches up with its stream so waits for the batches it reads, not for a whole chunk."""
        if partial_at is not None:
            with self._cond:
                while entry.download is download and entry.progress is not None:
                    staged = entry.staged
                    if staged is not None and entry.ready > partial_at:
                        begin = seg.bounds(index)[0]
                        # the stream clears `staged` under this lock before it lets go
                        return ChunkFile(staged.shared.share(), begin, begin + entry.ready)
                    entry.progress.wait()  # woken by this chunk's progress only
        download.result()
        return None

    def _open_verified(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> int:
        """An open descriptor of the stored chunk, verified: when it was downloaded, or (a file
        found after a restart) now, whole. BadFile when it is missing or of the wrong size."""
        begin, end = seg.bounds(index)
        if not entry.verified:  # once per process: a file found at start-up, read back whole
            if entry.crcs is None:
                self._load(seg, index, entry, 0, 0)
            else:
                disk.read_checked(disk.chunk_path(self.root, entry.chunk), end - begin,
                                  entry.crcs, 0, end - begin)
            entry.verified = True
        try:
            fd = os.open(disk.chunk_path(self.root, entry.chunk), os.O_RDONLY)
        except FileNotFoundError as err:
            raise disk.MissingFile("file is missing") from err
        except OSError as err:
            raise CacheError(f"cannot open cached chunk of {seg.key}: {err}") from err
        size = os.fstat(fd).st_size
        if size != end - begin:
            os.close(fd)
            raise disk.BadFile(f"{size} bytes on disk, the chunk has {end - begin}")
        return fd

    def _open_mapped(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> MappedFile:
        """A share of the stored chunk's mapping: the one kept for it, or (verified and opened
        by `_open_verified`) a new one, then kept for the next fetch."""
        with self._cond:
            if entry.mapped is not None:
                if not entry.in_memory:
                    self._mapped.move_to_end(entry.chunk)
                return entry.mapped.share()
        fd = self._open_verified(seg, index, entry)
        begin, end = seg.bounds(index)
        try:
            mapped = MappedFile(fd, end - begin)
        except (OSError, ValueError) as err:
            raise CacheError(f"cannot map cached chunk at byte {begin} of {seg.key}: {err}"
                             ) from err
        with self._cond:
            self._keep_mapped(entry, mapped.share())
        return mapped

    def _keep_mapped(self, entry: CacheEntry, mapped: MappedFile) -> None:
        """Give `entry` (under the lock) the share `mapped`, unless it has one already or has
        left the cache; the least recently read beyond `_MAPPED_FILES` give theirs up."""
        if entry.mapped is not None or self._entries.get(entry.chunk) is not entry:
            mapped.release()
            return
        entry.mapped = mapped
        self._mapped[entry.chunk] = entry
        while len(self._mapped) > _MAPPED_FILES:
            _chunk, oldest = self._mapped.popitem(last=False)
            self._unmap(oldest)

    def _keep_in_memory(self, entry: CacheEntry, buffer: MappedFile) -> None:
        """Give `entry` (under the lock) the share `buffer` of the buffer its chunk arrived in,
        to serve it from until it is written behind, if at all; none if it has left the
        cache."""
        if entry.mapped is not None or self._entries.get(entry.chunk) is not entry:
            buffer.release()
            return
        entry.mapped, entry.in_memory = buffer, True
        self._in_memory[entry.chunk] = entry
        if not self._watching:
            self._watching = self.run_in_background(self._watch_memory, "cache-memory")

    def _unmap(self, entry: CacheEntry) -> None:
        """The entry gives up its share of its file's mapping (under the lock); fetches still
        sending from it keep theirs."""
        mapped, entry.mapped = entry.mapped, None
        self._mapped.pop(entry.chunk, None)
        if mapped is not None:
            mapped.release()

    def _prefetch(self, seg: SegmentInfo, index: int) -> None:
        chunk = seg.chunk_ids[index]
        try:
            with self._cond:
                if chunk in self._entries or not self._readers.held(chunk):
                    return  # cached meanwhile, or its reader moved on
            entry, mine, _ = self._pin(chunk, seg.bounds(index), prefetch=True)
        except CacheFullError:
            return  # no room: a prefetch never waits nor overshoots
        try:
            if mine:
                self._download(seg, index, entry)
        except TieredError as err:
            log.warning("prefetch of chunk %s of %s failed: %s", chunk.start, chunk.segment, err)
        finally:
            self._unpin(entry)
            with self._cond:
                self._apply_release(seg.key)

    # ------------------------------------------------------------------ read-ahead
    def _start_stream(self, seg: SegmentInfo, index: int, reader: ReaderId,
                      first: CacheEntry | None, *, after: str | None = None,
                      replace: bool = False) -> bool:
        """Start a read-ahead stream of `seg` from chunk `index` for `reader` (`first`: that
        chunk's entry, already pinned and reserved by the caller); False when there is no
        streamer, the cache is closing, the reader has one on this segment (unless `replace`:
        the old one then ends at its next chunk) or too many run."""
        if self._streamer is None or seg.whole:
            return False
        with self._cond:
            key = (reader, seg.key)
            old = self._streams.get(key)
            if self._stop.is_set() or (old is not None and not replace) or (
                    old is None and len(self._streams) >= _MAX_STREAMS):
                return False
            if old is not None:
                old.cancelled = True
                old.wake.notify()
            stream = _Stream(index, threading.Condition(self._lock), after=after)
            self._streams[key] = stream
            return self.run_in_background(
                lambda: self._stream_chunks(seg, index, reader, first, stream),
                "cache-readahead")

    def _stream_chunks(self, seg: SegmentInfo, first_index: int, reader: ReaderId,
                       first: CacheEntry | None, stream: _Stream) -> None:
        """The read-ahead thread: one request from chunk `first_index` to the segment's end,
        each chunk verified and stored as its bytes arrive (see the module docstring)."""
        assert self._streamer is not None  # noqa: S101 - _start_stream checks
        body = None
        try:
            for index in range(first_index, len(seg.starts)):
                entry = first if index == first_index and first is not None else (
                    self._next_streamed(seg, index, reader, stream))
                if entry is None:
                    return
                if index == first_index:  # the request goes out once its first chunk is due
                    try:
                        body = self._take_early(seg.key) if index == 0 else None
                        if body is None:
                            body = self._streamer(seg.key, seg.bounds(first_index)[0],
                                                  seg.size, to_end=True)
                    except Exception as err:  # the chunk-by-chunk path reports store errors
                        log.debug("read-ahead of %s could not start: %s", seg.key, err)
                begin, end = seg.bounds(index)
                with self._cond:  # on it: a reader joining this chunk has not overtaken us
                    stream.next_index = index + 1
                    self._cond.notify_all()  # a reader waiting for it (_await_stream) joins now
                try:
                    if body is None:
                        self._download(seg, index, entry)
                    elif not self._store_streamed(seg, index, entry, body):
                        body.close()
                        body = None
                except TieredError as err:  # the entry's readers got the error
                    log.warning("read-ahead of chunk %s of %s failed: %s", begin, seg.key, err)
                    return
                finally:
                    if entry is not first:
                        self._unpin(entry)
                        with self._cond:
                            self._apply_release(seg.key)
                if body is None:
                    return
        except Exception:  # never let a read-ahead thread die with a traceback
            log.exception("read-ahead of %s failed", seg.key)
        finally:
            if body is not None:
                body.close()
            with self._cond:
                if self._streams.get((reader, seg.key)) is stream:
                    del self._streams[(reader, seg.key)]
                    self._wake_next(reader, seg.key)
                self._cond.notify_all()

    def _stream_chunk(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> bool:
        """Download chunk `index` for `entry` (pinned and reserved by the caller, who keeps
        the pin) on a thread of its own, staged and verified as its bytes arrive, so a read
        that needs its start is served once those batches are in, not after the whole chunk
        (a cold read of 1 MiB in a 16 MiB chunk waits for a fraction of the chunk's GET).
        False when there is no streaming store or the cache is closing."""
        if self._chunk_streamer is None or seg.whole:
            return False
        return self.run_in_background(lambda: self._store_chunk_stream(seg, index, entry),
                                      "cache-chunk")

    def _store_chunk_stream(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> None:
        assert self._chunk_streamer is not None  # noqa: S101 - _stream_chunk checks
        begin, end = seg.bounds(index)
        body = None
        try:
            try:
                body = self._chunk_streamer(seg.key, begin, end)
            except Exception as err:  # the ranged GET below reports store errors
                log.debug("streamed read of chunk %d of %s could not start: %s", begin,
                          seg.key, err)
            if body is None:
                self._download(seg, index, entry)
            else:
                self._store_streamed(seg, index, entry, body)
        except TieredError as err:  # the entry's readers got the error
            log.warning("download of chunk %d of %s failed: %s", begin, seg.key, err)
        except Exception:  # never let the thread die with a traceback
            log.exception("download of chunk %d of %s failed", begin, seg.key)
        finally:
            if body is not None:
                body.close()
            with self._cond:
                self._apply_release(seg.key)
                self._cond.notify_all()

    def _wake_next(self, reader: ReaderId, key: str) -> None:
        """Wake `reader`'s stream of the segment after `key`, which waits for this one."""
        for (owner, _segment), other in self._streams.items():
            if owner == reader and other.after == key:
                other.wake.notify()

    def _store_streamed(self, seg: SegmentInfo, index: int, entry: CacheEntry,
                        body: ByteStream) -> bool:
        """Store chunk `index` for `entry` (pinned, reserved, downloading) from the stream, or
        by a ranged GET when the stream breaks or brings a chunk that fails verification.
        Whether the stream can go on (it is at the next chunk). A disk error fails the
        entry's readers, as a download's does."""
        try:
            staged, usable = self._stage(seg, index, entry, body)
        except BaseException as err:
            if isinstance(err, CacheError) and not isinstance(err, CacheFullError):
                self.disk_health.failed(err)
            self._fail(entry, err)
            raise
        self._download(seg, index, entry, staged)
        return usable

    def _stage(self, seg: SegmentInfo, index: int, entry: CacheEntry, body: ByteStream
               ) -> tuple[StagedChunk | BufferedChunk | None, bool]:
        """Chunk `index` from the stream, received into a buffer of the pool (or, when it has
        none to lend, written to its temporary file) and, unless it is the whole segment (the
        object's CRC-32C needs every byte), verified batch by batch as it arrives, each
        verified run offered to readers at once (`entry.staged`, `entry.ready`). (None, True)
        when it failed verification (logged; the stream is at the next chunk), (None, False)
        when the stream broke (logged); either way a ranged GET fetches it."""
        begin, end = seg.bounds(index)
        path = disk.chunk_path(self.root, entry.chunk)
        buffer = None if self._buffers is None else self._buffers.take(end - begin)
        if buffer is None and self._buffers is not None and end - begin <= self._buffers.capacity:
            with self._cond:  # this chunk goes to its file; the next ones may get a buffer
                self._spill_idle()
        staged: StagedChunk | BufferedChunk = (
            StagedChunk(path, end - begin, write=self._write) if buffer is None
            else BufferedChunk(path, end - begin, buffer))
        check = None
        if (begin, end) != (0, seg.size):
            verify = seg.verify

            def check(run: memoryview, offset: int) -> None:
                if verify is not None:
                    verify(run, begin + offset)
                with self._cond:
                    entry.ready = offset + len(run)
                    if entry.progress is not None:  # only the readers of this chunk
                        entry.progress.notify_all()

            with self._cond:
                entry.staged = staged
        try:
            try:
                staged.fill(body, check)
            finally:
                with self._cond:  # before the file is closed: readers duplicate it
                    entry.staged = None
        except CorruptSegmentError as err:
            self._count_bytes(staged.size)
            staged.discard()
            log.warning("streamed chunk %d of %s failed verification (%s); fetching it again",
                        begin, seg.key, err.reason)
            return None, True
        except CacheError:
            staged.discard()
            raise
        except Exception as err:
            staged.discard()
            log.warning("read-ahead of %s broke at byte %d (%s); reading chunk by chunk",
                        seg.key, begin, err)
            return None, False
        self._count_bytes(staged.size)
        return staged, True

    def _await_stream(self, seg: SegmentInfo, index: int, reader: ReaderId) -> None:
        """A reader about to miss chunk `index` that its own stream is on the way to waits for
        the stream instead of sending a ranged GET for bytes already coming."""
        deadline = time.monotonic() + _STREAM_IDLE_S
        chunk = seg.chunk_ids[index]
        with self._cond:
            while chunk not in self._entries and time.monotonic() < deadline:
                stream = self._streams.get((reader, seg.key))
                at = self._readers.position(reader)
                if (stream is None or stream.cancelled or not stream.next_index <= index
                        or at is None or not at[2]
                        or index > at[1] + self.settings.chunk_prefetch):
                    return
                if stream.after is not None and not stream.due:
                    stream.due = True  # it waits for the segment before: the reader is here
                    stream.wake.notify()
                self._cond.wait(deadline - time.monotonic())

    def _next_streamed(self, seg: SegmentInfo, index: int, reader: ReaderId,
                       stream: _Stream) -> CacheEntry | None:
        """Wait until `reader` reads sequentially within `chunk_prefetch` chunks of chunk
        `index`, then pin and reserve it for the stream; None when the stream should end."""
        chunk = seg.chunk_ids[index]
        deadline = time.monotonic() + _STREAM_IDLE_S
        with self._cond:
            while True:
                stream.next_index = index
                if self._stop.is_set() or stream.cancelled:
                    return None
                at = self._readers.position(reader)
                if at is not None and at[0] == stream.after and at[0] != seg.key:
                    # the reader finishes the segment before: its next chunk once the
                    # reader reads in that segment's last chunk (it needs the chunks before
                    # first, and this request's store work would slow their reads), or at
                    # once when the reader is already waiting for it. Its reads wake us
                    # (`_after_read`)
                    before_seg = self._segments.get(stream.after)
                    last = len(before_seg.starts) - 1 if before_seg is not None else 0
                    if index == 0 and (stream.due or at[1] >= last):
                        self._readers.add_hold(reader, chunk)
                        break
                elif at is not None and at[0] != seg.key:
                    return None  # the reader moved to another segment
                elif at is not None and at[2] and index <= at[1] + self.settings.chunk_prefetch:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                stream.wake.wait(remaining)
            if chunk in self._entries:
                return None  # cached by another reader: a later stream starts past it
            try:
                entry, mine, _ = self._pin(chunk, seg.bounds(index), prefetch=True)
            except CacheFullError:
                return None
        if not mine:
            self._unpin(entry)
            return None
        return entry

    def _load(self, seg: SegmentInfo, index: int, entry: CacheEntry, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of a stored chunk, checked against its block checksums; a file found
        after a restart without remembered checksums is verified whole first. A chunk still
        only in memory is read from there (it was checked as it arrived)."""
        with self._cond:
            buffer = entry.mapped.share() if entry.in_memory and entry.mapped else None
        if buffer is not None:  # checked as it arrived, and never written since
            try:
                return buffer.mapping[lo:hi]
            finally:
                buffer.release()
        begin, end = seg.bounds(index)
        path = disk.chunk_path(self.root, entry.chunk)
        crcs = entry.crcs
        if crcs is None:
            try:
                data = path.read_bytes()
            except FileNotFoundError as err:
                raise disk.MissingFile("file is missing") from err
            except OSError as err:
                raise CacheError(f"cannot read cached chunk of {seg.key}: {err}") from err
            if len(data) != end - begin:
                raise disk.BadFile(f"{len(data)} bytes on disk, the chunk has {end - begin}")
            if seg.verify is not None:
                try:
                    seg.verify(data, begin)
                except CorruptSegmentError as err:
                    raise disk.BadFile(err.reason) from err
            entry.crcs = disk.block_crcs(data)
            return data[lo:hi]
        return disk.read_checked(path, end - begin, crcs, lo, hi)

    def _download(self, seg: SegmentInfo, index: int, entry: CacheEntry,
                  staged: StagedChunk | BufferedChunk | None = None) -> bytes | None:
        """Fetch, verify and store chunk `index` for `entry` (pinned, reserved, registered as
        downloading); on failure the reservation is dropped and waiting readers get the error.
        Returns the bytes fetched. `staged`: the chunk already written by a read-ahead stream,
        checked like a download and moved into place (None returned), or dropped and fetched
        again by a ranged GET if it fails."""
        begin, end = seg.bounds(index)
        data: bytes | None = None
        mapped: MappedFile | None = None
        try:
            committed = None if staged is None else self._commit_staged(seg, staged, begin)
            if committed is not None:
                crcs, mapped = committed
            else:
                data = fetch_verified(
                    self._fetch, seg.key, begin, end, seg.verify,
                    attempts=self._download_attempts, on_bytes=self._count_bytes,
                )
                try:
                    disk.write_atomically(disk.chunk_path(self.root, entry.chunk), data,
                                          write=self._write)
                except CacheFullError:
                    raise
                except CacheError as err:
                    self.disk_health.failed(err)
                    raise
                crcs = disk.block_crcs(data)
                self.disk_health.succeeded()
            if isinstance(staged, StagedChunk):  # written to its file, not kept in memory
                self.disk_health.succeeded()
        except BaseException as err:
            if staged is not None:
                staged.discard()
            self._fail(entry, err)
            raise
        with self._cond:
            entry.crcs = crcs
            entry.verified = True
            entry.last_access = self._clock()
            if mapped is not None and staged is not None and staged.in_memory:
                self._keep_in_memory(entry, mapped)
            elif mapped is not None:
                self._keep_mapped(entry, mapped)
            assert entry.download is not None
            entry.download.set_result(None)
            self._done(entry)
        return data

    def _fail(self, entry: CacheEntry, err: BaseException) -> None:
        """Give up on downloading `entry`: its readers get `err`, its reservation goes."""
        with self._cond:
            self._counters["download_errors"] += 1
            if self._entries.get(entry.chunk) is entry:
                self._remove(entry)
            assert entry.download is not None  # noqa: S101 - only while downloading
            entry.download.set_exception(err)
            self._done(entry)

    def _done(self, entry: CacheEntry) -> None:
        """The entry's download is over (its result or error set); under the lock."""
        entry.download = None
        if entry.progress is not None:
            entry.progress.notify_all()
            entry.progress = None
        self._cond.notify_all()

    def _commit_staged(self, seg: SegmentInfo, staged: StagedChunk | BufferedChunk,
                       begin: int) -> tuple[tuple[int, ...] | None, MappedFile] | None:
        """Move a streamed chunk into the cache: its block CRCs (None for one kept in memory:
        taken when it is written) and its mapping or buffer (a share for the entry). A chunk
        that is the whole segment is verified here, in place (its batches were not: the
        object's CRC-32C needs every byte); None (the chunk dropped) when it fails, so a
        ranged GET fetches it again."""
        if begin == 0 and staged.size == seg.size and seg.verify is not None:
            try:
                with staged.mapped() as view:
                    seg.verify(view, begin)
            except CorruptSegmentError as err:
                log.warning("streamed chunk %d of %s failed verification (%s); fetching it "
                            "again", begin, seg.key, err.reason)
                staged.discard()
                return None
        mapped = staged.commit()
        return staged.crcs, mapped

    # ------------------------------------------------------------- space and entries
    def _pin(
        self, chunk: ChunkId, bounds: tuple[int, int], *, prefetch: bool
    ) -> tuple[CacheEntry, bool, Future[None] | None]:
        """Pin the entry of `chunk`, creating (and reserving room for) it when absent. Returns
        the entry, whether the caller must download it, and the download in progress to wait
        for otherwise. A prefetch counts no hit or miss and never waits for room."""
        with self._cond:
            found = self._join(chunk, prefetch)
            if found is not None:
                return found, False, found.download
            self._reserve(bounds[1] - bounds[0], wait=not prefetch)
            # waiting for room released the lock: another reader may have started it meanwhile
            found = self._join(chunk, prefetch)
            if found is not None:
                return found, False, found.download
            entry = CacheEntry(chunk, bounds[1] - bounds[0], self._clock(), None)
            entry.download = Future()
            entry.progress = threading.Condition(self._lock)
            entry.pins = 1
            self._add_entry(entry)
            self._counters["prefetches" if prefetch else "misses"] += 1
            return entry, True, entry.download

    def _join(self, chunk: ChunkId, prefetch: bool) -> CacheEntry | None:
        """Pin the existing entry of `chunk`, counting a hit (or a join of a download)."""
        entry = self._entries.get(chunk)
        if entry is not None:
            entry.pins += 1
            entry.last_access = self._clock()
            if not prefetch:
                self._counters["joined" if entry.download is not None else "hits"] += 1
        return entry

    def _reserve(self, size: int, *, wait: bool) -> None:
        """Make room for `size` more bytes and one more object (the caller adds the entry under
        the same lock). Trims to the thresholds; when held chunks prevent that, goes over the
        hard limits only if not over them already (so by one chunk at most), else waits."""
        limits = self.limits
        deadline = time.monotonic() + self._reserve_timeout_s
        while True:
            self._trim(size, 1)
            used, objects = self._used_bytes + size, len(self._entries) + 1
            if used <= limits.max_bytes and objects <= limits.max_objects:
                return
            if wait and self._used_bytes <= limits.max_bytes and (
                len(self._entries) <= limits.max_objects
            ):
                self._counters["overshoots"] += 1
                return
            remaining = deadline - time.monotonic()
            if not wait or remaining <= 0:
                raise CacheFullError(
                    f"cache full: {self._used_bytes} of {limits.max_bytes} bytes and "
                    f"{len(self._entries)} of {limits.max_objects} objects, held by "
                    f"{len(self._readers)} readers; no room for {size} more bytes"
                )
            self._cond.wait(remaining)

    def _trim(self, incoming_bytes: int, incoming_objects: int) -> None:
        """Remove chunks in the strategy's victim order until the cache plus what is coming is
        within the trim thresholds: unheld chunks first, then, only if that is not enough,
        chunks readers are merely positioned in (a position hold must not deadlock readers
        that each wait for room). A chunk being read or downloaded is never removed."""
        limits = self.limits
        target_bytes = min(limits.trim_bytes, limits.max_bytes) - incoming_bytes
        target_objects = min(limits.trim_objects, limits.max_objects) - incoming_objects
        if self._used_bytes <= target_bytes and len(self._entries) <= target_objects:
            return
        views = self._with_needs([self._view(e) for e in self._entries.values()])
        order = self.strategy.victim_order(views)
        soft = [v._replace(held=False) for v in views
                if v.held and not self._is_pinned(self._entries[v.id])]
        order += self.strategy.victim_order(soft)
        victims = plan_trim(
            [(c, self._entries[c].size) for c in order],
            self._used_bytes, len(self._entries),
            target_bytes=target_bytes, target_objects=target_objects,
        )
        for chunk in victims:
            self._evict(self._entries[chunk])

    def _apply_release(self, segment: str) -> None:
        """Ask the strategy which chunks of `segment` to let go now."""
        ids = self._by_segment.get(segment)
        if not ids:
            return
        views = self._with_needs([self._view(self._entries[c]) for c in ids])
        seg = self._segments.get(segment)
        total = len(seg.starts) if seg is not None else len(views)
        for chunk in self.strategy.release(SegmentSnapshot(segment, total, tuple(views))):
            entry = self._entries.get(chunk)
            if entry is not None and not self._is_held(entry):
                self._evict(entry)
        self._write_unheld(segment)  # kept although let go of

    def _release_holds(self, chunks: Sequence[ChunkId]) -> None:
        for segment in dict.fromkeys(c.segment for c in chunks):
            self._apply_release(segment)
        if chunks:
            self._cond.notify_all()

    @staticmethod
    def _is_pinned(entry: CacheEntry) -> bool:
        return entry.pins > 0 or entry.download is not None

    def _is_held(self, entry: CacheEntry) -> bool:
        return self._is_pinned(entry) or self._readers.held(entry.chunk)

    def _view(self, entry: CacheEntry) -> ChunkView:
        return ChunkView(entry.chunk, entry.size, entry.last_access, self._is_held(entry))

    def _with_needs(self, views: list[ChunkView]) -> list[ChunkView]:
        if not self.strategy.uses_future:
            return views
        needs = self._readers.future_needs()
        out = []
        for v in views:
            count, nearest = needs.get(v.id, (0, None))
            out.append(v._replace(future_readers=count, next_need=nearest))
        return out

    def _add_entry(self, entry: CacheEntry) -> None:
        self._entries[entry.chunk] = entry
        self._by_segment.setdefault(entry.chunk.segment, set()).add(entry.chunk)
        self._used_bytes += entry.size

    def _remove(self, entry: CacheEntry) -> None:
        del self._entries[entry.chunk]
        self._unmap(entry)  # an in-memory chunk's buffer goes back once its fetches are sent
        self._left_memory(entry)
        ids = self._by_segment[entry.chunk.segment]
        ids.discard(entry.chunk)
        if not ids:  # forget the layout too; a handle's next read registers it again
            del self._by_segment[entry.chunk.segment]
            self._segments.pop(entry.chunk.segment, None)
        self._used_bytes -= entry.size

    def _evict(self, entry: CacheEntry, *, count: bool = True) -> None:
        in_memory = entry.in_memory
        self._remove(entry)
        if in_memory:  # never written: no file (one there is another process's)
            self._counters["unwritten_evictions"] += 1
        else:
            disk.remove_file(disk.chunk_path(self.root, entry.chunk))
        if count:
            self._counters["evictions"] += 1
        self._cond.notify_all()

    # ---------------------------------------------------------------- write-behind
    def _queue_write(self, entry: CacheEntry) -> None:
        """Have in-memory `entry` written to its file on the write-behind thread (under the
        lock). Once the cache is closing nothing starts: `close` writes what is left."""
        if entry.chunk in self._to_write:
            return
        self._to_write[entry.chunk] = entry
        if not self._writing:
            self._writing = self.run_in_background(self._write_queued, "cache-write-behind")

    def _write_unheld(self, segment: str | None = None) -> None:
        """Queue the chunks in memory (of `segment`, or all) that nobody holds for writing
        (under the lock): the cache keeps them once their readers are done."""
        for entry in list(self._in_memory.values()):
            if (segment is None or entry.chunk.segment == segment) and not self._is_held(entry):
                self._queue_write(entry)

    def _left_memory(self, entry: CacheEntry) -> None:
        """`entry` is no longer (or never was) a chunk only in memory (under the lock)."""
        entry.in_memory = False
        if self._in_memory.get(entry.chunk) is entry:
            del self._in_memory[entry.chunk]
        if self._to_write.get(entry.chunk) is entry:
            del self._to_write[entry.chunk]

    def _spill_idle(self) -> float:
        """Write behind the chunks in memory nobody has read for `_SPILL_IDLE_S`, held or not
        (under the lock): a consumer that stopped, or reads slowly, still holds its chunks,
        and their buffers are better spent on the streams of consumers reading now. The
        seconds until the next chunk would be idle that long."""
        now, wait = self._clock(), _SPILL_IDLE_S
        for entry in list(self._in_memory.values()):
            idle = now - entry.last_access
            if idle >= _SPILL_IDLE_S:
                self._queue_write(entry)
            else:
                wait = min(wait, _SPILL_IDLE_S - idle)
        return max(0.01, wait)

    def _watch_memory(self) -> None:
        """While chunks are in memory and more than half the buffers' budget is lent, spill
        the idle ones (`_spill_idle`), so the buffers are free before the streams need them
        (when they run out, `_stage` spills at once)."""
        buffers = self._buffers
        assert buffers is not None  # noqa: S101 - chunks are in memory only with buffers
        while True:
            with self._cond:
                if self._stop.is_set() or not self._in_memory:
                    self._watching = False
                    return
                pressed = buffers.lent_bytes * 2 > buffers.budget
                wait = self._spill_idle() if pressed else _SPILL_IDLE_S
            self._stop.wait(wait)

    def _write_queued(self) -> None:
        """The write-behind thread: write the queued chunks one at a time, oldest first."""
        while True:
            with self._cond:
                if self._stop.is_set() or not self._to_write:
                    self._writing = False
                    return
                entry = self._to_write.pop(next(iter(self._to_write)))
            try:
                self._write_behind(entry)
            except Exception:  # never let the thread die: the next chunks still need it
                log.exception("writing chunk %d of %s behind failed", entry.chunk.start,
                              entry.chunk.segment)

    def _write_behind(self, entry: CacheEntry) -> None:
        """Write in-memory `entry` to its file, then serve it from there and give its buffer
        back (fetches sending from the buffer keep their shares). A chunk evicted meanwhile
        leaves no file. One that cannot be written is dropped from the cache: a later read
        downloads it again."""
        with self._cond:
            if (self._entries.get(entry.chunk) is not entry or not entry.in_memory
                    or entry.mapped is None):
                return
            buffer = entry.mapped.share()
        path = disk.chunk_path(self.root, entry.chunk)
        tmp: Path | None = None
        try:
            with memoryview(buffer.mapping) as whole, whole[:entry.size] as view:
                crcs = disk.block_crcs(view)
                tmp = disk.write_beside(path, view, write=self._write)
            with self._cond:
                if self._entries.get(entry.chunk) is entry and entry.in_memory:
                    disk.move_into_place(tmp, path)
                    tmp = None
                    entry.crcs = crcs
                    self._unmap(entry)
                    self._left_memory(entry)
                    self._counters["written_behind"] += 1
            self.disk_health.succeeded()
        except Exception as err:  # a full disk, an I/O error, a bug: the bucket has it
            if not isinstance(err, CacheFullError):
                self.disk_health.failed(err)
            log.warning("chunk %d of %s not written to the cache disk, dropped: %s",
                        entry.chunk.start, entry.chunk.segment, err,
                        exc_info=not isinstance(err, CacheError))
            with self._cond:
                if self._entries.get(entry.chunk) is entry and entry.in_memory:
                    self._evict(entry, count=False)
        finally:
            if tmp is not None:
                disk.remove_file(tmp)
            buffer.release()

    def _count_bytes(self, n: int) -> None:
        with self._cond:
            self._counters["bytes_downloaded"] += n

    def _unpin(self, entry: CacheEntry) -> None:
        with self._cond:
            entry.pins -= 1
            self._cond.notify_all()

    def _loop(self) -> None:
        interval = self.settings.check_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                self.maintain()
            except Exception:  # keep checking; a bad pass must not end the thread
                log.exception("cache check failed")

