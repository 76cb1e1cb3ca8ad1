"""The one registry of every configuration property tiered accepts.

Cluster properties carry Redpanda's flat names and defaults (`cloud_storage_*`, `log_*`,
`retention_*`, `disk_reservation_percent`, ...); topic properties carry the dotted names
(`retention.ms`, `redpanda.remote.write`, ...) and name the cluster property they fall back to.
Kafka's own spellings are aliases. An alias may stand for more than one property: Kafka's
`remote.storage.enable` turns on both remote write and remote read.

Precedence (docs/configuration.md, "Precedence"): a topic setting
wins when set; otherwise the cluster property it falls back to; otherwise the default. Retention
values take Kafka's ``-1`` for "no limit", which parses to ``None``; ``None`` in a resolved value
always means "no limit / not set", never "unknown".

Everything here is pure data and pure functions; reading files is `tiered.config.model`'s job.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from tiered.config.units import (
    UnitError,
    format_duration_ms,
    format_size,
    parse_bool,
    parse_choice,
    parse_duration_ms,
    parse_int,
    parse_number,
    parse_percent,
    parse_size,
    parse_text,
)

Kind = Literal["size", "int", "ms", "bool", "float", "percent", "enum", "str"]
Scope = Literal["cluster", "topic"]
#: a parsed property value; None means "no limit" (unlimited properties) or "not set"
Value = int | float | bool | str | None

#: how secrets appear in any output
MASK = "****"
#: what Kafka writes for "no limit"
UNLIMITED_INPUTS = (-1, "-1", "unlimited")


class Secret(str):
    """A credential: usable wherever a str is (boto3 takes it as is), but `repr()` never shows
    it, so a Config or a dict of properties can be logged or printed without leaking it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(MASK)


class PropertyValueError(ValueError):
    """A value a property cannot take; the message is for the operator and omits the key."""


@dataclass(frozen=True)
class Property:
    """One configuration property: its name, how its values parse, and what it means."""

    name: str
    kind: Kind
    #: value when nothing sets it; for a topic property with a `fallback`, None ("inherit")
    default: Value
    scope: Scope
    aliases: tuple[str, ...] = ()
    doc: str = ""
    choices: tuple[str, ...] | None = None
    #: masked as MASK in every output and wrapped in `Secret`
    secret: bool = False
    min: float | None = None
    max: float | None = None
    #: Kafka's -1 (also "-1", "unlimited") is accepted and parses to None: "no limit"
    unlimited: bool = False
    #: topic scope only: the cluster property whose value applies when the topic sets none
    fallback: str | None = None

    def parse(self, raw: object) -> Value:
        """The value `raw` (as TOML gave it) means for this property, or PropertyValueError."""
        if self.unlimited and isinstance(raw, int | str) and raw in UNLIMITED_INPUTS:
            return None
        if self.unlimited and isinstance(raw, int) and not isinstance(raw, bool) and raw < 0:
            raise PropertyValueError(f"{raw} is negative; use -1 for no limit")
        try:
            value = PARSERS[self.kind](self, raw)
        except UnitError as exc:
            # never echo what may be a credential, even a mistyped one
            reason = "expected a non-empty string (value hidden)" if self.secret else str(exc)
            raise PropertyValueError(reason) from None
        self._check_range(value)
        return Secret(value) if self.secret and isinstance(value, str) else value

    def _check_range(self, value: Value) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        low, high = self.min, self.max
        if (low is not None and value < low) or (high is not None and value > high):
            if low is not None and high is not None:
                bound = f"between {self.format(low)} and {self.format(high)}"
            elif low is not None:
                bound = f"at least {self.format(low)}"
            else:
                bound = f"at most {self.format(high)}"
            raise PropertyValueError(f"{self.format(value)} is out of range: must be {bound}")

    def format(self, value: Value | float) -> str:
        """A value for humans: sizes in binary units, durations with their unit spelled out."""
        if value is None:
            return "unlimited (-1)" if self.unlimited else "not set"
        if self.secret:
            return MASK
        if isinstance(value, bool):
            return str(value).lower()
        if self.kind == "size" and isinstance(value, int | float) and value >= 1024:
            return f"{int(value)} ({format_size(int(value))})"
        if self.kind == "ms" and isinstance(value, int | float) and value >= 1000:
            return f"{int(value)} ms ({format_duration_ms(int(value))})"
        if self.kind == "ms":
            return f"{value} ms"
        if self.kind == "percent" and isinstance(value, int | float):
            return f"{value:g}%"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


#: kind -> parser of a raw TOML value; every Property.kind is a key here
PARSERS: dict[str, Callable[[Property, object], Value]] = {
    "size": lambda prop, raw: parse_size(raw),
    "int": lambda prop, raw: parse_int(raw),
    "ms": lambda prop, raw: parse_duration_ms(raw),
    "bool": lambda prop, raw: parse_bool(raw),
    "float": lambda prop, raw: parse_number(raw),
    "percent": lambda prop, raw: parse_percent(raw),
    "enum": lambda prop, raw: parse_choice(raw, prop.choices or ()),
    "str": lambda prop, raw: parse_text(raw),
}


# --- the registry ---------------------------------------------------------------------------

MiB = 1024 * 1024
GiB = 1024 * MiB
DAY_MS = 86_400_000


def _c(name: str, kind: Kind, default: Value, doc: str, **kw: Any) -> Property:
    return Property(name=name, kind=kind, default=default, scope="cluster", doc=doc, **kw)


def _t(name: str, kind: Kind, default: Value, doc: str, **kw: Any) -> Property:
    return Property(name=name, kind=kind, default=default, scope="topic", doc=doc, **kw)


_PICKED = "Redpanda's documentation gives no default; tiered picks"

# fmt: off
# (one property per call keeps the tables scannable; the formatter would spread each over 6 lines)

CLUSTER: tuple[Property, ...] = (
    # object storage access (alternatives to the [storage] section)
    _c("cloud_storage_access_key", "str", None, "Access key; same as [storage] access_key. "
       "Not set: the standard AWS credential chain.", secret=True),
    _c("cloud_storage_secret_key", "str", None, "Secret key; same as [storage] secret_key.",
       secret=True),
    _c("cloud_storage_region", "str", None, "Object storage region; same as [storage] region."),
    _c("cloud_storage_api_endpoint", "str", None, "API endpoint host (or URL); same as "
       "[storage] endpoint_url. Not set: AWS derives it from region and bucket."),
    _c("cloud_storage_api_endpoint_port", "int", 443, "Port for a host-only "
       "cloud_storage_api_endpoint.", min=1, max=65535),
    _c("cloud_storage_disable_tls", "bool", False, "Use http:// for a host-only "
       "cloud_storage_api_endpoint (TLS terminated by a proxy)."),
    # transport
    _c("cloud_storage_max_connections", "int", 20, "Connection pool size to object storage, "
       "shared by uploads and downloads; 80 % of it is how many upload leases are taken at "
       "once at start.", min=1, max=10_000),
    _c("cloud_storage_initial_backoff_ms", "ms", 100, "First retry delay of the exponential "
       "backoff (with jitter) after a retryable object-storage error.", min=1),
    _c("cloud_storage_segment_upload_timeout_ms", "ms", 30_000, "Timeout of one segment "
       "upload request; retried after it.", min=1),
    _c("cloud_storage_manifest_upload_timeout_ms", "ms", 10_000, "Timeout of one manifest "
       "upload request; retried after it.", min=1),
    _c("cloud_storage_max_connection_idle_time_ms", "ms", 5_000, "Idle time after which a "
       "pooled HTTP connection is closed.", min=1),
    _c("cloud_storage_allow_unconditional_writes", "bool", False, "tiered's own: skip the "
       "conditional-write (If-Match / If-None-Match) probe on stores that ignore it. The "
       "single-writer opt-out: only safe when exactly one tiered process ever writes the "
       "bucket, since manifest compare-and-swap is no longer enforced by the store."),
    # remote write / read
    _c("cloud_storage_enable_remote_write", "bool", True, "Cluster default for "
       "redpanda.remote.write. Redpanda defaults to false behind its cloud_storage_enabled "
       "master switch; in tiered the [storage] section is that switch, so tiered picks true."),
    _c("cloud_storage_enable_remote_read", "bool", True, "Cluster default for "
       "redpanda.remote.read; true for the same reason as remote write."),
    _c("cloud_storage_segment_max_upload_interval_sec", "int", None, "Idle timeout in "
       "seconds: upload the stable prefix of an active segment that has had no upload for "
       "this long. Not set (default): wait for the segment to close. Redpanda's advice: 600.",
       min=1),
    # upload backlog controller
    _c("cloud_storage_upload_ctrl_update_interval_ms", "ms", 60_000, "Recompute interval of "
       "the upload backlog (PD) controller.", min=1),
    _c("cloud_storage_upload_ctrl_p_coeff", "float", -2.0, "Proportional coefficient of the "
       "upload backlog controller."),
    _c("cloud_storage_upload_ctrl_d_coeff", "float", 0.0, "Derivative coefficient of the "
       "upload backlog controller."),
    _c("cloud_storage_upload_ctrl_min_shares", "int", 100, "Fewest I/O and CPU shares remote "
       "write may use.", min=1),
    _c("cloud_storage_upload_ctrl_max_shares", "int", 1000, "Most I/O and CPU shares remote "
       "write may use.", min=1),
    # upload leases (one uploader per partition among the sidecars sharing a bucket)
    _c("cloud_storage_upload_lease_ms", "ms", 30_000, "tiered's own: how long a sidecar's "
       "upload leases outlive its last renewal. It renews every third of this; when it stops "
       "(crash, pause, lost network) another sidecar with a replica takes its partitions over "
       "after about this long.", min=300),
    # housekeeping and merging
    _c("cloud_storage_housekeeping_interval_ms", "ms", 300_000, "Housekeeping (merging, GC) "
       f"is forced at least this often even when storage is not idle. {_PICKED} 5 minutes, "
       "Redpanda's default.", min=1),
    _c("cloud_storage_idle_timeout_ms", "ms", 10_000, "Width of the sliding window that "
       "measures object-storage utilisation for idleness.", min=1),
    _c("cloud_storage_idle_threshold_rps", "float", 1.0, "Object storage is idle below this "
       "many requests per second over the window.", min=0),
    _c("cloud_storage_enable_segment_merging", "bool", True, "Merge runs of small adjacent "
       "segments in object storage during housekeeping."),
    _c("cloud_storage_segment_size_target", "size", None, "Desired size of a merged "
       "segment. Not set: the topic's segment.bytes (log_segment_size).", min=1),
    _c("cloud_storage_segment_size_min", "size", None, "Segments smaller than this are merge "
       "candidates. Not set: 50% of the topic's segment.bytes.", min=1),
    _c("cloud_storage_gc_grace_period_ms", "ms", 3_600_000, "tiered's own: an object a "
       "committed manifest no longer names is deleted only after this long, so in-flight "
       "readers finish. 1 hour.", min=0),
    # archived metadata
    _c("cloud_storage_spillover_manifest_size", "size", 64 * 1024, "Target size of the "
       "manifest kept in the bucket's head; older entries spill into archived manifests. "
       "Older Redpanda documentation calls it cloud_storage_target_manifest_size_bytes.", min=1024,
       aliases=("cloud_storage_target_manifest_size_bytes",)),
    _c("cloud_storage_manifest_cache_size", "size", MiB, "Memory for archived manifests "
       f"loaded to serve historical reads. {_PICKED} 1 MiB, Redpanda's default.", min=1),
    # cache
    _c("cloud_storage_cache_size", "size", None, "Most bytes the read cache may hold. When "
       "both this and cloud_storage_cache_size_percent apply, the smaller wins. Not set: only "
       "the percentage applies.", min=1),
    _c("cloud_storage_cache_size_percent", "percent", 20.0, "Most of the cache disk the "
       f"cache may hold, as a percentage. {_PICKED} 20%, Redpanda's default.", min=0, max=100),
    _c("cloud_storage_cache_max_objects", "int", 100_000, "Most objects (chunks and "
       f"indices) the cache may hold. {_PICKED} 100000, Redpanda's default.", min=1),
    _c("cloud_storage_cache_trim_threshold_percent_size", "percent", 100.0, "Start trimming "
       "when the cache reaches this share of its size limit. Default 100 (Redpanda's "
       "'unset': trim when full); Redpanda recommends 70.", min=0, max=100),
    _c("cloud_storage_cache_trim_threshold_percent_objects", "percent", 100.0, "Start "
       "trimming when the cache reaches this share of its object limit. Default 100 (trim "
       "when full).", min=0, max=100),
    _c("cloud_storage_cache_check_interval_ms", "ms", 30_000, "Time between cache size "
       "checks.", min=1),
    _c("cloud_storage_cache_chunk_size", "size", 16 * MiB, "Size of one chunk of a remote "
       "segment downloaded into the cache.", min=1),
    _c("cloud_storage_cache_memory_size", "size", 128 * MiB, "tiered's own: memory for "
       "chunks streamed in and not yet written to the cache directory. A chunk read ahead "
       "for a consumer is served from memory and written to disk only if the cache still "
       "keeps it once its readers have moved on; eager eviction usually drops it first, "
       "saving the write. When it is spent, chunks are written as they arrive. 0: always.",
       min=0),
    _c("cloud_storage_chunk_eviction_strategy", "enum", "eager", "How unused chunks are "
       "evicted: eager (any unshared chunk), capped (down to the per-segment hydrated "
       "cap), predictive (fewest future readers first).",
       choices=("eager", "capped", "predictive")),
    _c("cloud_storage_hydrated_chunks_per_segment_ratio", "float", 0.7, "Most hydrated "
       "chunks of a segment as a share of its chunks; above it unused chunks are evicted.",
       min=0, max=1),
    _c("cloud_storage_min_chunks_per_segment_threshold", "int", 5, "Segments with fewer "
       "chunks than this may have every chunk hydrated.", min=0),
    _c("cloud_storage_disable_chunk_reads", "bool", False, "Download whole segments instead "
       "of chunks."),
    _c("cloud_storage_chunk_prefetch", "int", None, "Chunks to download ahead of a "
       "sequential reader. Not set (default): adaptive, per reader: one chunk once it reads "
       "sequentially, doubling at each chunk it moves on to, up to 8 (fewer when 8 chunks are "
       "more than 1/8 of the cache), none again after a jump. N: always N chunks. "
       "0: no read-ahead (Redpanda's default).", min=0),
    # retention
    _c("log_retention_ms", "ms", 7 * DAY_MS, "Cluster default of retention.ms: how long "
       "data is kept (in object storage, with tiering). -1: forever.", unlimited=True,
       aliases=("log.retention.ms",)),
    _c("retention_bytes", "size", None, "Cluster default of retention.bytes: most bytes per "
       "partition. Not set or -1: no size limit.", unlimited=True,
       aliases=("log.retention.bytes",)),
    _c("retention_local_target_ms_default", "ms", DAY_MS, "Cluster default of "
       "retention.local.target.ms: how long data stays on local disk once uploaded. "
       "-1: forever.", unlimited=True, aliases=("log.local.retention.ms",)),
    _c("retention_local_target_bytes_default", "size", None, "Cluster default of "
       "retention.local.target.bytes. Not set or -1: no size target.", unlimited=True,
       aliases=("log.local.retention.bytes",)),
    _c("retention_local_target_capacity_bytes", "size", None, "Target size of all local "
       "log data; above it space management trims uploaded data. Not set: no byte target.",
       min=1),
    _c("retention_local_target_capacity_percent", "percent", None, "Target size of local "
       "log data as a percentage of the disk. Not set: 100 minus "
       "cloud_storage_cache_size_percent minus disk_reservation_percent.", min=0, max=100),
    _c("retention_local_strict", "bool", False, "Trim local data to the local retention "
       "target in phase 1, instead of letting it grow into the log data reservation."),
    _c("retention_local_trim_interval", "ms", 30_000, "Period of the disk-pressure check "
       "that trims local data to its target.", min=1),
    _c("disk_reservation_percent", "percent", 20.0, "Disk kept free for system overhead "
       "and SSD health; neither cache nor log data targets use it.", min=0, max=100),
    _c("storage_space_alert_free_threshold_percent", "percent", 5.0, "Warn when free disk "
       f"falls below this percentage; 0 disables. {_PICKED} 5%, Redpanda's default.",
       min=0, max=50),
    _c("storage_space_alert_free_threshold_bytes", "size", 0, "Warn when free disk falls "
       f"below this many bytes; 0 disables. {_PICKED} 0.", min=0),
    _c("storage_min_free_bytes", "size", 5 * GiB, "Below this much free disk the broker "
       "refuses writes; tiered trims hardest (all five space-management phases).", min=0),
    # segments
    _c("log_segment_size", "size", GiB, "Cluster default of segment.bytes: size at which a "
       "segment rolls.", min=1, aliases=("log.segment.bytes",)),
    _c("log_segment_ms", "ms", 14 * DAY_MS, "Cluster default of segment.ms: age at which a "
       f"segment rolls. {_PICKED} 2 weeks, Redpanda's default.", min=1,
       aliases=("log.roll.ms",)),
    _c("log_index_interval_bytes", "size", 4096, "Cluster default of index.interval.bytes: "
       "bytes between .index entries in segments tiered writes.", min=0,
       aliases=("log.index.interval.bytes",)),
    _c("log_cleanup_policy", "enum", "delete", "Cluster default of cleanup.policy.",
       choices=("delete", "compact", "compact,delete"), aliases=("log.cleanup.policy",)),
    # compaction of the bucket's history (`tiered compact`, docs/compaction.md)
    _c("tombstone_retention_ms", "ms", DAY_MS, "Cluster default of delete.retention.ms: how "
       "long a tombstone (and a finished transaction's marker) survives compaction once a pass "
       "has kept it (KIP-534 delete horizon). -1: forever. Redpanda leaves it unset (tombstones "
       "kept); tiered picks Kafka's 1 day so compacted history sheds deleted keys.",
       unlimited=True, aliases=("log.cleaner.delete.retention.ms",)),
    _c("min_compaction_lag_ms", "ms", 0, "Cluster default of min.compaction.lag.ms: a "
       "segment whose newest record is younger than this is not compacted.", min=0,
       aliases=("log.cleaner.min.compaction.lag.ms",)),
    _c("max_compaction_lag_ms", "ms", None, "Cluster default of max.compaction.lag.ms: a "
       "partition whose oldest uncompacted record is older than this is compacted whatever "
       "its dirty ratio. -1 or not set: no limit.", unlimited=True, min=0,
       aliases=("log.cleaner.max.compaction.lag.ms",)),
    _c("min_cleanable_dirty_ratio", "float", 0.2, "Cluster default of "
       "min.cleanable.dirty.ratio: a partition is compacted once the uncompacted share of "
       "its cleanable bytes reaches this (Redpanda's default; Kafka's is 0.5).", min=0, max=1,
       aliases=("log.cleaner.min.cleanable.ratio",)),
)

TOPIC: tuple[Property, ...] = (
    _t("retention.ms", "ms", None, "How long data is kept, locally and in object storage. "
       "-1: forever.", unlimited=True, fallback="log_retention_ms"),
    _t("retention.bytes", "size", None, "Most bytes per partition in object storage. "
       "-1: no limit.", unlimited=True, fallback="retention_bytes"),
    _t("retention.local.target.ms", "ms", None, "How long uploaded data stays on local "
       "disk. -1: forever.", unlimited=True, fallback="retention_local_target_ms_default",
       aliases=("local.retention.ms",)),
    _t("retention.local.target.bytes", "size", None, "Most uploaded bytes per partition "
       "kept on local disk. -1: no limit.", unlimited=True,
       fallback="retention_local_target_bytes_default", aliases=("local.retention.bytes",)),
    _t("redpanda.remote.write", "bool", None, "Upload this topic's segments.",
       fallback="cloud_storage_enable_remote_write", aliases=("remote.storage.enable",)),
    _t("redpanda.remote.read", "bool", None, "Serve this topic's reads from object storage.",
       fallback="cloud_storage_enable_remote_read", aliases=("remote.storage.enable",)),
    _t("redpanda.remote.delete", "bool", True, "Deleting the topic also deletes its objects "
       "in object storage (needs remote write and read)."),
    _t("redpanda.remote.recovery", "bool", False, "Recover the topic from object storage "
       "when it is created."),
    _t("segment.bytes", "size", None, "Size at which a segment rolls.", min=1,
       fallback="log_segment_size"),
    _t("segment.ms", "ms", None, "Age at which a segment rolls.", min=1,
       fallback="log_segment_ms"),
    _t("cleanup.policy", "enum", None, "delete, compact, or both. With compact alone, "
       "retention never deletes from object storage.",
       choices=("delete", "compact", "compact,delete"), fallback="log_cleanup_policy"),
    _t("index.interval.bytes", "size", None, "Bytes between .index entries.", min=0,
       fallback="log_index_interval_bytes"),
    _t("delete.retention.ms", "ms", None, "How long compaction keeps a tombstone after the "
       "pass that first kept it. -1: forever.", unlimited=True,
       fallback="tombstone_retention_ms"),
    _t("min.compaction.lag.ms", "ms", None, "Records younger than this are not compacted.",
       min=0, fallback="min_compaction_lag_ms"),
    _t("max.compaction.lag.ms", "ms", None, "Compact once the oldest uncompacted record is "
       "this old, whatever the dirty ratio. -1: no limit.", unlimited=True, min=0,
       fallback="max_compaction_lag_ms"),
    _t("min.cleanable.dirty.ratio", "float", None, "Compact once uncompacted bytes are this "
       "share of the cleanable bytes.", min=0, max=1, fallback="min_cleanable_dirty_ratio"),
)

# fmt: on

#: scope -> canonical name -> Property
REGISTRY: dict[Scope, dict[str, Property]] = {
    "cluster": {p.name: p for p in CLUSTER},
    "topic": {p.name: p for p in TOPIC},
}
CLUSTER_PROPERTIES = REGISTRY["cluster"]
TOPIC_PROPERTIES = REGISTRY["topic"]


def _alias_index(props: tuple[Property, ...]) -> dict[str, tuple[str, ...]]:
    index: dict[str, tuple[str, ...]] = {}
    for prop in props:
        for alias in prop.aliases:
            index[alias] = (*index.get(alias, ()), prop.name)
    return index


#: scope -> alias -> the canonical names it sets (more than one for a fan-out alias)
ALIASES: dict[Scope, dict[str, tuple[str, ...]]] = {
    "cluster": _alias_index(CLUSTER),
    "topic": _alias_index(TOPIC),
}


def lookup(scope: Scope, key: str) -> tuple[Property, ...]:
    """The properties `key` sets in `scope` (a name or an alias); empty when unknown."""
    prop = REGISTRY[scope].get(key)
    if prop is not None:
        return (prop,)
    return tuple(REGISTRY[scope][name] for name in ALIASES[scope].get(key, ()))


def suggest(scope: Scope, key: str) -> str | None:
    """The closest known name or alias to a misspelt `key`, for "did you mean"."""
    known = [*REGISTRY[scope], *ALIASES[scope]]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return close[0] if close else None


def resolve_topic(cluster: Mapping[str, Value], overrides: Mapping[str, Value]) -> dict[str, Value]:
    """Every topic property's effective value: the topic's own setting when it has one, else
    the cluster property it falls back to, else its default (docs/configuration.md,
    \"Precedence\"). `cluster` must hold every cluster property."""
    values: dict[str, Value] = {}
    for prop in TOPIC:
        if prop.name in overrides:
            values[prop.name] = overrides[prop.name]
        elif prop.fallback is not None:
            values[prop.name] = cluster[prop.fallback]
        else:
            values[prop.name] = prop.default
    return values


# --- parsing a table of properties ------------------------------------------------------------


class ParsedTable(NamedTuple):
    """What one [cluster] or topic table holds: canonical name -> value for what it sets, the
    problems found as (key as written, message), and the properties whose value failed."""

    values: dict[str, Value]
    problems: list[tuple[str, str]]
    failed: set[str]


def _flatten(table: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted keys written without quotes (``retention.ms = 1``) are nested tables in TOML;
    flatten them back to the dotted names people mean."""
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, f"{name}.")
        else:
            yield name, value


def unknown_key_message(scope: Scope, key: str) -> str:
    """Why `key` is not accepted in `scope`, with the most useful hint: the right scope, a
    quoting mistake in a dotted topic name, or the closest known name."""
    if scope == "cluster" and lookup("topic", key):
        prop = lookup("topic", key)[0]
        default = f", or set its cluster default {prop.fallback}" if prop.fallback else ""
        return f'is a topic property: set it under [topics."<topic>"]{default}'
    if scope == "topic" and lookup("cluster", key):
        name = lookup("cluster", key)[0].name
        overrides = [p.name for p in TOPIC if p.fallback == name]
        if overrides:
            return f"is a cluster property; its topic-level override is {overrides[0]}"
        return "is a cluster property: set it under [cluster]"
    if scope == "topic":
        for prop in TOPIC:
            if key.endswith(f".{prop.name}"):
                part = key[: -len(prop.name) - 1]
                return (
                    f"unknown key; if '.{part}' is part of the topic name, quote the whole "
                    f'name: [topics."<topic>.{part}"]'
                )
    close = suggest(scope, key)
    return f"unknown key (did you mean {close}?)" if close else "unknown key"


def parse_table(scope: Scope, table: Mapping[str, Any]) -> ParsedTable:
    """Parse every key of one table, collecting all problems rather than stopping at one."""
    result = ParsedTable({}, [], set())
    set_by: dict[str, str] = {}
    for key, raw in _flatten(table):
        props = lookup(scope, key)
        if not props:
            result.problems.append((key, unknown_key_message(scope, key)))
            continue
        try:
            value = props[0].parse(raw)  # a fan-out alias sets properties of one kind
        except PropertyValueError as exc:
            result.problems.append((key, str(exc)))
            result.failed.update(p.name for p in props)
            continue
        for prop in props:
            if prop.name in set_by:
                again = f"sets {prop.name} again (already set by {set_by[prop.name]})"
                result.problems.append((key, again))
                continue
            set_by[prop.name] = key
            result.values[prop.name] = value
    return result


def cluster_rule_problems(cluster: Mapping[str, Value], failed: set[str]) -> list[tuple[str, str]]:
    """Rules across cluster properties, as (property, message); a rule is skipped when one of
    its values already failed to parse, so a default never stands in for a typo."""
    found: list[tuple[str, str]] = []

    def rule(names: tuple[str, str], bad: bool, message: str) -> None:
        if bad and not failed.intersection(names):
            found.append((names[0], message))

    lo = cluster["cloud_storage_upload_ctrl_min_shares"]
    hi = cluster["cloud_storage_upload_ctrl_max_shares"]
    rule(
        ("cloud_storage_upload_ctrl_min_shares", "cloud_storage_upload_ctrl_max_shares"),
        isinstance(lo, int) and isinstance(hi, int) and lo > hi,
        f"{lo} is above cloud_storage_upload_ctrl_max_shares ({hi})",
    )
    smin = cluster["cloud_storage_segment_size_min"]
    target = cluster["cloud_storage_segment_size_target"]
    rule(
        ("cloud_storage_segment_size_min", "cloud_storage_segment_size_target"),
        isinstance(smin, int) and isinstance(target, int) and smin > target,
        f"{smin} is above cloud_storage_segment_size_target ({target})",
    )
    cache = float(cluster["cloud_storage_cache_size_percent"] or 0)
    reserved = float(cluster["disk_reservation_percent"] or 0)
    rule(
        ("cloud_storage_cache_size_percent", "disk_reservation_percent"),
        cluster["retention_local_target_capacity_percent"] is None
        and local_capacity_percent(cluster) <= 0,
        f"{cache:g}% for the cache plus disk_reservation_percent {reserved:g}% leaves no disk "
        "for log data; lower one or set retention_local_target_capacity_percent",
    )
    return found


def local_capacity_percent(cluster: Mapping[str, Value]) -> float:
    """Target share of the disk for local log data: retention_local_target_capacity_percent,
    or by default what the cache and the reservation leave (Redpanda's default)."""
    explicit = cluster["retention_local_target_capacity_percent"]
    if explicit is not None:
        return float(explicit)  # type: ignore[arg-type]
    cache = float(cluster["cloud_storage_cache_size_percent"] or 0)  # type: ignore[arg-type]
    reserved = float(cluster["disk_reservation_percent"] or 0)  # type: ignore[arg-type]
    return max(0.0, 100.0 - cache - reserved)


def check_registry() -> list[str]:
    """Inconsistencies in the tables above (a programming error, so tested, not handled)."""
    errors: list[str] = []
    for scope, table in REGISTRY.items():
        for name, prop in table.items():
            if prop.scope != scope:
                errors.append(f"{name}: scope {prop.scope} in the {scope} table")
            if prop.kind not in PARSERS:
                errors.append(f"{name}: unknown kind {prop.kind}")
            if (prop.kind == "enum") != (prop.choices is not None):
                errors.append(f"{name}: choices go with kind enum only")
            for alias in prop.aliases:
                if alias in table:
                    errors.append(f"{name}: alias {alias} is also a property name")
            if prop.default is not None:
                try:
                    if prop.parse(prop.default) != prop.default:
                        errors.append(f"{name}: default {prop.default!r} is not canonical")
                except PropertyValueError as exc:
                    errors.append(f"{name}: default {prop.default!r} invalid: {exc}")
            if prop.fallback is not None:
                target = CLUSTER_PROPERTIES.get(prop.fallback)
                if scope != "topic" or target is None:
                    errors.append(f"{name}: bad fallback {prop.fallback}")
                elif (target.kind, target.unlimited) != (prop.kind, prop.unlimited):
                    errors.append(f"{name}: kind differs from its fallback {target.name}")
            elif scope == "topic" and prop.default is None:
                errors.append(f"{name}: a topic property needs a fallback or a default")
    return errors


_problems = check_registry()
if _problems:  # pragma: no cover - caught by tests/test_config/test_config.py before it ships
    raise RuntimeError("tiered.config.properties registry is inconsistent: " + "; ".join(_problems))
