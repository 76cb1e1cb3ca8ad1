"""LogWriter: segments rolled as Kafka rolls them, files an independent reader (kafka-python)
accepts record by record, indexes equal to Kafka's algorithm, epochs, metadata, reopening."""

from __future__ import annotations

import random
import struct
import uuid
from pathlib import Path

import pytest
from kafka.record import MemoryRecords

from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.builder import encode_batch
from tiered.kafka.checkpoints import (
    EpochEntry,
    TopicPartition,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    read_partition_metadata,
)
from tiered.kafka.index import OffsetIndex
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.kafka.records import Header, Record, iter_batch_headers
from tiered.kafka.segment import Segment, segment_file_name

T0 = 1_700_000_000.0  # seconds, as the injected clock returns


class Clock:
    def __init__(self, start: float = T0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def kafka_reference_indexes(log: bytes, base: int, interval: int) -> tuple[bytes, bytes]:
    """Kafka's LogSegment.recover + onBecomeInactiveSegment, transcribed from the Java with
    raw header offsets (independent of tiered.kafka.records / tiered.kafka.index)."""
    index = b""
    timeindex: list[tuple[int, int]] = []
    valid_bytes = last_index_entry = 0
    max_ts, offset_of_max = -1, base

    def time_maybe_append(ts: int, offset: int) -> None:
        if ts > (timeindex[-1][0] if timeindex else -1):
            timeindex.append((ts, offset))

    while valid_bytes < len(log):
        (base_offset, length) = struct.unpack_from(">qi", log, valid_bytes)
        (last_delta,) = struct.unpack_from(">i", log, valid_bytes + 23)
        (batch_max_ts,) = struct.unpack_from(">q", log, valid_bytes + 35)
        if batch_max_ts > max_ts:
            max_ts, offset_of_max = batch_max_ts, base_offset + last_delta
        if valid_bytes - last_index_entry > interval:
            index += struct.pack(">ii", base_offset + last_delta - base, valid_bytes)
            time_maybe_append(max_ts, offset_of_max)
            last_index_entry = valid_bytes
        valid_bytes += length + 12
    time_maybe_append(max_ts, offset_of_max)
    return index, b"".join(struct.pack(">qi", ts, off - base) for ts, off in timeindex)


def segments_of(directory: Path) -> list[Segment]:
    return sorted(Segment.from_log_path(p) for p in directory.glob("*.log"))


def test_rolls_before_a_batch_that_would_not_fit(tmp_path: Path) -> None:
    rng = random.Random(1)
    with LogWriter(tmp_path / "t-0", segment_bytes=5000, clock=Clock(), fsync=False) as w:
        for _ in range(80):
            w.append([ProducerRecord(b"v" * rng.randint(50, 1500))])
    segments = segments_of(tmp_path / "t-0")
    assert len(segments) > 10
    for seg, nxt in zip(segments, segments[1:], strict=False):
        first_of_next = next(nxt.iter_batch_headers())
        assert seg.size() <= 5000
        assert seg.size() + first_of_next.size > 5000  # it rolled because this did not fit
        last = seg.last_offset()
        assert last is not None
        assert nxt.base_offset == last + 1 == first_of_next.base_offset


def test_a_batch_larger_than_a_segment_gets_one_of_its_own(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t-0", segment_bytes=1000, clock=Clock(), fsync=False) as w:
        w.append([ProducerRecord(b"a" * 100)])
        w.append([ProducerRecord(b"b" * 3000)])
        w.append([ProducerRecord(b"c" * 100)])
    assert [s.base_offset for s in segments_of(tmp_path / "t-0")] == [0, 1, 2]


def test_rolls_by_segment_ms_on_the_injected_clock(tmp_path: Path) -> None:
    clock = Clock()
    with LogWriter(tmp_path / "t-0", segment_ms=60_000, clock=clock, fsync=False) as w:
        for _ in range(15):
            w.append([ProducerRecord(b"v")])  # stamped with the clock
            clock.now += 10
        assert w.segment_base_offsets == [0, 7, 14]
    # 0..60 s after the first batch stays (Kafka rolls only when *more* than segment.ms
    # passed), the batch at 70 s starts a segment, and so on
    first = segments_of(tmp_path / "t-0")[0]
    assert [h.max_timestamp for h in first.iter_batch_headers()] == [
        int(T0 * 1000) + 10_000 * i for i in range(7)]


def test_segment_ms_uses_the_clock_when_records_have_no_timestamp(tmp_path: Path) -> None:
    clock = Clock()
    with LogWriter(tmp_path / "t-0", segment_ms=60_000, clock=clock, fsync=False) as w:
        w.append([ProducerRecord(b"v", timestamp=-1)])
        clock.now += 60
        w.append([ProducerRecord(b"v", timestamp=-1)])
        assert w.segment_base_offsets == [0]
        clock.now += 0.001
        w.append([ProducerRecord(b"v", timestamp=-1)])
        assert w.segment_base_offsets == [0, 2]


def test_no_time_roll_without_time_passing(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t-0", segment_ms=1, clock=Clock(), fsync=False) as w:
        for _ in range(50):
            w.append([ProducerRecord(b"v")])
        assert w.segment_base_offsets == [0]


def test_kafka_python_reads_every_record_the_writer_wrote(tmp_path: Path) -> None:
    rng = random.Random(3)
    clock = Clock()
    expected: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]
    expected = []
    codecs = ["none", "gzip", "snappy", "lz4", "zstd"]
    with LogWriter(tmp_path / "t-0", segment_bytes=20_000, clock=clock, fsync=False) as w:
        for i in range(120):
            clock.now += rng.random()
            records = []
            for j in range(rng.randint(1, 6)):
                key = None if j % 4 == 3 else rng.randbytes(rng.randint(0, 12))
                value = None if (i, j) == (7, 0) else rng.randbytes(rng.randint(0, 400))
                headers = tuple(Header(f"h{k}", None if k == 2 else rng.randbytes(5))
                                for k in range(j % 3 + (j == 2)))
                ts = None if j % 2 else int(T0 * 1000) - rng.randint(0, 10**6)
                records.append(ProducerRecord(value, key, headers, ts))
            before = w.log_end_offset
            w.append(records, compression=codecs[i % len(codecs)])
            batch_now = w.now_ms()
            for k, r in enumerate(records):
                expected.append((before + k, batch_now if r.timestamp is None else r.timestamp,
                                 r.key, r.value, [(h.key, h.value) for h in r.headers]))
        assert len(w.segment_base_offsets) > 3

    seen = []
    for seg in segments_of(tmp_path / "t-0"):
        batches = MemoryRecords(seg.log_path.read_bytes())
        while (batch := batches.next_batch()) is not None:
            assert batch.validate_crc()
            assert batch.magic == 2
            assert batch.leader_epoch == 0
            for rec in batch:
                seen.append((rec.offset, rec.timestamp, rec.key, rec.value,
                             [(k, v) for k, v in rec.headers]))
        assert batches.valid_bytes() == seg.size()
    assert seen == expected


def test_kafka_python_reads_transactions_and_log_append_time(tmp_path: Path) -> None:
    clock = Clock()
    with LogWriter(tmp_path / "t-0", clock=clock, fsync=False) as w:
        w.append([ProducerRecord(b"a"), ProducerRecord(b"b")], producer_id=42, producer_epoch=1,
                 base_sequence=0, transactional=True)
        w.append_control("commit", producer_id=42, producer_epoch=1, coordinator_epoch=3)
        clock.now += 5
        w.append([ProducerRecord(b"c", timestamp=123)], timestamp_type="log_append")
    batches = MemoryRecords(segments_of(tmp_path / "t-0")[0].log_path.read_bytes())
    data = batches.next_batch()
    assert (data.producer_id, data.producer_epoch, data.base_sequence) == (42, 1, 0)
    assert data.is_transactional and not data.is_control_batch
    marker = batches.next_batch()
    assert marker.validate_crc() and marker.is_control_batch and marker.is_transactional
    (control,) = list(marker)
    assert control.commit and control.offset == 2
    appended = batches.next_batch()
    assert appended.validate_crc()
    assert appended.timestamp_type == 1  # LogAppendTime
    assert [r.timestamp for r in appended] == [int((T0 + 5) * 1000)]


def test_indexes_match_kafkas_algorithm(tmp_path: Path) -> None:
    rng = random.Random(5)
    clock = Clock()
    interval = 700
    with LogWriter(tmp_path / "t-0", segment_bytes=30_000, index_interval_bytes=interval,
                   clock=clock, fsync=False) as w:
        for _ in range(300):
            clock.now += rng.choice([1, 1, 1, -3, 0])  # producers' clocks go back too
            w.append([ProducerRecord(rng.randbytes(rng.randint(10, 300)))
                      for _ in range(rng.randint(1, 4))],
                     compression=rng.choice(["none", "lz4"]))
    segments = segments_of(tmp_path / "t-0")
    assert len(segments) > 3
    for seg in segments:
        index, timeindex = kafka_reference_indexes(seg.log_path.read_bytes(), seg.base_offset,
                                                   interval)
        assert len(index) > 8 * 5  # sparse but present
        assert seg.index_path.read_bytes() == index
        assert seg.timeindex_path.read_bytes() == timeindex


def test_full_index_rolls_the_segment(tmp_path: Path) -> None:
    # 24 bytes hold 3 offset entries and 2 time entries, one of them kept for the roll
    with LogWriter(tmp_path / "t-0", index_interval_bytes=0, index_size_max_bytes=24,
                   clock=Clock(), fsync=False) as w:
        for i in range(9):
            w.append([ProducerRecord(b"v", timestamp=1000 + i)])
    segments = segments_of(tmp_path / "t-0")
    assert [s.base_offset for s in segments] == [0, 2, 4, 6, 8]
    for seg in segments:
        assert (seg.index_path.read_bytes(), seg.timeindex_path.read_bytes()) == (
            kafka_reference_indexes(seg.log_path.read_bytes(), seg.base_offset, 0))


def test_preallocated_indexes_look_like_a_live_broker(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    w = LogWriter(directory, segment_bytes=50_000, index_interval_bytes=100,
                  index_size_max_bytes=4096, preallocate_indexes=True, clock=Clock(),
                  fsync=False)
    for _ in range(400):
        w.append([ProducerRecord(b"v" * 100)])
    closed, active = segments_of(directory)[-2:]
    assert closed.index_path.stat().st_size == len(closed.offset_index()) * 8  # trimmed
    assert active.index_path.stat().st_size == 4096
    assert active.timeindex_path.stat().st_size == 4092  # rounded down to whole entries
    live = Segment(active.base_offset, active.log_path, active=True)
    assert 0 < len(live.offset_index()) < 4096 // 8
    found = live.find_offset(w.log_end_offset - 1)
    assert found is not None and found.last_offset == w.log_end_offset - 1
    w.close()
    index, timeindex = kafka_reference_indexes(active.log_path.read_bytes(),
                                               active.base_offset, 100)
    assert active.index_path.read_bytes() == index
    assert active.timeindex_path.read_bytes() == timeindex


def test_leader_epochs_are_checkpointed(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    path = directory / "leader-epoch-checkpoint"
    with LogWriter(directory, clock=Clock(), fsync=False) as w:
        w.append([ProducerRecord(b"a")])
        assert read_leader_epoch_checkpoint(path) == [EpochEntry(0, 0)]
        w.become_leader(3)
        assert read_leader_epoch_checkpoint(path) == [EpochEntry(0, 0), EpochEntry(3, 1)]
        w.append([ProducerRecord(b"b"), ProducerRecord(b"c")])
        w.append([ProducerRecord(b"d")], leader_epoch=4)
        assert w.leader_epochs == [EpochEntry(0, 0), EpochEntry(3, 1), EpochEntry(4, 3)]
        size = w.log_end_offset
        with pytest.raises(ValueError, match="fenced"):
            w.append([ProducerRecord(b"stale")], leader_epoch=2)
        assert w.log_end_offset == size
    epochs = [h.partition_leader_epoch for h in segments_of(directory)[0].iter_batch_headers()]
    assert epochs == [0, 3, 4]
    assert read_leader_epoch_checkpoint(path) == [EpochEntry(0, 0), EpochEntry(3, 1),
                                                  EpochEntry(4, 3)]
    with LogWriter(directory, clock=Clock(), fsync=False) as reopened:
        assert reopened.leader_epoch == 4


def test_partition_metadata_holds_the_topic_id(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    topic_id = uuid.UUID("7f2c5a1e-3b4d-4e6f-8a9b-0c1d2e3f4a5b")
    with LogWriter(directory, topic_id=topic_id, fsync=False) as w:
        assert w.topic_id == topic_id
    assert read_partition_metadata(directory / "partition.metadata") == topic_id
    with LogWriter(directory, fsync=False) as w:
        assert w.topic_id == topic_id
    with pytest.raises(TieredError, match="topic id"):
        LogWriter(directory, topic_id=uuid.UUID(int=99), fsync=False)
    with LogWriter(tmp_path / "u-0", fsync=False) as fresh:
        assert fresh.topic_id not in (topic_id, uuid.UUID(int=0))


def test_append_pre_encoded_batches(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with LogWriter(directory, segment_bytes=300, clock=Clock(), fsync=False) as w:
        w.append([ProducerRecord(b"first")])
        data = b"".join(
            encode_batch([Record(o, 1000 + o, None, b"x" * 50)], base_offset=o)
            for o in range(1, 6))
        results = w.append_batches(data)
        assert [r.base_offset for r in results] == [1, 2, 3, 4, 5]
        assert w.log_end_offset == 6
        assert len({r.segment_base_offset for r in results}) > 1  # rolled in between
        size_before = sum(s.size() for s in segments_of(directory))
        wrong = encode_batch([Record(9, 1, None, b"y")], base_offset=9)
        with pytest.raises(ValueError, match="not 7, the previous batch's next offset"):
            w.append_batches(encode_batch([Record(6, 1, None, b"ok")], base_offset=6) + wrong)
        assert w.log_end_offset == 6  # nothing of the refused input was written
        assert sum(s.size() for s in segments_of(directory)) == size_before
        with pytest.raises(ValueError, match="not 6, the log end offset"):
            w.append_batches(wrong)
        assert w.append_batches(wrong, allow_gaps=True)[0].base_offset == 9
        assert w.log_end_offset == 10
        damaged = bytearray(encode_batch([Record(10, 1, None, b"z")], base_offset=10))
        damaged[-1] ^= 1
        with pytest.raises(CorruptSegmentError, match="CRC"):
            w.append_batches(bytes(damaged))


def test_reopen_resumes_and_cuts_a_torn_tail(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    clock = Clock()
    with LogWriter(directory, segment_bytes=8000, index_interval_bytes=200, clock=clock,
                   fsync=False) as w:
        for _ in range(30):
            w.append([ProducerRecord(b"v" * 300)])
        bases = w.segment_base_offsets
    active = segments_of(directory)[-1]
    good_size = active.size()
    torn = encode_batch([Record(30, 1, None, b"lost" * 50)], base_offset=30)
    with open(active.log_path, "ab") as f:
        f.write(torn[:100])  # a crash mid-append
    with LogWriter(directory, segment_bytes=8000, index_interval_bytes=200, clock=clock,
                   fsync=False) as w:
        assert active.size() == good_size
        assert w.log_end_offset == 30
        assert w.segment_base_offsets == bases
        for _ in range(5):
            w.append([ProducerRecord(b"w" * 300)])
    records = [r for seg in segments_of(directory) for b in seg.iter_batches()
               for r in b.records]
    assert [r.offset for r in records] == list(range(35))
    for seg in segments_of(directory):
        assert (seg.index_path.read_bytes(), seg.timeindex_path.read_bytes()) == (
            kafka_reference_indexes(seg.log_path.read_bytes(), seg.base_offset, 200))


def test_manual_roll_and_start_offset(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with LogWriter(directory, start_offset=5000, clock=Clock(), fsync=False) as w:
        w.roll()  # empty active segment: nothing to roll
        w.append([ProducerRecord(b"a")])
        w.roll()
        w.append([ProducerRecord(b"b")])
        assert w.segment_base_offsets == [5000, 5001]
    names = sorted(p.name for p in directory.iterdir())
    assert segment_file_name(5000) in names and segment_file_name(5001) in names
    first = segments_of(directory)[0]
    assert OffsetIndex.read(first.index_path) == OffsetIndex(5000)
    assert first.timeindex_path.stat().st_size == 12  # the closing max-timestamp entry


def test_closed_writer_refuses_appends(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "t-0", fsync=True)
    w.append([ProducerRecord(b"a")])
    w.close()
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.append([ProducerRecord(b"b")])
    with pytest.raises(RuntimeError), LogWriter(tmp_path / "u-0", fsync=False) as other:
        other.append([ProducerRecord(b"a")])
        raise RuntimeError("boom")
    with pytest.raises(ValueError, match="closed"):
        other.append([ProducerRecord(b"b")])


def test_write_high_watermarks(tmp_path: Path) -> None:
    a, b = TopicPartition("orders", 0), TopicPartition("orders", 1)
    write_high_watermarks(tmp_path, {a: 10, b: 20})
    write_high_watermarks(tmp_path, {a: 15})
    path = tmp_path / "replication-offset-checkpoint"
    assert read_offset_checkpoint(path) == {a: 15, b: 20}
    write_high_watermarks(tmp_path, {b: 30}, merge=False)
    assert read_offset_checkpoint(path) == {b: 30}


def test_appended_results_point_at_the_batches(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t-0", clock=Clock(), fsync=False) as w:
        results = [w.append([ProducerRecord(b"v" * i)] * 2) for i in range(1, 5)]
    seg = segments_of(tmp_path / "t-0")[0]
    headers = list(iter_batch_headers(seg.log_path.read_bytes()))
    assert [(r.position, r.size, r.base_offset, r.last_offset) for r in results] == [
        (h.position, h.size, h.base_offset, h.last_offset) for h in headers]


def test_lost_leader_epoch_checkpoint_is_recovered_from_the_batches(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with LogWriter(directory, clock=Clock(), fsync=False) as w:
        w.append([ProducerRecord(b"a")])
        w.become_leader(3)
        w.append([ProducerRecord(b"b"), ProducerRecord(b"c")])
    (directory / "leader-epoch-checkpoint").unlink()
    with LogWriter(directory, clock=Clock(), fsync=False) as reopened:
        assert reopened.leader_epochs == [EpochEntry(0, 0), EpochEntry(3, 1)]
        reopened.append([ProducerRecord(b"d")])
    assert read_leader_epoch_checkpoint(directory / "leader-epoch-checkpoint") == [
        EpochEntry(0, 0), EpochEntry(3, 1)]


def test_a_corrupt_active_segment_is_refused_on_open(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with LogWriter(directory, clock=Clock(), fsync=False) as w:
        for _ in range(3):
            w.append([ProducerRecord(b"v" * 50)])
    log_path = segments_of(directory)[0].log_path
    data = bytearray(log_path.read_bytes())
    data[80] ^= 1
    log_path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError, match="CRC"):
        LogWriter(directory, clock=Clock(), fsync=False)
    assert log_path.read_bytes() == bytes(data)  # nothing cut: the damage is for a human
