"""Upload backlog under bursts: the PD backlog controller against fixed minimum and fixed
maximum shares, on the same producer, in one run.

A producer thread appends bursts of `--burst-mb` MiB to a topic every `--interval` seconds
with tiered's LogWriter: on average faster than the upload budget at minimum shares, slower
than at maximum shares. The archiver runs in this process in real time, in the daemon's
order (scan -> controller update -> upload round -> local retention, one at a time on one
thread), with local retention enforced (about one segment per partition stays once
uploaded), against a moto server or a file:// bucket. The data disk is simulated: `--disk-mb`
in all, free = that minus what the log holds, so the backlog ratio the controller sees is the
one of a small disk filling up. The bandwidth the shares divide is `--max-bandwidth-mb`.

Three runs, one per mode, each with a fresh log and bucket:

    pd_controller       the controller sets the shares from the backlog (the daemon's behaviour)
    fixed_min_shares    `fixed_shares = cloud_storage_upload_ctrl_min_shares`
    fixed_max_shares    `fixed_shares = cloud_storage_upload_ctrl_max_shares`

Each reports the peak backlog (bytes appended and not yet in a committed manifest) and the
peak local disk (bytes of the log directory), both sampled every 50 ms; the peak backlog the
controller itself read (it updates during upload rounds too); the backlog when the producer
stopped; the time from then until everything was uploaded (null: not drained within
`--drain-timeout`); the shares the controller gave; and a one-second timeline.

    python benchmarks/backlog.py                      # about a minute on 2 cores
    python benchmarks/backlog.py --bursts 4 --burst-mb 4 --max-bandwidth-mb 8 --store file
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import MIB, MotoServer, SampleProducer, emit, progress, tree_bytes, versions

from archiver.controller import ControllerParams
from archiver.service import Archiver
from archiver.space import DiskInfo
from manifests.commit import CommitResult
from manifests.manifest import PartitionManifest

TOPIC = "bursts"
#: how often the sampler thread looks at the backlog and the log directory (seconds)
SAMPLE_INTERVAL_S = 0.05
#: pause after an archiver loop that uploaded nothing (seconds); the daemon backs off too
IDLE_PAUSE_S = 0.05

#: mode name -> the fixed shares it runs with (None: the PD controller decides)
MODES: dict[str, Callable[[ControllerParams], int | None]] = {
    "pd_controller": lambda params: None,
    "fixed_min_shares": lambda params: params.min_shares,
    "fixed_max_shares": lambda params: params.max_shares,
}


@dataclass(frozen=True)
class Settings:
    """One run's numbers; sizes in bytes, times in seconds unless named otherwise."""

    partitions: int
    segment_bytes: int
    burst_bytes: int
    bursts: int
    interval_s: float
    disk_bytes: int
    max_bandwidth: int
    update_interval_ms: int
    drain_timeout_s: float
    record_bytes: int


class SimulatedDisk:
    """`disk_usage` for the archiver: a disk of `total` bytes holding only the log directory,
    so the controller's backlog / (backlog + free) moves on the scale of the benchmark."""

    def __init__(self, log_dir: Path, total: int) -> None:
        self.log_dir = log_dir
        self.total = total

    def __call__(self, path: Path) -> DiskInfo:
        used = tree_bytes(self.log_dir)
        return DiskInfo(total_bytes=self.total, free_bytes=max(0, self.total - used))


@dataclass
class Trace:
    """What one run saw, all appended by the sampler thread: the peaks, the timeline and
    what the controller read (`controller_backlog`, `shares`)."""

    started: float = field(default_factory=time.monotonic)
    peak_disk: int = 0
    peak_backlog: int = 0
    controller_backlog: list[int] = field(default_factory=list)
    shares: list[int] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)

    def add_sample(self, backlog: int, disk: int, shares: int) -> None:
        self.peak_backlog = max(self.peak_backlog, backlog)
        self.peak_disk = max(self.peak_disk, disk)
        second = int(time.monotonic() - self.started)
        if not self.timeline or second > self.timeline[-1][0]:
            self.timeline.append([second, round(backlog / MIB, 1), round(disk / MIB, 1), shares])


def write_config(path: Path, *, bucket_url: str, endpoint: str | None, log_dir: Path,
                 cache_dir: Path, s: Settings) -> Path:
    """Enforced local retention (uploaded data beyond one segment per partition goes) and a
    controller that updates every `update_interval_ms`. The bandwidth that the shares divide
    is no config property; it is given to the Archiver (`max_upload_bandwidth`)."""
    storage = f'url = "{bucket_url}"\n'
    if endpoint is not None:
        storage += (f'endpoint_url = "{endpoint}"\nregion = "us-east-1"\n'
                    'access_key = "testing"\nsecret_key = "testing"\n')
    path.write_text(
        f"""[storage]
{storage}
[log]
dirs = ["{log_dir}"]
retention = "enforce"

[cache]
dir = "{cache_dir}"

[cluster]
cloud_storage_upload_ctrl_update_interval_ms = {s.update_interval_ms}
retention_local_target_bytes_default = {s.segment_bytes}
retention_local_strict = true
log_segment_size = {s.segment_bytes}
storage_min_free_bytes = 0
""",
        encoding="utf-8",
    )
    return path


@dataclass
class ProducerEnd:
    """Written by the producer thread before it sets its `done` event."""

    at: float | None = None
    backlog_bytes: int | None = None
    failure: BaseException | None = None


def produce(producer: SampleProducer, s: Settings, backlog: Callable[[], int],
            end: ProducerEnd, done: threading.Event) -> None:
    """The producer thread: a burst as fast as the writer goes, then idle until the next one
    is due; at the end every segment is closed so all of it becomes uploadable, and the
    backlog at that moment is noted. `done` is set however it ends, so the archiver loop
    never waits for a producer that died."""
    try:
        start = time.monotonic()
        for n in range(s.bursts):
            producer.append_bytes(s.burst_bytes)
            producer.publish_high_watermarks()
            if n + 1 < s.bursts:
                time.sleep(max(0.0, start + (n + 1) * s.interval_s - time.monotonic()))
        producer.roll_all()
        producer.publish_high_watermarks()
        end.backlog_bytes = backlog()
    except BaseException as exc:
        end.failure = exc
    finally:
        end.at = time.monotonic()
        done.set()


class CommittedBytes:
    """Segment bytes in each partition's latest committed manifest (its `cloud_bytes`),
    tapped from the archiver's `ManifestStore.commit`: the archiver's own byte counter
    counts what was sent, index objects included, which is not what the backlog is about."""

    def __init__(self, archiver: Archiver) -> None:
        self._commit = archiver.mstore.commit
        self._lock = threading.Lock()
        self._by_partition: dict[tuple[str, int], int] = {}
        # an instance attribute shadows the method, for this archiver only
        setattr(archiver.mstore, "commit", self.commit)  # noqa: B010

    def commit(self, manifest: PartitionManifest, expected_etag: str | None) -> CommitResult:
        result = self._commit(manifest, expected_etag)
        m = result.manifest
        with self._lock:
            self._by_partition[(m.topic, m.partition)] = m.cloud_bytes
        return result

    def total(self) -> int:
        with self._lock:
            return sum(self._by_partition.values())


def uncommitted(producer: SampleProducer, committed: CommittedBytes) -> int:
    """Bytes appended that no committed manifest covers yet (the log starts at offset 0 and
    nothing is deleted remotely, so that is appended minus committed)."""
    return producer.appended_bytes - committed.total()


def sample(log_dir: Path, producer: SampleProducer, archiver: Archiver,
           committed: CommittedBytes, trace: Trace, stop: threading.Event) -> None:
    """The sampler thread. The backlog is measured here (appended minus committed) as well
    as read from the controller, whose own reading is only as fresh as its last update
    (every `--update-interval-ms`, during upload rounds too)."""
    while not stop.is_set():
        stats = archiver.snapshot()
        trace.add_sample(uncommitted(producer, committed), tree_bytes(log_dir),
                         stats.controller_shares)
        trace.controller_backlog.append(stats.pending_bytes)
        trace.shares.append(stats.controller_shares)
        stop.wait(SAMPLE_INTERVAL_S)


def run_mode(mode: str, workdir: Path, moto: MotoServer | None, s: Settings) -> dict[str, Any]:
    """One mode with a fresh log and bucket, until the backlog has drained (or timed out)."""
    from tiered.config import load_config
    from tiered.store import open_store

    base = workdir / mode
    log_dir = base / "log"
    log_dir.mkdir(parents=True)
    if moto is not None:
        bucket = f"backlog-{mode.replace('_', '-')}"
        moto.create_bucket(bucket)
        bucket_url, endpoint = f"s3://{bucket}", moto.endpoint
    else:
        (base / "bucket").mkdir()
        bucket_url, endpoint = (base / "bucket").as_uri(), None
    config = load_config(write_config(base / "tiered.toml", bucket_url=bucket_url,
                                      endpoint=endpoint, log_dir=log_dir,
                                      cache_dir=base / "cache", s=s))
    fixed = MODES[mode](ControllerParams.from_cluster(config.cluster))
    producer = SampleProducer(log_dir, TOPIC, s.partitions, s.segment_bytes,
                              record_bytes=s.record_bytes)
    store = open_store(config.store_settings())
    archiver = Archiver(config, store, disk_usage=SimulatedDisk(log_dir, s.disk_bytes),
                        fixed_shares=fixed, max_upload_bandwidth=s.max_bandwidth)
    committed = CommittedBytes(archiver)
    trace = Trace()
    done, stop = threading.Event(), threading.Event()
    end = ProducerEnd()
    drained_at: float | None = None
    errors: list[str] = []
    threads = [
        threading.Thread(target=produce, name="producer", args=(
            producer, s, lambda: uncommitted(producer, committed), end, done)),
        threading.Thread(target=sample, name="sampler", args=(
            log_dir, producer, archiver, committed, trace, stop)),
    ]
    with ExitStack() as cleanup:
        cleanup.callback(store.close)
        cleanup.callback(producer.close)
        cleanup.callback(archiver.close)
        for t in threads:
            t.start()
        try:
            deadline = float("inf")
            while True:
                finished = done.is_set()  # before the scan, so that it sees the last roll
                archiver.scan()
                archiver.update_controller()
                pending = archiver.snapshot().pending_bytes
                if finished:
                    if end.failure is not None:
                        raise SystemExit(f"{mode}: the producer failed: {end.failure!r}")
                    if deadline == float("inf"):
                        deadline = time.monotonic() + s.drain_timeout_s
                    if pending == 0:
                        drained_at = time.monotonic()
                        break
                    if time.monotonic() > deadline:
                        break
                report = archiver.upload_round()
                errors.extend(report.errors)
                errors.extend(archiver.local_retention().errors)
                if not any(p.uploaded_segments for p in report.partitions):
                    time.sleep(IDLE_PAUSE_S)
        finally:
            done.wait()
            stop.set()
            for t in threads:
                t.join()
        final_backlog = uncommitted(producer, committed)
    return {
        "fixed_shares": fixed,
        "produced_bytes": producer.appended_bytes,
        # the producer's reading at its end is a sample too, maybe between two of the sampler's
        "peak_backlog_bytes": max(trace.peak_backlog, end.backlog_bytes or 0),
        "peak_local_disk_bytes": trace.peak_disk,
        "peak_backlog_seen_by_controller_bytes": max(trace.controller_backlog, default=0),
        "backlog_when_producer_stopped_bytes": end.backlog_bytes,
        "final_backlog_bytes": final_backlog,
        "drained": drained_at is not None,
        "time_to_drain_s": None if drained_at is None or end.at is None
        else round(drained_at - end.at, 2),
        "shares": {
            "min": min(trace.shares, default=None),
            "max": max(trace.shares, default=None),
            "mean": round(statistics.fmean(trace.shares), 1) if trace.shares else None,
        },
        "errors": errors[:10],
        "timeline_columns": ["second", "backlog_mib", "local_disk_mib", "shares"],
        "timeline": trace.timeline,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-mb", type=float, default=2.0)
    parser.add_argument("--burst-mb", type=float, default=12.0, help="bytes per burst (MiB)")
    parser.add_argument("--bursts", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.5, help="seconds between bursts")
    parser.add_argument("--disk-mb", type=float, default=256.0, help="simulated disk (MiB)")
    parser.add_argument("--max-bandwidth-mb", type=float, default=32.0,
                        help="upload bandwidth at max shares (MiB/s)")
    parser.add_argument("--update-interval-ms", type=int, default=250,
                        help="controller update interval")
    parser.add_argument("--drain-timeout", type=float, default=90.0, help="seconds")
    parser.add_argument("--record-kb", type=int, default=16)
    parser.add_argument("--store", choices=("moto", "file"), default="moto")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, from {', '.join(MODES)}")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}; choose from {list(MODES)}")
    if min(args.partitions, args.segment_mb, args.burst_mb, args.bursts, args.interval,
           args.disk_mb, args.max_bandwidth_mb, args.update_interval_ms, args.record_kb) <= 0:
        parser.error("sizes, counts and intervals must be positive")
    s = Settings(
        partitions=args.partitions, segment_bytes=int(args.segment_mb * MIB),
        burst_bytes=int(args.burst_mb * MIB), bursts=args.bursts, interval_s=args.interval,
        disk_bytes=int(args.disk_mb * MIB), max_bandwidth=int(args.max_bandwidth_mb * MIB),
        update_interval_ms=args.update_interval_ms, drain_timeout_s=args.drain_timeout,
        record_bytes=args.record_kb * 1024,
    )
    params = ControllerParams()
    workdir = Path(tempfile.mkdtemp(prefix="tiered-backlog-"))
    results: dict[str, Any] = {}
    try:
        with ExitStack() as stack:
            moto = stack.enter_context(MotoServer()) if args.store == "moto" else None
            for mode in modes:
                progress(f"{mode} ...")
                results[mode] = run_mode(mode, workdir, moto, s)
                if moto is not None:
                    moto.reset()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    emit({
        "benchmark": "backlog",
        "store": args.store,
        "partitions": s.partitions,
        "segment_bytes": s.segment_bytes,
        "producer": {"burst_bytes": s.burst_bytes, "bursts": s.bursts,
                     "interval_s": s.interval_s,
                     "mean_rate_bytes_per_s": round(s.burst_bytes / s.interval_s)},
        "upload_bandwidth_bytes_per_s": {
            "at_min_shares": s.max_bandwidth * params.min_shares // params.max_shares,
            "at_max_shares": s.max_bandwidth,
        },
        "simulated_disk_bytes": s.disk_bytes,
        "controller_update_interval_ms": s.update_interval_ms,
        "results": results,
        "cpus": os.cpu_count(),
        "versions": versions("tiered", "boto3", "moto"),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
