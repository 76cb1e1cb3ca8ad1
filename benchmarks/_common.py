"""Helpers shared by the archiver benchmarks (`upload.py`, `backlog.py`).

A moto S3 server as a child process on a free 127.0.0.1 port (boto3, the aws CLI and tiered
all talk to it over real HTTP), sample Kafka logs written with `tiered.kafka.log_writer.LogWriter`,
throughput arithmetic and the one-JSON-object output the benchmarks share.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tiered.kafka.checkpoints import TopicPartition, new_topic_id
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks

MIB = 1024 * 1024
#: throughput unit: MB/s are 10**6 bytes per second, as disks and networks are rated
MB = 1_000_000
#: dummy credentials for moto; also keep the developer's own AWS profile out of every run
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
REGION = "us-east-1"
#: tmpfs, where moto's spooled objects go when it exists (Linux)
SHM = "/dev/shm"


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_aws_env() -> dict[str, str]:
    """The current environment with moto's dummy credentials and no AWS profile."""
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN")}
    env.update(FAKE_CREDENTIALS)
    return env


def _moto_server_command() -> str:
    """`moto_server` of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("moto_server")
    if beside.exists():
        return str(beside)
    found = shutil.which("moto_server")
    if found is None:
        raise SystemExit("moto_server not found (install moto[server])")
    return found


class MotoServer:
    """A `moto_server` child process, started on entry and stopped on exit.

    A separate process rather than moto's in-process ThreadedMotoServer: the server's CPU
    (it is pure Python) must not compete for the GIL with the uploader being measured.
    Its stderr goes to a temporary file so a failed start can say why."""

    def __init__(self, *, start_timeout_s: float = 30.0, spool_in_memory: bool = True) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        self.spool_in_memory = spool_in_memory
        self._spool: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def __enter__(self) -> MotoServer:
        env = fake_aws_env()
        # moto spools every object above ~5 MiB to a temporary file; on a shared disk the
        # writeback of one contender's gigabyte would slow down the next one
        if self.spool_in_memory and os.path.isdir(SHM):
            self._spool = tempfile.mkdtemp(prefix="moto-spool-", dir=SHM)
            env["TMPDIR"] = self._spool
        # a file, not a pipe nobody reads: the server logs every request there, and writing
        # to a closed pipe would cost it a logging error per request
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _stop()
        self._proc = subprocess.Popen(
            [_moto_server_command(), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._stderr.seek(0)
                err = self._stderr.read().decode(errors="replace")
                self._stop()
                raise SystemExit(f"moto_server exited at start: {err.strip()[-500:]}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
            except OSError:
                time.sleep(0.1)
                continue
            return self
        self._stop()
        raise SystemExit(
            f"moto_server did not answer on {self.endpoint} in {self.start_timeout_s} s"
        )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            self._proc = None
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far: on a 2-core machine it competes with the
        contenders, so a contender that makes it work more pays for it."""
        assert self._proc is not None  # noqa: S101 - only while running
        return process_cpu_s(self._proc.pid)

    def client(self, max_pool_connections: int = 10) -> Any:
        """A boto3 S3 client for this server (path-style addressing, dummy credentials)."""
        import boto3
        import botocore.config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=botocore.config.Config(
                max_pool_connections=max_pool_connections, s3={"addressing_style": "path"}
            ),
        )

    def create_bucket(self, name: str) -> None:
        client = self.client()
        client.create_bucket(Bucket=name)
        client.close()

    def reset(self) -> None:
        """Drop every bucket and object: moto keeps them in memory (or spooled temp files), and
        a contender should not pay for the previous one's gigabyte."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=60):
            pass


@dataclass(frozen=True)
class BucketContents:
    objects: int
    bytes: int
    #: bytes of objects whose key ends in `.log` (the segment payload, as uploaded)
    log_objects: int
    log_bytes: int


def bucket_contents(client: Any, bucket: str) -> BucketContents:
    """Count what a contender left in its bucket (outside the timed section)."""
    objects = size = log_objects = log_bytes = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            objects += 1
            size += int(item["Size"])
            if item["Key"].endswith(".log"):
                log_objects += 1
                log_bytes += int(item["Size"])
    return BucketContents(objects, size, log_objects, log_bytes)


# --- sample logs ---------------------------------------------------------------------------


@dataclass
class SampleProducer:
    """Appends incompressible records to the partitions of one topic with `LogWriter`, round
    robin, a batch of `batch_records` records of `record_bytes` each at a time.

    Values are slices of one random pool (no compression, so bytes on disk are bytes to
    upload; generating fresh randomness per record would only measure the generator). Not
    thread-safe; one producer thread owns it. fsync is off: the benchmark's disk is scratch."""

    log_dir: Path
    topic: str
    partitions: int
    segment_bytes: int
    record_bytes: int = 64 * 1024
    batch_records: int = 16
    seed: int = 42
    segment_ms: int = 7 * 24 * 3600 * 1000
    writers: list[LogWriter] = field(init=False)
    appended_bytes: int = field(init=False, default=0)
    _next: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.record_bytes < 1 or self.batch_records < 1:
            raise ValueError("partitions, record_bytes and batch_records must be positive")
        rng = random.Random(self.seed)
        self._rng = rng
        self._pool = rng.randbytes(max(4 * MIB, 2 * self.record_bytes))
        topic_id = new_topic_id()  # one topic: every partition carries the same id
        self.writers = [
            LogWriter(
                self.log_dir / f"{self.topic}-{p}",
                segment_bytes=self.segment_bytes,
                segment_ms=self.segment_ms,
                fsync=False,
                topic_id=topic_id,
            )
            for p in range(self.partitions)
        ]

    def _value(self) -> bytes:
        start = self._rng.randrange(len(self._pool) - self.record_bytes)
        return self._pool[start : start + self.record_bytes]

    def append_batch(self) -> int:
        """One batch to the next partition; returns the bytes it took on disk."""
        writer = self.writers[self._next]
        self._next = (self._next + 1) % self.partitions
        records = [ProducerRecord(self._value()) for _ in range(self.batch_records)]
        size = writer.append(records).size
        self.appended_bytes += size
        return size

    def append_bytes(self, total: int) -> int:
        """Append batches until at least `total` bytes went to disk; returns how many did."""
        written = 0
        while written < total:
            written += self.append_batch()
        return written

    def publish_high_watermarks(self) -> None:
        """Everything appended is replicated: the high watermark is the log end offset."""
        write_high_watermarks(
            self.log_dir,
            {TopicPartition(self.topic, p): w.log_end_offset for p, w in enumerate(self.writers)},
            fsync=False,
        )

    def roll_all(self) -> None:
        """Close every active segment, so that all data is in closed, uploadable segments."""
        for writer in self.writers:
            writer.roll()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def write_sample_log(
    log_dir: Path,
    *,
    topic: str,
    partitions: int,
    total_bytes: int,
    segment_bytes: int,
    record_bytes: int = 64 * 1024,
    seed: int = 42,
) -> list[Path]:
    """A topic of about `total_bytes` spread evenly over `partitions`, every segment closed
    and below the high watermark, so one archiver pass uploads all of it. Returns the closed
    segments' `.log` files."""
    producer = SampleProducer(
        log_dir, topic, partitions, segment_bytes, record_bytes=record_bytes, seed=seed
    )
    try:
        producer.append_bytes(total_bytes)
        producer.roll_all()
        producer.publish_high_watermarks()
    finally:
        producer.close()
    return closed_segment_files(log_dir)


def closed_segment_files(log_dir: Path) -> list[Path]:
    """Every non-empty `.log` file under `log_dir` (the empty active segments left by a roll
    hold nothing to upload)."""
    return sorted(p for p in log_dir.glob("*/*.log") if p.stat().st_size > 0)


def tree_bytes(root: Path) -> int:
    """Bytes of every regular file under `root` (what the log holds on local disk)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            # a file deleted by local retention while we walked counts as gone
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def read_through(paths: Sequence[Path]) -> None:
    """Read every file once so all contenders start with it in the page cache."""
    for path in paths:
        with path.open("rb") as f:
            while f.read(8 * MIB):
                pass


# --- measuring and printing ------------------------------------------------------------------


def settle_heap() -> None:
    """Collect, then freeze out of later collections, what this process holds before a
    contender's clock starts. The harness holds the set-up's objects (clients, modules, the
    expected data); a consumer loop timed in the same process otherwise pays for full
    collections that walk them all (70-100 ms each, several per read, measured with
    `kafka_read.py`), a cost of the harness rather than of the contender. What the contender
    allocates itself is still collected as usual. Applied to every contender alike."""
    gc.collect()
    gc.freeze()


class Stopwatch:
    """`with Stopwatch() as sw: ...` then `sw.seconds` (monotonic wall time) and
    `sw.cpu_seconds`: CPU (user + system) of this process's threads and of the child
    processes that ended and were waited for inside the block, i.e. the client's side
    (a server still running, such as moto, is not counted)."""

    def __enter__(self) -> Stopwatch:
        self.seconds = self.cpu_seconds = 0.0
        self._cpu = self._cpu_now()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        self.cpu_seconds = self._cpu_now() - self._cpu

    @staticmethod
    def _cpu_now() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime


def mb_per_s(nbytes: int, seconds: float) -> float | None:
    """Throughput in MB/s (10**6 bytes), None when nothing was timed."""
    return round(nbytes / seconds / MB, 1) if seconds > 0 else None


def versions(*dists: str) -> dict[str, str]:
    """Python and the named distributions' versions (the tree's, when tiered is not installed)."""
    out = {"python": platform.python_version()}
    for dist in dists:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "source tree" if dist == "tiered" else "not installed"
    return out


def emit(report: dict[str, Any]) -> None:
    """Print the benchmark's one JSON object on stdout (progress goes to stderr)."""
    print(json.dumps(report, indent=2))


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


#: clock ticks per second of /proc/PID/stat's CPU times
TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def own_cpu_s() -> float:
    """User and system CPU seconds of this process (every thread) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: an integer of at least `minimum` (a clear usage error, not a
    traceback later in the set-up, for anything else)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def daemon_config(*, bucket: str, endpoint: str | None, log_dir: Path, cache_dir: Path,
                  cluster: str, sections: str = "") -> str:
    """A `tiered run` configuration over moto for the read benchmarks: `cluster` holds the
    [cluster] lines, `sections` any other sections (e.g. [kafka]). With no `endpoint`,
    `bucket` is a directory: a file:// bucket."""
    storage = (f'url = "file://{bucket}"\n' if endpoint is None else
               f'url = "s3://{bucket}"\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\n'
               'access_key = "testing"\nsecret_key = "testing"\n')
    return (f"""[storage]
{storage}
[log]
dirs = ["{log_dir}"]
retention = "advise"

[cache]
dir = "{cache_dir}"
""" + (f"\n{sections.strip()}\n" if sections else "")
            + f"\n[cluster]\nstorage_min_free_bytes = 0\n{cluster.strip()}\n")


#: `python -c` runs `tiered run` with the source tree given as its first argument (if any)
#: ahead of everything on sys.path. PYTHONPATH is not enough: `-c` puts the working directory
#: first, so a daemon started from another checkout would import that checkout's code. It
#: refuses to start when a package still comes from elsewhere.
_LAUNCH = """\
import sys
from pathlib import Path
tree = sys.argv.pop(1)
if tree:
    sys.path.insert(0, tree)
    import archiver, cache, manifests, tiered
    for package in (archiver, cache, manifests, tiered):
        if not Path(package.__file__).resolve().is_relative_to(Path(tree).resolve()):
            sys.exit(f"{package.__name__} was imported from {package.__file__}, not {tree}")
from tiered.cli.main import main
main()
"""


class DaemonProcess:
    """`tiered run` as a child process: its metrics/HTTP port, its CPU time, its log. Started
    on construction; `ready` (called until it holds, for 60 s) says it is serving."""

    def __init__(self, config: Path, log_path: Path,
                 ready: Callable[[DaemonProcess], bool] | None = None,
                 tree: Path | None = None) -> None:
        """`tree`: a source tree whose code the daemon runs instead of the installed one."""
        self.port = free_port()
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(tree or ""), "run",
             "--config", str(config), "--metrics-port", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env=fake_aws_env())
        check = ready or DaemonProcess.healthy
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"tiered run exited at start:\n{self.tail()}")
            try:
                if check(self):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"tiered run did not get ready in 60 s:\n{self.tail()}")

    def healthy(self) -> bool:
        """Whether /health answers (any status)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", "/health")
            conn.getresponse().read()
        finally:
            conn.close()
        return True

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def settle(self, timeout_s: float = 60.0) -> float:
        """Wait until the daemon's start-up work (probe, first archiver passes, manifest loads)
        is over: under 5% of a core for a second. Returns the seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            before = self.cpu_s()
            time.sleep(1.0)
            if self.cpu_s() - before < 0.05:
                break
        return round(time.monotonic() - start, 1)

    def metric(self, name: str) -> float:
        """One sample of the daemon's /metrics (0 when absent): `name` with its labels as
        /metrics prints them, e.g. `tiered_store_operations_total{path="read"}`."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                    timeout=30) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def archive_everything(config: Any) -> list[tuple[str, int]]:
    """Upload every closed segment of `config`'s log dirs with the real archiver (rounds until
    one uploads nothing); the (key, size) of every segment object in the bucket afterwards."""
    from archiver.service import Archiver
    from archiver.space import DiskInfo
    from tiered.store import S3Store

    store = S3Store(config.store_settings())
    archiver = Archiver(config, store, disk_usage=lambda _p: DiskInfo(1 << 40, 1 << 39))
    try:
        while True:  # a round takes a bounded number of segments per partition
            report = archiver.upload_round()
            if not report.ok:
                raise SystemExit(f"archiving failed: {report.errors}")
            if not any(r.uploaded_segments for r in report.partitions):
                break
        return sorted((i.key, i.size) for i in store.list("") if i.key.endswith(".log"))
    finally:
        archiver.close()
        store.close()
