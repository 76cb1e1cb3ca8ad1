"""A segment's data records as numpy columns: the compaction job's two passes over every
record (docs/compaction.md, "How the job runs") without an interpreted step per record.

`skim_records` walks a batch one record at a time, about 3 µs a record in CPython: at 80-byte
records that is 25 MB/s a core, and the job walks every record twice. Here the walk steps
through all the batches of a segment at once: step j reads record j of every batch that has
one, with a few array operations per field, so a segment of 4,000 batches of 50 records takes
50 vectorised steps instead of 200,000 interpreted ones.

The columns hold exactly what `skim_records` returns for each batch. A batch this walk does
not take on is handed to `skim_records` itself, which reads it or raises the
CorruptSegmentError naming it, so damage is refused as the record-at-a-time walk refuses it:

* a record with more than `MAX_HEADERS` headers (each header is one more vectorised step);
* a varint longer than any sane record needs (4 bytes: 2**27; a timestamp delta: 9 bytes),
  a count no bytes could hold, a zero count, any check failing;
* the longest batches of a segment, when few: each vectorised step costs about as much as a
  few dozen records walked one at a time, so a step is taken only while at least
  `MIN_LANES` batches still have records.

Keys get a 16-byte identity for the key map (`key_ids`): a key of up to 15 bytes is itself
(its length, then its bytes), compared exactly; a longer one is its MD5 digest, as Kafka's
`SkimpyOffsetMap` compares every key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tiered.errors import CorruptSegmentError
from tiered.kafka.compaction import records_area, skim_records
from tiered.kafka.records import BATCH_HEADER, COMPRESSION_MASK, BatchHeader

#: records bytes (decompressed) walked at a time (`record_windows`): bounds a task's memory
WINDOW_BYTES = 32 * 1024 * 1024
#: a step of the vectorised walk is taken only while this many batches have a record left
MIN_LANES = 128
#: zero bytes after the buffer: a read past a batch's end lands there, never out of bounds
_PAD = 32
#: longest varint the walk decodes (record length, offset delta, key and value lengths);
#: longer ones (2**27 and up) go to `skim_records`
_MAX_VARINT = 4
#: longest varlong (the timestamp delta) the walk decodes
_MAX_VARLONG = 9
#: the fewest bytes a record takes: length, attributes, timestamp delta, offset delta, key
#: length, value length, header count
_MIN_RECORD = 7
#: records with up to this many headers are walked here; a batch with a record holding more
#: goes to `skim_records`
MAX_HEADERS = 16
#: a key of up to this many bytes is its own identity in the key map; longer ones are MD5'd
SHORT_KEY = 15
#: identity bytes of one key
ID_BYTES = 16
_MIX = np.uint64(0x9E3779B97F4A7C15)
_M64 = (1 << 64) - 1


@dataclass
class RecordColumns:
    """Every record of the given data batches, one row each, batches in the order given. Record
    positions are in `whole`: the segment's bytes from the first batch given to the last, then
    the records areas of the compressed ones decompressed, then `_PAD` zero bytes."""

    whole: bytes
    headers: list[BatchHeader]
    #: per batch, its first row; one more entry: the row count
    first_row: np.ndarray
    #: per record: absolute offset, timestamp delta, key position and length (-1: no key),
    #: value is null, and the positions `splice_batch` copies from
    offset: np.ndarray
    ts_delta: np.ndarray
    key_at: np.ndarray
    klen: np.ndarray
    vnull: np.ndarray
    start: np.ndarray
    attr_at: np.ndarray
    rest: np.ndarray
    end: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """Records per batch."""
        return np.diff(self.first_row)

    def per_batch(self, values: np.ndarray) -> np.ndarray:
        """The sum of `values` (one per record) over each batch's records."""
        sums = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
        return sums[self.first_row[1:]] - sums[self.first_row[:-1]]


def record_windows(data: bytes, headers: Sequence[BatchHeader], *, path: str | None = None,
                   window: int | None = None) -> Iterator[RecordColumns]:
    """The records of the data batches `headers` (from `iter_batch_headers(data)`, control
    batches left out) as columns, a run of consecutive batches at a time: each window holds
    about `window` bytes of records (decompressed), so a task's memory does not grow with the
    segment or its compression ratio (default `WINDOW_BYTES`). CorruptSegmentError as
    `skim_records` raises it."""
    limit = WINDOW_BYTES if window is None else window
    view = memoryview(data)
    group: list[BatchHeader] = []
    areas: list[bytes | None] = []
    size = 0
    for h in headers:
        area = records_area(view, h) if h.attributes & COMPRESSION_MASK else None
        group.append(h)
        areas.append(area)
        size += h.size if area is None else len(area)
        if size >= limit:
            yield _columns(view, group, areas, group[0].position, path)
            group, areas, size = [], [], 0
    if group:
        yield _columns(view, group, areas, group[0].position, path)


def record_columns(data: bytes, headers: Sequence[BatchHeader], *,
                   path: str | None = None) -> RecordColumns:
    """Every record of the data batches `headers` as one `RecordColumns`, positions counted
    from the start of `data` (`record_windows` with no limit)."""
    view = memoryview(data)
    areas = [records_area(view, h) if h.attributes & COMPRESSION_MASK else None
             for h in headers]
    return _columns(view, headers, areas, 0, path)


def _columns(view: memoryview, headers: Sequence[BatchHeader], areas: Sequence[bytes | None],
             lo: int, path: str | None) -> RecordColumns:
    """The columns of `headers`, positions counted from byte `lo` of the segment: `whole` is
    the segment from `lo` to the last batch's end, then the decompressed areas, then padding."""
    nb = len(headers)
    hi = headers[-1].end_position if headers else lo
    begins = np.empty(nb, np.int64)
    ends = np.empty(nb, np.int64)
    tail = hi - lo
    for i, (h, area) in enumerate(zip(headers, areas, strict=True)):
        if area is not None:
            begins[i], ends[i] = tail, tail + len(area)
            tail += len(area)
        else:
            begins[i] = h.position + BATCH_HEADER.size - lo
            ends[i] = h.end_position - lo
    whole = b"".join((view[lo:hi], *(a for a in areas if a is not None), bytes(_PAD)))
    counts = np.fromiter((h.records_count for h in headers), np.int64, nb)
    last_delta = np.fromiter((h.last_offset_delta for h in headers), np.int64, nb)
    bases = np.fromiter((h.base_offset for h in headers), np.int64, nb)
    # a count its bytes cannot hold is damage (or a lie): `skim_records` says which
    sane = (counts > 0) & (counts * _MIN_RECORD <= ends - begins)
    first_row = np.concatenate(([0], np.cumsum(np.where(sane, counts, 0))))
    rows = int(first_row[-1])
    cols = RecordColumns(
        whole, list(headers), first_row, offset=np.zeros(rows, np.int64),
        ts_delta=np.zeros(rows, np.int64), key_at=np.zeros(rows, np.int64),
        klen=np.zeros(rows, np.int64), vnull=np.zeros(rows, bool),
        start=np.zeros(rows, np.int64), attr_at=np.zeros(rows, np.int64),
        rest=np.zeros(rows, np.int64), end=np.zeros(rows, np.int64))
    slow = _walk(np.frombuffer(whole, np.uint8), cols, begins, ends, counts, last_delta, bases,
                 sane)
    for i in sorted(set(np.nonzero(~sane)[0].tolist()) | slow):
        _skim_into(cols, i, int(begins[i]), int(ends[i]), path)
    return cols


def _walk(buf: np.ndarray, cols: RecordColumns, begins: np.ndarray, ends: np.ndarray,
          counts: np.ndarray, last_delta: np.ndarray, bases: np.ndarray, sane: np.ndarray
          ) -> set[int]:
    """The vectorised walk over the sane batches; returns the batches left to `skim_records`
    (a record with many headers, a failed check, the longest few)."""
    lanes = np.nonzero(sane)[0]
    lanes = lanes[np.argsort(-counts[lanes], kind="stable")]
    if len(lanes) < MIN_LANES:
        return set(lanes.tolist())
    steps = int(counts[lanes[MIN_LANES - 1]])
    slow = set(lanes[counts[lanes] > steps].tolist())
    lanes = lanes[counts[lanes] <= steps]
    n = counts[lanes]
    pos = begins[lanes].copy()
    stop = ends[lanes]
    last = last_delta[lanes]
    base = bases[lanes]
    row0 = cols.first_row[lanes]
    prev = np.full(len(lanes), -1, np.int64)
    bad = np.zeros(len(lanes), bool)
    lim = len(buf) - _PAD
    for j in range(steps):
        m = int(np.count_nonzero(n > j))  # lanes are longest first: the active ones lead
        p = pos[:m]
        length, k1, over = _varint(buf, p, _MAX_VARINT, lim)
        body = p + k1
        end = body + length
        ts, k2, over2 = _varint(buf, body + 1, _MAX_VARLONG, lim)
        rest = body + 1 + k2
        delta, k3, over3 = _varint(buf, rest, _MAX_VARINT, lim)
        at = rest + k3
        klen, k4, over4 = _varint(buf, at, _MAX_VARINT, lim)
        key_at = at + k4
        at = key_at + np.maximum(klen, 0)
        vlen, k5, over5 = _varint(buf, at, _MAX_VARINT, lim)
        at = at + k5 + np.maximum(vlen, 0)
        count, k6, over6 = _varint(buf, at, _MAX_VARINT, lim)
        ok = ~(over | over2 | over3 | over4 | over5 | over6)
        ok &= (length >= 0) & (end <= stop[:m]) & (count >= 0) & (count <= MAX_HEADERS)
        ok &= (klen >= -1) & (vlen >= -1) & (prev[:m] < delta) & (delta <= last[:m])
        at, ok = _skip_headers(buf, at + k6, count, end, ok, lim)
        ok &= at == end
        bad[:m] |= ~ok
        r = row0[:m] + j
        cols.offset[r] = base[:m] + delta
        cols.ts_delta[r] = ts
        cols.key_at[r] = key_at
        cols.klen[r] = klen
        cols.vnull[r] = vlen < 0
        cols.start[r] = p
        cols.attr_at[r] = body
        cols.rest[r] = rest
        cols.end[r] = end
        prev[:m] = delta
        pos[:m] = np.where(ok, end, stop[:m])
    bad |= pos != stop  # bytes left after the last record
    slow.update(lanes[bad].tolist())
    return slow


def _skip_headers(buf: np.ndarray, at: np.ndarray, count: np.ndarray, end: np.ndarray,
                  ok: np.ndarray, lim: int) -> tuple[np.ndarray, np.ndarray]:
    """Step over the `count` headers (key length and key, value length and value) starting at
    `at` of the records still `ok`: (the positions after them, still ok). A null key, a value
    length below -1 or a header past its record's `end` is not ok (`skim_records` then
    reads the batch or refuses it)."""
    walking = ok & (count > 0)
    for i in range(int(count[walking].max()) if walking.any() else 0):
        walking &= count > i
        klen, k1, over1 = _varint(buf, at, _MAX_VARINT, lim)
        value_at = at + k1 + np.maximum(klen, 0)
        vlen, k2, over2 = _varint(buf, value_at, _MAX_VARINT, lim)
        after = value_at + k2 + np.maximum(vlen, 0)
        fine = ~(over1 | over2) & (klen >= 0) & (vlen >= -1) & (after <= end)
        ok = ok & ~(walking & ~fine)
        walking &= fine
        at = np.where(walking, after, at)
    return at, ok


def _varint(buf: np.ndarray, p: np.ndarray, most: int, lim: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The zig-zag varints at positions `p`: (values, bytes taken, longer than `most`)."""
    b = buf[np.minimum(p, lim)].astype(np.int64)
    raw = b & 0x7F
    taken = np.ones(len(p), np.int64)
    more = b >= 0x80
    for i in range(1, most):
        if not more.any():
            break
        b = buf[np.minimum(p + i, lim)].astype(np.int64)
        raw |= np.where(more, (b & 0x7F) << (7 * i), 0)
        taken += more
        more &= b >= 0x80
    return (raw >> 1) ^ -(raw & 1), taken, more


def _skim_into(cols: RecordColumns, i: int, begin: int, end: int, path: str | None) -> None:
    """Batch `i` walked by `skim_records` (which raises on damage), into its rows."""
    h = cols.headers[i]
    recs = skim_records(cols.whole[begin:end], h, path=path)
    lo = int(cols.first_row[i])
    if lo + len(recs) != int(cols.first_row[i + 1]):
        # `skim_records` reads exactly `records_count` records or raises, and a record takes
        # `_MIN_RECORD` bytes at least: a batch set aside as insane never gets here with rows
        raise CorruptSegmentError(f"batch at offset {h.base_offset}: {len(recs)} records "
                                  "where its count left no room", path=path,
                                  position=h.position)
    if not recs:
        return
    at = slice(lo, lo + len(recs))
    cols.offset[at] = [h.base_offset + r[0] for r in recs]
    cols.ts_delta[at] = [r[1] for r in recs]
    cols.klen[at] = [-1 if r[2] is None else len(r[2]) for r in recs]
    cols.vnull[at] = [r[3] for r in recs]
    cols.start[at] = [begin + r[4] for r in recs]
    cols.attr_at[at] = [begin + r[5] for r in recs]
    cols.rest[at] = [begin + r[6] for r in recs]
    cols.end[at] = [begin + r[7] for r in recs]
    # the key starts right before the value length: recompute it from the fields skimmed
    cols.key_at[at] = [_key_at(cols.whole, begin + r[6]) for r in recs]


def _key_at(whole: bytes, rest: int) -> int:
    """Where a record's key starts, from where its offset delta starts."""
    at = rest
    for _ in range(2):  # offset delta, key length
        while whole[at] & 0x80:
            at += 1
        at += 1
    return at


# -- key identities ------------------------------------------------------------------------------


def key_id(key: bytes) -> bytes:
    """A key's 16-byte identity in the key map: a key of up to `SHORT_KEY` bytes is its length
    and its bytes (compared exactly); a longer one its MD5 digest."""
    if len(key) <= SHORT_KEY:
        return bytes((len(key),)) + key.ljust(SHORT_KEY, b"\0")
    return hashlib.md5(key, usedforsecurity=False).digest()


def key_ids(cols: RecordColumns, rows: np.ndarray) -> np.ndarray:
    """`key_id` of the keys of `rows` (each must have a key), as an (n, 16) uint8 array."""
    ids = np.zeros((len(rows), ID_BYTES), np.uint8)
    klen = cols.klen[rows]
    key_at = cols.key_at[rows]
    short = np.nonzero(klen <= SHORT_KEY)[0]
    if len(short):
        # 16 bytes from the key's first, each row a view into the buffer, then the bytes past
        # the key zeroed and its length put in front (the padding keeps the last row inside)
        rows = np.lib.stride_tricks.sliding_window_view(
            np.frombuffer(cols.whole, np.uint8), ID_BYTES - 1)[key_at[short]]
        n = klen[short]
        ids[short, 0] = n
        ids[short, 1:] = np.where(np.arange(SHORT_KEY) < n[:, None], rows, 0)
    long = np.nonzero(klen > SHORT_KEY)[0]
    if len(long):
        whole = cols.whole
        md5 = hashlib.md5
        digests = b"".join(md5(whole[a:a + n], usedforsecurity=False).digest()
                           for a, n in zip(key_at[long].tolist(), klen[long].tolist(),
                                           strict=True))
        ids[long] = np.frombuffer(digests, np.uint8).reshape(-1, ID_BYTES)
    return ids


def key_bucket(key_id_bytes: bytes, buckets: int) -> int:
    """The bucket of the partition's key map a key identity belongs to (`bucket_of`, for one)."""
    if buckets <= 1:
        return 0
    hi = int.from_bytes(key_id_bytes[:8], "little")
    lo = int.from_bytes(key_id_bytes[8:16], "little")
    mixed = ((((hi * int(_MIX)) & _M64) ^ lo) * int(_MIX)) & _M64
    return (mixed >> 32) % buckets


def bucket_of(ids: np.ndarray, buckets: int) -> np.ndarray:
    """`key_bucket` of every identity in `ids` ((n, 16) uint8): mixed from all 16 bytes, as a
    short key's first bytes are shared by many keys (`key-000...`)."""
    if buckets <= 1:
        return np.zeros(len(ids), np.int64)
    mixed = _mix(np.ascontiguousarray(ids).view("<u8"))
    return ((mixed >> np.uint64(32)) % np.uint64(buckets)).astype(np.int64)


def last_per_key(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct identity in `ids` once, with its highest offset: (ids, offsets), in offset
    order. Rows are sorted by a 64-bit mix of the identity (numpy's unstable sort, several
    times faster than a stable one on 64-bit keys: no order within a key is relied on), and
    each run of equal identities gives its highest offset. The mix and an identity's first
    half determine the identity (multiplying by an odd number is a bijection modulo 2**64),
    so rows are compared on those two words; should two identities share their mix (about
    one chance in 2**64 a pair), the exact sort on all 16 bytes is used."""
    if not len(ids):
        return ids, offsets
    halves = np.ascontiguousarray(ids).view("<u8")
    mixed = _mix(halves)
    order = np.argsort(mixed)
    m = mixed[order]
    first = halves[:, 0][order]
    same_mix = m[1:] == m[:-1]
    differs = ~same_mix | (first[1:] != first[:-1])
    if bool(np.any(same_mix & differs)):  # two identities share a mix: sort exactly
        order = np.lexsort((halves[:, 1], halves[:, 0]))
        h0, h1 = halves[order, 0], halves[order, 1]
        differs = (h0[1:] != h0[:-1]) | (h1[1:] != h1[:-1])
    starts = np.flatnonzero(np.concatenate(([True], differs)))
    best = np.maximum.reduceat(offsets[order], starts)
    kept = ids[order[starts]]
    by_offset = np.argsort(best)  # back in offset order
    return kept[by_offset], best[by_offset]


def _mix(halves: np.ndarray) -> np.ndarray:
    """A 64-bit mix of each identity's two halves (`key_bucket` takes its high bits)."""
    return ((halves[:, 0] * _MIX) ^ halves[:, 1]) * _MIX
