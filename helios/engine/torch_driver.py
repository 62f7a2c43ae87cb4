"""A synchronous, single-thread driver of a scheduler and a core (tests and benchmarks).

Each step plans and commits up to `depth` frames, then executes and completes them in fence
order, publishing every burst at once. Requests that the scheduler has retired are detached
from the core right after the completion that retired them. The threaded runtime
(helios.engine.runtime.Runtime) is what serves; this loop has no threads and no waiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from helios.engine.core import complete
from helios.scheduler.plan import FinishReason, RequestSpec, ScheduledPlan


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
        self.clock = clock
        self.depth = depth
        self.requests: dict[int, DriverRequest] = {}
        self.history: list[ScheduledPlan] = []
        self._fence = 0
        self._inflight: list[tuple[int, ScheduledPlan]] = []
        self._attached: set[int] = set()

    def now(self) -> int:
        now = max(int(self.clock()), self.scheduler.now_ns)
        self.scheduler.advance_to(now)
        return now

    def submit(self, prompt: Sequence[int], max_tokens: int, **options) -> int:
        now = self.now()
        handle = self.scheduler.admit(RequestSpec(len(prompt), max_tokens), now)
        self.core.attach(handle, prompt, **options)
        self._attached.add(handle)
        self.requests[handle] = DriverRequest(tuple(prompt), now)
        return handle

    def cancel(self, handle: int) -> None:
        self.scheduler.cancel(handle, self.now())
        req = self.requests[handle]
        if req.finish is None:
            req.finish, req.finished_ns = FinishReason.CANCELLED, self.now()
        self._detach_retired()

    def commit(self) -> ScheduledPlan | None:
        """Plan and commit one frame (it stays in flight until `finish_frames`)."""
        self.now()
        plan = self.scheduler.plan()
        if plan is None:
            return None
        self._fence += 1
        self.scheduler.commit(plan, self._fence)
        self._inflight.append((self._fence, plan))
        self.history.append(plan)
        return plan

    def finish_frames(self) -> None:
        """Execute and complete every committed frame, oldest first."""
        while self._inflight:
            fence, plan = self._inflight.pop(0)
            result = self.core.execute(plan, fence)
            now = self.now()
            for g in complete(self.scheduler, fence, result):
                req = self.requests[g.handle]
                if g.tokens:
                    req.tokens.extend(g.tokens)
                    if req.first_token_ns is None:
                        req.first_token_ns = now
                    self.scheduler.published_output(g.handle, fence)
                if g.finish is not None and req.finish is None:
                    req.finish, req.finished_ns = g.finish, now
            self._detach_retired()

    def step(self) -> int:
        """Commit up to `depth` frames and run them; returns how many ran."""
        while len(self._inflight) < self.depth and self.commit() is not None:
            pass
        ran = len(self._inflight)
        self.finish_frames()
        return ran

    def run(self, max_steps: int = 100_000) -> None:
        """Step until no request is live."""
        for _ in range(max_steps):
            if not self.scheduler.requests:
                return
            if not self.step():
                raise StalledDriver(f"{len(self.scheduler.requests)} live requests, nothing planned")
        raise StalledDriver(f"still running after {max_steps} steps")

    def _detach_retired(self) -> None:
        for handle in [h for h in self._attached if h not in self.scheduler.requests]:
            self._attached.discard(handle)
            self.core.detach(handle)
