"""Store-wide scheduling of multipart parts (see `PartScheduler`)."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class PartScheduler:
    """Sends the parts of every multipart upload of one store, first submitted first sent,
    with `max(concurrency, uploads in flight)` of them on the wire at once.

    Why one queue for the store, as s3transfer's TransferManager and the aws CLI have: pools
    per upload, sized as each upload started, froze an uneven split (in a round of eight
    segments the first got 4 parts in flight, the next 2, the others 1; once the first two
    were done only 6 requests were left on the wire) and let side-by-side uploads finish
    together, so all their CompleteMultipartUpload requests hit the store at once at the end.
    First in, first out finishes the oldest segment first (its commit, and the local disk it
    frees, come sooner) while the parts behind it keep the wire full. The limit keeps what
    the store's settings promise: an upload alone gets `concurrency` parts at once; uploads
    side by side, about one request each, since they are the parallelism then.

    Tasks are leaves (a part never waits for another), so the shared workers cannot
    deadlock. The queue is strict: a worker takes the oldest part, and only when the limit
    has room, so no late part overtakes an earlier one.
    """

    def __init__(self, concurrency: int, max_workers: int) -> None:
        self._concurrency = max(1, concurrency)
        self._max_workers = max(max_workers, self._concurrency)
        self._cond = threading.Condition()
        self._queue: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._uploads = 0
        self._sending = 0
        self._workers: list[threading.Thread] = []
        self._closed = False

    @property
    def limit(self) -> int:
        """Parts allowed on the wire now."""
        with self._cond:
            return self._limit()

    def _limit(self) -> int:
        return max(self._concurrency, self._uploads)

    @contextlib.contextmanager
    def upload(self) -> Iterator[None]:
        """Count one multipart upload in flight (each raises the limit past `concurrency`)."""
        with self._cond:
            self._uploads += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._uploads -= 1

    def submit(self, send: Callable[[], T]) -> Future[T]:
        """Queue one part; `send` runs on a worker once the parts before it have started and
        the limit has room. Cancelling the future before then keeps it from running."""
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("part scheduler is shut down")
            self._queue.append((future, send))
            if len(self._workers) < min(self._max_workers, self._limit()):
                worker = threading.Thread(target=self._work, name="tiered-part", daemon=True)
                self._workers.append(worker)
                worker.start()
            self._cond.notify_all()
        return future

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._queue and self._sending < self._limit()):
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
                future, send = self._queue.popleft()
                if not future.set_running_or_notify_cancel():
                    continue  # cancelled while queued
                self._sending += 1
            try:
                future.set_result(send())
            except BaseException as exc:  # the caller's to see, through the future
                future.set_exception(exc)
            finally:
                with self._cond:
                    self._sending -= 1
                    self._cond.notify_all()

    def shutdown(self) -> None:
        """Drop the parts not started; wait for those being sent."""
        with self._cond:
            self._closed = True
            while self._queue:
                future, _ = self._queue.popleft()
                future.cancel()
            self._cond.notify_all()
            workers = list(self._workers)
        for worker in workers:
            worker.join()
