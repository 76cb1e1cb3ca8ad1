"""Segment files: names, offset and time lookups over a multi-batch segment with a genuinely
sparse index, ranged reads, truncation, CRC damage, live (active) segments, index rebuild."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest

from tiered.errors import CorruptSegmentError
from tiered.kafka.builder import encode_batch
from tiered.kafka.index import IndexEntry, OffsetIndex
from tiered.kafka.records import Record, TruncatedBatchError, iter_batch_headers
from tiered.kafka.segment import (
    READ_WINDOW_BYTES,
    LogFile,
    RunningChecksum,
    Segment,
    build_indexes,
    parse_segment_file_name,
    segment_file_name,
)

BASE = 1000
T0 = 1_699_000_000_000


def kafka_reference_indexes(log: bytes, base: int, interval: int = 4096) -> tuple[bytes, bytes]:
    """Kafka's LogSegment.recover followed by onBecomeInactiveSegment, transcribed from the
    Java with raw header offsets (independent of tiered.kafka.records / tiered.kafka.index)."""
    index = b""
    timeindex: list[tuple[int, int]] = []
    valid_bytes = last_index_entry = 0
    max_ts, offset_of_max = -1, base  # TimestampOffset.UNKNOWN -> timeIndex.lastEntry()

    def time_maybe_append(ts: int, offset: int) -> None:
        last_ts = timeindex[-1][0] if timeindex else -1
        if ts > last_ts:
            timeindex.append((ts, offset))

    while valid_bytes < len(log):
        (base_offset, length) = struct.unpack_from(">qi", log, valid_bytes)
        (last_delta,) = struct.unpack_from(">i", log, valid_bytes + 23)
        (batch_max_ts,) = struct.unpack_from(">q", log, valid_bytes + 35)
        last_offset = base_offset + last_delta
        if batch_max_ts > max_ts:
            max_ts, offset_of_max = batch_max_ts, last_offset
        if valid_bytes - last_index_entry > interval:
            index += struct.pack(">ii", last_offset - base, valid_bytes)
            time_maybe_append(max_ts, offset_of_max)
            last_index_entry = valid_bytes
        valid_bytes += length + 12
    time_maybe_append(max_ts, offset_of_max)
    return index, b"".join(struct.pack(">qi", ts, off - base) for ts, off in timeindex)


def make_batches(base: int, count: int, per_batch: int, timestamp: Callable[[int], int],
                 value_size: int = 90) -> list[list[Record]]:
    batches, offset = [], base
    for _ in range(count):
        batch = []
        for _ in range(per_batch):
            batch.append(Record(offset, timestamp(offset), f"k{offset}".encode(),
                                bytes([offset % 251]) * value_size))
            offset += 1
        batches.append(batch)
    return batches


def write_segment(directory: Path, base: int, batches: list[list[Record]], *,
                  active: bool = False) -> Segment:
    data = b"".join(encode_batch(b, base_offset=b[0].offset, compression="gzip" if i % 3 == 0
                                 else "none") for i, b in enumerate(batches))
    segment = Segment.in_dir(directory, base, active=active)
    segment.log_path.write_bytes(data)
    index, timeindex = build_indexes(data, base_offset=base)
    segment.index_path.write_bytes(index)
    segment.timeindex_path.write_bytes(timeindex)
    return segment


@pytest.fixture()
def segment(tmp_path: Path) -> Segment:
    # 300 batches of 4 records, ~450 bytes each: ~130 KB, an index entry every ~10 batches
    return write_segment(tmp_path, BASE, make_batches(BASE, 300, 4, lambda o: T0 + o * 10))


def all_records(seg: Segment) -> list[Record]:
    return [r for batch in seg.iter_batches() for r in batch.records]


def test_segment_file_names() -> None:
    assert segment_file_name(0) == "00000000000000000000.log"
    assert segment_file_name(5_242_880, ".timeindex") == "00000000000005242880.timeindex"
    assert parse_segment_file_name("00000000000005242880.log") == 5_242_880
    assert parse_segment_file_name("00000000000005242880.index", ".index") == 5_242_880
    assert parse_segment_file_name("00000000000005242880.index") is None
    for name in ["00000000000005242880.log.deleted", "0000000000005242880.log",
                 "0000000000000524288x.log", "leader-epoch-checkpoint",
                 "99999999999999999999.log"]:
        assert parse_segment_file_name(name) is None, name
    with pytest.raises(ValueError):
        segment_file_name(-1)
    seg = Segment.from_log_path("/d/00000000000000000042.log")
    assert seg.base_offset == 42
    assert seg.index_path == Path("/d/00000000000000000042.index")
    assert seg.timeindex_path == Path("/d/00000000000000000042.timeindex")
    with pytest.raises(ValueError):
        Segment.from_log_path("/d/foo.log")


def test_index_is_actually_sparse(segment: Segment) -> None:
    batches = list(segment.iter_batch_headers())
    index = segment.offset_index()
    assert 5 < len(index) < len(batches) // 5
    assert len(segment.time_index()) == len(index) + 1  # plus the closing entry


def test_find_offset_for_every_offset(segment: Segment) -> None:
    headers = list(segment.iter_batch_headers())
    for header in headers:
        for offset in range(header.base_offset, header.last_offset + 1):
            assert segment.find_offset(offset) == header
    assert segment.find_offset(BASE - 5) == headers[0]  # Kafka: first batch ending at or after
    assert segment.find_offset(headers[-1].last_offset + 1) is None


def test_find_offset_reads_only_near_the_index_entry(
    segment: Segment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tiered.kafka.segment.READ_WINDOW_BYTES", 4096)
    read_bytes = []
    real_read = LogFile.read

    def counting_read(self: LogFile, position: int, length: int) -> bytes:
        data = real_read(self, position, length)
        read_bytes.append(len(data))
        return data

    monkeypatch.setattr(LogFile, "read", counting_read)
    last = segment.last_batch()
    assert last is not None
    assert segment.find_offset(last.last_offset) == last
    # the scan starts at the last index entry: about one index interval plus a batch
    assert sum(read_bytes) < 3 * 4096 < segment.size() // 8


def test_offset_for_timestamp_matches_a_brute_force_scan(tmp_path: Path) -> None:
    rng = random.Random(7)
    # timestamps that mostly rise but jump back now and then, as producers' clocks do
    stamps: dict[int, int] = {}

    def ts(offset: int) -> int:
        stamps[offset] = T0 + offset * 10 + rng.choice([0, 0, 0, -5000, 3000])
        return stamps[offset]

    seg = write_segment(tmp_path, BASE, make_batches(BASE, 200, 5, ts))
    records = all_records(seg)
    assert [r.timestamp for r in records] == [stamps[r.offset] for r in records]
    targets = sorted({r.timestamp for r in records} | {T0 - 1, T0 + 10**9})
    for target in targets[::3]:
        for start in (None, BASE + 333):
            floor = BASE if start is None else start
            expected = next(((r.timestamp, r.offset) for r in records
                             if r.timestamp >= target and r.offset >= floor), None)
            found = seg.offset_for_timestamp(target, starting_offset=start)
            assert (found[:2] if found else None) == expected, (target, start)
    hit = seg.offset_for_timestamp(T0)
    assert hit is not None and hit.leader_epoch == 0


def test_read_range_returns_whole_batches(segment: Segment) -> None:
    headers = list(segment.iter_batch_headers())
    start = headers[10].position
    budget = headers[13].end_position - start + 5  # three batches and a bit
    data = segment.read_range(start, budget)
    assert data == segment.log_path.read_bytes()[start:headers[13].end_position]
    assert [h.base_offset for h in iter_batch_headers(data)] == [
        h.base_offset for h in headers[10:14]]
    # a budget below one batch still returns that batch, unless told not to
    assert len(segment.read_range(start, 1)) == headers[10].size
    assert segment.read_range(start, 1, min_one_batch=False) == b""
    assert segment.read_range(segment.size(), 1000) == b""
    from_offset = segment.read_from_offset(headers[20].base_offset + 1, 10**9)
    assert len(from_offset) == segment.size() - headers[20].position


def test_last_offset_size_and_max_timestamp(tmp_path: Path) -> None:
    # the largest timestamp sits early in the segment, far from the last index entries
    def ts(offset: int) -> int:
        return T0 + 10**6 if offset == BASE + 17 else T0 + offset

    seg = write_segment(tmp_path, BASE, make_batches(BASE, 150, 4, ts))
    headers = list(seg.iter_batch_headers())
    assert seg.last_offset() == headers[-1].last_offset == BASE + 599
    assert seg.next_offset() == BASE + 600
    assert seg.size() == headers[-1].end_position == seg.log_path.stat().st_size
    assert seg.max_timestamp() == T0 + 10**6 == max(h.max_timestamp for h in headers)


def test_verify_summarises_a_good_segment(segment: Segment) -> None:
    summary = segment.verify()
    assert summary.batches == 300
    assert summary.records == 1200
    assert (summary.first_offset, summary.last_offset) == (BASE, BASE + 1199)
    assert summary.size == segment.size()
    assert summary.first_timestamp == T0 + BASE * 10
    assert summary.max_timestamp == T0 + (BASE + 1199) * 10


def test_verify_checksums_the_whole_file_in_its_one_pass(tmp_path: Path) -> None:
    # batches of ~300 KiB against the 1 MiB read window: windows straddle batches and are
    # re-read from a batch start, yet every byte enters the checksum exactly once
    batches = make_batches(BASE, 20, 3, lambda o: T0 + o, value_size=100_000)
    seg = write_segment(tmp_path, BASE, batches)
    data = seg.log_path.read_bytes()
    assert len(data) > 3 * READ_WINDOW_BYTES
    assert seg.verify().checksum == crc32c.crc32c(data)
    # an active segment's preallocated (zero) tail ends the walk before the file's end: the
    # bytes it never read are in no checksum
    seg.log_path.write_bytes(data + bytes(3 * READ_WINDOW_BYTES))
    live = Segment(seg.base_offset, seg.log_path, active=True)
    summary = live.verify()
    assert summary.size == len(data) and summary.checksum is None


def test_running_checksum_takes_overlapping_windows_once() -> None:
    data = bytes(range(256)) * 40
    crc = RunningChecksum()
    for start, end in [(0, 1000), (600, 3000), (3000, 3000), (2500, len(data))]:
        crc.feed(data[start:end], start)
    assert (crc.value, crc.end) == (crc32c.crc32c(data), len(data))
    with pytest.raises(ValueError, match="gap"):
        crc.feed(b"x", len(data) + 1)


def test_truncated_segment_is_corrupt_unless_active(segment: Segment) -> None:
    headers = list(segment.iter_batch_headers())
    data = segment.log_path.read_bytes()
    segment.log_path.write_bytes(data[: headers[-1].position + 30])
    with pytest.raises(TruncatedBatchError) as err:
        segment.verify()
    assert err.value.position == headers[-1].position
    assert str(segment.log_path) in str(err.value)
    # the broker may be mid-append on the active segment: the torn tail just is not there yet
    live = Segment(segment.base_offset, segment.log_path, active=True)
    assert live.verify().batches == len(headers) - 1
    assert live.last_offset() == headers[-2].last_offset
    assert live.find_offset(headers[-1].base_offset) is None


def test_flipped_byte_is_a_crc_error_naming_the_batch(segment: Segment) -> None:
    headers = list(segment.iter_batch_headers())
    victim = headers[150]
    data = bytearray(segment.log_path.read_bytes())
    data[victim.position + 70] ^= 0x01
    segment.log_path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError) as err:
        segment.verify()
    assert err.value.position == victim.position
    assert err.value.path == str(segment.log_path)
    assert "CRC" in str(err.value) and f"byte {victim.position}" in str(err.value)
    with pytest.raises(CorruptSegmentError, match="CRC"):
        segment.find_offset(victim.base_offset)
    # batches before the damage are still served
    assert segment.find_offset(headers[3].base_offset) == headers[3]


def test_empty_segment(tmp_path: Path) -> None:
    seg = Segment.in_dir(tmp_path, 77)
    seg.log_path.write_bytes(b"")
    assert seg.last_offset() is None
    assert seg.next_offset() == 77
    assert seg.max_timestamp() is None
    assert seg.find_offset(77) is None
    assert seg.offset_for_timestamp(0) is None
    assert seg.verify().batches == 0


def test_missing_indexes_only_slow_lookups_down(segment: Segment) -> None:
    expected = segment.find_offset(BASE + 1000)
    segment.index_path.unlink()
    segment.timeindex_path.unlink()
    assert len(segment.offset_index()) == 0
    assert segment.find_offset(BASE + 1000) == expected
    found = segment.offset_for_timestamp(T0 + (BASE + 1000) * 10)
    assert found is not None
    assert found[:2] == (T0 + (BASE + 1000) * 10, BASE + 1000)


def test_corrupt_index_of_a_closed_segment_is_an_error(segment: Segment) -> None:
    segment.index_path.write_bytes(segment.index_path.read_bytes() + b"\x01")
    with pytest.raises(CorruptSegmentError, match="multiple"):
        segment.find_offset(BASE + 500)
    live = Segment(segment.base_offset, segment.log_path, active=True)
    assert live.find_offset(BASE + 500) is not None  # a live index may be caught mid-write


def test_active_segment_with_preallocated_indexes_and_log(segment: Segment) -> None:
    headers = list(segment.iter_batch_headers())
    index_bytes = segment.index_path.read_bytes()
    segment.index_path.write_bytes(index_bytes + b"\x00" * 8 * 5000)
    segment.timeindex_path.write_bytes(segment.timeindex_path.read_bytes() + b"\x00" * 12 * 5000)
    with open(segment.log_path, "ab") as f:
        f.write(b"\x00" * 65536)  # log.preallocate=true
    live = Segment(segment.base_offset, segment.log_path, active=True)
    assert len(live.offset_index()) == len(index_bytes) // 8
    holder = next(h for h in headers if h.last_offset >= BASE + 1100)
    assert live.find_offset(BASE + 1100) == holder
    assert live.last_offset() == headers[-1].last_offset
    assert live.max_timestamp() == max(h.max_timestamp for h in headers)
    assert live.verify().batches == len(headers)
    with pytest.raises(CorruptSegmentError):
        Segment(segment.base_offset, segment.log_path).verify()  # zeros: no batch


def test_verify_catches_an_index_entry_off_a_batch_boundary(segment: Segment) -> None:
    index = segment.offset_index()
    entries = list(index)
    entries[2] = IndexEntry(entries[2].offset, entries[2].position + 1)
    segment.index_path.write_bytes(OffsetIndex(BASE, entries).to_bytes())
    with pytest.raises(CorruptSegmentError, match="index entry 2") as err:
        segment.verify()
    assert err.value.path == str(segment.index_path)
    assert segment.verify(check_indexes=False).batches == 300


def test_build_indexes_matches_kafkas_recovery(segment: Segment) -> None:
    data = segment.log_path.read_bytes()
    for interval in (0, 100, 4096, 10_000, 10**9):
        assert build_indexes(data, base_offset=BASE, index_interval_bytes=interval) == (
            kafka_reference_indexes(data, BASE, interval)), interval
    assert segment.rebuild_indexes() == kafka_reference_indexes(data, BASE)


def test_build_indexes_refuses_corrupt_input(segment: Segment) -> None:
    data = bytearray(segment.log_path.read_bytes())
    data[200] ^= 0xFF
    with pytest.raises(CorruptSegmentError):
        build_indexes(bytes(data), base_offset=BASE, path="x.log")


def _batches(first: int, n: int) -> bytes:
    return b"".join(encode_batch([Record(o, 1_000 + o, b"k", b"v" * 50)], base_offset=o)
                    for o in range(first, first + n))


def test_the_log_end_of_a_growing_segment_walks_only_what_was_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader asks for the log end on every fetch: the second time, only the batches
    appended since are read; a file rewritten in place (a truncation, then new appends) is
    scanned afresh and never answered from memory."""
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(_batches(0, 50))
    seg = Segment.from_log_path(path, active=True)
    assert seg.next_offset() == 50
    walked: list[int] = []
    original = LogFile.headers

    def counting(self: LogFile, start: int = 0) -> Any:
        walked.append(start)
        return original(self, start)

    monkeypatch.setattr(LogFile, "headers", counting)
    assert seg.next_offset() == 50 and walked == []  # unchanged: from memory
    with path.open("ab") as f:
        f.write(_batches(50, 3))
    assert seg.next_offset() == 53
    assert walked and min(walked) > 0  # resumed at the remembered batch, not at byte 0
    # truncated by a new leader, then appended to: same file, same length as before or more
    path.write_bytes(_batches(0, 20) + _batches(20, 40))
    assert seg.next_offset() == 60
    path.write_bytes(_batches(0, 10))
    assert seg.next_offset() == 10
