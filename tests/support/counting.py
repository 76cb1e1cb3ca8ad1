"""A real store that counts every request by operation and kind of object.

Request counts are the cost model docs/operations.md ("Sizing") gives; the tests assert them
and benchmarks/partitions.py reports them, so both count through this one wrapper. It lives
with the tests (benchmarks put tests/ on their path, as for the cluster and chaos harnesses):
it classifies keys with `manifests.keys`, which the store layer below manifests cannot import.
"""

from __future__ import annotations

import builtins
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from manifests import keys
from tiered.store.base import Blob, ObjectInfo, ObjectStore
from tiered.store.errors import ObjectNotFound


def kind(key: str) -> str:
    """What an object is, by its key."""
    if key.startswith(keys.NODE_RECORDS_PREFIX) or "/_tiered/nodes/" in key:
        return "node"
    name = key.rsplit("/", 1)[-1]
    if name == keys.TOPIC_MANIFEST_NAME:
        return "topic"
    if name == keys.PARTITION_MANIFEST_NAME:
        return "head"
    if ".copy-" in name:
        return "copy"
    if name == keys.LEASE_NAME:
        return "lease"
    if name.endswith(".log"):
        return "segment"
    return "index" if "index" in name else "other"


class CountingStore(ObjectStore):
    """A real store, counting every request as (operation, kind of object); thread-safe, since
    the archiver uploads from a pool. A GET of a missing object counts as "get-missing"."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self.seen: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    @property
    def enforces_conditions(self) -> bool:
        return self.inner.enforces_conditions

    def take(self) -> Counter[tuple[str, str]]:
        """The counts so far, starting afresh."""
        with self._lock:
            seen, self.seen = self.seen, Counter()
        return seen

    def _count(self, operation: str, what: str) -> None:
        with self._lock:
            self.seen[operation, what] += 1

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        self._count("put", kind(key))
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: Path | str, *, ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        self._count("put", kind(key))
        return self.inner.put_file(key, path, ready=ready, byte_range=byte_range)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        try:
            got = self.inner.get(key, byte_range)
        except ObjectNotFound:
            self._count("get-missing", kind(key))
            raise
        self._count("get", kind(key))
        return got

    def head(self, key: str) -> ObjectInfo:
        self._count("head", kind(key))
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count("list", "node" if prefix == keys.NODE_RECORDS_PREFIX else "partition")
        return self.inner.list(prefix)

    def delete_many(self, keys_: Iterable[str]) -> builtins.list[str]:
        doomed = builtins.list(keys_)
        self._count("delete", kind(doomed[0]) if doomed else "other")
        return self.inner.delete_many(doomed)

    def close(self) -> None:
        self.inner.close()
