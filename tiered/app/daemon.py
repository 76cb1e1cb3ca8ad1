"""`tiered run`: the archiver as a long-running service.

The daemon composes parts that know nothing of each other: the `Archiver` (all upload,
retention and controller logic), a `Scheduler` that calls its steps when they are due, and
the `HttpServer`. Four jobs run on the main thread, one at a time, in this order when
several are due:

    upload           Archiver.scan + upload_round; again at once after progress (rounds are
                     bounded per partition), else after a backoff of 0.1 s doubling to 10 s
                     (Redpanda's cloud_storage_upload_loop_{initial,max}_backoff_ms defaults)
    controller       Archiver.update_controller, every cloud_storage_upload_ctrl_update_interval_ms
                     (during an upload round the Archiver keeps it on that schedule itself)
    local_retention  Archiver.local_retention, every retention_local_trim_interval
    housekeeping     Archiver.housekeeping, every cloud_storage_housekeeping_interval_ms

Intervals run from the end of a job's run to its next start, so a slow round never causes a
burst of catch-up runs.

The same HTTP server serves the remote-read API (`tiered.app.http_api`,
`GET /v1/topics/{topic}/partitions/{p}/records?offset=&max_bytes=&format=`) from one `Reader`
built before the server starts and closed after it stops. The reader has its own store handle,
opened without the conditional-write probe (reads need none), so it does not wait for the
archiver's connection: local data and cached chunks are served while the store is unreachable,
and a read that needs the store fails alone (503) without holding up other requests.

Threads: the main thread owns the Archiver and its store; after every job it publishes an
immutable `DaemonState`, which is all the HTTP threads read of it (metrics are therefore as
fresh as the last finished job). Each HTTP request runs on its own thread; reads call the
thread-safe `Reader` directly, and its metrics are read at scrape time.

Upload leases (`tiered.app.cluster`): the daemon uploads, housekeeps and collects only the
partitions whose lease its node holds; a lease keeper thread renews them, watches the other
sidecars sharing the bucket, hands partitions over and takes them over, and asks for an
upload round at once when it gained one. On a clean stop the leases are released, so the
other sidecars take the partitions over at once instead of a lease time later.

Stopping: the first SIGTERM / SIGINT lets the running job finish (an upload round ends with
its manifest commits) and then exits 0; a second one abandons the job at once. Abandoning is
safe because a manifest commit is one atomic compare-and-swap PUT: an object uploaded but
not yet committed is an orphan that garbage collection removes after the grace period, and
the next run re-uploads the segment (design invariant 8).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from tiered.app.health import DaemonState, Health, JobCounters, health_of
from tiered.app.health_checks import CacheDiskCheck, ReadStoreCheck
from tiered.app.http_auth import HttpGuard, http_ssl_context, policy_of
from tiered.app.http_server import HttpServer, Response
from tiered.app.metrics import (
    ArchiverCollector,
    JobsCollector,
    KafkaCollector,
    ReaderCollector,
    make_registry,
)
from tiered.app.scheduler import (
    UPLOAD_BACKOFF_MAX_S,
    Scheduler,
    Stopper,
    Waker,
    next_upload_delay,
)
from tiered.app.security_view import SecurityView
from tiered.app.serving import Limits
from tiered.config.units import format_size
from tiered.errors import ConfigError, TieredError
from tiered.store.errors import (
    AccessDenied,
    BucketNotFound,
    ConditionalWritesUnsupported,
    StoreError,
)

if TYPE_CHECKING:
    from archiver.lease_keeper import LeaseKeeper
    from archiver.service import Archiver, ArchiverStats, PassReport
    from cache.reader import Reader
    from tiered.app.kafka_api import KafkaServer
    from tiered.config import Config
    from tiered.store.base import ObjectStore

__all__ = [
    "DEFAULT_METRICS_HOST",
    "DEFAULT_METRICS_PORT",
    "Daemon",
    "DaemonOptions",
        "check_log_dirs",
        "open_reader",
    "report_problems",
]

log = logging.getLogger("tiered.app.daemon")

DEFAULT_METRICS_HOST = "127.0.0.1"
#: Redpanda's admin/metrics port, so dashboards built for it find us where they expect
DEFAULT_METRICS_PORT = 9644
#: waiting for the object store at start-up: first and longest pause, in seconds
CONNECT_BACKOFF_MIN_S = 1.0
CONNECT_BACKOFF_MAX_S = 30.0
#: a key HEAD-ed to tell "the store answers" from "it does not"; its absence is an answer
HEALTH_PROBE_KEY = "_tiered/health-probe"
#: the remote-read API's path prefix on the daemon's HTTP server (see tiered.app.http_api)
RECORDS_PREFIX = "/v1/"


def report_problems(report: PassReport) -> list[str]:
    """Every problem of a pass once: the pass-level errors, then each partition's error that
    no pass-level error already names (the archiver copies partition faults into `errors`
    prefixed with the partition, as "topic-N: ..." or "topic/N: ...")."""
    problems = list(report.errors)
    for p in report.partitions:
        prefixes = (f"{p.topic}-{p.partition}:", f"{p.topic}/{p.partition}:")
        if p.error and not any(e.startswith(prefixes) for e in report.errors):
            problems.append(f"{p.topic}-{p.partition}: {p.decision}: {p.error}")
    return problems


# --- the daemon ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonOptions:
    """Command-line settings of `tiered run` that are not configuration properties."""

    metrics_host: str = DEFAULT_METRICS_HOST
    metrics_port: int = DEFAULT_METRICS_PORT


class _Abandon(BaseException):
    """Raised by the second stop signal to leave the running job at once. A BaseException so
    that no `except Exception` on the way swallows it."""


def check_log_dirs(config: Config, command: str) -> None:
    """Refuse a configuration without usable log dirs before anything starts: no `[log] dirs`,
    or a dir that does not exist (a typo or an unmounted disk would otherwise look like an
    empty log, and `archive --once` would succeed having archived nothing). `dirs = []` is
    accepted by `run` alone: a history server for the bucket, with no local log."""
    if not config.log_dirs:
        if config.history_server and command == "run":
            return
        if config.history_server:
            raise ConfigError(
                f"{config.source}: [log] dirs is empty: tiered {command} needs the broker's log "
                "directories (an empty list only suits `tiered run` as a history server)")
        raise ConfigError(
            f"{config.source}: [log] dirs is not set: tiered {command} needs the broker's log "
            "directories, e.g. dirs = [\"/var/lib/kafka/data\"] (or dirs = [] for `tiered run` "
            "as a history server serving the bucket alone)"
        )
    problems = [f"{config.source}: [log] dirs: {d} does not exist or is not a directory"
                for d in config.log_dirs if not d.is_dir()]
    if problems:
        raise ConfigError("\n".join(problems), problems)


def _open_store(config: Config) -> ObjectStore:
    from tiered.store import open_store

    return open_store(config.store_settings())


def _new_archiver(config: Config, store: ObjectStore) -> Archiver:
    from archiver.service import Archiver

    return Archiver(config, store)


def _new_keeper(config: Config, store: ObjectStore, on_change: Callable[[], None]
                ) -> LeaseKeeper | None:
    from tiered.app.cluster import keeper_for

    return keeper_for(config, store, passive=False, on_change=on_change)


@contextlib.contextmanager
def open_reader(config: Config) -> Iterator[Reader]:
    """The daemon's `Reader` over the log dirs and the bucket, closed with its store on exit.

    Unlike `Reader.from_config` it opens the store without the conditional-write probe: a
    reader writes nothing, and the probe's PUTs would fail (stopping the daemon) whenever the
    store is down at start-up, while local and cached data could still be served."""
    from cache.reader import Reader
    from tiered.kafka.local_log import LocalLog
    from tiered.store import open_store

    store = open_store(config.store_settings(), probe=False)
    try:
        try:
            local = LocalLog(config.log_dirs) if config.log_dirs else None  # a history server
            reader = Reader(config, store, local_log=local)
        except OSError as exc:
            raise TieredError(f"cannot open the read cache in {config.cache_dir}: "
                              f"{exc.strerror or exc}") from None
        try:
            reader.cache.start()  # the periodic size check, idle-reader expiry, index save
            yield reader
        finally:
            reader.close()
    finally:
        store.close()


def _ms(config: Config, key: str) -> float:
    """A cluster `_ms` property in seconds."""
    return config.cluster_seconds(key, 1)


class Daemon:
    """One `tiered run`. Construct, then `run()` on the main thread (for signal handling; on
    another thread, stop it with `request_stop`). Factories, clocks and the stop event are
    injectable so tests run it without real time or a real bucket. `reader` is the `Reader`
    serving `/v1/` while `run()` runs (None before and after)."""

    def __init__(
        self,
        config: Config,
        options: DaemonOptions | None = None,
        *,
        open_store: Callable[[Config], ObjectStore] = _open_store,
        new_archiver: Callable[[Config, ObjectStore], Archiver] = _new_archiver,
        new_reader: Callable[[Config], AbstractContextManager[Reader]] = open_reader,
        new_keeper: Callable[[Config, ObjectStore, Callable[[], None]],
                             LeaseKeeper | None] = _new_keeper,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stop: Stopper | None = None,
    ) -> None:
        check_log_dirs(config, "run")
        self.config = config
        self.options = options or DaemonOptions()
        self._open_store = open_store
        self._new_archiver = new_archiver
        self._new_reader = new_reader
        self._new_keeper = new_keeper
        self._scheduler: Scheduler | None = None
        self.reader: Reader | None = None
        #: the read path's checks behind /health while `reader` serves (None otherwise)
        self._read_checks: tuple[CacheDiskCheck, ReadStoreCheck] | None = None
        #: the Kafka endpoint ([kafka] section), bound below; None without one
        self.kafka: KafkaServer | None = None
        self._clock = clock
        self._wall = wall_clock
        self._stop: Stopper = stop if stop is not None else Waker()
        self._signals = 0
        self.state = DaemonState(started_s=clock(), archiving=not config.history_server)
        self._upload_delay: float | None = None
        self._known: set[tuple[str, int]] = set()
        self._failing: set[tuple[str, str, int]] = set()  # (job, topic, partition)
        registry = make_registry(
            ArchiverCollector(lambda: self.state.stats, self._reader_store_stats),
            JobsCollector(lambda: self.state.jobs, lambda: self.state.store_up),
            ReaderCollector(self._reader_stats),
            KafkaCollector(lambda: None if self.kafka is None else self.kafka.stats()),
        )
        #: the bucket's users and ACLs while serving, when either API authenticates
        self.security: SecurityView | None = None
        self._http_guard: HttpGuard | None = None
        https = http_ssl_context(config.http)  # a file that does not load stops the start
        try:
            http = config.http
            self.server = HttpServer(
                self.options.metrics_host, self.options.metrics_port, registry,
                self._health,
                routes={RECORDS_PREFIX: self._records}, ssl_context=https,
                guard=self._check_http if config.http.auth == "basic" else None,
                limits=Limits(max_connections=http.max_connections,
                              max_connections_per_ip=http.max_connections_per_ip,
                              request_timeout_s=http.request_timeout_ms / 1000,
                              idle_timeout_s=http.idle_timeout_ms / 1000),
            )
        except OSError as exc:
            where = f"{self.options.metrics_host}:{self.options.metrics_port}"
            raise TieredError(f"cannot serve metrics on {where}: {exc.strerror or exc}") from None
        self.kafka = self._bind_kafka()

    # --- control ------------------------------------------------------------------------

    def request_stop(self, reason: str = "stop requested") -> None:
        """Finish the running job, then return from `run` (thread-safe)."""
        if not self._stop.is_set():
            log.info("%s: stopping after the current step", reason)
            self._publish(phase="stopping")
        self._stop.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals > 1:
            raise _Abandon(name)
        self.request_stop(f"received {name}")

    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _health(self) -> Health:
        """`/health` (HTTP threads): the published state and the read path's checks."""
        reader, checks = self.reader, self._read_checks
        cache_problem = read_store = None
        if reader is not None and checks is not None:
            disk_check, store_check = checks
            found = [p for p in (disk_check.problem(), reader.cache.write_problem) if p]
            cache_problem = "; ".join(found) if found else None
            read_store = store_check.problem()
        return health_of(self.state, self._clock(), cache_problem=cache_problem,
                         read_store_problem=read_store)

    def _publish(self, **changes: object) -> None:
        self.state = dataclasses.replace(self.state, **changes)  # type: ignore[arg-type]

    # --- lifecycle ----------------------------------------------------------------------

    def run(self) -> int:
        """Serve until stopped; returns the exit status (0: stopped cleanly)."""
        try:
            with self._signal_handlers():
                try:
                    with self._new_reader(self.config) as reader:
                        self._serve_http(reader)
                except _Abandon as signame:
                    log.warning("received %s again: abandoning the running step; anything "
                                "uploaded but not committed is removed by garbage collection "
                                "and uploaded again next time", signame)
        finally:
            self.server.stop()  # idempotent; closes the socket when the reader never opened
            if self.kafka is not None:
                self.kafka.stop()
        log.info("tiered run: stopped")
        return 0

    def _serve_http(self, reader: Reader) -> None:
        """Archive and serve HTTP (and Kafka) with `reader` behind `/v1/`; the servers stop
        (requests in flight drained) before the caller closes the reader."""
        self.reader = reader
        self._start_security(reader)
        self._read_checks = _read_checks(reader)
        self.server.start()
        what = ("a history server (no log dirs)" if self.config.history_server
                else "archiving " + ", ".join(map(str, self.config.log_dirs)))
        log.info("tiered run: %s, bucket %s; metrics and health on %s (/metrics, /health; "
                 "records on %stopics/{topic}/partitions/{p}/records)",
                 what, self.config.storage.url, self.server.url, RECORDS_PREFIX)
        try:
            if self.kafka is not None:
                self._start_kafka(self.kafka, reader)
            self._serve()
        finally:
            if self.kafka is not None:
                self.kafka.stop()
            self.server.stop()
            if self.security is not None:
                self.security.stop()
            self.reader = None
            self._read_checks = None

    # --- security (docs/security.md) ---------------------------------------------------------

    def _start_security(self, reader: Reader) -> None:
        """Read the bucket's users and ACLs, and keep them fresh, when an API authenticates."""
        kafka = self.config.kafka
        if self.config.http.auth != "basic" and (kafka is None or
                                                  not kafka.security.authenticates):
            return
        self.security = SecurityView(reader.store, policy_of(self.config))
        self.security.start()
        if self.config.http.auth == "basic":
            self._http_guard = HttpGuard(self.security)

    def _check_http(self, path: str, authorization: str | None, peer: str) -> Response | None:
        guard = self._http_guard
        if guard is None:  # a request outside serving: nothing to check it against
            body = json.dumps({"error": "KAFKA_STORAGE_ERROR",
                               "message": "the daemon is not serving right now"})
            return 503, {"Content-Type": "application/json"}, body.encode()
        return guard.check(path, authorization, peer)

    # --- the Kafka endpoint (docs/kafka-api.md) ---------------------------------------------

    def _bind_kafka(self) -> KafkaServer | None:
        """The Kafka endpoint, bound now so a busy port or a bad certificate stops the start;
        None without a [kafka] section."""
        if self.config.kafka is None:
            return None
        from tiered.app.kafka_api import KafkaServer

        try:
            return KafkaServer(self.config.kafka)  # network waits run on real time
        except BaseException:
            self.server.stop()
            raise

    def _start_kafka(self, kafka: KafkaServer, reader: Reader) -> None:
        from tiered.store import probe_conditional_writes

        kafka.start(reader, self.config.storage.url, prove_writes=probe_conditional_writes,
                    security=self.security)

    def _records(self, method: str, path: str, query: Mapping[str, Sequence[str]]) -> Response:
        """The `/v1/` route (HTTP threads): `tiered.app.http_api.handle_records` on the reader."""
        from tiered.app.http_api import handle_records

        reader = self.reader
        if reader is None:  # a request that outlived the shutdown's drain
            body = json.dumps({"error": "KAFKA_STORAGE_ERROR",
                               "message": "the daemon is not serving reads right now"})
            return 503, {"Content-Type": "application/json"}, body.encode()
        return handle_records(reader, method, path, query)

    def _reader_store_stats(self) -> dict[str, int]:
        """The read path's store request counters (its own handle on the bucket)."""
        stats = getattr(self.reader.store, "stats", None) if self.reader is not None else None
        snapshot = getattr(stats, "snapshot", None)
        return dict(snapshot()) if snapshot is not None else {}

    def _reader_stats(self) -> dict[str, Any] | None:
        reader = self.reader
        return None if reader is None else reader.stats

    def _serve(self) -> None:
        if self.config.history_server:  # serves reads only: nothing to archive
            self._publish(phase="running")
            while not self._stop.is_set():
                self._stop.wait(3600.0)
            return
        store = self._connect()
        if store is None:
            return
        try:
            archiver = self._new_archiver(self.config, store)
            archiver.stopping = self._stop.is_set  # passes end with the partitions in flight
            # no restart storm of full housekeeping passes at thousands of partitions
            archiver.housekeeper.spread_first_full_pass = True
            # and no full pass per idle partition each grace period: one listing of the bucket
            archiver.housekeeper.census = True
            try:
                from tiered.app.cluster import leases_for

                keeper = self._new_keeper(self.config, store, self._leases_gained)
                with leases_for(archiver, keeper, release=True):
                    self._publish(phase="running")
                    self._scheduler = self._schedule(archiver, store)
                    self._scheduler.run(self._stop)
            finally:
                self._scheduler = None
                archiver.close()
        finally:
            store.close()

    def _leases_gained(self) -> None:
        """The lease keeper took partitions over (its thread): upload them now, not after
        the upload loop's backoff."""
        scheduler = self._scheduler
        if scheduler is not None:
            scheduler.request("upload")
            wake = getattr(self._stop, "wake", None)
            if wake is not None:
                wake()

    def _connect(self) -> ObjectStore | None:
        """Open the store, waiting (with /health at 503) while it is unreachable; a store
        that refuses us (credentials, no conditional writes) is an error at once. None: a stop
        was requested while waiting."""
        delay = CONNECT_BACKOFF_MIN_S
        said_missing = False
        while not self._stop.is_set():
            try:
                store = self._open_store(self.config)
            except (AccessDenied, ConditionalWritesUnsupported):
                raise
            except BucketNotFound as exc:
                # not an outage: say so once, and wait for someone to create it
                log.log(logging.DEBUG if said_missing else logging.ERROR,
                        "the bucket of %s does not exist (%s); waiting for it to be created",
                        self.config.storage.url, exc)
                said_missing = True
                self._publish(store_up=False, store_error=f"the bucket does not exist: {exc}")
                self._stop.wait(delay)
                delay = min(delay * 2, CONNECT_BACKOFF_MAX_S)
                continue
            except StoreError as exc:
                log.warning("object store %s unreachable (%s); retrying in %.0f s",
                            self.config.storage.url, exc, delay)
                self._publish(store_up=False, store_error=str(exc))
                self._stop.wait(delay)
                delay = min(delay * 2, CONNECT_BACKOFF_MAX_S)
                continue
            self._publish(store_up=True, store_error=None)
            return store
        return None

    def _schedule(self, archiver: Archiver, store: ObjectStore) -> Scheduler:
        c = self.config

        def job(
            name: str, step: Callable[[], PassReport | None],
            after: Callable[[PassReport | None], float] | None = None,
        ) -> Callable[[], float | None]:
            def action() -> float | None:
                report = self._run_step(name, step, archiver, store)
                return after(report) if after is not None else None

            return action

        def upload() -> PassReport:
            archiver.scan()
            return archiver.upload_round()

        def upload_delay(report: PassReport | None) -> float:
            progress = report is not None and any(p.uploaded_segments for p in report.partitions)
            self._upload_delay = next_upload_delay(self._upload_delay, progress)
            return self._upload_delay

        def controller() -> None:
            out = archiver.update_controller()
            if out.updated:
                log.debug("controller: backlog ratio %.3f, error %.1f, shares %d",
                          out.backlog_ratio, out.error, out.shares)

        scheduler = Scheduler(self._clock)
        scheduler.add("upload", UPLOAD_BACKOFF_MAX_S, job("upload", upload, upload_delay))
        scheduler.add("controller", _ms(c, "cloud_storage_upload_ctrl_update_interval_ms"),
                      job("controller", controller))
        scheduler.add("local_retention", _ms(c, "retention_local_trim_interval"),
                      job("local_retention", archiver.local_retention))
        scheduler.add("housekeeping", _ms(c, "cloud_storage_housekeeping_interval_ms"),
                      job("housekeeping", archiver.housekeeping))
        return scheduler

    def _run_step(
        self, name: str, step: Callable[[], PassReport | None], archiver: Archiver,
        store: ObjectStore,
    ) -> PassReport | None:
        """Run one job, log what it did, and publish the new state. A domain error fails the
        job for this run only; so does a bug (logged with its traceback), since one broken
        step must not stop the archiving of everything else."""
        report: PassReport | None = None
        errors: tuple[str, ...] = ()
        try:
            report = step()
        except TieredError as exc:
            errors = (str(exc),)
            log.error("%s failed: %s", name, exc)
        except Exception as exc:
            errors = (f"internal error: {exc!r}",)
            log.exception("%s failed with an unexpected error", name)
        stats = _snapshot(archiver)
        if report is not None:
            errors = tuple(report_problems(report))
            self._log_report(name, report, stats)
        ok = not errors
        # a clean step proves the store answers; after a failed one, ask it
        store_changes = self._probe_store(store) if not ok else {
            "store_up": True, "store_error": None}
        old = self.state.jobs.get(name, JobCounters())
        counters = JobCounters(
            runs=old.runs + 1,
            failures=old.failures + (0 if ok else 1),
            last_success_s=self._wall() if ok else old.last_success_s,
        )
        changes: dict[str, object] = {
            "jobs": {**self.state.jobs, name: counters},
            "last_errors": {**self.state.last_errors, name: errors},
            "stats": stats,
            **store_changes,
        }
        if name == "upload" and report is not None:
            changes["partitions"] = len(report.partitions)
        self._publish(**changes)
        return report

    def _probe_store(self, store: ObjectStore) -> dict[str, object]:
        """After a failed step: does the store still answer? (A missing key is an answer.)"""
        try:
            store.exists(HEALTH_PROBE_KEY)
        except AccessDenied:
            return {"store_up": True, "store_error": None}
        except StoreError as exc:
            if self.state.store_up is not False:
                log.error("object store %s unreachable: %s", self.config.storage.url, exc)
            return {"store_up": False, "store_error": str(exc)}
        return {"store_up": True, "store_error": None}

    def _log_report(self, name: str, report: PassReport, stats: ArchiverStats | None) -> None:
        """One INFO line per upload or retention action and one progress line per round with
        uploads; a problem is logged when it first appears (not every round it stands), and
        a partition that had one says when it recovered."""
        seen = {(p.topic, p.partition) for p in report.partitions}
        if name == "upload":
            new = sorted(seen - self._known)
            if new and self._known:
                log.info("picked up %d new partition(s): %s", len(new),
                         ", ".join(f"{t}-{p}" for t, p in new))
            elif new:
                log.info("found %d partition(s)", len(new))
            self._known |= seen
        uploaded = bytes_ = 0
        for p in report.partitions:
            failing = (name, p.topic, p.partition)
            if p.uploaded_segments:
                uploaded += p.uploaded_segments
                bytes_ += p.uploaded_bytes
                log.info("uploaded %d segment(s) of %s-%d (%s)", p.uploaded_segments, p.topic,
                         p.partition, format_size(p.uploaded_bytes))
            if p.error:
                self._failing.add(failing)
            elif failing in self._failing:
                self._failing.discard(failing)
                log.info("%s-%d: %s recovered (%s)", p.topic, p.partition, name, p.decision)
        previous = set(self.state.last_errors.get(name, ()))
        for problem in report_problems(report):
            if problem not in previous:
                log.warning("%s: %s", name, problem)
        if uploaded:
            pending = f"; {format_size(stats.pending_bytes)} pending" if stats else ""
            log.info("upload round: %d segment(s), %s%s", uploaded, format_size(bytes_), pending)
        if report.deleted_local_segments:
            log.info("%s: deleted %d local segment(s) covered by the bucket", name,
                     report.deleted_local_segments)
        if report.deleted_remote_objects:
            log.info("%s: deleted %d object(s) from the bucket", name,
                     report.deleted_remote_objects)


def _read_checks(reader: Reader) -> tuple[CacheDiskCheck, ReadStoreCheck]:
    """The /health checks of `reader`: its cache's disk, and its store's latest request
    (`RetryStats.last_failure`; a store without one, such as `file://`, never fails it)."""
    stats = getattr(reader.store, "stats", None)
    last_failure = getattr(stats, "last_failure", None)
    failure: Callable[[], tuple[float, str] | None] = (
        last_failure if callable(last_failure) else lambda: None)
    return (CacheDiskCheck(reader.cache.root, reader.cache.settings.chunk_size),
            ReadStoreCheck(failure))


def _snapshot(archiver: Archiver) -> ArchiverStats | None:
    try:
        return archiver.snapshot()
    except Exception:  # metrics must never stop the archiving
        log.exception("could not read archiver statistics")
        return None


def run_daemon(config: Config, options: DaemonOptions | None = None) -> int:
    """`tiered run`: serve until SIGTERM / SIGINT; the exit status."""
    return Daemon(config, options).run()
