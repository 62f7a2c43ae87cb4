"""Candidates and selection for ordinary prefill, scored prefill and decode graphs.

Every loaded physical capacity competes. For each shape the cohort is a prefix of the lanes
ranked by additive value (the duration does not depend on membership), padded shapes that
serve the same cohort with the same logical work are discarded, and the winner maximizes
the value rate with the spec's tie-break order. Prefill candidates (packed rows) are in
prefill.py.
"""

from __future__ import annotations

import math
from math import expm1
from dataclasses import dataclass, field
from itertools import accumulate
from operator import neg

import numpy as np

from helios.graphs import GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.memo import Memo, by_identity
from helios.scheduler.utility import deferred_rate_score, ranked_lanes, rate_score, stall_cost, stall_growth


@dataclass(frozen=True, slots=True)
class Deferred:
    """The active decoders' next step, which a candidate that leaves some out defers."""

    value: float  # summed scaled lane values (the decode pool's base)
    count: int
    slope: float  # c*sigma per decoder
    steps: tuple  # steps[m]: the fastest measured delivery-bearing graph with room for m (None: none)

    def step(self, left: int) -> float | None:
        """The step that serves `left` deferred decoders (None: none is measured, or none left)."""
        return self.steps[min(left, len(self.steps) - 1)] if left > 0 else None

    def score(self, value: float, slope: float, t_ms: float, waiting: float, served: int,
              served_value: float) -> float:
        """The candidate's rate score as the sequence with the step serving the rest
        (utility.deferred_rate_score); its plain rate_score when it serves every decoder."""
        left = self.count - served
        if left <= 0:
            return rate_score(value, slope, t_ms, waiting)
        return deferred_rate_score(value, slope, t_ms, waiting, self.value - served_value, self.slope * left,
                                   self.step(left))


@dataclass(slots=True)
class LanePool:
    """Lanes that one graph family could serve, with per-lane arrays (one row per request)."""

    handles: np.ndarray
    lru: np.ndarray
    slots: np.ndarray  # physical slot, or a large sentinel for requests without one
    base: np.ndarray  # scaled value independent of T (tokens, deliveries, c*sigma*A)
    age_slope: float = 0.0  # scaled c*sigma per served lane (decoders only)
    # Prefill only:
    log_prefill: np.ndarray | None = None
    first_token: np.ndarray | None = None  # scaled value of the first output token
    prompt_left: np.ndarray | None = None
    to_endpoint: np.ndarray | None = None
    resident: np.ndarray | None = None
    pages: np.ndarray | None = None
    # Speculative only (n x depth matrices, 0-based draft positions):
    extra_value: np.ndarray | None = None  # scaled value of one more accepted token
    survival_alpha: np.ndarray | None = None  # s_d ** alpha, for scoring
    survival: np.ndarray | None = None  # s_d, for expected service
    forecast: np.ndarray | None = None  # monotone joint-prefix confidence forecast
    limit: np.ndarray | None = None  # rows a lane may commit (output and context limits)
    # Stall pricing (docs/scheduling-utility.md): scaled growing price of each decode lane's next
    # step (decode pool only), their sum over every active decoder, and tau.
    stall: np.ndarray | None = None
    stall_total: float = 0.0
    # served_stall_pricing (decode pool): steps[m], the measured duration of the fastest
    # delivery-bearing graph with room for m decoders (None: unmeasured); a longer graph that
    # serves them delays them.
    steps: tuple | None = None
    tau_ms: float = 1.0
    # Prompt pools only: the off-by-default duration bound's headroom (bound - the oldest decoder's age
    # - the fastest decode step; planning._stall_headroom) and that step, which a mixed graph serving
    # every decoder gives back (their token comes at its end, not a step later).
    stall_bound_ms: float | None = None
    stall_step_ms: float = 0.0
    # deferred_step_pricing (docs/scheduling-utility.md section 4): the decode pool's lanes as one
    # deferred step, on the decode pool and every prompt pool: their summed value, their count,
    # the age slope each adds, and steps[m] (as above). None when off or no decoder is active.
    deferred: Deferred | None = None
    # Prefill only, with image requests (vision.py): clip(idx, works) cuts each lane's work to its
    # largest legal chunk end (no split image, no unpopulated window). None: every end is legal.
    clip: object = None


@dataclass(slots=True)
class Candidate:
    shape: GraphShape
    members: np.ndarray  # indices into the pool, best first
    works: np.ndarray  # prompt tokens per member (zeros for decode)
    value: float
    slope: float
    t_ms: float | None
    cost_state: CostState
    score: float = 0.0
    lru: int = 0
    padding: int = 0
    key: tuple = field(default=())
    rows: np.ndarray | None = None  # speculative: predicted (device) or exact (host) rows per lane
    ceilings: np.ndarray | None = None  # speculative: min(D + 1, W, request limit)
    device: bool = False  # device (confidence) allocation
    dedupe: tuple = field(default=())  # speculative: (cohort, rows, depth), the padding-dominance key


@dataclass(frozen=True, slots=True)
class Budget:
    free_slots: int
    free_pages: int


# ndarray.sum() of a 1-D array is this reduction behind a Python wrapper: the same sum, cheaper.
_sum = np.add.reduce

def _shape_key(shape: GraphShape) -> tuple:
    """What the tie-break reads from a shape: (is_prefill, token_capacity, target_capacity,
    negated capacities)."""
    return shape.kind.is_prefill, shape.token_capacity, shape.target_capacity, tuple(map(neg, shape.capacities()))


def _by_capacity(shapes) -> tuple:
    return tuple(sorted(shapes, key=lambda s: s.batch_capacity))


_ALONE = np.zeros(1, dtype=np.int64)  # a lone lane's order (what ranked_lanes returns for it)
_ALONE.setflags(write=False)


def _cohorts(memo: Memo, shapes, n: int) -> tuple:
    """(shape, m) in capacity order for each capacity whose cohort m = min(B, n) no smaller
    capacity already serves, once per (shape tuple, lane count). The entry keeps the ordered
    tuple alive, so its id cannot be reused while cached."""
    ordered = by_identity(memo.by_capacity, shapes, _by_capacity, 256)
    hit = memo.cohorts.get((id(ordered), n))
    if hit is None or hit[0] is not ordered:
        taken, cohorts = set(), []
        for shape in ordered:
            m = min(shape.batch_capacity, n)
            if m not in taken:  # else a smaller capacity already serves exactly this cohort
                taken.add(m)
                cohorts.append((shape, m))
        if len(memo.cohorts) >= 4096:
            memo.cohorts.clear()
        hit = memo.cohorts[(id(ordered), n)] = (ordered, tuple(cohorts))
    return hit[1]


def finish_candidate(c: Candidate, pool: LanePool, waiting: float, lru: int | None = None,
                     used: int | None = None, deferred: bool = False,
                     served_base: float | None = None, memo: Memo | None = None) -> Candidate:
    """`lru`: the members' most recent service, `used`: the tokens of its rows (prefill), when
    the caller already knows them. `deferred`: a decode cohort or speculative round, scored with
    the step that serves the decoders it leaves out; `served_base`: its members' base, when its
    value holds more (a round's draft gains). `memo`: the scheduler's Memo, which keeps the
    shape's tie-break fields (the families that build many candidates per decision pass it)."""
    n = len(c.members)
    is_prefill, token_capacity, target_capacity, order_key = (
        _shape_key(c.shape) if memo is None else by_identity(memo.keys, c.shape, _shape_key))
    if c.t_ms is None:
        # Optimistic work score: an unknown duration ranks by expected useful value alone.
        c.score = c.value
    else:
        if is_prefill and pool.deferred is not None:  # a prefill graph serves no decoder
            c.score = pool.deferred.score(c.value, c.slope, c.t_ms, waiting, 0, 0.0)
        elif deferred and pool.deferred is not None:
            c.score = pool.deferred.score(c.value, c.slope, c.t_ms, waiting, n,
                                          c.value if served_base is None else served_base)
        else:
            c.score = rate_score(c.value, c.slope, c.t_ms, waiting)
        if pool.stall_total > 0.0:
            served = float(_sum(pool.stall[c.members])) if pool.stall is not None and n else 0.0
            c.score -= stall_cost(pool.stall_total - served, c.t_ms, pool.tau_ms)
    c.lru = lru if lru is not None else max(pool.lru[c.members].tolist()) if n else 0
    if used is None:
        if is_prefill:
            used = sum(c.works.tolist())  # int sums on lists: cheaper than a numpy reduction here
        elif c.rows is not None:
            used = sum(c.rows.tolist())
        else:
            used = n * token_capacity
    c.padding = target_capacity - used
    # Unknown first; then value (rate); then shorter known time, more requests served,
    # less recently used requests, smaller padding; finally a stable shape order.
    c.key = (c.t_ms is None, c.score, -(c.t_ms or 0.0), n, -c.lru, -c.padding, order_key)
    return c


def decode_candidates(memo: Memo, shapes, costs, pool: LanePool, waiting: float) -> list[Candidate]:
    """Every batch capacity competes with the top-B lanes; same-cohort padding is pruned, and so is
    a measured capacity whose score provably cannot reach another candidate's (_score_bound)."""
    n = len(pool.handles)
    if n == 0:
        return []
    order = ranked_lanes(pool.base, pool.lru, pool.slots) if n > 1 else _ALONE  # one lane ranks first
    # Running sums as a list (indexed per capacity below): numpy's add.accumulate adds left to
    # right as itertools.accumulate does, so the sums are the same floats, in one C loop.
    sums = [0.0, *np.add.accumulate(pool.base[order]).tolist()]
    recent = None  # cohorts' most recent service, computed when a cohort below n needs it
    works = np.zeros(n, dtype=np.int64)
    # With stall pricing a lane's worth at duration T is base + stall * (e^(T/tau) - 1): the
    # best cohort of a capacity below the lane count is a prefix of that order instead.
    stalled = pool.stall is not None and pool.stall_total > 0.0 and n > 1
    out: list[Candidate | None] = []
    reranked = []  # (position in out, shape, m, t_ms, state): cohorts needing their own order
    best_known = -math.inf  # the best score among exact candidates with a known duration
    for shape, m in _cohorts(memo, shapes, n):
        t_ms, state = costs(shape)
        if stalled and m < n and t_ms is not None:
            reranked.append((len(out), shape, m, t_ms, state))
            out.append(None)
            continue
        if m == n:
            lru = max(pool.lru.tolist())
        else:
            if recent is None:  # cohorts are prefixes of one order: a running maximum
                recent = np.maximum.accumulate(pool.lru[order]).tolist()
            lru = recent[m - 1]
        c = finish_candidate(Candidate(shape, order[:m], works[:m], sums[m], pool.age_slope * m, t_ms, state),
                             pool, waiting, lru, deferred=True, memo=memo)
        if t_ms is not None and c.score > best_known:
            best_known = c.score
        out.append(c)
    if reranked:
        below = _score_bound(pool, sums, waiting)
        by_stall = None
        # Largest capacity first: it is usually the strongest incumbent for the bound.
        for i, shape, m, t_ms, state in reversed(reranked):
            # Pruning is exact only for fresh candidates: a stale one may still be chosen by a
            # funded timing refresh (exploration.refresh_choice), whatever its score.
            if state is CostState.FRESH and below(m, t_ms, best_known):
                continue
            if defers(pool, n - m):
                # A left-out lane's value still counts (at the step's end), so membership moves only
                # the stall charges: the top m by growing price for every T (mixed._stall_ranked).
                if by_stall is None:
                    by_stall = ranked_lanes(pool.stall, pool.lru, pool.slots)
                members = by_stall[:m]
            else:
                members = ranked_lanes(pool.base + pool.stall * stall_growth(t_ms, pool.tau_ms), pool.lru,
                                       pool.slots)[:m]
            c = Candidate(shape, members, works[:m], float(_sum(pool.base[members])), pool.age_slope * m, t_ms, state)
            out[i] = c = finish_candidate(c, pool, waiting, max(pool.lru[members].tolist()), deferred=True, memo=memo)
            if c.score > best_known:
                best_known = c.score
    return [c for c in out if c is not None]


def defers(pool: LanePool, left: int) -> bool:
    """Whether a cohort leaving `left` decoders out is scored with the deferred step."""
    return pool.deferred is not None and pool.deferred.step(left) is not None


def _score_bound(pool: LanePool, base_sums: list[float], waiting: float):
    """below(m, T, x): whether every m-lane cohort of the pool at duration T scores below x.

    The score is (sum base + slope m T)/T - T/2 waiting - (stall_total - sum stall) g(T)/T over the
    cohort; the m largest bases and, separately, the m largest stalls bound both sums (the stall
    term is first bounded by zero, which needs no sort and usually suffices). With the deferred
    step the first two terms are the sequence's (utility.deferred_rate_score), the same for every
    m-lane cohort. A relative margin of 1e-9 covers the rounding of the sums (about n ulps), so a
    pruned candidate's computed score is strictly below the incumbent's: the selection is the same
    as without pruning."""
    stall_sums = None
    tau, slope, total, n = pool.tau_ms, pool.age_slope, pool.stall_total, len(pool.base)

    def below(m: int, t_ms: float, x: float) -> bool:
        nonlocal stall_sums
        growth = expm1(min(t_ms / tau, 700.0))  # stall_growth(t_ms, tau), inlined: called per capacity
        if defers(pool, n - m):
            d = pool.deferred
            seq = t_ms + d.step(n - m)
            gain = (d.value + slope * m * t_ms + d.slope * (n - m) * seq) / seq
            wait = 0.5 * seq * waiting
        else:
            gain = (base_sums[m] + slope * m * t_ms) / t_ms
            wait = 0.5 * t_ms * waiting
        margin = 1e-9 * (abs(gain) + wait + total * growth / t_ms) + 1e-300
        if gain - wait + margin < x:
            return True
        if stall_sums is None:
            stall_sums = [0.0, *accumulate(np.sort(pool.stall)[::-1].tolist())]
        return gain - wait - (total - stall_sums[m]) * growth / t_ms + margin < x
    return below


def best(candidates: list[Candidate]) -> Candidate | None:
    return max(candidates, key=lambda c: c.key) if candidates else None

