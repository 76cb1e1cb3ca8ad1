"""The glue between the upload controller and the uploads: what budget (bandwidth, parallel
uploads) a number of shares buys, applying it to the token bucket and the upload slots at
once, and keeping the controller on its schedule while a long upload round runs.

The controller itself (`archiver.controller`) is pure: backlog in, shares out. This module
turns its output into effect; `archiver.service.Archiver` decides when to ask.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from archiver import controller
from archiver.controller import ControllerParams, UploadBudget
from archiver.upload_limits import ConcurrencyLimit, TokenBucket

log = logging.getLogger(__name__)

#: the fastest the controller runs during a round, whatever its configured interval
MIN_CONTROLLER_TICK_S = 0.1


class UploadThrottle:
    """The bandwidth limiter and the upload slots every upload passes through, sized by the
    budget the controller's shares buy (capped by the configured maximums)."""

    def __init__(self, params: ControllerParams, *, shares: int,
                 max_bandwidth: int | None, max_concurrency: int,
                 sleep: Callable[[float], None]) -> None:
        self.params = params
        self.max_bandwidth = max_bandwidth
        self.max_concurrency = max_concurrency
        self.limiter = TokenBucket(None, sleep=sleep)
        self.budget = self.budget_for(shares)
        self.slots = ConcurrencyLimit(self.budget.concurrency)

    def budget_for(self, shares: int) -> UploadBudget:
        return controller.upload_budget(shares, self.params,
                                        max_bandwidth_bytes_per_s=self.max_bandwidth,
                                        max_concurrency=self.max_concurrency)

    def apply(self, budget: UploadBudget) -> None:
        """Make `budget` the one uploads not yet started get (and remember it)."""
        self.budget = budget
        self.limiter.set_rate(budget.bandwidth_bytes_per_s)
        self.slots.set_limit(budget.concurrency)

    @contextmanager
    def controller_running(self, update: Callable[[], object]) -> Iterator[None]:
        """Call `update` (the controller step) on its schedule while the block runs. A round
        at minimum shares can take minutes; a controller that only looked between rounds
        would see a burst late and could not speed up the very round that is falling
        behind."""
        stop = threading.Event()
        interval_s = max(self.params.update_interval_ms / 1000, MIN_CONTROLLER_TICK_S)

        def tick() -> None:
            while not stop.wait(interval_s):
                try:
                    update()
                except Exception:  # a background loop: log it, keep the round going
                    log.exception("upload controller update during an upload round failed")

        thread = threading.Thread(target=tick, name="archiver-controller", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


__all__ = ["MIN_CONTROLLER_TICK_S", "UploadThrottle"]
