"""Discovery of partitions in log dirs, including the odd and hostile names a real log dir
holds, per-partition state from Kafka's files, and re-scans while the broker writes."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from tiered.kafka.checkpoints import EpochEntry, read_partition_metadata
from tiered.kafka.local_log import LocalLog, TopicPartition
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks

T0 = 1_700_000_000.0


def fill(partition_dir: Path, batches: int, *, segment_bytes: int = 4000,
         epochs: tuple[int, ...] = (0,)) -> LogWriter:
    """A closed-down partition dir with `batches` batches of 3 records."""
    writer = LogWriter(partition_dir, segment_bytes=segment_bytes, clock=lambda: T0, fsync=False)
    with writer:
        for i in range(batches):
            epoch = epochs[min(i * len(epochs) // batches, len(epochs) - 1)]
            writer.append([ProducerRecord(b"x" * 200) for _ in range(3)], leader_epoch=epoch)
    return writer


@pytest.fixture()
def log_dir(tmp_path: Path) -> Path:
    root = tmp_path / "kafka-logs"
    fill(root / "orders-0", 30, epochs=(0, 2, 5))
    fill(root / "orders-1", 3)
    fill(root / "my.topic-with-dashes-12", 5)
    # what else lives in a real log dir
    for name in ["foo-delete", "orders-2.0123456789abcdef0123456789abcdef-delete",
                 "x.abc123-future", "orders-0.fedcba9876543210fedcba9876543210-future",
                 "orders-7.0123456789abcdef0123456789abcdef-stray",
                 "notapartition", "bad topic-0", "orders-x", "orders-"]:
        (root / name).mkdir()
        (root / name / "00000000000000000000.log").write_bytes(b"")
    for name in ["meta.properties", ".lock", "recovery-point-offset-checkpoint", "stray.txt",
                 "orders-3"]:  # a *file* named like a partition
        (root / name).write_text("0\n0\n" if "checkpoint" in name else "junk")
    write_high_watermarks(root, {TopicPartition("orders", 0): 75,
                                 TopicPartition("my.topic-with-dashes", 12): 15})
    return root


def test_discovers_exactly_the_live_partitions(log_dir: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tiered.kafka.local_log")
    local = LocalLog([log_dir])
    assert [p.tp for p in local] == [
        TopicPartition("my.topic-with-dashes", 12),
        TopicPartition("orders", 0),
        TopicPartition("orders", 1),
    ]
    logged = caplog.text
    for skipped in ["foo-delete", "x.abc123-future", "-stray", "notapartition", "bad topic-0",
                    "orders-x", "stray.txt", "orders-3"]:
        assert skipped in logged, skipped
    assert "meta.properties" not in logged  # Kafka's own files are not news


def test_partition_state(log_dir: Path) -> None:
    local = LocalLog([log_dir])
    orders0 = local.partition(TopicPartition("orders", 0))
    assert orders0.topic == "orders" and orders0.partition == 0
    assert orders0.dir == log_dir / "orders-0"
    bases = [s.base_offset for s in orders0.segments]
    assert bases == sorted(bases) and len(bases) > 3
    assert orders0.active_segment is orders0.segments[-1]
    assert orders0.active_segment.active
    assert not any(s.active for s in orders0.closed_segments)
    assert orders0.closed_segments == orders0.segments[:-1]
    assert orders0.log_end_offset() == 90
    assert orders0.high_watermark == 75
    assert orders0.log_start_offset == 0
    assert orders0.problems == ()
    assert local.partition(TopicPartition("orders", 1)).high_watermark is None
    # topic id from partition.metadata, as the writer made it
    assert orders0.topic_id == read_partition_metadata(log_dir / "orders-0" / "partition.metadata")
    assert orders0.topic_id != local.partition(TopicPartition("orders", 1)).topic_id


def test_leader_epochs_and_epoch_for_offset(log_dir: Path) -> None:
    orders0 = LocalLog([log_dir]).partition(TopicPartition("orders", 0))
    assert orders0.leader_epochs == (EpochEntry(0, 0), EpochEntry(2, 30), EpochEntry(5, 60))
    assert orders0.epoch_for_offset(0) == 0
    assert orders0.epoch_for_offset(29) == 0
    assert orders0.epoch_for_offset(30) == 2
    assert orders0.epoch_for_offset(59) == 2
    assert orders0.epoch_for_offset(10**9) == 5
    assert orders0.epoch_for_offset(-1) is None


def test_unknown_partition_is_a_clear_error(log_dir: Path) -> None:
    with pytest.raises(Exception, match="orders-9 is not in log dirs"):
        LocalLog([log_dir]).partition(TopicPartition("orders", 9))


def test_one_bad_partition_does_not_hide_the_others(log_dir: Path) -> None:
    (log_dir / "orders-1" / "leader-epoch-checkpoint").write_text("0\n5\n1 0\n")
    (log_dir / "orders-1" / "partition.metadata").write_text("garbage")
    local = LocalLog([log_dir])
    broken = local.partition(TopicPartition("orders", 1))
    assert len(broken.problems) == 2
    assert broken.leader_epochs == () and broken.topic_id is None
    assert [s.base_offset for s in broken.segments] == [0]
    assert local.partition(TopicPartition("orders", 0)).problems == ()


def test_corrupt_high_watermark_checkpoint_makes_them_unknown(log_dir: Path) -> None:
    (log_dir / "replication-offset-checkpoint").write_text("0\n3\norders 0 75\n")
    local = LocalLog([log_dir])
    for part in local:
        assert part.high_watermark is None
        assert any("replication-offset-checkpoint" in p for p in part.problems)


def test_rescan_picks_up_new_partitions_and_segments(log_dir: Path) -> None:
    local = LocalLog([log_dir])
    before = local.partition(TopicPartition("orders", 1)).segments
    with LogWriter(log_dir / "orders-1", segment_bytes=4000, clock=lambda: T0,
                   fsync=False) as writer:
        for _ in range(20):
            writer.append([ProducerRecord(b"y" * 500)])
    fill(log_dir / "payments-0", 2)
    shutil.rmtree(log_dir / "my.topic-with-dashes-12")
    result = local.scan()
    assert result.added == (TopicPartition("payments", 0),)
    assert result.removed == (TopicPartition("my.topic-with-dashes", 12),)
    assert result.changed == (TopicPartition("orders", 1),)
    after = local.partition(TopicPartition("orders", 1)).segments
    assert len(after) > len(before)
    assert local.partition(TopicPartition("orders", 1)).log_end_offset() == 29
    assert TopicPartition("payments", 0) in local
    assert local.scan() == type(result)((), (), ())


def test_several_log_dirs_and_duplicates(tmp_path: Path, log_dir: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    second = tmp_path / "second"
    fill(second / "audit-3", 2)
    fill(second / "orders-1", 2)  # also in the first dir: ambiguous, so neither is used
    local = LocalLog([log_dir, second, tmp_path / "missing"])
    tps = {p.tp for p in local}
    assert TopicPartition("audit", 3) in tps
    assert TopicPartition("orders", 1) not in tps
    assert TopicPartition("orders", 0) in tps
    assert "two log dirs" in caplog.text
    assert "missing" in caplog.text


def test_partition_dir_without_segments_yet(tmp_path: Path) -> None:
    (tmp_path / "fresh-0").mkdir()
    part = LocalLog([tmp_path]).partition(TopicPartition("fresh", 0))
    assert part.segments == () and part.active_segment is None
    assert part.log_end_offset() is None and part.closed_segments == ()


def test_a_single_path_is_not_mistaken_for_a_list(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        LocalLog(str(tmp_path))  # type: ignore[arg-type]


def test_a_stray_directory_is_reported_once_per_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`lost+found` (and a `-delete` directory) would otherwise be reported on every scan."""
    log_dir = tmp_path / "logs"
    (log_dir / "lost+found").mkdir(parents=True)
    (log_dir / "orders-0.abc123-delete").mkdir()
    with caplog.at_level(logging.DEBUG, logger="tiered.kafka.local_log"):
        for _ in range(5):
            LocalLog([log_dir]).scan()
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len([r for r in loud if "lost+found" in r.getMessage()]) == 1
    assert len([r for r in loud if "-delete" in r.getMessage()]) == 1


def _age(directory: Path, seconds: float = 10.0) -> None:
    """Set a directory's mtime back, out of the window a scan re-reads whatever it says."""
    import os
    import time

    past = time.time() - seconds
    os.utime(directory, (past, past))


def test_a_reusing_scan_keeps_an_unchanged_partition_and_rereads_a_changed_one(
        tmp_path: Path) -> None:
    root = tmp_path / "logs"
    fill(root / "orders-0", 12)
    fill(root / "orders-1", 12)
    write_high_watermarks(root, {TopicPartition("orders", 0): 5,
                                 TopicPartition("orders", 1): 5}, fsync=False)
    for p in (0, 1):
        _age(root / f"orders-{p}")
    local = LocalLog([root], reuse_unchanged=True)
    first = dict(local.partitions)
    local.scan()
    # nothing moved: the very same objects, no file of theirs read again
    assert all(local.partitions[tp] is part for tp, part in first.items())
    # a roll in orders-1 moves its directory's mtime; a new high watermark for orders-0 only
    # moves a checkpoint in the log dir
    segments = len(first[TopicPartition("orders", 1)].segments)
    fill(root / "orders-1", 12)
    write_high_watermarks(root, {TopicPartition("orders", 0): 9,
                                 TopicPartition("orders", 1): 5}, fsync=False)
    local.scan()
    zero, one = local.partitions[TopicPartition("orders", 0)], \
        local.partitions[TopicPartition("orders", 1)]
    assert zero.high_watermark == 9 and zero.segments is first[TopicPartition("orders", 0)].segments
    assert len(one.segments) > segments
    # without reuse every scan reads every directory again
    plain = LocalLog([root])
    before = dict(plain.partitions)
    plain.scan()
    assert all(plain.partitions[tp] is not part for tp, part in before.items())
