"""Test doubles for the manifest tests: an in-memory ObjectStore with S3's conditional-put
semantics (ETag = MD5 of the bytes) that counts every request, and segment factories.

Used where the HTTP path is not the point (property tests, spill arithmetic, fault injection
by hooks); the commit and two-writer tests also run against moto's server and the file store
through the `s3_store` / `file_store` fixtures of conftest.py.
"""

from __future__ import annotations

import builtins
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from manifests.model import SegmentMeta
from tiered.store.base import Blob, ObjectInfo, ObjectStore, StoreSettings
from tiered.store.errors import ObjectNotFound, PreconditionFailed


class MemoryStore(ObjectStore):
    """Objects in a dict; `calls` counts requests by operation. Tests inject faults by
    wrapping `put` (a failing head PUT, a recorded upload order)."""

    scheme = "memory"

    def __init__(self) -> None:
        super().__init__(StoreSettings(url="memory://test"))
        self.objects: dict[str, tuple[bytes, str, float]] = {}
        self.calls: Counter[str] = Counter()
        self._lock = threading.RLock()

    def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self.calls["put"] += 1
        with self._lock:
            current = self.objects.get(key)
            if if_none_match and current is not None:
                raise PreconditionFailed(f"{key}: exists")
            if if_match is not None and (current is None or current[1] != if_match):
                raise PreconditionFailed(f"{key}: version moved")
            etag = hashlib.md5(data).hexdigest()
            self.objects[key] = (bytes(data), etag, time.time())
            return etag

    def put_file(self, key: str, path: Path | str, *,
                 ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        data = Path(path).read_bytes()
        if byte_range is not None:
            data = data[byte_range[0]:byte_range[1]]
        if ready is not None:
            ready()
        return self.put(key, data)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        self.calls["get"] += 1
        with self._lock:
            if key not in self.objects:
                raise ObjectNotFound(key)
            data, etag, _ = self.objects[key]
        return Blob(data if byte_range is None else data[byte_range[0] : byte_range[1]], etag)

    def head(self, key: str) -> ObjectInfo:
        self.calls["head"] += 1
        with self._lock:
            if key not in self.objects:
                raise ObjectNotFound(key)
            data, etag, mtime = self.objects[key]
        return ObjectInfo(key, len(data), etag, mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self.calls["list"] += 1
        with self._lock:
            items = sorted((k, v) for k, v in self.objects.items() if k.startswith(prefix))
        for key, (data, etag, mtime) in items:
            yield ObjectInfo(key, len(data), etag, mtime)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        self.calls["delete"] += 1
        with self._lock:
            for key in keys:
                self.objects.pop(key, None)
        return []

    def corrupt(self, key: str, data: bytes) -> None:
        """Replace an object's bytes behind the manifest layer's back."""
        with self._lock:
            self.objects[key] = (data, hashlib.md5(data).hexdigest(), time.time())


def segment(
    base: int,
    count: int = 100,
    *,
    term: int = 1,
    ts: int | None = None,
    size: int = 1 << 20,
    crc: int = 0x1234ABCD,
    name: str = "",
    compacted: bool = False,
    index_layout: int = 0,
) -> SegmentMeta:
    """A segment of `count` offsets from `base`, timestamps 1 ms per offset by default."""
    t0 = base if ts is None else ts
    return SegmentMeta(
        base_offset=base,
        last_offset=base + count - 1,
        base_timestamp=t0,
        max_timestamp=t0 + count - 1,
        size_bytes=size,
        segment_term=term,
        writer_term=term,
        checksum=crc,
        compacted=compacted,
        name=name,
        index_layout=index_layout,
    )


def run_of(start: int, n: int, count: int = 100, *, term: int = 1, index_layout: int = 0
           ) -> list[SegmentMeta]:
    """`n` contiguous segments of `count` offsets each, starting at `start`, with varied
    checksums and sizes (so delta coding sees realistic numbers)."""
    return [
        segment(
            start + i * count,
            count,
            term=term,
            size=(1 << 20) + (i * 7919) % 65536,
            crc=(i * 2654435761) & 0xFFFFFFFF,
            index_layout=index_layout,
        )
        for i in range(n)
    ]
