"""Manifest scale: a partition with a long history (default 1,000,000 segments), tiered's
spillover manifests against a naive single-JSON manifest of the same history, in one run.

Each variant runs in its own child process (so peak memory is its own) over the same
deterministic history, against the file:// store (default) or moto's S3 server started as a
`moto_server` subprocess. A counting wrapper around the store counts GETs. Prints one JSON
object:

    head_bytes            size of the head manifest object at the end
    head_bytes_max        largest head committed while the history was built (tiered only)
    peak_rss_bytes        the child process's peak resident memory
    build_seconds         writing the history (tiered: commits of `--batch` segments each)
    commit_seconds        median time to commit one more segment at the end of the history
    cold_lookup           a random old offset with nothing in memory: load the head, find the
                          segment (seconds median / max, GETs max / mean)
    warm_lookup           the same offset again in the same process (head and caches warm)
    iteration             every segment from offset 0, in order (seconds, GETs)

    python benchmarks/manifest_scale.py                   # 1,000,000 segments, file store
    python benchmarks/manifest_scale.py --segments 20000  # smoke run
    python benchmarks/manifest_scale.py --store moto
"""

from __future__ import annotations

import argparse
import builtins
import json
import multiprocessing
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from manifests import edits
from manifests.commit import ManifestStore
from manifests.manifest import PartitionManifest
from manifests.model import SegmentMeta, SegmentTable
from manifests.serde import decode_partition_manifest, encode_partition_manifest
from manifests.spillover import ManifestSettings
from tiered.store import FileStore, S3Store, StoreSettings
from tiered.store.base import Blob, ObjectInfo, ObjectStore

TOPIC, PARTITION, REVISION = "orders", 0, "VlW-VOROSYi0AhRbbvnJ5g"
T0_MS = 1_700_000_000_000


class CountingStore(ObjectStore):
    """Delegates to a real store and counts requests by operation."""

    scheme = "counting"

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self.calls["put"] += 1
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: Path | str, *,
                 ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        self.calls["put"] += 1
        return self.inner.put_file(key, path, ready=ready, byte_range=byte_range)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        self.calls["get"] += 1
        return self.inner.get(key, byte_range)

    def head(self, key: str) -> ObjectInfo:
        self.calls["head"] += 1
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self.calls["list"] += 1
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        self.calls["delete"] += 1
        return self.inner.delete_many(keys)


def history(n: int, seed: int) -> Iterator[SegmentMeta]:
    """`n` contiguous segments shaped like a busy topic: 500..1500 offsets and about a
    minute each, ~1 MiB, random checksums, a leader change every 100,000 segments."""
    rng = random.Random(seed)
    base, ts = 0, T0_MS
    for i in range(n):
        count = rng.randint(500, 1500)
        term = 1 + i // 100_000
        span = rng.randint(50_000, 60_000)
        yield SegmentMeta(
            base,
            base + count - 1,
            ts,
            ts + span,
            (1 << 20) + rng.randint(-65536, 65536),
            term,
            term,
            rng.getrandbits(32),
        )
        base += count
        ts += span + rng.randint(0, 10_000)


def batches(items: Iterator[SegmentMeta], size: int) -> Iterator[list[SegmentMeta]]:
    batch: list[SegmentMeta] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def open_store(spec: dict[str, str]) -> CountingStore:
    if spec["kind"] == "file":
        return CountingStore(FileStore(StoreSettings(url=spec["url"])))
    settings = StoreSettings(
        url=spec["url"],
        endpoint_url=spec["endpoint"],
        region="us-east-1",
        access_key="testing",
        secret_key="testing",
    )
    return CountingStore(S3Store(settings))


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def summary(seconds: list[float], gets: list[int]) -> dict[str, Any]:
    return {
        "seconds_median": statistics.median(seconds),
        "seconds_max": max(seconds),
        "gets_max": max(gets),
        "gets_mean": statistics.fmean(gets),
    }


def old_offsets(m: PartitionManifest, k: int, seed: int) -> list[int]:
    """Random offsets in the oldest 90% of the history (archived, for tiered)."""
    rng = random.Random(seed + 1)
    return [rng.randrange(0, max(1, int(m.next_offset * 0.9))) for _ in range(k)]


def extra_segment(m: PartitionManifest, i: int) -> list[SegmentMeta]:
    ts = T0_MS + 10**12 + i
    return [SegmentMeta(m.next_offset, m.next_offset + 99, ts, ts, 1 << 20, m.term, m.term, i)]


def run_tiered(spec: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    store = open_store(spec)
    settings = ManifestSettings(spillover_size=args.spillover_size)
    writer = ManifestStore(store, settings)
    m, etag = writer.load(TOPIC, PARTITION, REVISION)
    head_max = 0
    started = time.perf_counter()
    for batch in batches(history(args.segments, args.seed), args.batch):
        m = edits.with_term(m, batch[-1].writer_term)
        result = writer.commit(edits.add_segments(m, batch), etag)
        m, etag = result.manifest, result.etag
        head_max = max(head_max, len(encode_partition_manifest(m)))
    build = time.perf_counter() - started
    commit_times = []
    for i in range(args.commits):
        started = time.perf_counter()
        result = writer.commit(edits.add_segments(m, extra_segment(m, i)), etag)
        commit_times.append(time.perf_counter() - started)
        m, etag = result.manifest, result.etag
    cold_s, cold_gets, warm_s, warm_gets, archive_gets = [], [], [], [], []
    for offset in old_offsets(m, args.lookups, args.seed):
        reader = ManifestStore(store, settings)
        before = store.calls["get"]
        started = time.perf_counter()
        head, _ = reader.load(TOPIC, PARTITION, REVISION)
        seg = reader.find_offset(head, offset)
        cold_s.append(time.perf_counter() - started)
        cold_gets.append(store.calls["get"] - before)
        archive_gets.append(reader.stats.archive_reads)
        before = store.calls["get"]
        started = time.perf_counter()
        again = reader.find_offset(head, offset)
        warm_s.append(time.perf_counter() - started)
        warm_gets.append(store.calls["get"] - before)
        assert again == seg and seg.base_offset <= offset <= seg.last_offset
    reader = ManifestStore(store, settings)
    before = store.calls["get"]
    started = time.perf_counter()
    count = sum(1 for _ in reader.iter_segments(m, 0))
    iteration = time.perf_counter() - started
    assert count == args.segments + args.commits, count
    levels = Counter(m.archives.column("level").tolist())
    return {
        "head_bytes": len(encode_partition_manifest(m)),
        "head_bytes_max": head_max,
        "head_bound_bytes": 2 * args.spillover_size,
        "head_within_bound": head_max <= 2 * args.spillover_size,
        "head_segments": len(m.segments),
        "archive_entries_by_level": {str(k): v for k, v in sorted(levels.items())},
        "peak_rss_bytes": peak_rss(),
        "build_seconds": build,
        "commit_seconds": statistics.median(commit_times),
        "cold_lookup": {**summary(cold_s, cold_gets), "archive_gets_max": max(archive_gets)},
        "warm_lookup": summary(warm_s, warm_gets),
        "iteration": {"seconds": iteration, "gets": store.calls["get"] - before},
    }


def run_naive(spec: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """One JSON object holding every segment (same codec, no spillover), CAS-written."""
    store = open_store(spec)
    key = PartitionManifest.new(TOPIC, PARTITION, REVISION).key
    started = time.perf_counter()
    segs = SegmentTable.from_rows(history(args.segments, args.seed))
    m = PartitionManifest.new(TOPIC, PARTITION, REVISION, term=segs.column("writer_term")[-1])
    m = m.evolve(
        segments=segs,
        start_offset=0,
        last_offset=segs.last_last(),
        cloud_bytes=segs.total("size_bytes"),
    )
    etag = store.put(key, encode_partition_manifest(m), if_none_match=True)
    build = time.perf_counter() - started
    commit_times = []
    for i in range(args.naive_commits):
        started = time.perf_counter()
        m = edits.add_segments(m, extra_segment(m, i)).evolve(sequence=m.sequence + 1)
        etag = store.put(key, encode_partition_manifest(m), if_match=etag)
        commit_times.append(time.perf_counter() - started)
    head_bytes = store.head(key).size
    cold_s, cold_gets, warm_s, warm_gets = [], [], [], []
    for offset in old_offsets(m, args.naive_lookups, args.seed):
        before = store.calls["get"]
        started = time.perf_counter()
        loaded = decode_partition_manifest(store.get(key), key=key)
        seg = edits.find_offset(loaded, offset)
        cold_s.append(time.perf_counter() - started)
        cold_gets.append(store.calls["get"] - before)
        before = store.calls["get"]
        started = time.perf_counter()
        again = edits.find_offset(loaded, offset)
        warm_s.append(time.perf_counter() - started)
        warm_gets.append(store.calls["get"] - before)
        assert again == seg
        del loaded
    before = store.calls["get"]
    started = time.perf_counter()
    loaded = decode_partition_manifest(store.get(key), key=key)
    count = sum(1 for _ in loaded.segments)
    iteration = time.perf_counter() - started
    assert count == args.segments + args.naive_commits
    return {
        "head_bytes": head_bytes,
        "peak_rss_bytes": peak_rss(),
        "build_seconds": build,
        "commit_seconds": statistics.median(commit_times),
        "cold_lookup": summary(cold_s, cold_gets),
        "warm_lookup": summary(warm_s, warm_gets),
        "iteration": {"seconds": iteration, "gets": store.calls["get"] - before},
    }


VARIANTS = {"tiered": run_tiered, "naive": run_naive}


def _child(name: str, spec: dict[str, str], args: argparse.Namespace, queue: Any) -> None:
    try:
        queue.put((name, VARIANTS[name](spec, args), None))
    except BaseException as exc:  # report, do not hang the parent
        queue.put((name, None, f"{type(exc).__name__}: {exc}"))


def run_variant(name: str, spec: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, spec, args, queue))
    proc.start()
    _, result, error = queue.get()
    proc.join()
    if error:
        raise SystemExit(f"{name} failed: {error}")
    return result  # type: ignore[no-any-return]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto_server did not start")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000, help="segments per tiered commit")
    parser.add_argument("--spillover-size", type=int, default=64 * 1024)
    parser.add_argument("--store", choices=("file", "moto"), default="file")
    parser.add_argument("--lookups", type=int, default=50)
    parser.add_argument("--naive-lookups", type=int, default=5)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--naive-commits", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--variants", default="tiered,naive")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="manifest-scale-"))
    moto: subprocess.Popen[bytes] | None = None
    results: dict[str, Any] = {}
    try:
        for name in args.variants.split(","):
            if args.store == "file":
                spec = {"kind": "file", "url": f"file://{workdir}/{name}"}
            else:
                if moto is None:
                    moto, endpoint = start_moto()
                    import boto3

                    boto3.client(
                        "s3",
                        endpoint_url=endpoint,
                        region_name="us-east-1",
                        aws_access_key_id="testing",
                        aws_secret_access_key="testing",
                    ).create_bucket(Bucket="bench")
                spec = {"kind": "s3", "url": f"s3://bench/{name}", "endpoint": endpoint}
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results[name] = run_variant(name, spec, args)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    out = {
        "benchmark": "manifest_scale",
        "segments": args.segments,
        "spillover_size": args.spillover_size,
        "batch": args.batch,
        "store": args.store,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        **results,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
