"""The shared Spark session runs workers on this interpreter (so they import our packages)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from spark_jobs.session import SparkUnavailable, require_pyspark


def test_workers_run_this_interpreter(spark: Any) -> None:
    rdd = spark.sparkContext.parallelize(range(10), 2)
    assert rdd.map(lambda x: x * 2).sum() == 90
    executables = set(rdd.map(lambda _: __import__("sys").executable).collect())
    assert executables == {sys.executable}
    # executors can import the project
    assert rdd.map(lambda _: __import__("tiered").__name__).first() == "tiered"


def test_missing_pyspark_gives_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # makes `import pyspark` fail
    with pytest.raises(SparkUnavailable, match=r"pip install 'tiered\[spark\]'"):
        require_pyspark()
