"""Completion: validation before any mutation, cost learning, service accounting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from helios.errors import InvalidCompletion
from helios.scheduler.plan import CompletionRecord, ExecutionTiming, FinishReason, GeneratedToken, SelectionReason
from helios.scheduler.queue import ExecutionQueue, Frame
from helios.scheduler.requests import Phase
from helios.scheduler.service import logaddexp


@dataclass(slots=True)
class ExecutionStats:
    """flare_scheduler_execution_nanoseconds_total / _executions_total by execution class."""

    nanoseconds: dict = field(default_factory=lambda: {r: 0 for r in SelectionReason})
    executions: dict = field(default_factory=lambda: {r: 0 for r in SelectionReason})
    by_shape: dict = field(default_factory=dict)  # GraphShape -> executions

    def record(self, frame: Frame, raw_ns: int | None) -> None:
        self.executions[frame.reason] += 1
        self.nanoseconds[frame.reason] += raw_ns or 0
        shape = frame.plan.shape
        self.by_shape[shape] = self.by_shape.get(shape, 0) + 1


def validate_completion(queue: ExecutionQueue, requests, fence, records, timing) -> Frame:
    head = queue.head()
    if head is None or fence != head.fence:
        if fence in queue.fences():
            raise InvalidCompletion(f"fence {fence} completed out of order (oldest is {head.fence})")
        raise InvalidCompletion(f"fence {fence!r} is not in flight (unknown or already completed)")
    if not isinstance(timing, ExecutionTiming):
        raise InvalidCompletion("timing must be an ExecutionTiming")
    problem = timing.validate()
    if problem:
        raise InvalidCompletion(problem)
    lanes = head.plan.lanes
    if not isinstance(records, (list, tuple)) or len(records) != len(lanes):
        raise InvalidCompletion(f"fence {fence} has {len(lanes)} lanes; got {len(records) if isinstance(records, (list, tuple)) else records!r}")
    for lane, rec in zip(lanes, records):
        if not isinstance(rec, CompletionRecord):
            raise InvalidCompletion(f"not a CompletionRecord: {rec!r}")
        if rec.handle != lane.handle or rec.epoch != lane.epoch:
            raise InvalidCompletion(f"record for request {rec.handle} epoch {rec.epoch} does not match "
                                    f"lane {lane.handle} epoch {lane.epoch}")
        if rec.prompt_tokens != lane.prompt_tokens:
            raise InvalidCompletion(f"request {rec.handle}: consumed {rec.prompt_tokens} prompt tokens, "
                                    f"scheduled {lane.prompt_tokens}")
        if not isinstance(rec.tokens, tuple) or any(
                not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t < 0 for t in rec.tokens):
            raise InvalidCompletion(f"request {rec.handle}: tokens must be a tuple of nonnegative ints")
        r = requests.get(rec.handle)
        live = r is not None and r.phase is not Phase.DONE
        if len(rec.tokens) > lane.output_rows or (live and len(rec.tokens) != lane.output_rows):
            raise InvalidCompletion(f"request {rec.handle}: {len(rec.tokens)} tokens for "
                                    f"{lane.output_rows} output rows")
        if rec.eos and not rec.tokens:
            raise InvalidCompletion(f"request {rec.handle}: eos without a token")
    return head


def apply_completion(sched, frame: Frame, records, timing: ExecutionTiming) -> list[GeneratedToken]:
    now = sched.now_ns
    shape = frame.plan.shape
    sched.costs.observe(shape, timing.cost_sample_ns(), now)
    raw = timing.device_interval_ns()
    if frame.isolated and timing.wall_ns:
        raw = max(raw or 0, timing.wall_ns)
    sched.stats.record(frame, raw)
    served = {rec.handle: (rec.prompt_tokens + len(rec.tokens), len(rec.tokens)) for rec in records}
    # Each successful frame with a positive device interval is one measured interval.
    if timing.device_interval_ns() is not None:
        _account_interval(sched, frame, served, raw / 1e6)
    out = []
    for lane, rec in zip(frame.plan.lanes, records):
        r = sched.requests.get(lane.handle)
        if r is None:
            continue
        r.queued_prompt -= lane.prompt_tokens
        r.queued_output -= lane.output_rows
        r.inflight.remove(frame.fence)
        r.version += 1
        if r.phase is Phase.DONE or r.epoch != lane.epoch:
            continue  # cancelled or already finished: the lane's results are discarded
        first = r.output_done == 0 and bool(rec.tokens)
        r.prompt_done += rec.prompt_tokens
        r.output_done += len(rec.tokens)
        r.latest_completion_fence = frame.fence
        if rec.tokens and r.last_publication_ns is None:
            r.last_publication_ns = now  # provisional until the runtime publishes
        if rec.eos:
            r.finish = FinishReason.EOS
        elif r.output_done >= r.spec.max_output_tokens:
            r.finish = FinishReason.LENGTH
        elif r.prompt_done + r.output_done >= sched.config.max_context:
            r.finish = FinishReason.CONTEXT
        r.update_phase()
        if rec.tokens or r.finish is not None:
            out.append(GeneratedToken(r.handle, frame.fence, tuple(int(t) for t in rec.tokens), r.finish, first))
    return out


def _account_interval(sched, frame: Frame, served: dict, delta_ms: float) -> None:
    tau = sched.policy.adaptation_ms
    decay = delta_ms / tau
    log_keep = math.log(-math.expm1(-decay) / delta_ms)
    for handle, epoch in frame.participants:
        r = sched.requests.get(handle)
        if r is None or r.epoch != epoch:
            continue  # a cancelled handle cannot charge anyone, even a reuser of its slot
        tokens, outputs = served.get(handle, (0, 0))
        h = r.history
        h.log_x = h.log_x - decay if tokens == 0 else logaddexp(h.log_x - decay, log_keep + math.log(tokens))
        produced = outputs > 0
        if h.log_z is not None:
            # Completion records zero deliveries; publication replaces it with one.
            before = h.log_z
            h.log_z -= decay
            r.pending_delivery = (frame.fence, delta_ms, before) if produced else None
        elif produced:
            r.pending_delivery = (frame.fence, delta_ms, None)
