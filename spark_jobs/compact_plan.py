"""Planning compaction of a partition's history in the bucket: pure functions, no I/O.

Kafka's cleaner, applied to the head manifest's segments (docs/compaction.md):

* only segments whose newest record is older than `min.compaction.lag.ms` are cleanable, and
  only a prefix of them (Kafka's "first uncleanable offset": records after it neither are
  cleaned nor supersede anything);
* segments not yet compacted (`compacted = 0`) are dirty; the dirty ratio is their share of the
  cleanable bytes. A partition is due when that ratio reaches `min.cleanable.dirty.ratio`, or
  when its oldest dirty record is older than `max.compaction.lag.ms`;
* a pass rewrites the whole cleanable prefix (a new key may supersede records in segments
  compacted before), but re-uploads only what it changes and what was dirty;
* compacted copies of adjacent segments are combined up to the segment size target
  (`group_outputs`), in one term and within 2**31 offsets, as a merge would.

Archived manifests are immutable, so segments already spilled out of the head are neither
rewritten nor read: their records are older than every head record and supersede nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from manifests.model import SegmentTable
from spark_jobs.merge_plan import MAX_OFFSET_SPAN


@dataclass(frozen=True)
class CompactionSettings:
    """One topic's compaction properties (resolved from its configuration)."""

    delete_retention_ms: int | None
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int | None
    min_cleanable_dirty_ratio: float
    target_bytes: int


class Due(enum.Enum):
    """Why a partition is (or is not) compacted now."""

    DIRTY_RATIO = "dirty ratio reached min.cleanable.dirty.ratio"
    MAX_LAG = "oldest uncompacted record is older than max.compaction.lag.ms"
    EMPTY = "no segments in the head manifest"
    NOT_CLEANABLE = "no segment is older than min.compaction.lag.ms yet"
    CLEAN = "every cleanable segment is already compacted"
    BELOW_RATIO = "dirty ratio below min.cleanable.dirty.ratio"

    @property
    def due(self) -> bool:
        return self in (Due.DIRTY_RATIO, Due.MAX_LAG)


@dataclass(frozen=True)
class CompactionPlan:
    """A partition's state for compaction: rows `[0, cleanable)` of the head's table are
    cleanable; `dirty_bytes` of their `cleanable_bytes` are not compacted yet."""

    cleanable: int
    cleanable_bytes: int
    dirty_bytes: int
    dirty_segments: int
    verdict: Due

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.cleanable_bytes if self.cleanable_bytes else 0.0

    @property
    def due(self) -> bool:
        return self.verdict.due


def plan_compaction(
    segments: SegmentTable, settings: CompactionSettings, *, now_ms: int
) -> CompactionPlan:
    """Whether the head's segments are due for compaction at `now_ms`, and which are cleanable."""
    n = len(segments)
    if n == 0:
        return CompactionPlan(0, 0, 0, 0, Due.EMPTY)
    max_ts = segments.column("max_timestamp")
    base_ts = segments.column("base_timestamp")
    size = segments.column("size_bytes")
    compacted = segments.column("compacted")
    horizon = now_ms - settings.min_compaction_lag_ms
    cleanable = 0
    while cleanable < n and max_ts[cleanable] <= horizon:
        cleanable += 1
    if cleanable == 0:
        return CompactionPlan(0, 0, 0, 0, Due.NOT_CLEANABLE)
    total = sum(size[:cleanable])
    dirty_rows = [i for i in range(cleanable) if not compacted[i]]
    dirty = sum(size[i] for i in dirty_rows)
    if not dirty_rows:
        return CompactionPlan(cleanable, total, 0, 0, Due.CLEAN)
    ratio = dirty / total if total else 1.0
    if ratio >= settings.min_cleanable_dirty_ratio:
        verdict = Due.DIRTY_RATIO
    elif settings.max_compaction_lag_ms is not None and min(
        base_ts[i] for i in dirty_rows
    ) <= now_ms - settings.max_compaction_lag_ms:
        verdict = Due.MAX_LAG
    else:
        verdict = Due.BELOW_RATIO
    return CompactionPlan(cleanable, total, dirty, len(dirty_rows), verdict)


class Cleaned(NamedTuple):
    """What the executors made of one cleanable segment (row `row` of the head's table)."""

    row: int
    base_offset: int
    last_offset: int
    segment_term: int
    #: bytes of the compacted copy (0: every batch went)
    size: int
    #: the copy differs from the object
    changed: bool
    #: the object already was a compacted copy
    was_compacted: bool


@dataclass(frozen=True)
class Group:
    """Cleaned segments (rows `first..last` of the head's table) that become one object."""

    first: int
    last: int
    base_offset: int
    last_offset: int
    segment_term: int
    size: int


def group_outputs(cleaned: Sequence[Cleaned], target_bytes: int) -> list[Group]:
    """Groups of adjacent compacted copies to upload, each up to `target_bytes` (a copy larger
    than the target stands alone), in one term, spanning fewer than 2**31 offsets. A group
    is uploaded only when it changes something: a member was changed or was dirty, or it
    combines several objects. A second pass over unchanged, compacted segments finds the
    groups the first made and uploads nothing."""
    groups: list[Group] = []
    run: list[Cleaned] = []
    run_bytes = 0

    def close() -> None:
        if not run:
            return
        needed = len(run) > 1 or run[0].changed or not run[0].was_compacted
        if needed:
            groups.append(Group(run[0].row, run[-1].row, run[0].base_offset,
                                run[-1].last_offset, run[0].segment_term,
                                run_bytes))
        run.clear()

    for c in sorted(cleaned, key=lambda c: c.row):
        if run and (
            c.row != run[-1].row + 1
            or c.base_offset != run[-1].last_offset + 1
            or c.segment_term != run[0].segment_term
            or run_bytes + c.size > target_bytes
            or c.last_offset - run[0].base_offset > MAX_OFFSET_SPAN
        ):
            close()
            run_bytes = 0
        run.append(c)
        run_bytes += c.size
    close()
    return groups
