"""The executor side of compaction: scanning segment objects, cleaning one segment, uploading
one group of cleaned segments. Picklable values in, picklable values out; the store is built
on the executor (`spark_jobs.job_context.map_with_store`). The driver side is
`spark_jobs.compact`; the record-level rules are `tiered.kafka.compaction`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import crc32c

from manifests import keys
from manifests.collect import store_time_ms
from manifests.model import SegmentMeta
from spark_jobs.job_context import PartitionRef, job_error
from spark_jobs.merge_exec import RunResult, RunTask, SourceSegment, claim_name, fetch_source
from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.compaction import (
    KeyEvent,
    SegmentCleaning,
    compact_segment,
    empty_batch,
    scan_segment,
)
from tiered.kafka.index import NO_TIMESTAMP
from tiered.kafka.records import iter_batch_headers
from tiered.kafka.segment import build_indexes
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound

#: event tags of the scan stage (first element of each tuple)
KEY, TXN_KEY, PRODUCER, SCANNED = "k", "t", "p", "s"


class SegTask(NamedTuple):
    """One cleanable segment of one partition being compacted (`pidx` numbers the partition
    within the job)."""

    pidx: int
    part: PartitionRef
    row: int
    source: SourceSegment
    segment_term: int
    compacted: bool
    base_timestamp: int
    max_timestamp: int


def _fetch(store: ObjectStore, task: SegTask) -> bytes:
    """The segment's bytes, checked against the manifest (size, CRC-32C, every batch inside
    the listed offsets; a compacted copy may start later or end earlier than its range)."""
    return fetch_source(store, task.source)


def _check_range(task: SegTask, data: bytes) -> None:
    src = task.source
    for h in iter_batch_headers(data, path=src.key):
        if h.base_offset < src.base_offset or h.last_offset > src.last_offset:
            raise CorruptSegmentError(
                f"batch {h.base_offset}..{h.last_offset} lies outside the manifest's "
                f"{src.base_offset}..{src.last_offset}", path=src.key)


def scan_task(store: ObjectStore, task: SegTask) -> Iterator[tuple[Any, ...]]:
    """Stage 1: every keyed record and producer batch of one segment, tagged for the driver's
    shuffles, then one `SCANNED` row (bytes read, error or None). A corrupt or missing object
    yields only its `SCANNED` row with the error: the partition is then left alone."""
    try:
        data = _fetch(store, task)
        _check_range(task, data)
        events = list(_tag(task.pidx, scan_segment(data, path=task.source.key)))
    except TieredError as exc:
        yield (SCANNED, task.pidx, task.row, 0, job_error(exc))
        return
    yield from events
    yield (SCANNED, task.pidx, task.row, len(data), None)


def _tag(pidx: int, events: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """Tagged events; keys outside transactions are reduced to the segment's own latest
    offset per key first (a map-side combine bounded by the segment: superseded records of a
    segment never reach the shuffle)."""
    latest: dict[bytes, int] = {}
    for ev in events:
        if isinstance(ev, KeyEvent):
            if ev.txn_batch is None:
                latest[ev.hash] = ev.offset  # offset order: the last one seen is the latest
            else:
                yield (TXN_KEY, pidx, ev.txn_batch[1], ev.hash, ev.offset)
        else:
            yield (PRODUCER, pidx, ev.producer_id, ev)
    for digest, offset in latest.items():
        yield (KEY, pidx, digest, offset)


class CleanOut(NamedTuple):
    """Stage 3's result for one segment: the cleaned bytes and the counts (`data` is dropped
    before the counts go to the driver)."""

    task: SegTask
    data: bytes
    #: `empty_batch` of the segment's last batch: what stands for it if a group ends up empty
    empty: bytes
    stats: dict[str, int]
    changed: bool
    error: str | None = None


def clean_task(
    store: ObjectStore,
    task: SegTask,
    latest: Iterable[int],
    flags: Iterable[tuple[int, int]],
    *,
    now_ms: int,
    delete_retention_ms: int | None,
) -> CleanOut:
    """Stage 3: read the segment again and clean it with the partition-wide verdicts for its
    records (`latest`: offsets that are the latest of their key) and batches (`flags`)."""
    try:
        data = _fetch(store, task)
        res: SegmentCleaning = compact_segment(
            data, latest=frozenset(latest), flags=dict(flags), now_ms=now_ms,
            delete_retention_ms=delete_retention_ms, path=task.source.key)
    except TieredError as exc:
        return CleanOut(task, b"", b"", {}, False, job_error(exc))
    stats = {
        "bytes_in": res.bytes_in,
        "bytes_out": len(res.data),
        "records_in": res.records_in,
        "records_kept": res.records_kept,
        "tombstones_dropped": res.tombstones_dropped,
        "keyless_kept": res.keyless_kept,
        "batches_dropped": res.batches_dropped,
        "horizons_set": res.horizons_set,
    }
    empty = empty_batch(res.last_header) if res.last_header is not None else b""
    return CleanOut(task, res.data, empty, stats, res.changed)


class GroupTask(NamedTuple):
    """One group of adjacent cleaned segments to upload as one object."""

    gid: int
    pidx: int
    run: RunTask


def upload_group(store: ObjectStore, task: GroupTask, members: Iterable[CleanOut]) -> RunResult:
    """Stage 4: concatenate the group's cleaned segments in offset order, rebuild the indexes,
    claim a fresh generation name (If-None-Match) and upload; the result is what the merge
    job's commit loop takes (`spark_jobs.merge.commit_partition`)."""
    run = task.run
    outs = sorted(members, key=lambda c: c.task.row)
    uploaded: list[str] = []
    try:
        data = b"".join(c.data for c in outs)
        if not data:  # every record of the range went: one empty batch keeps its last offset
            data = outs[-1].empty
        headers = list(iter_batch_headers(data))
        index, timeindex = build_indexes(data, base_offset=run.base_offset,
                                         index_interval_bytes=run.index_interval_bytes)
        name, key = claim_name(store, run, data)
        uploaded.append(key)
        uploaded_at_ms = store_time_ms(store.head(key).last_modified)
        sent = len(data)
        extra = {"index": index, "timeindex": timeindex}
        txn = _txn_index(store, run)
        if txn:
            extra["txnindex"] = txn
        for kind, blob in extra.items():
            index_key = run.data_prefix + keys.index_name(name, kind)
            store.put(index_key, blob)
            uploaded.append(index_key)
            sent += len(blob)
    except TieredError as exc:
        if uploaded:  # never named by a manifest: remove it now (or garbage collection will)
            with contextlib.suppress(TieredError):
                store.delete_many(uploaded)
        return RunResult(run, None, (), 0, 0, job_error(exc))
    max_ts = max((h.max_timestamp for h in headers), default=NO_TIMESTAMP)
    base_ts = min(c.task.base_timestamp for c in outs[:1])
    meta = SegmentMeta(
        base_offset=run.base_offset,
        last_offset=run.last_offset,
        base_timestamp=max(NO_TIMESTAMP, min(base_ts, max_ts)),
        max_timestamp=max(max_ts, NO_TIMESTAMP),
        size_bytes=len(data),
        segment_term=run.segment_term,
        writer_term=run.writer_term,
        checksum=crc32c.crc32c(data),
        compacted=True,
        name=name,
    )
    return RunResult(run, meta, tuple(uploaded), 0, sent, uploaded_at_ms=uploaded_at_ms)


def _txn_index(store: ObjectStore, run: RunTask) -> bytes:
    """The sources' `.txnindex` objects concatenated: aborted transactions keep their entries
    (a `read_committed` reader of history that still holds their data needs them)."""
    parts = []
    for src in run.sources:
        try:
            parts.append(store.get(run.data_prefix + keys.index_name(src.name, "txnindex")))
        except ObjectNotFound:
            continue
    return b"".join(parts)
