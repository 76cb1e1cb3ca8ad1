"""Segment objects as the Spark jobs see them: streamed and verified in executors.

`walk_object` reads one segment object in ranged GETs of `CHUNK_BYTES`, checking every record
batch (bounds, magic, CRC-32C) and computing the CRC-32C of the whole object as it goes, so
an executor never holds more than a chunk and a batch however large the segment; scrub,
recovery and the manifest rebuild all read objects through it (design invariant 5).
`run_tasks` runs such work over the executors with a progress line.
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import crc32c

from manifests.model import SegmentMeta
from spark_jobs.job_context import JobContext, Progress, map_with_store, slices_for
from tiered.config.units import format_size
from tiered.errors import CorruptSegmentError
from tiered.kafka.records import LOG_OVERHEAD, BatchHeader, iter_batch_headers
from tiered.store.base import ObjectStore

T = TypeVar("T")
R = TypeVar("R")

#: bytes per ranged GET while streaming an object (bounds executor memory per task)
CHUNK_BYTES = 8 * 1024 * 1024

_LENGTH_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength: enough to size a batch


@dataclass(frozen=True)
class ObjectFacts:
    """What streaming one segment object found. Offsets inclusive; timestamps ms (-1: none)."""

    key: str
    size: int
    #: CRC-32C of all `size` bytes
    checksum: int
    batches: int
    first_offset: int | None
    last_offset: int | None
    base_timestamp: int
    max_timestamp: int
    #: (leader epoch, first offset written in it) where the batches' epoch grows
    epochs: tuple[tuple[int, int], ...]
    #: every offset from the first to the last has a record (no compaction holes)
    contiguous: bool


class _FactsBuilder:
    """Accumulates batch headers into `ObjectFacts`; refuses offsets that go backwards."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.batches = 0
        self.first: int | None = None
        self.last: int | None = None
        self.base_ts = -1
        self.max_ts = -1
        self.epochs: list[tuple[int, int]] = []
        self.contiguous = True

    def add(self, h: BatchHeader, base_position: int) -> None:
        if self.last is not None and h.base_offset <= self.last:
            raise CorruptSegmentError(
                f"batch base offset {h.base_offset} is not above the previous batch's last "
                f"offset {self.last}",
                path=self.key,
                position=base_position + h.position,
            )
        if self.first is None:
            self.first, self.base_ts = h.base_offset, max(h.first_timestamp, -1)
        elif h.base_offset != self.last + 1:  # type: ignore[operator]
            self.contiguous = False
        if h.records_count != h.last_offset_delta + 1:
            self.contiguous = False
        self.last = h.last_offset
        self.max_ts = max(self.max_ts, h.max_timestamp)
        epoch = h.partition_leader_epoch
        if epoch >= 0 and (not self.epochs or epoch > self.epochs[-1][0]):
            self.epochs.append((epoch, h.base_offset))
        self.batches += 1

    def facts(self, size: int, checksum: int) -> ObjectFacts:
        return ObjectFacts(
            self.key, size, checksum, self.batches, self.first, self.last, self.base_ts,
            max(self.max_ts, self.base_ts), tuple(self.epochs), self.contiguous,
        )


def walk_object(
    store: ObjectStore,
    key: str,
    size: int,
    *,
    sink: Callable[[bytes], object] | None = None,
    on_header: Callable[[BatchHeader], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> ObjectFacts:
    """Stream the `size` bytes of segment object `key` in ranged GETs, checking every batch
    (bounds, magic, CRC-32C) and computing the CRC-32C of the whole object; `sink` receives
    each chunk in order (recovery writes them to a file) and `on_header` each batch header,
    its position counted from the object's start. Memory stays at about one chunk
    plus one batch. Raises `CorruptSegmentError` (key and byte position) for a bad batch or
    an object that ends early, and `ObjectNotFound` when the object is gone."""
    crc = 0
    pending = b""
    pending_at = 0  # object position of pending[0]
    pos = 0
    builder = _FactsBuilder(key)
    while pos < size:
        data = store.get(key, byte_range=(pos, min(pos + chunk_bytes, size)))
        if not data:
            raise CorruptSegmentError(
                f"object ends at byte {pos}, short of the {size} bytes expected",
                path=key, position=pos,
            )
        crc = crc32c.crc32c(data, crc)
        if sink is not None:
            sink(data)
        pos += len(data)
        buf = pending + data if pending else data
        consumed = 0
        try:
            for header in iter_batch_headers(buf, path=key, allow_truncated_tail=True):
                builder.add(header, pending_at)
                consumed = header.end_position
                if on_header is not None:
                    on_header(header._replace(position=pending_at + header.position))
        except CorruptSegmentError as err:
            if err.path == key and err.position is not None and err.reason.startswith("batch"):
                raise  # raised by the builder with an object position already
            raise err.at(path=key, base_position=pending_at) from None
        pending = buf[consumed:]
        pending_at += consumed
        if len(pending) >= _LENGTH_PREFIX.size:
            _, length = _LENGTH_PREFIX.unpack_from(pending)
            if length < 0 or pending_at + LOG_OVERHEAD + length > size:
                raise CorruptSegmentError(
                    f"batch claims {length} bytes, past the end of the {size}-byte object",
                    path=key, position=pending_at,
                )
    if pending:
        raise CorruptSegmentError(
            f"object ends inside a batch ({len(pending)} bytes of it)", path=key,
            position=pending_at,
        )
    return builder.facts(size, crc)


def meta_problem(facts: ObjectFacts, meta: SegmentMeta) -> tuple[str, str] | None:
    """(anomaly kind, detail) when a streamed object is not the segment `meta` describes."""
    if facts.size != meta.size_bytes:
        return "size_mismatch", f"{facts.size} bytes, the manifest says {meta.size_bytes}"
    if facts.checksum != meta.checksum:
        return (
            "checksum_mismatch",
            f"CRC-32C {facts.checksum:08x}, the manifest says {meta.checksum:08x}",
        )
    first, last = facts.first_offset, facts.last_offset
    if first is None or last is None:
        return "offsets_mismatch", f"holds no batch, the manifest says offsets " \
            f"{meta.base_offset}..{meta.last_offset}"
    exact = first == meta.base_offset and last == meta.last_offset
    inside = meta.base_offset <= first and last <= meta.last_offset
    if not exact and not (meta.compacted and inside):
        return (
            "offsets_mismatch",
            f"holds offsets {first}..{last}, the manifest says {meta.base_offset}.."
            f"{meta.last_offset}",
        )
    return None


# -- running jobs ---------------------------------------------------------------------------------


def run_tasks(
    ctx: JobContext,
    tasks: list[T],
    label: str,
    group: str,
    fn: Callable[[Any, ObjectStore, T], R],
    size_of: Callable[[T], int],
) -> list[R]:
    """`fn(byte_counter, store, task)` for every task on the executors (a few tasks per core,
    one store per Spark partition), with a progress line of tasks and bytes on stderr."""
    if not tasks:
        return []
    sc = ctx.sc
    counter = sc.accumulator(0)
    bound: Callable[[ObjectStore, T], R] = functools.partial(fn, counter)
    source = sc.parallelize(tasks, slices_for(len(tasks), sc.defaultParallelism))
    rdd = source.mapPartitions(map_with_store(ctx.settings, bound))
    total = format_size(sum(size_of(t) for t in tasks))
    # a group per run: the status tracker counts every job ever run in a group
    with Progress(sc, f"{label} ({total})", group=f"{group}-{uuid.uuid4().hex[:8]}",
                  total_tasks=rdd.getNumPartitions(), bytes_done=lambda: counter.value):
        return rdd.collect()
