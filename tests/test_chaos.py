"""The multi-writer chaos run in CI (tests/chaos.py): two daemons, kill -9, `archive --once`,
`merge` and S3 faults on one bucket for about a minute; nothing written may be lost and no
manifest may name a missing object (design invariants 1, 6, 7, 8).

TIERED_CHAOS_SEED replays a run; TIERED_CHAOS_SECONDS lengthens it (benchmarks/soak.py runs it
for minutes and prints the figures)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from chaos import run_chaos

SEED = int(os.environ.get("TIERED_CHAOS_SEED", "20261124"))
SECONDS = float(os.environ.get("TIERED_CHAOS_SECONDS", "45"))


@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_daemons_archive_once_and_merge_under_faults_lose_nothing(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str, spark: Any
) -> None:
    print(f"chaos seed {SEED} (TIERED_CHAOS_SEED={SEED} replays it)")
    figures = run_chaos(tmp_path, seed=SEED, seconds=SECONDS, endpoint=moto_endpoint,
                        bucket=s3_bucket, progress=print)
    report = json.dumps(figures.to_json(), indent=1)
    print(report)
    where = f"seed {SEED}: {report}"
    assert figures.lost == 0 and figures.dangling == 0, where
    assert figures.records_written > 500 and figures.records_verified == figures.records_written
    assert figures.kills >= 8 and figures.merges >= 1 and figures.archive_once_runs >= 2, where
    assert sum(figures.faults_by_kind.values()) > 50, where
    assert figures.unexpected_exits == 0, where
    assert figures.scrub_ok, where
    assert not figures.problems, where
