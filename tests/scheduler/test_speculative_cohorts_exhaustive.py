"""Speculative round cohorts against exhaustive enumeration (spec: "Useful service and selection";
docs/scheduling-utility.md section 4, the deferred step).

For host allocation without a row budget, a round's lane values are additive, so the best cohort of
each program is found by ranking. Here every program and every lane subset is scored with the
objective written out independently: the members' output and draft values, the age credit, the
stall charges of the decoders left out, and, with the deferred step, the step that still serves them.
"""

import math

import numpy as np
from hypothesis import given, settings, strategies as st
from itertools import combinations

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.policy import Deferred, LanePool
from helios.scheduler.rounds import speculative_candidates

DEPTH = 2
# Rectangular programs (P = B x W), widths 1-3, batches 1, 2 and 4: P never binds.
SHAPES = [GraphShape(GraphKind.SPECULATIVE, b, w, w - 1, b * w) for b in (1, 2, 4) for w in (1, 2, 3)]


def duration(shape, skew):
    return 8.0 + skew * shape.batch_capacity + 0.3 * shape.target_capacity


def steps_of(skew):
    """steps[m]: the fastest program with room for m lanes, as planning derives it."""
    return tuple(min((duration(s, skew) for s in SHAPES if s.batch_capacity >= m), default=None)
                 for m in range(65))


def objective(lanes, subset, shape, t, slope, waiting, stall_total, tau, step):
    """One program and one cohort, scored from scratch."""
    w = shape.token_capacity
    value = sum(lanes[i]["base"] + lanes[i]["extra"] * sum(lanes[i]["survival"][: w - 1]) for i in subset)
    growth = math.expm1(t / tau)
    stalled = (stall_total - sum(lanes[i]["stall"] for i in subset)) * growth / t
    left = [i for i in range(len(lanes)) if i not in subset]
    if step is None or not left:
        return (value + slope * len(subset) * t) / t - t / 2 * waiting - stalled
    # The deferred step: the left-out lanes' base (and age credit) arrive at the end of the step that
    # serves them; the waiting cost runs over the whole sequence.
    total = t + step
    value += sum(lanes[i]["base"] for i in left)
    credit = slope * (len(subset) * t + len(left) * total)
    return (value + credit) / total - total / 2 * waiting - stalled


LANE = st.fixed_dictionaries({
    "base": st.floats(0.05, 1.0),
    "extra": st.floats(0.05, 1.0),
    "survival": st.lists(st.floats(0.0, 1.0), min_size=DEPTH, max_size=DEPTH).map(
        lambda s: list(np.minimum.accumulate(s))),
    "stall": st.floats(0.0, 1.0),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(LANE, min_size=1, max_size=6), st.booleans(), st.booleans(), st.sampled_from([0.0, 0.4, 1.5]),
       st.sampled_from([0.0, 0.002]), st.sampled_from([5.0, 50.0]))
def test_rounds_match_exhaustive_enumeration(lanes, deferred, stalled, skew, slope, tau):
    n = len(lanes)
    base = np.array([x["base"] for x in lanes])
    stall = np.array([x["stall"] for x in lanes]) if stalled else None
    pool = LanePool(np.arange(100, 100 + n), np.arange(n, dtype=np.int64), np.arange(n), base, age_slope=slope,
                    extra_value=np.array([x["extra"] for x in lanes]),
                    survival_alpha=np.array([x["survival"] for x in lanes]),
                    limit=np.full(n, 1000), stall=stall, tau_ms=tau)
    pool.stall_total = float(stall.sum()) if stalled else 0.0
    steps = steps_of(skew)
    if deferred:
        pool.deferred = Deferred(float(base.sum()), n, slope, steps)
    waiting = slope * n
    candidates = speculative_candidates(SHAPES, lambda s: (duration(s, skew), CostState.FRESH), pool, waiting, False)
    if not stalled:
        lanes = [dict(x, stall=0.0) for x in lanes]

    best = -math.inf
    for shape in SHAPES:
        t = duration(shape, skew)
        for k in range(1, min(shape.batch_capacity, n) + 1):
            step = steps[n - k] if deferred and k < n else None
            for subset in combinations(range(n), k):
                best = max(best, objective(lanes, subset, shape, t, slope, waiting, pool.stall_total, tau, step))
    for c in candidates:  # each candidate's score is its own cohort's objective
        step = steps[n - len(c.members)] if deferred and len(c.members) < n else None
        want = objective(lanes, set(c.members.tolist()), c.shape, c.t_ms, slope, waiting, pool.stall_total, tau, step)
        assert math.isclose(c.score, want, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(max(c.score for c in candidates), best, rel_tol=1e-9, abs_tol=1e-9)
