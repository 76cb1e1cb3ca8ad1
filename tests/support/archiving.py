"""Write-path test helpers: Kafka logs written with the log writer, configs over a temporary
log dir, a settable clock and disk, upload rounds run until nothing is left, and the committed
manifest read back."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from archiver.service import Archiver
from archiver.space import DiskInfo
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest
from support.configs import config_over
from tiered.config import Config
from tiered.kafka.checkpoints import TopicPartition, read_partition_metadata, topic_id_to_str
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.store.base import ObjectStore

#: a fixed "now" for the logs, seconds since the epoch
T0 = 1_700_000_000.0


GiB = 1024**3


class Clock:
    """An injected clock in seconds; tests move it explicitly."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Disk:
    """An injected `disk_usage`: fixed totals the test changes at will."""

    def __init__(self, total: int = 100 * GiB, free: int = 90 * GiB) -> None:
        self.total, self.free = total, free

    def __call__(self, path: Path) -> DiskInfo:
        return DiskInfo(self.total, self.free)


def make_config(
    tmp_path: Path,
    *,
    cluster: Mapping[str, Any] | None = None,
    topics: Mapping[str, Mapping[str, Any]] | None = None,
    mode: str = "enforce",
) -> Config:
    """A config over `tmp_path/logs`; the store is passed to the Archiver directly."""
    return config_over(tmp_path, url=(tmp_path / "unused-bucket").as_uri(), mode=mode,
                       cluster=cluster, topics=topics)


def write_partition(
    log_dir: Path,
    topic: str,
    partition: int,
    *,
    batches: int,
    records: int = 4,
    value_bytes: int = 300,
    segment_bytes: int = 4096,
    epoch: int = 1,
    timestamp_ms: int | None = None,
    high_watermark: int | None = None,
) -> LogWriter:
    """Append `batches` batches to `{topic}-{partition}` (segments roll at `segment_bytes`)
    and checkpoint the high watermark (default: the log end offset)."""
    # every partition of a topic shares the topic id, as in Kafka
    topic_id = uuid.uuid5(uuid.NAMESPACE_DNS, topic)
    writer = LogWriter(log_dir / f"{topic}-{partition}", segment_bytes=segment_bytes,
                       clock=lambda: T0, fsync=False, topic_id=topic_id)
    with writer:
        if writer.leader_epoch != epoch:
            writer.become_leader(epoch)
        for _ in range(batches):
            writer.append([ProducerRecord(b"v" * value_bytes, timestamp=timestamp_ms)
                           for _ in range(records)])
        end = writer.log_end_offset
    hw = end if high_watermark is None else high_watermark
    write_high_watermarks(log_dir, {TopicPartition(topic, partition): hw}, fsync=False)
    return writer


def drain(archiver: Archiver, limit: int = 10) -> int:
    """Run upload rounds until one uploads nothing; returns how many uploaded something."""
    for n in range(limit):
        report = archiver.upload_round()
        assert report.ok, report.errors
        if not any(r.uploaded_segments for r in report.partitions):
            return n
    raise AssertionError(f"still uploading after {limit} rounds")


def revision(log_dir: Path, topic: str, partition: int) -> str:
    meta = read_partition_metadata(log_dir / f"{topic}-{partition}" / "partition.metadata")
    return topic_id_to_str(meta)


def load_manifest(store: ObjectStore, log_dir: Path, topic: str, partition: int
                  ) -> PartitionManifest:
    m, _ = ManifestStore(store).load(topic, partition, revision(log_dir, topic, partition))
    return m


def before_put_file(monkeypatch: pytest.MonkeyPatch, store: ObjectStore,
                    hook: Callable[[str], None]) -> None:
    """Make `store.put_file` call `hook(key)` first: to watch, hold or meet an upload."""
    put_file = store.put_file

    def hooked(key: str, path: Path | str, **kwargs: Any) -> str:
        hook(key)
        return put_file(key, path, **kwargs)

    monkeypatch.setattr(store, "put_file", hooked)


def before_put(monkeypatch: pytest.MonkeyPatch, store: ObjectStore,
               hook: Callable[[str], None]) -> None:
    """Make `store.put` (an object from bytes: index bundles, manifests) call `hook(key)`
    first."""
    put = store.put

    def hooked(key: str, data: bytes, **kwargs: Any) -> Any:
        hook(key)
        return put(key, data, **kwargs)

    monkeypatch.setattr(store, "put", hooked)


def closed_segments(log_dir: Path, topic: str, partition: int) -> list[Path]:
    part = LocalLog([log_dir]).partition(TopicPartition(topic, partition))
    return [s.log_path for s in part.closed_segments]
