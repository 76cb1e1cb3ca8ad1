"""Cache settings, size / object limits and the trim plan.

The cache may hold at most `cloud_storage_cache_size` bytes and `cloud_storage_cache_size_percent`
of its disk (the smaller wins when both are set) and `cloud_storage_cache_max_objects` files.
Trimming starts when the cache reaches `cloud_storage_cache_trim_threshold_percent_size` /
`_objects` of those limits and removes unheld chunks, in the eviction strategy's victim order,
until it is below the threshold again. Pure: the cache applies the plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tiered.errors import ConfigError

__all__ = ["CacheLimits", "CacheSettings", "plan_trim"]

MiB = 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class CacheSettings:
    """The read cache's configuration, by Redpanda's property names (sizes in bytes)."""

    #: cloud_storage_cache_size: None when only the percentage applies
    size_bytes: int | None = None
    #: cloud_storage_cache_size_percent of the cache disk's capacity (0: no percentage limit)
    size_percent: float = 20.0
    #: cloud_storage_cache_max_objects
    max_objects: int = 100_000
    #: cloud_storage_cache_trim_threshold_percent_size
    trim_threshold_percent_size: float = 100.0
    #: cloud_storage_cache_trim_threshold_percent_objects
    trim_threshold_percent_objects: float = 100.0
    #: cloud_storage_cache_check_interval_ms: period of the background size check
    check_interval_ms: int = 30_000
    #: cloud_storage_cache_chunk_size
    chunk_size: int = 16 * MiB
    #: cloud_storage_chunk_eviction_strategy
    eviction_strategy: str = "eager"
    #: cloud_storage_hydrated_chunks_per_segment_ratio
    hydrated_chunks_per_segment_ratio: float = 0.7
    #: cloud_storage_min_chunks_per_segment_threshold
    min_chunks_per_segment_threshold: int = 5
    #: cloud_storage_disable_chunk_reads: download whole segments
    disable_chunk_reads: bool = False
    #: cloud_storage_chunk_prefetch: chunks read ahead of a sequential reader; None (not set):
    #: an adaptive window per reader (`cache.readahead`); 0: no read-ahead
    chunk_prefetch: int | None = None
    #: cloud_storage_cache_memory_size (tiered's own): memory for streamed chunks not written
    #: to the cache directory yet (`cache.buffers`); 0: every chunk is written as it arrives
    memory_bytes: int = 128 * MiB

    def __post_init__(self) -> None:
        problems = []
        if self.size_bytes is not None and self.size_bytes < 1:
            problems.append(f"cloud_storage_cache_size must be positive, got {self.size_bytes}")
        if not 0 <= self.size_percent <= 100:
            problems.append(
                f"cloud_storage_cache_size_percent must be within [0, 100], got {self.size_percent}"
            )
        if self.size_bytes is None and self.size_percent <= 0:
            problems.append("cloud_storage_cache_size or cloud_storage_cache_size_percent must "
                            "be set: the cache needs a size limit")
        if self.max_objects < 1:
            problems.append(
                f"cloud_storage_cache_max_objects must be at least 1, got {self.max_objects}"
            )
        for name, value in (
            ("cloud_storage_cache_trim_threshold_percent_size", self.trim_threshold_percent_size),
            ("cloud_storage_cache_trim_threshold_percent_objects",
             self.trim_threshold_percent_objects),
        ):
            if not 0 <= value <= 100:
                problems.append(f"{name} must be within [0, 100], got {value}")
        if self.check_interval_ms < 1:
            problems.append("cloud_storage_cache_check_interval_ms must be positive, got "
                            f"{self.check_interval_ms}")
        if self.chunk_size < 1:
            problems.append(
                f"cloud_storage_cache_chunk_size must be positive, got {self.chunk_size}"
            )
        if self.memory_bytes < 0:
            problems.append(
                f"cloud_storage_cache_memory_size must not be negative, got {self.memory_bytes}"
            )
        if self.chunk_prefetch is not None and self.chunk_prefetch < 0:
            problems.append(
                f"cloud_storage_chunk_prefetch must not be negative, got {self.chunk_prefetch}"
            )
        if problems:
            raise ConfigError("; ".join(problems), problems)

    @classmethod
    def from_cluster(cls, cluster: Mapping[str, object]) -> CacheSettings:
        """From resolved cluster properties (`tiered.config.Config.cluster`); missing keys take
        the defaults."""
        d = cls()

        def num(name: str, default: float) -> float:
            value = cluster.get(name)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{name} must be a number, got {value!r}")
            return value

        size = cluster.get("cloud_storage_cache_size")
        return cls(
            size_bytes=None if size is None else int(num("cloud_storage_cache_size", 0)),
            size_percent=num("cloud_storage_cache_size_percent", d.size_percent),
            max_objects=int(num("cloud_storage_cache_max_objects", d.max_objects)),
            trim_threshold_percent_size=num(
                "cloud_storage_cache_trim_threshold_percent_size", d.trim_threshold_percent_size
            ),
            trim_threshold_percent_objects=num(
                "cloud_storage_cache_trim_threshold_percent_objects",
                d.trim_threshold_percent_objects,
            ),
            check_interval_ms=int(
                num("cloud_storage_cache_check_interval_ms", d.check_interval_ms)
            ),
            chunk_size=int(num("cloud_storage_cache_chunk_size", d.chunk_size)),
            eviction_strategy=str(
                cluster.get("cloud_storage_chunk_eviction_strategy") or d.eviction_strategy
            ),
            hydrated_chunks_per_segment_ratio=num(
                "cloud_storage_hydrated_chunks_per_segment_ratio",
                d.hydrated_chunks_per_segment_ratio,
            ),
            min_chunks_per_segment_threshold=int(
                num("cloud_storage_min_chunks_per_segment_threshold",
                    d.min_chunks_per_segment_threshold)
            ),
            disable_chunk_reads=bool(cluster.get("cloud_storage_disable_chunk_reads", False)),
            chunk_prefetch=None if cluster.get("cloud_storage_chunk_prefetch") is None
            else int(num("cloud_storage_chunk_prefetch", 0)),
            memory_bytes=int(num("cloud_storage_cache_memory_size", d.memory_bytes)),
        )

    def limits(self, disk_capacity: int) -> CacheLimits:
        """The byte and object limits and trim thresholds for a cache on a disk of
        `disk_capacity` bytes."""
        candidates = []
        if self.size_bytes is not None:
            candidates.append(self.size_bytes)
        if self.size_percent > 0:
            candidates.append(math.floor(disk_capacity * self.size_percent / 100))
        max_bytes = max(min(candidates), 1)
        return CacheLimits(
            max_bytes=max_bytes,
            max_objects=self.max_objects,
            trim_bytes=math.floor(max_bytes * self.trim_threshold_percent_size / 100),
            trim_objects=math.floor(self.max_objects * self.trim_threshold_percent_objects / 100),
        )


@dataclass(frozen=True)
class CacheLimits:
    """Hard limits and the levels at which trimming starts (bytes, files)."""

    max_bytes: int
    max_objects: int
    trim_bytes: int
    trim_objects: int

    def over_threshold(self, used_bytes: int, objects: int) -> bool:
        """Whether a cache holding this much has reached a trim threshold (or a limit)."""
        return (
            used_bytes > min(self.trim_bytes, self.max_bytes)
            or objects > min(self.trim_objects, self.max_objects)
        )


def plan_trim(
    victims: Sequence[tuple[T, int]],
    used_bytes: int,
    objects: int,
    *,
    target_bytes: int,
    target_objects: int,
) -> list[T]:
    """The prefix of `victims` ((id, size) in trim order) to remove so that the cache holds at
    most `target_bytes` and `target_objects`; everything it can when even all of them do not
    suffice (the caller decides whether to wait or overshoot)."""
    chosen: list[T] = []
    for victim, size in victims:
        if used_bytes <= target_bytes and objects <= target_objects:
            break
        chosen.append(victim)
        used_bytes -= size
        objects -= 1
    return chosen
