"""Packed prefill rows (helios.scheduler.prefill): rows of a multi-row prefill graph pack by
prefix sums of their own lengths within B x C, the engine's contract for prefill plans."""

import math

from hypothesis import given, settings, strategies as st

from helios.graphs import GraphKind

from conftest import MS, Driver, FixedCosts, make, prefill, spec

TABLE = {prefill(64): 6.0, prefill(256): 11.0, prefill(1024): 30.0,
         prefill(64, 4): 10.5, prefill(256, 4): 32.0, prefill(64, 16): 27.0}


def test_unused_capacity_goes_to_the_long_row_in_rank_order():
    table = {prefill(256, 4): 12.0}
    s = make(table)
    long = s.admit(spec(prompt=2000), 0)
    short = [s.admit(spec(prompt=30), 0) for _ in range(3)]
    p = s.plan()
    works = dict(zip(p.handles, (l.prompt_tokens for l in p.lanes)))
    assert all(works[h] == 30 for h in short)
    # The tokens (1024 - 3 x 30 = 934 left) would allow more; the attention work of full
    # occupancy, 4 x 256^2, bounds the long row at isqrt(4 x 256^2 - 3 x 30^2) = 509 > C.
    assert works[long] == 509 == math.isqrt(4 * 256 ** 2 - 3 * 30 ** 2)
    assert p.lanes[p.handles.index(long)].output_rows == 0
    assert p.padding() == 1024 - 509 - 90


def test_a_lone_row_takes_at_most_the_attention_bound():
    s = make({prefill(64, 16): 27.0})
    s.admit(spec(prompt=5000), 0)
    p = s.plan()
    # 16 x 64^2 bounds the squared length: one row of at most 256 tokens.
    assert p.lanes[0].prompt_tokens == 256 == math.isqrt(16) * 64


def test_single_row_graphs_are_unchanged():
    s = make({prefill(256): 11.0})
    s.admit(spec(prompt=5000), 0)
    assert s.plan().lanes[0].prompt_tokens == 256


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=12), st.integers(0, 2 ** 16))
def test_every_prefill_plan_meets_the_engine_contract(prompts, seed):
    s = make(TABLE)
    d = Driver(s, FixedCosts(TABLE))
    handles = [s.admit(spec(prompt=n, out=1), 0) for n in prompts]
    for _ in range(200):
        p = d.run_one()
        if p is None:
            break
        if p.shape.kind is GraphKind.PREFILL:
            works = p.lanes.prompt_tokens.tolist()
            b, c = p.shape.batch_capacity, p.shape.token_capacity
            assert len(works) <= b and min(works) >= 1 and sum(works) <= b * c
            assert sum(w * w for w in works) <= b * c * c
    # Every prompt is consumed exactly once, whatever the packing.
    consumed = {}
    for p, _, _ in d.history:
        for lane in p.lanes:
            consumed[lane.handle] = consumed.get(lane.handle, 0) + lane.prompt_tokens
    assert consumed == dict(zip(handles, prompts))
    assert not any(s.is_live(h) for h in handles)
