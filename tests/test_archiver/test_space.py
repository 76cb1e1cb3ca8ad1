"""Local retention, space management and disk alerts (archiver/space.py); design invariant 2."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiver.space import (
    Advice,
    Deletion,
    DiskAlert,
    DiskInfo,
    PartitionView,
    Phase,
    RetentionLimits,
    SpaceOutcome,
    SpaceParams,
    SpacePlan,
    advise,
    disk_alert_state,
    plan_local_retention,
    plan_space_management,
    safe_delete_below,
    upload_backlog_bytes,
)
from archiver.upload_policy import LocalSegment, PolicyInputError
from tiered.errors import ConfigError

HOUR = 3_600_000
NOW = 1_000 * HOUR
UNLIMITED = RetentionLimits()


def view(
    name: str = "t",
    *,
    partition: int = 0,
    n: int = 5,
    size: int = 100,
    ages_h: list[int] | None = None,
    uploaded: int | None = 10**9,
    remote_write: bool = True,
    local: RetentionLimits = UNLIMITED,
    explicit: bool = False,
    retention: RetentionLimits = UNLIMITED,
    active_size: int = 0,
) -> PartitionView:
    """`n` closed segments of 10 offsets and `size` bytes each; segment i is ages_h[i] hours
    old (default: oldest first, n..1 hours)."""
    ages = ages_h if ages_h is not None else list(range(n, 0, -1))
    segments = tuple(
        LocalSegment(10 * i, 10 * i + 9, size, NOW - ages[i] * HOUR, (f"{name}-{i}.log",))
        for i in range(n)
    )
    if uploaded == 10**9:
        uploaded = 10 * n - 1  # everything closed is uploaded
    return PartitionView(
        name, partition, segments, 10 * n, active_size, uploaded, remote_write, local,
        explicit, retention,
    )  # fmt: skip


def deleted(deletions: list[Deletion] | tuple[Deletion, ...]) -> list[tuple[str, int]]:
    return [(d.topic, d.segment.base_offset) for d in deletions]


def no_min_free(**kw: object) -> SpaceParams:
    return SpaceParams(storage_min_free_bytes=0, **kw)  # type: ignore[arg-type]


# --- views and params ------------------------------------------------------------------------


def test_views_refuse_inconsistent_logs() -> None:
    a, b = LocalSegment(0, 9, 1, 0), LocalSegment(5, 19, 1, 0)
    with pytest.raises(PolicyInputError, match="overlaps"):
        PartitionView("t", 0, (a, b), 20, 0, None, True, UNLIMITED, False, UNLIMITED)
    with pytest.raises(PolicyInputError, match="active segment"):
        PartitionView("t", 0, (a,), 9, 0, None, True, UNLIMITED, False, UNLIMITED)
    with pytest.raises(PolicyInputError):
        RetentionLimits(ms=-1)
    with pytest.raises(PolicyInputError):
        DiskInfo(-1, 0)


def test_space_params_from_cluster() -> None:
    assert SpaceParams.from_cluster({}) == SpaceParams()
    params = SpaceParams.from_cluster(
        {"retention_local_strict": True, "disk_reservation_percent": 10, "other": 1}
    )
    assert params.retention_local_strict and params.disk_reservation_percent == 10
    assert SpaceParams().storage_min_free_bytes == 5 * 1024**3  # as Redpanda documents: 5 GB


@pytest.mark.parametrize(
    ("props", "key"),
    [
        ({"disk_reservation_percent": 120}, "disk_reservation_percent"),
        ({"disk_reservation_percent": None}, "disk_reservation_percent"),
        ({"retention_local_strict": "yes"}, "retention_local_strict"),
        ({"storage_min_free_bytes": -5}, "storage_min_free_bytes"),
        ({"storage_min_free_bytes": 1.5}, "storage_min_free_bytes"),
        (
            {"retention_local_target_capacity_percent": True},
            "retention_local_target_capacity_percent",
        ),
    ],
)
def test_bad_space_params_name_the_key(props: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        SpaceParams.from_cluster(props)


def test_target_capacity() -> None:
    disk = DiskInfo(total_bytes=1000, free_bytes=500, cache_reserved_bytes=200)
    # default: what is left after the 20 % reservation and the cache
    assert SpaceParams().target_bytes(disk) == 600
    assert SpaceParams(retention_local_target_capacity_bytes=300).target_bytes(disk) == 300
    assert SpaceParams(retention_local_target_capacity_percent=50).target_bytes(disk) == 500
    both = SpaceParams(
        retention_local_target_capacity_bytes=450, retention_local_target_capacity_percent=40
    )
    assert both.target_bytes(disk) == 400  # the smaller wins
    # never into the reservation, whatever is configured
    assert SpaceParams(retention_local_target_capacity_bytes=10**6).target_bytes(disk) == 600
    assert SpaceParams(retention_local_target_capacity_percent=100).target_bytes(disk) == 600


# --- the safety gate -------------------------------------------------------------------------


def test_safe_delete_below_is_what_the_manifest_covers() -> None:
    assert safe_delete_below(view(uploaded=29)) == 30
    # a manifest ending mid-segment covers only the whole segments before it
    assert safe_delete_below(view(uploaded=35)) == 30
    assert safe_delete_below(view(uploaded=None)) == 0
    assert safe_delete_below(view(uploaded=5)) == 0
    # remote write off: nothing is safe, whatever the manifest says
    assert safe_delete_below(view(remote_write=False)) == 0
    # everything uploaded, even past the active base: never past the closed segments
    assert safe_delete_below(view(n=5, uploaded=500)) == 50
    no_closed = PartitionView("t", 0, (), 70, 10, 100, True, UNLIMITED, False, UNLIMITED)
    assert safe_delete_below(no_closed) == 70


# --- local retention -------------------------------------------------------------------------


def test_local_retention_by_time_only_deletes_uploaded_segments() -> None:
    p = view(n=5, local=RetentionLimits(ms=int(2.5 * HOUR)), uploaded=29)
    # segments 0..2 are 5, 4, 3 hours old; 3 and 4 are younger; only 0..2 uploaded
    assert deleted(plan_local_retention([p], NOW)) == [("t", 0), ("t", 10), ("t", 20)]
    p = view(n=5, local=RetentionLimits(ms=int(2.5 * HOUR)), uploaded=15)
    assert deleted(plan_local_retention([p], NOW)) == [("t", 0)]


def test_time_retention_stops_at_the_first_young_segment() -> None:
    # Kafka takes segments while they are expired: a young segment shields older-looking ones
    p = view(n=4, ages_h=[9, 1, 9, 9], local=RetentionLimits(ms=5 * HOUR))
    assert deleted(plan_local_retention([p], NOW)) == [("t", 0)]


def test_local_retention_by_size() -> None:
    # 5 * 100 closed + 50 active = 550 bytes; target 300: drop oldest until <= 300
    p = view(n=5, local=RetentionLimits(bytes=300), active_size=50)
    assert [d.segment.base_offset for d in plan_local_retention([p], NOW)] == [0, 10, 20]


def test_time_and_size_both_apply_the_larger_wins() -> None:
    p = view(n=5, local=RetentionLimits(ms=int(3.5 * HOUR), bytes=450))
    assert len(plan_local_retention([p], NOW)) == 2  # time: 2 segments, size: 1


def test_local_retention_never_keeps_more_than_total_retention() -> None:
    p = view(n=5, local=RetentionLimits(ms=100 * HOUR), retention=RetentionLimits(ms=2 * HOUR))
    assert len(plan_local_retention([p], NOW)) == 3


def test_advisory_local_retention_only_applies_total_retention() -> None:
    p = view(n=5, local=RetentionLimits(ms=HOUR // 2), retention=RetentionLimits(ms=4 * HOUR))
    assert len(plan_local_retention([p], NOW, strict=True)) == 5
    assert len(plan_local_retention([p], NOW, strict=False)) == 1


def test_local_retention_leaves_topics_without_remote_write_alone() -> None:
    p = view(n=5, local=RetentionLimits(ms=1), remote_write=False)
    assert plan_local_retention([p], NOW) == []


# --- space management ------------------------------------------------------------------------

# 1000-byte disk, no reservation: the target is the configured capacity
DISK = DiskInfo(total_bytes=1000, free_bytes=1000)


def space(parts: list[PartitionView], target: int, **kw: object) -> SpacePlan:
    params = no_min_free(
        disk_reservation_percent=0.0, retention_local_target_capacity_bytes=target, **kw
    )
    return plan_space_management(parts, DISK, params, NOW)


def test_within_target_does_nothing() -> None:
    plan = space([view(n=3)], target=300)
    assert plan.outcome is SpaceOutcome.WITHIN_TARGET
    assert plan.phase is None and plan.deletions == ()
    assert (plan.usage_bytes, plan.target_bytes, plan.excess_bytes) == (300, 300, 0)


def test_phase_1_follows_retention_policy() -> None:
    expired = view("a", n=4, retention=RetentionLimits(ms=int(2.5 * HOUR)))
    plan = space([expired, view("b", n=4)], target=700)
    assert plan.outcome is SpaceOutcome.TARGET_MET and plan.phase is Phase.RETENTION
    assert deleted(plan.deletions) == [("a", 0)]
    assert plan.freed_bytes == 100 and plan.over_target_bytes == 0


def test_phase_2_trims_to_local_retention() -> None:
    a = view("a", n=4, local=RetentionLimits(ms=int(2.5 * HOUR)))
    b = view("b", n=4, local=RetentionLimits(ms=int(1.5 * HOUR)))
    plan = space([a, b], target=450)
    assert plan.phase is Phase.LOCAL_RETENTION
    # round robin: one segment per partition per turn
    assert deleted(plan.deletions) == [("a", 0), ("b", 0), ("a", 10), ("b", 10)]
    assert all(d.phase is Phase.LOCAL_RETENTION for d in plan.deletions)


def test_strict_local_retention_is_phase_1() -> None:
    a = view("a", n=4, local=RetentionLimits(ms=int(2.5 * HOUR)))
    plan = space([a], target=300, retention_local_strict=True)
    assert plan.phase is Phase.RETENTION
    assert deleted(plan.deletions) == [("a", 0)]


def test_phase_3_trims_default_retention_topics_to_the_low_space_level() -> None:
    default = view("d", n=4)
    explicit = view("e", n=4, explicit=True)
    plan = space([default, explicit], target=500)
    assert plan.phase is Phase.DEFAULT_LOW_SPACE
    # the explicit topic is untouched; the default one keeps its last closed segment
    assert deleted(plan.deletions) == [("d", 0), ("d", 10), ("d", 20)]


def test_phase_4_then_trims_explicit_topics() -> None:
    default = view("d", n=4)
    explicit = view("e", n=4, explicit=True)
    plan = space([default, explicit], target=300)
    assert plan.phase is Phase.EXPLICIT_LOW_SPACE
    assert deleted(plan.deletions) == [("d", 0), ("d", 10), ("d", 20), ("e", 0), ("e", 10)]
    assert [d.phase for d in plan.deletions] == [Phase.DEFAULT_LOW_SPACE] * 3 + [
        Phase.EXPLICIT_LOW_SPACE
    ] * 2


def test_phase_5_trims_to_the_active_segment_never_into_it() -> None:
    parts = [view("a", n=2, active_size=100), view("b", n=2, active_size=100)]
    plan = space(parts, target=100)
    assert plan.phase is Phase.ACTIVE_SEGMENT
    assert deleted(plan.deletions) == [("a", 0), ("b", 0), ("a", 10), ("b", 10)]
    assert plan.outcome is SpaceOutcome.EXHAUSTED
    assert plan.over_target_bytes == 100  # the two active segments are all that is left


def test_unuploaded_data_blocks_and_says_so() -> None:
    parts = [view("a", n=4, uploaded=9), view("b", n=4, uploaded=None)]
    plan = space(parts, target=100)
    assert deleted(plan.deletions) == [("a", 0)]
    assert plan.outcome is SpaceOutcome.BLOCKED_BY_UPLOAD_BACKLOG
    assert plan.unuploaded_bytes == 700
    assert plan.over_target_bytes == 600


def test_topics_without_remote_write_are_never_trimmed() -> None:
    plan = space([view("x", n=4, remote_write=False)], target=0)
    assert plan.deletions == ()
    assert plan.outcome is SpaceOutcome.EXHAUSTED
    assert plan.unuploaded_bytes == 0  # not a backlog: tiered does not archive it


def test_low_free_space_trims_even_under_the_target() -> None:
    params = SpaceParams(disk_reservation_percent=0.0, storage_min_free_bytes=250)
    disk = DiskInfo(total_bytes=10_000, free_bytes=100)
    plan = plan_space_management([view(n=4)], disk, params, NOW)
    assert plan.excess_bytes == 150
    assert deleted(plan.deletions) == [("t", 0), ("t", 10)]
    assert plan.outcome is SpaceOutcome.TARGET_MET


def test_phase_1_starts_with_the_partition_with_most_expired_data() -> None:
    little = view("little", n=4, retention=RetentionLimits(ms=int(3.5 * HOUR)))
    much = view("much", n=4, retention=RetentionLimits(ms=int(1.5 * HOUR)))
    plan = space([little, much], target=700)
    assert deleted(plan.deletions) == [("much", 0)]


def test_the_cursor_rotates_who_goes_first() -> None:
    parts = [view("a", n=4), view("b", n=4), view("c", n=4)]
    params = no_min_free(disk_reservation_percent=0.0, retention_local_target_capacity_bytes=1100)
    disk = DiskInfo(total_bytes=10_000, free_bytes=8_800)
    first = plan_space_management(parts, disk, params, NOW)
    assert deleted(first.deletions) == [("a", 0)]
    second = plan_space_management(parts, disk, params, NOW, cursor=first.next_cursor)
    assert deleted(second.deletions) == [("b", 0)]


# --- the invariant, by property --------------------------------------------------------------


@st.composite
def partitions(draw: st.DrawFn) -> PartitionView:
    n = draw(st.integers(0, 6))
    segments, offset = [], draw(st.integers(0, 100))
    for _ in range(n):
        length = draw(st.integers(0, 20))
        segments.append(
            LocalSegment(
                offset, offset + length - 1, draw(st.integers(0, 500)),
                NOW - draw(st.integers(0, 10 * HOUR)),
            )
        )  # fmt: skip
        offset += max(length, 1) + draw(st.sampled_from([0, 0, 3]))
    limits = st.builds(
        RetentionLimits, st.none() | st.integers(0, 10 * HOUR), st.none() | st.integers(0, 3000)
    )
    return PartitionView(
        topic=draw(st.sampled_from(["a", "b", "c"])),
        partition=draw(st.integers(0, 3)),
        segments=tuple(segments),
        active_base_offset=offset + draw(st.integers(0, 2)),
        active_size_bytes=draw(st.integers(0, 500)),
        uploaded_last_offset=draw(st.none() | st.integers(-1, offset + 30)),
        remote_write=draw(st.booleans()),
        local_retention=draw(limits),
        local_retention_explicit=draw(st.booleans()),
        retention=draw(limits),
    )


def assert_only_safe(parts: list[PartitionView], deletions: tuple[Deletion, ...] | list) -> None:
    by_index: dict[int, list[LocalSegment]] = {}
    for d in deletions:
        (i,) = [k for k, p in enumerate(parts) if (p.topic, p.partition) == (d.topic, d.partition)]
        by_index.setdefault(i, []).append(d.segment)
    for i, segs in by_index.items():
        p = parts[i]
        assert p.remote_write
        assert p.uploaded_last_offset is not None
        for s in segs:
            # design invariant 2: covered by the committed manifest; never the active segment
            assert s.last_offset <= p.uploaded_last_offset
            assert s.base_offset < p.active_base_offset
            assert s.end_exclusive <= safe_delete_below(p)
        # oldest first, each segment at most once: a prefix of the closed segments
        assert segs == list(p.segments[: len(segs)])


@settings(max_examples=300)
@given(
    st.lists(partitions(), max_size=5, unique_by=lambda p: (p.topic, p.partition)),
    st.integers(0, 6000),
    st.integers(0, 6000),
    st.integers(0, 3000),
    st.booleans(),
    st.integers(0, 10),
)
@pytest.mark.slow  # a property over many random logs
def test_space_management_never_deletes_unuploaded_or_active_data(
    parts: list[PartitionView], total: int, free: int, min_free: int, strict: bool, cursor: int
) -> None:
    params = SpaceParams(
        retention_local_strict=strict, storage_min_free_bytes=min_free, disk_reservation_percent=0
    )
    disk = DiskInfo(total, min(free, total))
    plan = plan_space_management(parts, disk, params, NOW, cursor=cursor)
    assert_only_safe(parts, plan.deletions)
    assert plan.freed_bytes == sum(d.segment.size_bytes for d in plan.deletions)
    assert plan.over_target_bytes == max(0, plan.excess_bytes - plan.freed_bytes)
    if plan.outcome is SpaceOutcome.TARGET_MET:
        assert plan.freed_bytes >= plan.excess_bytes
        # it stopped as soon as it could: without the last deletion it would still be over
        last = plan.deletions[-1].segment.size_bytes
        assert plan.freed_bytes - last < plan.excess_bytes
    phases = [d.phase for d in plan.deletions]
    assert phases == sorted(phases)  # phases run in order


@pytest.mark.slow  # a property over many random logs
@given(st.lists(partitions(), max_size=5), st.booleans())
def test_local_retention_never_deletes_unuploaded_or_active_data(
    parts: list[PartitionView], strict: bool
) -> None:
    parts = [p for i, p in enumerate(parts) if (p.topic, p.partition) not in
             {(q.topic, q.partition) for q in parts[:i]}]  # fmt: skip
    assert_only_safe(parts, plan_local_retention(parts, NOW, strict=strict))


# --- disk alerts, backlog, advise mode -------------------------------------------------------


def test_disk_alert_states() -> None:
    params = SpaceParams(storage_min_free_bytes=100)  # alert at 5 % by default
    assert disk_alert_state(10_000, 600, params) is DiskAlert.OK
    assert disk_alert_state(10_000, 499, params) is DiskAlert.LOW_SPACE
    assert disk_alert_state(10_000, 99, params) is DiskAlert.DEGRADED
    assert disk_alert_state(10_000, 99, params) == 2  # the metric's value


def test_disk_alert_thresholds_take_the_larger_and_zero_disables() -> None:
    both = SpaceParams(
        storage_min_free_bytes=0,
        storage_space_alert_free_threshold_percent=1,
        storage_space_alert_free_threshold_bytes=300,
    )
    assert disk_alert_state(10_000, 250, both) is DiskAlert.LOW_SPACE  # bytes threshold
    off = SpaceParams(
        storage_min_free_bytes=0,
        storage_space_alert_free_threshold_percent=0,
        storage_space_alert_free_threshold_bytes=0,
    )
    assert disk_alert_state(10_000, 0, off) is DiskAlert.OK


def test_upload_backlog_bytes_counts_unuploaded_remote_write_data() -> None:
    parts = [
        view("a", n=4, uploaded=19, active_size=30),  # 2 pending segments + active
        view("b", n=4, uploaded=None),  # all pending
        view("c", n=4, remote_write=False, active_size=30),  # not ours
    ]
    assert upload_backlog_bytes(parts) == 230 + 400


def test_advise_flags_data_the_broker_will_delete_before_upload() -> None:
    # un-uploaded segment 20.. is 3 h old; the broker keeps 4 h: 1 h of headroom
    p = view(n=5, uploaded=19, retention=RetentionLimits(ms=4 * HOUR))
    (a,) = advise([p], NOW, margin_ms=2 * HOUR)
    assert a == Advice("t", 0, 20, 300, HOUR, None, True)
    (a,) = advise([p], NOW, margin_ms=HOUR // 2)
    assert not a.at_risk


def test_advise_by_size() -> None:
    # 500 bytes on disk, broker keeps 450: segment 0 (uploaded) goes first, then segment 10
    p = view(n=5, uploaded=9, retention=RetentionLimits(bytes=450))
    (a,) = advise([p], NOW, margin_ms=0, margin_bytes=50)
    assert a.size_headroom_bytes == 50 and a.at_risk
    (a,) = advise([p], NOW, margin_ms=0, margin_bytes=49)
    assert not a.at_risk


def test_advise_without_remote_write_or_pending_data_is_calm() -> None:
    calm = advise(
        [
            view("off", remote_write=False, retention=RetentionLimits(ms=1)),
            view("done", retention=RetentionLimits(ms=1)),
        ],
        NOW,
        margin_ms=HOUR,
    )
    assert [(a.topic, a.at_risk, a.unuploaded_bytes) for a in calm] == [
        ("off", False, 0),
        ("done", False, 0),
    ]
    with pytest.raises(PolicyInputError):
        advise([], NOW, margin_ms=-1)
