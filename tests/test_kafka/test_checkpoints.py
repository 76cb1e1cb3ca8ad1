"""Kafka checkpoint files and partition.metadata: byte-exact round trips, Kafka's own
leniencies (empty file), and clear errors naming file and line for malformed ones."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tiered.kafka.checkpoints import (
    CheckpointError,
    EpochEntry,
    InvalidTopicPartition,
    TopicPartition,
    new_topic_id,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    read_partition_metadata,
    topic_id_from_str,
    topic_id_to_str,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
    write_partition_metadata,
)


def test_offset_checkpoint_round_trip_is_kafkas_format(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    offsets = {TopicPartition("orders", 0): 1200, TopicPartition("my.topic-with-dashes", 12): 7}
    write_offset_checkpoint(path, offsets)
    assert path.read_text() == "0\n2\nmy.topic-with-dashes 12 7\norders 0 1200\n"
    assert read_offset_checkpoint(path) == offsets
    assert not (tmp_path / "replication-offset-checkpoint.tmp").exists()


def test_offset_checkpoint_written_by_kafka_parses(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_text("0\n3\n__consumer_offsets 22 0\norders 1 980\norders  0\t1200\n")
    assert read_offset_checkpoint(path) == {
        TopicPartition("__consumer_offsets", 22): 0,
        TopicPartition("orders", 1): 980,
        TopicPartition("orders", 0): 1200,
    }


@pytest.mark.parametrize("text", ["", "0\n", "0\n0\n"], ids=["empty", "version-only", "none"])
def test_empty_checkpoints_are_empty_as_in_kafka(tmp_path: Path, text: str) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    path.write_text(text)
    assert read_offset_checkpoint(path) == {}


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("1\n0\n", 1, "version"),
        ("zero\n0\n", 1, "version"),
        ("0\nmany\n", 2, "entry count"),
        ("0\n2\norders 0 5\n", 2, "expected 2 entries, found 1"),
        ("0\n1\norders 0 5\norders 1 6\n", 2, "expected 1 entries, found 2"),
        ("0\n1\norders 0\n", 3, "topic partition offset"),
        ("0\n1\norders x 5\n", 3, "partition"),
        ("0\n1\norders 0 5.5\n", 3, "offset"),
        ("0\n1\norders 0 -5\n", 3, "negative"),
        ("0\n1\n../etc 0 5\n", 3, "illegal topic"),
        ("0\n2\norders 0 5\n\n", 4, "topic partition offset"),
    ],
)
def test_malformed_offset_checkpoints_name_file_and_line(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    path.write_text(text)
    with pytest.raises(CheckpointError) as err:
        read_offset_checkpoint(path)
    assert err.value.path == str(path)
    assert err.value.line == line
    assert fragment in str(err.value)
    assert f"{path}, line {line}" in str(err.value)


def test_binary_garbage_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CheckpointError, match="UTF-8"):
        read_offset_checkpoint(path)


def test_leader_epoch_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    entries = [EpochEntry(0, 0), EpochEntry(3, 1500), EpochEntry(4, 1500), EpochEntry(7, 9000)]
    write_leader_epoch_checkpoint(path, entries)
    assert path.read_text() == "0\n4\n0 0\n3 1500\n4 1500\n7 9000\n"
    assert read_leader_epoch_checkpoint(path) == entries


@pytest.mark.parametrize(
    ("body", "line"),
    [("2\n3 10\n3 20\n", 4), ("2\n4 10\n3 20\n", 4), ("2\n3 20\n4 10\n", 4),
     ("1\n3\n", 3), ("1\n-1 0\n", 3)],
    ids=["repeated-epoch", "epoch-goes-back", "offset-goes-back", "one-field", "negative"],
)
def test_malformed_leader_epoch_checkpoint(tmp_path: Path, body: str, line: int) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n" + body)
    with pytest.raises(CheckpointError) as err:
        read_leader_epoch_checkpoint(path)
    assert err.value.line == line


def test_topic_ids_use_kafkas_uuid_string() -> None:
    # Kafka's Uuid.METADATA_TOPIC_ID is Uuid(0, 1), printed "AAAAAAAAAAAAAAAAAAAAAQ"
    assert topic_id_to_str(uuid.UUID(int=1)) == "AAAAAAAAAAAAAAAAAAAAAQ"
    some = uuid.UUID("7f2c5a1e-3b4d-4e6f-8a9b-0c1d2e3f4a5b")
    text = topic_id_to_str(some)
    assert len(text) == 22 and "=" not in text
    assert topic_id_from_str(text) == some
    for bad in ["short", "A" * 23, "!" * 22, "AAAAAAAAAAAAAAAAAAAAAR"]:
        with pytest.raises(ValueError):
            topic_id_from_str(bad)


def test_new_topic_ids_are_never_reserved_or_dash_led() -> None:
    ids = {new_topic_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(not topic_id_to_str(i).startswith("-") for i in ids)
    assert uuid.UUID(int=0) not in ids and uuid.UUID(int=1) not in ids


def test_partition_metadata_round_trip_is_kafkas_encoding(tmp_path: Path) -> None:
    path = tmp_path / "partition.metadata"
    topic_id = uuid.UUID("7f2c5a1e-3b4d-4e6f-8a9b-0c1d2e3f4a5b")
    write_partition_metadata(path, topic_id)
    assert path.read_text() == f"version: 0\ntopic_id: {topic_id_to_str(topic_id)}"
    assert read_partition_metadata(path) == topic_id
    path.write_text(f"version: 0\ntopic_id: {topic_id_to_str(topic_id)}\n")  # newline tolerated
    assert read_partition_metadata(path) == topic_id


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("version: 1\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ", 1),
        ("version 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ", 1),
        ("version: 0\ntopic: AAAAAAAAAAAAAAAAAAAAAQ", 2),
        ("version: 0\ntopic_id: not-a-uuid", 2),
        ("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", 2),
        ("version: 0\n", None),
    ],
    ids=["version", "no-colon", "key", "id", "zero-id", "one-line"],
)
def test_malformed_partition_metadata(tmp_path: Path, text: str, line: int | None) -> None:
    path = tmp_path / "partition.metadata"
    path.write_text(text)
    with pytest.raises(CheckpointError) as err:
        read_partition_metadata(path)
    assert err.value.line == line
    assert str(path) in str(err.value)


def test_atomic_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    path.write_text("0\n1\nold 0 1\n")
    write_offset_checkpoint(path, {TopicPartition("new", 0): 2})
    assert read_offset_checkpoint(path) == {TopicPartition("new", 0): 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replication-offset-checkpoint"]


def test_topic_partition_parsing_and_validation() -> None:
    assert TopicPartition.parse("my.topic-with-dashes-12") == TopicPartition(
        "my.topic-with-dashes", 12)
    assert TopicPartition.parse("__consumer_offsets-49").dir_name == "__consumer_offsets-49"
    assert TopicPartition.parse("a--1") == TopicPartition("a-", 1)
    for bad in ["notapartition", "orders-", "-0", "orders-x", "orders-1.5", "orders-\u0661",
                "../x-0", "..-0", "a b-0", "x.abc123-future"]:
        with pytest.raises(InvalidTopicPartition):
            TopicPartition.parse(bad)
    for topic, partition in [("", 0), ("a/b", 0), (".", 0), ("t" * 250, 0), ("ok", -1)]:
        with pytest.raises(InvalidTopicPartition):
            TopicPartition(topic, partition)
    assert TopicPartition("t" * 249, 0).topic == "t" * 249
