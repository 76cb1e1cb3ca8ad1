"""Thousands of partitions on one sidecar: requests, idle cost, start, stop and throughput.

For each partition count (`--counts`, default 1000 5000 10000), one log dir of small
partitions (two closed segments and an active one each, recent records) and a fresh moto
bucket:

1. `archive --once` as the command runs it (a passive lease member, maximum shares), in this
   process over a store that counts every request by operation and kind of object: wall
   time, segments/s, requests per segment and per partition;
2. two baselines, each a boto3 script with the same concurrency (the archiver's upload
   budget) into another bucket of the same server, in the same run: segments/s and tiered's
   ratio to it. The first PUTs the objects alone (every segment, and its index files as one
   object, as the archiver bundles them): what safety costs over bare uploads. The second
   makes every PUT `archive --once` made, the same keys with bodies of the same sizes (its
   objects, and its heads and their copies, leases, node and topic records): what the
   sidecar costs over the writes it must make, its reads and its own work. A third makes
   every request it made, in the order it made them: its PUTs as the second does, and its
   GETs, HEADs, listings and deletes of the same keys and prefixes. What the sidecar costs
   beyond that is its own work alone: how far it is bound by the store;
3. `tiered run` as a child process on the archived bucket: seconds from start until every
   partition's lease is held (its `tiered_leases_held` gauge), then, once it has settled,
   its CPU over `--idle-s` seconds (percent of one core, and per 1,000 partitions), its RSS,
   and the store requests it made meanwhile (its `tiered_lease_requests_total` and the
   server's request log are not needed: the daemon's own store counters); last, the time from
   SIGTERM to its exit. Before that stop, the steady state (`daemon.steady`): every
   partition's log grows by two closed segments under the running daemon, which already
   holds every head, and its store requests until it has committed them are counted per
   segment. `--housekeeping-interval-s` shortens the daemon's housekeeping interval
   (`cloud_storage_housekeeping_interval_ms`, 5 minutes by default) so that the idle window
   holds several housekeeping passes and their requests (`idle_housekeeping_passes`), and
   `--grace-period-s` the GC grace period (1 hour by default), so that it holds the
   housekeeping of whole grace periods: the census of the bucket that stands in for the
   idle partitions' full passes (`idle_census_spared_passes`; the window then starts once
   the first full passes, spread over the first grace period, are over and a census has
   spared as many passes as there are partitions, `warm_s` after settling);
4. a busy stop: `tiered run` on a second, empty bucket (every partition to upload again),
   sent SIGTERM once its first segments are uploaded: the time to its exit and the segments
   it uploaded, of all it had to (a stop ends each pass with the partitions in flight).

The machine is shared and small: moto competes with the sidecar for the same two cores,
so absolute figures are the server's more than ours; the ratios and the per-partition
request counts are what carry over. moto also walks every key of a bucket for each prefix
listing, so its listings slow down as the bucket grows. `--store file` runs everything on
file:// buckets instead (the embedded default: a directory, a listing of a partition reads
only that partition's directories). The baseline is then the same writes of the same files,
with the same concurrency, through the same file store. This shows what the sidecar itself
can do when the store is not the bound.

    python benchmarks/partitions.py --counts 200            # a quick look
    python benchmarks/partitions.py --counts 1000 --housekeeping-interval-s 5 \
        --grace-period-s 20 --idle-s 60                     # idle grace periods
    python benchmarks/partitions.py                         # 1k / 5k / 10k (long)
    python benchmarks/partitions.py --store file --counts 10000
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import (  # noqa: E402
    DaemonProcess,
    MotoServer,
    daemon_config,
    emit,
    progress,
    versions,
)
from support.counting import CountingStore  # noqa: E402

from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks

TOPICS = 100  # partitions spread over this many topics
BATCHES = 6  # per partition: two closed segments and an active one at SEGMENT_BYTES
SEGMENT_BYTES = 3000
NODE = "bench-node"


# --- the log --------------------------------------------------------------------------------


def write_log(log_dir: Path, partitions: int) -> None:
    """`partitions` small partitions over `TOPICS` topics, records stamped now. Called again
    on the same log dir, it appends as much to each (reopening its active segment, as a
    broker would after a restart): two more closed segments per partition."""
    now_ms = int(time.time() * 1000)
    hws: dict[TopicPartition, int] = {}
    for i in range(partitions):
        topic, partition = f"t{i % TOPICS}", i // TOPICS
        writer = LogWriter(log_dir / f"{topic}-{partition}", segment_bytes=SEGMENT_BYTES,
                           fsync=False, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, topic))
        with writer:
            writer.become_leader(1)
            for _ in range(BATCHES):
                writer.append([ProducerRecord(b"v" * 300, timestamp=now_ms) for _ in range(4)])
            hws[TopicPartition(topic, partition)] = writer.log_end_offset
    write_high_watermarks(log_dir, hws, fsync=False)
    (log_dir / "meta.properties").write_text(f"node.id={NODE}\n")


#: one object to put: its key and the files whose bytes, concatenated, are its body
Upload = tuple[str, tuple[Path, ...]]
#: one PUT the sidecar made: its key and its body's size
Put = tuple[str, int]
#: one request the sidecar made: its operation ("put", "get", "head", "list", "delete"),
#: its key (a listing's prefix; a delete's first key), and a PUT's body size, a GET's byte
#: range or a delete's keys (`delete_batches` makes of them the requests a store makes)
Request = tuple[str, str, Any]


def closed_files(log_dir: Path) -> list[Upload]:
    """What gets uploaded of every closed segment: its `.log`, and its `.index` and
    `.timeindex` in one object (the archiver's bundle adds a few bytes of framing)."""
    out: list[Upload] = []
    for part in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        logs = sorted(part.glob("*.log"))[:-1]  # the last one is active
        for seg in logs:
            out.append((f"{part.name}/{seg.name}", (seg,)))
            out.append((f"{part.name}/{seg.stem}.indexes",
                        (seg.with_suffix(".index"), seg.with_suffix(".timeindex"))))
    return out


def _body(paths: tuple[Path, ...]) -> bytes:
    return b"".join(p.read_bytes() for p in paths)


# --- the phases -------------------------------------------------------------------------------


class RecordingStore(CountingStore):
    """A counting store that also keeps the key and size of every PUT that succeeded, for the
    baseline that makes the same PUTs (`Buckets.writer`), and every request in the order
    made, succeeded or not, for the one that makes them all (`Buckets.replayer`)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.puts: list[Put] = []
        self.requests: list[Request] = []
        self._puts_lock = threading.Lock()

    def _keep(self, key: str, size: int) -> None:
        with self._puts_lock:
            self.puts.append((key, size))

    def _made(self, operation: str, key: str, detail: Any = None) -> None:
        with self._puts_lock:
            self.requests.append((operation, key, detail))

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        self._made("put", key, len(data))
        etag = super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        self._keep(key, len(data))
        return etag

    def put_file(self, key: str, path: Path | str, *, ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        size = (byte_range[1] - byte_range[0] if byte_range is not None
                else Path(path).stat().st_size)
        self._made("put", key, size)
        etag = super().put_file(key, path, ready=ready, byte_range=byte_range)
        self._keep(key, size)
        return etag

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Any:
        self._made("get", key, byte_range)
        return super().get(key, byte_range)

    def head(self, key: str) -> Any:
        self._made("head", key)
        return super().head(key)

    def list(self, prefix: str = "") -> Any:
        self._made("list", prefix)
        return super().list(prefix)

    def delete_many(self, keys_: Any) -> Any:
        doomed = [*keys_]
        self._made("delete", doomed[0] if doomed else "", tuple(doomed))
        return super().delete_many(doomed)


def archive_once(config_path: Path) -> tuple[dict[str, Any], list[Put], list[Request]]:
    """`tiered archive --once`, as the command composes it, over a counting store: its
    figures, every PUT it made (key, bytes) and every request."""
    from archiver.controller import ControllerParams
    from archiver.service import Archiver
    from tiered.app.cluster import keeper_for, leases_for
    from tiered.config import load_config
    from tiered.store import open_store

    config = load_config(config_path)
    store = RecordingStore(open_store(config.store_settings(), probe=False))
    shares = ControllerParams.from_cluster(config.cluster).max_shares
    start, cpu = time.monotonic(), time.process_time()
    archiver = Archiver(config, store, fixed_shares=shares)
    try:
        keeper = keeper_for(config, store, passive=True)
        with leases_for(archiver, keeper, release=False):
            report = archiver.run_once()
        concurrency = archiver.budget.concurrency
    finally:
        archiver.close()
        store.close()
    seconds = time.monotonic() - start
    segments = sum(p.uploaded_segments for p in report.partitions)
    partitions = len({(p.topic, p.partition) for p in report.partitions})
    total = sum(store.seen.values())
    objects = store.seen["put", "segment"] + store.seen["put", "index"]
    figures = {
        "ok": report.ok, "errors": report.errors[:3],
        "seconds": round(seconds, 1), "cpu_seconds": round(time.process_time() - cpu, 1),
        "uploaded_segments": segments, "segments_per_s": round(segments / seconds, 1),
        "upload_concurrency": concurrency,
        "store_requests": total,
        "requests_per_segment": round(total / max(1, segments), 2),
        "requests_per_partition": round(total / max(1, partitions), 2),
        "requests_per_partition_beyond_objects": round((total - objects) / max(1, partitions), 2),
        "requests_by_kind": {f"{op} {what}": n for (op, what), n in sorted(store.seen.items())},
    }
    return figures, store.puts, store.requests


class MotoBuckets:
    """Buckets on the moto server; the baseline is a plain boto3 script."""

    kind = "moto"
    baseline_name = "boto3"
    #: the daemon counts its requests to an S3 store (its retry layer keeps the counters)
    counts_requests = True

    def __init__(self, moto: MotoServer) -> None:
        self.moto = moto
        self._client: Any = None  # for polling a bucket's contents, made once

    def create(self, name: str) -> tuple[str, str | None]:
        """(bucket, endpoint) for `daemon_config`."""
        self.moto.create_bucket(name)
        return name, self.moto.endpoint

    def writer(self, name: str, concurrency: int) -> Writer:
        """A plain boto3 script's PUTs into a new bucket `name`, with a pool for
        `concurrency`."""
        self.moto.create_bucket(name)
        client = self.moto.client(max_pool_connections=concurrency)

        def put(key: str, body: bytes) -> None:
            client.put_object(Bucket=name, Key=key, Body=body)

        return put, client.close

    def replayer(self, name: str, concurrency: int) -> Replayer:
        """A plain boto3 script making `Request`s into a new bucket `name`, with a pool for
        `concurrency`: a missing object's 404 is an answer, as it was to the sidecar."""
        import botocore.exceptions

        self.moto.create_bucket(name)
        client = self.moto.client(max_pool_connections=concurrency)
        pages = client.get_paginator("list_objects_v2")

        def make(request: Request) -> None:
            operation, key, detail = request
            try:
                if operation == "put":
                    client.put_object(Bucket=name, Key=key, Body=bytes(detail))
                elif operation == "get":
                    extra = {} if detail is None else {"Range": f"bytes={detail[0]}-"
                                                                f"{detail[1] - 1}"}
                    client.get_object(Bucket=name, Key=key, **extra)["Body"].read()
                elif operation == "head":
                    client.head_object(Bucket=name, Key=key)
                elif operation == "list":
                    for _page in pages.paginate(Bucket=name, Prefix=key):
                        pass
                elif operation == "delete":
                    for batch in delete_batches(detail):
                        client.delete_objects(Bucket=name, Delete={
                            "Objects": [{"Key": k} for k in batch], "Quiet": True})
            except botocore.exceptions.ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status not in (404, 416):
                    raise

        return make, client.close

    def segments_in(self, name: str) -> int:
        if self._client is None:
            self._client = self.moto.client()
        return sum(1 for page in self._client.get_paginator("list_objects_v2").paginate(
            Bucket=name) for o in page.get("Contents", ()) if o["Key"].endswith(".log"))

    def reset(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self.moto.reset()


class FileBuckets:
    """file:// buckets (directories) under `root`; the baseline writes the same files through
    the same store class the sidecar uses (`tiered.store.file.FileStore`)."""

    kind = "file"
    baseline_name = "file_store_puts"
    #: a file store keeps no request counters: the daemon's request figures are None, not 0
    counts_requests = False

    def __init__(self, root: Path) -> None:
        self.root = root

    def create(self, name: str) -> tuple[str, str | None]:
        path = self.root / name
        path.mkdir(parents=True)
        return str(path), None

    def _store(self, name: str) -> Any:
        from tiered.store import StoreSettings, open_store

        return open_store(StoreSettings(url=f"file://{self.root / name}"), probe=False)

    def writer(self, name: str, concurrency: int) -> Writer:
        """Writes into a new directory `name` through the sidecar's own file store."""
        self.create(name)
        store = self._store(name)
        return (lambda key, body: store.put(key, body)), store.close

    def replayer(self, name: str, concurrency: int) -> Replayer:
        """`Request`s into a new directory `name` through the sidecar's own file store."""
        from tiered.store.errors import ObjectNotFound

        self.create(name)
        store = self._store(name)

        def make(request: Request) -> None:
            operation, key, detail = request
            try:
                if operation == "put":
                    store.put(key, bytes(detail))
                elif operation == "get":
                    store.get(key, detail)
                elif operation == "head":
                    store.head(key)
                elif operation == "list":
                    for _info in store.list(key):
                        pass
                elif operation == "delete":
                    store.delete_many(detail)
            except ObjectNotFound:
                pass

        return make, store.close

    def segments_in(self, name: str) -> int:
        """Through the store's own listing: the directory also holds its ETag side files,
        named as the objects are, which a walk of the files would count twice."""
        store = self._store(name)
        try:
            return sum(1 for o in store.list() if o.key.endswith(".log"))
        finally:
            store.close()

    def reset(self) -> None:
        for child in self.root.iterdir():
            shutil.rmtree(child, ignore_errors=True)


Buckets = MotoBuckets | FileBuckets
#: what `Buckets.writer` gives: put(key, body), and close()
Writer = tuple[Callable[[str, bytes], object], Callable[[], object]]
#: what `Buckets.replayer` gives: make(request), and close()
Replayer = tuple[Callable[[Request], object], Callable[[], object]]


def timed_puts(buckets: Buckets, name: str, puts: list[tuple[str, Callable[[], bytes]]],
               concurrency: int, segments: int) -> dict[str, Any]:
    """`puts` (key, its body) into a new bucket `name` through `buckets.writer`, `concurrency`
    at a time: seconds, and `segments` per second. Bodies are made inside the timing, as the
    sidecar reads its files inside its own."""
    put, close = buckets.writer(name, concurrency)
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda item: put(item[0], item[1]()), puts))
    seconds = time.monotonic() - start
    close()
    return {"seconds": round(seconds, 1), "puts": len(puts),
            "segments_per_s": round(segments / seconds, 1)}


def delete_batches(keys: tuple[str, ...]) -> list[list[str]]:
    """A delete's keys as S3Store sends them: each once, at most `DELETE_BATCH` a request, no
    request for none."""
    from tiered.store.s3 import DELETE_BATCH

    unique = list(dict.fromkeys(keys))
    return [unique[i:i + DELETE_BATCH] for i in range(0, len(unique), DELETE_BATCH)]


def timed_requests(buckets: Buckets, name: str, requests: list[Request], concurrency: int,
                   segments: int) -> dict[str, Any]:
    """`requests` into a new bucket `name` through `buckets.replayer`, in their order,
    `concurrency` at a time: seconds, and `segments` per second."""
    make, close = buckets.replayer(name, concurrency)
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(make, requests))
    seconds = time.monotonic() - start
    close()
    made: dict[str, int] = {}
    for operation, _key, _detail in requests:
        made[operation] = made.get(operation, 0) + 1
    return {"seconds": round(seconds, 1), "requests": len(requests), "by_operation": made,
            "segments_per_s": round(segments / seconds, 1)}


def object_puts(files: list[Upload]) -> list[tuple[str, Callable[[], bytes]]]:
    """The baseline's PUTs: every closed segment and its indexes, the files' own bytes."""
    return [(key, functools.partial(_body, paths)) for key, paths in files]


def same_puts(puts: list[Put]) -> list[tuple[str, Callable[[], bytes]]]:
    """Every PUT the sidecar made, again: the same keys, bodies of the same sizes."""
    return [(key, functools.partial(bytes, size)) for key, size in puts]


def leases_held(daemon: DaemonProcess) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics",
                                timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("tiered_leases_held"):
                return float(line.split()[-1])
    return 0.0


def store_requests(daemon: DaemonProcess) -> float:
    """The daemon's own count of requests to the bucket: `tiered_store_attempts_total` of
    every path (`archive`: the archiver, its housekeeping and the lease keeper; `read`)."""
    import urllib.request

    total = 0.0
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics",
                                timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("tiered_store_attempts_total{"):
                total += float(line.split()[-1])
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def steady_round(daemon: DaemonProcess, log_dir: Path, partitions: int, *, counted: bool,
                 timeout_s: float = 900) -> dict[str, Any]:
    """The steady state: every partition's log grows by two closed segments under the running
    daemon, which holds every head already; its store requests until it has committed them
    all, per segment (the lease keeper's few background requests included)."""
    before = len(closed_files(log_dir)) // 2
    uploaded = daemon.metric("tiered_uploaded_segments_total")
    requests = store_requests(daemon) if counted else None
    started = time.monotonic()
    write_log(log_dir, partitions)
    new = len(closed_files(log_dir)) // 2 - before
    while time.monotonic() - started < timeout_s:
        if daemon.metric("tiered_uploaded_segments_total") - uploaded >= new:
            break
        time.sleep(0.5)
    done = daemon.metric("tiered_uploaded_segments_total") - uploaded
    seconds = time.monotonic() - started
    out: dict[str, Any] = {"new_segments": new, "uploaded_segments": int(done),
                           "seconds": round(seconds, 1)}
    if requests is not None:
        made = store_requests(daemon) - requests
        out["store_requests"] = made
        out["requests_per_segment"] = round(made / max(1, done), 2)
    else:
        out["store_requests"] = out["requests_per_segment"] = None
    return out


def run_daemon(config_path: Path, workdir: Path, partitions: int, idle_s: float,
               start_timeout_s: float, *, counted: bool = True,
               log_dir: Path | None = None, warm_s: float = 0.0) -> dict[str, Any]:
    """`counted`: the daemon counts its store requests (`counts_requests` of the buckets);
    otherwise its request figures are None, not 0. With `log_dir`, after the idle window,
    the steady state (`steady_round`)."""
    started = time.monotonic()
    daemon = DaemonProcess(config_path, workdir / "daemon.log")
    out: dict[str, Any] = {}
    try:
        deadline = started + start_timeout_s
        held = 0.0
        while time.monotonic() < deadline:
            held = leases_held(daemon)
            if held >= partitions:
                break
            time.sleep(0.5)
        out["leases_held"] = held
        out["all_leases_held_after_s"] = (round(time.monotonic() - started, 1)
                                          if held >= partitions else None)
        out["settle_s"] = daemon.settle(timeout_s=120)
        requests = store_requests(daemon) if counted else None
        out["start_store_requests"] = requests  # taking the leases, reading the heads
        if warm_s:
            # the first full passes are spread over the first grace period, and at thousands
            # of partitions on moto they lag it: the window starts once the census has spared
            # as many passes as there are partitions (never, without a census: the timeout)
            warm_start = time.monotonic()
            time.sleep(warm_s)
            while (daemon.metric("tiered_housekeeping_census_spared_total") < partitions
                   and time.monotonic() - warm_start < 5 * warm_s):
                time.sleep(0.5)
            requests = store_requests(daemon) if counted else None
            out["warm_s"] = round(time.monotonic() - warm_start, 1)
        spared = daemon.metric("tiered_housekeeping_census_spared_total")
        cpu = daemon.cpu_s()
        time.sleep(idle_s)
        cpu = daemon.cpu_s() - cpu
        out["idle_census_spared_passes"] = int(
            daemon.metric("tiered_housekeeping_census_spared_total") - spared)
        out["idle_s"] = idle_s
        out["idle_cpu_percent_of_a_core"] = round(100 * cpu / idle_s, 2)
        out["idle_cpu_percent_per_1000_partitions"] = round(
            100 * cpu / idle_s * 1000 / partitions, 2)
        out["idle_store_requests"] = (None if requests is None
                                      else store_requests(daemon) - requests)
        out["rss_mib"] = rss_mib(daemon.proc.pid)
        if log_dir is not None:
            out["steady"] = steady_round(daemon, log_dir, partitions, counted=counted)
    finally:
        stop = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(timeout=120)
            out["stop_s"] = round(time.monotonic() - stop, 2)
        except subprocess.TimeoutExpired:
            out["stop_s"] = None  # a slow stop is a figure of its own, not lost idle ones
        finally:
            daemon.stop()
    return out


def new_bucket(buckets: Buckets, bucket: str, workdir: Path, log_dir: Path, name: str,
               housekeeping_ms: int | None = None, grace_ms: int | None = None) -> Path:
    """`bucket`, created, and the path of a daemon configuration `name`.toml over it and
    `log_dir` (a cache directory of its own)."""
    where, endpoint = buckets.create(bucket)
    config = workdir / f"{name}.toml"
    cluster = "cloud_storage_upload_lease_ms = 30000"
    if housekeeping_ms is not None:
        cluster += f"\ncloud_storage_housekeeping_interval_ms = {housekeeping_ms}"
    if grace_ms is not None:
        cluster += f"\ncloud_storage_gc_grace_period_ms = {grace_ms}"
    config.write_text(daemon_config(
        bucket=where, endpoint=endpoint, log_dir=log_dir, cache_dir=workdir / f"{name}-cache",
        cluster=cluster))
    return config


def busy_stop(buckets: Buckets, workdir: Path, log_dir: Path, segments: int,
              timeout_s: float = 300.0) -> dict[str, Any]:
    """SIGTERM to a daemon in the middle of its first upload round: seconds to its exit."""
    bucket = f"busy-{uuid.uuid4().hex[:8]}"
    config = new_bucket(buckets, bucket, workdir, log_dir, "busy")
    daemon = DaemonProcess(config, workdir / "busy.log")
    try:  # the daemon's metrics are published after each round: the bucket tells sooner
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not buckets.segments_in(bucket):
            time.sleep(0.2)
        start = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(timeout=120)
            stop_s: float | None = round(time.monotonic() - start, 2)
        except subprocess.TimeoutExpired:
            stop_s = None
    finally:
        daemon.stop()
    done = buckets.segments_in(bucket)
    return {"stop_s": stop_s, "segments_uploaded_before_exit": done,
            "segments_to_upload": segments}


def one_count(buckets: Buckets, partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"tiered-partitions-{partitions}-"))
    try:
        log_dir = workdir / "logs"
        log_dir.mkdir()
        progress(f"{partitions} partitions: writing the log")
        write_log(log_dir, partitions)
        files = closed_files(log_dir)
        bucket = f"partitions-{partitions}-{uuid.uuid4().hex[:8]}"
        housekeeping_ms = (None if args.housekeeping_interval_s is None
                           else int(args.housekeeping_interval_s * 1000))
        grace_ms = None if args.grace_period_s is None else int(args.grace_period_s * 1000)
        config = new_bucket(buckets, bucket, workdir, log_dir, "tiered", housekeeping_ms,
                            grace_ms)
        progress(f"{partitions} partitions: archive --once")
        once, puts, requests = archive_once(config)
        progress(f"{partitions} partitions: {buckets.baseline_name} baseline")
        concurrency, segments = once["upload_concurrency"], once["uploaded_segments"]
        base = timed_puts(buckets, bucket + "-baseline", object_puts(files), concurrency,
                          segments)
        progress(f"{partitions} partitions: {buckets.baseline_name} baseline of every PUT")
        every = timed_puts(buckets, bucket + "-every-put", same_puts(puts), concurrency,
                           segments)
        del puts
        progress(f"{partitions} partitions: {buckets.baseline_name} baseline of every request")
        every_request = timed_requests(buckets, bucket + "-every-request", requests,
                                       concurrency, segments)
        del requests
        progress(f"{partitions} partitions: tiered run")
        # with a short grace period, the idle window starts once the first full passes
        # (spread over the first grace period) are over and a census has run
        warm_s = (0.0 if args.grace_period_s is None
                  else args.grace_period_s + (args.housekeeping_interval_s or 0.0))
        daemon = run_daemon(config, workdir, partitions, args.idle_s, args.start_timeout_s,
                            counted=buckets.counts_requests, log_dir=log_dir, warm_s=warm_s)
        if args.housekeeping_interval_s is not None:
            daemon["idle_housekeeping_passes"] = int(args.idle_s
                                                     // args.housekeeping_interval_s)
        if args.grace_period_s is not None:
            daemon["idle_grace_periods"] = round(args.idle_s / args.grace_period_s, 1)
        progress(f"{partitions} partitions: a busy stop")
        busy = busy_stop(buckets, workdir, log_dir, len(closed_files(log_dir)) // 2)
        name = buckets.baseline_name
        return {
            "partitions": partitions,
            "store": buckets.kind,
            "archive_once": once,
            name: base,
            f"throughput_vs_{name}": round(once["segments_per_s"] / base["segments_per_s"], 2),
            f"{name}_every_put": every,
            f"throughput_vs_{name}_every_put": round(
                once["segments_per_s"] / every["segments_per_s"], 2),
            f"{name}_every_request": every_request,
            f"throughput_vs_{name}_every_request": round(
                once["segments_per_s"] / every_request["segments_per_s"], 2),
            "daemon": daemon,
            "busy_stop": busy,
        }
    finally:
        buckets.reset()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--idle-s", type=float, default=30.0,
                        help="seconds the idle daemon's CPU is measured over")
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    parser.add_argument("--housekeeping-interval-s", type=float, default=None,
                        help="the daemon's housekeeping interval (default: the property's "
                             "default, 5 minutes, longer than the idle window)")
    parser.add_argument("--grace-period-s", type=float, default=None,
                        help="the GC grace period (`cloud_storage_gc_grace_period_ms`, 1 hour "
                             "by default): shorter than the idle window, it shows the idle "
                             "housekeeping of whole grace periods; the window then starts one "
                             "grace period and one housekeeping interval after settling")
    parser.add_argument("--store", choices=("moto", "file"), default="moto",
                        help="a moto_server child process (default) or file:// buckets")
    args = parser.parse_args(argv)
    runs = []
    with contextlib.ExitStack() as stack:
        buckets: Buckets
        if args.store == "moto":
            buckets = MotoBuckets(stack.enter_context(MotoServer()))
        else:
            root = Path(tempfile.mkdtemp(prefix="tiered-partitions-buckets-"))
            stack.callback(shutil.rmtree, root, ignore_errors=True)
            buckets = FileBuckets(root)
        for count in args.counts:
            runs.append(one_count(buckets, count, args))
            emit({"partial": True, "runs": runs})
    emit({"benchmark": "partitions", "cores": os.cpu_count(),
          "versions": versions("boto3", "moto"), "python": sys.version.split()[0], "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
