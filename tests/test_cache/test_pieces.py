"""`Pieces.send`: file ranges go out with sendfile to a peer on another host and from a mapping
of the file to one on this host; either way the peer gets exactly the bytes, in order. Bytes
and mapped ranges next to each other (a response's headers and its body) leave in one
`sendmsg`, which may send part of them at a time."""

from __future__ import annotations

import mmap
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache import fetched_bytes as pieces_module
from cache.fetched_bytes import FilePiece, Pieces
from cache.mapped import MappedFile


def _drain(sock: socket.socket, into: list[bytes]) -> threading.Thread:
    def run() -> None:
        while chunk := sock.recv(1 << 16):
            into.append(chunk)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture
def loopback() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP connection over 127.0.0.1: (server side, client side)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        yield conn, client
        conn.close()
        client.close()


@pytest.fixture
def data_file(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    data = os.urandom(3 * mmap.ALLOCATIONGRANULARITY + 1234)
    path = tmp_path / "chunk"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def _pieces(fd: int, data: bytes, *, mapped: bool) -> tuple[Pieces, bytes]:
    """A header, two ranges of the file (one not page-aligned) and a trailer."""
    out = Pieces()
    shared = MappedFile(os.dup(fd), len(data)) if mapped else None
    mapping = None if shared is None else shared.mapping
    out.add(b"head")
    out.add(FilePiece(fd, 5, 4000, mapping))
    out.add(FilePiece(fd, mmap.ALLOCATIONGRANULARITY + 17, 9000, mapping))
    out.add(b"tail")
    if shared is not None:
        out.adopt([shared])
    want = b"head" + data[5:4005] + data[mmap.ALLOCATIONGRANULARITY + 17:][:9000] + b"tail"
    return out, want


@pytest.fixture
def sendfile_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per `os.sendfile` call from here on."""
    calls: list[int] = []
    real = os.sendfile
    monkeypatch.setattr(pieces_module.os, "sendfile",
                        lambda *a: calls.append(1) or real(*a))  # type: ignore[func-returns-value]
    return calls


@pytest.fixture
def sendmsg_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(bytes offered, bytes sent) per `socket.sendmsg` call from here on."""
    calls: list[tuple[int, int]] = []
    real = socket.socket.sendmsg

    def counted(sock: socket.socket, buffers: list[memoryview], *args: object) -> int:
        sent = real(sock, buffers, *args)  # type: ignore[arg-type]
        calls.append((sum(len(b) for b in buffers), sent))
        return sent

    monkeypatch.setattr(socket.socket, "sendmsg", counted)
    return calls


def _sent(body: Pieces, ours: socket.socket, theirs: socket.socket, head: bytes = b"",
          tail: bytes = b"") -> bytes:
    """What `theirs` receives when `body` is sent on `ours` between `head` and `tail`."""
    got: list[bytes] = []
    reader = _drain(theirs, got)
    with body:
        body.send(ours, head=head, tail=tail)
    ours.shutdown(socket.SHUT_WR)
    reader.join()
    return b"".join(got)


@pytest.mark.parametrize("mapped", [False, True], ids=["own mapping", "fetch's mapping"])
def test_a_loopback_peer_gets_the_ranges_from_a_mapping(
        loopback: tuple[socket.socket, socket.socket], data_file: tuple[int, bytes],
        mapped: bool, sendfile_calls: list[int]) -> None:
    conn, client = loopback
    fd, data = data_file
    assert pieces_module._mapped_is_cheaper(conn)
    body, want = _pieces(fd, data, mapped=mapped)
    assert _sent(body, conn, client) == want
    assert sendfile_calls == []  # no sendfile to this peer


def test_a_peer_on_another_host_gets_the_ranges_with_sendfile(
        data_file: tuple[int, bytes], sendfile_calls: list[int]) -> None:
    """A socket whose peer is not a loopback address (here a socket pair, which has no
    address) is sent file ranges with sendfile, mapping or not."""
    fd, data = data_file
    ours, theirs = socket.socketpair()
    try:
        assert not pieces_module._mapped_is_cheaper(ours)
        body, want = _pieces(fd, data, mapped=True)
        assert _sent(body, ours, theirs) == want
        assert sendfile_calls
    finally:
        ours.close()
        theirs.close()


def test_a_file_shorter_than_its_range_is_refused_before_it_is_mapped(
        loopback: tuple[socket.socket, socket.socket], data_file: tuple[int, bytes]) -> None:
    """Touching a mapped page past the end of a file kills the process (SIGBUS): a range
    the file no longer holds is an error, as a short sendfile is."""
    conn, _client = loopback
    fd, data = data_file
    body = Pieces()
    body.add(FilePiece(fd, len(data) - 10, 100))
    with body, pytest.raises(ConnectionError, match="expected at least"):
        body.send(conn)


def test_a_head_and_mapped_ranges_leave_in_one_sendmsg(
        loopback: tuple[socket.socket, socket.socket], data_file: tuple[int, bytes],
        sendmsg_calls: list[tuple[int, int]]) -> None:
    """A response's headers, its body's bytes and mapped ranges, and what follows them go
    out together: over loopback each send wakes the receiver."""
    conn, client = loopback
    fd, data = data_file
    body, want = _pieces(fd, data, mapped=True)
    assert _sent(body, conn, client, head=b"HTTP/1.1 200 OK\r\n\r\n", tail=b"!") == (
        b"HTTP/1.1 200 OK\r\n\r\n" + want + b"!")
    assert len(sendmsg_calls) == 1
    assert sendmsg_calls[0] == (len(want) + 20, len(want) + 20)


def test_a_send_the_socket_takes_part_of_goes_on_where_it_stopped(
        loopback: tuple[socket.socket, socket.socket], tmp_path: Path,
        sendmsg_calls: list[tuple[int, int]]) -> None:
    """A socket with a timeout (as the HTTP server's are) takes what fits in its buffer per
    call: the rest follows, every byte once and in order, across buffer boundaries."""
    conn, client = loopback
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    conn.settimeout(10)
    data = os.urandom(3 << 20)
    path = tmp_path / "big"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        shared = MappedFile(os.dup(fd), len(data))
        body = Pieces()
        body.add(FilePiece(fd, 1, (1 << 20) - 1, shared.mapping))
        body.add(b"between")
        body.add(FilePiece(fd, 1 << 20, 2 << 20, shared.mapping))
        body.adopt([shared])
        got = _sent(body, conn, client, head=b"head")
        assert got == b"head" + data[1:1 << 20] + b"between" + data[1 << 20:]
        assert any(sent < offered for offered, sent in sendmsg_calls)  # it did stop short
    finally:
        os.close(fd)


def test_a_head_goes_before_a_range_sent_with_sendfile(
        data_file: tuple[int, bytes], sendfile_calls: list[int]) -> None:
    """To a peer on another host the head goes out first (held for the file's first pages),
    then the ranges with sendfile, then the tail."""
    fd, data = data_file
    ours, theirs = socket.socketpair()
    try:
        body, want = _pieces(fd, data, mapped=False)
        assert _sent(body, ours, theirs, head=b"H", tail=b"T") == b"H" + want + b"T"
        assert sendfile_calls
    finally:
        ours.close()
        theirs.close()


def test_a_socket_that_takes_nothing_is_an_error_not_a_spin() -> None:
    """`sendmsg` answering 0 for bytes offered is not progress: the send gives up."""

    class Stuck:
        def getpeername(self) -> tuple[str, int]:
            return ("127.0.0.1", 9)

        def sendmsg(self, buffers: list[memoryview], *args: object) -> int:
            return 0

    body = Pieces()
    body.add(b"some bytes")
    with body, pytest.raises(ConnectionError, match="took none"):
        body.send(Stuck(), head=b"head")  # type: ignore[arg-type]
