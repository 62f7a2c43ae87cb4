"""From a TorchCore graph's logits to each lane's output tokens: sampled rows, verified
speculative positions, and the raw log-probabilities of what they emit (taken before bias,
penalties and a response format's grammar change the logits in place)."""

from __future__ import annotations

import torch

from helios.engine.sampling import penalize, raw_logprobs, sample_rows, token_logprobs, verify_greedy, verify_sampled
from helios.engine.torch_graphs import Packing
from helios.engine.torch_state import LaneWork


def sample_outputs(works: list[LaneWork], logits: torch.Tensor, packing: Packing, lps: dict) -> list[list[int]]:
    """One token per sampled row of logits [B, V] (bias and penalties, stopping masks, then
    sampling); requests that asked for log-probabilities get them in `lps` by handle."""
    n = len(works)
    raw = {b: raw_logprobs(logits[b]) for b, w in enumerate(works)
           if w.request.logprobs is not None and packing.sample_mask[b]}
    for b, w in enumerate(works):
        if w.request.options.penalized and packing.sample_mask[b]:
            penalize(logits[b], w.request.prompt, w.request.generated, w.request.options)
        if w.request.stopping.blocks(len(w.request.generated)):
            logits[b, list(w.request.stopping.terminal)] = float("-inf")
        if w.request.constraint is not None and packing.sample_mask[b]:
            w.request.constraint.mask(logits[b])
    opts = [w.request.options for w in works] + [None] * (logits.shape[0] - n)
    gens = [w.request.generator for w in works] + [None] * (logits.shape[0] - n)
    tokens = sample_rows(logits, opts, gens, packing.sample_mask)
    for b, row in raw.items():
        lps[works[b].request.handle] = [token_logprobs(row, tokens[b], works[b].request.logprobs)]
    return [[] if t is None else [t] for t in tokens[:n]]


def verify_outputs(works: list[LaneWork], drafts: list[list[int]], logits: torch.Tensor,
                   lps: dict) -> list[list[int]]:
    """Each lane's accepted drafts and its replacement or bonus token, from logits [B, D + 1, V];
    position i is penalized and masked as if drafts[:i] were accepted (they must be to use it)."""
    out = []
    for b, (w, d) in enumerate(zip(works, drafts)):
        stop = w.request.stopping
        raw = raw_logprobs(logits[b, : len(d) + 1]) if w.request.logprobs is not None else None
        for i in range(len(d) + 1):  # position i samples output number len(generated) + i + 1
            if w.request.options.penalized:  # as if drafts d[:i] were accepted, as they must be to use it
                penalize(logits[b, i], w.request.prompt, [*w.request.generated, *d[:i]], w.request.options)
            if stop.blocks(len(w.request.generated) + i):
                logits[b, i, list(stop.terminal)] = float("-inf")
        if w.request.constraint is not None:  # no drafts (LaneWork.drafts): only position 0 samples
            w.request.constraint.mask(logits[b, 0])
        opts = w.request.options
        if opts.greedy:
            out.append(verify_greedy(logits[b, : len(d) + 1].argmax(-1).tolist(), d))
        else:
            out.append(verify_sampled(logits[b, : len(d) + 1], d, opts, w.request.generator))
        if raw is not None:  # position i emitted out[-1][i]
            lps[w.request.handle] = [token_logprobs(raw[i], t, w.request.logprobs) for i, t in enumerate(out[-1])]
    return out


def prompt_entries(work: LaneWork, logits: torch.Tensor) -> list:
    """The prompt tokens' entries that a scored prefill row's logits [n, V] (its chunk's positions
    s..s+n-1, in order) give: tokens s+1..s+n that lie in the prompt, after None for token 0 when
    the chunk starts the prompt (see Execution.prompt_logprobs)."""
    r, start = work.request, work.lane.prompt_start
    n = min(len(logits), len(r.prompt) - 1 - start)  # the last prompt position predicts the output
    raw = raw_logprobs(logits[:n]) if n > 0 else None
    scored = [token_logprobs(raw[j], r.prompt[start + j + 1], r.prompt_logprobs) for j in range(max(0, n))]
    return ([None] if start == 0 else []) + scored


def prompt_scores(works: list[LaneWork], row_logits) -> dict | None:
    """Execution.prompt_logprobs of a scored prefill: by handle, the entries of each row whose
    request asked (`prompt_entries`); `row_logits(b)` is row b's logits [n, V] at its chunk's
    positions."""
    scores = {w.request.handle: tuple(prompt_entries(w, row_logits(b)))
              for b, w in enumerate(works) if w.request.prompt_logprobs is not None}
    return scores or None


def aligned_logprobs(records, lps: dict) -> dict | None:
    """Log-probabilities by handle, cut to the tokens each record kept (nothing after EOS)."""
    return {r.handle: tuple(lps[r.handle][: len(r.tokens)]) for r in records if r.handle in lps} or None
