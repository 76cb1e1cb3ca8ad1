"""Committed offsets are validated and bounded (docs/kafka-api.md, "Group limits"): an
OffsetCommit for a topic or partition the endpoint does not serve, an offset below -1 or
metadata over `offset_metadata_max_bytes` is refused and nothing is stored; a group holds
offsets for at most `max_offsets_per_group` partitions and the bucket for at most
`max_groups` groups; offsets retention collects what expired. Real daemon, real moto S3, raw
OffsetCommit requests (kio) so every field is the test's."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from support.daemons import running
from support.kafka_endpoint import TOPIC, TXN_TOPIC, History, RawClient, request_class
from support.waiting import wait_until

from manifests import keys
from manifests.group_offsets import (
    CommittedOffset,
    GroupOffsets,
    commit_group_offsets,
    iter_group_objects,
    load_group_offsets,
)
from tiered.app.daemon import Daemon
from tiered.app.kafka_api.coordinator import GroupSettings, JoinRequest
from tiered.app.kafka_api.groups import GroupCoordinator, OffsetLimits
from tiered.app.kafka_api.messages import build, nested
from tiered.store import StoreSettings
from tiered.store.s3 import S3Store

pytestmark = pytest.mark.timeout(300)

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
METADATA_MAX = 1000
MAX_OFFSETS = 2


def _store(history: History) -> S3Store:
    return history.store()


def _stored(history: History, group: str) -> dict[tuple[str, int], CommittedOffset] | None:
    """The group's offsets in the bucket, None when it has no object."""
    with _store(history) as store:
        got, etag = load_group_offsets(store, group)
    return None if etag is None else dict(got.offsets)


@pytest.fixture(scope="module")
def bounded(history: History) -> Iterator[Daemon]:
    # Kafka's name for the metadata limit, as an operator pasting broker settings writes it
    config = history.config(cache="cache-bounded", kafka={
        "offset.metadata.max.bytes": METADATA_MAX, "max_offsets_per_group": MAX_OFFSETS})
    with running(config) as d:
        assert d.kafka is not None
        wait_until(lambda: d.kafka is not None and d.kafka.services is not None,
                   "the endpoint to start")
        yield d


def _client(daemon: Daemon) -> RawClient:
    assert daemon.kafka is not None
    return RawClient(daemon.kafka.port)


def _commit(client: RawClient, group: str, parts: list[tuple[str, int, int, str | None]],
            version: int = 8) -> dict[tuple[str, int], ErrorCode]:
    """OffsetCommit of (topic, partition, offset, metadata) as a consumer assigning its own
    partitions sends it (generation -1, no member); the error of each partition."""
    cls = request_class(OFFSET_COMMIT, version)
    topic_cls = nested(cls, "OffsetCommitRequestTopic")
    part_cls = nested(cls, "OffsetCommitRequestPartition")
    by_topic: dict[str, list[Any]] = {}
    for topic, partition, offset, metadata in parts:
        by_topic.setdefault(topic, []).append(build(
            part_cls, partition_index=partition, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata=metadata, commit_timestamp=-1))
    body = build(cls, group_id=group, generation_id_or_member_epoch=-1, generation_id=-1,
                 member_id="", group_instance_id=None, retention_time_ms=-1,
                 topics=tuple(build(topic_cls, name=t, partitions=tuple(p))
                              for t, p in by_topic.items()))
    resp = client.request(body)
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


# --- what OffsetCommit refuses ----------------------------------------------------------------


def test_partitions_the_topic_does_not_have_are_refused_and_not_stored(
        history: History, bounded: Daemon) -> None:
    group = _group()
    client = _client(bounded)
    try:
        errors = _commit(client, group, [(TOPIC, p, 5, "") for p in range(250)])
    finally:
        client.close()
    assert errors[(TOPIC, 0)] is ErrorCode.none and errors[(TOPIC, 1)] is ErrorCode.none
    assert {errors[(TOPIC, p)] for p in range(2, 250)} == {ErrorCode.unknown_topic_or_partition}
    assert set(_stored(history, group) or {}) == {(TOPIC, 0), (TOPIC, 1)}


def test_a_topic_that_does_not_exist_is_refused_and_nothing_is_stored(
        history: History, bounded: Daemon) -> None:
    group = _group()
    client = _client(bounded)
    try:
        errors = _commit(client, group, [("no-such-topic", 0, 5, ""), ("no-such-topic", 1, 9, "")])
    finally:
        client.close()
    assert set(errors.values()) == {ErrorCode.unknown_topic_or_partition}
    assert _stored(history, group) is None


def test_offsets_below_minus_one_are_refused(history: History, bounded: Daemon) -> None:
    group = _group()
    client = _client(bounded)
    try:
        errors = _commit(client, group, [(TOPIC, 0, -7, ""), (TOPIC, 1, -1, "")])
    finally:
        client.close()
    assert errors == {(TOPIC, 0): ErrorCode.offset_out_of_range, (TOPIC, 1): ErrorCode.none}
    stored = _stored(history, group)
    assert stored is not None and set(stored) == {(TOPIC, 1)}
    assert stored[(TOPIC, 1)].offset == -1  # Kafka's "no offset" is kept as a client sends it


def test_metadata_over_the_configured_limit_is_refused(history: History,
                                                       bounded: Daemon) -> None:
    group = _group()
    client = _client(bounded)
    try:
        errors = _commit(client, group, [(TOPIC, 0, 3, "m" * (METADATA_MAX + 1)),
                                         (TOPIC, 1, 4, "m" * METADATA_MAX)])
    finally:
        client.close()
    assert errors == {(TOPIC, 0): ErrorCode.offset_metadata_too_large,
                      (TOPIC, 1): ErrorCode.none}
    stored = _stored(history, group)
    assert stored is not None and set(stored) == {(TOPIC, 1)}
    assert stored[(TOPIC, 1)].metadata == "m" * METADATA_MAX


def test_a_group_holds_offsets_for_at_most_max_offsets_per_group_partitions(
        history: History, bounded: Daemon) -> None:
    group = _group()
    client = _client(bounded)
    try:
        assert set(_commit(client, group, [(TOPIC, 0, 1, ""), (TOPIC, 1, 1, "")]).values()) \
            == {ErrorCode.none}
        # a third partition does not fit; the ones held are still updated
        errors = _commit(client, group, [(TXN_TOPIC, 0, 7, ""), (TOPIC, 0, 2, "")])
    finally:
        client.close()
    assert errors == {(TXN_TOPIC, 0): ErrorCode.invalid_commit_offset_size,
                      (TOPIC, 0): ErrorCode.none}
    stored = _stored(history, group)
    assert stored is not None
    assert {tp: c.offset for tp, c in stored.items()} == {(TOPIC, 0): 2, (TOPIC, 1): 1}


def test_the_bucket_holds_at_most_max_groups_groups(history: History) -> None:
    with _store(history) as store:
        already = sum(1 for _ in iter_group_objects(store))
    config = history.config(cache="cache-max-groups", kafka={"max_groups": already + 2})
    groups = [_group() for _ in range(3)]
    with running(config) as d:
        client = _client(d)
        try:
            first = [_commit(client, g, [(TOPIC, 0, 1, "")]) for g in groups]
            again = _commit(client, groups[0], [(TOPIC, 0, 5, "")])  # one it holds: fine
        finally:
            client.close()
    assert [e[(TOPIC, 0)] for e in first] == [ErrorCode.none, ErrorCode.none,
                                              ErrorCode.policy_violation]
    assert again[(TOPIC, 0)] is ErrorCode.none
    assert _stored(history, groups[2]) is None
    stored = _stored(history, groups[0])
    assert stored is not None and stored[(TOPIC, 0)].offset == 5


# --- offsets retention -------------------------------------------------------------------------


def test_retention_collects_an_expired_groups_offsets_through_the_endpoint(
        history: History, bounded: Daemon) -> None:
    """Committed through OffsetCommit, then a collection pass as of just past the retention:
    the group's object is gone; a group committed later keeps its offsets."""
    old, recent = _group(), _group()
    client = _client(bounded)
    try:
        assert set(_commit(client, old, [(TOPIC, 0, 11, "")]).values()) == {ErrorCode.none}
    finally:
        client.close()
    stored = _stored(history, old)
    assert stored is not None
    committed_ms = stored[(TOPIC, 0)].commit_timestamp
    assert bounded.kafka is not None and bounded.kafka.services is not None
    coordinator = bounded.kafka.services.groups
    retention = coordinator.limits.retention_ms
    assert retention == 10080 * 60_000  # offsets_retention_minutes' default
    with _store(history) as store:  # committed a day after the first one
        commit_group_offsets(store, recent, {(TOPIC, 1): CommittedOffset(
            3, -1, "", committed_ms + 86_400_000)})
    result = coordinator.collect_expired(now_ms=committed_ms + retention)
    assert result.offsets_expired >= 1 and result.groups_deleted >= 1
    assert _stored(history, old) is None
    kept = _stored(history, recent)
    assert kept is not None and kept[(TOPIC, 1)].offset == 3


class _RacingStore(S3Store):
    """An S3 store that lets a commit of another sidecar land at the worst moment: right after
    the collector read the group's object, before it writes (or, for a group left empty,
    before it checks the version it is about to delete)."""

    def __init__(self, settings: StoreSettings, group: str, racer: S3Store,
                 commit: dict[tuple[str, int], CommittedOffset], on: str) -> None:
        super().__init__(settings)
        self._group, self._racer, self._commit, self._on = group, racer, commit, on
        self.raced = 0

    def _race(self, key: str) -> None:
        if key == keys.group_offsets_key(self._group) and not self.raced:
            self.raced += 1
            commit_group_offsets(self._racer, self._group, self._commit)

    def put(self, key: str, data: bytes, **kw: Any) -> str:
        if self._on == "put":
            self._race(key)
        return super().put(key, data, **kw)

    def head(self, key: str) -> Any:
        if self._on == "head":
            self._race(key)
        return super().head(key)


@pytest.mark.parametrize("on", ["put", "head"])
def test_a_commit_racing_the_collector_is_not_lost(history: History, on: str) -> None:
    """"put": the group keeps a fresh offset and loses an old one; "head": every offset has
    expired, so the collector is about to delete the object. Either way a commit lands
    between its read and its write: its compare-and-swap loses, it reads again, and the new
    commit stays."""
    group = _group()
    now_ms = 1_900_000_000_000
    retention = 60_000
    old = CommittedOffset(1, -1, "", now_ms - 2 * retention)
    fresh = CommittedOffset(2, -1, "", now_ms)
    start = {(TOPIC, 0): old} if on == "head" else {(TOPIC, 0): old, (TOPIC, 1): fresh}
    racing = {(TXN_TOPIC, 0): CommittedOffset(9, -1, "raced", now_ms)}
    with _store(history) as plain, \
            _RacingStore(history.store_settings(), group, plain, racing, on) as store:
        store.use_condition_form(plain.condition_form)
        commit_group_offsets(plain, group, start)
        coordinator = GroupCoordinator(_settings(), store, limits=_limits(retention))
        coordinator.collect_expired(now_ms=now_ms)
        got, etag = load_group_offsets(plain, group)
    assert store.raced == 1
    assert etag is not None  # not deleted
    expected = {(TXN_TOPIC, 0): racing[(TXN_TOPIC, 0)]}
    if on == "put":
        expected[(TOPIC, 1)] = fresh
    assert dict(got.offsets) == expected


def test_the_collector_runs_on_its_interval_and_spares_groups_with_members(
        history: History) -> None:
    """The coordinator's own thread, every check interval, on an injected wall clock: an
    expired group goes; one whose member is connected here keeps its offsets (Kafka keeps a
    group's offsets while it has members)."""
    expired_group, busy_group = _group(), _group()
    now = [2_000_000.0]
    retention = 60_000
    committed = CommittedOffset(4, -1, "", int(now[0] * 1000))
    with _store(history) as store:
        for g in (expired_group, busy_group):
            commit_group_offsets(store, g, {(TOPIC, 0): committed})
        coordinator = GroupCoordinator(_settings(), store,
                                       limits=_limits(retention, check_interval_s=0.05),
                                       wall_clock=lambda: now[0])
        member = coordinator.join(JoinRequest(busy_group, "", "c", "h", 30.0, 30.0, "consumer",
                                              (("range", b""),)), threading.Event())
        assert member.error is ErrorCode.none
        coordinator.start()
        try:
            now[0] += retention / 1000 + 1
            wait_until(lambda: load_group_offsets(store, expired_group)[1] is None,
                       "the expired group to be collected")
        finally:
            coordinator.stop()
        assert load_group_offsets(store, busy_group)[0].offsets == {(TOPIC, 0): committed}


def _settings() -> GroupSettings:
    return GroupSettings(initial_delay_s=0.0, min_session_timeout_s=1.0)


def _limits(retention_ms: int, check_interval_s: float = 3600.0) -> OffsetLimits:
    return OffsetLimits(retention_ms=retention_ms, check_interval_s=check_interval_s)


def test_group_offsets_objects_list_by_group(history: History) -> None:
    group = "a b/ü"
    with _store(history) as store:
        commit_group_offsets(store, group, {(TOPIC, 0): CommittedOffset(1)})
        store.put(keys.GROUPS_PREFIX + "junk/other.json", b"{}")
        listed = dict(iter_group_objects(store))
    assert group in listed and listed[group].key == GroupOffsets(group).key
    assert all(not k.endswith("other.json") for k in (i.key for i in listed.values()))
