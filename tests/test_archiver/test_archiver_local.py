"""Local retention and space management at the edge (design invariant 2): a local segment is
deleted only when a committed manifest covers it, even with the bucket down and the disk far
over its target; advise mode never deletes; topics without remote write are left alone."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from faultproxy import FaultProxy
from support.archiving import (
    Clock,
    Disk,
    GiB,
    drain,
    load_manifest,
    make_config,
    revision,
    write_partition,
)
from support.remote import CountingStore

from archiver.service import Archiver
from manifests.keys import partition_manifest_key
from tiered.kafka.checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    TopicPartition,
    read_offset_checkpoint,
)
from tiered.store.base import ObjectStore

#: disk pressure: the log target is 1 byte, so space management wants every segment gone
PRESSURE = {"retention_local_target_capacity_bytes": 1}


def logs(log_dir: Path, topic: str, partition: int) -> list[int]:
    return sorted(int(p.stem) for p in (log_dir / f"{topic}-{partition}").glob("*.log"))


def test_store_down_from_the_start_nothing_is_deleted(
    tmp_path: Path, proxied_s3_store: Callable[..., ObjectStore], fault_proxy: FaultProxy
) -> None:
    config = make_config(tmp_path, cluster=PRESSURE)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=30)
    before = logs(log_dir, "orders", 0)
    fault_proxy.inject("internal", 10**6)  # every request fails, retries included
    archiver = Archiver(config, proxied_s3_store(), clock=Clock(), disk_usage=Disk(free=GiB))
    report = archiver.run_once()
    assert not report.ok
    assert report.deleted_local_segments == 0
    assert logs(log_dir, "orders", 0) == before
    [row] = report.partitions
    assert row.error is not None and row.safe_to_delete_below == 0
    assert not (log_dir / LOG_START_OFFSET_CHECKPOINT).exists()


def test_store_down_after_a_commit_only_covered_segments_go(
    tmp_path: Path, proxied_s3_store: Callable[..., ObjectStore], fault_proxy: FaultProxy
) -> None:
    config = make_config(tmp_path, cluster=PRESSURE)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=30)  # 9 closed segments and the active one
    before = logs(log_dir, "orders", 0)
    store = proxied_s3_store()
    archiver = Archiver(config, store, clock=Clock(), disk_usage=Disk(free=GiB))
    first = archiver.upload_round()  # 8 segments per round: two stay un-uploaded
    assert first.ok and first.partitions[0].uploaded_segments == 8
    covered = load_manifest(store, log_dir, "orders", 0).last_offset

    fault_proxy.inject("internal", 10**6)
    second = archiver.upload_round()
    assert not second.ok  # the remaining uploads fail and are not recorded
    local = archiver.local_retention()

    remaining = logs(log_dir, "orders", 0)
    assert local.deleted_local_segments == 8
    assert remaining[0] == covered + 1  # the oldest un-uploaded segment is still there
    assert remaining == before[8:]  # the un-uploaded closed segment and the active one
    for base in remaining:  # no index or other file of a kept segment was touched
        assert (log_dir / "orders-0" / f"{base:020d}.index").exists()
    assert not list((log_dir / "orders-0").glob(f"{0:020d}.*"))
    starts = read_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
    assert starts[TopicPartition("orders", 0)] == covered + 1
    [row] = local.partitions
    assert row.safe_to_delete_below == covered + 1
    # space management still wants more, but un-uploaded data holds it
    assert archiver.local_retention().deleted_local_segments == 0


def test_enforce_trims_to_the_local_target_once_uploaded(tmp_path: Path,
                                                         s3_store: ObjectStore) -> None:
    config = make_config(
        tmp_path, cluster={"retention_local_strict": True},
        topics={"orders": {"retention.local.target.bytes": 10_000}})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=30)
    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk())
    drain(archiver)
    report = archiver.local_retention()
    assert report.ok and report.deleted_local_segments > 0
    part = log_dir / "orders-0"
    assert sum(p.stat().st_size for p in part.glob("*.log")) <= 10_000
    # what was deleted is in the bucket; describe agrees with the disk
    m = load_manifest(s3_store, log_dir, "orders", 0)
    assert logs(log_dir, "orders", 0)[0] <= m.last_offset + 1
    archiver.scan()
    [row] = archiver.describe()
    assert row["local"]["start_offset"] == logs(log_dir, "orders", 0)[0]
    assert archiver.snapshot().local_deleted_segments_total == report.deleted_local_segments


def test_advise_never_deletes_and_warns_when_the_broker_will_drop_unuploaded_data(
    tmp_path: Path, proxied_s3_store: Callable[..., ObjectStore], fault_proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the broker keeps an hour; the data is 59 minutes old and the bucket is unreachable
    config = make_config(tmp_path, cluster=PRESSURE, mode="advise",
                         topics={"orders": {"retention.ms": 3_600_000}})
    log_dir = config.log_dirs[0]
    clock = Clock()
    write_partition(log_dir, "orders", 0, batches=12, timestamp_ms=int(clock() * 1000))
    clock.advance(59 * 60)
    before = logs(log_dir, "orders", 0)
    fault_proxy.inject("internal", 10**6)
    archiver = Archiver(config, proxied_s3_store(), clock=clock, disk_usage=Disk(free=GiB))
    caplog.set_level(logging.WARNING, logger="archiver.local_retention")
    report = archiver.local_retention()
    assert logs(log_dir, "orders", 0) == before
    [row] = report.partitions
    assert row.decision == "advise" and row.safe_to_delete_below == 0
    assert "at risk" in row.detail
    assert "close to the broker's retention" in caplog.text


def test_remote_write_off_uploads_nothing_and_deletes_nothing(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    config = make_config(tmp_path, cluster={**PRESSURE, "retention_local_strict": True},
                         topics={"audit": {"redpanda.remote.write": False,
                                           "retention.local.target.bytes": 0}})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "audit", 0, batches=30)
    write_partition(log_dir, "orders", 0, batches=6)
    before = logs(log_dir, "audit", 0)
    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(free=GiB))
    report = archiver.run_once()
    rows = {(r.topic, r.partition): r for r in report.partitions}
    assert rows[("audit", 0)].decision == "remote_write_off"
    assert rows[("audit", 0)].uploaded_segments == 0
    assert logs(log_dir, "audit", 0) == before
    assert not [o for o in s3_store.list() if "/audit/" in o.key]
    assert rows[("orders", 0)].uploaded_segments == 1  # the other topic is archived


@pytest.mark.parametrize(("free", "state"), [(50 * GiB, 0), (4 * GiB, 1), (GiB // 2, 2)])
def test_disk_alert_state_is_computed_in_either_mode(
    tmp_path: Path, s3_store: ObjectStore, free: int, state: int
) -> None:
    config = make_config(tmp_path, mode="advise", cluster={"storage_min_free_bytes": GiB})
    write_partition(config.log_dirs[0], "orders", 0, batches=3)
    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(free=free))
    archiver.local_retention()
    assert archiver.snapshot().disk_alert_state == state


def test_kafka_internal_topics_are_left_alone_unless_a_topic_section_asks(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """`__consumer_offsets` and friends are the broker's own state: not uploaded, not trimmed
    even under disk pressure in enforce mode; a topic section can turn remote write on."""
    config = make_config(tmp_path, cluster=PRESSURE, topics={
        "__transaction_state": {"redpanda.remote.write": True}})
    log_dir = config.log_dirs[0]
    for topic in ("__consumer_offsets", "__transaction_state", "orders"):
        write_partition(log_dir, topic, 0, batches=20)
    before = logs(log_dir, "__consumer_offsets", 0)
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk(free=GiB))
    assert not config.topic_config("__consumer_offsets").remote_write
    assert not config.topic_config("__cluster_metadata").remote_write
    assert config.topic_config("__transaction_state").remote_write
    rows = {r.topic: r for r in archiver.run_once().partitions}
    assert rows["__consumer_offsets"].decision == "remote_write_off"
    assert rows["orders"].uploaded_segments > 0
    assert rows["__transaction_state"].uploaded_segments > 0
    assert logs(log_dir, "__consumer_offsets", 0) == before  # never trimmed
    assert len(logs(log_dir, "orders", 0)) < len(before)  # the pressure did trim the others
    assert not [i.key for i in file_store.list("") if "__consumer_offsets" in i.key]


@pytest.mark.parametrize("fresh", [True, False], ids=["new process", "same process"])
@pytest.mark.parametrize("damage", ["garbled", "deleted"])
def test_a_head_garbled_or_gone_from_the_bucket_deletes_no_local_segment(
        tmp_path: Path, s3_store: ObjectStore, damage: str, fresh: bool) -> None:
    """Local data is deleted only on proof: a head freshly read from the bucket and valid that
    covers it. Once the head is damaged or gone, the local log may be the only copy left of
    what it recorded, so an enforce-mode pass under disk pressure deletes nothing, whether
    the process committed that head itself or never saw it."""
    config = make_config(tmp_path, cluster=PRESSURE)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=30)
    before = logs(log_dir, "orders", 0)
    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(free=GiB))
    drain(archiver)
    assert load_manifest(s3_store, log_dir, "orders", 0).last_offset >= before[-1] - 1
    key = partition_manifest_key("orders", 0, revision(log_dir, "orders", 0))
    if damage == "garbled":
        s3_store.put(key, b'{"version": 1, "segments": [')
    else:
        s3_store.delete_many([key])
    if fresh:
        archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk(free=GiB))
    report = archiver.local_retention()
    assert report.deleted_local_segments == 0
    assert logs(log_dir, "orders", 0) == before
    [row] = report.partitions
    assert row.safe_to_delete_below == 0


def test_local_retention_reads_a_head_only_where_it_would_delete(
        tmp_path: Path, file_store: ObjectStore) -> None:
    """The proof costs a request only where a segment would go: with no local target
    exceeded, a pass over an archived partition asks the store nothing; under pressure it
    reads that partition's head once and then deletes."""
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=30)
    counting = CountingStore(file_store)
    archiver = Archiver(config, counting, clock=Clock(), disk_usage=Disk(free=GiB))
    drain(archiver)
    counting.calls.clear()
    assert archiver.local_retention().deleted_local_segments == 0
    assert counting.calls == {}
    pressed = Archiver(make_config(tmp_path, cluster=PRESSURE), counting, clock=Clock(),
                       disk_usage=Disk(free=GiB))
    drain(pressed)
    counting.calls.clear()
    report = pressed.local_retention()
    assert report.deleted_local_segments > 0
    assert counting.calls == {"get": 1}
