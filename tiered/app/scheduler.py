"""When the daemon's jobs run: a single-threaded scheduler of periodic jobs, and the upload
loop's backoff.

Intervals run from the end of a job's run to its next start, so a slow run never causes a
burst of catch-up runs; when several jobs are due they run in the order they were added.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["UPLOAD_BACKOFF_MAX_S", "UPLOAD_BACKOFF_MIN_S", "Scheduler", "Stopper", "Waker",
           "next_upload_delay"]

#: upload-loop backoff while there is nothing to upload (Redpanda's defaults), in seconds
UPLOAD_BACKOFF_MIN_S = 0.1
UPLOAD_BACKOFF_MAX_S = 10.0


class Stopper(Protocol):
    """What the scheduler waits on: `threading.Event` in production, a fake in tests."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def set(self) -> None: ...


@dataclass
class _Entry:
    name: str
    interval_s: float
    action: Callable[[], float | None]
    due_s: float
    #: `Scheduler.request` asked for a run as soon as possible (set from any thread)
    requested: bool = False


class Waker:
    """A stop event that can also be woken without being set: `Scheduler.run` waits on it,
    and `wake` (another thread asking for a job now) ends that wait early."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._set = False
        self._woken = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._cond:
            self._set = True
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._set or self._woken, timeout)
            self._woken = False
            return self._set


class Scheduler:
    """Runs named jobs when due, on an injected monotonic `clock` (seconds).

    A job's action returns the delay before its next run, or None for its regular interval.
    Every job is due at once after `add`; jobs due together run in the order they were added.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: list[_Entry] = []

    def add(self, name: str, interval_s: float, action: Callable[[], float | None]) -> None:
        if interval_s <= 0:
            raise ValueError(f"job {name!r}: interval must be positive, got {interval_s}")
        self._entries.append(_Entry(name, interval_s, action, self._clock()))

    def run_pending(self, stop: Stopper | None = None) -> list[str]:
        """Run every job that is due now (checking `stop` between jobs); returns their names."""
        ran = []
        for entry in self._entries:
            if stop is not None and stop.is_set():
                break
            if entry.due_s <= self._clock() or entry.requested:
                entry.requested = False
                delay = entry.action()
                entry.due_s = self._clock() + (entry.interval_s if delay is None else delay)
                if entry.requested:  # asked for again while it ran
                    entry.due_s = self._clock()
                ran.append(entry.name)
        return ran

    def request(self, name: str) -> None:
        """Run job `name` as soon as the scheduler is free (thread-safe; the caller wakes the
        scheduler's wait, see `Waker`)."""
        for entry in self._entries:
            if entry.name == name:
                entry.requested = True

    def seconds_until_due(self) -> float:
        """How long until the next job is due (0 when one already is)."""
        if not self._entries:
            return float("inf")
        if any(e.requested for e in self._entries):
            return 0.0
        return max(0.0, min(e.due_s for e in self._entries) - self._clock())

    def run(self, stop: Stopper) -> None:
        """Run jobs as they fall due until `stop` is set; sleeping is `stop.wait`, so a stop
        request ends the wait at once."""
        while not stop.is_set():
            self.run_pending(stop)
            if stop.is_set():
                break
            stop.wait(self.seconds_until_due())


def next_upload_delay(previous_s: float | None, made_progress: bool) -> float:
    """Delay before the next upload round, in seconds: none after progress (a round uploads
    a bounded number of segments per partition, so more may be waiting), otherwise a backoff
    that doubles from UPLOAD_BACKOFF_MIN_S up to UPLOAD_BACKOFF_MAX_S."""
    if made_progress:
        return 0.0
    if previous_s is None or previous_s < UPLOAD_BACKOFF_MIN_S:
        return UPLOAD_BACKOFF_MIN_S
    return min(previous_s * 2, UPLOAD_BACKOFF_MAX_S)
