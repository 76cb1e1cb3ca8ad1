"""Cluster mode with real processes: one `tiered run` beside each replica of a replicated log,
all sharing one bucket (design invariant 10: one uploader per partition, every closed byte
uploaded once, a holder that lost its lease can never commit again).

A broker stand-in writes the same record batches, byte for byte, to three replica log dirs,
each rolling its segments at its own size (as Kafka replicas do), and checkpoints the high
watermark in each. Sidecars run as child processes, each talking to the S3 server through a
proxy of its own (tests/faultproxy.py), which counts every byte it uploads and can hold its
uploads in flight. The scenario: two sidecars start, a third joins, the busiest holder is
killed -9 (and restarted), another is paused (SIGSTOP) in the middle of an upload until its
leases are taken over, then woken; at the end every record is read back from the bucket
alone and compared byte for byte, and no orphan may be left after the GC grace period.

`tests/test_app/test_cluster_processes.py` runs it small; `benchmarks/cluster.py` runs it at 3
sidecars x 24 partitions and reports upload amplification, failover time and lease requests.
"""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faultproxy import FaultProxy
from support.configs import s3_section
from support.processes import child_env, tiered_command

from manifests import keys
from manifests.collect import referenced_data_names
from manifests.commit import ManifestStore
from manifests.lease_objects import PartitionId, read_lease
from manifests.topic import load_topic_manifest
from tiered.config import load_config
from tiered.errors import OffsetOutOfRange, TieredError
from tiered.kafka.builder import encode_batch
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, write_high_watermarks
from tiered.kafka.records import Header, Record
from tiered.store import open_store
from tiered.store.base import ObjectStore

TOPIC = "events"


@dataclass
class Written:
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


#: each replica's segment size, bytes (replicas roll at other offsets)
SEGMENT_BYTES = (24_000, 31_000, 40_000)

@dataclass
class ClusterFigures:
    """What a run measured; `problems` lists every way it went wrong (empty: all held)."""

    seed: int
    sidecars: int = 0
    partitions: int = 0
    lease_ms: int = 0
    log_bytes: int = 0  # bytes of one replica's log (all partitions)
    bucket_segment_bytes: int = 0  # bytes of segment objects in the bucket at the end
    uploaded_segment_bytes: int = 0  # bytes of segment objects sent, lost races included
    bucket_amplification: float = 0.0
    upload_amplification: float = 0.0
    #: bytes sent again to a segment object the bucket keeps, beyond its first upload
    repeated_segment_bytes: int = 0
    #: bytes sent to segment objects the bucket does not keep: uploads a takeover, a fence
    #: or a kill made useless, collected as orphans
    lost_race_segment_bytes: int = 0
    #: leases that changed hands (taken over from a silent holder, or handed over)
    lease_changes: int = 0
    leases_after_start: dict[str, int] = field(default_factory=dict)
    leases_after_join: dict[str, int] = field(default_factory=dict)
    failover_lease_s: float | None = None  # kill -9 -> every lease of it held by another
    failover_upload_s: float | None = None  # kill -9 -> each of its partitions uploaded again
    takeover_after_pause_s: float | None = None
    fenced_after_wake: bool = False
    lease_requests: int = 0
    lease_requests_per_partition_per_minute: float = 0.0  # the whole run, handovers included
    lease_requests_steady_per_partition_per_minute: float = 0.0  # nothing changing hands
    records_written: int = 0
    records_verified: int = 0
    lost: int = 0
    orphans_left: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ReplicatedLog(threading.Thread):
    """The broker and its followers: appends the same encoded batches to every replica's
    partitions (each replica rolls at its own segment size) and checkpoints the high
    watermark in every replica after each round; remembers every record by offset."""

    def __init__(self, dirs: list[Path], partitions: int, segment_bytes: list[int],
                 rng: random.Random, *, batches_per_s: float, record_bytes: int) -> None:
        super().__init__(name="replicated-log", daemon=True)
        self.dirs, self.partitions, self.rng = dirs, partitions, rng
        self.segment_bytes = segment_bytes
        self.pause_s = 1 / batches_per_s
        self.record_bytes = record_bytes
        self.topic_id = uuid.UUID(int=rng.getrandbits(128))
        self.written: dict[int, dict[int, Written]] = {p: {} for p in range(partitions)}
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.ends = [0] * partitions
        self.lock = threading.Lock()
        self.writers = [[LogWriter(d / f"{TOPIC}-{p}", segment_bytes=segment_bytes[i],
                                   topic_id=self.topic_id, fsync=False)
                         for p in range(partitions)] for i, d in enumerate(dirs)]
        self.append_round()  # the partitions exist before any sidecar looks

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.append_round()
                time.sleep(self.pause_s)
            for replica in self.writers:  # the last segments close: all of it is uploadable
                for w in replica:
                    w.roll()
        except BaseException as exc:  # noqa: BLE001 - reported by the harness
            self.failure = exc
        finally:
            for replica in self.writers:
                for w in replica:
                    w.close()

    def append_round(self) -> None:
        writers = self.writers
        now = int(time.time() * 1000)
        for p in range(self.partitions):
            base = writers[0][p].log_end_offset
            records = []
            for i in range(self.rng.randint(1, 4)):
                key = None if self.rng.random() < 0.1 else self.rng.randbytes(8)
                headers = tuple(Header(f"h{j}", self.rng.randbytes(3))
                                for j in range(self.rng.randint(0, 2)))
                value = self.rng.randbytes(self.rng.randint(self.record_bytes // 2,
                                                            self.record_bytes))
                records.append(Record(base + i, now + i, key, value, headers))
            batch = encode_batch(records, base_offset=base, partition_leader_epoch=1)
            for replica in writers:
                replica[p].append_batches(batch)
            with self.lock:
                for r in records:
                    self.written[p][r.offset] = Written(
                        r.key, r.value or b"", tuple((h.key, h.value) for h in r.headers),
                        r.timestamp)
                self.ends[p] = records[-1].offset + 1
        for d in self.dirs:
            write_high_watermarks(d, {TopicPartition(TOPIC, p): self.ends[p]
                                      for p in range(self.partitions)}, fsync=False)

    def log_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.dirs[0].glob(f"{TOPIC}-*/*.log"))


def write_sidecar_config(path: Path, *, node: str, log_dir: Path, cache_dir: Path,
                         endpoint: str, bucket: str, lease_ms: int, grace_ms: int) -> Path:
    path.write_text(s3_section(endpoint, bucket, "cluster") + f"""
[log]
dirs = ["{log_dir}"]
retention = "enforce"

[cache]
dir = "{cache_dir}"

[node]
id = "{node}"

[cluster]
cloud_storage_upload_lease_ms = {lease_ms}
cloud_storage_gc_grace_period_ms = {grace_ms}
cloud_storage_housekeeping_interval_ms = 1000
cloud_storage_initial_backoff_ms = 5
retention_local_trim_interval = 500

[topics."{TOPIC}"]
"retention.local.target.bytes" = 65536
""")
    return path


class Sidecar:
    """One `tiered run` process beside one replica, through a proxy of its own."""

    def __init__(self, node: str, work: Path, log_dir: Path, moto: str, bucket: str, *,
                 lease_ms: int, grace_ms: int) -> None:
        self.node, self.work = node, work
        self.proxy = FaultProxy(moto).start()
        self.config = write_sidecar_config(
            work / f"{node}.toml", node=node, log_dir=log_dir, cache_dir=work / f"cache-{node}",
            endpoint=self.proxy.url, bucket=bucket, lease_ms=lease_ms, grace_ms=grace_ms)
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.work / f"{self.node}-{len(self.logs) + 1}.log"
        self.logs.append(log)
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                tiered_command("run", "--config", str(self.config), "--metrics-port", "0"),
                stdout=subprocess.DEVNULL, stderr=err, env=child_env())

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused process dies as well
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> int | None:
        """SIGTERM, then the exit status (None: it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def segment_puts(self) -> list[tuple[str, int]]:
        """(path, bytes) of each segment object upload this sidecar sent (single PUTs and
        multipart parts), faulted ones left out."""
        return [(s.path, s.size) for s in self.proxy.seen(method="PUT")
                if keys.SEGMENT_SUFFIX in s.path.rsplit("/", 1)[-1] and s.faulted is None]

    def uploaded_segment_bytes(self) -> int:
        """Bytes of segment objects this sidecar sent."""
        return sum(size for _path, size in self.segment_puts())

    def lease_requests(self) -> int:
        """Requests for node records and lease objects."""
        return sum(1 for s in self.proxy.seen()
                   if keys.NODE_RECORDS_PREFIX in s.path or s.path.endswith(keys.LEASE_NAME)
                   or ("prefix=" in s.query and "nodes" in s.query))

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 0.2
             ) -> float:
    """Poll `check` until it holds; the seconds it took. AssertionError naming `what` when it
    still does not hold after `timeout_s`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)
    return time.monotonic() - start


class Bucket:
    """The test's own view of the bucket, straight at the S3 server (`endpoint`: none of its
    requests passes a sidecar's proxy or counts as one), for leases and manifests."""

    def __init__(self, config: Path, endpoint: str, partitions: list[PartitionId]) -> None:
        self.config = load_config(config)
        settings = dataclasses.replace(self.config.store_settings(), endpoint_url=endpoint)
        self.store: ObjectStore = open_store(settings, probe=False)
        self.mstore = ManifestStore(self.store)
        self.partitions = partitions

    def holders(self) -> dict[PartitionId, tuple[str | None, int]]:
        out = {}
        for p in self.partitions:
            lease, _ = read_lease(self.store, p)
            out[p] = (None, 0) if lease is None else (lease.holder, lease.generation)
        return out

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for holder, _ in self.holders().values():
            if holder is not None:
                counts[holder] = counts.get(holder, 0) + 1
        return counts

    def head(self, p: PartitionId) -> tuple[int, int]:
        """(last offset, term) of the committed head manifest."""
        m, _ = self.mstore.load(p.topic, p.partition, p.revision)
        return m.last_offset, m.term

    def segment_objects(self) -> dict[str, int]:
        """Key -> size of the topic's segment objects in the bucket."""
        return {i.key: i.size for i in self.store.list() if i.key.endswith(keys.SEGMENT_SUFFIX)
                and f"/{keys.NAMESPACE}/{TOPIC}/" in i.key}

    def segment_bytes(self) -> int:
        return sum(self.segment_objects().values())

    def orphans(self) -> list[str]:
        """Objects under the partitions' prefixes that no manifest (or lease) names."""
        found = []
        for p in self.partitions:
            m, _ = self.mstore.load(p.topic, p.partition, p.revision)
            data = keys.partition_data_prefix(p.topic, p.partition, p.revision)
            named = {data + n for n in referenced_data_names(self.mstore, m)}
            found += [o.key for o in self.store.list(data) if o.key not in named]
            meta = keys.partition_meta_prefix(p.topic, p.partition, p.revision)
            referenced = self.mstore.referenced_archive_keys(m) | {
                m.key, p.lease_key, *keys.head_copy_keys(m.key)}  # the head's copies
            found += [o.key for o in self.store.list(meta) if o.key not in referenced]
        return found

    def close(self) -> None:
        self.store.close()


def run_cluster(work: Path, *, moto: str, bucket: str, seed: int, partitions: int = 6,
                lease_ms: int = 2000, grace_ms: int = 3000, batches_per_s: float = 20,
                record_bytes: int = 400, segment_bytes: tuple[int, int, int] = SEGMENT_BYTES,
                settle_s: float = 4.0, steady_s: float = 0.0,
                progress: Callable[[str], None] = lambda _: None) -> ClusterFigures:
    """The scenario of the module docstring; returns its figures (problems listed, never
    raised, except a wait that times out)."""
    from cache.reader import Reader

    rng = random.Random(seed)
    figures = ClusterFigures(seed, sidecars=3, partitions=partitions, lease_ms=lease_ms)
    started = time.monotonic()
    dirs = [work / f"replica-{i}" for i in range(3)]
    log = ReplicatedLog(dirs, partitions, list(segment_bytes), random.Random(rng.getrandbits(64)),
                        batches_per_s=batches_per_s, record_bytes=record_bytes)
    revision = _revision(dirs[0])
    pids = [PartitionId(TOPIC, p, revision) for p in range(partitions)]
    nodes = [Sidecar(f"n{i + 1}", work, dirs[i], moto, bucket, lease_ms=lease_ms,
                     grace_ms=grace_ms) for i in range(3)]
    n1, n2, n3 = nodes
    bucket_view = Bucket(n1.config, moto, pids)
    lease_s = lease_ms / 1000

    def spread(names: list[str]) -> bool:
        counts = bucket_view.counts()
        want = -(-partitions // len(names))
        return (sum(counts.get(n, 0) for n in names) == partitions
                and all(counts.get(n, 0) in (want - 1, want) for n in names))

    try:
        log.start()
        n1.start()
        n2.start()
        wait_for("two sidecars to share the leases", lambda: spread(["n1", "n2"]),
                 30 + 10 * lease_s)
        figures.leases_after_start = bucket_view.counts()
        progress(f"started: {figures.leases_after_start}")
        time.sleep(settle_s)

        n3.start()  # a sidecar joins
        wait_for("the joining sidecar to get its share", lambda: spread(["n1", "n2", "n3"]),
                 30 + 20 * lease_s)
        figures.leases_after_join = bucket_view.counts()
        progress(f"joined: {figures.leases_after_join}")
        # steady state: nothing changes hands, the leases cost only renewals and watching
        before = sum(n.lease_requests() for n in nodes)
        window = time.monotonic()
        time.sleep(max(settle_s, steady_s))
        figures.lease_requests_steady_per_partition_per_minute = round(
            (sum(n.lease_requests() for n in nodes) - before) / partitions
            / ((time.monotonic() - window) / 60), 2)

        # kill -9 of a holder: the others take its partitions over
        theirs = [p for p, (h, _) in bucket_view.holders().items() if h == "n1"]
        heads = {p: bucket_view.head(p)[0] for p in theirs}
        killed_at = time.monotonic()
        n1.kill()
        figures.failover_lease_s = round(wait_for(
            "n1's partitions to be taken over",
            lambda: all(bucket_view.holders()[p][0] not in (None, "n1") for p in theirs),
            30 + 10 * lease_s), 2)
        wait_for("n1's partitions to be uploaded again",
                 lambda: all(bucket_view.head(p)[0] > heads[p] for p in theirs), 60)
        figures.failover_upload_s = round(time.monotonic() - killed_at, 2)
        progress(f"failover: leases {figures.failover_lease_s} s, uploads "
                 f"{figures.failover_upload_s} s")
        n1.start()  # back, and joining again
        wait_for("n1 to get its share back", lambda: spread(["n1", "n2", "n3"]),
                 30 + 20 * lease_s)

        # SIGSTOP a holder in the middle of an upload, until its leases are taken over
        n2.proxy.hold(method="PUT", path_contains=keys.SEGMENT_SUFFIX)
        wait_for("n2 to start an upload", lambda: n2.proxy.waiting > 0, 60)
        held = {p: g for p, (h, g) in bucket_view.holders().items() if h == "n2"}
        n2.signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        figures.takeover_after_pause_s = round(wait_for(
            "n2's partitions to be taken over while it is paused",
            lambda: all(bucket_view.holders()[p][0] not in (None, "n2") for p in held),
            30 + 10 * lease_s), 2)
        n2.proxy.release_held()  # its upload lands while it still sleeps
        n2.signal(signal.SIGCONT)
        wait_for("n2 to find its commit refused or its leases gone",
                 lambda: "fenced" in n2.text() or "now held by" in n2.text(), 30 + 5 * lease_s)
        figures.fenced_after_wake = True
        for p, generation in held.items():
            if bucket_view.head(p)[1] <= generation:
                figures.problems.append(f"{p}: the head's term did not move past n2's "
                                        f"generation {generation}")
        progress(f"pause: taken over after {figures.takeover_after_pause_s} s "
                 f"({time.monotonic() - paused_at:.1f} s paused in all)")
        wait_for("n2 to get its share back", lambda: spread(["n1", "n2", "n3"]),
                 30 + 20 * lease_s)

        # the end: the log stops and rolls; everything closed goes up; orphans are collected
        log.stop.set()
        log.join(timeout=60)
        if log.failure is not None:
            figures.problems.append(f"the log writer failed: {log.failure!r}")
        ends = dict(enumerate(log.ends))
        wait_for("every record to be in the bucket",
                 lambda: all(bucket_view.head(p)[0] >= ends[p.partition] - 1 for p in pids), 120)
        figures.orphans_left = len(bucket_view.orphans())
        deadline = time.monotonic() + grace_ms / 1000 + 30
        while figures.orphans_left and time.monotonic() < deadline:
            time.sleep(0.5)
            figures.orphans_left = len(bucket_view.orphans())
        if figures.orphans_left:
            figures.problems.append(f"orphans left after the GC grace period: "
                                    f"{bucket_view.orphans()[:5]}")
    finally:
        log.stop.set()
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.signal(signal.SIGCONT)
            code = node.stop()
            if code not in (0, None):
                figures.problems.append(f"{node.node} exited {code}")
        for node in nodes:
            node.proxy.stop()
    texts = {n.node: n.text() for n in nodes}
    for name, text in texts.items():
        if "Traceback" in text:
            at = text.index("Traceback")
            figures.problems.append(f"{name} printed a traceback: {text[at:at + 1500]}")
    elapsed_min = (time.monotonic() - started) / 60
    figures.lease_requests = sum(n.lease_requests() for n in nodes)
    figures.lease_requests_per_partition_per_minute = round(
        figures.lease_requests / partitions / elapsed_min, 2)
    figures.log_bytes = log.log_bytes()
    figures.bucket_segment_bytes = bucket_view.segment_bytes()
    figures.uploaded_segment_bytes = sum(n.uploaded_segment_bytes() for n in nodes)
    figures.bucket_amplification = round(figures.bucket_segment_bytes / figures.log_bytes, 3)
    figures.upload_amplification = round(figures.uploaded_segment_bytes / figures.log_bytes, 3)
    by_name: dict[str, list[str]] = {}  # the bucket's segment keys by their last part
    for kept_key in bucket_view.segment_objects():
        by_name.setdefault(kept_key.rsplit("/", 1)[-1], []).append(kept_key)
    first_sent: set[str] = set()
    for node in nodes:
        for path, size in node.segment_puts():
            # path-style /bucket/<the store's prefix>/key: the kept key it ends with, if any
            key = next((k for k in by_name.get(path.rsplit("/", 1)[-1], [])
                        if path.endswith("/" + k)), None)
            if key is None:
                figures.lost_race_segment_bytes += size
            elif key in first_sent:
                figures.repeated_segment_bytes += size
            else:
                first_sent.add(key)
    figures.lease_changes = sum(text.count("took the upload lease over")
                                + text.count("released the upload lease")
                                for text in texts.values())

    # every record, from the bucket alone (a reader beside no log), byte for byte
    reader_config = load_config(write_sidecar_config(
        work / "reader.toml", node="reader", log_dir=work / "none", cache_dir=work / "rcache",
        endpoint=moto, bucket=bucket, lease_ms=lease_ms, grace_ms=grace_ms))
    reader = Reader(reader_config, bucket_view.store)
    try:
        topic = load_topic_manifest(bucket_view.store, TOPIC, revision)
        if topic is None or topic.partition_count != partitions:
            figures.problems.append(f"the topic manifest says {topic and topic.partition_count} "
                                    f"partitions, not {partitions}")
        for p in range(partitions):
            written = log.written[p]
            figures.records_written += len(written)
            try:
                got = _read_all(reader, p)
            except TieredError as exc:
                figures.problems.append(f"reading partition {p} back: {exc}")
                got = {}
            for offset, want in written.items():
                rec = got.get(offset)
                if rec is not None and rec == want:
                    figures.records_verified += 1
                else:
                    figures.lost += 1
                    if figures.lost <= 5:
                        figures.problems.append(f"partition {p} offset {offset}: {rec!r}")
    finally:
        reader.close()
        bucket_view.close()
    figures.seconds = round(time.monotonic() - started, 1)
    return figures


def _read_all(reader: Any, partition: int) -> dict[int, Written]:
    got: dict[int, Written] = {}
    offset = 0
    while True:
        try:
            res = reader.fetch(TOPIC, partition, offset, 4 << 20)
        except OffsetOutOfRange:
            return got  # past the end
        for r in res.records():
            got[r.offset] = Written(r.key, r.value or b"",
                                    tuple((h.key, h.value) for h in r.headers), r.timestamp)
        if res.next_offset <= offset:
            return got
        offset = res.next_offset


def _revision(log_dir: Path) -> str:
    from archiver.service import revision_of
    from tiered.kafka.local_log import LocalLog

    return revision_of(LocalLog([log_dir]).partition(TopicPartition(TOPIC, 0)))


def dump(figures: ClusterFigures) -> str:
    return json.dumps(figures.to_json(), indent=2)


def run_naive_baseline(work: Path, *, moto: str, bucket: str, seed: int, partitions: int,
                       seconds: float, batches_per_s: float = 20, record_bytes: int = 400,
                       segment_bytes: tuple[int, int, int] = SEGMENT_BYTES
                       ) -> dict[str, Any]:
    """What three sidecars without upload leases do (each uploading everything it holds, as
    if it were the only writer): the same replicated log, written for `seconds`, then three
    archivers pass over their replicas side by side until none uploads more. Returns the bytes
    each sent and the amplification."""
    from archiver.service import Archiver

    rng = random.Random(seed)
    dirs = [work / f"naive-{i}" for i in range(3)]
    log = ReplicatedLog(dirs, partitions, list(segment_bytes), random.Random(rng.getrandbits(64)),
                        batches_per_s=batches_per_s, record_bytes=record_bytes)
    log.start()
    time.sleep(seconds)
    log.stop.set()
    log.join(timeout=60)
    proxy = FaultProxy(moto).start()
    errors: list[str] = []
    try:
        def one(i: int) -> None:
            config = load_config(write_sidecar_config(
                work / f"naive-{i}.toml", node=f"naive{i}", log_dir=dirs[i],
                cache_dir=work / f"naive-cache-{i}", endpoint=proxy.url, bucket=bucket,
                lease_ms=30_000, grace_ms=3_600_000))
            with open_store(config.store_settings()) as store:
                archiver = Archiver(config, store)
                for _ in range(30):
                    report = archiver.run_once()
                    if not any(p.uploaded_segments for p in report.partitions):
                        break
                errors.extend(e for p in report.partitions if (e := p.error))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sent = sum(s.size for s in proxy.seen(method="PUT")
                   if keys.SEGMENT_SUFFIX in s.path.rsplit("/", 1)[-1] and s.faulted is None)
    finally:
        proxy.stop()
    log_bytes = log.log_bytes()
    return {"log_bytes": log_bytes, "uploaded_segment_bytes": sent,
            "upload_amplification": round(sent / log_bytes, 3),
            "partition_errors_seen": len(errors)}
