"""Chunk files are opened and mapped once and shared by the fetches that read them: a share
keeps the verified bytes readable after eviction, the last share closes the file, and the
cache keeps only the few chunks read lately mapped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cache_fakes import Fetcher, layout, make_segment, verifier

from cache import state as cache_state
from cache.accounting import CacheSettings
from cache.chunk_cache import ChunkCache, ChunkFile
from cache.mapped import MappedFile

KEY = "ab12cd34/kafka/orders/0_7/0-1023-1.log"
CHUNK = 4 * 1024


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def data() -> bytes:
    return make_segment(batches=256)


def open_cache(tmp_path: Path, data: bytes, strategy: str = "lru") -> ChunkCache:
    settings = CacheSettings(size_bytes=1 << 30, chunk_size=CHUNK)
    return ChunkCache(tmp_path / "cache", settings, Fetcher({KEY: data}), strategy=strategy,
                      disk_capacity=1 << 40)


def read(f: ChunkFile) -> bytes:
    return bytes(f.mapping[: f.end - f.begin])


def test_the_last_share_closes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 5000)
    mapped = MappedFile(os.open(path, os.O_RDONLY), 5000)
    other = mapped.share()
    mapped.release()
    assert not mapped.closed and other.mapping[:3] == b"xxx"
    other.release()
    assert mapped.closed and mapped.mapping.closed
    with pytest.raises(OSError):
        os.fstat(mapped.fd)
    with pytest.raises(ValueError, match="closed"):
        mapped.share()


def test_a_failed_mapping_closes_the_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    before = open_fds()
    with pytest.raises(ValueError):
        MappedFile(os.open(path, os.O_RDONLY), 11)  # longer than the file
    assert open_fds() == before


def test_fetches_of_a_stored_chunk_share_one_mapping(tmp_path: Path, data: bytes) -> None:
    with open_cache(tmp_path, data) as cache:
        starts = layout(data, CHUNK)
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        first = seg.open_chunk(starts[2], starts[3] - 1)
        assert read(first) == data[starts[2]:starts[3]]
        first.close()
        fds = open_fds()
        for _ in range(20):
            again = seg.open_chunk(starts[2] + 10, starts[3] - 1)
            assert again.file is first.file and read(again) == data[starts[2]:starts[3]]
            again.close()
        assert open_fds() == fds  # nothing opened or left open per fetch
    assert first.file.closed  # the cache's share went with it: nothing left mapped
    assert open_fds() == fds - 2  # the descriptor, and the mapping's own


def test_an_evicted_chunk_stays_readable_until_its_last_fetch_is_sent(tmp_path: Path,
                                                                   data: bytes) -> None:
    with open_cache(tmp_path, data, strategy="eager") as cache:
        starts = layout(data, CHUNK)
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        held = seg.open_chunk(starts[1], starts[2] - 1, reader="c")
        seg.read(starts[3], starts[3] + 10, reader="c")  # moved on: chunk 1 is evicted
        path = cache.root / f"{KEY}_chunks" / str(starts[1])
        assert not path.exists() and not held.file.closed
        assert read(held) == data[starts[1]:starts[2]]
        held.close()
        assert held.file.closed


def test_only_the_chunks_read_lately_stay_mapped(tmp_path: Path, data: bytes) -> None:
    with open_cache(tmp_path, data) as cache:
        starts = layout(data, CHUNK)
        assert len(starts) > cache_state._MAPPED_FILES + 4
        seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
        files = []
        for i in range(cache_state._MAPPED_FILES + 4):
            f = seg.open_chunk(starts[i], starts[i + 1] - 1)
            files.append(f.file)
            f.close()
        assert len(cache._state.mapped) == cache_state._MAPPED_FILES
        assert all(f.closed for f in files[:4]) and not any(f.closed for f in files[4:])
        # a chunk no longer mapped is still cached: read again, it is mapped again
        f = seg.open_chunk(starts[0], starts[1] - 1)
        assert read(f) == data[: starts[1]] and f.file is not files[0]
        f.close()
        assert files[4].closed  # the least recently read gave its share up
