"""Upload leases and node records: which of the sidecars sharing a bucket uploads a partition.

Two kinds of small JSON objects (docs/format.md, "Upload leases" gives the format and the
safety argument):

* a partition's **lease**, beside its head manifest: the node holding it and the lease's
  generation, which is the writer term the holder's manifest commits carry. It changes only
  when the partition changes hands, and only by compare-and-swap (`If-None-Match` to create,
  `If-Match` on the version read to replace), so two nodes can never both win it;
* a **node record** per sidecar, under `_tiered/nodes/`: what the node holds and which
  partitions it has replicas of (with their high watermarks). The node rewrites it every
  renewal interval; that it keeps changing is what keeps its leases alive in the eyes of the
  others, so no lease object is rewritten while nothing changes hands.

This module is the documents, their JSON and their reads and writes; when to renew, whom to
hand a partition to and when a holder counts as gone are `archiver.lease_keeper`'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from manifests import keys
from manifests.cas import put_on_version
from manifests.errors import CorruptManifest, InvalidName, ManifestError
from manifests.model import FORMAT_VERSION
from manifests.serde import load_document
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound

__all__ = [
    "KIND_LEASE",
    "KIND_NODE",
    "Lease",
    "NodeRecord",
    "PartitionId",
    "ReplicaState",
    "decode_lease",
    "decode_node_record",
    "delete_node_record",
    "encode_lease",
    "encode_node_record",
    "iter_node_records",
    "read_lease",
    "read_node_record",
    "write_lease",
    "write_node_record",
]

KIND_LEASE = "lease"
KIND_NODE = "node"

_LEASE_FIELDS = ("version", "kind", "topic", "partition", "revision", "holder", "generation",
                 "changed_ms")
_NODE_FIELDS = ("version", "kind", "node", "sequence", "renewed_ms", "lease_ms", "passive",
                "replicas", "holding")


class PartitionId(NamedTuple):
    """A partition as the bucket knows it: topic, partition number and revision."""

    topic: str
    partition: int
    revision: str

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def lease_key(self) -> str:
        return keys.partition_lease_key(self.topic, self.partition, self.revision)


def _partition_id(topic: object, partition: object, revision: object, where: str | None
                  ) -> PartitionId:
    try:
        return PartitionId(keys.validate_topic_name(topic), keys.validate_partition(partition),
                           keys.validate_revision(revision))
    except InvalidName as exc:
        raise CorruptManifest(str(exc), key=where) from None


def _int(value: object, name: str, where: str | None, *, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:
        raise CorruptManifest(f"{name} must be an integer >= {minimum}, got {value!r}", key=where)
    return value


def _bool(value: object, name: str, where: str | None) -> bool:
    if type(value) is not bool:
        raise CorruptManifest(f"{name} must be true or false, got {value!r}", key=where)
    return value


def _node(value: object, name: str, where: str | None) -> str:
    try:
        return keys.validate_node_id(value)
    except InvalidName as exc:
        raise CorruptManifest(f"{name}: {exc}", key=where) from None


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


# -- leases --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    """A partition's upload lease. `holder` None: free (released, or never taken); the
    generation is kept so the next holder's is larger. `changed_ms` is when it last changed
    hands by the writer's clock: for people reading the bucket, never for a decision."""

    partition: PartitionId
    holder: str | None
    generation: int
    changed_ms: int = 0

    def __post_init__(self) -> None:
        if self.holder is not None:
            keys.validate_node_id(self.holder)
        if type(self.generation) is not int or self.generation < 0:
            raise InvalidName(f"lease generation must be a non-negative integer, "
                              f"got {self.generation!r}")


def encode_lease(lease: Lease) -> bytes:
    p = lease.partition
    return _dump({"version": FORMAT_VERSION, "kind": KIND_LEASE, "topic": p.topic,
                  "partition": p.partition, "revision": p.revision, "holder": lease.holder,
                  "generation": lease.generation, "changed_ms": lease.changed_ms})


def decode_lease(data: bytes, *, key: str | None = None) -> Lease:
    """Parse a lease; `CorruptManifest` / `UnsupportedManifestVersion` on bad input, and when
    it describes another partition than the key it was read from."""
    doc = load_document(data, key, KIND_LEASE, _LEASE_FIELDS)
    pid = _partition_id(doc["topic"], doc["partition"], doc["revision"], key)
    if key is not None and pid.lease_key != key:
        raise CorruptManifest(f"describes {pid} revision {pid.revision}, not this key's "
                              "partition", key=key)
    holder = doc["holder"]
    return Lease(pid, None if holder is None else _node(holder, "holder", key),
                 _int(doc["generation"], "generation", key),
                 _int(doc["changed_ms"], "changed_ms", key))


def read_lease(store: ObjectStore, pid: PartitionId) -> tuple[Lease | None, str | None]:
    """The stored lease and its ETag in one GET, or (None, None) when the partition has none."""
    try:
        data = store.get(pid.lease_key)
    except ObjectNotFound:
        return None, None
    return decode_lease(data, key=pid.lease_key), data.etag


def write_lease(store: ObjectStore, lease: Lease, expected_etag: str | None) -> str:
    """Replace the version `expected_etag` of the lease (None: create it, only if absent) and
    return the new ETag. Raises `PreconditionFailed` when another writer changed it first."""
    return put_on_version(store, lease.partition.lease_key, encode_lease(lease), expected_etag)


# -- node records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaState:
    """How far a node's replica of a partition has come: its high watermark now and one lease
    time ago (-1: it has not watched that long). A holder is behind when its high watermark
    now is below another node's of a lease time ago: plain follower lag never lasts that long."""

    high_watermark: int
    high_watermark_ago: int = -1


@dataclass(frozen=True)
class NodeRecord:
    """One sidecar's record. `sequence` grows with every renewal, so each one is a new version
    the others can see change. `passive`: a one-shot command (`archive --once`), alive but not
    to be given partitions. `holding` maps the leases the node holds to their generations. A
    node that stops cleanly releases its leases and deletes its record."""

    node: str
    sequence: int
    renewed_ms: int
    lease_ms: int
    passive: bool = False
    replicas: Mapping[PartitionId, ReplicaState] = field(default_factory=dict)
    holding: Mapping[PartitionId, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        keys.validate_node_id(self.node)

    @property
    def key(self) -> str:
        return keys.node_record_key(self.node)


def encode_node_record(r: NodeRecord) -> bytes:
    replicas = [[p.topic, p.partition, p.revision, s.high_watermark, s.high_watermark_ago]
                for p, s in sorted(r.replicas.items())]
    holding = [[p.topic, p.partition, p.revision, g] for p, g in sorted(r.holding.items())]
    return _dump({"version": FORMAT_VERSION, "kind": KIND_NODE, "node": r.node,
                  "sequence": r.sequence, "renewed_ms": r.renewed_ms, "lease_ms": r.lease_ms,
                  "passive": r.passive, "replicas": replicas,
                  "holding": holding})


def _rows(value: object, name: str, width: int, where: str | None) -> list[list[Any]]:
    if not isinstance(value, list) or not all(
            isinstance(row, list) and len(row) == width for row in value):
        raise CorruptManifest(f"{name} must be a list of {width}-element rows", key=where)
    return value


def decode_node_record(data: bytes, *, key: str | None = None) -> NodeRecord:
    """Parse a node record; `CorruptManifest` / `UnsupportedManifestVersion` on bad input."""
    doc = load_document(data, key, KIND_NODE, _NODE_FIELDS)
    node = _node(doc["node"], "node", key)
    if key is not None and keys.node_record_key(node) != key:
        raise CorruptManifest(f"is the record of node {node!r}, not this key's", key=key)
    replicas: dict[PartitionId, ReplicaState] = {}
    for topic, partition, revision, hw, hw_ago in _rows(doc["replicas"], "replicas", 5, key):
        replicas[_partition_id(topic, partition, revision, key)] = ReplicaState(
            _int(hw, "high watermark", key), _int(hw_ago, "high watermark", key, minimum=-1))
    holding: dict[PartitionId, int] = {}
    for topic, partition, revision, generation in _rows(doc["holding"], "holding", 4, key):
        holding[_partition_id(topic, partition, revision, key)] = _int(
            generation, "generation", key)
    return NodeRecord(node, _int(doc["sequence"], "sequence", key),
                      _int(doc["renewed_ms"], "renewed_ms", key),
                      _int(doc["lease_ms"], "lease_ms", key, minimum=1),
                      _bool(doc["passive"], "passive", key), replicas, holding)


def read_node_record(store: ObjectStore, node: str) -> tuple[NodeRecord, str] | None:
    """A node's record and its ETag, or None when it has none."""
    key = keys.node_record_key(node)
    try:
        data = store.get(key)
    except ObjectNotFound:
        return None
    return decode_node_record(data, key=key), data.etag


def write_node_record(store: ObjectStore, record: NodeRecord) -> str:
    """Write the node's record. Unconditional on purpose: every process of one node (the
    daemon, an `archive --once` beside it) speaks for the node, and whichever renews keeps it
    alive."""
    return store.put(record.key, encode_node_record(record))


def delete_node_record(store: ObjectStore, node: str) -> None:
    """Remove the node's record: what a node stopping cleanly does last, so the others see
    in their next listing that it is gone."""
    failed = store.delete_many([keys.node_record_key(node)])
    if failed:
        raise ManifestError(f"could not delete {failed[0]}")


def iter_node_records(store: ObjectStore) -> Iterator[tuple[str, str, float]]:
    """(node, ETag, last-modified seconds) of every node record: one listing, so watching the
    others costs one request however many there are. Foreign keys are skipped."""
    for info in store.list(keys.NODE_RECORDS_PREFIX):
        node = keys.parse_node_record_key(info.key)
        if node is not None:
            yield node, info.etag, info.last_modified
