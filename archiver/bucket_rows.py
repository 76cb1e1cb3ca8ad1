"""`describe-storage` rows of partitions the bucket knows and this node's log dirs do not: a
history server's whole view (`[log] dirs = []`), or a topic asked for by name that lives only
in the bucket. The same JSON fields as the rows of local partitions (`reports.storage_row`),
with nothing local and nothing pending."""

from __future__ import annotations

import logging
from typing import Any

from archiver.lease_keeper import Ownership
from archiver.reports import remote_section
from manifests.commit import ManifestStore
from manifests.lease_objects import PartitionId
from manifests.manifest import PartitionManifest
from manifests.topic import iter_topic_manifest_keys, load_topic_manifest
from tiered.errors import TieredError
from tiered.store.base import ObjectStore

__all__ = ["bucket_rows", "bucket_topics"]

log = logging.getLogger(__name__)


def bucket_topics(store: ObjectStore, topic: str | None = None) -> dict[str, tuple[str, int]]:
    """Topic -> (revision, partition count) from the bucket's topic manifests (16 listings).
    A topic deleted and recreated has a manifest per revision: its newest counts, as the read
    path picks it. `topic`: only that one."""
    newest: dict[str, tuple[float, str]] = {}
    for name, revision, key in iter_topic_manifest_keys(store):
        if topic is not None and name != topic:
            continue
        try:
            modified = store.head(key).last_modified
        except TieredError as exc:
            log.warning("%s: cannot read the topic manifest %s: %s", name, key, exc)
            continue
        if name not in newest or modified > newest[name][0]:
            newest[name] = (modified, revision)
    out: dict[str, tuple[str, int]] = {}
    for name, (_modified, revision) in sorted(newest.items()):
        try:
            manifest = load_topic_manifest(store, name, revision)
        except TieredError as exc:
            log.warning("%s: cannot read its topic manifest: %s", name, exc)
            continue
        if manifest is not None:
            out[name] = (revision, manifest.partition_count)
    return out


def bucket_rows(mstore: ManifestStore, ownership: Ownership, topics: dict[str, tuple[str, int]]
                ) -> list[dict[str, Any]]:
    """One row per partition of `topics` (from `bucket_topics`), read from its head manifest;
    a head that cannot be read gets an `error` in `remote`, as a local partition's would."""
    rows = []
    for name, (revision, count) in topics.items():
        for partition in range(count):
            error: str | None = None
            m: PartitionManifest | None = None
            try:
                m, _etag = mstore.load(name, partition, revision)
            except TieredError as exc:
                error = str(exc)
            role = ownership.role(PartitionId(name, partition, revision))
            rows.append({
                "topic": name, "partition": partition, "high_watermark": None,
                "local": {"start_offset": None, "last_offset": None, "size_bytes": 0,
                          "segments": 0},
                "remote": remote_section(m, error),
                "pending_bytes": 0, "safe_to_delete_below": None,
                "uploader": role.holder, "role": role.name,
            })
    return rows
