"""tiered's configuration as the program sees it: the validated, typed model of the one TOML
file (`tiered.config.loader` builds it).

    [storage]   url (required), endpoint_url, region, access_key, secret_key
    [log]       dirs, retention ("enforce" | "advise")
    [cache]     dir
    [node]      id (the sidecar's name among those sharing the bucket)
    [kafka]     listen, advertised, tls_cert, tls_key, limits (tiered.config.kafka)
    [http]      the HTTP server's limits (tiered.config.http)
    [cluster]   cluster properties by their flat names (tiered.config.properties)
    [topics."name"]  topic overrides by their dotted names

Validation collects every problem before it reports, so one `tiered config check` run shows all
of them; each problem names the file, the section and the key. Relative paths resolve against the
file's directory. Credentials are wrapped in `Secret` and masked in `effective()` and `repr()`.
Documented in docs/configuration.md.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tiered.config.http import HTTP_KEYS, HttpConfig
from tiered.config.kafka import KAFKA_KEYS, KafkaConfig
from tiered.config.properties import (
    CLUSTER,
    MASK,
    REGISTRY,
    TOPIC_PROPERTIES,
    Scope,
    Secret,
    Value,
    local_capacity_percent,
    resolve_topic,
)
from tiered.errors import ConfigError
from tiered.kafka.checkpoints import read_meta_properties
from tiered.topics import is_internal_topic, node_id_from, node_id_problem, topic_name_problem

if TYPE_CHECKING:
    from tiered.store.base import StoreSettings

__all__ = [
    "LOG_RETENTION_MODES",
    "Config",
    "HttpConfig",
    "KafkaConfig",
    "StorageConfig",
    "TopicConfig",
    "check_topic_name",
]

#: [log] retention: who deletes local segments once they are safely uploaded
LOG_RETENTION_MODES: dict[str, str] = {
    "enforce": "tiered deletes local segments past retention.local.target.* itself",
    "advise": "tiered only reports what local retention could delete; the broker deletes",
}

#: keys of the fixed sections; [cluster] and [topics."…"] take the registry's properties
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "storage": ("url", "endpoint_url", "region", "access_key", "secret_key"),
    "log": ("dirs", "retention"),
    "cache": ("dir",),
    "node": ("id",),
    "kafka": KAFKA_KEYS,
    "http": HTTP_KEYS,
    "cluster": (),
    "topics": (),
}

#: [storage] key -> the cluster property that may give it instead
_STORAGE_ALTERNATIVES = {
    "region": "cloud_storage_region",
    "access_key": "cloud_storage_access_key",
    "secret_key": "cloud_storage_secret_key",
    "endpoint_url": "cloud_storage_api_endpoint",
}


K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only dict that pickles (Spark ships configs to executors), unlike
    `types.MappingProxyType`."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[K, V] | None = None) -> None:
        self._data: dict[K, V] = dict(data or {})

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


def check_topic_name(name: str) -> str | None:
    """Why `name` is not a legal Kafka topic name, or None when it is (`tiered.topics`)."""
    return topic_name_problem(name)


@dataclass(frozen=True)
class StorageConfig:
    """Where the bucket is and how to reach it; credentials None mean the AWS chain."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    access_key: Secret | None = field(default=None, repr=False)
    secret_key: Secret | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TopicConfig:
    """A topic's effective settings: its override if set, else the cluster default.

    Retention values of None mean "no limit" (Kafka's -1, or an unset cluster default)."""

    topic: str
    retention_ms: int | None
    retention_bytes: int | None
    retention_local_target_ms: int | None
    retention_local_target_bytes: int | None
    remote_write: bool
    remote_read: bool
    remote_delete: bool
    remote_recovery: bool
    segment_bytes: int
    segment_ms: int
    cleanup_policy: str
    index_interval_bytes: int
    #: adjacent segment merging: merged segments grow up to this (cluster target or segment.bytes)
    merge_target_bytes: int
    #: segments below this are merge candidates (cluster min, or half of segment.bytes)
    merge_min_bytes: int
    #: compaction (docs/compaction.md): tombstone lifetime after a pass kept it, None: forever
    delete_retention_ms: int | None = 86_400_000
    min_compaction_lag_ms: int = 0
    #: None: no limit
    max_compaction_lag_ms: int | None = None
    min_cleanable_dirty_ratio: float = 0.2
    #: dotted names this topic sets itself (aliases resolved)
    overrides: frozenset[str] = frozenset()

    @property
    def local_retention_explicit(self) -> bool:
        """Whether local retention is the topic's own (space-management phase 4) rather than
        the cluster default (phase 3), in Redpanda's terms."""
        return bool(self.overrides & {"retention.local.target.ms", "retention.local.target.bytes"})

    @property
    def remote_retention_applies(self) -> bool:
        """With cleanup.policy=compact alone, retention deletes nothing remotely (as in
        Redpanda)."""
        return "delete" in self.cleanup_policy.split(",")


#: topic property -> TopicConfig field
TOPIC_FIELDS: dict[str, str] = {
    name: name.removeprefix("redpanda.").replace(".", "_") for name in TOPIC_PROPERTIES
}


#: topics whose effective settings a `Config` keeps once resolved
TOPIC_CONFIGS_CACHED = 10_000


@dataclass(frozen=True)
class Config:
    """A validated configuration. `cluster` holds every cluster property (defaults filled in);
    `topics` only what each topic section set, by canonical dotted name."""

    source: str
    storage: StorageConfig
    log_dirs: tuple[Path, ...]
    log_retention_mode: str
    cache_dir: Path
    cluster: Mapping[str, Value]
    topics: Mapping[str, Mapping[str, Value]]
    #: `[node] id` as configured; None: `node_id()` finds one
    node: str | None = None
    #: the Kafka protocol endpoint of `tiered run`; None: off (no [kafka] section)
    kafka: KafkaConfig | None = None
    #: `[log] dirs = []` given explicitly: no local log at all, `tiered run` serves the bucket
    #: alone (a history server); other commands still need log dirs
    history_server: bool = False
    #: the HTTP server's limits, authentication and TLS ([http]; docs/security.md)
    http: HttpConfig = field(default_factory=HttpConfig)
    #: `topic_config` results: the read path asks for every fetch (bounded: a name from a
    #: client is only cached up to `TOPIC_CONFIGS_CACHED` names)
    _topic_configs: dict[str, TopicConfig] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def node_id(self) -> str:
        """This sidecar's name among those sharing the bucket: `[node] id`, else the broker's
        `node.id` (or `broker.id`) from `meta.properties` in the first log dir, so each
        broker's sidecar is named after its broker, else the host name."""
        if self.node is not None:
            return self.node
        if self.log_dirs:
            meta = read_meta_properties(self.log_dirs[0])
            for key in ("node.id", "broker.id"):
                found = meta.get(key, "")
                if found and node_id_problem(found) is None:
                    return found
        return node_id_from(socket.gethostname())

    def topic_config(self, topic: str) -> TopicConfig:
        """Effective settings of `topic` (configured or not); ConfigError for an illegal name."""
        cached = self._topic_configs.get(topic)
        if cached is not None:
            return cached
        resolved = self._resolve_topic(topic)
        if len(self._topic_configs) < TOPIC_CONFIGS_CACHED:
            self._topic_configs[topic] = resolved
        return resolved

    def _resolve_topic(self, topic: str) -> TopicConfig:
        problem = check_topic_name(topic)
        if problem is not None:
            raise ConfigError(problem)
        overrides = self.topics.get(topic, {})
        values = resolve_topic(self.cluster, overrides)
        kwargs: dict[str, Any] = {TOPIC_FIELDS[name]: value for name, value in values.items()}
        if is_internal_topic(topic) and "redpanda.remote.write" not in overrides:
            # the broker's own state: neither uploaded nor trimmed unless the topic's section
            # turns remote write on explicitly
            kwargs["remote_write"] = False
        segment_bytes = int(values["segment.bytes"] or 0)
        target = self.cluster["cloud_storage_segment_size_target"]
        minimum = self.cluster["cloud_storage_segment_size_min"]
        return TopicConfig(
            topic=topic,
            merge_target_bytes=int(target) if target is not None else segment_bytes,
            merge_min_bytes=int(minimum) if minimum is not None else segment_bytes // 2,
            overrides=frozenset(overrides),
            **kwargs,
        )

    def local_capacity_percent(self) -> float:
        """Target share of the disk for local log data (see
        `properties.local_capacity_percent`)."""
        return local_capacity_percent(self.cluster)

    # -- typed reads of cluster properties: the registry validated them, so a number-valued
    # property is a number or None (not set); these give callers a plain int or float

    def cluster_int(self, name: str, default: int = 0) -> int:
        """Cluster property `name` as an int; `default` when it is not set (or 0)."""
        value = self.cluster[name]
        return int(value or default)  # type: ignore[arg-type]

    def cluster_seconds(self, name: str, default_ms: int = 0) -> float:
        """A millisecond cluster property in seconds (`default_ms` when not set)."""
        return self.cluster_int(name, default_ms) / 1000

    def store_settings(self) -> StoreSettings:
        """What `tiered.store.open_store` needs, mapped from the cluster properties."""
        from tiered.store.base import StoreSettings

        c = self.cluster
        return StoreSettings(
            url=self.storage.url,
            endpoint_url=self.storage.endpoint_url,
            region=self.storage.region,
            access_key=_plain(self.storage.access_key),
            secret_key=_plain(self.storage.secret_key),
            max_connections=self.cluster_int("cloud_storage_max_connections", 1),
            initial_backoff_ms=self.cluster_int("cloud_storage_initial_backoff_ms", 1),
            read_timeout_s=self.cluster_seconds("cloud_storage_segment_upload_timeout_ms", 1),
            allow_unconditional_writes=bool(c["cloud_storage_allow_unconditional_writes"]),
        )

    def effective(self, mask_secrets: bool = True) -> dict[str, Any]:
        """Everything resolved, as JSON-ready plain values: unlimited shows as -1, secrets as
        MASK unless `mask_secrets` is False. Topics show their effective values."""

        def secret(value: str | None) -> str | None:
            return None if value is None else MASK if mask_secrets else str(value)

        s = self.storage
        return {
            "source": self.source,
            "storage": {
                "url": s.url,
                "endpoint_url": s.endpoint_url,
                "region": s.region,
                "access_key": secret(s.access_key),
                "secret_key": secret(s.secret_key),
            },
            "log": {"dirs": [str(p) for p in self.log_dirs], "retention": self.log_retention_mode},
            "cache": {"dir": str(self.cache_dir)},
            "node": {"id": self.node_id()},
            **({} if self.kafka is None else {"kafka": _kafka_effective(self.kafka)}),
            "http": {**{k: v for k, v in asdict(self.http).items()
                        if k not in ("tls_cert", "tls_key", "tls_client_ca")},
                     **{k: _plain_path(getattr(self.http, k))
                        for k in ("tls_cert", "tls_key", "tls_client_ca")}},
            "cluster": {
                p.name: _render(p.name, "cluster", self.cluster[p.name], mask_secrets)
                for p in CLUSTER
            },
            "topics": {
                topic: {
                    name: _render(name, "topic", value, mask_secrets)
                    for name, value in resolve_topic(self.cluster, overrides).items()
                }
                for topic, overrides in self.topics.items()
            },
        }


def _kafka_effective(k: KafkaConfig) -> dict[str, Any]:
    def address(host: str | None, port: int | None) -> str | None:
        if host is None:
            return None
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    return {
        "listen": address(k.listen_host, k.listen_port),
        "advertised": address(k.advertised_host, k.advertised_port),
        "tls_cert": None if k.tls_cert is None else str(k.tls_cert),
        "tls_key": None if k.tls_key is None else str(k.tls_key),
        "max_connections": k.max_connections,
        "max_request_bytes": k.max_request_bytes,
        "idle_timeout_ms": k.idle_timeout_ms,
        "group_initial_rebalance_delay_ms": k.group_initial_rebalance_delay_ms,
        "group_min_session_timeout_ms": k.group_min_session_timeout_ms,
        "group_max_session_timeout_ms": k.group_max_session_timeout_ms,
        "offset_metadata_max_bytes": k.offset_metadata_max_bytes,
        "offsets_retention_minutes": k.offsets_retention_minutes,
        "offsets_retention_check_interval_ms": k.offsets_retention_check_interval_ms,
        "max_groups": k.max_groups,
        "max_offsets_per_group": k.max_offsets_per_group,
        "fetch_max_bytes": k.fetch_max_bytes,
        "max_partitions_per_fetch": k.max_partitions_per_fetch,
        "request_timeout_ms": k.request_timeout_ms,
        "max_connections_per_ip": k.max_connections_per_ip,
        **_security_effective(k),
        "catalog_refresh_ms": k.catalog_refresh_ms,
    }


def _plain_path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _security_effective(k: KafkaConfig) -> dict[str, Any]:
    s = k.security
    return {"sasl_mechanisms": list(s.sasl_mechanisms),
            "allow_plaintext_sasl": s.allow_plaintext_sasl,
            "tls_client_ca": _plain_path(s.tls_client_ca),
            "tls_principal_rule": [r.pattern.pattern if r.pattern else "DEFAULT"
                                   for r in s.tls_principal_rules],
            "allow_everyone_if_no_acl": s.allow_everyone_if_no_acl,
            "super_users": list(s.super_users), "session_lifetime_ms": s.session_lifetime_ms}


def _plain(value: str | None) -> str | None:
    return None if value is None else str(value)


def _render(name: str, scope: Scope, value: Value, mask: bool) -> Value:
    prop = REGISTRY[scope][name]
    if value is None:
        return -1 if prop.unlimited else None
    if prop.secret:
        return MASK if mask else str(value)
    return value


# every TopicConfig field but the derived ones is a topic property: keep the two in step
_DERIVED = {"topic", "merge_target_bytes", "merge_min_bytes", "overrides"}
if {f.name for f in fields(TopicConfig)} - _DERIVED != set(TOPIC_FIELDS.values()):
    raise RuntimeError("TopicConfig fields and tiered.config.properties.TOPIC are out of step")
