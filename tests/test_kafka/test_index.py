"""`.index` / `.timeindex`: byte layout, lookups, validation of malformed files, and the
IndexBuilder's copy of Kafka's sparse-entry rule."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tiered.errors import CorruptSegmentError
from tiered.kafka.index import (
    NO_TIMESTAMP,
    IndexBuilder,
    IndexEntry,
    OffsetIndex,
    TimeIndex,
    TimeIndexEntry,
)

BASE = 5_242_880


def test_offset_index_bytes_are_big_endian_relative_pairs() -> None:
    index = OffsetIndex(BASE, [IndexEntry(BASE + 100, 15240), IndexEntry(BASE + 200, 30480)])
    assert index.to_bytes() == struct.pack(">ii", 100, 15240) + struct.pack(">ii", 200, 30480)


def test_time_index_bytes_are_timestamp_then_relative_offset() -> None:
    index = TimeIndex(BASE, [TimeIndexEntry(1699000000000, BASE), TimeIndexEntry(1699000060000,
                                                                                  BASE + 500)])
    assert index.to_bytes() == (struct.pack(">qi", 1699000000000, 0)
                                + struct.pack(">qi", 1699000060000, 500))


def test_offset_index_file_round_trip_takes_base_offset_from_name(tmp_path: Path) -> None:
    entries = [IndexEntry(BASE + o, p) for o, p in [(3, 4200), (9, 8400), (20, 12700)]]
    path = tmp_path / f"{BASE:020d}.index"
    path.write_bytes(OffsetIndex(BASE, entries).to_bytes())
    read = OffsetIndex.read(path)
    assert read.base_offset == BASE
    assert list(read) == entries
    assert read == OffsetIndex(BASE, entries)
    assert read.last_entry == entries[-1]


def test_time_index_file_round_trip(tmp_path: Path) -> None:
    entries = [TimeIndexEntry(1000, BASE + 4), TimeIndexEntry(1500, BASE + 9),
               TimeIndexEntry(1500, BASE + 9), TimeIndexEntry(2200, BASE + 30)]
    path = tmp_path / f"{BASE:020d}.timeindex"
    path.write_bytes(TimeIndex(BASE, entries).to_bytes())
    assert list(TimeIndex.read(path)) == entries


def test_offset_lookup_returns_largest_entry_at_or_below_target() -> None:
    index = OffsetIndex(0, [IndexEntry(100, 15240), IndexEntry(200, 30480), IndexEntry(300, 45720)])
    assert index.lookup(150) == IndexEntry(100, 15240)  # the documentation's example
    assert index.lookup(200) == IndexEntry(200, 30480)
    assert index.lookup(10**12) == IndexEntry(300, 45720)
    # below the first entry: scan from the start of the segment, as Kafka does
    assert index.lookup(99) == IndexEntry(0, 0)
    assert OffsetIndex(7).lookup(50) == IndexEntry(7, 0)


def test_offset_lookup_ignores_entries_past_max_position() -> None:
    index = OffsetIndex(0, [IndexEntry(100, 15240), IndexEntry(200, 30480)])
    assert index.lookup(250, max_position=30480) == IndexEntry(100, 15240)
    assert index.lookup(250, max_position=30481) == IndexEntry(200, 30480)
    assert index.lookup(250, max_position=100) == IndexEntry(0, 0)


def test_time_lookup_returns_largest_timestamp_at_or_below_target() -> None:
    index = TimeIndex(BASE, [TimeIndexEntry(1000, BASE + 4), TimeIndexEntry(2000, BASE + 9),
                             TimeIndexEntry(3000, BASE + 15)])
    assert index.lookup(999) == TimeIndexEntry(NO_TIMESTAMP, BASE)
    assert index.lookup(1000) == TimeIndexEntry(1000, BASE + 4)
    assert index.lookup(2500) == TimeIndexEntry(2000, BASE + 9)
    assert index.lookup(9999) == TimeIndexEntry(3000, BASE + 15)


def test_time_first_at_or_after() -> None:
    index = TimeIndex(0, [TimeIndexEntry(1000, 4), TimeIndexEntry(2000, 9)])
    assert index.first_at_or_after(0) == TimeIndexEntry(1000, 4)
    assert index.first_at_or_after(1000) == TimeIndexEntry(1000, 4)
    assert index.first_at_or_after(1001) == TimeIndexEntry(2000, 9)
    assert index.first_at_or_after(2001) is None


def test_size_not_a_multiple_of_the_entry_is_corrupt() -> None:
    data = struct.pack(">ii", 1, 4100) + b"\x00\x00\x00"
    with pytest.raises(CorruptSegmentError) as err:
        OffsetIndex.from_bytes(data, base_offset=0, path="x.index")
    assert err.value.path == "x.index"
    assert err.value.position == 8
    assert "multiple" in str(err.value)
    with pytest.raises(CorruptSegmentError, match="multiple"):
        TimeIndex.from_bytes(b"\x00" * 13, base_offset=0)


@pytest.mark.parametrize("second", [(5, 9000), (3, 9000)], ids=["equal", "decreasing"])
def test_offsets_that_do_not_increase_are_corrupt(second: tuple[int, int]) -> None:
    data = struct.pack(">ii", 5, 4100) + struct.pack(">ii", *second)
    with pytest.raises(CorruptSegmentError) as err:
        OffsetIndex.from_bytes(data, base_offset=0, path="s.index")
    assert err.value.position == 8  # the second entry
    assert "s.index" in str(err.value) and "byte 8" in str(err.value)


def test_positions_that_go_back_are_corrupt() -> None:
    data = struct.pack(">ii", 5, 9000) + struct.pack(">ii", 9, 4100)
    with pytest.raises(CorruptSegmentError, match="position"):
        OffsetIndex.from_bytes(data, base_offset=0)


def test_negative_relative_offset_is_corrupt() -> None:
    data = struct.pack(">ii", 5, 4100) + b"\xff\xff\xff\xff" + struct.pack(">i", 9000)
    with pytest.raises(CorruptSegmentError, match="negative relative offset") as err:
        OffsetIndex.from_bytes(data, base_offset=0)
    assert err.value.position == 8
    with pytest.raises(CorruptSegmentError, match="negative relative offset"):
        TimeIndex.from_bytes(struct.pack(">qi", 10, -1), base_offset=0)


def test_time_index_going_back_is_corrupt() -> None:
    backwards_ts = struct.pack(">qi", 2000, 4) + struct.pack(">qi", 1999, 9)
    with pytest.raises(CorruptSegmentError, match="timestamp") as err:
        TimeIndex.from_bytes(backwards_ts, base_offset=0)
    assert err.value.position == 12
    backwards_offset = struct.pack(">qi", 2000, 9) + struct.pack(">qi", 2001, 4)
    with pytest.raises(CorruptSegmentError, match="offset"):
        TimeIndex.from_bytes(backwards_offset, base_offset=0)


def test_entries_outside_int32_relative_range_are_refused_when_building() -> None:
    with pytest.raises(ValueError):
        OffsetIndex(BASE, [IndexEntry(BASE + 2**31, 10)])
    with pytest.raises(ValueError):
        OffsetIndex(BASE, [IndexEntry(BASE - 1, 10)])
    with pytest.raises(ValueError):
        TimeIndex(BASE, [TimeIndexEntry(10, BASE + 2**31)])


def test_preallocated_index_ends_at_the_zero_tail() -> None:
    entries = struct.pack(">ii", 5, 4100) + struct.pack(">ii", 9, 8300)
    data = entries + b"\x00" * 8 * 1000
    index = OffsetIndex.from_bytes(data, base_offset=BASE, preallocated=True)
    assert list(index) == [IndexEntry(BASE + 5, 4100), IndexEntry(BASE + 9, 8300)]
    # the same bytes read as a closed segment's trimmed index are corrupt: zeros go back
    with pytest.raises(CorruptSegmentError):
        OffsetIndex.from_bytes(data, base_offset=BASE)


def test_preallocated_index_with_no_entries_is_empty() -> None:
    assert len(OffsetIndex.from_bytes(b"\x00" * 800, base_offset=0, preallocated=True)) == 0
    assert len(TimeIndex.from_bytes(b"\x00" * 1200, base_offset=0, preallocated=True)) == 0
    times = struct.pack(">qi", 1000, 4) + b"\x00" * 120
    assert list(TimeIndex.from_bytes(times, base_offset=0, preallocated=True)) == [
        TimeIndexEntry(1000, 4)
    ]


def test_builder_adds_an_entry_only_after_more_than_interval_bytes() -> None:
    builder = IndexBuilder(0, index_interval_bytes=4096)
    # 1024-byte batches: the one at byte 4096 has exactly the interval behind it, which is
    # not *more*, so the first entry goes to the next one, at 5120 (Kafka's strict `>`)
    for i in range(12):
        builder.add(position=i * 1024, size=1024, last_offset=i, max_timestamp=1000 + i)
    assert builder.offset_entries == [IndexEntry(5, 5120), IndexEntry(10, 10240)]
    assert builder.time_entries == [TimeIndexEntry(1005, 5), TimeIndexEntry(1010, 10)]
    assert builder.close() == TimeIndexEntry(1011, 11)
    assert builder.close() is None  # idempotent, as Kafka's maybeAppend of the same entry


def test_builder_time_entries_follow_the_largest_timestamp_so_far() -> None:
    builder = IndexBuilder(100, index_interval_bytes=0)
    timestamps = [5000, 9000, 7000, 8000, 9500, 100]
    for i, ts in enumerate(timestamps):
        builder.add(position=i * 100, size=100, last_offset=100 + 2 * i + 1, max_timestamp=ts)
    # an entry is due before every batch after the first; the time entry names the batch
    # holding the max so far and is only added when that max grows
    assert [e.offset for e in builder.offset_entries] == [103, 105, 107, 109, 111]
    assert builder.time_entries == [TimeIndexEntry(9000, 103), TimeIndexEntry(9500, 109)]
    assert builder.close() is None
    assert builder.max_timestamp_so_far == 9500


def test_builder_never_indexes_missing_timestamps() -> None:
    builder = IndexBuilder(0, index_interval_bytes=0)
    for i in range(3):
        builder.add(position=i * 100, size=100, last_offset=i, max_timestamp=NO_TIMESTAMP)
    assert builder.close() is None
    assert builder.time_entries == []
    assert len(builder.offset_entries) == 2


def test_builder_refuses_offsets_that_overflow_or_go_back() -> None:
    builder = IndexBuilder(0, path="s.log")
    builder.add(position=0, size=100, last_offset=10, max_timestamp=1)
    with pytest.raises(CorruptSegmentError, match="not above") as err:
        builder.add(position=100, size=100, last_offset=10, max_timestamp=1)
    assert err.value.position == 100 and err.value.path == "s.log"
    with pytest.raises(CorruptSegmentError, match="relative offset"):
        builder.add(position=200, size=100, last_offset=2**31, max_timestamp=1)


def test_builder_reports_full_indexes() -> None:
    # 24 bytes: 3 offset entries, 2 time entries of which Kafka keeps the last for the roll
    builder = IndexBuilder(0, index_interval_bytes=0, index_size_max_bytes=24)
    builder.add(position=0, size=10, last_offset=0, max_timestamp=1)
    assert not builder.is_full
    builder.add(position=10, size=10, last_offset=1, max_timestamp=2)
    assert len(builder.time_entries) == 1
    assert builder.is_full
    unbounded = IndexBuilder(0, index_interval_bytes=0)
    for i in range(50):
        unbounded.add(position=i * 10, size=10, last_offset=i, max_timestamp=i)
    assert not unbounded.is_full
