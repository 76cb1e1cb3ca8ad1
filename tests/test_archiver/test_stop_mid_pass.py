"""A stop requested in the middle of a pass ends it with the partitions in flight: the ones not
started wait for the next run, so a clean stop takes a partition's time, not a pass's
(docs/operations.md, "Start and stop"). Counted at a store wrapper, never timed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from support.archiving import Disk, write_partition
from support.configs import config_over
from support.counting import CountingStore, kind
from support.daemons import running
from support.waiting import wait_until

from archiver.lease_keeper import LeaseKeeper
from archiver.service import Archiver
from manifests import keys
from tiered.config import Config
from tiered.store.base import ObjectStore
from tiered.store.file import FileStore

PARTITIONS = 24


class StopAfter(CountingStore):
    """Counts requests; calls `stop` once `after` PUTs of `what` went through, and optionally
    slows every request down (a distant store)."""

    def __init__(self, inner: ObjectStore, what: str, after: int, delay_s: float = 0.0) -> None:
        super().__init__(inner)
        self.what, self.after, self.delay_s = what, after, delay_s
        self.stop = threading.Event().set
        self.stopped = threading.Event()

    def _count(self, operation: str, what: str) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        super()._count(operation, what)
        if operation == "put" and what == self.what and not self.stopped.is_set():
            with self._lock:
                due = self.seen[operation, what] >= self.after
            if due:
                self.stopped.set()
                self.stop()


def setup(tmp_path: Path) -> Config:
    config = config_over(tmp_path)
    now_ms = int(time.time() * 1000)
    for p in range(PARTITIONS):  # two closed segments each
        write_partition(config.log_dirs[0], "orders", p, batches=6, segment_bytes=3000,
                        timestamp_ms=now_ms)
    return config


def heads(store: ObjectStore) -> int:
    return sum(1 for info in store.list("") if kind(info.key) == "head")


def test_a_stop_ends_the_upload_round_after_the_partitions_in_flight(tmp_path: Path) -> None:
    config = setup(tmp_path)
    store = StopAfter(FileStore(config.store_settings()), "segment", after=1)
    archiver = Archiver(config, store, disk_usage=Disk())
    archiver.stopping = store.stopped.is_set
    in_flight = archiver.throttle.budget.concurrency
    report = archiver.upload_round()
    # the partitions started before the stop finish (each its two segments, committed); no
    # other partition is started
    assert 1 <= len(report.partitions) <= in_flight < PARTITIONS
    assert all(row.uploaded_segments == 2 for row in report.partitions)
    assert heads(store) == len(report.partitions)
    # the next run uploads the rest: nothing was lost by stopping
    archiver.stopping = lambda: False
    rest = archiver.upload_round()
    assert sum(r.uploaded_segments for r in rest.partitions) == 2 * (
        PARTITIONS - len(report.partitions))
    assert heads(store) == PARTITIONS


def test_a_stop_ends_housekeeping_after_the_partitions_in_flight(tmp_path: Path) -> None:
    config = setup(tmp_path)
    store = StopAfter(FileStore(config.store_settings()), "never", after=1)
    archiver = Archiver(config, store, disk_usage=Disk())
    archiver.upload_round()
    archiver.stopping = store.stopped.is_set
    store.take()
    store.stopped.set()
    assert archiver.housekeeping().partitions == []
    assert store.take() == {}  # not one partition's request once stopping
    store.stopped.clear()
    assert len(archiver.housekeeping().partitions) == PARTITIONS


def test_a_stop_ends_the_lease_keepers_acquisitions(tmp_path: Path) -> None:
    config = setup(tmp_path)
    store = StopAfter(FileStore(config.store_settings()), "lease", after=1, delay_s=0.01)
    archiver = Archiver(config, store, disk_usage=Disk())
    keeper = LeaseKeeper(store, archiver.mstore, "n1", 30_000)
    keeper.bind(archiver.idle, store.stopped.is_set)
    archiver.ownership = keeper
    keeper.publish(archiver.replicas())
    keeper.tick()
    # the acquisitions already running finish; none starts after the stop
    held = len(keeper.holdings())
    assert 1 <= held < PARTITIONS
    assert store.seen["put", "lease"] == held


def test_a_stopping_daemon_leaves_the_partitions_not_started_and_its_leases(
        tmp_path: Path) -> None:
    config = setup(tmp_path)
    # a distant store: a whole pass over the partitions would take seconds
    store = StopAfter(FileStore(config.store_settings()), "segment", after=2, delay_s=0.01)
    with running(config, open_store=lambda c: store) as daemon:
        store.stop = lambda: daemon.request_stop("stop in the middle of the first round")
        wait_until(lambda: daemon.state.phase == "stopping", "the stop")
    uploaded = heads(store.inner)
    assert 1 <= uploaded < PARTITIONS
    # the node's record is gone: every lease it held is free for the others at once
    assert not [i for i in store.inner.list(keys.NODE_RECORDS_PREFIX)]
