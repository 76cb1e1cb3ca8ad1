"""A store outage after a partition's head manifest was read: reads of cached chunks keep being
served from the last head for up to the GC grace period (objects a newer manifest dropped are
kept that long), and fail clearly after it (design invariant 9)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from support.remote import CountingStore, Fixture, make_config, shared_remote

from cache.reader import Reader
from tiered.store.base import ObjectInfo
from tiered.store.errors import StoreError


class FlakyStore(CountingStore):
    """Every request fails while `down` is set, as during a network partition."""

    down = False

    def _count(self, name: str) -> None:
        if self.down:
            raise StoreError(f"{name}: connection refused (simulated outage)")
        super()._count(name)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count("list")
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        self._count("delete")
        return self.inner.delete_many(keys)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _reader(fx: Fixture, tmp_path: Path, grace_ms: int) -> tuple[Reader, FlakyStore, Clock]:
    config = make_config(tmp_path, bucket=Path(fx.store.settings.url.removeprefix("file://")),
                         cluster={"cloud_storage_gc_grace_period_ms": grace_ms})
    store = FlakyStore(fx.store)
    clock = Clock()
    return Reader(config, store, clock=clock, metadata_ttl_s=1.0), store, clock


def test_cached_reads_survive_an_outage_within_the_grace_period(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fx = shared_remote(tmp_path, tmp_path_factory)
    reader, store, clock = _reader(fx, tmp_path, grace_ms=60_000)
    with reader:
        first = reader.fetch("orders", 0, 0, 200, reader_id="consumer").data
        store.down = True
        clock.now += 30  # the head is past its TTL but younger than the grace period
        again = reader.fetch("orders", 0, 0, 200, reader_id="consumer").data
        assert again == first
        clock.now += 60  # now older than the grace period: refuse rather than guess
        with pytest.raises(StoreError, match="simulated outage"):
            reader.fetch("orders", 0, 0, 200, reader_id="consumer")
        store.down = False
        assert reader.fetch("orders", 0, 0, 200, reader_id="consumer").data == first
