"""The remote-read API (`cache.reader`): every offset of a long, spilled-over partition reads
back byte-identical from the bucket once the local log is gone; timestamps map to offsets as
ListOffsets does; out-of-range offsets and disabled remote read are clear errors; local data is
served without touching the bucket (design: remote read; invariants 5 and 9).

The bucket is filled by the real archiver (`Archiver.upload_round`). The helpers here are shared
by `test_reader_http.py` and `test_fetch_cli.py`.
"""

from __future__ import annotations

import bisect
import builtins
import random
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from archiver.service import Archiver
from archiver.space import DiskInfo
from cache.reader import InvalidRequest, Reader, RemoteReadDisabled, UnknownPartition
from manifests import keys
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest
from tiered.config import Config, parse_config
from tiered.errors import CorruptSegmentError, OffsetOutOfRange, TieredError
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
    log_dir = tmp_path / "logs"
    log_dir.mkdir(exist_ok=True)
    data: dict[str, Any] = {
        "storage": {"url": (bucket or tmp_path / "bucket").as_uri()},
        "log": {"dirs": [str(log_dir)], "retention": "advise"},
        "cache": {"dir": str(tmp_path / "cache")},
        "cluster": {
            "storage_min_free_bytes": 0,
            "cloud_storage_spillover_manifest_size": 1024,
            "cloud_storage_cache_chunk_size": 300,
            "cloud_storage_cache_size": 64 * 1024 * 1024,
            **(cluster or {}),
        },
        "topics": {name: dict(t) for name, t in (topics or {}).items()},
    }
    return parse_config(data, source="test", base_dir=tmp_path)


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
                 ready: Callable[[], None] | None = None) -> str:
        self._count("put")
        return self.inner.put_file(key, path, ready=ready)

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


@pytest.fixture
def remote_only(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return shared_remote(tmp_path, tmp_path_factory)


@pytest.fixture
def remote_copy(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return private_remote(tmp_path, tmp_path_factory)


# -- every offset, byte-identical -------------------------------------------------------------


def test_every_offset_reads_back_byte_identical_after_local_data_is_gone(
    tmp_path: Path, store: ObjectStore
) -> None:
    # tiny chunks on the file store (most fetches cross a chunk boundary); over HTTP, chunks of
    # a few batches, so the consumer's held chunk serves several fetches (fewer slow GETs)
    chunk = 300 if store.scheme == "file" else 4096
    fx = archived_partition(tmp_path, store, cluster={"cloud_storage_cache_chunk_size": chunk})
    rev = revision(fx.config)
    m, _ = ManifestStore(store).load(TOPIC, 0, rev)
    assert len(m.archives) >= 3, "the test needs several archived manifests"
    assert m.last_offset == fx.end - 1
    drop_local_segments(fx.config)
    with fx.reader() as reader:
        for offset in range(fx.end):  # a consumer reading one batch at a time
            got = reader.fetch(TOPIC, 0, offset, 0, reader_id="consumer")
            assert got.data == fx.image.expected(offset, 0), offset
            assert got.source == "remote"
            assert got.next_offset == next(b[1] for b in fx.image.batches if b[1] >= offset) + 1
        # one fetch across every segment and archived manifest boundary
        everything = reader.fetch(TOPIC, 0, 0, 10 * 1024 * 1024)
        assert everything.data == b"".join(b[2] for b in fx.image.batches)
        assert everything.next_offset == fx.end
        assert (everything.log_start_offset, everything.high_watermark) == (0, fx.end)
        stats = reader.stats
    assert stats["remote_fetches"] == fx.end + 1
    assert stats["local_fetches"] == 0
    assert stats["cache"]["bytes_downloaded"] > 0


def test_fetch_budgets_take_whole_batches_while_they_fit(remote_only: Fixture) -> None:
    fx = remote_only
    with fx.reader() as reader:
        for offset, budget in [(0, 1), (5, 300), (17, 1500), (100, 4000), (fx.end - 1, 10**6),
                               (42, 2500), (250, 123)]:
            got = reader.fetch(TOPIC, 0, offset, budget)
            want = fx.image.expected(offset, budget)
            assert got.data == want, (offset, budget)
            assert len(got.data) <= budget or len(list(iter_batch_headers(got.data))) == 1


def test_records_start_at_the_requested_offset(remote_only: Fixture) -> None:
    with remote_only.reader() as reader:
        got = reader.fetch(TOPIC, 0, 10, 2000)
        offsets = [r.offset for r in got.records()]
    assert offsets[0] == 10
    assert offsets == list(range(10, 10 + len(offsets)))


def test_sparse_or_missing_index_objects_still_read_correctly(remote_copy: Fixture) -> None:
    """No `.index` objects: each segment is read as one chunk (the object checksum is then
    verified too) and the header walk finds every batch."""
    fx = remote_copy
    store = fx.store
    removed = [info.key for info in store.list("") if info.key.endswith(".index")]
    assert removed
    store.delete_many(removed)
    with fx.reader() as reader:
        for offset in range(0, fx.end, 13):
            assert reader.fetch(TOPIC, 0, offset, 500).data == fx.image.expected(offset, 500)
        assert reader.stats["index_fallbacks"] > 0


def test_whole_segment_downloads_when_chunk_reads_are_disabled(tmp_path: Path,
                                                               file_store: ObjectStore) -> None:
    fx = archived_partition(tmp_path, file_store, batches=60,
                            cluster={"cloud_storage_disable_chunk_reads": True})
    drop_local_segments(fx.config)
    with fx.reader() as reader:
        for offset in range(fx.end):
            assert reader.fetch(TOPIC, 0, offset, 0).data == fx.image.expected(offset, 0)


def test_a_fetch_downloads_only_the_chunks_it_needs(tmp_path: Path,
                                                    file_store: ObjectStore) -> None:
    config = make_config(tmp_path, cluster={"cloud_storage_cache_chunk_size": 4096})
    end = write_log(config, batches=400, segment_bytes=10**6)  # one ~35 KiB segment
    image = LogImage.of(partition_dir(config))
    archive(config, file_store)
    drop_local_segments(config)
    counting = CountingStore(file_store)
    reader = Reader(config, counting, local_log=None, metadata_ttl_s=0.0)
    with reader:
        got = reader.fetch(TOPIC, 0, end // 2, 1000)
        assert got.data == image.expected(end // 2, 1000)
        segment_size = sum(len(b[2]) for b in image.batches)
        downloaded = reader.stats["cache"]["bytes_downloaded"]
    assert 0 < downloaded <= 3 * 4096 + 1000 < segment_size


def test_corrupt_segment_object_is_refused_never_served(remote_copy: Fixture) -> None:
    fx = remote_copy
    seg_keys = sorted(info.key for info in fx.store.list("") if info.key.endswith(".log"))
    root = Path(fx.config.storage.url.removeprefix("file://"))
    target = root / seg_keys[0]
    data = bytearray(target.read_bytes())
    data[80] ^= 0xFF  # inside the first batch's records: its CRC no longer matches
    target.write_bytes(bytes(data))
    with fx.reader() as reader:
        with pytest.raises(TieredError) as err:
            reader.fetch(TOPIC, 0, 0, 0)
        assert seg_keys[0] in str(err.value) or isinstance(err.value.__cause__,
                                                          CorruptSegmentError)
        # the rest of the partition is still served
        last = fx.image.batches[-1]
        assert reader.fetch(TOPIC, 0, last[0], 0).data == last[2]


def test_a_fetch_serves_the_batches_before_a_missing_object_then_fails_at_it(
    remote_copy: Fixture,
) -> None:
    """Kafka's semantics: a large fetch returns what is readable up to the damage; the next
    fetch, starting at the first offset of the missing object, fails naming it."""
    fx = remote_copy
    with fx.reader() as reader:
        objects = sorted((keys.parse_segment_name(i.key.rsplit("/", 1)[1]), i.key)
                         for i in fx.store.list("") if i.key.endswith(".log"))
        victim, key = objects[2]
        assert victim is not None
        fx.store.delete_many([key])
        got = reader.fetch(TOPIC, 0, 0, 10**9)
        assert got.next_offset == victim.base_offset
        assert got.data == b"".join(d for base, _, d in fx.image.batches
                                    if base < victim.base_offset)
        with pytest.raises(TieredError, match=key.rsplit("/", 1)[1]):
            reader.fetch(TOPIC, 0, victim.base_offset, 10**9)
        # past the damage the partition still reads
        after = reader.fetch(TOPIC, 0, victim.last_offset + 1, 0)
        assert after.data == fx.image.expected(victim.last_offset + 1, 0)


# -- timestamps --------------------------------------------------------------------------------


def test_timestamps_map_to_the_first_offset_at_or_after_them(remote_only: Fixture) -> None:
    fx = remote_only
    probes = [T0_MS - 1000, T0_MS, T0_MS + 1, record_timestamp(fx.end - 1),
              record_timestamp(fx.end - 1) + 1]
    probes += [record_timestamp(o) + d for o in range(0, fx.end, 17) for d in (-1, 0, 3)]
    with fx.reader() as reader:
        for ts in probes:
            got = reader.offset_for_timestamp(TOPIC, 0, ts)
            want = fx.image.offset_for(ts)
            assert (None if got is None else got.offset) == want, ts
            if got is not None:
                assert got.timestamp == record_timestamp(got.offset)
                assert got.leader_epoch == 3
        assert reader.offset_for_timestamp(TOPIC, 0, -2).offset == 0  # type: ignore[union-attr]
        assert reader.offset_for_timestamp(TOPIC, 0, -1).offset == fx.end  # type: ignore[union-attr]
        with pytest.raises(InvalidRequest):
            reader.offset_for_timestamp(TOPIC, 0, -3)


def test_timestamps_span_the_bucket_and_the_local_log(tmp_path: Path,
                                                      file_store: ObjectStore) -> None:
    fx = archived_partition(tmp_path, file_store, batches=120)
    drop_local_segments(fx.config, below=fx.end // 2)
    with fx.reader() as reader:
        lo = reader.earliest_offset(TOPIC, 0)
        assert lo == 0
        for o in range(0, fx.end, 5):
            got = reader.offset_for_timestamp(TOPIC, 0, record_timestamp(o))
            assert got is not None and got.offset == o


# -- bounds and errors -------------------------------------------------------------------------


def test_offsets_outside_the_log_are_out_of_range(tmp_path: Path,
                                                  file_store: ObjectStore) -> None:
    fx = archived_partition(tmp_path, file_store, batches=40, start_offset=100)
    drop_local_segments(fx.config)
    with fx.reader() as reader:
        assert reader.earliest_offset(TOPIC, 0) == 100
        assert reader.latest_offset(TOPIC, 0) == fx.end
        for bad in (0, 99, fx.end, fx.end + 1000):
            with pytest.raises(OffsetOutOfRange, match=rf"offset {bad} .*100\.\.{fx.end - 1}"):
                reader.fetch(TOPIC, 0, bad, 1000)
        assert reader.fetch(TOPIC, 0, 100, 0).data == fx.image.expected(100, 0)
        assert reader.stats["out_of_range"] == 4
        for args in ((-1, 10), (5, -1)):
            with pytest.raises(InvalidRequest):
                reader.fetch(TOPIC, 0, *args)
        with pytest.raises(InvalidRequest, match="topic"):
            reader.fetch("../x", 0, 0, 10)
        with pytest.raises(UnknownPartition):
            reader.fetch("nosuchtopic", 0, 0, 10)
        with pytest.raises(UnknownPartition, match="1 partitions"):
            reader.fetch(TOPIC, 1, 0, 10)


def test_past_the_local_end_is_out_of_range_without_touching_the_bucket(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    config = make_config(tmp_path)
    end = write_log(config, batches=30)
    counting = CountingStore(file_store)
    with (Reader(config, counting, local_log=LocalLog(config.log_dirs)) as reader,
          pytest.raises(OffsetOutOfRange, match=f"at or past the log end {end}")):
        reader.fetch(TOPIC, 0, end, 100)
    assert counting.calls == {}


def test_remote_read_disabled_for_the_topic_is_a_clear_error(tmp_path: Path,
                                                             file_store: ObjectStore) -> None:
    fx = archived_partition(tmp_path, file_store, batches=120,
                            topics={TOPIC: {"redpanda.remote.read": False}})
    drop_local_segments(fx.config, below=fx.end // 2)
    with fx.reader() as reader:
        local_start = reader.earliest_offset(TOPIC, 0)
        assert 0 < local_start <= fx.end // 2
        with pytest.raises(RemoteReadDisabled, match="remote read is disabled") as err:
            reader.fetch(TOPIC, 0, 0, 100)
        assert isinstance(err.value, OffsetOutOfRange)
        got = reader.fetch(TOPIC, 0, local_start, 100)
        assert got.source == "local"
        assert got.data == fx.image.expected(local_start, 100)


def test_remote_read_disabled_cluster_wide(tmp_path: Path, file_store: ObjectStore) -> None:
    fx = archived_partition(tmp_path, file_store, batches=30,
                            cluster={"cloud_storage_enable_remote_read": False})
    drop_local_segments(fx.config)
    with fx.reader() as reader, pytest.raises(RemoteReadDisabled):
        reader.fetch(TOPIC, 0, 0, 100)


# -- local first -------------------------------------------------------------------------------


def test_local_hits_are_served_locally_without_store_requests(tmp_path: Path,
                                                              file_store: ObjectStore) -> None:
    fx = archived_partition(tmp_path, file_store, batches=80)
    counting = CountingStore(file_store)
    with Reader(fx.config, counting, local_log=LocalLog(fx.config.log_dirs)) as reader:
        for offset in range(0, fx.end, 3):
            got = reader.fetch(TOPIC, 0, offset, 700)
            assert got.source == "local"
            assert got.data == fx.image.expected(offset, 700)
        assert reader.latest_offset(TOPIC, 0) == fx.end
        assert reader.stats["local_fetches"] == len(range(0, fx.end, 3))
    assert counting.calls.get("get", 0) == 0
    assert counting.calls == {}


def test_a_fetch_crosses_from_the_bucket_into_the_local_log(tmp_path: Path,
                                                           file_store: ObjectStore) -> None:
    fx = archived_partition(tmp_path, file_store, batches=120)
    drop_local_segments(fx.config, below=fx.end // 2)
    with fx.reader() as reader:
        got = reader.fetch(TOPIC, 0, 0, 10**7)
        assert got.source == "remote+local"
        assert got.data == b"".join(b[2] for b in fx.image.batches)
        assert got.next_offset == fx.end


def test_unarchived_gap_between_bucket_and_local_log_is_out_of_range(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """Local segments deleted although not archived (retention in advise mode ignored): the
    missing offsets are reported, never skipped silently."""
    config = make_config(tmp_path)
    write_log(config, batches=40)
    archive(config, file_store)
    rev = revision(config)
    m, _ = ManifestStore(file_store).load(TOPIC, 0, rev)
    with LogWriter(partition_dir(config), segment_bytes=1800, fsync=False) as writer:
        for _ in range(40):
            writer.append(producer_records(writer.log_end_offset, 2))
        writer.roll()
    drop_local_segments(config, below=m.last_offset + 30)
    with Reader(config, file_store, local_log=LocalLog(config.log_dirs)) as reader:
        with pytest.raises(OffsetOutOfRange, match="neither local nor in the bucket"):
            reader.fetch(TOPIC, 0, m.last_offset + 1, 100)
        assert reader.fetch(TOPIC, 0, m.last_offset, 0).source == "remote"


def test_revision_comes_from_the_topic_manifest_when_nothing_is_local(
    remote_only: Fixture,
) -> None:
    fx = remote_only
    with Reader(fx.config, fx.store, local_log=None) as reader:
        assert reader.fetch(TOPIC, 0, 3, 0).data == fx.image.expected(3, 0)
    expected_key = keys.partition_manifest_key(TOPIC, 0, topic_id_to_str(
        uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC)))
    assert fx.store.exists(expected_key)


def test_manifest_helpers_agree_with_the_reader(remote_only: Fixture) -> None:
    """`latest_offset` without local data is the manifest's next offset."""
    fx = remote_only
    rev = topic_id_to_str(uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC))
    m: PartitionManifest = ManifestStore(fx.store).load(TOPIC, 0, rev)[0]
    with fx.reader() as reader:
        assert reader.latest_offset(TOPIC, 0) == m.next_offset == fx.end
        assert reader.earliest_offset(TOPIC, 0) == m.log_start_offset == 0


def test_local_segment_deleted_under_the_reader_is_read_from_the_bucket(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """Local retention deletes archived segments after the reader's last scan: the read
    notices, rescans and serves the same bytes from the bucket."""
    fx = archived_partition(tmp_path, file_store, batches=80)
    with fx.reader() as reader:  # snapshot taken now; the TTL keeps it for a minute
        assert reader.fetch(TOPIC, 0, 0, 0).source == "local"
        drop_local_segments(fx.config, below=fx.end // 2)
        got = reader.fetch(TOPIC, 0, 3, 400)
        assert got.source == "remote"
        assert got.data == fx.image.expected(3, 400)


def test_concurrent_fetches_through_one_reader_all_get_their_bytes(remote_only: Fixture) -> None:
    """The daemon serves HTTP requests from many threads through one Reader."""
    fx = remote_only
    rng = random.Random(5)
    jobs = [(rng.randrange(fx.end), rng.choice([0, 300, 2000])) for _ in range(120)]
    with fx.reader() as reader, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: reader.fetch(TOPIC, 0, *job), jobs))
    for (offset, budget), got in zip(jobs, results, strict=True):
        assert got.data == fx.image.expected(offset, budget), (offset, budget)
