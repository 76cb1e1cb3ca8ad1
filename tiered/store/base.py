"""The object-store interface every backend implements.

Small on purpose (put, get, head, list, delete-many, conditional put): the archiver, the read
cache, manifests and Spark executors all talk to the bucket through it, and the contract test
suite runs against every backend registered in `tiered.store`.

Keys are '/'-separated strings relative to the store's root (the `s3://bucket/prefix` or
`file:///path` of the configuration); backends add the prefix themselves.
"""

from __future__ import annotations

import abc
import builtins
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Self


@dataclass(frozen=True)
class ObjectInfo:
    """What `head` and `list` tell about one object."""

    key: str
    size: int
    #: opaque version token: the S3 ETag (quotes stripped), or the file backend's equivalent.
    #: Pass it back as `if_match` to replace exactly this version.
    etag: str
    #: seconds since the epoch
    last_modified: float


class Blob(bytes):
    """An object's bytes with the version token they belong to.

    `get` returns one: S3 sends the ETag with the body, so a compare-and-swap can read bytes
    and version in one request instead of a HEAD/GET pair that can tear under a concurrent
    write. It is `bytes` in every other respect."""

    etag: str

    def __new__(cls, data: bytes, etag: str) -> Blob:
        blob = super().__new__(cls, data)
        blob.etag = etag
        return blob

    def __reduce__(self) -> tuple[type[Blob], tuple[bytes, str]]:
        return (Blob, (bytes(self), self.etag))


@dataclass(frozen=True)
class StoreSettings:
    """Everything needed to open a store, and nothing that cannot be pickled: Spark executors
    receive this and build their own client (`tiered.store.open_store`)."""

    #: `s3://bucket[/prefix]` or `file:///absolute/path`
    url: str
    endpoint_url: str | None = None
    region: str | None = None
    #: explicit credentials; None means the standard AWS chain (env, profile, instance metadata)
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    #: `cloud_storage_max_connections`: HTTP connection pool size
    max_connections: int = 20
    #: `cloud_storage_initial_backoff_ms`: first retry delay; grows exponentially with jitter
    initial_backoff_ms: int = 100
    #: attempts in all (first try included) for retryable faults
    max_attempts: int = 6
    #: ceiling of one backoff sleep, milliseconds
    max_backoff_ms: int = 10_000
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    #: objects at or above this size are uploaded by multipart upload
    multipart_threshold: int = 64 * 1024 * 1024
    multipart_chunksize: int = 16 * 1024 * 1024
    #: parts on the wire at once for a multipart upload that has the store to itself; with
    #: more uploads side by side, one per upload (`PartScheduler`: one first-in-first-out
    #: queue for the store, `max(multipart_concurrency, uploads)` parts in flight). A file's
    #: parts are streamed from the file (`put_file`); only `put` of a large bytes object
    #: copies one part per request
    multipart_concurrency: int = 4
    #: documented single-writer opt-out: skip the conditional-write probe on stores that ignore
    #: If-Match / If-None-Match. Only safe when exactly one writer ever touches the bucket.
    allow_unconditional_writes: bool = False


#: upper bounds (seconds) of the store-request latency histogram's buckets; +Inf follows
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: the condition "form" of a store that sends no conditions: see `ObjectStore.use_condition_form`
UNCONDITIONAL = "none"


def file_window(path: Path | str, size: int, byte_range: tuple[int, int] | None,
                where: str) -> tuple[int, int]:
    """`(begin, end)` of the bytes of a file of `size` bytes that `put_file` uploads: all of
    it, or `byte_range` when that lies within it (`StoreError` otherwise)."""
    if byte_range is None:
        return 0, size
    begin, end = byte_range
    if not 0 <= begin <= end <= size:
        from tiered.store.errors import StoreError

        raise StoreError(f"put_file {where}: bytes {begin}..{end} are not within {path} "
                         f"({size} bytes)")
    return begin, end


class RangeStream(Protocol):
    """What `ObjectStore.open_range` returns: `read(n)` gives up to `n` bytes (b"" at the
    end), `readinto(b)` puts up to `len(b)` bytes into `b` and says how many (0 at the end),
    `close()` lets the connection go. A reader uses one of the two, not both."""

    def read(self, n: int = -1, /) -> bytes: ...

    def readinto(self, b: memoryview, /) -> int: ...

    def close(self) -> None: ...


class CountedStream:
    """A `RangeStream` that reports the size of every read to `on_bytes` (byte counters)."""

    def __init__(self, body: RangeStream, on_bytes: Callable[[int], None]) -> None:
        self._body = body
        self._on_bytes = on_bytes

    def read(self, n: int = -1, /) -> bytes:
        data = self._body.read(n)
        self._on_bytes(len(data))
        return data

    def readinto(self, b: memoryview, /) -> int:
        n = self._body.readinto(b)
        self._on_bytes(n)
        return n

    def close(self) -> None:
        self._body.close()


class ObjectStore(abc.ABC):
    """A bucket (or directory) of immutable-ish objects addressed by key."""

    #: registry name, the URL scheme this backend serves (`s3`, `file`)
    scheme: str = ""

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings

    @staticmethod
    def check_conditions(if_none_match: bool, if_match: str | None) -> None:
        """The argument rule every backend's `put` applies first: one condition at most."""
        if if_none_match and if_match is not None:
            raise ValueError("put: if_none_match and if_match are mutually exclusive")

    @abc.abstractmethod
    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """Write `data` at `key` and return the new version token (ETag).

        `if_none_match=True` creates only if absent; `if_match=etag` replaces only that version.
        Either raises `PreconditionFailed` when the condition does not hold. Objects at or above
        `multipart_threshold` go up by multipart upload (unconditional puts only).
        """

    @abc.abstractmethod
    def put_file(
        self, key: str, path: Path | str, *, ready: Callable[[], None] | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> str:
        """Upload a local file (multipart above the threshold, streamed, never read whole into
        memory) and return its ETag. `byte_range` `(begin, end)` uploads only those bytes of
        it (the rest of a segment another writer's upload ended inside); `StoreError` when the
        file does not hold them.

        `ready`, when given, is called once before the object becomes visible at `key`: while
        or after the bytes go up where the store can hold them back (S3 calls it as soon as
        the multipart parts are on their way; the file store once its temporary file is
        written), before sending them where it cannot (a single PUT). The object appears only
        once `ready` returned and every byte is up. If it raises, no object appears, parts not
        yet sent are not sent, and its error propagates. The archiver uses it to send a
        segment while the segment is still being verified and its indexes put beside it."""

    @abc.abstractmethod
    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        """Read an object, or the bytes `[begin_inclusive, end_exclusive)` of it, with the
        ETag of the version read (`Blob.etag`, the whole object's even for a range).

        Raises `ObjectNotFound`. A range past the end returns what exists (possibly b"")."""

    def read_range(self, key: str, begin: int, end: int) -> bytes:
        """Bytes `[begin, end)` of `key`, without the version (`get` without the `Blob`: a
        backend may then hand over what it read without copying it). Errors as `get`."""
        return self.get(key, (begin, end))

    def open_range(self, key: str, begin: int, end: int, *, to_end: bool = False
                   ) -> RangeStream:
        """Bytes `[begin, end)` of `key` as a stream read as it arrives: one request for a long
        sequential read (the read cache's read-ahead fills chunk after chunk from it) where
        `get` would need one per chunk. The caller closes it. `to_end` says `end` is the
        object's size (a backend may then ask for the object without a range). The default
        reads the range at once; backends that can stream override it. Raises
        `ObjectNotFound`; errors while reading the stream are the transport's own (the caller
        falls back to `get`)."""
        return io.BytesIO(self.get(key, (begin, end)))

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size, ETag and mtime of `key`; raises `ObjectNotFound`."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, in key order, paginating as needed."""

    @abc.abstractmethod
    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        """Delete keys (batches of at most 1000 per request); missing keys are not errors.

        Returns the keys that could not be deleted (empty on full success)."""

    #: the ways this backend can spell an If-Match condition, preferred first (see
    #: `use_condition_form`); servers differ in which one they compare
    condition_forms: tuple[str, ...] = ("native",)

    def use_condition_form(self, form: str) -> None:  # noqa: B027 - one form by default
        """Spell If-Match conditions as `form` (one of `condition_forms`) from now on, or
        send none at all (`UNCONDITIONAL`: the single-writer opt-out on a server that does not
        enforce them). The start-up probe picks the form the server enforces."""
        if form not in (*self.condition_forms, UNCONDITIONAL):
            raise ValueError(f"unknown condition form {form!r}; known: {self.condition_forms}")

    @property
    def enforces_conditions(self) -> bool:
        """Whether conditional puts are sent and enforced: False only under the single-writer
        opt-out (`UNCONDITIONAL`), where nothing built on compare-and-swap (upload leases
        among them) can be trusted."""
        return True

    def exists(self, key: str) -> bool:
        from tiered.store.errors import ObjectNotFound

        try:
            self.head(key)
        except ObjectNotFound:
            return False
        return True

    def create_bucket(self) -> bool:
        """Create the bucket this store writes to when it is missing: True when it was
        created, False when it was already there (ours). For `tiered bucket create`, the
        step a user without the dev stack's compose file needs before the first upload."""
        raise NotImplementedError(f"{type(self).__name__} cannot create its bucket")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the store must not be used afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
