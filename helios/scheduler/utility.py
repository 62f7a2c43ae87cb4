"""Value arithmetic: the spec's selection objective, reference intervals and cohorts.

For a ready inference graph of duration T (ms):

    score = ( sum_lanes v_i + sum_served_decoders c_i * sigma_i * (A_i + T) ) / T
            - T/2 * sum_active_decoders c_i

v_i is the expected priced token and delivery service of lane i, A_i the output age of a
decoder, sigma_i its batch-feasible reference interval. Every term is multiplied by one
shared factor e^(-L) per decision so that large prices stay representable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

try:
    # np.count_nonzero(a) is this C function behind a Python dispatch wrapper. Measured (issue 45,
    # numpy 2.4, 64-element masks): 140 ns against 480 ns a call, about ten calls per decision:
    # 3.4 us, 2.3% of a 145-us decision at 64 active. Kept for that; the public function is the
    # fallback on another numpy layout.
    from numpy._core.multiarray import count_nonzero
except ImportError:
    count_nonzero = np.count_nonzero
# np.lexsort's C implementation without its __array_function__ dispatch (the same sort): 1.2 us
# less per call (4.5 against 5.7 us on 64 lanes), once or twice per decision.
_lexsort = getattr(np.lexsort, "_implementation", np.lexsort)


def reference_interval_ms(family_costs: Iterable[tuple[int, float]], streams: int, family: int) -> float | None:
    """sigma = K * T / min(B, k) for the measured graph minimizing T / min(B, k).

    K counts delivery-bearing streams, k the streams of this family. Unmeasured graphs are
    skipped: no interval is invented, so None means the age credit is unavailable.
    """
    if streams <= 0 or family <= 0:
        return None
    best = None
    for batch, t_ms in family_costs:
        per_stream = t_ms / min(batch, family)
        if best is None or per_stream < best:
            best = per_stream
    return None if best is None else streams * best


_MISS = object()


class DecodeReference:
    """The measured delivery-bearing graphs as (batch, t_ms), with what planning derives from them
    and nothing else: sigma(n) (reference_interval_ms for n streams of one family) and steps[m] (the
    shortest such graph with room for m rows, None when none is). Built once per cost-table version
    (selection.derived), so a decision looks both up instead of recomputing them."""

    __slots__ = ("costs", "steps", "_sigma")

    def __init__(self, costs: Iterable[tuple[int, float]]):
        self.costs = tuple(costs)
        # steps[m] = min over b >= m of T: suffix minima over the capacities, largest first (a
        # cost table version moves at most completions, so this runs often: O(n log n), not 65n).
        fastest: dict[int, float] = {}
        for b, ms in self.costs:
            fastest[b] = min(fastest.get(b, ms), ms)
        # Each capacity, largest first, fills the counts above it (up to the previous one) with
        # the minimum over the larger capacities, then joins that minimum.
        steps, best, upper = [None] * 65, None, 64
        for cap in sorted(fastest, reverse=True):
            if cap < upper:
                steps[cap + 1:upper + 1] = [best] * (upper - cap)
                upper = cap
            best = fastest[cap] if best is None else min(best, fastest[cap])
        steps[:upper + 1] = [best] * (upper + 1)
        self.steps = tuple(steps)
        self._sigma: dict[int, float | None] = {}

    def sigma(self, streams: int) -> float | None:
        hit = self._sigma.get(streams, _MISS)
        if hit is _MISS:
            hit = self._sigma[streams] = reference_interval_ms(self.costs, streams, streams)
        return hit


def rate_score(value: float, served_age_slope: float, t_ms: float, waiting: float) -> float:
    """(value + slope*T)/T - T/2 * waiting, where slope = sum of c*sigma over served lanes.

    value already holds sum v_i + sum c*sigma*A_i; waiting is sum c over active decoders.
    """
    return (value + served_age_slope * t_ms) / t_ms - 0.5 * t_ms * waiting


def deferred_rate_score(value: float, slope: float, t_ms: float, waiting: float, left_value: float,
                        left_slope: float, step_ms: float | None) -> float:
    """rate_score of a candidate followed by the step that serves the decoders it leaves out.

    Their next token is not lost, only deferred: a later graph of at least step_ms (the fastest
    delivery-bearing graph with room for them) must still produce it. So the candidate is scored
    as that sequence, (value + left_value) over T + step, instead of as if its T were the only
    machine time its choice costs. Unmeasured step (None): the plain rate_score.
    """
    if step_ms is None:
        return rate_score(value, slope, t_ms, waiting)
    # Served lanes earn their age credit at T, the deferred ones at T + step; the common waiting
    # cost runs over the whole sequence.
    total = t_ms + step_ms
    return (value + slope * t_ms + left_value + left_slope * total) / total - 0.5 * total * waiting


def stall_growth(t_ms: float, tau_ms: float) -> float:
    """e^(T/tau) - 1: how much an unserved request's fairness and delivery prices grow over T.

    The exponent is capped where e^x still fits a double; the shared scale keeps the factor it
    multiplies at most one per lane, so the product stays finite and the comparison unchanged.
    """
    return math.expm1(min(t_ms / tau_ms, 700.0))


def stall_cost(excluded: float, t_ms: float, tau_ms: float) -> float:
    """Value rate lost by the decoders a candidate leaves out: their next step's growing value
    (`excluded`, scaled) times the growth of their prices over T, per ms of the candidate."""
    return excluded * stall_growth(t_ms, tau_ms) / t_ms


def served_cost(growing: float, t_ms: float, step_ms: float | None, tau_ms: float) -> float:
    """Value rate owed to decoders a candidate serves but delays, per ms of the candidate.

    `growing`: their scaled f/x + g/z; `step_ms`: the measured duration of the fastest decode graph
    that could serve them alone. Their token arrives at T instead of at that step, so for the
    excess T - step they are stalled exactly as a decoder left out: their prices grow by
    e^((T - step)/tau) - 1. A graph no longer than their own step owes nothing.
    """
    if step_ms is None or t_ms <= step_ms:
        return 0.0
    return growing * stall_growth(t_ms - step_ms, tau_ms) / t_ms


def ranked_lanes(values: np.ndarray, lru: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Lane order by value, then less recently served, then slot: best first.

    Cohorts for a graph whose duration does not depend on membership take a prefix of this
    order: the highest additive lane values.
    """
    return _lexsort((slots, lru, -values))


def prefix_sums(values: np.ndarray) -> np.ndarray:
    out = np.empty(len(values) + 1)
    out[0] = 0.0
    np.cumsum(values, out=out[1:])
    return out


def shared_log_scale(*log_arrays: np.ndarray) -> float:
    """The decision's shared scale: the largest finite log price among its lanes (else 0)."""
    best = -math.inf
    for arr in log_arrays:
        if len(arr):
            m = float(arr[arr.argmax()])  # arr.max(), NaN included, without a ufunc reduction's dispatch
            if m > best:
                best = m
    return best if math.isfinite(best) else 0.0
