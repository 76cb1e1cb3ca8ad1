"""Upload leases for the commands that write to the bucket: which `Ownership` each one gets.

Every process that uploads (`tiered run`, `tiered archive --once`) takes part in the upload
leases under its node id (`Config.node_id`): only the holder of a partition's lease uploads
it, housekeeps it and collects its garbage (docs/operations.md, "One sidecar per broker").
The daemon is a full member: it renews its record, takes its share, hands partitions over
and releases them when it stops. `archive --once` is passive: beside its own node's daemon
it works under exactly that daemon's leases; alone it takes only what no running daemon
could, and leaves what it took for its node's next run. `describe-storage` reads the leases
and writes nothing.

A store without enforced conditional writes (the single-writer opt-out) cannot make leases
safe; there the process is the sole writer, as the operator declared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from archiver.lease_keeper import LeaseKeeper, LeaseView, Ownership
from archiver.service import Archiver
from manifests.commit import ManifestStore
from manifests.spillover import ManifestSettings
from tiered.config import Config
from tiered.store.base import ObjectStore

__all__ = ["keeper_for", "lease_view_for", "leases_for"]

log = logging.getLogger(__name__)


def keeper_for(config: Config, store: ObjectStore, *, passive: bool,
               on_change: Callable[[], None] | None = None) -> LeaseKeeper | None:
    """A lease keeper for this node on `store`, or None when the store cannot hold leases
    safely (conditional writes not enforced): the caller is then the sole writer."""
    if not store.enforces_conditions:
        log.warning("conditional writes are off on %s (the single-writer opt-out): no upload "
                    "leases; this process uploads every partition it holds", config.storage.url)
        return None
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    node = config.node_id()
    lease_ms = config.cluster_int("cloud_storage_upload_lease_ms", 30_000)
    return LeaseKeeper(store, mstore, node, lease_ms, passive=passive, on_change=on_change)


@contextmanager
def leases_for(archiver: Archiver, keeper: LeaseKeeper | None, *, release: bool
               ) -> Iterator[LeaseKeeper | None]:
    """Run `keeper` for `archiver` while inside: its first tick before the first upload, then
    on its own thread; stopped on the way out (with `release`, its leases handed back).
    None: no leases, the archiver stays the sole writer."""
    if keeper is None:
        yield None
        return
    keeper.bind(archiver.idle, archiver.stopping)
    # one manifest store: the heads the keeper reads and fences while taking leases are the
    # versions the archiver's first commits replace (no re-read to learn their terms)
    keeper.mstore = archiver.mstore
    archiver.ownership = keeper
    archiver.ownership.publish(archiver.replicas())
    log.info("upload leases: node %s, lease %d ms%s", keeper.node, keeper.lease_ms,
             " (passive: this command takes no share of its own)" if keeper.passive else "")
    keeper.start()
    try:
        yield keeper
    finally:
        keeper.stop(release=release)  # from here on the keeper says "standby" everywhere


def lease_view_for(config: Config, store: ObjectStore) -> Ownership:
    """Who uploads what, read from the leases, for `describe-storage`."""
    return LeaseView(store, config.node_id())
