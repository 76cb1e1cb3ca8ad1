"""ChunkCache: ranged chunk downloads, single-flight, strategies applied, read-ahead, restart."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest
from cache_fakes import Fetcher, layout, make_segment, verifier

from cache.accounting import CacheSettings
from cache.chunk_cache import ChunkCache
from cache.chunks import chunks_for_range
from cache.disk import TMP_STALE_S
from cache.errors import CacheError

KEY = "ab12cd34/kafka/orders/0_7/0-255-1.log"
CHUNK = 8 * 1024


class Inline(Executor):
    """Runs submitted work at once, so read-ahead is deterministic."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def settings(**overrides: Any) -> CacheSettings:
    # read-ahead off unless a test asks for it: these tests count the reads' own downloads
    base: dict[str, Any] = {"size_bytes": 64 * CHUNK, "chunk_size": CHUNK, "chunk_prefetch": 0}
    base.update(overrides)
    return CacheSettings(**base)


@pytest.fixture
def data() -> bytes:
    return make_segment()


def open_cache(tmp_path: Path, fetch: Fetcher, **kwargs: Any) -> ChunkCache:
    s = kwargs.pop("settings", settings())
    return ChunkCache(tmp_path / "cache", s, fetch, disk_capacity=1 << 40, **kwargs)


def test_a_read_downloads_only_the_covering_chunk(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, strategy="lru")
    starts = layout(data, CHUNK)
    assert len(starts) > 4
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    begin = starts[2] + 100
    assert seg.read(begin, begin + 500) == data[begin : begin + 500]
    assert fetch.calls == [(KEY, starts[2], starts[3])]
    assert fetch.fetched_bytes == starts[3] - starts[2] < len(data)
    chunk_file = tmp_path / "cache" / f"{KEY}_chunks" / str(starts[2])
    assert chunk_file.read_bytes() == data[starts[2] : starts[3]]
    # again: served from disk
    assert seg.read(begin, begin + 500) == data[begin : begin + 500]
    assert len(fetch.calls) == 1
    stats = cache.stats()
    assert (stats["hits"], stats["misses"]) == (1, 1)
    assert stats["bytes_downloaded"] == fetch.fetched_bytes
    assert stats["hydrated_chunks"] == 1


def test_a_range_across_chunks_fetches_each_once(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, strategy="lru")
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    begin, end = starts[1] - 10, starts[3] + 10
    assert seg.read(begin, end) == data[begin:end]
    assert [c[1] for c in fetch.calls] == [starts[i] for i in chunks_for_range(starts, begin, end)]
    assert fetch.fetched_bytes == (starts[4] - starts[0])
    assert seg.read(0, len(data)) == data
    assert fetch.fetched_bytes == len(data)


def test_whole_segment_mode_downloads_the_object_once(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, settings=settings(disable_chunk_reads=True),
                       strategy="lru")
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    assert seg.chunk_starts == (0,)
    assert seg.read(5000, 5100) == data[5000:5100]
    assert seg.read(100, 200) == data[100:200]
    assert fetch.calls == [(KEY, 0, len(data))]
    assert (tmp_path / "cache" / KEY).read_bytes() == data


def test_bad_requests_are_clear_errors(tmp_path: Path, data: bytes) -> None:
    cache = open_cache(tmp_path, Fetcher({KEY: data}))
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK))
    with pytest.raises(CacheError, match="outside"):
        seg.read(0, len(data) + 1)
    for key in ("../escape.log", "/abs.log", "a//b.log", ""):
        with pytest.raises(CacheError, match="not usable"):
            cache.open_segment(key, 10, [0])
    with pytest.raises(CacheError, match="chunk starts"):
        cache.open_segment(KEY, len(data), [0, 50, 20])
    assert cache.open_segment(KEY, 0, []).read(0, 0) == b""


def test_concurrent_readers_of_one_chunk_share_one_download(tmp_path: Path, data: bytes) -> None:
    release = threading.Event()
    fetch = Fetcher({KEY: data}, during=lambda: release.wait(10))
    cache = open_cache(tmp_path, fetch, strategy="lru")
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    results: list[bytes] = []

    def read() -> None:
        results.append(seg.read(10, 2000))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for _ in range(1000):  # wait until the seven others are waiting on the first download
        if cache.stats()["joined"] == 7:
            break
        time.sleep(0.005)
    release.set()
    for t in threads:
        t.join()
    assert results == [data[10:2000]] * 8
    assert len(fetch.calls) == 1
    assert cache.stats()["joined"] == 7


def test_eager_drops_a_chunk_once_its_reader_moves_on(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, strategy="eager")
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    chunk_dir = tmp_path / "cache" / f"{KEY}_chunks"
    seg.read(0, 100, reader="c1")  # inside chunk 0: held for c1
    seg.read(100, 200, reader="c1")
    assert len(fetch.calls) == 1
    assert sorted(p.name for p in chunk_dir.iterdir()) == ["0"]
    seg.read(starts[1], starts[1] + 10, reader="c1")  # moved on: chunk 0 released
    assert sorted(p.name for p in chunk_dir.iterdir()) == [str(starts[1])]
    seg.read(starts[3], starts[3] + 10)  # no reader: nothing holds it afterwards
    assert sorted(p.name for p in chunk_dir.iterdir()) == [str(starts[1])]
    cache.close_reader("c1")
    assert list(chunk_dir.iterdir()) == []
    assert cache.stats()["evictions"] == 3


def test_capped_keeps_a_segment_at_its_cap(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    s = settings(hydrated_chunks_per_segment_ratio=0.5, min_chunks_per_segment_threshold=2)
    cache = open_cache(tmp_path, fetch, settings=s, strategy="capped")
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    for start in starts:
        seg.read(start, start + 1)
    assert cache.stats()["hydrated_chunks"] == len(starts) // 2


def test_predictive_keeps_what_a_registered_reader_will_read(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    starts = layout(data, CHUNK)
    cap = 3.5 / len(starts)  # three chunks may stay
    s = settings(hydrated_chunks_per_segment_ratio=cap, min_chunks_per_segment_threshold=0)
    cache = open_cache(tmp_path, fetch, settings=s, strategy="predictive")
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    seg.expect("laggard", starts[1], starts[2] + 1)  # will read chunks 1 and 2
    for start in starts[:6]:
        seg.read(start, start + 1)
    chunk_dir = tmp_path / "cache" / f"{KEY}_chunks"
    kept = sorted(int(p.name) for p in chunk_dir.iterdir())
    assert set(starts[1:3]) <= set(kept) and len(kept) == 3
    calls = len(fetch.calls)
    seg.read(starts[1], starts[1] + 1, reader="laggard")
    seg.read(starts[2], starts[2] + 1, reader="laggard")
    assert len(fetch.calls) == calls


def test_sequential_reader_prefetches_the_next_chunks(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, settings=settings(chunk_prefetch=2),
                       strategy="eager", prefetch_executor=Inline())
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    seg.read(0, 100, reader="c")  # first read: not yet known to be sequential
    assert len(fetch.calls) == 1
    seg.read(100, starts[1] + 10, reader="c")  # continues: sequential, fetch chunks 2 and 3
    assert [c[1] for c in fetch.calls] == starts[:4]
    calls = len(fetch.calls)
    seg.read(starts[1] + 10, starts[2] + 10, reader="c")
    seg.read(starts[2] + 10, starts[3] + 10, reader="c")
    stats = cache.stats()
    assert stats["prefetches"] >= 2
    # chunks 2 and 3 were waiting; the reads only started prefetches further ahead
    assert all(c[1] > starts[3] for c in fetch.calls[calls:])
    # a random reader prefetches nothing
    other = Fetcher({KEY: data})
    cache2 = open_cache(tmp_path / "2", other, settings=settings(chunk_prefetch=2),
                        prefetch_executor=Inline())
    seg2 = cache2.open_segment(KEY, len(data), starts, verifier(KEY))
    seg2.read(starts[5], starts[5] + 1, reader="r")
    seg2.read(starts[1], starts[1] + 1, reader="r")
    assert len(other.calls) == 2


def test_idle_readers_lose_their_holds(tmp_path: Path, data: bytes) -> None:
    now = [1000.0]
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, strategy="eager", clock=lambda: now[0],
                       reader_idle_s=60)
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    seg.read(0, 10, reader="gone")
    cache.maintain()
    assert cache.stats()["hydrated_chunks"] == 1
    now[0] += 61
    cache.maintain()
    assert cache.stats()["hydrated_chunks"] == 0
    assert cache.stats()["readers"] == 0


def test_the_cache_survives_a_restart(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    starts = layout(data, CHUNK)
    with open_cache(tmp_path, fetch, strategy="lru") as cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.read(0, starts[3])
        before = cache.stats()
    leftover = tmp_path / "cache" / f"{KEY}_chunks" / f"{starts[5]}.tmp-deadbeef"
    leftover.write_bytes(b"half a chunk")  # what a crash mid-write leaves
    stale = time.time() - TMP_STALE_S - 1
    os.utime(leftover, (stale, stale))
    # a fresh one may be another process's write in progress: it stays
    writing = tmp_path / "cache" / f"{KEY}_chunks" / f"{starts[6]}.tmp-cafebabe"
    writing.write_bytes(b"being written")
    with open_cache(tmp_path, fetch, strategy="lru") as cache:
        assert not leftover.exists()
        assert writing.exists()
        after = cache.stats()
        assert (after["size_bytes"], after["objects"]) == (before["size_bytes"], 3)
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        assert seg.read(0, starts[3]) == data[: starts[3]]
        assert len(fetch.calls) == 3 and cache.stats()["hits"] == 3


def test_restart_without_the_index_verifies_before_serving(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    starts = layout(data, CHUNK)
    with open_cache(tmp_path, fetch, strategy="lru") as cache:
        cache.open_segment(KEY, len(data), starts, verifier(KEY)).read(0, 10)
    (tmp_path / "cache" / ".tiered-cache-index.json").unlink()
    chunk_file = tmp_path / "cache" / f"{KEY}_chunks" / "0"
    bad = bytearray(chunk_file.read_bytes())
    bad[100] ^= 0x01
    chunk_file.write_bytes(bytes(bad))
    with open_cache(tmp_path, fetch, strategy="lru") as cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        assert seg.read(0, 10) == data[:10]
        assert cache.stats()["corrupt_discarded"] == 1
        assert len(fetch.calls) == 2


def test_ranged_gets_against_s3(tmp_path: Path, data: bytes, s3_store: Any) -> None:
    """The same chunk reads over boto3 and HTTP (moto): only the covering bytes travel."""
    s3_store.put(KEY, data)
    fetched: list[int] = []

    def fetch(key: str, begin: int, end: int) -> bytes:
        out: bytes = s3_store.get(key, (begin, end))
        fetched.append(len(out))
        return out

    starts = layout(data, CHUNK)
    cache = ChunkCache(tmp_path / "c", settings(), fetch, strategy="lru", disk_capacity=1 << 40)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    begin = starts[4] + 7
    assert seg.read(begin, begin + 3000) == data[begin : begin + 3000]
    covering = chunks_for_range(starts, begin, begin + 3000)
    ends = [*starts[1:], len(data)]
    assert fetched == [ends[i] - starts[i] for i in covering]
    assert sum(fetched) < len(data) / 4
    assert cache.stats()["bytes_downloaded"] == sum(fetched)


def test_read_ahead_on_the_caches_own_threads(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    starts = layout(data, CHUNK)
    with open_cache(tmp_path, fetch, settings=settings(chunk_prefetch=3),
                    strategy="eager") as cache:
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        seg.read(0, 10, reader="c")
        seg.read(10, starts[1] + 10, reader="c")  # sequential: chunks 2, 3, 4 come ahead
        for _ in range(2000):
            if cache.stats()["prefetches"] == 3 and cache.stats()["hydrated_chunks"] == 4:
                break
            time.sleep(0.005)
        assert cache.stats()["prefetches"] == 3
        calls = len(fetch.calls)
        assert seg.read(starts[2], starts[4] + 5, reader="c") == data[starts[2] : starts[4] + 5]
        assert cache.stats()["hits"] >= 3
        assert all(c[1] > starts[4] for c in fetch.calls[calls:])


def test_a_reader_that_is_not_a_session_reads_nothing_ahead(tmp_path: Path,
                                                           data: bytes) -> None:
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, settings=settings(chunk_prefetch=2),
                       strategy="eager", prefetch_executor=Inline())
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    seg.read(0, 100, reader="once", session=False)
    seg.read(100, starts[1] + 10, reader="once", session=False)  # sequential, yet no prefetch
    assert [c[1] for c in fetch.calls] == starts[:2]
    assert cache.stats()["prefetches"] == 0
