"""A broker's own cleaner rewrites a compacted topic's local segments after part of the log was
uploaded: it drops superseded records (holes, segments whose first batch is past their base),
and merges segments, one of them straddling the manifest's end. The archiver uploads only what
lies above the manifest, never re-uploads what is archived, and reports no gap for offsets
compaction removed; the bucket then holds the uploaded history followed by the broker's
compacted data, every offset of the manifest contiguous (design invariants 3, 4)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
from support.compaction_reference import KeyEvent, scan_segment
from support.configs import config_over
from support.remote import TOPIC, archive

from archiver.service import Archiver
from archiver.space import DiskInfo
from archiver.upload_policy import (
    ArchivalState,
    Gap,
    LocalSegment,
    LogSnapshot,
    UploadDecision,
    UploadKind,
    UploadParams,
    plan_uploads,
)
from manifests import ManifestSettings, ManifestStore, PartitionManifest
from manifests.topic import iter_topic_manifest_keys
from tiered.config import Config
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.compaction import ProducerEvent, compact_segment
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.kafka.records import iter_batch_headers, iter_batches
from tiered.kafka.segment import build_indexes, parse_segment_file_name
from tiered.store import FileStore, StoreSettings

T0 = 1_700_000_000_000


def _append(directory: Path, rng: random.Random, batches: int, *, first: bool) -> int:
    with LogWriter(directory, segment_bytes=1500, fsync=False, index_interval_bytes=200,
                   topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC),
                   clock=lambda: T0 / 1000) as w:
        if first:
            w.become_leader(1)
        for _ in range(batches):
            o = w.log_end_offset
            w.append([ProducerRecord(rng.randbytes(20), b"k%02d" % rng.randrange(12),
                                     timestamp=T0 + o + i) for i in range(3)])
        w.roll()
        end = w.log_end_offset
    write_high_watermarks(directory.parent, {TopicPartition(TOPIC, 0): end}, fsync=False)
    return end


def _broker_cleans_and_merges(directory: Path, merge_from: int) -> list[tuple[int, bytes]]:
    """Kafka's cleaner over every closed local segment (latest record per key), then the
    segments from the one at `merge_from` on merged into one file named by its first base,
    as Kafka's cleaner groups them. Returns the new files (base, bytes)."""
    logs = sorted(directory.glob("*.log"), key=lambda p: parse_segment_file_name(p.name) or 0)
    closed = logs[:-1]  # the (empty) active segment stays
    data = [p.read_bytes() for p in closed]
    latest: dict[bytes, int] = {}
    for blob in data:
        for ev in scan_segment(blob):
            if isinstance(ev, KeyEvent):
                latest[ev.hash] = max(latest.get(ev.hash, -1), ev.offset)
            assert not isinstance(ev, ProducerEvent)
    keep = set(latest.values())
    cleaned = [compact_segment(blob, latest=keep, flags={}, now_ms=T0,
                               delete_retention_ms=None).data for blob in data]
    bases = [parse_segment_file_name(p.name) or 0 for p in closed]
    groups: list[tuple[int, bytes]] = []
    for base, blob in zip(bases, cleaned, strict=True):
        if base > merge_from and groups and groups[-1][0] >= merge_from:
            groups[-1] = (groups[-1][0], groups[-1][1] + blob)
        else:
            groups.append((base, blob))
    for p in closed:
        for suffix in (".log", ".index", ".timeindex"):
            p.with_suffix(suffix).unlink(missing_ok=True)
    for base, blob in groups:
        name = directory / f"{base:020d}.log"
        name.write_bytes(blob)
        index, timeindex = build_indexes(blob, base_offset=base, index_interval_bytes=200)
        name.with_suffix(".index").write_bytes(index)
        name.with_suffix(".timeindex").write_bytes(timeindex)
    return groups


def _config(tmp_path: Path, policy: str) -> Config:
    return config_over(tmp_path, mode="advise", topics={TOPIC: {"cleanup.policy": policy}},
                       cluster={"log_retention_ms": -1})


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_local_log_compacted_and_merged_after_upload_goes_up_above_the_manifest_only(
    tmp_path: Path, policy: str
) -> None:
    config = _config(tmp_path, policy)
    directory = config.log_dirs[0] / f"{TOPIC}-0"
    rng = random.Random(2)
    _append(directory, rng, 60, first=True)
    store = FileStore(StoreSettings(url=config.storage.url))
    archive(config, store)
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    uploaded_first = {i.key for i in store.list("") if i.key.endswith(".log")}
    assert uploaded_first
    end = _append(directory, rng, 60, first=False)
    m_before = _head(mstore, store)
    cut = m_before.last_offset
    # the broker cleans everything and merges from a segment below the manifest's end on
    bases = sorted(parse_segment_file_name(p.name) or 0 for p in directory.glob("*.log"))
    straddle = max(b for b in bases if b <= cut)
    groups = _broker_cleans_and_merges(directory, straddle)
    merged = dict(groups)[straddle]
    heads = list(iter_batch_headers(merged))
    assert straddle <= cut < heads[-1].last_offset, "the merged file straddles the manifest"
    assert cut + 1 not in {h.base_offset for h in heads}, "the batch after the end went"

    archive(config, store)

    m = _head(mstore, store)
    assert m.last_offset == end - 1, "everything above the manifest went up"
    after = {i.key for i in store.list("") if i.key.endswith(".log")}
    assert set(uploaded_first) <= after
    for key in after - set(uploaded_first):  # nothing archived was uploaded again
        base = int(key.rsplit("/", 1)[1].split("-")[0])
        assert base > cut, key
    # the manifest is contiguous and the bucket holds the broker's compacted records above it
    segs = list(m.segments)
    assert all(b.base_offset == a.last_offset + 1 for a, b in zip(segs, segs[1:], strict=False))
    remote = []
    for seg in segs:
        if seg.base_offset > cut:
            blob = store.get(m.segment_key(seg))
            first = next(iter_batch_headers(blob)).base_offset
            # an object starting after its range is marked a compacted copy (scrub, readers)
            assert first == seg.base_offset or seg.compacted, seg
            remote += [r.offset for b in iter_batches(blob) for r in b.records]
    assert any(s.compacted for s in segs if s.base_offset > cut)
    local = [r.offset for _b, blob in groups for b in iter_batches(blob) for r in b.records
             if r.offset > cut]
    assert remote == local and local


def _head(mstore: ManifestStore, store: FileStore) -> PartitionManifest:
    ((name, rev, _key),) = list(iter_topic_manifest_keys(store))
    m, _ = mstore.load(name, 0, rev)
    return m


def _round(config: Config, store: FileStore) -> str:
    archiver = Archiver(config, store, clock=lambda: T0 / 1000 + 3600,
                        disk_usage=lambda _p: DiskInfo(2**40, 2**39))
    try:
        (row,) = archiver.upload_round().partitions
    finally:
        archiver.close()
    return f"{row.decision}: {row.error}"


def test_a_delete_topic_with_the_same_holes_reports_the_gap(tmp_path: Path) -> None:
    """Only a compacted topic's holes are compaction's: the same layout in a `delete` topic is
    data lost before upload, reported as a gap (never skipped over)."""
    config = _config(tmp_path, "delete")
    directory = config.log_dirs[0] / f"{TOPIC}-0"
    rng = random.Random(2)
    _append(directory, rng, 60, first=True)
    store = FileStore(StoreSettings(url=config.storage.url))
    archive(config, store)
    _append(directory, rng, 60, first=False)
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    cut = _head(mstore, store).last_offset
    bases = sorted(parse_segment_file_name(p.name) or 0 for p in directory.glob("*.log"))
    straddle = max(b for b in bases if b <= cut)
    merged = dict(_broker_cleans_and_merges(directory, straddle))[straddle]
    if cut + 1 in {h.base_offset for h in iter_batch_headers(merged)}:
        pytest.skip("this layout kept the batch after the manifest's end")
    outcome = _round(config, store)
    assert outcome.startswith("corrupt_segment") and "no batch starts" in outcome
    assert _head(mstore, store).last_offset == cut, "nothing skipped over the hole"


def test_the_policy_continues_across_holes_only_when_told() -> None:
    """Pure: a segment starting past the manifest's next offset is a gap, unless the holes are
    compaction's; then it goes up whole with its range widened down to the manifest's end."""
    log = LogSnapshot((LocalSegment(0, 99, 1000, 1), LocalSegment(150, 199, 500, 2)), None, 200)
    params = UploadParams()
    gap = plan_uploads(log, ArchivalState(120, 0), params, 0)
    assert gap.decision is UploadDecision.GAP and gap.gap == Gap(121, 150)
    plan = plan_uploads(log, ArchivalState(120, 0, compaction_holes=True), params, 0)
    (cand,) = plan.candidates
    assert (cand.kind, cand.begin_inclusive, cand.last_offset, cand.byte_begin_inclusive) == (
        UploadKind.SEGMENT, 121, 199, 0)
    assert cand.holes
    straddle = plan_uploads(log, ArchivalState(50, 0, compaction_holes=True), params, 0)
    assert [(c.kind, c.begin_inclusive) for c in straddle.candidates] == [
        (UploadKind.SEGMENT_SUFFIX, 51), (UploadKind.SEGMENT, 100)]
