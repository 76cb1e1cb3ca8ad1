"""The daemon's state as the HTTP threads see it, and what `/health` answers from it.

The main thread publishes an immutable `DaemonState` after every job; `health_of` is a pure
function of it (and of the read cache's last write problem), so the answer is tested without
a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from archiver.service import ArchiverStats

__all__ = ["DaemonState", "Health", "JobCounters", "health_of"]


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


def health_of(state: DaemonState, now_s: float, *, cache_problem: str | None = None) -> Health:
    """`/health`: 503 while the object store is unreachable; otherwise 200 with `status`
    "starting" (no upload round finished yet, unless the daemon only serves reads),
    "degraded" (the latest run of some job reported a problem, such as a corrupt segment, or
    the read cache cannot write its chunks, while the rest goes on) or "ok"."""
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
    if state.store_up is False:
        return Health(503, {"status": "unavailable",
                            "reason": f"object store unreachable: {state.store_error}", **body})
    if state.archiving and "upload" not in state.jobs:
        return Health(200, {"status": "starting", **body})
    if any(state.last_errors.values()) or cache_problem is not None:
        return Health(200, {"status": "degraded", **body})
    return Health(200, {"status": "ok", **body})
