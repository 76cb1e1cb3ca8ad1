"""Archived metadata (manifests.spillover, ManifestStore reads): bounded head, one GET per
cold lookup, seamless iteration, bounded cache.

Defends docs/design.md's archived metadata (memory bounded however long the history), design
invariant 1 (an archived manifest is in the bucket before the head that lists it) and design
invariant 5 for archived manifests (checksum verified on every read).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manifest_fakes import MemoryStore, run_of, segment

from manifests import edits
from manifests.archive_cache import ArchiveCache
from manifests.commit import ManifestStore
from manifests.errors import CorruptManifest
from manifests.manifest import PartitionManifest, manifest_problem
from manifests.model import ArchiveEntry, SegmentMeta
from manifests.serde import encode_partition_manifest
from manifests.spillover import ManifestSettings, plan_spill
from tiered.errors import ConfigError, OffsetOutOfRange
from tiered.store.errors import StoreError

TOPIC, PARTITION, REVISION = "orders", 3, "rev1"


def build(
    store: MemoryStore, sizes: list[int], spill: int, *, count: int = 100, cache: int = 1 << 20
) -> tuple[ManifestStore, PartitionManifest, str | None, list[SegmentMeta]]:
    """Commit batches of `sizes[i]` segments of `count` offsets each."""
    ms = ManifestStore(store, ManifestSettings(spillover_size=spill, manifest_cache_size=cache))
    m, etag = ms.load(TOPIC, PARTITION, REVISION)
    m = edits.with_term(m, 1)
    flat: list[SegmentMeta] = []
    for n in sizes:
        batch = run_of(m.next_offset, n, count)
        flat.extend(batch)
        result = ms.commit(edits.add_segments(m, batch), etag)
        m, etag = result.manifest, result.etag
    return ms, m, etag, flat


def archive_keys(store: MemoryStore) -> list[str]:
    return [k for k in store.objects if "/manifest.json." in k and ".copy-" not in k]


def depth(ms: ManifestStore, m: PartitionManifest, offset: int) -> int:
    """Archived manifests a cold lookup of `offset` has to read."""
    hit = edits.find_offset(m, offset)
    return hit.level + 1 if isinstance(hit, ArchiveEntry) else 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 400), min_size=1, max_size=25),
    st.sampled_from([2048, 4096, 8192]),
)
@pytest.mark.slow  # a long history
def test_head_stays_under_twice_the_spillover_size(sizes: list[int], spill: int) -> None:
    store = MemoryStore()
    ms, m, _, flat = build(store, sizes, spill)
    head = store.objects[m.key][0]
    assert len(head) <= 2 * spill
    assert manifest_problem(m) is None
    for key in archive_keys(store):
        assert len(store.objects[key][0]) <= spill, key
    assert sum(1 for _ in ms.iter_segments(m)) == len(flat)


def test_a_large_batch_spills_into_several_archives_of_about_the_spillover_size() -> None:
    store = MemoryStore()
    _, m, _, _ = build(store, [3000], 8192)
    sizes = sorted(len(store.objects[k][0]) for k in archive_keys(store))
    assert len(sizes) >= 10
    assert all(7000 < s <= 8192 for s in sizes), sizes
    head = len(store.objects[m.key][0])
    assert head <= 8192
    assert m.archive_start_offset == m.archive_clean_offset == 0
    assert m.start_offset == m.archives.last_last() + 1 == m.segments.first_base()


def test_small_manifests_are_not_spilled() -> None:
    m = edits.add_segments(PartitionManifest.new(TOPIC, 0, 1, term=1), run_of(0, 10))
    plan = plan_spill(m, 64 * 1024)
    assert plan.manifest is m and plan.uploads == ()


def test_every_offset_is_found_with_at_most_one_archive_get_cold_and_none_warm() -> None:
    store = MemoryStore()
    ms, m, _, flat = build(store, [150] * 40, 4096)
    assert len(m.archives) > 5 and set(m.archives.column("level")) == {0}
    rng = random.Random(7)
    offsets = [rng.randrange(0, m.next_offset) for _ in range(200)] + [0, m.last_offset]
    by_base = {s.base_offset: s for s in flat}
    for offset in offsets:
        cold = ManifestStore(store, ms.settings)
        before = store.calls["get"]
        seg = cold.find_offset(m, offset)
        assert by_base[seg.base_offset] == seg and seg.base_offset <= offset <= seg.last_offset
        assert store.calls["get"] - before <= 1
        before = store.calls["get"]
        assert cold.find_offset(m, offset) == seg
        assert store.calls["get"] == before  # warm: served from the cache


@pytest.mark.slow  # a long history
def test_folded_history_keeps_lookups_exact_and_the_head_bounded() -> None:
    """A history long enough that archive entries fold into index manifests (level >= 1)."""
    store = MemoryStore()
    ms, m, _, flat = build(store, [400] * 60, 2048)
    levels = set(m.archives.column("level"))
    assert max(levels) >= 1, levels
    assert len(store.objects[m.key][0]) <= 2 * 2048
    rng = random.Random(3)
    for offset in [rng.randrange(0, m.next_offset) for _ in range(150)]:
        cold = ManifestStore(store, ms.settings)
        before = store.calls["get"]
        seg = cold.find_offset(m, offset)
        assert seg.base_offset <= offset <= seg.last_offset
        assert store.calls["get"] - before == depth(cold, m, offset)
    assert [s.base_offset for s in ms.iter_segments(m)] == [s.base_offset for s in flat]


def test_iteration_from_zero_crosses_every_archive_boundary() -> None:
    store = MemoryStore()
    ms, m, _, flat = build(store, [300] * 10, 4096, cache=0)
    got = list(ManifestStore(store, ms.settings).iter_segments(m, 0))
    assert got == flat
    for a, b in zip(got, got[1:], strict=False):
        assert b.base_offset == a.last_offset + 1
    middle = flat[len(flat) // 2]
    assert list(ms.iter_segments(m, middle.base_offset + 1))[0] == middle


def test_retention_into_the_archive_region_hides_older_offsets() -> None:
    store = MemoryStore()
    ms, m, etag, flat = build(store, [300] * 5, 4096)
    cut = flat[100].base_offset + 50
    m = ms.commit(edits.advance_start_offset(m, cut, now_ms=0), etag).manifest
    with pytest.raises(OffsetOutOfRange):
        ms.find_offset(m, cut - 1)
    assert ms.find_offset(m, cut) == flat[100]
    assert list(ms.iter_segments(m, 0)) == flat[100:]


def test_timestamp_lookup_reads_only_archives_that_reach_the_timestamp() -> None:
    store = MemoryStore()
    ms, m, _, flat = build(store, [300] * 5, 4096)
    for ts in (0, 1, 12_345, flat[700].max_timestamp, flat[-1].max_timestamp):
        expected = next(s for s in flat if s.max_timestamp >= ts)
        cold = ManifestStore(store, ms.settings)
        before = store.calls["get"]
        assert cold.find_timestamp(m, ts) == expected
        assert store.calls["get"] - before <= 1
    assert ms.find_timestamp(m, flat[-1].max_timestamp + 1) is None


def test_timestamp_lookup_skips_expired_segments_of_a_partly_expired_archive() -> None:
    store = MemoryStore()
    ms, m, etag, flat = build(store, [300] * 3, 4096)
    m = ms.commit(edits.advance_start_offset(m, flat[3].base_offset, now_ms=0), etag).manifest
    assert ms.find_timestamp(m, 0) == flat[3]


def test_cache_is_bounded_by_its_byte_budget() -> None:
    store = MemoryStore()
    ms, m, _, _ = build(store, [300] * 10, 4096, cache=20_000)
    reader = ManifestStore(store, ms.settings)
    list(reader.iter_segments(m))
    stats = reader.cache.stats
    assert 0 < stats.bytes <= 20_000 and stats.evictions > 0
    assert stats.misses >= len(m.archives)


def test_cache_of_zero_bytes_still_serves_every_read() -> None:
    store = MemoryStore()
    ms, m, _, flat = build(store, [300] * 4, 4096)
    reader = ManifestStore(store, cache=ArchiveCache(0))
    assert reader.find_offset(m, 5) == flat[0]
    assert len(reader.cache) == 0


# -- commit ordering and damage ------------------------------------------------------------------


def test_archived_manifests_are_uploaded_before_the_head_that_lists_them() -> None:
    store = MemoryStore()
    order: list[str] = []
    ms, m, etag, _ = build(store, [80], 4096)
    original_put = store.put

    def recording_put(key: str, data: bytes, **kw: object) -> str:
        order.append(key)
        return original_put(key, data, **kw)  # type: ignore[arg-type]

    store.put = recording_put  # type: ignore[method-assign]
    result = ms.commit(edits.add_segments(m, run_of(m.next_offset, 400)), etag)
    assert result.archived_keys
    # archives, then the head, then the head's copy beside it (docs/format.md, "Losing objects")
    assert order[-1].startswith(m.key + ".copy-") and order[-2] == m.key
    assert set(order[:-2]) == set(result.archived_keys)


def test_crash_between_archive_upload_and_head_commit_leaves_a_readable_head() -> None:
    """The old head stays valid; the orphaned archive is found for garbage collection."""
    store = MemoryStore()
    ms, m, etag, flat = build(store, [100], 4096)
    original_put = store.put

    def failing_head_put(key: str, data: bytes, **kw: object) -> str:
        if key == m.key:
            raise StoreError("connection reset")
        return original_put(key, data, **kw)  # type: ignore[arg-type]

    store.put = failing_head_put  # type: ignore[method-assign]
    with pytest.raises(StoreError):
        ms.commit(edits.add_segments(m, run_of(m.next_offset, 400)), etag)
    store.put = original_put  # type: ignore[method-assign]
    reader = ManifestStore(store)
    current, current_etag = reader.load(TOPIC, PARTITION, REVISION)
    assert current == m and current_etag == etag
    assert list(reader.iter_segments(current)) == flat
    orphans = reader.unreferenced_archives(current)
    assert orphans and {o.key for o in orphans} == set(archive_keys(store))


def test_retried_commit_reuses_identical_archives() -> None:
    store = MemoryStore()
    ms, m, etag, _ = build(store, [100], 4096)
    change = edits.add_segments(m, run_of(m.next_offset, 400))
    original_put = store.put
    calls = {"n": 0}

    def fail_once(key: str, data: bytes, **kw: object) -> str:
        if key == m.key and calls["n"] == 0:
            calls["n"] += 1
            raise StoreError("timeout")
        return original_put(key, data, **kw)  # type: ignore[arg-type]

    store.put = fail_once  # type: ignore[method-assign]
    with pytest.raises(StoreError):
        ms.commit(change, etag)
    first = set(archive_keys(store))
    result = ms.commit(change, etag)
    assert set(result.archived_keys) == first  # same content, same keys, no new objects
    assert ManifestStore(store).unreferenced_archives(result.manifest) == []


def spilled_store() -> tuple[MemoryStore, PartitionManifest, str]:
    store = MemoryStore()
    _, m, _, _ = build(store, [300] * 3, 4096)
    return store, m, m.archive_key(m.archives[0])


def test_archived_manifest_with_a_bad_checksum_is_refused() -> None:
    store, m, key = spilled_store()
    data = bytearray(store.objects[key][0])
    data[-3] = ord("7") if data[-3] != ord("7") else ord("8")
    store.corrupt(key, bytes(data))
    with pytest.raises(CorruptManifest, match="checksum mismatch") as info:
        ManifestStore(store).find_offset(m, 0)
    assert info.value.key == key


def test_missing_archived_manifest_is_reported_as_corruption() -> None:
    store, m, key = spilled_store()
    store.delete_many([key])
    with pytest.raises(CorruptManifest, match="missing"):
        ManifestStore(store).find_offset(m, 0)


def test_archive_that_does_not_match_its_entry_is_refused() -> None:
    store, m, _ = spilled_store()
    entry = m.archives[0]
    lying = ArchiveEntry(**{**{f: getattr(entry, f) for f in entry.__slots__}, "size_bytes": 1})
    store.objects[m.archive_key(lying)] = store.objects[m.archive_key(entry)]
    fake = m.evolve(
        archives=type(m.archives).from_rows([lying, *m.archives.rows(1)]),
        cloud_bytes=m.cloud_bytes - entry.size_bytes + 1,
    )
    assert manifest_problem(fake) is None
    with pytest.raises(CorruptManifest, match="does not match the entry"):
        ManifestStore(store).find_offset(fake, 0)


def test_head_copied_under_another_partitions_key_is_refused() -> None:
    store, m, _ = spilled_store()
    other = PartitionManifest.new(TOPIC, PARTITION + 1, REVISION).key
    store.objects[other] = store.objects[m.key]
    with pytest.raises(CorruptManifest, match="not this key's partition"):
        ManifestStore(store).load(TOPIC, PARTITION + 1, REVISION)


# -- garbage collection support ------------------------------------------------------------------


def test_archive_objects_lists_segments_before_the_manifests_that_name_them() -> None:
    store = MemoryStore()
    ms, m, _, flat = build(store, [400] * 30, 2048)
    top = m.archives[0]
    assert top.level >= 1
    objects = list(ms.archive_objects(m, top))
    segs = [o.segment for o in objects if o.segment is not None]
    assert segs == flat[: top.segment_count]
    assert objects[-1].key == m.archive_key(top) and objects[-1].segment is None
    seen: set[str] = set()
    for obj in objects:  # a manifest comes after every object it lists
        if obj.segment is None:
            node = ms.archived(m, next(e for e in _entries(ms, m) if m.archive_key(e) == obj.key))
            listed = (
                {m.segment_key(s) for s in node.segments}
                if node.level == 0
                else {m.archive_key(c) for c in node.children}
            )
            assert listed <= seen
        seen.add(obj.key)
    assert ms.referenced_archive_keys(m) == set(archive_keys(store))


def _entries(ms: ManifestStore, m: PartitionManifest) -> list[ArchiveEntry]:
    out: list[ArchiveEntry] = []
    pending = list(m.archives)
    while pending:
        e = pending.pop()
        out.append(e)
        if e.level:
            pending.extend(ms.archived(m, e).children)
    return out


def test_expired_archives_are_dropped_after_gc() -> None:
    store = MemoryStore()
    ms, m, etag, flat = build(store, [300] * 4, 4096)
    first = m.archives[0]
    m = ms.commit(edits.advance_start_offset(m, first.last_offset + 1, now_ms=0), etag).manifest
    expired = edits.expired_archives(m)
    assert expired == (first,)
    doomed = [o.key for o in ms.archive_objects(m, first)]
    store.delete_many(doomed)
    result = ms.commit(edits.drop_expired_archives(m, 1), ms.load(TOPIC, PARTITION, REVISION)[1])
    assert result.manifest.archive_clean_offset == first.last_offset + 1
    assert list(ManifestStore(store).iter_segments(result.manifest)) == flat[first.segment_count :]


# -- settings ------------------------------------------------------------------------------------


def test_settings_take_the_seed_name_as_an_alias_and_validate() -> None:
    assert ManifestSettings.from_cluster({}).spillover_size == 64 * 1024
    assert ManifestSettings.from_cluster({}).manifest_cache_size == 1 << 20
    seed = ManifestSettings.from_cluster({"cloud_storage_target_manifest_size_bytes": 8192})
    assert seed.spillover_size == 8192
    both = ManifestSettings.from_cluster(
        {"cloud_storage_spillover_manifest_size": 4096, "cloud_storage_manifest_cache_size": 7}
    )
    assert (both.spillover_size, both.manifest_cache_size) == (4096, 7)
    with pytest.raises(ConfigError, match="cloud_storage_spillover_manifest_size"):
        ManifestSettings(spillover_size=100)
    with pytest.raises(ConfigError, match="cloud_storage_manifest_cache_size"):
        ManifestSettings(manifest_cache_size=-1)


def test_head_size_estimate_per_segment_is_about_forty_five_bytes() -> None:
    """The density the 1M-segment single-GET claim in docs/format.md rests on."""
    m = edits.add_segments(
        PartitionManifest.new(TOPIC, 0, 1, term=1),
        [
            segment(
                i * 1000,
                1000,
                ts=1_700_000_000_000 + i * 60_000,
                crc=(i * 2654435761) % 2**32,
                size=(1 << 20) + (i * 7919) % 65536,
            )
            for i in range(1000)
        ],
    )
    per_segment = (len(encode_partition_manifest(m)) - 843) / 1000
    assert 35 < per_segment < 50


def test_head_bound_holds_at_the_minimum_size_with_the_longest_names() -> None:
    """Worst case for the fixed part of the head: 249-character topic, 64-character revision."""
    store = MemoryStore()
    ms = ManifestStore(store, ManifestSettings(spillover_size=1024))
    m, etag = ms.load("t" * 249, 2**31 - 1, "r" * 64)
    m = edits.with_term(m, 1)
    for _ in range(40):
        result = ms.commit(edits.add_segments(m, run_of(m.next_offset, 50)), etag)
        m, etag = result.manifest, result.etag
        assert len(store.objects[m.key][0]) <= 2 * 1024
    assert sum(1 for _ in ms.iter_segments(m)) == 2000
