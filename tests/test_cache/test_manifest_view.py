"""`cache.manifest_view` on its own: head manifests for reads, cached for the TTL, revalidated
in the background past it, served through a store outage while younger than the grace period
(docs/remote-read.md)."""

from __future__ import annotations

import logging

import pytest
from support.remote import CountingStore
from support.waiting import wait_until

from cache.manifest_view import ManifestView, UnknownPartition
from manifests import edits, keys
from manifests.commit import ManifestStore
from manifests.errors import CorruptManifest
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound, StoreError

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


# --- a head the bucket lost or garbled: reads go on from its copy -----------------------------

HEAD_KEY = keys.partition_manifest_key(TOPIC, 0, "0")


@pytest.mark.parametrize("damage", ["missing", "garbled"])
def test_a_lost_or_garbled_head_is_read_from_its_newest_copy_without_a_write(
        file_store: ObjectStore, view: tuple[ManifestView, _Down, _Clock], damage: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A partition whose head the bucket lost is not a partition with no history: reads are
    served from the newest copy (the last commit's), and the reader writes nothing (restoring
    the head is a writer's)."""
    mv, counting, clock = view
    _commit(file_store, 9)
    _commit(file_store, 19)
    if damage == "missing":
        file_store.delete_many([HEAD_KEY])
    else:
        file_store.put(HEAD_KEY, b"{not json")
    counting.calls.clear()
    m = mv.head(TOPIC, 0, None, required=True)
    assert m is not None and (m.log_start_offset, m.last_offset) == (0, 19)
    said = "missing" if damage == "missing" else "unreadable (not a valid JSON manifest"
    assert f"the head manifest is {said}" in caplog.text
    assert "sequence" in caplog.text
    assert "put" not in counting.calls and "delete" not in counting.calls
    # read again past the TTL: served from the copy again, the warning not repeated
    caplog.clear()
    clock.now += 2
    again = mv.head(TOPIC, 0, None, required=True)
    assert again is not None and again.last_offset == 19
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and "served from its copy" in r.getMessage()]
    if damage == "missing":
        with pytest.raises(ObjectNotFound):
            file_store.get(HEAD_KEY)


def test_the_newest_copy_wins_and_an_unreadable_one_is_passed_over(
        file_store: ObjectStore, view: tuple[ManifestView, _Down, _Clock]) -> None:
    mv, _counting, _clock = view
    for last in (9, 19, 29):
        _commit(file_store, last)
    newest = ManifestStore(file_store).load(TOPIC, 0, "0")[0]
    file_store.delete_many([HEAD_KEY])
    m = mv.head(TOPIC, 0, None, required=True)
    assert m is not None and m.last_offset == 29
    # the newest copy garbled: the other slot's, one commit older, serves
    file_store.put(keys.head_copy_key(HEAD_KEY, newest.sequence), b"garbage")
    mv.heads.pop((TOPIC, 0, "0"))
    m = mv.head(TOPIC, 0, None, required=True)
    assert m is not None and m.last_offset == 19


def test_a_garbled_head_without_a_copy_is_an_error_not_an_empty_partition(
        file_store: ObjectStore, view: tuple[ManifestView, _Down, _Clock]) -> None:
    mv, _counting, _clock = view
    _commit(file_store, 9)
    file_store.delete_many(keys.head_copy_keys(HEAD_KEY))
    file_store.put(HEAD_KEY, b"{not json")
    with pytest.raises(CorruptManifest):
        mv.head(TOPIC, 0, None, required=False)
