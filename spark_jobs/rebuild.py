"""Rebuilding lost or corrupt manifests from the segment objects (`tiered recover
--rebuild-manifests`), on Spark.

1. Executors list the bucket, one task per first hex digit of the partition hash `{h}`, and
   keep the keys that are segment objects of this layout (`{h}` re-derived and checked).
2. Partitions whose head manifest (and every archived manifest below it) reads fine are left
   alone; for the others, executors stream every listed object (`scrub.walk_object`: batch
   CRCs, whole-object CRC-32C, offsets, timestamps, leader epochs).
3. `plan_chain` (pure) picks one contiguous chain of objects from the lowest listed offset to
   the highest: the fewest objects (a merged object over the originals it replaced), then the
   newest writers'. What the chain does not need (retry or merge leftovers) is reported as
   orphans for scrub and garbage collection; a hole is reported and nothing is committed for
   that partition, never guessed across (design invariant 4).
4. The driver commits each head by compare-and-swap: If-None-Match for a lost head, If-Match
   on the ETag of an unreadable one (whose bytes are first copied to
   `manifest.json.corrupt-{etag}` for inspection), and recreates lost topic manifests.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from manifests import edits, keys, segment_indexes
from manifests.cas import put_on_version
from manifests.errors import ManifestConflict, ManifestError, UnsupportedManifestVersion
from manifests.manifest import PartitionManifest
from manifests.model import INDEX_BUNDLE, INDEX_FILES, SegmentMeta
from manifests.serde import encode_partition_manifest
from manifests.spillover import plan_spill
from manifests.topic import TopicManifest, load_topic_manifest, save_topic_manifest
from spark_jobs.job_context import JobContext, PartitionRef, job_error, map_with_store
from spark_jobs.segment_walk import ObjectFacts, run_tasks, walk_object
from tiered.errors import TieredError
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound, PreconditionFailed, StoreError

log = logging.getLogger("tiered.spark.rebuild")


class Found(NamedTuple):
    """A segment object found by listing, and (after streaming it) what it holds."""

    ref: PartitionRef
    name: str
    key: str
    size: int
    facts: ObjectFacts | None = None
    error: str | None = None
    #: how its indexes travel beside it: a bundle when one is listed beside it
    index_layout: int = INDEX_FILES


def _list_prefix(topic: str | None, store: ObjectStore, prefix: str) -> list[Found]:
    """Runs in an executor: every segment object under `prefix` (one hex digit of `{h}`),
    with the layout of its indexes (a bundle when one is listed beside it)."""
    out = []
    bundle = keys.INDEX_SUFFIXES[segment_indexes.BUNDLE_KIND]
    bundles: set[str] = set()  # the stems with a bundle: one pass, the listing never held
    for info in store.list(prefix):
        if info.key.endswith(bundle):
            bundles.add(info.key.removesuffix(bundle))
            continue
        parts = info.key.split("/")
        if len(parts) != 5 or parts[1] != keys.NAMESPACE or (topic and parts[2] != topic):
            continue
        p_text, sep, revision = parts[3].partition("_")
        if not sep or not p_text.isdigit() or keys.parse_segment_name(parts[4]) is None:
            continue
        try:
            if keys.partition_hash(parts[2], int(p_text), revision) != parts[0]:
                continue
        except ManifestError:
            continue  # not one of ours (illegal topic or revision)
        out.append(Found(PartitionRef(parts[2], int(p_text), revision), parts[4], info.key,
                         info.size))
    return [item._replace(index_layout=INDEX_BUNDLE)
            if item.key.removesuffix(keys.SEGMENT_SUFFIX) in bundles else item for item in out]


def _read_found(counter: Any, store: ObjectStore, item: Found) -> Found:
    """Runs in an executor: stream one listed object, verifying its batches."""
    try:
        return item._replace(facts=walk_object(store, item.key, item.size))
    except (TieredError, StoreError, OSError) as err:
        return item._replace(error=job_error(err))
    finally:
        counter.add(item.size)


def found_meta(item: Found) -> SegmentMeta | str:
    """The manifest row for a verified object, or why it cannot be one."""
    parsed, facts = keys.parse_segment_name(item.name), item.facts
    assert parsed is not None and facts is not None  # noqa: S101 - listed and read above
    first, last = facts.first_offset, facts.last_offset
    if first is None or last is None:
        return f"{item.key}: holds no record batch"
    exact = (first, last) == (parsed.base_offset, parsed.last_offset)
    if not exact and not (parsed.base_offset <= first and last <= parsed.last_offset):
        return (f"{item.key}: holds offsets {first}..{last}, its name says "
                f"{parsed.base_offset}..{parsed.last_offset}")
    default = keys.segment_name(parsed.base_offset, parsed.last_offset, parsed.term)
    return SegmentMeta(
        base_offset=parsed.base_offset, last_offset=parsed.last_offset,
        base_timestamp=facts.base_timestamp, max_timestamp=facts.max_timestamp,
        size_bytes=facts.size, segment_term=facts.epochs[0][0] if facts.epochs else 0,
        writer_term=parsed.term, checksum=facts.checksum,
        compacted=not (exact and facts.contiguous),
        name="" if item.name == default else item.name,
        index_layout=item.index_layout,
    )


@dataclass(frozen=True)
class ChainPlan:
    """Which objects make the partition's log (offset order), which are left over, and the
    gap that stopped a chain (None when the chain covers every listed offset)."""

    chain: tuple[SegmentMeta, ...]
    unused: tuple[SegmentMeta, ...]
    problem: str | None = None


def _generation(seg: SegmentMeta) -> int:
    parsed = keys.parse_segment_name(seg.object_name)
    return parsed.generation if parsed else 0


def plan_chain(candidates: Iterable[SegmentMeta]) -> ChainPlan:
    """One contiguous chain from the lowest listed offset to the highest. Among chains that
    do, the one with the fewest objects (a merged object over the originals it replaced),
    then the newest writers' (higher writer terms, then generations). If no chain reaches
    from the lowest offset to the highest, the first hole is reported and nothing chosen."""
    segs = sorted(candidates, key=lambda s: (s.base_offset, s.last_offset, s.writer_term))
    if not segs:
        return ChainPlan((), ())
    end = max(s.last_offset for s in segs)
    starts: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(segs):
        starts[s.base_offset].append(i)
    # best[i]: (objects, -writer terms, -generations) of the best chain from i to `end`
    best: dict[int, tuple[int, int, int]] = {}
    succ: dict[int, int | None] = {}
    for i in range(len(segs) - 1, -1, -1):
        s = segs[i]
        own = (1, -s.writer_term, -_generation(s))
        if s.last_offset == end:
            best[i], succ[i] = own, None
            continue
        options = [(best[j], j) for j in starts.get(s.last_offset + 1, []) if j in best]
        if options:
            score, j = min(options)
            best[i] = (score[0] + own[0], score[1] + own[1], score[2] + own[2])
            succ[i] = j
    first = segs[0].base_offset
    heads = [(best[i], i) for i in starts[first] if i in best]
    if not heads:
        return ChainPlan((), tuple(segs), _hole(segs, first))
    chosen: list[int] = []
    k: int | None = min(heads)[1]
    while k is not None:
        chosen.append(k)
        k = succ[k]
    taken = set(chosen)
    return ChainPlan(tuple(segs[i] for i in chosen),
                     tuple(s for i, s in enumerate(segs) if i not in taken))


def _hole(segs: list[SegmentMeta], first: int) -> str:
    reach = {first}
    for s in segs:  # by base offset: every predecessor is seen first
        if s.base_offset in reach:
            reach.add(s.last_offset + 1)
    stop = max(reach)
    later = [s.base_offset for s in segs if s.base_offset > stop]
    if later:
        return (f"gap: offsets {stop}..{min(later) - 1} are in no segment object (objects "
                f"resume at {min(later)}); refusing to guess across it")
    return (f"no segment object starts at offset {stop}: the objects overlap without a common "
            "boundary; refusing to guess")


def _head_state(ctx: JobContext, ref: PartitionRef, found: list[Found]
                ) -> tuple[str, str | None]:
    """('intact' | 'missing' | 'corrupt' | 'misses_history' | 'newer', the head's ETag when
    one is stored). A readable head that starts above segment objects of its own with no
    recorded retention (docs/format.md, "Losing objects") misses history: it is rebuilt too.
    A head in a format newer than this release reads is 'newer': never replaced."""
    key = keys.partition_manifest_key(*ref)
    try:
        m, etag = ctx.manifests.load(*ref)
        if etag is None:
            return "missing", None
        for _ in ctx.manifests.iter_segments(m, m.log_start_offset):
            pass  # reads every archived manifest: a corrupt one makes the head unusable
        for item in found:
            parsed = keys.parse_segment_name(item.name)
            if parsed is not None and parsed.base_offset < m.log_start_offset and (
                    parsed.last_offset >= m.collectable_below):
                return "misses_history", etag
        return "intact", etag
    except UnsupportedManifestVersion as err:
        log.warning("%s: %s", key, err)
        return "newer", None
    except ManifestError as err:
        log.warning("%s: %s", key, err)
    try:
        return "corrupt", ctx.store.head(key).etag
    except ObjectNotFound:
        return "missing", None


def _quarantine_key(ctx: JobContext, ref: PartitionRef, etag: str) -> str | None:
    """Where `ManifestStore.restore_garbled` kept the unreadable head of `etag`."""
    key = keys.partition_manifest_key(*ref)
    kept = f"{key}.corrupt-{etag.strip(chr(34))[:16]}"
    return kept if ctx.store.exists(kept) else None


def _commit_over_corrupt(ctx: JobContext, m: PartitionManifest, etag: str) -> str:
    """Replace an unreadable head by compare-and-swap on its ETag (ManifestStore.commit
    cannot: it must read the version it replaces). The bad bytes are kept beside it."""
    store = ctx.store
    quarantine = f"{m.key}.corrupt-{etag[:16]}"
    store.put(quarantine, store.get(m.key))
    plan = plan_spill(m, ctx.manifests.settings.spillover_size)
    for upload in plan.uploads:
        try:
            store.put(upload.key, upload.data, if_none_match=True)
        except PreconditionFailed:
            if store.get(upload.key) != upload.data:
                raise TieredError(f"{upload.key}: holds a different archived manifest") from None
    rebuilt = plan.manifest.evolve(sequence=1)
    data = encode_partition_manifest(rebuilt)
    put_on_version(store, m.key, data, etag)
    # no copy restored the head, so the copies there are unreadable or incomplete: both slots
    # get the rebuilt one, or a later loss of the head could restore one of them over it
    ctx.manifests.head_copies.keep(rebuilt, data, every_slot=True)
    return quarantine


def _rebuild_partition(ctx: JobContext, ref: PartitionRef, state: str, etag: str | None,
                       items: list[Found]) -> dict[str, Any]:
    row: dict[str, Any] = {"partition": str(ref), "head": state, "objects": len(items)}
    metas: list[SegmentMeta] = []
    corrupt: list[str] = []
    for item in items:
        meta = found_meta(item) if item.error is None else item.error
        if isinstance(meta, str):
            corrupt.append(meta)
        else:
            metas.append(meta)
    plan = plan_chain(metas)
    prefix = keys.partition_data_prefix(*ref)
    row.update(corrupt=corrupt, orphans=[prefix + s.object_name for s in plan.unused])
    if plan.problem or not plan.chain:
        row["error"] = plan.problem or "no readable segment object"
        return row
    term = max(s.writer_term for s in plan.chain)
    m = edits.add_segments(PartitionManifest.new(ref.topic, ref.partition, ref.revision,
                                               term=term), plan.chain)
    try:
        if state == "corrupt" and etag is not None and (
                garbled := ctx.manifests.restore_garbled(*ref)) is not None:
            # its newest complete copy restores it exactly, cutoff included: better than a
            # listing can
            row.update(restored_from_copy=True, start_offset=garbled[0].log_start_offset,
                       last_offset=garbled[0].last_offset,
                       quarantined=_quarantine_key(ctx, ref, etag))
            return row
        if state == "corrupt" and etag is not None:
            row["quarantined"] = _commit_over_corrupt(ctx, m, etag)
        elif state == "misses_history" and etag is not None:
            # replace the head it read, by compare-and-swap: a writer's commit in between
            # wins, and the rebuild is simply run again; its term, cutoff and record stay
            current, _ = ctx.manifests.load(*ref)
            if current.next_offset > m.next_offset:
                row["error"] = (f"the listing ends at {m.last_offset}, below the head's "
                                f"{current.last_offset}: not replacing it")
                return row
            m = m.evolve(term=max(m.term, current.term), gc_cutoff_ms=current.gc_cutoff_ms,
                         collectable_below=current.collectable_below,
                         sequence=current.sequence)
            ctx.manifests.commit(m, etag)
        else:
            ctx.manifests.commit(m, None)
    except ManifestConflict as conflict:
        if state == "missing" and conflict.current is not None:
            # the head's copy restored it exactly: better than a listing can
            row.update(restored_from_copy=True, start_offset=conflict.current.log_start_offset,
                       last_offset=conflict.current.last_offset)
            return row
        row["error"] = f"not committed: the head changed meanwhile ({job_error(conflict)})"
        return row
    except (ManifestError, PreconditionFailed) as err:
        row["error"] = f"not committed: the head changed meanwhile ({job_error(err)})"
        return row
    log.info("%s: rebuilt manifest: %d segment(s), offsets %d..%d", ref, len(plan.chain),
             m.start_offset, m.last_offset)
    row.update(segments=len(plan.chain), start_offset=m.start_offset, last_offset=m.last_offset)
    return row


def _rebuild_topics(ctx: JobContext, refs: Iterable[PartitionRef]) -> tuple[list[str], list[str]]:
    """Recreate missing or unreadable topic manifests of the rebuilt partitions' topics.
    The partition count is the highest partition seen + 1 (empty partitions are invisible)."""
    count: dict[tuple[str, str], int] = {}
    for ref in refs:
        count[ref.topic, ref.revision] = max(count.get((ref.topic, ref.revision), 0),
                                             ref.partition + 1)
    made, problems = [], []
    for (topic, revision), n in sorted(count.items()):
        try:
            existing = load_topic_manifest(ctx.store, topic, revision)
        except ManifestError:
            existing = None
        if existing is not None:
            if existing.partition_count < n:
                problems.append(f"topic manifest of {topic} ({revision}) lists "
                                f"{existing.partition_count} partitions, objects exist for {n}")
            continue
        t = TopicManifest.from_topic_config(ctx.config.topic_config(topic), revision=revision,
                                            partition_count=n)
        save_topic_manifest(ctx.store, t)
        log.info("recreated topic manifest %s", t.key)
        made.append(t.key)
    return made, problems


def rebuild_manifests(ctx: JobContext, *, topic: str | None) -> dict[str, Any]:
    """Rebuild every missing or unreadable head manifest (of `topic`, or all) from the
    segment objects in the bucket; see the module doc. Intact heads are left alone."""
    started = time.monotonic()
    if topic is not None:
        keys.validate_topic_name(topic)
    sc = ctx.sc
    listing = sc.parallelize(list("0123456789abcdef"), 16).mapPartitions(
        map_with_store(ctx.settings, functools.partial(_list_prefix, topic)))
    by_ref: dict[PartitionRef, list[Found]] = defaultdict(list)
    for chunk in listing.collect():
        for item in chunk:
            by_ref[item.ref].append(item)
    states = {ref: _head_state(ctx, ref, by_ref[ref]) for ref in sorted(by_ref)}
    # a head of a newer release is its to keep: rebuilt from a listing by this one, it would
    # lose what the newer format records
    newer = sorted(str(r) for r, s in states.items() if s[0] == "newer")
    todo = [item for ref, items in sorted(by_ref.items())
            if states[ref][0] not in ("intact", "newer") for item in items]
    read = run_tasks(ctx, todo, "rebuild: reading segment objects", "tiered-rebuild",
                      _read_found, lambda f: f.size)
    grouped: dict[PartitionRef, list[Found]] = defaultdict(list)
    for item in read:
        grouped[item.ref].append(item)
    rows = [_rebuild_partition(ctx, ref, *states[ref], items)
            for ref, items in sorted(grouped.items())]
    made, problems = _rebuild_topics(ctx, by_ref)
    errors = [f"{r['partition']}: {r['error']}" for r in rows if "error" in r] + problems
    errors += [f"{ref}: its head manifest is in a newer format than this release reads; "
               "left as it is (upgrade tiered)" for ref in newer]
    # an unusable object is reported even when the chain did not need it (design invariant 5)
    errors += [f"{r['partition']}: unusable object: {c}" for r in rows for c in r["corrupt"]]
    return {
        "ok": not errors,
        "partitions_found": len(by_ref),
        "intact": sorted(str(r) for r, s in states.items() if s[0] == "intact"),
        "rebuilt": [r for r in rows if "error" not in r],
        "failed": [r for r in rows if "error" in r],
        "topic_manifests_created": made,
        "errors": errors,
        "elapsed_s": round(time.monotonic() - started, 3),
    }
