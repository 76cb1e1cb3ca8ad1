"""Building the Spark session the jobs run in.

The driver reads and commits manifests; executors move segment bytes with the object store built
from picklable `StoreSettings`. A session starts in about 4 s, so a process (and a test run)
builds one and shares it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tiered.errors import TieredError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the master when none is given: every core of this machine
DEFAULT_MASTER = "local[*]"
#: the Python worker daemon: PySpark's, with the jobs' modules imported before it forks a
#: worker (spark_jobs/worker_daemon.py)
DAEMON_MODULE = "spark_jobs.worker_daemon"
#: the JVM options of a local session this process starts (`spark.driver.defaultJavaOptions`,
#: so a `spark.driver.extraJavaOptions` of the user's comes after them and wins): the JIT's
#: first tier only. The JVM of these jobs moves bytes between Python workers and runs
#: Spark's scheduler; the second tier's compiler spent 1.2 s of CPU in a 4 s compaction
#: recompiling that code, on cores the workers need (docs/performance.md)
LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


class SparkUnavailable(TieredError):
    """PySpark (or Java) is missing: the message says how to install the `spark` extra."""

    exit_code = 2


def require_pyspark() -> None:
    """Fail with an install hint, not an ImportError, when the `spark` extra is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise SparkUnavailable(
            "this command runs on Apache Spark, and PySpark is not installed; "
            "install the extra with: pip install 'tiered[spark]' (Java 17 must be on PATH)"
        ) from exc


def prepare_environment() -> None:
    """Point Spark's Python workers at this interpreter (otherwise they run whatever `python3`
    is first on PATH, without our packages) and keep it on loopback unless told otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def get_session(
    master: str | None = None, *, app_name: str = "tiered", ui: bool = False,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The process's Spark session, created on first use.

    `master` None keeps a session that `spark-submit` already configured (its `--master`
    wins) and otherwise uses `local[*]`. The UI is off by default: jobs report progress on
    the terminal, and tests must not bind port 4040. `conf`: more settings, which win over
    these (a local session's JVM options among them, `LOCAL_JVM_OPTIONS`).
    """
    require_pyspark()
    prepare_environment()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    builder = SparkSession.builder.appName(app_name)
    submitted = "spark.master" in _submitted_conf()
    if master is not None or not submitted:
        builder = builder.master(master or DEFAULT_MASTER)
    if not submitted and (master or DEFAULT_MASTER).startswith("local"):
        # this process launches the JVM, and it is the whole cluster
        builder = builder.config("spark.driver.defaultJavaOptions", LOCAL_JVM_OPTIONS)
    builder = (
        builder.config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        # segment bytes travel as Python objects between tasks: keep batches of them small
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .config("spark.sql.shuffle.partitions", "8")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # Java missing or the JVM failing to start is a setup problem
        raise SparkUnavailable(f"could not start Spark ({exc}); is Java 17 installed?") from exc
    session.sparkContext.setLogLevel("WARN")
    return session


def _submitted_conf() -> dict[str, str]:
    """Settings spark-submit passed to this driver (empty when run as plain Python)."""
    raw = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    conf: dict[str, str] = {}
    if "--master" in raw.split():
        conf["spark.master"] = "from spark-submit"
    if os.environ.get("SPARK_ENV_LOADED") or os.environ.get("SPARK_SUBMIT_OPTS"):
        conf.setdefault("spark.master", "from spark-submit")
    return conf
