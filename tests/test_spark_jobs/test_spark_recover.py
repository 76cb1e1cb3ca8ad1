"""`tiered recover`: recreating a topic's Kafka log dir from the bucket, on real PySpark.

Invariants defended: 1 and 5 (what comes back is exactly what was uploaded, every batch and
object checksum verified, a corrupt object refused and named, never written as good) and the
recovery contract of Redpanda's tiered storage (a log the local log reader and Kafka accept)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.recovery import (
    INDEX_INTERVAL_BYTES,
    REVISION,
    TOPIC,
    TOPIC_ID,
    Archived,
    archive,
    archive_with_archiver,
    index_key,
    make_config,
    make_context,
    segment_key,
    write_config_file,
    write_log,
)

from manifests.model import SegmentMeta
from spark_jobs import submit
from spark_jobs.job_context import JobContext
from spark_jobs.recover import epoch_entries, run_recover, select_newest
from tiered.errors import TieredError
from tiered.kafka.checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    EpochEntry,
    TopicPartition,
    read_offset_checkpoint,
)
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, ProducerRecord
from tiered.kafka.segment import segment_file_name
from tiered.store import open_store
from tiered.store.base import ObjectStore

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def bucket(tmp_path: Path, spark: Any) -> Iterator[tuple[JobContext, ObjectStore]]:
    config = make_config(tmp_path, log_index_interval_bytes=INDEX_INTERVAL_BYTES)
    store = open_store(config.store_settings(), probe=False)
    ctx = make_context(config, store)
    yield ctx, store
    store.close()


def _archived_log(tmp_path: Path, ctx: JobContext, store: ObjectStore) -> tuple[Path, Archived]:
    log_dir = write_log(tmp_path / "log", partitions=2)
    return log_dir, archive(store, ctx, log_dir)


def _meta(base: int, last: int, size: int) -> SegmentMeta:
    return SegmentMeta(base, last, 0, 0, size, 1, 1, 0)


# -- pure selection ----------------------------------------------------------------------------


def test_select_newest_keeps_the_newest_segments_within_the_byte_budget() -> None:
    segs = [_meta(0, 9, 100), _meta(10, 19, 100), _meta(20, 29, 100), _meta(30, 39, 100)]
    assert select_newest(segs, None) == segs
    assert select_newest(segs, 250) == segs[2:]
    assert select_newest(segs, 400) == segs
    # never less than the newest segment: the recovered log must end where the bucket's does
    assert select_newest(segs, 10) == segs[3:]
    assert select_newest([], 10) == []


def test_epoch_entries_merge_segment_transitions_and_start_at_the_log_start() -> None:
    per_segment = [[(1, 0)], [(1, 10), (2, 15)], [(2, 20)], [(4, 30)]]
    assert epoch_entries(per_segment, 0) == [EpochEntry(1, 0), EpochEntry(2, 15),
                                            EpochEntry(4, 30)]
    # log start moved past epoch 1 and into epoch 2: Kafka keeps epoch 2 from the log start
    assert epoch_entries(per_segment, 17) == [EpochEntry(2, 17), EpochEntry(4, 30)]


# -- the job -----------------------------------------------------------------------------------


def test_recovered_log_is_byte_identical_and_readable(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore]
) -> None:
    ctx, store = bucket
    log_dir, archived = _archived_log(tmp_path, ctx, store)
    before = LocalLog([log_dir])
    epochs = {p.partition: p.leader_epochs for p in before}
    shutil.rmtree(log_dir)  # the disk is lost

    summary = run_recover(ctx, topic=TOPIC, log_dir=log_dir, max_bytes=None)

    assert summary["ok"], summary["errors"]
    assert summary["revision"] == REVISION
    assert summary["segments"] == sum(len(s) for s in archived.segments.values())
    for (partition, base), files in archived.files.items():
        directory = log_dir / f"{TOPIC}-{partition}"
        for suffix, data in files.items():
            assert (directory / segment_file_name(base, suffix)).read_bytes() == data, (
                partition, base, suffix)
    after = LocalLog([log_dir])
    assert {p.tp for p in after} == {TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)}
    for part in after:
        segs = archived.segments[part.partition]
        assert not part.problems
        assert part.topic_id == TOPIC_ID
        assert [s.base_offset for s in part.segments] == [m.base_offset for m in segs]
        assert part.log_end_offset() == segs[-1].last_offset + 1
        assert part.high_watermark == segs[-1].last_offset + 1
        assert part.recovery_point == segs[-1].last_offset + 1
        assert part.log_start_offset == 0
        # the epochs the original log had for the offsets that were uploaded
        covered = [e for e in epochs[part.partition] if e.start_offset <= segs[-1].last_offset]
        assert list(part.leader_epochs) == covered
        for seg in part.closed_segments:
            seg.verify(check_indexes=True)
    assert summary["partitions"][0]["indexes_rebuilt"] == 0


def test_max_bytes_recovers_only_the_newest_segments(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore]
) -> None:
    ctx, store = bucket
    _, archived = _archived_log(tmp_path, ctx, store)
    segs = archived.segments[0]
    budget = segs[-1].size_bytes + segs[-2].size_bytes + 1
    out = tmp_path / "recovered"

    summary = run_recover(ctx, topic=TOPIC, log_dir=out, max_bytes=budget)

    assert summary["ok"], summary["errors"]
    part = LocalLog([out]).partition(TopicPartition(TOPIC, 0))
    assert [s.base_offset for s in part.segments] == [s.base_offset for s in segs[-2:]]
    start = segs[-2].base_offset
    assert read_offset_checkpoint(out / LOG_START_OFFSET_CHECKPOINT)[part.tp] == start
    assert part.log_start_offset == start
    assert part.leader_epochs[0].start_offset == start
    assert read_offset_checkpoint(out / REPLICATION_OFFSET_CHECKPOINT)[part.tp] == (
        segs[-1].last_offset + 1)
    assert read_offset_checkpoint(out / RECOVERY_POINT_OFFSET_CHECKPOINT)[part.tp] == (
        segs[-1].last_offset + 1)


def test_missing_index_objects_are_rebuilt(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore]
) -> None:
    ctx, store = bucket
    _, archived = _archived_log(tmp_path, ctx, store)
    m, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    for meta in archived.segments[0]:
        store.delete_many([index_key(m, meta, "index"), index_key(m, meta, "timeindex")])
    out = tmp_path / "recovered"

    summary = run_recover(ctx, topic=TOPIC, log_dir=out, max_bytes=None)

    assert summary["ok"], summary["errors"]
    _assert_rebuilt_partition_0(summary, archived, out)


def _assert_rebuilt_partition_0(summary: dict[str, Any], archived: Archived, out: Path) -> None:
    """Partition 0 came back byte for byte, every index rebuilt as the broker wrote it."""
    p0 = next(p for p in summary["partitions"] if p["partition"] == 0)
    assert p0["indexes_rebuilt"] == len(archived.segments[0])
    for seg in LocalLog([out]).partition(TopicPartition(TOPIC, 0)).closed_segments:
        seg.verify(check_indexes=True)
        files = archived.files[0, seg.base_offset]
        assert seg.log_path.read_bytes() == files[".log"]
        # rebuilt as the broker wrote them (same index.interval.bytes)
        assert seg.index_path.read_bytes() == files[".index"] != b""
        assert seg.timeindex_path.read_bytes() == files[".timeindex"] != b""


def test_refuses_a_non_empty_partition_dir_unless_told(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore]
) -> None:
    ctx, store = bucket
    log_dir, archived = _archived_log(tmp_path, ctx, store)

    with pytest.raises(TieredError,
                       match=r"non-empty partition directories.*orders-0.*--overwrite"):
        run_recover(ctx, topic=TOPIC, log_dir=log_dir, max_bytes=None)
    assert (log_dir / f"{TOPIC}-0" / segment_file_name(0)).exists()  # nothing touched

    summary = run_recover(ctx, topic=TOPIC, log_dir=log_dir, max_bytes=None, overwrite=True)
    assert summary["ok"], summary["errors"]
    assert len(summary["moved_aside"]) == 2
    assert all(Path(p).name.endswith("-delete") for p in summary["moved_aside"])
    assert {p.tp for p in LocalLog([log_dir])} == {TopicPartition(TOPIC, 0),
                                                   TopicPartition(TOPIC, 1)}


def test_a_corrupt_object_is_refused_and_named(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore]
) -> None:
    ctx, store = bucket
    _, archived = _archived_log(tmp_path, ctx, store)
    victim = segment_key(1, archived.segments[1][2])
    data = bytearray(store.get(victim))
    data[len(data) // 2] ^= 0xFF
    store.put(victim, bytes(data))
    out = tmp_path / "recovered"

    summary = run_recover(ctx, topic=TOPIC, log_dir=out, max_bytes=None)

    assert not summary["ok"]
    assert [p["partition"] for p in summary["partitions"]] == [0]
    assert len(summary["errors"]) == 1 and victim in summary["errors"][0]
    assert not (out / f"{TOPIC}-1").exists()  # never half a log
    assert TopicPartition(TOPIC, 1) not in LocalLog([out])


def test_unknown_topic_is_a_clear_error(bucket: tuple[JobContext, ObjectStore],
                                        tmp_path: Path) -> None:
    ctx, _ = bucket
    with pytest.raises(TieredError, match=r"unknown topic .nope.*--rebuild-manifests"):
        run_recover(ctx, topic="nope", log_dir=tmp_path / "x", max_bytes=None)


def test_recover_through_s3(tmp_path: Path, moto_endpoint: str, s3_bucket: str,
                            spark: Any) -> None:
    """The executors reach the bucket with boto3 over HTTP, from picklable settings."""
    config = make_config(tmp_path, storage={
        "url": f"s3://{s3_bucket}/pfx", "endpoint_url": moto_endpoint, "region": "us-east-1",
        "access_key": "testing", "secret_key": "testing"})
    with open_store(config.store_settings(), probe=False) as store:
        ctx = make_context(config, store)
        log_dir, archived = _archived_log(tmp_path, ctx, store)
        shutil.rmtree(log_dir)
        summary = run_recover(ctx, topic=TOPIC, log_dir=log_dir, max_bytes=None)
    assert summary["ok"], summary["errors"]
    for (partition, base), files in archived.files.items():
        path = log_dir / f"{TOPIC}-{partition}" / segment_file_name(base)
        assert path.read_bytes() == files[".log"]


def test_runs_as_a_script_with_the_cli_arguments(
    tmp_path: Path, bucket: tuple[JobContext, ObjectStore],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`spark-submit spark_jobs/submit.py recover ARGS` takes `tiered recover`'s arguments."""
    ctx, store = bucket
    _, archived = _archived_log(tmp_path, ctx, store)
    path = write_config_file(tmp_path, ctx.config)
    out = tmp_path / "recovered"
    with pytest.raises(SystemExit) as done:
        submit.main(["recover", "--config", str(path), "--topic", TOPIC, "--log-dir", str(out),
                     "--json"])
    assert done.value.code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["segments"] == sum(len(s) for s in archived.segments.values())
    assert (out / f"{TOPIC}-0" / segment_file_name(0)).read_bytes() == archived.files[0, 0][".log"]

    with pytest.raises(SystemExit) as refused:  # the dirs are there now: a clear error
        submit.main(["recover", "--config", str(path), "--topic", TOPIC, "--log-dir", str(out)])
    assert refused.value.code == 1
    assert "non-empty partition directories" in capsys.readouterr().err


def test_recover_what_the_archiver_uploaded(tmp_path: Path, spark: Any) -> None:
    """End to end with the real write path: archive a log, lose the disk, recover it."""
    log_dir = write_log(tmp_path / "log", partitions=2)
    config = make_config(tmp_path, log_dir=log_dir,
                         log_index_interval_bytes=INDEX_INTERVAL_BYTES)
    with open_store(config.store_settings()) as store:
        ctx = make_context(config, store)
        archived = archive_with_archiver(config, store, ctx)
        epochs = {p.partition: p.leader_epochs for p in LocalLog([log_dir])}
        shutil.rmtree(log_dir)

        summary = run_recover(ctx, topic=TOPIC, log_dir=log_dir, max_bytes=None)

    assert summary["ok"], summary["errors"]
    for (partition, base), files in archived.files.items():
        for suffix, data in files.items():
            path = log_dir / f"{TOPIC}-{partition}" / segment_file_name(base, suffix)
            assert path.read_bytes() == data, path
    for part in LocalLog([log_dir]):
        last = archived.segments[part.partition][-1].last_offset
        assert part.topic_id == TOPIC_ID and not part.problems
        assert part.log_end_offset() == last + 1
        assert list(part.leader_epochs) == [
            e for e in epochs[part.partition] if e.start_offset <= last]


def test_a_lost_index_bundle_is_rebuilt_unless_its_segment_holds_transactions(
        tmp_path: Path, spark: Any) -> None:
    """Without its bundle a segment's offset and time indexes are rebuilt from the log; which
    of its transactions were aborted cannot be, so a segment with transactional batches is
    refused and named rather than restored as if nothing had been aborted."""
    log_dir = write_log(tmp_path / "log", partitions=1)
    with LogWriter(log_dir / f"{TOPIC}-1", topic_id=TOPIC_ID, fsync=False,
                   index_interval_bytes=INDEX_INTERVAL_BYTES) as writer:
        writer.become_leader(1)
        writer.append([ProducerRecord(b"plain")])
        writer.append([ProducerRecord(b"aborted")], producer_id=7, producer_epoch=0,
                      base_sequence=0, transactional=True)
        writer.append_control("abort", producer_id=7, producer_epoch=0)
        writer.roll()
        writer.append([ProducerRecord(b"active")])
    config = make_config(tmp_path, log_dir=log_dir,
                         log_index_interval_bytes=INDEX_INTERVAL_BYTES)
    out = tmp_path / "recovered"
    with open_store(config.store_settings()) as store:
        ctx = make_context(config, store)
        archived = archive_with_archiver(config, store, ctx)
        bundles = [i.key for i in store.list("") if i.key.endswith(".indexes")]
        assert len(bundles) == len(archived.segments[0]) + 1
        store.delete_many(bundles)

        summary = run_recover(ctx, topic=TOPIC, log_dir=out, max_bytes=None)

    assert not summary["ok"]
    [error] = summary["errors"]
    assert f"{TOPIC}-1" in error or "/1_" in error
    assert "transactional batches" in error
    _assert_rebuilt_partition_0(summary, archived, out)
