"""The upload backlog controller: a PD controller that raises the write path's priority when
data waiting for upload piles up on local disk (Redpanda's "Upload backlog controller").

Same shape as Redpanda's backlog controller, written as a pure function over explicit state:

* process variable: the backlog in per-mille of the disk space it competes for,
  ``1000 * backlog / (backlog + free)`` (see `backlog_ratio` for why this normalisation);
* setpoint 0: the goal is to upload everything, so ``error = 0 - backlog`` is never positive;
* output ``p_coeff * (error + d_coeff * derivative)``, truncated to an integer and clamped to
  [min_shares, max_shares]. With the negative default ``p_coeff = -2`` the shares grow with
  the backlog: 100 (the minimum) up to 5 % of the space, 1000 (the maximum) from 50 %;
* no integral term: the backlog is never negative, so an integral would wind up and never come
  back down once everything is uploaded (Redpanda drops it for the same reason).

`update` recomputes at most once per `update_interval_ms`; in between it returns the last
output unchanged. `upload_budget` turns shares into a bandwidth and a concurrency for the
uploader. The caller owns the state and the clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archiver.upload_policy import PolicyInputError
from tiered.errors import ConfigError

#: the backlog is measured in thousandths of the contested space (Redpanda's normalisation)
PER_MILLE = 1000.0
#: the controller drives the backlog towards zero
SETPOINT = 0.0


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _integer(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: expected an integer of at least {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ControllerParams:
    """The `cloud_storage_upload_ctrl_*` properties, validated when built."""

    p_coeff: float = -2.0
    d_coeff: float = 0.0
    min_shares: int = 100
    max_shares: int = 1000
    update_interval_ms: int = 60_000

    def __post_init__(self) -> None:
        p = _number("cloud_storage_upload_ctrl_p_coeff", self.p_coeff)
        _number("cloud_storage_upload_ctrl_d_coeff", self.d_coeff)
        low = _integer("cloud_storage_upload_ctrl_min_shares", self.min_shares, 1)
        high = _integer("cloud_storage_upload_ctrl_max_shares", self.max_shares, 1)
        _integer("cloud_storage_upload_ctrl_update_interval_ms", self.update_interval_ms, 1)
        if p > 0:
            raise ConfigError(
                f"cloud_storage_upload_ctrl_p_coeff: {p} is positive; the error is "
                "setpoint - backlog (never positive), so a positive coefficient would pin the "
                "shares at the minimum however large the backlog. Use a negative value."
            )
        if high < low:
            raise ConfigError(
                f"cloud_storage_upload_ctrl_max_shares ({high}) is below "
                f"cloud_storage_upload_ctrl_min_shares ({low})"
            )

    @classmethod
    def from_cluster(cls, values: Mapping[str, Any]) -> ControllerParams:
        """Build from parsed cluster properties; missing keys take Redpanda's defaults."""
        d = cls()
        return cls(
            p_coeff=values.get("cloud_storage_upload_ctrl_p_coeff", d.p_coeff),
            d_coeff=values.get("cloud_storage_upload_ctrl_d_coeff", d.d_coeff),
            min_shares=values.get("cloud_storage_upload_ctrl_min_shares", d.min_shares),
            max_shares=values.get("cloud_storage_upload_ctrl_max_shares", d.max_shares),
            update_interval_ms=values.get(
                "cloud_storage_upload_ctrl_update_interval_ms", d.update_interval_ms
            ),
        )


@dataclass(frozen=True, slots=True)
class ControllerState:
    """Everything the controller remembers between updates. `last_update_ms` None: never
    updated, the next `update` computes at once."""

    shares: int
    prev_error: float | None = None
    backlog_ratio: float = 0.0
    last_update_ms: int | None = None

    @classmethod
    def initial(cls, params: ControllerParams) -> ControllerState:
        """Start at the minimum: no backlog is known yet."""
        return cls(shares=params.min_shares)


@dataclass(frozen=True, slots=True)
class ControllerOutput:
    """One controller reading, for the uploader and for metrics.

    `error` is setpoint minus backlog in per-mille (<= 0); `backlog_ratio` is in [0, 1];
    `updated` is False when the update interval had not elapsed and these are the last
    computed values."""

    error: float
    shares: int
    backlog_ratio: float
    updated: bool


def backlog_ratio(backlog_bytes: int, free_bytes: int) -> float:
    """The backlog as a fraction of the space it competes for: ``backlog / (backlog + free)``.

    Local data waiting for upload cannot be deleted, so it already occupies disk; had it been
    uploaded (and trimmed), the log would have `backlog + free` bytes to grow into. The ratio
    is how much of that room the backlog holds. Unlike ``backlog / free`` it stays defined and
    bounded when the disk fills (free = 0 gives 1, the strongest push), needs no arbitrary
    cap, and grows with the backlog and as free space shrinks. For a small backlog it is close to
    Redpanda's ``backlog / available``. No backlog gives 0 even on a full disk."""
    if backlog_bytes < 0 or free_bytes < 0:
        raise PolicyInputError(
            f"backlog ({backlog_bytes}) and free space ({free_bytes}) must not be negative"
        )
    if backlog_bytes == 0:
        return 0.0
    return backlog_bytes / (backlog_bytes + free_bytes)


def update(
    params: ControllerParams,
    state: ControllerState,
    backlog_bytes: int,
    free_bytes: int,
    now_ms: int,
) -> tuple[ControllerOutput, ControllerState]:
    """One control step at `now_ms` (a monotonic clock, in ms).

    Before `update_interval_ms` has passed since the last computation the previous output is
    returned unchanged (`updated=False`). The derivative is the change of the error per
    update interval, so an update that comes late (the daemon was busy) does not exaggerate
    it; the first update has no previous error and no derivative. A clock that went backwards
    counts as elapsed: holding the shares until it catches up again would be worse."""
    if state.last_update_ms is not None:
        elapsed = now_ms - state.last_update_ms
        if 0 <= elapsed < params.update_interval_ms:
            last_error = SETPOINT - state.backlog_ratio * PER_MILLE
            if state.prev_error is not None:
                last_error = state.prev_error
            return ControllerOutput(last_error, state.shares, state.backlog_ratio, False), state
        interval_fraction = params.update_interval_ms / elapsed if elapsed > 0 else 1.0
    else:
        interval_fraction = 1.0

    ratio = backlog_ratio(backlog_bytes, free_bytes)
    error = SETPOINT - ratio * PER_MILLE
    prev = error if state.prev_error is None else state.prev_error
    derivative = (error - prev) * interval_fraction
    raw = params.p_coeff * (error + params.d_coeff * derivative)
    shares = min(max(math.trunc(raw), params.min_shares), params.max_shares)
    new_state = ControllerState(
        shares=shares, prev_error=error, backlog_ratio=ratio, last_update_ms=now_ms
    )
    return ControllerOutput(error, shares, ratio, True), new_state


@dataclass(frozen=True, slots=True)
class UploadBudget:
    """What the uploader may use: bytes per second (None: unthrottled) and uploads at once."""

    bandwidth_bytes_per_s: int | None
    concurrency: int


def upload_budget(
    shares: int,
    params: ControllerParams,
    *,
    max_bandwidth_bytes_per_s: int | None,
    max_concurrency: int,
) -> UploadBudget:
    """Shares as a budget: the fraction ``shares / max_shares`` of the maximum bandwidth and of
    the maximum concurrency (rounded up, at least one upload).

    Shares are proportional weights, as in Seastar's scheduling groups: the write path at 100
    shares gets a tenth of what it gets at 1000. The mapping is therefore linear in the
    shares between min and max, and at `min_shares` the uploader still moves at
    ``min/max`` of its full speed, so uploads never stall while the backlog is small."""
    if max_concurrency < 1:
        raise PolicyInputError(f"max concurrency must be at least 1, got {max_concurrency}")
    if max_bandwidth_bytes_per_s is not None and max_bandwidth_bytes_per_s < 1:
        raise PolicyInputError(
            f"max bandwidth must be at least 1 byte/s or None, got {max_bandwidth_bytes_per_s}"
        )
    clamped = min(max(shares, params.min_shares), params.max_shares)
    # integer arithmetic: 20 * (100 / 1000) is 2.0000000000000004 in floats, and ceil of it 3
    concurrency = max(1, -(-max_concurrency * clamped // params.max_shares))
    bandwidth = None
    if max_bandwidth_bytes_per_s is not None:
        bandwidth = max(1, max_bandwidth_bytes_per_s * clamped // params.max_shares)
    return UploadBudget(bandwidth, concurrency)
