"""The request-facing half of the runtime: sampling parameters, stream events, RequestStream."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from helios.engine.core import LOGPROBS_OPTION, MAX_LOGPROBS, PROMPT_LOGPROBS_OPTION, TokenLogprobs
from helios.errors import InvalidRequest
from helios.scheduler.service_class import DEFAULT_CLASS, ServiceClass

# finish_reason values a stream can end with (OpenAI's, plus "cancelled" and "error").
STOP, LENGTH, CANCELLED, ERROR = "stop", "length", "cancelled", "error"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request limits and sampling options.

    `temperature`, `top_p`, `top_k` and `seed` (when set) and `core_options` are passed to
    `core.attach` as keyword options; the runtime itself only uses `max_tokens` and `stop`.
    """

    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False  # vLLM's: the stop string that ended the text is shown
    skip_special_tokens: bool = True  # vLLM's (and its default): special tokens show no text
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    client: str = "default"
    request_id: str | None = None
    core_options: dict = field(default_factory=dict)
    # Exact token offsets where the prompt's completed messages end (chat requests): checkpoint
    # anchors, and what makes the request's final state worth a terminal capture.
    endpoints: tuple[int, ...] = ()
    # Log-probabilities of each output token with this many top alternatives (0-20); None: none.
    logprobs: int | None = None
    # The same for the prompt's tokens: the request runs its prompt in scored prefill graphs.
    prompt_logprobs: int | None = None
    # Service class, tenant weight and vLLM priority (helios.scheduler.service_class; None: the class's tier).
    service_class: ServiceClass = DEFAULT_CLASS
    tenant_weight: float = 1.0
    priority: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest(f"stop strings must be nonempty strings, got {self.stop!r}")
        for name, low, high in (("temperature", 0.0, math.inf), ("top_p", 0.0, 1.0)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high):
                raise InvalidRequest(f"{name} must be a number in [{low}, {high}], got {v!r}")
        for name in ("top_k", "seed"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise InvalidRequest(f"{name} must be an integer, got {v!r}")
        for name in ("include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequest(f"{name} must be a boolean, got {getattr(self, name)!r}")
        if not isinstance(self.client, str):
            raise InvalidRequest(f"client must be a string, got {self.client!r}")
        for name in (LOGPROBS_OPTION, PROMPT_LOGPROBS_OPTION):
            k = getattr(self, name)
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS):
                raise InvalidRequest(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {k!r}")

    def attach_options(self) -> dict[str, Any]:
        opts = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "seed", LOGPROBS_OPTION,
                                              PROMPT_LOGPROBS_OPTION) if getattr(self, k) is not None}
        return {**opts, **self.core_options}


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One visible publication. The last event of a stream carries its finish_reason. For a
    request with `logprobs`, one entry per token id (None where the core gave none)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprobs | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(slots=True)
class RequestMetrics:
    """Runtime-clock timestamps (ns) of one request, for TTFT and inter-delivery gaps."""

    submitted_ns: int
    first_output_ns: int | None = None
    last_output_ns: int | None = None
    finished_ns: int | None = None
    gaps_ns: list[int] = field(default_factory=list)  # between consecutive visible publications

    @property
    def ttft_ns(self) -> int | None:
        return None if self.first_output_ns is None else self.first_output_ns - self.submitted_ns

    def published(self, now_ns: int) -> None:
        if self.first_output_ns is None:
            self.first_output_ns = now_ns
        else:
            self.gaps_ns.append(now_ns - self.last_output_ns)
        self.last_output_ns = now_ns


class RequestStream:
    """A submitted request's output: iterate it (sync or async) for StreamEvents.

    Events are buffered, so a consumer may start late; iteration ends after the event that
    carries `finish_reason`. One consumer per stream.
    """

    def __init__(self, handle: int, prompt_tokens: int, params: SamplingParams, submitted_ns: int,
                 cancel: Callable[[RequestStream], None]):
        self.handle = handle
        self.params = params
        self.request_id = params.request_id
        self.metrics = RequestMetrics(submitted_ns)
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.text = ""  # everything published so far
        self.token_ids: list[int] = []
        # With params.prompt_logprobs: one entry per prompt token once the prompt has run (None for
        # the first), filled by the runtime before the stream's first event.
        self.prompt_logprobs: list | None = [] if params.prompt_logprobs is not None else None
        self._prompt_tokens = prompt_tokens
        self._completion_tokens = 0
        self._cancel = cancel
        self._cond = threading.Condition()
        self._events: deque[StreamEvent] = deque()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def usage(self) -> Usage:
        return Usage(self._prompt_tokens, self._completion_tokens)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancel(self) -> None:
        """Cancel from any thread; the stream ends with finish_reason "cancelled" unless it
        already ended."""
        self._cancel(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the stream has ended (events may still be unread); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.finish_reason is not None, timeout)

    # ---- producer side (runtime thread, under the runtime lock) -------------------------------
    def _count(self, tokens: int) -> None:
        self._completion_tokens += tokens

    def _push(self, event: StreamEvent, error: str | None = None) -> None:
        with self._cond:
            if self.finish_reason is not None:
                return
            self.text += event.text
            self.token_ids.extend(event.token_ids)
            if event.finish_reason is not None:
                self.error = error
                self.finish_reason = event.finish_reason
            self._events.append(event)
            self._cond.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, ready in waiters:
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:
                pass  # that event loop is closed: its consumer is gone

    # ---- consumer side ------------------------------------------------------------------------
    def next_event(self, timeout: float | None = None) -> StreamEvent | None:
        """The next event, blocking; None when the stream is exhausted. TimeoutError on timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._events or self.finish_reason is not None, timeout):
                raise TimeoutError(f"no event from request {self.handle} within {timeout} s")
            return self._events.popleft() if self._events else None

    def __iter__(self):
        return self

    def __next__(self) -> StreamEvent:
        event = self.next_event()
        if event is None:
            raise StopIteration
        return event

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamEvent:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._events:
                    return self._events.popleft()
                if self.finish_reason is not None:
                    raise StopAsyncIteration
                # Woken through call_soon_threadsafe, so the runtime thread never touches the loop.
                ready = asyncio.Event()
                self._async_waiters.append((loop, ready))
            await ready.wait()
