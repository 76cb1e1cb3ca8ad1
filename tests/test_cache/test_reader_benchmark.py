"""`benchmarks/remote_read.py` runs end to end at a tiny size and prints the JSON it promises.

It runs as a child process against its own moto server, as a person would run it; the
benchmark itself exits non-zero if any byte read back differs from the local file. Only the
report's shape and byte counts are checked, never how fast anything was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: runs the read benchmarks: the slow tier
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_remote_read_benchmark_reports_every_contender() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "remote_read.py"), "--size-mb", "6",
         "--chunk-mb", "1", "--fetch-kb", "256", "--trials", "2", "--whole-trials", "1",
         "--sequential-mb", "6", "--prefetch", "2"],
        capture_output=True, text=True, env=env, timeout=280, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "remote_read"
    size, chunk = report["segment_bytes"], report["chunk_bytes"]
    assert size >= 6 * 1024 * 1024 and chunk == 1024 * 1024
    cold = report["cold"]
    assert set(cold) == {"tiered_chunks", "fsspec_blockcache", "whole_segment"}
    # a 256 KiB fetch needs at most two 1 MiB chunks; the whole-segment contender moves it all
    assert 0 < cold["tiered_chunks"]["segment_bytes_per_fetch"] <= 2 * chunk + 64 * 1024
    assert cold["whole_segment"]["segment_bytes_per_fetch"] == size
    for result in cold.values():
        assert all(run["returned_bytes"] >= 256 * 1024 - 70 * 1024 for run in result["runs"])
    assert set(report["warm"]) == {"tiered_cache", "tiered_local_log", "local_file_pread"}
    seq = report["sequential"]
    assert seq["no_readahead"]["bytes"] == seq["readahead"]["bytes"] == size
    assert seq["adaptive_readahead"]["bytes"] == size
    # every chunk downloaded once by a sequential consumer, with or without read-ahead
    for name in ("no_readahead", "readahead", "adaptive_readahead"):
        assert seq[name]["segment_bytes_downloaded"] == size, name
    assert seq["readahead"]["prefetches"] > 0
    assert seq["adaptive_readahead"]["prefetches"] > 0  # the default reads ahead
    assert seq["adaptive_readahead"]["prefetch_chunks"] is None
    assert set(report["ratios"]) >= {"whole_segment_bytes_over_chunks", "readahead_speedup",
                                     "adaptive_readahead_speedup"}


@pytest.mark.timeout(300)
def test_remote_read_http_benchmark_reports_every_figure() -> None:
    """`remote_read.py http`: a real `tiered run` serving the records endpoint, tiny sizes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "remote_read.py"), "http", "--segment-mb",
         "3", "--segments", "6", "--chunk-mb", "1", "--prefetch", "2", "--big-active-mb", "4",
         "--trials", "2"],
        capture_output=True, text=True, env=env, timeout=280, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "remote_read http"
    for name in ("cold", "warm", "active_segment", "sequential", "sequential_catch_up",
                 "concurrent"):
        assert report[name]["ratio"] is not None and report[name]["ratio"] > 0, name
    assert len(report["sequential"]["runs"]) == 3
    for staging in ("memory", "file", "checked"):  # the naive proxy's bytes were compared
        assert report["sequential"][f"naive_proxy_{staging}_ratio"] > 0, staging
    assert report["sequential_catch_up"]["segments"] == 3
    assert report["concurrent"]["consumers"] == 8
    assert report["concurrent"]["daemon_cpu_s_per_mb"] > 0  # where the time goes
    assert report["concurrent"]["store_gets"] > 0
    assert report["sequential"]["protocol_ceiling_mb_per_s"] > 0  # its bytes were compared
    assert report["active_segment"]["big_active_bytes"] == 4 * 1024 * 1024


#: the packages a daemon runs, copied into a second tree for the A/B test
PACKAGES = ("tiered", "archiver", "cache", "manifests", "spark_jobs")


@pytest.mark.timeout(300)
def test_remote_read_ab_benchmark_compares_two_trees_run_for_run(tmp_path: Path) -> None:
    """`remote_read.py ab`: two daemons, each running its own tree's code, alternate
    single-segment runs; every byte they served was compared with the log. Run from this
    checkout's root, as the tool is documented, daemon B must still run the copy given as
    `--b` (whose marked `tiered/__init__.py` says so), not the checkout it was started in."""
    tree_b = tmp_path / "tree-b"
    for package in PACKAGES:
        shutil.copytree(REPO / package, tree_b / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    marks = tmp_path / "imported-from"
    with (tree_b / "tiered" / "__init__.py").open("a") as init:
        init.write("\nimport os as _os\n"
                   "if _os.environ.get('AB_MARKS'):\n"
                   "    with open(_os.environ['AB_MARKS'], 'a') as _marks:\n"
                   "        _marks.write(__file__ + '\\n')\n")
    env = dict(os.environ, AB_MARKS=str(marks))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "remote_read.py"), "ab", "--segment-mb",
         "3", "--chunk-mb", "1", "--prefetch", "2", "--pairs", "2",
         "--a", str(REPO), "--b", str(tree_b)],
        capture_output=True, text=True, env=env, timeout=280, check=False, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "remote_read ab"
    assert report["trees"] == {"a": str(REPO), "b": str(tree_b)}
    assert marks.read_text().splitlines() == [str(tree_b / "tiered" / "__init__.py")]
    for side in ("a", "b"):
        assert len(report[side]["runs"]) == 2
        assert all(r["tiered_mb_per_s"] > 0 and r["ratio"] > 0 for r in report[side]["runs"])
    assert 0 <= report["b_minus_a"]["b_won"] <= 2


def test_remote_read_ab_benchmark_refuses_a_directory_that_is_not_a_tree(
        tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "remote_read.py"), "ab", "--b",
         str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "is not a tiered source tree" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [["http", "--segment-mb", "0"], ["ab", "--pairs", "0"],
                                  ["ab", "--chunk-mb", "-1"], ["http", "--prefetch", "x"]])
def test_remote_read_http_and_ab_refuse_sizes_out_of_range(args: list[str]) -> None:
    """A size they cannot run with is a usage error, not a traceback from the set-up."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "remote_read.py"), *args],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert args[1] in proc.stderr
