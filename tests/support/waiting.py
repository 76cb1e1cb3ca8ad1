"""Waiting on a condition with a deadline, never a bare sleep: a test proceeds as soon as the
condition holds and fails, naming what it waited for, when it does not in time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], what: str = "the condition",
               timeout_s: float = 30.0, interval_s: float = 0.01) -> None:
    """Return once `condition()` is truthy; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
