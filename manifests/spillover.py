"""Spillover: keep the head manifest small however long the history (pure planning, no I/O).

When the serialized head grows past 2 x `cloud_storage_spillover_manifest_size` (S), its
oldest segments move into archived manifests of at most S bytes each until the head is back
to about S. The head keeps one compact entry per archived manifest (offsets, timestamps, size,
count, checksum), so a lookup picks the one archive to read without listing the bucket.

The entry list grows too (about 55 bytes per archive; an archive of 64 KiB holds ~1,500
segments of ~41 bytes). When it passes 3/4 x S, the oldest run of same-level entries, up to S
bytes of them, is folded into an index manifest one level up, listed by a single entry. With
the 64 KiB default that first happens after roughly 1.3 million segments, so histories up to
there need at most one archived-manifest read per cold lookup; each further level multiplies
the reach by ~900 and costs one more read. Measured: `benchmarks/manifest_scale.py`.

`plan_spill` returns the new head and the archived manifests to upload *before* the head is
committed (design invariant 1); leaves come before the index nodes that list them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import crc32c

from manifests.manifest import ArchivedManifest, PartitionManifest
from manifests.model import ArchiveEntry, ArchiveTable, SegmentTable
from manifests.serde import (
    archive_row_costs,
    encode_archived_manifest,
    encode_partition_manifest,
    segment_row_costs,
)
from tiered.errors import ConfigError

#: Redpanda's default for cloud_storage_spillover_manifest_size, bytes
DEFAULT_SPILLOVER_SIZE = 64 * 1024
#: Redpanda's default for cloud_storage_manifest_cache_size, bytes
DEFAULT_MANIFEST_CACHE_SIZE = 1024 * 1024
#: below this a spill would move only a handful of segments per archive
MIN_SPILLOVER_SIZE = 1024
#: spill when the head exceeds this many times S
SPILL_FACTOR = 2
#: fold archive entries when their table exceeds this fraction of S (numerator, denominator)
FOLD_FRACTION = (3, 4)
#: bytes kept free below 2 x S for the archive row a spill adds after a fold check
FOLD_SLACK = 256


@dataclass(frozen=True)
class ManifestSettings:
    """The manifest layer's configuration, in bytes."""

    #: `cloud_storage_spillover_manifest_size` (Redpanda's tiered storage's
    #: `cloud_storage_target_manifest_size_bytes`)
    spillover_size: int = DEFAULT_SPILLOVER_SIZE
    #: `cloud_storage_manifest_cache_size`: memory for materialized archived manifests
    manifest_cache_size: int = DEFAULT_MANIFEST_CACHE_SIZE

    def __post_init__(self) -> None:
        if type(self.spillover_size) is not int or self.spillover_size < MIN_SPILLOVER_SIZE:
            raise ConfigError(
                f"cloud_storage_spillover_manifest_size must be at least {MIN_SPILLOVER_SIZE} "
                f"bytes, got {self.spillover_size!r}"
            )
        if type(self.manifest_cache_size) is not int or self.manifest_cache_size < 0:
            raise ConfigError(
                "cloud_storage_manifest_cache_size must be a non-negative number of bytes, got "
                f"{self.manifest_cache_size!r}"
            )

    @classmethod
    def from_cluster(cls, cluster: Mapping[str, object]) -> ManifestSettings:
        """From resolved cluster properties (`tiered.config.Config.cluster`; aliases such as
        `cloud_storage_target_manifest_size_bytes` are already resolved there). Missing keys
        take the defaults."""
        spill = cluster.get("cloud_storage_spillover_manifest_size")
        if spill is None:  # a raw mapping may still carry the older name
            spill = cluster.get("cloud_storage_target_manifest_size_bytes")
        cache = cluster.get("cloud_storage_manifest_cache_size")
        return cls(
            spillover_size=DEFAULT_SPILLOVER_SIZE if spill is None else spill,  # type: ignore[arg-type]
            manifest_cache_size=DEFAULT_MANIFEST_CACHE_SIZE if cache is None else cache,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class ArchiveUpload:
    """One archived manifest to PUT (If-None-Match) before the head that lists it."""

    key: str
    data: bytes
    manifest: ArchivedManifest
    entry: ArchiveEntry


@dataclass(frozen=True)
class SpillPlan:
    manifest: PartitionManifest
    #: in upload order: every object is uploaded before any object that lists it
    uploads: tuple[ArchiveUpload, ...] = ()


def _node(m: PartitionManifest, level: int, rows: SegmentTable | ArchiveTable) -> ArchivedManifest:
    if isinstance(rows, SegmentTable):
        return ArchivedManifest(m.topic, m.partition, m.revision, m.term, level, segments=rows)
    return ArchivedManifest(m.topic, m.partition, m.revision, m.term, level, children=rows)


def _archive(m: PartitionManifest, level: int, rows: SegmentTable | ArchiveTable) -> ArchiveUpload:
    a = _node(m, level, rows)
    data = encode_archived_manifest(a)
    entry = a.entry(crc32c.crc32c(data))
    return ArchiveUpload(m.archive_key(entry), data, a, entry)


def _fit(
    m: PartitionManifest,
    level: int,
    rows: SegmentTable | ArchiveTable,
    costs: list[int],
    limit: int,
    minimum: int,
) -> ArchiveUpload:
    """The archive of the longest prefix of `rows` (at least `minimum` rows) whose serialized
    size is at most `limit`: estimate from per-row costs, then trim on the exact size."""
    header = len(encode_archived_manifest(_node(m, level, rows.slice(0, 0))))
    budget, k = limit - header, 0
    while k < len(rows) and budget >= costs[k]:
        budget -= costs[k]
        k += 1
    k = max(k, minimum)
    while True:
        upload = _archive(m, level, rows.slice(0, k))
        over = len(upload.data) - limit
        if over <= 0 or k <= minimum:
            return upload
        average = max(1, (len(upload.data) - header) // k)
        k = max(minimum, k - max(1, -(-over // average)))


def _spill_one(m: PartitionManifest, size: int) -> tuple[PartitionManifest, ArchiveUpload]:
    """Move the oldest head segments, up to `size` bytes of archived manifest, to an archive."""
    segs = m.segments
    upload = _fit(m, 0, segs, segment_row_costs(segs), size, minimum=1)
    k = upload.entry.segment_count
    rest = segs.slice(k)
    changes: dict[str, object] = {
        "segments": rest,
        "archives": m.archives.concat(ArchiveTable.from_rows([upload.entry])),
        "start_offset": rest.first_base() if rest else m.last_offset + 1,
    }
    if not m.archive_live:  # the archive region starts (again) at the current log start
        changes["archive_start_offset"] = m.start_offset
    if not m.archives:
        changes["archive_clean_offset"] = segs.first_base()
    return m.evolve(**changes), upload


def _fold_one(m: PartitionManifest, size: int) -> tuple[PartitionManifest, ArchiveUpload] | None:
    """Fold the oldest rows of the largest run of same-level archive entries into one index
    manifest a level up; None when no run has two entries to fold."""
    arch = m.archives
    costs = archive_row_costs(arch)
    levels = arch.column("level")
    best: tuple[int, int, int] | None = None  # (bytes, start, stop)
    start = 0
    for i in range(1, len(arch) + 1):
        if i == len(arch) or levels[i] != levels[start]:
            run_bytes = sum(costs[start:i])
            if i - start >= 2 and (best is None or run_bytes > best[0]):
                best = (run_bytes, start, i)
            start = i
    if best is None:
        return None
    _, lo, hi = best
    run = arch.slice(lo, hi)
    upload = _fit(m, levels[lo] + 1, run, costs[lo:hi], size, minimum=2)
    k = len(upload.manifest.children)
    folded = (
        arch.slice(0, lo).concat(ArchiveTable.from_rows([upload.entry])).concat(arch.slice(lo + k))
    )
    return m.evolve(archives=folded), upload


def archives_table_size(m: PartitionManifest) -> int:
    """Serialized bytes of the head's archive entry list (about; separators excluded)."""
    return sum(archive_row_costs(m.archives))


def _fold_limit(m: PartitionManifest, spillover_size: int) -> int:
    """Bytes the archive rows may take before folding: 3/4 x S, less if the head's fixed part
    (long names, pending `replaced` rows) would otherwise push the head past 2 x S."""
    fixed = len(
        encode_partition_manifest(
            m.evolve(segments=SegmentTable.empty(), archives=ArchiveTable.empty())
        )
    )
    share = spillover_size * FOLD_FRACTION[0] // FOLD_FRACTION[1]
    room = SPILL_FACTOR * spillover_size - fixed - FOLD_SLACK
    return max(spillover_size // 4, min(share, room))


def plan_spill(m: PartitionManifest, spillover_size: int = DEFAULT_SPILLOVER_SIZE) -> SpillPlan:
    """The head to commit and the archived manifests to upload first, so that the head is at
    most 2 x `spillover_size` bytes (about 1 x right after a spill)."""
    size = len(encode_partition_manifest(m))
    if size <= SPILL_FACTOR * spillover_size:
        return SpillPlan(m)
    fold_limit = _fold_limit(m, spillover_size)
    uploads: list[ArchiveUpload] = []
    while size > spillover_size:
        if archives_table_size(m) > fold_limit and (folded := _fold_one(m, spillover_size)):
            m, upload = folded
        elif m.segments:
            m, upload = _spill_one(m, spillover_size)
        else:
            break  # only the fixed fields and `replaced` remain; nothing more can move
        uploads.append(upload)
        size = len(encode_partition_manifest(m))
    return SpillPlan(m, tuple(uploads))
