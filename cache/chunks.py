"""Chunk layout of a remote segment: where each cached chunk begins and which chunks a byte range
needs.

Chunks start on record-batch boundaries (positions taken from the segment's offset index), so every
chunk holds whole batches and can be CRC-checked on its own before it is served. A chunk is about
`cloud_storage_cache_chunk_size` bytes: it grows batch by batch while it stays within the size and
is never empty, so one batch larger than the chunk size makes a chunk of its own. Pure functions:
no I/O, positions in bytes from the start of the segment object.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from tiered.errors import CorruptSegmentError
from tiered.kafka.records import Buffer, iter_batch_headers, whole_batches_end

__all__ = [
    "batch_positions",
    "chunk_bounds",
    "chunks_for_range",
    "plan_chunks",
    "verify_batches",
    "whole_batches",
]


def plan_chunks(batch_positions: Sequence[int], segment_size: int, chunk_size: int) -> list[int]:
    """Chunk start positions (bytes, ascending, the first always 0) for a segment of
    `segment_size` bytes whose known batch boundaries are `batch_positions`.

    Each chunk ends where the next starts (the last at `segment_size`). A chunk takes the furthest
    known boundary no more than `chunk_size` bytes past its start; when the next boundary is
    further than that (one huge batch, or a sparse index) the chunk ends at that next boundary
    anyway. Position 0 is implied; positions need not be dense (an index is sparse), only
    strictly increasing and inside the segment, else CorruptSegmentError (they come from an
    index file, so a bad one is corrupt input). An empty segment has no chunks."""
    if chunk_size <= 0:
        raise ValueError(f"chunk size must be a positive number of bytes, got {chunk_size}")
    if segment_size < 0:
        raise ValueError(f"segment size must not be negative, got {segment_size}")
    if segment_size == 0:
        return []
    boundaries = [0]
    for position in batch_positions:
        if position < 0 or position >= segment_size:
            raise CorruptSegmentError(
                f"batch position {position} is outside the {segment_size}-byte segment"
            )
        if position < boundaries[-1]:
            raise CorruptSegmentError(
                f"batch positions are not increasing: {position} after {boundaries[-1]}"
            )
        if position > boundaries[-1]:
            boundaries.append(position)
    boundaries.append(segment_size)
    starts = [0]
    i = 0  # index in `boundaries` of the current chunk start
    while True:
        limit = boundaries[i] + chunk_size
        # the furthest boundary within the limit, but at least one step forward
        j = max(bisect_right(boundaries, limit) - 1, i + 1)
        if j >= len(boundaries) - 1:
            return starts
        starts.append(boundaries[j])
        i = j


def chunks_for_range(starts: Sequence[int], begin: int, end: int) -> range:
    """Indices into `starts` of the chunks covering bytes [begin, end) (empty for an empty
    range). `starts` is a plan from `plan_chunks`; `begin` must not be negative."""
    if begin < 0 or end < begin:
        raise ValueError(f"bad byte range [{begin}, {end})")
    if begin == end or not starts:
        return range(0)
    first = max(bisect_right(starts, begin) - 1, 0)
    last = bisect_left(starts, end)  # exclusive: the first chunk starting at or after `end`
    return range(first, last)


def chunk_bounds(starts: Sequence[int], index: int, segment_size: int) -> tuple[int, int]:
    """[begin_inclusive, end_exclusive) of chunk `index` of a `segment_size`-byte segment."""
    if not 0 <= index < len(starts):
        raise ValueError(f"chunk {index} is outside the segment's {len(starts)} chunks")
    end = starts[index + 1] if index + 1 < len(starts) else segment_size
    return starts[index], end


def verify_batches(data: Buffer, position: int, *, path: str | None = None) -> None:
    """Check that `data`, the bytes of a segment from byte `position`, is a run of whole record
    batches with good CRCs: the `verify` a reader hands to `ChunkCache.open_segment`. Raises
    CorruptSegmentError anchored at the segment position of the bad batch."""
    try:
        for _ in iter_batch_headers(data, path=path):
            pass
    except CorruptSegmentError as err:
        raise err.at(path=path, base_position=position) from err


def whole_batches(data: Buffer) -> int:
    """Bytes of `data` (segment bytes arriving in pieces, from a batch boundary) that are
    whole batches; the rest is the start of a batch still coming. Reads headers only (no CRC);
    CorruptSegmentError when a header cannot start a batch. Called on every piece a stream
    receives, before the run is checked whole: a lean walk (`whole_batches_end`)."""
    return whole_batches_end(data)


def batch_positions(data: bytes) -> list[int]:
    """Start position of every batch in segment bytes `data` (CRC-checked): the dense
    alternative to the offset index's sparse positions, for tools and tests."""
    return [header.position for header in iter_batch_headers(data)]
