"""Two archivers beside two replicas of the same partitions (byte-identical batches, different
roll points), sharing one bucket through upload leases: design invariant 10 (one uploader per
partition, a new holder continues exactly where the manifest ends) and invariant 2 (a standby
deletes local data only below what the committed manifest covers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.archiving import Clock, Disk, config_over

from archiver.lease_keeper import LeaseKeeper
from archiver.service import Archiver
from cache.reader import Reader
from manifests.commit import ManifestStore
from manifests.lease_objects import PartitionId
from manifests.topic import load_topic_manifest
from tiered.kafka.builder import encode_batch
from tiered.kafka.checkpoints import TopicPartition, topic_id_to_str
from tiered.kafka.log_writer import LogWriter, write_high_watermarks
from tiered.kafka.records import Record
from tiered.kafka.segment import parse_segment_file_name
from tiered.store.base import ObjectStore

TOPIC = "orders"
LEASE_MS = 3000
TOPIC_ID = uuid.UUID(int=42)
REVISION = topic_id_to_str(TOPIC_ID)


def write_replicas(dirs: list[Path], segment_bytes: list[int], *, partitions: int,
                   batches: int) -> dict[tuple[int, int], bytes]:
    """The same batches into every replica, each rolling at its own size; returns every
    record's value by (partition, offset)."""
    values: dict[tuple[int, int], bytes] = {}
    writers = [[LogWriter(d / f"{TOPIC}-{p}", segment_bytes=size, topic_id=TOPIC_ID,
                          fsync=False) for p in range(partitions)]
               for d, size in zip(dirs, segment_bytes, strict=True)]
    for p in range(partitions):
        for _ in range(batches):
            base = writers[0][p].log_end_offset
            records = [Record(base + i, 1_700_000_000_000 + base + i, None,
                              f"{p}-{base + i}-".encode() * 40) for i in range(4)]
            batch = encode_batch(records, base_offset=base, partition_leader_epoch=1)
            for replica in writers:
                replica[p].append_batches(batch)
            values.update({(p, r.offset): r.value or b"" for r in records})
    for d, replica in zip(dirs, writers, strict=True):
        write_high_watermarks(d, {TopicPartition(TOPIC, p): w.log_end_offset
                                  for p, w in enumerate(replica)}, fsync=False)
        for w in replica:
            w.close()
    return values


@dataclass
class Side:
    """One sidecar in process: its archiver and its lease keeper."""

    name: str
    archiver: Archiver
    keeper: LeaseKeeper
    log_dir: Path

    def partition_of_mine(self) -> PartitionId:
        return sorted(self.keeper.holdings())[0]


class Mono:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def cluster(tmp_path: Path, store: ObjectStore) -> Iterator[tuple[list[Side], Mono, dict]]:
    dirs = [tmp_path / "r1", tmp_path / "r2"]
    values = write_replicas(dirs, [4096, 6000], partitions=2, batches=40)
    mono = Mono()
    sides = []
    for name, d in zip(("a", "b"), dirs, strict=True):
        config = config_over(tmp_path / name, log_dir=d, cluster={"retention_local_strict": True},
                             topics={TOPIC: {"retention.local.target.bytes": 1}})
        archiver = Archiver(config, store, clock=Clock(), disk_usage=Disk())
        keeper = LeaseKeeper(store, ManifestStore(store), name, LEASE_MS, clock=mono,
                             wall=lambda: 1.7e9 + mono.t)
        keeper.bind(archiver.idle)
        archiver.ownership = keeper
        keeper.publish(archiver.replicas())
        sides.append(Side(name, archiver, keeper, d))
    settle(mono, sides)
    yield sides, mono, values
    for s in sides:
        s.archiver.close()


def settle(mono: Mono, sides: list[Side]) -> None:
    for _ in range(20):
        for s in sides:
            s.keeper.tick()
        mono.t += LEASE_MS / 6000
    assert sorted(len(s.keeper.holdings()) for s in sides) == [1, 1]


def drain(archiver: Archiver) -> list[str]:
    """Upload rounds until nothing goes up; every decision seen."""
    decisions = []
    for _ in range(20):
        report = archiver.upload_round()
        decisions += [p.decision for p in report.partitions]
        assert not any(p.error for p in report.partitions), report.partitions
        if not any(p.uploaded_segments for p in report.partitions):
            return decisions
    raise AssertionError("still uploading")


def closed_bytes(log_dir: Path, partition: int) -> int:
    files = sorted((log_dir / f"{TOPIC}-{partition}").glob("*.log"))
    return sum(f.stat().st_size for f in files[:-1])


def read_all(store: ObjectStore, tmp_path: Path, partition: int) -> dict[int, bytes]:
    config = config_over(tmp_path / "reader", log_dir=tmp_path / "empty")
    got: dict[int, bytes] = {}
    with Reader(config, store) as reader:
        offset = 0
        while True:
            try:
                res = reader.fetch(TOPIC, partition, offset, 1 << 20)
            except Exception:  # past the end
                return got
            got.update({r.offset: r.value or b"" for r in res.records()})
            offset = res.next_offset


def test_each_partition_is_uploaded_by_its_holder_only(
        cluster: tuple[list[Side], Mono, dict], store: ObjectStore) -> None:
    sides, _, _ = cluster
    for side in sides:
        decisions = drain(side.archiver)
        assert "standby" in decisions  # the other partition is the other node's
    mstore = ManifestStore(store)
    for side in sides:
        pid = side.partition_of_mine()
        m, _ = mstore.load(pid.topic, pid.partition, pid.revision)
        # every closed byte of the holder's replica went up once, under its lease's term
        assert m.cloud_bytes == closed_bytes(side.log_dir, pid.partition)
        assert {s.writer_term for s in m.segments} == {side.keeper.holdings()[pid]}
        rows = {r["partition"]: r for r in side.archiver.describe(TOPIC)}
        assert rows[pid.partition]["role"] == "uploader"
        assert rows[pid.partition]["uploader"] == side.name
        other = 1 - pid.partition
        assert rows[other]["role"] == "standby" and rows[other]["uploader"] != side.name


def test_a_new_holder_continues_mid_segment_and_every_offset_reads_back(
        cluster: tuple[list[Side], Mono, dict], store: ObjectStore, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sides, mono, values = cluster
    ranges: list[tuple[int, int] | None] = []
    put_file = store.put_file

    def spy(key: str, path: Path | str, **kw: Any) -> str:
        ranges.append(kw.get("byte_range"))
        return put_file(key, path, **kw)

    monkeypatch.setattr(store, "put_file", spy)
    a, b = sides
    pid = a.partition_of_mine()
    drain(a.archiver)
    mstore = ManifestStore(store)
    before, _ = mstore.load(pid.topic, pid.partition, pid.revision)
    # a's replica rolls at other offsets than b's: find a manifest end inside one of b's
    b_bases = sorted(parse_segment_file_name(f.name) or 0
                     for f in (b.log_dir / f"{TOPIC}-{pid.partition}").glob("*.log"))
    assert before.last_offset + 1 not in b_bases  # b's segment straddles it
    # a stops renewing; b takes the partition over after a lease time
    for _ in range(30):
        mono.t += LEASE_MS / 6000
        b.keeper.tick()
        if pid in b.keeper.holdings():
            break
    assert pid in b.keeper.holdings()
    assert not a.archiver.ownership.role(pid).uploader  # a's own clock says it lapsed
    # the log goes on: b's segment around the manifest's end closes
    values.update(write_replicas([a.log_dir, b.log_dir], [4096, 6000], partitions=2,
                                 batches=30))
    b.archiver.scan()
    decisions = drain(b.archiver)
    assert "uploaded" in decisions
    after, _ = mstore.load(pid.topic, pid.partition, pid.revision)
    new = [s for s in after.segments if s.base_offset > before.last_offset]
    assert new and new[0].base_offset == before.last_offset + 1  # no gap, no overlap
    # the straddling segment's rest went up streamed from its file, as a byte range
    assert any(r is not None and r[0] > 0 for r in ranges)
    assert {s.writer_term for s in new} == {b.keeper.holdings()[pid]}
    assert after.term == b.keeper.holdings()[pid] > before.term
    # a, woken, uploads nothing more for it
    assert "standby" in [p.decision for p in a.archiver.upload_round().partitions]
    got = read_all(store, tmp_path, pid.partition)
    end = after.last_offset
    assert {o: v for o, v in got.items() if o <= end} == {
        o: v for (p, o), v in values.items() if p == pid.partition and o <= end}


def test_a_standby_deletes_only_what_the_holders_manifest_covers(
        cluster: tuple[list[Side], Mono, dict], store: ObjectStore) -> None:
    sides, _, _ = cluster
    a, b = sides
    pid = a.partition_of_mine()
    part_dir = b.log_dir / f"{TOPIC}-{pid.partition}"
    before = sorted(part_dir.glob("*.log"))
    b.archiver.local_retention()
    assert sorted(part_dir.glob("*.log")) == before  # nothing uploaded yet: nothing goes
    drain(a.archiver)
    m, _ = ManifestStore(store).load(pid.topic, pid.partition, pid.revision)
    report = b.archiver.local_retention()
    assert report.deleted_local_segments > 0
    left = sorted(parse_segment_file_name(f.name) or 0 for f in part_dir.glob("*.log"))
    # what is left starts at or below the manifest's next offset: nothing uncovered went
    assert left[0] <= m.last_offset + 1
    row = next(r for r in report.partitions if r.partition == pid.partition)
    assert row.safe_to_delete_below is not None and row.safe_to_delete_below <= m.last_offset + 1


def test_the_topic_manifest_counts_every_local_partition_not_only_those_uploaded_here(
        cluster: tuple[list[Side], Mono, dict], store: ObjectStore) -> None:
    sides, _, _ = cluster
    first = next(s for s in sides if s.partition_of_mine().partition == 0)
    drain(first.archiver)  # it uploads partition 0 only; partition 1 is the other's
    topic = load_topic_manifest(store, TOPIC, REVISION)
    assert topic is not None and topic.partition_count == 2
