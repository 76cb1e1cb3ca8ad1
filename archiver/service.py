"""The archiver service: composes the write path's policies and edges for every partition.

`Archiver` owns the per-partition state (the committed manifest and its ETag, the idle timer,
fencing) and runs the passes the daemon schedules and `tiered archive --once` runs in a row:

* `scan` re-reads the log dirs (new partitions, rolled and deleted segments, the writer term);
* `upload_round` uploads what `upload_policy` picks for every partition, in parallel within
  the controller's upload budget, and commits the manifests (`archiver.uploader`);
* `housekeeping` applies remote retention and collects garbage (`archiver.retention`);
* `local_retention` deletes covered local segments or only advises
  (`archiver.local_retention`), and computes the disk alert;
* `update_controller` turns the upload backlog into shares and the upload budget.

Which partitions this process writes to the bucket is its `Ownership`'s to say
(`archiver.lease_keeper`): with upload leases, only the partitions whose lease this node holds are
uploaded, housekept and collected, as the lease's generation; the others are on standby,
where local retention still deletes what the bucket's committed manifest covers.

A fault in one partition is reported in that partition's `PartitionReport` and never stops the
others (design invariant 9). Thread model: the passes may be called from different threads;
each partition's state is guarded by its own lock, and upload threads come from executors
created per round with the current budget.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from archiver import controller
from archiver.controller import ControllerOutput, ControllerParams, ControllerState, UploadBudget
from archiver.lease_keeper import Ownership, Role, SoleWriter
from archiver.local_retention import (
    LocalRetentionResult,
    advise_only,
    combined_disk,
    enforce,
    partition_view,
    plan_deletions,
    real_disk_usage,
)
from archiver.log_view import SegmentFacts, snapshot_of
from archiver.reports import ArchiverStats, PartitionReport, PassReport, storage_row
from archiver.retention import GarbageCollector, retention_start_offset
from archiver.space import (
    DiskInfo,
    PartitionView,
    RetentionLimits,
    SpaceParams,
    advise,
    disk_alert_state,
    safe_delete_below,
    upload_backlog_bytes,
)
from archiver.upload_budget import UploadThrottle
from archiver.upload_policy import LogSnapshot, UploadParams
from archiver.uploader import (
    ArchivalCursor,
    PartitionTarget,
    UploadGate,
    UploadOutcome,
    archive_partition,
    head,
)
from manifests import edits
from manifests.commit import ManifestStore
from manifests.errors import CorruptManifest, HistoryWithoutHead, ManifestConflict, StaleTerm
from manifests.lease_objects import PartitionId
from manifests.manifest import PartitionManifest
from manifests.spillover import ManifestSettings
from manifests.topic import TopicManifest, save_topic_manifest
from tiered.config import Config, TopicConfig
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition, topic_id_to_str
from tiered.kafka.local_log import LocalLog, PartitionLog
from tiered.store.base import ObjectStore

log = logging.getLogger(__name__)

#: shortest pause between the controller's updates during an upload round, whatever
#: cloud_storage_upload_ctrl_update_interval_ms says (each update lists the log dirs)
#: partitions housekept at once while a one-shot pass is still uploading: few, since they
#: share the connection pool with the uploads
PASS_HOUSEKEEPING_WORKERS = 2

__all__ = ["Archiver", "ArchiverStats", "PartitionReport", "PassReport", "revision_of", "term_of"]


@dataclass
class _Partition:
    """The archiver's state of one partition. `lock` guards the cursor and fencing; `log`
    and `term` are replaced whole by `scan` (a round reads them once, through `target`)."""

    log: PartitionLog
    revision: str
    term: int
    cursor: ArchivalCursor
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the manifest term that fenced this writer; it stays out until its own term passes it
    fenced_by: int | None = None
    #: (log, head ETag, term, decision) when a round last found nothing to upload: while the
    #: scan keeps the same PartitionLog (nothing rolled, no offset moved), the head and the
    #: term are the same and no idle upload is due, the next round would decide the same
    settled: tuple[PartitionLog, str | None, int, str] | None = None
    #: the head's ETag as this process's last full housekeeping left it, when that found
    #: nothing waiting for a later pass (young orphans, a fault): while the cursor still
    #: holds that version and its copy shows nothing due, housekeeping costs no request
    housekept_etag: str | None = None
    #: when (ms) that full housekeeping ran, or the listing that made the partition's head
    housekept_ms: int = 0

    @property
    def tp(self) -> TopicPartition:
        return self.log.tp

    @property
    def pid(self) -> PartitionId:
        return PartitionId(self.log.topic, self.log.partition, self.revision)

    def target(self) -> PartitionTarget:
        return PartitionTarget(self.log, self.revision, self.term)


def revision_of(part: PartitionLog) -> str:
    """The bucket revision of a partition: its topic id, or "0" when it has none."""
    return "0" if part.topic_id is None else topic_id_to_str(part.topic_id)


def term_of(part: PartitionLog) -> int:
    """The writer term: the partition's latest leader epoch (checkpoint, else the last batch)."""
    if part.leader_epochs:
        return part.leader_epochs[-1].epoch
    active = part.active_segment
    try:
        last = active.last_batch() if active is not None else None
    except (TieredError, OSError):
        last = None
    return max(0, last.partition_leader_epoch) if last is not None else 0


class Archiver:
    """Archives every partition of the configured log dirs into `store` (see module doc).

    `clock` is seconds since the epoch (remote retention, grace periods and the idle timer
    compare it with record timestamps and object mtimes); `disk_usage` reports a log dir's
    filesystem (default `shutil.disk_usage`); `fixed_shares` pins the controller's output
    (benchmarks); `term` overrides the writer term read from the log; `max_upload_bandwidth`
    (bytes/s, None: unthrottled) and `max_upload_concurrency` (default
    `cloud_storage_max_connections`) are what the maximum shares buy. `ownership` says which
    partitions this process uploads, and as which term (default: all, as the log's leader
    epoch: a sole writer)."""

    def __init__(
        self,
        config: Config,
        store: ObjectStore,
        *,
        clock: Callable[[], float] = time.time,
        disk_usage: Callable[[Path], DiskInfo] | None = None,
        fixed_shares: int | None = None,
        term: int | None = None,
        max_upload_bandwidth: int | None = None,
        max_upload_concurrency: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        ownership: Ownership | None = None,
    ) -> None:
        cluster = config.cluster
        # the sole writer is this node: describe-storage names it as the uploader
        self.ownership: Ownership = ownership or SoleWriter(_node_name(config))
        self.config = config
        self.store = store
        self.clock = clock
        self.disk_usage = disk_usage or real_disk_usage
        self.term_override = term
        self.mstore = ManifestStore(store, ManifestSettings.from_cluster(cluster))
        self.upload_params = UploadParams.from_cluster(cluster)
        self.ctrl_params = ControllerParams.from_cluster(cluster)
        self.space_params = SpaceParams.from_cluster(cluster)
        self.fixed_shares = fixed_shares
        self.max_bandwidth = max_upload_bandwidth
        self.max_concurrency = max_upload_concurrency or config.cluster_int(
            "cloud_storage_max_connections", 1)
        self.gc = GarbageCollector(self.mstore,
                                   grace_ms=config.cluster_int("cloud_storage_gc_grace_period_ms"))
        self.facts = SegmentFacts()
        self._ctrl_state = ControllerState.initial(self.ctrl_params)
        self._ctrl_output = ControllerOutput(0.0, fixed_shares or self._ctrl_state.shares, 0.0,
                                             False)
        self.throttle = UploadThrottle(self.ctrl_params, shares=self._ctrl_output.shares,
                                       max_bandwidth=self.max_bandwidth,
                                       max_concurrency=self.max_concurrency, sleep=sleep)
        self.limiter, self.slots = self.throttle.limiter, self.throttle.slots
        self._gate = UploadGate(self.limiter, self.slots)
        self._space_cursor = 0
        #: set when local files vanished under a listing: the next round re-lists the log dirs
        self._rescan = False
        self._lock = threading.RLock()  # partitions dict, stats, controller state
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._topic_manifests: dict[tuple[str, str], TopicManifest] = {}  # by (topic, rev)
        self._stats = ArchiverStats(controller_shares=self._ctrl_output.shares)
        #: partitions whose latest housekeeping found history lost (ArchiverStats)
        self._history_lost: set[TopicPartition] = set()
        #: effective topic settings by topic (the configuration is fixed for the archiver's
        #: life, and resolving them is most of an idle round's work at thousands of partitions)
        self._topic_configs: dict[str, TopicConfig | TieredError] = {}
        # an idle partition's directory is not re-read by a scan, and keeps its PartitionLog
        self._local = LocalLog(config.log_dirs, reuse_unchanged=True)
        self._adopt()

    # -- discovery -------------------------------------------------------------------------------

    def _topic_config(self, topic: str) -> TopicConfig:
        """`Config.topic_config`, resolved once per topic (its error too)."""
        got = self._topic_configs.get(topic)
        if got is None:
            try:
                got = self.config.topic_config(topic)
            except TieredError as err:
                got = err
            self._topic_configs[topic] = got
        if isinstance(got, TieredError):
            raise got
        return got

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def scan(self) -> None:
        """Re-read the log dirs: new partitions are adopted, vanished ones dropped, and every
        partition's segments, high watermark and term refreshed."""
        with self._lock:
            found = self._local.scan()
            self._adopt()
            if found.removed or found.changed:  # files went: forget what was known of them
                self.facts.forget_missing(self._partitions)

    def _adopt(self) -> None:
        found = {p.tp: p for p in self._local}
        for tp in list(self._partitions):
            if tp not in found:
                log.info("%s: partition left the log dirs", tp)
                del self._partitions[tp]
        for tp, part in found.items():
            term = self.term_override if self.term_override is not None else term_of(part)
            state = self._partitions.get(tp)
            revision = revision_of(part)
            if state is None or state.revision != revision:
                cursor = ArchivalCursor(None, None, self._now_ms())
                self._partitions[tp] = _Partition(part, revision, term, cursor)
                log.debug("%s: archiving as revision %s, term %d", tp, revision, term)
            else:
                state.log, state.term = part, term
        self.ownership.publish(self.replicas())

    def replicas(self) -> dict[PartitionId, int]:
        """The partitions this node would upload (remote write on) with their high
        watermarks: what the upload leases are shared out by."""
        out: dict[PartitionId, int] = {}
        for state in self._partitions.values():
            try:
                if not self._topic_config(state.tp.topic).remote_write:
                    continue
                hw = state.log.high_watermark
                out[state.pid] = hw if hw is not None else (state.log.log_end_offset() or 0)
            except (TieredError, OSError) as err:
                log.debug("%s: left out of the lease shares: %s", state.tp, err)
        return out

    def _role(self, state: _Partition) -> Role:
        """This process's role for the partition; as uploader, its term becomes the writer
        term (called with the partition's lock held)."""
        role = self.ownership.role(state.pid)
        if role.uploader and role.term is not None:
            state.term = role.term
        return role

    @contextmanager
    def idle(self, pid: PartitionId) -> Iterator[bool]:
        """Whether no upload round or housekeeping runs on `pid` now, keeping it so while
        inside: an upload lease is handed over only then, so no upload is cut off."""
        with self._lock:
            state = self._partitions.get(TopicPartition(pid.topic, pid.partition))
        if state is None or state.revision != pid.revision:
            yield True
            return
        if not state.lock.acquire(blocking=False):
            yield False
            return
        try:
            yield True
        finally:
            state.lock.release()

    def _states(self, topic: str | None = None) -> list[_Partition]:
        with self._lock:
            return [s for tp, s in sorted(self._partitions.items())
                    if topic is None or tp.topic == topic]

    # -- uploads ---------------------------------------------------------------------------------

    def upload_round(
        self, after: Callable[[_Partition, PartitionReport], None] | None = None
    ) -> PassReport:
        """Upload what is eligible in every partition and commit the manifests.

        Partitions are planned and verified `budget.concurrency` at a time; their objects go
        through a pool sized for the largest budget, gated by `slots` and `limiter`, which the
        controller keeps adjusting while the round runs (see `_controller_running`). `after`
        is called with each partition's row as soon as that partition is done."""
        budget = self.throttle.budget
        self.throttle.apply(budget)
        if self._rescan:  # a partition's files vanished under its listing last round
            self._rescan = False
            self.scan()
        states = self._states()
        report = PassReport()

        def one(state: _Partition, submit: Any) -> PartitionReport:
            row = self._upload_partition(state, submit)
            if after is not None:
                after(state, row)
            return row

        with self._controller_running(), \
                ThreadPoolExecutor(budget.concurrency, thread_name_prefix="archiver") as parts, \
                ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="upload") as objects:
            now = self._now_ms()
            settled = {s.tp: s.settled[3] for s in states
                       if s.settled is not None and self._settled(s, now)}
            futures = [parts.submit(one, s, objects.submit) for s in states
                       if s.tp not in settled]
            # a settled partition's row is its last decision, made again without any work
            for s in states:
                if s.tp in settled:
                    row = PartitionReport(s.tp.topic, s.tp.partition, decision=settled[s.tp])
                    if after is not None:
                        after(s, row)
                    report.partitions.append(row)
            report.partitions.extend(fut.result() for fut in futures)
        report.partitions.sort(key=lambda r: (r.topic, r.partition))
        self._save_topic_manifests(states, report)
        return report

    @staticmethod
    def _keep_housekept(state: _Partition, before: str | None, out: UploadOutcome,
                        now_ms: int) -> None:
        """After a round: its objects are all named by the head it committed when nothing
        failed, raced or was left behind, so a partition that had nothing for garbage
        collection before the round (its last housekeeping found nothing waiting, or the
        round created the head after a listing that held nothing else) still has nothing
        (`_quiet`). Any other outcome leaves it to a full housekeeping."""
        if not out.commits:
            return
        carried = before is not None and before == state.housekept_etag
        clean = out.error is None and not out.conflicts and not out.upload_errors and (
            out.listed_clean or carried)
        state.housekept_etag = state.cursor.etag if clean else None
        if clean and not carried:
            state.housekept_ms = now_ms

    def _settled(self, state: _Partition, now_ms: int) -> bool:
        """Whether a round would decide for `state` what the last one did, with nothing to
        upload (see `_Partition.settled`); the role is asked as the round would."""
        settled = state.settled
        if settled is None or self._rescan:
            return False
        log_, etag, term, _ = settled
        cursor = state.cursor
        if log_ is not state.log or not cursor.loaded or cursor.etag != etag:
            return False
        role = self.ownership.role(state.pid)
        if not role.uploader or (role.term is not None and role.term != term) or (
                role.term is None and state.term != term):
            return False
        idle_ms = self.upload_params.idle_interval_ms
        return idle_ms is None or now_ms - cursor.last_upload_ms < idle_ms

    @contextmanager
    def _controller_running(self) -> Iterator[None]:
        """Keep the controller on its schedule while a round runs (`UploadThrottle`); the new
        budget applies at once to the uploads not yet started. Not with fixed shares."""
        if self.fixed_shares is not None:
            yield
            return
        with self.throttle.controller_running(lambda: self.update_controller(rescan=True)):
            yield

    def _upload_partition(self, state: _Partition, submit: Any) -> PartitionReport:
        tp = state.tp
        with state.lock:
            try:
                tc = self._topic_config(tp.topic)
            except TieredError as err:
                return PartitionReport(tp.topic, tp.partition, decision="error", error=str(err))
            if not tc.remote_write:
                return PartitionReport(tp.topic, tp.partition, decision="remote_write_off")
            role = self._role(state)
            if not role.uploader:
                return PartitionReport(tp.topic, tp.partition, decision="standby",
                                       detail=f"uploader: {role.holder or 'none yet'}")
            if state.fenced_by is not None and state.term <= state.fenced_by:
                return PartitionReport(
                    tp.topic, tp.partition, decision="fenced",
                    error=f"fenced: the manifest was written by term {state.fenced_by}, this "
                    f"writer has term {state.term}")
            # the head the lease keeper just read or fenced: no second read of it (taken
            # either way, so a copy the cursor does not need is not kept)
            taken = self.ownership.take_head(state.pid)
            if taken is not None and not state.cursor.loaded:
                state.cursor.manifest, state.cursor.etag = taken
                state.cursor.loaded = True
            try:
                snapshot = snapshot_of(state.log, self.facts)
            except (TieredError, OSError) as err:
                # files went away under the listing (the broker's retention, another
                # sidecar's trimming): whoever trimmed may have committed, so the next round
                # re-lists the log and re-reads the head before deciding anything
                state.cursor.loaded = False
                self._rescan = True
                problem = f"reading the local log: {err}"
                level = logging.DEBUG if state.cursor.last_problem == problem else logging.WARNING
                log.log(level, "%s: %s; re-reading the log and the manifest", tp, problem)
                state.cursor.last_problem = problem
                return PartitionReport(tp.topic, tp.partition, decision="error", error=problem)
            before = state.cursor.etag if state.cursor.loaded else None
            out = archive_partition(
                state.target(), self.mstore, state.cursor, snapshot, self.upload_params,
                self._now_ms(), submit=submit, gate=self._gate,
                index_interval_bytes=tc.index_interval_bytes,
                compacted="compact" in tc.cleanup_policy.split(","))
            self._keep_housekept(state, before, out, self._now_ms())
            state.settled = None
            if out.decision in ("up_to_date", "wait") and out.error is None \
                    and state.cursor.loaded:
                state.settled = (state.log, state.cursor.etag, state.term, out.decision)
            if out.fenced:
                state.fenced_by = self._fencing_term(state)
                self.ownership.lost(state.pid)
        self._count_upload(out)
        return PartitionReport(tp.topic, tp.partition, out.uploaded_segments,
                               out.uploaded_bytes, out.decision, out.error)

    def _fencing_term(self, state: _Partition) -> int:
        try:
            m, _ = self.mstore.load(state.tp.topic, state.tp.partition, state.revision)
        except TieredError:
            return state.term
        return m.term

    def _count_upload(self, out: UploadOutcome) -> None:
        with self._lock:
            s = self._stats
            s.uploaded_bytes_total += out.uploaded_bytes
            s.uploaded_segments_total += out.uploaded_segments
            s.upload_errors_total += out.upload_errors
            s.commits_total += out.commits
            s.commit_conflicts_total += out.conflicts

    def _save_topic_manifests(self, states: list[_Partition], report: PassReport) -> None:
        """Write each archived topic's manifest the first time and whenever its settings
        change (recovery enumerates topics by these)."""
        counts: dict[tuple[str, str], int] = {}
        archived: set[tuple[str, str]] = set()
        for s in states:
            key = (s.tp.topic, s.revision)
            # every local partition counts, uploaded here or by another node's lease
            counts[key] = max(counts.get(key, 0), s.tp.partition + 1)
            m = s.cursor.manifest
            if m is not None and m.last_offset >= 0:
                archived.add(key)
        for (topic, revision), count in sorted((k, counts[k]) for k in archived):
            try:
                tm = TopicManifest.from_topic_config(
                    self._topic_config(topic), revision=revision, partition_count=count)
                if self._topic_manifests.get((topic, revision)) != tm:
                    save_topic_manifest(self.store, tm)
                    self._topic_manifests[topic, revision] = tm
            except TieredError as err:
                report.errors.append(f"{topic}: saving the topic manifest: {err}")

    # -- remote retention and garbage collection -------------------------------------------------

    def housekeeping(self) -> PassReport:
        """Remote retention, replaced-segment and archived-manifest GC and orphan GC for every
        partition of a remote-write topic, `budget.concurrency` partitions at a time (each
        lists its prefixes: one after another, a thousand partitions take minutes)."""
        states = self._states()
        if not states:
            return self._housekept([])
        workers = max(1, min(len(states), self.throttle.budget.concurrency))
        with ThreadPoolExecutor(workers, thread_name_prefix="housekeeping") as pool:
            return self._housekept(list(pool.map(self._housekeep_partition, states)))

    def _housekept(self, results: list[tuple[PartitionReport | None, int]]) -> PassReport:
        """The report of housekeeping results, counted in the stats."""
        report = PassReport()
        for row, deleted in results:
            report.deleted_remote_objects += deleted
            if row is not None:
                report.partitions.append(row)
        with self._lock:
            self._stats.remote_deleted_objects_total += report.deleted_remote_objects
        return report

    def _housekeep_partition(self, state: _Partition) -> tuple[PartitionReport | None, int]:
        """The partition's housekeeping row (None: not housekept) and objects it deleted."""
        tp = state.tp
        row = PartitionReport(tp.topic, tp.partition, decision="housekept")
        with state.lock:
            try:
                tc = self._topic_config(tp.topic)
                if not tc.remote_write or not self._role(state).uploader or (
                        state.fenced_by is not None and state.term <= state.fenced_by):
                    return None, 0
                cursor = state.cursor
                limits = None
                if tc.remote_retention_applies:
                    limits = RetentionLimits(tc.retention_ms, tc.retention_bytes)
                now = self._now_ms()
                # from the bucket as it is now, never the cursor's copy: another writer (a
                # merge, a second daemon) may have committed since the cursor last looked;
                # a quiet partition's copy is only proven unchanged (one HEAD)
                out = self.gc.housekeep(state.target(), term=state.term, limits=limits,
                                        now_ms=now, unchanged=self._quiet(state, limits, now))
                if out.quiet:
                    return row, 0
            except StaleTerm as err:
                state.fenced_by = self._fencing_term(state)
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
        self._lost_history(state.tp, out.lost_history)
        with self._lock:
            self._stats.commits_total += out.commits
        if out.errors:
            row.error = "; ".join(out.errors)
        if out.new_start_offset is not None:
            row.detail = f"remote start offset now {out.new_start_offset}"
        return row, out.deleted_objects

    def _quiet(self, state: _Partition, limits: RetentionLimits | None, now_ms: int
               ) -> tuple[PartitionManifest, str] | None:
        """The head this process holds when housekeeping has nothing to do on it as long as
        the bucket still holds that version (`GarbageCollector.housekeep` proves it with one
        HEAD): the last full housekeeping found nothing waiting (no young orphans, no fault)
        less than a GC grace period ago and left this version, or every round since only
        added objects it committed; and the version has nothing due: no replaced segments,
        no expired archives, nothing remote retention would cut. An orphan another writer
        left (a fenced holder's late upload, a merge that never committed) waits for the
        next full pass, at most one grace period away: it could not be collected sooner."""
        cursor = state.cursor
        m, etag = cursor.manifest, cursor.etag
        if (m is None or etag is None or not cursor.loaded or etag != state.housekept_etag
                or now_ms - state.housekept_ms >= self.gc.grace_ms):
            return None
        if m.replaced or edits.expired_archives(m):
            return None
        if limits is not None and (limits.ms is not None or limits.bytes is not None):
            if m.archives:
                return None  # the history is in archived manifests: read them to decide
            start = retention_start_offset(lambda: m.segments, limits, now_ms)
            if start is not None and start > m.log_start_offset:
                return None
        return m, etag

    # -- local retention -------------------------------------------------------------------------

    def _views(self, states: list[_Partition]) -> tuple[list[PartitionView], dict[
            TopicPartition, LogSnapshot], list[PartitionReport]]:
        views: list[PartitionView] = []
        snaps: dict[TopicPartition, LogSnapshot] = {}
        failed: list[PartitionReport] = []
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

    def _view(self, part: PartitionLog, cursor: ArchivalCursor | None
              ) -> tuple[PartitionView, LogSnapshot]:
        snap = snapshot_of(part, self.facts)
        tc = self._topic_config(part.topic)
        # the last head this process saw committed, even when due for a re-read: the offsets
        # a committed head covers only grow, so an older copy can only under-state them
        m = cursor.manifest if cursor is not None else None
        uploaded = None if m is None or m.last_offset < 0 else m.last_offset
        covered = {} if m is None or uploaded is None else _covered_bytes(m, snap, uploaded)
        return partition_view(part.topic, part.partition, snap, tc, uploaded, covered), snap

    def _fresh_views(self, states: list[_Partition]) -> list[PartitionView]:
        """Views of a listing of the log dirs of its own, with the committed offsets the
        cursors hold: what the controller needs mid-round (segments rolled since the round's
        scan count) without touching the partition state the round is using."""
        known = {s.tp: s for s in states}
        views = []
        for part in LocalLog(self.config.log_dirs):
            state = known.get(part.tp)
            cursor = state.cursor if state and state.revision == revision_of(part) else None
            try:
                views.append(self._view(part, cursor)[0])
            except (TieredError, OSError) as err:
                log.debug("%s: left out of the backlog: %s", part.tp, err)
        return views

    def _standbys_to_refresh(self, states: list[_Partition], enforcing: bool
                             ) -> list[_Partition]:
        """The partitions another node uploads whose committed head local retention needs
        now: in enforce mode those it would trim if the bucket covered every closed segment,
        in advise mode those it would warn about if the bucket covered none. A standby whose
        local log is within its targets costs no request (the head is read only when it
        could change a decision)."""
        standby = [s for s in states if not self.ownership.role(s.pid).uploader]
        if not standby:
            return []
        views, _, _ = self._views(standby)
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

    def _refresh_standbys(self, states: list[_Partition]) -> None:
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

    def _unproven_heads(self, states: list[_Partition]) -> set[tuple[str, int]]:
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
    def _all_locked(self, states: list[_Partition]) -> Iterator[None]:
        with ExitStack() as stack:
            for s in states:  # sorted by partition: one global order, no lock cycles
                stack.enter_context(s.lock)
            yield

    def local_retention(self) -> PassReport:
        """Enforce mode: delete local segments a committed manifest covers, by the local
        targets and the space-management phases. Advise mode: report only. Either way the
        disk alert state is updated."""
        states = self._states()
        enforcing = self.config.log_retention_mode == "enforce"
        report = PassReport()
        disk = combined_disk(self.config.log_dirs, self.disk_usage)
        self._refresh_standbys(self._standbys_to_refresh(states, enforcing))
        with self._all_locked(states):
            views, _, failed = self._views(states)
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
        with self._lock:
            self._stats.local_deleted_segments_total += len(result.deleted)
            self._stats.disk_alert_state = int(
                disk_alert_state(disk.total_bytes, disk.free_bytes, self.space_params))
        if result.deleted:
            self.scan()
        return report

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

    # -- controller ------------------------------------------------------------------------------

    def update_controller(self, *, rescan: bool = False) -> ControllerOutput:
        """Recompute the backlog (local bytes not yet in a committed manifest), the PD
        controller's shares (or the fixed ones) and the upload budget they buy, which applies
        at once to uploads not yet started. `rescan`: list the log dirs afresh rather than use
        the last `scan` (mid-round, where the round owns the partition state)."""
        states = self._states()
        views = self._fresh_views(states) if rescan else self._views(states)[0]
        # a partition another node uploads is no backlog of this one's
        mine = {(s.tp.topic, s.tp.partition) for s in states
                if self.ownership.role(s.pid).uploader}
        views = [v for v in views if (v.topic, v.partition) in mine]
        backlog = upload_backlog_bytes(views)
        disk = combined_disk(self.config.log_dirs, self.disk_usage)
        with self._lock:
            out, self._ctrl_state = controller.update(
                self.ctrl_params, self._ctrl_state, backlog, disk.free_bytes, self._now_ms())
            if self.fixed_shares is not None:
                out = ControllerOutput(out.error, self.fixed_shares, out.backlog_ratio,
                                       out.updated)
            self._ctrl_output = out
            self.throttle.apply(self.throttle.budget_for(out.shares))
            s = self._stats
            s.pending_bytes = backlog
            s.pending_bytes_by_partition = {(v.topic, v.partition): upload_backlog_bytes([v])
                                            for v in views}
            s.backlog_ratio, s.controller_error = out.backlog_ratio, out.error
            s.controller_shares = out.shares
            s.disk_alert_state = int(
                disk_alert_state(disk.total_bytes, disk.free_bytes, self.space_params))
        return out

    @property
    def budget(self) -> UploadBudget:
        """The upload budget the next round uses."""
        return self.throttle.budget

    # -- whole passes and reporting --------------------------------------------------------------

    def run_once(self) -> PassReport:
        """One full pass: scan, controller, uploads, housekeeping, local retention.

        A single upload round is bounded per partition so partitions share fairly; a pass
        promises everything eligible, so rounds repeat until one makes no progress (a
        partition stuck on a fault stops contributing and so cannot keep the loop going)."""
        self.scan()
        self.update_controller()
        # each partition's housekeeping starts as soon as its uploads are done, beside the
        # others' uploads (its lists and deletes are the pass's tail otherwise); a partition
        # that uploads again in a later round is housekept again after it
        housekept: dict[TopicPartition, Future[tuple[PartitionReport | None, int]]] = {}
        with ThreadPoolExecutor(PASS_HOUSEKEEPING_WORKERS,
                                thread_name_prefix="housekeeping") as pool:

            def after(first: bool, state: _Partition, row: PartitionReport) -> None:
                if first or row.uploaded_segments:
                    housekept[state.tp] = pool.submit(self._housekeep_partition, state)

            report = last = self.upload_round(functools.partial(after, True))
            while any(p.uploaded_segments for p in last.partitions):
                last = self.upload_round(functools.partial(after, False))
                report = report.merge(last)
            done = self._housekept([housekept[tp].result() for tp in sorted(housekept)])
        report = report.merge(done)
        return report.merge(self.local_retention())

    def describe(self, topic: str | None = None) -> list[dict[str, Any]]:
        """Rows for `tiered describe-storage` (JSON field names as documented); a partition
        whose manifest cannot be read gets an `error` in its `remote` part."""
        states = self._states(topic)
        errors: dict[TopicPartition, str] = {}
        for s in states:  # the manifests first: the views' safe offsets depend on them
            with s.lock:
                try:
                    head(s.cursor, self.mstore, s.target())
                    if s.cursor.etag is None and s.cursor.manifest is not None:
                        lost = self.mstore.lost_history(s.cursor.manifest)
                        if lost is not None:
                            errors[s.tp] = lost
                except TieredError as err:
                    errors[s.tp] = str(err)
        views, snaps, _ = self._views(states)
        by_tp = {(v.topic, v.partition): v for v in views}
        return [
            storage_row(s.log, snaps.get(s.tp), by_tp.get((s.tp.topic, s.tp.partition)),
                        s.cursor.manifest if s.cursor.loaded else None, errors.get(s.tp),
                        uploader=self._uploader(s), compacted="compact" in self.config
                        .topic_config(s.tp.topic).cleanup_policy.split(","))
            for s in states
        ]

    def _uploader(self, state: _Partition) -> tuple[str | None, str]:
        """(node uploading the partition or None, this process's role) for describe-storage."""
        try:
            if not self._topic_config(state.tp.topic).remote_write:
                return None, "standby"
        except TieredError:
            return None, "standby"
        role = self.ownership.role(state.pid)
        holder = role.holder if role.holder is not None else (
            self.ownership.node if role.uploader else None)
        return holder, role.name

    def _lost_history(self, tp: TopicPartition, lost: bool) -> None:
        """Keep the set of partitions whose housekeeping found lost history (a metric)."""
        with self._lock:
            if lost:
                self._history_lost.add(tp)
            else:
                self._history_lost.discard(tp)
            self._stats.partitions_lost_history = len(self._history_lost)

    def snapshot(self) -> ArchiverStats:
        """A consistent copy of the counters and gauges, for a metrics scrape."""
        with self._lock:
            s = self._stats
            s.heads_restored_total = self.mstore.stats.restored
            stats = getattr(self.store, "stats", None)
            retry = stats.snapshot() if stats is not None and hasattr(stats, "snapshot") else {}
            return ArchiverStats(
                **{**s.__dict__,
                   "pending_bytes_by_partition": dict(s.pending_bytes_by_partition),
                   "store_retry_stats": dict(retry),
                   "leases": self.ownership.stats()})

    def close(self) -> None:
        """Nothing to release but the store, which the caller opened and closes."""
        with self._lock:
            self._partitions.clear()


def _node_name(config: Config) -> str | None:
    """This node's name for reports; None when it cannot be read (it only labels rows)."""
    try:
        return config.node_id()
    except (TieredError, OSError):
        return None


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
