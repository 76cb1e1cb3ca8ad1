"""The compaction job's two passes over a segment, on record columns (`record_columns`): the
key pass (`scan_keys`) and the cleaning pass (`clean_segment`). Same rules and results as
`tiered.kafka.compaction.compact_segment` and the tests' record-at-a-time key pass, which walk
one record at a time; the decisions per record here are array operations, and the batches
that lose some records are rebuilt from their survivors' bytes for a whole window at once
(`_splice`, what `splice_batch` does for one batch).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spark_jobs.record_columns import (
    ID_BYTES,
    RecordColumns,
    key_ids,
    last_per_key,
    record_windows,
)
from tiered.kafka.compaction import (
    ABORTED,
    LAST_OF_PRODUCER,
    BatchRetention,
    CleanedBatch,
    ProducerEvent,
    SegmentCleaning,
    batch_retention,
    compact_segment,
    empty_batch,
    producer_event,
    retained_batch,
)
from tiered.kafka.records import TIMESTAMP_TYPE_MASK, BatchHeader, iter_batch_headers


@dataclass
class PackedKeys:
    """What the key pass learns from one segment, as arrays."""

    #: keyed records outside transactions: each key's identity (n, 16) and the segment's
    #: latest offset of it
    ids: np.ndarray
    offsets: np.ndarray
    #: keyed records of transactional batches: (batch last offset, key identity, offset);
    #: they count only once the transaction is known to have committed
    txn_keys: list[tuple[int, bytes, int]]
    #: every batch with a producer id
    producers: list[ProducerEvent]


def scan_keys(data: bytes, *, path: str | None = None,
              batches: Sequence[BatchHeader] | None = None) -> PackedKeys:
    """The segment's own latest offset per key (a later record of a key supersedes an earlier
    one of the same segment, so only the last reaches the partition-wide map), transactional
    keys, producer batches. `batches`: the segment's batch headers, when walked already."""
    producers: list[ProducerEvent] = []
    headers: list[BatchHeader] = []
    for h in iter_batch_headers(data, path=path) if batches is None else batches:
        if h.producer_id >= 0:
            producers.append(producer_event(data, h, path))
        if not h.is_control:
            headers.append(h)
    found_ids: list[np.ndarray] = []
    found_offsets: list[np.ndarray] = []
    txn_keys: list[tuple[int, bytes, int]] = []
    for cols in record_windows(data, headers, path=path):
        txn = np.repeat(np.fromiter((h.is_transactional for h in cols.headers), bool,
                                    len(cols.headers)), cols.counts)
        keyed = cols.klen >= 0
        plain = np.nonzero(keyed & ~txn)[0]
        ids, offsets = last_per_key(key_ids(cols, plain), cols.offset[plain])
        found_ids.append(ids)
        found_offsets.append(offsets)
        in_txn = np.nonzero(keyed & txn)[0]
        if len(in_txn):
            batch_last = np.repeat(np.fromiter((h.last_offset for h in cols.headers), np.int64,
                                               len(cols.headers)), cols.counts)
            txn_keys.extend((int(last), bytes(kid), int(off)) for last, kid, off in zip(
                batch_last[in_txn], key_ids(cols, in_txn), cols.offset[in_txn], strict=True))
    if len(found_ids) == 1:
        return PackedKeys(found_ids[0], found_offsets[0], txn_keys, producers)
    ids, offsets = last_per_key(
        np.concatenate(found_ids) if found_ids else np.zeros((0, ID_BYTES), np.uint8),
        np.concatenate(found_offsets) if found_offsets else np.zeros(0, np.int64))
    return PackedKeys(ids, offsets, txn_keys, producers)


def clean_segment(
    data: bytes,
    *,
    latest: np.ndarray,
    flags: Mapping[int, int],
    now_ms: int,
    delete_retention_ms: int | None,
    path: str | None = None,
    batches: Sequence[BatchHeader] | None = None,
) -> SegmentCleaning:
    """`compact_segment` with `latest` the sorted offsets (int64) of the records that are the
    latest of their key: every data batch's records are walked at once, and each record's fate
    decided by array operations before the batches are written. `batches`: the segment's
    batch headers, when walked already."""
    every = list(iter_batch_headers(data, path=path)) if batches is None else batches
    headers = [h for h in every if not h.is_control]
    cleaner = _ColumnCleaner(record_windows(data, headers, path=path), now_ms,
                             delete_retention_ms, latest)
    return compact_segment(data, latest=(), flags=flags, now_ms=now_ms,
                           delete_retention_ms=delete_retention_ms, path=path,
                           data_batch=cleaner, headers=every)


class _ColumnCleaner:
    """`clean_data_batch` for the data batches of a segment, asked for in order (transaction
    markers and undecided batches are skipped over): one window of columns at a time, its
    records' verdicts computed when the window is reached."""

    def __init__(self, windows: Iterator[RecordColumns], now_ms: int,
                 delete_retention_ms: int | None, latest: np.ndarray) -> None:
        self._windows = windows
        self._window: _Window | None = None
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.latest = latest

    def __call__(self, raw: memoryview, h: BatchHeader, flags: int) -> CleanedBatch:
        w = self._window
        while w is None or h.position not in w.index:
            cols = next(self._windows, None)
            if cols is None:
                raise RuntimeError(f"batch at offset {h.base_offset} is not in the columns")
            w = self._window = _Window(cols, self.latest, self.now_ms, self.delete_retention_ms)
        return w.clean(raw, h, w.index[h.position], flags)


class _Window:
    """One window's records and what becomes of them (`clean_data_batch`'s verdicts, for
    every batch at once)."""

    def __init__(self, cols: RecordColumns, latest: np.ndarray, now_ms: int,
                 delete_retention_ms: int | None) -> None:
        self.cols = cols
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        headers = cols.headers
        #: batch position in the segment -> its batch in the columns
        self.index = {h.position: i for i, h in enumerate(headers)}
        keyed = cols.klen >= 0
        at = np.searchsorted(latest, cols.offset)
        is_latest = np.zeros(len(at), bool)
        if len(latest):
            is_latest = latest[np.minimum(at, len(latest) - 1)] == cols.offset
        live = np.repeat(np.fromiter(
            (h.delete_horizon_ms is None or now_ms < h.delete_horizon_ms for h in headers),
            bool, len(headers)), cols.counts)
        #: a record survives unless its batch is discarded (decided per batch)
        self.keep = ~keyed | (is_latest & (live | ~cols.vnull))
        self.kept = cols.per_batch(self.keep)
        self.keyless = cols.per_batch(~keyed)
        self.tombstones = cols.per_batch(keyed & cols.vnull)
        self.tombstones_kept = cols.per_batch(self.keep & keyed & cols.vnull)
        # what each batch that loses records (or gains a delete horizon) becomes, unless the
        # transaction pass discards it: every such batch's survivors at once (`_splice`)
        has_horizon = np.fromiter((h.delete_horizon_ms is not None for h in headers), bool,
                                  len(headers))
        needs = ((self.tombstones_kept > 0) & ~has_horizon
                 & (delete_retention_ms is not None))
        self.needs_horizon = needs
        self.horizon = np.fromiter(
            (h.delete_horizon_ms if h.delete_horizon_ms is not None
             else now_ms + (delete_retention_ms or 0) for h in headers), np.int64, len(headers))
        rebuilt = (self.kept > 0) & ((self.kept < cols.counts) | needs)
        self.spliced = _splice(cols, self.keep, rebuilt, self.horizon, has_horizon | needs)

    def clean(self, raw: memoryview, h: BatchHeader, i: int, flags: int) -> CleanedBatch:
        cols = self.cols
        decision = batch_retention(h, can_discard=bool(flags & ABORTED),
                                   last_of_producer=bool(flags & LAST_OF_PRODUCER),
                                   now_ms=self.now_ms)
        n = int(cols.first_row[i + 1] - cols.first_row[i])
        tombstones = int(self.tombstones[i])
        if decision.retention is BatchRetention.DELETE:
            return CleanedBatch(b"", n, 0, tombstones, 0, False, False)
        if decision.discard_records:  # every record goes; the batch stays empty if it must
            kept = keyless = tombstones_kept = 0
        else:
            kept, keyless = int(self.kept[i]), int(self.keyless[i])
            tombstones_kept = int(self.tombstones_kept[i])
        dropped = tombstones - tombstones_kept
        if kept:
            needs_horizon = bool(self.needs_horizon[i])
            if kept == n and not needs_horizon:
                return CleanedBatch(bytes(raw), n, n, 0, keyless, False, False)
            body, base_ts, max_ts = self.spliced[i]
            horizon = int(self.horizon[i]) if needs_horizon or (
                h.delete_horizon_ms is not None) else None
            rebuilt = retained_batch(h, body, kept, base_ts=base_ts, max_ts=max_ts,
                                     delete_horizon_ms=horizon)
            return CleanedBatch(rebuilt, n, kept, dropped, keyless, True, needs_horizon)
        if decision.retention is BatchRetention.RETAIN_EMPTY:
            return CleanedBatch(empty_batch(h), n, 0, dropped, 0, True, False)
        return CleanedBatch(b"", n, 0, dropped, 0, False, False)


def _splice(cols: RecordColumns, keep: np.ndarray, batches: np.ndarray, horizon: np.ndarray,
            has_horizon: np.ndarray) -> dict[int, tuple[bytes, int, int]]:
    """`splice_batch` for every batch in `batches` (a mask) at once: batch -> (records area of
    its kept records, new firstTimestamp, new maxTimestamp). A kept record is copied as it is
    unless its timestamp delta moves (the batch's firstTimestamp becomes the first kept
    record's timestamp, or the delete horizon `horizon` where `has_horizon`); then its length,
    attributes and new delta are written before the rest of its bytes."""
    nb = len(cols.headers)
    batch_of = np.repeat(np.arange(nb), cols.counts)
    rows = np.nonzero(keep & batches[batch_of])[0]
    if not len(rows):
        return {}
    b = batch_of[rows]
    hs = cols.headers
    log_append = np.fromiter((bool(h.attributes & TIMESTAMP_TYPE_MASK) for h in hs), bool, nb)
    first_ts = np.fromiter((h.first_timestamp for h in hs), np.int64, nb)
    max_ts = np.fromiter((h.max_timestamp for h in hs), np.int64, nb)
    ts = cols.ts_delta[rows]
    stamp = np.where(log_append[b], max_ts[b], first_ts[b] + ts)
    first = np.nonzero(np.concatenate(([True], b[1:] != b[:-1])))[0]
    sizes = np.diff(np.append(first, len(rows)))
    group = b[first]
    base_g = np.where(has_horizon[group], horizon[group], stamp[first])
    new_delta = stamp - np.repeat(base_g, sizes)
    max_g = np.where(log_append[group], max_ts[group], np.maximum.reduceat(stamp, first))
    moved = np.nonzero(new_delta != ts)[0]
    # the prefixes of the records whose delta moved: length, attributes, timestamp delta
    at = rows[moved]
    ts_bytes, ts_len = _varints(((new_delta[moved] << 1) ^ (new_delta[moved] >> 63))
                                .view(np.uint64), 10)
    length = cols.end[at] - cols.rest[at] + 1 + ts_len
    len_bytes, len_len = _varints((length << 1).astype(np.uint64), 5)
    attr = np.frombuffer(cols.whole, np.uint8)[cols.attr_at[at]]
    width = 16
    spread = np.arange(width)
    prefix = np.where(spread < len_len[:, None],
                      np.take_along_axis(len_bytes, np.minimum(spread, 4)[None, :].repeat(
                          len(at), 0), 1), 0)
    prefix = np.where(spread == len_len[:, None], attr[:, None], prefix)
    ts_at = np.clip(spread[None, :] - len_len[:, None] - 1, 0, 9)
    prefix = np.where(spread > len_len[:, None], np.take_along_axis(ts_bytes, ts_at, 1),
                      prefix).astype(np.uint8)
    plen = len_len + 1 + ts_len
    flat = prefix[spread < plen[:, None]].tobytes()
    pstart = len(cols.whole) + np.concatenate(([0], np.cumsum(plen)[:-1]))
    # two pieces per kept record: (whole record) and nothing, or (prefix) and (the rest)
    p0s = cols.start[rows].copy()
    p0e = cols.end[rows].copy()
    p1s = np.zeros(len(rows), np.int64)
    p1e = np.zeros(len(rows), np.int64)
    p0s[moved] = pstart
    p0e[moved] = pstart + plen
    p1s[moved] = cols.rest[at]
    p1e[moved] = cols.end[at]
    starts = np.stack((p0s, p1s), 1).ravel()
    sizes_out = np.stack((p0e - p0s, p1e - p1s), 1).ravel()
    # every body, back to back, gathered by numpy a few MiB at a time; then cut per batch
    bodies = memoryview(_gather(np.frombuffer(cols.whole + flat, np.uint8), starts, sizes_out))
    ends = np.cumsum(sizes_out)
    cut = ends[2 * np.append(first[1:], len(rows)) - 1].tolist()
    out: dict[int, tuple[bytes, int, int]] = {}
    lo = 0
    for g, batch in enumerate(group.tolist()):
        out[batch] = (bytes(bodies[lo:cut[g]]), int(base_g[g]), int(max_g[g]))
        lo = cut[g]
    return out


#: output bytes one numpy gather assembles at a time (its index array is 8 bytes a byte)
_GATHER_BYTES = 4 * 1024 * 1024


def _gather(src: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> bytes:
    """The pieces `src[starts[i]:starts[i] + sizes[i]]`, concatenated in order."""
    total = int(sizes.sum())
    out = bytearray(total)
    view = np.frombuffer(out, np.uint8)
    ends = np.cumsum(sizes)
    lo = done = 0
    while lo < len(sizes):
        hi = max(lo + 1, int(np.searchsorted(ends, done + _GATHER_BYTES, side="right")))
        n = sizes[lo:hi]
        chunk = int(n.sum())
        # each output byte's source: its piece's start, plus how far into the piece it is
        index = np.repeat(starts[lo:hi] - (ends[lo:hi] - n), n) + np.arange(done, done + chunk)
        view[done:done + chunk] = src[index]
        done += chunk
        lo = hi
    return bytes(out)


def _varints(values: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """Base-128 varints of the unsigned `values`: (bytes, one row each, `most` wide; lengths)."""
    out = np.zeros((len(values), most), np.uint8)
    length = np.ones(len(values), np.int64)
    for i in range(most):
        group = (values >> np.uint64(7 * i)) & np.uint64(0x7F)
        more = (values >> np.uint64(7 * (i + 1))) != 0 if i + 1 < most else np.zeros(
            len(values), bool)
        out[:, i] = (group | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
        length += more
    return out, length
