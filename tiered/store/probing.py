"""A store whose conditional-write probe runs beside its first requests (see `ProbingStore`)."""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path

from tiered.store.base import Blob, ObjectInfo, ObjectStore


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

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        self.verdict()
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: Path | str, *,
                 ready: Callable[[], None] | None = None) -> str:
        def proven_then_ready() -> None:
            self.verdict()
            if ready is not None:
                ready()

        return self.inner.put_file(key, path, ready=proven_then_ready)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        return self.inner.get(key, byte_range)

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
