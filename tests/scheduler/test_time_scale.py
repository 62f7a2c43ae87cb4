"""Two extensions of the issue-12 utility (docs/scheduling-utility.md, sections 4 and 9):
served decoders that a longer graph delays past their own step owe the stall growth of the
excess, and f and g calibrated to the measured time scale."""

import math

from hypothesis import given, strategies as st

from helios.config import PolicyConfig, preset
from helios.scheduler.service import PriceCoefficients
from helios.scheduler.utility import served_cost, stall_cost

from conftest import configs, decode, make, preset_configs

COEFF = st.floats(0.0, 100.0)
LOG_RATE = st.floats(-8.0, 3.0)


@given(COEFF, COEFF, COEFF, LOG_RATE)
def test_time_scaling_caps_the_fairness_price_at_beta_for_a_stream_at_the_reference_rate(f, g, beta, log_rd):
    k = PriceCoefficients.of(PolicyConfig(token_fairness=f, delivery_fairness=g, output_token_value=beta))
    scaled = k.time_scaled(log_rd)
    if f == 0.0 or beta == 0.0:
        assert scaled == k  # a zero coefficient removes a preference; nothing to calibrate
        return
    # f' = min(f, beta * r_d): f'/r_d <= beta, and nothing is ever scaled up.
    f2 = math.exp(scaled.log_f)
    assert math.isclose(f2, min(f, beta * math.exp(log_rd)), rel_tol=1e-9)
    assert scaled.log_f <= k.log_f and scaled.log_beta == k.log_beta
    # g moves by the same factor, so the delivery/token balance is the table's.
    if g > 0.0:
        assert math.isclose(scaled.log_g - k.log_g, scaled.log_f - k.log_f, abs_tol=1e-9)
    else:
        assert scaled.log_g == -math.inf


def test_the_table_is_unchanged_before_anything_is_measured_and_on_fast_hardware():
    k = PriceCoefficients.of(PolicyConfig())
    assert k.time_scaled(0.0) == k  # r_d = 1 token/ms before measurement: 64 * 1 > 16
    assert k.time_scaled(math.log(1 / 3.0)) == k  # a 3-ms decode step: 64 / 3 > 16 (balance at 4 ms)
    slow = k.time_scaled(math.log(1 / 40.0))  # a 40-ms step: f = 64 / 40
    assert math.isclose(math.exp(slow.log_f), 1.6) and math.isclose(math.exp(slow.log_g), 0.4)


def test_the_balanced_scheduler_prices_with_the_calibrated_coefficients():
    table = {decode(1): 40.0, decode(2): 41.0}
    on = make(table, policy=preset_configs("balanced"))
    off = make(table, policy=configs(adaptation_ms=preset("balanced").adaptation_ms))
    assert on._coeff() != off._coeff() and off._coeff() == off.coeff
    assert math.isclose(math.exp(on._coeff().log_f), 64 / 40.0)


@given(st.floats(0.01, 1e3), st.floats(1.0, 500.0), st.floats(0.0, 500.0), st.floats(5.0, 200.0))
def test_a_served_decoder_owes_the_stall_growth_of_its_delay_past_its_own_step(growing, t, step, tau):
    owed = served_cost(growing, t, step, tau)
    if t <= step:
        assert owed == 0.0  # a graph no longer than the decoder's own step delays nothing
    else:
        # Exactly an unserved stall of the excess, per ms of the whole graph ...
        assert math.isclose(owed * t, stall_cost(growing, t - step, tau) * (t - step), rel_tol=1e-9)
        # ... and never more than being left out of the graph altogether.
        assert owed <= stall_cost(growing, t, tau) * (1 + 1e-12)
    assert served_cost(growing, t, None, tau) == 0.0  # nothing measured: nothing to compare with
