"""The Spark jobs' tests: all of them need PySpark and Java and start jobs, so the whole folder
is marked `spark` and `slow` here (`pytest -m "not slow"` is the fast tier), and the job
context fixture they share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.spark import make_context

from spark_jobs.job_context import JobContext
from tiered.store.base import ObjectStore

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def ctx(file_store: ObjectStore, spark: Any) -> Iterator[JobContext]:
    context = make_context(file_store, cloud_storage_segment_size_target=8192,
                           cloud_storage_segment_size_min=4096)
    yield context
