"""Store requests per upload round, per idle pass and per lease change, counted at the store.

The counts are the cost model docs/operations.md ("Sizing") gives: a round's commit is shared
by its segments, a partition with nothing new costs no request in the upload loop, local
retention or the leases, and quiet housekeeping costs one HEAD. Counted, never timed."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.archiving import Clock, Disk, write_partition
from support.configs import config_over
from support.counting import CountingStore as Requests

from archiver import housekeeping_census
from archiver.lease_keeper import LeaseKeeper
from archiver.service import Archiver
from manifests import ManifestStore, keys
from manifests.lease_objects import PartitionId
from tiered.config import Config
from tiered.store.base import ObjectInfo
from tiered.store.errors import StoreError
from tiered.store.file import FileStore

PARTITIONS = 4
LEASE_MS = 30_000


def setup(tmp_path: Path, partitions: int = PARTITIONS) -> tuple[Config, Requests]:
    config = config_over(tmp_path)
    now_ms = int(time.time() * 1000)
    for p in range(partitions):  # two closed segments each, recent records
        write_partition(config.log_dirs[0], "orders", p, batches=6, segment_bytes=3000,
                        timestamp_ms=now_ms)
    return config, Requests(FileStore(config.store_settings()))


def member(config: Config, store: Requests, archiver: Archiver) -> LeaseKeeper:
    """A daemon's lease keeper for `archiver`, ticked by hand."""
    keeper = LeaseKeeper(store, archiver.mstore, "n1", LEASE_MS, busy=archiver.idle)
    archiver.ownership = keeper
    keeper.publish(archiver.replicas())
    return keeper


def archive_and_stop(config: Config, store: Requests) -> None:
    """A daemon's life before a restart: its leases, one whole pass, a clean stop."""
    first = Archiver(config, store, disk_usage=Disk())
    keeper = member(config, store, first)
    keeper.tick()
    first.run_once()
    keeper.stop(release=True)


def per_partition(seen: Counter[tuple[str, str]], partitions: int = PARTITIONS
                  ) -> dict[tuple[str, str], float]:
    return {k: v / partitions for k, v in seen.items() if k[1] not in ("node", "topic")}


def test_a_first_pass_reads_each_head_once_and_creates_it_after_one_listing(
        tmp_path: Path) -> None:
    config, store = setup(tmp_path)
    archiver = Archiver(config, store, disk_usage=Disk())
    keeper = member(config, store, archiver)
    keeper.tick()
    report = archiver.upload_round()
    assert sum(p.uploaded_segments for p in report.partitions) == 2 * PARTITIONS
    assert per_partition(store.take()) == {
        # taking the lease of a partition no node advertises: the head read (missing), so
        # the lease is created blind (If-None-Match), not read first
        ("get-missing", "head"): 1, ("put", "lease"): 1,
        # creating the head: one listing of the partition's prefixes first (docs/format.md,
        # "Losing objects"), then the head and its copy; the head is not read a second time
        ("list", "partition"): 1, ("put", "head"): 1, ("put", "copy"): 1,
        # two segments, each with one index bundle (offset and time index)
        ("put", "segment"): 2, ("put", "index"): 2,
    }


def test_a_lease_already_there_fails_the_blind_create_and_is_read(tmp_path: Path) -> None:
    """A partition with a lease but no head (taken, then stopped before a first commit): the
    blind create fails, the lease is read, and this node goes on under it at its generation,
    the head not read twice."""
    config, store = setup(tmp_path)
    first = Archiver(config, store, disk_usage=Disk())
    keeper = member(config, store, first)
    keeper.tick()
    generations = keeper.holdings()
    keeper.stop(release=True)
    store.take()

    again = Archiver(config, store, disk_usage=Disk())
    keeper = member(config, store, again)
    keeper.tick()
    assert keeper.holdings() == generations  # no new generation, nothing fenced
    assert per_partition(store.take()) == {
        ("get-missing", "head"): 1, ("put", "lease"): 1,  # the create, refused
        ("get", "lease"): 1,
    }
    report = again.upload_round()
    assert sum(p.uploaded_segments for p in report.partitions) == 2 * PARTITIONS


def test_a_round_shares_one_commit_among_its_segments(tmp_path: Path) -> None:
    config, store = setup(tmp_path)
    archiver = Archiver(config, store, disk_usage=Disk())
    keeper = member(config, store, archiver)
    keeper.tick()
    archiver.upload_round()
    store.take()
    # two more closed segments per partition
    now_ms = int(time.time() * 1000)
    for p in range(PARTITIONS):
        write_partition(config.log_dirs[0], "orders", p, batches=4, segment_bytes=3000,
                        timestamp_ms=now_ms)
    archiver.scan()
    report = archiver.upload_round()
    segments = sum(p.uploaded_segments for p in report.partitions)
    assert segments >= 2 * PARTITIONS
    seen = store.take()
    # per segment: the segment and its index bundle; per partition: one commit and its copy,
    # onto the head this process holds (no read, no listing)
    assert seen == Counter({("put", "segment"): segments, ("put", "index"): segments,
                            ("put", "head"): PARTITIONS, ("put", "copy"): PARTITIONS})
    # so a round of two segments costs 3 requests per segment
    assert segments == 2 * PARTITIONS and seen.total() == 3 * segments


def test_an_idle_partition_costs_no_request_until_its_next_full_pass(
        tmp_path: Path) -> None:
    config, store = setup(tmp_path)
    clock = Clock()
    archiver = Archiver(config, store, disk_usage=Disk(), clock=clock)
    keeper = member(config, store, archiver)
    keeper.tick()
    archiver.run_once()
    store.take()
    for _ in range(3):  # what the daemon's loop does while nothing arrives
        archiver.scan()
        archiver.upload_round()
        archiver.update_controller()
        archiver.local_retention()
        keeper.tick()
    seen = store.take()
    # the keeper's one listing per tick (and a renewal when due): nothing per partition
    assert {k for k in seen if k[1] != "node"} == set()
    assert seen[("list", "node")] == 3
    # nor in housekeeping, until a GC grace period after the last full pass
    archiver.housekeeping()
    assert store.take() == Counter()
    clock.advance(config.cluster_int("cloud_storage_gc_grace_period_ms") / 1000)
    archiver.housekeeping()
    assert per_partition(store.take())[("list", "partition")] == 1


def test_a_restart_reads_each_lease_and_head_once_and_writes_nothing(tmp_path: Path) -> None:
    config, store = setup(tmp_path)
    archive_and_stop(config, store)
    assert store.take()[("delete", "node")] == 1  # the whole release

    again = Archiver(config, store, disk_usage=Disk())
    keeper = member(config, store, again)
    keeper.tick()
    report = again.upload_round()
    assert not any(p.uploaded_segments for p in report.partitions)
    assert per_partition(store.take()) == {("get", "lease"): 1, ("get", "head"): 1}


def test_a_one_shot_pass_housekeeps_the_heads_it_just_committed_without_a_request(
        tmp_path: Path) -> None:
    config, store = setup(tmp_path)
    archiver = Archiver(config, store, disk_usage=Disk())
    keeper = member(config, store, archiver)
    keeper.tick()
    store.take()
    report = archiver.run_once()
    assert report.ok, report.errors
    seen = per_partition(store.take())
    # the listing made before creating each head found nothing else there, and each head's
    # housekeeping comes right after the commit that wrote it: the commit's compare-and-swap
    # proved the version, so no listing, read or HEAD of its own
    assert seen[("list", "partition")] == 1
    assert ("head", "head") not in seen and ("get", "head") not in seen
    # nor does a pass that commits nothing
    report = archiver.run_once()
    assert report.ok, report.errors
    assert not any(p.uploaded_segments for p in report.partitions)
    assert per_partition(store.take()) == {}


def test_a_restarted_daemon_spreads_the_first_full_passes_over_a_grace_period(
        tmp_path: Path) -> None:
    config, store = setup(tmp_path)
    archive_and_stop(config, store)

    def restarted(spread: bool) -> Archiver:
        again = Archiver(config, store, disk_usage=Disk(), clock=clock)
        member(config, store, again).tick()
        again.upload_round()
        again.housekeeper.spread_first_full_pass = spread
        store.take()
        return again

    clock = Clock()
    # `archive --once` and a bare archiver: the first housekeeping is a full pass for all
    restarted(False).housekeeping()
    assert per_partition(store.take())[("list", "partition")] == 1
    # the daemon: no request at first, then each partition's full pass at its own point of
    # the next grace period, exactly once
    again = restarted(True)
    again.housekeeping()
    assert store.take() == Counter()
    grace_s = config.cluster_int("cloud_storage_gc_grace_period_ms") / 1000
    full = 0
    for _ in range(8):
        clock.advance(grace_s / 8)
        again.housekeeping()
        full += store.take()[("list", "partition")]
    assert full == PARTITIONS


def _housekept_daemon(tmp_path: Path) -> tuple[Config, Requests, Archiver, Clock, float]:
    """A daemon's archiver that uploaded every partition, then had a full housekeeping pass
    of each (which judged what it listed) a grace period later; its store counts afresh."""
    config, store = setup(tmp_path)
    clock = Clock(time.time())
    archiver = Archiver(config, store, disk_usage=Disk(), clock=clock)
    archiver.housekeeper.census = True
    member(config, store, archiver).tick()
    assert archiver.run_once().ok
    grace_s = config.cluster_int("cloud_storage_gc_grace_period_ms") / 1000
    clock.advance(grace_s)
    store.take()
    archiver.housekeeping()  # nothing judged yet: a full pass of every partition
    assert per_partition(store.take())[("list", "partition")] == 1
    return config, store, archiver, clock, grace_s


def test_an_idle_daemon_lists_the_bucket_once_a_grace_period_not_each_partition(
        tmp_path: Path) -> None:
    """Idle partitions cost no request of their own: once a grace period, one listing of
    the whole bucket shows them as their last full pass left them (docs/operations.md)."""
    _, store, archiver, clock, grace_s = _housekept_daemon(tmp_path)
    for n in range(1, 4):
        clock.advance(grace_s)
        archiver.housekeeping()
        # the census, for all: the listing of each first hex digit of their prefixes
        assert store.take() == Counter({("list", "partition"): _census(archiver)})
        assert archiver.snapshot().census_spared_total == n * PARTITIONS
        clock.advance(grace_s / 2)
        archiver.housekeeping()
        assert store.take() == Counter()


def _census(archiver: Archiver) -> int:
    """The listings of one census: one per first hex digit of the partitions' prefixes."""
    return len({keys.partition_prefix(*pid)[0] for pid in archiver.replicas()})


def _pid(archiver: Archiver, partition: int) -> PartitionId:
    return next(p for p in archiver.replicas() if p.partition == partition)


def _orphan(store: Requests, archiver: Archiver) -> str:
    """Another writer's upload that never committed: a segment of an older term, below the
    head's end (dead once old enough)."""
    m = archiver.mstore.load(*_pid(archiver, 0))[0]
    key = m.data_prefix + "0-0-0.log"
    store.inner.put(key, b"an upload that never committed")
    return key


def test_a_census_leaves_a_partition_another_writer_touched_to_its_full_pass(
        tmp_path: Path) -> None:
    """An object added under one partition (another writer's upload that never committed):
    the census spares the others, that one has its full pass, which collects the orphan;
    from then on it is spared again."""
    _, store, archiver, clock, grace_s = _housekept_daemon(tmp_path)
    orphan = _orphan(store, archiver)
    store.take()
    clock.advance(grace_s)
    archiver.housekeeping()
    # the census, then the one partition's full pass: its listing, its head (read before
    # retention and again after the listing) and the deletion
    assert store.take() == Counter({("list", "partition"): _census(archiver) + 1,
                                    ("get", "head"): 2, ("delete", "segment"): 1})
    assert not store.inner.exists(orphan)
    clock.advance(grace_s)
    archiver.housekeeping()
    assert store.take() == Counter({("list", "partition"): _census(archiver)})


def test_a_census_sends_a_partition_whose_head_changed_or_went_to_its_full_pass(
        tmp_path: Path) -> None:
    """Another writer's commit (a new head version), a head the bucket lost, a bundle it
    lost: each makes its partition differ from what its last full pass judged. Those have
    their full pass, which reads the head afresh (restoring the lost one from its copy)."""
    _, store, archiver, clock, grace_s = _housekept_daemon(tmp_path)
    mstore = archiver.mstore
    # partition 0: another writer commits (its version is not the one this node holds)
    mstore.update(*_pid(archiver, 0), lambda m: m.evolve(gc_cutoff_ms=1))
    # partition 1: the bucket loses its head
    head = mstore.load(*_pid(archiver, 1))[0]
    store.inner.delete_many([head.key])
    # partition 2: the bucket loses an index bundle
    m2 = mstore.load(*_pid(archiver, 2))[0]
    bundle = m2.data_prefix + keys.index_name(next(m2.segments.rows(0)).object_name, "indexes")
    assert store.inner.exists(bundle)
    store.inner.delete_many([bundle])
    store.take()
    clock.advance(grace_s)
    archiver.housekeeping()
    seen = store.take()
    # the census, three full passes, and the listing that proves the lost head's copy whole
    assert seen[("list", "partition")] == _census(archiver) + 3 + 1
    assert mstore.load(*_pid(archiver, 1))[1] is not None  # restored
    store.take()
    clock.advance(grace_s)
    archiver.housekeeping()
    # partitions 0 and 1 as their full pass left them now; partition 2 still lacks its
    # bundle, which no pass restores: it is as its full pass left it too
    assert store.take() == Counter({("list", "partition"): _census(archiver)})


def test_a_census_gives_up_on_a_bucket_larger_than_the_passes_it_would_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket shared by many sidecars: listing it costs more than the full passes it
    would spare, so the census stops and the full passes run, for the partitions under the
    piece of the listing that gave up."""
    _, store, archiver, clock, grace_s = _housekept_daemon(tmp_path)
    # one object of others per partition at most (a topic manifest is one)
    monkeypatch.setattr(housekeeping_census, "OBJECTS_PER_SPARED_PASS", 1)
    digit = keys.partition_prefix(*_pid(archiver, 0))[0]
    under = [p for p in archiver.replicas() if keys.partition_prefix(*p)[0] == digit]
    for n in range(PARTITIONS + 1):  # another sidecar's, under partition 0's first digit
        store.inner.put(f"{digit}fffffff/another-sidecar/{n}", b"x")
    store.take()
    clock.advance(grace_s)
    archiver.housekeeping()
    assert store.take()[("list", "partition")] == _census(archiver) + len(under)
    assert archiver.snapshot().census_spared_total == PARTITIONS - len(under)


def test_without_a_census_an_idle_partition_has_its_full_pass_each_grace_period(
        tmp_path: Path) -> None:
    """`archive --once` and a bare archiver take no census: the full pass, as before."""
    _, store, archiver, clock, grace_s = _housekept_daemon(tmp_path)
    archiver.housekeeper.census = False
    clock.advance(grace_s)
    archiver.housekeeping()
    assert per_partition(store.take())[("list", "partition")] == 1


def test_a_commit_racing_the_census_listing_is_seen_by_the_next_census(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits to a partition after the census listed it: the census spares
    it (what it listed was as the full pass left it), and the next census, one grace period
    later, sees the new head and sends the partition to its full pass. A change only waits;
    the census never decides a deletion."""
    _, store, archiver, clock, grace_s = _housekept_daemon(tmp_path)
    other = ManifestStore(store.inner)
    pid = _pid(archiver, 0)
    listed = store.list

    def list_then_commit(prefix: str = "") -> Iterator[ObjectInfo]:
        yield from listed(prefix)
        if prefix == keys.partition_prefix(*pid)[0]:  # the census's piece holding it
            other.update(*pid, lambda m: m.evolve(gc_cutoff_ms=1))

    monkeypatch.setattr(store, "list", list_then_commit)
    clock.advance(grace_s)
    archiver.housekeeping()
    monkeypatch.setattr(store, "list", listed)
    assert store.take() == Counter({("list", "partition"): _census(archiver)})
    clock.advance(grace_s)
    archiver.housekeeping()
    seen = store.take()
    # the census and one full pass
    assert seen[("list", "partition")] == _census(archiver) + 1 and seen[("get", "head")] == 2
    assert archiver.mstore.load(*pid)[0].gc_cutoff_ms == 1


def test_a_census_whose_listing_fails_spares_nothing_and_the_full_passes_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store fault in the middle of the census: the partitions of that piece have their
    full pass, as without a census; the housekeeping pass itself goes on."""
    _, store, archiver, clock, grace_s = _housekept_daemon(tmp_path)
    listed = store.list

    def failing(prefix: str = "") -> Iterator[ObjectInfo]:
        if len(prefix) == 1:  # a census piece
            yield from list(listed(prefix))[:1]
            raise StoreError(f"list {prefix}: connection reset")
        yield from listed(prefix)

    monkeypatch.setattr(store, "list", failing)
    clock.advance(grace_s)
    report = archiver.housekeeping()
    assert report.ok, report.errors
    assert archiver.snapshot().census_spared_total == 0
    assert per_partition(store.take())[("get", "head")] == 2  # every full pass
