"""Who is reading what: per-reader position, holds, sequential detection and registered future
needs. Not thread-safe on its own; `ChunkCache` calls it under its lock.

A reader (a consumer's fetch session, named by any hashable `ReaderId`) *holds* the chunk it is
positioned in and the chunks prefetched for it, so no eviction strategy releases them under it.
A reader is *sequential* when a read continues where its previous one stopped: the same chunk or
the next one of the same segment, or chunk 0 of another segment right after it finished one.
A sequential reader is predicted to need the rest of its segment, in order; `expect` registers
needs explicitly instead (the predictive strategy ranks chunks by these). Each reader carries its
read-ahead window (`cache.readahead`): the chunks after the one it reads that are held and read
ahead for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from cache.eviction import ChunkId
from cache.readahead import ReadAheadPolicy, ReadAheadWindow

__all__ = ["ReadOutcome", "ReaderId", "ReaderTable"]

ReaderId = Hashable


@dataclass
class _Reader:
    segment: str
    last_chunk: int
    ended_segment: bool
    sequential: bool
    last_seen: float
    holds: set[ChunkId] = field(default_factory=set)
    #: chunks of the next segment read ahead for it: held until it reads in that segment
    next_holds: set[ChunkId] = field(default_factory=set)
    expected: list[ChunkId] = field(default_factory=list)
    inferred: list[ChunkId] = field(default_factory=list)
    #: how many chunks ahead of it are read ahead (None: not judged yet, no read)
    window: ReadAheadWindow | None = None

    @property
    def future(self) -> list[ChunkId]:
        return self.expected or self.inferred


@dataclass(frozen=True)
class ReadOutcome:
    """What a read changed: whether it was sequential, the chunks to prefetch for the reader
    (already held for it) and the chunks nobody holds any more."""

    sequential: bool
    prefetch: tuple[ChunkId, ...]
    released: tuple[ChunkId, ...]


class ReaderTable:
    """Reader states plus how many readers hold each chunk."""

    def __init__(self) -> None:
        self._readers: dict[ReaderId, _Reader] = {}
        self._holds: Counter[ChunkId] = Counter()

    def __len__(self) -> int:
        return len(self._readers)

    def held(self, chunk: ChunkId) -> bool:
        """Whether some reader holds `chunk`."""
        return self._holds[chunk] > 0

    def after_read(
        self,
        reader: ReaderId,
        chunks: Sequence[ChunkId],
        first: int,
        last: int,
        *,
        inside_last: bool,
        prefetch: ReadAheadPolicy | int,
        now: float,
    ) -> ReadOutcome:
        """Record that `reader` read chunks `first..last` (indices into `chunks`, the whole
        segment's chunk list) and, when `inside_last`, stopped inside chunk `last`. `prefetch`:
        the cache's read-ahead policy, or a fixed window of that many chunks (0: none); the
        reader's window after this read decides the chunks to prefetch."""
        segment = chunks[0].segment
        prev = self._readers.get(reader)
        sequential = prev is not None and _continues(prev, segment, first)
        next_chunk = last if inside_last else last + 1
        holds = {chunks[last]} if inside_last else set()
        if isinstance(prefetch, int):
            prefetch = ReadAheadPolicy(prefetch, max(1, prefetch))
        window = (prev.window if prev is not None and prev.window is not None
                  and prev.window.policy == prefetch else prefetch.new_window())
        moved = prev is None or (prev.segment, prev.last_chunk) != (segment, last)
        size = window.on_read(sequential=sequential, moved=moved)
        ahead: tuple[ChunkId, ...] = ()
        if size > 0:
            ahead = tuple(chunks[last + 1 : last + 1 + size])
            holds.update(ahead)
        state = _Reader(
            segment=segment,
            last_chunk=last,
            ended_segment=not inside_last and last == len(chunks) - 1,
            sequential=sequential,
            last_seen=now,
            window=window,
        )
        if prev is not None and prev.expected:
            done = set(chunks[first:next_chunk])
            state.expected = [c for c in prev.expected if c not in done]
        if prev is not None:
            state.next_holds = {c for c in prev.next_holds if c.segment != segment}
            holds |= state.next_holds
        if sequential:
            state.inferred = list(chunks[next_chunk:])
        elif inside_last:
            state.inferred = [chunks[last]]
        released = self._set_holds(prev.holds if prev is not None else set(), holds)
        state.holds = holds
        self._readers[reader] = state
        return ReadOutcome(sequential, ahead, released)

    def position(self, reader: ReaderId) -> tuple[str, int, bool] | None:
        """(segment, last chunk read, sequential) of `reader`; None when it is not known."""
        state = self._readers.get(reader)
        return None if state is None else (state.segment, state.last_chunk, state.sequential)

    def may_continue(self, reader: ReaderId, segment: str, index: int) -> bool:
        """Whether a read by `reader` of chunk `index` of `segment` may be the start of a
        sequential run: the reader is new (nothing known yet), or the read continues where its
        previous one stopped. A reader that jumped is not streamed for until it reads on."""
        state = self._readers.get(reader)
        return state is None or state.last_chunk < 0 or _continues(state, segment, index)

    def window(self, reader: ReaderId) -> int:
        """How many chunks past its current one are read ahead for `reader` (0: none, or it is
        not known)."""
        state = self._readers.get(reader)
        return 0 if state is None or state.window is None else state.window.size

    def add_hold(self, reader: ReaderId, chunk: ChunkId) -> None:
        """Make `reader` hold `chunk` of the segment after the one it is in (read ahead for
        it) until it reads in that segment."""
        state = self._readers.get(reader)
        if state is not None and chunk not in state.holds:
            state.holds.add(chunk)
            state.next_holds.add(chunk)
            self._holds[chunk] += 1

    def expect(self, reader: ReaderId, chunks: Sequence[ChunkId], now: float) -> None:
        """Register that `reader` will read `chunks`, in this order (replaces earlier ones)."""
        state = self._readers.get(reader)
        if state is None:
            if not chunks:
                return
            state = _Reader(chunks[0].segment, -1, False, False, now)
            self._readers[reader] = state
        state.expected = list(chunks)
        state.last_seen = now

    def close(self, reader: ReaderId) -> tuple[ChunkId, ...]:
        """Forget `reader`; returns the chunks nobody holds any more."""
        state = self._readers.pop(reader, None)
        if state is None:
            return ()
        return self._set_holds(state.holds, set())

    def expire(self, idle_before: float) -> tuple[ChunkId, ...]:
        """Close readers not seen since `idle_before` (a consumer that went away)."""
        released: list[ChunkId] = []
        for reader in [r for r, s in self._readers.items() if s.last_seen < idle_before]:
            released.extend(self.close(reader))
        return tuple(released)

    def future_needs(self) -> dict[ChunkId, tuple[int, int]]:
        """chunk -> (readers that will read it, chunks the nearest one reads before it)."""
        needs: dict[ChunkId, tuple[int, int]] = {}
        for state in self._readers.values():
            for distance, chunk in enumerate(dict.fromkeys(state.future)):
                count, nearest = needs.get(chunk, (0, distance))
                needs[chunk] = (count + 1, min(nearest, distance))
        return needs

    def _set_holds(self, old: set[ChunkId], new: set[ChunkId]) -> tuple[ChunkId, ...]:
        released = []
        for chunk in new - old:
            self._holds[chunk] += 1
        for chunk in old - new:
            self._holds[chunk] -= 1
            if self._holds[chunk] <= 0:
                del self._holds[chunk]
                released.append(chunk)
        return tuple(released)


def _continues(prev: _Reader, segment: str, first: int) -> bool:
    """Whether a read from chunk `first` of `segment` continues where `prev` stopped."""
    return ((prev.segment == segment and first in (prev.last_chunk, prev.last_chunk + 1))
            or (prev.segment != segment and prev.ended_segment and first == 0))
