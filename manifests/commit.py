"""The manifest layer's I/O edge: load, compare-and-swap commit, archived-manifest reads.

Commit protocol (docs/format.md, "Commit protocol"):

1. read the head and its ETag in one GET;
2. refuse if the version being replaced was written by a newer term (`StaleTerm`);
3. plan the spillover and PUT every new archived manifest with If-None-Match (keys are
   content-addressed: an identical object already there is reused, a different one refused);
4. PUT the head with If-Match on the version read (If-None-Match for the first write);
5. on PreconditionFailed, re-read the head: our own retried write is success, a newer term is
   `StaleTerm`, anything else `ManifestConflict` carrying the fresh manifest.

`update` wraps 1-5 in the retry loop every writer uses: re-apply the change to the fresh head,
with jittered backoff, until a deadline. Archived manifests uploaded by a commit that then
loses its race are unreferenced; `manifests.collect` decides when they may go.

A commit that creates a head first asks `manifests.head_copies` whether a lost head is to be
restored or the partition stopped; every commit leaves a copy of the head beside it there.

One `ManifestStore` may be shared by threads; any number of writers may race on a partition:
each either wins the compare-and-swap or re-applies its change on top of the winner's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, NoReturn

import crc32c

from manifests import edits, keys
from manifests.archive_cache import ArchiveCache
from manifests.cas import put_on_version, retry_conflicts
from manifests.errors import (
    ArchiveKeyCollision,
    CorruptManifest,
    InvalidUpdate,
    ManifestConflict,
    ManifestContention,
    StaleTerm,
)
from manifests.head_copies import HeadCopies
from manifests.manifest import ArchivedManifest, PartitionManifest, manifest_problem
from manifests.model import ArchiveEntry, SegmentMeta
from manifests.serde import (
    decode_archived_manifest,
    decode_partition_manifest,
    encode_partition_manifest,
    head_format_version,
)
from manifests.spillover import ArchiveUpload, ManifestSettings, plan_spill
from tiered.store.base import ObjectInfo, ObjectStore
from tiered.store.errors import ObjectNotFound, PreconditionFailed

#: how long `update` keeps re-applying a change that loses its commit race, seconds
UPDATE_DEADLINE_S = 30.0
#: (key, ETag) -> (term, sequence) of versions this process read or wrote: the fencing
#: pre-check and the next sequence number come from the version actually replaced
KNOWN_VERSIONS = 4096


@dataclass
class ManifestStoreStats:
    """Counters for metrics."""

    head_reads: int = 0
    archive_reads: int = 0
    archive_uploads: int = 0
    commits: int = 0
    conflicts: int = 0
    fenced: int = 0
    #: heads restored from their copies after they went missing
    restored: int = 0


@dataclass(frozen=True)
class CommitResult:
    """What a successful commit wrote."""

    #: the head as committed (after spillover, `sequence` bumped): base the next change on it
    manifest: PartitionManifest
    #: its version token: pass as `expected_etag` to the next commit
    etag: str
    #: archived manifests uploaded for this commit, in upload order
    archived_keys: tuple[str, ...] = field(default=())
    #: when this commit created the head: how many objects the listing made first found
    #: under the partition's prefixes that garbage collection could take and the new head
    #: does not name; 0: the head names all of them. None: no listing was made
    unnamed: int | None = None


@dataclass(frozen=True)
class Updated:
    """What `ManifestStore.update` left in the bucket."""

    #: the head as stored now: the committed one, or the fresh one the change left alone
    manifest: PartitionManifest
    #: its version token; None when the partition has no head and nothing was written
    etag: str | None
    #: whether this call committed a new version
    committed: bool
    #: commit attempts made (1 when the first one won its race)
    attempts: int = 1
    archived_keys: tuple[str, ...] = ()
    #: see `CommitResult.unnamed`
    unnamed: int | None = None


class ArchivedObject(NamedTuple):
    """An object below an archive entry, in safe deletion order (see `archive_objects`)."""

    key: str
    #: the segment whose object `key` is; None for an archived manifest
    segment: SegmentMeta | None


class ManifestStore:
    """Head and archived manifests of many partitions in one object store."""

    def __init__(
        self,
        store: ObjectStore,
        settings: ManifestSettings | None = None,
        *,
        cache: ArchiveCache | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or ManifestSettings()
        self.cache = cache if cache is not None else ArchiveCache(self.settings.manifest_cache_size)
        self.stats = ManifestStoreStats()
        #: (key, ETag) -> (term, sequence, format version) of head versions seen
        self._versions: OrderedDict[tuple[str, str], tuple[int, int, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.head_copies = HeadCopies(self.store, self.stats, read_head=self._read_head,
                                      remember=self._remember,
                                      archive_keys=self.referenced_archive_keys)

    # -- head manifests ----------------------------------------------------------------------

    def load(
        self, topic: str, partition: int, revision: str | int
    ) -> tuple[PartitionManifest, str | None]:
        """The stored head manifest and its ETag, or a new empty manifest and None when the
        partition has none yet (commit it with `expected_etag=None`)."""
        key = keys.partition_manifest_key(topic, partition, revision)
        got = self._read_head(key)
        if got is None:
            return PartitionManifest.new(topic, partition, revision), None
        return got

    def _read_head(self, key: str) -> tuple[PartitionManifest, str] | None:
        """One consistent (manifest, ETag) in one GET: the store returns the version token of
        the very bytes it sent, so a concurrent commit cannot tear the pair."""
        self.stats.head_reads += 1
        try:
            data = self.store.get(key)
        except ObjectNotFound:
            return None
        m = decode_partition_manifest(data, key=key)
        if m.key != key:
            raise CorruptManifest(
                f"describes {m.topic}/{m.partition} revision {m.revision}, not this key's "
                "partition",
                key=key,
            )
        self._remember(key, data.etag, m)
        return m, data.etag

    def _remember(self, key: str, etag: str, m: PartitionManifest,
                  fmt: int | None = None) -> None:
        """Keep (term, sequence, format version) of the version `etag`; `fmt` when the caller
        knows it (it scans the head's segment column, so not under the shared lock)."""
        version = (m.term, m.sequence, head_format_version(m) if fmt is None else fmt)
        with self._lock:
            self._versions[(key, etag)] = version
            self._versions.move_to_end((key, etag))
            while len(self._versions) > KNOWN_VERSIONS:
                self._versions.popitem(last=False)

    def _base_version(self, m: PartitionManifest, expected_etag: str
                      ) -> tuple[int, int, int]:
        """(term, sequence, format version) of the stored version `expected_etag`, re-read
        if this process never saw it."""
        with self._lock:
            known = self._versions.get((m.key, expected_etag))
        if known is not None:
            return known
        got = self._read_head(m.key)
        if got is None or got[1] != expected_etag:
            self._lost(m, got)
        return got[0].term, got[0].sequence, head_format_version(got[0])

    def _lost(self, m: PartitionManifest, got: tuple[PartitionManifest, str] | None) -> NoReturn:
        """Raise what a lost race means: fenced if a newer term wrote the head, else conflict."""
        current, etag = got if got is not None else (None, None)
        if current is not None and current.term > m.term:
            self.stats.fenced += 1
            raise StaleTerm(m.key, current.term, m.term)
        self.stats.conflicts += 1
        raise ManifestConflict(m.key, current, etag)

    def commit(self, manifest: PartitionManifest, expected_etag: str | None) -> CommitResult:
        """Write `manifest` if the stored head is still the version `expected_etag` (None: no
        head stored yet). Spills first when the head has outgrown 2 x the spillover size.

        Raises `StaleTerm` when a newer term wrote (or would be replaced by) this head,
        `ManifestConflict` when another commit won the race (carrying the fresh head),
        `InvalidUpdate` for a manifest that breaks an invariant."""
        key = manifest.key
        base_sequence = 0
        base_format: int | None = None
        listed: set[str] | None = None
        if expected_etag is None:
            listed = self.head_copies.guard_fresh_head(manifest)
        if expected_etag is not None:
            base_term, base_sequence, base_format = self._base_version(manifest,
                                                                       expected_etag)
            if base_term > manifest.term:
                self.stats.fenced += 1
                raise StaleTerm(key, base_term, manifest.term)
        problem = manifest_problem(manifest)
        if problem:
            raise InvalidUpdate(f"{key}: refusing to commit an invalid manifest: {problem}")
        plan = plan_spill(manifest, self.settings.spillover_size)
        for upload in plan.uploads:
            self._upload_archive(upload)
        new = plan.manifest.evolve(sequence=base_sequence + 1)
        data = encode_partition_manifest(new)
        try:
            etag = put_on_version(self.store, key, data, expected_etag)
        except PreconditionFailed:
            got = self._read_head(key)
            if got is None or encode_partition_manifest(got[0]) != data:
                self._lost(manifest, got)
            # our own write landed, then a retried request of the same PUT saw it: success
            etag = got[1]
        self.stats.commits += 1
        new_format = head_format_version(new)
        self._remember(key, etag, new, new_format)
        # a head raised to a newer format leaves no copy of the older one: a release that
        # cannot read the new head would take such a copy for the newest whole version and
        # restore it over the head (docs/format.md, "Versioning")
        raised = base_format is not None and new_format > base_format
        self.head_copies.keep(new, data, every_slot=raised)
        for upload in plan.uploads:
            self.cache.put(upload.key, upload.manifest)
        unnamed = None
        if listed is not None:
            unnamed = len(_collectable(new, listed) - {u.key for u in plan.uploads} - {
                keys.object_key(new.topic, new.partition, new.revision, name)
                for seg in new.segments for name in keys.with_indexes(seg.object_name)})
        return CommitResult(new, etag, tuple(u.key for u in plan.uploads), unnamed)

    # -- losing the head: copies, restore, refusal (docs/format.md, "Losing objects") -----

    def lost_history(self, empty: PartitionManifest) -> str | None:
        """See `HeadCopies.lost_history`: why a missing head was lost, read-only."""
        return self.head_copies.lost_history(empty)

    def restore_head(self, empty: PartitionManifest) -> tuple[PartitionManifest, str] | None:
        """See `HeadCopies.restore_head`: a missing head restored from its copy."""
        return self.head_copies.restore_head(empty)

    def restore_garbled(self, topic: str, partition: int, revision: str | int
                        ) -> tuple[PartitionManifest, str] | None:
        """See `HeadCopies.restore_garbled`: an unreadable head replaced by its copy."""
        return self.head_copies.restore_garbled(topic, partition, revision)

    def update(
        self,
        topic: str,
        partition: int,
        revision: str | int,
        change: Callable[[PartitionManifest], PartitionManifest | None],
        *,
        start: tuple[PartitionManifest, str | None] | None = None,
        deadline_s: float = UPDATE_DEADLINE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Updated:
        """Load the head, apply `change` (pure: it sees the current manifest, returns the new
        one, or None / the same manifest for "nothing to do") and commit it by compare-and-
        swap; on a lost race re-read and re-apply, with jittered backoff, until `deadline_s`.

        `start` is a (manifest, ETag) the caller believes current, tried first to save a read;
        a lost race replaces it with the bucket's. A change that writes as a term applies
        `edits.with_term` itself, and so raises `StaleTerm` once a newer term owns the partition
        (a commit refused for the term is otherwise just a lost race: re-applied on the fresh
        head). Raises `ManifestContention` when races were still being lost at the deadline,
        whatever `change` raises (`StaleTerm`, `InvalidUpdate`, ...) at once, and
        `CorruptManifest` / store errors from the reads."""
        pending = [start] if start is not None else []
        tries = 0

        def attempt() -> Updated:
            nonlocal tries
            tries += 1
            m, etag = pending.pop() if pending else self.load(topic, partition, revision)
            new = change(m)
            if new is None or new == m:
                return Updated(m, etag, committed=False)
            try:
                result = self.commit(new, etag)
            except ManifestConflict as conflict:
                if conflict.current is not None and conflict.etag is not None:
                    pending.append((conflict.current, conflict.etag))  # the fresh read
                raise
            except StaleTerm as fenced:
                # a newer term wrote since `m` was read: re-apply on the fresh head, where a
                # change that writes as a term (`edits.with_term`) raises StaleTerm itself
                raise ManifestConflict(fenced.key, None, None) from fenced
            return Updated(result.manifest, result.etag, True, archived_keys=result.archived_keys,
                           unnamed=result.unnamed)

        try:
            done = retry_conflicts(attempt, conflict=ManifestConflict,
                                      deadline_s=deadline_s, sleep=sleep)
        except ManifestConflict as last:
            raise ManifestContention(last, tries, deadline_s) from None
        return dataclasses.replace(done, attempts=tries)

    def _upload_archive(self, upload: ArchiveUpload) -> None:
        self.stats.archive_uploads += 1
        try:
            self.store.put(upload.key, upload.data, if_none_match=True)
        except PreconditionFailed:
            if self.store.get(upload.key) != upload.data:
                raise ArchiveKeyCollision(
                    f"{upload.key}: already holds a different archived manifest; refusing to "
                    "overwrite it"
                ) from None

    # -- archived manifests ------------------------------------------------------------------

    def archived(self, m: PartitionManifest, entry: ArchiveEntry) -> ArchivedManifest:
        """The archived manifest `entry` (listed by `m` or by one of its index manifests)
        describes: from the cache, else one GET, verified against the entry's checksum and
        ranges before it is trusted or cached."""
        key = m.archive_key(entry)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        self.stats.archive_reads += 1
        try:
            data = self.store.get(key)
        except ObjectNotFound:
            raise CorruptManifest(
                "archived manifest listed by the head manifest is missing", key=key
            ) from None
        actual = crc32c.crc32c(data)
        if actual != entry.checksum:
            raise CorruptManifest(
                f"checksum mismatch: CRC-32C {actual:08x}, listed as {entry.checksum:08x}", key=key
            )
        a = decode_archived_manifest(data, key=key)
        if (a.topic, a.partition, a.revision) != (m.topic, m.partition, m.revision) or a.entry(
            actual
        ) != entry:
            raise CorruptManifest("does not match the entry that lists it", key=key)
        self.cache.put(key, a)
        return a

    def find_offset(self, m: PartitionManifest, offset: int) -> SegmentMeta:
        """The segment holding `offset`: the head first, then the one archived manifest (per
        index level) whose range covers it. Raises `OffsetOutOfRange`."""
        hit = edits.find_offset(m, offset)
        while isinstance(hit, ArchiveEntry):
            found = self.archived(m, hit).find(offset)
            if found is None:
                raise CorruptManifest(
                    f"offset {offset} is in the listed range but in no row", key=m.archive_key(hit)
                )
            hit = found
        return hit

    def find_timestamp(self, m: PartitionManifest, timestamp: int) -> SegmentMeta | None:
        """The first live segment whose max timestamp is >= `timestamp` (it holds the first
        record at or after it), or None when every record is older. Reads only archives whose
        max timestamp reaches `timestamp`."""
        start = m.log_start_offset
        for item in edits.iter_from(m, start):
            if item.max_timestamp < timestamp:
                continue
            if isinstance(item, SegmentMeta):
                return item
            found = self._find_timestamp_in(m, item, timestamp, start)
            if found is not None:
                return found
        return None

    def _find_timestamp_in(
        self, m: PartitionManifest, entry: ArchiveEntry, timestamp: int, start: int
    ) -> SegmentMeta | None:
        node = self.archived(m, entry)
        i = 0
        while (hit := edits.node_find_timestamp(node, timestamp, start, i)) is not None:
            i, row = hit
            if isinstance(row, SegmentMeta):
                return row
            found = self._find_timestamp_in(m, row, timestamp, start)
            if found is not None:
                return found
            i += 1
        return None

    def iter_segments(self, m: PartitionManifest, from_offset: int = 0) -> Iterator[SegmentMeta]:
        """Every live segment holding offsets >= `from_offset`, in offset order, reading
        archived manifests one at a time as the iteration reaches them."""
        start = max(from_offset, m.log_start_offset)
        for item in edits.iter_from(m, start):
            if isinstance(item, ArchiveEntry):
                yield from self._iter_archive(m, item, start)
            else:
                yield item

    def _iter_archive(
        self, m: PartitionManifest, entry: ArchiveEntry, start: int
    ) -> Iterator[SegmentMeta]:
        for item in edits.node_iter_from(self.archived(m, entry), start):
            if isinstance(item, ArchiveEntry):
                yield from self._iter_archive(m, item, start)
            else:
                yield item

    # -- garbage collection support ----------------------------------------------------------

    def archive_objects(
        self, m: PartitionManifest, entry: ArchiveEntry
    ) -> Iterator[ArchivedObject]:
        """Every object below `entry` (an expired archive, see `edits.expired_archives`): each
        segment object before the archived manifest listing it, children before index
        manifests, so deleting in this order never leaves a listed object missing."""
        node = self.archived(m, entry)
        if node.level == 0:
            for seg in node.segments:
                yield ArchivedObject(m.segment_key(seg), seg)
        else:
            for child in node.children:
                yield from self.archive_objects(m, child)
        yield ArchivedObject(m.archive_key(entry), None)

    def referenced_archive_keys(self, m: PartitionManifest) -> set[str]:
        """Keys of every archived manifest reachable from `m` (reads index manifests only)."""
        found: set[str] = set()
        expired = set(edits.expired_archives(m))
        pending = list(m.archives)
        while pending:
            entry = pending.pop()
            found.add(m.archive_key(entry))
            if entry.level > 0:
                try:
                    pending.extend(self.archived(m, entry).children)
                except CorruptManifest:
                    if entry not in expired:
                        raise  # retention deletes expired ones before dropping their entry
        return found

    def unreferenced_archives(self, m: PartitionManifest) -> list[ObjectInfo]:
        """Archived manifests under `m`'s prefix that `m` does not reach: left by commits that
        lost their race or crashed, or by GC interrupted after dropping an entry. Callers
        delete those older than the grace period (a concurrent commit may be about to list a
        fresh one)."""
        prefix = keys.partition_meta_prefix(m.topic, m.partition, m.revision)
        referenced = self.referenced_archive_keys(m)
        return [
            info
            for info in self.store.list(prefix)
            if keys.parse_archived_manifest_name(info.key[len(prefix) :]) is not None
            and info.key not in referenced
        ]


def _collectable(m: PartitionManifest, listed: set[str]) -> set[str]:
    """The keys of `listed` garbage collection could ever take for `m`'s partition: all under
    its data prefix, and the archived manifests under its meta prefix (the head, its copies
    and the lease are never collected)."""
    data = keys.partition_data_prefix(m.topic, m.partition, m.revision)
    meta = keys.partition_meta_prefix(m.topic, m.partition, m.revision)
    return {k for k in listed if k.startswith(data) or (
        k.startswith(meta) and keys.parse_archived_manifest_name(k[len(meta):]) is not None)}

