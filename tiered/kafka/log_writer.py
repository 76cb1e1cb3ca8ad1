"""Write a partition's log the way a Kafka broker does: test data, the demo, and rebuilt logs.

`LogWriter` appends record batches to `{base offset:020d}.log`, fills `.index` / `.timeindex`
with Kafka's rule (`tiered.kafka.index.IndexBuilder`), and rolls to a new segment exactly when
Kafka's LogSegment.shouldRoll would, before the batch that triggers it:

- size: the segment is non-empty and the batch would take it past `segment_bytes`;
- time: the batch's max timestamp is more than `segment_ms` past the segment's first batch's
  max timestamp (when records carry no timestamp, -1: `segment_ms` past the segment's creation
  by the injected clock), as Kafka's timeWaitedForRoll;
- an index is full (`index_size_max_bytes`), or the batch's last offset no longer fits a
  32-bit offset relative to the segment's base.

A rolled or closed segment gets the final time-index entry and trimmed index files, then
fsync; the active segment's index files are either appended to entry by entry or, with
`preallocate_indexes`, preallocated with zeros as a live broker leaves them.

Transactions: the writer follows each transactional producer's open transaction (its first
offset) and, when an abort marker is appended, adds the transaction's entry to the active
segment's `.txnindex` as Kafka's producer state manager does (`tiered.kafka.txnindex`). After a
reopen the open transactions are rebuilt from the log's batch headers before the next
transactional append.

Reopening a directory resumes its newest segment as Kafka's recovery does: a torn tail batch
is cut off and that segment's indexes are rebuilt from its `.log`, so every index this writer
leaves equals `tiered.kafka.segment.build_indexes` of its `.log`.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tiered.errors import TieredError
from tiered.kafka.builder import control_record, encode_batch
from tiered.kafka.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    REPLICATION_OFFSET_CHECKPOINT,
    EpochEntry,
    TopicPartition,
    fsync_dir,
    new_topic_id,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    read_partition_metadata,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
    write_partition_metadata,
)
from tiered.kafka.index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    DEFAULT_INDEX_SIZE_MAX_BYTES,
    INT32_MAX,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    IndexBuilder,
    encode_offset_entry,
    encode_time_entry,
)
from tiered.kafka.records import BatchHeader, Header, Record, decode_batch, iter_batch_headers
from tiered.kafka.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    TXNINDEX_SUFFIX,
    Segment,
    parse_segment_file_name,
    segment_file_name,
)
from tiered.kafka.txnindex import AbortedTxn, encode_txnindex

log = logging.getLogger(__name__)

#: `log.segment.bytes` default: 1 GiB
DEFAULT_SEGMENT_BYTES = 1 << 30
#: `log.roll.ms` / `segment.ms` default: 7 days in ms
DEFAULT_SEGMENT_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class ProducerRecord:
    """A record to append; the writer assigns its offset. `timestamp` is ms since the epoch,
    None for the writer's clock (as a producer stamps records)."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[Header, ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True)
class AppendResult:
    """Where a batch went."""

    base_offset: int
    last_offset: int
    #: base offset of the segment holding the batch, and the batch's byte position in it
    segment_base_offset: int
    position: int
    size: int


class _ActiveSegment:
    """Open files and index state of the segment being written."""

    def __init__(
        self, directory: Path, base_offset: int, writer: LogWriter, *, fresh: bool
    ) -> None:
        self.base_offset = base_offset
        self.log_path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        if fresh and self.log_path.exists() and self.log_path.stat().st_size:
            raise TieredError(f"{self.log_path}: a new segment's file already holds data")
        self.index_path = directory / segment_file_name(base_offset, INDEX_SUFFIX)
        self.timeindex_path = directory / segment_file_name(base_offset, TIMEINDEX_SUFFIX)
        self.txnindex_path = directory / segment_file_name(base_offset, TXNINDEX_SUFFIX)
        self.preallocate = writer.preallocate_indexes
        self.index_size_max_bytes = writer.index_size_max_bytes
        self.builder = IndexBuilder(
            base_offset,
            index_interval_bytes=writer.index_interval_bytes,
            index_size_max_bytes=writer.index_size_max_bytes,
            path=str(self.log_path),
        )
        self.created_ms = writer.now_ms()
        #: max timestamp of the first batch: what time-based rolling measures from
        self.rolling_timestamp: int | None = None
        self.log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.log_fd).st_size
        self.index_fd = self._open_index(self.index_path, OFFSET_INDEX_ENTRY.size)
        self.timeindex_fd = self._open_index(self.timeindex_path, TIME_INDEX_ENTRY.size)

    def _open_index(self, path: Path, entry_size: int) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        if self.preallocate:
            os.ftruncate(fd, self.index_size_max_bytes // entry_size * entry_size)
        return fd

    def recover(self, on_batch: Callable[[BatchHeader], None]) -> int | None:
        """Re-read an existing `.log`: cut a torn tail, rebuild index state, show each batch
        to `on_batch`; the next offset, or None if the segment is empty."""
        segment = Segment(self.base_offset, self.log_path, active=True)
        next_offset = None
        valid_end = 0
        for header in segment.iter_batch_headers():
            on_batch(header)
            if self.rolling_timestamp is None:
                self.rolling_timestamp = header.max_timestamp
            self.record_indexes(header.position, header)
            valid_end = header.end_position
            next_offset = header.next_offset
        if valid_end < self.size:
            log.warning("%s: cutting %d bytes of incomplete batch at byte %d",
                        self.log_path, self.size - valid_end, valid_end)
            os.ftruncate(self.log_fd, valid_end)
            self.size = valid_end
        return next_offset

    def record_indexes(self, position: int, header: BatchHeader) -> None:
        offset_entry, time_entry = self.builder.add(
            position=position, size=header.size, last_offset=header.last_offset,
            max_timestamp=header.max_timestamp,
        )
        if offset_entry is not None:
            slot = len(self.builder.offset_entries) - 1
            self._write_entry(self.index_fd, slot, OFFSET_INDEX_ENTRY.size,
                              encode_offset_entry(offset_entry, self.base_offset))
        if time_entry is not None:
            self._write_time_entry()

    def _write_time_entry(self) -> None:
        slot = len(self.builder.time_entries) - 1
        self._write_entry(self.timeindex_fd, slot, TIME_INDEX_ENTRY.size,
                          encode_time_entry(self.builder.time_entries[-1], self.base_offset))

    def _write_entry(self, fd: int, slot: int, entry_size: int, data: bytes) -> None:
        # an index file only ever grows by whole entries at its end: pwrite at the slot works
        # for the preallocated file and the plain one alike
        os.pwrite(fd, data, slot * entry_size)

    def append(self, data: bytes | memoryview, header: BatchHeader) -> int:
        position = self.size
        _write_all(self.log_fd, data)
        if position == 0:
            self.rolling_timestamp = header.max_timestamp
        self.size += header.size
        self.record_indexes(position, header)
        return position

    def add_aborted(self, entry: AbortedTxn, *, fsync: bool) -> None:
        """Append one entry to this segment's transaction index (created on first use)."""
        fd = os.open(self.txnindex_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _write_all(fd, encode_txnindex([entry]))
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def should_roll(self, header: BatchHeader, now_ms: int, segment_bytes: int,
                    segment_ms: int) -> bool:
        if self.size == 0:
            return False
        rolling = self.rolling_timestamp
        waited = (header.max_timestamp - rolling if rolling is not None and rolling >= 0
                  else now_ms - self.created_ms)
        return (
            self.size > segment_bytes - header.size
            or waited > segment_ms
            or self.builder.is_full
            or header.last_offset - self.base_offset > INT32_MAX
        )

    def finish(self, *, fsync: bool) -> None:
        """Close as Kafka does on roll or shutdown: final time entry, trimmed indexes."""
        if self.builder.close() is not None:
            self._write_time_entry()
        os.ftruncate(self.index_fd, len(self.builder.offset_entries) * OFFSET_INDEX_ENTRY.size)
        os.ftruncate(self.timeindex_fd,
                     len(self.builder.time_entries) * TIME_INDEX_ENTRY.size)
        for fd in (self.log_fd, self.index_fd, self.timeindex_fd):
            if fsync:
                os.fsync(fd)
            os.close(fd)

    def flush(self) -> None:
        for fd in (self.log_fd, self.index_fd, self.timeindex_fd):
            os.fsync(fd)

    def abandon(self) -> None:
        """Close the files without finishing the segment (opening it failed)."""
        for fd in (self.log_fd, self.index_fd, self.timeindex_fd):
            os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class LogWriter:
    """Appends to one partition directory; not thread-safe (one writer per partition, as
    Kafka holds the log lock). Use as a context manager so the last segment is closed."""

    def __init__(
        self,
        partition_dir: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        segment_ms: int = DEFAULT_SEGMENT_MS,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        index_size_max_bytes: int = DEFAULT_INDEX_SIZE_MAX_BYTES,
        preallocate_indexes: bool = False,
        topic_id: uuid.UUID | None = None,
        start_offset: int = 0,
        clock: Callable[[], float] = time.time,
        fsync: bool = True,
    ) -> None:
        """`clock` returns seconds since the epoch (like time.time); `start_offset` is the
        first offset of a new, empty log; `topic_id` must match an existing partition.metadata
        and is generated when neither exists."""
        if segment_bytes <= 0 or segment_ms <= 0:
            raise ValueError("segment_bytes and segment_ms must be positive")
        if index_size_max_bytes < TIME_INDEX_ENTRY.size:
            raise ValueError(f"index_size_max_bytes must be >= {TIME_INDEX_ENTRY.size}")
        self.partition_dir = Path(partition_dir)
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self.index_interval_bytes = index_interval_bytes
        self.index_size_max_bytes = index_size_max_bytes
        self.preallocate_indexes = preallocate_indexes
        self.fsync = fsync
        self._clock = clock
        self.partition_dir.mkdir(parents=True, exist_ok=True)
        self.topic_id = self._init_topic_id(topic_id)
        epoch_path = self.partition_dir / LEADER_EPOCH_CHECKPOINT
        self._epochs = read_leader_epoch_checkpoint(epoch_path) if epoch_path.exists() else []

        bases = sorted(
            base for name in os.listdir(self.partition_dir)
            if (base := parse_segment_file_name(name)) is not None
        )
        self._closed: list[int] = bases[:-1]
        self._active = _ActiveSegment(
            self.partition_dir, bases[-1] if bases else start_offset, self, fresh=not bases
        )
        if not bases:
            if fsync:
                fsync_dir(self.partition_dir)
            self._leo = start_offset
        else:
            try:
                recovered = self._active.recover(self._recover_epoch)
            except BaseException:
                self._active.abandon()
                raise
            self._leo = recovered if recovered is not None else bases[-1]
        self._closed_flag = False
        #: producer id -> first offset of its open transaction; None until first needed after
        #: a reopen (rebuilt from the log then)
        self._open_txns: dict[int, int] | None = None if bases else {}

    def _init_topic_id(self, topic_id: uuid.UUID | None) -> uuid.UUID:
        path = self.partition_dir / PARTITION_METADATA
        if path.exists():
            existing = read_partition_metadata(path)
            if topic_id is not None and topic_id != existing:
                raise TieredError(
                    f"{path}: topic id {existing} is not the expected {topic_id} (a deleted and "
                    "recreated topic?)"
                )
            return existing
        chosen = topic_id if topic_id is not None else new_topic_id()
        write_partition_metadata(path, chosen, sync=self.fsync)
        return chosen

    # --- state -------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    @property
    def log_end_offset(self) -> int:
        return self._leo

    @property
    def active_base_offset(self) -> int:
        return self._active.base_offset

    @property
    def segment_base_offsets(self) -> list[int]:
        return [*self._closed, self._active.base_offset]

    @property
    def leader_epochs(self) -> list[EpochEntry]:
        return list(self._epochs)

    @property
    def leader_epoch(self) -> int:
        """The latest leader epoch (0 before any is assigned: Kafka's first epoch)."""
        return self._epochs[-1].epoch if self._epochs else 0

    # --- leader epochs -----------------------------------------------------------------------

    def become_leader(self, epoch: int) -> None:
        """Start leader epoch `epoch` at the current log end offset, as a newly elected leader
        does, and checkpoint it."""
        self._assign_epoch(epoch, self._leo)

    def _recover_epoch(self, header: BatchHeader) -> None:
        """Kafka's recovery fills a lost or stale leader-epoch-checkpoint from the batches."""
        if header.partition_leader_epoch > self.leader_epoch or not self._epochs:
            self._assign_epoch(header.partition_leader_epoch, header.base_offset)

    def _assign_epoch(self, epoch: int, start_offset: int) -> None:
        if epoch < 0:
            return  # batches without an epoch (converted from magic 0/1) start nothing
        if self._epochs and epoch < self._epochs[-1].epoch:
            raise ValueError(
                f"leader epoch {epoch} is below the latest, {self._epochs[-1].epoch}: a fenced "
                "leader cannot append"
            )
        if self._epochs and epoch == self._epochs[-1].epoch:
            return
        self._epochs.append(EpochEntry(epoch, start_offset))
        write_leader_epoch_checkpoint(self.partition_dir / LEADER_EPOCH_CHECKPOINT,
                                      self._epochs, sync=self.fsync)

    # --- appending ---------------------------------------------------------------------------

    def append(
        self,
        records: Sequence[ProducerRecord],
        *,
        compression: str = "none",
        leader_epoch: int | None = None,
        timestamp_type: str = "create",
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        transactional: bool = False,
    ) -> AppendResult:
        """Encode `records` as one batch at the log end offset and append it. Records without
        a timestamp get the clock's; a `log_append` batch's max timestamp is the clock's."""
        self._check_open()
        now = self.now_ms()
        base = self._leo
        batch = encode_batch(
            [
                Record(base + i, now if r.timestamp is None else r.timestamp, r.key, r.value,
                       r.headers)
                for i, r in enumerate(records)
            ],
            base_offset=base,
            compression=compression,
            timestamp_type=timestamp_type,
            partition_leader_epoch=self.leader_epoch if leader_epoch is None else leader_epoch,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            transactional=transactional,
            max_timestamp=now if timestamp_type == "log_append" else None,
        )
        return self.append_batches(batch)[0]

    def append_control(
        self, kind: str, *, producer_id: int, producer_epoch: int, coordinator_epoch: int = 0,
        leader_epoch: int | None = None,
    ) -> AppendResult:
        """Append a transaction marker ("commit" or "abort") as the coordinator would."""
        self._check_open()
        now = self.now_ms()
        batch = encode_batch(
            [control_record(kind, coordinator_epoch, offset=self._leo, timestamp=now)],
            base_offset=self._leo,
            partition_leader_epoch=self.leader_epoch if leader_epoch is None else leader_epoch,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            transactional=True,
            control=True,
        )
        return self.append_batches(batch)[0]

    def append_batches(
        self, data: bytes | memoryview, *, allow_gaps: bool = False
    ) -> list[AppendResult]:
        """Append one or more encoded batches as they are (a follower's append). Each is
        CRC-checked first; the first base offset must equal the log end offset (with
        `allow_gaps`, be at or above it, as when copying a compacted log). Nothing is written
        if any batch is refused."""
        self._check_open()
        headers = list(iter_batch_headers(data, path="<appended batches>"))
        expected = self._leo
        epoch = self._epochs[-1].epoch if self._epochs else -1
        for header in headers:
            if header.base_offset != expected and not (
                allow_gaps and header.base_offset > expected
            ):
                what = ("the log end offset" if expected == self._leo
                        else "the previous batch's next offset")
                raise ValueError(
                    f"batch base offset {header.base_offset} at byte {header.position} of the "
                    f"input is not {expected}, {what}"
                )
            if 0 <= header.partition_leader_epoch < epoch:
                raise ValueError(
                    f"batch at offset {header.base_offset} has leader epoch "
                    f"{header.partition_leader_epoch}, below the latest, {epoch}: a fenced "
                    "leader cannot append"
                )
            epoch = max(epoch, header.partition_leader_epoch)
            expected = header.next_offset
        view = memoryview(data)
        if self._open_txns is None and any(h.is_transactional for h in headers):
            self._open_txns = self._rebuild_open_transactions()
        results = []
        for header in headers:
            self._assign_epoch(header.partition_leader_epoch, header.base_offset)
            if self._active.should_roll(header, self.now_ms(), self.segment_bytes,
                                        self.segment_ms):
                self._roll(header.base_offset)
            position = self._active.append(
                view[header.position : header.end_position], header
            )
            self._leo = header.next_offset
            if header.is_transactional:
                self._follow_transaction(header, view)
            results.append(AppendResult(header.base_offset, header.last_offset,
                                        self._active.base_offset, position, header.size))
        return results

    # --- transactions ------------------------------------------------------------------------

    def _follow_transaction(self, header: BatchHeader, view: memoryview) -> None:
        """After appending a transactional batch: open its producer's transaction, or close
        it at a marker, indexing it when the marker is an abort."""
        assert self._open_txns is not None  # noqa: S101 - rebuilt before the append
        pid = header.producer_id
        if not header.is_control:
            self._open_txns.setdefault(pid, header.base_offset)
            return
        first = self._open_txns.pop(pid, None)
        kind = decode_batch(view, header.position, path=str(self.partition_dir)).control_type
        if kind != "abort":
            return
        # the LSO once the marker is written: the first offset of the transactions still open
        lso = min(self._open_txns.values(), default=header.last_offset + 1)
        entry = AbortedTxn(pid, header.base_offset if first is None else first,
                           header.last_offset, lso)
        self._active.add_aborted(entry, fsync=self.fsync)

    def _rebuild_open_transactions(self) -> dict[int, int]:
        """The transactions open at the log end, from every segment's batch headers (a
        marker of either kind closes its producer's transaction)."""
        open_txns: dict[int, int] = {}
        for base in self.segment_base_offsets:
            segment = Segment(base, self.partition_dir / segment_file_name(base, LOG_SUFFIX),
                              active=base == self._active.base_offset)
            for h in segment.iter_batch_headers():
                if not h.is_transactional:
                    continue
                if h.is_control:
                    open_txns.pop(h.producer_id, None)
                else:
                    open_txns.setdefault(h.producer_id, h.base_offset)
        return open_txns

    # --- rolling and closing -----------------------------------------------------------------

    def roll(self) -> None:
        """Close the active segment and start a new one at the log end offset (no-op while
        the active segment is empty)."""
        self._check_open()
        if self._active.size:
            self._roll(self._leo)

    def _roll(self, base_offset: int) -> None:
        self._active.finish(fsync=self.fsync)
        self._closed.append(self._active.base_offset)
        self._active = _ActiveSegment(self.partition_dir, base_offset, self, fresh=True)
        if self.fsync:
            fsync_dir(self.partition_dir)

    def flush(self) -> None:
        """fsync the active segment's files."""
        self._check_open()
        self._active.flush()

    def close(self) -> None:
        """Finish the active segment as a clean broker shutdown does (idempotent)."""
        if not self._closed_flag:
            self._closed_flag = True
            self._active.finish(fsync=self.fsync)

    def _check_open(self) -> None:
        if self._closed_flag:
            raise ValueError(f"LogWriter for {self.partition_dir} is closed")

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def write_high_watermarks(
    log_dir: str | os.PathLike[str],
    watermarks: Mapping[TopicPartition, int],
    *,
    merge: bool = True,
    fsync: bool = True,
) -> None:
    """Write the log dir's `replication-offset-checkpoint` (high watermark per partition);
    with `merge`, partitions already in the file and not in `watermarks` are kept."""
    path = Path(log_dir) / REPLICATION_OFFSET_CHECKPOINT
    offsets: dict[TopicPartition, int] = {}
    if merge and path.exists():
        offsets.update(read_offset_checkpoint(path))
    offsets.update(watermarks)
    write_offset_checkpoint(path, offsets, sync=fsync)
