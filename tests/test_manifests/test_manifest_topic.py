"""Topic manifests (manifests.topic): enough to recreate a topic from the bucket alone.

Defends docs/format.md (topic manifests under a fixed set of prefixes, enumerable by
recovery; versioned JSON) and design invariant 9 for hostile names and corrupt bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests import keys
from manifests.errors import (
    CorruptManifest,
    InvalidTopicName,
    InvalidUpdate,
    UnsupportedManifestVersion,
)
from manifests.topic import (
    TopicManifest,
    decode_topic_manifest,
    encode_topic_manifest,
    iter_topic_manifest_keys,
    load_topic_manifest,
    save_topic_manifest,
)
from tiered.store.base import ObjectStore


def orders(**changes: object) -> TopicManifest:
    fields: dict[str, object] = {
        "topic": "orders",
        "revision": "VlW-VOROSYi0AhRbbvnJ5g",
        "partition_count": 6,
        "replication_factor": 3,
        "cleanup_policy": "delete,compact",
        "retention_ms": 7 * 24 * 3600 * 1000,
        "retention_bytes": None,
        "retention_local_target_ms": 3600 * 1000,
        "retention_local_target_bytes": None,
        "segment_bytes": 1 << 30,
        "segment_ms": None,
        "properties": {"redpanda.remote.write": "true"},
    }
    fields.update(changes)
    return TopicManifest(**fields)  # type: ignore[arg-type]


def test_round_trip_and_normalized_cleanup_policy() -> None:
    t = orders()
    assert t.cleanup_policy == "compact,delete"
    back = decode_topic_manifest(encode_topic_manifest(t))
    assert back == t and back.properties["redpanda.remote.write"] == "true"


@settings(deadline=None)
@given(
    st.integers(1, 2**31 - 1),
    st.one_of(st.none(), st.integers(0, 2**62)),
    st.sampled_from(["delete", "compact", "compact,delete"]),
)
def test_round_trip_property(partitions: int, retention: int | None, policy: str) -> None:
    t = orders(partition_count=partitions, retention_bytes=retention, cleanup_policy=policy)
    assert decode_topic_manifest(encode_topic_manifest(t)) == t


def test_from_topic_config_takes_the_settings_in_force(tmp_path: Path) -> None:
    from tiered.config import default_config

    config = default_config(tmp_path).topic_config("orders")
    t = TopicManifest.from_topic_config(config, revision=5, partition_count=3)
    assert (t.topic, t.revision, t.partition_count) == ("orders", "5", 3)
    assert t.retention_ms == config.retention_ms and t.segment_bytes == config.segment_bytes
    assert t.cleanup_policy == config.cleanup_policy


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"topic": "../x"}, InvalidTopicName, "topic name"),
        ({"partition_count": 0}, InvalidUpdate, "partition_count"),
        ({"cleanup_policy": "forever"}, InvalidUpdate, "cleanup_policy"),
        ({"retention_ms": -1}, InvalidUpdate, "retention_ms"),
        ({"replication_factor": 0}, InvalidUpdate, "replication_factor"),
        ({"properties": {"x": 1}}, InvalidUpdate, "properties"),
    ],
)
def test_impossible_topic_manifests_are_refused(
    changes: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        orders(**changes)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("partition_count", "6", "partition_count must be an integer"),
        ("topic", "a/b", "topic name"),
        ("properties", [], "properties must be an object"),
        ("cleanup_policy", "nope", "cleanup_policy"),
        ("revision", 5, "revision must be a string"),
    ],
)
def test_corrupt_topic_manifests_are_refused(field: str, value: object, message: str) -> None:
    doc = json.loads(encode_topic_manifest(orders()))
    doc[field] = value
    with pytest.raises(CorruptManifest, match=message):
        decode_topic_manifest(json.dumps(doc).encode(), key="k")


def test_newer_topic_manifest_version_is_refused() -> None:
    doc = json.loads(encode_topic_manifest(orders()))
    doc["version"] = 9
    with pytest.raises(UnsupportedManifestVersion):
        decode_topic_manifest(json.dumps(doc).encode())


def test_save_load_and_enumerate_for_recovery(store: ObjectStore) -> None:
    assert load_topic_manifest(store, "orders", "VlW-VOROSYi0AhRbbvnJ5g") is None
    first = orders()
    etag = save_topic_manifest(store, first)
    assert save_topic_manifest(store, first) == etag  # identical: left alone
    changed = orders(retention_ms=1000)
    save_topic_manifest(store, changed)
    assert load_topic_manifest(store, "orders", first.revision) == changed
    others = [orders(topic=f"t{i}", revision=str(i)) for i in range(20)]
    for t in others:
        save_topic_manifest(store, t)
    store.put("10000000/topics/not-a-manifest.txt", b"x")  # foreign object under a prefix
    found = {(topic, rev) for topic, rev, _ in iter_topic_manifest_keys(store)}
    assert found == {("orders", first.revision)} | {(t.topic, t.revision) for t in others}


def test_the_saved_partition_count_never_goes_down(store: ObjectStore) -> None:
    # sidecars beside different brokers each see only the partitions they have replicas of
    save_topic_manifest(store, orders(partition_count=24))
    save_topic_manifest(store, orders(partition_count=19, retention_ms=1000))
    stored = load_topic_manifest(store, "orders", orders().revision)
    assert stored == orders(partition_count=24, retention_ms=1000)
    save_topic_manifest(store, orders(partition_count=30, retention_ms=1000))
    assert load_topic_manifest(store, "orders", orders().revision) == orders(
        partition_count=30, retention_ms=1000)


def test_topic_manifest_under_the_wrong_key_is_refused(store: ObjectStore) -> None:
    t = orders()
    store.put(keys.topic_manifest_key("other", t.revision), encode_topic_manifest(t))
    with pytest.raises(CorruptManifest, match="describes topic 'orders'"):
        load_topic_manifest(store, "other", t.revision)
