"""The pool of buffers streamed chunks are received into (`cache.buffers`): bounded by its
budget, lent as shared mappings that go back to the pool (keeping their memory) only with
their last share, and freed once idle."""

from __future__ import annotations

import mmap
import os

import pytest

from cache.buffers import ChunkBuffers

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_buffers_are_lent_up_to_the_budget_and_no_further() -> None:
    pool = ChunkBuffers(3 * MiB, MiB)
    lent = [pool.take(MiB) for _ in range(3)]
    assert all(b is not None for b in lent)
    assert pool.take(10) is None  # the budget is spent: the chunk goes to its file
    assert pool.lent_bytes == pool.held_bytes == 3 * MiB
    for b in lent:
        assert b is not None
        b.release()
    assert pool.lent_bytes == 0 and pool.held_bytes == 3 * MiB


def test_a_chunk_larger_than_a_buffer_gets_none() -> None:
    pool = ChunkBuffers(8 * MiB, MiB)
    assert pool.take(MiB + 1) is None
    assert pool.held_bytes == 0


def test_a_buffer_holds_a_chunk_and_reads_like_a_file() -> None:
    """A buffer has a descriptor too: a range of it can go out with sendfile or pread."""
    pool = ChunkBuffers(MiB, MiB)
    buffer = pool.take(5000)
    assert buffer is not None
    data = os.urandom(5000)
    buffer.mapping[:5000] = data
    assert os.pread(buffer.fd, 1000, 2000) == data[2000:3000]
    assert buffer.mapping[:5000] == data
    buffer.release()


def test_a_buffer_goes_back_only_with_its_last_share_and_keeps_its_memory() -> None:
    """A fetch still sending from a chunk's buffer keeps it out of the pool, so the next chunk
    cannot be received over bytes being sent; given back, the same memory serves the next
    chunk (its pages are not faulted in again)."""
    pool = ChunkBuffers(MiB, MiB)
    buffer = pool.take(MiB)
    assert buffer is not None
    fetch = buffer.share()
    buffer.release()  # the chunk left the cache; the fetch still sends from it
    assert pool.take(MiB) is None and not fetch.closed
    fd, mapping = fetch.fd, fetch.mapping
    fetch.release()
    again = pool.take(MiB)
    assert again is not None and again.fd == fd and again.mapping is mapping
    again.release()


def test_idle_buffers_are_freed_after_a_while() -> None:
    clock = Clock()
    pool = ChunkBuffers(2 * MiB, MiB, clock=clock)
    first, second = pool.take(MiB), pool.take(MiB)
    assert first is not None and second is not None
    first.release()
    clock.now += 30
    second.release()
    clock.now += 40
    assert pool.trim(60) == 1  # the one idle 70 s; the other was given back 40 s ago
    assert pool.held_bytes == MiB
    with pytest.raises(ValueError):
        first.mapping[0]  # its memory is gone
    clock.now += 30
    assert pool.trim(60) == 1 and pool.held_bytes == 0


def test_closing_frees_the_idle_buffers_and_the_lent_ones_once_given_back() -> None:
    pool = ChunkBuffers(2 * MiB, MiB)
    idle, lent = pool.take(MiB), pool.take(MiB)
    assert idle is not None and lent is not None
    idle.release()
    pool.close()
    assert pool.held_bytes == MiB and pool.take(1) is None
    mapping = lent.mapping
    lent.release()
    assert pool.held_bytes == 0 and mapping.closed


def test_buffer_sizes_are_whole_pages() -> None:
    pool = ChunkBuffers(MiB, 1000)
    buffer = pool.take(1000)
    assert buffer is not None and len(buffer.mapping) == pool.capacity == mmap.PAGESIZE
    buffer.release()


def test_without_memfd_there_are_no_buffers_and_chunks_go_to_files(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the system has no memfd (not Linux), `take` says no rather than failing."""
    monkeypatch.delattr(os, "memfd_create", raising=False)
    pool = ChunkBuffers(MiB, MiB)
    assert pool.take(10) is None and pool.held_bytes == 0
