"""Collecting orphans: objects under a partition's prefixes that no manifest names.

Deleting by key cannot be made conditional on what a manifest says, and a collector may pause
for any length of time between deciding and deleting, so "unreferenced now" is not enough: the
object must also be one no writer can ever reference again. docs/format.md ("Garbage
collection") gives the argument; in short, every orphan falls in one class:

* **dead**: no commit can ever name it again, whatever happens next. An appended segment
  (default name `{base}-{last}-{term}.log`, and its indexes) below the head's next offset
  (`add_segments` takes only the next offset, which never goes back) or written by a term
  older than the head's (that writer is fenced). A level-0 archived manifest starting below
  the head's first segment (spillover archives only the oldest head segments, and the head's
  first offset never goes back); an index manifest likewise, unless the head still lists,
  one level down or lower, an entry starting where it starts (it could be folded again).
* **cutoff**: any other name of ours (a merge's or compaction's replacement object). The
  collector first commits `gc_cutoff_ms` >= the object's last-modified time onto the very head
  version it decided from, and only then deletes; a writer may newly reference an object only
  if it is younger than the cutoff of the head it commits onto (`edits.check_not_collected`).
  Replacement names carry a random part, so a deleted name is never created again.
* **kept**: the frontier (an appended segment at or past the next offset by the current term:
  a writer may be about to commit it; it becomes dead once the log moves past it), the head
  manifest itself, and names that are not ours.

Everything is decided from one listing followed by one fresh read of the head and every
archived manifest it reaches; the caller's copy of the manifest is never used. No head, no
collection: a partition whose head is missing is recovery's to rebuild, not GC's to empty.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from manifests import edits, keys
from manifests.commit import ManifestStore
from manifests.errors import CorruptManifest, ManifestConflict, StaleTerm
from manifests.head_copies import list_partition
from manifests.manifest import PartitionManifest
from tiered.store.base import ObjectInfo

log = logging.getLogger(__name__)


class Verdict(enum.Enum):
    """What collection may do with one unreferenced object."""

    DEAD = "dead"
    CUTOFF = "cutoff"
    KEEP = "keep"
    #: below the head's start with no recorded reason: history the head lost, never collected,
    #: and an anomaly that stops collection for the partition
    HISTORY = "history"


@dataclass(frozen=True)
class HeadFacts:
    """The parts of a head manifest the verdicts depend on (pure data, for unit tests)."""

    term: int
    next_offset: int
    #: base offset of the first head segment, or the next offset when the head lists none
    first_head_offset: int
    #: (base offset, level) of every archive entry the head itself lists
    top_entries: frozenset[tuple[int, int]]
    #: the log's first offset in the bucket, and the offset below which the head records that
    #: the log was cut on purpose (`collectable_below`)
    log_start: int = 0
    collectable_below: int = 0

    @classmethod
    def of(cls, m: PartitionManifest) -> HeadFacts:
        first = m.segments.first_base() if m.segments else m.next_offset
        return cls(m.term, m.next_offset, first,
                   frozenset((e.base_offset, e.level) for e in m.archives),
                   m.log_start_offset, m.collectable_below)

    def below_start(self, base_offset: int, last_offset: int) -> Verdict | None:
        """The verdict on an object of offsets `base..last` that starts below the log start:
        dead when the head records why those offsets left the log, else history it lost.
        None for an object at or past the start."""
        if base_offset >= self.log_start:
            return None
        return Verdict.DEAD if last_offset < self.collectable_below else Verdict.HISTORY


def data_verdict(name: str, head: HeadFacts) -> Verdict:
    """The verdict for an unreferenced object named `name` under the data prefix."""
    segment = keys.segment_name_of(name)
    if segment is None:
        return Verdict.KEEP  # not a segment or index: not ours to judge
    named = keys.parse_segment_name(segment)
    if named is not None and (below := head.below_start(named.base_offset,
                                                        named.last_offset)) is not None:
        return below  # a head starting later is no reason to collect what lies below it
    if not edits.is_append_name(name):
        return Verdict.CUTOFF
    parsed = keys.parse_segment_name(segment)
    assert parsed is not None  # is_append_name parsed it
    if parsed.base_offset < head.next_offset or parsed.term < head.term:
        return Verdict.DEAD
    return Verdict.KEEP


def archive_verdict(name: str, head: HeadFacts) -> Verdict:
    """The verdict for an unreferenced object named `name` under the meta prefix."""
    parsed = keys.parse_archived_manifest_name(name)
    if parsed is None:
        return Verdict.KEEP  # the head manifest, its copies, or not ours
    below = head.below_start(parsed.base_offset, parsed.last_offset)
    if below is Verdict.HISTORY:
        return below
    if parsed.base_offset >= head.first_head_offset:
        return Verdict.KEEP  # a spill of the current head may be about to list it
    if parsed.level > 0 and any(
        base == parsed.base_offset and level < parsed.level for base, level in head.top_entries
    ):
        return Verdict.KEEP  # its first child may still be folded into it again
    return Verdict.DEAD


def store_time_ms(last_modified: float) -> int:
    """A store last-modified time as compared with `gc_cutoff_ms`: rounded up to the whole
    second, since S3 reports it to the second in one place (HEAD) and finer in another (a
    listing). Both sides round the same way, so an object is never younger than itself."""
    return math.ceil(last_modified) * 1000


def cutoff_for(infos: Iterable[ObjectInfo]) -> int:
    """The cutoff (ms, store clock) that covers every object in `infos`."""
    return max((store_time_ms(i.last_modified) for i in infos), default=0)


def unjudged_keys(topic: str, partition: int, revision: str | int) -> frozenset[str]:
    """The objects of a partition no collection ever judges, each rewritten in place as it
    works (commits, lease changes): the head, its copies and the lease."""
    head = keys.partition_manifest_key(topic, partition, revision)
    return frozenset((head, *keys.head_copy_keys(head),
                      keys.partition_lease_key(topic, partition, revision)))


class Fingerprint:
    """`listing_fingerprint` built one object at a time, as a listing yields them: keys in
    ascending order (S3's, and the file store's), or the fingerprint is void."""

    def __init__(self) -> None:
        self._digest = hashlib.blake2b(digest_size=16)
        self._last: str | None = None
        self._in_order = True

    def add(self, key: str, etag: str) -> None:
        if self._last is not None and key <= self._last:
            self._in_order = False
        self._last = key
        self._digest.update(f"{key}\0{etag}\n".encode())

    def digest(self) -> bytes | None:
        """The fingerprint; None when the keys did not come in ascending order."""
        return self._digest.digest() if self._in_order else None


def listing_fingerprint(pairs: Iterable[tuple[str, str]]) -> bytes:
    """A digest of (key, ETag) pairs, in any order: two listings with the same fingerprint
    hold the same objects in the same versions (callers leave out `unjudged_keys`)."""
    fingerprint = Fingerprint()
    for key, etag in sorted(pairs):
        fingerprint.add(key, etag)
    # b"" (a key listed twice) matches no census: the partition keeps its full passes
    return fingerprint.digest() or b""


@dataclass
class Collected:
    """What one collection of one partition did."""

    deleted: list[str] = field(default_factory=list)
    #: candidates left for a later pass, and why
    deferred: dict[str, str] = field(default_factory=dict)
    #: the cutoff committed (0: none needed)
    cutoff_ms: int = 0
    errors: list[str] = field(default_factory=list)
    #: why nothing was considered at all (no head)
    skipped: str | None = None
    #: history below the head's start that no record explains: nothing was collected
    anomaly: str | None = None
    #: unreferenced objects a later pass may collect: too young yet, or deferred by a lost
    #: race for the cutoff commit
    pending: int = 0
    #: `listing_fingerprint` of what the collection judged and left in place (the listing
    #: but the deleted, and `unjudged_keys`); None when it did not judge them all
    fingerprint: bytes | None = None


def referenced_data_names(mstore: ManifestStore, m: PartitionManifest) -> set[str]:
    """Every data object name `m` reaches: head and replaced segments, every segment an
    archived manifest lists (expired ones too, until retention drops them), and the indexes
    beside each."""
    names: set[str] = set()

    def add(object_name: str) -> None:
        names.update(keys.with_indexes(object_name))

    for name in m.segments.object_names():
        add(name)
    for r in m.replaced:
        add(r.segment.object_name)
    expired = set(edits.expired_archives(m))
    for entry in m.archives:
        try:
            for obj in mstore.archive_objects(m, entry):
                if obj.segment is not None:
                    add(obj.segment.object_name)
        except CorruptManifest:
            if entry not in expired:
                raise
            # retention deletes an expired archive before it drops the entry: what it
            # listed is below the log start, being deleted too
    return names


def collect_orphans(
    mstore: ManifestStore,
    topic: str,
    partition: int,
    revision: str | int,
    *,
    now_ms: int,
    grace_ms: int,
    only: Collection[str] | None = None,
) -> Collected:
    """Delete the partition's orphans older than `grace_ms` that are safe to delete (see the
    module docstring); `only` limits the candidates to those keys. Store faults propagate;
    a lost race for the cutoff commit defers the cutoff class to a later pass."""
    out = Collected()
    data_prefix = keys.partition_data_prefix(topic, partition, revision)
    meta_prefix = keys.partition_meta_prefix(topic, partition, revision)
    # listing first, then the head: an object committed in between is seen as referenced
    data, meta = list_partition(mstore.store, topic, partition, revision)
    listing = [*data, *meta]
    m, etag = mstore.load(topic, partition, revision)
    if etag is None:
        out.skipped = "no head manifest (recovery rebuilds it; nothing is collected without it)"
        return out
    referenced = {data_prefix + n for n in referenced_data_names(mstore, m)}
    referenced |= mstore.referenced_archive_keys(m)
    referenced.add(m.key)
    head = HeadFacts.of(m)
    old_enough = (now_ms - grace_ms) / 1000
    dead: list[str] = []
    by_cutoff: list[ObjectInfo] = []
    history: list[str] = []
    for info in listing:
        if info.key in referenced:
            continue
        if only is not None and info.key not in only:
            continue
        if info.key.startswith(data_prefix):
            verdict = data_verdict(info.key[len(data_prefix):], head)
        else:
            verdict = archive_verdict(info.key[len(meta_prefix):], head)
        if info.last_modified > old_enough:
            # the head and its copies (kept, under the meta prefix) are never collected
            out.pending += verdict is not Verdict.KEEP or info.key.startswith(data_prefix)
            continue
        if verdict is Verdict.HISTORY:
            history.append(info.key)
        elif verdict is Verdict.DEAD:
            dead.append(info.key)
        elif verdict is Verdict.CUTOFF:
            by_cutoff.append(info)
        else:
            out.deferred[info.key] = "may still be committed by a writer in flight"
    if history:
        # the head starts above objects of ours and records no reason: it lost history (a
        # head deleted and created anew, a stale copy). Collect nothing until it is repaired
        out.anomaly = (f"{len(history)} object(s) below the head's start offset "
                       f"{head.log_start} that no recorded retention explains, e.g. "
                       f"{sorted(history)[0]}: the head lost history; collection stops for the "
                       f"partition until `tiered recover --rebuild-manifests --topic {topic}` "
                       "restores it")
        log.error("%s/%d: %s", topic, partition, out.anomaly)
        out.errors.append(out.anomaly)
        return out
    if by_cutoff:
        cutoff = cutoff_for(by_cutoff)
        if cutoff > m.gc_cutoff_ms:
            try:
                # onto the very version the decision was made from: a commit that named one
                # of these objects since would make this lose its race
                mstore.commit(edits.raise_gc_cutoff(m, cutoff), etag)
                out.cutoff_ms = cutoff
            except (ManifestConflict, StaleTerm) as exc:
                for info in by_cutoff:
                    out.deferred[info.key] = f"the manifest changed during collection ({exc})"
                out.pending += len(by_cutoff)
                by_cutoff = []
    doomed = dead + [info.key for info in by_cutoff]
    if doomed:
        log.info("%s/%d: deleting %d orphaned object(s) (%d below the log's end or of a fenced "
                 "term, %d behind the collection cutoff)", topic, partition, len(doomed),
                 len(dead), len(by_cutoff))
        failed = set(mstore.store.delete_many(doomed))
        out.deleted = [k for k in doomed if k not in failed]
        if failed:
            out.errors.append(f"{len(failed)} orphan(s) could not be deleted, e.g. "
                              f"{sorted(failed)[0]}")
    if only is None:
        left_out = unjudged_keys(topic, partition, revision) | set(out.deleted)
        out.fingerprint = listing_fingerprint(
            (i.key, i.etag) for i in listing if i.key not in left_out)
    return out


__all__ = [
    "Collected",
    "Fingerprint",
    "HeadFacts",
    "Verdict",
    "archive_verdict",
    "collect_orphans",
    "cutoff_for",
    "data_verdict",
    "listing_fingerprint",
    "referenced_data_names",
    "store_time_ms",
    "unjudged_keys",
]
