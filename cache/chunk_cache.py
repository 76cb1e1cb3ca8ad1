"""The chunked read cache: byte ranges of remote segments served from chunk files on local disk.

`ChunkCache` is the façade the readers use (`open_segment`, then `SegmentHandle.read` /
`open_chunk`); the work is done by pieces that share one `cache.state.CacheState` (the lock
and the entries), as Redpanda splits the disk-wide `cache_service` from per-segment hydration:

    cache.space         room: reserving a chunk's bytes, trimming in the eviction strategy's
                        order (`cache.eviction`), releasing after reads, the periodic check
    cache.hydration     one chunk: single-flight download, verification, opening it stored
    cache.streams       read-ahead: one streamed request per segment, early requests
    cache.write_behind  streamed chunks kept in memory, written to their files behind
    cache.chunk_reads   one read: its chunks one at a time, then the reader's holds,
                        read-ahead and prefetches

Threads: reads may come from any thread. Without a `stream` function prefetches run on
`prefetch_executor` (a private two-thread pool when none is given and
read-ahead is on, `cache.readahead`); read-ahead streams, the write-behind and the watch over
idle chunks in memory run on their own daemon threads, which `close()` waits for. `start()`
runs the periodic check (`cloud_storage_cache_check_interval_ms`) on a daemon thread that
`close()` stops.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from cache import disk
from cache.accounting import CacheSettings
from cache.buffers import ChunkBuffers
from cache.chunk_entries import CacheEntry, SegmentInfo
from cache.chunk_reads import ChunkReads
from cache.download import Fetcher, Streamer, Verifier
from cache.errors import CacheError
from cache.eviction import make_strategy
from cache.hydration import ChunkFile, Hydration
from cache.read_sessions import ReaderId
from cache.readahead import ReadAheadPolicy
from cache.space import Space
from cache.state import CacheState
from cache.streams import Streams
from cache.write_behind import WriteBehind

__all__ = ["ChunkCache", "ChunkFile", "Fetcher", "ReaderId", "SegmentHandle", "Verifier"]

log = logging.getLogger(__name__)

#: buffers of `cache.buffers` given back this long ago (seconds) are freed at the next check
_IDLE_BUFFER_S = 60.0


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
        return self._cache._reads.read(self._segment, begin, end, reader, session)

    def open_chunk(self, position: int, end: int, *, reader: ReaderId | None = None,
                   session: bool = True) -> ChunkFile:
        """The chunk holding byte `position`, verified and open for reading (downloaded first
        when not cached), for a read of bytes [position, end) that continues past it when
        `end` is beyond the chunk. While a read-ahead stream writes the chunk, what is
        verified of it so far, once that reaches past `position` (`ChunkFile.end` then says
        where it stops). The descriptor keeps the file readable even if the cache evicts it;
        the caller closes it. `reader` as in `read`."""
        return self._cache._reads.open_chunk(self._segment, position, end, reader, session)

    def expect(self, reader: ReaderId, begin: int, end: int) -> None:
        """Register that `reader` will read bytes [begin, end) next (predictive eviction)."""
        self._cache._reads.expect(self._segment, reader, begin, end)

    def read_ahead(self, reader: ReaderId, *, after: str) -> bool:
        """Start streaming this segment for `reader`, which is finishing segment `after` and
        reads on into this one: its first chunk comes at once, the rest as the reader
        arrives (see `ChunkCache`'s read-ahead). False when read-ahead is off, the first chunk
        is already cached (or coming for another reader), or a stream runs. A first chunk
        already there is held for `reader` instead, until it reads in this segment: another
        reader moving past it would otherwise let eager eviction drop it, and this reader
        fetch it again (with the request's first-byte wait) when it gets there."""
        return self._cache._streams.read_ahead(self._segment, reader, after)


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
        one streamed request over a byte range, for read-ahead (see `cache.streams`)."""
        if download_attempts < 1:
            raise ValueError(f"download_attempts must be at least 1, got {download_attempts}")
        self.root = Path(directory)
        disk.ensure_writable(self.root)
        self.settings = settings
        self._reader_idle_s = reader_idle_s
        self.strategy = make_strategy(
            strategy if strategy is not None else settings.eviction_strategy,
            hydrated_ratio=settings.hydrated_chunks_per_segment_ratio,
            min_chunks=settings.min_chunks_per_segment_threshold,
        )
        if disk_capacity is None:
            disk_capacity = shutil.disk_usage(self.root).total
        self.limits = settings.limits(disk_capacity)
        self.read_ahead = ReadAheadPolicy.from_settings(
            settings.chunk_prefetch, settings.chunk_size, self.limits.max_bytes)
        self._own_executor: ThreadPoolExecutor | None = None
        if prefetch_executor is None and self.read_ahead.enabled:
            self._own_executor = ThreadPoolExecutor(2, thread_name_prefix="cache-prefetch")
        self._state = state = CacheState(self.root, settings, clock=clock, write=write,
                                         read_ahead=self.read_ahead)
        self._write_behind = WriteBehind(
            state, ChunkBuffers(settings.memory_bytes, settings.chunk_size)
            if stream is not None and settings.memory_bytes > 0 else None)
        self._space = Space(state, self.strategy, self.limits, self._write_behind,
                            reserve_timeout_s=reserve_timeout_s)
        self._hydration = Hydration(state, self._space, self._write_behind, fetch,
                                    download_attempts=download_attempts)
        self._streams = Streams(state, self._space, self._hydration, self._write_behind,
                                stream if self.read_ahead.enabled else None, stream)
        self._reads = ChunkReads(state, self._space, self._hydration, self._streams,
                                 prefetch_executor or self._own_executor)
        for found in disk.load_entries(self.root):
            state.add_entry(CacheEntry(found.chunk, found.size, found.atime, found.crcs))
        with state.cond:
            self._space.trim(0, 0)

    @property
    def write_problem(self) -> str | None:
        """The latest chunk-write failure that was not a full disk (None after a success): the
        daemon's /health reports it as degraded."""
        return self._state.disk_health.problem

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
        with self._state.cond:
            self._state.segments[key] = segment
        return SegmentHandle(self, segment)

    def close_reader(self, reader: ReaderId) -> None:
        """Forget a reader (its consumer went away): its holds end at once."""
        state = self._state
        with state.cond:
            self._streams.cancel(reader)
            self._space.release_holds(state.readers.close(reader))
            state.cond.notify_all()

    def read_ahead_window(self, reader: ReaderId) -> int:
        """How many chunks past the one it reads are read ahead for `reader` now (its adaptive
        window, `cache.readahead`, or the fixed `cloud_storage_chunk_prefetch`; 0 for a reader
        not reading sequentially, or with read-ahead off)."""
        with self._state.cond:
            return self._state.readers.window(reader)

    def stats(self) -> dict[str, int]:
        """Counters and gauges for metrics: hits, misses (downloads a read started), joined
        (reads that waited on another's download), bytes_downloaded, evictions, prefetches,
        download_errors, corrupt_discarded, overshoots, written_behind (chunks written from
        memory to their files), unwritten_evictions (chunks evicted from memory before they
        were: disk writes saved); hydrated_chunks, memory_chunks (those only in memory),
        memory_bytes (the buffers' memory held), size_bytes, readers, max_bytes,
        max_objects."""
        state, buffers = self._state, self._write_behind.buffers
        with state.cond:
            out = dict(state.counters)
            out["hydrated_chunks"] = sum(1 for e in state.entries.values() if e.download is None)
            out["memory_chunks"] = len(state.in_memory)
            out["memory_bytes"] = 0 if buffers is None else buffers.held_bytes
            out["size_bytes"] = state.used_bytes
            out["objects"] = len(state.entries)
            out["readers"] = len(state.readers)
            out["max_bytes"] = self.limits.max_bytes
            out["max_objects"] = self.limits.max_objects
            return out

    def request_early(self, key: str, size: int) -> None:
        """Send the streamed request for segment object `key` (`size` bytes) from byte 0 now,
        before the segment is opened: a consumer's first read of a segment waits for its index
        (one request) and then for its bytes (a second one); sent together, it waits for one
        round trip instead of two. The read-ahead that then starts at the segment's chunk 0
        takes the request; one nobody took is closed at a check (`cache.streams`). Nothing is sent
        without read-ahead, or when chunk 0 is cached or a stream of the segment runs."""
        self._streams.request_early(key, size)

    def maintain(self) -> None:
        """The periodic check: drop idle readers' holds, trim down to the thresholds, persist
        the access-time index, close early requests nobody took. Runs every
        `check_interval_ms` after `start()`."""
        state = self._state
        self._streams.drop_early()
        with state.cond:
            self._space.release_holds(
                state.readers.expire(state.clock() - self._reader_idle_s))
            self._space.trim(0, 0)
            # chunks let go of without a release (an idle reader's)
            self._write_behind.write_unheld()
            entries = [
                disk.DiskEntry(e.chunk, e.size, e.last_access, e.crcs)
                for e in state.entries.values()
                if e.download is None and not e.in_memory
            ]
        if self._write_behind.buffers is not None:
            self._write_behind.buffers.trim(_IDLE_BUFFER_S)
        try:
            disk.save_index(self.root, entries, write=state.write)
        except CacheError as err:  # the index is an optimisation; files remain the truth
            log.warning("cache index not saved: %s", err)

    def run_in_background(self, work: Callable[[], object], name: str) -> bool:
        """Run `work` on a daemon thread of its own that `close` waits for: work that uses the
        store must not outlive the cache (the store is closed next, and a request still in
        flight would go uncounted). False, and nothing runs, once the cache is closing."""
        return self._state.run_in_background(work, name)

    def start(self) -> None:
        """Run `maintain()` every `cloud_storage_cache_check_interval_ms` on a daemon thread."""
        self._space.start(self.maintain)

    def close(self) -> None:
        """Stop the check thread, read-ahead streams, the other background work and the
        private prefetch pool, and save the index."""
        state = self._state
        with state.cond:
            state.stop.set()
            state.cond.notify_all()
            self._streams.wake_all()
            threads = list(state.threads)
        deadline = time.monotonic() + 10  # one in a slow read may not finish: it is a daemon
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._space.join()
        if self._own_executor is not None:
            self._own_executor.shutdown(wait=True, cancel_futures=True)
            self._own_executor = None
            self._reads.executor = None
        self._streams.drop_early(0.0)
        with state.cond:  # what is cached stays cached across a restart: written now
            in_memory = list(state.in_memory.values())
        for entry in in_memory:
            self._write_behind.write_behind(entry)
        with state.cond:
            for entry in list(state.mapped.values()):
                state.unmap(entry)
        self.maintain()
        if self._write_behind.buffers is not None:
            self._write_behind.buffers.close()

    def __enter__(self) -> ChunkCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
