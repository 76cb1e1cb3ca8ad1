"""Compare-and-swap commits (ManifestStore) against real backends: moto's S3 server over HTTP
and the file store (the `store` fixture runs each test on both).

Defends design invariant 6: manifest writes are CAS on the object's version, fenced by a term that
only grows; a stale writer loses and no update is ever lost.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest
from manifest_fakes import MemoryStore, run_of, segment

from manifests import edits
from manifests.commit import ManifestStore
from manifests.errors import (
    CorruptManifest,
    InvalidUpdate,
    ManifestConflict,
    ManifestContention,
    StaleTerm,
    UnsupportedManifestVersion,
)
from manifests.manifest import PartitionManifest
from manifests.model import HEAD_FORMAT_VERSION
from manifests.serde import encode_partition_manifest
from manifests.spillover import ManifestSettings
from tiered.store.base import ObjectStore
from tiered.store.errors import PreconditionFailed

TOPIC, PARTITION, REVISION = "orders", 0, "abc"


def load(ms: ManifestStore) -> tuple[PartitionManifest, str | None]:
    return ms.load(TOPIC, PARTITION, REVISION)


def test_missing_manifest_loads_as_empty_and_the_first_commit_creates_it(
    store: ObjectStore,
) -> None:
    ms = ManifestStore(store)
    m, etag = load(ms)
    assert etag is None and m == PartitionManifest.new(TOPIC, PARTITION, REVISION)
    result = ms.commit(edits.add_segments(edits.with_term(m, 1), run_of(0, 3)), None)
    assert result.manifest.sequence == 1
    again, again_etag = load(ManifestStore(store))
    assert again == result.manifest and again_etag == result.etag


def test_second_first_write_loses_instead_of_overwriting(store: ObjectStore) -> None:
    a, b = ManifestStore(store), ManifestStore(store)
    m, _ = load(a)
    m = edits.with_term(m, 1)
    won = a.commit(edits.add_segments(m, run_of(0, 2)), None)
    with pytest.raises(ManifestConflict) as info:
        b.commit(edits.add_segments(m, [segment(0, 50, name="other.log")]), None)
    assert info.value.current == won.manifest and info.value.etag == won.etag
    assert load(a)[0] == won.manifest


def test_lost_race_hands_back_the_fresh_manifest_to_retry_on(store: ObjectStore) -> None:
    a, b = ManifestStore(store), ManifestStore(store)
    base = a.commit(edits.add_segments(edits.with_term(load(a)[0], 1), run_of(0, 1)), None)
    mb, etag_b = load(b)
    a.commit(edits.add_segments(base.manifest, run_of(100, 1)), base.etag)  # a wins
    with pytest.raises(ManifestConflict) as info:
        b.commit(edits.add_segments(mb, [segment(100, 10, name="b.log")]), etag_b)
    fresh = info.value.current
    assert fresh is not None and fresh.last_offset == 199
    retried = b.commit(edits.add_segments(fresh, [segment(200, 10, name="b.log")]), info.value.etag)
    final, _ = load(ManifestStore(store))
    assert final == retried.manifest
    assert [s.base_offset for s in final.segments] == [0, 100, 200]  # both updates kept


def test_two_concurrent_writers_lose_no_update(store: ObjectStore) -> None:
    """Each writer appends its own segments with a load-modify-CAS loop; every one survives."""
    per_writer = 12
    conflicts = [0, 0]

    def writer(index: int) -> None:
        ms = ManifestStore(store)
        m, etag = load(ms)
        done = 0
        while done < per_writer:
            seg = segment(max(m.next_offset, 0), 10, name=f"w{index}-{done}.log")
            try:
                result = ms.commit(edits.add_segments(edits.with_term(m, 1), [seg]), etag)
            except ManifestConflict as lost:
                conflicts[index] += 1
                assert lost.current is not None
                m, etag = lost.current, lost.etag
                continue
            m, etag = result.manifest, result.etag
            done += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    final, _ = load(ManifestStore(store))
    names = [s.name for s in final.segments]
    assert sorted(names) == sorted(f"w{i}-{n}.log" for i in range(2) for n in range(per_writer))
    assert final.sequence == 2 * per_writer
    assert [s.base_offset for s in final.segments] == list(range(0, 10 * 2 * per_writer, 10))


def append_one(name: str) -> Callable[[PartitionManifest], PartitionManifest]:
    """A change that appends one 10-offset segment called `name` at the manifest's end."""

    def change(m: PartitionManifest) -> PartitionManifest:
        return edits.add_segments(edits.with_term(m, 1), [segment(m.next_offset, 10, name=name)])

    return change


def test_update_loses_no_change_among_four_racing_writers(store: ObjectStore) -> None:
    """`update` is the load-modify-CAS helper every writer uses: under contention each change is
    re-applied to what the winner wrote, so every one of them lands exactly once."""
    per_writer, writers = 8, 4
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        ms = ManifestStore(store)
        try:
            for n in range(per_writer):
                done = ms.update(TOPIC, PARTITION, REVISION, append_one(f"w{index}-{n}.log"))
                assert done.committed
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    final, _ = load(ManifestStore(store))
    assert sorted(s.name for s in final.segments) == sorted(
        f"w{i}-{n}.log" for i in range(writers) for n in range(per_writer))
    assert final.sequence == writers * per_writer


def test_update_starts_from_a_stale_copy_and_reapplies_on_the_fresh_head(
    store: ObjectStore,
) -> None:
    ms = ManifestStore(store)
    first = ms.update(TOPIC, PARTITION, REVISION, append_one("a.log"))
    other = ManifestStore(store).update(TOPIC, PARTITION, REVISION, append_one("b.log"))
    assert other.committed
    done = ms.update(TOPIC, PARTITION, REVISION, append_one("c.log"),
                     start=(first.manifest, first.etag))
    assert done.committed and done.attempts == 2
    assert [s.name for s in done.manifest.segments] == ["a.log", "b.log", "c.log"]


def test_update_without_a_change_writes_nothing(store: ObjectStore) -> None:
    ms = ManifestStore(store)
    nothing = ms.update(TOPIC, PARTITION, REVISION, lambda m: None)
    assert (nothing.committed, nothing.etag) == (False, None)
    ms.update(TOPIC, PARTITION, REVISION, append_one("a.log"))
    same = ms.update(TOPIC, PARTITION, REVISION, lambda m: m)
    assert not same.committed and same.etag == store.head(same.manifest.key).etag


def test_update_gives_up_at_its_deadline_with_manifest_contention(store: ObjectStore) -> None:
    ms, racer = ManifestStore(store), ManifestStore(store)
    ms.update(TOPIC, PARTITION, REVISION, append_one("seed.log"))
    count = [0]

    def change_while_racer_wins(m: PartitionManifest) -> PartitionManifest:
        count[0] += 1
        racer.update(TOPIC, PARTITION, REVISION, append_one(f"r{count[0]}.log"))
        return edits.add_segments(edits.with_term(m, 1), [segment(m.next_offset, 10, name="x.log")])

    waits: list[float] = []
    with pytest.raises(ManifestContention, match="lost the commit race") as info:
        # a deadline that a busy machine's first attempt cannot use up alone
        ms.update(TOPIC, PARTITION, REVISION, change_while_racer_wins, deadline_s=2.0,
                  sleep=waits.append)
    assert isinstance(info.value, ManifestConflict)  # callers that catch conflicts still do
    assert info.value.attempts == count[0] >= 2
    assert waits and all(0 <= w <= 1.0 for w in waits)  # jittered, bounded backoff
    final, _ = load(ms)
    assert "x.log" not in [s.name for s in final.segments]


def test_stale_term_is_fenced_after_a_new_leader_commits(store: ObjectStore) -> None:
    old_leader, new_leader = ManifestStore(store), ManifestStore(store)
    first = old_leader.commit(
        edits.add_segments(edits.with_term(load(old_leader)[0], 1), run_of(0, 1)), None
    )
    m2, etag2 = load(new_leader)
    taken = new_leader.commit(
        edits.add_segments(edits.with_term(m2, 2), run_of(100, 1, term=2)), etag2)
    with pytest.raises(StaleTerm) as info:
        old_leader.commit(edits.add_segments(first.manifest, run_of(100, 1)), first.etag)
    assert (info.value.stored_term, info.value.writer_term) == (2, 1)
    # re-reading does not help a fenced writer: the term cannot go back ...
    fresh, fresh_etag = load(old_leader)
    with pytest.raises(StaleTerm):
        edits.with_term(fresh, 1)
    # ... and a hand-built manifest with the old term is refused before anything is written
    with pytest.raises(StaleTerm):
        old_leader.commit(edits.add_segments(fresh, run_of(200, 1)).evolve(term=1), fresh_etag)
    assert load(ManifestStore(store)) == (taken.manifest, taken.etag)


def test_commit_from_a_process_that_never_read_the_version_checks_its_term(
    store: ObjectStore,
) -> None:
    a = ManifestStore(store)
    won = a.commit(edits.add_segments(edits.with_term(load(a)[0], 3), run_of(0, 1, term=3)), None)
    stranger = ManifestStore(store)  # knows the ETag only from elsewhere
    with pytest.raises(StaleTerm):
        stranger.commit(won.manifest.evolve(term=2), won.etag)
    ok = stranger.commit(edits.add_segments(won.manifest, run_of(100, 1, term=3)), won.etag)
    assert ok.manifest.sequence == 2


def test_invalid_manifest_is_not_committed(store: ObjectStore) -> None:
    ms = ManifestStore(store)
    m = edits.add_segments(edits.with_term(load(ms)[0], 1), run_of(0, 2))
    with pytest.raises(InvalidUpdate, match="cloud_bytes"):
        ms.commit(m.evolve(cloud_bytes=1), None)
    assert load(ms) == (PartitionManifest.new(TOPIC, PARTITION, REVISION), None)


def test_corrupt_head_in_the_bucket_is_refused_with_its_key(store: ObjectStore) -> None:
    ms = ManifestStore(store)
    result = ms.commit(edits.add_segments(edits.with_term(load(ms)[0], 1), run_of(0, 2)), None)
    key = result.manifest.key
    store.put(key, encode_partition_manifest(result.manifest)[:-20])
    with pytest.raises(CorruptManifest) as info:
        load(ManifestStore(store))
    assert info.value.key == key


def test_head_from_a_newer_release_is_refused(store: ObjectStore) -> None:
    m = edits.add_segments(PartitionManifest.new(TOPIC, PARTITION, REVISION, term=1), run_of(0, 2))
    doc = json.loads(encode_partition_manifest(m))
    doc["version"] = HEAD_FORMAT_VERSION + 1
    store.put(m.key, json.dumps(doc).encode())
    with pytest.raises(UnsupportedManifestVersion, match=f"version {HEAD_FORMAT_VERSION + 1}"):
        load(ManifestStore(store))


def test_spilled_history_is_readable_by_another_process_with_one_get(store: ObjectStore) -> None:
    settings = ManifestSettings(spillover_size=4096)
    writer = ManifestStore(store, settings)
    m, etag = load(writer)
    m = edits.with_term(m, 1)
    for _ in range(6):
        result = writer.commit(edits.add_segments(m, run_of(m.next_offset, 150)), etag)
        m, etag = result.manifest, result.etag
    assert len(m.archives) >= 3
    reader = ManifestStore(store, settings)
    head, _ = load(reader)
    assert head == m
    seg = reader.find_offset(head, 250)
    assert seg.base_offset == 200 and reader.stats.archive_reads == 1
    assert reader.find_offset(head, 260) == seg and reader.stats.archive_reads == 1
    assert sum(1 for _ in reader.iter_segments(head)) == 900


def test_retried_put_that_finds_its_own_write_counts_as_committed() -> None:
    """A conditional PUT whose response was lost is retried by the store client and answered
    412 by our own write; the commit must report success, not a conflict."""
    store = MemoryStore()
    ms = ManifestStore(store)
    m, etag = load(ms)
    original_put = store.put

    def put_then_412(key: str, data: bytes, **kw: object) -> str:
        original_put(key, data, **kw)  # type: ignore[arg-type]
        raise PreconditionFailed(f"{key}: retried request sees the new version")

    store.put = put_then_412  # type: ignore[method-assign]
    result = ms.commit(edits.add_segments(edits.with_term(m, 1), run_of(0, 2)), etag)
    store.put = original_put  # type: ignore[method-assign]
    assert load(ManifestStore(store)) == (result.manifest, result.etag)
