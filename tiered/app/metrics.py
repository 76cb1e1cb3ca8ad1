"""Prometheus metrics of the daemon: collectors that read the archiver's, the reader's and
the daemon's own counters at scrape time (served by `tiered.app.http_server`).

The archiver and the reader count what they do (`Archiver.snapshot()` -> `ArchiverStats`,
`Reader.stats` with the chunk cache's counters under "cache"); the collectors here only
translate those plain numbers into metric families at scrape time, so nothing is
double-counted and neither the archiver nor the reader imports prometheus-client. Names
follow Redpanda's (`vectorized_ntp_archiver_pending`,
`redpanda_storage_disk_free_space_alert`) under the `tiered_` prefix; counters end in
`_total`, sizes in `_bytes`.

"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tiered.app.health import JobCounters
from tiered.store.base import LATENCY_BUCKETS

if TYPE_CHECKING:
    from archiver.service import ArchiverStats

__all__ = [
    "ARCHIVER_METRICS",
    "CACHE_METRICS",
    "READER_METRICS",
    "STORE_METRICS",
    "ArchiverCollector",
    "JobCounters",
    "JobsCollector",
    "KAFKA_METRICS",
    "KafkaCollector",
    "ReaderCollector",
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
    "partitions_lost_history": _Scalar("partitions_lost_history", "gauge",
                                       "Partitions whose head is gone over their history, or "
                                       "lost part of it: stopped, nothing collected; repair "
                                       "with recover --rebuild-manifests."),
    "heads_restored": _Scalar("heads_restored_total", "counter",
                              "Head manifests restored from their copies."),
    "housekeeping_census_spared": _Scalar("census_spared_total", "counter",
                                          "Full housekeeping passes of idle partitions a "
                                          "census of the bucket spared."),
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
    started yet) exports nothing rather than misleading zeros. The `tiered_store_*` families
    are labelled by `path`: `archive` (the archiver's store handle) and `read` (the read
    path's, from `read_store()`: a `RetryStats.snapshot()`, empty when there is none)."""

    def __init__(self, stats: Callable[[], ArchiverStats | None],
                 read_store: Callable[[], Mapping[str, int]] = dict) -> None:
        self._stats = stats
        self._read_store = read_store

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
        yield from lease_families(stats.leases)
        yield from store_families({"archive": stats.store_retry_stats,
                                   "read": self._read_store()})


#: `LeaseStats` field -> (kind of handover, documentation) of `tiered_lease_handovers_total`
LEASE_HANDOVERS: dict[str, tuple[str, str]] = {
    "acquired_total": ("acquired", "a free lease, or this node's own, taken"),
    "taken_over_total": ("taken_over", "taken from a node that stopped renewing"),
    "released_total": ("released", "handed over to another node"),
    "lost_total": ("lost", "found taken by another node"),
}


def lease_families(leases: Any) -> Iterator[Metric]:
    """Upload-lease metrics, labelled by this sidecar's node id (none without leases): leases
    held, handovers by kind, the store requests the leases cost and failed renewals."""
    if leases is None or leases.node is None:
        return
    node = [leases.node]
    held = _family("gauge", "leases_held", "Upload leases this sidecar holds: the partitions "
                   "it uploads.", ["node"])
    held.add_metric(node, float(leases.held))
    yield held
    handovers = _family("counter", "lease_handovers", "Upload leases that changed hands at "
                        "this sidecar, by kind: " + "; ".join(
                            f"{kind}: {doc}" for kind, doc in LEASE_HANDOVERS.values()),
                        ["node", "kind"])
    for field_name, (kind, _) in LEASE_HANDOVERS.items():
        handovers.add_metric([*node, kind], float(getattr(leases, field_name)))
    yield handovers
    requests = _family("counter", "lease_requests", "Object-store requests the upload leases "
                       "cost (renewals, watching the other sidecars, handovers).", ["node"])
    requests.add_metric(node, float(leases.requests_total))
    yield requests
    failures = _family("counter", "lease_renew_failures", "Renewals of this sidecar's record "
                       "that failed; its leases lapse after cloud_storage_upload_lease_ms "
                       "without one.", ["node"])
    failures.add_metric(node, float(leases.renew_failures_total))
    yield failures


def store_families(paths: Mapping[str, Mapping[str, int]]) -> Iterator[Metric]:
    """`tiered_store_*` from `RetryStats.snapshot()`s by path: the counters, bytes moved by
    direction, and the request-latency histogram."""
    paths = {path: snap for path, snap in paths.items() if snap}
    for key, doc in STORE_METRICS.items():
        family = _family("counter", f"store_{key}", doc, ["path"])
        for path, snap in paths.items():
            family.add_metric([path], float(snap.get(key, 0)))
        yield family
    moved = _family("counter", "store_bytes", "Object bytes moved, by path and direction "
                    "(read: GET bodies, write: PUT bodies and multipart uploads).",
                    ["path", "direction"])
    for path, snap in paths.items():
        moved.add_metric([path, "read"], float(snap.get("bytes_read", 0)))
        moved.add_metric([path, "write"], float(snap.get("bytes_written", 0)))
    yield moved
    latency = HistogramMetricFamily(
        f"{PREFIX}_store_request_seconds", "Time of object-store operations, retries "
        "included, by path.", labels=["path"])
    for path, snap in paths.items():
        cumulative, buckets = 0, []
        for i, bound in enumerate((*LATENCY_BUCKETS, float("inf"))):
            cumulative += snap.get(f"latency_bucket_{i}", 0)
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        latency.add_metric([path], buckets, snap.get("latency_sum_us", 0) / 1_000_000)
    yield latency


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
    "cache_written_behind": _Scalar("written_behind", "counter",
                                    "Streamed chunks written from memory to the cache disk "
                                    "once their readers let go of them."),
    "cache_unwritten_evictions": _Scalar("unwritten_evictions", "counter",
                                         "Streamed chunks evicted from memory before they "
                                         "were written: cache disk writes saved."),
    "cache_hydrated_chunks": _Scalar("hydrated_chunks", "gauge",
                                     "Chunks cached (on the cache disk, or in memory until "
                                     "written), downloads in flight excluded."),
    "cache_memory_chunks": _Scalar("memory_chunks", "gauge",
                                   "Cached chunks only in memory, not written to the cache "
                                   "disk yet."),
    "cache_memory_bytes": _Scalar("memory_bytes", "gauge",
                                  "Memory the buffers for streamed chunks hold "
                                  "(at most cloud_storage_cache_memory_size)."),
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


def _read_stats(stats: Callable[[], Mapping[str, Any] | None], whose: str
                ) -> Mapping[str, Any] | None:
    """`stats()`, or None when there are none or they fail (logged): a scrape must never fail
    because one part of the daemon could not say what it did."""
    try:
        return stats()
    except Exception:
        log.exception("could not read %s statistics", whose)
        return None


class ReaderCollector(Collector):
    """Reads `Reader.stats` at every scrape. `stats()` returning None (no reader yet) exports
    nothing; a failing one is logged and exports nothing, since a scrape must never fail
    because of a read path."""

    def __init__(self, stats: Callable[[], Mapping[str, Any] | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = _read_stats(self._stats, "the reader's")
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


#: metric name -> the `KafkaServer.stats()` key it exports (requests are labelled by api)
KAFKA_METRICS: dict[str, _Scalar] = {
    "kafka_connections": _Scalar("connections", "gauge",
                                 "Kafka client connections being served."),
    "kafka_connections_reading": _Scalar("connections_reading", "gauge",
                                         "Kafka client connections mid-request: the first "
                                         "byte in, the rest not yet."),
    "kafka_connections_accepted": _Scalar("connections_total", "counter",
                                          "Kafka client connections accepted and served."),
    "kafka_connections_refused": _Scalar("connections_refused", "counter",
                                         "Kafka connections closed at once: max_connections "
                                         "were being served."),
    "kafka_connections_reclaimed": _Scalar("connections_reclaimed", "counter",
                                           "Kafka connections closed to serve a new one at "
                                           "max_connections: the one that waited on its "
                                           "client the longest."),
    "kafka_slow_requests": _Scalar("closed_slow_requests", "counter",
                                   "Kafka connections closed because a request was not "
                                   "whole within request_timeout_ms of its first byte."),
    "kafka_bad_requests": _Scalar("closed_bad_requests", "counter",
                                  "Kafka connections closed for a request too large, "
                                  "malformed or of an API or version not served."),
    "kafka_sent_bytes": _Scalar("bytes_sent", "counter",
                                "Bytes of Kafka responses sent, record bytes included."),
    "kafka_received_bytes": _Scalar("bytes_received", "counter",
                                    "Bytes of Kafka requests received."),
}


class KafkaCollector(Collector):
    """Reads `KafkaServer.stats()` at every scrape; nothing without a Kafka endpoint."""

    def __init__(self, stats: Callable[[], Mapping[str, Any] | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = _read_stats(self._stats, "the Kafka endpoint's")
        if stats is None:
            return
        yield from _scalars(KAFKA_METRICS, stats)
        requests = _family("counter", "kafka_requests", "Kafka requests answered, by API.",
                           ["api"])
        for api, count in sorted(stats.get("requests", {}).items()):
            requests.add_metric([api], float(count))
        yield requests


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


