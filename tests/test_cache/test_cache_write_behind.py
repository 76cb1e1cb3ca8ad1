"""Streamed chunks kept in memory and written behind (`cache.buffers`, docs/remote-read.md):
a chunk its readers are done with is written to its file only if the cache still keeps it,
so one consumer reading under eager eviction writes nothing; every chunk the cache keeps
ends up on disk (at the latest when the cache closes); a fetch sending from a buffer keeps
its bytes whatever happens to the chunk meanwhile; and an eviction or a full disk during a
write leaves no file behind (invariant 5: what is served was checked, and stays what was
checked)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from cache_fakes import (
    CHUNK,
    KEY,
    Fetcher,
    Streamer,
    layout,
    make_segment,
    open_cache,
    verifier,
)
from support.waiting import wait_until

from cache.accounting import CacheSettings
from cache.chunk_cache import ChunkCache
from cache.disk import TMP_MARK, chunk_path
from cache.eviction import ChunkId


@pytest.fixture
def data() -> bytes:
    return make_segment(batches=256)


class CountingWrites:
    """`os.write` counting the bytes written, failing with ENOSPC while `full`, and blocking
    (with `entered` set) while `gate` is clear."""

    def __init__(self) -> None:
        self.written = 0
        self.full = False
        #: the errno a failing write raises
        self.error = errno.ENOSPC
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, fd: int, view: memoryview) -> int:
        self.entered.set()
        assert self.gate.wait(10), "a write was held for ever"
        if self.full:
            raise OSError(self.error, os.strerror(self.error))
        n = os.write(fd, view)
        self.written += n
        return n


def files(root: Path) -> tuple[list[Path], list[Path]]:
    """(chunk files, temporary files) under the cache directory `root`."""
    found = [p for p in root.rglob("*") if p.is_file()]
    return ([p for p in found if p.name.isdigit()], [p for p in found if TMP_MARK in p.name])


def read_all(cache: ChunkCache, data: bytes, reader: str = "c", step: int = 3000) -> bytes:
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    out = bytearray()
    for begin in range(0, len(data), step):
        out += seg.read(begin, min(len(data), begin + step), reader=reader)
    return bytes(out)


def test_chunks_one_reader_moved_past_under_eager_eviction_are_never_written(
        tmp_path: Path, data: bytes) -> None:
    writes = CountingWrites()
    cache, fetch, stream = open_cache(tmp_path, data, write=writes)
    with cache:
        assert read_all(cache, data) == data
        assert fetch.calls == [] and len(stream.opened) == 1
        stats = cache.stats()
        assert stats["written_behind"] == 0
        assert stats["unwritten_evictions"] >= len(layout(data, CHUNK)) - 1
        assert writes.written == 0 and files(tmp_path / "cache") == ([], [])


def test_a_chunk_the_cache_keeps_is_written_once_its_readers_let_go(
        tmp_path: Path, data: bytes) -> None:
    """Under LRU nothing is released: each chunk goes to its file once the reader has moved
    past it, its buffer goes back to the pool, and later reads are served from the file."""
    writes = CountingWrites()
    cache, fetch, stream = open_cache(tmp_path, data, strategy="lru", write=writes)
    starts = layout(data, CHUNK)
    with cache:
        assert read_all(cache, data) == data
        cache.close_reader("c")  # its holds on the last chunks go too
        wait_until(lambda: cache.stats()["memory_chunks"] == 0, "every chunk written")
        stats = cache.stats()
        assert stats["written_behind"] == len(starts) and stats["unwritten_evictions"] == 0
        assert writes.written == len(data)  # each chunk once
        buffers = cache._write_behind.buffers
        assert buffers is not None and buffers.lent_bytes == 0
        chunks, temporary = files(tmp_path / "cache")
        assert len(chunks) == len(starts) and temporary == []
        for i, begin in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(data)
            assert chunk_path(cache.root, ChunkId(KEY, begin)).read_bytes() == data[begin:end]
        requests = len(fetch.calls) + len(stream.opened)
        assert read_all(cache, data, reader="d") == data  # from the files
        assert len(fetch.calls) + len(stream.opened) == requests


def test_closing_the_cache_writes_the_chunks_still_in_memory(tmp_path: Path,
                                                             data: bytes) -> None:
    """What is cached stays cached across a restart: a chunk a reader still holds when the
    cache closes is written then, and the next process serves it without a request."""
    cache, _fetch, _stream = open_cache(tmp_path, data)
    starts = layout(data, CHUNK)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.read(0, 100, reader="c")
        seg.read(100, 200, reader="c")  # sequential: the stream brings chunks 1 and 2
        wait_until(lambda: cache.stats()["memory_chunks"] == 3, "chunks 0..2 in memory")
        assert files(tmp_path / "cache") == ([], [])
    assert len(files(tmp_path / "cache")[0]) == 3
    unreachable = Fetcher({})  # any request now would fail
    settings = CacheSettings(size_bytes=1 << 30, chunk_size=CHUNK)
    with ChunkCache(tmp_path / "cache", settings, unreachable, disk_capacity=1 << 40) as again:
        seg = again.open_segment(KEY, len(data), starts, verifier(KEY))
        assert seg.read(0, starts[3]) == data[:starts[3]]
        assert unreachable.calls == []


def test_once_the_budget_is_spent_streamed_chunks_go_to_their_files(
        tmp_path: Path, data: bytes) -> None:
    """One buffer for a stream two chunks ahead: the reader's chunk holds it, so the chunks
    streamed meanwhile are written as they arrive, as without buffers; every byte is right."""
    writes = CountingWrites()
    cache, fetch, _stream = open_cache(tmp_path, data, write=writes, memory=CHUNK)
    with cache:
        assert read_all(cache, data) == data
        assert fetch.calls == []
        stats = cache.stats()
        assert 0 < writes.written < len(data)  # some chunks in the buffer, the rest in files
        assert stats["unwritten_evictions"] > 0 and stats["memory_bytes"] == CHUNK


def test_a_fetch_keeps_its_bytes_while_its_chunk_is_written_evicted_and_the_pool_reused(
        tmp_path: Path, data: bytes) -> None:
    """A chunk open for a fetch holds a share of its buffer: the chunk may be written behind
    and evicted meanwhile, but the buffer is not lent for another chunk until the fetch is
    done with it, so what the fetch sends is what was checked."""
    starts = layout(data, CHUNK)
    cache, _fetch, _stream = open_cache(tmp_path, data, strategy="lru", size=4 * CHUNK,
                                        memory=2 * CHUNK)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        opened = seg.open_chunk(0, starts[1] - 1, reader="c")
        assert opened.file.mapping[:opened.end - opened.begin] == data[:opened.end]
        assert read_all(cache, data) == data  # chunk 0 is written, evicted; buffers reused
        wait_until(lambda: cache.stats()["evictions"] > 0 and not cache._state.to_write,
                   "chunk 0 to be written and evicted")
        assert ChunkId(KEY, 0) not in cache._state.entries
        assert opened.file.mapping[:opened.end - opened.begin] == data[:opened.end]
        opened.close()


def test_a_chunk_evicted_while_it_is_written_leaves_no_file(tmp_path: Path,
                                                            data: bytes) -> None:
    writes = CountingWrites()
    starts = layout(data, CHUNK)
    cache, _fetch, _stream = open_cache(tmp_path, data, strategy="lru", size=4 * CHUNK,
                                        write=writes)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        writes.gate.clear()  # the first write behind stops in its write
        for begin in range(0, starts[1] + 10, 3000):  # the reader moves past chunk 0
            seg.read(begin, min(begin + 3000, starts[1] + 10), reader="c")
        assert writes.entered.wait(10)
        for begin in range(starts[1] + 10, starts[8], 3000):  # room needed: chunk 0 goes
            assert seg.read(begin, begin + 3000, reader="c") == data[begin:begin + 3000]
        assert ChunkId(KEY, 0) not in cache._state.entries
        writes.gate.set()
        wait_until(lambda: not cache._write_behind.writing, "the write-behind thread to finish")
        assert not chunk_path(cache.root, ChunkId(KEY, 0)).exists()
        assert files(tmp_path / "cache")[1] == []
        assert cache.stats()["unwritten_evictions"] >= 1


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=["full disk", "I/O error"])
def test_a_chunk_that_cannot_be_written_is_dropped_and_read_again(tmp_path: Path, data: bytes,
                                                                 error: int) -> None:
    """Dropped, not retried for ever nor served from a file half written; an I/O error (not
    a full disk, which trimming answers) is reported for /health."""
    writes = CountingWrites()
    writes.full, writes.error = True, error
    starts = layout(data, CHUNK)
    cache, fetch, stream = open_cache(tmp_path, data, strategy="lru", write=writes)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        for begin in range(0, starts[2], 3000):  # chunks 0 and 1 let go of: written, or not
            assert seg.read(begin, min(begin + 3000, starts[2]), reader="c") == (
                data[begin:min(begin + 3000, starts[2])])
        wait_until(lambda: ChunkId(KEY, 0) not in cache._state.entries, "chunk 0 to be dropped")
        assert files(tmp_path / "cache") == ([], [])
        assert (cache.write_problem is None) == (error == errno.ENOSPC)
        # a chunk that arrives into memory (held by its reader: not written behind) says
        # nothing about the disk, and leaves a reported I/O error as it is
        assert seg.read(starts[2], starts[2] + 100, reader="c") == data[starts[2]:starts[2] + 100]
        assert (cache.write_problem is None) == (error == errno.ENOSPC)
        writes.full = False
        requests = len(fetch.calls) + len(stream.opened)
        assert seg.read(0, 3000, reader="d") == data[:3000]  # downloaded again
        assert len(fetch.calls) + len(stream.opened) > requests


@pytest.mark.parametrize("budget_chunks", [4, 128])
def test_chunks_a_stopped_consumer_holds_are_written_once_buffers_run_short(
        tmp_path: Path, data: bytes, budget_chunks: int) -> None:
    """A consumer that stops keeps holding its chunks (until it idles out, minutes later).
    Once more than half the buffers are lent, chunks nobody read for a second are written
    behind, held or not, and their buffers go back for the consumers reading now; with
    buffers to spare they stay in memory."""
    now = [1000.0]
    starts = layout(data, CHUNK)
    stream = Streamer({KEY: data})
    settings = CacheSettings(size_bytes=1 << 30, chunk_size=CHUNK, chunk_prefetch=2,
                             memory_bytes=budget_chunks * CHUNK)
    with ChunkCache(tmp_path / "cache", settings, Fetcher({KEY: data}), clock=lambda: now[0],
                    disk_capacity=1 << 40, stream=stream) as cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.read(0, 100, reader="a")
        seg.read(100, 200, reader="a")  # the stream brings chunks 1 and 2: 3 buffers lent
        wait_until(lambda: cache.stats()["memory_chunks"] == 3, "chunks 0..2 in memory")
        looks = cache._write_behind.looks
        now[0] += 2  # nobody reads them for two seconds
        if budget_chunks == 4:
            wait_until(lambda: cache.stats()["written_behind"] == 3, "the idle chunks written")
            assert len(files(tmp_path / "cache")[0]) == 3
            buffers = cache._write_behind.buffers
            assert buffers is not None and buffers.lent_bytes == 0
        else:
            # a whole pass of the watcher after the clock moved (one may be under way)
            wait_until(lambda: cache._write_behind.looks >= looks + 2, "the watcher to look")
            assert cache.stats()["memory_chunks"] == 3 and files(tmp_path / "cache")[0] == []
        assert seg.read(200, starts[3], reader="a") == data[200:starts[3]]  # and it goes on


def test_disk_health_changes_only_with_disk_writes() -> None:
    from cache.disk_health import DiskHealth

    health = DiskHealth()
    assert health.problem is None
    health.failed(OSError(errno.EIO, "Input/output error"))
    assert health.problem is not None and "Input/output" in health.problem
    health.succeeded()
    assert health.problem is None
