"""Retry policy for object-store calls, shared by every backend that talks to a network.

botocore's own retries are switched off (`max_attempts=1`) so that there is exactly one retry
loop, this one: tenacity with exponential backoff and jitter (`cloud_storage_initial_backoff_ms`
as the first delay), a bounded number of attempts, and one WARNING line per retry.

What is retried is a pure function of the error (`is_retryable`): throttling, 5xx and
connection-level faults heal by waiting; every other 4xx (403, 404, 412, ...) means the request
itself is wrong and is surfaced at once.
"""

from __future__ import annotations

import bisect
import http.client
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import botocore.exceptions
import tenacity
import urllib3.exceptions

from tiered.errors import ConfigError
from tiered.store.base import LATENCY_BUCKETS, StoreSettings
from tiered.store.errors import ObjectNotFound, PreconditionFailed, StoreError

#: outcomes that are the store's answer, not its failure: a refused condition (the probe's
#: expected 412s, a lost compare-and-swap race) and a missing key
ANSWERS = (PreconditionFailed, ObjectNotFound)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: S3 (and AWS-wide) error codes that mean "slow down and try again", whatever the HTTP status.
THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
    }
)

#: transient server-side codes. `RequestTimeout` is a 400, but it means the server gave up
#: waiting for our body on a slow link, so the same request can succeed (botocore agrees).
TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)

#: 5xx statuses that are not transient: 501 means the endpoint lacks the feature (for example
#: conditional PUT on an old S3 clone), and asking again will not grow it.
PERMANENT_5XX = frozenset({501, 505})

#: exceptions raised below botocore's error parsing: the connection broke, timed out or the
#: response body was cut short. botocore wraps most of them, but not all on every code path
#: (streaming body reads in particular).
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ConnectionError,  # EndpointConnection, ConnectTimeout, Proxy, SSL
    botocore.exceptions.HTTPClientError,  # ConnectionClosed, ReadTimeout, ResponseStreaming
    botocore.exceptions.IncompleteReadError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.TimeoutError,
    http.client.IncompleteRead,
    http.client.RemoteDisconnected,
    ConnectionError,  # the builtin: ConnectionResetError, BrokenPipeError, ...
    TimeoutError,
)


def error_code(exc: BaseException) -> tuple[str, int | None]:
    """(error code, HTTP status) of a botocore `ClientError`; ("", None) for anything else."""
    if not isinstance(exc, botocore.exceptions.ClientError):
        return "", None
    response = exc.response if isinstance(exc.response, dict) else {}
    code = str(response.get("Error", {}).get("Code", "") or "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status if isinstance(status, int) else None


#: what a person should check when no connection to the store can be made at all
UNREACHABLE_HINT = ("; cannot connect to the store: check [storage] endpoint_url (and "
                    "region) and that the server is up and reachable from here")


def is_unreachable(exc: BaseException | None) -> bool:
    """True when no connection could be made (wrong endpoint, server down), as opposed to
    one that broke or an answer that refused: the error a wrong `endpoint_url` gives."""
    return isinstance(exc, botocore.exceptions.EndpointConnectionError
                      | ConnectionRefusedError)


def is_retryable(exc: BaseException) -> bool:
    """True when repeating the same request later can succeed.

    Throttling (SlowDown, 429, 503, ...), other 5xx except 501/505, and broken or timed-out
    connections are retryable; every other 4xx (403, 404, 409, 412, ...) and every error that
    is not an I/O fault (bad arguments, missing credentials, our own `StoreError`) is not.
    """
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = error_code(exc)
        if code in THROTTLING_CODES or code in TRANSIENT_CODES:
            return True
        if status is None:
            return False
        if status == 429:
            return True
        return 500 <= status <= 599 and status not in PERMANENT_5XX
    return isinstance(exc, _CONNECTION_ERRORS)


#: the counters `RetryStats.snapshot` gives, besides the histogram
COUNTERS = ("operations", "attempts", "retries", "errors", "exhausted", "bytes_read",
            "bytes_written")


@dataclass
class RetryStats:
    """Counters of one store's calls, for metrics. Thread-safe: many archiver threads share a
    store. `attempts` counts every request sent, `retries` the ones that were repeats,
    `errors` the operations that failed for good, `exhausted` those among them that ran out of
    attempts on retryable faults; `bytes_read` / `bytes_written` the object bytes moved; every
    operation's time, retries included, goes into a histogram (`LATENCY_BUCKETS`)."""

    operations: int = 0
    attempts: int = 0
    retries: int = 0
    errors: int = 0
    exhausted: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    #: operations per latency bucket (the last one: slower than every bound)
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum_us: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    #: (time.monotonic(), message) of the latest operation when it failed; None once one
    #: finished with the store's answer (a missing key and a lost condition are answers)
    _failure: tuple[float, str] | None = field(default=None, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def outcome(self, failure: str | None) -> None:
        """The operation that just ended failed with `failure`, or (None) got an answer: what
        `/health` reads to tell a store the read path cannot reach."""
        with self._lock:
            self._failure = None if failure is None else (time.monotonic(), failure)

    def last_failure(self) -> tuple[float, str] | None:
        """(time.monotonic() when, message) of the latest operation if it failed, else None."""
        with self._lock:
            return self._failure

    def observe(self, seconds: float) -> None:
        """One operation took `seconds`."""
        bucket = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            self.latency[bucket] += 1
            self.latency_sum_us += round(seconds * 1_000_000)

    def snapshot(self) -> dict[str, int]:
        """A consistent copy for a metrics scrape: the `COUNTERS`, and the histogram as
        `latency_bucket_<i>` (operations in bucket i, not cumulative) and `latency_sum_us`."""
        with self._lock:
            out = {name: getattr(self, name) for name in COUNTERS}
            out.update({f"latency_bucket_{i}": n for i, n in enumerate(self.latency)})
            out["latency_sum_us"] = self.latency_sum_us
            return out

    def __getstate__(self) -> dict[str, int]:
        return self.snapshot()

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(**{k: v for k, v in state.items() if k in COUNTERS})  # type: ignore[misc]
        self.latency_sum_us = state.get("latency_sum_us", 0)
        for i in range(len(self.latency)):
            self.latency[i] = state.get(f"latency_bucket_{i}", 0)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry: attempts in all (first try included) and the backoff
    bounds in seconds. Built from `StoreSettings`; validated when built."""

    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"store max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ConfigError(
                "backoff must satisfy 0 <= initial <= max, got "
                f"initial={self.initial_backoff_s}s max={self.max_backoff_s}s"
            )

    @classmethod
    def from_settings(cls, settings: StoreSettings) -> RetryPolicy:
        """The policy of `settings`; a ceiling below the first delay is raised to it (a large
        `cloud_storage_initial_backoff_ms` alone must not make the settings invalid)."""
        initial_s = settings.initial_backoff_ms / 1000
        return cls(
            max_attempts=settings.max_attempts,
            initial_backoff_s=initial_s,
            max_backoff_s=max(settings.max_backoff_ms / 1000, initial_s),
        )

    def wait(self) -> tenacity.wait.wait_base:
        """initial * 2**(n-1) + uniform(0, initial), capped at max. The jitter is scaled to the
        first delay (tenacity's default is a whole second, which would swamp 100 ms)."""
        return _exponential_jitter(self.initial_backoff_s, self.max_backoff_s)


#: tenacity 9 renamed wait_exponential_jitter's `initial` to `multiplier` (deprecating the old
#: name); 8.x knows only `initial`. Same meaning either way. Looked up once: every store call
#: builds its wait, and inspecting a signature costs more than the call it wraps.
_JITTER_BASE = ("multiplier"
                if "multiplier" in inspect.signature(tenacity.wait_exponential_jitter).parameters
                else "initial")


def _exponential_jitter(initial_s: float, max_s: float) -> tenacity.wait.wait_base:
    kwargs: dict[str, float] = {_JITTER_BASE: initial_s, "max": max_s, "jitter": initial_s}
    return tenacity.wait_exponential_jitter(**kwargs)


#: turns the last raw error of an operation into the `StoreError` callers see; gets the error
#: and the number of attempts made
ErrorMapper = Callable[[BaseException, int], BaseException]


class Retrier:
    """Runs one store operation under the retry policy.

    `sleep` is injectable (tests pass a no-op); `classify` decides what is retryable (default
    `is_retryable`). The operation and key only label log lines and error messages.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        sleep: Callable[[float], None] = time.sleep,
        stats: RetryStats | None = None,
        classify: Callable[[BaseException], bool] = is_retryable,
    ) -> None:
        self.policy = policy
        self.sleep = sleep
        self.stats = stats if stats is not None else RetryStats()
        self.classify = classify

    def call(
        self,
        operation: str,
        key: str,
        fn: Callable[[], T],
        map_error: ErrorMapper,
    ) -> T:
        """Return `fn()`, retrying retryable faults; raise `map_error(last error, attempts)`."""
        stats = self.stats
        attempts = 0

        def counted() -> T:
            nonlocal attempts
            attempts += 1
            stats.add(attempts=1, retries=1 if attempts > 1 else 0)
            return fn()

        def before_sleep(state: tenacity.RetryCallState) -> None:
            outcome = state.outcome
            exc = outcome.exception() if outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            log.warning(
                "store %s %r: attempt %d/%d failed (%s), retrying in %.3fs%s",
                operation,
                key,
                state.attempt_number,
                self.policy.max_attempts,
                describe(exc) if exc is not None else "?",
                delay,
                UNREACHABLE_HINT if is_unreachable(exc) else "",
            )

        retrying = tenacity.Retrying(
            sleep=self.sleep,
            stop=tenacity.stop_after_attempt(self.policy.max_attempts),
            wait=self.policy.wait(),
            retry=tenacity.retry_if_exception(self.classify),
            before_sleep=before_sleep,
            reraise=True,
        )
        stats.add(operations=1)
        started = time.monotonic()
        try:
            result = retrying(counted)
        except StoreError as exc:
            # already a domain error (raised by `fn` itself): pass through untouched
            if not isinstance(exc, ANSWERS):
                stats.add(errors=1)
            stats.outcome(None if isinstance(exc, ANSWERS) else str(exc))
            raise
        except Exception as exc:
            retryable = self.classify(exc)
            mapped = map_error(exc, attempts)
            if not isinstance(mapped, ANSWERS):
                stats.add(errors=1, exhausted=1 if retryable else 0)
            stats.outcome(None if isinstance(mapped, ANSWERS) else str(mapped))
            if retryable:
                log.error(
                    "store %s %r: giving up after %d attempts: %s%s",
                    operation,
                    key,
                    attempts,
                    describe(exc),
                    UNREACHABLE_HINT if is_unreachable(exc) else "",
                )
            raise mapped from exc
        else:
            stats.outcome(None)
            return result
        finally:
            stats.observe(time.monotonic() - started)


def describe(exc: BaseException) -> str:
    """One line naming the error: the S3 code and status when there is one."""
    code, status = error_code(exc)
    if code or status:
        return f"{code or 'error'} (HTTP {status})"
    return f"{type(exc).__name__}: {exc}"
