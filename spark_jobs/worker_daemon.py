"""The Python worker daemon of tiered's Spark jobs (`spark.python.daemon.module`): PySpark's own
daemon, after importing what every task of the jobs needs.

PySpark forks a Python worker per concurrent task from one daemon process per executor, and a
fresh worker imports the job's modules when it unpickles its first task: boto3 and botocore,
numpy, tiered's packages. That is one to two seconds a worker (`crc32c` alone reads its
version from package metadata, which scans every zip on `sys.path`, PySpark's included), and a
job forks a new worker whenever every worker is busy. Imported here, once, they are in every
worker the daemon forks. Nothing here starts a thread or opens a connection before the fork:
stores are still built in each worker (`spark_jobs.compact._executor_store`).
"""

from __future__ import annotations

import os

# numpy's BLAS would start a pool of threads on import; the jobs do no linear algebra
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import boto3  # noqa: E402,F401
import botocore.session  # noqa: E402,F401
from pyspark import daemon  # noqa: E402

import spark_jobs.compact  # noqa: E402,F401
import spark_jobs.merge  # noqa: E402,F401
import spark_jobs.recover  # noqa: E402,F401
import spark_jobs.scrub  # noqa: E402,F401
import tiered.store.s3  # noqa: E402,F401

if __name__ == "__main__":
    daemon.manager()
