"""Prometheus metrics and the daemon's small HTTP server (`/metrics`, `/health`).

The archiver counts what it does (`Archiver.snapshot()` -> `ArchiverStats`); the collectors
here only translate those plain numbers into metric families at scrape time, so nothing is
double-counted and the archiver never imports prometheus-client. Names follow the seeds'
spirit (`vectorized_ntp_archiver_pending`, `redpanda_storage_disk_free_space_alert`) under the
`tiered_` prefix; counters end in `_total`, sizes in `_bytes`.

`/health` answers from a `DaemonState`, the snapshot of the daemon the main thread publishes
after every job (see `health_of`).

Threads: `MetricsServer` serves from its own daemon threads and only calls the zero-argument
source functions it was given; those must be safe to call from any thread (the daemon hands
in functions that read an immutable, already-published snapshot).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from archiver.service import ArchiverStats

__all__ = [
    "ARCHIVER_METRICS",
    "STORE_METRICS",
    "ArchiverCollector",
    "DaemonState",
    "Health",
    "JobCounters",
    "JobsCollector",
    "MetricsServer",
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
                                     "2 degraded (seed 000)."),
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


def health_of(state: DaemonState, now_s: float) -> Health:
    """`/health`: 503 while the object store is unreachable; otherwise 200 with `status`
    "starting" (no upload round finished yet), "degraded" (the latest run of some job
    reported a problem, such as a corrupt segment, while others go on) or "ok"."""
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
    if state.store_up is False:
        return Health(503, {"status": "unavailable",
                            "reason": f"object store unreachable: {state.store_error}", **body})
    if "upload" not in state.jobs:
        return Health(200, {"status": "starting", **body})
    if any(state.last_errors.values()):
        return Health(200, {"status": "degraded", **body})
    return Health(200, {"status": "ok", **body})


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(HTTPStatus.OK, encoder(self.server.registry), content_type)
            elif path == "/health":
                health = self.server.health()
                body = json.dumps(health.body, default=str).encode() + b"\n"
                self._send(health.status, body, "application/json")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found: try /metrics or /health\n",
                           "text/plain; charset=utf-8")
        except Exception:  # a scrape must never take the server down
            log.exception("error serving %s", path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n",
                       "text/plain; charset=utf-8")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        log.debug("http: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], registry: CollectorRegistry, health: Callable[[], Health]
    ) -> None:
        self.registry = registry
        self.health = health
        super().__init__(address, _Handler)


class MetricsServer:
    """`/metrics` (Prometheus text, or OpenMetrics when asked for) and `/health` on one port.

    `port=0` binds an ephemeral port; `port` then tells which. Serves from a background thread
    between `start()` and `stop()`; usable as a context manager."""

    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, health: Callable[[], Health]
    ) -> None:
        self._server = _Server((host, port), registry, health)
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
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
