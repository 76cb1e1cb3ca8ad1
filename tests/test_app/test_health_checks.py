"""`/health` tells the truth about the read path (docs/archiver.md, "/health"): a cache disk
that is full or cannot be written, and a store the read path cannot reach, make it
`degraded` with the reason; it is `ok` again once the condition clears.

The pure answers are tested directly; the checks' I/O on a real directory and a real S3 store
(moto through a fault proxy); and the whole on a real `tiered run` history server whose
cache directory is replaced by a file (chmod cannot stop root) and whose store requests fail
at the proxy."""

from __future__ import annotations

import errno
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faultproxy import FaultProxy
from support.daemons import running
from support.kafka_endpoint import TOPIC, History, build_history
from support.waiting import wait_until

from tiered.app import health_checks
from tiered.app.daemon import Daemon
from tiered.app.health import (
    DaemonState,
    JobCounters,
    cache_disk_problem,
    health_of,
    read_store_problem,
)
from tiered.app.health_checks import CacheDiskCheck, ReadStoreCheck
from tiered.config import Config, parse_config
from tiered.store.errors import ObjectNotFound, StoreError
from tiered.store.s3 import S3Store

pytestmark = pytest.mark.timeout(300)

RUNNING = DaemonState(jobs={"upload": JobCounters(1, 0, 1.0)}, store_up=True)


# --- the answer -------------------------------------------------------------------------------


def test_each_read_path_problem_makes_health_degraded_with_its_reason() -> None:
    assert health_of(RUNNING, 0.0).body["status"] == "ok"
    assert "reason" not in health_of(RUNNING, 0.0).body
    full = health_of(RUNNING, 0.0, cache_problem="the cache disk is full: 0 bytes free")
    assert (full.status, full.body["status"]) == (200, "degraded")
    assert full.body["reason"] == "read cache: the cache disk is full: 0 bytes free"
    assert full.body["cache_error"] == "the cache disk is full: 0 bytes free"
    store = health_of(RUNNING, 0.0, read_store_problem="the object store did not answer")
    assert (store.status, store.body["status"]) == (200, "degraded")
    assert store.body["reason"] == "read path: the object store did not answer"
    assert store.body["read_store_error"] == "the object store did not answer"
    both = health_of(DaemonState(archiving=False), 0.0, cache_problem="c", read_store_problem="s")
    assert both.body["reason"] == "read cache: c; read path: s"
    jobs = health_of(DaemonState(jobs={"upload": JobCounters(1, 1, None)}, store_up=True,
                                 last_errors={"upload": ("a-0: bad", "a-1: bad")}), 0.0)
    assert jobs.body["reason"] == "upload: a-0: bad (and 1 more)"
    # the archiver's own store down is still 503, whatever the read path says
    down = health_of(DaemonState(store_up=False, store_error="refused"), 0.0,
                     read_store_problem="s")
    assert (down.status, down.body["status"]) == (503, "unavailable")


def test_cache_disk_problem_names_what_is_wrong() -> None:
    assert cache_disk_problem("/c", free_bytes=1 << 30, needed_bytes=1 << 20,
                              write_error=None) is None
    assert cache_disk_problem("/c", free_bytes=None, needed_bytes=1, write_error=None) is None
    full = cache_disk_problem("/c", free_bytes=4096, needed_bytes=1 << 20, write_error=None)
    assert full == "the cache disk is full: 4096 bytes free in /c, a chunk needs 1048576"
    bad = cache_disk_problem("/c", free_bytes=0, needed_bytes=1, write_error="Not a directory")
    assert bad == "the cache directory cannot be written: Not a directory"


def test_read_store_problem_is_the_latest_failure_while_it_is_recent() -> None:
    assert read_store_problem(None, 100.0, 60.0) is None
    recent = read_store_problem((90.0, "list failed: refused"), 100.0, 60.0)
    assert recent == "the object store did not answer a read 10 s ago: list failed: refused"
    assert read_store_problem((30.0, "old"), 100.0, 60.0) is None


# --- the checks -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cache_disk_check_finds_a_full_disk_and_reuses_its_answer(tmp_path: Path) -> None:
    free = [1 << 30]
    clock = Clock()
    check = CacheDiskCheck(tmp_path, 1 << 20, ttl_s=5.0, clock=clock,
                           usage=lambda p: SimpleNamespace(free=free[0]))
    assert check.problem() is None
    free[0] = 100
    assert check.problem() is None  # within the TTL: the disk is not asked again
    clock.now = 5.0
    assert check.problem() == (f"the cache disk is full: 100 bytes free in {tmp_path}, a chunk "
                               "needs 1048576")
    free[0] = 1 << 30
    clock.now = 10.0
    assert check.problem() is None
    assert sorted(tmp_path.iterdir()) == []  # the probe file never stays


def test_cache_disk_check_finds_no_space_at_the_write(tmp_path: Path) -> None:
    """The disk refuses the write itself (ENOSPC, as on a full disk): the free space said
    enough, the write is what counts."""

    def no_space(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    check = CacheDiskCheck(tmp_path, 1, ttl_s=0.0, write=no_space)
    problem = check.problem()
    assert problem is not None
    assert problem.startswith("the cache directory cannot be written: cache disk is full")
    assert sorted(tmp_path.iterdir()) == []


def test_cache_disk_check_finds_a_directory_that_is_not_one(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.write_text("a file where the cache directory was")
    check = CacheDiskCheck(root, 1, ttl_s=0.0)
    problem = check.problem()
    assert problem is not None and problem.startswith("the cache directory cannot be written")
    assert str(root) in problem
    root.unlink()
    root.mkdir()
    assert check.problem() is None


def test_the_store_records_its_latest_failure_and_clears_it_on_an_answer(
        proxied_s3_store: Callable[..., S3Store], fault_proxy: FaultProxy) -> None:
    store = proxied_s3_store(max_attempts=2)
    check = ReadStoreCheck(store.stats.last_failure)
    store.put("k", b"v")
    assert store.stats.last_failure() is None and check.problem() is None
    fault_proxy.inject("internal", 2)
    with pytest.raises(StoreError):
        store.get("k")
    failure = store.stats.last_failure()
    assert failure is not None and "InternalError" in failure[1]
    assert check.problem() is not None and "InternalError" in str(check.problem())
    with pytest.raises(ObjectNotFound):  # a missing key is the store's answer
        store.get("missing")
    assert store.stats.last_failure() is None and check.problem() is None


# --- a real daemon ----------------------------------------------------------------------------


def _health(daemon: Daemon) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(daemon.server.url + "/health", timeout=10) as response:
            body: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as err:
        body = json.loads(err.read())
    return body


def _read(daemon: Daemon, partition: int, offset: int) -> int:
    url = (f"{daemon.server.url}/v1/topics/{TOPIC}/partitions/{partition}/records"
           f"?offset={offset}&max_bytes=1000")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as err:
        err.read()
        return int(err.code)


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as p:
        yield p


@pytest.fixture(scope="module")
def history(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> History:
    """Archived topics a history server serves (the Kafka tests' topics)."""
    return build_history(moto_endpoint, tmp_path_factory.mktemp("health"))


def _history_server(history: History, proxy: FaultProxy, tmp_path: Path) -> Config:
    return parse_config({
        "storage": {**history.storage, "endpoint_url": proxy.url},
        "log": {"dirs": []},
        "cache": {"dir": str(tmp_path / "cache")},
        "cluster": {"storage_min_free_bytes": 0, "cloud_storage_cache_chunk_size": 8192},
    }, source="test", base_dir=tmp_path)


def test_health_is_degraded_while_the_cache_directory_cannot_be_written(
        history: History, proxy: FaultProxy, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_checks, "CACHE_CHECK_TTL_S", 0.2)  # each change seen soon
    config = _history_server(history, proxy, tmp_path)
    with running(config) as daemon:
        wait_until(lambda: _health(daemon)["status"] == "ok", "the daemon to be ok")
        assert _read(daemon, 0, 0) == 200
        cache = config.cache_dir
        shutil.rmtree(cache)
        cache.write_text("the cache directory replaced by a file")
        wait_until(lambda: _health(daemon)["status"] == "degraded", "health to degrade")
        body = _health(daemon)
        assert body["reason"].startswith("read cache: the cache directory cannot be written")
        assert str(cache) in body["cache_error"]
        cache.unlink()
        cache.mkdir()
        wait_until(lambda: _health(daemon)["status"] == "ok", "health to recover")
        assert "cache_error" not in _health(daemon)


def test_health_is_degraded_while_the_cache_disk_is_full(
        history: History, proxy: FaultProxy, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk cannot be made here without mounting one: the free space the check reads
    is what is made small."""
    config = _history_server(history, proxy, tmp_path)
    free = [1 << 40]
    real = shutil.disk_usage

    def usage(path: Any) -> Any:
        found = real(path)
        return found._replace(free=free[0]) if Path(path) == config.cache_dir else found

    monkeypatch.setattr(health_checks.shutil, "disk_usage", usage)
    monkeypatch.setattr(health_checks, "CACHE_CHECK_TTL_S", 0.2)  # each change seen soon
    with running(config) as daemon:
        wait_until(lambda: _health(daemon)["status"] == "ok", "the daemon to be ok")
        free[0] = 100
        wait_until(lambda: _health(daemon)["status"] == "degraded", "health to degrade")
        assert "the cache disk is full: 100 bytes free" in _health(daemon)["reason"]
        free[0] = 1 << 40
        wait_until(lambda: _health(daemon)["status"] == "ok", "health to recover")


def test_health_is_degraded_while_the_read_path_cannot_reach_the_store(
        history: History, proxy: FaultProxy, tmp_path: Path) -> None:
    config = _history_server(history, proxy, tmp_path)
    with running(config) as daemon:
        wait_until(lambda: _health(daemon)["status"] == "ok", "the daemon to be ok")
        proxy.inject("internal", 1 << 30)  # every store request fails from now on
        assert _read(daemon, 1, 0) == 503
        body = _health(daemon)
        assert body["status"] == "degraded"
        assert body["reason"].startswith("read path: the object store did not answer a read")
        assert "InternalError" in body["read_store_error"]
        proxy.reset()  # the store answers again
        assert _read(daemon, 1, 0) == 200
        wait_until(lambda: _health(daemon)["status"] == "ok", "health to recover")
        assert "read_store_error" not in _health(daemon)
