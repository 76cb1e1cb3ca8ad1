"""Test doubles for the read cache: real segment bytes and a counting, fault-injecting fetcher."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cache.chunks import batch_positions, plan_chunks, verify_batches
from tiered.kafka.builder import encode_batch, make_records


def make_segment(batches: int = 64, value_size: int = 200, base_offset: int = 0) -> bytes:
    """`batches` record batches of 4 records each: about (4 x value_size + 130) bytes a batch."""
    out = []
    for i in range(batches):
        offset = base_offset + 4 * i
        values = [bytes([65 + (offset + j) % 26]) * value_size for j in range(4)]
        out.append(encode_batch(make_records(values, base_offset=offset, timestamp=1_000 + offset),
                                base_offset=offset))
    return b"".join(out)


def layout(data: bytes, chunk_size: int) -> list[int]:
    return plan_chunks(batch_positions(data), len(data), chunk_size)


def verifier(key: str) -> Callable[[bytes, int], None]:
    def verify(data: bytes, position: int) -> None:
        verify_batches(data, position, path=key)

    return verify


@dataclass
class Fetcher:
    """Serves `objects` by range, counting calls and bytes; faults are queued per call."""

    objects: dict[str, bytes]
    calls: list[tuple[str, int, int]] = field(default_factory=list)
    fetched_bytes: int = 0
    #: one entry consumed per call: an exception to raise, "corrupt", "short", or None
    faults: list[object] = field(default_factory=list)
    #: called inside every fetch (after counting), e.g. to block or to check the cache
    during: Callable[[], object] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, key: str, begin: int, end: int) -> bytes:
        with self.lock:
            self.calls.append((key, begin, end))
            fault = self.faults.pop(0) if self.faults else None
        if self.during is not None:
            self.during()
        if isinstance(fault, BaseException):
            raise fault
        data = self.objects[key][begin:end]
        if fault == "corrupt":
            data = data[:20] + bytes([data[20] ^ 0xFF]) + data[21:]
        elif fault == "short":
            data = data[: len(data) // 2]
        with self.lock:
            self.fetched_bytes += len(data)
        return data
