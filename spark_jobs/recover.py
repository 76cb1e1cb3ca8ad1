"""Recovery from the bucket (`tiered recover`), on Spark: Redpanda's topic recovery
(`redpanda.remote.recovery`) and the rebuilding of lost or corrupt manifests.

**Recover a topic** into a Kafka log dir: the driver reads the topic manifest and each
partition's manifests and picks the segments (all, or the newest `--max-bytes` per
partition, never less than the newest segment so the log end is right). Executors stream
each segment object into `{base:020d}.log` (via a `.tmp` file renamed into place, after the
object's CRC-32C, size, offsets and every batch CRC checked out), and write the `.index` /
`.timeindex` from the bucket when they are consistent with the log, else rebuilt with
`tiered.kafka.segment.build_indexes`. The driver then writes `leader-epoch-checkpoint` (from the
batches' leader epochs), `partition.metadata` (when the revision is a Kafka topic id) and the
log dir's offset checkpoints, and reads the result back with `tiered.kafka.local_log.LocalLog`.
Executors write straight into the log dir: on a cluster it must be a mount every executor and
the driver share (the driver checks every file it was told about is there).

`--rebuild-manifests` (lost or corrupt manifests rebuilt from the segment objects) lives in
`spark_jobs.rebuild`; `run_rebuild_manifests` here is its entry point.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import time
import uuid
from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from manifests import keys, segment_indexes
from manifests.errors import ManifestError
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from manifests.topic import TopicManifest
from spark_jobs.job_context import (
    JobContext,
    PartitionRef,
    job_error,
)
from spark_jobs.segment_walk import meta_problem, run_tasks, walk_object
from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    EpochEntry,
    TopicPartition,
    atomic_write,
    fsync_dir,
    read_offset_checkpoint,
    topic_id_from_str,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
    write_partition_metadata,
)
from tiered.kafka.index import OffsetIndex, TimeIndex
from tiered.kafka.local_log import LocalLog
from tiered.kafka.records import BatchHeader
from tiered.kafka.segment import (
    INDEX_SUFFIX,
    TIMEINDEX_SUFFIX,
    TXNINDEX_SUFFIX,
    build_indexes,
    segment_file_name,
)
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound, StoreError

log = logging.getLogger("tiered.spark.recover")

#: index kind (`manifests.keys`) -> file suffix in a Kafka partition dir
_INDEX_FILES = {"index": INDEX_SUFFIX, "timeindex": TIMEINDEX_SUFFIX, "txnindex": TXNINDEX_SUFFIX}


# -- choosing what to recover (pure) -------------------------------------------------------------


def select_newest(segments: list[SegmentMeta], max_bytes: int | None) -> list[SegmentMeta]:
    """The newest segments whose sizes sum to at most `max_bytes` (None: all), and always at
    least the newest one, so the recovered log ends where the bucket's does."""
    if max_bytes is None or not segments:
        return list(segments)
    first = len(segments) - 1
    total = segments[first].size_bytes
    while first > 0 and total + segments[first - 1].size_bytes <= max_bytes:
        first -= 1
        total += segments[first].size_bytes
    return segments[first:]


def epoch_entries(per_segment: Iterable[Iterable[tuple[int, int]]], log_start: int
                  ) -> list[EpochEntry]:
    """`leader-epoch-checkpoint` entries from each recovered segment's (epoch, first offset)
    transitions, in offset order: epochs strictly grow; as Kafka's cache does after the log
    start moved, entries wholly below `log_start` go except the newest, which starts there."""
    entries: list[EpochEntry] = []
    for transitions in per_segment:
        for epoch, start in transitions:
            if not entries or epoch > entries[-1].epoch:
                entries.append(EpochEntry(epoch, start))
    below = [i for i, e in enumerate(entries) if e.start_offset <= log_start]
    if below:
        keep = below[-1]
        entries = [EpochEntry(entries[keep].epoch, log_start), *entries[keep + 1:]]
    return entries


# -- executors: one segment into the log dir ---------------------------------------------------


class SegmentTask(NamedTuple):
    """Restore one segment object as `{base}.log` (+ indexes) in `partition_dir`."""

    partition_dir: str
    #: key of the segment object, and the partition's data prefix (its indexes are beside it)
    key: str
    data_prefix: str
    meta: SegmentMeta
    index_interval_bytes: int


class SegmentResult(NamedTuple):
    partition_dir: str
    base_offset: int
    #: files written (name -> size), for the driver's check that it sees them too
    files: tuple[tuple[str, int], ...]
    epochs: tuple[tuple[int, int], ...]
    indexes_rebuilt: bool
    error: str | None


class _Batches:
    """Batch positions and offset ranges of one segment, to check a downloaded index."""

    def __init__(self) -> None:
        self.positions = array("q")
        self.bases = array("q")
        self.lasts = array("q")
        self.transactional = False

    def add(self, h: BatchHeader) -> None:
        self.positions.append(h.position)
        self.bases.append(h.base_offset)
        self.lasts.append(h.last_offset)
        self.transactional = self.transactional or h.is_transactional

    def index_problem(self, data: bytes, time_data: bytes, base: int) -> str | None:
        """Why the downloaded `.index` / `.timeindex` do not fit this log, or None."""
        try:
            index = OffsetIndex.from_bytes(data, base_offset=base)
            times = TimeIndex.from_bytes(time_data, base_offset=base)
        except CorruptSegmentError as err:
            return str(err)
        for entry in index:
            i = bisect_left(self.positions, entry.position)
            if i == len(self.positions) or self.positions[i] != entry.position or not (
                self.bases[i] <= entry.offset <= self.lasts[i]
            ):
                return f"index entry {entry} does not point at the batch holding its offset"
        last = self.lasts[-1] if self.lasts else base - 1
        for tentry in times:
            if not base <= tentry.offset <= last:
                return f"time index entry {tentry} is outside offsets {base}..{last}"
        return None


def _indexes(store: ObjectStore, task: SegmentTask, batches: _Batches) -> dict[str, bytes | None]:
    """The segment's indexes from the bucket; none when its bundle is missing or garbled (the
    offset and time indexes are rebuilt from the log) unless it holds transactional batches:
    which of them were aborted cannot be rebuilt from the segment alone, and a log restored
    without that would serve aborted records as committed."""
    meta = task.meta
    try:
        return segment_indexes.read_indexes(store, task.data_prefix, meta.object_name,
                                            meta.index_layout, segment_indexes.INDEX_KINDS,
                                            segment_bytes=meta.size_bytes)
    except (ObjectNotFound, CorruptSegmentError) as err:
        if batches.transactional:
            raise CorruptSegmentError(
                f"its transaction index is unreadable ({err}) and it holds transactional "
                "batches", path=task.key) from err
        log.warning("%s: index bundle unusable (%s); rebuilding the indexes", task.key, err)
        return {}


def _restore(counter: Any, store: ObjectStore, task: SegmentTask) -> SegmentResult:
    """Runs in an executor: stream, verify and place one segment. Never raises for a bad or
    unreadable object: the error comes back in the result and nothing is left behind."""
    meta, directory = task.meta, Path(task.partition_dir)
    log_path = directory / segment_file_name(meta.base_offset)
    tmp = log_path.with_name(log_path.name + ".tmp")
    written: list[Path] = []
    batches = _Batches()
    try:
        with open(tmp, "wb") as f:
            facts = walk_object(store, task.key, meta.size_bytes, sink=f.write,
                                on_header=batches.add)
            f.flush()
            os.fsync(f.fileno())
        problem = meta_problem(facts, meta)
        if problem is not None:
            raise CorruptSegmentError(problem[1], path=task.key)
        rebuilt = _place_indexes(store, task, tmp, batches, written)
        os.replace(tmp, log_path)
        written.append(log_path)
        fsync_dir(directory)
    except (TieredError, StoreError, OSError) as err:
        for path in (tmp, *written):
            path.unlink(missing_ok=True)
        return SegmentResult(task.partition_dir, meta.base_offset, (), (), False, job_error(err))
    finally:
        if counter is not None:
            counter.add(meta.size_bytes)
    epochs = facts.epochs or ((meta.segment_term, meta.base_offset),)
    files = tuple((p.name, p.stat().st_size) for p in written)
    return SegmentResult(task.partition_dir, meta.base_offset, files, epochs, rebuilt, None)


def _place_indexes(store: ObjectStore, task: SegmentTask, log_tmp: Path, batches: _Batches,
                   written: list[Path]) -> bool:
    """Write the segment's index files; returns whether they had to be rebuilt."""
    base = task.meta.base_offset
    got = _indexes(store, task, batches)
    index, times = got.get("index"), got.get("timeindex")
    rebuilt = (index is None or times is None
               or batches.index_problem(index, times, base) is not None)
    if rebuilt:
        with open(log_tmp, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                index, times = b"", b""
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    index, times = build_indexes(mapped, base_offset=base, path=task.key,
                                                 index_interval_bytes=task.index_interval_bytes)
    files = {"index": index, "timeindex": times, "txnindex": got.get("txnindex")}
    for kind, data in files.items():
        if data is None:
            continue
        path = log_tmp.parent / segment_file_name(base, _INDEX_FILES[kind])
        atomic_write(path, data, sync=True)
        written.append(path)
    return rebuilt


# -- recover: the driver ------------------------------------------------------------------------


@dataclass
class _Partition:
    ref: PartitionRef
    directory: Path
    manifest: PartitionManifest
    segments: list[SegmentMeta]


def _pick_revision(ctx: JobContext, topic: str) -> tuple[TopicManifest, list[str]]:
    """The topic manifest to recover from. A deleted-and-recreated topic leaves several
    revisions: take the one whose head manifests were written last (the live one)."""
    found = ctx.enumerate(topic).require(topic)
    if not found.topics:
        problems = "; ".join(found.problems)
        raise TieredError(
            f"no readable topic manifest for topic {topic!r} in the bucket"
            + (f" ({problems})" if problems else "")
            + "; if manifests were lost, run `tiered recover --rebuild-manifests` first"
        )

    def newest(t: TopicManifest) -> float:
        stamps = [0.0]
        for p in range(t.partition_count):
            try:
                info = ctx.store.head(keys.partition_manifest_key(t.topic, p, t.revision))
            except ObjectNotFound:
                continue
            stamps.append(info.last_modified)
        return max(stamps)

    ranked = sorted(found.topics, key=newest, reverse=True)
    return ranked[0], [t.revision for t in ranked[1:]]


def _prepare_dirs(parts: list[_Partition], overwrite: bool) -> list[str]:
    """Refuse non-empty partition dirs (or, with `overwrite`, move them aside the way Kafka
    marks a deleted partition: `{dir}.{id}-delete`, which brokers and LocalLog skip)."""
    busy = [p.directory for p in parts if p.directory.exists() and any(p.directory.iterdir())]
    if busy and not overwrite:
        raise TieredError(
            f"refusing to recover into non-empty partition directories: "
            f"{', '.join(map(str, busy))}; move them away first (or pass --overwrite)"
        )
    moved = []
    for d in busy:
        aside = d.with_name(f"{d.name}.{uuid.uuid4().hex}-delete")
        d.rename(aside)
        log.info("moved existing %s aside to %s", d, aside)
        moved.append(str(aside))
    for p in parts:
        p.directory.mkdir(parents=True, exist_ok=True)
    return moved


def _finish_partition(part: _Partition, results: list[SegmentResult]) -> dict[str, Any]:
    """Write the partition's own state files once its segments are in place."""
    m, segs = part.manifest, part.segments
    last = m.last_offset
    if segs:
        log_start = max(segs[0].base_offset, m.log_start_offset)
    else:
        log_start = last + 1 if last >= 0 else 0
        if last >= 0:  # everything expired: an empty segment keeps the offsets from restarting
            for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX, ".log"):
                atomic_write(part.directory / segment_file_name(log_start, suffix), b"")
    ordered = sorted(results, key=lambda r: r.base_offset)
    epochs = epoch_entries((r.epochs for r in ordered), log_start)
    write_leader_epoch_checkpoint(part.directory / LEADER_EPOCH_CHECKPOINT, epochs)
    try:
        topic_id = topic_id_from_str(part.ref.revision)
    except ValueError:
        topic_id = None  # an integer revision is no Kafka topic id: the broker assigns one
    if topic_id is not None:
        write_partition_metadata(part.directory / PARTITION_METADATA, topic_id)
    for r in ordered:
        for name, size in r.files:
            path = part.directory / name
            if not path.exists() or path.stat().st_size != size:
                raise TieredError(
                    f"an executor wrote {path} but the driver does not see it: --log-dir must "
                    "be one directory shared by the driver and every executor"
                )
    return {
        "partition": part.ref.partition,
        "dir": str(part.directory),
        "segments": len(segs),
        "bytes": sum(s.size_bytes for s in segs),
        "log_start_offset": log_start,
        "log_end_offset": last + 1 if last >= 0 else 0,
        "indexes_rebuilt": sum(1 for r in results if r.indexes_rebuilt),
        "leader_epochs": [[e.epoch, e.start_offset] for e in epochs],
        "topic_id_written": topic_id is not None,
    }


def _write_log_dir_checkpoints(log_dir: Path, done: list[dict[str, Any]], topic: str) -> None:
    """Merge the recovered partitions into the log dir's three offset checkpoints."""
    values = {
        REPLICATION_OFFSET_CHECKPOINT: "log_end_offset",
        RECOVERY_POINT_OFFSET_CHECKPOINT: "log_end_offset",
        LOG_START_OFFSET_CHECKPOINT: "log_start_offset",
    }
    for name, field_name in values.items():
        path = log_dir / name
        offsets = read_offset_checkpoint(path) if path.exists() else {}
        for p in done:
            offsets[TopicPartition(topic, p["partition"])] = p[field_name]
        write_offset_checkpoint(path, offsets)


def run_recover(
    ctx: JobContext, *, topic: str, log_dir: Path, max_bytes: int | None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Recreate `topic`'s partitions under `log_dir` from the bucket; see the module doc.
    Raises `TieredError` before changing anything when there is nothing to recover from or
    a partition dir is not empty (unless `overwrite`)."""
    started = time.monotonic()
    keys.validate_topic_name(topic)
    if max_bytes is not None and max_bytes < 0:
        raise TieredError(f"--max-bytes must not be negative, got {max_bytes}")
    t, others = _pick_revision(ctx, topic)
    tconf = ctx.config.topic_config(topic)
    log_dir = Path(log_dir).absolute()
    parts: list[_Partition] = []
    errors: list[str] = []
    for p in range(t.partition_count):
        ref = PartitionRef(topic, p, t.revision)
        try:
            m, _ = ctx.manifests.load(topic, p, t.revision)
            segs = select_newest(list(ctx.manifests.iter_segments(m)), max_bytes)
        except (ManifestError, StoreError) as err:  # skip it, recover the others
            errors.append(f"{ref}: not recovered: {job_error(err)}")
            continue
        parts.append(_Partition(ref, log_dir / TopicPartition(topic, p).dir_name, m, segs))
    log_dir.mkdir(parents=True, exist_ok=True)
    moved = _prepare_dirs(parts, overwrite)
    tasks = [
        SegmentTask(
            str(part.directory), part.manifest.segment_key(seg), part.manifest.data_prefix,
            seg, tconf.index_interval_bytes,
        )
        for part in parts for seg in part.segments
    ]
    try:
        results = run_tasks(ctx, tasks, "recover: downloading segments", "tiered-recover",
                            _restore, lambda t: t.meta.size_bytes)
    except BaseException:  # the job itself failed: leave no half-written partition behind
        for part in parts:
            shutil.rmtree(part.directory, ignore_errors=True)
        raise
    by_dir: dict[str, list[SegmentResult]] = defaultdict(list)
    for r in results:
        by_dir[r.partition_dir].append(r)
    done: list[dict[str, Any]] = []
    for part in parts:
        mine = by_dir.get(str(part.directory), [])
        failed = [r.error for r in mine if r.error is not None]
        try:
            if failed:
                raise TieredError(f"{len(failed)} segment(s) failed, first: {failed[0]}")
            done.append(_finish_partition(part, mine))
            log.info("recovered %s into %s", part.ref, part.directory)
        except (TieredError, OSError) as err:
            shutil.rmtree(part.directory, ignore_errors=True)  # we created it: never half a log
            errors.append(f"{part.ref}: not recovered: {job_error(err)}")
    if done:
        _write_log_dir_checkpoints(log_dir, done, topic)
        errors += _check_readable(log_dir, topic, done)
    return {
        "ok": not errors,
        "topic": topic,
        "revision": t.revision,
        "other_revisions": others,
        "log_dir": str(log_dir),
        "partitions": done,
        "segments": sum(p["segments"] for p in done),
        "bytes": sum(p["bytes"] for p in done),
        "moved_aside": moved,
        "errors": errors,
        "elapsed_s": round(time.monotonic() - started, 3),
    }


def _check_readable(log_dir: Path, topic: str, done: list[dict[str, Any]]) -> list[str]:
    """Read the result back as the archiver would: every partition there, offsets right."""
    local = LocalLog([log_dir])
    errors = []
    for p in done:
        tp = TopicPartition(topic, p["partition"])
        if tp not in local:
            errors.append(f"{tp}: recovered but not found by a scan of {log_dir}")
            continue
        part = local.partition(tp)
        if part.problems or (p["segments"] and part.log_end_offset() != p["log_end_offset"]):
            errors.append(f"{tp}: recovered log reads back wrong: log end "
                          f"{part.log_end_offset()}, expected {p['log_end_offset']}; "
                          f"{'; '.join(part.problems)}")
    return errors


def run_rebuild_manifests(ctx: JobContext, *, topic: str | None) -> dict[str, Any]:
    """Rebuild every missing or unreadable head manifest (of `topic`, or all) from the segment
    objects in the bucket (`spark_jobs.rebuild`); intact heads are left alone."""
    from spark_jobs.rebuild import rebuild_manifests

    return rebuild_manifests(ctx, topic=topic)


def summary_lines(summary: Mapping[str, Any]) -> Iterator[str]:
    """Human-readable report of either job's summary."""
    if "log_dir" in summary:
        yield (f"recovered {summary['topic']} (revision {summary['revision']}) into "
               f"{summary['log_dir']}: {summary['segments']} segment(s), {summary['bytes']} bytes")
        for p in summary["partitions"]:
            yield (f"  partition {p['partition']}: {p['segments']} segment(s), offsets "
                   f"{p['log_start_offset']}..{p['log_end_offset'] - 1}")
    else:
        yield (f"{summary['partitions_found']} partition(s) with segment objects, "
               f"{len(summary['intact'])} intact, {len(summary['rebuilt'])} rebuilt")
        for r in summary["rebuilt"]:
            yield (f"  {r['partition']}: {r['segments']} segment(s), offsets "
                   f"{r['start_offset']}..{r['last_offset']}, {len(r['orphans'])} orphan(s)")
    for e in summary["errors"]:
        yield f"error: {e}"
