"""Kafka's group tools against the endpoint's own groups (docs/kafka-api.md, "Group tools"):
real admin clients (kafka-python's KafkaAdminClient, confluent-kafka's AdminClient) list,
describe and delete a group whose member consumes through a running `tiered run`, and
`tiered groups list|describe|delete` does the same from the bucket."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import kafka
import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata
from support.kafka_endpoint import TOPIC, History, bootstrap
from support.waiting import wait_until

from manifests.group_offsets import CommittedOffset, commit_group_offsets, load_group_offsets
from tiered.app.daemon import Daemon
from tiered.cli.main import cli
from tiered.store import S3Store

pytestmark = pytest.mark.timeout(300)


def _store(history: History) -> S3Store:
    return history.store()


def _offsets(history: History, group: str) -> dict[tuple[str, int], int] | None:
    with _store(history) as store:
        got, etag = load_group_offsets(store, group)
    return None if etag is None else {tp: c.offset for tp, c in got.offsets.items()}


@pytest.fixture
def kp_admin(daemon: Daemon) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(daemon), client_id="kp-admin")
    yield admin
    admin.close()


def test_kafka_python_admin_lists_describes_and_deletes_a_group(
        history: History, daemon: Daemon, kp_admin: KafkaAdminClient) -> None:
    group = f"kp-admin-{uuid.uuid4().hex[:8]}"
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap(daemon), client_id="kp-member",
                                   group_id=group, enable_auto_commit=False,
                                   auto_offset_reset="earliest", session_timeout_ms=10_000,
                                   metadata_max_age_ms=2_000)
    try:
        # the topic's partitions known first: kafka-python joins without them and may
        # then keep an empty assignment (tests/test_kafka_api/test_clients.py)
        assert consumer.partitions_for_topic(TOPIC) == {0, 1}
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 60
        while len(consumer.assignment()) < 2 and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200, max_records=1)
        assert len(consumer.assignment()) == 2, "the member was never assigned the partitions"
        consumer.commit({kafka.TopicPartition(TOPIC, p): OffsetAndMetadata(3 + p, "", -1)
                         for p in (0, 1)})

        listed = {g["group_id"]: g for g in kp_admin.list_groups()}
        assert listed[group]["protocol_type"] == "consumer"
        assert listed[group]["group_state"] == "Stable"

        described = kp_admin.describe_groups([group])[group]
        assert described["error"] is None
        assert described["group_state"] == "Stable"
        assert described["protocol_type"] == "consumer"
        assert [m["client_id"] for m in described["members"]] == ["kp-member"]

        # a group with a member is not deleted, nor the offsets of a topic it subscribes to
        assert kp_admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
        kept = kp_admin.delete_group_offsets(group, [kafka.TopicPartition(TOPIC, 0)])
        assert kept == {kafka.TopicPartition(TOPIC, 0): kafka.errors.GroupSubscribedToTopicError}
        assert _offsets(history, group) == {(TOPIC, 0): 3, (TOPIC, 1): 4}
    finally:
        consumer.close(autocommit=False)  # leaves the group: it is Empty now

    assert {g["group_id"]: g["group_state"] for g in kp_admin.list_groups()}[group] == "Empty"
    dropped = kp_admin.delete_group_offsets(group, [kafka.TopicPartition(TOPIC, 0)])
    assert dropped == {kafka.TopicPartition(TOPIC, 0): kafka.errors.NoError}
    assert _offsets(history, group) == {(TOPIC, 1): 4}
    assert kp_admin.delete_groups([group]) == {group: "OK"}
    assert _offsets(history, group) is None
    assert group not in {g["group_id"] for g in kp_admin.list_groups()}
    assert kp_admin.describe_groups([group])[group]["group_state"] == "Dead"
    assert kp_admin.delete_groups([group]) == {group: "GroupIdNotFoundError"}


def test_confluent_admin_lists_describes_and_deletes_a_group(history: History,
                                                             daemon: Daemon) -> None:
    """A consumer that assigns its partitions itself commits (the group never has members);
    librdkafka's admin client finds it, describes it Empty and deletes it."""
    group = f"ck-admin-{uuid.uuid4().hex[:8]}"
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap(daemon),
                                         "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[confluent_kafka.TopicPartition(TOPIC, 0, 7)],
                        asynchronous=False)
    finally:
        consumer.close()
    assert _offsets(history, group) == {(TOPIC, 0): 7}

    admin = AdminClient({"bootstrap.servers": bootstrap(daemon)})
    listed = admin.list_consumer_groups(request_timeout=30).result()
    assert not listed.errors
    mine = [g for g in listed.valid if g.group_id == group]
    assert len(mine) == 1 and mine[0].state == confluent_kafka.ConsumerGroupState.EMPTY

    described = admin.describe_consumer_groups([group], request_timeout=30)[group].result()
    assert described.group_id == group and described.members == []
    assert described.state == confluent_kafka.ConsumerGroupState.EMPTY

    assert admin.delete_consumer_groups([group], request_timeout=30)[group].result() is None
    assert _offsets(history, group) is None
    wait_until(lambda: group not in {g.group_id for g in
                                     admin.list_consumer_groups(request_timeout=30)
                                     .result().valid},
               "the deleted group to leave the list")


# --- the CLI -------------------------------------------------------------------------------------


def _config_file(history: History, tmp_path: Path) -> Path:
    s = history.storage
    path = tmp_path / "tiered.toml"
    path.write_text(
        f'[storage]\nurl = "{s["url"]}"\nendpoint_url = "{s["endpoint_url"]}"\n'
        f'region = "us-east-1"\naccess_key = "testing"\nsecret_key = "testing"\n'
        f'[log]\ndirs = ["{history.log_dir}"]\n')
    return path


def test_cli_lists_describes_and_deletes_groups(history: History, tmp_path: Path) -> None:
    group = f"cli-{uuid.uuid4().hex[:8]}"
    with _store(history) as store:
        commit_group_offsets(store, group, {
            (TOPIC, 0): CommittedOffset(12, 3, "why", 1_700_000_000_000),
            (TOPIC, 1): CommittedOffset(5, -1, None, 1_700_000_001_000)})
    config = str(_config_file(history, tmp_path))
    runner = CliRunner()

    listed = runner.invoke(cli, ["groups", "list", "--config", config, "--json"])
    assert listed.exit_code == 0, listed.output
    assert group in [g["group"] for g in json.loads(listed.output)["groups"]]
    human = runner.invoke(cli, ["groups", "list", "--config", config])
    assert human.exit_code == 0 and group in human.output

    described = runner.invoke(cli, ["groups", "describe", group, "--config", config, "--json"])
    assert described.exit_code == 0, described.output
    assert json.loads(described.output) == {"missing": [], "groups": [{"group": group, "offsets": [
        {"topic": TOPIC, "partition": 0, "offset": 12, "leader_epoch": 3, "metadata": "why",
         "commit_timestamp": 1_700_000_000_000},
        {"topic": TOPIC, "partition": 1, "offset": 5, "leader_epoch": -1, "metadata": None,
         "commit_timestamp": 1_700_000_001_000}]}]}
    human = runner.invoke(cli, ["groups", "describe", group, "--config", config])
    assert human.exit_code == 0
    assert f"{TOPIC}-0  offset 12  epoch 3  committed 2023-11-14T22:13:20Z  'why'" in human.output

    deleted = runner.invoke(cli, ["groups", "delete", group, "--config", config])
    assert deleted.exit_code == 0, deleted.output
    assert f"deleted the committed offsets of group {group}" in deleted.output
    assert _offsets(history, group) is None

    # a group with no offsets in the bucket: exit 7 and a clear line, no traceback
    for command in ("describe", "delete"):
        gone = runner.invoke(cli, ["groups", command, group, "--config", config])
        assert gone.exit_code == 7, gone.output
        assert f"no committed offsets in the bucket for group(s) {group!r}" in gone.output
        assert "Traceback" not in gone.output
