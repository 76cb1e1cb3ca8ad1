"""`tiered scrub`: every object the manifests name, checked on real PySpark.

Invariants defended: 1 (a named object must be fully in the bucket: a deleted or truncated
one is found and named), 5 (a flipped byte fails the object's CRC-32C and its batch's CRC,
and is named with its key), 7 and 8 (objects awaiting deletion after a merge are not
orphans; true orphans are found, and deleted only after the grace period)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest
from support.recovery import (
    REVISION,
    TOPIC,
    Archived,
    archive,
    archive_with_archiver,
    make_config,
    make_context,
    segment_key,
    write_config_file,
    write_log,
)

from manifests import edits, keys
from manifests.model import SegmentMeta
from spark_jobs import submit
from spark_jobs.job_context import JobContext
from spark_jobs.scrub import chain_anomalies, run_scrub, summary_lines
from spark_jobs.segment_walk import walk_object
from tiered.errors import CorruptSegmentError
from tiered.store import open_store
from tiered.store.base import ObjectStore

pytestmark = pytest.mark.timeout(300)

#: "now" for scrubs that must see objects as older than the grace period (one hour)
LATER_MS = 10**13


@pytest.fixture
def bucket(tmp_path: Path, spark: Any) -> Iterator[tuple[JobContext, ObjectStore, Archived]]:
    config = make_config(tmp_path)
    store = open_store(config.store_settings(), probe=False)
    ctx = make_context(config, store)
    archived = archive(store, ctx, write_log(tmp_path / "log", partitions=2))
    yield ctx, store, archived
    store.close()


def _kinds(summary: dict[str, Any]) -> dict[str, str]:
    return {a["key"]: a["kind"] for a in summary["anomalies"]}


# -- streaming one object (no Spark) ------------------------------------------------------------


def test_walk_object_gives_the_same_facts_in_any_chunk_size(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    _, store, archived = bucket
    meta = archived.segments[0][1]
    key = segment_key(0, meta)
    whole = walk_object(store, key, meta.size_bytes)
    assert whole.checksum == meta.checksum
    assert (whole.first_offset, whole.last_offset) == (meta.base_offset, meta.last_offset)
    assert whole.contiguous and whole.batches == 4
    for chunk in (1, 7, 61, 100, 333):  # cuts through headers and bodies alike
        seen: list[bytes] = []
        assert walk_object(store, key, meta.size_bytes, chunk_bytes=chunk,
                           sink=seen.append) == whole
        assert b"".join(seen) == store.get(key)


def test_walk_object_names_a_flipped_byte_and_a_short_object(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    _, store, archived = bucket
    meta = archived.segments[0][0]
    key = segment_key(0, meta)
    data = bytearray(store.get(key))
    data[-3] ^= 0x10
    store.put(key, bytes(data))
    with pytest.raises(CorruptSegmentError, match="CRC") as err:
        walk_object(store, key, len(data), chunk_bytes=50)
    assert err.value.path == key and err.value.position is not None
    assert 0 < err.value.position < len(data)
    store.put(key, bytes(data[:-20]))
    with pytest.raises(CorruptSegmentError, match="past the end|ends inside a batch"):
        walk_object(store, key, len(data) - 20)
    with pytest.raises(CorruptSegmentError, match="short of"):
        walk_object(store, key, len(data))


def test_chain_anomalies_name_gaps_and_overlaps() -> None:
    segs = [SegmentMeta(0, 9, 0, 0, 1, 1, 1, 0), SegmentMeta(12, 19, 0, 0, 1, 1, 1, 0),
            SegmentMeta(15, 29, 0, 0, 1, 1, 1, 0)]
    found = chain_anomalies("t/0", segs)
    assert [(a.kind, a.key) for a in found] == [("gap", "12-19-1.log"), ("overlap", "15-29-1.log")]


# -- the job ------------------------------------------------------------------------------------


def test_a_clean_bucket_scrubs_ok(bucket: tuple[JobContext, ObjectStore, Archived]) -> None:
    ctx, _, archived = bucket
    summary = run_scrub(ctx, topic=None, delete_orphans=False, now_ms=LATER_MS)
    assert summary["ok"], summary["anomalies"]
    assert summary["anomalies"] == [] and summary["warnings"] == []
    assert summary["partitions"] == 2
    assert summary["objects_verified"] == sum(len(s) for s in archived.segments.values())
    assert summary["bytes_verified"] == sum(
        m.size_bytes for s in archived.segments.values() for m in s)
    assert list(summary_lines(summary))[-1] == "ok"


def test_scrub_names_a_deleted_a_truncated_a_flipped_and_an_orphan_object(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, archived = bucket
    deleted = segment_key(0, archived.segments[0][1])
    store.delete_many([deleted])
    truncated = segment_key(0, archived.segments[0][3])
    store.put(truncated, store.get(truncated)[:-10])
    flipped = segment_key(1, archived.segments[1][2])
    data = bytearray(store.get(flipped))
    data[-3] ^= 0x01  # inside the last record: its batch's CRC-32C fails
    store.put(flipped, bytes(data))
    orphan = keys.object_key(TOPIC, 1, REVISION, "900-999-1.log")
    store.put(orphan, b"left over by a crash")

    summary = run_scrub(ctx, topic=TOPIC, delete_orphans=False, now_ms=LATER_MS)

    assert not summary["ok"]
    assert _kinds(summary) == {
        deleted: "missing",
        truncated: "size_mismatch",
        flipped: "corrupt_batch",
        orphan: "orphan",
    }
    flip = next(a for a in summary["anomalies"] if a["key"] == flipped)
    assert "CRC" in flip["detail"] and "byte" in flip["detail"]
    assert summary["anomaly_counts"] == {"missing": 1, "size_mismatch": 1, "corrupt_batch": 1,
                                         "orphan": 1}
    text = "\n".join(summary_lines(summary))
    assert all(k in text for k in (deleted, truncated, flipped, orphan))


def test_a_flip_outside_every_batch_crc_fails_the_object_checksum(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    """A batch's CRC-32C does not cover its first 21 bytes (offset, length, leader epoch,
    magic, CRC): the manifest's CRC-32C of the whole object still catches a flip there."""
    ctx, store, archived = bucket
    key = segment_key(0, archived.segments[0][0])
    data = bytearray(store.get(key))
    data[15] ^= 0x01  # the low byte of the first batch's partitionLeaderEpoch
    store.put(key, bytes(data))

    summary = run_scrub(ctx, topic=TOPIC, delete_orphans=False, now_ms=LATER_MS)

    assert _kinds(summary) == {key: "checksum_mismatch"}


def test_orphans_are_deleted_only_after_the_grace_period(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, _ = bucket
    # below the log's end under boundaries the manifest does not use: no writer can commit it
    orphan = keys.object_key(TOPIC, 0, REVISION, "1-2-1.log")
    store.put(orphan, b"an upload whose commit lost its race")
    # at the log's end by the current term: a writer may be about to commit it
    frontier = keys.object_key(TOPIC, 0, REVISION, "900-999-1.log")
    store.put(frontier, b"an upload whose commit may still be in flight")

    fresh = run_scrub(ctx, topic=TOPIC, delete_orphans=True)
    assert fresh["ok"]  # younger than the grace period: not (yet) an anomaly
    assert sorted(r["key"] for r in fresh["recent_unreferenced"]) == sorted([orphan, frontier])
    assert fresh["deleted_orphans"] == [] and store.exists(orphan)

    later = run_scrub(ctx, topic=TOPIC, delete_orphans=True, now_ms=LATER_MS)
    assert _kinds(later) == {orphan: "orphan", frontier: "orphan"}
    assert later["deleted_orphans"] == [orphan]
    assert not store.exists(orphan) and store.exists(frontier)
    store.delete_many([frontier])
    assert run_scrub(ctx, topic=TOPIC, delete_orphans=False, now_ms=LATER_MS)["ok"]


def test_replaced_objects_await_gc_and_are_not_orphans(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    """After a merge: the merged object is listed, the originals are in `replaced`."""
    ctx, store, archived = bucket
    first, second = archived.segments[0][:2]
    data = store.get(segment_key(0, first)) + store.get(segment_key(0, second))
    merged = SegmentMeta(first.base_offset, second.last_offset, first.base_timestamp,
                         max(first.max_timestamp, second.max_timestamp), len(data),
                         first.segment_term, 1, crc32c.crc32c(data),
                         name=keys.segment_name(first.base_offset, second.last_offset, 1,
                                                generation=1))
    m, etag = ctx.manifests.load(TOPIC, 0, REVISION)
    store.put(m.segment_key(merged), data)
    ctx.manifests.commit(edits.replace_segments(m, merged, now_ms=1_000), etag)

    summary = run_scrub(ctx, topic=TOPIC, delete_orphans=True, now_ms=LATER_MS)

    assert summary["ok"], summary["anomalies"]
    awaiting = {r["key"] for r in summary["replaced_awaiting_gc"]}
    assert {segment_key(0, first), segment_key(0, second)} <= awaiting
    assert all(r["grace_over"] for r in summary["replaced_awaiting_gc"])
    assert summary["deleted_orphans"] == []  # replaced objects are GC's, never scrub's
    assert store.exists(segment_key(0, first))
    # the merged object has no index beside it: a warning, not an anomaly
    assert any(merged.object_name.removesuffix(".log") in w for w in summary["warnings"])


def test_manifest_problems_are_anomalies(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    ctx, store, _ = bucket
    head0 = keys.partition_manifest_key(TOPIC, 0, REVISION)
    head1 = keys.partition_manifest_key(TOPIC, 1, REVISION)
    store.put(head0, b"not json")
    store.delete_many([head1])

    summary = run_scrub(ctx, topic=TOPIC, delete_orphans=True, now_ms=LATER_MS)

    assert _kinds(summary) == {head0: "corrupt_manifest", head1: "missing_manifest"}
    assert summary["deleted_orphans"] == []  # never delete around a manifest it cannot read


def test_runs_as_a_script_with_the_cli_arguments(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore, Archived],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`spark-submit spark_jobs/submit.py scrub ARGS` runs `main()` with `tiered scrub`'s arguments:
    JSON on stdout, exit 0 when clean and 1 on an anomaly."""
    ctx, store, archived = bucket
    path = write_config_file(tmp_path, ctx.config)
    with pytest.raises(SystemExit) as clean:
        submit.main(["scrub", "--config", str(path), "--topic", TOPIC, "--json"])
    assert clean.value.code == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    store.delete_many([segment_key(1, archived.segments[1][0])])
    with pytest.raises(SystemExit) as dirty:
        submit.main(["scrub", "--config", str(path)])
    assert dirty.value.code == 1
    assert segment_key(1, archived.segments[1][0]) in capsys.readouterr().out


def test_scrub_what_the_archiver_uploaded(tmp_path: Path, spark: Any) -> None:
    log_dir = write_log(tmp_path / "log", partitions=2)
    config = make_config(tmp_path, log_dir=log_dir)
    with open_store(config.store_settings()) as store:
        ctx = make_context(config, store)
        archived = archive_with_archiver(config, store, ctx)
        clean = run_scrub(ctx, topic=None, delete_orphans=False, now_ms=LATER_MS)
        assert clean["ok"], clean["anomalies"]
        assert clean["warnings"] == []  # the archiver uploads every segment's index bundle
        lost = segment_key(1, archived.segments[1][0]).removesuffix(".log") + ".indexes"
        store.delete_many([lost])
        missing = run_scrub(ctx, topic=None, delete_orphans=False, now_ms=LATER_MS)
        assert missing["ok"]
        assert [w for w in missing["warnings"] if lost in w and "cannot be rebuilt" in w]
        victim = segment_key(0, archived.segments[0][-1])
        data = bytearray(store.get(victim))
        data[-1] ^= 0x80
        store.put(victim, bytes(data))
        dirty = run_scrub(ctx, topic=None, delete_orphans=False, now_ms=LATER_MS)
    assert _kinds(dirty) == {victim: "corrupt_batch"}


def test_scrub_flags_history_below_a_head_that_starts_later_without_a_reason(
    bucket: tuple[JobContext, ObjectStore, Archived]
) -> None:
    """A head rewritten to start at its last segment (no retention recorded) over the
    segments below: each is `unreferenced_history`, scrub fails, and --delete-orphans deletes
    none of them (docs/format.md, "Losing objects")."""
    from manifests.manifest import PartitionManifest
    from manifests.serde import encode_partition_manifest

    ctx, store, _archived = bucket
    m, etag = ctx.manifests.load(TOPIC, 0, REVISION)
    assert etag is not None and len(m.segments) > 1
    later = edits.add_segments(PartitionManifest.new(TOPIC, 0, REVISION, term=m.term),
                             [m.segments[-1]]).evolve(sequence=m.sequence + 1)
    store.put(m.key, encode_partition_manifest(later), if_match=etag)
    below = {m.segment_key(s) for s in list(m.segments)[:-1]}

    summary = run_scrub(ctx, topic=TOPIC, delete_orphans=True, now_ms=LATER_MS)

    assert not summary["ok"]
    flagged = {a["key"] for a in summary["anomalies"] if a["kind"] == "unreferenced_history"}
    assert below <= flagged
    assert all("recover --rebuild-manifests" in a["detail"] for a in summary["anomalies"]
               if a["kind"] == "unreferenced_history")
    assert all(store.exists(k) for k in below)
