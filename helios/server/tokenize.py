"""vLLM's /tokenize, /detokenize and /version.

/tokenize takes a `prompt` (a completion's text) or `messages` (a chat, rendered by the chat
template as /v1/chat/completions renders it) and answers `{"count", "max_model_len", "tokens",
"token_strs"}`: the token ids this server feeds the model for that request. /detokenize takes
`{"tokens": [...]}` and answers `{"prompt": text}`. /version answers `{"version": ...}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

import helios
from helios.server.errors import APIError
from helios.server.schemas import ChatCompletionRequest, ChatMessage, _Strict, parse_body
from helios.server.translate import prepare_chat


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # accepted as vLLM's; this server's prompts carry no added BOS
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


# The JSON bodies the routes parse themselves, for the app's OpenAPI schema (clients, schema fuzzing).
BODIES = (("/tokenize", TokenizeRequest), ("/detokenize", DetokenizeRequest))


def tokenize(req: TokenizeRequest, tokenizer, max_context: int) -> dict:
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt", code="invalid_value")
    if req.prompt is not None:
        ids = tokenizer.encode(req.prompt)
    else:
        chat = ChatCompletionRequest(messages=req.messages, add_generation_prompt=req.add_generation_prompt,
                                     continue_final_message=req.continue_final_message,
                                     chat_template_kwargs=req.chat_template_kwargs, max_tokens=1)
        # An unbounded context: counting tokens never refuses a long conversation.
        ids = prepare_chat(chat, tokenizer, 1 << 62).choices[0].prompt_ids
    strs = [tokenizer.token_bytes(t).decode("utf-8", "replace") for t in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": max_context, "tokens": list(ids), "token_strs": strs}


def detokenize(req: DetokenizeRequest, tokenizer, vocab_size: int) -> dict:
    bad = next((t for t in req.tokens if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab_size})", param="tokens",
                       code="invalid_value")
    return {"prompt": tokenizer.decode(req.tokens)}


def install(app: FastAPI, service, read_body, check_model) -> None:
    """Add the three routes to `app` (`read_body` and `check_model` are the app's own)."""
    backend = service.backend

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        req = await run_in_threadpool(parse_body, TokenizeRequest, await read_body(request, service.settings))
        check_model(req.model, backend)
        return await run_in_threadpool(tokenize, req, backend.tokenizer, backend.max_context)

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        req = await run_in_threadpool(parse_body, DetokenizeRequest, await read_body(request, service.settings))
        check_model(req.model, backend)
        return await run_in_threadpool(detokenize, req, backend.tokenizer, backend.vocab_size)

    @app.get("/version")
    async def version():
        return {"version": helios.__version__}
