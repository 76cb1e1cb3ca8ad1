"""One way to build a test configuration: a temporary log dir, cache and bucket, with the
cluster and topic overrides a test needs. The helpers of each area add only their defaults."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiered.config import Config, parse_config


def config_over(
    tmp_path: Path,
    *,
    url: str | None = None,
    log_dir: Path | None = None,
    mode: str = "enforce",
    cluster: Mapping[str, Any] | None = None,
    topics: Mapping[str, Mapping[str, Any]] | None = None,
    storage: Mapping[str, Any] | None = None,
) -> Config:
    """A config whose bucket is `url` (default a `file://` directory in `tmp_path`), whose log
    is `log_dir` (created; default `tmp_path/logs`) in `mode`, and whose cache is in
    `tmp_path`; `storage` replaces the whole [storage] section when given."""
    log = log_dir if log_dir is not None else tmp_path / "logs"
    log.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "storage": dict(storage) if storage is not None
        else {"url": url or (tmp_path / "bucket").as_uri()},
        "log": {"dirs": [str(log)], "retention": mode},
        "cache": {"dir": str(tmp_path / "cache")},
        "cluster": {"storage_min_free_bytes": 0, **(cluster or {})},
        "topics": {name: dict(t) for name, t in (topics or {}).items()},
    }
    return parse_config(data, source="test", base_dir=tmp_path)


def s3_section(endpoint: str, bucket: str, prefix: str = "") -> str:
    """A TOML `[storage]` section for the test S3 server (moto's keys), for configs a test
    writes as files for `tiered` processes."""
    url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    return f"""[storage]
url = "{url}"
endpoint_url = "{endpoint}"
region = "us-east-1"
access_key = "testing"
secret_key = "testing"
"""
