"""Spark-job test helpers: a bucket seeded with segments exactly as the archiver uploads
them, a job context over it, and a partition read back byte for byte."""

from __future__ import annotations

from typing import Any

import crc32c
import pytest

from manifests import (
    ManifestSettings,
    ManifestStore,
    PartitionManifest,
    SegmentMeta,
    edits,
    keys,
    segment_indexes,
)
from manifests.topic import TopicManifest, save_topic_manifest
from spark_jobs.job_context import JobContext
from tiered.config import Config, parse_config
from tiered.kafka.builder import encode_batch, make_records
from tiered.kafka.index import OffsetIndex
from tiered.kafka.records import iter_batch_headers
from tiered.kafka.segment import build_indexes
from tiered.store.base import ObjectStore

TOPIC, REVISION = "orders", "7"


RECORDS_PER_BATCH = 4


BATCHES_PER_SEGMENT = 3


def segment_bytes(base: int, *, batches: int = BATCHES_PER_SEGMENT, term: int = 1) -> bytes:
    """`batches` batches of RECORDS_PER_BATCH records with consecutive offsets from `base`."""
    out = bytearray()
    off = base
    for _ in range(batches):
        values = [f"value-{off + i}-".encode() * 6 for i in range(RECORDS_PER_BATCH)]
        recs = make_records(values, base_offset=off, timestamp=1_700_000_000_000 + off)
        out += encode_batch(recs, base_offset=off, partition_leader_epoch=term)
        off += RECORDS_PER_BATCH
    return bytes(out)


def upload_segments(
    mstore: ManifestStore, partition: int, blobs: list[bytes], *, term: int = 1,
    seg_term: int = 1,
) -> tuple[PartitionManifest, str]:
    """Upload `blobs` as the next segments of the partition (indexes, then segment, then the
    manifest by CAS) exactly as docs/format.md describes; returns the committed head."""
    store = mstore.store
    m, etag = mstore.load(TOPIC, partition, REVISION)
    metas = []
    for data in blobs:
        headers = list(iter_batch_headers(data))
        meta = SegmentMeta(
            base_offset=headers[0].base_offset,
            last_offset=headers[-1].last_offset,
            base_timestamp=headers[0].first_timestamp,
            max_timestamp=max(h.max_timestamp for h in headers),
            size_bytes=len(data),
            segment_term=seg_term,
            writer_term=max(term, m.term),
            checksum=crc32c.crc32c(data),
        )
        index, timeindex = build_indexes(data, base_offset=meta.base_offset)
        for kind, blob in (("index", index), ("timeindex", timeindex)):
            store.put(keys.object_key(TOPIC, partition, REVISION,
                                      keys.index_name(meta.object_name, kind)), blob)
        store.put(keys.object_key(TOPIC, partition, REVISION, meta.object_name), data)
        metas.append(meta)
    new = edits.add_segments(edits.with_term(m, max(term, m.term)), metas)
    result = mstore.commit(new, etag)
    return result.manifest, result.etag


def seed(mstore: ManifestStore, partitions: int, segments: int) -> dict[int, bytes]:
    """Topic manifest plus `segments` small segments per partition; returns each partition's
    whole log (the concatenated segment bytes) to compare against."""
    save_topic_manifest(mstore.store, TopicManifest(TOPIC, REVISION, partitions,
                                                    segment_bytes=4096))
    logs = {}
    step = RECORDS_PER_BATCH * BATCHES_PER_SEGMENT
    for p in range(partitions):
        blobs = [segment_bytes(i * step) for i in range(segments)]
        upload_segments(mstore, p, blobs)
        logs[p] = b"".join(blobs)
    return logs


def make_config(store: ObjectStore, **cluster: Any) -> Config:
    # a small index interval so the rebuilt `.index` of a merged segment has many entries
    return parse_config({"storage": {"url": store.settings.url}, "cluster": cluster,
                         "topics": {TOPIC: {"index.interval.bytes": 256}}}, source="test.toml")


def make_context(store: ObjectStore, **cluster: Any) -> JobContext:
    config = make_config(store, **cluster)
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    return JobContext(config, store.settings, store, mstore)


def read_back(
    mstore: ManifestStore, partition: int, *, topic: str = TOPIC, revision: str = REVISION
) -> tuple[PartitionManifest, bytes]:
    """The partition's bytes as a reader gets them: every live segment via the manifest,
    checksum verified, concatenated in offset order."""
    m, _ = mstore.load(topic, partition, revision)
    out = bytearray()
    for seg in mstore.iter_segments(m):
        data = mstore.store.get(m.segment_key(seg))
        assert crc32c.crc32c(data) == seg.checksum and len(data) == seg.size_bytes
        out += data
    return m, bytes(out)


def batches_by_offset(log: bytes) -> dict[int, bytes]:
    """Each offset -> the bytes of the batch holding it."""
    out = {}
    for h in iter_batch_headers(log):
        for off in range(h.base_offset, h.last_offset + 1):
            out[off] = log[h.position:h.end_position]
    return out


def assert_every_offset_reads_back(mstore: ManifestStore, partition: int, log: bytes) -> None:
    """Look every offset up as a consumer would (manifest -> segment -> its `.index` -> batch)
    and compare the batch bytes with the original log's."""
    m, whole = read_back(mstore, partition)
    assert whole == log
    expected = batches_by_offset(log)
    assert m.log_start_offset == 0 and m.last_offset == max(expected)
    cache: dict[str, tuple[bytes, OffsetIndex]] = {}
    for off, batch in expected.items():
        seg = mstore.find_offset(m, off)
        key = m.segment_key(seg)
        if key not in cache:  # seeded segments keep Kafka's files, merged ones a bundle
            index = segment_indexes.read_indexes(mstore.store, m.data_prefix, seg.object_name,
                                                 seg.index_layout, ("index",),
                                                 segment_bytes=seg.size_bytes)["index"]
            assert index is not None, f"{seg.object_name} has no offset index"
            cache[key] = (mstore.store.get(key),
                          OffsetIndex.from_bytes(index, base_offset=seg.base_offset))
        data, index = cache[key]
        pos = index.lookup(off).position
        for h in iter_batch_headers(data, pos):
            if h.last_offset >= off:
                assert data[h.position:h.end_position] == batch, f"offset {off}"
                break
        else:
            pytest.fail(f"offset {off} not found in {seg.object_name}")
