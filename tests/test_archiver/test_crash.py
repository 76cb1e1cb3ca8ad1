"""Crash safety (design invariant 8): `tiered run` is killed with SIGKILL at random moments while
it uploads to moto's S3 server, many times, with the log growing between restarts.

After every kill the committed manifests must already be sound -- every object they name is in
the bucket with the recorded size and CRC-32C (design invariant 1), offsets are contiguous and no
segment appears twice (design invariant 4), and every local segment that is gone is covered by them
(design invariant 2). After a final clean `tiered archive --once` (zero GC grace period) every
closed segment is in the bucket exactly once and no object is left that no manifest names (8).

Set TIERED_CRASH_SEED to replay a run; the seed is printed on failure.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest
from click.testing import CliRunner
from support.configs import s3_section
from support.processes import child_env, tiered_command

from archiver.service import revision_of
from manifests import ManifestSettings, ManifestStore, keys
from manifests.keys import INDEX_SUFFIXES
from tiered.cli.main import cli
from tiered.config import load_config
from tiered.kafka.checkpoints import TopicPartition, new_topic_id
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.kafka.segment import parse_segment_file_name
from tiered.store import PROBE_PREFIX, ObjectStore, open_store
from tiered.store.probe import probe_key

#: kill -9 of real daemon processes: the slow tier
pytestmark = pytest.mark.slow

TOPIC = "orders"
PARTITIONS = 3
SEGMENT_BYTES = 2048
KILL_ROUNDS = 8


@dataclass(frozen=True)
class Closed:
    """A closed local segment as it was when first seen (closed segments never change)."""

    base: int
    last: int
    size: int
    checksum: int


def _append(log_dir: Path, batches: int, rng: random.Random, topic_id: uuid.UUID) -> None:
    ends = {}
    for p in range(PARTITIONS):
        with LogWriter(log_dir / f"{TOPIC}-{p}", segment_bytes=SEGMENT_BYTES, topic_id=topic_id,
                       fsync=False) as w:
            for _ in range(batches):
                w.append([ProducerRecord(rng.randbytes(60), key=b"k%d" % i) for i in range(8)])
            ends[p] = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(TOPIC, p): e for p, e in ends.items()},
                          fsync=False)


def _observe(log_dir: Path, seen: dict[int, dict[int, Closed]]) -> None:
    """Record every closed segment on disk (all but the newest per partition)."""
    for p in range(PARTITIONS):
        part = log_dir / f"{TOPIC}-{p}"
        bases = sorted(b for f in part.iterdir()
                       if f.suffix == ".log" and (b := parse_segment_file_name(f.name)) is not None)
        for base, following in zip(bases, bases[1:], strict=False):
            if base not in seen[p]:
                data = (part / f"{base:020d}.log").read_bytes()
                seen[p][base] = Closed(base, following - 1, len(data), crc32c.crc32c(data))


def _check_manifests(store: ObjectStore, mstore: ManifestStore, log_dir: Path,
                     seen: dict[int, dict[int, Closed]], where: str,
                     verified: set[tuple[str, int]]) -> dict[int, list[Closed]]:
    """Invariants 1, 2 and 4 against the committed manifests; partition -> their segments.
    Objects already verified (`verified`: key and checksum) are not downloaded again."""
    out = {}
    for part in LocalLog([log_dir]):
        m, _ = mstore.load(TOPIC, part.partition, revision_of(part))
        segs = list(mstore.iter_segments(m))
        p = part.partition
        bases = [s.base_offset for s in segs]
        assert len(bases) == len(set(bases)), f"{where}: p{p}: a segment is in twice: {bases}"
        if segs:
            assert segs[0].base_offset == 0, f"{where}: p{p}: manifest starts at {bases[0]}"
        for a, b in zip(segs, segs[1:], strict=False):
            assert b.base_offset == a.last_offset + 1, f"{where}: p{p}: gap/overlap at {a}, {b}"
        for s in segs:
            key = m.segment_key(s)
            # design invariant 1: named => fully in the bucket
            if (key, s.checksum) not in verified:
                data = store.get(key)
                assert (len(data), crc32c.crc32c(data)) == (s.size_bytes, s.checksum), where
                verified.add((key, s.checksum))
            local = seen[p].get(s.base_offset)
            assert local is not None, f"{where}: p{p}: {s.base_offset} was never a local segment"
            assert (local.last, local.size, local.checksum) == (
                s.last_offset, s.size_bytes, s.checksum), f"{where}: p{p}: bytes differ"
        covered = m.last_offset if segs else -1
        present = {s.base_offset for s in part.segments}
        for closed in seen[p].values():
            if closed.base not in present:  # design invariant 2: gone locally => in the manifest
                assert closed.last <= covered, (
                    f"{where}: p{p}: local segment {closed.base}..{closed.last} deleted but the "
                    f"manifest covers only up to {covered}")
        out[p] = [seen[p][s.base_offset] for s in segs]
    return out


def _orphans(store: ObjectStore, mstore: ManifestStore, log_dir: Path) -> list[str]:
    """Objects under the partitions' data prefixes that no manifest names."""
    orphans = []
    for part in LocalLog([log_dir]):
        rev = revision_of(part)
        m, _ = mstore.load(TOPIC, part.partition, rev)
        prefix = keys.partition_data_prefix(TOPIC, part.partition, rev)
        named = set()
        for s in mstore.iter_segments(m):
            named.add(m.segment_key(s))
            named |= {prefix + keys.index_name(s.object_name, kind) for kind in INDEX_SUFFIXES}
        orphans += [o.key for o in store.list(prefix) if o.key not in named]
        meta = keys.partition_meta_prefix(TOPIC, part.partition, rev)
        referenced = mstore.referenced_archive_keys(m) | {
            keys.partition_manifest_key(TOPIC, part.partition, rev),
            keys.partition_lease_key(TOPIC, part.partition, rev),  # the upload lease
            *keys.head_copy_keys(keys.partition_manifest_key(TOPIC, part.partition, rev))}
        orphans += [o.key for o in store.list(meta) if o.key not in referenced]
    return orphans


def test_kill_9_during_uploads_loses_nothing(moto_endpoint: str, s3_bucket: str,
                                            tmp_path: Path) -> None:
    seed = int(os.environ.get("TIERED_CRASH_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    log_dir = tmp_path / "log"
    config_path = tmp_path / "tiered.toml"
    config_path.write_text(s3_section(moto_endpoint, s3_bucket) + f"""
[log]
dirs = ["{log_dir}"]
retention = "enforce"

[cluster]
cloud_storage_gc_grace_period_ms = 0
cloud_storage_housekeeping_interval_ms = 700
retention_local_trim_interval = 300
retention_local_strict = true
cloud_storage_initial_backoff_ms = 5

[topics."{TOPIC}"]
"retention.local.target.bytes" = {8 * SEGMENT_BYTES}
""")
    config = load_config(config_path)
    store = open_store(config.store_settings(), probe=False)
    mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
    seen: dict[int, dict[int, Closed]] = {p: {} for p in range(PARTITIONS)}
    verified: set[tuple[str, int]] = set()
    killed_while_uploading = 0
    orphans_seen = 0
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log

    topic_id = new_topic_id()
    _append(log_dir, 45, rng, topic_id)
    try:
        for round_ in range(KILL_ROUNDS):
            where = f"seed {seed}, after kill {round_ + 1}"
            _observe(log_dir, seen)
            stderr = tmp_path / f"run-{round_}.log"
            with stderr.open("w") as err:
                proc = subprocess.Popen(
                    tiered_command("run", "--config", str(config_path), "--metrics-port", "0"),
                    stdout=subprocess.DEVNULL, stderr=err, env=child_env())
            try:
                if round_ % 4 != 3:  # mostly: once uploads are going, at a random moment
                    deadline = time.monotonic() + 20
                    while "uploaded " not in stderr.read_text() and proc.poll() is None:
                        assert time.monotonic() < deadline, f"{where}: no upload started"
                        time.sleep(0.01)
                    time.sleep(rng.uniform(0.0, 0.3))
                else:  # sometimes: anywhere from start-up on (the probe, the first scan)
                    time.sleep(rng.uniform(0.2, 1.5))
                assert proc.poll() is None, f"{where}: the daemon exited: {stderr.read_text()}"
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            text = stderr.read_text()
            assert "Traceback" not in text, f"{where}:\n{text}"
            killed_while_uploading += "uploaded " in text
            _check_manifests(store, mstore, log_dir, seen, where, verified)
            orphans_seen += len(_orphans(store, mstore, log_dir))
            _append(log_dir, rng.randint(15, 30), rng, topic_id)  # the broker keeps writing

        _observe(log_dir, seen)
        # each pass may bound its uploads per partition. A daemon killed just after it renewed
        # its node's record but before it took any lease leaves `archive --once` on standby
        # ("uploader: none yet") until that record's lease lapses: wait that out
        lease_s = config.cluster_int("cloud_storage_upload_lease_ms", 30_000) / 1000
        lapsed = time.monotonic() + lease_s + 15
        while True:
            done = CliRunner().invoke(cli, ["-q", "archive", "--once", "--config",
                                            str(config_path), "--json"])
            assert done.exit_code == 0, f"seed {seed}: {done.output}"
            report = json.loads(done.stdout)
            standby = [part for part in report["partitions"] if part["decision"] == "standby"]
            if report["uploaded_segments"] == 0 and not standby:
                break
            assert time.monotonic() < lapsed, f"seed {seed}: still on standby: {standby}"
            if report["uploaded_segments"] == 0:
                time.sleep(0.5)

        final = _check_manifests(store, mstore, log_dir, seen, f"seed {seed}, final", set())
        for p in range(PARTITIONS):
            # every closed segment is in the bucket exactly once: nothing lost, no duplicates
            assert final[p] == sorted(seen[p].values(), key=lambda c: c.base), f"seed {seed}"
        assert _orphans(store, mstore, log_dir) == [], f"seed {seed}: orphans survived GC"
        # (a kill during the start-up conditional-write probe can leave a probe object:
        # test_a_probe_object_left_by_a_crash_is_collected covers that case on its own)
        waited = sum(1 for r in range(KILL_ROUNDS) if r % 4 != 3)
        assert killed_while_uploading >= waited, f"seed {seed}: kills missed the uploads"
        print(f"seed {seed}: {killed_while_uploading}/{KILL_ROUNDS} kills during uploads, "
              f"{orphans_seen} orphan observations, "
              f"{sum(len(v) for v in seen.values())} segments")
    finally:
        store.close()


def test_a_probe_object_left_by_a_crash_is_collected(moto_endpoint: str, s3_bucket: str,
                                                     tmp_path: Path) -> None:
    """Invariant 8 for the start-up probe: kill -9 between its conditional put and its delete
    (simulated by writing the object a crashed probe left an hour ago), then the next start-up
    collects it and leaves no object under the probe prefix."""
    log_dir = tmp_path / "log"
    _append(log_dir, 5, random.Random(0), new_topic_id())
    config_path = tmp_path / "tiered.toml"
    config_path.write_text(
        f'[storage]\nurl = "s3://{s3_bucket}"\nendpoint_url = "{moto_endpoint}"\n'
        'region = "us-east-1"\naccess_key = "testing"\nsecret_key = "testing"\n'
        f'[log]\ndirs = ["{log_dir}"]\n[cluster]\ncloud_storage_gc_grace_period_ms = 0\n'
    )
    with open_store(load_config(config_path).store_settings(), probe=False) as store:
        store.put(probe_key(time.time() - 3600), b"tiered conditional-write probe 1",
                  if_none_match=True)
        result = CliRunner().invoke(cli, ["-q", "archive", "--once", "--config",
                                          str(config_path)])
        assert result.exit_code == 0, result.output
        assert [o.key for o in store.list(PROBE_PREFIX)] == []
