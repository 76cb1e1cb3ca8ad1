"""Adjacent-segment merge throughput: Spark `local[1]` and `local[2]` against a single-process
Python merge of the same data, in one run; and planning time for a 1,000,000-segment manifest.

Seeds a `file://` bucket (in a temporary directory) with `--partitions` partitions of
`--segments` small segments each (`--segment-kb` KiB of incompressible records, uploaded with
their indexes and committed to the head manifests as the archiver would), then merges a fresh
copy of that bucket with each contender:

    python_single   `run_merge` with `execute_locally`: the same planning, executor function
                    (`merge_run`) and compare-and-swap commits, one run after another in this
                    process, no Spark: the baseline
    spark_local1    `run_merge` on a Spark session with master `local[1]`
    spark_local2    `run_merge` on `local[2]`

Throughput is the bytes of the merged-away segments over the wall time of the whole merge
(planning, downloads, CRC checks, index rebuilds, uploads, commits), in MB/s (10**6 bytes),
best and median of `--repeat` merges; the ratios compare best against best.
Spark sessions are started (and one job run that imports the job's modules in the Python
workers) before the clock starts: a session costs about 4 s once per process, not per
merge. `file://` keeps the bucket out of the measurement; against S3 the executors' network
time dominates instead.

    python benchmarks/merge.py                          # 4 x 1000 segments of 32 KiB
    python benchmarks/merge.py --segments 250 --plan-segments 100000
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
from array import array
from pathlib import Path
from typing import Any

import crc32c
from _common import MB, Stopwatch, emit, mb_per_s, progress, versions

from manifests import ManifestSettings, ManifestStore, SegmentMeta, SegmentTable, edits, keys
from manifests.topic import TopicManifest, save_topic_manifest
from spark_jobs.job_context import JobContext
from spark_jobs.merge import execute_locally, run_merge
from spark_jobs.merge_plan import MergeLimits, plan_runs
from tiered.config import Config, parse_config
from tiered.kafka.builder import encode_batch
from tiered.kafka.records import Record, iter_batch_headers
from tiered.kafka.segment import build_indexes
from tiered.store import open_store

TOPIC, REVISION = "bench", "1"
RECORD_BYTES = 1024


def seed_bucket(config: Config, partitions: int, segments: int,
                segment_bytes: int) -> int:
    """Upload the small segments and commit the manifests; returns the segment bytes."""
    store = open_store(config.store_settings())
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    save_topic_manifest(store, TopicManifest(TOPIC, REVISION, partitions,
                                             segment_bytes=segment_bytes))
    rng = random.Random(7)
    pool = rng.randbytes(4 * 1024 * 1024)
    records_per_segment = max(1, segment_bytes // (RECORD_BYTES + 64))
    total = 0
    for p in range(partitions):
        m, etag = mstore.load(TOPIC, p, REVISION)
        m = edits.with_term(m, 1)
        metas = []
        off = 0
        for _ in range(segments):
            out = bytearray()
            for _ in range(records_per_segment // 4 or 1):  # batches of 4 records
                recs: list[Record] = []
                for _ in range(4):
                    start = rng.randrange(len(pool) - RECORD_BYTES)
                    recs.append(Record(off + len(recs), 1_700_000_000_000 + off, None,
                                       pool[start:start + RECORD_BYTES]))
                out += encode_batch(recs, base_offset=off, partition_leader_epoch=1)
                off += len(recs)
            data = bytes(out)
            headers = list(iter_batch_headers(data))
            meta = SegmentMeta(headers[0].base_offset, headers[-1].last_offset,
                               headers[0].first_timestamp,
                               max(h.max_timestamp for h in headers), len(data), 1, 1,
                               crc32c.crc32c(data))
            index, timeindex = build_indexes(data, base_offset=meta.base_offset)
            for kind, blob in (("index", index), ("timeindex", timeindex)):
                store.put(keys.object_key(TOPIC, p, REVISION,
                                          keys.index_name(meta.object_name, kind)), blob)
            store.put(m.segment_key(meta), data)
            metas.append(meta)
            total += len(data)
        mstore.commit(edits.add_segments(m, metas), etag)
    store.close()
    return total


def make_config(bucket: Path, target_bytes: int, min_bytes: int) -> Config:
    return parse_config({
        "storage": {"url": bucket.as_uri()},
        "cluster": {
            "cloud_storage_segment_size_target": target_bytes,
            "cloud_storage_segment_size_min": min_bytes,
            # keep every segment in the head manifest: only head segments are merged
            "cloud_storage_spillover_manifest_size": 256 * 1024 * 1024,
        },
    }, source="benchmark")


def warm_up(_: int) -> None:
    """Import what a merge task imports (boto3 included), in a Spark worker."""
    import spark_jobs.merge  # noqa: F401


def stop_active_session() -> None:
    """Stop the process's Spark session so the next one starts with another master."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def merge_once(name: str, base: Path, work: Path, config_for: Any) -> tuple[float, int, int]:
    """One merge of a fresh copy of the seeded bucket: (seconds, bytes merged, runs)."""
    bucket = work / name
    shutil.copytree(base, bucket)
    master = {"spark_local1": "local[1]", "spark_local2": "local[2]"}.get(name)
    ctx = JobContext.from_config(config_for(bucket), master=master, app_name=f"bench-{name}")
    try:
        if master is None:
            with Stopwatch() as sw:
                summary = run_merge(ctx, topic=TOPIC, execute=execute_locally)
        else:
            # start the session and its Python workers, with the job's modules imported, so
            # the clock measures merging rather than JVM and interpreter start-up
            ctx.sc.parallelize(range(8), 8).foreach(warm_up)
            with Stopwatch() as sw:
                summary = run_merge(ctx, topic=TOPIC)
        if not summary["ok"]:
            raise SystemExit(f"{name}: {summary['errors']}")
    finally:
        ctx.close()
        shutil.rmtree(bucket, ignore_errors=True)
    return sw.seconds, summary["bytes_read"], summary["runs_committed"]


def contender(name: str, base: Path, work: Path, config_for: Any, repeat: int) -> dict[str, Any]:
    """`repeat` merges; the best and the median time (the machine may be shared)."""
    if name != "python_single":
        stop_active_session()  # the next session gets this contender's master
    times, moved, runs = [], 0, 0
    for _ in range(repeat):
        seconds, moved, runs = merge_once(name, base, work, config_for)
        times.append(seconds)
    best, median = min(times), statistics.median(times)
    return {"seconds": [round(t, 3) for t in times], "bytes_merged": moved, "runs": runs,
            "mb_per_s_best": mb_per_s(moved, best), "mb_per_s_median": mb_per_s(moved, median)}


def planning(segments: int) -> dict[str, Any]:
    """Time `plan_runs` over a synthetic head of `segments` rows: mostly small segments with
    a large one every 50 and a term change every 10,000."""
    rng = random.Random(3)
    sizes = array("q", (50 * MB if i % 50 == 49 else rng.randrange(1, 100) * 1024 * 1024
                        for i in range(segments)))
    base = array("q", range(0, segments * 100, 100))
    last = array("q", (b + 99 for b in base))
    ts = array("q", range(segments))
    terms = array("q", (1 + i // 10_000 for i in range(segments)))
    zeros = array("q", bytes(8 * segments))
    table = SegmentTable([base, last, ts, ts, sizes, terms, terms, zeros, zeros])
    limits = MergeLimits(target_bytes=512 * 1024 * 1024, min_bytes=256 * 1024 * 1024)
    with Stopwatch() as sw:
        plan = plan_runs(table, limits)
    return {"segments": segments, "seconds": round(sw.seconds, 3), "runs": len(plan.runs),
            "segments_per_s": round(segments / sw.seconds) if sw.seconds else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--segments", type=int, default=1000, help="small segments per partition")
    ap.add_argument("--segment-kb", type=int, default=32, help="size of each small segment")
    ap.add_argument("--target-kb", type=int, default=1024, help="merged segment target")
    ap.add_argument("--repeat", type=int, default=3, help="merges per contender")
    ap.add_argument("--plan-segments", type=int, default=1_000_000,
                    help="rows of the synthetic manifest whose planning is timed")
    args = ap.parse_args(argv)
    target, minimum = args.target_kb * 1024, args.target_kb * 512

    with tempfile.TemporaryDirectory(prefix="tiered-bench-merge-") as tmp:
        work = Path(tmp)
        base = work / "seeded"

        def config_for(bucket: Path) -> Config:
            return make_config(bucket, target, minimum)

        progress(f"seeding {args.partitions} x {args.segments} segments of "
                 f"{args.segment_kb} KiB")
        seeded = seed_bucket(config_for(base), args.partitions, args.segments,
                             args.segment_kb * 1024)
        results = {}
        for name in ("python_single", "spark_local1", "spark_local2"):
            progress(f"running {name}")
            results[name] = contender(name, base, work, config_for, args.repeat)
    progress(f"planning {args.plan_segments} segments")
    plan = planning(args.plan_segments)
    py = results["python_single"]["mb_per_s_best"] or 0
    report = {
        "benchmark": "merge",
        "versions": versions("tiered", "pyspark"),
        "store": "file://",
        "data": {"partitions": args.partitions, "segments": args.partitions * args.segments,
                 "segment_bytes_total": seeded, "target_bytes": target, "min_bytes": minimum},
        "contenders": results,
        "ratios": {
            name: round((results[name]["mb_per_s_best"] or 0) / py, 2) if py else None
            for name in ("spark_local1", "spark_local2")
        },
        "planning": plan,
    }
    emit(report)


if __name__ == "__main__":
    main()
