"""Key layout (manifests.keys): one deterministic scheme every package uses.

Defends docs/format.md (hash prefix, keys derivable from topic/partition/revision,
topic manifests under fixed prefixes, no ':') and design invariant 9 (hostile topic names refused).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests import keys
from manifests.errors import InvalidName, InvalidTopicName
from tiered.errors import TieredError

LEGAL_TOPIC = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
    min_size=1,
    max_size=249,
).filter(lambda t: t not in (".", ".."))
REVISION = st.one_of(
    st.integers(min_value=0, max_value=2**63),
    st.text(
        alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
        min_size=1,
        max_size=64,
    ),
)
KEY_CHARS = re.compile(r"[A-Za-z0-9._/-]+")


def test_golden_keys_are_stable_across_releases() -> None:
    """Pinned values: a reader of a later release must find objects an earlier one wrote."""
    assert keys.partition_manifest_key("orders", 0, "abc") == (
        "20a325ba/meta/kafka/orders/0_abc/manifest.json"
    )
    assert (
        keys.segment_key("orders", 0, "abc", 0, 99, 3) == "20a325ba/kafka/orders/0_abc/0-99-3.log"
    )
    assert keys.index_key("orders", 0, "abc", 0, 99, 3, kind="timeindex") == (
        "20a325ba/kafka/orders/0_abc/0-99-3.timeindex"
    )
    assert keys.archived_manifest_key(
        "orders", 0, "abc", 0, 99, 1700000000000, 1700000005000, 0, 0xDEADBEEF
    ) == (
        "20a325ba/meta/kafka/orders/0_abc/manifest.json.0.99.1700000000000.1700000005000.0.deadbeef"
    )
    assert (
        keys.topic_manifest_key("orders", "abc") == "10000000/topics/orders/abc/topic_manifest.json"
    )


def test_partition_hash_differs_by_revision_so_recreated_topics_never_collide() -> None:
    assert keys.partition_manifest_key("orders", 0, 1) != keys.partition_manifest_key(
        "orders", 0, 2
    )
    assert keys.partition_hash("orders", 0, 1) != keys.partition_hash("orders", 1, 1)


def test_integer_and_string_revisions_name_the_same_key() -> None:
    assert keys.partition_manifest_key("t", 3, 17) == keys.partition_manifest_key("t", 3, "17")


@settings(deadline=None)
@given(LEGAL_TOPIC, st.integers(0, 2**31 - 1), REVISION)
def test_every_key_is_safe_and_derivable(topic: str, partition: int, revision: str | int) -> None:
    """No ':' or odd characters, no empty / '.' / '..' components, hash prefix of 8 hex."""
    made = [
        keys.partition_manifest_key(topic, partition, revision),
        keys.segment_key(topic, partition, revision, 5, 9, 2, generation=1),
        keys.index_key(topic, partition, revision, 5, 9, 2),
        keys.archived_manifest_key(topic, partition, revision, 5, 9, -1, -1, 2, 7),
        keys.topic_manifest_key(topic, revision),
    ]
    for key in made:
        assert ":" not in key
        assert KEY_CHARS.fullmatch(key), key
        parts = key.split("/")
        assert all(p not in ("", ".", "..") for p in parts), key
        assert re.fullmatch(r"[0-9a-f]{8}", parts[0])
    # recovery can parse a listed topic manifest key back
    assert keys.parse_topic_manifest_key(made[4]) == (topic, keys.validate_revision(revision))


HOSTILE_TOPICS = [
    "../x",
    "..",
    ".",
    "",
    "a" * 250,
    "a/b",
    "a:b",
    "a b",
    "naïve",
    "a\x00b",
    "x\n",
    "%2e%2e",
]


@pytest.mark.parametrize("topic", HOSTILE_TOPICS)
def test_hostile_topic_names_are_refused_with_a_clear_error(topic: str) -> None:
    with pytest.raises(InvalidTopicName) as info:
        keys.partition_manifest_key(topic, 0, 1)
    assert isinstance(info.value, TieredError)
    assert "topic name" in str(info.value)
    with pytest.raises(InvalidTopicName):
        keys.topic_manifest_key(topic, 1)


def test_longest_legal_topic_name_is_accepted() -> None:
    assert keys.validate_topic_name("a" * 249) == "a" * 249


def test_non_string_topic_is_refused() -> None:
    with pytest.raises(InvalidTopicName, match="must be a string"):
        keys.validate_topic_name(b"orders")


@pytest.mark.parametrize("partition", [-1, 2**31, True, "0", 1.0, None])
def test_bad_partitions_are_refused(partition: object) -> None:
    with pytest.raises(InvalidName, match="partition"):
        keys.partition_manifest_key("orders", partition, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("revision", [-1, "", "a/b", "a:b", "a.b", "x" * 65, None, 1.5, "../"])
def test_bad_revisions_are_refused(revision: object) -> None:
    with pytest.raises(InvalidName, match="revision"):
        keys.partition_manifest_key("orders", 0, revision)  # type: ignore[arg-type]


def test_kafka_topic_id_is_a_valid_revision() -> None:
    topic_id = "VlW-VOROSYi0AhRbbvnJ5g"  # base64url, as in partition.metadata
    assert keys.partition_manifest_key("orders", 0, topic_id).endswith(
        f"/0_{topic_id}/manifest.json"
    )


def test_segment_names_carry_the_writer_term_and_a_generation() -> None:
    assert keys.segment_name(0, 99, 3) == "0-99-3.log"
    assert keys.segment_name(0, 99, 3, generation=2) == "0-99-3-2.log"
    assert keys.parse_segment_name("0-99-3-2.log") == keys.SegmentName(0, 99, 3, 2)
    assert keys.parse_segment_name("0-99-3.log") == keys.SegmentName(0, 99, 3, 0)
    assert keys.parse_segment_name("manifest.json") is None
    assert keys.index_name("0-99-3-2.log", "index") == "0-99-3-2.index"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, 4, 1), "last offset 4 < base offset 5"),
        ((-1, 4, 1), "base_offset"),
        ((0, 4, -2), "term"),
    ],
)
def test_bad_segment_name_parts_are_refused(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(InvalidName, match=message):
        keys.segment_name(*args)


def test_unknown_index_kind_is_refused() -> None:
    with pytest.raises(InvalidName, match="unknown index kind"):
        keys.index_name("0-1-1.log", "bloom")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a:b", "x" * 256])
def test_bad_object_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidName):
        keys.object_key("orders", 0, 1, name)


def test_archived_manifest_names_round_trip_including_missing_timestamps() -> None:
    name = keys.archived_manifest_name(10, 20, -1, -1, 1, 0xAB)
    assert name == "manifest.json.10.20.-1.-1.1.000000ab"
    assert keys.parse_archived_manifest_name(name) == keys.ArchiveName(10, 20, -1, -1, 1, 0xAB)
    assert keys.parse_archived_manifest_name("manifest.json") is None
    assert keys.parse_archived_manifest_name("manifest.json.1.2.3.4.5") is None
    with pytest.raises(InvalidName):
        keys.archived_manifest_name(0, 1, 0, 0, 0, 2**32)


def test_topic_manifests_live_under_sixteen_fixed_prefixes() -> None:
    prefixes = keys.topic_manifest_prefixes()
    assert len(prefixes) == len(set(prefixes)) == 16
    for topic in ("orders", "payments", "a", "b" * 249, "x.y-z_1"):
        key = keys.topic_manifest_key(topic, 7)
        assert sum(key.startswith(p) for p in prefixes) == 1


@pytest.mark.parametrize(
    "key",
    [
        "10000000/topics/orders/abc/other.json",
        "10000000/topics/orders/abc/def/topic_manifest.json",
        "20000000/topics/orders/abc/topic_manifest.json",  # wrong prefix digit for the topic
        "10000000/topics/../abc/topic_manifest.json",
    ],
)
def test_foreign_objects_under_topic_prefixes_are_not_parsed_as_topics(key: str) -> None:
    assert keys.parse_topic_manifest_key(key) is None
