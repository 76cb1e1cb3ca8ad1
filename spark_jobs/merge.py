"""Adjacent-segment merging on Spark (`tiered merge`, or `spark-submit spark_jobs/submit.py
merge`).

The driver loads each partition's head manifest and plans runs (`merge_plan.plan_runs`).
Executors (`merge_exec.merge_run`) download every segment of a run, check each object's size
and CRC-32C against the manifest and its batches' offsets, concatenate the bytes (Kafka
batches carry absolute offsets, so they stay valid), rebuild the `.index`/`.timeindex` (which
re-checks every batch CRC), and upload the merged object under a name no object has had:
`{base}-{last}-{term}-{generation}.log` created with If-None-Match, the generation bumped past
any leftover of an earlier attempt. Indexes go up after the segment claimed its name; the
manifest only after both (design invariant 1).

The driver then commits each partition with compare-and-swap (`edits.replace_segments`): the
merged-away segments move to `replaced` and are deleted by garbage collection after the grace
period (design invariant 7). A lost race (the daemon committed meanwhile, or a newer term did)
re-reads the manifest and re-applies every run whose segments it still lists unchanged; nothing is
ever overwritten. Merged objects whose run no longer applies were never named by any manifest, so
they are deleted at once; partitions that had such runs are planned again, up to
`MAX_ROUNDS`. If a commit's outcome is unknown (a store error) nothing is deleted: garbage
collection's orphan scan finds what is left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from manifests import (
    CollectedName,
    InvalidUpdate,
    ManifestConflict,
    ManifestStore,
    PartitionManifest,
    StaleTerm,
    TopicManifest,
    edits,
)
from spark_jobs.job_context import (
    JobContext,
    PartitionRef,
    Progress,
    job_error,
    map_with_store,
    slices_for,
)
from spark_jobs.merge_exec import RunResult, RunTask, SourceSegment, fresh_generation, merge_run
from spark_jobs.merge_plan import (
    MergeLimits,
    MergeRun,
    Outcome,
    is_compacted_topic,
    merge_limits,
    plan_runs,
)
from tiered.config import Config
from tiered.errors import TieredError

if TYPE_CHECKING:
    from pyspark import Accumulator

log = logging.getLogger("tiered.spark.merge")

#: plan / upload / commit rounds per job; a partition re-enters only if a race made runs stale
MAX_ROUNDS = 3
#: driver threads loading manifests (GETs; latency-bound, not CPU-bound)
LOAD_THREADS = 16


@dataclass
class PartitionState:
    """One partition's progress through the job (driver side)."""

    part: PartitionRef
    limits: MergeLimits
    index_interval_bytes: int
    segments_before: int = 0
    bytes_before: int = 0
    segments_after: int = 0
    bytes_after: int = 0
    runs_planned: int = 0
    runs_committed: int = 0
    segments_merged: int = 0
    bytes_uploaded: int = 0
    conflicts: int = 0
    skip_reason: str | None = None
    errors: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "topic": self.part.topic,
            "partition": self.part.partition,
            "revision": self.part.revision,
            "segments_before": self.segments_before,
            "segments_after": self.segments_after,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "runs_committed": self.runs_committed,
            "segments_merged": self.segments_merged,
            "bytes_uploaded": self.bytes_uploaded,
            "conflicts": self.conflicts,
            "errors": list(self.errors),
        }


@dataclass
class _Planned:
    state: PartitionState
    manifest: PartitionManifest
    etag: str
    tasks: list[RunTask]


# -- planning (driver) -------------------------------------------------------------------------


def build_tasks(
    part: PartitionRef, m: PartitionManifest, runs: tuple[MergeRun, ...], index_interval: int
) -> list[RunTask]:
    """Executor tasks for the planned runs of manifest `m` (plain picklable values)."""
    tasks = []
    for n, run in enumerate(runs):
        sources = tuple(
            SourceSegment(
                key=m.segment_key(seg),
                name=seg.object_name,
                base_offset=seg.base_offset,
                last_offset=seg.last_offset,
                size_bytes=seg.size_bytes,
                checksum=seg.checksum,
                index_layout=seg.index_layout,
            )
            for seg in m.segments.rows(run.first_index)
            if seg.base_offset <= run.last_offset
        )
        tasks.append(
            RunTask(
                part=part,
                run_id=n,
                base_offset=run.base_offset,
                last_offset=run.last_offset,
                segment_term=run.segment_term,
                writer_term=m.term,
                # a name no object ever had: leftovers of an earlier attempt never block
                # its If-None-Match, and a collected name is never created again
                generation=fresh_generation(m.sequence),
                index_interval_bytes=index_interval,
                sources=sources,
            )
        )
    return tasks


def _plan_partition(
    mstore: ManifestStore, state: PartitionState, now_round: int
) -> _Planned | None:
    part = state.part
    m, etag = mstore.load(part.topic, part.partition, part.revision)
    if now_round == 0:
        state.segments_before = state.segments_after = len(m.segments)
        state.bytes_before = state.bytes_after = m.segments.total("size_bytes")
    if etag is None:
        state.skip_reason = "no manifest in the bucket yet"
        return None
    plan = plan_runs(m.segments, state.limits)
    state.runs_planned += len(plan.runs)
    if plan.outcome is not Outcome.RUNS:
        if state.runs_committed == 0:
            reason = plan.outcome.value
            if plan.outcome is Outcome.TAIL_WAITING:
                reason += f" ({plan.waiting_segments} segments, {plan.waiting_bytes} bytes)"
            state.skip_reason = reason
        return None
    state.skip_reason = None
    return _Planned(state, m, etag, build_tasks(part, m, plan.runs, state.index_interval_bytes))


# -- commit (driver) ---------------------------------------------------------------------------


def run_applies(m: PartitionManifest, result: RunResult) -> bool:
    """Whether `m`'s head still lists exactly the segments `result` merged (same objects,
    same checksums), so replacing them by the merged object loses nothing."""
    segs = m.segments
    first = segs.find(result.task.base_offset)
    if first is None or segs.base_offsets[first] != result.task.base_offset:
        return False
    sources = result.task.sources
    if first + len(sources) > len(segs):
        return False
    for src, seg in zip(sources, segs.rows(first), strict=False):
        if seg.object_name != src.name or seg.checksum != src.checksum:
            return False
    return segs.last_offsets[first + len(sources) - 1] == result.task.last_offset


def commit_partition(
    mstore: ManifestStore,
    planned: _Planned,
    results: list[RunResult],
    *,
    now_ms: int,
    before_commit: Callable[[PartitionRef], None] | None = None,
) -> tuple[list[RunResult], bool]:
    """Commit the merged runs of one partition by compare-and-swap, re-reading and
    re-applying on every lost race (`ManifestStore.update`). Returns (results that no longer
    apply, whether the outcome is certain: False after a store error, when deleting anything
    would be unsafe)."""
    state, part = planned.state, planned.state.part
    good = [r for r in results if r.meta is not None]
    if before_commit is not None:
        before_commit(part)
    applied: list[RunResult] = []
    reasons: dict[int, str] = {}

    def apply_runs(m: PartitionManifest) -> PartitionManifest:
        applied.clear()
        new = m
        for r in good:
            if r.meta is None or not run_applies(m, r):
                continue
            try:
                new = edits.replace_segments(new, r.meta, now_ms=now_ms,
                                           uploaded_at_ms=r.uploaded_at_ms)
            except CollectedName as exc:  # collection may delete it: merge again later
                reasons[id(r)] = f"not committing merged run: {exc}"
                continue
            except InvalidUpdate as exc:  # e.g. its name is still listed as replaced
                reasons[id(r)] = f"cannot commit merged run: {exc}"
                continue
            applied.append(r)
        return new

    try:
        done = mstore.update(part.topic, part.partition, part.revision, apply_runs,
                             start=(planned.manifest, planned.etag))
    except StaleTerm as exc:
        state.errors.append(f"{part}: {exc}")
        return good, True
    except ManifestConflict as exc:  # contention past the deadline: nothing was written
        state.conflicts += 1
        state.errors.append(f"{part}: {exc}")
        return good, True
    except TieredError as exc:
        state.errors.append(f"{part}: commit failed: {job_error(exc)}")
        return [], False
    state.conflicts += done.attempts - 1
    for r in good:
        if id(r) in reasons and r not in applied:
            state.errors.append(f"{part}: {reasons[id(r)]}")
    if not done.committed:
        return good, True
    state.runs_committed += len(applied)
    state.segments_merged += sum(len(r.task.sources) for r in applied)
    state.bytes_uploaded += sum(r.bytes_uploaded for r in applied)
    state.segments_after = len(done.manifest.segments)
    state.bytes_after = done.manifest.segments.total("size_bytes")
    for r in applied:
        log.info("%s: merged %d segments %d..%d into %s (%d bytes)", part,
                 len(r.task.sources), r.task.base_offset, r.task.last_offset,
                 r.uploaded_keys[0], r.bytes_uploaded)
    committed = {id(r) for r in applied}
    return [r for r in good if id(r) not in committed], True


def _delete_unreferenced(
    mstore: ManifestStore, part: PartitionRef, stale: list[RunResult]
) -> int:
    """Delete merged objects no committed manifest ever named (their run went stale)."""
    m, _ = mstore.load(part.topic, part.partition, part.revision)
    listed = set(m.segments.object_names())
    doomed = [k for r in stale if r.meta is not None and r.meta.object_name not in listed
              for k in r.uploaded_keys]
    if not doomed:
        return 0
    failed = mstore.store.delete_many(doomed)
    if failed:
        log.warning("%s: could not delete %d unreferenced merged object(s); GC will", part,
                    len(failed))
    return len(doomed) - len(failed)


# -- the job -----------------------------------------------------------------------------------


def _states(ctx: JobContext, topic: str | None) -> tuple[list[PartitionState], list[dict[str, Any]],
                                                          list[str]]:
    found = ctx.enumerate(topic).require(topic)
    manifests: dict[tuple[str, str], TopicManifest] = {
        (t.topic, t.revision): t for t in found.topics
    }
    states: list[PartitionState] = []
    skipped: list[dict[str, Any]] = []
    for part in found.partitions:
        tm = manifests[(part.topic, part.revision)]
        tc = ctx.config.topic_config(part.topic)
        if is_compacted_topic(tc, tm):
            skipped.append(_skip(part, Outcome.COMPACTED.value))
            continue
        states.append(
            PartitionState(part, merge_limits(ctx.config.cluster, tc, tm), tc.index_interval_bytes)
        )
    return states, skipped, list(found.problems)


def _skip(part: PartitionRef, reason: str) -> dict[str, Any]:
    return {"topic": part.topic, "partition": part.partition, "revision": part.revision,
            "reason": reason}


def execute_tasks(
    ctx: JobContext, tasks: list[RunTask], *, label: str = "merge"
) -> list[RunResult]:
    """Run merge tasks on the executors; progress on stderr while they run."""
    if not tasks:
        return []
    sc = ctx.sc
    acc: Accumulator[int] = sc.accumulator(0)
    work = partial(_counted_merge, acc)
    rdd = sc.parallelize(tasks, slices_for(len(tasks), sc.defaultParallelism))
    group = f"tiered-{label}-{time.monotonic_ns()}"
    with Progress(sc, label, group=group, total_tasks=rdd.getNumPartitions(),
                  bytes_done=lambda: int(acc.value)):
        return rdd.mapPartitions(map_with_store(ctx.settings, work)).collect()


def execute_locally(ctx: JobContext, tasks: list[RunTask]) -> list[RunResult]:
    """Run merge tasks one after another in this process, with the driver's store: the
    single-process baseline `benchmarks/merge.py` measures Spark against."""
    return [merge_run(ctx.store, task) for task in tasks]


def _counted_merge(acc: Accumulator[int], store: Any, task: RunTask) -> RunResult:
    result = merge_run(store, task)
    acc.add(result.bytes_read)
    return result


def disabled_summary(config: Config, *, force: bool = False) -> dict[str, Any] | None:
    """The summary of a merge that `cloud_storage_enable_segment_merging = false` turns into
    a no-op (None when merging is on, or `force`d)."""
    if config.cluster["cloud_storage_enable_segment_merging"] or force:
        return None
    return {"ok": True, "disabled": True, "message": (
        "adjacent segment merging is disabled (cloud_storage_enable_segment_merging = "
        "false); nothing done. Use --force to merge anyway.")}


def run_merge(
    ctx: JobContext,
    *,
    topic: str | None = None,
    force: bool = False,
    clock: Callable[[], float] = time.time,
    before_commit: Callable[[PartitionRef], None] | None = None,
    execute: Callable[[JobContext, list[RunTask]], list[RunResult]] = execute_tasks,
) -> dict[str, Any]:
    """Merge small adjacent segments of every partition (or of `topic`'s). Returns the JSON
    summary; `ok` is false when a run failed (corrupt source, store fault) or a partition
    could not be committed. `before_commit` is a seam for tests: called on the driver after
    a partition's merged objects are uploaded and before its first commit attempt.
    `execute` runs the tasks: on Spark by default, `execute_locally` for the baseline."""
    started = time.monotonic()
    off = disabled_summary(ctx.config, force=force)
    if off is not None:
        return off
    states, skipped, errors = _states(ctx, topic)
    pending = list(states)
    bytes_read = orphans_deleted = 0
    for round_no in range(MAX_ROUNDS):
        if not pending:
            break
        with ThreadPoolExecutor(max_workers=min(LOAD_THREADS, len(pending))) as pool:
            plans = list(pool.map(partial(_safe_plan, ctx.manifests, round_no=round_no), pending))
        planned = [p for p in plans if p is not None]
        tasks = [t for p in planned for t in p.tasks]
        log.info("merge round %d: %d run(s) in %d partition(s)", round_no + 1, len(tasks),
                 len(planned))
        results = execute(ctx, tasks) if tasks else []
        bytes_read += sum(r.bytes_read for r in results)
        by_part: dict[PartitionRef, list[RunResult]] = {}
        for r in results:
            by_part.setdefault(r.task.part, []).append(r)
            if r.error is not None:
                errors.append(f"{r.task.part}: run {r.task.base_offset}..{r.task.last_offset}: "
                              f"{r.error}")
        pending = []
        for p in planned:
            stale, certain = commit_partition(
                ctx.manifests, p, by_part.get(p.state.part, []),
                now_ms=int(clock() * 1000), before_commit=before_commit,
            )
            if stale and certain:
                orphans_deleted += _delete_unreferenced(ctx.manifests, p.state.part, stale)
                pending.append(p.state)
    return _summary(states, skipped, errors, bytes_read, orphans_deleted,
                    time.monotonic() - started)


def _safe_plan(
    mstore: ManifestStore, state: PartitionState, *, round_no: int
) -> _Planned | None:
    try:
        return _plan_partition(mstore, state, round_no)
    except TieredError as exc:
        state.errors.append(f"{state.part}: cannot plan: {job_error(exc)}")
        return None


def _summary(
    states: list[PartitionState], skipped: list[dict[str, Any]], errors: list[str],
    bytes_read: int, orphans_deleted: int, elapsed: float,
) -> dict[str, Any]:
    for s in states:
        errors.extend(s.errors)
        if s.skip_reason is not None and s.runs_committed == 0 and not s.errors:
            skipped.append(_skip(s.part, s.skip_reason))
    return {
        "ok": not errors,
        "disabled": False,
        "partitions_scanned": len(states) + sum(
            1 for s in skipped if s["reason"] == Outcome.COMPACTED.value),
        "before": {"segments": sum(s.segments_before for s in states),
                   "bytes": sum(s.bytes_before for s in states)},
        "after": {"segments": sum(s.segments_after for s in states),
                  "bytes": sum(s.bytes_after for s in states)},
        "runs_planned": sum(s.runs_planned for s in states),
        "runs_committed": sum(s.runs_committed for s in states),
        "segments_merged": sum(s.segments_merged for s in states),
        "bytes_read": bytes_read,
        "bytes_uploaded": sum(s.bytes_uploaded for s in states),
        "commit_conflicts": sum(s.conflicts for s in states),
        "unreferenced_objects_deleted": orphans_deleted,
        "elapsed_s": round(elapsed, 3),
        "partitions": [s.row() for s in states if s.runs_committed or s.errors],
        "skipped": skipped,
        "errors": list(dict.fromkeys(errors)),  # a run retried in a later round fails once
    }
