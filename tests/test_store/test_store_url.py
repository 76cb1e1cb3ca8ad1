"""Store URLs: parsing, the scheme registry, and `open_store`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiered.errors import ConfigError
from tiered.store import (
    STORES,
    AccessDenied,
    FileStore,
    ObjectInfo,
    ObjectStore,
    S3Store,
    StoreError,
    StoreSettings,
    check_reachable,
    open_store,
    parse_store_url,
)
from tiered.store.probe import VERDICT_KEY


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket", ("s3", "bucket", "")),
        ("s3://bucket/", ("s3", "bucket", "")),
        ("s3://my.bucket-1/a/b/", ("s3", "my.bucket-1", "a/b")),
        ("S3://bucket/tiered", ("s3", "bucket", "tiered")),
        ("s3://bucket/with%20space", ("s3", "bucket", "with space")),
        ("file:///srv/tiered", ("file", "/srv/tiered", "")),
        ("file:///srv//tiered/", ("file", "/srv/tiered", "")),
        ("file://localhost/srv/tiered", ("file", "/srv/tiered", "")),
        ("file:///srv/my%20store", ("file", "/srv/my store", "")),
    ],
)
def test_parse_store_url(url: str, expected: tuple[str, str, str]) -> None:
    assert parse_store_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://Bucket", "bad bucket name"),
        ("s3://ab", "bad bucket name"),
        ("s3://" + "a" * 64, "bad bucket name"),
        ("s3://-bucket", "bad bucket name"),
        ("s3://bucket_name", "bad bucket name"),
        ("s3://my..bucket", "next to another"),
        ("s3://192.168.1.1", "IP address"),
        ("s3://xn--bucket", "reserved"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket/a//b", "empty"),
        ("s3://bucket/c:/x", "':'"),
        ("s3://bucket/a?versionId=1", "query"),
        ("gs://bucket", "unknown scheme 'gs'"),
        ("/abs/path/without/scheme", "unknown scheme '(none)'"),
        ("file://relative/path", "relative paths are not allowed"),
        ("file:relative/path", "must be absolute"),
        ("file:///srv/../etc", "'..'"),
    ],
)
def test_bad_store_urls_are_config_errors_naming_the_url(url: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_store_url(url)
    message = str(caught.value)
    assert url in message
    assert reason in message


def test_credentials_in_a_url_are_never_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_store_url("s3://AKIAEXAMPLE:sup3rsecret@bucket/x")
    assert "sup3rsecret" not in str(caught.value)
    assert "AKIAEXAMPLE" not in str(caught.value)
    assert "***@bucket" in str(caught.value)


def test_registry_is_keyed_by_scheme() -> None:
    assert {"s3": S3Store, "file": FileStore} == STORES
    assert all(cls.scheme == scheme for scheme, cls in STORES.items())


def test_open_store_builds_the_backend_for_the_scheme(tmp_path: Path) -> None:
    with open_store(StoreSettings(url=f"file://{tmp_path}/store")) as store:
        assert isinstance(store, FileStore)
        assert store.root == f"{tmp_path}/store"
        # the probe cleaned up after itself, leaving only its verdict
        assert [i.key for i in store.list()] == [VERDICT_KEY]


def test_open_store_s3(moto_endpoint: str, s3_bucket: str) -> None:
    settings = StoreSettings(
        url=f"s3://{s3_bucket}/p",
        endpoint_url=moto_endpoint,
        access_key="testing",
        secret_key="testing",
    )
    store: ObjectStore = open_store(settings)
    try:
        assert isinstance(store, S3Store)
        assert (store.bucket, store.prefix) == (s3_bucket, "p/")
        assert [i.key for i in store.list()] == [VERDICT_KEY]
    finally:
        store.close()


def test_open_store_refuses_a_bad_url_before_connecting() -> None:
    with pytest.raises(ConfigError, match="ftp://x"):
        open_store(StoreSettings(url="ftp://x"))


def test_half_given_credentials_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="must be set together"):
        S3Store(StoreSettings(url="s3://bucket", access_key="AKIA", secret_key=None))


def test_secret_key_is_not_in_settings_repr() -> None:
    settings = StoreSettings(url="s3://bucket", access_key="AKIA", secret_key="sup3rsecret")
    assert "sup3rsecret" not in repr(settings)


def test_a_file_store_never_imports_boto3(tmp_path: Path) -> None:
    """Backends are imported on first use: a `file://` user does not pay for boto3."""
    code = (
        "import sys\n"
        "from tiered.store import StoreSettings, open_store\n"
        f"open_store(StoreSettings(url={(tmp_path / 'b').as_uri()!r}), probe=True).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_check_reachable_takes_a_refused_listing_as_an_answer(tmp_path: Path) -> None:
    """Read-only credentials may lack s3:ListBucket: the store still answered. Anything
    else (no bucket, nothing listening) is the one diagnosis the caller reports."""

    class NoList(FileStore):
        def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
            raise AccessDenied("list: access denied")

    class Down(FileStore):
        def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
            raise StoreError("list: could not connect")

    settings = StoreSettings(url=(tmp_path / "b").as_uri())
    check_reachable(NoList(settings))
    with pytest.raises(StoreError, match="could not connect"):
        check_reachable(Down(settings))
