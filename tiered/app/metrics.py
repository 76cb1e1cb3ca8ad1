"""Prometheus metrics and the daemon's small HTTP server (`/metrics`, `/health` and routed
paths such as the remote-read API under `/v1/`).

The archiver and the reader count what they do (`Archiver.snapshot()` -> `ArchiverStats`,
`Reader.stats` with the chunk cache's counters under "cache"); the collectors here only
translate those plain numbers into metric families at scrape time, so nothing is
double-counted and neither the archiver nor the reader imports prometheus-client. Names
follow Redpanda's (`vectorized_ntp_archiver_pending`,
`redpanda_storage_disk_free_space_alert`) under the `tiered_` prefix; counters end in
`_total`, sizes in `_bytes`.

`/health` answers from a `DaemonState`, the snapshot of the daemon the main thread publishes
after every job (see `health_of`).

Threads: `MetricsServer` serves each request on its own daemon thread and only calls the
source functions and routes it was given; those must be safe to call from many threads at once
(the daemon hands in functions that read an immutable, already-published snapshot, and the
thread-safe `Reader`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from archiver.service import ArchiverStats

__all__ = [
    "ARCHIVER_METRICS",
    "CACHE_METRICS",
    "READER_METRICS",
    "STORE_METRICS",
    "ArchiverCollector",
    "DaemonState",
    "Health",
    "JobCounters",
    "JobsCollector",
    "MetricsServer",
    "ReaderCollector",
    "Response",
    "Route",
    "health_of",
    "make_registry",
]

log = logging.getLogger(__name__)

PREFIX = "tiered"


@dataclass(frozen=True)
class _Scalar:
    """One `ArchiverStats` field exported as one unlabelled metric."""

    field: str
    kind: str  # "counter" | "gauge"
    doc: str


#: metric name (without prefix or `_total`) -> the `ArchiverStats` field it exports
ARCHIVER_METRICS: dict[str, _Scalar] = {
    "uploaded_bytes": _Scalar("uploaded_bytes_total", "counter",
                              "Bytes of segments and indexes uploaded and committed."),
    "uploaded_segments": _Scalar("uploaded_segments_total", "counter",
                                 "Segments uploaded and recorded in a committed manifest."),
    "upload_errors": _Scalar("upload_errors_total", "counter",
                             "Uploads that failed for good (after retries); never recorded."),
    "manifest_commits": _Scalar("commits_total", "counter",
                                "Partition manifests committed (compare-and-swap won)."),
    "manifest_commit_conflicts": _Scalar("commit_conflicts_total", "counter",
                                         "Manifest commits that lost a compare-and-swap."),
    "remote_deleted_objects": _Scalar("remote_deleted_objects_total", "counter",
                                      "Objects deleted from the bucket by retention and GC."),
    "local_deleted_segments": _Scalar("local_deleted_segments_total", "counter",
                                      "Local segments deleted by local retention (enforce)."),
    "upload_backlog_bytes": _Scalar("pending_bytes", "gauge",
                                    "Local bytes not yet covered by a committed manifest."),
    "upload_backlog_ratio": _Scalar("backlog_ratio", "gauge",
                                    "Backlog / (backlog + free disk), 0..1: the controller's "
                                    "input."),
    "upload_controller_error": _Scalar("controller_error", "gauge",
                                       "PD controller error: setpoint minus backlog, in "
                                       "per-mille (<= 0)."),
    "upload_controller_shares": _Scalar("controller_shares", "gauge",
                                        "Shares the PD controller gives uploads "
                                        "(cloud_storage_upload_ctrl_min/max_shares)."),
    "disk_free_space_alert": _Scalar("disk_alert_state", "gauge",
                                     "Free-space alert of the log disk: 0 ok, 1 low space, "
                                     "2 degraded (Redpanda's default)."),
}

#: `RetryStats.snapshot()` key -> documentation of `tiered_store_<key>_total`
STORE_METRICS: dict[str, str] = {
    "operations": "Object-store operations started.",
    "attempts": "Object-store requests sent, retries included.",
    "retries": "Object-store requests that repeated a failed one.",
    "errors": "Object-store operations that failed for good.",
    "exhausted": "Operations that ran out of attempts on retryable faults.",
}


def _family(kind: str, name: str, doc: str, labels: list[str] | None = None) -> Any:
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(f"{PREFIX}_{name}", doc, labels=labels)


class ArchiverCollector(Collector):
    """Reads an `ArchiverStats` at every scrape; `stats()` returning None (the archiver has not
    started yet) exports nothing rather than misleading zeros."""

    def __init__(self, stats: Callable[[], ArchiverStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        for name, scalar in ARCHIVER_METRICS.items():
            family = _family(scalar.kind, name, scalar.doc)
            family.add_metric([], float(getattr(stats, scalar.field)))
            yield family
        pending = _family("gauge", "pending_upload_bytes",
                          "Per partition: local bytes not yet in a committed manifest.",
                          ["topic", "partition"])
        for (topic, partition), value in sorted(stats.pending_bytes_by_partition.items()):
            pending.add_metric([topic, str(partition)], float(value))
        yield pending
        for key, value in sorted(stats.store_retry_stats.items()):
            doc = STORE_METRICS.get(key, f"Object-store counter {key!r}.")
            family = _family("counter", f"store_{key}", doc)
            family.add_metric([], float(value))
            yield family


@dataclass(frozen=True)
class JobCounters:
    """How one scheduled job has fared: runs, runs that reported a problem, and the wall-clock
    time (seconds since the epoch) of the last run without one (None: never)."""

    runs: int = 0
    failures: int = 0
    last_success_s: float | None = None


class JobsCollector(Collector):
    """The daemon's own state: scheduled job runs and failures, and whether the store answers."""

    def __init__(
        self, jobs: Callable[[], Mapping[str, JobCounters]], store_up: Callable[[], bool | None]
    ) -> None:
        self._jobs = jobs
        self._store_up = store_up

    def collect(self) -> Iterator[Metric]:
        jobs = self._jobs()
        runs = _family("counter", "daemon_job_runs", "Scheduled job runs.", ["job"])
        failures = _family("counter", "daemon_job_failures",
                           "Scheduled job runs that reported an error.", ["job"])
        last = _family("gauge", "daemon_job_last_success_timestamp_seconds",
                       "When the job last ran without an error (Unix time).", ["job"])
        for name, counters in sorted(jobs.items()):
            runs.add_metric([name], float(counters.runs))
            failures.add_metric([name], float(counters.failures))
            if counters.last_success_s is not None:
                last.add_metric([name], counters.last_success_s)
        yield from (runs, failures, last)
        up = self._store_up()
        if up is not None:
            family = _family("gauge", "store_up", "1 when the object store answered the last "
                             "check, 0 when it was unreachable.")
            family.add_metric([], 1.0 if up else 0.0)
            yield family


#: metric name (without prefix or `_total`) -> the `ChunkCache.stats()` key it exports
CACHE_METRICS: dict[str, _Scalar] = {
    "cache_hits": _Scalar("hits", "counter",
                          "Chunk reads served from a chunk already on the cache disk."),
    "cache_misses": _Scalar("misses", "counter",
                            "Chunk reads that started a download (ranged GET)."),
    "cache_joined": _Scalar("joined", "counter",
                            "Chunk reads that waited on a download another read started."),
    "cache_prefetches": _Scalar("prefetches", "counter",
                                "Read-ahead downloads (cloud_storage_chunk_prefetch)."),
    "cache_downloaded_bytes": _Scalar("bytes_downloaded", "counter",
                                      "Bytes fetched from the object store into the cache."),
    "cache_evictions": _Scalar("evictions", "counter",
                               "Chunks removed from the cache disk by trimming or the chunk "
                               "eviction strategy."),
    "cache_download_errors": _Scalar("download_errors", "counter",
                                     "Chunk downloads that failed for good (never served)."),
    "cache_corrupt_discarded": _Scalar("corrupt_discarded", "counter",
                                       "Chunks found bad on disk, discarded and fetched again."),
    "cache_overshoots": _Scalar("overshoots", "counter",
                                "Downloads admitted over the limits because every chunk was "
                                "held (by one chunk at most)."),
    "cache_hydrated_chunks": _Scalar("hydrated_chunks", "gauge",
                                     "Chunks on the cache disk, downloads in flight excluded."),
    "cache_size_bytes": _Scalar("size_bytes", "gauge",
                                "Bytes the cache accounts for, downloads in flight included."),
    "cache_objects": _Scalar("objects", "gauge",
                             "Chunk files the cache accounts for, downloads in flight included."),
    "cache_readers": _Scalar("readers", "gauge", "Consumer sessions the cache tracks."),
    "cache_max_size_bytes": _Scalar("max_bytes", "gauge",
                                    "The cache's size limit (cloud_storage_cache_size and "
                                    "_size_percent, the smaller)."),
    "cache_max_objects": _Scalar("max_objects", "gauge",
                                 "The cache's object limit (cloud_storage_cache_max_objects)."),
}

#: metric name -> the `Reader.stats` key it exports (the per-source ones are labelled below)
READER_METRICS: dict[str, _Scalar] = {
    "fetch_out_of_range": _Scalar("out_of_range", "counter",
                                  "Fetches refused with OFFSET_OUT_OF_RANGE."),
    "timestamp_lookups": _Scalar("timestamp_lookups", "counter",
                                 "Offset-for-timestamp lookups (ListOffsets by time)."),
    "remote_index_downloads": _Scalar("index_downloads", "counter",
                                      "Segment index objects downloaded to position reads."),
    "remote_index_fallbacks": _Scalar("index_fallbacks", "counter",
                                      "Remote reads that scanned a segment because its index "
                                      "was missing or unusable."),
}

#: `tiered_fetches_total{source}` / `tiered_fetch_bytes_total{source}` -> `Reader.stats` keys
_FETCH_SOURCES: dict[str, tuple[str, str]] = {
    "local": ("local_fetches", "local_bytes"),
    "remote": ("remote_fetches", "remote_bytes"),
}


class ReaderCollector(Collector):
    """Reads `Reader.stats` at every scrape. `stats()` returning None (no reader yet) exports
    nothing; a failing one is logged and exports nothing, since a scrape must never fail
    because of a read path."""

    def __init__(self, stats: Callable[[], Mapping[str, Any] | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self._stats()
        except Exception:
            log.exception("could not read the reader's statistics")
            return
        if stats is None:
            return
        fetches = _family("counter", "fetches", "Fetches served, by where the first bytes came "
                          "from (a fetch crossing from the bucket to the local log is remote).",
                          ["source"])
        fetch_bytes = _family("counter", "fetch_bytes", "Record-batch bytes returned by fetches, "
                              "by source.", ["source"])
        for source, (count_key, bytes_key) in _FETCH_SOURCES.items():
            fetches.add_metric([source], float(stats.get(count_key, 0)))
            fetch_bytes.add_metric([source], float(stats.get(bytes_key, 0)))
        yield from (fetches, fetch_bytes)
        yield from _scalars(READER_METRICS, stats)
        cache = stats.get("cache")
        if isinstance(cache, Mapping):
            yield from _scalars(CACHE_METRICS, cache)


def _scalars(table: Mapping[str, _Scalar], values: Mapping[str, Any]) -> Iterator[Metric]:
    """One unlabelled family per entry of `table` whose source key `values` has."""
    for name, scalar in table.items():
        if scalar.field in values:
            family = _family(scalar.kind, name, scalar.doc)
            family.add_metric([], float(values[scalar.field]))
            yield family


def make_registry(*collectors: Collector) -> CollectorRegistry:
    """A private registry (never prometheus-client's global one, so two daemons in one test
    process do not collide) holding `collectors`."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


@dataclass(frozen=True)
class Health:
    """What `/health` answers: an HTTP status and a JSON body."""

    status: int
    body: Mapping[str, Any]


# --- the daemon's state and /health -------------------------------------------------------


@dataclass(frozen=True)
class DaemonState:
    """What the HTTP thread may see, replaced as a whole after every job (never mutated).

    `store_up` is None until the store was first reached or failed; `last_errors` holds the
    problems of each job's latest run (absent: it ran clean)."""

    phase: str = "starting"  # starting | running | stopping
    started_s: float = 0.0
    store_up: bool | None = None
    store_error: str | None = None
    jobs: Mapping[str, JobCounters] = field(default_factory=dict)
    last_errors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    stats: ArchiverStats | None = None
    partitions: int = 0


def health_of(state: DaemonState, now_s: float, *, cache_problem: str | None = None) -> Health:
    """`/health`: 503 while the object store is unreachable; otherwise 200 with `status`
    "starting" (no upload round finished yet), "degraded" (the latest run of some job
    reported a problem, such as a corrupt segment, or the read cache cannot write its
    chunks, while the rest goes on) or "ok"."""
    body: dict[str, object] = {
        "uptime_s": round(max(0.0, now_s - state.started_s), 3),
        "phase": state.phase,
        "store_up": state.store_up,
        "partitions": state.partitions,
        "jobs": {
            name: {
                "runs": c.runs,
                "failures": c.failures,
                "last_success": c.last_success_s,
                "errors": list(state.last_errors.get(name, ())),
            }
            for name, c in sorted(state.jobs.items())
        },
    }
    if cache_problem is not None:
        body["cache_error"] = cache_problem
    if state.store_up is False:
        return Health(503, {"status": "unavailable",
                            "reason": f"object store unreachable: {state.store_error}", **body})
    if "upload" not in state.jobs:
        return Health(200, {"status": "starting", **body})
    if any(state.last_errors.values()) or cache_problem is not None:
        return Health(200, {"status": "degraded", **body})
    return Health(200, {"status": "ok", **body})


#: a routed path's answer: (status, headers, body); a HEAD answer carries the GET's
#: Content-Length in `headers` and an empty body
Response = tuple[int, Mapping[str, str], bytes]
#: `route(method, path, query)`: `path` still percent-encoded and without the query string,
#: `query` as `urllib.parse.parse_qs` returns it (blank values kept)
Route = Callable[[str, str, Mapping[str, Sequence[str]]], Response]

_TEXT = "text/plain; charset=utf-8"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    #: seconds a socket read or write may stall before the request is dropped, so a client
    #: that stops reading cannot hold a request thread (and the daemon's shutdown) for ever
    timeout = 60.0

    # http.server calls do_<METHOD>; any other method gets its own 501
    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        try:
            status, headers, body = self._answer(method, path, query)
        except Exception:  # a scrape or a read must never take the server down
            log.exception("error serving %s %s", method, path)
            status, headers, body = (HTTPStatus.INTERNAL_SERVER_ERROR,
                                     {"Content-Type": _TEXT}, b"internal error\n")
        try:
            self._send(method, status, headers, body)
        except (TimeoutError, ConnectionError) as exc:
            log.debug("client went away during %s %s: %s", method, path, exc)

    def _answer(self, method: str, path: str, query: str) -> Response:
        for prefix, route in self.server.routes.items():
            if path.startswith(prefix):
                return route(method, path, parse_qs(query, keep_blank_values=True))
        if path not in ("/metrics", "/health"):
            return (HTTPStatus.NOT_FOUND, {"Content-Type": _TEXT},
                    b"not found: try /metrics or /health\n")
        if method not in ("GET", "HEAD"):
            return (HTTPStatus.METHOD_NOT_ALLOWED, {"Content-Type": _TEXT, "Allow": "GET, HEAD"},
                    f"method {method} not allowed\n".encode())
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            return HTTPStatus.OK, {"Content-Type": content_type}, encoder(self.server.registry)
        health = self.server.health()
        body = json.dumps(health.body, default=str).encode() + b"\n"
        return health.status, {"Content-Type": "application/json"}, body

    def _send(self, method: str, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if not any(name.lower() == "content-length" for name in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        log.debug("http: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a request stuck past the drain must not keep the process alive

    def __init__(
        self, address: tuple[str, int], registry: CollectorRegistry, health: Callable[[], Health],
        routes: Mapping[str, Route],
    ) -> None:
        self.registry = registry
        self.health = health
        self.routes = routes
        self._inflight = 0
        self._idle = threading.Condition()
        super().__init__(address, _Handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._idle:
            self._inflight += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def drain(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for requests in flight to finish; returns how many remain."""
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout_s)
            return self._inflight


class MetricsServer:
    """`/metrics` (Prometheus text, or OpenMetrics when asked for), `/health`, and `routes`
    (path prefix -> `Route`, tried first, in order) on one port.

    `port=0` binds an ephemeral port; `port` then tells which. Serves from a background thread
    between `start()` and `stop()`; usable as a context manager. `stop()` lets requests in
    flight finish for up to `drain_s` seconds, so whatever a route uses (the daemon's reader)
    can be closed right after it."""

    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, health: Callable[[], Health],
        routes: Mapping[str, Route] | None = None, *, drain_s: float = 10.0,
    ) -> None:
        self._server = _Server((host, port), registry, health, dict(routes or {}))
        self._drain_s = drain_s
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tiered-metrics", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, drain requests in flight, close the socket. Idempotent."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
            left = self._server.drain(self._drain_s)
            if left:
                log.warning("http: %d request(s) still running after %.0f s; closing anyway",
                            left, self._drain_s)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
