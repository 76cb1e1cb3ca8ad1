"""Metrics: the collectors' families from archiver statistics, and the HTTP server that serves
them (real HTTP on 127.0.0.1, ephemeral port)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from archiver.service import ArchiverStats
from tiered.metrics import (
    ARCHIVER_METRICS,
    ArchiverCollector,
    Health,
    JobCounters,
    JobsCollector,
    MetricsServer,
    make_registry,
)


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
def server() -> Iterator[MetricsServer]:
    stats = _stats()
    registry = make_registry(
        ArchiverCollector(lambda: stats),
        JobsCollector(lambda: {"upload": JobCounters(4, 1, 1700000000.0)}, lambda: True),
    )
    health = Health(503, {"status": "unavailable", "reason": "store down"})
    with MetricsServer("127.0.0.1", 0, registry, lambda: health) as srv:
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
    assert samples[("tiered_store_attempts_total", ())] == 12
    assert samples[("tiered_store_retries_total", ())] == 2


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


def test_http_metrics_endpoint(server: MetricsServer) -> None:
    status, content_type, body = _get(server.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    samples = _samples(body)
    assert samples[("tiered_uploaded_segments_total", ())] == 3
    assert samples[("tiered_daemon_job_runs_total", (("job", "upload"),))] == 4


def test_http_openmetrics_on_request(server: MetricsServer) -> None:
    request = urllib.request.Request(
        server.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert response.read().decode().rstrip().endswith("# EOF")


def test_http_health_passes_status_and_json_through(server: MetricsServer) -> None:
    status, content_type, body = _get(server.url + "/health")
    assert status == 503
    assert content_type == "application/json"
    assert json.loads(body) == {"status": "unavailable", "reason": "store down"}


def test_http_unknown_path_is_404(server: MetricsServer) -> None:
    status, _, body = _get(server.url + "/nope")
    assert status == 404 and "/metrics" in body


def test_a_failing_health_source_answers_500_and_the_server_keeps_serving() -> None:
    def broken() -> Health:
        raise RuntimeError("boom")

    with MetricsServer("127.0.0.1", 0, make_registry(), broken) as srv:
        assert _get(srv.url + "/health")[0] == 500
        assert _get(srv.url + "/metrics")[0] == 200


def test_port_zero_binds_an_ephemeral_port_and_stop_releases_it() -> None:
    srv = MetricsServer("127.0.0.1", 0, make_registry(), lambda: Health(200, {}))
    srv.start()
    port = srv.port
    assert port > 0
    srv.stop()
    again = MetricsServer("127.0.0.1", port, make_registry(), lambda: Health(200, {}))
    again.stop()  # the port was free again
