"""Limits checked before any work is done on a request (issue 42): a prompt too long for the
context is refused from its size in bytes, before the tokenizer runs.

Every token of a byte-level tokenizer stands for at most `longest` bytes of text (its longest
token, special tokens included), so text of B bytes has at least ceil(B / longest) tokens, and
text longer than max_context x longest bytes can never fit the context. Refusing it from its size
costs nothing; tokenizing it first (what every server does to count tokens) cost seconds and
hundreds of MB per 2 MB prompt. A prompt under the bound is tokenized as before (off the event
loop) and then checked in tokens.
"""

from __future__ import annotations

from helios.server.errors import APIError


def longest_token_bytes(tokenizer) -> int:
    """The most bytes one token of `tokenizer` stands for (read once, at startup)."""
    return max(len(tokenizer.token_bytes(t)) for t in range(tokenizer.vocab_size))


def check_prompt_size(req, chat: bool, max_context: int, longest: int) -> None:
    """A 400 (context_length_exceeded) for a prompt that cannot fit `max_context` tokens, from its
    byte length alone (or its length, for token ids)."""
    bound = max_context * longest
    if chat:
        size = sum(_text_bytes(m.content) for m in req.messages)
        if size > bound:
            _refuse("messages", f"the messages hold {size} bytes of text", max_context, bound, longest)
        return
    prompt = req.prompt
    batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    for i, one in enumerate(batch):
        param = "prompt" if len(batch) == 1 else f"prompt.{i}"
        if isinstance(one, list) and len(one) >= max_context:
            raise APIError(400, f"This model's maximum context length is {max_context} tokens; the prompt has "
                                f"{len(one)} tokens and leaves no room for output", param=param,
                           code="context_length_exceeded")
        if isinstance(one, str) and (size := _text_bytes(one)) > bound:
            _refuse(param, f"the prompt is {size} bytes", max_context, bound, longest)


def _text_bytes(content) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    return sum(_text_bytes(part.text) for part in content)


def _refuse(param: str, what: str, max_context: int, bound: int, longest: int):
    raise APIError(400, f"{what}; this model's maximum context length is {max_context} tokens, which hold at "
                        f"most {bound} bytes (no token is longer than {longest} bytes)", param=param,
                   code="context_length_exceeded")
