"""Metrics: the collectors' families from archiver, reader and cache statistics, and the HTTP
server that serves them and routes other paths (real HTTP on 127.0.0.1, ephemeral port)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from archiver.service import ArchiverStats
from cache.fetched_bytes import FilePiece, Pieces
from cache.mapped import MappedFile
from tiered.app.health import Health, JobCounters
from tiered.app.http_server import HttpServer, Response
from tiered.app.metrics import (
    ARCHIVER_METRICS,
    CACHE_METRICS,
    KAFKA_METRICS,
    READER_METRICS,
    ArchiverCollector,
    JobsCollector,
    KafkaCollector,
    ReaderCollector,
    make_registry,
)
from tiered.store.retry import RetryStats


def _stats() -> ArchiverStats:
    return ArchiverStats(
        uploaded_bytes_total=4096,
        uploaded_segments_total=3,
        upload_errors_total=1,
        commits_total=3,
        commit_conflicts_total=1,
        pending_bytes=700,
        pending_bytes_by_partition={("orders", 0): 500, ("orders", 1): 200},
        backlog_ratio=0.25,
        controller_error=-250.0,
        controller_shares=500,
        disk_alert_state=1,
        remote_deleted_objects_total=7,
        local_deleted_segments_total=2,
        store_retry_stats={"operations": 10, "attempts": 12, "retries": 2, "errors": 1,
                           "exhausted": 0},
    )


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


@pytest.fixture
def server() -> Iterator[HttpServer]:
    stats = _stats()
    registry = make_registry(
        ArchiverCollector(lambda: stats),
        JobsCollector(lambda: {"upload": JobCounters(4, 1, 1700000000.0)}, lambda: True),
    )
    health = Health(503, {"status": "unavailable", "reason": "store down"})
    with HttpServer("127.0.0.1", 0, registry, lambda: health) as srv:
        yield srv


def test_every_archiver_stat_is_exported_with_its_value() -> None:
    from prometheus_client import generate_latest

    text = generate_latest(make_registry(ArchiverCollector(_stats))).decode()
    samples = _samples(text)
    stats = _stats()
    for name, scalar in ARCHIVER_METRICS.items():
        sample = f"tiered_{name}_total" if scalar.kind == "counter" else f"tiered_{name}"
        assert samples[(sample, ())] == float(getattr(stats, scalar.field)), name
    assert samples[("tiered_uploaded_bytes_total", ())] == 4096
    assert samples[("tiered_upload_controller_shares", ())] == 500
    assert samples[("tiered_disk_free_space_alert", ())] == 1
    assert samples[("tiered_pending_upload_bytes",
                    (("partition", "0"), ("topic", "orders")))] == 500
    assert samples[("tiered_pending_upload_bytes",
                    (("partition", "1"), ("topic", "orders")))] == 200
    archive = (("path", "archive"),)
    assert samples[("tiered_store_attempts_total", archive)] == 12
    assert samples[("tiered_store_retries_total", archive)] == 2


def test_store_metrics_are_labelled_by_path_with_bytes_and_latency() -> None:
    from prometheus_client import generate_latest

    stats = RetryStats()
    stats.add(operations=7, attempts=9, retries=2, errors=1, bytes_read=5000, bytes_written=10)
    for seconds in (0.001, 0.02, 0.02, 3.0, 99.0):
        stats.observe(seconds)
    text = generate_latest(make_registry(
        ArchiverCollector(_stats, stats.snapshot))).decode()
    samples = _samples(text)
    read, archive = (("path", "read"),), (("path", "archive"),)
    assert samples[("tiered_store_operations_total", read)] == 7
    assert samples[("tiered_store_operations_total", archive)] == 10
    assert samples[("tiered_store_errors_total", read)] == 1
    assert samples[("tiered_store_bytes_total", (("direction", "read"), ("path", "read")))] == 5000
    assert samples[("tiered_store_bytes_total",
                    (("direction", "write"), ("path", "read")))] == 10
    assert samples[("tiered_store_request_seconds_count", read)] == 5
    assert samples[("tiered_store_request_seconds_bucket", (("le", "0.005"), *read))] == 1
    assert samples[("tiered_store_request_seconds_bucket", (("le", "0.025"), *read))] == 3
    assert samples[("tiered_store_request_seconds_bucket", (("le", "5.0"), *read))] == 4
    assert samples[("tiered_store_request_seconds_bucket", (("le", "+Inf"), *read))] == 5
    assert samples[("tiered_store_request_seconds_sum", read)] == pytest.approx(102.041)


def test_upload_leases_are_exported_by_node_and_kind() -> None:
    from prometheus_client import generate_latest

    from archiver.lease_keeper import LeaseStats

    def stats() -> ArchiverStats:
        return dataclasses.replace(_stats(), leases=LeaseStats(
            node="broker-2", held=8, acquired_total=9, taken_over_total=4, released_total=3,
            lost_total=1, requests_total=500, renew_failures_total=2))

    samples = _samples(generate_latest(make_registry(ArchiverCollector(stats))).decode())
    node = (("node", "broker-2"),)
    assert samples[("tiered_leases_held", node)] == 8
    for kind, value in (("acquired", 9), ("taken_over", 4), ("released", 3), ("lost", 1)):
        assert samples[("tiered_lease_handovers_total", (("kind", kind), *node))] == value
    assert samples[("tiered_lease_requests_total", node)] == 500
    assert samples[("tiered_lease_renew_failures_total", node)] == 2
    # without leases (a sole writer) there is no node, and no lease metric
    plain = generate_latest(make_registry(ArchiverCollector(_stats))).decode()
    assert "tiered_lease" not in plain


def test_no_stats_yet_exports_nothing_rather_than_zeros() -> None:
    from prometheus_client import generate_latest

    text = generate_latest(make_registry(ArchiverCollector(lambda: None))).decode()
    assert "tiered_" not in text


def test_job_counters_and_store_up() -> None:
    from prometheus_client import generate_latest

    jobs = {"upload": JobCounters(5, 2, 1700000000.0), "housekeeping": JobCounters(1, 0, None)}
    text = generate_latest(make_registry(JobsCollector(lambda: jobs, lambda: False))).decode()
    samples = _samples(text)
    assert samples[("tiered_daemon_job_runs_total", (("job", "upload"),))] == 5
    assert samples[("tiered_daemon_job_failures_total", (("job", "upload"),))] == 2
    assert samples[("tiered_daemon_job_last_success_timestamp_seconds",
                    (("job", "upload"),))] == 1700000000.0
    # a job that never succeeded has no last-success sample at all
    assert ("tiered_daemon_job_last_success_timestamp_seconds",
            (("job", "housekeeping"),)) not in samples
    assert samples[("tiered_store_up", ())] == 0


def test_store_up_unknown_is_not_exported() -> None:
    from prometheus_client import generate_latest

    text = generate_latest(make_registry(JobsCollector(lambda: {}, lambda: None))).decode()
    assert "tiered_store_up" not in text


def test_http_metrics_endpoint(server: HttpServer) -> None:
    status, content_type, body = _get(server.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    samples = _samples(body)
    assert samples[("tiered_uploaded_segments_total", ())] == 3
    assert samples[("tiered_daemon_job_runs_total", (("job", "upload"),))] == 4


def test_http_openmetrics_on_request(server: HttpServer) -> None:
    request = urllib.request.Request(
        server.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert response.read().decode().rstrip().endswith("# EOF")


def test_http_health_passes_status_and_json_through(server: HttpServer) -> None:
    status, content_type, body = _get(server.url + "/health")
    assert status == 503
    assert content_type == "application/json"
    assert json.loads(body) == {"status": "unavailable", "reason": "store down"}


def test_http_unknown_path_is_404(server: HttpServer) -> None:
    status, _, body = _get(server.url + "/nope")
    assert status == 404 and "/metrics" in body


def test_a_failing_health_source_answers_500_and_the_server_keeps_serving() -> None:
    def broken() -> Health:
        raise RuntimeError("boom")

    with HttpServer("127.0.0.1", 0, make_registry(), broken) as srv:
        assert _get(srv.url + "/health")[0] == 500
        assert _get(srv.url + "/metrics")[0] == 200


def test_port_zero_binds_an_ephemeral_port_and_stop_releases_it() -> None:
    srv = HttpServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {}))
    srv.start()
    port = srv.port
    assert port > 0
    srv.stop()
    again = HttpServer("127.0.0.1", port, make_registry(), lambda: Health(200, {}))
    again.stop()  # the port was free again


# --- the reader's and the cache's metrics ------------------------------------------------------


def _reader_stats() -> dict[str, object]:
    return {
        "local_fetches": 4, "remote_fetches": 6, "local_bytes": 400, "remote_bytes": 6000,
        "out_of_range": 2, "timestamp_lookups": 3, "index_downloads": 5, "index_fallbacks": 1,
        "cache": {"hits": 10, "misses": 3, "joined": 1, "bytes_downloaded": 3 << 20,
                  "evictions": 2, "prefetches": 4, "download_errors": 1, "corrupt_discarded": 1,
                  "overshoots": 0, "written_behind": 5, "unwritten_evictions": 7,
                  "hydrated_chunks": 2, "memory_chunks": 1, "memory_bytes": 16 << 20,
                  "size_bytes": 2 << 20, "objects": 2, "readers": 1, "max_bytes": 1 << 30,
                  "max_objects": 100_000},
    }


def test_every_reader_and_cache_stat_is_exported_with_its_value() -> None:
    from prometheus_client import generate_latest

    stats = _reader_stats()
    samples = _samples(generate_latest(make_registry(ReaderCollector(lambda: stats))).decode())
    assert samples[("tiered_fetches_total", (("source", "local"),))] == 4
    assert samples[("tiered_fetches_total", (("source", "remote"),))] == 6
    assert samples[("tiered_fetch_bytes_total", (("source", "local"),))] == 400
    assert samples[("tiered_fetch_bytes_total", (("source", "remote"),))] == 6000
    assert samples[("tiered_fetch_out_of_range_total", ())] == 2
    assert samples[("tiered_cache_hits_total", ())] == 10
    assert samples[("tiered_cache_misses_total", ())] == 3
    assert samples[("tiered_cache_downloaded_bytes_total", ())] == 3 << 20
    assert samples[("tiered_cache_evictions_total", ())] == 2
    assert samples[("tiered_cache_hydrated_chunks", ())] == 2
    assert samples[("tiered_cache_size_bytes", ())] == 2 << 20
    assert samples[("tiered_cache_objects", ())] == 2
    cache = stats["cache"]
    assert isinstance(cache, dict)
    for table, source in ((READER_METRICS, stats), (CACHE_METRICS, cache)):
        for name, scalar in table.items():
            sample = f"tiered_{name}_total" if scalar.kind == "counter" else f"tiered_{name}"
            assert samples[(sample, ())] == source[scalar.field], name


def test_every_stat_a_real_cache_keeps_has_its_metric(tmp_path: Path) -> None:
    from cache.accounting import CacheSettings
    from cache.chunk_cache import ChunkCache

    settings = CacheSettings(size_bytes=1 << 20, chunk_prefetch=1)
    with ChunkCache(tmp_path, settings, lambda key, begin, end: b"",
                    stream=lambda *a, **k: None) as cache:  # type: ignore[arg-type,return-value]
        kept = set(cache.stats())
    assert kept == {scalar.field for scalar in CACHE_METRICS.values()}
    assert set(_reader_stats()["cache"]) == kept  # type: ignore[arg-type]


def test_reader_collector_exports_nothing_without_a_reader_or_when_stats_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prometheus_client import generate_latest

    def broken() -> dict[str, object]:
        raise RuntimeError("boom")

    assert "tiered_" not in generate_latest(make_registry(ReaderCollector(lambda: None))).decode()
    registry = make_registry(ReaderCollector(broken), JobsCollector(lambda: {}, lambda: True))
    text = generate_latest(registry).decode()  # the scrape itself still succeeds
    assert "tiered_fetches" not in text and "tiered_store_up 1.0" in text
    assert "could not read the reader's statistics" in caplog.text


# --- routes ------------------------------------------------------------------------------------


def _request(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method),
                                    timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_routes_get_method_raw_path_and_parsed_query() -> None:
    calls: list[tuple[str, str, dict[str, list[str]]]] = []

    def route(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Response:
        calls.append((method, path, {k: list(v) for k, v in query.items()}))
        body = b"" if method == "HEAD" else b"hello"
        return 200, {"Content-Type": "text/plain", "Content-Length": "5", "X-Extra": "1"}, body

    with HttpServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {}),
                    {"/v1/": route}) as srv:
        status, headers, body = _request(srv.url + "/v1/topics/a%2Fb/x?offset=3&max_bytes=")
        assert (status, body, headers["X-Extra"]) == (200, b"hello", "1")
        status, headers, body = _request(srv.url + "/v1/y?offset=1&offset=2", "HEAD")
        assert (status, body, headers["Content-Length"]) == (200, b"", "5")
        assert _request(srv.url + "/v1/z", "DELETE")[0] == 200
        assert _request(srv.url + "/metrics")[0] == 200  # beside the built-in paths
    assert calls == [
        ("GET", "/v1/topics/a%2Fb/x", {"offset": ["3"], "max_bytes": [""]}),
        ("HEAD", "/v1/y", {"offset": ["1", "2"]}),
        ("DELETE", "/v1/z", {}),
    ]


def test_a_file_body_leaves_with_its_headers_in_one_send(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer made of file ranges (a records fetch) goes out as one `sendmsg` of its
    status line, headers and bytes: sent apart, each would wake the client on its own. The
    Date header is still there, formatted."""
    data = os.urandom(100_000)
    path = tmp_path / "chunk"
    path.write_bytes(data)
    sends: list[int] = []
    real = socket.socket.sendmsg

    def counted(sock: socket.socket, buffers: list[memoryview], *args: object) -> int:
        sends.append(len(buffers))
        return real(sock, buffers, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "sendmsg", counted)

    def route(method: str, path_: str, query: Mapping[str, Sequence[str]]) -> Response:
        shared = MappedFile(os.open(path, os.O_RDONLY), len(data))
        body = Pieces()
        body.add(FilePiece(shared.fd, 10, 50_000, shared.mapping))
        body.add(b"-")
        body.adopt([shared])
        return 200, {"Content-Type": "application/octet-stream"}, body

    with HttpServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {}),
                    {"/v1/": route}) as srv:
        status, headers, body = _request(srv.url + "/v1/records")
    assert (status, body) == (200, data[10:50_010] + b"-")
    assert headers["Content-Length"] == "50001" and headers["Date"].endswith(" GMT")
    assert len(sends) == 1 and sends[0] == 3  # head, the range, the trailing bytes


def test_a_failing_route_answers_500_and_other_methods_on_builtin_paths_405() -> None:
    def route(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Response:
        raise RuntimeError("boom")

    with HttpServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {}),
                    {"/v1/": route}) as srv:
        assert _request(srv.url + "/v1/x")[0] == 500
        status, headers, _ = _request(srv.url + "/metrics", "POST")
        assert (status, headers["Allow"]) == (405, "GET, HEAD")
        status, headers, body = _request(srv.url + "/health", "HEAD")
        assert (status, body) == (200, b"") and int(headers["Content-Length"]) > 0
        assert _request(srv.url + "/health")[0] == 200


def test_stop_waits_for_requests_in_flight() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Response:
        entered.set()
        assert release.wait(30)
        return 200, {}, b"done"

    srv = HttpServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {}),
                     {"/slow": slow})
    srv.start()
    answers: list[tuple[int, dict[str, str], bytes]] = []
    client = threading.Thread(target=lambda: answers.append(_request(srv.url + "/slow")))
    client.start()
    assert entered.wait(30)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # still draining the slow request
    release.set()
    stopper.join(30)
    client.join(30)
    assert not stopper.is_alive() and answers[0][0] == 200 and answers[0][2] == b"done"


def test_stop_gives_up_on_a_stuck_request_after_the_drain_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Response:
        entered.set()
        release.wait(30)
        return 200, {}, b""

    srv = HttpServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {}),
                     {"/stuck": stuck}, drain_s=0.05)
    srv.start()
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            _request(srv.url + "/stuck")
        except (OSError, http.client.HTTPException) as exc:
            outcome.append(exc)

    client = threading.Thread(target=ask)
    client.start()
    try:
        assert entered.wait(30)
        srv.stop()
        assert "1 request(s) still running" in caplog.text
        client.join(30)
        assert outcome, "the stuck request's connection was left open"  # closed, no answer
    finally:
        release.set()
        client.join(30)


def test_every_kafka_endpoint_stat_is_exported_and_none_without_an_endpoint() -> None:
    from prometheus_client import generate_latest

    stats = {"connections": 3, "connections_reading": 2, "connections_total": 10,
             "connections_refused": 2,
             "connections_reclaimed": 4, "closed_slow_requests": 5, "closed_bad_requests": 1,
             "requests": {"Fetch": 7, "Produce": 1},
             "bytes_sent": 5000, "bytes_received": 300}
    samples = _samples(generate_latest(make_registry(KafkaCollector(lambda: stats))).decode())
    assert samples[("tiered_kafka_requests_total", (("api", "Fetch"),))] == 7
    assert samples[("tiered_kafka_requests_total", (("api", "Produce"),))] == 1
    for name, scalar in KAFKA_METRICS.items():
        sample = f"tiered_{name}_total" if scalar.kind == "counter" else f"tiered_{name}"
        assert samples[(sample, ())] == stats[scalar.field], name
    assert generate_latest(make_registry(KafkaCollector(lambda: None))).decode() == ""
