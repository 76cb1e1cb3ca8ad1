"""Chunk cache policies replayed on access traces: hit ratios of eager, capped, predictive and
plain LRU against Belady's optimal (the ceiling), at several cache sizes.

The simulation works at the chunk level and makes its decisions through the same pure code the
cache runs: `cache.eviction` strategies (voluntary release after each read, victim order when
the cache is full) and `cache.read_sessions.ReaderTable` (holds of the chunk a reader is in,
sequential detection, the future needs the predictive strategy ranks by). The cache holds
`capacity` chunks; a miss with a full cache evicts one chunk in the strategy's victim order
(unheld first, then position-held, as `ChunkCache._trim` does). Belady evicts the chunk whose
next use is furthest away, knowing the whole trace; it releases nothing voluntarily.

Traces (a consumer reads a chunk in `reads_per_chunk` fetches, as 1 MiB fetches read a 16 MiB
chunk in sixteen):

    sequential   consumers read one stream of segments from the start, at different lags
    random       readers read uniformly random chunks of the stream
    scan_hot     readers re-read a hot tail at random while one consumer scans the history

    python benchmarks/cache_policy.py                 # prints one JSON object
    python benchmarks/cache_policy.py --segments 4 --chunks-per-segment 32 --sizes 8 16 32
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cache.eviction import (  # noqa: E402
    STRATEGIES,
    ChunkId,
    ChunkView,
    EvictionStrategy,
    SegmentSnapshot,
    make_strategy,
)
from cache.read_sessions import ReaderTable  # noqa: E402

#: the configured strategies plus plain LRU, then the ceiling
POLICIES = (*sorted(STRATEGIES), "belady")
#: predictive must reach this share of Belady's hit ratio on the sequential trace
GOAL_SHARE = 0.9


@dataclass(frozen=True)
class Access:
    """One read: `reader` reads chunk `chunk` of segment `segment`; `leaving` when the read
    ends at the chunk's end (the reader holds it no longer)."""

    reader: Hashable
    segment: int
    chunk: int
    leaving: bool


def sequential_trace(
    segments: int, chunks: int, lags: Sequence[int], reads_per_chunk: int
) -> list[Access]:
    """Consumers of one stream, consumer i `lags[i]` chunks behind the first, same speed, their
    fetches interleaved."""
    stream = segments * chunks
    out = []
    for step in range(stream + max(lags)):
        for k in range(reads_per_chunk):
            for reader, lag in enumerate(lags):
                position = step - lag
                if 0 <= position < stream:
                    out.append(Access(reader, position // chunks, position % chunks,
                                      k == reads_per_chunk - 1))
    return out


def random_trace(segments: int, chunks: int, readers: int, reads: int, seed: int) -> list[Access]:
    rng = random.Random(seed)
    return [
        Access(rng.randrange(readers), rng.randrange(segments), rng.randrange(chunks), False)
        for _ in range(reads)
    ]


def scan_hot_trace(
    segments: int, chunks: int, hot_chunks: int, readers: int, reads_per_chunk: int, seed: int
) -> list[Access]:
    """Per scanned chunk, two hot-tail reads by random readers while one consumer scans."""
    rng = random.Random(seed)
    stream = segments * chunks
    hot = range(stream - hot_chunks, stream)
    out = []
    for position in range(stream):
        for k in range(reads_per_chunk):
            out.append(Access("scanner", position // chunks, position % chunks,
                              k == reads_per_chunk - 1))
            for _ in range(2):
                p = rng.choice(hot)
                out.append(Access(f"tail{rng.randrange(readers)}", p // chunks, p % chunks,
                                  False))
    return out


def entering(trace: Sequence[Access]) -> list[bool]:
    """Per access, whether its reader enters a chunk (its previous read was elsewhere): the
    reads that can miss for a reason other than the strategy releasing a chunk mid-read."""
    last: dict[Hashable, tuple[int, int]] = {}
    out = []
    for a in trace:
        out.append(last.get(a.reader) != (a.segment, a.chunk))
        last[a.reader] = (a.segment, a.chunk)
    return out


def _ids(segments: int, chunks: int) -> list[list[ChunkId]]:
    return [[ChunkId(f"s{s}", c * 1000) for c in range(chunks)] for s in range(segments)]


def simulate(
    trace: Sequence[Access],
    strategy: EvictionStrategy,
    capacity: int,
    segments: int,
    chunks: int,
) -> dict[str, int]:
    """Replay `trace` through `strategy` in a `capacity`-chunk cache: hits, misses,
    evictions (forced, to make room) and releases (voluntary)."""
    ids = _ids(segments, chunks)
    readers = ReaderTable()
    cached: dict[ChunkId, float] = {}
    by_segment: dict[str, set[ChunkId]] = {}
    counts = {"hits": 0, "misses": 0, "evictions": 0, "releases": 0, "entry_hits": 0}
    enters = entering(trace)

    def views(chunk_ids: Sequence[ChunkId] | set[ChunkId]) -> list[ChunkView]:
        needs = readers.future_needs() if strategy.uses_future else {}
        out = []
        for c in chunk_ids:
            count, nearest = needs.get(c, (0, None))
            out.append(ChunkView(c, 1, cached[c], readers.held(c), count, nearest))
        return out

    def drop(c: ChunkId) -> None:
        del cached[c]
        by_segment[c.segment].discard(c)

    for t, access in enumerate(trace):
        chunk = ids[access.segment][access.chunk]
        if chunk in cached:
            counts["hits"] += 1
            counts["entry_hits"] += enters[t]
        else:
            counts["misses"] += 1
            if len(cached) >= capacity:
                all_views = views(list(cached))
                order = strategy.victim_order(all_views)
                if not order:  # everything is position-held: take from those, as the cache does
                    order = strategy.victim_order([v._replace(held=False) for v in all_views])
                if order:
                    drop(order[0])
                    counts["evictions"] += 1
            by_segment.setdefault(chunk.segment, set()).add(chunk)
        cached[chunk] = float(t)
        outcome = readers.after_read(
            access.reader, ids[access.segment], access.chunk, access.chunk,
            inside_last=not access.leaving, prefetch=0, now=float(t),
        )
        for segment in dict.fromkeys([chunk.segment, *(c.segment for c in outcome.released)]):
            members = by_segment.get(segment, set())
            snapshot = SegmentSnapshot(segment, chunks, tuple(views(members)))
            for c in strategy.release(snapshot):
                if c in cached and not readers.held(c):
                    drop(c)
                    counts["releases"] += 1
    return counts


def belady(trace: Sequence[Access], capacity: int) -> dict[str, int]:
    """Belady's MIN: on a miss with a full cache, evict the chunk used furthest in the future."""
    keys = [(a.segment, a.chunk) for a in trace]
    next_use = [0] * len(keys)
    seen: dict[tuple[int, int], int] = {}
    for t in range(len(keys) - 1, -1, -1):
        next_use[t] = seen.get(keys[t], len(keys) + t)  # never again: furthest, distinct
        seen[keys[t]] = t
    cached: dict[tuple[int, int], int] = {}
    hits = evictions = entry_hits = 0
    enters = entering(trace)
    for t, key in enumerate(keys):
        if key in cached:
            hits += 1
            entry_hits += enters[t]
        elif len(cached) >= capacity:
            victim = max(cached, key=cached.__getitem__)
            del cached[victim]
            evictions += 1
        cached[key] = next_use[t]
    return {"hits": hits, "misses": len(keys) - hits, "evictions": evictions, "releases": 0,
            "entry_hits": entry_hits}


def run(args: argparse.Namespace) -> dict[str, object]:
    segs, chunks = args.segments, args.chunks_per_segment
    traces = {
        "sequential": sequential_trace(segs, chunks, args.lags, args.reads_per_chunk),
        "random": random_trace(segs, chunks, 4, args.random_reads, args.seed),
        "scan_hot": scan_hot_trace(segs, chunks, args.hot_chunks, 3, args.reads_per_chunk,
                                   args.seed),
    }
    results: dict[str, object] = {}
    for name, trace in traces.items():
        per_size: dict[str, dict[str, float]] = {}
        per_size_entry: dict[str, dict[str, float]] = {}
        entries = sum(entering(trace))
        for size in args.sizes:
            ratios: dict[str, float] = {}
            entry_ratios: dict[str, float] = {}
            for policy in POLICIES:
                if policy == "belady":
                    counts = belady(trace, size)
                else:
                    strategy = make_strategy(policy, hydrated_ratio=args.ratio,
                                             min_chunks=args.min_chunks)
                    counts = simulate(trace, strategy, size, segs, chunks)
                ratios[policy] = round(counts["hits"] / len(trace), 4)
                entry_ratios[policy] = round(counts["entry_hits"] / entries, 4)
            per_size[str(size)] = ratios
            per_size_entry[str(size)] = entry_ratios
        results[name] = {
            "accesses": len(trace),
            "chunk_entries": entries,
            "hit_ratio": per_size,
            "chunk_entry_hit_ratio": per_size_entry,
        }
    return results


def goal(results: dict[str, object]) -> dict[str, object]:
    """Predictive's hit ratio as a share of Belady's on the sequential trace, per cache size,
    over all reads and over chunk entries only (the stricter view)."""
    sequential = results["sequential"]
    assert isinstance(sequential, dict)
    shares = {
        metric: {
            size: round(r["predictive"] / r["belady"], 4) if r["belady"] else 1.0
            for size, r in sequential[metric].items()
        }
        for metric in ("hit_ratio", "chunk_entry_hit_ratio")
    }
    return {
        "predictive_share_of_belady_sequential": shares,
        "target": GOAL_SHARE,
        "met": all(s >= GOAL_SHARE for s in shares["hit_ratio"].values()),
        "met_on_chunk_entries": all(
            s >= GOAL_SHARE for s in shares["chunk_entry_hit_ratio"].values()
        ),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--segments", type=int, default=6)
    p.add_argument("--chunks-per-segment", type=int, default=64,
                   help="1 GiB segments of 16 MiB chunks by default")
    p.add_argument("--lags", type=int, nargs="+", default=[0, 6, 20, 45],
                   help="chunks each sequential consumer is behind the first")
    p.add_argument("--reads-per-chunk", type=int, default=4)
    p.add_argument("--random-reads", type=int, default=6000)
    p.add_argument("--hot-chunks", type=int, default=12)
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128],
                   help="cache sizes in chunks")
    p.add_argument("--ratio", type=float, default=0.7,
                   help="cloud_storage_hydrated_chunks_per_segment_ratio")
    p.add_argument("--min-chunks", type=int, default=5,
                   help="cloud_storage_min_chunks_per_segment_threshold")
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    results = run(args)
    print(json.dumps({
        "benchmark": "cache_policy",
        "python": platform.python_version(),
        "params": {k: v for k, v in vars(args).items()},
        "results": results,
        "goal": goal(results),
    }, indent=2))


if __name__ == "__main__":
    main()
