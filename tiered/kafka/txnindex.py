"""Kafka's transaction index (`{base offset:020d}.txnindex`): one entry per aborted transaction
whose abort marker is in the segment, appended when the marker is written.

    AbortedTxn =>
      Version => Int16            0
      ProducerId => Int64         the transactional producer
      FirstOffset => Int64        the transaction's first offset (may be in an earlier segment)
      LastOffset => Int64         the abort marker's offset
      LastStableOffset => Int64   the partition's last stable offset once the marker was written

The file is nothing but entries, 34 bytes each, no header; an empty or missing file means no
transaction was aborted in the segment. A `read_committed` fetch needs the aborted transactions
overlapping the offsets it returns (`AbortedSearch`, Kafka's `collectAbortedTxns`): entries
live beside their markers, so the search walks the segments from the one holding the fetch
offset forward until an entry shows that every transaction open before the fetch's upper bound
was decided by then.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from tiered.errors import CorruptSegmentError

__all__ = ["ENTRY", "AbortedSearch", "AbortedTxn", "encode_txnindex", "parse_txnindex"]

ENTRY = struct.Struct(
    ">"
    "h"  # version: 0
    "q"  # producerId
    "q"  # firstOffset: the transaction's first offset
    "q"  # lastOffset: the abort marker's offset
    "q"  # lastStableOffset: the LSO right after the marker
)
#: the only entry version Kafka has written
TXNINDEX_VERSION = 0


class AbortedTxn(NamedTuple):
    """One aborted transaction: its producer, its offsets and the LSO after its marker."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def parse_txnindex(data: bytes | memoryview, *, path: str | None = None) -> list[AbortedTxn]:
    """Every entry of a `.txnindex` file's bytes; `CorruptSegmentError` (naming `path` and the
    byte) for a partial entry, an unknown version or offsets that contradict each other."""
    view = memoryview(data)
    if len(view) % ENTRY.size:
        raise CorruptSegmentError(
            f"transaction index is {len(view)} bytes, not a multiple of {ENTRY.size}",
            path=path, position=len(view) - len(view) % ENTRY.size)
    out = []
    for pos in range(0, len(view), ENTRY.size):
        version, pid, first, last, lso = ENTRY.unpack_from(view, pos)
        if version != TXNINDEX_VERSION:
            raise CorruptSegmentError(f"transaction index entry version {version}, expected "
                                      f"{TXNINDEX_VERSION}", path=path, position=pos)
        if not 0 <= first <= last:
            raise CorruptSegmentError(f"aborted transaction of producer {pid} has first offset "
                                      f"{first} after its marker at {last}", path=path,
                                      position=pos)
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def encode_txnindex(entries: Iterable[AbortedTxn]) -> bytes:
    """The bytes of a `.txnindex` file holding `entries`, in order."""
    return b"".join(ENTRY.pack(TXNINDEX_VERSION, *e) for e in entries)


@dataclass
class AbortedSearch:
    """The aborted transactions a fetch of offsets `[start, upper)` must report, gathered
    segment by segment (Kafka's `collectAbortedTxns`): feed each segment's entries in offset
    order with `add` until `complete`.

    An entry matters when its transaction overlaps the range (`last_offset >= start` and
    `first_offset < upper`). The search is complete at the first entry whose last stable
    offset reaches `upper`: once the LSO passed `upper`, every transaction that began below
    it had been decided, so no later marker can belong to one of them."""

    start: int
    upper: int
    found: list[AbortedTxn] = field(default_factory=list)
    complete: bool = False

    def add(self, entries: Iterable[AbortedTxn]) -> bool:
        """Take one segment's entries; returns `complete`."""
        for entry in entries:
            if self.complete:
                break
            if entry.last_offset >= self.start and entry.first_offset < self.upper:
                self.found.append(entry)
            if entry.last_stable_offset >= self.upper:
                self.complete = True
        return self.complete
