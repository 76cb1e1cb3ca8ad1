"""The configuration file: every bad input is one clear problem naming file, section and key;
properties parse by kind; topic settings follow Redpanda's precedence (tiered.config.model,
tiered.config.properties)."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest

from tiered.config import (
    Config,
    check_config,
    check_topic_name,
    default_config,
    load_config,
    parse_config,
)
from tiered.config.model import TOPIC_CONFIGS_CACHED
from tiered.config.properties import (
    CLUSTER,
    MASK,
    REGISTRY,
    TOPIC,
    Property,
    PropertyValueError,
    Secret,
    check_registry,
    lookup,
)
from tiered.errors import ConfigError
from tiered.store import parse_store_url

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
MiB = 1024 * 1024

BASE = '[storage]\nurl = "s3://bucket-a/prefix"\n'


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in tmp_path so problems name the file as `tiered.toml`, as an operator would see."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def problems_of(text: str | bytes, name: str = "tiered.toml") -> list[str]:
    path = Path(name)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(ConfigError) as info:
        load_config(name)
    assert info.value.exit_code == 2
    return info.value.problems


def load(text: str, name: str = "tiered.toml") -> Config:
    Path(name).write_text(text)
    return load_config(name)


# --- files that are not configuration at all -----------------------------------------------------


def test_binary_file_is_refused_as_not_text(in_tmp: Path) -> None:
    (problem,) = problems_of(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00binary")
    assert problem == "tiered.toml: not a TOML file: byte 0 is not UTF-8 text"


def test_text_that_is_not_toml_reports_the_line(in_tmp: Path) -> None:
    (problem,) = problems_of('[storage]\nurl = "s3://b/p"\nthis is not toml\n')
    assert problem.startswith("tiered.toml: invalid TOML: ")
    assert "line 3" in problem


def test_nul_bytes_are_invalid_toml_with_position(in_tmp: Path) -> None:
    (problem,) = problems_of("[storage]\nurl = \x00\n")
    assert "invalid TOML" in problem and "line 2" in problem


def test_missing_file_and_directory(in_tmp: Path) -> None:
    with pytest.raises(ConfigError, match=r"^nope\.toml: no such file$"):
        load_config("nope.toml")
    (in_tmp / "adir").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        load_config("adir")


def test_empty_file_needs_a_storage_url(in_tmp: Path) -> None:
    (problem,) = problems_of("")
    assert problem.startswith("tiered.toml: [storage] url: required")


# --- unknown names -------------------------------------------------------------------------------


def test_unknown_key_names_file_section_and_suggestion(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + '[cluster]\ncloud_storage_cache_chunk_sise = "16MiB"\n')
    assert problem == (
        "tiered.toml: [cluster] cloud_storage_cache_chunk_sise: unknown key "
        "(did you mean cloud_storage_cache_chunk_size?)"
    )


def test_unknown_topic_key_suggests_the_dotted_name(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + '[topics."orders"]\n"retention.msx" = 5\n')
    assert problem == (
        'tiered.toml: [topics."orders"] retention.msx: unknown key (did you mean retention.ms?)'
    )


def test_unknown_key_far_from_everything_has_no_suggestion(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + "[cluster]\nzzzz = 1\n")
    assert problem == "tiered.toml: [cluster] zzzz: unknown key"


def test_unknown_section_with_suggestion(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + "[storag]\nregion = 'x'\n")
    assert problem.startswith("tiered.toml: [storag]: unknown section (did you mean [storage]?)")


def test_unknown_key_in_fixed_sections(in_tmp: Path) -> None:
    problems = problems_of(BASE + "endpoint = 'http://x'\n[log]\ndir = ['a']\n[cache]\nsize = 5\n")
    assert problems == [
        "tiered.toml: [storage] endpoint: unknown key (did you mean endpoint_url?)",
        "tiered.toml: [log] dir: unknown key (did you mean dirs?)",
        "tiered.toml: [cache] size: unknown key; expected dir",
    ]


def test_top_level_key_points_at_its_section(in_tmp: Path) -> None:
    problems = problems_of('url = "s3://b/p"\nlog_retention_ms = 5\n')
    assert (
        "tiered.toml: url: unknown top-level key; settings belong in a section "
        "(did you mean [storage] url?)" in problems
    )
    assert any("log_retention_ms" in p and "[cluster] log_retention_ms" in p for p in problems)


def test_property_in_the_wrong_scope_is_pointed_to_the_right_one(in_tmp: Path) -> None:
    problems = problems_of(
        BASE + '[cluster]\n"retention.ms" = 5\n[topics.orders]\nlog_retention_ms = 5\n'
        "cloud_storage_cache_chunk_size = 5\n"
    )
    assert problems == [
        "tiered.toml: [cluster] retention.ms: is a topic property: set it under "
        '[topics."<topic>"], or set its cluster default log_retention_ms',
        'tiered.toml: [topics."orders"] log_retention_ms: is a cluster property; its '
        "topic-level override is retention.ms",
        'tiered.toml: [topics."orders"] cloud_storage_cache_chunk_size: is a cluster property: '
        "set it under [cluster]",
    ]


def test_cluster_property_in_storage_section(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + "cloud_storage_region = 'x'\n")
    assert problem == (
        "tiered.toml: [storage] cloud_storage_region: unknown key; cluster properties go under "
        "[cluster]"
    )


def test_unquoted_dotted_topic_name_gets_a_quoting_hint(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + '[topics.audit.events]\n"retention.ms" = 5\n')
    assert problem.startswith('tiered.toml: [topics."audit"] events.retention.ms: unknown key; ')
    assert '[topics."<topic>.events"]' in problem
    assert "quote the whole name" in problem


# --- bad values of every kind --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('cloud_storage_cache_chunk_size = "16 furlongs"', "unknown unit 'furlongs'"),
        ("cloud_storage_cache_chunk_size = 1.5", "got float 1.5"),
        ("cloud_storage_cache_chunk_size = -5", "-5 is negative"),
        ('cloud_storage_cache_chunk_size = "16M"', "ambiguous"),
        ('cloud_storage_max_connections = "twenty"', "expected an integer, got string 'twenty'"),
        ("cloud_storage_max_connections = true", "expected an integer, got boolean true"),
        ("cloud_storage_max_connections = 0", "0 is out of range: must be between 1 and 10000"),
        ('cloud_storage_initial_backoff_ms = "1 fortnight"', "unknown unit 'fortnight'"),
        ('cloud_storage_enable_remote_write = "yes"', "expected true or false, got string 'yes'"),
        ("cloud_storage_enable_remote_write = 1", "expected true or false, got integer 1"),
        ('cloud_storage_upload_ctrl_p_coeff = "x"', "expected a number, got string 'x'"),
        ("cloud_storage_upload_ctrl_p_coeff = nan", "expected a finite number"),
        ("disk_reservation_percent = 150", "150% is out of range: must be between 0% and 100%"),
        ('disk_reservation_percent = "lots%"', "'lots' is not a percentage"),
        ("cloud_storage_hydrated_chunks_per_segment_ratio = 1.5", "between 0 and 1"),
        (
            'cloud_storage_chunk_eviction_strategy = "lru"',
            "'lru' is not one of 'eager', 'capped' or 'predictive'",
        ),
        ("cloud_storage_region = 5", "expected a string, got integer 5"),
        ('cloud_storage_region = ""', "empty string; remove the key to use the default"),
        ("log_retention_ms = -2", "-2 is negative; use -1 for no limit"),
        ("cloud_storage_spillover_manifest_size = 10", "must be at least 1024 (1 KiB)"),
        ("cloud_storage_api_endpoint_port = 70000", "between 1 and 65535"),
        ("log_cleanup_policy = 5", "expected one of"),
    ],
)
def test_bad_cluster_values(in_tmp: Path, line: str, message: str) -> None:
    (problem,) = problems_of(BASE + "[cluster]\n" + line + "\n")
    key = line.split(" =")[0]
    assert problem.startswith(f"tiered.toml: [cluster] {key}: ")
    assert message in problem


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('"retention.ms" = "soon"', "is not a duration"),
        ('"retention.bytes" = -7', "use -1 for no limit"),
        ('"segment.bytes" = 0', "must be at least 1"),
        ('"redpanda.remote.write" = "on"', "expected true or false"),
        ('"cleanup.policy" = "compact,forever"', "is not one of"),
        ('"index.interval.bytes" = 4096.0', "float"),
    ],
)
def test_bad_topic_values(in_tmp: Path, line: str, message: str) -> None:
    (problem,) = problems_of(BASE + '[topics."orders"]\n' + line + "\n")
    key = line.split(" =")[0].strip('"')
    assert problem.startswith(f'tiered.toml: [topics."orders"] {key}: ')
    assert message in problem


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("gs://bucket", "unknown scheme"),
        ("bucket-only", "unknown scheme"),
        ("file://relative/path", "absolute path"),
        ("s3://Bad_Bucket/x", "bad bucket name"),
    ],
)
def test_bad_storage_url(in_tmp: Path, url: str, message: str) -> None:
    (problem,) = problems_of(f'[storage]\nurl = "{url}"\n')
    assert problem.startswith("tiered.toml: [storage] url: ")
    assert message in problem


def test_bad_fixed_section_values(in_tmp: Path) -> None:
    problems = problems_of(
        '[storage]\nurl = 5\nendpoint_url = "minio:9000"\nregion = ""\n'
        '[log]\ndirs = [1, 2]\nretention = "delete-all"\n[cache]\ndir = ["x"]\n'
    )
    assert problems == [
        "tiered.toml: [storage] url: expected a non-empty string, got integer 5",
        "tiered.toml: [storage] region: expected a non-empty string, got an empty string",
        "tiered.toml: [storage] endpoint_url: expected an http:// or https:// URL, "
        "got 'minio:9000'",
        "tiered.toml: [log] dirs: expected a list of directory paths, got array [1, 2]",
        "tiered.toml: [log] retention: expected 'enforce' or 'advise', got string 'delete-all'",
        "tiered.toml: [cache] dir: expected a non-empty string, got array ['x']",
    ]


def test_section_that_is_not_a_table(in_tmp: Path) -> None:
    problems = problems_of(BASE + 'cluster = "x"\n'.replace("cluster", "topics"))
    # `topics = "x"` inside [storage] is a storage key; at the top level it is a bad section
    assert problems == [
        "tiered.toml: [storage] topics: unknown key; expected url, "
        "endpoint_url, region, access_key, secret_key"
    ]
    problems = problems_of('topics = "x"\n' + BASE)
    assert problems == [
        "tiered.toml: [topics]: must be a table (a [topics] section), got string 'x'"
    ]


def test_every_problem_is_reported_at_once(in_tmp: Path) -> None:
    problems = problems_of(
        "[storage]\n"
        'url = "s3://"\n'
        "[cluster]\n"
        'cloud_storage_cache_chunk_sise = "16MiB"\n'
        'cloud_storage_max_connections = "many"\n'
        'cloud_storage_chunk_eviction_strategy = "lru"\n'
        '[topics."../x"]\n'
        '"retention.ms" = "soon"\n'
        "[bogus]\n"
        "a = 1\n"
    )
    assert len(problems) == 7, problems
    joined = "\n".join(problems)
    for fragment in (
        "[bogus]: unknown section",
        "[cluster] cloud_storage_cache_chunk_sise: unknown key",
        "[cluster] cloud_storage_max_connections: expected an integer",
        "[cluster] cloud_storage_chunk_eviction_strategy: 'lru' is not one of",
        "[storage] url: store URL 's3://' names no bucket",
        "[topics.\"../x\"]: topic name '../x' contains '/'",
        "[topics.\"../x\"] retention.ms: 'soon' is not a duration",
    ):
        assert fragment in joined
    assert all(p.startswith("tiered.toml: ") for p in problems)
    with pytest.raises(ConfigError) as info:
        load_config("tiered.toml")
    assert str(info.value).startswith("tiered.toml: 7 configuration problems:")


def test_cross_property_rules(in_tmp: Path) -> None:
    problems = problems_of(
        BASE + "[cluster]\n"
        "cloud_storage_upload_ctrl_min_shares = 500\ncloud_storage_upload_ctrl_max_shares = 200\n"
        'cloud_storage_segment_size_min = "2GiB"\ncloud_storage_segment_size_target = "1GiB"\n'
        "cloud_storage_cache_size_percent = 60\ndisk_reservation_percent = 40\n"
    )
    assert problems == [
        "tiered.toml: [cluster] cloud_storage_upload_ctrl_min_shares: 500 is above "
        "cloud_storage_upload_ctrl_max_shares (200)",
        "tiered.toml: [cluster] cloud_storage_segment_size_min: 2147483648 is above "
        "cloud_storage_segment_size_target (1073741824)",
        "tiered.toml: [cluster] cloud_storage_cache_size_percent: 60% for the cache plus "
        "disk_reservation_percent 40% leaves no disk for log data; lower one or set "
        "retention_local_target_capacity_percent",
    ]


def test_cross_rule_skipped_when_a_value_already_failed(in_tmp: Path) -> None:
    (problem,) = problems_of(
        BASE + '[cluster]\ncloud_storage_upload_ctrl_min_shares = "x"\n'
        "cloud_storage_upload_ctrl_max_shares = 50\n"
    )
    assert "expected an integer" in problem


# --- sizes, durations and aliases ----------------------------------------------------------------


@pytest.mark.parametrize("value", ['"16MiB"', '"16 MiB"', "16777216", '"16777216"'])
def test_sizes_as_strings_and_ints(in_tmp: Path, value: str) -> None:
    config = load(BASE + f"[cluster]\ncloud_storage_cache_chunk_size = {value}\n")
    assert config.cluster["cloud_storage_cache_chunk_size"] == 16 * MiB


def test_durations_and_percentages(in_tmp: Path) -> None:
    config = load(
        BASE + '[cluster]\nlog_retention_ms = "3d"\ncloud_storage_initial_backoff_ms = "250ms"\n'
        'disk_reservation_percent = "15%"\ncloud_storage_cache_size_percent = 10\n'
    )
    assert config.cluster["log_retention_ms"] == 3 * 86_400_000
    assert config.cluster["cloud_storage_initial_backoff_ms"] == 250
    assert config.cluster["disk_reservation_percent"] == 15.0
    assert config.local_capacity_percent() == 75.0


def test_seed_name_of_the_spillover_size_is_an_alias(in_tmp: Path) -> None:
    config = load(BASE + '[cluster]\ncloud_storage_target_manifest_size_bytes = "128KiB"\n')
    assert config.cluster["cloud_storage_spillover_manifest_size"] == 128 * 1024
    assert "cloud_storage_target_manifest_size_bytes" not in config.cluster


def test_name_and_alias_together_is_a_problem(in_tmp: Path) -> None:
    (problem,) = problems_of(
        BASE + "[cluster]\ncloud_storage_spillover_manifest_size = 65536\n"
        "cloud_storage_target_manifest_size_bytes = 65536\n"
    )
    assert problem == (
        "tiered.toml: [cluster] cloud_storage_target_manifest_size_bytes: sets "
        "cloud_storage_spillover_manifest_size again (already set by "
        "cloud_storage_spillover_manifest_size)"
    )


def test_kafka_broker_names_are_cluster_aliases_even_unquoted(in_tmp: Path) -> None:
    config = load(BASE + '[cluster]\nlog.roll.ms = 60000\n"log.index.interval.bytes" = 8192\n')
    assert config.cluster["log_segment_ms"] == 60_000
    assert config.cluster["log_index_interval_bytes"] == 8192


def test_kafka_local_retention_aliases(in_tmp: Path) -> None:
    config = load(
        BASE + '[topics."orders"]\n"local.retention.ms" = "2h"\n"local.retention.bytes" = "1GiB"\n'
    )
    assert config.topics["orders"] == {
        "retention.local.target.ms": 7_200_000,
        "retention.local.target.bytes": 1024**3,
    }
    topic = config.topic_config("orders")
    assert topic.retention_local_target_ms == 7_200_000
    assert topic.retention_local_target_bytes == 1024**3
    assert topic.local_retention_explicit


@pytest.mark.parametrize("enabled", [True, False])
def test_remote_storage_enable_sets_write_and_read(in_tmp: Path, enabled: bool) -> None:
    cluster = str(not enabled).lower()
    config = load(
        BASE + f"[cluster]\ncloud_storage_enable_remote_write = {cluster}\n"
        f"cloud_storage_enable_remote_read = {cluster}\n"
        f'[topics."orders"]\n"remote.storage.enable" = {str(enabled).lower()}\n'
    )
    topic = config.topic_config("orders")
    assert (topic.remote_write, topic.remote_read) == (enabled, enabled)
    assert topic.overrides == {"redpanda.remote.write", "redpanda.remote.read"}


def test_remote_storage_enable_conflicts_with_an_explicit_read(in_tmp: Path) -> None:
    (problem,) = problems_of(
        BASE + '[topics."orders"]\n"remote.storage.enable" = true\n"redpanda.remote.read" = false\n'
    )
    assert problem == (
        'tiered.toml: [topics."orders"] redpanda.remote.read: sets redpanda.remote.read again '
        "(already set by remote.storage.enable)"
    )


def test_unquoted_dotted_topic_keys_mean_the_dotted_name(in_tmp: Path) -> None:
    config = load(BASE + "[topics.orders]\nretention.ms = 5000\nredpanda.remote.write = false\n")
    assert config.topics["orders"] == {"retention.ms": 5000, "redpanda.remote.write": False}


def test_cleanup_policy_forms_are_normalised(in_tmp: Path) -> None:
    config = load(
        BASE + '[topics.a]\n"cleanup.policy" = "delete, compact"\n'
        '[topics.b]\n"cleanup.policy" = ["compact", "delete"]\n'
        '[topics.c]\n"cleanup.policy" = "compact"\n'
    )
    assert config.topic_config("a").cleanup_policy == "compact,delete"
    assert config.topic_config("b").cleanup_policy == "compact,delete"
    assert config.topic_config("a").remote_retention_applies
    # as Redpanda documents: with compact alone, retention deletes nothing from object storage
    assert not config.topic_config("c").remote_retention_applies


# --- precedence ----------------------------------------------------------------------------------

# Redpanda's tables: (cluster default, topic setting or None for "not set", outcome)
SEED_001_REMOTE_TABLE = [
    (True, None, True),
    (True, False, False),
    (True, True, True),
    (False, None, False),
    (False, False, False),
    (False, True, True),
]


@pytest.mark.parametrize(("cluster", "topic", "enabled"), SEED_001_REMOTE_TABLE)
@pytest.mark.parametrize("which", ["write", "read"])
def test_seed_001_remote_write_read_table(
    in_tmp: Path, which: str, cluster: bool, topic: bool | None, enabled: bool
) -> None:
    text = BASE + f"[cluster]\ncloud_storage_enable_remote_{which} = {str(cluster).lower()}\n"
    text += '[topics."orders"]\n'
    if topic is not None:
        text += f'"redpanda.remote.{which}" = {str(topic).lower()}\n'
    config = load(text)
    assert getattr(config.topic_config("orders"), f"remote_{which}") is enabled
    # a topic that has no section at all takes the cluster default
    assert getattr(config.topic_config("payments"), f"remote_{which}") is cluster


def test_topic_override_beats_cluster_default_beats_property_default(in_tmp: Path) -> None:
    config = load(
        BASE + '[cluster]\nretention_bytes = "10GiB"\nlog_segment_size = "256MiB"\n'
        '[topics."orders"]\n"segment.bytes" = "64MiB"\n"retention.ms" = "1d"\n'
    )
    orders = config.topic_config("orders")
    assert orders.retention_ms == 86_400_000  # topic
    assert orders.retention_bytes == 10 * 1024**3  # cluster
    assert orders.segment_bytes == 64 * MiB  # topic
    assert orders.index_interval_bytes == 4096  # property default via the cluster
    assert orders.remote_delete is True  # topic property's own default (Redpanda's default)
    assert orders.overrides == {"segment.bytes", "retention.ms"}
    assert not orders.local_retention_explicit
    # merging: target is the topic's segment size, minimum half of it (Redpanda's default)
    assert (orders.merge_target_bytes, orders.merge_min_bytes) == (64 * MiB, 32 * MiB)
    other = config.topic_config("payments")
    assert other.segment_bytes == 256 * MiB
    assert other.retention_ms == 7 * 86_400_000


def test_explicit_merge_sizes_win_over_segment_size(in_tmp: Path) -> None:
    config = load(
        BASE + '[cluster]\ncloud_storage_segment_size_target = "512MiB"\n'
        'cloud_storage_segment_size_min = "8MiB"\n'
    )
    topic = config.topic_config("t")
    assert (topic.merge_target_bytes, topic.merge_min_bytes) == (512 * MiB, 8 * MiB)


@pytest.mark.parametrize("spelling", ["-1", '"-1"', '"unlimited"'])
def test_minus_one_means_unlimited_retention(in_tmp: Path, spelling: str) -> None:
    config = load(
        BASE + '[cluster]\nretention_bytes = "5GiB"\n[topics."audit"]\n'
        f'"retention.ms" = {spelling}\n"retention.bytes" = {spelling}\n'
        f'"retention.local.target.ms" = {spelling}\n'
    )
    audit = config.topic_config("audit")
    assert audit.retention_ms is None
    assert audit.retention_bytes is None  # the topic's -1 beats the cluster's 5 GiB
    assert audit.retention_local_target_ms is None
    # set-to-unlimited is recorded, distinct from not set
    assert config.topics["audit"]["retention.ms"] is None
    assert "retention.ms" in config.topics["audit"]
    assert config.effective()["topics"]["audit"]["retention.ms"] == -1


def test_cluster_minus_one_is_inherited_as_unlimited(in_tmp: Path) -> None:
    config = load(BASE + "[cluster]\nlog_retention_ms = -1\n")
    assert config.cluster["log_retention_ms"] is None
    assert config.topic_config("any").retention_ms is None
    assert config.effective()["cluster"]["log_retention_ms"] == -1
    # an unset size limit (null) is also "no limit" and shows as -1
    assert config.effective()["cluster"]["retention_bytes"] == -1


def test_minus_one_only_where_it_means_something(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + '[topics."t"]\n"segment.bytes" = -1\n')
    assert "negative" in problem


# --- topic names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a b", "é", "x" * 250])
def test_illegal_topic_names(name: str) -> None:
    assert check_topic_name(name) is not None
    with pytest.raises(ConfigError):
        default_config(Path("/tmp/x")).topic_config(name)


@pytest.mark.parametrize("name", ["orders", "a.b-c_d", "X" * 249, "__consumer_offsets"])
def test_legal_topic_names(name: str) -> None:
    assert check_topic_name(name) is None


# --- storage, credentials, paths -----------------------------------------------------------------


def test_secrets_are_masked_and_never_in_repr(in_tmp: Path) -> None:
    config = load(
        BASE + 'access_key = "AKIAEXAMPLE"\nsecret_key = "s3cr3t-VALUE"\n'
        '[cluster]\ncloud_storage_secret_key = "s3cr3t-VALUE"\n'
    )
    effective = config.effective()
    assert effective["storage"]["secret_key"] == MASK
    assert effective["storage"]["access_key"] == MASK
    assert effective["cluster"]["cloud_storage_secret_key"] == MASK
    dumped = json.dumps(effective)
    for text in (dumped, repr(config), str(config), repr(config.cluster), repr(config.storage)):
        assert "s3cr3t-VALUE" not in text and "AKIAEXAMPLE" not in text
    # still usable as the real value
    assert config.storage.secret_key == "s3cr3t-VALUE"
    assert config.store_settings().secret_key == "s3cr3t-VALUE"
    assert type(config.store_settings().secret_key) is str
    assert config.effective(mask_secrets=False)["storage"]["secret_key"] == "s3cr3t-VALUE"


def test_mistyped_credentials_are_not_echoed(in_tmp: Path) -> None:
    problems = problems_of(
        BASE + "access_key = 123456789\nsecret_key = 987654321\n"
        "[cluster]\ncloud_storage_secret_key = 55555\n"
    )
    assert problems == [
        "tiered.toml: [cluster] cloud_storage_secret_key: expected a non-empty string "
        "(value hidden)",
        "tiered.toml: [storage] access_key: expected a non-empty string, got integer "
        "(value hidden)",
        "tiered.toml: [storage] secret_key: expected a non-empty string, got integer "
        "(value hidden)",
    ]


def test_bad_endpoint_from_the_cluster_property_names_it(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + '[cluster]\ncloud_storage_api_endpoint = "ftp://x"\n')
    assert problem == (
        "tiered.toml: [cluster] cloud_storage_api_endpoint: expected an http:// or https:// "
        "URL, got 'ftp://x'"
    )


def test_half_a_key_pair_is_a_problem(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + 'access_key = "AKIAEXAMPLE"\n')
    assert problem.startswith("tiered.toml: [storage] secret_key: required with the other half")
    assert "AKIAEXAMPLE" not in problem


def test_cluster_credential_properties_are_alternatives(in_tmp: Path) -> None:
    config = load(
        BASE + '[cluster]\ncloud_storage_access_key = "AK"\ncloud_storage_secret_key = "SK"\n'
        'cloud_storage_region = "eu-west-1"\ncloud_storage_api_endpoint = "storage.example.com"\n'
    )
    assert config.storage.access_key == "AK" and config.storage.secret_key == "SK"
    assert config.storage.region == "eu-west-1"
    assert config.storage.endpoint_url == "https://storage.example.com:443"


def test_host_only_endpoint_with_tls_disabled_and_port(in_tmp: Path) -> None:
    config = load(
        BASE + '[cluster]\ncloud_storage_api_endpoint = "minio"\n'
        "cloud_storage_disable_tls = true\ncloud_storage_api_endpoint_port = 9000\n"
    )
    assert config.storage.endpoint_url == "http://minio:9000"


def test_storage_key_and_cluster_alternative_must_agree(in_tmp: Path) -> None:
    (problem,) = problems_of(
        BASE + 'region = "us-east-1"\n[cluster]\ncloud_storage_region = "eu-west-1"\n'
    )
    assert problem == (
        "tiered.toml: [storage] region: conflicts with [cluster] cloud_storage_region; set one"
    )
    config = load(BASE + 'region = "us-east-1"\n[cluster]\ncloud_storage_region = "us-east-1"\n')
    assert config.storage.region == "us-east-1"


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    sub = tmp_path / "etc"
    sub.mkdir()
    path = sub / "tiered.toml"
    path.write_text(BASE + '[log]\ndirs = ["logs", "/abs/logs"]\n[cache]\ndir = "../cache"\n')
    config = load_config(path)
    assert config.log_dirs == (sub / "logs", Path("/abs/logs"))
    assert config.cache_dir == tmp_path / "cache"
    assert config.source == str(path)


def test_log_dirs_as_kafka_comma_string_and_duplicates(in_tmp: Path) -> None:
    config = load(BASE + '[log]\ndirs = "/a, /b"\n')
    assert config.log_dirs == (Path("/a"), Path("/b"))
    (problem,) = problems_of(BASE + '[log]\ndirs = ["/a", "/a/"]\n')
    assert problem == "tiered.toml: [log] dirs: '/a' is listed twice"


def test_defaults_without_log_or_cache_sections(
    in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(in_tmp / "xdg"))
    config = load(BASE)
    assert config.log_dirs == ()
    assert config.log_retention_mode == "advise"
    # a per-bucket cache directory: two buckets never share cached chunks
    assert config.cache_dir.parent == in_tmp / "xdg" / "tiered"
    other = load('[storage]\nurl = "s3://bucket-b"\n')
    assert other.cache_dir != config.cache_dir


# --- API for the rest of tiered ------------------------------------------------------------------


def test_store_settings_map_the_cluster_properties(in_tmp: Path) -> None:
    config = load(
        BASE + 'endpoint_url = "http://127.0.0.1:9000"\nregion = "us-east-1"\n[cluster]\n'
        'cloud_storage_max_connections = 7\ncloud_storage_initial_backoff_ms = "250ms"\n'
        "cloud_storage_allow_unconditional_writes = true\n"
        'cloud_storage_segment_upload_timeout_ms = "45s"\n'
    )
    settings = config.store_settings()
    assert settings.url == "s3://bucket-a/prefix"
    assert settings.endpoint_url == "http://127.0.0.1:9000"
    assert settings.region == "us-east-1"
    assert settings.access_key is None and settings.secret_key is None
    assert settings.max_connections == 7
    assert settings.initial_backoff_ms == 250
    assert settings.allow_unconditional_writes is True
    assert settings.read_timeout_s == 45.0
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_default_config(tmp_path: Path) -> None:
    config = default_config(tmp_path)
    assert config.storage.url == (tmp_path / "bucket").as_uri()
    assert parse_store_url(config.storage.url) == ("file", str(tmp_path / "bucket"), "")
    assert config.log_dirs == (tmp_path / "log",)
    assert config.cache_dir == tmp_path / "cache"
    assert config.log_retention_mode == "enforce"
    assert config.cluster["cloud_storage_cache_chunk_size"] == 16 * MiB
    topic = config.topic_config("orders")
    assert topic.remote_write and topic.remote_read
    assert config.store_settings().url == config.storage.url


def test_config_is_frozen_read_only_and_pickles(tmp_path: Path) -> None:
    config = default_config(tmp_path)
    with pytest.raises(AttributeError):
        config.source = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.cluster["log_retention_ms"] = 1  # type: ignore[index]
    assert pickle.loads(pickle.dumps(config)) == config


def test_effective_is_complete_and_json_ready(in_tmp: Path) -> None:
    config = load(BASE + '[topics."orders"]\n"retention.ms" = 1000\n')
    effective = config.effective()
    assert json.loads(json.dumps(effective)) == effective
    assert set(effective) == {"source", "storage", "log", "cache", "node", "http", "cluster",
                              "topics"}
    assert set(effective["cluster"]) == {p.name for p in CLUSTER}
    assert set(effective["topics"]["orders"]) == {p.name for p in TOPIC}
    assert effective["topics"]["orders"]["retention.ms"] == 1000
    assert effective["topics"]["orders"]["retention.local.target.ms"] == 86_400_000


def test_check_config(in_tmp: Path) -> None:
    Path("good.toml").write_text(BASE + 'secret_key = "sk"\naccess_key = "ak"\n')
    effective, problems = check_config("good.toml")
    assert problems == [] and effective is not None
    assert effective["storage"]["secret_key"] == MASK
    Path("bad.toml").write_text('[storage]\nurl = "s3://"\n[cluster]\nx = 1\n')
    effective, problems = check_config("bad.toml")
    assert effective is None and len(problems) == 2


def test_cli_config_check_exit_codes(in_tmp: Path) -> None:
    from click.testing import CliRunner

    from tiered.cli.main import cli

    Path("bad.toml").write_text('[storage]\nurl = "s3://"\n')
    result = CliRunner().invoke(cli, ["config", "check", "--config", "bad.toml"])
    assert result.exit_code == 2
    assert "bad.toml: [storage] url:" in result.output
    Path("good.toml").write_text(BASE + 'secret_key = "sk-value"\naccess_key = "ak"\n')
    result = CliRunner().invoke(cli, ["config", "check", "--config", "good.toml"])
    assert result.exit_code == 0, result.output
    assert "cloud_storage_cache_chunk_size = 16777216" in result.output
    assert "sk-value" not in result.output


def test_config_check_requires_the_log_dirs_as_the_commands_do(in_tmp: Path) -> None:
    from click.testing import CliRunner

    from tiered.cli.main import cli

    Path("t.toml").write_text(BASE + '[log]\ndirs = ["no-such-dir"]\n')
    result = CliRunner().invoke(cli, ["config", "check", "--config", "t.toml"])
    assert result.exit_code == 2
    assert "[log] dirs:" in result.stderr and "no-such-dir does not exist" in result.stderr
    skipped = CliRunner().invoke(cli, ["config", "check", "--config", "t.toml",
                                       "--skip-dir-check"])
    assert skipped.exit_code == 0, skipped.output
    Path("no-such-dir").mkdir()
    assert CliRunner().invoke(cli, ["config", "check", "--config", "t.toml"]).exit_code == 0


def test_parse_config_without_a_file() -> None:
    config = parse_config(
        {"storage": {"url": "s3://bucket-a"}}, source="<test>", base_dir=Path("/srv")
    )
    assert config.source == "<test>"
    with pytest.raises(ConfigError) as info:
        parse_config({"cluster": {"nope": 1}}, source="<test>")
    assert info.value.problems[0].startswith("<test>: ")


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    effective, problems = check_config(path, check_dirs=False)
    assert problems == []
    assert effective is not None


@pytest.mark.parametrize("path", [p for p in sorted((ROOT / "examples").glob("*.toml"))
                                  if "# Check it with:" in p.read_text()],
                         ids=lambda p: p.name)
def test_examples_pass_the_check_they_document(path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer pastes the example's own "Check it with:" line: it must pass."""
    from click.testing import CliRunner

    from tiered.cli.main import cli

    documented = re.search(r"^# Check it with:\s+tiered (.+)$", path.read_text(), flags=re.M)
    assert documented is not None
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(cli, documented.group(1).split())
    assert result.exit_code == 0, result.output


def test_config_check_reports_a_missing_log_dir_beside_every_other_problem(
        in_tmp: Path) -> None:
    Path("t.toml").write_text('[storage]\nurl = "s3://"\n[log]\ndirs = ["no-such-dir"]\n')
    effective, problems = check_config("t.toml")
    assert effective is None
    assert any("[storage] url" in p for p in problems), problems
    assert any("no-such-dir does not exist" in p for p in problems), problems


def test_minio_example_points_at_the_dev_stack() -> None:
    config = load_config(ROOT / "examples" / "minio.toml")
    assert config.storage.url == "s3://tiered"
    assert config.storage.endpoint_url == "http://minio:9000"


# --- the registry and its documentation ----------------------------------------------------------


def test_registry_is_consistent() -> None:
    assert check_registry() == []
    names = [p.name for p in CLUSTER] + [p.name for p in TOPIC]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("name", "default"),
    [
        ("cloud_storage_cache_chunk_size", 16 * MiB),
        ("cloud_storage_upload_ctrl_p_coeff", -2.0),
        ("cloud_storage_upload_ctrl_d_coeff", 0.0),
        ("cloud_storage_upload_ctrl_min_shares", 100),
        ("cloud_storage_upload_ctrl_max_shares", 1000),
        ("cloud_storage_upload_ctrl_update_interval_ms", 60_000),
        ("cloud_storage_spillover_manifest_size", 64 * 1024),
        ("cloud_storage_max_connections", 20),
        ("cloud_storage_initial_backoff_ms", 100),
        ("cloud_storage_hydrated_chunks_per_segment_ratio", 0.7),
        ("cloud_storage_min_chunks_per_segment_threshold", 5),
        ("cloud_storage_chunk_eviction_strategy", "eager"),
        ("cloud_storage_cache_check_interval_ms", 30_000),
        ("cloud_storage_disable_chunk_reads", False),
        ("cloud_storage_enable_segment_merging", True),
        ("cloud_storage_allow_unconditional_writes", False),
        ("log_retention_ms", 604_800_000),
        ("retention_bytes", None),
        ("retention_local_target_ms_default", 86_400_000),
        ("retention_local_strict", False),
        ("retention_local_trim_interval", 30_000),
        ("disk_reservation_percent", 20.0),
        ("storage_min_free_bytes", 5 * 1024**3),
        ("log_segment_size", 1024**3),
        ("log_index_interval_bytes", 4096),
    ],
)
def test_seed_defaults(name: str, default: object) -> None:
    assert REGISTRY["cluster"][name].default == default


def test_topic_fallbacks_follow_the_seeds() -> None:
    fallback = {p.name: p.fallback for p in TOPIC}
    assert fallback["retention.ms"] == "log_retention_ms"
    assert fallback["retention.bytes"] == "retention_bytes"
    assert fallback["retention.local.target.ms"] == "retention_local_target_ms_default"
    assert fallback["retention.local.target.bytes"] == "retention_local_target_bytes_default"
    assert fallback["redpanda.remote.write"] == "cloud_storage_enable_remote_write"
    assert fallback["redpanda.remote.read"] == "cloud_storage_enable_remote_read"
    assert fallback["segment.bytes"] == "log_segment_size"
    assert fallback["segment.ms"] == "log_segment_ms"
    assert [p.name for p in lookup("topic", "remote.storage.enable")] == [
        "redpanda.remote.write",
        "redpanda.remote.read",
    ]


def test_secret_type_hides_its_value() -> None:
    secret = Secret("hunter2")
    assert repr(secret) == repr(MASK) and "hunter2" not in repr({"k": secret})
    assert secret == "hunter2" and str(secret) == "hunter2"
    assert pickle.loads(pickle.dumps(secret)) == "hunter2"


def test_property_parse_is_kind_driven() -> None:
    prop = Property("x", "size", 0, "cluster", min=1)
    assert prop.parse("2KiB") == 2048
    with pytest.raises(PropertyValueError, match="at least 1"):
        prop.parse(0)


def _table(scope: str) -> str:
    """The reference table docs/configuration.md carries for `scope`, from the registry."""
    props = REGISTRY["cluster" if scope == "cluster" else "topic"].values()
    fallback = scope == "topic"
    head = "| property | kind | default | " + ("falls back to | " if fallback else "")
    head += "aliases | description |\n|---|---|---|" + ("---|" if fallback else "") + "---|---|\n"
    rows = []
    for p in props:
        kind = p.kind + (f" ({', '.join(p.choices)})" if p.choices else "")
        kind += ", -1 = no limit" if p.unlimited else ""
        # a topic property with a fallback has no default of its own: it inherits
        default = "-" if p.fallback else f"`{p.format(p.default)}`"
        default = "not set" if default == "`not set`" else default
        cells = [f"`{p.name}`", kind, default]
        if fallback:
            cells.append(f"`{p.fallback}`" if p.fallback else "-")
        cells.append(", ".join(f"`{a}`" for a in p.aliases) or "-")
        cells.append(p.doc.replace("|", "\\|"))
        rows.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


@pytest.mark.parametrize("scope", ["cluster", "topic"])
def test_docs_list_every_property(scope: str) -> None:
    """The tables in docs/configuration.md are generated from the registry; regenerate with
    TIERED_REGENERATE_DOCS=1 pytest tests/test_config/test_config.py."""
    begin, end = f"<!-- BEGIN {scope} properties -->\n", f"<!-- END {scope} properties -->"
    text = DOC.read_text()
    pattern = re.compile(re.escape(begin) + r"(.*?)" + re.escape(end), re.S)
    match = pattern.search(text)
    assert match, f"docs/configuration.md lacks the {scope} table markers"
    table = _table(scope)
    if os.environ.get("TIERED_REGENERATE_DOCS") == "1" and match.group(1) != table:
        DOC.write_text(text[: match.start(1)] + table + text[match.end(1) :])
        text = DOC.read_text()
        match = pattern.search(text)
        assert match
    assert match.group(1) == table, "regenerate with TIERED_REGENERATE_DOCS=1"
    for prop in REGISTRY["cluster" if scope == "cluster" else "topic"].values():
        assert f"`{prop.name}`" in match.group(1)
        for alias in prop.aliases:
            assert f"`{alias}`" in text


# --- the node id (upload leases) -------------------------------------------------------------


def test_node_id_is_the_configured_one(in_tmp: Path) -> None:
    assert load(BASE + '[node]\nid = "broker-7"\n').node_id() == "broker-7"


def test_node_id_defaults_to_the_brokers_own_from_meta_properties(in_tmp: Path) -> None:
    log = in_tmp / "kafka-logs"
    log.mkdir()
    (log / "meta.properties").write_text(
        "#\n#Tue Nov 25 10:00:00 UTC 2026\ncluster.id=abc\nnode.id=3\nversion=1\n")
    assert load(BASE + f'[log]\ndirs = ["{log}"]\n').node_id() == "3"
    (log / "meta.properties").write_text("version=0\nbroker.id=11\n")  # ZooKeeper-era
    assert load(BASE + f'[log]\ndirs = ["{log}"]\n').node_id() == "11"


def test_node_id_falls_back_to_the_host_name_made_legal(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "web 1:prod")
    assert load(BASE).node_id() == "web-1-prod"


@pytest.mark.parametrize("value", ['""', '"a/b"', '".."', '"' + "x" * 65 + '"', "3"])
def test_a_bad_node_id_is_an_error_naming_the_key(in_tmp: Path, value: str) -> None:
    (problem,) = problems_of(BASE + f"[node]\nid = {value}\n")
    assert problem.startswith("tiered.toml: [node] id: ")


def test_an_unknown_node_key_is_an_error(in_tmp: Path) -> None:
    (problem,) = problems_of(BASE + '[node]\nname = "a"\n')
    assert problem.startswith("tiered.toml: [node] name: unknown key")


def test_topic_settings_are_kept_for_a_bounded_number_of_names() -> None:
    """The read path asks for a topic's settings on every fetch; names can come from clients,
    so only so many are kept, and an illegal one is refused every time."""
    config = parse_config({"storage": {"url": "s3://bucket-a"},
                           "topics": {"orders": {"retention.ms": 5000}}}, source="<test>")
    first = config.topic_config("orders")
    assert config.topic_config("orders") is first and first.retention_ms == 5000
    for i in range(TOPIC_CONFIGS_CACHED + 50):
        assert config.topic_config(f"t{i}").retention_ms == config.topic_config("t0").retention_ms
    assert len(config._topic_configs) == TOPIC_CONFIGS_CACHED
    for _ in range(2):
        with pytest.raises(ConfigError):
            config.topic_config("../bad")
    # a copy starts with nothing kept, and compares equal all the same
    again = pickle.loads(pickle.dumps(config))
    assert again == config and again.topic_config("t1") == config.topic_config("t1")
