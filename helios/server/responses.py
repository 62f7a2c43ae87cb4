"""One API request's choices, each a runtime request: their events merged as they publish, the
collected response body, and the error that a choice which did not complete becomes."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Callable

from fastapi import Request

from helios.runtime.stream import LENGTH, STOP, RequestStream, StreamEvent
from helios.server.errors import APIError
from helios.server.logprobs import LogprobsFormatter
from helios.server.sse import DONE, Formatter, error_event
from helios.server.translate import Prepared


class Choices:
    """The runtime streams of one request's choices, in OpenAI's index order, and the logprobs
    formatter of those that asked for log-probabilities."""

    def __init__(self, prepared: Prepared, streams: list[RequestStream], logprobs: LogprobsFormatter | None = None):
        self.prepared = prepared
        self.streams = streams
        self.logprobs = logprobs

    def wants_logprobs(self, index: int) -> bool:
        return self.logprobs is not None and self.prepared.choices[index].params.logprobs is not None

    def echo_logprobs(self, index: int) -> dict | None:
        """The echoed prompt's logprobs (completions with echo and logprobs), once the prompt ran."""
        prompt = self.streams[index].prompt_logprobs
        if prompt is None or self.logprobs is None:
            return None
        ids = self.prepared.choices[index].prompt_ids
        return self.logprobs.build(index, ids, (list(prompt) + [None] * len(ids))[:len(ids)])

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()  # a no-op on a stream that has ended

    def counts(self) -> tuple[int, int]:
        """(prompt, completion) tokens so far: a prompt counts once for its n choices, as in OpenAI's usage."""
        prompt = sum(s.usage.prompt_tokens for s, c in zip(self.streams, self.prepared.choices) if c.counts_prompt)
        return prompt, sum(s.usage.completion_tokens for s in self.streams)

    async def merged(self) -> AsyncIterator[tuple[int, StreamEvent | None]]:
        """(index, event) as the choices publish, then (index, None) once that choice has ended."""
        queue: asyncio.Queue[tuple[int, StreamEvent | None]] = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            try:
                async for event in stream:
                    queue.put_nowait((index, event))
            finally:
                queue.put_nowait((index, None))

        pumps = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            left = len(pumps)
            while left:
                item = await queue.get()
                left -= item[1] is None
                yield item
        finally:
            for task in pumps:
                task.cancel()


async def events(choices: Choices, fmt: Formatter, draining: Callable[[], bool]) -> AsyncIterator[str]:
    """The SSE events of a streamed response. A choice that fails ends the response with an error
    event and cancels the others. `draining()` says whether the server is shutting down (for the
    error a cancelled choice gets)."""
    n = len(choices.streams)
    if fmt.chat:
        for i in range(n):
            yield fmt.chunk(role=True, counts=choices.counts(), index=i)
    # An echo with the prompt's log-probabilities waits for them: they exist once the prompt ran.
    scored = {i for i, c in enumerate(choices.prepared.choices) if c.echo_text and c.params.prompt_logprobs is not None}
    for i, choice in enumerate(choices.prepared.choices):
        if choice.echo_text and i not in scored:
            yield fmt.chunk(text=choice.echo_text, counts=choices.counts(), index=i)
    async with contextlib.aclosing(choices.merged()) as merged:
        async for i, event in merged:
            if event is not None and i in scored:
                scored.discard(i)
                yield fmt.chunk(text=choices.prepared.choices[i].echo_text, counts=choices.counts(), index=i,
                                logprobs=choices.echo_logprobs(i))
            if event is not None:
                logprobs = None
                if choices.wants_logprobs(i) and event.token_ids:
                    entries = event.logprobs or (None,) * len(event.token_ids)
                    logprobs = choices.logprobs.build(i, event.token_ids, entries)
                if event.text or logprobs is not None:
                    yield fmt.chunk(text=event.text, counts=choices.counts(), index=i, logprobs=logprobs)
                continue
            stream = choices.streams[i]
            if stream.finish_reason not in (STOP, LENGTH):
                choices.cancel()
                yield error_event(ended_error(stream, draining()))
                break
            yield fmt.chunk(finish=stream.finish_reason, counts=choices.counts(), index=i)
    if fmt.include_usage:
        yield fmt.usage_chunk(*choices.counts())
    yield DONE


async def collect(request: Request, choices: Choices, fmt: Formatter, draining: Callable[[], bool]) -> dict:
    """The whole response once every choice has ended; a client that goes away cancels them all."""
    async def watch() -> None:
        # After the body is read, receive() returns only when the client goes away.
        while (await request.receive())["type"] != "http.disconnect":
            pass
        choices.cancel()

    watcher = asyncio.create_task(watch())
    texts: list[list[str]] = [[] for _ in choices.streams]
    tokens: list[list] = [[] for _ in choices.streams]  # (token id, logprobs entry) pairs of each choice
    try:
        async with contextlib.aclosing(choices.merged()) as merged:
            async for i, event in merged:
                if event is not None:
                    texts[i].append(event.text)
                    tokens[i].extend(zip(event.token_ids, event.logprobs or (None,) * len(event.token_ids)))
                elif choices.streams[i].finish_reason not in (STOP, LENGTH):
                    raise ended_error(choices.streams[i], draining())
    finally:
        watcher.cancel()
        choices.cancel()  # frees the slots if this handler is torn down early, or one choice failed
    def logprobs(i: int) -> dict | None:
        if not choices.wants_logprobs(i):
            return None
        echo = choices.echo_logprobs(i)  # first: text offsets run from the start of the echoed prompt
        ids, entries = zip(*tokens[i]) if tokens[i] else ((), ())
        out = choices.logprobs.build(i, ids, entries)
        return out if echo is None else {k: echo[k] + out[k] for k in out}

    bodies = [((c.echo_text or "") + "".join(t), s.finish_reason, logprobs(i))
              for i, (c, t, s) in enumerate(zip(choices.prepared.choices, texts, choices.streams))]
    return fmt.full(bodies, *choices.counts())


def ended_error(stream: RequestStream, draining: bool) -> APIError:
    if stream.finish_reason == "cancelled":
        why = "the server is shutting down" if draining else "the request was cancelled"
        return APIError(503, f"{why}; the request did not complete", code="cancelled")
    return APIError(500, f"generation failed: {stream.error or 'engine error'}", code="engine_error")
