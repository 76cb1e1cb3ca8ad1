"""What the archiver's passes report, and the counters it keeps for metrics: plain data,
shared by the service, the daemon, the CLI and the metrics collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from archiver.lease_keeper import LeaseStats
from archiver.space import PartitionView, safe_delete_below, upload_backlog_bytes
from archiver.upload_policy import LogSnapshot
from manifests.manifest import PartitionManifest
from tiered.errors import TieredError
from tiered.kafka.local_log import PartitionLog


@dataclass
class PartitionReport:
    """One partition's outcome in a pass; a partition fault is reported here, never raised.

    `decision` is an `UploadDecision` value ("up_to_date", "wait", "gap", ...) or one of
    "uploaded", "corrupt_segment", "error", "fenced", "standby" (another node holds the
    partition's upload lease), "remote_write_off", "housekept",
    "local_retention", "advise". `safe_to_delete_below` (local retention passes) is the
    exclusive offset below which local data is in the bucket."""

    topic: str
    partition: int
    uploaded_segments: int = 0
    uploaded_bytes: int = 0
    decision: str = "up_to_date"
    error: str | None = None
    safe_to_delete_below: int | None = None
    detail: str = ""


@dataclass
class PassReport:
    """What one pass (or `run_once`, all of them) did. `errors` holds faults that belong to
    no single partition (a topic manifest, a checkpoint file); a partition's fault is its
    row's `error`. `ok` looks at both."""

    partitions: list[PartitionReport] = field(default_factory=list)
    deleted_remote_objects: int = 0
    deleted_local_segments: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No errors anywhere: `tiered archive --once` exits 0 only then."""
        return not self.errors and all(p.error is None for p in self.partitions)

    def merge(self, other: PassReport) -> PassReport:
        """Both passes in one report, one row per partition (errors joined)."""
        rows = {(p.topic, p.partition): p for p in self.partitions}
        for p in other.partitions:
            mine = rows.get((p.topic, p.partition))
            if mine is None:
                rows[(p.topic, p.partition)] = p
                continue
            mine.uploaded_segments += p.uploaded_segments
            mine.uploaded_bytes += p.uploaded_bytes
            # the first fault names the row's decision; later, different ones add to it
            if p.error and (mine.error is None or p.error not in mine.error):
                if mine.error is None:
                    mine.decision, mine.error = p.decision, p.error
                else:
                    mine.error = f"{mine.error}; {p.error}"
            if p.safe_to_delete_below is not None:
                mine.safe_to_delete_below = p.safe_to_delete_below
        return PassReport(
            sorted(rows.values(), key=lambda r: (r.topic, r.partition)),
            self.deleted_remote_objects + other.deleted_remote_objects,
            self.deleted_local_segments + other.deleted_local_segments,
            self.errors + other.errors,
        )


@dataclass
class ArchiverStats:
    """Plain numbers for metrics (totals only grow for the archiver's lifetime)."""

    #: bytes of committed segment objects and the indexes beside them
    uploaded_bytes_total: int = 0
    uploaded_segments_total: int = 0
    upload_errors_total: int = 0
    commits_total: int = 0
    commit_conflicts_total: int = 0
    #: bytes of local data not yet in a committed manifest (the controller's backlog)
    pending_bytes: int = 0
    pending_bytes_by_partition: dict[tuple[str, int], int] = field(default_factory=dict)
    backlog_ratio: float = 0.0
    controller_error: float = 0.0
    controller_shares: int = 0
    #: Redpanda's free-space alert: 0 ok, 1 low space, 2 degraded
    disk_alert_state: int = 0
    remote_deleted_objects_total: int = 0
    local_deleted_segments_total: int = 0
    #: partitions whose latest housekeeping found no head over history, or a head that lost
    #: history (collection stopped for them; docs/format.md, "Losing objects")
    partitions_lost_history: int = 0
    #: heads restored from their copies
    heads_restored_total: int = 0
    #: full housekeeping passes a census of the bucket spared (`archiver.housekeeping_census`)
    census_spared_total: int = 0
    #: the object store's request counters (operations, attempts, retries, errors, exhausted)
    store_retry_stats: dict[str, int] = field(default_factory=dict)
    #: this node's upload leases (held now, handovers, what they cost)
    leases: LeaseStats = field(default_factory=LeaseStats)


def remote_section(m: PartitionManifest | None, error: str | None = None, *,
                   compacted: bool | None = None) -> dict[str, Any]:
    """The `remote` part of a describe-storage row: what the head manifest `m` holds, and the
    error that kept it from being read. For a compacted topic (`compacted`; None: when the
    head lists a compacted copy) it adds `dirty_ratio`, what `tiered compact` decides by
    (docs/compaction.md)."""
    remote: dict[str, Any] = {"start_offset": None, "last_offset": None, "size_bytes": 0,
                              "segments": 0, "archived_manifests": 0}
    if error is not None:
        remote["error"] = error
    if m is not None and m.last_offset >= 0:
        remote.update(
            start_offset=m.log_start_offset, last_offset=m.last_offset, size_bytes=m.cloud_bytes,
            segments=len(m.segments) + sum(e.segment_count for e in m.archives),
            archived_manifests=len(m.archives))
    if m is not None and (compacted or (compacted is None and any(m.segments.column(
            "compacted")))):
        remote["dirty_ratio"] = dirty_ratio(m)
    return remote


def dirty_ratio(m: PartitionManifest) -> float | None:
    """The share of the head's bytes not compacted yet (None: no segment in the head)."""
    sizes, flags = m.segments.column("size_bytes"), m.segments.column("compacted")
    total = sum(sizes)
    if not total:
        return None
    return round(sum(s for s, c in zip(sizes, flags, strict=True) if not c) / total, 4)


def storage_row(part: PartitionLog, snap: LogSnapshot | None, view: PartitionView | None,
                m: PartitionManifest | None, error: str | None = None, *,
                uploader: tuple[str | None, str] = (None, "uploader"),
                compacted: bool | None = None) -> dict[str, Any]:
    """One partition's `describe-storage` row: what is local, what is in the bucket, what is
    still pending upload and below which offset local data may go, and who uploads it
    (`uploader`: the node holding its upload lease or None, and this node's role)."""
    remote = remote_section(m, error, compacted=compacted)
    hw = part.high_watermark
    if hw is None and snap is not None:
        hw = snap.high_watermark
    segments = 0 if snap is None else len(snap.closed) + (snap.active is not None)
    return {
        "topic": part.topic,
        "partition": part.partition,
        "high_watermark": hw,
        "local": {
            "start_offset": part.log_start_offset,
            "last_offset": _local_last_offset(part),
            "size_bytes": 0 if view is None else view.size_bytes,
            "segments": segments,
        },
        "remote": remote,
        "pending_bytes": 0 if view is None else upload_backlog_bytes([view]),
        "safe_to_delete_below": None if view is None else safe_delete_below(view),
        "uploader": uploader[0],
        "role": uploader[1],
    }


def _local_last_offset(part: PartitionLog) -> int | None:
    """Offset of the last record on local disk, None for an empty log."""
    try:
        end = part.log_end_offset()
    except (TieredError, OSError):
        return None
    start = part.log_start_offset
    return None if end is None or start is None or end <= start else end - 1
