"""Merging while the real archiver (`Archiver.run_once`) keeps archiving the same partition:
neither loses anything (design invariant 1, 4, 6). The bucket afterwards holds exactly the local
log's bytes, offset for offset, whichever commit won each race."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from support.archiving import Clock, Disk, make_config, revision, write_partition
from support.spark import read_back

from archiver.service import Archiver
from manifests import ManifestSettings, ManifestStore
from spark_jobs.job_context import JobContext, PartitionRef
from spark_jobs.merge import run_merge
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog
from tiered.store.base import ObjectStore

pytestmark = pytest.mark.spark

TOPIC = "orders"


def local_closed_bytes(log_dir: Path) -> bytes:
    part = LocalLog([log_dir]).partition(TopicPartition(TOPIC, 0))
    return b"".join(s.log_path.read_bytes() for s in part.closed_segments)


def test_merge_and_archiver_racing_lose_nothing(
    tmp_path: Path, file_store: ObjectStore, spark: Any
) -> None:
    # advise: local segments stay, so the bucket can be compared with them at the end
    config = make_config(tmp_path, mode="advise", cluster={
        "cloud_storage_segment_size_target": 16384, "cloud_storage_segment_size_min": 6000})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, TOPIC, 0, batches=60)
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk())
    first = archiver.run_once()
    assert first.ok, first.errors
    rev = revision(log_dir, TOPIC, 0)
    mstore = ManifestStore(file_store, ManifestSettings.from_cluster(config.cluster))
    assert len(mstore.load(TOPIC, 0, rev)[0].segments) >= 10

    stop = threading.Event()
    passes = threading.Condition()
    done: list[int] = []
    faults: list[BaseException] = []

    def archive_forever() -> None:
        try:
            while not stop.is_set() and len(done) < 40:
                write_partition(log_dir, TOPIC, 0, batches=3)
                report = archiver.run_once()  # a pass that loses a race reports it, retries later
                with passes:
                    done.append(sum(p.uploaded_segments for p in report.partitions))
                    passes.notify_all()
        except BaseException as exc:
            faults.append(exc)

    def wait_for_an_upload(part: PartitionRef) -> None:
        with passes:
            seen = sum(done)
            passes.wait_for(lambda: sum(done) > seen or stop.is_set(), timeout=60)

    ctx = JobContext(config, file_store.settings, file_store, mstore)
    thread = threading.Thread(target=archive_forever)
    thread.start()
    try:
        summary = run_merge(ctx, before_commit=wait_for_an_upload)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not faults, faults
    assert summary["ok"], summary["errors"]
    assert summary["runs_committed"] >= 1
    assert summary["commit_conflicts"] >= 1  # the archiver committed between plan and commit

    # the archiver catches up after the races it lost: everything closed is in the bucket
    for _ in range(5):
        report = archiver.run_once()
        if report.ok and not any(p.uploaded_segments for p in report.partitions):
            break
    m, whole = read_back(mstore, 0, topic=TOPIC, revision=rev)
    assert any(seg.name for seg in m.segments), "merged segments survived the archiver"
    assert m.log_start_offset == 0
    assert whole == local_closed_bytes(log_dir)

