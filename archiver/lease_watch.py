"""What a lease keeper knows of the nodes sharing the bucket, and what the assignment asks of it.

`PeerWatch` is the bookkeeping half of `archiver.lease_keeper.LeaseKeeper`'s tick, with no I/O
of its own: the keeper lists and reads the node records, and hands the results here. From them
it keeps each node's record and since when it has not changed (a node whose record stays the
same for a lease time is gone), since when each of this node's partitions has had no live
holder (orphaned after a lease time), and the assignment's moves for this node
(`archiver.assignment.plan_moves`).

The assignment is a pure function of its inputs. A tick whose inputs equal those of the last
plan, when that plan asked for no move, would plan no move again: it skips the assignment
(at thousands of partitions most of an idle tick's work). The inputs are always built from
what the tick itself listed and read; only the last plan's inputs are kept, to compare, and a
plan that moved something is never reused (its takes and releases are tried afresh).

Thread model: the keeper's lock guards everything here; the methods that say "under the lock"
expect the caller to hold it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from archiver.assignment import Member, Moves, plan_moves
from manifests.lease_objects import NodeRecord, PartitionId, ReplicaState

__all__ = ["History", "PeerRecord", "PeerWatch", "max_releases", "note_watermarks",
           "replica_state"]


@dataclass
class PeerRecord:
    """What this keeper knows of another node's record."""

    etag: str
    #: when this keeper first saw the current version (monotonic seconds)
    changed_at: float
    record: NodeRecord | None = None
    read_at: float = float("-inf")
    read_etag: str | None = None
    #: listed before, missing from the last listing: it stopped cleanly
    gone: bool = False


#: (monotonic seconds, high watermark) samples of one replica, oldest first
History = deque[tuple[float, int]]


def note_watermarks(history: dict[PartitionId, History], replicas: Mapping[PartitionId, int],
                    now: float, *, every_s: float, keep_s: float) -> None:
    """Sample the high watermark of each replica this node has (`replicas`): when it moved, and
    every `every_s` anyway; keep one sample at least `keep_s` (a lease time) old, and nothing
    older than needed. Replicas no longer published are forgotten."""
    for pid in list(history):
        if pid not in replicas:
            del history[pid]
    for pid, hw in replicas.items():
        samples = history.setdefault(pid, deque())
        if not samples or samples[-1][1] != hw or now - samples[-1][0] >= every_s:
            samples.append((now, hw))
        while len(samples) > 2 and now - samples[1][0] >= keep_s:
            samples.popleft()


def replica_state(samples: History, now: float, lease_s: float) -> ReplicaState:
    """A replica's high watermark now and one lease time ago (-1: not watched that long)."""
    ago = -1
    for t, hw in samples:
        if now - t >= lease_s:
            ago = hw
    return ReplicaState(samples[-1][1], ago)


def max_releases(members: list[Member]) -> int:
    """Partitions a node hands over per tick: a quarter of a share, at least one."""
    active = [m for m in members if not m.passive]
    partitions = {pid for m in active for pid in m.replicas}
    share = -(-len(partitions) // max(1, len(active)))
    return max(1, share // 4)


#: what a plan is computed from: the members, the leases held, the orphaned partitions
_PlanInputs = tuple[list[Member], frozenset[PartitionId], frozenset[PartitionId]]


class PeerWatch:
    """The node records as this keeper watched them (see the module docstring). `node` is
    this keeper's own node; `passive`, whether it is a one-shot command."""

    def __init__(self, node: str, lease_s: float, lease_ms: int, *, passive: bool,
                 lock: threading.Lock, clock: Callable[[], float],
                 wall: Callable[[], float]) -> None:
        self.node = node
        self.lease_s = lease_s
        self.lease_ms = lease_ms
        self.passive = passive
        self._lock = lock
        self._clock = clock
        self._wall = wall
        self.seen: dict[str, PeerRecord] = {}
        #: when this keeper started watching (monotonic)
        self.watch_start: float | None = None
        #: the node records have been listed at least once
        self.listed = False
        #: since when (monotonic) each of this node's partitions has had no live holder
        self.unheld_since: dict[PartitionId, float] = {}
        #: nodes holding partitions the assignment gives this one
        self.waiting_on: set[str] = set()
        #: the inputs of the last plan, kept only while that plan moved nothing
        self._quiet_inputs: _PlanInputs | None = None
        #: assignments computed (an unchanged tick computes none)
        self.plans = 0

    def start(self, now: float) -> None:
        if self.watch_start is None:
            self.watch_start = now

    # -- what a tick read ----------------------------------------------------------------

    def note_listing(self, listed: Iterable[tuple[str, str]], now: float) -> list[str]:
        """Take one listing of (node, ETag): renewals by their versions, clean stops by a
        missing record. The nodes whose record contents are due a read (under the lock)."""
        self.listed = True
        reads: list[str] = []
        for known in self.seen.values():
            known.gone = True
        for node, etag in listed:
            seen = self.seen.get(node)
            if seen is None:
                seen = self.seen[node] = PeerRecord(etag, now)  # a full lease time from now
            elif seen.etag != etag:
                seen.etag, seen.changed_at = etag, now
            seen.gone = False
            # each renewal changes a record; its contents matter at most every half
            # lease, except a node holding what this one is waiting for. A daemon never
            # reads its own (at thousands of partitions, the largest record there is)
            if node == self.node and not self.passive:
                continue
            if seen.record is None or (seen.read_etag != etag and (
                    now - seen.read_at >= self.lease_s / 2 or node in self.waiting_on)):
                reads.append(node)
        return reads

    def note_reads(self, reads: Mapping[str, tuple[NodeRecord, str] | None], now: float
                   ) -> None:
        """Take the records just read (None: could not be read) (under the lock)."""
        for node, got in reads.items():
            seen = self.seen[node]
            if got is None:
                continue
            seen.record, seen.read_etag = got
            seen.read_at = now
            if seen.read_etag != seen.etag:
                seen.etag, seen.changed_at = seen.read_etag, now

    def track_unheld(self, now: float, replicas: Collection[PartitionId],
                     held: Collection[PartitionId]) -> None:
        """Note since when each of this node's partitions (`replicas`) has had no live holder
        advertising it; `held`: the leases this process holds and trusts (under the lock)."""
        advertised = {pid for node, seen in self.seen.items()
                      if node != self.node and seen.record is not None
                      and self.alive(node, now) for pid in seen.record.holding}
        advertised |= set(held)
        for pid in list(self.unheld_since):
            if pid in advertised or pid not in replicas:
                del self.unheld_since[pid]
        for pid in replicas:
            if pid not in advertised:
                self.unheld_since.setdefault(pid, now)

    # -- what it tells -------------------------------------------------------------------

    def alive(self, node: str, now: float | None = None) -> bool:
        """Whether `node` counts as running: its record changed within its lease time as this
        keeper watched it, and it has not deleted it (a clean stop). A passive keeper (a
        one-shot command, which cannot watch for a lease time) goes by the record's own
        renewal time instead, trusting the clocks to agree within a lease time."""
        if node == self.node:
            return True
        now = self._clock() if now is None else now
        seen = self.seen.get(node)
        if seen is None:
            if self.passive and self.listed:
                # no record: stopped cleanly (which releases its leases), or never started; a
                # one-shot cannot watch for a lease time and goes by the records it finds
                return False
            # never listed while we watched: gone once we have watched for a lease time
            return self.watch_start is not None and now - self.watch_start < self.lease_s
        record = seen.record
        lease_s = max(self.lease_s, record.lease_ms / 1000) if record else self.lease_s
        if seen.gone:
            return False
        if self.passive and record is not None:
            return self._wall() * 1000 - record.renewed_ms < lease_s * 1000
        return now - seen.changed_at < lease_s

    def others(self, now: float) -> list[Member]:
        """The other live members as their records say (under the lock)."""
        members = []
        for node, seen in self.seen.items():
            r = seen.record
            if node == self.node or r is None or not self.alive(node, now):
                continue
            members.append(Member(node, r.replicas, r.holding, r.passive))
        return members

    def orphaned(self, now: float) -> set[PartitionId]:
        """Partitions that no live node has advertised for a lease time (counted from when
        this keeper started watching): whoever the assignment names is not taking them
        (under the lock)."""
        return {pid for pid, since in self.unheld_since.items() if now - since >= self.lease_s}

    def holder_of(self, pid: PartitionId) -> str | None:
        """The other node advertising `pid` at the highest generation (under the lock)."""
        best: tuple[int, str] | None = None
        for node, seen in self.seen.items():
            if seen.record is not None and pid in seen.record.holding and node != self.node:
                candidate = (seen.record.holding[pid], node)
                best = candidate if best is None or candidate > best else best
        return None if best is None else best[1]

    def plan(self, members: list[Member], held: Collection[PartitionId],
             orphaned: Collection[PartitionId]) -> Moves:
        """This node's moves (`plan_moves`) from this tick's inputs; when they equal the last
        plan's and that plan moved nothing, no move again without computing it."""
        inputs: _PlanInputs = (members, frozenset(held), frozenset(orphaned))
        if self._quiet_inputs is not None and self._quiet_inputs == inputs:
            return Moves(waiting_on=frozenset(self.waiting_on))
        self.plans += 1
        moves = plan_moves(self.node, members, held, passive=self.passive, orphaned=orphaned,
                           max_releases=max_releases(members))
        self.waiting_on = set(moves.waiting_on)
        self._quiet_inputs = None if moves.release or moves.acquire else inputs
        return moves
