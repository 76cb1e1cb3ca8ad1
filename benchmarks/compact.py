"""Compaction of a compacted partition's history on Spark against moto's S3 server, in one run:

    compaction      `run_compact` on `--master` (default `local[2]`) in a child process (the
                    driver's peak RSS is that process's), while a thread beside it commits new
                    segments to the same partition as a daemon would
    boto3_io        one boto3 client GETting every input object and PUTting the bytes the
                    compaction wrote: the I/O floor the job's MB/s is compared with

Seeds one partition of `--size-mb` MiB (`--keys` distinct keys, `--tombstones` of the records
tombstones, `--segment-mb` segments), committed as the archiver does. Reports compaction MB/s
(input bytes over the job's wall time, Spark session start excluded), the ratio to boto3_io,
bytes before/after, records and tombstones dropped, the driver's peak RSS, and the losses: every
record the reference (the latest per key, computed here, outside the driver) keeps and every
record the daemon thread committed must read back from the bucket; `losses` counts those
missing (0 expected), `extra` superseded records still there.

    python benchmarks/compact.py                                  # 256 MiB, 1M keys
    python benchmarks/compact.py --size-mb 24 --keys 100000       # a short run
    python benchmarks/compact.py --size-mb 64 --keys 10000000 --executor-memory 1g   # memory
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import crc32c
from _common import MIB, MotoServer, Stopwatch, emit, mb_per_s, progress, versions

from manifests import ManifestSettings, ManifestStore, SegmentMeta, edits, keys
from manifests.topic import TopicManifest, save_topic_manifest
from tiered.config import Config, parse_config
from tiered.kafka.builder import encode_batch
from tiered.kafka.records import Record, iter_batch_headers, iter_batches
from tiered.kafka.segment import build_indexes
from tiered.store import open_store

TOPIC, REVISION = "bench", "1"
T0 = 1_700_000_000_000
BUCKET = "compact-bench"
#: the store's key prefix inside the bucket (`[storage] url = s3://BUCKET/pfx`)
PREFIX = "pfx/"
RECORDS_PER_BATCH = 50


def make_config(endpoint: str, segment_bytes: int) -> Config:
    return parse_config({
        "storage": {"url": f"s3://{BUCKET}/{PREFIX.rstrip('/')}", "endpoint_url": endpoint,
                    "region": "us-east-1", "access_key": "testing", "secret_key": "testing"},
        "cluster": {"cloud_storage_segment_size_target": segment_bytes},
        "topics": {TOPIC: {"cleanup.policy": "compact"}},
    }, source="benchmark")


def _segment_meta(data: bytes, term: int) -> SegmentMeta:
    heads = list(iter_batch_headers(data))
    return SegmentMeta(heads[0].base_offset, heads[-1].last_offset, heads[0].first_timestamp,
                       max(h.max_timestamp for h in heads), len(data), 1, term,
                       crc32c.crc32c(data))


def upload(mstore: ManifestStore, blobs: list[bytes], *, term: int = 1) -> None:
    """Segments with their indexes, then the manifest by compare-and-swap (retried)."""
    metas = []
    for data in blobs:
        meta = _segment_meta(data, term)
        index, timeindex = build_indexes(data, base_offset=meta.base_offset)
        for kind, blob in (("index", index), ("timeindex", timeindex)):
            mstore.store.put(keys.object_key(TOPIC, 0, REVISION,
                                             keys.index_name(meta.object_name, kind)), blob)
        mstore.store.put(keys.object_key(TOPIC, 0, REVISION, meta.object_name), data)
        metas.append(meta)
    mstore.update(TOPIC, 0, REVISION,
                  lambda m: edits.add_segments(edits.with_term(m, max(term, m.term)), metas))


def seed(config: Config, size: int, key_count: int, tombstones: float,
         segment_bytes: int) -> tuple[int, int]:
    """The partition's segments; returns (bytes, last offset). Record i's key and value are a
    function of i (`record_at`), so the reference is recomputed without keeping the log."""
    store = open_store(config.store_settings())
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    save_topic_manifest(store, TopicManifest(TOPIC, REVISION, 1, cleanup_policy="compact",
                                             segment_bytes=segment_bytes))
    total = off = 0
    pending: list[bytes] = []
    seg = bytearray()
    while total + len(seg) < size:
        recs = [record_at(off + i, key_count, tombstones) for i in range(RECORDS_PER_BATCH)]
        seg += encode_batch(recs, base_offset=off)
        off += RECORDS_PER_BATCH
        if len(seg) >= segment_bytes:
            pending.append(bytes(seg))
            total += len(seg)
            seg = bytearray()
            if len(pending) == 4:
                upload(mstore, pending)
                pending = []
                progress(f"seeded {total / MIB:.0f} MiB")
    if seg:
        pending.append(bytes(seg))
        total += len(seg)
    if pending:
        upload(mstore, pending)
    store.close()
    return total, off - 1


def record_at(offset: int, key_count: int, tombstones: float) -> Record:
    rng = random.Random(offset)
    key = b"key-%08d" % rng.randrange(key_count)
    value = None if rng.random() < tombstones else rng.randbytes(64)
    return Record(offset, T0 + offset, key, value)


# -- the child: the driver being measured ----------------------------------------------------------


class ExecutorMemory:
    """Peak RSS of the executors while the job runs, sampled from /proc every `every_s`: the
    JVM (in `local[...]` the driver's, which is also the executor) and the largest Python
    worker, the processes below this one."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.peak_kib = {"jvm": 0, "python_worker": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> ExecutorMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(stat.parent.name)] = int(fields[1])
        mine = {os.getpid()}
        changed = True
        while changed:
            changed = False
            for pid, ppid in parents.items():
                if ppid in mine and pid not in mine:
                    mine.add(pid)
                    changed = True
        for pid in mine - {os.getpid()}:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            kind = ("jvm" if b"java" in cmdline.split(b"\0", 1)[0]
                    else "python_worker" if b"pyspark.worker" in cmdline else None)
            if kind is None:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    self.peak_kib[kind] = max(self.peak_kib[kind], int(line.split()[1]))

    def mib(self) -> dict[str, float]:
        return {k: round(v / 1024, 1) for k, v in self.peak_kib.items()}


def child(args: argparse.Namespace) -> None:
    """Runs in its own process: Spark session, the daemon thread, the compaction."""
    from spark_jobs.compact import run_compact
    from spark_jobs.job_context import JobContext
    from spark_jobs.session import get_session

    config = make_config(args.endpoint, args.segment_mb * MIB)
    # the session `tiered compact` builds, with the memory asked for
    get_session(args.master, app_name="compact-bench",
                conf={"spark.driver.memory": args.executor_memory,
                      "spark.executor.memory": args.executor_memory})
    ctx = JobContext.from_config(config)
    ctx.sc.parallelize(range(4), 2).map(lambda x: x).collect()  # workers up before the clock
    stop = threading.Event()
    appended: list[tuple[int, int]] = []

    def daemon() -> None:  # commits new segments beside the job, as the archiver would
        store = open_store(config.store_settings())
        mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
        while not stop.wait(1.0):
            m, _ = mstore.load(TOPIC, 0, REVISION)
            base = m.last_offset + 1
            recs = [Record(base + i, T0 + base + i, b"daemon-%d" % (base + i), b"x" * 32)
                    for i in range(100)]
            upload(mstore, [encode_batch(recs, base_offset=base)], term=m.term)
            appended.append((base, base + 99))
        store.close()

    thread = threading.Thread(target=daemon, name="daemon-beside")
    thread.start()
    try:
        with ExecutorMemory() as executors, Stopwatch() as sw:
            summary = run_compact(ctx, clock=lambda: (T0 + 10 * 86_400_000) / 1000)
    finally:
        stop.set()
        thread.join()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"summary": summary, "seconds": sw.seconds, "appended": appended,
                      "driver_peak_rss_mib": round(peak_kb / 1024, 1),
                      "executor_peak_rss_mib": executors.mib()}))


# -- the parent ------------------------------------------------------------------------------------


def boto3_io(moto: MotoServer, input_keys: list[str], output_keys: list[str]) -> dict[str, Any]:
    client = moto.client()
    blobs = [client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in output_keys]
    with Stopwatch() as sw:
        got = sum(len(client.get_object(Bucket=BUCKET, Key=k)["Body"].read())
                  for k in input_keys)
        for n, blob in enumerate(blobs):
            client.put_object(Bucket=BUCKET, Key=f"baseline/{n}", Body=blob)
    return {"seconds": round(sw.seconds, 6), "bytes_got": got,
            "bytes_put": sum(len(b) for b in blobs), "mb_per_s": mb_per_s(got, sw.seconds)}


def verify(config: Config, last_seeded: int, key_count: int, tombstones: float,
           appended: list[tuple[int, int]]) -> dict[str, int]:
    """Losses and leftovers against the reference (latest per key over the seeded log; every
    appended record)."""
    latest: dict[bytes, int] = {}
    for off in range(last_seeded + 1):
        latest[record_at(off, key_count, tombstones).key or b""] = off
    want = set(latest.values())
    del latest
    for lo, hi in appended:
        want.update(range(lo, hi + 1))
    store = open_store(config.store_settings())
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    m, _ = mstore.load(TOPIC, 0, REVISION)
    seen = 0
    extra = 0
    for seg in mstore.iter_segments(m):
        for batch in iter_batches(store.get(m.segment_key(seg))):
            for r in batch.records:
                if r.offset in want:
                    want.discard(r.offset)
                    seen += 1
                else:
                    extra += 1
    store.close()
    return {"losses": len(want), "records_read_back": seen, "extra": extra}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--tombstones", type=float, default=0.05)
    parser.add_argument("--segment-mb", type=int, default=16)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--executor-memory", default="1g")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    with MotoServer() as moto:
        moto.create_bucket(BUCKET)
        config = make_config(moto.endpoint, args.segment_mb * MIB)
        progress(f"seeding {args.size_mb} MiB, {args.keys} keys")
        size, last = seed(config, args.size_mb * MIB, args.keys, args.tombstones,
                          args.segment_mb * MIB)
        store = open_store(config.store_settings())
        mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
        before, _ = mstore.load(TOPIC, 0, REVISION)
        input_keys = [PREFIX + before.segment_key(s) for s in before.segments]
        progress("compacting")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                          env.get("PYTHONPATH")]))
        with tempfile.TemporaryFile() as out:
            proc = subprocess.run([sys.executable, __file__, "--child", "--endpoint",
                                   moto.endpoint, "--master", args.master, "--executor-memory",
                                   args.executor_memory, "--segment-mb", str(args.segment_mb)],
                                  stdout=out, env=env, check=False)
            out.seek(0)
            text = out.read().decode()
        if proc.returncode != 0:
            raise SystemExit(f"the compaction child failed ({proc.returncode})")
        run = json.loads(text.strip().splitlines()[-1])
        summary = run["summary"]
        after, _ = mstore.load(TOPIC, 0, REVISION)
        output_keys = [PREFIX + after.segment_key(s) for s in after.segments if s.compacted]
        store.close()
        progress("boto3 baseline")
        base = boto3_io(moto, input_keys, output_keys)
        progress("verifying against the reference")
        check = verify(config, last, args.keys, args.tombstones, run["appended"])
    compaction_mb_s = mb_per_s(size, run["seconds"])
    emit({
        "benchmark": "compact",
        "parameters": {"size_mib": args.size_mb, "keys": args.keys,
                       "tombstones": args.tombstones, "segment_mib": args.segment_mb,
                       "master": args.master, "executor_memory": args.executor_memory},
        "input_bytes": size,
        "compaction": {"seconds": round(run["seconds"], 3), "mb_per_s": compaction_mb_s,
                       "bytes_before": summary["before"]["bytes"],
                       "bytes_after": summary["after"]["bytes"],
                       "records_in": summary["records_in"],
                       "records_dropped": summary["records_dropped"],
                       "tombstones_dropped": summary["tombstones_dropped"],
                       "objects_written": summary["objects_written"],
                       "commit_conflicts": summary["commit_conflicts"],
                       "ok": summary["ok"], "errors": summary["errors"][:5],
                       "driver_peak_rss_mib": run["driver_peak_rss_mib"],
                       # sampled every 0.2 s: the JVM, and the largest Python worker
                       "executor_peak_rss_mib": run["executor_peak_rss_mib"]},
        "boto3_io": base,
        # from the unrounded rates: a short run's MB/s rounds to 0.0
        "ratio_vs_boto3_io": round((size / run["seconds"]) / (base["bytes_got"]
                                                               / base["seconds"]), 4)
        if run["seconds"] > 0 and base["seconds"] > 0 and base["bytes_got"] else None,
        "daemon_beside": {"segments_committed": len(run["appended"]), **check},
        "versions": versions("pyspark", "moto", "boto3"),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })


if __name__ == "__main__":
    main()
