"""A fetch's bytes where they lie: pieces read from the local log, and ranges of open chunk
files of the read cache, in order. The HTTP endpoint sends file ranges with `sendfile` (the
bytes go from the page cache to the socket without passing through Python); other callers read
them into one `bytes`. Chunk files were verified when they were downloaded, so a range of one
is served as it is (docs/design.md, remote read)."""

from __future__ import annotations

import os
import socket
from typing import NamedTuple

__all__ = ["FilePiece", "Pieces"]


class FilePiece(NamedTuple):
    """`length` bytes at `offset` of the open file `fd`."""

    fd: int
    offset: int
    length: int


class Pieces:
    """Ordered `bytes` and `FilePiece`s; owns the file descriptors handed to `adopt` (an open
    descriptor keeps an evicted chunk file readable until it is sent). Close it when done."""

    def __init__(self) -> None:
        self.parts: list[bytes | FilePiece] = []
        self.size = 0
        self._fds: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.parts)

    def add(self, part: bytes | FilePiece) -> None:
        length = part.length if isinstance(part, FilePiece) else len(part)
        if length:
            self.parts.append(part)
            self.size += length

    def adopt(self, fds: list[int]) -> None:
        """Close these descriptors with this object."""
        self._fds.extend(fds)

    def read(self) -> bytes:
        """Every byte, in order, as one `bytes`."""
        out = bytearray()
        for part in self.parts:
            if isinstance(part, FilePiece):
                data = os.pread(part.fd, part.length, part.offset)
                if len(data) != part.length:
                    raise OSError(f"chunk file is {part.offset + len(data)} bytes, expected at "
                                  f"least {part.offset + part.length}")
                out += data
            else:
                out += part
        return bytes(out)

    def send(self, sock: socket.socket) -> None:
        """Write every byte to `sock`: file ranges with sendfile, the rest with sendall."""
        for part in self.parts:
            if isinstance(part, FilePiece):
                with os.fdopen(part.fd, "rb", closefd=False) as f:
                    sent = sock.sendfile(f, part.offset, part.length)
                if sent != part.length:
                    raise ConnectionError(f"sent {sent} of {part.length} bytes of a chunk file")
            else:
                sock.sendall(part)

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> Pieces:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
