"""The sampling fields both endpoints share, checked and turned into SamplingParams: n, the
ranges of temperature, top_p, penalties, top_k, seed and stop, logit_bias, logprobs, and vLLM's
stopping extensions and the output constraint (response_format, structured_outputs or guided_*, passed
to the core as attach options)."""

from __future__ import annotations

from helios.engine.grammar import GRAMMAR_OPTION
from helios.engine.sampling import REPETITION_PENALTY_RANGE
from helios.runtime.stream import SamplingParams
from helios.server.errors import APIError
from helios.server.structured_outputs import request_grammar
from helios.server.schemas import ChatCompletionRequest

MAX_STOPS = 4  # OpenAI's limit
MAX_N = 128  # OpenAI's limit on choices per prompt
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send temperature=0 for greedy decoding


def check_shared(req) -> int:
    """Check what both endpoints share; return n."""
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be between 1 and {MAX_N}, got {n}", param="n", code="invalid_value")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options",
                       code="invalid_value")
    checks = (("temperature", req.temperature, 0.0, 2.0), ("top_p", req.top_p, 0.0, 1.0),
              ("min_p", req.min_p, 0.0, 1.0), ("presence_penalty", req.presence_penalty, -2.0, 2.0),
              ("frequency_penalty", req.frequency_penalty, -2.0, 2.0))
    for name, v, low, high in checks:
        if v is not None and not low <= v <= high:
            raise APIError(400, f"{name} must be between {low:g} and {high:g}, got {v!r}", param=name,
                           code="invalid_value")
    low, high = REPETITION_PENALTY_RANGE
    if req.repetition_penalty is not None and not low <= req.repetition_penalty <= high:
        raise APIError(400, f"repetition_penalty must be between {low:g} and {high:g} (1 is off), got "
                            f"{req.repetition_penalty!r}", param="repetition_penalty", code="invalid_value")
    if req.top_k is not None and req.top_k < -1:
        raise APIError(400, f"top_k must be -1 (disabled), 0 (disabled) or positive, got {req.top_k}",
                       param="top_k", code="invalid_value")
    if req.seed is not None and not 0 <= req.seed < 2**63:
        raise APIError(400, f"seed must be in [0, 2**63), got {req.seed}", param="seed", code="invalid_value")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > MAX_STOPS:
        raise APIError(400, f"at most {MAX_STOPS} stop sequences are allowed, got {len(stops)}", param="stop",
                       code="invalid_value")
    for s in stops:
        if not text_field(s, "stop"):
            raise APIError(400, "stop sequences must be nonempty strings", param="stop", code="invalid_value")
    return n


def text_field(s: str, param: str) -> str:
    # JSON may carry lone surrogates (\ud800) that no tokenizer can encode.
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, f"'{param}' is not valid Unicode (it contains a lone surrogate)", param=param,
                       code="invalid_encoding") from None
    return s


def _logit_bias(bias: dict[str, float], vocab_size: int | None) -> dict[int, float]:
    """OpenAI's logit_bias: token ids (as JSON object keys, so strings) to biases in [-100, 100]."""
    out = {}
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else None
        if token is None or (vocab_size is not None and token >= vocab_size):
            raise APIError(400, f"logit_bias keys must be token ids in [0, {vocab_size}), got {key!r}",
                           param="logit_bias", code="invalid_value")
        if not -100 <= value <= 100:
            raise APIError(400, f"logit_bias values must be between -100 and 100, got {value!r} for token {key}",
                           param="logit_bias", code="invalid_value")
        out[token] = float(value)
    return out


def _logprobs(req) -> int | None:
    """Top alternatives per output token, or None: completions' `logprobs: k`, chat's
    `logprobs: true` with `top_logprobs: k` (0 when absent)."""
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def sampling_params(req, max_tokens: int, request_id: str, vocab_size: int | None) -> SamplingParams:
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingParams(
        max_tokens=max_tokens, stop=stops, include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else float(req.temperature),
        top_p=None if req.top_p is None else float(req.top_p),
        top_k=req.top_k, seed=req.seed, client=req.user or "default", request_id=request_id, logprobs=_logprobs(req),
        core_options=_core_options(req, max_tokens, vocab_size))


def _core_options(req, max_tokens: int, vocab_size: int | None) -> dict:
    """Penalties, min_p, vLLM's stopping extensions and the output constraint's grammar, for the core
    (TorchCore honours them; see docs/server.md); a value that changes nothing is left out."""
    options: dict = {name: float(v) for name, v, off in (
        ("presence_penalty", req.presence_penalty, 0), ("frequency_penalty", req.frequency_penalty, 0),
        ("repetition_penalty", req.repetition_penalty, 1), ("min_p", req.min_p, 0)) if v is not None and v != off}
    if req.ignore_eos:
        options["ignore_eos"] = True
    if req.min_tokens is not None:
        if not 0 <= req.min_tokens <= max_tokens:
            raise APIError(400, f"min_tokens must be in [0, max_tokens={max_tokens}], got {req.min_tokens}",
                           param="min_tokens", code="invalid_value")
        if req.min_tokens:
            options["min_tokens"] = req.min_tokens
    if req.logit_bias:
        options["logit_bias"] = _logit_bias(req.logit_bias, vocab_size)
    grammar, param = request_grammar(req)
    if grammar is not None:
        if req.ignore_eos or req.min_tokens:
            # The grammar ends the output with EOS, which these would forbid.
            raise APIError(400, f"{param} cannot be combined with ignore_eos or min_tokens", param=param,
                           code="invalid_value")
        options[GRAMMAR_OPTION] = grammar
    if req.allowed_token_ids is not None and (grammar is not None or req.min_tokens):
        # Their masks could leave no token at all (TorchCore refuses the same).
        raise APIError(400, "allowed_token_ids cannot be combined with a structured output or min_tokens",
                       param="allowed_token_ids", code="invalid_value")
    for name in ("stop_token_ids", "allowed_token_ids"):  # vLLM's
        ids = getattr(req, name)
        if ids is None or (not ids and name == "stop_token_ids"):
            continue
        if not ids:
            raise APIError(400, f"{name} must list at least one token id", param=name, code="invalid_value")
        if any(t < 0 or (vocab_size is not None and t >= vocab_size) for t in ids):
            raise APIError(400, f"{name} must be token ids in [0, {vocab_size}), got {ids}", param=name,
                           code="invalid_value")
        options[name] = tuple(ids)
    return options
