"""Per-row token sampling for TorchCore: greedy by default, repetition penalties, temperature /
top-k / top-p, one seeded torch.Generator per request, row sampling masks, and the lossless
acceptance rule for verifying deterministic (copied) drafts.

Each request draws only from its own generator, so its tokens do not depend on which other
requests share the batch. Sampling runs on the CPU in float32 whatever the model's device.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Sequence

import torch

from helios.engine.core import TokenLogprobs
from helios.errors import InvalidRequest


# The repetition penalty divides or multiplies logits: positive, 1 is off (vLLM's and HF's sense).
REPETITION_PENALTY_RANGE = (1e-6, 1e6)


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """temperature 0 is greedy; top_k 0, top_p 1 and min_p 0 disable those filters; penalties 0, 0
    and 1 are off (see `penalize`)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one (vLLM's)
    allowed_token_ids: tuple[int, ...] = ()  # vLLM's: when given, every other token is masked

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether `penalize` changes anything."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
                or bool(self.logit_bias) or bool(self.allowed_token_ids))

    @classmethod
    def of(cls, temperature=None, top_p=None, top_k=None, seed=None, presence_penalty=None, frequency_penalty=None,
           repetition_penalty=None, logit_bias=None, min_p=None, allowed_token_ids=None,
           vocab_size: int | None = None) -> SamplingOptions:
        """Validate attach() options; None means the default (greedy, no filters, random seed,
        no penalties, no bias). `logit_bias` maps token ids (below `vocab_size` when given) to
        biases in [-100, 100], OpenAI's range."""
        def number(name, v, low, high):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or not low <= v <= high:
                raise InvalidRequest(f"{name} must be a number in [{low}, {high}], got {v!r}")
            return float(v)

        t = 0.0 if temperature is None else number("temperature", temperature, 0.0, 1e4)
        p = 1.0 if top_p is None else number("top_p", top_p, 0.0, 1.0)
        floor = 0.0 if min_p is None else number("min_p", min_p, 0.0, 1.0)
        for name, v in (("top_k", top_k), ("seed", seed)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise InvalidRequest(f"{name} must be an integer, got {v!r}")
        if seed is not None and not 0 <= seed < 2**63:
            raise InvalidRequest(f"seed must be in [0, 2**63), got {seed!r}")
        # OpenAI's range for presence and frequency.
        presence = 0.0 if presence_penalty is None else number("presence_penalty", presence_penalty, -2.0, 2.0)
        frequency = 0.0 if frequency_penalty is None else number("frequency_penalty", frequency_penalty, -2.0, 2.0)
        repetition = 1.0 if repetition_penalty is None else number("repetition_penalty", repetition_penalty,
                                                                     *REPETITION_PENALTY_RANGE)
        bias = []
        for token, b in dict(logit_bias or {}).items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0 \
                    or (vocab_size is not None and token >= vocab_size):
                raise InvalidRequest(f"logit_bias keys must be token ids in [0, {vocab_size}), got {token!r}")
            bias.append((token, number(f"logit_bias[{token}]", b, -100.0, 100.0)))
        listed = isinstance(allowed_token_ids, (list, tuple)) and len(allowed_token_ids) > 0
        if allowed_token_ids is not None and not listed:
            raise InvalidRequest("allowed_token_ids must list at least one token id")
        for token in allowed_token_ids or ():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0 \
                    or (vocab_size is not None and token >= vocab_size):
                raise InvalidRequest(f"allowed_token_ids must be token ids in [0, {vocab_size}), got {token!r}")
        allowed = tuple(sorted(set(allowed_token_ids or ())))
        # top_k <= 0 disables the filter (OpenAI-style -1 included).
        return cls(t, p, max(0, top_k or 0), seed, presence, frequency, repetition, tuple(sorted(bias)), floor,
                   allowed)

    def generator(self) -> torch.Generator:
        """This request's CPU generator, seeded from `seed` (a random seed when absent)."""
        g = torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else secrets.randbits(63))
        return g


def penalize(logits: torch.Tensor, prompt: Sequence[int], output: Sequence[int], options: SamplingOptions) -> None:
    """Apply a request's logit bias and penalties, in place, to one row of logits [V] that
    samples its next token after `output` (the tokens generated so far, in order):

    - logit bias (OpenAI's): each listed token's bias is added to its logit, first;
    - repetition (CTRL's, as vLLM and HF apply it): a token seen in the prompt or the output has
      its logit divided by the penalty when positive and multiplied by it otherwise, so a penalty
      above 1 always makes it less likely;
    - frequency and presence (OpenAI's): logit[t] -= frequency * c[t] + presence * (c[t] > 0),
      where c[t] counts t in the output only;
    - allowed token ids (vLLM's): every token not listed gets -inf, last.
    Greedy requests take the argmax of the penalized row, so penalties apply to them too.
    """
    if options.logit_bias:
        ids, biases = zip(*options.logit_bias)
        logits[torch.tensor(ids, device=logits.device)] += torch.tensor(biases, dtype=logits.dtype,
                                                                         device=logits.device)
    if options.repetition_penalty != 1.0:
        seen = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        seen[torch.tensor([*prompt, *output], dtype=torch.long, device=logits.device)] = True
        row = logits[seen]
        logits[seen] = torch.where(row > 0, row / options.repetition_penalty, row * options.repetition_penalty)
    if (options.frequency_penalty or options.presence_penalty) and len(output):
        counts = torch.bincount(torch.tensor(list(output), dtype=torch.long, device=logits.device),
                                minlength=logits.shape[-1]).to(logits.dtype)
        logits -= options.frequency_penalty * counts + options.presence_penalty * (counts > 0).to(logits.dtype)
    if options.allowed_token_ids:
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        keep[torch.tensor(options.allowed_token_ids, dtype=torch.long, device=logits.device)] = True
        logits.masked_fill_(~keep, -math.inf)


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the model's raw distribution, from logits [..., V] (a copy, taken
    before bias and penalties change the logits in place)."""
    return torch.log_softmax(logits.detach().float(), dim=-1).cpu()


def token_logprobs(logprobs: torch.Tensor, token: int, top: int) -> TokenLogprobs:
    """The sampled token's entry of one raw log-probability row [V], with the `top` most likely."""
    best = torch.topk(logprobs, top) if top else None
    pairs = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist()))
    return TokenLogprobs(float(logprobs[token]), pairs)


def probabilities(logits: torch.Tensor, options: SamplingOptions) -> torch.Tensor:
    """The target distribution p for one row of logits [V]: temperature, min-p, top-k, then top-p
    (nucleus: the smallest set of most likely tokens whose mass reaches top_p; never empty)."""
    x = logits.detach().float().cpu()
    if options.greedy:  # a point mass on the argmax (ties: the lowest id, like argmax)
        p = torch.zeros_like(x)
        p[int(x.argmax())] = 1.0
        return p
    x = x / options.temperature
    if options.min_p > 0.0:
        # p_i < min_p * p_max  <=>  x_i < x_max + ln(min_p), on the tempered logits (vLLM's order:
        # before top-k and top-p). The most likely token always stays.
        x = x.masked_fill(x < x.max() + math.log(options.min_p), -math.inf)
    if 0 < options.top_k < x.numel():
        kth = torch.topk(x, options.top_k).values[-1]
        x = x.masked_fill(x < kth, -math.inf)
    if options.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        mass = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(mass, dim=-1) - mass  # mass strictly above each token
        drop = before >= options.top_p
        drop[0] = False  # the most likely token always stays
        x = x.scatter(0, order, sorted_x.masked_fill(drop, -math.inf))
    return torch.softmax(x, dim=-1)


def draw(p: torch.Tensor, generator: torch.Generator) -> int:
    """One token from distribution p [V] with the request's generator."""
    return int(torch.multinomial(p, 1, generator=generator))


def sample_rows(logits: torch.Tensor, options: Sequence[SamplingOptions | None],
                generators: Sequence[torch.Generator | None], mask: Sequence[bool]) -> list[int | None]:
    """Sample one token per row of logits [B, V]; rows whose mask is False (padding, prompt
    chunks that do not finish) are not sampled and give None. Greedy rows share one argmax."""
    out: list[int | None] = [None] * logits.shape[0]
    greedy = [b for b, m in enumerate(mask) if m and (options[b] is None or options[b].greedy)]
    if greedy:
        idx = torch.tensor(greedy, device=logits.device)
        for b, t in zip(greedy, logits.index_select(0, idx).argmax(-1).tolist()):
            out[b] = int(t)
    for b, m in enumerate(mask):
        if m and out[b] is None:
            out[b] = draw(probabilities(logits[b], options[b]), generators[b])
    return out


def verify_greedy(targets: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """Greedy verification: `targets[i]` is the argmax after the pending token and i drafts.
    Accept drafts while they equal the argmax; then emit the argmax at the first mismatch
    (the replacement) or after the last draft (the bonus)."""
    out = []
    for i, d in enumerate(drafts):
        if d != targets[i]:
            break
        out.append(d)
    out.append(int(targets[len(out)]))
    return out


def verify_sampled(logits: torch.Tensor, drafts: Sequence[int], options: SamplingOptions,
                   generator: torch.Generator) -> list[int]:
    """Lossless verification of deterministic drafts against logits [len(drafts) + 1, V].

    The draft distribution q is a point mass on draft t, so the speculative-sampling rule
    min(1, p(t)/q(t)) accepts t with probability p(t); on rejection the residual
    max(0, p - q) is p with t removed, renormalized. Every emitted token is then distributed
    exactly as ordinary sampling from p would give it.
    """
    out = []
    for i, d in enumerate(drafts):
        p = probabilities(logits[i], options)
        if float(torch.rand((), generator=generator)) < float(p[d]):
            out.append(int(d))
            continue
        p[d] = 0.0  # rejected: p(d) < 1 here, so the residual has positive mass
        out.append(draw(p / p.sum(), generator))
        return out
    out.append(draw(probabilities(logits[len(drafts)], options), generator))
    return out
