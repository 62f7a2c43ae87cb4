"""SimCore prices several prompt rows of a mixed graph as the baselines' packed forward prices its
prompt chunks: each row's chunk over its own cached prefix, no row padded to the capacity
(docs/packed-prompt-rows.md). The linear layers run the graph's physical extent, as for one row."""

from __future__ import annotations

import pytest

from helios.engine.sim_core import SimCore
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.plan import Lane, ScheduledPlan, SelectionReason
from helios.sim.cost_rows import linear_tokens
from helios.sim.costmodel import VidurCostModel
from helios.sim.synthetic_cost import SyntheticCostModel

PACKED2 = GraphShape(GraphKind.MIXED, 4, 1, 0, 0, 512, 2)
CHUNKS, CTX = [300, 200, 0, 0], [0, 1000, 700, 900]


@pytest.fixture(scope="module")
def vidur():
    return VidurCostModel.from_data("a100-34b-tp2")


def test_prompt_rows_pay_the_packed_forwards_chunk_attention(vidur):
    layers = vidur.profile.layers
    parts = vidur.breakdown_ms(PACKED2, CTX, chunks=CHUNKS)
    packed = vidur.packed_breakdown_ms(CHUNKS[:2], CTX[:2])  # the same two chunks in a packed forward
    decode = vidur.decode_attention_ms(2, 800)
    assert parts["attention"] == pytest.approx(packed["attention"] + layers * decode)
    # Not one full-capacity row per prompt row: each pays for its own chunk.
    padded = sum(vidur.prefill_attention_ms([512], [k]) for k in CTX[:2])
    assert parts["attention"] < layers * (padded + decode)
    # The linear layers run the graph's extent C + (B - 1) W, as with one prompt row.
    assert linear_tokens(PACKED2) == 512 + 3
    one_row = vidur.breakdown_ms(GraphShape(GraphKind.MIXED, 4, 1, 0, 0, 512), CTX, chunks=[500, 0, 0, 0])
    assert parts["linear"] == one_row["linear"]


def test_synthetic_prompt_rows_pay_their_own_pairs():
    m = SyntheticCostModel.realistic_small()
    pairs = sum(m.c_pair * c * (k + c / 2) / 1e6 for c, k in zip(CHUNKS[:2], CTX[:2]))
    fixed = m.a_dec + m.b_dec * 3 + m.c_kv * (700 + 900) / 1000 + m.b_pre * 512
    assert m.duration_ns(PACKED2, CTX, chunks=CHUNKS) == round(fixed + pairs)


def test_the_cost_models_hold_prompt_rows_to_the_shared_budget(vidur):
    for model in (vidur, SyntheticCostModel()):
        with pytest.raises(ConfigError, match="2 prompt rows"):
            model.duration_ns(PACKED2, CTX, chunks=[300, 213, 0, 0])  # 513 tokens over 512
        with pytest.raises(ConfigError, match="2 prompt rows"):
            model.duration_ns(PACKED2, CTX, chunks=[100, 100, 100, 0])  # three rows
        with pytest.raises(ConfigError, match="one prompt row"):  # the spec's form
            model.duration_ns(GraphShape(GraphKind.MIXED, 4, 1, 0, 0, 512), CTX, chunks=[100, 100, 0, 0])


def test_simcore_runs_each_prompt_row_and_prices_them_packed():
    model = SyntheticCostModel.realistic_small()
    core = SimCore(Catalog([PACKED2]), model, seed=0, noise=0.0, request_slots=4)
    lanes = [Lane(1, 0, 0, 0, 0, 300, 0, 1, 300.0, 0.0, 1.0), Lane(2, 0, 0, 1, 800, 200, 1000, 0, 200.0, 0.0, 1.0),
             Lane(3, 0, 0, 2, 0, 0, 700, 1, 1.0, 1.0, 1.0), Lane(4, 0, 0, 3, 0, 0, 900, 1, 1.0, 1.0, 1.0)]
    plan = ScheduledPlan(PACKED2, lanes, 1, 0.0, 0.0, SelectionReason.ORDINARY, True, False, 0, 0, ())
    for h in (1, 2, 3, 4):
        core.attach(h, output_len=10)
    ex = core.execute(plan, 1)
    assert ex.duration_ns == model.duration_ns(PACKED2, CTX, chunks=CHUNKS)
    assert [(r.handle, r.prompt_tokens, len(r.tokens)) for r in ex.records] == [(1, 300, 1), (2, 200, 0), (3, 0, 1),
                                                                                (4, 0, 1)]
