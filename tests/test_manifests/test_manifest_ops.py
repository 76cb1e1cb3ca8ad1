"""Pure manifest operations (manifests.edits): add, replace, retention, lookups.

Defends design invariant 4 (offsets contiguous; a gap or overlap refused at the operation, not
discovered later) and design invariant 7 (replaced objects are listed for deletion, never deleted
while still referenced).
"""

from __future__ import annotations

import pytest
from manifest_fakes import run_of, segment

from manifests import edits
from manifests.errors import CollectedName, InvalidUpdate, OffsetGap, OffsetOverlap, StaleTerm
from manifests.manifest import PartitionManifest, manifest_problem
from manifests.model import ArchiveEntry, SegmentMeta
from manifests.spillover import plan_spill
from tiered.errors import OffsetOutOfRange


def fresh(term: int = 1) -> PartitionManifest:
    return PartitionManifest.new("orders", 0, "r1", term=term)


def with_segments(n: int = 5, count: int = 100, start: int = 0) -> PartitionManifest:
    return edits.add_segments(fresh(), run_of(start, n, count))


def spilled(n: int = 400) -> PartitionManifest:
    """`n` segments of 100 offsets after a spill at a 4 KiB spillover size: some archived,
    some still in the head."""
    m = plan_spill(with_segments(n), 4096).manifest
    assert m.archives and m.segments
    return m


def valid(m: PartitionManifest) -> PartitionManifest:
    assert manifest_problem(m) is None, manifest_problem(m)
    return m


# -- add ---------------------------------------------------------------------------------------


def test_add_appends_contiguous_segments_and_tracks_totals() -> None:
    m = valid(with_segments(3))
    assert (m.start_offset, m.last_offset, m.log_start_offset) == (0, 299, 0)
    assert m.cloud_bytes == sum(s.size_bytes for s in m.segments)
    m = valid(edits.add_segments(m, [segment(300, 50)]))
    assert m.last_offset == 349 and len(m.segments) == 4


def test_first_segment_of_a_new_partition_may_start_past_zero() -> None:
    m = valid(edits.add_segments(fresh(), [segment(1000, 10)]))
    assert (m.start_offset, m.archive_start_offset, m.archive_clean_offset) == (1000, 1000, 1000)


def test_gap_is_refused_with_the_missing_offsets() -> None:
    m = with_segments(2)
    with pytest.raises(OffsetGap, match=r"gap.*offsets 200\.\.249 would be missing") as info:
        edits.add_segments(m, [segment(250, 10)])
    assert (info.value.expected, info.value.got) == (200, 250)


def test_gap_between_new_segments_is_refused() -> None:
    with pytest.raises(OffsetGap):
        edits.add_segments(with_segments(1), [segment(100, 10), segment(111, 10)])


def test_overlap_is_refused() -> None:
    m = with_segments(2)
    with pytest.raises(OffsetOverlap, match=r"overlap.*starts at offset 150.*up to 199"):
        edits.add_segments(m, [segment(150, 100)])


def test_duplicate_of_the_last_segment_is_an_overlap() -> None:
    m = with_segments(2)
    with pytest.raises(OffsetOverlap):
        edits.add_segments(m, [m.segments[-1]])


def test_refused_add_leaves_the_manifest_unchanged() -> None:
    m = with_segments(2)
    before = m.segments
    with pytest.raises(OffsetGap):
        edits.add_segments(m, [segment(200, 10), segment(300, 10)])
    assert m.segments == before and m.last_offset == 199


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (SegmentMeta(5, 4, 0, 0, 1, 1, 1, 0), "last offset 4 is before base offset 5"),
        (SegmentMeta(0, -1, 0, 0, 1, 1, 1, 0), "last_offset must be a non-negative integer"),
        (SegmentMeta(0, 9, 5, 4, 1, 1, 1, 0), "max timestamp 4 is before base timestamp 5"),
        (SegmentMeta(0, 9, 0, 0, -1, 1, 1, 0), "size_bytes"),
        (SegmentMeta(0, 9, 0, 0, 1, 1, 1, 2**32), "checksum"),
        (SegmentMeta(0, 9, 0, 0, 1, 1, 9, 0), "newer than the manifest's term"),
        (SegmentMeta(0, 9, 0, 0, 1, 1, 1, 0, name="../x"), "object name"),
        (SegmentMeta(0, 9, -2, 0, 1, 1, 1, 0), "base_timestamp"),
        (SegmentMeta(0, 9, 0, 0, 1, 1, 1, 0, compacted=1), "compacted"),  # type: ignore[arg-type]
    ],
)
def test_impossible_segment_metadata_is_refused(bad: SegmentMeta, message: str) -> None:
    with pytest.raises(InvalidUpdate, match=message):
        edits.add_segments(fresh(), [bad])


def test_reusing_an_object_name_is_refused() -> None:
    m = edits.add_segments(fresh(), [segment(0, 10, name="x.log")])
    with pytest.raises(InvalidUpdate, match="already used"):
        edits.add_segments(m, [segment(10, 10, name="x.log")])


def test_default_names_carry_base_last_and_writer_term() -> None:
    m = with_segments(1)
    seg = m.segments[0]
    assert seg.object_name == "0-99-1.log"
    assert m.segment_key(seg).endswith("/kafka/orders/0_r1/0-99-1.log")


# -- term --------------------------------------------------------------------------------------


def test_term_only_grows() -> None:
    m = fresh(term=5)
    assert edits.with_term(m, 7).term == 7
    assert edits.with_term(m, 5) is m
    with pytest.raises(StaleTerm, match="term 5, newer than this writer's term 4"):
        edits.with_term(m, 4)


# -- replace -----------------------------------------------------------------------------------


def merged_of(m: PartitionManifest, first: int, last: int, **kw: object) -> SegmentMeta:
    run = [m.segments[i] for i in range(first, last + 1)]
    return SegmentMeta(
        run[0].base_offset,
        run[-1].last_offset,
        run[0].base_timestamp,
        max(s.max_timestamp for s in run),
        sum(s.size_bytes for s in run),
        run[-1].segment_term,
        m.term,
        0xABCDEF,
        name=str(kw.get("name", f"{run[0].base_offset}-{run[-1].last_offset}-{m.term}-1.log")),
    )


def test_merge_replaces_a_contiguous_run_and_queues_the_old_objects() -> None:
    m = with_segments(5)
    merged = merged_of(m, 1, 3)
    out = valid(edits.replace_segments(m, merged, now_ms=1234))
    assert [s.base_offset for s in out.segments] == [0, 100, 400]
    assert out.segments[1] == merged
    assert [r.segment.base_offset for r in out.replaced] == [100, 200, 300]
    assert {r.replaced_at for r in out.replaced} == {1234}
    old_run = sum(m.segments[i].size_bytes for i in (1, 2, 3))
    assert out.cloud_bytes == m.cloud_bytes - old_run + merged.size_bytes


def test_compacted_reupload_replaces_one_segment() -> None:
    m = with_segments(3)
    old = m.segments[1]
    compacted = SegmentMeta(
        100, 199, old.base_timestamp, old.max_timestamp, 10, 1, 1, 7, True, "100-199-1-1.log"
    )
    out = valid(edits.replace_segments(m, compacted, now_ms=5))
    assert out.segments[1].compacted and out.replaced[0].segment == old


def test_merge_that_does_not_align_with_boundaries_is_refused() -> None:
    m = with_segments(5)
    bad = SegmentMeta(150, 399, 0, 0, 1, 1, 1, 0, name="m.log")
    with pytest.raises(InvalidUpdate, match="does not align"):
        edits.replace_segments(m, bad, now_ms=0)


def test_merge_past_the_end_is_refused() -> None:
    m = with_segments(2)
    with pytest.raises(InvalidUpdate, match="not listed"):
        edits.replace_segments(m, SegmentMeta(100, 299, 0, 0, 1, 1, 1, 0, name="m.log"), now_ms=0)


def test_merge_reusing_a_replaced_objects_name_is_refused() -> None:
    """The new object would overwrite one that the committed manifest still names."""
    m = with_segments(3)
    with pytest.raises(InvalidUpdate, match="has the name of a segment it replaces"):
        edits.replace_segments(m, merged_of(m, 0, 1, name="0-99-1.log"), now_ms=0)


def test_merge_in_the_archive_region_is_refused() -> None:
    m = spilled()
    with pytest.raises(InvalidUpdate, match="archived"):
        edits.replace_segments(m, SegmentMeta(0, 199, 0, 0, 1, 1, 1, 0, name="m.log"), now_ms=0)


# -- retention ---------------------------------------------------------------------------------


def test_retention_drops_whole_segments_below_the_new_start() -> None:
    m = with_segments(5)
    out = valid(edits.advance_start_offset(m, 250, now_ms=99))
    assert out.start_offset == out.log_start_offset == 250
    assert [s.base_offset for s in out.segments] == [200, 300, 400]  # 200..299 holds 250
    assert [r.segment.base_offset for r in out.replaced] == [0, 100]
    assert out.cloud_bytes == sum(s.size_bytes for s in out.segments)


def test_retention_never_moves_back_and_not_past_the_end() -> None:
    m = edits.advance_start_offset(with_segments(5), 300, now_ms=0)
    assert edits.advance_start_offset(m, 100, now_ms=0) is m
    with pytest.raises(InvalidUpdate, match="log ends at 499"):
        edits.advance_start_offset(m, 501, now_ms=0)


def test_retention_of_everything_leaves_an_empty_head_that_continues_at_the_end() -> None:
    m = valid(edits.advance_start_offset(with_segments(3), 300, now_ms=0))
    assert not m.segments and m.start_offset == 300 and m.last_offset == 299
    m = valid(edits.add_segments(m, [segment(300, 10)]))
    with pytest.raises(OffsetGap):
        edits.add_segments(m, [segment(320, 10)])


def test_retention_in_the_archive_region_moves_only_archive_start() -> None:
    m = spilled()
    boundary = m.archives.last_last() + 1
    out = valid(edits.advance_start_offset(m, 150, now_ms=0))
    assert out.archive_start_offset == out.log_start_offset == 150
    assert out.archives == m.archives and out.segments == m.segments
    # whole expired archives are listed for GC, oldest first
    assert all(e.last_offset < 150 for e in edits.expired_archives(out))
    out2 = valid(edits.advance_start_offset(out, boundary + 50, now_ms=0))
    assert out2.log_start_offset == boundary + 50 and out2.archive_start_offset == boundary
    assert len(edits.expired_archives(out2)) == len(out2.archives)


@pytest.mark.parametrize("past", ["second_head_segment", "everything"])
def test_retention_past_the_archives_keeps_the_manifest_valid_until_they_are_dropped(
        past: str) -> None:
    # the archives end where the head begins; dropping head segments while expired archives
    # are still listed (their objects are deleted only after the grace period) would leave a
    # hole between them that the format cannot represent: the head's first segment stays
    m = spilled()
    first = m.segments[0]
    new_start = m.segments[1].base_offset + 10 if past == "second_head_segment" else (
        m.next_offset)
    out = valid(edits.advance_start_offset(m, new_start, now_ms=0))
    assert out.segments[0] == first and out.log_start_offset == first.last_offset
    assert len(edits.expired_archives(out)) == len(out.archives)  # all of them go to GC
    # once GC dropped the archives, retention goes all the way
    gone = valid(edits.drop_expired_archives(out, len(out.archives)))
    final = valid(edits.advance_start_offset(gone, new_start, now_ms=0))
    assert final.log_start_offset == new_start
    assert not final.archives


def test_dropping_expired_archives_moves_the_clean_offset() -> None:
    m = spilled()
    assert len(m.archives) >= 2
    out = edits.advance_start_offset(m, m.archives.last_offsets[0] + 1, now_ms=0)
    assert len(edits.expired_archives(out)) == 1
    with pytest.raises(InvalidUpdate, match="refusing to drop 2"):
        edits.drop_expired_archives(out, 2)
    out = valid(edits.drop_expired_archives(out, 1))
    assert out.archive_clean_offset == out.archives.first_base() == m.archives.base_offsets[1]
    assert out.cloud_bytes == m.cloud_bytes - m.archives[0].size_bytes
    everything = edits.advance_start_offset(out, out.next_offset, now_ms=0)
    gone = valid(edits.drop_expired_archives(everything, len(everything.archives)))
    assert not gone.archives and gone.archive_clean_offset == gone.start_offset


def test_replaced_segments_become_due_after_the_grace_period() -> None:
    m = edits.advance_start_offset(with_segments(3), 200, now_ms=1000)
    assert edits.replaced_due(m, now_ms=1500, grace_ms=1000) == ()
    due = edits.replaced_due(m, now_ms=2000, grace_ms=1000)
    assert [r.segment.base_offset for r in due] == [0, 100]
    out = valid(edits.drop_replaced(m, [due[0].segment.object_name, "unknown.log"]))
    assert [r.segment.base_offset for r in out.replaced] == [100]


# -- lookups -----------------------------------------------------------------------------------


def test_find_offset_returns_the_segment_holding_it() -> None:
    m = with_segments(5)
    for offset in (0, 99, 100, 250, 499):
        seg = edits.find_offset(m, offset)
        assert isinstance(seg, SegmentMeta) and seg.base_offset <= offset <= seg.last_offset


@pytest.mark.parametrize("offset", [-1, 500, 10**12])
def test_find_offset_outside_the_log_raises_offset_out_of_range(offset: int) -> None:
    with pytest.raises(OffsetOutOfRange, match="outside the offsets in the bucket"):
        edits.find_offset(with_segments(5), offset)


def test_find_offset_below_the_log_start_is_out_of_range() -> None:
    m = edits.advance_start_offset(with_segments(5), 250, now_ms=0)
    with pytest.raises(OffsetOutOfRange):
        edits.find_offset(m, 249)
    assert edits.find_offset(m, 250).base_offset == 200


def test_find_offset_in_the_archive_region_returns_its_entry() -> None:
    m = spilled()
    hit = edits.find_offset(m, 5)
    assert isinstance(hit, ArchiveEntry) and hit.base_offset <= 5 <= hit.last_offset


def test_find_timestamp_returns_the_first_segment_reaching_it() -> None:
    m = edits.add_segments(
        fresh(), [segment(0, 10, ts=1000), segment(10, 10, ts=5000), segment(20, 10, ts=3000)]
    )
    assert edits.find_timestamp(m, 0).base_offset == 0  # type: ignore[union-attr]
    assert edits.find_timestamp(m, 1009).base_offset == 0  # type: ignore[union-attr]
    assert edits.find_timestamp(m, 1010).base_offset == 10  # type: ignore[union-attr]
    # timestamps need not grow with offsets: 3005 is first reached by segment 10..19
    assert edits.find_timestamp(m, 3005).base_offset == 10  # type: ignore[union-attr]
    assert edits.find_timestamp(m, 6000) is None


def test_iter_from_yields_segments_in_order_from_the_one_holding_the_offset() -> None:
    m = with_segments(5)
    assert [s.base_offset for s in edits.iter_from(m, 250)] == [200, 300, 400]
    assert list(edits.iter_from(m, 500)) == []
    m = edits.advance_start_offset(m, 150, now_ms=0)
    assert [s.base_offset for s in edits.iter_from(m, 0)] == [100, 200, 300, 400]


# -- garbage-collection safety -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "append"), [
    ("0-99-1.log", True),
    ("0-99-1.index", True),
    ("0-99-1.txnindex", True),
    ("0-99-1-7.log", False),
    ("0-99-1-0.log", False),
    ("00-99-1.log", False),
    ("0-99-1-7.timeindex", False),
    ("m.log", False),
    ("manifest.json", False),
])
def test_is_append_name(name: str, append: bool) -> None:
    assert edits.is_append_name(name) is append


def test_merge_under_an_appended_segments_default_name_is_refused() -> None:
    """Collection treats default names as append-only; a replacement under one could be
    deleted while its commit is in flight."""
    m = with_segments(3)
    with pytest.raises(InvalidUpdate, match="default name"):
        edits.replace_segments(m, merged_of(m, 0, 1, name="0-199-1.log"), now_ms=0)


def test_replacement_no_younger_than_the_gc_cutoff_is_refused() -> None:
    m = with_segments(3).evolve(gc_cutoff_ms=5_000)
    merged = merged_of(m, 0, 1)
    for uploaded_at in (None, 4_000, 5_000):
        with pytest.raises(CollectedName, match="cutoff 5000"):
            edits.replace_segments(m, merged, now_ms=0, uploaded_at_ms=uploaded_at)
    out = edits.replace_segments(m, merged, now_ms=0, uploaded_at_ms=6_000)
    assert out.segments[0] == merged
    # no cutoff committed yet: no collector ever deleted a replacement's object
    edits.replace_segments(m.evolve(gc_cutoff_ms=0), merged, now_ms=0)


def test_gc_cutoff_only_grows() -> None:
    m = with_segments(1)
    assert edits.raise_gc_cutoff(m, 9_000).gc_cutoff_ms == 9_000
    assert edits.raise_gc_cutoff(edits.raise_gc_cutoff(m, 9_000), 3_000).gc_cutoff_ms == 9_000
