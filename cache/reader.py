"""The remote-read API: fetch record batches by offset or timestamp, local log first, then the
bucket through the chunked read cache (design: remote read; invariants 5 and 9).

Semantics follow Kafka's Fetch and ListOffsets:

* `fetch(topic, partition, offset, max_bytes)` returns whole record batches starting with the
  batch holding `offset` (after compaction: the first batch whose last offset reaches it). The
  first batch comes whatever its size, so a consumer always makes progress (KIP-74); further
  batches come while the total stays within `max_bytes`. A fetch crosses segment boundaries,
  archived-manifest boundaries and the bucket -> local-log boundary.
* The readable log is `[earliest_offset, latest_offset)`: it starts at the smaller of the local
  log start and the bucket's log start (when remote read is on) and ends at the local log end,
  capped by the checkpointed high watermark (a consumer never sees uncommitted data), or at the
  bucket's last offset + 1 when nothing is local. An offset outside it is `OffsetOutOfRange`,
  never an empty success (so a consumer that has caught up is told where the end is).
* Remote read follows `redpanda.remote.read` (cluster default
  `cloud_storage_enable_remote_read`): when off, an offset that is no longer local is
  `RemoteReadDisabled` (an `OffsetOutOfRange`, as Kafka would answer) saying why.

Where bytes come from: the local log when it still holds the offset (no store request at all);
otherwise the segment objects through `cache.ChunkCache` (`cache.segment_reads`: index
positioning, chunk plan, header walk). Every byte returned is checked: local pieces by their
record-batch CRC-32Cs; bucket pieces by every batch's CRC-32C when their chunk is downloaded (and
the object's CRC-32C from the manifest when a chunk is a whole segment), then by the chunk
file's per-MiB CRC-32Cs on every read of it.

Revision (the bucket's name for a topic incarnation): the topic id in the local
`partition.metadata`, or "0" without one, exactly as the archiver names it; when nothing is
local, the newest topic manifest of the topic in the bucket (a recreated topic's is newer).

Where the metadata comes from: `cache.local_view` (the local partitions and their readable
ranges) and `cache.manifest_view` (head manifests and revisions, cached and revalidated in the
background); this module plans a fetch over them and gathers its bytes.

Threads: one `Reader` may serve many threads (the daemon's HTTP handlers); its counters and
views are guarded by locks, the cache and store are thread-safe themselves.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cache.chunk_cache import ChunkCache
from cache.fetched_bytes import Pieces
from cache.local_view import LocalView
from cache.manifest_view import (
    METADATA_TTL_S,
    REFRESH_AFTER_S,
    ManifestView,
    UnknownPartition,
)
from cache.segment_reads import (
    LocalSegments,
    Lru,
    RemoteSegments,
    Span,
    local_offset_for_timestamp,
)
from cache.transactions import TransactionIndexes
from manifests import keys
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest, SegmentMeta
from manifests.spillover import ManifestSettings
from tiered.config import Config
from tiered.errors import CorruptSegmentError, OffsetOutOfRange, TieredError
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.index import NO_TIMESTAMP
from tiered.kafka.local_log import LocalLog, PartitionLog
from tiered.kafka.records import Record, RecordBatch, iter_batches
from tiered.kafka.segment import TimestampAndOffset
from tiered.kafka.txnindex import AbortedTxn
from tiered.store.base import ObjectStore
from tiered.topics import topic_name_problem

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FetchResult",
    "FetchedPieces",
    "InvalidRequest",
    "Reader",
    "ReaderStats",
    "RemoteReadDisabled",
    "UnknownPartition",
]

log = logging.getLogger(__name__)

#: Kafka's max.partition.fetch.bytes default: 1 MiB
DEFAULT_MAX_BYTES = 1 << 20
#: ListOffsets' special timestamps
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
class RemoteReadDisabled(OffsetOutOfRange):
    """The offset is only in the bucket and remote read is off for the topic."""


class _LocalVanished(Exception):
    """A local segment file disappeared mid-read (retention): rescan and retry once."""


class InvalidRequest(TieredError):
    """A malformed request: negative offset or max_bytes, a hostile topic name, ..."""

    exit_code = 2


@dataclass(frozen=True)
class FetchResult:
    """Whole record batches as Kafka's Fetch returns them, and where the log stands."""

    topic: str
    partition: int
    #: the offset asked for
    offset: int
    #: record batches, byte for byte as in the log (CRC-checked)
    data: bytes
    #: where the next fetch should start: one past the last offset returned
    next_offset: int
    #: the first readable offset as far as this fetch looked: for a fetch served wholly from
    #: the local log, the local log start (the bucket may reach further back, see
    #: `Reader.earliest_offset`; a local hit makes no store request to find out)
    log_start_offset: int | None
    #: the end of the readable log (exclusive): local end capped at the high watermark, or
    #: the bucket's last offset + 1 when nothing is local
    high_watermark: int | None
    #: "local", "remote" or "remote+local"
    source: str

    def batches(self) -> Iterator[RecordBatch]:
        """Every batch fully decoded."""
        return iter_batches(self.data, path=f"{self.topic}-{self.partition}@{self.offset}")

    def records(self, *, include_control: bool = False) -> Iterator[Record]:
        """Records of data batches (transaction markers skipped, as a consumer does) at or
        after the requested offset."""
        for batch in self.batches():
            if batch.header.is_control and not include_control:
                continue
            for record in batch.records:
                if record.offset >= self.offset:
                    yield record


@dataclass(frozen=True)
class FetchedPieces:
    """`FetchResult` before its bytes are read: they are `pieces` (local log reads and open
    chunk-file ranges). Owns open files: close it (it is a context manager)."""

    topic: str
    partition: int
    offset: int
    pieces: Pieces
    next_offset: int
    log_start_offset: int | None
    high_watermark: int | None
    source: str

    def result(self) -> FetchResult:
        """The answer with its bytes read into memory."""
        return FetchResult(self.topic, self.partition, self.offset, self.pieces.read(),
                           self.next_offset, self.log_start_offset, self.high_watermark,
                           self.source)

    def close(self) -> None:
        self.pieces.close()

    def __enter__(self) -> FetchedPieces:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ReaderStats:
    """Counters for metrics (the cache's own counters come from `ChunkCache.stats`)."""

    local_fetches: int = 0
    remote_fetches: int = 0
    local_bytes: int = 0
    remote_bytes: int = 0
    out_of_range: int = 0
    timestamp_lookups: int = 0


class Reader:
    """Serves reads of a set of partitions from the local log and the bucket."""

    def __init__(
        self,
        config: Config,
        store: ObjectStore,
        *,
        local_log: LocalLog | None = None,
        cache: ChunkCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        metadata_ttl_s: float = METADATA_TTL_S,
        refresh_after_s: float = REFRESH_AFTER_S,
    ) -> None:
        """`local_log` None: nothing is local (a reader beside no broker). `cache` None: a
        `ChunkCache` in `config.cache_dir` configured from the cluster properties, owned (and
        closed) by this reader."""
        self.config = config
        self.store = store
        self.local_log = local_log
        self.manifests = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
        self._owns_cache = cache is None
        self.cache = cache if cache is not None else _make_cache(config, store)
        self.local = LocalSegments()
        self.remote = RemoteSegments(
            store, self.cache, config.cluster_int("cloud_storage_cache_chunk_size", 1))
        self.transactions = TransactionIndexes(store)
        self.local_view = LocalView(local_log, clock=clock, ttl_s=metadata_ttl_s)
        self.manifest_view = ManifestView(
            self.manifests, clock=clock, ttl_s=metadata_ttl_s, refresh_after_s=refresh_after_s,
            stale_head_s=config.cluster_seconds("cloud_storage_gc_grace_period_ms"))
        self._stats = ReaderStats()
        #: (topic, partition) -> where the last fetch without a session ended: a fetch that
        #: starts there reads on as one session (`_anonymous_session`)
        self._anonymous_next: Lru[tuple[str, int], int] = Lru(4096)
        self._lock = threading.Lock()
        self._owned: list[Any] = []

    @classmethod
    def from_config(cls, config: Config) -> Reader:
        """A long-lived reader (the daemon's, the CLI's) that opens, and on `close` closes, the
        configured store, local log dirs and cache."""
        from tiered.store import open_store

        # reading needs no conditional writes: no probe, so a read-only credential works and
        # a read does not fail just because the probe could not write
        store = open_store(config.store_settings(), probe=False)
        dirs = [d for d in config.log_dirs if d.is_dir()]  # a reader beside no broker is fine
        local = LocalLog(dirs) if dirs else None
        reader = cls(config, store, local_log=local)
        reader._owned.append(store)
        reader.cache.start()  # the periodic size check, idle-reader expiry and index save
        return reader

    def close(self) -> None:
        self.manifest_view.close()  # no refresh may read through the store closed below
        if self._owns_cache:
            self.cache.close()
        for owned in self._owned:
            owned.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> dict[str, Any]:
        """A snapshot: the reader's counters and, under "cache", the cache's."""
        with self._lock:
            out: dict[str, Any] = dataclasses.asdict(self._stats)
        out["index_downloads"] = self.remote.index_downloads
        out["index_fallbacks"] = self.remote.index_fallbacks
        out["txnindex_downloads"] = self.transactions.remote_reads
        out["cache"] = self.cache.stats()
        return out

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    # -- public API ----------------------------------------------------------------------------

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int = DEFAULT_MAX_BYTES,
        *, reader_id: Hashable | None = None,
    ) -> FetchResult:
        """Whole record batches from the one holding `offset` (see the module docstring).
        `reader_id` names a consumer session (any hashable): the cache then holds its position
        between fetches, spots sequential reading and reads ahead (`cloud_storage_chunk_prefetch`);
        close it with `close_reader` when the consumer goes away.
        Raises OffsetOutOfRange (RemoteReadDisabled), UnknownPartition, InvalidRequest,
        CorruptSegmentError, StoreError / CacheError."""
        with self.fetch_pieces(topic, partition, offset, max_bytes, reader_id=reader_id) as got:
            return got.result()

    def fetch_pieces(
        self, topic: str, partition: int, offset: int, max_bytes: int = DEFAULT_MAX_BYTES,
        *, reader_id: Hashable | None = None, max_files: int | None = None,
    ) -> FetchedPieces:
        """`fetch`, with the bytes left where they lie (`cache.fetched_bytes`): the HTTP endpoint
        sends the chunk-file ranges with sendfile. Close the answer when it is sent.
        `max_files`: the answer holds at most this many chunk files open (at least one); it
        stops short of `max_bytes` before opening more (the Kafka endpoint's per-request
        bound on open files, docs/kafka-api.md)."""
        _check_request(topic, partition)
        for name, value in (("offset", offset), ("max_bytes", max_bytes)):
            if type(value) is not int or value < 0:
                raise InvalidRequest(f"{name} must be a non-negative integer, got {value!r}")
        session = reader_id
        if session is None and self._anonymous_next.get((topic, partition)) == offset:
            session = _anonymous_session(topic, partition)
        # a one-off fetch still reads as one reader, so the cache holds its current chunk
        # between the reads of one fetch, and lets go of everything at the end
        token: Hashable = session if session is not None else object()
        try:
            try:
                got = self._fetch_once(topic, partition, offset, max_bytes, token,
                                       session is not None, max_files)
            except _LocalVanished:
                # retention deleted a segment under us: retry on a new snapshot
                self.local_view.rescan()
                try:
                    got = self._fetch_once(topic, partition, offset, max_bytes, token,
                                           session is not None, max_files)
                except _LocalVanished as err:
                    raise TieredError(f"{topic}-{partition}: local segments keep disappearing "
                                      f"while being read ({err}); try again") from None
        finally:
            if session is None:
                self.cache.close_reader(token)
        if reader_id is None:
            self._anonymous_next.put((topic, partition), got.next_offset)
        return got

    def close_reader(self, reader_id: Hashable) -> None:
        """Forget a consumer session named in `fetch`: its cache holds end."""
        self.cache.close_reader(reader_id)

    def earliest_offset(self, topic: str, partition: int) -> int:
        """The first readable offset (Kafka's log start offset, ListOffsets -2)."""
        _check_request(topic, partition)
        local, lo, hi = self.local_view.range(topic, partition, None)
        if self.config.topic_config(topic).remote_read:
            m = self.manifest_view.head(topic, partition, local, required=lo is None)
            if m is not None and m.last_offset >= 0:
                return m.log_start_offset if lo is None else min(lo, m.log_start_offset)
        if lo is None:
            raise RemoteReadDisabled(self._not_local(topic, partition, None, None))
        return lo

    def latest_offset(self, topic: str, partition: int) -> int:
        """The log end offset as a consumer sees it (ListOffsets -1): the local end capped at
        the high watermark when local, else the bucket's last offset + 1."""
        _check_request(topic, partition)
        local, _lo, hi = self.local_view.range(topic, partition, None)
        if hi is not None:
            return hi
        if not self.config.topic_config(topic).remote_read:
            raise RemoteReadDisabled(self._not_local(topic, partition, None, None))
        m = self.manifest_view.head(topic, partition, local, required=True)
        assert m is not None  # noqa: S101 - required=True raises instead
        return m.next_offset

    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp: int
    ) -> TimestampAndOffset | None:
        """The earliest offset whose record timestamp is >= `timestamp` (ms), as Kafka's
        ListOffsets; -2 / -1 mean earliest / latest (timestamp -1 in the answer). None when
        every record is older."""
        _check_request(topic, partition)
        if type(timestamp) is not int or timestamp < EARLIEST_TIMESTAMP:
            raise InvalidRequest(f"timestamp must be >= -2 (ms, or -2/-1), got {timestamp!r}")
        if timestamp == EARLIEST_TIMESTAMP:
            return TimestampAndOffset(NO_TIMESTAMP, self.earliest_offset(topic, partition), None)
        if timestamp == LATEST_TIMESTAMP:
            return TimestampAndOffset(NO_TIMESTAMP, self.latest_offset(topic, partition), None)
        self._count(timestamp_lookups=1)
        local, lo, hi = self.local_view.range(topic, partition, None)
        if self.config.topic_config(topic).remote_read and (lo is None or lo > 0):
            m = self.manifest_view.head(topic, partition, local, required=lo is None)
            if m is not None and m.last_offset >= 0 and (lo is None or m.log_start_offset < lo):
                token = object()
                try:
                    found = self._remote_timestamp(m, timestamp, lo, token)
                finally:
                    self.cache.close_reader(token)
                if found is not None:
                    return found
        elif lo is None:
            raise RemoteReadDisabled(self._not_local(topic, partition, None, None))
        if local is None or lo is None or hi is None:
            return None
        return local_offset_for_timestamp(local, timestamp, lo, hi)

    def aborted_transactions(
        self, topic: str, partition: int, start: int, upper: int
    ) -> list[AbortedTxn]:
        """The aborted transactions a `read_committed` fetch of offsets `[start, upper)` must
        report (Kafka's Fetch `AbortedTransactions`): from the bucket's `.txnindex` objects
        below the local log start and the local `.txnindex` files from there on
        (`cache.transactions`). StoreError / CorruptSegmentError as `fetch`."""
        _check_request(topic, partition)
        local, lo, _hi = self.local_view.range(topic, partition, None)
        remote = None
        if (lo is None or start < lo) and self.config.topic_config(topic).remote_read:
            m = self.manifest_view.head(topic, partition, local, required=False)
            if m is not None and m.last_offset >= 0:
                remote = (m, self.manifests.iter_segments(m, start))
        return self.transactions.search(start, upper, remote=remote, local=local,
                                        local_start=lo)

    def bucket_topic(self, topic: str) -> tuple[str, int | None]:
        """(revision, partition count) of the topic as the bucket knows it: its newest topic
        manifest's, or ("0", None) when it has none (cached like head manifests)."""
        _check_request(topic, 0)
        return self.manifest_view.revision(topic, None)

    def local_partitions(self) -> Mapping[TopicPartition, PartitionLog]:
        """The partitions in the log dirs now (`LocalView.partitions`: read-only, the same
        mapping until the next scan)."""
        return self.local_view.partitions()

    # -- bucket --------------------------------------------------------------------------------

    def _remote_for(
        self, topic: str, partition: int, local: PartitionLog | None, offset: int,
        lo: int | None,
    ) -> PartitionManifest:
        """The head manifest to serve `offset` from, or the error saying why not."""
        if not self.config.topic_config(topic).remote_read:
            self._count(out_of_range=1)
            raise RemoteReadDisabled(self._not_local(topic, partition, offset, lo))
        m = self.manifest_view.head(topic, partition, local, required=True, offset=offset)
        assert m is not None  # noqa: S101 - required=True raises instead
        return m

    def _not_local(self, topic: str, partition: int, offset: int | None, lo: int | None) -> str:
        what = f"offset {offset}" if offset is not None else "the partition"
        where = f" (the local log starts at {lo})" if lo is not None else ""
        return (f"{topic}-{partition}: {what} is not on local disk{where} and remote read is "
                "disabled for the topic (redpanda.remote.read / cloud_storage_enable_remote_read)")

    def _remote_timestamp(
        self, m: PartitionManifest, timestamp: int, stop: int | None, token: Hashable
    ) -> TimestampAndOffset | None:
        """First record at or after `timestamp` among bucket offsets below `stop` (None: all)."""
        first = self.manifests.find_timestamp(m, timestamp)
        if first is None:
            return None
        for seg in self.manifests.iter_segments(m, first.base_offset):
            if stop is not None and seg.base_offset >= stop:
                return None
            if seg.max_timestamp < timestamp:
                continue
            found = self.remote.offset_for_timestamp(
                m, seg, timestamp, max(seg.base_offset, m.log_start_offset), token)
            if found is not None:
                return found
        return None

    # -- the fetch loop ------------------------------------------------------------------------

    def _fetch_once(
        self, topic: str, partition: int, offset: int, max_bytes: int, reader_id: Hashable,
        session: bool, max_files: int | None = None,
    ) -> FetchedPieces:
        local, lo, hi = self.local_view.range(topic, partition, offset)
        m: PartitionManifest | None = None
        if lo is not None and hi is not None and lo <= offset < hi:
            pass  # served locally: no store request at all
        elif hi is not None and offset >= hi:
            self._count(out_of_range=1)
            # the whole readable range: the bucket's start when its head is cached (no
            # request on this path: a consumer polling at the end must stay cheap)
            start = self.manifest_view.cached_start(topic, partition, local)
            first = lo if start is None or lo is None else min(lo, start)
            older = "" if start is not None or first is None or first == 0 else (
                "; older offsets may be in the bucket")
            raise OffsetOutOfRange(
                f"{topic}-{partition}: offset {offset} is at or past the log end {hi} "
                f"(readable offsets: {self._bounds_text(first, hi)}{older})")
        else:
            m = self._remote_for(topic, partition, local, offset, lo)
            start = m.log_start_offset if lo is None else min(lo, m.log_start_offset)
            end = hi if hi is not None else m.next_offset
            gap = lo is not None and m.next_offset < lo
            if offset < start or offset >= end or (gap and m.next_offset <= offset):
                self._count(out_of_range=1)
                raise OffsetOutOfRange(
                    f"{topic}-{partition}: offset {offset} is outside the readable offsets "
                    f"{self._bounds_text(start, end)}"
                    + (f" (offsets {m.next_offset}..{lo - 1} are neither local nor in the "
                       "bucket)" if gap and lo is not None else ""))
        out = Pieces()
        try:
            nxt, sources = self._gather(topic, partition, offset, max_bytes, reader_id, session,
                                        local, lo, hi, m, out, max_files)
        except BaseException:
            out.close()
            raise
        self._count(**({"local_fetches": 1, "local_bytes": out.size} if m is None
                       else {"remote_fetches": 1, "remote_bytes": out.size}))
        log_start = lo if m is None else (m.log_start_offset if lo is None
                                          else min(lo, m.log_start_offset))
        log_end = hi if hi is not None else (None if m is None else m.next_offset)
        return FetchedPieces(topic, partition, offset, out, nxt, log_start, log_end,
                             "+".join(sources) or "none")

    def _gather(
        self, topic: str, partition: int, offset: int, max_bytes: int, reader_id: Hashable,
        session: bool, local: PartitionLog | None, lo: int | None, hi: int | None,
        m: PartitionManifest | None, out: Pieces, max_files: int | None = None,
    ) -> tuple[int, list[str]]:
        """Whole batches from `offset` into `out`, local log and bucket as the offsets lie,
        holding at most `max_files` chunk files (None: no bound); returns the next offset and
        where the bytes came from."""
        sources: list[str] = []
        nxt = offset
        remote_iter = None if m is None else self.manifests.iter_segments(m, offset)
        while True:
            first, budget, before = not out, max_bytes - out.size, out.size
            span: Span | None
            if local is not None and lo is not None and hi is not None and lo <= nxt < hi:
                try:
                    got = self.local.read(local, nxt, budget, first, hi)
                except CorruptSegmentError:
                    if out:  # as below: the batches before the damage are served
                        break
                    raise
                except FileNotFoundError as err:
                    if not out:
                        raise _LocalVanished(str(err)) from None
                    # local retention deleted the next segment mid-fetch (it is archived, or
                    # retention would not have touched it): go on from the bucket instead of
                    # answering short
                    m, remote_iter = self._continue_remotely(topic, partition, local, nxt, m)
                    if m is None:
                        break
                    local, lo, hi = self.local_view.snapshot(topic, partition)
                    continue
                if got is None:
                    break
                out.add(got[0])
                span = got[1]
                where = "local"
            elif remote_iter is not None and m is not None and nxt <= m.last_offset:
                files = None if max_files is None else max(1, max_files) - out.files
                if files is not None and files <= 0:
                    break  # the answer holds as many chunk files as it may
                seg = next((s for s in remote_iter if s.last_offset >= nxt), None)
                try:
                    span = None if seg is None else self.remote.read(
                        m, seg, nxt, budget, first, reader_id, out, session=session,
                        following=self._following(m, seg), max_files=files)
                except TieredError:
                    if out:
                        # Kafka's semantics: serve the readable batches before a damaged or
                        # missing object; the fetch starting at it fails, naming it
                        break
                    raise
                where = "remote"
            else:
                span = None
            if span is None:
                break
            if out.size > before and where not in sources:
                sources.append(where)
            nxt = max(nxt, span.next_offset)
            if not span.exhausted or (out.size >= max_bytes and out):
                break
        return nxt, sources

    def _following(self, m: PartitionManifest, seg: SegmentMeta
                   ) -> Callable[[], SegmentMeta | None]:
        """The segment after `seg` in the bucket, looked up when asked."""
        return lambda: next(iter(self.manifests.iter_segments(m, seg.next_offset)), None)

    def _continue_remotely(
        self, topic: str, partition: int, local: PartitionLog | None, offset: int,
        m: PartitionManifest | None,
    ) -> tuple[PartitionManifest | None, Iterator[SegmentMeta] | None]:
        """After local segments vanished mid-fetch: rescan, and the head manifest and its
        segments from `offset` when the bucket holds it (None, None: serve what was read)."""
        self.local_view.rescan()
        try:
            if m is None:
                m = self._remote_for(topic, partition, local, offset, None)
        except TieredError as err:
            log.info("%s-%d: local segments vanished mid-fetch and the bucket cannot go on "
                     "(%s); answering with what was read", topic, partition, err)
            return None, None
        if offset > m.last_offset:
            return None, None
        return m, self.manifests.iter_segments(m, offset)

    @staticmethod
    def _bounds_text(lo: int | None, hi: int | None) -> str:
        if lo is None or hi is None or hi <= lo:
            return "none: the log is empty" if hi is not None else "unknown"
        return f"{lo}..{hi - 1}"


def _anonymous_session(topic: str, partition: int) -> Hashable:
    """The session of fetches without one that each start where the previous one of the
    partition ended: a consumer reading on (docs/remote-read.md, "The read-ahead window"),
    which the cache reads ahead for like a named session; it expires when idle."""
    return ("anonymous", topic, partition)


def _check_request(topic: object, partition: object) -> None:
    problem = topic_name_problem(topic)
    if problem is not None:
        raise InvalidRequest(problem)
    if type(partition) is not int or not 0 <= partition <= keys.MAX_PARTITION:
        raise InvalidRequest(
            f"partition must be an integer in 0..{keys.MAX_PARTITION}, got {partition!r}")


def _make_cache(config: Config, store: ObjectStore) -> ChunkCache:
    from cache.accounting import CacheSettings

    settings = CacheSettings.from_cluster(config.cluster)

    return ChunkCache(config.cache_dir, settings, store.read_range,
                      strategy=settings.eviction_strategy, stream=store.open_range)
