"""Remote housekeeping of the partitions this node uploads: remote retention, garbage
collection of replaced segments, expired archived manifests and orphans
(`archiver.retention.GarbageCollector`), one partition at a time under its lock.

`RemoteHousekeeper` decides from the bucket as it is now, never from the cursor's copy (another
writer may have committed since); a partition whose last full housekeeping found nothing
waiting, less than a GC grace period ago, and whose head has nothing due costs no request
until then: `quiet`. In the daemon, one listing of the bucket then tells which of those
partitions are still as that housekeeping left them, and spares them their full pass for
another grace period (`archiver.housekeeping_census`).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from archiver.housekeeping_census import Judged, shards
from archiver.lease_keeper import Ownership
from archiver.partition_state import PartitionState, fencing_term, role_of
from archiver.reports import ArchiverStats, PartitionReport, PassReport
from archiver.retention import GarbageCollector, retention_start_offset
from archiver.space import RetentionLimits
from archiver.uploader import UploadOutcome
from manifests import edits
from manifests.commit import ManifestStore
from manifests.errors import HistoryWithoutHead, ManifestConflict, StaleTerm
from manifests.lease_objects import PartitionId
from tiered.config import TopicConfig
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition

log = logging.getLogger(__name__)

__all__ = ["RemoteHousekeeper", "keep_housekept"]


def keep_housekept(state: PartitionState, before: str | None, out: UploadOutcome,
                   now_ms: int) -> None:
    """After a round: its objects are all named by the head it committed when nothing
    failed, raced or was left behind, so a partition that had nothing for garbage
    collection before the round (its last housekeeping found nothing waiting, or the
    round created the head after a listing that held nothing else) still has nothing
    (`RemoteHousekeeper.quiet`). Any other outcome leaves it to a full housekeeping."""
    if not out.commits:
        return
    carried = before is not None and before == state.housekept_etag
    clean = out.error is None and not out.conflicts and not out.upload_errors and (
        out.listed_clean or carried)
    state.housekept_etag = state.cursor.etag if clean else None
    if clean and not carried:
        state.housekept_ms = now_ms


class RemoteHousekeeper:
    """Housekeeps the partitions of a remote-write topic whose lease this node holds, and
    counts what it did in the archiver's `stats` (under the archiver's `lock`)."""

    def __init__(self, mstore: ManifestStore, gc: GarbageCollector,
                 ownership: Callable[[], Ownership], *, topic_config: Callable[[str], TopicConfig],
                 now_ms: Callable[[], int], stats: ArchiverStats, lock: threading.RLock) -> None:
        self.mstore = mstore
        self.gc = gc
        self._ownership = ownership
        self._topic_config = topic_config
        self._now_ms = now_ms
        self._stats = stats
        self._lock = lock
        #: partitions whose latest housekeeping found history lost (ArchiverStats)
        self._history_lost: set[TopicPartition] = set()
        #: the daemon's: each partition's first full pass falls at its own point of the first
        #: GC grace period, not all of them at start (`spread_first_pass`)
        self.spread_first_full_pass = False
        #: the daemon's: a pass first takes a census of the bucket (`take_census`)
        self.census = False
        self._seen: set[TopicPartition] = set()

    @property
    def ownership(self) -> Ownership:
        """The archiver's, as it is now (a daemon sets its lease keeper after construction)."""
        return self._ownership()

    def run(self, states: list[PartitionState], concurrency: int, *,
            stopping: Callable[[], bool] = lambda: False) -> PassReport:
        """Remote retention, replaced-segment and archived-manifest GC and orphan GC for every
        partition of a remote-write topic, `budget.concurrency` partitions at a time (each
        lists its prefixes: one after another, a thousand partitions take minutes). Once
        `stopping`, the partitions not yet started are left for the next pass."""
        if not states:
            return self.report([])
        if self.census:
            self.take_census(states, concurrency, stopping)

        def one(state: PartitionState) -> tuple[PartitionReport | None, int]:
            return (None, 0) if stopping() else self.partition(state)

        workers = max(1, min(len(states), concurrency))
        with ThreadPoolExecutor(workers, thread_name_prefix="housekeeping") as pool:
            return self.report(list(pool.map(one, states)))

    def report(self, results: list[tuple[PartitionReport | None, int]]) -> PassReport:
        """The report of housekeeping results, counted in the stats."""
        report = PassReport()
        for row, deleted in results:
            report.deleted_remote_objects += deleted
            if row is not None:
                report.partitions.append(row)
        with self._lock:
            self._stats.remote_deleted_objects_total += report.deleted_remote_objects
        return report

    def partition(self, state: PartitionState) -> tuple[PartitionReport | None, int]:
        """The partition's housekeeping row (None: not housekept) and objects it deleted; a
        quiet partition sends no request (`quiet`)."""
        tp = state.tp
        row = PartitionReport(tp.topic, tp.partition, decision="housekept")
        with state.lock:
            try:
                housekept, limits = self._housekept_here(state)
                if not housekept:
                    return None, 0
                cursor = state.cursor
                now = self._now_ms()
                if self.spread_first_full_pass and tp not in self._seen:
                    self._seen.add(tp)
                    self.spread_first_pass(state, now)
                if self.quiet(state, limits, now):
                    return row, 0
                # from the bucket as it is now, never the cursor's copy: another writer (a
                # merge, a second daemon) may have committed since the cursor last looked
                out = self.gc.housekeep(state.target(), term=state.term, limits=limits,
                                        now_ms=now)
            except StaleTerm as err:
                state.fenced_by = fencing_term(self.mstore, state)
                self.ownership.lost(state.pid)
                row.decision, row.error = "fenced", str(err)
                return row, 0
            except ManifestConflict as err:
                state.cursor.loaded = False
                row.decision, row.error = "error", f"{err} (retried next pass)"
                return row, 0
            except (TieredError, OSError) as err:
                state.cursor.loaded = False
                self._lost_history(state.tp, isinstance(err, HistoryWithoutHead))
                row.decision, row.error = "error", f"{type(err).__name__}: {err}"
                return row, 0
            cursor.manifest, cursor.etag = out.manifest, out.etag
            waiting = out.waiting or out.errors or out.lost_history or out.etag is None
            state.housekept_etag = None if waiting else out.etag
            state.housekept_ms = now
            state.housekept_listing = (None if waiting or out.etag is None
                                       or out.fingerprint is None
                                       else (out.etag, out.fingerprint))
        self._lost_history(state.tp, out.lost_history)
        with self._lock:
            self._stats.commits_total += out.commits
        if out.errors:
            row.error = "; ".join(out.errors)
        if out.new_start_offset is not None:
            row.detail = f"remote start offset now {out.new_start_offset}"
        return row, out.deleted_objects

    def _housekept_here(self, state: PartitionState) -> tuple[bool, RetentionLimits | None]:
        """Whether this process housekeeps the partition now (a remote-write topic whose
        lease it holds, not fenced), and the remote retention limits that then apply."""
        tc = self._topic_config(state.tp.topic)
        if not tc.remote_write or not role_of(self.ownership, state).uploader or (
                state.fenced_by is not None and state.term <= state.fenced_by):
            return False, None
        if tc.remote_retention_applies:
            return True, RetentionLimits(tc.retention_ms, tc.retention_bytes)
        return True, None

    def take_census(self, states: list[PartitionState], concurrency: int,
                    stopping: Callable[[], bool] = lambda: False) -> int:
        """When some partition is quiet but for its grace period having passed, list the
        bucket once (`concurrency` pieces at a time) and count every quiet partition the
        listing shows as its last full pass left it as housekept now
        (`archiver.housekeeping_census`): no request of its own until one more grace period
        has passed. Returns how many it spared; the others have their full pass as before.
        A piece whose listing failed or gave up spares none."""
        now = self._now_ms()
        judged: dict[PartitionId, Judged] = {}
        by_pid: dict[PartitionId, PartitionState] = {}
        due = 0
        for state in states:
            with state.lock:
                listing = state.housekept_listing
                if listing is None or state.cursor.etag != listing[0] or (
                        state.housekept_etag != listing[0]):
                    continue
                try:
                    housekept, limits = self._housekept_here(state)
                except TieredError:
                    continue
                if not housekept or not self._settled(state, limits, now):
                    continue
                judged[state.pid], by_pid[state.pid] = listing, state
                due += now - state.housekept_ms >= self.gc.grace_ms
        if not due:
            return 0
        pieces = shards(judged)

        def take(digit: str) -> list[PartitionId]:
            census = pieces[digit]
            try:
                for info in self.mstore.store.list(digit):
                    if stopping() or not census.feed(info):
                        break
            except TieredError as exc:
                log.warning("housekeeping census: listing %s... failed (%s); its partitions "
                            "have their full pass instead", digit, exc)
                return []
            if census.gave_up:
                log.info("housekeeping census: more than %d objects of other partitions under "
                         "%s..., more than the full passes of its %d partition(s) would cost; "
                         "full passes instead", census.max_foreign, digit, len(census.judged))
            return [] if stopping() else census.unchanged()

        with ThreadPoolExecutor(max(1, min(len(pieces), concurrency)),
                                thread_name_prefix="census") as pool:
            unchanged = [pid for found in pool.map(take, pieces) for pid in found]
        spared = 0
        for pid in unchanged:
            state = by_pid[pid]
            with state.lock:  # an upload round may have committed since: then not spared
                listing = judged[pid]
                if (state.housekept_listing == listing and state.cursor.etag == listing[0]
                        and state.housekept_etag == listing[0]):
                    state.housekept_ms = max(state.housekept_ms, now)
                    spared += 1
        with self._lock:
            self._stats.census_spared_total += spared
        log.info("housekeeping census: listed %d object(s); %d of %d quiet partition(s) are "
                 "as their last full pass left them (%d were due a full pass)",
                 sum(c.objects for c in pieces.values()), spared, len(judged), due)
        return spared

    def spread_first_pass(self, state: PartitionState, now_ms: int) -> None:
        """Count the partition as fully housekept at a point of the last grace period fixed by
        its name, when this process holds its head: its first full pass then comes within
        one grace period, and a restart at thousands of partitions lists and reads them
        over that period instead of all at once (docs/operations.md, "An idle partition").
        What it delays, by at most one grace period, is what any quiet partition leaves to
        its next full pass (`quiet`): orphans, another writer's replaced segments and the
        restore of a head lost after the start read it; anything due in the head it read
        (replaced segments, retention) still ends the quiet path at the next pass."""
        cursor = state.cursor
        if state.housekept_etag is None and cursor.loaded and cursor.etag is not None:
            state.housekept_etag = cursor.etag
            state.housekept_ms = now_ms - zlib.crc32(str(state.tp).encode()) % max(
                1, self.gc.grace_ms)

    def quiet(self, state: PartitionState, limits: RetentionLimits | None, now_ms: int
              ) -> bool:
        """Whether housekeeping has nothing to do on the partition until its next full pass,
        so this pass sends no request for it: the last full housekeeping found nothing
        waiting (no young orphans, no fault) less than a GC grace period ago and left the head
        version this process holds, or every round since only added objects it committed;
        and that version has nothing due (no replaced segments, no expired archives, nothing
        remote retention would cut).

        What waits for the next full pass, at most one grace period away: an orphan another
        writer left (a fenced holder's late upload, a merge that never committed), which
        could not be collected sooner; replaced segments of another writer's commit, which
        wait out a grace period anyway; and a head the bucket lost or garbled, which this
        process's next commit also finds (its compare-and-swap fails) and which readers serve
        from its copy meanwhile (docs/format.md, "Losing objects")."""
        return (now_ms - state.housekept_ms < self.gc.grace_ms
                and self._settled(state, limits, now_ms))

    @staticmethod
    def _settled(state: PartitionState, limits: RetentionLimits | None, now_ms: int) -> bool:
        """`quiet` but for the grace period: the last full housekeeping found nothing waiting
        and left the head version the cursor holds, and that version has nothing due."""
        cursor = state.cursor
        m, etag = cursor.manifest, cursor.etag
        if m is None or etag is None or not cursor.loaded or etag != state.housekept_etag:
            return False
        if m.replaced or edits.expired_archives(m):
            return False
        if limits is not None and (limits.ms is not None or limits.bytes is not None):
            if m.archives:
                return False  # the history is in archived manifests: read them to decide
            start = retention_start_offset(lambda: m.segments, limits, now_ms)
            if start is not None and start > m.log_start_offset:
                return False
        return True

    def _lost_history(self, tp: TopicPartition, lost: bool) -> None:
        """Keep the set of partitions whose housekeeping found lost history (a metric)."""
        with self._lock:
            if lost:
                self._history_lost.add(tp)
            else:
                self._history_lost.discard(tp)
            self._stats.partitions_lost_history = len(self._history_lost)
