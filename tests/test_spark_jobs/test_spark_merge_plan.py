"""Merge planning (pure): Redpanda's adjacent-segment rules over a head manifest's table."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from manifests import SegmentMeta, SegmentTable
from manifests.topic import TopicManifest
from spark_jobs.merge_plan import (
    MAX_OFFSET_SPAN,
    AdjacentSegmentRun,
    MergeLimits,
    Outcome,
    is_compacted_topic,
    merge_limits,
    plan_runs,
)
from tiered.config import parse_config

LIMITS = MergeLimits(target_bytes=1000, min_bytes=500)


def table(sizes: Sequence[int], *, terms: Sequence[int] | None = None, span: int = 10,
          gaps_before: Sequence[int] = (), compacted: Sequence[int] = ()) -> SegmentTable:
    """Segments of `span` offsets each with the given sizes; `gaps_before` lists indexes that
    start 5 offsets after the previous one ends."""
    rows, base = [], 0
    for i, size in enumerate(sizes):
        if i in gaps_before:
            base += 5
        term = terms[i] if terms is not None else 1
        rows.append(SegmentMeta(base, base + span - 1, 0, 0, size, term, 1, 0,
                                compacted=i in compacted))
        base += span
    return SegmentTable.from_rows(rows)


def spans(plan_sizes: Sequence[int], **kw: object) -> list[tuple[int, int]]:
    plan = plan_runs(table(plan_sizes, **kw), LIMITS)  # type: ignore[arg-type]
    return [(r.first_index, r.end_index) for r in plan.runs]


def test_run_struct_accepts_contiguous_same_term_segments_within_target() -> None:
    run = AdjacentSegmentRun(target_bytes=100)
    assert run.maybe_add(0, 0, 9, 40, 1)
    assert run.maybe_add(1, 10, 19, 40, 1)
    assert not run.maybe_add(2, 20, 29, 40, 1)  # 120 > 100
    assert not run.maybe_add(2, 20, 29, 10, 2)  # term change
    assert not run.maybe_add(2, 25, 29, 10, 1)  # gap
    assert run.maybe_add(2, 20, 29, 20, 1)  # exactly the target
    assert (run.segment_count, run.base_offset, run.last_offset, run.size_bytes) == (3, 0, 29, 100)


def test_small_segments_followed_by_a_large_one_merge_into_runs_within_target() -> None:
    # 10 segments of 200 bytes, then one large: runs of 5 (1000 bytes each)
    plan = plan_runs(table([200] * 10 + [2000]), LIMITS)
    assert plan.outcome is Outcome.RUNS
    assert [(r.first_index, r.end_index) for r in plan.runs] == [(0, 5), (5, 10)]
    assert all(r.size_bytes <= LIMITS.target_bytes for r in plan.runs)
    assert plan.runs[0].base_offset == 0 and plan.runs[0].last_offset == 49
    assert plan.runs[1].segment_count == 5


def test_term_change_splits_runs() -> None:
    assert spans([100, 100, 100, 100, 2000], terms=[1, 1, 2, 2, 2]) == [(0, 2), (2, 4)]


def test_gap_splits_runs() -> None:
    assert spans([100, 100, 100, 100, 2000], gaps_before=[2]) == [(0, 2), (2, 4)]


def test_large_and_compacted_segments_split_runs_and_are_never_merged() -> None:
    assert spans([100, 100, 600, 100, 100, 100, 100, 2000], compacted=[4]) == [(0, 2), (5, 7)]


def test_run_below_the_minimum_merges_when_a_large_segment_follows() -> None:
    plan = plan_runs(table([100, 100, 2000]), LIMITS)
    assert [(r.first_index, r.end_index, r.size_bytes) for r in plan.runs] == [(0, 2, 200)]


def test_tail_run_below_the_minimum_waits_for_more_data() -> None:
    plan = plan_runs(table([2000, 100, 100, 100]), LIMITS)
    assert plan.runs == ()
    assert plan.outcome is Outcome.TAIL_WAITING
    assert (plan.waiting_segments, plan.waiting_bytes) == (3, 300)


def test_tail_run_that_reaches_the_minimum_is_merged() -> None:
    plan = plan_runs(table([2000, 200, 200, 200]), LIMITS)
    assert [(r.first_index, r.end_index) for r in plan.runs] == [(1, 4)]
    assert plan.waiting_segments == 0


def test_tail_after_a_full_run_waits_while_the_full_run_merges() -> None:
    plan = plan_runs(table([300, 300, 300, 300]), LIMITS)  # 900 fits, then 300 alone at the end
    assert [(r.first_index, r.end_index) for r in plan.runs] == [(0, 3)]
    assert plan.waiting_segments == 1


def test_single_small_segment_is_not_a_run() -> None:
    plan = plan_runs(table([100, 2000, 100, 2000]), LIMITS)
    assert plan.runs == () and plan.outcome is Outcome.NOTHING_SMALL


def test_empty_table() -> None:
    assert plan_runs(SegmentTable.empty(), LIMITS).outcome is Outcome.EMPTY


@pytest.mark.parametrize("sizes", [[499, 1, 499, 1, 499, 1, 7000], [10] * 300 + [10_000]])
def test_every_run_is_within_target_and_runs_never_overlap(sizes: list[int]) -> None:
    plan = plan_runs(table(sizes), LIMITS)
    end = 0
    for r in plan.runs:
        assert r.size_bytes <= LIMITS.target_bytes
        assert r.segment_count >= 2
        assert r.first_index >= end
        end = r.end_index
    merged = sum(r.segment_count for r in plan.runs)
    assert merged == len(sizes) - 1  # every small segment but the large tail joins a run


def test_offset_span_bound_splits_runs() -> None:
    rows = [SegmentMeta(0, MAX_OFFSET_SPAN - 1, 0, 0, 10, 1, 1, 0),
            SegmentMeta(MAX_OFFSET_SPAN, MAX_OFFSET_SPAN + 5, 0, 0, 10, 1, 1, 0),
            SegmentMeta(MAX_OFFSET_SPAN + 6, MAX_OFFSET_SPAN + 9, 0, 0, 10, 1, 1, 0),
            SegmentMeta(MAX_OFFSET_SPAN + 10, MAX_OFFSET_SPAN + 10, 0, 0, 10_000, 1, 1, 0)]
    plan = plan_runs(SegmentTable.from_rows(rows), LIMITS)
    assert [(r.first_index, r.end_index) for r in plan.runs] == [(1, 3)]


def test_limits_default_to_the_topic_segment_size() -> None:
    config = parse_config({"storage": {"url": "file:///tmp/b"},
                           "topics": {"t": {"segment.bytes": 4096}}}, source="t.toml")
    assert merge_limits(config.cluster, config.topic_config("t")) == MergeLimits(4096, 2048)
    # no override in the file: the segment size recorded in the bucket's topic manifest
    tm = TopicManifest("u", "1", 1, segment_bytes=8192)
    assert merge_limits(config.cluster, config.topic_config("u"), tm) == MergeLimits(8192, 4096)


def test_cluster_limits_override_the_defaults() -> None:
    config = parse_config({"storage": {"url": "file:///tmp/b"},
                           "cluster": {"cloud_storage_segment_size_target": 10_000,
                                       "cloud_storage_segment_size_min": 3000}},
                          source="t.toml")
    assert merge_limits(config.cluster, config.topic_config("t")) == MergeLimits(10_000, 3000)


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="min"):
        MergeLimits(target_bytes=100, min_bytes=200)


def test_compacted_topics_are_recognised() -> None:
    config = parse_config({"storage": {"url": "file:///tmp/b"},
                           "topics": {"c": {"cleanup.policy": "compact,delete"}}},
                          source="t.toml")
    assert is_compacted_topic(config.topic_config("c"))
    assert not is_compacted_topic(config.topic_config("d"))
    assert is_compacted_topic(config.topic_config("d"),
                              TopicManifest("d", "1", 1, cleanup_policy="compact"))
