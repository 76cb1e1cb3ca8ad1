"""Hostile connections against the endpoint's deadlines and limits (docs/kafka-api.md, "Limits
and security"), with raw sockets and small limits: a request trickled in a byte at a time is
cut at its deadline though every byte comes well within the socket timeout; tricklers holding
every slot do not keep a well-behaved client out; one address cannot take more than
max_connections_per_ip."""

from __future__ import annotations

import select
import struct
import threading
from collections.abc import Iterator

import pytest
from support.daemons import running
from support.kafka_endpoint import History, RawClient
from support.waiting import wait_until

from tiered.app.daemon import Daemon

pytestmark = pytest.mark.timeout(120)

#: ApiVersions v0, correlation id 1, no client id: the smallest request every version serves
API_VERSIONS = b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00"
#: a frame that claims this many bytes: far more than a trickler ever sends
CLAIMED = 10_000
#: the pause between a trickler's bytes: well under the socket timeout, and under the
#: request deadline (so only the deadline on the whole request can cut it)
PACE_S = 0.1


@pytest.fixture(scope="module")
def strict(history: History) -> Iterator[Daemon]:
    """A daemon serving 4 connections, each with 1 s to send a whole request."""
    config = history.config(kafka={"max_connections": 4, "request_timeout_ms": 1000},
                            cache="cache-strict")
    with running(config) as daemon:
        yield daemon


def _port(daemon: Daemon) -> int:
    assert daemon.kafka is not None
    return daemon.kafka.port


def _served(client: RawClient) -> bool:
    client.send_frame(API_VERSIONS)
    return client.read_frame()[:4] == b"\x00\x00\x00\x01"


class Trickler:
    """A connection that sends a frame header, then one byte every PACE_S until the server
    closes it (or `stop`); counts the bytes of the frame it got out."""

    def __init__(self, port: int, *, source: str | None = None) -> None:
        self.client = RawClient(port, source=source)
        self.sent = 0
        self.closed = threading.Event()
        self._stop = threading.Event()
        self.client.sock.sendall(struct.pack(">i", CLAIMED))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock = self.client.sock
        try:
            while not self._stop.is_set() and self.sent < CLAIMED:
                # waits PACE_S for the server to close, else sends the next byte
                readable, _, _ = select.select([sock], [], [], PACE_S)
                if readable and sock.recv(1) == b"":
                    break
                sock.sendall(b"\x00")
                self.sent += 1
        except OSError:
            pass
        self.closed.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


def test_a_trickled_request_is_cut_at_its_deadline(strict: Daemon) -> None:
    """Each byte arrives a tenth of a second after the last, far within the 60 s socket
    timeout; the request as a whole must be in within request_timeout_ms = 1000."""
    before = strict.kafka.stats()["closed_slow_requests"] if strict.kafka else 0
    trickler = Trickler(_port(strict))
    try:
        assert trickler.closed.wait(60), "the server never closed the trickled request"
        assert trickler.sent < CLAIMED  # cut mid-request, not answered or refused after it
    finally:
        trickler.close()
    assert strict.kafka is not None
    assert strict.kafka.stats()["closed_slow_requests"] > before


def test_tricklers_on_every_slot_do_not_keep_a_client_out(strict: Daemon) -> None:
    """Four tricklers (limit 4) reconnect as soon as they are cut, so every slot is taken by
    one mid-request whenever the client comes: it is served on its first connection, each
    of several times."""
    port = _port(strict)
    stop = threading.Event()
    current: list[Trickler] = []

    def attack(slot: int) -> None:
        while not stop.is_set():
            trickler = Trickler(port)
            current.append(trickler)
            while not stop.is_set() and not trickler.closed.wait(PACE_S):
                pass
            trickler.close()

    attackers = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(4)]
    for t in attackers:
        t.start()
    try:
        wait_until(lambda: strict.kafka is not None
                   and strict.kafka.stats()["connections"] >= 4, "the tricklers on every slot")
        for _ in range(5):
            client = RawClient(port, timeout=10)
            try:
                assert _served(client)
            finally:
                client.close()
    finally:
        stop.set()
        for t in attackers:
            t.join(30)
        for trickler in current:
            trickler.close()


def test_at_the_limit_the_request_in_progress_the_longest_makes_room(history: History) -> None:
    """With a request timeout too long to cut anyone during the test, four tricklers hold
    every slot; a newcomer is served at once in place of the one that started first."""
    config = history.config(kafka={"max_connections": 4, "request_timeout_ms": 60_000},
                            cache="cache-reclaim")
    with running(config) as daemon:
        port = _port(daemon)
        tricklers: list[Trickler] = []
        try:
            for _ in range(4):
                tricklers.append(Trickler(port))
                # the daemon has seen this one's first byte before the next connects, so
                # the first is the oldest on its side too, however its threads are scheduled
                wait_until(lambda: daemon.kafka is not None
                           and daemon.kafka.stats()["connections_reading"] == len(tricklers),
                           "the daemon to read the trickler's request")
            client = RawClient(port, timeout=10)
            try:
                assert _served(client)
            finally:
                client.close()
            assert tricklers[0].closed.wait(30), "the oldest trickler was not reclaimed"
            assert not any(t.closed.is_set() for t in tricklers[1:])
        finally:
            for t in tricklers:
                t.close()
        assert daemon.kafka is not None
        stats = daemon.kafka.stats()
        assert stats["connections_reclaimed"] == 1 and stats["connections_refused"] == 0


def test_one_address_gets_at_most_max_connections_per_ip(history: History) -> None:
    config = history.config(kafka={"max_connections": 10, "max_connections_per_ip": 2},
                            cache="cache-per-ip")
    with running(config) as daemon:
        port = _port(daemon)
        mine = [RawClient(port, source="127.0.0.1") for _ in range(2)]
        try:
            assert all(_served(c) for c in mine)
            third = RawClient(port, source="127.0.0.1")
            assert third.closed_by_server()  # closed at once, though 8 slots are free
            third.close()
            other = RawClient(port, source="127.0.0.2")  # another address is served
            try:
                assert _served(other)
            finally:
                other.close()
            assert all(_served(c) for c in mine)  # the first two were not touched
        finally:
            for c in mine:
                c.close()
        assert daemon.kafka is not None
        assert daemon.kafka.stats()["connections_refused"] == 1
