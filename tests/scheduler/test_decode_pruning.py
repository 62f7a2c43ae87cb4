"""Decode candidates: pruning a capacity by its score bound never changes the decision.

policy.decode_candidates skips a measured capacity below the lane count when an upper bound on
its score (the m largest bases and the m largest stalls, each summed on their own) is below a
candidate already scored. The reference here scores every capacity exactly, as the spec's rule
reads: each capacity's cohort is the top m lanes ranked by base + stall * (e^(T/tau) - 1).
"""

import numpy as np
from hypothesis import given, settings, strategies as st

from helios.scheduler.cost import CostState
from helios.scheduler.memo import Memo
from helios.scheduler.policy import Candidate, LanePool, best, decode_candidates, finish_candidate
from helios.scheduler.utility import ranked_lanes, stall_growth

from conftest import decode

CAPACITIES = (1, 2, 4, 8, 16, 32, 64)


def reference(shapes, costs, pool: LanePool, waiting: float) -> list[Candidate]:
    n, out, taken = len(pool.handles), [], set()
    for shape in sorted(shapes, key=lambda s: s.batch_capacity):
        m = min(shape.batch_capacity, n)
        if m in taken:
            continue
        taken.add(m)
        t_ms, state = costs(shape)
        if t_ms is None or m == n or pool.stall_total == 0.0:  # a prefix of the base order, summed left to right
            members = ranked_lanes(pool.base, pool.lru, pool.slots)[:m]
            value = sum(pool.base[members].tolist(), 0.0)
        else:
            values = pool.base + pool.stall * stall_growth(t_ms, pool.tau_ms)
            members = ranked_lanes(values, pool.lru, pool.slots)[:m]
            value = float(np.add.reduce(pool.base[members]))
        c = Candidate(shape, members, np.zeros(m, dtype=np.int64), value, pool.age_slope * m, t_ms, state)
        out.append(finish_candidate(c, pool, waiting))
    return out


@st.composite
def pools(draw):
    n = draw(st.integers(1, 64))
    floats = st.floats(0.0, 1.0, allow_nan=False)
    base = np.array(draw(st.lists(floats, min_size=n, max_size=n)))
    stall = np.array(draw(st.lists(floats, min_size=n, max_size=n)))
    lru = np.array(draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), dtype=np.int64)
    pool = LanePool(np.arange(n, dtype=np.int64), lru, np.arange(n, dtype=np.int64), base,
                    age_slope=draw(st.floats(0.0, 0.1)))
    pool.stall, pool.stall_total = stall, float(stall.sum()) + draw(st.floats(0.0, 2.0))
    pool.tau_ms = draw(st.sampled_from([1.0, 10.0, 50.0, 1000.0]))
    return pool


@settings(max_examples=300, deadline=None)
@given(pools(), st.lists(st.floats(5.0, 15.0), min_size=len(CAPACITIES), max_size=len(CAPACITIES)),
       # Mostly measured and fresh (what pruning applies to), with some stale and unknown ones.
       st.lists(st.sampled_from([CostState.FRESH] * 6 + [CostState.STALE, CostState.UNKNOWN]),
                min_size=len(CAPACITIES), max_size=len(CAPACITIES)),
       st.floats(0.0, 0.05))
def test_pruned_capacities_never_change_the_winner_or_the_stale_alternatives(pool, times, states, waiting):
    table = {decode(b): (None if st_ is CostState.UNKNOWN else t, st_)
             for b, t, st_ in zip(CAPACITIES, times, states)}
    costs = table.__getitem__
    shapes = tuple(table)
    got, want = decode_candidates(Memo(), shapes, costs, pool, waiting), reference(shapes, costs, pool, waiting)
    assert best(got).key == best(want).key
    assert best(got).members.tolist() == best(want).members.tolist()
    # Only fresh candidates are ever pruned: a funded timing refresh still sees every stale one.
    stale = lambda cs: sorted((c.key for c in cs if c.cost_state is CostState.STALE))  # noqa: E731
    assert stale(got) == stale(want)
    # What is kept is scored exactly as the reference scores it.
    assert {c.key for c in got} <= {c.key for c in want}
