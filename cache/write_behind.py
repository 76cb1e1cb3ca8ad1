"""Chunks in memory and the write-behind that puts them in their files.

A streamed chunk (read-ahead, or one streamed for a read that missed it) is received into a
buffer of `cache.buffers` rather than its file, checked and served from memory, and written to
its file only if the cache still keeps it once no reader holds it (write-behind): under eager
eviction a chunk one consumer read is evicted first and never written. Chunks in memory nobody
has read for a second are written, held or not, once half the buffers' budget
(`cloud_storage_cache_memory_size`) is lent; with no buffer to spare a chunk goes to its file as
it arrives; `ChunkCache.close()` writes what is still in memory (docs/remote-read.md, "Chunks in
memory").

The writes run on one daemon thread at a time, started when a chunk is queued; the watch over
idle chunks in memory on another, started when the first chunk stays in memory. Both end when
there is nothing left for them (or the cache closes), and the cache's `close` waits for them.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cache import disk
from cache.buffers import ChunkBuffers
from cache.chunk_entries import CacheEntry
from cache.errors import CacheError, CacheFullError
from cache.mapped import MappedFile
from cache.state import CacheState

__all__ = ["WriteBehind"]

log = logging.getLogger(__name__)

#: a chunk in memory nobody has read for this long (seconds) is written behind, held or not,
#: once more than half the buffers' budget is lent: memory is for the chunks being read now
_SPILL_IDLE_S = 1.0


class WriteBehind:
    """The chunks of `state` kept in `buffers` and their writing to files (see the module
    docstring). Methods expect the caller to hold the state's lock unless they say otherwise."""

    def __init__(self, state: CacheState, buffers: ChunkBuffers | None) -> None:
        self.state = state
        #: memory streamed chunks are received into and served from until written behind
        #: (`cache.buffers`); None: straight into their files
        self.buffers = buffers
        #: whether the write-behind thread (`_write_queued`) runs
        self.writing = False
        #: whether the thread watching for idle chunks in memory runs (`_watch_memory`)
        self.watching = False
        #: passes that thread has made (tests wait for one instead of sleeping)
        self.looks = 0

    def keep_in_memory(self, entry: CacheEntry, buffer: MappedFile) -> None:
        """Give `entry` the share `buffer` of the buffer its chunk arrived in, to serve it from
        until it is written behind, if at all; none if it has left the cache."""
        state = self.state
        if entry.mapped is not None or state.entries.get(entry.chunk) is not entry:
            buffer.release()
            return
        entry.mapped, entry.in_memory = buffer, True
        state.in_memory[entry.chunk] = entry
        if not self.watching:
            self.watching = state.run_in_background(self._watch_memory, "cache-memory")

    def queue_write(self, entry: CacheEntry) -> None:
        """Have in-memory `entry` written to its file on the write-behind thread. Once the cache
        is closing nothing starts: `close` writes what is left."""
        state = self.state
        if entry.chunk in state.to_write:
            return
        state.to_write[entry.chunk] = entry
        if not self.writing:
            self.writing = state.run_in_background(self._write_queued, "cache-write-behind")

    def write_unheld(self, segment: str | None = None) -> None:
        """Queue the chunks in memory (of `segment`, or all) that nobody holds for writing: the
        cache keeps them once their readers are done."""
        state = self.state
        for entry in list(state.in_memory.values()):
            if (segment is None or entry.chunk.segment == segment) and not state.is_held(entry):
                self.queue_write(entry)

    def spill_idle(self) -> float:
        """Write behind the chunks in memory nobody has read for `_SPILL_IDLE_S`, held or not:
        a consumer that stopped, or reads slowly, still holds its chunks, and their buffers are
        better spent on the streams of consumers reading now. The seconds until the next chunk
        would be idle that long."""
        now, wait = self.state.clock(), _SPILL_IDLE_S
        for entry in list(self.state.in_memory.values()):
            idle = now - entry.last_access
            if idle >= _SPILL_IDLE_S:
                self.queue_write(entry)
            else:
                wait = min(wait, _SPILL_IDLE_S - idle)
        return max(0.01, wait)

    def _watch_memory(self) -> None:
        """While chunks are in memory and more than half the buffers' budget is lent, spill
        the idle ones (`spill_idle`), so the buffers are free before the streams need them
        (when they run out, staging a chunk spills at once)."""
        state, buffers = self.state, self.buffers
        assert buffers is not None  # noqa: S101 - chunks are in memory only with buffers
        while True:
            with state.cond:
                if state.stop.is_set() or not state.in_memory:
                    self.watching = False
                    return
                pressed = buffers.lent_bytes * 2 > buffers.budget
                wait = self.spill_idle() if pressed else _SPILL_IDLE_S
                self.looks += 1
            state.stop.wait(wait)

    def _write_queued(self) -> None:
        """The write-behind thread: write the queued chunks one at a time, oldest first."""
        state = self.state
        while True:
            with state.cond:
                if state.stop.is_set() or not state.to_write:
                    self.writing = False
                    return
                entry = state.to_write.pop(next(iter(state.to_write)))
            try:
                self.write_behind(entry)
            except Exception:  # never let the thread die: the next chunks still need it
                log.exception("writing chunk %d of %s behind failed", entry.chunk.start,
                              entry.chunk.segment)

    def write_behind(self, entry: CacheEntry) -> None:
        """Write in-memory `entry` to its file, then serve it from there and give its buffer
        back (fetches sending from the buffer keep their shares). A chunk evicted meanwhile
        leaves no file. One that cannot be written is dropped from the cache: a later read
        downloads it again. Takes the lock."""
        state = self.state
        with state.cond:
            if (state.entries.get(entry.chunk) is not entry or not entry.in_memory
                    or entry.mapped is None):
                return
            buffer = entry.mapped.share()
        path = disk.chunk_path(state.root, entry.chunk)
        tmp: Path | None = None
        try:
            with memoryview(buffer.mapping) as whole, whole[:entry.size] as view:
                crcs = disk.block_crcs(view)
                tmp = disk.write_beside(path, view, write=state.write)
            with state.cond:
                if state.entries.get(entry.chunk) is entry and entry.in_memory:
                    disk.move_into_place(tmp, path)
                    tmp = None
                    entry.crcs = crcs
                    state.unmap(entry)
                    state.left_memory(entry)
                    state.counters["written_behind"] += 1
            state.disk_health.succeeded()
        except Exception as err:  # a full disk, an I/O error, a bug: the bucket has it
            if not isinstance(err, CacheFullError):
                state.disk_health.failed(err)
            log.warning("chunk %d of %s not written to the cache disk, dropped: %s",
                        entry.chunk.start, entry.chunk.segment, err,
                        exc_info=not isinstance(err, CacheError))
            with state.cond:
                if state.entries.get(entry.chunk) is entry and entry.in_memory:
                    state.evict(entry, count=False)
        finally:
            if tmp is not None:
                disk.remove_file(tmp)
            buffer.release()
