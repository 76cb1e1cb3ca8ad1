"""Committed consumer-group offsets in the bucket: what the Kafka endpoint's OffsetCommit writes
and OffsetFetch reads, so any sidecar serving the bucket, or one restarted, resumes a group
where it left off (docs/format.md, "Consumer group offsets").

One JSON object per group at `keys.group_offsets_key(group)`:

    {"version":1,"kind":"group_offsets","group":"g",
     "offsets":[{"topic":"t","partition":0,"offset":42,"leader_epoch":-1,
                 "metadata":"","commit_timestamp":1700000000000}]}

`offsets` is sorted by (topic, partition); `metadata` is the client's string (null allowed);
`leader_epoch` -1 means unknown; `commit_timestamp` is ms since the epoch. A commit is a
compare-and-swap of the whole object (`If-None-Match` to create it, `If-Match` on the version
read to replace it), so two sidecars committing for one group at once both land.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from manifests import keys
from manifests.cas import retry_conflicts
from manifests.errors import CorruptManifest, InvalidName, ManifestError
from manifests.serde import load_document
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound, PreconditionFailed

__all__ = [
    "CommittedOffset",
    "GroupOffsets",
    "commit_group_offsets",
    "decode_group_offsets",
    "encode_group_offsets",
    "load_group_offsets",
]

KIND_GROUP_OFFSETS = "group_offsets"
GROUP_OFFSETS_VERSION = 1
#: how long a commit keeps retrying while other sidecars commit for the same group, seconds
COMMIT_DEADLINE_S = 10.0
_FIELDS = ("version", "kind", "group", "offsets")
_ENTRY_FIELDS = ("topic", "partition", "offset", "leader_epoch", "metadata", "commit_timestamp")
_INT64 = (-(2**63), 2**63 - 1)
#: Kafka's OffsetCommit metadata is a string of at most this many characters by default
#: (offset.metadata.max.bytes); larger ones are refused before they reach the bucket
MAX_METADATA_CHARS = 4096


@dataclass(frozen=True)
class CommittedOffset:
    """What a consumer committed for one partition."""

    #: the next offset the group will read
    offset: int
    #: leader epoch of the last record consumed, -1 when unknown
    leader_epoch: int = -1
    #: the client's own string, stored and returned as is
    metadata: str | None = ""
    #: when it was committed, ms since the epoch
    commit_timestamp: int = -1


TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class GroupOffsets:
    """A group's committed offsets by (topic, partition)."""

    group: str
    offsets: Mapping[TopicPartitionKey, CommittedOffset] = field(
        default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        keys.group_key_component(self.group)  # InvalidName for an id no key can hold
        for (topic, partition), committed in self.offsets.items():
            keys.validate_topic_name(topic)
            keys.validate_partition(partition)
            _check_entry(committed)
        object.__setattr__(self, "offsets", MappingProxyType(dict(sorted(self.offsets.items()))))

    @property
    def key(self) -> str:
        return keys.group_offsets_key(self.group)

    def with_commits(self, commits: Mapping[TopicPartitionKey, CommittedOffset]) -> GroupOffsets:
        """These offsets with `commits` applied on top (the latest commit of a partition wins)."""
        return GroupOffsets(self.group, {**self.offsets, **commits})


def _check_entry(c: CommittedOffset) -> None:
    for name in ("offset", "leader_epoch", "commit_timestamp"):
        value = getattr(c, name)
        if type(value) is not int or not _INT64[0] <= value <= _INT64[1]:
            raise InvalidName(f"committed {name} must be a 64-bit integer, got {value!r}")
    if c.metadata is not None and (not isinstance(c.metadata, str)
                                   or len(c.metadata) > MAX_METADATA_CHARS):
        raise InvalidName(f"committed metadata must be a string of at most "
                          f"{MAX_METADATA_CHARS} characters")


def encode_group_offsets(g: GroupOffsets) -> bytes:
    entries = [{"topic": t, "partition": p, "offset": c.offset, "leader_epoch": c.leader_epoch,
                "metadata": c.metadata, "commit_timestamp": c.commit_timestamp}
               for (t, p), c in g.offsets.items()]
    doc = {"version": GROUP_OFFSETS_VERSION, "kind": KIND_GROUP_OFFSETS, "group": g.group,
           "offsets": entries}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def decode_group_offsets(data: bytes, *, key: str | None = None) -> GroupOffsets:
    """Parse a group's offsets object; `CorruptManifest` / `UnsupportedManifestVersion` on
    anything malformed."""
    doc = load_document(data, key, KIND_GROUP_OFFSETS, _FIELDS, newest=GROUP_OFFSETS_VERSION)
    group, entries = doc["group"], doc["offsets"]
    if not isinstance(group, str) or not isinstance(entries, list):
        raise CorruptManifest("group must be a string and offsets a list", key=key)
    offsets: dict[TopicPartitionKey, CommittedOffset] = {}
    for i, entry in enumerate(entries):
        offsets.update(_decode_entry(entry, i, key))
    if len(offsets) != len(entries):
        raise CorruptManifest("a partition is listed twice", key=key)
    try:
        return GroupOffsets(group, offsets)
    except ManifestError as exc:
        raise CorruptManifest(str(exc), key=key) from exc


def _decode_entry(entry: Any, i: int, key: str | None
                  ) -> dict[TopicPartitionKey, CommittedOffset]:
    if not isinstance(entry, dict) or sorted(entry) != sorted(_ENTRY_FIELDS):
        raise CorruptManifest(f"offsets[{i}] must have exactly the fields "
                              f"{', '.join(_ENTRY_FIELDS)}", key=key)
    ints = ("partition", "offset", "leader_epoch", "commit_timestamp")
    if not isinstance(entry["topic"], str) or any(type(entry[n]) is not int for n in ints):
        raise CorruptManifest(f"offsets[{i}]: topic must be a string and {', '.join(ints)} "
                              "integers", key=key)
    if entry["metadata"] is not None and not isinstance(entry["metadata"], str):
        raise CorruptManifest(f"offsets[{i}]: metadata must be a string or null", key=key)
    committed = CommittedOffset(entry["offset"], entry["leader_epoch"], entry["metadata"],
                                entry["commit_timestamp"])
    return {(entry["topic"], entry["partition"]): committed}


def load_group_offsets(store: ObjectStore, group: str) -> tuple[GroupOffsets, str | None]:
    """The group's committed offsets and the object's version (None: nothing committed yet)."""
    key = keys.group_offsets_key(group)
    try:
        data = store.get(key)
    except ObjectNotFound:
        return GroupOffsets(group), None
    got = decode_group_offsets(data, key=key)
    if got.group != group:
        raise CorruptManifest(f"holds the offsets of group {got.group!r}", key=key)
    return got, data.etag


def commit_group_offsets(
    store: ObjectStore, group: str, commits: Mapping[TopicPartitionKey, CommittedOffset],
    *, deadline_s: float = COMMIT_DEADLINE_S,
) -> GroupOffsets:
    """Apply `commits` to the stored offsets by compare-and-swap, re-reading and re-applying
    when another writer got there first; returns what was stored."""

    def attempt() -> GroupOffsets:
        current, etag = load_group_offsets(store, group)
        updated = current.with_commits(commits)
        data = encode_group_offsets(updated)
        if etag is None:
            store.put(updated.key, data, if_none_match=True)
        else:
            store.put(updated.key, data, if_match=etag)
        return updated

    try:
        return retry_conflicts(attempt, conflict=PreconditionFailed, deadline_s=deadline_s)
    except PreconditionFailed:
        raise ManifestError(f"{keys.group_offsets_key(group)}: the group's offsets kept changing "
                            "while being committed; try again") from None
