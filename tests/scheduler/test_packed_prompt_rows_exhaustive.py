"""Mixed graphs with several prompt rows (docs/packed-prompt-rows.md) against exhaustive enumeration.

Every shape of a catalog with decode, prefill and mixed graphs whose prompt capacity up to R = 2 or
3 rows share, and every legal cohort of each: any subset of decoders with no prompt row, or with
the first k = 1..min(R, B) rows of the shape's prompt fill, within the shape's rows. The fill is
written out independently here: rows in value order, each the best remaining prompt for the
budget the rows before it left (work min(prompt_left, what is left)). Each cohort is scored with
the spec's objective (test_mixed_selection_exhaustive.objective: the same useful value per full
graph duration, padding earning nothing).
"""

import itertools
import math

from hypothesis import given, settings, strategies as st

from helios.graphs import GraphKind
from helios.scheduler.requests import Phase

from conftest import REQUEST_STATE, configs, decode, prefill, with_states
from mixed_helpers import mixed
from test_mixed_selection_exhaustive import objective, prompt_value, rows


def table_for(r: int) -> dict:
    return {decode(1): 8.0, decode(2): 8.6, decode(4): 9.9, prefill(64): 6.0, prefill(256): 13.0,
            mixed(2, 64, rows=min(r, 2)): 9.1, mixed(2, 256, rows=min(r, 2)): 14.2,
            mixed(4, 64, rows=r): 10.6, mixed(4, 256, rows=r): 15.5}


def fill(prompts, chunk: int, limit: int, policy, table) -> list:
    """(request row, work) of the prompt fill: value order over the budget left."""
    out, left = [], chunk
    while len(out) < limit and left > 0:
        rest = [r for r in prompts if all(r is not o for o, _ in out)]
        if not rest:
            break
        best = max(rest, key=lambda r: prompt_value(r, left, policy, table))
        out.append((best, min(left, best.prompt_left)))
        left -= out[-1][1]
    return out


def cohorts(shape, decoders, prompts, policy, table):
    """Every legal cohort of one shape: (decoders, prompt rows, their works)."""
    b = shape.batch_capacity
    if shape.kind is GraphKind.DECODE:
        return [(sub, (), None) for n in range(1, min(b, len(decoders)) + 1)
                for sub in itertools.combinations(decoders, n)]
    if shape.kind is GraphKind.PREFILL:
        return [((), sub, None) for n in range(1, min(b, len(prompts)) + 1) for sub in itertools.combinations(prompts, n)]
    packed = fill(prompts, shape.prefill_capacity, shape.prompt_rows, policy, table)
    out = []
    for k in range(len(packed) + 1):
        pro, works = tuple(r for r, _ in packed[:k]), [w for _, w in packed[:k]]
        for n in range(0, min(b - k, len(decoders)) + 1):
            out += [(sub, pro, works) for sub in itertools.combinations(decoders, n) if sub or pro]
    return out


def brute_force(s, policy, table):
    best = None
    live = [r for r in rows(s) if r.phase is not Phase.DONE]
    decoders = [r for r in live if r.phase is Phase.DECODE]
    prompts = [r for r in live if r.phase is Phase.PREFILL]
    for shape in table:
        for dec, pro, works in cohorts(shape, decoders, prompts, policy, table):
            v = objective(s, shape, dec, pro, policy, table, works)
            if best is None or v > best[0] + 1e-12 * abs(v):
                best = (v, shape)
    return best


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([2, 3]), st.lists(REQUEST_STATE, min_size=1, max_size=6),
       st.sampled_from([configs(), configs(decode_age_price=2.0), configs(token_fairness=0.0),
                        configs(fairness_time_scale=True), configs(served_stall_pricing=False),
                        configs(deferred_step_pricing=False)]))
def test_every_legal_cohort_with_several_prompt_rows_against_exhaustive_enumeration(r, states, policy):
    table = table_for(r)
    s = with_states(table, states, policy)
    p = s.plan()
    expected, _ = brute_force(s, policy, table)
    got = p.selection_value_rate() * math.exp(p.selection_log_scale())
    assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
    lanes = list(p.lanes)
    dec = [s.request_row(l.handle) for l in lanes if l.prompt_tokens == 0]
    pro = [s.request_row(l.handle) for l in lanes if l.prompt_tokens > 0]
    works = [l.prompt_tokens for l in lanes if l.prompt_tokens > 0]
    assert math.isclose(objective(s, p.shape, dec, pro, policy, table, works if p.shape.kind is GraphKind.MIXED
                                  else None), expected, rel_tol=1e-9, abs_tol=1e-9)
    if p.shape.kind is GraphKind.MIXED:
        # The packed budget: at most R prompt rows, first in the lane list, sharing C tokens.
        assert len(pro) <= p.shape.prompt_rows and p.prefill_rows == tuple(range(len(pro)))
        assert sum(works) <= p.shape.prefill_capacity
        for lane, row in zip(lanes, pro):  # a row publishes its first token only when it finishes
            assert lane.output_rows == (lane.prompt_tokens == row.prompt_left)


def test_one_prompt_row_is_the_spec_enumeration():
    """With R = 1 the fill is the spec's best prompt row, min(prompt_left, C)."""
    s = with_states(table_for(1), [(False, 0.0, 0.0, 0, 40), (False, -1.0, 0.0, 0, 300)], configs())
    prompts = [r for r in rows(s) if r.phase is Phase.PREFILL]
    packed = fill(prompts, 256, 1, configs(), table_for(1))
    assert len(packed) == 1 and packed[0][1] == min(packed[0][0].prompt_left, 256)
