"""Integrity scrubbing of the bucket (`tiered scrub`), on Spark.

For every partition a topic manifest names, the driver reads the head manifest and every
archived manifest below it, and lists the partition's data prefix once. From that alone it
finds missing objects, objects of the wrong size, gaps and overlaps between consecutive
segments, and orphans: objects under the partition's prefixes that no manifest names. The
executors then stream every named segment object (ranged GETs of `objects.CHUNK_BYTES`) and check
the manifest's CRC-32C of the whole object and every record batch's own CRC-32C
(docs/design.md, invariant 5), so a flipped byte is named with its object key and byte position.

Not anomalies, reported separately: objects in the manifest's `replaced` list (a merge or
retention dropped them; garbage collection deletes them after the grace period, docs/design.md
invariant 7) and unreferenced objects younger than the grace period (an upload whose commit may
still be in flight). `--delete-orphans` deletes orphans older than
`cloud_storage_gc_grace_period_ms` by the rules garbage collection follows
(`manifests.collect`, docs/format.md): decided afresh from the bucket, and only objects no
writer can reference any more.

Streaming and verifying one object is `spark_jobs.segment_walk.walk_object`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from manifests import keys, segment_indexes
from manifests.collect import collect_orphans
from manifests.errors import ManifestError
from manifests.manifest import PartitionManifest
from manifests.model import INDEX_BUNDLE, SegmentMeta
from spark_jobs.job_context import JobContext, PartitionRef, job_error
from spark_jobs.segment_walk import meta_problem, run_tasks, walk_object
from tiered.errors import CorruptSegmentError, TieredError
from tiered.store.base import ObjectInfo, ObjectStore
from tiered.store.errors import ObjectNotFound, StoreError

if TYPE_CHECKING:
    from manifests.commit import ManifestStore

log = logging.getLogger("tiered.spark.scrub")

#: Kafka's index files every segment of that layout has beside it (`.txnindex` only when
#: non-empty)
EXPECTED_INDEX_KINDS = ("index", "timeindex")

#: every anomaly kind a scrub reports, and what it means; any of them makes `ok` false
ANOMALY_KINDS: dict[str, str] = {
    "corrupt_manifest": "a head, archived or topic manifest does not parse or verify",
    "missing": "an object the manifest names is not in the bucket",
    "size_mismatch": "an object's size differs from the manifest's (truncated or replaced)",
    "checksum_mismatch": "an object's CRC-32C differs from the manifest's",
    "corrupt_batch": "a record batch fails its CRC-32C or does not parse",
    "offsets_mismatch": "an object's batches do not hold the offsets the manifest says",
    "gap": "offsets between two consecutive segments are in no segment",
    "overlap": "two consecutive segments share offsets",
    "orphan": "an object under a partition's prefix that no manifest names",
    "missing_manifest": "segment objects exist but the partition has no head manifest",
    "unreferenced_history": "segment objects below the head's start that no recorded "
                            "retention explains: the head lost history",
    "unreadable": "the object could not be read (store error)",
}

# -- driver-side classification (pure) ------------------------------------------------------------


class Anomaly(NamedTuple):
    kind: str
    partition: str
    key: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return self._asdict()


class CheckTask(NamedTuple):
    """One named segment object for an executor to stream and verify (picklable)."""

    partition: str
    key: str
    meta: SegmentMeta


def expected_index_names(seg: SegmentMeta) -> list[str]:
    """The index objects every segment of its layout has beside it (Kafka's `.txnindex` is
    there only for a segment with aborted transactions, so its absence is not reported)."""
    if seg.index_layout == INDEX_BUNDLE:
        return [keys.index_name(seg.object_name, segment_indexes.BUNDLE_KIND)]
    return [keys.index_name(seg.object_name, kind) for kind in EXPECTED_INDEX_KINDS]


def segment_object_names(seg: SegmentMeta) -> list[str]:
    """The segment object's name and every index kind that may travel beside it."""
    return keys.with_indexes(seg.object_name)


def chain_anomalies(where: str, segments: Iterable[SegmentMeta]) -> list[Anomaly]:
    """Gaps and overlaps between consecutive segments (head and archived, in offset order)."""
    out: list[Anomaly] = []
    prev: SegmentMeta | None = None
    for seg in segments:
        if prev is not None and seg.base_offset != prev.last_offset + 1:
            kind = "gap" if seg.base_offset > prev.last_offset + 1 else "overlap"
            out.append(Anomaly(
                kind, where, seg.object_name,
                f"{prev.object_name} ends at {prev.last_offset}, {seg.object_name} starts at "
                f"{seg.base_offset}",
            ))
        prev = seg
    return out


@dataclass
class Classification:
    """What one partition's listing says against its manifest."""

    anomalies: list[Anomaly] = field(default_factory=list)
    #: segment objects present with the right size: the executors verify these
    to_verify: list[CheckTask] = field(default_factory=list)
    #: unreferenced objects older than the grace period (anomalies too): deletable
    orphans: list[ObjectInfo] = field(default_factory=list)
    #: unreferenced objects younger than the grace period: maybe an upload in flight
    recent: list[ObjectInfo] = field(default_factory=list)
    #: objects of `replaced` segments, with whether their grace period is over
    replaced: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def classify(
    where: str,
    prefix: str,
    segments: Iterable[SegmentMeta],
    replaced: Mapping[str, int],
    listing: Iterable[ObjectInfo],
    *,
    now_ms: int,
    grace_ms: int,
    log_start: int = 0,
    collectable_below: int = 0,
) -> Classification:
    """Compare the segments a manifest names (head and archived), its `replaced` objects
    (name -> replaced_at, ms) and a listing of the partition's data `prefix`. An unnamed
    segment object below `log_start` that `collectable_below` (the head's record of why the
    start moved) does not explain is history the head lost: reported, never an orphan to
    delete (docs/format.md, "Losing objects")."""
    out = Classification()
    listed = {info.key[len(prefix):]: info for info in listing}
    referenced: set[str] = set()
    segs = list(segments)
    out.anomalies.extend(chain_anomalies(where, segs))
    for seg in segs:
        names = segment_object_names(seg)
        referenced.update(names)
        key = prefix + seg.object_name
        info = listed.get(seg.object_name)
        if info is None:
            out.anomalies.append(Anomaly("missing", where, key, "not in the bucket"))
            continue
        if info.size != seg.size_bytes:
            out.anomalies.append(Anomaly(
                "size_mismatch", where, key,
                f"{info.size} bytes in the bucket, the manifest says {seg.size_bytes}",
            ))
            continue
        out.to_verify.append(CheckTask(where, key, seg))
        for index in expected_index_names(seg):
            if index not in listed:
                out.warnings.append(f"{where}: {prefix + index} is missing (recovery and "
                                    "reads rebuild the offset and time indexes from the "
                                    "segment; a transaction index cannot be rebuilt)")
    for name, replaced_at in replaced.items():
        stem = SegmentMeta(0, 0, -1, -1, 0, 0, 0, 0, name=name)
        for obj in segment_object_names(stem):
            referenced.add(obj)
            if obj in listed:
                out.replaced.append({
                    "partition": where, "key": prefix + obj, "replaced_at": replaced_at,
                    "grace_over": replaced_at + grace_ms <= now_ms,
                })
    cutoff_s = (now_ms - grace_ms) / 1000
    for name, info in sorted(listed.items()):
        if name in referenced:
            continue
        segment = keys.segment_name_of(name)
        parsed = None if segment is None else keys.parse_segment_name(segment)
        if parsed is not None and parsed.base_offset < log_start and (
                parsed.last_offset >= collectable_below):
            out.anomalies.append(Anomaly(
                "unreferenced_history", where, info.key,
                f"offsets {parsed.base_offset}..{parsed.last_offset} below the head's start "
                f"{log_start} with no recorded retention; repair the head with `tiered "
                "recover --rebuild-manifests`"))
            continue
        if info.last_modified <= cutoff_s:
            out.orphans.append(info)
            out.anomalies.append(Anomaly(
                "orphan", where, info.key, f"{info.size} bytes that no manifest names"))
        else:
            out.recent.append(info)
    return out


# -- executors -------------------------------------------------------------------------------------


def _verify(counter: Any, store: ObjectStore, task: CheckTask) -> Anomaly | None:
    """Stream one segment object and check it against its manifest row (runs in executors)."""
    meta = task.meta
    try:
        facts = walk_object(store, task.key, meta.size_bytes)
    except ObjectNotFound:
        return Anomaly("missing", task.partition, task.key, "deleted while scrubbing")
    except CorruptSegmentError as err:
        return Anomaly("corrupt_batch", task.partition, task.key, str(err))
    except (StoreError, OSError) as err:
        return Anomaly("unreadable", task.partition, task.key, job_error(err))
    finally:
        if counter is not None:
            counter.add(meta.size_bytes)
    problem = meta_problem(facts, meta)
    if problem is None:
        return None
    return Anomaly(problem[0], task.partition, task.key, problem[1])


# -- the job ---------------------------------------------------------------------------------------


def _manifest_segments(mstore: ManifestStore, m: PartitionManifest) -> Iterator[SegmentMeta]:
    """Every segment the manifest names, in offset order: all archived ones (expired ones
    too: their objects exist until GC drops the archive) then the head's."""
    for entry in m.archives:
        for obj in mstore.archive_objects(m, entry):
            if obj.segment is not None:
                yield obj.segment
    yield from m.segments


def _scan_partition(
    ctx: JobContext, ref: PartitionRef, now_ms: int, grace_ms: int
) -> tuple[Classification, PartitionManifest | None]:
    where = f"{ref.topic}/{ref.partition}"
    prefix = keys.partition_data_prefix(ref.topic, ref.partition, ref.revision)
    mkey = keys.partition_manifest_key(ref.topic, ref.partition, ref.revision)
    try:
        m, etag = ctx.manifests.load(ref.topic, ref.partition, ref.revision)
        segments = list(_manifest_segments(ctx.manifests, m)) if etag is not None else []
        unreferenced = ctx.manifests.unreferenced_archives(m) if etag is not None else []
    except ManifestError as err:
        out = Classification()
        out.anomalies.append(Anomaly("corrupt_manifest", where, getattr(err, "key", None)
                                     or mkey, str(err)))
        return out, None
    listing = list(ctx.store.list(prefix))
    if etag is None:
        out = Classification()
        if listing:
            out.anomalies.append(Anomaly(
                "missing_manifest", where, mkey,
                f"{len(listing)} object(s) under {prefix} but no head manifest; "
                "run `tiered recover --rebuild-manifests`",
            ))
        return out, None
    replaced = {r.segment.object_name: r.replaced_at for r in m.replaced}
    out = classify(where, prefix, segments, replaced, listing, now_ms=now_ms, grace_ms=grace_ms,
                   log_start=m.log_start_offset, collectable_below=m.collectable_below)
    cutoff_s = (now_ms - grace_ms) / 1000
    for info in unreferenced:
        if info.last_modified <= cutoff_s:
            out.orphans.append(info)
            out.anomalies.append(Anomaly("orphan", where, info.key,
                                         "archived manifest that the head does not list"))
        else:
            out.recent.append(info)
    return out, m


def _delete_orphans(
    ctx: JobContext, ref: PartitionRef, orphans: list[ObjectInfo], now_ms: int, grace_ms: int
) -> tuple[list[str], list[str]]:
    """Delete those of `orphans` that garbage collection's rules allow, decided afresh from
    the bucket (`manifests.collect`). Returns (deleted, errors)."""
    try:
        done = collect_orphans(ctx.manifests, ref.topic, ref.partition, ref.revision,
                               now_ms=now_ms, grace_ms=grace_ms,
                               only={info.key for info in orphans})
    except (TieredError, OSError) as err:
        return [], [f"{ref}: not deleting orphans: {job_error(err)}"]
    for k in done.deleted:
        log.info("deleted orphan %s", k)
    for k, why in sorted(done.deferred.items()):
        log.info("kept orphan %s: %s", k, why)
    return done.deleted, done.errors


def run_scrub(
    ctx: JobContext, *, topic: str | None, delete_orphans: bool, now_ms: int | None = None
) -> dict[str, Any]:
    """Scrub every partition (of `topic`, or all) and return the JSON-able report; `ok` is
    false on any anomaly. `now_ms` (ms since the epoch) is injectable for tests."""
    started = time.monotonic()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    grace_ms = ctx.config.cluster_int("cloud_storage_gc_grace_period_ms")
    found = ctx.enumerate(topic).require(topic)
    anomalies = [Anomaly("corrupt_manifest", "", p.split(":", 1)[0], p) for p in found.problems]
    scans: list[tuple[PartitionRef, Classification, PartitionManifest | None]] = []
    for ref in found.partitions:
        try:
            cls, m = _scan_partition(ctx, ref, now, grace_ms)
        except (TieredError, OSError) as err:  # a store fault: this partition, not the job
            cls, m = Classification(), None
            cls.anomalies.append(Anomaly("unreadable", f"{ref.topic}/{ref.partition}",
                                         keys.partition_data_prefix(*ref), job_error(err)))
        scans.append((ref, cls, m))
        anomalies.extend(cls.anomalies)
    tasks = [task for _, cls, _ in scans for task in cls.to_verify]
    checked_bytes = sum(t.meta.size_bytes for t in tasks)
    found_bad = run_tasks(ctx, tasks, "scrub: verifying segment objects", "tiered-scrub",
                          _verify, lambda t: t.meta.size_bytes)
    anomalies.extend(a for a in found_bad if a is not None)
    deleted: list[str] = []
    errors: list[str] = []
    if delete_orphans:
        for ref, cls, m in scans:
            if m is not None and cls.orphans:
                gone, problems = _delete_orphans(ctx, ref, cls.orphans, now, grace_ms)
                deleted += gone
                errors += problems
    if topic is not None and not found.topics:
        errors.append(f"no topic manifest for topic {topic!r} in the bucket")
    anomalies.sort(key=lambda a: (a.partition, a.key, a.kind))
    summary: dict[str, Any] = {
        "ok": not anomalies and not errors,
        "topics": len(found.topics),
        "partitions": len(found.partitions),
        "objects_verified": len(tasks),
        "bytes_verified": checked_bytes,
        "anomalies": [a.to_json() for a in anomalies],
        "anomaly_counts": _counts(anomalies),
        "replaced_awaiting_gc": [r for _, cls, _ in scans for r in cls.replaced],
        "recent_unreferenced": [
            {"key": i.key, "size": i.size} for _, cls, _ in scans for i in cls.recent
        ],
        "warnings": [w for _, cls, _ in scans for w in cls.warnings],
        "deleted_orphans": deleted,
        "errors": errors,
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    log.info("scrub: %d partition(s), %d object(s) verified, %d anomaly(ies)",
             len(found.partitions), len(tasks), len(anomalies))
    return summary


def _counts(anomalies: Iterable[Anomaly]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for a in anomalies:
        counts[a.kind] = counts.get(a.kind, 0) + 1
    return counts


def summary_lines(summary: Mapping[str, Any]) -> Iterator[str]:
    """Human-readable report of `run_scrub`'s summary."""
    yield (f"scrubbed {summary['partitions']} partition(s): {summary['objects_verified']} "
           f"segment object(s), {summary['bytes_verified']} bytes verified")
    for kind, count in summary["anomaly_counts"].items():
        yield f"  {count} x {kind}: {ANOMALY_KINDS.get(kind, kind)}"
    for a in summary["anomalies"]:
        yield f"  {a['kind']}: {a['key']} ({a['partition']}): {a['detail']}"
    if summary["replaced_awaiting_gc"]:
        yield f"  {len(summary['replaced_awaiting_gc'])} replaced object(s) await GC"
    if summary["recent_unreferenced"]:
        yield (f"  {len(summary['recent_unreferenced'])} unreferenced object(s) younger than "
               "the grace period (uploads in flight?)")
    for w in summary["warnings"]:
        yield f"  warning: {w}"
    for k in summary["deleted_orphans"]:
        yield f"  deleted orphan {k}"
    for e in summary["errors"]:
        yield f"error: {e}"
    yield "ok" if summary["ok"] else f"{len(summary['anomalies'])} anomaly(ies) found"
