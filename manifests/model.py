"""The manifest data model: segments, archive entries, and the tables that hold them.

Offsets follow Kafka: `base_offset` and `last_offset` are both inclusive (`begin_inclusive`,
`end_inclusive`); an empty partition has `last_offset == -1`. Timestamps are milliseconds since
the epoch, -1 when a batch carries none (Kafka's NO_TIMESTAMP). Sizes are bytes.

Tables are columnar (`array('q')` per field) and immutable by convention: a long archived
history is held as a few flat integer arrays instead of hundreds of thousands of objects, and
rows are materialised as small slots dataclasses only while they are looked at. The head and
archived manifests that use these tables live in `manifests.manifest`.
"""

from __future__ import annotations

import abc
import bisect
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from manifests import keys

#: the JSON format version of topic manifests, leases and node records this code writes and
#: reads, and of archived manifests whose segments all keep Kafka's index files
FORMAT_VERSION = 1
#: the newest archived-manifest format: version 2 adds the `index_layout` column
ARCHIVE_FORMAT_VERSION = 2
#: the newest head-manifest format: version 2 adds `gc_cutoff_ms`, version 3
#: `collectable_below`, version 4 the segment tables' `index_layout` column; a head is
#: written in the oldest version that holds what it carries, byte for byte what older
#: releases wrote for the same content
HEAD_FORMAT_VERSION = 4

#: `SegmentMeta.index_layout`: the segment's indexes are Kafka's own files, one object each
#: (`.index`, `.timeindex`, a `.txnindex` when it has aborted transactions), as every segment
#: before the bundle was written
INDEX_FILES = 0
#: `SegmentMeta.index_layout`: one `.indexes` object holds all of the segment's indexes
#: (`manifests.segment_indexes`)
INDEX_BUNDLE = 1
INDEX_LAYOUTS = (INDEX_FILES, INDEX_BUNDLE)


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    """One uploaded segment object."""

    #: first offset in the segment (inclusive)
    base_offset: int
    #: last offset in the segment (inclusive)
    last_offset: int
    #: timestamp of the first batch, ms (-1: none)
    base_timestamp: int
    #: largest batch max-timestamp in the segment, ms (-1: none)
    max_timestamp: int
    #: size of the segment object, bytes
    size_bytes: int
    #: leader epoch the data was written in (Kafka partition leader epoch)
    segment_term: int
    #: term of the writer that uploaded the object (fencing; part of the default name)
    writer_term: int
    #: CRC-32C (Castagnoli) of the whole object's bytes, unsigned 32-bit
    checksum: int
    #: the object holds a compacted copy of the range (some offsets have no record)
    compacted: bool = False
    #: object name under the partition's data prefix; "" means the default
    #: `keys.segment_name(base_offset, last_offset, writer_term)`
    name: str = ""
    #: how the segment's indexes travel beside it: `INDEX_FILES` or `INDEX_BUNDLE`
    index_layout: int = INDEX_FILES

    @property
    def object_name(self) -> str:
        """The object's name under `keys.partition_data_prefix(...)`."""
        if self.name:
            return self.name
        return keys.segment_name(self.base_offset, self.last_offset, self.writer_term)

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class ReplacedSegment:
    """A segment a merge, a compacted re-upload or retention dropped from the manifest; its
    objects are deleted once the grace period after `replaced_at` has passed (design
    invariant 7)."""

    segment: SegmentMeta
    #: when the manifest dropping it was built, ms since the epoch
    replaced_at: int


@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    """What the head (or an archive index) knows about one archived manifest, enough to pick
    it for an offset or timestamp and to derive its key without listing the bucket."""

    base_offset: int
    last_offset: int
    #: base timestamp of its first segment, ms
    base_timestamp: int
    #: largest max timestamp of its segments, ms
    max_timestamp: int
    #: total size of the segment objects it describes, bytes
    size_bytes: int
    #: number of segments it describes (through any index levels)
    segment_count: int
    #: CRC-32C of the archived manifest object's bytes (verified on every read)
    checksum: int
    #: 0: lists segments; n >= 1: lists level n-1 archives (an index over older history)
    level: int = 0

    @property
    def name(self) -> str:
        return keys.archived_manifest_name(
            self.base_offset,
            self.last_offset,
            self.base_timestamp,
            self.max_timestamp,
            self.level,
            self.checksum,
        )


Row = TypeVar("Row", SegmentMeta, ArchiveEntry)


class _Table(abc.ABC, Generic[Row]):
    """Rows in offset order stored column-wise. Subclasses name their integer columns in
    `FIELDS` (the first four are always base/last offset and base/max timestamp)."""

    FIELDS: ClassVar[tuple[str, ...]]
    __slots__ = ("_cols", "_extra")

    def __init__(self, cols: Sequence[array[int]], extra: list[str] | None = None) -> None:
        rows = len(cols[0]) if cols else 0
        if len(cols) != len(self.FIELDS) or any(len(c) != rows for c in cols):
            raise ValueError(f"{type(self).__name__}: columns of unequal length")
        if extra is not None and len(extra) != rows:
            raise ValueError(f"{type(self).__name__}: text column of the wrong length")
        self._cols: tuple[array[int], ...] = tuple(cols)
        self._extra: list[str] = extra if extra is not None else [""] * rows

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def empty(cls: type[_T]) -> _T:
        return cls([array("q") for _ in cls.FIELDS])

    @classmethod
    def from_rows(cls: type[_T], rows: Iterable[Row]) -> _T:
        cols = [array("q") for _ in cls.FIELDS]
        appenders = [c.append for c in cols]
        extra: list[str] = []
        for row in rows:
            values, text = cls._split(row)
            for append, value in zip(appenders, values, strict=True):
                append(value)
            extra.append(text)
        return cls(cols, extra)

    @staticmethod
    @abc.abstractmethod
    def _split(row: Row) -> tuple[tuple[int, ...], str]:
        """A row as (integer column values in `FIELDS` order, text column value)."""

    @abc.abstractmethod
    def _row(self, i: int) -> Row:
        """Row `i` materialized (no bounds check)."""

    # -- access ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._cols[0])

    def __bool__(self) -> bool:
        return len(self._cols[0]) > 0

    def __getitem__(self, i: int) -> Row:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} of {n}")
        return self._row(i)

    def __iter__(self) -> Iterator[Row]:
        return self.rows()

    def rows(self, start: int = 0) -> Iterator[Row]:
        """Rows from index `start` on, built one at a time."""
        for i in range(start, len(self)):
            yield self._row(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Table) or type(other) is not type(self):
            return NotImplemented
        return self._cols == other._cols and self._extra == other._extra

    def __hash__(self) -> int:
        return hash((len(self), self._cols[0][:1].tobytes(), self._cols[1][-1:].tobytes()))

    def __repr__(self) -> str:
        if not self:
            return f"{type(self).__name__}([])"
        return (
            f"{type(self).__name__}({len(self)} rows, offsets "
            f"{self._cols[0][0]}..{self._cols[1][-1]})"
        )

    def column(self, name: str) -> array[int]:
        """One integer column (do not modify it)."""
        return self._cols[self.FIELDS.index(name)]

    @property
    def extra(self) -> list[str]:
        """The per-row text column (segment object names; unused for archives)."""
        return self._extra

    @property
    def base_offsets(self) -> array[int]:
        return self._cols[0]

    @property
    def last_offsets(self) -> array[int]:
        return self._cols[1]

    def first_base(self) -> int:
        return self._cols[0][0]

    def last_last(self) -> int:
        return self._cols[1][-1]

    # -- derived tables ----------------------------------------------------------------------

    def slice(self: _T, start: int, stop: int | None = None) -> _T:
        return type(self)([c[start:stop] for c in self._cols], self._extra[start:stop])

    def concat(self: _T, other: _T) -> _T:
        return type(self)(
            [a + b for a, b in zip(self._cols, other._cols, strict=True)],
            self._extra + other._extra,
        )

    # -- lookups -----------------------------------------------------------------------------

    def index_from(self, offset: int) -> int:
        """Index of the first row whose last offset is >= `offset` (len(self) if none)."""
        return bisect.bisect_left(self._cols[1], offset)

    def find(self, offset: int) -> int | None:
        """Index of the row whose [base, last] holds `offset`, or None."""
        i = bisect.bisect_left(self._cols[1], offset)
        if i < len(self) and self._cols[0][i] <= offset:
            return i
        return None

    def index_at_or_after_timestamp(self, timestamp: int, start: int = 0) -> int | None:
        """Index of the first row at or after `start` whose max timestamp is >= `timestamp`
        (the row that can hold the first record at or after it), or None. Linear: max
        timestamps need not grow with offsets (CreateTime), so no bisection is exact."""
        max_ts = self._cols[3]
        for i in range(start, len(self)):
            if max_ts[i] >= timestamp:
                return i
        return None

    def total(self, name: str) -> int:
        return sum(self.column(name))

    def memory_bytes(self) -> int:
        """Approximate memory held, bytes (cache weight)."""
        arrays = sum(c.buffer_info()[1] * c.itemsize for c in self._cols)
        return 64 + arrays + 8 * len(self._extra) + sum(len(e) for e in self._extra if e)


_T = TypeVar("_T", bound=_Table)  # type: ignore[type-arg]


class SegmentTable(_Table[SegmentMeta]):
    """Segments of one manifest in offset order (contiguous except in `replaced` lists)."""

    FIELDS = (
        "base_offset",
        "last_offset",
        "base_timestamp",
        "max_timestamp",
        "size_bytes",
        "segment_term",
        "writer_term",
        "checksum",
        "compacted",
        "index_layout",
    )
    __slots__ = ()

    @staticmethod
    def _split(row: SegmentMeta) -> tuple[tuple[int, ...], str]:
        return (
            (
                row.base_offset,
                row.last_offset,
                row.base_timestamp,
                row.max_timestamp,
                row.size_bytes,
                row.segment_term,
                row.writer_term,
                row.checksum,
                1 if row.compacted else 0,
                row.index_layout,
            ),
            row.name,
        )

    def _row(self, i: int) -> SegmentMeta:
        c = self._cols
        return SegmentMeta(
            c[0][i],
            c[1][i],
            c[2][i],
            c[3][i],
            c[4][i],
            c[5][i],
            c[6][i],
            c[7][i],
            bool(c[8][i]),
            self._extra[i],
            c[9][i],
        )

    def object_names(self) -> Iterator[str]:
        """Each row's object name, defaults resolved."""
        c = self._cols
        for i, name in enumerate(self._extra):
            yield name or keys.segment_name(c[0][i], c[1][i], c[6][i])


class ArchiveTable(_Table[ArchiveEntry]):
    """Archived manifests in offset order, contiguous."""

    FIELDS = (
        "base_offset",
        "last_offset",
        "base_timestamp",
        "max_timestamp",
        "size_bytes",
        "segment_count",
        "checksum",
        "level",
    )
    __slots__ = ()

    @staticmethod
    def _split(row: ArchiveEntry) -> tuple[tuple[int, ...], str]:
        return (
            (
                row.base_offset,
                row.last_offset,
                row.base_timestamp,
                row.max_timestamp,
                row.size_bytes,
                row.segment_count,
                row.checksum,
                row.level,
            ),
            "",
        )

    def _row(self, i: int) -> ArchiveEntry:
        c = self._cols
        return ArchiveEntry(c[0][i], c[1][i], c[2][i], c[3][i], c[4][i], c[5][i], c[6][i], c[7][i])


def contiguity_problem(table: _Table, what: str) -> str | None:  # type: ignore[type-arg]
    """Why the rows of `table` are not contiguous and well-formed, or None."""
    base, last = table.base_offsets, table.last_offsets
    ts0, ts1 = table.column("base_timestamp"), table.column("max_timestamp")
    for i in range(len(table)):
        if base[i] < 0 or last[i] < base[i]:
            return f"{what} {i}: offsets {base[i]}..{last[i]} are not a valid range"
        if i and base[i] != last[i - 1] + 1:
            kind = "gap" if base[i] > last[i - 1] + 1 else "overlap"
            return (
                f"{what} {i}: {kind}: starts at {base[i]} but the previous one ends at "
                f"{last[i - 1]}"
            )
        if ts1[i] < ts0[i] or ts0[i] < -1:
            return f"{what} {i}: timestamps {ts0[i]}..{ts1[i]} are not a valid range"
    return None
