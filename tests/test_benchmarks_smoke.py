"""The archiver benchmarks run end to end at tiny sizes and print the JSON they promise.

Each benchmark runs as a child process, exactly as a person would run it, against its own
moto server; the tests check the JSON's shape and that every contender moved all the data.
They never look at how fast anything was: the machine's load decides that, not the code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: runs the benchmark scripts: the slow tier
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"


def run_benchmark(script: str, *args: str, timeout: float = 180) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True, text=True, env=env, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert isinstance(report, dict)
    return report


@pytest.mark.timeout(240)
def test_upload_benchmark_reports_every_contender_complete() -> None:
    report = run_benchmark(
        "upload.py", "--size-mb", "6", "--segment-mb", "1", "--partitions", "2",
        "--record-kb", "16", "--repeats", "1", "--no-install",
    )
    assert report["benchmark"] == "upload"
    assert report["segments"] >= 6
    assert report["concurrency"]["uploads_in_flight"] >= 1
    results = report["results"]
    assert set(results) == {"boto3", "boto3_parallel_parts", "aws_cli", "tiered_cli",
                            "tiered_inprocess"}
    for name, result in results.items():
        if "skipped" in result:  # only the aws CLI may be absent, and it must say why
            assert name == "aws_cli" and result["skipped"]
            continue
        assert result["complete"], (name, result)
        assert result["segment_bytes"] == report["segment_bytes"]
        assert result["segment_objects"] == report["segments"]
        assert result["mb_per_s"] > 0 and result["seconds"] > 0
        assert len(result["runs"]) == 1
    # tiered also stores an index per segment and its manifest beside the segment objects
    assert results["tiered_cli"]["objects"] > results["tiered_cli"]["segment_objects"]
    assert results["boto3"]["objects"] == report["segments"]
    ratios = report["ratios"]
    assert ratios["tiered_cli_vs_boto3"] > 0
    assert ratios["tiered_inprocess_vs_boto3"] > 0
    assert report["ratios_paired_by_round"]["tiered_cli_vs_boto3"] > 0


def test_upload_benchmark_refuses_an_unknown_contender() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "upload.py"), "--contenders", "boto3,rsync"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2
    assert "rsync" in proc.stderr


@pytest.mark.timeout(240)
def test_backlog_benchmark_reports_peaks_for_the_three_modes() -> None:
    report = run_benchmark(
        "backlog.py", "--store", "file", "--partitions", "2", "--segment-mb", "0.25",
        "--burst-mb", "1", "--bursts", "2", "--interval", "0.2", "--disk-mb", "16",
        "--max-bandwidth-mb", "8", "--update-interval-ms", "50", "--record-kb", "8",
        "--drain-timeout", "60",
    )
    assert report["benchmark"] == "backlog"
    results = report["results"]
    assert list(results) == ["pd_controller", "fixed_min_shares", "fixed_max_shares"]
    bandwidth = report["upload_bandwidth_bytes_per_s"]
    assert bandwidth["at_min_shares"] < bandwidth["at_max_shares"]
    for name, result in results.items():
        assert result["produced_bytes"] >= 2 * 1024 * 1024, name
        assert 0 < result["peak_backlog_bytes"] <= result["produced_bytes"], name
        assert result["peak_local_disk_bytes"] > 0, name
        assert result["backlog_when_producer_stopped_bytes"] <= result["peak_backlog_bytes"]
        assert result["drained"] and result["final_backlog_bytes"] == 0, (name, result)
        assert result["time_to_drain_s"] >= 0
        assert result["errors"] == []
        assert result["timeline"] and len(result["timeline"][0]) == 4
    assert results["fixed_min_shares"]["fixed_shares"] == 100
    assert results["fixed_max_shares"]["fixed_shares"] == 1000
    assert results["pd_controller"]["fixed_shares"] is None
    assert set(results["fixed_min_shares"]["shares"].values()) == {100}


@pytest.mark.timeout(300)
def test_kafka_read_benchmark_reads_everything_through_the_endpoint() -> None:
    report = run_benchmark("kafka_read.py", "--size-mb", "6", "--segment-mb", "2",
                           "--kafka-python-mb", "2", "--rounds", "1", timeout=240)
    assert report["benchmark"] == "kafka_read"
    assert report["read_ahead"] == "adaptive"  # the default: no --prefetch given
    assert report["segments"] >= 3 and report["archived_bytes"] >= 6 * 1024 * 1024
    cold, kept = report["confluent_cold"], report["confluent_cold_capped"]
    warm = report["confluent_warm"]
    # the script compares every record with the log itself; here: all of them came, the cold
    # runs (default settings, then a cache keeping every chunk) from the store, the second
    # run of the keeping daemon from its cache
    assert cold["messages"] == kept["messages"] == warm["messages"] >= (
        report["archived_bytes"] // (16 * 4096))
    assert cold["store_bytes_downloaded"] == kept["store_bytes_downloaded"] == (
        report["archived_bytes"])
    assert warm["store_bytes_downloaded"] == 0
    assert cold["daemon_cpu_s_per_mb"] > 0
    names = ("confluent_cold", "confluent_cold_capped", "confluent_warm", "kafka_python")
    for name in ("boto3", *names):
        assert report[name]["mb_per_s"] > 0
    assert set(report["ratios"]) == set(names)
    assert len(report["rounds"]) == 1


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_compact_benchmark_loses_nothing_beside_a_daemon() -> None:
    report = run_benchmark("compact.py", "--size-mb", "2", "--keys", "2000", "--segment-mb", "1",
                           timeout=540)
    assert report["benchmark"] == "compact"
    compaction = report["compaction"]
    assert compaction["ok"], compaction["errors"]
    assert compaction["bytes_after"] < compaction["bytes_before"]
    assert compaction["records_dropped"] > 0 and compaction["driver_peak_rss_mib"] > 0
    assert report["boto3_io"]["bytes_got"] == report["input_bytes"]
    assert report["daemon_beside"]["losses"] == 0 and report["daemon_beside"]["extra"] == 0
    assert report["ratio_vs_boto3_io"] is not None


def _partitions_reports(*args: str) -> list[dict[str, Any]]:
    """Every JSON object `partitions.py *args` printed: a partial report after each count,
    then the whole one."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "partitions.py"), *args],
        capture_output=True, text=True, env=env, timeout=280, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    decoder, reports, pos = json.JSONDecoder(), [], 0
    while proc.stdout[pos:].strip():
        pos += len(proc.stdout[pos:]) - len(proc.stdout[pos:].lstrip())
        report, pos = decoder.raw_decode(proc.stdout, pos)
        reports.append(report)
    assert reports[0]["partial"] is True and reports[-1]["benchmark"] == "partitions"
    return reports


@pytest.mark.timeout(300)
def test_partitions_benchmark_counts_the_daemon_s_requests() -> None:
    """The partitions benchmark prints a partial report after each count, then the whole one;
    the daemon's request counter must see its start (a lease and a head per partition at
    least), or its idle figure would read 0 whatever the daemon did."""
    reports = _partitions_reports("--counts", "12", "--idle-s", "3",
                                  "--housekeeping-interval-s", "1", "--grace-period-s", "2")
    (run,) = reports[-1]["runs"]
    # each segment and its index bundle
    assert run["store"] == "moto" and run["boto3"]["puts"] == 2 * 2 * 12
    once, daemon = run["archive_once"], run["daemon"]
    assert once["ok"] and once["uploaded_segments"] == 2 * 12
    # the second baseline makes every PUT the sidecar made: its objects, heads, copies,
    # leases, node and topic records
    puts = sum(n for kind, n in once["requests_by_kind"].items() if kind.startswith("put "))
    assert run["boto3_every_put"]["puts"] == puts > 2 * 2 * 12
    assert run["throughput_vs_boto3_every_put"] > 0
    # the third makes every request it made, reads and listings too, as many of each
    every = run["boto3_every_request"]
    assert every["requests"] == once["store_requests"]
    for operation in ("put", "list"):
        assert every["by_operation"][operation] == sum(
            n for kind, n in once["requests_by_kind"].items() if kind.startswith(operation + " "))
    assert run["throughput_vs_boto3_every_request"] > 0
    assert daemon["leases_held"] == 12 and daemon["idle_housekeeping_passes"] == 3
    # a grace period and a half idle, after the first full passes: the census spares them
    assert daemon["idle_grace_periods"] == 1.5 and daemon["idle_census_spared_passes"] > 0
    assert daemon["start_store_requests"] >= 2 * 12
    assert daemon["idle_store_requests"] >= 0 and daemon["stop_s"] is not None
    # the steady state: the logs grew under the running daemon, which uploaded it all
    steady = daemon["steady"]
    assert steady["new_segments"] >= 2 * 12
    assert steady["uploaded_segments"] == steady["new_segments"]
    assert steady["requests_per_segment"] >= 2  # the segment and its bundle at least
    new = steady["new_segments"]
    assert run["busy_stop"]["segments_to_upload"] == 2 * 12 + new


def test_partitions_replay_deletes_as_the_store_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The every-request baseline sends a delete as S3Store does: each key once, at most a
    thousand a request, no request for none (an empty or oversized batch would be refused)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from partitions import delete_batches

    assert delete_batches(()) == []
    batches = delete_batches(tuple(f"k{i % 1500}" for i in range(3000)))
    assert [len(b) for b in batches] == [1000, 500]
    assert sorted(k for b in batches for k in b) == sorted(f"k{i}" for i in range(1500))


@pytest.mark.timeout(300)
def test_partitions_benchmark_runs_on_file_buckets() -> None:
    """`--store file`: every phase on file:// buckets, the baseline through the same store
    class; the daemon keeps no request count for a file store, so its figures are null, never
    a 0 that would read as "no request"."""
    (run,) = _partitions_reports("--store", "file", "--counts", "12", "--idle-s", "2")[-1]["runs"]
    once, daemon = run["archive_once"], run["daemon"]
    assert run["store"] == "file" and "boto3" not in run
    assert once["ok"] and once["uploaded_segments"] == 2 * 12
    assert run["file_store_puts"]["puts"] == 2 * 2 * 12
    assert run["throughput_vs_file_store_puts"] > 0
    assert run["file_store_puts_every_put"]["puts"] > 2 * 2 * 12
    assert run["file_store_puts_every_request"]["requests"] == once["store_requests"]
    assert daemon["leases_held"] == 12 and daemon["stop_s"] is not None
    assert daemon["start_store_requests"] is None and daemon["idle_store_requests"] is None
    steady = daemon["steady"]
    assert steady["uploaded_segments"] == steady["new_segments"] >= 2 * 12
    assert steady["requests_per_segment"] is None
    total = 2 * 12 + steady["new_segments"]
    assert run["busy_stop"]["segments_to_upload"] == total
    # counted through the store's listing: its ETag side files are not segments
    assert 0 < run["busy_stop"]["segments_uploaded_before_exit"] <= total


def test_lease_start_benchmark_takes_every_lease_with_each_pool() -> None:
    report = run_benchmark("lease_start.py", "--partitions", "40", "--latency-ms", "2",
                           "--pools", "5", "20")
    assert report["benchmark"] == "lease_start" and report["ok"]
    assert [(r["pool"], r["in_flight"]) for r in report["runs"]] == [(5, 4), (20, 16)]
    for run in report["runs"]:
        assert run["leases_held"] == 40
        assert run["requests"] >= 2 * 40  # a head read and a lease create per partition
