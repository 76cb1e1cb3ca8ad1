"""Fixtures of the Kafka-endpoint tests:
Kafka logs archived by the real archiver into a bucket on moto's S3 server (real HTTP on
127.0.0.1) and partly deleted locally, so every consumer reads across the bucket-to-local
boundary, and a `tiered run` daemon serving them.

Topics (records are varied: null keys and values, headers, every codec):
* `history`, partitions 0 and 1: archived, then local segments below about the middle
  deleted; partition 0 also has batches appended after archiving, in its active segment only;
* `txn`: one partition of interleaved transactions (committed and aborted, control batches,
  `.txnindex` files), archived, then its first half deleted locally."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.daemons import running
from support.kafka_endpoint import History, build_history, ensure_kcat

from tiered.app.daemon import Daemon


@pytest.fixture(scope="module")
def history(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> History:
    return build_history(moto_endpoint, tmp_path_factory.mktemp("kafka-api"))


@pytest.fixture(scope="module")
def daemon(history: History) -> Iterator[Daemon]:
    with running(history.config()) as d:
        yield d


@pytest.fixture(scope="session")
def kcat() -> str:
    return ensure_kcat()
