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

The bucket's side is a snapshot kept in memory (docs/kafka-api.md, "The topic catalog"): a
thread of its own lists the 16 topic-manifest prefixes every `catalog_refresh_ms` and reads
the newest topic manifest of each topic it has not read at that version yet. Lookups never
ask the store themselves, so a request naming thousands of topics costs no store request per
name: a name the snapshot lacks asks for one refresh, at most once per `MISS_REFRESH_S`
whatever the number of names or clients, and waits for it only briefly (not at all while the
store is known to be down). Store calls of a refresh run on a pool of `STORE_CONCURRENCY`
threads, the endpoint's own budget: a client cannot make the read path flood the store that
the archiver shares. A refresh that fails keeps the last snapshot (logged once when the
failures start, and when they end); the topics of the log dirs are read at every lookup.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from cache.reader import Reader
from manifests import keys
from manifests.topic import decode_topic_manifest
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition, topic_id_from_str
from tiered.kafka.local_log import PartitionLog
from tiered.store.base import ObjectInfo, ObjectStore
from tiered.store.errors import ObjectNotFound, StoreError
from tiered.topics import is_internal_topic, topic_name_problem

__all__ = ["BucketTopic", "Catalog", "LocalTopics", "Topic", "topic_id_of"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: namespace of the name-based topic ids of revisions that are not Kafka topic ids
TOPIC_ID_NAMESPACE = uuid.UUID("8f0c5f5e-6a51-4d0e-9f36-0f7d1f1b7a6e")
#: seconds between two refreshes of the bucket's topics (`[kafka] catalog_refresh_ms`)
REFRESH_S = 10.0
#: a lookup of a name the snapshot does not hold refreshes it at most this often: seconds
#: from the end of the last refresh, whatever the number of names, requests or clients
MISS_REFRESH_S = 3.0
#: how long a lookup waits for the refresh its miss asked for; then it answers from the
#: snapshot as it is
MISS_WAIT_S = 1.0
#: lookups in the first seconds after `start` wait for the first refresh until this long after
#: it (a client connecting at once must not be told the bucket has no topics)
FIRST_WAIT_S = 5.0
#: store requests one refresh has in flight at once: the endpoint's own budget
STORE_CONCURRENCY = 4
#: seconds `close` waits for a refresh stuck on the store before leaving it behind
CLOSE_WAIT_S = 2.0


@dataclass(frozen=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int


@dataclass(frozen=True)
class BucketTopic:
    """A topic as the newest of its topic manifests in the bucket says."""

    revision: str
    partitions: int
    topic_id: uuid.UUID


@dataclass(frozen=True)
class LocalTopic:
    """A topic of the log dirs: its local topic id (None without `partition.metadata`) and
    its highest local partition."""

    topic_id: uuid.UUID | None
    highest: int


#: the topics of the log dirs by name, as one lookup sees them (`Catalog.local_topics`)
LocalTopics = Mapping[str, LocalTopic]


@dataclass(frozen=True)
class _Snapshot:
    topics: Mapping[str, BucketTopic]
    ids: Mapping[uuid.UUID, str]


def topic_id_of(name: str, revision: str) -> uuid.UUID:
    """The topic id a bucket revision stands for: itself when it is a Kafka topic id, else a
    UUID derived from (name, revision)."""
    try:
        return topic_id_from_str(revision)
    except ValueError:
        return uuid.uuid5(TOPIC_ID_NAMESPACE, f"{name}/{revision}")


def _served(name: str) -> bool:
    return topic_name_problem(name) is None and not is_internal_topic(name)


class Catalog:
    """Topic lookups for Metadata, ListOffsets, Fetch and the group APIs; thread-safe.
    `start` begins the refreshes, `close` ends them. Lookups never call the store."""

    def __init__(self, reader: Reader, *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic,
                 store: ObjectStore | None = None) -> None:
        """`store`: where the topic manifests are listed and read (default: the reader's)."""
        self._reader = reader
        self._store = store if store is not None else reader.store
        self._refresh_s = refresh_s
        self._clock = clock
        self._cond = threading.Condition()
        self._snapshot: _Snapshot | None = None
        #: refreshes finished, failed or not; `_last_end` is when the latest one did
        self._generation = 0
        self._last_end = 0.0
        self._refreshing = False
        #: why the latest refresh failed; None after a success
        self._failure: str | None = None
        #: lookups wait for the first refresh until then (`time.monotonic`)
        self._first_wait_until = 0.0
        #: topic manifest key -> (ETag, partition count or None when unreadable): a manifest
        #: is read again only when its ETag changed (touched by the refreshing thread only)
        self._manifests: dict[str, tuple[str, int | None]] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        #: (the log dirs' partitions, the topics derived from them): `local_topics`
        self._local: tuple[Mapping[TopicPartition, PartitionLog], LocalTopics] | None = None
        #: (local topics, snapshot, the local topics' ids): `_name_of`
        self._local_ids: tuple[LocalTopics, _Snapshot | None, dict[uuid.UUID, str]] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Read the bucket's topics now and every `refresh_s` after, on a thread."""
        with self._cond:
            if self._thread is not None:
                return
            self._first_wait_until = time.monotonic() + FIRST_WAIT_S
            self._pool = ThreadPoolExecutor(STORE_CONCURRENCY,
                                            thread_name_prefix="kafka-catalog-store")
            self._thread = threading.Thread(target=self._run, name="kafka-catalog",
                                            daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop refreshing; a refresh stuck on the store is left behind after
        `CLOSE_WAIT_S` (its thread is a daemon and its result is dropped). Idempotent."""
        self._stopped.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()
            thread, pool = self._thread, self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if thread is not None:
            thread.join(timeout=CLOSE_WAIT_S)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.refresh()
            self._wake.wait(self._refresh_s)
            self._wake.clear()

    # -- lookups ---------------------------------------------------------------------------

    def local_topics(self) -> LocalTopics:
        """The topics of the log dirs now, for the lookups of one request: derived again only
        when the log dirs were scanned since (every Fetch asks, and a sidecar may hold
        thousands of partitions). Read-only."""
        partitions = self._reader.local_partitions()
        cached = self._local
        if cached is not None and cached[0] is partitions:
            return cached[1]
        found: dict[str, LocalTopic] = {}
        for tp, part in partitions.items():
            seen = found.get(tp.topic)
            if seen is None:
                found[tp.topic] = LocalTopic(part.topic_id, tp.partition)
            else:
                found[tp.topic] = LocalTopic(
                    seen.topic_id if seen.topic_id is not None else part.topic_id,
                    max(seen.highest, tp.partition))
        self._local = (partitions, found)
        return found

    def topic(self, name: str, local: LocalTopics | None = None) -> Topic | None:
        """The topic, or None when neither the log dirs nor the bucket's snapshot know it (or
        its name is illegal or internal). `TieredError` when the bucket's topics have never
        been read (the store has been unreachable since the start) and the topic is not
        local: nobody can tell yet. `local`: `local_topics()`, when the caller has it."""
        if not _served(name):
            return None
        if local is None:
            local = self.local_topics()
        mine = local.get(name)
        snapshot = self._current()
        bucket = None if snapshot is None else snapshot.topics.get(name)
        if mine is None and bucket is None:
            self._refresh_for_miss()
            snapshot = self._current()
            bucket = None if snapshot is None else snapshot.topics.get(name)
            if bucket is None:
                if snapshot is None:
                    raise TieredError(f"{name}: the bucket's topics have not been read yet "
                                      f"({self._failure or 'the first listing is under way'})")
                return None
        return _merge(name, mine, bucket)

    def partitions(self, name: str) -> int | None:
        """How many partitions the topic has (valid partitions are 0..n-1), or None when it
        is not served; from the snapshot and the log dirs, never a store request per name.
        `TieredError` as `topic`: the bucket could not be read yet."""
        found = self.topic(name)
        return None if found is None else found.partitions

    def topics(self) -> list[Topic]:
        """Every topic served, by name: the log dirs' and the last snapshot's (only the log
        dirs' while the bucket has never been read)."""
        local = self.local_topics()
        snapshot = self._current()
        bucket = {} if snapshot is None else snapshot.topics
        return [_merge(name, local.get(name), bucket.get(name))
                for name in sorted(set(local) | set(bucket)) if _served(name)]

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        """The name of the topic with this id; an id the snapshot does not hold asks for a
        refresh as a missing name does (a client that read Metadata from another sidecar)."""
        name = self._name_of(topic_id)
        if name is None:
            self._refresh_for_miss()
            name = self._name_of(topic_id)
        return name

    def _name_of(self, topic_id: uuid.UUID) -> str | None:
        local = self.local_topics()
        snapshot = self._current()
        cached = self._local_ids
        if cached is None or cached[0] is not local or cached[1] is not snapshot:
            # the ids of the local topics, first name first, again only when the log dirs or
            # the snapshot changed: every Fetch by topic id asks
            bucket = {} if snapshot is None else snapshot.topics
            ids: dict[uuid.UUID, str] = {}
            for local_name, mine in local.items():
                if _served(local_name):
                    ids.setdefault(_merge(local_name, mine, bucket.get(local_name)).topic_id,
                                   local_name)
            cached = self._local_ids = (local, snapshot, ids)
        named = cached[2].get(topic_id)
        if named is not None:
            return named
        found = None if snapshot is None else snapshot.ids.get(topic_id)
        if found is None or found in local:  # a local topic's id is its own (checked above)
            return None
        return found

    # -- the snapshot ----------------------------------------------------------------------

    def _current(self) -> _Snapshot | None:
        """The snapshot; right after `start`, waits (until `FIRST_WAIT_S` after it) for the
        first refresh."""
        with self._cond:
            if self._generation == 0 and self._thread is not None:
                remaining = self._first_wait_until - time.monotonic()
                if remaining > 0:
                    self._cond.wait_for(
                        lambda: self._generation > 0 or self._stopped.is_set(), remaining)
            return self._snapshot

    def _refresh_for_miss(self) -> None:
        """A lookup missed: refresh now unless one runs or ended less than `MISS_REFRESH_S`
        ago, and wait up to `MISS_WAIT_S` for the refresh this call asked for (none while
        the last refresh failed: the store is down, answer from the snapshot)."""
        with self._cond:
            if (self._thread is None or self._stopped.is_set() or self._generation == 0
                    or self._refreshing
                    or self._clock() - self._last_end < MISS_REFRESH_S):
                return
            asked = self._generation
            self._refreshing = True  # taken now: no other miss asks again meanwhile
            self._wake.set()
            if self._failure is not None:
                return
            self._cond.wait_for(lambda: self._generation > asked or self._stopped.is_set(),
                                MISS_WAIT_S)

    def refresh(self) -> bool:
        """Read the bucket's topics into a new snapshot (the refreshing thread calls this;
        tests may call it on a catalog not started). False when the store failed: the last
        snapshot stays."""
        with self._cond:
            self._refreshing = True
        try:
            topics = self._read_bucket()
        except Exception as exc:  # a store outage, a bug: the thread goes on either way
            message = str(exc) if isinstance(exc, TieredError) else f"internal error: {exc!r}"
            with self._cond:
                first = self._failure is None
                self._failure = message
                had = self._snapshot is not None
            if self._stopped.is_set():
                log.debug("topic catalog refresh ended by the stop: %s", message)
            elif first:
                log.warning("cannot refresh the topic catalog from the bucket (%s); answering "
                            "from %s until it can", message,
                            "the last one read" if had else "the log dirs' topics only",
                            exc_info=not isinstance(exc, TieredError))
            return False
        else:
            ids = {t.topic_id: name for name, t in topics.items()}
            with self._cond:
                self._snapshot = _Snapshot(topics, ids)
                recovered, self._failure = self._failure, None
            if recovered is not None:
                log.info("topic catalog: the bucket's topics are read again (%d topics)",
                         len(topics))
            return True
        finally:
            with self._cond:
                self._refreshing = False
                self._last_end = self._clock()
                self._generation += 1
                self._cond.notify_all()

    def _read_bucket(self) -> dict[str, BucketTopic]:
        """The newest topic manifest of every topic in the bucket (as the archiver and the
        reader pick it: latest modified, then highest revision), each read only when its
        ETag is new. Raises the store's error: all or nothing."""
        store = self._store
        listings = self._map(lambda prefix: list(store.list(prefix)),
                             keys.topic_manifest_prefixes())
        newest: dict[str, tuple[float, str, ObjectInfo]] = {}
        for infos in listings:
            for info in infos:
                parsed = keys.parse_topic_manifest_key(info.key)
                if parsed is None or not _served(parsed[0]):
                    continue
                name, revision = parsed
                seen = newest.get(name)
                if seen is None or (info.last_modified, revision) > seen[:2]:
                    newest[name] = (info.last_modified, revision, info)
        stale = [(name, info) for name, (_at, _rev, info) in newest.items()
                 if self._manifests.get(info.key, ("",))[0] != info.etag or not info.etag]
        for key, read in self._map(self._read_manifest, stale):
            if read is None:
                self._manifests.pop(key, None)  # gone since the listing: next time
            else:
                self._manifests[key] = read
        listed = {info.key for _at, _rev, info in newest.values()}
        for key in [k for k in self._manifests if k not in listed]:
            del self._manifests[key]
        found: dict[str, BucketTopic] = {}
        for name, (_at, revision, info) in newest.items():
            count = self._manifests.get(info.key, ("", None))[1]
            if count is not None:
                found[name] = BucketTopic(revision, count, topic_id_of(name, revision))
        return found

    def _read_manifest(self, item: tuple[str, ObjectInfo]
                       ) -> tuple[str, tuple[str, int | None] | None]:
        """(key, (ETag, partition count)) of one topic manifest: count None when it does not
        parse (logged: it is left out until it changes), (key, None) when it is gone."""
        name, info = item
        if self._stopped.is_set():
            raise StoreError("the endpoint is stopping")
        try:
            blob = self._store.get(info.key)
        except ObjectNotFound:
            return info.key, None
        try:
            manifest = decode_topic_manifest(blob, key=info.key)
        except TieredError as exc:
            log.warning("%s: topic manifest %s is unreadable, the topic is not served from "
                        "the bucket until it is replaced: %s", name, info.key, exc)
            return info.key, (blob.etag, None)
        return info.key, (blob.etag, manifest.partition_count)

    def _map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`fn` over `items` on the catalog's pool (at most `STORE_CONCURRENCY` at once), in
        order; inline when the catalog was not started."""
        pool = self._pool
        if pool is None:
            return [fn(item) for item in items]
        return list(pool.map(fn, items))


def _merge(name: str, mine: LocalTopic | None, bucket: BucketTopic | None) -> Topic:
    """The topic served from what the log dirs and the bucket hold of it (one at least)."""
    highest = -1 if mine is None else mine.highest
    topic_id = None if mine is None else mine.topic_id
    if topic_id is None:
        topic_id = bucket.topic_id if bucket is not None else topic_id_of(name, "0")
    count = 0 if bucket is None else bucket.partitions
    return Topic(name, topic_id, max(count, highest + 1))

