"""What `ChunkCache` keeps per segment and per cached file (internal to the cache)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from cache.chunks import chunk_bounds
from cache.download import Verifier
from cache.eviction import ChunkId

if TYPE_CHECKING:
    from cache.mapped import MappedFile
    from cache.staging import BufferedChunk, StagedChunk

__all__ = ["CacheEntry", "SegmentInfo"]


@dataclass(frozen=True)
class SegmentInfo:
    """A segment object as opened: key, size (bytes), chunk starts, how to verify a chunk, and
    whether it is cached whole (cloud_storage_disable_chunk_reads)."""

    key: str
    size: int
    starts: tuple[int, ...]
    verify: Verifier | None
    whole: bool

    @cached_property
    def chunk_ids(self) -> tuple[ChunkId, ...]:
        return tuple(ChunkId(self.key, s, self.whole) for s in self.starts)

    def bounds(self, index: int) -> tuple[int, int]:
        return chunk_bounds(self.starts, index, self.size)


class CacheEntry:
    """One cached (or downloading) chunk. `download` is set while the first reader fetches it;
    others wait on it instead of fetching again. While a read-ahead stream writes it, `staged`
    is where it goes (its temporary file or a buffer) and `ready` how many bytes from the
    chunk's start are in and verified (whole batches): those may be served before the rest
    arrives. A streamed chunk may stay in its buffer (`in_memory`) until written behind.

    `ready` is the one field written without the cache's lock: the stream publishes each
    verified run by a plain store (it only grows, and only covers checked bytes of `staged`,
    which is set and cleared under the lock), and takes the lock to notify `progress` only
    when `waiting` says a reader waits for it. A reader counts itself in `waiting` (under the
    lock) before it reads `ready`, so a store it did not see is followed by a notify it gets:
    the stream's check of every received run then costs no lock while nobody waits."""

    __slots__ = ("chunk", "crcs", "download", "in_memory", "last_access", "mapped", "pins",
                 "progress", "ready", "size", "staged", "verified", "waiting")

    def __init__(
        self, chunk: ChunkId, size: int, last_access: float, crcs: tuple[int, ...] | None
    ) -> None:
        self.chunk = chunk
        self.size = size
        self.last_access = last_access
        self.crcs = crcs
        #: checked by this process (downloaded and verified, or a file found at start-up read
        #: back against its checksums): its ranges may then be served without reading them
        self.verified = False
        self.pins = 0
        self.download: Future[None] | None = None
        self.staged: StagedChunk | BufferedChunk | None = None
        self.ready = 0
        #: readers in `Hydration.wait_ready` for `ready` to move (changed under the lock)
        self.waiting = 0
        #: its file, open and mapped, while it is one of the chunks read lately
        #: (`cache.mapped`; the cache's share); or, while `in_memory`, its buffer
        self.mapped: MappedFile | None = None
        #: its bytes are only in `mapped`, a `cache.buffers` buffer: no file yet
        self.in_memory = False
        #: notified (over the cache's lock) when `ready` moves and when the download ends
        self.progress: threading.Condition | None = None
