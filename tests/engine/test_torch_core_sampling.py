"""Sampling, verification and copy proposals of TorchCore, without the model."""

from __future__ import annotations

import math

import pytest
import torch

from helios.engine.proposals import copy_proposals
from hypothesis import given
from hypothesis import strategies as st

from helios.engine.sampling import (
    SamplingOptions, penalize, probabilities, sample_rows, verify_greedy, verify_sampled,
)
from helios.errors import InvalidRequest

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_options_defaults_and_validation():
    assert SamplingOptions.of().greedy and SamplingOptions.of(temperature=0).greedy
    assert SamplingOptions.of(top_k=-1).top_k == 0
    for bad in (dict(temperature=-1), dict(temperature=math.nan), dict(top_p=1.5), dict(top_k=2.5),
                dict(seed="x"), dict(seed=-1), dict(temperature=True), dict(presence_penalty=2.5),
                dict(frequency_penalty=-2.01), dict(repetition_penalty=0), dict(repetition_penalty=-1.0),
                dict(presence_penalty=math.inf), dict(logit_bias={1: 101}), dict(logit_bias={-1: 1.0}),
                dict(logit_bias={8: 1.0}, vocab_size=8), dict(logit_bias={"1": 1.0}), dict(min_p=1.01),
                dict(min_p=-0.1), dict(min_p=math.nan), dict(min_p=True), dict(allowed_token_ids=[]),
                dict(allowed_token_ids=[8], vocab_size=8), dict(allowed_token_ids=[-1]), dict(allowed_token_ids=[True]),
                dict(allowed_token_ids=["1"]), dict(allowed_token_ids=5)):
        with pytest.raises(InvalidRequest):
            SamplingOptions.of(**bad)
    assert not SamplingOptions.of(presence_penalty=0, frequency_penalty=0.0, repetition_penalty=1).penalized
    assert SamplingOptions.of(repetition_penalty=1.2).penalized and SamplingOptions.of(presence_penalty=-0.5).penalized
    assert SamplingOptions.of(logit_bias={3: -1.0}).penalized and not SamplingOptions.of(logit_bias={}).penalized


@given(logits=st.lists(st.floats(-20, 20, width=32), min_size=8, max_size=8),
       prompt=st.lists(st.integers(0, 7), max_size=6), output=st.lists(st.integers(0, 7), max_size=10),
       presence=st.floats(-2, 2), frequency=st.floats(-2, 2), repetition=st.floats(0.1, 10),
       bias=st.dictionaries(st.integers(0, 7), st.floats(-100, 100), max_size=3))
def test_penalties_match_their_definitions_token_by_token(logits, prompt, output, presence, frequency, repetition,
                                                          bias):
    """Rule (OpenAI's logit bias first, then its presence and frequency penalties over the output;
    CTRL's repetition penalty over prompt and output), against the definitions applied one token
    at a time."""
    row = torch.tensor(logits, dtype=torch.float32)
    options = SamplingOptions.of(presence_penalty=presence, frequency_penalty=frequency,
                                 repetition_penalty=repetition, logit_bias=bias, vocab_size=8)
    got = row.clone()
    penalize(got, prompt, output, options)
    for t in range(8):
        x = row[t].clone() + torch.tensor(bias.get(t, 0.0), dtype=torch.float32)
        if t in prompt or t in output:
            x = x / repetition if x > 0 else x * repetition
        if t in output:
            x = x - (torch.tensor(frequency, dtype=torch.float32) * output.count(t) + presence)
        assert torch.isclose(got[t], x, rtol=1e-5, atol=1e-4), (t, float(got[t]), float(x))


def test_penalties_off_leave_the_row_alone_and_greedy_rows_take_the_penalized_argmax():
    row = LOGITS.clone()
    penalize(row, [0, 1], [0, 0], SamplingOptions())
    assert torch.equal(row, LOGITS)
    row = LOGITS.clone()
    penalize(row, [], [0, 0], SamplingOptions.of(frequency_penalty=1.0))  # 2.0 - 2 x 1.0 = 0.0 < 1.0
    assert sample_rows(row[None], [SamplingOptions()], [None], [True]) == [1]


def test_greedy_is_a_point_mass_on_the_argmax():
    p = probabilities(LOGITS, SamplingOptions())
    assert p.tolist() == [1.0, 0, 0, 0, 0, 0]


def test_temperature_top_k_and_top_p_masks():
    full = probabilities(LOGITS, SamplingOptions(1.0))
    assert torch.allclose(full, torch.softmax(LOGITS, -1))
    cold, hot = probabilities(LOGITS, SamplingOptions(0.5)), probabilities(LOGITS, SamplingOptions(2.0))
    assert cold[0] > full[0] > hot[0] and hot[-1] > full[-1] > cold[-1]
    k3 = probabilities(LOGITS, SamplingOptions(1.0, top_k=3))
    assert (k3 > 0).tolist() == [True, True, True, False, False, False]
    assert torch.allclose(k3[:3], torch.softmax(LOGITS[:3], -1)) and math.isclose(float(k3.sum()), 1, rel_tol=1e-6)
    # Nucleus: the smallest most-likely set whose mass reaches top_p.
    cum = torch.cumsum(full, 0)
    for top_p in (0.3, 0.6, 0.9, 0.99):
        kept = int((cum < top_p).sum()) + 1
        p = probabilities(LOGITS, SamplingOptions(1.0, top_p=top_p))
        assert int((p > 0).sum()) == kept, top_p
    assert int((probabilities(LOGITS, SamplingOptions(1.0, top_p=0.0)) > 0).sum()) == 1
    both = probabilities(LOGITS, SamplingOptions(1.0, top_p=0.99, top_k=2))
    assert int((both > 0).sum()) == 2


@given(logits=st.lists(st.floats(-20, 20, width=32), min_size=8, max_size=8), min_p=st.floats(0.0, 1.0),
       temperature=st.floats(0.1, 3.0), top_p=st.sampled_from([1.0, 0.9, 0.5]), top_k=st.integers(0, 8))
def test_min_p_keeps_exactly_the_tokens_at_least_min_p_times_as_likely_as_the_top(logits, min_p, temperature,
                                                                                    top_p, top_k):
    # vLLM's order: temperature, then min-p, then top-k and top-p on what is left.
    x = torch.tensor(logits) / temperature
    alone = probabilities(torch.tensor(logits), SamplingOptions(temperature, min_p=min_p))
    full = torch.softmax(x.double(), -1)
    # Kept by enumeration, with a margin for float32 at the boundary p_i = min_p * p_max (and above
    # what float32's softmax can hold: a kept token may still underflow to probability 0).
    sure = [i for i in range(8) if full[i] >= min_p * full.max() * (1 + 1e-4) and full[i] > 1e-30]
    dropped = [i for i in range(8) if full[i] < min_p * full.max() * (1 - 1e-4)]
    assert all(alone[i] > 0 for i in sure) and all(alone[i] == 0 for i in dropped)
    assert alone[int(full.argmax())] > 0 and math.isclose(float(alone.sum()), 1, rel_tol=1e-5)
    kept = alone > 0
    assert torch.allclose(alone[kept].double(), torch.softmax(x[kept].double(), -1), atol=1e-5)
    # Top-k and top-p then apply to the min-p survivors, as if the others were never there.
    both = probabilities(torch.tensor(logits), SamplingOptions(temperature, top_p=top_p, top_k=top_k, min_p=min_p))
    masked = torch.tensor(logits).masked_fill(~kept, -math.inf)
    assert torch.equal(both > 0, probabilities(masked, SamplingOptions(temperature, top_p=top_p, top_k=top_k)) > 0)
    assert SamplingOptions.of(min_p=0).min_p == 0 and torch.equal(
        probabilities(torch.tensor(logits), SamplingOptions(temperature, min_p=0.0)),
        probabilities(torch.tensor(logits), SamplingOptions(temperature)))


def test_allowed_token_ids_mask_every_other_token_after_the_penalties():
    options = SamplingOptions.of(allowed_token_ids=[4, 1, 4], logit_bias={1: -5.0, 2: 50.0}, temperature=1.0)
    assert options.allowed_token_ids == (1, 4) and options.penalized
    row = LOGITS.clone()
    penalize(row, [], [], options)
    assert torch.isinf(row).tolist() == [True, False, True, True, False, True]
    assert row[1] == LOGITS[1] - 5.0 and row[4] == LOGITS[4]
    p = probabilities(row, options)
    assert torch.allclose(p[[1, 4]], torch.softmax(row[[1, 4]], -1)) and float(p.sum()) == pytest.approx(1.0)


def test_row_masks_greedy_rows_and_seeded_generators():
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS, LOGITS])
    hot = SamplingOptions(1.0, seed=5)
    opts = [SamplingOptions(), SamplingOptions(), hot, None]
    gens = [None, None, hot.generator(), None]
    out = sample_rows(logits, opts, gens, [True, True, True, False])
    assert out[:2] == [0, 5] and out[3] is None and out[2] in range(6)
    again = sample_rows(logits, opts, [None, None, hot.generator(), None], [True, True, True, False])
    assert again == out
    assert sample_rows(logits, opts, gens, [False] * 4) == [None] * 4
    # A request's draws depend on its own generator only, not on its row or neighbours.
    other = SamplingOptions(1.0, seed=9)
    g1, g2, g3 = hot.generator(), hot.generator(), other.generator()
    alone = [sample_rows(LOGITS[None], [hot], [g1], [True])[0] for _ in range(20)]
    pair = torch.stack([LOGITS.flip(0), LOGITS])
    shared = [sample_rows(pair, [other, hot], [g3, g2], [True, True])[1] for _ in range(20)]
    assert alone == shared and len(set(alone)) > 1


def test_verify_greedy():
    assert verify_greedy([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]  # all accepted plus bonus
    assert verify_greedy([4, 9, 6, 7], [4, 5, 6]) == [4, 9]  # replacement at the first mismatch
    assert verify_greedy([3], []) == [3]


def test_verify_sampled_is_lossless_for_point_mass_drafts():
    # Accepting draft t with probability p(t), else sampling p without t, must reproduce p.
    opts = SamplingOptions(1.0)
    p = torch.softmax(LOGITS, -1)
    g = torch.Generator().manual_seed(0)
    n = 20000
    for draft in (0, 3):
        counts = torch.zeros(6)
        logits = torch.stack([LOGITS, LOGITS])
        for _ in range(n):
            counts[verify_sampled(logits, [draft], opts, g)[0]] += 1
        assert torch.allclose(counts / n, p, atol=0.012), (draft, counts / n)
    # Accepted drafts are followed by a token sampled from the next position.
    sure = torch.tensor([[0.0, 50.0, 0.0], [9.0, 0.0, 0.0]])
    assert verify_sampled(sure, [1], opts, g) == [1, 0]


def test_copy_proposals():
    ctx = [1, 2, 3, 9, 1, 2, 3]
    assert copy_proposals(ctx, 3) == [9, 1, 2]  # trigram match
    assert copy_proposals(ctx, 1) == [9]
    assert copy_proposals([5, 6, 7, 5, 6, 8, 5, 6], 2) == [8, 5]  # most recent bigram occurrence
    assert copy_proposals([1, 2, 3, 4], 3) == []  # nothing recurs
    assert copy_proposals([4, 1, 2, 4], 5) == [1, 2, 4]  # unigram; shorter than asked
    assert copy_proposals([7, 7, 7, 7], 3) == [7]  # the match's continuation ends at the context end
    assert copy_proposals([1], 3) == [] and copy_proposals(ctx, 0) == []
