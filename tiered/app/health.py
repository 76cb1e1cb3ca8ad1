"""The daemon's state as the HTTP threads see it, and what `/health` answers from it.

The main thread publishes an immutable `DaemonState` after every job; `health_of` is a pure
function of it (and of what the read path's checks found: the read cache's disk, the read
path's latest store request), so the answer is tested without a server. The checks' I/O is
in `tiered.app.health_checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from archiver.service import ArchiverStats

__all__ = ["DaemonState", "Health", "JobCounters", "cache_disk_problem", "health_of",
           "read_store_problem"]


@dataclass(frozen=True)
class JobCounters:
    """How one scheduled job has fared: runs, runs that reported a problem, and the wall-clock
    time (seconds since the epoch) of the last run without one (None: never)."""

    runs: int = 0
    failures: int = 0
    last_success_s: float | None = None


@dataclass(frozen=True)
class Health:
    """What `/health` answers: an HTTP status and a JSON body."""

    status: int
    body: Mapping[str, Any]


@dataclass(frozen=True)
class DaemonState:
    """What the HTTP thread may see, replaced as a whole after every job (never mutated).

    `store_up` is None until the store was first reached or failed; `last_errors` holds the
    problems of each job's latest run (absent: it ran clean)."""

    phase: str = "starting"  # starting | running | stopping
    started_s: float = 0.0
    store_up: bool | None = None
    store_error: str | None = None
    jobs: Mapping[str, JobCounters] = field(default_factory=dict)
    last_errors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    stats: ArchiverStats | None = None
    partitions: int = 0
    #: False for a history server (`[log] dirs = []`): it serves reads and uploads nothing
    archiving: bool = True


def health_of(state: DaemonState, now_s: float, *, cache_problem: str | None = None,
              read_store_problem: str | None = None) -> Health:
    """`/health`: 503 while the object store is unreachable; otherwise 200 with `status`
    "starting" (no upload round finished yet, unless the daemon only serves reads),
    "degraded" (the latest run of some job reported a problem, such as a corrupt segment; the
    read cache's disk is full or cannot be written; the read path's latest store request
    failed: while the rest goes on) or "ok". A degraded answer's `reason` names every
    problem (docs/archiver.md, "/health")."""
    body: dict[str, object] = {
        "uptime_s": round(max(0.0, now_s - state.started_s), 3),
        "phase": state.phase,
        "store_up": state.store_up,
        "partitions": state.partitions,
        "jobs": {
            name: {
                "runs": c.runs,
                "failures": c.failures,
                "last_success": c.last_success_s,
                "errors": list(state.last_errors.get(name, ())),
            }
            for name, c in sorted(state.jobs.items())
        },
    }
    if cache_problem is not None:
        body["cache_error"] = cache_problem
    if read_store_problem is not None:
        body["read_store_error"] = read_store_problem
    if state.store_up is False:
        return Health(503, {"status": "unavailable",
                            "reason": f"object store unreachable: {state.store_error}", **body})
    if state.archiving and "upload" not in state.jobs:
        return Health(200, {"status": "starting", **body})
    reasons = [f"{name}: {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1
                                         else "")
               for name, errors in sorted(state.last_errors.items()) if errors]
    if cache_problem is not None:
        reasons.append(f"read cache: {cache_problem}")
    if read_store_problem is not None:
        reasons.append(f"read path: {read_store_problem}")
    if reasons:
        return Health(200, {"status": "degraded", "reason": "; ".join(reasons), **body})
    return Health(200, {"status": "ok", **body})


def cache_disk_problem(directory: str, *, free_bytes: int | None, needed_bytes: int,
                       write_error: str | None) -> str | None:
    """What keeps the read cache's disk from taking chunks, or None: a probe write that
    failed (`write_error`: not a directory, read-only, no space), or fewer than
    `needed_bytes` (one chunk) free (`free_bytes`; None: unknown)."""
    if write_error is not None:
        return f"the cache directory cannot be written: {write_error}"
    if free_bytes is not None and free_bytes < needed_bytes:
        return (f"the cache disk is full: {free_bytes} bytes free in {directory}, a chunk "
                f"needs {needed_bytes}")
    return None


def read_store_problem(failure: tuple[float, str] | None, now_s: float, window_s: float
                       ) -> str | None:
    """The read path's store problem, or None: its latest store request failed (`failure`:
    when, on the clock of `now_s`, and why) less than `window_s` ago. A later request that
    got an answer clears it; an old failure with nothing since is no longer news."""
    if failure is None:
        return None
    at, message = failure
    age = now_s - at
    if age >= window_s:
        return None
    return f"the object store did not answer a read {max(0.0, age):.0f} s ago: {message}"
