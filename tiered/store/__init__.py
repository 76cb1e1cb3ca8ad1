"""Object stores: the backends, chosen by the scheme of the configured URL.

`open_store(settings)` is the one way in: it parses `settings.url` (`tiered.store.url`), builds
the backend that `STORES` registers for its scheme and, once at start-up, proves the store
honours conditional writes (manifest compare-and-swap depends on them). Backends are imported
on first use, so a `file://` user never loads boto3.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, Literal

from tiered.store.base import Blob, ObjectInfo, ObjectStore, StoreSettings
from tiered.store.errors import (
    AccessDenied,
    BucketNotFound,
    ConditionalWritesUnsupported,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
)
from tiered.store.probe import PROBE_PREFIX, ProbingStore, probe_conditional_writes
from tiered.store.url import SCHEMES, bucket_name_problem, parse_store_url

if TYPE_CHECKING:
    from tiered.store.file import FileStore
    from tiered.store.retry import RetryPolicy, RetryStats, is_retryable
    from tiered.store.s3 import S3Store

__all__ = [
    "STORES",
    "PROBE_PREFIX",
    "AccessDenied",
    "BucketNotFound",
    "Blob",
    "ConditionalWritesUnsupported",
    "FileStore",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "ProbingStore",
    "RetryPolicy",
    "RetryStats",
    "S3Store",
    "StoreError",
    "StoreSettings",
    "bucket_name_problem",
    "check_reachable",
    "is_retryable",
    "open_store",
    "parse_store_url",
    "probe_conditional_writes",
]

#: backend per URL scheme, as "module:class", imported the first time it is asked for
_BACKENDS: dict[str, str] = {
    "file": "tiered.store.file:FileStore",
    "s3": "tiered.store.s3:S3Store",
}
assert tuple(sorted(_BACKENDS)) == SCHEMES
#: names this package exports from modules it does not import up front
_LAZY: dict[str, str] = {
    "FileStore": "tiered.store.file",
    "S3Store": "tiered.store.s3",
    "RetryPolicy": "tiered.store.retry",
    "RetryStats": "tiered.store.retry",
    "is_retryable": "tiered.store.retry",
}


class _Registry(MutableMapping[str, "type[ObjectStore]"]):
    """The backend registry: scheme -> backend class, each imported on first lookup. A class
    set for a known scheme replaces it (tests plug in stores that misbehave on purpose)."""

    def __init__(self) -> None:
        self._set: dict[str, type[ObjectStore]] = {}

    def __getitem__(self, scheme: str) -> type[ObjectStore]:
        if scheme in self._set:
            return self._set[scheme]
        module, _, name = _BACKENDS[scheme].partition(":")
        cls: type[ObjectStore] = getattr(importlib.import_module(module), name)
        return cls

    def __setitem__(self, scheme: str, cls: type[ObjectStore]) -> None:
        if scheme not in _BACKENDS:
            raise KeyError(f"no URL scheme {scheme!r}; known: {', '.join(SCHEMES)}")
        self._set[scheme] = cls

    def __delitem__(self, scheme: str) -> None:
        del self._set[scheme]

    def __iter__(self) -> Iterator[str]:
        return iter(_BACKENDS)

    def __len__(self) -> int:
        return len(_BACKENDS)


#: backend class per URL scheme; the configured URL picks one by name
STORES: MutableMapping[str, type[ObjectStore]] = _Registry()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def check_reachable(store: ObjectStore) -> None:
    """One small request that tells a store-wide problem (no such bucket, refused credentials,
    nothing listening) apart from a per-partition one, so it is reported once, up front,
    instead of once per partition. Raises the `StoreError` that says which. A refusal to
    list is an answer (read-only credentials may lack it; the reads say what they lack)."""
    with contextlib.suppress(AccessDenied):
        next(iter(store.list(PROBE_PREFIX)), None)


def open_store(settings: StoreSettings, *, probe: bool | Literal["beside"] = True) -> ObjectStore:
    """Build the backend for `settings.url`; with `probe`, first prove conditional writes work
    (see `probe_conditional_writes`; raises `ConditionalWritesUnsupported` unless the
    single-writer opt-out is set). `probe="beside"` runs the probe on its own thread instead
    and holds every write and delete until it passed (`ProbingStore`): a one-shot pass starts
    uploading at once. Spark executors pass `probe=False`: the driver probed."""
    scheme, _, _ = parse_store_url(settings.url)
    store = STORES[scheme](settings)
    if probe == "beside":
        return ProbingStore(store, probe_conditional_writes)
    if probe:
        try:
            probe_conditional_writes(store)
        except BaseException:
            store.close()
            raise
    return store
