"""Shared fixtures, and the test tiers.

Object stores: one moto S3 server over real HTTP on 127.0.0.1 for the whole session (boto3
talks to it exactly as to AWS), a fresh bucket per test, and `store`, parametrised over every
backend, for the contract suite.

Tiers: `pytest` runs everything (CI and the README). `pytest -m "not slow"` is the fast tier a
developer runs while changing code: the slow tier is every test that needs the S3 server over
HTTP (marked `s3` here, from the fixtures it uses), Spark (its folder's conftest), processes,
crashes, real Kafka clients, the chaos run or a benchmark script (marked in their modules).
"""

from __future__ import annotations

import functools
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from faultproxy import FaultProxy
from support.s3 import (
    EXTERNAL_S3,
    FAKE_AWS_ENV,
    TEST_MULTIPART_THRESHOLD,
    condition_form,
    no_sleep,
    s3_settings,
)

from tiered.store import (
    STORES,
    FileStore,
    ObjectStore,
    S3Store,
    StoreSettings,
)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of the S3 server the session's tests use: moto on 127.0.0.1 (ephemeral port), or
    the real server `TIERED_TEST_S3_ENDPOINT` names."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        for name, value in FAKE_AWS_ENV.items():
            mp.setenv(name, value)
        mp.delenv("AWS_PROFILE", raising=False)
        if EXTERNAL_S3:
            yield EXTERNAL_S3
            return
        _conditional_writes_atomic(mp)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


def _conditional_writes_atomic(mp: pytest.MonkeyPatch) -> None:
    """Make moto's conditional writes atomic, as S3's and Ceph RGW's are. moto checks
    If-Match / If-None-Match and then writes, in two steps without a lock: two PUTs on
    one ETag arriving together may both succeed, which fails a compare-and-swap test for a
    reason in the test server (a change among four racing writers lost once in some
    thousand runs). Its PUTs and DELETEs of objects run one at a time here."""
    from moto.s3.responses import S3Response

    lock = threading.RLock()
    for name in ("put_object", "delete_object"):
        original = getattr(S3Response, name)

        @functools.wraps(original)
        def one_at_a_time(self: Any, *args: Any, _original: Any = original,
                          **kwargs: Any) -> Any:
            with lock:
                return _original(self, *args, **kwargs)

        mp.setattr(S3Response, name, one_at_a_time)


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> Iterator[str]:
    """A new, empty bucket; moto's state is wiped afterwards so memory does not grow."""
    name = f"tiered-test-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    client.close()
    yield name
    if EXTERNAL_S3:
        return  # a real server keeps its throwaway buckets; moto is wiped to bound memory
    reset = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(reset, timeout=30):
        pass


@pytest.fixture
def s3_store(moto_endpoint: str, s3_bucket: str) -> Iterator[S3Store]:
    store = S3Store(s3_settings(moto_endpoint, s3_bucket), sleep=no_sleep)
    if EXTERNAL_S3:  # a writer probes first; on a real server the spelling may differ
        store.use_condition_form(condition_form(moto_endpoint))
    yield store
    store.close()


@pytest.fixture
def fault_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of moto (see tests/faultproxy.py)."""
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def proxied_s3_store(fault_proxy: FaultProxy, s3_bucket: str) -> Iterator[Callable[..., S3Store]]:
    """Factory of S3 stores that talk to moto through `fault_proxy`, with a no-op backoff
    sleep; keyword arguments override `StoreSettings` fields."""
    made: list[S3Store] = []

    def make(**overrides: Any) -> S3Store:
        store = S3Store(s3_settings(fault_proxy.url, s3_bucket, **overrides), sleep=no_sleep)
        if EXTERNAL_S3:
            store.use_condition_form(condition_form(EXTERNAL_S3))
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[FileStore]:
    settings = StoreSettings(
        url=f"file://{tmp_path}/bucket", multipart_threshold=TEST_MULTIPART_THRESHOLD
    )
    store = FileStore(settings)
    yield store
    store.close()


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest) -> ObjectStore:
    """Each registered backend in turn (fixture `<scheme>_store`): the contract suite runs once
    per backend, and a new backend without a fixture fails here instead of going untested."""
    backend: ObjectStore = request.getfixturevalue(f"{request.param}_store")
    return backend


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One real PySpark session (local[2], UI off) for the whole test run: it takes ~4 s to
    start, so every Spark test shares it."""
    from spark_jobs.session import get_session

    session = get_session("local[2]", app_name="tiered-tests")
    try:
        yield session
    finally:
        session.stop()


#: fixtures whose use means the S3 server over HTTP (each depends on `moto_endpoint`)
_S3_FIXTURES = frozenset({"moto_endpoint", "s3_bucket", "s3_store", "fault_proxy",
                          "proxied_s3_store"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that talk to the S3 server `s3` and `slow` (see the module docstring):
    by the fixtures they use, or the `store` backend they are parametrised with."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("store") if callspec is not None else None
        if names & _S3_FIXTURES or backend == "s3":
            item.add_marker(pytest.mark.s3)
            item.add_marker(pytest.mark.slow)
