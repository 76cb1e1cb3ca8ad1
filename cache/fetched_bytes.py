"""A fetch's bytes where they lie: pieces read from the local log, and ranges of open chunk
files of the read cache, in order. The HTTP and Kafka endpoints send them without passing the
file ranges through Python (`Pieces.send`: sendfile, or a mapping to a peer on this host, with
the response's own bytes in the same `sendmsg`); other callers read them into one `bytes`.
Chunk files were verified when they were downloaded, so a range of one is served as it is
(docs/design.md, remote read)."""

from __future__ import annotations

import functools
import ipaddress
import mmap
import os
import socket
import ssl
from collections.abc import Iterable
from typing import NamedTuple

from cache.mapped import MappedFile

__all__ = ["FilePiece", "Pieces"]


class FilePiece(NamedTuple):
    """`length` bytes at `offset` of the open file `fd`; `mapping`, when given, maps the file
    from its start (read-only), so the range can be sent without mapping it again."""

    fd: int
    offset: int
    length: int
    mapping: mmap.mmap | None = None


class Pieces:
    """Ordered `bytes` and `FilePiece`s; owns the shares of mapped files handed to `adopt` (a
    share keeps an evicted chunk file readable until it is sent). Close it when done."""

    def __init__(self) -> None:
        self.parts: list[bytes | FilePiece] = []
        self.size = 0
        self._shared: list[MappedFile] = []

    def __bool__(self) -> bool:
        return bool(self.parts)

    def add(self, part: bytes | FilePiece) -> None:
        length = part.length if isinstance(part, FilePiece) else len(part)
        if length:
            self.parts.append(part)
            self.size += length

    @property
    def files(self) -> int:
        """Shares of chunk files held (each at most one open descriptor and mapping)."""
        return len(self._shared)

    def adopt(self, shared: Iterable[MappedFile]) -> None:
        """Release these shares of mapped files (`cache.mapped`) with this object."""
        self._shared.extend(shared)

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

    def send(self, sock: socket.socket, head: bytes = b"", tail: bytes = b"") -> None:
        """Write `head`, every byte, then `tail` to `sock`: file ranges from a mapping of the
        file to a peer on this host (see `_mapped_is_cheaper`), with sendfile to one on
        another host. Bytes and mapped ranges next to each other go out in one `sendmsg`:
        over loopback every send is a trip through the receiver's TCP stack and wakes it, so
        a response's headers sent on their own cost about as much as its body."""
        mapped = _mapped_is_cheaper(sock)
        gathered = _Gathered(sock)
        try:
            gathered.add(head)
            for part in self.parts:
                if not isinstance(part, FilePiece):
                    gathered.add(part)
                elif mapped and part.mapping is not None:
                    with memoryview(part.mapping) as whole:
                        gathered.add(whole[part.offset:part.offset + part.length])
                elif mapped:
                    gathered.flush(more=True)
                    _send_mapped(sock, part)
                else:
                    gathered.flush(more=True)  # the headers wait for the file's first pages
                    with os.fdopen(part.fd, "rb", closefd=False) as f:
                        sent = sock.sendfile(f, part.offset, part.length)
                    if sent != part.length:
                        raise ConnectionError(
                            f"sent {sent} of {part.length} bytes of a chunk file")
            gathered.add(tail)
            gathered.flush()
        finally:
            gathered.release()

    def close(self) -> None:
        shared, self._shared = self._shared, []
        for mapped in shared:
            mapped.release()

    def __enter__(self) -> Pieces:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: buffers per sendmsg call, well under the kernel's IOV_MAX (1024)
_MAX_BUFFERS = 256
#: "more follows": Linux may hold a partial packet back for the bytes sent next
_MSG_MORE = getattr(socket, "MSG_MORE", 0)


class _Gathered:
    """Buffers waiting to go out on `sock` together, in one `sendmsg` where the socket has
    one (a TLS socket has not: it gets them one by one)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffers: list[memoryview] = []

    def add(self, data: bytes | memoryview) -> None:
        if len(data):
            self._buffers.append(data if isinstance(data, memoryview) else memoryview(data))

    def flush(self, *, more: bool = False) -> None:
        """Send everything added; `more`: more bytes follow at once (they may share a
        packet with these)."""
        buffers, self._buffers = self._buffers, []
        try:
            if isinstance(self._sock, ssl.SSLSocket):
                for view in buffers:
                    self._sock.sendall(view)
                return
            flags = _MSG_MORE if more else 0
            first, rest = 0, 0  # the first buffer not sent whole, and how much of it went
            while first < len(buffers):
                with buffers[first][rest:] as partial:
                    batch = [partial, *buffers[first + 1:first + _MAX_BUFFERS]]
                    sent = self._sock.sendmsg(batch, (), flags)
                    del batch
                if not sent:  # not a TCP socket's answer to bytes offered; never spin on it
                    raise ConnectionError("the socket took none of the bytes offered")
                sent += rest
                while first < len(buffers) and sent >= len(buffers[first]):
                    sent -= len(buffers[first])
                    first += 1
                rest = sent
        finally:
            for view in buffers:
                view.release()

    def release(self) -> None:
        """Drop what was not sent (after an error): the views must not keep mappings."""
        buffers, self._buffers = self._buffers, []
        for view in buffers:
            view.release()


def _mapped_is_cheaper(sock: socket.socket) -> bool:
    """Whether `sock`'s peer is on this host. Over loopback no network card takes the pages
    straight from the page cache, and sendfile's per-page bookkeeping costs the sender and
    the receiver about 2.4 times the CPU of a send from a mapping of the same file
    (docs/remote-read.md); over a network sendfile saves the copy into socket buffers."""
    try:
        peer = sock.getpeername()
    except OSError:
        return False
    return isinstance(peer, tuple) and _is_loopback(peer[0])


@functools.lru_cache(maxsize=1024)
def _is_loopback(host: str) -> bool:
    """Asked for every fetch's connection: the address parse is cached per host."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _send_mapped(sock: socket.socket, part: FilePiece) -> None:
    """Send a file range from a read-only mapping of it: the kernel copies the pages into the
    socket, no copy passes through Python. Chunk files are never changed in place (written
    aside and renamed, removed by unlinking), so the range stays mapped whole; a file found
    shorter than the range is refused before it is touched."""
    end = part.offset + part.length
    size = os.fstat(part.fd).st_size
    if size < end:
        raise ConnectionError(f"chunk file is {size} bytes, expected at least {end}")
    start = part.offset - part.offset % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(part.fd, end - start, offset=start, prot=mmap.PROT_READ) as mapping, \
            memoryview(mapping) as whole, whole[part.offset - start:] as view:
        sock.sendall(view)
