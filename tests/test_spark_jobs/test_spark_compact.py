"""Compaction of a compacted topic's history in the bucket, on real PySpark (local[2]).

Every surviving record is checked against an independent reference written here (the latest
record per key; tombstones kept until their horizon; keyless records kept), decoded by
kafka-python. Invariants defended: the manifest stays contiguous and every replacement is a
generation-named object committed by compare-and-swap (4, 6); replaced objects stay until GC
(7); a daemon committing beside the job loses nothing; a pass with nothing new writes nothing.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka.record.default_records import DefaultRecordBatch
from support.spark import REVISION, TOPIC, read_back, upload_segments

from manifests import ManifestSettings, ManifestStore, keys
from manifests.topic import TopicManifest, save_topic_manifest
from spark_jobs.compact import run_compact
from spark_jobs.job_context import JobContext, PartitionRef
from tiered.cli.main import cli
from tiered.config import parse_config
from tiered.kafka.builder import encode_batch
from tiered.kafka.records import DELETE_HORIZON_MASK, Record
from tiered.store.base import ObjectStore

T0 = 1_700_000_000_000
DAY = 86_400_000
#: the job's clock: a day after the data was written
NOW = T0 + 10 * DAY


def context(store: ObjectStore, policy: str = "compact", **topic: Any) -> JobContext:
    config = parse_config({
        "storage": {"url": store.settings.url},
        "cluster": {"cloud_storage_segment_size_target": 6000},
        "topics": {TOPIC: {"cleanup.policy": policy, "index.interval.bytes": 256, **topic}},
    }, source="test.toml")
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    return JobContext(config, store.settings, store, mstore)


Rec = tuple[int, bytes | None, bytes | None]  # offset, key, value


def make_log(rng: random.Random, start: int, count: int, keys_n: int = 30,
             tomb: float = 0.1) -> list[list[Rec]]:
    """Batches of keyed records (some tombstones, some keyless) from offset `start`."""
    batches, off = [], start
    while off < start + count:
        recs: list[Rec] = []
        for _ in range(rng.randint(1, 5)):
            key = None if rng.random() < 0.05 else b"key-%03d" % rng.randrange(keys_n)
            value = None if key is not None and rng.random() < tomb else b"v-%d-" % off * 4
            recs.append((off, key, value))
            off += 1
        batches.append(recs)
    return batches


def encode(batch: list[Rec]) -> bytes:
    return encode_batch([Record(o, T0 + o, k, v) for o, k, v in batch], base_offset=batch[0][0])


def seed(ctx: JobContext, segments: list[list[list[Rec]]], partition: int = 0) -> None:
    save_topic_manifest(ctx.store, TopicManifest(TOPIC, REVISION, partition + 1,
                                                 cleanup_policy="compact", segment_bytes=4096))
    upload_segments(ctx.manifests, partition, [b"".join(encode(b) for b in seg)
                                               for seg in segments])


def expected(batches: list[list[Rec]], *, horizon_passed: bool) -> list[Rec]:
    """The reference: the latest record of each key (a tombstone only while its horizon has
    not passed), every keyless record, in offset order."""
    latest: dict[bytes, int] = {}
    for b in batches:
        for o, k, _v in b:
            if k is not None:
                latest[k] = o
    out = []
    for b in batches:
        for o, k, v in b:
            if k is None or (latest[k] == o and (v is not None or not horizon_passed)):
                out.append((o, k, v))
    return out


def records_in_bucket(ctx: JobContext, partition: int = 0) -> tuple[list[Rec], list[Any]]:
    m, data = read_back(ctx.manifests, partition)
    recs, batches, pos = [], [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 8:pos + 12], "big") + 12
        batch = DefaultRecordBatch(data[pos:pos + size])
        assert batch.validate_crc()
        batches.append(batch)
        recs.extend((r.offset, r.key, r.value) for r in batch)
        pos += size
    return recs, batches


def bucket_keys(store: ObjectStore) -> set[str]:
    return {info.key for info in store.list("")}


def test_compaction_keeps_the_latest_record_per_key_and_is_idempotent(
    file_store: ObjectStore, spark: Any
) -> None:
    ctx = context(file_store)
    rng = random.Random(7)
    log = make_log(rng, 0, 600)
    segs = [log[i:i + 25] for i in range(0, len(log), 25)]
    seed(ctx, segs)
    before, _ = ctx.manifests.load(TOPIC, 0, REVISION)

    summary = run_compact(ctx, clock=lambda: NOW / 1000)

    assert summary["ok"], summary["errors"]
    want = expected(log, horizon_passed=False)
    got, batches = records_in_bucket(ctx)
    assert got == want
    # timestamps and every byte of the kept records are the originals'
    by_offset = {o: (k, v) for b in log for o, k, v in b}
    assert all(by_offset[o] == (k, v) for o, k, v in got)
    # tombstones carry the KIP-534 horizon: now + delete.retention.ms (1 day default)
    for b in batches:
        if any(r.value is None and r.key is not None for r in b):
            assert b.attributes & DELETE_HORIZON_MASK and b.first_timestamp == NOW + DAY
    m, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    assert m.last_offset == before.last_offset and m.log_start_offset == 0
    assert all(s.compacted and keys.parse_segment_name(s.object_name) for s in m.segments)
    assert len(m.segments) < len(before.segments), "small compacted copies are combined"
    assert all(ctx.store.exists(m.segment_key(r.segment)) for r in m.replaced)
    assert summary["records_in"] == sum(len(b) for b in log)
    assert summary["records_dropped"] == summary["records_in"] - len(want)
    assert summary["after"]["bytes"] < summary["before"]["bytes"]

    objects = bucket_keys(ctx.store)
    again = run_compact(ctx, clock=lambda: NOW / 1000 + 1)
    assert again["ok"] and again["objects_written"] == 0
    assert bucket_keys(ctx.store) == objects, "a pass with nothing to do writes nothing"
    assert again["skipped"][0]["reason"].startswith("every cleanable segment is already")


def test_tombstones_go_after_the_horizon_when_new_data_makes_the_partition_due(
    file_store: ObjectStore, spark: Any
) -> None:
    ctx = context(file_store, **{"delete.retention.ms": 1000})
    rng = random.Random(3)
    log = make_log(rng, 0, 300, tomb=0.3)
    seed(ctx, [log[i:i + 20] for i in range(0, len(log), 20)])
    first = run_compact(ctx, clock=lambda: NOW / 1000)
    assert first["ok"] and first["delete_horizons_set"] > 0
    more = make_log(rng, 300, 40, tomb=0.0)
    upload_segments(ctx.manifests, 0, [b"".join(encode(b) for b in more)])
    later = run_compact(ctx, clock=lambda: (NOW + 5000) / 1000,)
    assert later["ok"], later["errors"]
    assert later["tombstones_dropped"] > 0
    got, _ = records_in_bucket(ctx)
    assert got == expected(log + more, horizon_passed=True)


def test_delete_topics_are_never_touched_and_dry_run_writes_nothing(
    file_store: ObjectStore, spark: Any
) -> None:
    ctx = context(file_store, policy="delete")
    log = make_log(random.Random(1), 0, 100)
    save_topic_manifest(ctx.store, TopicManifest(TOPIC, REVISION, 1, segment_bytes=4096))
    upload_segments(ctx.manifests, 0, [b"".join(encode(b) for b in log)])
    objects = bucket_keys(ctx.store)
    summary = run_compact(ctx, clock=lambda: NOW / 1000)
    assert summary["ok"] and summary["skipped"][0]["reason"].startswith("cleanup.policy = delete")
    assert bucket_keys(ctx.store) == objects

    compacted = context(file_store)
    dry = run_compact(compacted, clock=lambda: NOW / 1000, dry_run=True)
    assert dry["ok"] and dry["dry_run"] and dry["records_dropped"] > 0
    assert dry["after"]["bytes"] < dry["before"]["bytes"]
    assert bucket_keys(ctx.store) == objects


def test_a_run_leaves_nothing_on_the_executors_disks(file_store: ObjectStore,
                                                      spark: Any) -> None:
    """A dry run cleans every segment and uploads none: what its stages left on the
    executor's disk (spark_jobs/executor_spill.py) goes at its end, as after a real run."""
    from pyspark import SparkFiles

    from spark_jobs.executor_spill import SPILL_DIR

    spills = Path(SparkFiles.getRootDirectory()) / SPILL_DIR
    ctx = context(file_store)
    log = make_log(random.Random(3), 0, 160)
    seed(ctx, [log[i:i + 10] for i in range(0, len(log), 10)])
    for dry_run in (True, False):
        summary = run_compact(ctx, clock=lambda: NOW / 1000, dry_run=dry_run)
        assert summary["ok"] and summary["records_dropped"] > 0, summary
        assert not spills.is_dir() or list(spills.iterdir()) == [], dry_run


def test_min_compaction_lag_leaves_young_segments_alone(
    file_store: ObjectStore, spark: Any
) -> None:
    ctx = context(file_store, **{"min.compaction.lag.ms": 5 * DAY})
    log = make_log(random.Random(5), 0, 200)
    seed(ctx, [log[:20], log[20:]])
    # the clock puts the second segment's records within the lag
    last_ts = T0 + log[-1][-1][0]
    first_seg_max = T0 + log[19][-1][0]
    now = (first_seg_max + last_ts) // 2 + 5 * DAY
    summary = run_compact(ctx, clock=lambda: now / 1000)
    assert summary["ok"], summary["errors"]
    m, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    assert [s.compacted for s in m.segments] == [True, False]
    got, _ = records_in_bucket(ctx)
    assert got == expected(log[:20], horizon_passed=False) + [r for b in log[20:] for r in b]


def test_a_daemon_committing_beside_the_job_loses_nothing(
    file_store: ObjectStore, spark: Any
) -> None:
    ctx = context(file_store)
    rng = random.Random(11)
    log = make_log(rng, 0, 400)
    seed(ctx, [log[i:i + 20] for i in range(0, len(log), 20)])
    appended: list[list[Rec]] = []

    def daemon(part: PartitionRef) -> None:
        m, _ = ctx.manifests.load(TOPIC, part.partition, REVISION)
        more = make_log(rng, m.last_offset + 1, 50)
        upload_segments(ctx.manifests, part.partition, [b"".join(encode(b) for b in more)],
                        term=m.term + 1)
        appended.extend(more)

    summary = run_compact(ctx, clock=lambda: NOW / 1000, before_commit=daemon)
    assert summary["ok"], summary["errors"]
    assert summary["commit_conflicts"] >= 1 and summary["objects_written"] >= 1
    got, _ = records_in_bucket(ctx)
    assert got == expected(log, horizon_passed=False) + [r for b in appended for r in b]
    m, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    assert not m.segments[-1].compacted


@pytest.mark.parametrize("kind", ["aborted", "committed"])
def test_transactions_follow_kafka(file_store: ObjectStore, spark: Any, kind: str) -> None:
    from tiered.kafka.builder import control_record

    ctx = context(file_store)
    batches = [
        encode_batch([Record(0, T0, b"a", b"base")], base_offset=0),
        encode_batch([Record(1, T0, b"a", b"txn")], base_offset=1, producer_id=5,
                     producer_epoch=0, base_sequence=0, transactional=True),
        encode_batch([control_record("abort" if kind == "aborted" else "commit", 0, offset=2,
                                     timestamp=T0)], base_offset=2, producer_id=5,
                     producer_epoch=0, transactional=True, control=True),
        encode_batch([Record(3, T0, b"b", b"x")], base_offset=3),
    ]
    save_topic_manifest(ctx.store, TopicManifest(TOPIC, REVISION, 1, cleanup_policy="compact",
                                                 segment_bytes=4096))
    upload_segments(ctx.manifests, 0, [b"".join(batches[:2]), b"".join(batches[2:])])
    summary = run_compact(ctx, clock=lambda: NOW / 1000)
    assert summary["ok"], summary["errors"]
    got, parsed = records_in_bucket(ctx)
    data = [(o, k, v) for o, k, v in got if k in (b"a", b"b")]
    if kind == "aborted":
        assert data == [(0, b"a", b"base"), (3, b"b", b"x")]
    else:
        assert data == [(1, b"a", b"txn"), (3, b"b", b"x")]
    assert any(b.is_control_batch for b in parsed), "the marker stays this pass"


def test_an_idempotent_producers_last_batch_stays_emptied(file_store: ObjectStore,
                                                           spark: Any) -> None:
    """Batches with a producer id but no transaction: the verdicts come from the same shuffle
    as the key map. A producer's last batch keeps its header when every record of it goes
    (its sequence number survives, as in Kafka); its earlier batches go whole."""
    ctx = context(file_store)
    batches = [
        encode_batch([Record(0, T0, b"a", b"1")], base_offset=0, producer_id=7,
                     producer_epoch=0, base_sequence=0),
        encode_batch([Record(1, T0, b"a", b"2")], base_offset=1, producer_id=7,
                     producer_epoch=0, base_sequence=1),
        encode_batch([Record(2, T0, b"a", b"3"), Record(3, T0, b"b", b"x")], base_offset=2),
    ]
    save_topic_manifest(ctx.store, TopicManifest(TOPIC, REVISION, 1, cleanup_policy="compact",
                                                 segment_bytes=4096))
    upload_segments(ctx.manifests, 0, [b"".join(batches[:2]), batches[2]])
    summary = run_compact(ctx, clock=lambda: NOW / 1000)
    assert summary["ok"], summary["errors"]
    got, parsed = records_in_bucket(ctx)
    assert got == [(2, b"a", b"3"), (3, b"b", b"x")]
    # no record of offset 1 is left: its batch is there, emptied
    assert [(b.base_offset, b.producer_id) for b in parsed] == [(1, 7), (2, -1)], \
        "the producer's last batch stays, emptied; its first goes"


def test_cli_json_progress_and_metrics_file(file_store: ObjectStore, spark: Any,
                                            tmp_path: Path) -> None:
    """`tiered compact --json`: the summary on stdout, progress on stderr, the run's gauges in
    --metrics-file; `--partition` limits the run and a typo'd topic is exit 7."""
    ctx = context(file_store)
    log = make_log(random.Random(9), 0, 200)
    seed(ctx, [log[i:i + 15] for i in range(0, len(log), 15)], partition=1)
    config = tmp_path / "tiered.toml"
    config.write_text(f'[storage]\nurl = "{file_store.settings.url}"\n[topics."{TOPIC}"]\n'
                      '"cleanup.policy" = "compact"\n"min.cleanable.dirty.ratio" = 0.5\n')
    metrics = tmp_path / "compact.prom"

    result = CliRunner().invoke(cli, ["compact", "--config", str(config), "--topic", TOPIC,
                                      "--partition", "1", "--json",
                                      "--metrics-file", str(metrics)])

    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["ok"] and summary["partitions_compacted"] == 1
    assert [p["partition"] for p in summary["partitions"]] == [1]
    assert summary["partitions"][0]["dirty_ratio"] == 1.0
    assert "compact:" in result.stderr and "tasks" in result.stderr
    text = metrics.read_text()
    assert "tiered_compaction_last_run_success 1.0" in text
    assert f"tiered_compaction_last_run_records_dropped {float(summary['records_dropped'])}" \
        in text
    human = CliRunner().invoke(cli, ["compact", "--config", str(config)])
    assert human.exit_code == 0, human.output
    assert "skipped" in human.stdout and "already compacted" in human.stdout
    unknown = CliRunner().invoke(cli, ["compact", "--config", str(config), "--topic", "nope"])
    assert unknown.exit_code == 7 and "unknown topic" in unknown.output


def test_a_second_compaction_beside_the_first_loses_nothing(
    file_store: ObjectStore, spark: Any
) -> None:
    """A second job compacts and commits while the first waits to commit: the first's groups
    no longer apply, are deleted unreferenced, and every surviving record is there once."""
    ctx = context(file_store)
    log = make_log(random.Random(21), 0, 300)
    seed(ctx, [log[i:i + 20] for i in range(0, len(log), 20)])
    inner: list[dict[str, Any]] = []

    def second_job(part: PartitionRef) -> None:
        if not inner:
            inner.append(run_compact(context(file_store), clock=lambda: NOW / 1000))

    first = run_compact(ctx, clock=lambda: NOW / 1000, before_commit=second_job)
    assert inner[0]["ok"] and inner[0]["objects_written"] >= 1
    assert first["ok"], first["errors"]
    assert first["objects_written"] == 0 and first["stale_groups"] >= 1
    assert first["unreferenced_objects_deleted"] >= 1
    got, _ = records_in_bucket(ctx)
    assert got == expected(log, horizon_passed=False)
    m, _ = ctx.manifests.load(TOPIC, 0, REVISION)
    listed = set(m.segments.object_names()) | {r.segment.object_name for r in m.replaced}
    prefix = keys.partition_data_prefix(TOPIC, 0, REVISION)
    for info in ctx.store.list(prefix):
        name = info.key[len(prefix):]
        if name.endswith(".log"):
            assert name in listed, f"{name}: an object no manifest names was left behind"
