"""The local log as the upload policy sees it: a `LogSnapshot` of a partition, with the last
offset and max timestamp of each closed segment read once and cached (a closed segment is
immutable), so every round does not re-walk every file."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection

from archiver.upload_policy import ActiveSegment, LocalSegment, LogSnapshot
from tiered.errors import CorruptSegmentError
from tiered.kafka.local_log import PartitionLog
from tiered.kafka.segment import Segment

log = logging.getLogger(__name__)


class SegmentFacts:
    """Last offset and max timestamp of closed segments, cached by (path, size, mtime): a
    closed segment is immutable, so each one is read once however many rounds see it."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], tuple[int, int]] = {}
        #: the closed segments of each partition as last described, by the PartitionLog they
        #: were described from: a scan keeps that object only while the directory is unchanged
        #: (`LocalLog`'s `reuse_unchanged`), and closed segments do not change in place
        self._closed: dict[object, tuple[PartitionLog, tuple[LocalSegment, ...]]] = {}

    def closed_of(self, part: PartitionLog) -> tuple[LocalSegment, ...]:
        """The policy's view of `part`'s closed segments, described once per PartitionLog."""
        known = self._closed.get(part.tp)
        if known is not None and known[0] is part:
            return known[1]
        segs = part.segments
        closed = tuple(self.local_segment(s, segs[i + 1].base_offset)
                       for i, s in enumerate(part.closed_segments))
        self._closed[part.tp] = (part, closed)
        return closed

    def local_segment(self, seg: Segment, next_base: int | None = None) -> LocalSegment:
        """The policy's view of closed segment `seg`. A segment too damaged to read its tail
        is described by its neighbours (it ends before `next_base`) so that the uploader
        reaches it, verifies it and refuses it with the exact position, instead of the whole
        partition failing here."""
        st = seg.log_path.stat()
        key = (str(seg.log_path), st.st_size, st.st_mtime_ns)
        mtime_ms = st.st_mtime_ns // 1_000_000
        facts = self._known.get(key)
        if facts is None:
            try:
                last = seg.last_offset()
                max_ts = seg.max_timestamp()
            except CorruptSegmentError as err:
                if next_base is None:
                    raise
                log.debug("%s: unreadable tail (%s); verification will report it",
                          seg.log_path, err)
                facts = (next_base - 1, mtime_ms)
            else:
                facts = (
                    seg.base_offset - 1 if last is None else last,
                    # Kafka falls back to the file's mtime for a segment without timestamps
                    mtime_ms if max_ts is None else max_ts,
                )
                self._known[key] = facts
        paths = tuple(str(p) for p in (seg.log_path, seg.index_path, seg.timeindex_path))
        return LocalSegment(seg.base_offset, facts[0], st.st_size, facts[1], paths)

    def forget_missing(self, partitions: Collection[object] | None = None) -> None:
        """Drop entries of files that are gone (deleted by retention), and the closed-segment
        views of partitions not in `partitions` (when given)."""
        self._known = {k: v for k, v in self._known.items() if os.path.exists(k[0])}
        if partitions is not None:
            self._closed = {tp: v for tp, v in self._closed.items() if tp in partitions}


def snapshot_of(part: PartitionLog, facts: SegmentFacts) -> LogSnapshot:
    """The partition's log for the upload policy. Without a replication-offset-checkpoint (a
    log written by tiered's own writer, no broker) the log end offset stands in for the high
    watermark: every appended record is then committed."""
    closed = facts.closed_of(part)
    active_seg = part.active_segment
    active = None
    if active_seg is not None:
        active = ActiveSegment(active_seg.base_offset, active_seg.size(),
                               (str(active_seg.log_path),))
    hw = part.high_watermark
    if hw is None:
        hw = part.log_end_offset() or 0
    return LogSnapshot(closed, active, hw)
