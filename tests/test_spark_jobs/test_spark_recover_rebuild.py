"""`tiered recover --rebuild-manifests`: manifests rebuilt from the segment objects alone.

Invariants defended: 4 (a rebuilt manifest is contiguous; a hole is reported, never guessed
across), 5 (every object is verified before it is listed), 6 (heads are committed by
compare-and-swap, an unreadable one replaced only on its own ETag)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest
from support.recovery import (
    INDEX_INTERVAL_BYTES,
    REVISION,
    TOPIC,
    Archived,
    archive,
    archive_with_archiver,
    delete_all_manifests,
    make_config,
    make_context,
    segment_key,
    write_log,
)

from manifests import keys
from manifests.model import SegmentMeta
from manifests.topic import load_topic_manifest
from spark_jobs.job_context import JobContext
from spark_jobs.rebuild import plan_chain
from spark_jobs.recover import run_rebuild_manifests, run_recover
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog
from tiered.store import open_store
from tiered.store.base import ObjectStore

pytestmark = pytest.mark.timeout(300)


def _seg(base: int, last: int, term: int = 1, name: str = "") -> SegmentMeta:
    return SegmentMeta(base, last, 0, 0, 10, 1, term, 0, name=name)


# -- chain planning (pure) ----------------------------------------------------------------------


def test_plan_chain_takes_a_contiguous_run() -> None:
    segs = [_seg(10, 19), _seg(0, 9), _seg(20, 29)]
    plan = plan_chain(segs)
    assert plan.problem is None
    assert [s.base_offset for s in plan.chain] == [0, 10, 20]
    assert plan.unused == ()


def test_plan_chain_prefers_the_merged_object_and_reports_the_originals() -> None:
    originals = [_seg(0, 9), _seg(10, 19)]
    merged = _seg(0, 19, term=1, name=keys.segment_name(0, 19, 1, generation=1))
    plan = plan_chain([*originals, merged, _seg(20, 29)])
    assert [s.object_name for s in plan.chain] == [merged.object_name, "20-29-1.log"]
    assert set(plan.unused) == set(originals)


def test_plan_chain_prefers_the_newer_writer_for_the_same_range() -> None:
    old, new = _seg(10, 19, term=1), _seg(10, 19, term=3)
    plan = plan_chain([_seg(0, 9), old, new])
    assert plan.chain[1] == new
    assert plan.unused == (old,)


def test_plan_chain_reports_a_gap_instead_of_guessing() -> None:
    plan = plan_chain([_seg(0, 9), _seg(10, 19), _seg(30, 39), _seg(40, 49)])
    assert plan.chain == ()
    assert plan.problem is not None and "gap: offsets 20..29" in plan.problem


def test_plan_chain_reports_objects_without_a_common_boundary() -> None:
    plan = plan_chain([_seg(0, 9), _seg(10, 19), _seg(15, 29)])
    assert plan.chain == ()
    assert plan.problem is not None and "no segment object starts at offset 20" in plan.problem


def test_plan_chain_of_nothing_is_empty() -> None:
    assert plan_chain([]).chain == ()


# -- the job ------------------------------------------------------------------------------------


@pytest.fixture
def bucket(tmp_path: Path, spark: Any) -> Iterator[tuple[JobContext, ObjectStore, Archived]]:
    config = make_config(tmp_path, log_index_interval_bytes=INDEX_INTERVAL_BYTES)
    store = open_store(config.store_settings(), probe=False)
    ctx = make_context(config, store)
    archived = archive(store, ctx, write_log(tmp_path / "log", partitions=2))
    yield ctx, store, archived
    store.close()


def _head_segments(ctx: JobContext, partition: int) -> list[SegmentMeta]:
    m, etag = ctx.manifests.load(TOPIC, partition, REVISION)
    assert etag is not None
    return list(ctx.manifests.iter_segments(m))


def test_rebuilt_manifests_describe_the_same_segments(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, archived = bucket
    lost = delete_all_manifests(store)
    assert any(k.endswith("topic_manifest.json") for k in lost)

    summary = run_rebuild_manifests(ctx, topic=None)

    assert summary["ok"], summary["errors"]
    assert len(summary["rebuilt"]) == 2
    for partition, segments in archived.segments.items():
        assert _head_segments(ctx, partition) == segments
    t = load_topic_manifest(store, TOPIC, REVISION)
    assert t is not None and t.partition_count == 2
    assert summary["topic_manifests_created"] == [t.key]
    # and the rebuilt bucket recovers
    out = tmp_path / "recovered"
    assert run_recover(ctx, topic=TOPIC, log_dir=out, max_bytes=None)["ok"]
    assert TopicPartition(TOPIC, 1) in LocalLog([out])


def test_intact_manifests_are_left_alone(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, _ = bucket
    key = keys.partition_manifest_key(TOPIC, 0, REVISION)
    etag = store.head(key).etag

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    assert summary["ok"]
    assert len(summary["intact"]) == 2 and summary["rebuilt"] == []
    assert store.head(key).etag == etag


def test_a_gap_is_reported_not_guessed(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, archived = bucket
    delete_all_manifests(store)
    hole = archived.segments[0][2]
    store.delete_many([segment_key(0, hole)])

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    assert not summary["ok"]
    assert len(summary["failed"]) == 1
    error = summary["failed"][0]["error"]
    assert f"gap: offsets {hole.base_offset}..{hole.last_offset}" in error
    assert any(f"{TOPIC}/0" in e and "gap" in e for e in summary["errors"])
    _, etag = ctx.manifests.load(TOPIC, 0, REVISION)
    assert etag is None  # nothing committed for the partition with the hole
    assert _head_segments(ctx, 1) == archived.segments[1]  # the other one is rebuilt


def test_merge_leftovers_become_orphans(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, archived = bucket
    first, second = archived.segments[0][:2]
    data = store.get(segment_key(0, first)) + store.get(segment_key(0, second))
    merged_name = keys.segment_name(first.base_offset, second.last_offset, 1, generation=1)
    merged_key = keys.object_key(TOPIC, 0, REVISION, merged_name)
    store.put(merged_key, data)
    delete_all_manifests(store)

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    assert summary["ok"], summary["errors"]
    segs = _head_segments(ctx, 0)
    assert segs[0].object_name == merged_name
    assert segs[0].checksum == crc32c.crc32c(data) and segs[0].size_bytes == len(data)
    assert segs[1:] == archived.segments[0][2:]
    row = next(r for r in summary["rebuilt"] if r["partition"].startswith(f"{TOPIC}/0 "))
    assert sorted(row["orphans"]) == sorted([segment_key(0, first), segment_key(0, second)])


def test_a_corrupt_head_is_replaced_on_its_etag_and_kept_aside(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, archived = bucket
    key = keys.partition_manifest_key(TOPIC, 1, REVISION)
    # no copy restores it (one garbled, one gone): rebuilt from the listing
    garbled_copy, lost_copy = keys.head_copy_keys(key)
    store.put(garbled_copy, b"garbled copy")
    store.delete_many([lost_copy])
    store.put(key, b'{"version":1,"kind":"partition", garbage')

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    assert summary["ok"], summary["errors"]
    [row] = summary["rebuilt"]
    assert row["head"] == "corrupt" and "restored_from_copy" not in row
    assert store.get(row["quarantined"]) == b'{"version":1,"kind":"partition", garbage'
    assert _head_segments(ctx, 1) == archived.segments[1]
    # the rebuilt head is copied to both slots: no unusable copy stays to be restored later
    head = store.get(key)
    assert [store.get(k) for k in keys.head_copy_keys(key)] == [head, head]


def test_a_head_of_a_newer_release_is_left_as_it_is(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    """A head this release cannot read because a newer one wrote it is not damage: rebuilt
    from a listing (or restored from an older copy) it would lose what the newer format
    records. It is reported and left alone; the other partitions go on."""
    ctx, store, _ = bucket
    key = keys.partition_manifest_key(TOPIC, 1, REVISION)
    newer = b'{"version":99,"kind":"partition","future":1}'
    store.put(key, newer)

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    assert not summary["ok"] and summary["rebuilt"] == []
    [error] = summary["errors"]
    assert "newer format" in error and "upgrade tiered" in error
    assert store.get(key) == newer
    assert not [i.key for i in store.list("") if ".corrupt-" in i.key]


def test_a_corrupt_head_with_a_copy_is_restored_from_it_exactly(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, archived = bucket
    before, _ = ctx.manifests.load(TOPIC, 1, REVISION)
    store.put(before.key, b"not json")

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    assert summary["ok"], summary["errors"]
    [row] = summary["rebuilt"]
    assert row["head"] == "corrupt" and row["restored_from_copy"]
    assert store.get(row["quarantined"]) == b"not json"
    after, _ = ctx.manifests.load(TOPIC, 1, REVISION)
    assert after.evolve(sequence=before.sequence) == before
    assert _head_segments(ctx, 1) == archived.segments[1]


def test_a_corrupt_object_is_not_listed(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, archived = bucket
    delete_all_manifests(store)
    victim = segment_key(0, archived.segments[0][-1])
    data = bytearray(store.get(victim))
    data[-5] ^= 0x01
    store.put(victim, bytes(data))

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    # the newest object is unusable: the rebuilt log ends before it, and it is reported
    assert not summary["ok"]
    assert any(victim in e for e in summary["errors"])
    row = next(r for r in summary["rebuilt"] if r["partition"].startswith(f"{TOPIC}/0 "))
    assert len(row["corrupt"]) == 1 and victim in row["corrupt"][0]
    assert _head_segments(ctx, 0) == archived.segments[0][:-1]


def test_rebuild_what_the_archiver_uploaded(tmp_path: Path, spark: Any) -> None:
    log_dir = write_log(tmp_path / "log", partitions=2)
    config = make_config(tmp_path, log_dir=log_dir,
                         log_index_interval_bytes=INDEX_INTERVAL_BYTES)
    with open_store(config.store_settings()) as store:
        ctx = make_context(config, store)
        archived = archive_with_archiver(config, store, ctx)
        delete_all_manifests(store)

        summary = run_rebuild_manifests(ctx, topic=None)

        assert summary["ok"], summary["errors"]
        for partition, segments in archived.segments.items():
            assert _head_segments(ctx, partition) == segments


def test_a_head_that_misses_history_is_rebuilt_on_its_etag(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    """A readable head that starts at its last segment with no recorded retention, over the
    segments below it: rebuilt from the listing by compare-and-swap, every segment back, its
    term kept (docs/format.md, "Losing objects")."""
    from manifests import edits
    from manifests.manifest import PartitionManifest
    from manifests.serde import encode_partition_manifest

    ctx, store, archived = bucket
    m, etag = ctx.manifests.load(TOPIC, 0, REVISION)
    assert etag is not None
    later = edits.add_segments(PartitionManifest.new(TOPIC, 0, REVISION, term=m.term),
                             [m.segments[-1]]).evolve(sequence=m.sequence + 1)
    store.put(m.key, encode_partition_manifest(later), if_match=etag)

    summary = run_rebuild_manifests(ctx, topic=TOPIC)

    assert summary["ok"], summary["errors"]
    assert [r["head"] for r in summary["rebuilt"]] == ["misses_history"]
    assert _head_segments(ctx, 0) == archived.segments[0]
    assert ctx.manifests.load(TOPIC, 0, REVISION)[0].term >= m.term


def test_rebuild_beside_a_running_daemon_restores_a_lost_head_and_loses_nothing(
        tmp_path: Path, spark: Any) -> None:
    """The head and its copies gone under `tiered run` (housekeeping every 100 ms, grace 1 s),
    the local log trimmed: the daemon stops the partition, and `recover --rebuild-manifests`
    run beside it brings every archived offset back by create-if-absent; the daemon then
    goes on uploading on the rebuilt head, /health is ok again and no object was collected."""
    from support.archiving import write_partition as append
    from support.lost_head import daemon_with_a_lost_head
    from support.waiting import wait_until

    from manifests.commit import ManifestStore

    with daemon_with_a_lost_head(tmp_path, grace_ms=1000) as lost:
        config, store, rev, now_ms = lost.config, lost.store, lost.rev, lost.now_ms
        log_dir, mstore = config.log_dirs[0], ManifestStore(store)
        health, objects = lost.health, lost.data_objects
        before, uploaded = lost.before, lost.uploaded
        part = log_dir / "orders-0"
        append(log_dir, "orders", 0, batches=20, timestamp_ms=now_ms)  # the log goes on

        summary = run_rebuild_manifests(make_context(config, store), topic="orders")

        assert summary["ok"], summary["errors"]
        rebuilt, _ = mstore.load("orders", 0, rev)
        assert rebuilt.start_offset == 0
        assert rebuilt.last_offset >= before.last_offset
        active = int(sorted(part.glob("*.log"))[-1].stem)  # what rolled since is closed
        assert active > before.next_offset
        wait_until(lambda: mstore.load("orders", 0, rev)[0].next_offset >= active,
                   "the daemon to upload on the rebuilt head", timeout_s=90)
        wait_until(lambda: health().get("status") == "ok", "/health to recover", timeout_s=60)
        assert objects() >= uploaded  # nothing was collected
        head, _ = mstore.load("orders", 0, rev)
        segments = list(mstore.iter_segments(head))
        assert segments[0].base_offset == 0
        pairs = zip(segments, segments[1:], strict=False)
        assert all(a.last_offset + 1 == b.base_offset for a, b in pairs)
