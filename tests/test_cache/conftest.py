"""Fixtures of the read path's tests: a bucket holding an archived partition and no local log,
shared read-only (`remote_only`) or copied for one test (`remote_copy`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.remote import Fixture, private_remote, shared_remote


@pytest.fixture
def remote_only(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return shared_remote(tmp_path, tmp_path_factory)


@pytest.fixture
def remote_copy(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return private_remote(tmp_path, tmp_path_factory)
