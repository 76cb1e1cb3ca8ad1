"""The upload backlog PD controller and its shares -> budget mapping (archiver/controller.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archiver.controller import (
    ControllerParams,
    ControllerState,
    UploadBudget,
    backlog_ratio,
    update,
    upload_budget,
)
from archiver.upload_policy import PolicyInputError
from tiered.errors import ConfigError

GB = 10**9
INTERVAL = 60_000


def step(
    params: ControllerParams, state: ControllerState, backlog: int, free: int, now: int
) -> tuple[int, ControllerState]:
    out, new_state = update(params, state, backlog, free, now)
    return out.shares, new_state


# --- parameters ------------------------------------------------------------------------------


def test_defaults_are_the_seed_defaults() -> None:
    params = ControllerParams()
    assert (params.p_coeff, params.d_coeff) == (-2.0, 0.0)
    assert (params.min_shares, params.max_shares) == (100, 1000)
    assert params.update_interval_ms == 60_000


def test_from_cluster_reads_the_seed_names_and_defaults_the_rest() -> None:
    params = ControllerParams.from_cluster(
        {
            "cloud_storage_upload_ctrl_p_coeff": -4.0,
            "cloud_storage_upload_ctrl_max_shares": 500,
            "unrelated_key": "ignored",
        }
    )
    assert params == ControllerParams(p_coeff=-4.0, max_shares=500)


@pytest.mark.parametrize(
    ("props", "key"),
    [
        ({"cloud_storage_upload_ctrl_p_coeff": 2.0}, "cloud_storage_upload_ctrl_p_coeff"),
        ({"cloud_storage_upload_ctrl_p_coeff": "x"}, "cloud_storage_upload_ctrl_p_coeff"),
        ({"cloud_storage_upload_ctrl_d_coeff": float("nan")}, "cloud_storage_upload_ctrl_d_coeff"),
        ({"cloud_storage_upload_ctrl_min_shares": 0}, "cloud_storage_upload_ctrl_min_shares"),
        ({"cloud_storage_upload_ctrl_max_shares": 50}, "cloud_storage_upload_ctrl_max_shares"),
        ({"cloud_storage_upload_ctrl_max_shares": True}, "cloud_storage_upload_ctrl_max_shares"),
        (
            {"cloud_storage_upload_ctrl_update_interval_ms": 0},
            "cloud_storage_upload_ctrl_update_interval_ms",
        ),
    ],
)
def test_bad_parameters_are_config_errors_naming_the_key(props: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ControllerParams.from_cluster(props)


# --- backlog normalisation -------------------------------------------------------------------


def test_backlog_ratio_is_backlog_over_backlog_plus_free() -> None:
    assert backlog_ratio(0, 100) == 0.0
    assert backlog_ratio(25, 75) == 0.25
    assert backlog_ratio(10, 0) == 1.0  # full disk: strongest push, no division by zero
    assert backlog_ratio(0, 0) == 0.0  # nothing to upload, whatever the disk


def test_negative_inputs_are_refused() -> None:
    with pytest.raises(PolicyInputError):
        backlog_ratio(-1, 10)
    with pytest.raises(PolicyInputError):
        update(ControllerParams(), ControllerState.initial(ControllerParams()), 1, -1, 0)


@given(
    st.integers(0, 10**15), st.integers(0, 10**15), st.integers(0, 10**12), st.integers(0, 10**12)
)
def test_backlog_ratio_is_bounded_and_monotone(b: int, f: int, db: int, df: int) -> None:
    r = backlog_ratio(b, f)
    assert 0.0 <= r <= 1.0
    assert backlog_ratio(b + db, f) >= r  # more backlog, more pressure
    assert backlog_ratio(b, f + df) <= r  # more free space, less pressure


# --- the control law -------------------------------------------------------------------------


def test_zero_backlog_gives_min_shares() -> None:
    params = ControllerParams()
    out, state = update(params, ControllerState.initial(params), 0, 100 * GB, 0)
    assert out.updated
    assert out.shares == params.min_shares
    assert out.error == 0.0 and out.backlog_ratio == 0.0
    assert state.shares == 100 and state.last_update_ms == 0


@pytest.mark.parametrize(
    ("ratio_percent", "shares"),
    [(1, 100), (5, 100), (10, 200), (25, 500), (40, 800), (50, 1000), (90, 1000), (100, 1000)],
)
def test_shares_follow_p_times_error_clamped(ratio_percent: int, shares: int) -> None:
    # error = 0 - 1000 * ratio (per-mille), output = -2 * error, clamped to [100, 1000]
    params = ControllerParams()
    backlog = ratio_percent
    out, _ = update(params, ControllerState.initial(params), backlog, 100 - backlog, 0)
    assert out.error == pytest.approx(-10.0 * ratio_percent)
    assert out.shares == shares


def test_growing_backlog_grows_shares_up_to_the_max() -> None:
    params = ControllerParams()
    state = ControllerState.initial(params)
    seen = []
    for k, backlog in enumerate([0, 5, 10, 20, 30, 45, 60, 80]):
        shares, state = step(params, state, backlog * GB, (100 - backlog) * GB, k * INTERVAL)
        seen.append(shares)
    assert seen == sorted(seen)
    assert seen[0] == 100 and seen[-1] == 1000
    assert seen[3] > seen[2] > seen[1]  # strictly growing while unclamped


@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=20), st.integers(1, 10**12))
def test_shares_stay_within_bounds(backlogs: list[int], free: int) -> None:
    params = ControllerParams(d_coeff=3.0)
    state = ControllerState.initial(params)
    for k, backlog in enumerate(backlogs):
        out, state = update(params, state, backlog, free, k * INTERVAL)
        assert params.min_shares <= out.shares <= params.max_shares


def test_derivative_term_reacts_to_the_change_of_the_error() -> None:
    pd = ControllerParams(d_coeff=1.0)
    p_only = ControllerParams(d_coeff=0.0)
    for params in (pd, p_only):
        state = ControllerState.initial(params)
        first, state = step(params, state, 10, 90, 0)  # ratio 0.1: error -100, no derivative
        assert first == 200
    # rising backlog 0.1 -> 0.2: error -100 -> -200, derivative -100
    state = ControllerState.initial(pd)
    _, state = step(pd, state, 10, 90, 0)
    rising, state = step(pd, state, 20, 80, INTERVAL)
    assert rising == 600  # -2 * (-200 + 1 * -100); the P term alone gives 400
    # falling backlog 0.2 -> 0.1: the derivative (+100) cancels the P term
    falling, _ = step(pd, state, 10, 90, 2 * INTERVAL)
    assert falling == pd.min_shares
    # without the D term the same sequence is P only
    state = ControllerState.initial(p_only)
    _, state = step(p_only, state, 10, 90, 0)
    p_rising, state = step(p_only, state, 20, 80, INTERVAL)
    assert p_rising == 400
    assert step(p_only, state, 10, 90, 2 * INTERVAL)[0] == 200


def test_derivative_is_per_update_interval_when_an_update_comes_late() -> None:
    params = ControllerParams(d_coeff=1.0)
    state = ControllerState.initial(params)
    _, state = step(params, state, 10, 90, 0)
    # the same -100 change of the error over two intervals is a derivative of -50
    late, _ = step(params, state, 20, 80, 2 * INTERVAL)
    assert late == 500  # -2 * (-200 - 50)


def test_no_change_before_the_update_interval_elapses() -> None:
    params = ControllerParams()
    state0 = ControllerState.initial(params)
    out1, state1 = update(params, state0, 10, 90, 1_000)
    assert out1.updated and out1.shares == 200
    out2, state2 = update(params, state1, 50, 50, 1_000 + INTERVAL - 1)
    assert not out2.updated
    assert state2 is state1
    assert (out2.shares, out2.error, out2.backlog_ratio) == (200, out1.error, 0.1)
    out3, state3 = update(params, state2, 50, 50, 1_000 + INTERVAL)
    assert out3.updated and out3.shares == 1000
    assert state3.last_update_ms == 1_000 + INTERVAL


def test_a_clock_that_went_backwards_does_not_freeze_the_controller() -> None:
    params = ControllerParams()
    _, state = update(params, ControllerState.initial(params), 0, 100, 10 * INTERVAL)
    out, state = update(params, state, 30, 70, INTERVAL)
    assert out.updated and out.shares == 600
    assert state.last_update_ms == INTERVAL


# --- shares -> budget ------------------------------------------------------------------------


def test_budget_is_linear_in_shares() -> None:
    params = ControllerParams()
    kw = {"max_bandwidth_bytes_per_s": 100_000_000, "max_concurrency": 20}
    assert upload_budget(1000, params, **kw) == UploadBudget(100_000_000, 20)
    assert upload_budget(500, params, **kw) == UploadBudget(50_000_000, 10)
    # min shares still move at min/max of full speed: uploads never stall
    assert upload_budget(100, params, **kw) == UploadBudget(10_000_000, 2)


def test_budget_clamps_shares_and_keeps_one_upload() -> None:
    params = ControllerParams()
    assert upload_budget(5000, params, max_bandwidth_bytes_per_s=1000, max_concurrency=4) == (
        UploadBudget(1000, 4)
    )
    assert upload_budget(0, params, max_bandwidth_bytes_per_s=1000, max_concurrency=4) == (
        UploadBudget(100, 1)
    )
    assert upload_budget(100, params, max_bandwidth_bytes_per_s=None, max_concurrency=1) == (
        UploadBudget(None, 1)
    )


def test_budget_refuses_impossible_maxima() -> None:
    params = ControllerParams()
    with pytest.raises(PolicyInputError):
        upload_budget(100, params, max_bandwidth_bytes_per_s=None, max_concurrency=0)
    with pytest.raises(PolicyInputError):
        upload_budget(100, params, max_bandwidth_bytes_per_s=0, max_concurrency=1)


@given(st.integers(0, 2000), st.integers(0, 2000), st.integers(1, 64), st.integers(1, 10**10))
def test_budget_is_monotone_in_shares(a: int, b: int, conc: int, bw: int) -> None:
    params = ControllerParams()
    lo, hi = sorted((a, b))
    small = upload_budget(lo, params, max_bandwidth_bytes_per_s=bw, max_concurrency=conc)
    big = upload_budget(hi, params, max_bandwidth_bytes_per_s=bw, max_concurrency=conc)
    assert 1 <= small.concurrency <= big.concurrency <= conc
    assert small.bandwidth_bytes_per_s is not None and big.bandwidth_bytes_per_s is not None
    assert 1 <= small.bandwidth_bytes_per_s <= big.bandwidth_bytes_per_s <= bw
