"""The executor side of compaction: scanning segment objects, cleaning one segment, uploading
one group of cleaned segments. Picklable values in, picklable values out; the store is built
on the executor (`spark_jobs.job_context.map_with_store`). The driver side is
`spark_jobs.compact`; the record-level rules are `tiered.kafka.compaction`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import crc32c
import numpy as np

from manifests import segment_indexes
from manifests.collect import store_time_ms
from manifests.model import SegmentMeta
from spark_jobs.compact_columns import clean_segment, scan_keys
from spark_jobs.executor_spill import discard, spill, spill_path, unspill
from spark_jobs.job_context import PartitionRef, job_error
from spark_jobs.merge_exec import (
    RunResult,
    RunTask,
    SourceSegment,
    claim_name,
    fetch_source,
    source_txn_indexes,
)
from spark_jobs.record_columns import ID_BYTES, bucket_of, last_per_key
from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.compaction import SegmentCleaning, empty_batch, live_txn_entries
from tiered.kafka.index import NO_TIMESTAMP
from tiered.kafka.records import BatchHeader, iter_batch_headers
from tiered.kafka.segment import indexes_of
from tiered.kafka.txnindex import encode_txnindex, parse_txnindex
from tiered.store.base import ObjectStore

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
    #: how many key buckets the partition's key map is cut into (`key_bucket`)
    buckets: int = 1
    #: the run's spill tag (`executor_spill.new_job_tag`): the scan leaves the segment's
    #: bytes on the executor's disk for the cleaning pass, which leaves the cleaned bytes
    #: for the upload; "" spills nothing
    job: str = ""

    def spill_name(self, kind: str) -> str:
        """The name of this segment's spill of `kind` ("raw", "clean") in its run."""
        return f"{self.job}-{self.pidx}-{self.row}.{kind}"


def _fetch(store: ObjectStore, task: SegTask) -> bytes:
    """The segment's bytes, checked against the manifest's size and CRC-32C (`_batches`
    checks its batches)."""
    return fetch_source(store, task.source)


def _source_bytes(store: Callable[[], ObjectStore], task: SegTask) -> tuple[bytes, str | None]:
    """The segment's bytes as the scan left them on this machine's disk (and that file, kept),
    or from the bucket (and None); checked against the manifest either way. `store` is called
    only for the latter: a worker that finds every segment spilled never builds a client."""
    src = task.source
    path = spill_path(task.spill_name("raw")) if task.job else None
    spilled = unspill(path, src.size_bytes, src.checksum, keep=True)
    if spilled is not None:
        return spilled, path
    return _fetch(store(), task), None


def _batches(task: SegTask, data: bytes, *, verify_crc: bool = True) -> list[BatchHeader]:
    """The segment's batch headers, each batch's CRC checked (unless `verify_crc` is off:
    bytes the scan already walked, as their whole CRC-32C says), every batch inside the
    manifest's offsets (a compacted copy may start later or end earlier than its range)."""
    src = task.source
    out = list(iter_batch_headers(data, path=src.key, verify_crc=verify_crc))
    for h in out:
        if h.base_offset < src.base_offset or h.last_offset > src.last_offset:
            raise CorruptSegmentError(
                f"batch {h.base_offset}..{h.last_offset} lies outside the manifest's "
                f"{src.base_offset}..{src.last_offset}", path=src.key)
    return out


def prefetched(store: ObjectStore, tasks: Sequence[SegTask]
               ) -> Iterator[tuple[SegTask, bytes | TieredError]]:
    """Each task with its segment's bytes (or why they could not be had), the next segment's
    GET running while the caller works on this one: a scan task reads its segments one after
    another, and on S3 a 16 MiB GET takes about as long as walking it. One segment ahead at
    most."""

    def get(task: SegTask) -> bytes | TieredError:
        try:
            return _fetch(store, task)
        except TieredError as exc:
            return exc

    if not tasks:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="prefetch") as pool:
        pending = pool.submit(get, tasks[0])
        for i, task in enumerate(tasks):
            got = pending.result()
            if i + 1 < len(tasks):
                pending = pool.submit(get, tasks[i + 1])
            yield task, got


def scan_task(store: ObjectStore, task: SegTask, fetched: bytes | TieredError | None = None
              ) -> Iterator[tuple[Any, ...]]:
    """Stage 1: the segment's key map, packed, then its producer batches and transactional
    keys, tagged for the driver's shuffles, then one `SCANNED` row (bytes read, error or None,
    producer batches, transactional keys). The key map is the segment's own latest offset per
    key (superseded records of a segment never reach the shuffle), one
    `(KEY, pidx, bucket, row, digests, offsets)` row per bucket: the digests concatenated and
    the offsets as a native int64 array, so the shuffle moves a few large values instead of a
    tuple per key (a key's identity: `spark_jobs.record_columns.key_id`). A corrupt or missing
    object yields only its `SCANNED` row with the error: the partition is then left alone.
    `fetched`: the segment's bytes as `prefetched` got them (None: read them here)."""
    try:
        if isinstance(fetched, TieredError):
            raise fetched
        data = _fetch(store, task) if fetched is None else fetched
        keys = scan_keys(data, path=task.source.key, batches=_batches(task, data))
    except TieredError as exc:
        yield (SCANNED, task.pidx, task.row, 0, job_error(exc), 0, 0)
        return
    if task.job:  # for the cleaning pass, should it run on this machine (else it reads again)
        spill(task.spill_name("raw"), data)
    n = task.buckets
    if n == 1:
        if len(keys.offsets):
            yield (KEY, task.pidx, 0, task.row, keys.ids.tobytes(), keys.offsets.tobytes())
    else:
        of = bucket_of(keys.ids, n).astype(np.uint16)  # < MAX_BUCKETS: a radix sort
        order = np.argsort(of, kind="stable")
        cuts = np.searchsorted(of[order], np.arange(n + 1))
        ids, offsets = keys.ids[order], keys.offsets[order]
        for b in range(n):
            lo, hi = int(cuts[b]), int(cuts[b + 1])
            if hi > lo:
                yield (KEY, task.pidx, b, task.row, ids[lo:hi].tobytes(),
                       offsets[lo:hi].tobytes())
    for ev in keys.producers:
        yield (PRODUCER, task.pidx, ev.producer_id, ev)
    for last, digest, offset in keys.txn_keys:
        yield (TXN_KEY, task.pidx, last, digest, offset)
    yield (SCANNED, task.pidx, task.row, len(data), None, len(keys.producers),
           len(keys.txn_keys))


def reduce_bucket(
    pidx: int, bounds: Sequence[int], items: Iterable[tuple[Any, ...]]
) -> Iterator[tuple[tuple[int, int], bytes]]:
    """Stage 2, one bucket of one partition's key map: the latest offset of every key, sent to
    the segment that holds it as `((pidx, row), offsets)` (a native int64 array). `items` are
    the segments' packed rows `("k", row, digests, offsets)` and the committed transactional
    keys `("t", digest, offset)`; `bounds` the base offsets of the partition's cleanable
    segments. A key's latest record is its highest offset in any of them (one sort of the
    bucket's identities and offsets, `last_per_key`)."""
    packed: list[tuple[Any, ...]] = []
    txn: list[tuple[Any, ...]] = []
    for item in items:
        (packed if item[0] == "k" else txn).append(item)
    ids = [it[2] for it in packed] + [it[1] for it in txn]
    offsets = [it[3] for it in packed] + [np.int64(it[2]).tobytes() for it in txn]
    _ids, winners = last_per_key(  # in any order in, in offset order out
        np.frombuffer(b"".join(ids), np.uint8).reshape(-1, ID_BYTES),
        np.frombuffer(b"".join(offsets), np.int64))
    cuts = np.searchsorted(winners, np.asarray(bounds, np.int64))
    for row in range(len(bounds)):
        lo = int(cuts[row])
        hi = int(cuts[row + 1]) if row + 1 < len(bounds) else len(winners)
        if hi > lo:
            yield (pidx, row), winners[lo:hi].tobytes()


def latest_offsets(parts: Iterable[bytes]) -> np.ndarray:
    """The offsets `reduce_bucket` sent one segment, from all buckets, sorted (int64)."""
    return np.sort(np.frombuffer(b"".join(parts), np.int64))


class CleanOut(NamedTuple):
    """Stage 3's result for one segment: the counts, and the cleaned bytes, or where they were
    spilled on the executor that cleaned it (`data` is dropped before the counts go to the
    driver). With the verdicts it was cleaned by, so an upload that runs elsewhere cleans it
    again from the bucket (`cleaned_bytes`)."""

    task: SegTask
    data: bytes
    #: `empty_batch` of the segment's last batch: what stands for it if a group ends up empty
    empty: bytes
    stats: dict[str, int]
    changed: bool
    error: str | None = None
    #: `SegmentCleaning.live_markers`: whose aborted transactions keep their index entries
    live_markers: tuple[int, ...] = ()
    #: the cleaned bytes' spill file and CRC-32C (`data` is then empty), and with them the
    #: verdicts it was cleaned with (the sorted latest offsets as int64 bytes, the batch
    #: flags), the job's clock and the topic's delete.retention.ms: what cleaning it again
    #: takes (none of it when the bytes are carried)
    spilled: str | None = None
    crc: int = 0
    latest: bytes = b""
    flags: tuple[tuple[int, int], ...] = ()
    now_ms: int = 0
    delete_retention_ms: int | None = None


def clean_task(
    store: Callable[[], ObjectStore],
    task: SegTask,
    latest: np.ndarray,
    flags: Iterable[tuple[int, int]],
    *,
    now_ms: int,
    delete_retention_ms: int | None,
) -> CleanOut:
    """Stage 3: clean the segment (the scan's spill of it, or a second read) with the
    partition-wide verdicts for its records (`latest`: sorted offsets that are the latest of
    their key) and batches (`flags`). When the run spills, the cleaned bytes are left on this
    disk (a segment cleaning leaves as it was: the scan's spill of it), with what it takes to
    clean it again elsewhere. `store` gives the bucket's client, when the segment must be
    read from it."""
    flags = tuple(flags)
    raw: str | None = None
    try:
        data, raw = _source_bytes(store, task)
        res = _clean(data, task, latest, flags, now_ms, delete_retention_ms)
    except TieredError as exc:
        discard(raw)
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
    out = CleanOut(task, res.data, empty, stats, res.changed,
                   live_markers=tuple(res.live_markers))
    if not res.data:
        discard(raw)
        return out
    if raw is not None and not res.changed:
        path: str | None = raw  # the cleaned bytes are the segment's own, on this disk already
    else:
        discard(raw)
        path = spill(task.spill_name("clean"), res.data) if task.job else None
    if path is None:
        return out  # carried
    # what cleaning it again takes, should the upload run on another machine
    return out._replace(data=b"", spilled=path, crc=crc32c.crc32c(res.data),
                        latest=np.ascontiguousarray(latest, np.int64).tobytes(),
                        flags=flags, now_ms=now_ms, delete_retention_ms=delete_retention_ms)


def _clean(data: bytes, task: SegTask, latest: np.ndarray, flags: Iterable[tuple[int, int]],
           now_ms: int, delete_retention_ms: int | None) -> SegmentCleaning:
    # the bytes match the manifest's CRC-32C, as the ones the scan walked did, batch CRCs
    # and all; the upload checks every batch of what the cleaning writes
    return clean_segment(data, latest=latest, flags=dict(flags), now_ms=now_ms,
                         delete_retention_ms=delete_retention_ms, path=task.source.key,
                         batches=_batches(task, data, verify_crc=False))


def cleaned_bytes(store: ObjectStore, c: CleanOut) -> bytes:
    """A cleaned segment's bytes: carried, spilled on this machine, or cleaned again from the
    bucket with the same verdicts (which must give the same bytes: `CorruptSegmentError`
    if not, e.g. the object changed under its name)."""
    if c.spilled is None:
        return c.data
    size = c.stats["bytes_out"]
    data = unspill(c.spilled, size, c.crc)
    if data is not None:
        return data
    again = _clean(_fetch(store, c.task), c.task, np.frombuffer(c.latest, np.int64), c.flags,
                   c.now_ms, c.delete_retention_ms).data
    if len(again) != size or crc32c.crc32c(again) != c.crc:
        raise CorruptSegmentError("cleaned again for the upload, it does not give the bytes "
                                  "the cleaning pass counted", path=c.task.source.key)
    return again


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
        data = b"".join(cleaned_bytes(store, c) for c in outs)
        if not data:  # every record of the range went: one empty batch keeps its last offset
            data = outs[-1].empty
        headers = list(iter_batch_headers(data))  # every batch's CRC checked, once
        index, timeindex = indexes_of(headers, base_offset=run.base_offset,
                                      index_interval_bytes=run.index_interval_bytes)
        name, key = claim_name(store, run, data)
        uploaded.append(key)
        uploaded_at_ms = store_time_ms(store.head(key).last_modified)
        sent = len(data)
        extra = {"index": index, "timeindex": timeindex}
        live = {m for c in outs for m in c.live_markers}
        # no marker kept alive: no source entry survives (`live_txn_entries`), none is read
        txn = _txn_index(store, run, live) if live else b""
        if txn:
            extra["txnindex"] = txn
        for index_key, size in segment_indexes.write_indexes(store, run.data_prefix, name,
                                                             extra):
            uploaded.append(index_key)
            sent += size
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
        index_layout=segment_indexes.DEFAULT_LAYOUT,
    )
    return RunResult(run, meta, tuple(uploaded), 0, sent, uploaded_at_ms=uploaded_at_ms)


def _txn_index(store: ObjectStore, run: RunTask, live_markers: set[int]) -> bytes:
    """The group's `.txnindex`: the sources' entries rewritten as Kafka's cleaner does
    (`live_txn_entries`): an aborted transaction whose marker went, or whose records were
    all removed before this pass, loses its entry; the rest in marker order, each once."""
    entries = []
    for key, data in source_txn_indexes(store, run.data_prefix, run.sources):
        entries.extend(parse_txnindex(data, path=f"{key} (txnindex)"))
    return encode_txnindex(live_txn_entries(entries, live_markers))
