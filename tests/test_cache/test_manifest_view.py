"""`cache.manifest_view` on its own: head manifests for reads, cached for the TTL, revalidated
in the background past it, served through a store outage while younger than the grace period
(docs/remote-read.md)."""

from __future__ import annotations

import pytest
from support.remote import CountingStore
from support.waiting import wait_until

from cache.manifest_view import ManifestView, UnknownPartition
from manifests import edits
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from tiered.store.base import ObjectStore
from tiered.store.errors import StoreError

TOPIC = "orders"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _commit(store: ObjectStore, last: int) -> None:
    mstore = ManifestStore(store)
    m, etag = mstore.load(TOPIC, 0, "0")
    seg = SegmentMeta(m.next_offset, last, 0, 0, 10, 1, 1, 0)
    mstore.commit(edits.add_segments(m if etag else PartitionManifest.new(TOPIC, 0, "0", term=1),
                                   [seg]), etag)


class _Down(CountingStore):
    down = False

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> object:  # type: ignore[override]
        if self.down:
            raise StoreError("the store is down")
        return super().get(key, byte_range)


@pytest.fixture
def view(file_store: ObjectStore) -> tuple[ManifestView, _Down, _Clock]:
    counting = _Down(file_store)
    clock = _Clock()
    return (ManifestView(ManifestStore(counting), stale_head_s=30.0, clock=clock, ttl_s=1.0,
                         refresh_after_s=0.0), counting, clock)


def test_a_head_is_read_once_per_ttl(file_store: ObjectStore,
                                     view: tuple[ManifestView, _Down, _Clock]) -> None:
    mv, counting, clock = view
    _commit(file_store, 9)
    # no topic manifest: the revision the archiver names a topic without an id
    assert mv.revision(TOPIC, None) == ("0", None)
    counting.calls.clear()
    first = mv.head(TOPIC, 0, None, required=True)
    assert first is not None and first.last_offset == 9
    for _ in range(5):
        assert mv.head(TOPIC, 0, None, required=True) is first
    assert counting.calls.get("get") == 1


def test_past_the_ttl_a_fetch_it_covers_is_served_while_a_fresh_head_is_read(
        file_store: ObjectStore, view: tuple[ManifestView, _Down, _Clock]) -> None:
    mv, counting, clock = view
    _commit(file_store, 9)
    old = mv.head(TOPIC, 0, None, required=True)
    _commit(file_store, 19)
    clock.now += 2  # past the TTL
    assert mv.head(TOPIC, 0, None, required=True, offset=5) is old  # served at once
    wait_until(lambda: not mv.refreshing, "the background refresh")
    fresh = mv.head(TOPIC, 0, None, required=True, offset=5)
    assert fresh is not None and fresh.last_offset == 19
    mv.close()


def test_a_store_outage_serves_a_head_younger_than_the_grace_period(
        file_store: ObjectStore, view: tuple[ManifestView, _Down, _Clock]) -> None:
    mv, counting, clock = view
    _commit(file_store, 9)
    known = mv.head(TOPIC, 0, None, required=True)
    counting.down = True
    clock.now += 10  # past the TTL, within the 30 s grace
    assert mv.head(TOPIC, 0, None, required=True) is known
    clock.now += 30  # past the grace: its objects may be gone
    with pytest.raises(StoreError):
        mv.head(TOPIC, 0, None, required=True)


def test_a_partition_with_nothing_in_the_bucket(
        view: tuple[ManifestView, _Down, _Clock]) -> None:
    mv, _counting, _clock = view
    assert mv.head(TOPIC, 3, None, required=False) is None
    with pytest.raises(UnknownPartition):
        mv.head(TOPIC, 3, None, required=True)
