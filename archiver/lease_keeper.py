"""Upload leases: one uploader per partition among the sidecars sharing a bucket.

The archiver asks an `Ownership` for each partition's `Role` before it uploads, applies
retention or collects garbage: `SoleWriter` says "upload, as the log's leader epoch" (a
process that is the only writer by construction: tests, the demo); `LeaseKeeper` says
"upload, as term G" only while this node holds the partition's lease at generation G.

The keeper (docs/format.md, "Upload leases", has the protocol and its safety argument):

* **renews** the node's record every `lease_ms / 3` (its replicas with their high watermarks,
  the leases it holds). While renewals succeed it may act on its leases until
  `lease_ms - lease_ms / 3` after the start of the last one; past that (a paused process, a
  store it cannot reach) it uploads nothing and re-reads every lease before it trusts it again;
* **watches** the others with one listing every `lease_ms / 6`: a node whose record has not
  changed for `lease_ms` since this keeper first saw it unchanged is gone, and so are its
  leases;
* **moves** partitions as `archiver.assignment` says: it releases (compare-and-swap to "free")
  what belongs to another node, only when the archiver is not mid-round on it, and acquires
  what belongs to it when the lease is free, its own, or held by a node that is gone. A new
  generation is `max(lease generation, head manifest term) + 1`, and the keeper commits it as
  the head manifest's term at once, so the previous holder's commits are refused from that
  moment (`StaleTerm`): a holder that lost its lease can never commit again.

Thread model: `tick` runs on the keeper's own thread (or the caller's, for one-shot commands
and tests); `role`, `publish` and `lost` are called from archiver threads; one lock guards the
state they share. Store faults in a tick are logged and retried next tick.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from archiver.assignment import Member, Moves
from archiver.lease_watch import History, PeerWatch, note_watermarks, replica_state
from manifests import edits
from manifests.commit import ManifestStore
from manifests.errors import CorruptManifest, StaleTerm
from manifests.lease_objects import (
    Lease,
    NodeRecord,
    PartitionId,
    delete_node_record,
    iter_node_records,
    read_lease,
    read_node_record,
    write_lease,
    write_node_record,
)
from manifests.manifest import PartitionManifest
from tiered.errors import TieredError
from tiered.store.base import ObjectStore
from tiered.store.errors import PreconditionFailed

#: a head manifest as read, with its ETag (None: there is none)
_HeadRead = tuple[PartitionManifest, str | None]

log = logging.getLogger(__name__)

__all__ = ["LeaseKeeper", "LeaseStats", "LeaseView", "Ownership", "Role", "SoleWriter"]

#: attempts to win a generation above a head manifest term that keeps moving
ACQUIRE_ATTEMPTS = 3
#: the share of the store's connection pool (`cloud_storage_max_connections`, 20 by default)
#: that one tick's acquisitions may hold at once, the rest left to the archiver's requests.
#: Each acquisition is two or three requests in series, so taking thousands of partitions
#: at start is bound by store latency: raising the pool raises this with it
ACQUIRE_SHARE = 0.8


def acquire_workers(max_connections: int) -> int:
    """Acquisitions in flight at once for a store pool of `max_connections` (16 for 20)."""
    return max(1, int(max_connections * ACQUIRE_SHARE))


@dataclass(frozen=True)
class Role:
    """What this process may do with a partition. `term` None: write as the log's own leader
    epoch (a sole writer). `holder`: the node holding the lease, as far as this process knows
    (None: nobody, or no leases)."""

    uploader: bool
    term: int | None = None
    holder: str | None = None

    @property
    def name(self) -> str:
        return "uploader" if self.uploader else "standby"


@dataclass
class LeaseStats:
    """Counters for metrics; totals only grow."""

    node: str | None = None
    held: int = 0
    acquired_total: int = 0  # free or own leases taken (first holder, a handover received)
    taken_over_total: int = 0  # leases taken from a node that was gone
    released_total: int = 0  # handed over to another node, or released at shutdown
    lost_total: int = 0  # found taken by another node (fenced, or after a lapse)
    requests_total: int = 0  # store requests the leases cost (renewals, watching, moves)
    renew_failures_total: int = 0


class Ownership(Protocol):
    """Who may upload which partition: what the archiver asks before every write."""

    @property
    def node(self) -> str | None: ...

    def publish(self, replicas: Mapping[PartitionId, int]) -> None:
        """The partitions this node has replicas of (remote write on), with their high
        watermarks: after every scan of the log dirs."""

    def role(self, pid: PartitionId) -> Role: ...

    def lost(self, pid: PartitionId) -> None:
        """A commit as this partition's lease term was refused as stale: the lease moved."""

    def take_head(self, pid: PartitionId) -> tuple[PartitionManifest, str | None] | None:
        """The head manifest (and ETag, None: no head) read or committed while taking the
        partition's lease, handed over once so the first upload round need not read it
        again; None when there is none."""

    def stats(self) -> LeaseStats: ...


class SoleWriter:
    """Every partition is this process's to upload, as its leader epoch: for a process that
    is the only writer by construction (tests, the demo, a store without conditional writes,
    where leases cannot be made safe)."""

    def __init__(self, node: str | None = None) -> None:
        #: this process's node name, shown as the uploader (describe-storage) when known
        self.node = node

    def publish(self, replicas: Mapping[PartitionId, int]) -> None:
        pass

    def role(self, pid: PartitionId) -> Role:
        return Role(True, holder=self.node)

    def lost(self, pid: PartitionId) -> None:
        pass

    def take_head(self, pid: PartitionId) -> tuple[PartitionManifest, str | None] | None:
        return None

    def stats(self) -> LeaseStats:
        return LeaseStats()


class LeaseView:
    """Who uploads each partition, read from its lease object (once per partition) and never
    written: for `describe-storage`, which reports the roles without taking part."""

    def __init__(self, store: ObjectStore, node: str) -> None:
        self.store = store
        self.node = node
        self._roles: dict[PartitionId, Role] = {}

    def publish(self, replicas: Mapping[PartitionId, int]) -> None:
        pass

    def role(self, pid: PartitionId) -> Role:
        if pid not in self._roles:
            try:
                lease, _ = read_lease(self.store, pid)
            except (TieredError, OSError) as err:
                log.debug("%s: cannot read the upload lease: %s", pid, err)
                lease = None
            holder = None if lease is None else lease.holder
            mine = holder == self.node
            self._roles[pid] = Role(mine, lease.generation if mine and lease else None, holder)
        return self._roles[pid]

    def lost(self, pid: PartitionId) -> None:
        self._roles.pop(pid, None)

    def take_head(self, pid: PartitionId) -> tuple[PartitionManifest, str | None] | None:
        return None

    def stats(self) -> LeaseStats:
        return LeaseStats(node=self.node)


@dataclass
class _HeldLease:
    """A lease this node holds: the generation it wrote."""

    generation: int
    #: False after a lapse: re-read the lease before trusting it
    verified: bool = True


@dataclass
class _KeeperState:
    """What the keeper learns as it ticks: replicas' progress, its leases, and until when its
    own record is known valid."""

    replicas: dict[PartitionId, History] = field(default_factory=dict)
    held: dict[PartitionId, _HeldLease] = field(default_factory=dict)
    valid_until: float = float("-inf")
    sequence: int = 0


def _lease_or_damaged(store: ObjectStore, pid: PartitionId, warn: Callable[[str, str], None],
                      count: Callable[[], None]) -> tuple[Lease | None, str | None]:
    """The partition's lease and ETag. A damaged lease object reads as a free lease of
    generation 0 with the damaged object's ETag, so the next holder replaces it (by
    compare-and-swap) instead of the partition going without an uploader for good."""
    try:
        return read_lease(store, pid)
    except CorruptManifest as err:
        warn(f"lease {pid}", f"{pid}: the upload lease object is damaged ({err}); it is "
             "replaced when the partition is next taken")
        count()
        return None, store.head(pid.lease_key).etag


class LeaseKeeper:
    """Holds this node's upload leases (see the module docstring). `busy(pid)` is a context
    manager yielding whether the archiver is idle on `pid` (and keeping it so inside); a
    handover waits for that. `on_change` is called after this node gained a lease, so the
    daemon can start an upload round at once. `passive`: a one-shot command, which takes only
    partitions no live daemon could, and never hands any over."""

    def __init__(
        self,
        store: ObjectStore,
        mstore: ManifestStore,
        node: str,
        lease_ms: int,
        *,
        passive: bool = False,
        busy: Callable[[PartitionId], AbstractContextManager[bool]] | None = None,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.mstore = mstore
        self._node = node
        self.lease_s = lease_ms / 1000
        self.lease_ms = lease_ms
        self.renew_s = self.lease_s / 3
        self.poll_s = self.lease_s / 6
        self.passive = passive
        self._busy = busy or (lambda pid: contextlib.nullcontext(True))
        self._stopping: Callable[[], bool] = lambda: False
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._state = _KeeperState()
        self._peers = PeerWatch(node, self.lease_s, lease_ms, passive=passive, lock=self._lock,
                                clock=clock, wall=wall)
        self._last_renew = float("-inf")
        self._stats = LeaseStats(node=node)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._problem: str | None = None
        #: damaged objects already reported
        self._warned: set[str] = set()
        #: heads read or committed while taking leases, not yet handed to the archiver
        self._heads: dict[PartitionId, tuple[PartitionManifest, str | None]] = {}
        #: this node's own record was renewed recently by another process (a daemon beside
        #: an `archive --once`): a passive keeper then leaves the record to it
        self._guest = False

    @property
    def node(self) -> str:
        return self._node

    def bind(self, busy: Callable[[PartitionId], AbstractContextManager[bool]],
             stopping: Callable[[], bool] = lambda: False) -> None:
        """Set the hooks: is the archiver idle on a partition (handovers), is it stopping."""
        self._busy = busy
        self._stopping = stopping

    # -- what the archiver asks --------------------------------------------------------------

    def publish(self, replicas: Mapping[PartitionId, int]) -> None:
        now = self._clock()
        with self._lock:
            note_watermarks(self._state.replicas, replicas, now, every_s=self.renew_s,
                            keep_s=self.lease_s)

    def role(self, pid: PartitionId) -> Role:
        with self._lock:
            held = self._state.held.get(pid)
            if held is not None and held.verified and self._clock() < self._state.valid_until:
                return Role(True, held.generation, self._node)
        with self._lock:
            return Role(False, None, self._peers.holder_of(pid))

    def lost(self, pid: PartitionId) -> None:
        with self._lock:
            held = self._state.held.get(pid)
            if held is not None:
                held.verified = False  # the next tick reads the lease again
            self._heads.pop(pid, None)

    def take_head(self, pid: PartitionId) -> tuple[PartitionManifest, str | None] | None:
        with self._lock:
            return self._heads.pop(pid, None)

    def _keep_head(self, pid: PartitionId, head: PartitionManifest, etag: str | None) -> None:
        """Keep the head just read or committed under the lease for the first upload round
        (it commits by compare-and-swap on it, so a copy gone stale costs a lost race)."""
        with self._lock:
            self._heads[pid] = (head, etag)

    def stats(self) -> LeaseStats:
        with self._lock:
            return LeaseStats(**{**self._stats.__dict__, "held": sum(
                1 for h in self._state.held.values() if h.verified)})

    def holdings(self) -> dict[PartitionId, int]:
        """The leases this process holds and trusts, by generation."""
        with self._lock:
            return {p: h.generation for p, h in self._state.held.items() if h.verified}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """One tick now (the first upload round then knows its roles), then tick on a thread of
        its own until `stop`."""
        self.tick()
        self._thread = threading.Thread(target=self._loop, name="leases", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except Exception:  # the leases must outlive a bug in one tick
                log.exception("lease keeper: tick failed")

    def stop(self, *, release: bool) -> None:
        """Stop ticking; with `release`, delete the node's record, which releases all its
        leases at once in one request (docs/format.md, "Upload leases"): the others take the
        partitions over now, and this node's next run goes on under the same generations."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(10.0, self.lease_s))
        with self._lock:
            self._state.valid_until = float("-inf")  # standby everywhere from here on
            held = sum(1 for h in self._state.held.values() if h.verified)
            self._heads.clear()
        if not release:
            return
        try:
            self._count()
            delete_node_record(self.store, self._node)
        except (TieredError, OSError) as err:
            log.warning("could not remove the record of node %s (its %d upload lease(s) pass "
                        "to the others a lease time from now): %s", self._node, held, err)
            return
        if held:
            log.info("released %d upload lease(s) for the other sidecars by removing the "
                     "record of node %s", held, self._node)

    # -- one tick ----------------------------------------------------------------------------

    def tick(self) -> None:
        """Renew (when due), watch the others, and move partitions as the assignment says."""
        now = self._clock()
        self._peers.start(now)
        with self._lock:
            if now >= self._state.valid_until:
                for lease in self._state.held.values():
                    lease.verified = False  # a lapse: another node may have taken them over
        due = now - self._last_renew >= self.renew_s * 0.95
        if due and not self.passive:
            # first and on its own: a listing that fails must not cost the leases
            try:
                self._renew()
            except (TieredError, OSError) as err:
                log.warning("upload leases: renewing the record of node %s failed (%s); its "
                            "leases lapse %.1f s after the last renewal", self._node, err,
                            self.lease_s - self.renew_s)
        try:
            self._observe(now)
            if due and self.passive and not self._guest:  # see _observe: guest or not
                self._renew()
            self._verify()
            members = self._members()
            with self._lock:
                held = set(self._state.held)
                orphaned = self._peers.orphaned(self._clock())
            if self._guest:  # beside this node's daemon: work under exactly its leases
                own = self._peers.seen[self._node].record
                moves = Moves(acquire=tuple(sorted(
                    pid for pid in (own.holding if own else ()) if pid not in held)))
            else:  # skipped when nothing it depends on changed (archiver.lease_watch)
                moves = self._peers.plan(members, held, orphaned)
            changed = False
            for pid, to in moves.release:
                changed |= bool(self._release(pid, reason=f"handing over to {to}"))
            gained = self._acquire_all(moves.acquire, orphaned)
            if (changed or gained) and not self._guest:
                self._renew()  # tell the others at once
            if gained and self._on_change is not None:
                self._on_change()
            self._problem = None
        except (TieredError, OSError) as err:
            problem = f"{type(err).__name__}: {err}"
            level = logging.DEBUG if problem == self._problem else logging.WARNING
            log.log(level, "upload leases: %s; trying again in %.1f s", problem, self.poll_s)
            self._problem = problem

    def _count(self, requests: int = 1) -> None:
        with self._lock:
            self._stats.requests_total += requests

    def _renew(self) -> None:
        with self._lock:
            self._state.sequence += 1
            now = self._clock()
            record = NodeRecord(
                self._node, self._state.sequence, int(self._wall() * 1000), self.lease_ms,
                passive=self.passive,
                replicas={pid: replica_state(samples, now, self.lease_s)
                          for pid, samples in self._state.replicas.items() if samples},
                holding={p: h.generation for p, h in self._state.held.items() if h.verified})
        started = self._clock()
        try:
            self._count()
            write_node_record(self.store, record)
        except (TieredError, OSError):
            with self._lock:
                self._stats.renew_failures_total += 1
            raise
        self._last_renew = started
        if not self._stop.is_set():
            with self._lock:
                self._state.valid_until = started + self.lease_s - self.renew_s

    def _observe(self, now: float) -> None:
        """One listing of the node records (which alone tells renewals, by their versions, and
        clean stops, by a missing record), and a read of the records whose contents are due."""
        self._count()
        listed = [(node, etag) for node, etag, _ in iter_node_records(self.store)]
        with self._lock:
            due = self._peers.note_listing(listed, now)
        reads: dict[str, tuple[NodeRecord, str] | None] = {}
        for node in due:
            reads[node] = None
            self._count()
            try:
                reads[node] = read_node_record(self.store, node)
            except CorruptManifest as err:  # another node's problem must not stop this one
                self._warn_once(f"node {node}", f"the record of node {node} is unreadable "
                                f"({err}); counting that node out")
        with self._lock:
            self._peers.note_reads(reads, now)
            self._peers.track_unheld(now, self._state.replicas, [
                pid for pid, h in self._state.held.items() if h.verified])
            own = self._peers.seen.get(self._node)
            if self.passive:
                self._guest = False
                if own is not None and own.record is not None and not own.record.passive \
                        and not own.gone:
                    # a daemon of this node renews the record: a one-shot command leaves the
                    # record to it and works under the leases it holds while it renews
                    left_ms = own.record.renewed_ms + self.lease_ms - self._wall() * 1000
                    if left_ms > self.renew_s * 1000:
                        self._guest = True
                        self._state.valid_until = now + (left_ms / 1000 - self.renew_s)

    def _members(self) -> list[Member]:
        """The live members as their records say, with this node as this process knows it."""
        now = self._clock()
        with self._lock:
            members = self._peers.others(now)
            replicas = {pid: replica_state(s, now, self.lease_s)
                        for pid, s in self._state.replicas.items() if s}
            holding = {p: h.generation for p, h in self._state.held.items() if h.verified}
        members.append(Member(self._node, replicas, holding, self.passive))
        return members

    # -- moves -------------------------------------------------------------------------------

    def _verify(self) -> None:
        """Re-read every lease this process no longer trusts; keep those still its own."""
        with self._lock:
            doubtful = [pid for pid, h in self._state.held.items() if not h.verified]
            # another live node advertising a newer generation took it
            for node, seen in self._peers.seen.items():
                if node == self._node or seen.record is None or not self._peers.alive(node):
                    continue
                for pid, generation in seen.record.holding.items():
                    held = self._state.held.get(pid)
                    if held is not None and generation > held.generation:
                        held.verified = False
                        doubtful.append(pid)
        for pid in dict.fromkeys(doubtful):
            self._count()
            lease, etag = self._read_lease(pid)
            try:
                if lease is not None and lease.holder == self._node and self._own(
                        pid, lease, etag):
                    continue
            except StaleTerm:
                pass  # the head moved on again: taken afresh when the assignment says so
            with self._lock:
                if self._state.held.pop(pid, None) is not None:
                    self._stats.lost_total += 1
            holder = None if lease is None else lease.holder
            log.warning("%s: upload lease now held by %s; this node stands by", pid,
                        holder or "nobody")

    def _read_lease(self, pid: PartitionId) -> tuple[Lease | None, str | None]:
        return _lease_or_damaged(self.store, pid, self._warn_once, self._count)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", message)

    def _release(self, pid: PartitionId, *, reason: str) -> int:
        """Hand `pid`'s lease back (free, same generation), once the archiver is idle on it.
        1 when released, 0 when it has to wait (busy) or was not ours any more."""
        with self._busy(pid) as idle:
            if not idle:
                return 0
            with self._lock:
                self._state.held.pop(pid, None)  # no new round starts on it from here
            self._count()
            lease, etag = self._read_lease(pid)
            if lease is None or lease.holder != self._node:
                return 0
            free = Lease(pid, None, lease.generation, int(self._wall() * 1000))
            try:
                self._count()
                write_lease(self.store, free, etag)
            except PreconditionFailed:
                return 0  # it changed under us: not ours to release any more
        with self._lock:
            self._stats.released_total += 1
        log.info("%s: released the upload lease (generation %d): %s", pid, lease.generation,
                 reason)
        return 1

    def _acquire_all(self, pids: Sequence[PartitionId], orphaned: Collection[PartitionId]
                     ) -> int:
        """Try every acquisition; a few at a time (each is a handful of requests in series,
        and a node starting beside a thousand free partitions should not take minutes)."""
        if len(pids) <= 1:
            return sum(self._acquire(pid, force=pid in orphaned) for pid in pids)
        workers = acquire_workers(self.store.settings.max_connections)
        with ThreadPoolExecutor(min(workers, len(pids)),
                                thread_name_prefix="lease-acquire") as pool:
            return sum(pool.map(lambda pid: self._acquire(pid, force=pid in orphaned), pids))

    def _acquire(self, pid: PartitionId, *, force: bool = False) -> int:
        """Take `pid`'s lease when it is free, this node's, or its holder is gone (`force`:
        also from a live holder that has not advertised it for a lease time, and so is not
        using it); 1 when this process now holds it. Taking a lease from a holder that still
        works is safe, only wasteful: the new generation fences its commits."""
        if self._stop.is_set() or self._stopping():
            return 0  # none is started once stopping: a stop waits for no queue of them
        head_read: _HeadRead | None = None
        with self._lock:
            unadvertised = self._peers.holder_of(pid) is None  # by any other node's record
        if not self._guest and unadvertised:
            # most likely a new partition: its head first, and with none there the lease is
            # created blind (If-None-Match) instead of read first; a lease object already
            # there fails the create, and the reads below decide as for any partition
            head_read = self._load_head(pid)
            if head_read[1] is None and self._take(pid, None, None, *head_read):
                return self._gained(pid, None)
        for _ in range(ACQUIRE_ATTEMPTS):
            self._count()
            lease, etag = self._read_lease(pid)
            if lease is not None and lease.holder == self._node:
                # this node's already (another process of it, or before a restart)
                try:
                    if not self._own(pid, lease, etag, head_read):
                        return 0
                except StaleTerm:
                    head_read = None
                    continue
                return self._gained(pid, self._node)
            previous = None if lease is None else lease.holder
            if previous is not None and self._peers.alive(previous) and not force:
                return 0  # it hands over itself when the assignment says so
            if self._guest:
                return 0  # only this node's daemon takes leases
            head, head_etag = head_read or self._load_head(pid)
            head_read = None  # a second attempt reads afresh
            try:
                if not self._take(pid, lease, etag, head, head_etag):
                    return 0  # another node won it
            except StaleTerm:
                continue  # a newer term wrote the head meanwhile: a generation above it
            return self._gained(pid, previous)
        log.warning("%s: the head manifest's term kept moving past each new lease generation; "
                    "trying again later", pid)
        return 0

    def _load_head(self, pid: PartitionId) -> _HeadRead:
        self._count()
        return self.mstore.load(pid.topic, pid.partition, pid.revision)

    def _gained(self, pid: PartitionId, previous: str | None) -> int:
        """Count and log a lease this process now holds, which `previous` held (None: free;
        this node: before a restart, or another process of it); 1."""
        with self._lock:
            if previous is None or previous == self._node:
                self._stats.acquired_total += 1
            else:
                self._stats.taken_over_total += 1
            # this one lease's generation, not `holdings()`: a map of every lease held, built
            # once per lease gained, made taking N leases cost N^2
            held = self._state.held.get(pid)
            generation = held.generation if held is not None and held.verified else None
        _log_gain(pid, previous, self._node, generation)
        return 1

    def _own(self, pid: PartitionId, lease: Lease, etag: str | None,
             head_read: _HeadRead | None = None) -> bool:
        """Work under a lease that names this node: fence the head with its generation if an
        earlier fence did not land, or take a higher one if a newer term wrote the head (a
        writer outside the leases), else this node would stay fenced for good. False when
        another writer changed the lease meanwhile. `head_read`: the head as just read, if
        it was (a fence that finds it changed reads it again)."""
        head, head_etag = head_read or self._load_head(pid)
        if head.term > lease.generation:
            return self._take(pid, lease, etag, head, head_etag)
        if head.term < lease.generation and (head_etag is not None or lease.generation > 1):
            self._fence(pid, lease.generation, (head, head_etag))
        else:
            self._keep_head(pid, head, head_etag)
        with self._lock:
            self._state.held[pid] = _HeldLease(lease.generation)
        return True

    def _take(self, pid: PartitionId, lease: Lease | None, etag: str | None,
              head: PartitionManifest, head_etag: str | None) -> bool:
        """Write this node into the lease at a generation above both the lease's and the head
        manifest's term (compare-and-swap on `etag`), then fence the head with it. False when
        another writer changed the lease first; `StaleTerm` when the head's term passed the
        new generation before the fence (take again, higher)."""
        generation = max(0 if lease is None else lease.generation, head.term) + 1
        try:
            self._count()
            etag = write_lease(self.store, Lease(pid, self._node, generation,
                                                 int(self._wall() * 1000)), etag)
        except PreconditionFailed:
            return False
        # fence only when someone could hold an older term: a lease or a head existed
        if lease is not None or head_etag is not None:
            self._fence(pid, generation, (head, head_etag))
        else:
            self._keep_head(pid, head, head_etag)
        with self._lock:
            self._state.held[pid] = _HeldLease(generation)
        return True

    def _fence(self, pid: PartitionId, generation: int,
               start: tuple[PartitionManifest, str | None]) -> None:
        """Commit `generation` as the head manifest's term: from now on every commit by an
        older term (the previous holder's) is refused. `start`: the head just read (a lost
        race re-reads it)."""
        self._count()
        done = self.mstore.update(pid.topic, pid.partition, pid.revision,
                                  lambda m: edits.with_term(m, generation), start=start)
        self._keep_head(pid, done.manifest, done.etag)


def _log_gain(pid: PartitionId, previous: str | None, node: str, generation: int | None
              ) -> None:
    if previous == node:
        log.info("%s: upload lease held by this node (generation %s): uploading", pid,
                 generation)
    elif previous is None:
        log.info("%s: acquired the upload lease (generation %s)", pid, generation)
    else:
        log.warning("%s: took the upload lease over from %s, which stopped renewing "
                    "(generation %s)", pid, previous, generation)


@contextlib.contextmanager
def always_idle(pid: PartitionId) -> Iterator[bool]:
    """A `busy` hook for a keeper with no archiver beside it."""
    yield True
