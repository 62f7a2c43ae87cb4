"""The CONDITIONAL acceptance estimate (a spec deviation: docs/speculation.md).

Prefix survival is read as the product of per-position conditional acceptances, each a weighted
mean of its own evidence and a starting value that follows the request's pooled per-position rate.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helios.config import AcceptanceEstimate, SchedulerConfig, SpeculationMode, StudyConfig
from helios.errors import ConfigError
from helios.scheduler.speculation import (START_WEIGHT, PopulationPrior, ProposalSource, SpeculationColumns,
                                          SpeculationModel, conditional_survival)

from conftest import make, prefill

LEARNED = ProposalSource.LEARNED
DEPTH = 7


def model_and_row(estimate=AcceptanceEstimate.CONDITIONAL, depth=DEPTH):
    return SpeculationModel(depth, estimate), SpeculationColumns(depth, 1)


def survival(m, cols):
    return m.survival(cols, np.array([0]), LEARNED)[0]


def geometric_rounds(m, cols, q, offered, rounds, seed=0):
    """`rounds` verification rounds offering `offered` drafts, each surviving with probability q."""
    rng = np.random.default_rng(seed)
    for i in range(rounds):
        accepted = 0
        while accepted < offered and rng.random() < q:
            accepted += 1
        m.observe_round(cols, 0, LEARNED, i, accepted, offered, censored=False)


def test_with_nothing_observed_the_estimate_is_the_population_prior():
    m, cols = model_and_row()
    assert survival(m, cols) == pytest.approx(0.5 ** np.arange(1, DEPTH + 1))
    m.acceptance_prior[LEARNED].seed([0.9, 0.7, 0.4, 0.3, 0.1, 0.05, 0.0])
    assert survival(m, cols) == pytest.approx([0.9, 0.7, 0.4, 0.3, 0.1, 0.05, 0.0])


def test_a_rejection_is_evidence_only_at_the_position_that_failed():
    m, cols = model_and_row()
    m.observe_round(cols, 0, LEARNED, 0, accepted=2, offered=5, censored=False)
    est = cols.acceptance[LEARNED]
    # Positions 1 and 2 survived, 3 was reached and failed, 4 and 5 were never reached.
    assert est.hits[0] == pytest.approx([1, 1, 0, 0, 0, 0, 0])
    assert est.tries[0] == pytest.approx([1, 1, 1, 0, 0, 0, 0])
    # The spec's means take zeros at 3..5 (kept alongside; the bound's weights come from them).
    assert est.weights[0, :5] == pytest.approx(START_WEIGHT + 1) and est.weights[0, 5] == START_WEIGHT
    # The round also moved the population prior by 1/64; put it back at 0.5^d for round figures.
    m.acceptance_prior[LEARNED].seed(0.5 ** np.arange(1, DEPTH + 1))
    # Pooled rate (2 + 2 * 0.5) / (3 + 2) = 0.6; the untrained prior's conditionals are all 0.5,
    # so every start is 0.6 and c = (hits + 2 * 0.6) / (tries + 2).
    c = (np.array([1, 1, 0, 0, 0, 0, 0]) + 2 * 0.6) / (np.array([1, 1, 1, 0, 0, 0, 0]) + 2)
    assert survival(m, cols) == pytest.approx(np.cumprod(c))
    # Censoring: termination after two accepted drafts reaches no third position.
    m2, cols2 = model_and_row()
    m2.observe_round(cols2, 0, LEARNED, 0, accepted=2, offered=5, censored=True)
    assert cols2.acceptance[LEARNED].tries[0] == pytest.approx([1, 1, 0, 0, 0, 0, 0])


def test_the_spec_estimate_keeps_scheduling_with_the_per_depth_means():
    m, cols = model_and_row(AcceptanceEstimate.SPEC)
    m.observe_round(cols, 0, LEARNED, 0, accepted=2, offered=4, censored=False)
    prior = 0.5 ** np.arange(1, DEPTH + 1)
    expect = prior.copy()
    expect[:4] = (2 * prior[:4] + np.array([1, 1, 0, 0])) / 3
    assert survival(m, cols) == pytest.approx(expect)


@pytest.mark.parametrize("q", [0.3, 0.6, 0.85])
def test_unreached_depths_follow_the_measured_rate_not_half_to_the_d(q):
    """A request offered three drafts per round: depths 4-7 are never reached, so the spec keeps
    them at 0.5^d forever, while the conditional estimate extrapolates the measured rate."""
    m, cols = model_and_row()
    geometric_rounds(m, cols, q, offered=3, rounds=400)
    s = survival(m, cols)
    truth = q ** np.arange(1, DEPTH + 1)
    assert s == pytest.approx(truth, abs=0.06)
    # Depths 4-7 were never reached: each carries the measured per-position rate.
    assert s[3:] / s[2:-1] == pytest.approx(np.full(4, q), abs=0.04)
    spec_m, spec_cols = model_and_row(AcceptanceEstimate.SPEC)
    geometric_rounds(spec_m, spec_cols, q, offered=3, rounds=400)
    assert survival(spec_m, spec_cols)[3:] == pytest.approx(0.5 ** np.arange(4, DEPTH + 1))


def test_observed_depths_converge_to_a_non_geometric_truth():
    """Each position's own evidence outweighs the geometric start once it is reached often."""
    truth_cond = np.array([0.9, 0.8, 0.5, 0.9, 0.3, 0.7, 0.6])
    m, cols = model_and_row()
    rng = np.random.default_rng(3)
    for i in range(3000):
        accepted = 0
        while accepted < DEPTH and rng.random() < truth_cond[accepted]:
            accepted += 1
        # Generated count fixed: no aging, so the evidence caps at 128 tries per position.
        m.observe_round(cols, 0, LEARNED, 0, accepted, DEPTH, censored=False)
    assert survival(m, cols) == pytest.approx(np.cumprod(truth_cond), abs=0.08)
    assert cols.acceptance[LEARNED].tries[0].max() <= 128.0 + 1e-9


def test_aging_fades_the_conditional_evidence_toward_the_start():
    m, cols = model_and_row()
    for _ in range(20):
        m.observe_round(cols, 0, LEARNED, 0, accepted=0, offered=2, censored=False)
    est = cols.acceptance[LEARNED]
    before = est.tries[0, 0]
    est.age(np.array([0]), np.array([128]))
    assert est.tries[0, 0] == pytest.approx(before / 2)


rates = st.floats(0.0, 1.0)
rounds = st.lists(st.tuples(st.integers(1, DEPTH), st.integers(0, DEPTH), st.booleans(), st.integers(0, 300),
                            st.one_of(st.none(), st.lists(rates, min_size=DEPTH, max_size=DEPTH))),
                  max_size=25)


@settings(max_examples=300, deadline=None)
@given(st.lists(rates, min_size=DEPTH, max_size=DEPTH), rounds)
def test_estimates_are_probabilities_and_nonincreasing_in_depth(prior, observed):
    m, cols = model_and_row()
    m.acceptance_prior[LEARNED].seed(prior)  # any curve, even an increasing or all-zero one
    generated = 0
    for offered, accepted, censored, step_, rows in observed:
        generated += step_
        m.observe_round(cols, 0, LEARNED, generated, min(accepted, offered), offered, censored,
                        survival=None if rows is None else np.array(rows))
        est = cols.acceptance[LEARNED]
        assert np.all(est.hits[0] <= est.tries[0] + 1e-12)
        s = survival(m, cols)
        assert np.all((s >= 0.0) & (s <= 1.0))
        assert np.all(np.diff(s) <= 1e-12)
        opt = m.optimistic(cols, np.array([0]), LEARNED, np.array([generated]))[0]
        assert np.all((opt >= s - 1e-12) & (opt <= 1.0))


@settings(max_examples=200, deadline=None)
@given(st.lists(rates, min_size=DEPTH, max_size=DEPTH))
def test_without_evidence_the_start_is_geometric_at_the_population_pooled_rate(prior):
    p = np.minimum.accumulate(np.array(prior))  # a prefix survival curve
    q_pop = p.sum() / (1.0 + p[:-1].sum())
    zero = np.zeros((1, DEPTH))
    assert conditional_survival(zero, zero, p)[0] == pytest.approx(q_pop ** np.arange(1, DEPTH + 1))
    # The untrained curve is geometric, so there it is the curve itself.
    half = 0.5 ** np.arange(1, DEPTH + 1)
    assert conditional_survival(zero, zero, half)[0] == pytest.approx(half)


def test_the_config_names_the_estimate_and_the_scheduler_uses_it():
    assert StudyConfig().acceptance_estimate is AcceptanceEstimate.CONDITIONAL  # the presets' deviation
    assert StudyConfig.spec().acceptance_estimate is AcceptanceEstimate.SPEC
    assert StudyConfig(acceptance_estimate="spec").acceptance_estimate is AcceptanceEstimate.SPEC
    with pytest.raises(ConfigError, match="acceptance_estimate"):
        StudyConfig(acceptance_estimate="geometric")
    for estimate in AcceptanceEstimate:
        s = make({prefill(64): 1.0}, config=SchedulerConfig(speculation=SpeculationMode.ADAPTIVE),
                 study=StudyConfig(acceptance_estimate=estimate))
        assert s.speculation.estimate is estimate
