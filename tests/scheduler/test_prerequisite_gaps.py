"""The spec's two lookahead rules that a black-box probe found missing (issue 45), checked under
the spec preset (conftest.make's default):

- "Unused prerequisite capacity can advance additional rows at no extra physical cost; equal
  value rates prefer advancing more requests": a restore graph of batch four with three waiting
  restores all three, though the following graph serves two;
- "For a prerequisite followed by mixed inference, the prompt can be absent, already ready, or
  enabled by the prerequisite": a restore is scored by its sequence with a mixed graph.

The exact two-stage arithmetic of each case is checked against every subset in test_lookahead.py.
"""

from __future__ import annotations

import math

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.lookahead import two_stage
from helios.scheduler.policy import Budget
from helios.scheduler.prerequisites import restore_candidates
from helios.scheduler.selection import cost_lookup, current_view, derived
from helios.scheduler.service import log_prices

from conftest import MS, decode, make, prefill, spec, step

SNAP = GraphShape(GraphKind.SNAPSHOT, 1)


def test_a_restore_of_batch_four_restores_all_three_waiting():
    table = {decode(1): 10, decode(2): 12, prefill(64): 30, prefill(64, 2): 40,
             GraphShape(GraphKind.RESTORE, 4): 3, SNAP: 2}
    s = make(table)
    handles = {s.admit(spec(prompt=300, out=2, cached_tokens=250, endpoints=(250,)), 0) for _ in range(3)}
    plan = s.plan()
    assert plan.shape.kind is GraphKind.RESTORE
    # The following prefill graph has two rows: the third restore rides the spare restore row.
    assert set(plan.handles) == handles and plan.estimated_duration_ns == 3 * MS


def _restored_prompt_among_decoders(table):
    """Three running decoders and one pending restore with 50 prompt tokens left."""
    s = make(table)
    running = [s.admit(spec(prompt=64, out=40), 0) for _ in range(3)]
    fence = 0
    while any(s.request_row(h).output_done == 0 for h in running):
        fence += 1
        step(s, s.plan(), fence)
    restored = s.admit(spec(prompt=300, out=4, cached_tokens=250, endpoints=(250,)), s.now_ns)
    return s, restored


def test_a_restore_is_scored_by_its_sequence_with_a_mixed_graph():
    """The restored prompt takes the mixed graph's prompt row next to the three running decoders:
    the restore's score is that sequence's exact rate (the best case here), above every sequence
    without mixed graphs (a prefill graph that leaves the decoders out)."""
    m4 = GraphShape(GraphKind.MIXED, 4, 1, prefill_capacity=64)
    rest = GraphShape(GraphKind.RESTORE, 1)
    table = {decode(1): 10, decode(4): 12, prefill(64): 30, m4: 31, rest: 1, SNAP: 2}
    s, restored = _restored_prompt_among_decoders(table)
    view = current_view(s.selection, s.now_ns)
    coeff = derived(s)[2]
    costs = cost_lookup(s.costs, s.now_ns)
    budget = Budget(s.resources.free_slots, s.resources.free_pages)
    pages = lambda rows: s.resources.extent_pages_of(s.requests, rows)  # noqa: E731

    def score(mixed_shapes):
        (c,) = restore_candidates(s.state, s.requests, costs, s.shapes.prefill, s.shapes.decode_steps, coeff,
                                  view.log_scale, view.waiting, budget, pages, None, view.decode, mixed_shapes)
        return c

    with_mixed, without = score((m4,)), score(())
    # The "enabled by the prerequisite" case, assembled by hand: the prompt row's 50 tokens and
    # first token, the three decoders' values and age credit at the sequence's end.
    prompt = _chunk_value(s, restored, view.log_scale, coeff)
    t_ms, f_ms = 1.0, 31.0
    decoders = view.decode.base + view.decode.age_slope * (t_ms + f_ms)
    expected = two_stage([], decoders, (), 1, 4, t_ms, f_ms, view.waiting, prompt, True)
    assert with_mixed.score == expected.score and set(with_mixed.members.tolist()) == {0}
    assert with_mixed.score > without.score


def _chunk_value(s, handle, log_scale, coeff) -> float:
    """The scaled value of the restored prompt's 50-token chunk and its first output token."""
    row = s.requests.row(handle)
    lp, lo = log_prices(s.requests.log_x[[row]].copy(), s.requests.log_z[[row]].copy(), coeff)[:2]
    return math.exp(lp[0] - log_scale) * 50 + math.exp(lo[0] - log_scale)
