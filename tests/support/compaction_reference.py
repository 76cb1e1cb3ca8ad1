"""The record-at-a-time key pass compaction used before its column walk: the reference the
tests check `spark_jobs.record_columns` and `spark_jobs.compact_columns` against, and the
semantic tests read the key map from. It decodes every batch (CRC-checked) and keeps one
entry per keyed record, so it is simple and slow; the job never runs it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from tiered.errors import CorruptSegmentError
from tiered.kafka.compaction import (
    ProducerEvent,
    producer_event,
    records_area,
    skim_records,
)
from tiered.kafka.records import BatchHeader, iter_batch_headers


def record_keys(view: memoryview, h: BatchHeader, *, path: str | None = None
                ) -> list[tuple[int, bytes | None, bool]]:
    """(offset, key, value is null) of every record of the batch `h` heads in `view`."""
    try:
        data = records_area(view, h)
    except ValueError as exc:
        raise CorruptSegmentError(f"batch at offset {h.base_offset}: {exc}", path=path,
                                  position=h.position) from None
    base = h.base_offset
    return [(base + r[0], r[2], r[3]) for r in skim_records(data, h, path=path)]


def key_hash(key: bytes) -> bytes:
    """The 16-byte digest compaction keys records by. MD5, as Kafka's `SkimpyOffsetMap`:
    collisions are as unlikely as Kafka's cleaner accepts, and keys of any size shuffle as
    16 bytes."""
    return hashlib.md5(key, usedforsecurity=False).digest()


class KeyEvent(NamedTuple):
    """A keyed record of a data batch: what the key map is built from."""

    hash: bytes
    offset: int
    #: the record's batch, when it is transactional (its records count only if the
    #: transaction committed): (producer id, batch last offset); else None
    txn_batch: tuple[int, int] | None


def scan_segment(
    data: bytes, *, path: str | None = None
) -> Iterator[KeyEvent | ProducerEvent]:
    """Every keyed record of the segment's data batches and every batch with a producer id,
    in offset order. Decodes (and CRC-checks) every batch."""
    view = memoryview(data)
    for h in iter_batch_headers(data, path=path):
        if h.producer_id >= 0:
            yield producer_event(data, h, path)
        if h.is_control:
            continue
        txn = (h.producer_id, h.last_offset) if h.is_transactional else None
        for offset, key, _null in record_keys(view, h, path=path):
            if key is not None:
                yield KeyEvent(key_hash(key), offset, txn)


@dataclass
class SegmentKeys:
    """What the key pass learns from one segment (`scan_keys`), in flat containers rather than
    an object per record: the job's shuffle carries them packed."""

    #: keyed records outside transactions: key digest -> the segment's latest offset of the key
    latest: dict[bytes, int]
    #: keyed records of transactional batches: (batch last offset, key digest, offset); they
    #: count only once the transaction is known to have committed
    txn_keys: list[tuple[int, bytes, int]]
    #: every batch with a producer id
    producers: list[ProducerEvent]


def scan_keys(data: bytes, *, path: str | None = None) -> SegmentKeys:
    """`scan_segment` reduced to what the key map needs, in one pass: the segment's own latest
    offset per key (a later record of a key supersedes an earlier one of the same segment, so
    only the last reaches the partition-wide map), transactional keys, producer batches."""
    md5 = hashlib.md5
    latest: dict[bytes, int] = {}
    txn_keys: list[tuple[int, bytes, int]] = []
    producers: list[ProducerEvent] = []
    view = memoryview(data)
    for h in iter_batch_headers(data, path=path):
        if h.producer_id >= 0:
            producers.append(producer_event(data, h, path))
        if h.is_control:
            continue
        base = h.base_offset
        recs = skim_records(records_area(view, h), h, path=path)
        if h.is_transactional:
            last = h.last_offset
            txn_keys.extend((last, md5(r[2], usedforsecurity=False).digest(), base + r[0])
                            for r in recs if r[2] is not None)
        else:
            latest.update((md5(r[2], usedforsecurity=False).digest(), base + r[0])
                          for r in recs if r[2] is not None)
    return SegmentKeys(latest, txn_keys, producers)
