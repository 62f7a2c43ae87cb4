"""OpenAI response bodies and chunks, and the SSE response that cancels on disconnect."""

from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from helios.server.errors import APIError

DONE = "data: [DONE]\n\n"


class Formatter:
    """Builds one request's response objects in OpenAI's completion or chat format."""

    def __init__(self, chat: bool, model: str, request_id: str, include_usage: bool = False,
                 continuous_usage: bool = False):
        self.chat = chat
        self.model = model
        self.id = request_id
        self.created = int(time.time())
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage  # vLLM's continuous_usage_stats

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False,
              counts: tuple[int, int] | None = None, index: int = 0, logprobs: dict | None = None) -> str:
        """One chunk of choice `index`; `counts` (prompt, completion tokens so far) fill its usage
        when the client asked for continuous usage stats."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
            body = self._envelope("text_completion", [choice])
        if self.continuous_usage and counts is not None:
            body["usage"] = usage(*counts)
        elif self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return _event(body)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return _event(body)

    def full(self, choices: list[tuple[str, str, dict | None]], prompt_tokens: int, completion_tokens: int) -> dict:
        """The whole response; `choices` are (text, finish_reason, logprobs) in index order."""
        if self.chat:
            body = self._envelope("chat.completion", [
                {"index": i, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                 "finish_reason": finish} for i, (text, finish, logprobs) in enumerate(choices)])
        else:
            body = self._envelope("text_completion", [
                {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}
                for i, (text, finish, logprobs) in enumerate(choices)])
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return body


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def error_event(error: APIError) -> str:
    # OpenAI-style streams report a late failure as a data event carrying "error"; the openai
    # client raises it as an APIError.
    return _event(error.body())


def _event(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


class EventStreamResponse(Response):
    """Streams `events` as text/event-stream. A client disconnect calls `on_disconnect` at
    once (not at the next write), and `on_close` always runs when the response ends."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_disconnect: Callable[[], None],
                 on_close: Callable[[], None]):
        self.events = events
        self.on_disconnect = on_disconnect
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            self.on_disconnect()

        listener = asyncio.create_task(listen())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for data in self.events:
                if gone.is_set():
                    break
                await send({"type": "http.response.body", "body": data.encode("utf-8"), "more_body": True})
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self.on_disconnect()  # the socket went away while writing
        finally:
            listener.cancel()
            self.on_close()
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()
