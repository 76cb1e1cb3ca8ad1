"""The record-level cleaner against an independent reference compactor written here from
Kafka's rules (LogCleaner's filter, MemoryRecords.filterTo, KIP-534), with every output batch
parsed back by kafka-python's `DefaultRecordBatch` (CRC, offsets, delete horizon)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from support.compaction_reference import KeyEvent, key_hash, scan_segment

from tiered.kafka.builder import control_record, encode_batch
from tiered.kafka.compaction import (
    ABORTED,
    IN_DOUBT,
    ProducerEvent,
    SegmentCleaning,
    compact_segment,
    empty_batch,
    transaction_flags,
)
from tiered.kafka.records import DELETE_HORIZON_MASK, Record, iter_batches

DAY = 86_400_000


# -- the reference: a plain model of a log and Kafka's cleaner over it ---------------------------


@dataclass
class B:
    """A batch in the reference model."""

    base: int
    records: list[tuple[int, bytes | None, bytes | None]]  # (offset, key, value)
    last_delta: int = -1
    pid: int = -1
    epoch: int = -1
    txn: bool = False
    control: str | None = None  # "commit" / "abort"
    horizon: int | None = None
    codec: str = "none"
    ts: int = 1_000
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def last(self) -> int:
        return self.base + (self.last_delta if self.last_delta >= 0 else
                            self.records[-1][0] - self.base)


def encode(b: B) -> bytes:
    if b.control is not None:
        recs = [control_record(b.control, 0, offset=b.base, timestamp=b.ts)]
    else:
        recs = [Record(o, b.ts + (o - b.base), k, v) for o, k, v in b.records]
    data = bytearray(encode_batch(recs, base_offset=b.base, compression=b.codec,
                                  producer_id=b.pid, producer_epoch=b.epoch,
                                  base_sequence=0 if b.pid >= 0 else -1,
                                  transactional=b.txn, control=b.control is not None,
                                  delete_horizon_ms=b.horizon))
    if b.last_delta >= 0 and b.last_delta != recs[-1].offset - b.base:
        # a batch already compacted by a broker: lastOffsetDelta past its last record
        data[23:27] = b.last_delta.to_bytes(4, "big")
        data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


def reference(batches: list[B], now: int, retention: int | None) -> list[B | None]:
    """What Kafka's cleaner leaves of each batch (None: dropped; a B with no records: retained
    empty), written from the rules directly."""
    by_pid: dict[int, list[B]] = defaultdict(list)
    for b in batches:
        if b.pid >= 0:
            by_pid[b.pid].append(b)
    aborted: set[int] = set()
    doubt: set[int] = set()
    discardable: set[int] = set()
    last_of: set[int] = set()
    for bs in by_pid.values():
        open_txn: list[int] = []
        for b in bs:
            if b.control is not None:
                if b.control == "abort":
                    aborted.update(open_txn)
                if not open_txn:
                    discardable.add(b.base)
                open_txn = []
            elif b.txn:
                open_txn.append(b.base)
        doubt.update(open_txn)
        last_of.add(bs[-1].base)
    latest: dict[bytes, int] = {}
    for b in batches:
        if b.control is None and b.base not in aborted and b.base not in doubt:
            for o, k, _v in b.records:
                if k is not None:
                    latest[k] = max(latest.get(k, -1), o)
    out: list[B | None] = []
    for b in batches:
        if b.base in doubt:
            out.append(b)
            continue
        if b.control is not None:
            discard = b.base in discardable and b.horizon is not None and b.horizon <= now
        else:
            discard = b.base in aborted
        keep_empty = b.pid >= 0 and b.base in last_of
        if discard and not keep_empty:
            out.append(None)
            continue
        kept = []
        for o, k, v in b.records:
            if discard:
                continue
            latest_live = latest.get(k) == o and (
                v is not None or b.horizon is None or now < b.horizon)
            if b.control is not None or k is None or latest_live:
                kept.append((o, k, v))
        if not kept:
            out.append(B(b.base, [], b.last_delta if b.last_delta >= 0 else b.last - b.base,
                         b.pid, b.epoch, b.txn, b.control) if keep_empty else None)
            continue
        has_dead = any(v is None for _o, k, v in kept if k is not None) and b.control is None
        marker = b.control is not None and b.base in discardable
        horizon = b.horizon
        if horizon is None and retention is not None and (has_dead or marker):
            horizon = now + retention
        out.append(B(b.base, kept, b.last - b.base, b.pid, b.epoch, b.txn, b.control, horizon,
                     b.codec, b.ts))
    return out


# -- the code under test, driven as the Spark job drives it, in one process ---------------------


def clean(segments: list[bytes], now: int, retention: int | None) -> list[bytes]:
    """One pass over a partition's segments: scan, key map by max offset, transaction flags,
    then each segment cleaned (what the job does with a shuffle, here with dicts)."""
    keys: list[KeyEvent] = []
    producers: dict[int, list[ProducerEvent]] = defaultdict(list)
    for seg in segments:
        for ev in scan_segment(seg):
            if isinstance(ev, KeyEvent):
                keys.append(ev)
            else:
                producers[ev.producer_id].append(ev)
    flags: dict[int, int] = {}
    for evs in producers.values():
        flags.update(transaction_flags(evs))
    latest: dict[bytes, int] = {}
    for k in keys:
        if k.txn_batch is not None and flags.get(k.txn_batch[1], 0) & (ABORTED | IN_DOUBT):
            continue
        latest[k.hash] = max(latest.get(k.hash, -1), k.offset)
    winners = set(latest.values())
    return [compact_segment(seg, latest=winners, flags=flags, now_ms=now,
                            delete_retention_ms=retention).data for seg in segments]


def parse(data: bytes) -> list[DefaultRecordBatch]:
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 8:pos + 12], "big") + 12
        batch = DefaultRecordBatch(data[pos:pos + size])
        assert batch.validate_crc(), f"bad CRC in batch at {batch.base_offset}"
        out.append(batch)
        pos += size
    return out


def check(batches: list[B], now: int, retention: int | None, split: int = 2) -> list[B]:
    """Clean `batches` (cut into `split` segments) and compare with the reference, batch by
    batch and record by record through kafka-python; returns the survivors as the model."""
    # segments hold consecutive batches
    n = len(batches)
    bounds = [n * i // split for i in range(split + 1)]
    segs = [b"".join(encode(b) for b in batches[bounds[i]:bounds[i + 1]]) for i in range(split)]
    got = [b for seg in clean(segs, now, retention) for b in parse(seg)]
    want = [b for b in reference(batches, now, retention) if b is not None]
    assert [g.base_offset for g in got] == [w.base for w in want]
    survivors = []
    for g, w in zip(got, want, strict=True):
        assert g.last_offset_delta == w.last - w.base, "lastOffsetDelta must be kept"
        assert g.producer_id == w.pid and g.producer_epoch == w.epoch
        assert g.is_transactional == w.txn and g.is_control_batch == (w.control is not None)
        recs = list(g)
        if w.control is None:
            assert [(r.offset, r.key, r.value) for r in recs] == w.records
        else:
            assert len(recs) == len(w.records)
        has_horizon = bool(g.attributes & DELETE_HORIZON_MASK)
        assert has_horizon == (w.horizon is not None)
        if w.horizon is not None:
            assert g.first_timestamp == w.horizon, "the horizon lives in firstTimestamp"
        survivors.append(B(w.base, w.records, g.last_offset_delta, w.pid, w.epoch, w.txn,
                           w.control, w.horizon, w.codec, w.ts))
    return survivors


# -- tests --------------------------------------------------------------------------------------


def test_latest_record_per_key_survives_at_its_own_offset_byte_for_byte() -> None:
    batches = [
        B(0, [(0, b"a", b"1"), (1, b"b", b"1"), (2, b"c", b"1")]),
        B(3, [(3, b"a", b"2"), (4, b"d", b"1")]),
        B(5, [(5, b"b", b"2"), (6, b"d", b"2")]),
    ]
    check(batches, now=10_000, retention=DAY)
    segs = [encode(b) for b in batches]
    out = clean(segs, 10_000, DAY)
    # the last batch keeps both its records: copied byte for byte, not rebuilt
    assert out[2] == segs[2]
    assert [r.offset for b in iter_batches(out[0]) for r in b.records] == [2]


def test_emptied_batch_is_dropped_but_last_offset_delta_of_partial_batch_kept() -> None:
    batches = [B(0, [(0, b"a", b"1"), (1, b"a", b"2"), (2, b"b", b"1")]),
               B(3, [(3, b"a", b"3"), (4, b"b", b"2")])]
    out = check(batches, now=1, retention=DAY, split=1)
    assert [b.base for b in out] == [3]
    batches = [B(0, [(0, b"a", b"1"), (1, b"b", b"1"), (2, b"c", b"1")]), B(3, [(3, b"c", b"2")])]
    out = check(batches, now=1, retention=DAY, split=1)
    assert out[0].last_delta == 2 and [o for o, _k, _v in out[0].records] == [0, 1]


def test_tombstone_gets_horizon_then_goes_after_it() -> None:
    """KIP-534: the first pass keeping a tombstone sets now + delete.retention.ms; a pass
    before the horizon keeps it unchanged; one after drops it."""
    batches = [B(0, [(0, b"a", b"1"), (1, b"b", b"1")]), B(2, [(2, b"a", None)])]
    now = 50_000
    p1 = check(batches, now=now, retention=DAY)
    assert p1[-1].horizon == now + DAY and p1[-1].records == [(2, b"a", None)]
    p2 = check(p1, now=now + DAY - 1, retention=DAY)
    assert p2[-1].horizon == now + DAY and p2[-1].records == [(2, b"a", None)]
    p3 = check(p2, now=now + DAY, retention=DAY)
    assert all(o != 2 for b in p3 for o, _k, _v in b.records)


def test_unlimited_delete_retention_keeps_tombstones_and_sets_no_horizon() -> None:
    batches = [B(0, [(0, b"a", b"1")]), B(1, [(1, b"a", None)])]
    out = check(batches, now=10**12, retention=None)
    assert out[-1].records == [(1, b"a", None)] and out[-1].horizon is None


def test_records_without_key_are_kept() -> None:
    batches = [B(0, [(0, None, b"x"), (1, b"a", b"1")]), B(2, [(2, b"a", b"2"), (3, None, b"y")])]
    out = check(batches, now=1, retention=DAY)
    assert [o for b in out for o, _k, _v in b.records] == [0, 2, 3]
    res = compact_segment(b"".join(encode(b) for b in batches), latest={2}, flags={},
                          now_ms=1, delete_retention_ms=DAY)
    assert res.keyless_kept == 2


def test_aborted_transaction_records_go_and_marker_follows_later() -> None:
    """Aborted data is removed and never wins its key; the abort marker stays while this pass
    removed data of its transaction, gets a horizon on the next, goes after the horizon."""
    batches = [
        B(0, [(0, b"a", b"committed")]),
        B(1, [(1, b"a", b"aborted")], pid=7, epoch=0, txn=True),
        B(2, [(2, b"z", b"z")], pid=7, epoch=0, txn=True, control="abort"),
        B(3, [(3, b"b", b"x")], pid=8, epoch=0, txn=True),
        B(4, [(4, b"z", b"z")], pid=8, epoch=0, txn=True, control="commit"),
        B(5, [(5, b"c", b"n")]),
    ]
    p1 = check(batches, now=1_000, retention=DAY)
    assert (0, b"a", b"committed") in p1[0].records
    assert 1 not in [b.base for b in p1]
    marker = [b for b in p1 if b.base == 2][0]
    assert marker.horizon is None, "the marker stays as long as its data was in this pass"
    p2 = check(p1, now=2_000, retention=DAY)
    marker = [b for b in p2 if b.base == 2][0]
    assert marker.horizon == 2_000 + DAY
    p3 = check(p2, now=2_000 + DAY, retention=DAY)
    # pid 7's marker is its producer's last batch: kept, emptied (its epoch fences)
    m = [b for b in p3 if b.base == 2][0]
    assert m.records == [] or m.control == "abort"


def test_producer_last_batch_retained_empty() -> None:
    batches = [
        B(0, [(0, b"a", b"1")], pid=3, epoch=1),
        B(1, [(1, b"a", b"2")], pid=3, epoch=1),
        B(2, [(2, b"a", b"3")]),
    ]
    got = clean([b"".join(encode(b) for b in batches)], 1, DAY)[0]
    parsed = parse(got)
    assert [b.base_offset for b in parsed] == [1, 2]
    assert parsed[0].records_count == 0 and parsed[0].producer_id == 3
    check(batches, now=1, retention=DAY, split=1)


def test_open_transaction_is_left_alone_and_does_not_win_keys() -> None:
    batches = [B(0, [(0, b"a", b"1")]), B(1, [(1, b"a", b"open")], pid=9, epoch=0, txn=True)]
    out = check(batches, now=1, retention=DAY, split=1)
    assert out[0].records == [(0, b"a", b"1")]
    flags = transaction_flags([ProducerEvent(9, 1, 1, 1, 0)])
    assert flags[1] & IN_DOUBT


@pytest.mark.parametrize("codec", ["gzip", "zstd", "lz4", "snappy"])
def test_rebuilt_batch_keeps_its_codec(codec: str) -> None:
    batches = [B(0, [(0, b"a", b"1"), (1, b"b", b"1")], codec=codec), B(2, [(2, b"a", b"2")])]
    got = clean([b"".join(encode(b) for b in batches)], 1, DAY)[0]
    first = next(iter_batches(got))
    assert first.header.compression == codec
    check(batches, now=1, retention=DAY, split=1)


def test_empty_batch_header_is_kafkas_empty_header() -> None:
    data = encode(B(10, [(10, b"a", b"1"), (12, b"b", b"1")], pid=4, epoch=2, txn=True))
    h = next(iter_batches(data)).header
    empty = parse(empty_batch(h))[0]
    assert (empty.base_offset, empty.last_offset_delta, empty.records_count) == (10, 2, 0)
    assert empty.producer_id == 4 and empty.is_transactional


def test_key_hash_is_sixteen_bytes() -> None:
    assert len(key_hash(b"k")) == 16 and key_hash(b"k") != key_hash(b"l")


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.integers(1, 3)),
                 min_size=1, max_size=40),
    seed=st.integers(0, 2**32),
    split=st.integers(1, 4),
)
def test_random_logs_match_the_reference_over_passes(
    ops: list[tuple[int, bool, int]], seed: int, split: int
) -> None:
    """Random keyed logs with tombstones and keyless records, several passes with time moving
    past the horizon: every pass matches the reference; the last changes nothing."""
    rng = random.Random(seed)
    batches, off = [], 0
    for key, tomb, size in ops:
        recs = []
        for _ in range(size):
            k = None if rng.random() < 0.1 else b"k%d" % ((key + rng.randrange(3)) % 10)
            recs.append((off, k, None if tomb and k is not None else b"v%d" % off))
            off += 1
        batches.append(B(recs[0][0], recs))
    split = min(split, len(batches))
    now = 1_000
    for _ in range(3):
        batches = check(batches, now=now, retention=100, split=split)
        now += 101
    before = b"".join(encode(b) for b in batches)
    after = clean([before], now, 100)[0]
    assert after == before, "a pass with nothing new to do changes nothing"


# -- the byte-copying rebuild against the decoding one --------------------------------------------

T0 = 1_700_000_000_000


@pytest.mark.parametrize("codec", ["none", "gzip", "lz4", "zstd", "snappy"])
@pytest.mark.parametrize("timestamp_type", ["create", "log_append"])
@pytest.mark.parametrize("horizon", [None, T0 + 86_400_000])
def test_splice_batch_writes_what_rebuild_batch_writes(
    codec: str, timestamp_type: str, horizon: int | None
) -> None:
    """A batch rebuilt from its survivors' bytes is the batch re-encoded from decoded records,
    byte for byte: multi-byte lengths (large values, headers), timestamp deltas that change
    width when the first record goes, null keys and values, every codec and timestamp type."""
    from tiered.kafka.compaction import rebuild_batch, records_area, skim_records, splice_batch
    from tiered.kafka.records import Header, decode_batch, iter_batch_headers

    rng = random.Random(7)
    records = []
    for i in range(40):
        key = None if i % 7 == 3 else b"k%d" % i
        value = None if i % 5 == 1 else rng.randbytes(rng.choice([0, 10, 70, 300, 20_000]))
        headers = (Header("h", b"v" * (i % 3)),) if i % 4 == 0 else ()
        ts = T0 + (0 if i == 0 else 9_000 + i * 200_003)  # the first record is far behind
        records.append(Record(100 + 2 * i, ts, key, value, headers))
    data = encode_batch(records, base_offset=100, compression=codec,
                        timestamp_type=timestamp_type, producer_id=5, producer_epoch=1,
                        base_sequence=0)
    h = next(iter_batch_headers(data))
    decoded = decode_batch(data, 0).records
    skimmed = skim_records(records_area(memoryview(data), h), h)
    assert [(h.base_offset + s[0], s[2], s[3]) for s in skimmed] == [
        (r.offset, r.key, r.value is None) for r in decoded]
    area = records_area(memoryview(data), h)
    for keep in (range(1, 40), range(0, 40, 3), range(39, 40), range(40)):
        want = rebuild_batch(h, [decoded[i] for i in keep], delete_horizon_ms=horizon)
        got = splice_batch(h, area, [skimmed[i] for i in keep], delete_horizon_ms=horizon)
        assert got == want


# -- the transaction index of a compacted object ----------------------------------------------


def _pass(segments: list[bytes], now: int) -> list[SegmentCleaning]:
    """One cleaning pass as the job runs it; the `SegmentCleaning` of each segment."""
    keys: list[KeyEvent] = []
    producers: dict[int, list[ProducerEvent]] = defaultdict(list)
    for seg in segments:
        for ev in scan_segment(seg):
            (keys.append(ev) if isinstance(ev, KeyEvent) else producers[ev.producer_id].append(ev))
    flags: dict[int, int] = {}
    for evs in producers.values():
        flags.update(transaction_flags(evs))
    latest: dict[bytes, int] = {}
    for k in keys:
        if k.txn_batch is None or not flags.get(k.txn_batch[1], 0) & (ABORTED | IN_DOUBT):
            latest[k.hash] = max(latest.get(k.hash, -1), k.offset)
    return [compact_segment(seg, latest=set(latest.values()), flags=flags, now_ms=now,
                            delete_retention_ms=DAY) for seg in segments]


def test_txnindex_entries_of_transactions_whose_records_are_gone_are_dropped() -> None:
    """The combined `.txnindex` keeps an aborted transaction's entry while this pass removed
    its data (its marker stays, as in Kafka's cleaner), drops it once its records are all
    gone, and is sorted by marker offset with duplicates dropped; a commit marker has none."""
    from tiered.kafka.compaction import live_txn_entries
    from tiered.kafka.txnindex import AbortedTxn

    seg1 = b"".join(encode(b) for b in [
        B(0, [(0, b"a", b"kept")]),
        B(1, [(1, b"a", b"aborted")], pid=7, epoch=0, txn=True),
        B(2, [(2, b"z", b"z")], pid=7, epoch=0, txn=True, control="abort"),
        B(3, [(3, b"b", b"late")], pid=9, epoch=0, txn=True),
    ])
    seg2 = b"".join(encode(b) for b in [
        B(4, [(4, b"z", b"z")], pid=9, epoch=0, txn=True, control="abort"),
        B(5, [(5, b"z", b"z")], pid=8, epoch=0, txn=True, control="abort"),  # no data at all
        B(6, [(6, b"c", b"n")]),
    ])
    entries = [AbortedTxn(9, 3, 4, 5), AbortedTxn(7, 1, 2, 3), AbortedTxn(8, 5, 5, 6),
               AbortedTxn(7, 1, 2, 3)]  # the same entry twice (sources overlapping)
    first = _pass([seg1, seg2], now=1_000)
    live = {m for r in first for m in r.live_markers}
    assert live == {2, 4}, "pid 8's marker had no data left in the range"
    assert live_txn_entries(entries, live) == [AbortedTxn(7, 1, 2, 3), AbortedTxn(9, 3, 4, 5)]
    second = _pass([r.data for r in first], now=2_000)
    live = {m for r in second for m in r.live_markers}
    assert live == set(), "the aborted records went in the first pass"
    assert live_txn_entries(entries, live) == []
