"""S3 test settings shared by the root conftest's fixtures and the store tests: the fake
credentials, the test multipart size, the external server switch, and the If-Match spelling
a server enforces."""

from __future__ import annotations

import os
import uuid
from typing import Any

import boto3

from tiered.store import S3Store, StoreSettings, probe_conditional_writes

#: small enough that a test file of a few parts exercises multipart; S3's minimum part size
TEST_MULTIPART_THRESHOLD = 5 * 1024 * 1024

FAKE_AWS_ENV = {
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
