"""From a validated OpenAI request to what the runtime takes: prompt token ids and SamplingParams.

Every option this server cannot honour is rejected here with a 400 that names the parameter;
nothing is silently ignored except `name` on chat messages, `parallel_tool_calls` and vLLM's
`guided_decoding_backend` (one backend, llguidance, serves every structured output).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from helios.engine.core import MAX_LOGPROBS
from helios.runtime.stream import SamplingParams
from helios.server.anchors import message_endpoints
from helios.server.errors import APIError
from helios.server.sampling_fields import check_shared, sampling_params, text_field
from helios.server.schemas import ChatCompletionRequest, CompletionRequest

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of a response: a prompt and its sampling, submitted as one runtime request."""

    prompt_ids: list[int]
    params: SamplingParams
    echo_text: str | None = None
    counts_prompt: bool = True  # n choices of one prompt count its tokens once in usage (OpenAI's)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One API request, ready for Runtime.submit: its choices in OpenAI's index order (prompt by
    prompt, then the n samples of each)."""

    request_id: str
    choices: tuple[Choice, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage on every chunk


def prepare_completion(req: CompletionRequest, tokenizer, max_context: int, vocab_size: int) -> Prepared:
    n = check_shared(req)
    if req.best_of not in (None, 1):
        raise APIError(400, "only best_of=1 is supported", param="best_of", code="unsupported_parameter")
    if req.suffix is not None:
        raise APIError(400, "suffix (insertion) is not supported", param="suffix", code="unsupported_parameter")
    if req.logprobs is not None:
        if not 0 <= req.logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"logprobs must be between 0 and {MAX_LOGPROBS}, got {req.logprobs}",
                           param="logprobs", code="invalid_value")
    prompt = req.prompt
    # A list of strings or of token-id lists is a batch: one choice (n choices) per prompt.
    batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    rid = f"cmpl-{uuid.uuid4().hex}"
    choices = []
    for i, one in enumerate(batch):
        param = "prompt" if len(batch) == 1 else f"prompt.{i}"
        ids, echo = _completion_prompt(one, param, tokenizer, vocab_size, req.echo)
        max_tokens = _max_tokens(req.max_tokens, "max_tokens", len(ids), max_context, DEFAULT_COMPLETION_TOKENS,
                                 param)
        params = sampling_params(req, max_tokens, rid, vocab_size)
        if req.echo and req.logprobs is not None:  # the echoed prompt's own log-probabilities (scored prefill)
            params = dataclasses.replace(params, prompt_logprobs=req.logprobs)
        choices += _samples(n, ids, params, echo)
    return _prepared(rid, choices, req)


def _completion_prompt(prompt: str | list[int], param: str, tokenizer, vocab_size: int,
                       echo: bool) -> tuple[list[int], str | None]:
    if isinstance(prompt, str):
        ids = tokenizer.encode(text_field(prompt, param))
        text = prompt
    else:
        ids = list(prompt)
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab_size})", param=param,
                           code="invalid_value")
        text = tokenizer.decode(ids) if echo else None
    if not ids:
        raise APIError(400, "the prompt is empty", param=param, code="invalid_value")
    return ids, text if echo else None


def _samples(n: int, ids: list[int], params: SamplingParams, echo: str | None = None) -> list[Choice]:
    # A seeded request gives its j-th sample seed + j (as vLLM does), so the n samples differ
    # and the whole response is reproducible.
    seeds = [None] * n if params.seed is None else [(params.seed + j) % 2**63 for j in range(n)]
    return [Choice(ids, dataclasses.replace(params, seed=seed), echo, counts_prompt=j == 0)
            for j, seed in enumerate(seeds)]


def prepare_chat(req: ChatCompletionRequest, tokenizer, max_context: int, vocab_size: int | None = None) -> Prepared:
    n = check_shared(req)
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs",
                           code="invalid_value")
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}",
                           param="top_logprobs", code="invalid_value")
    if req.tools:
        raise APIError(400, "tools (function calling) are not supported", param="tools",
                       code="unsupported_parameter")
    if req.tool_choice not in (None, "none"):
        raise APIError(400, "tool_choice is not supported", param="tool_choice", code="unsupported_parameter")
    if req.functions:
        raise APIError(400, "functions (function calling) are not supported", param="functions",
                       code="unsupported_parameter")
    if req.function_call not in (None, "none"):
        raise APIError(400, "function_call is not supported", param="function_call", code="unsupported_parameter")
    if req.modalities not in (None, [], ["text"]) or req.audio is not None:
        param = "audio" if req.audio is not None else "modalities"
        raise APIError(400, "this model produces text only", param=param, code="unsupported_parameter")
    if req.prediction is not None:
        raise APIError(400, "predicted outputs are not supported", param="prediction", code="unsupported_parameter")
    if req.reasoning_effort is not None:
        raise APIError(400, "reasoning_effort is not supported: this model does not reason before answering",
                       param="reasoning_effort", code="unsupported_parameter")
    if not req.messages:
        raise APIError(400, "messages must contain at least one message", param="messages", code="invalid_value")
    messages = []
    for i, m in enumerate(req.messages):
        if m.role in ("tool", "function") or m.tool_calls or m.tool_call_id is not None:
            param = f"messages.{i}." + ("role" if m.role in ("tool", "function") else
                                        "tool_calls" if m.tool_calls else "tool_call_id")
            raise APIError(400, "tool messages and tool calls (function calling) are not supported", param=param,
                           code="unsupported_parameter")
        if m.content is None:
            raise APIError(400, f"Missing required parameter: 'messages.{i}.content'", param=f"messages.{i}.content",
                           code="missing_parameter")
        if isinstance(m.content, str):
            content = text_field(m.content, f"messages.{i}.content")
        else:
            parts = []
            for j, part in enumerate(m.content):
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"content part type {part.type!r} is not supported: this model takes "
                                        f"text parts only", param=f"messages.{i}.content.{j}",
                                   code="unsupported_content")
                parts.append(text_field(part.text, f"messages.{i}.content.{j}.text"))
            content = "\n".join(parts)
        # "developer" is OpenAI's newer name for the system role.
        messages.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    if req.continue_final_message and req.add_generation_prompt:
        raise APIError(400, "continue_final_message continues the last message, so it needs add_generation_prompt "
                            "false", param="continue_final_message", code="invalid_value")
    variables = dict(req.chat_template_kwargs or {})
    taken = sorted(set(variables) & {"messages", "add_generation_prompt"})
    if taken:
        raise APIError(400, f"chat_template_kwargs cannot set {', '.join(taken)} (they are the request's own)",
                       param="chat_template_kwargs", code="invalid_value")
    try:
        text = _render(tokenizer, messages, req.add_generation_prompt, req.continue_final_message, variables)
    except Exception as exc:  # the model's jinja template may refuse a conversation
        raise APIError(400, f"the chat template rejected the messages: {exc}", param="messages",
                       code="invalid_value") from None
    ids = tokenizer.encode(text)
    limit, param = req.max_completion_tokens, "max_completion_tokens"
    if limit is None:
        limit, param = req.max_tokens, "max_tokens"
    max_tokens = _max_tokens(limit, param, len(ids), max_context, None, "messages")
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    params = dataclasses.replace(sampling_params(req, max_tokens, rid, vocab_size),
                                 endpoints=message_endpoints(tokenizer, messages, text, ids, variables))
    return _prepared(rid, _samples(n, ids, params), req)


# Marks where the final message's content ends (continue_final_message). A conversation that
# itself holds the mark is refused rather than cut in the wrong place.
_CUT = "\x00helios-continue-final-message\x00"


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool, continue_final_message: bool,
            variables: dict) -> str:
    if not continue_final_message:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **variables)
    # The final content is rendered with a mark after it and the text cut there: whatever the
    # template writes after a message's content (its end of turn) goes, so the model continues it.
    last = {**messages[-1], "content": messages[-1]["content"] + _CUT}
    text = tokenizer.apply_chat_template([*messages[:-1], last], add_generation_prompt=False, **variables)
    if text.count(_CUT) != 1:
        raise ValueError("it does not keep the final message's content as it is, so it cannot be continued")
    return text[:text.index(_CUT)]


def _prepared(rid: str, choices: list[Choice], req) -> Prepared:
    if len(choices) > 1:  # each runtime request keeps a label of its own: the response id and its index
        choices = [dataclasses.replace(c, params=dataclasses.replace(c.params, request_id=f"{rid}-{i}"))
                   for i, c in enumerate(choices)]
    return Prepared(rid, tuple(choices), req.stream, _include_usage(req), _continuous_usage(req))


def _max_tokens(value: int | None, param: str, prompt: int, max_context: int, default: int | None,
                prompt_param: str) -> int:
    room = max_context - prompt
    if room < 1:
        raise APIError(400, f"This model's maximum context length is {max_context} tokens; the prompt has "
                            f"{prompt} tokens and leaves no room for output", param=prompt_param,
                       code="context_length_exceeded")
    if value is None:
        return room if default is None else min(default, room)
    if value < 1:
        raise APIError(400, f"{param} must be at least 1, got {value}", param=param, code="invalid_value")
    if value > room:
        raise APIError(400, f"This model's maximum context length is {max_context} tokens. However, you "
                            f"requested {prompt + value} tokens ({prompt} in the prompt, {value} in the "
                            f"completion). Please reduce the prompt or {param}.", param=param,
                       code="context_length_exceeded")
    return value


def _include_usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _continuous_usage(req) -> bool:
    # vLLM sends usage on every chunk only when include_usage asks for usage at all.
    return _include_usage(req) and req.stream_options.continuous_usage_stats
