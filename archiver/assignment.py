"""Which sidecar should upload each partition: a pure function of the live sidecars' records.

Every sidecar computes the same answer from the same records, so they agree on who uploads
what without talking to each other; the leases in the bucket (`manifests.lease_objects`) then make
sure that, whatever views disagree for a moment, only one of them holds a partition.

Rules (docs/operations.md, "One sidecar per broker"):

* a partition's **candidates** are the live, non-passive nodes with a replica of it that is not
  behind: a node is behind when its high watermark is below another candidate's of one lease
  time ago (plain follower lag never lasts that long; a replica that stopped fetching does);
* every node takes about its share: at most ``ceil(partitions / nodes)`` while another
  candidate has room (a partition only some nodes have a replica of goes to the least loaded
  of them);
* the current holder keeps a partition while it is a candidate and within its share, so a
  partition moves only when a node joins, leaves or falls behind; which ones move is decided
  by rendezvous hashing, so every observer picks the same ones;
* a node hands over at most `max_releases` partitions per renewal: a joining node picks
  partitions up a few at a time, never in a storm.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from manifests.lease_objects import PartitionId, ReplicaState

__all__ = ["Member", "Moves", "assign", "behind", "current_holders", "plan_moves", "score"]


@dataclass(frozen=True)
class Member:
    """A live node as its record describes it: its replicas, and the leases it holds (by
    generation). A passive member (a one-shot command) holds what it holds but is never
    given a partition."""

    node: str
    replicas: Mapping[PartitionId, ReplicaState] = field(default_factory=dict)
    holding: Mapping[PartitionId, int] = field(default_factory=dict)
    passive: bool = False


@dataclass(frozen=True)
class Moves:
    """What one node should do now: hand these partitions over (to the node named), and try
    to take these (the keeper reads each lease before it does)."""

    release: tuple[tuple[PartitionId, str], ...] = ()
    acquire: tuple[PartitionId, ...] = ()
    #: nodes holding partitions the assignment gives this one: it watches them closely
    waiting_on: frozenset[str] = frozenset()


def score(node: str, pid: PartitionId) -> int:
    """Rendezvous weight of `node` for `pid`: stable across processes and releases."""
    text = f"{node}/{pid.topic}/{pid.partition}/{pid.revision}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def behind(node: str, pid: PartitionId, members: Sequence[Member]) -> bool:
    """True when `node`'s replica of `pid` is below where another member's was one lease time
    ago (that member's `high_watermark_ago`; -1, not yet known, never counts)."""
    mine = next((m.replicas[pid] for m in members if m.node == node and pid in m.replicas),
                None)
    if mine is None:
        return True
    return any(m.node != node and pid in m.replicas
               and mine.high_watermark < m.replicas[pid].high_watermark_ago for m in members)


def current_holders(members: Sequence[Member]) -> dict[PartitionId, str]:
    """Who holds each partition as the members advertise it; when two advertise one (a lease
    that changed hands since the loser last renewed), the higher generation is the holder."""
    best: dict[PartitionId, tuple[int, str]] = {}
    for m in members:
        for pid, generation in m.holding.items():
            if pid not in best or (generation, m.node) > best[pid]:
                best[pid] = (generation, m.node)
    return {pid: node for pid, (_, node) in best.items()}


def assign(members: Sequence[Member]) -> dict[PartitionId, str]:
    """The node that should upload each partition some live, non-passive member has a replica
    of (see the module docstring). Deterministic in its input, whatever its order."""
    active = sorted((m for m in members if not m.passive), key=lambda m: m.node)
    partitions = sorted({pid for m in active for pid in m.replicas})
    if not active or not partitions:
        return {}
    candidates: dict[PartitionId, list[str]] = {}
    for pid in partitions:
        having = [m.node for m in active if pid in m.replicas]
        ok = [n for n in having if not behind(n, pid, active)]
        candidates[pid] = ok or having  # all "behind" means watermarks went back: keep all
    quota = math.ceil(len(partitions) / len(active))
    load = {m.node: 0 for m in active}
    desired: dict[PartitionId, str] = {}
    holders = current_holders(active)
    for m in active:  # holders keep what they hold, up to their share, best-scored first
        kept = sorted((pid for pid in partitions
                       if holders.get(pid) == m.node and m.node in candidates[pid]),
                      key=lambda pid, n=m.node: -score(n, pid))  # type: ignore[misc]
        for pid in kept[:quota]:
            desired[pid] = m.node
            load[m.node] += 1
    # the rest, the most constrained first, each to the least loaded of its candidates
    rest = sorted((pid for pid in partitions if pid not in desired),
                  key=lambda pid: (len(candidates[pid]), pid))
    for pid in rest:
        best = min(candidates[pid],
                   key=lambda n, p=pid: (load[n] >= quota, load[n], -score(n, p)))  # type: ignore[misc]
        desired[pid] = best
        load[best] += 1
    return desired


def plan_moves(
    me: str,
    members: Sequence[Member],
    held: Collection[PartitionId],
    *,
    passive: bool = False,
    orphaned: Collection[PartitionId] = (),
    max_releases: int = 1,
) -> Moves:
    """What node `me` should do (its own member is among `members`; `held` are the leases this
    process holds). Release what `assign` gives to another node, at most `max_releases`;
    acquire what it gives to `me` and no other live member holds. `orphaned`: partitions no
    live member has held for a lease time although another should have taken them (its view
    differs, or it cannot): any candidate may take those. A passive node releases nothing and
    takes only partitions no live, active member has a replica of."""
    desired = assign(members)
    holders = current_holders(members)
    mine = next((m for m in members if m.node == me), Member(me))
    release: list[tuple[PartitionId, str]] = []
    if not passive:
        for pid in sorted(held):
            to = desired.get(pid)
            if to is not None and to != me and len(release) < max_releases:
                release.append((pid, to))
    acquire: list[PartitionId] = []
    waiting: set[str] = set()
    for pid in sorted(mine.replicas):
        if pid in held:
            continue
        holder = holders.get(pid)
        if holder is not None and holder != me:
            if desired.get(pid) == me:
                waiting.add(holder)
            continue  # held by a live node: it hands over when `assign` says so
        if passive:
            if pid not in desired or holder == me:
                acquire.append(pid)
        elif desired.get(pid) == me or holder == me or (
                pid in orphaned and not behind(me, pid, members)):
            acquire.append(pid)
    return Moves(tuple(release), tuple(acquire), frozenset(waiting))
