"""Read-only view of a broker's log dirs: which partitions exist, their segments and state.

Each log dir (`log.dirs`) holds one directory per partition, named `{topic}-{partition}`; the
partition number is after the *last* `-`, since topic names may contain `-` and `.`. Beside
them sit Kafka's own files (checkpoints, `meta.properties`, `.lock`) and directories that are
not live partitions:

- `{topic}-{partition}.{uniqueId}-delete`: a deleted partition waiting for async removal;
- `{topic}-{partition}.{uniqueId}-future`: a replica being moved between log dirs
  (`alter-replica-log-dirs`), not yet the partition's log;
- `{topic}-{partition}.{uniqueId}-stray`: a KRaft replica the broker no longer hosts.

Those, and anything else that does not parse, are skipped with a log line, never a crash: one
odd directory must not stop the service for every other partition. Problems with one
partition's state files are recorded on its `PartitionLog.problems` for the same reason.

A scan is a snapshot; `LocalLog.scan()` refreshes it while the broker keeps writing.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tiered.errors import TieredError
from tiered.kafka.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError,
    EpochEntry,
    InvalidTopicPartition,
    TopicPartition,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    read_partition_metadata,
)
from tiered.kafka.segment import Segment, parse_segment_file_name

__all__ = ["LocalLog", "PartitionLog", "ScanResult", "TopicPartition"]

log = logging.getLogger(__name__)

#: suffixes of partition directories that are not the partition's live log, and why
SKIPPED_DIR_SUFFIXES: dict[str, str] = {
    "-delete": "scheduled for deletion",
    "-future": "a future replica being moved between log dirs",
    "-stray": "a stray replica the broker no longer hosts",
}
#: files Kafka keeps at the top of a log dir (not partitions, not worth a log line)
KNOWN_LOG_DIR_FILES = frozenset({
    REPLICATION_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    "cleaner-offset-checkpoint",
    "meta.properties",
    "bootstrap.checkpoint",
    ".lock",
    ".kafka_cleanshutdown",
})


@dataclass(frozen=True)
class PartitionLog:
    """One partition's local log as found by a scan (a snapshot: re-scan to refresh)."""

    tp: TopicPartition
    dir: Path
    #: sorted by base offset; the last one is the active segment (`active=True`)
    segments: tuple[Segment, ...]
    #: from the log dir's replication-offset-checkpoint; None if absent or unreadable
    high_watermark: int | None = None
    #: (epoch, start offset) from leader-epoch-checkpoint, oldest first
    leader_epochs: tuple[EpochEntry, ...] = ()
    #: Kafka topic id from partition.metadata, None if absent or unreadable
    topic_id: uuid.UUID | None = None
    #: from the log dir's log-start-offset-checkpoint and recovery-point-offset-checkpoint
    checkpointed_log_start_offset: int | None = None
    recovery_point: int | None = None
    #: state files that could not be read, one message each
    problems: tuple[str, ...] = field(default=())

    @property
    def topic(self) -> str:
        return self.tp.topic

    @property
    def partition(self) -> int:
        return self.tp.partition

    @property
    def active_segment(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def closed_segments(self) -> tuple[Segment, ...]:
        """Every segment but the active one: immutable, the only ones eligible for upload."""
        return self.segments[:-1]

    @property
    def log_start_offset(self) -> int | None:
        """First offset still in the log: the checkpointed start offset (which retention and
        DeleteRecords move) or the first segment's base offset, whichever is larger."""
        if not self.segments:
            return self.checkpointed_log_start_offset
        base = self.segments[0].base_offset
        checkpointed = self.checkpointed_log_start_offset
        return base if checkpointed is None else max(base, checkpointed)

    def log_end_offset(self) -> int | None:
        """Offset the next appended record will get (reads the active segment's tail)."""
        active = self.active_segment
        return None if active is None else active.next_offset()

    def epoch_for_offset(self, offset: int) -> int | None:
        """Leader epoch that wrote `offset` (Kafka's LeaderEpochFileCache.epochForOffset):
        the entry starting exactly there, else the last one starting before; None if
        `offset` precedes every entry."""
        starts = [e.start_offset for e in self.leader_epochs]
        exact = bisect.bisect_left(starts, offset)
        if exact < len(starts) and starts[exact] == offset:
            return self.leader_epochs[exact].epoch
        slot = bisect.bisect_right(starts, offset) - 1
        return self.leader_epochs[slot].epoch if slot >= 0 else None


@dataclass(frozen=True)
class ScanResult:
    """What changed between two scans."""

    added: tuple[TopicPartition, ...]
    removed: tuple[TopicPartition, ...]
    #: partitions whose set of segments changed (rolled, deleted by retention)
    changed: tuple[TopicPartition, ...]


@dataclass
class _DirCheckpoints:
    high_watermarks: dict[TopicPartition, int] | None
    log_start_offsets: dict[TopicPartition, int]
    recovery_points: dict[TopicPartition, int]
    problems: list[str]


#: a partition directory modified this recently (ns) is re-read whatever its mtime says: a
#: change in the same clock tick as the last look would not move the mtime
RACY_MTIME_NS = 2_000_000_000


class LocalLog:
    """Every partition in a set of Kafka log dirs; `scan()` refreshes the snapshot.

    `reuse_unchanged`: a scan keeps the `PartitionLog` of a partition directory whose
    modification time has not moved (no segment rolled, deleted or renamed, no checkpoint of
    its own rewritten: the broker writes those by rename) and only takes its new offsets from
    the log dir's checkpoints, so a scan of thousands of idle partitions costs a directory
    listing and a `stat` each rather than reading every partition's files. An unchanged
    partition then keeps the very same object, which callers may use to skip work."""

    def __init__(self, log_dirs: Sequence[str | os.PathLike[str]], *,
                 reuse_unchanged: bool = False) -> None:
        if isinstance(log_dirs, (str, os.PathLike)):
            raise TypeError("log_dirs is a sequence of directories, not one path")
        self.log_dirs = tuple(Path(d) for d in log_dirs)
        self.partitions: dict[TopicPartition, PartitionLog] = {}
        self._reuse = reuse_unchanged
        #: partition dir -> (its mtime in ns when last read, what was read)
        self._read: dict[str, tuple[int, PartitionLog]] = {}
        self.scan()

    def __iter__(self) -> Iterator[PartitionLog]:
        return iter(sorted(self.partitions.values(), key=lambda p: p.tp))

    def __len__(self) -> int:
        return len(self.partitions)

    def __contains__(self, tp: object) -> bool:
        return tp in self.partitions

    def partition(self, tp: TopicPartition) -> PartitionLog:
        try:
            return self.partitions[tp]
        except KeyError:
            raise TieredError(f"partition {tp} is not in log dirs "
                              f"{', '.join(map(str, self.log_dirs))}") from None

    def scan(self) -> ScanResult:
        """Re-read every log dir; returns which partitions appeared, vanished or changed."""
        found: dict[TopicPartition, PartitionLog] = {}
        duplicates: set[TopicPartition] = set()
        seen: dict[str, tuple[int, PartitionLog]] | None = {} if self._reuse else None
        for log_dir in self.log_dirs:
            for part in _scan_log_dir(log_dir, self._read if self._reuse else None, seen):
                if part.tp in found:
                    log.error("partition %s is in two log dirs (%s and %s); skipping it",
                              part.tp, found[part.tp].dir, part.dir)
                    duplicates.add(part.tp)
                else:
                    found[part.tp] = part
        for tp in duplicates:
            del found[tp]
        if seen is not None:
            self._read = seen
        old = self.partitions
        self.partitions = found
        return ScanResult(
            added=tuple(sorted(tp for tp in found if tp not in old)),
            removed=tuple(sorted(tp for tp in old if tp not in found)),
            changed=tuple(sorted(
                tp for tp in found
                if tp in old and old[tp] is not found[tp]
                and _segment_files(old[tp]) != _segment_files(found[tp])
            )),
        )


def _segment_files(part: PartitionLog) -> list[int]:
    return [s.base_offset for s in part.segments]


def _read_dir_checkpoints(log_dir: Path) -> _DirCheckpoints:
    problems: list[str] = []

    def read(name: str) -> dict[TopicPartition, int] | None:
        path = log_dir / name
        try:
            return read_offset_checkpoint(path)
        except FileNotFoundError:
            return {}
        except (CheckpointError, OSError) as err:
            log.error("%s; treating its offsets as unknown", err)
            problems.append(str(err))
            return None

    return _DirCheckpoints(
        high_watermarks=read(REPLICATION_OFFSET_CHECKPOINT),
        log_start_offsets=read(LOG_START_OFFSET_CHECKPOINT) or {},
        recovery_points=read(RECOVERY_POINT_OFFSET_CHECKPOINT) or {},
        problems=problems,
    )


#: (path, reason) already reported by this process: a `lost+found` or a `-delete` directory is
#: said once, not on every scan (a daemon scans every few seconds)
_REPORTED: set[tuple[str, str]] = set()
_REPORTED_LOCK = threading.Lock()


def _skipping(path: str, reason: str, level: int) -> None:
    """Log that `path` is skipped, once per process at `level`, then at DEBUG."""
    with _REPORTED_LOCK:
        first = (path, reason) not in _REPORTED
        _REPORTED.add((path, reason))
    log.log(level if first else logging.DEBUG, "%s: %s; skipping", path, reason)


def _scan_log_dir(log_dir: Path, previous: dict[str, tuple[int, PartitionLog]] | None = None,
                  seen: dict[str, tuple[int, PartitionLog]] | None = None
                  ) -> Iterator[PartitionLog]:
    """The partitions of one log dir. With `previous` (see `LocalLog`'s `reuse_unchanged`),
    a directory whose mtime is what it was when last read, and not recent, is not read
    again; `seen` collects what this scan found for the next one."""
    try:
        entries = sorted(os.scandir(log_dir), key=lambda e: e.name)
    except OSError as err:
        log.error("log dir %s is unreadable (%s); skipping it", log_dir, err)
        return
    checkpoints = _read_dir_checkpoints(log_dir)
    now_ns = time.time_ns()
    for entry in entries:
        name = entry.name
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            if name not in KNOWN_LOG_DIR_FILES and not name.endswith(".tmp"):
                _skipping(entry.path, "not a partition directory", logging.INFO)
            continue
        known = None if previous is None else previous.get(entry.path)
        if known is not None and seen is not None:  # read before: named and parsed then
            reused = _reused(entry, known, checkpoints, now_ns)
            if reused is not None:
                seen[entry.path] = reused
                yield reused[1]
                continue
        reason = next((why for suffix, why in SKIPPED_DIR_SUFFIXES.items()
                       if name.endswith(suffix)), None)
        if reason is not None:
            _skipping(entry.path, reason, logging.INFO)
            continue
        try:
            tp = TopicPartition.parse(name)
        except InvalidTopicPartition as err:
            _skipping(entry.path, f"not a partition directory ({err})", logging.WARNING)
            continue
        directory = Path(entry.path)
        if previous is None or seen is None:
            yield _load_partition(tp, directory, checkpoints)
            continue
        mtime_ns = _mtime_ns(entry)
        part = _load_partition(tp, directory, checkpoints)
        seen[entry.path] = (mtime_ns, part)
        yield part


def _mtime_ns(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_mtime_ns
    except OSError:
        return -1


def _reused(entry: os.DirEntry[str], known: tuple[int, PartitionLog],
            checkpoints: _DirCheckpoints, now_ns: int) -> tuple[int, PartitionLog] | None:
    """The partition read last time, with its new offsets, while its directory's mtime is
    what it was then and not recent (see `LocalLog`'s `reuse_unchanged`); None: read it."""
    mtime_ns = _mtime_ns(entry)
    if known[0] == mtime_ns and now_ns - mtime_ns > RACY_MTIME_NS \
            and not checkpoints.problems and not known[1].problems:
        return mtime_ns, _with_offsets(known[1], checkpoints)
    return None


def _with_offsets(part: PartitionLog, dir_state: _DirCheckpoints) -> PartitionLog:
    """`part` with the offsets the log dir's checkpoints now give it (the same object when
    none moved)."""
    hws = dir_state.high_watermarks
    hw = None if hws is None else hws.get(part.tp)
    start = dir_state.log_start_offsets.get(part.tp)
    recovery = dir_state.recovery_points.get(part.tp)
    if (hw, start, recovery) == (part.high_watermark, part.checkpointed_log_start_offset,
                                 part.recovery_point):
        return part
    return dataclasses.replace(part, high_watermark=hw, checkpointed_log_start_offset=start,
                               recovery_point=recovery)


def _load_partition(tp: TopicPartition, directory: Path, dir_state: _DirCheckpoints
                    ) -> PartitionLog:
    problems = list(dir_state.problems)
    bases: list[int] = []
    try:
        names = os.listdir(directory)
    except OSError as err:
        problems.append(f"{directory}: unreadable: {err}")
        names = []
    for name in names:
        base = parse_segment_file_name(name)
        if base is not None:
            bases.append(base)
    bases.sort()
    segments = tuple(
        Segment.in_dir(directory, base, active=(i == len(bases) - 1))
        for i, base in enumerate(bases)
    )

    epochs: tuple[EpochEntry, ...] = ()
    try:
        epochs = tuple(read_leader_epoch_checkpoint(directory / LEADER_EPOCH_CHECKPOINT))
    except FileNotFoundError:
        pass
    except (CheckpointError, OSError) as err:
        log.error("%s", err)
        problems.append(str(err))

    topic_id = None
    try:
        topic_id = read_partition_metadata(directory / PARTITION_METADATA)
    except FileNotFoundError:
        pass
    except (CheckpointError, OSError) as err:
        log.error("%s", err)
        problems.append(str(err))

    hws = dir_state.high_watermarks
    return PartitionLog(
        tp=tp,
        dir=directory,
        segments=segments,
        high_watermark=None if hws is None else hws.get(tp),
        leader_epochs=epochs,
        topic_id=topic_id,
        checkpointed_log_start_offset=dir_state.log_start_offsets.get(tp),
        recovery_point=dir_state.recovery_points.get(tp),
        problems=tuple(problems),
    )
