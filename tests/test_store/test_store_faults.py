"""Retry policy and error mapping: pure tests of the policy, then S3 faults injected by a proxy
between boto3 and moto (tests/faultproxy.py), counting the attempts the proxy saw."""

from __future__ import annotations

import http.client
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
import tenacity
import urllib3.exceptions
from faultproxy import DROP, FaultProxy
from support.s3 import TEST_MULTIPART_THRESHOLD, no_sleep, s3_settings

from tiered.errors import ConfigError
from tiered.store import (
    AccessDenied,
    BucketNotFound,
    ConditionalWritesUnsupported,
    ObjectNotFound,
    PreconditionFailed,
    S3Store,
    StoreError,
    StoreSettings,
)
from tiered.store.retry import Retrier, RetryPolicy, RetryStats, is_retryable
from tiered.store.s3 import map_s3_error

ProxiedStore = Callable[..., S3Store]


def client_error(code: str, status: int, message: str = "") -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "PutObject")


# -- the policy: a pure function of the error ------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (client_error("SlowDown", 503), True),
        (client_error("Throttling", 400), True),
        (client_error("RequestLimitExceeded", 400), True),
        (client_error("TooManyRequestsException", 429), True),
        (client_error("", 429), True),
        (client_error("ServiceUnavailable", 503), True),
        (client_error("InternalError", 500), True),
        (client_error("BadGateway", 502), True),
        (client_error("GatewayTimeout", 504), True),
        (client_error("RequestTimeout", 400), True),
        (client_error("NotImplemented", 501), False),
        (client_error("AccessDenied", 403), False),
        (client_error("InvalidAccessKeyId", 403), False),
        (client_error("SignatureDoesNotMatch", 403), False),
        (client_error("NoSuchKey", 404), False),
        (client_error("404", 404), False),
        (client_error("NoSuchBucket", 404), False),
        (client_error("PreconditionFailed", 412), False),
        (client_error("ConditionalRequestConflict", 409), False),
        (client_error("InvalidRange", 416), False),
        (client_error("InvalidArgument", 400), False),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), True),
        (botocore.exceptions.ConnectTimeoutError(endpoint_url="http://x"), True),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), True),
        (botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"), True),
        (botocore.exceptions.ResponseStreamingError(error="cut"), True),
        (botocore.exceptions.IncompleteReadError(actual_bytes=1, expected_bytes=2), True),
        (urllib3.exceptions.ProtocolError("Connection aborted."), True),
        (http.client.RemoteDisconnected("closed"), True),
        (ConnectionResetError(104, "reset"), True),
        (TimeoutError(), True),
        (botocore.exceptions.NoCredentialsError(), False),
        (botocore.exceptions.ParamValidationError(report="bad"), False),
        (StoreError("already mapped"), False),
        (ValueError("bug"), False),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, bool) else str(v),
)
def test_is_retryable(exc: BaseException, retry: bool) -> None:
    assert is_retryable(exc) is retry


def test_backoff_is_exponential_with_bounded_jitter() -> None:
    wait = RetryPolicy(max_attempts=10, initial_backoff_s=0.1, max_backoff_s=1.0).wait()
    for attempt in range(1, 9):
        state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        state.attempt_number = attempt
        base = 0.1 * 2 ** (attempt - 1)
        for _ in range(20):
            delay = wait(state)
            assert min(base, 1.0) <= delay <= min(base + 0.1, 1.0)


def test_policy_validates_itself() -> None:
    with pytest.raises(ConfigError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigError, match="backoff"):
        RetryPolicy(initial_backoff_s=2.0, max_backoff_s=1.0)
    # a large initial backoff alone raises the ceiling instead of failing
    policy = RetryPolicy.from_settings(
        StoreSettings(url="s3://b-b", initial_backoff_ms=20_000, max_backoff_ms=10_000)
    )
    assert policy.max_backoff_s == policy.initial_backoff_s == 20.0


def test_retrier_sleeps_logs_counts_and_maps(caplog: pytest.LogCaptureFixture) -> None:
    sleeps: list[float] = []
    stats = RetryStats()
    retrier = Retrier(RetryPolicy(4, 0.01, 0.05), sleep=sleeps.append, stats=stats)
    outcomes: list[BaseException | str] = [
        client_error("SlowDown", 503),
        ConnectionResetError(104, "reset"),
        "ok",
    ]

    def flaky() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    with caplog.at_level(logging.WARNING, logger="tiered.store.retry"):
        assert retrier.call("get", "seg/1.log", flaky, lambda e, n: StoreError(str(e))) == "ok"
    assert len(sleeps) == 2 and all(0.01 <= s <= 0.05 for s in sleeps)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "get 'seg/1.log': attempt 1/4 failed (SlowDown (HTTP 503))" in lines[0]
    assert "attempt 2/4" in lines[1] and "ConnectionResetError" in lines[1]
    snapshot = stats.snapshot()
    assert {k: snapshot[k] for k in ("operations", "attempts", "retries", "errors",
                                     "exhausted")} == {
        "operations": 1,
        "attempts": 3,
        "retries": 2,
        "errors": 0,
        "exhausted": 0,
    }
    # the one operation, retries and sleeps included, is one latency observation
    assert sum(v for k, v in snapshot.items() if k.startswith("latency_bucket_")) == 1

    def denied() -> str:
        raise client_error("AccessDenied", 403)

    with pytest.raises(AccessDenied, match="attempts=1"):
        retrier.call("get", "k", denied, lambda e, n: AccessDenied(f"attempts={n}"))
    assert len(sleeps) == 2  # no retry, no sleep
    assert stats.snapshot()["errors"] == 1 and stats.snapshot()["exhausted"] == 0


def test_retrier_gives_up_after_max_attempts() -> None:
    stats = RetryStats()
    retrier = Retrier(RetryPolicy(3, 0.0, 0.0), sleep=no_sleep, stats=stats)

    def always_busy() -> None:
        raise client_error("SlowDown", 503)

    with pytest.raises(StoreError, match="after 3"):
        retrier.call("put", "k", always_busy, lambda e, n: StoreError(f"after {n}"))
    assert stats.snapshot()["attempts"] == 3
    assert stats.snapshot()["exhausted"] == 1


# -- error mapping ---------------------------------------------------------------------------

WHERE = "s3://bucket/pfx/key"


@pytest.mark.parametrize(
    ("exc", "conditional", "expected", "words"),
    [
        (client_error("NoSuchKey", 404), False, ObjectNotFound, "no such object"),
        (client_error("404", 404), False, ObjectNotFound, "no such object"),
        (client_error("AccessDenied", 403), False, AccessDenied, "credentials are refused"),
        (client_error("InvalidAccessKeyId", 403), False, AccessDenied, "InvalidAccessKeyId"),
        (client_error("SignatureDoesNotMatch", 403), False, AccessDenied, "access key"),
        (client_error("403", 403), False, AccessDenied, "credentials"),
        (client_error("", 401), False, AccessDenied, "credentials"),
        (client_error("NoSuchBucket", 404), False, BucketNotFound, "bucket does not exist"),
        (client_error("PreconditionFailed", 412), True, PreconditionFailed, "condition"),
        (client_error("ConditionalRequestConflict", 409), True, PreconditionFailed, "409"),
        (client_error("NoSuchKey", 404), True, PreconditionFailed, "condition not met"),
        (client_error("NotImplemented", 501), True, ConditionalWritesUnsupported, "refuses"),
        (client_error("InternalError", 500), False, StoreError, "InternalError (HTTP 500)"),
        (botocore.exceptions.NoCredentialsError(), False, AccessDenied, "no usable credentials"),
        (
            botocore.exceptions.EndpointConnectionError(endpoint_url="http://h:1"),
            False,
            StoreError,
            "http://h:1",
        ),
    ],
)
def test_map_s3_error(
    exc: BaseException, conditional: bool, expected: type[StoreError], words: str
) -> None:
    mapped = map_s3_error(exc, 1, operation="put", where=WHERE, conditional=conditional)
    assert type(mapped) is expected
    assert WHERE in str(mapped) and words in str(mapped)


def test_exhausted_error_says_how_many_attempts() -> None:
    mapped = map_s3_error(client_error("SlowDown", 503), 6, operation="get", where=WHERE)
    assert type(mapped) is StoreError
    assert "SlowDown (HTTP 503)" in str(mapped) and "gave up after 6 attempts" in str(mapped)


# -- injected faults over HTTP ---------------------------------------------------------------


def test_throttling_is_retried_until_it_succeeds(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore
) -> None:
    store = proxied_s3_store(max_attempts=4)
    store.put("seg/1.log", b"payload")
    fault_proxy.reset()
    fault_proxy.inject("slowdown", times=2, method="GET", path_contains="seg/1.log")
    assert store.get("seg/1.log") == b"payload"
    assert len(fault_proxy.seen(method="GET", path_contains="seg/1.log")) == 3
    assert store.stats.snapshot()["retries"] == 2


def test_internal_error_on_put_is_retried(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore
) -> None:
    store = proxied_s3_store()
    fault_proxy.inject("internal", times=1, method="PUT")
    etag = store.put("seg/2.log", b"written once the server recovers")
    assert len(fault_proxy.seen(method="PUT")) == 2
    assert store.head("seg/2.log").etag == etag
    assert store.get("seg/2.log") == b"written once the server recovers"


def test_dropped_connection_is_retried(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore, caplog: pytest.LogCaptureFixture
) -> None:
    store = proxied_s3_store()
    store.put("seg/3.log", b"x" * 1000)
    fault_proxy.reset()
    fault_proxy.inject(DROP, times=2, method="HEAD")
    with caplog.at_level(logging.WARNING, logger="tiered.store.retry"):
        assert store.head("seg/3.log").size == 1000
    assert len(fault_proxy.seen(method="HEAD")) == 3
    retries = [r.getMessage() for r in caplog.records if r.name == "tiered.store.retry"]
    assert len(retries) == 2 and all("head 'seg/3.log'" in line for line in retries)


def test_access_denied_surfaces_at_once(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore, s3_bucket: str
) -> None:
    store = proxied_s3_store()
    fault_proxy.inject("denied", times=5, method="GET")
    with pytest.raises(AccessDenied) as caught:
        store.get("seg/secret.log")
    assert len(fault_proxy.seen(method="GET")) == 1
    message = str(caught.value)
    assert f"s3://{s3_bucket}/pfx/seg/secret.log" in message
    assert "credentials are refused" in message
    assert "testing" not in message.replace(s3_bucket, "")  # no key material


def test_not_found_surfaces_at_once(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore
) -> None:
    store = proxied_s3_store()
    store.put("seg/4.log", b"exists, but the proxy says otherwise")
    fault_proxy.reset()
    fault_proxy.inject("notfound", times=5, method="GET")
    with pytest.raises(ObjectNotFound, match="seg/4.log"):
        store.get("seg/4.log")
    assert len(fault_proxy.seen(method="GET")) == 1


def test_exhausted_retries_raise_store_error(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore
) -> None:
    store = proxied_s3_store(max_attempts=3)
    fault_proxy.inject("slowdown", times=100, method="PUT")
    with pytest.raises(StoreError) as caught:
        store.put("seg/5.log", b"never lands")
    assert type(caught.value) is StoreError
    assert "SlowDown (HTTP 503)" in str(caught.value)
    assert "gave up after 3 attempts" in str(caught.value)
    assert len(fault_proxy.seen(method="PUT")) == 3
    assert store.stats.snapshot()["exhausted"] == 1


def test_conflict_on_conditional_put_is_a_lost_race(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore
) -> None:
    store = proxied_s3_store()
    fault_proxy.inject("conflict", times=1, method="PUT", header="If-None-Match")
    with pytest.raises(PreconditionFailed):
        store.put("m/manifest.json", b"v1", if_none_match=True)
    assert len(fault_proxy.seen(method="PUT")) == 1


def test_multipart_retries_only_the_failed_part(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore, tmp_path: Path
) -> None:
    store = proxied_s3_store()
    data = os.urandom(2 * TEST_MULTIPART_THRESHOLD + 10)
    src = tmp_path / "seg.log"
    src.write_bytes(data)
    fault_proxy.inject("internal", times=1, method="PUT", query_contains="partNumber=2")
    store.put_file("seg/mp.log", src)
    parts = [s.query for s in fault_proxy.seen(method="PUT", query_contains="partNumber=")]
    assert sorted(q.split("partNumber=")[1].split("&")[0] for q in parts) == ["1", "2", "2", "3"]
    assert store.get("seg/mp.log") == data


def test_failed_multipart_upload_is_aborted(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore, tmp_path: Path
) -> None:
    store = proxied_s3_store()
    src = tmp_path / "seg.log"
    src.write_bytes(os.urandom(TEST_MULTIPART_THRESHOLD + 10))
    fault_proxy.inject("denied", times=1, method="PUT", query_contains="partNumber=2")
    with pytest.raises(AccessDenied):
        store.put_file("seg/mp.log", src)
    assert len(fault_proxy.seen(method="DELETE", query_contains="uploadId=")) == 1
    assert not store.exists("seg/mp.log")


def test_list_and_delete_many_page_and_batch(
    fault_proxy: FaultProxy, proxied_s3_store: ProxiedStore
) -> None:
    store = proxied_s3_store()
    keys = [f"b/{i:04d}" for i in range(10)]
    for key in keys:
        store.put(key, b"")
    fault_proxy.reset()
    store.list_page_size = 4
    fault_proxy.inject("slowdown", times=1, method="GET", query_contains="continuation-token")
    assert [i.key for i in store.list("b/")] == keys
    assert len(fault_proxy.seen(method="GET", query_contains="list-type=2")) == 4  # 3 + retry
    # 1001 keys (most never existed, which S3 does not mind): one full batch and one of 1
    doomed = keys + [f"b/never-{i}" for i in range(991)]
    assert store.delete_many(doomed) == []
    assert len(fault_proxy.seen(method="POST", query_contains="delete")) == 2
    assert list(store.list("b/")) == []


def test_missing_bucket_names_the_bucket(moto_endpoint: str) -> None:
    store = S3Store(s3_settings(moto_endpoint, "no-such-bucket-here"), sleep=no_sleep)
    with store, pytest.raises(StoreError, match="no-such-bucket-here.*bucket does not exist"):
        store.put("k", b"x")


def test_unreachable_endpoint_is_retried_then_a_store_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    settings = s3_settings(endpoint, "bucket", max_attempts=2, connect_timeout_s=2.0)
    store = S3Store(settings, sleep=no_sleep)
    with store:
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}.*gave up after 2 attempts"):
            store.head("k")
        assert store.stats.snapshot()["attempts"] == 2


def test_a_wrong_endpoint_says_to_check_it(s3_bucket: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens at the configured endpoint: every retry line and the final error say
    to check `endpoint_url`, not only "could not connect"."""
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3Store(StoreSettings(url=f"s3://{s3_bucket}",
                                  endpoint_url=f"http://127.0.0.1:{port}", max_attempts=3,
                                  initial_backoff_ms=0, max_backoff_ms=0, connect_timeout_s=2.0),
                    sleep=no_sleep)
    with caplog.at_level(logging.WARNING, logger="tiered.store.retry"), \
            pytest.raises(StoreError) as info:
        store.head("seg/1.log")
    assert "endpoint_url" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)
    retries = [r.getMessage() for r in caplog.records if r.name == "tiered.store.retry"]
    assert len(retries) == 3 and all("endpoint_url" in line for line in retries)
