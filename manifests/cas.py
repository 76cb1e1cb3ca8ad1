"""Retrying a load-modify-compare-and-swap under contention.

Every manifest change (an upload's commit, a merge, retention, garbage collection's cutoff, a
topic manifest save) is the same loop: read the current version, apply a pure change to it,
write it back conditioned on that version. When another writer got there first the change is
simply re-applied to what it wrote. Back-to-back retries would collide again with the same
racer, so attempts are spread with tenacity's jittered exponential backoff, and the loop gives
up at a deadline rather than after a fixed count (a busy machine makes each attempt slower,
not the race less likely). docs/format.md ("Commit protocol") states the rules a change obeys.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

from manifests.errors import ManifestError
from tiered.store.base import ObjectStore
from tiered.store.errors import PreconditionFailed

T = TypeVar("T")

#: first backoff ceiling and the largest one, seconds (each wait is uniform in [0, ceiling])
FIRST_WAIT_S = 0.02
MAX_WAIT_S = 1.0


def retry_conflicts(
    attempt: Callable[[], T],
    *,
    conflict: type[Exception] | tuple[type[Exception], ...],
    deadline_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `attempt` until it returns, retrying only when it raises `conflict`, and return
    its result.

    Each `attempt` must read the state it changes afresh (never reuse what a failed attempt
    read). Raises the last `conflict` once `deadline_s` has passed since the first attempt,
    and anything else `attempt` raises at once."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(conflict),
        wait=tenacity.wait_random_exponential(multiplier=FIRST_WAIT_S, max=MAX_WAIT_S),
        stop=tenacity.stop_after_delay(deadline_s),
        sleep=sleep,
        reraise=True,
    )
    return retrying(attempt)


def put_on_version(store: ObjectStore, key: str, data: bytes, etag: str | None) -> str:
    """The one conditional write: create `key` only if it is absent (`etag` None: the read
    found nothing), else replace exactly the version `etag` names. Returns the new ETag;
    `PreconditionFailed` when another writer got there first."""
    if etag is None:
        return store.put(key, data, if_none_match=True)
    return store.put(key, data, if_match=etag)


def swap(attempt: Callable[[], T], *, key: str, what: str, deadline_s: float,
         sleep: Callable[[float], None] = time.sleep) -> T:
    """`retry_conflicts` on `PreconditionFailed` for the object at `key`: each `attempt`
    reads, applies its pure change and writes with `put_on_version`. A racer that keeps
    winning until the deadline becomes a `ManifestError` saying `what` kept changing."""
    try:
        return retry_conflicts(attempt, conflict=PreconditionFailed, deadline_s=deadline_s,
                               sleep=sleep)
    except PreconditionFailed:
        raise ManifestError(f"{key}: {what} kept changing; try again") from None


__all__ = ["FIRST_WAIT_S", "MAX_WAIT_S", "put_on_version", "retry_conflicts", "swap"]
