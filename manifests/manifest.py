"""Head (partition) manifests and archived manifests.

A partition's history is split in two regions:

* the **archive region**, `[archive_clean_offset, start_offset)`, described by archived
  manifests in the bucket that the head lists in `archives` (offset and timestamp ranges,
  sizes, checksums), and
* the **head region**, `[start_offset or the first segment's base, last_offset]`, whose
  segments the head lists itself.

Offsets at or after `log_start_offset` are readable. Retention inside the archive region only
moves `archive_start_offset` (archived objects are immutable); garbage collection later deletes
whole expired archives and moves `archive_clean_offset` up to the next listed one. Every
manifest that leaves this module satisfies `manifest_problem(m) is None`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from manifests import keys
from manifests.model import (
    ArchiveEntry,
    ArchiveTable,
    ReplacedSegment,
    SegmentMeta,
    SegmentTable,
    contiguity_problem,
)


@dataclass(frozen=True, slots=True)
class PartitionManifest:
    """The head manifest of one partition: what its writer commits by compare-and-swap."""

    topic: str
    partition: int
    #: topic id / revision: a recreated topic gets a new one, so keys never collide
    revision: str
    #: term of the writer that committed it; only grows (fencing, design invariant 6)
    term: int = 0
    #: commit counter, +1 per commit: no two committed versions have equal bytes
    sequence: int = 0
    #: first live offset of the head region
    start_offset: int = 0
    #: last offset covered, inclusive; -1 while nothing was ever added
    last_offset: int = -1
    #: first live offset of the archive region (the log start while that region is live)
    archive_start_offset: int = 0
    #: first offset whose archived objects may still exist (base of the first listed archive)
    archive_clean_offset: int = 0
    #: total bytes of segment objects listed (head segments and archives; not `replaced`)
    cloud_bytes: int = 0
    segments: SegmentTable = field(default_factory=SegmentTable.empty)
    #: dropped segments awaiting deletion after the grace period
    replaced: tuple[ReplacedSegment, ...] = ()
    archives: ArchiveTable = field(default_factory=ArchiveTable.empty)
    #: garbage collection's high-water mark, ms since the epoch on the store's clock (whole
    #: seconds): an object last modified at or before it may be deleted by a collector that
    #: found it unreferenced, so no writer may newly reference such an object (only grows;
    #: docs/format.md, "Garbage collection")
    gc_cutoff_ms: int = 0
    #: every offset below it left the log for a recorded reason (remote retention, a recorded
    #: truncation): an unreferenced object of ours wholly below it may be collected, one
    #: below the log start and not below it is history no record explains, and is kept
    #: (only grows; docs/format.md, "Garbage collection")
    collectable_below: int = 0

    @classmethod
    def new(
        cls, topic: str, partition: int, revision: str | int, *, term: int = 0
    ) -> PartitionManifest:
        """An empty manifest for a partition that has nothing in the bucket yet."""
        keys.validate_topic_name(topic)
        keys.validate_partition(partition)
        if type(term) is not int or term < 0:
            raise keys.InvalidName(f"term must be a non-negative integer, got {term!r}")
        return cls(topic, partition, keys.validate_revision(revision), term=term)

    def evolve(self, **changes: Any) -> PartitionManifest:
        return dataclasses.replace(self, **changes)

    # -- derived -----------------------------------------------------------------------------

    @property
    def key(self) -> str:
        return keys.partition_manifest_key(self.topic, self.partition, self.revision)

    @property
    def archive_live(self) -> bool:
        """Whether some archived offset is still readable (at or after the log start)."""
        return bool(self.archives) and self.archive_start_offset <= self.archives.last_last()

    @property
    def log_start_offset(self) -> int:
        """The first readable offset of the partition in the bucket."""
        return self.archive_start_offset if self.archive_live else self.start_offset

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def data_prefix(self) -> str:
        """Where this partition's segment and index objects live (`keys.partition_data_prefix`)."""
        return keys.partition_data_prefix(self.topic, self.partition, self.revision)

    def segment_key(self, segment: SegmentMeta) -> str:
        """The object key of one of this partition's segments."""
        return keys.object_key(self.topic, self.partition, self.revision, segment.object_name)

    def archive_key(self, entry: ArchiveEntry) -> str:
        """The object key of one of this partition's archived manifests."""
        return keys.partition_meta_prefix(self.topic, self.partition, self.revision) + entry.name


@dataclass(frozen=True, slots=True)
class ArchivedManifest:
    """An immutable archived manifest: level 0 lists segments, level n >= 1 lists level n-1
    archived manifests (an index node; only very long histories have them)."""

    topic: str
    partition: int
    revision: str
    #: term of the writer that archived it
    term: int
    level: int
    segments: SegmentTable = field(default_factory=SegmentTable.empty)
    children: ArchiveTable = field(default_factory=ArchiveTable.empty)

    @property
    def rows(self) -> SegmentTable | ArchiveTable:
        return self.segments if self.level == 0 else self.children

    @property
    def base_offset(self) -> int:
        return self.rows.first_base()

    @property
    def last_offset(self) -> int:
        return self.rows.last_last()

    def find(self, offset: int) -> SegmentMeta | ArchiveEntry | None:
        """The segment (level 0) or child archive holding `offset`, or None."""
        rows = self.rows
        i = rows.find(offset)
        return None if i is None else rows[i]

    def entry(self, checksum: int) -> ArchiveEntry:
        """The entry describing this manifest, given the CRC-32C of its serialized bytes."""
        if self.level == 0:
            t = self.segments
            size, count = t.total("size_bytes"), len(t)
        else:
            c = self.children
            size, count = c.total("size_bytes"), c.total("segment_count")
        rows = self.rows
        return ArchiveEntry(
            base_offset=rows.first_base(),
            last_offset=rows.last_last(),
            base_timestamp=rows.column("base_timestamp")[0],
            max_timestamp=max(rows.column("max_timestamp")),
            size_bytes=size,
            segment_count=count,
            checksum=checksum,
            level=self.level,
        )

    def memory_bytes(self) -> int:
        return 200 + self.segments.memory_bytes() + self.children.memory_bytes()


# -- invariants --------------------------------------------------------------------------------


def segment_problem(seg: SegmentMeta, term: int | None = None) -> str | None:
    """Why one segment's metadata is impossible, or None."""
    for name in ("base_offset", "last_offset", "size_bytes", "segment_term", "writer_term"):
        value = getattr(seg, name)
        if type(value) is not int or value < 0:
            return f"{name} must be a non-negative integer, got {value!r}"
    for name in ("base_timestamp", "max_timestamp"):
        value = getattr(seg, name)
        if type(value) is not int or value < -1:
            return f"{name} must be an integer >= -1, got {value!r}"
    if seg.last_offset < seg.base_offset:
        return f"last offset {seg.last_offset} is before base offset {seg.base_offset}"
    if seg.max_timestamp < seg.base_timestamp:
        return f"max timestamp {seg.max_timestamp} is before base timestamp {seg.base_timestamp}"
    if type(seg.checksum) is not int or not 0 <= seg.checksum <= 0xFFFFFFFF:
        return f"checksum must be an unsigned 32-bit integer, got {seg.checksum!r}"
    if type(seg.compacted) is not bool:
        return f"compacted must be a bool, got {seg.compacted!r}"
    if seg.name:
        try:
            keys.validate_object_name(seg.name)
        except keys.InvalidName as exc:
            return str(exc)
    if term is not None and seg.writer_term > term:
        return (
            f"uploaded by term {seg.writer_term}, newer than the manifest's term {term} "
            "(a writer cannot commit objects of a future term)"
        )
    return None


def _segments_problem(segs: SegmentTable, term: int) -> str | None:
    """Column checks over a whole table (C-speed min/max instead of per-row objects)."""
    if not segs:
        return None
    for name in ("size_bytes", "segment_term", "writer_term", "compacted"):
        if min(segs.column(name)) < 0:
            return f"segments: negative {name}"
    if max(segs.column("compacted")) > 1:
        return "segments: compacted must be 0 or 1"
    checks = segs.column("checksum")
    if min(checks) < 0 or max(checks) > 0xFFFFFFFF:
        return "segments: checksum is not an unsigned 32-bit value"
    if max(segs.column("writer_term")) > term:
        return f"segments: a segment was uploaded by a term newer than the manifest's ({term})"
    for i, name in enumerate(segs.extra):
        if name:
            try:
                keys.validate_object_name(name)
            except keys.InvalidName as exc:
                return f"segments {i}: {exc}"
    return contiguity_problem(segs, "segment")


def _archives_problem(arch: ArchiveTable) -> str | None:
    if not arch:
        return None
    for name in ("size_bytes", "level", "checksum"):
        if min(arch.column(name)) < 0:
            return f"archives: negative {name}"
    if min(arch.column("segment_count")) < 1:
        return "archives: an archived manifest must describe at least one segment"
    if max(arch.column("checksum")) > 0xFFFFFFFF:
        return "archives: checksum is not an unsigned 32-bit value"
    return contiguity_problem(arch, "archive")


def manifest_problem(m: PartitionManifest) -> str | None:
    """Why `m` breaks an invariant of the format (docs/format.md, "Invariants"), or None."""
    for name in (
        "term",
        "sequence",
        "cloud_bytes",
        "start_offset",
        "archive_start_offset",
        "archive_clean_offset",
    ):
        value = getattr(m, name)
        if type(value) is not int or value < 0:
            return f"{name} must be a non-negative integer, got {value!r}"
    if type(m.last_offset) is not int or m.last_offset < -1:
        return f"last_offset must be an integer >= -1, got {m.last_offset!r}"
    problem = _segments_problem(m.segments, m.term) or _archives_problem(m.archives)
    if problem:
        return problem
    segs, arch = m.segments, m.archives
    if segs:
        if segs.last_last() != m.last_offset:
            return f"last_offset {m.last_offset} is not the last segment's {segs.last_last()}"
        if not segs.first_base() <= m.start_offset <= segs.last_offsets[0]:
            return (
                f"start_offset {m.start_offset} is not inside the first segment "
                f"{segs.first_base()}..{segs.last_offsets[0]}"
            )
    elif m.start_offset != m.last_offset + 1 and not (m.last_offset == -1 and not arch):
        return f"start_offset {m.start_offset} of an empty head must be last_offset + 1"
    if arch:
        boundary = arch.last_last() + 1
        if segs and segs.first_base() != boundary:
            return (
                f"the first head segment starts at {segs.first_base()} but the archives end at "
                f"{boundary - 1}"
            )
        if not segs and m.last_offset != boundary - 1:
            return f"last_offset {m.last_offset} is not the last archive's {boundary - 1}"
        if m.archive_clean_offset != arch.first_base():
            return (
                f"archive_clean_offset {m.archive_clean_offset} is not the first archive's "
                f"base {arch.first_base()}"
            )
        if not m.archive_clean_offset <= m.archive_start_offset <= boundary:
            return (
                f"archive_start_offset {m.archive_start_offset} is outside the archives "
                f"{m.archive_clean_offset}..{boundary - 1} (+1)"
            )
        if m.archive_live and m.start_offset != boundary:
            return (
                f"start_offset {m.start_offset}: the head region must be whole while archived "
                "offsets are live"
            )
    elif not m.archive_clean_offset == m.archive_start_offset == m.start_offset:
        return (
            "without archives, archive_clean_offset and archive_start_offset must equal "
            "start_offset"
        )
    if m.cloud_bytes != segs.total("size_bytes") + arch.total("size_bytes"):
        return (
            f"cloud_bytes {m.cloud_bytes} is not the sum of the listed segment and archive "
            f"sizes {segs.total('size_bytes') + arch.total('size_bytes')}"
        )
    live_names = set(segs.object_names())
    for r in m.replaced:
        if type(r.replaced_at) is not int or r.replaced_at < 0:
            return f"replaced segment {r.segment.object_name}: bad replaced_at {r.replaced_at!r}"
        problem = segment_problem(r.segment)
        if problem:
            return f"replaced segment {r.segment.base_offset}: {problem}"
        if r.segment.object_name in live_names:
            return (
                f"object {r.segment.object_name} is both listed and awaiting deletion; it would "
                "be deleted while still referenced"
            )
    if len({r.segment.object_name for r in m.replaced}) != len(m.replaced):
        return "the same object is listed twice among replaced segments"
    return None


def archived_problem(a: ArchivedManifest) -> str | None:
    """Why an archived manifest is impossible, or None."""
    if type(a.level) is not int or a.level < 0:
        return f"level must be a non-negative integer, got {a.level!r}"
    if a.level == 0:
        if a.children or not a.segments:
            return "a level 0 archived manifest lists segments (at least one) and no archives"
        return _segments_problem(a.segments, a.term)
    if a.segments or not a.children:
        return f"a level {a.level} archived manifest lists archives (at least one), no segments"
    if set(a.children.column("level")) != {a.level - 1}:
        return f"a level {a.level} archived manifest may only list level {a.level - 1} archives"
    return _archives_problem(a.children)
