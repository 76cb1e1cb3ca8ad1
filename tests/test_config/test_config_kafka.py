"""The [kafka] section: addresses (loopback by default, IPv6 in brackets, a wildcard needs an
advertised address), TLS files in pairs, limits with units, and every problem named by its key;
`[log] dirs = []` declares a history server, which only `tiered run` accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiered.app.daemon import check_log_dirs
from tiered.config import parse_config
from tiered.config.kafka import KafkaConfig, parse_address
from tiered.config.units import UnitError
from tiered.errors import ConfigError


def _config(tmp_path: Path, kafka: Any, **log: Any) -> Any:
    data: dict[str, Any] = {"storage": {"url": (tmp_path / "b").as_uri()}, "kafka": kafka}
    if log:
        data["log"] = log
    return parse_config(data, source="t.toml", base_dir=tmp_path)


def test_defaults_listen_on_loopback(tmp_path: Path) -> None:
    k = _config(tmp_path, {"listen": "9092"}).kafka
    assert k == KafkaConfig("127.0.0.1", 9092)
    assert (k.max_connections, k.max_request_bytes, k.idle_timeout_ms) == (1000, 8 << 20, 600_000)
    assert not k.tls
    assert _config(tmp_path, {"listen": ":0"}).kafka.listen_port == 0  # any free port


def test_no_section_means_off(tmp_path: Path) -> None:
    config = parse_config({"storage": {"url": (tmp_path / "b").as_uri()}}, source="t")
    assert config.kafka is None
    assert "kafka" not in config.effective()


def test_full_section(tmp_path: Path) -> None:
    k = _config(tmp_path, {
        "listen": "[::1]:9093", "advertised": "broker1.example:19093", "tls_cert": "c.pem",
        "tls_key": "/abs/k.pem", "max_connections": 5, "max_request_bytes": "1 MiB",
        "idle_timeout_ms": "30s", "group_initial_rebalance_delay_ms": 0,
        "group_min_session_timeout_ms": "1s", "group_max_session_timeout_ms": "1m"}).kafka
    assert (k.listen_host, k.listen_port) == ("::1", 9093)
    assert (k.advertised_host, k.advertised_port) == ("broker1.example", 19093)
    assert k.tls_cert == tmp_path / "c.pem" and k.tls_key == Path("/abs/k.pem")
    assert (k.max_connections, k.max_request_bytes, k.idle_timeout_ms) == (5, 1 << 20, 30_000)
    assert (k.group_initial_rebalance_delay_ms, k.group_min_session_timeout_ms,
            k.group_max_session_timeout_ms) == (0, 1000, 60_000)
    effective = _config(tmp_path, {"listen": "[::1]:9093"}).effective()["kafka"]
    assert effective["listen"] == "[::1]:9093" and effective["advertised"] is None


@pytest.mark.parametrize(("kafka", "key", "problem"), [
    ({}, "listen", "required to serve the Kafka protocol"),
    ({"listen": "host:99999"}, "listen", "port must be an integer 0..65535"),
    ({"listen": 9092}, "listen", 'expected "HOST:PORT", got integer 9092'),
    ({"listen": "::1:9092"}, "listen", "IPv6 address in brackets"),
    ({"listen": "0.0.0.0:9092"}, "advertised", "required when listen is 0.0.0.0"),
    ({"listen": "9092", "advertised": "9092"}, "advertised", "with a host"),
    ({"listen": "9092", "advertised": "h:0"}, "advertised", "port must be an integer 1..65535"),
    ({"listen": "9092", "tls_cert": "c.pem"}, "tls_key", "set tls_cert and tls_key together"),
    ({"listen": "9092", "tls_key": 3}, "tls_key", "expected a file path"),
    ({"listen": "9092", "max_connections": "many"}, "max_connections", "expected an integer"),
    ({"listen": "9092", "max_request_bytes": "12 bananas"}, "max_request_bytes", "bananas"),
    ({"listen": "9092", "max_request_bytes": 10}, "max_request_bytes", "at least 1024"),
    ({"listen": "9092", "idle_timeout_ms": "1h", "lisen": "x"}, "lisen",
     "did you mean listen?"),
    ({"listen": "9092", "group_min_session_timeout_ms": "2m",
      "group_max_session_timeout_ms": "1m"}, "group_min_session_timeout_ms", "must not exceed"),
    ("9092", "", "must be a table"),
])
def test_problems_name_the_key(tmp_path: Path, kafka: Any, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, kafka)
    where = f"[kafka] {key}".rstrip()
    assert any(where in p and problem in p for p in err.value.problems), err.value.problems


def test_parse_address_forms() -> None:
    assert parse_address("h:1", default_host=None, min_port=1) == ("h", 1)
    assert parse_address("[fe80::1]:2", default_host=None, min_port=1) == ("fe80::1", 2)
    assert parse_address("7", default_host="127.0.0.1", min_port=0) == ("127.0.0.1", 7)
    with pytest.raises(UnitError, match="not an IPv6 address"):
        parse_address("[nope]:1", default_host=None, min_port=1)


def test_empty_dirs_declare_a_history_server_for_run_only(tmp_path: Path) -> None:
    config = _config(tmp_path, {"listen": "9092"}, dirs=[])
    assert config.history_server and config.log_dirs == ()
    check_log_dirs(config, "run")  # accepted
    with pytest.raises(ConfigError, match=r"\[log\] dirs is empty: tiered archive"):
        check_log_dirs(config, "archive")
    unset = parse_config({"storage": {"url": (tmp_path / "b").as_uri()}}, source="t")
    assert not unset.history_server
    with pytest.raises(ConfigError, match=r"\[log\] dirs is not set.*dirs = \[\]"):
        check_log_dirs(unset, "run")


def test_group_offset_limits_default_to_kafkas(tmp_path: Path) -> None:
    k = _config(tmp_path, {"listen": "9092"}).kafka
    assert (k.offset_metadata_max_bytes, k.offsets_retention_minutes,
            k.offsets_retention_check_interval_ms) == (4096, 10080, 600_000)
    assert (k.max_groups, k.max_offsets_per_group) == (10_000, 1000)
    effective = _config(tmp_path, {"listen": "9092"}).effective()["kafka"]
    assert effective["offsets_retention_minutes"] == 10080 and effective["max_groups"] == 10_000


def test_kafkas_property_names_are_aliases(tmp_path: Path) -> None:
    k = _config(tmp_path, {"listen": "9092", "offset.metadata.max.bytes": 100,
                           "offsets.retention.minutes": 60,
                           "offsets.retention.check.interval.ms": "30s",
                           "max_groups": 5, "max_offsets_per_group": 7}).kafka
    assert (k.offset_metadata_max_bytes, k.offsets_retention_minutes,
            k.offsets_retention_check_interval_ms, k.max_groups,
            k.max_offsets_per_group) == (100, 60, 30_000, 5, 7)


@pytest.mark.parametrize(("kafka", "key", "problem"), [
    ({"offsets_retention_minutes": 0}, "offsets_retention_minutes", "at least 1"),
    ({"offset_metadata_max_bytes": 2 << 20}, "offset_metadata_max_bytes", "at most 1048576"),
    ({"max_groups": "lots"}, "max_groups", "expected an integer"),
    ({"offsets_retention_check_interval_ms": "1ms"}, "offsets_retention_check_interval_ms",
     "at least 1000"),
    ({"offsets_retention_minutes": 5, "offsets.retention.minutes": 6},
     "offsets.retention.minutes", "another name for offsets_retention_minutes"),
])
def test_group_offset_limit_problems_name_the_key(tmp_path: Path, kafka: Any, key: str,
                                                  problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, {"listen": "9092", **kafka})
    assert any(f"[kafka] {key}" in p and problem in p for p in err.value.problems), \
        err.value.problems


def test_fetch_budget_keys(tmp_path: Path) -> None:
    """`fetch_max_bytes` (Kafka's fetch.max.bytes, 55 MiB) and `max_partitions_per_fetch`
    (1000) with their defaults, units, and problems named by key."""
    k = _config(tmp_path, {"listen": "9092"}).kafka
    assert (k.fetch_max_bytes, k.max_partitions_per_fetch) == (55 << 20, 1000)
    k = _config(tmp_path, {"listen": "9092", "fetch_max_bytes": "4 MiB",
                           "max_partitions_per_fetch": 50}).kafka
    assert (k.fetch_max_bytes, k.max_partitions_per_fetch) == (4 << 20, 50)
    for bad, key, problem in [
        ({"fetch_max_bytes": 0}, "fetch_max_bytes", "at least 1"),
        ({"fetch_max_bytes": "lots"}, "fetch_max_bytes", "lots"),
        ({"max_partitions_per_fetch": 0}, "max_partitions_per_fetch", "at least 1"),
        ({"max_partitions_per_fetch": "all"}, "max_partitions_per_fetch", "expected an integer"),
    ]:
        with pytest.raises(ConfigError) as err:
            _config(tmp_path, {"listen": "9092", **bad})
        assert any(f"[kafka] {key}" in p and problem in p for p in err.value.problems), (
            err.value.problems)
