"""The Python worker daemon of tiered's Spark jobs (`spark.python.daemon.module`): PySpark's own
daemon, after importing what every task of the jobs needs.

PySpark forks a Python worker per concurrent task from one daemon process per executor, and a
fresh worker imports the job's modules when it unpickles its first task: boto3 and botocore,
numpy, tiered's packages. That is one to two seconds a worker (`crc32c` alone reads its
version from package metadata, which scans every zip on `sys.path`, PySpark's included), and a
job forks a new worker whenever every worker is busy. Imported here, once, they are in every
worker the daemon forks, and so are S3's service models, parsed here once
(`tiered.store.s3.warm_client_models`). Nothing here starts a thread or opens a connection
before the fork: stores are still built in each worker (`spark_jobs.compact._executor_store`).

A worker also calls `importlib.invalidate_caches()` before every task, and since Python 3.10
that makes each zip importer read its archive's whole directory again: PySpark's own
`pyspark.zip`, py4j's and Spark 4's spark-core jar, on `sys.path` from the launcher, about
80 ms a task, a second or more of a job's CPU. Those archives are part of the Spark
installation and do not change while the daemon lives, so their importers are replaced here
by ones that keep what they read (`_keep_zip_directories`); an archive a job adds
(`--py-files`) is not one of them.
"""

from __future__ import annotations

import os
import sys
import zipimport

# numpy's BLAS would start a pool of threads on import; the jobs do no linear algebra
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import boto3  # noqa: E402,F401
import botocore.session  # noqa: E402,F401

# with it the worker's own module, which PySpark's daemon imports after each fork (from
# pyspark.zip, compiled again every time: a zip holds no bytecode cache); it starts no thread
import pyspark.worker  # noqa: E402,F401
from pyspark import daemon  # noqa: E402

import spark_jobs.compact  # noqa: E402,F401
import spark_jobs.merge  # noqa: E402,F401
import spark_jobs.recover  # noqa: E402,F401
import spark_jobs.scrub  # noqa: E402,F401
import tiered.store.s3  # noqa: E402,F401


class _KeptZipImporter(zipimport.zipimporter):
    """A zip importer that does not read its archive again on `invalidate_caches`."""

    def invalidate_caches(self) -> None:
        pass


def _spark_archive(archive: str) -> bool:
    """Whether `archive` is one of the Spark installation's own (under `SPARK_HOME`: PySpark's
    and py4j's zips, and the spark-core jar Spark 4 puts on the path), which no job replaces;
    a `--py-files` archive of a job is not."""
    home = os.environ.get("SPARK_HOME")
    if home:
        root = os.path.join(os.path.realpath(home), "")
        return os.path.realpath(archive).startswith(root)
    name = os.path.basename(archive)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith(".zip"))


def _keep_zip_directories() -> int:
    """Swap the zip importers of Spark's own archives imported from so far for
    `_KeptZipImporter`s (each reads its directory once, here); returns how many."""
    swapped = 0
    for path, finder in list(sys.path_importer_cache.items()):
        if type(finder) is zipimport.zipimporter and _spark_archive(finder.archive):
            try:
                sys.path_importer_cache[path] = _KeptZipImporter(path)
            except zipimport.ZipImportError:
                continue
            swapped += 1
    return swapped


if __name__ == "__main__":
    _keep_zip_directories()
    tiered.store.s3.warm_client_models()  # each task's store then builds its client in ms
    daemon.manager()
