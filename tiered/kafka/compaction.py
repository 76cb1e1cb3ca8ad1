"""Kafka's log cleaner, one batch at a time: pure functions over record batches, no I/O.

This is the record-level half of compacting a partition's history (docs/compaction.md). It
follows Kafka's `Cleaner.cleanInto` filter and `MemoryRecords.filterTo`:

* `batch_retention` decides a batch's fate before its records are looked at: a batch of an
  aborted transaction (and a transaction marker nothing refers to any more) may be discarded;
  the last batch of a producer is kept, emptied if need be, so its sequence number and epoch
  survive (`RETAIN_EMPTY`); anything else whose records all go is dropped (`DELETE_EMPTY`).
* `retain_record` keeps a record when it is the latest for its key and is not a tombstone past
  its batch's delete horizon. Records without a key are kept (the bucket is not the place to
  lose data the broker accepted) and counted.
* `clean_batch` writes the survivors: the original bytes when nothing changed; otherwise the
  batch rebuilt with the same base offset, the same `lastOffsetDelta` (so a producer's last
  sequence number stays where it was), the same codec, producer fields and leader epoch, and a
  fresh CRC-32C. A batch that keeps a tombstone (or a discardable transaction marker) without
  a delete horizon gets one (KIP-534): the attribute bit 0x40 is set and the horizon is stored
  in the `firstTimestamp` field, record timestamp deltas re-based on it, as Kafka's
  `DefaultRecordBatch` does. A later pass after the horizon drops the tombstone.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

from tiered.errors import CorruptSegmentError
from tiered.kafka.builder import encode_batch
from tiered.kafka.compression import codec_by_id
from tiered.kafka.records import (
    _CRC,
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_OFFSET,
    LOG_OVERHEAD,
    MAGIC_V2,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Record,
    RecordBatch,
    decode_batch,
    iter_batch_headers,
)
from tiered.kafka.varint import decode_varint, decode_varlong

#: where lastOffsetDelta sits in a batch: right after attributes (int16)
_LAST_OFFSET_DELTA_AT = ATTRIBUTES_OFFSET + 2
_LAST_OFFSET_DELTA = struct.Struct(">i")


class BatchRetention(enum.Enum):
    """Kafka's `RecordFilter.BatchRetention`."""

    #: drop the whole batch without looking at its records
    DELETE = "delete"
    #: keep the batch's header even when every record goes (a producer's last batch)
    RETAIN_EMPTY = "retain_empty"
    #: drop the batch only if every record goes
    DELETE_EMPTY = "delete_empty"


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What the cleaner decided about one batch before filtering its records."""

    retention: BatchRetention
    #: every record of the batch goes (aborted data, an expired marker)
    discard_records: bool
    #: a transaction marker that may go once its delete horizon passes (Kafka's
    #: `containsMarkerForEmptyTxn`): it gets a horizon like a tombstone
    marker_for_empty_txn: bool


def batch_retention(
    header: BatchHeader, *, can_discard: bool, last_of_producer: bool, now_ms: int
) -> BatchDecision:
    """Kafka's `checkBatchRetention`. `can_discard`: for a data batch, it belongs to an aborted
    transaction; for a control batch, no batch of its transaction is left in the log (Kafka's
    `CleanedTransactionMetadata`). `last_of_producer`: the batch holds its producer's last
    sequence number (or, for a marker, its last epoch) and must not vanish."""
    if header.is_control:
        horizon = header.delete_horizon_ms
        discard = can_discard and horizon is not None and horizon <= now_ms
    else:
        discard = can_discard
    if header.producer_id >= 0 and last_of_producer:
        retention = BatchRetention.RETAIN_EMPTY
    elif discard:
        retention = BatchRetention.DELETE
    else:
        retention = BatchRetention.DELETE_EMPTY
    return BatchDecision(retention, discard, can_discard and header.is_control)


def retain_record(
    header: BatchHeader, record: Record, *, latest: bool, now_ms: int
) -> bool:
    """Kafka's `shouldRetainRecord` for a data record with a key: it is the latest record of
    its key (`latest`), and either has a value or is a tombstone whose batch's delete horizon
    is unset or not yet reached."""
    if not latest:
        return False
    if record.value is not None:
        return True
    horizon = header.delete_horizon_ms
    return horizon is None or now_ms < horizon


@dataclass(frozen=True, slots=True)
class CleanedBatch:
    """One batch after cleaning: `data` is b"" when the batch was dropped."""

    data: bytes
    records_in: int
    records_kept: int
    #: tombstones (null values, keyed, data batches) removed
    tombstones_dropped: int
    #: records without a key, kept
    keyless_kept: int
    #: the batch was rebuilt (not copied byte for byte)
    rewritten: bool
    #: a delete horizon was set by this pass
    horizon_set: bool


def clean_batch(
    raw: bytes | memoryview,
    batch: RecordBatch,
    decision: BatchDecision,
    is_latest: Callable[[Record], bool],
    *,
    now_ms: int,
    delete_retention_ms: int | None,
) -> CleanedBatch:
    """Kafka's `MemoryRecords.filterTo` for one batch. `raw` is the batch's bytes (from its
    baseOffset to its end), `batch` the same batch decoded. `is_latest(record)` answers for
    keyed data records whether no later record of the key exists. `delete_retention_ms` None
    means tombstones are kept forever (no horizon is ever set)."""
    h = batch.header
    n = len(batch.records)
    if h.magic != MAGIC_V2:  # iter_batches refuses others; kept as a guard for callers
        raise ValueError(f"only magic 2 batches can be cleaned, not magic {h.magic}")
    if decision.retention is BatchRetention.DELETE:
        return CleanedBatch(b"", n, 0, _tombstones(batch, batch.records), 0, False, False)
    kept: list[Record] = []
    keyless = tombstones_kept = 0
    for record in batch.records:
        if decision.discard_records:
            continue
        if h.is_control:
            kept.append(record)
        elif record.key is None:
            keyless += 1
            kept.append(record)
        elif retain_record(h, record, latest=is_latest(record), now_ms=now_ms):
            kept.append(record)
            if record.value is None:
                tombstones_kept += 1
    if len(kept) != n:
        kept_offsets = {r.offset for r in kept}
        dropped = [r for r in batch.records if r.offset not in kept_offsets]
    else:
        dropped = []
    tombstones_dropped = _tombstones(batch, dropped)
    if kept:
        needs_horizon = (
            (tombstones_kept > 0 or decision.marker_for_empty_txn)
            and h.delete_horizon_ms is None
            and delete_retention_ms is not None
        )
        if len(kept) == n and not needs_horizon:
            return CleanedBatch(bytes(raw), n, n, 0, keyless, False, False)
        horizon = h.delete_horizon_ms
        if needs_horizon and delete_retention_ms is not None:
            horizon = now_ms + delete_retention_ms
        data = rebuild_batch(h, kept, delete_horizon_ms=horizon)
        return CleanedBatch(data, n, len(kept), tombstones_dropped, keyless, True, needs_horizon)
    if decision.retention is BatchRetention.RETAIN_EMPTY:
        return CleanedBatch(empty_batch(h), n, 0, tombstones_dropped, 0, True, False)
    return CleanedBatch(b"", n, 0, tombstones_dropped, 0, False, False)


def _tombstones(batch: RecordBatch, records: tuple[Record, ...] | list[Record]) -> int:
    if batch.header.is_control:
        return 0
    return sum(1 for r in records if r.key is not None and r.value is None)


def rebuild_batch(
    h: BatchHeader, records: list[Record], *, delete_horizon_ms: int | None
) -> bytes:
    """A batch holding `records` (a non-empty subset of the batch `h` heads) as Kafka's
    `buildRetainedRecordsInto` writes it: base offset, codec, timestamp type, producer fields,
    leader epoch and `lastOffsetDelta` of the original; `firstTimestamp` the delete horizon
    when one is set (attribute 0x40), else the first kept record's timestamp."""
    log_append = bool(h.attributes & TIMESTAMP_TYPE_MASK)
    data = bytearray(encode_batch(
        records,
        base_offset=h.base_offset,
        compression=h.compression,
        timestamp_type="log_append" if log_append else "create",
        partition_leader_epoch=h.partition_leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        transactional=h.is_transactional,
        control=h.is_control,
        max_timestamp=h.max_timestamp if log_append else None,
        delete_horizon_ms=delete_horizon_ms,
    ))
    _LAST_OFFSET_DELTA.pack_into(data, _LAST_OFFSET_DELTA_AT, h.last_offset_delta)
    _CRC.pack_into(data, CRC_OFFSET, crc32c.crc32c(memoryview(data)[ATTRIBUTES_OFFSET:]))
    return bytes(data)


def empty_batch(h: BatchHeader) -> bytes:
    """Kafka's `DefaultRecordBatch.writeEmptyHeader` for batch `h`: no records, no codec, the
    same offsets, producer fields, leader epoch and type bits; both timestamps the batch's max
    timestamp; no delete horizon."""
    attributes = h.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK)
    attributes &= ~COMPRESSION_MASK
    out = bytearray(BATCH_HEADER.size)
    BATCH_HEADER.pack_into(
        out, 0, h.base_offset, BATCH_HEADER.size - LOG_OVERHEAD, h.partition_leader_epoch,
        MAGIC_V2, 0, attributes, h.last_offset_delta, h.max_timestamp, h.max_timestamp,
        h.producer_id, h.producer_epoch, h.base_sequence, 0,
    )
    _CRC.pack_into(out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


# -- a segment's worth of batches ---------------------------------------------------------------

#: flags per batch (by its last offset) that the partition-wide transaction pass decides
ABORTED = 1  # a data batch of an aborted transaction: its records go
IN_DOUBT = 2  # a transactional data batch with no marker after it in the cleaned range: untouched
MARKER_DISCARDABLE = 4  # a transaction marker no batch of its transaction is left for
LAST_OF_PRODUCER = 8  # the producer's last batch in the cleaned range: kept, emptied if need be

#: producer event kinds (`scan_segment`)
DATA, TXN_DATA, COMMIT, ABORT, OTHER_CONTROL = range(5)


def record_keys(view: memoryview, h: BatchHeader, *, path: str | None = None
                ) -> list[tuple[int, bytes | None, bool]]:
    """(offset, key, value is null) of every record of the batch `h` heads in `view`: the
    fields compaction decides by, without building records (the walk over a segment is the
    job's hot loop). The batch's CRC was checked when `h` was read."""
    try:
        data = codec_by_id(h.attributes & COMPRESSION_MASK).decompress(
            view[h.position + BATCH_HEADER.size:h.end_position])
        out = []
        pos = 0
        for _ in range(h.records_count):
            length, pos = decode_varint(data, pos)
            end = pos + length
            _ts, at = decode_varlong(data, pos + 1)
            delta, at = decode_varint(data, at)
            klen, at = decode_varint(data, at)
            key = None if klen < 0 else data[at:at + klen]
            at += max(klen, 0)
            vlen, at = decode_varint(data, at)
            if length < 0 or end > len(data) or at > end or not 0 <= delta <= h.last_offset_delta:
                raise CorruptSegmentError("malformed record", path=path, position=h.position)
            out.append((h.base_offset + delta, key, vlen < 0))
            pos = end
        if pos != len(data):
            raise CorruptSegmentError("bytes left after the records", path=path,
                                      position=h.position)
        return out
    except (IndexError, ValueError, struct.error) as exc:
        raise CorruptSegmentError(f"batch at offset {h.base_offset}: malformed records: {exc}",
                                  path=path, position=h.position) from None


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


class ProducerEvent(NamedTuple):
    """A batch with a producer id: what the transaction pass reads."""

    producer_id: int
    base_offset: int
    last_offset: int
    kind: int
    producer_epoch: int


def scan_segment(
    data: bytes, *, path: str | None = None
) -> Iterator[KeyEvent | ProducerEvent]:
    """Every keyed record of the segment's data batches and every batch with a producer id,
    in offset order. Decodes (and CRC-checks) every batch."""
    view = memoryview(data)
    for h in iter_batch_headers(data, path=path):
        if h.producer_id >= 0:
            if h.is_control:
                batch = decode_batch(data, h.position, path=path)
                kind = {"commit": COMMIT, "abort": ABORT}.get(batch.control_type or "",
                                                               OTHER_CONTROL)
            else:
                kind = TXN_DATA if h.is_transactional else DATA
            yield ProducerEvent(h.producer_id, h.base_offset, h.last_offset, kind,
                                h.producer_epoch)
        if h.is_control:
            continue
        txn = (h.producer_id, h.last_offset) if h.is_transactional else None
        for offset, key, _null in record_keys(view, h, path=path):
            if key is not None:
                yield KeyEvent(key_hash(key), offset, txn)


def transaction_flags(events: Iterable[ProducerEvent]) -> dict[int, int]:
    """Flags (`ABORTED`, `IN_DOUBT`, `MARKER_DISCARDABLE`, `LAST_OF_PRODUCER`) by batch last
    offset for one producer's batches in the cleaned range, after Kafka's
    `CleanedTransactionMetadata`: a data batch followed by an abort marker is aborted; a
    marker is discardable when no data batch of its transaction is left before it (an abort
    marker whose data this pass removes stays for the next pass); the producer's last batch is
    retained. Batches whose transaction has no marker in the range are in doubt."""
    flags: dict[int, int] = {}
    pending: list[int] = []
    last: int | None = None
    for ev in sorted(events, key=lambda e: e.base_offset):
        last = ev.last_offset
        if ev.kind in (COMMIT, ABORT):
            if ev.kind == ABORT:
                for off in pending:
                    flags[off] = flags.get(off, 0) | ABORTED
            if not pending:
                flags[ev.last_offset] = flags.get(ev.last_offset, 0) | MARKER_DISCARDABLE
            pending = []
        elif ev.kind == TXN_DATA:
            pending.append(ev.last_offset)
    for off in pending:
        flags[off] = flags.get(off, 0) | IN_DOUBT
    if last is not None:
        flags[last] = flags.get(last, 0) | LAST_OF_PRODUCER
    return flags


@dataclass
class SegmentCleaning:
    """One segment after cleaning: its new bytes and what happened to it."""

    data: bytes
    bytes_in: int = 0
    records_in: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0
    keyless_kept: int = 0
    batches_in: int = 0
    batches_dropped: int = 0
    horizons_set: int = 0
    #: some batch was rebuilt or dropped: the bytes differ from the input
    changed: bool = False
    #: the last batch of the input (for an empty result: `empty_batch` of it keeps the range)
    last_header: BatchHeader | None = None


def compact_segment(
    data: bytes,
    *,
    latest: Container[int],
    flags: Mapping[int, int],
    now_ms: int,
    delete_retention_ms: int | None,
    path: str | None = None,
) -> SegmentCleaning:
    """Clean every batch of one segment. `latest` holds the offsets of the records that are
    the latest of their key across the cleaned range; `flags` the transaction pass's verdicts
    by batch last offset (`transaction_flags`)."""
    out = bytearray()
    res = SegmentCleaning(b"", bytes_in=len(data))
    view = memoryview(data)
    for h in iter_batch_headers(data, path=path):
        res.batches_in += 1
        res.last_header = h
        f = flags.get(h.last_offset, 0)
        raw = view[h.position:h.end_position]
        if f & IN_DOUBT:  # undecided transaction: nothing about it is known yet
            out += raw
            res.records_in += h.records_count
            res.records_kept += h.records_count
            continue
        if not h.is_control and not f:
            fast = _plain_batch(h, record_keys(view, h, path=path), latest, now_ms,
                                delete_retention_ms)
            if fast is not None:  # kept whole or dropped whole: no record decoded
                kept_all, records, tombstones, keyless = fast
                res.records_in += records
                if kept_all:
                    res.records_kept += records
                    res.keyless_kept += keyless
                    out += raw
                else:
                    res.tombstones_dropped += tombstones
                    res.batches_dropped += 1
                    res.changed = True
                continue
        batch = decode_batch(data, h.position, path=path)
        decision = batch_retention(
            h,
            can_discard=bool(f & (MARKER_DISCARDABLE if h.is_control else ABORTED)),
            last_of_producer=bool(f & LAST_OF_PRODUCER),
            now_ms=now_ms,
        )
        cleaned = clean_batch(raw, batch, decision, lambda r: r.offset in latest,
                              now_ms=now_ms, delete_retention_ms=delete_retention_ms)
        res.records_in += cleaned.records_in
        res.records_kept += cleaned.records_kept
        res.tombstones_dropped += cleaned.tombstones_dropped
        res.keyless_kept += cleaned.keyless_kept
        res.horizons_set += int(cleaned.horizon_set)
        if not cleaned.data:
            res.batches_dropped += 1
            res.changed = True
            continue
        res.changed = res.changed or cleaned.rewritten
        out += cleaned.data
    res.data = bytes(out)
    return res


def _plain_batch(
    h: BatchHeader, records: list[tuple[int, bytes | None, bool]], latest: Container[int],
    now_ms: int, delete_retention_ms: int | None,
) -> tuple[bool, int, int, int] | None:
    """For a data batch outside transactions and not a producer's last: (kept whole, records,
    keyed tombstones, keyless records) when the batch is copied or dropped whole, as
    `clean_batch` would decide; None when some records stay and others go, or a horizon is
    due (then the batch is rebuilt by `clean_batch`)."""
    if not records:  # an empty header: Kafka's rules for it are `clean_batch`'s
        return None
    horizon = h.delete_horizon_ms
    tombstones_live = horizon is None or now_ms < horizon
    kept = keyless = tombstones = kept_tombstones = 0
    for offset, key, null in records:
        if key is None:
            kept += 1
            keyless += 1
            continue
        if null:
            tombstones += 1
        if offset in latest and (not null or tombstones_live):
            kept += 1
            kept_tombstones += null
    if kept == len(records):
        if kept_tombstones and horizon is None and delete_retention_ms is not None:
            return None  # the horizon is set now: rebuilt
        return True, len(records), 0, keyless
    if kept == 0:
        return False, len(records), tombstones, 0
    return None
