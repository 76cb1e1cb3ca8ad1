"""Cache settings from the configuration, limits (the smaller wins), and trimming to the
thresholds."""

from __future__ import annotations

from pathlib import Path

import pytest
from cache_fakes import Fetcher, layout, make_segment, verifier

from cache.accounting import CacheSettings, plan_trim
from cache.chunk_cache import ChunkCache
from tiered.config import default_config
from tiered.errors import ConfigError

KEY = "ab12cd34/kafka/orders/0_7/0-255-1.log"


def test_settings_from_the_default_configuration(tmp_path: Path) -> None:
    s = CacheSettings.from_cluster(default_config(tmp_path).cluster)
    assert s == CacheSettings()
    assert (s.chunk_size, s.eviction_strategy, s.size_percent) == (16 << 20, "eager", 20.0)


def test_settings_from_cluster_overrides() -> None:
    s = CacheSettings.from_cluster({
        "cloud_storage_cache_size": 1 << 30,
        "cloud_storage_chunk_eviction_strategy": "predictive",
        "cloud_storage_chunk_prefetch": 3,
        "cloud_storage_disable_chunk_reads": True,
    })
    assert (s.size_bytes, s.eviction_strategy, s.chunk_prefetch, s.disable_chunk_reads) == (
        1 << 30, "predictive", 3, True)
    with pytest.raises(ConfigError, match="cloud_storage_cache_max_objects"):
        CacheSettings.from_cluster({"cloud_storage_cache_max_objects": "many"})
    with pytest.raises(ConfigError, match="needs a size limit"):
        CacheSettings(size_percent=0)


def test_the_smaller_limit_wins() -> None:
    disk = 100 << 30
    assert CacheSettings(size_bytes=None, size_percent=20).limits(disk).max_bytes == 20 << 30
    assert CacheSettings(size_bytes=1 << 30, size_percent=20).limits(disk).max_bytes == 1 << 30
    assert CacheSettings(size_bytes=50 << 30, size_percent=20).limits(disk).max_bytes == 20 << 30
    assert CacheSettings(size_bytes=5 << 30, size_percent=0).limits(disk).max_bytes == 5 << 30
    lim = CacheSettings(size_bytes=1000, max_objects=10, trim_threshold_percent_size=70,
                        trim_threshold_percent_objects=50).limits(disk)
    assert (lim.trim_bytes, lim.trim_objects) == (700, 5)
    assert lim.over_threshold(701, 1) and lim.over_threshold(0, 6)
    assert not lim.over_threshold(700, 5)


def test_plan_trim_takes_a_prefix_until_below_both_targets() -> None:
    victims = [("a", 10), ("b", 10), ("c", 10)]
    assert plan_trim(victims, 30, 3, target_bytes=15, target_objects=3) == ["a", "b"]
    assert plan_trim(victims, 30, 3, target_bytes=100, target_objects=2) == ["a"]
    assert plan_trim(victims, 30, 3, target_bytes=0, target_objects=0) == ["a", "b", "c"]
    assert plan_trim(victims, 30, 3, target_bytes=30, target_objects=3) == []


def test_the_periodic_check_trims_least_recently_used_below_the_threshold(
    tmp_path: Path,
) -> None:
    data = make_segment()
    starts = layout(data, 4096)
    now = [0.0]
    s = CacheSettings(size_bytes=len(data), chunk_size=4096, trim_threshold_percent_size=100)
    fetch = Fetcher({KEY: data})
    cache = ChunkCache(tmp_path, s, fetch, strategy="lru", disk_capacity=1 << 40,
                       clock=lambda: now[0])
    seg = cache.open_segment(KEY, len(data), starts, verifier(KEY))
    for start in starts:  # chunk i last used at time i
        now[0] += 1
        seg.read(start, start + 1)
    assert cache.stats()["size_bytes"] == len(data)
    cache.close()
    lowered = CacheSettings(size_bytes=len(data), chunk_size=4096, trim_threshold_percent_size=50)
    cache = ChunkCache(tmp_path, lowered, fetch, strategy="lru", disk_capacity=1 << 40)
    stats = cache.stats()
    assert stats["size_bytes"] <= len(data) // 2
    kept = sorted(int(p.name) for p in (tmp_path / f"{KEY}_chunks").iterdir())
    assert kept == starts[len(starts) - len(kept):]  # the most recently used survived
