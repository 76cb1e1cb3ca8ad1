"""Object keys of the bucket format: the one place every package names objects.

    {h}/kafka/{topic}/{partition}_{revision}/{base}-{last}-{term}.log      segment bytes
    {h}/kafka/{topic}/{partition}_{revision}/{base}-{last}-{term}.index    its offset index
    {h}/meta/kafka/{topic}/{partition}_{revision}/manifest.json            head manifest
    {h}/meta/kafka/{topic}/{partition}_{revision}/manifest.json.{base}.{last}.{ts0}.{ts1}.{level}.{crc}
                                                                             archived manifest
    {h}/meta/kafka/{topic}/{partition}_{revision}/lease.json               upload lease
    {d}0000000/topics/{topic}/{revision}/topic_manifest.json               topic manifest
    _tiered/nodes/{node}.json                                               sidecar record
    _tiered/groups/{g}/{group}/offsets.json                               a consumer group's
                                                                             committed offsets
    _tiered/security/users.json, acls.json                                   users and ACLs

`{h}` is the first 8 hex digits of SHA-256 over `{topic}/{partition}_{revision}`: stable
across processes and releases (never Python's salted `hash()`), so keys are derivable from
(topic, partition, revision) alone and partitions spread over S3's key-prefix partitions.
`{d}` is one hex digit of SHA-256 over the topic name, so topic manifests live under exactly
16 fixed prefixes that recovery can list. Every component is validated so no key holds `/`
inside a component, `..`, `:` or anything outside `[A-Za-z0-9._-]`. `_tiered/` is reserved for
tiered's own objects that belong to no partition (the conditional-write probe, committed
consumer offsets); there `{g}` is 8 hex digits of SHA-256 over the group id and `{group}` the id
percent-encoded (`%` is the one character outside that set). docs/format.md is the reference
for this layout.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import NamedTuple
from urllib.parse import quote

from manifests.errors import InvalidName, InvalidTopicName
from tiered.topics import node_id_problem, topic_name_problem

MAX_REVISION_LENGTH = 64
#: a single path component of a POSIX file name, so the file store can hold every key
MAX_OBJECT_NAME_LENGTH = 255
MAX_PARTITION = 2**31 - 1

_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
_REVISION = re.compile(r"[A-Za-z0-9_-]+")

#: namespace component; Kafka's data is all one namespace, kept so the layout can grow others
NAMESPACE = "kafka"
PARTITION_MANIFEST_NAME = "manifest.json"
#: the partition's upload lease, beside its head manifest (docs/format.md, "Upload leases")
LEASE_NAME = "lease.json"
#: where every sidecar sharing the bucket keeps its record; one listing finds them all
NODE_RECORDS_PREFIX = "_tiered/nodes/"
TOPIC_MANIFEST_NAME = "topic_manifest.json"
TOPIC_PREFIX_DIR = "topics"
#: where committed consumer-group offsets live: under the prefix reserved for tiered's own
#: objects, beside no partition's (docs/format.md, "Consumer group offsets")
GROUPS_PREFIX = "_tiered/groups/"
GROUP_OFFSETS_NAME = "offsets.json"
#: longest percent-encoded group id in a key: a key component must stay a legal file name
MAX_GROUP_KEY_LENGTH = 200
#: users (SCRAM credentials) and ACLs of the Kafka endpoint and the HTTP API, one object each,
#: changed by compare-and-swap (docs/security.md, "In the bucket")
SECURITY_PREFIX = "_tiered/security/"
SECURITY_USERS_KEY = SECURITY_PREFIX + "users.json"
SECURITY_ACLS_KEY = SECURITY_PREFIX + "acls.json"
#: file extension of each object kind that travels beside a segment: Kafka's index files,
#: or one bundle of them (`manifests.segment_indexes`)
INDEX_SUFFIXES: dict[str, str] = {
    "index": ".index",
    "timeindex": ".timeindex",
    "txnindex": ".txnindex",
    "indexes": ".indexes",
}
SEGMENT_SUFFIX = ".log"


def _shown(value: object) -> str:
    """A hostile value as it may appear in an error message: repr'd and clipped."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validate_topic_name(topic: object) -> str:
    """Return `topic` if it is a legal Kafka topic name, else raise `InvalidTopicName`."""
    problem = topic_name_problem(topic)
    if problem is not None:
        raise InvalidTopicName(problem)
    assert isinstance(topic, str)  # topic_name_problem refuses non-strings
    return topic


def validate_partition(partition: object) -> int:
    """Return `partition` if it is a Kafka partition number (0..2**31-1)."""
    if type(partition) is not int or not 0 <= partition <= MAX_PARTITION:
        raise InvalidName(
            f"partition must be an integer in 0..{MAX_PARTITION}, got {_shown(partition)}"
        )
    return partition


def validate_revision(revision: object) -> str:
    """Normalise a revision to its key form.

    A revision tells a deleted-and-recreated topic apart: Kafka's topic id from
    `partition.metadata` (22 characters of base64url) or a non-negative integer."""
    if type(revision) is int:
        if revision < 0:
            raise InvalidName(f"revision must not be negative, got {revision}")
        return str(revision)
    if not isinstance(revision, str) or not _REVISION.fullmatch(revision):
        raise InvalidName(
            f"revision must be a non-negative integer or 1..{MAX_REVISION_LENGTH} characters of "
            f"[A-Za-z0-9_-], got {_shown(revision)}"
        )
    if len(revision) > MAX_REVISION_LENGTH:
        raise InvalidName(f"revision {_shown(revision)} is longer than {MAX_REVISION_LENGTH}")
    return revision


def validate_object_name(name: object) -> str:
    """Return `name` if it can be the last component of a key (a segment or index name)."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_OBJECT_NAME_LENGTH
        or name in (".", "..")
        or not _LEGAL.fullmatch(name)
    ):
        raise InvalidName(
            f"object name must be 1..{MAX_OBJECT_NAME_LENGTH} characters of [A-Za-z0-9._-], "
            f"not '.' or '..', got {_shown(name)}"
        )
    return name


#: partitions whose hash and data prefix are kept once computed (every read of a segment
#: names its object key: a SHA-256 and three validations each time otherwise)
PREFIXES_CACHED = 16_384


@functools.lru_cache(maxsize=PREFIXES_CACHED)
def partition_hash(topic: str, partition: int, revision: str | int) -> str:
    """The 8-hex-digit prefix shared by every object of one partition (data and metadata)."""
    topic, rev = validate_topic_name(topic), validate_revision(revision)
    path = f"{topic}/{validate_partition(partition)}_{rev}"
    return hashlib.sha256(path.encode("ascii")).hexdigest()[:8]


def partition_prefix(topic: str, partition: int, revision: str | int) -> str:
    """`{h}/`: the one prefix above both of the partition's, so one listing covers them (it
    may also hold a partition whose hash collides: filter by the two prefixes below)."""
    return f"{partition_hash(topic, partition, revision)}/"


@functools.lru_cache(maxsize=PREFIXES_CACHED)
def partition_data_prefix(topic: str, partition: int, revision: str | int) -> str:
    """`{h}/kafka/{topic}/{partition}_{revision}/`: where segment and index objects live."""
    rev = validate_revision(revision)
    return f"{partition_hash(topic, partition, rev)}/{NAMESPACE}/{topic}/{partition}_{rev}/"


def partition_meta_prefix(topic: str, partition: int, revision: str | int) -> str:
    """`{h}/meta/kafka/{topic}/{partition}_{revision}/`: the head manifest and its archives."""
    rev = validate_revision(revision)
    return f"{partition_hash(topic, partition, rev)}/meta/{NAMESPACE}/{topic}/{partition}_{rev}/"


# -- segments and indexes ----------------------------------------------------------------------


class SegmentName(NamedTuple):
    """The parts of a default segment object name."""

    base_offset: int
    last_offset: int
    term: int
    generation: int


_SEGMENT_NAME = re.compile(r"(\d+)-(\d+)-(\d+)(?:-(\d+))?\.log")


def segment_name(base_offset: int, last_offset: int, term: int, *, generation: int = 0) -> str:
    """`{base}-{last}-{term}.log`, or `{base}-{last}-{term}-{generation}.log` for re-uploads.

    `term` is the uploading writer's term, so two writers never write the same key; a writer
    re-uploading the same range in the same term (a compacted copy) bumps `generation` so the
    object it replaces survives until the manifest that drops it is committed."""
    for what, value in (
        ("base_offset", base_offset),
        ("last_offset", last_offset),
        ("term", term),
        ("generation", generation),
    ):
        if type(value) is not int or value < 0:
            raise InvalidName(f"segment name: {what} must be a non-negative integer, got {value!r}")
    if last_offset < base_offset:
        raise InvalidName(f"segment name: last offset {last_offset} < base offset {base_offset}")
    suffix = f"-{generation}" if generation else ""
    return f"{base_offset}-{last_offset}-{term}{suffix}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> SegmentName | None:
    """The parts of a default segment name, or None for any other name (GC and recovery use
    this to recognise segment objects in a listing)."""
    match = _SEGMENT_NAME.fullmatch(name)
    if match is None:
        return None
    base, last, term, gen = match.groups()
    return SegmentName(int(base), int(last), int(term), int(gen or 0))


def index_name(segment_object_name: str, kind: str = "index") -> str:
    """The name of the index object of `kind` (`index`, `timeindex`, `txnindex`, or the
    `indexes` bundle) that travels beside the segment object `segment_object_name`."""
    suffix = INDEX_SUFFIXES.get(kind)
    if suffix is None:
        raise InvalidName(f"unknown index kind {kind!r}; known: {', '.join(INDEX_SUFFIXES)}")
    stem = segment_object_name.removesuffix(SEGMENT_SUFFIX)
    return validate_object_name(stem + suffix)


def with_indexes(segment_object_name: str) -> list[str]:
    """A segment object's name and the names of every index kind that may travel beside it."""
    return [segment_object_name] + [index_name(segment_object_name, kind)
                                    for kind in INDEX_SUFFIXES]


def segment_name_of(object_name: str) -> str | None:
    """The segment object name an object name belongs to: itself for a `.log`, the segment
    beside which an index travels for an index name, None for anything else."""
    if object_name.endswith(SEGMENT_SUFFIX):
        return object_name
    for suffix in INDEX_SUFFIXES.values():
        if object_name.endswith(suffix):
            return object_name.removesuffix(suffix) + SEGMENT_SUFFIX
    return None


def object_key(topic: str, partition: int, revision: str | int, name: str) -> str:
    """The key of the data object `name` (a segment or index) of one partition."""
    return partition_data_prefix(topic, partition, revision) + validate_object_name(name)


def segment_key(
    topic: str,
    partition: int,
    revision: str | int,
    base_offset: int,
    last_offset: int,
    term: int,
    *,
    generation: int = 0,
) -> str:
    """The key of a segment object under the default naming (see `segment_name`)."""
    name = segment_name(base_offset, last_offset, term, generation=generation)
    return object_key(topic, partition, revision, name)


def index_key(
    topic: str,
    partition: int,
    revision: str | int,
    base_offset: int,
    last_offset: int,
    term: int,
    *,
    kind: str = "index",
    generation: int = 0,
) -> str:
    """The key of the index of `kind` beside the segment `segment_key(...)` names."""
    name = index_name(segment_name(base_offset, last_offset, term, generation=generation), kind)
    return object_key(topic, partition, revision, name)


# -- manifests ---------------------------------------------------------------------------------


#: the copies of a head kept beside it, one slot per sequence parity (docs/format.md, "Losing
#: objects"): never an archived manifest's name, so collection keeps them
HEAD_COPY_SLOTS = ("copy-a", "copy-b")


def head_copy_key(head_key: str, sequence: int) -> str:
    """Where the copy of the head version `sequence` is written: two slots, so a copy write
    still in flight for one version never leaves the other without a whole copy."""
    return f"{head_key}.{HEAD_COPY_SLOTS[sequence % len(HEAD_COPY_SLOTS)]}"


def head_copy_keys(head_key: str) -> tuple[str, ...]:
    """Every copy slot of the head at `head_key`: objects of ours that no manifest names."""
    return tuple(f"{head_key}.{slot}" for slot in HEAD_COPY_SLOTS)


def partition_manifest_key(topic: str, partition: int, revision: str | int) -> str:
    """The head manifest's key: derivable from (topic, partition, revision), no listing."""
    return partition_meta_prefix(topic, partition, revision) + PARTITION_MANIFEST_NAME


class ArchiveName(NamedTuple):
    """What an archived manifest's name says about it."""

    base_offset: int
    last_offset: int
    base_timestamp: int
    max_timestamp: int
    level: int
    checksum: int


_ARCHIVE_NAME = re.compile(
    re.escape(PARTITION_MANIFEST_NAME) + r"\.(\d+)\.(\d+)\.(-?\d+)\.(-?\d+)\.(\d+)\.([0-9a-f]{8})"
)


def archived_manifest_name(
    base_offset: int,
    last_offset: int,
    base_timestamp: int,
    max_timestamp: int,
    level: int,
    checksum: int,
) -> str:
    """`manifest.json.{base}.{last}.{ts0}.{ts1}.{level}.{crc:08x}`.

    The CRC-32C of the object's bytes makes the key content-addressed: a retry or a second
    writer archiving the same range differently gets a different key, so an archived manifest
    is never overwritten (an identical one is simply reused)."""
    if not 0 <= checksum <= 0xFFFFFFFF:
        raise InvalidName(f"archived manifest checksum {checksum} is not a 32-bit value")
    return (
        f"{PARTITION_MANIFEST_NAME}.{base_offset}.{last_offset}.{base_timestamp}."
        f"{max_timestamp}.{level}.{checksum:08x}"
    )


def parse_archived_manifest_name(name: str) -> ArchiveName | None:
    """The fields of an archived manifest name, or None if `name` is not one."""
    match = _ARCHIVE_NAME.fullmatch(name)
    if match is None:
        return None
    base, last, ts0, ts1, level, crc = match.groups()
    return ArchiveName(int(base), int(last), int(ts0), int(ts1), int(level), int(crc, 16))


def archived_manifest_key(
    topic: str,
    partition: int,
    revision: str | int,
    base_offset: int,
    last_offset: int,
    base_timestamp: int,
    max_timestamp: int,
    level: int,
    checksum: int,
) -> str:
    """Where an archived manifest (level 0: segments; level >= 1: an index of archives) lives,
    beside its head manifest."""
    name = archived_manifest_name(
        base_offset, last_offset, base_timestamp, max_timestamp, level, checksum
    )
    return partition_meta_prefix(topic, partition, revision) + name


def partition_lease_key(topic: str, partition: int, revision: str | int) -> str:
    """The partition's upload lease: beside its head manifest, derivable without listing."""
    return partition_meta_prefix(topic, partition, revision) + LEASE_NAME


def validate_node_id(node: object) -> str:
    """Return `node` if it can name a sidecar (`tiered.topics.node_id_problem`): it becomes
    part of a key and of every lease the node holds."""
    problem = node_id_problem(node)
    if problem is not None:
        raise InvalidName(problem)
    assert isinstance(node, str)
    return node


def node_record_key(node: str) -> str:
    """`_tiered/nodes/{node}.json`: the record a sidecar renews while it runs."""
    return f"{NODE_RECORDS_PREFIX}{validate_node_id(node)}.json"


def parse_node_record_key(key: str) -> str | None:
    """The node id of a node record key found in a listing, None for anything else."""
    if not key.startswith(NODE_RECORDS_PREFIX) or not key.endswith(".json"):
        return None
    node = key[len(NODE_RECORDS_PREFIX):-len(".json")]
    try:
        return validate_node_id(node)
    except InvalidName:
        return None


def topic_prefix_digit(topic: str) -> str:
    """The hex digit that picks which of the 16 topic-manifest prefixes holds `topic`."""
    return hashlib.sha256(validate_topic_name(topic).encode("ascii")).hexdigest()[0]


def topic_manifest_prefixes() -> list[str]:
    """The 16 fixed prefixes under which every topic manifest lives: recovery lists these."""
    return [f"{digit}0000000/{TOPIC_PREFIX_DIR}/" for digit in "0123456789abcdef"]


def topic_manifest_key(topic: str, revision: str | int) -> str:
    """`{d}0000000/topics/{topic}/{revision}/topic_manifest.json`."""
    rev = validate_revision(revision)
    return (
        f"{topic_prefix_digit(topic)}0000000/{TOPIC_PREFIX_DIR}/{topic}/{rev}/{TOPIC_MANIFEST_NAME}"
    )


def parse_topic_manifest_key(key: str) -> tuple[str, str] | None:
    """(topic, revision) of a topic manifest key found in a listing, or None if `key` is not a
    well-formed topic manifest key (foreign objects under the prefixes are ignored)."""
    parts = key.split("/")
    if len(parts) != 5 or parts[1] != TOPIC_PREFIX_DIR or parts[4] != TOPIC_MANIFEST_NAME:
        return None
    topic, revision = parts[2], parts[3]
    try:
        if key != topic_manifest_key(topic, revision):
            return None
    except InvalidName:
        return None
    return topic, revision


# -- consumer groups ---------------------------------------------------------------------------


def group_key_component(group: object) -> str:
    """The group id as one key component: percent-encoded UTF-8 (`[A-Za-z0-9._~-]` kept as
    is), `.` and `..` spelled `%2E` and `%2E%2E`. `InvalidName` for an empty id, one that is
    not a string, or one whose encoding is longer than `MAX_GROUP_KEY_LENGTH`."""
    if not isinstance(group, str) or not group:
        raise InvalidName(f"a consumer group id must be a non-empty string, got {_shown(group)}")
    try:
        encoded = quote(group.encode("utf-8"), safe="")
    except UnicodeEncodeError:
        raise InvalidName(f"consumer group id {_shown(group)} is not valid Unicode") from None
    if encoded in (".", ".."):
        encoded = encoded.replace(".", "%2E")
    if len(encoded) > MAX_GROUP_KEY_LENGTH:
        raise InvalidName(f"consumer group id {_shown(group)} is too long: {len(encoded)} "
                          f"characters once percent-encoded, at most {MAX_GROUP_KEY_LENGTH}")
    return encoded


def group_offsets_key(group: str) -> str:
    """`_tiered/groups/{g}/{group}/offsets.json`: one object per group, derivable from its id."""
    component = group_key_component(group)
    digest = hashlib.sha256(group.encode("utf-8")).hexdigest()[:8]
    return f"{GROUPS_PREFIX}{digest}/{component}/{GROUP_OFFSETS_NAME}"
