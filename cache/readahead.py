"""How far ahead of a reader the cache reads: the read-ahead window, in chunks (pure).

`cloud_storage_chunk_prefetch` not set (the default): the window adapts, as the kernel's file
readahead does (docs/remote-read.md, "Read-ahead"). A reader starts with none; once a read is
sequential (it continues where the reader's previous read stopped, `cache.read_sessions`) the window
opens at one chunk and doubles each time the reader moves on into another chunk, up to a cap
that the cache's budget bounds (`ReadAheadPolicy.adaptive`); a read that is not sequential (a
jump) closes it again. A random reader thus never has a chunk read ahead for it, and a consumer
catching up has a few chunks on the way within its first chunks, without anyone tuning anything.

Set to N > 0: a fixed window of N chunks for every sequential reader (the old behaviour); set to
0: no read-ahead at all.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReadAheadPolicy", "ReadAheadWindow"]

#: the adaptive window's largest size in chunks, whatever the budget (16 MiB chunks: 128 MiB
#: ahead of one reader, two 64 MiB segments)
MAX_WINDOW = 8
#: the share of the cache's byte limit one reader's window may take at most: eight readers
#: at a full window fit in the cache at once
BUDGET_SHARE = 8


@dataclass(frozen=True)
class ReadAheadPolicy:
    """The cache-wide read-ahead setting: `fixed` chunks (0: off) or adaptive (`fixed` None)
    up to `cap` chunks."""

    fixed: int | None
    cap: int

    def __post_init__(self) -> None:
        if self.fixed is not None and self.fixed < 0:
            raise ValueError(f"a fixed read-ahead window must not be negative, got {self.fixed}")
        if self.cap < 1:
            raise ValueError(f"the adaptive window's cap must be at least 1, got {self.cap}")

    @classmethod
    def from_settings(cls, chunk_prefetch: int | None, chunk_size: int,
                      max_bytes: int) -> ReadAheadPolicy:
        """`cloud_storage_chunk_prefetch` (None: not set, adaptive) for a cache of `max_bytes`
        in chunks of `chunk_size`: the adaptive cap is `MAX_WINDOW` chunks, fewer when that
        would be more than 1/`BUDGET_SHARE` of the cache (never below one chunk)."""
        cap = max(1, min(MAX_WINDOW, max_bytes // BUDGET_SHARE // max(1, chunk_size)))
        return cls(chunk_prefetch, cap)

    @property
    def enabled(self) -> bool:
        """Whether anything is ever read ahead."""
        return self.fixed != 0

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    @property
    def largest(self) -> int:
        """The widest window any reader can have."""
        return self.cap if self.fixed is None else self.fixed

    def new_window(self) -> ReadAheadWindow:
        return ReadAheadWindow(self)


@dataclass
class ReadAheadWindow:
    """One reader's window (see the module docstring); `size` in chunks."""

    policy: ReadAheadPolicy
    size: int = 0

    def on_read(self, *, sequential: bool, moved: bool) -> int:
        """The window after a read: `sequential` as `cache.read_sessions` judges it; `moved`
        when the read went on into a chunk other than the one the reader's previous read ended
        in (the window grows once per chunk, not once per fetch: a consumer reads a 16 MiB
        chunk in sixteen 1 MiB fetches)."""
        fixed = self.policy.fixed
        if not sequential:
            self.size = 0
        elif fixed is not None:
            self.size = fixed
        elif self.size == 0:
            self.size = 1
        elif moved:
            self.size = min(self.policy.cap, self.size * 2)
        return self.size
