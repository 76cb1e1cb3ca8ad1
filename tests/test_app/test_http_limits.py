"""The HTTP server's limits (docs/remote-read.md, "HTTP endpoint"), with raw sockets and small
limits: a slowloris client's headers are cut at the request deadline and do not keep /health
from a well-behaved client; when every connection is busy answering, one more is closed at
once; one address gets at most max_connections_per_ip; stop closes idle connections at once
and answers the request in flight."""

from __future__ import annotations

import http.client
import select
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from support.waiting import wait_until

from tiered.app.health import Health
from tiered.app.http_server import HttpServer, Response, Route
from tiered.app.metrics import make_registry
from tiered.app.serving import Limits

pytestmark = pytest.mark.timeout(120)

#: the pause between a slowloris client's bytes: far under the socket timeout and the
#: request deadline, so only the deadline on the whole request can cut it
PACE_S = 0.1
#: header bytes a slowloris client would send before its blank line: more than it gets to
HEADER = b"X-Slow: " + b"a" * 10_000


def _server(routes: Mapping[str, Route] | None = None, **limits: Any) -> HttpServer:
    return HttpServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {"status": "ok"}),
                      routes, limits=Limits(**limits))


@pytest.fixture
def strict() -> Iterator[HttpServer]:
    """4 connections, each with 1 s to send a whole request."""
    with _server(max_connections=4, request_timeout_s=1.0) as srv:
        yield srv


def _connect(srv: HttpServer, source: str = "127.0.0.1") -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10,
                                      source_address=(source, 0))
    conn.connect()
    return conn


def _health(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/health")
    response = conn.getresponse()
    response.read()
    return response.status


def _closed_by_server(conn: http.client.HTTPConnection) -> bool:
    assert conn.sock is not None
    try:
        return bool(conn.sock.recv(1) == b"")
    except ConnectionResetError:
        return True


class Slowloris:
    """Sends a request line, then its headers a byte every PACE_S until the server closes
    the connection (or `close`); counts the header bytes it got out."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        self.sent = 0
        self.closed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self.sent < len(HEADER):
                readable, _, _ = select.select([self.sock], [], [], PACE_S)
                if readable and self.sock.recv(1) == b"":
                    break
                self.sock.sendall(HEADER[self.sent:self.sent + 1])
                self.sent += 1
        except OSError:
            pass
        self.closed.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()


def test_slowloris_headers_are_cut_at_the_deadline(strict: HttpServer) -> None:
    slow = Slowloris(strict.port)
    try:
        assert slow.closed.wait(60), "the server never closed the slow request"
        assert slow.sent < len(HEADER)  # cut mid-headers, not answered after them
    finally:
        slow.close()
    assert strict.stats()["closed_slow_requests"] == 1


def test_slowloris_on_every_slot_does_not_keep_health_from_a_client(
        strict: HttpServer) -> None:
    """Four slowloris clients (limit 4) reconnect as soon as they are cut, so every slot is
    taken by one mid-request whenever the client comes: /health answers its first
    connection, each of several times."""
    stop = threading.Event()
    current: list[Slowloris] = []

    def attack() -> None:
        while not stop.is_set():
            slow = Slowloris(strict.port)
            current.append(slow)
            while not stop.is_set() and not slow.closed.wait(PACE_S):
                pass
            slow.close()

    attackers = [threading.Thread(target=attack, daemon=True) for _ in range(4)]
    for t in attackers:
        t.start()
    try:
        wait_until(lambda: strict.stats()["connections"] >= 4, "slowloris on every slot")
        for _ in range(5):
            conn = _connect(strict)
            try:
                assert _health(conn) == 200
            finally:
                conn.close()
    finally:
        stop.set()
        for t in attackers:
            t.join(30)
        for slow in current:
            slow.close()


def test_with_every_connection_busy_one_more_is_closed_at_once() -> None:
    entered, release = threading.Semaphore(0), threading.Event()

    def busy(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Response:
        entered.release()
        release.wait(30)
        return 200, {}, b"done"

    answers: list[int] = []

    def ask() -> None:
        conn = _connect(srv)
        try:
            conn.request("GET", "/busy")
            answers.append(conn.getresponse().status)
        finally:
            conn.close()

    with _server({"/busy": busy}, max_connections=2) as srv:
        askers = [threading.Thread(target=ask) for _ in range(2)]
        for t in askers:
            t.start()
        try:
            for _ in askers:
                assert entered.acquire(timeout=30)
            third = _connect(srv)
            assert _closed_by_server(third)  # no connection waits on its client: refused
            third.close()
        finally:
            release.set()
            for t in askers:
                t.join(30)
        assert answers == [200, 200]  # the busy ones were answered
        fourth = _connect(srv)
        try:
            assert _health(fourth) == 200  # a freed slot serves again
        finally:
            fourth.close()
        assert srv.stats()["connections_refused"] == 1


def test_one_address_gets_at_most_max_connections_per_ip() -> None:
    with _server(max_connections=10, max_connections_per_ip=2) as srv:
        mine = [_connect(srv) for _ in range(2)]
        try:
            assert all(_health(c) == 200 for c in mine)  # keep-alive: both stay open
            third = _connect(srv)
            assert _closed_by_server(third)  # though 8 slots are free
            third.close()
            other = _connect(srv, source="127.0.0.2")
            try:
                assert _health(other) == 200
            finally:
                other.close()
            assert all(_health(c) == 200 for c in mine)
        finally:
            for c in mine:
                c.close()


def test_stop_closes_idle_connections_and_answers_the_request_in_flight() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Response:
        entered.set()
        assert release.wait(30)
        return 200, {}, b"done"

    srv = _server({"/slow": slow})
    srv.start()
    idle = _connect(srv)
    assert _health(idle) == 200  # a keep-alive connection, now idle
    answers: list[tuple[int, bytes]] = []

    def ask() -> None:
        conn = _connect(srv)
        try:
            conn.request("GET", "/slow")
            response = conn.getresponse()
            answers.append((response.status, response.read()))
        finally:
            conn.close()

    asker = threading.Thread(target=ask)
    asker.start()
    assert entered.wait(30)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    try:
        assert _closed_by_server(idle)  # at once, not after its idle timeout
        with pytest.raises(OSError):  # the listener is closed
            socket.create_connection(("127.0.0.1", srv.port), timeout=10).close()
        assert stopper.is_alive()  # still draining the request in flight
    finally:
        release.set()
        stopper.join(30)
        asker.join(30)
        idle.close()
    assert not stopper.is_alive() and answers == [(200, b"done")]
