"""The shared Spark session runs workers on this interpreter (so they import our packages)."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from spark_jobs.job_context import Progress
from spark_jobs.session import LOCAL_JVM_OPTIONS, SparkUnavailable, require_pyspark


def test_workers_run_this_interpreter(spark: Any) -> None:
    rdd = spark.sparkContext.parallelize(range(10), 2)
    assert rdd.map(lambda x: x * 2).sum() == 90
    executables = set(rdd.map(lambda _: __import__("sys").executable).collect())
    assert executables == {sys.executable}
    # executors can import the project
    assert rdd.map(lambda _: __import__("tiered").__name__).first() == "tiered"


def test_workers_are_forked_from_a_daemon_that_imported_the_jobs(spark: Any) -> None:
    """A fresh worker does not pay for importing boto3, numpy and tiered (a second or two) on
    its first task: the daemon did, once (spark_jobs/worker_daemon.py)."""

    def forked(_: int) -> tuple[str, bool, bool]:
        # the worker's parent, whether the jobs' modules came with the fork (this function,
        # pickled by value, imports none of them), and S3's models parsed with them
        import os
        import sys

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().decode().replace("\0", " ")
        s3 = sys.modules.get("tiered.store.s3")
        return (parent, "spark_jobs.compact_exec" in sys.modules,
                s3 is not None and s3._loader is not None)

    seen = spark.sparkContext.parallelize(range(4), 4).map(forked).collect()
    assert all("-m spark_jobs.worker_daemon" in parent for parent, _, _ in seen)
    assert all(loaded for _, loaded, _ in seen)
    assert all(models for _, _, models in seen)

    def daemon_threads(_: int) -> int:
        import os

        return len(os.listdir(f"/proc/{os.getppid()}/task"))

    # what the daemon imports starts no thread: forking a process with threads is unsafe
    assert spark.sparkContext.parallelize(range(2), 2).map(daemon_threads).collect() == [1, 1]


def test_a_local_sessions_jvm_compiles_at_the_jits_first_tier(spark: Any) -> None:
    """The session this process started runs its JVM with `LOCAL_JVM_OPTIONS` (the JVM only
    moves bytes and schedules; the second tier's compiler would take the workers' cores)."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert LOCAL_JVM_OPTIONS in list(runtime.getInputArguments())


def test_a_task_does_not_read_sparks_zip_archives_again(spark: Any) -> None:
    """Each task starts with `importlib.invalidate_caches()`; the importers of the archives
    the daemon imported from (pyspark.zip, py4j's) keep the directory they read, and imports
    from them still work."""

    def importers(_: int) -> list[tuple[str, str, bool]]:
        import importlib
        import os
        import sys
        import zipimport

        importlib.invalidate_caches()
        importlib.import_module("pyspark.statcounter")  # a module no job imports
        home = os.path.realpath(os.environ["SPARK_HOME"])
        return [(path, type(f).__name__, os.path.realpath(f.archive).startswith(home))
                for path, f in sys.path_importer_cache.items()
                if isinstance(f, zipimport.zipimporter)]

    seen = spark.sparkContext.parallelize(range(2), 2).flatMap(importers).collect()
    assert {name for path, name, _ in seen if path.endswith("pyspark.zip")} == {
        "_KeptZipImporter"}
    # every archive of the installation (py4j's zip, Spark 4's spark-core jar) too
    assert {name for _, name, spark_own in seen if spark_own} == {"_KeptZipImporter"}


def test_missing_pyspark_gives_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # makes `import pyspark` fail
    with pytest.raises(SparkUnavailable, match=r"pip install 'tiered\[spark\]'"):
        require_pyspark()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "log"])
def test_progress_of_a_job_on_a_terminal_and_in_a_log(spark: Any, tty: bool) -> None:
    """A terminal gets click's progress bar, a log plain lines; both end with every task."""
    stream: io.StringIO = _Terminal() if tty else io.StringIO()
    sc = spark.sparkContext
    rdd = sc.parallelize(range(8), 4)
    with Progress(sc, "counting", group=f"progress-test-{tty}", total_tasks=4,
                  bytes_done=lambda: 4096, interval_s=0.05, stream=stream):
        assert sum(rdd.map(lambda x: x * 2).collect()) == 56
    out = stream.getvalue()
    assert "counting" in out and "4 KiB" in out
    assert ("100%" in out) if tty else ("4/4 tasks" in out.splitlines()[-1])
