"""Pure operations on a head manifest: each returns a new manifest or a lookup result and never
touches the bucket. Refusals raise `InvalidUpdate` subclasses (`OffsetGap`, `OffsetOverlap`)
or `OffsetOutOfRange`, with the partition and offsets in the message.

Lookups answer at the head's level: a `SegmentMeta` when the head lists the segment itself, an
`ArchiveEntry` when an archived manifest holds it. `ManifestStore` resolves entries by reading
the archived manifest (through its cache).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from manifests import keys
from manifests.errors import CollectedName, InvalidUpdate, OffsetGap, OffsetOverlap, StaleTerm
from manifests.manifest import ArchivedManifest, PartitionManifest, segment_problem
from manifests.model import ArchiveEntry, ArchiveTable, ReplacedSegment, SegmentMeta, SegmentTable
from tiered.errors import OffsetOutOfRange


def _where(m: PartitionManifest) -> str:
    return f"{m.topic}/{m.partition}"


def _taken_names(m: PartitionManifest) -> set[str]:
    return set(m.segments.object_names()) | {r.segment.object_name for r in m.replaced}


def with_term(m: PartitionManifest, term: int) -> PartitionManifest:
    """The manifest as written by a writer of `term`; a lower term than the manifest's is a
    fenced writer and raises `StaleTerm`."""
    if type(term) is not int or term < 0:
        raise InvalidUpdate(f"{_where(m)}: term must be a non-negative integer, got {term!r}")
    if term < m.term:
        raise StaleTerm(m.key, m.term, term)
    return m if term == m.term else m.evolve(term=term)


def add_segments(m: PartitionManifest, segments: Iterable[SegmentMeta]) -> PartitionManifest:
    """Append newly uploaded segments, which must continue the log exactly: a segment starting
    after the next offset is a gap (`OffsetGap`), one starting before it an overlap
    (`OffsetOverlap`). Only the very first segment of a never-written partition may start
    anywhere (tiering can be enabled on a log whose start is already past 0)."""
    new = list(segments)
    if not new:
        return m
    where = _where(m)
    first_ever = m.last_offset == -1 and not m.segments and not m.archives
    expected = m.next_offset
    taken = _taken_names(m)
    for i, seg in enumerate(new):
        problem = segment_problem(seg, m.term)
        if problem:
            raise InvalidUpdate(f"{where}: segment at offset {seg.base_offset}: {problem}")
        if not (i == 0 and first_ever):
            if seg.base_offset > expected:
                raise OffsetGap(expected, seg.base_offset, where)
            if seg.base_offset < expected:
                raise OffsetOverlap(expected, seg.base_offset, where)
        if not is_append_name(seg.object_name):
            # only default names are safe from garbage collection while in flight
            check_not_collected(m, seg.object_name, None)
        if seg.object_name in taken:
            raise InvalidUpdate(
                f"{where}: object name {seg.object_name} is already used by this partition; "
                "upload the segment under a new name (keys.segment_name generation)"
            )
        taken.add(seg.object_name)
        expected = seg.last_offset + 1
    added = SegmentTable.from_rows(new)
    changes: dict[str, object] = {}
    if first_ever:
        start = new[0].base_offset
        changes = {
            "start_offset": start,
            "archive_start_offset": start,
            "archive_clean_offset": start,
        }
    return m.evolve(
        segments=m.segments.concat(added),
        last_offset=new[-1].last_offset,
        cloud_bytes=m.cloud_bytes + added.total("size_bytes"),
        **changes,
    )


def is_append_name(name: str) -> bool:
    """Whether `name` is the default name of an appended segment (`{base}-{last}-{term}.log`,
    generation 0) or of an index beside one. Garbage collection may delete such an object
    once it is unreferenced and below the head's next offset (or of a fenced term), because
    `add_segments` can never take it again; every other name is a replacement's, protected
    by `gc_cutoff_ms` instead (docs/format.md, "Garbage collection")."""
    seg = keys.segment_name_of(name) or ""
    parsed = keys.parse_segment_name(seg)
    return parsed is not None and seg == keys.segment_name(
        parsed.base_offset, parsed.last_offset, parsed.term)


def check_not_collected(m: PartitionManifest, name: str, uploaded_at_ms: int | None) -> None:
    """Refuse to newly reference object `name` last modified at `uploaded_at_ms` (store clock,
    None: unknown) when garbage collection may already have condemned it: a collector deletes
    unreferenced objects no newer than the cutoff it committed, so only a younger object is
    safe to name (`CollectedName`; upload the bytes again under a fresh name)."""
    if m.gc_cutoff_ms and (uploaded_at_ms is None or uploaded_at_ms <= m.gc_cutoff_ms):
        raise CollectedName(name, uploaded_at_ms, m.gc_cutoff_ms, _where(m))


def raise_gc_cutoff(m: PartitionManifest, cutoff_ms: int) -> PartitionManifest:
    """The manifest with garbage collection's cutoff moved up to `cutoff_ms` (never down)."""
    return m if cutoff_ms <= m.gc_cutoff_ms else m.evolve(gc_cutoff_ms=cutoff_ms)


def replace_segments(
    m: PartitionManifest, merged: SegmentMeta, *, now_ms: int, uploaded_at_ms: int | None = None
) -> PartitionManifest:
    """Replace the run of head segments exactly spanning `merged`'s offsets by `merged` (an
    adjacent-segment merge, or a compacted re-upload of one segment). The old segments move
    to `replaced`, stamped `now_ms`, for deletion after the grace period.

    `merged` must carry a replacement's name (not an appended segment's default one) and its
    object must be younger than the manifest's `gc_cutoff_ms` (`uploaded_at_ms`, the store's
    last-modified time): see `check_not_collected`."""
    where = _where(m)
    problem = segment_problem(merged, m.term)
    if problem:
        raise InvalidUpdate(f"{where}: merged segment: {problem}")
    segs = m.segments
    first = segs.find(merged.base_offset)
    last = segs.find(merged.last_offset)
    if first is None or last is None:
        region = "archived (immutable)" if merged.base_offset < m.start_offset else "not listed"
        raise InvalidUpdate(
            f"{where}: cannot replace offsets {merged.base_offset}..{merged.last_offset}: "
            f"they are {region}; only segments listed in the head can be replaced"
        )
    if (
        segs.base_offsets[first] != merged.base_offset
        or segs.last_offsets[last] != merged.last_offset
    ):
        raise InvalidUpdate(
            f"{where}: merged segment {merged.base_offset}..{merged.last_offset} does not align "
            f"with segment boundaries (the run spans {segs.base_offsets[first]}.."
            f"{segs.last_offsets[last]})"
        )
    run = segs.slice(first, last + 1)
    run_names = set(run.object_names())
    if merged.object_name in run_names:
        raise InvalidUpdate(
            f"{where}: merged object {merged.object_name} has the name of a segment it replaces; "
            "the old object would be overwritten before the new manifest is committed"
        )
    if merged.object_name in _taken_names(m):
        raise InvalidUpdate(f"{where}: object name {merged.object_name} is already in use")
    if is_append_name(merged.object_name):
        raise InvalidUpdate(
            f"{where}: merged object {merged.object_name} has an appended segment's default "
            "name; a replacement needs a generation (keys.segment_name(..., generation=N))"
        )
    check_not_collected(m, merged.object_name, uploaded_at_ms)
    new_segs = (
        segs.slice(0, first).concat(SegmentTable.from_rows([merged])).concat(segs.slice(last + 1))
    )
    gone = tuple(ReplacedSegment(seg, now_ms) for seg in run)
    return m.evolve(
        segments=new_segs,
        replaced=m.replaced + gone,
        cloud_bytes=m.cloud_bytes - run.total("size_bytes") + merged.size_bytes,
    )


def advance_start_offset(m: PartitionManifest, new_start: int, *, now_ms: int) -> PartitionManifest:
    """Move the log start forward to `new_start` (remote retention). Head segments wholly
    below it move to `replaced`; inside the archive region only `archive_start_offset` moves,
    since archived manifests are immutable (`expired_archives` then lists what GC may delete).
    Never moves backwards; `new_start` may be at most `last_offset + 1` (everything expired).

    While archived manifests are still listed the head keeps its first segment: the archives
    must end where the head begins, and they are dropped only once garbage collection has
    deleted what they list (after the grace period). So the log start stops inside that
    segment, at its last offset, and the next retention pass after the drop goes the rest
    of the way (retention keeps data longer, never shorter)."""
    if new_start <= m.log_start_offset:
        return m
    m = record_start_reason(m, new_start)
    if new_start > m.next_offset:
        raise InvalidUpdate(
            f"{_where(m)}: cannot move the log start to {new_start}: the log ends at "
            f"{m.last_offset}"
        )
    arch = m.archives
    if arch and new_start <= arch.last_last():
        return m.evolve(archive_start_offset=new_start)
    segs = m.segments
    if arch and segs and new_start > segs.last_offsets[0]:
        new_start = segs.last_offsets[0]
        if new_start <= m.log_start_offset:
            return m
    keep_from = segs.index_from(new_start)
    dropped = segs.slice(0, keep_from)
    changes: dict[str, object] = {
        "segments": segs.slice(keep_from),
        "replaced": m.replaced + tuple(ReplacedSegment(s, now_ms) for s in dropped),
        "start_offset": new_start,
        "cloud_bytes": m.cloud_bytes - dropped.total("size_bytes"),
    }
    if arch:
        changes["archive_start_offset"] = arch.last_last() + 1
    else:
        changes["archive_start_offset"] = changes["archive_clean_offset"] = new_start
    return m.evolve(**changes)


def record_start_reason(m: PartitionManifest, below: int) -> PartitionManifest:
    """Record that every offset below `below` left the log on purpose (retention, a recorded
    truncation): only then may the collector delete objects of ours wholly below the head's
    start. A head that merely starts later records nothing (docs/format.md, "Garbage
    collection"). Only grows."""
    return m if below <= m.collectable_below else m.evolve(collectable_below=below)


def replaced_due(
    m: PartitionManifest, *, now_ms: int, grace_ms: int
) -> tuple[ReplacedSegment, ...]:
    """Replaced segments whose grace period is over: their objects may be deleted now."""
    return tuple(r for r in m.replaced if r.replaced_at + grace_ms <= now_ms)


def drop_replaced(m: PartitionManifest, object_names: Iterable[str]) -> PartitionManifest:
    """Forget replaced segments whose objects were deleted (unknown names are ignored, so a
    retried garbage collection is harmless)."""
    names = set(object_names)
    kept = tuple(r for r in m.replaced if r.segment.object_name not in names)
    return m if len(kept) == len(m.replaced) else m.evolve(replaced=kept)


def expired_archives(m: PartitionManifest) -> tuple[ArchiveEntry, ...]:
    """Archive entries wholly below the log start, oldest first: garbage collection deletes
    their segments and the archived manifests, then `drop_expired_archives`."""
    arch = m.archives
    return tuple(arch[i] for i in range(arch.index_from(m.log_start_offset)))


def drop_expired_archives(m: PartitionManifest, count: int) -> PartitionManifest:
    """Remove the first `count` archive entries (all must be expired) after their objects were
    deleted, moving `archive_clean_offset` up to the next listed archive."""
    arch = m.archives
    if count <= 0:
        return m
    expired = arch.index_from(m.log_start_offset)
    if count > expired:
        raise InvalidUpdate(
            f"{_where(m)}: only {expired} archived manifest(s) are wholly below the log start "
            f"{m.log_start_offset}; refusing to drop {count}"
        )
    rest = arch.slice(count)
    changes: dict[str, object] = {
        "archives": rest,
        "cloud_bytes": m.cloud_bytes - arch.slice(0, count).total("size_bytes"),
    }
    if rest:
        changes["archive_clean_offset"] = rest.first_base()
    else:
        changes["archive_clean_offset"] = changes["archive_start_offset"] = m.start_offset
    return m.evolve(**changes)


# -- lookups -----------------------------------------------------------------------------------


def _check_readable(m: PartitionManifest, offset: int) -> None:
    if not m.log_start_offset <= offset <= m.last_offset:
        raise OffsetOutOfRange(
            f"{_where(m)}: offset {offset} is outside the offsets in the bucket "
            f"({m.log_start_offset}..{m.last_offset})"
        )


def find_offset(m: PartitionManifest, offset: int) -> SegmentMeta | ArchiveEntry:
    """The head segment holding `offset`, or the archive entry whose range does; raises
    `OffsetOutOfRange` below the log start or past the last offset."""
    _check_readable(m, offset)
    segs = m.segments
    if segs and offset >= segs.first_base():
        i = segs.find(offset)
    else:
        segs = m.archives  # type: ignore[assignment]
        i = segs.find(offset)
    if i is None:  # unreachable for a manifest that passed manifest_problem()
        raise OffsetOutOfRange(f"{_where(m)}: offset {offset} is not covered")
    return segs[i]


def _live_tables(
    m: PartitionManifest, offset: int
) -> Iterator[tuple[SegmentTable | ArchiveTable, int]]:
    """(table, first row index) pairs covering offsets >= max(offset, log start), in order."""
    start = max(offset, m.log_start_offset)
    if m.archive_live:
        yield m.archives, m.archives.index_from(start)
    yield m.segments, m.segments.index_from(start)


def find_timestamp(m: PartitionManifest, timestamp: int) -> SegmentMeta | ArchiveEntry | None:
    """The first live head segment or archive entry whose max timestamp is >= `timestamp`
    (where the first record at or after it can be), or None when every record is older."""
    for table, start in _live_tables(m, m.log_start_offset):
        i = table.index_at_or_after_timestamp(timestamp, start)
        if i is not None:
            return table[i]
    return None


def iter_from(m: PartitionManifest, offset: int = 0) -> Iterator[SegmentMeta | ArchiveEntry]:
    """Archive entries then head segments holding offsets >= `offset`, in offset order; offsets
    below the log start are skipped."""
    for table, start in _live_tables(m, offset):
        yield from table.rows(start)


def node_iter_from(a: ArchivedManifest, offset: int) -> Iterator[SegmentMeta | ArchiveEntry]:
    """The rows of an archived manifest holding offsets >= `offset`."""
    rows = a.rows
    return rows.rows(rows.index_from(offset))


def node_find_timestamp(
    a: ArchivedManifest, timestamp: int, min_offset: int, start: int = 0
) -> tuple[int, SegmentMeta | ArchiveEntry] | None:
    """(index, row) of the first row at index >= `start` that holds offsets >= `min_offset`
    and has a max timestamp >= `timestamp`, or None."""
    rows = a.rows
    i = rows.index_at_or_after_timestamp(timestamp, max(start, rows.index_from(min_offset)))
    return None if i is None else (i, rows[i])
