"""How a job cuts its tasks into Spark partitions (`spark_jobs.job_context`): pure."""

from __future__ import annotations

import pytest

from spark_jobs.job_context import balanced_slices, slices_for


def test_slices_follow_the_cores_never_more_than_the_tasks() -> None:
    assert slices_for(16, 2) == 4
    assert slices_for(16, 2, per_core=1) == 2
    assert slices_for(1, 8) == 1
    assert slices_for(0, 2) == 1


def test_a_run_of_large_items_is_shared_out_by_weight() -> None:
    """Small compacted copies first, whole segments after: cut by count, one partition would
    get every large one."""
    sizes = [1] * 8 + [16] * 8
    lists = balanced_slices(list(range(16)), 2, lambda i: sizes[i])
    assert sorted(i for part in lists for i in part) == list(range(16)), "each item once"
    loads = [sum(sizes[i] for i in part) for part in lists]
    assert loads == [68, 68]
    assert all(part == sorted(part) for part in lists), "each list in the items' order"


@pytest.mark.parametrize("n, slices", [(0, 2), (1, 4), (3, 8)])
def test_no_empty_slice(n: int, slices: int) -> None:
    lists = balanced_slices(list(range(n)), slices, lambda _i: 1)
    assert all(lists) and sum(len(part) for part in lists) == n
    assert len(lists) == min(n, slices)
