"""`--weights gguf` against llama.cpp on the same file (data/llama_cpp_reference.json, recorded by
scripts/llama_cpp_reference.py with llama.cpp b1-0c1e570): greedy continuations of chat prompts and
perplexity on data/perplexity_text.txt, computed the way llama-perplexity computes it."""

import json
import math
import pathlib

import pytest
import torch

from helios.engine.model import KVCache, LlamaModel, Tokenizer, WeightFormat, generate_greedy, load_weights
from helios.engine.model.loader import load_quantized
from helios.engine.model.quant import int4pack_available

ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE = json.loads((ROOT / "data/llama_cpp_reference.json").read_text())
# Greedy continuations identical to llama.cpp's over all their tokens: measured 7 of 12 (float32
# weights: 6). The others part at near-ties, which llama.cpp's 8-bit activations and our bfloat16
# ones break differently: at each parting llama.cpp's token was within 0.17 logits of our top one
# (float32: 0.19), so NEAR_TIE allows 0.5.
MIN_IDENTICAL = 6
NEAR_TIE = 0.5
# |ppl / llama.cpp's - 1|: measured +0.18% on this text (llama.cpp 23.168, ours 23.210; float32
# weights 23.290, +0.53%).
PPL_TOLERANCE = 0.01

pytestmark = pytest.mark.skipif(not int4pack_available(), reason="no CPU int4 kernel in this torch")


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in test_forward: one thread degrades gently on a shared box
    config, weights = load_weights()
    built = LlamaModel(config, weights, weight_format=WeightFormat.GGUF, quantized=load_quantized())
    del weights
    yield built
    torch.set_num_threads(threads)


def partings(model, tok) -> list[tuple[int, int, float | None]]:
    """Per recorded chat: (tokens ours reproduce before the first difference, llama.cpp's token
    count, and at the difference how far llama.cpp's token's logit is below our top one)."""
    out = []
    for chat in REFERENCE["chats"]:
        theirs = list(chat["tokens"])
        if chat["stop_type"] == "eos":  # llama.cpp leaves the EOS out of its tokens
            theirs.append(tok.eos_id)
        cache = KVCache(model.config, num_slots=1, max_context=256)
        ours = generate_greedy(model, tok, chat["prompt_ids"], len(theirs), cache)
        n = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(theirs))
        gap = None
        if n < len(theirs):  # our logits after llama.cpp's own first n tokens
            ids = chat["prompt_ids"] + theirs[:n]
            cache = KVCache(model.config, num_slots=1, max_context=256)
            logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], torch.tensor([0]), cache,
                           logits_at=torch.tensor([len(ids) - 1]))[0, -1]
            gap = float(logits.max() - logits[theirs[n]])
        out.append((n, len(theirs), gap))
    return out


def test_greedy_continuations_agree_with_llama_cpp_up_to_near_ties(model):
    tok = Tokenizer.from_gguf()
    assert all(c["prompt_ids"] == c["llama_cpp_prompt_ids"] for c in REFERENCE["chats"])  # same tokenizer
    found = partings(model, tok)
    assert sum(n == total for n, total, _ in found) >= MIN_IDENTICAL, found
    assert all(gap is None or gap <= NEAR_TIE for _, _, gap in found), found


def perplexity(model, ids: list[int], n_ctx: int, bos: int | None) -> float:
    """llama-perplexity's estimate: chunks of n_ctx tokens (BOS first where the vocabulary adds
    one), each scoring its second half: token j + 1 from the logits at j, n_ctx/2 <= j < n_ctx - 1."""
    nll, count = 0.0, 0
    first = n_ctx // 2
    for start in range(0, len(ids) - n_ctx + 1, n_ctx):
        chunk = list(ids[start:start + n_ctx])
        if bos is not None:
            chunk[0] = bos
        cache = KVCache(model.config, num_slots=1, max_context=n_ctx)
        logits = model(torch.tensor([chunk]), torch.arange(n_ctx)[None], torch.tensor([0]), cache)[0]
        logp = torch.log_softmax(logits[first:n_ctx - 1].double(), dim=-1)
        nll -= float(logp.gather(1, torch.tensor(chunk[first + 1:])[:, None]).sum())
        count += n_ctx - 1 - first
    return math.exp(nll / count)


def test_perplexity_is_llama_cpps_within_tolerance(model):
    ref = REFERENCE["perplexity"]
    ppl = perplexity(model, ref["token_ids"], ref["n_ctx"], model.config.bos_id)
    assert abs(ppl / ref["ppl"] - 1) <= PPL_TOLERANCE, (ppl, ref["ppl"])
