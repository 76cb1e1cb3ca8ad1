"""Carrying out local retention: deleting the segment files `archiver.space` chose, or, in
advise mode, only reporting what could go.

`[log] retention = "enforce"`: tiered owns the log dir. Routine retention
(`space.plan_local_retention`) and, under disk pressure, the five space-management phases
(`space.plan_space_management`, round robin, the cursor carried between passes) pick closed
segments; each is deleted only after a last check that the *committed* manifest covers its
last offset (design invariant 2: the policy already guarantees it, this is the edge refusing
to trust a view built elsewhere). All of a segment's files go (`.log` first, so a crash in
between never leaves a segment without its data but with an index claiming it), and the log
dir's `log-start-offset-checkpoint` is moved to the new first segment.

`advise`: a live broker owns the files. Nothing is deleted; each partition's safe deletion
bound is reported and a WARNING is logged when data not yet uploaded is within the margin of
the broker's own retention.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from archiver.space import (
    Advice,
    Deletion,
    DiskInfo,
    PartitionView,
    RetentionLimits,
    SpaceOutcome,
    SpaceParams,
    SpacePlan,
    advise,
    plan_local_retention,
    plan_space_management,
)
from archiver.upload_policy import LogSnapshot
from tiered.config import TopicConfig
from tiered.kafka.checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    CheckpointError,
    TopicPartition,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from tiered.kafka.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    TXNINDEX_SUFFIX,
    segment_file_name,
)

log = logging.getLogger(__name__)

#: suffixes of the files that belong to one segment, in deletion order (data first)
SEGMENT_FILE_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX, ".snapshot")

#: `[log] retention` values: what the service does with a local-retention plan
MODES = ("enforce", "advise")


def partition_view(
    topic: str, partition: int, snapshot: LogSnapshot, tc: TopicConfig,
    uploaded_last_offset: int | None, covered_bytes: Mapping[int, int] | None = None,
) -> PartitionView:
    """The space policies' view of one partition. `uploaded_last_offset` must come from a
    manifest this process read or committed: None (unknown, e.g. the bucket is unreachable)
    makes nothing deletable."""
    active = snapshot.active
    if active is not None:
        active_base, active_size = active.base_offset, active.size_bytes
    else:
        active_base = snapshot.closed[-1].end_exclusive if snapshot.closed else 0
        active_size = 0
    return PartitionView(
        topic=topic,
        partition=partition,
        segments=snapshot.closed,
        active_base_offset=active_base,
        active_size_bytes=active_size,
        uploaded_last_offset=uploaded_last_offset,
        remote_write=tc.remote_write,
        local_retention=RetentionLimits(tc.retention_local_target_ms,
                                        tc.retention_local_target_bytes),
        local_retention_explicit=tc.local_retention_explicit,
        retention=RetentionLimits(tc.retention_ms, tc.retention_bytes),
        covered_bytes=dict(covered_bytes or {}),
    )


@dataclass
class LocalRetentionResult:
    """What one local-retention pass did (enforce) or found (advise)."""

    deleted: list[Deletion] = field(default_factory=list)
    freed_bytes: int = 0
    space_outcome: SpaceOutcome | None = None
    next_cursor: int = 0
    advice: list[Advice] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def segment_files(directory: Path, base_offset: int) -> list[Path]:
    """Every file of the segment based at `base_offset`, data first."""
    return [directory / segment_file_name(base_offset, suffix)
            for suffix in SEGMENT_FILE_SUFFIXES]


def delete_segment(directory: Path, base_offset: int) -> None:
    """Remove all of one segment's files (missing ones are fine: a retried deletion)."""
    for path in segment_files(directory, base_offset):
        try:
            path.unlink()
        except FileNotFoundError:
            continue


def plan_deletions(
    views: Sequence[PartitionView],
    disk: DiskInfo,
    params: SpaceParams,
    now_ms: int,
    *,
    cursor: int,
    others: Sequence[PartitionView] = (),
) -> tuple[dict[tuple[str, int, int], Deletion], SpacePlan]:
    """The segments routine retention and space management would delete, keyed by
    (topic, partition, base offset), and the space plan: pure, so the caller can first prove
    the partitions it touches (see `Archiver.local_retention`)."""
    routine = plan_local_retention(views, now_ms, strict=params.retention_local_strict)
    space = plan_space_management([*views, *others], disk, params, now_ms, cursor=cursor)
    chosen: dict[tuple[str, int, int], Deletion] = {}
    for d in (*routine, *space.deletions):
        chosen.setdefault((d.topic, d.partition, d.segment.base_offset), d)
    return chosen, space


def enforce(
    views: Sequence[PartitionView],
    dirs: dict[tuple[str, int], Path],
    disk: DiskInfo,
    params: SpaceParams,
    now_ms: int,
    *,
    cursor: int,
    others: Sequence[PartitionView] = (),
) -> LocalRetentionResult:
    """Plan and carry out local deletions for `views` (partitions of tiered's topics, whose
    directories `dirs` names). `others` are partitions tiered does not archive; they count
    towards disk usage but are never touched."""
    chosen, space = plan_deletions(views, disk, params, now_ms, cursor=cursor, others=others)
    by_view = {(v.topic, v.partition): v for v in views}
    result = LocalRetentionResult(space_outcome=space.outcome, next_cursor=space.next_cursor)
    if space.outcome is SpaceOutcome.BLOCKED_BY_UPLOAD_BACKLOG:
        log.warning("local disk is %d bytes over its target; un-uploaded data holds the space "
                    "until it is in the bucket", space.over_target_bytes)
    new_starts: dict[Path, dict[TopicPartition, int]] = {}
    # oldest first per partition: a partition's log start only ever moves forward
    for d in sorted(chosen.values(), key=lambda d: (d.topic, d.partition, d.segment.base_offset)):
        view = by_view.get((d.topic, d.partition))
        directory = dirs.get((d.topic, d.partition))
        if view is None or directory is None:
            continue
        uploaded = view.uploaded_last_offset
        if not view.remote_write or uploaded is None or d.segment.last_offset > uploaded:
            # design invariant 2 at the edge: never reached when the policy is right
            result.errors.append(f"{d.topic}/{d.partition}: refused to delete segment "
                                 f"{d.segment.base_offset}: not covered by a committed manifest")
            continue
        try:
            delete_segment(directory, d.segment.base_offset)
        except OSError as err:
            result.errors.append(f"{d.topic}/{d.partition}: deleting segment "
                                 f"{d.segment.base_offset}: {err}")
            continue
        log.info("%s/%d: deleted local segment %d..%d (%s, phase %d)", d.topic, d.partition,
                 d.segment.base_offset, d.segment.last_offset, _size(d.segment.size_bytes),
                 d.phase)
        result.deleted.append(d)
        result.freed_bytes += d.segment.size_bytes
        new_starts.setdefault(directory.parent, {})[TopicPartition(d.topic, d.partition)] = (
            d.segment.last_offset + 1)
    for log_dir, starts in new_starts.items():
        try:
            update_log_start_offsets(log_dir, starts)
        except (OSError, CheckpointError) as err:
            result.errors.append(f"{log_dir / LOG_START_OFFSET_CHECKPOINT}: {err}")
    return result


def update_log_start_offsets(log_dir: Path, starts: dict[TopicPartition, int]) -> None:
    """Raise the partitions' entries in the log dir's log-start-offset-checkpoint (never
    lower one: DeleteRecords may have moved it further)."""
    path = log_dir / LOG_START_OFFSET_CHECKPOINT
    offsets = read_offset_checkpoint(path) if path.exists() else {}
    for tp, start in starts.items():
        offsets[tp] = max(start, offsets.get(tp, start))
    write_offset_checkpoint(path, offsets)


def advise_only(
    views: Sequence[PartitionView], now_ms: int, *, margin_ms: int, margin_bytes: int
) -> LocalRetentionResult:
    """Advise mode: report, per partition, the safe deletion bound; warn about partitions
    whose un-uploaded data the broker's own retention will soon delete."""
    advice = advise(views, now_ms, margin_ms=margin_ms, margin_bytes=margin_bytes)
    for a in advice:
        if a.at_risk:
            log.warning(
                "%s/%d: %s not yet uploaded is close to the broker's retention (time headroom "
                "%s ms, size headroom %s bytes); uploads are falling behind", a.topic,
                a.partition, _size(a.unuploaded_bytes), a.time_headroom_ms,
                a.size_headroom_bytes)
    return LocalRetentionResult(advice=advice)


def real_disk_usage(path: Path) -> DiskInfo:
    """Total and free bytes of the filesystem holding `path` (what the disk alert reads)."""
    usage = shutil.disk_usage(path)
    return DiskInfo(total_bytes=usage.total, free_bytes=usage.free)


def combined_disk(log_dirs: Sequence[Path], usage: Callable[[Path], DiskInfo]) -> DiskInfo:
    """One DiskInfo over every distinct filesystem holding a log dir."""
    seen: set[int] = set()
    total = free = 0
    for d in log_dirs:
        try:
            dev = d.stat().st_dev
        except OSError:
            continue
        if dev in seen:
            continue
        seen.add(dev)
        info = usage(d)
        total += info.total_bytes
        free += info.free_bytes
    return DiskInfo(total, free)


def _size(n: int) -> str:
    return f"{n} bytes" if n < 1024 * 1024 else f"{n / (1024 * 1024):.1f} MiB"
