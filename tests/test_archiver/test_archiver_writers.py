"""Several writers on one partition (design invariant 6): a stale term is fenced and stops,
a same-term race re-reads the head instead of overwriting it, and in every case no segment
is lost or listed twice."""

from __future__ import annotations

import threading
from pathlib import Path

from support.archiving import (
    Clock,
    Disk,
    closed_segments,
    drain,
    load_manifest,
    make_config,
    write_partition,
)

from archiver.service import Archiver
from manifests.manifest import PartitionManifest
from tiered.store.base import ObjectStore


def assert_complete(m: PartitionManifest, local: list[Path], store: ObjectStore) -> None:
    """Every closed segment exactly once, contiguous, its object present and identical."""
    segs = list(m.segments)
    assert [s.base_offset for s in segs] == [int(p.stem) for p in local]
    for prev, cur in zip(segs, segs[1:], strict=False):
        assert cur.base_offset == prev.last_offset + 1
    for seg, path in zip(segs, local, strict=True):
        assert store.get(m.segment_key(seg)) == path.read_bytes()


def test_stale_term_is_fenced_and_nothing_is_lost(tmp_path: Path, s3_store: ObjectStore
                                                  ) -> None:
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=60)  # 19 closed segments: three rounds
    old = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(), term=1)
    new = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(), term=2)

    assert old.upload_round().partitions[0].uploaded_segments == 8
    assert new.upload_round().partitions[0].uploaded_segments == 8  # takes over at term 2
    fenced = old.upload_round()
    [row] = fenced.partitions
    assert row.decision == "fenced" and not fenced.ok
    assert "term" in (row.error or "")
    # a fenced writer stays out: no more uploads, no housekeeping deletions
    assert old.upload_round().partitions[0].decision == "fenced"
    assert old.housekeeping().deleted_remote_objects == 0

    drain(new)
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert m.term == 2
    assert_complete(m, closed_segments(log_dir, "orders", 0), s3_store)
    assert {s.writer_term for s in m.segments} == {1, 2}


def test_racing_writers_of_different_terms_lose_nothing(tmp_path: Path,
                                                        s3_store: ObjectStore) -> None:
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=75)
    writers = [Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(), term=t)
               for t in (3, 4)]
    start = threading.Barrier(2)

    def run(archiver: Archiver) -> None:
        start.wait()
        for _ in range(4):
            archiver.upload_round()

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    drain(writers[1])
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert_complete(m, closed_segments(log_dir, "orders", 0), s3_store)
    if m.term == 4:  # the newer writer committed: the older one is fenced from now on
        assert writers[0].upload_round().partitions[0].decision == "fenced"


def test_same_term_race_rereads_the_head_instead_of_overwriting(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=45)
    a = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(), term=1)
    b = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(), term=1)
    a.describe()  # both have read the empty head
    b.describe()
    assert b.upload_round().partitions[0].uploaded_segments == 8
    assert b.upload_round().partitions[0].uploaded_segments == 6
    lost = a.upload_round()  # uploads the first 8 again, then loses the compare-and-swap
    [row] = lost.partitions
    assert row.uploaded_segments == 0 and row.error is not None
    assert a.snapshot().commit_conflicts_total == 1
    drain(a)  # next rounds continue from the head b wrote
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert_complete(m, closed_segments(log_dir, "orders", 0), s3_store)
