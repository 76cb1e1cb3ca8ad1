"""Upload candidate selection (archiver/upload_policy.py), design invariant 3 and 4."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archiver.upload_policy import (
    DECISION_LOG_LEVEL,
    ActiveSegment,
    ArchivalState,
    BatchBoundary,
    Gap,
    LocalSegment,
    LogSnapshot,
    PolicyInputError,
    UploadDecision,
    UploadKind,
    UploadParams,
    idle_upload_due,
    plan_uploads,
)
from tiered.errors import ConfigError

NOW = 10_000_000


def seg(base: int, last: int, size: int = 1000, ts: int = 0) -> LocalSegment:
    return LocalSegment(base, last, size, ts, (f"{base:020d}.log", f"{base:020d}.index"))


def snapshot(
    closed: list[LocalSegment],
    active: ActiveSegment | None,
    hwm: int,
    lso: int | None = None,
) -> LogSnapshot:
    return LogSnapshot(tuple(closed), active, hwm, lso)


def state(manifest_last: int | None, last_upload_ms: int = NOW) -> ArchivalState:
    return ArchivalState(manifest_last, last_upload_ms)


def batches(active_base: int, *counts: int, size: int = 100) -> list[BatchBoundary]:
    """Consecutive batches of `counts` records each, `size` bytes each, from `active_base`."""
    out, offset, pos = [], active_base, 0
    for n in counts:
        out.append(BatchBoundary(pos, size, offset, offset + n - 1, 1_000 + offset))
        offset += n
        pos += size
    return out


THREE = [seg(0, 99), seg(100, 199), seg(200, 299)]
ACTIVE = ActiveSegment(300, 500, ("00000000000000000300.log",))


# --- inputs ----------------------------------------------------------------------------------


def test_malformed_segments_are_refused() -> None:
    with pytest.raises(PolicyInputError, match="negative"):
        LocalSegment(-1, 5, 10, 0)
    with pytest.raises(PolicyInputError, match="below its base"):
        LocalSegment(10, 5, 10, 0)
    with pytest.raises(PolicyInputError, match="overlaps"):
        snapshot([seg(0, 99), seg(50, 150)], None, 200)
    with pytest.raises(PolicyInputError, match="does not follow"):
        snapshot([seg(0, 99)], ActiveSegment(99, 10), 200)
    # two files cannot share a base offset, even when the first is empty
    with pytest.raises(PolicyInputError, match="overlaps"):
        snapshot([LocalSegment(100, 99, 0, 0), seg(100, 199)], None, 200)


def test_params_validate_and_read_the_seed_property() -> None:
    assert UploadParams().segment_max_upload_interval_sec is None  # seed: empty by default
    params = UploadParams.from_cluster({"cloud_storage_segment_max_upload_interval_sec": 600})
    assert params.idle_interval_ms == 600_000
    with pytest.raises(ConfigError, match="cloud_storage_segment_max_upload_interval_sec"):
        UploadParams.from_cluster({"cloud_storage_segment_max_upload_interval_sec": "10m"})
    with pytest.raises(ConfigError, match="cloud_storage_segment_max_upload_interval_sec"):
        UploadParams(segment_max_upload_interval_sec=0)
    with pytest.raises(ConfigError, match="per round"):
        UploadParams(max_candidates_per_round=0)


def test_every_decision_has_a_log_level() -> None:
    assert set(DECISION_LOG_LEVEL) == set(UploadDecision)


# --- closed segments -------------------------------------------------------------------------


def test_empty_manifest_uploads_closed_segments_oldest_first() -> None:
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350), state(None), UploadParams(), NOW)
    assert plan.decision is UploadDecision.UPLOAD
    assert [c.begin_inclusive for c in plan.candidates] == [0, 100, 200]
    first = plan.candidates[0]
    assert first.kind is UploadKind.SEGMENT
    assert (first.begin_inclusive, first.end_exclusive, first.last_offset) == (0, 100, 99)
    assert (first.byte_begin_inclusive, first.byte_end_exclusive) == (0, 1000)
    assert first.paths == ("00000000000000000000.log", "00000000000000000000.index")
    # never the active segment
    assert all(c.segment_base_offset != ACTIVE.base_offset for c in plan.candidates)


def test_continues_after_the_manifest() -> None:
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350), state(99), UploadParams(), NOW)
    assert [c.segment_base_offset for c in plan.candidates] == [100, 200]


def test_at_most_n_per_round() -> None:
    params = UploadParams(max_candidates_per_round=2)
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350), state(None), params, NOW)
    assert [c.segment_base_offset for c in plan.candidates] == [0, 100]


def test_only_segments_below_the_high_watermark() -> None:
    # the last closed segment ends at 299 but only offsets < 250 are committed
    plan = plan_uploads(snapshot(THREE, ACTIVE, 250), state(None), UploadParams(), NOW)
    assert [c.segment_base_offset for c in plan.candidates] == [0, 100]
    plan = plan_uploads(snapshot(THREE, ACTIVE, 299), state(199), UploadParams(), NOW)
    assert plan.decision is UploadDecision.WAIT
    assert plan.candidates == ()


def test_the_last_stable_offset_bounds_uploads_too() -> None:
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350, lso=150), state(None), UploadParams(), NOW)
    assert [c.segment_base_offset for c in plan.candidates] == [0]


def test_up_to_date_and_wait() -> None:
    empty_active = ActiveSegment(300, 0)
    plan = plan_uploads(snapshot(THREE, empty_active, 300), state(299), UploadParams(), NOW)
    assert plan.decision is UploadDecision.UP_TO_DATE
    # data in the active segment only, no idle timeout configured: wait for it to close
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350), state(299), UploadParams(), NOW)
    assert plan.decision is UploadDecision.WAIT


def test_empty_segments_are_skipped() -> None:
    closed = [LocalSegment(0, -1, 0, 0), seg(1, 99), seg(100, 199)]
    plan = plan_uploads(snapshot(closed, ACTIVE, 350), state(None), UploadParams(), NOW)
    assert [c.segment_base_offset for c in plan.candidates] == [1, 100]
    assert all(c.end_exclusive > c.begin_inclusive for c in plan.candidates)


def test_gap_between_manifest_and_local_data_is_a_value() -> None:
    # local retention removed 100..149 before it was uploaded
    closed = [seg(150, 199), seg(200, 299)]
    plan = plan_uploads(snapshot(closed, ACTIVE, 350), state(99), UploadParams(), NOW)
    assert plan.decision is UploadDecision.GAP
    assert plan.gap == Gap(100, 150)
    assert plan.gap.missing_offsets == 50
    assert plan.candidates == ()


def test_a_gap_after_a_contiguous_run_uploads_the_run_first() -> None:
    closed = [seg(100, 199), seg(250, 299)]
    plan = plan_uploads(snapshot(closed, ACTIVE, 350), state(99), UploadParams(), NOW)
    assert plan.decision is UploadDecision.UPLOAD
    assert [c.segment_base_offset for c in plan.candidates] == [100]
    # once that run is committed, the next round reports the gap
    plan = plan_uploads(snapshot(closed, ACTIVE, 350), state(199), UploadParams(), NOW)
    assert plan.gap == Gap(200, 250)


def test_gap_up_to_the_active_segment() -> None:
    plan = plan_uploads(snapshot([], ACTIVE, 350), state(199), UploadParams(), NOW)
    assert plan.decision is UploadDecision.GAP
    assert plan.gap == Gap(200, 300)


def test_manifest_ahead_of_the_local_log() -> None:
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350), state(400), UploadParams(), NOW)
    assert plan.decision is UploadDecision.MANIFEST_AHEAD
    assert plan.candidates == ()


def test_suffix_of_a_segment_whose_head_an_idle_upload_took() -> None:
    # an idle-timeout upload covered 200..249 while 200.. was active; now it is closed
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350), state(249), UploadParams(), NOW)
    (cand,) = plan.candidates
    assert cand.kind is UploadKind.SEGMENT_SUFFIX
    assert (cand.begin_inclusive, cand.end_exclusive) == (250, 300)
    assert cand.byte_begin_inclusive is None  # the caller seeks 250 with the offset index
    assert cand.byte_end_exclusive == 1000


# --- idle timeout ----------------------------------------------------------------------------

IDLE = UploadParams(segment_max_upload_interval_sec=600)
LONG_AGO = NOW - 600_000


def test_idle_upload_needs_the_interval_set_and_elapsed() -> None:
    log = snapshot(THREE, ACTIVE, 350)
    assert not idle_upload_due(log, state(299, LONG_AGO), UploadParams(), NOW)
    assert not idle_upload_due(log, state(299, LONG_AGO + 1), IDLE, NOW)
    assert idle_upload_due(log, state(299, LONG_AGO), IDLE, NOW)
    # nothing stable past the manifest in the active segment: not due
    assert not idle_upload_due(snapshot(THREE, ACTIVE, 300), state(299, LONG_AGO), IDLE, NOW)
    assert not idle_upload_due(log, state(349, LONG_AGO), IDLE, NOW)


def test_idle_timeout_asks_for_batch_boundaries() -> None:
    plan = plan_uploads(snapshot(THREE, ACTIVE, 350), state(299, LONG_AGO), IDLE, NOW)
    assert plan.decision is UploadDecision.NEEDS_ACTIVE_BATCHES


def test_idle_timeout_uploads_whole_batches_below_the_high_watermark() -> None:
    active_batches = batches(300, 10, 20, 30, 40)  # 300..309, 310..329, 330..359, 360..399
    plan = plan_uploads(
        snapshot(THREE, ACTIVE, 345), state(299, LONG_AGO), IDLE, NOW, active_batches
    )
    assert plan.decision is UploadDecision.UPLOAD
    (cand,) = plan.candidates
    assert cand.kind is UploadKind.STABLE_PREFIX
    assert (cand.begin_inclusive, cand.end_exclusive) == (300, 330)  # 330..359 straddles 345
    assert (cand.byte_begin_inclusive, cand.byte_end_exclusive) == (0, 200)
    assert cand.max_timestamp_ms == 1_310
    assert cand.paths == ACTIVE.paths


def test_idle_timeout_not_due_uploads_nothing_from_the_active_segment() -> None:
    plan = plan_uploads(
        snapshot(THREE, ACTIVE, 345), state(299, NOW - 1), IDLE, NOW, batches(300, 10, 20)
    )
    assert plan.decision is UploadDecision.WAIT


def test_a_second_idle_upload_continues_after_the_first() -> None:
    active_batches = batches(300, 10, 20, 30)
    plan = plan_uploads(
        snapshot(THREE, ACTIVE, 400), state(309, LONG_AGO), IDLE, NOW, active_batches
    )
    (cand,) = plan.candidates
    assert (cand.begin_inclusive, cand.end_exclusive) == (310, 360)
    assert (cand.byte_begin_inclusive, cand.byte_end_exclusive) == (100, 300)


def test_idle_prefix_follows_the_closed_candidates_in_the_same_round() -> None:
    plan = plan_uploads(
        snapshot(THREE, ACTIVE, 400), state(199, LONG_AGO), IDLE, NOW, batches(300, 10)
    )
    assert [c.kind for c in plan.candidates] == [UploadKind.SEGMENT, UploadKind.STABLE_PREFIX]
    assert [c.begin_inclusive for c in plan.candidates] == [200, 300]


def test_manifest_inside_an_active_batch_is_an_overlap() -> None:
    plan = plan_uploads(
        snapshot(THREE, ACTIVE, 400), state(305, LONG_AGO), IDLE, NOW, batches(300, 10, 10)
    )
    assert plan.decision is UploadDecision.OVERLAP


def test_active_batches_that_skip_offsets_are_a_gap() -> None:
    skipping = [BatchBoundary(0, 100, 300, 309, 0), BatchBoundary(100, 100, 320, 329, 0)]
    plan = plan_uploads(snapshot(THREE, ACTIVE, 400), state(309, LONG_AGO), IDLE, NOW, skipping)
    assert plan.decision is UploadDecision.GAP
    assert plan.gap == Gap(310, 320)


@pytest.mark.parametrize(
    "bad",
    [
        [BatchBoundary(0, 0, 300, 309, 0)],  # empty batch
        [BatchBoundary(0, 100, 290, 309, 0)],  # before the active segment
        [BatchBoundary(0, 100, 300, 309, 0), BatchBoundary(150, 100, 310, 319, 0)],  # hole
        [BatchBoundary(0, 100, 300, 309, 0), BatchBoundary(100, 100, 305, 319, 0)],  # overlap
    ],
)
def test_malformed_batch_boundaries_are_refused(bad: list[BatchBoundary]) -> None:
    with pytest.raises(PolicyInputError):
        plan_uploads(snapshot(THREE, ACTIVE, 400), state(299, LONG_AGO), IDLE, NOW, bad)


# --- properties ------------------------------------------------------------------------------


@st.composite
def logs(draw: st.DrawFn) -> tuple[LogSnapshot, ArchivalState, UploadParams, list[BatchBoundary]]:
    sizes = draw(st.lists(st.integers(0, 30), min_size=0, max_size=8))
    closed, offset = [], draw(st.integers(0, 50))
    for n in sizes:
        closed.append(LocalSegment(offset, offset + n - 1, n * 10, 0))
        # sometimes a gap; an empty segment still takes its base offset (the file's name)
        offset += max(n, 1) + draw(st.sampled_from([0, 0, 0, 5]))
    counts = draw(st.lists(st.integers(1, 10), max_size=5))
    active_batches = batches(offset, *counts)
    active = ActiveSegment(offset, sum(b.size for b in active_batches))
    log_end = offset + sum(counts)
    hwm = draw(st.integers(0, log_end))
    lso = draw(st.none() | st.integers(0, log_end))
    manifest_last = draw(st.none() | st.integers(-1, log_end + 5))
    params = UploadParams(
        segment_max_upload_interval_sec=draw(st.none() | st.just(1)),
        max_candidates_per_round=draw(st.integers(1, 4)),
    )
    log = LogSnapshot(tuple(closed), active, hwm, lso)
    return log, state(manifest_last, 0), params, active_batches


@given(logs())
def test_candidates_are_contiguous_stable_and_bounded(
    case: tuple[LogSnapshot, ArchivalState, UploadParams, list[BatchBoundary]],
) -> None:
    log, st_, params, active_batches = case
    plan = plan_uploads(log, st_, params, NOW, active_batches)
    assert len(plan.candidates) <= params.max_candidates_per_round
    assert (plan.decision is UploadDecision.UPLOAD) == bool(plan.candidates)
    expected = None if st_.manifest_last_offset is None else st_.manifest_last_offset + 1
    for cand in plan.candidates:
        # design invariant 4: each candidate continues the manifest (or the previous candidate)
        if expected is not None:
            assert cand.begin_inclusive == expected
        assert cand.end_exclusive > cand.begin_inclusive
        # design invariant 3: nothing at or past the stable end, the active segment only by idle
        # timeout
        assert cand.last_offset < log.stable_end_exclusive
        if cand.kind is UploadKind.STABLE_PREFIX:
            assert log.active is not None and cand.segment_base_offset == log.active.base_offset
            assert params.segment_max_upload_interval_sec is not None
        else:
            assert cand.segment_base_offset in {s.base_offset for s in log.closed}
        expected = cand.end_exclusive
    if plan.decision is UploadDecision.GAP:
        assert plan.gap is not None and plan.gap.missing_offsets > 0
