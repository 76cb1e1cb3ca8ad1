"""Memory that streamed chunks land in before (and often instead of) their file.

A chunk read ahead for one consumer is usually read once and then, under eager eviction,
dropped as soon as that consumer moves past it: writing it to the cache directory on the way
cost a copy into new file pages, their block checksums and the pages' release, for nothing
(docs/remote-read.md, "Chunks in memory"). So a streamed chunk is received into a buffer of
this pool, checked and served from there, and written to its file only if the cache still
holds it once its readers have let it go (`cache.write_behind`).

Each buffer is a `memfd` (anonymous shared memory with a descriptor, so a range of it can be
sent with sendfile or read with pread like a chunk file) mapped once, read-write. A buffer
given back keeps its pages: the next chunk received into it writes over memory already
there, where a new file would fault in and zero fresh pages. The pool holds at most `budget`
bytes of buffers (`cloud_storage_cache_memory_size`); past that `take` says no and the chunk
goes to its file as it arrives. Buffers idle for a while are freed (`trim`), so memory comes
back once reading stops.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Callable

from cache.mapped import MappedFile

__all__ = ["ChunkBuffers"]

_MFD_CLOEXEC: int = getattr(os, "MFD_CLOEXEC", 1)


def _memfd_create(name: str, flags: int) -> int:
    create = getattr(os, "memfd_create", None)
    if create is None:
        raise OSError(f"no memfd_create on {os.name}")
    fd: int = create(name, flags)
    return fd


class ChunkBuffers:
    """Up to `budget` bytes of `capacity`-byte buffers, lent as `MappedFile`s (thread-safe)."""

    def __init__(self, budget: int, capacity: int, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if budget < 0 or capacity < 1:
            raise ValueError(f"bad buffer pool: budget {budget}, capacity {capacity}")
        # whole pages: the mapping's length, and what a chunk of `capacity` bytes needs
        self.capacity = -(-capacity // mmap.PAGESIZE) * mmap.PAGESIZE
        self.budget = budget
        self._clock = clock
        self._lock = threading.Lock()
        #: buffers given back, most recently given back last: (fd, mapping, when)
        self._idle: list[tuple[int, mmap.mmap, float]] = []
        #: buffers in existence (lent or idle)
        self._count = 0
        self._closed = False

    @property
    def lent_bytes(self) -> int:
        """Bytes of buffers lent out now."""
        with self._lock:
            return (self._count - len(self._idle)) * self.capacity

    @property
    def held_bytes(self) -> int:
        """Bytes of buffers in existence, lent or idle: the memory the pool holds."""
        with self._lock:
            return self._count * self.capacity

    def take(self, size: int) -> MappedFile | None:
        """A buffer for a chunk of `size` bytes, its one share the caller's; None when the
        chunk is larger than a buffer, the budget is spent or the pool is closed (or the
        system refuses the memory): the chunk then goes to its file."""
        if size > self.capacity:
            return None
        with self._lock:
            if self._closed:
                return None
            if self._idle:
                fd, mapping, _ = self._idle.pop()
                return MappedFile.lent(fd, mapping, self._give_back)
            if (self._count + 1) * self.capacity > self.budget:
                return None
            self._count += 1
        try:
            fd = _memfd_create("tiered-chunk", _MFD_CLOEXEC)
        except OSError:  # no memfd here (not Linux, an old kernel): chunks go to files
            self._forget()
            return None
        try:
            os.ftruncate(fd, self.capacity)
            mapping = mmap.mmap(fd, self.capacity, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(fd)
            self._forget()
            return None
        return MappedFile.lent(fd, mapping, self._give_back)

    def trim(self, idle_s: float) -> int:
        """Free the buffers given back more than `idle_s` seconds ago; how many were freed."""
        cutoff = self._clock() - idle_s
        with self._lock:
            stale = [b for b in self._idle if b[2] <= cutoff]
            self._idle = [b for b in self._idle if b[2] > cutoff]
            self._count -= len(stale)
        for fd, mapping, _ in stale:
            _free(fd, mapping)
        return len(stale)

    def close(self) -> None:
        """Free the idle buffers; those still lent are freed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for fd, mapping, _ in idle:
            _free(fd, mapping)

    def _give_back(self, fd: int, mapping: mmap.mmap) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append((fd, mapping, self._clock()))
                return
            self._count -= 1
        _free(fd, mapping)

    def _forget(self) -> None:
        with self._lock:
            self._count -= 1


def _free(fd: int, mapping: mmap.mmap) -> None:
    # a view still held somewhere (a traceback) keeps the pages until it is dropped
    with contextlib.suppress(BufferError):
        mapping.close()
    os.close(fd)
