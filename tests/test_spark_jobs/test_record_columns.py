"""The compaction job's column walk (`spark_jobs.record_columns`, `spark_jobs.compact_columns`)
against the record-at-a-time walk it replaces (`tiered.kafka.compaction`): the same records,
the same key map, the same cleaned bytes and counts, the same refusals of damage. No Spark:
pure functions over segments built here.
"""

from __future__ import annotations

import random
from collections import defaultdict

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import compaction_reference

from spark_jobs import compact_columns, record_columns
from spark_jobs.compact_exec import reduce_bucket
from spark_jobs.record_columns import (
    MAX_HEADERS,
    MIN_LANES,
    bucket_of,
    key_bucket,
    key_id,
    key_ids,
    last_per_key,
)
from tiered.errors import CorruptSegmentError
from tiered.kafka import compaction
from tiered.kafka.builder import control_record, encode_batch
from tiered.kafka.records import BATCH_HEADER, Header, Record, iter_batch_headers

T0 = 1_700_000_000_000
DAY = 86_400_000


def segment(seed: int, batches: int, *, headers: float = 0.03,
            codecs: tuple[str, ...] = ("none",), transactions: bool = False) -> bytes:
    """A segment of `batches` batches of 1 to 60 records: short and long keys, null keys,
    tombstones, empty and larger values, timestamp deltas of one to five bytes, both timestamp
    types, offset gaps (a broker's compaction), a share of records with headers; with
    `transactions`, batches of two producers in committed, aborted and open transactions with
    their markers."""
    rng = random.Random(seed)
    out = bytearray()
    off = 0
    open_txn: dict[int, bool] = {}
    for _ in range(batches):
        pid = rng.choice([-1, -1, 7, 9]) if transactions else -1
        if pid >= 0 and open_txn.get(pid) and rng.random() < 0.3:
            kind = rng.choice(["commit", "abort"])
            out += encode_batch([control_record(kind, 0, offset=off, timestamp=T0 + off)],
                                base_offset=off, producer_id=pid, producer_epoch=0,
                                base_sequence=0, transactional=True, control=True)
            open_txn[pid] = False
            off += 1
            continue
        txn = pid >= 0 and rng.random() < 0.7
        if txn:
            open_txn[pid] = True
        recs = []
        first = off
        for _ in range(rng.choice([1, 2, 5, 20, 50, 60])):
            roll = rng.random()
            key = (None if roll < 0.1 else b"k%d" % rng.randrange(50) if roll < 0.8
                   else b"a-long-key-of-many-bytes-%d" % rng.randrange(20))
            value = (None if key is not None and rng.random() < 0.15
                     else rng.randbytes(rng.choice([0, 3, 60, 200])))
            hdrs = _headers(rng) if rng.random() < headers else ()
            ts = T0 + (off - first) * rng.choice([1, 1000, 10**7]) - rng.choice([0, 0, 5])
            recs.append(Record(off, ts, key, value, hdrs))
            off += rng.choice([1, 1, 1, 4])
        out += encode_batch(recs, base_offset=first, compression=rng.choice(codecs),
                            timestamp_type=rng.choice(["create", "create", "log_append"]),
                            producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                            base_sequence=0 if pid >= 0 else -1, transactional=txn)
    return bytes(out)


def _headers(rng: random.Random) -> tuple[Header, ...]:
    """One to three headers: empty and longer keys, null, empty and longer values; now and then
    more than `MAX_HEADERS` (those batches are left to `skim_records`)."""
    n = MAX_HEADERS + 1 if rng.random() < 0.002 else rng.choice([1, 1, 2, 3])
    return tuple(Header(rng.choice(["h", "", "trace-id-" * rng.randrange(1, 20)]),
                        rng.choice([None, b"", b"x" * rng.randrange(3), rng.randbytes(150)]))
                 for _ in range(n))


def data_headers(data: bytes) -> list:
    return [h for h in iter_batch_headers(data) if not h.is_control]


def skimmed(data: bytes, cols: record_columns.RecordColumns) -> list[tuple]:
    """`skim_records` of every batch, positions made absolute as the columns hold them: in the
    segment for a plain batch, after it (in batch order) for a compressed one's records."""
    out = []
    tail = len(data)
    for h in cols.headers:
        area = compaction.records_area(memoryview(data), h)
        if h.compression == "none":
            begin = h.position + BATCH_HEADER.size
        else:
            begin, tail = tail, tail + len(area)
        out.extend((h.base_offset + r[0], r[1], r[2], r[3], begin + r[4], begin + r[5],
                    begin + r[6], begin + r[7]) for r in compaction.skim_records(area, h))
    return out


def as_rows(cols: record_columns.RecordColumns) -> list[tuple]:
    return [(o, t, None if k < 0 else cols.whole[a:a + k], bool(v), s, at, r, e)
            for o, t, a, k, v, s, at, r, e in zip(
                cols.offset.tolist(), cols.ts_delta.tolist(), cols.key_at.tolist(),
                cols.klen.tolist(), cols.vnull.tolist(), cols.start.tolist(),
                cols.attr_at.tolist(), cols.rest.tolist(), cols.end.tolist(), strict=True)]


@pytest.mark.parametrize("batches", [MIN_LANES - 1, MIN_LANES * 2])
@pytest.mark.parametrize("codecs", [("none",), ("none", "gzip", "lz4", "zstd", "snappy")])
def test_columns_hold_what_skim_records_reads(batches: int, codecs: tuple[str, ...]) -> None:
    """Fewer batches than `MIN_LANES` (every batch walked one record at a time) and more (the
    vectorised walk, with the longest batches and those with headers left to `skim_records`):
    every record's offset, timestamp delta, key, null value and positions are `skim_records`'s,
    compressed batches included (their records areas decompressed after the segment)."""
    for seed in range(3):
        data = segment(seed, batches, codecs=codecs)
        cols = record_columns.record_columns(data, data_headers(data))
        assert as_rows(cols) == skimmed(data, cols)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), batches=st.integers(MIN_LANES, 3 * MIN_LANES),
       headers=st.sampled_from([0.0, 0.01, 0.5]))
def test_random_segments_match_skim_records(seed: int, batches: int, headers: float) -> None:
    data = segment(seed, batches, headers=headers)
    cols = record_columns.record_columns(data, data_headers(data))
    assert as_rows(cols) == skimmed(data, cols)


@pytest.mark.parametrize("codecs", [("none",), ("zstd", "gzip")])
def test_records_with_headers_are_walked_by_columns_not_one_at_a_time(
        codecs: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Records with up to `MAX_HEADERS` headers take the vectorised walk: only the longest
    batches and those holding a record with more headers go to `skim_records`, and the columns
    still hold what it reads."""
    skimmed_batches: list[int] = []
    skim = record_columns.skim_records

    def counting(data: bytes, h: object, **kw: object) -> list:
        skimmed_batches.append(h.base_offset)  # type: ignore[attr-defined]
        return skim(data, h, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(record_columns, "skim_records", counting)
    data = segment(5, MIN_LANES * 3, headers=0.6, codecs=codecs)
    nxt = data_headers(data)[-1].last_offset + 1
    many_headers = tuple(Header(f"h{i}", b"v") for i in range(MAX_HEADERS + 1))
    data += encode_batch(  # one record with more headers than the walk takes on
        [Record(nxt + i, T0, b"k", b"v", many_headers if i == 1 else ()) for i in range(3)],
        base_offset=nxt, compression=codecs[0])
    heads = data_headers(data)
    cols = record_columns.record_columns(data, heads)
    many = {h.base_offset for h in heads if any(
        len(r.headers) > MAX_HEADERS for r in compaction.decode_batch(data, h.position).records)}
    longest = sorted((h.records_count for h in heads), reverse=True)[MIN_LANES - 1]
    assert nxt in many
    assert set(skimmed_batches) == many | {h.base_offset for h in heads
                                           if h.records_count > longest}
    with_headers = sum(1 for h in heads if h.base_offset not in skimmed_batches and any(
        r.headers for r in compaction.decode_batch(data, h.position).records))
    assert with_headers >= MIN_LANES // 2
    monkeypatch.setattr(record_columns, "skim_records", skim)
    assert as_rows(cols) == skimmed(data, cols)


@pytest.mark.parametrize("damage", ["null_key", "past_the_record", "negative_count"])
def test_damaged_headers_are_refused_as_skim_records_refuses_them(damage: str) -> None:
    """A null header key, a header value running past its record, a negative header count
    (CRC recomputed): the CorruptSegmentError `skim_records` raises for that batch."""
    rng = random.Random(3)
    out = bytearray()
    for b in range(MIN_LANES * 2):
        recs = [Record(b * 10 + i, T0, b"k%d" % i, b"value", (Header("hk", b"hv"),))
                for i in range(5)]
        out += encode_batch(recs, base_offset=b * 10)
    data = bytearray(out)
    heads = data_headers(bytes(data))
    h = heads[rng.randrange(len(heads) // 2, len(heads))]
    area = h.position + BATCH_HEADER.size
    count_at = bytes(data).index(b"\x02\x04hk", area)  # header count 1, key length 2
    if damage == "null_key":
        data[count_at + 1] = 0x01  # key length -1
    elif damage == "past_the_record":
        data[count_at + 4] = 0x7E  # value length 63
    else:
        data[count_at] = 0x03  # header count -2
    _recrc(data, h.position)
    blob = bytes(data)
    with pytest.raises(CorruptSegmentError) as want:
        compaction.skim_records(compaction.records_area(memoryview(blob), h), h)
    with pytest.raises(CorruptSegmentError) as got:
        record_columns.record_columns(blob, data_headers(blob))
    assert str(got.value) == str(want.value)
    assert got.value.position == h.position


def _recrc(data: bytearray, position: int) -> None:
    """Set the CRC of the batch at `position` to its bytes' (damage the CRC cannot catch)."""
    size = int.from_bytes(data[position + 8:position + 12], "big") + 12
    data[position + 17:position + 21] = crc32c.crc32c(
        bytes(data[position + 21:position + size])).to_bytes(4, "big")


@pytest.mark.parametrize("damage", ["length", "key_length", "bytes_left", "count", "delta"])
def test_damaged_records_are_refused_as_skim_records_refuses_them(damage: str) -> None:
    """A record whose fields do not add up, a batch claiming more records than its bytes hold
    or bytes left after its last record, offset deltas out of order (CRC recomputed, so only
    the walk can see it): the column walk raises the CorruptSegmentError `skim_records` raises
    for that batch, whichever walk met it first."""
    data = bytearray(segment(11, MIN_LANES * 2, headers=0.0))
    heads = data_headers(bytes(data))
    h = next(h for h in heads[len(heads) // 2:] if h.records_count >= 5)
    area = h.position + BATCH_HEADER.size
    if damage == "length":
        data[area] = 0x7E  # the first record's length: 63, longer than it is
    elif damage == "key_length":
        rest = area + 3  # length (1 or 2 bytes), attributes, timestamp delta 0
        data[rest + (1 if data[area] & 0x80 else 0) + 1] = 0x05  # key length -3
    elif damage == "bytes_left":
        data[h.position + 57:h.position + 61] = (h.records_count - 1).to_bytes(4, "big")
    elif damage == "count":
        data[h.position + 57:h.position + 61] = (10**6).to_bytes(4, "big")
    else:
        data[h.position + 23:h.position + 27] = (0).to_bytes(4, "big")  # lastOffsetDelta
    _recrc(data, h.position)
    blob = bytes(data)
    with pytest.raises(CorruptSegmentError) as want:
        compaction_reference.scan_keys(blob)
    with pytest.raises(CorruptSegmentError) as got:
        record_columns.record_columns(blob, data_headers(blob))
    assert str(got.value) == str(want.value)


# -- the key pass and the cleaning pass ------------------------------------------------------------


@pytest.fixture(params=[None, 300_000, 20_000], ids=["whole", "windows", "small-windows"])
def windows(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each segment walked whole, in windows of a few hundred batches (each walked by the
    vectorised walk) or of a few batches (each walked record by record: `record_windows`)."""
    if request.param is not None:
        monkeypatch.setattr(record_columns, "WINDOW_BYTES", request.param)


@pytest.mark.parametrize("seed", range(4))
def test_key_pass_finds_the_latest_offsets_record_at_a_time_finds(seed: int,
                                                                   windows: None) -> None:
    data = segment(seed, MIN_LANES * 2, codecs=("none", "lz4"), transactions=True)
    want = compaction_reference.scan_keys(data)
    got = compact_columns.scan_keys(data)
    assert sorted(got.offsets.tolist()) == sorted(want.latest.values())
    assert len({bytes(i) for i in got.ids}) == len(got.ids)
    assert [(last, off) for last, _id, off in got.txn_keys] == [
        (last, off) for last, _d, off in want.txn_keys]
    assert got.producers == want.producers


def test_key_identities_are_exact_for_short_keys_and_md5_for_long_ones() -> None:
    keys = [b"", b"\0", b"a", b"a\0", b"k" * 15, b"k" * 16, b"k" * 300]
    ids = [key_id(k) for k in keys]
    assert all(len(i) == 16 for i in ids) and len(set(ids)) == len(keys)
    assert ids[2] == b"\x01a" + b"\0" * 14
    recs = [Record(n, T0, k, b"v") for n, k in enumerate(keys)]
    data = encode_batch(recs, base_offset=0)
    cols = record_columns.record_columns(data, data_headers(data))
    got = key_ids(cols, np.arange(len(keys)))
    assert [bytes(r) for r in got] == ids
    assert bucket_of(got, 7).tolist() == [key_bucket(i, 7) for i in ids]
    spread = bucket_of(key_ids(cols, np.arange(len(keys))), 1)
    assert spread.tolist() == [0] * len(keys)


def test_buckets_spread_keys_that_share_their_first_bytes() -> None:
    ids = np.frombuffer(b"".join(key_id(b"key-%08d" % i) for i in range(4000)),
                        np.uint8).reshape(-1, 16)
    counts = np.bincount(bucket_of(ids, 8), minlength=8)
    assert counts.min() > 350, counts


def test_the_key_map_keeps_each_keys_highest_offset_across_segments_and_transactions() -> None:
    ids = [key_id(b"a"), key_id(b"b"), key_id(b"a"), key_id(b"c")]
    seg0 = np.frombuffer(b"".join(ids[:2]), np.uint8).reshape(-1, 16)
    seg1 = np.frombuffer(b"".join(ids[2:]), np.uint8).reshape(-1, 16)
    rows = [("k", 0, seg0.tobytes(), np.array([3, 4], np.int64).tobytes()),
            ("k", 1, seg1.tobytes(), np.array([12, 11], np.int64).tobytes()),
            ("t", key_id(b"b"), 15), ("t", key_id(b"c"), 2)]
    got = dict(reduce_bucket(0, [0, 10], rows))
    assert np.frombuffer(got[(0, 1)], np.int64).tolist() == [11, 12, 15]
    assert (0, 0) not in got
    uniq, best = last_per_key(np.frombuffer(b"".join(ids), np.uint8).reshape(-1, 16),
                              np.array([1, 2, 3, 4], np.int64))
    assert sorted(best.tolist()) == [2, 3, 4] and len(uniq) == 3


def _one_pass(segments: list[bytes], now: int, column: bool
              ) -> list[compaction.SegmentCleaning]:
    keys: dict[bytes, int] = {}
    producers: dict[int, list[compaction.ProducerEvent]] = defaultdict(list)
    txn: list[tuple[int, bytes, int]] = []
    for seg in segments:
        for ev in compaction_reference.scan_segment(seg):
            if isinstance(ev, compaction_reference.KeyEvent):
                if ev.txn_batch is None:
                    keys[ev.hash] = max(keys.get(ev.hash, -1), ev.offset)
                else:
                    txn.append((ev.txn_batch[1], ev.hash, ev.offset))
            else:
                producers[ev.producer_id].append(ev)
    flags: dict[int, int] = {}
    for evs in producers.values():
        flags.update(compaction.transaction_flags(evs))
    for last, digest, offset in txn:
        if not flags.get(last, 0) & (compaction.ABORTED | compaction.IN_DOUBT):
            keys[digest] = max(keys.get(digest, -1), offset)
    winners = set(keys.values())
    if not column:
        return [compaction.compact_segment(seg, latest=winners, flags=flags, now_ms=now,
                                           delete_retention_ms=DAY) for seg in segments]
    ordered = np.array(sorted(winners), np.int64)
    return [compact_columns.clean_segment(seg, latest=ordered, flags=flags, now_ms=now,
                                          delete_retention_ms=DAY) for seg in segments]


@pytest.mark.parametrize("seed", range(4))
def test_cleaning_pass_writes_what_compact_segment_writes(seed: int, windows: None) -> None:
    """Several passes (time moving past the delete horizons) over segments with transactions,
    tombstones, keyless records, headers and mixed codecs, walked whole or window by window:
    byte-identical output and the same counts, pass after pass."""
    segments = [segment(seed * 10 + i, MIN_LANES * 3, codecs=("none", "gzip"),
                        transactions=True) for i in range(2)]
    now = T0
    for _ in range(3):
        want = _one_pass(segments, now, column=False)
        got = _one_pass(segments, now, column=True)
        for w, g in zip(want, got, strict=True):
            assert g.data == w.data
            assert (g.records_in, g.records_kept, g.tombstones_dropped, g.keyless_kept,
                    g.batches_dropped, g.horizons_set, g.changed, g.live_markers) == (
                w.records_in, w.records_kept, w.tombstones_dropped, w.keyless_kept,
                w.batches_dropped, w.horizons_set, w.changed, w.live_markers)
        segments = [w.data for w in want if w.data]
        now += DAY + 1


def test_identities_sharing_their_mix_are_still_told_apart() -> None:
    """Two distinct identities whose 64-bit mix (the sort key) collides, interleaved: each
    still comes out once with its own highest offset (the exact sort takes over)."""
    mix, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1
    inverse = pow(mix, -1, 1 << 64)
    a0, a1, b0 = 11, 22, 33
    mixed = ((((a0 * mix) & mask) ^ a1) * mix) & mask
    b1 = ((mixed * inverse) & mask) ^ ((b0 * mix) & mask)
    a = a0.to_bytes(8, "little") + a1.to_bytes(8, "little")
    b = b0.to_bytes(8, "little") + b1.to_bytes(8, "little")
    ids = np.frombuffer(a + b + a + b + a, np.uint8).reshape(-1, 16)
    assert bucket_of(ids[:2], 1 << 30).tolist()[0] == bucket_of(ids[:2], 1 << 30).tolist()[1]
    uniq, best = last_per_key(ids, np.array([1, 2, 3, 4, 5], np.int64))
    assert sorted(zip(best.tolist(), [bytes(u) for u in uniq], strict=True)) == [(4, b), (5, a)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_highest_offset_per_key_whatever_the_rows_order(seed: int) -> None:
    """Rows in any order (transactional keys come after the segments' rows): each key once,
    with its highest offset, the result in offset order; the same as a dict would keep."""
    rng = np.random.default_rng(seed)
    keys = [key_id(b"k%d" % rng.integers(0, 500)) for _ in range(3000)]
    offsets = rng.permutation(10_000)[:3000].astype(np.int64)
    want: dict[bytes, int] = {}
    for k, o in zip(keys, offsets.tolist(), strict=True):
        want[k] = max(want.get(k, -1), o)
    uniq, best = last_per_key(np.frombuffer(b"".join(keys), np.uint8).reshape(-1, 16), offsets)
    assert best.tolist() == sorted(want.values())
    assert {bytes(u): int(b) for u, b in zip(uniq, best, strict=True)} == want
