"""A packed varlen forward (vLLM, Sarathi-Serve) is priced as ONE forward over its real tokens."""

from __future__ import annotations

import pytest

from helios.engine.sim_core import SimCore
from helios.errors import ConfigError
from helios.graphs import GraphKind, GraphShape
from helios.prepare import ordinary_catalog
from helios.scheduler.plan import Lane, PlanLanes, ScheduledPlan, SelectionReason
from helios.sim.costmodel import VidurCostModel
from helios.sim.synthetic_cost import SyntheticCostModel

PROFILE = "a100-34b-tp2"


@pytest.fixture(scope="module")
def vidur():
    return VidurCostModel.from_data(PROFILE)


def test_packed_rows_match_the_unpadded_graphs(vidur):
    """Decode rows alone cost a decode graph of exactly that batch; one chunk alone a one-row prefill."""
    assert vidur.packed_duration_ns([0] * 32, [1024] * 32) == vidur.duration_ns(
        GraphShape(GraphKind.DECODE, 32), [1024] * 32)
    assert vidur.packed_duration_ns([512], [256]) == vidur.duration_ns(GraphShape(GraphKind.PREFILL, 1, 512), [256])


def test_hybrid_batch_pays_one_overhead_and_one_weight_pass(vidur):
    """32 decodes + a 480-token chunk as one forward cost less than the decode graph plus the prefill
    graph: one per-forward overhead and one pass over the weights, not two."""
    packed = vidur.packed_duration_ns([0] * 32 + [480], [1024] * 32 + [0])
    split = (vidur.duration_ns(GraphShape(GraphKind.DECODE, 32), [1024] * 32)
             + vidur.duration_ns(GraphShape(GraphKind.PREFILL, 1, 480), [0]))
    assert packed < split - vidur.overhead_ms * 1e6
    parts = vidur.packed_breakdown_ms([0] * 32 + [480], [1024] * 32 + [0])
    assert parts["overhead"] == vidur.overhead_ms
    assert parts["linear"] == pytest.approx(vidur.profile.layers * vidur.linear.layer_ms(512))


def test_several_chunks_are_not_padded_to_a_common_width(vidur):
    """Chunks of 100 and 900 tokens run 1000 tokens through the linear layers, not 2 x 900."""
    parts = vidur.packed_breakdown_ms([100, 900], [0, 0])
    assert parts["linear"] == pytest.approx(vidur.profile.layers * vidur.linear.layer_ms(1000))


def test_synthetic_packed_matches_its_graph_formulas():
    m = SyntheticCostModel()
    assert m.packed_duration_ns([0] * 8, [100] * 8) == m.duration_ns(GraphShape(GraphKind.DECODE, 8), [100] * 8)
    assert m.packed_duration_ns([256], [0]) == m.duration_ns(GraphShape(GraphKind.PREFILL, 1, 256), [0])
    with pytest.raises(ConfigError):
        m.packed_duration_ns([1, 2], [0])


def _packed_plan(chunks, contexts) -> ScheduledPlan:
    lanes = PlanLanes.of([Lane(h, 0, 0, h, 0, c, k, 1, 1.0, 1.0, 0.0) for h, (c, k) in enumerate(zip(chunks, contexts))])
    return ScheduledPlan(GraphShape(GraphKind.PACKED, 64, 2048), lanes, None, 0.0, 0.0, SelectionReason.ORDINARY,
                         True, False, 0, 0, ())


def test_simcore_prices_a_packed_plan_from_its_lanes():
    model = SyntheticCostModel()
    core = SimCore(ordinary_catalog(8), model)
    plan = _packed_plan([0, 0, 300], [50, 70, 0])
    assert core.true_duration_ns(plan) == model.packed_duration_ns([0, 0, 300], [50, 70, 0])


def test_simcore_refuses_a_packed_plan_its_cost_model_cannot_price():
    class GraphsOnly:
        def duration_ns(self, shape, context_lens) -> int:
            return 1

    with pytest.raises(ConfigError):
        SimCore(ordinary_catalog(8), GraphsOnly()).true_duration_ns(_packed_plan([0], [5]))
