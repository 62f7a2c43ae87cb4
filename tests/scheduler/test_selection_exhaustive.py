"""Selection against exhaustive enumeration (spec: "Useful service and selection").

For fixed graph durations lane values are additive, so the best cohort of each shape is its
highest additive lane values. We check that claim, and the whole decision, by enumerating
every shape and every request subset and scoring each with the spec's objective written out
independently here.

Multi-row prefill graphs pack their rows (helios.scheduler.prefill): a row may take capacity the
others leave unused, so its value depends on the cohort. There the enumeration brackets the
decision: at least the best cohort with rows capped at C (packing never loses value), at most
the best over every subset and every order of handing out the unused capacity.
"""

import itertools
import math

from hypothesis import given, settings, strategies as st

from helios.scheduler.requests import Phase

from conftest import MS, REQUEST_STATE, decode, prefill, with_states
from conftest import configs

TABLE = {decode(1): 8.0, decode(2): 8.6, decode(4): 9.9, prefill(64): 6.0, prefill(256): 13.0,
         prefill(64, 2): 7.5, prefill(64, 4): 10.0}


def rows(s):
    return [s.request_row(h) for h in s.requests]


def packed_works(shape, lefts):
    """The packing rule, written out: each row min(left, C), then the unused capacity to the rows
    in order, keeping sum <= B x C and sum of squares <= B x C^2."""
    b, c = shape.batch_capacity, shape.token_capacity
    works = [min(left, c) for left in lefts]
    for i, left in enumerate(lefts):
        while works[i] < left and sum(works) < b * c and \
                sum(w * w for w in works) - works[i] ** 2 + (works[i] + 1) ** 2 <= b * c * c:
            works[i] += 1
    return works


def objective(s, shape, subset, policy, works=None):
    """The spec's score with priced stalls, unscaled, for one shape and one cohort (`works`: its prompt tokens per
    row; by default min(C, prompt left))."""
    f, g, beta, c = policy.token_fairness, policy.delivery_fairness, policy.output_token_value, policy.decode_age_price
    t = TABLE[shape]
    active = [r for r in rows(s) if r.phase is Phase.DECODE]
    k = len(active)
    sigma = None
    if k:
        sigma = k * min(TABLE[d] / min(d.batch_capacity, k) for d in TABLE if d.kind.value == "decode")
    value = 0.0
    if works is None:
        works = [min(shape.token_capacity, r.prompt_left) for r in subset]
    for r, work in zip(subset, works):
        x = math.exp(r.log_x)
        if shape.kind.value == "decode":
            z = None if r.log_z is None else math.exp(r.log_z)
            value += beta + f / x + (g / z if z else 0.0)
            age = (s.now_ns - r.last_publication_ns) / MS
            value += c * sigma * (age + t)
        else:
            value += (1 + f / x) * work + ((beta + f / x) if work == r.prompt_left else 0.0)
    # Priced stalls (docs/scheduling-utility.md): every active decoder left out owes the growth
    # of its fairness and delivery prices over T.
    stalled = 0.0
    if policy.stall_pricing:
        served = {r.handle for r in subset} if shape.kind.value == "decode" else set()
        for r in active:
            if r.handle not in served:
                stalled += f / math.exp(r.log_x) + (g / math.exp(r.log_z) if r.log_z is not None else 0.0)
    score = value / t - t / 2 * c * k
    # The deferred step (docs/scheduling-utility.md, section 4) for a decode cohort that leaves decoders
    # out: scored as the sequence with the fastest decode graph with room for them, their values at its
    # end. Prefill graphs keep the plain score: it applies to them only when mixed graphs could carry the
    # decoders (this catalog has none); test_mixed_selection_exhaustive.py covers that.
    left = [r for r in active if r.handle not in {q.handle for q in subset}]
    steps = [TABLE[d] for d in TABLE if d.kind.value == "decode" and d.batch_capacity >= len(left)]
    if policy.deferred_step_pricing and shape.kind.value == "decode" and left and steps:
        total = t + min(steps)
        for r in left:
            z = None if r.log_z is None else math.exp(r.log_z)
            age = (s.now_ns - r.last_publication_ns) / MS
            value += beta + f / math.exp(r.log_x) + (g / z if z else 0.0) + c * sigma * (age + total)
        score = value / total - total / 2 * c * k
    return score - stalled * math.expm1(t / policy.adaptation_ms) / t


def packed_upper_bound(s, policy):
    """The best score over every shape, subset and order of handing out unused capacity."""
    best = None
    live = [r for r in rows(s) if r.phase is not Phase.DONE]
    for shape in TABLE:
        if not (shape.kind.value == "prefill" and shape.batch_capacity > 1):
            continue
        pool = [r for r in live if r.phase is Phase.PREFILL]
        for n in range(1, min(shape.batch_capacity, len(pool)) + 1):
            for subset in itertools.permutations(pool, n):
                v = objective(s, shape, subset, policy, packed_works(shape, [r.prompt_left for r in subset]))
                best = v if best is None else max(best, v)
    return best


def brute_force(s, policy):
    best = None
    live = [r for r in rows(s) if r.phase is not Phase.DONE]
    for shape in TABLE:
        if shape.kind.value == "decode":
            pool = [r for r in live if r.phase is Phase.DECODE]
        else:
            pool = [r for r in live if r.phase is Phase.PREFILL]
        for n in range(1, min(shape.batch_capacity, len(pool)) + 1):
            for subset in itertools.combinations(pool, n):
                v = objective(s, shape, subset, policy)
                if best is None or v > best[0] + 1e-12 * abs(v):
                    best = (v, shape, {r.handle for r in subset})
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(REQUEST_STATE, min_size=1, max_size=6), st.sampled_from([configs(), configs(decode_age_price=2.0),
                                                                       configs(token_fairness=0.0),
                                                                       # graphs of ~2 tau: stalls dominate
                                                                       configs(adaptation_ms=4.0),
                                                                       configs(stall_pricing=False),
                                                                       configs(deferred_step_pricing=False)]))
def test_plan_matches_exhaustive_enumeration(states, policy):
    s = with_states(TABLE, states, policy)
    p = s.plan()
    expected, shape, handles = brute_force(s, policy)
    got = p.selection_value_rate() * math.exp(p.selection_log_scale())
    cohort = [s.request_row(h) for h in p.handles]
    # The plan's own shape and cohort, scored independently, give its score.
    chosen = objective(s, p.shape, cohort, policy, [lane.prompt_tokens for lane in p.lanes])
    assert math.isclose(chosen, got, rel_tol=1e-9, abs_tol=1e-9)
    packed = p.shape.kind.value == "prefill" and p.shape.batch_capacity > 1
    if packed:  # the rows follow the packing rule, in the plan's order
        assert [lane.prompt_tokens for lane in p.lanes] == packed_works(p.shape, [r.prompt_left for r in cohort])
    upper = packed_upper_bound(s, policy)
    if upper is None or upper <= expected:  # packing cannot matter: exactly the optimum
        assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
    else:
        assert got >= expected - 1e-9 * abs(expected) and got <= upper + 1e-9 * abs(upper)
