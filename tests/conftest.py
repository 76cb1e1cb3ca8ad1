"""Shared fixtures.

Object stores: one moto S3 server over real HTTP on 127.0.0.1 for the whole session (boto3
talks to it exactly as to AWS), a fresh bucket per test, and `store`, parametrised over every
backend, for the contract suite.
"""

from __future__ import annotations

import os
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from faultproxy import FaultProxy

from tiered.store import (
    STORES,
    FileStore,
    ObjectStore,
    S3Store,
    StoreSettings,
    probe_conditional_writes,
)

#: fixtures shared by the tests of several modules (tests/support/)
pytest_plugins = ["support.remote", "support.spark", "support.kafka_fixtures"]

#: small enough that a test file of a few parts exercises multipart; S3's minimum part size
TEST_MULTIPART_THRESHOLD = 5 * 1024 * 1024

_FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # never read the developer's own profile or credentials
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def no_sleep(seconds: float) -> None:
    """Retry backoff that does not wait: fault tests count attempts, not seconds."""


#: a real S3 server to run the S3 tests against instead of moto (keys testing/testing), e.g.
#: Ceph RGW from `ceph_rgw.sh up DIR PORT`: TIERED_TEST_S3_ENDPOINT=http://127.0.0.1:PORT
EXTERNAL_S3 = os.environ.get("TIERED_TEST_S3_ENDPOINT")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of the S3 server the session's tests use: moto on 127.0.0.1 (ephemeral port), or
    the real server `TIERED_TEST_S3_ENDPOINT` names."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        for name, value in _FAKE_AWS_ENV.items():
            mp.setenv(name, value)
        mp.delenv("AWS_PROFILE", raising=False)
        if EXTERNAL_S3:
            yield EXTERNAL_S3
            return
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


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


def s3_settings(endpoint: str, bucket: str, prefix: str = "pfx", **overrides: Any) -> StoreSettings:
    """Settings for the test bucket: explicit fake credentials, a small multipart threshold."""
    fields: dict[str, Any] = {
        "url": f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}",
        "endpoint_url": endpoint,
        "region": "us-east-1",
        "access_key": "testing",
        "secret_key": "testing",
        "multipart_threshold": TEST_MULTIPART_THRESHOLD,
        "multipart_chunksize": TEST_MULTIPART_THRESHOLD,
        "max_attempts": 4,
        "initial_backoff_ms": 1,
        "max_backoff_ms": 5,
    }
    fields.update(overrides)
    return StoreSettings(**fields)


def condition_form(endpoint: str) -> str:
    """The If-Match spelling the server at `endpoint` enforces, found once by the start-up
    probe as tiered finds it (moto and AWS: quoted; Ceph RGW 16.2: bare)."""
    if endpoint not in _FORMS:
        with S3Store(s3_settings(endpoint, _probe_bucket(endpoint)), sleep=no_sleep) as store:
            probe_conditional_writes(store)
            _FORMS[endpoint] = store.condition_form
    return _FORMS[endpoint]


_FORMS: dict[str, str] = {}


def _probe_bucket(endpoint: str) -> str:
    name = f"tiered-probe-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    client.close()
    return name


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
