"""Which topics the Kafka endpoint serves, with how many partitions and which topic id: every
topic of the local log dirs and of the bucket's topic manifests, one seamless view
(docs/kafka-api.md, "Topics").

A topic's partition count is the larger of its newest topic manifest's count and one past the
highest partition in the log dirs (a sidecar may hold only some partitions of a topic; the
others are served from the bucket). Its topic id is Kafka's, from a local `partition.metadata`
or the bucket revision when that is one; a revision that is not a topic id (`"0"`, a number)
gets a name-based UUID that every sidecar derives alike. Clients of Fetch v13+ name topics by
id, so ids map back to names here. Internal topics (`__consumer_offsets`, ...) are the
broker's own state and are not served.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cache.reader import Reader
from manifests.topic import iter_topic_manifest_keys
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition, topic_id_from_str
from tiered.kafka.local_log import PartitionLog
from tiered.topics import is_internal_topic, topic_name_problem

__all__ = ["Catalog", "Topic", "topic_id_of"]

log = logging.getLogger(__name__)

#: namespace of the name-based topic ids of revisions that are not Kafka topic ids
TOPIC_ID_NAMESPACE = uuid.UUID("8f0c5f5e-6a51-4d0e-9f36-0f7d1f1b7a6e")
#: seconds the list of every topic (16 listings of the bucket) is reused
LISTING_TTL_S = 10.0


@dataclass(frozen=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int


def topic_id_of(name: str, revision: str) -> uuid.UUID:
    """The topic id a bucket revision stands for: itself when it is a Kafka topic id, else a
    UUID derived from (name, revision)."""
    try:
        return topic_id_from_str(revision)
    except ValueError:
        return uuid.uuid5(TOPIC_ID_NAMESPACE, f"{name}/{revision}")


class Catalog:
    """Topic lookups for Metadata, Fetch and ListOffsets; thread-safe. Store failures while
    listing the bucket are logged and the topics known locally are still answered."""

    def __init__(self, reader: Reader, *, clock: Callable[[], float] = time.monotonic,
                 listing_ttl_s: float = LISTING_TTL_S) -> None:
        self._reader = reader
        self._clock = clock
        self._ttl = listing_ttl_s
        self._lock = threading.Lock()
        self._names: dict[uuid.UUID, str] = {}
        self._listing: tuple[float, list[str]] | None = None

    def topic(self, name: str, local_log: Mapping[TopicPartition, PartitionLog] | None = None
              ) -> Topic | None:
        """The topic, or None when neither the log dirs nor the bucket know it (or its name is
        illegal). `TieredError` when the bucket cannot be asked and the topic is not local.
        `local_log`: the local partitions, when the caller has them already."""
        if topic_name_problem(name) is not None or is_internal_topic(name):
            return None
        if local_log is None:
            local_log = self._reader.local_partitions()
        local = [tp for tp in local_log.items() if tp[0].topic == name]
        topic_id = next((p.topic_id for _tp, p in local if p.topic_id is not None), None)
        highest = max((tp.partition for tp, _p in local), default=-1)
        try:
            revision, count = self._reader.bucket_topic(name)
        except TieredError:
            if not local:
                raise
            log.warning("%s: the bucket cannot be asked about the topic; serving the "
                        "partitions in the log dirs", name)
            revision, count = "0", None
        if count is None and not local:
            return None
        if topic_id is None:
            topic_id = topic_id_of(name, revision)
        topic = Topic(name, topic_id, max(count or 0, highest + 1))
        with self._lock:
            self._names[topic_id] = name
        return topic

    def topics(self) -> list[Topic]:
        """Every topic served, by name."""
        found = []
        local_log = self._reader.local_partitions()
        for name in sorted(set(self._bucket_names()) | {tp.topic for tp in local_log}):
            try:
                topic = self.topic(name, local_log)
            except TieredError as exc:
                log.warning("%s: left out of the topic list: %s", name, exc)
                continue
            if topic is not None:
                found.append(topic)
        return found

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        """The name of the topic with this id, looking through every topic once if the id has
        not been seen yet (a client that read Metadata from another sidecar)."""
        with self._lock:
            name = self._names.get(topic_id)
        if name is None:
            self.topics()
            with self._lock:
                name = self._names.get(topic_id)
        return name

    def _bucket_names(self) -> list[str]:
        now = self._clock()
        with self._lock:
            cached = self._listing
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        try:
            names = sorted({name for name, _rev, _key in
                            iter_topic_manifest_keys(self._reader.store)})
        except TieredError as exc:
            log.warning("cannot list the topics in the bucket (%s); answering with %s", exc,
                        "the last list" if cached else "the log dirs' topics only")
            return cached[1] if cached is not None else []
        with self._lock:
            self._listing = (now, names)
        return names
