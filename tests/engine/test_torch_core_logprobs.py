"""Log-probabilities on the real model, through the threaded runtime: each output token's entry
is its log-probability under the raw distribution (before penalties), whether or not the round
speculated, with the k most likely tokens in order, and one entry per visible token id."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from helios.config import PolicyConfig, SpeculationMode
from helios.engine.torch_core import TorchCore
from helios.errors import InvalidRequest
from helios.runtime.runtime import Runtime
from helios.runtime.stream import SamplingParams
from helios.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from torch_helpers import chat, loaded, penalized_greedy_reference  # noqa: E402,F401 (loaded is a fixture)

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
