"""Remote read: what a consumer of old data pays with tiered's chunked cache, against the
alternatives, over a real S3 endpoint (moto_server, a child process on 127.0.0.1).

One segment of `--size-mb` MiB (default 1024) of incompressible 64 KiB record batches is
written with `LogWriter`, archived into the bucket by the real archiver, and read back:

* cold 1 MiB fetch at random offsets (empty cache each time): latency and bytes downloaded
  - `tiered_chunks`: `Reader.fetch` through the chunk cache (`--chunk-mb`, default 16 MiB);
  - `whole_segment`: the same with `cloud_storage_disable_chunk_reads` (whole-object GET);
  - `fsspec_blockcache`: `fsspec.caching.BlockCache` (same block size) fed by boto3 ranged
    GETs, positioned with the same index object (downloaded and counted too);
  bytes are split into segment bytes and metadata (manifests, index, listing);
* warm fetch: the same 1 MiB again from the cache (`capped` eviction keeps the chunks),
  against `Reader.fetch` from the local log and a bare `os.pread` of those bytes;
* sequential consumer: one consumer session reads `--sequential-mb` from offset 0 in 1 MiB
  fetches, without read-ahead (`cloud_storage_chunk_prefetch = 0`), with a fixed window
  (`= --prefetch`) and at the default (the key not set: the adaptive window), optionally thinking
  `--think-ms` per fetch: total time, throughput, and the fetches that waited on a download.

`python benchmarks/remote_read.py http` measures the same through a real `tiered run` and its
HTTP endpoint instead, against raw boto3 and a trivial HTTP server (see remote_read_http.py).
`python benchmarks/remote_read.py ab --a TREE --b TREE` runs two versions of the daemon side by
side on its single-segment figure (see remote_read_ab.py).

Every fetched byte is compared with the local file (outside the timed sections). Prints one
JSON object; progress goes to stderr. Latencies are milliseconds, throughputs MB/s (10**6).
"""

from __future__ import annotations

import argparse
import builtins
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from _common import MIB, MotoServer, emit, mb_per_s, progress, versions

from archiver.service import Archiver
from archiver.space import DiskInfo
from cache.reader import Reader
from manifests import segment_indexes
from tiered.config import Config, parse_config
from tiered.kafka.builder import encode_batch
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.index import OffsetIndex
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, write_high_watermarks
from tiered.kafka.records import Record
from tiered.kafka.segment import Segment
from tiered.store import S3Store
from tiered.store.base import (
    Blob,
    CountedStream,
    ObjectInfo,
    ObjectStore,
    RangeStream,
    StoreSettings,
)

TOPIC = "bench"
BUCKET = "remote-read-bench"
RECORDS_PER_BATCH = 16
RECORD_BYTES = 4096


def _settled(store: CountingStore, quiet_s: float = 0.2) -> int:
    """`store.segment_bytes` once no download has moved it for `quiet_s`."""
    last = store.segment_bytes
    quiet_since = time.perf_counter()
    while time.perf_counter() - quiet_since < quiet_s:
        time.sleep(0.01)
        now = store.segment_bytes
        if now != last:
            last, quiet_since = now, time.perf_counter()
    return last


class CountingStore(ObjectStore):
    """Delegates to the S3 store and counts bytes read, split by object kind."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self.segment_bytes = 0
        self.metadata_bytes = 0
        self.requests = 0

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        data = self.inner.get(key, byte_range)
        self.requests += 1
        if key.endswith(".log"):
            self.segment_bytes += len(data)
        else:
            self.metadata_bytes += len(data)
        return data

    def open_range(self, key: str, begin: int, end: int, *, to_end: bool = False
                   ) -> RangeStream:
        self.requests += 1
        def count(n: int) -> None:
            self.segment_bytes += n

        return CountedStream(self.inner.open_range(key, begin, end, to_end=to_end), count)

    def head(self, key: str) -> ObjectInfo:
        self.requests += 1
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self.requests += 1
        return self.inner.list(prefix)

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: Path | str, *,
                 ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        return self.inner.put_file(key, path, ready=ready, byte_range=byte_range)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return self.inner.delete_many(keys)

    def close(self) -> None:
        self.inner.close()


def make_config(work: Path, endpoint: str, cache: Path, **cluster: Any) -> Config:
    data = {
        "storage": {"url": f"s3://{BUCKET}", "endpoint_url": endpoint, "region": "us-east-1",
                    "access_key": "testing", "secret_key": "testing"},
        "log": {"dirs": [str(work / "logs")], "retention": "advise"},
        "cache": {"dir": str(cache)},
        "cluster": {"storage_min_free_bytes": 0, "cloud_storage_cache_size": 64 * 1024 * MIB,
                    **cluster},
    }
    return parse_config(data, source="benchmark", base_dir=work)


def write_segment(log_dir: Path, size: int) -> tuple[Path, int]:
    """One closed segment of about `size` bytes; returns its path and the log end offset.
    One batch is encoded and copied with new base offsets (the CRC does not cover them)."""
    rng = random.Random(7)
    records = [Record(i, 1_700_000_000_000 + i, None, rng.randbytes(RECORD_BYTES))
               for i in range(RECORDS_PER_BATCH)]
    template = bytearray(encode_batch(records, base_offset=0))
    writer = LogWriter(log_dir / f"{TOPIC}-0", segment_bytes=(1 << 31) - 1, fsync=False,
                       topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC))
    with writer:
        while writer.log_end_offset // RECORDS_PER_BATCH * len(template) < size:
            template[:8] = writer.log_end_offset.to_bytes(8, "big")
            writer.append_batches(bytes(template))
        path = log_dir / f"{TOPIC}-0" / "00000000000000000000.log"
        writer.roll()
        end = writer.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(TOPIC, 0): end}, fsync=False)
    return path, end


def archive(config: Config, store: ObjectStore) -> None:
    archiver = Archiver(config, store, disk_usage=lambda _p: DiskInfo(1 << 40, 1 << 39))
    try:
        report = archiver.upload_round()
        if not report.ok or not any(r.uploaded_segments for r in report.partitions):
            raise SystemExit(f"archiving failed: {report.errors or report.partitions}")
    finally:
        archiver.close()


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"median_ms": ms(statistics.median(ordered)), "min_ms": ms(ordered[0]),
            "max_ms": ms(ordered[-1])}


class Bench:
    """The contenders over one segment: `segment_path` (the local file, also the truth every
    read is compared with) holding offsets [0, end), archived at `segment_key`."""

    def __init__(self, args: argparse.Namespace, work: Path, moto: MotoServer,
                 segment_path: Path, end: int) -> None:
        self.args = args
        self.work = work
        self.segment_path = segment_path
        self.end = end
        self.segment_size = segment_path.stat().st_size
        self.index = OffsetIndex.read(segment_path.with_suffix(".index"))
        self.batch_size = next(Segment.from_log_path(segment_path).iter_batch_headers()).size
        self.segment_key = ""
        self.endpoint = moto.endpoint
        self.settings = StoreSettings(url=f"s3://{BUCKET}", endpoint_url=moto.endpoint,
                                      region="us-east-1", access_key="testing",
                                      secret_key="testing")
        self.chunk = args.chunk_mb * MIB
        self.fetch_bytes = args.fetch_kb * 1024
        self._caches = 0

    def config(self, **cluster: Any) -> Config:
        self._caches += 1
        cache = self.work / f"cache-{self._caches}"
        return make_config(self.work, self.endpoint, cache,
                           cloud_storage_cache_chunk_size=self.chunk, **cluster)

    def reader(self, config: Config, *, local: bool = False) -> tuple[Reader, CountingStore]:
        store = CountingStore(S3Store(self.settings))
        log = LocalLog(config.log_dirs) if local else None
        return Reader(config, store, local_log=log), store

    def check(self, data: bytes, position: int) -> None:
        with open(self.segment_path, "rb") as f:
            if os.pread(f.fileno(), len(data), position) != data:
                raise SystemExit(f"bytes read back differ from the local file at {position}")

    def position(self, offset: int) -> int:
        """Byte position of the batch holding `offset` (every batch has the same size)."""
        return offset // RECORDS_PER_BATCH * self.batch_size

    # -- contenders ---------------------------------------------------------------------------

    def cold_reader(self, offsets: list[int], **cluster: Any) -> dict[str, Any]:
        runs = []
        for offset in offsets:
            config = self.config(**cluster)
            reader, store = self.reader(config)
            with reader, store:
                start = time.perf_counter()
                got = reader.fetch(TOPIC, 0, offset, self.fetch_bytes)
                took = time.perf_counter() - start
            self.check(got.data, self.position(got.offset))
            runs.append({"offset": offset, "ms": ms(took), "segment_bytes": store.segment_bytes,
                         "metadata_bytes": store.metadata_bytes, "requests": store.requests,
                         "returned_bytes": len(got.data)})
            shutil.rmtree(config.cache_dir, ignore_errors=True)
        return self._cold_summary(runs)

    def cold_fsspec(self, offsets: list[int]) -> dict[str, Any]:
        from fsspec.caching import BlockCache

        client = S3Store(self.settings)
        runs = []
        for offset in offsets:
            counted = {"segment": 0, "metadata": 0, "requests": 0}

            def fetcher(start: int, end: int, counted: dict[str, int] = counted) -> bytes:
                data = client.get(self.segment_key, byte_range=(start, end))
                counted["segment"] += len(data)
                counted["requests"] += 1
                return data

            start = time.perf_counter()
            index_key = self.segment_key.removesuffix(".log") + ".indexes"
            raw = client.get(index_key)
            counted["metadata"] += len(raw)
            index = segment_indexes.decode_bundle(raw, path=index_key)["index"]
            position = OffsetIndex.from_bytes(index, base_offset=0).lookup(offset).position
            cache = BlockCache(self.chunk, fetcher, self.segment_size)
            data = cache._fetch(position, min(self.segment_size, position + self.fetch_bytes))
            took = time.perf_counter() - start
            self.check(data, position)
            runs.append({"offset": offset, "ms": ms(took), "segment_bytes": counted["segment"],
                         "metadata_bytes": counted["metadata"],
                         "requests": counted["requests"] + 1, "returned_bytes": len(data)})
        client.close()
        return self._cold_summary(runs)

    @staticmethod
    def _cold_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **summary([r["ms"] / 1000 for r in runs]),
            "segment_bytes_per_fetch": round(statistics.mean(r["segment_bytes"] for r in runs)),
            "metadata_bytes_per_fetch": round(statistics.mean(r["metadata_bytes"]
                                                              for r in runs)),
            "requests_per_fetch": round(statistics.mean(r["requests"] for r in runs), 1),
            "runs": runs,
        }

    def warm(self, offsets: list[int]) -> dict[str, Any]:
        remote, local, pread = [], [], []
        config = self.config(cloud_storage_chunk_eviction_strategy="capped")
        reader, store = self.reader(config)
        local_reader, _ = self.reader(config, local=True)
        with reader, store, local_reader, open(self.segment_path, "rb") as f:
            for offset in offsets:
                reader.fetch(TOPIC, 0, offset, self.fetch_bytes)  # hydrate
                # a fetch returns once its own bytes are in; the rest of its chunk goes on
                # streaming behind it, and must be in before the warm fetch is timed
                before = _settled(store)
                start = time.perf_counter()
                got = reader.fetch(TOPIC, 0, offset, self.fetch_bytes)
                remote.append(time.perf_counter() - start)
                if store.segment_bytes != before:
                    raise SystemExit("the warm fetch downloaded segment bytes")
                start = time.perf_counter()
                mine = local_reader.fetch(TOPIC, 0, offset, self.fetch_bytes)
                local.append(time.perf_counter() - start)
                if mine.data != got.data or mine.source != "local":
                    raise SystemExit("the local fetch differs from the remote one")
                position = self.position(got.offset)
                start = time.perf_counter()
                data = os.pread(f.fileno(), len(got.data), position)
                pread.append(time.perf_counter() - start)
                if data != got.data:
                    raise SystemExit("warm fetch bytes differ from the local file")
        return {"tiered_cache": summary(remote), "tiered_local_log": summary(local),
                "local_file_pread": summary(pread)}

    def sequential(self, prefetch: int | None) -> dict[str, Any]:
        """One consumer session reading from offset 0; `prefetch` None leaves
        `cloud_storage_chunk_prefetch` out (the default, adaptive read-ahead)."""
        fixed = {} if prefetch is None else {"cloud_storage_chunk_prefetch": prefetch}
        config = self.config(cloud_storage_chunk_eviction_strategy="eager", **fixed)
        reader, store = self.reader(config)
        latencies = []
        total = 0
        goal = min(self.args.sequential_mb * MIB, self.segment_size)
        offset = 0
        with reader, store:
            start = time.perf_counter()
            while total < goal and offset < self.end:
                t0 = time.perf_counter()
                got = reader.fetch(TOPIC, 0, offset, self.fetch_bytes, reader_id="consumer")
                latencies.append(time.perf_counter() - t0)
                total += len(got.data)
                offset = got.next_offset
                if self.args.think_ms:
                    time.sleep(self.args.think_ms / 1000)
            took = time.perf_counter() - start
            stats = reader.stats["cache"]
        typical = statistics.median(latencies)
        return {
            "prefetch_chunks": prefetch, "fetches": len(latencies), "bytes": total,
            "seconds": round(took, 3), "mb_per_s": mb_per_s(total, took),
            **summary(latencies),
            "p99_ms": ms(sorted(latencies)[int(0.99 * (len(latencies) - 1))]),
            "waited_fetches": sum(1 for x in latencies if x > 10 * typical + 0.005),
            "segment_bytes_downloaded": store.segment_bytes,
            "cache_misses": stats["misses"], "prefetches": stats["prefetches"],
        }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["http"]:  # through the daemon's HTTP endpoint: remote_read_http.py
        from remote_read_http import run_http

        emit(run_http(argv[1:]))
        return 0
    if argv[:1] == ["ab"]:  # two versions of the daemon side by side: remote_read_ab.py
        from remote_read_ab import run_ab

        emit(run_ab(argv[1:]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="segment size, MiB")
    parser.add_argument("--chunk-mb", type=int, default=16, help="cache chunk size, MiB")
    parser.add_argument("--fetch-kb", type=int, default=1024, help="fetch max_bytes, KiB")
    parser.add_argument("--trials", type=int, default=5, help="cold fetches per contender")
    parser.add_argument("--whole-trials", type=int, default=2,
                        help="cold whole-segment downloads (each moves the whole segment)")
    parser.add_argument("--sequential-mb", type=int, default=256,
                        help="bytes the sequential consumer reads, MiB")
    parser.add_argument("--prefetch", type=int, default=2, help="read-ahead chunks")
    parser.add_argument("--think-ms", type=float, default=0.0,
                        help="consumer processing time per fetch, ms")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if min(args.size_mb, args.chunk_mb, args.fetch_kb, args.trials) < 1:
        parser.error("sizes and trials must be positive")

    work = Path(tempfile.mkdtemp(prefix="tiered-remote-read-"))
    try:
        with MotoServer() as moto:
            moto.create_bucket(BUCKET)
            progress(f"writing a {args.size_mb} MiB segment")
            segment_path, end = write_segment(work / "logs", args.size_mb * MIB)
            bench = Bench(args, work, moto, segment_path, end)
            progress("archiving it into the bucket")
            store = S3Store(bench.settings)
            archive(bench.config(), store)
            bench.segment_key = next(i.key for i in store.list("") if i.key.endswith(".log"))
            store.close()
            rng = random.Random(args.seed)
            offsets = [rng.randrange(bench.end) for _ in range(args.trials)]
            report: dict[str, Any] = {
                "benchmark": "remote_read", "segment_bytes": bench.segment_size,
                "chunk_bytes": bench.chunk, "fetch_bytes": bench.fetch_bytes,
                "trials": args.trials, "offsets": offsets,
            }
            cold: dict[str, Any] = {}
            progress("cold fetches: tiered chunks")
            cold["tiered_chunks"] = bench.cold_reader(offsets)
            progress("cold fetches: fsspec BlockCache")
            cold["fsspec_blockcache"] = bench.cold_fsspec(offsets)
            progress("cold fetches: whole-segment downloads")
            cold["whole_segment"] = bench.cold_reader(offsets[:args.whole_trials],
                                                      cloud_storage_disable_chunk_reads=True)
            report["cold"] = cold
            progress("warm fetches")
            report["warm"] = bench.warm(offsets)
            sequential: dict[str, Any] = {}
            for name, prefetch in (("no_readahead", 0), ("readahead", args.prefetch),
                                   ("adaptive_readahead", None)):
                progress(f"sequential consumer: {name}")
                sequential[name] = bench.sequential(prefetch)
            report["sequential"] = sequential
            report["ratios"] = ratios(report)
            report["versions"] = versions("boto3", "moto", "fsspec")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(report)
    return 0


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    """Headline comparisons (None when a denominator is zero)."""
    cold, warm, seq = report["cold"], report["warm"], report["sequential"]

    def div(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    chunks: Callable[[str], Any] = cold["tiered_chunks"].__getitem__
    return {
        "whole_segment_bytes_over_chunks": div(cold["whole_segment"]["segment_bytes_per_fetch"],
                                               chunks("segment_bytes_per_fetch")),
        "whole_segment_latency_over_chunks": div(cold["whole_segment"]["median_ms"],
                                                 chunks("median_ms")),
        "fsspec_latency_over_chunks": div(cold["fsspec_blockcache"]["median_ms"],
                                          chunks("median_ms")),
        "warm_cache_over_local_log": div(warm["tiered_cache"]["median_ms"],
                                         warm["tiered_local_log"]["median_ms"]),
        "readahead_speedup": div(seq["readahead"]["mb_per_s"] or 0,
                                 seq["no_readahead"]["mb_per_s"] or 0),
        "adaptive_readahead_speedup": div(seq["adaptive_readahead"]["mb_per_s"] or 0,
                                          seq["no_readahead"]["mb_per_s"] or 0),
    }


if __name__ == "__main__":
    raise SystemExit(main())
