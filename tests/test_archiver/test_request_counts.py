"""Store requests per upload round, per idle pass and per lease change, counted at the store.

The counts are the cost model docs/operations.md ("Sizing") gives: a round's commit is shared
by its segments, a partition with nothing new costs no request in the upload loop, local
retention or the leases, and quiet housekeeping costs one HEAD. Counted, never timed."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from support.archiving import Clock, Disk, write_partition
from support.configs import config_over
from support.counting import CountingStore as Requests

from archiver.lease_keeper import LeaseKeeper
from archiver.service import Archiver
from tiered.config import Config
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
        again.spread_first_full_pass = spread
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
