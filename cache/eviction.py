"""Chunk eviction strategies (`cloud_storage_chunk_eviction_strategy`), chosen by name from
`STRATEGIES`.

A strategy makes two decisions, both pure functions of a snapshot the cache hands it:

* `release(segment)`: which hydrated chunks of one segment to give back *voluntarily* once a
  reader lets go of one (Redpanda's chunk eviction): `eager` releases every chunk no reader
  holds, `capped` and `predictive` only down to the per-segment cap, `lru` nothing.
* `victim_order(chunks)`: in which order the cache trims unheld chunks when it needs room.
  Least recently used first for every strategy but `predictive`, which ranks by its readers'
  registered future needs and falls back to LRU among chunks no reader registered.

A chunk some reader holds is never released nor a victim: the cache filters them out before
asking, and strategies double-check. Strategies keep no mutable state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from tiered.errors import ConfigError

__all__ = [
    "STRATEGIES",
    "CappedStrategy",
    "ChunkId",
    "ChunkView",
    "EagerStrategy",
    "EvictionStrategy",
    "LruStrategy",
    "PredictiveStrategy",
    "SegmentSnapshot",
    "make_strategy",
]


class ChunkId(NamedTuple):
    """One cached object: chunk `start` (byte position) of the segment object `segment`, or the
    whole segment when `whole` (cloud_storage_disable_chunk_reads)."""

    segment: str
    start: int
    whole: bool = False


class ChunkView(NamedTuple):
    """What a strategy may know about one hydrated chunk."""

    id: ChunkId
    #: bytes on disk
    size: int
    #: last time a reader touched it (seconds, the cache's clock)
    last_access: float
    #: a read is in progress on it or a reader is positioned in it / prefetched it
    held: bool = False
    #: how many registered readers will still read it
    future_readers: int = 0
    #: chunks the nearest such reader reads before this one (0: next); None when nobody will
    next_need: int | None = None


class SegmentSnapshot(NamedTuple):
    """The hydrated chunks of one segment and how many chunks the segment has in all."""

    segment: str
    total_chunks: int
    hydrated: tuple[ChunkView, ...]


def _lru_key(chunk: ChunkView) -> tuple[float, str, int]:
    return (chunk.last_access, chunk.id.segment, chunk.id.start)


@dataclass(frozen=True)
class EvictionStrategy:
    """Base: LRU victim order, no voluntary release. Subclasses set `name` and override."""

    name: ClassVar[str] = ""
    #: whether decisions read `future_readers` / `next_need` (the cache computes them only then)
    uses_future: ClassVar[bool] = False
    #: cloud_storage_hydrated_chunks_per_segment_ratio: most hydrated chunks as a share of all
    hydrated_ratio: float = 0.7
    #: cloud_storage_min_chunks_per_segment_threshold: segments with fewer chunks are never capped
    min_chunks: int = 5

    def __post_init__(self) -> None:
        if not 0.0 <= self.hydrated_ratio <= 1.0:
            raise ConfigError(
                "cloud_storage_hydrated_chunks_per_segment_ratio must be within [0, 1], got "
                f"{self.hydrated_ratio!r}"
            )
        if self.min_chunks < 0:
            raise ConfigError(
                "cloud_storage_min_chunks_per_segment_threshold must not be negative, got "
                f"{self.min_chunks!r}"
            )

    def cap(self, total_chunks: int) -> int:
        """Most chunks of a `total_chunks`-chunk segment that may stay hydrated unheld and
        held together: all of them below the threshold, else floor(ratio x total)."""
        if total_chunks < self.min_chunks:
            return total_chunks
        return math.floor(self.hydrated_ratio * total_chunks)

    def release(self, segment: SegmentSnapshot) -> list[ChunkId]:
        """Chunks of `segment` to release now, in release order."""
        return []

    def victim_order(self, chunks: Iterable[ChunkView]) -> list[ChunkId]:
        """Every unheld chunk of `chunks`, the one to trim first first."""
        return [c.id for c in sorted((c for c in chunks if not c.held), key=_lru_key)]

    def _release_to_cap(
        self, segment: SegmentSnapshot, order: Sequence[ChunkView]
    ) -> list[ChunkId]:
        excess = len(segment.hydrated) - self.cap(segment.total_chunks)
        if excess <= 0:
            return []
        return [c.id for c in order if not c.held][:excess]


@dataclass(frozen=True)
class LruStrategy(EvictionStrategy):
    """Plain LRU, for comparison: chunks stay until the cache needs room."""

    name: ClassVar[str] = "lru"


@dataclass(frozen=True)
class EagerStrategy(EvictionStrategy):
    """Redpanda's default: a chunk no reader holds goes at once; no sorting."""

    name: ClassVar[str] = "eager"

    def release(self, segment: SegmentSnapshot) -> list[ChunkId]:
        return [c.id for c in segment.hydrated if not c.held]


@dataclass(frozen=True)
class CappedStrategy(EvictionStrategy):
    """Unheld chunks go, least recently used first, until the segment is at its cap."""

    name: ClassVar[str] = "capped"

    def release(self, segment: SegmentSnapshot) -> list[ChunkId]:
        return self._release_to_cap(segment, sorted(segment.hydrated, key=_lru_key))


def _predictive_key(chunk: ChunkView) -> tuple[int, float, float, str, int]:
    # fewest future readers first; among equals the one needed furthest ahead (never: first);
    # then least recently used
    ahead = math.inf if chunk.next_need is None else float(chunk.next_need)
    return (chunk.future_readers, -ahead, chunk.last_access, chunk.id.segment, chunk.id.start)


@dataclass(frozen=True)
class PredictiveStrategy(EvictionStrategy):
    """Readers register the chunks they will read; the chunks fewest of them still need go
    first, and among those the ones needed furthest ahead — Belady's rule as far as the
    registrations know the future. Voluntary release stops at the segment cap."""

    name: ClassVar[str] = "predictive"
    uses_future: ClassVar[bool] = True

    def release(self, segment: SegmentSnapshot) -> list[ChunkId]:
        return self._release_to_cap(segment, sorted(segment.hydrated, key=_predictive_key))

    def victim_order(self, chunks: Iterable[ChunkView]) -> list[ChunkId]:
        return [c.id for c in sorted((c for c in chunks if not c.held), key=_predictive_key)]


#: cloud_storage_chunk_eviction_strategy value -> strategy class
STRATEGIES: dict[str, type[EvictionStrategy]] = {
    cls.name: cls for cls in (EagerStrategy, CappedStrategy, PredictiveStrategy, LruStrategy)
}


def make_strategy(
    name: str, *, hydrated_ratio: float = 0.7, min_chunks: int = 5
) -> EvictionStrategy:
    """The strategy registered as `name`; ConfigError naming the choices for an unknown one."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        choices = ", ".join(sorted(STRATEGIES))
        raise ConfigError(
            f"cloud_storage_chunk_eviction_strategy: unknown strategy {name!r} (one of {choices})"
        ) from None
    return cls(hydrated_ratio=hydrated_ratio, min_chunks=min_chunks)
