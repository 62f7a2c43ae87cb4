"""A completed round updates every lane's acceptance and confidence estimates at once
(SpeculationModel.observe_rounds / observe_confidences). The spec's rules are per request and
the population priors are running means, so the batched update must equal the rules applied one
request after another in lane order, to the bit: that is what this checks, against a plain
per-request reference written from the spec's text ("Completed confidence and acceptance")."""

import numpy as np
from hypothesis import given, settings, strategies as st

from helios.scheduler.speculation import (HALF_LIFE_TOKENS, PRIOR_STEP, START_WEIGHT, WEIGHT_CAP, ProposalSource,
                                          SpeculationColumns, SpeculationModel)

DEPTH = 5
LEARNED = ProposalSource.LEARNED


class Reference:
    """One request at a time: start from the prior as it stands, age, observe, move the prior."""

    def __init__(self, depth, rows):
        self.prior = 0.5 ** np.arange(1, depth + 1)
        self.has = [False] * rows
        self.means, self.weights = np.zeros((rows, depth)), np.zeros((rows, depth))
        self.hits, self.tries = np.zeros((rows, depth)), np.zeros((rows, depth))
        self.generated = [0] * rows

    def observe(self, row, generated, values):
        if not self.has[row]:
            self.means[row], self.weights[row] = self.prior, START_WEIGHT
            self.hits[row], self.tries[row] = 0.0, 0.0
            self.generated[row], self.has[row] = generated, True
        if generated > self.generated[row]:
            decay = 0.5 ** ((generated - self.generated[row]) / HALF_LIFE_TOKENS)
            for col in (self.weights, self.hits, self.tries):
                col[row] *= decay
            self.generated[row] = generated
        n = len(values)
        w = self.weights[row, :n]
        self.means[row, :n] = (w * self.means[row, :n] + values) / (w + 1.0)
        self.weights[row, :n] = np.minimum(w + 1.0, WEIGHT_CAP)
        survived = np.minimum.accumulate(np.clip(values, 0.0, 1.0))
        reached = np.concatenate(([1.0], survived[:-1]))
        self.hits[row, :n] += survived
        self.tries[row, :n] += reached
        over = self.tries[row, :n] > WEIGHT_CAP
        if over.any():
            scale = np.where(over, WEIGHT_CAP / np.maximum(self.tries[row, :n], WEIGHT_CAP), 1.0)
            self.hits[row, :n] *= scale
            self.tries[row, :n] *= scale
        for d in range(n):
            self.prior[d] += PRIOR_STEP * (values[d] - self.prior[d])


def lane(depth):
    return st.tuples(st.integers(0, depth), st.integers(0, depth), st.booleans(),
                     st.one_of(st.none(), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=depth)),
                     st.lists(st.floats(0.0, 1.0), min_size=0, max_size=depth))


rounds = st.lists(st.tuples(st.integers(0, 200), st.lists(lane(DEPTH), min_size=1, max_size=6)),
                  min_size=1, max_size=8)


def assert_same(est, ref):
    for name in ("means", "weights", "hits", "tries"):
        mine = np.where(est.has[:, None], getattr(est, name), 0.0)
        theirs = np.where(np.array(ref.has)[:, None], getattr(ref, name), 0.0)
        assert np.array_equal(mine, theirs), name
    assert np.array_equal(est.generated[est.has], np.array(ref.generated)[np.array(ref.has)])


@settings(max_examples=300, deadline=None)
@given(rounds, st.randoms(use_true_random=False))
def test_a_round_learned_at_once_equals_its_requests_one_after_another(plan, rng):
    rows_total = 8
    model, cols = SpeculationModel(DEPTH), SpeculationColumns(DEPTH, rows_total)
    acceptance, forecast = Reference(DEPTH, rows_total), Reference(DEPTH, rows_total)
    generated = np.zeros(rows_total, dtype=np.int64)
    for step, lanes in plan:
        rows = np.array(rng.sample(range(rows_total), len(lanes)))  # distinct requests, any order
        generated[rows] += step
        offered = np.array([o for o, *_ in lanes])
        accepted = np.array([min(a, o) for (o, a, *_) in lanes])
        censored = np.array([c for _, _, c, *_ in lanes])
        survival = [None if s is None else np.minimum.accumulate(np.array(s)) for _, _, _, s, _ in lanes]
        model.observe_rounds(cols, rows, LEARNED, generated[rows], accepted, offered, censored, survival)
        for row, o, a, c, s in zip(rows.tolist(), offered.tolist(), accepted.tolist(), censored.tolist(), survival):
            if o <= 0:
                continue  # width-one rounds measure cost, not acceptance
            last = a if c else o
            values = (np.arange(last) < a).astype(float)
            if s is not None:
                values[:min(len(s), last)] = s[:min(len(s), last)]
            acceptance.observe(row, int(generated[row]), values)
        joint = np.zeros((len(lanes), DEPTH))
        lengths = np.array([len(j) for *_, j in lanes])
        for i, (*_, j) in enumerate(lanes):
            joint[i, :len(j)] = j
        model.observe_confidences(cols, rows, generated[rows], joint, lengths)
        for row, (*_, j) in zip(rows.tolist(), lanes):
            if j:
                forecast.observe(row, int(generated[row]), np.array(j))
        assert_same(cols.acceptance[LEARNED], acceptance)
        assert_same(cols.forecast, forecast)
        assert np.array_equal(model.acceptance_prior[LEARNED].means, acceptance.prior)
        assert np.array_equal(model.forecast_prior.means, forecast.prior)
