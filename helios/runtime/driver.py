"""A synchronous, single-thread driver of a scheduler and a core (tests and benchmarks).

Each step dispatches up to `depth` frames through the step loop (helios.runtime.step), then
executes and finishes them in fence order. Every burst is published at once, with no tokenizer:
its tokens but a terminating EOS are what a client would see. The threaded runtime
(helios.runtime.runtime.Runtime) is what serves; this loop has no threads and no waiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from helios.runtime.checkpoint_admission import checkpoint_match
from helios.runtime.step import StepLoop, visible_tokens
from helios.scheduler.plan import FinishReason, GeneratedToken, ScheduledPlan
from helios.scheduler.request_spec import RequestSpec


@dataclass(slots=True)
class DriverRequest:
    prompt: tuple[int, ...]
    admitted_ns: int
    tokens: list[int] = field(default_factory=list)
    first_token_ns: int | None = None
    finished_ns: int | None = None
    finish: FinishReason | None = None


class StalledDriver(RuntimeError):
    """Live requests remain but the scheduler plans nothing with an empty queue."""


class SyncDriver:
    def __init__(self, scheduler, core, *, clock: Callable[[], int] = time.monotonic_ns, depth: int = 1):
        self.scheduler = scheduler
        self.core = core
        self.depth = depth
        self.requests: dict[int, DriverRequest] = {}
        self.history: list[ScheduledPlan] = []
        self.loop = StepLoop(scheduler, clock, core.detach)
        self._inflight: list[tuple[int, ScheduledPlan]] = []

    def now(self) -> int:
        return self.loop.now()

    def submit(self, prompt: Sequence[int], max_tokens: int, endpoints: Sequence[int] = (), client: str = "default",
               **options) -> int:
        """Admit and attach one request; `endpoints` (message ends) let it restore a stored
        checkpoint and make its final state a terminal capture (helios.runtime.checkpoint_admission).
        `client`: the RequestSpec's client (its tenant)."""
        now = self.now()
        match, store = checkpoint_match(self.scheduler, self.core, prompt)
        spec = RequestSpec(len(prompt), max_tokens, cached_tokens=match.tokens if match else 0,
                           endpoints=tuple(endpoints), client=client)
        try:
            handle = self.scheduler.admit(spec, now)
        except BaseException:
            if match is not None:
                store.release(match.entry)
            raise
        if match is not None:
            options = {**options, "checkpoint": match}
        self.core.attach(handle, prompt, **options)
        self.loop.attached(handle)
        self.requests[handle] = DriverRequest(tuple(prompt), now)
        return handle

    def cancel(self, handle: int) -> None:
        self.loop.cancel(handle)
        req = self.requests[handle]
        if req.finish is None:
            req.finish, req.finished_ns = FinishReason.CANCELLED, self.loop.last_ns

    def commit(self) -> ScheduledPlan | None:
        """Plan and commit one frame (it stays in flight until `finish_frames`)."""
        before = len(self._inflight)
        self.loop.dispatch(self._submit, limit=1)
        return self._inflight[-1][1] if len(self._inflight) > before else None

    def _submit(self, plan: ScheduledPlan, fence: int) -> None:
        self._inflight.append((fence, plan))
        self.history.append(plan)

    def finish_frames(self) -> None:
        """Execute and complete every committed frame, oldest first."""
        while self._inflight:
            fence, plan = self._inflight.pop(0)
            result = self.core.execute(plan, fence)
            now = self.now()
            self.loop.finish(fence, result, lambda g: self._publish(g, now))

    def _publish(self, g: GeneratedToken, now: int) -> bool:
        req = self.requests[g.handle]
        req.tokens.extend(g.tokens)
        if g.tokens and req.first_token_ns is None:
            req.first_token_ns = now
        if g.finish is not None and req.finish is None:
            req.finish, req.finished_ns = g.finish, now
        return bool(visible_tokens(g))

    def step(self) -> int:
        """Commit up to `depth` frames and run them; returns how many ran."""
        self.loop.dispatch(self._submit, limit=max(0, self.depth - len(self._inflight)))
        ran = len(self._inflight)
        self.finish_frames()
        return ran

    def run(self, max_steps: int = 100_000) -> None:
        """Step until no request is live."""
        for _ in range(max_steps):
            live = self.loop.live(list(self.requests))
            if not live:
                return
            if not self.step():
                raise StalledDriver(f"{live} live requests, nothing planned")
        raise StalledDriver(f"still running after {max_steps} steps")
