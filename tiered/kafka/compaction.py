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
import struct
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
    DELETE_HORIZON_MASK,
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
from tiered.kafka.txnindex import AbortedTxn
from tiered.kafka.varint import append_varint, append_varlong, decode_varint, decode_varlong

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

#: producer event kinds (`producer_event`)
DATA, TXN_DATA, COMMIT, ABORT, OTHER_CONTROL = range(5)


#: one record as `skim_records` sees it: (offset delta, timestamp delta, key or None, value is
#: null, where the record starts (its length varint), where its attributes byte is, where the
#: fields after the timestamp delta start, where it ends), positions in the batch's records area
Skimmed = tuple[int, int, bytes | None, bool, int, int, int, int]


def records_area(view: memoryview, h: BatchHeader) -> bytes:
    """The records of the batch `h` heads in `view`, decompressed."""
    return codec_by_id(h.attributes & COMPRESSION_MASK).decompress(
        view[h.position + BATCH_HEADER.size:h.end_position])


def skim_records(data: bytes, h: BatchHeader, *, path: str | None = None) -> list[Skimmed]:
    """Every record of the batch `h` heads, from its records area `data`, as `Skimmed`: the
    fields compaction decides by and the positions that let a rebuilt batch copy a record's
    bytes instead of decoding and re-encoding it. Values and headers are stepped over, not
    read; every length is checked against the record's own length (the walk is the job's hot
    loop, so the one-byte varints are decoded inline). The batch's CRC was checked when `h`
    was read."""
    out: list[Skimmed] = []
    append = out.append
    last_delta = h.last_offset_delta
    size = len(data)
    pos = 0
    prev = -1
    try:
        for _ in range(h.records_count):
            start = pos
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = decode_varint(data, pos)
            end = pos + length
            attr_at = pos
            b = data[pos + 1]
            if b < 0x80:
                ts = (b >> 1) ^ -(b & 1)
                at = pos + 2
            else:
                ts, at = decode_varlong(data, pos + 1)
            rest = at
            b = data[at]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                at += 1
            else:
                delta, at = decode_varint(data, at)
            b = data[at]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                at += 1
            else:
                klen, at = decode_varint(data, at)
            if klen < 0:
                key = None
            else:
                key = data[at:at + klen]
                at += klen
            b = data[at]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                at += 1
            elif data[at + 1] < 0x80:
                b = (b & 0x7F) | (data[at + 1] << 7)
                vlen = (b >> 1) ^ -(b & 1)
                at += 2
            else:
                vlen, at = decode_varint(data, at)
            if vlen > 0:
                at += vlen
            if at < end and data[at] == 0:  # no headers: the common case
                at += 1
            else:
                at = _skip_headers(data, at, end)
            if (length < 0 or end > size or at != end or klen < -1 or vlen < -1
                    or not prev < delta <= last_delta):
                raise CorruptSegmentError(
                    f"batch at offset {h.base_offset}: malformed record at byte {start}",
                    path=path, position=h.position)
            prev = delta
            append((delta, ts, key, vlen < 0, start, attr_at, rest, end))
            pos = end
    except (IndexError, ValueError) as exc:
        raise CorruptSegmentError(f"batch at offset {h.base_offset}: malformed records: {exc}",
                                  path=path, position=h.position) from None
    if pos != size:
        raise CorruptSegmentError("bytes left after the records", path=path, position=h.position)
    return out


def _skip_headers(data: bytes, at: int, end: int) -> int:
    """The position after a record's headers (count, then key and value per header); a null
    header key or a length past the record's end is refused as the full decoder does."""
    count, at = decode_varint(data, at)
    if count < 0:
        raise ValueError(f"negative header count {count}")
    for _ in range(count):
        klen, at = decode_varint(data, at)
        if klen < 0:
            raise ValueError("null header key")
        at += klen
        vlen, at = decode_varint(data, at)
        at += max(vlen, 0)
        if at > end:
            raise ValueError("header runs past the record")
    return at


class ProducerEvent(NamedTuple):
    """A batch with a producer id: what the transaction pass reads."""

    producer_id: int
    base_offset: int
    last_offset: int
    kind: int
    producer_epoch: int


def producer_event(data: bytes, h: BatchHeader, path: str | None) -> ProducerEvent:
    """The batch `h` (which has a producer id) as the transaction pass sees it."""
    if h.is_control:
        batch = decode_batch(data, h.position, path=path)
        kind = {"commit": COMMIT, "abort": ABORT}.get(batch.control_type or "", OTHER_CONTROL)
    else:
        kind = TXN_DATA if h.is_transactional else DATA
    return ProducerEvent(h.producer_id, h.base_offset, h.last_offset, kind, h.producer_epoch)


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
    #: last offsets of the transaction markers kept whose transaction still had data in the
    #: cleaned range: the only markers whose `.txnindex` entries stay (`live_txn_entries`)
    live_markers: list[int] = field(default_factory=list)


#: cleans one data batch given its bytes, header and transaction flags (`compact_segment`)
DataBatchCleaner = Callable[[memoryview, BatchHeader, int], CleanedBatch]


def compact_segment(
    data: bytes,
    *,
    latest: Container[int],
    flags: Mapping[int, int],
    now_ms: int,
    delete_retention_ms: int | None,
    path: str | None = None,
    data_batch: DataBatchCleaner | None = None,
    headers: Sequence[BatchHeader] | None = None,
) -> SegmentCleaning:
    """Clean every batch of one segment. `latest` holds the offsets of the records that are
    the latest of their key across the cleaned range; `flags` the transaction pass's verdicts
    by batch last offset (`transaction_flags`). Data batches are walked once (`skim_records`):
    a batch kept whole is copied, one that loses records is rebuilt from its survivors' bytes;
    control batches (rare) are decoded. `data_batch` replaces `clean_data_batch` for data
    batches (the compaction job's, which walked every record of the segment at once);
    `headers` are the segment's batch headers when the caller has walked them already."""
    out = bytearray()
    res = SegmentCleaning(b"", bytes_in=len(data))
    view = memoryview(data)
    for h in iter_batch_headers(data, path=path) if headers is None else headers:
        res.batches_in += 1
        res.last_header = h
        f = flags.get(h.last_offset, 0) if flags else 0
        raw = view[h.position:h.end_position]
        if f & IN_DOUBT:  # undecided transaction: nothing about it is known yet
            out += raw
            res.records_in += h.records_count
            res.records_kept += h.records_count
            continue
        if h.is_control:
            batch = decode_batch(data, h.position, path=path)
            decision = batch_retention(h, can_discard=bool(f & MARKER_DISCARDABLE),
                                       last_of_producer=bool(f & LAST_OF_PRODUCER),
                                       now_ms=now_ms)
            cleaned = clean_batch(raw, batch, decision, lambda r: r.offset in latest,
                                  now_ms=now_ms, delete_retention_ms=delete_retention_ms)
            if cleaned.data and not f & MARKER_DISCARDABLE:
                res.live_markers.append(h.last_offset)
        elif data_batch is not None:
            cleaned = data_batch(raw, h, f)
        else:
            cleaned = clean_data_batch(raw, h, records_area(view, h), f, latest, now_ms=now_ms,
                                       delete_retention_ms=delete_retention_ms, path=path)
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


def clean_data_batch(
    raw: bytes | memoryview,
    h: BatchHeader,
    data: bytes,
    flags: int,
    latest: Container[int],
    *,
    now_ms: int,
    delete_retention_ms: int | None,
    path: str | None = None,
) -> CleanedBatch:
    """`clean_batch` for a data batch, without building records: `data` is its records area
    (`records_area`), `flags` the transaction pass's verdict on it. The same decisions, in one
    walk over the records; survivors are copied into the rebuilt batch (`splice_batch`)."""
    decision = batch_retention(h, can_discard=bool(flags & ABORTED),
                               last_of_producer=bool(flags & LAST_OF_PRODUCER), now_ms=now_ms)
    recs = skim_records(data, h, path=path)
    n = len(recs)
    if decision.retention is BatchRetention.DELETE:
        return CleanedBatch(b"", n, 0, sum(1 for r in recs if r[3] and r[2] is not None),
                            0, False, False)
    horizon = h.delete_horizon_ms
    tombstones_live = horizon is None or now_ms < horizon
    base = h.base_offset
    kept: list[Skimmed] = []
    keyless = tombstones_kept = tombstones_dropped = 0
    for r in recs:
        if r[2] is None:
            if not decision.discard_records:
                keyless += 1
                kept.append(r)
        elif (not decision.discard_records and (base + r[0]) in latest
              and (tombstones_live or not r[3])):
            kept.append(r)
            tombstones_kept += r[3]
        elif r[3]:
            tombstones_dropped += 1
    if kept:
        needs_horizon = (tombstones_kept > 0 and horizon is None
                         and delete_retention_ms is not None)
        if len(kept) == n and not needs_horizon:
            return CleanedBatch(bytes(raw), n, n, 0, keyless, False, False)
        if needs_horizon and delete_retention_ms is not None:
            horizon = now_ms + delete_retention_ms
        rebuilt = splice_batch(h, data, kept, delete_horizon_ms=horizon)
        return CleanedBatch(rebuilt, n, len(kept), tombstones_dropped, keyless, True,
                            needs_horizon)
    if decision.retention is BatchRetention.RETAIN_EMPTY:
        return CleanedBatch(empty_batch(h), n, 0, tombstones_dropped, 0, True, False)
    return CleanedBatch(b"", n, 0, tombstones_dropped, 0, False, False)


#: zig-zag varint bytes by zig-zag value, for the one- and two-byte values (a rebuilt batch's
#: timestamp deltas and record lengths), so re-basing a record costs no encoding loop
_SMALL_VARINTS_UP_TO = 1 << 14
_SMALL_VARINTS: list[bytes] = [
    bytes((z,)) if z < 0x80 else bytes(((z & 0x7F) | 0x80, z >> 7))
    for z in range(_SMALL_VARINTS_UP_TO)
]


def splice_batch(
    h: BatchHeader, data: bytes, kept: list[Skimmed], *, delete_horizon_ms: int | None
) -> bytes:
    """`rebuild_batch` from the survivors' bytes: each kept record (`Skimmed`, positions in
    the records area `data`) is copied as it is, only its timestamp delta re-based when the
    batch's `firstTimestamp` moves (to the first kept record's timestamp, or the delete
    horizon) and its length prefix with it. The header is Kafka's `buildRetainedRecordsInto`'s,
    as `rebuild_batch` writes it."""
    log_append = bool(h.attributes & TIMESTAMP_TYPE_MASK)
    first = h.first_timestamp
    stamp0 = h.max_timestamp if log_append else first + kept[0][1]
    base_ts = stamp0 if delete_horizon_ms is None else delete_horizon_ms
    body = bytearray()
    max_ts = None
    record = bytearray()
    for _delta, ts_delta, _key, _null, start, attr_at, rest, end in kept:
        stamp = h.max_timestamp if log_append else first + ts_delta
        if max_ts is None or stamp > max_ts:
            max_ts = stamp
        new_delta = stamp - base_ts
        if new_delta == ts_delta:
            body += data[start:end]
            continue
        zz = (new_delta << 1) ^ (new_delta >> 63)
        if 0 <= zz < _SMALL_VARINTS_UP_TO:
            ts_field = _SMALL_VARINTS[zz]
        else:
            record.clear()
            append_varlong(record, new_delta)
            ts_field = bytes(record)
        length = end - rest + 1 + len(ts_field)
        if length < _SMALL_VARINTS_UP_TO // 2:
            body += _SMALL_VARINTS[length << 1]
        else:
            append_varint(body, length)
        body.append(data[attr_at])
        body += ts_field
        body += data[rest:end]
    return retained_batch(h, bytes(body), len(kept), base_ts=base_ts,
                          max_ts=h.max_timestamp if log_append else max_ts,
                          delete_horizon_ms=delete_horizon_ms)


def retained_batch(h: BatchHeader, body: bytes, count: int, *, base_ts: int, max_ts: int | None,
                   delete_horizon_ms: int | None) -> bytes:
    """The batch `h` rebuilt around `count` retained records (`body`, uncompressed): its header
    as Kafka's `buildRetainedRecordsInto` writes it, the body in the batch's codec, a new
    CRC-32C. `base_ts` is the new `firstTimestamp`, `max_ts` the new `maxTimestamp`."""
    attributes = (h.attributes & (COMPRESSION_MASK | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK
                                  | CONTROL_MASK))
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_MASK
    out = bytearray(BATCH_HEADER.size)
    out += codec_by_id(h.attributes & COMPRESSION_MASK).compress(body)
    try:
        BATCH_HEADER.pack_into(
            out, 0, h.base_offset, len(out) - LOG_OVERHEAD, h.partition_leader_epoch, MAGIC_V2,
            0, attributes, h.last_offset_delta, base_ts, max_ts, h.producer_id,
            h.producer_epoch, h.base_sequence, count,
        )
    except struct.error as err:
        raise CorruptSegmentError(f"batch at offset {h.base_offset}: a header field is out "
                                  f"of range: {err}", position=h.position) from None
    _CRC.pack_into(out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def live_txn_entries(entries: Iterable[AbortedTxn], live_markers: Container[int]
                     ) -> list[AbortedTxn]:
    """The `.txnindex` of a compacted object made of several sources, as Kafka's cleaner
    writes it (`CleanedTransactionMetadata`): an aborted transaction keeps its entry only
    while its marker is kept and the transaction still had data in the cleaned range
    (`live_markers`, by marker offset); once its records are all gone the entry goes with
    them. Entries are in marker order, each once."""
    kept = {e for e in entries if e.last_offset in live_markers}
    return sorted(kept, key=lambda e: (e.last_offset, e.first_offset, e.producer_id))
