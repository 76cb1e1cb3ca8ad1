"""What the uploader sends and when (design invariant 3 and 5): a corrupt closed segment is refused
and reported while other partitions go on; the idle timeout uploads the active segment's
stable prefix as its own object and the rest follows as a suffix; failed uploads are never
recorded; the bandwidth limiter holds the configured rate."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faultproxy import FaultProxy
from support.archiving import (
    T0,
    Clock,
    Disk,
    before_put,
    before_put_file,
    closed_segments,
    drain,
    load_manifest,
    make_config,
    write_partition,
)
from support.waiting import wait_until

from archiver import uploader
from archiver.service import Archiver
from archiver.upload_limits import ConcurrencyLimit, TokenBucket
from archiver.upload_policy import PolicyInputError
from manifests import segment_indexes
from tiered.config import Config
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.store.base import ObjectStore


def two_closed_segments(tmp_path: Path) -> tuple[Config, Path]:
    """A config and its log dir holding partition orders-0 with 2 closed segments."""
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=9)
    return config, log_dir


def test_corrupt_segment_is_refused_later_ones_wait_other_partitions_go_on(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=18)
    write_partition(log_dir, "orders", 1, batches=18)
    bad = closed_segments(log_dir, "orders", 0)[2]
    data = bytearray(bad.read_bytes())
    data[200] ^= 0xFF  # inside the first batch's records: its CRC-32C no longer matches
    bad.write_bytes(bytes(data))

    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk())
    for _ in range(2):  # the refusal is stable: a second round neither skips nor uploads it
        report = archiver.upload_round()
        rows = {(r.topic, r.partition): r for r in report.partitions}
        assert not report.ok
        assert rows[("orders", 0)].decision == "corrupt_segment"
        assert str(bad) in (rows[("orders", 0)].error or "")
        assert "byte 0" in (rows[("orders", 0)].error or "")  # the batch starts the file
        assert rows[("orders", 1)].error is None

    m0 = load_manifest(s3_store, log_dir, "orders", 0)
    assert m0.last_offset == int(bad.stem) - 1  # the two segments before it, nothing after
    assert not [o for o in s3_store.list() if f"/{int(bad.stem)}-" in o.key
                and "/orders/0_" in o.key]
    m1 = load_manifest(s3_store, log_dir, "orders", 1)
    assert len(m1.segments) == len(closed_segments(log_dir, "orders", 1))
    # local retention never trims past the refused segment either
    [row] = [r for r in archiver.local_retention().partitions if r.partition == 0]
    assert row.safe_to_delete_below == int(bad.stem)


def test_a_segment_goes_up_while_it_is_verified_and_appears_after(
    tmp_path: Path, file_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the segment's bytes go out while it is verified (no idle connection waiting for the
    # CRC walk and the index PUTs), but its object appears only after both
    config, log_dir = two_closed_segments(tmp_path)
    sending = threading.Event()

    def watch(key: str) -> None:
        if key.endswith(".log"):
            sending.set()

    real_prepare = uploader.prepare
    checks: list[tuple[bool, int]] = []

    def prepare(target: Any, cand: Any, interval: int) -> Any:
        started = sending.wait(10)
        visible = [o for o in file_store.list() if o.key.endswith(".log")]
        checks.append((started, len(visible)))
        return real_prepare(target, cand, interval)

    before_put_file(monkeypatch, file_store, watch)
    monkeypatch.setattr(uploader, "prepare", prepare)
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk())
    assert archiver.upload_round().ok
    assert checks[0] == (True, 0)  # sending, not yet visible
    m = load_manifest(file_store, log_dir, "orders", 0)
    assert len(m.segments) == len(closed_segments(log_dir, "orders", 0))
    for seg in m.segments:  # every object has its indexes beside it
        assert file_store.exists(m.segment_key(seg).removesuffix(".log") + ".indexes")


def test_index_puts_of_one_partition_run_side_by_side(
    tmp_path: Path, file_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each segment's indexes go up from its own upload slot, not one after another from the
    # partition's thread (on real S3, 8 candidates x 2 index PUTs in series is a second)
    config, log_dir = two_closed_segments(tmp_path)
    together = threading.Barrier(2, timeout=10)

    met: list[str] = []

    def meet(key: str) -> None:
        if key.endswith(".indexes"):
            together.wait()  # both segments' index PUTs in flight at once, or it breaks
            met.append(key)

    before_put(monkeypatch, file_store, meet)
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk(), fixed_shares=1000)
    assert archiver.upload_round().ok
    assert not together.broken and len(met) == 2
    m = load_manifest(file_store, log_dir, "orders", 0)
    assert len(m.segments) == 2


def test_an_early_upload_pays_for_its_indexes_up_front(
    tmp_path: Path, file_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the segment's bandwidth may run the bucket into debt; its index PUTs (made while the
    # segment waits for them before completing) must not queue behind that debt, so the
    # segment and its indexes are paid for in one acquire
    config, log_dir = two_closed_segments(tmp_path)
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk())
    acquired: list[int] = []
    monkeypatch.setattr(archiver.limiter, "acquire", acquired.append)
    report = archiver.upload_round()
    assert report.ok
    segments = closed_segments(log_dir, "orders", 0)
    expected = sorted(seg.stat().st_size + segment_indexes.bundle_size(
        [seg.with_suffix(k).stat().st_size for k in (".index", ".timeindex")])
        for seg in segments)
    assert sorted(acquired) == expected
    assert sum(acquired) == report.partitions[0].uploaded_bytes


def test_a_corrupt_segment_sent_early_leaves_no_object_and_no_parts(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    # multipart-sized segments: the parts of the corrupt one may go up while it is verified
    # (those not yet on the wire when it fails are never sent), and the refusal aborts the
    # upload before it completes
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=96, records=4, value_bytes=64 * 1024,
                    segment_bytes=11 * 1024 * 1024)
    first, second = closed_segments(log_dir, "orders", 0)[:2]
    assert first.stat().st_size > 2 * 5 * 1024 * 1024  # three parts
    data = bytearray(first.read_bytes())
    data[200] ^= 0xFF
    first.write_bytes(bytes(data))

    client = s3_store._client  # type: ignore[attr-defined]
    parts: list[str] = []
    client.meta.events.register("before-call.s3.UploadPart",
                                lambda **kwargs: parts.append("part"))
    archiver = Archiver(config, s3_store, clock=Clock(), disk_usage=Disk())
    report = archiver.upload_round()
    [row] = report.partitions
    assert row.decision == "corrupt_segment" and str(first) in (row.error or "")
    assert len(parts) <= 3  # all, some or none went out before the verdict ...
    assert not [o for o in s3_store.list() if o.key.endswith(".log")]  # ... and none landed
    uploads = client.list_multipart_uploads(Bucket=s3_store.bucket)  # type: ignore[attr-defined]
    assert uploads.get("Uploads", []) == []
    assert second.exists()  # waits behind the refused one


def test_a_segment_gone_before_verification_stops_the_round_there(
    tmp_path: Path, file_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uploads start as soon as each candidate is verified, so the broker deleting a later
    # segment mid-round must not lose the ones already on their way: they are committed, the
    # partition reports the error, and the next round goes on from there
    config = make_config(tmp_path)
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=18)
    doomed = closed_segments(log_dir, "orders", 0)[2]
    saved = doomed.read_bytes()
    real_prepare = uploader.prepare
    deleted: list[Path] = []

    def prepare(target: Any, cand: Any, interval: int) -> Any:
        if cand.paths[0] == str(doomed) and not deleted:
            doomed.unlink()
            deleted.append(doomed)
        return real_prepare(target, cand, interval)

    monkeypatch.setattr(uploader, "prepare", prepare)
    archiver = Archiver(config, file_store, clock=Clock(), disk_usage=Disk())
    report = archiver.upload_round()
    [row] = report.partitions
    assert not report.ok and row.decision == "error" and "FileNotFoundError" in (row.error or "")
    assert row.uploaded_segments == 2
    assert load_manifest(file_store, log_dir, "orders", 0).last_offset == int(doomed.stem) - 1

    doomed.write_bytes(saved)  # back (as if the round had raced a slow reader, not retention)
    archiver.scan()
    drain(archiver)
    m = load_manifest(file_store, log_dir, "orders", 0)
    assert len(m.segments) == len(closed_segments(log_dir, "orders", 0))


def test_failed_uploads_are_retried_and_never_recorded(
    tmp_path: Path, proxied_s3_store: Callable[..., ObjectStore], fault_proxy: FaultProxy
) -> None:
    config, log_dir = two_closed_segments(tmp_path)
    store = proxied_s3_store()
    archiver = Archiver(config, store, clock=Clock(), disk_usage=Disk(), max_upload_concurrency=1)
    # transient faults heal within the store's retries: the segment still goes up once
    fault_proxy.inject("slowdown", 2, method="PUT", path_contains="0-11-1.log")
    assert archiver.upload_round().ok
    assert len(load_manifest(store, log_dir, "orders", 0).segments) == 2
    assert len(fault_proxy.seen(method="PUT", path_contains="0-11-1.log")) == 3

    write_partition(log_dir, "orders", 0, batches=6)
    archiver.scan()
    fault_proxy.inject("internal", 100, method="PUT", path_contains=".log")
    failed = archiver.upload_round()
    assert not failed.ok and failed.partitions[0].decision == "error"
    assert archiver.snapshot().upload_errors_total >= 1
    assert len(load_manifest(store, log_dir, "orders", 0).segments) == 2
    fault_proxy.reset()
    assert drain(archiver) == 1
    assert len(load_manifest(store, log_dir, "orders", 0).segments) == 4


def test_idle_timeout_uploads_the_stable_prefix_then_the_suffix(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    config = make_config(tmp_path,
                         cluster={"cloud_storage_segment_max_upload_interval_sec": 60})
    log_dir = config.log_dirs[0]
    tp = TopicPartition("orders", 0)
    # 2 batches of 4 records in the active segment; only the first is below the watermark
    write_partition(log_dir, "orders", 0, batches=2, segment_bytes=1 << 20, high_watermark=4)
    active = log_dir / "orders-0" / f"{0:020d}.log"
    clock = Clock()
    archiver = Archiver(config, s3_store, clock=clock, disk_usage=Disk())
    assert archiver.upload_round().partitions[0].uploaded_segments == 0  # not idle yet
    clock.advance(61)
    assert archiver.upload_round().partitions[0].uploaded_segments == 1

    m = load_manifest(s3_store, log_dir, "orders", 0)
    [prefix] = m.segments
    assert (prefix.base_offset, prefix.last_offset) == (0, 3)
    body = s3_store.get(m.segment_key(prefix))
    assert body == active.read_bytes()[: len(body)] and 0 < len(body) < active.stat().st_size

    # the broker rolls the segment: what the prefix did not cover follows as a suffix
    with LogWriter(log_dir / "orders-0", segment_bytes=1 << 20, clock=lambda: T0,
                   fsync=False) as writer:
        writer.roll()
        writer.append([ProducerRecord(b"w" * 100)])
        end = writer.log_end_offset
    write_high_watermarks(log_dir, {tp: end}, fsync=False)
    archiver.scan()
    assert archiver.upload_round().partitions[0].uploaded_segments == 1
    m = load_manifest(s3_store, log_dir, "orders", 0)
    first, suffix = m.segments
    assert (suffix.base_offset, suffix.last_offset) == (4, 7)
    assert s3_store.get(m.segment_key(suffix)) == active.read_bytes()[len(body):]


def test_token_bucket_holds_the_rate_and_pays_debts() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    bucket = TokenBucket(1000, clock=lambda: now[0], sleep=sleep)
    assert bucket.acquire(500) == 0  # starts empty, goes into debt without waiting
    assert bucket.acquire(500) == pytest.approx(0.5)  # waits until the first debt is paid
    assert bucket.acquire(1000) == pytest.approx(0.5)
    assert now[0] == pytest.approx(1.0)  # 2000 bytes started within ~1 s at 1000 B/s
    bucket.set_rate(None)
    assert bucket.acquire(10**9) == 0
    with pytest.raises(PolicyInputError):
        bucket.set_rate(0)


def test_concurrency_limit_changes_while_holders_wait() -> None:
    limit = ConcurrencyLimit(1)
    started: list[int] = []
    release = threading.Event()

    def work(n: int) -> None:
        with limit.hold():
            started.append(n)
            release.wait(10)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: limit.waiting == 2, "the other two to wait for the one slot")
    assert len(started) == 1 and limit.held == 1
    limit.set_limit(3)  # raised while they wait: both start at once
    wait_until(lambda: len(started) == 3)
    limit.set_limit(1)  # lowered: the three in flight finish, nobody new starts meanwhile
    release.set()
    for t in threads:
        t.join(10)
    assert limit.held == 0
    with pytest.raises(PolicyInputError):
        limit.set_limit(0)


def test_the_controller_keeps_updating_while_a_round_runs(
    tmp_path: Path, file_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a round at minimum shares is stuck on a slow store while a burst lands on a small
    # disk: the controller must see the burst (segments rolled after the round's scan) and
    # raise the budget of the round already running, not only of the next one
    config = make_config(tmp_path, cluster={"cloud_storage_upload_ctrl_update_interval_ms": 50,
                                            "cloud_storage_max_connections": 20})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=9)
    gate, entered = threading.Event(), threading.Event()

    def hold(key: str) -> None:
        entered.set()
        gate.wait(30)

    before_put_file(monkeypatch, file_store, hold)
    disk = Disk(total=64 * 1024 * 1024, free=60 * 1024 * 1024)
    archiver = Archiver(config, file_store, disk_usage=disk)
    archiver.update_controller()
    assert archiver.slots.limit == 2  # minimum shares: 100 of 1000 of 20 connections
    before = archiver.snapshot().pending_bytes

    result: list[Any] = []
    round_thread = threading.Thread(target=lambda: result.append(archiver.upload_round()))
    round_thread.start()
    try:
        assert entered.wait(10)
        write_partition(log_dir, "orders", 0, batches=200)  # ~50 new segments
        disk.free = 1024 * 1024  # and the disk is nearly full
        wait_until(lambda: archiver.snapshot().pending_bytes > before + 200_000)
        wait_until(lambda: archiver.slots.limit > 2)
        assert archiver.snapshot().controller_shares > 100
        assert round_thread.is_alive()  # all of that while the first round still runs
    finally:
        gate.set()
        round_thread.join(30)
    assert result and result[0].ok


def test_the_backlog_returns_to_zero_after_an_idle_timeout_upload(
    tmp_path: Path, s3_store: ObjectStore
) -> None:
    """Everything below the watermark was uploaded by idle timeout: nothing is pending, in
    describe-storage, the metric's source and the summary line alike."""
    from tiered.app.describe import summary_line

    config = make_config(tmp_path,
                         cluster={"cloud_storage_segment_max_upload_interval_sec": 60})
    log_dir = config.log_dirs[0]
    write_partition(log_dir, "orders", 0, batches=3, segment_bytes=1 << 20)
    clock = Clock()
    archiver = Archiver(config, s3_store, clock=clock, disk_usage=Disk())
    archiver.upload_round()
    clock.advance(61)
    assert archiver.upload_round().partitions[0].uploaded_segments == 1
    archiver.scan()
    [row] = archiver.describe()
    assert row["remote"]["last_offset"] == row["local"]["last_offset"]  # all of it is up
    assert row["pending_bytes"] == 0, row
    assert archiver.snapshot().pending_bytes_by_partition.get(("orders", 0), 0) == 0
    assert summary_line([row]).endswith("0 B waiting for upload")
