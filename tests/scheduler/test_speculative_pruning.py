"""Pruned speculative selection is exact (docs/scheduling-utility.md section 8).

selection builds speculative candidates with `prune=True`: a class of programs (same depth, same
lane count) whose score bound is below a candidate already built is not built at all. The winner
must be the one the unpruned list gives, on host and device allocation, constrained (ragged) and
rectangular programs, with and without the deferred step and stall pricing, for any durations
(larger programs may measure faster), and stale candidates must stay while a refresh may run them.
"""

import numpy as np
from hypothesis import given, settings, strategies as st

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.policy import Deferred, LanePool, best
from helios.scheduler.rounds import speculative_candidates

DEPTH = 4
# Rectangular programs and ragged ones whose row budget P binds (P < B x W).
SHAPES = ([GraphShape(GraphKind.SPECULATIVE, b, w, w - 1, b * w) for b in (1, 2, 4, 8) for w in (1, 2, 3, 5)]
          + [GraphShape(GraphKind.SPECULATIVE, b, w, w - 1, p) for b, w, p in ((4, 5, 8), (8, 5, 16), (8, 3, 12))])


def identity(c):
    return c.shape, c.members.tobytes(), c.rows.tobytes(), c.score


LANE = st.tuples(st.floats(0.01, 1.0), st.floats(0.01, 1.0),
                 st.lists(st.floats(0.0, 1.0), min_size=DEPTH, max_size=DEPTH), st.floats(0.0, 1.0),
                 st.integers(2, 6))


@settings(max_examples=400, deadline=None)
@given(st.lists(LANE, min_size=1, max_size=10), st.booleans(), st.booleans(), st.booleans(), st.booleans(),
       st.lists(st.floats(2.0, 40.0), min_size=len(SHAPES), max_size=len(SHAPES)),
       st.lists(st.booleans(), min_size=len(SHAPES), max_size=len(SHAPES)), st.sampled_from([0.0, 0.003]))
def test_pruned_selection_picks_the_unpruned_winner(lanes, device, deferred, stalled, keep_stale, durations, stale,
                                                    slope):
    n = len(lanes)
    base = np.array([x[0] for x in lanes])
    survival = np.minimum.accumulate(np.array([x[2] for x in lanes]), axis=1)
    stall = np.array([x[3] for x in lanes]) if stalled else None
    pool = LanePool(np.arange(100, 100 + n), np.arange(n, dtype=np.int64), np.arange(n), base, age_slope=slope,
                    extra_value=np.array([x[1] for x in lanes]), survival_alpha=survival, survival=survival,
                    forecast=survival, limit=np.array([x[4] for x in lanes]), stall=stall, tau_ms=20.0)
    pool.stall_total = float(stall.sum()) if stalled else 0.0
    timing = dict(zip(SHAPES, zip(durations, stale)))
    if deferred:
        steps = tuple(min((timing[s][0] for s in SHAPES if s.batch_capacity >= m), default=None) for m in range(65))
        pool.deferred = Deferred(float(base.sum()), n, slope, steps)

    def costs(shape):
        t, old = timing[shape]
        return t, CostState.STALE if old else CostState.FRESH

    full = speculative_candidates(SHAPES, costs, pool, slope * n, device)
    pruned = speculative_candidates(SHAPES, costs, pool, slope * n, device, prune=True, keep_stale=keep_stale)
    everything = {identity(c) for c in full}
    assert {identity(c) for c in pruned} <= everything  # pruning only leaves candidates out
    assert identity(best(pruned)) == identity(best(full))
    if keep_stale:  # a funded refresh may choose any stale candidate: all of them are there
        assert {identity(c) for c in full if c.cost_state is CostState.STALE} <= {identity(c) for c in pruned}
