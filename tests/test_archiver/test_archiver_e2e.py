"""The archiver end to end against moto's S3 over HTTP: a multi-partition log is archived with
every closed segment in the manifest exactly once, contiguous, and byte-identical to the local
files (design invariant 1, 3, 4); the active segment stays local; topic manifests are written.

The helpers here (config, log writing, a fake clock and disk) are shared by the other
`test_archiver_*` modules."""

from __future__ import annotations

from pathlib import Path

from support.archiving import (
    Clock,
    Disk,
    closed_segments,
    drain,
    load_manifest,
    make_config,
    revision,
    write_partition,
)

from archiver.service import Archiver
from manifests import segment_indexes
from manifests.topic import load_topic_manifest
from tiered.store.base import ObjectStore


def test_multi_partition_log_archived_exactly_once_and_byte_identical(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    layout = {("orders", 0): 40, ("orders", 1): 25, ("orders", 2): 3, ("events", 0): 30}
    for (topic, p), n in layout.items():
        write_partition(log_dir, topic, p, batches=n)

    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk())
    rounds = drain(archiver)
    assert rounds == 2  # at most 8 segments per partition and round: 13 closed take two
    again = archiver.run_once()  # later passes find nothing new: nothing uploaded twice
    assert again.ok, again.errors
    assert sum(r.uploaded_segments for r in again.partitions) == 0

    for (topic, p), _ in layout.items():
        m = load_manifest(s3_store, log_dir, topic, p)
        local = closed_segments(log_dir, topic, p)
        segs = list(m.segments)
        # every closed segment exactly once, in order, contiguous; the active one never
        assert [s.base_offset for s in segs] == [int(p_.stem) for p_ in local]
        for prev, cur in zip(segs, segs[1:], strict=False):
            assert cur.base_offset == prev.last_offset + 1
        for seg, path in zip(segs, local, strict=True):
            body = s3_store.get(m.segment_key(seg))
            assert body == path.read_bytes()
            assert seg.size_bytes == len(body)
            assert seg.writer_term == 1
            indexes = segment_indexes.read_indexes(s3_store, m.data_prefix, seg.object_name,
                                                   seg.index_layout, ("index", "timeindex"),
                                                   segment_bytes=seg.size_bytes)
            for kind in ("index", "timeindex"):
                assert indexes[kind] == path.with_suffix(f".{kind}").read_bytes()

    # a partition whose data all sits in the active segment uploads nothing
    assert load_manifest(s3_store, log_dir, "orders", 2).last_offset == -1
    # a topic manifest per archived topic, counting every partition seen locally (orders-2
    # has nothing in the bucket yet, but it is one of the topic's partitions)
    orders = load_topic_manifest(s3_store, "orders", revision(log_dir, "orders", 0))
    assert orders is not None and orders.partition_count == 3
    stats = archiver.snapshot()
    assert stats.uploaded_segments_total == sum(
        len(load_manifest(s3_store, log_dir, t, p).segments) for t, p in layout)
    assert stats.commits_total >= 3 and stats.upload_errors_total == 0


def test_describe_rows_have_the_documented_fields(tmp_path: Path, s3_store: ObjectStore
                                                  ) -> None:
    config = make_config(tmp_path, mode="advise")
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=20)
    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk())
    archiver.run_once()
    # a fresh process (the CLI) reads the manifests before it judges what is safe
    fresh = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk())
    [row] = fresh.describe("orders")
    assert set(row) == {"topic", "partition", "high_watermark", "local", "remote",
                        "pending_bytes", "safe_to_delete_below", "uploader", "role"}
    # an Archiver built without leases is the sole writer of what it holds, and names itself
    # as its uploader (never "-" beside the role "uploader")
    assert row["role"] == "uploader" and row["uploader"] == config.node_id()
    assert set(row["local"]) == {"start_offset", "last_offset", "size_bytes", "segments"}
    assert set(row["remote"]) == {"start_offset", "last_offset", "size_bytes", "segments",
                                  "archived_manifests"}
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert row["high_watermark"] == 80
    assert row["local"]["last_offset"] == 79
    assert row["remote"]["last_offset"] == m.last_offset
    assert row["remote"]["segments"] == len(m.segments)
    assert row["safe_to_delete_below"] == m.last_offset + 1
    # advise mode never deletes: the local log still starts at 0
    assert row["local"]["start_offset"] == 0
    # only the active segment is pending
    active = sorted((log_dir / "orders-0").glob("*.log"))[-1]
    assert row["pending_bytes"] == active.stat().st_size
    assert fresh.describe("nope") == []


def test_controller_budget_follows_the_backlog_and_fixed_shares_pin_it(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    config = make_config(tmp_path, cluster={"cloud_storage_max_connections": 10})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=30)
    backlog = sum(p.stat().st_size for p in (log_dir / "orders-0").glob("*.log"))
    # the backlog is half of the room it competes for: maximum shares, full concurrency
    disk = Disk(total=10 * backlog, free=backlog)
    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=disk)
    out = archiver.update_controller()
    assert out.updated and out.backlog_ratio == 0.5 and out.shares == 1000
    assert archiver.budget.concurrency == 10
    stats = archiver.snapshot()
    assert stats.pending_bytes == backlog
    assert stats.pending_bytes_by_partition == {("orders", 0): backlog}
    assert stats.controller_shares == 1000 and stats.controller_error == -500

    pinned = Archiver(config, s3_store, clock=Clock(), disk_usage=disk, fixed_shares=100)
    assert pinned.update_controller().shares == 100
    assert pinned.budget.concurrency == 1  # 10 connections x 100 / 1000 shares
    drain(archiver)
    archiver.update_controller()  # within the update interval: the last output stands
    assert archiver.snapshot().controller_shares == 1000


def test_topic_manifest_is_rewritten_when_the_settings_change(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    config = make_config(tmp_path, topics={"orders": {"retention.ms": 1000}})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=6)
    Archiver(config, s3_store, clock=Clock(), disk_usage=Disk()).upload_round()
    rev = revision(log_dir, "orders", 0)
    saved = load_topic_manifest(s3_store, "orders", rev)
    assert saved is not None and saved.retention_ms == 1000
    changed = make_config(tmp_path, topics={"orders": {"retention.ms": 2000}})
    Archiver(changed, s3_store, clock=Clock(), disk_usage=Disk()).upload_round()
    saved = load_topic_manifest(s3_store, "orders", rev)
    assert saved is not None and saved.retention_ms == 2000
