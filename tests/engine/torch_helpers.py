"""Shared pieces of the real-model engine tests: the model loaded once per module, chat
prompts, and hand-built plans and lanes."""

from __future__ import annotations

import pytest
import torch

from helios.engine.model import KVCache
from helios.engine.torch_core import load_model
from helios.scheduler import Lane, ScheduledPlan, SelectionReason


@pytest.fixture(scope="module")
def loaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads slow down 5-10x on a loaded 2-core box
    yield load_model()
    torch.set_num_threads(threads)


def chat(tok, text):
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def plan(shape, lanes):
    return ScheduledPlan(shape, tuple(lanes), 1, 0.0, 0.0, SelectionReason.ORDINARY, False, False, 0, 0, ())


def lane(handle, slot, prompt_start=0, prompt_tokens=0, context=0, rows=1):
    return Lane(handle, 0, 0, slot, prompt_start, prompt_tokens, context, rows, 1.0, 1.0, 0.0)


def penalized_greedy_reference(loaded, prompt, n, max_context, presence_penalty=0.0, frequency_penalty=0.0,
                               repetition_penalty=1.0):
    """Greedy decoding with the penalties applied by their definitions, one token at a time: the
    tokens, and each one's log-probability under the raw (unpenalized) distribution."""
    model, eos = loaded.model, loaded.tokenizer.eos_id
    cache = KVCache(loaded.config, 1, max_context)
    tokens, positions, out, raw = torch.tensor([prompt]), torch.arange(len(prompt))[None], [], []
    for _ in range(n):
        logits = model(tokens, positions, torch.tensor([0]), cache,
                       logits_at=torch.tensor([tokens.shape[1] - 1]))[0, -1].clone()
        logprobs = torch.log_softmax(logits.float(), -1)
        for t in set(prompt) | set(out):
            logits[t] = logits[t] / repetition_penalty if logits[t] > 0 else logits[t] * repetition_penalty
        for t in set(out):
            logits[t] -= frequency_penalty * out.count(t) + presence_penalty
        out.append(int(logits.argmax()))
        raw.append(float(logprobs[out[-1]]))
        if out[-1] == eos:
            break
        positions, tokens = positions[:, -1:] + 1, torch.tensor([[out[-1]]])
    return out, raw
