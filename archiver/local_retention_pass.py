"""Local retention over every partition of the log dirs: the views the space policy works on
(`archiver.space`), the committed heads it may trust, and the pass that deletes what they
cover or only advises (`archiver.local_retention` carries the deletions out).

A partition this node uploads deletes only what a freshly read, valid head covers
(docs/design.md, invariant 2); one another node uploads (a standby) reads its head only when
that could change a decision, so a standby within its targets costs no request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from archiver.lease_keeper import Ownership
from archiver.local_retention import (
    LocalRetentionResult,
    advise_only,
    combined_disk,
    enforce,
    partition_view,
    plan_deletions,
)
from archiver.log_view import SegmentFacts, snapshot_of
from archiver.partition_state import PartitionState, revision_of
from archiver.reports import PartitionReport, PassReport
from archiver.space import DiskInfo, PartitionView, SpaceParams, advise, safe_delete_below
from archiver.upload_policy import LogSnapshot
from archiver.uploader import ArchivalCursor
from manifests.commit import ManifestStore
from manifests.errors import CorruptManifest
from manifests.manifest import PartitionManifest
from tiered.config import Config, TopicConfig
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog, PartitionLog

log = logging.getLogger(__name__)

__all__ = ["LocalRetentionPass"]


@dataclass(frozen=True, slots=True)
class _Memo:
    """A partition's view, with the inputs it was computed from (compared by identity)."""

    part: PartitionLog
    manifest: PartitionManifest | None
    tc: TopicConfig
    active_size: int
    view: PartitionView
    snap: LogSnapshot


class LocalRetentionPass:
    """Local retention and the partition views (also what the controller's backlog and
    describe-storage are computed from). Keeps the space-management cursor between passes."""

    def __init__(self, config: Config, mstore: ManifestStore, ownership: Callable[[], Ownership],
                 facts: SegmentFacts, *, topic_config: Callable[[str], TopicConfig],
                 now_ms: Callable[[], int], disk_usage: Callable[[Path], DiskInfo],
                 space_params: SpaceParams) -> None:
        self.config = config
        self.mstore = mstore
        self._ownership = ownership
        self.facts = facts
        self.disk_usage = disk_usage
        self.space_params = space_params
        self._topic_config = topic_config
        self._now_ms = now_ms
        self._space_cursor = 0
        #: the last view of each partition and what it was computed from (`_view`)
        self._views: dict[TopicPartition, _Memo] = {}

    @property
    def ownership(self) -> Ownership:
        """The archiver's, as it is now (a daemon sets its lease keeper after construction)."""
        return self._ownership()

    def views(self, states: list[PartitionState]) -> tuple[list[PartitionView], dict[
            TopicPartition, LogSnapshot], list[PartitionReport]]:
        views: list[PartitionView] = []
        snaps: dict[TopicPartition, LogSnapshot] = {}
        failed: list[PartitionReport] = []
        if len(self._views) > 2 * len(states) + 64:  # partitions gone from the log dirs
            self._views = {s.tp: self._views[s.tp] for s in states if s.tp in self._views}
        for s in states:
            try:
                view, snap = self._view(s.log, s.cursor)
            except (TieredError, OSError) as err:
                failed.append(PartitionReport(s.tp.topic, s.tp.partition, decision="error",
                                              error=f"local log: {err}"))
                continue
            views.append(view)
            snaps[s.tp] = snap
        return views, snaps, failed

    def _view(self, part: PartitionLog, cursor: ArchivalCursor | None, *, keep: bool = True
              ) -> tuple[PartitionView, LogSnapshot]:
        """The partition's view and log snapshot; the last ones again while their inputs are
        the same objects and the active segment has the same size (an unchanged partition
        keeps its `PartitionLog`, `LocalLog`'s `reuse_unchanged`): the controller and local
        retention ask for every partition's view, and most are idle (docs/operations.md).
        `keep`: remember this one (not for a listing of its own, whose objects are new)."""
        tc = self._topic_config(part.topic)
        # the last head this process saw committed, even when due for a re-read: the offsets
        # a committed head covers only grow, so an older copy can only under-state them
        m = cursor.manifest if cursor is not None else None
        active = part.active_segment
        size = -1 if active is None else active.size()
        memo = self._views.get(part.tp)
        if memo is not None and memo.part is part and memo.manifest is m and memo.tc is tc \
                and memo.active_size == size:
            return memo.view, memo.snap
        snap = snapshot_of(part, self.facts)
        uploaded = None if m is None or m.last_offset < 0 else m.last_offset
        covered = {} if m is None or uploaded is None else _covered_bytes(m, snap, uploaded)
        view = partition_view(part.topic, part.partition, snap, tc, uploaded, covered)
        if keep:
            self._views[part.tp] = _Memo(part, m, tc, size, view, snap)
        return view, snap

    def fresh_views(self, states: list[PartitionState]) -> list[PartitionView]:
        """Views of a listing of the log dirs of its own, with the committed offsets the
        cursors hold: what the controller needs mid-round (segments rolled since the round's
        scan count) without touching the partition state the round is using."""
        known = {s.tp: s for s in states}
        views = []
        for part in LocalLog(self.config.log_dirs):
            state = known.get(part.tp)
            cursor = state.cursor if state and state.revision == revision_of(part) else None
            try:
                views.append(self._view(part, cursor, keep=False)[0])
            except (TieredError, OSError) as err:
                log.debug("%s: left out of the backlog: %s", part.tp, err)
        return views

    def _standbys_to_refresh(self, states: list[PartitionState], enforcing: bool
                             ) -> list[PartitionState]:
        """The partitions another node uploads whose committed head local retention needs
        now: in enforce mode those it would trim if the bucket covered every closed segment,
        in advise mode those it would warn about if the bucket covered none. A standby whose
        local log is within its targets costs no request (the head is read only when it
        could change a decision)."""
        standby = [s for s in states if not self.ownership.role(s.pid).uploader]
        if not standby:
            return []
        views, _, _ = self.views(standby)
        if enforcing:
            views = [replace(v, uploaded_last_offset=v.segments[-1].last_offset)
                     if v.segments else v for v in views]
            disk = combined_disk(self.config.log_dirs, self.disk_usage)
            planned, _ = plan_deletions(views, disk, self.space_params, self._now_ms(),
                                        cursor=self._space_cursor)
            wanted = {(t, p) for t, p, _ in planned}
        else:
            interval = self.config.cluster_int("cloud_storage_housekeeping_interval_ms")
            segment = self.config.cluster_int("log_segment_size")
            views = [replace(v, uploaded_last_offset=None) for v in views]
            result = advise(views, self._now_ms(), margin_ms=2 * interval,
                                         margin_bytes=segment)
            wanted = {(a.topic, a.partition) for a in result if a.at_risk}
        return [s for s in standby if (s.tp.topic, s.tp.partition) in wanted]

    def _refresh_standbys(self, states: list[PartitionState]) -> None:
        """Read the committed head of each partition in `states` another node uploads: a
        standby never commits, so only a fresh read tells it what the bucket covers (what
        its local retention may delete, what is still pending)."""
        for s in states:
            if self.ownership.role(s.pid).uploader:
                continue
            try:
                if not self._topic_config(s.tp.topic).remote_write:
                    continue
                m, etag = self.mstore.load(s.tp.topic, s.tp.partition, s.revision)
            except (TieredError, OSError) as err:
                log.debug("%s: could not read the head manifest: %s", s.tp, err)
                continue
            with s.lock:
                old = s.cursor.manifest
                if old is None or m.last_offset >= old.last_offset:
                    # loaded stays False: should this node take the partition over, its first
                    # round reads the head again rather than trust this copy
                    s.cursor.manifest, s.cursor.etag, s.cursor.loaded = m, etag, False

    def _unproven_heads(self, states: list[PartitionState]) -> set[tuple[str, int]]:
        """Partitions this node uploads whose head, read afresh, is missing, garbled or
        covers less than this process last committed: their local segments stay
        (docs/design.md, invariant 2: delete only what a freshly read, valid head covers). An
        unreachable store is no such evidence; the committed copy this process holds still
        counts. The caller holds every partition's lock."""
        out: set[tuple[str, int]] = set()
        for s in states:
            if (not self.ownership.role(s.pid).uploader
                    or not self._topic_config(s.tp.topic).remote_write):
                continue
            held = s.cursor.manifest
            if held is None or held.last_offset < 0:
                continue  # nothing this process would delete on
            try:
                m, _ = self.mstore.load(s.tp.topic, s.tp.partition, s.revision)
            except CorruptManifest as err:
                log.warning("%s: the head manifest is damaged (%s); no local segment is "
                            "deleted until it is repaired", s.tp, err)
                out.add((s.tp.topic, s.tp.partition))
                continue
            except (TieredError, OSError) as err:
                log.debug("%s: could not read the head manifest: %s", s.tp, err)
                continue
            if m.last_offset < held.last_offset:
                log.warning("%s: the head manifest in the bucket ends at %d, below %d this "
                            "node committed (gone or replaced); no local segment is deleted",
                            s.tp, m.last_offset, held.last_offset)
                out.add((s.tp.topic, s.tp.partition))
        return out

    @contextmanager
    def _all_locked(self, states: list[PartitionState]) -> Iterator[None]:
        with ExitStack() as stack:
            for s in states:  # sorted by partition: one global order, no lock cycles
                stack.enter_context(s.lock)
            yield

    def run(self, states: list[PartitionState]) -> tuple[PassReport, DiskInfo]:
        """Enforce mode: delete local segments a committed manifest covers, by the local
        targets and the space-management phases. Advise mode: report only. Either way the
        disk alert state is the caller's to update, from the disk returned."""
        enforcing = self.config.log_retention_mode == "enforce"
        report = PassReport()
        disk = combined_disk(self.config.log_dirs, self.disk_usage)
        self._refresh_standbys(self._standbys_to_refresh(states, enforcing))
        with self._all_locked(states):
            views, _, failed = self.views(states)
            now = self._now_ms()
            if enforcing:
                # only partitions that would lose a segment read their head: an idle one
                # costs no request; a head garbled or gone proves nothing, so nothing of it
                # is deleted
                planned, _ = plan_deletions(views, disk, self.space_params, now,
                                            cursor=self._space_cursor)
                touched = {(t, p) for t, p, _ in planned}
                unproven = self._unproven_heads(
                    [s for s in states if (s.tp.topic, s.tp.partition) in touched])
                views = [replace(v, uploaded_last_offset=None)
                         if (v.topic, v.partition) in unproven else v for v in views]
                dirs = {(s.tp.topic, s.tp.partition): s.log.dir for s in states}
                result = enforce(views, dirs, disk, self.space_params, now,
                                 cursor=self._space_cursor)
                self._space_cursor = result.next_cursor
            else:
                interval = self.config.cluster_int("cloud_storage_housekeeping_interval_ms")
                segment = self.config.cluster_int("log_segment_size")
                result = advise_only(views, now, margin_ms=2 * interval, margin_bytes=segment)
        report.partitions = self._retention_rows(views, result, enforcing) + failed
        report.errors = list(result.errors)
        report.deleted_local_segments = len(result.deleted)
        return report, disk

    def _retention_rows(self, views: list[PartitionView], result: LocalRetentionResult,
                        enforcing: bool) -> list[PartitionReport]:
        deleted: dict[tuple[str, int], int] = {}
        for d in result.deleted:
            deleted[(d.topic, d.partition)] = deleted.get((d.topic, d.partition), 0) + 1
        advice = {(a.topic, a.partition): a for a in result.advice}
        rows = []
        for v in views:
            row = PartitionReport(v.topic, v.partition,
                                  decision="local_retention" if enforcing else "advise",
                                  safe_to_delete_below=safe_delete_below(v))
            if not v.remote_write:
                row.decision = "remote_write_off"
            elif enforcing:
                row.detail = f"deleted {deleted.get((v.topic, v.partition), 0)} segment(s)"
            elif (a := advice.get((v.topic, v.partition))) is not None and a.at_risk:
                row.detail = (f"at risk: {a.unuploaded_bytes} bytes not yet uploaded are close "
                              "to the broker's retention")
            rows.append(row)
        return rows


def _covered_bytes(m: PartitionManifest, snap: LogSnapshot, uploaded: int) -> dict[int, int]:
    """Bytes the head's segments hold of each local segment that reaches past `uploaded` but
    starts at or below it (a prefix uploaded by idle timeout, the active segment's included):
    the backlog leaves them out. Only the head's newest segments can be such a prefix."""
    starts = [s.base_offset for s in snap.closed if s.base_offset <= uploaded < s.last_offset]
    if snap.active is not None and snap.active.base_offset <= uploaded:
        starts.append(snap.active.base_offset)
    if not starts:
        return {}
    covered = dict.fromkeys(starts, 0)
    lowest = min(starts)
    for i in range(len(m.segments) - 1, -1, -1):
        seg = m.segments[i]
        if seg.base_offset < lowest:
            break
        owner = max((b for b in starts if b <= seg.base_offset), default=None)
        if owner is not None:
            covered[owner] += seg.size_bytes
    return covered
