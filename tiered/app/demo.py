"""`tiered demo`: the main job end to end on one machine, with no server and no Spark.

In a directory (default ./tiered-demo) it writes a sample topic with the Kafka log writer,
archives it to an embedded `file://` bucket, lets local retention (enforce mode) delete what
the bucket now holds beyond a small local target, and shows what is local and what is remote.
Then it reads the oldest segment of orders-0, which is now only in the bucket, back through
the `Reader` and the chunk cache, and checks the batches are byte for byte those it wrote.

The configuration is `tiered.config.default_config(dir)` (bucket in dir/bucket, log in
dir/log, cache in dir/cache, local retention enforced) with small topic overrides so a few MiB
make many segments; it is also written to dir/tiered.toml so the other commands
(`tiered describe-storage`, `tiered archive --once`) can be pointed at the same data.

Running it again continues: it appends another round of records to the same partitions and
archives only what is new. Delete the directory to start over.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiered.config import Config, default_config
from tiered.config.model import FrozenMap
from tiered.config.properties import parse_table
from tiered.config.units import format_size
from tiered.errors import ConfigError, TieredError
from tiered.kafka.checkpoints import (
    PARTITION_METADATA,
    TopicPartition,
    new_topic_id,
    read_partition_metadata,
)

if TYPE_CHECKING:
    from archiver.service import PassReport
    from tiered.store.base import ObjectStore

__all__ = [
    "DEMO_TOPIC",
    "DEMO_TOPIC_OVERRIDES",
    "DemoResult",
    "ReadBack",
    "demo_config",
    "read_back_line",
    "read_back_segment",
    "render_config_toml",
    "run_demo",
]

DEMO_TOPIC = "orders"
DEMO_PARTITIONS = 3
#: records appended to each partition per run, in batches of BATCH_RECORDS (~1.9 MiB)
RECORDS_PER_PARTITION = 8_000
BATCH_RECORDS = 50
#: small segments so a few MiB make several of them; a local target that keeps only the newest
DEMO_TOPIC_OVERRIDES: Mapping[str, str] = {
    "segment.bytes": "256KiB",
    "retention.local.target.bytes": "512KiB",
}
#: enforce the local target routinely, not only under disk pressure (Redpanda's strict mode):
#: the demo's disk is nowhere near full, yet it should show local retention at work
DEMO_CLUSTER_OVERRIDES: Mapping[str, bool] = {"retention_local_strict": True}
CONFIG_FILE = "tiered.toml"
#: the partition whose oldest segment is read back from the bucket
READ_BACK_PARTITION = 0

_CUSTOMERS = ("ada", "grace", "linus", "barbara", "ken", "margaret", "dennis", "frances")
_ITEMS = ("keyboard", "monitor", "cable", "laptop", "headset", "dock", "mouse", "chair")


def demo_config(base_dir: Path) -> Config:
    """`default_config(base_dir)` with the demo's overrides, validated like a file's."""
    config = default_config(base_dir)
    topic = parse_table("topic", DEMO_TOPIC_OVERRIDES)
    cluster = parse_table("cluster", DEMO_CLUSTER_OVERRIDES)
    problems = topic.problems + cluster.problems
    if problems:  # a programming error in the constants above
        raise ConfigError("; ".join(f"{k}: {m}" for k, m in problems))
    return dataclasses.replace(
        config,
        cluster=FrozenMap({**config.cluster, **cluster.values}),
        topics=FrozenMap({DEMO_TOPIC: FrozenMap(topic.values)}),
    )


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render_config_toml(config: Config) -> str:
    """The demo's configuration as a TOML file that loads back to the same settings."""
    lines = [
        "# Written by `tiered demo`: the configuration it runs with. Try",
        f"#   tiered describe-storage --config {CONFIG_FILE}",
        "",
        "[storage]",
        f"url = {_toml_string(config.storage.url)}",
        "",
        "[log]",
        "dirs = [" + ", ".join(_toml_string(str(d)) for d in config.log_dirs) + "]",
        f"retention = {_toml_string(config.log_retention_mode)}",
        "",
        "[cache]",
        f"dir = {_toml_string(str(config.cache_dir))}",
        "",
        "[cluster]",
        *(f"{k} = {json.dumps(v)}" for k, v in DEMO_CLUSTER_OVERRIDES.items()),
    ]
    for topic in config.topics:
        lines += ["", f"[topics.{_toml_string(topic)}]"]
        lines += [f"{_toml_string(k)} = {_toml_string(v)}" for k, v in DEMO_TOPIC_OVERRIDES.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ReadBack:
    """Offsets `first_offset..last_offset` of one partition, deleted from the local disk, read
    back from the bucket; `identical`: the batches equal, byte for byte, the segment as it was
    written. `error` says why the read failed (the other fields are then zero)."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int = 0
    batches: int = 0
    size_bytes: int = 0
    #: `FetchResult.source` of the fetches ("remote" when the bucket served all of it)
    source: str = ""
    #: bytes the chunk cache fetched from the bucket for the read
    downloaded_bytes: int = 0
    identical: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.identical


@dataclass(frozen=True)
class DemoResult:
    """What one demo run did; `ok`: the archiving pass reported no problem and the read-back
    (None when the segment was still on local disk, so there was nothing to prove) matched."""

    base_dir: Path
    config_path: Path
    continued: bool
    records: int
    bytes_written: int
    segments_rolled: int
    report: PassReport
    rows: list[dict[str, Any]]
    read_back: ReadBack | None = None

    @property
    def ok(self) -> bool:
        return self.report.ok and (self.read_back is None or self.read_back.ok)


def _order(offset: int, partition: int, rng: random.Random) -> bytes:
    return json.dumps({
        "order_id": f"{partition}-{offset}",
        "customer": rng.choice(_CUSTOMERS),
        "item": rng.choice(_ITEMS),
        "quantity": rng.randint(1, 5),
        "price_cents": rng.randint(199, 99_999),
        "note": "x" * rng.randint(40, 160),
    }).encode()


def _topic_id(log_dir: Path) -> uuid.UUID:
    """The demo topic's id: the one its partitions already have, else a new one (all the
    partitions of a topic share it, as the bucket revision)."""
    for partition in range(DEMO_PARTITIONS):
        path = log_dir / f"{DEMO_TOPIC}-{partition}" / PARTITION_METADATA
        if path.exists():
            return read_partition_metadata(path)
    return new_topic_id()


def _write_partition(config: Config, log_dir: Path, partition: int, topic_id: uuid.UUID,
                     clock: Callable[[], float]) -> tuple[int, int, int, bool]:
    """Append this run's records to one partition and set its high watermark to the new log
    end; returns (records, bytes, segments rolled, whether the partition already had data)."""
    from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks

    topic = config.topic_config(DEMO_TOPIC)
    directory = log_dir / f"{DEMO_TOPIC}-{partition}"
    records = bytes_ = 0
    with LogWriter(directory, segment_bytes=topic.segment_bytes, segment_ms=topic.segment_ms,
                   index_interval_bytes=topic.index_interval_bytes, topic_id=topic_id,
                   clock=clock, fsync=False) as writer:
        continued = writer.log_end_offset > 0
        segments_before = len(writer.segment_base_offsets)
        rng = random.Random(writer.log_end_offset * 31 + partition)
        for _ in range(RECORDS_PER_PARTITION // BATCH_RECORDS):
            start = writer.log_end_offset
            batch = [ProducerRecord(_order(start + i, partition, rng),
                                    key=f"customer-{rng.randrange(100)}".encode())
                     for i in range(BATCH_RECORDS)]
            result = writer.append(batch)
            records += len(batch)
            bytes_ += result.size
        rolled = len(writer.segment_base_offsets) - segments_before
        end = writer.log_end_offset
    # everything written is committed: a consumer-visible log up to its end
    write_high_watermarks(log_dir, {TopicPartition(DEMO_TOPIC, partition): end}, fsync=False)
    return records, bytes_, rolled, continued


def write_sample_topic(
    config: Config, log_dir: Path, *, clock: Callable[[], float] = time.time
) -> tuple[int, int, int, bool]:
    """Append a run's worth of sample orders to every partition of the demo topic in `log_dir`
    (Kafka layout, high watermarks at the log end); also seeds the MinIO dev stack's log dir.
    Returns (records, bytes, segments rolled, whether the topic already had data)."""
    records = bytes_ = rolled = 0
    continued = False
    topic_id = _topic_id(log_dir)
    for partition in range(DEMO_PARTITIONS):
        r, b, s, c = _write_partition(config, log_dir, partition, topic_id, clock)
        records, bytes_, rolled, continued = records + r, bytes_ + b, rolled + s, continued or c
    return records, bytes_, rolled, continued


def run_demo(
    base_dir: Path,
    *,
    echo: Callable[[str], None] = print,
    clock: Callable[[], float] = time.time,
) -> DemoResult:
    """Write, archive, trim and show; prints a few lines through `echo`."""
    from archiver.service import Archiver
    from tiered.app.daemon import report_problems
    from tiered.app.describe import render_rows, summary_line
    from tiered.store import open_store

    base = Path(base_dir).absolute()
    base.mkdir(parents=True, exist_ok=True)
    config = demo_config(base)
    config_path = base / CONFIG_FILE
    config_path.write_text(render_config_toml(config))
    log_dir = config.log_dirs[0]
    log_dir.mkdir(parents=True, exist_ok=True)

    records, bytes_, rolled, continued = write_sample_topic(config, log_dir, clock=clock)
    where = _shown(base)
    verb = "continuing in" if continued else "in"
    echo(f"tiered demo {verb} {where} (run it again to add more; delete the directory to "
         "start over)")
    topic = config.topic_config(DEMO_TOPIC)
    echo(f"wrote {records:,} records ({format_size(bytes_)}) to topic {DEMO_TOPIC!r}: "
         f"{DEMO_PARTITIONS} partitions, {rolled} new segments of up to "
         f"{format_size(topic.segment_bytes)}")

    # the oldest segment of one partition as written, to compare once only the bucket has it
    oldest = _oldest_segment(config, READ_BACK_PARTITION)
    store = open_store(config.store_settings())
    try:
        archiver = Archiver(config, store, clock=clock)
        try:
            report = archiver.run_once()
            rows = archiver.describe(DEMO_TOPIC)
        finally:
            archiver.close()
        read_back = None if oldest is None else read_back_segment(config, store, *oldest)
    finally:
        store.close()

    uploaded = sum(p.uploaded_segments for p in report.partitions)
    uploaded_bytes = sum(p.uploaded_bytes for p in report.partitions)
    echo(f"archived {uploaded} closed segments ({format_size(uploaded_bytes)}) to "
         f"{config.storage.url}; active segments stay local until they close")
    target = topic.retention_local_target_bytes
    echo(f"local retention (enforce, retention.local.target.bytes = "
         f"{format_size(target) if target is not None else 'none'} per partition): deleted "
         f"{report.deleted_local_segments} local segments the bucket holds")
    for line in render_rows(rows):
        echo("  " + line)
    echo(summary_line(rows))
    if read_back is not None:
        echo(read_back_line(read_back))
    for error in report_problems(report):
        echo(f"error: {error}")
    echo(f"next: tiered describe-storage --config {_shown(config_path)}")
    return DemoResult(base, config_path, continued, records, bytes_, rolled, report, rows,
                      read_back)


def _oldest_segment(config: Config, partition: int) -> tuple[int, int, bytes] | None:
    """(partition, base offset, bytes) of the partition's oldest local segment."""
    from tiered.kafka.local_log import LocalLog

    part = LocalLog(config.log_dirs).partitions.get(TopicPartition(DEMO_TOPIC, partition))
    if part is None or not part.segments:
        return None
    oldest = part.segments[0]
    return partition, oldest.base_offset, oldest.log_path.read_bytes()


def read_back_segment(
    config: Config, store: ObjectStore, partition: int, base_offset: int, written: bytes
) -> ReadBack | None:
    """Fetch `len(written)` bytes of the demo topic's `partition` from `base_offset` through a
    `Reader` (local log first, then the bucket through the chunk cache in `config.cache_dir`)
    and compare them with `written`, the segment's bytes as written. None when the local log
    still holds `base_offset`: the read would not touch the bucket, so it would prove nothing."""
    from cache.reader import Reader
    from tiered.kafka.local_log import LocalLog
    from tiered.kafka.records import iter_batch_headers

    local = LocalLog(config.log_dirs)
    part = local.partitions.get(TopicPartition(DEMO_TOPIC, partition))
    start = None if part is None else part.log_start_offset
    if start is not None and start <= base_offset:
        return None
    pieces: list[bytes] = []
    sources: list[str] = []
    first = last = base_offset
    try:
        # offsets and counts only: the comparison below is what checks the bytes
        headers = list(iter_batch_headers(written, verify_crc=False))
        if not headers:
            return None
        first, last = headers[0].base_offset, headers[-1].last_offset
        with Reader(config, store, local_log=local) as reader:
            offset, size = base_offset, 0
            # the first fetch returns the whole segment unless the reader stops early (at a
            # chunk edge, say); then fetch on from where it stopped
            while size < len(written):
                result = reader.fetch(DEMO_TOPIC, partition, offset, len(written) - size)
                if not result.data or result.next_offset <= offset:
                    break
                pieces.append(result.data)
                sources += [s for s in result.source.split("+") if s not in sources]
                offset, size = result.next_offset, size + len(result.data)
            downloaded = int(reader.stats["cache"]["bytes_downloaded"])
    except TieredError as exc:
        return ReadBack(DEMO_TOPIC, partition, first, last, error=str(exc))
    data = b"".join(pieces)
    return ReadBack(DEMO_TOPIC, partition, first, last,
                    records=sum(h.records_count for h in headers), batches=len(headers),
                    size_bytes=len(data), source="+".join(sources),
                    downloaded_bytes=downloaded, identical=data == written)


def read_back_line(rb: ReadBack) -> str:
    """The demo's one line about the read-back."""
    what = f"offsets {rb.first_offset}..{rb.last_offset} of {rb.topic}-{rb.partition}"
    if rb.error is not None:
        return f"error: reading {what} back from the bucket failed: {rb.error}"
    if not rb.identical:
        return (f"error: {what} read back from the bucket ({format_size(rb.size_bytes)}, "
                f"source={rb.source}) differ from the segment as written")
    return (f"read {what} back from the bucket (deleted locally): {rb.records:,} records in "
            f"{rb.batches} batches, byte-identical to what was written (source={rb.source}, "
            f"{format_size(rb.downloaded_bytes)} downloaded)")


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is below it (shorter to read)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
