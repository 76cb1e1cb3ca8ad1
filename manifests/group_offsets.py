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

Every change here (a commit, OffsetDelete, offsets retention) decides from a fresh read of the
object and writes by compare-and-swap on the version read, re-reading when it loses; a group
with no offsets left is deleted (docs/format.md, "Consumer group offsets").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

from manifests import keys
from manifests.cas import put_on_version, swap
from manifests.errors import CorruptManifest, InvalidName, ManifestError
from manifests.serde import load_document
from tiered.store.base import ObjectInfo, ObjectStore
from tiered.store.errors import ObjectNotFound, PreconditionFailed, StoreError

__all__ = [
    "CommittedOffset",
    "GroupLimitReached",
    "GroupOffsets",
    "UnknownGroup",
    "commit_group_offsets",
    "commit_within_limits",
    "decode_group_offsets",
    "delete_group",
    "delete_offsets",
    "encode_group_offsets",
    "expire_group_offsets",
    "group_of_key",
    "iter_group_objects",
    "load_group_offsets",
]

KIND_GROUP_OFFSETS = "group_offsets"
GROUP_OFFSETS_VERSION = 1
#: how long a commit keeps retrying while other sidecars commit for the same group, seconds
COMMIT_DEADLINE_S = 10.0
_FIELDS = ("version", "kind", "group", "offsets")
_ENTRY_FIELDS = ("topic", "partition", "offset", "leader_epoch", "metadata", "commit_timestamp")
_INT64 = (-(2**63), 2**63 - 1)
#: the format's ceiling on a metadata string; the endpoint refuses longer ones than its own
#: limit (`[kafka] offset_metadata_max_bytes`, 4096 by default, at most this) before they
#: reach the bucket
MAX_METADATA_CHARS = 1 << 20


class GroupLimitReached(ManifestError):
    """A commit would create the offsets of one group more than the bucket may hold."""


class UnknownGroup(ManifestError):
    """The bucket holds no committed offsets of this group."""

    exit_code = 7


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
    return commit_within_limits(store, group, commits, deadline_s=deadline_s)[0]


def commit_within_limits(
    store: ObjectStore, group: str, commits: Mapping[TopicPartitionKey, CommittedOffset],
    *, max_offsets: int | None = None, may_create: Callable[[], bool] | None = None,
    deadline_s: float = COMMIT_DEADLINE_S,
) -> tuple[GroupOffsets, frozenset[TopicPartitionKey]]:
    """`commit_group_offsets` within the bucket's bounds: what was stored, and the partitions
    refused because the group would hold offsets for more than `max_offsets` partitions
    (partitions it holds already are always updated; new ones are taken in order while they
    fit). `may_create()` is asked, from a read that found no object, whether one more group
    may be created: `GroupLimitReached` when not."""

    def attempt() -> tuple[GroupOffsets, frozenset[TopicPartitionKey]]:
        current, etag = load_group_offsets(store, group)
        accepted, refused = _fit(current, commits, max_offsets)
        if not accepted:
            return current, refused
        if etag is None and may_create is not None and not may_create():
            raise GroupLimitReached(f"group {group!r}: the bucket holds the offsets of as many "
                                    "groups as it may")
        updated = current.with_commits(accepted)
        data = encode_group_offsets(updated)
        put_on_version(store, updated.key, data, etag)
        return updated, refused

    return _cas(group, attempt, "committed", deadline_s)


def _fit(current: GroupOffsets, commits: Mapping[TopicPartitionKey, CommittedOffset],
         max_offsets: int | None
         ) -> tuple[dict[TopicPartitionKey, CommittedOffset], frozenset[TopicPartitionKey]]:
    if max_offsets is None:
        return dict(commits), frozenset()
    room = max_offsets - len(current.offsets)
    accepted: dict[TopicPartitionKey, CommittedOffset] = {}
    refused: set[TopicPartitionKey] = set()
    for tp, committed in sorted(commits.items()):
        if tp in current.offsets:
            accepted[tp] = committed
        elif room > 0:
            accepted[tp] = committed
            room -= 1
        else:
            refused.add(tp)
    return accepted, frozenset(refused)


def _cas(group: str, attempt: Callable[[], Any], what: str, deadline_s: float) -> Any:
    return swap(attempt, key=keys.group_offsets_key(group),
                what=f"the group's offsets (being {what})", deadline_s=deadline_s)


def _drop(store: ObjectStore, current: GroupOffsets, etag: str,
          gone: Collection[TopicPartitionKey]) -> GroupOffsets:
    """Write `current` without `gone`, on the version `etag` read; an object left without
    offsets is deleted instead.

    The store has no conditional delete, so a commit landing between the read that found the
    group empty and the delete would go with it: the delete re-reads first and deletes only
    the version it decided on, which narrows that window to one request's time (docs/format.md,
    "Consumer group offsets")."""
    kept = GroupOffsets(current.group,
                        {tp: c for tp, c in current.offsets.items() if tp not in gone})
    if kept.offsets:
        put_on_version(store, kept.key, encode_group_offsets(kept), etag)
        return kept
    if store.head(kept.key).etag != etag:
        raise PreconditionFailed(f"{kept.key}: changed while being emptied")
    failed = store.delete_many([kept.key])
    if failed:
        raise StoreError(f"{kept.key}: could not be deleted")
    return kept


def expire_group_offsets(
    store: ObjectStore, group: str, expired: Callable[[CommittedOffset], bool],
    *, deadline_s: float = COMMIT_DEADLINE_S,
) -> tuple[int, bool]:
    """Offsets retention for one group, decided from a fresh read: drop the offsets
    `expired(offset)` says have expired, by compare-and-swap (a commit that lands first wins,
    and the decision is made again on what it wrote). Returns (offsets dropped, whether the
    group's object was deleted: none left)."""

    def attempt() -> tuple[int, bool]:
        current, etag = load_group_offsets(store, group)
        if etag is None:
            return 0, False
        gone = [tp for tp, c in current.offsets.items() if expired(c)]
        if current.offsets and not gone:
            return 0, False
        kept = _drop(store, current, etag, gone)
        return len(gone), not kept.offsets

    result: tuple[int, bool] = _cas(group, attempt, "expired", deadline_s)
    return result


def delete_offsets(
    store: ObjectStore, group: str, partitions: Collection[TopicPartitionKey],
    *, deadline_s: float = COMMIT_DEADLINE_S,
) -> frozenset[TopicPartitionKey]:
    """Remove the group's offsets of `partitions` (Kafka's OffsetDelete) by compare-and-swap;
    returns those it held. A group left without offsets is deleted."""

    def attempt() -> frozenset[TopicPartitionKey]:
        current, etag = load_group_offsets(store, group)
        present = frozenset(tp for tp in partitions if tp in current.offsets)
        if etag is not None and present:
            _drop(store, current, etag, present)
        return present

    result: frozenset[TopicPartitionKey] = _cas(group, attempt, "deleted", deadline_s)
    return result


def delete_group(store: ObjectStore, group: str) -> bool:
    """Delete the group's committed offsets (Kafka's DeleteGroups); False when the bucket
    holds none for it."""
    key = keys.group_offsets_key(group)
    try:
        store.head(key)
    except ObjectNotFound:
        return False
    failed = store.delete_many([key])
    if failed:
        raise StoreError(f"{key}: could not be deleted")
    return True


def group_of_key(key: str) -> str | None:
    """The group id whose offsets `key` holds, None for a key no group's offsets have."""
    parts = key.split("/")
    if len(parts) != 5 or key != keys.GROUPS_PREFIX + "/".join(parts[2:]):
        return None
    try:
        group = unquote(parts[3], encoding="utf-8", errors="strict")
        return group if keys.group_offsets_key(group) == key else None
    except (UnicodeDecodeError, InvalidName):
        return None


def iter_group_objects(store: ObjectStore) -> Iterator[tuple[str, ObjectInfo]]:
    """Every group with committed offsets in the bucket, with its object (one listing;
    objects under the prefix that are no group's are skipped)."""
    for info in store.list(keys.GROUPS_PREFIX):
        group = group_of_key(info.key)
        if group is not None:
            yield group, info
