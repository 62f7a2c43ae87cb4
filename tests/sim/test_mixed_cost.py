"""Mixed graphs and packed prefill rows in the cost models and SimCore (issue 10)."""

from __future__ import annotations

import pytest

from helios.engine.sim_core import SimCore
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.plan import Lane, ScheduledPlan, SelectionReason
from helios.sim.cost_rows import linear_tokens
from helios.sim.costmodel import VidurCostModel
from helios.sim.synthetic_cost import SyntheticCostModel

MIXED = GraphShape(GraphKind.MIXED, 8, 1, 0, 0, 512)
SPEC_MIXED = GraphShape(GraphKind.MIXED, 4, 4, 3, 0, 256)
PREFILL = GraphShape(GraphKind.PREFILL, 4, 256)


@pytest.fixture(scope="module")
def vidur():
    return VidurCostModel.from_data("a100-34b-tp2")


def test_mixed_linear_tokens_are_the_max_packed_extent():
    assert linear_tokens(MIXED) == 512 + 7 * 1
    assert linear_tokens(SPEC_MIXED) == 256 + 3 * 4


def test_mixed_graph_is_its_parts_from_the_same_tables(vidur):
    """Attention is exactly the prompt chunk's prefill attention plus the decoders' decode attention;
    the MLP runs once on the max packed extent."""
    chunks, ctx = [512] + [0] * 7, [256] + [1024] * 7
    parts = vidur.breakdown_ms(MIXED, ctx, chunks=chunks)
    layers = vidur.profile.layers
    assert parts["linear"] == pytest.approx(layers * vidur.linear.layer_ms(519))
    attention = vidur.prefill_attention_ms([512], [256]) + vidur.decode_attention_ms(7, 1024)
    assert parts["attention"] == pytest.approx(layers * attention)
    assert vidur.duration_ns(MIXED, ctx, chunks=chunks) == round(sum(parts.values()) * 1e6)


def test_mixed_graph_cross_check_against_separate_graphs(vidur):
    """One mixed graph costs less than a prefill graph plus a decode graph (one overhead, one weight
    pass) and more than either alone."""
    mixed = vidur.duration_ns(MIXED, [0] + [1024] * 7, chunks=[512] + [0] * 7)
    prefill = vidur.duration_ns(GraphShape(GraphKind.PREFILL, 1, 512), [0])
    decode = vidur.duration_ns(GraphShape(GraphKind.DECODE, 8), [1024] * 7)
    assert max(prefill, decode) < mixed < prefill + decode - vidur.overhead_ms * 1e6
    synthetic = SyntheticCostModel()
    s_mixed = synthetic.duration_ns(MIXED, [0] + [1024] * 7, chunks=[512] + [0] * 7)
    s_parts = (synthetic.duration_ns(GraphShape(GraphKind.PREFILL, 1, 512), [0])
               + synthetic.duration_ns(GraphShape(GraphKind.DECODE, 8), [1024] * 7))
    assert s_mixed < s_parts


def test_decode_only_population_pays_the_shape_but_no_prompt_attention(vidur):
    full = vidur.breakdown_ms(MIXED, [0] + [1024] * 7, chunks=[512] + [0] * 7)
    decoders = vidur.breakdown_ms(MIXED, [1024] * 7, chunks=[0] * 7)
    assert decoders["linear"] == full["linear"] and decoders["attention"] < full["attention"]


def test_packed_prefill_rows_pay_their_own_tokens(vidur):
    """A 4 x 256 prefill graph packing a 700-token row and a 100-token row: the linear layers still run
    the graph's 1024 positions, attention only the real chunks."""
    parts = vidur.breakdown_ms(PREFILL, [0, 0], chunks=[700, 100])
    padded = vidur.breakdown_ms(PREFILL, [0, 0])
    assert parts["linear"] == padded["linear"]
    assert parts["attention"] == pytest.approx(vidur.profile.layers * vidur.prefill_attention_ms([700, 100], [0, 0]))
    short = vidur.breakdown_ms(PREFILL, [0, 0], chunks=[10, 20])
    assert short["attention"] < padded["attention"]
    with pytest.raises(ConfigError):
        vidur.duration_ns(PREFILL, [0, 0], chunks=[1000, 100])  # beyond B x C
    with pytest.raises(ConfigError):
        vidur.duration_ns(MIXED, [0, 0], chunks=[10, 20])  # two prompt rows
    with pytest.raises(ConfigError):
        SyntheticCostModel().duration_ns(MIXED, [0], chunks=[600])  # beyond C


def _lane(h, prompt_start=0, prompt_tokens=0, context=0, rows=1):
    return Lane(h, 0, 0, h, prompt_start, prompt_tokens, context, rows, 1.0, 1.0, 0.0)


def _plan(shape, lanes):
    return ScheduledPlan(shape, tuple(lanes), None, 0.0, 0.0, SelectionReason.ORDINARY, True, False, 0, 0, ())


@pytest.mark.parametrize("finishing", [True, False])
def test_simcore_executes_a_mixed_plan_by_role(finishing):
    model = SyntheticCostModel()
    core = SimCore(Catalog([MIXED]), model, seed=3)
    lanes = [_lane(0, 64, 300, 64, int(finishing))] + [_lane(h, context=900 + h) for h in range(1, 5)]
    plan = _plan(MIXED, lanes)
    assert plan.prefill_row == 0
    ex = core.execute(plan, 1)
    assert [r.handle for r in ex.records] == list(range(5))
    assert ex.records[0].prompt_tokens == 300 and len(ex.records[0].tokens) == int(finishing)
    assert all(r.prompt_tokens == 0 and len(r.tokens) == 1 for r in ex.records[1:])
    assert ex.duration_ns == model.duration_ns(MIXED, plan.lanes.context_tokens.tolist(),
                                               chunks=plan.lanes.prompt_tokens.tolist())


def test_simcore_speculative_mixed_rows_verify_like_a_round():
    core = SimCore(Catalog([SPEC_MIXED]), SyntheticCostModel(), seed=5)
    lanes = [_lane(1, rows=4, context=50), _lane(0, 0, 128, 0, 1), _lane(2, rows=2, context=70)]
    ex = core.execute(_plan(SPEC_MIXED, lanes), 1)
    assert [r.handle for r in ex.records] == [1, 0, 2]
    assert ex.records[1].prompt_tokens == 128 and len(ex.records[1].tokens) == 1
    assert 1 <= len(ex.records[0].tokens) <= 4 and 1 <= len(ex.records[2].tokens) <= 2
    assert ex.records[0].prompt_tokens == 0 and ex.records[0].offered is None


def test_simcore_packed_prefill_rows():
    """A prefill plan's rows are packed by prefix sums: one row may exceed C within B x C."""
    model = SyntheticCostModel()
    core = SimCore(Catalog([PREFILL]), model)
    plan = _plan(PREFILL, [_lane(0, 0, 700, 0, 1), _lane(1, 0, 100, 0, 0)])
    ex = core.execute(plan, 1)
    assert [len(r.tokens) for r in ex.records] == [1, 0]
    assert ex.duration_ns == model.duration_ns(PREFILL, [0, 0], chunks=[700, 100])
    assert plan.padding() == 4 * 256 - 800
