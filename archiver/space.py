"""Local retention and space management: which local segments may go, as pure functions.

Inputs are plain views of the local log (`PartitionView`), disk numbers (`DiskInfo`) and the
cluster properties (`SpaceParams`); outputs are `Deletion` values the daemon carries out. No
function here touches a file, the bucket or the clock (`now_ms` is passed in).

The safety gate (design invariant 2): a segment is deletable only when remote write is on
for its topic and the committed manifest covers its last offset (`uploaded_last_offset`); the
active segment never is. Topics without remote write are the broker's own business: tiered
has no copy of their data, so nothing here ever deletes from them.

`plan_space_management` walks Redpanda's five phases of data removal (see docs/archiver.md
for how each is read) in order, one segment per partition per turn (round robin), until log
usage is back under its target. A shortfall is a value (`SpaceOutcome`), never an exception.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from archiver.upload_policy import LocalSegment, PolicyInputError, check_log_layout
from tiered.errors import ConfigError

GiB = 1024**3


@dataclass(frozen=True, slots=True)
class RetentionLimits:
    """A resolved retention pair; None means no limit (Kafka's -1, or nothing configured)."""

    ms: int | None = None
    bytes: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("ms", self.ms), ("bytes", self.bytes)):
            if value is not None and value < 0:
                raise PolicyInputError(f"retention {name} {value} is negative; use None")

    def tighter(self, other: RetentionLimits) -> RetentionLimits:
        """The limit that deletes more in each dimension: local data is never kept longer than
        the topic keeps data at all."""
        return RetentionLimits(_min_limit(self.ms, other.ms), _min_limit(self.bytes, other.bytes))


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition's local log as the retention policies need it.

    `local_retention` is the effective `retention.local.target.ms` / `.bytes` (the topic's
    setting, else `retention_local_target_ms_default` / `_bytes_default`) and
    `local_retention_explicit` says whether the topic set either itself: phases 3 and 4 treat
    the two kinds differently. `retention` is the effective total `retention.ms` /
    `retention.bytes`. `uploaded_last_offset` is the last offset a committed manifest covers.
    """

    topic: str
    partition: int
    segments: tuple[LocalSegment, ...]  # closed segments, oldest first
    active_base_offset: int
    active_size_bytes: int
    uploaded_last_offset: int | None
    remote_write: bool
    local_retention: RetentionLimits
    local_retention_explicit: bool
    retention: RetentionLimits
    #: bytes of a local segment (by base offset, the active one's included) that a committed
    #: manifest already holds although the segment reaches past it: an idle-timeout upload of
    #: its prefix. Those are in the bucket, not pending
    covered_bytes: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"{self.topic}/{self.partition}"
        if self.partition < 0 or self.active_size_bytes < 0 or self.active_base_offset < 0:
            raise PolicyInputError(
                f"{where}: partition, active base offset and size must not be negative"
            )
        check_log_layout(self.segments, self.active_base_offset, where)

    @property
    def size_bytes(self) -> int:
        """Local bytes of the partition: closed segments plus the active one."""
        return sum(s.size_bytes for s in self.segments) + self.active_size_bytes

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset if self.segments else self.active_base_offset


@dataclass(frozen=True, slots=True)
class DiskInfo:
    """The data disk: `total_bytes` and `free_bytes` as statvfs reports them, and
    `cache_reserved_bytes`, the read cache's maximum size when the cache shares this disk (0
    when it lives elsewhere)."""

    total_bytes: int
    free_bytes: int
    cache_reserved_bytes: int = 0

    def __post_init__(self) -> None:
        if min(self.total_bytes, self.free_bytes, self.cache_reserved_bytes) < 0:
            raise PolicyInputError(f"disk numbers must not be negative: {self}")


@dataclass(frozen=True, slots=True)
class SpaceParams:
    """Cluster properties of local retention and space management (Redpanda's defaults,
    docs/configuration.md); validates itself when built."""

    retention_local_target_capacity_bytes: int | None = None
    retention_local_target_capacity_percent: float | None = None
    disk_reservation_percent: float = 20.0
    retention_local_strict: bool = False
    storage_space_alert_free_threshold_percent: float = 5.0
    storage_space_alert_free_threshold_bytes: int = 0
    storage_min_free_bytes: int = 5 * GiB

    def __post_init__(self) -> None:
        for key in _PERCENT_KEYS:
            pct = getattr(self, key)
            if pct is None and key in _NULLABLE:
                continue
            if not _is_number(pct) or not 0 <= pct <= 100:
                raise ConfigError(f"{key}: {pct!r} is not a percentage between 0 and 100")
        for key in _SIZE_KEYS:
            size = getattr(self, key)
            if size is None and key in _NULLABLE:
                continue
            if not _is_number(size) or isinstance(size, float) or size < 0:
                raise ConfigError(f"{key}: {size!r} is not a byte count")
        strict = self.retention_local_strict
        if not isinstance(strict, bool):
            raise ConfigError(f"retention_local_strict: expected true or false, got {strict!r}")

    @classmethod
    def from_cluster(cls, values: Mapping[str, Any]) -> SpaceParams:
        """Build from parsed cluster properties (`tiered.config.properties` names); a missing key
        takes Redpanda's default, a bad value is a ConfigError naming the key."""
        defaults = cls()
        picked = {
            f.name: values.get(f.name, getattr(defaults, f.name)) for f in dataclasses.fields(cls)
        }
        return cls(**picked)

    def target_bytes(self, disk: DiskInfo) -> int:
        """Target size of all local log data on `disk`.

        The smaller of `retention_local_target_capacity_bytes` and
        `retention_local_target_capacity_percent` of the disk, whichever are set, and never
        more than what is left after `disk_reservation_percent` and the cache's reservation
        (which is also the default when neither is set, as Redpanda's tiered storage says)."""
        reserved = disk.total_bytes * self.disk_reservation_percent / 100
        headroom = max(0, int(disk.total_bytes - reserved - disk.cache_reserved_bytes))
        target = headroom
        if self.retention_local_target_capacity_bytes is not None:
            target = min(target, self.retention_local_target_capacity_bytes)
        if self.retention_local_target_capacity_percent is not None:
            pct = self.retention_local_target_capacity_percent
            target = min(target, int(disk.total_bytes * pct / 100))
        return target


_PERCENT_KEYS = (
    "retention_local_target_capacity_percent",
    "disk_reservation_percent",
    "storage_space_alert_free_threshold_percent",
)
_SIZE_KEYS = (
    "retention_local_target_capacity_bytes",
    "storage_space_alert_free_threshold_bytes",
    "storage_min_free_bytes",
)
_NULLABLE = {"retention_local_target_capacity_bytes", "retention_local_target_capacity_percent"}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Phase(enum.IntEnum):
    """Redpanda's phases of data removal, in the order they are tried."""

    RETENTION = 1  # follow the retention policy
    LOCAL_RETENTION = 2  # trim to the effective local retention
    DEFAULT_LOW_SPACE = 3  # topics on default local retention, down to the low-space level
    EXPLICIT_LOW_SPACE = 4  # topics with explicit local retention, same level
    ACTIVE_SEGMENT = 5  # everything uploaded up to the active segment


@dataclass(frozen=True, slots=True)
class Deletion:
    """Delete this closed segment's files; `phase` says which rule chose it."""

    topic: str
    partition: int
    segment: LocalSegment
    phase: Phase


def safe_delete_below(partition: PartitionView) -> int:
    """Exclusive offset bound of what may be deleted locally: every closed segment ending
    below it is covered by the committed manifest (design invariant 2). It is the log start offset
    when nothing is (remote write off, empty manifest), and never past the active segment."""
    bound = partition.log_start_offset
    for seg in partition.segments[: _safe_count(partition)]:
        bound = seg.last_offset + 1
    return bound


def _safe_count(p: PartitionView) -> int:
    """How many of the oldest closed segments are safely in the bucket."""
    if not p.remote_write or p.uploaded_last_offset is None:
        return 0
    count = 0
    for seg in p.segments:
        if seg.last_offset > p.uploaded_last_offset:
            break
        count += 1
    return count


def _beyond(p: PartitionView, limits: RetentionLimits, now_ms: int) -> int:
    """How many of the oldest closed segments are past `limits`: by time, while every record
    of a segment is older than `ms` (Kafka stops at the first segment that is not); by size,
    oldest first until the partition is back at or under `bytes` (as Redpanda does). Both apply;
    the one that removes more wins."""
    by_time = 0
    if limits.ms is not None:
        for seg in p.segments:
            if now_ms - seg.max_timestamp_ms <= limits.ms:
                break
            by_time += 1
    by_size = 0
    if limits.bytes is not None:
        size = p.size_bytes
        for seg in p.segments:
            if size <= limits.bytes:
                break
            size -= seg.size_bytes
            by_size += 1
    return max(by_time, by_size)


def _housekeeping_limits(p: PartitionView, strict: bool) -> RetentionLimits:
    # strict: local retention is enforced by housekeeping; advisory (the default): local data
    # may grow up to the topic's whole ("consumable") retention until disk pressure says no
    local = p.local_retention.tighter(p.retention)
    return local if strict else p.retention


def plan_local_retention(
    partitions: Sequence[PartitionView], now_ms: int, *, strict: bool = True
) -> list[Deletion]:
    """Routine housekeeping: closed segments past retention, never past `safe_delete_below`.

    With `strict` (`retention_local_strict`) that is the effective local retention (tightened
    by the topic's total retention); without it only the total retention, the local target
    then being enforced by `plan_space_management` under disk pressure alone."""
    deletions: list[Deletion] = []
    for p in partitions:
        count = min(_safe_count(p), _beyond(p, _housekeeping_limits(p, strict), now_ms))
        deletions.extend(
            Deletion(p.topic, p.partition, seg, Phase.RETENTION) for seg in p.segments[:count]
        )
    return deletions


class SpaceOutcome(enum.Enum):
    #: usage is already at or under the target (and free space above the minimum)
    WITHIN_TARGET = "within_target"
    #: the deletions bring usage back under the target
    TARGET_MET = "target_met"
    #: still over: closed data not yet uploaded holds the space; uploading will free it
    BLOCKED_BY_UPLOAD_BACKLOG = "blocked_by_upload_backlog"
    #: still over: only active segments and topics without remote write remain
    EXHAUSTED = "exhausted"


@dataclass(frozen=True, slots=True)
class SpacePlan:
    """What `plan_space_management` decided. `phase` is the phase the walk ended in (None when
    nothing was needed); `over_target_bytes` what is still to free after the deletions."""

    outcome: SpaceOutcome
    phase: Phase | None
    deletions: tuple[Deletion, ...]
    usage_bytes: int
    target_bytes: int
    excess_bytes: int
    freed_bytes: int
    over_target_bytes: int
    unuploaded_bytes: int
    #: where the next plan's round robin starts (pass it back as `cursor`) so no partition is
    #: always first in line
    next_cursor: int


def _phase_bounds(p: PartitionView, now_ms: int, strict: bool) -> dict[Phase, int]:
    """Cumulative count of oldest closed segments each phase may have removed by its end; every
    bound is capped by what is safely uploaded, so no phase can reach un-uploaded data."""
    safe = _safe_count(p)
    # the low-space level keeps two segments: the last closed one and the active one
    low_space = max(0, len(p.segments) - 1)
    bounds: dict[Phase, int] = {}
    n = min(safe, _beyond(p, _housekeeping_limits(p, strict), now_ms))
    bounds[Phase.RETENTION] = n
    n = max(n, min(safe, _beyond(p, p.local_retention.tighter(p.retention), now_ms)))
    bounds[Phase.LOCAL_RETENTION] = n
    if not p.local_retention_explicit:
        n = max(n, min(safe, low_space))
    bounds[Phase.DEFAULT_LOW_SPACE] = n
    n = max(n, min(safe, low_space))
    bounds[Phase.EXPLICIT_LOW_SPACE] = n
    bounds[Phase.ACTIVE_SEGMENT] = max(n, safe)
    return bounds


def plan_space_management(
    partitions: Sequence[PartitionView],
    disk: DiskInfo,
    params: SpaceParams,
    now_ms: int,
    *,
    cursor: int = 0,
) -> SpacePlan:
    """Which uploaded segments to delete to bring local log usage back under its target.

    Usage is the local size of every partition given (pass all of them, tiered or not). The
    bytes to free are the larger of usage over `params.target_bytes(disk)` and free space
    under `storage_min_free_bytes`. Phases run in order; within one, partitions take turns
    giving up their oldest eligible segment (phase 1 visits the partitions with the most
    expired data first); the walk stops as soon as enough is freed."""
    usage = sum(p.size_bytes for p in partitions)
    target = params.target_bytes(disk)
    excess = max(usage - target, params.storage_min_free_bytes - disk.free_bytes, 0)
    unuploaded = sum(
        sum(s.size_bytes for s in p.segments[_safe_count(p) :])
        for p in partitions
        if p.remote_write
    )
    n = len(partitions)
    if excess == 0:
        return SpacePlan(
            SpaceOutcome.WITHIN_TARGET, None, (), usage, target, 0, 0, 0, unuploaded, cursor
        )

    strict = params.retention_local_strict
    bounds = [_phase_bounds(p, now_ms, strict) for p in partitions]
    taken = [0] * n  # segments already chosen per partition
    deletions: list[Deletion] = []
    freed = 0
    start = cursor % n if n else 0
    phase = Phase.RETENTION
    for phase in Phase:
        order = _phase_order(partitions, bounds, phase, start)
        progress = True
        while progress and freed < excess:
            progress = False
            for i in order:
                if taken[i] >= bounds[i][phase]:
                    continue
                seg = partitions[i].segments[taken[i]]
                deletions.append(Deletion(partitions[i].topic, partitions[i].partition, seg, phase))
                taken[i] += 1
                freed += seg.size_bytes
                progress = True
                start = (i + 1) % n
                if freed >= excess:
                    break
        if freed >= excess:
            break

    over = max(0, excess - freed)
    if over == 0:
        outcome = SpaceOutcome.TARGET_MET
    elif unuploaded > 0:
        outcome = SpaceOutcome.BLOCKED_BY_UPLOAD_BACKLOG
    else:
        outcome = SpaceOutcome.EXHAUSTED
    return SpacePlan(
        outcome, phase, tuple(deletions), usage, target, excess, freed, over, unuploaded, start
    )


def _phase_order(
    partitions: Sequence[PartitionView], bounds: list[dict[Phase, int]], phase: Phase, start: int
) -> list[int]:
    n = len(partitions)
    rotated = [(start + k) % n for k in range(n)]
    if phase is not Phase.RETENTION:
        return rotated

    # as Redpanda documents: retention is applied first to the partitions that free the most
    def expired_bytes(i: int) -> int:
        return sum(s.size_bytes for s in partitions[i].segments[: bounds[i][Phase.RETENTION]])

    return sorted(rotated, key=expired_bytes, reverse=True)


class DiskAlert(enum.IntEnum):
    """`redpanda_storage_disk_free_space_alert` values (Redpanda's default)."""

    OK = 0
    LOW_SPACE = 1  # free space under the alert threshold: warn
    DEGRADED = 2  # free space under storage_min_free_bytes: the broker refuses writes


def disk_alert_state(total_bytes: int, free_bytes: int, params: SpaceParams) -> DiskAlert:
    """The free-space alert level. The alert threshold is the larger of
    `storage_space_alert_free_threshold_percent` of the disk and `..._bytes` (0 disables
    either), so the alert fires when free space drops under either one."""
    if total_bytes < 0 or free_bytes < 0:
        raise PolicyInputError(f"disk numbers must not be negative: {total_bytes}, {free_bytes}")
    if free_bytes < params.storage_min_free_bytes:
        return DiskAlert.DEGRADED
    by_percent = total_bytes * params.storage_space_alert_free_threshold_percent / 100
    threshold = max(by_percent, params.storage_space_alert_free_threshold_bytes)
    return DiskAlert.LOW_SPACE if free_bytes < threshold else DiskAlert.OK


def upload_backlog_bytes(partitions: Sequence[PartitionView]) -> int:
    """Local bytes of remote-write partitions not yet covered by a committed manifest: the
    upload controller's input. A segment only partly covered (an idle-timeout upload of its
    prefix, the active segment's included) counts what the bucket does not hold of it, so
    the backlog returns to 0 once everything is uploaded."""
    total = 0
    for p in partitions:
        if not p.remote_write:
            continue
        uploaded = -1 if p.uploaded_last_offset is None else p.uploaded_last_offset
        total += sum(max(0, s.size_bytes - p.covered_bytes.get(s.base_offset, 0))
                     for s in p.segments if s.last_offset > uploaded)
        total += max(0, p.active_size_bytes - p.covered_bytes.get(p.active_base_offset, 0))
    return total


@dataclass(frozen=True, slots=True)
class Advice:
    """Advise mode (the broker deletes, tiered only reports): what could safely go, and
    whether the broker's own retention is about to delete data tiered has not uploaded.

    `time_headroom_ms` / `size_headroom_bytes`: how much longer, or how many more appended
    bytes, until the broker's `retention.ms` / `retention.bytes` deletes the oldest
    un-uploaded closed segment; None when that limit is off or nothing is at stake."""

    topic: str
    partition: int
    safe_delete_below: int
    unuploaded_bytes: int
    time_headroom_ms: int | None
    size_headroom_bytes: int | None
    at_risk: bool


def advise(
    partitions: Sequence[PartitionView], now_ms: int, *, margin_ms: int, margin_bytes: int = 0
) -> list[Advice]:
    """Per partition, the safe deletion bound and an `at_risk` flag when un-uploaded closed
    data is within `margin_ms` / `margin_bytes` of the broker's retention (the view's total
    `retention`, which is what a broker without tiering applies to its local log). Partitions
    without remote write are never at risk: tiered does not archive them."""
    if margin_ms < 0 or margin_bytes < 0:
        raise PolicyInputError("advise margins must not be negative")
    out: list[Advice] = []
    for p in partitions:
        safe = _safe_count(p)
        pending = p.segments[safe:] if p.remote_write else ()
        time_headroom = size_headroom = None
        if pending:
            if p.retention.ms is not None:
                # the broker deletes oldest first and stops at the first segment not expired,
                # so the first pending one goes once it and everything before it has expired
                time_headroom = max(
                    p.retention.ms - (now_ms - s.max_timestamp_ms) for s in p.segments[: safe + 1]
                )
            if p.retention.bytes is not None:
                before = sum(s.size_bytes for s in p.segments[:safe])
                # it goes when the log, less everything before it, is still over the limit
                size_headroom = p.retention.bytes - (p.size_bytes - before)
        at_risk = (time_headroom is not None and time_headroom <= margin_ms) or (
            size_headroom is not None and size_headroom <= margin_bytes
        )
        out.append(
            Advice(
                p.topic,
                p.partition,
                safe_delete_below(p),
                sum(s.size_bytes for s in pending),
                time_headroom,
                size_headroom,
                at_risk,
            )
        )
    return out


def _min_limit(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
