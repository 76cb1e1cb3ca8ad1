"""Read-path test helpers: a partition archived once per session (the template bucket) and
copied or shared per test, the image of the log it came from (what a fetch must answer), and
a store that counts requests."""

from __future__ import annotations

import bisect
import builtins
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from archiver.service import Archiver
from archiver.space import DiskInfo
from cache.reader import Reader
from support.configs import config_over
from tiered.config import Config
from tiered.kafka.checkpoints import TopicPartition, topic_id_to_str
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, ProducerRecord
from tiered.kafka.records import Header, iter_batch_headers, iter_batches
from tiered.store import FileStore, StoreSettings
from tiered.store.base import Blob, ObjectInfo, ObjectStore

TOPIC = "orders"


#: record timestamps: T0_MS + 7 ms per offset (strictly increasing)
T0_MS = 1_700_000_000_000


TS_STEP = 7


GiB = 1024**3


def record_timestamp(offset: int) -> int:
    return T0_MS + TS_STEP * offset


def make_config(tmp_path: Path, *, cluster: Mapping[str, Any] | None = None,
                topics: Mapping[str, Mapping[str, Any]] | None = None,
                bucket: Path | None = None) -> Config:
    """Tiny spillover (many archived manifests), tiny chunks (many chunks per segment); the
    bucket is `tmp_path/bucket` unless given."""
    return config_over(tmp_path, url=(bucket or tmp_path / "bucket").as_uri(), mode="advise",
                       cluster={"cloud_storage_spillover_manifest_size": 1024,
                                "cloud_storage_cache_chunk_size": 300,
                                "cloud_storage_cache_size": 64 * 1024 * 1024, **(cluster or {})},
                       topics=topics)


def producer_records(first_offset: int, count: int) -> list[ProducerRecord]:
    """Varied records: null and non-null keys and values, headers, sizes."""
    out = []
    for i in range(count):
        o = first_offset + i
        key = None if o % 5 == 0 else f"key-{o}".encode()
        value = None if o % 11 == 3 else bytes([o % 251]) * (20 + (o * 37) % 90)
        headers = (Header("h", None), Header("trace", f"t{o}".encode())) if o % 4 == 1 else ()
        out.append(ProducerRecord(value, key, headers, timestamp=record_timestamp(o)))
    return out


def write_log(config: Config, *, batches: int = 300, partition: int = 0,
              start_offset: int = 0, segment_bytes: int = 600) -> int:
    """Append `batches` batches of 1..3 records (segments roll at `segment_bytes`, index
    entries every 200 bytes), then roll so every record is in a closed segment. Returns the
    log end offset."""
    writer = LogWriter(config.log_dirs[0] / f"{TOPIC}-{partition}", segment_bytes=segment_bytes,
                       index_interval_bytes=200, fsync=False, start_offset=start_offset,
                       topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC), clock=lambda: T0_MS / 1000)
    with writer:
        writer.become_leader(3)
        for b in range(batches):
            writer.append(producer_records(writer.log_end_offset, 1 + b % 3),
                          compression="lz4" if b % 7 == 0 else "none")
        writer.roll()
        return writer.log_end_offset


def archive(config: Config, store: ObjectStore) -> None:
    """Upload every closed segment with the real archiver, until nothing is left."""
    archiver = Archiver(config, store, clock=lambda: T0_MS / 1000 + 3600,
                        disk_usage=lambda _p: DiskInfo(100 * GiB, 90 * GiB))
    try:
        for _ in range(20):
            report = archiver.upload_round()
            assert report.ok, report.errors
            if not any(r.uploaded_segments for r in report.partitions):
                return
        raise AssertionError("the archiver kept uploading")
    finally:
        archiver.close()


def partition_dir(config: Config, partition: int = 0) -> Path:
    return config.log_dirs[0] / f"{TOPIC}-{partition}"


def revision(config: Config, partition: int = 0) -> str:
    part = LocalLog(config.log_dirs).partition(TopicPartition(TOPIC, partition))
    assert part.topic_id is not None
    return topic_id_to_str(part.topic_id)


@dataclass
class LogImage:
    """Every batch of a partition as written: (base, last, bytes), plus each record's offset
    and timestamp, to compute what a fetch or ListOffsets must answer."""

    batches: list[tuple[int, int, bytes]] = field(default_factory=list)
    timestamps: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, directory: Path) -> LogImage:
        image = cls()
        for path in sorted(directory.glob("*.log")):
            data = path.read_bytes()
            for h in iter_batch_headers(data):
                image.batches.append((h.base_offset, h.last_offset,
                                      data[h.position:h.end_position]))
            for batch in iter_batches(data):
                image.timestamps.extend((r.offset, r.timestamp) for r in batch.records)
        return image

    def expected(self, offset: int, max_bytes: int) -> bytes:
        """Kafka's answer: the batch holding `offset`, then whole batches within max_bytes."""
        lasts = [b[1] for b in self.batches]
        i = bisect.bisect_left(lasts, offset)
        out = self.batches[i][2]
        for _base, _last, data in self.batches[i + 1:]:
            if len(out) + len(data) > max_bytes:
                break
            out += data
        return out

    def offset_for(self, timestamp: int) -> int | None:
        return next((o for o, ts in self.timestamps if ts >= timestamp), None)


class CountingStore(ObjectStore):
    """Delegates to a real store, counting requests by kind."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self.calls: dict[str, int] = {}
        self.bytes_read = 0

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        self._count("put")
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: Path | str, *,
                 ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        self._count("put")
        return self.inner.put_file(key, path, ready=ready, byte_range=byte_range)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        self._count("get")
        data = self.inner.get(key, byte_range)
        self.bytes_read += len(data)
        return data

    def head(self, key: str) -> ObjectInfo:
        self._count("head")
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count("list")
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        self._count("delete")
        return self.inner.delete_many(keys)


@dataclass
class Fixture:
    config: Config
    store: ObjectStore
    image: LogImage
    end: int

    def reader(self, **kwargs: Any) -> Reader:
        kwargs.setdefault("metadata_ttl_s", 60.0)
        return Reader(self.config, self.store, local_log=LocalLog(self.config.log_dirs),
                      **kwargs)


def archived_partition(tmp_path: Path, store: ObjectStore, *, batches: int = 300,
                       cluster: Mapping[str, Any] | None = None,
                       topics: Mapping[str, Mapping[str, Any]] | None = None,
                       start_offset: int = 0) -> Fixture:
    config = make_config(tmp_path, cluster=cluster, topics=topics)
    end = write_log(config, batches=batches, start_offset=start_offset)
    image = LogImage.of(partition_dir(config))
    archive(config, store)
    return Fixture(config, store, image, end)


def drop_local_segments(config: Config, below: int | None = None, partition: int = 0) -> None:
    """Delete local segments (all of them, or those ending below offset `below`), as local
    retention would once they are in the bucket; None removes the partition directory."""
    directory = partition_dir(config, partition)
    if below is None:
        shutil.rmtree(directory)
        return
    part = LocalLog(config.log_dirs).partition(TopicPartition(TOPIC, partition))
    for seg in part.closed_segments:
        last = seg.last_offset()
        if last is not None and last < below:
            for path in (seg.log_path, seg.index_path, seg.timeindex_path):
                path.unlink(missing_ok=True)


_TEMPLATE: list[tuple[Path, LogImage, int]] = []


def template(factory: pytest.TempPathFactory) -> tuple[Path, LogImage, int]:
    """Built once per test session (writing and archiving takes seconds): a `file://` bucket
    holding 300 batches over many archived manifests, and the image of the log it came from.
    Shared read-only by every test module that reads it."""
    if not _TEMPLATE:
        base = factory.mktemp("remote-template")
        store = FileStore(StoreSettings(url=(base / "bucket").as_uri()))
        fx = archived_partition(base, store)
        _TEMPLATE.append((base, fx.image, fx.end))
    return _TEMPLATE[0]


def shared_remote(tmp_path: Path, factory: pytest.TempPathFactory) -> Fixture:
    """The template bucket, shared read-only (copying it costs seconds), with this test's
    own cache and (empty) log dirs: nothing is local any more."""
    base, image, end = template(factory)
    config = make_config(tmp_path, bucket=base / "bucket")
    store = FileStore(StoreSettings(url=(base / "bucket").as_uri()))
    return Fixture(config, store, image, end)


def private_remote(tmp_path: Path, factory: pytest.TempPathFactory) -> Fixture:
    """A private copy of the template bucket, for tests that damage it."""
    base, image, end = template(factory)
    shutil.copytree(base / "bucket", tmp_path / "bucket")
    config = make_config(tmp_path)
    store = FileStore(StoreSettings(url=(tmp_path / "bucket").as_uri()))
    return Fixture(config, store, image, end)


def as_earlier_releases_wrote(store: ObjectStore, topic: str = TOPIC, partition: int = 0
                              ) -> int:
    """Rewrite a partition in the bucket as releases before the index bundle left it: each
    segment's indexes as Kafka's own files, one object per kind (no `.txnindex` for a segment
    without aborted transactions), and a head and archived manifests that record no index
    layout (version 1 archives, under their new checksums). Returns the segments rewritten."""
    from dataclasses import replace

    import crc32c

    from manifests import segment_indexes
    from manifests.model import INDEX_FILES, ArchiveTable, SegmentMeta, SegmentTable
    from manifests.serde import (
        decode_archived_manifest,
        decode_partition_manifest,
        encode_archived_manifest,
        encode_partition_manifest,
    )

    [head] = [i.key for i in store.list("")
              if f"/meta/kafka/{topic}/{partition}_" in i.key
              and i.key.endswith("/manifest.json")]
    m = decode_partition_manifest(store.get(head), key=head)

    def rewrite(segs: SegmentTable) -> SegmentTable:
        rows: list[SegmentMeta] = []
        for seg in segs:
            sections = segment_indexes.read_indexes(
                store, m.data_prefix, seg.object_name, seg.index_layout,
                segment_indexes.INDEX_KINDS, segment_bytes=seg.size_bytes)
            files = {kind: data for kind, data in sections.items()
                     if data is not None and (data or kind != "txnindex")}
            segment_indexes.write_indexes(store, m.data_prefix, seg.object_name, files,
                                          INDEX_FILES)
            store.delete_many([m.data_prefix + name for name in
                               segment_indexes.index_object_names(seg)
                               if name.endswith(".indexes")])
            rows.append(replace(seg, index_layout=INDEX_FILES))
        return SegmentTable.from_rows(rows)

    entries = []
    count = 0
    for entry in m.archives:
        assert entry.level == 0, "rewrites level-0 archived manifests only"
        old_key = m.archive_key(entry)
        archived = decode_archived_manifest(store.get(old_key), key=old_key)
        segs = rewrite(archived.segments)
        count += len(segs)
        data = encode_archived_manifest(replace(archived, segments=segs))
        entry = replace(entry, checksum=crc32c.crc32c(data))
        store.put(m.archive_key(entry), data)
        store.delete_many([old_key])
        entries.append(entry)
    head_segments = rewrite(m.segments)
    new = m.evolve(segments=head_segments, archives=ArchiveTable.from_rows(entries))
    store.put(head, encode_partition_manifest(new))
    return count + len(head_segments)
