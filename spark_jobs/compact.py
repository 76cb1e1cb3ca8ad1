"""Compaction of compacted topics' history in the bucket, on Spark (`tiered compact`, or
`spark-submit spark_jobs/submit.py compact`); docs/compaction.md.

The driver loads each partition's head manifest and decides whether it is due
(`compact_plan.plan_compaction`). For the due partitions, all at once:

1. executors read every cleanable segment object, walk its records once and emit the
   segment's latest offset per key MD5, packed per key bucket, and per batch with a producer
   id a producer event (`scan_task`), as the pairs of one shuffle the scan writes itself; the
   segment is left on the executor's disk for step 3 (`executor_spill`). The driver reads
   back one partition of that shuffle, the segments' summary rows (`SIDE`);
2. the key map reads the rest: per (partition, bucket) the latest offset of each key, sent
   to the segment holding it (`reduce_bucket`), and per (partition, producer id) the batch
   verdicts (`transaction_flags`). Keys of transactional batches count only once their
   transaction committed: then the verdicts come first and those keys join them on their
   batch (`_verdicts_with_transactions`). No key map is ever held whole by the driver or by
   one executor: each segment receives the offsets of the records it keeps;
3. executors clean every segment (`tiered.kafka.compaction`), from the scan's copy on their
   disk or the bucket, and leave the cleaned bytes on their disk; only sizes and counts come
   back to the driver, which groups adjacent cleaned segments up to the segment size target
   (`compact_plan.group_outputs`);
4. executors concatenate each group, rebuild its indexes and upload it under a fresh
   generation name with `compacted = 1`;
5. the driver commits each partition through the merge job's compare-and-swap loop
   (`merge.commit_partition`): a group is committed only if the head still lists exactly the
   objects it was made from, replaced objects go to `replaced` for garbage collection after
   the grace period, the collection cutoff refuses objects GC may already have condemned,
   and groups that no longer apply are deleted at once (design invariants 1, 6, 7).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from manifests import ManifestStore, PartitionManifest, TopicManifest
from spark_jobs.compact_exec import (
    KEY,
    PRODUCER,
    SCANNED,
    TXN_KEY,
    CleanOut,
    GroupTask,
    SegTask,
    clean_task,
    latest_offsets,
    prefetched,
    reduce_bucket,
    scan_task,
    upload_group,
)
from spark_jobs.compact_plan import (
    Cleaned,
    CompactionPlan,
    CompactionSettings,
    group_outputs,
    plan_compaction,
)
from spark_jobs.executor_spill import discard_run, new_job_tag
from spark_jobs.job_context import (
    JobContext,
    PartitionRef,
    Progress,
    balanced_slices,
    job_error,
    slices_for,
)
from spark_jobs.merge import PartitionState, _delete_unreferenced, _Planned, commit_partition
from spark_jobs.merge_exec import RunResult, RunTask, SourceSegment, fresh_generation
from spark_jobs.merge_plan import MergeLimits, is_compacted_topic, merge_limits
from spark_jobs.record_columns import key_bucket
from tiered.config import Config, TopicConfig
from tiered.errors import TieredError
from tiered.kafka.compaction import ABORTED, IN_DOUBT, transaction_flags
from tiered.store import open_store
from tiered.store.base import ObjectStore

if TYPE_CHECKING:
    from pyspark import RDD, Accumulator

log = logging.getLogger("tiered.spark.compact")


def compaction_settings(config: Config, tc: TopicConfig, tm: TopicManifest | None
                        ) -> CompactionSettings:
    """A topic's compaction settings; compacted copies grow up to the merge target."""
    limits = merge_limits(config.cluster, tc, tm)
    return CompactionSettings(
        delete_retention_ms=tc.delete_retention_ms,
        min_compaction_lag_ms=tc.min_compaction_lag_ms,
        max_compaction_lag_ms=tc.max_compaction_lag_ms,
        min_cleanable_dirty_ratio=float(tc.min_cleanable_dirty_ratio),
        target_bytes=limits.target_bytes,
    )


@dataclass
class PartitionJob:
    """One partition's progress through a compaction (driver side)."""

    pidx: int
    part: PartitionRef
    settings: CompactionSettings
    index_interval_bytes: int
    manifest: PartitionManifest | None = None
    etag: str | None = None
    plan: CompactionPlan | None = None
    bounds: list[int] = field(default_factory=list)
    tasks: list[SegTask] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    groups: int = 0
    groups_committed: int = 0
    segments_replaced: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    bytes_uploaded: int = 0
    conflicts: int = 0
    #: groups whose sources another writer changed first: deleted, not committed
    stale_groups: int = 0
    skip_reason: str | None = None
    errors: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "topic": self.part.topic,
            "partition": self.part.partition,
            "revision": self.part.revision,
            "dirty_ratio": round(plan.dirty_ratio, 4) if plan is not None else None,
            "due": plan.verdict.value if plan is not None else None,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "records_in": self.stats.get("records_in", 0),
            "records_dropped": self.stats.get("records_in", 0)
            - self.stats.get("records_kept", 0),
            "tombstones_dropped": self.stats.get("tombstones_dropped", 0),
            "keyless_records_kept": self.stats.get("keyless_kept", 0),
            "delete_horizons_set": self.stats.get("horizons_set", 0),
            "objects_written": self.groups_committed,
            "segments_replaced": self.segments_replaced,
            "bytes_uploaded": self.bytes_uploaded,
            "conflicts": self.conflicts,
            "stale_groups": self.stale_groups,
            "errors": list(self.errors),
        }


# -- planning (driver) -------------------------------------------------------------------------


def _plan(mstore: ManifestStore, job: PartitionJob, now_ms: int) -> None:
    part = job.part
    m, etag = mstore.load(part.topic, part.partition, part.revision)
    job.manifest, job.etag = m, etag
    job.bytes_before = job.bytes_after = m.segments.total("size_bytes")
    if etag is None:
        job.skip_reason = "no manifest in the bucket yet"
        return
    plan = plan_compaction(m.segments, job.settings, now_ms=now_ms)
    job.plan = plan
    if not plan.due:
        reason = plan.verdict.value
        if plan.cleanable_bytes:
            reason += (f" (dirty ratio {plan.dirty_ratio:.3f}, min.cleanable.dirty.ratio "
                       f"{job.settings.min_cleanable_dirty_ratio})")
        job.skip_reason = reason
        return
    segs = m.segments
    job.bounds = list(segs.base_offsets[: plan.cleanable])
    for i, seg in enumerate(segs.rows(0)):
        if i >= plan.cleanable:
            break
        job.tasks.append(SegTask(
            job.pidx, part, i,
            SourceSegment(m.segment_key(seg), seg.object_name, seg.base_offset,
                          seg.last_offset, seg.size_bytes, seg.checksum, seg.index_layout),
            seg.segment_term, seg.compacted, seg.base_timestamp, seg.max_timestamp,
        ))


#: segment bytes whose keys one task of the key map reduces, at most (keys are spread over
#: buckets by digest, so a bucket holds about its share of the partition's distinct keys)
BUCKET_INPUT_BYTES = 64 * 1024 * 1024
#: most buckets one partition's key map is cut into (the digest's first 4 bytes pick one)
MAX_BUCKETS = 1 << 16


def key_buckets(cleanable_bytes: int, segments: int, parallelism: int) -> int:
    """How many buckets a partition's key map is reduced in: one per `BUCKET_INPUT_BYTES` of
    input, and at least one per core while there are segments enough to feed them; beyond
    that a multiple of the cores, so that the last round of the key map keeps them all busy
    (`_route` spreads a partition's buckets over the shuffle's partitions in turn)."""
    by_bytes = -(-cleanable_bytes // BUCKET_INPUT_BYTES)
    n = max(1, by_bytes, min(parallelism, segments))
    if n > parallelism > 0:
        n = -(-n // parallelism) * parallelism
    return min(MAX_BUCKETS, n)


def _segment_of(bounds: dict[int, list[int]], pidx: int, offset: int) -> int:
    """Row index of the segment holding `offset` in partition `pidx`'s cleanable segments."""
    return bisect.bisect_right(bounds[pidx], offset) - 1


# -- the Spark pipeline ------------------------------------------------------------------------


#: the store of each settings in this executor process: building a boto3 client loads its
#: service models (a few hundred ms), and Spark's Python workers are reused from task to task
#: and stage to stage, so the job pays for it once per worker rather than once per task
_STORES: dict[bytes, ObjectStore] = {}
_STORES_LOCK = threading.Lock()


def _executor_store(settings: Any) -> ObjectStore:
    key = pickle.dumps(settings)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = open_store(settings, probe=False)
        return store


#: the scan's shuffle keys are `(kind, pidx, x)`, kinds as ints (a string in a shuffle key
#: would need every worker's hash seed pinned): a segment's `SCANNED` row (x: its row), a
#: bucket of the key map (x: the bucket), a producer's batches (x: the producer id), the
#: keys of one transactional batch (x: its last offset)
_SCANNED, _KEYS, _PRODUCER, _TXN_KEYS = 0, 1, 2, 3
#: the shuffle partition the `SCANNED` rows, and only they, go to: what the driver reads of
#: the scan before planning the rest is that one small partition
SIDE = 0


def _scan_pairs(settings: Any, acc: Accumulator[int], items: Iterable[list[SegTask]]
                ) -> Iterator[tuple[tuple[int, int, int], Any]]:
    """Stage 1 as shuffle pairs: `scan_task`'s events keyed for the key map, so the scan
    writes the shuffle itself rather than its events being kept and read again."""
    store = _executor_store(settings)
    for tasks in items:  # one list of tasks per partition (`balanced_slices`)
        for task, fetched in prefetched(store, tasks):
            yield from _pairs(task, scan_task(store, task, fetched), acc)


def _pairs(task: SegTask, events: Iterable[tuple[Any, ...]], acc: Accumulator[int]
           ) -> Iterator[tuple[tuple[int, int, int], Any]]:
    """One segment's scan events as shuffle pairs; its bytes read counted in `acc`."""
    for ev in events:
        tag = ev[0]
        if tag == KEY:
            yield (_KEYS, ev[1], ev[2]), ev[3:]
        elif tag == PRODUCER:
            yield (_PRODUCER, ev[1], ev[2]), ev[3]
        elif tag == TXN_KEY:
            yield (_TXN_KEYS, ev[1], ev[2]), ev[3:]
        else:  # with its task: the key map hands it on to the cleaning pass
            acc.add(ev[3])
            yield (_SCANNED, ev[1], ev[2]), (ev, task)


def _as_event(pair: tuple[tuple[int, int, int], Any]) -> tuple[Any, ...]:
    """A shuffle pair back as the scan's event tuple."""
    (kind, pidx, x), value = pair
    if kind == _KEYS:
        return (KEY, pidx, x, *value)
    if kind == _PRODUCER:
        return (PRODUCER, pidx, x, value)
    if kind == _TXN_KEYS:
        return (TXN_KEY, pidx, x, *value)
    return tuple(value[0])


def _route(parts: int) -> Callable[[tuple[int, int, int]], int]:
    """The scan shuffle's partitioner: `SCANNED` rows to `SIDE`, the rest spread over the
    `parts` partitions after it; a partition's key buckets in turn, so that they share the
    work evenly (the buckets dominate it)."""
    from pyspark.rdd import portable_hash

    def route(key: tuple[int, int, int]) -> int:
        kind = key[0]
        if kind == _SCANNED:
            return SIDE
        if kind == _KEYS:
            return 1 + (key[1] + key[2]) % parts
        return 1 + portable_hash(key) % parts

    return route


def _key_map(bounds: Any, bad: frozenset[int],
             pairs: Iterable[tuple[tuple[int, int, int], Any]]
             ) -> Iterator[tuple[tuple[int, int], tuple[str, Any]]]:
    """Stage 2 for a job without transactional keys, on one partition of the scan's shuffle
    (sorted by key, so each key's values arrive together and one is held at a time): every
    key bucket's latest offsets (`reduce_bucket`) and every producer's batch verdicts
    (`transaction_flags`), each sent to the segment it belongs to; and every segment's task,
    from its summary row, so that each segment meets its verdicts even when it has none."""
    for key, group in itertools.groupby(pairs, key=lambda kv: kv[0]):
        kind, pidx = key[0], key[1]
        if pidx in bad:
            continue
        if kind == _SCANNED:
            for _k, (_ev, task) in group:
                yield (task.pidx, task.row), ("s", task)
        elif kind == _KEYS:
            rows = (("k", *value) for _k, value in group)
            for seg, winners in reduce_bucket(pidx, bounds.value[pidx], rows):
                yield seg, ("l", winners)
        elif kind == _PRODUCER:
            for (p, offset), flag in _txn_verdicts((pidx, key[2]), (v for _k, v in group)):
                yield (p, _segment_of(bounds.value, p, offset)), ("f", (offset, flag))


def _clean_partition(
    settings: Any, now_ms: int, retention: dict[int, int | None], acc: Accumulator[int],
    items: Iterable[tuple[tuple[int, int], Iterable[tuple[str, Any]]]],
) -> Iterator[tuple[tuple[int, int], CleanOut]]:
    store = partial(_executor_store, settings)  # built only if a segment was not spilled here
    for key, values in items:
        task: SegTask | None = None
        latest: list[bytes] = []
        flags: list[tuple[int, int]] = []
        for tag, value in values:
            if tag == "s":
                task = value
            elif tag == "l":
                latest.append(value)
            else:
                flags.append(value)
        if task is None:  # verdicts for a segment not cleaned (cannot happen): ignored
            continue
        out = clean_task(store, task, latest_offsets(latest), flags, now_ms=now_ms,
                         delete_retention_ms=retention[task.pidx])
        acc.add(out.stats.get("bytes_in", 0))
        yield key, out


def _upload_partition(
    settings: Any, items: Iterable[tuple[int, Iterable[tuple[GroupTask, CleanOut]]]]
) -> Iterator[RunResult]:
    store = _executor_store(settings)
    for _gid, pairs in items:
        pairs = list(pairs)
        yield upload_group(store, pairs[0][0], [c for _g, c in pairs])


def _txn_verdicts(pidx_pid: Any, events: Iterable[Any]) -> Iterator[tuple[tuple[int, int], int]]:
    pidx = pidx_pid[0]
    for offset, flag in transaction_flags(events).items():
        yield (pidx, offset), flag


def run_compact(
    ctx: JobContext,
    *,
    topic: str | None = None,
    partition: int | None = None,
    dry_run: bool = False,
    clock: Callable[[], float] = time.time,
    before_commit: Callable[[PartitionRef], None] | None = None,
) -> dict[str, Any]:
    """Compact every due partition of the compacted topics (or of `topic`, `partition`).
    Returns the JSON summary; `ok` is false when a segment could not be read or cleaned, an
    upload failed or a commit could not be made. `before_commit` is a test seam called after
    a partition's objects are uploaded and before its commit."""
    started = time.monotonic()
    now_ms = int(clock() * 1000)
    jobs, skipped, errors = _jobs(ctx, topic, partition)
    for job in jobs:
        try:
            _plan(ctx.manifests, job, now_ms)
        except TieredError as exc:
            job.errors.append(f"{job.part}: cannot plan: {job_error(exc)}")
    due = [j for j in jobs if j.tasks and not j.errors]
    bytes_read = orphans = 0
    if due:
        bytes_read, orphans = _compact(ctx, due, now_ms=now_ms, dry_run=dry_run,
                                       before_commit=before_commit)
    return _summary(jobs, skipped, errors, bytes_read, orphans, dry_run,
                    time.monotonic() - started)


def _jobs(ctx: JobContext, topic: str | None, partition: int | None
          ) -> tuple[list[PartitionJob], list[dict[str, Any]], list[str]]:
    found = ctx.enumerate(topic).require(topic)
    manifests = {(t.topic, t.revision): t for t in found.topics}
    jobs: list[PartitionJob] = []
    skipped: list[dict[str, Any]] = []
    for part in found.partitions:
        if partition is not None and part.partition != partition:
            continue
        tm = manifests[(part.topic, part.revision)]
        tc = ctx.config.topic_config(part.topic)
        if not is_compacted_topic(tc, tm):
            skipped.append(_skip(part, "cleanup.policy = delete: never compacted"))
            continue
        jobs.append(PartitionJob(len(jobs), part, compaction_settings(ctx.config, tc, tm),
                                 tc.index_interval_bytes))
    return jobs, skipped, list(found.problems)


def _skip(part: PartitionRef, reason: str) -> dict[str, Any]:
    return {"topic": part.topic, "partition": part.partition, "revision": part.revision,
            "reason": reason}


def _compact(
    ctx: JobContext, due: list[PartitionJob], *, now_ms: int, dry_run: bool,
    before_commit: Callable[[PartitionRef], None] | None,
) -> tuple[int, int]:
    """Stages 1 to 5 over the due partitions; returns (bytes read, unreferenced objects
    deleted). What the run left on the executors' disks goes at its end, however it ends."""
    tag = new_job_tag()
    try:
        return _stages(ctx, due, tag, now_ms=now_ms, dry_run=dry_run,
                       before_commit=before_commit)
    finally:
        _discard_spills(ctx.sc, tag)


def _discard_spills(sc: Any, tag: str) -> None:
    """Best effort: a task per core removes the run's spill files on its machine
    (`executor_spill.discard_run`); a machine none of them reaches keeps its files until the
    application ends, when Spark removes its files directory."""
    n = max(1, sc.defaultParallelism)
    try:
        sc.parallelize(range(n), n).foreach(lambda _i: discard_run(tag))
    except Exception as exc:  # the run's own outcome, or its error, matters more
        log.warning("could not remove the compaction run's spill files (%s); Spark removes "
                    "them when the application ends", exc)


def _stages(
    ctx: JobContext, due: list[PartitionJob], tag: str, *, now_ms: int, dry_run: bool,
    before_commit: Callable[[PartitionRef], None] | None,
) -> tuple[int, int]:
    sc = ctx.sc
    settings = ctx.settings
    for job in due:
        n = key_buckets(job.plan.cleanable_bytes if job.plan else 0, len(job.tasks),
                        sc.defaultParallelism)
        job.tasks = [t._replace(buckets=n, job=tag) for t in job.tasks]
    tasks = [t for j in due for t in j.tasks]
    by_pidx = {j.pidx: j for j in due}
    bounds = sc.broadcast({j.pidx: j.bounds for j in due})
    retention = {j.pidx: j.settings.delete_retention_ms for j in due}
    # a task per core and stage: each Python task costs tens of milliseconds to launch and
    # feed, and the segments of a compaction are of a size (docs/performance.md)
    slices = slices_for(len(tasks), sc.defaultParallelism, per_core=1)
    shuffle_parts = max(sc.defaultParallelism, 2)
    group = f"tiered-compact-{time.monotonic_ns()}"
    acc: Accumulator[int] = sc.accumulator(0)  # bytes read, both passes over the segments
    # several stages: the task count is not known up front, the bytes are
    with Progress(sc, "compact", group=group, total_tasks=0, bytes_done=lambda: int(acc.value)):
        # by bytes, not by count: a pass after an earlier one finds small compacted copies
        # first and whole segments after them
        lists = balanced_slices(tasks, slices, lambda t: t.source.size_bytes)
        shuffled = (sc.parallelize(lists, len(lists))
                    .mapPartitions(partial(_scan_pairs, settings, acc))
                    .repartitionAndSortWithinPartitions(shuffle_parts + 1,
                                                        _route(shuffle_parts)))
        # runs the scan, writing the whole shuffle; the key map later reads the rest of it
        scanned = [v[0] for _k, v in sc.runJob(shuffled, list, [SIDE])]
        bytes_read = sum(e[3] for e in scanned)
        for _tag, pidx, index, _n, error, _p, _t in scanned:
            if error is not None:
                by_pidx[pidx].errors.append(f"{by_pidx[pidx].part}: segment {index}: {error}")
        bad = frozenset(p for p, j in by_pidx.items() if j.errors)
        counts = _Counts(sum(e[5] for e in scanned if e[1] not in bad),
                         sum(e[6] for e in scanned if e[1] not in bad))
        cleaned = _clean(shuffled, tasks, bad, bounds, retention, settings, now_ms,
                         shuffle_parts, acc, counts)
    try:
        # counts only: the verdicts a cleaned segment carries are per-key state, which the
        # driver never holds
        outs = cleaned.mapValues(lambda c: c._replace(data=b"", empty=b"", latest=b"",
                                                      flags=())).collect()
        for _key, c in outs:
            job = by_pidx[c.task.pidx]
            if c.error is not None:
                job.errors.append(f"{job.part}: segment {c.task.row}: {c.error}")
                continue
            for k, v in c.stats.items():
                job.stats[k] = job.stats.get(k, 0) + v
        plans = _group(due, outs)
        if dry_run:
            for job in due:
                if not job.errors:
                    job.bytes_after = job.bytes_before - sum(
                        c.stats["bytes_in"] - c.stats["bytes_out"]
                        for _k, c in outs if c.task.pidx == job.pidx and c.error is None)
            return bytes_read, 0
        results = _upload(sc, cleaned, plans, settings, shuffle_parts)
    finally:
        cleaned.unpersist()
    return bytes_read, _commit(ctx, due, plans, results, now_ms=now_ms,
                               before_commit=before_commit)


@dataclass(frozen=True)
class _Counts:
    """What the scan found beside keys, over the partitions still compacted: the stages
    for transactions are left out of a job that has none."""

    producer_batches: int
    txn_keys: int


def _clean(
    shuffled: RDD[Any], tasks: list[SegTask], bad: frozenset[int], bounds: Any,
    retention: dict[int, int | None], settings: Any, now_ms: int, parts: int,
    acc: Accumulator[int], counts: _Counts,
) -> RDD[Any]:
    """Stages 2 and 3: the key map and the batch verdicts from the scan's shuffle, then every
    segment cleaned with what one more shuffle brings it; the result (per (pidx, row):
    `CleanOut`) is persisted for grouping."""
    from pyspark import StorageLevel

    kept: list[RDD[Any]] = []
    if counts.txn_keys:
        verdicts = _verdicts_with_transactions(shuffled, tasks, bad, bounds, parts, kept)
        verdicts = verdicts.union(shuffled.context.parallelize(
            [((t.pidx, t.row), ("s", t)) for t in tasks if t.pidx not in bad],
            max(1, min(len(tasks), parts))))
    else:  # the segments' tasks come with their summary rows
        verdicts = shuffled.mapPartitions(partial(_key_map, bounds, bad))
    cleaned = (verdicts.groupByKey(parts)
               .mapPartitions(partial(_clean_partition, settings, now_ms, retention, acc)))
    # on disk only: the verdicts each cleaned segment carries are 8 bytes per key it keeps,
    # and the cleaned bytes themselves when they could not be spilled: held in the block
    # manager's memory, bytes nearly the input's ran a 1 GiB JVM out of heap
    # (docs/compaction.md)
    cleaned.persist(StorageLevel.DISK_ONLY)
    cleaned.count()  # run stages 2 and 3 while what they read is still kept
    for rdd in kept:
        rdd.unpersist()
    return cleaned


def _verdicts_with_transactions(
    shuffled: RDD[Any], tasks: list[SegTask], bad: frozenset[int], bounds: Any, parts: int,
    kept: list[RDD[Any]],
) -> RDD[Any]:
    """Stage 2 when some batch is transactional: its keys count only once its transaction is
    known to have committed, so the verdicts come first (a `groupByKey` over (partition,
    producer id)), the records of aborted or undecided transactions are kept out of the key
    map by a join on their batch, and the key map is reduced after. The RDDs read more than
    once are persisted and added to `kept`."""
    from pyspark import StorageLevel

    events = shuffled.map(_as_event).filter(lambda e: e[0] != SCANNED and e[1] not in bad)
    events.persist(StorageLevel.MEMORY_AND_DISK)
    kept.append(events)
    buckets = {t.pidx: t.buckets for t in tasks}
    b = bounds
    flags = (events.filter(lambda e: e[0] == PRODUCER)
             .map(lambda e: ((e[1], e[2]), e[3]))
             .groupByKey(parts)
             .flatMap(lambda kv: _txn_verdicts(kv[0], kv[1])))
    flags.persist(StorageLevel.MEMORY_AND_DISK)
    kept.append(flags)
    to_segments = flags.map(
        lambda kv: ((kv[0][0], _segment_of(b.value, kv[0][0], kv[0][1])),
                    ("f", (kv[0][1], kv[1]))))
    excluded = flags.filter(lambda kv: bool(kv[1] & (ABORTED | IN_DOUBT)))
    txn_keys = (events.filter(lambda e: e[0] == TXN_KEY)
                .map(lambda e: ((e[1], e[2]), (e[3], e[4])))
                .leftOuterJoin(excluded, parts)
                .filter(lambda kv: kv[1][1] is None)
                .map(lambda kv: ((kv[0][0], key_bucket(kv[1][0][0], buckets[kv[0][0]])),
                                 ("t", kv[1][0][0], kv[1][0][1]))))
    key_rows: RDD[Any] = (events.filter(lambda e: e[0] == KEY)
                          .map(lambda e: ((e[1], e[2]), ("k", e[3], e[4], e[5]))))
    latest = (key_rows.union(txn_keys).groupByKey(parts)
              .flatMap(lambda kv: reduce_bucket(kv[0][0], b.value[kv[0][0]], kv[1]))
              .map(lambda kv: (kv[0], ("l", kv[1]))))
    return latest.union(to_segments)


@dataclass
class _GroupPlan:
    job: PartitionJob
    tasks: list[GroupTask]
    #: (pidx, row index) -> the group the cleaned segment goes into
    members: dict[tuple[int, int], GroupTask]


def _group(due: list[PartitionJob], outs: list[tuple[Any, CleanOut]]) -> dict[int, _GroupPlan]:
    by_part: dict[int, list[CleanOut]] = {}
    for _k, c in outs:
        by_part.setdefault(c.task.pidx, []).append(c)
    plans: dict[int, _GroupPlan] = {}
    gid = 0
    for job in due:
        if job.errors or job.manifest is None:
            continue
        m = job.manifest
        cleaned = sorted(by_part.get(job.pidx, []), key=lambda c: c.task.row)
        items = [Cleaned(c.task.row, c.task.source.base_offset, c.task.source.last_offset,
                         c.task.segment_term, c.stats["bytes_out"], c.changed, c.task.compacted)
                 for c in cleaned]
        by_index = {c.task.row: c for c in cleaned}
        plan = _GroupPlan(job, [], {})
        for n, g in enumerate(group_outputs(items, job.settings.target_bytes)):
            sources = tuple(by_index[i].task.source for i in range(g.first, g.last + 1))
            run = RunTask(job.part, n, g.base_offset, g.last_offset, g.segment_term, m.term,
                          fresh_generation(m.sequence), job.index_interval_bytes, sources)
            gt = GroupTask(gid, job.pidx, run)
            plan.tasks.append(gt)
            for i in range(g.first, g.last + 1):
                plan.members[(job.pidx, i)] = gt
            gid += 1
        job.groups = len(plan.tasks)
        if not plan.tasks and job.skip_reason is None:
            job.skip_reason = "nothing to change: every cleanable segment is compacted already"
        plans[job.pidx] = plan
    return plans


def _upload(sc: Any, cleaned: RDD[Any], plans: dict[int, _GroupPlan], settings: Any,
            parts: int) -> list[RunResult]:
    members: dict[tuple[int, int], GroupTask] = {}
    for plan in plans.values():
        members.update(plan.members)
    if not members:
        return []
    want = sc.broadcast(members)
    groups = (cleaned.filter(lambda kv: kv[0] in want.value)
              .map(lambda kv: (want.value[kv[0]].gid, (want.value[kv[0]], kv[1])))
              .groupByKey(parts))
    return groups.mapPartitions(partial(_upload_partition, settings)).collect()


def _commit(
    ctx: JobContext, due: list[PartitionJob], plans: dict[int, _GroupPlan],
    results: list[RunResult], *, now_ms: int,
    before_commit: Callable[[PartitionRef], None] | None,
) -> int:
    by_part: dict[PartitionRef, list[RunResult]] = {}
    for r in results:
        by_part.setdefault(r.task.part, []).append(r)
        if r.error is not None:
            job = next(j for j in due if j.part == r.task.part)
            job.errors.append(f"{r.task.part}: group {r.task.base_offset}..{r.task.last_offset}"
                              f": {r.error}")
    orphans = 0
    for job in due:
        plan = plans.get(job.pidx)
        if plan is None or not plan.tasks or job.manifest is None or job.etag is None:
            continue
        state = PartitionState(job.part, MergeLimits(job.settings.target_bytes, 0),
                               job.index_interval_bytes)
        planned = _Planned(state, job.manifest, job.etag, [g.run for g in plan.tasks])
        stale, certain = commit_partition(ctx.manifests, planned, by_part.get(job.part, []),
                                          now_ms=now_ms, before_commit=before_commit)
        job.errors.extend(state.errors)
        job.conflicts += state.conflicts
        job.groups_committed = state.runs_committed
        job.segments_replaced = state.segments_merged
        job.bytes_uploaded = state.bytes_uploaded
        if state.runs_committed:
            job.bytes_after = state.bytes_after
        if stale and certain:
            # another writer replaced or expired their sources first (a second compaction,
            # retention): nothing is lost, and a pass later compacts what is left to do
            orphans += _delete_unreferenced(ctx.manifests, job.part, stale)
            job.stale_groups += len(stale)
            log.info("%s: %d compacted group(s) no longer apply (the head changed under "
                     "them); deleted", job.part, len(stale))
    return orphans


def _summary(
    jobs: list[PartitionJob], skipped: list[dict[str, Any]], errors: list[str],
    bytes_read: int, orphans: int, dry_run: bool, elapsed: float,
) -> dict[str, Any]:
    by_policy = len(skipped)
    for j in jobs:
        errors.extend(j.errors)
        if j.skip_reason is not None and not j.errors:
            skipped.append(_skip(j.part, j.skip_reason))
    worked = [j for j in jobs if j.tasks]
    total = {k: sum(j.stats.get(k, 0) for j in worked) for k in (
        "records_in", "records_kept", "tombstones_dropped", "keyless_kept", "horizons_set")}
    return {
        "ok": not errors,
        "dry_run": dry_run,
        "partitions_scanned": len(jobs) + by_policy,
        "partitions_compacted": sum(1 for j in worked if j.groups_committed),
        "before": {"bytes": sum(j.bytes_before for j in worked)},
        "after": {"bytes": sum(j.bytes_after for j in worked)},
        "bytes_read": bytes_read,
        "bytes_uploaded": sum(j.bytes_uploaded for j in worked),
        "records_in": total["records_in"],
        "records_dropped": total["records_in"] - total["records_kept"],
        "tombstones_dropped": total["tombstones_dropped"],
        "keyless_records_kept": total["keyless_kept"],
        "delete_horizons_set": total["horizons_set"],
        "objects_written": sum(j.groups_committed for j in worked),
        "segments_replaced": sum(j.segments_replaced for j in worked),
        "commit_conflicts": sum(j.conflicts for j in worked),
        "stale_groups": sum(j.stale_groups for j in worked),
        "unreferenced_objects_deleted": orphans,
        "elapsed_s": round(elapsed, 3),
        "mb_per_s": round(bytes_read / 1e6 / elapsed, 3) if elapsed > 0 else 0.0,
        "partitions": [j.row() for j in worked],
        "skipped": skipped,
        "errors": list(dict.fromkeys(errors)),
    }


# -- metrics -----------------------------------------------------------------------------------

#: gauge name -> (summary field, help): one run's figures for Prometheus' textfile collector
RUN_METRICS: dict[str, tuple[str, str]] = {
    "tiered_compaction_last_run_timestamp_seconds": ("", "when the last compaction run ended"),
    "tiered_compaction_last_run_success": ("ok", "1 when the last run compacted everything due"),
    "tiered_compaction_last_run_duration_seconds": ("elapsed_s", "wall time of the last run"),
    "tiered_compaction_last_run_bytes_read": ("bytes_read", "segment bytes the run read"),
    "tiered_compaction_last_run_bytes_uploaded": ("bytes_uploaded",
                                                  "compacted objects and indexes uploaded"),
    "tiered_compaction_last_run_bytes_freed": ("", "head bytes before minus after"),
    "tiered_compaction_last_run_records_dropped": ("records_dropped",
                                                   "superseded records removed"),
    "tiered_compaction_last_run_tombstones_dropped": ("tombstones_dropped",
                                                      "tombstones removed past their horizon"),
    "tiered_compaction_last_run_partitions_compacted": ("partitions_compacted",
                                                        "partitions whose head changed"),
    "tiered_compaction_last_run_partitions_skipped": ("", "partitions not compacted, any reason"),
    "tiered_compaction_last_run_commit_conflicts": ("commit_conflicts",
                                                    "compare-and-swap races lost and re-applied"),
}


def write_metrics(summary: dict[str, Any], path: str, *, now: float | None = None) -> None:
    """The run's figures as Prometheus gauges in `path` (text format, written atomically),
    for node_exporter's textfile collector: a batch job has no endpoint to scrape
    (docs/metrics.md)."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    derived = {
        "tiered_compaction_last_run_timestamp_seconds": time.time() if now is None else now,
        "tiered_compaction_last_run_bytes_freed": summary.get("before", {}).get("bytes", 0)
        - summary.get("after", {}).get("bytes", 0),
        "tiered_compaction_last_run_partitions_skipped": len(summary.get("skipped", ())),
    }
    for name, (field_name, doc) in RUN_METRICS.items():
        value = derived[name] if not field_name else summary.get(field_name, 0)
        Gauge(name, doc, registry=registry).set(float(value))
    write_to_textfile(path, registry)
