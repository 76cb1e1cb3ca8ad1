"""The archiver service: composes the write path's policies and edges for every partition.

`Archiver` owns the per-partition state (the committed manifest and its ETag, the idle timer,
fencing) and runs the passes the daemon schedules and `tiered archive --once` runs in a row:

* `scan` re-reads the log dirs (new partitions, rolled and deleted segments, the writer term);
* `upload_round` uploads what `upload_policy` picks for every partition, in parallel within
  the controller's upload budget, and commits the manifests (`archiver.uploader`);
* `housekeeping` applies remote retention and collects garbage
  (`archiver.remote_housekeeping`, over `archiver.retention`);
* `local_retention` deletes covered local segments or only advises
  (`archiver.local_retention_pass`, over `archiver.local_retention`), and computes the disk
  alert;
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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from archiver import controller
from archiver.controller import ControllerOutput, ControllerParams, ControllerState, UploadBudget
from archiver.lease_keeper import Ownership, SoleWriter
from archiver.local_retention import (
    combined_disk,
    real_disk_usage,
)
from archiver.local_retention_pass import LocalRetentionPass
from archiver.log_view import SegmentFacts, snapshot_of
from archiver.partition_state import (
    PartitionState,
    fencing_term,
    revision_of,
    role_of,
    term_of,
)
from archiver.remote_housekeeping import RemoteHousekeeper, keep_housekept
from archiver.reports import ArchiverStats, PartitionReport, PassReport, storage_row
from archiver.retention import GarbageCollector
from archiver.space import (
    DiskInfo,
    SpaceParams,
    disk_alert_state,
    upload_backlog_bytes,
)
from archiver.upload_budget import UploadThrottle
from archiver.upload_policy import UploadParams
from archiver.uploader import (
    ArchivalCursor,
    UploadGate,
    UploadOutcome,
    archive_partition,
    head,
)
from manifests.commit import ManifestStore
from manifests.lease_objects import PartitionId
from manifests.spillover import ManifestSettings
from manifests.topic import TopicManifest, save_topic_manifest
from tiered.config import Config, TopicConfig
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog
from tiered.store.base import ObjectStore

log = logging.getLogger(__name__)

#: shortest pause between the controller's updates during an upload round, whatever
#: cloud_storage_upload_ctrl_update_interval_ms says (each update lists the log dirs)
#: partitions housekept at once while a one-shot pass is still uploading: few, since they
#: share the connection pool with the uploads
PASS_HOUSEKEEPING_WORKERS = 2
#: topic manifests saved at once after an upload round (`save_topic_manifests`), within the
#: store's connection pool (`cloud_storage_max_connections`, 20 by default)
TOPIC_MANIFEST_SAVES = 16

__all__ = ["Archiver", "ArchiverStats", "PartitionReport", "PassReport", "revision_of", "term_of"]


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
        #: set when local files vanished under a listing: the next round re-lists the log dirs
        self._rescan = False
        self._lock = threading.RLock()  # partitions dict, stats, controller state
        self._partitions: dict[TopicPartition, PartitionState] = {}
        self._sorted: list[PartitionState] | None = None  # `_partitions` by partition
        self._topic_manifests: dict[tuple[str, str], TopicManifest] = {}  # by (topic, rev)
        self._stats = ArchiverStats(controller_shares=self._ctrl_output.shares)
        #: effective topic settings by topic (the configuration is fixed for the archiver's
        #: life, and resolving them is most of an idle round's work at thousands of partitions)
        self._topic_configs: dict[str, TopicConfig | TieredError] = {}
        # an idle partition's directory is not re-read by a scan, and keeps its PartitionLog
        self._local = LocalLog(config.log_dirs, reuse_unchanged=True)
        #: asked before each partition of a pass: a stopping daemon sets it, so a pass over
        #: thousands of partitions ends with the partitions in flight (docs/operations.md)
        self.stopping: Callable[[], bool] = lambda: False
        self.housekeeper = RemoteHousekeeper(
            self.mstore, self.gc, lambda: self.ownership, topic_config=self._topic_config,
            now_ms=self._now_ms, stats=self._stats, lock=self._lock)
        self.local_pass = LocalRetentionPass(
            config, self.mstore, lambda: self.ownership, self.facts,
            topic_config=self._topic_config, now_ms=self._now_ms, disk_usage=self.disk_usage,
            space_params=self.space_params)
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
                self._sorted = None
        for tp, part in found.items():
            term = self.term_override if self.term_override is not None else term_of(part)
            state = self._partitions.get(tp)
            revision = revision_of(part)
            if state is None or state.revision != revision:
                cursor = ArchivalCursor(None, None, self._now_ms())
                self._partitions[tp] = PartitionState(part, revision, term, cursor)
                self._sorted = None
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

    def _states(self, topic: str | None = None) -> list[PartitionState]:
        with self._lock:
            if self._sorted is None:  # sorted once per change of the partition set
                self._sorted = [s for _tp, s in sorted(self._partitions.items())]
            return [s for s in self._sorted if topic is None or s.tp.topic == topic]

    # -- uploads ---------------------------------------------------------------------------------

    def upload_round(
        self, after: Callable[[PartitionState, PartitionReport], None] | None = None
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

        def one(state: PartitionState, submit: Any) -> PartitionReport | None:
            if self.stopping():
                return None
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
            report.partitions.extend(r for r in (f.result() for f in futures) if r is not None)
        report.partitions.sort(key=lambda r: (r.topic, r.partition))
        report.errors.extend(save_topic_manifests(
            self.store, states, self._topic_config, self._topic_manifests))
        return report

    def _settled(self, state: PartitionState, now_ms: int) -> bool:
        """Whether a round would decide for `state` what the last one did, with nothing to
        upload (`PartitionState.still_settled`); never while a re-listing is due."""
        return not self._rescan and state.still_settled(
            self.ownership.role, now_ms, self.upload_params.idle_interval_ms)

    @contextmanager
    def _controller_running(self) -> Iterator[None]:
        """Keep the controller on its schedule while a round runs (`UploadThrottle`); the new
        budget applies at once to the uploads not yet started. Not with fixed shares."""
        if self.fixed_shares is not None:
            yield
            return
        with self.throttle.controller_running(lambda: self.update_controller(rescan=True)):
            yield

    def _upload_partition(self, state: PartitionState, submit: Any) -> PartitionReport:
        tp = state.tp
        with state.lock:
            try:
                tc = self._topic_config(tp.topic)
            except TieredError as err:
                return PartitionReport(tp.topic, tp.partition, decision="error", error=str(err))
            if not tc.remote_write:
                return PartitionReport(tp.topic, tp.partition, decision="remote_write_off")
            role = role_of(self.ownership, state)
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
            keep_housekept(state, before, out, self._now_ms())
            state.settled = None
            if out.decision in ("up_to_date", "wait") and out.error is None \
                    and state.cursor.loaded:
                state.settled = (state.log, state.cursor.etag, state.term, out.decision)
            if out.fenced:
                state.fenced_by = fencing_term(self.mstore, state)
                self.ownership.lost(state.pid)
        self._count_upload(out)
        return PartitionReport(tp.topic, tp.partition, out.uploaded_segments,
                               out.uploaded_bytes, out.decision, out.error)

    def _count_upload(self, out: UploadOutcome) -> None:
        with self._lock:
            s = self._stats
            s.uploaded_bytes_total += out.uploaded_bytes
            s.uploaded_segments_total += out.uploaded_segments
            s.upload_errors_total += out.upload_errors
            s.commits_total += out.commits
            s.commit_conflicts_total += out.conflicts

    # -- remote housekeeping and local retention (their own modules) ---------------------------

    def housekeeping(self) -> PassReport:
        """Remote retention, replaced-segment and archived-manifest GC and orphan GC for every
        partition of a remote-write topic, `budget.concurrency` partitions at a time
        (`archiver.remote_housekeeping`)."""
        return self.housekeeper.run(self._states(), self.throttle.budget.concurrency,
                                    stopping=self.stopping)

    def local_retention(self) -> PassReport:
        """Enforce mode: delete local segments a committed manifest covers, by the local
        targets and the space-management phases. Advise mode: report only. Either way the
        disk alert state is updated (`archiver.local_retention_pass`)."""
        report, disk = self.local_pass.run(self._states())
        with self._lock:
            self._stats.local_deleted_segments_total += report.deleted_local_segments
            self._stats.disk_alert_state = int(
                disk_alert_state(disk.total_bytes, disk.free_bytes, self.space_params))
        if report.deleted_local_segments:
            self.scan()
        return report

    # -- controller ------------------------------------------------------------------------------

    def update_controller(self, *, rescan: bool = False) -> ControllerOutput:
        """Recompute the backlog (local bytes not yet in a committed manifest), the PD
        controller's shares (or the fixed ones) and the upload budget they buy, which applies
        at once to uploads not yet started. `rescan`: list the log dirs afresh rather than use
        the last `scan` (mid-round, where the round owns the partition state)."""
        states = self._states()
        views = self.local_pass.fresh_views(states) if rescan else self.local_pass.views(states)[0]
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

            def after(first: bool, state: PartitionState, row: PartitionReport) -> None:
                if first or row.uploaded_segments:
                    housekept[state.tp] = pool.submit(self.housekeeper.partition, state)

            report = last = self.upload_round(functools.partial(after, True))
            while any(p.uploaded_segments for p in last.partitions) and not self.stopping():
                last = self.upload_round(functools.partial(after, False))
                report = report.merge(last)
            done = self.housekeeper.report([housekept[tp].result() for tp in sorted(housekept)])
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
        views, snaps, _ = self.local_pass.views(states)
        by_tp = {(v.topic, v.partition): v for v in views}
        return [
            storage_row(s.log, snaps.get(s.tp), by_tp.get((s.tp.topic, s.tp.partition)),
                        s.cursor.manifest if s.cursor.loaded else None, errors.get(s.tp),
                        uploader=self._uploader(s), compacted="compact" in self.config
                        .topic_config(s.tp.topic).cleanup_policy.split(","))
            for s in states
        ]

    def _uploader(self, state: PartitionState) -> tuple[str | None, str]:
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
            self._sorted = None


def save_topic_manifests(store: ObjectStore, states: list[PartitionState],
                         topic_config: Callable[[str], TopicConfig],
                         saved: dict[tuple[str, str], TopicManifest], *,
                         concurrency: int = TOPIC_MANIFEST_SAVES) -> list[str]:
    """Write each archived topic's manifest the first time and whenever its settings
    change (recovery enumerates topics by these); `saved` holds what was written, by
    (topic, revision). Returns the errors, one per topic, in topic order.

    Topics are saved `concurrency` at a time: each is a read and a compare-and-swap of its
    own object, and a one-shot pass (which starts with nothing `saved`) over a thousand
    topics would otherwise wait for two thousand round trips one after another."""
    counts: dict[tuple[str, str], int] = {}
    archived: set[tuple[str, str]] = set()
    for s in states:
        key = (s.tp.topic, s.revision)
        # every local partition counts, uploaded here or by another node's lease
        counts[key] = max(counts.get(key, 0), s.tp.partition + 1)
        m = s.cursor.manifest
        if m is not None and m.last_offset >= 0:
            archived.add(key)
    errors: dict[tuple[str, str], str] = {}
    todo: list[TopicManifest] = []
    for (topic, revision), count in sorted((k, counts[k]) for k in archived):
        try:
            tm = TopicManifest.from_topic_config(
                topic_config(topic), revision=revision, partition_count=count)
        except TieredError as err:
            errors[topic, revision] = f"{topic}: saving the topic manifest: {err}"
            continue
        if saved.get((topic, revision)) != tm:
            todo.append(tm)

    def save(tm: TopicManifest) -> str | None:
        try:
            save_topic_manifest(store, tm)
        except TieredError as err:
            return f"{tm.topic}: saving the topic manifest: {err}"
        return None

    if todo:
        with ThreadPoolExecutor(max(1, min(concurrency, len(todo))),
                                thread_name_prefix="topic-manifest") as pool:
            for tm, error in zip(todo, pool.map(save, todo), strict=True):
                if error is None:
                    saved[tm.topic, tm.revision] = tm
                else:
                    errors[tm.topic, tm.revision] = error
    return [errors[k] for k in sorted(errors)]


def _node_name(config: Config) -> str | None:
    """This node's name for reports; None when it cannot be read (it only labels rows)."""
    try:
        return config.node_id()
    except (TieredError, OSError):
        return None
