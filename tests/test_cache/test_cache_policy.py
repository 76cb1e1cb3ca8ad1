"""The policy simulator behind benchmarks/cache_policy.py: Belady and the strategies replayed on
tiny traces whose outcome can be worked out by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cache.eviction import make_strategy


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cache_policy.py"
    spec = importlib.util.spec_from_file_location("cache_policy_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def trace(sim: ModuleType, chunks: list[int], reader: str = "r") -> list[object]:
    return [sim.Access(reader, 0, c, False) for c in chunks]


def test_belady_evicts_the_chunk_used_furthest_ahead(sim: ModuleType) -> None:
    # capacity 2: at the miss on 2, chunk 1 is needed again before 0 is: 0 goes
    t = trace(sim, [0, 1, 2, 1, 0])
    assert sim.belady(t, 2)["hits"] == 1


def test_lru_on_the_same_trace(sim: ModuleType) -> None:
    t = [sim.Access(f"r{i}", 0, c, True) for i, c in enumerate([0, 1, 2, 1, 0])]
    counts = sim.simulate(t, make_strategy("lru"), 2, 1, 4)
    assert counts["hits"] == 1 and counts["evictions"] == 2


def test_eager_keeps_nothing_a_reader_left(sim: ModuleType) -> None:
    t = [sim.Access(f"r{i}", 0, c, True) for i, c in enumerate([0, 0, 1, 1])]
    assert sim.simulate(t, make_strategy("eager"), 8, 1, 4)["hits"] == 0


def test_sequential_trace_shape(sim: ModuleType) -> None:
    t = sim.sequential_trace(1, 4, [0, 2], 2)
    assert len(t) == 2 * 4 * 2
    assert [(a.reader, a.chunk) for a in t[:4]] == [(0, 0), (0, 0), (0, 1), (0, 1)]
    assert sum(sim.entering(t)) == 8


def test_predictive_reaches_belady_on_lagging_consumers(sim: ModuleType) -> None:
    t = sim.sequential_trace(2, 16, [0, 5, 11], 2)
    best = sim.belady(t, 6)["hits"]
    predictive = sim.simulate(t, make_strategy("predictive", min_chunks=0), 6, 2, 16)["hits"]
    lru = sim.simulate(t, make_strategy("lru"), 6, 2, 16)["hits"]
    assert lru < predictive <= best
    assert predictive >= 0.9 * best
