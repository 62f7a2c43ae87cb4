"""Service prices (DESIGN 4.1 and docs/scheduling-utility.md): the four required properties."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helios.config import PolicyConfig, SchedulerConfig
from helios.scheduler import planning
from helios.scheduler.service import PriceCoefficients, ewma_log, log_prices

from conftest import decode, make, prefill, shift_log_x, spec, step
from conftest import table_policy

intervals = st.lists(st.floats(min_value=0.01, max_value=500.0), min_size=1, max_size=40)
K = PriceCoefficients.of(PolicyConfig())


@settings(deadline=None)  # timing-free: a loaded machine must not fail it
@given(intervals)
def test_backlogged_unserved_request_price_grows_without_bound(deltas):
    log_x = 0.0
    prices = [log_prices(np.array([log_x]), np.array([math.nan]), K)[0][0]]
    for d in deltas:
        log_x = ewma_log(log_x, d, 0.0, 100.0)
        prices.append(log_prices(np.array([log_x]), np.array([math.nan]), K)[0][0])
    assert all(b > a for a, b in zip(prices, prices[1:]))
    # Each unserved interval multiplies f/x by exactly e^(d/tau): no bound can hold.
    assert log_x == pytest.approx(-sum(deltas) / 100.0)


def test_price_growth_reaches_any_bound_without_overflow():
    log_x = 0.0
    for _ in range(100_000):
        log_x = ewma_log(log_x, 1000.0, 0.0, 100.0)
    lp, lo, _, _ = log_prices(np.array([log_x]), np.array([math.nan]), K)
    assert lp[0] > 9_000 and math.isfinite(lp[0]) and math.isfinite(lo[0])


@settings(deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 200.0), st.integers(0, 500)), min_size=1, max_size=30))
def test_equal_service_histories_give_equal_prices(history):
    a = b = -1.0
    for d, tokens in history:
        a = ewma_log(a, d, tokens, 100.0)
        b = ewma_log(b, d, tokens, 100.0)
    pa = log_prices(np.array([a]), np.array([a]), K)
    pb = log_prices(np.array([b]), np.array([b]), K)
    assert all(x[0] == y[0] for x, y in zip(pa, pb))


@pytest.mark.parametrize("shift", [-50.0, 3.0, 400.0])
def test_choices_do_not_change_under_the_shared_scale(monkeypatch, shift):
    table = {decode(1): 8, decode(2): 9, decode(4): 10, prefill(64): 7, prefill(256): 15}
    results = []
    for offset in (0.0, shift):
        s = make(table)
        for _ in range(3):
            s.admit(spec(prompt=64), 0)
        fence = 0
        while (p := s.plan()) is not None and p.shape.kind.is_prefill:
            fence += 1
            step(s, p, fence)
        h = s.admit(spec(prompt=200), s.now_ns)
        s.advance_to(s.now_ns + 30 * 1_000_000)
        original = planning.shared_log_scale
        monkeypatch.setattr(planning, "shared_log_scale", lambda *a: original(*a) + offset)
        p = s.plan()
        monkeypatch.setattr(planning, "shared_log_scale", original)
        results.append((p.shape, p.handles, p.selection_value_rate(), p.selection_log_scale()))
    (s0, h0, r0, l0), (s1, h1, r1, l1) = results
    assert (s0, h0) == (s1, h1)
    assert l1 - l0 == pytest.approx(shift)
    # The scaled score is the same decision in other units: r * e^L is invariant.
    assert math.log(r0) + l0 == pytest.approx(math.log(r1) + l1, rel=1e-9)


def test_zero_coefficients_remove_their_preference():
    k = PriceCoefficients.of(PolicyConfig(token_fairness=0, delivery_fairness=0))
    lp, lo, ld, _ = log_prices(np.array([-30.0, 5.0]), np.array([-30.0, 5.0]), k)
    assert np.allclose(lp, 0.0)  # prefill token price is exactly 1
    assert np.allclose(lo, math.log(64))  # output token price is exactly beta
    assert np.all(np.isneginf(ld))  # no delivery price


def test_zero_decode_age_price_removes_the_age_term():
    table = {decode(1): 8, decode(2): 9, prefill(64): 7}

    def rate_after_gap(age_price, gap_ms):
        s = make(table, policy=table_policy(decode_age_price=age_price))
        h = s.admit(spec(), 0)
        step(s, s.plan(), 1)  # prefill and first token
        s.advance_to(s.now_ns + int(gap_ms * 1e6))
        p = s.plan()
        return p.selection_value_rate() * math.exp(p.selection_log_scale())

    assert rate_after_gap(0.0, 0) == pytest.approx(rate_after_gap(0.0, 500))
    assert rate_after_gap(0.1, 500) > rate_after_gap(0.1, 0)


def test_the_shared_scale_comes_from_lanes_that_can_run():
    # Three slots: a decoder and two resident, partly prefilled prompts. A fourth prompt has no slot and
    # has waited so long that its log price is 3,000 above theirs (W/tau = 3,000). Were it to set the
    # scale, every runnable lane's value would underflow to zero and the tie would go to the shortest
    # graph, the decoder's 1-row step, over and over (the overload collapse of docs/scheduling-utility.md).
    table = {decode(1): 5.0, decode(4): 8.0, prefill(64): 6.0, prefill(256): 13.0}
    s = make(table, config=SchedulerConfig(request_slots=3, kv_pages=1_000))
    fence = 0
    d = s.admit(spec(prompt=64, out=500), 0)
    while s.request_row(d).phase.name != "DECODE":
        fence += 1
        step(s, s.plan(), fence)
    resident = [s.admit(spec(prompt=2000, out=4), s.now_ns) for _ in range(2)]
    while any(s.requests.slot[s.requests.row(h)] == planning.NO_SLOT for h in resident):
        fence += 1
        step(s, s.plan(), fence)
    homeless = s.admit(spec(prompt=64, out=4), s.now_ns)
    shift_log_x(s, homeless, -3000.0)
    p = s.plan()
    assert p.shape.kind.is_prefill and set(p.handles) <= set(resident)
    assert p.selection_value_rate() > 0.0
    # Once a slot is free the waiting prompt can run, and it sets the scale again: it goes first.
    s.cancel(resident[0], s.now_ns)
    p = s.plan()
    assert homeless in p.handles
