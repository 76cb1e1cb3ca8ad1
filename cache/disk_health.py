"""The cache disk's health as `/health` reports it: the last disk write's outcome.

Three threads write chunks (downloads, read-ahead streams, the write-behind), so the state is
one small locked object, and only a write that really reached the disk (or failed to) changes
it: a chunk that stayed in memory says nothing about the disk and must not clear an I/O error
another thread just reported. A full cache is not a disk problem (eviction handles it)."""

from __future__ import annotations

import threading

__all__ = ["DiskHealth"]


class DiskHealth:
    """The cache disk's last write problem, or None when the last write went through."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._problem: str | None = None

    @property
    def problem(self) -> str | None:
        with self._lock:
            return self._problem

    def failed(self, err: BaseException) -> None:
        """A chunk could not be written to the disk."""
        with self._lock:
            self._problem = str(err)

    def succeeded(self) -> None:
        """A chunk was written to the disk: the disk takes writes again."""
        with self._lock:
            self._problem = None
