"""S3 backend (AWS S3, MinIO, moto, any S3-compatible endpoint) over boto3.

Every request goes through `Retrier` (botocore's own retries are off) and every botocore error
leaves this module as a `StoreError` subclass whose message names the bucket and key.
Credentials are passed to boto3 and never logged or put in messages.
"""

from __future__ import annotations

import base64
import builtins
import functools
import http.client
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions
import botocore.loaders
import botocore.response
import botocore.session
import crc32c

from tiered.errors import ConfigError
from tiered.store.base import (
    UNCONDITIONAL,
    Blob,
    CountedStream,
    ObjectInfo,
    ObjectStore,
    RangeStream,
    StoreSettings,
    file_window,
)
from tiered.store.errors import (
    AccessDenied,
    BucketNotFound,
    ConditionalWritesUnsupported,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
)
from tiered.store.multipart import FileRange, PartScheduler, part_size, upload_parts
from tiered.store.retry import (
    UNREACHABLE_HINT,
    Retrier,
    RetryPolicy,
    RetryStats,
    describe,
    error_code,
    is_unreachable,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: S3 limits: parts are 5 MiB..5 GiB (the last may be smaller), at most 10,000 per upload, and
#: DeleteObjects takes at most 1000 keys; keys are at most 1024 UTF-8 bytes.
DELETE_BATCH = 1000
MAX_KEY_BYTES = 1024
#: the flexible checksum tiered sends with each part (see `S3Store._checksum_args`)
CHECKSUM_ALGORITHM = "CRC32C"
CHECKSUM_FIELD = "ChecksumCRC32C"

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
        "401",
        "403",
        "Forbidden",
    }
)
_PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412"})


def map_s3_error(
    exc: BaseException,
    attempts: int,
    *,
    operation: str,
    where: str,
    conditional: bool = False,
) -> BaseException:
    """The `StoreError` for a botocore error on `where` (`s3://bucket/key`).

    Pure, so the mapping is unit-tested without a server. `conditional` marks a put with
    If-Match / If-None-Match: there a 404 (If-Match on a key that is gone) and a 409 are lost
    races, hence `PreconditionFailed`, and a 501 means the endpoint cannot do conditions.
    """
    after = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = error_code(exc)
        message = str(exc.response.get("Error", {}).get("Message", "") or "")
        detail = f"{code or 'error'} (HTTP {status})" + (f": {message}" if message else "")
        if code == "NoSuchBucket":
            return BucketNotFound(
                f"{operation} {where}: the bucket does not exist ({detail}); create it, or fix "
                "the bucket name in [storage] url")
        if conditional and (
            code in _PRECONDITION_CODES or status in (409, 412) or code in _NOT_FOUND_CODES
        ):
            return PreconditionFailed(f"{operation} {where}: condition not met ({detail})")
        if code in _PRECONDITION_CODES or status == 412:
            return PreconditionFailed(f"{operation} {where}: condition not met ({detail})")
        if conditional and (code == "NotImplemented" or status == 501):
            return ConditionalWritesUnsupported(
                f"{operation} {where}: the endpoint refuses conditional PUT "
                f"(If-Match / If-None-Match): {detail}"
            )
        if code in _NOT_FOUND_CODES or status == 404:
            return ObjectNotFound(f"{operation} {where}: no such object")
        if code in _DENIED_CODES or status in (401, 403):
            return AccessDenied(
                f"{operation} {where}: access denied, the credentials are refused or lack "
                f"permission ({detail}). Check the access key, secret key and bucket policy; "
                "S3 also answers 403 for a missing key when s3:ListBucket is not granted"
            )
        return StoreError(f"{operation} {where} failed: {detail}{after}")
    if isinstance(
        exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError
    ):
        return AccessDenied(
            f"{operation} {where}: no usable credentials found ({type(exc).__name__}); set "
            "cloud_storage_access_key / cloud_storage_secret_key or the standard AWS chain "
            "(environment, profile, instance metadata)"
        )
    if isinstance(exc, botocore.exceptions.BotoCoreError | OSError):
        hint = UNREACHABLE_HINT if is_unreachable(exc) else ""
        return StoreError(f"{operation} {where} failed: {describe(exc)}{after}{hint}")
    return exc


_loader: botocore.loaders.Loader | None = None


def _botocore_session() -> botocore.session.Session:
    """A new botocore session reading its service models through the process's one loader.
    Each session would parse S3's models again (about 45 ms a client); a Spark worker builds a
    client per task, and the loader's parsed models are only read once parsed. No lock: two
    threads racing to make the first loader each get a working one, and a lock held across a
    fork would leave the child unable to build a client."""
    global _loader
    loader = _loader
    if loader is None:
        loader = _loader = botocore.loaders.create_loader()
    session = botocore.session.Session()
    session.register_component("data_loader", loader)
    return session


def warm_client_models() -> bool:
    """Parse S3's service models into the shared loader now (no request is made): Spark's
    worker daemon does it once before it forks, so no task pays for it. Best effort: a
    process whose AWS configuration a client cannot be built from (a profile named but not
    there) still starts, and each store then reports that error itself. Whether it warmed."""
    try:
        S3Store._make_client(StoreSettings(url="s3://warm", endpoint_url="http://127.0.0.1:9",
                                           access_key="-", secret_key="-"))
    except Exception as exc:  # noqa: BLE001 - an optimisation must not stop the daemon
        log.debug("S3's service models not parsed ahead: %s", exc)
        return False
    return True


def _strip_etag(etag: object) -> str:
    return str(etag or "").strip('"')


class S3Store(ObjectStore):
    """Objects under `s3://bucket/prefix/`. Thread-safe: one boto3 client (itself thread-safe)
    with a pool of `max_connections`; many archiver threads share one store.

    `sleep` is the retry backoff sleep (injected by tests); `stats` counts requests for metrics.
    """

    scheme = "s3"
    #: ListObjectsV2 page size (S3's maximum); tests lower it to exercise pagination
    list_page_size: int = 1000

    def __init__(
        self,
        settings: StoreSettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        stats: RetryStats | None = None,
    ) -> None:
        from tiered.store import parse_store_url

        super().__init__(settings)
        scheme, self.bucket, prefix = parse_store_url(settings.url)
        if scheme != self.scheme:
            raise ConfigError(f"S3Store cannot serve {settings.url!r}: not an s3:// URL")
        self.prefix = f"{prefix}/" if prefix else ""
        if (settings.access_key is None) != (settings.secret_key is None):
            raise ConfigError(
                "cloud_storage_access_key and cloud_storage_secret_key must be set together "
                "(or both left out to use the standard AWS credential chain)"
            )
        self.retrier = Retrier(RetryPolicy.from_settings(settings), sleep=sleep, stats=stats)
        self.stats = self.retrier.stats
        self._conditions_rejected = False
        self._if_match_form = "quoted"
        self._client = self._make_client(settings)
        self._parts = PartScheduler(settings.multipart_concurrency, settings.max_connections)

    @staticmethod
    def _make_client(settings: StoreSettings) -> Any:
        config = botocore.config.Config(
            max_pool_connections=settings.max_connections,
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            # botocore's own retries off: one attempt in all (its `max_attempts` would count
            # retries only), so `Retrier` is the only retry loop
            retries={"total_max_attempts": 1, "mode": "standard"},
            signature_version="s3v4",
            # MinIO, moto and most S3 clones serve buckets by path, not by virtual host
            s3={"addressing_style": "path" if settings.endpoint_url else "auto"},
        )
        region = settings.region or ("us-east-1" if settings.endpoint_url else None)
        # a private session: boto3's default session is not safe to share between threads
        session = boto3.session.Session(botocore_session=_botocore_session())
        return session.client(
            "s3",
            endpoint_url=settings.endpoint_url,
            region_name=region,
            aws_access_key_id=settings.access_key,
            aws_secret_access_key=settings.secret_key,
            config=config,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # ship settings, never the client: the receiver (a Spark executor) builds its own
        return (type(self), (self.settings,))

    # -- helpers ---------------------------------------------------------------------------

    condition_forms = ("quoted", "bare")

    def use_condition_form(self, form: str) -> None:
        super().use_condition_form(form)
        if form == UNCONDITIONAL:
            self._conditions_rejected = True  # plain PUTs from now on
        else:
            self._if_match_form = form

    @property
    def enforces_conditions(self) -> bool:
        return not self._conditions_rejected

    @property
    def condition_form(self) -> str:
        """How If-Match is spelled on this store: "quoted" (RFC 9110) or "bare"."""
        return self._if_match_form

    def _full(self, key: str) -> str:
        if not key or "\x00" in key:
            raise StoreError(f"invalid object key {key!r}: empty or contains NUL")
        full = self.prefix + key
        if len(full.encode("utf-8")) > MAX_KEY_BYTES:
            raise StoreError(f"invalid object key {key!r}: longer than {MAX_KEY_BYTES} bytes")
        return full

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}" if key else f"s3://{self.bucket}"

    def _call(
        self, operation: str, key: str, fn: Callable[[], T], *, conditional: bool = False
    ) -> T:
        where = self._where(key)

        def mapper(exc: BaseException, attempts: int) -> BaseException:
            return map_s3_error(
                exc, attempts, operation=operation, where=where, conditional=conditional
            )

        return self.retrier.call(operation, key, fn, mapper)

    # -- the bucket ------------------------------------------------------------------------

    def create_bucket(self) -> bool:
        """CreateBucket in the configured region; an existing bucket of ours is no error, one
        another account owns is (AWS's BucketAlreadyExists)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        region = self._client.meta.region_name
        if region and region != "us-east-1":  # us-east-1 takes no location constraint
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}

        def create() -> bool:
            try:  # us-east-1 answers 200 to creating a bucket one owns: ask first
                self._client.head_bucket(Bucket=self.bucket)
                return False
            except botocore.exceptions.ClientError as exc:
                if error_code(exc)[1] != 404:
                    raise
            try:
                self._client.create_bucket(**kwargs)
            except botocore.exceptions.ClientError as exc:
                if error_code(exc)[0] == "BucketAlreadyOwnedByYou":
                    return False
                raise
            return True

        return self._call("create bucket", "", create)

    # -- writes ----------------------------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        self.check_conditions(if_none_match, if_match)
        full = self._full(key)
        conditional = if_none_match or if_match is not None
        if conditional and self._conditions_rejected:
            conditional = False  # single-writer opt-out already in force, see below
        if not conditional and len(data) >= self.settings.multipart_threshold:
            view = memoryview(data)
            return self._multipart(key, len(data), lambda off, n: bytes(view[off : off + n]))

        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full, "Body": data,
                                  **self._checksum_of(data)}
        if conditional and if_none_match:
            kwargs["IfNoneMatch"] = "*"
        elif conditional and if_match is not None:
            bare = if_match.strip('"')
            # RFC 9110 quotes the entity tag (AWS, MinIO, moto); Ceph RGW 16.2 compares the
            # header with the bare ETag and refuses the quoted one: the probe picks the form
            kwargs["IfMatch"] = bare if self._if_match_form == "bare" else f'"{bare}"'
        try:
            resp = self._call(
                "put", key, lambda: self._client.put_object(**kwargs), conditional=conditional
            )
        except ConditionalWritesUnsupported:
            if not self.settings.allow_unconditional_writes:
                raise
            # documented opt-out: the endpoint rejects the condition headers outright, and the
            # operator has declared a single writer, so write without them from now on
            log.warning(
                "%s refuses conditional PUT; cloud_storage_allow_unconditional_writes is set, "
                "writing without conditions (only safe with exactly one writer)",
                self._where(key),
            )
            self._conditions_rejected = True
            return self.put(key, data)
        self.stats.add(bytes_written=len(data))
        return _strip_etag(resp.get("ETag"))

    def put_file(
        self, key: str, path: Path | str, *, ready: Callable[[], None] | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> str:
        self._full(key)
        try:
            begin, end = file_window(path, os.stat(path).st_size, byte_range, self._where(key))
        except OSError as exc:
            raise StoreError(f"put_file {self._where(key)}: cannot read {path}: {exc}") from exc
        size = end - begin
        if size >= self.settings.multipart_threshold:
            with open(path, "rb") as f:

                def read_part(offset: int, length: int) -> FileRange:
                    return FileRange(f.fileno(), begin + offset, length, str(path))

                return self._multipart(key, size, read_part, ready)

        if ready is not None:  # one request: nothing to hold back, so nothing goes first
            ready()

        with open(path, "rb") as f:
            sums = self._checksum_of(FileRange(f.fileno(), begin, size, str(path)))

        def single() -> Any:
            # reopened per attempt so a retry sends the bytes from their start
            with open(path, "rb") as f:
                body = f if byte_range is None else FileRange(f.fileno(), begin, size,
                                                               str(path))
                return self._client.put_object(Bucket=self.bucket, Key=self.prefix + key,
                                               Body=body, **sums)

        resp = self._call("put_file", key, single)
        self.stats.add(bytes_written=size)
        return _strip_etag(resp.get("ETag"))

    def _multipart(self, key: str, total: int,
                   read_part: Callable[[int, int], bytes | FileRange],
                   ready: Callable[[], None] | None = None) -> str:
        """Upload `total` bytes as parts read by `read_part(offset, length)` (the engine is
        `multipart.upload_parts`; this store makes the requests)."""
        size = part_size(total, self.settings.multipart_chunksize)
        etag = upload_parts(_S3Multipart(self, key), total, size, read_part, self._parts, ready)
        self.stats.add(bytes_written=total)
        return etag

    def _checksum_args(self) -> dict[str, str]:
        """`ChecksumAlgorithm` for a multipart upload. With botocore's default
        `request_checksum_calculation` ("when_supported") every part carries a checksum
        header; naming the algorithm at creation lets the store check each part and the whole
        object against them at completion. The algorithm is CRC-32C, computed here with the
        C-backed package (three times zlib's CRC-32 on one core, and Kafka's own batch CRC)
        rather than botocore's CRC-32. Off when the client is configured "when_required"
        (old S3 clones that refuse checksum headers)."""
        return {"ChecksumAlgorithm": CHECKSUM_ALGORITHM} if self._checksums else {}

    @functools.cached_property
    def _checksums(self) -> bool:
        config = self._client.meta.config
        return getattr(config, "request_checksum_calculation", None) == "when_supported"

    def _checksum_of(self, body: bytes | FileRange) -> dict[str, str]:
        """The CRC-32C field for a request sending `body` (empty with checksums off). Taken
        from the bytes as they are before the request: should they change under a retry, the
        store refuses them instead of storing bytes nobody checked."""
        return {CHECKSUM_FIELD: _crc32c_b64(body)} if self._checksums else {}

    def _upload_part(self, key: str, full: str, upload_id: str, number: int,
                     body: bytes | FileRange) -> dict[str, Any]:
        """One part, retried on its own; returns its entry for CompleteMultipartUpload (with
        the part's CRC-32C when checksums are on: the upload declared the algorithm)."""
        sums = self._checksum_of(body)

        def attempt() -> Any:
            if isinstance(body, FileRange):
                body.seek(0)  # a retry sends the part from its start
            return self._client.upload_part(
                Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body,
                **sums,
            )

        resp = self._call(f"upload_part#{number}", key, attempt)
        return {"ETag": str(resp["ETag"]), "PartNumber": number, **sums}

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        data, etag = self._get(key, byte_range)
        return data if isinstance(data, Blob) else Blob(data, etag)

    def read_range(self, key: str, begin: int, end: int) -> bytes:
        # the body as botocore read it: wrapping it in a Blob would copy it once more
        return self._get(key, (begin, end))[0]

    def _get(self, key: str, byte_range: tuple[int, int] | None) -> tuple[bytes, str]:
        full = self._full(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if byte_range is not None:
            begin, end = byte_range
            if begin < 0 or end < begin:
                raise ValueError(f"get {self._where(key)}: bad byte range [{begin}, {end})")
            if end == begin:  # an empty range still tells a missing key apart
                return b"", self.head(key).etag
            kwargs["Range"] = f"bytes={begin}-{end - 1}"

        def fetch() -> tuple[bytes, str]:
            try:
                resp = self._client.get_object(**kwargs)
            except botocore.exceptions.ClientError as exc:
                code, status = error_code(exc)
                if byte_range is not None and (code == "InvalidRange" or status == 416):
                    # the range starts at or past the end
                    return b"", self.head(key).etag
                raise
            body = resp["Body"]
            try:
                # StreamingBody.read checks Content-Length and raises IncompleteReadError
                return body.read(), _strip_etag(resp.get("ETag"))
            finally:
                body.close()

        data, etag = self._call("get", key, fetch)
        self.stats.add(bytes_read=len(data))
        return data, etag

    def open_range(self, key: str, begin: int, end: int, *, to_end: bool = False
                   ) -> RangeStream:
        if begin < 0 or end <= begin:
            raise ValueError(f"open_range {self._where(key)}: bad byte range [{begin}, {end})")
        kwargs = {"Bucket": self.bucket, "Key": self._full(key)}
        if begin > 0 or not to_end:
            kwargs["Range"] = f"bytes={begin}-{end - 1}"
        # the whole object: unranged. The same bytes on S3, and servers that serve a ranged
        # GET by slicing the object in memory (moto) stream an unranged one at once

        def fetch() -> RangeStream:
            # read by the caller as it arrives; a body that ends short raises (see the class)
            return _StreamedBody(self._client.get_object(**kwargs)["Body"])

        stats = self.stats
        return CountedStream(self._call("get", key, fetch),
                             lambda n: stats.add(bytes_read=n))

    def head(self, key: str) -> ObjectInfo:
        full = self._full(key)
        resp = self._call(
            "head", key, lambda: self._client.head_object(Bucket=self.bucket, Key=full)
        )
        return ObjectInfo(
            key=key,
            size=int(resp["ContentLength"]),
            etag=_strip_etag(resp.get("ETag")),
            last_modified=resp["LastModified"].timestamp(),
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full_prefix = self.prefix + prefix
        token: str | None = None
        cut = len(self.prefix)
        while True:
            kwargs: dict[str, Any] = {
                "Bucket": self.bucket,
                "Prefix": full_prefix,
                "MaxKeys": self.list_page_size,
            }
            if token is not None:
                kwargs["ContinuationToken"] = token
            page = self._call(
                "list", prefix or "/", functools.partial(self._client.list_objects_v2, **kwargs)
            )
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    key=item["Key"][cut:],
                    size=int(item["Size"]),
                    etag=_strip_etag(item.get("ETag")),
                    last_modified=item["LastModified"].timestamp(),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    # -- deletes ---------------------------------------------------------------------------

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        failed: builtins.list[str] = []
        batch: dict[str, None] = {}  # ordered and de-duplicated: S3 wants each key once
        for key in keys:
            batch[self._full(key)] = None
            if len(batch) == DELETE_BATCH:
                failed.extend(self._delete_batch(list(batch)))
                batch = {}
        if batch:
            failed.extend(self._delete_batch(list(batch)))
        return failed

    def _delete_batch(self, full_keys: builtins.list[str]) -> builtins.list[str]:
        cut = len(self.prefix)
        request = {"Objects": [{"Key": k} for k in full_keys], "Quiet": True}
        resp = self._call(
            "delete_many",
            f"{full_keys[0][cut:]} (+{len(full_keys) - 1} more)",
            lambda: self._client.delete_objects(Bucket=self.bucket, Delete=request),
        )
        failed = []
        for err in resp.get("Errors", []):
            if err.get("Code") == "NoSuchKey":
                continue  # already gone is what we wanted
            log.warning(
                "could not delete s3://%s/%s: %s %s",
                self.bucket,
                err.get("Key"),
                err.get("Code"),
                err.get("Message", ""),
            )
            failed.append(str(err.get("Key", ""))[cut:])
        return failed

    def close(self) -> None:
        self._parts.shutdown()
        self._client.close()


class _S3Multipart:
    """One object's multipart requests against S3, each retried by the store."""

    def __init__(self, store: S3Store, key: str) -> None:
        self.store, self.key, self.full = store, key, store._full(key)

    def create(self) -> str:
        s = self.store
        created = s._call("create_multipart_upload", self.key,
                          lambda: s._client.create_multipart_upload(
                              Bucket=s.bucket, Key=self.full, **s._checksum_args()))
        return str(created["UploadId"])

    def upload_part(self, upload_id: str, number: int, body: bytes | FileRange
                    ) -> dict[str, Any]:
        return self.store._upload_part(self.key, self.full, upload_id, number, body)

    def complete(self, upload_id: str, parts: list[dict[str, Any]]) -> str:
        s = self.store
        done = s._call("complete_multipart_upload", self.key,
                       lambda: s._client.complete_multipart_upload(
                           Bucket=s.bucket, Key=self.full, UploadId=upload_id,
                           MultipartUpload={"Parts": parts}))
        etag = _strip_etag(done.get("ETag"))
        # Ceph RGW 16.2 answers CompleteMultipartUpload with an empty ETag: ask for it
        return etag or s.head(self.key).etag

    def abort(self, upload_id: str) -> None:
        s = self.store
        try:
            s._call("abort_multipart_upload", self.key,
                    lambda: s._client.abort_multipart_upload(
                        Bucket=s.bucket, Key=self.full, UploadId=upload_id))
        except StoreError as exc:
            # the bucket's lifecycle rule for incomplete uploads is the backstop
            log.warning("could not abort multipart upload of %s: %s", s._where(self.key), exc)


class _StreamedBody:
    """A streamed GET's body (`RangeStream`). `readinto` takes the bytes from the HTTP response
    under botocore's body straight into the caller's buffer: botocore's `read` goes through
    urllib3 and http.client, which allocate and zero a buffer and copy it once more on every
    read, about as much CPU again as receiving the bytes (the read cache's read-ahead receives
    whole segments this way). Only a plain body is read so (a known length, no content
    encoding, no checksum botocore is checking: that one is left to botocore); otherwise, and
    for `read`, botocore's own path. A body that ends short raises, as botocore's does."""

    def __init__(self, body: Any) -> None:
        self._body = body
        self._raw: http.client.HTTPResponse | None = None
        self._size = self._left = 0
        raw = getattr(body, "_raw_stream", None)
        response = getattr(raw, "_fp", None)
        # exactly StreamingBody: its subclass StreamingChecksumBody checks a checksum on read
        if (type(body) is botocore.response.StreamingBody and raw is not None
                and isinstance(response, http.client.HTTPResponse)
                and not response.chunked and response.length is not None
                and raw.headers.get("content-encoding", "identity") == "identity"):
            self._raw, self._size = response, response.length
            self._left = self._size

    def read(self, n: int = -1, /) -> bytes:
        data: bytes = self._body.read(None if n < 0 else n)
        return data

    def readinto(self, b: memoryview, /) -> int:
        if self._raw is None:
            data = self.read(len(b))
            b[:len(data)] = data
            return len(data)
        n = self._raw.readinto(b[:self._left]) if self._left else 0
        if not n and self._left and len(b):
            raise botocore.exceptions.IncompleteReadError(
                actual_bytes=self._size - self._left, expected_bytes=self._size)
        self._left -= n
        return n

    def close(self) -> None:
        self._body.close()


def _crc32c_b64(body: bytes | FileRange) -> str:
    """A body's CRC-32C as S3's `x-amz-checksum-crc32c` carries it (big-endian, base64)."""
    value = body.crc32c() if isinstance(body, FileRange) else crc32c.crc32c(body)
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")
