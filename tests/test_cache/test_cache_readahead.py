"""Read-ahead streams: one streamed request per sequentially read segment, never more than
`chunk_prefetch` chunks ahead of the reader, and a broken or corrupt stream falls back to
ranged GETs without serving a wrong byte or downloading a chunk twice."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cache_fakes import (
    CHUNK,
    KEY,
    Fetcher,
    Stream,
    Streamer,
    layout,
    make_segment,
    open_cache,
    verifier,
)
from support.waiting import wait_until

from cache.chunk_cache import ChunkCache, ChunkFile, SegmentHandle
from cache.chunks import batch_positions
from cache.errors import CacheFullError
from cache.eviction import ChunkId


@pytest.fixture
def data() -> bytes:
    return make_segment(batches=256)


def read_sequentially(cache: ChunkCache, data: bytes, step: int = 3000) -> bytes:
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    out = bytearray()
    for begin in range(0, len(data), step):
        out += seg.read(begin, min(len(data), begin + step), reader="consumer")
    return bytes(out)


KEY2 = KEY.replace("0-1023", "1024-2047")


def with_next_segment(tmp_path: Path, data: bytes, **kwargs: Any
                      ) -> tuple[ChunkCache, Fetcher, Streamer, bytes]:
    """`open_cache` whose store also holds the segment after KEY, at KEY2: its bytes too."""
    data2 = make_segment(batches=256, base_offset=1024)
    cache, fetch, stream = open_cache(tmp_path, data, **kwargs)
    stream.objects[KEY2] = fetch.objects[KEY2] = data2
    return cache, fetch, stream, data2


def open_both(cache: ChunkCache, data: bytes, data2: bytes
              ) -> tuple[SegmentHandle, SegmentHandle]:
    return (cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY)),
            cache.open_segment(KEY2, len(data2), layout(data2, CHUNK), verifier(KEY2)))


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
    cache, fetch, stream, data2 = with_next_segment(tmp_path, data)
    with cache:
        seg, seg2 = open_both(cache, data, data2)
        last = seg.chunk_starts[-1]
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


def test_a_next_segment_s_first_chunk_another_reader_brought_is_held_for_this_one(
        tmp_path: Path, data: bytes) -> None:
    """Two sessions read neighbouring segments at once. The first chunk of the second
    segment, which its own reader streamed, is held for the reader finishing the first
    segment: eager eviction keeps it after its own reader moves on, and the other reader
    reads it without a request when it gets there."""
    cache, fetch, stream, data2 = with_next_segment(tmp_path, data)
    with cache:
        seg, seg2 = open_both(cache, data, data2)
        starts2 = seg2.chunk_starts
        assert seg2.read(0, 100, reader="b") == data2[:100]  # b streams the second segment
        seg.read(0, 100, reader="a")
        assert not seg2.read_ahead("a", after=KEY)  # there already: held, not streamed again
        for begin in range(100, starts2[2], 1000):  # b moves on past its first chunk
            seg2.read(begin, min(begin + 1000, starts2[2]), reader="b")
        # eager: what nobody holds goes
        wait_until(lambda: cache.stats()["evictions"] > 0, "b's passed chunks to be evicted")
        requests = len(stream.opened) + len(fetch.calls)
        assert seg2.read(0, 3000, reader="a") == data2[:3000]
        assert len(stream.opened) + len(fetch.calls) == requests  # a's first chunk was kept
        seg2.read(3000, starts2[1] + 10, reader="a")  # a moves past it: it goes now
        wait_until(lambda: not any(e.chunk.segment == KEY2 and e.chunk.start == 0
                                   for e in cache._state.entries.values()), "the chunk to go")


def read_file(f: ChunkFile) -> bytes:
    try:
        return os.pread(f.fd, f.end - f.begin, 0)
    finally:
        f.close()


def read_on(seg: SegmentHandle, data: bytes, at: int, chunk_end: int) -> list[int]:
    """Open the chunk again and again from `at` (where the last view ended) to its end, as a
    reader walking its batches does, checking every view's bytes; the views' ends."""
    ends = []
    while at < chunk_end:
        f = seg.open_chunk(at, chunk_end - 1, reader="c")
        assert f.begin <= at < f.end <= chunk_end
        assert read_file(f) == data[f.begin:f.end]
        ends.append(f.end)
        at = f.end
    return ends


def test_a_reader_is_served_the_verified_start_of_a_chunk_still_arriving(
        tmp_path: Path, data: bytes) -> None:
    """A consumer that catches up with its stream waits for the batches it reads, not for the
    whole chunk; what it gets has passed its checks, however the stream is cut."""
    starts = layout(data, CHUNK)
    hold = starts[1] + (starts[2] - starts[1]) // 2  # inside a batch, mid chunk 1
    cache, fetch, stream = open_cache(tmp_path, data, holds={hold: threading.Event()})
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        first = seg.open_chunk(0, starts[1] - 1, reader="c")
        assert read_file(first) == data[first.begin:first.end]
        seg.open_chunk(100, starts[1] - 1, reader="c").close()  # sequential: read ahead
        part = seg.open_chunk(starts[1], starts[2] - 1, reader="c")  # the stream is at `hold`
        assert part.begin == starts[1] and starts[1] < part.end <= hold
        assert part.end in batch_positions(data)  # whole batches only
        assert read_file(part) == data[part.begin:part.end]
        stream.holds[hold].set()
        assert read_on(seg, data, part.end, starts[2])[-1] == starts[2]
        assert fetch.calls == [] and len(stream.opened) == 1


@pytest.mark.parametrize("memory", [0, 1 << 20], ids=["file", "buffer"])
def test_a_chunk_is_mapped_once_from_its_first_streamed_byte_to_its_eviction(
        tmp_path: Path, data: bytes, memory: int) -> None:
    """The staged file (or buffer) is mapped at its full size when the stream starts it;
    readers of its verified start share that mapping, and so do readers of the stored chunk
    once it is in: a fetch never maps or opens the file on its own."""
    starts = layout(data, CHUNK)
    hold = starts[1] + (starts[2] - starts[1]) // 2
    cache, _fetch, stream = open_cache(tmp_path, data, holds={hold: threading.Event()},
                                       memory=memory)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.open_chunk(0, starts[1] - 1, reader="c").close()
        seg.open_chunk(100, starts[1] - 1, reader="c").close()  # sequential: read ahead
        part = seg.open_chunk(starts[1], starts[2] - 1, reader="c")  # still arriving
        assert part.end < starts[2] and len(part.mapping) >= starts[2] - starts[1]
        stream.holds[hold].set()
        wait_until(lambda: cache.stats()["hydrated_chunks"] >= 2, "chunk 1 to be stored")
        whole = seg.open_chunk(part.end, starts[2] - 1, reader="c")
        assert whole.file is part.file and whole.end == starts[2]
        assert whole.mapping[:whole.end - whole.begin] == data[starts[1]:starts[2]]
        part.close()
        whole.close()
        seg.read(starts[3], starts[3] + 10, reader="c")  # moved on: eager eviction
        wait_until(lambda: part.file.closed, "the mapping to be released")


def test_a_reader_is_never_served_past_a_corrupt_batch_of_a_chunk_arriving(
        tmp_path: Path, data: bytes) -> None:
    starts = layout(data, CHUNK)
    positions = batch_positions(data)
    bad = next(p for p in positions if p > starts[1] + 2000)  # a batch in chunk 1
    hold = next(p for p in positions if p > bad) + 100  # past it, inside the next one
    cache, fetch, stream = open_cache(tmp_path, data, holds={hold: threading.Event()},
                                      corrupt={bad + 70})
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.open_chunk(0, starts[1] - 1, reader="c").close()
        seg.open_chunk(100, starts[1] - 1, reader="c").close()  # sequential: read ahead
        part = seg.open_chunk(starts[1], starts[2] - 1, reader="c")
        assert part.end <= bad
        assert read_file(part) == data[part.begin:part.end]
        stream.holds[hold].set()
        ends = read_on(seg, data, part.end, starts[2])
        assert all(end <= bad for end in ends[:-1])  # a view of the chunk still arriving
        assert [c[1] for c in fetch.calls] == [starts[1]]  # then fetched again, whole


@pytest.mark.timeout(60)
def test_a_full_disk_under_a_stream_fails_its_readers_instead_of_leaving_them_waiting(
        tmp_path: Path, data: bytes) -> None:
    room = {"bytes": CHUNK + CHUNK // 2}  # the first chunk fits, the second does not

    def write(fd: int, view: memoryview) -> int:
        if room["bytes"] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(room["bytes"], len(view))
        room["bytes"] -= n
        return os.write(fd, view[:n])

    cache, _fetch, _stream = open_cache(tmp_path, data, write=write, memory=0)
    starts = layout(data, CHUNK)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        assert seg.read(0, 100, reader="c") == data[:100]
        with pytest.raises(CacheFullError, match="disk is full"):
            for begin in range(100, starts[3], 2000):
                seg.read(begin, min(begin + 2000, starts[3]), reader="c")
        room["bytes"] = 1 << 30
        assert seg.read(starts[1], starts[1] + 100, reader="c") == data[starts[1]:starts[1] + 100]


def test_the_next_segment_s_request_waits_for_the_reader_to_reach_the_last_chunk(
        tmp_path: Path, data: bytes) -> None:
    """The next segment's first chunk is read ahead once the reader reads in this segment's
    last chunk, not sooner: until then the reader needs this segment's chunks, and on a busy
    host the next request (and the store's work for it) would slow the reads before it. The
    reads before the last chunk do not even wake its stream (each wake-up takes the cache's
    lock and the interpreter from the reader)."""
    cache, fetch, stream, data2 = with_next_segment(tmp_path, data, prefetch=4)
    opened: list[str] = []
    stream.on_open = opened.append
    with cache:
        seg, seg2 = open_both(cache, data, data2)
        starts = seg.chunk_starts
        at = starts[-3]
        seg.read(at, at + 100, reader="c")  # a miss: the stream starts here
        seg.read(at + 100, at + 200, reader="c")  # sequential: it goes on to the end
        assert seg2.read_ahead("c", after=KEY)
        wakes: list[int] = []
        waiting = cache._streams.streams[("c", KEY2)].wake
        notify = waiting.notify
        waiting.notify = lambda n=1: wakes.append(n) or notify(n)  # type: ignore[method-assign,func-returns-value]
        wait_until(lambda: cache.stats()["hydrated_chunks"] == 3, "this segment's chunks")
        wait_until(lambda: ("c", KEY) not in cache._streams.streams, "this segment's stream to end")
        woken = len(wakes)  # its end wakes it once
        for begin in range(at + 200, starts[-1] - 1, 1000):  # up to the last chunk, not in it
            seg.read(begin, min(begin + 1000, starts[-1] - 1), reader="c")
        time.sleep(0.2)
        assert opened == [KEY]  # the next segment's request has not gone out
        assert len(wakes) == woken
        seg.read(starts[-1] - 1, starts[-1] + 100, reader="c")  # into the last chunk
        wait_until(lambda: opened == [KEY, KEY2], "the next segment's request")
        seg.read(starts[-1] + 100, len(data), reader="c")
        assert seg2.read(0, 3000, reader="c") == data2[:3000]
        assert fetch.calls == []


def test_a_reader_waiting_for_its_stream_to_start_a_chunk_joins_it_at_once(
        tmp_path: Path, data: bytes) -> None:
    """A reader that reaches a chunk before its stream has started it waits for the stream,
    and is served that chunk's first verified batches as soon as they are in, not the whole
    chunk later."""
    starts = layout(data, CHUNK)
    end_of_0 = starts[1] - 100  # the stream stops just before chunk 0 is whole
    inside_1 = starts[1] + (starts[2] - starts[1]) // 2  # and again in the middle of chunk 1
    holds = {end_of_0: threading.Event(), inside_1: threading.Event()}
    cache, fetch, stream = open_cache(tmp_path, data, prefetch=1, holds=holds)
    got: list[ChunkFile] = []
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.open_chunk(0, starts[1] - 1, reader="c").close()
        seg.open_chunk(100, starts[1] - 1, reader="c").close()  # sequential
        waiter = threading.Thread(
            target=lambda: got.append(seg.open_chunk(starts[1], starts[2] - 1, reader="c")))
        waiter.start()  # chunk 1 is not started: the reader waits for its stream
        holds[end_of_0].set()
        wait_until(lambda: bool(got), "chunk 1's verified start, the stream held inside it")
        assert starts[1] < got[0].end <= inside_1
        assert read_file(got[0]) == data[starts[1]:got[0].end]
        holds[inside_1].set()
        waiter.join()
        assert fetch.calls == []


@pytest.mark.parametrize("memory", [0, 1 << 20], ids=["file", "buffer"])
def test_a_stream_offers_what_it_verified_without_the_cache_s_lock(
        tmp_path: Path, data: bytes, memory: int) -> None:
    """With no reader waiting for the chunk, every run of batches the stream checks is offered
    to readers without taking the cache's lock: fetches holding it (every read takes it) never
    hold the stream up between the pieces it receives. A reader coming afterwards is served
    what was offered, and a reader waiting for it is woken (the test above)."""
    starts = layout(data, CHUNK)
    inside_1 = starts[1] + (starts[2] - starts[1]) // 2
    holds = {inside_1: threading.Event()}
    cache, fetch, stream = open_cache(tmp_path, data, prefetch=1, holds=holds, memory=memory)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.open_chunk(0, starts[1] - 1, reader="c").close()
        seg.open_chunk(100, starts[1] - 1, reader="c").close()  # sequential: chunk 1 comes
        wait_until(lambda: stream.opened[0].pos == inside_1, "the stream held inside chunk 1")
        entry = cache._state.entries[ChunkId(KEY, starts[1])]
        assert 0 < entry.ready <= inside_1 - starts[1]
        with cache._state.lock:  # as a long fetch holds it
            holds[inside_1].set()
            wait_until(lambda: entry.ready == starts[2] - starts[1],
                       "every batch of chunk 1 verified and offered, the lock held meanwhile")
        assert read_on(seg, data, starts[1], starts[2])[-1] == starts[2]
        assert fetch.calls == []


def test_a_reader_s_fetches_wake_its_stream_only_once_it_may_go_on(tmp_path: Path,
                                                                  data: bytes) -> None:
    """A stream parked a window ahead of its reader is not woken by every fetch of the reader
    inside the chunk it is in (each wake-up cost the lock and the interpreter, for nothing),
    and is woken as soon as the reader moves on far enough for it to take the next chunk."""
    starts = layout(data, CHUNK)
    cache, _fetch, stream = open_cache(tmp_path, data, prefetch=1)
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.read(0, 100, reader="c")
        seg.read(100, 200, reader="c")  # sequential: the stream brings chunk 1, then parks
        wait_until(lambda: stream.opened[0].pos == starts[2], "the stream parked at chunk 2")
        parked = cache._streams.streams[("c", KEY)]
        wakes: list[int] = []
        notify = parked.wake.notify

        def counted(n: int = 1) -> None:
            wakes.append(n)
            notify(n)

        parked.wake.notify = counted  # type: ignore[method-assign]
        for begin in range(200, 2200, 200):  # ten more fetches inside chunk 0
            seg.read(begin, begin + 200, reader="c")
        assert wakes == []
        seg.read(starts[1], starts[1] + 100, reader="c")  # within its window of chunk 2
        assert wakes
        wait_until(lambda: stream.opened[0].pos == starts[3], "the stream to take chunk 2")


def test_a_one_off_read_is_served_the_start_of_its_chunk_before_the_rest_arrives(
        tmp_path: Path, data: bytes) -> None:
    """A read without a session that misses a chunk gets one streamed request for just that
    chunk, and is served once the batches it needs are verified: a 1 MiB read of a cold
    16 MiB chunk waits for part of the chunk, not all of it. The chunk is then stored whole,
    once."""
    starts = layout(data, CHUNK)
    hold = starts[2] + (starts[3] - starts[2]) // 2  # the stream stops mid-chunk
    cache, fetch, stream = open_cache(tmp_path, data, prefetch=0, strategy="lru",
                                      holds={hold: threading.Event()})
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        got = seg.open_chunk(starts[2] + 10, starts[3] - 1)  # no reader: a one-off read
        assert starts[2] + 10 < got.end <= hold
        assert read_file(got) == data[starts[2]:got.end]
        assert [s.end for s in stream.opened] == [starts[3]]  # that chunk, no further
        stream.holds[hold].set()
        wait_until(lambda: cache.stats()["hydrated_chunks"] == 1, "the chunk stored whole")
        assert seg.read(starts[2], starts[3]) == data[starts[2]:starts[3]]
        assert fetch.calls == [] and len(stream.opened) == 1
        assert cache.stats()["bytes_downloaded"] == starts[3] - starts[2]


def test_a_one_off_read_of_the_first_chunk_asks_for_that_chunk_only(
        tmp_path: Path, data: bytes) -> None:
    """From byte 0 a one-off read still asks for a range (its chunk), never the whole object:
    only a read-ahead that runs to the end sends a request without one."""
    starts = layout(data, CHUNK)
    cache, fetch, stream = open_cache(tmp_path, data, prefetch=0, strategy="lru")
    ends: list[bool] = []
    inner = stream.__call__

    def recording(key: str, begin: int, end: int, *, to_end: bool = False) -> Stream:
        ends.append(to_end)
        return inner(key, begin, end, to_end=to_end)

    cache._streams.chunk_streamer = recording
    with cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.open_chunk(0, starts[1] - 1).close()
        wait_until(lambda: cache.stats()["hydrated_chunks"] == 1, "chunk 0 stored")
        assert ends == [False] and stream.opened[0].end == starts[1]
        assert fetch.calls == []


def test_an_early_request_is_taken_by_the_read_ahead_from_chunk_0(tmp_path: Path,
                                                                  data: bytes) -> None:
    """`request_early` sends the request from byte 0 before the segment is opened; the
    consumer's read-ahead from chunk 0 then uses it: one request in all, no ranged GET."""
    cache, fetch, stream = open_cache(tmp_path, data)
    with cache:
        cache.request_early(KEY, len(data))
        wait_until(lambda: len(stream.opened) == 1, "the early request")
        assert read_sequentially(cache, data) == data
        assert len(stream.opened) == 1 and stream.opened[0].pos == len(data)
        assert fetch.calls == []


def test_an_early_request_nobody_takes_is_closed(tmp_path: Path, data: bytes,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from cache import streams

    cache, fetch, stream = open_cache(tmp_path, data)
    with cache:
        cache.request_early(KEY, len(data))
        wait_until(lambda: len(stream.opened) == 1, "the early request")
        cache.maintain()
        assert not stream.opened[0].closed  # still young
        monkeypatch.setattr(streams, "_EARLY_TTL_S", 0.0)
        cache.maintain()
        assert stream.opened[0].closed
        cache.request_early(KEY, len(data))  # and one left at close is closed with the cache
        wait_until(lambda: len(stream.opened) == 2, "the second early request")
    assert stream.opened[1].closed
    assert fetch.calls == []


def test_an_adaptive_window_grows_as_a_sequential_reader_moves_on(tmp_path: Path,
                                                                 data: bytes) -> None:
    """`cloud_storage_chunk_prefetch` not set: one chunk ahead once the reader reads
    sequentially, then twice as many at each chunk it moves on to; still one request."""
    cache, fetch, stream = open_cache(tmp_path, data, prefetch=None, strategy="lru")
    with cache:
        starts = layout(data, CHUNK)
        assert len(starts) > 12
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))

        def stored(n: int) -> None:
            wait_until(lambda: cache.stats()["hydrated_chunks"] == n, f"{n} chunks stored")
            assert stream.opened[0].pos == starts[n]  # parked: the window ends there

        seg.read(0, 100, reader="c")  # a first read: nothing known, nothing ahead
        stored(1)
        assert cache.read_ahead_window("c") == 0
        seg.read(100, 200, reader="c")  # sequential: one chunk ahead
        stored(2)
        seg.read(200, 300, reader="c")  # still chunk 0: the window stays
        assert cache.read_ahead_window("c") == 1
        for index, window in ((1, 2), (2, 4), (3, 8)):
            seg.read(starts[index], starts[index] + 100, reader="c")
            assert cache.read_ahead_window("c") == window
            stored(index + window + 1)
        assert fetch.calls == [] and len(stream.opened) == 1
        cache.close_reader("c")


def test_a_random_reader_gets_no_read_ahead(tmp_path: Path, data: bytes) -> None:
    """Jumps within a segment: every read downloads its own chunk and nothing more, and no
    stream runs ahead of the reader."""
    cache, fetch, stream = open_cache(tmp_path, data, prefetch=None, strategy="lru")
    with cache:
        starts = layout(data, CHUNK)
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        jumps = [5, 1, 9, 3, 12, 7]
        for index in jumps:
            begin = starts[index] + 10
            assert seg.read(begin, begin + 100, reader="r") == data[begin:begin + 100]
            assert cache.read_ahead_window("r") == 0
        wait_until(lambda: cache.stats()["hydrated_chunks"] == len(jumps), "the reads' chunks")
        size = {i: (starts[i + 1] if i + 1 < len(starts) else len(data)) - starts[i]
                for i in jumps}
        assert cache.stats()["bytes_downloaded"] == sum(size.values())
        # the first read (a reader nothing is known of) may open a stream; it stays at the
        # chunk after that read's, and every later read is one ranged GET of its own chunk
        assert len(stream.opened) <= 1
        assert all(s.pos <= starts[jumps[0] + 1] for s in stream.opened)
        assert sorted(c[1] for c in fetch.calls) == sorted(starts[i] for i in jumps[1:])
        assert cache.stats()["prefetches"] == 0
