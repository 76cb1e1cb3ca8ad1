"""`Pieces.send`: file ranges go out with sendfile to a peer on another host and from a mapping
of the file to one on this host; either way the peer gets exactly the bytes, in order."""

from __future__ import annotations

import mmap
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache import pieces as pieces_module
from cache.pieces import FilePiece, Pieces


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
    mapping = mmap.mmap(fd, len(data), prot=mmap.PROT_READ) if mapped else None
    out.add(b"head")
    out.add(FilePiece(fd, 5, 4000, mapping))
    out.add(FilePiece(fd, mmap.ALLOCATIONGRANULARITY + 17, 9000, mapping))
    out.add(b"tail")
    if mapping is not None:
        out.adopt([], [mapping])
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


def _sent(body: Pieces, ours: socket.socket, theirs: socket.socket) -> bytes:
    """What `theirs` receives when `body` is sent on `ours`."""
    got: list[bytes] = []
    reader = _drain(theirs, got)
    with body:
        body.send(ours)
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
