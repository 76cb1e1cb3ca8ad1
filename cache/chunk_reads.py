"""One read of a segment through the cache: its chunks one at a time, then the reader's holds.

A read (`SegmentHandle.read` / `open_chunk`) visits the chunks covering its range in order.
Each is pinned and hydrated (`cache.hydration`: joined if another reader downloads it, streamed
if a read-ahead can bring it, `cache.streams`); a stored chunk that fails its checks is dropped
and fetched again, a few times, and one found gone (evicted by another process sharing the
directory) fetched again too. After the read the reader's position and holds are updated
(`cache.read_sessions`), the strategy lets go of what it no longer needs (`cache.space`) and, for a
consumer session, read-ahead starts or the chunks ahead are prefetched. Without a `stream`
function prefetches run on the prefetch executor (`ChunkCache`'s `prefetch_executor`, or a
private two-thread pool).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TypeVar

from cache import disk
from cache.chunk_entries import CacheEntry, SegmentInfo
from cache.chunks import chunks_for_range
from cache.errors import CacheError, CacheFullError
from cache.hydration import ChunkFile, Hydration
from cache.read_sessions import ReaderId
from cache.space import Space
from cache.state import CacheState
from cache.streams import Streams
from tiered.errors import CorruptSegmentError, TieredError

__all__ = ["ChunkReads"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: a stored chunk that reads back wrong is discarded and fetched again this many times per read
_READ_ATTEMPTS = 3
#: ... and one found gone (evicted by another process sharing the directory) this many times
_MISSING_ATTEMPTS = 10

#: what a read does with its chunk: (entry, bytes downloaded for it or None, the verified
#: start of a chunk still streaming or None) -> the read's part
Use = Callable[[CacheEntry, bytes | memoryview | None, ChunkFile | None], T]


class ChunkReads:
    """Reads of segments over `state` (see the module docstring)."""

    def __init__(self, state: CacheState, space: Space, hydration: Hydration, streams: Streams,
                 executor: Executor | None) -> None:
        self.state = state
        #: where prefetches run without read-ahead; None once the cache closed its own
        self.executor = executor
        self._space = space
        self._hydration = hydration
        self._streams = streams

    def read(self, seg: SegmentInfo, begin: int, end: int, reader: ReaderId | None,
             session: bool) -> bytes:
        self._check_range(seg, begin, end)
        hydration = self._hydration

        def piece(index: int, pinned: list[CacheEntry]) -> bytes:
            chunk_begin, chunk_end = seg.bounds(index)
            lo, hi = max(begin, chunk_begin) - chunk_begin, min(end, chunk_end) - chunk_begin
            return self.with_chunk(seg, index, pinned, reader, session, lambda entry, data, _: (
                hydration.load(seg, index, entry, lo, hi) if data is None
                else bytes(data[lo:hi])))

        return b"".join(self._visit(seg, chunks_for_range(seg.starts, begin, end), end,
                                    reader, session, piece))

    def open_chunk(self, seg: SegmentInfo, position: int, end: int,
                   reader: ReaderId | None, session: bool) -> ChunkFile:
        self._check_range(seg, position, end)
        indices = chunks_for_range(seg.starts, position, max(end, position + 1))
        index = indices[0]
        begin, chunk_end = seg.bounds(index)

        def opened(index: int, pinned: list[CacheEntry]) -> ChunkFile:
            def use(entry: CacheEntry, _data: object, partial: ChunkFile | None) -> ChunkFile:
                if partial is not None:
                    return partial
                return ChunkFile(self._hydration.open_mapped(seg, index, entry), begin,
                                 chunk_end)

            return self.with_chunk(seg, index, pinned, reader, session, use,
                                   partial_at=position - begin)

        return self._visit(seg, range(index, index + 1), min(end, chunk_end), reader,
                           session, opened)[0]

    def expect(self, seg: SegmentInfo, reader: ReaderId, begin: int, end: int) -> None:
        self._check_range(seg, begin, end)
        state, ids = self.state, seg.chunk_ids
        with state.cond:
            state.segments.setdefault(seg.key, seg)
            chunks = [ids[i] for i in chunks_for_range(seg.starts, begin, end)]
            state.readers.expect(reader, chunks, state.clock())

    @staticmethod
    def _check_range(seg: SegmentInfo, begin: int, end: int) -> None:
        if not 0 <= begin <= end <= seg.size:
            raise CacheError(
                f"segment {seg.key}: byte range [{begin}, {end}) is outside its {seg.size} bytes"
            )

    def _visit(self, seg: SegmentInfo, indices: range, end: int, reader: ReaderId | None,
               session: bool, get: Callable[[int, list[CacheEntry]], T]) -> list[T]:
        """`get(index, pinned)` for each chunk of a read of `seg` ending at byte `end`, then
        the reader's position, holds and read-ahead updated (see `after_read`; `session`: the
        reader is a consumer session, the only kind read-ahead serves)."""
        state = self.state
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
                    state.unpin(pinned.pop())
        finally:
            with state.cond:
                state.segments.setdefault(seg.key, seg)
                try:
                    if reader is not None and indices and len(parts) == len(indices):
                        ahead = self.after_read(seg, indices, end, reader, session)
                finally:  # a pin left behind would keep the chunk from ever being evicted
                    for entry in pinned:
                        state.unpin(entry)
                if indices:
                    self._space.apply_release(seg.key)
        executor = self.executor
        for index in ahead:  # submitted outside the lock: an inline executor fetches right here
            if executor is None:
                break
            try:
                executor.submit(self._prefetch, seg, index)
            except RuntimeError:  # the pool is shutting down with the cache
                break
        return parts

    def after_read(
        self, seg: SegmentInfo, indices: range, end: int, reader: ReaderId, session: bool = True
    ) -> list[int]:
        """Update the reader's position and holds (under the lock); the chunk indices to
        prefetch for it."""
        state = self.state
        last = indices[-1]
        inside_last = end < seg.bounds(last)[1]
        outcome = state.readers.after_read(
            reader, seg.chunk_ids, indices[0], last, inside_last=inside_last,
            prefetch=state.read_ahead, now=state.clock(),
        )
        self._space.release_holds(outcome.released)
        ahead = [seg.starts.index(c.start) for c in outcome.prefetch if c not in state.entries]
        if self._streams.reader_read(seg, reader, last):
            return []  # its stream is ahead of it
        if not session:  # a one-off read (no consumer session) reads nothing ahead
            return []
        # no stream, or one the reader has overtaken (it ends at a chunk already cached): a
        # new one from the first chunk ahead that is missing
        if ahead and self._streams.start_stream(seg, ahead[0], reader, None, replace=True):
            return []
        return ahead

    def with_chunk(self, seg: SegmentInfo, index: int, pinned: list[CacheEntry],
                   reader: ReaderId | None, session: bool, use: Use[T],
                   *, partial_at: int | None = None) -> T:
        """`use(entry, downloaded bytes or None, partial)` on chunk `index`, cached or
        downloaded now (a stored chunk that fails its checks is dropped and fetched again).
        With `partial_at` (an offset in the chunk), a chunk a read-ahead stream is still
        writing may come as `partial`: its verified start, open, reaching past that offset
        (see `Hydration.wait_ready`). The chunk's entry stays pinned and goes into `pinned`
        for the caller to unpin once the reader's holds are in place."""
        chunk = seg.chunk_ids[index]
        if reader is not None and self._streams.streams:
            self._streams.await_stream(seg, index, reader)
        bad = 0
        for _ in range(_MISSING_ATTEMPTS):
            if bad >= _READ_ATTEMPTS:
                break
            entry, mine, download = self._hydration.pin(chunk, seg.bounds(index),
                                                         prefetch=False)
            keep = False
            try:
                data, partial = self._hydrate(seg, index, entry, mine, download, reader,
                                              session, partial_at)
                result = use(entry, data, partial)
                keep = True
                pinned.append(entry)
                return result
            except disk.MissingFile:
                self._drop_missing(entry)
            except disk.BadFile as problem:
                bad += 1
                self._drop_bad(entry, problem)
            finally:
                if not keep:
                    self.state.unpin(entry)
        if bad < _READ_ATTEMPTS:
            raise CacheError(f"chunk at byte {seg.bounds(index)[0]} of {seg.key} kept being "
                             "removed (by other processes sharing the cache directory?)")
        raise CorruptSegmentError(
            f"chunk kept failing its checks after {_READ_ATTEMPTS} reads",
            path=seg.key, position=seg.bounds(index)[0],
        )

    def _hydrate(self, seg: SegmentInfo, index: int, entry: CacheEntry, mine: bool,
                 download: Future[None] | None, reader: ReaderId | None, session: bool,
                 partial_at: int | None) -> tuple[bytes | None, ChunkFile | None]:
        """Chunk `index` for the pinned `entry`: (bytes downloaded now, None), or (None, its
        verified start while streaming, see `with_chunk`), or (None, None) once it is stored.
        `mine`: the caller created the entry and brings the chunk, by a stream of its reader's
        (a consumer session), one of the chunk alone (for `partial_at`), or a ranged GET;
        else it waits for the download under way, if any (raising its error)."""
        if not mine:
            if download is None:
                return None, None
            return None, self._hydration.wait_ready(seg, index, entry, download, partial_at)
        streams = self._streams
        # a stream's first chunk, or the one chunk streamed: this one. A reader that jumped
        # gets no stream to the segment's end (docs/remote-read.md, "Read-ahead")
        if (session and reader is not None and self._may_stream(seg, index, reader)
                and streams.start_stream(seg, index, reader, entry)
                or partial_at is not None and streams.stream_chunk(seg, index, entry)):
            assert download is not None  # noqa: S101 - a new entry downloads
            return None, self._hydration.wait_ready(seg, index, entry, download, partial_at)
        return self._hydration.download(seg, index, entry), None

    def _may_stream(self, seg: SegmentInfo, index: int, reader: ReaderId) -> bool:
        with self.state.cond:
            return self.state.readers.may_continue(reader, seg.key, index)

    def _drop_missing(self, entry: CacheEntry) -> None:
        """Another process sharing the directory evicted `entry`'s file: forget it, so the
        next attempt fetches it again."""
        state, chunk = self.state, entry.chunk
        log.debug("cached chunk %s of %s is gone, fetching again", chunk.start, chunk.segment)
        with state.cond:
            if state.entries.get(chunk) is entry:
                state.remove(entry)

    def _drop_bad(self, entry: CacheEntry, problem: disk.BadFile) -> None:
        """`entry`'s file failed its checks: evict it, so the next attempt fetches it again."""
        state, chunk = self.state, entry.chunk
        log.warning("cached chunk %s of %s is bad, fetching again: %s",
                    chunk.start, chunk.segment, problem)
        with state.cond:
            state.counters["corrupt_discarded"] += 1
            if state.entries.get(chunk) is entry:
                state.evict(entry, count=False)

    def _prefetch(self, seg: SegmentInfo, index: int) -> None:
        state, chunk = self.state, seg.chunk_ids[index]
        try:
            with state.cond:
                if chunk in state.entries or not state.readers.held(chunk):
                    return  # cached meanwhile, or its reader moved on
            entry, mine, _ = self._hydration.pin(chunk, seg.bounds(index), prefetch=True)
        except CacheFullError:
            return  # no room: a prefetch never waits nor overshoots
        try:
            if mine:
                self._hydration.download(seg, index, entry)
        except TieredError as err:
            log.warning("prefetch of chunk %s of %s failed: %s", chunk.start, chunk.segment, err)
        finally:
            state.unpin(entry)
            with state.cond:
                self._space.apply_release(seg.key)
