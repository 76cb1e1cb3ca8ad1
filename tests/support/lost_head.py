"""A head manifest lost the way a lifecycle rule or a wrong `aws s3 rm` would lose it, after
local retention went ahead: the case docs/format.md ("Losing objects") says must stop the
partition rather than start it afresh over its history."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests import keys
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest
from support.archiving import revision, write_partition
from support.configs import config_over
from support.daemons import running
from support.waiting import wait_until
from tiered.app.daemon import Daemon
from tiered.config import Config
from tiered.store import open_store
from tiered.store.base import ObjectStore


def trim_local_log(part: Path) -> None:
    """Delete the older half of the partition directory's closed segments (all their files):
    local retention went ahead of the loss, so the local log no longer starts at 0."""
    closed = sorted(part.glob("*.log"))[:-1]
    for seg in closed[: len(closed) // 2]:
        for path in part.glob(seg.stem + ".*"):
            path.unlink()


def delete_head_and_copies(store: ObjectStore, topic: str, partition: int, rev: str) -> None:
    """Delete the partition's head manifest and every copy beside it."""
    key = keys.partition_manifest_key(topic, partition, rev)
    meta = keys.partition_meta_prefix(topic, partition, rev)
    store.delete_many([i.key for i in store.list(meta) if i.key.startswith(key)])


@dataclass
class LostHead:
    """A running daemon whose partition orders/0 lost its head and copies (see
    `daemon_with_a_lost_head`), and what the bucket held before the loss."""

    config: Config
    daemon: Daemon
    store: ObjectStore
    rev: str
    #: the head manifest's key
    key: str
    #: when the records were stamped
    now_ms: int
    #: the head as it was before the loss
    before: PartitionManifest
    #: the partition's data objects before the loss
    uploaded: set[str]

    def health(self) -> dict[str, Any]:
        """The daemon's /health answer."""
        with urllib.request.urlopen(self.daemon.server.url + "/health", timeout=10) as answer:
            return dict(json.loads(answer.read()))

    def data_objects(self) -> set[str]:
        return {i.key for i in self.store.list(keys.partition_data_prefix("orders", 0, self.rev))}


@contextlib.contextmanager
def daemon_with_a_lost_head(tmp_path: Path, *, grace_ms: int) -> Iterator[LostHead]:
    """`tiered run` (housekeeping every 100 ms, GC grace `grace_ms`) archives orders/0; once a
    clean pass reported it, the local log is trimmed and the head and its copies deleted.
    Yields once housekeeping reported the lost head with the repair command; the daemon stops
    (and the store closes) when the block ends."""
    config = config_over(tmp_path, cluster={"cloud_storage_gc_grace_period_ms": grace_ms,
                                            "cloud_storage_housekeeping_interval_ms": 100})
    log_dir = config.log_dirs[0]
    now_ms = int(time.time() * 1000)
    write_partition(log_dir, "orders", 0, batches=40, timestamp_ms=now_ms)
    store = open_store(config.store_settings(), probe=False)
    rev = revision(log_dir, "orders", 0)
    key = keys.partition_manifest_key("orders", 0, rev)
    try:
        with running(config) as daemon:
            lost = LostHead(config, daemon, store, rev, key, now_ms,
                            PartitionManifest.new("orders", 0, rev), set())
            part = log_dir / "orders-0"
            active = int(sorted(part.glob("*.log"))[-1].stem)
            # every closed segment committed: no commit is left in flight whose copy could
            # land after the loss below (and would rightly restore the head)
            wait_until(lambda: store.exists(key) and ManifestStore(store).load(
                "orders", 0, rev)[0].next_offset >= active, "every closed segment uploaded")
            wait_until(lambda: lost.health().get("status") == "ok", "a clean pass")
            lost.before, _ = ManifestStore(store).load("orders", 0, rev)
            lost.uploaded = lost.data_objects()
            trim_local_log(log_dir / "orders-0")
            delete_head_and_copies(store, "orders", 0, rev)
            wait_until(lambda: "recover --rebuild-manifests" in json.dumps(lost.health()),
                       "housekeeping to report the lost head", timeout_s=60)
            yield lost
    finally:
        store.close()
