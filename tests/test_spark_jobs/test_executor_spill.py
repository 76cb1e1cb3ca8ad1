"""Bytes handed between a job's stages on the executor's disk (`spark_jobs.executor_spill`),
and what compaction does when the cleaned bytes are not on the machine that uploads them:
it cleans the segment again from the bucket, and refuses bytes that differ. And the scan's
read of the next segment while it walks one (`prefetched`)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

from spark_jobs import executor_spill
from spark_jobs.compact_exec import (
    SCANNED,
    SegTask,
    clean_task,
    cleaned_bytes,
    prefetched,
    scan_task,
)
from spark_jobs.job_context import PartitionRef
from spark_jobs.merge_exec import SourceSegment
from tiered.errors import CorruptSegmentError
from tiered.kafka.builder import encode_batch
from tiered.kafka.records import Record
from tiered.store.base import ObjectStore

NOW = 1_700_000_000_000


@pytest.fixture
def spill_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for a Spark worker's files directory, on a disk with room to spare whatever
    this machine's holds."""
    root = tmp_path / "worker" / executor_spill.SPILL_DIR
    monkeypatch.setattr(executor_spill, "_root", lambda: root)
    monkeypatch.setattr(executor_spill, "SPILL_RESERVE_MIN", 0)
    monkeypatch.setattr(executor_spill, "SPILL_RESERVE_SHARE", 0.0)
    return root


def test_outside_a_spark_worker_nothing_spills() -> None:
    assert executor_spill.spill("x.raw", b"data") is None
    assert executor_spill.spill_path("x.raw") is None


def test_a_spill_reads_back_once_and_only_whole(spill_root: Path) -> None:
    data = b"segment bytes" * 100
    path = executor_spill.spill("job-0-1.raw", data)
    assert path is not None and Path(path).parent == spill_root
    assert executor_spill.unspill(path, len(data), crc32c.crc32c(data), keep=True) == data
    assert executor_spill.unspill(path, len(data), crc32c.crc32c(data)) == data
    assert not Path(path).exists(), "read once, then removed"
    assert executor_spill.unspill(path, len(data), crc32c.crc32c(data)) is None


@pytest.mark.parametrize("damage", ["torn", "garbled", "longer"])
def test_a_spill_that_is_not_the_bytes_it_was_told_of_reads_as_none(
        spill_root: Path, damage: str) -> None:
    data = bytes(range(256)) * 64
    path = executor_spill.spill("job-0-2.clean", data)
    assert path is not None
    bad = {"torn": data[:-10], "garbled": b"\xff" + data[1:], "longer": data + b"!"}[damage]
    Path(path).write_bytes(bad)
    assert executor_spill.unspill(path, len(data), crc32c.crc32c(data)) is None


def _segment(store: ObjectStore) -> SegTask:
    """Two batches of a compacted topic's segment in the bucket: key a twice, key b once."""
    data = (encode_batch([Record(0, NOW, b"a", b"old"), Record(1, NOW, b"b", b"x")],
                         base_offset=0)
            + encode_batch([Record(2, NOW, b"a", b"new")], base_offset=2))
    key = "t/0/00000000000000000000-1-v1.log"
    store.put(key, data)
    src = SourceSegment(key, "00000000000000000000-1-v1.log", 0, 2, len(data),
                        crc32c.crc32c(data))
    return SegTask(0, PartitionRef("t", 0, "1"), 0, src, 1, False, NOW, NOW, job="job")


def test_cleaned_bytes_spilled_elsewhere_are_cleaned_again_from_the_bucket(
        file_store: ObjectStore, spill_root: Path) -> None:
    task = _segment(file_store)
    latest = np.array([1, 2], np.int64)  # b at 1, a at 2: the record at 0 goes
    out = clean_task(lambda: file_store, task, latest, (), now_ms=NOW,
                     delete_retention_ms=None)
    assert out.error is None and out.changed
    assert out.data == b"" and out.spilled is not None, "the cleaned bytes were spilled"
    here = cleaned_bytes(file_store, out._replace())  # read back from the spill (and removed)
    assert out.stats["bytes_out"] == len(here) and crc32c.crc32c(here) == out.crc
    # on another machine the spill is not there: the upload cleans the segment again
    assert not Path(out.spilled).exists()
    assert cleaned_bytes(file_store, out) == here
    # verdicts that do not give the counted bytes (the object changed under its name) refuse
    wrong = out._replace(latest=np.array([2], np.int64).tobytes())
    with pytest.raises(CorruptSegmentError, match="cleaned again"):
        cleaned_bytes(file_store, wrong)


def test_the_cleaning_pass_reads_the_scans_spill_and_builds_no_client(
        file_store: ObjectStore, spill_root: Path) -> None:
    task = _segment(file_store)
    raw = file_store.get(task.source.key)
    assert executor_spill.spill(task.spill_name("raw"), raw) is not None

    def no_store() -> ObjectStore:
        raise AssertionError("the segment was spilled on this machine: no client is built")

    out = clean_task(no_store, task, np.array([1, 2], np.int64), (), now_ms=NOW,
                     delete_retention_ms=None)
    assert out.error is None and out.stats["records_kept"] == 2
    # the spill was read once and removed: a second cleaning (a lost block) reads the bucket
    again = clean_task(lambda: file_store, task, np.array([1, 2], np.int64), (), now_ms=NOW,
                       delete_retention_ms=None)
    assert again.crc == out.crc


def test_nothing_spills_into_the_disks_reserve(spill_root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every segment of a job is spilled before the first is read back: a spill that would
    leave less than the reserve free is not written (the bytes are read again instead)."""
    spill_root.mkdir(parents=True)
    monkeypatch.setattr(executor_spill, "SPILL_RESERVE_MIN", 1 << 30)
    monkeypatch.setattr(executor_spill, "SPILL_RESERVE_SHARE", 0.2)
    total = 10 << 30
    reserve = total * 0.2

    def disk(free: float) -> None:
        usage = shutil._ntuple_diskusage(total, int(total - free), int(free))  # type: ignore[attr-defined]
        monkeypatch.setattr(executor_spill.shutil, "disk_usage", lambda _p: usage)

    disk(reserve + 2000)
    assert executor_spill.spill("ok.raw", b"x" * 1000) is not None
    disk(reserve + 500)
    assert executor_spill.spill("full.raw", b"x" * 1000) is None
    assert not (spill_root / "full.raw").exists()


class _Watched:
    """A store whose GETs say when they start (the segments' object reads)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.started: dict[str, threading.Event] = {}

    def get(self, key: str) -> Any:
        self.started.setdefault(key, threading.Event()).set()
        return self.store.get(key)


def test_the_scan_reads_the_next_segment_while_it_walks_this_one(
        file_store: ObjectStore) -> None:
    tasks = []
    for row, base in enumerate((0, 10, 20)):
        data = encode_batch([Record(base, NOW, b"k%d" % row, b"v")], base_offset=base)
        key = f"t/0/{base:020d}-1-v1.log"
        file_store.put(key, data)
        src = SourceSegment(key, key.rsplit("/", 1)[1], base, base, len(data),
                            crc32c.crc32c(data))
        tasks.append(SegTask(0, PartitionRef("t", 0, "1"), row, src, 1, False, NOW, NOW))
    # the third object is damaged: its error comes with its task, in its place
    file_store.put(tasks[2].source.key, b"garbled")
    watched = _Watched(file_store)
    walk = prefetched(watched, tasks)  # type: ignore[arg-type]
    task, got = next(walk)
    assert task is tasks[0] and isinstance(got, bytes)
    assert watched.started.setdefault(tasks[1].source.key, threading.Event()).wait(10), \
        "the next segment's GET started before the first was handed over for its walk"
    rest = list(walk)
    assert [t.row for t, _ in rest] == [1, 2]
    assert isinstance(rest[0][1], bytes)
    assert isinstance(rest[1][1], CorruptSegmentError)
    rows = list(scan_task(watched, rest[1][0], rest[1][1]))  # type: ignore[arg-type]
    assert len(rows) == 1 and rows[0][0] == SCANNED and "bytes" in rows[0][4]


def test_a_segment_cleaning_leaves_as_it_was_is_not_written_again(
        file_store: ObjectStore, spill_root: Path) -> None:
    """Every record latest (a later pass over a compacted copy): the cleaned bytes are the
    segment's own, and the scan's spill of them stands for them; nothing more is written."""
    task = _segment(file_store)
    raw = file_store.get(task.source.key)
    raw_path = executor_spill.spill(task.spill_name("raw"), raw)

    def no_store() -> ObjectStore:
        raise AssertionError("spilled here: no client")

    out = clean_task(no_store, task, np.array([0, 1, 2], np.int64), (), now_ms=NOW,
                     delete_retention_ms=None)
    assert out.error is None and not out.changed
    assert out.spilled == raw_path and out.crc == task.source.checksum
    assert sorted(p.name for p in spill_root.iterdir()) == [task.spill_name("raw")]
    assert cleaned_bytes(file_store, out) == raw


def test_a_cleaning_that_fails_leaves_no_spill(file_store: ObjectStore,
                                                spill_root: Path) -> None:
    task = _segment(file_store)
    good = file_store.get(task.source.key)
    # the scan's copy checks out, but a batch lies outside the manifest's offsets
    bad = task._replace(source=task.source._replace(last_offset=1))
    executor_spill.spill(bad.spill_name("raw"), good)
    out = clean_task(lambda: file_store, bad, np.array([1, 2], np.int64), (), now_ms=NOW,
                     delete_retention_ms=None)
    assert out.error is not None and "outside" in out.error
    assert list(spill_root.iterdir()) == []


def test_a_runs_leftover_spills_go_and_no_other_runs(spill_root: Path) -> None:
    executor_spill.spill("run1-0-0.raw", b"a")
    executor_spill.spill("run1-0-1.clean", b"b")
    executor_spill.spill("run2-0-0.raw", b"c")
    (spill_root / ".run1-0-2.raw.123").write_bytes(b"torn")  # a write a crash cut short
    assert executor_spill.discard_run("run1") == 3
    assert sorted(p.name for p in spill_root.iterdir()) == ["run2-0-0.raw"]
    assert executor_spill.discard_run("run3") == 0
