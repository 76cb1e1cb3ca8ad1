"""Fixtures of the security tests that run daemons: the Kafka-endpoint history (archived to
moto's S3 over HTTP, partly deleted locally), certificates generated for the run, and kcat."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.certs import Authority
from support.kafka_endpoint import History, build_history, ensure_kcat


@pytest.fixture(scope="module")
def history(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> History:
    return build_history(moto_endpoint, tmp_path_factory.mktemp("security"))


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(Path(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="session")
def kcat() -> str:
    return ensure_kcat()
