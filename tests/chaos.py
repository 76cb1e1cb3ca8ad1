"""Several writers on one bucket, faults and kill -9, then proof that nothing was lost.

The scenario (`run_chaos`): moto's S3 server behind the fault proxy, which fails a share of
requests at random (slow-downs, 500s, dropped connections, answers lost after the store acted);
a broker stand-in appending batches live to a Kafka log (segments roll, the leader epoch goes
up now and then, the high watermark is checkpointed after every batch); `tiered run` killed
with SIGKILL at random moments and restarted, while a second `tiered run` works the same log
dir and bucket, `tiered archive --once` runs beside them, and `tiered merge` merges a quiet
topic, all in enforce mode with short intervals and a short garbage-collection grace so
collection runs many times. Then everything stops, a last `archive --once` (grace 0) uploads
and collects what is left, and the run checks that every record ever written reads back
byte-identical through `tiered fetch`, that every object every manifest names exists with its
size and CRC-32C, and that `tiered scrub` finds nothing.

All randomness comes from one seed, printed at the start and in every failure. Used by
tests/test_chaos.py (about a minute) and benchmarks/soak.py (as long as asked).
"""

from __future__ import annotations

import base64
import json
import logging
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

import crc32c
from click.testing import CliRunner
from faultproxy import DROP, DROP_AFTER, FaultProxy
from support.configs import s3_section
from support.processes import child_env, tiered_command

from manifests import ManifestStore
from tiered.cli.main import cli
from tiered.config import load_config
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.kafka.records import Header
from tiered.store import open_store

BUSY, QUIET = "busy", "quiet"
#: small enough that segments roll every few seconds at the stand-in's rate (~70 records/s)
SEGMENT_BYTES = 16 * 1024
FAULT_KINDS = ("slowdown", "internal", DROP, DROP_AFTER)


@dataclass
class ChaosFigures:
    """What a run did and found; `lost` and `dangling` must be 0."""

    seed: int
    seconds: float = 0.0
    cycles: int = 0
    kills: int = 0
    second_daemon_kills: int = 0
    unexpected_exits: int = 0
    archive_once_runs: int = 0
    merges: int = 0
    merged_runs: int = 0
    epochs: int = 1
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    records_written: int = 0
    records_verified: int = 0
    lost: int = 0
    dangling: int = 0
    objects_checked: int = 0
    scrub_ok: bool = False
    scrub_anomalies: int = 0
    deleted_orphan_lines: int = 0
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Written:
    """One record as the broker stand-in wrote it."""

    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


class Broker(threading.Thread):
    """Appends batches to `busy`-0 and checkpoints the high watermark after each, bumping the
    leader epoch now and then; remembers every record by offset."""

    def __init__(self, log_dir: Path, rng: random.Random, topic_id: uuid.UUID) -> None:
        super().__init__(name="chaos-broker", daemon=True)
        self.log_dir = log_dir
        self.rng = rng
        self.topic_id = topic_id
        self.written: dict[int, Written] = {}
        self.epochs = 1
        self.stop = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with LogWriter(self.log_dir / f"{BUSY}-0", segment_bytes=SEGMENT_BYTES,
                           topic_id=self.topic_id, fsync=False) as w:
                w.become_leader(1)
                while not self.stop.is_set():
                    self._append(w)
                    if self.rng.random() < 0.01:
                        w.become_leader(w.leader_epoch + 1)  # a new leader: a new term
                        self.epochs += 1
                    time.sleep(self.rng.uniform(0.02, 0.08))
                w.roll()  # the last segment closes, so the final pass uploads every record
        except BaseException as exc:  # noqa: BLE001 - reported by the harness
            self.failure = exc

    def _append(self, w: LogWriter) -> None:
        n = self.rng.randint(1, 6)
        now = int(time.time() * 1000)
        batch = []
        for _ in range(n):
            key = None if self.rng.random() < 0.1 else self.rng.randbytes(8)
            value = self.rng.randbytes(self.rng.randint(10, 300))
            headers = tuple(Header(f"h{i}", self.rng.randbytes(4))
                            for i in range(self.rng.randint(0, 2)))
            batch.append(ProducerRecord(value, key=key, headers=headers,
                                        timestamp=now + self.rng.randint(0, 5)))
        done = w.append(batch)
        for offset, rec in zip(range(done.base_offset, done.last_offset + 1), batch,
                               strict=True):
            assert rec.value is not None and rec.timestamp is not None
            self.written[offset] = Written(rec.key, rec.value,
                                           tuple((h.key, h.value) for h in rec.headers),
                                           rec.timestamp)
        write_high_watermarks(self.log_dir, {TopicPartition(BUSY, 0): w.log_end_offset},
                              fsync=False)


def write_quiet_topic(log_dir: Path, rng: random.Random, topic_id: uuid.UUID
                      ) -> dict[int, Written]:
    """Many small closed segments that will not change: merge material. Returns every record
    by offset, so what the merges rewrote is read back too."""
    written: dict[int, Written] = {}
    now = int(time.time() * 1000)
    with LogWriter(log_dir / f"{QUIET}-0", segment_bytes=1024, topic_id=topic_id,
                   fsync=False) as w:
        w.become_leader(1)
        for i in range(120):
            value = rng.randbytes(100)
            done = w.append([ProducerRecord(value, key=b"q", timestamp=now + i)])
            written[done.base_offset] = Written(b"q", value, (), now + i)
        end = w.log_end_offset
        w.roll()
    write_high_watermarks(log_dir, {TopicPartition(QUIET, 0): end}, fsync=False)
    return written


def write_config(path: Path, *, endpoint: str, bucket: str, log_dir: Path, cache_dir: Path,
                 grace_ms: int) -> Path:
    path.write_text(s3_section(endpoint, bucket, "chaos") + f"""
[log]
dirs = ["{log_dir}"]
retention = "enforce"

[cache]
dir = "{cache_dir}"

[cluster]
cloud_storage_gc_grace_period_ms = {grace_ms}
cloud_storage_housekeeping_interval_ms = 500
retention_local_trim_interval = 300
retention_local_strict = true
cloud_storage_initial_backoff_ms = 5
cloud_storage_segment_max_upload_interval_sec = 2

[topics."{BUSY}"]
"retention.local.target.bytes" = {3 * SEGMENT_BYTES}

[topics."{QUIET}"]
"segment.bytes" = 8192
"retention.local.target.bytes" = 2048
""")
    return path


class Daemon:
    """One `tiered run` process, restartable; its stderr goes to numbered files."""

    def __init__(self, name: str, config: Path, work: Path) -> None:
        self.name, self.config, self.work = name, config, work
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.logs: list[Path] = []

    def start(self) -> None:
        self.starts += 1
        log = self.work / f"{self.name}-{self.starts}.log"
        self.logs.append(log)
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                tiered_command("run", "--config", str(self.config), "--metrics-port", "0"),
                stdout=subprocess.DEVNULL, stderr=err, env=child_env())

    def kill(self) -> bool:
        """SIGKILL; False when it had exited by itself (an unexpected exit)."""
        assert self.proc is not None
        alive = self.proc.poll() is None
        if alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        return alive

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def _archive_once(config: Path) -> tuple[int, str, str]:
    """One `tiered archive --once` in its own process (as an operator runs it)."""
    argv = tiered_command("-q", "archive", "--once", "--config", str(config), "--json")
    run = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=1800)
    return run.returncode, run.stdout, run.stderr


def run_chaos(work: Path, *, seed: int, seconds: float, endpoint: str, bucket: str,
              merges: int = 2, fault_rate: float = 0.03, grace_ms: int = 1500,
              kill_every: tuple[float, float] = (1.5, 4.0), min_cycles: int = 0,
              min_archive_once: int = 0, max_seconds: float | None = None,
              progress: Callable[[str], None] = lambda _: None) -> ChaosFigures:
    """Run the scenario for at least `seconds` and until `min_cycles` kill cycles, every
    merge and `min_archive_once` one-shot passes are done (a busy machine makes each one
    slower, not less needed), at most `max_seconds`; then verify and return the figures.
    `endpoint` is moto's (the daemons reach it through a fault proxy)."""
    rng = random.Random(seed)
    figures = ChaosFigures(seed)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    started = time.monotonic()
    log_dir, cache = work / "log", work / "cache"
    log_dir.mkdir(parents=True, exist_ok=True)
    proxy = FaultProxy(endpoint).start()
    proxy.record = False
    config = write_config(work / "tiered.toml", endpoint=proxy.url, bucket=bucket,
                          log_dir=log_dir, cache_dir=cache, grace_ms=grace_ms)
    final_config = write_config(work / "final.toml", endpoint=endpoint, bucket=bucket,
                                log_dir=log_dir, cache_dir=cache, grace_ms=0)
    quiet = write_quiet_topic(log_dir, rng, uuid.UUID(int=rng.getrandbits(128)))
    broker = Broker(log_dir, random.Random(rng.getrandbits(64)),
                    uuid.UUID(int=rng.getrandbits(128)))
    a, b = Daemon("daemon-a", config, work), Daemon("daemon-b", config, work)
    try:
        proxy.chaos(fault_rate, FAULT_KINDS, rng.getrandbits(64))
        broker.start()
        a.start()
        b.start()
        merge_at = sorted(rng.uniform(0.2, 0.8) * seconds for _ in range(merges))
        next_archive = time.monotonic() + rng.uniform(2, 5)
        deadline = time.monotonic() + seconds
        hard_deadline = deadline - seconds + max(seconds, max_seconds or seconds)

        def more() -> bool:
            now = time.monotonic()
            if now < deadline:
                return True
            return now < hard_deadline and (figures.cycles < min_cycles or bool(merge_at) or
                                            figures.archive_once_runs < min_archive_once)

        while more():
            time.sleep(rng.uniform(*kill_every))
            figures.cycles += 1
            figures.kills += 1
            if not a.kill():
                figures.unexpected_exits += 1
            if rng.random() < 0.3:  # now and then the second daemon dies too
                figures.second_daemon_kills += 1
                if not b.kill():
                    figures.unexpected_exits += 1
                b.start()
            a.start()
            elapsed = time.monotonic() - (deadline - seconds)
            if merge_at and elapsed >= merge_at[0]:
                merge_at.pop(0)
                code, out, err = _cli("-q", "merge", "--config", str(config), "--topic", QUIET,
                                      "--json")
                figures.merges += 1
                if code == 0:
                    figures.merged_runs += json.loads(out).get("runs_committed", 0)
                progress(f"merge exit {code}: {out.strip()[-300:]} {err.strip()[-300:]}")
            if time.monotonic() >= next_archive:
                code, _, err = _archive_once(config)
                figures.archive_once_runs += 1
                next_archive = time.monotonic() + rng.uniform(3, 8)
                if code not in (0, 1):  # 1: a pass with partition errors (faults), not a crash
                    figures.problems.append(f"archive --once exited {code}: {err[-500:]}")
            progress(f"cycle {figures.cycles}: {len(broker.written)} records written")
    finally:
        broker.stop.set()
        broker.join(timeout=30)
        for d in (a, b):
            if d.proc is not None and d.proc.poll() is None:
                d.kill()
        proxy.calm()
        figures.faults_by_kind = dict(proxy.faults_by_kind)
        proxy.stop()
    if broker.failure is not None:
        figures.problems.append(f"the broker stand-in failed: {broker.failure!r}")
    figures.epochs = broker.epochs
    figures.records_written = len(broker.written)
    logs = a.text() + b.text()
    figures.deleted_orphan_lines = logs.count("orphaned object(s)")
    if "Traceback" in logs:
        at = logs.index("Traceback")
        figures.problems.append(f"a daemon printed a traceback: {logs[at:at + 1500]}")

    # -- the last pass: everything closed goes up, leftovers are collected (grace 0) ---------
    for _ in range(20):
        code, out, err = _archive_once(final_config)
        if code != 0:
            figures.problems.append(f"final archive --once exited {code}: {err[-800:]}")
            break
        if json.loads(out)["uploaded_segments"] == 0:
            break
    figures.records_written += len(quiet)
    _verify(final_config, {BUSY: broker.written, QUIET: quiet}, figures)
    figures.seconds = round(time.monotonic() - started, 1)
    return figures


def _fetch_all(config: Path, topic: str) -> dict[int, dict[str, Any]]:
    """Every record of `topic`-0 through `tiered fetch`, by offset."""
    got: dict[int, dict[str, Any]] = {}
    offset = 0
    while True:
        code, out, err = _cli("-q", "fetch", "--config", str(config), "--topic", topic,
                              "--partition", "0", "--offset", str(offset), "--max-bytes",
                              str(16 << 20))
        if code == 4:  # past the end
            return got
        if code != 0:
            raise AssertionError(f"fetch {topic} at {offset} exited {code}: {err.strip()}")
        lines = [json.loads(line) for line in out.splitlines() if line]
        if not lines:
            return got
        for line in lines:
            got[line["offset"]] = line
        offset = max(got) + 1


def _decode(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


def _verify(config: Path, topics: dict[str, dict[int, Written]], figures: ChaosFigures) -> None:
    for topic, written in topics.items():
        _read_back(config, topic, written, figures)
    _check_objects(config, figures)
    _scrub(config, figures)


def _read_back(config: Path, topic: str, written: dict[int, Written],
               figures: ChaosFigures) -> None:
    """Every record written to `topic` through `tiered fetch`, byte for byte."""
    try:
        got = _fetch_all(config, topic)
    except AssertionError as exc:
        figures.problems.append(str(exc))
        got = {}
    for offset, want in written.items():
        line = got.get(offset)
        ok = (line is not None
              and _decode(line["key"]) == want.key
              and _decode(line["value"]) == want.value
              and line["timestamp"] == want.timestamp
              and tuple((h["key"], _decode(h["value"])) for h in line["headers"])
              == want.headers)
        if ok:
            figures.records_verified += 1
        else:
            figures.lost += 1
            if figures.lost <= 5:
                figures.problems.append(f"{topic} record {offset} does not read back: {line!r}")


def _check_objects(config: Path, figures: ChaosFigures) -> None:
    """Every object every manifest names exists with its size and CRC-32C; a manifest that
    cannot be walked (an archived manifest missing) is a finding too."""
    cfg = load_config(config)
    with open_store(cfg.store_settings(), probe=False) as store:
        mstore = ManifestStore(store)
        for topic in (BUSY, QUIET):
            part = log_dir_revision(cfg.log_dirs[0], topic)
            m, etag = mstore.load(topic, 0, part)
            if etag is None:
                figures.problems.append(f"{topic}/0 has no manifest in the bucket")
                continue
            try:
                named = [(seg, m.segment_key(seg)) for seg in mstore.iter_segments(m)]
            except Exception as exc:  # noqa: BLE001 - e.g. an archived manifest is missing
                figures.dangling += 1
                figures.problems.append(f"{topic}/0: the manifest cannot be walked: {exc}")
                continue
            named += [(r.segment, m.segment_key(r.segment)) for r in m.replaced]
            for seg, key in named:
                figures.objects_checked += 1
                try:
                    data = store.get(key)
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    figures.dangling += 1
                    figures.problems.append(f"{key} named by a manifest: {exc}")
                    continue
                if len(data) != seg.size_bytes or crc32c.crc32c(data) != seg.checksum:
                    figures.dangling += 1
                    figures.problems.append(f"{key}: size or CRC differs from the manifest")


def _scrub(config: Path, figures: ChaosFigures) -> None:
    code, out, err = _cli("-q", "scrub", "--config", str(config), "--json")
    try:
        summary = json.loads(out)
        figures.scrub_ok = bool(summary["ok"]) and code == 0
        figures.scrub_anomalies = len(summary["anomalies"])
        if not figures.scrub_ok:
            figures.problems.append(f"scrub: {summary['anomalies'][:5]} {summary['errors'][:5]}")
    except (ValueError, KeyError):
        figures.problems.append(f"scrub exited {code}: {err[-800:]}")


def log_dir_revision(log_dir: Path, topic: str) -> str:
    """The partition's revision as the archiver names it (the topic id)."""
    from archiver.service import revision_of
    from tiered.kafka.local_log import LocalLog

    part = LocalLog([log_dir]).partition(TopicPartition(topic, 0))
    return revision_of(part)
