"""What the bucket says of a partition, as the read path sees it: head manifests and topic
revisions, cached for a short TTL and refreshed in the background (docs/remote-read.md).

The reader plans and gathers a fetch; this view answers "which head serves this offset" (as
Redpanda's `async_manifest_view` does for its readers). A consumer polling every few ms must
not cost a GET per poll, so a head stays fresh for `ttl_s`; past it, a fetch of offsets the
cached head holds is served from it while a fresh one is read on a timer thread of its own
(the objects an older head names stay readable for the GC grace period, docs/design.md,
invariant 7). Through a store outage a head younger than the grace period keeps serving.
A head the bucket lost or garbled is read from its newest copy (written beside it at every
commit), read-only, until a writer restores it: a reader never takes a lost head for a
partition with no history (docs/format.md, "Losing objects").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cache.segment_reads import Lru
from manifests import keys
from manifests.commit import ManifestStore
from manifests.errors import CorruptManifest
from manifests.manifest import PartitionManifest
from manifests.topic import load_topic_manifest
from tiered.errors import TieredError
from tiered.kafka.checkpoints import topic_id_to_str
from tiered.kafka.local_log import PartitionLog
from tiered.store.errors import StoreError

__all__ = [
    "METADATA_TTL_S",
    "REFRESH_AFTER_S",
    "REVALIDATE_S",
    "HeadKey",
    "ManifestView",
    "UnknownPartition",
]

log = logging.getLogger(__name__)

#: seconds a loaded head manifest / resolved revision / local-log scan stays fresh; a consumer
#: polling every few ms must not cost two GETs per poll, and the GC grace period keeps the
#: objects a slightly stale manifest names readable (docs/design.md, invariant 7)
METADATA_TTL_S = 1.0
#: seconds a head manifest past its TTL still serves a fetch of offsets it holds while a fresh
#: one is read in the background (capped by the GC grace period, which keeps its objects)
REVALIDATE_S = 60.0
#: seconds a background head refresh waits before it starts: the fetch that found the head
#: stale sends its own requests first (botocore builds a request in about 2 ms of Python that
#: holds the interpreter), and a consumer's first fetch of a segment then waits on the store,
#: when the refresh costs it nothing
REFRESH_AFTER_S = 0.005

#: (topic, partition, revision)
HeadKey = tuple[str, int, str]


class UnknownPartition(TieredError):
    """Neither the local log nor the bucket knows this topic partition."""

    exit_code = 7


class ManifestView:
    """Head manifests and topic revisions for reads, cached and revalidated in the
    background. Thread-safe: the daemon's request threads share one."""

    def __init__(
        self,
        manifests: ManifestStore,
        *,
        stale_head_s: float,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = METADATA_TTL_S,
        refresh_after_s: float = REFRESH_AFTER_S,
    ) -> None:
        """`stale_head_s`: how long a head may serve reads when it cannot be refreshed (the
        GC grace period)."""
        self.manifests = manifests
        self.store = manifests.store
        self._clock = clock
        self._ttl = ttl_s
        self._stale_head_s = stale_head_s
        self._revalidate_s = min(REVALIDATE_S, stale_head_s)
        self._refresh_after_s = refresh_after_s
        #: head manifests being read in the background (`refresh`)
        self.refreshing: set[HeadKey] = set()
        #: their threads (waiting their `REFRESH_AFTER_S` or reading): `close` cancels the
        #: waiting ones and waits for the rest
        self.refresh_timers: dict[HeadKey, threading.Timer] = {}
        #: set by `close`: no refresh starts after it
        self._closing = False
        self.heads: Lru[HeadKey, tuple[float, PartitionManifest]] = Lru(1024)
        #: head key -> sequence of the copy last served in its place and warned about: a lost
        #: head is re-read every TTL, so its warning would otherwise repeat every second
        self._copies_served: Lru[str, int] = Lru(1024)
        self._revisions: Lru[str, tuple[float, str, int | None]] = Lru(1024)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Cancel the refreshes not started and wait (up to 10 s) for those reading: one
        running after the store closes would read through a closed store."""
        with self._lock:
            self._closing = True
            timers = list(self.refresh_timers.values())
        for timer in timers:
            timer.cancel()
        deadline = time.monotonic() + 10  # one stuck in a slow read is a daemon: let it be
        for timer in timers:
            timer.join(timeout=max(0.0, deadline - time.monotonic()))

    def head(
        self, topic: str, partition: int, local: PartitionLog | None, *, required: bool,
        offset: int | None = None,
    ) -> PartitionManifest | None:
        """The partition's head manifest (cached for the TTL); None, or UnknownPartition when
        `required`, if the bucket has nothing for it. A fetch of `offset` that a cached head
        past its TTL (but within `REVALIDATE_S`) holds is served from it while a fresh one is
        read in the background: a consumer's first fetch does not wait for a manifest before
        its data."""
        revision, count = self.revision(topic, local)
        if count is not None and partition >= count and local is None:
            raise UnknownPartition(f"{topic}-{partition}: the topic has {count} partitions")
        key = (topic, partition, revision)
        now = self._clock()
        hit = self.heads.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        if (hit is not None and offset is not None and now - hit[0] < self._revalidate_s
                and hit[1].log_start_offset <= offset <= hit[1].last_offset):
            self.refresh(key)
            return hit[1]
        try:
            m = self._load(topic, partition, revision)
        except StoreError as exc:
            # Objects a newer manifest dropped outlive it by the GC grace period, so a head
            # younger than that still names readable objects: keep serving from it (and the
            # chunks already cached) through a store outage instead of failing every read.
            if hit is None or now - hit[0] >= self._stale_head_s:
                raise
            log.warning("%s-%d: cannot refresh the manifest (%s); serving from the one read "
                        "%.0f s ago", topic, partition, exc, now - hit[0])
            return hit[1]
        if m is None or m.last_offset < 0:
            self.heads.pop(key)
            if required:
                raise UnknownPartition(
                    f"{topic}-{partition}: not in the local log dirs and nothing in the bucket "
                    f"for revision {revision}" if local is None else
                    f"{topic}-{partition}: nothing in the bucket for revision {revision}")
            return None
        self.heads.put(key, (now, m))
        return m

    def _load(self, topic: str, partition: int, revision: str) -> PartitionManifest | None:
        """The head as reads see it: the stored one, else (missing or unreadable) its newest
        copy; None when the bucket holds neither. Never writes: restoring the head is a
        writer's (the archiver's next round or housekeeping pass)."""
        try:
            m, etag = self.manifests.load(topic, partition, revision)
        except CorruptManifest as exc:
            copy = self._copy(topic, partition, revision, f"unreadable ({exc.reason})")
            if copy is None:
                raise
            return copy
        if etag is None:
            return self._copy(topic, partition, revision, "missing")
        return m

    def _copy(self, topic: str, partition: int, revision: str, why: str
              ) -> PartitionManifest | None:
        head_key = keys.partition_manifest_key(topic, partition, revision)
        copy = self.manifests.head_copies.newest_copy(head_key)
        if copy is not None:
            said = self._copies_served.get(head_key) == copy.sequence
            self._copies_served.put(head_key, copy.sequence)
            log.log(logging.DEBUG if said else logging.WARNING,
                    "%s: the head manifest is %s; reads are served from its copy at sequence "
                    "%d (offsets %d..%d) until a writer restores it", head_key, why,
                    copy.sequence, copy.log_start_offset, copy.last_offset)
        return copy

    def refresh(self, key: HeadKey) -> None:
        """Read the head manifest `key` names again on a thread of its own (one at a time per
        key), `REFRESH_AFTER_S` from now; the next fetch finds it cached. A failure keeps the
        cached one, logged."""

        def run() -> None:
            topic, partition, revision = key
            started = self._clock()  # its age: the bucket may change while it is read
            try:
                m = self._load(topic, partition, revision)
                cached = self.heads.get(key)
                if cached is not None and cached[0] > started:
                    return  # a fetch read a newer one meanwhile: keep that
                if m is not None and m.last_offset >= 0:
                    self.heads.put(key, (started, m))
                else:  # gone from the bucket: the next fetch finds out itself
                    self.heads.pop(key)
            except Exception as err:  # the next fetch past the window reads it itself
                log.info("%s-%d: background manifest refresh failed: %s", topic, partition, err)
            finally:
                with self._lock:
                    self.refreshing.discard(key)
                    self.refresh_timers.pop(key, None)

        with self._lock:  # registered and started in one step: `close` sees every refresh
            if self._closing or key in self.refreshing:
                return
            self.refreshing.add(key)
            timer = threading.Timer(self._refresh_after_s, run)
            timer.name, timer.daemon = "reader-manifest", True
            self.refresh_timers[key] = timer
            timer.start()  # a timer cancelled before it fires never runs `run`

    def cached_start(self, topic: str, partition: int, local: PartitionLog | None
                     ) -> int | None:
        """The bucket's log start for the partition from a head already cached, else None:
        no request (a consumer polling at the log end must stay cheap)."""
        if local is None:
            return None
        revision = "0" if local.topic_id is None else topic_id_to_str(local.topic_id)
        hit = self.heads.get((topic, partition, revision))
        return None if hit is None else hit[1].log_start_offset

    def revision(self, topic: str, local: PartitionLog | None) -> tuple[str, int | None]:
        """(revision, partition count if a topic manifest says) as the archiver names it: the
        local topic id, else the newest topic manifest of the topic in the bucket."""
        if local is not None:
            return ("0" if local.topic_id is None else topic_id_to_str(local.topic_id)), None
        now = self._clock()
        hit = self._revisions.get(topic)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1], hit[2]
        prefix = f"{keys.topic_prefix_digit(topic)}0000000/{keys.TOPIC_PREFIX_DIR}/{topic}/"
        found: list[tuple[float, str]] = []
        revision, count = "0", None
        try:
            for info in self.store.list(prefix):
                parsed = keys.parse_topic_manifest_key(info.key)
                if parsed is not None and parsed[0] == topic:
                    found.append((info.last_modified, parsed[1]))
            if found:
                revision = max(found)[1]
                tm = load_topic_manifest(self.store, topic, revision)
                count = None if tm is None else tm.partition_count
        except StoreError as exc:  # as in `head`: a recent answer beats no answer
            if hit is None or now - hit[0] >= self._stale_head_s:
                raise
            log.warning("%s: cannot refresh the topic's revision (%s); using the one read "
                        "%.0f s ago", topic, exc, now - hit[0])
            return hit[1], hit[2]
        self._revisions.put(topic, (now, revision, count))
        return revision, count
