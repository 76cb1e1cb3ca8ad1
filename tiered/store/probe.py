"""Start-up proof that a store honours conditional writes.

Manifest commits are compare-and-swap: `put(if_match=etag)` / `put(if_none_match=True)`. Some
S3-compatible stores accept those headers and ignore them; there a stale writer silently
overwrites a newer manifest and updates are lost. So before anything is written, one probe
object under a reserved key checks that both conditions are enforced, then is deleted.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable

from tiered.store.base import ObjectStore
from tiered.store.errors import ConditionalWritesUnsupported, PreconditionFailed, StoreError

log = logging.getLogger(__name__)

#: reserved key space for the probe; nothing else lives here
PROBE_PREFIX = "_tiered/probe/"

OPT_OUT_HINT = (
    "Use a store that enforces If-Match / If-None-Match (AWS S3, recent MinIO), or, only if "
    "exactly one writer ever touches this bucket, set cloud_storage_allow_unconditional_writes "
    "= true (StoreSettings.allow_unconditional_writes): that is only safe with exactly one "
    "writer."
)


def probe_conditional_writes(store: ObjectStore) -> bool:
    """Check that `store` refuses conditional puts whose condition is false.

    Writes `_tiered/probe/<uuid>` with If-None-Match, then expects PreconditionFailed from a
    second If-None-Match put and from an If-Match put with a wrong ETag, and success from an
    If-Match put with the right one; deletes the probe in every case.

    Returns True when conditions are enforced. Otherwise raises `ConditionalWritesUnsupported`
    explaining the risk, or, with `settings.allow_unconditional_writes`, logs a WARNING and
    returns False. Access and connectivity errors propagate unchanged.
    """
    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    where = f"{store.settings.url.rstrip('/')}/{key}"
    problems: list[str] = []
    created = False
    try:
        etag = store.put(key, b"tiered conditional-write probe 1", if_none_match=True)
        created = True
        if _accepted(lambda: store.put(key, b"tiered probe 2", if_none_match=True)):
            problems.append("a second If-None-Match: * put overwrote the existing object")
            etag = store.head(key).etag
        wrong = hashlib.md5(etag.encode() + b"-not-this-version").hexdigest()
        if _accepted(lambda: store.put(key, b"tiered probe 3", if_match=wrong)):
            problems.append("an If-Match put with a wrong ETag replaced the object")
            etag = store.head(key).etag
        try:
            store.put(key, b"tiered probe 4", if_match=etag)
        except PreconditionFailed:
            problems.append(
                "an If-Match put with the current ETag was refused (the ETag returned by a "
                "put is not the one the store compares against)"
            )
    except ConditionalWritesUnsupported as exc:
        problems.append(f"the store rejects conditional puts outright ({exc})")
    finally:
        if created:
            _remove(store, key)

    if not problems:
        log.info("%s: conditional writes are enforced", store.settings.url)
        return True
    message = (
        f"store {store.settings.url} does not enforce conditional writes (probe {where}): "
        + "; ".join(problems)
        + ". Manifest commits rely on compare-and-swap, so two writers could overwrite each "
        "other's manifests and silently lose updates. " + OPT_OUT_HINT
    )
    if store.settings.allow_unconditional_writes:
        log.warning("%s -- continuing because allow_unconditional_writes is set", message)
        return False
    raise ConditionalWritesUnsupported(message)


def _accepted(attempt: Callable[[], object]) -> bool:
    """True if the conditional put `attempt()` went through, False if it was refused."""
    try:
        attempt()
    except PreconditionFailed:
        return False
    return True


def _remove(store: ObjectStore, key: str) -> None:
    try:
        failed = store.delete_many([key])
    except StoreError as exc:
        log.warning("could not delete conditional-write probe %s: %s", key, exc)
        return
    if failed:
        log.warning("could not delete conditional-write probe %s", key)
