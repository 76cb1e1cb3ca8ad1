"""The state the pieces of `ChunkCache` share: one lock, and the table of entries under it.

Every piece of the cache (`cache.space`, `cache.hydration`, `cache.streams`,
`cache.write_behind`, `cache.chunk_reads`) is given this one object instead of references to
each other: the entries, their per-segment index and byte count, the readers' holds, the
counters and the threads that use the store all change under `lock`, and `cond` (over it) is
what a reader waiting for a download, room or a stream waits on. Adding and removing entries
lives here too, since removing one touches everything an entry may have: its mapping (the
lately-read files kept mapped, `cache.mapped`) and its place among the chunks only in memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from cache import disk
from cache.accounting import CacheSettings
from cache.chunk_entries import CacheEntry, SegmentInfo
from cache.disk_health import DiskHealth
from cache.eviction import ChunkId
from cache.mapped import MappedFile
from cache.read_sessions import ReaderTable
from cache.readahead import ReadAheadPolicy

__all__ = ["CacheState"]

#: stored chunks kept open and mapped between fetches (`cache.mapped`), most recently read
#: first: the chunks consumers are reading, not the whole cache (each costs two descriptors,
#: and an evicted file's space comes back only once it is unmapped)
_MAPPED_FILES = 16


class CacheState:
    """The entries of one cache directory and the lock they change under (see the module
    docstring). Its methods expect the caller to hold `lock`, but for those whose docstring
    says they take it."""

    def __init__(self, root: Path, settings: CacheSettings, *, clock: Callable[[], float],
                 write: disk.Writer, read_ahead: ReadAheadPolicy | None = None) -> None:
        self.root = root
        self.settings = settings
        #: how far ahead of its readers the cache reads (`cache.readahead`)
        self.read_ahead = read_ahead if read_ahead is not None else ReadAheadPolicy(
            settings.chunk_prefetch, max(1, settings.chunk_prefetch or 1))
        self.clock = clock
        #: the `os.write` used for chunk files (tests inject a full disk)
        self.write = write
        #: the last disk write's outcome, for /health (only disk writes change it)
        self.disk_health = DiskHealth()
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        #: set when the cache closes: background work ends, nothing new starts
        self.stop = threading.Event()
        self.entries: dict[ChunkId, CacheEntry] = {}
        self.by_segment: dict[str, set[ChunkId]] = {}
        self.segments: dict[str, SegmentInfo] = {}
        self.readers = ReaderTable()
        self.used_bytes = 0
        self.counters = dict.fromkeys(
            ("hits", "misses", "joined", "bytes_downloaded", "evictions", "prefetches",
             "download_errors", "corrupt_discarded", "overshoots", "written_behind",
             "unwritten_evictions"), 0)
        #: the entries holding a mapping of their file, least recently read first
        self.mapped: OrderedDict[ChunkId, CacheEntry] = OrderedDict()
        #: the entries whose chunk is only in memory
        self.in_memory: dict[ChunkId, CacheEntry] = {}
        #: those queued for the write-behind thread (`cache.write_behind`)
        self.to_write: dict[ChunkId, CacheEntry] = {}
        #: threads that use the store (read-ahead streams, streamed chunk downloads, early
        #: requests, `run_in_background` work): `ChunkCache.close` waits for them
        self.threads: set[threading.Thread] = set()

    def run_in_background(self, work: Callable[[], object], name: str) -> bool:
        """Run `work` on a daemon thread of its own that `close` waits for (takes the lock);
        False, and nothing runs, once the cache is closing."""

        def run() -> None:
            try:
                work()
            finally:
                with self.cond:
                    self.threads.discard(threading.current_thread())

        with self.cond:
            if self.stop.is_set():
                return False
            thread = threading.Thread(target=run, name=name, daemon=True)
            self.threads.add(thread)
            thread.start()  # under the lock: `close` never sees a thread it cannot join
        return True

    # ------------------------------------------------------------------ the entry table
    def add_entry(self, entry: CacheEntry) -> None:
        self.entries[entry.chunk] = entry
        self.by_segment.setdefault(entry.chunk.segment, set()).add(entry.chunk)
        self.used_bytes += entry.size

    def remove(self, entry: CacheEntry) -> None:
        del self.entries[entry.chunk]
        self.unmap(entry)  # an in-memory chunk's buffer goes back once its fetches are sent
        self.left_memory(entry)
        ids = self.by_segment[entry.chunk.segment]
        ids.discard(entry.chunk)
        if not ids:  # forget the layout too; a handle's next read registers it again
            del self.by_segment[entry.chunk.segment]
            self.segments.pop(entry.chunk.segment, None)
        self.used_bytes -= entry.size

    def evict(self, entry: CacheEntry, *, count: bool = True) -> None:
        in_memory = entry.in_memory
        self.remove(entry)
        if in_memory:  # never written: no file (one there is another process's)
            self.counters["unwritten_evictions"] += 1
        else:
            disk.remove_file(disk.chunk_path(self.root, entry.chunk))
        if count:
            self.counters["evictions"] += 1
        self.cond.notify_all()

    def left_memory(self, entry: CacheEntry) -> None:
        """`entry` is no longer (or never was) a chunk only in memory."""
        entry.in_memory = False
        if self.in_memory.get(entry.chunk) is entry:
            del self.in_memory[entry.chunk]
        if self.to_write.get(entry.chunk) is entry:
            del self.to_write[entry.chunk]

    @staticmethod
    def is_pinned(entry: CacheEntry) -> bool:
        return entry.pins > 0 or entry.download is not None

    def is_held(self, entry: CacheEntry) -> bool:
        return self.is_pinned(entry) or self.readers.held(entry.chunk)

    def unpin(self, entry: CacheEntry) -> None:
        """Takes the lock."""
        with self.cond:
            entry.pins -= 1
            self.cond.notify_all()

    def count_bytes(self, n: int) -> None:
        """Takes the lock."""
        with self.cond:
            self.counters["bytes_downloaded"] += n

    # ------------------------------------------------------------- lately-read mappings
    def keep_mapped(self, entry: CacheEntry, mapped: MappedFile) -> None:
        """Give `entry` the share `mapped`, unless it has one already or has left the cache;
        the least recently read beyond `_MAPPED_FILES` give theirs up."""
        if entry.mapped is not None or self.entries.get(entry.chunk) is not entry:
            mapped.release()
            return
        entry.mapped = mapped
        self.mapped[entry.chunk] = entry
        while len(self.mapped) > _MAPPED_FILES:
            _chunk, oldest = self.mapped.popitem(last=False)
            self.unmap(oldest)

    def unmap(self, entry: CacheEntry) -> None:
        """The entry gives up its share of its file's mapping; fetches still sending from it
        keep theirs."""
        mapped, entry.mapped = entry.mapped, None
        self.mapped.pop(entry.chunk, None)
        if mapped is not None:
            mapped.release()
