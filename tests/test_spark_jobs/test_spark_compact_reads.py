"""A compacted history read end to end: a Kafka log of a compacted topic archived by the real
archiver into moto's S3 server, compacted on local[2], then served by a history-server
daemon. `tiered fetch`, the HTTP API and the Kafka endpoint answer an offset inside a hole
with the next surviving record; confluent-kafka (librdkafka) and kafka-python read the
history start to end and see exactly the reference's survivors, byte for byte."""

from __future__ import annotations

import json
import random
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import confluent_kafka
import kafka
import pytest
from click.testing import CliRunner
from support.daemons import running
from support.kafka_endpoint import Rec, bootstrap, kafka_config
from support.remote import archive

from archiver.service import Archiver
from archiver.space import DiskInfo
from spark_jobs.compact import run_compact
from spark_jobs.job_context import JobContext
from tiered.app.describe import render_rows
from tiered.cli.main import cli
from tiered.config import parse_config
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.kafka.records import Header
from tiered.store import open_store

TOPIC = "kv"
T0 = 1_700_000_000_000
NOW = T0 + 30 * 86_400_000
PATIENCE_S = 120.0


@dataclass
class Compacted:
    base: Path
    storage: dict[str, Any]
    written: list[Rec]
    survivors: list[Rec]
    end: int


def _write(log_dir: Path, rng: random.Random) -> list[Rec]:
    out: list[Rec] = []
    with LogWriter(log_dir / f"{TOPIC}-0", segment_bytes=3000, fsync=False,
                   index_interval_bytes=256, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC),
                   clock=lambda: T0 / 1000) as w:
        w.become_leader(1)
        for b in range(220):
            recs = []
            for i in range(1 + b % 4):
                o = w.log_end_offset + i
                key = None if o % 31 == 0 else b"key-%02d" % rng.randrange(40)
                value = None if key is not None and rng.random() < 0.05 else rng.randbytes(30)
                headers = (Header("h", b"%d" % o),) if o % 5 == 0 else ()
                recs.append(ProducerRecord(value, key, headers, timestamp=T0 + o))
                out.append(Rec(o, T0 + o, key, value, tuple((h.key, h.value) for h in headers)))
            w.append(recs, compression=("none", "gzip", "lz4")[b % 3])
        w.roll()
        end = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(TOPIC, 0): end}, fsync=False)
    return out


def _describe(config: Any, store: Any) -> dict[str, Any]:
    """The describe-storage row of the compacted partition, from the real archiver."""
    archiver = Archiver(config, store, clock=lambda: T0 / 1000,
                        disk_usage=lambda _p: DiskInfo(2**40, 2**39))
    try:
        (row,) = [r for r in archiver.describe() if r["topic"] == TOPIC]
    finally:
        archiver.close()
    return row


def _survivors(written: list[Rec]) -> list[Rec]:
    latest = {r.key: r.offset for r in written if r.key is not None}
    return [r for r in written if r.key is None or latest[r.key] == r.offset]


@pytest.fixture(scope="module")
def compacted(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory, spark: Any
              ) -> Compacted:
    base = tmp_path_factory.mktemp("compact-reads")
    bucket = f"tiered-compact-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    client.close()
    storage = {"url": f"s3://{bucket}/pfx", "endpoint_url": moto_endpoint,
               "region": "us-east-1", "access_key": "testing", "secret_key": "testing"}
    log_dir = base / "logs"
    log_dir.mkdir()
    written = _write(log_dir, random.Random(4))
    config = parse_config({
        "storage": storage, "log": {"dirs": [str(log_dir)], "retention": "advise"},
        "cache": {"dir": str(base / "cache")},
        "cluster": {"storage_min_free_bytes": 0, "log_retention_ms": -1,
                    "cloud_storage_segment_size_target": 8000},
        "topics": {TOPIC: {"cleanup.policy": "compact"}},
    }, source="test", base_dir=base)
    with open_store(config.store_settings()) as store:
        archive(config, store)
        dirty = _describe(config, store)
    assert dirty["remote"]["dirty_ratio"] == 1.0, "uploaded segments are all dirty"
    with JobContext.from_config(config) as ctx:
        summary = run_compact(ctx, clock=lambda: NOW / 1000)
    assert summary["ok"], summary["errors"]
    with open_store(config.store_settings()) as store:
        clean = _describe(config, store)
    assert clean["remote"]["dirty_ratio"] == 0.0
    assert "0%" in render_rows([clean])[1] and "100%" in render_rows([dirty])[1]
    assert summary["records_dropped"] > 0 and summary["objects_written"] > 0
    survivors = _survivors(written)
    return Compacted(base, storage, written, survivors, written[-1].offset + 1)


@pytest.fixture(scope="module")
def daemon(compacted: Compacted) -> Iterator[Any]:
    # a history server: no local log at all, every read comes from the compacted bucket
    with running(kafka_config(compacted.base, compacted.storage, dirs=None,
                              cache="serve-cache")) as d:
        yield d


def _holes(c: Compacted) -> list[tuple[int, int]]:
    """(offset in a hole, the next surviving offset) pairs."""
    kept = [r.offset for r in c.survivors]
    pairs = []
    for a, b in zip(kept, kept[1:], strict=False):
        if b > a + 1:
            pairs.append((a + 1, b))
    assert len(pairs) > 10
    return pairs


def test_confluent_reads_the_compacted_history_start_to_end(compacted: Compacted,
                                                            daemon: Any) -> None:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap(daemon),
                                         "group.id": "compact-ck", "enable.auto.commit": False})
    got: list[Rec] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0,
                                                        confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + PATIENCE_S
        while not got or got[-1].offset < compacted.survivors[-1].offset:
            assert time.monotonic() < deadline, f"stuck after {len(got)} records"
            for m in consumer.consume(num_messages=100, timeout=0.5):
                assert m.error() is None, m.error()
                got.append(Rec(m.offset(), m.timestamp()[1], m.key(), m.value(),
                               tuple((k, v) for k, v in (m.headers() or []))))
    finally:
        consumer.close()
    assert got == compacted.survivors


def test_kafka_python_reads_the_compacted_history_and_seeks_into_holes(
    compacted: Compacted, daemon: Any
) -> None:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap(daemon), request_timeout_ms=60_000,
                                   enable_auto_commit=False)
    tp = kafka.TopicPartition(TOPIC, 0)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[Rec] = []
        deadline = time.monotonic() + PATIENCE_S
        while not got or got[-1].offset < compacted.survivors[-1].offset:
            assert time.monotonic() < deadline, f"stuck after {len(got)} records"
            for messages in consumer.poll(timeout_ms=500, max_records=200).values():
                got.extend(Rec(m.offset, m.timestamp, m.key, m.value,
                               tuple((k, v) for k, v in m.headers)) for m in messages)
        assert got == compacted.survivors
        hole, nxt = _holes(compacted)[len(_holes(compacted)) // 2]
        consumer.seek(tp, hole)
        first = None
        while first is None:
            assert time.monotonic() < deadline
            for messages in consumer.poll(timeout_ms=500, max_records=1).values():
                first = messages[0].offset
        assert first == nxt
    finally:
        consumer.close()


def test_http_api_answers_a_hole_with_the_next_surviving_record(compacted: Compacted,
                                                                daemon: Any) -> None:
    """A batch may hold the hole's offset and only older records (lastOffsetDelta is kept):
    its records are dropped as a consumer drops them, so the first record shown is the next
    surviving one."""
    for hole, nxt in _holes(compacted)[:5]:
        url = (f"{daemon.server.url}/v1/topics/{TOPIC}/partitions/0/records?offset={hole}"
               "&format=jsonl&max_bytes=4096")
        with urllib.request.urlopen(url, timeout=30) as response:
            lines = [json.loads(line) for line in response.read().splitlines() if line]
        assert lines and lines[0]["offset"] == nxt, (hole, nxt, lines[:1])


def test_tiered_fetch_answers_a_hole_with_the_next_surviving_record(compacted: Compacted,
                                                                    tmp_path: Path) -> None:
    s = compacted.storage
    path = tmp_path / "tiered.toml"
    path.write_text(
        "[storage]\n"
        f"url = \"{s['url']}\"\nendpoint_url = \"{s['endpoint_url']}\"\n"
        "region = \"us-east-1\"\naccess_key = \"testing\"\nsecret_key = \"testing\"\n"
        f"[log]\ndirs = []\n[cache]\ndir = \"{tmp_path / 'cache'}\"\n"
        "[cluster]\nstorage_min_free_bytes = 0\n")
    for hole, nxt in _holes(compacted)[-3:]:
        result = CliRunner().invoke(cli, ["-q", "fetch", "--config", str(path), "--topic", TOPIC,
                                          "--partition", "0", "--offset", str(hole),
                                          "--max-bytes", "4096"])
        assert result.exit_code == 0, result.output
        first = json.loads(result.stdout.splitlines()[0])
        assert first["offset"] == nxt, (hole, nxt, first)
