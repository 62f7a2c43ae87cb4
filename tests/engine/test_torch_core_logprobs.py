"""Log-probabilities on the real model, through the threaded runtime: each output token's entry
is its log-probability under the raw distribution (before penalties), whether or not the round
speculated, with the k most likely tokens in order, and one entry per visible token id; and the
prompt's, from scored prefill graphs, equal to one full forward's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from helios.config import PolicyConfig, SpeculationMode
from helios.engine.model import KVCache
from helios.engine.torch_core import TorchCore
from helios.errors import InvalidRequest
from helios.graphs import GraphKind, GraphShape
from helios.runtime.runtime import Runtime
from helios.runtime.stream import SamplingParams
from helios.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from torch_helpers import chat, lane, loaded, penalized_greedy_reference, plan  # noqa: E402,F401 (loaded: a fixture)

MAX_CONTEXT = 512
PROMPT = "Write the word 'hello' ten times separated by spaces."
PENALTIES = dict(presence_penalty=0.4, frequency_penalty=0.6, repetition_penalty=1.3)


def served(loaded, prompt, params, mode=SpeculationMode.OFF):
    core = TorchCore(loaded=loaded, max_context=MAX_CONTEXT, speculation=mode)
    with Runtime(Scheduler(core.catalog, PolicyConfig(), core.scheduler_config()), core,
                 tokenizer=loaded.tokenizer) as runtime:
        stream = runtime.submit(prompt, params)
        events = list(stream)
    ids = [t for e in events for t in e.token_ids]
    entries = [x for e in events for x in (e.logprobs or ())]
    return ids, entries


@pytest.mark.parametrize("mode", [SpeculationMode.OFF, SpeculationMode.FIXED])
def test_logprobs_are_of_the_raw_distribution_at_every_position(loaded, mode):
    prompt = chat(loaded.tokenizer, PROMPT)
    with torch.inference_mode():
        reference, raw = penalized_greedy_reference(loaded, prompt, 20, MAX_CONTEXT, **PENALTIES)
    ids, entries = served(loaded, prompt, SamplingParams(max_tokens=20, temperature=0.0, logprobs=3,
                                                         core_options=PENALTIES), mode)
    eos = loaded.tokenizer.eos_id
    visible = [t for t in reference if t != eos]  # EOS is never shown, nor reported
    assert ids == visible and len(entries) == len(ids)
    for entry, want in zip(entries, raw):
        assert math.isclose(entry.logprob, want, abs_tol=1e-4), (entry.logprob, want)
        assert len(entry.top) == 3 and [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)


def test_without_penalties_the_greedy_token_is_the_top_alternative(loaded):
    ids, entries = served(loaded, chat(loaded.tokenizer, PROMPT), SamplingParams(max_tokens=8, temperature=0.0,
                                                                                  logprobs=0))
    assert len(entries) == len(ids) == 8 and all(e.top == () for e in entries)
    ids, entries = served(loaded, chat(loaded.tokenizer, PROMPT), SamplingParams(max_tokens=8, temperature=0.0,
                                                                                  logprobs=1))
    assert [e.top[0][0] for e in entries] == ids
    assert all(math.isclose(e.top[0][1], e.logprob) and e.logprob <= 0 for e in entries)


def test_a_request_without_logprobs_gets_none_and_a_bad_count_is_refused(loaded):
    ids, entries = served(loaded, chat(loaded.tokenizer, PROMPT), SamplingParams(max_tokens=4, temperature=0.0))
    assert len(ids) == 4 and entries == []
    core = TorchCore(loaded=loaded, max_context=MAX_CONTEXT)
    for bad in (-1, 21, True, 2.0):
        with pytest.raises(InvalidRequest, match="logprobs"):
            core.attach(0, [1, 2, 3], logprobs=bad)


FOX = "The quick brown fox jumps over the lazy dog. " * 12


def full_forward_scores(loaded, prompt):
    """Each prompt token's log-probability from one unchunked forward over the whole prompt."""
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([prompt]), torch.arange(len(prompt))[None], torch.tensor([0]),
                              KVCache(loaded.config, 1, MAX_CONTEXT))[0]
    raw = torch.log_softmax(logits.float(), -1)
    return [float(raw[j, prompt[j + 1]]) for j in range(len(prompt) - 1)]


@pytest.mark.parametrize("chunks", [(64, 256), (64,)], ids=["one-chunk", "two-chunks"])
def test_prompt_logprobs_match_one_full_forward(loaded, chunks):
    """Rule (scored prefill): a request for the prompt's log-probabilities runs its prompt in scored
    prefill graphs, which give every prompt token's entry (None for the first), also across chunks."""
    prompt = loaded.tokenizer.encode(FOX)
    want = full_forward_scores(loaded, prompt)
    core = TorchCore(loaded=loaded, max_context=MAX_CONTEXT, prefill_chunks=chunks, scored_prefill=True)
    with Runtime(Scheduler(core.catalog, PolicyConfig(), core.scheduler_config()), core,
                 tokenizer=loaded.tokenizer) as runtime:
        stream = runtime.submit(prompt, SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2))
        list(stream)
        shapes = dict(runtime.stats.executions_by_shape)
    got = stream.prompt_logprobs
    assert len(got) == len(prompt) and got[0] is None
    assert all(math.isclose(g.logprob, w, abs_tol=1e-4) and len(g.top) == 2 for g, w in zip(got[1:], want))
    assert all(label.startswith("scored_prefill") for label in shapes if "prefill" in label)
    assert sum(n for label, n in shapes.items() if "prefill" in label) == (1 if chunks == (64, 256) else 2)


def test_a_packed_scored_prefill_row_scores_every_position(loaded):
    """A row longer than the graph's chunk runs packed (one row in scored_prefill[B=4,C=64]); its
    scores come from every packed position."""
    prompt = loaded.tokenizer.encode(FOX)
    want = full_forward_scores(loaded, prompt)
    core = TorchCore(loaded=loaded, max_context=MAX_CONTEXT, prefill_chunks=(64, 256), scored_prefill=True)
    core.attach(0, prompt, prompt_logprobs=0, temperature=0.0)
    shape = GraphShape(GraphKind.SCORED_PREFILL, 4, 64)
    execution = core.execute(plan(shape, [lane(0, 0, 0, len(prompt))]), 1)
    assert core.last_packing.query_lengths == (len(prompt),)  # one packed row of 121 tokens
    got = execution.prompt_logprobs[0]
    assert len(got) == len(prompt) and got[0] is None
    assert all(math.isclose(g.logprob, w, abs_tol=1e-4) and g.top == () for g, w in zip(got[1:], want))


def test_a_scored_prompt_never_restores_a_checkpoint(loaded, monkeypatch):
    """Restored tokens are never computed, so they would have no scores: the runtime does not
    look for a checkpoint for a request that scores its prompt."""
    import helios.runtime.runtime as runtime_module

    looked = []
    monkeypatch.setattr(runtime_module, "checkpoint_match", lambda *a: looked.append(a) or (None, None))
    core = TorchCore(loaded=loaded, max_context=MAX_CONTEXT, scored_prefill=True)
    with Runtime(Scheduler(core.catalog, PolicyConfig(), core.scheduler_config()), core,
                 tokenizer=loaded.tokenizer) as runtime:
        list(runtime.submit([1, 2, 3], SamplingParams(max_tokens=1, prompt_logprobs=0)))
        assert looked == []
        list(runtime.submit([1, 2, 3], SamplingParams(max_tokens=1)))
        assert len(looked) == 1
