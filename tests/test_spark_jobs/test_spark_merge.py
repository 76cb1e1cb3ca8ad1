"""Adjacent-segment merging on real PySpark (local[2], the session-wide `spark` fixture).

Invariants defended: every offset reads back byte-identical after a merge (1, 5); a merge
racing the daemon's commits loses nothing on either side and never overwrites (4, 6); merged-
away objects stay in the bucket, listed as replaced, until GC after the grace period (7);
a corrupt source is refused and never uploaded as good (5).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import crc32c
import pytest
from support.spark import (
    BATCHES_PER_SEGMENT,
    RECORDS_PER_BATCH,
    REVISION,
    TOPIC,
    assert_every_offset_reads_back,
    batches_by_offset,
    make_context,
    read_back,
    seed,
    segment_bytes,
    upload_segments,
)

from manifests import edits, keys, segment_indexes
from manifests.errors import ManifestConflict
from manifests.model import INDEX_BUNDLE
from spark_jobs.job_context import JobContext, PartitionRef
from spark_jobs.merge import build_tasks, run_merge
from spark_jobs.merge_exec import merge_run
from spark_jobs.merge_plan import merge_limits, plan_runs
from tiered.kafka.index import OffsetIndex
from tiered.store.base import ObjectStore


def test_many_small_segments_become_fewer_within_target_and_read_back_identical(
    ctx: JobContext,
) -> None:
    logs = seed(ctx.manifests, partitions=2, segments=40)
    before, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    small = before.segments[0].size_bytes
    assert small < 4096  # every segment is a merge candidate

    summary = run_merge(ctx)

    assert summary["ok"], summary["errors"]
    assert summary["before"]["segments"] == 80
    assert summary["after"]["segments"] < 80 / 3
    assert summary["before"]["bytes"] == summary["after"]["bytes"]
    assert summary["bytes_uploaded"] >= summary["after"]["bytes"] - 2 * 4096  # tails may wait
    for p in (0, 1):
        m, _ = ctx.manifests.load(TOPIC, p, REVISION)
        assert all(seg.size_bytes <= 8192 for seg in m.segments)
        # design invariant 7: the merged-away segments are listed for GC and still in the bucket
        assert len(m.replaced) == 40 - sum(1 for s in m.segments if not s.name)
        assert all(ctx.store.exists(m.segment_key(r.segment)) for r in m.replaced)
        assert_every_offset_reads_back(ctx.manifests, p, logs[p])
    merged = next(seg for seg in m.segments if seg.name)
    assert merged.index_layout == INDEX_BUNDLE
    index = segment_indexes.read_indexes(ctx.store, m.data_prefix, merged.object_name,
                                         merged.index_layout, ("index",),
                                         segment_bytes=merged.size_bytes)["index"]
    assert index is not None
    assert len(OffsetIndex.from_bytes(index, base_offset=merged.base_offset)) > 4


def test_merge_is_idempotent_and_disabled_by_config(ctx: JobContext, file_store: Any) -> None:
    seed(ctx.manifests, partitions=1, segments=12)
    first = run_merge(ctx)
    assert first["runs_committed"] > 0
    again = run_merge(ctx)
    assert again["ok"] and again["runs_committed"] == 0
    assert again["skipped"], "an untouched partition says why"
    assert all(skip["reason"].startswith(("no runs of small", "the only run of small"))
               for skip in again["skipped"])
    off = make_context(file_store, cloud_storage_enable_segment_merging=False)
    disabled = run_merge(off)
    assert disabled == {"ok": True, "disabled": True, "message": disabled["message"]}
    assert "disabled" in disabled["message"]


@pytest.mark.parametrize("daemon_term", [1, 2], ids=["same-term", "newer-term"])
def test_simulated_daemon_commit_between_plan_and_commit_loses_nothing(
    ctx: JobContext, daemon_term: int
) -> None:
    logs = seed(ctx.manifests, partitions=1, segments=20)
    step = RECORDS_PER_BATCH * BATCHES_PER_SEGMENT
    appended: list[bytes] = []

    def daemon_commits(part: PartitionRef) -> None:
        # the daemon (possibly a new leader) archives two more segments after the merge planned
        blobs = [segment_bytes((20 + i) * step) for i in range(2)]
        upload_segments(ctx.manifests, part.partition, blobs, term=daemon_term)
        appended.extend(blobs)

    summary = run_merge(ctx, before_commit=daemon_commits)
    assert summary["ok"], summary["errors"]
    assert summary["commit_conflicts"] >= 1
    assert summary["runs_committed"] >= 1
    m, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    assert m.term == daemon_term  # the merge never moves the term
    assert_every_offset_reads_back(ctx.manifests, 0, logs[0] + b"".join(appended))


def test_daemon_retention_invalidating_a_run_replans_and_deletes_the_stale_object(
    ctx: JobContext,
) -> None:
    logs = seed(ctx.manifests, partitions=1, segments=20)
    calls = []

    def retention(part: PartitionRef) -> None:
        calls.append(part)
        if len(calls) > 1:
            return
        m, etag = ctx.manifests.load(TOPIC, part.partition, REVISION)
        cut = m.segments[1].last_offset + 1  # drop the first two segments
        ctx.manifests.commit(edits.advance_start_offset(m, cut, now_ms=1), etag)

    summary = run_merge(ctx, before_commit=retention)
    assert summary["ok"], summary["errors"]
    assert summary["unreferenced_objects_deleted"] >= 2  # segment + its index bundle
    m, whole = read_back(ctx.manifests, 0)
    cut = batches_by_offset(logs[0])
    start = m.log_start_offset
    assert whole == b"".join(dict.fromkeys(cut[o] for o in sorted(cut) if o >= start))
    listed = set(m.segments.object_names()) | {r.segment.object_name for r in m.replaced}
    prefix = keys.partition_data_prefix(TOPIC, 0, REVISION)
    for info in ctx.store.list(prefix):
        name = info.key[len(prefix):]
        parsed = keys.parse_segment_name(name)
        if parsed is not None and parsed.generation:  # a merged object: must be listed
            assert name in listed, name


def test_archiver_committing_concurrently_loses_nothing(ctx: JobContext) -> None:
    """A thread archives new segments (CAS, re-read on conflict) all through the merge, and
    the merge's commit waits until it has committed once more, so they certainly race."""
    logs = seed(ctx.manifests, partitions=1, segments=30)
    step = RECORDS_PER_BATCH * BATCHES_PER_SEGMENT
    stop = threading.Event()
    appended: list[bytes] = []
    errors: list[BaseException] = []
    progressed = threading.Condition()

    def archiver() -> None:
        nxt = 30
        try:
            while not stop.is_set() and nxt < 90:
                blob = segment_bytes(nxt * step)
                while True:
                    try:
                        upload_segments(ctx.manifests, 0, [blob])
                        break
                    except ManifestConflict:
                        continue  # the merge committed: re-read and append again
                with progressed:
                    appended.append(blob)
                    progressed.notify_all()
                nxt += 1
        except BaseException as exc:
            errors.append(exc)

    def wait_for_archiver(part: PartitionRef) -> None:
        with progressed:
            seen = len(appended)
            progressed.wait_for(lambda: len(appended) > seen or stop.is_set(), timeout=30)

    thread = threading.Thread(target=archiver)
    thread.start()
    try:
        summary = run_merge(ctx, before_commit=wait_for_archiver)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors
    assert summary["ok"], summary["errors"]
    assert summary["runs_committed"] >= 1
    assert summary["commit_conflicts"] >= 1
    assert_every_offset_reads_back(ctx.manifests, 0, logs[0] + b"".join(appended))


def test_corrupt_source_is_refused_and_nothing_is_uploaded(ctx: JobContext) -> None:
    logs = seed(ctx.manifests, partitions=1, segments=8)
    m, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    victim = m.segments[2]
    data = bytearray(ctx.store.get(m.segment_key(victim)))
    data[-3] ^= 0xFF
    ctx.store.put(m.segment_key(victim), bytes(data))

    summary = run_merge(ctx)

    assert not summary["ok"]
    assert any(victim.object_name in e and "CRC-32C" in e for e in summary["errors"])
    after, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    run_with_victim = [s for s in after.segments if s.base_offset <= victim.base_offset
                       <= s.last_offset]
    assert run_with_victim == [victim]  # its run was not merged
    prefix = keys.partition_data_prefix(TOPIC, 0, REVISION)
    listed = set(after.segments.object_names()) | {r.segment.object_name for r in after.replaced}
    for info in ctx.store.list(prefix):
        name = info.key[len(prefix):]
        if name.endswith(".log"):
            assert name in listed, f"unlisted object {name} left behind"
    assert len(logs[0]) == sum(s.size_bytes for s in after.segments)


def test_merge_over_s3_with_boto3_in_executors(
    s3_store: ObjectStore, spark: Any, tmp_path: Path
) -> None:
    context = make_context(s3_store, cloud_storage_segment_size_target=8192,
                           cloud_storage_segment_size_min=4096)
    logs = seed(context.manifests, partitions=1, segments=10)
    summary = run_merge(context)
    assert summary["ok"], summary["errors"]
    assert summary["after"]["segments"] < 10
    assert_every_offset_reads_back(context.manifests, 0, logs[0])


def test_merged_object_never_replaces_an_existing_object(file_store: ObjectStore) -> None:
    """A leftover at the first name a run would take (an earlier attempt's orphan) is left
    alone: the executor claims the next generation with If-None-Match (no Spark needed)."""
    context = make_context(file_store, cloud_storage_segment_size_target=8192,
                           cloud_storage_segment_size_min=4096)
    seed(context.manifests, partitions=1, segments=12)
    m, _ = context.manifests.load(TOPIC, 0, REVISION)
    limits = merge_limits(context.config.cluster, context.config.topic_config(TOPIC))
    tasks = build_tasks(PartitionRef(TOPIC, 0, REVISION), m, plan_runs(m.segments, limits).runs,
                        256)
    task = tasks[0]
    first = keys.segment_name(task.base_offset, task.last_offset, task.writer_term,
                              generation=task.generation)
    squatter = task.data_prefix + first
    file_store.put(squatter, b"someone else's bytes")

    result = merge_run(file_store, task)

    assert result.error is None and result.meta is not None
    assert result.meta.object_name == keys.segment_name(
        task.base_offset, task.last_offset, task.writer_term, generation=task.generation + 1)
    assert file_store.get(squatter) == b"someone else's bytes"
    merged = file_store.get(result.uploaded_keys[0])
    assert merged == b"".join(file_store.get(src.key) for src in task.sources)
    assert crc32c.crc32c(merged) == result.meta.checksum
