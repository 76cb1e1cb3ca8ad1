"""Remote retention and garbage collection against moto (design invariant 7 and 8): retention
by time, by size and both (the larger removal wins), over archived manifests too; the start
offset moves first and objects go only after the grace period; orphans a crash left behind
are found and deleted once older than the grace period, and nothing referenced ever is."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.archiving import (
    Clock,
    Disk,
    before_put_file,
    closed_segments,
    drain,
    load_manifest,
    make_config,
    write_partition,
)

from archiver.retention import retention_start_offset
from archiver.service import Archiver
from archiver.space import RetentionLimits
from manifests import edits, keys
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from tiered.store.base import ObjectStore

HOUR_MS = 3_600_000
#: old segments in the spillover test: enough rows to push a 1 KiB head into archives
OLD = 45
GRACE_MS = 60_000
#: one batch of 4 x 300-byte records per segment (segments roll at 1500 bytes)
ONE_BATCH_SEGMENTS = 1500


def data_keys(store: ObjectStore, m: PartitionManifest) -> set[str]:
    return {i.key for i in store.list(keys.partition_data_prefix(m.topic, m.partition,
                                                                 m.revision))}


def segment_size(tmp: Path) -> int:
    """Size of one of the identical one-batch segments `archived` writes."""
    write_partition(tmp, "probe", 0, batches=2, segment_bytes=ONE_BATCH_SEGMENTS)
    return (tmp / "probe-0" / f"{0:020d}.log").stat().st_size


def _past_the_grace(clock: Clock) -> None:
    """Move the clock one second past the grace period after now: object ages come from the
    store's real clock, and a loaded machine may spend seconds between the clock's start and
    an upload, which a plain `advance` from the start would leave inside the grace."""
    clock.now = max(clock.now, time.time()) + GRACE_MS / 1000 + 1


def archived(
    tmp_path: Path, store: ObjectStore, *, old: int, new: int,
    cluster: dict[str, Any] | None = None, topic: dict[str, Any] | None = None,
) -> tuple[Archiver, Clock, Path]:
    """`old` two-hour-old batches then `new` current ones, one per segment, all uploaded."""
    clock = Clock(time.time())  # object mtimes come from the store's real clock
    config = make_config(
        tmp_path, cluster={"cloud_storage_gc_grace_period_ms": GRACE_MS, **(cluster or {})},
        topics={"orders": topic or {}})
    log_dir = config.log_dirs[0]
    now_ms = int(clock() * 1000)
    write_partition(log_dir, "orders", 0, batches=old, segment_bytes=ONE_BATCH_SEGMENTS,
                    timestamp_ms=now_ms - 2 * HOUR_MS)
    write_partition(log_dir, "orders", 0, batches=new, segment_bytes=ONE_BATCH_SEGMENTS,
                    timestamp_ms=now_ms)
    archiver = Archiver(config, store, clock=clock, disk_usage=Disk())
    drain(archiver)
    return archiver, clock, log_dir


def test_retention_by_time_moves_the_start_then_deletes_after_the_grace_period(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    archiver, clock, log_dir = archived(tmp_path, s3_store, old=5, new=6,
                                        topic={"retention.ms": HOUR_MS})
    before = load_manifest(s3_store, log_dir, "orders", 0)
    first = archiver.housekeeping()
    assert first.ok and first.deleted_remote_objects == 0
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert m.log_start_offset == 5 * 4  # the five two-hour-old segments expired
    assert len(m.replaced) == 5
    assert data_keys(s3_store, m) == data_keys(s3_store, before)  # readers may still read

    _past_the_grace(clock)
    second = archiver.housekeeping()
    assert second.ok
    assert second.deleted_remote_objects == 5 * 2  # .log and .indexes of each
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert m.replaced == ()
    live = {name for seg in m.segments for name in (seg.object_name,)}
    remaining = data_keys(s3_store, m)
    assert {k.rsplit("/", 1)[1] for k in remaining if k.endswith(".log")} == live
    assert archiver.snapshot().remote_deleted_objects_total == 10


@pytest.mark.parametrize(
    ("old", "limit_segments", "expected_removed"),
    [
        (3, None, 3),  # time alone
        (0, 4, 6),  # size alone: 10 segments, keep 4
        (3, 4, 6),  # both: size removes more
        (8, 4, 8),  # both: time removes more
    ],
)
def test_retention_by_time_size_and_both(
    tmp_path: Path, s3_store: ObjectStore, old: int, limit_segments: int | None,
    expected_removed: int,
) -> None:
    new = 11 - old  # ten closed segments and the active one
    topic = {}
    if limit_segments is not None:  # a topic override on top of the cluster's retention.ms
        topic = {"retention.bytes": limit_segments * segment_size(tmp_path / "probe")}
    archiver, _, log_dir = archived(tmp_path, s3_store, old=old, new=new,
                                    cluster={"log_retention_ms": HOUR_MS}, topic=topic)
    assert archiver.housekeeping().ok
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert m.log_start_offset == expected_removed * 4
    assert len(m.segments) == 10 - expected_removed


def test_retention_counts_archived_manifests_and_gc_deletes_expired_archives(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    archiver, clock, log_dir = archived(
        tmp_path, s3_store, old=OLD, new=10,
        cluster={"cloud_storage_spillover_manifest_size": 1100},
        topic={"retention.ms": HOUR_MS})
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert len(m.archives) == 2, "the history must have spilled into archived manifests"
    first, second = m.archives
    assert m.start_offset > OLD * 4  # the expired offsets all sit in the archive region
    assert archiver.housekeeping().ok
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert m.log_start_offset == OLD * 4
    assert s3_store.exists(m.archive_key(first))  # nothing deleted before the grace period

    _past_the_grace(clock)
    report = archiver.housekeeping()
    # the wholly expired archive goes with its segments and indexes; the second one still
    # holds live offsets, so it and its objects stay (archived manifests are immutable)
    assert report.ok and report.deleted_remote_objects == first.segment_count * 2 + 1
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert list(m.archives) == [second]
    meta_prefix = keys.partition_meta_prefix(m.topic, m.partition, m.revision)
    assert sorted(i.key for i in s3_store.list(meta_prefix)
                  if ".copy-" not in i.key) == sorted([m.key, m.archive_key(second)])
    names = {k.rsplit("/", 1)[1] for k in data_keys(s3_store, m)}
    assert not [n for n in names if int(n.split("-")[0]) <= first.last_offset]
    assert keys.segment_name(second.base_offset, second.base_offset + 3, 1) in names
    # the log still reads from the new start, across the archive boundary
    assert [s.base_offset for s in archiver.mstore.iter_segments(m)] == list(
        range(OLD * 4, (OLD + 9) * 4, 4))


def test_orphans_are_deleted_after_the_grace_period_referenced_objects_never(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    archiver, clock, log_dir = archived(tmp_path, s3_store, old=0, new=6)
    m = load_manifest(s3_store, log_dir, "orders", 0)
    prefix = keys.partition_data_prefix(m.topic, m.partition, m.revision)
    assert m.term == 1 and m.next_offset == 20
    # what a crash between upload and commit leaves, once the log moved past it: a segment
    # and its index under boundaries the manifest does not use (a replica rolled elsewhere)
    name = keys.segment_name(4, 9, 1)
    dead = [prefix + name, prefix + keys.index_name(name)]
    # at the log's end: a writer of the current term may be about to commit it
    frontier = prefix + keys.segment_name(20, 23, 1)
    # at the log's end, but by a term the head has fenced: it can never be committed
    fenced = prefix + keys.segment_name(20, 23, 0)
    for key in (*dead, frontier, fenced):
        s3_store.put(key, b"partial upload")
    referenced = data_keys(s3_store, m) - {*dead, frontier, fenced}

    assert archiver.housekeeping().deleted_remote_objects == 0  # too young: maybe in flight
    assert all(s3_store.exists(k) for k in dead)
    _past_the_grace(clock)
    assert archiver.housekeeping().deleted_remote_objects == 3
    assert data_keys(s3_store, m) == referenced | {frontier}
    assert load_manifest(s3_store, log_dir, "orders", 0).segments == m.segments


def _seg(base: int, last: int, size: int, max_ts: int) -> SegmentMeta:
    return SegmentMeta(base, last, max_ts, max_ts, size, 1, 1, 0)


def test_retention_start_offset_is_the_larger_removal() -> None:
    segs = [_seg(0, 9, 100, 1_000), _seg(10, 19, 100, 2_000), _seg(20, 29, 100, 9_000)]
    now = 10_000
    assert retention_start_offset(lambda: segs, RetentionLimits(), now) is None
    assert retention_start_offset(lambda: segs, RetentionLimits(ms=8_500), now) == 10
    assert retention_start_offset(lambda: segs, RetentionLimits(bytes=100), now) == 20
    assert retention_start_offset(lambda: segs, RetentionLimits(ms=8_500, bytes=250), now) == 10
    assert retention_start_offset(lambda: segs, RetentionLimits(ms=500, bytes=250), now) == 30


def test_leftovers_of_a_crash_before_the_first_commit_wait_for_the_first_commit(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    """Without a head manifest nothing is collected (the writer that uploaded it may still
    commit it); once the log has moved past a leftover, it goes."""
    clock = Clock(time.time())
    config = make_config(tmp_path, cluster={"cloud_storage_gc_grace_period_ms": GRACE_MS})
    log_dir = config.log_dirs[0]
    # only the active segment: no commit
    write_partition(log_dir, "orders", 0, batches=1, segment_bytes=ONE_BATCH_SEGMENTS)
    archiver = Archiver(config, s3_store, clock=clock, disk_usage=Disk())
    archiver.upload_round()
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert m.last_offset == -1 and not s3_store.exists(m.key)
    leftover = keys.object_key(m.topic, m.partition, m.revision, keys.segment_name(0, 2, 1))
    s3_store.put(leftover, b"uploaded, then the process was killed")
    _past_the_grace(clock)
    assert archiver.housekeeping().deleted_remote_objects == 0
    assert s3_store.exists(leftover)
    # another writer commits the first segment under its own boundaries
    committed = SegmentMeta(0, 9, 0, 0, 1, 1, 1, 0)
    s3_store.put(m.segment_key(committed), b"x")
    archiver.mstore.commit(edits.add_segments(edits.with_term(m, 1), [committed]), None)
    assert archiver.housekeeping().deleted_remote_objects == 1
    assert not s3_store.exists(leftover)


def test_a_pass_housekeeps_a_partition_while_others_still_upload(
    tmp_path: Path, file_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one-shot pass: orders/0's housekeeping must not wait for orders/1's slow upload
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=9)
    write_partition(log_dir, "orders", 1, batches=9)
    # full shares: the held upload must not take the last slot orders/0 needs
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk(), fixed_shares=1000)
    housekept_0 = threading.Event()
    claim = threading.Lock()
    waited: list[bool] = []

    def hold(key: str) -> None:
        if "/orders/1_" in key and key.endswith(".log") and claim.acquire(blocking=False):
            waited.append(housekept_0.wait(10))  # one upload held until orders/0 is housekept

    housekeep = archiver.housekeeper.partition

    def watched(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return housekeep(state, *args, **kwargs)
        finally:
            if state.tp.partition == 0:
                housekept_0.set()

    before_put_file(monkeypatch, file_store, hold)
    monkeypatch.setattr(archiver.housekeeper, "partition", watched)
    report = archiver.run_once()
    assert report.ok
    assert waited == [True]  # ended by orders/0's housekeeping, not by the timeout
    assert sorted(p.partition for p in report.partitions) == [0, 1]


def test_a_partition_uploading_over_several_rounds_is_housekept_after_the_last(
    tmp_path: Path, file_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=14)  # several closed segments
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk())
    archiver.upload_params = dataclasses.replace(archiver.upload_params,
                                                 max_candidates_per_round=1)
    seen: list[int] = []
    housekeep = archiver.housekeeper.partition

    def watched(state: Any, *args: Any, **kwargs: Any) -> Any:
        out = housekeep(state, *args, **kwargs)
        seen.append(state.cursor.manifest.last_offset)
        return out

    monkeypatch.setattr(archiver.housekeeper, "partition", watched)
    report = archiver.run_once()
    segments = len(closed_segments(log_dir, "orders", 0))
    assert segments > 1
    assert report.ok and report.partitions[0].uploaded_segments == segments  # one per round
    final = load_manifest(file_store, log_dir, "orders", 0)
    assert seen and seen[-1] == final.last_offset  # the last housekeeping saw every upload
