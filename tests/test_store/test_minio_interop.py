"""Interop: what `tiered archive --once` wrote through boto3 is read back by a second,
independent S3 client, the MinIO Python SDK, from moto's server: the listing, the head
manifests (as plain JSON that tiered's decoder also accepts), and segment objects byte for
byte equal to the local `.log` files."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import crc32c
import pytest
from click.testing import CliRunner

from manifests import decode_partition_manifest, keys
from tiered.cli.main import cli
from tiered.kafka.checkpoints import TopicPartition, new_topic_id
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks

minio = pytest.importorskip("minio")

PREFIX = "cluster-a"


def _write_log(log_dir: Path, topic: str, partitions: int) -> None:
    ends = {}
    topic_id = new_topic_id()  # one topic: every partition shares its id
    for p in range(partitions):
        with LogWriter(log_dir / f"{topic}-{p}", segment_bytes=3000, topic_id=topic_id,
                       fsync=False) as w:
            for b in range(40):
                w.append([ProducerRecord(f"{p}:{b}:{i}".encode() * 10) for i in range(5)],
                         compression="zstd" if b % 4 == 0 else "none")
            ends[p] = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(topic, p): e for p, e in ends.items()},
                          fsync=False)


def test_minio_sdk_reads_back_what_the_archiver_wrote(
    moto_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    log_dir = tmp_path / "log"
    _write_log(log_dir, "payments", 2)
    config = tmp_path / "tiered.toml"
    config.write_text(
        f'[storage]\nurl = "s3://{s3_bucket}/{PREFIX}"\nendpoint_url = "{moto_endpoint}"\n'
        'region = "us-east-1"\naccess_key = "testing"\nsecret_key = "testing"\n'
        f'[log]\ndirs = ["{log_dir}"]\n'
    )
    for _ in range(5):
        result = CliRunner().invoke(cli, ["-q", "archive", "--once", "--config", str(config),
                                          "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        if json.loads(result.stdout)["uploaded_segments"] == 0:
            break

    client = minio.Minio(urlsplit(moto_endpoint).netloc, access_key="testing",
                         secret_key="testing", secure=False, region="us-east-1")
    listed = {o.object_name: o.size for o in
              client.list_objects(s3_bucket, prefix=f"{PREFIX}/", recursive=True)}
    assert listed, "nothing in the bucket"
    assert all(name.startswith(f"{PREFIX}/") for name in listed)

    heads = sorted(n for n in listed if n.endswith("/" + keys.PARTITION_MANIFEST_NAME))
    assert len(heads) == 2
    checked = 0
    for head in heads:
        response = client.get_object(s3_bucket, head)
        try:
            raw = response.read()
        finally:
            response.close()
            response.release_conn()
        json.loads(raw)  # the manifest is plain JSON to any client
        m = decode_partition_manifest(raw, key=head)
        assert m.topic == "payments"
        part_dir = log_dir / f"payments-{m.partition}"
        assert len(m.segments) >= 3
        for seg in m.segments:
            key = f"{PREFIX}/{m.segment_key(seg)}"
            assert listed[key] == seg.size_bytes
            stat = client.stat_object(s3_bucket, key)
            assert stat.size == seg.size_bytes
            response = client.get_object(s3_bucket, key)
            try:
                data = response.read()
            finally:
                response.close()
                response.release_conn()
            # the object is the Kafka segment file as it is on disk
            assert data == (part_dir / f"{seg.base_offset:020d}.log").read_bytes()
            assert crc32c.crc32c(data) == seg.checksum
            # a ranged read (how remote reads fetch chunks) returns the same bytes
            ranged = client.get_object(s3_bucket, key, offset=100, length=200)
            try:
                assert ranged.read() == data[100:300]
            finally:
                ranged.close()
                ranged.release_conn()
            checked += 1
    assert checked >= 6
