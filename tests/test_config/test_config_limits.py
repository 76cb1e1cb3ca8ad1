"""The connection limits and deadlines of both servers: `[kafka] request_timeout_ms` and
`max_connections_per_ip`, and the `[http]` section; defaults as documented, durations with
units, and every bad value an error naming its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiered.config import parse_config
from tiered.config.http import HttpConfig
from tiered.errors import ConfigError


def _config(tmp_path: Path, **sections: Any) -> Any:
    return parse_config({"storage": {"url": (tmp_path / "b").as_uri()}, **sections},
                        source="t.toml", base_dir=tmp_path)


def test_defaults(tmp_path: Path) -> None:
    config = _config(tmp_path, kafka={"listen": "9092"})
    assert (config.kafka.request_timeout_ms, config.kafka.max_connections_per_ip) == (
        30_000, 2**31 - 1)  # Kafka's max.connections.per.ip: max_connections alone
    assert config.http == HttpConfig(1000, 2**31 - 1, 30_000, 60_000)
    effective = config.effective()
    assert effective["kafka"]["request_timeout_ms"] == 30_000
    assert effective["http"] == {"max_connections": 1000, "max_connections_per_ip": 2**31 - 1,
                                 "request_timeout_ms": 30_000, "idle_timeout_ms": 60_000,
                                 "auth": "none", "tls_cert": None, "tls_key": None,
                                 "tls_client_ca": None}


def test_set_with_units(tmp_path: Path) -> None:
    config = _config(tmp_path, kafka={"listen": "9092", "request_timeout_ms": "5s",
                                      "max_connections_per_ip": 10},
                     http={"max_connections": 50, "max_connections_per_ip": 5,
                           "request_timeout_ms": "10s", "idle_timeout_ms": "2m"})
    assert (config.kafka.request_timeout_ms, config.kafka.max_connections_per_ip) == (5000, 10)
    assert config.http == HttpConfig(50, 5, 10_000, 120_000)


@pytest.mark.parametrize(("sections", "where", "problem"), [
    ({"kafka": {"listen": "9092", "request_timeout_ms": 500}}, "[kafka] request_timeout_ms",
     "must be at least 1000"),
    ({"kafka": {"listen": "9092", "max_connections_per_ip": 0}},
     "[kafka] max_connections_per_ip", "must be at least 1"),
    ({"kafka": {"listen": "9092", "max_connections_per_ip": "many"}},
     "[kafka] max_connections_per_ip", "expected an integer"),
    ({"http": {"request_timeout_ms": "soon"}}, "[http] request_timeout_ms", "not a duration"),
    ({"http": {"max_connections": 0}}, "[http] max_connections", "must be at least 1"),
    ({"http": {"idle_timeout_ms": 10}}, "[http] idle_timeout_ms", "must be at least 1000"),
    ({"http": {"max_conections": 5}}, "[http] max_conections", "did you mean max_connections"),
    ({"http": 5}, "[http]", "must be a table"),
])
def test_problems_name_the_key(tmp_path: Path, sections: Any, where: str,
                               problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, **sections)
    assert f"t.toml: {where}: " in str(info.value) and problem in str(info.value)
