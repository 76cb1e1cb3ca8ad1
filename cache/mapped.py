"""A chunk file opened and mapped once, shared by every fetch that reads it.

Mapping a 16 MiB chunk file for each 1 MiB fetch and unmapping it after the send cost more
than the send itself: the page tables are built again at every fetch, and every unmap stops
the other threads' cores to flush their TLBs (docs/remote-read.md, "One mapping per chunk").
So the cache maps a chunk file once, when its first byte is staged or when a stored chunk is
first opened, and hands each fetch a counted share of that mapping.

The owner (the cache entry, or the stream staging the chunk) holds one share and gives it up
when the chunk leaves the cache or falls out of the few kept mapped; each fetch holds another
until its answer is sent. The file closes and unmaps when the last share goes. Chunk files
are never changed in place, so a share keeps exactly the verified bytes it was handed, even if
the file is evicted or renamed meanwhile (an unlinked file's space comes back only once the
last share goes, as with an open descriptor).

A buffer of `cache.buffers` (memory a chunk is streamed into) is handed out the same way: its
last share gives it back to its pool instead of closing it, and only then may it be reused.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable

__all__ = ["MappedFile"]


class MappedFile:
    """An open file descriptor and a read-only mapping of its first `size` bytes, closed when
    the last share is released. Created with one share, the creator's."""

    __slots__ = ("_give_back", "_lock", "_shares", "fd", "mapping")

    def __init__(self, fd: int, size: int) -> None:
        """Takes ownership of `fd` (closed here if the mapping fails). `size` may exceed
        what is written so far only if the file was extended to it first: bytes past the
        written ones read as zeros and must never be served."""
        try:
            self.mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._shares = 1
        self._lock = threading.Lock()
        self._give_back: Callable[[int, mmap.mmap], None] | None = None

    @classmethod
    def lent(cls, fd: int, mapping: mmap.mmap, give_back: Callable[[int, mmap.mmap], None]
             ) -> MappedFile:
        """A file already open and mapped that belongs to someone else (a buffer pool): the
        last share calls `give_back(fd, mapping)` instead of closing them."""
        lent = cls.__new__(cls)
        lent.fd, lent.mapping, lent._give_back = fd, mapping, give_back
        lent._shares = 1
        lent._lock = threading.Lock()
        return lent

    def share(self) -> MappedFile:
        """One more share (the caller must hold one already, so the file is still open)."""
        with self._lock:
            if not self._shares:
                raise ValueError("mapped file is already closed")
            self._shares += 1
        return self

    def release(self) -> None:
        """Give up one share; the last closes the mapping and the descriptor."""
        with self._lock:
            self._shares -= 1
            last = self._shares == 0
        if last and self._give_back is not None:
            self._give_back(self.fd, self.mapping)
        elif last:
            # a view still held somewhere (a traceback) keeps the pages until it is dropped
            with contextlib.suppress(BufferError):
                self.mapping.close()
            os.close(self.fd)

    @property
    def closed(self) -> bool:
        return self._shares == 0
