"""The executor side of adjacent-segment merging: one run in, one merged object out.

Everything here runs inside Spark's Python workers (or in-process for the single-process
baseline) and sees only picklable task values and an `ObjectStore` built on the executor.
The driver side (planning, commits, the job) is `spark_jobs.merge`.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass, field
from typing import NamedTuple

import crc32c

from manifests import keys, segment_indexes
from manifests.collect import store_time_ms
from manifests.model import INDEX_FILES, SegmentMeta
from spark_jobs.job_context import PartitionRef, job_error
from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.index import NO_TIMESTAMP
from tiered.kafka.records import iter_batch_headers
from tiered.kafka.segment import build_indexes
from tiered.store.base import ObjectStore
from tiered.store.errors import PreconditionFailed

#: generations tried for a merged object's name before the run is given up
NAME_ATTEMPTS = 16
#: random generations per manifest sequence number: garbage collection deletes by key, so a
#: collected replacement's name must never be created again (docs/format.md)
GENERATION_SPREAD = 10**9


def fresh_generation(sequence: int) -> int:
    """A generation for a replacement planned on manifest version `sequence`: ordered by
    version (recovery prefers newer ones), random within it."""
    return (sequence + 1) * GENERATION_SPREAD + secrets.randbelow(GENERATION_SPREAD)


class MergeNameTaken(TieredError):
    """Every name tried for a merged object already exists (leftovers of many failed
    attempts): the run is skipped this time; garbage collection removes the leftovers."""


class SourceSegment(NamedTuple):
    """One segment of a run, as the manifest lists it."""

    key: str
    name: str
    base_offset: int
    last_offset: int
    size_bytes: int
    #: CRC-32C of the whole object
    checksum: int
    #: how its indexes travel beside it (`SegmentMeta.index_layout`)
    index_layout: int = INDEX_FILES


class RunTask(NamedTuple):
    """One run to merge: everything an executor needs, picklable."""

    part: PartitionRef
    run_id: int
    base_offset: int
    last_offset: int
    segment_term: int
    #: the manifest's term: the merged object's writer term (<= any later manifest's)
    writer_term: int
    #: first generation to try in the merged object's name: the manifest's sequence + 1
    #: times `GENERATION_SPREAD` plus a random part, so a name, once deleted, never returns
    generation: int
    index_interval_bytes: int
    sources: tuple[SourceSegment, ...]

    @property
    def data_prefix(self) -> str:
        return keys.partition_data_prefix(self.part.topic, self.part.partition,
                                          self.part.revision)


@dataclass(frozen=True)
class RunResult:
    """What an executor did with one run: the merged segment's metadata (None on failure) and
    the keys it uploaded (segment first)."""

    task: RunTask
    meta: SegmentMeta | None
    uploaded_keys: tuple[str, ...] = ()
    bytes_read: int = 0
    bytes_uploaded: int = 0
    error: str | None = None
    #: the merged object's last-modified time on the store's clock (`store_time_ms`)
    uploaded_at_ms: int | None = None


@dataclass
class _Scan:
    """What reading a run's sources found."""

    blobs: list[bytes] = field(default_factory=list)
    base_timestamp: int | None = None
    max_timestamp: int = NO_TIMESTAMP
    transactional: bool = False


def fetch_source(store: ObjectStore, src: SourceSegment) -> bytes:
    """One source segment's bytes, checked against the manifest's size and CRC-32C (the jobs
    rewrite only what the manifest vouches for). Refuses with `CorruptSegmentError`."""
    data = store.get(src.key)
    if len(data) != src.size_bytes:
        raise CorruptSegmentError(
            f"object is {len(data)} bytes, the manifest says {src.size_bytes}", path=src.key)
    crc = crc32c.crc32c(data)
    if crc != src.checksum:
        raise CorruptSegmentError(
            f"CRC-32C {crc:08x} does not match the manifest's {src.checksum:08x}", path=src.key)
    return data


def _read_source(store: ObjectStore, src: SourceSegment, scan: _Scan) -> int:
    """Download one source, check it against the manifest (size, CRC-32C, first and last
    offsets) and every batch's CRC; returns its size. Refuses with `CorruptSegmentError`."""
    data = fetch_source(store, src)
    first = last = None
    for h in iter_batch_headers(data, path=src.key):
        if first is None:
            first = h
        last = h
        scan.max_timestamp = max(scan.max_timestamp, h.max_timestamp)
        scan.transactional = scan.transactional or h.is_transactional
    if first is None or last is None:
        raise CorruptSegmentError("holds no record batch", path=src.key)
    if first.base_offset != src.base_offset or last.last_offset != src.last_offset:
        raise CorruptSegmentError(
            f"holds offsets {first.base_offset}..{last.last_offset}, the manifest says "
            f"{src.base_offset}..{src.last_offset}", path=src.key)
    if scan.base_timestamp is None:
        scan.base_timestamp = max(first.first_timestamp, NO_TIMESTAMP)
    scan.blobs.append(data)
    return len(data)


def source_txn_indexes(store: ObjectStore, data_prefix: str,
                       sources: tuple[SourceSegment, ...]) -> list[tuple[str, bytes]]:
    """(the source's key, its transaction index bytes), for the sources that have one."""
    found = ((src.key, segment_indexes.read_indexes(store, data_prefix, src.name,
                                                    src.index_layout, ("txnindex",),
                                                    segment_bytes=src.size_bytes)["txnindex"])
             for src in sources)
    return [(key, data) for key, data in found if data]


def _txn_index(store: ObjectStore, task: RunTask) -> bytes:
    """The sources' transaction indexes concatenated (entries hold absolute offsets, so they
    stay valid), or b"" when none has one."""
    return b"".join(data for _, data in source_txn_indexes(store, task.data_prefix,
                                                            task.sources))


def _claim_name(store: ObjectStore, task: RunTask, data: bytes) -> tuple[str, str]:
    """Upload the merged bytes under the first free generation; (name, key). If-None-Match
    makes the name the merge's alone: it never replaces any object, referenced or not."""
    for gen in range(task.generation, task.generation + NAME_ATTEMPTS):
        name = keys.segment_name(task.base_offset, task.last_offset, task.writer_term,
                                 generation=gen)
        key = task.data_prefix + name
        try:
            store.put(key, data, if_none_match=True)
        except PreconditionFailed:
            continue
        return name, key
    raise MergeNameTaken(
        f"{task.data_prefix}: no free name for merged offsets {task.base_offset}.."
        f"{task.last_offset} in {NAME_ATTEMPTS} generations from {task.generation}")


#: the name claim compaction's uploads share (`spark_jobs.compact_exec`)
claim_name = _claim_name


def merge_run(store: ObjectStore, task: RunTask) -> RunResult:
    """Executor side: merge one run and upload it with its indexes. Failures (corrupt source,
    store fault) come back in the result rather than failing the Spark task, so one bad run
    does not stop the others; nothing corrupt is ever uploaded (design invariant 5)."""
    scan = _Scan()
    read = 0
    uploaded: list[str] = []
    try:
        for src in task.sources:
            read += _read_source(store, src, scan)
        data = b"".join(scan.blobs)
        scan.blobs.clear()
        index, timeindex = build_indexes(data, base_offset=task.base_offset,
                                         index_interval_bytes=task.index_interval_bytes)
        extra = {"index": index, "timeindex": timeindex}
        if scan.transactional and (txn := _txn_index(store, task)):
            extra["txnindex"] = txn
        name, key = _claim_name(store, task, data)
        uploaded.append(key)
        # the store's own clock: the commit may name the object only if it is younger than
        # the garbage-collection cutoff of the head it commits onto
        uploaded_at_ms = store_time_ms(store.head(key).last_modified)
        sent = len(data)
        for index_key, size in segment_indexes.write_indexes(store, task.data_prefix, name,
                                                             extra):
            uploaded.append(index_key)
            sent += size
    except TieredError as exc:
        if uploaded:  # never named by a manifest: remove what this attempt left (or GC will)
            with contextlib.suppress(TieredError):
                store.delete_many(uploaded)
        return RunResult(task, None, (), read, 0, job_error(exc))
    base_ts = scan.base_timestamp if scan.base_timestamp is not None else NO_TIMESTAMP
    meta = SegmentMeta(
        base_offset=task.base_offset,
        last_offset=task.last_offset,
        base_timestamp=base_ts,
        max_timestamp=max(scan.max_timestamp, base_ts),
        size_bytes=len(data),
        segment_term=task.segment_term,
        writer_term=task.writer_term,
        checksum=crc32c.crc32c(data),
        name=name,
        index_layout=segment_indexes.DEFAULT_LAYOUT,
    )
    return RunResult(task, meta, tuple(uploaded), read, sent, uploaded_at_ms=uploaded_at_ms)
