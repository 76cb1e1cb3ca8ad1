"""Read-ahead: one streamed request per segment a consumer reads, its chunks stored as they come.

Read-ahead (on unless `cloud_storage_chunk_prefetch` is 0): given a `stream` function, a
consumer session that misses a chunk, or reads sequentially towards chunks not cached, gets one
streamed request from that chunk to the segment's end; its thread stores chunk after chunk as
the bytes arrive, never more than the reader's read-ahead window (`cache.readahead`) ahead of
where it is (it stops reading the socket and waits), so a consumer that keeps up waits on no
request after its first, and a segment read start to end costs one GET instead of one per
chunk. Each chunk is verified a run
of whole batches at a time as it arrives (`cache.staging`), and a reader that catches up with
its stream is served the verified start of the chunk (`open_chunk`) instead of waiting for all
of it. The stream ends when the reader goes away, moves elsewhere, idles, or the next chunk is
already cached; a broken stream falls back to one ranged GET per chunk.

A chunk streamed this way (or one streamed alone for a read that missed it and takes its
verified start) is received into a buffer when `cache.write_behind` has one to lend, else
written to its temporary file as it arrives. A consumer's first read of a segment may find its
request already sent (`request_early`). Streams, single streamed chunks and early requests run
on daemon threads of their own (`CacheState.run_in_background`), which the cache's `close`
waits for.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from cache import disk
from cache.chunk_entries import CacheEntry, SegmentInfo
from cache.download import ByteStream, Streamer
from cache.errors import CacheError, CacheFullError
from cache.eviction import ChunkId
from cache.hydration import Hydration
from cache.read_sessions import ReaderId
from cache.space import Space
from cache.staging import BufferedChunk, StagedChunk
from cache.state import CacheState
from cache.write_behind import WriteBehind
from tiered.errors import CorruptSegmentError, TieredError

__all__ = ["Streams"]

log = logging.getLogger(__name__)

#: a read-ahead stream waits this long for its reader to come near its next chunk, then lets
#: the connection go (a consumer back from a longer pause starts a new stream)
_STREAM_IDLE_S = 20.0
#: read-ahead streams open at once; past this, read-ahead falls back to one GET per chunk
_MAX_STREAMS = 32
#: an early request (`Streams.request_early`) nobody took is closed at the first check this
#: long after it went out
_EARLY_TTL_S = 10.0


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


class Streams:
    """The read-ahead streams of the cache over `state` (see the module docstring).
    `streamer` is None when read-ahead is off; `chunk_streamer` streams one missed chunk for a
    read that takes its verified start (None: such a chunk is fetched whole)."""

    def __init__(self, state: CacheState, space: Space, hydration: Hydration,
                 write_behind: WriteBehind, streamer: Streamer | None,
                 chunk_streamer: Streamer | None) -> None:
        self.state = state
        self._space = space
        self.streamer = streamer
        self.chunk_streamer = chunk_streamer
        self._hydration = hydration
        self._write_behind = write_behind
        #: segment key -> a request from its byte 0 sent before the segment was opened, and
        #: when (`request_early`); the read-ahead starting at its chunk 0 takes it
        self._early: dict[str, tuple[Future[ByteStream], float]] = {}
        #: (reader, segment key) -> the read-ahead stream serving it
        self.streams: dict[tuple[ReaderId, str], _Stream] = {}

    # ------------------------------------------------------------ the reader's side
    def read_ahead(self, seg: SegmentInfo, reader: ReaderId, after: str) -> bool:
        """`SegmentHandle.read_ahead`: stream `seg` from its first chunk for `reader`, which
        finishes segment `after`, or hold that chunk for it when it is already cached."""
        state = self.state
        with state.cond:
            if not seg.starts:
                return False
            if seg.chunk_ids[0] in state.entries:
                state.readers.add_hold(reader, seg.chunk_ids[0])
                return False
            return self.start_stream(seg, 0, reader, None, after=after)

    def reader_read(self, seg: SegmentInfo, reader: ReaderId, last: int) -> bool:
        """`reader` has read up to chunk `last` of `seg` (under the lock): wake its streams that
        wait for it. True when its stream of `seg` is ahead of it (none to start)."""
        if last >= len(seg.starts) - 1:
            # the next segment's stream waits for its reader to read in this last chunk (see
            # `_next_streamed`); woken on every read it would take the lock and the
            # interpreter from the reader's own fetches for nothing
            self._wake_next(reader, seg.key)
        running = self.streams.get((reader, seg.key))
        if running is not None and running.next_index > last:
            waits = self._still_waits(running, seg.key, reader)
            for (owner, _segment), other in self.streams.items():
                if owner == reader and other.after != seg.key and not (
                        other is running and waits):
                    other.wake.notify()  # it waits for its reader to move on
            return True
        return False

    def _still_waits(self, stream: _Stream, key: str, reader: ReaderId) -> bool:
        """Whether `reader`'s stream of segment `key`, waiting in `_next_streamed` for its
        next chunk, would only wait again if woken now (under the lock): its reader is in
        the segment but not within its window of that chunk. Woken on every fetch anyway,
        the stream took the lock and the interpreter from the reader's fetches for nothing,
        sixteen times per 16 MiB chunk."""
        at = self.state.readers.position(reader)
        return (at is not None and at[0] == key and stream.after != key and not (
            at[2] and stream.next_index <= at[1] + self.state.readers.window(reader)))

    def cancel(self, reader: ReaderId) -> None:
        """End `reader`'s streams at their next chunk (under the lock): it went away."""
        for (owner, _segment), stream in self.streams.items():
            if owner == reader:
                stream.cancelled = True
                stream.wake.notify()

    def wake_all(self) -> None:
        """Wake every stream (under the lock): the cache closes."""
        for stream in self.streams.values():
            stream.wake.notify()

    def await_stream(self, seg: SegmentInfo, index: int, reader: ReaderId) -> None:
        """A reader about to miss chunk `index` that its own stream is on the way to waits for
        the stream instead of sending a ranged GET for bytes already coming."""
        state = self.state
        deadline = time.monotonic() + _STREAM_IDLE_S
        chunk = seg.chunk_ids[index]
        with state.cond:
            while chunk not in state.entries and time.monotonic() < deadline:
                stream = self.streams.get((reader, seg.key))
                at = state.readers.position(reader)
                if (stream is None or stream.cancelled or not stream.next_index <= index
                        or at is None or not at[2]
                        or index > at[1] + state.readers.window(reader)):
                    return
                if stream.after is not None and not stream.due:
                    stream.due = True  # it waits for the segment before: the reader is here
                    stream.wake.notify()
                state.cond.wait(deadline - time.monotonic())

    # ------------------------------------------------------------ early requests
    def request_early(self, key: str, size: int) -> None:
        """`ChunkCache.request_early`: send the streamed request for `key` from byte 0 now;
        one nobody took within `_EARLY_TTL_S` is closed (`drop_early`)."""
        state = self.state
        if self.streamer is None or state.settings.disable_chunk_reads or size <= 0:
            return
        with state.cond:
            if (state.stop.is_set() or key in self._early
                    or ChunkId(key, 0) in state.entries
                    or any(segment == key for _reader, segment in self.streams)):
                return
            request: Future[ByteStream] = Future()
            self._early[key] = (request, time.monotonic())
        streamer = self.streamer

        def send() -> None:
            try:
                request.set_result(streamer(key, 0, size, to_end=True))
            except BaseException as err:  # the read-ahead sends its own request then
                request.set_exception(err)

        if not state.run_in_background(send, "cache-early-request"):
            request.cancel()  # closed meanwhile: nobody takes it

    def _take_early(self, key: str) -> ByteStream | None:
        """The request `request_early` sent for `key`, once it has an answer; None when there
        is none or it failed."""
        with self.state.cond:
            early = self._early.pop(key, None)
        if early is None:
            return None
        try:
            return early[0].result()
        except Exception as err:
            log.debug("early request for %s failed (%s); sending it again", key, err)
            return None

    def drop_early(self, older_than_s: float | None = None) -> None:
        """Close the early requests nobody took within `older_than_s` seconds (default
        `_EARLY_TTL_S`)."""
        if older_than_s is None:
            older_than_s = _EARLY_TTL_S
        now = time.monotonic()
        with self.state.cond:
            stale = [k for k, (_r, sent) in self._early.items() if now - sent >= older_than_s]
            requests = [self._early.pop(k)[0] for k in stale]
        for request in requests:
            request.add_done_callback(_close_body)

    # ------------------------------------------------------------ the streams
    def start_stream(self, seg: SegmentInfo, index: int, reader: ReaderId,
                     first: CacheEntry | None, *, after: str | None = None,
                     replace: bool = False) -> bool:
        """Start a read-ahead stream of `seg` from chunk `index` for `reader` (`first`: that
        chunk's entry, already pinned and reserved by the caller); False when there is no
        streamer, the cache is closing, the reader has one on this segment (unless `replace`:
        the old one then ends at its next chunk) or too many run."""
        if self.streamer is None or seg.whole:
            return False
        state = self.state
        with state.cond:
            key = (reader, seg.key)
            old = self.streams.get(key)
            if state.stop.is_set() or (old is not None and not replace) or (
                    old is None and len(self.streams) >= _MAX_STREAMS):
                return False
            if old is not None:
                old.cancelled = True
                old.wake.notify()
            stream = _Stream(index, threading.Condition(state.lock), after=after)
            self.streams[key] = stream
            return state.run_in_background(
                lambda: self._stream_chunks(seg, index, reader, first, stream),
                "cache-readahead")

    def _stream_chunks(self, seg: SegmentInfo, first_index: int, reader: ReaderId,
                       first: CacheEntry | None, stream: _Stream) -> None:
        """The read-ahead thread: one request from chunk `first_index` to the segment's end,
        each chunk verified and stored as its bytes arrive (see the module docstring)."""
        state = self.state
        body = None
        try:
            for index in range(first_index, len(seg.starts)):
                entry = first if index == first_index and first is not None else (
                    self._next_streamed(seg, index, reader, stream))
                if entry is None:
                    return
                if index == first_index:  # the request goes out once its first chunk is due
                    body = self._request(seg, first_index)
                begin, end = seg.bounds(index)
                with state.cond:  # on it: a reader joining this chunk has not overtaken us
                    stream.next_index = index + 1
                    state.cond.notify_all()  # a reader waiting for it (await_stream) joins now
                try:
                    if body is None:
                        self._hydration.download(seg, index, entry)
                    elif not self._store_streamed(seg, index, entry, body):
                        body.close()
                        body = None
                except TieredError as err:  # the entry's readers got the error
                    log.warning("read-ahead of chunk %s of %s failed: %s", begin, seg.key, err)
                    return
                finally:
                    if entry is not first:
                        state.unpin(entry)
                        with state.cond:
                            self._space.apply_release(seg.key)
                if body is None:
                    return
        except Exception:  # never let a read-ahead thread die with a traceback
            log.exception("read-ahead of %s failed", seg.key)
        finally:
            if body is not None:
                body.close()
            with state.cond:
                if self.streams.get((reader, seg.key)) is stream:
                    del self.streams[(reader, seg.key)]
                    self._wake_next(reader, seg.key)
                state.cond.notify_all()

    def _request(self, seg: SegmentInfo, first_index: int) -> ByteStream | None:
        """The stream's request from chunk `first_index` to the segment's end: the early one
        (`request_early`) for chunk 0 if there is one, else sent now; None when it could not
        be sent (the chunk-by-chunk path then reports the store's error)."""
        assert self.streamer is not None  # noqa: S101 - start_stream checks
        try:
            body = self._take_early(seg.key) if first_index == 0 else None
            if body is None:
                body = self.streamer(seg.key, seg.bounds(first_index)[0], seg.size,
                                     to_end=True)
        except Exception as err:  # the chunk-by-chunk path reports store errors
            log.debug("read-ahead of %s could not start: %s", seg.key, err)
            return None
        return body

    def stream_chunk(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> bool:
        """Download chunk `index` for `entry` (pinned and reserved by the caller, who keeps
        the pin) on a thread of its own, staged and verified as its bytes arrive, so a read
        that needs its start is served once those batches are in, not after the whole chunk
        (a cold read of 1 MiB in a 16 MiB chunk waits for a fraction of the chunk's GET).
        False when there is no streaming store or the cache is closing."""
        if self.chunk_streamer is None or seg.whole:
            return False
        return self.state.run_in_background(
            lambda: self._store_chunk_stream(seg, index, entry), "cache-chunk")

    def _store_chunk_stream(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> None:
        assert self.chunk_streamer is not None  # noqa: S101 - stream_chunk checks
        begin, end = seg.bounds(index)
        body = None
        try:
            try:
                body = self.chunk_streamer(seg.key, begin, end)
            except Exception as err:  # the ranged GET below reports store errors
                log.debug("streamed read of chunk %d of %s could not start: %s", begin,
                          seg.key, err)
            if body is None:
                self._hydration.download(seg, index, entry)
            else:
                self._store_streamed(seg, index, entry, body)
        except TieredError as err:  # the entry's readers got the error
            log.warning("download of chunk %d of %s failed: %s", begin, seg.key, err)
        except Exception:  # never let the thread die with a traceback
            log.exception("download of chunk %d of %s failed", begin, seg.key)
        finally:
            if body is not None:
                body.close()
            with self.state.cond:
                self._space.apply_release(seg.key)
                self.state.cond.notify_all()

    def _wake_next(self, reader: ReaderId, key: str) -> None:
        """Wake `reader`'s stream of the segment after `key`, which waits for this one."""
        for (owner, _segment), other in self.streams.items():
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
                self.state.disk_health.failed(err)
            self._hydration.fail(entry, err)
            raise
        self._hydration.download(seg, index, entry, staged)
        return usable

    def _stage(self, seg: SegmentInfo, index: int, entry: CacheEntry, body: ByteStream
               ) -> tuple[StagedChunk | BufferedChunk | None, bool]:
        """Chunk `index` from the stream, received into a buffer of the pool (or, when it has
        none to lend, written to its temporary file) and, unless it is the whole segment (the
        object's CRC-32C needs every byte), verified batch by batch as it arrives, each
        verified run offered to readers at once (`entry.staged`, `entry.ready`). (None, True)
        when it failed verification (logged; the stream is at the next chunk), (None, False)
        when the stream broke (logged); either way a ranged GET fetches it."""
        state, buffers = self.state, self._write_behind.buffers
        begin, end = seg.bounds(index)
        path = disk.chunk_path(state.root, entry.chunk)
        buffer = None if buffers is None else buffers.take(end - begin)
        if buffer is None and buffers is not None and end - begin <= buffers.capacity:
            with state.cond:  # this chunk goes to its file; the next ones may get a buffer
                self._write_behind.spill_idle()
        staged: StagedChunk | BufferedChunk = (
            StagedChunk(path, end - begin, write=state.write) if buffer is None
            else BufferedChunk(path, end - begin, buffer))
        check = None
        if (begin, end) != (0, seg.size):
            verify = seg.verify

            def check(run: memoryview, offset: int) -> None:
                if verify is not None:
                    verify(run, begin + offset)
                # published without the lock; taken only to wake a reader waiting for it
                # (`CacheEntry`): most runs arrive with nobody waiting
                entry.ready = offset + len(run)
                if entry.waiting:
                    with state.cond:
                        if entry.progress is not None:  # only the readers of this chunk
                            entry.progress.notify_all()

            with state.cond:
                entry.staged = staged
        try:
            try:
                staged.fill(body, check)
            finally:
                with state.cond:  # before the file is closed: readers duplicate it
                    entry.staged = None
        except CorruptSegmentError as err:
            state.count_bytes(staged.size)
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
        state.count_bytes(staged.size)
        return staged, True

    def _next_streamed(self, seg: SegmentInfo, index: int, reader: ReaderId,
                       stream: _Stream) -> CacheEntry | None:
        """Wait until `reader` reads sequentially within its window (chunks) of chunk
        `index`, then pin and reserve it for the stream; None when the stream should end."""
        state = self.state
        chunk = seg.chunk_ids[index]
        deadline = time.monotonic() + _STREAM_IDLE_S
        with state.cond:
            while True:
                stream.next_index = index
                if state.stop.is_set() or stream.cancelled:
                    return None
                at = state.readers.position(reader)
                if at is not None and at[0] == stream.after and at[0] != seg.key:
                    # the reader finishes the segment before: its next chunk once the
                    # reader reads in that segment's last chunk (it needs the chunks before
                    # first, and this request's store work would slow their reads), or at
                    # once when the reader is already waiting for it. Its reads wake us
                    # (`reader_read`)
                    before_seg = state.segments.get(stream.after)
                    last = len(before_seg.starts) - 1 if before_seg is not None else 0
                    if index == 0 and (stream.due or at[1] >= last):
                        state.readers.add_hold(reader, chunk)
                        break
                elif at is not None and at[0] != seg.key:
                    return None  # the reader moved to another segment
                elif at is not None and at[2] and index <= at[1] + state.readers.window(reader):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                stream.wake.wait(remaining)
            if chunk in state.entries:
                return None  # cached by another reader: a later stream starts past it
            try:
                entry, mine, _ = self._hydration.pin(chunk, seg.bounds(index), prefetch=True)
            except CacheFullError:
                return None
        if not mine:
            state.unpin(entry)
            return None
        return entry
