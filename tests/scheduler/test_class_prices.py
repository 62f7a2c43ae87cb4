"""The class-to-price mapping (issue 40; docs/scheduling-utility.md section 13): the properties the
utility keeps per class, and the default class's identity with today's coefficients."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from helios.config import PolicyConfig, preset
from helios.scheduler.class_prices import (GAP_ADAPTATIONS, WAIT_ADAPTATIONS, class_prices, class_targets,
                                           request_weight, stall_log_growth, waiting_log_price)
from helios.scheduler.service import ewma_log
from helios.scheduler.service_class import BUILTIN_CLASSES, DEFAULT_CLASS, ServiceClass

positive = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)
classes = st.builds(ServiceClass, st.just("c"), st.none() | positive, st.none() | st.floats(0.01, 10.0),
                    st.none() | positive, st.none() | positive, st.floats(0.01, 100.0))
POLICIES = (PolicyConfig(), preset("balanced"), preset("throughput"))


@pytest.mark.parametrize("policy", POLICIES)
def test_default_class_is_todays_coefficients(policy):
    """Rule: with every request in the default class, the prices are exactly today's."""
    p = class_prices(DEFAULT_CLASS, policy, 1000, 200)
    assert p.weight == 1.0 and p.decode_age_price == policy.decode_age_price
    assert p.wait_tau_ms == p.stream_tau_ms == policy.adaptation_ms
    # The waiting price is today's EWMA law with today's tau, to the last bit.
    log_x = -3.0
    today = float(ewma_log(log_x, 700.0, 0.0, policy.adaptation_ms))
    assert waiting_log_price(math.log(16), log_x, p, 700.0) == pytest.approx(math.log(16) - today, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(cls=classes, prompt=st.integers(1, 8000), output=st.integers(1, 4000), log_x=st.floats(-20, 5),
       w1=st.floats(0, 1e5), w2=st.floats(0, 1e5), mean_law=st.booleans())
def test_waiting_price_grows_without_bound_for_every_positive_weight_class(cls, prompt, output, log_x, w1, w2,
                                                                        mean_law):
    """Rule: a backlogged request's price grows while it waits, without bound, in every class (batch too)."""
    p = class_prices(cls, preset("balanced"), prompt, output)
    a, b = sorted((w1, w2))
    assert waiting_log_price(0.0, log_x, p, a, mean_law) <= waiting_log_price(0.0, log_x, p, b, mean_law)
    # Without bound: past any level after a finite wait.
    level = 50.0
    tau = p.wait_tau_ms
    wait = (level + abs(log_x) + abs(math.log(p.weight))) * tau
    wait = math.expm1(level + abs(log_x) + abs(math.log(p.weight))) * tau if mean_law else wait
    assert waiting_log_price(0.0, log_x, p, wait, mean_law) >= level - 1e-6


@settings(max_examples=100, deadline=None)
@given(cls=classes, prompt=st.integers(1, 8000), output=st.integers(1, 4000), log_x=st.floats(-20, 5),
       wait=st.floats(0, 1e5), tenant_w=st.floats(0.1, 10), n=st.integers(1, 50))
def test_equal_histories_in_one_class_give_equal_prices(cls, prompt, output, log_x, wait, tenant_w, n):
    """Rule: two requests of the same class, lengths, tenant and history have the same price."""
    a = class_prices(cls, preset("balanced"), prompt, output, tenant_w, n)
    b = class_prices(ServiceClass(cls.name, cls.ttft_ms, cls.ttft_per_token_ms, cls.gap_ms, cls.deadline_ms,
                                  cls.weight, cls.priority), preset("balanced"), prompt, output, tenant_w, n)
    assert a == b
    assert waiting_log_price(1.0, log_x, a, wait) == waiting_log_price(1.0, log_x, b, wait)


@settings(max_examples=100, deadline=None)
@given(waits=st.lists(st.floats(0, 5000), min_size=2, max_size=6), shift=st.floats(-50, 50),
       scale=st.floats(0.01, 100))
def test_order_is_invariant_under_the_shared_scale(waits, shift, scale):
    """Rule: one positive factor on every price (the shared scale, or every class and tenant weight
    scaled together) never changes which request is priced highest."""
    policy = preset("balanced")
    built = [c for c in BUILTIN_CLASSES]
    reqs = [(built[i % len(built)], w) for i, w in enumerate(waits)]

    def prices(k):
        return [waiting_log_price(0.0, -2.0, class_prices(ServiceClass(c.name, c.ttft_ms, c.ttft_per_token_ms,
                                                                       c.gap_ms, c.deadline_ms, c.weight * k,
                                                                       c.priority), policy, 500, 100), w)
                for c, w in reqs]

    base = prices(1.0)
    shifted = [p + shift for p in base]
    scaled = prices(scale)
    rank = sorted(range(len(base)), key=lambda i: (base[i], i))
    assert sorted(range(len(base)), key=lambda i: (shifted[i], i)) == rank
    for i in range(len(base)):
        assert scaled[i] - base[i] == pytest.approx(math.log(scale), abs=1e-9)


def test_same_fraction_of_its_own_target_same_growth():
    """A request's price growth depends on its wait as a fraction of its own first-token target."""
    policy = preset("balanced")
    fast = class_prices(ServiceClass("fast", ttft_ms=500.0), policy, 100, 10)
    slow = class_prices(ServiceClass("slow", ttft_ms=5000.0), policy, 100, 10)
    g_fast = waiting_log_price(0.0, 0.0, fast, 250.0) - waiting_log_price(0.0, 0.0, fast, 0.0)
    g_slow = waiting_log_price(0.0, 0.0, slow, 2500.0) - waiting_log_price(0.0, 0.0, slow, 0.0)
    assert g_fast == pytest.approx(g_slow) == pytest.approx(WAIT_ADAPTATIONS / 2)
    # A per-token target: a long prompt's tau is longer in proportion.
    per_token = ServiceClass("summ", ttft_per_token_ms=1.0)
    assert class_prices(per_token, policy, 8000, 10).wait_tau_ms == 8 * class_prices(per_token, policy, 1000, 10).wait_tau_ms


def test_a_stall_costs_by_the_decoders_own_gap_target():
    """A 600-ms stall breaks a 100-ms gap target and not a 1-s one: the first owes far more."""
    policy = preset("balanced")
    tight = class_prices(ServiceClass("chat", gap_ms=100.0), policy, 100, 100)
    loose = class_prices(ServiceClass("summ", gap_ms=1000.0), policy, 100, 100)
    assert tight.stream_tau_ms == pytest.approx(100.0 / GAP_ADAPTATIONS)
    assert stall_log_growth(600.0, tight) > stall_log_growth(600.0, loose) + 30
    assert stall_log_growth(0.0, tight) == -math.inf
    # The age cost is the same cost in the class's time: c (tau / tau_stream)^2.
    assert tight.decode_age_price == pytest.approx(policy.decode_age_price * (50.0 / tight.stream_tau_ms) ** 2)


def test_deadline_only_class_splits_its_deadline():
    batch = ServiceClass("batch", deadline_ms=60_000.0, weight=0.25)
    assert class_targets(batch, 500, 300) == (30_000.0, 100.0)
    assert class_targets(DEFAULT_CLASS, 500, 300) == (None, None)
    both = ServiceClass("x", ttft_ms=200.0, deadline_ms=60_000.0)
    assert class_targets(both, 500, 300) == (200.0, 100.0)


def test_a_tenant_gains_nothing_by_splitting_its_work():
    """Per-tenant and per-request fairness: a tenant's weight is shared by its live requests, so its
    total weight (and its share of service at equal rates) does not grow with its request count."""
    cls = ServiceClass("c", weight=2.0)
    assert sum(request_weight(cls, 3.0, 7) for _ in range(7)) == pytest.approx(request_weight(cls, 3.0, 1))
    assert request_weight(cls, 3.0, 1) == 6.0
    with pytest.raises(ValueError):
        request_weight(cls, 1.0, 0)
