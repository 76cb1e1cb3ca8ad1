"""Garbage collection never deletes a committed object, whatever another writer does meanwhile
(docs/format.md, "Garbage collection"): the verdicts as pure policy, then each decision
against a racer on moto's S3 server: a merge committing beside a daemon whose copy of the
manifest is stale, a commit landing between the collector's read and its cutoff commit, a
writer paused past the grace period, and a daemon that fell behind another on the same log."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import crc32c
import pytest
from support.archiving import Clock, Disk, drain, load_manifest, make_config, write_partition

from archiver.service import Archiver
from manifests import edits, keys
from manifests.collect import (
    HeadFacts,
    Verdict,
    archive_verdict,
    collect_orphans,
    data_verdict,
    store_time_ms,
)
from manifests.commit import ManifestStore
from manifests.errors import CollectedName
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from tiered.store.base import ObjectStore

GRACE_MS = 60_000

# -- verdicts (pure) ----------------------------------------------------------------------------

HEAD = HeadFacts(term=3, next_offset=1000, first_head_offset=600,
                 top_entries=frozenset({(0, 1), (400, 0)}))


@pytest.mark.parametrize(("name", "verdict"), [
    ("0-99-3.log", Verdict.DEAD),  # below the next offset: add_segments can never take it
    ("0-99-3.index", Verdict.DEAD),
    ("990-1099-3.log", Verdict.DEAD),  # starts below the end, overlapping it
    ("1000-1099-3.log", Verdict.KEEP),  # the frontier: a writer of term 3 may commit it
    ("1000-1099-3.timeindex", Verdict.KEEP),
    ("0-99-3.indexes", Verdict.DEAD),  # an index bundle goes with its segment's name
    ("1000-1099-3.indexes", Verdict.KEEP),
    ("0-99-3-7000000123.indexes", Verdict.CUTOFF),
    ("1000-1099-4.log", Verdict.KEEP),  # a newer term may take over and commit it
    ("1000-1099-2.log", Verdict.DEAD),  # a fenced term can never commit
    ("0-99-3-7000000123.log", Verdict.CUTOFF),  # a replacement: protected by the cutoff
    ("0-99-3-7000000123.index", Verdict.CUTOFF),
    ("merged.log", Verdict.CUTOFF),
    ("notes.txt", Verdict.KEEP),  # not ours
])
def test_data_verdicts(name: str, verdict: Verdict) -> None:
    assert data_verdict(name, HEAD) is verdict


def archive(base: int, last: int, level: int) -> str:
    return keys.archived_manifest_name(base, last, 0, 0, level, 0xDEADBEEF)


@pytest.mark.parametrize(("name", "verdict"), [
    (archive(100, 399, 0), Verdict.DEAD),  # below the head's first segment: spilled already
    (archive(600, 799, 0), Verdict.KEEP),  # the head's oldest segments: a spill in flight
    (archive(0, 399, 1), Verdict.DEAD),  # (0, 1) is folded already, no lower entry at 0
    (archive(400, 599, 1), Verdict.KEEP),  # (400, 0) could still be folded into it
    ("manifest.json", Verdict.KEEP),
])
def test_archive_verdicts(name: str, verdict: Verdict) -> None:
    assert archive_verdict(name, HEAD) is verdict


# -- against racers ----------------------------------------------------------------------------


def committed_partition(tmp_path: Path, store: ObjectStore, batches: int = 20
                        ) -> tuple[Archiver, Clock, Path, PartitionManifest]:
    clock = Clock(time.time())  # object mtimes come from the store's real clock
    config = make_config(tmp_path, cluster={"cloud_storage_gc_grace_period_ms": GRACE_MS})
    log_dir = config.log_dirs[0]
    # recent records: remote retention must not be what removes anything here
    write_partition(log_dir, "orders", 0, batches=batches, timestamp_ms=int(clock() * 1000))
    archiver = Archiver(config, store, clock=clock, disk_usage=Disk())
    drain(archiver)
    return archiver, clock, log_dir, load_manifest(store, log_dir, "orders", 0)


def merge_first_two(mstore: ManifestStore, m: PartitionManifest, *, generation: int = 5_000
                    ) -> tuple[SegmentMeta, str]:
    """Upload a merged copy of the first two segments (what `tiered merge` writes); returns
    its metadata and key, not committed."""
    first, second = m.segments[0], m.segments[1]
    data = mstore.store.get(m.segment_key(first)) + mstore.store.get(m.segment_key(second))
    name = keys.segment_name(first.base_offset, second.last_offset, m.term, generation=generation)
    meta = SegmentMeta(first.base_offset, second.last_offset, first.base_timestamp,
                       max(first.max_timestamp, second.max_timestamp), len(data),
                       first.segment_term, m.term, crc32c.crc32c(data), name=name)
    key = m.segment_key(meta)
    mstore.store.put(key, data, if_none_match=True)
    return meta, key


def uploaded_at(store: ObjectStore, key: str) -> int:
    return store_time_ms(store.head(key).last_modified)


def commit_merge(mstore: ManifestStore, m: PartitionManifest, meta: SegmentMeta, key: str
                 ) -> PartitionManifest:
    """Commit the merged object as `tiered merge` does: onto the fresh head, with the
    object's own store time so the garbage-collection cutoff can refuse it."""
    at = uploaded_at(mstore.store, key)
    now = int(time.time() * 1000)
    done = mstore.update(m.topic, m.partition, m.revision,
                         lambda fresh: edits.replace_segments(fresh, meta, now_ms=now,
                                                            uploaded_at_ms=at))
    return done.manifest


def every_named_object_exists(mstore: ManifestStore, m: PartitionManifest) -> None:
    for seg in mstore.iter_segments(m):
        assert mstore.store.exists(m.segment_key(seg)), seg.object_name
    for r in m.replaced:
        assert mstore.store.exists(m.segment_key(r.segment)), r.segment.object_name


def test_merge_beside_a_daemon_with_a_stale_copy_loses_nothing(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    """The daemon's cursor still holds the pre-merge head when its housekeeping runs after the
    grace period: the merged objects it never saw are referenced, so they stay."""
    archiver, clock, log_dir, m = committed_partition(tmp_path, s3_store)
    archiver.describe()  # the daemon's cursor holds this head
    merger = ManifestStore(s3_store)
    meta, key = merge_first_two(merger, m)
    merged = commit_merge(merger, m, meta, key)
    assert merged.segments[0] == meta
    # past the grace from the merge's own (real) time, however long the set-up took
    clock.now = max(clock.now, time.time()) + GRACE_MS / 1000 + 1
    report = archiver.housekeeping()
    assert report.ok, report.errors
    assert s3_store.exists(key)
    final = load_manifest(s3_store, log_dir, "orders", 0)
    assert final.segments[0] == meta and not final.replaced  # the originals went, after grace
    every_named_object_exists(merger, final)


def test_a_commit_between_the_collectors_read_and_its_cutoff_wins(
    tmp_path: Path, s3_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector decided from a head that did not name the merged object; the merge
    commits it before the collector's cutoff commit: the cutoff loses its race, nothing of
    the merge is deleted."""
    _, _, _, m = committed_partition(tmp_path, s3_store)
    collector, merger = ManifestStore(s3_store), ManifestStore(s3_store)
    meta, key = merge_first_two(merger, m)
    real_load = collector.load
    raced: list[PartitionManifest] = []

    def load_then_race(*args: Any) -> Any:
        got = real_load(*args)
        if not raced:
            raced.append(commit_merge(merger, m, meta, key))
        return got

    monkeypatch.setattr(collector, "load", load_then_race)
    done = collect_orphans(collector, m.topic, m.partition, m.revision,
                           now_ms=int(time.time() * 1000) + 2 * GRACE_MS, grace_ms=GRACE_MS)
    assert raced and key in done.deferred and not done.deleted and done.cutoff_ms == 0
    assert s3_store.exists(key)
    fresh, _ = ManifestStore(s3_store).load(m.topic, m.partition, m.revision)
    assert fresh.segments[0] == meta
    every_named_object_exists(collector, fresh)


def test_a_writer_paused_past_the_grace_period_cannot_commit_a_collected_object(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    """The merge uploaded, then stalled longer than the grace period; the collector committed
    its cutoff and deleted the object; the merge wakes up and is refused, so no manifest ever
    names the missing object."""
    _, _, _, m = committed_partition(tmp_path, s3_store)
    merger = ManifestStore(s3_store)
    meta, key = merge_first_two(merger, m)
    done = collect_orphans(ManifestStore(s3_store), m.topic, m.partition, m.revision,
                           now_ms=int(time.time() * 1000) + 2 * GRACE_MS, grace_ms=GRACE_MS)
    assert done.deleted == [key] and done.cutoff_ms >= uploaded_at(s3_store, m.key) - 1000
    with pytest.raises(CollectedName):
        merger.update(m.topic, m.partition, m.revision,
                      lambda fresh: edits.replace_segments(fresh, meta, now_ms=0,
                                                         uploaded_at_ms=done.cutoff_ms))
    fresh, _ = merger.load(m.topic, m.partition, m.revision)
    assert fresh.gc_cutoff_ms == done.cutoff_ms and fresh.segments[0] != meta
    every_named_object_exists(merger, fresh)


@pytest.mark.parametrize("listed", [False, True], ids=["files-vanish", "gap"])
def test_a_daemon_behind_another_on_the_same_log_reloads_and_collects_nothing_live(
    tmp_path: Path, s3_store: ObjectStore, caplog: pytest.LogCaptureFixture, listed: bool
) -> None:
    """Two daemons on one log dir: B commits and the broker trims what B covered; A, whose
    copy ended earlier, finds its files gone (or, having re-listed the log, a gap after its
    copy's end), says so once, re-reads the head, goes on, and its housekeeping deletes
    nothing B committed."""
    clock = Clock(time.time())
    config = make_config(tmp_path, cluster={"cloud_storage_gc_grace_period_ms": GRACE_MS})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=45, timestamp_ms=int(clock() * 1000))
    a = Archiver(config, s3_store, clock=clock, disk_usage=Disk(), term=1)
    b = Archiver(config, s3_store, clock=clock, disk_usage=Disk(), term=1)
    assert b.upload_round().partitions[0].uploaded_segments == 8
    a.describe()  # A's copy: 8 segments
    drain(b)
    m = load_manifest(s3_store, log_dir, "orders", 0)
    part = log_dir / "orders-0"
    for log_file in sorted(part.glob("*.log")):  # the broker's retention removes covered ones
        if int(log_file.stem) <= m.segments[10].base_offset:
            for f in part.glob(f"{log_file.stem}.*"):
                f.unlink()
    write_partition(log_dir, "orders", 0, batches=6, timestamp_ms=int(clock() * 1000))
    if listed:
        a.scan()
    with caplog.at_level(logging.WARNING, logger="archiver"):
        first = a.upload_round()  # files vanished under its listing, or a gap after its copy
        second = a.upload_round()  # re-listed the log, re-read the head: on from B's end
        third = a.upload_round()
    assert first.partitions[0].decision == ("gap" if listed else "error")
    assert second.ok and third.ok, (second.partitions, third.partitions)
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1, [r.getMessage() for r in problems]  # said once, not per round
    clock.advance(GRACE_MS / 1000 + 1)
    assert a.housekeeping().ok
    final = load_manifest(s3_store, log_dir, "orders", 0)
    assert final.next_offset >= m.next_offset
    every_named_object_exists(ManifestStore(s3_store), final)
