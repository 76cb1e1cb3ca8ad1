"""The local log dirs as the read path sees them: which partitions are local and their
readable range, re-scanned at most once per TTL (docs/remote-read.md).

A fetch asks for the range first: an offset inside it is served from local files with no
store request at all. The range ends at the local log end capped by the checkpointed high
watermark, so a consumer never sees uncommitted data. New topics and rolled segments appear
at the next scan, which a fetch past the snapshot's end triggers (at most once per TTL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from cache.manifest_view import METADATA_TTL_S
from cache.segment_reads import local_log_end
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog, PartitionLog

__all__ = ["LocalRange", "LocalView"]

#: the partitions of a reader beside no broker
_NOTHING: Mapping[TopicPartition, PartitionLog] = {}
#: (the local partition, its readable start, its readable end): None where not local
LocalRange = tuple[PartitionLog | None, int | None, int | None]


class LocalView:
    """The local partitions and their readable [start, end) ranges. `local_log` None:
    nothing is local (a reader beside no broker)."""

    def __init__(self, local_log: LocalLog | None, *,
                 clock: Callable[[], float] = time.monotonic,
                 ttl_s: float = METADATA_TTL_S) -> None:
        self.local_log = local_log
        self._clock = clock
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._scanned_at = clock()

    def partitions(self) -> Mapping[TopicPartition, PartitionLog]:
        """The partitions in the log dirs now (the dirs re-scanned at most once per TTL, so
        new topics appear): the last scan's own mapping, read-only, not a copy. A scan makes
        a new one, so a caller may keep what it derived from a mapping while it gets the
        same one back (a request's lookups cost nothing per local partition)."""
        if self.local_log is None:
            return _NOTHING
        if self._clock() - self._scanned_at >= self._ttl:
            self.rescan()
        return self.local_log.partitions

    def range(self, topic: str, partition: int, offset: int | None) -> LocalRange:
        """The local partition and its readable [start, end) (end capped at the high
        watermark); rescans the log dirs (at most once per TTL) when the snapshot does not
        hold `offset` (a rolled or newly created segment)."""
        part, lo, hi = self.snapshot(topic, partition)
        stale = part is None or (offset is not None and hi is not None and offset >= hi)
        if stale and self.local_log is not None and self._clock() - self._scanned_at >= self._ttl:
            self.rescan()
            part, lo, hi = self.snapshot(topic, partition)
        return part, lo, hi

    def snapshot(self, topic: str, partition: int) -> LocalRange:
        """`range` from the last scan, without rescanning."""
        if self.local_log is None:
            return None, None, None
        part = self.local_log.partitions.get(TopicPartition(topic, partition))
        if part is None or not part.segments:
            return part, None, None
        try:
            lo, leo = part.log_start_offset, local_log_end(part)
        except FileNotFoundError:
            return None, None, None  # deleted under us: treat as not local
        if lo is None or leo is None:
            return part, None, None
        hw = part.high_watermark
        hi = leo if hw is None else min(hw, leo)
        return part, lo, max(lo, hi)

    def rescan(self) -> None:
        """List the log dirs again (retention deleted, or the broker rolled, a segment)."""
        if self.local_log is None:
            return
        with self._lock:
            self._scanned_at = self._clock()
        self.local_log.scan()
