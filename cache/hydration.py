"""Hydrating one chunk: single-flight downloads, verification, and opening what is stored.

The cache knows nothing about S3: it is given a range-fetch function `fetch(key, begin,
end_exclusive) -> bytes`. A read downloads only the chunks covering its range (one ranged GET
per chunk), verifies each (record CRCs through the segment's `verify`; then CRC-32Cs per MiB
block, kept so that later reads check just the blocks they serve), writes it atomically and
serves it. Concurrent readers of one chunk share one download: the first pins a new entry
(after `cache.space` reserved room for it) and downloads, the others pin the same entry and
wait for its download (or, for a chunk a read-ahead stream is writing, for its verified start:
`wait_ready`). A stored chunk is served from a mapping of its file, kept for the chunks read
lately (`cache.mapped`), or, while only in memory, from its buffer (`cache.write_behind`).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from concurrent.futures import Future
from typing import NamedTuple

from cache import disk
from cache.chunk_entries import CacheEntry, SegmentInfo
from cache.download import Fetcher, fetch_verified
from cache.errors import CacheError, CacheFullError
from cache.eviction import ChunkId
from cache.mapped import MappedFile
from cache.space import Space
from cache.staging import BufferedChunk, StagedChunk
from cache.state import CacheState
from cache.write_behind import WriteBehind
from tiered.errors import CorruptSegmentError

__all__ = ["ChunkFile", "Hydration"]

log = logging.getLogger(__name__)


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


class Hydration:
    """Chunks of `state` downloaded once, stored and opened (see the module docstring). Each
    method takes the state's lock as it needs it."""

    def __init__(self, state: CacheState, space: Space, write_behind: WriteBehind,
                 fetch: Fetcher, *, download_attempts: int) -> None:
        self.state = state
        self.fetch = fetch
        self._space = space
        self._write_behind = write_behind
        self._download_attempts = download_attempts

    def pin(
        self, chunk: ChunkId, bounds: tuple[int, int], *, prefetch: bool
    ) -> tuple[CacheEntry, bool, Future[None] | None]:
        """Pin the entry of `chunk`, creating (and reserving room for) it when absent. Returns
        the entry, whether the caller must download it, and the download in progress to wait
        for otherwise. A prefetch counts no hit or miss and never waits for room."""
        state = self.state
        with state.cond:
            found = self._join(chunk, prefetch)
            if found is not None:
                return found, False, found.download
            self._space.reserve(bounds[1] - bounds[0], wait=not prefetch)
            # waiting for room released the lock: another reader may have started it meanwhile
            found = self._join(chunk, prefetch)
            if found is not None:
                return found, False, found.download
            entry = CacheEntry(chunk, bounds[1] - bounds[0], state.clock(), None)
            entry.download = Future()
            entry.progress = threading.Condition(state.lock)
            entry.pins = 1
            state.add_entry(entry)
            state.counters["prefetches" if prefetch else "misses"] += 1
            return entry, True, entry.download

    def _join(self, chunk: ChunkId, prefetch: bool) -> CacheEntry | None:
        """Pin the existing entry of `chunk`, counting a hit (or a join of a download)."""
        entry = self.state.entries.get(chunk)
        if entry is not None:
            entry.pins += 1
            entry.last_access = self.state.clock()
            if not prefetch:
                self.state.counters["joined" if entry.download is not None else "hits"] += 1
        return entry

    def wait_ready(self, seg: SegmentInfo, index: int, entry: CacheEntry,
                   download: Future[None], partial_at: int | None) -> ChunkFile | None:
        """Wait for `entry`'s download (raising its error). With `partial_at`, stop waiting as
        soon as the read-ahead stream writing the chunk has verified bytes past that offset:
        then a duplicate descriptor of its temporary file, covering just those bytes (the
        rest of the chunk is asked for again when the reader gets there). A consumer that
        catches up with its stream so waits for the batches it reads, not for a whole chunk."""
        if partial_at is not None:
            with self.state.cond:
                # counted before `ready` is read: the stream stores `ready` without the lock
                # and notifies only while someone waits (see `CacheEntry`)
                entry.waiting += 1
                try:
                    while entry.download is download and entry.progress is not None:
                        staged, ready = entry.staged, entry.ready
                        if staged is not None and ready > partial_at:
                            begin = seg.bounds(index)[0]
                            # the stream clears `staged` under this lock before it lets go,
                            # and `ready` only covers verified bytes of it
                            return ChunkFile(staged.shared.share(), begin, begin + ready)
                        entry.progress.wait()  # woken by this chunk's progress only
                finally:
                    entry.waiting -= 1
        download.result()
        return None

    def _open_verified(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> int:
        """An open descriptor of the stored chunk, verified: when it was downloaded, or (a file
        found after a restart) now, whole. BadFile when it is missing or of the wrong size."""
        root = self.state.root
        begin, end = seg.bounds(index)
        if not entry.verified:  # once per process: a file found at start-up, read back whole
            if entry.crcs is None:
                self.load(seg, index, entry, 0, 0)
            else:
                disk.read_checked(disk.chunk_path(root, entry.chunk), end - begin,
                                  entry.crcs, 0, end - begin)
            entry.verified = True
        try:
            fd = os.open(disk.chunk_path(root, entry.chunk), os.O_RDONLY)
        except FileNotFoundError as err:
            raise disk.MissingFile("file is missing") from err
        except OSError as err:
            raise CacheError(f"cannot open cached chunk of {seg.key}: {err}") from err
        size = os.fstat(fd).st_size
        if size != end - begin:
            os.close(fd)
            raise disk.BadFile(f"{size} bytes on disk, the chunk has {end - begin}")
        return fd

    def open_mapped(self, seg: SegmentInfo, index: int, entry: CacheEntry) -> MappedFile:
        """A share of the stored chunk's mapping: the one kept for it, or (verified and opened
        by `_open_verified`) a new one, then kept for the next fetch."""
        state = self.state
        with state.cond:
            if entry.mapped is not None:
                if not entry.in_memory:
                    state.mapped.move_to_end(entry.chunk)
                return entry.mapped.share()
        fd = self._open_verified(seg, index, entry)
        begin, end = seg.bounds(index)
        try:
            mapped = MappedFile(fd, end - begin)
        except (OSError, ValueError) as err:
            raise CacheError(f"cannot map cached chunk at byte {begin} of {seg.key}: {err}"
                             ) from err
        with state.cond:
            state.keep_mapped(entry, mapped.share())
        return mapped

    def load(self, seg: SegmentInfo, index: int, entry: CacheEntry, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of a stored chunk, checked against its block checksums; a file found
        after a restart without remembered checksums is verified whole first. A chunk still
        only in memory is read from there (it was checked as it arrived)."""
        with self.state.cond:
            buffer = entry.mapped.share() if entry.in_memory and entry.mapped else None
        if buffer is not None:  # checked as it arrived, and never written since
            try:
                return buffer.mapping[lo:hi]
            finally:
                buffer.release()
        begin, end = seg.bounds(index)
        path = disk.chunk_path(self.state.root, entry.chunk)
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

    def download(self, seg: SegmentInfo, index: int, entry: CacheEntry,
                 staged: StagedChunk | BufferedChunk | None = None) -> bytes | None:
        """Fetch, verify and store chunk `index` for `entry` (pinned, reserved, registered as
        downloading); on failure the reservation is dropped and waiting readers get the error.
        Returns the bytes fetched. `staged`: the chunk already written by a read-ahead stream,
        checked like a download and moved into place (None returned), or dropped and fetched
        again by a ranged GET if it fails."""
        state = self.state
        begin, end = seg.bounds(index)
        data: bytes | None = None
        mapped: MappedFile | None = None
        try:
            committed = None if staged is None else self._commit_staged(seg, staged, begin)
            if committed is not None:
                crcs, mapped = committed
            else:
                data = fetch_verified(
                    self.fetch, seg.key, begin, end, seg.verify,
                    attempts=self._download_attempts, on_bytes=state.count_bytes,
                )
                try:
                    disk.write_atomically(disk.chunk_path(state.root, entry.chunk), data,
                                          write=state.write)
                except CacheFullError:
                    raise
                except CacheError as err:
                    state.disk_health.failed(err)
                    raise
                crcs = disk.block_crcs(data)
                state.disk_health.succeeded()
            if isinstance(staged, StagedChunk):  # written to its file, not kept in memory
                state.disk_health.succeeded()
        except BaseException as err:
            if staged is not None:
                staged.discard()
            self.fail(entry, err)
            raise
        with state.cond:
            entry.crcs = crcs
            entry.verified = True
            entry.last_access = state.clock()
            if mapped is not None and staged is not None and staged.in_memory:
                self._write_behind.keep_in_memory(entry, mapped)
            elif mapped is not None:
                state.keep_mapped(entry, mapped)
            assert entry.download is not None
            entry.download.set_result(None)
            self._done(entry)
        return data

    def fail(self, entry: CacheEntry, err: BaseException) -> None:
        """Give up on downloading `entry`: its readers get `err`, its reservation goes."""
        state = self.state
        with state.cond:
            state.counters["download_errors"] += 1
            if state.entries.get(entry.chunk) is entry:
                state.remove(entry)
            assert entry.download is not None  # noqa: S101 - only while downloading
            entry.download.set_exception(err)
            self._done(entry)

    def _done(self, entry: CacheEntry) -> None:
        """The entry's download is over (its result or error set); under the lock."""
        entry.download = None
        if entry.progress is not None:
            entry.progress.notify_all()
            entry.progress = None
        self.state.cond.notify_all()

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
