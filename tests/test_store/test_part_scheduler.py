"""The store-wide queue of multipart parts: first in, first out, `max(concurrency, uploads)`
on the wire (no I/O: parts are stand-in callables)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from tiered.store.multipart import PartScheduler


class Parts:
    """Stand-in parts that record when they start and hold until released one by one."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._gates: dict[int, threading.Event] = {}

    def part(self, n: int) -> Callable[[], int]:
        gate = self._gates[n] = threading.Event()

        def send() -> int:
            with self._lock:
                self.started.append(n)
                self.running += 1
                self.peak = max(self.peak, self.running)
            assert gate.wait(10)
            with self._lock:
                self.running -= 1
            return n

        return send

    def release(self, n: int) -> None:
        self._gates[n].set()

    def wait_started(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.started) < count:
            assert time.monotonic() < deadline, self.started
            time.sleep(0.005)
        time.sleep(0.05)  # and no more than that start meanwhile


def test_an_upload_alone_gets_the_concurrency_in_first_in_first_out_order() -> None:
    scheduler, parts = PartScheduler(concurrency=2, max_workers=6), Parts()
    with scheduler.upload():
        futures = [scheduler.submit(parts.part(n)) for n in range(6)]
        parts.wait_started(2)
        assert parts.started == [0, 1]
        for n in range(6):  # each part done lets exactly the next one in
            parts.release(n)
            if n + 2 < 6:
                parts.wait_started(n + 3)
        assert [f.result(timeout=10) for f in futures] == list(range(6))
    assert parts.started == list(range(6)) and parts.peak == 2
    scheduler.shutdown()


def test_uploads_side_by_side_get_about_one_request_each_oldest_first() -> None:
    scheduler, parts = PartScheduler(concurrency=2, max_workers=8), Parts()
    with scheduler.upload(), scheduler.upload(), scheduler.upload():
        assert scheduler.limit == 3
        # upload A queued its parts first: they go before B's, three at a time
        first = [scheduler.submit(parts.part(n)) for n in (0, 1, 2, 3)]
        second = [scheduler.submit(parts.part(n)) for n in (10, 11)]
        parts.wait_started(3)
        assert parts.started == [0, 1, 2]
        for n in (0, 1, 2, 3, 10, 11):
            parts.release(n)
        assert [f.result(timeout=10) for f in first + second] == [0, 1, 2, 3, 10, 11]
    assert parts.started == [0, 1, 2, 3, 10, 11] and parts.peak == 3
    assert scheduler.limit == 2  # back to the concurrency once they are done
    scheduler.shutdown()


def test_a_part_that_fails_frees_its_place_and_shutdown_drops_the_queue() -> None:
    scheduler, parts = PartScheduler(concurrency=1, max_workers=1), Parts()

    def broken() -> int:
        raise OSError("connection reset")

    with scheduler.upload():
        failed = scheduler.submit(broken)
        with pytest.raises(OSError, match="reset"):
            failed.result(timeout=10)
        held = scheduler.submit(parts.part(1))
        queued = scheduler.submit(parts.part(2))
        parts.wait_started(1)
        threading.Timer(0.1, parts.release, (1,)).start()
        scheduler.shutdown()  # waits for the part on the wire, drops the one queued
    assert held.result() == 1 and queued.cancelled() and parts.started == [1]
