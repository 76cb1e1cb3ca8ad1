"""Helpers (no tests) for the recover, rebuild and scrub tests: a Kafka log written with
`LogWriter`, uploaded to the bucket exactly as docs/format.md lays it out (index objects,
then the segment object, then a compare-and-swap commit of the head; a topic manifest per
topic), and a `JobContext` over that bucket."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c

from manifests import edits, keys
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from manifests.topic import TopicManifest, save_topic_manifest
from spark_jobs.job_context import JobContext
from tiered.config import Config, parse_config
from tiered.kafka.checkpoints import topic_id_to_str
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, ProducerRecord
from tiered.kafka.segment import Segment
from tiered.store.base import ObjectStore

TOPIC = "orders"
#: a fixed Kafka topic id, so revisions (and keys) are the same in every run
TOPIC_ID = uuid.UUID("5a15be54-e344-4882-b402-145b6ef9c9e6")
REVISION = topic_id_to_str(TOPIC_ID)
#: small, so segments of a few KiB get several index entries
INDEX_INTERVAL_BYTES = 256


class FakeClock:
    """Seconds since the epoch that advance 1 ms per call from the real time at creation:
    records stay inside every retention limit while their timestamps are still regular."""

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def __call__(self) -> float:
        self.ms += 1
        return self.ms / 1000


def write_partition(
    log_dir: Path, partition: int, *, segments: int = 5, batches_per_segment: int = 4,
    records_per_batch: int = 5, epochs: tuple[int, ...] = (1, 2),
) -> Path:
    """A partition dir with `segments` closed segments plus an active one holding a batch.
    Leader epochs change part-way (so leader-epoch-checkpoint has several entries)."""
    directory = log_dir / f"{TOPIC}-{partition}"
    clock = FakeClock()
    with LogWriter(directory, topic_id=TOPIC_ID, clock=clock, fsync=False,
                   index_interval_bytes=INDEX_INTERVAL_BYTES) as writer:
        total = segments * batches_per_segment
        for i in range(total + 1):
            epoch = epochs[min(len(epochs) - 1, i * len(epochs) // max(total, 1))]
            if epoch != writer.leader_epoch or not writer.leader_epochs:
                writer.become_leader(epoch)
            records = [
                ProducerRecord(value=f"p{partition}-b{i}-r{r}".encode() * 3,
                               key=f"k{r}".encode())
                for r in range(records_per_batch)
            ]
            writer.append(records)
            if (i + 1) % batches_per_segment == 0:
                writer.roll()
    return directory


def write_log(log_dir: Path, partitions: int = 2, **kwargs: Any) -> Path:
    for p in range(partitions):
        write_partition(log_dir, p, **kwargs)
    return log_dir


@dataclass
class Archived:
    """What `archive` put in the bucket, per partition."""

    segments: dict[int, list[SegmentMeta]]
    #: segment file bytes by (partition, base offset): .log, .index, .timeindex
    files: dict[tuple[int, int], dict[str, bytes]]


def archive(store: ObjectStore, ctx: JobContext, log_dir: Path, *, term: int = 1) -> Archived:
    """Upload every closed segment of every partition under `log_dir` and commit manifests."""
    out = Archived({}, {})
    local = LocalLog([log_dir])
    for part in local:
        revision = topic_id_to_str(part.topic_id) if part.topic_id else "0"
        m, etag = ctx.manifests.load(part.topic, part.partition, revision)
        m = edits.with_term(m, term)
        metas = []
        for seg in part.closed_segments:
            meta = upload_segment(store, m, seg, term=term,
                                  epoch=part.epoch_for_offset(seg.base_offset) or 0)
            metas.append(meta)
            out.files[part.partition, seg.base_offset] = {
                ".log": seg.log_path.read_bytes(),
                ".index": seg.index_path.read_bytes(),
                ".timeindex": seg.timeindex_path.read_bytes(),
            }
        ctx.manifests.commit(edits.add_segments(m, metas), etag)
        out.segments[part.partition] = metas
        save_topic_manifest(store, TopicManifest(
            part.topic, revision, partition_count=len(local)))
    return out


def archive_with_archiver(config: Config, store: ObjectStore, ctx: JobContext) -> Archived:
    """Upload the closed segments of `config`'s log dir with the real archiver (one pass) and
    return what its manifests now list, with the local files they came from."""
    from archiver.service import Archiver

    report = Archiver(config, store).run_once()
    assert report.ok, report
    out = Archived({}, {})
    for part in LocalLog(config.log_dirs):
        m, etag = ctx.manifests.load(part.topic, part.partition, REVISION)
        assert etag is not None
        out.segments[part.partition] = list(ctx.manifests.iter_segments(m))
        for seg in part.closed_segments:
            out.files[part.partition, seg.base_offset] = {
                suffix: path.read_bytes()
                for suffix, path in ((".log", seg.log_path), (".index", seg.index_path),
                                     (".timeindex", seg.timeindex_path))
            }
    assert sum(len(s) for s in out.segments.values()) == len(out.files)
    return out


def upload_segment(store: ObjectStore, m: PartitionManifest, seg: Segment, *, term: int,
                   epoch: int) -> SegmentMeta:
    data = seg.log_path.read_bytes()
    summary = seg.verify()
    assert summary.last_offset is not None and summary.first_timestamp is not None
    meta = SegmentMeta(
        base_offset=seg.base_offset, last_offset=summary.last_offset,
        base_timestamp=summary.first_timestamp,
        max_timestamp=summary.max_timestamp or summary.first_timestamp,
        size_bytes=len(data), segment_term=epoch, writer_term=term,
        checksum=crc32c.crc32c(data),
    )
    for kind, path in (("index", seg.index_path), ("timeindex", seg.timeindex_path)):
        store.put(index_key(m, meta, kind), path.read_bytes())
    store.put(m.segment_key(meta), data)
    return meta


def index_key(m: PartitionManifest, meta: SegmentMeta, kind: str) -> str:
    return keys.object_key(m.topic, m.partition, m.revision,
                           keys.index_name(meta.object_name, kind))


def segment_key(partition: int, meta: SegmentMeta) -> str:
    return keys.object_key(TOPIC, partition, REVISION, meta.object_name)


def make_config(tmp_path: Path, *, storage: dict[str, Any] | None = None,
                log_dir: Path | None = None, **cluster: Any) -> Config:
    """A configuration over a `file://` bucket in `tmp_path` (or the `storage` section given)
    and `log_dir`; `cluster` overrides cluster properties."""
    storage = storage or {"url": (tmp_path / "bucket").as_uri()}
    data: dict[str, Any] = {"storage": storage, "cluster": cluster}
    if log_dir is not None:
        data["log"] = {"dirs": [str(log_dir)]}
    return parse_config(data, source="<test>", base_dir=tmp_path)


def make_context(config: Config, store: ObjectStore) -> JobContext:
    """A job context over `store`; Spark comes from the session the `spark` fixture made."""
    return JobContext.from_config(config, store=store)


def delete_all_manifests(store: ObjectStore) -> list[str]:
    """Every head, archived and topic manifest: what a lost metadata region looks like."""
    doomed = [i.key for i in store.list("") if "/meta/" in i.key or "/topics/" in i.key]
    assert not store.delete_many(doomed)
    return doomed


def write_config_file(tmp_path: Path, config: Config) -> Path:
    """The TOML file the CLI (and `spark-submit spark_jobs/<job>.py`) reads for `config`."""
    path = tmp_path / "tiered.toml"
    path.write_text(
        f'[storage]\nurl = "{config.storage.url}"\n\n'
        f"[cluster]\nlog_index_interval_bytes = {INDEX_INTERVAL_BYTES}\n"
    )
    return path
