"""Chunk layout: boundaries on batch boundaries, about chunk_size each, and the chunks a byte range
needs; a fetch's walk of a chunk's batches, and the damage it stops at."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache.chunks import (
    batch_positions,
    chunk_bounds,
    chunks_for_range,
    plan_chunks,
    verify_batches,
)
from cache.segment_reads import ChunkFiles
from tiered.errors import CorruptSegmentError
from tiered.kafka.builder import encode_batch, make_records
from tiered.kafka.records import iter_batch_headers


def test_chunks_take_the_furthest_boundary_within_the_size() -> None:
    assert plan_chunks([0, 10, 20, 30, 40], 50, 25) == [0, 20, 40]


def test_a_batch_larger_than_the_chunk_size_is_a_chunk_of_its_own() -> None:
    assert plan_chunks([0, 5, 100, 105], 110, 10) == [0, 5, 100]


def test_a_sparse_index_still_cuts_at_known_boundaries() -> None:
    # no boundary between 0 and 400: one chunk holds it all, oversized
    assert plan_chunks([400, 450], 500, 100) == [0, 400]


def test_empty_segment_has_no_chunks_and_a_small_one_has_one() -> None:
    assert plan_chunks([], 0, 16) == []
    assert plan_chunks([0], 10, 16) == [0]
    assert plan_chunks([], 10, 16) == [0]


@pytest.mark.parametrize("positions", [[5, 3], [0, 200]])
def test_bad_index_positions_are_corrupt_input(positions: list[int]) -> None:
    with pytest.raises(CorruptSegmentError):
        plan_chunks(positions, 100, 10)


def test_nonpositive_chunk_size_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk size"):
        plan_chunks([0], 10, 0)


@given(
    gaps=st.lists(st.integers(1, 300), min_size=0, max_size=60),
    tail=st.integers(1, 300),
    chunk_size=st.integers(1, 1000),
)
def test_plan_properties(gaps: list[int], tail: int, chunk_size: int) -> None:
    positions = [0]
    for gap in gaps:
        positions.append(positions[-1] + gap)
    size = positions[-1] + tail
    starts = plan_chunks(positions, size, chunk_size)
    assert starts[0] == 0
    assert set(starts) <= set(positions)
    ends = [*starts[1:], size]
    for begin, end in zip(starts, ends, strict=True):
        assert end > begin
        # over the size only when no boundary lies inside: a single indivisible span
        if end - begin > chunk_size:
            inner = [p for p in positions if begin < p < end]
            assert inner == [] or min(inner) - begin > chunk_size


def test_chunks_for_range() -> None:
    starts = [0, 20, 40]
    assert list(chunks_for_range(starts, 0, 1)) == [0]
    assert list(chunks_for_range(starts, 19, 21)) == [0, 1]
    assert list(chunks_for_range(starts, 20, 40)) == [1]
    assert list(chunks_for_range(starts, 45, 50)) == [2]
    assert list(chunks_for_range(starts, 0, 50)) == [0, 1, 2]
    assert list(chunks_for_range(starts, 30, 30)) == []
    with pytest.raises(ValueError):
        chunks_for_range(starts, 5, 4)


def test_chunk_bounds() -> None:
    assert chunk_bounds([0, 20, 40], 1, 50) == (20, 40)
    assert chunk_bounds([0, 20, 40], 2, 50) == (40, 50)
    with pytest.raises(ValueError):
        chunk_bounds([0, 20], 2, 50)


def _segment() -> bytes:
    return b"".join(
        encode_batch(make_records([b"v" * 50] * 3, base_offset=o, timestamp=1000), base_offset=o)
        for o in range(0, 30, 3)
    )


def test_verify_batches_anchors_errors_in_the_segment() -> None:
    data = _segment()
    positions = batch_positions(data)
    assert len(positions) == 10
    chunk = data[positions[4] : positions[7]]
    verify_batches(chunk, positions[4], path="k")
    bad = bytearray(chunk)
    bad[positions[5] - positions[4] + 40] ^= 0xFF
    with pytest.raises(CorruptSegmentError) as caught:
        verify_batches(bytes(bad), positions[4], path="k")
    assert caught.value.position == positions[5]
    assert caught.value.path == "k"
    with pytest.raises(CorruptSegmentError):  # cut inside a batch
        verify_batches(chunk[:-3], positions[4])


class _OneChunk:
    """A segment handle whose one chunk is `data` (what `ChunkFiles` asks of a handle)."""

    def __init__(self, data: bytes) -> None:
        self.chunk_starts = [0]
        self._file = SimpleNamespace(begin=0, end=len(data), mapping=data)

    def open_chunk(self, pos: int, end: int, **_: object) -> Any:
        return self._file


def _spans(data: bytes) -> list[tuple[int, int, int]]:
    files = ChunkFiles(cast(Any, _OneChunk(data)), "c", len(data), "k", session=True)
    return [tuple(s) for s in files.spans(0)]  # type: ignore[misc]


def test_a_fetch_walk_reads_what_the_full_header_walk_reads() -> None:
    data = _segment()
    assert _spans(data) == [(h.position, h.last_offset, h.end_position)
                            for h in iter_batch_headers(data)]


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d, at: d[:at + 16] + b"\x01" + d[at + 17:], "bad batch header (magic 1"),
    (lambda d, at: d[:at + 8] + struct.pack(">i", 1 << 30) + d[at + 12:], "bad batch header"),
    (lambda d, at: d[:at + 8] + struct.pack(">i", 3) + d[at + 12:], "bad batch header"),
    (lambda d, at: d[:at + 30], "truncated batch"),
], ids=["magic", "length past the end", "length below the minimum", "truncated header"])
def test_a_fetch_walk_stops_at_damage_naming_its_byte(
        damage: Callable[[bytes, int], bytes], message: str) -> None:
    data = _segment()
    second = next(h for i, h in enumerate(iter_batch_headers(data)) if i == 1).position
    bad = damage(data, second)
    files = ChunkFiles(cast(Any, _OneChunk(bad)), "c", len(bad), "k", session=True)
    walk = files.spans(0)
    assert next(walk).end_position == second  # the batch before the damage is served
    with pytest.raises(CorruptSegmentError, match=re.escape(message)) as err:
        next(walk)
    assert err.value.position == second and err.value.path == "k"
