"""The read path's checks behind `/health` (docs/archiver.md, "/health"): the I/O at the edge
of the pure `tiered.app.health` functions.

* `CacheDiskCheck`: can the read cache's disk take a chunk? A probe file is written (and
  removed) in the cache directory, and the free space is read, at most once per `ttl_s`
  however often `/health` is asked. A directory replaced, read-only or full makes every read
  that misses the cache fail, while the cache's own write problem only shows after a read
  tried.
* `ReadStoreCheck`: did the read path's latest store request fail, recently? Read from its
  store's request counters (`RetryStats.last_failure`); the Kafka endpoint's topic catalog
  refreshes through the same store, so with the endpoint on this is current within
  `catalog_refresh_ms` even with no client reading.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from cache import disk
from cache.errors import CacheError
from tiered.app.health import cache_disk_problem, read_store_problem

__all__ = ["CACHE_CHECK_TTL_S", "READ_STORE_WINDOW_S", "CacheDiskCheck", "ReadStoreCheck"]

#: seconds a cache disk check's answer is reused
CACHE_CHECK_TTL_S = 5.0
#: seconds a failed read-path store request keeps `/health` degraded when nothing followed it
READ_STORE_WINDOW_S = 60.0
#: the probe file's name in the cache directory (written beside it as a temporary file, which
#: the cache's start-up sweep removes should the process die in between)
PROBE_NAME = ".health-check"


class _Usage(Protocol):
    @property
    def free(self) -> int: ...


class CacheDiskCheck:
    """Whether the cache directory `root` can take a chunk of `chunk_size` bytes; see the
    module docstring. Thread-safe. `usage` (default `shutil.disk_usage`) and `write`
    (`os.write`) are injectable: tests fill the disk without filling one."""

    def __init__(self, root: Path, chunk_size: int, *, ttl_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 usage: Callable[[Path], _Usage] | None = None,
                 write: disk.Writer | None = None) -> None:
        self.root = root
        self.chunk_size = chunk_size
        self._ttl_s = CACHE_CHECK_TTL_S if ttl_s is None else ttl_s  # read at construction
        self._clock = clock
        self._usage = usage
        self._write = write
        self._lock = threading.Lock()
        self._last: tuple[float, str | None] | None = None

    def problem(self) -> str | None:
        """What is wrong with the cache disk now (reused for `ttl_s`), or None."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self._ttl_s:
                return self._last[1]
            found = self._check()
            self._last = (now, found)
            return found

    def _check(self) -> str | None:
        write_error: str | None = None
        try:
            kw = {} if self._write is None else {"write": self._write}
            disk.remove_file(disk.write_beside(self.root / PROBE_NAME, b"\0", **kw))
        except CacheError as exc:
            write_error = str(exc)
        except OSError as exc:  # removing it failed: the directory is not usable either
            write_error = f"{self.root}: {exc.strerror or exc}"
        usage = self._usage if self._usage is not None else shutil.disk_usage
        try:
            free: int | None = usage(self.root).free
        except OSError:
            free = None
        return cache_disk_problem(str(self.root), free_bytes=free,
                                  needed_bytes=self.chunk_size, write_error=write_error)


class ReadStoreCheck:
    """The read path's store problem from its store's counters: `failure()` gives
    (time.monotonic() when, why) of the latest request if it failed (`RetryStats.last_failure`;
    None for a store that keeps no such record, such as `file://`)."""

    def __init__(self, failure: Callable[[], tuple[float, str] | None], *,
                 window_s: float = READ_STORE_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._failure = failure
        self._window_s = window_s
        self._clock = clock

    def problem(self) -> str | None:
        return read_store_problem(self._failure(), self._clock(), self._window_s)
