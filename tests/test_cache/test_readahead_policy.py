"""The read-ahead window policy (`cache.readahead`), pure: grows x2 per chunk a sequential
reader moves on to, up to a cap the cache's budget bounds; closes on a jump; fixed when
`cloud_storage_chunk_prefetch` is set, off at 0."""

from __future__ import annotations

import pytest

from cache.accounting import CacheSettings
from cache.eviction import ChunkId
from cache.read_sessions import ReaderTable
from cache.readahead import MAX_WINDOW, ReadAheadPolicy, ReadAheadWindow

MiB = 1 << 20


def adaptive(cap: int = 8) -> ReadAheadWindow:
    return ReadAheadPolicy(None, cap).new_window()


def test_a_sequential_reader_opens_at_one_chunk_and_doubles_per_chunk_up_to_the_cap() -> None:
    window = adaptive(cap=8)
    assert window.on_read(sequential=False, moved=True) == 0  # a first read: not judged yet
    assert window.on_read(sequential=True, moved=False) == 1  # the next fetch in that chunk
    assert window.on_read(sequential=True, moved=False) == 1  # more fetches of that chunk
    sizes = [window.on_read(sequential=True, moved=True) for _ in range(5)]
    assert sizes == [2, 4, 8, 8, 8]


def test_fetches_within_one_chunk_do_not_grow_the_window() -> None:
    window = adaptive()
    window.on_read(sequential=True, moved=True)
    assert [window.on_read(sequential=True, moved=False) for _ in range(16)] == [1] * 16


def test_a_jump_closes_the_window_and_it_grows_again_from_one() -> None:
    window = adaptive()
    for _ in range(4):
        window.on_read(sequential=True, moved=True)
    assert window.size == 8
    assert window.on_read(sequential=False, moved=True) == 0
    assert window.on_read(sequential=True, moved=True) == 1
    assert window.on_read(sequential=True, moved=True) == 2


def test_a_random_reader_never_gets_a_window() -> None:
    window = adaptive()
    assert {window.on_read(sequential=False, moved=m) for m in (True, False) * 10} == {0}


@pytest.mark.parametrize("fixed", [1, 2, 5])
def test_a_set_prefetch_is_a_fixed_window_for_sequential_reads(fixed: int) -> None:
    window = ReadAheadPolicy(fixed, 8).new_window()
    assert window.on_read(sequential=True, moved=True) == fixed
    assert window.on_read(sequential=True, moved=True) == fixed
    assert window.on_read(sequential=False, moved=True) == 0


def test_prefetch_zero_is_off() -> None:
    policy = ReadAheadPolicy(0, 8)
    assert not policy.enabled
    window = policy.new_window()
    assert [window.on_read(sequential=True, moved=True) for _ in range(3)] == [0, 0, 0]


def test_the_cap_is_bounded_by_the_cache_budget() -> None:
    # plenty of room: MAX_WINDOW chunks
    assert ReadAheadPolicy.from_settings(None, 16 * MiB, 100 << 30).cap == MAX_WINDOW
    # one reader's window at most 1/8 of the cache: 256 MiB / 8 = two 16 MiB chunks
    assert ReadAheadPolicy.from_settings(None, 16 * MiB, 256 * MiB).cap == 2
    # a cache smaller than 8 chunks still reads one ahead
    assert ReadAheadPolicy.from_settings(None, 16 * MiB, 32 * MiB).cap == 1
    assert ReadAheadPolicy.from_settings(3, 16 * MiB, 32 * MiB).largest == 3


def test_unset_prefetch_means_adaptive_and_zero_stays_off() -> None:
    assert CacheSettings().chunk_prefetch is None
    assert CacheSettings.from_cluster({}).chunk_prefetch is None
    assert CacheSettings.from_cluster({"cloud_storage_chunk_prefetch": None}).chunk_prefetch is None
    assert CacheSettings.from_cluster({"cloud_storage_chunk_prefetch": 0}).chunk_prefetch == 0
    assert CacheSettings.from_cluster({"cloud_storage_chunk_prefetch": 2}).chunk_prefetch == 2
    assert ReadAheadPolicy.from_settings(None, MiB, 1 << 30).adaptive
    assert not ReadAheadPolicy.from_settings(0, MiB, 1 << 30).enabled


def test_the_reader_table_holds_the_window_of_chunks_ahead() -> None:
    """Through `ReaderTable`: 1 MiB reads of a segment of 16 chunks of 16 MiB."""
    chunks = [ChunkId("seg", i * 16 * MiB) for i in range(16)]
    table, policy = ReaderTable(), ReadAheadPolicy(None, 4)
    ahead = []
    for fetch in range(6 * 16):  # six chunks read in 1 MiB fetches
        index = fetch // 16
        out = table.after_read("r", chunks, index, index, inside_last=True, prefetch=policy,
                               now=0.0)
        ahead.append(len(out.prefetch))
    assert ahead[0] == 0  # the first read: not sequential yet
    assert ahead[1:16] == [1] * 15
    # each chunk it moves on to doubles it, up to the cap
    assert [ahead[16 * i] for i in range(1, 6)] == [2, 4, 4, 4, 4]
    assert table.window("r") == 4
    # a jump back: nothing ahead any more
    out = table.after_read("r", chunks, 1, 1, inside_last=True, prefetch=policy, now=0.0)
    assert out.prefetch == () and table.window("r") == 0
