"""Kafka's sparse segment indexes: `.index` (offset -> file position) and `.timeindex`
(timestamp -> offset), and the rule Kafka uses to fill them.

Both files are flat arrays of fixed-size big-endian entries, offsets stored relative to the
segment's base offset (the number in the file name):

    .index entry     => RelativeOffset Int32, Position Int32      (8 bytes)
    .timeindex entry => Timestamp Int64, RelativeOffset Int32     (12 bytes)

An offset-index entry (O, P) says "the batch at byte P of the .log ends at offset O"; a
time-index entry (T, O) says "the largest timestamp in the segment up to offset O is T", so any
record with a timestamp above T sits after O. Both are sparse: one entry per
`log.index.interval.bytes` (4096) of log, which is why every lookup here returns a lower bound
to scan forward from, never the answer itself.

Kafka preallocates the files of the *active* segment to `log.index.size.max.bytes` (10 MiB) of
zeros and trims them when the segment rolls; readers of a live log dir pass `preallocated=True`
so the zero tail ends the entries, exactly as `kafka-dump-log.sh` stops at the first entry
(after the first) whose relative offset is 0. Index files are bounded by that size, so they are
read whole; the `.log` beside them is not (see `tiered.kafka.segment`).
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from tiered.errors import CorruptSegmentError

OFFSET_INDEX_ENTRY = struct.Struct(
    ">"
    "i"  # relativeOffset: batch's last offset minus the segment's base offset
    "i"  # position: byte position of the batch in the .log
)
TIME_INDEX_ENTRY = struct.Struct(
    ">"
    "q"  # timestamp: largest timestamp seen up to the offset, ms since the epoch
    "i"  # relativeOffset: offset of the batch holding it, minus the base offset
)
#: `log.index.interval.bytes`: log bytes between two index entries
DEFAULT_INDEX_INTERVAL_BYTES = 4096
#: `log.index.size.max.bytes`: size Kafka preallocates each index file of an active segment to
DEFAULT_INDEX_SIZE_MAX_BYTES = 10 * 1024 * 1024
#: Kafka's RecordBatch.NO_TIMESTAMP
NO_TIMESTAMP = -1
#: relative offsets and positions are Java ints
INT32_MAX = (1 << 31) - 1


class IndexEntry(NamedTuple):
    """An offset-index entry with the offset made absolute."""

    offset: int
    position: int


class TimeIndexEntry(NamedTuple):
    """A time-index entry with the offset made absolute."""

    timestamp: int
    offset: int


def _check_relative(offset: int, base_offset: int, what: str) -> int:
    relative = offset - base_offset
    if not 0 <= relative <= INT32_MAX:
        raise ValueError(
            f"{what} offset {offset} does not fit a relative offset from base {base_offset}"
        )
    return relative


def _entry_count(size: int, entry_size: int, path: str | None) -> int:
    if size % entry_size:
        raise CorruptSegmentError(
            f"index size {size} is not a multiple of the {entry_size}-byte entry",
            path=path,
            position=size - size % entry_size,
        )
    return size // entry_size


class OffsetIndex:
    """An immutable `.index`: offsets strictly increasing, positions strictly increasing."""

    __slots__ = ("base_offset", "path", "_relative", "_positions")

    def __init__(
        self, base_offset: int, entries: Iterable[IndexEntry] = (), *, path: str | None = None
    ) -> None:
        self.base_offset = base_offset
        self.path = path
        self._relative = array("q")
        self._positions = array("q")
        for offset, position in entries:
            self._add(_check_relative(offset, base_offset, "index"), position)

    def _add(self, relative: int, position: int, at: int | None = None) -> None:
        """Append one entry after checking it against the last; `at` is the entry's byte
        position in the file, for the error."""
        def bad(reason: str) -> CorruptSegmentError:
            return CorruptSegmentError(reason, path=self.path, position=at)

        if relative < 0:
            raise bad(f"negative relative offset {relative}")
        if not 0 <= position <= INT32_MAX:
            raise bad(f"position {position} is outside 0..{INT32_MAX}")
        if self._relative:
            if relative <= self._relative[-1]:
                raise bad(
                    f"offset {self.base_offset + relative} is not above the previous entry's "
                    f"{self.base_offset + self._relative[-1]}"
                )
            if position <= self._positions[-1]:
                raise bad(
                    f"position {position} is not above the previous entry's "
                    f"{self._positions[-1]}"
                )
        self._relative.append(relative)
        self._positions.append(position)

    @classmethod
    def from_bytes(
        cls, data: bytes | memoryview, *, base_offset: int, path: str | None = None,
        preallocated: bool = False,
    ) -> OffsetIndex:
        """Parse a `.index`. With `preallocated` (an active segment's file), the first entry
        after slot 0 with relative offset 0 ends the entries, and an all-zero slot 0 means
        empty: a real (0, 0) entry says no more than the default lookup answer anyway."""
        _entry_count(len(data), OFFSET_INDEX_ENTRY.size, path)
        index = cls(base_offset, path=path)
        for slot, (relative, position) in enumerate(OFFSET_INDEX_ENTRY.iter_unpack(data)):
            if preallocated and relative == 0 and (slot > 0 or position == 0):
                break
            index._add(relative, position, at=slot * OFFSET_INDEX_ENTRY.size)
        return index

    @classmethod
    def read(
        cls, path: str | os.PathLike[str], *, base_offset: int | None = None,
        preallocated: bool = False,
    ) -> OffsetIndex:
        """Read a `.index` file; `base_offset` defaults to the one in its 20-digit name."""
        path = Path(path)
        base = base_offset if base_offset is not None else _base_offset_from_name(path)
        return cls.from_bytes(
            path.read_bytes(), base_offset=base, path=str(path), preallocated=preallocated
        )

    def to_bytes(self) -> bytes:
        pack = OFFSET_INDEX_ENTRY.pack
        return b"".join(pack(r, p) for r, p in zip(self._relative, self._positions, strict=True))

    def __len__(self) -> int:
        return len(self._relative)

    def __getitem__(self, slot: int) -> IndexEntry:
        return IndexEntry(self.base_offset + self._relative[slot], self._positions[slot])

    def __iter__(self) -> Iterator[IndexEntry]:
        for relative, position in zip(self._relative, self._positions, strict=True):
            yield IndexEntry(self.base_offset + relative, position)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OffsetIndex):
            return NotImplemented
        return (self.base_offset, self._relative, self._positions) == (
            other.base_offset, other._relative, other._positions,
        )

    def __repr__(self) -> str:
        return f"OffsetIndex(base_offset={self.base_offset}, entries={len(self)})"

    @property
    def last_entry(self) -> IndexEntry | None:
        return self[-1] if self._relative else None

    def lookup(self, offset: int, *, max_position: int | None = None) -> IndexEntry:
        """The entry with the largest offset <= `offset` (binary search): the position to scan
        the `.log` from. Below the first entry it is (base offset, 0), as in Kafka.

        `max_position` ignores entries at or past that byte: a live segment's index may already
        point past the end of a snapshot of its `.log` taken a moment earlier."""
        slot = bisect.bisect_right(self._relative, offset - self.base_offset)
        if max_position is not None:
            slot = min(slot, bisect.bisect_left(self._positions, max_position))
        return self[slot - 1] if slot > 0 else IndexEntry(self.base_offset, 0)


class TimeIndex:
    """An immutable `.timeindex`: timestamps and offsets never decrease."""

    __slots__ = ("base_offset", "path", "_timestamps", "_relative")

    def __init__(
        self, base_offset: int, entries: Iterable[TimeIndexEntry] = (), *,
        path: str | None = None,
    ) -> None:
        self.base_offset = base_offset
        self.path = path
        self._timestamps = array("q")
        self._relative = array("q")
        for timestamp, offset in entries:
            self._add(timestamp, _check_relative(offset, base_offset, "time index"))

    def _add(self, timestamp: int, relative: int, at: int | None = None) -> None:
        def bad(reason: str) -> CorruptSegmentError:
            return CorruptSegmentError(reason, path=self.path, position=at)

        if relative < 0:
            raise bad(f"negative relative offset {relative}")
        if self._relative:
            if timestamp < self._timestamps[-1]:
                raise bad(
                    f"timestamp {timestamp} is below the previous entry's "
                    f"{self._timestamps[-1]}"
                )
            if relative < self._relative[-1]:
                raise bad(
                    f"offset {self.base_offset + relative} is below the previous entry's "
                    f"{self.base_offset + self._relative[-1]}"
                )
        self._timestamps.append(timestamp)
        self._relative.append(relative)

    @classmethod
    def from_bytes(
        cls, data: bytes | memoryview, *, base_offset: int, path: str | None = None,
        preallocated: bool = False,
    ) -> TimeIndex:
        """Parse a `.timeindex`; `preallocated` as for `OffsetIndex.from_bytes` (an all-zero
        slot 0 would claim timestamp 0, i.e. 1970: never a real entry)."""
        _entry_count(len(data), TIME_INDEX_ENTRY.size, path)
        index = cls(base_offset, path=path)
        for slot, (timestamp, relative) in enumerate(TIME_INDEX_ENTRY.iter_unpack(data)):
            if preallocated and relative == 0 and (slot > 0 or timestamp == 0):
                break
            index._add(timestamp, relative, at=slot * TIME_INDEX_ENTRY.size)
        return index

    @classmethod
    def read(
        cls, path: str | os.PathLike[str], *, base_offset: int | None = None,
        preallocated: bool = False,
    ) -> TimeIndex:
        """Read a `.timeindex` file; `base_offset` defaults to the one in its name."""
        path = Path(path)
        base = base_offset if base_offset is not None else _base_offset_from_name(path)
        return cls.from_bytes(
            path.read_bytes(), base_offset=base, path=str(path), preallocated=preallocated
        )

    def to_bytes(self) -> bytes:
        pack = TIME_INDEX_ENTRY.pack
        return b"".join(pack(t, r) for t, r in zip(self._timestamps, self._relative, strict=True))

    def __len__(self) -> int:
        return len(self._relative)

    def __getitem__(self, slot: int) -> TimeIndexEntry:
        return TimeIndexEntry(self._timestamps[slot], self.base_offset + self._relative[slot])

    def __iter__(self) -> Iterator[TimeIndexEntry]:
        for timestamp, relative in zip(self._timestamps, self._relative, strict=True):
            yield TimeIndexEntry(timestamp, self.base_offset + relative)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimeIndex):
            return NotImplemented
        return (self.base_offset, self._timestamps, self._relative) == (
            other.base_offset, other._timestamps, other._relative,
        )

    def __repr__(self) -> str:
        return f"TimeIndex(base_offset={self.base_offset}, entries={len(self)})"

    @property
    def last_entry(self) -> TimeIndexEntry | None:
        return self[-1] if self._relative else None

    def lookup(self, timestamp: int) -> TimeIndexEntry:
        """The entry with the largest timestamp <= `timestamp`: records at or after
        `timestamp` can only sit after its offset. Below the first entry it is
        (NO_TIMESTAMP, base offset), as in Kafka's TimeIndex.lookup."""
        slot = bisect.bisect_right(self._timestamps, timestamp) - 1
        return self[slot] if slot >= 0 else TimeIndexEntry(NO_TIMESTAMP, self.base_offset)

    def first_at_or_after(self, timestamp: int) -> TimeIndexEntry | None:
        """The first entry whose timestamp is >= `timestamp`, None if every entry is older: an
        upper bound for the offset of the first record at or after `timestamp` (useful to
        decide, without reading the log, that a segment holds such records at all)."""
        slot = bisect.bisect_left(self._timestamps, timestamp)
        return self[slot] if slot < len(self) else None


def _base_offset_from_name(path: Path) -> int:
    stem = path.name.split(".", 1)[0]
    if len(stem) != 20 or not stem.isdigit():
        raise CorruptSegmentError(
            "file name is not a 20-digit base offset; pass base_offset", path=str(path)
        )
    return int(stem)


class IndexBuilder:
    """Kafka's rule for filling a segment's indexes as batches are appended (LogSegment.append
    and LogSegment.recover, one batch at a time) and closed (onBecomeInactiveSegment).

    - before each batch, the largest batch max timestamp so far (and that batch's last offset)
      is updated when the batch's max timestamp is strictly larger;
    - when more than `index_interval_bytes` of log lie between the last entry's position (0 at
      first) and this batch, the offset index gets (batch last offset, batch position) and the
      time index gets (max timestamp so far, its offset) if that timestamp is strictly above
      the last time entry's (initially NO_TIMESTAMP, so -1 timestamps never enter);
    - on close the time index gets the same candidate entry once more, so a closed segment's
      last time entry is always its max timestamp.

    `max_entries` (from `log.index.size.max.bytes`) makes `is_full` report when Kafka would roll
    because an index is full; None means unbounded (rebuilding an existing log).
    """

    def __init__(
        self,
        base_offset: int,
        *,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        index_size_max_bytes: int | None = None,
        path: str | None = None,
    ) -> None:
        if index_interval_bytes < 0:
            raise ValueError(f"index_interval_bytes must be >= 0, not {index_interval_bytes}")
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.path = path
        self._max_offset_entries = (
            None if index_size_max_bytes is None
            else index_size_max_bytes // OFFSET_INDEX_ENTRY.size
        )
        self._max_time_entries = (
            None if index_size_max_bytes is None
            else index_size_max_bytes // TIME_INDEX_ENTRY.size
        )
        self.offset_entries: list[IndexEntry] = []
        self.time_entries: list[TimeIndexEntry] = []
        self.max_timestamp_so_far = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self._bytes_since_last_entry = 0
        self._last_offset: int | None = None

    def add(
        self, *, position: int, size: int, last_offset: int, max_timestamp: int
    ) -> tuple[IndexEntry | None, TimeIndexEntry | None]:
        """Account for one batch of `size` bytes at byte `position`; returns the entries it
        added (None where it added none), so a writer can append them to its files."""
        if not 0 <= last_offset - self.base_offset <= INT32_MAX:
            raise CorruptSegmentError(
                f"batch last offset {last_offset} does not fit a relative offset from the "
                f"segment base {self.base_offset}",
                path=self.path,
                position=position,
            )
        if self._last_offset is not None and last_offset <= self._last_offset:
            raise CorruptSegmentError(
                f"batch last offset {last_offset} is not above the previous batch's "
                f"{self._last_offset}",
                path=self.path,
                position=position,
            )
        self._last_offset = last_offset
        if max_timestamp > self.max_timestamp_so_far:
            self.max_timestamp_so_far = max_timestamp
            self.offset_of_max_timestamp = last_offset
        offset_entry = time_entry = None
        if self._bytes_since_last_entry > self.index_interval_bytes:
            if not 0 <= position <= INT32_MAX:
                raise CorruptSegmentError(
                    f"position {position} does not fit an index entry",
                    path=self.path,
                    position=position,
                )
            offset_entry = IndexEntry(last_offset, position)
            self.offset_entries.append(offset_entry)
            time_entry = self._maybe_append_time()
            self._bytes_since_last_entry = 0
        self._bytes_since_last_entry += size
        return offset_entry, time_entry

    def close(self) -> TimeIndexEntry | None:
        """The time entry Kafka appends when a segment rolls or closes (None if redundant)."""
        return self._maybe_append_time()

    def _maybe_append_time(self) -> TimeIndexEntry | None:
        last_ts = self.time_entries[-1].timestamp if self.time_entries else NO_TIMESTAMP
        if self.max_timestamp_so_far > last_ts:
            entry = TimeIndexEntry(self.max_timestamp_so_far, self.offset_of_max_timestamp)
            self.time_entries.append(entry)
            return entry
        return None

    @property
    def is_full(self) -> bool:
        """Whether Kafka would roll before the next append because an index is full (the
        time index keeps its last slot for the entry `close` adds)."""
        if self._max_offset_entries is None or self._max_time_entries is None:
            return False
        return (
            len(self.offset_entries) >= self._max_offset_entries
            or len(self.time_entries) >= self._max_time_entries - 1
        )

    def offset_index(self) -> OffsetIndex:
        return OffsetIndex(self.base_offset, self.offset_entries, path=self.path)

    def time_index(self) -> TimeIndex:
        return TimeIndex(self.base_offset, self.time_entries, path=self.path)


def encode_offset_entry(entry: IndexEntry, base_offset: int) -> bytes:
    """One `.index` entry's bytes, for appending to a live file."""
    return OFFSET_INDEX_ENTRY.pack(_check_relative(entry.offset, base_offset, "index"),
                                   entry.position)


def encode_time_entry(entry: TimeIndexEntry, base_offset: int) -> bytes:
    """One `.timeindex` entry's bytes, for appending to a live file."""
    return TIME_INDEX_ENTRY.pack(entry.timestamp,
                                 _check_relative(entry.offset, base_offset, "time index"))
