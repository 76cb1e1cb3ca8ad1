"""Aborted transactions for `read_committed` fetches: the `.txnindex` of local segments and the
`.txnindex` objects the archiver uploads beside segment objects (docs/format.md, "Segment and
index objects"), searched as Kafka's `collectAbortedTxns` searches its segments
(`tiered.kafka.txnindex.AbortedSearch`).

A segment object's transaction index is immutable (it goes up before the manifest naming the
segment), so what was read, including "there is none", is kept in an LRU for good: a consumer
re-reading history costs no requests. The archiver uploads the index only when it is not
empty, so a missing object is the common case and means "no aborted transaction here".
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator

from cache.segment_reads import Lru
from manifests import segment_indexes
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from tiered.kafka.local_log import PartitionLog
from tiered.kafka.segment import Segment
from tiered.kafka.txnindex import AbortedSearch, AbortedTxn, parse_txnindex
from tiered.store.base import ObjectStore

__all__ = ["TransactionIndexes"]

log = logging.getLogger(__name__)

#: segment objects whose transaction index (or its absence) stays in memory; an entry is a
#: tuple, usually empty
REMOTE_ENTRIES = 16384


class TransactionIndexes:
    """Reads transaction indexes, local and remote, and runs the aborted-transaction search
    over a partition's segments. Thread-safe (the LRU locks; files are read whole)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._remote: Lru[str, tuple[AbortedTxn, ...]] = Lru(REMOTE_ENTRIES)
        self.remote_reads = 0

    def remote(self, m: PartitionManifest, seg: SegmentMeta) -> tuple[AbortedTxn, ...]:
        """The entries of the transaction index beside `seg` (none when it has none).
        `CorruptSegmentError` for one that does not parse; `StoreError` when the store fails,
        and `ObjectNotFound` when the segment's index bundle is missing: that is damage, and
        serving the segment as if it had no aborted transaction would hand a read-committed
        consumer aborted records (`manifests.segment_indexes.read_indexes`)."""
        key = m.segment_key(seg)
        hit = self._remote.get(key)
        if hit is not None:
            return hit
        self.remote_reads += 1
        data = segment_indexes.read_indexes(self._store, m.data_prefix, seg.object_name,
                                            seg.index_layout, ("txnindex",),
                                            segment_bytes=seg.size_bytes)["txnindex"]
        entries = tuple(parse_txnindex(data, path=f"{key} (txnindex)")) if data else ()
        self._remote.put(key, entries)
        return entries

    @staticmethod
    def local(segment: Segment) -> list[AbortedTxn]:
        """The entries of a local segment's `.txnindex` (none when the file is missing)."""
        try:
            data = segment.txnindex_path.read_bytes()
        except FileNotFoundError:
            return []
        return parse_txnindex(data, path=str(segment.txnindex_path))

    def search(
        self, start: int, upper: int, *, remote: tuple[PartitionManifest, Iterator[SegmentMeta]]
        | None, local: PartitionLog | None, local_start: int | None,
    ) -> list[AbortedTxn]:
        """Aborted transactions overlapping `[start, upper)`: bucket segments from the one
        holding `start` up to the local log start, then local segments from the one holding
        max(`start`, `local_start`), until the search is complete. Duplicates (an entry seen
        in both a bucket object and a local file) are reported once."""
        search = AbortedSearch(start, upper)
        if remote is not None:
            m, segments = remote
            for seg in segments:
                if local_start is not None and seg.base_offset >= local_start:
                    break  # the local log holds these offsets: it answers for them
                if search.add(self.remote(m, seg)):
                    return _unique(search.found)
        if local is not None and local.segments:
            bases = [s.base_offset for s in local.segments]
            first = max(0, bisect.bisect_right(bases, max(start, local_start or 0)) - 1)
            for segment in local.segments[first:]:
                if search.add(self.local(segment)):
                    break
        return _unique(search.found)


def _unique(found: list[AbortedTxn]) -> list[AbortedTxn]:
    return list(dict.fromkeys(found))
