"""The one step loop: dispatch ready plans and finish frames, for every host.

The server's threaded runtime, the synchronous driver and the simulator differ only in where a
frame executes (a worker thread, inline, a virtual device) and in what a client sees. What the
scheduler is told, and when, is decided here, once:

- dispatch: advance the clock, plan, commit under the next fence, hand the frame to the host;
  plan and commit are one decision at one instant, so no clock read sits between them;
- finish: hand the core's Execution to the matching complete* call, give each burst to the
  host's publisher, and report `published_output` for the bursts it made visible;
- publication rule: `published_output(handle, fence)` is reported exactly when the host made
  some of the burst visible to its client, right after the frame's bursts were shown and before
  any other completion is processed (the spec: "the first successful visible publication"), at
  the host's publication time; a frame's visible bursts are reported in one
  `published_outputs` call. A burst whose only token is the terminating EOS shows nothing;
- detach rule: a request attached to the core is detached once it has ended on the host
  (finished, cancelled or failed) and the scheduler no longer holds it (`not is_live`), i.e.
  when no queued frame can still name it.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from helios.engine.core import Execution
from helios.scheduler.plan import (
    CompletionRecord, ExecutionTiming, Fence, FinishReason, GeneratedToken, RequestHandle, ScheduledPlan,
)
from helios.scheduler.protocol import SchedulerProtocol


def complete(scheduler: SchedulerProtocol, fence: Fence, result: Execution) -> list[GeneratedToken]:
    """Hand a core's result to the scheduler through the matching completion call."""
    if result.confidence is not None and result.survival is not None:
        return scheduler.complete_packed_round_with_survival(fence, result.records, result.timing,
                                                             result.confidence, result.survival)
    if result.confidence is not None:
        return scheduler.complete_packed_round(fence, result.records, result.timing, result.confidence)
    if result.survival is not None:
        return scheduler.complete_with_survival(fence, result.records, result.timing, result.survival)
    return scheduler.complete(fence, result.records, result.timing)


def visible_tokens(burst: GeneratedToken) -> tuple[int, ...]:
    """The tokens of a burst a client sees: the terminating EOS is counted but never shown."""
    return burst.tokens[:-1] if burst.finish is FinishReason.EOS else burst.tokens


def fault_records(plan: ScheduledPlan) -> list[CompletionRecord]:
    """Zero-token records that resolve a frame the core could not execute (its lanes are
    cancelled first, and a cancelled lane may report no tokens)."""
    return [CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, ()) for lane in plan.lanes]


class StepLoop:
    """Drives one scheduler for one core. Not thread-safe: a threaded host calls it under the
    lock that serializes its scheduler calls.

    clock        the host's time in ns; the loop never lets the scheduler's time go backwards
    detach       the core's detach (a threaded host queues it behind the core's earlier work)
    on_decision  given the host time (ns, from `timer`) of each dispatched frame's decision:
                 advancing the clock, the preemption check, plan and commit
    decisions    a DecisionLog (helios.runtime.decisions) that records each committed plan and
                 each completed frame's measured duration, by reference (None: no log)
    """

    def __init__(self, scheduler: SchedulerProtocol, clock: Callable[[], int],
                 detach: Callable[[RequestHandle], None], on_decision: Callable[[int], None] | None = None,
                 timer: Callable[[], int] = time.perf_counter_ns, decisions=None):
        self.scheduler = scheduler
        self.decisions = decisions
        self._on_decision = on_decision
        self._timer = timer
        self.fence = 0  # the last fence handed out
        self._clock = clock
        self._detach = detach
        self._last_ns = 0
        self._attached: set[RequestHandle] = set()
        self._ended: set[RequestHandle] = set()  # attached, ended on the host, maybe still live
        # The automatic preemption policy runs before every plan, at the plan's instant (a
        # scheduler without it, e.g. a baseline or a catalog with no snapshot graphs, skips it).
        self._preempt_due = scheduler.preempt_due if scheduler.preempts else None

    def now(self) -> int:
        """Advance the scheduler to the host's clock (never backwards) and return that time."""
        self._last_ns = max(self._last_ns, int(self._clock()))
        self.scheduler.advance_to(self._last_ns)
        return self._last_ns

    @property
    def last_ns(self) -> int:
        """The latest time handed to the scheduler, without reading the clock."""
        return self._last_ns

    def attached(self, handle: RequestHandle) -> None:
        """Record that `handle` is (or is queued to be) attached to the core."""
        self._attached.add(handle)

    def dispatch(self, submit: Callable[[ScheduledPlan, Fence], None], limit: int | None = None) -> int:
        """Plan and commit ready frames (at most `limit`), handing each to `submit(plan, fence)`
        in fence order; returns how many were dispatched."""
        n = 0
        while limit is None or n < limit:
            start = self._timer() if self._on_decision is not None else 0
            now = self.now()
            if self._preempt_due is not None:
                self._preempt_due(now)
            plan = self.scheduler.plan()
            if plan is None:
                break
            self.fence += 1
            self.scheduler.commit(plan, self.fence)
            if self.decisions is not None:  # part of the decision's timed cost: it is on the hot path
                self.decisions.record(plan, self.fence, now, self.scheduler.selection_detail(plan))
            if self._on_decision is not None:
                self._on_decision(self._timer() - start)
            submit(plan, self.fence)
            n += 1
        return n

    def finish(self, fence: Fence, result: Execution,
               publish: Callable[[GeneratedToken], bool]) -> list[GeneratedToken]:
        """Complete a frame and publish its bursts in order. `publish(burst)` shows what it can
        and returns whether it made anything visible. InvalidCompletion leaves all state as it
        was (resolve the frame with `fail`)."""
        out = complete(self.scheduler, fence, result)
        if self.decisions is not None:
            self.decisions.measured(fence, result.timing.cost_sample_ns() or result.duration_ns or None)
        visible = []
        for g in out:
            if g.finish is not None:
                self._ended.add(g.handle)
            if publish(g):
                visible.append(g.handle)
        if visible:  # reported together, at the time the last of them was shown
            self.now()
            self.scheduler.published_outputs(visible, fence)
        self.detach_retired()
        return out

    def cancel(self, handle: RequestHandle, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """End a request on the host: the scheduler stops selecting it (when it still holds it);
        its slot and pages come back through the fence rules, and the core detaches it after."""
        if self.scheduler.is_live(handle):
            self.scheduler.cancel(handle, self.now(), reason)
        self._ended.add(handle)
        self.detach_retired()

    def fail(self, fence: Fence, plan: ScheduledPlan) -> None:
        """Resolve a frame the core could not execute: its requests end with ERROR, and the
        fence completes with no tokens and no timing, so nothing is learned from a fault."""
        for handle in plan.handles:
            if self.scheduler.is_live(handle):
                self.scheduler.cancel(handle, self.now(), FinishReason.ERROR)
            self._ended.add(handle)
        self.scheduler.complete(fence, fault_records(plan), ExecutionTiming(()))
        self.detach_retired()

    def live(self, handles: Sequence[RequestHandle]) -> int:
        """How many of `handles` the scheduler still holds."""
        return sum(1 for h in handles if self.scheduler.is_live(h))

    def detach_retired(self) -> None:
        """Detach every ended request the scheduler has retired (see the module's detach rule)."""
        for handle in [h for h in self._ended if not self.scheduler.is_live(h)]:
            self._ended.discard(handle)
            if handle in self._attached:
                self._attached.discard(handle)
                self._detach(handle)
