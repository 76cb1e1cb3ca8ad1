"""Kafka's small state files in a log dir, read and written byte-compatibly with the broker.

Checkpoint files (Kafka's CheckpointFile) are text:

    0                  version
    2                  number of entries
    orders 0 1200      one entry per line, fields separated by whitespace
    orders 1 980

- `replication-offset-checkpoint`, `recovery-point-offset-checkpoint`,
  `log-start-offset-checkpoint` (in each log dir): `topic partition offset`;
- `leader-epoch-checkpoint` (in each partition dir): `epoch startOffset`.

`partition.metadata` (partition dir) is `version: 0` and `topic_id: <id>` on two lines, the
id being Kafka's Uuid string: 16 bytes in URL-safe base64 without padding.

Writes go to `<file>.tmp`, are fsynced, renamed over the file and the directory fsynced, as the
broker does, so a crash leaves the old file or the new one, never half of either.

`TopicPartition` lives here because these files are where Kafka's on-disk format first names a
partition; `tiered.kafka.local_log` re-exports it.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tiered.errors import TieredError
from tiered.topics import topic_name_problem

CHECKPOINT_VERSION = 0
PARTITION_METADATA_VERSION = 0

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"

_WHITESPACE = re.compile(r"\s+")

T = TypeVar("T")


class CheckpointError(TieredError):
    """A checkpoint or partition.metadata file does not parse; names the file and line."""

    exit_code = 3

    def __init__(self, reason: str, *, path: str | os.PathLike[str], line: int | None = None):
        self.reason = reason
        self.path = str(path)
        self.line = line
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {reason}")


class InvalidTopicPartition(TieredError, ValueError):
    """A topic name or partition number Kafka would not accept (and that could escape a
    directory, like `../x`)."""

    exit_code = 2


def check_topic_name(topic: str) -> str:
    """`topic` if Kafka accepts it as a topic name, else InvalidTopicPartition."""
    problem = topic_name_problem(topic)
    if problem is not None:
        raise InvalidTopicPartition(f"illegal topic name: {problem}")
    return topic


@dataclass(frozen=True, order=True, slots=True)
class TopicPartition:
    """A partition's identity; validated so it is always safe as a path component."""

    topic: str
    partition: int

    def __post_init__(self) -> None:
        check_topic_name(self.topic)
        if isinstance(self.partition, bool) or not isinstance(self.partition, int):
            raise InvalidTopicPartition(f"partition must be an int, not {self.partition!r}")
        if self.partition < 0:
            raise InvalidTopicPartition(f"partition must be >= 0, not {self.partition}")

    @property
    def dir_name(self) -> str:
        """The partition's directory name in a log dir: `{topic}-{partition}`."""
        return f"{self.topic}-{self.partition}"

    def __str__(self) -> str:
        return self.dir_name

    @classmethod
    def parse(cls, name: str) -> TopicPartition:
        """Parse `{topic}-{partition}`; the partition is after the last `-`, as topic names
        may themselves hold `-`."""
        topic, sep, number = name.rpartition("-")
        if not sep or not number.isascii() or not number.isdigit():
            raise InvalidTopicPartition(f"{name!r} is not `topic-partition`")
        return cls(topic, int(number))


@dataclass(frozen=True, order=True, slots=True)
class EpochEntry:
    """A leader epoch and the first offset written in it."""

    epoch: int
    start_offset: int


# --- generic checkpoint files ----------------------------------------------------------------


def atomic_write(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data` all at once: write `<path>.tmp`, fsync, rename, fsync dir."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or file creation in `directory` durable (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def _parse_int(text: str, path: Path, line: int, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"{what} {text!r} is not an integer", path=path, line=line) from None


def read_checkpoint(
    path: str | os.PathLike[str], parse_entry: Callable[[list[str], Path, int], T]
) -> list[T]:
    """Read a Kafka checkpoint file; `parse_entry(fields, path, line_number)` builds each entry
    and raises CheckpointError for bad fields. An empty file, or one with only the version line,
    is empty, as in Kafka."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError(f"not UTF-8 text: {err}", path=path) from None
    lines = text.splitlines()
    if not lines:
        return []
    version = _parse_int(lines[0].strip(), path, 1, "version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"unrecognised version {version}, expected {CHECKPOINT_VERSION}", path=path, line=1
        )
    if len(lines) == 1:
        return []
    expected = _parse_int(lines[1].strip(), path, 2, "entry count")
    if expected < 0:
        raise CheckpointError(f"negative entry count {expected}", path=path, line=2)
    entries = []
    for number, line in enumerate(lines[2:], start=3):
        fields = _WHITESPACE.split(line.strip())
        entries.append(parse_entry(fields, path, number))
    if len(entries) != expected:
        raise CheckpointError(
            f"expected {expected} entries, found {len(entries)}", path=path, line=2
        )
    return entries


def write_checkpoint(
    path: str | os.PathLike[str], lines: Sequence[str], *, sync: bool = True
) -> None:
    """Write a checkpoint file (version, count, one line per entry) atomically."""
    body = [str(CHECKPOINT_VERSION), str(len(lines)), *lines]
    atomic_write(path, "".join(f"{line}\n" for line in body).encode("utf-8"), sync=sync)


# --- offset checkpoints (log dir) ------------------------------------------------------------


def _parse_offset_entry(fields: list[str], path: Path, line: int) -> tuple[TopicPartition, int]:
    if len(fields) != 3:
        raise CheckpointError(
            f"expected `topic partition offset`, got {' '.join(fields)!r}", path=path, line=line
        )
    topic, partition_text, offset_text = fields
    partition = _parse_int(partition_text, path, line, "partition")
    offset = _parse_int(offset_text, path, line, "offset")
    if offset < 0:
        raise CheckpointError(f"negative offset {offset}", path=path, line=line)
    try:
        return TopicPartition(topic, partition), offset
    except InvalidTopicPartition as err:
        raise CheckpointError(str(err), path=path, line=line) from None


def read_offset_checkpoint(path: str | os.PathLike[str]) -> dict[TopicPartition, int]:
    """`replication-offset-checkpoint` and friends: offset per partition (last line wins on a
    repeated partition, as Kafka's map does)."""
    return dict(read_checkpoint(path, _parse_offset_entry))


def write_offset_checkpoint(
    path: str | os.PathLike[str], offsets: Mapping[TopicPartition, int], *, sync: bool = True
) -> None:
    for tp, offset in offsets.items():
        if offset < 0:
            raise ValueError(f"{tp}: negative offset {offset}")
    write_checkpoint(
        path, [f"{tp.topic} {tp.partition} {offset}" for tp, offset in sorted(offsets.items())],
        sync=sync,
    )


# --- leader-epoch-checkpoint (partition dir) -------------------------------------------------


def _parse_epoch_entry(fields: list[str], path: Path, line: int) -> EpochEntry:
    if len(fields) != 2:
        raise CheckpointError(
            f"expected `epoch startOffset`, got {' '.join(fields)!r}", path=path, line=line
        )
    epoch = _parse_int(fields[0], path, line, "epoch")
    start = _parse_int(fields[1], path, line, "start offset")
    if epoch < 0 or start < 0:
        raise CheckpointError(f"negative epoch or offset in {fields}", path=path, line=line)
    return EpochEntry(epoch, start)


def read_leader_epoch_checkpoint(path: str | os.PathLike[str]) -> list[EpochEntry]:
    """Leader epochs in order; epochs strictly increase and start offsets never decrease, the
    shape Kafka's LeaderEpochFileCache keeps (anything else is refused as corrupt)."""
    entries = read_checkpoint(path, _parse_epoch_entry)
    for number, (prev, cur) in enumerate(zip(entries, entries[1:], strict=False), start=4):
        if cur.epoch <= prev.epoch or cur.start_offset < prev.start_offset:
            raise CheckpointError(
                f"entry {cur.epoch} {cur.start_offset} does not follow "
                f"{prev.epoch} {prev.start_offset}: epochs must increase and offsets not "
                "decrease",
                path=path,
                line=number,
            )
    return entries


def write_leader_epoch_checkpoint(
    path: str | os.PathLike[str], entries: Iterable[EpochEntry], *, sync: bool = True
) -> None:
    write_checkpoint(path, [f"{e.epoch} {e.start_offset}" for e in entries], sync=sync)


# --- partition.metadata and topic ids --------------------------------------------------------


def topic_id_to_str(topic_id: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, no padding (22 characters)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode("ascii")


def topic_id_from_str(text: str) -> uuid.UUID:
    """Inverse of `topic_id_to_str`; ValueError if `text` is not a 16-byte Kafka Uuid."""
    if len(text) != 22:
        raise ValueError(f"topic id {text!r} is not 22 characters of URL-safe base64")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"topic id {text!r} is not URL-safe base64: {err}") from None
    if len(raw) != 16 or topic_id_to_str(uuid.UUID(bytes=raw)) != text:
        raise ValueError(f"topic id {text!r} is not a canonical 16-byte Kafka Uuid")
    return uuid.UUID(bytes=raw)


#: Kafka's reserved Uuids: ZERO_UUID and METADATA_TOPIC_ID
_RESERVED_IDS = (uuid.UUID(int=0), uuid.UUID(int=1))


def new_topic_id() -> uuid.UUID:
    """A random topic id as Kafka's Uuid.randomUuid makes them: never reserved, and never one
    whose string form starts with `-` (it would read as a command-line flag)."""
    while True:
        candidate = uuid.uuid4()
        if candidate not in _RESERVED_IDS and not topic_id_to_str(candidate).startswith("-"):
            return candidate


def read_partition_metadata(path: str | os.PathLike[str]) -> uuid.UUID:
    """The topic id in a `partition.metadata` file."""
    path = Path(path)
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise CheckpointError(f"not UTF-8 text: {err}", path=path) from None
    if len(lines) < 2:
        raise CheckpointError(
            f"expected `version: 0` and `topic_id: <id>` lines, found {len(lines)} line(s)",
            path=path,
        )
    values = []
    for number, key in ((1, "version"), (2, "topic_id")):
        name, sep, value = lines[number - 1].partition(":")
        if not sep or name.strip() != key or not value.strip():
            raise CheckpointError(
                f"expected `{key}: <value>`, got {lines[number - 1]!r}", path=path, line=number
            )
        values.append(value.strip())
    version = _parse_int(values[0], path, 1, "version")
    if version != PARTITION_METADATA_VERSION:
        raise CheckpointError(
            f"unrecognised version {version}, expected {PARTITION_METADATA_VERSION}",
            path=path,
            line=1,
        )
    try:
        topic_id = topic_id_from_str(values[1])
    except ValueError as err:
        raise CheckpointError(str(err), path=path, line=2) from None
    if topic_id == _RESERVED_IDS[0]:
        raise CheckpointError("topic id is the zero Uuid", path=path, line=2)
    return topic_id


def write_partition_metadata(
    path: str | os.PathLike[str], topic_id: uuid.UUID, *, sync: bool = True
) -> None:
    """Write `partition.metadata` exactly as Kafka's PartitionMetadata.encode (no final
    newline)."""
    if topic_id == _RESERVED_IDS[0]:
        raise ValueError("the zero Uuid is not a topic id")
    text = f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {topic_id_to_str(topic_id)}"
    atomic_write(path, text.encode("utf-8"), sync=sync)


#: the broker's identity file at the top of each log dir
META_PROPERTIES = "meta.properties"


def read_meta_properties(log_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The `key=value` lines of a log dir's `meta.properties` (`node.id` on KRaft brokers,
    `broker.id` on ZooKeeper ones, `cluster.id`, ...); {} when the file is absent or
    unreadable: it is the broker's, and only a hint to us."""
    try:
        text = (Path(log_dir) / META_PROPERTIES).read_text("utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out
