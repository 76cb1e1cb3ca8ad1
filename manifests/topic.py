"""Topic manifests: what recovery needs to recreate a topic from the bucket alone.

One small JSON object per (topic, revision) under one of 16 fixed prefixes
(`keys.topic_manifest_prefixes()`), so recovery enumerates topics with 16 listings. It holds
the name, revision, partition count and the retention and cleanup settings in force when it was
written (None = no limit, Kafka's -1), plus any other topic-level overrides verbatim.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from manifests import keys
from manifests.cas import put_on_version, swap
from manifests.errors import CorruptManifest, InvalidName, InvalidUpdate, ManifestError
from manifests.model import FORMAT_VERSION
from manifests.serde import load_document
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound

if TYPE_CHECKING:
    from tiered.config import TopicConfig

KIND_TOPIC = "topic"
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
#: how long two processes saving the same topic manifest at once keep retrying, seconds
SAVE_DEADLINE_S = 30.0

_FIELDS = (
    "version",
    "kind",
    "topic",
    "revision",
    "partition_count",
    "replication_factor",
    "cleanup_policy",
    "retention_ms",
    "retention_bytes",
    "retention_local_target_ms",
    "retention_local_target_bytes",
    "segment_bytes",
    "segment_ms",
    "properties",
)
_LIMITS = (
    "retention_ms",
    "retention_bytes",
    "retention_local_target_ms",
    "retention_local_target_bytes",
    "segment_bytes",
    "segment_ms",
)


def _normal_policy(policy: str) -> str | None:
    parts = sorted(p.strip() for p in policy.split(",")) if isinstance(policy, str) else []
    joined = ",".join(parts)
    return joined if joined in CLEANUP_POLICIES else None


@dataclass(frozen=True)
class TopicManifest:
    """A topic's identity and settings in force. Limits of None mean "no limit"."""

    topic: str
    revision: str
    partition_count: int
    replication_factor: int | None = None
    #: `delete`, `compact` or `compact,delete` (normalized order)
    cleanup_policy: str = "delete"
    retention_ms: int | None = None
    retention_bytes: int | None = None
    retention_local_target_ms: int | None = None
    retention_local_target_bytes: int | None = None
    segment_bytes: int | None = None
    segment_ms: int | None = None
    #: other topic-level overrides by their dotted names, values as configured
    properties: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        keys.validate_topic_name(self.topic)
        object.__setattr__(self, "revision", keys.validate_revision(self.revision))
        if (
            type(self.partition_count) is not int
            or not 1 <= self.partition_count <= keys.MAX_PARTITION
        ):
            raise InvalidUpdate(
                f"{self.topic}: partition_count must be >= 1, got {self.partition_count!r}"
            )
        rf = self.replication_factor
        if rf is not None and (type(rf) is not int or not 1 <= rf <= 32767):
            raise InvalidUpdate(f"{self.topic}: replication_factor must be 1..32767, got {rf!r}")
        policy = _normal_policy(self.cleanup_policy)
        if policy is None:
            raise InvalidUpdate(
                f"{self.topic}: cleanup_policy must be one of {', '.join(CLEANUP_POLICIES)}, got "
                f"{self.cleanup_policy!r}"
            )
        object.__setattr__(self, "cleanup_policy", policy)
        for name in _LIMITS:
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidUpdate(f"{self.topic}: {name} must be >= 0 or None, got {value!r}")
        props = dict(self.properties)
        for k, v in props.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k:
                raise InvalidUpdate(f"{self.topic}: properties must map names to strings")
        object.__setattr__(self, "properties", MappingProxyType(props))

    @property
    def key(self) -> str:
        return keys.topic_manifest_key(self.topic, self.revision)

    @classmethod
    def from_topic_config(
        cls,
        config: TopicConfig,
        *,
        revision: str | int,
        partition_count: int,
        replication_factor: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> TopicManifest:
        """From the effective settings `tiered.config.Config.topic_config` resolves."""
        return cls(
            topic=config.topic,
            revision=str(revision),
            partition_count=partition_count,
            replication_factor=replication_factor,
            cleanup_policy=config.cleanup_policy,
            retention_ms=config.retention_ms,
            retention_bytes=config.retention_bytes,
            retention_local_target_ms=config.retention_local_target_ms,
            retention_local_target_bytes=config.retention_local_target_bytes,
            segment_bytes=config.segment_bytes,
            segment_ms=config.segment_ms,
            properties=properties or {},
        )


def encode_topic_manifest(t: TopicManifest) -> bytes:
    doc: dict[str, Any] = {"version": FORMAT_VERSION, "kind": KIND_TOPIC}
    for name in _FIELDS[2:]:
        value = getattr(t, name)
        doc[name] = dict(sorted(value.items())) if name == "properties" else value
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def decode_topic_manifest(data: bytes, *, key: str | None = None) -> TopicManifest:
    """Parse a topic manifest; `CorruptManifest` / `UnsupportedManifestVersion` on bad input."""
    doc = load_document(data, key, KIND_TOPIC, _FIELDS)
    fields = {name: doc[name] for name in _FIELDS[2:]}
    if not isinstance(fields["properties"], dict):
        raise CorruptManifest("properties must be an object", key=key)
    for name in ("partition_count", "replication_factor", *_LIMITS):
        if fields[name] is not None and type(fields[name]) is not int:
            raise CorruptManifest(f"{name} must be an integer or null", key=key)
    if type(fields["revision"]) is int:
        raise CorruptManifest("revision must be a string", key=key)
    try:
        return TopicManifest(**fields)
    except (InvalidName, InvalidUpdate, TypeError) as exc:
        raise CorruptManifest(str(exc), key=key) from exc


def _read(store: ObjectStore, key: str) -> tuple[bytes, str] | None:
    try:
        data = store.get(key)  # bytes and their ETag in one response
    except ObjectNotFound:
        return None
    return data, data.etag


def load_topic_manifest(
    store: ObjectStore, topic: str, revision: str | int
) -> TopicManifest | None:
    """The stored topic manifest, or None if there is none."""
    key = keys.topic_manifest_key(topic, revision)
    got = _read(store, key)
    if got is None:
        return None
    t = decode_topic_manifest(got[0], key=key)
    if t.key != key:
        raise CorruptManifest(f"describes topic {t.topic!r} revision {t.revision}", key=key)
    return t


def save_topic_manifest(store: ObjectStore, manifest: TopicManifest) -> str:
    """Store `manifest` (created with If-None-Match, replaced with If-Match on the version just
    read, so a concurrent save is never torn or silently lost in between). Returns the ETag;
    an identical stored manifest is left alone.

    The partition count never goes down: a Kafka topic only ever gains partitions, and each
    writer may see only some of them (a sidecar beside a broker holds the replicas on that
    broker), so the stored count stays the largest any writer saw."""
    key = manifest.key

    def attempt() -> str:
        got = _read(store, key)
        if got is None:
            return put_on_version(store, key, encode_topic_manifest(manifest), None)
        try:
            stored = decode_topic_manifest(got[0], key=key).partition_count
        except ManifestError:
            stored = 0  # a damaged one is replaced whole
        data = encode_topic_manifest(dataclasses.replace(
            manifest, partition_count=max(manifest.partition_count, stored)))
        if got[0] == data:
            return got[1]
        return put_on_version(store, key, data, got[1])

    return swap(attempt, key=key, what="the topic manifest", deadline_s=SAVE_DEADLINE_S)


def iter_topic_manifest_keys(store: ObjectStore) -> Iterator[tuple[str, str, str]]:
    """(topic, revision, key) of every topic manifest in the bucket: 16 listings, foreign
    objects under the prefixes ignored. Recovery loads each and reports the bad ones."""
    for prefix in keys.topic_manifest_prefixes():
        for info in store.list(prefix):
            parsed = keys.parse_topic_manifest_key(info.key)
            if parsed is not None:
                yield parsed[0], parsed[1], info.key
