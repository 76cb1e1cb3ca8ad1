"""Absence is not evidence (docs/design.md, invariant 11): a head manifest that went missing
never makes a writer start the partition afresh over its history, and nothing below a head's
start is collected unless the head records why the start moved. Each test loses objects the
way a lifecycle rule or a wrong `aws s3 rm` would, then runs the archiver past the collection
grace period."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support.archiving import Clock, Disk, drain, make_config, revision, write_partition
from support.lost_head import delete_head_and_copies, trim_local_log

from archiver.service import Archiver
from manifests import edits, keys
from manifests.collect import HeadFacts, Verdict, archive_verdict, collect_orphans, data_verdict
from manifests.commit import ManifestStore
from manifests.errors import HistoryWithoutHead
from manifests.manifest import PartitionManifest
from manifests.serde import encode_partition_manifest
from tiered.store.base import ObjectStore

GRACE_MS = 1000

# -- the verdicts (pure) ----------------------------------------------------------------------

#: a head whose log starts at 600, retention having recorded everything below 400
HEAD = HeadFacts(term=3, next_offset=1000, first_head_offset=600, top_entries=frozenset(),
                 log_start=600, collectable_below=400)


@pytest.mark.parametrize(("name", "verdict"), [
    ("0-99-3.log", Verdict.DEAD),  # wholly below the recorded start: retention removed it
    ("300-399-2.index", Verdict.DEAD),
    ("400-599-3.log", Verdict.HISTORY),  # below the start, and no record says why
    ("500-699-3.log", Verdict.HISTORY),  # straddles the start: not all of it was let go
    ("0-99-3-7000000123.log", Verdict.DEAD),  # a replacement below the recorded start
    ("400-599-3-7000000123.log", Verdict.HISTORY),
    ("700-799-3.log", Verdict.DEAD),  # in the head's range, unreferenced: a lost race
    ("1000-1099-3.log", Verdict.KEEP),  # the frontier
])
def test_below_the_start_only_a_recorded_reason_makes_an_object_dead(
        name: str, verdict: Verdict) -> None:
    assert data_verdict(name, HEAD) is verdict


def test_archived_manifests_below_the_start_need_the_same_reason() -> None:
    def archive(base: int, last: int) -> str:
        return keys.archived_manifest_name(base, last, 0, 0, 0, 0xDEADBEEF)

    assert archive_verdict(archive(0, 399), HEAD) is Verdict.DEAD
    assert archive_verdict(archive(400, 599), HEAD) is Verdict.HISTORY
    # a head that never recorded a start (an older release's, or one created anew) keeps all
    fresh = HeadFacts(3, 1000, 600, frozenset(), log_start=600, collectable_below=0)
    assert data_verdict("0-99-3.log", fresh) is Verdict.HISTORY


def test_retention_records_why_the_start_moved() -> None:
    from manifests.model import SegmentMeta

    m = edits.add_segments(PartitionManifest.new("orders", 0, "r", term=1), [
        SegmentMeta(o, o + 99, 0, 0, 100, 1, 1, 0) for o in range(0, 400, 100)])
    moved = edits.advance_start_offset(m, 200, now_ms=0)
    assert moved.log_start_offset == 200 and moved.collectable_below == 200
    assert edits.advance_start_offset(moved, 100, now_ms=0).collectable_below == 200


# -- against a real bucket ----------------------------------------------------------------------


def archived(tmp_path: Path, store: ObjectStore) -> tuple[Archiver, Clock, Path, str]:
    clock = Clock(time.time())  # object mtimes come from the store's clock
    config = make_config(tmp_path, cluster={"cloud_storage_gc_grace_period_ms": GRACE_MS})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=40, timestamp_ms=int(clock() * 1000))
    archiver = Archiver(config, store, clock=clock, disk_usage=Disk())
    drain(archiver)
    return archiver, clock, log_dir, revision(log_dir, "orders", 0)


def data_objects(store: ObjectStore, rev: str) -> set[str]:
    return {i.key for i in store.list(keys.partition_data_prefix("orders", 0, rev))}


def past_grace(archiver: Archiver, clock: Clock) -> None:
    time.sleep(GRACE_MS / 1000 + 1.1)  # store mtimes are whole seconds on the store's clock
    clock.now = time.time()
    archiver.run_once()


def test_a_deleted_head_is_restored_from_its_copy_exactly(tmp_path: Path,
                                                          s3_store: ObjectStore) -> None:
    archiver, clock, _log_dir, rev = archived(tmp_path, s3_store)
    mstore = ManifestStore(s3_store)
    before, _ = mstore.load("orders", 0, rev)
    assert before.segments, "nothing was archived"
    objects = data_objects(s3_store, rev)
    s3_store.delete_many([before.key])
    past_grace(archiver, clock)
    after, etag = mstore.load("orders", 0, rev)
    assert etag is not None
    assert after.evolve(sequence=before.sequence) == before  # the same history, cutoff, start
    assert data_objects(s3_store, rev) >= objects  # nothing was collected
    assert archiver.snapshot().heads_restored_total == 1


def test_a_head_deleted_right_after_a_commit_is_restored_by_the_next_full_pass(
        tmp_path: Path, s3_store: ObjectStore) -> None:
    """A quiet partition costs no request until its next full housekeeping pass: a head
    deleted right after a round's commit is not seen by the passes before it, which delete
    nothing, and that pass restores it from its copy."""
    archiver, clock, log_dir, rev = archived(tmp_path, s3_store)
    mstore = ManifestStore(s3_store)
    write_partition(log_dir, "orders", 0, batches=6, segment_bytes=3000,
                    timestamp_ms=int(time.time() * 1000))
    archiver.scan()
    partition = archiver.housekeeper.partition
    deleted: list[str] = []

    def racer(state: Any) -> Any:
        if not deleted:  # lost between the commit and its housekeeping
            m, _ = mstore.load("orders", 0, rev)
            s3_store.delete_many([m.key])
            deleted.append(m.key)
        return partition(state)

    archiver.housekeeper.partition = racer  # type: ignore[method-assign]
    before_objects = data_objects(s3_store, rev)
    report = archiver.run_once()
    assert report.ok, report.errors
    assert deleted, "no round committed"
    archiver.housekeeper.partition = partition  # type: ignore[method-assign]
    report = archiver.run_once()
    assert report.ok, report.errors
    assert mstore.load("orders", 0, rev)[1] is None  # not seen by these passes
    assert data_objects(s3_store, rev) >= before_objects  # and nothing collected
    past_grace(archiver, clock)
    archiver.run_once()
    after, etag = mstore.load("orders", 0, rev)
    assert etag is not None and archiver.snapshot().heads_restored_total == 1
    assert after.segments and data_objects(s3_store, rev) >= before_objects


def test_a_lost_head_without_copies_stops_the_partition_and_loses_nothing(
        tmp_path: Path, s3_store: ObjectStore) -> None:
    """The issue's case: head and its copies gone, the local log trimmed; the next pass must
    not commit a head at the local start, and the collector must delete nothing."""
    archiver, clock, log_dir, rev = archived(tmp_path, s3_store)
    m, _ = ManifestStore(s3_store).load("orders", 0, rev)
    objects = data_objects(s3_store, rev)
    trim_local_log(log_dir / "orders-0")  # local retention went ahead of the loss
    delete_head_and_copies(s3_store, "orders", 0, rev)
    past_grace(archiver, clock)
    report = archiver.run_once()
    assert not report.ok
    errors = report.errors + [p.error for p in report.partitions if p.error]
    assert any("recover --rebuild-manifests" in e for e in errors), errors
    assert not s3_store.exists(m.key)  # no fresh head over the history
    assert data_objects(s3_store, rev) >= objects
    # describe-storage (a fresh process) says so, with the command
    fresh = Archiver(archiver.config, s3_store, clock=clock, disk_usage=Disk())
    fresh.scan()
    [row] = fresh.describe()
    assert "recover --rebuild-manifests" in row["remote"].get("error", ""), row


def test_committing_a_fresh_head_over_history_is_refused(tmp_path: Path,
                                                         s3_store: ObjectStore) -> None:
    _archiver, _clock, _log_dir, rev = archived(tmp_path, s3_store)
    mstore = ManifestStore(s3_store)
    m, _ = mstore.load("orders", 0, rev)
    meta = keys.partition_meta_prefix("orders", 0, rev)
    s3_store.delete_many([i.key for i in s3_store.list(meta) if i.key.startswith(m.key)])
    later = edits.add_segments(PartitionManifest.new("orders", 0, rev, term=m.term + 1),
                             [m.segments[-1]])  # a head starting at the last segment
    with pytest.raises(HistoryWithoutHead, match="recover --rebuild-manifests"):
        mstore.commit(later, None)


def test_the_collector_deletes_nothing_below_a_head_that_lost_history(
        tmp_path: Path, s3_store: ObjectStore) -> None:
    """A head that starts later with no recorded reason (written by an older release, or by
    hand) over objects below it: an anomaly, and nothing is collected at all."""
    archiver, clock, _log_dir, rev = archived(tmp_path, s3_store)
    mstore = ManifestStore(s3_store)
    m, etag = mstore.load("orders", 0, rev)
    objects = data_objects(s3_store, rev)
    later = edits.add_segments(PartitionManifest.new("orders", 0, rev, term=m.term),
                             [m.segments[-1]])
    s3_store.put(m.key, encode_partition_manifest(later.evolve(sequence=m.sequence + 1)),
                 if_match=etag)
    time.sleep(GRACE_MS / 1000 + 1.1)
    out = collect_orphans(mstore, "orders", 0, rev, now_ms=int(time.time() * 1000),
                          grace_ms=GRACE_MS)
    assert out.anomaly is not None and "recover --rebuild-manifests" in out.anomaly
    assert out.deleted == []
    assert data_objects(s3_store, rev) == objects


def test_a_garbled_head_without_copies_stops_writes_and_collection_and_loses_nothing(
        tmp_path: Path, s3_store: ObjectStore) -> None:
    """A head that is not JSON any more, its copies gone too: no commit over it, nothing
    collected, no local segment deleted, and the pass names the repair."""
    archiver, clock, log_dir, rev = archived(tmp_path, s3_store)
    m, _ = ManifestStore(s3_store).load("orders", 0, rev)
    objects = data_objects(s3_store, rev)
    local = sorted(p.name for p in (log_dir / "orders-0").iterdir())
    s3_store.delete_many(list(keys.head_copy_keys(m.key)))
    s3_store.put(m.key, b"{garbled")
    # a fresh process (nothing cached) past the grace period, local retention on
    fresh = Archiver(archiver.config, s3_store, clock=clock, disk_usage=Disk(free=1))
    time.sleep(GRACE_MS / 1000 + 1.1)
    clock.now = time.time()
    report = fresh.run_once()
    assert not report.ok
    assert s3_store.get(m.key) == b"{garbled"  # nobody wrote a head over it
    assert data_objects(s3_store, rev) == objects
    assert sorted(p.name for p in (log_dir / "orders-0").iterdir()) == local


def test_a_garbled_head_is_restored_exactly_from_its_copy(
        tmp_path: Path, s3_store: ObjectStore) -> None:
    """A head garbled in the bucket while its copies survive: housekeeping replaces it on its
    own ETag with the newest complete copy (its cutoff and recorded start included), keeps
    the bad bytes beside it, collects nothing, and the partition goes on."""
    archiver, clock, _log_dir, rev = archived(tmp_path, s3_store)
    mstore = ManifestStore(s3_store)
    before, _ = mstore.load("orders", 0, rev)
    objects = data_objects(s3_store, rev)
    s3_store.put(before.key, b"{garbled")
    fresh = Archiver(archiver.config, s3_store, clock=clock, disk_usage=Disk())
    time.sleep(GRACE_MS / 1000 + 1.1)
    clock.now = time.time()
    fresh.run_once()
    after, etag = ManifestStore(s3_store).load("orders", 0, rev)
    assert etag is not None
    assert after.evolve(sequence=before.sequence) == before
    assert data_objects(s3_store, rev) >= objects
    meta = keys.partition_meta_prefix("orders", 0, rev)
    kept = [i.key for i in s3_store.list(meta) if ".corrupt-" in i.key]
    assert len(kept) == 1 and s3_store.get(kept[0]) == b"{garbled"
    assert fresh.snapshot().heads_restored_total == 1
    assert fresh.run_once().ok


@pytest.mark.slow  # a daemon past the grace period
def test_a_running_daemon_past_the_grace_period_loses_nothing_and_says_so(
        tmp_path: Path) -> None:
    """The issue's case under `tiered run`: the local log trimmed, then the head and its
    copies deleted while the daemon runs, housekeeping every 100 ms, grace 1 s: nothing is
    collected, no head is created at the local start, and /health is degraded naming the
    repair command. (With the whole log still local a fresh head from offset 0 re-uploads
    everything, which loses nothing.)"""
    from support.lost_head import daemon_with_a_lost_head
    from support.waiting import wait_until

    with daemon_with_a_lost_head(tmp_path, grace_ms=GRACE_MS) as lost:
        daemon, store, rev, key = lost.daemon, lost.store, lost.rev, lost.key
        health, objects = lost.health, lost.uploaded
        # past the grace (store mtimes are whole seconds), then two housekeeping passes:
        # collection had its chance
        past = time.time() + GRACE_MS / 1000 + 1.1
        wait_until(lambda: time.time() > past, "the grace period to pass", timeout_s=10)
        runs = daemon.state.jobs["housekeeping"].runs
        wait_until(lambda: daemon.state.jobs["housekeeping"].runs >= runs + 2,
                   "housekeeping past the grace", timeout_s=60)
        now = health()
        assert now["status"] == "degraded", (now, store.exists(key))
        assert not store.exists(key)
        assert data_objects(store, rev) >= objects


def test_a_head_of_a_newer_release_is_never_replaced_by_an_older_copy(
        tmp_path: Path, s3_store: ObjectStore) -> None:
    """Sidecars upgraded one by one share the bucket: a head a newer release wrote reads as
    unsupported here, and its copies still in an older format must not be restored over it
    (that would roll its commits back). Nothing is written, collected or trimmed."""
    import json

    archiver, clock, log_dir, rev = archived(tmp_path, s3_store)
    m, _ = ManifestStore(s3_store).load("orders", 0, rev)
    objects = data_objects(s3_store, rev)
    local = sorted(p.name for p in (log_dir / "orders-0").iterdir())
    newer = json.loads(encode_partition_manifest(m)) | {"version": 99, "future": 1}
    data = json.dumps(newer).encode()
    s3_store.put(m.key, data)  # its copies stay in the version this release writes
    fresh = Archiver(archiver.config, s3_store, clock=clock, disk_usage=Disk(free=1))
    time.sleep(GRACE_MS / 1000 + 1.1)
    clock.now = time.time()
    report = fresh.run_once()
    assert not report.ok
    said = report.errors + [p.error or "" for p in report.partitions]
    assert any("newer than this reader" in e for e in said), said
    assert s3_store.get(m.key) == data
    assert data_objects(s3_store, rev) == objects
    assert sorted(p.name for p in (log_dir / "orders-0").iterdir()) == local
    assert fresh.snapshot().heads_restored_total == 0


def test_a_head_raised_to_a_newer_format_leaves_no_copy_in_the_older_one(
        s3_store: ObjectStore) -> None:
    """An older release restores a head it cannot read from the newest copy it can: so the
    commit that raises a head's format writes its copy to both slots, and later commits to
    their own slot only."""
    import json

    from manifest_fakes import run_of

    from manifests.model import INDEX_BUNDLE

    mstore = ManifestStore(s3_store)
    m, etag = mstore.load("orders", 0, "7")
    for _ in range(2):  # two commits of Kafka index files: version 1 in both slots
        m = edits.add_segments(edits.with_term(m, 1), run_of(m.next_offset, 1))
        mstore.commit(m, etag)
        m, etag = mstore.load("orders", 0, "7")

    def copies() -> list[tuple[int, int]]:
        return sorted((d["version"], d["sequence"]) for d in (
            json.loads(s3_store.get(k)) for k in keys.head_copy_keys(m.key)))

    assert copies() == [(1, 1), (1, 2)]
    m = edits.add_segments(m, run_of(m.next_offset, 1, index_layout=INDEX_BUNDLE))
    mstore.commit(m, etag)
    assert copies() == [(4, 3), (4, 3)]
    m, etag = mstore.load("orders", 0, "7")
    mstore.commit(edits.add_segments(m, run_of(m.next_offset, 1, index_layout=INDEX_BUNDLE)),
                  etag)
    assert copies() == [(4, 3), (4, 4)]
