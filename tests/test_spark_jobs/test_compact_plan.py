"""When a partition is due for compaction and how cleaned segments are grouped: pure policy,
no Spark, no bucket (the folder marks it slow; it starts nothing)."""

from __future__ import annotations

from manifests.model import SegmentMeta, SegmentTable
from spark_jobs.compact_plan import (
    Cleaned,
    CompactionSettings,
    Due,
    group_outputs,
    plan_compaction,
)

NOW = 10_000_000


def table(*rows: tuple[int, int, bool]) -> SegmentTable:
    """Segments of 10 offsets each: (max timestamp, size, compacted)."""
    return SegmentTable.from_rows(
        SegmentMeta(i * 10, i * 10 + 9, ts - 100, ts, size, 1, 1, 0, compacted)
        for i, (ts, size, compacted) in enumerate(rows))


def settings(**kw: object) -> CompactionSettings:
    base: dict[str, object] = dict(delete_retention_ms=1000, min_compaction_lag_ms=0,
                                   max_compaction_lag_ms=None, min_cleanable_dirty_ratio=0.5,
                                   target_bytes=1000)
    base.update(kw)
    return CompactionSettings(**base)  # type: ignore[arg-type]


def test_dirty_ratio_decides() -> None:
    segs = table((1, 600, True), (2, 400, False))
    plan = plan_compaction(segs, settings(), now_ms=NOW)
    assert plan.verdict is Due.BELOW_RATIO and plan.dirty_ratio == 0.4 and not plan.due
    assert plan_compaction(segs, settings(min_cleanable_dirty_ratio=0.4), now_ms=NOW).due


def test_max_lag_forces_a_partition_below_the_ratio() -> None:
    segs = table((1, 900, True), (NOW - 5000, 100, False))
    assert not plan_compaction(segs, settings(max_compaction_lag_ms=6000), now_ms=NOW).due
    plan = plan_compaction(segs, settings(max_compaction_lag_ms=4000), now_ms=NOW)
    assert plan.verdict is Due.MAX_LAG


def test_min_lag_cuts_the_cleanable_prefix_at_the_first_young_segment() -> None:
    segs = table((1, 100, False), (NOW - 10, 100, False), (2, 100, False))
    plan = plan_compaction(segs, settings(min_compaction_lag_ms=100), now_ms=NOW)
    assert plan.cleanable == 1 and plan.due
    plan = plan_compaction(table((NOW, 1, False)), settings(min_compaction_lag_ms=1), now_ms=NOW)
    assert plan.verdict is Due.NOT_CLEANABLE


def test_clean_and_empty_partitions_are_not_due() -> None:
    assert plan_compaction(table((1, 5, True)), settings(), now_ms=NOW).verdict is Due.CLEAN
    assert plan_compaction(SegmentTable.empty(), settings(), now_ms=NOW).verdict is Due.EMPTY


def c(row: int, size: int, changed: bool = True, was: bool = False, term: int = 1) -> Cleaned:
    return Cleaned(row, row * 10, row * 10 + 9, term, size, changed, was)


def test_groups_combine_up_to_the_target_within_a_term() -> None:
    groups = group_outputs([c(0, 400), c(1, 500), c(2, 300), c(3, 0), c(4, 10, term=2)], 1000)
    assert [(g.first, g.last) for g in groups] == [(0, 1), (2, 3), (4, 4)]
    assert groups[1].size == 300 and groups[1].last_offset == 39


def test_unchanged_compacted_segments_alone_are_not_uploaded_again() -> None:
    assert group_outputs([c(0, 800, False, True), c(1, 900, False, True)], 1000) == []
    # a dirty segment is uploaded even unchanged: it becomes a compacted copy
    assert len(group_outputs([c(0, 800, False, False)], 1000)) == 1
