"""Cost models: grid fidelity to the Vidur profiles, monotonicity, padding, and the Splitwise cross-check."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios.graphs import GraphKind, GraphShape
from helios.sim.calibration import calibration_report, error_summary, load_splitwise
from helios.sim.cost_rows import linear_tokens
from helios.sim.costmodel import PROFILES, CostModel, VidurCostModel
from helios.sim.host_overhead import host_overhead_ns
from helios.sim.synthetic_cost import SyntheticCostModel
from helios.sim.traces import default_data_dir

# Tolerances documented in docs/cost-models.md.
FIT_MAX_ERR = 0.15
HELD_OUT_MAX_ERR = 0.25
HELD_OUT_MEAN_ERR = 0.12

_MODELS: dict[str, VidurCostModel] = {}


def model(profile: str) -> VidurCostModel:
    if profile not in _MODELS:
        _MODELS[profile] = VidurCostModel.from_data(profile)
    return _MODELS[profile]


@pytest.fixture(scope="module")
def report():
    return calibration_report()


def test_models_satisfy_protocol():
    assert isinstance(model("a100-70b-tp2"), CostModel)
    assert isinstance(SyntheticCostModel(), CostModel)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_linear_ops_reproduce_profile_grid(profile):
    table = model(profile).linear
    rel = np.array([table.layer_ms(n) / raw - 1 for n, raw in zip(table.tokens, table.raw)])
    assert np.median(np.abs(rel)) <= 0.01
    assert np.percentile(np.abs(rel), 95) <= 0.05
    assert np.abs(rel).max() <= 0.15  # isolated noisy points are pooled with their neighbours
    assert np.all(np.diff(table.layer_ms_grid) >= 0)
    assert table.layer_ms(2 * table.tokens[-1]) == pytest.approx(2 * table.layer_ms(table.tokens[-1]))


def test_per_layer_sum_matches_a_csv_row():
    # Independent re-read of one row: 4096 tokens, TP2 (two duplicate rows, averaged).
    path = default_data_dir() / PROFILES["a100-34b-tp2"].mlp_file
    ops = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["num_tokens"] == "4096"]
    expected = np.mean([sum(float(r[f"time_stats.{o}.median"]) for o in ops) for r in rows])
    assert model("a100-34b-tp2").linear.layer_ms(4096) == pytest.approx(expected, rel=0.02)
    # The 70B estimate scales only the MLP operators, by the intermediate sizes 28672 / 22016.
    mlp = np.mean([sum(float(r[f"time_stats.{o}.median"]) for o in ops[5:8]) for r in rows])
    assert model("a100-70b-tp2").linear.layer_ms(4096) == pytest.approx(expected + mlp * (28672 / 22016 - 1),
                                                                         rel=0.02)


def test_the_a100_profile_is_codellama_34b():
    """The A100 'llama2-70b-shape' MLP file carries CodeLlama-34B's MLP (n_expanded_embd 22016): the measured
    profile has 48 layers and borrows the terms fitted for the 70B estimate (80 layers, MLP scaled)."""
    path = default_data_dir() / PROFILES["a100-34b-tp2"].mlp_file
    with open(path, newline="") as fh:
        first = next(csv.DictReader(fh))
    assert (int(first["n_embd"]), int(first["n_expanded_embd"])) == (8192, 22016)
    small, large = model("a100-34b-tp2"), model("a100-70b-tp2")
    assert (small.profile.layers, large.profile.layers) == (48, 80)
    assert (small.overhead_ms, small.comm_ms_per_token_layer) == (large.overhead_ms, large.comm_ms_per_token_layer)


def test_attention_tables_reproduce_profile_grid():
    m = model("a100-70b-tp2")
    d = m.decode
    dev = np.array([[d.ms(b, k) - d.raw[i, j] for j, k in enumerate(d.kvs)] for i, b in enumerate(d.batches)])
    assert np.percentile(np.abs(dev / d.raw), 90) <= 0.05
    assert np.abs(dev).max() <= 0.03  # ms; the profile's resolution is 0.001 ms
    assert np.all(np.diff(d.grid, axis=0) >= 0) and np.all(np.diff(d.grid, axis=1) >= 0)
    p = m.prefill
    rel = np.array([p.ms(c, k) / v - 1 for (c, k), v in p.raw.items()])
    assert np.percentile(np.abs(rel), 95) <= 0.05
    assert max(abs(p.ms(c, k) - v) for (c, k), v in p.raw.items()) <= 0.05


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_monotone_in_batch_tokens_and_context(profile):
    m = model(profile)
    dec = [m.duration_ns(GraphShape(GraphKind.DECODE, b), [1500] * b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert all(x < y for x, y in zip(dec, dec[1:]))
    pre = [m.duration_ns(GraphShape(GraphKind.PREFILL, 1, w), [0]) for w in (16, 64, 256, 1024, 4096, 8192)]
    assert all(x < y for x, y in zip(pre, pre[1:]))
    ctx = [m.duration_ns(GraphShape(GraphKind.DECODE, 32), [k] * 32) for k in (0, 100, 1000, 4000, 16000)]
    assert all(x <= y for x, y in zip(ctx, ctx[1:])) and ctx[-1] > ctx[0]
    spec = [m.duration_ns(GraphShape(GraphKind.SPECULATIVE, 16, w, w - 1 if w > 1 else 0), [800] * 16)
            for w in (1, 2, 4, 8)]
    assert all(x < y for x, y in zip(spec, spec[1:]))


def _shapes(kind: GraphKind):
    b, w, c = st.integers(1, 128), st.integers(1, 16), st.integers(16, 4096)
    if kind is GraphKind.DECODE:
        return st.builds(lambda b: GraphShape(kind, b), b)
    if kind is GraphKind.PREFILL:
        return st.builds(lambda b, c: GraphShape(kind, min(b, 8), c), b, c)
    if kind is GraphKind.SPECULATIVE:
        return st.builds(lambda b, w: GraphShape(kind, b, w, w - 1 if w > 1 else 0), b, w)
    # The mixed contract: B a power of two 2..64, C a positive multiple of 64 (>= W here always).
    b, w, c = st.sampled_from([2, 4, 8, 16, 32, 64]), st.integers(1, 8), st.integers(1, 64).map(lambda k: 64 * k)
    return st.builds(lambda b, w, c: GraphShape(kind, b, w, w - 1 if w > 1 else 0, 0, c), b, w, c)


def _grown(small: GraphShape, grow: tuple[int, int, int]) -> GraphShape:
    """`small` with every capacity at least as large, inside the kind's contract."""
    kind = small.kind
    if kind is GraphKind.MIXED:
        # Doubling keeps B a power of two; whole 64-token steps keep C aligned.
        b = min(64, small.batch_capacity << (grow[0] % 6))
        w = min(8, small.token_capacity + grow[1])
        return GraphShape(kind, b, w, small.proposal_depth + (w - small.token_capacity if small.token_capacity > 1
                                                              else 0),
                          0, small.prefill_capacity + 64 * (grow[2] // 64))
    return GraphShape(kind, small.batch_capacity + grow[0],
                      small.token_capacity if kind is GraphKind.DECODE else small.token_capacity + grow[1],
                      small.proposal_depth + (grow[1] if kind is GraphKind.SPECULATIVE and small.token_capacity > 1
                                              else 0))


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from([GraphKind.DECODE, GraphKind.PREFILL, GraphKind.SPECULATIVE, GraphKind.MIXED]),
       data=st.data(), profile=st.sampled_from(sorted(PROFILES)))
def test_padded_shape_costs_at_least_as_much(kind, data, profile):
    small = data.draw(_shapes(kind))
    grow = data.draw(st.tuples(st.integers(0, 64), st.integers(0, 8), st.integers(0, 2048)))
    big = _grown(small, grow)
    active = data.draw(st.integers(1, small.batch_capacity))
    ctx = data.draw(st.lists(st.integers(0, 6000), min_size=active, max_size=active))
    for m in (model(profile), SyntheticCostModel(), SyntheticCostModel.realistic_small()):
        assert m.duration_ns(big, ctx) >= m.duration_ns(small, ctx)
        assert m.duration_ns(small, ctx) > 0


def test_splitwise_cross_check_within_tolerance(report):
    summary = error_summary(report)
    assert summary["fit"][2] <= FIT_MAX_ERR
    assert summary["held-out"][2] <= HELD_OUT_MAX_ERR
    assert summary["held-out"][1] <= HELD_OUT_MEAN_ERR
    assert {r.config.split()[0] for r in report} == {"a100-70b-tp2", "h100-70b"}
    # Only the batch-64 groups (prompt_time below batch 32's) are set aside as anomalies.
    assert all("B=64" in r.config for r in report if r.role == "anomaly")
    assert sum(r.role == "held-out" for r in report) >= 20


def test_splitwise_anomaly_detection():
    points = {(p.hardware, p.tp, p.prompt_size, p.batch_size): p for p in load_splitwise()}
    assert points[("a100-80gb", 2, 512, 64)].anomalous
    assert not points[("a100-80gb", 2, 512, 32)].anomalous
    # 3 GPUs x 3 TP degrees, each with 7 prompt sizes at batch 1 and 6 more batch sizes at prompt 512.
    assert len(points) == 9 * 13


def test_fitted_terms_are_physical():
    a100, h100 = model("a100-70b-tp2"), model("h100-70b")
    # Before the A100 MLP was corrected (34B MLP priced as 70B), A100 overhead and comm came out above
    # H100's; the comm term then absorbed the missing MLP work. Now both GPUs fit to similar terms.
    assert 0 < a100.overhead_ms < 30 and 0 < h100.overhead_ms < 30
    assert 0 < a100.comm_ms_per_token_layer < 0.005 and 0 < h100.comm_ms_per_token_layer < 0.005
    assert model("h100-7b").comm_ms_per_token_layer == 0.0
    fixed = VidurCostModel.from_data("a100-70b-tp2", overhead_ms=5.0, comm_us_per_token_layer=0.5)
    assert fixed.overhead_ms == 5.0 and fixed.comm_ms_per_token_layer == pytest.approx(0.0005)


def test_padding_rows_pay_linear_not_attention():
    m = model("a100-70b-tp2")
    shape = GraphShape(GraphKind.DECODE, 64)
    few, full = m.breakdown_ms(shape, [2000] * 4), m.breakdown_ms(shape, [2000] * 64)
    assert few["linear"] == full["linear"] and few["attention"] < full["attention"]
    assert linear_tokens(GraphShape(GraphKind.SPECULATIVE, 8, 4, 3)) == 32
    assert linear_tokens(GraphShape(GraphKind.MIXED, 8, 1, 0, 0, 256)) == 263  # C + (B - 1) W
    with pytest.raises(ValueError):
        m.duration_ns(shape, [0] * 65)
    with pytest.raises(ValueError):
        m.duration_ns(GraphShape(GraphKind.VISION, 1), [])
    with pytest.raises(ValueError):
        VidurCostModel.from_data("tpu-70b")


def test_mixed_prompt_context_costs_attention():
    m = model("h100-70b")
    shape = GraphShape(GraphKind.MIXED, 16, 1, 0, 0, 512)
    decoders = [1000] * 15
    deep = m.duration_ns(shape, [3000] + decoders, chunks=[512] + [0] * 15)
    assert deep > m.duration_ns(shape, [0] + decoders, chunks=[512] + [0] * 15)


def test_realistic_small_figures():
    m = SyntheticCostModel.realistic_small()
    assert m.duration_ns(GraphShape(GraphKind.DECODE, 1), [1000]) / 1e6 == pytest.approx(7.0, abs=0.3)
    assert m.duration_ns(GraphShape(GraphKind.DECODE, 64), [512] * 64) / 1e6 == pytest.approx(12.0, abs=0.5)
    pre = m.duration_ns(GraphShape(GraphKind.PREFILL, 1, 1000), [0]) / 1e6
    assert pre == pytest.approx(5 + 0.04 * 1000, rel=0.05)
    assert m.duration_ns(GraphShape(GraphKind.SNAPSHOT, 1), []) == 500_000


def test_synthetic_formula():
    m = SyntheticCostModel()
    assert m.duration_ns(GraphShape(GraphKind.DECODE, 4), [1000, 3000]) == 1_000_000 + 4 * 10_000 + 4_000
    assert m.duration_ns(GraphShape(GraphKind.PREFILL, 2, 100), [0]) == 1_000_000 + 200 * 5_000 + 5


def test_host_overhead():
    small, big = host_overhead_ns(8), host_overhead_ns(128)
    assert 0 < small < big
    # Llama-2-70B batch 128: schedule 2.020 + sampler 1.218 + prepare inputs 1.493 + outputs 2.162 ms.
    assert big / 1e6 == pytest.approx(2.020 + 1.218 + 1.493 + 2.162, abs=0.002)
    assert host_overhead_ns(1) > 0 and host_overhead_ns(256) > big
    assert host_overhead_ns(32, "meta-llama/Llama-2-7b-hf") > 0
