"""Remote retention and garbage collection of one partition's objects in the bucket.

Retention (seed 001 "Set retention limits"): `retention.ms` and `retention.bytes` (the topic's,
else the cluster's `log_retention_ms` / `retention_bytes`) both apply at once and the one that
removes more wins, measured over the whole cloud log, archived manifests included
(`retention_start_offset`, a pure function over the segments oldest first).

Order of effects (DESIGN invariant 7, seed 001 "Object storage housekeeping"):

1. the manifest's start offset moves first (a compare-and-swap commit); head segments below it
   move to the manifest's `replaced` list, stamped with the time;
2. replaced segments (retention's and merges') are deleted once `cloud_storage_gc_grace_period_ms`
   has passed since they were replaced, then dropped from the manifest (second commit);
3. archived manifests wholly below the start are deleted with every object they list once
   they have been seen expired for the grace period, then dropped from the head;
4. orphans (objects under the partition's prefixes that no manifest names: crash leftovers,
   uploads whose commit lost, invariant 8) older than the grace period are deleted.

The grace period lets in-flight readers of a dropped object finish and keeps GC away from an
object a writer has uploaded but not yet committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from archiver.space import RetentionLimits
from archiver.uploader import INDEX_KINDS
from manifests import keys, ops
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from tiered.store.base import ObjectInfo

log = logging.getLogger(__name__)


def retention_start_offset(
    segments: Callable[[], Iterable[SegmentMeta]], limits: RetentionLimits, now_ms: int
) -> int | None:
    """The new log start offset retention asks for, or None when nothing has expired.

    `segments()` yields the live segments oldest first (called at most twice, so a long
    archived history is streamed rather than held). By time, segments go oldest first while
    every record in them is older than `limits.ms` (Kafka stops at the first one that is
    not); by size, oldest first until the log is at or under `limits.bytes`. The larger
    removal wins."""
    new_start: int | None = None
    if limits.ms is not None:
        for seg in segments():
            if now_ms - seg.max_timestamp <= limits.ms:
                break
            new_start = seg.last_offset + 1
    if limits.bytes is not None:
        total = sum(seg.size_bytes for seg in segments())
        excess = total - limits.bytes
        freed = 0
        for seg in segments():
            if freed >= excess:
                break
            freed += seg.size_bytes
            new_start = max(new_start or 0, seg.last_offset + 1)
    return new_start


def object_names(seg: SegmentMeta) -> list[str]:
    """The segment object's name and those of the indexes that travel beside it."""
    return [seg.object_name] + [keys.index_name(seg.object_name, kind) for kind in INDEX_KINDS]


@dataclass
class HousekeepingOutcome:
    """What one housekeeping pass did for one partition."""

    manifest: PartitionManifest
    etag: str | None
    deleted_objects: int = 0
    commits: int = 0
    new_start_offset: int | None = None
    errors: list[str] = field(default_factory=list)


class GarbageCollector:
    """Housekeeping for the partitions of one writer. Remembers since when it has seen each
    archived manifest expired (in memory: after a restart the grace period starts again, which
    only delays deletion)."""

    def __init__(self, mstore: ManifestStore, *, grace_ms: int) -> None:
        self.mstore = mstore
        self.store = mstore.store
        self.grace_ms = grace_ms
        self._expired_seen: dict[str, int] = {}

    def housekeep(
        self,
        m: PartitionManifest,
        etag: str | None,
        *,
        term: int,
        limits: RetentionLimits | None,
        now_ms: int,
    ) -> HousekeepingOutcome:
        """Retention, replaced-segment GC, expired archives and orphans for the partition of
        `m` (committed as `etag`). Raises `StaleTerm` when a newer writer owns the partition
        and `ManifestConflict` when a commit lost its race (the caller reloads and retries next
        pass); store faults are reported in the outcome and leave the manifest consistent."""
        out = HousekeepingOutcome(ops.with_term(m, term), etag)
        committed = etag is not None  # else nothing to expire, but crash leftovers may exist
        if committed and limits is not None and (limits.ms is not None
                                                 or limits.bytes is not None):
            self._retention(out, limits, now_ms)
        # one listing of the data prefix per pass: deletions ask only for objects that exist
        # (a segment's .txnindex usually does not), and the orphan scan reads it
        prefix = keys.partition_data_prefix(m.topic, m.partition, m.revision)
        listing = list(self.store.list(prefix))
        known = {info.key for info in listing}
        if committed:
            self._replaced(out, now_ms, known)
            self._archives(out, now_ms, known)
        self._orphans(out, now_ms, [i for i in listing if i.key in known])
        return out

    def _commit(self, out: HousekeepingOutcome, new: PartitionManifest) -> None:
        if new == out.manifest:
            return
        result = self.mstore.commit(new, out.etag)
        out.manifest, out.etag = result.manifest, result.etag
        out.commits += 1

    def _delete(self, out: HousekeepingOutcome, keys_: list[str],
                known: set[str] | None = None) -> set[str]:
        """Delete `keys_` (only those in `known` when given, the others being absent
        already); returns the keys that are gone."""
        doomed = keys_ if known is None else [k for k in keys_ if k in known]
        if not doomed:
            return set(keys_)
        failed = set(self.store.delete_many(doomed))
        if failed:
            out.errors.append(f"{len(failed)} object(s) could not be deleted, e.g. "
                              f"{sorted(failed)[0]}")
        out.deleted_objects += len(doomed) - len(failed)
        if known is not None:
            known.difference_update(doomed)
        return set(keys_) - failed

    def _retention(self, out: HousekeepingOutcome, limits: RetentionLimits, now_ms: int) -> None:
        m = out.manifest
        new_start = retention_start_offset(lambda: self.mstore.iter_segments(m), limits, now_ms)
        if new_start is None or new_start <= m.log_start_offset:
            return
        log.info("%s/%d: remote retention moves the start offset %d -> %d", m.topic,
                 m.partition, m.log_start_offset, new_start)
        self._commit(out, ops.advance_start_offset(m, new_start, now_ms=now_ms))
        out.new_start_offset = new_start

    def _replaced(self, out: HousekeepingOutcome, now_ms: int, known: set[str]) -> None:
        m = out.manifest
        due = ops.replaced_due(m, now_ms=now_ms, grace_ms=self.grace_ms)
        if not due:
            return
        prefix = keys.partition_data_prefix(m.topic, m.partition, m.revision)
        doomed = {r.segment.object_name: [prefix + n for n in object_names(r.segment)]
                  for r in due}
        gone = self._delete(out, [k for ks in doomed.values() for k in ks], known)
        done = [name for name, ks in doomed.items() if set(ks) <= gone]
        self._commit(out, ops.drop_replaced(out.manifest, done))

    def _archives(self, out: HousekeepingOutcome, now_ms: int, known: set[str]) -> None:
        m = out.manifest
        count = 0
        for entry in ops.expired_archives(m):
            key = m.archive_key(entry)
            seen = self._expired_seen.setdefault(key, now_ms)
            if seen + self.grace_ms > now_ms:
                break
            prefix = keys.partition_data_prefix(m.topic, m.partition, m.revision)
            segment_keys: list[str] = []
            for obj in self.mstore.archive_objects(m, entry):
                if obj.segment is not None:
                    segment_keys.extend(prefix + n for n in object_names(obj.segment))
            # the objects first, the archived manifest that lists them last
            if set(segment_keys) - self._delete(out, segment_keys, known):
                break
            if key not in self._delete(out, [key]):
                break
            self._expired_seen.pop(key, None)
            count += 1
        if count:
            self._commit(out, ops.drop_expired_archives(out.manifest, count))

    def referenced_names(self, m: PartitionManifest) -> set[str]:
        """Every data object name the manifest reaches: head and replaced segments, every
        segment an archived manifest lists (expired ones included, until GC drops them), and
        the indexes beside each."""
        names: set[str] = set()
        for seg in m.segments:
            names.update(object_names(seg))
        for r in m.replaced:
            names.update(object_names(r.segment))
        for entry in m.archives:
            for obj in self.mstore.archive_objects(m, entry):
                if obj.segment is not None:
                    names.update(object_names(obj.segment))
        return names

    def _orphans(self, out: HousekeepingOutcome, now_ms: int, listing: list[ObjectInfo]
                 ) -> None:
        m = out.manifest
        prefix = keys.partition_data_prefix(m.topic, m.partition, m.revision)
        referenced = self.referenced_names(m)
        cutoff_s = (now_ms - self.grace_ms) / 1000
        orphans = [
            info.key for info in listing
            if info.key[len(prefix):] not in referenced and info.last_modified <= cutoff_s
        ]
        orphans += [info.key for info in self.mstore.unreferenced_archives(m)
                    if info.last_modified <= cutoff_s]
        if orphans:
            log.info("%s/%d: deleting %d orphaned object(s)", m.topic, m.partition,
                     len(orphans))
            self._delete(out, orphans)


__all__ = [
    "GarbageCollector",
    "HousekeepingOutcome",
    "object_names",
    "retention_start_offset",
]
