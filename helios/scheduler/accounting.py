"""Completion: validation before any mutation, cost learning, service accounting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from helios.errors import InvalidCompletion
from helios.graphs import GraphKind
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
    # flare_speculative_*: complete programs, not separate proposal and target calls.
    speculative_programs: int = 0
    speculative_offered: int = 0  # draft positions verified
    speculative_accepted: int = 0
    speculative_emitted: int = 0  # committed tokens, bonus/replacement included
    speculative_learned_draws: int = 0  # learned proposals only; copy proposals draw nothing

    def record(self, frame: Frame, raw_ns: int | None) -> None:
        self.executions[frame.reason] += 1
        self.nanoseconds[frame.reason] += raw_ns or 0
        shape = frame.plan.shape
        self.by_shape[shape] = self.by_shape.get(shape, 0) + 1


def validate_completion(queue: ExecutionQueue, requests, fence, records, timing,
                        confidence=None, survival=None, sidecar_shape=None) -> Frame:
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
    speculative = head.plan.shape.kind is GraphKind.SPECULATIVE
    for lane, rec in zip(lanes, records):
        if type(rec) is not CompletionRecord:
            raise InvalidCompletion(f"not a CompletionRecord: {rec!r}")
        if rec.handle != lane.handle or rec.epoch != lane.epoch:
            raise InvalidCompletion(f"record for request {rec.handle} epoch {rec.epoch} does not match "
                                    f"lane {lane.handle} epoch {lane.epoch}")
        if rec.prompt_tokens != lane.prompt_tokens:
            raise InvalidCompletion(f"request {rec.handle}: consumed {rec.prompt_tokens} prompt tokens, "
                                    f"scheduled {lane.prompt_tokens}")
        if type(rec.tokens) is not tuple or not _token_ids(rec.tokens):
            raise InvalidCompletion(f"request {rec.handle}: tokens must be a tuple of nonnegative ints")
        r = requests.get(rec.handle)
        live = r is not None and r.phase is not Phase.DONE
        if speculative:
            _validate_round(head.plan, lane, rec, live, survival)
        elif len(rec.tokens) > lane.output_rows or (live and len(rec.tokens) != lane.output_rows):
            raise InvalidCompletion(f"request {rec.handle}: {len(rec.tokens)} tokens for "
                                    f"{lane.output_rows} output rows")
        if rec.eos and not rec.tokens:
            raise InvalidCompletion(f"request {rec.handle}: eos without a token")
    if head.plan.device_allocation:
        if confidence is None:
            raise InvalidCompletion("a device-allocated speculative round completes through complete_packed_round")
        rows = sum(_offered(l, r) + 1 for l, r in zip(lanes, records))
        if rows > head.plan.shape.target_capacity:
            raise InvalidCompletion(f"allocated {rows} target rows; the program has {head.plan.shape.target_capacity}")
    if confidence is not None:
        _validate_sidecars(confidence, sidecar_shape)
    if survival is not None and head.plan.shape.kind is not GraphKind.SPECULATIVE:
        raise InvalidCompletion("survival rows belong to speculative rounds")
    return head


def _token_ids(tokens: tuple) -> bool:
    # The common case (plain ints) costs one set and one min; numpy integers take the slow path.
    if not tokens:
        return True
    if {type(t) for t in tokens} == {int}:
        return min(tokens) >= 0
    return all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in tokens)


def _offered(lane, rec) -> int:
    return lane.output_rows - 1 if rec.offered is None else rec.offered


def _validate_round(plan, lane, rec, live, survival) -> None:
    offered = _offered(lane, rec)
    if not isinstance(offered, int) or not 0 <= offered <= lane.output_rows - 1:
        raise InvalidCompletion(f"request {rec.handle}: offered {rec.offered!r} outside 0..{lane.output_rows - 1}")
    if not plan.device_allocation and rec.offered is not None and rec.offered > lane.output_rows - 1:
        raise InvalidCompletion(f"request {rec.handle}: host allocation fixed {lane.output_rows} rows")
    if len(rec.tokens) > offered + 1 or (live and not rec.tokens):
        raise InvalidCompletion(f"request {rec.handle}: {len(rec.tokens)} tokens for {offered} verified proposals")
    rows = None if survival is None else survival.get(rec.handle)
    if rows is not None:
        arr = np.asarray(rows, dtype=float)
        if arr.ndim != 1 or len(arr) > offered or not np.all(np.isfinite(arr)) or np.any(arr < 0) \
                or np.any(arr > 1) or np.any(np.diff(arr) > 1e-6):
            raise InvalidCompletion(f"request {rec.handle}: survival rows must be nonincreasing "
                                    f"probabilities for at most {offered} evaluated prefixes")


def _validate_sidecars(confidence, shape) -> None:
    sidecars = confidence if isinstance(confidence, (list, tuple)) else [confidence]
    if not sidecars:
        raise InvalidCompletion("a packed round needs rank 0's confidence sidecar")
    for rank, sc in enumerate(sidecars):
        if not isinstance(sc, np.ndarray) or sc.dtype != np.float32 or sc.shape != shape:
            raise InvalidCompletion(f"rank {rank} confidence must be float32 of shape {shape}")
        if not np.all(np.isfinite(sc)) or np.any(sc < 0) or np.any(sc > 1):
            raise InvalidCompletion(f"rank {rank} confidence holds values outside [0, 1]")


def apply_completion(sched, frame: Frame, records, timing: ExecutionTiming,
                     confidence=None, survival=None) -> list[GeneratedToken]:
    now = sched.now_ns
    shape = frame.plan.shape
    sched.costs.observe(shape, timing.cost_sample_ns(), now)
    raw = timing.device_interval_ns()
    if frame.isolated and timing.wall_ns:
        raw = max(raw or 0, timing.wall_ns)
    sched.stats.record(frame, raw)
    if shape.kind is GraphKind.SPECULATIVE:
        sched.stats.speculative_programs += 1
    served = {rec.handle: (rec.prompt_tokens + len(rec.tokens), len(rec.tokens)) for rec in records}
    # Each successful frame with a positive device interval is one measured interval.
    if timing.device_interval_ns() is not None:
        _account_interval(sched, frame, served, raw / 1e6)
    out = []
    requests, fence, max_context = sched.requests, frame.fence, sched.config.max_context
    speculative = shape.kind is GraphKind.SPECULATIVE
    done = Phase.DONE
    for lane, rec in zip(frame.plan.lanes, records):
        r = requests.get(lane.handle)
        if r is None:
            continue
        r.queued_prompt -= lane.prompt_tokens
        r.queued_output -= lane.output_rows
        r.inflight.remove(fence)
        r.version += 1
        if r.phase is done or r.epoch != lane.epoch:
            continue  # cancelled or already finished: the lane's results are discarded
        tokens = rec.tokens
        first = r.output_done == 0 and bool(tokens)
        r.prompt_done += rec.prompt_tokens
        r.output_done += len(tokens)
        if tokens and r.last_publication_ns is None:
            r.last_publication_ns = now  # provisional until the runtime publishes
        if rec.eos:
            r.finish = FinishReason.EOS
        elif r.output_done >= r.spec.max_output_tokens:
            r.finish = FinishReason.LENGTH
        elif r.prompt_done + r.output_done >= max_context:
            r.finish = FinishReason.CONTEXT
        r.update_phase()
        if speculative:
            _learn_round(sched, frame, lane, rec, r, confidence, survival)
        if tokens or r.finish is not None:
            out.append(GeneratedToken(r.handle, fence, tuple(map(int, tokens)), r.finish, first))
    return out


def _learn_round(sched, frame, lane, rec, r, confidence, survival) -> None:
    offered = _offered(lane, rec)
    accepted = max(0, len(rec.tokens) - 1)
    stats = sched.stats
    stats.speculative_offered += offered
    stats.speculative_accepted += accepted
    stats.speculative_emitted += len(rec.tokens)
    if sched.source.value == "learned":
        stats.speculative_learned_draws += frame.plan.shape.proposal_depth
    generated = r.output_done
    rows = None if survival is None else survival.get(rec.handle)
    sched.speculation.observe_round(r.speculation, sched.source, generated, accepted, offered,
                                    censored=r.finish is not None,
                                    survival=None if rows is None else np.asarray(rows, dtype=float))
    if confidence is not None and lane.slot is not None:
        rank0 = confidence[0] if isinstance(confidence, (list, tuple)) else confidence
        # Forecast observations stop at the lane's frozen min(D + 1, W) ceiling.
        depth = min(frame.plan.shape.proposal_depth, lane.output_rows - 1)
        sched.speculation.observe_confidence(r.speculation, generated, rank0[1, lane.slot, :depth].astype(float))


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
