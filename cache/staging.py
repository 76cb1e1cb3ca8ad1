"""A chunk written from a read-ahead stream as it arrives: into its temporary file
(`StagedChunk`), or into a buffer of `cache.buffers` that is written to the file later, if at
all (`BufferedChunk`).

Into a file, the bytes go from the socket into one reused buffer (`readinto`: no fresh
allocation per read), from there to the file (`os.write` lets other threads run), and are
checked while they are still in the buffer; the file's per-block CRC-32Cs are taken on the way.
Into a pool buffer, they are received in place and checked there. Either way whole record
batches are handed to a check as soon as they are in, so a reader can be served the verified
start of a chunk that is still arriving (docs/remote-read.md, read-ahead). Only once every byte
is in and checked is the chunk committed; a chunk that fails is dropped.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c

from cache.chunks import whole_batches
from cache.disk import BLOCK, Writer, create_beside, write_error
from cache.download import STREAM_PIECE, ByteStream
from cache.mapped import MappedFile
from tiered.errors import CorruptSegmentError

__all__ = ["BufferedChunk", "Check", "StagedChunk"]

#: check(run of whole batches, its offset in the chunk): raises CorruptSegmentError. The view
#: is valid only during the call
Check = Callable[[memoryview, int], None]


class StagedChunk:
    """`size` bytes for the chunk file at `path`, staged beside it until `commit`."""

    #: the committed chunk's bytes are in its file
    in_memory = False

    def __init__(self, path: Path, size: int, *, write: Writer = os.write) -> None:
        self.path = path
        self.size = size
        self._write = write
        self._crcs: list[int] = []
        self._block_crc = 0
        self._block_fill = 0
        try:
            self._tmp, fd = create_beside(path, os.O_RDWR)
        except OSError as err:
            raise write_error(path, err, size) from err
        self._fd: int | None = fd
        self._mapped: MappedFile | None = None
        try:
            # the file at its full size from the start (the rest a hole until written), so
            # that it is mapped once for every reader of it (`cache.mapped`); on its own
            # open file: a reader's seek (socket.sendfile seeks when done) must not move
            # where the next write goes
            os.ftruncate(fd, size)
            self._mapped = MappedFile(os.open(self._tmp, os.O_RDONLY), size)
        except OSError as err:
            self.discard()
            raise write_error(path, err, size) from err

    @property
    def shared(self) -> MappedFile:
        """The temporary file, open and mapped, until `commit` or `discard`: a reader takes a
        share of it to send what is verified of the chunk so far (never the bytes past that:
        they may not be written yet)."""
        assert self._mapped is not None  # noqa: S101 - only while staged
        return self._mapped

    @property
    def crcs(self) -> tuple[int, ...]:
        """CRC-32C of every `BLOCK` bytes written (the last block may be shorter)."""
        return (*self._crcs, self._block_crc) if self._block_fill else tuple(self._crcs)

    def fill(self, stream: ByteStream, check: Check | None = None) -> None:
        """Copy the next `size` bytes of `stream` into the file. With `check`, every run of
        whole batches goes to it as soon as it is in; after a failed check the rest of the
        chunk is still read, unchecked, so the stream stays at a chunk boundary, and the
        CorruptSegmentError is raised at the end (as it is when the chunk ends inside a
        batch). EOFError when the stream ends first; the stream's own errors pass through;
        CacheError / CacheFullError for the disk's."""
        assert self._fd is not None  # noqa: S101 - filled once, before commit
        # room for a piece and the start of a batch left over from the one before
        buf = bytearray(min(2 * STREAM_PIECE, self.size))
        view = memoryview(buf)
        held = 0  # bytes at the start of `buf` not checked yet: the start of a batch
        checked = written = 0
        failed: CorruptSegmentError | None = None
        while written < self.size:
            if held == len(buf):  # one batch fills the buffer: make room for the rest of it
                grown = bytearray(held + min(held, self.size - written))
                grown[:held] = view
                view.release()
                buf, view = grown, memoryview(grown)
            n = stream.readinto(view[held:held + min(len(buf) - held, self.size - written)])
            if not n:
                raise EOFError(f"the stream ended {self.size - written} bytes short of "
                               f"{self.size}")
            self._put(view[held:held + n])
            written += n
            held += n
            if check is None or failed is not None:
                held = 0
                continue
            try:
                done = _check_whole_batches(check, view[:held], checked)
            except CorruptSegmentError as err:
                failed, held = err, 0
                continue
            checked += done
            view[:held - done] = view[done:held]
            held -= done
        view.release()
        _finish(check, failed, checked, self.size)

    def _put(self, piece: memoryview) -> None:
        """Write `piece` to the file and add it to the block checksums."""
        assert self._fd is not None  # noqa: S101
        left = piece
        try:
            while left:
                left = left[self._write(self._fd, left):]
        except OSError as err:
            raise write_error(self.path, err, self.size) from err
        while piece:
            take = min(BLOCK - self._block_fill, len(piece))
            self._block_crc = crc32c.crc32c(piece[:take], self._block_crc, gil_release_mode=0)
            self._block_fill += take
            piece = piece[take:]
            if self._block_fill == BLOCK:
                self._crcs.append(self._block_crc)
                self._block_crc = self._block_fill = 0

    @contextlib.contextmanager
    def mapped(self) -> Iterator[memoryview]:
        """The staged bytes, read-only, without copying them."""
        assert self._fd is not None  # noqa: S101
        # populated up front: one call maps every page instead of a fault per 4 KiB page
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        with mmap.mmap(self._fd, self.size, flags=flags, prot=mmap.PROT_READ) as mm, \
                memoryview(mm) as view:
            yield view

    def commit(self) -> MappedFile:
        """Move the file into place (readers see all of it or nothing); returns its mapping,
        whose share passes to the caller: the file under its new name."""
        self._close()
        try:
            os.replace(self._tmp, self.path)
        except OSError as err:
            self.discard()
            raise write_error(self.path, err, self.size) from err
        mapped, self._mapped = self._mapped, None
        assert mapped is not None  # noqa: S101 - committed once
        return mapped

    def discard(self) -> None:
        """Drop the staged file (safe to call more than once)."""
        self._close()
        mapped, self._mapped = getattr(self, "_mapped", None), None
        if mapped is not None:
            mapped.release()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None


class BufferedChunk:
    """`size` bytes of the chunk whose file is `path`, received into `buffer` (a share of a
    `cache.buffers` buffer, owned from here on) and kept there after `commit`: the cache writes
    the file later, if the chunk is still cached once its readers have let it go."""

    #: the committed chunk's bytes are in the buffer, not (yet) in its file
    in_memory = True

    def __init__(self, path: Path, size: int, buffer: MappedFile) -> None:
        if size > len(buffer.mapping):
            buffer.release()
            raise ValueError(f"a {size}-byte chunk does not fit a {len(buffer.mapping)}-byte "
                             "buffer")
        self.path = path
        self.size = size
        self._buffer: MappedFile | None = buffer

    @property
    def shared(self) -> MappedFile:
        """The buffer, until `commit` or `discard`: a reader takes a share of it to send
        what is verified of the chunk so far (never the bytes past that: the buffer held
        another chunk before)."""
        assert self._buffer is not None  # noqa: S101 - only while staged
        return self._buffer

    @property
    def crcs(self) -> None:
        """None: the block checksums are taken when the chunk is written to its file."""
        return None

    def fill(self, stream: ByteStream, check: Check | None = None) -> None:
        """As `StagedChunk.fill`, the bytes received straight into the buffer."""
        with memoryview(self.shared.mapping) as whole, whole[:self.size] as view:
            written = checked = 0
            failed: CorruptSegmentError | None = None
            while written < self.size:
                n = stream.readinto(view[written:min(self.size, written + STREAM_PIECE)])
                if not n:
                    raise EOFError(f"the stream ended {self.size - written} bytes short of "
                                   f"{self.size}")
                written += n
                if check is None or failed is not None:
                    continue
                try:
                    checked += _check_whole_batches(check, view[checked:written], checked)
                except CorruptSegmentError as err:
                    failed = err
        _finish(check, failed, checked, self.size)

    @contextlib.contextmanager
    def mapped(self) -> Iterator[memoryview]:
        """The received bytes, read-only, without copying them."""
        with memoryview(self.shared.mapping) as whole, whole[:self.size] as view, \
                view.toreadonly() as readonly:
            yield readonly

    def commit(self) -> MappedFile:
        """The buffer, whose share passes to the caller."""
        buffer, self._buffer = self._buffer, None
        assert buffer is not None  # noqa: S101 - committed once
        return buffer

    def discard(self) -> None:
        """Give the buffer back (safe to call more than once)."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            buffer.release()


def _check_whole_batches(check: Check, received: memoryview, offset: int) -> int:
    """Hand the whole batches at the start of `received` (at `offset` in the chunk) to
    `check`; how many bytes they are."""
    done = whole_batches(received)
    if done:
        check(received[:done], offset)
    return done


def _finish(check: Check | None, failed: CorruptSegmentError | None, checked: int,
            size: int) -> None:
    """Raise what a filled chunk's checks found: a failed check, or bytes left over that no
    whole batch covers."""
    if check is not None and failed is None and checked != size:
        failed = CorruptSegmentError(
            f"the chunk ends inside a batch: {size - checked} bytes left over")
    if failed is not None:
        raise failed
