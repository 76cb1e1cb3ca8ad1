"""Chunk eviction strategies: the rules every registered strategy keeps, then each strategy's own
rule on a scripted snapshot."""

from __future__ import annotations

import pytest

from cache.eviction import (
    STRATEGIES,
    ChunkId,
    ChunkView,
    EvictionStrategy,
    SegmentSnapshot,
    make_strategy,
)
from tiered.errors import ConfigError


def chunk(start: int, *, at: float, held: bool = False, readers: int = 0,
          ahead: int | None = None, segment: str = "s") -> ChunkView:
    return ChunkView(ChunkId(segment, start), 100, at, held, readers, ahead)


# 10 chunks hydrated of a 10-chunk segment; 2 and 7 held
SEGMENT = SegmentSnapshot(
    "s",
    10,
    tuple(chunk(i, at=float(10 - i), held=i in (2, 7)) for i in range(10)),
)


def test_registry_has_the_config_choices_and_lru() -> None:
    assert set(STRATEGIES) == {"eager", "capped", "predictive", "lru"}
    for name, cls in STRATEGIES.items():
        assert cls.name == name


@pytest.fixture(params=sorted(STRATEGIES))
def strategy(request: pytest.FixtureRequest) -> EvictionStrategy:
    return make_strategy(request.param, hydrated_ratio=0.5, min_chunks=5)


def test_no_strategy_releases_or_trims_a_held_chunk(strategy: EvictionStrategy) -> None:
    released = strategy.release(SEGMENT)
    assert not {ChunkId("s", 2), ChunkId("s", 7)} & set(released)
    assert len(released) == len(set(released))
    order = strategy.victim_order(SEGMENT.hydrated)
    assert sorted(c.start for c in order) == [0, 1, 3, 4, 5, 6, 8, 9]


def test_a_segment_within_its_cap_keeps_everything_except_under_eager(
    strategy: EvictionStrategy,
) -> None:
    small = SegmentSnapshot("s", 4, tuple(chunk(i, at=1.0) for i in range(4)))
    expected = 4 if strategy.name == "eager" else 0
    assert len(strategy.release(small)) == expected


def test_eager_releases_every_unheld_chunk() -> None:
    released = make_strategy("eager").release(SEGMENT)
    assert sorted(c.start for c in released) == [0, 1, 3, 4, 5, 6, 8, 9]


def test_lru_releases_nothing_and_trims_oldest_first() -> None:
    lru = make_strategy("lru")
    assert lru.release(SEGMENT) == []
    # chunk i was last used at 10 - i: the highest start is the oldest
    assert [c.start for c in lru.victim_order(SEGMENT.hydrated)] == [9, 8, 6, 5, 4, 3, 1, 0]


def test_capped_releases_least_recently_used_down_to_the_cap() -> None:
    capped = make_strategy("capped", hydrated_ratio=0.5, min_chunks=5)
    assert capped.cap(10) == 5
    # 10 hydrated, cap 5: five unheld ones go, oldest first
    assert [c.start for c in capped.release(SEGMENT)] == [9, 8, 6, 5, 4]


def test_capped_lets_small_segments_stay_fully_hydrated() -> None:
    capped = make_strategy("capped", hydrated_ratio=0.5, min_chunks=5)
    assert capped.cap(4) == 4
    assert capped.release(SegmentSnapshot("s", 4, tuple(chunk(i, at=0) for i in range(4)))) == []


def test_capped_stops_short_when_held_chunks_exceed_the_cap() -> None:
    capped = make_strategy("capped", hydrated_ratio=0.2, min_chunks=0)
    snap = SegmentSnapshot("s", 5, tuple(chunk(i, at=i, held=i < 3) for i in range(5)))
    # cap 1, but three are held: both unheld go and no more
    assert [c.start for c in capped.release(snap)] == [3, 4]


def test_predictive_releases_fewest_future_readers_then_furthest_ahead() -> None:
    predictive = make_strategy("predictive", hydrated_ratio=0.5, min_chunks=0)
    snap = SegmentSnapshot(
        "s",
        8,
        (
            chunk(0, at=1, readers=2, ahead=1),
            chunk(1, at=2, readers=1, ahead=5),
            chunk(2, at=3, readers=1, ahead=2),
            chunk(3, at=4),                       # nobody needs it, recently used
            chunk(4, at=0),                       # nobody needs it, oldest
            chunk(5, at=5, readers=3, ahead=0, held=True),
        ),
    )
    # cap 4 of 6 hydrated: two go; nobody-needs-it first, oldest of those first
    assert [c.start for c in predictive.release(snap)] == [4, 3]
    order = [c.start for c in predictive.victim_order(snap.hydrated)]
    assert order == [4, 3, 1, 2, 0]


def test_predictive_on_a_scripted_consumer_sequence() -> None:
    """Two sequential consumers over chunks 0..5, one at chunk 4 and a laggard at chunk 1:
    chunks behind both are useless, the laggard's next ones stay longest."""
    predictive = make_strategy("predictive", hydrated_ratio=1.0, min_chunks=0)
    # futures: leader needs 5 (ahead 1); laggard needs 2,3,4,5 (ahead 1..4)
    views = [
        chunk(0, at=0),
        chunk(1, at=5, held=True),
        chunk(2, at=1, readers=1, ahead=1),
        chunk(3, at=2, readers=1, ahead=2),
        chunk(4, at=6, readers=1, ahead=3, held=True),
        chunk(5, at=7, readers=2, ahead=1),
    ]
    assert [c.start for c in predictive.victim_order(views)] == [0, 3, 2, 5]


def test_unknown_strategy_and_bad_ratio_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="one of capped, eager, lru, predictive"):
        make_strategy("fifo")
    with pytest.raises(ConfigError, match="ratio"):
        make_strategy("capped", hydrated_ratio=1.5)
