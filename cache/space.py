"""Room in the cache: reserving space for a chunk, trimming, releasing, the periodic check.

This is the disk-wide part of the cache (as Redpanda's `cache_service` is): how many bytes and
objects the cache holds against its limits (`cache.accounting`), and which chunks go when
there is not enough room, in the order the eviction strategy gives (`cache.eviction`). Before
a download the cache reserves the chunk's bytes and one object, trimming unheld chunks in the
strategy's order; when everything is held it may go over its limits by one chunk at most, and
past that a read waits for room (then fails with CacheFullError). After a read the strategy
says which chunks of the segment to let go (eager eviction drops a chunk its readers are done
with). `start` runs the cache's periodic check (`cloud_storage_cache_check_interval_ms`) on a
daemon thread that the cache's `close` stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from cache.accounting import CacheLimits, plan_trim
from cache.chunk_entries import CacheEntry
from cache.errors import CacheFullError
from cache.eviction import ChunkId, ChunkView, EvictionStrategy, SegmentSnapshot
from cache.state import CacheState
from cache.write_behind import WriteBehind

__all__ = ["Space"]

log = logging.getLogger(__name__)


class Space:
    """Space accounting and trimming over `state` (see the module docstring). Methods expect
    the caller to hold the state's lock."""

    def __init__(self, state: CacheState, strategy: EvictionStrategy, limits: CacheLimits,
                 write_behind: WriteBehind, *, reserve_timeout_s: float) -> None:
        self.state = state
        self.strategy = strategy
        self.limits = limits
        self._write_behind = write_behind
        self._reserve_timeout_s = reserve_timeout_s
        self._thread: threading.Thread | None = None

    def reserve(self, size: int, *, wait: bool) -> None:
        """Make room for `size` more bytes and one more object (the caller adds the entry under
        the same lock). Trims to the thresholds; when held chunks prevent that, goes over the
        hard limits only if not over them already (so by one chunk at most), else waits."""
        state, limits = self.state, self.limits
        deadline = time.monotonic() + self._reserve_timeout_s
        while True:
            self.trim(size, 1)
            used, objects = state.used_bytes + size, len(state.entries) + 1
            if used <= limits.max_bytes and objects <= limits.max_objects:
                return
            if wait and state.used_bytes <= limits.max_bytes and (
                len(state.entries) <= limits.max_objects
            ):
                state.counters["overshoots"] += 1
                return
            remaining = deadline - time.monotonic()
            if not wait or remaining <= 0:
                raise CacheFullError(
                    f"cache full: {state.used_bytes} of {limits.max_bytes} bytes and "
                    f"{len(state.entries)} of {limits.max_objects} objects, held by "
                    f"{len(state.readers)} readers; no room for {size} more bytes"
                )
            state.cond.wait(remaining)

    def trim(self, incoming_bytes: int, incoming_objects: int) -> None:
        """Remove chunks in the strategy's victim order until the cache plus what is coming is
        within the trim thresholds: unheld chunks first, then, only if that is not enough,
        chunks readers are merely positioned in (a position hold must not deadlock readers
        that each wait for room). A chunk being read or downloaded is never removed."""
        state, limits = self.state, self.limits
        target_bytes = min(limits.trim_bytes, limits.max_bytes) - incoming_bytes
        target_objects = min(limits.trim_objects, limits.max_objects) - incoming_objects
        if state.used_bytes <= target_bytes and len(state.entries) <= target_objects:
            return
        views = self._with_needs([self._view(e) for e in state.entries.values()])
        order = self.strategy.victim_order(views)
        soft = [v._replace(held=False) for v in views
                if v.held and not state.is_pinned(state.entries[v.id])]
        order += self.strategy.victim_order(soft)
        victims = plan_trim(
            [(c, state.entries[c].size) for c in order],
            state.used_bytes, len(state.entries),
            target_bytes=target_bytes, target_objects=target_objects,
        )
        for chunk in victims:
            state.evict(state.entries[chunk])

    def apply_release(self, segment: str) -> None:
        """Ask the strategy which chunks of `segment` to let go now."""
        state = self.state
        ids = state.by_segment.get(segment)
        if not ids:
            return
        views = self._with_needs([self._view(state.entries[c]) for c in ids])
        seg = state.segments.get(segment)
        total = len(seg.starts) if seg is not None else len(views)
        for chunk in self.strategy.release(SegmentSnapshot(segment, total, tuple(views))):
            entry = state.entries.get(chunk)
            if entry is not None and not state.is_held(entry):
                state.evict(entry)
        self._write_behind.write_unheld(segment)  # kept although let go of

    def release_holds(self, chunks: Sequence[ChunkId]) -> None:
        for segment in dict.fromkeys(c.segment for c in chunks):
            self.apply_release(segment)
        if chunks:
            self.state.cond.notify_all()

    def _view(self, entry: CacheEntry) -> ChunkView:
        return ChunkView(entry.chunk, entry.size, entry.last_access, self.state.is_held(entry))

    def _with_needs(self, views: list[ChunkView]) -> list[ChunkView]:
        if not self.strategy.uses_future:
            return views
        needs = self.state.readers.future_needs()
        out = []
        for v in views:
            count, nearest = needs.get(v.id, (0, None))
            out.append(v._replace(future_readers=count, next_need=nearest))
        return out

    # ------------------------------------------------------------------ periodic check
    def start(self, check: Callable[[], None]) -> None:
        """Run `check` every `cloud_storage_cache_check_interval_ms` on a daemon thread, until
        the state's stop is set (takes no lock)."""
        if self._thread is not None:
            return
        self.state.stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(check,), name="cache-check",
                                        daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait for the check thread to end (the state's stop is set)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self, check: Callable[[], None]) -> None:
        interval = self.state.settings.check_interval_ms / 1000
        while not self.state.stop.wait(interval):
            try:
                check()
            except Exception:  # keep checking; a bad pass must not end the thread
                log.exception("cache check failed")
