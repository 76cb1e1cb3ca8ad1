"""`tiered log dump`: what is in a `.log`, `.index` or `.timeindex` file, like
`kafka-dump-log.sh`, but it keeps going past damage and says where it is.

A `.log` is walked batch by batch with ranged reads. A batch whose CRC-32C does not match is
listed with `crcStatus: BAD` and the walk goes on to the next batch as long as the length field
still fits the file; a length that does not (a torn write) or that is impossible ends the walk
with a problem. Zeros at the end (a preallocated active segment) are noted, not a problem.

Index files are listed entry by entry with Kafka's checks (size a multiple of the entry,
offsets and timestamps never going back), stopping at the zero tail of a preallocated index
as kafka-dump-log does; an `.index` is also checked against the `.log` beside it, when there
is one. `DumpReport.ok` is False when anything is corrupt; the CLI exits non-zero then.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.index import (
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    IndexEntry,
    TimeIndexEntry,
)
from tiered.kafka.records import (
    ATTRIBUTES_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    BatchHeader,
    Record,
    decode_batch,
    read_batch_header,
)
from tiered.kafka.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    LogFile,
    segment_file_name,
)

#: suffixes Kafka appends to segment files being deleted, cleaned or swapped in
_TRANSIENT_SUFFIXES = (".deleted", ".cleaned", ".swap")
_INT32_MAX = (1 << 31) - 1
#: bytes checked per read when deciding whether a file's tail is all zeros
_ZERO_SCAN_BYTES = 1 << 20
#: magic bytes of the legacy message formats, whose entries can be skipped but not read
_OLD_MAGICS = (0, 1)
_TIMESTAMP_TYPE_NAMES = {"create": "CreateTime", "log_append": "LogAppendTime"}


@dataclass(frozen=True)
class DumpProblem:
    """Something corrupt, at a byte position of the dumped file (None: the whole file)."""

    position: int | None
    message: str


@dataclass(frozen=True)
class BatchDump:
    header: BatchHeader
    computed_crc: int
    #: decoded records (with --records and a good CRC), else None
    records: tuple[Record, ...] | None = None
    #: for a control batch's records: "commit", "abort", ...
    control_type: str | None = None

    @property
    def crc_ok(self) -> bool:
        return self.header.crc == self.computed_crc

    @property
    def last_sequence(self) -> int:
        """Kafka's DefaultRecordBatch.lastSequence (sequences wrap at Int32 max)."""
        return _add_sequence(self.header.base_sequence, self.header.last_offset_delta)


def _add_sequence(base: int, delta: int) -> int:
    if base < 0:
        return -1
    if base > _INT32_MAX - delta:
        return delta - (_INT32_MAX - base) - 1
    return base + delta


@dataclass
class DumpReport:
    path: Path
    #: "log", "index" or "timeindex"
    kind: str
    #: from the 20-digit file name; None if the name has none
    base_offset: int | None
    batches: list[BatchDump] = field(default_factory=list)
    offset_entries: list[IndexEntry] = field(default_factory=list)
    time_entries: list[TimeIndexEntry] = field(default_factory=list)
    problems: list[DumpProblem] = field(default_factory=list)
    #: worth knowing, not corruption (zero tails, index entries Kafka < 3.8 might write)
    notes: list[str] = field(default_factory=list)
    with_records: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, position: int | None, message: str) -> None:
        self.problems.append(DumpProblem(position, message))

    # --- output ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": str(self.path),
            "kind": self.kind,
            "base_offset": self.base_offset,
            "ok": self.ok,
        }
        if self.kind == "log":
            out["batches"] = [_batch_json(b) for b in self.batches]
        elif self.kind == "index":
            out["entries"] = [{"offset": e.offset, "position": e.position}
                              for e in self.offset_entries]
        else:
            out["entries"] = [{"timestamp": e.timestamp, "offset": e.offset}
                              for e in self.time_entries]
        out["problems"] = [{"position": p.position, "message": p.message}
                           for p in self.problems]
        out["notes"] = list(self.notes)
        return out

    def lines(self) -> Iterator[str]:
        """Human output, close to kafka-dump-log's."""
        yield f"Dumping {self.path}"
        if self.kind == "log":
            if self.base_offset is not None:
                yield f"Log starting offset: {self.base_offset}"
            for batch in self.batches:
                yield _batch_line(batch)
                for record in batch.records or ():
                    yield _record_line(batch, record)
        elif self.kind == "index":
            for entry in self.offset_entries:
                yield f"offset: {entry.offset} position: {entry.position}"
        else:
            for time_entry in self.time_entries:
                yield f"timestamp: {time_entry.timestamp} offset: {time_entry.offset}"
        for note in self.notes:
            yield f"note: {note}"
        for problem in self.problems:
            where = "" if problem.position is None else f"byte {problem.position}: "
            yield f"error: {where}{problem.message}"
        count = {"log": len(self.batches), "index": len(self.offset_entries),
                 "timeindex": len(self.time_entries)}[self.kind]
        noun = "batches" if self.kind == "log" else "entries"
        status = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        yield f"{count} {noun}, {status}"


def _render(data: bytes | None) -> tuple[str | None, str | None]:
    """(text, encoding): UTF-8 when printable, else base64."""
    if data is None:
        return None, None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text, "utf-8"
    return base64.b64encode(data).decode("ascii"), "base64"


def _shown(data: bytes | None) -> str:
    text, encoding = _render(data)
    if text is None:
        return "null"
    return text if encoding == "utf-8" else f"base64:{text}"


def _batch_json(batch: BatchDump) -> dict[str, Any]:
    h = batch.header
    out: dict[str, Any] = {
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "count": h.records_count,
        "position": h.position,
        "size": h.size,
        "first_timestamp": h.first_timestamp,
        "max_timestamp": h.max_timestamp,
        "timestamp_type": h.timestamp_type,
        "partition_leader_epoch": h.partition_leader_epoch,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
        "last_sequence": batch.last_sequence,
        "magic": h.magic,
        "compression": h.compression,
        "transactional": h.is_transactional,
        "control": h.is_control,
        "crc": h.crc,
        "computed_crc": batch.computed_crc,
        "crc_status": "OK" if batch.crc_ok else "BAD",
    }
    if batch.records is not None:
        records = []
        for r in batch.records:
            key, key_encoding = _render(r.key)
            value, value_encoding = _render(r.value)
            item: dict[str, Any] = {
                "offset": r.offset,
                "timestamp": r.timestamp,
                "key_size": -1 if r.key is None else len(r.key),
                "value_size": -1 if r.value is None else len(r.value),
                "key": key,
                "key_encoding": key_encoding,
                "value": value,
                "value_encoding": value_encoding,
                "headers": [
                    dict(zip(("key", "value", "value_encoding"), (hd.key, *_render(hd.value)),
                             strict=True))
                    for hd in r.headers
                ],
            }
            if batch.control_type is not None:
                item["control_type"] = batch.control_type
            records.append(item)
        out["records"] = records
    return out


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _batch_line(batch: BatchDump) -> str:
    h = batch.header
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {batch.last_sequence} "
        f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
        f"partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {_flag(h.is_transactional)} isControl: {_flag(h.is_control)} "
        f"position: {h.position} firstTimestamp: {h.first_timestamp} "
        f"{_TIMESTAMP_TYPE_NAMES[h.timestamp_type]}: {h.max_timestamp} size: {h.size} "
        f"magic: {h.magic} compresscodec: {h.compression} crc: 0x{h.crc:08x} "
        f"crcStatus: {'OK' if batch.crc_ok else 'BAD'}"
    )


def _record_line(batch: BatchDump, r: Record) -> str:
    h = batch.header
    sequence = _add_sequence(h.base_sequence, r.offset - h.base_offset)
    line = (
        f"| offset: {r.offset} {_TIMESTAMP_TYPE_NAMES[h.timestamp_type]}: {r.timestamp} "
        f"keySize: {-1 if r.key is None else len(r.key)} "
        f"valueSize: {-1 if r.value is None else len(r.value)} sequence: {sequence} "
        f"headerKeys: [{','.join(hd.key for hd in r.headers)}]"
    )
    if batch.control_type is not None:
        return f"{line} controlType: {batch.control_type}"
    return f"{line} key: {_shown(r.key)} payload: {_shown(r.value)}"


# --- walking the files -----------------------------------------------------------------------


def _all_zero(f: LogFile, start: int) -> bool:
    pos = start
    while pos < f.size:
        chunk = f.read(pos, min(_ZERO_SCAN_BYTES, f.size - pos))
        if chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def _dump_log(path: Path, report: DumpReport) -> None:
    prev_next_offset: int | None = None
    with LogFile(path, active=False) as f:
        pos = 0
        while pos < f.size:
            left = f.size - pos
            if left < LOG_OVERHEAD:
                report.problem(pos, f"truncated: {left} bytes at the end, too few for a batch")
                return
            prefix = f.read(pos, LOG_OVERHEAD)
            base_offset = int.from_bytes(prefix[:8], "big", signed=True)
            length = int.from_bytes(prefix[8:], "big", signed=True)
            if base_offset == 0 and length == 0 and _all_zero(f, pos):
                report.notes.append(f"{left} zero bytes from byte {pos} to the end "
                                    "(preallocated space of an active segment)")
                return
            if length < 0 or length + LOG_OVERHEAD > left:
                report.problem(pos, f"truncated: batch length {length} needs "
                                    f"{length + LOG_OVERHEAD} bytes, {left} left in the file")
                return
            data = f.read(pos, length + LOG_OVERHEAD)
            magic = data[MAGIC_OFFSET] if len(data) > MAGIC_OFFSET else None
            if magic in _OLD_MAGICS:
                # a v0/v1 message set entry has the same offset + length prefix: skippable
                report.problem(pos, f"unsupported magic {magic} (only v2 batches are read); "
                                    f"skipping its {len(data)} bytes")
                pos += len(data)
                continue
            if magic != MAGIC_V2:
                report.problem(pos, f"no batch here (magic {magic}); cannot find the next one")
                return
            if length < MIN_BATCH_LENGTH:
                report.problem(pos, f"batch length {length} is below the minimum "
                                    f"{MIN_BATCH_LENGTH}; cannot find the next batch")
                return
            try:
                header = read_batch_header(data, 0, path=str(path), verify_crc=False)
            except CorruptSegmentError as err:
                report.problem(pos, err.reason)
                pos += len(data)
                continue
            header = header._replace(position=pos)
            batch = BatchDump(header, crc32c.crc32c(memoryview(data)[ATTRIBUTES_OFFSET:]))
            if not batch.crc_ok:
                report.problem(pos, f"CRC-32C mismatch in batch at offset {header.base_offset}: "
                                    f"stored 0x{header.crc:08x}, "
                                    f"computed 0x{batch.computed_crc:08x}")
            elif report.with_records:
                batch = _with_records(batch, data, report)
            if prev_next_offset is not None and header.base_offset < prev_next_offset:
                report.problem(pos, f"batch base offset {header.base_offset} is below the "
                                    f"previous batch's next offset {prev_next_offset}")
            prev_next_offset = header.next_offset
            report.batches.append(batch)
            pos += header.size


def _with_records(batch: BatchDump, data: bytes, report: DumpReport) -> BatchDump:
    try:
        decoded = decode_batch(data, 0, path=str(report.path))
    except CorruptSegmentError as err:
        report.problem(batch.header.position, err.reason)
        return batch
    return BatchDump(batch.header, batch.computed_crc, decoded.records, decoded.control_type)


def _dump_index(path: Path, report: DumpReport) -> None:
    data = path.read_bytes()
    base = report.base_offset or 0
    entry_size = OFFSET_INDEX_ENTRY.size
    usable = _check_size(data, entry_size, report)
    prev: IndexEntry | None = None
    for slot, (relative, position) in enumerate(OFFSET_INDEX_ENTRY.iter_unpack(data[:usable])):
        at = slot * entry_size
        if relative == 0 and slot > 0:
            report.notes.append(f"entries end at slot {slot}: the rest is the zero-filled "
                                "space of a preallocated (active segment) index")
            break
        entry = IndexEntry(base + relative, position)
        if relative < 0 or position < 0:
            report.problem(at, f"negative relative offset or position in entry {slot}")
        elif prev is not None and (entry.offset <= prev.offset or position <= prev.position):
            report.problem(at, f"entry {slot} ({entry.offset}, {position}) does not follow "
                               f"({prev.offset}, {prev.position}): both must increase")
        report.offset_entries.append(entry)
        prev = entry
    _check_against_log(path, report)


def _check_against_log(index_path: Path, report: DumpReport) -> None:
    """Each entry must point at a batch boundary holding its offset or an earlier one; Kafka
    (3.8+, and tiered) makes the entry's offset that batch's last offset exactly."""
    log_path = index_path.with_name(index_path.name.replace(INDEX_SUFFIX, LOG_SUFFIX, 1))
    if report.base_offset is None or not log_path.is_file():
        return
    with LogFile(log_path, active=False) as f:
        for slot, entry in enumerate(report.offset_entries):
            at = slot * OFFSET_INDEX_ENTRY.size
            try:
                prefix = f.read(entry.position, LOG_OVERHEAD)
                length = int.from_bytes(prefix[8:], "big", signed=True) if len(prefix) == 12 else 0
                data = f.read(entry.position, max(0, length) + LOG_OVERHEAD)
                header = read_batch_header(data, 0, verify_crc=False)
            except CorruptSegmentError as err:
                report.problem(at, f"entry {slot} points at byte {entry.position} of "
                                   f"{log_path.name}, which is no batch: {err.reason}")
                continue
            if entry.offset < header.base_offset:
                report.problem(at, f"entry {slot} says offset {entry.offset} but the batch at "
                                   f"byte {entry.position} starts at {header.base_offset}")
            elif entry.offset != header.last_offset:
                report.notes.append(f"entry {slot}: index offset {entry.offset}, log offset "
                                    f"{header.last_offset} (a multi-batch append)")


def _dump_timeindex(path: Path, report: DumpReport) -> None:
    data = path.read_bytes()
    base = report.base_offset or 0
    entry_size = TIME_INDEX_ENTRY.size
    usable = _check_size(data, entry_size, report)
    prev: TimeIndexEntry | None = None
    for slot, (timestamp, relative) in enumerate(TIME_INDEX_ENTRY.iter_unpack(data[:usable])):
        at = slot * entry_size
        if relative == 0 and slot > 0:
            report.notes.append(f"entries end at slot {slot}: the rest is the zero-filled "
                                "space of a preallocated (active segment) index")
            break
        entry = TimeIndexEntry(timestamp, base + relative)
        if relative < 0:
            report.problem(at, f"negative relative offset in entry {slot}")
        elif prev is not None and (timestamp < prev.timestamp or entry.offset < prev.offset):
            report.problem(at, f"entry {slot} ({timestamp}, {entry.offset}) goes back from "
                               f"({prev.timestamp}, {prev.offset})")
        report.time_entries.append(entry)
        prev = entry


def _check_size(data: bytes, entry_size: int, report: DumpReport) -> int:
    usable = len(data) - len(data) % entry_size
    if usable != len(data):
        report.problem(usable, f"file size {len(data)} is not a multiple of the "
                               f"{entry_size}-byte entry; {len(data) - usable} bytes left over")
    return usable


#: dump function per file kind, keyed by the segment file suffix
DUMPERS: dict[str, tuple[str, Callable[[Path, DumpReport], None]]] = {
    LOG_SUFFIX: ("log", _dump_log),
    INDEX_SUFFIX: ("index", _dump_index),
    TIMEINDEX_SUFFIX: ("timeindex", _dump_timeindex),
}


def dump_file(path: str | Path, *, records: bool = False) -> DumpReport:
    """Dump one `.log` / `.index` / `.timeindex` (also `.deleted` / `.cleaned` / `.swap`
    variants); `records` decodes every record of every batch whose CRC is good.
    Raises TieredError for a file that is none of these or cannot be read."""
    path = Path(path)
    name = path.name
    for transient in _TRANSIENT_SUFFIXES:
        name = name.removesuffix(transient)
    stem, dot, suffix = name.partition(".")
    if not dot or f".{suffix}" not in DUMPERS:
        raise TieredError(f"{path}: cannot dump this file; known kinds are "
                          f"{', '.join(DUMPERS)}")
    kind, dumper = DUMPERS[f".{suffix}"]
    base = int(stem) if len(stem) == 20 and stem.isdigit() else None
    if base is not None and segment_file_name(base, "") != stem:
        base = None
    report = DumpReport(path, kind, base, with_records=records)
    if base is None and kind != "log":
        report.notes.append("file name has no 20-digit base offset; offsets are relative")
    try:
        dumper(path, report)
    except OSError as err:
        raise TieredError(f"{path}: cannot read: {err.strerror or err}") from None
    return report
