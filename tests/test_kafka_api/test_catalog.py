"""The topic catalog behind Metadata, ListOffsets and the group APIs (docs/kafka-api.md, "The
topic catalog"): a real `KafkaServer` and `Reader` serving the archived topics of the
endpoint's tests as a history server, through a proxy in front of moto that counts (and
holds, or stops serving) every store request. The server's clock is a test clock, so when a
lookup that misses may refresh the catalog is decided by the test, not by the machine's load.

A request naming thousands of unknown topics costs one listing of the bucket at most (16 LIST
requests, one per topic-manifest prefix), a repeat costs nothing, ListOffsets of unknown
topics or partitions costs nothing, and Metadata answers from the catalog while the store is
down or its listings hang."""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
from faultproxy import DROP, FaultProxy
from kio.schema.errors import ErrorCode
from support.kafka_endpoint import (
    TOPIC,
    TXN_TOPIC,
    History,
    RawClient,
    kafka_config,
    request_class,
)
from support.waiting import wait_until

from manifests import keys
from manifests.topic import TopicManifest, save_topic_manifest
from tiered.app.daemon import open_reader
from tiered.app.kafka_api import catalog as catalog_module
from tiered.app.kafka_api.messages import build, nested
from tiered.app.kafka_api.server import KafkaServer
from tiered.config import parse_config
from tiered.errors import ConfigError, TieredError
from tiered.kafka.checkpoints import TopicPartition
from tiered.store import open_store

pytestmark = pytest.mark.timeout(300)

FETCH, LIST_OFFSETS, METADATA = 1, 2, 3
#: the store requests of one refresh of the catalog: one LIST per topic-manifest prefix
ONE_REFRESH = len(keys.topic_manifest_prefixes())
#: a client's own bound on one answer: a correctness bound, not a measurement
CLIENT_TIMEOUT_S = 5.0


class Clock:
    """The server's clock: moves only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Endpoint:
    def __init__(self, server: KafkaServer, proxy: FaultProxy, clock: Clock) -> None:
        self.server, self.proxy, self.clock = server, proxy, clock

    def client(self, timeout: float = CLIENT_TIMEOUT_S) -> RawClient:
        return RawClient(self.server.port, timeout=timeout)

    def lists(self) -> int:
        return len(self.proxy.seen(method="GET", query_contains="list-type"))


@contextlib.contextmanager
def serving(history: History, tmp_path: Path, moto_endpoint: str,
            **kafka: Any) -> Iterator[Endpoint]:
    """The endpoint as a history server over the archived topics, its store requests through
    a proxy; the catalog refreshes on its interval only once an hour unless `kafka` says."""
    proxy = FaultProxy(moto_endpoint).start()
    storage = {**history.storage, "endpoint_url": proxy.url}
    config = kafka_config(tmp_path, storage, dirs=None, cache="cache",
                          kafka={"catalog_refresh_ms": "1h", **kafka})
    assert config.kafka is not None
    clock = Clock()
    server = KafkaServer(config.kafka, clock=clock)
    try:
        with open_reader(config) as reader:
            server.start(reader, config.storage.url)
            try:
                endpoint = Endpoint(server, proxy, clock)
                # the first refresh: the archived topics are known (until then, not local,
                # they are LEADER_NOT_AVAILABLE: nobody can tell yet)
                wait_until(lambda: _metadata(endpoint, [TOPIC])[TOPIC] == (ErrorCode.none, 2),
                           "the catalog's first refresh")
                yield endpoint
            finally:
                proxy.release_held()
                server.stop()
    finally:
        proxy.stop()


def _metadata(endpoint: Endpoint, names: list[str] | None, *,
              client: RawClient | None = None) -> dict[str, tuple[ErrorCode, int]]:
    """name -> (error code, partitions) of a Metadata v12 request."""
    cls = request_class(METADATA, 12)
    topics = None if names is None else tuple(
        build(nested(cls, "MetadataRequestTopic"), name=n, topic_id=None) for n in names)
    own = client is None
    c = endpoint.client() if client is None else client
    try:
        got = c.request(build(cls, topics=topics, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False))
    finally:
        if own:
            c.close()
    return {t.name: (t.error_code, len(t.partitions)) for t in got.topics}


def _list_offsets(endpoint: Endpoint, asked: list[tuple[str, int]]
                  ) -> list[tuple[str, int, ErrorCode, int]]:
    """(topic, partition, error code, offset) of a ListOffsets v6 request for the latest
    offsets of `asked`."""
    cls = request_class(LIST_OFFSETS, 6)
    by_topic: dict[str, list[int]] = {}
    for name, p in asked:
        by_topic.setdefault(name, []).append(p)
    topics = tuple(build(nested(cls, "ListOffsetsTopic"), name=name, partitions=tuple(
        build(nested(cls, "ListOffsetsPartition"), partition_index=p, current_leader_epoch=-1,
              timestamp=-1) for p in parts)) for name, parts in by_topic.items())
    with contextlib.closing(endpoint.client()) as c:
        got = c.request(build(cls, replica_id=-1, isolation_level=0, topics=topics))
    return [(t.name, p.partition_index, p.error_code, p.offset)
            for t in got.topics for p in t.partitions]


def _unknown_names(n: int) -> list[str]:
    return [f"no-such-topic-{i:05d}" for i in range(n)]


def test_metadata_naming_thousands_of_unknown_topics_costs_one_listing_at_most(
        history: History, tmp_path: Path, moto_endpoint: str) -> None:
    with serving(history, tmp_path, moto_endpoint) as endpoint:
        names = _unknown_names(2000)
        endpoint.proxy.reset()
        endpoint.clock.advance(catalog_module.MISS_REFRESH_S)  # a miss may refresh now
        got = _metadata(endpoint, [*names, TOPIC])
        assert got[TOPIC] == (ErrorCode.none, 2)
        assert {got[n] for n in names} == {(ErrorCode.unknown_topic_or_partition, 0)}
        # one refresh (16 LISTs, the manifests read already), not one request per name
        assert endpoint.lists() <= ONE_REFRESH
        assert len(endpoint.proxy.seen()) == endpoint.lists()

        endpoint.proxy.reset()  # the same request again, within the refresh interval
        assert _metadata(endpoint, [*names, TOPIC]) == got
        assert endpoint.proxy.seen() == []


def test_list_offsets_of_unknown_topics_and_partitions_asks_the_store_nothing(
        history: History, tmp_path: Path, moto_endpoint: str) -> None:
    with serving(history, tmp_path, moto_endpoint) as endpoint:
        end = history.archived_end[(TOPIC, 1)]
        assert _list_offsets(endpoint, [(TOPIC, 1)]) == [(TOPIC, 1, ErrorCode.none, end)]
        endpoint.proxy.reset()
        asked = [(n, 0) for n in _unknown_names(300)] + [(TOPIC, 2), (TOPIC, 99), (TOPIC, -1)]
        got = _list_offsets(endpoint, asked)
        assert [(t, p) for t, p, _e, _o in got] == asked
        assert {(e, o) for _t, _p, e, o in got} == {(ErrorCode.unknown_topic_or_partition, -1)}
        assert endpoint.proxy.seen() == []


def _fetch(endpoint: Endpoint, asked: list[tuple[str, int]]) -> list[tuple[str, int, ErrorCode]]:
    """(topic, partition, error code) of a Fetch v12 from offset 0 of each of `asked`."""
    cls = request_class(FETCH, 12)
    part_cls, topic_cls = nested(cls, "FetchPartition"), nested(cls, "FetchTopic")
    by_topic: dict[str, list[int]] = {}
    for name, p in asked:
        by_topic.setdefault(name, []).append(p)
    topics = tuple(build(topic_cls, topic=name, partitions=tuple(
        build(part_cls, partition=p, fetch_offset=0, partition_max_bytes=1024,
              current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
        for p in parts)) for name, parts in by_topic.items())
    with contextlib.closing(endpoint.client()) as c:
        got = c.request(build(cls, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
                              max_bytes=1 << 20, isolation_level=0, session_id=0,
                              session_epoch=-1, topics=topics, forgotten_topics_data=(),
                              rack_id=""))
    return [(t.topic, p.partition_index, p.error_code) for t in got.responses
            for p in t.partitions]


def test_fetch_of_unknown_topics_and_partitions_asks_the_store_nothing(
        history: History, tmp_path: Path, moto_endpoint: str) -> None:
    with serving(history, tmp_path, moto_endpoint) as endpoint:
        assert _list_offsets(endpoint, [(TOPIC, 1)])[0][2] == ErrorCode.none  # catalog read
        endpoint.proxy.reset()
        asked = [(n, 0) for n in _unknown_names(300)] + [(TOPIC, 2), (TOPIC, 99), (TOPIC, -1)]
        got = _fetch(endpoint, asked)
        assert [(t, p) for t, p, _e in got] == asked
        assert {e for _t, _p, e in got} == {ErrorCode.unknown_topic_or_partition}
        assert endpoint.proxy.seen() == []


def test_metadata_answers_from_the_catalog_while_the_store_is_down(
        history: History, tmp_path: Path, moto_endpoint: str,
        caplog: pytest.LogCaptureFixture) -> None:
    with serving(history, tmp_path, moto_endpoint) as endpoint:
        endpoint.proxy.inject(DROP, 1 << 30)  # every store request goes unanswered from now
        endpoint.clock.advance(catalog_module.MISS_REFRESH_S)
        with caplog.at_level(logging.WARNING, logger=catalog_module.__name__):
            # within the client's own timeout: the refresh the miss asked for fails on its own
            got = _metadata(endpoint, [TOPIC, "not-there"])
            assert got == {TOPIC: (ErrorCode.none, 2),
                           "not-there": (ErrorCode.unknown_topic_or_partition, 0)}
            every = _metadata(endpoint, None)
            assert every[TOPIC] == (ErrorCode.none, 2) and every[TXN_TOPIC][0] == ErrorCode.none
            wait_until(lambda: "cannot refresh the topic catalog" in caplog.text,
                       "the failed refresh to be logged")
            # the store known down: the next miss does not wait for a refresh at all
            endpoint.clock.advance(catalog_module.MISS_REFRESH_S)
            assert _metadata(endpoint, ["still-not-there"]) == {
                "still-not-there": (ErrorCode.unknown_topic_or_partition, 0)}
        assert caplog.text.count("cannot refresh the topic catalog") == 1  # once, not per try


def test_requests_are_answered_while_the_catalogs_listings_hang(
        history: History, tmp_path: Path, moto_endpoint: str) -> None:
    """The catalog's store requests have their own small budget: with every listing held
    by the store, lookups still answer (from the snapshot), never more than
    `STORE_CONCURRENCY` listings are out at once, and many requests share one refresh."""
    with serving(history, tmp_path, moto_endpoint) as endpoint:
        endpoint.proxy.reset()
        endpoint.proxy.hold(method="GET", query_contains="list-type")
        endpoint.clock.advance(catalog_module.MISS_REFRESH_S)
        answers: list[dict[str, tuple[ErrorCode, int]]] = []
        failures: list[BaseException] = []

        def ask() -> None:
            try:
                answers.append(_metadata(endpoint, [*_unknown_names(500), TOPIC]))
            except BaseException as exc:  # handed to the test below
                failures.append(exc)

        askers = [threading.Thread(target=ask) for _ in range(8)]
        for t in askers:
            t.start()
        for t in askers:
            t.join(timeout=2 * CLIENT_TIMEOUT_S)
        assert not failures, failures
        assert len(answers) == 8 and all(a[TOPIC] == (ErrorCode.none, 2) for a in answers)
        wait_until(lambda: endpoint.proxy.waiting == catalog_module.STORE_CONCURRENCY,
                   "the refresh's listings to be held")
        assert endpoint.lists() == catalog_module.STORE_CONCURRENCY
        endpoint.proxy.release_held()
        wait_until(lambda: endpoint.lists() == ONE_REFRESH, "the refresh to finish listing")


def test_a_topic_new_in_the_bucket_is_found_by_a_lookup_that_misses(
        history: History, tmp_path: Path, moto_endpoint: str, caplog: pytest.LogCaptureFixture
        ) -> None:
    with serving(history, tmp_path, moto_endpoint) as endpoint:
        assert _metadata(endpoint, ["fresh"]) == {
            "fresh": (ErrorCode.unknown_topic_or_partition, 0)}
        with open_store(parse_config({"storage": history.storage}, source="t")
                        .store_settings()) as store:
            save_topic_manifest(store, TopicManifest("fresh", "0", 3))
        endpoint.proxy.reset()
        # the last refresh ended just now: a miss does not refresh again (nor ask anything)
        assert _metadata(endpoint, ["fresh"])["fresh"][0] == ErrorCode.unknown_topic_or_partition
        assert endpoint.proxy.seen() == []
        endpoint.clock.advance(catalog_module.MISS_REFRESH_S)
        # the next miss refreshes (its answer waits a moment for it; a loaded machine may
        # need longer, and the lookups meanwhile ask for nothing more: the clock stands still)
        wait_until(lambda: _metadata(endpoint, ["fresh"]) == {"fresh": (ErrorCode.none, 3)},
                   "the refresh a miss asked for to find the new topic")
        assert endpoint.lists() == ONE_REFRESH
        assert len(endpoint.proxy.seen(method="GET")) == ONE_REFRESH + 1  # its manifest, once


def test_the_catalog_follows_the_bucket_on_its_interval(
        history: History, tmp_path: Path, moto_endpoint: str) -> None:
    with serving(history, tmp_path, moto_endpoint, catalog_refresh_ms=100) as endpoint:
        assert "later" not in _metadata(endpoint, None)
        with open_store(parse_config({"storage": history.storage}, source="t")
                        .store_settings()) as store:
            save_topic_manifest(store, TopicManifest("later", "0", 2))
        # nobody names it: only the interval's refresh can bring it
        wait_until(lambda: _metadata(endpoint, None).get("later") == (ErrorCode.none, 2),
                   "the interval's refresh to find the new topic")


def test_catalog_partitions_answers_from_the_snapshot(
        history: History, tmp_path: Path, moto_endpoint: str) -> None:
    """What the group APIs ask: a topic's partition count, or None for one not served."""
    with serving(history, tmp_path, moto_endpoint) as endpoint:
        services = endpoint.server.services
        assert services is not None
        endpoint.proxy.reset()
        assert services.catalog.partitions(TOPIC) == 2
        assert services.catalog.partitions(TXN_TOPIC) == 1
        assert services.catalog.partitions("nope") is None
        assert services.catalog.partitions("__consumer_offsets") is None
        assert services.catalog.partitions("../bad") is None
        assert endpoint.proxy.seen() == []


def test_a_catalog_that_never_read_the_bucket_says_so(tmp_path: Path,
                                                       history: History) -> None:
    """Before any listing succeeded, a name that is not local is not "unknown": nobody can
    tell yet (Metadata answers LEADER_NOT_AVAILABLE, which clients retry). A catalog that
    was not started never waits and asks the store nothing by itself."""
    config = kafka_config(tmp_path, history.storage, dirs=None)
    with open_reader(config) as reader:
        cat = catalog_module.Catalog(reader)
        with pytest.raises(TieredError, match="have not been read yet"):
            cat.topic(TOPIC)
        assert cat.topics() == []
        assert cat.refresh()
        assert cat.partitions(TOPIC) == 2 and cat.partitions("nope") is None


@pytest.mark.parametrize(("value", "problem"), [
    ("soon", "is not a duration"), (10, "at least 100")])
def test_catalog_refresh_ms_is_checked(tmp_path: Path, value: object, problem: str) -> None:
    base = {"storage": {"url": (tmp_path / "b").as_uri()}, "log": {"dirs": []}}
    default = parse_config({**base, "kafka": {"listen": "0"}}, source="t", base_dir=tmp_path)
    assert default.kafka is not None and default.kafka.catalog_refresh_ms == 10_000
    assert default.effective()["kafka"]["catalog_refresh_ms"] == 10_000
    set_ = parse_config({**base, "kafka": {"listen": "0", "catalog_refresh_ms": "30s"}},
                        source="t", base_dir=tmp_path)
    assert set_.kafka is not None and set_.kafka.catalog_refresh_ms == 30_000
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "kafka": {"listen": "0", "catalog_refresh_ms": value}},
                     source="t", base_dir=tmp_path)
    assert any("[kafka] catalog_refresh_ms" in p and problem in p for p in err.value.problems)


class _LocalOnly:
    """What the catalog asks of a reader beside a broker for its local topics: the log dirs'
    partitions, one mapping per scan (`LocalView.partitions`)."""

    def __init__(self) -> None:
        self.partitions: dict[Any, Any] = {}
        self.store = None

    def local_partitions(self) -> dict[Any, Any]:
        return self.partitions


def test_local_topics_and_ids_are_derived_once_per_scan_and_follow_a_new_one() -> None:
    reader = _LocalOnly()
    first, second = uuid4(), uuid4()
    reader.partitions = {TopicPartition("a", 0): SimpleNamespace(topic_id=first),
                         TopicPartition("a", 3): SimpleNamespace(topic_id=first)}
    catalog = catalog_module.Catalog(reader, refresh_s=60.0)  # type: ignore[arg-type]
    local = catalog.local_topics()
    assert dict(local) == {"a": catalog_module.LocalTopic(first, 3)}
    assert catalog.local_topics() is local  # the same scan: nothing derived again
    assert catalog.name_of(first) == "a" and catalog.name_of(second) is None
    # a scan (a new mapping) with a new topic: both lookups follow it
    reader.partitions = {**reader.partitions, TopicPartition("b", 0): SimpleNamespace(
        topic_id=second)}
    assert set(catalog.local_topics()) == {"a", "b"}
    assert catalog.name_of(second) == "b" and catalog.name_of(first) == "a"
