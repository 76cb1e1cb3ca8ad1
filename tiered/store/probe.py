"""Start-up proof that a store honours conditional writes.

Manifest commits are compare-and-swap: `put(if_match=etag)` / `put(if_none_match=True)`. Some
S3-compatible stores accept those headers and ignore them; there a stale writer silently
overwrites a newer manifest and updates are lost. So before anything is written, one probe
object under a reserved key checks that both conditions are enforced, then is deleted.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path

from tiered.store.base import UNCONDITIONAL, Blob, ObjectInfo, ObjectStore, RangeStream
from tiered.store.errors import (
    ConditionalWritesUnsupported,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
)

log = logging.getLogger(__name__)

#: reserved key space for the probe; nothing else lives here
PROBE_PREFIX = "_tiered/probe/"
#: a probe takes milliseconds; one whose key says it started longer ago than this was left by
#: a crash (kill -9 between its put and its delete) and is collected by the next probe
PROBE_STALE_AFTER_S = 600.0

OPT_OUT_HINT = (
    "Use a store that enforces If-Match / If-None-Match (AWS S3, recent MinIO), or, only if "
    "exactly one writer ever touches this bucket, set cloud_storage_allow_unconditional_writes "
    "= true (StoreSettings.allow_unconditional_writes): that is only safe with exactly one "
    "writer."
)


def probe_key(now_s: float) -> str:
    """A fresh probe key; it starts with its creation time (ms) so stale ones are recognised
    without trusting the store's clock."""
    return f"{PROBE_PREFIX}{int(now_s * 1000):013d}-{uuid.uuid4().hex}"


def collect_stale_probes(store: ObjectStore, *, now_s: float | None = None) -> int:
    """Delete probe objects a crashed process left (design invariant 8: no permanent orphans).

    Only probes older than `PROBE_STALE_AFTER_S` by the time in their key go, so a probe another
    process is running right now is never pulled from under it. Best effort: returns how many
    were deleted and logs, never raises for a store fault."""
    now = time.time() if now_s is None else now_s
    stale = []
    try:
        for info in store.list(PROBE_PREFIX):
            started_ms, _, _ = info.key[len(PROBE_PREFIX) :].partition("-")
            started_s = int(started_ms) / 1000 if started_ms.isdigit() else info.last_modified
            if now - started_s > PROBE_STALE_AFTER_S:
                stale.append(info.key)
        failed = store.delete_many(stale) if stale else []
    except StoreError as exc:
        log.warning("could not collect stale conditional-write probes: %s", exc)
        return 0
    collected = len(stale) - len(failed)
    if collected:
        log.info("collected %d conditional-write probe(s) left by a crash", collected)
    return collected


def probe_conditional_writes(store: ObjectStore) -> bool:
    """Check that `store` refuses conditional puts whose condition is false.

    Collects probes a crash left, then writes `_tiered/probe/<ms>-<uuid>` with If-None-Match,
    then expects PreconditionFailed from a second If-None-Match put and from an If-Match put
    with a wrong ETag, and success from an If-Match put with the right one; deletes the probe
    in every case. A refusal of a put that should succeed is checked against the object's
    content first: when the connection drops after the store applied a put, the client's
    retry is refused by the very write it made, and that is no evidence against the store.

    Returns True when conditions are enforced. Otherwise raises `ConditionalWritesUnsupported`
    explaining the risk, or, with `settings.allow_unconditional_writes`, logs a WARNING and
    returns False. Access and connectivity errors propagate unchanged.
    """
    collect_stale_probes(store)
    key = probe_key(time.time())
    where = f"{store.settings.url.rstrip('/')}/{key}"
    problems: list[str] = []
    form: str | None = None
    created = False
    first, final = f"tiered probe 1 {key}".encode(), f"tiered probe 4 {key}".encode()
    try:
        try:
            etag = store.put(key, first, if_none_match=True)
        except PreconditionFailed:
            # the key is this process's own (a fresh uuid): a refusal means an earlier attempt
            # of this very request was applied and its answer lost, so the retry found it
            landed = _landed(store, key, first)
            if landed is None:
                raise
            etag = landed
        created = True
        if _accepted(lambda: store.put(key, b"tiered probe 2", if_none_match=True)):
            problems.append("a second If-None-Match: * put overwrote the existing object")
            etag = store.head(key).etag
        wrong = hashlib.md5(etag.encode() + b"-not-this-version").hexdigest()
        if _accepted(lambda: store.put(key, b"tiered probe 3", if_match=wrong)):
            problems.append("an If-Match put with a wrong ETag replaced the object")
            etag = store.head(key).etag
        form = _if_match_form(store, key, final, etag)
        if form is None:
            problems.append(
                "an If-Match put with the current ETag was refused in every form this client "
                f"can send ({', '.join(store.condition_forms)}): the store does not compare "
                "the ETag its puts return"
            )
    except ConditionalWritesUnsupported as exc:
        problems.append(f"the store rejects conditional puts outright ({exc})")
    finally:
        if created:
            _remove(store, key)

    if not problems:
        shown = "" if form in (None, "native") else f" (If-Match sent {form})"
        log.info("%s: conditional writes are enforced%s", store.settings.url, shown)
        _record(store, {"enforced": True, "if_match": form or "native"})
        return True
    message = (
        f"store {store.settings.url} does not enforce conditional writes (probe {where}): "
        + "; ".join(problems)
        + ". Manifest commits rely on compare-and-swap, so two writers could overwrite each "
        "other's manifests and silently lose updates. " + OPT_OUT_HINT
    )
    if store.settings.allow_unconditional_writes:
        # nothing may depend on a condition this server ignores or refuses: plain PUTs
        store.use_condition_form(UNCONDITIONAL)
        _record(store, {"enforced": False, "if_match": UNCONDITIONAL})
        log.warning("%s -- continuing WITHOUT conditions because allow_unconditional_writes "
                    "is set: only safe with exactly one writer", message)
        return False
    raise ConditionalWritesUnsupported(message)


#: where the probe records its verdict, for `describe-storage` to show
VERDICT_KEY = "_tiered/conditions.json"


def _record(store: ObjectStore, verdict: dict[str, object]) -> None:
    """Best effort: the verdict is for people reading `describe-storage`, never relied on."""
    verdict = {**verdict, "probed_at_ms": int(time.time() * 1000)}
    try:
        store.put(VERDICT_KEY, json.dumps(verdict, sort_keys=True).encode())
    except StoreError as exc:
        log.debug("could not record the probe's verdict: %s", exc)


def recorded_verdict(store: ObjectStore) -> dict[str, object] | None:
    """What the last probe of this bucket found (see `VERDICT_KEY`), or None."""
    try:
        value = json.loads(store.get(VERDICT_KEY))
    except (StoreError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _if_match_form(store: ObjectStore, key: str, data: bytes, etag: str) -> str | None:
    """The first of the store's If-Match spellings that a put with the current ETag passes
    (servers differ: AWS and MinIO compare the quoted entity tag, Ceph RGW 16.2 the bare
    one), now in use on `store`; None when every form is refused."""
    for form in store.condition_forms:
        store.use_condition_form(form)
        try:
            store.put(key, data, if_match=etag)
        except PreconditionFailed:
            # a lost answer is not evidence: if the object holds these bytes, a first attempt
            # was applied and its retry found the ETag changed by itself
            if _landed(store, key, data) is not None:
                return form
            continue
        return form
    store.use_condition_form(store.condition_forms[0])
    return None


def _landed(store: ObjectStore, key: str, data: bytes) -> str | None:
    """The ETag of `key` if it holds exactly `data` (a write of ours was applied), else None."""
    try:
        got = store.get(key)
    except ObjectNotFound:
        return None
    return got.etag if got == data else None


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


class ProbingStore(ObjectStore):
    """`inner` with `probe(inner)` (the conditional-write probe) running on its own thread
    instead of in front of everything else.

    Why: the probe is six requests in series (0.06-0.1 s against a local server), and a
    one-shot `archive --once` pass would spend them before its first byte goes up. Reads
    (manifests, listings) need no proof, and an upload needs it only at the moment its object
    would become visible. So reads go straight through; `put` and `delete_many` wait for the
    probe's verdict, and `put_file` waits for it in its `ready` hook, just before the object
    can appear (its multipart parts go up meanwhile). When the probe fails, each of them
    raises the probe's error and nothing has appeared in, or gone from, the store: the same
    guarantee as a probe in front, with its latency hidden behind the first uploads.
    `verdict()` raises the probe's error, for a command to report it as its own.
    """

    def __init__(self, inner: ObjectStore, probe: Callable[[ObjectStore], bool]) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self._verdict: Future[bool] = Future()

        def run() -> None:
            try:
                self._verdict.set_result(probe(inner))
            except BaseException as exc:  # handed to whoever waits for the verdict
                self._verdict.set_exception(exc)

        self._thread = threading.Thread(target=run, name="tiered-probe", daemon=True)
        self._thread.start()

    def verdict(self) -> bool:
        """Wait for the probe: True when conditions are enforced, False under the documented
        single-writer opt-out; raises the probe's error otherwise."""
        return self._verdict.result()

    @property
    def enforces_conditions(self) -> bool:
        self.verdict()
        return self.inner.enforces_conditions

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        self.verdict()
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: Path | str, *,
                 ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        def proven_then_ready() -> None:
            self.verdict()
            if ready is not None:
                ready()

        return self.inner.put_file(key, path, ready=proven_then_ready, byte_range=byte_range)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        return self.inner.get(key, byte_range)

    def read_range(self, key: str, begin: int, end: int) -> bytes:
        return self.inner.read_range(key, begin, end)

    def open_range(self, key: str, begin: int, end: int, *, to_end: bool = False
                   ) -> RangeStream:
        return self.inner.open_range(key, begin, end, to_end=to_end)

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        self.verdict()
        return self.inner.delete_many(keys)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def close(self) -> None:
        """Let the probe finish (it deletes its own object), then close the backend."""
        self._thread.join()
        self.inner.close()
