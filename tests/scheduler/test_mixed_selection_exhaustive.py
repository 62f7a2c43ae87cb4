"""Mixed selection against exhaustive useful-work/time enumeration (spec: "Verification": mixed
tests compare every legal cohort against exhaustive enumeration).

Every shape of a catalog with decode, prefill and mixed graphs, and every legal cohort of each:
any subset of decoders, with or without one prompt row, within the shape's rows. Each is scored
with the spec's objective written out independently here (same useful value per full graph
duration; padding earns nothing; a prompt row consumes min(prompt_left, C)).
"""

import itertools
import math

from hypothesis import given, settings, strategies as st

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.requests import Phase

from conftest import MS, REQUEST_STATE, decode, prefill, with_states
from conftest import configs


def mixed(b, c):
    return GraphShape(GraphKind.MIXED, b, 1, 0, 0, c)


TABLE = {decode(1): 8.0, decode(2): 8.6, decode(4): 9.9, prefill(64): 6.0, prefill(256): 13.0,
         mixed(2, 64): 9.1, mixed(2, 256): 14.2, mixed(4, 64): 10.6, mixed(4, 256): 15.5}
DELIVERY = (GraphKind.DECODE, GraphKind.MIXED)


def rows(s):
    return [s.request_row(h) for h in s.requests]


def fairness(policy, table=TABLE):
    """f and g as the scheduler prices them: with `fairness_time_scale`, both scaled so that
    f <= beta * r_d, r_d the fastest delivery graph's rate (1/T) in the table."""
    f, g, beta = policy.token_fairness, policy.delivery_fairness, policy.output_token_value
    if policy.fairness_time_scale and f > 0 and beta > 0:
        r_d = max(1 / table[d] for d in table if d.kind in DELIVERY)
        k = min(1.0, beta * r_d / f)
        f, g = f * k, g * k
    return f, g


def decoder_value(s, r, t, sigma, policy, table=TABLE):
    (f, g), beta, c = fairness(policy, table), policy.output_token_value, policy.decode_age_price
    x = math.exp(r.log_x)
    z = None if r.log_z is None else math.exp(r.log_z)
    age = (s.now_ns - r.last_publication_ns) / MS
    return beta + f / x + (g / z if z else 0.0) + c * sigma * (age + t)


def prompt_value(r, chunk, policy, table=TABLE):
    """A prompt row's value when it may take up to `chunk` tokens: min(chunk, prompt_left)."""
    f, beta = fairness(policy, table)[0], policy.output_token_value
    x = math.exp(r.log_x)
    work = min(chunk, r.prompt_left)
    return (1 + f / x) * work + ((beta + f / x) if work == r.prompt_left else 0.0)


def objective(s, shape, decoders, prompt, policy, table=TABLE, works=None):
    """The spec's score with priced stalls, unscaled, for one shape, a decoder subset and an
    optional prompt row (or, with `works`, prompt rows taking those many tokens each)."""
    t = table[shape]
    active = [r for r in rows(s) if r.phase is Phase.DECODE]
    k = len(active)
    sigma = k * min(table[d] / min(d.batch_capacity, k) for d in table if d.kind in DELIVERY) if k else 0.0
    chunk = shape.prefill_capacity if shape.kind is GraphKind.MIXED else shape.token_capacity
    value = sum(decoder_value(s, r, t, sigma, policy, table) for r in decoders)
    value += sum(prompt_value(r, chunk if works is None else w, policy, table)
                 for r, w in zip(prompt, works or [None] * len(prompt)))
    # Priced stalls (issue 12, docs/scheduling-utility.md): each active decoder left out owes the
    # growth of its fairness and delivery prices over T.
    served = {r.handle for r in decoders}
    f, g = fairness(policy, table)
    stalled = sum(f / math.exp(r.log_x) + (g / math.exp(r.log_z) if r.log_z is not None else 0.0)
                  for r in active if r.handle not in served) if policy.stall_pricing else 0.0
    # Served decoders of a mixed graph that outlasts the fastest delivery graph with room for
    # them are stalled for the excess (utility.served_cost).
    delayed = 0.0
    if policy.stall_pricing and policy.served_stall_pricing and shape.kind is GraphKind.MIXED and decoders:
        step = min(table[d] for d in table if d.kind in DELIVERY and d.batch_capacity >= len(decoders))
        delayed = sum(f / math.exp(r.log_x) + (g / math.exp(r.log_z) if r.log_z is not None else 0.0)
                      for r in decoders) * math.expm1(max(0.0, t - step) / policy.adaptation_ms) / t
    score = value / t - t / 2 * policy.decode_age_price * k
    left = [r for r in active if r.handle not in served]
    if policy.deferred_step_pricing and left:
        # Deferred step (docs/scheduling-utility.md, section 4): the decoders a graph leaves out are served next by the fastest delivery graph with room for them, so the graph is
        # scored over T + that step, the deferred decoders valued at its end.
        steps = [table[d] for d in table if d.kind in DELIVERY and d.batch_capacity >= len(left)]
        if steps:
            total = t + min(steps)
            later = sum(decoder_value(s, r, total, sigma, policy, table) for r in left)
            score = (value + later) / total - total / 2 * policy.decode_age_price * k
    return score - stalled * math.expm1(t / policy.adaptation_ms) / t - delayed


def cohorts(shape, decoders, prompts):
    """Every legal cohort of one shape: (decoders, prompt rows)."""
    b = shape.batch_capacity
    if shape.kind is GraphKind.DECODE:
        return [(sub, ()) for n in range(1, min(b, len(decoders)) + 1) for sub in itertools.combinations(decoders, n)]
    if shape.kind is GraphKind.PREFILL:
        return [((), sub) for n in range(1, min(b, len(prompts)) + 1) for sub in itertools.combinations(prompts, n)]
    out = []
    for p in [()] + [(r,) for r in prompts]:  # at most one prompt row
        room = b - len(p)
        for n in range(0, min(room, len(decoders)) + 1):
            out += [(sub, p) for sub in itertools.combinations(decoders, n) if sub or p]
    return out


def brute_force(s, policy):
    best, count = None, 0
    live = [r for r in rows(s) if r.phase is not Phase.DONE]
    decoders = [r for r in live if r.phase is Phase.DECODE]
    prompts = [r for r in live if r.phase is Phase.PREFILL]
    for shape in TABLE:
        for dec, pro in cohorts(shape, decoders, prompts):
            count += 1
            v = objective(s, shape, dec, pro, policy)
            if best is None or v > best[0] + 1e-12 * abs(v):
                best = (v, shape)
    return best, count


def build(states, policy):
    return with_states(TABLE, states, policy)


@settings(max_examples=200, deadline=None)
@given(st.lists(REQUEST_STATE, min_size=1, max_size=6),
       st.sampled_from([configs(), configs(decode_age_price=2.0), configs(token_fairness=0.0),
                        configs(fairness_time_scale=True), configs(served_stall_pricing=False),
                        configs(deferred_step_pricing=False)]))
def test_every_legal_mixed_cohort_against_exhaustive_enumeration(states, policy):
    s = build(states, policy)
    p = s.plan()
    (expected, _), _ = brute_force(s, policy)
    got = p.selection_value_rate() * math.exp(p.selection_log_scale())
    assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
    # The plan's own shape and cohort, scored independently, reach the same optimum.
    lanes = list(p.lanes)
    dec = [s.request_row(l.handle) for l in lanes if l.prompt_tokens == 0]
    pro = [s.request_row(l.handle) for l in lanes if l.prompt_tokens > 0]
    assert math.isclose(objective(s, p.shape, dec, pro, policy), expected, rel_tol=1e-9, abs_tol=1e-9)
    if p.shape.kind is GraphKind.MIXED:
        assert p.requires_feedback  # a mixed submission needs completion feedback
        assert len(pro) <= 1 and p.prefill_row == (0 if pro else None)
        for lane in lanes[:len(pro)]:  # the prompt row's work: its tail fits, or the capacity
            left = s.request_row(lane.handle).prompt_left
            assert lane.prompt_tokens == min(left, p.shape.prefill_capacity)
            assert lane.output_rows == (lane.prompt_tokens == left)


def test_enumeration_size():
    """The brute force's size at the largest drawn population (six requests), three decoders
    and three prompts: decode 3 + 6 + 7, prefill 2 x 3, mixed per prompt capacity B=2: 6
    decode-only + 3 x 4 with a prompt row, B=4: 7 + 3 x 8; in all 120 (shape, cohort) pairs."""
    s = build([(True, 0.0, 0.0, 10, 50)] * 3 + [(False, 0.0, 0.0, 0, 100)] * 3, configs())
    _, count = brute_force(s, configs())
    assert count == 16 + 6 + 2 * (18 + 31) == 120
