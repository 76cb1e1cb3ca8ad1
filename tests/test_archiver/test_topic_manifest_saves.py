"""The topic manifests an upload round saves: several at once, each topic's failure its own.

`save_topic_manifests` runs after every upload round; a one-shot pass starts with nothing
saved, so it reads (and, on a new bucket, writes) every archived topic's manifest. These run
side by side, within a bound, and what one topic's failure leaves is that topic's error only.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from manifest_fakes import MemoryStore

from archiver.service import save_topic_manifests
from manifests.topic import TopicManifest, load_topic_manifest
from tiered.config import default_config
from tiered.kafka.checkpoints import TopicPartition
from tiered.store.errors import StoreError


def _states(topics: int, partitions: int = 2) -> list[Any]:
    """Partition states as `save_topic_manifests` reads them: every partition archived."""
    return [SimpleNamespace(tp=TopicPartition(f"t{t:02d}", p), revision="r1",
                            cursor=SimpleNamespace(manifest=SimpleNamespace(last_offset=10)))
            for t in range(topics) for p in range(partitions)]


class _GatedStore(MemoryStore):
    """Holds every PUT (only topic manifests are written here) until `expected` of them are
    in flight at once, or the gate times out: the saves ran side by side exactly when the gate
    opened."""

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.gate = threading.Barrier(expected, timeout=10)
        self.opened = True
        self.in_flight = 0
        self.most = 0
        self._count = threading.Lock()

    def put(self, key: str, data: bytes, **kw: Any) -> str:
        with self._count:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            self.gate.wait()
        except threading.BrokenBarrierError:
            self.opened = False
        finally:
            with self._count:
                self.in_flight -= 1
        return super().put(key, data, **kw)


def test_topic_manifests_are_saved_side_by_side(tmp_path: Path) -> None:
    config = default_config(tmp_path)
    store = _GatedStore(expected=4)
    saved: dict[tuple[str, str], TopicManifest] = {}
    errors = save_topic_manifests(store, _states(8), config.topic_config, saved,
                                  concurrency=4)
    assert errors == []
    assert store.opened, "four saves never ran at once"
    assert store.most == 4  # never more than the bound
    assert sorted(saved) == [(f"t{t:02d}", "r1") for t in range(8)]
    for (topic, revision), tm in saved.items():
        assert load_topic_manifest(store, topic, revision) == tm
    # a second round has nothing new to save: no request at all
    before = sum(store.calls.values())
    assert save_topic_manifests(store, _states(8), config.topic_config, saved) == []
    assert sum(store.calls.values()) == before


def test_one_topic_s_failure_is_that_topic_s_error_only(tmp_path: Path) -> None:
    config = default_config(tmp_path)
    store = MemoryStore()
    real_put = store.put

    def put(key: str, data: bytes, **kw: Any) -> str:
        if "t03" in key:
            raise StoreError("the store refused t03")
        return real_put(key, data, **kw)

    store.put = put  # type: ignore[method-assign]
    saved: dict[tuple[str, str], TopicManifest] = {}
    errors = save_topic_manifests(store, _states(6), config.topic_config, saved,
                                  concurrency=3)
    assert len(errors) == 1 and errors[0].startswith("t03: saving the topic manifest: ")
    assert "the store refused t03" in errors[0]
    assert ("t03", "r1") not in saved  # tried again next round
    assert sorted(saved) == [(f"t{t:02d}", "r1") for t in range(6) if t != 3]


@pytest.mark.parametrize("topics", [0, 1])
def test_few_topics_need_no_pool_beyond_them(tmp_path: Path, topics: int) -> None:
    config = default_config(tmp_path)
    store = MemoryStore()
    saved: dict[tuple[str, str], TopicManifest] = {}
    assert save_topic_manifests(store, _states(topics), config.topic_config, saved) == []
    assert len(saved) == topics
