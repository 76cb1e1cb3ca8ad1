"""The remote-read API (`cache.reader`): every offset of a long, spilled-over partition reads
back byte-identical from the bucket once the local log is gone; timestamps map to offsets as
ListOffsets does; out-of-range offsets and disabled remote read are clear errors; local data is
served without touching the bucket (design: remote read; invariants 5 and 9).

The bucket is filled by the real archiver (`Archiver.upload_round`). The helpers here are shared
by `test_reader_http.py` and `test_fetch_cli.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.remote import (
    T0_MS,
    TOPIC,
    CountingStore,
    Fixture,
    LogImage,
    archive,
    archived_partition,
    as_earlier_releases_wrote,
    drop_local_segments,
    make_config,
    partition_dir,
    producer_records,
    record_timestamp,
    revision,
    write_log,
)
from support.waiting import wait_until

from cache.reader import InvalidRequest, Reader, RemoteReadDisabled, UnknownPartition
from manifests import keys
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest
from tiered.config import Config
from tiered.errors import CorruptSegmentError, OffsetOutOfRange, TieredError
from tiered.kafka.checkpoints import topic_id_to_str
from tiered.kafka.local_log import LocalLog, TopicPartition
from tiered.kafka.log_writer import LogWriter, write_high_watermarks
from tiered.kafka.records import iter_batch_headers
from tiered.store.base import Blob, ObjectStore, RangeStream
from tiered.store.s3 import S3Store


@pytest.mark.slow  # every offset of a partition
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
    removed = [info.key for info in store.list("") if info.key.endswith(".indexes")]
    assert removed
    store.delete_many(removed)
    with fx.reader() as reader:
        for offset in range(0, fx.end, 13):
            assert reader.fetch(TOPIC, 0, offset, 500).data == fx.image.expected(offset, 500)
        assert reader.stats["index_fallbacks"] > 0


class _IndexGets(CountingStore):
    """Records the index objects read."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.index_gets: list[str] = []

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        if not key.endswith((".log", ".json")) and "manifest.json" not in key:
            self.index_gets.append(key.rsplit("/", 1)[-1])
        return super().get(key, byte_range)


def test_one_get_brings_a_segment_s_offset_and_time_index(remote_copy: Fixture) -> None:
    fx = remote_copy
    store = _IndexGets(fx.store)
    probes = [record_timestamp(o) for o in range(0, fx.end, 7)]
    with Reader(fx.config, store, local_log=LocalLog(fx.config.log_dirs),
                metadata_ttl_s=60.0) as reader:
        for offset in range(0, fx.end, 7):
            assert reader.fetch(TOPIC, 0, offset, 500).data == fx.image.expected(offset, 500)
        for ts in probes:  # the time indexes came with the offset indexes
            assert reader.offset_for_timestamp(TOPIC, 0, ts).offset == fx.image.offset_for(ts)  # type: ignore[union-attr]
        assert reader.stats["index_fallbacks"] == 0
    assert store.index_gets
    assert all(name.endswith(".indexes") for name in store.index_gets)
    assert len(store.index_gets) == len(set(store.index_gets))


def test_segments_with_kafka_index_files_from_earlier_releases_read_the_same(
        remote_copy: Fixture) -> None:
    """A bucket written before the index bundle: one object per index kind, a head with no
    index layout. Every offset and timestamp reads as before, through the indexes."""
    fx = remote_copy
    assert as_earlier_releases_wrote(fx.store) > 1
    names = [i.key.rsplit("/", 1)[-1] for i in fx.store.list("")]
    assert not [n for n in names if n.endswith(".indexes")]
    assert [n for n in names if n.endswith(".timeindex")]
    store = _IndexGets(fx.store)
    with Reader(fx.config, store, local_log=LocalLog(fx.config.log_dirs),
                metadata_ttl_s=60.0) as reader:
        for offset in range(0, fx.end, 11):
            assert reader.fetch(TOPIC, 0, offset, 500).data == fx.image.expected(offset, 500)
        for ts in [record_timestamp(o) + d for o in range(0, fx.end, 13) for d in (-1, 0)]:
            got = reader.offset_for_timestamp(TOPIC, 0, ts)
            assert (None if got is None else got.offset) == fx.image.offset_for(ts)
        assert reader.stats["index_fallbacks"] == 0
    assert {n.rsplit(".", 1)[-1] for n in store.index_gets} == {"index", "timeindex"}


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


def test_a_head_the_bucket_lost_is_read_from_its_copy_not_taken_for_no_history(
        remote_copy: Fixture) -> None:
    """With the head manifest gone (no writer has restored it yet), the earliest offset is
    still the bucket's and every archived offset still reads back: from the head's copy, with
    nothing written by the reader."""
    fx = remote_copy
    (head_key,) = [i.key for i in fx.store.list("") if i.key.endswith("/manifest.json")]
    fx.store.delete_many([head_key])
    with fx.reader() as reader:
        assert reader.earliest_offset(TOPIC, 0) == 0
        got = reader.fetch(TOPIC, 0, 0, 10 * 1024 * 1024)
        assert got.data == b"".join(b[2] for b in fx.image.batches)
        assert got.source == "remote"
    assert not fx.store.exists(head_key)


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


def test_past_the_end_names_the_whole_readable_range(tmp_path: Path,
                                                     file_store: ObjectStore) -> None:
    """Offsets 0.. are in the bucket, the local log starts later: the message past the end
    names the bucket's start too once its head is known, and says older offsets may be there
    before (without asking the bucket on this path)."""
    fx = archived_partition(tmp_path, file_store, batches=120)
    drop_local_segments(fx.config, below=fx.end // 2)
    local_start = LocalLog(fx.config.log_dirs).partition(TopicPartition(TOPIC, 0)).segments[0]
    assert local_start.base_offset > 0
    with fx.reader() as reader:
        with pytest.raises(OffsetOutOfRange, match="older offsets may be in the bucket"):
            reader.fetch(TOPIC, 0, fx.end, 100)
        reader.fetch(TOPIC, 0, 0, 100)  # reads the head
        with pytest.raises(OffsetOutOfRange, match=rf"readable offsets: 0\.\.{fx.end - 1}\)"):
            reader.fetch(TOPIC, 0, fx.end, 100)


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


def test_a_truncated_local_index_costs_speed_not_correctness(tmp_path: Path,
                                                             file_store: ObjectStore) -> None:
    """A 13-byte `.index` (not a whole number of entries) beside a closed segment: the read
    walks the segment from its start and answers exactly what Kafka would."""
    fx = archived_partition(tmp_path, file_store, batches=80)
    indexes = sorted(partition_dir(fx.config).glob("*.index"))
    assert len(indexes) > 2
    # one entry and five bytes of the next: cut short mid-write
    indexes[0].write_bytes(bytes.fromhex("00000001" "00000010" "0000000200"))
    with Reader(fx.config, file_store, local_log=LocalLog(fx.config.log_dirs)) as reader:
        for offset in range(0, fx.end, 3):
            got = reader.fetch(TOPIC, 0, offset, 700)
            assert got.source == "local" and got.data == fx.image.expected(offset, 700)


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


def test_a_fetch_racing_local_deletion_goes_on_from_the_bucket(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """Local retention deletes the next segment while a fetch is between two local segments:
    the fetch continues from the bucket and answers in full, never short at the boundary."""
    fx = archived_partition(tmp_path, file_store, batches=80)
    with fx.reader() as reader:
        first = reader.fetch(TOPIC, 0, 0, 0)
        assert first.source == "local"
        budget = 6000
        whole = fx.image.expected(3, budget)
        calls: list[tuple[Any, ...]] = []
        read = reader.local.read

        def read_then_delete(*args: Any, **kwargs: Any) -> Any:
            got = read(*args, **kwargs)
            if not calls:  # after the first local piece: retention runs
                drop_local_segments(fx.config, below=fx.end // 2)
            calls.append(args)
            return got

        reader.local.read = read_then_delete  # type: ignore[method-assign]
        got = reader.fetch(TOPIC, 0, 3, budget)
        assert len(calls) >= 1
        assert got.data == whole
        assert "remote" in got.source


def test_concurrent_fetches_through_one_reader_all_get_their_bytes(remote_only: Fixture) -> None:
    """The daemon serves HTTP requests from many threads through one Reader."""
    fx = remote_only
    rng = random.Random(5)
    jobs = [(rng.randrange(fx.end), rng.choice([0, 300, 2000])) for _ in range(120)]
    with fx.reader() as reader, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: reader.fetch(TOPIC, 0, *job), jobs))
    for (offset, budget), got in zip(jobs, results, strict=True):
        assert got.data == fx.image.expected(offset, budget), (offset, budget)


def test_fetched_pieces_stay_readable_when_the_cache_drops_their_chunks(
    remote_only: Fixture,
) -> None:
    """Bucket reads answer with ranges of open chunk files (sent with sendfile): a chunk the
    cache evicts, or a cache directory emptied, between the fetch and the send changes
    nothing for that answer."""
    fx = remote_only
    with fx.reader() as reader, reader.fetch_pieces(TOPIC, 0, 5, 3000, reader_id="c") as got:
        assert got.source == "remote"
        assert any(not isinstance(p, bytes) for p in got.pieces.parts)
        for path in sorted(reader.config.cache_dir.rglob("*"), reverse=True):
            if path.is_file():
                path.unlink()
        assert got.pieces.read() == fx.image.expected(5, 3000)


def test_a_chunk_file_damaged_while_the_process_was_down_is_fetched_again(
    remote_only: Fixture,
) -> None:
    """Chunk ranges go out unread, so each file found at start-up is read back against its
    checksums once before it is served: a damaged one is dropped and downloaded again."""
    fx = remote_only
    with fx.reader() as reader:  # a session holds its chunk: it is on disk at the restart
        got = reader.fetch(TOPIC, 0, 5, 3000, reader_id="c")
        assert got.data == fx.image.expected(5, 3000)
    chunks = [p for p in fx.config.cache_dir.rglob("*") if p.is_file() and p.name.isdigit()]
    assert chunks
    for path in chunks:
        damaged = bytearray(path.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        path.write_bytes(bytes(damaged))
    with fx.reader() as reader:
        assert reader.fetch(TOPIC, 0, 5, 3000).data == fx.image.expected(5, 3000)
        assert reader.cache.stats()["corrupt_discarded"] >= 1


def test_the_read_paths_store_requests_are_counted_with_bytes_and_latency(
    tmp_path: Path, s3_store: S3Store
) -> None:
    """`tiered_store_*{path="read"}` comes from these counters: every GET of a read, the
    bytes it brought (streamed read-ahead included) and one latency observation each."""
    fx = archived_partition(tmp_path, s3_store, batches=80,
                            cluster={"cloud_storage_chunk_prefetch": 2})
    drop_local_segments(fx.config)
    before = s3_store.stats.snapshot()
    with fx.reader() as reader:
        offset, served = 0, 0
        while offset < fx.end:
            got = reader.fetch(TOPIC, 0, offset, 4000, reader_id="c")
            assert got.data == fx.image.expected(offset, 4000)
            offset, served = got.next_offset, served + len(got.data)
    after = s3_store.stats.snapshot()
    operations = after["operations"] - before["operations"]
    latencies = sum(after[k] - before[k] for k in after if k.startswith("latency_bucket_"))
    assert operations > 0 and latencies == operations
    assert after["bytes_read"] - before["bytes_read"] >= served
    assert after["errors"] == before["errors"]


def test_a_consumer_reading_history_writes_no_chunk_file_under_eager_eviction(
    tmp_path: Path, s3_store: S3Store
) -> None:
    """Chunks streamed from the bucket are served from memory; one consumer's chunks are
    evicted as it moves on, before anything writes them to the cache directory. A chunk the
    consumer still holds when the reader closes is written then."""
    fx = archived_partition(tmp_path, s3_store, batches=80, cluster={
        "cloud_storage_chunk_prefetch": 2, "cloud_storage_cache_chunk_size": 4096})
    drop_local_segments(fx.config)
    chunk_files = lambda: [p for p in fx.config.cache_dir.rglob("*")  # noqa: E731
                           if p.is_file() and p.name.isdigit()]
    with fx.reader() as reader:
        offset = 0
        while offset < fx.end:
            got = reader.fetch(TOPIC, 0, offset, 3000, reader_id="c")
            assert got.data == fx.image.expected(offset, 3000)
            offset = got.next_offset
        stats = reader.cache.stats()
        assert stats["unwritten_evictions"] > 0 and stats["written_behind"] == 0
        assert chunk_files() == []
        held = stats["memory_chunks"]
    assert held >= 1 and len(chunk_files()) == held


class _SlowBackgroundIndexes(CountingStore):
    """`.index` GETs from threads other than the one that made the store take `delay` s
    (`ahead` is set when one begins); counts the GETs begun and ended."""

    def __init__(self, inner: ObjectStore, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay
        self.owner = threading.current_thread()
        self.ahead = threading.Event()
        self.begun = self.ended = 0

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        if not key.endswith(".indexes"):
            return super().get(key, byte_range)
        self.begun += 1
        try:
            if threading.current_thread() is not self.owner:
                self.ahead.set()
                time.sleep(self.delay)
            return super().get(key, byte_range)
        finally:
            self.ended += 1


def test_closing_a_reader_waits_for_the_store_requests_its_read_ahead_began(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """The read-ahead into the next segment opens it (its `.index` GET) on a thread of its
    own; `close` returns only once that request is done, so nothing reads through a store
    its owner closes next, and the store's counters are whole when the reader is gone."""
    fx = archived_partition(tmp_path, file_store, batches=80, cluster={
        "cloud_storage_chunk_prefetch": 2, "cloud_storage_cache_chunk_size": 4096})
    drop_local_segments(fx.config)
    store = _SlowBackgroundIndexes(file_store, delay=0.5)
    reader = Reader(fx.config, store, local_log=LocalLog(fx.config.log_dirs))
    try:
        offset = 0
        while not store.ahead.wait(0.05):  # until the next segment's index is being read
            got = reader.fetch(TOPIC, 0, offset, 3000, reader_id="c")
            assert got.data == fx.image.expected(offset, 3000)
            offset = got.next_offset
            assert offset < fx.end, "no read-ahead into a next segment"
    finally:
        reader.close()
    assert store.begun >= 2 and store.ended == store.begun


def test_a_one_off_fetch_reads_nothing_ahead(tmp_path: Path, file_store: ObjectStore) -> None:
    """Read-ahead serves consumer sessions: a fetch without one (a `tiered fetch`, an HTTP
    request without `consumer`) downloads the chunks it reads and nothing more."""
    fx = archived_partition(tmp_path, file_store, batches=80, cluster={
        "cloud_storage_chunk_prefetch": 3, "cloud_storage_cache_chunk_size": 1024})
    drop_local_segments(fx.config)
    with fx.reader() as reader:
        got = reader.fetch(TOPIC, 0, 0, 3000)
        assert got.data == fx.image.expected(0, 3000)
        stats = reader.cache.stats()
        assert stats["prefetches"] == 0
        assert stats["bytes_downloaded"] < 3 * 3000
        # a consumer session reading on does get read-ahead
        offset = 0
        while offset < fx.end and reader.cache.stats()["prefetches"] == 0:
            session = reader.fetch(TOPIC, 0, offset, 3000, reader_id="c")
            assert session.data == fx.image.expected(offset, 3000)
            offset = session.next_offset
        assert reader.cache.stats()["prefetches"] > 0


class _IndexAfterBytes(CountingStore):
    """Answers a segment's `.index` GET only once a segment's bytes were asked for (or after
    2 s), saying which."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.streamed = threading.Event()
        self.index_waited: list[bool] = []

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        if key.endswith(".indexes"):
            self.index_waited.append(self.streamed.wait(2.0))
        return super().get(key, byte_range)

    def open_range(self, key: str, begin: int, end: int, *, to_end: bool = False
                   ) -> RangeStream:
        self.streamed.set()
        return self.inner.open_range(key, begin, end, to_end=to_end)


def test_a_consumer_s_first_fetch_asks_for_the_bytes_while_the_index_comes(
        tmp_path: Path, file_store: ObjectStore) -> None:
    """A consumer starting on a segment waits for one round trip, not two: the request for
    the segment's bytes goes out while its index is being fetched, not after."""
    fx = archived_partition(tmp_path, file_store, batches=80, cluster={
        "cloud_storage_chunk_prefetch": 2, "cloud_storage_cache_chunk_size": 4096})
    drop_local_segments(fx.config)
    store = _IndexAfterBytes(file_store)
    with Reader(fx.config, store, local_log=LocalLog(fx.config.log_dirs),
                metadata_ttl_s=60.0) as reader:
        offset = 0
        while offset < fx.end:
            got = reader.fetch(TOPIC, 0, offset, 3000, reader_id="c")
            assert got.data == fx.image.expected(offset, 3000)
            offset = got.next_offset
    assert store.index_waited[:1] == [True]
    assert store.calls.get("get", 0) >= 1


class _GatedManifests(CountingStore):
    """Manifest GETs wait for `gate`; `manifest_gets` counts those that went through,
    `manifest_waits` those that came to the gate."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()
        self.manifest_gets = self.manifest_waits = 0

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        if key.endswith("/" + keys.PARTITION_MANIFEST_NAME):
            self.manifest_waits += 1
            assert self.gate.wait(10), "a manifest GET was held for ever"
            self.manifest_gets += 1
        return super().get(key, byte_range)


@contextlib.contextmanager
def _archived_reader(tmp_path: Path, file_store: ObjectStore, **reader_options: Any
                     ) -> Iterator[tuple[Reader, _GatedManifests, list[float], Config, int]]:
    """40 batches archived and gone from the local log; a reader on a gated store with a
    settable clock: (reader, store, [now], config, the log end)."""
    config = make_config(tmp_path)
    end = write_log(config, batches=40)
    archive(config, file_store)
    drop_local_segments(config, below=end)
    store = _GatedManifests(file_store)
    now = [1000.0]
    with Reader(config, store, local_log=LocalLog(config.log_dirs), clock=lambda: now[0],
                metadata_ttl_s=1.0, **reader_options) as reader:
        yield reader, store, now, config, end


def test_a_head_past_its_ttl_serves_what_it_holds_while_a_newer_one_is_read(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """Past its TTL, a cached head manifest still serves a fetch of offsets it holds (its
    objects outlive it by the GC grace period) while the one another writer committed since is
    read in the background: the fetch does not wait for the manifest. An offset only the newer
    manifest holds is served from it once it is in, without another manifest GET."""
    with _archived_reader(tmp_path, file_store) as (reader, store, now, config, end):
        first = reader.fetch(TOPIC, 0, 0, 300)
        assert first.source == "remote" and store.manifest_gets == 1
        # another writer appends and archives; the local copies go, as retention would
        end2 = write_log(config, batches=20, start_offset=end)
        archive(config, file_store)
        drop_local_segments(config, below=end2)
        store.gate.clear()  # the bucket is slow to answer for manifests
        now[0] += 5  # past the TTL, well within the grace period
        with ThreadPoolExecutor(1) as pool:
            again = pool.submit(reader.fetch, TOPIC, 0, 0, 300).result(timeout=10)
        assert again.data == first.data and store.manifest_gets == 1
        store.gate.set()
        wait_until(lambda: store.manifest_gets == 2 and not reader.manifest_view.refreshing,
                   "the background manifest refresh")
        newer = reader.fetch(TOPIC, 0, end, 300)
        assert newer.source == "remote" and newer.offset == end
        assert [h.base_offset for h in iter_batch_headers(newer.data)][0] == end
        assert store.manifest_gets == 2  # the refreshed head, not a new GET


def test_a_background_head_refresh_never_replaces_a_head_a_fetch_read_after_it_began(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """A head read in the background that answers late is older than one a fetch read while it
    was in flight: the newer stays cached, not the late one."""
    with _archived_reader(tmp_path, file_store) as (reader, store, now, _config, _end):
        reader.fetch(TOPIC, 0, 0, 300)
        store.gate.clear()
        now[0] += 5  # past the TTL: the next fetch starts a background refresh
        with ThreadPoolExecutor(1) as pool:
            pool.submit(reader.fetch, TOPIC, 0, 0, 300).result(timeout=10)
        (key,) = reader.manifest_view.refreshing
        wait_until(lambda: store.manifest_waits == 2, "the background refresh's GET")
        cached = reader.manifest_view.heads.get(key)
        assert cached is not None
        now[0] += 1
        reader.manifest_view.heads.put(key, (now[0], cached[1]))  # what a fetch read meanwhile
        store.gate.set()
        wait_until(lambda: not reader.manifest_view.refreshing, "the background manifest refresh")
        kept = reader.manifest_view.heads.get(key)
        assert kept is not None and kept[0] == now[0] and kept[1] is cached[1]
        assert store.manifest_gets == 2  # the refresh did read one: it was older, so dropped


def test_a_stale_head_is_read_again_after_the_fetch_sent_its_own_requests(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """The background read of a head past its TTL waits `REFRESH_AFTER_S` (here longer): the
    fetch served from that head sends its own requests first, without a manifest request
    being built beside them."""
    with _archived_reader(tmp_path, file_store, refresh_after_s=0.5) as (
            reader, store, now, _config, end):
        reader.fetch(TOPIC, 0, 0, 300)
        manifest_gets_at_data: list[int] = []
        data_get = store.get

        def get(key: str, byte_range: tuple[int, int] | None = None) -> Blob:
            if key.endswith(".log"):
                manifest_gets_at_data.append(store.manifest_gets)
            return data_get(key, byte_range)

        store.get = get  # type: ignore[method-assign]
        now[0] += 5  # past the TTL: the fetch is served from the cached head
        fetched = reader.fetch(TOPIC, 0, end // 2, 300)  # a segment not read yet
        assert fetched.source == "remote" and set(manifest_gets_at_data) == {1}
        assert reader.manifest_view.refreshing and store.manifest_gets == 1  # due, not sent yet
        wait_until(lambda: store.manifest_gets == 2 and not reader.manifest_view.refreshing,
                   "the background manifest refresh")


@pytest.mark.parametrize("asked", ["before the close", "while it closes"])
def test_closing_a_reader_cancels_or_refuses_a_head_refresh_not_started_yet(
    tmp_path: Path, file_store: ObjectStore, asked: str
) -> None:
    """A refresh waiting its delay is cancelled by `close`; one asked for by a fetch racing
    the close never starts."""
    with _archived_reader(tmp_path, file_store, refresh_after_s=0.3) as (
            reader, store, now, _config, _end):
        reader.fetch(TOPIC, 0, 0, 300)
        now[0] += 5  # past the TTL: the next fetch makes a refresh due
        if asked == "before the close":
            reader.fetch(TOPIC, 0, 0, 300)
            assert reader.manifest_view.refresh_timers
        else:
            reader.close()
            reader.manifest_view.refresh(next(iter(reader.manifest_view.heads._data)))
            assert not reader.manifest_view.refresh_timers
        timers = list(threading.enumerate())
    # the close joined every timer it cancelled: none is left to fire later
    assert not [t for t in timers if t.name == "reader-manifest" and t.is_alive()]
    assert store.manifest_waits == 1  # the first fetch's only


def test_closing_a_reader_waits_for_a_head_refresh_already_reading(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """A refresh whose manifest GET is in flight is not cancelled but waited for: the store is
    closed after the reader, and must not be closed under it."""
    with _archived_reader(tmp_path, file_store, refresh_after_s=0.0) as (
            reader, store, now, _config, _end):
        reader.fetch(TOPIC, 0, 0, 300)
        store.gate.clear()
        now[0] += 5  # past the TTL: the next fetch starts a refresh at once
        reader.fetch(TOPIC, 0, 0, 300)
        wait_until(lambda: store.manifest_waits == 2, "the background refresh's GET")
        with ThreadPoolExecutor(1) as pool:
            closing = pool.submit(reader.close)
            time.sleep(0.2)
            assert not closing.done()  # it waits for the GET
            store.gate.set()
            closing.result(timeout=10)
        assert store.manifest_gets == 2 and not reader.manifest_view.refresh_timers


# --- corruption stops at the corrupt batch --------------------------------------------------------


def _flip_inside_batch(path: Path, position: int) -> None:
    """Damage the batch starting at byte `position` of `path`: a byte of its records, so its
    CRC-32C no longer matches (its header still parses)."""
    data = bytearray(path.read_bytes())
    data[position + 70] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_fetch_reaching_a_corrupt_remote_batch_serves_the_intact_batches_before_it(
    remote_copy: Fixture,
) -> None:
    """Damage mid-chunk in a segment object: a fetch from 0 gets every batch before it (the
    intact batches of the damaged chunk included); only a fetch starting at the damaged batch
    fails, naming the object key and byte."""
    root = Path(remote_copy.config.storage.url.removeprefix("file://"))
    # chunks of several batches: the damaged one shares its chunk with intact ones
    fx = dataclasses.replace(remote_copy, config=make_config(
        root.parent / "big-chunks", cluster={"cloud_storage_cache_chunk_size": 4096},
        bucket=root))
    with fx.reader() as reader:
        reader.fetch(TOPIC, 0, 0, 10**9)  # every segment opened: their chunk plans are known
        m = reader.manifest_view.head(TOPIC, 0, None, required=True)
        assert m is not None
        segs = list(reader.manifests.iter_segments(m, 0))
        seg = segs[len(segs) // 2]
        key = m.segment_key(seg)
        starts = reader.remote._open(m, seg).handle.chunk_starts
    headers = list(iter_batch_headers((root / key).read_bytes()))
    victim = next(h for h in headers[1:] if h.position not in starts)
    before = headers[headers.index(victim) - 1]
    _flip_inside_batch(root / key, victim.position)
    with fx.reader() as reader:  # a new cache: nothing of the object is cached yet
        got = reader.fetch(TOPIC, 0, 0, 10**9)
        assert got.data == b"".join(d for base, _, d in fx.image.batches
                                    if base < victim.base_offset)
        assert got.next_offset == victim.base_offset
        # the intact batch just before the damage, in the damaged chunk, is served alone
        alone = reader.fetch(TOPIC, 0, before.base_offset, 10**9)
        assert alone.data == fx.image.expected(before.base_offset, 0)
        assert alone.next_offset == victim.base_offset
        with pytest.raises(CorruptSegmentError) as err:
            reader.fetch(TOPIC, 0, victim.base_offset, 10**9)
        assert err.value.path == key and err.value.position == victim.position
        assert f"byte {victim.position}" in str(err.value)
        # past the damage the partition still reads
        last = victim.last_offset + 1
        assert reader.fetch(TOPIC, 0, last, 0).data == fx.image.expected(last, 0)


def test_a_fetch_reaching_a_corrupt_local_batch_serves_the_remote_and_local_batches_before_it(
    tmp_path: Path, file_store: Any,
) -> None:
    """The bucket holds the older offsets, the local log the newer ones with a damaged batch
    near the end of its active segment: a large fetch from 0 answers everything up to it."""
    fx = archived_partition(tmp_path, file_store, batches=60)
    drop_local_segments(fx.config, below=fx.end // 2)
    path = partition_dir(fx.config)
    with LogWriter(path, segment_bytes=1 << 30, fsync=False) as w:
        for _ in range(12):
            w.append(producer_records(w.log_end_offset, 2))
        end = w.log_end_offset
    write_high_watermarks(fx.config.log_dirs[0], {TopicPartition(TOPIC, 0): end}, fsync=False)
    active = max(path.glob("*.log"))
    headers = list(iter_batch_headers(active.read_bytes()))
    victim = headers[-2]
    image = LogImage.of(path)
    _flip_inside_batch(active, victim.position)
    expected = b"".join(d for base, _, d in fx.image.batches if base < image.batches[0][0])
    expected += b"".join(d for base, _, d in image.batches if base < victim.base_offset)
    with fx.reader() as reader:
        got = reader.fetch(TOPIC, 0, 0, 1 << 20)
        assert got.source == "remote+local"
        assert got.data == expected and got.next_offset == victim.base_offset
        local_start = image.batches[0][0]
        got = reader.fetch(TOPIC, 0, local_start, 1 << 20)
        assert got.data == b"".join(d for base, _, d in image.batches
                                    if base < victim.base_offset)
        with pytest.raises(CorruptSegmentError) as err:
            reader.fetch(TOPIC, 0, victim.base_offset, 1 << 20)
        assert err.value.path == str(active) and err.value.position == victim.position
        after = headers[-1]
        assert reader.fetch(TOPIC, 0, after.base_offset, 0).data == (
            active.read_bytes()[after.position:after.end_position])


def test_a_fetch_holds_at_most_max_files_chunk_files(remote_only: Fixture) -> None:
    """`max_files` bounds the chunk files one answer holds open: the answer stops short of
    its byte budget, on a batch boundary, and the next fetch goes on from there."""
    fx = remote_only
    whole = b"".join(b[2] for b in fx.image.batches)
    with fx.reader() as reader:
        unbounded = reader.fetch_pieces(TOPIC, 0, 0, 10**9)
        with unbounded:
            assert unbounded.pieces.files > 3  # 300-byte chunks: many files
        got, offset = b"", 0
        while offset < fx.end:
            with reader.fetch_pieces(TOPIC, 0, offset, 10**9, max_files=3) as part:
                assert 0 < part.pieces.files <= 3
                data = part.result().data
                assert data == fx.image.expected(offset, len(data))
                got, offset = got + data, part.next_offset
        assert got == whole
        # one file at least, whatever is asked: a consumer always makes progress
        with reader.fetch_pieces(TOPIC, 0, 0, 10**9, max_files=0) as one:
            assert one.pieces.files == 1 and one.result().data


def test_fetches_without_a_session_that_read_on_get_read_ahead(
    tmp_path: Path, file_store: ObjectStore
) -> None:
    """A client that names no session but starts each fetch where the last one of the
    partition ended reads as one session, so the adaptive read-ahead opens for it; fetches
    that jump about do not."""
    config = make_config(tmp_path, cluster={"cloud_storage_cache_chunk_size": 4096})
    end = write_log(config, batches=600, segment_bytes=1 << 20)  # one segment of many chunks
    image = LogImage.of(partition_dir(config))
    archive(config, file_store)
    drop_local_segments(config)
    session = ("anonymous", TOPIC, 0)

    def reader() -> Reader:
        return Reader(config, file_store, local_log=LocalLog(config.log_dirs),
                      metadata_ttl_s=60.0)

    with reader() as r:
        offset, windows = 0, []
        while offset < end:
            got = r.fetch(TOPIC, 0, offset, 3000)
            assert got.data == image.expected(offset, 3000)
            offset = got.next_offset
            windows.append(r.cache.read_ahead_window(session))
        assert max(windows) >= 2, windows  # it grew as the reads went on
    with reader() as r:
        for offset in (end // 2, 3, end - 5, end // 3):
            assert r.fetch(TOPIC, 0, offset, 3000).data == image.expected(offset, 3000)
        assert r.cache.read_ahead_window(session) == 0
        assert r.cache.stats()["prefetches"] == 0
