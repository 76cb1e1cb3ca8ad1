"""Test doubles for the read cache: real segment bytes, a counting, fault-injecting fetcher,
and a streaming store that holds, breaks or corrupts its streams where told."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cache.accounting import CacheSettings
from cache.chunk_cache import ChunkCache
from cache.chunks import batch_positions, plan_chunks, verify_batches
from cache.disk import Writer
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


@dataclass
class Stream:
    data: bytes
    pos: int
    end: int
    #: the stream raises once it has handed out this many bytes
    break_at: int | None = None
    #: byte offsets (absolute) flipped in what is handed out
    corrupt: set[int] = field(default_factory=set)
    #: the stream stops at each of these bytes (absolute) until its event is set
    holds: dict[int, threading.Event] = field(default_factory=dict)
    closed: bool = False

    def read(self, n: int = -1, /) -> bytes:
        if self.break_at is not None and self.pos >= self.break_at:
            raise ConnectionResetError("connection reset by peer")
        if self.pos in self.holds:
            self.holds[self.pos].wait()
        ahead = [at for at in self.holds if at > self.pos]
        if ahead:
            n = min(n, min(ahead) - self.pos)
        n = min(n, 1000)  # arrives in pieces, as from a socket
        got = bytearray(self.data[self.pos:min(self.end, self.pos + n)])
        for at in self.corrupt:
            if self.pos <= at < self.pos + len(got):
                got[at - self.pos] ^= 0xFF
        self.pos += len(got)
        return bytes(got)

    def readinto(self, b: memoryview, /) -> int:
        got = self.read(len(b))
        b[:len(got)] = got
        return len(got)

    def close(self) -> None:
        self.closed = True


@dataclass
class Streamer:
    objects: dict[str, bytes]
    opened: list[Stream] = field(default_factory=list)
    break_at: int | None = None
    corrupt: set[int] = field(default_factory=set)
    holds: dict[int, threading.Event] = field(default_factory=dict)
    #: called with the key as each request goes out
    on_open: Callable[[str], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, key: str, begin: int, end: int, *, to_end: bool = False) -> Stream:
        if self.on_open is not None:
            self.on_open(key)
        stream = Stream(self.objects[key], begin, end, self.break_at, set(self.corrupt),
                        self.holds)
        with self.lock:
            self.opened.append(stream)
        return stream


#: a segment object's key, and the chunk size of the streaming caches below
KEY = "ab12cd34/kafka/orders/0_7/0-1023-1.log"
CHUNK = 8 * 1024


def open_cache(tmp_path: Path, data: bytes, prefetch: int | None = 2, strategy: str = "eager",
               write: Writer = os.write, memory: int = 1 << 20, size: int = 1 << 30,
               **kwargs: Any) -> tuple[ChunkCache, Fetcher, Streamer]:
    """A cache of `size` bytes over `data` at KEY with a streaming store (`kwargs` go to the
    `Streamer`); `memory`: the buffers' budget (`cloud_storage_cache_memory_size`; 0:
    streamed chunks go straight to their files)."""
    fetch, stream = Fetcher({KEY: data}), Streamer({KEY: data}, **kwargs)
    settings = CacheSettings(size_bytes=size, chunk_size=CHUNK, chunk_prefetch=prefetch,
                             memory_bytes=memory)
    cache = ChunkCache(tmp_path / "cache", settings, fetch, strategy=strategy,
                       disk_capacity=1 << 40, stream=stream, write=write)
    return cache, fetch, stream
