"""Sampling, verification and copy proposals of TorchCore, without the model."""

from __future__ import annotations

import math

import pytest
import torch

from helios.engine.proposals import copy_proposals
from helios.engine.sampling import (
    SamplingOptions, probabilities, sample_rows, verify_greedy, verify_sampled,
)
from helios.errors import InvalidRequest

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_options_defaults_and_validation():
    assert SamplingOptions.of().greedy and SamplingOptions.of(temperature=0).greedy
    assert SamplingOptions.of(top_k=-1).top_k == 0
    for bad in (dict(temperature=-1), dict(temperature=math.nan), dict(top_p=1.5), dict(top_k=2.5),
                dict(seed="x"), dict(seed=-1), dict(temperature=True)):
        with pytest.raises(InvalidRequest):
            SamplingOptions.of(**bad)


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
