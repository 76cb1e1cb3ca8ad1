"""S3's streamed GET body (`S3Store.open_range`): `readinto` takes the bytes straight from the
HTTP response, counts them, and a body that ends short is an error, never a quiet end."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import botocore.exceptions
import pytest
from support.s3 import no_sleep, s3_settings

from tiered.store import S3Store


def test_readinto_brings_the_range_and_counts_it(s3_store: S3Store) -> None:
    data = os.urandom(1_500_000)
    s3_store.put("seg/s.log", data)
    before = s3_store.stats.snapshot()["bytes_read"]
    body = s3_store.open_range("seg/s.log", 0, len(data))
    buf = memoryview(bytearray(1 << 20))
    got = bytearray()
    while n := body.readinto(buf[:300_000]):
        got += buf[:n]
    body.close()
    assert got == data
    assert s3_store.stats.snapshot()["bytes_read"] - before == len(data)


class _ShortBody(BaseHTTPRequestHandler):
    """Answers every GET with a Content-Length of 1000 and hangs up after 400 bytes."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"x" * 400)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def short_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ShortBody)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_body_that_ends_short_raises(short_server: str) -> None:
    store = S3Store(s3_settings(short_server, "short-bucket"), sleep=no_sleep)
    try:
        body = store.open_range("seg/s.log", 0, 1000)
        buf = memoryview(bytearray(4096))
        got = 0
        with pytest.raises(botocore.exceptions.IncompleteReadError):
            while n := body.readinto(buf):
                got += n
        assert got == 400
        body.close()
    finally:
        store.close()


class _Recording(BaseHTTPRequestHandler):
    """Answers every GET with 1000 bytes of the range asked for, recording its Range header."""

    protocol_version = "HTTP/1.1"
    ranges: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        asked = self.headers.get("Range")
        type(self).ranges.append(asked)
        body = b"y" * 1000
        if asked is not None:
            first, last = (int(x) for x in asked.removeprefix("bytes=").split("-"))
            body = body[first:last + 1]
        self.send_response(206 if asked else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_only_a_stream_to_the_object_s_end_goes_without_a_range() -> None:
    """A read-ahead to the end may ask for the whole object (moto streams that at once); any
    other stream, one chunk from byte 0 included, asks for exactly its range."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = S3Store(s3_settings(f"http://127.0.0.1:{server.server_address[1]}", "rec-bucket"),
                    sleep=no_sleep)
    _Recording.ranges = []
    try:
        for begin, end, to_end in ((0, 1000, True), (0, 400, False), (400, 1000, True)):
            body = store.open_range("seg/s.log", begin, end, to_end=to_end)
            assert body.read(end - begin) == b"y" * (end - begin)
            body.close()
    finally:
        store.close()
        server.shutdown()
        server.server_close()
    assert _Recording.ranges == [None, "bytes=0-399", "bytes=400-999"]
