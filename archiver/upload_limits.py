"""The upload budget, enforced: a token bucket for bandwidth and a concurrency limit, each
shared by every upload thread and adjustable while uploads run (the controller changes the
budget mid-round, not only between rounds).

The store's `put_file` streams a whole object in one call, so the limiter works per object:
an upload takes its size in tokens up front, and the bucket may go into debt for an object
larger than its capacity, the *next* upload then waiting until the debt is paid. The average
rate over any window longer than one object is therefore the configured rate, which is what the
upload controller's budget asks for (in Redpanda, shares set the write path's bandwidth). The
clock and sleep are injected so tests run without real time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from archiver.upload_policy import PolicyInputError


class TokenBucket:
    """`rate` bytes per second (None: unthrottled), at most `burst_seconds` of rate saved up.

    Thread-safe: many upload threads call `acquire`; `set_rate` may be called at any time when
    the controller changes the budget (a sleep already begun is not shortened)."""

    def __init__(
        self,
        rate: int | None,
        *,
        burst_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if burst_seconds <= 0:
            raise PolicyInputError(f"burst must be positive, got {burst_seconds}s")
        self._clock = clock
        self._sleep = sleep
        self._burst_seconds = burst_seconds
        self._lock = threading.Lock()
        self._rate: int | None = None
        self._tokens = 0.0
        self._stamp = clock()
        #: seconds spent waiting for tokens, for metrics and tests
        self.waited_seconds = 0.0
        self.set_rate(rate)

    @property
    def rate(self) -> int | None:
        return self._rate

    def set_rate(self, rate: int | None) -> None:
        if rate is not None and rate < 1:
            raise PolicyInputError(f"bandwidth must be at least 1 byte/s or None, got {rate}")
        with self._lock:
            self._refill()
            self._rate = rate
            if rate is not None:
                self._tokens = min(self._tokens, rate * self._burst_seconds)

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._stamp)
        self._stamp = now
        if self._rate is not None:
            self._tokens = min(self._tokens + elapsed * self._rate,
                               self._rate * self._burst_seconds)

    def acquire(self, nbytes: int) -> float:
        """Take `nbytes` tokens, sleeping first while the bucket is in debt; returns the
        seconds slept. Unthrottled buckets return at once."""
        if nbytes < 0:
            raise PolicyInputError(f"cannot acquire a negative byte count ({nbytes})")
        with self._lock:
            if self._rate is None:
                return 0.0
            self._refill()
            wait = max(0.0, -self._tokens / self._rate)
            self._tokens -= nbytes
            self.waited_seconds += wait
        if wait > 0:
            self._sleep(wait)
        return wait


class ConcurrencyLimit:
    """At most `limit` holders at once, the limit settable at any time.

    A semaphore whose size the upload controller changes while uploads run: raising it lets
    waiting uploads start at once; lowering it lets the uploads in flight finish and holds
    back new ones until they are under the new limit."""

    def __init__(self, limit: int) -> None:
        self._cond = threading.Condition()
        self._limit = 1
        self._held = 0
        self._waiting = 0
        self.set_limit(limit)

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        """Holders blocked for a slot right now."""
        return self._waiting

    def set_limit(self, limit: int) -> None:
        if isinstance(limit, bool) or limit < 1:
            raise PolicyInputError(f"concurrency must be at least 1, got {limit}")
        with self._cond:
            self._limit = limit
            self._cond.notify_all()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """One slot for the duration of the block, waiting for one first if none is free."""
        with self._cond:
            self._waiting += 1
            while self._held >= self._limit:
                self._cond.wait()
            self._waiting -= 1
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify()
