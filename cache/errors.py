"""Errors of the read cache, each a `TieredError` so the CLI and daemon report them cleanly."""

from __future__ import annotations

from tiered.errors import TieredError

__all__ = ["CacheError", "CacheFullError", "ChunkDownloadError"]


class CacheError(TieredError):
    """The cache cannot serve a read: bad request (a range outside the segment, a hostile key)
    or a cache-directory problem."""

    exit_code = 6


class CacheFullError(CacheError):
    """No room for a chunk: the cache disk is full (ENOSPC), or every cached chunk is held by
    a reader and none frees up in time. Nothing partial is left on disk."""


class ChunkDownloadError(CacheError):
    """Downloading a chunk from the object store failed; the cause is chained. Nothing was
    cached, so the next read tries again."""
