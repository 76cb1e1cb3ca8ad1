"""The pieces of the chunk cache on their own, over a `CacheState` and nothing else: room
(`cache.space`), the write-behind (`cache.write_behind`) and one chunk's single-flight
download (`cache.hydration`)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cache_fakes import Fetcher, layout, make_segment, verifier
from support.waiting import wait_until

from cache import disk
from cache.accounting import CacheSettings
from cache.buffers import ChunkBuffers
from cache.chunk_entries import CacheEntry, SegmentInfo
from cache.errors import CacheFullError
from cache.eviction import ChunkId, make_strategy
from cache.hydration import Hydration
from cache.space import Space
from cache.state import CacheState
from cache.write_behind import WriteBehind

KEY = "ab12cd34/kafka/orders/0_7/0-255-1.log"
SIZE = 100


@pytest.fixture
def state(tmp_path: Path) -> Iterator[CacheState]:
    settings = CacheSettings(size_bytes=3 * SIZE, chunk_size=SIZE, eviction_strategy="lru")
    state = CacheState(tmp_path, settings, clock=lambda: 0.0, write=os.write)
    yield state
    with state.cond:
        state.stop.set()
        threads = list(state.threads)
    for thread in threads:
        thread.join(timeout=10)


def make_space(state: CacheState, *, reserve_timeout_s: float = 0.0) -> Space:
    settings = state.settings
    return Space(state, make_strategy("lru", hydrated_ratio=0.7, min_chunks=5),
                 settings.limits(1 << 40), WriteBehind(state, None),
                 reserve_timeout_s=reserve_timeout_s)


def add(state: CacheState, start: int, last_access: float) -> CacheEntry:
    entry = CacheEntry(ChunkId(KEY, start), SIZE, last_access, None)
    path = disk.chunk_path(state.root, entry.chunk)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * SIZE)
    state.add_entry(entry)
    return entry


def test_room_is_made_from_the_least_recently_read_unheld_chunk(state: CacheState) -> None:
    space = make_space(state)
    oldest, middle, newest = add(state, 0, 1.0), add(state, SIZE, 2.0), add(state, 2 * SIZE, 3.0)
    oldest.pins = 1  # being read: never removed
    with state.cond:
        space.reserve(SIZE, wait=False)
    assert set(state.entries) == {oldest.chunk, newest.chunk}
    assert not disk.chunk_path(state.root, middle.chunk).exists()
    assert state.used_bytes == 2 * SIZE and state.counters["evictions"] == 1


def test_with_everything_held_a_read_overshoots_by_one_chunk_then_finds_no_room(
        state: CacheState) -> None:
    space = make_space(state)
    for start in range(3):
        add(state, start * SIZE, float(start)).pins = 1
    with state.cond:
        with pytest.raises(CacheFullError):
            space.reserve(SIZE, wait=False)  # a prefetch never overshoots
        space.reserve(SIZE, wait=True)  # a read may, once
        assert state.counters["overshoots"] == 1
        add(state, 3 * SIZE, 3.0).pins = 1
        with pytest.raises(CacheFullError, match="cache full"):
            space.reserve(SIZE, wait=True)  # over the limit already: it waits, then fails
    assert len(state.entries) == 4


def test_a_chunk_in_memory_is_written_behind_to_its_file(state: CacheState) -> None:
    buffers = ChunkBuffers(4 * mmap.PAGESIZE, SIZE)  # buffers are whole pages
    writer = WriteBehind(state, buffers)
    buffer = buffers.take(SIZE)
    if buffer is None:
        pytest.skip("no memfd on this system: chunks go straight to their files")
    data = bytes(range(SIZE))
    buffer.mapping[:SIZE] = data
    entry = CacheEntry(ChunkId(KEY, 0), SIZE, 0.0, None)
    with state.cond:
        state.add_entry(entry)
        writer.keep_in_memory(entry, buffer)
        assert state.in_memory == {entry.chunk: entry}
        writer.write_unheld()  # nobody holds it: queued for the write-behind thread
    wait_until(lambda: state.counters["written_behind"] == 1, "the chunk written behind")
    assert disk.chunk_path(state.root, entry.chunk).read_bytes() == data
    assert not entry.in_memory and state.in_memory == {} and entry.crcs is not None
    assert buffers.lent_bytes == 0  # its buffer given back
    wait_until(lambda: not writer.writing and not writer.watching, "the threads to end")


def test_readers_of_one_chunk_share_one_download(tmp_path: Path) -> None:
    data = make_segment()
    fetch = Fetcher({KEY: data})
    state = CacheState(tmp_path, CacheSettings(size_bytes=len(data), chunk_size=4096),
                       clock=lambda: 0.0, write=os.write)
    space = make_space(state)
    hydration = Hydration(state, space, WriteBehind(state, None), fetch, download_attempts=3)
    seg = SegmentInfo(KEY, len(data), tuple(layout(data, 4096)), verifier(KEY), False)
    first, mine, download = hydration.pin(seg.chunk_ids[0], seg.bounds(0), prefetch=False)
    second, theirs, joined = hydration.pin(seg.chunk_ids[0], seg.bounds(0), prefetch=False)
    assert mine and not theirs and second is first and joined is download
    assert joined is not None and not joined.done()  # the second reader waits for the first
    fetched = hydration.download(seg, 0, first)
    begin, end = seg.bounds(0)
    assert fetched == data[begin:end] and fetch.calls == [(KEY, begin, end)]
    assert hydration.wait_ready(seg, 0, second, joined, None) is None  # done, nothing raised
    assert hydration.load(seg, 0, second, 0, end - begin) == data[begin:end]
    counters = state.counters
    assert (counters["misses"], counters["joined"], counters["overshoots"]) == (1, 1, 0)
    assert first.pins == 2 and state.used_bytes == end - begin
