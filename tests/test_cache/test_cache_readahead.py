"""Read-ahead streams: one streamed request per sequentially read segment, never more than
`chunk_prefetch` chunks ahead of the reader, and a broken or corrupt stream falls back to
ranged GETs without serving a wrong byte or downloading a chunk twice."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cache_fakes import Fetcher, layout, make_segment, verifier
from support.waiting import wait_until

from cache.accounting import CacheSettings
from cache.chunk_cache import ChunkCache

KEY = "ab12cd34/kafka/orders/0_7/0-1023-1.log"
CHUNK = 8 * 1024


@dataclass
class Stream:
    data: bytes
    pos: int
    end: int
    #: the stream raises once it has handed out this many bytes
    break_at: int | None = None
    #: byte offsets (absolute) flipped in what is handed out
    corrupt: set[int] = field(default_factory=set)
    closed: bool = False

    def read(self, n: int = -1, /) -> bytes:
        if self.break_at is not None and self.pos >= self.break_at:
            raise ConnectionResetError("connection reset by peer")
        n = min(n, 1000)  # arrives in pieces, as from a socket
        got = bytearray(self.data[self.pos:min(self.end, self.pos + n)])
        for at in self.corrupt:
            if self.pos <= at < self.pos + len(got):
                got[at - self.pos] ^= 0xFF
        self.pos += len(got)
        return bytes(got)

    def close(self) -> None:
        self.closed = True


@dataclass
class Streamer:
    objects: dict[str, bytes]
    opened: list[Stream] = field(default_factory=list)
    break_at: int | None = None
    corrupt: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, key: str, begin: int, end: int) -> Stream:
        stream = Stream(self.objects[key], begin, end, self.break_at, set(self.corrupt))
        with self.lock:
            self.opened.append(stream)
        return stream


@pytest.fixture
def data() -> bytes:
    return make_segment(batches=256)


def open_cache(tmp_path: Path, data: bytes, prefetch: int = 2, strategy: str = "eager",
               **kwargs: Any) -> tuple[ChunkCache, Fetcher, Streamer]:
    fetch, stream = Fetcher({KEY: data}), Streamer({KEY: data}, **kwargs)
    settings = CacheSettings(size_bytes=1 << 30, chunk_size=CHUNK, chunk_prefetch=prefetch)
    cache = ChunkCache(tmp_path / "cache", settings, fetch, strategy=strategy,
                       disk_capacity=1 << 40, stream=stream)
    return cache, fetch, stream


def read_sequentially(cache: ChunkCache, data: bytes, step: int = 3000) -> bytes:
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    out = bytearray()
    for begin in range(0, len(data), step):
        out += seg.read(begin, min(len(data), begin + step), reader="consumer")
    return bytes(out)


def test_a_sequential_reader_costs_one_streamed_request(tmp_path: Path, data: bytes) -> None:
    cache, fetch, stream = open_cache(tmp_path, data)
    with cache:
        assert len(layout(data, CHUNK)) > 8
        assert read_sequentially(cache, data) == data
        assert fetch.calls == []  # no ranged GET at all
        assert len(stream.opened) == 1 and stream.opened[0].pos == len(data)
        stats = cache.stats()
        assert stats["bytes_downloaded"] == len(data)  # every chunk once
        assert stats["misses"] == 1  # the first chunk; the stream had the rest ready or coming
        wait_until(lambda: stream.opened[0].closed, "the stream to be closed")


def test_the_stream_stays_within_prefetch_chunks_of_the_reader(tmp_path: Path,
                                                              data: bytes) -> None:
    cache, _fetch, stream = open_cache(tmp_path, data, prefetch=2)
    with cache:
        starts = layout(data, CHUNK)
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.read(0, 100, reader="c")
        seg.read(100, 200, reader="c")  # sequential, positioned in chunk 0
        wait_until(lambda: cache.stats()["hydrated_chunks"] == 3, "chunks 0..2 to be stored")
        # parked: it has not read past chunk 2 (2 ahead of the reader)
        assert stream.opened[0].pos == starts[3]
        seg.read(starts[1], starts[1] + 100, reader="c")  # the reader moves on by one chunk
        wait_until(lambda: stream.opened[0].pos == starts[4], "the stream to take chunk 3")
        cache.close_reader("c")  # the consumer goes away: the stream ends
        wait_until(lambda: stream.opened[0].closed, "the stream to be closed")
        assert stream.opened[0].pos == starts[4]


def test_a_broken_stream_falls_back_to_ranged_gets(tmp_path: Path, data: bytes) -> None:
    starts = layout(data, CHUNK)
    cache, fetch, stream = open_cache(tmp_path, data, break_at=starts[3] + 500)
    with cache:
        assert read_sequentially(cache, data) == data
        fetched = sorted(c[1] for c in fetch.calls)
        assert fetched and fetched[0] == starts[3]  # the chunk the stream broke in
        assert len(fetched) == len(set(fetched))  # each fetched once
        # chunks the stream delivered were not fetched again
        assert not set(fetched) & set(starts[:3])


def test_corrupt_streamed_bytes_are_fetched_again_never_served(tmp_path: Path,
                                                               data: bytes) -> None:
    starts = layout(data, CHUNK)
    cache, fetch, _stream = open_cache(tmp_path, data, corrupt={starts[2] + 77})
    with cache:
        assert read_sequentially(cache, data) == data
        assert [c[1] for c in fetch.calls] == [starts[2]]
        assert cache.stats()["bytes_downloaded"] == len(data) + (starts[3] - starts[2])


def test_many_readers_of_one_segment_download_each_chunk_once(tmp_path: Path,
                                                              data: bytes) -> None:
    cache, fetch, stream = open_cache(tmp_path, data, prefetch=3, strategy="lru")
    starts = layout(data, CHUNK)
    results: dict[int, bytes] = {}
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))

        def consume(n: int) -> None:
            out = bytearray()
            for begin in range(0, len(data), 2500):
                out += seg.read(begin, min(len(data), begin + 2500), reader=f"c{n}")
            results[n] = bytes(out)

        threads = [threading.Thread(target=consume, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 6 and all(r == data for r in results.values())
        stats = cache.stats()
        # nothing was evicted (the cache is large), so each chunk came exactly once: from a
        # stream or a ranged GET, whichever reader got there first
        assert stats["evictions"] == 0
        assert stats["bytes_downloaded"] == len(data)
        assert stats["hydrated_chunks"] == len(starts)


def test_the_next_segment_s_first_chunk_comes_while_the_reader_finishes_this_one(
        tmp_path: Path, data: bytes) -> None:
    """Read-ahead crosses a segment boundary: the next segment's first chunk is streamed and
    held (eager eviction keeps it) while the reader is still in the segment before it."""
    key2 = KEY.replace("0-1023", "1024-2047")
    data2 = make_segment(batches=256, base_offset=1024)
    cache, fetch, stream = open_cache(tmp_path, data)
    stream.objects[key2] = data2
    fetch.objects[key2] = data2
    with cache:
        starts = layout(data, CHUNK)
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg2 = cache.open_segment(key2, len(data2), layout(data2, CHUNK), verifier(key2))
        last = starts[-1]
        seg.read(last, last + 100, reader="c")
        seg.read(last + 100, last + 200, reader="c")  # sequential, in the last chunk
        assert seg2.read_ahead("c", after=KEY)
        wait_until(lambda: cache.stats()["hydrated_chunks"] >= 2, "the next chunk to arrive")
        stream2 = next(s for s in stream.opened if s.data is data2)
        seg.read(last + 200, len(data), reader="c")  # finishes the segment; eager lets go
        calls = len(fetch.calls)
        assert seg2.read(0, 3000, reader="c") == data2[:3000]
        assert len(fetch.calls) == calls  # the first chunk was there, no GET
        assert stream2.pos >= layout(data2, CHUNK)[1]
