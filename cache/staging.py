"""A chunk written from a read-ahead stream straight into its temporary file.

The bytes go from the socket to the file as they arrive (`os.write` lets other threads run),
are checked through a read-only map of the file, and only then is it moved into place; a chunk
that fails is dropped. Copying each 16 MiB chunk into a buffer first would hold the GIL for the
whole copy, stalling every request the daemon serves meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from cache.disk import Writer, create_beside
from cache.download import STREAM_PIECE, ByteStream
from cache.errors import CacheError, CacheFullError

__all__ = ["StagedChunk"]


class StagedChunk:
    """`size` bytes for the chunk file at `path`, staged beside it until `commit`."""

    def __init__(self, path: Path, size: int, *, write: Writer = os.write) -> None:
        self.path = path
        self.size = size
        self._write = write
        try:
            self._tmp, fd = create_beside(path, os.O_RDWR)
        except OSError as err:
            raise _error(path, size, err) from err
        self._fd: int | None = fd

    def fill(self, stream: ByteStream) -> None:
        """Copy the next `size` bytes of `stream` into the file. EOFError when the stream ends
        first; the stream's own errors pass through; CacheError / CacheFullError for the disk's."""
        assert self._fd is not None  # noqa: S101 - filled once, before commit
        left = self.size
        while left > 0:
            piece = stream.read(min(STREAM_PIECE, left))
            if not piece:
                raise EOFError(f"the stream ended {left} bytes short of {self.size}")
            view = memoryview(piece)
            try:
                while view:
                    view = view[self._write(self._fd, view):]
            except OSError as err:
                raise _error(self.path, self.size, err) from err
            left -= len(piece)

    @contextlib.contextmanager
    def mapped(self) -> Iterator[memoryview]:
        """The staged bytes, read-only, without copying them."""
        assert self._fd is not None  # noqa: S101
        # populated up front: one call maps every page instead of a fault per 4 KiB page
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        with mmap.mmap(self._fd, self.size, flags=flags, prot=mmap.PROT_READ) as mm, \
                memoryview(mm) as view:
            yield view

    def commit(self) -> None:
        """Move the file into place: readers see all of it or nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        try:
            os.replace(self._tmp, self.path)
        except OSError as err:
            self.discard()
            raise _error(self.path, self.size, err) from err

    def discard(self) -> None:
        """Drop the staged file (safe to call more than once)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


def _error(path: Path, size: int, err: OSError) -> CacheError:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheFullError(f"cache disk is full writing {path} ({size} bytes): {err.strerror}")
    return CacheError(f"cannot write cache file {path}: {err}")
