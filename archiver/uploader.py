"""One partition's upload round: plan, verify, upload the objects, then commit the manifest.

Order of effects (design invariant 1, 3, 5, 6):

1. `upload_policy.plan_uploads` picks the candidates (closed segments past the manifest, below
   the stable end, oldest first; the active segment's stable prefix on idle timeout);
2. each candidate is verified (every batch header walked with its CRC-32C, the object's
   checksum taken in the same pass) before its object may appear in the bucket: a corrupt
   segment stops the partition's round there, the candidates before it go on, the ones after
   it wait;
3. a closed segment's file starts going up as its verification starts, and the store holds
   the object back (multipart parts not yet completed, a temporary file) until it passed and
   its index objects are in, or drops it (`upload_early`); a byte range is read, checked,
   then put with its indexes. Uploads run in parallel across candidates, through the
   caller's executor and bandwidth limiter; the store's tenacity policy retries transient
   faults and a failed upload is never recorded;
4. only then the manifest is committed with If-Match. A lost race re-reads the head and adds
   the already uploaded objects to it when they still continue it exactly, otherwise the
   round ends and the next one re-plans (never an overwrite); a newer term fences the writer.

Objects uploaded by a round that then fails to commit are named by offsets and writer term,
so a retry in the same term writes the same key with the same bytes, and the garbage
collector (`archiver.retention`) deletes the ones no manifest ever names after the grace period.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import crc32c

from archiver.upload_limits import ConcurrencyLimit, TokenBucket
from archiver.upload_policy import (
    DECISION_LOG_LEVEL,
    ArchivalState,
    LogSnapshot,
    UploadCandidate,
    UploadDecision,
    UploadKind,
    UploadParams,
    plan_uploads,
)
from manifests import edits, keys, segment_indexes
from manifests.commit import ManifestStore
from manifests.errors import StaleTerm
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.index import NO_TIMESTAMP
from tiered.kafka.local_log import PartitionLog
from tiered.kafka.records import BatchHeader, iter_batch_headers
from tiered.kafka.segment import LogFile, RunningChecksum, Segment, build_indexes, indexes_of
from tiered.store.base import ObjectStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: bytes read at a time when checksumming a segment file
CHECKSUM_CHUNK_BYTES = 1 << 20
#: the suffixes of a segment's index files beside its `.log` in the log dir
INDEX_SUFFIXES = tuple(f".{kind}" for kind in segment_indexes.INDEX_KINDS)


class Submit(Protocol):
    """`ThreadPoolExecutor.submit`, narrowed to what the uploader needs."""

    def __call__(self, fn: Callable[[], T], /) -> Future[T]: ...


@dataclass(frozen=True)
class PartitionTarget:
    """Who is archiving what: the partition's log snapshot, its bucket revision, and the
    writer's term (fences older writers; part of every object key it writes)."""

    log: PartitionLog
    revision: str
    term: int

    @property
    def topic(self) -> str:
        return self.log.topic

    @property
    def partition(self) -> int:
        return self.log.partition


@dataclass
class ArchivalCursor:
    """The archiver's memory of one partition between rounds: the committed manifest and its
    ETag (None until loaded), and when the last upload finished (the idle timer)."""

    manifest: PartitionManifest | None
    etag: str | None
    last_upload_ms: int
    loaded: bool = False
    #: the reason the last round could not go on, logged once rather than every round
    last_problem: str | None = None


@dataclass
class UploadOutcome:
    """What one round did for one partition (the service turns it into a PartitionReport)."""

    decision: str
    uploaded_segments: int = 0
    uploaded_bytes: int = 0
    error: str | None = None
    commits: int = 0
    conflicts: int = 0
    upload_errors: int = 0
    fenced: bool = False
    committed_keys: list[str] = field(default_factory=list)
    #: the round created the head after a listing of the partition that held nothing the
    #: new head does not name (`CommitResult.unnamed`)
    listed_clean: bool = False


# -- verification and object bytes ------------------------------------------------------------


@dataclass(frozen=True)
class PreparedUpload:
    """A verified candidate, ready to go: the object's metadata and how to produce its bytes."""

    candidate: UploadCandidate
    meta: SegmentMeta
    #: the object: a closed `.log` file to stream (all of it, or `byte_range` of it), or the
    #: bytes of a range of the active segment
    body: Path | bytes
    #: index kind -> file to stream (closed segment with valid indexes) or bytes (rebuilt)
    indexes: dict[str, Path | bytes]
    byte_range: tuple[int, int] | None = None


def _file_crc(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(CHECKSUM_CHUNK_BYTES):
            crc = crc32c.crc32c(chunk, crc)
    return crc


def _timestamps(headers: Sequence[BatchHeader]) -> tuple[int, int]:
    base = headers[0].first_timestamp if headers else NO_TIMESTAMP
    top = max((h.max_timestamp for h in headers), default=NO_TIMESTAMP)
    base = max(base, NO_TIMESTAMP)
    return base, max(top, base)


def _meta(
    target: PartitionTarget, cand: UploadCandidate, size: int, crc: int, base_ts: int,
    max_ts: int, first_offset: int | None = None,
) -> SegmentMeta:
    """The manifest entry of a verified candidate. An object of a compacted topic whose
    first batch starts after its range (compaction's holes) is a compacted copy: readers and
    scrub then expect offsets without records (docs/compaction.md)."""
    epoch = target.log.epoch_for_offset(cand.begin_inclusive)
    return SegmentMeta(
        base_offset=cand.begin_inclusive,
        last_offset=cand.last_offset,
        base_timestamp=base_ts,
        max_timestamp=max(max_ts, base_ts),
        size_bytes=size,
        segment_term=max(0, epoch if epoch is not None else target.term),
        writer_term=target.term,
        checksum=crc,
        compacted=cand.holes and first_offset is not None and first_offset > cand.begin_inclusive,
        index_layout=segment_indexes.DEFAULT_LAYOUT,
    )


def prepare(target: PartitionTarget, cand: UploadCandidate, index_interval_bytes: int
            ) -> PreparedUpload:
    """Verify one candidate and work out its object. Raises CorruptSegmentError (file and
    byte position) when a batch fails its CRC or the offsets do not match the plan."""
    log_path = Path(cand.paths[0])
    seg = Segment.from_log_path(log_path, active=cand.kind is UploadKind.STABLE_PREFIX)
    if cand.kind is UploadKind.SEGMENT:
        indexes_ok = True
        try:
            summary = seg.verify(check_indexes=True)
        except CorruptSegmentError as err:
            if err.path == str(log_path):
                raise
            log.warning("%s: index unusable (%s); uploading rebuilt indexes", log_path, err)
            indexes_ok = False
            summary = seg.verify(check_indexes=False)
        if summary.last_offset != cand.last_offset:
            raise CorruptSegmentError(
                f"last offset {summary.last_offset} does not match the {cand.last_offset} "
                "planned from its index", path=str(log_path), position=summary.size)
        size = log_path.stat().st_size
        base_ts = NO_TIMESTAMP if summary.first_timestamp is None else summary.first_timestamp
        max_ts = NO_TIMESTAMP if summary.max_timestamp is None else summary.max_timestamp
        # the verification walk checksummed the file as it read it; a second read only when
        # it did not cover the file as it is now
        crc = (summary.checksum if summary.checksum is not None and summary.size == size
               else _file_crc(log_path))
        meta = _meta(target, cand, size, crc, max(base_ts, NO_TIMESTAMP), max_ts,
                     summary.first_offset)
        indexes: dict[str, Path | bytes] = {}
        if cand.begin_inclusive < seg.base_offset:
            # compaction's holes below the file: the object's range, and so its indexes'
            # relative offsets, start at the manifest's next offset
            offset_index, time_index = indexes_of(
                seg.iter_batch_headers(), base_offset=cand.begin_inclusive,
                index_interval_bytes=index_interval_bytes, path=str(log_path))
            indexes = {"index": offset_index, "timeindex": time_index}
        elif indexes_ok and seg.index_path.exists() and seg.timeindex_path.exists():
            indexes = {"index": seg.index_path, "timeindex": seg.timeindex_path}
        else:
            offset_index, time_index = seg.rebuild_indexes(
                index_interval_bytes=index_interval_bytes)
            indexes = {"index": offset_index, "timeindex": time_index}
        if seg.txnindex_path.exists() and seg.txnindex_path.stat().st_size > 0:
            indexes["txnindex"] = seg.txnindex_path
        return PreparedUpload(cand, meta, log_path, indexes)

    # a byte range: the suffix of a closed segment, or the stable prefix of the active one
    begin = cand.byte_begin_inclusive
    if begin is None:
        header = seg.find_offset(cand.begin_inclusive)
        # a compacted log may have lost the batch at the manifest's end: the next one follows
        if header is None or header.base_offset < cand.begin_inclusive or (
                header.base_offset > cand.begin_inclusive and not cand.holes):
            raise CorruptSegmentError(
                f"no batch starts at offset {cand.begin_inclusive}, where the manifest ends",
                path=str(log_path))
        begin = header.position
    if cand.kind is UploadKind.SEGMENT_SUFFIX:
        return _prepare_suffix(target, cand, log_path, begin, index_interval_bytes)
    with LogFile(log_path, active=False) as f:
        data = f.read(begin, cand.byte_end_exclusive - begin)
    if len(data) != cand.byte_end_exclusive - begin:
        raise CorruptSegmentError("file is shorter than the planned range", path=str(log_path),
                                  position=begin + len(data))
    try:
        headers = list(iter_batch_headers(data, path=str(log_path)))
    except CorruptSegmentError as err:
        raise err.at(path=str(log_path), base_position=begin) from None
    _check_holds(headers, cand, log_path, begin, cand.byte_end_exclusive)
    base_ts, max_ts = _timestamps(headers)
    meta = _meta(target, cand, len(data), crc32c.crc32c(data), base_ts, max_ts,
                 headers[0].base_offset)
    offset_index, time_index = build_indexes(
        data, base_offset=cand.begin_inclusive, index_interval_bytes=index_interval_bytes,
        path=str(log_path))
    return PreparedUpload(cand, meta, data, {"index": offset_index, "timeindex": time_index})


def _check_holds(headers: Sequence[BatchHeader], cand: UploadCandidate, log_path: Path,
                 begin: int, end: int) -> None:
    """The batches read from bytes `[begin, end)` must be exactly the planned offsets."""
    first = headers[0].base_offset if headers else -1
    starts = first >= cand.begin_inclusive if cand.holes else first == cand.begin_inclusive
    if not headers or not starts or headers[-1].last_offset != cand.last_offset:
        raise CorruptSegmentError(
            f"bytes {begin}..{end} do not hold offsets {cand.begin_inclusive}.."
            f"{cand.last_offset}", path=str(log_path), position=begin)


def _prepare_suffix(target: PartitionTarget, cand: UploadCandidate, log_path: Path,
                    begin: int, index_interval_bytes: int) -> PreparedUpload:
    """The rest of a closed segment from the batch at byte `begin` (where another writer's
    upload of the partition ended, inside this replica's segment): every batch walked with
    its CRC and the range's checksum taken on the way, indexes rebuilt for the slice, and
    the bytes left in the file to be streamed (a suffix can be most of a 1 GiB segment)."""
    crc = RunningChecksum(begin)
    with LogFile(log_path, active=False) as f:
        end = f.size
        headers = [h._replace(position=h.position - begin)
                   for h in f.headers(begin, checksum=crc)]
    if end != cand.byte_end_exclusive or crc.end != end:
        raise CorruptSegmentError(f"changed size to {end} bytes since it was planned",
                                  path=str(log_path), position=begin)
    _check_holds(headers, cand, log_path, begin, end)
    base_ts, max_ts = _timestamps(headers)
    meta = _meta(target, cand, end - begin, crc.value, base_ts, max_ts, headers[0].base_offset)
    offset_index, time_index = indexes_of(
        headers, base_offset=cand.begin_inclusive, index_interval_bytes=index_interval_bytes,
        path=str(log_path))
    return PreparedUpload(cand, meta, log_path, {"index": offset_index, "timeindex": time_index},
                          byte_range=(begin, end))


@dataclass(frozen=True)
class UploadGate:
    """What every upload passes through: the budget's bandwidth and its concurrency, both
    shared by all partitions and adjusted by the controller while uploads run."""

    limiter: TokenBucket
    slots: ConcurrencyLimit


def upload(store: ObjectStore, m: PartitionManifest, prep: PreparedUpload,
           gate: UploadGate) -> int:
    """Put the index objects, then the segment object, within one concurrency slot; returns
    the bytes sent. Raises the store's error after its retries are spent: the caller then
    records nothing."""
    with gate.slots.hold():
        # indexes first: a segment object in the bucket always has its indexes beside it
        sent = put_indexes(store, m, prep, gate.limiter)
        return sent + _put(store, m.segment_key(prep.meta), prep.body, gate.limiter,
                           prep.byte_range)


def upload_early(store: ObjectStore, m: PartitionManifest, key: str, cand: UploadCandidate,
                 verdict: Future[PreparedUpload], gate: UploadGate) -> int:
    """Send a closed segment file while it is still being verified, within one concurrency
    slot; returns the bytes of it and its indexes. The store holds the object back (multipart
    parts not yet completed, a temporary file) until `verdict` resolves: then the index
    objects go up, from this slot (on S3 while the parts are still going up), and only then
    the segment object completes. When `verdict` raises (corrupt, unreadable) the object is
    dropped and its parts not yet started are never sent. So a corrupt segment never appears in
    the bucket, every segment object has its indexes beside it, and a sound segment does not
    wait for its own verification before its first byte goes out. The bandwidth for the
    index files is taken here with the segment's, in one acquire: index PUTs must not queue
    behind the debt this segment just ran up."""
    path = Path(cand.paths[0])
    size = path.stat().st_size
    # as `prepare` bundles them: the offset and time index always, a transaction index
    # when it has entries
    index, timeindex, txnindex = (_size_or_zero(path.with_suffix(ext)) for ext in INDEX_SUFFIXES)
    indexes = segment_indexes.bundle_size([index, timeindex] + ([txnindex] if txnindex else []))
    sent: list[int] = []

    def ready() -> None:
        sent.append(put_indexes(store, m, verdict.result(), None))

    with gate.slots.hold():
        gate.limiter.acquire(size + indexes)
        store.put_file(key, path, ready=ready)
    return size + sum(sent)


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def put_indexes(store: ObjectStore, m: PartitionManifest, prep: PreparedUpload,
                limiter: TokenBucket | None) -> int:
    """Put a verified candidate's indexes, in the layout its manifest entry records (one
    bundle object: `manifests.segment_indexes`); returns their bytes. `limiter` None: their
    bandwidth was taken already (see `upload_early`). Index files are a small fraction of a
    segment (Kafka caps them at `segment.index.bytes`), so they are read whole."""
    sections = {kind: source.read_bytes() if isinstance(source, Path) else source
                for kind, source in prep.indexes.items()}
    if limiter is not None:
        limiter.acquire(segment_indexes.bundle_size(map(len, sections.values())))
    written = segment_indexes.write_indexes(store, m.data_prefix, prep.meta.object_name,
                                            sections, prep.meta.index_layout)
    return sum(size for _, size in written)


def _put(store: ObjectStore, key: str, source: Path | bytes, limiter: TokenBucket | None,
         byte_range: tuple[int, int] | None = None) -> int:
    if byte_range is not None:
        size = byte_range[1] - byte_range[0]
    else:
        size = source.stat().st_size if isinstance(source, Path) else len(source)
    if limiter is not None:
        limiter.acquire(size)
    if isinstance(source, Path):
        store.put_file(key, source, byte_range=byte_range)
    else:
        store.put(key, source)
    return size


def segment_key(m: PartitionManifest, cand: UploadCandidate, term: int) -> str:
    """The key a whole-segment candidate's object gets, known before it is verified: segment
    objects are named by their offsets and the writer's term alone."""
    return keys.object_key(m.topic, m.partition, m.revision,
                           keys.segment_name(cand.begin_inclusive, cand.last_offset, term))


# -- the round ----------------------------------------------------------------------------------


def head(cursor: ArchivalCursor, mstore: ManifestStore, target: PartitionTarget
         ) -> PartitionManifest:
    """The committed head manifest the cursor holds, read from the bucket when it holds none
    (first use, or after a fault made it doubt what it knew)."""
    if not cursor.loaded or cursor.manifest is None:
        cursor.manifest, cursor.etag = mstore.load(target.topic, target.partition,
                                                   target.revision)
        cursor.loaded = True
    return cursor.manifest


def _active_batches(target: PartitionTarget) -> list[BatchHeader]:
    active = target.log.active_segment
    if active is None:
        return []
    with LogFile(active.log_path, active=True) as f:
        return list(f.headers())


def archive_partition(
    target: PartitionTarget,
    mstore: ManifestStore,
    cursor: ArchivalCursor,
    snapshot: LogSnapshot,
    params: UploadParams,
    now_ms: int,
    *,
    submit: Submit,
    gate: UploadGate,
    index_interval_bytes: int,
    compacted: bool = False,
) -> UploadOutcome:
    """One upload round for one partition; updates `cursor` with what it committed. Raises
    only for programming errors: every partition fault comes back as an `UploadOutcome`."""
    out = UploadOutcome("up_to_date")
    try:
        m = edits.with_term(head(cursor, mstore, target), target.term)
        _run(target, mstore, cursor, m, snapshot, params, now_ms, submit, gate,
             index_interval_bytes, out, compacted)
    except StaleTerm as err:
        out.decision, out.error, out.fenced = "fenced", str(err), True
        cursor.loaded = False
    except CorruptSegmentError as err:
        out.decision, out.error = "corrupt_segment", str(err)
    except (TieredError, OSError) as err:
        out.decision, out.error = "error", f"{type(err).__name__}: {err}"
    if out.error:
        # a gap, an overlap, a vanished file, a lost race: another writer may have moved the
        # head, so the next decision starts from the bucket, never from this copy
        cursor.loaded = False
    problem = f"{out.decision} ({out.error})" if out.error else None
    repeated = problem is not None and problem == cursor.last_problem
    level = logging.WARNING if problem and not repeated else logging.DEBUG
    log.log(level, "%s/%d: %s%s", target.topic, target.partition, out.decision,
            f" ({out.error})" if out.error else "")
    if cursor.last_problem is not None and problem is None:
        log.info("%s/%d: going on again (%s)", target.topic, target.partition, out.decision)
    cursor.last_problem = problem
    return out


def _run(
    target: PartitionTarget, mstore: ManifestStore, cursor: ArchivalCursor,
    m: PartitionManifest, snapshot: LogSnapshot, params: UploadParams, now_ms: int,
    submit: Submit, gate: UploadGate, index_interval_bytes: int, out: UploadOutcome,
    compacted: bool = False,
) -> None:
    start = target.log.log_start_offset
    holes = compacted and start is not None and m.last_offset >= 0 and start <= m.last_offset + 1
    state = ArchivalState(None if m.last_offset < 0 else m.last_offset, cursor.last_upload_ms,
                          compaction_holes=holes)
    plan = plan_uploads(snapshot, state, params, now_ms)
    if plan.decision is UploadDecision.NEEDS_ACTIVE_BATCHES:
        plan = plan_uploads(snapshot, state, params, now_ms, _active_batches(target))
    if plan.decision not in (UploadDecision.GAP, UploadDecision.OVERLAP,
                             UploadDecision.MANIFEST_AHEAD):  # those are logged as problems
        log.log(DECISION_LOG_LEVEL[plan.decision], "%s/%d: %s: %s", target.topic,
                target.partition, plan.decision.value, plan.detail)
    if plan.decision is not UploadDecision.UPLOAD:
        out.decision = plan.decision.value
        if plan.decision in (UploadDecision.GAP, UploadDecision.OVERLAP,
                             UploadDecision.MANIFEST_AHEAD):
            out.error = plan.detail
        return

    prepared: list[PreparedUpload] = []
    futures: list[Future[int]] = []
    refused: list[Future[int]] = []  # early uploads told to drop their object
    corrupt: CorruptSegmentError | None = None
    unreadable: OSError | TieredError | None = None
    for cand in plan.candidates:
        verdict: Future[PreparedUpload] | None = None
        if cand.kind is UploadKind.SEGMENT:
            # a closed segment starts going up now; its object appears only once it passed
            # the verification below and its indexes are in (see upload_early)
            verdict = Future()
            key = segment_key(m, cand, target.term)
            early = submit(functools.partial(upload_early, mstore.store, m, key, cand, verdict,
                                             gate))
        try:
            prep = prepare(target, cand, index_interval_bytes)
            if verdict is not None and m.segment_key(prep.meta) != key:
                raise TieredError(f"{cand.paths[0]}: verified as another object than {key}")
        except BaseException as err:
            if verdict is not None:  # never leave an early upload waiting
                verdict.set_exception(err)
                refused.append(early)
            if isinstance(err, CorruptSegmentError):
                corrupt = err  # this one is refused, the later ones wait behind it
            elif isinstance(err, (OSError, TieredError)):  # e.g. the broker deleted it: the
                unreadable = err  # ones before it still count
            else:
                raise
            break
        if verdict is not None:
            verdict.set_result(prep)
            fut = early
        else:  # a byte range: its bytes were read and checked in prepare
            fut = submit(functools.partial(upload, mstore.store, m, prep, gate))
        prepared.append(prep)
        futures.append(fut)
    try:
        _finish(target, mstore, cursor, m, prepared, futures, now_ms, out)
    finally:
        for fut in refused:  # their objects are being dropped; the reason is known already
            fut.exception()
    if corrupt is not None:
        out.decision, out.error = "corrupt_segment", str(corrupt)
    elif out.error is None and unreadable is not None:
        out.decision, out.error = "error", f"{type(unreadable).__name__}: {unreadable}"


def _finish(target: PartitionTarget, mstore: ManifestStore, cursor: ArchivalCursor,
            m: PartitionManifest, prepared: list[PreparedUpload], futures: list[Future[int]],
            now_ms: int, out: UploadOutcome) -> None:
    """Wait for the candidates' uploads and commit the contiguous run of them that went up."""
    done: list[SegmentMeta] = []
    sent: dict[str, int] = {}  # object name -> bytes of it and its indexes
    failure: BaseException | None = None
    for prep, fut in zip(prepared, futures, strict=True):
        try:
            sent[prep.meta.object_name] = fut.result()
        except (TieredError, OSError) as err:
            failure = failure or err
            out.upload_errors += 1
            continue
        if failure is None:  # only a contiguous run from the manifest's end is recordable
            done.append(prep.meta)
    if done:
        committed = _commit(target, mstore, cursor, m, done, out)
        cursor.last_upload_ms = now_ms
        out.uploaded_segments = len(committed)
        out.uploaded_bytes = sum(sent[s.object_name] for s in committed)
        out.decision = "uploaded"
    if failure is not None:
        out.decision, out.error = "error", f"upload failed: {failure}"


def _commit(target: PartitionTarget, mstore: ManifestStore, cursor: ArchivalCursor,
            m: PartitionManifest, metas: list[SegmentMeta], out: UploadOutcome
            ) -> list[SegmentMeta]:
    """Add `metas` to the head by compare-and-swap (`ManifestStore.update`). On a lost race
    continue from the fresh head when the uploaded objects still continue it exactly (those
    the other writer committed already are dropped); otherwise give up the round."""
    where = f"{target.topic}/{target.partition}"
    committed: list[SegmentMeta] = []

    def add(fresh: PartitionManifest) -> PartitionManifest:
        if fresh is not m:
            out.conflicts += 1  # a re-read after a lost race
        fresh = edits.with_term(fresh, target.term)
        rest = [s for s in metas if s.base_offset >= fresh.next_offset]
        empty = fresh.last_offset == -1 and not fresh.segments and not fresh.archives
        if not rest or (rest[0].base_offset != fresh.next_offset and not empty):
            raise TieredError(f"{where}: another writer changed the manifest; its uploads no "
                              "longer continue it and will be re-planned")
        committed[:] = rest
        return edits.add_segments(fresh, rest)

    try:
        done = mstore.update(target.topic, target.partition, target.revision, add,
                             start=(m, cursor.etag))
    finally:
        cursor.loaded = False  # whatever happened, the next round starts from the bucket
    cursor.manifest, cursor.etag, cursor.loaded = done.manifest, done.etag, True
    out.commits += 1
    out.listed_clean = done.unnamed == 0
    out.committed_keys = [done.manifest.segment_key(s) for s in committed]
    return committed
