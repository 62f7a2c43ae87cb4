"""Discrete-event loop: any scheduler implementing the protocol, against a core, on a virtual clock.

The scheduler is driven through the one step loop (helios.runtime.step); the simulator adds the
event queue and a virtual device that runs one frame at a time.

Events are ordered by one explicit key: (time_ns, kind, sequence). At equal times,
completions are processed before arrivals, so freed capacity is visible to newcomers,
and the sequence number keeps ties deterministic.

With a `PrefixCache` (helios.sim.prefix_cache) the loop models automatic prefix reuse: an arrival's
block hashes are looked up before the scheduler admits it, and its hit becomes the request's
`cached_tokens` (the scheduler counts them as consumed prompt); completed prefill chunks publish their
full blocks; a detached request's references end after its last completion was recorded; after every
event the unreferenced blocks are fitted into the KV pages the scheduler's pool has free. Without a
cache nothing here changes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Callable, Iterable

from helios.engine.core import Execution
from helios.runtime.decisions import service_class
from helios.runtime.step import StepLoop, visible_tokens
from helios.scheduler.plan import FinishReason, GeneratedToken, ScheduledPlan
from helios.scheduler.request_spec import RequestSpec


class EventKind(IntEnum):
    COMPLETION = 0
    ARRIVAL = 1
    CANCEL = 2


@dataclass(frozen=True, slots=True)
class Arrival:
    time_ns: int
    spec: RequestSpec
    output_len: int | None = None  # true output length (EOS), when the workload knows it
    client: str = "default"
    prefix_blocks: tuple[int, ...] = ()  # prompt block hashes (prefix reuse), when the trace has them


@dataclass(slots=True)
class RequestLog:
    """What a client saw: arrival, each publication time and token count, and the end."""

    arrival_ns: int
    client: str
    prompt_tokens: int
    publications: list = field(default_factory=list)  # (time_ns, tokens)
    prefills: list = field(default_factory=list)  # (time_ns, prompt tokens completed), for service metrics
    finish: FinishReason | None = None
    finished_ns: int | None = None
    cached_tokens: int = 0  # prompt tokens a prefix-cache hit saved
    service_class: str = "default"  # the request's service class (RequestSpec.service_class), for per-class SLOs

    @property
    def output_tokens(self) -> int:
        return sum(n for _, n in self.publications)

    @property
    def prompt_done(self) -> int:
        """Prompt tokens consumed so far: the cached prefix and every completed prefill chunk."""
        return self.cached_tokens + sum(n for _, n in self.prefills)


@dataclass(slots=True)
class StepLog:
    """One executed frame, for the demo trace and the report."""

    fence: int
    label: str
    handles: tuple
    start_ns: int
    end_ns: int
    estimated_ns: int | None
    measured_ns: int
    value_rate: float


class Simulation:
    def __init__(self, scheduler, core, *, on_step: Callable[[StepLog], None] | None = None,
                 prefix_cache=None, decisions=None):
        self.scheduler = scheduler
        self.core = core
        self.on_step = on_step
        self.prefix_cache = prefix_cache
        self._released: list[int] = []  # detached handles whose cache references end after this event
        self._submitted: set[int] = set()  # handles seen in a submitted plan (their pages are reserved)
        self._reserved = False  # a request reserved its pages since the free pages were last read
        self._free_blocks = 0  # the free pages, in blocks, when last read (a lower bound since)
        self.now_ns = 0
        self.device_free_ns = 0
        self.logs: dict[int, RequestLog] = {}
        self.steps: list[StepLog] = []
        self._events: list = []
        self._seq = 0
        self.loop = StepLoop(scheduler, lambda: self.now_ns, core.detach if prefix_cache is None else self._detach,
                             decisions=decisions)
        # With a DecisionLog (helios.runtime.decisions): every decision of the run, formatted, in order.
        self.decisions = decisions
        self.decision_log: list[dict] = []

    def push(self, time_ns: int, kind: EventKind, payload) -> None:
        heapq.heappush(self._events, (time_ns, int(kind), self._seq, payload))
        self._seq += 1

    def add(self, arrivals: Iterable[Arrival]) -> None:
        for a in arrivals:
            self.push(a.time_ns, EventKind.ARRIVAL, a)

    def cancel_at(self, time_ns: int, handle: int) -> None:
        self.push(time_ns, EventKind.CANCEL, handle)

    def run(self, until_ns: int | None = None, max_steps: int | None = None) -> None:
        while self._events:
            if until_ns is not None and self._events[0][0] > until_ns:
                break
            if max_steps is not None and len(self.steps) >= max_steps:
                break
            time_ns, kind, _, payload = heapq.heappop(self._events)
            self.now_ns = max(self.now_ns, time_ns)
            self.loop.now()
            if kind == EventKind.ARRIVAL:
                self._arrive(payload)
            elif kind == EventKind.CANCEL:
                self.loop.cancel(payload)
            else:
                self._complete(*payload)
            if self.prefix_cache is not None:
                self._release()
            self.loop.dispatch(self._submit)
            if self.prefix_cache is not None:
                self._fit()
            if self.decisions is not None and self.decisions.pending >= self.decisions.maxlen // 2:
                self.decision_log += self.decisions.drain(keep=4)  # in flight: measured later
        if self.decisions is not None:
            self.decision_log += self.decisions.drain(keep=0 if not self._events else 4)

    def _arrive(self, a: Arrival) -> None:
        spec, cached = a.spec, 0
        if self.prefix_cache is not None:
            # The hit is looked up before admission (the spec carries it) and pinned under the handle
            # admission assigns; nothing changes the cache in between.
            cached = self.prefix_cache.match(a.prefix_blocks, spec.prompt_tokens)
            if cached:
                spec = replace(spec, cached_tokens=cached)
        handle = self.scheduler.admit(spec, self.now_ns)
        if self.prefix_cache is not None:
            self.prefix_cache.admit(handle, a.prefix_blocks, spec.prompt_tokens)
        self.core.attach(handle, spec.prompt_tokens, output_len=a.output_len)
        self.loop.attached(handle)
        self.logs[handle] = RequestLog(self.now_ns, a.client, spec.prompt_tokens, cached_tokens=cached,
                                       service_class=spec.service_class.name)
        if self.decisions is not None:
            self.decisions.name(handle, None, service_class(spec))

    def _detach(self, handle: int) -> None:
        self.core.detach(handle)
        self._released.append(handle)

    def _release(self) -> None:
        for handle in self._released:
            self.prefix_cache.release(handle)
            self._submitted.discard(handle)
        self._released.clear()

    def _fit(self) -> None:
        # Unreferenced cached blocks may use only the pages no request has reserved. Free pages fall only
        # when a request reserves its extent (its first plan), else only rise, so the last reading is a
        # lower bound and is read again (a snapshot) only before it could make the cache evict.
        cache = self.prefix_cache
        if self._reserved or cache.unreferenced_count > self._free_blocks:
            self._free_blocks = cache.blocks_in(self.scheduler.snapshot().free_pages)
            self._reserved = False
        cache.fit(self._free_blocks)

    def _submit(self, plan: ScheduledPlan, fence: int) -> None:
        # The virtual device runs the frame at once and reports it when its duration has passed.
        result: Execution = self.core.execute(plan, fence)
        if self.prefix_cache is not None and not self._submitted.issuperset(plan.handles):
            self._submitted.update(plan.handles)  # a first plan: the commit reserved its pages
            self._reserved = True
        start = max(self.now_ns, self.device_free_ns)
        end = start + result.duration_ns
        self.device_free_ns = end
        step = StepLog(fence, plan.shape.label(), plan.handles, start, end,
                       plan.estimated_duration_ns, result.duration_ns, plan.selection_value_rate())
        self.steps.append(step)
        if self.on_step:
            self.on_step(step)
        # Wall time from dispatch through observed completion, for isolated frames.
        timing = result.timing
        if timing.wall_ns is not None:
            timing = type(timing)(timing.rank_intervals_ns, timing.readiness_delay_ns, end - self.now_ns)
            result = replace(result, timing=timing)
        self.push(end, EventKind.COMPLETION, (fence, result))

    def _complete(self, fence, result: Execution) -> None:
        self.loop.finish(fence, result, self._publish)
        # Prompt progress is recorded only once the scheduler has accepted the completion.
        for rec in result.records:
            if rec.prompt_tokens and rec.handle in self.logs:
                log = self.logs[rec.handle]
                log.prefills.append((self.now_ns, rec.prompt_tokens))
                if self.prefix_cache is not None:
                    self.prefix_cache.computed(rec.handle, log.prompt_done)

    def _publish(self, g: GeneratedToken) -> bool:
        log = self.logs[g.handle]
        if g.tokens:  # the log counts every generated token, a terminating EOS included
            log.publications.append((self.now_ns, len(g.tokens)))
        if g.finish is not None:
            log.finish, log.finished_ns = g.finish, self.now_ns
        return bool(visible_tokens(g))
