"""A bounded in-memory LRU of materialized archived manifests.

Archived manifests are immutable and their keys are content-addressed, so a cached copy never
goes stale and needs no invalidation. The bound is memory (`cloud_storage_manifest_cache_size`,
bytes), weighed by each manifest's `memory_bytes()`; an object heavier than the whole budget is
returned to its caller but not kept. Thread-safe: readers on several threads share one cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from manifests.manifest import ArchivedManifest


@dataclass
class CacheStats:
    """Counters for metrics; read them, never reset them from outside."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    #: objects and their weight (bytes) held now
    entries: int = 0
    bytes: int = 0


class ArchiveCache:
    """LRU of `ArchivedManifest` by object key, bounded by `capacity_bytes`."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.stats = CacheStats()
        self._items: OrderedDict[str, tuple[ArchivedManifest, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> ArchivedManifest | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.stats.misses += 1
                return None
            self._items.move_to_end(key)
            self.stats.hits += 1
            return item[0]

    def put(self, key: str, manifest: ArchivedManifest) -> None:
        weight = manifest.memory_bytes()
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.stats.bytes -= old[1]
            if weight > self.capacity_bytes:
                self._sync()
                return
            self._items[key] = (manifest, weight)
            self.stats.bytes += weight
            while self.stats.bytes > self.capacity_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self.stats.bytes -= evicted
                self.stats.evictions += 1
            self._sync()

    def _sync(self) -> None:
        self.stats.entries = len(self._items)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.stats.bytes = 0
            self._sync()
