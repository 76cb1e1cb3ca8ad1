"""Partition, archived and topic manifests: model, JSON format, lookups, spillover and the
compare-and-swap commit. The bucket format is specified in docs/format.md; object keys come
only from `manifests.keys`."""

from manifests.archive_cache import ArchiveCache, CacheStats
from manifests.commit import ArchivedObject, CommitResult, ManifestStore, ManifestStoreStats
from manifests.errors import (
    ArchiveKeyCollision,
    CollectedName,
    CorruptManifest,
    InvalidName,
    InvalidTopicName,
    InvalidUpdate,
    ManifestConflict,
    ManifestContention,
    ManifestError,
    OffsetGap,
    OffsetOverlap,
    StaleTerm,
    UnsupportedManifestVersion,
)
from manifests.manifest import ArchivedManifest, PartitionManifest, manifest_problem
from manifests.model import (
    FORMAT_VERSION,
    HEAD_FORMAT_VERSION,
    ArchiveEntry,
    ArchiveTable,
    ReplacedSegment,
    SegmentMeta,
    SegmentTable,
)
from manifests.serde import (
    decode_archived_manifest,
    decode_partition_manifest,
    encode_archived_manifest,
    encode_partition_manifest,
)
from manifests.spillover import ManifestSettings, SpillPlan, plan_spill
from manifests.topic import (
    TopicManifest,
    decode_topic_manifest,
    encode_topic_manifest,
    iter_topic_manifest_keys,
    load_topic_manifest,
    save_topic_manifest,
)

__all__ = [
    "FORMAT_VERSION",
    "HEAD_FORMAT_VERSION",
    "ArchiveCache",
    "ArchiveEntry",
    "ArchiveKeyCollision",
    "CollectedName",
    "ArchiveTable",
    "ArchivedManifest",
    "ArchivedObject",
    "CacheStats",
    "CommitResult",
    "CorruptManifest",
    "InvalidName",
    "InvalidTopicName",
    "InvalidUpdate",
    "ManifestConflict",
    "ManifestContention",
    "ManifestError",
    "ManifestSettings",
    "ManifestStore",
    "ManifestStoreStats",
    "OffsetGap",
    "OffsetOverlap",
    "PartitionManifest",
    "ReplacedSegment",
    "SegmentMeta",
    "SegmentTable",
    "SpillPlan",
    "StaleTerm",
    "TopicManifest",
    "UnsupportedManifestVersion",
    "decode_archived_manifest",
    "decode_partition_manifest",
    "decode_topic_manifest",
    "encode_archived_manifest",
    "encode_partition_manifest",
    "encode_topic_manifest",
    "iter_topic_manifest_keys",
    "load_topic_manifest",
    "manifest_problem",
    "plan_spill",
    "save_topic_manifest",
]
