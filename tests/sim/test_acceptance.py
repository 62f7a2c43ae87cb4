"""Acceptance curves from the per-position data and the per-request acceptance model."""

from __future__ import annotations

import numpy as np
import pytest

from helios.sim.acceptance import (DEFAULT_CURVE, AcceptanceModel, acceptance_sources, load_acceptance_curves,
                                   load_survival_curves)


def test_curves_load_and_match_quoted_mean_length():
    curves = load_acceptance_curves()
    assert set(curves) == {"pr26498/mtbench", "pr26498/specbench", "pr42764/unspecified",
                           "pr24243/unspecified"}
    assert len(curves["pr26498/mtbench"]) == 10 and len(curves["pr42764/unspecified"]) == 5
    for alpha in curves.values():
        assert np.all((alpha > 0) & (alpha <= 1))
    # The quoted rates are prefix-survival: 1 + sum(s_i) is the quoted mean acceptance length.
    s = load_survival_curves()["pr26498/mtbench"]
    assert 1 + s.sum() == pytest.approx(3.64, abs=0.01)
    assert np.allclose(np.cumprod(curves["pr26498/mtbench"]), s)
    assert curves["pr26498/mtbench"][0] == pytest.approx(0.74)
    assert "EAGLE" in acceptance_sources()["pr42764/unspecified"]


def test_zero_spread_follows_curve_exactly():
    m = AcceptanceModel(DEFAULT_CURVE, seed=0, spread=0.0)
    s = load_survival_curves()[DEFAULT_CURVE]
    assert np.allclose(m.survival("r1"), s)
    assert m.multiplier("anything") == 1.0


def test_survival_is_decreasing_and_extends_past_measured_depth():
    m = AcceptanceModel(seed=1, spread=0.3)
    s = m.survival(("req", 4), depth=14)
    assert len(s) == 14 and np.all(np.diff(s) <= 0) and np.all((s >= 0) & (s <= 1))
    assert m.tail_rate == pytest.approx(np.mean(m.curve[-3:]))


def test_per_request_multiplier_is_deterministic_with_unit_mean():
    a = AcceptanceModel(seed=3, spread=0.25)
    b = AcceptanceModel(seed=3, spread=0.25)
    keys = list(range(4000))
    ma = np.array([a.multiplier(k) for k in reversed(keys)])[::-1]  # order of calls does not matter
    mb = np.array([b.multiplier(k) for k in keys])
    assert np.array_equal(ma, mb)
    assert ma.mean() == pytest.approx(1.0, abs=0.02)
    assert ma.std() == pytest.approx(0.25, rel=0.1)
    c = AcceptanceModel(seed=4, spread=0.25)
    assert not np.array_equal(mb, [c.multiplier(k) for k in keys])


def test_sample_accepted_matches_survival():
    m = AcceptanceModel(seed=0, spread=0.2)
    rng = np.random.default_rng(11)
    depth, n = 6, 20000
    draws = np.array([m.sample_accepted("r", depth, rng) for _ in range(n)])
    assert draws.min() >= 0 and draws.max() <= depth
    s = m.survival("r", depth)
    for i in range(depth):  # P(accepted >= i + 1) = s_{i+1}
        assert np.mean(draws >= i + 1) == pytest.approx(s[i], abs=0.015)
    assert draws.mean() == pytest.approx(m.expected_accepted("r", depth), abs=0.05)
    assert m.sample_accepted("r", 0, rng) == 0


def test_same_rng_state_gives_same_samples():
    m = AcceptanceModel(seed=0, spread=0.2)
    x = [m.sample_accepted(k, 5, np.random.default_rng(9)) for k in range(50)]
    y = [m.sample_accepted(k, 5, np.random.default_rng(9)) for k in range(50)]
    assert x == y


def test_population_spread_varies_requests():
    m = AcceptanceModel(seed=0, spread=0.4)
    means = [m.expected_accepted(k, 5) for k in range(200)]
    assert max(means) > 1.5 * min(means)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        AcceptanceModel("no-such-curve")
    with pytest.raises(ValueError):
        AcceptanceModel([0.5, 1.2])
    with pytest.raises(ValueError):
        AcceptanceModel(spread=1.0)
    with pytest.raises(ValueError):
        AcceptanceModel().survival("r", -1)
