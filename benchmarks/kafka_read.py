"""Archived history read by Kafka consumers through `tiered run`'s Kafka endpoint, against boto3
GETs of the same segment objects in the same run.

Set-up: a moto_server child process; one partition of `--size-mb` MiB of incompressible 64 KiB
batches (16 records of 4 KiB) in `--segment-mb` MiB segments, archived by the real archiver and
deleted locally (a small active segment stays); a real `tiered run` child process with a
[kafka] section and `cloud_storage_chunk_prefetch = --prefetch`, or the key left out (the
default: the adaptive read-ahead window, docs/remote-read.md) when `--prefetch` is not given.

Measures (MB/s are 10**6 bytes of segment data per second; every record consumed is compared
with the log after the clock stops):
* boto3: every segment object of the partition read start to end, one streamed GET each
  (1 MiB reads), one after another: the baseline;
* confluent_cold: a confluent-kafka (librdkafka) consumer assigned the partition from the
  beginning, reading every archived offset with an empty read cache, default client settings
  (1 MiB per partition and fetch), against a daemon at the default cache settings (eager
  eviction: a chunk is dropped once its reader moved past it, never written to disk); the
  clock starts once the client has the topic's metadata; also the daemon's CPU seconds per MB;
* confluent_cold_capped: the same against a second daemon that keeps every chunk (the
  `capped` strategy, every chunk of a segment allowed), so each chunk is also written to the
  cache directory;
* confluent_warm: that second daemon read again, every chunk now in its cache
  (`store_bytes_downloaded` shows what each run fetched from the store);
* kafka_python: kafka-python reading the first `--kafka-python-mb` MiB (warm), the same way.
The headline is confluent_cold / boto3 (goal >= 0.5). Every contender runs in this process;
each clock starts with the harness's own objects collected and frozen (`settle_heap`), so no
contender's loop pays for walking them.
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import statistics
import sys
import tempfile
import textwrap
import time
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    MB,
    MIB,
    SHM,
    DaemonProcess,
    MotoServer,
    archive_everything,
    daemon_config,
    emit,
    free_port,
    progress,
    settle_heap,
    versions,
)

from tiered.config import parse_config
from tiered.kafka.builder import encode_batch
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, write_high_watermarks
from tiered.kafka.records import Record, iter_batches

TOPIC = "bench"
BUCKET = "kafka-read"
RECORDS_PER_BATCH = 16
RECORD_BYTES = 4096


def _template(seed: int) -> tuple[bytearray, list[bytes]]:
    rng = random.Random(seed)
    values = [rng.randbytes(RECORD_BYTES) for _ in range(RECORDS_PER_BATCH)]
    records = [Record(i, 1_700_000_000_000 + i, None, v) for i, v in enumerate(values)]
    return bytearray(encode_batch(records, base_offset=0)), values


def write_log(log_dir: Path, size: int, segment: int) -> tuple[list[Path], int]:
    """Closed segments holding `size` bytes and a small active one; returns the closed
    segments' paths and the log end offset. One batch is copied with new base offsets (the
    CRC does not cover them), so every record's value is known without keeping it."""
    template, _values = _template(7)
    writer = LogWriter(log_dir / f"{TOPIC}-0", segment_bytes=segment, fsync=False,
                       topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC))
    with writer:
        written = 0
        while written < size:
            template[:8] = writer.log_end_offset.to_bytes(8, "big")
            writer.append_batches(bytes(template))
            written += len(template)
        writer.roll()
        for _ in range(4):  # an active segment that stays local
            template[:8] = writer.log_end_offset.to_bytes(8, "big")
            writer.append_batches(bytes(template))
        end = writer.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(TOPIC, 0): end}, fsync=False)
    closed = sorted(p for p in (log_dir / f"{TOPIC}-0").glob("*.log"))[:-1]
    return closed, end


#: with --scram: the user the consumers authenticate as (docs/security.md), and their settings
SCRAM_USER = "bench"
SCRAM_PASSWORD = uuid.uuid4().hex
CONFLUENT_AUTH: dict[str, Any] = {}
KAFKA_PYTHON_AUTH: dict[str, Any] = {}


def use_scram(config: Any) -> None:
    """Create the user and its ACLs in the bucket; consumers then authenticate with
    SCRAM-SHA-512 and every request is checked against the ACLs."""
    from manifests.security import (
        Acl,
        Operation,
        PatternType,
        Permission,
        ResourceType,
        User,
        add_acl,
        make_credential,
        put_user,
    )
    from tiered.store import open_store

    with open_store(config.store_settings()) as store:
        put_user(store, User(SCRAM_USER, {"SCRAM-SHA-512": make_credential(
            SCRAM_PASSWORD, "SCRAM-SHA-512")}))
        principal = f"User:{SCRAM_USER}"
        add_acl(store, Acl(principal, ResourceType.TOPIC, PatternType.LITERAL, TOPIC,
                           Operation.READ, Permission.ALLOW))
        add_acl(store, Acl(principal, ResourceType.GROUP, PatternType.PREFIXED, "bench-",
                           Operation.READ, Permission.ALLOW))
    CONFLUENT_AUTH.update({"security.protocol": "SASL_PLAINTEXT",
                           "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": SCRAM_USER,
                           "sasl.password": SCRAM_PASSWORD})
    KAFKA_PYTHON_AUTH.update({"security_protocol": "SASL_PLAINTEXT",
                              "sasl_mechanism": "SCRAM-SHA-512",
                              "sasl_plain_username": SCRAM_USER,
                              "sasl_plain_password": SCRAM_PASSWORD})


def config_text(work: Path, endpoint: str, port: int, prefetch: int | None, chunk: int,
                cache_dir: Path, scram: bool = False, keep: bool = False) -> str:
    """The daemon's configuration; `prefetch` None leaves `cloud_storage_chunk_prefetch` out
    (the default, adaptive read-ahead); `keep`: the cache keeps every chunk a reader passed
    until it needs room (the default, eager, lets a chunk go once its reader moved on), so a
    second read finds a warm cache."""
    kafka = f'[kafka]\nlisten = "127.0.0.1:{port}"'
    prefetch_line = "" if prefetch is None else f"cloud_storage_chunk_prefetch = {prefetch}"
    keep_lines = ('cloud_storage_chunk_eviction_strategy = "capped"\n'
                  "cloud_storage_hydrated_chunks_per_segment_ratio = 1.0") if keep else ""
    if scram:
        kafka += '\nsasl_mechanisms = ["SCRAM-SHA-512"]'
    return daemon_config(
        bucket=BUCKET, endpoint=endpoint, log_dir=work / "logs", cache_dir=cache_dir,
        sections=kafka, cluster=textwrap.dedent(f"""\
            cloud_storage_cache_size = {64 * 1024 * MIB}
            {prefetch_line}
            cloud_storage_cache_chunk_size = {chunk}
            {keep_lines}
            cloud_storage_segment_max_upload_interval_sec = 86400
            log_retention_ms = -1
            """))


def kafka_listening(port: int) -> Callable[[DaemonProcess], bool]:
    """A `DaemonProcess` readiness check: the Kafka endpoint accepts connections."""

    def ready(_: DaemonProcess) -> bool:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True

    return ready


def confluent_read(port: int, end: int, fetch_bytes: int | None
                   ) -> tuple[int, float, list[bytes], float]:
    """Every offset below `end` with confluent-kafka: (messages, seconds, values, seconds
    until the first message: the client's own start-up, metadata and ListOffsets)."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": f"127.0.0.1:{port}", "group.id": f"bench-{uuid.uuid4().hex}",
        "enable.auto.commit": False, **CONFLUENT_AUTH,
        **({} if fetch_bytes is None else {"max.partition.fetch.bytes": fetch_bytes})})
    values: list[bytes] = []
    # the client learns the partition's leader before the clock starts, as boto3's client is
    # made before its clock: assigned a partition with no known leader, librdkafka waits for
    # its offset-query timer (about 0.5 s) before it even asks for offsets
    consumer.list_topics(TOPIC, timeout=30)
    settle_heap()
    start = time.perf_counter()
    first: float | None = None
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, confluent_kafka.OFFSET_BEGINNING)])
    last = -1
    while last < end - 1:
        # never ask for more than is left: consume() waits for its count or the timeout
        for m in consumer.consume(num_messages=min(1000, end - 1 - last), timeout=1.0):
            if m.error() is not None:
                raise SystemExit(f"consumer error: {m.error()}")
            if first is None:
                first = time.perf_counter()
            value, offset = m.value(), m.offset()
            assert value is not None and offset is not None  # data messages, not errors
            values.append(value)
            last = offset
    took = time.perf_counter() - start
    consumer.close()
    return len(values), took, values, (first or start) - start


def kafka_python_read(port: int, end: int) -> tuple[int, float, list[bytes]]:
    import kafka

    consumer = kafka.KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}",
                                   enable_auto_commit=False, **KAFKA_PYTHON_AUTH)
    tp = kafka.TopicPartition(TOPIC, 0)
    values: list[bytes] = []
    settle_heap()
    start = time.perf_counter()
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    last = -1
    while last < end - 1:
        for messages in consumer.poll(timeout_ms=1000, max_records=1000).values():
            for m in messages:
                if m.offset < end:
                    values.append(m.value)
                last = max(last, m.offset)
    took = time.perf_counter() - start
    consumer.close()
    return len(values), took, values


def check(values: list[bytes], expected: list[bytes]) -> None:
    """Outside the clock: every record's value, in order."""
    if len(values) < len(expected) or any(
            v != expected[i % RECORDS_PER_BATCH] for i, v in enumerate(values)):
        raise SystemExit("a consumer got records that differ from the log")


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="kafka_read.py", description=__doc__)
    parser.add_argument("--size-mb", type=int, default=288, help="archived history, MiB")
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=None,
                        help="cloud_storage_chunk_prefetch; not given: the key is left out "
                             "(the default, adaptive read-ahead)")
    parser.add_argument("--chunk-mb", type=int, default=16, help="cache chunk size, MiB")
    parser.add_argument("--kafka-python-mb", type=int, default=64,
                        help="history kafka-python reads, MiB")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every contender; the report gives medians")
    parser.add_argument("--fetch-kb", type=int, default=None,
                        help="confluent-kafka's max.partition.fetch.bytes, KiB (default: the "
                             "client's, 1024)")
    parser.add_argument("--scram", action="store_true",
                        help="consumers authenticate with SCRAM-SHA-512 and requests are "
                             "checked against ACLs (docs/security.md)")
    parser.add_argument("--cache-on-disk", action="store_true",
                        help="put the read cache in the work directory, not on tmpfs")
    parser.add_argument("--tree", type=Path, default=None,
                        help="a source tree whose code the daemon runs instead of the "
                             "installed one (an older version, for a before/after)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tiered-kafka-read-"))
    shm = Path(SHM)
    cache_dir = (work / "cache" if args.cache_on_disk or not shm.is_dir()
                 else Path(tempfile.mkdtemp(prefix="tiered-bench-cache-", dir=shm)))
    report: dict[str, Any] = {"benchmark": "kafka_read", "history_bytes": args.size_mb * MIB,
                              "segment_bytes": args.segment_mb * MIB,
                              "batch_bytes": RECORDS_PER_BATCH * RECORD_BYTES,
                              "prefetch_chunks": args.prefetch,
                              "read_ahead": "adaptive" if args.prefetch is None
                              else "off" if args.prefetch == 0 else "fixed",
                              "chunk_bytes": args.chunk_mb * MIB, "scram": args.scram,
                              "tree": None if args.tree is None else str(args.tree),
                              "confluent_partition_fetch_bytes": (
                                  None if args.fetch_kb is None else args.fetch_kb * 1024)}
    _template_bytes, expected_values = _template(7)
    try:
        with MotoServer() as moto:
            moto.create_bucket(BUCKET)
            progress(f"writing {args.size_mb} MiB in {args.segment_mb} MiB segments")
            closed, end = write_log(work / "logs", args.size_mb * MIB, args.segment_mb * MIB)
            kafka_port = free_port()
            for name, keep in (("tiered.toml", False), ("tiered-keep.toml", True)):
                (work / name).write_text(config_text(
                    work, moto.endpoint, kafka_port, args.prefetch, args.chunk_mb * MIB,
                    cache_dir, scram=args.scram, keep=keep))
            config = parse_config(tomllib.loads((work / "tiered.toml").read_text()),
                                  source="benchmark", base_dir=work)
            progress("archiving it")
            segment_keys = archive_everything(config)
            if args.scram:
                use_scram(config)
            archived_end = max(h.next_offset for h in iter_batches(closed[-1].read_bytes()))
            archived_bytes = sum(size for _key, size in segment_keys)
            for path in closed:  # local retention: only the bucket holds them now
                for suffix in (".log", ".index", ".timeindex"):
                    path.with_suffix(suffix).unlink(missing_ok=True)
            report["archived_bytes"] = archived_bytes
            report["segments"] = len(segment_keys)

            fetch_bytes = None if args.fetch_kb is None else args.fetch_kb * 1024
            rounds = [one_round(i, args, work, moto, kafka_port, cache_dir, segment_keys,
                                archived_bytes, archived_end, fetch_bytes, expected_values)
                      for i in range(args.rounds)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(cache_dir, ignore_errors=True)
    for name in ("boto3", "confluent_cold", "confluent_cold_capped", "confluent_warm",
                 "kafka_python"):
        runs = [r[name] for r in rounds]
        report[name] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    report["ratios"] = {  # median over the rounds of each round's ratio to its own baseline
        name: round(statistics.median(r[name]["mb_per_s"] / r["boto3"]["mb_per_s"]
                                      for r in rounds), 3)
        for name in ("confluent_cold", "confluent_cold_capped", "confluent_warm",
                     "kafka_python")}
    report["rounds"] = rounds
    report["goal"] = "confluent_cold / boto3 >= 0.5"
    report["versions"] = versions("boto3", "moto", "confluent-kafka", "kafka-python", "kio")
    return report


def one_round(i: int, args: argparse.Namespace, work: Path, moto: MotoServer, kafka_port: int,
              cache_dir: Path, segment_keys: list[tuple[str, int]], archived_bytes: int,
              archived_end: int, fetch_bytes: int | None, expected_values: list[bytes]
              ) -> dict[str, Any]:
    """The baseline; a daemon at the default cache settings read once by confluent-kafka; then
    a daemon keeping every chunk, read twice by confluent-kafka and once (its first
    `--kafka-python-mb`) by kafka-python."""
    out: dict[str, Any] = {}
    progress(f"round {i + 1}: boto3, every segment object, one streamed GET each")
    client = moto.client()
    settle_heap()
    start = time.perf_counter()
    got = 0
    for key, _size in segment_keys:
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"]
        got += sum(len(piece) for piece in body.iter_chunks(MIB))
    boto3_s = time.perf_counter() - start
    client.close()
    if got != archived_bytes:
        raise SystemExit("boto3 read a different size")
    out["boto3"] = {"mb_per_s": round(got / boto3_s / MB, 1), "seconds": round(boto3_s, 2)}
    for config, names in (("tiered.toml", ("confluent_cold",)),
                          ("tiered-keep.toml", ("confluent_cold_capped", "confluent_warm"))):
        shutil.rmtree(cache_dir, ignore_errors=True)  # every daemon starts cold
        cache_dir.mkdir()
        daemon = DaemonProcess(work / config, work / f"daemon-{i}-{config}.log",
                               kafka_listening(kafka_port), tree=args.tree)
        try:
            daemon.settle()
            for name in names:
                progress(f"round {i + 1}: {name}, every archived offset")
                out[name] = _confluent_run(daemon, kafka_port, archived_end, archived_bytes,
                                           fetch_bytes, expected_values)
            if config == "tiered.toml":
                continue
            kp_end = min(archived_end, args.kafka_python_mb * MIB // (
                RECORDS_PER_BATCH * RECORD_BYTES) * RECORDS_PER_BATCH)
            kp_bytes = archived_bytes * kp_end // archived_end
            progress(f"round {i + 1}: kafka-python, the first {kp_bytes // MIB} MiB (warm)")
            cpu0 = daemon.cpu_s()
            count, took, values = kafka_python_read(kafka_port, kp_end)
            cpu = daemon.cpu_s() - cpu0
            check(values[:kp_end], expected_values)
            out["kafka_python"] = {"mb_per_s": round(kp_bytes / took / MB, 1),
                                   "seconds": round(took, 2), "bytes": kp_bytes,
                                   "daemon_cpu_s_per_mb": round(cpu / (kp_bytes / MB), 4)}
        finally:
            daemon.stop()
    return out


def _confluent_run(daemon: DaemonProcess, kafka_port: int, archived_end: int,
                   archived_bytes: int, fetch_bytes: int | None, expected_values: list[bytes]
                   ) -> dict[str, Any]:
    """One confluent-kafka read of every archived offset, checked, with the daemon's CPU."""
    cpu0 = daemon.cpu_s()
    got0 = daemon.metric("tiered_cache_downloaded_bytes_total")
    count, took, values, startup = confluent_read(kafka_port, archived_end, fetch_bytes)
    cpu = daemon.cpu_s() - cpu0
    downloaded = daemon.metric("tiered_cache_downloaded_bytes_total") - got0
    check(values, expected_values)
    return {"mb_per_s": round(archived_bytes / took / MB, 1),
            "seconds": round(took, 2), "messages": count,
            "first_message_s": round(startup, 2),
            "store_bytes_downloaded": int(downloaded),
            "daemon_cpu_s_per_mb": round(cpu / (archived_bytes / MB), 4)}


def main(argv: list[str] | None = None) -> int:
    emit(run(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
