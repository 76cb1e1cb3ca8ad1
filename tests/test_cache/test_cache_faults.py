"""The cache under faults and pressure: store errors mid-download, corrupt downloads and files,
a full disk, and many concurrent readers against small limits. Every read either returns the
right bytes or raises a clear TieredError; nothing bad is ever left on disk or served."""

from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from cache_fakes import Fetcher, layout, make_segment, verifier

from cache.accounting import CacheSettings
from cache.chunk_cache import ChunkCache
from cache.errors import CacheError, CacheFullError, ChunkDownloadError
from cache.eviction import STRATEGIES
from tiered.errors import CorruptSegmentError
from tiered.store.errors import StoreError

KEY = "ab12cd34/kafka/orders/0_7/0-255-1.log"
CHUNK = 8 * 1024


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".tiered"))


def open_cache(root: Path, fetch: Fetcher, **kwargs: Any) -> ChunkCache:
    s = kwargs.pop("settings", CacheSettings(size_bytes=64 * CHUNK, chunk_size=CHUNK))
    return ChunkCache(root, s, fetch, disk_capacity=1 << 40, strategy="lru", **kwargs)


@pytest.fixture
def data() -> bytes:
    return make_segment()


def test_a_store_error_surfaces_and_the_next_read_succeeds(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data}, faults=[StoreError("GET failed: connection reset")])
    cache = open_cache(tmp_path, fetch)
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    with pytest.raises(ChunkDownloadError, match="connection reset") as caught:
        seg.read(0, 100)
    assert isinstance(caught.value.__cause__, StoreError)
    assert files(tmp_path) == []
    assert cache.stats()["size_bytes"] == 0 and cache.stats()["download_errors"] == 1
    assert seg.read(0, 100) == data[:100]


def test_a_foreign_exception_from_the_fetcher_is_wrapped(tmp_path: Path, data: bytes) -> None:
    fetch = Fetcher({KEY: data}, faults=[ConnectionResetError("peer reset")])
    seg = open_cache(tmp_path, fetch).open_segment(KEY, len(data), layout(data, CHUNK))
    with pytest.raises(ChunkDownloadError, match="ConnectionResetError: peer reset"):
        seg.read(0, 100)


def test_waiting_readers_get_the_downloaders_error(tmp_path: Path, data: bytes) -> None:
    gate = threading.Event()
    fetch = Fetcher({KEY: data}, faults=[StoreError("boom")], during=lambda: gate.wait(10))
    cache = open_cache(tmp_path, fetch)
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    errors: list[BaseException] = []

    def read() -> None:
        try:
            seg.read(0, 100)
        except ChunkDownloadError as err:
            errors.append(err)

    threads = [threading.Thread(target=read) for _ in range(2)]
    threads[0].start()
    while not fetch.calls:
        threading.Event().wait(0.005)
    threads[1].start()
    while cache.stats()["joined"] < 1:
        threading.Event().wait(0.005)
    gate.set()
    for t in threads:
        t.join()
    assert len(errors) == 2 and len(fetch.calls) == 1
    assert seg.read(0, 100) == data[:100]


@pytest.mark.parametrize("fault", ["corrupt", "short"])
def test_a_bad_download_is_discarded_and_fetched_again(
    tmp_path: Path, data: bytes, fault: str
) -> None:
    fetch = Fetcher({KEY: data}, faults=[fault])
    cache = open_cache(tmp_path, fetch)
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    assert seg.read(0, 100) == data[:100]
    assert len(fetch.calls) == 2


def test_a_download_that_stays_bad_is_an_error_and_never_cached(
    tmp_path: Path, data: bytes
) -> None:
    fetch = Fetcher({KEY: data}, faults=["corrupt"] * 3)
    cache = open_cache(tmp_path, fetch)
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    with pytest.raises(CorruptSegmentError, match="3 downloads") as caught:
        seg.read(0, 100)
    assert caught.value.path == KEY and caught.value.position == 0
    assert len(fetch.calls) == 3 and files(tmp_path) == []
    assert seg.read(0, 100) == data[:100]


def test_a_corrupted_file_on_disk_is_detected_and_fetched_again(
    tmp_path: Path, data: bytes
) -> None:
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch)
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    seg.read(0, 100)
    chunk_file = tmp_path / f"{KEY}_chunks" / "0"
    bad = bytearray(chunk_file.read_bytes())
    bad[-5] ^= 0x40
    chunk_file.write_bytes(bytes(bad))
    assert seg.read(starts[1] - 10, starts[1]) == data[starts[1] - 10 : starts[1]]
    assert cache.stats()["corrupt_discarded"] == 1
    assert len(fetch.calls) == 2
    assert chunk_file.read_bytes() == data[: starts[1]]
    chunk_file.unlink()  # removed behind the cache's back: fetched again too
    assert seg.read(0, 10) == data[:10]
    assert len(fetch.calls) == 3


class FullDisk:
    """An os.write that fills up after `room` bytes, until `free()`."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.full = True

    def __call__(self, fd: int, view: memoryview) -> int:
        if self.full:
            if self.room <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = min(self.room, len(view))
            self.room -= n
            return os.write(fd, view[:n])
        return os.write(fd, view)


def test_a_full_disk_is_a_clear_error_and_leaves_nothing(tmp_path: Path, data: bytes) -> None:
    disk = FullDisk(room=1000)  # part of a chunk fits, then ENOSPC
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch, write=disk)
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    with pytest.raises(CacheFullError, match="disk is full"):
        seg.read(0, 100)
    assert files(tmp_path) == []  # not even the temporary file
    assert cache.stats()["size_bytes"] == 0 and cache.stats()["objects"] == 0
    disk.full = False
    assert seg.read(0, 100) == data[:100]


def test_a_cache_dir_that_cannot_be_written_is_one_clear_error_at_start(tmp_path: Path) -> None:
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a directory")
    with pytest.raises(CacheError,
                       match=r"cache directory .*a-file/cache is not usable.*\[cache\] dir"):
        open_cache(in_the_way / "cache", Fetcher({}))


def test_chunk_writes_failing_are_remembered_until_one_succeeds(tmp_path: Path,
                                                                data: bytes) -> None:
    """The daemon's /health reports the cache degraded while it cannot write its chunks."""
    broken = {"on": True}

    def write(fd: int, view: memoryview) -> int:
        if broken["on"]:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return os.write(fd, view)

    cache = open_cache(tmp_path, Fetcher({KEY: data}), write=write)
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    assert cache.write_problem is None
    with pytest.raises(CacheError):
        seg.read(0, 100)
    assert cache.write_problem is not None and "Read-only" in cache.write_problem
    broken["on"] = False
    assert seg.read(0, 100) == data[:100]
    assert cache.write_problem is None


@pytest.mark.slow  # concurrent readers per strategy
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_limits_hold_within_one_chunk_under_concurrent_readers(
    tmp_path: Path, strategy: str
) -> None:
    segments = {f"ab12cd34/t/0_1/{i * 1000}-{i * 1000 + 99}-1.log": make_segment(40, 150, i * 1000)
                for i in range(4)}
    starts = {k: layout(v, 2048) for k, v in segments.items()}
    biggest = max(b - a for s, d in zip(starts.values(), segments.values(), strict=True)
                  for a, b in zip(s, [*s[1:], len(d)], strict=True))
    s = CacheSettings(size_bytes=6 * 2048, max_objects=5, chunk_size=2048, chunk_prefetch=1,
                      hydrated_chunks_per_segment_ratio=0.5, min_chunks_per_segment_threshold=2)
    violations: list[str] = []
    holder: list[ChunkCache] = []

    def check() -> None:
        st = holder[0].stats()
        if st["size_bytes"] > st["max_bytes"] + biggest or st["objects"] > st["max_objects"] + 1:
            violations.append(f"{st['size_bytes']} bytes, {st['objects']} objects")

    fetch = Fetcher(dict(segments), during=check)
    cache = ChunkCache(tmp_path, s, fetch, strategy=strategy, disk_capacity=1 << 40)
    holder.append(cache)
    handles = [cache.open_segment(k, len(v), starts[k], verifier(k)) for k, v in segments.items()]
    errors: list[BaseException] = []

    def consumer(n: int) -> None:
        rnd = random.Random(n)
        try:
            for _ in range(40):
                h = rnd.choice(handles)
                begin = rnd.randrange(h.size)
                end = min(h.size, begin + rnd.randrange(1, 3000))
                if h.read(begin, end, reader=n % 6) != segments[h.key][begin:end]:
                    errors.append(AssertionError(f"wrong bytes {h.key} [{begin}, {end})"))
                check()
        except BaseException as err:  # noqa: BLE001 - collected for the assertion below
            errors.append(err)

    threads = [threading.Thread(target=consumer, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache.close()
    assert errors == [] and violations == []
    on_disk = files(tmp_path)
    assert len(on_disk) <= 5 + 1
    assert sum(p.stat().st_size for p in on_disk) <= 6 * 2048 + biggest
    assert cache.stats()["misses"] > 0


def test_a_read_checks_only_the_blocks_it_serves(
    tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cache import disk

    monkeypatch.setattr(disk, "BLOCK", 1024)
    fetch = Fetcher({KEY: data})
    cache = open_cache(tmp_path, fetch)
    starts = layout(data, CHUNK)
    assert starts[1] > 6 * 1024
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    seg.read(0, 10)
    chunk_file = tmp_path / f"{KEY}_chunks" / "0"
    bad = bytearray(chunk_file.read_bytes())
    bad[5 * 1024 + 3] ^= 0x01
    chunk_file.write_bytes(bytes(bad))
    # block 1 is intact: served from disk without touching block 5
    assert seg.read(1024, 2048) == data[1024:2048]
    assert len(fetch.calls) == 1
    # a range over block 5 finds the damage and fetches the chunk again
    assert seg.read(5 * 1024, 5 * 1024 + 10) == data[5 * 1024 : 5 * 1024 + 10]
    assert len(fetch.calls) == 2 and cache.stats()["corrupt_discarded"] == 1


def test_past_one_chunk_over_the_limit_a_read_waits_then_fails_clearly(
    tmp_path: Path, data: bytes
) -> None:
    """Two downloads in flight fill a one-object cache (one over); a third read finds nothing
    it may trim and no overshoot left: it waits, then gives up with CacheFullError."""
    gate = threading.Event()
    fetch = Fetcher({KEY: data}, during=lambda: gate.wait(10))
    s = CacheSettings(size_bytes=64 * CHUNK, max_objects=1, chunk_size=CHUNK)
    cache = open_cache(tmp_path, fetch, settings=s, reserve_timeout_s=0.2)
    starts = layout(data, CHUNK)
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    results: dict[int, bytes] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, seg.read(starts[i], starts[i] + 10))) for i in (0, 1)]
    for t in threads:
        t.start()
    while len(fetch.calls) < 2:
        threading.Event().wait(0.005)
    assert cache.stats()["objects"] == 2 and cache.stats()["overshoots"] == 1
    with pytest.raises(CacheFullError, match="cache full: .* 2 of 1 objects"):
        seg.read(starts[2], starts[2] + 10)
    gate.set()
    for t in threads:
        t.join()
    assert results == {i: data[starts[i] : starts[i] + 10] for i in (0, 1)}
    assert seg.read(starts[2], starts[2] + 10) == data[starts[2] : starts[2] + 10]
    assert cache.stats()["objects"] == 1


def test_trimming_spares_a_chunk_a_reader_is_in_while_others_can_go(
    tmp_path: Path, data: bytes
) -> None:
    now = [0.0]
    fetch = Fetcher({KEY: data})
    starts = layout(data, CHUNK)
    s = CacheSettings(size_bytes=64 * CHUNK, max_objects=3, chunk_size=CHUNK)
    cache = open_cache(tmp_path, fetch, settings=s, clock=lambda: now[0])
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    for i, reader in ((0, "a"), (1, None), (2, None)):
        now[0] += 1
        seg.read(starts[i], starts[i] + 10, reader=reader)
    now[0] += 1
    seg.read(starts[3], starts[3] + 10)
    kept = sorted(int(p.name) for p in (tmp_path / f"{KEY}_chunks").iterdir())
    assert kept == [starts[0], starts[2], starts[3]]  # chunk 0 is oldest, but "a" is in it


def test_a_release_between_a_read_and_its_holds_cannot_evict_the_readers_chunk(
    tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session's release can run the moment a read has its bytes and before the
    reader's hold is registered; the chunk the reader goes on in must survive it, or the
    reader's next read downloads it again (seen with 4 sessions on one segment)."""
    fetch = Fetcher({KEY: data})
    cache = ChunkCache(tmp_path, CacheSettings(size_bytes=64 * CHUNK, chunk_size=CHUNK,
                                               chunk_prefetch=0), fetch,
                       disk_capacity=1 << 40, strategy="eager")
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))
    after_read = cache._reads.after_read

    def racer_releases_first(*args: Any, **kwargs: Any) -> Any:
        cache._space.apply_release(KEY)  # what another session's read of this segment would do
        return after_read(*args, **kwargs)

    monkeypatch.setattr(cache._reads, "after_read", racer_releases_first)
    assert seg.read(0, 100, reader="consumer") == data[:100]
    downloads = len(fetch.calls)
    assert seg.read(100, 200, reader="consumer") == data[100:200]
    assert len(fetch.calls) == downloads  # still cached: no second download


def test_a_failure_while_registering_holds_leaves_no_pin(
    tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk kept pinned across the hold registration is unpinned even when that fails:
    a leaked pin would keep it from ever being evicted."""
    cache = open_cache(tmp_path, Fetcher({KEY: data}))
    seg = cache.open_segment(KEY, len(data), layout(data, CHUNK), verifier(KEY))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("reader bookkeeping failed")

    monkeypatch.setattr(cache._reads, "after_read", broken)
    with pytest.raises(RuntimeError):
        seg.read(0, 100, reader="consumer")
    assert cache._state.entries and all(e.pins == 0 for e in cache._state.entries.values())
